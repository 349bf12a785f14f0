r"""What the ``torch-mz`` commands share: the error they end with, the flags of training,
their checks (made before any data are read or any file removed), the data and model options
and what a checkpoint or a comparison carries of them, loading a task and training one run.

:func:`_load`, :func:`_run`, :func:`_main_process` and :func:`_remove_run_files` are called
through this module by the commands (``_common._load(...)``): one replacement here reaches them
all.
"""
import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import sys
from typing import Any, Dict, List, NamedTuple, Optional, Sequence


class CLIError(Exception):
    r"""An error in what the user asked for: printed as one line, exit status 2."""


#: What the errors of a size that does not fit in memory, or in a tensor's sizes, say.
_NO_MEMORY = ("can't allocate memory", 'out of memory')
_OVERFLOW = ('storage size calculation overflowed', 'overflow when unpacking long')
#: What Python's :class:`OverflowError` says of an integer too large for a size (not, e.g.,
#: 'cannot convert float infinity to integer' or 'math range error': a bug's, with its traceback).
_INT_OVERFLOW = ('too large to convert', "cannot fit 'int'", 'int too big', 'int too large')


def _too_large(error: BaseException, memory: bool = True) -> bool:
    r"""Whether :obj:`error` says a size asked for does not fit: in the integers of a tensor's
    sizes (Python's :class:`OverflowError` of an integer, e.g. ``num_layers=2**70``; PyTorch's
    'Storage size calculation overflowed' and its :class:`TypeError` 'Overflow when unpacking
    long long') or, with :obj:`memory`, in memory (NumPy's :class:`MemoryError`, PyTorch's
    "can't allocate memory" and :class:`~torch.OutOfMemoryError`)."""
    text = str(error).lower()
    if isinstance(error, OverflowError) and any(m in text for m in _INT_OVERFLOW):
        return True
    if isinstance(error, (RuntimeError, TypeError)) and any(m in text for m in _OVERFLOW):
        return True
    return memory and (isinstance(error, MemoryError) or (
        isinstance(error, RuntimeError) and any(m in text for m in _NO_MEMORY)))


