r"""Resuming an interrupted study: every finished run's record kept as one JSON file, so that a
study stopped after hours (a closed session, a crash, Ctrl-C) trains only the runs it had not
finished when it is started again. Library code: nothing here prints (:func:`interruptible`
and :func:`interrupted_note` give the script the line to print on Ctrl-C)."""
import argparse
import hashlib
import json
import os
import re
import shlex
import sys
import warnings
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

import numpy as np

from torch_mz._files import finite_or_none, nan_for_none
from torch_mz.study.report import write_json
from torch_mz.train import TrainConfig
from torch_mz.train.checkpoint import RESUMABLE_CONFIG_CHANGES

__all__ = ['RunStore', 'EXIT_INTERRUPTED', 'Interruption', 'interruptible', 'interrupted_note']

_FORMAT = 1
#: Training settings that change no figure of a finished run (besides
#: :data:`~torch_mz.train.checkpoint.RESUMABLE_CONFIG_CHANGES`): a stored run is read back
#: whatever they were.
NO_RESULT_SETTINGS = ('checkpoint_every', 'eval_batch_size')
#: The exit status of a study stopped by Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130


def _json_value(value: Any) -> Any:
    # what json.dumps cannot write itself: a NumPy number or array as Python's (it was written
    # as its text, so that a resumed record held '2' where a fresh one held 2, and a label
    # np.int64(3) named the file of the label '3'); anything else is refused
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()  # (a NumPy scalar's tolist() is its item())
    if isinstance(value, os.PathLike):  # a path as its text, as it was kept before
        return os.fspath(value)
    raise TypeError(f"a run's key or record holds {value!r} ({type(value).__qualname__}), "
                    f"which a run file cannot keep: give labels, data descriptions and options "
                    f"as JSON values (str, int, float, bool, None, lists, dicts), NumPy numbers "
                    f"and arrays being converted")


def _plain(value: Any, sort_keys: bool = True) -> Any:
    # JSON's own values, as a file read back holds them (tuples as lists, keys as strings); the
    # JSON values a key held before NumPy values were converted give the same text, so the run
    # files of earlier calls are still found. A record keeps its keys' order (sort_keys=False):
    # sorted, a resumed study's tables listed layers, methods and metrics in another order
    return json.loads(json.dumps(value, sort_keys=sort_keys, default=_json_value))


def _canonical(value: Any) -> Any:
    # a float with an integral value as that integer, so that options written 0 and 0.0 (equal,
    # and equal in the identity a file is checked against) name the same file
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _slug(text: str) -> str:
    return re.sub(r'[^A-Za-z0-9_.=+-]+', '_', text)[:60]


