r"""The store of finished runs: one JSON file per run, checkpoints of runs in progress, and the file
locks that let several processes share them."""
import contextlib
import hashlib
import json
import math
import os
import platform
import shutil
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from torch_mz import __version__
from torch_mz._files import atomic_write, file_lock, nan_for_none, strict_json
from torch_mz.study.measure import code_version
from torch_mz.nn.fused import fused_kernels_mode
from torch_mz.train import CheckpointError, TrainConfig, load_checkpoint
from torch_mz.train.runtime import resolve_device
from torch_mz.study.statistics import mean_or_nan


#: The file in a run's checkpoint folder (beside ``checkpoint.pt`` and ``metrics.jsonl``) that
#: names the code of every start and resume of the run, one JSON object a line
#: (:meth:`RunStore.log_start`); committed, carried and removed with the checkpoint, and copied
#: into the run's record as ``code_history`` when the run finishes.
CODE_LOG = 'code.jsonl'

_KEY_CONFIG = ('epochs', 'batch_size', 'lr', 'weight_decay', 'warmup_epochs', 'schedule',
               'grad_clip', 'patience', 'min_delta', 'restore_best', 'normalize_targets')


def run_key(cell: Mapping[str, Any], spec: str, seed: int,
            config: TrainConfig) -> Dict[str, Any]:
    r"""What identifies a run: task, task arguments with set counts, model spec, seed and the
    training configuration's ``epochs``, ``batch_size``, ``lr``, ``weight_decay``,
    ``warmup_epochs``, ``schedule``, ``grad_clip``, ``patience``, ``min_delta``,
    ``restore_best`` and ``normalize_targets`` (not the device, where or how often files are
    written, the evaluation batch size, loader workers or deterministic kernels)."""
    return dict(task=cell['task'], kwargs=json.loads(json.dumps(dict(cell.get('kwargs', {})),
                                                                sort_keys=True)),
                model=spec, seed=seed, config={k: getattr(config, k) for k in _KEY_CONFIG})


