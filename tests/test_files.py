r"""The file helpers of :mod:`torch_mz._files`: the lock processes sharing files take turns with
(the atomic write is tested where its users are: checkpoints, dataset caches, the reproduction)."""
import contextlib
import os

import pytest


def test_file_lock_excludes_another_holder(tmp_path):
    import fcntl
    from torch_mz._files import file_lock
    path = tmp_path / 'sub' / '.lock'
    with file_lock(path):
        fd = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # held: another open file cannot take it
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the block
    finally:
        os.close(fd)


def test_file_lock_without_waiting_reports_another_holder(tmp_path):
    from torch_mz._files import file_lock
    path = tmp_path / '.lock'
    with file_lock(path) as held:
        assert held is True
        with file_lock(path, wait=False) as second:  # another open file: as another process
            assert second is False
    with file_lock(path, wait=False) as free:  # released with the first block
        assert free is True
        with file_lock(path, wait=False) as second:
            assert second is False


def test_file_lock_in_a_folder_that_cannot_be_written_runs_unlocked(tmp_path):
    from torch_mz._files import file_lock
    folder = tmp_path / 'read-only'
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):  # root writes anyway: the refusal is made here
            import errno
            from unittest import mock
            real_open = os.open

            def refused(path, *args, **kwargs):
                if str(path) == str(folder / '.lock'):
                    raise PermissionError(errno.EACCES, 'Permission denied', str(path))
                return real_open(path, *args, **kwargs)
            with mock.patch('os.open', refused):
                with file_lock(folder / '.lock'):
                    ran = True
        else:
            with file_lock(folder / '.lock'):
                ran = True
        assert ran and not (folder / '.lock').exists()
    finally:
        folder.chmod(0o700)


def test_file_lock_without_following_links_creates_nothing_outside_its_folder(tmp_path):
    # (a dataset's processed cache copied from elsewhere: a lock file there that is a dangling
    # link made every open of the dataset create the file it names, outside the cache)
    from torch_mz._files import file_lock
    outside = tmp_path / 'outside'
    outside.mkdir()
    folder = tmp_path / 'cache'
    folder.mkdir()
    (folder / 'data.lock').symlink_to(outside / 'new.lock')  # dangling
    with file_lock(folder / 'data.lock', follow_links=False) as held:
        assert held is True  # (run unlocked, as where the file cannot be created)
    assert list(outside.iterdir()) == [] and (folder / 'data.lock').is_symlink()
    with pytest.raises(OSError):
        with file_lock(folder / 'data.lock', strict=True, follow_links=False):
            pass
    assert list(outside.iterdir()) == []
    with file_lock(folder / 'plain.lock', follow_links=False) as held:  # a file: locked
        assert held is True and (folder / 'plain.lock').is_file()


def test_a_strict_file_lock_raises_where_no_lock_can_be_had(tmp_path, monkeypatch):
    # a file system that refuses locks: a dataset cache runs unlocked; a lock that keeps two
    # processes off the same training run (strict) raises instead
    import errno
    import fcntl
    from torch_mz import _files

    def refuse(fd, op):
        raise OSError(errno.ENOLCK, 'No locks available')
    monkeypatch.setattr(fcntl, 'flock', refuse)
    with _files.file_lock(tmp_path / '.lock') as held:
        assert held is True
    with pytest.raises(OSError, match='No locks available'):
        with _files.file_lock(tmp_path / '.lock', strict=True):
            pass


def flip_bit_in_record(path, suffix: str, at: int = 0) -> str:
    r"""Changes one bit of byte :obj:`at` of the data of the first member of the torch file
    (a zip archive) :obj:`path` whose name ends in :obj:`suffix`, in place; returns its name."""
    import struct
    import zipfile
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(suffix))
    with open(path, 'r+b') as f:
        f.seek(info.header_offset + 26)  # the local header's name and extra-field lengths
        name_len, extra_len = struct.unpack('<HH', f.read(4))
        f.seek(info.header_offset + 30 + name_len + extra_len + at)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0x01]))
    return info.filename


