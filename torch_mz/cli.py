r"""The ``torch-mz`` command: train and compare set models on the paper's tasks.

    torch-mz tasks
    torch-mz models
    torch-mz train --task quadratic-tdof --model mz --epochs 50
    torch-mz compare --task quadratic-tdof --models mz-1l,st-4l,hypernet:rank=4 --seeds 3
    torch-mz predict runs/quadratic-tdof/mz-seed0/best.pt --task quadratic-tdof --out pred.csv

A model is named by a spec, ``name`` or ``name:key=value,...`` (parsed by
:func:`torch_mz.study.parse_model_spec`, as in the benchmarks). Bad input (unknown task or
model, unknown or mistyped options, impossible sizes, missing data, a missing, corrupt or foreign
checkpoint, an output folder that holds an earlier run or an output file that exists, a learning
rate that makes the loss diverge) ends with a one-line message and exit status 2, never a
traceback.
"""
import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import shlex
import sys
import time
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

EXIT_USAGE = 2

# The demo: quadratic-TDOF task (TDOF 8) with one MZ layer against a 4-layer standard Set
# Transformer and EGNN; every model gets the same data, budget, schedule and normalisation.
DEMO_ARGS = ['compare', '--task', 'quadratic-tdof', '--models', 'mz-1l,st-4l,egnn,deepsets',
             '--seeds', '2', '--epochs', '10', '--warmup-epochs', '1', '--lr', '1e-3',
             '--batch-size', '64', '--n-train', '640', '--n-val', '160', '--n-test', '320',
             '--task-arg', 'd=16', '--task-arg', 'tdof=8', '--out', 'runs/demo', '--overwrite']


class CLIError(Exception):
    r"""An error in what the user asked for: printed as one line, exit status 2."""


def _parse_kv(items: Optional[Sequence[str]], what: str) -> Dict[str, object]:
    from torch_mz.options import parse_key_values
    try:
        return parse_key_values(items or [])
    except ValueError as e:
        raise CLIError(f'{what} {e}') from None


def _check_set_size(value: object, what: str):
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            or not 1 <= value[0] <= value[1]):
        raise CLIError(f'{what} must be a pair [LOW, HIGH] with 1 <= LOW <= HIGH (got '
                       f'{value!r})')


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
    p.add_argument('--out', help='output folder (default: runs/<task>/...)')
    p.add_argument('--overwrite', action='store_true',
                   help='replace the files of an earlier run in --out (without it such a '
                   'folder is refused)')


def _load(args, progress: bool):
    from torch_mz.tasks import is_synthetic, load_task
    for flag in ('n_train', 'n_val', 'n_test'):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise CLIError(f"--{flag.replace('_', '-')} must be at least 1 (got {value})")
    options = _parse_kv(args.task_arg, '--task-arg')
    if 'set_size' in options:
        raise CLIError('the set-size range is --set-size LOW,HIGH, not a --task-arg')
    flags = {'seed': '--data-seed', 'n_train': '--n-train', 'n_val': '--n-val',
             'n_test': '--n-test', 'root': '--root', 'progress': '--no-progress'}
    given = [k for k in flags if k in options]  # (load_task's own: a TypeError before)
    if given:
        raise CLIError(f"--task-arg {given[0]}=... is {flags[given[0]]}, not a --task-arg")
    if args.set_size is not None and not is_synthetic(args.task):
        raise CLIError(f"--set-size draws the sets of a synthetic task; '{args.task}' is a "
                       f"real dataset, whose sets are what they are")
    _check_root(args)
    if is_synthetic(args.task):
        _check_synthetic_size(args.task, (args.n_train, args.n_val, args.n_test),
                              _parse_range(args.set_size), options)
    with _test_sets_warnings(_warn):  # (--n-test above the official test files: all of them)
        return load_task(args.task, seed=0 if args.data_seed is None else args.data_seed,
                         n_train=args.n_train, n_val=args.n_val,
                         n_test=args.n_test, set_size=_parse_range(args.set_size),
                         root=args.root, progress=progress, **options)


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
                          set_size: Optional[Sequence[int]], options: Dict[str, object]) -> None:
    r"""Refuses set counts whose sets could not fit in this machine's memory, before generating
    them (``--n-train 100000000000`` ran on without end). The estimate is a lower bound: every
    set at the smallest size of its range, its points alone (4 bytes a coordinate) and 512
    bytes for its ``Data``."""
    from torch_mz.datasets.synthetic import TASKS
    from torch_mz.tasks import resolved_options
    cls = TASKS[task]
    total = sum(n if n is not None else default for n, default in zip(counts,
                                                                      cls.default_num_sets))
    low = (set_size or cls.default_set_size)[0]
    d = resolved_options(task, {'d': options.get('d')})['d']
    if not isinstance(d, int) or isinstance(d, bool):  # (the task's own default, or checked later)
        d = 1
    need = total * (512 + 4 * low * d)
    try:
        memory = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (ValueError, OSError, AttributeError):  # (not on every platform)
        return
    if need > memory:
        raise CLIError(f"{total:,} sets of at least {low} elements need more than "
                       f"{need / 2**30:,.1f} GiB, beyond this machine's {memory / 2**30:,.1f} GiB "
                       f"of memory: ask for fewer (--n-train, --n-val, --n-test)")


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


