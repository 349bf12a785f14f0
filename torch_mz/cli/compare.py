r"""``torch-mz compare``: train several models over several seeds on one task and tabulate
them; ``--resume`` continues an interrupted comparison with the options it recorded."""
import dataclasses
import json
import math
import os
import re
import shlex
import time
from typing import Any, Dict, List, Optional, Tuple

from torch_mz.cli import _common
from torch_mz.cli._common import (CARRIED_CONFIG, CLIError, ModelSpec, _check_model_args,
                                  _check_not_empty, _check_numbers, _check_out_folder,
                                  _check_overrides, _check_seeds, _check_task, _check_training_args,
                                  _config, _default_warmup, _fill_training_options,
                                  _keep_recorded_n_test, _model_specs, _parse_kv, _run_files,
                                  _same_value, _take_data_options)


_COMPARE_RESULTS = ('results.json', 'results.md', 'results.png', 'comparison.json')
_COMPARISON = 'comparison.json'  # the models, --seeds and options a comparison started with
_RUN_FOLDER = re.compile(r'.+-seed\d+$')  # a compare run's <model>-seed<k> folders
_SEED_FOLDER = re.compile(r'(.+)-seed(\d+)$')  # (the same, its model's folder and seed)


def _compare_outputs(out: str) -> List[str]:
    r"""What an earlier ``compare`` left in :obj:`out`: its results files and model folders."""
    if not os.path.isdir(out):
        return []
    found = [name for name in _COMPARE_RESULTS if os.path.isfile(os.path.join(out, name))]
    found += sorted(name for name in os.listdir(out) if _RUN_FOLDER.match(name)
                    and os.path.isdir(os.path.join(out, name))
                    and _run_files(os.path.join(out, name)))
    return found


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
                carried_config=dict(getattr(args, 'carried_config', {})),
                keep_freed_memory=bool(getattr(args, 'keep_freed_memory', True)))


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
    # a comparison started before a repeated key was refused records every item given, and its
    # runs took the last of each key: that one alone (the record was refused as repeating it,
    # and the comparison could not be resumed)
    from torch_mz.options import parse_key_values
    last: Dict[Any, int] = {}
    for i, item in enumerate(value):
        try:
            last[next(iter(parse_key_values([item])))] = i
        except ValueError:  # (not KEY=VALUE: refused where it is read, naming the record)
            last[i] = i
    return [item for i, item in enumerate(value) if i in set(last.values())]


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


def _units_note(task_type: str, normalized: bool, targets: int = 1) -> str:
    r"""The line below a regression comparison's table that gives its figures' units: the
    table's ``mse`` and ``mae`` are in the target's (with several :obj:`targets` the means
    over them, each target's in its own units), and the ``loss`` beside them in
    ``results.json`` (each run's ``val`` and ``test``) is the training criterion, on
    standardised targets where :obj:`normalized` (read as the mse, it was the same error in
    other units); ``''`` for classification (``loss``: the cross-entropy)."""
    if task_type != 'regression':
        return ''
    loss = ('the MSE of the standardised targets (not the mse)' if normalized else
            'the mse, in the same units')
    units = ("in the target's units" if targets <= 1 else
             f"the means over the {targets} targets, each target's in its own units")
    return (f"\nTest mse and mae are {units} (mse squared); each run's `loss` in "
            f"results.json (val and test) is the training criterion, {loss}.\n")


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
    # the folder held from here to the end (the main process): a second comparison into it at
    # the same time (e.g. with --overwrite, which removed the runs in progress) is refused
    with _common._holding_out_folder(out):
        return _compare_into(args, out, models, none_given)


def _compare_into(args, out: str, models: List[ModelSpec], none_given: bool) -> int:
    r""":func:`cmd_compare` once its options are read and its folder :obj:`out` is held
    (:obj:`none_given`: ``--model-arg ''`` was given)."""
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
            saved[run] = {key: state.get(key) for key in ('config', 'run_info',
                                                          'freed_memory_kept')}
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
        # kept freed memory as the comparison ran: as comparison.json records it, else (an
        # earlier torch-mz recorded no such option) as its checkpoints agree
        kept = {s['freed_memory_kept'] for s in saved.values()
                if isinstance(s.get('freed_memory_kept'), bool)}
        recorded_memory = (options.get('keep_freed_memory') if options is not None
                           and 'keep_freed_memory' in options
                           else kept.pop() if len(kept) == 1 else None)
        _common._keep_memory_as_recorded(args, recorded_memory, 'the comparison')
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
    main_process = _common._main_process()
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
    task = _common._load(args, progress=not args.no_progress)
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
            _common._remove_run_files(path)
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
        args.run_folder = out  # (stopped from here, the command says how to go on: main)
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
    table = summary_markdown(summary, task.task_type) + _units_note(
        task.task_type, not args.no_normalize, task.out_channels)
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
                   args={k: v for k, v in vars(args).items() if k not in ('func', 'run_folder')},
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
    from torch_mz._files import finite_or_none
    # standard JSON: a NaN figure (the test R^2 of a model that predicted inf) as null
    write_results(out, 'results', finite_or_none(payload),
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