class RunStore:
    r"""Finished runs as one JSON file each under :obj:`root`
    (``<task>/<model>/<task args>_lr.._wd.._s<seed>_<hash>.json``), and the checkpoints of runs in
    progress under :obj:`checkpoints` (deleted when the run's file is written; the weights of the
    best validation epoch are kept as ``<checkpoints>/weights/<hash>.pt``, which is not
    committed, and for the runs a claim scores also under :obj:`kept`, as
    ``<task>/<model>/<name>.pt`` beside the name of the run's file, which is:
    :meth:`keep`). A run's checkpoint folder also holds :data:`CODE_LOG`, the code that
    started it and each resume (:meth:`log_start`). :attr:`code` is the code this process runs
    (:func:`~torch_mz.study.measure.code_version` when the store is made), which the runs it
    trains name."""
    def __init__(self, root: str, checkpoints: str, kept: Optional[str] = None):
        self.root = root
        self.checkpoints = checkpoints
        self.kept = kept
        # read once: a commit made, or the package edited, while this process trains (hours)
        # does not change the code it imported, which the log and the records then misnamed
        self.code = code_version()
        self._pending: Dict[Tuple[str, str, int], Tuple[str, Dict[str, Any], str]] = {}

    def _paths(self, key: Mapping[str, Any]) -> Tuple[str, str]:
        digest = _digest(key)
        args = '_'.join(f'{k}={v}' for k, v in sorted(key['kwargs'].items())
                        if k not in ('n_train', 'n_val', 'n_test', 'source'))
        model = key['model'].replace(':', '_').replace(',', '_').replace('=', '')
        name = (f"{args or 'default'}_lr{key['config']['lr']:g}_wd{key['config']['weight_decay']:g}"
                f"_s{key['seed']}_{digest}")
        return (os.path.join(self.root, key['task'], model, name + '.json'),
                os.path.join(self.checkpoints, digest))

    def config_for(self, cell: Mapping[str, Any], spec: str, seed: int,
                   config: TrainConfig) -> TrainConfig:
        r""":obj:`config` for this run, checkpointing into the run's folder and resuming from
        its checkpoint if one is there."""
        config = replace(config, seed=seed, out_dir=None, resume=None)
        _, ckpt = self._paths(run_key(cell, spec, seed, config))
        resume = os.path.join(ckpt, 'checkpoint.pt')
        # (the folder is this run's own, keyed by its digest: files without a checkpoint are an
        # interrupted start of the same run, replaced)
        return replace(config, out_dir=ckpt, resume=resume if os.path.exists(resume) else None,
                       overwrite=True)

    def cached(self, cell: Mapping[str, Any], spec: str, seed: int,
               config: TrainConfig) -> Optional[Dict[str, object]]:
        r"""The finished run's record, or :obj:`None` (then the run is remembered for
        :meth:`save`)."""
        key = run_key(cell, spec, seed, config)
        path, ckpt = self._paths(key)
        record = self._own_record(path, key)
        if record is not None:  # as this cell and spec call it (runs are shared)
            return dict(record, cell=cell['label'], model=spec)
        self._pending[(str(cell['label']), str(spec), int(seed))] = (path, key, ckpt)
        return None

    @staticmethod
    def _own_record(path: str, key: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
        r"""The record at :obj:`path` (named for :obj:`key`), or :obj:`None` where there is
        none; :class:`RecordError` for one that holds another key (edited by hand or damaged:
        a file is named by its key's hash), which would otherwise be trained again and
        replaced without a word."""
        if not os.path.exists(path):
            return None
        record = read_record(path)
        if record['key'] != key:
            raise RecordError(f"run record '{path}' holds a key other than the one its name is "
                              f"the hash of (edited, or damaged): restore it (e.g. with git) "
                              f"or delete it to train that run again")
        return record

    def forget(self, cell: Mapping[str, Any], spec: str, seed: int) -> None:
        r"""Drops the run remembered for :meth:`save` (one that did not finish here: stopped at
        a deadline, or failed), so that a finished run read back later under the same cell
        label, model and seed is never taken for it."""
        self._pending.pop((str(cell['label']), str(spec), int(seed)), None)

    def expect(self, cell: Mapping[str, Any], spec: str, seed: int,
               config: TrainConfig) -> None:
        r"""Remembers the run for :meth:`save` although its file may be in the store (a run
        trained again, whose file is then replaced)."""
        key = run_key(cell, spec, seed, config)
        path, ckpt = self._paths(key)
        self._pending[(str(cell['label']), str(spec), int(seed))] = (path, key, ckpt)

    def save(self, record: Dict[str, Any]) -> Optional[Dict[str, object]]:
        r"""Writes a newly trained run (a record of :func:`~torch_mz.study.run_grid`) with its
        key, validation-loss curve, the code that finished it (``code``) and, where its folder
        has a :data:`CODE_LOG` (:meth:`log_start`), the code of its start and of every resume
        (``code_history``: a run begun by older code has none), removes its checkpoint and
        returns what it wrote; :obj:`None` for a run read back from the store."""
        pending = self._pending.pop((str(record['cell']), str(record['model']),
                                     int(record['seed'])), None)
        if pending is None or 'key' in record:  # a cached run (read back: it has its key)
            return None
        path, key, ckpt = pending
        # the code that finished it (its float rounding is part of a run: exact rewrites of
        # the operator change a run's trajectory), and where its folder has the log of them,
        # the code of its start and of every resume (a run resumed across commits: each)
        history = _code_log(ckpt)
        record = dict(record, key=key, val_loss_curve=_val_curve(ckpt), code=self.code,
                      **({'code_history': history} if history else {}))
        kept = self._kept(path)
        if kept is not None and os.path.exists(kept):  # of an earlier run of this key
            os.remove(kept)
        # the weights, then the record, then the checkpoint's removal: stopped after the
        # weights, the run resumes from its checkpoint (at its end) and writes them again; after
        # the record, the folder left behind is removed by tidy(); a run whose record is here
        # and weights are not is trained again where a claim needs them, never scored with
        # another run's weights
        best = os.path.join(ckpt, 'best.pt')
        if os.path.exists(best):  # the trained model, for claims that use it (Appendix D.3)
            # (atomically: a copy stopped part-way, by a full disk say, left a partial
            # '<hash>.pt.tmp' for good, and one not flushed could stand as the weights after a
            # power cut; a failure named no file)
            with open(best, 'rb') as source:
                atomic_write(self._weights(ckpt), lambda f: shutil.copyfileobj(source, f))
        # standard JSON: a NaN figure (a test R² of constant targets) as null, read back as NaN
        text = strict_json(record, indent=1, sort_keys=True) + '\n'
        atomic_write(path, lambda f: f.write(text), binary=False)
        _remove_log_last(ckpt)
        return record

    def log_start(self, cell: Mapping[str, Any], spec: str, seed: int,
                  config: TrainConfig) -> Dict[str, Any]:
        r"""Notes, in the run's :data:`CODE_LOG`, the code that trains it from now on (for
        :obj:`config` from :meth:`config_for`, just before training starts or resumes), and
        returns that entry: the epoch it starts from (0, or the one after its checkpoint's),
        the time (UTC), the ``code`` a record names (:attr:`code`, the process's
        :func:`~torch_mz.study.measure.code_version`: the commit, ``-dirty`` where the package's
        files differ from it), the versions of
        ``torch_mz``, PyTorch and Python, PyTorch's threads, the fused-kernel mode
        (:func:`~torch_mz.nn.set_fused_kernels`) and the device. A start replaces the log of an
        earlier start that wrote no checkpoint; a resume keeps the entries of the epochs before
        its own (those at or after it trained nothing its checkpoint kept), after a first entry
        that says the code of the epochs before is unknown where the log has none for epoch 0
        (a run started by code that kept no log). The file is written whole (atomically), so a
        stop part-way leaves the earlier log."""
        _, ckpt = self._paths(run_key(cell, spec, seed, replace(config, seed=seed)))
        start = 0
        if config.resume is not None:
            epoch = load_checkpoint(config.resume).get('epoch')
            if not isinstance(epoch, int) or isinstance(epoch, bool):  # (as the trainer: a
                # KeyError had stopped every claim, a text '3' was taken for epoch 3)
                raise CheckpointError(f"Checkpoint {config.resume!r} is damaged: its 'epoch' is "
                                      f"{epoch!r}, expected an integer")
            start = epoch + 1
        entry: Dict[str, Any] = dict(
            epoch=start, time=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
            code=self.code, torch_mz=__version__, torch=torch.__version__,
            python=platform.python_version(), threads=torch.get_num_threads(),
            fused_kernels=fused_kernels_mode(), device=str(resolve_device(config.device)))
        kept = [e for e in _code_log(ckpt) if e['epoch'] < start] if start else []
        if start and (not kept or kept[0]['epoch'] != 0):  # (begun by code that kept none)
            unknown: Dict[str, Any] = {k: None for k in entry}
            unknown.update(epoch=0, note=f"unknown: the code of the epochs before "
                           f"{kept[0]['epoch'] if kept else start} (begun by code that kept no "
                           f"{CODE_LOG})")
            kept.insert(0, unknown)
        text = ''.join(strict_json(e, sort_keys=True) + '\n' for e in kept + [entry])
        atomic_write(os.path.join(ckpt, CODE_LOG), lambda f: f.write(text), binary=False)
        return entry

    def tidy(self) -> List[str]:
        r"""Removes the checkpoint folders of finished runs that a process stopped between
        writing a run's record and removing its checkpoint left behind (they would otherwise
        stay, and be committed with the runs in progress); returns them. A folder is removed
        only where its run's lock is free and its log has as many epochs as the record (a run
        whose record is here and that is being trained again for its weights keeps its
        folder); its ``best.pt`` becomes the run's weights where it has none. An empty folder of
        a finished run (its removal stopped after the log, :func:`_remove_log_last`) goes
        too, and so does one holding only its :data:`CODE_LOG` (a start that trained no epoch:
        a run trained again for its weights, stopped before its first epoch ended)."""
        removed: List[str] = []
        if not os.path.isdir(self.checkpoints) or not os.path.isdir(self.root):
            return removed
        records = {}
        for top, _, files in os.walk(self.root):
            for name in files:
                if name.endswith('.json'):
                    records[name[:-5].rsplit('_', 1)[-1]] = os.path.join(top, name)
        for digest in sorted(os.listdir(self.checkpoints)):
            ckpt = os.path.join(self.checkpoints, digest)
            if digest not in records or not os.path.isdir(ckpt):
                continue
            with file_lock(ckpt + '.lock', wait=False, strict=True) as free:
                if not free:
                    continue
                # emptied by a removal stopped before its end, or holding only the code log of
                # a start that trained no epoch (trained again for its weights, stopped)
                if not set(os.listdir(ckpt)) - {CODE_LOG}:
                    shutil.rmtree(ckpt, ignore_errors=True)
                    removed.append(ckpt)
                    continue
                try:  # (a damaged file is named where a claim needs the run, not here)
                    record = read_record(records[digest])
                    logged = len(_val_curve(ckpt))
                except RecordError:
                    continue
                # (a diverged run's log lacks the epoch that diverged)
                finished = record['epochs_run'] - (1 if 'diverged' in record else 0)
                if _digest(record['key']) != digest or logged != finished:
                    continue
                best, weights = os.path.join(ckpt, 'best.pt'), self._weights(ckpt)
                if os.path.exists(best) and not os.path.exists(weights):
                    os.makedirs(os.path.dirname(weights), exist_ok=True)
                    os.replace(best, weights)
                shutil.rmtree(ckpt, ignore_errors=True)
                removed.append(ckpt)
        return removed

    def _weights(self, ckpt: str) -> str:
        return os.path.join(self.checkpoints, 'weights', os.path.basename(ckpt) + '.pt')

    def _kept(self, path: str) -> Optional[str]:
        if self.kept is None:
            return None
        return os.path.join(self.kept, os.path.splitext(os.path.relpath(path, self.root))[0]
                            + '.pt')

    def weights(self, cell: Mapping[str, Any], spec: str, seed: int,
                config: TrainConfig) -> Optional[str]:
        r"""The best-validation checkpoint of a finished run (:func:`torch_mz.load_model`
        rebuilds the model from it): the committed copy (:meth:`keep`) where there is one, else
        ``<checkpoints>/weights/`` (not committed), or :obj:`None` if neither is there (a run
        finished before weights were kept, or in another clone)."""
        path, ckpt = self._paths(run_key(cell, spec, seed, replace(config, seed=seed)))
        for found in (self._kept(path), self._weights(ckpt)):
            if found is not None and os.path.exists(found):
                return found
        return None

    def keep(self, cell: Mapping[str, Any], spec: str, seed: int,
             config: TrainConfig) -> Optional[str]:
        r"""Copies a finished run's weights into the committed folder :obj:`kept` (once; a
        claim that scores its models keeps them with its results) and returns that copy, or
        :obj:`None` when the run has no weights here or the store has no such folder."""
        path, ckpt = self._paths(run_key(cell, spec, seed, replace(config, seed=seed)))
        kept = self._kept(path)
        if kept is None or not self.stored(cell, spec, seed, config):
            return None
        if not os.path.exists(kept):
            if not os.path.exists(self._weights(ckpt)):
                return None
            with open(self._weights(ckpt), 'rb') as f:
                data = f.read()
            atomic_write(kept, lambda out: out.write(data))
        return kept

    def read(self, cell: Mapping[str, Any], spec: str, seed: int,
             config: TrainConfig) -> Optional[Dict[str, Any]]:
        r"""The finished run's record as stored, or :obj:`None`; unlike :meth:`cached` it
        remembers nothing (for reports)."""
        key = run_key(cell, spec, seed, replace(config, seed=seed))
        path, _ = self._paths(key)
        return self._own_record(path, key)

    def stored(self, cell: Mapping[str, Any], spec: str, seed: int,
               config: TrainConfig) -> bool:
        r"""Whether the run is finished (its file is in the store)."""
        key = run_key(cell, spec, seed, replace(config, seed=seed))
        path, _ = self._paths(key)
        return self._own_record(path, key) is not None

    @contextmanager
    def lock(self, cell: Mapping[str, Any], spec: str, seed: int, config: TrainConfig,
             wait: bool = True) -> Iterator[bool]:
        r"""Holds the run's lock for the ``with`` block and yields :obj:`True`; with
        :obj:`wait` false, yields :obj:`False` at once (holding nothing) when another process
        holds it. The lock is :func:`~torch_mz._files.file_lock` on
        ``<checkpoints>/<digest>.lock``: advisory, it dies with its process; without ``fcntl``
        (Windows: one process at a time) every lock is granted, and a lock file that cannot be
        made or locked (a read-only folder, a file system without locks) raises the
        :class:`OSError`, since two processes would otherwise train the same run into the same
        checkpoint."""
        _, ckpt = self._paths(run_key(cell, spec, seed, replace(config, seed=seed)))
        with file_lock(ckpt + '.lock', wait=wait, strict=True) as held:
            yield held

    def state(self, cell: Mapping[str, Any], spec: str, seed: int,
              config: TrainConfig) -> Tuple[str, int]:
        r"""Where a run stands, without training or waiting: ``('done', epochs)`` (its file is
        in the store), ``('training', epochs)`` (another process holds its lock),
        ``('started', epochs)`` (a checkpoint of an unfinished run, no holder: the next process
        resumes it) or ``('pending', 0)``; epochs run so far from its checkpoint's metrics
        (for a finished run, from its record)."""
        key = run_key(cell, spec, seed, replace(config, seed=seed))
        path, ckpt = self._paths(key)
        record = self._own_record(path, key)
        if record is not None:
            return 'done', int(record['epochs_run'])
        epochs = len(_val_curve(ckpt))
        if os.path.exists(ckpt + '.lock'):  # (no lock file: nobody holds it; none is made)
            with self.lock(cell, spec, seed, config, wait=False) as free:
                if not free:
                    return 'training', epochs
        return ('started' if epochs else 'pending'), epochs

    def mean_time(self, task: str, spec: str) -> Optional[Tuple[float, float]]:
        r"""Mean wall time (s) and mean epochs of the finished runs of :obj:`spec` on
        :obj:`task` in the store (any cell, seed or configuration), or :obj:`None`."""
        key = run_key(dict(task=task), spec, 0, TrainConfig())
        times, epochs = self._times(os.path.dirname(self._paths(key)[0]))
        if not times:
            return None
        return mean_or_nan(times), mean_or_nan(epochs)

    def _times(self, folder: str) -> Tuple[List[float], List[float]]:
        times, epochs = [], []
        if os.path.isdir(folder):
            for name in sorted(os.listdir(folder)):
                if name.endswith('.json'):
                    path = os.path.join(folder, name)
                    record = read_record(path)
                    if 'wall_time_s' in record:
                        wall, run = record['wall_time_s'], record.get('epochs_run', 0)
                        if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                   for v in (wall, run)):
                            raise RecordError(
                                f"run record '{path}' holds wall_time_s={wall!r} and "
                                f"epochs_run={run!r}, not numbers: restore it (e.g. with git) or "
                                f"delete it to train that run again")
                        times.append(float(wall))
                        epochs.append(float(run))
        return times, epochs

    def epoch_time(self, task: Optional[str] = None,
                   spec: Optional[str] = None) -> Optional[float]:
        r"""Mean wall time (s) per epoch of the finished runs of :obj:`spec` on :obj:`task`
        (their total time over their total epochs), or with neither given the largest such
        figure over every (task, model) in the store; :obj:`None` without finished runs."""
        if task is not None and spec is not None:
            key = run_key(dict(task=task), spec, 0, TrainConfig())
            times, epochs = self._times(os.path.dirname(self._paths(key)[0]))
            return sum(times) / sum(epochs) if times and sum(epochs) > 0 else None
        longest = None
        for times, epochs in self._every_model():
            if times and sum(epochs) > 0:
                per_epoch = sum(times) / sum(epochs)
                longest = per_epoch if longest is None else max(longest, per_epoch)
        return longest

    def _every_model(self) -> Iterator[Tuple[List[float], List[float]]]:
        r""":meth:`_times` of every (task, model) folder in the store."""
        tasks = sorted(os.listdir(self.root)) if os.path.isdir(self.root) else []
        for name in tasks:
            folder = os.path.join(self.root, name)
            for model in (sorted(os.listdir(folder)) if os.path.isdir(folder) else []):
                yield self._times(os.path.join(folder, model))

    def mean_epochs(self) -> Optional[float]:
        r"""Mean epochs run by the finished runs in the store (every task and model), or
        :obj:`None` without any."""
        epochs = [e for _, model_epochs in self._every_model() for e in model_epochs]
        return mean_or_nan(epochs) if epochs else None

    def epochs_run(self, cell: Mapping[str, Any], spec: str, seed: int,
                   config: TrainConfig) -> int:
        r"""Epochs an unfinished run has run so far (from its checkpoint's metrics; 0 when it
        has none)."""
        _, ckpt = self._paths(run_key(cell, spec, seed, replace(config, seed=seed)))
        return len(_val_curve(ckpt))

    def metrics(self, cell: Mapping[str, Any], spec: str, seed: int,
                config: TrainConfig) -> List[Dict[str, Any]]:
        r"""The metrics of the epochs an unfinished run has finished (its checkpoint folder's
        ``metrics.jsonl``, one dict per epoch; empty when there is none)."""
        _, ckpt = self._paths(run_key(cell, spec, seed, replace(config, seed=seed)))
        return _metrics(ckpt)

    def files(self, cell: Mapping[str, Any], spec: str, seed: int,
              config: TrainConfig) -> str:
        r"""The file of a run (whether it exists or not)."""
        return self._paths(run_key(cell, spec, seed, replace(config, seed=seed)))[0]


