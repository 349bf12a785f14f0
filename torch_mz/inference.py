r"""Using a trained model: :func:`load_model` rebuilds a model from a checkpoint of
:class:`~torch_mz.train.Trainer` (``best.pt`` or ``checkpoint.pt``), ready to predict in target
units, :func:`load_test_split` rebuilds the test split of the run that trained it, and
:func:`prediction_columns` tabulates its predictions on a dataset (what ``torch-mz predict``
writes). Library code: no printing."""
import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from torch_mz.train import (CheckpointError, attach_normalizer, detach_normalizer,
                            load_checkpoint, predict)
from torch_mz.train.checkpoint import (_with_build_info, checkpoint_normalizer,
                                       load_weights_into, recorded_options, same_run)

__all__ = ['load_model', 'load_test_split', 'prediction_columns', 'TestSplitWarning']

#: What ``run_info['model']`` of a checkpoint must record for :func:`load_model` to rebuild it.
BUILD_KEYS = ('name', 'in_channels', 'out_channels')


def load_model(checkpoint: Union[str, os.PathLike, Mapping[str, Any]],
               model: Optional[torch.nn.Module] = None) -> torch.nn.Module:
    r"""Rebuilds the model of a training checkpoint and loads its weights: the preset and its
    arguments and the in/out channels come from the checkpoint's ``run_info['model']`` (recorded
    for every model made by :func:`~torch_mz.models.build_model`). The model is returned in eval
    mode on the CPU (a given one on its device) and, when it was trained on normalised
    regression targets, carries the target normaliser (:func:`~torch_mz.train.attach_normalizer`):
    ``model(batch)`` and :func:`~torch_mz.train.predict` give target units. ``best.pt`` holds
    the weights of the best validation epoch, ``checkpoint.pt`` those of the last epoch.

    Args:
        checkpoint (str or dict): Path of the checkpoint, or the dict
            :func:`~torch_mz.train.load_checkpoint` returned for it.
        model (torch.nn.Module, optional): A model to load the weights into instead of
            rebuilding one (for models not made by :func:`~torch_mz.models.build_model`). One
            made by it must have been built as the checkpoint's was, up to options that do not
            change what it predicts in eval mode (:data:`INFERENCE_NEUTRAL_OPTIONS`): weights of
            the same shapes in a model of other options (another readout, value operator of
            the same size...) would predict something else. Weights of a wider dtype than the
            model's are rounded into it, with a :class:`UserWarning`. (default: :obj:`None`)

    Raises:
        CheckpointError: If the checkpoint is missing, unreadable or foreign, does not record how
            to build its model (and :obj:`model` is not given), its weights do not fit, the
            :obj:`model` given was built otherwise than the checkpoint records, or it was
            trained on normalised regression targets and holds no (or a damaged) normaliser.
    """
    if isinstance(checkpoint, Mapping):
        state, where = dict(checkpoint), 'The checkpoint'
        lacking = [k for k in ('model', 'task_type') if k not in state]
        if lacking or not isinstance(state['model'], Mapping):
            # (a model's own state_dict, or a dict of one's making: it failed with a KeyError)
            what = (f'lacks {lacking}' if lacking else
                    f"holds a {type(state['model']).__name__}, not a state dict, under 'model'")
            raise CheckpointError(f"The checkpoint given as a dict {what}: pass the dict "
                                  f"load_checkpoint() returned (a model's own state_dict() "
                                  f"loads with model.load_state_dict)")
    elif not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(f'load_model() takes the path of a checkpoint or the dict '
                        f'load_checkpoint() returned, got {type(checkpoint).__name__}')
    else:
        state, where = load_checkpoint(checkpoint), f'Checkpoint {os.fspath(checkpoint)!r}'
    return _load_model(state, where, model, stacklevel=3)


