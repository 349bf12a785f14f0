r"""The file helpers of :mod:`torch_mz._files`: the lock processes sharing files take turns with
(the atomic write is tested where its users are: checkpoints, dataset caches, the reproduction)."""
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
        if os.access(folder, os.W_OK):  # (root may write anyway)
            pytest.skip('the folder is writable for this user')
        with file_lock(folder / '.lock'):
            ran = True
        assert ran and not (folder / '.lock').exists()
    finally:
        folder.chmod(0o700)


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
