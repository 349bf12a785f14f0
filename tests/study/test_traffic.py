import pytest
import torch

from torch_mz.study.traffic import (_is_view, count_bytes, count_ops, memory_bandwidth,
                                    tensor_bytes)


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


def test_counter_counts_each_operation_once_and_views_as_no_kernel():
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    counter = count_ops(lambda: (a + b).view(-1).t().sum())
    # add, sum: kernels; view and t: views (no kernel)
    assert (counter.ops, counter.kernels) == (4, 2)
    assert counter.by_name == {'add': 1, 'sum': 1}
    x = torch.randn(5, requires_grad=True)
    both = count_ops(lambda: (x * 2).sum().backward())
    forward = count_ops(lambda: (x * 2).sum())
    assert both.kernels > forward.kernels  # the backward pass is counted too
    assert _is_view(torch.ops.aten.transpose.int)
    assert _is_view(torch.ops.aten._unsafe_view.default)  # unannotated, still a view
    assert not _is_view(torch.ops.aten.add_.Tensor)  # writes its input: a kernel
    assert count_ops(lambda: torch.empty(3)).kernels == 0  # an allocation only
    t = torch.tensor([0, 3, 0, 2])
    syncs = count_ops(lambda: (int(t.sum()), t.nonzero(), bool((t > 1).any()),
                                        torch.bincount(t)))
    assert syncs.syncs == 4 and syncs.by_name['_local_scalar_dense'] == 2
    # repeat_interleave reads its output size on the host unless it is given
    assert count_ops(lambda: torch.repeat_interleave(t)).syncs == 1
    assert count_ops(lambda: torch.repeat_interleave(t, output_size=5)).syncs == 0


@pytest.mark.parametrize('mib, repeats', [(0, 2), (8, 0)])
def test_memory_bandwidth_refuses_an_empty_measurement(mib, repeats):
    # an empty tensor or no timed copy gave 0 bytes per second (and a division by it later)
    with pytest.raises(ValueError):
        memory_bandwidth(mib=mib, repeats=repeats)