def _load_model(state: Mapping[str, Any], where: str, model: Optional[torch.nn.Module],
                stacklevel: int = 2) -> torch.nn.Module:
    r""":func:`load_model` of a checkpoint read already (:obj:`where` names it in errors;
    its warning of rounded weights is given at :obj:`stacklevel`)."""
    if model is None:
        model = _rebuild(state, where)
        # in the precision it was trained in (a model trained in float64 came back in float32:
        # other predictions, and its own float64 data refused)
        dtypes = {v.dtype for v in (state.get('model') or {}).values()
                  if isinstance(v, torch.Tensor) and v.is_floating_point()}
        if len(dtypes) == 1:
            model = model.to(dtypes.pop())
    else:
        check_built_as_recorded(state, model, where)
        _warn_if_rounded(state.get('model') or {}, model, where, stacklevel + 1)
    normalised = (state.get('config') or {}).get('normalize_targets', True)
    # (read first: a damaged or missing one refused, the model left as it was)
    normalizer = (checkpoint_normalizer(state, where, required=True)
                  if state['task_type'] == 'regression' and normalised else None)
    # all or nothing: a refused checkpoint leaves a given model as it was, weights and normaliser
    load_weights_into(model, state['model'], where)
    detach_normalizer(model)  # (of a given model; a rebuilt one carries none)
    if normalizer is not None:
        attach_normalizer(model, normalizer)
    return model.eval()


def _warn_if_rounded(weights: Mapping[str, Any], model: torch.nn.Module, where: str,
                     stacklevel: int) -> None:
    r"""A :class:`UserWarning` (at :obj:`stacklevel`) where a given :obj:`model` holds its
    floating-point parameters in a narrower dtype than the checkpoint's weights, which
    ``load_state_dict`` rounds without a word (float64 weights into a float32 model predict
    otherwise than the trained model)."""
    own = {k: v.dtype for k, v in model.state_dict().items() if v.is_floating_point()}
    narrowed = sorted({(str(v.dtype), str(own[k])) for k, v in weights.items()
                       if isinstance(v, torch.Tensor) and v.is_floating_point() and k in own
                       and torch.finfo(own[k]).bits < torch.finfo(v.dtype).bits})
    if narrowed:
        shown = ', '.join(f'{a} into {b}' for a, b in narrowed)
        warnings.warn(f'{where} holds weights of a wider dtype than the model given ({shown}): '
                      f'they are rounded, and the predictions differ from the trained model\'s; '
                      f'convert the model first (e.g. model.double()), or let '
                      f'load_model(checkpoint) rebuild it in its precision', UserWarning,
                      stacklevel=stacklevel)


def check_built_as_recorded(state: Mapping[str, Any], model: torch.nn.Module, where: str,
                            built: Optional[Mapping[str, Any]] = None) -> None:
    r"""A :class:`~torch_mz.train.CheckpointError` where :obj:`model` (made by
    :func:`~torch_mz.models.build_model`) was built otherwise than the checkpoint :obj:`state`
    (from :obj:`where`, for the message) records its model, up to
    :data:`INFERENCE_NEUTRAL_OPTIONS`: weights of the same shapes would load and predict
    something else. A model or checkpoint that does not record how it was built is not
    compared. What :func:`load_model` and :meth:`~torch_mz.train.Trainer.load_weights` check;
    :obj:`built`, where given, stands for the model (a Trainer's own ``run_info['model']``: the
    build record under what its caller gave, as its checkpoints record it)."""
    recorded = (state.get('run_info') or {}).get('model')
    if built is None:
        built = (_with_build_info(None, model) or {}).get('model')
    if not (isinstance(recorded, dict) and isinstance(built, dict)):
        return
    recorded, built = _as_built(recorded), _as_built(built)
    if same_run({'model': recorded}, {'model': built}):
        return
    differ = {k: (recorded[k], built[k]) for k in recorded.keys() & built.keys()
              if recorded[k] != built[k] and k != 'args'}
    old, new = recorded.get('args') or {}, built.get('args') or {}
    differ.update({k: (old.get(k), new.get(k)) for k in old.keys() | new.keys()
                   if old.get(k) != new.get(k)})
    raise CheckpointError(
        f'{where} was trained with a model built otherwise than the one given ('
        + ', '.join(f'{k} {a!r}, given {b!r}' for k, (a, b) in sorted(differ.items()))
        + '): build it as the checkpoint records, or let load_model(checkpoint) rebuild it')