class RecordError(ValueError):
    r"""A run's record file in the store that cannot be read (not JSON, or not a JSON object:
    e.g. cut short, or left with a merge conflict)."""


def _remove_log_last(ckpt: str) -> None:
    r"""Removes a finished run's checkpoint folder, its log last: a removal stopped part-way
    leaves the log (by which :meth:`RunStore.tidy` knows the folder for a finished run's) or an
    empty folder, never the checkpoints without the log (which tidy would keep for good, to be
    committed with the runs in progress)."""
    if os.path.isdir(ckpt):
        for name in sorted(os.listdir(ckpt)):
            if name != 'metrics.jsonl' and os.path.isfile(os.path.join(ckpt, name)):
                with contextlib.suppress(OSError):  # (as rmtree's ignore_errors: tidy() goes on)
                    os.remove(os.path.join(ckpt, name))
    shutil.rmtree(ckpt, ignore_errors=True)


def read_record(path: str) -> Dict[str, Any]:
    r"""The run record stored at :obj:`path`; :class:`RecordError` naming the file (and what
    to do) for one that is not a JSON object."""
    try:
        with open(path) as f:
            record = json.load(f)
    except ValueError as e:  # (json's JSONDecodeError, and UnicodeDecodeError)
        raise RecordError(f"run record '{path}' cannot be read ({e}): restore it (e.g. with "
                          f"git) or delete it to train that run again") from e
    if not isinstance(record, dict):
        raise RecordError(f"run record '{path}' holds a {type(record).__name__}, not a JSON "
                          f"object: restore it (e.g. with git) or delete it to train that run "
                          f"again")
    wrong = [f'{field} (of type {kind.__name__})' for field, kind in RECORD_FIELDS.items()
             if not isinstance(record.get(field), kind) or isinstance(record.get(field), bool)]
    if wrong:
        raise RecordError(f"run record '{path}' lacks {', '.join(wrong)}: restore it (e.g. with "
                          f"git) or delete it to train that run again")
    # the figures a NaN of which is kept as null (RunStore.save): read back as NaN
    return dict(record, **{k: nan_for_none(record[k]) for k in ('val', 'test', 'val_loss_curve')
                           if k in record})


