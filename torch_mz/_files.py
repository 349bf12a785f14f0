r"""Writing files so that an interrupted write never leaves a partial file behind: the one helper
that checkpoints, training logs and processed dataset caches are written with; the lock that
lets processes sharing files take turns; the check that a torch file reads back as written; and
standard JSON for the files users read (a non-finite figure as ``null``)."""
import contextlib
import errno
import hashlib
import json
import math
import os
import re
import secrets
import threading
import time
import zipfile
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def strict_json(value: Any, **kwargs: Any) -> str:
    r""":func:`json.dumps` of :obj:`value` (:obj:`kwargs` passed on) as standard JSON: every
    NaN or infinite float, at any depth of dicts, lists and tuples, written as ``null``. Python's
    :mod:`json` writes them as the bare words ``NaN`` and ``Infinity``, which strict readers
    (``jq``, JavaScript's ``JSON.parse``) refuse; a reader of a file written before takes both
    (Python's :func:`json.load` reads ``NaN`` back as the float)."""
    return json.dumps(finite_or_none(value), allow_nan=False, **kwargs)


def finite_or_none(value: Any) -> Any:
    r""":obj:`value` with every NaN or infinite float, at any depth of dicts, lists and tuples
    (as lists), replaced by :obj:`None`: what :func:`strict_json` writes."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def nan_for_none(figures: Any) -> Any:
    r"""The figures :obj:`figures` (a dict's values or a list's items, one level) with every
    :obj:`None` read back as NaN: a figure that :func:`strict_json` wrote as ``null`` (NaN, or
    an infinity, which comes back as NaN), for a reader that expects a float there. Anything
    else, a :obj:`None` :obj:`figures` too, is returned as it is."""
    if isinstance(figures, dict):
        return {k: math.nan if v is None else v for k, v in figures.items()}
    if isinstance(figures, list):
        return [math.nan if v is None else v for v in figures]
    return figures


@contextmanager
def file_lock(path: Union[str, os.PathLike], wait: bool = True,
              strict: bool = False, follow_links: bool = True) -> Iterator[bool]:
    r"""Holds an exclusive advisory lock (``fcntl.flock``) on the file :obj:`path` (created if
    missing, never removed) for the ``with`` block and yields :obj:`True`, waiting for another
    process that holds it; with :obj:`wait` false, yields :obj:`False` at once (holding
    nothing) when another process holds it. The lock dies with its process. Where no lock can
    be had, the block runs unlocked (and :obj:`True` is yielded): without ``fcntl`` (Windows),
    where the file cannot be created (a read-only folder, e.g. a dataset cache shared
    read-only) or the file system refuses locks; with :obj:`strict`, those last two raise the
    :class:`OSError` instead (where two processes must not share the work the lock guards).
    With :obj:`follow_links` false, a symbolic link at :obj:`path` is not followed (nothing
    outside its folder is opened or created, as a dangling link's target was): the lock counts
    as one that cannot be had (a dataset's processed cache copied from elsewhere, with links).
    As :func:`folder_lock`'s, the lock dies with its process: a child made by ``fork``
    meanwhile (a loader worker) neither keeps it held nor gives it back leaving the block."""
    fd = None
    busy = False
    pid = os.getpid()
    if fcntl is not None:
        try:
            path = os.fspath(path)
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            nofollow = 0 if follow_links else getattr(os, 'O_NOFOLLOW', 0)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | nofollow, 0o644)
            _held_files.add(fd)  # (before the lock: a fork while it waits copies it too)
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BaseException as e:  # (also an interrupt while waiting: no file left open)
            if fd is not None:
                _held_files.discard(fd)
                os.close(fd)
            fd = None
            busy = isinstance(e, BlockingIOError)  # another process holds it; not waiting
            if not isinstance(e, OSError) or (strict and not busy):
                raise
    if busy:
        yield False
        return
    try:
        yield True
    finally:
        # (a forked child leaving the block: its copy, closed at the fork, was its parent's
        # open file, whose unlocking gave the lock away under the parent)
        if fd is not None and os.getpid() == pid:
            _held_files.discard(fd)
            try:  # (a forked child's copy of the descriptor would otherwise keep it held)
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)  # releases the lock


#: The descriptors of the locks this process holds (or waits for) with :func:`file_lock`
#: (a set's ``add`` and ``discard`` are atomic: no lock of its own)
_held_files: Set[int] = set()


def _forget_held_files() -> None:
    r"""In a child made by ``fork``: closes its copies of the descriptors of
    :func:`file_lock`'s locks, which are its parent's (a copy kept the lock held after the
    parent had died, killed, for as long as the child lived), as :func:`_forget_held_folders`
    does for :func:`folder_lock`'s."""
    for fd in list(_held_files):
        with contextlib.suppress(OSError):
            os.close(fd)  # (the parent's lock stays: its own descriptor holds it)
    _held_files.clear()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_forget_held_files)


class FolderInUseError(OSError):
    r"""A folder that another process (or another thread of this one) holds with
    :func:`folder_lock`: a run training there. Its message names the folder; ``filename`` is
    the folder."""
    def __init__(self, message: str, folder: str):
        super().__init__(message)
        self.message = message
        self.filename = folder

    def __str__(self) -> str:  # (OSError's names the file as '[Errno None] None: <file>')
        return self.message

    def __reduce__(self) -> Any:  # (to another process: a loader worker's, a study's worker's)
        return type(self), (self.message, self.filename)


#: The folders this process holds with :func:`folder_lock`: (device, inode) -> [the holding
#: thread, how many holds it has, the descriptor that holds the lock] (a lock held again by
#: its own thread is granted; a descriptor's ``flock`` would conflict with the one it holds
#: already)
_held_folders: Dict[Tuple[int, int], List[int]] = {}
_held_folders_lock = threading.Lock()


def _forget_held_folders() -> None:
    r"""In a child made by ``fork`` (a loader worker, a ``multiprocessing`` process): closes
    its copies of the descriptors that hold :func:`folder_lock`'s locks, and forgets the holds,
    which are its parent's. A copy kept the lock held after the parent had died (killed: a
    folder refused to the next run for as long as a worker lived), and the child, whose thread
    bears the forking thread's id, was granted the parent's folder as a nested hold."""
    global _held_folders_lock
    _held_folders_lock = threading.Lock()  # (another thread may have held it at the fork)
    for entry in _held_folders.values():
        with contextlib.suppress(OSError):
            os.close(entry[2])  # (the parent's lock stays: its own descriptor holds it)
    _held_folders.clear()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_forget_held_folders)