#: Model options that do not change what a model in eval mode predicts (beyond rounding).
INFERENCE_NEUTRAL_OPTIONS = ('dropout', 'chunk_size', 'checkpoint', 'path', 'fold_keys')


def _as_built(info: Dict[str, Any]) -> Dict[str, Any]:
    r"""A model's ``build_info`` as what it predicts with: the constructor's defaults under its
    preset's values under the options given (an option given at the value it takes anyway is no
    difference), without :data:`INFERENCE_NEUTRAL_OPTIONS`, without the options its value
    operator ignores (L but for ``'mz'``, the rank but for ``'hypernet'``, the summary for
    ``'rigid'``), without ``pos_dim`` but for EGNN (the set models read ``pos`` as features
    either way), and without the ``feature_columns`` an EGNN given ``pos_dim`` never read."""
    from torch_mz.models.registry import PRESETS, _without_ignored_columns
    info = _without_ignored_columns(info)  # (an EGNN's columns beside pos_dim: never read)
    name = info.get('name')
    given = info.get('args')
    args: Dict[str, Any] = given if isinstance(given, dict) else {}
    preset = PRESETS.get(name, {}) if isinstance(name, str) else {}
    merged = {k: v for k, v in {**_constructor_defaults(name), **preset, **args}.items()
              if k not in INFERENCE_NEUTRAL_OPTIONS}
    if 'match' in preset:  # a parameter-matched width, chosen at build time and not recorded:
        merged.pop('dim', None)  # the weights' shapes tell (load_state_dict)
        merged.pop('match', None)
    if merged.get('hidden_channels', 0) is None:  # (None: the width dim)
        merged['hidden_channels'] = merged.get('dim')
    value = merged.get('value')
    if isinstance(value, str):  # (options the value operator ignores, warned about at build)
        for key, kept in (('num_matrix_generators', value == 'mz'),
                          ('rank', value == 'hypernet'), ('summary', value != 'rigid')):
            if not kept:
                merged.pop(key, None)
    out = dict(info, args=merged)
    if not str(name).startswith('egnn'):
        out.pop('pos_dim', None)
    return out


def _constructor_defaults(name: Any) -> Dict[str, Any]:
    r"""The keyword defaults of the classes that build preset :obj:`name` (an MZ-Set-Transformer
    preset: :class:`~torch_mz.nn.MZAggregation`'s under the model's own)."""
    from torch_mz.models import egnn, mean_mlp, set_transformer
    from torch_mz.nn.aggr import MZAggregation
    from torch_mz.tasks import _constructor_options
    by_name: Dict[str, List[type]] = {
        'egnn': [egnn.EGNN], 'egnn-qm9': [egnn.EGNN],
        'perceiver': [set_transformer.PerceiverSet], 'deepsets': [set_transformer.DeepSets],
        'mean-mlp': [mean_mlp.MeanMLP]}
    classes = by_name.get(name, [MZAggregation, set_transformer.MZSetTransformer])
    out: Dict[str, Any] = {}
    for cls in classes:  # (the reader of constructor options that task_options uses)
        out.update(_constructor_options(cls, exclude=())[0])
    if name not in by_name:  # (MZSetTransformer builds its body with the paper's preset)
        out['preset'] = 'paper'
    return out


class TestSplitWarning(UserWarning):
    r"""What :func:`load_test_split` warns of: a task option that differs from the training
    run's (the predictions are scored on another task), or a checkpoint that does not record
    its run's data seed and split sizes."""
    __test__ = False  # (not a test class, for pytest, despite its name)


#: Task options that do not change the data (a changed one is not warned about by
#: :func:`load_test_split`; ``set_size`` is changed on purpose to test set-size generalisation).
NOT_DATA_OPTIONS = ('log', 'force_reload', 'set_size')
#: Task options that take Python objects, which a checkpoint records by name only.
OBJECT_OPTIONS = ('transform', 'pre_transform', 'pre_filter')


