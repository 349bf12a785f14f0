r"""Helpers shared by the dataset classes of :mod:`torch_mz.datasets`: the default data root,
point normalisation, bookkeeping of skipped raw records, the errors
raised for a corrupt raw or processed file, and :class:`ProcessedDataset`, the base class whose
processed cache is written atomically, loaded without running code, and rebuilt when broken."""
import contextlib
import glob
import json
import math
import os
import os.path as osp
import pickle
import re
import shutil
import sys
import warnings
from types import FrameType
from typing import (Any, Callable, ContextManager, Dict, List, Optional, Sequence, Set, Tuple,
                    Type)

import numpy as np
import torch
import torch_geometric
from torch_geometric.data import Data, InMemoryDataset

from torch_mz._checks import check_flag, host_memory
from torch_mz._files import (atomic_write, damaged_zip_member, file_lock,
                             remove_stale_temp_files, weights_only_load)
from torch_mz._optional import installed_version, require
from torch_mz.datasets.fingerprint import (_describe, files_below, fingerprint_files,
                                           hashing_files, raw_files_differ)
from torch_mz.datasets import splits as _splits

ENV_DATA_ROOT = 'TORCH_MZ_DATA'

# <repo>/torch_mz/datasets/common.py -> <repo>
_REPO_DIR = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

#: (moved to :mod:`torch_mz.datasets.splits`, its room; importable from here as before)
split_indices = _splits.split_indices

# the packages whose frames stand between a dataset's warning and the line that opened it
_PACKAGE_DIR = osp.dirname(osp.dirname(osp.abspath(__file__)))  # torch_mz/
_LIBRARY_DIRS = (osp.join(_PACKAGE_DIR, ''),
                 osp.join(osp.dirname(osp.abspath(torch_geometric.__file__)), ''))
# the command line's modules, whose lines open a dataset as a user's script does (run as
# ``torch-mz`` or ``python -m torch_mz``, nothing outside the packages opened it: the line named
# was the console script's, or ``<frozen runpy>``'s)
_CALLER_FILES = (osp.join(_PACKAGE_DIR, 'cli', ''), osp.join(_PACKAGE_DIR, '__main__.py'))


def _caller_stacklevel() -> int:
    r"""The ``stacklevel`` at which a warning given by the function that calls this names the
    first line outside :mod:`torch_mz` and PyG, or in :mod:`torch_mz`'s command line: the line
    that opened the dataset (a dataset's constructor opens its cache through PyG's, at a depth
    that differs by class)."""
    frame: Optional[FrameType] = sys._getframe(2)  # (the caller of the function that warns)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS) and (
            not frame.f_code.co_filename.startswith(_CALLER_FILES)):
        frame, level = frame.f_back, level + 1
    return level