def _take_model_args(args, state: Dict[str, Any], model: ModelSpec, whose: str) -> None:
    r"""The model options a resumed run's command left out, where it gives no --model-arg: those
    its checkpoint :obj:`state` records beside the options of the spec :obj:`model` (said on the
    console), as the data and training options (a run of 'rigid' with --model-arg dropout=0.2
    resumed without it was refused)."""
    info = state.get('run_info') if state else None
    entry = info.get('model') if isinstance(info, dict) else None
    saved = entry.get('args') if isinstance(entry, dict) else None
    if args.model_arg or not isinstance(saved, dict):
        return
    try:
        args.model_arg = [f'{k}={json.dumps(v)}' for k, v in saved.items()
                          if k not in model.options]
    except (TypeError, ValueError):  # (a value the command line cannot give)
        args.model_arg = None
    if args.model_arg:
        print(f'resuming with the model options of {whose} (no --model-arg given): '
              + ', '.join(args.model_arg))


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
            except TypeError as e:
                raise CLIError(_option_error(what, model.name, e)) from None
            except ValueError as e:
                if task is not None:
                    raise CLIError(f'{what}: {e}') from None


_COMPARE_RESULTS = ('results.json', 'results.md', 'results.png', 'comparison.json')
_COMPARISON = 'comparison.json'  # the models, --seeds and options a comparison started with
_RUN_FOLDER = re.compile(r'.+-seed\d+$')  # a compare run's <model>-seed<k> folders
_SEED_FOLDER = re.compile(r'(.+)-seed(\d+)$')  # (the same, its model's folder and seed)


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


def _remove_run_files(folder: str):
    r"""Removes what a training run wrote into :obj:`folder`, and the folder if nothing else is
    left in it (files a user put there stay)."""
    for name in _run_files(folder):
        os.unlink(os.path.join(folder, name))
    if os.path.isdir(folder) and not os.listdir(folder):
        os.rmdir(folder)


def _compare_outputs(out: str) -> List[str]:
    r"""What an earlier ``compare`` left in :obj:`out`: its results files and model folders."""
    if not os.path.isdir(out):
        return []
    found = [name for name in _COMPARE_RESULTS if os.path.isfile(os.path.join(out, name))]
    found += sorted(name for name in os.listdir(out) if _RUN_FOLDER.match(name)
                    and os.path.isdir(os.path.join(out, name))
                    and _run_files(os.path.join(out, name)))
    return found


def _warn(message: str):
    print(f'torch-mz: warning: {message}', file=sys.stderr)


def _check_path(path: str, flag: str, folder: bool):
    r"""An output path that can be made: not empty, and no part of it (the path itself for a
    folder, else its parent folders) an existing file."""
    if not path:
        raise CLIError(f'{flag} is empty: name a {"folder" if folder else "file"}')
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
    for flag in ('lr', 'weight_decay'):
        value = getattr(args, flag)
        if value is not None and (not math.isfinite(value) or value < 0):
            raise CLIError(f"--{flag.replace('_', '-')} must be a finite number >= 0 (got "
                           f"{value})")
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
    from torch_mz.train import resolve_device
    _check_numbers(args)
    _config(args, getattr(args, 'seed', 0), None)  # TrainConfig's own checks: ValueError
    resolve_device(args.device)  # ValueError: an unknown device, or CUDA where there is none


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


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def cmd_tasks(args) -> int:
    from torch_mz.tasks import list_tasks
    tasks = list_tasks()
    width = max(map(len, tasks))
    for name, desc in tasks.items():
        print(f'{name:{width}s}  {desc}')
    return 0


def cmd_models(args) -> int:
    from torch_mz.models import build_model, count_parameters, list_models
    if args.in_channels < 1:
        raise CLIError(f'--in-channels must be at least 1 (got {args.in_channels})')
    models = list_models()
    width = max(map(len, models))
    print(f"{'model':{width}s}  {'params*':>8s}  description")
    for name, desc in models.items():
        n = count_parameters(build_model(name, args.in_channels, 1,
                                         pos_dim=(args.in_channels
                                                  if name in ('egnn', 'egnn-qm9') else None)))
        print(f'{name:{width}s}  {n:8,d}  {desc}')
    print(f'* for {args.in_channels} input channels and one output')
    return 0


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


