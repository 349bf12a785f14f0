r"""``torch-mz predict``: a trained model's predictions on a task's test split, in the
target's units, as CSV."""
import os
from typing import Any, Dict, List, Optional

from torch_mz.cli import _common
from torch_mz.cli._common import (CLIError, _check_checkpoint_file, _check_data_seed_and_batch,
                                  _check_device, _check_not_empty, _check_path, _check_root,
                                  _check_synthetic_size, _check_task, _parse_kv, _same_path,
                                  _test_sets_warnings, _warn)


def _check_set_size(value: object, what: str):
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            or not 1 <= value[0] <= value[1]):
        raise CLIError(f'{what} must be a pair [LOW, HIGH] with 1 <= LOW <= HIGH (got '
                       f'{value!r})')


def _set_ids(dataset) -> Dict[str, List[int]]:
    r"""The columns that name each set of a test split, for ``predict``'s CSV: ``set``, its index
    in its dataset (a PyG dataset view's ``indices()``: the position in the processed dataset;
    for a list of sets its position), and QM9's ``gdb_idx`` where every set has one."""
    indices = dataset.indices() if callable(getattr(dataset, 'indices', None)) else None
    ids = {'set': [int(i) for i in (indices if indices is not None else range(len(dataset)))]}
    if not len(dataset) or getattr(dataset[0], 'gdb_idx', None) is None:  # (not QM9)
        return ids
    gdb: List[Any] = [getattr(d, 'gdb_idx', None) for d in dataset]
    if all(g is not None for g in gdb):
        ids['gdb_idx'] = [int(g.reshape(-1)[0]) if hasattr(g, 'reshape') else int(g)
                          for g in gdb]
    return ids


def _target_names(task, recorded: Dict[str, Any]) -> Optional[List[str]]:
    r"""The names of a regression task's targets where the task records them (QM9's
    ``info['targets']``: ``mu``, ``alpha``, ...), one per output and distinct, for ``predict``'s
    columns ``prediction_mu``, ``target_mu``; else :obj:`None` (the synthetic tasks, which name
    none: ``prediction``, ``prediction_0``, ...), and where they are not the targets the model
    was trained on (as the checkpoint's task entry :obj:`recorded` gives them: ``--task-arg
    target`` asked for others), whose names would misname its predictions."""
    names = (getattr(task, 'info', None) or {}).get('targets')
    if (task.task_type != 'regression' or not isinstance(names, (list, tuple))
            or len(names) != task.out_channels or len(set(names)) != len(names)
            or not all(isinstance(n, str) and n for n in names)):
        return None  # (QM9's target=['mu', 'mu'] names two columns alike: numbered)
    if task.name == 'qm9' and isinstance(recorded.get('args'), dict):
        # (a model of mu scored on alpha had its predictions named prediction_alpha)
        from torch_mz.datasets.qm9 import _target_names as qm9_names
        from torch_mz.datasets.real import LOAD_DEFAULTS
        try:
            trained = qm9_names(recorded['args'].get('target', LOAD_DEFAULTS['qm9']['target']))
        except (ValueError, TypeError):
            return None
        if trained != list(names):
            return None
    return list(names)


def _check_not_a_run_file(out: str, checkpoint: str) -> None:
    r"""predict's --out: neither the checkpoint it reads nor another file of that run's folder
    (:data:`~torch_mz.train.RUN_FILES`), even with --overwrite, which replaces an earlier CSV
    (the model was replaced by the CSV, and the next predict found it corrupt)."""
    from torch_mz.train import RUN_FILES
    # resolved paths: a checkpoint read through a link (latest.pt -> run/best.pt) names the
    # link's folder, and an --out through one names another file
    real = os.path.realpath(out)
    same = real == os.path.realpath(checkpoint) or (
        os.path.exists(out) and os.path.samefile(out, checkpoint))
    folder = os.path.dirname(os.path.realpath(checkpoint))  # the run's own folder
    if same or real in {os.path.realpath(os.path.join(folder, name)) for name in RUN_FILES}:
        shown = os.path.dirname(checkpoint) or '.'
        if not _same_path(shown, folder):
            shown = folder
        what = ('is the checkpoint predict reads' if same else
                f"is a file of the training run in '{shown}'")
        raise CLIError(f"--out '{out}' {what}: name another file, e.g. "
                       f"{os.path.join(shown, 'predictions.csv')}")


