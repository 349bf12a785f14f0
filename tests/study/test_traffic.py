import pytest
import torch

from torch_mz.study.traffic import count_bytes, memory_bandwidth, tensor_bytes


def test_bytes_of_elementwise_views_and_in_place_ops():
    a, b = torch.ones(1000), torch.ones(1000)
    assert count_bytes(lambda: a + b) == 3 * 4000  # two reads, one write
    assert count_bytes(lambda: a.view(10, 100).t()) == 0  # views move nothing
    assert count_bytes(lambda: a.add_(b)) == 3 * 4000  # reads a and b, writes a
    row = torch.ones(1, 100)
    # a broadcast row is read once: 100 floats, not 1000
    assert count_bytes(lambda: a.view(10, 100) * row) == (1000 + 100 + 1000) * 4
    assert tensor_bytes(row.expand(10, 100)) == 400


def test_bytes_of_a_matrix_product_and_of_a_model_step():
    x, w = torch.ones(64, 32), torch.ones(32, 16)
    assert count_bytes(lambda: x @ w) == (64 * 32 + 32 * 16 + 64 * 16) * 4
    lin = torch.nn.Linear(8, 4)
    inp = torch.randn(5, 8)
    forward = count_bytes(lambda: lin(inp))
    both = count_bytes(lambda: lin(inp).sum().backward())
    assert forward >= (5 * 8 + 8 * 4 + 4 + 5 * 4) * 4 and both > forward


def test_memory_bandwidth_is_a_rate():
    bw = memory_bandwidth(mib=8, repeats=2)
    assert 1e8 < bw < 1e13  # between 0.1 GB/s and 10 TB/s


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason='CUDA not available'))])
def test_memory_bandwidth_measures_the_device_asked_for(device, monkeypatch):
    # the copy runs on that device (a GPU's copy timed between synchronisations, not the host's)
    seen = []
    copy = torch.Tensor.copy_

    def spy(self, src, *args, **kwargs):
        seen.append(self.device.type)
        return copy(self, src, *args, **kwargs)
    monkeypatch.setattr(torch.Tensor, 'copy_', spy)
    bw = memory_bandwidth(mib=8, repeats=2, device=torch.device(device))
    assert seen and set(seen) == {device}
    assert 1e8 < bw < 1e14
