r"""Resuming an interrupted study: every finished run's record kept as one JSON file, so that a
study stopped after hours (a closed session, a crash, Ctrl-C) trains only the runs it had not
finished when it is started again. Library code: nothing here prints."""
import hashlib
import json
import os
import re
import warnings
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from torch_mz.study.report import write_json
from torch_mz.train import TrainConfig
from torch_mz.train.checkpoint import RESUMABLE_CONFIG_CHANGES

__all__ = ['RunStore']

_FORMAT = 1
#: Training settings that change no figure of a finished run (besides
#: :data:`~torch_mz.train.checkpoint.RESUMABLE_CONFIG_CHANGES`): a stored run is read back
#: whatever they were.
NO_RESULT_SETTINGS = ('checkpoint_every', 'eval_batch_size')


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


def _plain(value: Any) -> Any:
    # JSON's own values, as a file read back holds them (tuples as lists, keys as strings); the
    # JSON values a key held before NumPy values were converted give the same text, so the run
    # files of earlier calls are still found
    return json.loads(json.dumps(value, sort_keys=True, default=_json_value))


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
    configuration (all but the settings that do not change a result: device, progress bars,
    checkpoint folders). A run asked for with anything else is trained again and its file
    replaced, so a store never mixes runs of two configurations into one table.

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
        if identity != self._identity(key, config):
            return None
        record = stored.get('record')
        return record if isinstance(record, dict) else None

    def put(self, key: Mapping[str, Any], config: TrainConfig,
            record: Mapping[str, Any]) -> str:
        r"""Keeps :obj:`record`, the finished run :obj:`key` trained with :obj:`config`
        (atomically: an interrupted write leaves no half file); returns the file's path."""
        path = self._path(key)
        write_json(path, dict(identity=self._identity(key, config), record=_plain(record)))
        return path
