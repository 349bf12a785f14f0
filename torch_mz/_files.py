r"""Writing files so that an interrupted write never leaves a partial file behind: the one helper
that checkpoints, training logs and processed dataset caches are written with."""
import os
import secrets
from typing import Any, Callable, Union


def atomic_write(path: Union[str, os.PathLike], write: Callable[[Any], None],
                 binary: bool = True) -> None:
    r"""Calls ``write(file)`` on a new temporary file next to ``path`` (created with the usual
    permissions, i.e. subject to the umask), flushes it to disk and moves it over ``path`` with
    :func:`os.replace`. On any failure (also :class:`KeyboardInterrupt`) the temporary file is
    removed and an existing file at ``path`` is left untouched.

    Args:
        path (str or os.PathLike): The file to write.
        write (callable): Called once with the open temporary file.
        binary (bool, optional): Open the file in binary mode, else as UTF-8 text.
            (default: :obj:`True`)
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # secrets, not random: writing a file must not advance the seeded random streams
    tmp = os.path.join(directory, f'.{os.path.basename(path)}.{secrets.token_hex(6)}.tmp')
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, 'wb' if binary else 'w', encoding=None if binary else 'utf-8') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