def cmd_predict(args) -> int:
    if args.task is not None:
        _check_task(args.task)
    _check_not_empty(args, ('checkpoint', 'root'))  # (--out: below)
    _check_checkpoint_file(args.checkpoint, 'checkpoint')
    if os.path.isdir(args.out):
        raise CLIError(f"--out '{args.out}' is a folder; predict writes one CSV file: name it, "
                       f"e.g. {os.path.join(args.out, 'predictions.csv')}")
    _check_path(args.out, '--out', folder=False)
    _check_not_a_run_file(args.out, args.checkpoint)
    if args.root is not None and os.path.exists(args.root) and not os.path.isdir(args.root):
        raise CLIError(f"--root '{args.root}' is a file, not a dataset folder")
    if os.path.exists(args.out) and not args.overwrite:
        raise CLIError(f"'{args.out}' already exists; pass --overwrite to replace it, or choose "
                       f"another --out")
    for flag in ('n_train', 'n_val', 'n_test'):
        value = getattr(args, flag)
        if value is not None and value < (1 if flag == 'n_test' else 0):
            raise CLIError(f"--{flag.replace('_', '-')} must be at least "
                           f"{1 if flag == 'n_test' else 0} (got {value})")
    _check_data_seed_and_batch(args)
    _check_device(args)  # (checked only once the data were read)
    import csv
    import io
    import warnings

    from torch_mz._files import atomic_write
    from torch_mz.inference import (OBJECT_OPTIONS, TestSplitWarning, _column_tensors,
                                    _load_model, _load_test_split)
    from torch_mz.train import load_checkpoint, resolve_device
    # read once: the split and the weights come from the one file read (a training run that
    # replaces best.pt meanwhile would otherwise give the weights of another epoch, or model)
    state = load_checkpoint(args.checkpoint)
    path = os.fspath(args.checkpoint)
    recorded = (state.get('run_info') or {}).get('task') or {}
    if args.task is None:  # the task the checkpoint records
        if not isinstance(recorded.get('name'), str):
            raise CLIError(f"checkpoint '{args.checkpoint}' does not record its task: pass "
                           f"--task")
        args.task = recorded['name']
        _check_task(args.task)
    if recorded.get('name', args.task) != args.task:
        raise CLIError(f"checkpoint '{args.checkpoint}' was trained on task "
                       f"'{recorded['name']}', not '{args.task}'")
    objects = {k: v for k, v in (recorded.get('args') or {}).items()
               if k in OBJECT_OPTIONS and v is not None}
    if objects:  # recorded by name: a Python object the command line cannot rebuild
        named = ', '.join(f'{k}={v}' for k, v in objects.items())
        raise CLIError(f"'{args.checkpoint}' was trained with {named} (Python objects, recorded "
                       f"by name), which the command line cannot rebuild: predict with the "
                       f"Python API, torch_mz.train.predict(torch_mz.load_model(checkpoint), "
                       f"torch_mz.inference.load_test_split(checkpoint, "
                       f"{', '.join(f'{k}=...' for k in objects)}).test)")
    _check_root(args)
    given = _parse_kv(args.task_arg, '--task-arg')
    _common._check_not_load_args(given)  # (load_task's own: a TypeError inside it)
    if 'set_size' in given:
        _check_set_size(given['set_size'], '--task-arg set_size')
    from torch_mz.tasks import is_synthetic
    if args.n_test is not None and is_synthetic(args.task):  # (the test sets alone are drawn)
        size = given.get('set_size', (recorded.get('args') or {}).get('set_size'))
        _check_synthetic_size(args.task, (0, 0, args.n_test),
                              size if isinstance(size, (list, tuple)) else None,
                              dict(recorded.get('args') or {}, **given),
                              '--task-arg set_size' if 'set_size' in given else
                              "the run's set_size")
    # the model first (from the checkpoint alone): one that cannot be rebuilt is refused before
    # the data are read (QM9's whole dataset); its in/out channels are checked against the task's
    model = _load_model(state, f'Checkpoint {path!r}', None)
    # the bars of generating the sets or processing the dataset (QM9, ModelNet40: minutes) and
    # of the forward passes, as train's and compare's: the main process's alone under torchrun
    progress = not args.no_progress and _common._main_process()
    notes = []  # load_test_split's warnings (given once every check has passed), as ours
    taken_all: List[str] = []  # the datasets' TestSetsWarning: all the official test files

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, TestSplitWarning):
            notes.append(str(message))
        else:  # (the datasets' own warnings, shown as they come)
            shown(message, category, filename, lineno, file, line)
    with warnings.catch_warnings(), _test_sets_warnings(taken_all.append):
        shown = warnings.showwarning  # (_test_sets_warnings's, which takes a TestSetsWarning)
        warnings.simplefilter('always', TestSplitWarning)
        warnings.showwarning = show
        task = _load_test_split(state, f"'{path}'", args.task, given, root=args.root,
                                n_test=args.n_test, data_seed=args.data_seed,
                                n_train=args.n_train, n_val=args.n_val, progress=progress)
    for text in notes:  # an option given as --task-arg, named so
        _warn(f'--task-arg {text}' if any(text.startswith(f'{k}=') for k in given) else text)
    asked = args.n_test if args.n_test is not None else (recorded.get('split') or {}).get(
        'n_test')
    if taken_all:
        _warn(taken_all[0])
    elif isinstance(asked, int) and len(task.test) < asked:  # (a run recorded before the
        # spread subset takes the first N of the official test files: as many as there are)
        _warn(f"{'--n-test' if args.n_test is not None else 'the run'} asks for {asked} test "
              f"sets; the test split holds {len(task.test)}: all of them are taken")
    columns = dict(_set_ids(task.test), **{k: _cells(v) for k, v in _column_tensors(
        model, _in_dtype(task.test, model), task.task_type, batch_size=args.batch_size,
        device=resolve_device(args.device), target_names=_target_names(task, recorded),
        progress=progress).items()})
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator='\n')
    writer.writerow(columns)
    writer.writerows(zip(*columns.values()))
    try:  # (without --overwrite, not over a file another process made since the check above)
        atomic_write(args.out, lambda f: f.write(buf.getvalue()), binary=False,
                     overwrite=args.overwrite)
    except FileExistsError:
        raise CLIError(f"'{args.out}' was made (by another process) while predict ran; pass "
                       f"--overwrite to replace it, or choose another --out") from None
    print(f"{len(task.test)} test sets of {task.name} ({', '.join(columns)}) -> {args.out}"
          + _weights_note(state))
    return 0