def load_test_split(checkpoint: Union[str, os.PathLike, Mapping[str, Any]],
                    task: Optional[str] = None, task_args: Optional[Mapping[str, Any]] = None,
                    *, root: Optional[str] = None, n_test: Optional[int] = None,
                    data_seed: Optional[int] = None, n_train: Optional[int] = None,
                    n_val: Optional[int] = None, progress: bool = False,
                    **objects: Any) -> Any:
    r"""The task a checkpoint's model was trained on, rebuilt from what the checkpoint records
    (``run_info['task']``: the task's options, the data seed and the split sizes), so that its
    :obj:`test` split holds the sets the run held out: the data ``torch-mz predict`` scores.

    A synthetic task's test split is drawn apart from its other splits, so :obj:`n_test` may ask
    for more (or fewer) test sets; a real dataset's is the run's held-out split (ModelNet40's
    and ScanObjectNN's official test files, of which :obj:`n_test` takes sets spread evenly
    over them (:func:`torch_mz.datasets.real.spread_indices`; all of them, with a warning, where
    it asks for more); QM9's test molecules of the run's split, of which :obj:`n_test` takes the
    first).

    Args:
        checkpoint (str or dict): Path of a training checkpoint, or the dict
            :func:`~torch_mz.train.load_checkpoint` returned for it.
        task (str, optional): The task's name, which must be the recorded one (the default).
        task_args (dict, optional): Task options over the recorded ones (e.g. ``set_size`` for
            set-size generalisation); one that changes the data is warned about
            (:class:`TestSplitWarning`; for a checkpoint that records no task options, that
            it records none, once). (default: :obj:`None`)
        root (str, optional): The dataset's folder (real datasets). (default: :obj:`None`)
        n_test (int, optional): Test sets, as above. (default: the run's)
        data_seed (int, optional): Must be the run's, where the checkpoint records it (another
            seed draws other data, or another split whose test sets hold training data), except
            for ModelNet40 and ScanObjectNN, whose test split is the official test files
            whatever the seed (the seed draws only their validation sets); the seed for a
            checkpoint that records none. (default: :obj:`None`)
        n_train (int, optional), n_val (int, optional): Must be the run's, where the checkpoint
            records them; the split sizes for one that records none. (default: :obj:`None`)
        progress (bool, optional): Show the :mod:`tqdm` progress bars of generating the sets
            or processing the dataset (:func:`~torch_mz.tasks.load_task`'s). (default:
            :obj:`False`)
        **objects: The ``transform``, ``pre_transform`` or ``pre_filter`` the run was trained
            with: a checkpoint records them by name only, so they are passed again.

    Returns:
        :class:`~torch_mz.datasets.TaskSplits` (for a synthetic task, only :obj:`test` is
        drawn).

    Raises:
        ValueError: If the arguments disagree with the checkpoint (another task; another seed,
            but for the official test splits of ModelNet40 and ScanObjectNN; other split sizes;
            a Python object the run was trained with and that is not passed; more test sets
            than the run's QM9 test split holds), or the model does not fit the task so rebuilt
            (task type, input or output channels).
    """
    if isinstance(checkpoint, Mapping):
        state, where = dict(checkpoint), 'the checkpoint'
        if 'task_type' not in state:
            raise CheckpointError('the checkpoint given as a dict has no task_type: pass the '
                                  'dict load_checkpoint() returned')
    elif isinstance(checkpoint, (str, os.PathLike)):
        state, where = load_checkpoint(checkpoint), f"'{os.fspath(checkpoint)}'"
    else:
        raise TypeError(f'load_test_split() takes the path of a checkpoint or the dict '
                        f'load_checkpoint() returned, got {type(checkpoint).__name__}')
    return _load_test_split(state, where, task, task_args, root=root, n_test=n_test,
                            data_seed=data_seed, n_train=n_train, n_val=n_val, stacklevel=3,
                            progress=progress, **objects)


