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
traceback. Ctrl-C ends a command with ``torch-mz: interrupted`` and exit status 130, SIGTERM (a
cluster's time limit or preemption) with ``torch-mz: terminated (SIGTERM)`` and 143; either
leaves the last finished checkpoint to ``--resume`` from, and no temporary file, and a stopped
``train`` or ``compare`` says in a second line the command that goes on (the same with
``--resume``) once its run has begun. A reader that stops reading the output
(``torch-mz models | head -1``) ends the command without a word, with exit status 141, as a shell
reports a command that SIGPIPE ended.
"""
import argparse
import contextlib
import os
import shlex
import signal
import sys
import threading
from typing import Iterator, NoReturn, Optional, Sequence

from torch_mz.cli import _common
from torch_mz.cli._common import CLIError, _add_training_args, _data_root, _user_path
from torch_mz.cli.compare import cmd_compare
from torch_mz.cli.predict import cmd_predict
from torch_mz.cli.train import cmd_train

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143, as a shell reports a process SIGTERM ended
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of the output closed it (| head -1)


class _Terminated(KeyboardInterrupt):
    r"""SIGTERM (a cluster's time limit or preemption, ``kill``), raised where the command is,
    as Ctrl-C's :class:`KeyboardInterrupt` (:func:`_sigterm_as_interrupt`)."""


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    r"""Within the block SIGTERM ends the command as Ctrl-C does, by an exception (a
    :class:`_Terminated`): the temporary file of a checkpoint or log being written is removed
    (it was left in the run's folder; the last complete file stays, as it did) and the command
    says so in one line (it ended without a word). Not in a forked child (it dies as it would
    have), nor outside the main thread or under ``torchrun``, whose agent ends the other
    processes with SIGTERM when one fails (one waiting in a collective would not take it),
    nor where SIGTERM is ignored (``trap '' TERM``, a wrapper that handles it itself: it stays
    ignored, as Python leaves an ignored Ctrl-C)."""
    from torch_mz.train.runtime import DistInfo
    if (threading.current_thread() is not threading.main_thread()
            or DistInfo.from_env().is_distributed
            or signal.getsignal(signal.SIGTERM) == signal.SIG_IGN):
        yield
        return
    pid = os.getpid()

    def handler(signum, frame):
        if os.getpid() != pid:  # a forked child (a worker): as without the handler
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise _Terminated()
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# The demo: quadratic-TDOF task (TDOF 8) with one MZ layer against a 4-layer standard Set
# Transformer, EGNN and Deep Sets; every model gets the same data, budget, schedule and
# normalisation.
DEMO_ARGS = ['compare', '--task', 'quadratic-tdof', '--models', 'mz-1l,st-4l,egnn,deepsets',
             '--seeds', '2', '--epochs', '10', '--warmup-epochs', '1', '--lr', '1e-3',
             '--batch-size', '64', '--n-train', '640', '--n-val', '160', '--n-test', '320',
             '--task-arg', 'd=16', '--task-arg', 'tdof=8', '--out', 'runs/demo', '--overwrite']


def cmd_tasks(args) -> int:
    from torch_mz.tasks import list_tasks
    tasks = list_tasks()
    width = max(map(len, tasks))
    for name, desc in tasks.items():
        print(f'{name:{width}s}  {desc}')
    return 0


def cmd_models(args) -> int:
    from torch_mz.models import build_model, count_parameters, list_models
    from torch_mz.models.registry import EGNN_PRESETS
    if args.in_channels < 1:
        raise CLIError(f'--in-channels must be at least 1 (got {args.in_channels})')
    models = list_models()
    width = max(map(len, models))
    print(f"{'model':{width}s}  {'params*':>8s}  description")
    for name, desc in models.items():
        try:
            n = count_parameters(build_model(name, args.in_channels, 1,
                                             pos_dim=(args.in_channels
                                                      if name in EGNN_PRESETS else None)))
        except (MemoryError, RuntimeError, OverflowError, TypeError) as e:
            if not _common._too_large(e):
                raise
            raise CLIError(f'--in-channels {args.in_channels} is too large for a model '
                           f'({_common._first_line(e)})') from None
        print(f'{name:{width}s}  {n:8,d}  {desc}')
    print(f'* for {args.in_channels} input channels and one output')
    return 0


def _add_memory_flag(p: argparse.ArgumentParser) -> None:
    r"""``--no-keep-freed-memory`` after the command too (``torch-mz train ...
    --no-keep-freed-memory``); it was taken only before it."""
    p.add_argument('--no-keep-freed-memory', dest='keep_freed_memory', action='store_false',
                   default=argparse.SUPPRESS,
                   help="leave glibc's malloc as it is (see torch-mz --help)")


class _Parser(argparse.ArgumentParser):
    r"""The parser of ``torch-mz`` and of its commands (the subparsers take its class): its errors
    (a number that does not read, an unknown or missing flag) end as the commands' own do, in
    one line ``torch-mz: error: ...`` and exit status 2, a command's naming its help (argparse
    printed its usage lines first, and named the command: ``torch-mz train: error: ...``). An
    unknown flag is refused by the top parser, which does not know the command."""
    def error(self, message: str) -> NoReturn:
        hint = f" (see '{self.prog} --help')" if self.prog != 'torch-mz' else ''
        self.exit(EXIT_USAGE, f'torch-mz: error: {message}{hint}\n')


def build_parser() -> argparse.ArgumentParser:
    from torch_mz import __version__
    parser = _Parser(  # the docstring's first line, without its RST markup (none under
        # python -OO, which strips docstrings)
        prog='torch-mz', description=(__doc__ or '').split('\n')[0].replace('``', '') or None)
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
                   help="training seed (default: 0; with --resume, the checkpoint's, and "
                   "no other)")
    p.add_argument('--resume', type=_user_path, help="checkpoint.pt to continue from (in its "
                   "own folder unless --out says otherwise); a finished run takes no other "
                   "training options than its own")
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
    p.add_argument('checkpoint', type=_user_path,
                   help='best.pt (the model of the best validation epoch) or checkpoint.pt (of '
                   'the last epoch) of a training run')
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
    p.add_argument('--out', required=True, type=_user_path,
                   help="CSV file: one row per set, columns set (the set's index in its "
                   "dataset), gdb_idx (QM9), prediction (prediction_0, ... "
                   "for several targets; the class for classification), target, and ihw for "
                   "models that return one; a task that names its targets (QM9) names the "
                   "columns by them: prediction_mu, target_mu, ... (numbered where "
                   "--task-arg target asks for other targets than the model's)")
    p.add_argument('--overwrite', action='store_true', help='replace an existing --out')
    p.add_argument('--no-progress', action='store_true', help='no progress bars')
    _add_memory_flag(p)
    p.set_defaults(func=cmd_predict)
    return parser


def _debug() -> bool:
    r"""Whether ``TORCH_MZ_DEBUG`` asks for tracebacks instead of one-line errors."""
    return os.environ.get('TORCH_MZ_DEBUG', '').strip().lower() not in ('', '0', 'false', 'off',
                                                                         'no')


def _reader_gone() -> bool:
    r"""Whether the reader of standard output has closed it (``| head -1`` has exited): a
    pipe whose reading end is closed polls as an error; ``True`` where that cannot be asked
    (no :func:`select.poll`), ``False`` where standard output is no file descriptor (a stream
    a caller put there, which no reader closed: the broken pipe was another's)."""
    import select
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    try:
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):
        return True