#: The fields every run record holds, and their types (a diverged run's ``test`` and ``val``
#: are empty).
RECORD_FIELDS = {'key': dict, 'model': str, 'seed': int, 'epochs_run': int, 'val': dict,
                 'test': dict}


def _epoch_cap(record: Mapping[str, Any]) -> Optional[int]:
    r"""The ``epochs`` of the configuration :obj:`record`'s key records, else :obj:`None`."""
    cap = record.get('key', {}).get('config', {}).get('epochs')
    return None if cap is None else int(cap)


def stopped_early(record: Mapping[str, Any]) -> bool:
    r"""Whether early stopping ended the run of :obj:`record` (a run record, or a row that
    says ``diverged`` true or false) before its epoch cap: not a diverged run, which a record
    stored before 2026-12-04 marks as stopped early too, nor one whose patience ran out on its
    very last epoch (the trainer's ``stopped_early`` is true for it: it ran every epoch the
    cap allows, :func:`at_epoch_cap`), where the record has its key."""
    if not record.get('stopped_early', False) or record.get('diverged'):
        return False
    cap = _epoch_cap(record)
    return cap is None or int(record['epochs_run']) < cap


def at_epoch_cap(record: Mapping[str, Any]) -> bool:
    r"""Whether the run of :obj:`record` ran every epoch its configuration allows (the epoch
    cap): neither early stopping before the cap (:func:`stopped_early`) nor divergence ended
    it, and, where the record has its key, it ran its configuration's ``epochs`` (a run whose
    patience ran out on that last epoch included: nothing was cut short)."""
    if record.get('diverged') or stopped_early(record):
        return False
    cap = _epoch_cap(record)
    return cap is None or int(record['epochs_run']) >= cap


