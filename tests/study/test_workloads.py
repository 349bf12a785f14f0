r"""The benchmark workloads of :mod:`torch_mz.study.workloads`: the random graphs' stated
properties and the point-cloud batch."""
import pytest
import torch

from torch_mz.study.workloads import fit_slope, make_batch, random_graph


@pytest.mark.parametrize('degrees', ['poisson', 'power-law'])
def test_random_graphs_are_sorted_by_destination_and_seeded(degrees):
    edge_index = random_graph(500, degrees, avg_degree=10, seed=1)
    src, dst = edge_index
    assert edge_index.dtype == torch.long and bool((dst[1:] >= dst[:-1]).all())
    assert int(src.min()) >= 0 and int(src.max()) < 500 and int(dst.max()) < 500
    assert torch.equal(edge_index, random_graph(500, degrees, avg_degree=10, seed=1))
    if degrees == 'power-law':  # exactly avg_degree * nodes edges, one node with most of them
        assert edge_index.size(1) == 5000
        assert int(torch.bincount(dst).max()) > 10 * 10
    else:
        assert abs(edge_index.size(1) - 5000) < 5 * 5000 ** 0.5
    with pytest.raises(ValueError, match="Unknown degree distribution 'uniform'"):
        random_graph(10, 'uniform')


def test_point_cloud_batch_lies_in_the_unit_ball_and_the_slope_fits_a_power():
    pos, batch, y = make_batch(4, 64)
    assert pos.shape == (256, 3) and bool((pos.norm(dim=-1) <= 1 + 1e-6).all())
    assert torch.equal(batch, torch.arange(4).repeat_interleave(64))
    assert y.shape == (4, ) and int(y.max()) < 40
    rows = [dict(nodes=n, edges=10 * n, t=(11 * n) ** 1.5) for n in (100, 1000, 10000)]
    assert fit_slope(rows, 't') == pytest.approx(1.5)
    assert fit_slope(rows[:1], 't') is None
