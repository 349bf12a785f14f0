import inspect
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Batch, Data
from torch_geometric.utils import scatter

from torch_mz.models.egnn import (
    EGNN,
    EGNNConv,
    fully_connected_edge_index,
    radius_edge_index,
    split_pos_features,
)
from torch_mz.models.registry import SelectFeatures
from torch_mz.testing import assert_equivariant

CONV_OPTIONS = [
    dict(),
    dict(edge_gate=True, normalize=True, tanh=True, coord_aggr='sum'),
]


def random_sets(sizes, dim, channels, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    pos = torch.randn(batch.numel(), dim, generator=g, dtype=torch.float64).to(dtype)
    x = torch.randn(batch.numel(), channels, generator=g, dtype=torch.float64).to(dtype)
    return x, pos, batch


def brute_force_edges(pos, batch, r=None):
    pairs = set()
    for i in range(batch.numel()):
        for j in range(batch.numel()):
            if i != j and batch[i] == batch[j]:
                if r is None or float((pos[i] - pos[j]).norm()) <= r:
                    pairs.add((j, i))
    return pairs


def as_pairs(edge_index):
    pairs = [tuple(e) for e in edge_index.t().tolist()]
    assert len(pairs) == len(set(pairs)), 'duplicate edges'
    return set(pairs)


# --------------------------------------------------------------------------------------------------
# Graphs
# --------------------------------------------------------------------------------------------------
def test_fully_connected_hand_built():
    batch = torch.tensor([0, 0, 1, 1, 1, 3])  # set 2 empty, set 3 a single element
    edge_index = fully_connected_edge_index(batch)
    assert as_pairs(edge_index) == {(0, 1), (1, 0), (2, 3), (2, 4), (3, 2), (3, 4), (4, 2), (4, 3)}
    assert edge_index.dtype == torch.long


@pytest.mark.parametrize('seed', [0, 1])
def test_fully_connected_random(seed):
    g = torch.Generator().manual_seed(seed)
    batch = torch.randint(0, 7, (40, ), generator=g)  # unsorted, some sets may be empty
    counts = torch.bincount(batch, minlength=9)
    edge_index = fully_connected_edge_index(batch, num_sets=9)  # two trailing empty sets
    assert edge_index.size(1) == int((counts * (counts - 1)).sum())
    assert torch.equal(batch[edge_index[0]], batch[edge_index[1]])  # never across sets
    assert (edge_index[0] != edge_index[1]).all()
    assert as_pairs(edge_index) == brute_force_edges(torch.zeros(40, 1), batch)


def test_fully_connected_degenerate():
    assert fully_connected_edge_index(torch.zeros(0, dtype=torch.long)).shape == (2, 0)
    assert fully_connected_edge_index(torch.tensor([0, 1, 2])).shape == (2, 0)
    with pytest.raises(ValueError, match='num_sets'):
        fully_connected_edge_index(torch.tensor([0, 3]), num_sets=2)
    with pytest.raises(ValueError, match="Expected an integer 'batch'"):
        fully_connected_edge_index(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"Expected 'batch' values in \[0, 1\) \(got range "
                                         r"\[-1, 0\]\)"):
        fully_connected_edge_index(torch.tensor([0, -1]))
    # any integer dtype, as the set models and MZAggregation take it (int64 was required)
    assert torch.equal(fully_connected_edge_index(torch.tensor([0, 0, 1], dtype=torch.int32)),
                       fully_connected_edge_index(torch.tensor([0, 0, 1])))


def test_radius_graph_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 4, (50, ), generator=g)
    pos = torch.randn(50, 3, generator=g, dtype=torch.float64)
    for r in (0.0, 0.8, 1.5, 100.0):
        # a tiny chunk size exercises the chunked distance loop
        edge_index = radius_edge_index(pos, r, batch, chunk_size=37)
        assert as_pairs(edge_index) == brute_force_edges(pos, batch, r)
    assert radius_edge_index(pos, 100.0, batch).size(1) == fully_connected_edge_index(batch).size(1)
    # coincident points are within any radius, and the cut-off is inclusive
    pos = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [5.0, 0.0]])
    assert as_pairs(radius_edge_index(pos, 0.0)) == {(0, 1), (1, 0)}
    assert as_pairs(radius_edge_index(pos, 1.0)) == {(0, 1), (1, 0), (0, 2), (2, 0), (1, 2),
                                                     (2, 1)}


def test_radius_graph_takes_a_large_integer_radius():
    # r * r of an integer r >= 4e9 is beyond int64: "OverflowError: int too big to convert"
    batch = torch.tensor([0, 0, 1, 0, 1])
    pos = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    every = fully_connected_edge_index(batch)
    for r in (4 * 10 ** 9, 10 ** 200, 10 ** 400):
        assert torch.equal(radius_edge_index(pos, r, batch), every)
    assert torch.equal(radius_edge_index(pos, 0, batch), radius_edge_index(pos, 0.0, batch))


def pairwise_radius_reference(pos, r, batch, num_sets=None):
    # every pair of fully_connected_edge_index kept by its own squared distance, pair by pair
    # (the earlier implementation of radius_edge_index)
    edge_index = fully_connected_edge_index(batch, num_sets)
    j, i = edge_index
    keep = (pos[i] - pos[j]).pow(2).sum(dim=-1) <= r * r
    return edge_index[:, keep]


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_radius_graph_blocks_equal_the_pairwise_filter_exactly(dtype):
    # the same edges in the same order, kept by bitwise the same squared distances: skewed and
    # empty sets, one-element sets, unsorted ids, points on the cut-off, several chunk sizes
    g = torch.Generator().manual_seed(1)
    sizes = [0, 1, 2, 7, 30, 3, 0, 64, 5, 1, 17]
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    batch = batch[torch.randperm(batch.numel(), generator=g)]
    for dim in (2, 3):
        pos = torch.randint(-3, 4, (batch.numel(), dim), generator=g).to(dtype)  # a lattice
        pos[::3] += 0.1 * torch.randn(pos[::3].shape, generator=g, dtype=torch.float64).to(dtype)
        for r in (0.0, 1.0, 2.0, 2.5, 100.0):  # 1 and 2 lie on lattice distances
            ref = pairwise_radius_reference(pos, r, batch, num_sets=len(sizes) + 2)
            for chunk in (1, 37, 5000, 2**20):
                out = radius_edge_index(pos, r, batch, num_sets=len(sizes) + 2, chunk_size=chunk)
                assert torch.equal(out, ref), (dim, r, chunk)
    # sorted ids, with edges
    batch_sorted, _ = torch.sort(batch)
    pos = torch.randn(batch.numel(), 3, generator=g, dtype=torch.float64).to(dtype)
    ref = pairwise_radius_reference(pos, 1.5, batch_sorted)
    assert ref.size(1) > 0
    for chunk in (1, 37, 2**20):
        assert torch.equal(radius_edge_index(pos, 1.5, batch_sorted, chunk_size=chunk), ref)
    # no pair at all
    assert torch.equal(radius_edge_index(torch.zeros(3, 2), 1.0, torch.arange(3)),
                       torch.empty(2, 0, dtype=torch.long))


def test_in_channels_counting_the_coordinates_is_explained():
    # a task's in_channels counts [pos, x]: built without pos_dim, EGNN reads data.pos and the
    # features x, one column short per coordinate; the error says to pass pos_dim
    data = Batch.from_data_list([Data(x=torch.ones(5, 1), pos=torch.randn(5, 3))])
    model = EGNN(4, 1)
    with pytest.raises(ValueError, match=r"in_channels=4 counts the 3 coordinate columns too.*"
                       r"pos_dim=3"):
        model(data)


def test_split_pos_features():
    x = torch.arange(12.0).view(3, 4)
    pos, features = split_pos_features(x, 3)
    assert torch.equal(pos, x[:, :3]) and torch.equal(features, x[:, 3:])
    pos, features = split_pos_features(x, 4)
    assert torch.equal(pos, x) and features is None
    with pytest.raises(ValueError, match='pos_dim'):
        split_pos_features(x, 5)
    # True was read as one coordinate column; 2.0 failed with a TypeError inside the slicing
    for bad in (True, 2.0, 0):
        with pytest.raises(ValueError, match=rf"'pos_dim' must be an integer >= 1 \(got {bad}\)"):
            split_pos_features(x, bad)
    assert torch.equal(split_pos_features(x, np.int64(2))[0], x[:, :2])


# --------------------------------------------------------------------------------------------------
# Layer
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('dim', [3, 8])
@pytest.mark.parametrize('options', CONV_OPTIONS)
def test_conv_equivariance(dtype, dim, options):
    torch.manual_seed(0)
    conv = EGNNConv(8, hidden_channels=16, **options).to(dtype)
    torch.nn.init.normal_(conv.coord_mlp[-1].weight)  # make the coordinate update large
    x, pos, batch = random_sets([5, 1, 7], dim, 8, dtype)

    def fn(pos, h, batch):
        return conv(h, pos, fully_connected_edge_index(batch))

    errors = assert_equivariant(fn, pos, batch, x, invariant_outputs=(0, ),
                                equivariant_outputs=(1, ),
                                generator=torch.Generator().manual_seed(0))
    assert set(errors) == {'rotation', 'reflection', 'translation', 'permutation'}
    h_out, pos_out = fn(pos, x, batch)
    assert (pos_out - pos).abs().max() > 1e-2  # the coordinates really moved