def epochs_figures(runs: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    r"""The epochs the :obj:`runs` trained, as a claim record gives them: the fewest and the
    most, how many runs early stopping ended (:func:`stopped_early`), how many diverged, how
    many runs there are, and ``at_cap``: per model (in the runs' order), how many of its runs
    ran to the epoch cap (:func:`at_epoch_cap`; models with none are left out). A run whose
    patience ran out on its last epoch counts at the cap, not as stopped early: no run counts
    in two of the three."""
    epochs = [int(r['epochs_run']) for r in runs]
    at_cap: Dict[str, int] = {}
    for r in runs:
        if at_epoch_cap(r):
            at_cap[str(r['model'])] = at_cap.get(str(r['model']), 0) + 1
    return dict(min=min(epochs, default=0), max=max(epochs, default=0),
                stopped_early=sum(stopped_early(r) for r in runs),
                diverged=sum(bool(r.get('diverged')) for r in runs), runs=len(runs),
                at_cap=at_cap)


def _digest(key: Mapping[str, Any]) -> str:
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]


def _metrics(ckpt: str) -> List[Dict[str, Any]]:
    r"""The epochs' metrics in the log of a run in training (``metrics.jsonl`` in its checkpoint
    folder; committed with ``--carry``, so a merge can leave it damaged): :class:`RecordError`
    naming the file for a line that is not a JSON object."""
    path = os.path.join(ckpt, 'metrics.jsonl')
    try:  # (a run finishing in another process removes its folder at any time)
        with open(path) as f:
            lines = [line for line in f if line.strip()]
    except FileNotFoundError:
        return []
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except ValueError as e:  # (json's JSONDecodeError)
            row = e
        if not isinstance(row, dict):
            raise RecordError(
                f"the log of a run in training '{path}' cannot be read (line {number}: {row}): "
                f"restore it (e.g. with git), or delete it: resuming the run writes it again "
                f"from the run's checkpoint")
        rows.append(row)
    return rows


def _code_log(ckpt: str) -> List[Dict[str, Any]]:
    r"""The entries of a run's :data:`CODE_LOG` (:meth:`RunStore.log_start`; empty where there
    is none: a run started by code that kept none): :class:`RecordError` naming the file for a
    line that is not a JSON object with an integer ``epoch`` (committed with ``--carry``, so a
    merge can damage it)."""
    path = os.path.join(ckpt, CODE_LOG)
    try:
        with open(path) as f:
            lines = [line for line in f if line.strip()]
    except FileNotFoundError:
        return []
    entries = []
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line)
        except ValueError as e:  # (json's JSONDecodeError)
            entry = e
        if not (isinstance(entry, dict) and isinstance(entry.get('epoch'), int)
                and not isinstance(entry['epoch'], bool)):
            raise RecordError(
                f"the code log of a run in training '{path}' cannot be read (line {number}: "
                f"{entry}): restore it (e.g. with git), or delete it: the run then records the "
                f"code of its epochs so far as unknown")
        entries.append(entry)
    return entries


def _val_curve(ckpt: str) -> List[float]:
    return [round(m.get('val_loss', math.nan), 6) for m in _metrics(ckpt)]
