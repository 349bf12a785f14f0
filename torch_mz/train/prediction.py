r"""The functional :func:`predict`: a model run over a dataset, in target units."""
import itertools
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.data import Batch
from torch_geometric.data.data import BaseData
from torch_geometric.loader import DataLoader
from tqdm.auto import tqdm

from torch_mz.train.contract import _first
from torch_mz.train.normalize import TargetNormalizer, _pending_normalizer
from torch_mz.train.runtime import resolve_device

__all__ = ['predict']


@torch.no_grad()
def predict(model: torch.nn.Module, dataset: Sequence,
            normalizer: Optional[TargetNormalizer] = None, batch_size: int = 128,
            device: Union[str, torch.device] = 'auto', progress: bool = False,
            scale_uncertainty: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    r"""Runs ``model`` in eval mode over ``dataset`` in order (the model is moved to
    :obj:`device` and, afterwards, put back on the device it was on and in the mode it was in; a
    model whose parameters and buffers lie on several devices stays on :obj:`device`). It draws
    no random numbers of its own: the caller's random streams are left as they were (a random
    transform of the dataset draws from them, as when the dataset is read anywhere else).

    Args:
        model (torch.nn.Module): The model, called as ``model(batch)``.
        dataset (Sequence): PyG dataset or list of :class:`~torch_geometric.data.Data`.
        normalizer (TargetNormalizer, optional): If given, predictions are mapped back to
            original units with :meth:`TargetNormalizer.inverse_transform`. Not needed for a
            model that carries its normaliser (every model trained by :func:`train` or
            :class:`Trainer` on normalised targets, and :func:`torch_mz.load_model`'s): it
            predicts in target units already, and a normaliser passed with it must have the same
            statistics (it is not applied twice). Weights loaded into a freshly built model
            with ``load_state_dict`` come without it (the normaliser is kept out of the state
            dict): that model predicts standardised values; :func:`torch_mz.load_model`
            rebuilds a checkpoint's model with its normaliser. (default: :obj:`None`)
        batch_size (int, optional): Sets per batch. (default: :obj:`128`)
        device (str or torch.device, optional): Device to run on. (default: :obj:`'auto'`)
        progress (bool, optional): Show a :mod:`tqdm` progress bar. (default: :obj:`False`)
        scale_uncertainty (bool, optional): Multiply the model's second output by the target
            standard deviation of ``normalizer`` (for a model whose uncertainty is a standard
            deviation in normalised target units). By default it is returned as the model gives
            it, e.g. the MZ models' interval-hull width, a per-set width in latent units.
            Without a normaliser (carried or passed) it is refused. (default: :obj:`False`)

    Returns:
        The predictions :math:`(N, \text{out\_dim})` (class logits for classification) on the CPU,
        or ``(predictions, uncertainties)`` if the model returns a tuple whose second element is
        a tensor (the MZ models' interval-hull width). A model without an uncertainty (EGNN,
        Deep Sets, the Perceiver, ...: a :class:`~torch_mz.models.SetPrediction` whose second
        element is :obj:`None`) gives the predictions alone: unpack ``prediction, ihw = ...``
        only for a model that has one.
    """
    _check_sets(dataset, 'predict')
    normalizer, scale = _pending_normalizer(model, normalizer)
    if scale_uncertainty and scale is None:  # (it returned the uncertainty unscaled, silently)
        raise ValueError('scale_uncertainty=True multiplies the uncertainty by the target '
                         'normaliser\'s standard deviation, and there is none: the model carries '
                         'none and no normalizer was passed')
    dev = resolve_device(device)
    modes = [(m, m.training) for m in model.modules()]  # (a BatchNorm frozen in eval() stays so)
    try:
        with _moved(model, dev):  # (it stayed there: the caller's next model(batch) failed)
            model.eval()
            return _predict(model, dataset, dev, normalizer, scale, scale_uncertainty,
                            batch_size, progress)
    finally:
        for module, training in modes:  # the caller's modes, as they were
            module.training = training


@contextmanager
def _moved(model: torch.nn.Module, dev: torch.device) -> Iterator[torch.nn.Module]:
    r"""``model`` on :obj:`dev` inside the block and afterwards back on the device its
    parameters and buffers were on, where they were all on one (moved in place, as
    ``model.to`` moves it: the same parameter objects, their values unchanged); a model spread
    over several devices stays on :obj:`dev`. What :func:`predict` and
    :func:`torch_mz.uncertainty.mc_dropout_predict` run the model in."""
    where = {t.device for t in itertools.chain(model.parameters(), model.buffers())}
    try:
        yield model.to(dev)
    finally:
        if len(where) == 1:
            model.to(where.pop())


def _check_sets(dataset: Any, caller: str, batch_ok: bool = False) -> None:
    r"""The input checks of :func:`predict`, shared with
    :func:`torch_mz.uncertainty.mc_dropout_predict` (:obj:`caller` names the function in the
    messages): :obj:`dataset` must be a non-empty dataset or list of
    :class:`~torch_geometric.data.Data`, not one Data, a DataLoader or a list of Batch objects.
    With :obj:`batch_ok`, one :class:`~torch_geometric.data.Batch` is taken as its sets."""
    if isinstance(dataset, BaseData) and not (batch_ok and isinstance(dataset, Batch)):
        raise ValueError(f'{caller}() takes a dataset or a list of Data (one prediction per '
                         f'Data); for a single set pass [data], for a Batch '
                         f'batch.to_data_list()')
    if isinstance(dataset, torch.utils.data.DataLoader):  # (it failed inside the batching)
        raise ValueError(f'{caller}() takes the dataset, not a DataLoader: it batches the sets '
                         f'itself (batch_size=...), one prediction per Data')
    if hasattr(dataset, '__len__') and len(dataset) == 0:  # (an IterableDataset has none)
        raise ValueError(f'{caller}() got an empty dataset: there is nothing to predict')
    if (isinstance(dataset, (list, tuple)) and dataset
            and getattr(dataset[0], 'num_graphs', None) is not None):
        # a list of Batch objects: batched again as one set each (an error about set ids)
        raise ValueError(f'{caller}() takes a dataset or a list of Data (one prediction per '
                         f'Data), not a list of Batch objects: pass each batch.to_data_list(), '
                         f'joined')


def _predict(model: torch.nn.Module, dataset: Sequence, dev: torch.device, normalizer: Any,
             scale: Any, scale_uncertainty: bool, batch_size: int, progress: bool) -> Any:
    preds: List[Tensor] = []
    uncs: List[Tensor] = []
    returns_tuple = False
    # a generator of its own: a DataLoader draws a base seed for its workers from the global
    # stream even without shuffling (a seeded training after predict() was another training)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False,
                        generator=torch.Generator())
    for batch in tqdm(loader, desc='predict', disable=not progress):
        out = model(batch.to(dev))
        pred = _first(out)
        pred = pred.unsqueeze(-1) if pred.dim() == 1 else pred  # (B, out_dim)
        if normalizer is not None:
            pred = normalizer.inverse_transform(pred)
        preds.append(pred.cpu())
        if isinstance(out, (tuple, list)) and len(out) > 1 and torch.is_tensor(out[1]):
            returns_tuple = True
            unc = out[1]
            if scale is not None and scale_uncertainty:
                targets = 1 if scale.std is None else scale.std.numel()
                if unc.dim() == 1 and targets > 1:  # (it failed, naming the targets' shape)
                    raise ValueError(
                        f'scale_uncertainty=True: the model gives one uncertainty per set '
                        f'(shape {tuple(unc.shape)}) and the normaliser {targets} standard '
                        f'deviations, one per target: there is no one scale to multiply it by; '
                        f'predict without scale_uncertainty and scale it by the standard '
                        f'deviation of the target it stands for (the normaliser\'s std)')
                unc = scale.inverse_scale(unc)
            uncs.append(unc.cpu())
    if not preds:  # (a dataset without a length that gave no set: torch.cat's error)
        raise ValueError('predict() got an empty dataset: there is nothing to predict')
    pred_all = torch.cat(preds, dim=0)
    return (pred_all, torch.cat(uncs, dim=0)) if returns_tuple else pred_all