def _load_test_split(state: Mapping[str, Any], where: str, task: Optional[str] = None,
                     task_args: Optional[Mapping[str, Any]] = None, *,
                     root: Optional[str] = None, n_test: Optional[int] = None,
                     data_seed: Optional[int] = None, n_train: Optional[int] = None,
                     n_val: Optional[int] = None, stacklevel: int = 2, progress: bool = False,
                     **objects: Any) -> Any:
    r""":func:`load_test_split` of a checkpoint read already (:obj:`where` names it in errors;
    its warnings are given at :obj:`stacklevel`)."""
    from torch_mz._checks import check_flag, check_optional_count
    from torch_mz.datasets.real import LOAD_DEFAULTS, OFFICIAL_TEST_SPLIT
    from torch_mz.options import check_options
    from torch_mz.tasks import is_synthetic, load_task, resolved_options, task_options
    unknown = sorted(set(objects) - set(OBJECT_OPTIONS))
    if unknown:
        raise TypeError(f'load_test_split() got unexpected keyword argument(s) {unknown}')
    if task_args is not None and not isinstance(task_args, Mapping):
        raise TypeError(f'task_args must be a mapping of task options, got '
                        f'{type(task_args).__name__}')
    given = dict(task_args or {})
    own_args = {'name': 'task', 'seed': 'data_seed', 'n_train': 'n_train', 'n_val': 'n_val',
                'n_test': 'n_test', 'root': 'root', 'progress': 'progress'}
    theirs = [k for k in own_args if k in given]
    if theirs:  # (load_task's own arguments: a TypeError, "multiple values", from inside it)
        raise ValueError(f"task_args holds {theirs[0]!r}, which is no task option: pass it as "
                         f"load_test_split's {own_args[theirs[0]]}=...")
    both = sorted(set(given) & set(objects))
    if both:
        raise ValueError(f'{both} given both in task_args and as keyword arguments: give each '
                         f'once')
    objects = dict(objects, **{k: given.pop(k) for k in OBJECT_OPTIONS if k in given})
    n_test = check_optional_count('n_test', n_test, 1)
    n_train = check_optional_count('n_train', n_train, 0)
    n_val = check_optional_count('n_val', n_val, 0)
    data_seed = check_optional_count('data_seed', data_seed, -2**63)
    progress = check_flag('progress', progress)
    recorded = (state.get('run_info') or {}).get('task') or {}
    if task is None:
        if 'name' not in recorded:
            raise ValueError(f'{where} does not record its task: name it')
        task = recorded['name']
    if recorded.get('name', task) != task:
        raise ValueError(f"{where} was trained on task '{recorded['name']}', not '{task}'")
    # the task options the model was trained with, unless task_args (or objects) say otherwise
    trained_with = dict(recorded.get('args') or {})
    lacking = {k: v for k, v in trained_with.items()
               if k in OBJECT_OPTIONS and v is not None and k not in objects}
    if lacking:  # recorded by name: a Python object only the caller can rebuild
        named = ', '.join(f'{k}={v}' for k, v in lacking.items())
        raise ValueError(f"{where} was trained with {named} (Python objects, recorded by name): "
                         f"pass them again, torch_mz.inference.load_test_split(checkpoint, "
                         f"{', '.join(f'{k}=...' for k in lacking)})")
    notes = []  # warned about once the checks below have passed
    options_changed = False  # a data-defining option given otherwise (warned about, allowed)
    own, nullable, _ = task_options(task)
    # the values load_task takes them as (alignment=true, as --task-arg reads it, is the text
    # 'true'; a NumPy number a Python one): else warned about as other than the run's own
    given = check_options(given, own, f"task '{task}'", complete=False, nullable=nullable)
    defaults = dict(own, **LOAD_DEFAULTS.get(task, {}))
    # a checkpoint that records no task options (train() called without run_info['task']) is
    # not compared with the task's defaults, which its run need not have used (an option given
    # was said to differ from 'the training run's' default, the run's own value)
    options_recorded = isinstance(recorded.get('args'), Mapping)
    if not options_recorded:
        notes.append(f"{where} does not record the task options of its training run: "
                     f"predicting on task '{task}' with the options given, the others at "
                     f"their defaults")
    for key, value in (list(given.items()) + list(objects.items()) if options_recorded
                       else []):
        # an option not given was its default; both as a checkpoint records them (JSON values,
        # a Python object by its repr), so that ('mu',) is the recorded ['mu']
        # (a dimension left at None is the task's own: d=None and d=8 are one MEB task)
        before = recorded_options(resolved_options(
            task, {key: trained_with.get(key, defaults.get(key))}))[key]
        now = recorded_options(resolved_options(task, {key: value}))[key]
        if key not in NOT_DATA_OPTIONS and now != before:
            options_changed = True
            shown = now if key in OBJECT_OPTIONS else value
            notes.append(f"{key}={shown!r} differs from the training run's {key}={before!r}: "
                         f"the predictions are scored on another task")
    options = dict(trained_with, **given, **objects)
    set_size = options.pop('set_size', None)
    set_size = None if set_size is None else tuple(set_size)
    by_split = options.get('split_set_sizes')
    if 'set_size' in given and isinstance(by_split, Mapping) and 'test' in by_split:
        # the range given for the test sets replaces the one the training run drew them at
        # (split_set_sizes['test'] overrode set_size, which was then ignored)
        options['split_set_sizes'] = {k: v for k, v in by_split.items() if k != 'test'} or None
    synthetic = is_synthetic(task)
    official = task in OFFICIAL_TEST_SPLIT  # the seed does not draw the test split
    split = recorded.get('split') or {}
    if split:  # the data seed and split sizes of the training run
        seed = split.get('seed', 0)
        for name, value in (('n_train', n_train), ('n_val', n_val)):
            if value is not None and value != split.get(name):
                raise ValueError(f"{where} records its training run's split ({name} "
                                 f"{split.get(name)}): leave {name} (--{name.replace('_', '-')}) "
                                 f"out")
        if data_seed is not None and data_seed != seed and not official:
            drawn = ('draws other data (a synthetic task draws its own parameters, where it '
                     'has any, from the seed; n_test gives more test sets)' if synthetic else
                     'draws another split, whose test sets hold the model\'s training data')
            raise ValueError(f"{where} was trained on data seed {seed}; data seed {data_seed} "
                             f"{drawn}: leave the data seed (--data-seed) out")
    else:  # a checkpoint that records none: the arguments, as the training run was given them
        seed = 0 if data_seed is None else data_seed
        sized = n_train is not None or n_val is not None
        # with sizes given, the run's split is rebuilt from them and n_test; with none, the
        # default split, whose test split n_test cuts (QM9's (0, 0, N) would hold training
        # molecules)
        split = dict(n_train=n_train, n_val=n_val, n_test=n_test if sized else None)
        notes.insert(0, f"{where} does not record the data seed and split sizes of its training "
                        f"run (an earlier torch-mz, or train() called without them): predicting "
                        f"on data seed {seed}" + (
                            '' if synthetic or official else
                            ' with n_train / n_val as given (pass those of the training run, '
                            'or its test split is not held out)'))
    if synthetic:  # the test split is drawn apart from the others: any number of test sets
        splits = load_task(task, seed=seed, n_train=0, n_val=0,
                           n_test=n_test if n_test is not None else split.get('n_test'),
                           set_size=set_size, root=root, progress=progress, **options)
    elif official and split.get('n_test') is not None and 'test_subset' not in split:
        # a run recorded before its subset was: the first n_test of the official test files
        splits = load_task(task, seed=seed, n_train=split.get('n_train'),
                           n_val=split.get('n_val'), root=root, progress=progress,
                           **options)
        splits.test = splits.test[:n_test if n_test is not None else split['n_test']]
    elif official:  # N of the official test files, spread over them (load_real_task)
        splits = load_task(task, seed=seed, n_train=split.get('n_train'),
                           n_val=split.get('n_val'),
                           n_test=n_test if n_test is not None else split.get('n_test'),
                           root=root, progress=progress, **options)
    else:  # the training run's split, so that its test sets are the held-out ones
        splits = load_task(task, seed=seed, n_train=split.get('n_train'),
                           n_val=split.get('n_val'), n_test=split.get('n_test'), root=root,
                           progress=progress, **options)
        if n_test is not None and n_test != len(splits.test):
            if n_test > len(splits.test):
                raise ValueError(f"n_test (--n-test) {n_test}: the test split of the training "
                                 f"run of {where} holds {len(splits.test)} sets")
            splits.test = splits.test[:n_test]
    recorded_data = recorded.get('data')
    # a real dataset: the stored sets the run held, unless an option that defines the data was
    # given otherwise on purpose (then the warning says the task is another)
    if isinstance(recorded_data, Mapping) and not options_changed:
        from torch_mz.datasets.fingerprint import split_digest
        compared = ('train', 'val') + (('test', ) if n_test is None else ())
        differ = [name for name in compared if recorded_data.get(name) is not None
                  and split_digest(getattr(splits, name)) != recorded_data[name]]
        if differ:
            raise ValueError(
                f"{where} was trained on other data than task '{task}' holds here (its "
                f"{' and '.join(differ)} split{'s differ' if len(differ) > 1 else ' differs'}"
                f"): another dataset folder (pass the run's root, --root), or raw files or "
                f"processing changed since the run; its held-out test sets cannot be "
                f"rebuilt from these data")
    if splits.task_type != state['task_type']:
        raise ValueError(f"{where} is a {state['task_type']} model and task '{task}' a "
                         f"{splits.task_type} task")
    built = (state.get('run_info') or {}).get('model') or {}
    if built.get('in_channels', splits.in_channels) != splits.in_channels:
        raise ValueError(f"the model of {where} takes {built['in_channels']} input channels, "
                         f"task '{task}' with these options gives {splits.in_channels}")
    if built.get('out_channels', splits.out_channels) != splits.out_channels:
        raise ValueError(f"the model of {where} predicts {built['out_channels']} output(s), "
                         f"task '{task}' with these options has {splits.out_channels}")
    for note in notes:
        warnings.warn(note, TestSplitWarning, stacklevel=stacklevel)
    return splits