def _first_line(error: BaseException) -> str:
    r"""The first line of :obj:`error`'s message (PyTorch's may go on with a C++ stack), or its
    type's name where it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _parse_kv(items: Optional[Sequence[str]], what: str) -> Dict[str, object]:
    r"""``KEY=VALUE`` items (--task-arg, --model-arg) as a dict; a key given twice is refused
    (the last was taken, and the run's label did not name the value dropped)."""
    from torch_mz.options import parse_key_values
    out: Dict[str, object] = {}
    given: Dict[str, str] = {}
    for item in items or []:
        try:
            parsed = parse_key_values([item])
        except ValueError as e:
            raise CLIError(f'{what} {e}') from None
        key = next(iter(parsed))  # (as the parse reads it: center-std is center_std)
        if key in given:
            raise CLIError(f"{what} sets '{key}' more than once ('{given[key]}' and '{item}'): "
                           f"give each option once")
        given[key] = item
        out.update(parsed)
    return out


def _parse_range(text: Optional[str]):
    if text is None:
        return None
    try:
        lo, hi = (int(v) for v in text.split(','))
    except ValueError:
        raise CLIError(f"--set-size must look like LOW,HIGH (got '{text}')") from None
    if lo < 1 or hi < lo:
        raise CLIError(f"--set-size needs 1 <= LOW <= HIGH (got {lo},{hi})")
    return (lo, hi)


#: The training options' defaults (the paper's), where neither the command line nor, for
#: ``train --resume``, the checkpoint gives a value (the warm-up: 5 epochs, at most half the
#: run: :func:`_default_warmup`).
TRAINING_DEFAULTS: Dict[str, object] = dict(epochs=200, batch_size=128, lr=1e-4,
                                            weight_decay=1e-5, grad_clip=1.0, patience=20,
                                            no_normalize=False)


def _default_warmup(epochs: int) -> int:
    r"""The warm-up of a run of :obj:`epochs` epochs the command line does not set: the paper's 5,
    at most half the run, so that a short run (a smoke test) reaches the learning rate and decays
    (with ``--epochs`` 5 or fewer it was all warm-up: a run of one step trained at learning rate
    0, i.e. not at all)."""
    return min(5, max(epochs, 0) // 2)


#: Training options the command line has no flag for: a resumed run keeps its checkpoint's
#: (``num_workers`` too: loader workers change the random streams of augmented data, and a run
#: started from Python with them lost them on ``train --resume``, said to differ).
CARRIED_CONFIG = ('schedule', 'min_delta', 'eval_batch_size', 'restore_best', 'deterministic',
                  'checkpoint_every', 'num_workers', 'find_unused_parameters')


def _fill_training_options(args, recorded: Optional[Dict[str, Any]] = None) -> List[str]:
    r"""Sets the training options the command line left out: from the configuration
    :obj:`recorded` in the checkpoint a run resumes from (so that ``train --resume`` continues
    that run, not one with the defaults), else the defaults; the options the command line has no
    flag for (:data:`CARRIED_CONFIG`) come from the checkpoint too (``args.carried_config``).
    Returns the options taken from the checkpoint, as ``name=value``."""
    saved: Dict[str, object] = {}
    for key, flag in (('seed', 'seed'), ('epochs', 'epochs'), ('batch_size', 'batch_size'),
                      ('lr', 'lr'),
                      ('weight_decay', 'weight_decay'), ('warmup_epochs', 'warmup_epochs')):
        if key in (recorded or {}):
            saved[flag] = recorded[key]  # type: ignore[index]
    for key in ('grad_clip', 'patience'):  # None in the configuration: off, 0 on the command line
        if key in (recorded or {}):
            saved[key] = 0 if recorded[key] is None else recorded[key]  # type: ignore[index]
    if 'normalize_targets' in (recorded or {}):
        saved['no_normalize'] = not recorded['normalize_targets']  # type: ignore[index]
    # the configuration the command line cannot set (a run started from Python): carried over
    args.carried_config = {k: recorded[k] for k in CARRIED_CONFIG  # type: ignore[index]
                           if k in (recorded or {})}
    from torch_mz.train import TrainConfig
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    taken = [f'{k}={v!r}' for k, v in args.carried_config.items() if v != defaults[k]]
    names = (['seed'] if hasattr(args, 'seed') else []) + list(TRAINING_DEFAULTS) + [
        'warmup_epochs']  # (compare has --seeds, no --seed)
    for name in names:
        if getattr(args, name) is not None:
            continue
        if name == 'seed' and name not in saved:
            args.seed = 0
            continue
        if name in saved:
            setattr(args, name, saved[name])
            taken.append(f'{name}={saved[name]}')
        elif name in TRAINING_DEFAULTS:  # (the warm-up's default depends on --epochs)
            setattr(args, name, TRAINING_DEFAULTS[name])
    return taken


def _fill_data_options(args, recorded: Optional[Dict[str, Any]]) -> List[str]:
    r"""Sets the data options a resumed run's command line left out from what its checkpoint
    records (``run_info['task']``): the data seed and split sizes, the task options and the
    set-size range (not the Python objects, which the command line cannot give), so that
    ``--resume`` does not first build the task's default data (QM9's 50K molecules) only to
    refuse them. Returns the options taken, as ``name=value``."""
    if not isinstance(recorded, dict) or recorded.get('name') != args.task:
        return []  # another task: the run's own check names the difference
    import json
    taken: List[str] = []
    split: Dict[str, Any] = (recorded['split'] if isinstance(recorded.get('split'), dict)
                             else {})
    for key, flag in (('seed', 'data_seed'), ('n_train', 'n_train'), ('n_val', 'n_val'),
                      ('n_test', 'n_test')):
        if getattr(args, flag) is None and split.get(key) is not None:
            setattr(args, flag, split[key])
            taken.append(f'{flag}={split[key]!r}')
    options: Dict[str, Any] = (recorded['args'] if isinstance(recorded.get('args'), dict)
                               else {})
    from torch_mz.inference import OBJECT_OPTIONS
    # the keys as the parse reads them (center-std is center_std), or a key given with a dash
    # was overridden by the checkpoint's value, appended after it
    given = set(_parse_kv(args.task_arg, '--task-arg'))
    recorded_args = [f'{k}={json.dumps(v)}' for k, v in sorted(options.items())
                     if k != 'set_size' and k not in OBJECT_OPTIONS and k not in given]
    args.task_arg = list(args.task_arg or []) + recorded_args  # (those given stay as given)
    taken += recorded_args
    size = options.get('set_size')
    if args.set_size is None and isinstance(size, list) and len(size) == 2:
        args.set_size = f'{size[0]},{size[1]}'
        taken.append(f'set_size={args.set_size}')
    return taken


def _take_data_options(args, state: Dict[str, Any], whose: str) -> None:
    r"""The data options a resumed run's command left out, from its checkpoint :obj:`state`
    (:func:`_fill_data_options`, said on the console), and the data seed's default, 0, where
    neither gives one."""
    taken = _fill_data_options(args, (state.get('run_info') or {}).get('task')) if state else []
    if taken:
        print(f'resuming with the data options of {whose} (those not given): '
              + ', '.join(taken))
    if args.data_seed is None:  # (None until here: a resumed run takes the checkpoint's)
        args.data_seed = 0


def _keep_recorded_n_test(task, state: Dict[str, Any]) -> None:
    r"""A run resumed from a checkpoint that records more ModelNet40 / ScanObjectNN test sets
    than the official test files hold (written before the count taken was recorded: the count
    asked was, and all the files were taken, as they are now) keeps that record where its test
    sets are these (the digest it records): the trainer refuses a checkpoint whose record
    differs, and these runs could be neither resumed nor, with ``--n-test`` given, continued."""
    info = state.get('run_info') if isinstance(state, dict) else None
    recorded = info.get('task') if isinstance(info, dict) else None
    split = recorded.get('split') if isinstance(recorded, dict) else None
    data = recorded.get('data') if isinstance(recorded, dict) else None
    current = getattr(task, 'split', None)
    if not (isinstance(split, dict) and isinstance(data, dict) and isinstance(current, dict)):
        return
    asked, taken = split.get('n_test'), current.get('n_test')
    if (split.get('test_subset') == current.get('test_subset') == 'spread'
            and isinstance(asked, int) and taken == len(task.test) and asked > taken):
        from torch_mz.datasets.fingerprint import split_digest
        if data.get('test') == split_digest(task.test):
            current['n_test'] = asked


def _add_training_args(p: argparse.ArgumentParser):
    g = p.add_argument_group('task')
    g.add_argument('--task', required=True, help="task name (see 'torch-mz tasks')")
    g.add_argument('--n-train', type=int, help="training sets (default: the task's: the "
                   "paper's counts where it gives them (set regression, Chamfer, rotation "
                   "matching, MST weight) and QM9's 50K molecules, 80/10/10; 5,000 / 1,000 / "
                   "2,000 for the other synthetic tasks; for ModelNet40 / ScanObjectNN the "
                   "official training files but a 10%% validation hold-out)")
    g.add_argument('--n-val', type=int, help='validation sets')
    g.add_argument('--n-test', type=int, help='test sets (of ModelNet40 / ScanObjectNN: N spread '
                   'evenly over the official test files, which list their classes in turn; all '
                   'of them, with a warning, where N is more)')
    g.add_argument('--set-size', help='LOW,HIGH range of set sizes (synthetic tasks)')
    g.add_argument('--task-arg', action='append', metavar='KEY=VALUE',
                   help='task option, e.g. tdof=8 or target=mu (repeatable)')
    g.add_argument('--root', type=_data_root,
                   help='folder of the real dataset itself, e.g. datasets/QM9 '
                   '(default: $TORCH_MZ_DATA/<Name> or datasets/<Name>)')
    g.add_argument('--data-seed', type=int, default=None,
                   help='seed of the synthetic data / real split (default: 0; with --resume, '
                        "the checkpoint's)")
    t = p.add_argument_group('training (defaults: the paper; with --resume, those of the run '
                             'or comparison resumed)')
    t.add_argument('--epochs', type=int, help='most epochs to train (default: 200)')
    t.add_argument('--batch-size', type=int, help='sets per batch (default: 128)')
    t.add_argument('--lr', type=float, help='peak learning rate of AdamW (default: 1e-4)')
    t.add_argument('--weight-decay', type=float, help='AdamW weight decay (default: 1e-5)')
    t.add_argument('--warmup-epochs', type=int, default=None,
                   help='linear warm-up epochs (default: 5, at most half of --epochs)')
    t.add_argument('--grad-clip', type=float,
                   help='largest gradient norm; 0 turns clipping off (default: 1.0)')
    t.add_argument('--patience', type=int,
                   help='epochs without a better validation loss before stopping; 0 turns '
                   'early stopping off (default: 20)')
    t.add_argument('--no-normalize', action='store_true', default=None,
                   help='train on raw regression targets')
    t.add_argument('--device', default='auto', help="'auto', 'cpu', 'cuda' or 'cuda:N'")
    t.add_argument('--model-arg', action='append', metavar='KEY=VALUE',
                   help="model option overriding the preset's, e.g. dropout=0 (repeatable; "
                   "an option a model spec sets itself may not be given another value)")
    t.add_argument('--no-progress', action='store_true', help='no progress bars')
    p.add_argument('--out', type=_user_path, help='output folder (default: runs/<task>/...)')
    p.add_argument('--overwrite', action='store_true',
                   help='replace the files of an earlier run in --out (without it such a '
                   'folder is refused)')


#: :func:`~torch_mz.tasks.load_task`'s own arguments, and the flag that gives each.
_LOAD_FLAGS = {'name': '--task', 'seed': '--data-seed', 'n_train': '--n-train',
               'n_val': '--n-val', 'n_test': '--n-test', 'root': '--root',
               'progress': '--no-progress'}


def _check_not_load_args(options: Dict[str, object]) -> None:
    r"""--task-arg options that are :func:`~torch_mz.tasks.load_task`'s own arguments, refused
    and named by their flags (``name``, which the others' check left out, failed inside it with
    a TypeError and its traceback)."""
    given = [k for k in _LOAD_FLAGS if k in options]
    if given:
        raise CLIError(f"--task-arg {given[0]}=... is {_LOAD_FLAGS[given[0]]}, not a "
                       f"--task-arg")


def _load(args, progress: bool):
    from torch_mz.tasks import is_synthetic, load_task
    for flag in ('n_train', 'n_val', 'n_test'):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise CLIError(f"--{flag.replace('_', '-')} must be at least 1 (got {value})")
    options = _parse_kv(args.task_arg, '--task-arg')
    if 'set_size' in options:
        raise CLIError('the set-size range is --set-size LOW,HIGH, not a --task-arg')
    _check_not_load_args(options)
    if args.set_size is not None and not is_synthetic(args.task):
        raise CLIError(f"--set-size draws the sets of a synthetic task; '{args.task}' is a "
                       f"real dataset, whose sets are what they are")
    _check_root(args)
    if is_synthetic(args.task):
        _check_synthetic_size(args.task, (args.n_train, args.n_val, args.n_test),
                              _parse_range(args.set_size), options)
    # (--n-test above the official test files: all of them), said by the main process alone:
    # under torchrun every rank loads the data, and each said it again; so are the bars of
    # generating or processing the data (each rank drew its own, as the trainer's are rank 0's)
    main = _main_process()
    say = _warn if main else (lambda message: None)
    with _test_sets_warnings(say):
        return load_task(args.task, seed=0 if args.data_seed is None else args.data_seed,
                         n_train=args.n_train, n_val=args.n_val,
                         n_test=args.n_test, set_size=_parse_range(args.set_size),
                         root=args.root, progress=progress and main, **options)


@contextlib.contextmanager
def _test_sets_warnings(say):
    r"""Within it, the datasets' :class:`~torch_mz.datasets.real.TestSetsWarning` (``--n-test``
    above the official test files, all of which are taken) is given to :obj:`say` as the
    command's own warning, every time; the other warnings are shown as they come."""
    import warnings

    from torch_mz.datasets.real import TestSetsWarning
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, TestSetsWarning):
            say(str(message))
        else:
            shown(message, category, filename, lineno, file, line)
    with warnings.catch_warnings():
        warnings.simplefilter('always', TestSetsWarning)
        warnings.showwarning = show
        yield


def _check_synthetic_size(task: str, counts: Sequence[Optional[int]],
                          set_size: Optional[Sequence[int]], options: Dict[str, object],
                          size_flag: str = '--set-size') -> None:
    r"""Refuses set counts whose sets could not fit in this machine's memory, before generating
    them (``--n-train 100000000000`` ran on without end). The estimate is a lower bound: every
    set at the smallest size of its range, its points alone (4 bytes a coordinate) and 512
    bytes for its ``Data``. A range whose sizes, drawn uniformly, would on average not fit is
    refused too, naming :obj:`size_flag` (``--set-size 1,2**70`` ended in NumPy's 'high is out
    of bounds for int64', which named no flag)."""
    from torch_mz.datasets.synthetic import TASKS
    from torch_mz.tasks import resolved_options, task_options
    cls = TASKS[task]
    total = sum(n if n is not None else default for n, default in zip(counts,
                                                                      cls.default_num_sets))
    low, high = set_size or cls.default_set_size
    d = resolved_options(task, {'d': options.get('d')})['d']
    if d is None:  # left out: the constructor's default (quadratic-tdof's 32; d = 1 was taken)
        d = task_options(task)[0].get('d')
    if not isinstance(d, int) or isinstance(d, bool):  # (no d, or one checked later)
        d = 1
    need = total * (512 + 4 * low * d)
    try:
        memory = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (ValueError, OSError, AttributeError):  # (not on every platform)
        return
    if need > memory:
        raise CLIError(f"{total:,} sets of at least {low} elements need more than "
                       f"{_quotient(need, 2**30, 1)} GiB, beyond this machine's "
                       f"{memory / 2**30:,.1f} GiB of memory: ask for fewer (--n-train, "
                       f"--n-val, --n-test)"
                       + (f' or smaller ones ({size_flag})' if set_size is not None else ''))
    # the sizes are drawn uniformly from [low, high]: twice the mean need, in integers (a
    # HIGH past a float's range, 10**400, ended in an OverflowError's traceback)
    twice = total * (1024 + 4 * (low + high) * d)
    if set_size is not None and twice > 2 * memory:
        raise CLIError(f"{size_flag} {low},{high}: {total:,} sets of "
                       f"{_quotient(low + high, 2, 0)} elements on average need about "
                       f"{_quotient(twice, 2**31, 1)} GiB, beyond this machine's "
                       f"{memory / 2**30:,.1f} GiB of memory: give a smaller HIGH")


def _quotient(num: int, den: int, decimals: int) -> str:
    r""":obj:`num` / :obj:`den` with :obj:`decimals` decimals and thousands separators; past a
    float's range (a size of 10**400), the integer quotient."""
    try:
        return f'{num / den:,.{decimals}f}'
    except OverflowError:
        return f'{num // den:,}'


def _config(args, seed: int, out_dir: Optional[str], resume: Optional[str] = None):
    from torch_mz.train import TrainConfig
    return TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                       weight_decay=args.weight_decay,
                       warmup_epochs=(_default_warmup(args.epochs) if args.warmup_epochs is None
                                      else args.warmup_epochs),
                       grad_clip=args.grad_clip if args.grad_clip != 0 else None,
                       patience=args.patience if args.patience != 0 else None, seed=seed,
                       device=args.device, normalize_targets=not args.no_normalize,
                       out_dir=out_dir, resume=resume, progress=not args.no_progress,
                       # (the command has checked --out: a folder left with an earlier run's
                       # files here is this command's own, e.g. a compare run that wrote no
                       # checkpoint before it was stopped)
                       overwrite=True, **getattr(args, 'carried_config', {}))