def _discard_output() -> None:
    r"""Sends what standard output still buffers to the null device, so that Python's flush
    at exit does not report again a write that failed (as the Python docs advise in their note
    on SIGPIPE)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        status = _run(argv)
    except BrokenPipeError as e:
        if not _reader_gone():  # (another pipe of the command's: an error as any OSError)
            if _debug():
                raise
            print(f'torch-mz: error: {e}', file=sys.stderr)
            return EXIT_USAGE
        _discard_output()
        return EXIT_BROKEN_PIPE
    try:
        sys.stdout.flush()  # (a closed pipe shows here, not in Python's flush at exit)
    except BrokenPipeError:
        _discard_output()
        return EXIT_BROKEN_PIPE
    except OSError as e:  # (output redirected to a file on a full disk: an error, as _run's)
        if _debug():
            raise
        _discard_output()
        print(f'torch-mz: error: {e}', file=sys.stderr)
        return EXIT_USAGE
    return status


def _run(argv: Optional[Sequence[str]]) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.command_line = 'torch-mz ' + ' '.join(shlex.quote(a) for a in argv)
    # (a resumed run's command turns it on once it has read whether the run was trained with
    # it: _common._keep_memory_as_recorded)
    if (args.keep_freed_memory and args.command in ('train', 'compare', 'predict')
            and not getattr(args, 'resume', None)):
        from torch_mz.runtime import keep_freed_memory
        keep_freed_memory()  # this process is ours; False (no change) where not glibc
    from torch_mz.train import CheckpointError
    # under torchrun, the main process prints the results; the others train silently (their
    # errors still go to stderr)
    quiet = args.command in ('train', 'compare') and not _common._main_process()
    try:
        with _sigterm_as_interrupt():
            if quiet:
                with open(os.devnull, 'w') as sink, contextlib.redirect_stdout(sink):
                    return args.func(args)
            return args.func(args)
    except BrokenPipeError:
        raise  # (main: whether the reader of the output closed it)
    except (CLIError, CheckpointError, ValueError, OSError, ImportError,
            FloatingPointError) as e:
        if _debug():
            raise  # (TORCH_MZ_DEBUG=1: the traceback, for a bug report)
        print(f'torch-mz: error: {e}', file=sys.stderr)
        return EXIT_USAGE
    except (MemoryError, RuntimeError, OverflowError, TypeError) as e:
        # sizes that do not fit in memory (a width, a set size or a batch the allocator
        # refuses: numpy's MemoryError, torch's RuntimeError / OutOfMemoryError) or in a
        # tensor's sizes (2**62 or 2**70 channels) end as the other impossible sizes do; any
        # other RuntimeError or TypeError is a bug, with its traceback
        if not _common._too_large(e) or _debug():
            raise
        kind = 'too large' if _common._too_large(e, memory=False) else 'out of memory'
        print(f'torch-mz: error: {kind} ({_common._first_line(e)}): the sizes asked for (model '
              f'width, set sizes, batch size, number of sets) do not fit; give smaller ones',
              file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:  # (and _Terminated, SIGTERM's)
        print('torch-mz: terminated (SIGTERM)' if isinstance(e, _Terminated) else
              'torch-mz: interrupted', file=sys.stderr)
        note = _common._go_on_note(args)  # (the command that goes on, where there is one)
        if note is not None:
            print(note, file=sys.stderr)
        return EXIT_TERMINATED if isinstance(e, _Terminated) else EXIT_INTERRUPTED