def _rebuild(state: Mapping[str, Any], where: str) -> torch.nn.Module:
    from torch_mz.models import build_model
    from torch_mz.models.registry import PRESETS, _without_ignored_columns
    spec = (state.get('run_info') or {}).get('model') or {}
    built = _without_ignored_columns(spec)
    if built is not spec:
        warnings.warn(f"{where} records feature_columns={spec['feature_columns']!r} with "
                      f"pos_dim={spec['pos_dim']!r} for {spec['name']!r}: torch_mz ignored "
                      f"the columns there before it refused the two together; rebuilt "
                      f"without them, as the model was trained")
        spec = built
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
                       batch_size: int = 128, device: Union[str, torch.device] = 'cpu',
                       target_names: Optional[Sequence[str]] = None, progress: bool = False
                       ) -> Dict[str, List[float]]:
    r"""One column per quantity, one entry per set of :obj:`dataset` in order: ``prediction``
    (``prediction_0``, ``prediction_1``, ... for several targets; for classification the
    predicted class index), ``target`` (likewise, when every set has a ``y``) and ``ihw`` (when the
    model returns a second output, e.g. the MZ models' interval-hull width; ``ihw_0``, ... when it
    has several columns). With :obj:`target_names` (a regression task's, e.g. QM9's
    ``task.info['targets']``), the prediction and target columns are named by them instead,
    ``prediction_mu``, ``target_mu``, ... (for one target too). Predictions are what
    :func:`~torch_mz.train.predict` returns, i.e. in target units for a model that carries its
    normaliser.

    Args:
        model (torch.nn.Module): The model, e.g. from :func:`load_model`.
        dataset (Sequence): PyG dataset or list of :class:`~torch_geometric.data.Data`, or a
            dataset without a length (an :class:`~torch.utils.data.IterableDataset`, read once).
        task_type (str): ``'regression'`` or ``'classification'``.
        batch_size (int, optional): Sets per batch. (default: :obj:`128`)
        device (str or torch.device, optional): Device to run on. (default: :obj:`'cpu'`)
        target_names (sequence of str, optional): The names of the regression targets, one per
            output column of the model (and of ``y``), distinct. (default: :obj:`None`: the
            columns are numbered)
        progress (bool, optional): Show a :mod:`tqdm` progress bar of the forward passes.
            (default: :obj:`False`)
    """
    return {k: v.tolist() for k, v in _column_tensors(
        model, dataset, task_type, batch_size=batch_size, device=device,
        target_names=target_names, progress=progress).items()}