def cmd_train(args) -> int:
    _check_task(args.task)
    _check_not_empty(args)
    models = _model_specs(args.model, '--model')
    _check_numbers(args)
    if len(models) > 1:
        raise CLIError(f"--model takes one model (got {', '.join(m.spec for m in models)}); "
                       f"use 'torch-mz compare --models' for several")
    model = models[0]
    if args.resume is not None:
        _check_checkpoint_file(args.resume, '--resume')
    if args.resume is not None and args.overwrite:
        raise CLIError('--resume continues a run and --overwrite starts a new one: pass one')
    recorded, epochs_run, state = None, None, {}
    if args.resume is not None:
        from torch_mz.train import load_checkpoint
        state = load_checkpoint(args.resume)
        recorded = state.get('config')
        if isinstance(state.get('epoch'), int) and state.get('kind') == 'train':
            epochs_run = state['epoch'] + 1
        # another task or preset, before its data are built (for QM9 the whole task); the
        # trainer compares the rest (options, splits) against the data
        info = state.get('run_info')
        info = info if isinstance(info, dict) else {}  # (a run_info of one's own making)
        entries = {k: v if isinstance(v, dict) else {} for k, v in info.items()}
        for what, flag, given in (('task', '--task', args.task), ('model', '--model',
                                                                   model.name)):
            saved = entries.get(what, {}).get('name')
            if isinstance(saved, str) and saved != given:
                raise CLIError(f"checkpoint '{args.resume}' was written by a run of {what} "
                               f"'{saved}', not '{given}': pass {flag} {saved} to resume it")
        # the model options, where no --model-arg is given, beside those the --model spec gives
        _take_model_args(args, state, model, 'the checkpoint')
    _check_overrides(models, _parse_kv(args.model_arg, '--model-arg'), '--model')
    _take_data_options(args, state, 'the checkpoint')
    taken = _fill_training_options(args, recorded if isinstance(recorded, dict) else None)
    if any(t.startswith('warmup_epochs=') for t in taken) and args.warmup_epochs > args.epochs:
        raise CLIError(f"--epochs {args.epochs} is fewer than the checkpoint's warm-up of "
                       f"{args.warmup_epochs} epochs: pass --warmup-epochs too")
    if epochs_run is not None and args.epochs < epochs_run:
        raise CLIError(f"--epochs {args.epochs} is fewer than the {epochs_run} epochs the "
                       f"checkpoint '{args.resume}' has run: pass --epochs {epochs_run} or more")
    if taken:
        print('resuming with the training options of the checkpoint (those not given): '
              + ', '.join(taken))
    if args.out is not None:  # ('' is refused below: it was taken for no --out)
        out = args.out
    elif args.resume is not None:  # the run goes on where it was (its logs, best.pt, result)
        out = os.path.dirname(args.resume) or '.'
    else:
        out = os.path.join('runs', args.task, f'{model.folder}-seed{args.seed}')
    _check_out_folder(out)
    _check_training_args(args)
    existing = _run_files(out)
    resumes_here = args.resume is not None and _same_path(os.path.dirname(args.resume) or '.',
                                                          out)
    if existing and not args.overwrite and not resumes_here:
        last = os.path.join(out, 'checkpoint.pt')
        hint = ('choose another --out' if args.resume is not None else
                f"pass --overwrite to replace it, or --resume {last} to continue it"
                if os.path.isfile(last) else
                "it has no checkpoint.pt to resume from (interrupted in its first epoch); "
                "pass --overwrite to start it again")
        raise CLIError(f"'{out}' already holds a run ({', '.join(existing)}); {hint}")
    _check_model_args(args, None, models)  # unknown options, before the data are loaded
    task = _load(args, progress=not args.no_progress)
    _keep_recorded_n_test(task, state)
    _check_model_args(args, task, models)
    print(f'task {task.name}: {task.description} | train/val/test = '
          f'{len(task.train)}/{len(task.val)}/{len(task.test)} | d_in={task.in_channels}')
    if args.overwrite and _main_process():  # (under torchrun every rank removed them: a
        _remove_run_files(out)  # later one could remove what the main one had written)
    row = _run(args, task, model, args.seed, out, args.resume)
    metrics = ', '.join(f'{k} {v:.4g}' for k, v in row['test'].items())
    print(f"{args.model} ({row['params']:,} parameters): best epoch {row['best_epoch']}, "
          f"test {metrics}")
    print(f'logs and checkpoints in {out}')
    return 0


def _comparison_record(out: str) -> Optional[Dict[str, Any]]:
    r"""What ``comparison.json`` in :obj:`out` records (the models and ``--seeds`` a comparison
    started with and, since torch-mz records them, its options: :func:`_comparison_options`):
    :obj:`None` where there is no such file, ``{}`` where it cannot be read."""
    path = os.path.join(out, _COMPARISON)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _comparison_seeds(out: str, models: List[ModelSpec],
                      record: Optional[Dict[str, Any]]) -> int:
    r"""The ``--seeds`` of the comparison in :obj:`out` (for ``--resume`` without ``--seeds``):
    as recorded when it started (``comparison.json``, read as :obj:`record`); a comparison that
    predates the record (run folders, no record) is refused: its folders hold the seeds that
    had started, not necessarily all of them."""
    if record is not None:
        seeds = record.get('seeds')
        if isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 1:
            return seeds
        raise CLIError(f"--resume: '{os.path.join(out, _COMPARISON)}' does not record the "
                       f"comparison's --seeds; pass --seeds")
    folders = {model.folder for model in models}
    found = [int(m.group(2)) for name in (os.listdir(out) if os.path.isdir(out) else ())
             for m in [_SEED_FOLDER.match(name)] if m and m.group(1) in folders]
    if not found:
        return 3
    raise CLIError(f"--resume: '{out}' does not record the comparison's --seeds (it predates "
                   f"the record; its run folders hold seeds up to {max(found)}): pass --seeds")


#: The flags ``comparison.json`` records beside --models and --seeds (and the task, the
#: --task-args, the --model-args and the options without a flag that checkpoints carried), with
#: the types they take: a comparison interrupted before any run wrote a checkpoint resumes with
#: them (it started a comparison of every default).
_RECORDED_FLAGS: Dict[str, Any] = dict(
    n_train=int, n_val=int, n_test=int, data_seed=int, set_size=str, root=str, epochs=int,
    batch_size=int, lr=(int, float), weight_decay=(int, float), warmup_epochs=int,
    grad_clip=(int, float), patience=int, no_normalize=bool)


def _comparison_options(args, task=None) -> Dict[str, Any]:
    r"""The options of the comparison :obj:`args` describes, every one filled in (the warm-up's
    default resolved, the dataset folder made absolute), as ``comparison.json`` records them;
    with the :obj:`task` loaded, the folder a real dataset was read from where ``--root`` was
    left out (:func:`_dataset_folder`)."""
    options: Dict[str, Any] = {flag: getattr(args, flag) for flag in _RECORDED_FLAGS}
    if options['root'] is None and task is not None:  # (null: the default folder, which a
        options['root'] = _dataset_folder(task)  # resume elsewhere resolved to other data)
    if options['root'] is not None:  # (a relative folder, read from another directory on
        options['root'] = os.path.abspath(options['root'])  # resume, named other data)
    if options['warmup_epochs'] is None:
        options['warmup_epochs'] = _default_warmup(args.epochs)
    return dict(task=args.task, **options, task_arg=list(args.task_arg or []),
                model_arg=list(args.model_arg or []),
                carried_config=dict(getattr(args, 'carried_config', {})))


def _dataset_folder(task) -> Optional[str]:
    r"""The folder the real dataset of :obj:`task` was read from (its ``root``: ``--root``, or
    the default the dataset resolved, :func:`~torch_mz.datasets.default_root`), absolute;
    :obj:`None` for a synthetic task, generated from its seed."""
    root = getattr(getattr(task, 'test', None), 'root', None)
    return os.path.abspath(root) if isinstance(root, str) else None