def _weights_note(state: Dict[str, Any]) -> str:
    r"""Which weights ``predict`` used, for its summary line: the epoch of the checkpoint's model
    and, for a ``checkpoint.pt`` whose last epoch is not the run's best, that it is the last one
    (its predictions were taken for those of ``best.pt``, whose test figures ``result.json``
    gives where the run restored its best model, and disagreed with them without a word)."""
    from torch_mz.train import BEST_CHECKPOINT
    epoch, best = state.get('epoch'), state.get('best_epoch')
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        return ''
    config = state.get('config')
    restored = not isinstance(config, dict) or config.get('restore_best', True) is not False
    if (state.get('kind') == 'train' and isinstance(best, int) and not isinstance(best, bool)
            and best != epoch and restored):
        return (f' (the model of epoch {epoch}, the last trained; the best validation epoch, '
                f'whose test figures result.json gives, is {best}: its model is in '
                f'{BEST_CHECKPOINT})')
    return f' (the model of epoch {epoch})'


def _cells(values) -> List[Any]:
    r"""A column of ``predict``'s CSV: a floating-point column's values as the shortest text
    that reads back to the same value in the column's own dtype (a float32 target 0.0597 was
    written 0.059700001031160355, its float64 value; a float64 column keeps float64's
    precision), an integer column's as integers."""
    import numpy as np
    import torch
    if not values.is_floating_point() or values.dtype == torch.float64:
        return values.tolist()  # (Python's repr of a float: the shortest for float64)
    kind = np.float16 if values.dtype == torch.float16 else np.float32  # (bfloat16: exact
    # in float32, and the shortest float32 text reads back to it)
    return [str(kind(v)) for v in values.tolist()]


def _in_dtype(dataset, model) -> Any:
    r"""The sets of :obj:`dataset` with their floating-point tensors in the precision of
    :obj:`model`'s weights where the two differ (a model trained in float64 through the Python
    API is rebuilt in float64, and the tasks give float32 sets: exact, float32 values are
    float64 values), else :obj:`dataset` itself. The targets ``y``, which the model does not
    read, stay as they are: the CSV's target columns are the dataset's (a float16 or bfloat16
    model's were the targets rounded to its precision, a float64 model's float32 targets were
    written as their float64 values)."""
    import torch
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    first = dataset[0] if len(dataset) else None
    given = next((v.dtype for k, v in (first.items() if first is not None else [])
                  if k != 'y' and torch.is_tensor(v) and v.is_floating_point()), None)
    if dtype is None or given is None or given == dtype:
        return dataset
    sets = [d.clone() for d in dataset]
    for d in sets:
        for key, value in list(d.items()):
            if key != 'y' and torch.is_tensor(value) and value.is_floating_point():
                d[key] = value.to(dtype)
    return sets
