r"""``torch-mz train``: train one model on one task, or continue a run from its checkpoint."""
import json
import os
import shlex
from typing import Any, Dict, List

from torch_mz.cli import _common
from torch_mz.cli._common import (CLIError, ModelSpec, _check_checkpoint_file, _check_model_args,
                                  _check_not_empty, _check_numbers, _check_out_folder,
                                  _check_overrides, _check_task, _check_training_args,
                                  _fill_training_options, _keep_recorded_n_test, _model_specs,
                                  _parse_kv, _run_files, _same_path, _take_data_options)


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


#: The command line's flag of each training setting (``--no-normalize``'s is refused by the
#: trainer for every resume, with its own advice).
_FLAGS = {'seed': '--seed', 'epochs': '--epochs', 'batch_size': '--batch-size', 'lr': '--lr',
          'weight_decay': '--weight-decay', 'warmup_epochs': '--warmup-epochs',
          'grad_clip': '--grad-clip', 'patience': '--patience'}


def _refuse_finished_run_changes(args, state: Dict[str, Any]) -> None:
    r"""A resume of a finished run (no epoch left to train at the given ``--epochs`` and
    ``--patience``) with training options other than its checkpoint :obj:`state` records,
    refused before any data are loaded, as another ``--seed`` is: it trained nothing, yet
    wrote its ``result.json`` and ``best.pt`` anew under the options given (the trainer's own
    check, :func:`~torch_mz.train.checkpoint.finished_run_changes`, came after the data load)."""
    from torch_mz.train.checkpoint import (_finished_how, _unfinished_as_trained,
                                           finished_run_changes)
    _check_training_args(args)  # (TrainConfig's own checks, named: before the config is made)
    current = _common._config(args, args.seed, None, args.resume).to_dict()
    changed = finished_run_changes(state, current) or {}
    changed = {k: v for k, v in changed.items() if k in _FLAGS}
    if not changed:
        return
    how, needs = _finished_how(state, current)

    def shown(key: str, value: Any) -> str:  # (off, None, is 0 on the command line)
        return f'{_FLAGS[key]} {0 if value is None else value}'
    given = ', '.join(shown(k, b) for k, (_, b) in changed.items())
    own = ', '.join(shown(k, a) for k, (a, _) in changed.items())
    more = ' and '.join(f'{_FLAGS[k]} {v} or more' for k, v in needs.items())
    # (the changes that do not end it, which a run that trains on takes: not the --epochs or
    # --patience that must be raised)
    rest = ', '.join(shown(k, b) for k, (_, b) in changed.items() if k not in needs)
    ending = ', '.join(shown(k, b) for k, (_, b) in changed.items() if k in needs) or given
    them = 'them' if len(changed) > 1 else 'it'
    unfinished = _unfinished_as_trained(state)
    run = (f"the finished run of checkpoint '{args.resume}' was trained with {own}, and {how}"
           if unfinished is None else
           f"the run of checkpoint '{args.resume}' was trained with {own} and is not finished "
           f"({unfinished[0]} of its {unfinished[1]} epochs run): {ending} would end it at once")
    raise CLIError(f"{given}: {run}: resumed so, it would train nothing, yet record {given} "
                   f"in its result.json and best.pt; leave {them} out (or pass {own}) to "
                   f"resume it, pass {more} to train on" + (f' with {rest}' if rest else '')
                   + ", or start a new run without --resume")