def test_conv_edge_attr_equivariance():
    conv = EGNNConv(4, edge_dim=3).double()
    torch.nn.init.normal_(conv.coord_mlp[-1].weight)
    x, pos, batch = random_sets([6, 4], 3, 4)
    edge_index = fully_connected_edge_index(batch)
    g = torch.Generator().manual_seed(0)
    edge_attr = torch.randn(edge_index.size(1), 3, generator=g, dtype=torch.float64)
    # permutations would need relabelled edges; the geometric transforms keep the edge order
    assert_equivariant(lambda pos, h, batch: conv(h, pos, edge_index, edge_attr), pos, batch, x,
                       invariant_outputs=(0, ), equivariant_outputs=(1, ), permutations=False)
    h1, _ = conv(x, pos, edge_index, edge_attr)
    h2, _ = conv(x, pos, edge_index, torch.zeros_like(edge_attr))
    assert not torch.allclose(h1, h2)  # the attributes are used
    with pytest.raises(ValueError, match='edge_attr'):
        conv(x, pos, edge_index)


def test_conv_mean_vs_sum_coordinate_aggregation():
    # With mean aggregation, C = 1 / |N(i)|: the updates differ from 'sum' by the in-degree.
    x, pos, batch = random_sets([5, 3], 3, 4)
    edge_index = fully_connected_edge_index(batch)
    conv_mean = EGNNConv(4, coord_aggr='mean').double()
    conv_sum = EGNNConv(4, coord_aggr='sum').double()
    conv_sum.load_state_dict(conv_mean.state_dict())
    h_mean, pos_mean = conv_mean(x, pos, edge_index)
    h_sum, pos_sum = conv_sum(x, pos, edge_index)
    degree = torch.bincount(edge_index[1], minlength=x.size(0)).double().unsqueeze(-1)
    torch.testing.assert_close(h_mean, h_sum)
    torch.testing.assert_close((pos_sum - pos), (pos_mean - pos) * degree)


def test_conv_options_and_init():
    conv = EGNNConv(8, hidden_channels=32)
    # small initialisation of the last coordinate layer (Xavier uniform, gain 0.001)
    bound = 0.001 * (6 / (32 + 1))**0.5
    assert conv.coord_mlp[-1].weight.abs().max() <= bound
    assert conv.coord_mlp[-1].bias is None
    x, pos, batch = random_sets([4, 4], 3, 8, torch.float32)
    edge_index = fully_connected_edge_index(batch)

    frozen = EGNNConv(8, update_coords=False)
    assert frozen.coord_mlp is None
    assert torch.equal(frozen(x, pos, edge_index)[1], pos)

    bounded = EGNNConv(8, tanh=True, coords_range=0.5)
    torch.nn.init.normal_(bounded.coord_mlp[-1].weight, std=100.0)
    _, pos_out = bounded(x, 1000 * pos, edge_index)  # far-apart points, saturated tanh
    step = (pos_out - 1000 * pos).norm(dim=-1)
    # mean of 3 differences, each bounded by 0.5 * |x_i - x_j|
    max_dist = torch.cdist(1000 * pos, 1000 * pos).max()
    assert (step <= 0.5 * max_dist + 1e-3).all()

    for bad in (dict(coord_aggr='max'), dict(edge_dim=-1)):
        with pytest.raises(ValueError):
            EGNNConv(8, **bad)
    with pytest.raises(ValueError, match='h'):
        conv(x[:, :4], pos, edge_index)
    with pytest.raises(ValueError, match='pos'):
        conv(x, pos[:-1], edge_index)
    with pytest.raises(ValueError, match='edge_dim=0'):
        conv(x, pos, edge_index, torch.zeros(edge_index.size(1), 1))

    conv.coord_mlp[-1].weight.data.fill_(1.0)
    conv.reset_parameters()
    assert conv.coord_mlp[-1].weight.abs().max() <= bound
    assert re.fullmatch(r"EGNNConv\(8, hidden_channels=32, .*coord_aggr='mean'.*\)", repr(conv))


def dense_reference(conv, h, pos, batch):
    # The paper's equations, one node and one neighbour at a time.
    h_new, pos_new = [], []
    for i in range(h.size(0)):
        neighbours = [j for j in range(h.size(0)) if j != i and batch[j] == batch[i]]
        m_sum = h.new_zeros(conv.hidden_channels)
        delta = pos.new_zeros(pos.size(1))
        for j in neighbours:
            diff = pos[i] - pos[j]
            m = conv.edge_mlp(torch.cat([h[i], h[j], diff.dot(diff).view(1)]))
            if conv.edge_gate:
                m = m * torch.sigmoid(conv.gate_lin(m))
            if conv.normalize:
                diff = diff / (diff.norm() + conv.eps)
            weight = conv.coord_mlp(m)
            if conv.tanh:
                weight = conv.coords_range * torch.tanh(weight)
            m_sum = m_sum + m
            delta = delta + diff * weight
        if conv.coord_aggr == 'mean' and neighbours:
            delta = delta / len(neighbours)
        h_new.append(h[i] + conv.node_mlp(torch.cat([h[i], m_sum])))
        pos_new.append(pos[i] + delta)
    return torch.stack(h_new), torch.stack(pos_new)


@pytest.mark.parametrize('options', CONV_OPTIONS + [dict(normalize=True),
                                                    dict(tanh=True, coords_range=0.3)])
def test_conv_matches_dense_reference(options):
    torch.manual_seed(0)
    conv = EGNNConv(3, hidden_channels=5, **options).double()
    torch.nn.init.normal_(conv.coord_mlp[-1].weight)
    x, pos, batch = random_sets([4, 1, 3], 2, 3)
    h_out, pos_out = conv(x, pos, fully_connected_edge_index(batch))
    h_ref, pos_ref = dense_reference(conv, x, pos, batch)
    torch.testing.assert_close(h_out, h_ref)
    torch.testing.assert_close(pos_out, pos_ref)


@pytest.mark.parametrize('normalize', [False, True])
def test_conv_coincident_points_have_finite_gradients(normalize):
    conv = EGNNConv(4, edge_gate=True, normalize=normalize).double()
    torch.nn.init.normal_(conv.coord_mlp[-1].weight)
    pos = torch.tensor([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [3.0, 0.0, 1.0]],
                       dtype=torch.float64, requires_grad=True)
    h = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    edge_index = fully_connected_edge_index(torch.zeros(4, dtype=torch.long))
    h_out, pos_out = conv(h, pos, edge_index)
    (h_out.sum() + pos_out.pow(2).sum()).backward()
    for name, tensor in [('h', h), ('pos', pos)] + list(conv.named_parameters()):
        assert tensor.grad is not None and torch.isfinite(tensor.grad).all(), name


def authors_coordinate_update(conv, h, pos, edge_index, detach):
    # egnn_clean's E_GCL with normalize=True and coords_agg='mean', written out:
    # coord2radial divides by torch.sqrt(radial).detach() + epsilon.
    row, col = edge_index[1], edge_index[0]  # (E,): row receives from col
    coord_diff = pos[row] - pos[col]  # (E, D)
    radial = coord_diff.pow(2).sum(1, keepdim=True)  # (E, 1)
    norm = radial.sqrt()
    norm = (norm.detach() if detach else norm) + conv.eps
    m = conv.edge_mlp(torch.cat([h[row], h[col], radial], dim=1))  # (E, H)
    trans = coord_diff / norm * conv.coord_mlp(m)  # (E, D)
    return pos + scatter(trans, row, dim=0, dim_size=pos.size(0), reduce='mean')  # (N, D)


def test_conv_normalize_detaches_the_norm_like_the_authors():
    torch.manual_seed(0)
    x, pos, batch = random_sets([5, 4], 3, 4)
    edge_index = fully_connected_edge_index(batch)
    grads = {}
    for detach in (True, False):
        torch.manual_seed(1)
        conv = EGNNConv(4, hidden_channels=8, normalize=True, detach_norm=detach).double()
        torch.nn.init.normal_(conv.coord_mlp[-1].weight)
        w = torch.randn(pos.shape, dtype=torch.float64)
        p1 = pos.clone().requires_grad_()
        _, pos_out = conv(x, p1, edge_index)
        (pos_out * w).sum().backward()
        p2 = pos.clone().requires_grad_()
        pos_ref = authors_coordinate_update(conv, x, p2, edge_index, detach)
        (pos_ref * w).sum().backward()
        torch.testing.assert_close(pos_out, pos_ref, rtol=0, atol=1e-14)
        torch.testing.assert_close(p1.grad, p2.grad, rtol=0, atol=1e-12)
        grads[detach] = p1.grad
    # The default is the authors' (detached) gradient; back-propagating through the norm gives
    # other position gradients for the same values.
    assert EGNNConv(4).detach_norm and EGNN(1).convs[0].detach_norm
    assert (grads[True] - grads[False]).abs().max() > 1e-3


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------
MODEL_OPTIONS = [
    dict(),
    dict(pool='mean', edge_gate=True, normalize=True, tanh=True, coord_aggr='sum'),
    dict(radius=1.0),  # scaled by sqrt(D) below, to keep part of the pairs
]


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('dim', [3, 8])
@pytest.mark.parametrize('options', MODEL_OPTIONS)
def test_model_equivariance(dtype, dim, options):
    torch.manual_seed(0)
    if 'radius' in options:
        options = dict(options, radius=options['radius'] * dim**0.5)
    model = EGNN(2, hidden_channels=16, out_channels=3, num_layers=3, **options).to(dtype)
    for conv in model.convs:
        torch.nn.init.normal_(conv.coord_mlp[-1].weight, std=0.3)
    x, pos, batch = random_sets([6, 1, 4, 5], dim, 2, dtype)
    num_edges = model.build_edge_index(pos, batch).size(1)
    assert 0 < num_edges <= 30 + 12 + 20
    assert (num_edges < 62) == ('radius' in options)

    def fn(pos, features, batch):
        h, pos_out = model.encode(features, pos, batch)
        return h, pos_out, model(features, pos, batch).prediction

    errors = assert_equivariant(fn, pos, batch, x, invariant_outputs=(0, 2),
                                equivariant_outputs=(1, ), set_outputs=(2, ), n_trials=2,
                                generator=torch.Generator().manual_seed(0))
    assert len(errors) == 4
    _, pos_out, out = fn(pos, x, batch)
    assert out.shape == (4, 3) and torch.isfinite(out).all()
    assert (pos_out - pos).abs().max() > 1e-3  # coordinates moved, so the check is not vacuous