@contextmanager
def folder_lock(folder: Union[str, os.PathLike], busy: str = '') -> Iterator[None]:
    r"""Holds an exclusive advisory lock (``fcntl.flock``) on the folder :obj:`folder` itself
    (no lock file: nothing is added to it; made if missing, and removed again at the end if
    it was made here and is still empty, as are the empty folders above it made for it, but
    not where it is refused: another holds it) for the ``with`` block, without waiting: where
    another process, or another thread of this one, holds it, :class:`FolderInUseError`
    naming the folder, followed by :obj:`busy` (what to do). The thread that holds it may take
    it again (nested holds). A symbolic link is followed: two names of one folder are one
    lock. The lock dies with its process: a child made by ``fork`` meanwhile (a loader worker)
    neither holds it nor keeps it held. Where no lock can be had (without ``fcntl``, on a
    file system that refuses locks on folders) the block runs unlocked, as
    :func:`file_lock`'s does."""
    folder = os.fspath(folder)
    here = os.getcwd()  # (the folders made here, absolute but not normalised: 'link/../x')
    made = [os.path.join(here, path) for path in _make_folders(folder)]
    fd, key = None, None
    pid = os.getpid()
    refused = False
    try:
        if fcntl is not None:
            try:
                fd, key = _lock_folder(folder, busy)
            except FolderInUseError:
                refused = True  # (held by another, which may have found it as this one made it)
                raise
        yield
    finally:
        if os.getpid() == pid:  # (a forked child leaving the block: the hold is its parent's)
            try:
                # a run refused, or stopped before its first file: no empty folder, nor the
                # empty folders above it made for it ('runs/max/' after a mistyped option);
                # none where another holds the folder (its own files are still to come)
                for path in made if not refused else ():
                    try:
                        os.rmdir(path)  # (only where still empty)
                    except OSError:
                        break
            finally:
                _release_folder(fd, key)