def _recorded_items(options: Dict[str, Any], key: str, where: str) -> List[str]:
    value = options.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CLIError(f"--resume: '{where}' records {key}={value!r}, not a list of KEY=VALUE "
                       f"texts: pass the comparison's --{key.replace('_', '-')}s")
    return value


def _take_comparison_options(args, options: Dict[str, Any], where: str,
                             model_args: bool) -> Dict[str, Any]:
    r"""compare --resume: the options the command does not give, from those ``comparison.json``
    (:obj:`where`) records (:func:`_comparison_options`), said on the console; with
    :obj:`model_args`, the ``--model-arg``s where it gives none. Returns the options without a
    flag it records."""
    task = options.get('task')
    if isinstance(task, str) and task != args.task:
        raise CLIError(f"--resume: '{where}' records a comparison of task '{task}', not "
                       f"'{args.task}': pass --task {task}, or choose another --out")
    taken: List[str] = []
    for flag, kind in _RECORDED_FLAGS.items():
        value = options.get(flag)
        if value is None or getattr(args, flag) is not None:
            continue
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise CLIError(f"--resume: '{where}' records {flag}={value!r}, which is no value "
                           f"of --{flag.replace('_', '-')}: pass --{flag.replace('_', '-')}")
        setattr(args, flag, value)
        taken.append(f'{flag}={value}')
    given = set(_parse_kv(args.task_arg, '--task-arg'))
    items = [item for item in _recorded_items(options, 'task_arg', where)
             if not set(_parse_kv([item], f"'{where}' records a --task-arg")) & given]
    args.task_arg = list(args.task_arg or []) + items
    if taken or items:
        print(f'resuming with the options of the comparison ({where}; those not given): '
              + ', '.join(taken + items))
    if model_args and not args.model_arg and 'model_arg' in options:
        args.model_arg = list(_recorded_items(options, 'model_arg', where)) or None
        if args.model_arg:
            print('resuming with the model options of the comparison (no --model-arg given): '
                  + ', '.join(args.model_arg))
    carried = options.get('carried_config')
    return {k: v for k, v in carried.items() if k in CARRIED_CONFIG} if isinstance(
        carried, dict) else {}


def _comparison_run(name: str, models: List[ModelSpec], seeds: int) -> Optional[Tuple[str, int]]:
    r"""The (spec, seed) of :obj:`name` as a run folder of the comparison of :obj:`models` with
    :obj:`seeds` seeds (``<model>-seed<k>``), or :obj:`None`."""
    match = _SEED_FOLDER.match(name)
    if match is None:
        return None
    seed = int(match.group(2))
    spec = next((m.spec for m in models if m.folder == match.group(1)), None)
    if spec is None or seed >= seeds or name != f'{match.group(1)}-seed{seed}':
        return None
    return spec, seed


def _compare_checkpoints(out: str, models: List[ModelSpec],
                         seeds: int) -> Dict[Tuple[str, int], str]:
    r"""The last checkpoint of every run of the comparison in :obj:`out` that has one, by
    (spec, seed), in the order of the models and seeds: found by listing :obj:`out`, not by
    trying every seed (``--seeds`` may be 2**32)."""
    from torch_mz.train import LAST_CHECKPOINT
    found = {}
    for name in os.listdir(out) if os.path.isdir(out) else ():
        run = _comparison_run(name, models, seeds)
        path = os.path.join(out, name, LAST_CHECKPOINT)
        if run is not None and os.path.isfile(path):
            found[run] = path
    order = {model.spec: i for i, model in enumerate(models)}
    return {run: found[run] for run in sorted(found, key=lambda r: (order[r[0]], r[1]))}


def _shown(value: object) -> str:
    return json.dumps(value, default=str)


def _take_comparison_model_args(args, models: List[ModelSpec],
                                saved: Dict[Tuple[str, int], Dict[str, Any]]) -> None:
    r"""compare --resume without --model-arg, of a comparison whose ``comparison.json`` does not
    record them (an earlier torch-mz): the --model-args its checkpoints :obj:`saved` record (as
    train --resume takes them). A checkpoint records its model's options, its spec's and the
    --model-args together: an option its spec does not set is a --model-arg, which every model
    has. One that every model with a checkpoint sets in its own spec cannot be told from the
    spec's (a --model-arg may repeat a spec's value): where a model without it would train with
    it or without it, that is refused, not guessed (the options of the first checkpoint found,
    less its spec's, were applied to every model: a --model-arg repeating that spec's option
    was lost for the others)."""
    by_spec = {model.spec: model for model in models}
    records: Dict[str, Dict[str, Any]] = {}
    for (spec, _), state in saved.items():
        info = state.get('run_info')
        entry = info.get('model') if isinstance(info, dict) else None
        options = entry.get('args') if isinstance(entry, dict) else None
        if isinstance(options, dict):
            records.setdefault(spec, options)
    overrides: Dict[str, Any] = {}
    source: Dict[str, str] = {}
    for spec, options in records.items():
        for key, value in options.items():
            if key in by_spec[spec].options:
                continue
            if key in overrides and not _same_value(overrides[key], value):
                raise CLIError(f"--resume: the checkpoints of '{source[key]}' and '{spec}' "
                               f"record {key}={_shown(overrides[key])} and {key}={_shown(value)}"
                               f", where a --model-arg gives every model one value: pass the "
                               f"comparison's --model-args")
            overrides.setdefault(key, value)
            source.setdefault(key, spec)
    for spec, options in records.items():
        for key in overrides:
            if key not in by_spec[spec].options and key not in options:
                raise CLIError(f"--resume: the checkpoints of '{source[key]}' record "
                               f"{key}={_shown(overrides[key])} and those of '{spec}' do not, "
                               f"where a --model-arg gives every model one value: pass the "
                               f"comparison's --model-args")
    for spec, options in records.items():
        for key, value in options.items():
            if key in overrides or any(key not in by_spec[s].options for s in records):
                continue  # (known: a --model-arg, or not one)
            # (a model whose preset does not take the option cannot have had it as a
            # --model-arg: the comparison refused such a --model-arg)
            lacking = [model.spec for model in models if key not in model.options
                       and _takes_option(model.name, key, value)]
            if lacking:
                raise CLIError(
                    f"--resume: the checkpoints cannot tell whether {key}={_shown(value)} was a "
                    f"--model-arg: every model with a checkpoint ({', '.join(records)}) sets it "
                    f"in its spec, and '{lacking[0]}' does not (it would train with it if it "
                    f"was, with the preset's value if not): pass the comparison's --model-args "
                    f"(--model-arg {key}={_shown(value)} if it was one; --model-arg '' if it "
                    f"had none)")
    try:
        args.model_arg = [f'{k}={json.dumps(v)}' for k, v in overrides.items()] or None
    except (TypeError, ValueError):  # (a value the command line cannot give)
        args.model_arg = None
    if args.model_arg:
        print('resuming with the model options of the checkpoints (no --model-arg given): '
              + ', '.join(args.model_arg))