class RunStore:
    r"""The finished runs of a study, one JSON file per run in :obj:`folder`
    (``<cell>--<model>--seed<k>-<hash>.json``), given to :func:`~torch_mz.study.run_grid` or
    :func:`~torch_mz.study.train_models` as ``store=``: a run whose file is there is read
    instead of trained, a run trained is written as soon as it finishes.

    A file is used only for the same run: the same data (task, its options and set counts,
    or the caller's description of its data), model spec and options, seed, and training
    configuration, all but the settings a finished run is read back whatever they were:
    ``device``, ``progress``, ``out_dir``, ``checkpoint_every``, ``resume``, ``overwrite``,
    ``eval_batch_size`` and ``num_workers`` (a run is as valid trained on another device or
    with other loader workers, though its random draws may differ there). A run asked for with
    anything else is trained again and its file replaced, so a store never mixes runs of two
    configurations into one table.

    Args:
        folder (str): Where the files are kept (created when the first run finishes).
    """

    def __init__(self, folder: str):
        self.folder = folder

    @classmethod
    def for_study(cls, out: str, resume: bool, overwrite: bool = False) -> 'RunStore':
        r"""The store of a study writing its results to :obj:`out`: ``<out>/runs``. With
        :obj:`resume` the runs kept there are read back where they match. Without it, a folder
        that holds runs of an earlier call is refused (:class:`FileExistsError`, before anything
        trains: re-running the command of an interrupted call had removed the runs it finished)
        unless :obj:`overwrite` is set, which removes them first, so that a later ``--resume``
        never mixes runs of an older code version into this run's table. The folder is created
        here, so that an :obj:`out` that cannot hold it (a file) raises its :class:`OSError`
        before any run trains."""
        from torch_mz.study.report import check_out_folder
        store = cls(os.path.join(out, 'runs'))
        problem = check_out_folder(out)  # an OSError here, before anything trains
        if problem is None and os.path.exists(store.folder) and not os.path.isdir(store.folder):
            problem = f"the runs' folder '{store.folder}' is a file"
        if problem is None:
            try:
                os.makedirs(store.folder, exist_ok=True)
            except OSError as e:
                problem = f"cannot make the runs' folder '{store.folder}': {e.strerror or e}"
        if problem:
            raise OSError(f"cannot write the study's results: {problem}")
        if not resume:
            kept = store.kept_runs()
            if kept and not overwrite:
                raise FileExistsError(
                    f"'{store.folder}' holds {kept} run(s) of an earlier call with this output "
                    f"folder: pass --resume to keep those that match (an interrupted call goes "
                    f"on where it stopped), or --overwrite to remove them and train every run "
                    f"again")
            store.clear()
        return store

    def _run_files(self) -> List[str]:
        r"""The paths of the runs kept in the folder (its JSON files)."""
        if not os.path.isdir(self.folder):
            return []
        paths = (os.path.join(self.folder, name) for name in os.listdir(self.folder))
        return [p for p in paths if p.endswith('.json') and os.path.isfile(p)]

    def kept_runs(self) -> int:
        r"""The number of runs kept in the folder."""
        return len(self._run_files())

    def clear(self) -> None:
        r"""Removes every run kept in the folder (its JSON files; nothing else)."""
        for path in self._run_files():
            os.remove(path)

    @staticmethod
    def _identity(key: Mapping[str, Any], config: TrainConfig) -> Dict[str, Any]:
        # (not num_workers either: a finished run is as valid with other loader workers, and
        # stores written when it counted as a resumable change leave it out)
        settings = {k: v for k, v in config.to_dict().items()
                    if k not in RESUMABLE_CONFIG_CHANGES and k not in NO_RESULT_SETTINGS
                    and k != 'num_workers'}
        return _plain(dict(format=_FORMAT, run=dict(key), config=settings))

    def _path(self, key: Mapping[str, Any]) -> str:
        # canonical values throughout (an option, label or seed written 1 or 1.0 names one file)
        where = _canonical(_plain(dict(key)))
        # named by the cell (run_grid) or the caller's labels (train_models: 'target', ...)
        labels = ([where['cell']] if 'cell' in where else
                  [v for k, v in sorted(where.items())
                   if k not in ('data', 'model', 'options', 'seed')])
        name = '--'.join(_slug(str(part)) for part in labels + [where.get('model', '')])
        name = name.lstrip('-_') or 'run'
        digest = hashlib.sha1(json.dumps(where, sort_keys=True).encode()).hexdigest()
        return os.path.join(self.folder, f"{name}--seed{where.get('seed', 0)}-{digest[:10]}.json")

    def get(self, key: Mapping[str, Any], config: TrainConfig) -> Optional[Dict[str, Any]]:
        r"""The record of the finished run :obj:`key` (a dict naming it: ``cell``, ``model``,
        ``seed`` and whatever identifies its data) trained with :obj:`config`, or :obj:`None`
        (no such file, or one of a run with another configuration, or one that cannot be read:
        the run is then trained again)."""
        path = self._path(key)
        if not os.path.exists(path):
            return None
        try:
            with open(path) as f:
                stored = json.load(f)
        except (OSError, ValueError) as e:  # damaged (writes are atomic): said, not silent
            warnings.warn(f"run file '{path}' cannot be read ({e}): the run is trained again "
                          f"and the file replaced")
            return None
        identity = stored.get('identity') if isinstance(stored, dict) else None
        if isinstance(identity, dict) and isinstance(identity.get('config'), dict):
            # stores written while num_workers counted toward a run's identity (2026-12-06)
            identity['config'].pop('num_workers', None)
        # (compared as the file keeps it: a non-finite value of a key or option is written as
        # null by write_json, and the run was never found again)
        if identity != finite_or_none(self._identity(key, config)):
            return None
        record = stored.get('record')
        if not isinstance(record, dict):
            return None
        # a NaN figure (the R² of a diverged run, of targets a loss masks) is kept as null
        # (write_json): read back as the NaN it was, as the tables of a fresh run show it
        return dict(record, **{k: nan_for_none(record[k]) for k in ('val', 'test')
                               if k in record})

    def put(self, key: Mapping[str, Any], config: TrainConfig,
            record: Mapping[str, Any]) -> str:
        r"""Keeps :obj:`record`, the finished run :obj:`key` trained with :obj:`config`
        (atomically: an interrupted write leaves no half file); returns the file's path."""
        path = self._path(key)
        write_json(path, dict(identity=self._identity(key, config),
                               record=_plain(record, sort_keys=False)))
        return path


def _reads_as(parser: argparse.ArgumentParser, word: str, dest: str) -> bool:
    # whether argparse reads the command-line word as the option of dest: written out or, where
    # the parser takes abbreviations, a prefix of that option alone ('--res' for --resume)
    word = word.split('=', 1)[0]
    if not word.startswith('--') or word == '--':
        return False
    options = {s: a.dest for a in parser._actions for s in a.option_strings}
    if word in options:
        return options[word] == dest
    return parser.allow_abbrev and {d for s, d in options.items() if s.startswith(word)} == {dest}