def _column_tensors(model: torch.nn.Module, dataset: Sequence, task_type: str,
                    batch_size: int = 128, device: Union[str, torch.device] = 'cpu',
                    target_names: Optional[Sequence[str]] = None, progress: bool = False
                    ) -> Dict[str, Tensor]:
    r""":func:`prediction_columns`'s columns as 1-D tensors on the CPU, each in its own dtype
    (``torch-mz predict`` writes a float32 column's values with the shortest text that reads
    back to the same float32, a float64 column's in float64)."""
    from torch_mz._checks import check_flag
    if task_type not in ('regression', 'classification'):
        raise ValueError(f"Expected task_type 'regression' or 'classification' (got "
                         f'{task_type!r})')
    progress = check_flag('progress', progress)
    if target_names is not None:  # (checked before the model runs)
        target_names = _check_target_names(target_names, task_type)
    if not hasattr(dataset, '__len__'):  # (predict takes one; the targets failed after it ran)
        dataset = list(dataset)  # the sets predicted are those whose targets are tabulated
    out = predict(model, dataset, batch_size=batch_size, device=device, progress=progress)
    pred, extra = out if isinstance(out, tuple) else (out, None)
    if task_type == 'classification':
        pred = pred.argmax(dim=-1)  # (N,)
    columns = _columns('prediction', pred, target_names)
    if len(dataset) > 0 and all(getattr(d, 'y', None) is not None for d in dataset):
        y = torch.stack([d.y.reshape(-1) for d in dataset])  # (N, t)
        columns.update(_columns('target', y.long() if task_type == 'classification' else y,
                                target_names))
    if extra is not None:
        columns.update(_columns('ihw', extra))
    return columns