def _make_folders(folder: str) -> List[str]:
    r"""Makes :obj:`folder` and the folders above it that are missing, as
    ``os.makedirs(folder, exist_ok=True)`` does, and returns those this call made, the deepest
    first: not one that another process made meanwhile (it was taken for one made here where
    the missing folders were listed first, and removed at the end). A folder above removed by
    another process meanwhile (one that made it, ending) is made again."""
    head, tail = os.path.split(folder)
    if not tail:  # ('runs/x/')
        head, tail = os.path.split(head)
    above: List[str] = []
    for _ in range(8):
        try:
            os.mkdir(folder)
        except FileNotFoundError:  # (a folder above missing)
            if not head or not tail or head == folder:
                raise
            above = _make_folders(head) + above
            continue
        except OSError:
            if not os.path.isdir(folder):  # (a file there, or a folder that cannot be made)
                raise
            return above
        return [folder] + above
    os.makedirs(folder, exist_ok=True)  # (removed above it eight times over: its error)
    return above


def _lock_folder(folder: str, busy: str) -> Tuple[Optional[int], Optional[Tuple[int, int]]]:
    r"""Takes :func:`folder_lock`'s lock on :obj:`folder`: the descriptor holding it (:obj:`None`
    for a nested hold, or where no lock can be had) and the folder's key in
    :data:`_held_folders` (:obj:`None` where no lock is held)."""
    def refuse(by: str) -> FolderInUseError:
        return FolderInUseError(f"'{folder}' is in use by {by} (a run writing its files "
                                f"there)" + (f': {busy}' if busy else ''), folder)
    for _ in range(8):  # (the folder removed and made again meanwhile: taken again)
        fd = os.open(folder, os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0))
        keep = False  # (the descriptor that holds the lock stays open)
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            with _held_folders_lock:
                held = _held_folders.get(key)
                if held is not None:
                    if held[0] != threading.get_ident():
                        raise refuse('another thread of this process')
                    held[1] += 1
                    return None, key
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise refuse('another process') from None
                except OSError:  # (a file system without locks on folders: unlocked)
                    return None, None
                try:
                    now: Optional[os.stat_result] = os.stat(folder)
                except FileNotFoundError:
                    now = None
                if now is not None and (now.st_dev, now.st_ino) == key:
                    _held_folders[key] = [threading.get_ident(), 1, fd]
                    keep = True
                    return fd, key
            # removed (and perhaps made again) between the open and the lock: a lock on the
            # folder that was there is none on the one there now
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            if not keep:
                os.close(fd)
        os.makedirs(folder, exist_ok=True)
    return None, None  # (made and removed again eight times over: run unlocked)


