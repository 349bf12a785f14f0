r"""Process-wide settings that make CPU training and inference faster.

Opt-in: a library does not change its host process's memory allocator unasked. ``torch-mz``'s
commands turn :func:`keep_freed_memory` on for their own process (``--no-keep-freed-memory``
turns it off), and the operator benchmarks measure with and without it.
"""
import ctypes
import functools
import numbers
import os
import platform
from typing import Optional

__all__ = ['keep_freed_memory', 'freed_memory_kept', 'glibc', 'MAX_BLOCK_BYTES', 'KEEP_BYTES']

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from malloc's heap (glibc's own limit moves up to 32 MiB).
MAX_BLOCK_BYTES = 1 << 30
#: Freed memory at the top of the heap kept for reuse (the largest value mallopt takes).
KEEP_BYTES = (1 << 31) - 1
#: glibc's largest dynamic mmap threshold: blocks of this size and more are mapped afresh at
#: every allocation, unless the process fixes a higher threshold (what
#: :func:`keep_freed_memory` does) or turns mapping off (``MALLOC_MMAP_MAX_=0``).
DYNAMIC_MMAP_MAX = 32 << 20


def _strtoul(text: str) -> Optional[int]:
    r"""``text`` read as glibc reads a number from the environment (``strtoul`` with base 0):
    leading blanks, an optional sign, ``0x`` hexadecimal, a leading ``0`` octal, otherwise
    decimal, up to the first character that is not a digit; a negative value wraps modulo
    :math:`2^{64}`. :obj:`None` where no digit is read."""
    text = text.lstrip(' \t')
    sign = -1 if text[:1] == '-' else 1
    text = text[1:] if text[:1] in '+-' else text
    base, digits = 10, '0123456789'
    if text[:2].lower() == '0x' and text[2:3].lower() in '0123456789abcdef' and text[2:3]:
        base, digits, text = 16, '0123456789abcdef', text[2:]
    elif text[:1] == '0':
        base, digits = 8, '01234567'
    n = 0
    read = 0
    for ch in text.lower():
        if ch not in digits:
            break
        n, read = n * base + digits.index(ch), read + 1
    if not read:
        return None
    return (sign * n) % (1 << 64)


def _environment_threshold(environ) -> Optional[float]:
    r"""The mmap threshold glibc takes from the environment when the process starts: the last
    ``glibc.malloc.mmap_threshold`` in ``GLIBC_TUNABLES``, else ``MALLOC_MMAP_THRESHOLD_``;
    infinite where ``MALLOC_MMAP_MAX_`` (or the tunable ``glibc.malloc.mmap_max``) is 0 (no
    block is mapped); :obj:`None` where none is set (the dynamic threshold). On older glibc
    releases a fixed threshold above 32 MiB may be refused, which this does not see."""
    tunables = {}
    for item in environ.get('GLIBC_TUNABLES', '').split(':'):
        name, _, value = item.partition('=')
        tunables[name.strip()] = value  # the last of a name counts
    mmap_max = tunables.get('glibc.malloc.mmap_max', environ.get('MALLOC_MMAP_MAX_'))
    if mmap_max is not None and _strtoul(mmap_max) == 0:
        return float('inf')
    value = tunables.get('glibc.malloc.mmap_threshold', environ.get('MALLOC_MMAP_THRESHOLD_'))
    return None if value is None else _strtoul(value)


# read once, as glibc does when the process starts (later changes of os.environ change nothing);
# keep_freed_memory() replaces it with the threshold it sets
_THRESHOLD: Optional[float] = _environment_threshold(os.environ)