def _check_target_names(names: Any, task_type: str) -> List[str]:
    r""":func:`prediction_columns`'s :obj:`target_names`: distinct non-empty strings, for a
    regression task (a classifier's one column is a class index)."""
    if task_type != 'regression':
        raise ValueError(f"target_names name the columns of a regression task's targets; a "
                         f"{task_type} task has one column, the class index (got "
                         f"{names!r})")
    if isinstance(names, str) or not hasattr(names, '__iter__'):
        raise ValueError(f'Expected target_names as a sequence of strings, one per target '
                         f'(got {names!r})')
    names = list(names)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f'Expected target_names as non-empty strings, one per target (got '
                         f'{names!r})')
    if len(set(names)) != len(names):  # (one column would replace another)
        raise ValueError(f'Expected distinct target_names, one per column (got {names!r})')
    return names


def _columns(name: str, values: Tensor, names: Optional[Sequence[str]] = None
             ) -> Dict[str, Tensor]:
    values = values.detach().cpu()
    values = values.reshape(values.size(0), -1)  # (N, k)
    if names is not None:
        if len(names) != values.size(1):
            raise ValueError(f'Expected one target name per {name} column: {values.size(1)} '
                             f'column(s), got {len(names)} name(s) {list(names)!r}')
        return {f'{name}_{n}': values[:, j] for j, n in enumerate(names)}
    if values.size(1) == 1:
        return {name: values[:, 0]}
    return {f'{name}_{j}': values[:, j] for j in range(values.size(1))}