def _check_resumable(caller: str, parser: argparse.ArgumentParser) -> None:
    # the command a note gives goes on with --resume: the parser must have it
    if not any(a.dest == 'resume' for a in parser._actions):
        raise ValueError(f"{caller}: expected a parser with a --resume option, got one "
                         f"with {', '.join(s for a in parser._actions for s in a.option_strings)}")


def interrupted_note(script: str, argv: Sequence[str], parser: argparse.ArgumentParser,
                     kept: Optional[str], what: str = 'runs', finished: bool = False) -> str:
    r"""The line a resumable study prints (to stderr) when Ctrl-C stops it, before it exits with
    :data:`EXIT_INTERRUPTED`, in place of a traceback: that it was interrupted, where what it
    finished is kept, and the exact command that goes on.

    Args:
        script (str): The script's path (its ``__file__``).
        argv (list of str): The arguments it was called with.
        parser (argparse.ArgumentParser): Its parser, which has ``--resume`` (e.g. from
            :func:`~torch_mz.study.add_resume_argument`) and may have ``--overwrite``.
        kept (str, optional): Where this call keeps the :obj:`what` it finished (its
            :class:`RunStore`'s folder, a partial report), or :obj:`None` before it kept
            anything (while it read its data, before its store removed the runs of an earlier
            call for ``--overwrite``): the command is then the same again. Otherwise it is
            the same with ``--resume``, which replaces an ``--overwrite`` (the runs it would
            remove are this call's now).
        what (str, optional): What the study finishes, plural. (default: :obj:`'runs'`)
        finished (bool, optional): Every one of the :obj:`what` is finished and kept in
            :obj:`kept` (which must be given): the study was stopped while it wrote its report,
            and the line says that the command only writes the report. (default: :obj:`False`)
    """
    _check_resumable('interrupted_note', parser)
    if finished and kept is None:
        raise ValueError("interrupted_note: expected where the finished study keeps its "
                         f"{what} ('kept') with finished=True, got None")
    name = os.path.basename(script)
    args = list(argv)
    if kept is not None and not any(_reads_as(parser, word, 'resume') for word in args):
        args = [word for word in args if not _reads_as(parser, word, 'overwrite')] + ['--resume']
    command = shlex.join([os.path.basename(sys.executable), os.path.relpath(script), *args])
    if kept is None:
        return f'{name}: interrupted before it kept any of its {what}; to start again: {command}'
    if finished:
        return (f'{name}: interrupted while it wrote its report; all its {what} are kept in '
                f'{kept} (none is done again); to write the report: {command}')
    return (f'{name}: interrupted; the {what} finished so far are kept in {kept} (the one in '
            f'progress starts again); to go on: {command}')


class Interruption:
    r"""What :func:`interruptible` yields to its ``with`` block.

    Attributes:
        kept (str, optional): Where the study keeps what it finished (:func:`interrupted_note`'s
            :obj:`kept`); the block sets it once it keeps anything (e.g. once its
            :class:`RunStore` is made).
        finished (bool): Whether everything the study finishes is kept (:meth:`all_kept`).
        note (str, optional): :obj:`None`, or once Ctrl-C stopped the block, the line to print
            before exiting with :data:`EXIT_INTERRUPTED`.
    """

    def __init__(self, kept: Optional[str]):
        self.kept = kept
        self.note: Optional[str] = None
        self.finished = False

    def all_kept(self) -> None:
        r"""Says that from here on everything the study finishes is kept in :attr:`kept` (its
        runs are in their store): a Ctrl-C now costs only the report, and the note says so."""
        if self.kept is None:
            raise ValueError("Interruption.all_kept: expected where the study keeps what it "
                             "finished ('kept'), got None")
        self.finished = True


@contextmanager
def interruptible(script: str, argv: Sequence[str], parser: argparse.ArgumentParser,
                  kept: Optional[str] = None, what: str = 'runs') -> Iterator[Interruption]:
    r"""Runs the ``with`` block of a resumable study so that Ctrl-C stops it with a line to
    print, not a traceback: a :class:`KeyboardInterrupt` in the block ends the block, and the
    :class:`Interruption` it yields then holds :func:`interrupted_note`'s line as ``note``
    (:obj:`None` otherwise), for the script to print to stderr before it exits with
    :data:`EXIT_INTERRUPTED`::

        with interruptible(__file__, sys.argv[1:], parser, store.folder) as stop:
            runs, rows = run_grid(grid, models, seeds, config, store=store)
            stop.all_kept()  # (a Ctrl-C from here costs only the report)
            write_report(...)
        if stop.note:
            print(stop.note, file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED

    The arguments are :func:`interrupted_note`'s; :obj:`kept` is where what the study finishes
    is kept, or :obj:`None` where it keeps nothing yet (the block sets ``kept`` once it does).
    A parser without ``--resume`` raises a :class:`ValueError` here, before the block runs."""
    _check_resumable('interruptible', parser)
    stop = Interruption(kept)
    try:
        yield stop
    except KeyboardInterrupt:
        stop.note = interrupted_note(script, argv, parser, stop.kept, what,
                                     finished=stop.finished)
