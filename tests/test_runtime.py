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