def test_damaged_zip_member_finds_a_changed_bit_torch_load_does_not(tmp_path):
    import torch
    from torch_mz._files import damaged_zip_member
    path = tmp_path / 'w.pt'
    torch.save({'w': torch.arange(1000.), 'b': torch.ones(3)}, path)
    assert damaged_zip_member(path) is None
    name = flip_bit_in_record(path, 'data/0', at=2000)  # the lowest bit of w[500]
    w = torch.load(path, weights_only=True)['w']
    assert w[500] != 500 and torch.equal(w[:500], torch.arange(500.))  # loaded, changed, silently
    assert damaged_zip_member(path) == (f"its record {name!r} does not read back as written "
                                        f"(Bad CRC-32 for file {name!r})")
    # files it cannot check are left to torch.load: torch's legacy format, no CRC written,
    # a file whose end is missing
    legacy = tmp_path / 'legacy.pt'
    torch.save({'w': torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    assert damaged_zip_member(legacy) is None
    no_crc = tmp_path / 'no_crc.pt'
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save({'w': torch.arange(1000.)}, no_crc)
    finally:
        torch.serialization.set_crc32_options(before)
    assert damaged_zip_member(no_crc) is None
    cut = tmp_path / 'cut.pt'
    cut.write_bytes(path.read_bytes()[:-100])
    assert damaged_zip_member(cut) is None


def test_damaged_zip_member_leaves_what_zipfile_cannot_read_to_torch(tmp_path):
    # a changed "version needed to extract" of the central directory: torch.load reads the file
    # as written, Python's zipfile refuses it (NotImplementedError); only a CRC that differs
    # counts (the check raised that error, and load_checkpoint with it)
    import zipfile

    import torch
    from torch_mz._files import damaged_zip_member
    path = tmp_path / 'w.pt'
    torch.save({'w': torch.arange(100.)}, path)
    with zipfile.ZipFile(path) as archive:
        start = archive.start_dir
    data = bytearray(path.read_bytes())
    data[start + 6] = 0x80  # version needed: 12.8
    path.write_bytes(bytes(data))
    assert torch.equal(torch.load(path, weights_only=True)['w'], torch.arange(100.))
    assert damaged_zip_member(path) is None


def test_file_lock_is_released_although_a_forked_child_holds_the_descriptor(tmp_path):
    # flock locks belong to the open file: a child forked inside the block kept it held
    import multiprocessing
    import time
    from torch_mz._files import file_lock
    if not hasattr(os, 'fork'):
        pytest.skip('no fork here')
    path = str(tmp_path / 'x.lock')
    with file_lock(path) as held:
        assert held
        child = multiprocessing.get_context('fork').Process(target=time.sleep, args=(3, ))
        child.start()
    try:
        with file_lock(path, wait=False) as again:
            assert again
    finally:
        child.terminate()
        child.join()


@pytest.mark.skipif(not hasattr(os, 'fork'), reason='no fork here')
def test_file_lock_is_not_kept_by_a_forked_child_of_a_killed_holder(tmp_path):
    # a child made by fork inside the block (a DataLoader worker) kept its copy of the locking
    # descriptor: the lock outlived its killed holder for as long as the child lived (the
    # folder_lock fix, not applied to file_lock)
    import signal
    import time
    from torch_mz._files import file_lock
    path = str(tmp_path / 'x.lock')
    read, write = os.pipe()
    holder = os.fork()
    if holder == 0:  # holds the lock, forks a worker, says its pid and is killed (no finally)
        try:
            os.close(read)
            with file_lock(path):
                worker = os.fork()
                if worker == 0:
                    time.sleep(30)  # (a loader worker that outlives its parent a while)
                    os._exit(0)
                os.write(write, f'{worker}\n'.encode())
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    os.close(write)
    with os.fdopen(read) as said:
        worker = int(said.readline())
    try:
        os.waitpid(holder, 0)
        os.kill(worker, 0)  # (the worker lives)
        with file_lock(path, wait=False) as taken:
            assert taken
    finally:
        os.kill(worker, signal.SIGKILL)


@pytest.mark.skipif(not hasattr(os, 'fork'), reason='no fork here')
def test_file_lock_stays_held_when_a_forked_child_leaves_the_block(tmp_path):
    # the child's copy of the descriptor is that of the parent's open file: a child leaving
    # the block unlocked it, giving the lock away under its parent
    from torch_mz._files import file_lock
    path = str(tmp_path / 'x.lock')
    parent = os.getpid()
    try:
        with file_lock(path) as held:
            assert held
            child = os.fork()
            if child != 0:
                assert os.waitpid(child, 0)[1] == 0  # (it has left the block)
                with file_lock(path, wait=False) as taken:
                    assert not taken  # still the parent's
    finally:
        if os.getpid() != parent:
            os._exit(0)


def test_atomic_write_takes_the_longest_file_names(tmp_path):
    from torch_mz._files import atomic_write
    path = tmp_path / ('x' * 250)
    atomic_write(str(path), lambda f: f.write(b'data'))
    assert path.read_bytes() == b'data' and os.listdir(tmp_path) == [path.name]


def test_stale_temp_files_of_long_names_are_found_and_four_byte_names_written(tmp_path):
    # a name over 200 bytes is written through a shortened temporary name, which
    # remove_stale_temp_files looked for under the whole name (never finding it); and the
    # shortened name took 64 characters, past 255 bytes for a name of 4-byte characters
    import signal
    from torch_mz._files import atomic_write, remove_stale_temp_files
    for name in ('x' * 250, 'short.pt', '\U0001F600' * 60):
        pid = os.fork()
        if pid == 0:  # killed mid-write (SIGKILL: no finally runs), leaving its temporary file
            try:
                atomic_write(str(tmp_path / name), lambda f: os.kill(os.getpid(), signal.SIGKILL))
            finally:
                os._exit(1)
        os.waitpid(pid, 0)
        assert len(os.listdir(tmp_path)) == 1
        removed = remove_stale_temp_files(tmp_path, [name])
        assert len(removed) == 1 and os.listdir(tmp_path) == []
        atomic_write(str(tmp_path / name), lambda f: f.write(b'data'))
        assert (tmp_path / name).read_bytes() == b'data' and os.listdir(tmp_path) == [name]
        os.unlink(tmp_path / name)


class _Payload:  # a plain pickle that runs code, in the file ClusterData is led to load
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')", ))


class _Graph:
    def __reduce__(self):
        import torch
        from torch_geometric.data import Data
        return (Data, (None, torch.zeros(2, 1, dtype=torch.long)))


class _Cluster:  # a class importing torch_geometric.data puts on torch's allowlist
    def __init__(self, save_dir):
        self.save_dir = str(save_dir)

    def __reduce__(self):
        from torch_geometric.loader import ClusterData
        return (ClusterData, (_Graph(), 1, False, self.save_dir, 'payload.pt', False))


def _crafted(tmp_path, wrap):
    r"""A torch file whose weights-only load under PyG's allowlist constructs ``ClusterData``,
    which loads ``part_1/payload.pt`` beside it through PyG's ``fs.torch_load``, which retries
    with ``weights_only=False``: the payload's code runs (it did before
    :func:`~torch_mz._files.weights_only_load`)."""
    import torch
    marker = tmp_path / 'ran'
    (tmp_path / 'part_1').mkdir()
    torch.save(_Payload(marker), tmp_path / 'part_1' / 'payload.pt')
    path = tmp_path / 'crafted.pt'
    torch.save(wrap(_Cluster(tmp_path)), path)
    return path, marker


def test_checkpoint_load_does_not_call_classes_other_packages_allow(tmp_path):
    import torch
    import torch_geometric.data  # noqa: F401 - registers PyG's classes process-wide
    from torch_mz.train.checkpoint import CheckpointError, load_checkpoint
    path, marker = _crafted(tmp_path, lambda obj: {'format': 'torch_mz.train', 'x': obj})
    before = torch.serialization.get_safe_globals()
    assert any('ClusterData' in str(g) for g in before)  # the class the crafted file calls
    with pytest.raises(CheckpointError, match='ClusterData'):
        load_checkpoint(path)
    assert not marker.exists()
    assert set(torch.serialization.get_safe_globals()) == set(before)  # restored after the load


def test_processed_load_does_not_call_classes_other_packages_allow(tmp_path):
    import torch
    from torch_geometric.data import Data
    from torch_mz.datasets.common import ProcessedFileError, load_processed
    path, marker = _crafted(tmp_path, lambda obj: ({'x': obj}, {}, Data))
    before = torch.serialization.get_safe_globals()
    with pytest.raises(ProcessedFileError) as info:
        load_processed(str(path))
    assert info.value.unsafe and not marker.exists()
    assert set(torch.serialization.get_safe_globals()) == set(before)
    # a processed file of PyG data still loads, and the list is restored after a success too
    good = tmp_path / 'good.pt'
    torch.save(({'x': torch.ones(2)}, {}, Data), good)
    loaded = load_processed(str(good))
    assert loaded[2] is Data and torch.equal(loaded[0]['x'], torch.ones(2))
    assert set(torch.serialization.get_safe_globals()) == set(before)


def test_atomic_write_keeps_permissions_and_writes_through_a_link(tmp_path):
    # it replaced a file with one of default permissions, and a symbolic link with a file
    from torch_mz._files import atomic_write
    target = tmp_path / 'data' / 'results.json'
    target.parent.mkdir()
    target.write_text('old')
    os.chmod(target, 0o600)
    atomic_write(target, lambda f: f.write('new'), binary=False)
    assert target.read_text() == 'new' and (os.stat(target).st_mode & 0o777) == 0o600
    link = tmp_path / 'link.json'
    link.symlink_to(target)
    atomic_write(link, lambda f: f.write('through'), binary=False)
    assert link.is_symlink() and target.read_text() == 'through'
    assert (os.stat(target).st_mode & 0o777) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ['results.json']  # no temp left


def test_atomic_write_replaces_a_link_without_following_it_where_asked(tmp_path):
    # (a dataset's processed cache: a folder copied from elsewhere may hold links to files
    # outside it, which a rebuild must not write)
    from torch_mz._files import atomic_write
    target = tmp_path / 'elsewhere' / 'checkpoint.pt'
    target.parent.mkdir()
    target.write_bytes(b'keep')
    os.chmod(target, 0o600)
    folder = tmp_path / 'cache'
    folder.mkdir()
    (folder / 'data.pt').symlink_to(target)
    (folder / 'stats.json').symlink_to(tmp_path / 'elsewhere' / 'new.json')  # dangling
    atomic_write(folder / 'data.pt', lambda f: f.write(b'data'), follow_links=False)
    atomic_write(folder / 'stats.json', lambda f: f.write('{}'), binary=False,
                 follow_links=False)
    assert not (folder / 'data.pt').is_symlink() and (folder / 'data.pt').read_bytes() == b'data'
    assert not (folder / 'stats.json').is_symlink()
    assert (folder / 'stats.json').read_text() == '{}'
    assert target.read_bytes() == b'keep' and (os.stat(target).st_mode & 0o777) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ['checkpoint.pt']
    assert sorted(p.name for p in folder.iterdir()) == ['data.pt', 'stats.json']


def test_pyg_data_and_tensor_types_still_load(tmp_path):
    # the first form of the fix left out every class torch and PyG had registered: a processed
    # file holding PyG's EdgeIndex, or a checkpoint with torch's nested tensors, was refused
    import torch
    from torch_geometric import EdgeIndex
    from torch_geometric.data import Data

    from torch_mz._files import weights_only_load
    from torch_mz.datasets.common import load_processed
    path = tmp_path / 'processed.pt'
    edges = EdgeIndex(torch.tensor([[0, 1], [1, 0]]), sparse_size=(2, 2))
    torch.save(({'x': torch.ones(2), 'edge_index': edges}, {}, Data), path)
    loaded = load_processed(str(path))
    assert isinstance(loaded[0]['edge_index'], EdgeIndex)
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    torch.save({'n': nested}, tmp_path / 'nested.pt')
    assert weights_only_load(tmp_path / 'nested.pt')['n'].is_nested


def test_atomic_write_names_the_file_it_could_not_write(tmp_path, monkeypatch):
    # a full disk said '[Errno 28] No space left on device' and no file; a refused temporary
    # file named the hidden '.<name>.<hex>.tmp'
    import errno
    from torch_mz._files import atomic_write
    path = tmp_path / 'checkpoint.pt'
    atomic_write(path, lambda f: f.write(b'earlier'))

    def full(f):
        f.write(b'half')
        raise OSError(errno.ENOSPC, 'No space left on device')
    with pytest.raises(OSError) as failed:
        atomic_write(path, full)
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(path)
    assert str(failed.value) == f"[Errno 28] No space left on device: '{path}'"
    real_open = os.open

    def refused(name, *args, **kwargs):
        if str(name).endswith('.tmp'):
            raise PermissionError(errno.EACCES, 'Permission denied', name)
        return real_open(name, *args, **kwargs)
    monkeypatch.setattr(os, 'open', refused)
    with pytest.raises(PermissionError) as failed:
        atomic_write(path, lambda f: f.write(b'new'))
    monkeypatch.undo()
    assert failed.value.filename == str(path), failed.value
    with pytest.raises(OSError, match='^disk full$'):  # (no error number: as it came)
        atomic_write(path, lambda f: (_ for _ in ()).throw(OSError('disk full')))
    assert os.listdir(tmp_path) == ['checkpoint.pt'] and path.read_bytes() == b'earlier'


#: Run by another Python process: holds an exclusive flock on the folder argv[1] (what
#: ``folder_lock`` takes) until its stdin closes.
_HOLD_FOLDER = r'''
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print('held', flush=True)
sys.stdin.read()
'''


@contextlib.contextmanager
def held_by_another_process(folder):
    r"""Another process holds the folder :obj:`folder` (made if missing) as a run training there
    does (:func:`torch_mz._files.folder_lock`) for the ``with`` block."""
    import subprocess
    import sys
    os.makedirs(folder, exist_ok=True)
    holder = subprocess.Popen([sys.executable, '-c', _HOLD_FOLDER, str(folder)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == 'held\n'
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_folder_lock_refuses_a_folder_another_process_or_thread_holds(tmp_path):
    import threading
    from torch_mz._files import FolderInUseError, folder_lock
    run = tmp_path / 'run'
    with held_by_another_process(run):
        with pytest.raises(FolderInUseError, match=f"^'{run}' is in use by another process "
                                                   f"\\(a run writing its files there\\): wait$"):
            with folder_lock(run, busy='wait'):
                pass
        link = tmp_path / 'link'  # another name of the folder: the same lock
        os.symlink(run, link)
        with pytest.raises(FolderInUseError) as refused:
            with folder_lock(link):
                pass
        assert refused.value.filename == str(link) and isinstance(refused.value, OSError)
    with folder_lock(run):  # given back with its process
        with folder_lock(str(run) + os.sep):  # the thread that holds it: taken again
            pass
        failed = []

        def other_thread():
            try:
                with folder_lock(run):
                    pass
            except FolderInUseError as e:
                failed.append(str(e))
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert failed == [f"'{run}' is in use by another thread of this process (a run writing "
                          f"its files there)"]
    assert sorted(os.listdir(run)) == []  # nothing added to the folder: no lock file
    made = tmp_path / 'new' / 'run'
    with folder_lock(made):
        assert made.is_dir()
    assert not made.exists()  # made for the hold, and left empty: removed again
    with folder_lock(made):
        (made / 'result.json').write_text('{}')
    assert (made / 'result.json').exists()
    import pickle
    again = pickle.loads(pickle.dumps(FolderInUseError('in use', 'run')))
    assert (str(again), again.filename) == ('in use', 'run')


#: Run by another Python process: holds the folder argv[1] with ``folder_lock``, forks a child
#: (as a loader worker is made) that reports whether it may take the folder itself and then
#: waits on its stdin, and dies without giving the folder back (killed, as by the OOM killer).
_FORK_AND_DIE = r'''
import os, sys
from torch_mz._files import FolderInUseError, folder_lock
with folder_lock(sys.argv[1]):
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        try:
            with folder_lock(sys.argv[1]):
                said = b'taken\n'
        except FolderInUseError as e:
            said = str(e).encode() + b'\n'
        os.write(write, said)
        sys.stdin.read()  # (a loader worker that outlives its parent a while)
        os._exit(0)
    os.close(write)
    print(os.read(read, 1000).decode(), end='', flush=True)
    os._exit(0)
'''


@pytest.mark.skipif(not hasattr(os, 'fork'), reason='no fork here')
def test_folder_lock_is_neither_held_nor_kept_by_a_forked_child(tmp_path):
    # a child made by fork (a DataLoader worker) kept its copy of the locking descriptor: the
    # lock outlived its killed process, refusing the next run while the child lived; and the
    # child, whose thread bears the forking thread's id, was granted the parent's folder
    import subprocess
    import sys
    from torch_mz._files import folder_lock
    run = tmp_path / 'run'
    run.mkdir()
    proc = subprocess.Popen([sys.executable, '-c', _FORK_AND_DIE, str(run)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        said = proc.stdout.readline()
        assert proc.wait(timeout=30) == 0
        assert said == f"'{run}' is in use by another process (a run writing its files there)\n"
        with folder_lock(run):  # the parent has died; its forked child still lives
            pass
    finally:
        proc.stdin.close()  # (the child ends)


@pytest.mark.parametrize('links', [True, False])
def test_atomic_write_without_overwrite_leaves_a_file_made_meanwhile(tmp_path, monkeypatch,
                                                                     links):
    # a file made by another process after the caller had looked (here: while the new one was
    # written) was replaced; without hard links the name is taken with O_EXCL first
    import errno
    from torch_mz._files import atomic_write
    if not links:
        def no_link(*args, **kwargs):
            raise OSError(errno.EPERM, 'Operation not permitted')
        monkeypatch.setattr(os, 'link', no_link)
    path = tmp_path / 'p.csv'

    def write(f):
        path.write_text('theirs')  # (another process, meanwhile)
        f.write('mine')
    with pytest.raises(FileExistsError) as refused:
        atomic_write(path, write, binary=False, overwrite=False)
    assert refused.value.filename == str(path)
    assert path.read_text() == 'theirs' and os.listdir(tmp_path) == ['p.csv']
    path.unlink()
    atomic_write(path, lambda f: f.write('mine'), binary=False, overwrite=False)
    assert path.read_text() == 'mine' and os.listdir(tmp_path) == ['p.csv']
    atomic_write(path, lambda f: f.write('again'), binary=False)  # (overwrite: replaced)
    assert path.read_text() == 'again'


def test_folder_lock_removes_the_empty_folders_it_made_above_its_folder(tmp_path):
    # the folder made for the hold was removed again, the folders made above it were not: a
    # command refused for a mistyped option left 'runs/max/' behind
    from torch_mz._files import folder_lock
    (tmp_path / 'kept').mkdir()
    with folder_lock(tmp_path / 'kept' / 'a' / 'b' / 'run'):
        assert (tmp_path / 'kept' / 'a' / 'b' / 'run').is_dir()
    assert os.listdir(tmp_path) == ['kept'] and os.listdir(tmp_path / 'kept') == []
    with folder_lock(tmp_path / 'new' / 'run'):
        (tmp_path / 'new' / 'notes.txt').write_text('mine')  # (not empty: kept)
    assert os.listdir(tmp_path / 'new') == ['notes.txt']


def test_atomic_write_without_overwrite_where_hard_links_fail_otherwise(tmp_path, monkeypatch):
    # only some error numbers of os.link were taken for "no hard links here": Windows gives
    # EINVAL for a FAT or exFAT drive ("[WinError 1] Incorrect function") and for a share that
    # has none, and predict failed there without writing its file; any other error of the link
    # now takes the name with O_EXCL (which raises where the folder cannot be written)
    import errno
    from torch_mz._files import atomic_write

    def no_link(*args, **kwargs):
        raise OSError(errno.EINVAL, 'Incorrect function')
    monkeypatch.setattr(os, 'link', no_link)
    path = tmp_path / 'p.csv'
    atomic_write(path, lambda f: f.write('mine'), binary=False, overwrite=False)
    assert path.read_text() == 'mine' and os.listdir(tmp_path) == ['p.csv']
    with pytest.raises(FileExistsError) as refused:  # (still not over a file there)
        atomic_write(path, lambda f: f.write('again'), binary=False, overwrite=False)
    assert refused.value.filename == str(path)
    assert path.read_text() == 'mine' and os.listdir(tmp_path) == ['p.csv']


def test_folder_lock_removes_no_folder_made_by_another_meanwhile(tmp_path, monkeypatch):
    # the folders to remove at the end were those missing when folder_lock looked, not those it
    # made: a folder another process (or the user) made between the look and os.makedirs was
    # taken for one made here, and removed where it was still empty
    from torch_mz._files import folder_lock
    mkdir, theirs = os.mkdir, tmp_path / 'a'

    def meanwhile(path, *args, **kwargs):
        if not theirs.exists():
            mkdir(theirs)  # (another process, once)
        return mkdir(path, *args, **kwargs)
    monkeypatch.setattr(os, 'mkdir', meanwhile)
    with folder_lock(tmp_path / 'a' / 'b' / 'run'):
        assert (tmp_path / 'a' / 'b' / 'run').is_dir()
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ['a'] and os.listdir(theirs) == []  # (theirs kept)


def test_folder_lock_makes_its_folder_where_another_removes_the_one_above(tmp_path, monkeypatch):
    # another command ending (refused) removes the empty folder above its own that it made,
    # between this one's making that folder and its own inside it: os.makedirs then failed
    # with FileNotFoundError; the folder above is made again
    from torch_mz._files import folder_lock
    mkdir, above, removed = os.mkdir, tmp_path / 'runs', []

    def meanwhile(path, *args, **kwargs):
        if os.fspath(path).endswith('run') and above.is_dir() and not removed:
            above.rmdir()  # (the other command's cleanup, once)
            removed.append(True)
        return mkdir(path, *args, **kwargs)
    monkeypatch.setattr(os, 'mkdir', meanwhile)
    with folder_lock(above / 'run'):
        assert (above / 'run').is_dir()
    monkeypatch.undo()
    assert removed and os.listdir(tmp_path) == []  # (made here, both removed again)


def test_folder_lock_refused_leaves_the_holders_folder(tmp_path, monkeypatch):
    # two commands given the same new --out: each found it missing, the one that was refused
    # removed the (still empty) folder the other held, which then wrote its files into a folder
    # made again, that it did not hold (a third command could take it)
    import threading
    import torch_mz._files as files
    run, lock_folder = tmp_path / 'run', files._lock_folder
    taken, done, errors = threading.Event(), threading.Event(), []

    def other_command():
        try:
            with files.folder_lock(run):  # (another thread stands for another process)
                taken.set()
                done.wait(30)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
            taken.set()

    def racing(folder, busy):  # the other command takes the folder this one made
        if hasattr(racing, 'thread'):  # (the other command's own call)
            return lock_folder(folder, busy)
        thread = threading.Thread(target=other_command)
        racing.thread = thread
        thread.start()
        taken.wait(30)
        return lock_folder(folder, busy)
    monkeypatch.setattr(files, '_lock_folder', racing)
    try:
        with pytest.raises(files.FolderInUseError):
            with files.folder_lock(run):
                pass  # pragma: no cover - refused
        assert not errors and run.is_dir()  # the holder's folder is left
        held = os.stat(run).st_ino
    finally:
        done.set()
        racing.thread.join(30)
    assert os.stat(run).st_ino == held