class CorruptRawFileError(ValueError):
    r"""A raw dataset file exists but cannot be read as the format it should have (truncated, wrong
    keys, malformed numbers). The message and :attr:`path` name the file.

    Args:
        path (str): The offending file.
        reason (str): What is wrong with it.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"Corrupt raw file '{self.path}': {reason}. Delete it and fetch it again.")

    def __reduce__(self):
        return (self.__class__, (self.path, self.reason))


class ProcessedFileError(ValueError):
    r"""A file of a dataset's processed cache cannot be used. The message and :attr:`path` name
    the file.

    With :obj:`unsafe=False` the file is broken (empty, truncated, not what
    ``stats.json`` records): :class:`ProcessedDataset` rebuilds the cache from the raw files. With
    :obj:`unsafe=True` it holds something other than tensors and PyG data containers (a pickle
    that would run code, or no torch file at all); it is refused without being unpickled and
    left for the user to inspect and delete.

    Args:
        path (str): The offending file.
        reason (str): What is wrong with it.
        unsafe (bool, optional): Whether the file was refused rather than found broken.
            (default: :obj:`False`)
        hint (str, optional): What to do, in place of the default (for a refused file: delete
            it to rebuild the cache). (default: :obj:`None`)
    """

    def __init__(self, path: str, reason: str, unsafe: bool = False,
                 hint: Optional[str] = None) -> None:
        self.path = str(path)
        self.reason = reason
        self.unsafe = unsafe
        self.hint = hint
        if hint is None:
            hint = ('; it was not loaded (nothing in it ran). Delete it to rebuild the processed '
                    'files from the raw files' if unsafe else '')
        super().__init__(f"Processed file '{self.path}' {reason}{hint}")

    def __reduce__(self):
        return (self.__class__, (self.path, self.reason, self.unsafe, self.hint))


def default_root(name: str) -> str:
    r"""The folder a dataset called :obj:`name` uses when no :obj:`root` is given.

    In this order: :obj:`$TORCH_MZ_DATA/<name>` when the environment variable is set;
    :obj:`<repo>/datasets/<name>` when :mod:`torch_mz` runs from a source checkout (a folder holding
    ``setup.cfg`` and ``datasets/``); otherwise :obj:`./datasets/<name>` under the working directory
    (an installed package must not write into ``site-packages``).
    """
    env = (os.environ.get(ENV_DATA_ROOT) or '').strip()
    if env:
        folder = osp.expanduser(env)
        if osp.exists(folder) and not osp.isdir(folder):
            raise ValueError(f"${ENV_DATA_ROOT} '{env}' is a file, not a folder for the "
                             f"datasets: point it at a folder (or unset it)")
        return osp.join(folder, name)
    if (osp.isfile(osp.join(_REPO_DIR, 'setup.cfg')) and osp.isdir(osp.join(_REPO_DIR, 'torch_mz'))
            and osp.isdir(osp.join(_REPO_DIR, 'datasets'))):
        return osp.join(_REPO_DIR, 'datasets', name)
    return osp.join(os.getcwd(), 'datasets', name)


def normalize_unit_sphere(pos: np.ndarray) -> np.ndarray:
    r"""Centers a point set at its centroid and scales it so that the largest norm is 1.

    A set whose points all coincide is only centered (it cannot be scaled).

    Shapes:
        - **input:** :math:`(n, 3)`
        - **output:** :math:`(n, 3)`, float32
    """
    pos = np.asarray(pos, dtype=np.float64)
    with np.errstate(over='ignore', invalid='ignore'):
        centered, scale = _centered(pos)
    if (len(pos) > 0 and np.isfinite(pos).all()
            and (not np.isfinite(scale) or (scale == 0 and np.abs(centered).max() > 0))):
        # finite coordinates so large that their sum or squared norms overflow float64 (the
        # scale would be inf and every point 0), or so small that the squares underflow to 0
        # (the set would only be centred): the same normalisation of pos / max|pos|
        centered, scale = _centered(pos / np.abs(pos).max())
    if scale > 0:
        centered = centered / scale
    return centered.astype(np.float32)


def _centered(pos: np.ndarray) -> Tuple[np.ndarray, float]:
    r"""The set centred at its centroid, and its largest norm (0 for an empty set)."""
    pos = pos - pos.mean(axis=0, keepdims=True)  # (n, 3)
    return pos, (np.sqrt((pos**2).sum(axis=1)).max() if len(pos) > 0 else 0.0)


def check_integer(name: str, value: Any, low: int = 0) -> int:
    r"""An integer of at least :obj:`low`, given as any integral type (a Python or NumPy
    integer, an integer tensor of one element: what :func:`operator.index` takes), returned as a
    Python :obj:`int`, so that it is written to ``stats.json`` and folder names as a number. A
    bool, a float or a smaller value raises a :class:`ValueError` naming :obj:`name`."""
    return _splits._integer(value, name, low)  # (split_indices' check of n and seed)


def optional_points(num_points: Any) -> Optional[int]:
    r""":obj:`num_points` of a point-cloud dataset as a Python :obj:`int` (any integral type is
    taken), or :obj:`None`; a bool, a float or a number below 1 raises a :class:`ValueError`
    naming it."""
    if num_points is None:
        return None
    try:
        return check_integer('num_points', num_points, low=1)
    except ValueError:
        raise ValueError(f"'num_points' must be a positive integer or None, got "
                         f"{num_points!r}") from None


class SkipCounter:
    r"""Counts raw records that processing leaves out, by reason, and keeps (up to :obj:`keep`)
    their identifiers for the stats file. :attr:`total` counts records: one added under two
    reasons (QM9's bonds that failed, then its charges) is one record."""

    def __init__(self, keep: int = 1000) -> None:
        self.keep = keep
        self.counts: Dict[str, int] = {}
        self.examples: Dict[str, List[str]] = {}
        self._reasons: Dict[str, Set[str]] = {}  # the reasons each identifier was added under
        self._total = 0

    def add(self, reason: str, ident: object) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        examples = self.examples.setdefault(reason, [])
        if len(examples) < self.keep:
            examples.append(str(ident))
        # (the report summed the counts: a molecule counted under two reasons was two records)
        reasons = self._reasons.setdefault(str(ident), set())
        if not reasons or reason in reasons:  # a record not yet counted under another reason
            self._total += 1
        reasons.add(reason)

    @property
    def total(self) -> int:
        r"""The number of records counted (an identifier added under several reasons once)."""
        return self._total

    def as_dict(self) -> Dict[str, object]:
        return {
            'counts': dict(self.counts),
            'examples': {
                k: list(v)
                for k, v in self.examples.items()
            }
        }

    def report(self, what: str) -> None:
        r"""Warns (once per processing run) how many records of :obj:`what` were left out or
        handled by a fallback, and why."""
        if self.counts:
            detail = ', '.join(f'{k}: {v}' for k, v in sorted(self.counts.items()))
            warnings.warn(
                f'{what}: {self.total} record(s) skipped or handled by a fallback '
                f'({detail}); see the stats file in the processed folder',
                stacklevel=_caller_stacklevel())


# what the processed files hold: tensors, plain containers and the PyG data class
PROCESSED_SAFE_GLOBALS = [Data]


def save_stats(stats: Dict[str, object], path: str, data_paths: Sequence[str] = ()) -> None:
    r"""Writes :obj:`stats` as ``stats.json`` atomically, recording the size in bytes of each of
    the processed files :obj:`data_paths` (written before it) under ``processed_files``, so that
    :func:`check_processed_sizes` can tell a cache whose writing was interrupted. A symbolic
    link at :obj:`path` is replaced by the file, not written through (a cache folder copied from
    elsewhere may hold links to files outside it)."""
    stats['processed_files'] = {osp.basename(p): osp.getsize(p) for p in data_paths}
    text = json.dumps(stats, indent=1, sort_keys=True, default=_json_number)
    atomic_write(path, lambda f: f.write(text), binary=False, follow_links=False)


def _json_number(value: Any) -> Any:
    # a NumPy number (np.int64, np.float32) that reached the stats is written as the number
    if isinstance(value, np.generic) and value.dtype.kind in 'biuf':
        return value.item()
    raise TypeError(f'Object of type {type(value).__name__} is not JSON serializable')


def load_stats(path: str) -> Dict[str, Any]:
    r"""Reads a ``stats.json``; raises :class:`ProcessedFileError` naming it when it is truncated
    or not a JSON object."""
    try:
        with open(path, encoding='utf-8') as f:
            stats = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProcessedFileError(path, f'is truncated or not JSON ({e})') from e
    if not isinstance(stats, dict):
        raise ProcessedFileError(path, 'does not hold a JSON object')
    return stats


def check_processed_sizes(stats: Dict[str, object], stats_path: str,
                          data_paths: Sequence[str]) -> None:
    r"""Raises :class:`ProcessedFileError` when a processed file's size differs from the one
    :func:`save_stats` recorded (a cache written before sizes were recorded is not checked)."""
    sizes = stats.get('processed_files')
    if not isinstance(sizes, dict):
        return
    for path in data_paths:
        expected = sizes.get(osp.basename(path))
        if expected is not None and osp.getsize(path) != expected:
            raise ProcessedFileError(
                path, f"has {osp.getsize(path)} bytes but '{stats_path}' records {expected}: "
                f"its writing was interrupted or it belongs to another processing run")


def load_processed(path: str) -> Any:
    r"""Loads a processed file with ``torch.load(path, weights_only=True)``, allowing the PyG
    data class (:data:`PROCESSED_SAFE_GLOBALS`) and nothing else: a file that would need any
    other object (such as a pickle that runs code) is refused without being unpickled.

    Unlike PyG's ``fs.torch_load``, it never retries with ``weights_only=False``. Data that do
    not match the checksums stored with them (:func:`~torch_mz._files.damaged_zip_member`;
    ``torch.load`` does not check them) make the file one that cannot be read.

    Raises:
        ProcessedFileError: :obj:`unsafe=True` for a refused file, :obj:`unsafe=False` for one
            that cannot be read (empty, truncated, corrupt).
    """
    damaged = damaged_zip_member(path) if os.path.isfile(path) else None
    if damaged is not None:
        raise ProcessedFileError(path, f'cannot be read as written: {damaged}')
    try:
        # (not the classes other packages allow process-wide: weights_only_load)
        return weights_only_load(path, 'cpu', PROCESSED_SAFE_GLOBALS)
    except pickle.UnpicklingError as e:
        found = re.search(r'WeightsUnpickler error:(.*?)(Check the documentation|$)', str(e),
                          flags=re.S)
        reason = ' '.join((found.group(1) if found else str(e)).split())
        raise ProcessedFileError(path, f'holds objects other than tensors and PyG data, or is '
                                 f'not a torch file ({reason})', unsafe=True) from e
    except (FileNotFoundError, PermissionError):
        raise
    except Exception as e:  # torch.load raises many types for a truncated file; all mean broken
        raise ProcessedFileError(path, f'cannot be read: it is empty, truncated or corrupt '
                                 f'({type(e).__name__}: {e})') from e


def _repr_text(transform: Any) -> str:
    # the text PyG stores in pre_transform.pt / pre_filter.pt (its `_repr`), addresses removed:
    # what the markers of earlier releases hold, and how messages name a transform
    return 'None' if transform is None else re.sub('(<.*?)\\s.*(>)', r'\1\2', str(transform))


# the version of the markers' contents: a dict {'format', 'repr', 'description'}; the markers of
# earlier releases hold the repr text alone
_MARKER_FORMAT = 2


def _marker(transform: Any) -> Dict[str, Any]:
    r"""What ``pre_transform.pt`` / ``pre_filter.pt`` hold: the description that is compared
    (:func:`_describe`) and the repr that messages show."""
    return {'format': _MARKER_FORMAT, 'repr': _repr_text(transform),
            'description': _describe(transform)}


def _marker_mismatch(saved: Any, current: Dict[str, Any], what: str) -> Optional[str]:
    r"""How the marker :obj:`saved` that a cache holds differs from :obj:`current` (:func:`_marker`
    of the transform given), in words; :obj:`None` where it is the same."""
    if isinstance(saved, dict) and saved.get('format') == _MARKER_FORMAT:
        if saved.get('description') == current['description']:
            return None
        before = str(saved.get('repr'))
        if before != current['repr']:
            return f"{what}={before}, not {what}={current['repr']}"
        return (f"{what}={before} with other parameters ({_shortened(saved.get('description'))})"
                f", not with those given ({_shortened(current['description'])})")
    if saved == 'None' and current['description'] == 'None':
        return None  # an earlier release's record of no transform: exact
    # an earlier release recorded the repr text alone, which two transforms with other
    # parameters can share: what the cache was made with is not known
    return (f"{what}={_shortened(saved)} as an earlier release of torch_mz recorded it (by its "
            f"text only, which does not tell its parameters), not {what}={current['repr']}")


def _shortened(text: Any, limit: int = 300) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + '...'


class ProcessedDataset(InMemoryDataset):
    r"""An :class:`~torch_geometric.data.InMemoryDataset` whose processed cache

    - is written atomically: every file (collated data, ``stats.json``, the
      ``pre_transform.pt``/``pre_filter.pt`` markers) goes to a temporary file first and is moved
      into place with :func:`os.replace`, so an interrupted processing run leaves the previous
      file or none, never a partial one; ``stats.json``, which records the sizes of the data
      files, is the cache's mark of completion: a rebuild removes the old one and the old
      markers just before it replaces the first data file, and writes the new one last, after
      the markers, so that a run stopped at any point leaves a cache that is rebuilt (or, stopped
      before it replaced anything, the old cache as it was); a symbolic link in its place (in a
      cache folder copied from elsewhere) is replaced by the file, never written through;
    - is loaded with ``weights_only=True`` (:func:`load_processed`), so a crafted file never runs
      code (PyG's own loader retries with ``weights_only=False``);
    - is checked when loaded: an empty, truncated or inconsistent file is reported with a warning
      that names it and the cache is rebuilt from the raw files; a refused file raises
      :class:`ProcessedFileError`;
    - is rebuilt, with a warning, when it was made with another ``pre_transform`` or
      ``pre_filter`` than the one given (PyG warns and uses it as it is, so the data would not be
      what the arguments say): the markers describe a transform by its class and its parameters
      (:func:`_describe`), not by its repr alone, which two transforms with other parameters can
      share; a marker of an earlier release (its repr alone) or a missing one counts as another
      transform. What the description leaves out is not seen (see :func:`_describe`): a private
      attribute not named after a constructor parameter, an object other than a plain value, a
      container, a tensor or an array that a function reads as a global, a value read through
      a module or an object (``config.SCALE``), a file the transform reads. Changing one of
      those reuses the cache as it is: give such a parameter to the constructor, or pass
      ``force_reload=True``. What it does see is seen whole: a function that keeps state in a
      container it reads as a global (a memo dict filled as it runs) is described with that
      state, so its cache is rebuilt, with the warning, whenever the state differs (keep such
      state in a private attribute of a transform object instead); caches made by a
      ``pre_transform`` function that reads a container, tensor or array as a global before
      these were described are rebuilt once;
    - records a fingerprint of the raw files it was built from in ``stats.json``
      (:meth:`raw_fingerprint`: their paths, sizes and modification times, with the hash of
      their bytes; for small files read as a whole the hash alone) and is rebuilt, with a
      warning that names the files added, removed or changed, when they differ (a file whose
      time alone changed is compared by its hash: a copy that did not keep the times is the
      same data);
    - records the :attr:`processing_version` of the code that built it in ``stats.json``: a
      cache built by code of another version (or by a release that recorded none) is rebuilt
      from the raw files, with a warning, so that a fix to the processing (a check of the raw
      files that was missing, a record read wrongly) reaches caches built before it;
    - records the versions of the packages whose output it keeps (:meth:`parser_packages`:
      QM9's RDKit, ModelNet40's trimesh) in ``stats.json`` as ``parser_versions``, and warns
      when it is opened with other versions installed: it is used as it is (another release
      may read or sample the raw files otherwise; ``force_reload=True`` rebuilds it with the
      installed one). A cache that records none (built before they were recorded) loads
      without a word.

    Subclasses call :meth:`open_cache` at the end of their constructor, implement
    :meth:`read_cache`, which loads the processed files into the dataset, write their data
    files in :meth:`process` with :meth:`_save_processed` and end it with :meth:`_finish_cache`,
    which writes the markers and then ``stats.json``; they may refine :meth:`raw_fingerprint`.
    """

    #: What a cache built by :meth:`process` holds and which raw files it accepts, as a number
    #: recorded in ``stats.json``; raised whenever a change to the processing changes either, so
    #: that caches built before the change are rebuilt (see above). 1: the first recorded one;
    #: 2: ``stats.json`` records the raw files' fingerprint, the markers the parameters of the
    #: transforms.
    processing_version: int = 2

    # the old cache's stats file and markers, removed just before a rebuild replaces its first
    # data file (_rebuild)
    _stale_on_write: List[str]
    # the raw files' fingerprint taken as a rebuild starts, and whether process() ended with
    # _finish_cache (_rebuild)
    _raw_before: Optional[Dict[str, Any]] = None
    _markers_before: Optional[List[Tuple[str, Dict[str, Any]]]] = None
    _finished: bool = False
    # whether PyG's constructor asked for the check and build that open_cache() does (_process)
    _build_pending: bool = False

    def __init__(self, root: Optional[str] = None, transform: Optional[Callable] = None,
                 pre_transform: Optional[Callable] = None, pre_filter: Optional[Callable] = None,
                 log: bool = True, force_reload: bool = False) -> None:
        # the flags checked before PyG reads them: the text 'False' is true (as force_reload
        # it rebuilt the cache on every open without a word; as log it showed the progress bars)
        force_reload = check_flag('force_reload', force_reload)
        log = check_flag('log', log)
        super().__init__(root, transform, pre_transform, pre_filter, log=log,
                         force_reload=force_reload)

    @classmethod
    def save(cls, data_list: Sequence[Any], path: str,
             before_replace: Optional[Callable[[], None]] = None) -> None:
        r"""Collates :obj:`data_list` and writes it to :obj:`path` atomically
        (:obj:`before_replace`: see :func:`~torch_mz._files.atomic_write`). A symbolic link at
        :obj:`path` is replaced by the file, not written through: a cache folder copied from
        elsewhere may hold links to files outside it (a checkpoint, a file that does not exist
        yet), which a rebuild overwrote or created."""
        data, slices = cls.collate(data_list)
        payload = (data.to_dict(), slices, data.__class__)
        atomic_write(path, lambda f: torch.save(payload, f), before_replace=before_replace,
                     follow_links=False)

    def _save_processed(self, data_list: Sequence[Any], path: str) -> None:
        r""":meth:`save` for :meth:`process`: in a rebuild, the old cache's stats file and
        markers go just before its first data file is replaced (see :meth:`_rebuild`)."""
        self.save(data_list, path, before_replace=self._invalidate_old_cache)

    def _invalidate_old_cache(self) -> None:
        for path in getattr(self, '_stale_on_write', []):
            if osp.exists(path):
                os.unlink(path)
        self._stale_on_write = []

    def load(self, path: str, data_cls: Type[Data] = Data) -> None:
        r"""Loads a file written by :meth:`save` with :func:`load_processed`."""
        out = load_processed(path)
        if not (isinstance(out, tuple) and len(out) in (2, 3) and isinstance(out[0], dict)
                and (out[1] is None or isinstance(out[1], dict))):
            raise ProcessedFileError(path, 'does not hold a collated dataset')
        if len(out) == 3 and not (isinstance(out[2], type) and issubclass(out[2], Data)):
            # (the weights-only allow-list is process-wide: other classes may be allowed)
            raise ProcessedFileError(path, f'names {out[2]!r} as its data class, not a '
                                     f'torch_geometric.data.Data class')
        data, self.slices = out[0], out[1]
        if len(out) == 3:
            data_cls = out[2]
        self.data = data_cls.from_dict(data)

    def read_cache(self) -> None:
        r"""Loads the processed files into the dataset; raises :class:`ProcessedFileError` for
        a file that cannot be used."""
        raise NotImplementedError

    def open_cache(self) -> None:
        r"""Checks the cache and builds or rebuilds it where it does not fit the arguments
        (the work PyG's constructor asks of :meth:`_process`), then runs :meth:`read_cache`;
        when a processed file is broken, warns (naming it), rebuilds the cache from the raw
        files and reads it again. All under one hold of the cache's lock: another process
        cannot rebuild the cache (with its own ``pre_transform``, say) between the check and
        the read."""
        with self._build_lock():  # one process builds or rebuilds the cache at once
            if self._build_pending:
                self._build_pending = False
                self._build_if_stale()
            try:
                self._read_cache()
            except ProcessedFileError as e:
                if e.unsafe:
                    raise
                warnings.warn(f"{e}; rebuilding the processed files in "
                              f"'{self.processed_dir}' from the raw files",
                              stacklevel=_caller_stacklevel())
                self._rebuild()
                self._read_cache()

    def _read_cache(self) -> None:
        try:
            self.read_cache()
        except ProcessedFileError as e:
            if not (e.unsafe and getattr(self, '_rebuilt_now', False)):
                raise
            # written by this process from the raw files, yet refused: what pre_transform made
            # (a Data subclass, a numpy array or another object in an attribute) is more than a
            # weights-only load allows. Deleting it and rebuilding would write it again
            if osp.abspath(e.path) in map(osp.abspath, self.processed_paths):
                os.unlink(e.path)
            raise ProcessedFileError(
                e.path, f'was just written from the raw files, and {e.reason}', unsafe=True,
                hint='. Processed files are loaded weights-only, so that no code runs from data '
                'files: let pre_transform return torch_geometric.data.Data objects whose '
                'attributes are tensors (no numpy arrays or other objects, no Data subclass), '
                'or allow the global named above with torch.serialization.add_safe_globals '
                'before building the dataset. The file was removed') from e

    def _build_lock(self) -> ContextManager[bool]:
        r"""An exclusive lock (:func:`~torch_mz._files.file_lock`) on ``<processed_dir>.lock``,
        held while a process checks the cache, builds or rebuilds it and reads it, in one hold
        (:meth:`open_cache`): two processes opening the same dataset at once (e.g. two training
        jobs started together) take turns, and the second finds the cache the first has built
        (or, given another ``pre_transform``, rebuilds it after the first has read it)."""
        return file_lock(self.processed_dir.rstrip(os.sep) + '.lock', follow_links=False)

    def _download_once(self, staging: str) -> None:
        r""":meth:`_download_raw` under the dataset's download lock (:func:`download_lock`):
        one process downloads at a time, and the next finds the raw files the first placed.
        What killed downloads left in :obj:`staging` is cleared first (:func:`clear_staging`).
        """
        with download_lock(self.root):
            if all(osp.exists(p) for p in self.raw_paths):
                return
            clear_staging(staging)
            self._download_raw()

    def _download_raw(self) -> None:
        r"""Fetches the raw files (subclasses that download)."""
        raise NotImplementedError

    def raw_fingerprint(self) -> Dict[str, Any]:
        r"""The fingerprint of the raw files a rebuild would read (:func:`fingerprint_files`),
        recorded in ``stats.json`` as ``raw_files``; a cache whose record differs is rebuilt.
        Here every file of :attr:`raw_paths` (and every file below one that is a folder), by
        path relative to :attr:`raw_dir`, size and modification time."""
        paths: List[str] = []
        for path in self.raw_paths:
            paths += files_below(path) if osp.isdir(path) else [path]
        return fingerprint_files(paths, self.raw_dir)

    def parser_packages(self) -> Tuple[str, ...]:
        r"""The optional packages whose output :meth:`process` keeps in the cache (a parser's
        reading of the raw files, a sampler's points), whose versions ``stats.json`` records
        (:meth:`_check_parser_versions`). Here none."""
        return ()

    def _parser_versions(self) -> Dict[str, str]:
        versions = {name: installed_version(name) for name in self.parser_packages()}
        return {name: v for name, v in versions.items() if v is not None}

    def _check_parser_versions(self) -> None:
        r"""Warns where the cache's ``stats.json`` records versions of the
        :meth:`parser_packages` other than those installed: its data are what those made of the
        raw files, used as they are (rebuilding them would change the data of runs that read
        them; ``force_reload=True`` does). A cache that records none, or a package that is not
        installed now, says nothing."""
        stats = self._recorded_stats()
        recorded = stats.get('parser_versions') if stats is not None else None
        if not isinstance(recorded, dict):
            return
        changed = []
        for name in self.parser_packages():
            now = installed_version(name) if name in recorded else None
            if now is not None and str(recorded[name]) != now:
                changed.append(f'{name} {recorded[name]} (installed: {now})')
        if changed:
            warnings.warn(f"The processed files in '{self.processed_dir}' were made with "
                          f"{', '.join(changed)}: they are used as they are, and may differ "
                          f"from what the installed version makes of the raw files; pass "
                          f"force_reload=True to rebuild them with it",
                          stacklevel=_caller_stacklevel())

    def _markers(self) -> List[Tuple[str, Dict[str, Any]]]:
        return [(osp.join(self.processed_dir, 'pre_transform.pt'), _marker(self.pre_transform)),
                (osp.join(self.processed_dir, 'pre_filter.pt'), _marker(self.pre_filter))]

    def _stats_path(self) -> Optional[str]:
        return next((p for p in self.processed_paths if osp.basename(p) == 'stats.json'), None)

    def _process(self) -> None:
        # PyG's constructor calls this before the subclass's ends with open_cache(), which
        # checks and builds the cache under the lock it reads it under: checked and built
        # here, under a lock released before the read, the cache could be rebuilt in between
        # by another process opening it with another pre_transform or pre_filter, whose data
        # this one then read as its own
        self._build_pending = True

    def _build_if_stale(self) -> None:
        r"""PyG's ``Dataset._process``, called by :meth:`open_cache` holding the lock."""
        # what a build killed mid-write left: files untouched for 10 minutes (where the
        # file system takes no lock, another build may be writing a recent one), where the
        # folder can be written (a cache shared read-only is read as it is)
        with contextlib.suppress(OSError):
            remove_stale_temp_files(self.processed_dir, [osp.basename(p) for p in (
                list(self.processed_paths) + [m for m, _ in self._markers()])],
                min_age_s=600)
        # PyG's Dataset._process, with the markers read by load_processed (PyG unpickles them
        # with weights_only=False) and a broken marker treated as a stale cache
        stale = self.force_reload
        complete = all(osp.exists(p) for p in self.processed_paths)
        for path, current in self._markers():
            what = osp.basename(path)[:-3]
            if stale:
                continue
            if not osp.exists(path):
                if complete:  # (every cache this release completes has its markers)
                    warnings.warn(f"The processed files in '{self.processed_dir}' do not "
                                  f"record the {what} they were made with (no "
                                  f"'{osp.basename(path)}'): rebuilding them from the raw "
                                  f"files", stacklevel=_caller_stacklevel())
                    stale = True
                continue
            try:
                saved = load_processed(path)
            except ProcessedFileError as e:
                if e.unsafe:
                    raise
                warnings.warn(f'{e}; rebuilding the processed files',
                              stacklevel=_caller_stacklevel())
                stale = True
                continue
            mismatch = _marker_mismatch(saved, current, what)
            if mismatch is not None:
                # PyG warns and uses the cache as it is: a run would record a pre_transform
                # (or pre_filter) that was never applied
                warnings.warn(f"The processed files in '{self.processed_dir}' were made with "
                              f"{mismatch}: rebuilding them from the raw files",
                              stacklevel=_caller_stacklevel())
                stale = True
        if not stale and self._built_by_other_version():
            stale = True
        if not stale and self._raw_files_changed():
            stale = True
        if not stale and complete:
            self._check_parser_versions()  # (a warning: the cache is used as it is)
            return
        self._rebuild()

    def _recorded_stats(self) -> Optional[Dict[str, Any]]:
        r"""The cache's ``stats.json``; :obj:`None` where it is missing or unreadable (a cache
        not built yet, or one :meth:`open_cache` finds broken)."""
        path = self._stats_path()
        if path is None or not osp.exists(path):
            return None
        try:
            return load_stats(path)
        except (ProcessedFileError, OSError):
            return None

    def _built_by_other_version(self) -> bool:
        r"""Whether the cache's ``stats.json`` records a :attr:`processing_version` other than
        this code's (warning that it is rebuilt). A missing or unreadable stats file is left to
        the other checks (a cache not built yet; :meth:`open_cache`)."""
        stats = self._recorded_stats()
        if stats is None:
            return False
        recorded = stats.get('processing_version')
        if recorded == self.processing_version:
            return False
        built_by = ('a release of torch_mz that recorded no processing version'
                    if recorded is None else f'processing version {recorded!r}')
        warnings.warn(f"The processed files in '{self.processed_dir}' were built by {built_by}, "
                      f"and this release processes the raw files as version "
                      f"{self.processing_version}: rebuilding them from the raw files",
                      stacklevel=_caller_stacklevel())
        return True

    def _raw_files_changed(self) -> bool:
        r"""Whether the raw files differ from those the cache's ``stats.json`` records
        (:meth:`raw_fingerprint`), warning that it is rebuilt and naming what changed. A
        missing or unreadable stats file is left to the other checks."""
        stats = self._recorded_stats()
        if stats is None:
            return False
        recorded = stats.get('raw_files')
        current = self.raw_fingerprint()
        if recorded == current:
            return False

        def hashed(keys: Set[str]) -> Dict[str, Any]:
            with hashing_files(keys):  # (those files alone)
                return self.raw_fingerprint()

        what = raw_files_differ(recorded, current, hashed)
        if not what:  # the same files: a build's record (which holds their hashes too), or
            # a copy that did not keep the modification times, whose new times are recorded,
            # with the hashes, so the next open reads nothing
            if isinstance(recorded, dict):  # (it is: raw_files_differ said so)
                self._record_raw_times(stats, recorded, current)
            return False
        warnings.warn(f"The raw files of the processed files in '{self.processed_dir}' are not "
                      f"those they were built from ({what}): rebuilding them from the raw files",
                      stacklevel=_caller_stacklevel())
        return True

    def _record_raw_times(self, stats: Dict[str, Any], recorded: Dict[str, Any],
                          current: Dict[str, Any]) -> None:
        r"""Writes the raw files' current modification times into ``stats.json`` (their
        recorded hashes kept), after :func:`raw_files_differ` found the same bytes, where a
        time changed (nothing is written where the record already holds them); a failure (a
        read-only cache) leaves it as it was, to be hashed again next time."""
        path = self._stats_path()
        if path is None:
            return
        raw = {}
        for key, entry in current.items():
            old = recorded.get(key)
            if (isinstance(entry, list) and isinstance(old, list) and len(entry) == 2
                    and str(old[-1]).startswith('sha1:') and not str(entry[1]).startswith(
                        'sha1:')):
                entry = entry + [old[-1]]
            raw[key] = entry
        if raw == recorded:  # no time changed: the record of a build, whose entries hold
            return  # hashes that the check does not take (written on every open before)
        updated = dict(stats, raw_files=raw)
        text = json.dumps(updated, indent=1, sort_keys=True, default=_json_number)
        try:
            atomic_write(path, lambda f: f.write(text), binary=False, follow_links=False)
        except OSError:
            pass

    def _finish_cache(self, stats: Dict[str, object], path: str,
                      data_paths: Sequence[str]) -> None:
        r"""Ends :meth:`process`: writes the ``pre_transform``/``pre_filter`` markers, then
        ``stats.json`` (:func:`save_stats`, with the fingerprint of the raw files taken before
        they were read), the mark that the cache is complete."""
        fingerprint = self._raw_before  # (None where process() is called on its own)
        if fingerprint is None:
            with hashing_files():
                fingerprint = self.raw_fingerprint()
        stats['raw_files'] = fingerprint
        versions = self._parser_versions()  # (RDKit's, trimesh's: what made the data kept)
        if versions:
            stats['parser_versions'] = versions
        # the transforms as given, described before process() ran them (one that keeps state,
        # a counter or a lazy cache, would otherwise be recorded as another in every process)
        markers = self._markers_before if self._markers_before is not None else self._markers()
        for marker_path, marker in markers:  # (a link replaced, not written through: save)
            atomic_write(marker_path, lambda f: torch.save(marker, f),  # called at once
                         follow_links=False)
        save_stats(stats, path, data_paths)
        self._finished = True

    def _rebuild(self) -> None:
        self._rebuilt_now = True  # a refused file is then this process's own (_read_cache)
        os.makedirs(self.processed_dir, exist_ok=True)
        # the stats file is written last (_finish_cache), after the markers: it and the old
        # markers are removed just before the first new data file replaces an old one
        # (_save_processed), so a rebuild stopped half way leaves a cache that is incomplete
        # (rebuilt at the next start), never new data files beside old ones, or beside old
        # markers, that the checks could take for one cache; stopped before that, the old
        # cache is left as it was (its records still tell what it was made with and from)
        self._stale_on_write = ([p for p in [self._stats_path()] if p is not None]
                                + [p for p, _ in self._markers()])
        with hashing_files():  # taken before the raw files are read, with their hashes
            self._raw_before = self.raw_fingerprint()
        self._markers_before = self._markers()  # and the transforms before they run
        self._finished = False
        try:
            self.process()
        finally:
            self._stale_on_write = []
            self._raw_before = None
            markers, self._markers_before = self._markers_before, None
        if not self._finished:  # a process() that does not end with _finish_cache
            for path, current in markers:
                atomic_write(path, lambda f: torch.save(current, f),  # called at once
                             follow_links=False)


def download_lock(root: str) -> ContextManager[bool]:
    r"""The lock a dataset's download holds (:func:`~torch_mz._files.file_lock`), so that
    processes opening it at once take turns: ``<root>/processed/.download.lock``, beside the
    processed caches' locks (``root`` and ``raw/`` hold only the data)."""
    return file_lock(osp.join(root, 'processed', '.download.lock'), follow_links=False)


def clear_staging(folder: str) -> None:
    r"""Removes the staging folders (``.download-*``, ``.extract-*``) that a download or an
    extraction killed without its clean-up (SIGTERM, SIGKILL) left in :obj:`folder`: only their
    own process ever reads them. Call it holding the folder's download lock."""
    folder = glob.escape(folder)  # (a root such as 'run[1]' holds glob characters)
    for path in glob.glob(osp.join(folder, '.download-*')) + glob.glob(
            osp.join(folder, '.extract-*')):
        if osp.isdir(path):
            shutil.rmtree(path, ignore_errors=True)


def integer_valued(values: np.ndarray) -> bool:
    r"""Whether every entry of :obj:`values` is a whole number (class labels stored as
    integers, or as floats such as ``3.0``): a label like ``3.7`` is a corrupt file, which
    ``int()`` would silently read as class 3."""
    values = np.asarray(values)
    if values.dtype.kind in 'iub':
        return True
    if values.dtype.kind != 'f':
        return False
    return bool(np.all(np.isfinite(values)) and np.all(values == np.round(values)))


def h5_class_labels(path: str, label: np.ndarray, count: int, num_classes: int) -> np.ndarray:
    r"""The dataset ``label`` of the HDF5 file :obj:`path` (as :func:`read_h5` read it) as the
    class indices of its :obj:`count` examples, int64, shape :math:`(count,)`. A
    :class:`CorruptRawFileError` naming the file and ``label`` where it is not one whole number
    in ``[0, num_classes)`` per example: a shape other than :math:`(count,)` or
    :math:`(count, 1)` (a ``(2, 2)`` array beside 4 examples was read as their labels),
    booleans, fractions or NaN (``int()`` would read 3.7 as class 3), or a class out of range.
    """
    if label.shape not in ((count, ), (count, 1)):
        raise CorruptRawFileError(
            path, f"dataset 'label' has shape {label.shape}: expected one class index per "
            f"example of 'data', ({count},) or ({count}, 1)")
    labels = label.reshape(-1)  # (count,)
    if labels.dtype.kind == 'b':
        raise CorruptRawFileError(path, f"dataset 'label' holds booleans, not class indices in "
                                  f"[0, {num_classes})")
    if not integer_valued(labels):
        at = int(np.flatnonzero(~np.isfinite(labels) | (labels != np.round(labels)))[0])
        raise CorruptRawFileError(path, f"dataset 'label' holds labels that are not whole "
                                  f"numbers ({labels[at]} at index {at})")
    outside = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if len(outside):
        at = int(outside[0])
        raise CorruptRawFileError(path, f"dataset 'label' holds labels outside "
                                  f"[0, {num_classes}) ({labels[at]} at index {at})")
    return labels.astype(np.int64)


def _h5_elsewhere(h5py: Any, f: Any, key: str) -> Optional[str]:
    r"""What makes the entry :obj:`key` of the open HDF5 file :obj:`f` lead out of its own
    storage, in words, or :obj:`None` for a dataset or group stored in the file (a hard link):
    an external link (into another file), a soft link (whose path may pass through an external
    link), a virtual dataset (read from its source files) or a dataset whose raw data lies in
    external files (any file's bytes), or a user-defined link (which HDF5 resolves with code
    registered for it)."""
    try:
        link = f.get(key, getlink=True)  # (the link itself: nothing is opened through it)
    except TypeError:  # (h5py's 'Unknown link type': hard, soft and external are its kinds)
        return 'a user-defined link'
    if isinstance(link, h5py.ExternalLink):
        return f"an external link to '{link.path}' in the file '{link.filename}'"
    if isinstance(link, h5py.SoftLink):
        return f"a soft link to '{link.path}'"
    if not isinstance(link, h5py.HardLink):
        return f'a link of another kind ({type(link).__name__})'
    entry = f[key]
    if isinstance(entry, h5py.Dataset) and getattr(entry, 'is_virtual', False):
        sources = sorted({m.file_name for m in entry.virtual_sources()})
        return f'a virtual dataset that reads from the file(s) {sources}'
    if isinstance(entry, h5py.Dataset) and entry.external:
        return (f'a dataset whose data is stored in the external file(s) '
                f'{sorted({name for name, _, _ in entry.external})}')
    return None


#: The HDF5 filters that HDF5 builds in (deflate 1, shuffle 2, fletcher32 3, szip 4, nbit 5,
#: scaleoffset 6) and that h5py registers as it is imported (lzf 32000). Reading a dataset whose
#: filter pipeline names any other makes HDF5 search its plugin path (``$HDF5_PLUGIN_PATH`` or
#: its default plugin folder) and load the shared libraries it finds there: code chosen by a
#: data file. :func:`read_h5` refuses such a dataset before reading any data.
H5_BUILT_IN_FILTERS = frozenset({1, 2, 3, 4, 5, 6, 32000})


def _h5_filter_registered(h5py: Any, filter_id: int) -> bool:
    r"""Whether the HDF5 library that h5py loaded holds the filter :obj:`filter_id` with its
    decoder. ``h5z.get_filter_info`` looks in the library's table alone (``h5z.filter_avail``
    would search the plugin path for a filter not found there, loading what it finds)."""
    try:
        config = h5py.h5z.get_filter_info(filter_id)
    except (RuntimeError, ValueError):  # ('required filter ... is not registered')
        return False
    return bool(config & h5py.h5z.FILTER_CONFIG_DECODE_ENABLED)


def _h5_foreign_filter(h5py: Any, dataset: Any) -> Optional[str]:
    r"""The first filter of :obj:`dataset`'s pipeline that reading it would have HDF5 look for
    as a plugin, in words, or :obj:`None` where every one is built in and registered
    (:data:`H5_BUILT_IN_FILTERS`). Only the pipeline is read (no data, no filter runs)."""
    dcpl = dataset.id.get_create_plist()
    for i in range(dcpl.get_nfilters()):
        filter_id, _, _, name = dcpl.get_filter(i)  # (id, flags, values, name)
        named = _shortened(name.decode('utf-8', 'replace'), 60) if name else ''
        named = f' ({named!r} as the file names it)' if named else ''
        if filter_id not in H5_BUILT_IN_FILTERS:
            return (f'the filter {filter_id}{named}, which neither HDF5 nor h5py builds in: '
                    f'reading it would make HDF5 search its plugin path and load a library '
                    f'from there')
        if not _h5_filter_registered(h5py, filter_id):
            return (f'the filter {filter_id}{named}, which this HDF5 library was built without: '
                    f'reading it would make HDF5 search its plugin path and load a library '
                    f'from there')
    return None


def _h5_missing_storage(dataset: Any) -> Optional[str]:
    r"""In words, where :obj:`dataset` (of at least one element) lacks data that its declared
    shape holds, which HDF5 would read as its fill value (zeros unless the file sets another):
    no storage at all (a dataset created and never written), or fewer chunks than the shape
    spans; :obj:`None` where it holds them all."""
    if dataset.id.get_storage_size() == 0:
        return f'holds no data for its declared shape {dataset.shape}'
    if dataset.chunks is not None:
        spanned = math.prod(-(-n // c) for n, c in zip(dataset.shape, dataset.chunks))
        written = dataset.id.get_num_chunks()
        if written < spanned:
            return (f'holds {written} of the {spanned} chunks of its declared shape '
                    f'{dataset.shape}')
    return None


def _h5_fill_value(h5py: Any, dataset: Any) -> str:
    r"""In words, what HDF5 reads where :obj:`dataset` holds no data: its fill value, zeros
    unless the file sets another (h5py's ``fillvalue=-1``), undefined values where the file
    leaves it undefined."""
    defined = dataset.id.get_create_plist().fill_value_defined()
    if defined == h5py.h5d.FILL_VALUE_UNDEFINED:
        return 'undefined values (the file sets no fill value)'
    if defined == h5py.h5d.FILL_VALUE_DEFAULT:
        return 'its fill value (zeros)'
    return f'its fill value ({np.asarray(dataset.fillvalue).item()!r}, as the file sets it)'


def _h5_dataset(h5py: Any, path: str, f: Any, key: str) -> Any:
    r"""The dataset :obj:`key` of the open HDF5 file :obj:`f`, checked as :func:`read_h5`
    describes without reading its data; a :class:`CorruptRawFileError` naming :obj:`path` and
    :obj:`key` where it fails a check."""
    elsewhere = _h5_elsewhere(h5py, f, key)
    if elsewhere is not None:
        raise CorruptRawFileError(
            path, f"'{key}' is {elsewhere}: only datasets stored in the file itself "
            f"are read, never other files that it names")
    entry = f[key]
    if not isinstance(entry, h5py.Dataset):
        kind = ('group' if isinstance(entry, h5py.Group) else 'named datatype'
                if isinstance(entry, h5py.Datatype) else type(entry).__name__)
        raise CorruptRawFileError(path, f"'{key}' is a {kind}, not a dataset")
    if entry.dtype.kind not in 'biuf':  # (strings, bytes, compound, object, array types)
        raise CorruptRawFileError(path, f"dataset '{key}' holds {entry.dtype}, not numbers")
    if entry.shape is None:  # (h5py.Empty: a dataspace of no elements, not even a shape)
        raise CorruptRawFileError(path, f"dataset '{key}' is empty (a null dataspace): it "
                                  f"holds no array")
    foreign = _h5_foreign_filter(h5py, entry)
    if foreign is not None:
        raise CorruptRawFileError(path, f"dataset '{key}' is stored with {foreign}; it was not "
                                  f"read (the releases read here use the built-in filters "
                                  f"{sorted(H5_BUILT_IN_FILTERS)} or none)")
    if entry.size:
        missing = _h5_missing_storage(entry)
        if missing is not None:
            raise CorruptRawFileError(path, f"dataset '{key}' {missing}: what it lacks would "
                                      f"be read as {_h5_fill_value(h5py, entry)}, not as data "
                                      f"(was its writing interrupted?)")
    return entry


def read_h5(path: str, keys: Sequence[str], optional: Sequence[str] = ()) -> Dict[str, np.ndarray]:
    r"""Reads the arrays :obj:`keys` (and, where present, :obj:`optional`) from the HDF5 file
    :obj:`path`; raises :class:`CorruptRawFileError` naming the file (and the key, where one is
    at fault) when it is not a readable HDF5 file, lacks a key, or holds anything but an array
    of numbers (booleans, integers or floats) under one.

    Every key is checked before any data are read:

    - only datasets stored in the file itself are read: a key that is an external link, a soft
      link (its path may lead through an external link), a virtual dataset or a dataset with
      external storage would make a crafted file read other files on disk, and is refused
      naming what it points to, as is a user-defined link (the releases read here store plain
      datasets);
    - no code is loaded for a file: a dataset stored with a filter other than those HDF5 and
      h5py build in (:data:`H5_BUILT_IN_FILTERS`: gzip, shuffle, fletcher32, szip, nbit,
      scaleoffset, lzf), or one this HDF5 library was built without, is refused naming the
      filter's id (reading it would have HDF5 load a plugin library from its plugin path),
      even where another package (``hdf5plugin``) registered it;
    - a dataset that lacks data its declared shape holds (never written, or some chunks
      missing: read as its fill value, zeros unless the file sets another, without an error)
      is refused naming what it would read (one whose storage HDF5 allocated as it was
      created, compact or on request, holds the fill value as data and is read), as are
      datasets whose declared sizes, together, exceed this machine's memory (a shape that a
      small file declares, which reading would try to allocate), and an empty (null)
      dataspace.

    A dataset whose stored data cannot be read (a checksum that does not match, a truncated
    chunk) raises naming its key."""
    h5py = require('h5py')
    try:
        with h5py.File(path, 'r') as f:
            # ('k in f' looks at the link alone, as get(getlink=True) does, which raises a
            # TypeError for a user-defined link: _h5_elsewhere names it)
            present = [k for k in dict.fromkeys(list(keys) + list(optional)) if k in f]
            missing = [k for k in keys if k not in present]
            if missing:
                raise CorruptRawFileError(
                    path, f"missing dataset(s) {missing} (found {sorted(f.keys())})")
            # every key checked before any data are read (a filter's plugin is loaded as the
            # data are read)
            datasets = {k: _h5_dataset(h5py, path, f, k) for k in present}
            declared = {k: d.size * d.dtype.itemsize for k, d in datasets.items()}
            memory = host_memory()
            if memory is not None and sum(declared.values()) > memory:
                sizes = ', '.join(f"'{k}' {datasets[k].shape} of {datasets[k].dtype}: "
                                  f"{n / 2 ** 30:,.1f} GiB" for k, n in declared.items())
                raise CorruptRawFileError(
                    path, f"its datasets declare more bytes than this machine's "
                    f"{memory / 2 ** 30:,.1f} GiB of memory ({sizes})")
            arrays = {}
            for k, dataset in datasets.items():
                try:
                    arrays[k] = np.asarray(dataset[()])
                except OSError as e:
                    raise CorruptRawFileError(path, f"dataset '{k}' cannot be read ({e})") from e
            return arrays
    except FileNotFoundError:
        raise
    except OSError as e:  # h5py reports unreadable and truncated files as OSError
        raise CorruptRawFileError(path, f'not a readable HDF5 file ({e})') from e


class TrainTestSets(ProcessedDataset):
    r"""Shared skeleton of datasets with an official train/test split processed into
    ``train.pt``, ``test.pt`` and ``stats.json``: loading the requested split, the split name,
    and a :meth:`process` that runs ``pre_filter``/``pre_transform``, saves each split and records
    what was skipped and, with a ``pre_filter``, which examples it removed
    (``removed_by_pre_filter``: their positions among the examples read). Subclasses implement
    :meth:`_split_examples` and set :attr:`item_name`; :meth:`_split_record` adds to a split's
    record."""
    item_name = 'example'

    def _setup(self, root: Optional[str], name: str, train: bool, transform, pre_transform,
               pre_filter, log: bool, force_reload: bool) -> None:
        # (the text 'False' is true: it loaded the training split; log and force_reload are
        # checked so by ProcessedDataset)
        self.train = check_flag('train', train)
        super().__init__(default_root(name) if root is None else root, transform, pre_transform,
                         pre_filter, log=log, force_reload=force_reload)
        self.open_cache()

    def read_cache(self) -> None:
        stats_path = self.processed_paths[2]
        self.stats: Dict[str, Any] = load_stats(stats_path)
        check_processed_sizes(self.stats, stats_path, self.processed_paths[:2])
        path = self.processed_paths[0] if self.train else self.processed_paths[1]
        self.load(path)
        expected = self.stats.get(self.split, {}).get(f'num_{self.item_name}s')
        if expected is not None and expected != len(self):
            raise ProcessedFileError(path, f"holds {len(self)} {self.item_name}s but "
                                     f"'{stats_path}' records {expected}")

    @property
    def split(self) -> str:
        return 'train' if self.train else 'test'

    @property
    def processed_file_names(self) -> List[str]:
        return ['train.pt', 'test.pt', 'stats.json']

    def _label(self) -> str:
        r"""How messages name this dataset and configuration."""
        return self.__class__.__name__

    def _stats_header(self) -> Dict[str, object]:
        return {}

    def _split_examples(self, split: str, skipped: 'SkipCounter') -> list:
        raise NotImplementedError

    def _split_record(self, split: str) -> Dict[str, object]:
        r"""What else the stats file records of :obj:`split`, found by :meth:`_split_examples`
        (none here)."""
        return {}

    def process(self) -> None:
        stats = self._stats_header()
        stats['processing_version'] = self.processing_version
        for split, path in zip(('train', 'test'), self.processed_paths[:2]):
            skipped = SkipCounter()
            data_list = self._split_examples(split, skipped)
            read = len(data_list)
            removed: Optional[List[int]] = None  # (positions among those read)
            if self.pre_filter is not None:
                kept = [bool(self.pre_filter(d)) for d in data_list]
                removed = [i for i, keep in enumerate(kept) if not keep]
                data_list = [d for d, keep in zip(data_list, kept) if keep]
            if self.pre_transform is not None:
                data_list = [self.pre_transform(d) for d in data_list]
            if not data_list:
                # (both splits are processed together, whichever one was asked for)
                why = (f'pre_filter kept none of the {read} read'
                       if self.pre_filter is not None and read else
                       f'skipped: {skipped.counts}')
                raise RuntimeError(f'{self._label()}: no {split} {self.item_name} left to save '
                                   f'({why}); the train and test splits are processed '
                                   f'together, so each needs one')
            self._save_processed(data_list, path)
            record: Dict[str, object] = {f'num_{self.item_name}s': len(data_list),
                                         'skipped': skipped.as_dict()}
            if removed is not None:
                record['removed_by_pre_filter'] = removed
            record.update(self._split_record(split))
            stats[split] = record
            skipped.report(f'{self._label()} {split}')
        self._finish_cache(stats, self.processed_paths[2], self.processed_paths[:2])