def _takes_option(name: str, key: str, value: Any) -> bool:
    r"""Whether preset :obj:`name` takes option :obj:`key` (with :obj:`value`), as the checks
    of a comparison's ``--model-arg``s read it (:func:`torch_mz.study.check_models`)."""
    from torch_mz.study.grid import check_models
    try:
        check_models([name], {key: value})
    except ValueError:
        return False
    return True


def _compare_command(args, out: str, task=None) -> str:
    r"""The ``torch-mz compare`` command that trains the comparison :obj:`args` describes, once
    every option is filled in (a resumed comparison's from its checkpoints; the dataset folder
    read, of the :obj:`task` loaded): what a resumed comparison's results record as their
    command."""
    argv = ['compare', '--task', args.task, '--models', args.models, '--seeds', str(args.seeds)]
    for flag, value in _comparison_options(args, task).items():  # (as comparison.json has them)
        if flag in _RECORDED_FLAGS and value is not None and value is not False:
            name = f"--{flag.replace('_', '-')}"
            argv += [name] if value is True else [name, str(value)]
    for item in args.task_arg or []:
        argv += ['--task-arg', item]
    for item in args.model_arg or []:
        argv += ['--model-arg', item]
    if args.device != 'auto':
        argv += ['--device', args.device]
    if not getattr(args, 'keep_freed_memory', True):
        argv.append('--no-keep-freed-memory')
    argv += ['--out', out]
    return 'torch-mz ' + ' '.join(shlex.quote(a) for a in argv)