class ModelSpec(NamedTuple):
    spec: str  # as given, e.g. 'hypernet:rank=4' (the model's name in tables)
    name: str  # the preset
    options: Dict[str, object]  # the spec's own options

    @property
    def folder(self) -> str:
        r"""The spec as a file name: 'hypernet:rank=4,dim=64' -> 'hypernet_rank=4_dim=64'."""
        return re.sub(r'[^\w.=+-]+', '_', self.spec)


def _model_specs(text: str, flag: str) -> List[ModelSpec]:
    r"""The model specs of --models/--model, read as the benchmarks read them."""
    from torch_mz.study import parse_model_spec, split_model_specs
    specs = []
    for spec in split_model_specs(text):
        try:
            name, options = parse_model_spec(spec)
        except ValueError as e:
            raise CLIError(str(e)) from None
        keys = [item.partition('=')[0].strip().replace('-', '_')
                for item in spec.partition(':')[2].split(',') if item]
        twice = next((key for key in keys if keys.count(key) > 1), None)
        if twice is not None:  # (the last was taken: the label named a value not trained with)
            raise CLIError(f"{flag}: model spec '{spec}' sets '{twice}' more than once: give "
                           f"each option once")
        specs.append(ModelSpec(spec, name, options))
    if not specs:
        raise CLIError(f'{flag} needs at least one model name')
    folders: Dict[str, str] = {}
    for model in specs:  # one run folder per spec and seed: a repeated spec would share them
        if model.folder in folders:
            same = ('is given twice' if folders[model.folder] == model.spec else
                    f"and '{folders[model.folder]}' name the same run folders")
            raise CLIError(f"{flag}: '{model.spec}' {same}; use --seeds for more runs of a "
                           f"model")
        folders[model.folder] = model.spec
    _check_models([s.name for s in specs])
    return specs