def test_model_sets_do_not_interact():
    model = EGNN(2, hidden_channels=16, num_layers=2).double()
    x, pos, batch = random_sets([5, 3, 4], 3, 2)
    out = model(x, pos, batch).prediction
    pos2 = pos.clone()
    pos2[batch == 1] += torch.randn(3, 3, dtype=torch.float64)  # reshape set 1 only
    out2 = model(x, pos2, batch).prediction
    torch.testing.assert_close(out2[[0, 2]], out[[0, 2]])
    assert not torch.allclose(out2[1], out[1])
    # each set alone gives the same prediction as inside the batch
    for s in range(3):
        mask = batch == s
        torch.testing.assert_close(model(x[mask], pos[mask]).prediction, out[s:s + 1])


def test_model_empty_and_single_element_sets():
    model = EGNN(2, hidden_channels=8, out_channels=2, num_layers=2).double()
    x, pos, batch = random_sets([3, 1, 4], 3, 2)
    batch = torch.where(batch >= 1, batch + 1, batch)  # sets 0, 2, 3: set 1 is a gap
    out = model(x, pos, batch, num_sets=6).prediction  # sets 4 and 5 trail empty
    assert out.shape == (6, 2) and torch.isfinite(out).all()
    for s in (1, 4, 5):  # an empty set predicts exactly zero (the models' contract)
        assert torch.equal(out[s], torch.zeros(2, dtype=torch.float64))
    assert model(x, pos, batch, num_sets=6).ihw is None
    # the single-element set equals the model applied to it alone (no neighbours: h unchanged
    # by messages, coordinates unchanged)
    torch.testing.assert_close(out[2:3], model(x[batch == 2], pos[batch == 2]).prediction)
    _, pos_out = model.encode(x, pos, batch)
    torch.testing.assert_close(pos_out[batch == 2], pos[batch == 2])

    # PyG batches keep empty graphs through num_graphs
    data = Batch.from_data_list([
        Data(x=x[batch == 0], pos=pos[batch == 0]),
        Data(x=x[:0], pos=pos[:0]),
        Data(x=x[batch == 2], pos=pos[batch == 2]),
    ])
    out_data = model(data).prediction
    assert out_data.shape == (3, 2)
    torch.testing.assert_close(out_data, out[:3])


def test_model_inputs():
    model = EGNN(2, hidden_channels=8, out_channels=1, num_layers=2, pos_dim=3).double()
    x, pos, batch = random_sets([4, 3], 3, 2)
    expected = model(x, pos, batch).prediction
    # Data / Batch objects with pos, and synthetic-task layout with points in x[:, :pos_dim]
    batch_obj = Batch.from_data_list([Data(x=x[batch == s], pos=pos[batch == s]) for s in (0, 1)])
    torch.testing.assert_close(model(batch_obj).prediction, expected)
    packed = torch.cat([pos, x], dim=-1)  # (N, 3 + 2)
    torch.testing.assert_close(model(packed, None, batch).prediction, expected)
    torch.testing.assert_close(model(Data(x=packed[batch == 0])).prediction, expected[:1])
    h, pos_out = model.encode(packed, None, batch)
    assert h.shape == (7, 8) and pos_out.shape == (7, 3)

    # without features: a constant feature
    plain = EGNN(0, hidden_channels=8, num_layers=1).double()
    out = plain(None, pos, batch).prediction
    assert out.shape == (2, 1)
    torch.testing.assert_close(plain(Data(pos=pos[batch == 1])).prediction, out[1:])
    # points-only synthetic layout
    points = EGNN(0, hidden_channels=8, num_layers=1, pos_dim=3).double()
    points.load_state_dict(plain.state_dict())
    torch.testing.assert_close(points(Data(x=pos[batch == 1])).prediction, out[1:])

    with pytest.raises(ValueError, match='coordinates'):
        EGNN(2)(x, None, batch)
    with pytest.raises(ValueError, match=r'features of shape \(7, 2\)'):
        model(x[:, :1], pos, batch)
    with pytest.raises(ValueError, match=r'features of shape \(7, 2\)'):
        model(None, pos, batch)
    with pytest.raises(ValueError, match='in_channels=0'):
        plain(x, pos, batch)
    with pytest.raises(ValueError, match='not both'):
        model(batch_obj, pos)
    with pytest.raises(ValueError, match='batch'):
        model(x, pos, batch[:-1])
    for bad in (dict(pool='max'), dict(pos_dim=0), dict(radius=-1.0), dict(out_channels=0)):
        with pytest.raises(ValueError):
            EGNN(2, **bad)


@pytest.mark.parametrize('normalize', [False, True])
def test_model_coincident_points_have_finite_gradients(normalize):
    model = EGNN(1, hidden_channels=8, num_layers=3, edge_gate=True, normalize=normalize).double()
    pos = torch.tensor([[1.0, 2.0, 3.0]] * 3 + [[0.0, 0.0, 0.0]] * 2, dtype=torch.float64,
                       requires_grad=True)
    x = torch.randn(5, 1, dtype=torch.float64, requires_grad=True)
    batch = torch.tensor([0, 0, 0, 1, 1])
    out = model(x, pos, batch).prediction
    _, pos_out = model.encode(x, pos, batch)
    (out.sum() + pos_out.pow(2).sum()).backward()
    for name, tensor in [('x', x), ('pos', pos)] + list(model.named_parameters()):
        assert tensor.grad is not None and torch.isfinite(tensor.grad).all(), name


@pytest.mark.parametrize('wrap', [False, True])
def test_model_gives_every_parameter_a_gradient(wrap):
    # the last layer's coordinate update reaches no prediction: its coordinate MLP got no
    # gradient (None), and DistributedDataParallel with find_unused_parameters=False failed
    # at the second step of the 'egnn' preset; it gets a zero one, the prediction unchanged
    torch.manual_seed(0)
    model = EGNN(1, hidden_channels=8, num_layers=2).double()
    x, pos, batch = random_sets([3, 1, 4], 3, 1)
    call = model if not wrap else SelectFeatures(model, [0])
    pred = call(x, pos, batch).prediction
    pred.sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert not any(p.grad.any() for p in model.convs[-1].coord_mlp.parameters())
    with torch.no_grad():
        assert torch.equal(call(x, pos, batch).prediction, pred)


@pytest.mark.parametrize('options', [dict(), dict(normalize=True, tanh=True, edge_gate=True)])
def test_model_forward_skips_the_last_coordinate_update_exactly(options):
    # the last layer's coordinate update reaches no prediction, yet forward computed it (phi_x
    # on every edge): skipped now, the prediction and every parameter's gradient the same bits
    # as from the layers' h with every update computed (encode's), the state_dict keys kept
    torch.manual_seed(0)
    model = EGNN(2, hidden_channels=8, num_layers=3, **options).double()
    keys = list(model.state_dict())
    x, pos, batch = random_sets([4, 1, 5], 3, 2)
    calls = []
    for conv in model.convs:
        conv.coord_mlp.register_forward_hook(lambda mod, args, out: calls.append(mod))
    pred = model(x, pos, batch).prediction
    assert calls == [conv.coord_mlp for conv in model.convs[:-1]]
    grads = torch.autograd.grad(pred.square().sum(), list(model.parameters()))

    h, pos_out = model.encode(x, pos, batch)  # every layer's update (encode returns it)
    assert len(calls) == 2 * len(model.convs) - 1
    ref = model.head(scatter(model.node_mlp(h), batch, dim=0, dim_size=3, reduce='sum'))
    ref = ref - 0 * sum(p.sum() for p in model.convs[-1].coord_mlp.parameters()).abs()
    ref_grads = torch.autograd.grad(ref.square().sum(), list(model.parameters()),
                                    allow_unused=True)
    assert torch.equal(pred, ref)
    for (name, _), g, r in zip(model.named_parameters(), grads, ref_grads):
        assert torch.equal(g, r if r is not None else torch.zeros_like(g)), name
    assert list(model.state_dict()) == keys
    # the layer alone: h' the same, pos returned unchanged
    conv, edge_index = model.convs[0], fully_connected_edge_index(batch)
    h0 = model.embedding(x)
    h_full, pos_full = conv(h0, pos, edge_index)
    h_skip, pos_skip = conv(h0, pos, edge_index, update_coords=False)
    assert torch.equal(h_skip, h_full) and pos_skip is pos and not torch.equal(pos_full, pos)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_model_gradient_tie_keeps_the_sign_of_zero(dtype):
    # the tie of the last coordinate MLP added 0 * sum: the -0.0 of an empty set's zeroed
    # prediction came out +0.0 with gradients on (-0.0 without), no longer the same bits
    torch.manual_seed(0)
    model = EGNN(1, out_channels=4, hidden_channels=8, num_layers=2).to(dtype)
    x, pos, batch = random_sets([3, 4], 3, 1, dtype=dtype)
    pred = model(x, pos, batch * 2, num_sets=4).prediction  # sets 1 and 3 empty
    with torch.no_grad():
        ref = model(x, pos, batch * 2, num_sets=4).prediction
    assert torch.signbit(ref[1::2]).any()  # (a -0.0 to keep)
    assert torch.equal(torch.signbit(pred), torch.signbit(ref)) and torch.equal(pred, ref)