def cmd_compare(args) -> int:
    _check_task(args.task)
    models = _model_specs(args.models, '--models')
    _check_not_empty(args)
    _check_numbers(args)  # as given, before anything is read or sized by them (--seeds)
    # "--model-arg ''": none (for a resumed comparison whose checkpoints cannot tell)
    none_given = args.model_arg is not None and not any(args.model_arg)
    if args.model_arg is not None and not all(args.model_arg) and (
            not args.resume or not none_given):
        raise CLIError("--model-arg '' (the comparison had no --model-arg) is for --resume, "
                       "alone: give options as KEY=VALUE")
    args.model_arg = [item for item in args.model_arg or [] if item] or None
    out = args.out if args.out is not None else os.path.join('runs', args.task, 'compare')
    if args.resume and args.overwrite:
        raise CLIError('--resume continues a comparison and --overwrite starts a new one: pass '
                       'one')
    _check_out_folder(out)
    if args.resume and not _compare_outputs(out):  # (a mistyped --out started a new one)
        raise CLIError(f"--resume: '{out}' holds no comparison to resume (no {_COMPARISON}, "
                       f"results or run folders): check --out, or leave --resume out to start "
                       f"a comparison")
    record = _comparison_record(out) if args.resume else None
    if args.seeds is None:  # a resumed comparison keeps its seeds (3 was taken silently before)
        args.seeds = _comparison_seeds(out, models, record) if args.resume else 3
    _check_seeds(args)
    folders = {model.spec: model.folder for model in models}

    def folder_of(spec, seed):
        return os.path.join(out, f'{folders[spec]}-seed{seed}')

    # a resumed comparison's options, where the command does not give them: those its
    # comparison.json records, else (an earlier torch-mz recorded none) its checkpoints'
    checkpoints: Dict[Tuple[str, int], str] = {}
    saved: Dict[Tuple[str, int], Dict[str, Any]] = {}  # their configuration and run_info
    without_flag: Dict[str, Any] = {}  # (comparison.json's options without a flag)
    if args.resume:
        from torch_mz.train import load_checkpoint
        checkpoints = _compare_checkpoints(out, models, args.seeds)
        for run, path in checkpoints.items():
            state = load_checkpoint(path)
            saved[run] = {key: state.get(key) for key in ('config', 'run_info')}
        options = (record or {}).get('options')
        options = options if isinstance(options, dict) else None
        if options is None and not checkpoints:  # (a comparison of every default started)
            raise CLIError(
                f"--resume: '{out}' holds no checkpoint to resume from (the comparison was "
                f"interrupted in its first epoch) and "
                + (f"its {_COMPARISON} does not record the comparison's options (an earlier "
                   f"torch-mz wrote it)" if record is not None else
                   f"no {_COMPARISON} records its options")
                + ': start it again with its options and --overwrite')
        if options is not None and 'model_arg' in options and (args.model_arg or none_given):
            where = os.path.join(out, _COMPARISON)
            recorded_args = _parse_kv(list(_recorded_items(options, 'model_arg', where)),
                                      f"'{where}' records a --model-arg")
            given_args = _parse_kv(args.model_arg, '--model-arg')
            if set(recorded_args) != set(given_args) or not all(
                    _same_value(recorded_args[k], given_args[k]) for k in given_args):
                shown = ' '.join(f'--model-arg {k}={_shown(v)}'
                                 for k, v in recorded_args.items()) or "no --model-arg"
                raise CLIError(f"--resume: '{where}' records the comparison's model options "
                               f"({shown}), which the command contradicts: leave --model-arg "
                               f"out to resume with them")
        if options is not None:
            without_flag = _take_comparison_options(args, options, os.path.join(
                out, _COMPARISON), model_args=not none_given)
        if not args.model_arg and not none_given and 'model_arg' not in (options or {}):
            _take_comparison_model_args(args, models, saved)
    state = next(iter(saved.values()), {})
    recorded = state.get('config')
    overrides = _parse_kv(args.model_arg, '--model-arg')
    _check_overrides(models, overrides, '--models')
    _take_data_options(args, state, 'the checkpoints')
    taken = _fill_training_options(args, recorded if isinstance(recorded, dict) else None)
    if without_flag and not saved:  # (no checkpoint carries them over)
        args.carried_config = without_flag
    if taken:
        print('resuming with the training options of the checkpoints (those not given): '
              + ', '.join(taken))
    _check_training_args(args)
    stale = _compare_outputs(out)
    # under torchrun the main process alone refuses, removes and writes the comparison's files
    # (a rank that came later refused the comparison.json the main one had just written, or
    # with --overwrite removed it); torchrun ends the others where it refuses
    main_process = _main_process()
    if stale and not args.overwrite and not args.resume and main_process:
        raise CLIError(f"'{out}' already holds the results of a comparison "
                       f"({', '.join(stale)}); pass --resume to continue it (finished runs "
                       f"are read back, interrupted ones continue from their last "
                       f"checkpoint), --overwrite to replace it (the old model folders are "
                       f"removed), or choose another --out")
    resume_from = {}
    if args.resume and stale:  # the runs there are this comparison's, or some would be lost
        other = [name for name in stale if name not in _COMPARE_RESULTS
                 and _comparison_run(name, models, args.seeds) is None]
        if other:
            raise CLIError(f"--resume: '{out}' holds runs that are not in this comparison "
                           f"({', '.join(other)}): pass the original --models and --seeds "
                           f"(more models may be added), or choose another --out")
    if args.resume:  # every run with a checkpoint continues from it, with the same settings
        from torch_mz.train.checkpoint import config_changes
        for (spec, seed), path in checkpoints.items():
            changed = config_changes(saved[(spec, seed)].get('config') or {},
                                      _config(args, seed, None).to_dict())
            if changed:
                raise CLIError(
                    f"--resume: '{path}' was trained with other settings ("
                    + ', '.join(f'{k} {a!r}, now {b!r}' for k, (a, b) in changed.items())
                    + '); a comparison gives every run the same: pass the original '
                    'options, or choose another --out')
            resume_from[(spec, seed)] = path
    _check_model_args(args, None, models)  # unknown options, before the data are loaded
    task = _load(args, progress=not args.no_progress)
    _keep_recorded_n_test(task, state)
    _check_model_args(args, task, models)
    from torch_mz.study import check_models
    try:  # what train_models checks first, here before an earlier comparison is removed
        check_models([m.spec for m in models], overrides, task=task)
    except ValueError as e:
        raise CLIError(str(e)) from None
    if resume_from:  # the same task, data and model as each checkpoint, before any training
        from torch_mz.study import run_info_for
        from torch_mz.train.checkpoint import describe_run, same_run
        current: Dict[str, Dict[str, Any]] = {}
        by_spec = {model.spec: model for model in models}
        for (spec, seed), ckpt in resume_from.items():
            if spec not in current:
                model = by_spec[spec]
                current[spec] = run_info_for(task, model.name, dict(model.options, **overrides))
            info = saved[(spec, seed)].get('run_info')
            if info is not None and not same_run(info, current[spec]):
                raise CLIError(f"--resume: '{ckpt}' was trained on {describe_run(info)}, "
                               f"not {describe_run(current[spec])}: pass the original options, "
                               f"or choose another --out")
    for name in stale if not args.resume and main_process else ():
        path = os.path.join(out, name)
        if os.path.isdir(path):
            _remove_run_files(path)
        else:
            os.unlink(path)
    if main_process:
        os.makedirs(out, exist_ok=True)
        from torch_mz._files import atomic_write
        # for a later --resume: the models, seeds and options (an interruption in the first
        # epoch left no other record)
        atomic_write(os.path.join(out, _COMPARISON),
                     lambda f: json.dump(dict(models=[m.spec for m in models], seeds=args.seeds,
                                              options=_comparison_options(args, task)), f),
                     binary=False)
    print(f'task {task.name}: {task.description} | train/val/test = '
          f'{len(task.train)}/{len(task.val)}/{len(task.test)} | d_in={task.in_channels} | '
          f'{args.epochs} epochs, lr {args.lr}, batch {args.batch_size}, seeds {args.seeds}')
    from torch_mz.study import (environment, plot_summary, replace_plot, summarize,
                                summary_markdown, train_models, write_results)
    key = 'r2' if task.task_type == 'regression' else 'accuracy'

    def progress(row):
        print(f"  {row['model']:10s} seed {row['seed']}: test {key} "
              f"{row['test'].get(key, math.nan):.4f} ({row['wall_time_s']:.0f} s)", flush=True)

    if resume_from:
        print(f'resuming {len(resume_from)} of {len(models) * args.seeds} runs from their '
              f'checkpoints in {out}')

    def config_for(spec, seed):
        return _config(args, seed, folder_of(spec, seed), resume_from.get((spec, seed)))

    start = time.time()
    rows = train_models(task, [m.spec for m in models], args.seeds, config_for,
                        overrides=overrides, on_result=progress)
    if not main_process:  # (the main process writes the results)
        return 0
    summary = summarize(rows, task.task_type)
    table = summary_markdown(summary, task.task_type)
    # a resumed comparison: the command that trains it as it ran, every option filled in (the
    # command as typed, e.g. '--out x --resume', would start a default comparison elsewhere)
    command = _compare_command(args, out, task) if args.resume else args.command_line
    resumed = dict(resumed_with=args.command_line) if args.resume else {}
    # total_minutes: this call's time; resumed, the runs' own recorded times (the epochs an
    # earlier call trained included) summed too, as a resumed study's write_report gives them
    run_minutes = dict(run_minutes=sum(r['wall_time_s'] for r in rows) / 60) if args.resume else {}
    payload = dict(task=task.name, task_info=task.info, description=task.description,
                   sizes=dict(train=len(task.train), val=len(task.val), test=len(task.test)),
                   command=command, **resumed,
                   args={k: v for k, v in vars(args).items() if k != 'func'},
                   environment=environment(), summary=summary, runs=rows,
                   total_minutes=(time.time() - start) / 60, **run_minutes)
    header = f'Command: `{command}`'
    if args.resume:  # (and the options without a flag the checkpoints' runs were trained with)
        from torch_mz.train import TrainConfig
        defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        carried = [f'{k}={v!r}' for k, v in getattr(args, 'carried_config', {}).items()
                   if v != defaults[k]]
        header += (f' (resumed with `{args.command_line}`'
                   + (f"; with no flag, from the checkpoints: {', '.join(carried)}"
                      if carried else '') + ')')
    write_results(out, 'results', payload,
                  f'# {task.name}: {task.description}\n\n{header}\n\n{table}')
    png = os.path.join(out, 'results.png')  # (not drawn: an earlier comparison's is removed)
    note = replace_plot(png, plot_summary, summary, task.task_type, png,
                        f'{task.name} ({len(task.train)} train sets, {args.epochs} epochs)')
    if note:
        print(note)
    print()
    print(table)
    print(f"results: {out}/results.md, results.json{'' if note else ', results.png'}")
    return 0


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
    import csv
    import io
    import warnings

    from torch_mz._files import atomic_write
    from torch_mz.inference import (OBJECT_OPTIONS, TestSplitWarning, _load_model,
                                    _load_test_split, prediction_columns)
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
    if 'set_size' in given:
        _check_set_size(given['set_size'], '--task-arg set_size')
    from torch_mz.tasks import is_synthetic
    if args.n_test is not None and is_synthetic(args.task):  # (the test sets alone are drawn)
        size = given.get('set_size', (recorded.get('args') or {}).get('set_size'))
        _check_synthetic_size(args.task, (0, 0, args.n_test),
                              size if isinstance(size, (list, tuple)) else None,
                              dict(recorded.get('args') or {}, **given))
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
                                n_train=args.n_train, n_val=args.n_val)
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
    model = _load_model(state, f'Checkpoint {path!r}', None)
    columns = dict(_set_ids(task.test), **prediction_columns(
        model, _in_dtype(task.test, model), task.task_type, batch_size=args.batch_size,
        device=resolve_device(args.device)))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator='\n')
    writer.writerow(columns)
    writer.writerows(zip(*columns.values()))
    atomic_write(args.out, lambda f: f.write(buf.getvalue()), binary=False)
    print(f"{len(task.test)} test sets of {task.name} ({', '.join(columns)}) -> {args.out}")
    return 0