def _release_folder(fd: Optional[int], key: Optional[Tuple[int, int]]) -> None:
    r"""Gives back a hold that :func:`_lock_folder` returned."""
    if key is None:
        return
    with _held_folders_lock:
        held = _held_folders[key]
        held[1] -= 1
        if held[1] == 0:
            del _held_folders[key]
    if fd is not None:
        try:  # (a forked child's copy of the descriptor, a loader worker's, would keep it held)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def atomic_write(path: Union[str, os.PathLike], write: Callable[[Any], None],
                 binary: bool = True,
                 before_replace: Optional[Callable[[], None]] = None,
                 follow_links: bool = True, overwrite: bool = True) -> None:
    r"""Calls ``write(file)`` on a new temporary file next to ``path`` (created with the usual
    permissions, i.e. subject to the umask; those of a file it replaces are kept), flushes it
    to disk and moves it over ``path`` with :func:`os.replace`, then flushes the folder, so
    that the new name survives a power cut too. A symbolic link at ``path`` is written through
    (its target is replaced, the link kept), or with :obj:`follow_links` false replaced by the
    file (nothing outside the folder of ``path`` is written). On any failure (also
    :class:`KeyboardInterrupt`) the temporary file is removed and an existing file at ``path``
    is left untouched; an :class:`OSError` (a full disk, a folder that cannot be written) is
    raised naming ``path``, not the temporary file or no file.

    Args:
        path (str or os.PathLike): The file to write.
        write (callable): Called once with the open temporary file.
        binary (bool, optional): Open the file in binary mode, else as UTF-8 text.
            (default: :obj:`True`)
        before_replace (callable, optional): Called with no arguments once the temporary file
            is complete, just before it replaces ``path``. (default: :obj:`None`)
        follow_links (bool, optional): Write through a symbolic link at ``path``, else replace
            the link itself (for files a folder owns, such as a dataset's processed cache, which
            a folder copied from elsewhere may hold as links to files outside it).
            (default: :obj:`True`)
        overwrite (bool, optional): Replace a file at ``path``; else a file there when the new
            one is complete (one another process made meanwhile) is left as it is and
            :class:`FileExistsError` names ``path``: the new file takes the name only where
            none is there, in one step (a hard link, or where the file system has none, the
            name taken with ``O_EXCL`` first). (default: :obj:`True`)
    """
    path = os.fspath(path)
    link = os.path.islink(path)
    if link and follow_links:  # write through the link (replacing it would drop it)
        path = os.path.realpath(path)
        link = False
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # secrets, not random: writing a file must not advance the seeded random streams
    stem = _temp_stem(os.path.basename(path))
    tmp = os.path.join(directory, f'.{stem}.{secrets.token_hex(6)}.tmp')
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        named = _naming(e, path, tmp)
        if named is None:
            raise
        raise named from e
    try:
        with os.fdopen(fd, 'wb' if binary else 'w', encoding=None if binary else 'utf-8') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileNotFoundError):  # the replaced file's permissions
            if not link:  # (not those of a link's target, which is left alone)
                os.chmod(tmp, os.stat(path).st_mode & 0o777)  # (not setuid, setgid, sticky)
        if before_replace is not None:
            before_replace()
        if overwrite:
            os.replace(tmp, path)
        else:
            _move_if_absent(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        named = _naming(e, path, tmp) if isinstance(e, OSError) else None
        if named is None:
            raise
        raise named from e
    _sync_folder(directory)


def _move_if_absent(tmp: str, path: str) -> None:
    r"""Moves the complete file :obj:`tmp` to :obj:`path` where nothing is there
    (:class:`FileExistsError` naming :obj:`path` otherwise, :obj:`tmp` left for the caller):
    :func:`os.replace` replaced a file another process had made since the caller looked."""
    try:
        os.link(tmp, path)  # (fails where the name is taken: atomic)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path) from None
    except OSError:
        # no hard links here (FAT, some network file systems; the error numbers vary: EPERM
        # on Linux, EINVAL on Windows): the name taken first, then the file moved over the
        # empty one taken (a folder that cannot be written refuses that too, with its error)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path) from None
        try:
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)  # (the empty file taken for the name)
            raise
        return
    os.unlink(tmp)


def _naming(error: OSError, path: str, tmp: str) -> Optional[OSError]:
    r""":obj:`error`, raised writing :obj:`path` through its temporary file :obj:`tmp`, as one
    that names :obj:`path`: a failed write, flush or ``fsync`` (a full disk: ``[Errno 28] No
    space left on device``) names no file, a refused temporary file the hidden
    ``.<name>.<hex>.tmp``. :obj:`None` for an error without an error number or naming another
    file (raised as it is)."""
    if error.errno is None or error.filename not in (None, tmp):
        return None
    return OSError(error.errno, error.strerror or os.strerror(error.errno), path)


def _temp_stem(name: str) -> str:
    r"""The part of :obj:`name` that the temporary files of :func:`atomic_write` (and
    :func:`remove_stale_temp_files`) are named with: the name itself, or where it is longer than
    200 bytes (the temporary name adds 18 to a name's 255), its first 64 bytes (whole
    characters) and a hash of it."""
    encoded = os.fsencode(name)
    if len(encoded) <= 200:
        return name
    head = name[:64]
    while len(os.fsencode(head)) > 64:  # (64 characters of up to 4 bytes each)
        head = head[:-1]
    return head + '-' + hashlib.sha1(encoded).hexdigest()[:16]


def _sync_folder(directory: str) -> None:
    r"""Flushes a folder's entries to disk (POSIX; elsewhere, or where the file system refuses,
    nothing)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temp_files(directory: Union[str, os.PathLike], names,
                            min_age_s: float = 0.0) -> List[str]:
    r"""Removes the temporary files that :func:`atomic_write` left in :obj:`directory` for the
    files :obj:`names` when its process was killed mid-write (``SIGKILL``: no ``finally`` runs),
    and returns their names; with :obj:`min_age_s`, only those not modified for that many
    seconds. Call it only where no other process is writing those files (or with an age that
    no write in progress reaches)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return []
    patterns = [re.compile(re.escape(f'.{_temp_stem(name)}.') + r'[0-9a-f]{12}\.tmp')
                for name in names]
    removed = []
    now = time.time()
    for entry in sorted(os.listdir(directory)):
        if any(p.fullmatch(entry) for p in patterns):
            with contextlib.suppress(FileNotFoundError):
                path = os.path.join(directory, entry)
                if min_age_s > 0 and now - os.path.getmtime(path) < min_age_s:
                    continue
                os.unlink(path)
                removed.append(entry)
    return removed


