r"""Checkpoints: atomic writes, weights-only loading, the random-number state a resume restores,
and the ``run_info`` that tells which run wrote a checkpoint."""
import json
import os
import random
import re
import warnings
from typing import Any, Dict, Mapping, Optional, Tuple, TypeGuard, Union

import numpy as np
import torch
from torch import Tensor

from torch_mz._files import atomic_write, damaged_zip_member, weights_only_load
from torch_mz.train.normalize import TargetNormalizer

__all__ = [
    'CheckpointError',
    'save_checkpoint',
    'load_checkpoint',
    'CHECKPOINT_FORMAT',
    'CHECKPOINT_VERSION',
    'config_changes',
    'finished_run_changes',
    'describe_run',
    'same_run',
    'recorded_options',
]

CHECKPOINT_FORMAT = 'torch_mz.train'
CHECKPOINT_VERSION = 1


class CheckpointError(ValueError):
    r"""Raised when a checkpoint is missing, unreadable (corrupt or truncated), not a ``torch_mz``
    training checkpoint, or does not fit the model it is loaded into."""


def save_checkpoint(state: Dict[str, Any], path: Union[str, os.PathLike]) -> None:
    r"""Writes ``state`` with :func:`torch.save` atomically: into a temporary file in the same
    directory, flushed to disk, then moved over ``path`` with :func:`os.replace`. If anything fails
    the temporary file is removed and an existing file at ``path`` is left untouched."""
    atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Union[str, os.PathLike],
                    map_location: Union[str, torch.device] = 'cpu') -> Dict[str, Any]:
    r"""Loads a checkpoint written by :class:`Trainer` with ``torch.load(..., weights_only=True)``.

    Raises:
        CheckpointError: If the file does not exist, cannot be read (corrupt or truncated, or
            data that do not match the checksums stored with them:
            :func:`~torch_mz._files.damaged_zip_member`), holds
            objects other than tensors and plain containers, or is not a ``torch_mz`` checkpoint.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise CheckpointError(f'Checkpoint {path!r} is a folder, not a checkpoint file'
                              + checkpoint_files_hint(path))
    if not os.path.isfile(path):
        raise CheckpointError(f'Checkpoint {path!r} does not exist')
    damaged = damaged_zip_member(path)
    if damaged is not None:  # (torch.load does not check the stored CRCs: it would load it)
        raise CheckpointError(f'Checkpoint {path!r} is damaged: {damaged}')
    try:
        # not PyG's registered classes that are not data types, one of which loads a file the
        # pickle names (weights_only_load)
        state = weights_only_load(path, map_location)
    except Exception as e:  # torch.load raises many types for bad files; report them all alike
        raise CheckpointError(f'Checkpoint {path!r} could not be read; it is corrupt, truncated or '
                              f'not a weights-only torch file ({_load_failure(e)})') from e
    if not isinstance(state, dict) or state.get('format') != CHECKPOINT_FORMAT:
        raise CheckpointError(f'{path!r} is not a torch_mz training checkpoint (expected a dict '
                              f"with format={CHECKPOINT_FORMAT!r})")
    missing = [k for k in ('version', 'kind', 'model', 'task_type') if k not in state]
    if missing:
        raise CheckpointError(f'Checkpoint {path!r} is incomplete: missing {missing}')
    if not isinstance(state['version'], int) or isinstance(state['version'], bool):
        raise CheckpointError(f'Checkpoint {path!r} has version {state["version"]!r}; expected '
                              f'an integer')
    if state['version'] > CHECKPOINT_VERSION:
        raise CheckpointError(f'Checkpoint {path!r} has version {state["version"]}; this torch_mz '
                              f'reads versions up to {CHECKPOINT_VERSION}')
    return state


def check_finite_parameters(model: torch.nn.Module, weights: Dict[str, Any], where: str) -> None:
    r"""A :class:`CheckpointError` where the entries of :obj:`weights` (a state dict, from
    :obj:`where`, for the message) that are parameters of :obj:`model` hold NaN or inf: the run
    that wrote them diverged, and predictions or a resumed run would be NaN. Checked before they
    are loaded, so a refused checkpoint leaves the model as it was. Buffers are not checked (a
    model may keep an infinite bound in one)."""
    params = [name for name, _ in model.named_parameters()]
    names = [name for name in params if isinstance(weights.get(name), torch.Tensor)
             and (weights[name].is_floating_point() or weights[name].is_complex())
             and not bool(torch.isfinite(weights[name]).all())]
    if names:
        count = len(params)
        raise CheckpointError(f'{where} holds non-finite weights ({len(names)} of {count} '
                              f'parameters, e.g. {names[0]!r}): the run that wrote it diverged; '
                              f'train it again (e.g. with a lower learning rate)')


def load_weights_into(model: torch.nn.Module, weights: Dict[str, Any], where: str) -> None:
    r"""Loads the state dict :obj:`weights` (from :obj:`where`, for the messages) into
    :obj:`model`, all or nothing: non-finite parameters are refused before anything is loaded
    (:func:`check_finite_parameters`), and where ``load_state_dict`` refuses the weights (keys
    missing or unexpected, other shapes) the model's own are put back, since it copies every
    entry that fits before it raises.

    Raises:
        CheckpointError: If the weights hold NaN or inf, or do not fit :obj:`model`.
    """
    check_finite_parameters(model, weights, where)
    own = _cpu_state_dict(model)
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        model.load_state_dict(own)
        raise CheckpointError(f'{where} does not fit this model: {e}') from e


def checkpoint_normalizer(state: Mapping[str, Any], where: str,
                          required: bool = False) -> Optional[TargetNormalizer]:
    r"""The target normaliser the checkpoint :obj:`state` (from :obj:`where`, for the message)
    holds, or :obj:`None` where it holds none (or an unfitted one's state, without statistics)
    and none is :obj:`required` (a regression model trained on normalised targets needs one: its
    weights predict standardised values); read before any weights are loaded, so that a damaged
    or missing one leaves a model as it was.

    Raises:
        CheckpointError: If the normaliser is not one :meth:`TargetNormalizer.state_dict` wrote
            (a key missing, a mean or std that is no tensor of finite values, two shapes, not
            one entry per target, a std that is not positive, or another number of targets than
            the outputs of the model the checkpoint records, ``run_info['model']
            ['out_channels']``), or there is none and one is :obj:`required`.
    """
    raw = state.get('normalizer')
    if (isinstance(raw, Mapping) and {'mean', 'std'} <= raw.keys() and raw['mean'] is None
            and raw['std'] is None):
        # an unfitted normaliser's state, without statistics, is none (it passed: load_model
        # failed attaching it after the weights had loaded, a Trainer's predictions later)
        raw = None
    if raw is None and required:
        raise CheckpointError(f'{where} was trained on normalised targets (normalize_targets='
                              f'True) but holds no target normaliser: its model predicts '
                              f'standardised values, which cannot be mapped back to target '
                              f'units; restore the file or train it again')
    if raw is None:
        return None
    # the number of outputs of the model the checkpoint records (build_model's), if any
    info = state.get('run_info')
    recorded = info.get('model') if isinstance(info, Mapping) else None
    outputs = recorded.get('out_channels') if isinstance(recorded, Mapping) else None
    if isinstance(outputs, bool):
        outputs = None
    problem = None
    try:
        normalizer = TargetNormalizer().load_state_dict(raw)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        problem = repr(e)
    else:
        mean, std = normalizer.mean, normalizer.std
        if (mean is None) != (std is None):
            problem = 'a mean without a std, or a std without a mean'
        elif mean is not None and not (
                isinstance(mean, Tensor) and isinstance(std, Tensor)
                and mean.is_floating_point() and std.is_floating_point()
                and mean.shape == std.shape and bool(torch.isfinite(mean).all())
                and bool(torch.isfinite(std).all())):
            problem = 'a mean and std that are not two finite tensors of one shape'
        elif mean is not None and (mean.dim() != 1 or mean.numel() == 0):
            problem = f'statistics of shape {tuple(mean.shape)}, not one entry per target'
        elif std is not None and not bool((std > 0).all()):
            problem = f'a std that is not positive: {std.tolist()}'
        elif mean is not None and isinstance(outputs, int) and mean.numel() != outputs:
            # (the predictions were refused only then, or mapped with another model's statistics)
            problem = (f'statistics of {mean.numel()} target(s) for a model of {outputs} '
                       f'output(s)')
    if problem is not None:
        raise CheckpointError(f'{where} holds a damaged target normaliser ({problem}): '
                              f'restore the file or train it again')
    return normalizer


def checkpoint_files_hint(folder: str) -> str:
    r"""'; pass a file in it: ...' naming the ``.pt`` files in :obj:`folder` (none: says so)."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith('.pt'))
    except OSError:
        names = []
    if not names:
        return ' (it holds no .pt file)'
    return '; pass a file in it: ' + ', '.join(repr(os.path.join(folder, n)) for n in names)


def _load_failure(e: Exception) -> str:
    r"""One line for why ``torch.load(..., weights_only=True)`` failed, without torch's advice to
    load the file with ``weights_only=False`` (which would run code from a file of unknown
    origin): for a file that holds objects other than tensors and plain containers, which
    object; for another file the weights-only unpickler refused, its reason."""
    text = str(e)
    if not text.startswith('Weights only load failed'):
        return ' '.join(f'{type(e).__name__}: {text}'.split())
    # the line that says why, without torch's advice around it (its wording differs between
    # torch versions)
    lines = [' '.join(line.split()) for line in text.splitlines()[1:]]
    why = next((line for line in lines if line and 'weights_only' not in line
                and 'safe_globals' not in line.split('.')[0]
                and not line.startswith(('Check the documentation', '(2)'))), '')
    why = why.replace('WeightsUnpickler error: ', '').split('. Please use')[0]
    if 'unsupported global' in text.lower():
        return (f'it holds objects other than tensors and plain containers, which this '
                f'package never writes: {why}'.rstrip(': '))
    if not why:  # e.g. the message on a single line
        why = text.split('WeightsUnpickler error:')[-1].split('Check the documentation')[0]
        why = ' '.join(why.split()) if 'WeightsUnpickler error:' in text else ''
    return f'the weights-only unpickler refused it: {why or type(e).__name__}'


def _rng_state(device: Optional[torch.device] = None) -> Dict[str, Any]:
    r"""This process's random-number state: Python's, NumPy's, PyTorch's CPU generator and
    every visible CUDA device's, and with :obj:`device` (the one the run trains on) its name
    (:func:`_device_name`) and an MPS device's generator, so that a resume can tell whether
    it restores the stream the run drew from (:func:`_rng_difference`)."""
    version, mt, gauss = random.getstate()
    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)  # the legacy form, the default
    state = {
        'python': {'version': version, 'state': torch.tensor(mt, dtype=torch.int64),
                   'gauss': gauss},
        'numpy': {'kind': np_state[0], 'state': torch.from_numpy(np_state[1].astype(np.int64)),
                  'pos': int(np_state[2]), 'has_gauss': int(np_state[3]),
                  'cached_gaussian': float(np_state[4])},
        'torch': torch.get_rng_state(),
        'cuda': torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    if device is not None:
        state['device'] = _device_name(device)
        if device.type == 'mps':  # (its own generator: the dropout masks drawn on it)
            state['mps'] = torch.mps.get_rng_state()
    return state


def _set_rng_state(state: Dict[str, Any], device: Optional[torch.device] = None) -> None:
    r"""Restores :func:`_rng_state`'s :obj:`state`: the CUDA devices both it and this machine
    have (by index), and the generator of an MPS :obj:`device` where it holds one. What it
    cannot restore (another device, fewer GPUs) :func:`_rng_difference` names."""
    py = state['python']
    random.setstate((py['version'], tuple(py['state'].tolist()), py['gauss']))
    n = state['numpy']
    np.random.set_state((n['kind'], n['state'].numpy().astype(np.uint32), n['pos'],
                         n['has_gauss'], n['cached_gaussian']))
    torch.set_rng_state(state['torch'].cpu())
    cuda = state['cuda']
    if cuda and torch.cuda.is_available():
        # the devices both have: a run resumed where another number of GPUs is visible (a job
        # on another node) restored none, and its dropout masks on cuda:0 differed silently
        for index, saved in enumerate(cuda[:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(saved.cpu(), index)
    if device is not None and device.type == 'mps' and 'mps' in state:
        # (one that is not a tensor, a damaged entry, raises: not restored, nor said)
        torch.mps.set_rng_state(state['mps'].cpu())


def _device_name(device: torch.device) -> str:
    r""":obj:`device` as the generator it draws from: ``cuda`` as the CUDA device it stands
    for (the current one), ``'cuda:0'``; ``cpu:0`` as ``cpu`` (one generator)."""
    if device.type == 'cuda' and device.index is None:
        return f'cuda:{torch.cuda.current_device()}'
    return 'cpu' if device.type == 'cpu' else str(device)


def _rng_difference(state: Mapping[str, Any], device: torch.device,
                    configured: Any = None) -> Optional[str]:
    r"""Why the random stream a run resumed on :obj:`device` draws from (its dropout masks) is
    not the one the saved run drew from once :func:`_set_rng_state` has restored :obj:`state`
    (one process's :func:`_rng_state`), or :obj:`None` where it is: the run trained on another
    device (a GPU run resumed on the CPU, or on another GPU), or this device's state is not in
    the checkpoint (fewer GPUs were visible when it was written). A state written before it
    recorded its device is judged by the device type of the saved configuration's ``device``
    (:obj:`configured`; ``'auto'`` was CUDA where the state holds CUDA devices)."""
    cuda = state.get('cuda') or []
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    counts = (f' (the checkpoint holds the random state of {len(cuda)} CUDA device(s), this '
              f'machine has {visible})' if len(cuda) != visible else '')
    now = _device_name(device)
    saved = state.get('device')
    if not isinstance(saved, str):  # (an older checkpoint: the type its configuration gave)
        saved = None
        if configured == 'auto':
            saved = 'cuda' if cuda else 'cpu'
        elif isinstance(configured, str) and configured:
            saved = configured.partition(':')[0]
        if saved is not None and saved != device.type:
            return f'it was trained on {saved}, this run trains on {now}' + counts
    elif saved != now:
        return f'it was trained on {saved}, this run trains on {now}' + counts
    if device.type == 'cuda' and int(now.partition(':')[2]) >= len(cuda):
        return f'it holds no random state for {now}' + counts
    if device.type not in ('cpu', 'cuda') and not (device.type == 'mps' and 'mps' in state):
        return f'it holds no random state for {now}'
    return None


def _json_values(value: Optional[Dict[str, Any]], name: str) -> Optional[Dict[str, Any]]:
    r"""``value`` as plain JSON values (tuples become lists, NumPy numbers Python's), so that
    what a checkpoint stores loads with ``weights_only=True`` and compares equal to what the
    next run passes."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f'Expected {name} to be a dict or None (got {type(value).__name__})')
    try:
        return json.loads(json.dumps(value, sort_keys=True, allow_nan=False,
                                     default=_numpy_number))
    except (TypeError, ValueError) as e:
        raise ValueError(f'Expected {name} to hold JSON values only ({e})') from None


def _numpy_number(o: Any) -> Any:
    r"""A NumPy number as the Python one (as :func:`recorded_options` writes it), else JSON's
    own :class:`TypeError`."""
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f'Object of type {type(o).__name__} is not JSON serializable')


def describe_run(info: Dict[str, Any]) -> str:
    r"""A ``run_info`` dict (task, model, ...) as one line for messages, with every entry that
    :func:`same_run` compares: a task's or model's name, its options in parentheses, a task's
    data options and sets, and the other entries of each in brackets (a model's
    ``in_channels``, ``out_channels``, ``pos_dim`` and ``feature_columns``, but for those its
    preset does not read, which are not compared), so that two runs it refuses as different
    are not described alike."""
    parts = []
    for key, value in sorted(info.items(), key=lambda kv: (kv[0] != 'task', kv[0] != 'model')):
        if isinstance(value, dict) and 'name' in value:
            if key == 'model':
                value = _without_unread_entries(value)
            given, split, data = value.get('args'), value.get('split'), value.get('data')
            args = (', '.join(f'{k}={v!r}' for k, v in sorted(given.items()))
                    if isinstance(given, dict) else '')
            splits = (', '.join(f'{k}={v!r}' for k, v in sorted(split.items()))
                      if isinstance(split, dict) else '')
            # (a real dataset's sets, by digest: split_digest)
            sets = ('/'.join(str(data.get(k))[:8] for k in ('train', 'val', 'test'))
                    if isinstance(data, dict) else '')
            # every other entry (a model's channels, pos_dim, feature columns; one of an
            # unexpected form), the build's order first
            shown = {'name'} | {k for k, v in (('args', given), ('split', split), ('data', data))
                                if v is None or isinstance(v, dict)}
            rest = sorted((k for k in value if k not in shown),
                          key=lambda k: (_BUILD_ORDER.index(k) if k in _BUILD_ORDER
                                         else len(_BUILD_ORDER), k))
            other = ', '.join(f'{k}={value[k]!r}' for k in rest)
            parts.append(f"{key} {value['name']!r}" + (f' ({args})' if args else '')
                         + (f' [{other}]' if other else '')
                         + (f' [data: {splits}]' if splits else '')
                         + (f' [sets {sets}]' if sets else ''))
        else:
            parts.append(f'{key} {value!r}')
    return ', '.join(parts)


#: The order in which :func:`describe_run` shows a model's build entries.
_BUILD_ORDER = ('in_channels', 'out_channels', 'pos_dim', 'feature_columns')


def recorded_options(options: Mapping[str, Any]) -> Dict[str, Any]:
    r""":obj:`options` as a checkpoint's ``run_info`` records them: plain JSON values (tuples
    become lists, keys are sorted), and objects JSON cannot hold by name: a function or class by
    its qualified name, an object whose class has a repr of its own (PyG's transforms:
    ``'RandomRotate((-30, 30), axis=0)'``) by that repr, so that resuming with other settings
    of a transform is refused as another run (:func:`same_run`), and any other object by its
    class's name (object's repr holds an address); a NumPy number as the number, a NumPy array or
    a tensor as the list of its values (QM9's ``target=np.arange(2)`` as ``[0, 1]``, which
    :func:`~torch_mz.inference.load_test_split` reads back)."""
    return json.loads(json.dumps(dict(options), sort_keys=True, default=_object_name))


def _object_name(o: Any) -> Any:
    if isinstance(o, np.generic):  # a NumPy number as the number (its repr 'np.int64(8)' was
        return o.item()  # recorded, and told a model built with 8 apart from its own weights)
    if isinstance(o, (np.ndarray, Tensor)):
        # (its repr, 'array([0, 1])' or 'tensor(7)', named no QM9 target: a run trained with
        # one could not be predicted on, nor its test split loaded again; and the repr of a
        # large one ('...') told no difference in the values it leaves out)
        try:
            return o.tolist()
        except (RuntimeError, NotImplementedError):  # (a tensor without data: sparse, meta)
            pass
    if hasattr(o, '__qualname__'):
        return o.__qualname__
    if type(o).__repr__ is not object.__repr__:
        text = repr(o)
        # a repr that holds an address ('Compose([<function f at 0x7f...>])') differs from one
        # process to the next: it would refuse every resume, so the class's name stands for it
        if not re.search(r'0x[0-9a-fA-F]{4,}', text):
            return text
    return type(o).__qualname__


def same_run(saved: Dict[str, Any], current: Dict[str, Any]) -> bool:
    r"""Whether two ``run_info`` dicts agree on every entry both record (two levels deep, so that
    a checkpoint written before an entry was recorded still compares); the task's options as
    :func:`~torch_mz.tasks.resolved_options` reads them, so that forms of one option that give
    the same task (QM9's ``target`` ``0``, ``'mu'`` or ``['mu']``; a ``d`` of :obj:`None` and
    the task's own; an option left out and its default given) are one run, and so are the
    build records of a preset that does not read ``pos_dim`` and ``feature_columns`` (every one
    but EGNN's, and an EGNN given ``pos_dim`` its columns) built with and without them
    (``build_model('mz', ...)`` passed to :func:`~torch_mz.train.train`, and the command
    line's or :func:`~torch_mz.study.train_one`'s, given the task's)."""
    for key in saved.keys() & current.keys():
        a, b = saved[key], current[key]
        if key == 'task' and isinstance(a, dict) and isinstance(b, dict) and not _same_entry(
                a.get('args'), b.get('args')):
            a, b = _resolved_task(a), _resolved_task(b)
        if key == 'model' and isinstance(a, dict) and isinstance(b, dict):
            a, b = _without_unread_entries(a), _without_unread_entries(b)
        if isinstance(a, dict) and isinstance(b, dict):
            if any(not _same_entry(a[k], b[k]) for k in a.keys() & b.keys()):
                return False
        elif a != b:
            return False
    return True


def _without_unread_entries(entry: Dict[str, Any]) -> Dict[str, Any]:
    r"""A ``run_info['model']`` entry without the build arguments that
    :func:`~torch_mz.models.build_model` does not read for its preset: ``pos_dim`` and
    ``feature_columns`` for all but :data:`~torch_mz.models.registry.EGNN_PRESETS` (a
    recorded :obj:`None` and the task's value are one model), and an EGNN's
    ``feature_columns`` beside a ``pos_dim`` (never read: its features are the other
    columns); an entry of another name (a caller's label, which may stand for an EGNN) as it
    is."""
    # (the models import this package: lazily)
    from torch_mz.models.registry import EGNN_PRESETS, PRESETS
    name = entry.get('name')
    if not isinstance(name, str) or name not in PRESETS:
        return entry
    unread = (('pos_dim', 'feature_columns') if name not in EGNN_PRESETS
              else ('feature_columns', ) if entry.get('pos_dim') is not None else ())
    return {k: v for k, v in entry.items() if k not in unread}


def _resolved_task(entry: Dict[str, Any]) -> Dict[str, Any]:
    r"""A ``run_info['task']`` entry with its options as
    :func:`~torch_mz.tasks.resolved_options` reads them (as a checkpoint records them: JSON
    values), an option left out as the one :func:`~torch_mz.tasks.load_task` takes then (its
    default; QM9's ``target`` ``'mu'``); an entry without a task name and options as it is."""
    name, args = entry.get('name'), entry.get('args')
    if not isinstance(name, str) or not isinstance(args, dict):
        return entry
    # (the tasks import the datasets: lazily)
    from torch_mz.datasets import synthetic
    from torch_mz.datasets.real import LOAD_DEFAULTS
    from torch_mz.tasks import TASKS, resolved_options, task_options
    if name in TASKS:  # (a run records the options given: d=8 given was d left out)
        defaults = dict(task_options(name)[0], **LOAD_DEFAULTS.get(name, {}))
        if name in synthetic.TASKS:  # (load_task records set_size where it is given: its
            # default range draws the same sets as none given)
            defaults['set_size'] = list(synthetic.TASKS[name].default_set_size)
        args = dict(recorded_options(defaults), **args)
    return dict(entry, args=recorded_options(resolved_options(name, args)))


def _same_entry(saved: Any, current: Any) -> bool:
    r"""Whether a recorded entry equals the current one; a Python object among the options that
    an older checkpoint recorded by its class name (``'RandomRotate'``) matches the repr
    recorded now (``'RandomRotate((-30, 30), axis=0)'``), whose settings it did not record."""
    if isinstance(saved, dict) and isinstance(current, dict) and saved.keys() == current.keys():
        return all(_same_entry(saved[k], current[k]) for k in saved)
    if (isinstance(saved, str) and isinstance(current, str) and saved.isidentifier()
            and current.startswith(saved + '(')):
        return True
    return saved == current


#: Configuration entries that may change when a run is resumed without changing its result
#: (where it writes, how it shows progress, where it runs). Not ``num_workers``: loader
#: workers draw their seeds from the main random stream, and random transforms run in them,
#: so a change gives other augmentations and dropout masks (a warning says so).
RESUMABLE_CONFIG_CHANGES = ('resume', 'out_dir', 'progress', 'device', 'overwrite')


def config_changes(saved: Dict[str, Any], current: Dict[str, Any]) -> Dict[str, Any]:
    r"""The entries of a checkpoint's configuration (``config.to_dict()``) that
    :obj:`current` sets otherwise, ``{key: (saved, current)}``, but for
    :data:`RESUMABLE_CONFIG_CHANGES`."""
    return {k: (saved[k], v) for k, v in current.items()
            if k in saved and saved[k] != v and k not in RESUMABLE_CONFIG_CHANGES}


def finished_run_changes(state: Mapping[str, Any], current: Dict[str, Any],
                         world_size: Optional[int] = None) -> Optional[Dict[str, Any]]:
    r"""The :func:`config_changes` of a resume, under the configuration :obj:`current`
    (``config.to_dict()``), of the training checkpoint :obj:`state` where that resume would
    train no epoch: the run has run its ``current['epochs']``, or has stopped early
    (``bad_epochs`` at ``current['patience']``); with :obj:`world_size` (the resume's number of
    processes) also another than the ``world_size`` the checkpoint records, which
    ``result.json`` records too. :obj:`None` where the resume trains on, or changes nothing,
    or :obj:`state` does not say how far it ran.

    Such a resume trains nothing, yet writes ``result.json`` and ``best.pt`` anew with the
    configuration it is given: the records of a finished run would name settings it was never
    trained with (another ``lr``, ``weight_decay``, ``batch_size``, ``grad_clip``, warm-up,
    schedule, ``epochs`` or ``patience``, ``seed``...). :class:`~torch_mz.train.Trainer`
    refuses it, and so does the command line before any data are loaded; a resume that trains
    on takes the changes from its next epoch (with a warning)."""
    saved, epoch, epochs = state.get('config'), state.get('epoch'), current.get('epochs')
    if not (isinstance(saved, dict) and _is_int(epoch) and _is_int(epochs)):
        return None
    if epoch + 1 > epochs or (epoch + 1 < epochs and not _stopped(state, current)):
        return None  # (it trains on: an epoch or more; fewer epochs than run: refused so)
    changes = config_changes(saved, current)
    ran = state.get('world_size')
    if world_size is not None and _is_int(ran) and ran != world_size:
        changes['world_size'] = (ran, world_size)
    return changes or None


def _stopped(state: Mapping[str, Any], current: Dict[str, Any]) -> bool:
    r"""Whether the run of checkpoint :obj:`state` has stopped early under :obj:`current`'s
    patience (as :meth:`~torch_mz.train.Trainer.fit` counts it)."""
    bad, patience = state.get('bad_epochs'), current.get('patience')
    return _is_int(bad) and _is_int(patience) and bad >= patience


def _finished_how(state: Mapping[str, Any],
                  current: Dict[str, Any]) -> Tuple[str, Dict[str, int]]:
    r"""How the run of checkpoint :obj:`state` has finished under :obj:`current` (where
    :func:`finished_run_changes` refuses its resume), as words, and the least ``epochs`` and
    ``patience`` under which it would train on (those that must change)."""
    epoch, bad = state['epoch'], state.get('bad_epochs')
    epochs, patience = current['epochs'], current['patience']
    needs: Dict[str, int] = {}
    words = []
    if epoch + 1 >= epochs:
        needs['epochs'] = epoch + 2
        saved = state.get('config')  # ("its" epochs where they are those it was trained for)
        its = 'its ' if isinstance(saved, dict) and saved.get('epochs') == epochs else ''
        words.append(f'it has run {its}{epochs} epochs')
    if _stopped(state, current) and _is_int(bad):
        needs['patience'] = bad + 1
        words.append(f"{'and its' if words else 'it stopped early: its'} last {bad} "
                     f"epoch{'s' if bad != 1 else ''} did not improve (patience {patience})")
    return ', '.join(words), needs


def _unfinished_as_trained(state: Mapping[str, Any]) -> Optional[Tuple[int, int]]:
    r"""The epochs run and the ``epochs`` it was trained for, where the run of checkpoint
    :obj:`state` had not finished under its own configuration (epochs left, not stopped
    early: interrupted), so that a resume that trains nothing (:func:`finished_run_changes`)
    is ended by its own ``epochs`` or ``patience``; :obj:`None` where it had finished, or
    :obj:`state` does not say."""
    saved, epoch = state.get('config'), state.get('epoch')
    if not (isinstance(saved, dict) and _is_int(epoch) and _is_int(saved.get('epochs'))):
        return None
    if epoch + 1 >= saved['epochs'] or _stopped(state, saved):
        return None
    return epoch + 1, saved['epochs']


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _with_build_info(run_info: Optional[Dict[str, Any]],
                     model: torch.nn.Module) -> Optional[Dict[str, Any]]:
    r"""``run_info`` with ``run_info['model']`` completed from the ``build_info`` that
    :func:`~torch_mz.models.build_model` leaves on its models (what is given wins)."""
    built = getattr(model, 'build_info', None)
    try:
        json.dumps(built, allow_nan=False)
    except (TypeError, ValueError) as e:  # options JSON cannot hold: it cannot be rebuilt
        warnings.warn(f"The model's build_info cannot be written as JSON ({e}): the checkpoint "
                      f"does not record how to rebuild the model, and load_model will need "
                      f"the model itself", stacklevel=3)
        return run_info
    if not isinstance(built, dict):
        return run_info
    if run_info is not None and not isinstance(run_info, dict):
        return run_info  # _json_values names the error
    info = dict(run_info or {})
    given = info.get('model')
    info['model'] = dict(built, **given) if isinstance(given, dict) else dict(built)
    return info


def _torch_mz_version() -> str:
    from torch_mz import __version__  # here: torch_mz/__init__ imports this module's users
    return __version__


def _cpu_state_dict(module: torch.nn.Module) -> Dict[str, Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
