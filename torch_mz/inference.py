r"""Using a trained model: :func:`load_model` rebuilds a model from a checkpoint of
:class:`~torch_mz.train.Trainer` (``best.pt`` or ``checkpoint.pt``), ready to predict in target
units, and :func:`prediction_columns` tabulates its predictions on a dataset (what
``torch-mz predict`` writes). Library code: no printing."""
import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from torch_mz.train import (CheckpointError, TargetNormalizer, attach_normalizer,
                            detach_normalizer, load_checkpoint, predict)

__all__ = ['load_model', 'prediction_columns']

#: What ``run_info['model']`` of a checkpoint must record for :func:`load_model` to rebuild it.
BUILD_KEYS = ('name', 'in_channels', 'out_channels')


def load_model(checkpoint: Union[str, os.PathLike, Mapping[str, Any]],
               model: Optional[torch.nn.Module] = None) -> torch.nn.Module:
    r"""Rebuilds the model of a training checkpoint and loads its weights: the preset and its
    arguments and the in/out channels come from the checkpoint's ``run_info['model']`` (recorded
    for every model made by :func:`~torch_mz.models.build_model`). The model is returned in eval
    mode on the CPU and, when it was trained on normalised regression targets, carries the target
    normaliser (:func:`~torch_mz.train.attach_normalizer`): ``model(batch)`` and
    :func:`~torch_mz.train.predict` give target units. ``best.pt`` holds the weights of the best
    validation epoch, ``checkpoint.pt`` those of the last epoch.

    Args:
        checkpoint (str or dict): Path of the checkpoint, or the dict
            :func:`~torch_mz.train.load_checkpoint` returned for it.
        model (torch.nn.Module, optional): A model to load the weights into instead of
            rebuilding one (for models not made by :func:`~torch_mz.models.build_model`).
            (default: :obj:`None`)

    Raises:
        CheckpointError: If the checkpoint is missing, unreadable or foreign, does not record how
            to build its model (and :obj:`model` is not given), or its weights do not fit.
    """
    if isinstance(checkpoint, Mapping):
        state, where = dict(checkpoint), 'The checkpoint'
    elif not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(f'load_model() takes the path of a checkpoint or the dict '
                        f'load_checkpoint() returned, got {type(checkpoint).__name__}')
    else:
        state, where = load_checkpoint(checkpoint), f'Checkpoint {os.fspath(checkpoint)!r}'
    if model is None:
        model = _rebuild(state, where)
    else:
        detach_normalizer(model)
    try:
        model.load_state_dict(state['model'])
    except RuntimeError as e:
        raise CheckpointError(f'{where} does not fit this model: {e}') from e
    normalised = state.get('config', {}).get('normalize_targets', True)
    if (state['task_type'] == 'regression' and normalised
            and state.get('normalizer') is not None):
        attach_normalizer(model, TargetNormalizer().load_state_dict(state['normalizer']))
    return model.eval()


def _rebuild(state: Mapping[str, Any], where: str) -> torch.nn.Module:
    from torch_mz.models import build_model
    from torch_mz.models.registry import PRESETS
    spec = (state.get('run_info') or {}).get('model') or {}
    missing = [k for k in BUILD_KEYS if k not in spec]
    if missing:
        raise CheckpointError(f'{where} does not record how to build its model (run_info '
                              f"['model'] lacks {', '.join(missing)}: it was written before "
                              f'torch_mz recorded it, or for a model not made by build_model); '
                              f'build the model and pass it as load_model(path, model=...)')
    args = dict(spec.get('args', {}))
    for key, value in args.items():
        if key in _FLAGS and isinstance(value, str):
            # torch_mz before 0.2.0's checks took a flag given as text ('mz:log_n=False') by its
            # truth, so the model was trained with the flag on: rebuilt so, with a warning
            args[key] = bool(value)
            warnings.warn(f'{where} records {key}={value!r}, a text that torch_mz before its '
                          f'argument checks took as {bool(value)}: rebuilt with '
                          f'{key}={bool(value)}, as the model was trained')
    value = args.get('value', PRESETS.get(spec['name'], {}).get('value'))
    if 'rank' in args and value != 'hypernet':  # ignored before the checks: left out now
        warnings.warn(f"{where} records rank={args['rank']!r} for the value operator "
                      f"{value!r}, which has no rank (torch_mz before its argument checks "
                      f"ignored it): rebuilt without it, as the model was trained")
        del args['rank']
    with torch.random.fork_rng(devices=[]):  # the throw-away initialisation leaves no trace
        try:
            return build_model(spec['name'], spec['in_channels'], spec['out_channels'],
                               pos_dim=spec.get('pos_dim'),
                               feature_columns=spec.get('feature_columns'), **args)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: model {spec['name']!r} cannot be rebuilt with the "
                                  f'recorded arguments ({e}); build the model and pass it as '
                                  f'load_model(path, model=...)') from e


#: The boolean options of the presets' modules (MZAggregation, EGNN).
_FLAGS = ('log_n', 'fold_keys', 'edge_gate', 'normalize', 'detach_norm', 'tanh',
          'update_coords')


def prediction_columns(model: torch.nn.Module, dataset: Sequence, task_type: str,
                       batch_size: int = 128, device: Union[str, torch.device] = 'cpu'
                       ) -> Dict[str, List[float]]:
    r"""One column per quantity, one entry per set of :obj:`dataset` in order: ``prediction``
    (``prediction_0``, ``prediction_1``, ... for several targets; for classification the
    predicted class index), ``target`` (likewise, when every set has a ``y``) and ``ihw`` (when the
    model returns a second output, e.g. the MZ models' interval-hull width; ``ihw_0``, ... when it
    has several columns). Predictions are what :func:`~torch_mz.train.predict` returns, i.e. in
    target units for a model that carries its normaliser.

    Args:
        model (torch.nn.Module): The model, e.g. from :func:`load_model`.
        dataset (Sequence): PyG dataset or list of :class:`~torch_geometric.data.Data`.
        task_type (str): ``'regression'`` or ``'classification'``.
        batch_size (int, optional): Sets per batch. (default: :obj:`128`)
        device (str or torch.device, optional): Device to run on. (default: :obj:`'cpu'`)
    """
    if task_type not in ('regression', 'classification'):
        raise ValueError(f"Expected task_type 'regression' or 'classification' (got "
                         f'{task_type!r})')
    out = predict(model, dataset, batch_size=batch_size, device=device)
    pred, extra = out if isinstance(out, tuple) else (out, None)
    if task_type == 'classification':
        pred = pred.argmax(dim=-1)  # (N,)
    columns = _columns('prediction', pred)
    if len(dataset) > 0 and all(getattr(d, 'y', None) is not None for d in dataset):
        y = torch.stack([d.y.reshape(-1) for d in dataset])  # (N, t)
        columns.update(_columns('target', y.long() if task_type == 'classification' else y))
    if extra is not None:
        columns.update(_columns('ihw', extra))
    return columns


def _columns(name: str, values: Tensor) -> Dict[str, List[float]]:
    values = values.detach().cpu()
    values = values.reshape(values.size(0), -1)  # (N, k)
    if values.size(1) == 1:
        return {name: values[:, 0].tolist()}
    return {f'{name}_{j}': values[:, j].tolist() for j in range(values.size(1))}