def damaged_zip_member(path: Union[str, os.PathLike]) -> Optional[str]:
    r"""Why the zip archive ``path`` (the format :func:`torch.save` writes) does not read back
    as written: its first member whose data does not match the CRC-32 stored beside it, or
    :obj:`None`. ``torch.load`` reads a record without checking its CRC, so a changed bit in a
    tensor's data (a damaged disk or copy) would load as a changed weight, silently.

    Only a CRC that differs counts: a file that is not a zip archive (torch's legacy format, or
    one whose end is missing), one that Python's :mod:`zipfile` cannot read (a changed header
    field that ``torch.load`` ignores) and members stored without a CRC (written with
    ``torch.serialization.set_crc32_options(False)``) are left to ``torch.load``.
    """
    path = os.fspath(path)
    name = None
    try:
        if not zipfile.is_zipfile(path):
            return None
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.CRC == 0:  # (no CRC written; or an empty member, whose CRC is 0)
                    continue
                name = info.filename
                with archive.open(info) as f:  # raises BadZipFile where the CRC differs
                    while f.read(1 << 24):
                        pass
    except zipfile.BadZipFile as e:
        if name is not None and 'CRC' in str(e):
            return f'its record {name!r} does not read back as written ({e})'
        return None
    except Exception:  # what zipfile cannot read (torch.load reports what it cannot)
        return None
    return None


_weights_only_lock = threading.RLock()  # (re-entrant: a load inside a load)

#: The modules of the classes PyG puts on torch's weights-only allowlist that are data and tensor
#: types (their constructors store what they are given). PyG's other registered classes are left
#: out of a load: ``torch_geometric.loader.cluster.ClusterData`` reads a file the pickle names
#: (through PyG's ``fs.torch_load``, which retries with ``weights_only=False``), and the others
#: (``torch_geometric.llm``) are no data a checkpoint or processed file of this package holds.
PYG_DATA_MODULES = ('torch_geometric.data.', 'torch_geometric.edge_index',
                    'torch_geometric.index', 'torch_geometric.hash_tensor',
                    'torch_geometric.typing')


def _untrusted(entry: Any) -> bool:
    r"""Whether an entry of torch's allowlist is a class PyG registered that is not one of its
    data and tensor types (:data:`PYG_DATA_MODULES`)."""
    obj = entry[0] if isinstance(entry, tuple) else entry
    module = getattr(obj, '__module__', None) or ''
    return ((module == 'torch_geometric' or module.startswith('torch_geometric.'))
            and not (module + '.').startswith(PYG_DATA_MODULES))


def weights_only_load(path: Union[str, os.PathLike], map_location: Any = 'cpu',
                      allowed: Sequence[Any] = ()) -> Any:
    r"""``torch.load(path, weights_only=True)`` with torch's allowlist less the classes PyG put
    there that are not data or tensor types (:func:`_untrusted`), plus :obj:`allowed`.

    The weights-only unpickler calls every allowlisted class as a constructor, and importing
    ``torch_geometric.data`` registers PyG's classes, among them ``ClusterData``, whose
    constructor loads a file the pickle names through PyG's ``fs.torch_load``, which retries
    with ``weights_only=False``: a crafted checkpoint and a second file beside it ran code. So
    those entries are off the list for the load and back on it after (under a lock, so that
    this package's loads take turns; a load by another thread at the same moment does not find
    them either, and entries another thread adds meanwhile are kept). PyG's data and tensor
    types (``Data``, ``HeteroData``, ``EdgeIndex``, ``Index``, ...), torch's own entries and
    the user's stay allowed."""
    import torch
    serialization = torch.serialization
    with _weights_only_lock:
        saved = serialization.get_safe_globals()
        removed = [e for e in saved if _untrusted(e)]
        if not removed and not allowed:
            return torch.load(path, map_location=map_location, weights_only=True)
        serialization.clear_safe_globals()
        serialization.add_safe_globals([e for e in saved if not _untrusted(e)] + list(allowed))
        set_here = serialization.get_safe_globals()
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        finally:
            # what was there, and what another thread added meanwhile
            added = [e for e in serialization.get_safe_globals() if e not in set_here]
            serialization.clear_safe_globals()
            serialization.add_safe_globals(saved + [e for e in added if e not in saved])