def test_model_large_graph_stays_finite():
    torch.manual_seed(0)
    model = EGNN(2, hidden_channels=16, num_layers=4, normalize=True, tanh=True)
    x, pos, batch = random_sets([120, 100, 80], 8, 2, torch.float32)
    pos = 10 * pos
    pos.requires_grad_(True)
    out = model(x, pos, batch).prediction
    _, pos_out = model.encode(x, pos, batch)
    assert torch.isfinite(out).all() and torch.isfinite(pos_out).all()
    (out.sum() + pos_out.sum()).backward()
    assert torch.isfinite(pos.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_model_heads_train():
    torch.manual_seed(0)
    sizes = [5, 8, 6, 7, 4, 9, 5, 6]
    x, pos, batch = random_sets(sizes, 3, 1, torch.float32, seed=1)
    scale = torch.linspace(0.5, 2.0, len(sizes))  # (S,) sets of different spread
    pos = pos * scale[batch].unsqueeze(-1)  # (N, 3)
    # regression: mean squared distance to the centroid (rotation/translation invariant)
    centroid = scatter(pos, batch, dim=0, reduce='mean')  # (S, 3)
    target = scatter((pos - centroid[batch]).pow(2).sum(-1), batch, dim=0, reduce='mean')  # (S,)
    labels = (target > target.median()).long()  # classification: large vs small sets

    for out_channels, loss_fn, y in ((1, lambda o, y: F.mse_loss(o.squeeze(-1), y), target),
                                     (2, F.cross_entropy, labels)):
        model = EGNN(1, hidden_channels=16, out_channels=out_channels, num_layers=2, pool='mean')
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(30):
            optimizer.zero_grad()
            out = model(x, pos, batch).prediction
            assert out.shape == (len(sizes), out_channels)
            loss = loss_fn(out, y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert losses[-1] < 0.5 * losses[0], losses


def test_egnn_qm9_preset_is_invariant_and_keeps_coordinates():
    from torch_mz.models.registry import PRESETS, build_model
    assert PRESETS['egnn-qm9'] == dict(hidden_channels=128, num_layers=7, pool='sum',
                                       edge_gate=True, update_coords=False)
    torch.manual_seed(0)
    model = build_model('egnn-qm9', 5, 2).double()
    assert isinstance(model, EGNN) and len(model.convs) == 7 and model.hidden_channels == 128
    assert all(conv.coord_mlp is None and conv.gate_lin is not None for conv in model.convs)
    assert not any('coord_mlp' in name for name, _ in model.named_parameters())
    x, pos, batch = random_sets([6, 1, 4], 3, 5)
    _, pos_out = model.encode(x, pos, batch)
    assert torch.equal(pos_out, pos)  # positions are never updated

    def fn(pos, features, batch):
        return model(features, pos, batch).prediction

    errors = assert_equivariant(fn, pos, batch, x, invariant_outputs=(0, ), set_outputs=(0, ),
                                n_trials=2, generator=torch.Generator().manual_seed(0))
    assert len(errors) == 4
    # Positions still matter, through the squared distances only.
    pos2 = pos.clone()
    pos2[batch == 0] *= 1.5
    out, out2 = fn(pos, x, batch), fn(pos2, x, batch)
    assert not torch.allclose(out[0], out2[0])
    torch.testing.assert_close(out[1:], out2[1:])


@pytest.mark.parametrize('cls', [EGNNConv, EGNN])
def test_documented_arguments_match_signature(cls):
    doc_args = cls.__doc__.split('Args:')[1].split('Shapes:')[0]
    blocks = re.findall(r'^ {8}(\w+) \([^)]*\):(.*?)(?=^ {8}\w+ \(|\Z)', doc_args,
                        flags=re.MULTILINE | re.DOTALL)
    params = inspect.signature(cls.__init__).parameters
    assert [name for name, _ in blocks] == list(params)[1:]
    for name, text in blocks:
        default = re.search(r'\(default: :obj:`([^`]*)`', text)
        if params[name].default is inspect.Parameter.empty:
            assert default is None, name
        else:
            assert default is not None and eval(default.group(1)) == params[name].default, name


@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize('edge_dim', [0, 2])
def test_conv_first_edge_layer_per_node_equals_the_concatenation(dtype, tol, edge_dim):
    # phi_e's first layer is applied to the node blocks once per node (the default) or to the
    # per-edge concatenation [h_i, h_j, d^2, a] (the path taken when the layer has hooks):
    # the same values and gradients
    torch.manual_seed(0)
    conv = EGNNConv(4, hidden_channels=6, edge_dim=edge_dim, edge_gate=True).to(dtype)
    torch.nn.init.normal_(conv.coord_mlp[-1].weight)
    x, pos, batch = random_sets([5, 1, 3, 4], 3, 4, dtype=dtype)
    edge_index = fully_connected_edge_index(batch)
    attr = torch.randn(edge_index.size(1), edge_dim, dtype=dtype) if edge_dim else None
    w_h, w_p = torch.randn(x.shape, dtype=dtype), torch.randn(pos.shape, dtype=dtype)

    def run(hooked):
        conv.zero_grad()
        handle = conv.edge_mlp[0].register_forward_hook(lambda *args: None) if hooked else None
        h_in, p_in = x.clone().requires_grad_(), pos.clone().requires_grad_()
        a_in = None if attr is None else attr.clone().requires_grad_()
        h, p = conv(h_in, p_in, edge_index, a_in)
        ((h * w_h).sum() + (p * w_p).sum()).backward()  # gradients of order one
        if handle is not None:
            handle.remove()
        grads = [h_in.grad, p_in.grad] + ([a_in.grad] if a_in is not None else [])
        return [h, p] + grads + [w.grad.clone() for w in conv.parameters()]

    for per_node, cat in zip(run(False), run(True)):
        torch.testing.assert_close(per_node, cat, rtol=tol, atol=tol)


def _concatenations(conv, *args):
    # how many per-edge concatenations [h_i, h_j, d^2, (a)] one call makes
    real, count = torch.cat, []

    def counting(tensors, *a, **k):
        count.append(len(tensors) >= 3)
        return real(tensors, *a, **k)
    with torch.no_grad(), pytest.MonkeyPatch.context() as m:
        m.setattr(torch, 'cat', counting)
        conv(*args)
    return sum(count)


def test_conv_first_edge_layer_path_choice():
    torch.manual_seed(0)
    conv = EGNNConv(4, hidden_channels=6, edge_dim=2).double()
    x, pos, batch = random_sets([5, 4], 3, 4)
    dense = fully_connected_edge_index(batch)  # 32 edges, 9 nodes
    attr = torch.randn(dense.size(1), 2, dtype=torch.float64)
    assert _concatenations(conv, x, pos, dense, attr) == 0  # per node
    # fewer edges than nodes: per edge
    assert _concatenations(conv, x, pos, dense[:, :8], attr[:8]) == 1
    # a hook, or a first layer that is not a plain Linear (e.g. quantized), sees phi_e as it is
    handle = conv.edge_mlp.register_full_backward_hook(lambda *args: None)
    assert _concatenations(conv, x, pos, dense, attr) == 1
    handle.remove()

    class Scaled(torch.nn.Linear):
        def forward(self, input):
            return 2 * super().forward(input)
    plain = conv(x, pos, dense, attr)
    first = conv.edge_mlp[0]
    scaled = Scaled(first.in_features, first.out_features).double()
    scaled.load_state_dict(first.state_dict())
    conv.edge_mlp[0] = scaled
    assert _concatenations(conv, x, pos, dense, attr) == 1
    assert not torch.allclose(conv(x, pos, dense, attr)[0], plain[0])  # its forward ran
    conv.edge_mlp[0] = first
    # integer edge attributes are promoted as the concatenation promotes them
    h_int, _ = conv(x, pos, dense, attr.round().long())
    torch.testing.assert_close(h_int, conv(x, pos, dense, attr.round())[0])


@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize('coord_aggr', ['mean', 'sum'])
def test_conv_sum_of_messages_equals_pyg_aggregation(dtype, tol, coord_aggr, monkeypatch):
    # the messages are summed with index_add_ (the default 'add'); PyG's SumAggregation module
    # (the path a hook on it takes) gives the same values and gradients, and the coordinate
    # update equals PyG's scatter of the per-edge updates
    torch.manual_seed(0)
    conv = EGNNConv(4, hidden_channels=6, coord_aggr=coord_aggr).to(dtype)
    torch.nn.init.normal_(conv.coord_mlp[-1].weight)
    x, pos, batch = random_sets([5, 1, 3, 4], 3, 4, dtype=dtype)
    edge_index = fully_connected_edge_index(batch)[:, 3:]  # node 0 of set 0 loses some edges
    w_h, w_p = torch.randn(x.shape, dtype=dtype), torch.randn(pos.shape, dtype=dtype)

    def run(hooked):
        conv.zero_grad()
        handle = conv.aggr_module.register_forward_hook(lambda *a: None) if hooked else None
        h_in, p_in = x.clone().requires_grad_(), pos.clone().requires_grad_()
        h, p = conv(h_in, p_in, edge_index)
        ((h * w_h).sum() + (p * w_p).sum()).backward()
        if handle is not None:
            handle.remove()
        return [h, p, h_in.grad, p_in.grad] + [w.grad.clone() for w in conv.parameters()]

    called = []
    real = type(conv.aggr_module).forward
    monkeypatch.setattr(type(conv.aggr_module), 'forward',
                        lambda self, *a, **k: called.append(1) or real(self, *a, **k))
    fast = run(False)
    assert not called  # the default does not go through the module
    reference = run(True)
    assert called
    for a, b in zip(fast, reference):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)

    # the coordinate update and its gradients against PyG's scatter of (x_i - x_j) phi_x(m_ij),
    # written out here
    def coordinates(reference):
        conv.zero_grad()
        h_in, p_in = x.clone().requires_grad_(), pos.clone().requires_grad_()
        if reference:
            j, i = edge_index
            a = F.linear(h_in, conv.edge_mlp[0].weight[:, :4], conv.edge_mlp[0].bias)
            b = F.linear(h_in, conv.edge_mlp[0].weight[:, 4:8])
            diff = p_in[i] - p_in[j]
            m = a[i] + b[j] + diff.pow(2).sum(-1, keepdim=True) * conv.edge_mlp[0].weight[:, 8]
            m = conv.edge_mlp[1:](m)
            out = p_in + scatter(diff * conv.coord_mlp(m), i, 0, dim_size=x.size(0),
                                 reduce=coord_aggr)
        else:
            out = conv(h_in, p_in, edge_index)[1]
        (out * w_p).sum().backward()
        grads = [w.grad.clone() for w in (*conv.edge_mlp.parameters(),
                                          *conv.coord_mlp.parameters())]
        return [out, h_in.grad, p_in.grad] + grads

    for a, b in zip(coordinates(False), coordinates(True)):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    # a node without incoming edges keeps its position
    lone = int(batch.tolist().index(1))
    with torch.no_grad():
        torch.testing.assert_close(conv(x, pos, edge_index)[1][lone], pos[lone])


@pytest.mark.parametrize('weights,coordinates', [(torch.float64, torch.float32),
                                                 (torch.float32, torch.float16),
                                                 (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize('edge_dim', [0, 2])
def test_conv_coordinates_in_another_dtype_than_the_weights(weights, coordinates, edge_dim):
    # the per-node first edge layer promotes the squared distances (and edge attributes) as
    # the per-edge concatenation does
    torch.manual_seed(0)
    conv = EGNNConv(4, hidden_channels=6, edge_dim=edge_dim).to(weights)
    x, pos, batch = random_sets([5, 3, 4], 3, 4, dtype=weights)
    pos = pos.to(coordinates)
    edge_index = fully_connected_edge_index(batch)
    attr = torch.randn(edge_index.size(1), edge_dim).to(coordinates) if edge_dim else None
    with torch.no_grad():
        fast = conv(x, pos, edge_index, attr)
        handle = conv.edge_mlp[0].register_forward_hook(lambda *args: None)
        concatenated = conv(x, pos, edge_index, attr)
        handle.remove()
    for a, b in zip(fast, concatenated):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_egnn_names_a_missing_x_and_a_dtype_mismatch():
    import torch
    from torch_geometric.data import Data

    from torch_mz.models import build_model
    pos = torch.randn(4, 3)
    with pytest.raises(ValueError, match="no features 'x'.*in_channels=0"):
        build_model('egnn', 3, 2)(Data(pos=pos))  # three feature channels, none given
    model = build_model('egnn', 3, 2, pos_dim=3)  # [pos] is the whole element
    assert model(Data(pos=pos)).prediction.shape == (1, 2)
    with pytest.raises(ValueError, match="model's dtype torch.float32 .got torch.float64"):
        model(Data(pos=pos.double()))  # was a RuntimeError from inside a matrix product
    assert model.double()(Data(pos=pos.double())).prediction.dtype == torch.float64


def test_egnn_features_and_coordinates_meet_in_the_wider_dtype():
    # as set_features has them: float64 'x' beside float32 'pos' were cast to float32 without a
    # word (a float32 model ran on the rounded features; a float64 one refused the pair)
    from torch_mz.models import build_model
    g = torch.Generator().manual_seed(0)
    pos = torch.randn(4, 3, generator=g)  # (4, 3), float32
    x = torch.randn(4, 2, generator=g, dtype=torch.float64) + 2 ** -40  # (4, 2): not float32
    model = build_model('egnn', 5, 1, pos_dim=3, hidden_channels=8)
    with pytest.raises(ValueError, match=r"'pos' and 'x' of the model's dtype torch.float32 "
                                         r"\(got torch.float64 'x' beside torch.float32 'pos'"):
        model(Data(pos=pos, x=x))
    with torch.autocast('cpu', dtype=torch.bfloat16), pytest.raises(
            ValueError, match="does not cast float64"):  # (a RuntimeError in a matrix product)
        model(Data(pos=pos, x=x))
    wide = build_model('egnn', 5, 1, pos_dim=3, hidden_channels=8).double()
    wide.load_state_dict(model.state_dict())
    out = wide(Data(pos=pos, x=x)).prediction
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, wide(Data(pos=pos.double(), x=x)).prediction, rtol=0,
                               atol=0)
    # integer or boolean one-hot features take the coordinates' dtype, as before
    flags = torch.tensor([[1, 0], [0, 1], [1, 1], [0, 0]])
    expected = model(Data(pos=pos, x=flags.float())).prediction
    for given in (flags, flags.bool()):
        torch.testing.assert_close(model(Data(pos=pos, x=given)).prediction, expected)
    assert wide(Data(pos=pos.double(), x=flags)).prediction.dtype == torch.float64


def test_coordinates_of_another_width_than_pos_dim_are_refused():
    from torch_mz.models import build_model
    model = build_model('egnn', 4, 1, pos_dim=3)
    batch = torch.zeros(5, dtype=torch.long)
    model(torch.randn(5, 1), torch.randn(5, 3), batch)  # the width it was built for
    for width in (1, 2, 5):
        with pytest.raises(ValueError, match=f'built with pos_dim=3 but received coordinates '
                                             f'of width {width}'):
            model(torch.randn(5, 1), torch.randn(5, width), batch)
    # x alone, all of it read as coordinates: the error says so, not that x is missing
    with pytest.raises(ValueError, match="'x' has 3 columns, and the first pos_dim=3 are read "
                                         "as the coordinates"):
        model(torch.randn(3, 3))
    for flag in ('edge_gate', 'normalize', 'update_coords'):
        with pytest.raises(ValueError, match=f"'{flag}' must be True or False"):
            build_model('egnn', 4, 1, pos_dim=3, **{flag: 'False'})


def test_conv_and_radius_graph_name_bad_arguments():
    # features in another dtype than the layer (a bare matmul error), a NaN radius (no edge,
    # silently), a chunk size that is no integer (a TypeError from inside)
    conv = EGNNConv(4, hidden_channels=6)
    x, pos, batch = random_sets([3, 2], 3, 4, dtype=torch.float32)
    edge_index = fully_connected_edge_index(batch)
    with pytest.raises(ValueError, match=r"'h' of the layer's dtype torch.float32 \(got "
                       r"torch.float64\)"):
        conv(x.double(), pos, edge_index)
    with pytest.raises(ValueError, match="'r' must be a non-negative number, got nan"):
        radius_edge_index(pos, float('nan'), batch)
    with pytest.raises(ValueError, match="'chunk_size' must be a positive integer, got 1000000.0"):
        radius_edge_index(pos, 1.0, batch, chunk_size=1e6)
    assert radius_edge_index(pos, 1.0, batch, chunk_size=np.int64(7)).size(0) == 2
    with pytest.raises(ValueError, match="'radius' must be a finite number >= 0"):
        EGNN(3, radius=float('nan'))


@pytest.mark.parametrize('radius', [None, 1.5])
@pytest.mark.parametrize('bad', [float('nan'), float('inf'), -float('inf')])
def test_non_finite_coordinates_without_edges_give_their_set_a_nan_prediction(radius, bad):
    # a coordinate reaches a prediction only through an element's edges: a NaN or infinite
    # coordinate of a set of one element (no edge), or an infinite one under a radius graph
    # (every distance infinite: cut off), gave its set a finite prediction, as if the point were
    # valid or absent; now that element's features are NaN, so is its set's prediction, and
    # every other set's prediction is the same bit for bit
    torch.manual_seed(0)
    batch = torch.tensor([0, 0, 0, 1, 2, 2])
    pos = torch.randn(6, 3)
    model = EGNN(2, 8, 1, num_layers=2, radius=radius).eval()
    x = torch.randn(6, 2)
    clean = model(x, pos, batch).prediction
    assert torch.isfinite(clean).all()
    rows = [3] if radius is None or bad != bad else [3, 0]  # (NaN distances keep their edges)
    for row in rows:
        p = pos.clone()
        p[row, 1] = bad
        pred = model(x, p, batch).prediction
        s = int(batch[row])
        assert torch.isnan(pred[s]).all(), (row, pred)
        others = torch.arange(3) != s
        assert torch.equal(pred[others], clean[others])
        h, _ = model.encode(x, p, batch)
        assert torch.isnan(h[row]).all()
        assert torch.equal(h[batch != s], model.encode(x, pos, batch)[0][batch != s])


def test_radius_graph_keeps_nan_and_half_precision_distances_honest():
    # a NaN coordinate lost its edges (NaN <= r is false): a finite prediction for a set with a
    # NaN point; float16 squared distances overflowed (inf <= inf): every pair was an edge
    torch.manual_seed(0)
    pos = torch.randn(6, 3)
    pos[0, 0] = float('nan')
    batch = torch.tensor([0, 0, 0, 1, 1, 1])
    model = EGNN(2, 8, 1, num_layers=2, radius=10.0).eval()
    pred = model(torch.randn(6, 2), pos, batch).prediction
    assert torch.isnan(pred[0]).all() and torch.isfinite(pred[1]).all()
    far = torch.tensor([[0., 0, 0], [260, 0, 0], [2000, 0, 0]]).half()
    edges = radius_edge_index(far, 300.)
    assert sorted(map(tuple, edges.t().tolist())) == [(0, 1), (1, 0)]
    for bad in (None, '1', float('nan'), -1.0, True):
        with pytest.raises(ValueError, match="'r' must be a non-negative number"):
            radius_edge_index(far, bad)


@pytest.mark.parametrize('kwargs', [dict(), dict(edge_gate=True, normalize=True)])
def test_egnn_conv_takes_coordinates_wider_than_its_weights(kwargs):
    # float64 coordinates beside a float32 layer: the messages were promoted past phi_e's dtype
    # (RuntimeError: mat1 and mat2 must have the same dtype); now d^2 meets phi_e in its dtype
    torch.manual_seed(0)
    conv = EGNNConv(4, hidden_channels=8, **kwargs)
    h = torch.randn(5, 4)
    pos = torch.randn(5, 3, dtype=torch.float64)
    edges = fully_connected_edge_index(torch.zeros(5, dtype=torch.long))
    out, new_pos = conv(h, pos, edges)
    ref_out, ref_pos = conv(h, pos.float(), edges)
    assert out.dtype == torch.float32 and new_pos.dtype == torch.float64
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new_pos.float(), ref_pos, rtol=1e-5, atol=1e-5)


def test_repr_names_out_channels_and_builds_the_same_model():
    # the second argument of EGNN is hidden_channels: the repr gave out_channels second and
    # unnamed, which read as (in, out) and, evaluated, passed hidden_channels twice
    from torch_mz.models.egnn import EGNN
    model = EGNN(6, hidden_channels=16, out_channels=2, num_layers=2, pos_dim=3)
    text = repr(model)
    assert 'out_channels=2' in text and 'hidden_channels=16' in text
    again = eval(text, {'EGNN': EGNN})
    assert repr(again) == text


def test_detach_norm_docstring_says_where_the_values_differ():
    # the docstring said that detach_norm=True and False "give the same values"; for a pair
    # closer than eps the differentiated norm is clamped at eps: x / (2 eps), not x / (|x| + eps)
    doc = ' '.join(EGNNConv.__doc__.split())
    assert 'the two give the same values but' not in doc
    assert ('For pairs at a distance of at least :math:`\\epsilon` the two give the same '
            'values' in doc)
    assert ('closer than :math:`\\epsilon` ``detach_norm=False`` divides by '
            ':math:`2\\epsilon`' in doc)
    torch.manual_seed(0)
    h = torch.randn(2, 4, dtype=torch.float64)
    edges = torch.tensor([[0, 1], [1, 0]])
    detached = EGNNConv(4, normalize=True, detach_norm=True).double()
    through = EGNNConv(4, normalize=True, detach_norm=False).double()
    through.load_state_dict(detached.state_dict())
    eps = detached.eps
    for gap in (1e-9, 0.5e-8, 0.0, eps, 1e-3, 2.0):
        pos = torch.tensor([[0.0, 0.0], [gap, 0.0]], dtype=torch.float64)
        step_detached = detached(h, pos, edges)[1] - pos
        step_through = through(h, pos, edges)[1] - pos
        if gap >= eps or gap == 0.0:
            assert torch.equal(step_detached, step_through), gap
        else:  # smaller by 2 eps / (gap + eps), in (1, 2]
            torch.testing.assert_close(step_detached, step_through * (2 * eps / (gap + eps)),
                                       rtol=1e-12, atol=0)


@pytest.mark.parametrize('aggr', ['lstm', 'gru', 'sort', 'mlp', 'set2set', 'quantile',
                                  'attentional', 'degree_scaler'])
def test_conv_refuses_names_that_need_arguments(aggr):
    # PyG's TypeError (missing constructor arguments) came out of EGNNConv(aggr='lstm'), whose
    # docstring promised "any PyG aggregation name"
    with pytest.raises(ValueError, match=r"needs constructor arguments.*pass the Aggregation"):
        EGNNConv(4, aggr=aggr)


def test_conv_refuses_order_dependent_aggregations_alone_or_wrapped():
    from torch_geometric.nn.aggr import (DegreeScalerAggregation, LSTMAggregation,
                                         MultiAggregation)
    lstm = LSTMAggregation(6, 6)
    for aggr in (lstm, MultiAggregation([lstm, 'mean'], mode='sum'),
                 DegreeScalerAggregation(LSTMAggregation(6, 6), 'identity', torch.ones(3))):
        with pytest.raises(ValueError, match='depends on the order of the messages'):
            EGNNConv(4, hidden_channels=6, aggr=aggr)


def test_conv_takes_what_message_passing_takes_and_names_a_wrong_width():
    from torch_geometric.nn.aggr import MultiAggregation, Set2Set, SumAggregation
    h, pos, batch = random_sets([5], 3, 4)
    edges = fully_connected_edge_index(batch)
    perm = torch.randperm(5, generator=torch.Generator().manual_seed(0))
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(5)
    # names (in PyG's spellings), a one-element list, objects, a MultiAggregation that combines
    # to one width: each builds a layer invariant to node permutations, as before
    for aggr in ('add', 'mean', 'max', 'softmax', 'powermean', 'median', 'deepsets', 'Mean',
                 'SumAggregation', ['mean'], SumAggregation(),
                 MultiAggregation(['sum', 'mean'], mode='sum')):
        torch.manual_seed(0)
        conv = EGNNConv(4, hidden_channels=6, aggr=aggr).double()
        out, new_pos = conv(h, pos, edges)
        assert out.shape == (5, 4) and torch.isfinite(out).all(), aggr
        out_p, pos_p = conv(h[perm], pos[perm], inverse[edges])
        torch.testing.assert_close(out_p, out[perm], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(pos_p, new_pos[perm], rtol=1e-12, atol=1e-12)
    # an object gives the layer its name gives
    torch.manual_seed(0)
    by_name = EGNNConv(4, hidden_channels=6, aggr='sum').double()
    by_object = EGNNConv(4, hidden_channels=6, aggr=SumAggregation()).double()
    by_object.load_state_dict(by_name.state_dict())
    for a, b in zip(by_name(h, pos, edges), by_object(h, pos, edges)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # wider outputs are named at the first call
    for aggr in (Set2Set(6, processing_steps=1), ['sum', 'mean']):
        wide = EGNNConv(4, hidden_channels=6, aggr=aggr).double()
        with pytest.raises(ValueError, match=r"expected one row of the messages' width per "
                                             r"node, \(5, 6\)"):
            wide(h, pos, edges)
    doc = ' '.join(EGNNConv.__doc__.split())
    assert 'any PyG aggregation name' not in doc and 'depends on the order' in doc

def test_float64_model_under_autocast_is_named():
    # autocast leaves a float64 model's weights as they are: the check stepped aside for any
    # input but float64 under autocast, and the first matrix product failed ('mat1 and mat2
    # must have the same dtype, but got BFloat16 and Double')
    x, pos, batch = random_sets([3, 4], 3, 2, dtype=torch.float32)
    model = EGNN(2, 8, 1, num_layers=1).double()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        for came in (torch.float32, torch.bfloat16, torch.float16):
            with pytest.raises(ValueError, match=rf"model's dtype torch.float64 \(got {came}\);"
                                                 r" .*does not cast a float64 model's weights"):
                model(x.to(came), pos.to(came), batch)
        assert model(x.double(), pos.double(), batch).prediction.dtype == torch.float64


@pytest.mark.parametrize('half', ['module', 'autocast'])
def test_half_precision_squared_distances_do_not_overflow(half):
    # the squared distance of points 300 apart (9e4) overflowed float16 (65,504), in a float16
    # layer and under float16 autocast (which cast the float32 d^2 to float16 in the first edge
    # layer's product): every message of the pair was NaN; it is taken in float32 now
    torch.manual_seed(0)
    conv = EGNNConv(4, hidden_channels=6)
    with torch.no_grad():
        conv.edge_mlp[0].weight[:, 8] *= 1e-3  # d^2's column: messages of moderate size
    pos = torch.tensor([[0., 0, 0], [300, 0, 0], [0, 5, 0], [1, 1, 1]])
    h = torch.randn(4, 4)
    edge_index = fully_connected_edge_index(torch.tensor([0, 0, 0, 1]))
    assert edge_index.size(1) >= h.size(0)  # (the per-node first edge layer)
    with torch.no_grad():
        ref_h, ref_pos = conv(h, pos, edge_index)
        if half == 'module':
            out_h, out_pos = conv.half()(h.half(), pos.half(), edge_index)
            assert out_h.dtype == out_pos.dtype == torch.float16
        else:
            with torch.autocast('cpu', dtype=torch.float16):
                out_h, out_pos = conv(h, pos, edge_index)
    assert torch.isfinite(out_h).all() and torch.isfinite(out_pos).all()
    scale = float(ref_h.abs().max())
    torch.testing.assert_close(out_h.float(), ref_h, rtol=1e-2, atol=1e-2 * scale)
    torch.testing.assert_close(out_pos.float(), ref_pos, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize('detach_norm', [True, False])
def test_float16_normalized_coincident_points_stay_finite(detach_norm):
    # eps = 1e-8 is zero in float16: two coincident points gave 0 / (0 + eps) = NaN in the
    # normalised coordinate difference of a float16 model (float32 and autocast were finite)
    torch.manual_seed(0)
    x, pos, batch = random_sets([3, 3], 3, 2, dtype=torch.float32)
    pos[1] = pos[0]
    model = EGNN(2, 8, 1, num_layers=2, normalize=True, detach_norm=detach_norm)
    ref = model(x, pos, batch).prediction
    half = model.half()
    x16, pos16 = x.half(), pos.half().requires_grad_()
    out = half(x16, pos16, batch).prediction
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    out.float().sum().backward()
    assert torch.isfinite(pos16.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in half.parameters() if p.grad is not None)


def test_conv_names_what_autocast_does_not_cast():
    # the layer's check stepped aside under any autocast: a float64 layer, or float64 'h'
    # beside another layer, failed in the first matrix product ('mat1 and mat2 must have the
    # same dtype'), and 'h' of the other half precision where it joins the aggregated messages
    # ('Unexpected floating ScalarType in at::autocast::prioritize'), as EGNN refuses the first
    torch.manual_seed(0)
    edges = fully_connected_edge_index(torch.tensor([0, 0, 0, 1, 1]))
    h, pos = torch.randn(5, 4), torch.randn(5, 3)
    conv = EGNNConv(4, hidden_channels=6)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        for layer, came in ((torch.float64, torch.float32), (torch.float64, torch.bfloat16),
                            (torch.float32, torch.float64)):
            with pytest.raises(ValueError, match=rf"'h' of the layer's dtype {layer} \(got "
                                                 rf"{came}\)"):
                conv.to(layer)(h.to(came), pos, edges)
        assert conv.double()(h.double(), pos.double(), edges)[0].dtype == torch.float64
        for layer in (torch.float32, torch.float16, torch.bfloat16):
            with pytest.raises(ValueError, match=r"'h' of float32 or torch.bfloat16 under "
                                                 r"torch.autocast to torch.bfloat16 \(got "
                                                 r"torch.float16\)"):
                conv.to(layer)(h.half(), pos, edges)
            for came in (torch.float32, torch.bfloat16):  # what autocast takes, as before
                out, _ = conv(h.to(came), pos.to(came), edges)
                assert torch.isfinite(out).all()
        out, _ = conv.float()(h, pos.half(), edges)  # (coordinates of another dtype: promoted)
        assert torch.isfinite(out).all()


def test_layer_counts_that_could_not_fit_in_memory_are_refused_before_any_layer(monkeypatch):
    # num_layers=2**70 built layers without end
    import torch_mz.models.egnn as egnn

    def built(*args, **kwargs):
        raise AssertionError('a layer was built')
    monkeypatch.setattr(egnn, 'EGNNConv', built)
    with pytest.raises(ValueError, match="^num_layers=1180591620717411303424, hidden_channels="
                                         "64: .*beyond this machine's"):
        EGNN(3, num_layers=2 ** 70)


def test_conv_edge_attributes_of_another_dtype_on_the_per_edge_path():
    # fewer edges than nodes (phi_e run per edge): float64 edge attributes beside float32
    # weights failed there (mat1 and mat2 must have the same dtype), while the per-node path
    # took them in phi_e's dtype
    torch.manual_seed(0)
    conv = EGNNConv(4, hidden_channels=6, edge_dim=2)
    h, pos = torch.randn(5, 4), torch.randn(5, 3)
    edges = torch.tensor([[0, 1], [1, 0]])  # (2, 2): E < N
    attr = torch.randn(2, 2, dtype=torch.float64)
    with torch.no_grad():
        out, new_pos = conv(h, pos, edges, attr)
        ref_out, ref_pos = conv(h, pos, edges, attr.float())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(new_pos, ref_pos)


def test_conv_refuses_integer_coordinates():
    # integer coordinates ran; with normalize their unit differences were cast back to integers
    conv = EGNNConv(4, normalize=True)
    edges = fully_connected_edge_index(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"floating 'pos' of shape \(3, D\), got \(3, 2\) and "
                                         r"dtype torch.int64"):
        conv(torch.randn(3, 4), torch.tensor([[0, 0], [3, 0], [0, 5]]), edges)


@pytest.mark.parametrize('kwargs,match', [
    (dict(hidden_channels=0), "'hidden_channels' must be an integer >= 1"),  # was read as 4
    (dict(hidden_channels=-1), "'hidden_channels' must be an integer >= 1"),
    (dict(edge_dim=1.5), "'edge_dim' must be an integer >= 0"),
    (dict(eps=0.0), "'eps'"),  # coincident points gave NaN coordinates with normalize
    (dict(coords_range=float('nan')), "'coords_range'"),  # NaN coordinates with tanh
    (dict(edge_gate='False'), "'edge_gate'"),  # a text, which is true: the gate was built
])
def test_conv_names_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EGNNConv(4, **kwargs)
    with pytest.raises(ValueError, match="'channels' must be an integer >= 1"):
        EGNNConv(2.5)


def _coincident_step(conv, dtype, pos_dtype=None):
    # (values, position gradient) of a layer on two coincident points
    pos = torch.zeros(2, 3, dtype=pos_dtype or dtype, requires_grad=True)
    _, out = conv(torch.randn(2, 4, dtype=dtype), pos, torch.tensor([[0, 1], [1, 0]]))
    out.sum().backward()
    return out, pos.grad


@pytest.mark.parametrize('eps,detach_norm,dtype', [
    (1e-50, True, torch.float32),  # 0 in float32: 0 / 0, NaN coordinates
    (1e-43, True, torch.float32),  # subnormal: weight / eps overflows, NaN gradients (it ran)
    (1e-30, False, torch.float32),  # its square is 0 in float32: NaN gradients (the safe norm)
    (1e-320, True, torch.float64),
    (1e-170, False, torch.float64),
])
def test_conv_refuses_an_eps_too_small_for_the_coordinates_dtype(eps, detach_norm, dtype):
    with pytest.raises(ValueError, match=rf"'eps' of at least .* normalised in {dtype}.*got "
                                         rf"{eps!r}"):
        conv = EGNNConv(4, normalize=True, eps=eps, detach_norm=detach_norm).to(dtype)
        _coincident_step(conv, dtype)
    # the least accepted eps gives finite coordinates and gradients
    info = torch.finfo(dtype)
    least = float(info.tiny) if detach_norm else (float(info.tiny) * float(info.eps)) ** 0.5
    conv = EGNNConv(4, normalize=True, eps=least, detach_norm=detach_norm).to(dtype)
    out, grad = _coincident_step(conv, dtype)
    assert torch.isfinite(out).all() and torch.isfinite(grad).all()


@pytest.mark.parametrize('detach_norm', [True, False])
def test_conv_eps_message_names_float64_coordinates_only_where_they_help(detach_norm):
    # below the float64 bound the message advised "or float64 coordinates", which do not help
    eps = 1e-320 if detach_norm else 1e-170
    with pytest.raises(ValueError, match=r"normalised in torch.float64.*give a larger eps\)$"):
        EGNNConv(4, normalize=True, eps=eps, detach_norm=detach_norm)
    conv = EGNNConv(4, normalize=True, eps=1e-50 if detach_norm else 1e-30,
                    detach_norm=detach_norm)
    with pytest.raises(ValueError, match=r"normalised in torch.float32.*give a larger eps, or "
                                         r"float64 coordinates\)$"):
        _coincident_step(conv, torch.float32)


def test_conv_eps_is_checked_where_and_in_the_dtype_it_is_used():
    # the float32 bound refused eps=1e-50 also for float64 layers and coordinates, and without
    # normalize or coordinate updates, where eps is not used at all
    torch.manual_seed(0)
    for detach_norm in (True, False):
        conv = EGNNConv(4, normalize=True, eps=1e-50, detach_norm=detach_norm).double()
        out, grad = _coincident_step(conv, torch.float64)
        assert torch.isfinite(out).all() and torch.isfinite(grad).all()
        # the same layer on float32 (or half-precision, normalised in float32) coordinates
        for pos_dtype in (torch.float32, torch.float16):
            with pytest.raises(ValueError, match=r"normalised in torch.float32.*got 1e-50"):
                _coincident_step(conv, torch.float64, pos_dtype)
    for kwargs in (dict(), dict(normalize=True, update_coords=False)):
        conv = EGNNConv(4, eps=1e-50, **kwargs)
        out, _ = _coincident_step(conv, torch.float32)
        assert torch.isfinite(out).all()
    conv = EGNNConv(4, normalize=True, eps=1e-50)
    _, out = conv(torch.randn(2, 4), torch.zeros(2, 3), torch.tensor([[0, 1], [1, 0]]),
                  update_coords=False)  # (no coordinate update: eps unused)
    assert torch.equal(out, torch.zeros(2, 3))


def test_conv_repr_shows_coords_range_and_eps():
    text = repr(EGNNConv(4, tanh=True, coords_range=3.0, eps=1e-6))
    assert 'coords_range=3.0' in text and 'eps=1e-06' in text


def test_repr_shows_the_activation_and_the_residual():
    # EGNN's repr left out act: EGNN(2, act='relu') printed as the SiLU model, and evaluated
    # built it, with the same repr; EGNNConv's left out act and residual too
    model = EGNN(2, hidden_channels=8, num_layers=1, act='relu')
    text = repr(model)
    assert "act='relu'" in text
    again = eval(text, {'EGNN': EGNN})
    assert again.act == 'relu' and isinstance(again.head[1], torch.nn.ReLU)
    conv = repr(EGNNConv(4, act='relu', residual=False))
    assert "act='relu'" in conv and 'residual=False' in conv


def test_egnn_refuses_coordinates_of_zero_columns():
    # pos of shape (N, 0) ran without any geometry, in the model, the layer and the preset
    from torch_mz.models import build_model
    with pytest.raises(ValueError, match=r"at least one coordinate column.*got \(3, 0\)"):
        EGNN(4, 8, 1)(torch.randn(3, 4), torch.randn(3, 0))
    with pytest.raises(ValueError, match=r"at least one coordinate column.*got \(2, 0\)"):
        EGNNConv(4)(torch.randn(2, 4), torch.randn(2, 0), torch.tensor([[0, 1], [1, 0]]))
    model = build_model('egnn', 4, 1, hidden_channels=8, num_layers=1)
    batch = Batch.from_data_list([Data(x=torch.randn(3, 4), pos=torch.randn(3, 0))])
    with pytest.raises(ValueError, match=r"at least one coordinate column.*got \(3, 0\)"):
        model(batch)


@pytest.mark.parametrize('bad, match', [
    (dict(coord_aggr='bogus'), r"'coord_aggr' must be one of \('mean', 'sum'\), got 'bogus'"),
    (dict(coord_aggr=None), r"'coord_aggr' must be one of .*got None"),
    (dict(act=None), r"'act' must name a PyG activation.*got None"),
    (dict(act='bogus'), r"'act' must name a PyG activation.*got 'bogus'"),
    (dict(act=torch.nn.ReLU), r"'act' must name a PyG activation.*got <class"),
    (dict(act='swish'), r"'act' 'swish' is a name PyG's resolver gives a plain function "
     r"for, not an activation module; name a module \('silu'"),  # (a function)
])
def test_layer_options_are_checked_without_layers_too(bad, match):
    # EGNN(num_layers=0, coord_aggr='bogus') was accepted: the options were checked only inside
    # the layers, none of which was built; act=None or a class was taken as it was and failed
    # in the first call ("'NoneType' object is not callable") or inside Sequential
    for make in (lambda: EGNN(3, num_layers=0, **bad), lambda: EGNN(3, num_layers=2, **bad),
                 lambda: EGNNConv(4, **bad)):
        with pytest.raises(ValueError, match=match):
            make()
    assert EGNN(3, num_layers=0, act=torch.nn.ReLU()).head[1].__class__ is torch.nn.ReLU


def test_act_swish_is_refused_naming_silu_not_as_an_unknown_name():
    # the bug: act='swish' was refused as "'act' must name a PyG activation", while PyG's
    # resolver knows 'swish' (as a function, not a module); the message now says so and names
    # 'silu', the same function as a module
    from torch_geometric.nn.resolver import activation_resolver
    assert not isinstance(activation_resolver('swish'), torch.nn.Module)  # (PyG's own)
    for make in (lambda: EGNNConv(4, act='swish'), lambda: EGNN(3, num_layers=0, act='swish')):
        with pytest.raises(ValueError) as refused:
            make()
        assert 'must name a PyG activation' not in str(refused.value)
        assert "'silu'" in str(refused.value)
    x = torch.randn(6, 4)
    assert torch.allclose(activation_resolver('swish')(x), torch.nn.SiLU()(x))
    assert EGNNConv(4, act='silu').edge_mlp[1].__class__ is torch.nn.SiLU


def test_documented_act_says_an_activation_module_is_shared():
    # EGNN's docstring named only PyG activation names, while EGNN takes a module too (used as
    # it is: one instance in every layer, a parametrised one sharing its parameters)
    act = torch.nn.PReLU()
    model = EGNN(3, hidden_channels=8, num_layers=2, act=act)
    assert [m for m in model.modules() if isinstance(m, torch.nn.PReLU)] == [act]  # (shared)
    for cls in (EGNN, EGNNConv):
        doc = ' '.join(cls.__doc__.split())
        assert 'activation module' in doc and 'one instance in every' in doc, cls.__name__


@pytest.mark.parametrize('aggr', [None, 5, 'bogus'])
def test_conv_names_an_aggr_that_is_no_aggregation(aggr):
    # None and 5 failed with an AttributeError, 'bogus' with PyG's resolver not naming 'aggr'
    with pytest.raises(ValueError, match=r"'aggr'"):
        EGNNConv(4, aggr=aggr)


def test_conv_repr_quotes_its_string_options_and_evaluates():
    # aggr=add and coord_aggr=mean were printed unquoted (act='silu' quoted, as EGNN prints its
    # string options): the repr did not evaluate
    from torch_geometric.nn.aggr import MeanAggregation, SoftmaxAggregation
    names = {'EGNNConv': EGNNConv, 'SoftmaxAggregation': SoftmaxAggregation,
             'MeanAggregation': MeanAggregation}
    for aggr, shown in (('add', "aggr='add'"), (['add', 'mean'], "aggr=['add', 'mean']"),
                        (SoftmaxAggregation(learn=True), 'aggr=SoftmaxAggregation(learn=True)'),
                        (['max', MeanAggregation()], "aggr=['max', MeanAggregation()]")):
        conv = EGNNConv(4, hidden_channels=8, aggr=aggr, coord_aggr='sum', act='relu')
        text = repr(conv)
        assert shown in text and "coord_aggr='sum'" in text and "act='relu'" in text, text
        again = eval(text, names)
        assert repr(again) == text
        assert type(again.aggr_module) is type(conv.aggr_module)


@pytest.mark.parametrize('make', [
    lambda: EGNNConv(4, act='prelu', edge_gate=True),
    lambda: EGNN(3, hidden_channels=8, num_layers=2, act='prelu'),
    lambda: EGNN(3, hidden_channels=8, num_layers=0, act='prelu'),
])
def test_reset_parameters_resets_a_parametrised_activation(make):
    # reset_parameters reset the linear layers only: the slopes of act='prelu' stayed as trained
    torch.manual_seed(0)
    fresh = make()
    model = make()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(7.25)
    model.reset_parameters()
    params = dict(model.named_parameters())
    for name, p in fresh.named_parameters():
        assert not bool((params[name] == 7.25).all()), name
        if 'weight' in name and p.numel() == 1:  # a PReLU slope: its initial 0.25
            assert torch.equal(params[name], p), name


def test_conv_refuses_torch_jit_script_with_a_message():
    # it failed inside: "Compiled functions can't take variable number of arguments or use
    # keyword-only arguments with defaults"
    conv = EGNNConv(4)
    with pytest.raises(RuntimeError, match=r'EGNNConv cannot be compiled by torch.jit.script.*'
                                           r'Use torch.compile'):
        torch.jit.script(conv)
    h, pos = conv(torch.randn(3, 4), torch.randn(3, 2), fully_connected_edge_index(
        torch.zeros(3, dtype=torch.long)))  # eager use unchanged
    assert h.shape == (3, 4) and pos.shape == (3, 2)


def test_torch_jit_trace_of_the_model_is_refused_and_of_the_layer_taken():
    # a traced EGNN kept the pairs of elements of the traced batch (and its sorted-ids branch):
    # on a batch of the same set sizes whose elements came in another order it gave other
    # values without an error; the model (forward and encode, with feature columns too) is
    # refused, naming torch.compile. EGNNConv, given its edges as an input, still traces
    import warnings
    x, pos, batch = random_sets([3, 4, 2], 3, 5)
    model = EGNN(5, out_channels=2, hidden_channels=8, num_layers=2).double().eval()
    wrapped = SelectFeatures(EGNN(2, out_channels=2, hidden_channels=8,
                                num_layers=2).double().eval(), [0, 3])

    class Call(torch.nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, x, pos, batch):
            out = self.fn(x, pos, batch)
            return out[0] if isinstance(out, tuple) else out

    calls = [Call(model), Call(model.encode), Call(wrapped), Call(wrapped.encode)]
    for call in calls:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # (the tracer's own warnings)
            with pytest.raises(RuntimeError, match='EGNN cannot be recorded by torch.jit.trace'
                               '.*torch.compile'):
                torch.jit.trace(call, (x, pos, batch), check_trace=False)
    conv = EGNNConv(5, 8).double().eval()
    edge_index = fully_connected_edge_index(batch)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        traced = torch.jit.trace(conv, (x, pos, edge_index), check_trace=False)
    other = fully_connected_edge_index(batch.flip(0))  # the same sizes, other pairs
    for got, expected in zip(traced(x, pos, other), conv(x, pos, other)):
        torch.testing.assert_close(got, expected)