def keep_freed_memory(max_block_bytes: int = MAX_BLOCK_BYTES,
                      keep_bytes: int = KEEP_BYTES) -> bool:
    r"""Makes glibc's ``malloc`` serve blocks of up to :obj:`max_block_bytes` from its heap and
    keep up to :obj:`keep_bytes` of freed memory for reuse, for the rest of the process.

    PyTorch allocates CPU tensors with ``malloc``. glibc maps each block above its mmap threshold
    (which it raises to at most 32 MiB) with fresh pages and unmaps it when it is freed, so every
    large intermediate tensor costs one page fault per 4 KiB page and the kernel's zeroing of
    each page, on every allocation. The MZ generator rows are such tensors: :math:`(N, n_g, d)`
    is 64 MiB for 32 clouds of 1,024 points at :math:`d = 64`, :math:`n_g = 8`, and one ``mz``
    training step took 3.6 million page faults (14 GB of fresh pages) in one measurement. A
    fault's cost depends on the host: on the 2-core sandbox this project is measured on, one
    permuting copy of a 72 MiB tensor in the ``mz`` training step's backward pass took 304 ms
    with 18,432 faults (16 us each) and 10-14 ms into reused memory, and the same copy into
    fresh memory in an otherwise idle process 44-55 ms (a throwaway probe, 2026-12-03). With
    the memory kept, a freed block is reused without faults. Measured with ``python
    benchmarks/training_step.py`` (one thread, the ``+keep`` rows of
    ``benchmarks/results/training_step/training_step.md``): the ``mz`` training step
    4.58 s -> 2.80 s, EGNN 27.8 s -> 10.9 s (an earlier run: 5.45 s -> 3.21 s and
    25.6 s -> 11.4 s; the times without kept memory vary between runs with the state of the
    system's memory).

    The cost is memory: the process keeps the heap it has used (the peak resident set changed by
    -14% to +19% in that benchmark's latest run, rising for ``mz`` and EGNN, and rose by 26%
    for the default :class:`~torch_mz.nn.MZAggregation` and 86% for PyG's
    ``SetTransformerAggregation`` on a 10^5-node message-passing graph,
    ``benchmarks/results/message_passing_1e5_keep/``), and a freed block returns to the
    operating system only from the top of the heap and beyond :obj:`keep_bytes`.

    Allocation does not touch values, but the setting does choose how large inputs are
    processed: where freed memory is not kept, :class:`~torch_mz.nn.MZAggregation`'s
    ``chunk_size='auto'`` (the presets' default) encodes large inputs in groups
    (:func:`freed_memory_kept`), which agrees with the whole input up to float rounding in
    evaluation but draws dropout masks group by group in training. So a seeded training run
    gives other values with and without kept memory (the ``torch-mz`` command line keeps it
    by default, the Python API does not); training checkpoints record the setting, and a run
    resumed under the other one logs a warning (``torch-mz train --resume`` and ``compare
    --resume`` resume a run trained without it without it).

    Args:
        max_block_bytes (int): Largest block served from the heap (default: 1 GiB).
        keep_bytes (int): Freed memory at the top of the heap that is kept (default: the
            largest value ``mallopt`` accepts, 2 GiB - 1).

    Returns:
        bool: Whether the setting was applied: :obj:`True` with glibc; :obj:`False` (nothing
        changes) with another C library (macOS, Windows, musl).
    """
    for name, value in (('max_block_bytes', max_block_bytes), ('keep_bytes', keep_bytes)):
        # (True is 1 byte: every allocation mapped afresh, the opposite of the intent)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"'{name}' must be an integer number of bytes (got {value!r})")
    if max_block_bytes <= 0 or keep_bytes <= 0:
        raise ValueError(f"'max_block_bytes' and 'keep_bytes' must be positive (got "
                         f"{max_block_bytes} and {keep_bytes})")
    if max_block_bytes > KEEP_BYTES or keep_bytes > KEEP_BYTES:
        raise ValueError(f"mallopt takes values up to {KEEP_BYTES} (got {max_block_bytes} and "
                         f"{keep_bytes})")
    if not glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - a glibc without mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied = bool(mallopt(M_MMAP_THRESHOLD, max_block_bytes)) and bool(
        mallopt(M_TRIM_THRESHOLD, keep_bytes))
    if applied:
        global _THRESHOLD
        _THRESHOLD = max_block_bytes
    return applied


@functools.lru_cache(maxsize=None)
def glibc() -> bool:
    r"""Whether this process runs on Linux with glibc (whose ``malloc`` :func:`keep_freed_memory`
    tunes; asked once, as :func:`platform.libc_ver` reads the interpreter's binary)."""
    return platform.system() == 'Linux' and platform.libc_ver()[0] == 'glibc'


def freed_memory_kept() -> bool:
    r"""Whether this process has told glibc's ``malloc`` to serve blocks of 32 MiB and more (its
    largest dynamic mmap threshold, :data:`DYNAMIC_MMAP_MAX`) from its heap, so that freed large
    blocks are reused: the last :func:`keep_freed_memory` set a ``max_block_bytes`` above 32 MiB,
    or, before any such call, the environment the process started with fixed an mmap threshold
    above 32 MiB (``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=...`` or
    ``MALLOC_MMAP_THRESHOLD_``) or turned mapping off (``MALLOC_MMAP_MAX_=0``). Otherwise, with
    glibc, every block at or above the mmap threshold (at most 32 MiB; a fixed lower threshold,
    or a trim threshold alone, which fixes it at 128 KiB, only lowers it) is mapped afresh at
    each allocation. A threshold above 32 MiB but below a large input's widest activation
    (e.g. ``keep_freed_memory(64 << 20)`` and 256 MiB tensors) counts as kept too.
    :class:`~torch_mz.nn.MZAggregation`'s ``chunk_size='auto'`` encodes large inputs in smaller
    groups (:func:`~torch_mz.nn.aggr.malloc_chunk_rows`) only with glibc and where this is
    :obj:`False`."""
    return _THRESHOLD is not None and _THRESHOLD > DYNAMIC_MMAP_MAX