def _same_value(a: object, b: object) -> bool:
    r"""Whether two option values are one value (``0.1`` and ``0.10``, ``1`` and ``1.0``; not
    ``True`` and ``1``)."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _check_overrides(models: List[ModelSpec], overrides: Dict[str, object], flag: str) -> None:
    r"""--model-arg against the model specs, before anything is read, removed or written. An
    option that a spec sets itself and --model-arg gives another value is refused: the spec is
    the model's label (its table row, its run folder), which would name a value the model was
    not trained with. Two specs that name the same preset and options once --model-arg is
    applied are refused too (``'deepsets'`` and ``'deepsets:'``, ``'mz:dropout=0.1'`` and
    ``'mz:dropout=0.10'``, ``'mz:dropout=0'`` and ``'mz:dropout=0.0'``, ``'deepsets'`` and
    ``'deepsets:pool=sum'``, its preset's default: :func:`torch_mz.study.grid.model_key`): their
    runs would be one model's under two labels (the check of
    :func:`torch_mz.study.check_models`, which ran only after an earlier comparison had been
    removed)."""
    for model in models:
        for key, value in overrides.items():
            if key in model.options and not _same_value(model.options[key], value):
                raise CLIError(
                    f"--model-arg {key}={json.dumps(value, default=str)} contradicts "
                    f"{key}={json.dumps(model.options[key], default=str)}, which model spec "
                    f"'{model.spec}' sets itself (its label would name a value it was not "
                    f"trained with): give the option in the spec or in --model-arg, not both")
    from torch_mz.study.grid import model_key
    seen: Dict[str, str] = {}
    for model in models:  # (by value, over the preset's defaults)
        same = model_key(model.name, dict(model.options, **overrides))
        if same in seen:
            raise CLIError(f"{flag}: '{seen[same]}' and '{model.spec}' name the same model and "
                           f"options" + (' with the --model-args' if overrides else '')
                           + ': give each model once; use --seeds for more runs of a model')
        seen[same] = model.spec


def _run(args, task, model: ModelSpec, seed: int, out_dir: Optional[str],
         resume: Optional[str] = None) -> Dict[str, Any]:
    from torch_mz.study import train_one
    row = train_one(task, model.name, seed, _config(args, seed, out_dir, resume),
                    **dict(model.options, **_parse_kv(args.model_arg, '--model-arg')))
    return dict(row, model=model.spec)


def _option_error(what: str, name: str, error: Exception) -> str:
    r"""The message of a model that could not be built: an unknown option named as the preset's
    (the constructor that refused it is a layer inside the preset)."""
    unknown = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    if unknown:
        return (f"{what}: the '{name}' preset has no option '{unknown.group(1)}' (see "
                f"'torch-mz models' and torch_mz.models.build_model)")
    return f'{what}: {error}'


def _check_model_args(args, task, models: List[ModelSpec]):
    r"""Checks the options of every model spec, then --model-arg (which overrides them), against
    the presets before any training: unknown options and values of the wrong type end as a
    CLIError, not as a TypeError deep inside a constructor. With :obj:`task` :obj:`None`, before
    the data are loaded, the options are checked on a model of placeholder widths, for unknown
    options only (a value may depend on the task's widths: checked again with the task)."""
    overrides = _parse_kv(args.model_arg, '--model-arg')
    from torch_mz.options import check_options
    from torch_mz.models import build_model
    from torch_mz._checks import SizeError
    from torch_mz.models.registry import PRESETS
    for model in models:
        steps = [(model.options, f"model spec '{model.spec}'"),
                 (dict(model.options, **overrides), f"--model-arg: model '{model.spec}'")]
        for options, what in steps[:1] + (steps[1:] if overrides else []):
            if not options:
                continue
            try:
                check_options(options, PRESETS[model.name], what, complete=False)
            except ValueError as e:
                raise CLIError(str(e)) from None
            try:  # options that the preset passes on to its blocks are known only to them
                if task is None:
                    build_model(model.name, 4, 1, pos_dim=3 if model.name.startswith('egnn')
                                else None, **options)
                else:
                    build_model(model.name, task.in_channels, task.out_channels,
                                pos_dim=task.pos_dim,
                                feature_columns=task.info.get('feature_columns'), **options)
            except (MemoryError, RuntimeError, OverflowError, TypeError) as e:
                if _too_large(e):  # (a width of 2**70 ended in a traceback, or in a
                    # message of many lines: PyTorch's C++ stack)
                    raise CLIError(f'{what}: a size too large for this machine '
                                   f'({_first_line(e)})') from None
                if not isinstance(e, TypeError):
                    raise
                raise CLIError(_option_error(what, model.name, e)) from None
            except SizeError as e:  # (a bound of the sizes alone: refused before the data)
                raise CLIError(f'{what}: a size too large for this machine ({e})') from None
            except ValueError as e:
                if task is not None:
                    raise CLIError(f'{what}: {e}') from None


def _check_checkpoint_file(path: str, what: str) -> None:
    r"""A :class:`CLIError` for a checkpoint path that is a folder (naming the ``.pt`` files in
    it) or does not exist."""
    from torch_mz.train.checkpoint import checkpoint_files_hint
    if os.path.isdir(path):
        raise CLIError(f"{what} '{path}' is a folder, not a checkpoint file"
                       + checkpoint_files_hint(path))
    if not os.path.isfile(path):
        raise CLIError(f"{what} '{path}' does not exist")


def _run_files(folder: str) -> List[str]:
    from torch_mz.train import RUN_FILES
    return [name for name in RUN_FILES if os.path.isfile(os.path.join(folder, name))]


def _remove_run_files(folder: str, keep_folder: bool = False):
    r"""Removes what a training run wrote into :obj:`folder`, and the folder if nothing else is
    left in it (files a user put there stay) unless :obj:`keep_folder` (a folder the command
    holds, :func:`_holding_out_folder`: removed, the hold was on a folder that no longer
    existed, and another command could take the one the run made again); a symbolic link to a
    folder is kept (``rmdir`` refused it, once its run's files were gone: ``--overwrite`` into
    a linked run folder ended in "Not a directory" and trained nothing)."""
    for name in _run_files(folder):
        os.unlink(os.path.join(folder, name))
    if (not keep_folder and os.path.isdir(folder) and not os.path.islink(folder)
            and not os.listdir(folder)):
        os.rmdir(folder)


def _warn(message: str):
    print(f'torch-mz: warning: {message}', file=sys.stderr)


def _go_on_note(args) -> Optional[str]:
    r"""For a train or compare command stopped by Ctrl-C or SIGTERM, the line that gives the
    command that goes on with its run, or :obj:`None` where there is none to give: before the
    command set ``args.run_folder`` (its data not loaded, an earlier run in ``--out`` not yet
    replaced: ``--resume`` would continue that one), under ``torchrun`` (the command is the
    whole ``torchrun`` line), or for a run resumed into another ``--out`` that holds no
    checkpoint yet. ``train`` goes on with ``--resume <folder>/checkpoint.pt`` (a run stopped
    before its first checkpoint starts again with ``--overwrite``), ``compare`` with
    ``--resume``; either in place of an ``--overwrite``, the other words as typed."""
    import shlex

    from torch_mz.train import LAST_CHECKPOINT
    from torch_mz.train.runtime import DistInfo
    folder = getattr(args, 'run_folder', None)
    if folder is None or DistInfo.from_env().is_distributed:
        return None
    words, given = [], iter(shlex.split(args.command_line)[1:])
    resumed = False
    for word in given:
        if word == '--overwrite':
            continue
        if word == '--resume' or word.startswith('--resume='):
            resumed = True
            if args.command == 'train' and word == '--resume':
                next(given, None)  # (its checkpoint)
            continue
        words.append(word)
    checkpoint = os.path.join(folder, LAST_CHECKPOINT)
    if args.command == 'compare':
        words.append('--resume')
    elif os.path.isfile(checkpoint):
        words += ['--resume', checkpoint]
    elif resumed:  # (its --out holds files of this run, and no checkpoint: refused both ways)
        return None
    else:
        return (f"torch-mz: '{folder}' holds no checkpoint yet (stopped before the first was "
                f"written); to start again: torch-mz {shlex.join(words + ['--overwrite'])}")
    return f'torch-mz: to go on: torch-mz {shlex.join(words)}'


def _keep_memory_as_recorded(args, recorded: Any, whose: str) -> None:
    r"""Kept freed memory (:func:`torch_mz.runtime.keep_freed_memory`) for a resumed run, which
    :func:`torch_mz.cli.main` leaves to the command: on, as for a new run, unless the command
    says ``--no-keep-freed-memory`` or the run resumed was trained without it (:obj:`recorded`
    :obj:`False`, said on the console), as its other options are taken (the command kept it,
    and the run went on with other dropout masks than an uninterrupted one, with a warning)."""
    if args.keep_freed_memory and recorded is False:
        args.keep_freed_memory = False
        print(f'resuming with the allocator setting of {whose} (none given): '
              f'--no-keep-freed-memory')
    if args.keep_freed_memory:
        from torch_mz.runtime import keep_freed_memory
        keep_freed_memory()


def _check_path(path: str, flag: str, folder: bool):
    r"""An output path that can be made: not empty, and no part of it (the path itself for a
    folder, else its parent folders) an existing file."""
    if not path:
        raise CLIError(f'{flag} is empty: name a {"folder" if folder else "file"}')
    if '\0' in path:  # (the OS's ValueError 'embedded null byte' named no flag)
        raise CLIError(f'{flag} {path!r} holds a NUL character, which no path can hold')
    part = os.path.abspath(path if folder else os.path.dirname(os.path.abspath(path)))
    while not os.path.exists(part) and os.path.dirname(part) != part:
        part = os.path.dirname(part)
    if not os.path.isdir(part):
        raise CLIError(f"{flag} '{path}': '{part}' is a file, not a folder: choose another "
                       f"{flag}")
    # a folder this process cannot write found now, not after the data are built or the first
    # epoch has trained (naming a hidden temporary file); by the main process alone under
    # torchrun (the ranks' probes raced: one removed the folder another was probing)
    from torch_mz.study.report import check_out_folder
    if not _main_process():
        return
    where = path if folder else os.path.dirname(os.path.abspath(path))
    problem = check_out_folder(where)
    if problem is not None:
        why = problem.rsplit(': ', 1)[1] if ': ' in problem else ''  # (the OS's reason)
        raise CLIError(f"{flag} '{path}': the folder '{where}' cannot be written"
                       + (f' ({why})' if why else ''))


def _check_out_folder(out: str):
    _check_path(out, '--out', folder=True)


#: What each path flag names, for the message that refuses it empty.
_PATH_FLAGS = {'out': 'a folder', 'root': 'the dataset folder (or leave --root out for the '
               'default)', 'resume': 'a checkpoint file', 'checkpoint': 'a checkpoint file'}


def _check_not_empty(args, flags: Sequence[str] = ('out', 'root', 'resume')) -> None:
    r"""A path flag given as '' (``--out "$DIR"`` with the variable unset) is refused, not read as
    the flag left out: train and compare wrote into runs/..., and ``--root ''`` read the dataset
    from (or downloaded it into) the working directory, without a word."""
    for flag in flags:
        value = getattr(args, flag, None)
        if isinstance(value, str) and not value:  # (compare's --resume is a switch)
            name = flag if flag == 'checkpoint' else f'--{flag}'
            raise CLIError(f'{name} is empty: name {_PATH_FLAGS[flag]}')


def _check_numbers(args) -> None:
    r"""The numeric flags of train and compare, named with the ranges TrainConfig takes (its
    messages named its fields, and the seed's range here was [-2**63, 2**63), of which
    TrainConfig took [0, 2**32)); a flag still :obj:`None` (to be filled in from a checkpoint or
    the defaults) is skipped. Run on the flags as given before anything is read or sized by
    them (``compare --resume --seeds 4294967297`` listed a path for every seed until memory
    ran out), and by :func:`_check_training_args` once every flag is filled in."""
    for flag in ('n_train', 'n_val', 'n_test'):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise CLIError(f"--{flag.replace('_', '-')} must be at least 1 (got {value})")
    if args.grad_clip is not None and (not math.isfinite(args.grad_clip) or args.grad_clip < 0):
        raise CLIError(f'--grad-clip must be a positive norm, or 0 for no clipping (got '
                       f'{args.grad_clip})')
    if args.patience is not None and args.patience < 0:
        raise CLIError(f'--patience must be a number of epochs, or 0 for no early stopping '
                       f'(got {args.patience})')
    seed = getattr(args, 'seed', None)
    if seed is not None and not 0 <= seed < 2 ** 32:
        raise CLIError(f'--seed must be in [0, 2**32) (got {seed})')
    _check_seeds(args)
    if args.epochs is not None and args.epochs < 1:
        raise CLIError(f'--epochs must be at least 1 (got {args.epochs})')
    seeds = getattr(args, 'seeds', None)
    last = seed if seed is not None else (seeds - 1 if seeds is not None else None)
    if last is not None and args.epochs is not None and last + args.epochs > 2 ** 32:
        # (the shuffling of epoch e seeds with seed + e, and PyTorch keeps 32 bits of a seed:
        # the trainer refuses it too, once the data are loaded)
        raise CLIError(f"{'--seed' if seed is not None else 'the last seed (--seeds - 1)'} + "
                       f"--epochs must be at most 2**32 (epoch e shuffles with seed + e); got "
                       f"{last} + {args.epochs}")
    # (--lr 0 was taken: every epoch trained at learning rate 0, i.e. not at all)
    if args.lr is not None and (not math.isfinite(args.lr) or args.lr <= 0):
        raise CLIError(f'--lr must be a finite number > 0 (got {args.lr})')
    if args.weight_decay is not None and (not math.isfinite(args.weight_decay)
                                          or args.weight_decay < 0):
        raise CLIError(f'--weight-decay must be a finite number >= 0 (got {args.weight_decay})')
    warmup, epochs = args.warmup_epochs, args.epochs
    if warmup is not None and (warmup < 0 or epochs is not None and warmup > epochs):
        raise CLIError(f'--warmup-epochs must be in [0, --epochs] = [0, {epochs}] (got '
                       f'{warmup})')
    _check_data_seed_and_batch(args)


def _check_seeds(args) -> None:
    r"""compare's --seeds, where known (given, or read from comparison.json): 1 to 2**32."""
    seeds = getattr(args, 'seeds', None)
    if seeds is not None and seeds < 1:
        raise CLIError(f'--seeds must be at least 1 (got {seeds})')
    if seeds is not None and seeds > 2 ** 32:
        raise CLIError(f'--seeds must be from 1 to 2**32 (the seeds 0 .. --seeds - 1 lie in '
                       f'[0, 2**32); got {seeds})')


def _check_training_args(args):
    r"""The training settings and the device, checked before any data is loaded (a bad --epochs
    should not wait for a dataset to be processed) and before --overwrite removes anything."""
    _check_numbers(args)
    _config(args, getattr(args, 'seed', 0), None)  # TrainConfig's own checks: ValueError
    _check_device(args)


def _check_device(args) -> None:
    r"""--device: a device the commands run on, ``'auto'``, ``'cpu'``, ``'cuda'`` or
    ``'cuda:N'`` (``'mps'`` where PyTorch has it), named. The other types :class:`torch.device`
    knows (``'xla'``, ``'meta'``, ``'ipu'``, ...) passed the check and failed with a traceback
    once the data were loaded (``'meta'`` after the run's folder was made)."""
    import torch

    from torch_mz.train import resolve_device
    try:  # an unknown device, or CUDA where there is none
        device = resolve_device(args.device)
    except ValueError as e:
        raise CLIError(f'--device: {e}') from None
    mps = getattr(torch.backends, 'mps', None)
    known = ('cpu', 'cuda') + (('mps', ) if mps is not None and mps.is_available() else ())
    if device.type == 'mps' and 'mps' not in known:  # (a type it runs on, where there is one)
        raise CLIError(f"--device: Device '{args.device}' was requested but MPS is not "
                       f"available")
    if device.type not in known:
        raise CLIError(f"--device must be 'auto', 'cpu', 'cuda' or 'cuda:N' (got "
                       f"'{args.device}', a device type torch-mz does not run on)")


def _check_data_seed_and_batch(args) -> None:
    r"""--data-seed and --batch-size, named (the task's check named 'seed', a batch size past
    ``sys.maxsize`` failed inside itertools, and predict's 0 in the DataLoader after the data
    were built)."""
    if getattr(args, 'data_seed', None) is not None and args.data_seed < 0:
        raise CLIError(f'--data-seed must be an integer >= 0 (got {args.data_seed})')
    size = getattr(args, 'batch_size', None)
    if size is not None and not 1 <= size <= sys.maxsize:
        raise CLIError(f'--batch-size must be a number of sets from 1 to {sys.maxsize} (got '
                       f'{size})')


def _check_root(args) -> None:
    r"""--root: a folder, and only for a real dataset (a synthetic task, generated from its seed,
    reads no folder: the option was ignored without a word)."""
    from torch_mz.tasks import is_synthetic
    if args.root is None:
        return
    _check_not_empty(args, ('root', ))  # ('' read the working directory)
    if is_synthetic(args.task):
        raise CLIError(f"--root names the folder of a real dataset; task '{args.task}' is "
                       f"synthetic, generated from its seed: drop --root")
    if os.path.exists(args.root) and not os.path.isdir(args.root):
        raise CLIError(f"--root '{args.root}' is a file, not a dataset folder")


def _data_root(text: str) -> str:
    r"""--root with ``~`` expanded, as PyG's datasets expand it to read the folder (a quoted
    ``'~/x'`` was checked, and recorded in ``comparison.json``, as ``<cwd>/~/x``: another folder
    than the one read)."""
    return os.path.expanduser(text)


def _user_path(text: str) -> str:
    r"""A path flag (--out, --resume, predict's checkpoint) with ``~`` expanded, as --root has
    it: ``--out=~/runs``, which the shell leaves as it is, wrote into a folder named ``~`` in
    the working directory, and ``--resume '~/run/checkpoint.pt'`` was not found."""
    return os.path.expanduser(text)


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _check_models(names: List[str]):
    from torch_mz.models import list_models
    known = list_models()
    for name in names:
        if name not in known:
            raise CLIError(f"unknown model '{name}' (available: {', '.join(known)})")


def _check_task(name: str):
    from torch_mz.tasks import list_tasks
    if name not in list_tasks():
        raise CLIError(f"unknown task '{name}' (available: {', '.join(list_tasks())})")


def _main_process() -> bool:
    r"""Whether this process is the main one of its run (rank 0 under ``torchrun``)."""
    from torch_mz.train.runtime import DistInfo
    return DistInfo.from_env().is_main


def _holding_out_folder(out: str) -> Any:
    r"""The hold of a command's output folder :obj:`out` (:func:`~torch_mz._files.folder_lock`)
    for the rest of a train or compare command, taken by the main process before anything is
    read or removed there: another command writing into it at the same time is refused, naming
    it (two commands wrote their files between each other's, and an ``--overwrite`` removed the
    files of the run in progress)."""
    if not _main_process():  # (under torchrun the main process alone writes the files)
        return contextlib.nullcontext()
    from torch_mz._files import folder_lock
    return folder_lock(out, busy='wait for it to end, or choose another --out')