def _in_dtype(dataset, model) -> Any:
    r"""The sets of :obj:`dataset` with their floating-point tensors in the precision of
    :obj:`model`'s weights where the two differ (a model trained in float64 through the Python
    API is rebuilt in float64, and the tasks give float32 sets: exact, float32 values are
    float64 values), else :obj:`dataset` itself."""
    import torch
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    first = dataset[0] if len(dataset) else None
    given = next((v.dtype for _, v in (first.items() if first is not None else [])
                  if torch.is_tensor(v) and v.is_floating_point()), None)
    if dtype is None or given is None or given == dtype:
        return dataset
    return [d.clone().apply(lambda t: t.to(dtype) if t.is_floating_point() else t)
            for d in dataset]


def _add_memory_flag(p: argparse.ArgumentParser) -> None:
    r"""``--no-keep-freed-memory`` after the command too (``torch-mz train ...
    --no-keep-freed-memory``); it was taken only before it."""
    p.add_argument('--no-keep-freed-memory', dest='keep_freed_memory', action='store_false',
                   default=argparse.SUPPRESS,
                   help="leave glibc's malloc as it is (see torch-mz --help)")


def build_parser() -> argparse.ArgumentParser:
    from torch_mz import __version__
    parser = argparse.ArgumentParser(  # the docstring's first line, without its RST markup
        prog='torch-mz', description=__doc__.split('\n')[0].replace('``', ''))
    parser.add_argument('--version', action='version', version=f'torch-mz {__version__}')
    parser.add_argument('--no-keep-freed-memory', dest='keep_freed_memory',
                        action='store_false',
                        help="leave glibc's malloc as it is; by default train, compare and "
                             'predict keep freed memory for reuse, which makes large CPU '
                             'batches faster for more resident memory '
                             '(torch_mz.runtime.keep_freed_memory); without it the model '
                             'presets encode large batches in groups of whole sets, whose '
                             'dropout masks are drawn group by group')
    sub = parser.add_subparsers(dest='command', required=True)
    p = sub.add_parser('tasks', help='list the tasks', allow_abbrev=False)
    p.set_defaults(func=cmd_tasks)
    p = sub.add_parser('models', help='list the model presets', allow_abbrev=False)
    p.add_argument('--in-channels', type=int, default=3,
                   help='input width the listed parameter counts are for (default: 3)')
    p.set_defaults(func=cmd_models)
    p = sub.add_parser('train', help='train one model on one task', allow_abbrev=False)
    _add_training_args(p)
    p.add_argument('--model', required=True,
                   help="model preset (see 'torch-mz models'), with options as name:key=value,...")
    p.add_argument('--seed', type=int,
                   help="training seed (default: 0; with --resume, the checkpoint's)")
    p.add_argument('--resume', help="checkpoint.pt to continue from (in its own folder unless "
                   "--out says otherwise)")
    _add_memory_flag(p)
    p.set_defaults(func=cmd_train)
    p = sub.add_parser('compare', help='train several models over several seeds and tabulate',
                       allow_abbrev=False)  # (--seed would be read as --seeds)
    _add_training_args(p)
    p.add_argument('--models', required=True,
                   help='comma-separated model specs, e.g. mz,hypernet:rank=4,dim=64')
    p.add_argument('--seeds', type=int, default=None,
                   help='training seeds per model: 0, 1, ... (default: 3; with --resume, '
                        'those of the comparison resumed)')
    p.add_argument('--resume', action='store_true',
                   help='continue an interrupted comparison in --out with the same options: '
                   'finished runs are read back, the others continue from their last '
                   "checkpoint (--model-arg '' says it had no --model-arg)")
    _add_memory_flag(p)
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser('predict', help="write a trained model's predictions on a task's test "
                       'split to CSV', allow_abbrev=False)
    p.add_argument('checkpoint', help='best.pt or checkpoint.pt of a training run')
    p.add_argument('--task', help='the task the model was trained on (default: the one the '
                   'checkpoint records)')
    p.add_argument('--task-arg', action='append', metavar='KEY=VALUE',
                   help='task option (default: those the checkpoint records; repeatable)')
    p.add_argument('--root', type=_data_root,
                   help='folder of the real dataset itself, e.g. datasets/QM9')
    p.add_argument('--n-test', type=int,
                   help="test sets (default: the training run's; of QM9, the first N of the "
                   "training run's test split; of ModelNet40 / ScanObjectNN, N spread evenly "
                   "over the official test files)")
    p.add_argument('--data-seed', type=int,
                   help='seed of the synthetic data / real split (default: the one the '
                   'checkpoint records; 0 for a checkpoint that records none)')
    p.add_argument('--n-train', type=int, help="for a checkpoint that records no split: the "
                   "training run's --n-train (a real dataset's test split depends on it)")
    p.add_argument('--n-val', type=int, help="for a checkpoint that records no split: the "
                   "training run's --n-val")
    p.add_argument('--batch-size', type=int, default=128,
                   help='sets per batch of the forward passes (default: 128; the predictions '
                   'depend on it only up to float rounding)')
    p.add_argument('--device', default='auto', help="'auto', 'cpu', 'cuda' or 'cuda:N'")
    p.add_argument('--out', required=True, help="CSV file: one row per set, columns set (the "
                   "set's index in its dataset), gdb_idx (QM9), prediction (prediction_0, ... "
                   "for several targets; the class for classification), target, and ihw for "
                   "models that return one")
    p.add_argument('--overwrite', action='store_true', help='replace an existing --out')
    _add_memory_flag(p)
    p.set_defaults(func=cmd_predict)
    return parser