def _figures_with_units(test: Dict[str, float], task_type: str, normalized: bool,
                        targets: int = 1) -> str:
    r"""The test figures :obj:`test` of a run as ``train`` prints them, a regression's with
    their units: ``loss`` (the training criterion) on standardised targets where
    :obj:`normalized`, ``mse``, ``mae`` and ``r2`` in the target's units (``loss 0.53, mse
    1.77`` read as two measures of one error); with several :obj:`targets` each the mean over
    them, each target's in its own units (QM9's mu and alpha: no one unit)."""
    def shown(items) -> str:
        return ', '.join(f'{k} {v:.4g}' for k, v in items)
    if task_type != 'regression':
        return shown(test.items())
    units = 'in target units' + (f', each the mean over the {targets} targets'
                                 if targets > 1 else '')
    if not normalized or 'loss' not in test:
        return shown(test.items()) + f' ({units})'
    rest = [(k, v) for k, v in test.items() if k != 'loss']
    return (f"loss {test['loss']:.4g} (on standardised targets)"
            + (f'; {units}: {shown(rest)}' if rest else ''))


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
        if state.get('kind') != 'train':  # (best.pt: the trainer refused it once the data were
            # loaded, QM9's minutes of processing, after the options had been said to be taken)
            from torch_mz.train import LAST_CHECKPOINT
            # the run's checkpoint.pt: beside the file a link names ('latest.pt' ->
            # 'run/best.pt' named one beside the link, another run's or none), quoted as a shell
            # reads it (a folder with a space was two arguments)
            folder = os.path.dirname(args.resume)
            if not _same_path(folder or '.', os.path.dirname(os.path.realpath(args.resume))):
                folder = os.path.dirname(os.path.realpath(args.resume))
            last = os.path.join(folder, LAST_CHECKPOINT)
            raise CLIError(f"--resume '{args.resume}' holds model weights only (kind "
                           f"{state.get('kind')!r}), not a run to continue: "
                           + (f'pass --resume {shlex.quote(last)}' if os.path.isfile(last) else
                              f"resume from a run's {LAST_CHECKPOINT}"))
        recorded = state.get('config')
        seed = recorded.get('seed') if isinstance(recorded, dict) else None
        if (args.seed is not None and isinstance(seed, int) and not isinstance(seed, bool)
                and args.seed != seed):  # (a finished run trained nothing and recorded the
            # other seed in result.json and best.pt; the data seed, too, is refused)
            raise CLIError(f"--seed {args.seed} is not the seed {seed} the run of checkpoint "
                           f"'{args.resume}' was trained with: leave --seed out (or pass "
                           f"--seed {seed}) to resume it, or start a new run without --resume")
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
        _common._keep_memory_as_recorded(args, state.get('freed_memory_kept'), 'the checkpoint')
    _check_overrides(models, _parse_kv(args.model_arg, '--model-arg'), '--model')
    _take_data_options(args, state, 'the checkpoint')
    taken = _fill_training_options(args, recorded if isinstance(recorded, dict) else None)
    if any(t.startswith('warmup_epochs=') for t in taken) and args.warmup_epochs > args.epochs:
        raise CLIError(f"--epochs {args.epochs} is fewer than the checkpoint's warm-up of "
                       f"{args.warmup_epochs} epochs: pass --warmup-epochs too")
    if epochs_run is not None and args.epochs < epochs_run:
        # (an interrupted run's: as many as it has run would end it without its own epochs,
        # refused as a finished run's other settings are)
        own = recorded.get('epochs') if isinstance(recorded, dict) else None
        least = epochs_run if own in (None, epochs_run) else epochs_run + 1
        raise CLIError(f"--epochs {args.epochs} is fewer than the {epochs_run} epochs the "
                       f"checkpoint '{args.resume}' has run: pass --epochs {least} or more"
                       + ('' if least == epochs_run else
                          f", or leave --epochs out to resume it with its own {own}"))
    if args.resume is not None:  # (before the options taken are said)
        _refuse_finished_run_changes(args, state)
    if taken:
        print('resuming with the training options of the checkpoint (those not given): '
              + ', '.join(taken))
    homes: List[str] = []  # the checkpoint's folders: as named, and first the linked file's
    if args.resume is not None:
        homes = [os.path.dirname(args.resume) or '.']
        if os.path.islink(args.resume):  # ('latest.pt' -> 'run/checkpoint.pt': the run went on
            # beside the link, away from its logs and best.pt, which stayed as they were)
            homes.insert(0, os.path.dirname(os.path.realpath(args.resume)))
    if args.out is not None:  # ('' is refused below: it was taken for no --out)
        out = args.out
    elif args.resume is not None:  # the run goes on where it was (its logs, best.pt, result)
        out = homes[0]
    else:
        out = os.path.join('runs', args.task, f'{model.folder}-seed{args.seed}')
    _check_out_folder(out)
    _check_training_args(args)
    # the folder held from here to the end (the main process): a second command into it at
    # the same time (e.g. with --overwrite, which removed the files of the run in progress) is
    # refused, not left to write its files between the other's
    with _common._holding_out_folder(out):
        existing = _run_files(out)
        resumes_here = any(_same_path(home, out) for home in homes)
        if existing and not args.overwrite and not resumes_here:
            last = os.path.join(out, 'checkpoint.pt')
            hint = ('choose another --out' if args.resume is not None else
                    f"pass --overwrite to replace it, or --resume {shlex.quote(last)} to "
                    f"continue it"
                    if os.path.isfile(last) else
                    "it has no checkpoint.pt to resume from (interrupted in its first epoch); "
                    "pass --overwrite to start it again")
            raise CLIError(f"'{out}' already holds a run ({', '.join(existing)}); {hint}")
        _check_model_args(args, None, models)  # unknown options, before the data are loaded
        task = _common._load(args, progress=not args.no_progress)
        _keep_recorded_n_test(task, state)
        _check_model_args(args, task, models)
        print(f'task {task.name}: {task.description} | train/val/test = '
              f'{len(task.train)}/{len(task.val)}/{len(task.test)} | d_in={task.in_channels}')
        # (under torchrun every rank removed them: a later one could remove what the main one
        # had written); the folder stays, held
        if args.overwrite and _common._main_process():
            _common._remove_run_files(out, keep_folder=True)
        args.run_folder = out  # (stopped from here, the command says how to go on: main)
        row = _common._run(args, task, model, args.seed, out, args.resume)
        metrics = _figures_with_units(row['test'], task.task_type, not args.no_normalize,
                                      task.out_channels)
        print(f"{args.model} ({row['params']:,} parameters): best epoch {row['best_epoch']}, "
              f"test {metrics}")
        print(f'logs and checkpoints in {out}')
        return 0
