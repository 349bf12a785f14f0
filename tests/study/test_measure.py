import sys

import pytest
import torch

from torch_mz.study.measure import (count_flops, environment, matmul_peak_flops,
                                    peak_memory_bytes, skewed_sizes, uniform_sizes)


def test_set_size_generators():
    sizes = skewed_sizes(64, 8192, sigma=1.0, seed=0)
    assert sum(sizes) == 8192 and min(sizes) >= 1 and max(sizes) > 3 * 8192 / 64
    assert skewed_sizes(64, 8192, seed=0) == sizes  # seeded
    assert uniform_sizes(3, 10) == [4, 3, 3]
    with pytest.raises(ValueError):
        skewed_sizes(10, 5)


def test_flop_count_of_a_matrix_product():
    a = torch.randn(64, 32)
    b = torch.randn(32, 16)
    assert count_flops(lambda: a @ b) == 2 * 64 * 32 * 16
    assert matmul_peak_flops(n=128, repeats=2) > 0


def _can_reset_peak_rss() -> bool:
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        return False
    return True


@pytest.mark.skipif(sys.platform != 'linux' or not _can_reset_peak_rss(),
                    reason='needs a writable /proc/self/clear_refs (Linux)')
def test_peak_memory_sees_a_large_temporary():
    def allocate():
        t = torch.ones(64 * 2**20 // 4)  # 64 MiB, freed on return
        t.add_(1)
    peak = peak_memory_bytes(allocate, torch.device('cpu'))
    assert peak is not None and peak >= 48 * 2**20


def test_peak_memory_is_none_where_it_cannot_be_read(monkeypatch):
    monkeypatch.setattr(sys, 'platform', 'darwin')
    assert peak_memory_bytes(lambda: None, torch.device('cpu')) is None


def test_environment_records_versions_and_command():
    env = environment()
    assert {'python', 'torch', 'torch_geometric', 'cpu_count', 'threads', 'command'} <= set(env)
    assert isinstance(env['torch_scatter'], bool)
