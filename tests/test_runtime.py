import platform
import subprocess
import sys

import pytest

from torch_mz.runtime import keep_freed_memory

GLIBC = platform.system() == 'Linux' and platform.libc_ver()[0] == 'glibc'

# page faults of ten allocate-write-free cycles of a 64 MiB tensor, after one warm-up cycle
CYCLES = """
import resource, sys, torch
from torch_mz.runtime import keep_freed_memory
if sys.argv[1] == 'keep':
    assert keep_freed_memory()
def cycle():
    t = torch.empty(16 << 20)
    t.fill_(1.0)
    return float(t[-1])
cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    cycle()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode):
    out = subprocess.run([sys.executable, '-c', CYCLES, mode], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not GLIBC, reason='glibc malloc only')
def test_kept_memory_is_reused_without_page_faults():
    # in a fresh process each (the setting is process-wide): glibc maps a 64 MiB block afresh
    # on every allocation (16K faults per cycle); kept, the freed block is reused
    default, kept = faults('default'), faults('keep')
    assert default > 10 * 16384 * 0.9
    assert kept < default / 5  # at most one cycle of faults (the heap grows once)


def test_bad_arguments():
    with pytest.raises(ValueError, match='positive'):
        keep_freed_memory(0)
    with pytest.raises(ValueError, match='up to'):
        keep_freed_memory(1 << 40)




KEPT = """
import sys
from torch_mz import runtime
before = runtime.freed_memory_kept()
applied = runtime.keep_freed_memory()
after = runtime.freed_memory_kept()
small = runtime.keep_freed_memory(1 << 20)  # applied: blocks above 1 MiB are mapped again
print(before, applied, after, small, runtime.freed_memory_kept(), runtime.glibc())
"""
MALLOC_NAMES = ('MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_', 'MALLOC_MMAP_MAX_',
                'GLIBC_TUNABLES')


@pytest.mark.parametrize('env, kept_at_start', [
    ({}, False),
    ({'MALLOC_MMAP_THRESHOLD_': '1073741824'}, True),
    ({'GLIBC_TUNABLES': 'glibc.malloc.mmap_threshold=1073741824'}, True),
    ({'MALLOC_MMAP_THRESHOLD_': '33554432'}, False),  # 32 MiB: blocks of 32 MiB still mapped
    ({'MALLOC_MMAP_THRESHOLD_': '131072'}, False),  # a lower fixed threshold maps more
    ({'MALLOC_TRIM_THRESHOLD_': '2147483647'}, False),  # fixes the mmap threshold at 128 KiB
    ({'MALLOC_MMAP_MAX_': '0'}, True),  # nothing is mapped
])
def test_freed_memory_kept_says_what_the_process_asked_for(env, kept_at_start):
    # in a fresh process (the state is process-wide): kept from the start where the environment
    # fixes a threshold above 32 MiB or turns mapping off, then as the last keep_freed_memory()
    # set it (with glibc)
    import os
    clean = {k: v for k, v in os.environ.items() if k not in MALLOC_NAMES}
    out = subprocess.run([sys.executable, '-c', KEPT], capture_output=True, text=True,
                         timeout=120, env=dict(clean, **env))
    assert out.returncode == 0, out.stderr
    before, applied, after, small, last, glibc = out.stdout.split()
    assert glibc == str(GLIBC) and applied == str(GLIBC) and small == str(GLIBC)
    assert before == str(kept_at_start)
    assert after == str(kept_at_start or GLIBC)
    assert last == str(kept_at_start and not GLIBC)  # 1 MiB: large blocks mapped again


def test_the_environment_is_read_as_glibc_reads_it():
    from torch_mz.runtime import _environment_threshold as read, _strtoul
    assert read({}) is None
    assert read({'MALLOC_MMAP_THRESHOLD_': '33554432'}) == 32 << 20
    assert read({'MALLOC_MMAP_THRESHOLD_': '0x2000000'}) == 32 << 20
    assert read({'MALLOC_MMAP_THRESHOLD_': '010000000000'}) == 1 << 30  # octal
    assert read({'MALLOC_MMAP_THRESHOLD_': ' 1073741824abc'}) == 1 << 30  # to a non-digit
    assert read({'MALLOC_MMAP_THRESHOLD_': '1_073_741_824'}) == 1
    assert read({'MALLOC_MMAP_THRESHOLD_': '-1'}) == 2 ** 64 - 1
    assert read({'MALLOC_MMAP_THRESHOLD_': 'big'}) is None
    # the tunable before the variable, and the last of a repeated tunable
    tunables = 'glibc.malloc.mmap_threshold=131072:glibc.malloc.mmap_threshold=1073741824'
    assert read({'GLIBC_TUNABLES': tunables, 'MALLOC_MMAP_THRESHOLD_': '1'}) == 1 << 30
    assert read({'GLIBC_TUNABLES': 'glibc.malloc.trim_threshold=1',
                 'MALLOC_MMAP_THRESHOLD_': '4096'}) == 4096
    assert read({'MALLOC_MMAP_MAX_': '0', 'MALLOC_MMAP_THRESHOLD_': '4096'}) == float('inf')
    assert read({'GLIBC_TUNABLES': 'glibc.malloc.mmap_max=0'}) == float('inf')
    assert _strtoul('0x') == 0 and _strtoul('+12') == 12 and _strtoul('') is None


@pytest.mark.parametrize('args', [(True, True), (2.0**20, 2**20), (None, 2**20)])
def test_keep_freed_memory_refuses_what_is_not_a_byte_count(args):
    # True is 1 byte: every allocation mapped afresh (the opposite of the intent), accepted
    from torch_mz.runtime import keep_freed_memory
    with pytest.raises(ValueError, match='must be an integer number of bytes'):
        keep_freed_memory(*args)