def _debug() -> bool:
    r"""Whether ``TORCH_MZ_DEBUG`` asks for tracebacks instead of one-line errors."""
    return os.environ.get('TORCH_MZ_DEBUG', '').strip().lower() not in ('', '0', 'false', 'off',
                                                                         'no')


def _main_process() -> bool:
    r"""Whether this process is the main one of its run (rank 0 under ``torchrun``)."""
    from torch_mz.train.runtime import DistInfo
    return DistInfo.from_env().is_main


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.command_line = 'torch-mz ' + ' '.join(shlex.quote(a) for a in argv)
    if args.keep_freed_memory and args.command in ('train', 'compare', 'predict'):
        from torch_mz.runtime import keep_freed_memory
        keep_freed_memory()  # this process is ours; False (no change) where not glibc
    from torch_mz.train import CheckpointError
    # under torchrun, the main process prints the results; the others train silently (their
    # errors still go to stderr)
    quiet = args.command in ('train', 'compare') and not _main_process()
    try:
        if quiet:
            with open(os.devnull, 'w') as sink, contextlib.redirect_stdout(sink):
                return args.func(args)
        return args.func(args)
    except (CLIError, CheckpointError, ValueError, OSError, ImportError,
            FloatingPointError) as e:
        if _debug():
            raise  # (TORCH_MZ_DEBUG=1: the traceback, for a bug report)
        print(f'torch-mz: error: {e}', file=sys.stderr)
        return EXIT_USAGE
    except (MemoryError, RuntimeError) as e:
        # sizes that do not fit in memory (a width, a set size or a batch the allocator
        # refuses: numpy's MemoryError, torch's RuntimeError / OutOfMemoryError) end as the
        # other impossible sizes do; any other RuntimeError is a bug, with its traceback
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, RuntimeError) and not any(
                m in text.lower() for m in ("can't allocate memory", 'out of memory')):
            raise
        if _debug():
            raise
        print(f'torch-mz: error: out of memory ({text}): the sizes asked for (model width, '
              f'set sizes, batch size, number of sets) do not fit; give smaller ones',
              file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print('torch-mz: interrupted', file=sys.stderr)
        return 130


if __name__ == '__main__':
    sys.exit(main())
