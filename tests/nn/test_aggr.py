import inspect
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import SAGEConv
from torch_geometric.nn.aggr import MultiAggregation

from torch_mz.nn import MZAggregation
from torch_mz.nn.aggr import largest_finite_magnitude
from torch_mz.testing import permute_within_sets
from tests.nn._sets import make_index, ptr_from_sizes

F_IN = 5
SMALL = dict(dim=8, heads=2, num_generators=2, num_matrix_generators=2, num_inducing=3,
             num_seeds=2, num_encoder_blocks=1, num_decoder_blocks=1, d_ff=8)


def _aggr(seed=0, dtype=torch.float64, **kwargs):
    torch.manual_seed(seed)
    kwargs = dict(SMALL, **kwargs)
    if kwargs.get('value', 'mz') != 'mz':  # L is the MZ operator's (the others refuse it)
        del kwargs['num_matrix_generators']
    return MZAggregation(F_IN, **kwargs).to(dtype).eval()


def _x(n, seed=0, dtype=torch.float64):
    return torch.randn(n, F_IN, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(0, 8), min_size=1, max_size=5), seed=st.integers(0, 9999),
       value=st.sampled_from(['mz', 'rigid', 'film', 'hypernet']),
       encoder=st.sampled_from(['isab', 'sab']))
def test_invariant_to_permutations_within_sets(sizes, seed, value, encoder):
    aggr = _aggr(value=value, encoder=encoder)
    index = make_index(sizes)
    x = _x(index.numel(), seed)
    perm = permute_within_sets(index, torch.Generator().manual_seed(seed))
    out = aggr(x, index, dim_size=len(sizes))
    torch.testing.assert_close(aggr(x[perm], index[perm], dim_size=len(sizes)), out)
    assert out.shape == (len(sizes), F_IN) and torch.isfinite(out).all()
    empty = torch.tensor(sizes) == 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))


def test_index_ptr_unsorted_and_dim_size_agree():
    aggr = _aggr()
    sizes = [3, 1, 0, 6, 2]
    index = make_index(sizes)
    x = _x(index.numel())
    out = aggr(x, index)  # dim_size inferred: 5 sets
    torch.testing.assert_close(aggr(x, ptr=ptr_from_sizes(sizes)), out)
    shuffle = torch.randperm(index.numel(), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(aggr(x[shuffle], index[shuffle]), out)
    padded = aggr(x, index, dim_size=8)  # trailing empty sets kept
    assert padded.shape == (8, F_IN)
    torch.testing.assert_close(padded[:5], out)
    assert torch.equal(padded[5:], torch.zeros(3, F_IN, dtype=torch.float64))
    # a set of one element works and the empty set is exactly zero
    assert torch.isfinite(out[1]).all() and out[1].abs().sum() > 0
    assert torch.equal(out[2], torch.zeros(F_IN, dtype=torch.float64))


@pytest.mark.parametrize('value', ['mz', 'rigid'])
def test_dense_and_scatter_paths_agree(value):
    dense = _aggr(value=value, path='dense')
    scatter = _aggr(value=value, path='scatter')
    scatter.load_state_dict(dense.state_dict())
    index = make_index([7, 2, 0, 11, 1], shuffle=True, generator=torch.Generator().manual_seed(2))
    x = _x(index.numel(), 3)
    torch.testing.assert_close(dense(x, index), scatter(x, index))
    uniform = make_index([4, 4, 4])  # the exact dense path (one bucket, no gather)
    x = _x(12, 4)
    torch.testing.assert_close(dense(x, uniform), scatter(x, uniform))


@pytest.mark.parametrize('chunk_size', [1, 5, 8, 1000])
def test_chunked_encoding_equals_unchunked(chunk_size):
    aggr = _aggr()
    chunked = _aggr(chunk_size=chunk_size)
    chunked.load_state_dict(aggr.state_dict())
    index = make_index([3, 0, 7, 1, 4, 0, 2], shuffle=True,
                       generator=torch.Generator().manual_seed(5))
    x = _x(index.numel(), 6).requires_grad_()
    grads = []
    for module in (aggr, chunked):  # the same values and gradients (input and parameters)
        x.grad = None
        module.zero_grad()
        out = module(x, index, dim_size=9)
        out.pow(2).sum().backward()
        grads.append([out, x.grad] + [p.grad for p in module.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match='chunk_size'):
        MZAggregation(3, chunk_size=0)


def test_changing_one_set_never_changes_another():
    aggr = _aggr()
    index = make_index([3, 4, 2])
    x = _x(9, 5)
    x2 = x.clone()
    x2[index == 1] += 1.0
    a, b = aggr(x, index), aggr(x2, index)
    torch.testing.assert_close(a[[0, 2]], b[[0, 2]])
    assert not torch.allclose(a[1], b[1])


def test_reduction_mz_without_generators_equals_rigid():
    mz = _aggr(value='mz')
    with torch.no_grad():
        for m in mz.modules():
            if hasattr(m, 'matrix_gens'):
                m.matrix_gens.zero_()
                m.mix.zero_()
    rigid = _aggr(value='rigid')
    missing, unexpected = rigid.load_state_dict(mz.state_dict(), strict=False)
    assert not missing and all(k.endswith(('matrix_gens', 'mix', 'gate.weight'))
                               for k in unexpected)
    index = make_index([3, 5, 1])
    x = _x(9, 6)
    torch.testing.assert_close(mz(x, index), rigid(x, index))


def test_gradcheck_float64():
    aggr = _aggr(dim=4, heads=2, num_generators=1, num_matrix_generators=1, num_inducing=2,
                 num_seeds=1, d_ff=4)
    index = make_index([2, 1, 3])
    x = _x(6, 7).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: aggr(t, index), (x, ), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize('value', ['mz', 'rigid', 'film', 'hypernet'])
def test_every_parameter_gets_a_finite_gradient_with_an_empty_set(value):
    # (the rigid operator has no gates, so no summary of its own)
    aggr = _aggr(value=value, dtype=torch.float32, summary='mean' if value == 'rigid'
                 else 'mean+std', dropout=0.1, log_n=True)
    aggr.train()
    with torch.no_grad():  # make the zero-initialised context parameters non-zero
        for name, p in aggr.named_parameters():
            if 'film' in name or 'hyper_u' in name or 'gens' in name:
                p.normal_(std=0.1)
    index = make_index([4, 0, 1, 5])
    x = _x(10, 8, dtype=torch.float32).requires_grad_()
    aggr(x, index).pow(2).sum().backward()
    for name, p in aggr.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    assert torch.isfinite(x.grad).all()


def test_sageconv_drop_in():
    torch.manual_seed(0)
    aggr = MZAggregation(6, **SMALL)
    conv = SAGEConv(6, 7, aggr=aggr).eval()
    x = torch.randn(5, 6)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 0, 2], [1, 0, 1, 1, 0, 3, 3]])
    out = conv(x, edge_index)
    neighbours = aggr(x[edge_index[0]], edge_index[1], dim_size=5)
    torch.testing.assert_close(out, conv.lin_l(neighbours) + conv.lin_r(x))
    # nodes 2 and 4 have no in-neighbours: their aggregate is zero
    assert torch.equal(neighbours[[2, 4]], torch.zeros(2, 6))
    shuffled = edge_index[:, torch.randperm(edge_index.size(1))]
    torch.testing.assert_close(conv(x, shuffled), out, rtol=1e-5, atol=1e-6)
    multi = MultiAggregation(['mean', MZAggregation(6, **SMALL)])
    assert multi(x[edge_index[0]], edge_index[1], dim_size=5).shape == (5, 12)


def test_unsorted_edges_and_isolated_nodes_match_a_per_node_loop_as_documented():
    # forward's docstring says which: an unsorted index is taken (not refused, not sorted by the
    # caller), and the nodes without in-edges that dim_size counts get zeros
    doc = ' '.join(MZAggregation.forward.__doc__.split())
    assert '``index`` need not be sorted' in doc and 'output of zeros' in doc
    torch.manual_seed(0)
    aggr = MZAggregation(F_IN, **SMALL).double().eval()
    multi = MultiAggregation(['mean', aggr])
    x = _x(8)
    edge_index = torch.tensor([[3, 0, 5, 1, 7, 2, 6, 0, 4],
                               [6, 1, 0, 6, 1, 6, 3, 3, 0]])  # unsorted; 2, 4, 5, 7 isolated
    src, dst = edge_index
    out = multi(x[src], dst, dim_size=8)  # (8, 2 F)
    for node in range(8):  # each neighbourhood alone, as one set
        rows = x[src[dst == node]]
        alone = aggr(rows, torch.zeros(rows.size(0), dtype=torch.long), dim_size=1)[0]
        torch.testing.assert_close(out[node, F_IN:], alone)
    assert torch.equal(out[[2, 4, 5, 7]], torch.zeros(4, 2 * F_IN, dtype=torch.float64))


@pytest.mark.parametrize('kwargs', [{}, dict(preset='paper', dim=8, d_ff=8),
                                    dict(value='film'), dict(value='hypernet'),
                                    dict(value='rigid', num_generators=0)])
def test_reset_parameters_reinitialises_every_parameter(kwargs):
    # (PyG's convs call aggr.reset_parameters(): no parameter may keep a trained value)
    aggr = MZAggregation(F_IN, **kwargs)
    with torch.no_grad():
        for p in aggr.parameters():
            p.fill_(0.123)
    aggr.reset_parameters()
    kept = [name for name, p in aggr.named_parameters() if bool((p == 0.123).any())]
    assert kept == []


def test_readout_over_a_dataloader_batch():
    aggr = _aggr(dtype=torch.float32)
    g = torch.Generator().manual_seed(9)
    graphs = [Data(x=torch.randn(n, F_IN, generator=g)) for n in (3, 7, 1, 4, 9)]
    batch = next(iter(DataLoader(graphs, batch_size=5)))
    out = aggr(batch.x, batch.batch, dim_size=batch.num_graphs)
    out_ptr = aggr(batch.x, ptr=batch.ptr)
    for i, data in enumerate(graphs):
        torch.testing.assert_close(out[i], aggr(data.x)[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out_ptr, out)


def test_autocast_bfloat16_cpu():
    aggr = _aggr(dtype=torch.float32)
    index = make_index([3, 4])
    x = _x(7, dtype=torch.float32)
    ref = aggr(x, index)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = aggr(x, index)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, rtol=0.1, atol=0.1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA not available')
def test_cuda_matches_cpu():
    aggr = _aggr(dtype=torch.float32)
    index = make_index([3, 0, 5], shuffle=True)
    x = _x(8, dtype=torch.float32)
    ref = aggr(x, index)
    torch.testing.assert_close(aggr.cuda()(x.cuda(), index.cuda()).cpu(), ref, rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize('call, match', [
    (lambda a: a(torch.randn(2, 3, F_IN)), r'shape \(N, 5\) \(got \(2, 3, 5\)\)'),
    (lambda a: a(torch.randn(4, 3), torch.zeros(4, dtype=torch.long)), r'\(N, 5\)'),
    (lambda a: a(torch.randn(4, F_IN), torch.zeros(3, dtype=torch.long)), 'index'),
    (lambda a: a(torch.randn(4, F_IN), torch.tensor([0, 1, 2, 5]), dim_size=3), r'\[0, 3\)'),
    (lambda a: a(torch.randn(4, F_IN), ptr=torch.tensor([0, 3, 2, 4])), 'ptr'),
    (lambda a: a(torch.randn(4, F_IN), ptr=torch.tensor([0, 3])), 'ptr'),
    (lambda a: a(torch.randn(4, F_IN), torch.zeros(4)), 'integer'),
])
def test_bad_input_raises_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call(_aggr(dtype=torch.float32))


def test_repr_reset_and_documented_arguments():
    aggr = _aggr(value='film', readout='signed')
    text = repr(aggr)
    assert text.startswith('MZAggregation(5, 5,') and 'value=film' in text
    assert 'readout=signed' in text
    # configurations that differ in dropout, width, path or rank print differently
    assert repr(MZAggregation(8, dropout=0.1)) != repr(MZAggregation(8))
    assert 'd_ff=32, dropout=0.1' in repr(MZAggregation(8, d_ff=32, dropout=0.1))
    assert 'path=scatter' in repr(MZAggregation(8, path='scatter'))
    assert 'rank=3' in repr(MZAggregation(8, value='hypernet', rank=3))
    torch.manual_seed(3)
    aggr.reset_parameters()
    first = [p.clone() for p in aggr.parameters()]
    torch.manual_seed(3)
    aggr.reset_parameters()
    assert all(torch.equal(a, b) for a, b in zip(first, aggr.parameters()))
    documented = re.findall(r'^\s{8}(\w+) \(', MZAggregation.__doc__, flags=re.M)
    assert documented == list(inspect.signature(MZAggregation.__init__).parameters)[1:]
    with pytest.raises(ValueError, match='readout'):
        MZAggregation(3, readout='max')
    with pytest.raises(ValueError, match='encoder'):
        MZAggregation(3, encoder='mlp')
    with pytest.raises(ValueError, match="'checkpoint' must be one of"):
        MZAggregation(4, checkpoint='block')


def test_fold_keys_reaches_every_attention_and_changes_only_rounding():
    # d = 64, one seed per set of 40 elements: the PMA folds its key map into the seed (see
    # MZAttention._keys_folded); fold_keys=False keeps it on the keys, with the same values
    # and gradients in float64
    from torch_mz.nn.attention import MZAttention
    sizes = [40, 25, 33]
    index = make_index(sizes)
    results = []
    for fold in (True, False):
        torch.manual_seed(0)
        aggr = MZAggregation(64, value='rigid', num_generators=0, fold_keys=fold).double()
        attns = [m for m in aggr.modules() if isinstance(m, MZAttention)]
        assert attns and all(m.fold_keys is fold for m in attns)
        assert ('fold_keys=False' in repr(aggr)) is (not fold)
        assert ('fold_keys=False' in repr(attns[0])) is (not fold)
        pma = aggr.pma.mab.attn
        merged = []
        original = type(pma)._keys_folded
        pma._keys_folded = lambda *a, **k: merged.append(original(pma, *a, **k)) or merged[-1]
        torch.manual_seed(1)
        x = torch.randn(index.numel(), 64, dtype=torch.float64, requires_grad=True)
        out = aggr(x, index, dim_size=len(sizes))
        out.pow(2).sum().backward()
        assert merged == ([True] if fold else [])  # unfolded: never even considered
        results.append([out, x.grad] + [p.grad for p in aggr.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # the attribute reads and sets every attention's, after construction too
    aggr.fold_keys = True
    assert aggr.fold_keys and all(m.fold_keys for m in attns)
    attns[0].fold_keys = False
    assert not aggr.fold_keys and 'fold_keys=False' in repr(aggr)


def test_no_rows_gives_zeros_for_every_set():
    aggr = _aggr()
    out = aggr(torch.zeros(0, F_IN, dtype=torch.float64), torch.zeros(0, dtype=torch.long),
               dim_size=0)
    assert out.shape == (0, F_IN)
    out = aggr(torch.zeros(0, F_IN, dtype=torch.float64), torch.zeros(0, dtype=torch.long),
               dim_size=3)
    assert torch.equal(out, torch.zeros(3, F_IN, dtype=torch.float64))
    out.sum().backward()  # a graph exists, as for any aggregation output


def test_ptr_takes_precedence_and_a_disagreeing_index_is_refused():
    aggr = _aggr()
    sizes = [2, 3]
    x = _x(5)
    out = aggr(x, make_index(sizes), ptr=ptr_from_sizes(sizes))  # agreeing: accepted
    torch.testing.assert_close(out, aggr(x, ptr=ptr_from_sizes(sizes)))
    with pytest.raises(ValueError, match="'index' and 'ptr'"):
        aggr(x, make_index([3, 2]), ptr=ptr_from_sizes(sizes))
    # a float index is refused with ptr as without it (it was accepted where it agreed)
    with pytest.raises(ValueError, match="integer 'index'"):
        aggr(x, make_index(sizes).float(), ptr=ptr_from_sizes(sizes))
    with pytest.raises(ValueError, match="integer 'index'"):
        aggr(x, make_index(sizes).float())


def test_validate_refuses_a_dim_size_that_disagrees_with_ptr():
    # forward refused it (PyG's Aggregation.__call__), but the public validate() took it: the
    # sets that ptr describes were silently cut (dim_size 2 for 4 sets) or padded (6)
    aggr = _aggr()
    x = _x(3)
    ptr = torch.tensor([0, 1, 3, 3, 3])  # 4 sets, the last two empty
    set_id, num_sets = aggr.validate(x, ptr=ptr, dim_size=4)  # agreeing: accepted
    assert num_sets == 4 and torch.equal(set_id, torch.tensor([0, 1, 1]))
    for dim_size in (2, 6):
        with pytest.raises(ValueError, match="'dim_size' to equal the 4 sets"):
            aggr.validate(x, ptr=ptr, dim_size=dim_size)


def test_ptr_of_any_integer_dtype_as_an_index():
    # an int16 or uint8 index was taken, and a ptr of those dtypes, accepted by the check,
    # failed inside repeat_interleave (NotImplementedError); a decreasing uint8 ptr wrapped
    # around to positive sizes and was named as an index of another shape
    aggr = _aggr()
    sizes = [2, 3]
    x = _x(5)
    ref = aggr(x, ptr=ptr_from_sizes(sizes))
    for dtype in (torch.int32, torch.int16, torch.uint8):
        assert torch.equal(aggr(x, ptr=ptr_from_sizes(sizes).to(dtype)), ref)
        with pytest.raises(ValueError, match="'ptr' to be non-decreasing from 0"):
            aggr(x, ptr=torch.tensor([0, 3, 2, 5], dtype=dtype))


def test_accepts_pyg_max_num_elements():
    aggr = _aggr()
    index = make_index([2, 3])
    x = _x(5)
    torch.testing.assert_close(aggr(x, index, max_num_elements=3), aggr(x, index))


def test_max_num_elements_is_checked_not_applied():
    # a bound below a set's size was ignored without a word (as were -5 and 'a'), where PyG's
    # dense aggregations (its SetTransformerAggregation) keep the set's first rows and drop the
    # rest; FlatSetTransformerAggregation refused it. Refused here too, with the same message
    from torch_geometric.nn.aggr import SetTransformerAggregation
    aggr = _aggr()
    index = make_index([3, 0, 2])
    x = _x(5)
    torch.manual_seed(0)
    pyg = SetTransformerAggregation(F_IN, heads=1).double().eval()
    assert not torch.allclose(pyg(x, index, max_num_elements=2), pyg(x, index))  # rows dropped
    for bound in (3, 10, np.int64(3)):  # every set meets it: nothing changes
        assert torch.equal(aggr(x, index, max_num_elements=bound), aggr(x, index))
    assert aggr(x, ptr=ptr_from_sizes([3, 0, 2]), max_num_elements=3).shape == (3, F_IN)
    with pytest.raises(ValueError, match=r'A set has 3 elements, more than max_num_elements=2 '
                                         r"\(PyG's aggregation would drop the rows beyond it"):
        aggr(x, index, max_num_elements=2)
    for bad in (-5, 'a', 2.5, True):
        with pytest.raises(ValueError, match=r"'max_num_elements' must be an integer >= 0 or "
                                             r"None \(got "):
            aggr(x, index, max_num_elements=bad)
    # no rows: any bound is met
    assert aggr(x[:0], index[:0], dim_size=2, max_num_elements=0).shape == (2, F_IN)


@pytest.mark.parametrize('x, match', [
    (torch.ones(4, F_IN, dtype=torch.long), 'floating-point'),
    (torch.ones(4, F_IN, dtype=torch.float16), "module's dtype"),
    (torch.full((4, F_IN), 1e30), 'rescale'),
])
def test_bad_input_dtypes_and_magnitudes_are_named_at_the_boundary(x, match):
    with pytest.raises(ValueError, match=match):
        _aggr(dtype=torch.float32)(x, torch.tensor([0, 0, 1, 1]))


def test_largest_accepted_magnitude_gives_finite_output():
    for dtype, limit in ((torch.float32, 1e15), (torch.float64, 1e150)):
        aggr = _aggr(dtype=dtype)
        x = torch.full((5, F_IN), limit, dtype=dtype)
        x[1] *= -1
        assert torch.isfinite(aggr(x, torch.tensor([0, 0, 1, 1, 1]))).all()
        # infinities and NaN stay inside their set
        x = _x(5, dtype=dtype)
        x[0, 0] = float('inf')
        x[1, 1] = float('nan')
        out = aggr(x, torch.tensor([0, 0, 1, 1, 1]))
        assert torch.isfinite(out[1]).all()


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_largest_finite_magnitude_ignores_nan_and_infinities(dtype):
    # the one-pass check (minimum and maximum) and the masked one agree; a too-large finite entry
    # next to NaN or an infinity is still found, and NaN/infinity alone read as 0
    x = torch.tensor([1.0, -3.0, 2.0], dtype=dtype)
    assert largest_finite_magnitude(x) == 3.0
    for poison in (float('nan'), float('inf'), -float('inf')):
        y = torch.tensor([poison, -5.0, 2.0], dtype=dtype)
        assert largest_finite_magnitude(y) == 5.0
        assert largest_finite_magnitude(torch.tensor([poison], dtype=dtype)) == 0.0
    x = torch.randn(2, F_IN)
    x[0, 1], x[1, 0] = float('nan'), -1e31
    with pytest.raises(ValueError, match=r'1e\+31 exceed'):
        _aggr(dtype=torch.float32).validate(x)


def test_presets_fill_only_what_is_left_unset():
    neighbourhood = MZAggregation(16)
    assert (neighbourhood.dim, neighbourhood.d_ff, neighbourhood.encoder,
            neighbourhood.num_encoder_blocks, neighbourhood.num_generators,
            neighbourhood.num_matrix_generators) == (16, 16, 'sab', 1, 2, 1)
    assert MZAggregation(3).dim == 16 and MZAggregation(70, heads=4).dim == 72
    # at least 16, then a multiple of the heads: with heads that do not divide 16 a small input
    # is not refused for a width the user never chose (it was, e.g. 8 channels and 3 heads)
    for channels, heads, dim in ((8, 3, 18), (3, 3, 18), (8, 6, 18), (10, 3, 18), (5, 6, 18),
                                 (16, 3, 18), (15, 6, 18), (8, 4, 16), (20, 3, 21)):
        assert MZAggregation(channels, heads=heads).dim == dim, (channels, heads)
    paper = MZAggregation(3, preset='paper')
    assert (paper.dim, paper.d_ff, paper.encoder, paper.num_encoder_blocks,
            paper.num_inducing, paper.num_generators, paper.num_matrix_generators) == \
        (64, 128, 'isab', 2, 16, 8, 4)
    assert MZAggregation(3, num_generators=8).num_generators == 8
    assert MZAggregation(3, preset='paper', dim=32, encoder='sab').encoder == 'sab'
    with pytest.raises(ValueError, match='preset'):
        MZAggregation(3, preset='large')


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), min_size=0, max_size=5), seed=st.integers(0, 9999),
       dtype=st.sampled_from([torch.float32, torch.float64]),
       scale=st.sampled_from([1e-30, 1.0, 1e6, 1e15]),
       poison=st.sampled_from([None, 'nan', 'inf']), trailing=st.integers(0, 2),
       value=st.sampled_from(['mz', 'rigid']), encoder=st.sampled_from(['isab', 'sab']))
def test_fuzz_operator_contract(sizes, seed, dtype, scale, poison, trailing, value, encoder):
    r"""Random set sizes (0 and 1 included), dtypes, magnitudes up to the documented limit, a NaN
    or infinite entry, trailing empty sets: the output has one row per set, empty sets give
    exactly zero, finite input gives finite output, a poisoned set leaves the others unchanged,
    and index / ptr / unsorted index and the dense / scatter paths agree."""
    dense = _aggr(dtype=dtype, value=value, encoder=encoder, path='dense')
    scatter = _aggr(dtype=dtype, value=value, encoder=encoder, path='scatter')
    scatter.load_state_dict(dense.state_dict())
    g = torch.Generator().manual_seed(seed)
    index = make_index(sizes)
    B = len(sizes) + trailing
    x = torch.randn(index.numel(), F_IN, generator=g, dtype=torch.float64)
    if x.numel() > 0:
        x = x / x.abs().max().clamp(min=1)
    x = (x * scale).to(dtype)  # largest magnitude at most scale
    out = dense(x, index, dim_size=B)
    assert out.shape == (B, F_IN) and out.dtype == dtype
    empty = torch.tensor(sizes + [0] * trailing) == 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert torch.isfinite(out).all()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else {}
    ptr = ptr_from_sizes(sizes + [0] * trailing)
    torch.testing.assert_close(dense(x, ptr=ptr), out, **tol)
    torch.testing.assert_close(scatter(x, index, dim_size=B), out, **tol)
    perm = torch.randperm(index.numel(), generator=g)
    torch.testing.assert_close(dense(x[perm], index[perm], dim_size=B), out, **tol)
    if poison is not None and index.numel() > 0:
        bad = x.clone()
        bad[0, 0] = float(poison)
        poisoned = dense(bad, index, dim_size=B)
        others = torch.arange(B) != index[0]
        torch.testing.assert_close(poisoned[others], out[others], **tol)


@pytest.mark.parametrize('encoder', ['isab', 'sab'])
@pytest.mark.parametrize('checkpoint', [True, 'attention'])
def test_checkpointed_blocks_give_the_same_values_and_gradients(encoder, checkpoint):
    aggr = _aggr(encoder=encoder, dropout=0.1).train()
    ckpt = _aggr(encoder=encoder, dropout=0.1, checkpoint=checkpoint).train()
    ckpt.load_state_dict(aggr.state_dict())
    index = make_index([3, 0, 5, 1])
    results = []
    for module in (aggr, ckpt):
        # and what is recomputed runs twice, once without checkpointing (with checkpointing
        # never done, the values alone agreed): the PMA block (checkpoint=True) or its
        # attention's aggregation (checkpoint='attention')
        runs = []
        if checkpoint is True:
            # (a pre-hook: the recomputation stops once it has made the saved tensors)
            handle = module.pma.register_forward_pre_hook(lambda *a: runs.append(1))
        else:
            attn = next(m for m in module.pma.modules() if hasattr(m, '_aggregate'))
            aggregate = attn._aggregate
            attn._aggregate = lambda *a: runs.append(1) or aggregate(*a)
        torch.manual_seed(4)  # same dropout masks
        x = _x(9, 2).requires_grad_()
        out = module(x, index)
        out.pow(2).sum().backward()
        results.append([out, x.grad] + [p.grad for p in module.parameters()])
        assert len(runs) == (2 if module is ckpt else 1)
        if checkpoint is True:
            handle.remove()
        else:
            del attn._aggregate
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('path, checkpoint', [('auto', False), ('scatter', False),
                                              ('auto', 'attention')])
@pytest.mark.parametrize('preset', ['neighbourhood', 'paper'])
def test_second_derivatives_through_the_aggregation(preset, path, checkpoint):
    # create_graph=True (forces trained from an energy, gradient penalties) goes through the
    # hand-written backward passes (LayerNorm Jacobian, feed-forward): gradgradcheck in float64
    torch.manual_seed(0)
    aggr = MZAggregation(4, preset=preset, dim=8, d_ff=8, num_inducing=2, path=path,
                         checkpoint=checkpoint).double()
    x = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    assert torch.autograd.gradgradcheck(lambda x: aggr(x, index), (x, ))


@pytest.mark.parametrize('chunk_size', [1, 6, 1000])
@pytest.mark.parametrize('shuffle', [False, True])
def test_checkpointed_chunks_give_the_same_values_and_gradients(chunk_size, shuffle):
    r"""``checkpoint='chunks'`` recomputes each group of sets in the backward pass: values, input
    gradients and parameter gradients equal the plain run's (float64, dropout on, empty sets,
    rows in set order or shuffled), and a second derivative goes through it."""
    aggr = _aggr(dropout=0.1).train()
    ckpt = _aggr(dropout=0.1, chunk_size=chunk_size, checkpoint='chunks').train()
    chunked = _aggr(dropout=0.1, chunk_size=chunk_size).train()  # the same groups, all kept
    ckpt.load_state_dict(aggr.state_dict())
    chunked.load_state_dict(aggr.state_dict())
    index = make_index([3, 0, 7, 1, 4, 0, 2], shuffle=shuffle,
                       generator=torch.Generator().manual_seed(5))
    calls = []  # rows of each group encoded by the checkpointed module
    encode_group = ckpt._encode_group
    ckpt._encode_group = lambda *a: calls.append(a[0].size(0)) or encode_group(*a)
    results = []
    for module in (chunked, ckpt) + ((aggr, ) if chunk_size == 1000 else ()):
        torch.manual_seed(4)  # the recomputation must draw the forward's dropout masks again
        x = _x(index.numel(), 2).requires_grad_()
        out = module(x, index, dim_size=9)
        out.pow(2).sum().backward()
        results.append([out, x.grad] + [p.grad for p in module.parameters()])
    for other in results[1:]:  # same operations in the same order (one group: as unchunked)
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)
    # each group ran in the forward pass and again, last group first, in the backward pass
    # sizes in set order: whole sets grouped by the window (of chunk_size rows) of their start,
    # each set counting its 2 seeds as rows (starts 0, 5, 14, 17, 23); empty sets not encoded
    groups = {1: [3, 7, 1, 4, 2], 6: [10, 5, 2], 1000: []}[chunk_size]
    assert calls == groups + groups[::-1]
    calls.clear()
    aggr.eval().zero_grad()
    ckpt.eval().zero_grad()
    ref, got = [], []
    for module, res in ((aggr, ref), (ckpt, got)):
        x = _x(index.numel(), 2).requires_grad_()
        with torch.enable_grad():
            out = module(x, index, dim_size=9)
        out.pow(2).sum().backward()
        res.extend([out, x.grad] + [p.grad for p in module.parameters()])
    for a, b in zip(ref, got):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    if chunk_size == 6 and shuffle:  # second derivatives, once: two groups, unsorted rows
        small = _aggr(dim=4, heads=2, num_generators=1, num_matrix_generators=1,
                      num_inducing=2, num_seeds=1, d_ff=4, chunk_size=2, checkpoint='chunks')
        x = _x(6, 7).requires_grad_()
        sets = torch.tensor([2, 0, 0, 1, 2, 2])
        assert torch.autograd.gradgradcheck(lambda t: small(t, sets), (x, ))
    with pytest.raises(ValueError, match="set 'chunk_size' too"):
        MZAggregation(4, checkpoint='chunks', chunk_size=None)


@pytest.mark.parametrize('checkpoint, reruns', [('auto', 0), (False, 0), ('chunks', 3)])
def test_integer_chunk_size_recomputes_only_with_checkpoint_chunks(checkpoint, reruns):
    r"""An integer ``chunk_size`` groups the sets; in training only ``checkpoint='chunks'``
    recomputes the groups (and so bounds the memory): with the default ``checkpoint='auto'``
    the groups keep every activation, as the docstring and README say."""
    aggr = _aggr(chunk_size=6, checkpoint=checkpoint).train()
    calls = []  # rows of each group encoded
    encode_group = aggr._encode_group
    aggr._encode_group = lambda *a: calls.append(a[0].size(0)) or encode_group(*a)
    index = make_index([3, 0, 7, 1, 4, 0, 2])
    out = aggr(_x(index.numel(), 2).requires_grad_(), index, dim_size=9)
    assert calls == [10, 5, 2]  # three groups in the forward pass
    out.pow(2).sum().backward()
    assert len(calls) == 3 + reruns  # again in the backward pass only where recomputed


def _spy_on_groups(monkeypatch, module, calls=None):
    r"""Records the row count of every group :obj:`module` encodes (in the returned list)."""
    calls = [] if calls is None else calls
    encode_group = module._encode_group
    monkeypatch.setattr(module, '_encode_group', lambda *a: calls.append(a[0].size(0))
                        or encode_group(*a))
    return calls


def _grouped_index():
    r"""Sets of 3, 0, 7, 1, 4, 0 and 2 rows, shuffled (17 rows; with ``dim_size=9`` two trailing
    empty sets)."""
    return make_index([3, 0, 7, 1, 4, 0, 2], shuffle=True,
                      generator=torch.Generator().manual_seed(5))


def _same_training(a, b, index, dim_size=9):
    r"""Checks that :obj:`a` and :obj:`b` give the same outputs and gradients (input and
    parameters) on one forward + backward pass; returns them, ``[out, x.grad, *param grads]``
    for each."""
    results = []
    for module in (a, b):
        x = _x(index.numel(), 2).requires_grad_()
        out = module(x, index, dim_size=dim_size)
        out.pow(2).sum().backward()
        results.append([out, x.grad] + [p.grad for p in module.parameters()])
    for u, v in zip(*results):
        torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-10)
    return results


# (issue 10) the aggregation's own alternatives: (name, constructor arguments); the reference
# is the scatter path, every key map on its keys, the batch at once, nothing recomputed
_AGGREGATION_PATHS = [('dense', dict(path='dense')),
                      ('folded keys', dict(path='dense', fold_keys=True)),
                      ('groups', dict(chunk_size=6)),
                      ('recomputed groups', dict(chunk_size=6, checkpoint='chunks')),
                      ('recomputed blocks', dict(checkpoint=True)),
                      ('recomputed attention', dict(path='dense', checkpoint='attention'))]


@pytest.mark.parametrize('value, encoder', [('mz', 'isab'), ('mz', 'sab'), ('rigid', 'isab'),
                                            ('film', 'sab'), ('hypernet', 'isab')])
def test_every_path_of_the_aggregation_gives_the_same_values_and_gradients(value, encoder,
                                                                           monkeypatch):
    r"""The dense and scatter attention paths, the folded key maps, groups of whole sets (kept
    or recomputed), recomputed blocks and recomputed attention, each entered by an unsorted
    ``index`` and by ``ptr`` (rows in set order): the reference's output and the gradients of
    the input and of every parameter in float64 to 1e-10, with a set of one element, empty
    sets (trailing ones too) and the input projection's affine generators reaching the first
    ISAB; and the same output without gradients and in training mode (dropout off)."""
    import torch_mz.nn.attention as attention
    monkeypatch.setattr(attention, 'FOLD_MARGIN', 1e-3)  # fold the PMA's and ISAB's seeds
    reference = _aggr(value=value, encoder=encoder, path='scatter', fold_keys=False,
                      chunk_size=None, checkpoint=False)
    sizes = [3, 0, 7, 1, 4, 0, 2]
    index = _grouped_index()
    order = torch.argsort(index, stable=True)
    ptr = ptr_from_sizes(sizes + [0, 0])
    x = _x(index.numel(), 2)
    cot = torch.randn(9, F_IN, generator=torch.Generator().manual_seed(3), dtype=x.dtype)

    def run(module, x, **sets):
        leaf = x.clone().requires_grad_()
        params = list(module.parameters())
        out = module(leaf, **sets)
        grads = torch.autograd.grad((out * cot).sum(), [leaf] + params, allow_unused=True)
        return [out] + [g if g is not None else torch.zeros_like(t)
                        for g, t in zip(grads, [leaf] + params)]
    expected = run(reference, x, index=index, dim_size=9)
    for name, kwargs in _AGGREGATION_PATHS:
        module = _aggr(value=value, encoder=encoder, **dict(dict(
            path='scatter', fold_keys=False, chunk_size=None, checkpoint=False), **kwargs))
        module.load_state_dict(reference.state_dict())
        results = [run(module, x, index=index, dim_size=9)]
        if name in ('dense', 'recomputed groups'):  # rows in set order, by ptr
            results.append(run(module, x[order], ptr=ptr))
            results[-1][1] = results[-1][1][torch.argsort(order)]  # the input's gradient
        tol = dict(rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f'{name}: {m}')
        for got in results:
            for a, b in zip(got, expected):
                torch.testing.assert_close(a, b, **tol)
        with torch.no_grad():
            torch.testing.assert_close(module(x, index, dim_size=9), expected[0], **tol)
    torch.testing.assert_close(module.train()(x, index, dim_size=9), expected[0], rtol=1e-10,
                               atol=1e-10)


def test_auto_chunking_of_large_inputs(monkeypatch):
    r"""``chunk_size='auto'`` (the default) encodes inputs of more than twice
    ``auto_chunk_rows(d)`` rows in groups, each run again in the backward pass, and gives the
    values and gradients of ``chunk_size=None``; smaller inputs take the unchunked path."""
    import torch_mz.nn.aggr as aggr_module
    plain = _aggr(chunk_size=None)
    auto = _aggr()
    assert auto.chunk_size == 'auto'
    # a budget of row elements: groups of 8 rows at this width
    monkeypatch.setattr(aggr_module, 'AUTO_CHUNK_ELEMENTS', 8 * auto.dim)
    assert aggr_module.auto_chunk_rows(auto.dim) == 8
    auto.load_state_dict(plain.state_dict())
    calls = _spy_on_groups(monkeypatch, auto)
    index = _grouped_index()
    results = _same_training(plain, auto, index)
    # 17 rows and 2 seeds for each of the 5 non-empty sets > 16: whole sets grouped by the
    # window (of 8) of their start (0, 5, 14, 17, 23 in rows and seeds): sizes 3 + 7, 1, 4 + 2
    # (the empty sets are not encoded); each group runs twice (forward, and again, last group
    # first, in the backward pass)
    assert calls == [10, 1, 6] + [6, 1, 10]
    calls.clear()
    with torch.no_grad():  # inference: chunked, nothing to recompute
        auto(_x(index.numel(), 2), index, dim_size=9)
    assert calls == [10, 1, 6]
    calls.clear()
    small = make_index([3, 5])
    auto(_x(8, 3), small)  # 8 rows and 4 seeds: at once
    assert calls == []
    one_set = torch.zeros(20, dtype=torch.long)  # one group (a set larger than a group): no rerun
    x = _x(20, 4).requires_grad_()
    out = auto(x, one_set)
    out.sum().backward()
    assert calls == []
    torch.testing.assert_close(out, plain(x, one_set))
    assert MZAggregation(4, chunk_size=np.int64(5)).chunk_size == 5
    assert 'chunk_size=auto, checkpoint=auto' in repr(auto)
    # checkpoint=False: the same groups in inference, the whole input at once in training
    kept = _aggr(checkpoint=False)
    kept.load_state_dict(plain.state_dict())
    encode_kept = kept._encode_group
    monkeypatch.setattr(kept, '_encode_group', lambda *a: calls.append(a[0].size(0))
                        or encode_kept(*a))
    x = _x(index.numel(), 2).requires_grad_()
    out = kept(x, index, dim_size=9)
    assert calls == []
    out.pow(2).sum().backward()
    assert calls == []
    torch.testing.assert_close(x.grad, results[0][1], rtol=1e-10, atol=1e-10)
    with torch.no_grad():
        torch.testing.assert_close(kept(_x(index.numel(), 2), index, dim_size=9),
                                   results[0][0], rtol=1e-10, atol=1e-10)
    assert calls == [10, 1, 6]
    calls.clear()
    # integers and numpy booleans take the modes of the booleans they equal
    for value, mode in ((0, False), (np.False_, False), (1, True), (np.True_, True)):
        assert MZAggregation(4, checkpoint=value).checkpoint is mode
    assert 'checkpoint=False' in repr(MZAggregation(4, checkpoint=0))
    # twice as wide tokens: groups of half as many rows (4: every set alone)
    wide = _aggr(dim=2 * auto.dim, chunk_size=None)
    auto_wide = _aggr(dim=2 * auto.dim)
    auto_wide.load_state_dict(wide.state_dict())
    assert auto_wide._chunk_rows(17) == 4 and auto_wide._chunk_rows(8) is None
    encode_wide = auto_wide._encode_group
    monkeypatch.setattr(auto_wide, '_encode_group', lambda *a: calls.append(a[0].size(0))
                        or encode_wide(*a))
    with torch.no_grad():
        torch.testing.assert_close(auto_wide(_x(index.numel(), 2), index, dim_size=9),
                                   wide(_x(index.numel(), 2), index, dim_size=9))
    assert calls == [3, 7, 1, 4, 2]
    for bad in (0, -3, 'big', True, 2.5):
        with pytest.raises(ValueError, match="'chunk_size' must be"):
            MZAggregation(4, chunk_size=bad)


@pytest.mark.parametrize('checkpoint', [False, True, 'attention'])
def test_checkpointed_blocks_keep_the_affine_generators(checkpoint):
    # checkpoint=True recomputes each block from its center and generators; the input
    # projection's affine description goes with them, so the first ISAB still aggregates the
    # input columns, and the values and gradients are the plain run's
    from torch_mz.nn.zonotope import AffineZonotope
    torch.manual_seed(0)
    aggr = MZAggregation(3, preset='paper', dim=16, d_ff=16, chunk_size=None,
                         checkpoint=checkpoint).double()
    plain = MZAggregation(3, preset='paper', dim=16, d_ff=16, chunk_size=None).double()
    plain.load_state_dict(aggr.state_dict())
    seen = []
    aggr.encoders[0].mab1.register_forward_pre_hook(lambda m, args: seen.append(args[1]))
    index = torch.tensor([0] * 40 + [1] * 25 + [2] * 3)
    x = torch.randn(index.numel(), 3, dtype=torch.float64)
    grads = []
    for module in (aggr, plain):
        out = module(x, index)
        grads.append([out] + list(torch.autograd.grad(out.square().sum(),
                                                      list(module.parameters()))))
    assert isinstance(seen[0], AffineZonotope) and seen[0].describes_gens()
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_auto_chunking_scales_with_the_gpu_memory(monkeypatch):
    r"""On a CUDA device ``chunk_size='auto'`` takes groups of the device's memory over
    ``AUTO_GPU_BYTES_PER_ELEMENT * d`` rows (never fewer than the CPU's), so a graph that
    fits runs at once there: the rule is checked with a stand-in for the device's memory (the
    CUDA path itself runs in ``benchmarks/gpu_check.sh``)."""
    import torch_mz.nn.aggr as aggr_module
    assert aggr_module.device_memory('cpu') is None and aggr_module.device_memory(None) is None
    assert aggr_module.auto_chunk_rows(64) == 2 ** 21 // 64
    assert aggr_module.auto_chunk_rows(64, 2 ** 34) == 2 ** 34 // (2048 * 64) == 131072
    assert aggr_module.auto_chunk_rows(16, 2 ** 34) == 4 * 131072
    # a small device never takes smaller groups than the CPU
    assert aggr_module.auto_chunk_rows(64, 2 ** 30) == aggr_module.auto_chunk_rows(64)
    seen = []

    def fake_memory(device):
        kind = None if device is None else torch.device(device).type
        seen.append(kind)
        return 2 ** 34 if kind == 'cuda' else None

    monkeypatch.setattr(aggr_module, 'device_memory', fake_memory)
    auto = MZAggregation(64)
    edges = 10 ** 6  # the messages of a graph of 10^5 nodes, average in-degree 10
    assert auto._chunk_rows(edges) == 32768  # the CPU's groups
    assert auto._chunk_rows(edges, 'cpu') == 32768
    assert auto._chunk_rows(edges, torch.device('cuda', 0)) == 131072  # 16 GiB
    assert auto._chunk_rows(2 * 131072, 'cuda') is None  # at most two groups: at once
    monkeypatch.setattr(aggr_module, 'device_memory', lambda device: 141 * 2 ** 30)  # one H200
    assert auto._chunk_rows(edges, 'cuda') is None
    assert MZAggregation(64, chunk_size=32768)._chunk_rows(edges, 'cuda') == 32768  # asked for
    # the forward pass asks for the input's device
    monkeypatch.setattr(aggr_module, 'device_memory', fake_memory)
    seen.clear()
    MZAggregation(4)(torch.randn(5, 4), torch.tensor([0, 0, 1, 1, 1]))
    assert seen == ['cpu']


def test_training_groups_where_glibc_maps_large_blocks_afresh(monkeypatch):
    r"""``chunk_size='auto'`` with ``checkpoint=False`` trains an input whose widest activation
    exceeds twice ``MALLOC_GROUP_BYTES`` in groups of whole sets of ``malloc_chunk_rows`` rows,
    every activation kept (each group runs once), with the values and gradients of the whole
    input, only on the CPU with glibc not keeping freed memory; never where freed memory is
    kept (by ``keep_freed_memory`` or glibc's environment), off the CPU, on another C library
    or under forward-mode AD."""
    import torch_mz.nn.aggr as aggr_module
    from torch_mz import runtime
    # the sizes of the paper's presets (d = 64, d_ff = 128; float32)
    assert aggr_module.malloc_chunk_rows(64, 8, 128) == 8192  # mz
    assert aggr_module.malloc_chunk_rows(64, 2, 128) == 32768  # mz-slim
    assert aggr_module.malloc_chunk_rows(64, 0, 128) == 32768  # rigid: the FFN's hidden layer
    assert aggr_module.malloc_chunk_rows(64, 8, 128, itemsize=8) == 4096
    # the default (neighbourhood) aggregation's groups are auto_chunk_rows' in float32
    for d in (16, 64):
        sizes = aggr_module.preset_defaults('neighbourhood', d, 4)
        assert aggr_module.malloc_chunk_rows(
            sizes['dim'], sizes['num_generators'], sizes['d_ff']) == aggr_module.auto_chunk_rows(d)
    # never below the compiled kernels' 2^20 generator elements: 2^24 bytes of a feed-forward
    # of 128 floats a row are 32,768 rows, which hold only 2^19 of them (the group's 32 MiB)
    assert aggr_module.malloc_chunk_rows(16, 1, 128) == 2 ** 20 // 16
    # and no groups where that floor makes them larger than 32 MiB (4,096 floats a row)
    assert aggr_module.malloc_chunk_rows(16, 1, 4096) is None
    monkeypatch.setattr(runtime, '_THRESHOLD', None)  # glibc's dynamic threshold
    monkeypatch.setattr(runtime, 'glibc', lambda: True)
    whole = _aggr(chunk_size=None, checkpoint=False).train()
    auto = _aggr(checkpoint=False).train()
    auto.load_state_dict(whole.state_dict())
    # tiny groups: the widest activation of a row of this module takes 16 * 8 bytes (float64),
    # so groups of 8 rows; the compiled kernels' floor lowered with it
    width = max(auto.d_ff, auto.num_generators * max(auto.dim, auto.d_ff // 2))
    monkeypatch.setattr(aggr_module, 'MALLOC_GROUP_BYTES', 8 * width * 8)
    monkeypatch.setattr(aggr_module, 'AUTO_MIN_ELEMENTS', 1)
    assert auto._malloc_group_rows() == 8 and auto._chunk_rows(17) == 8
    assert auto._chunk_rows(16) is None  # at most two groups: at once
    calls = _spy_on_groups(monkeypatch, auto)
    index = _grouped_index()
    _same_training(whole, auto, index)
    assert calls == [10, 1, 6]  # each group once: kept, not recomputed
    # where the groups do not apply: the whole input
    for device in ('cuda', torch.device('meta')):
        assert auto._malloc_group_rows(device) is None
    assert auto._malloc_group_rows('cpu') == 8
    with torch.autograd.forward_ad.dual_level():
        assert auto._malloc_group_rows() is None
    monkeypatch.setattr(runtime, '_THRESHOLD', 1 << 30)  # keep_freed_memory()'s, or glibc's
    assert runtime.freed_memory_kept() and auto._chunk_rows(17) is None
    monkeypatch.setattr(runtime, '_THRESHOLD', 32 << 20)  # not above 32 MiB: blocks still mapped
    assert not runtime.freed_memory_kept() and auto._chunk_rows(17) == 8
    monkeypatch.setattr(runtime, '_THRESHOLD', None)
    monkeypatch.setattr(runtime, 'glibc', lambda: False)
    assert auto._chunk_rows(17) is None
    monkeypatch.setattr(runtime, 'glibc', lambda: True)
    # other modes: the aggregation's default (recomputed groups) and an integer size unchanged
    assert _aggr()._chunk_rows(17) is None  # 17 <= 2 * auto_chunk_rows(d)
    assert _aggr(chunk_size=5, checkpoint=False)._chunk_rows(17) == 5
    # inference: the smaller of these groups and those of auto_chunk_rows, also for the
    # aggregation's default checkpoint='auto' (whose training groups stay auto_chunk_rows')
    calls.clear()
    recomputed = _aggr()
    recomputed.load_state_dict(whole.state_dict())
    with torch.no_grad():
        assert auto._chunk_rows(17) == 8 and recomputed._chunk_rows(17) == 8
        assert auto._chunk_rows(16) is None
        torch.testing.assert_close(auto(_x(index.numel(), 2), index, dim_size=9),
                                   whole(_x(index.numel(), 2), index, dim_size=9),
                                   rtol=1e-10, atol=1e-10)
        monkeypatch.setattr(aggr_module, 'AUTO_CHUNK_ELEMENTS', 3 * auto.dim)
        assert auto._chunk_rows(17) == 3  # auto_chunk_rows' groups, where smaller
        monkeypatch.setattr(runtime, '_THRESHOLD', 1 << 30)
        assert auto._chunk_rows(17) == 3
        monkeypatch.setattr(aggr_module, 'AUTO_CHUNK_ELEMENTS', 2 ** 21)
        assert auto._chunk_rows(17) is None  # kept memory: auto_chunk_rows' groups alone
    assert calls == [10, 1, 6]
    assert recomputed._chunk_rows(17) is None  # training, checkpoint='auto': unchanged


@pytest.mark.parametrize('kwargs, message', [
    (dict(log_n='False'), "'log_n' must be True or False (got 'False')"),
    (dict(fold_keys='no'), "'fold_keys' must be True or False"),
    (dict(out_channels=0), "'out_channels' must be an integer >= 1 or None"),
    (dict(out_channels=-1), "'out_channels' must be an integer >= 1 or None"),
    (dict(dim=8.5), "'dim' must be an integer >= 1"),
    (dict(num_generators=-1), "'num_generators' must be an integer >= 0"),
    (dict(num_matrix_generators=-3), "'num_matrix_generators' must be an integer >= 0"),
    (dict(num_seeds=True), "'num_seeds' must be an integer >= 1"),
    (dict(dropout=1.0), "'dropout' must be a number in [0, 1)"),
    (dict(rank=4), "'rank' is the rank of the HyperNet value operator"),
    (dict(value='hypernet', rank=-3), "'rank' must be an integer >= 1"),
    (dict(num_generators=0, readout='signed'), "readout='signed' reads the generators"),
    (dict(value='rigid', num_matrix_generators=-3), "'num_matrix_generators' must be an int"),
])
def test_constructor_arguments_that_would_be_misread_or_ignored_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        MZAggregation(4, **kwargs)


@pytest.mark.parametrize('kwargs,message', [
    (dict(value='rigid', num_matrix_generators=8), "'num_matrix_generators' is the number L of "
     "matrix generators of the MZ value operator (value='mz'); value='rigid' has none, so "
     "num_matrix_generators=8 does nothing here"),
    (dict(value='film', num_matrix_generators=1), "value='film' has none"),
    (dict(value='hypernet', num_matrix_generators=4), "value='hypernet' has none"),
    (dict(value='rigid', summary='mean+std'), "summary='mean+std' is the set summary that the "
     "gates of the 'mz', 'film' and 'hypernet' value operators read; value='rigid' has no gates"),
])
def test_options_another_value_operator_ignores_are_warned_and_change_nothing(kwargs, message):
    # they were accepted without a word; refused, they broke a --model-arg given to every
    # model of a comparison and the checkpoints of runs that took one: warned, and the module
    # is the one built without them
    import warnings
    with pytest.warns(UserWarning, match=re.escape(message)):
        torch.manual_seed(0)
        given = MZAggregation(4, **kwargs)
    plain = {k: v for k, v in kwargs.items() if k == 'value'}
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        torch.manual_seed(0)
        left_out = MZAggregation(4, **plain)
    a, b = given.state_dict(), left_out.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    x, index = torch.randn(7, 4), torch.tensor([0, 0, 1, 1, 1, 2, 2])
    assert torch.equal(given.eval()(x, index), left_out.eval()(x, index))


def test_options_of_the_value_operator_are_the_ones_printed_and_defaults_are_not_given():
    # the rigid body printed L=4 (and summary=mean), which it has not; options left at their
    # defaults (the preset's L, the mean summary, the neighbourhood's inducing tokens) are not
    # given, so every operator and encoder takes them
    text = {v: repr(MZAggregation(8, value=v, summary='mean', num_inducing=4))
            for v in ('mz', 'rigid', 'film', 'hypernet')}
    assert 'L=1, ' in text['mz'] and 'summary=mean, ' in text['mz']
    assert all('L=' not in text[v] for v in ('rigid', 'film', 'hypernet'))
    assert 'summary=' not in text['rigid']
    assert 'summary=mean, ' in text['film'] and 'summary=mean, ' in text['hypernet']
    # inducing tokens are printed where ISAB encoder blocks have them
    assert all('num_inducing' not in t for t in text.values())  # (a SAB encoder)
    assert 'num_inducing=4, ' in repr(MZAggregation(8, encoder='isab', num_inducing=4))
    assert 'num_inducing' not in repr(MZAggregation(8, preset='paper', num_encoder_blocks=0))
    assert 'num_inducing=16, ' in repr(MZAggregation(8, preset='paper', value='rigid'))
    assert 'L=4, ' in repr(MZAggregation(8, preset='paper'))


def test_num_inducing_0_is_taken_where_no_isab_block_uses_it():
    # the docstring says num_inducing is not used without ISAB encoder blocks, and 0 was refused
    x, index = _x(7), torch.tensor([0, 0, 1, 1, 1, 3, 3])
    for kwargs in ({'encoder': 'sab'}, {'encoder': 'isab', 'num_encoder_blocks': 0}):
        unused = _aggr(num_inducing=0, **kwargs)
        assert 'num_inducing' not in repr(unused)
        torch.testing.assert_close(unused(x, index, dim_size=4),
                                   _aggr(num_inducing=3, **kwargs)(x, index, dim_size=4),
                                   rtol=0, atol=0)
    for kwargs, bad in (({'encoder': 'isab'}, 0), ({'encoder': 'sab'}, -1),
                        ({'encoder': 'sab'}, 1.5)):
        with pytest.raises(ValueError, match=r"'num_inducing' must be an integer >= "
                                             rf"{1 if bad == 0 else 0} \(got {bad}\)"):
            _aggr(num_inducing=bad, **kwargs)


def test_flags_take_bools_and_0_or_1_and_an_unknown_operator_is_named_first():
    assert MZAggregation(4, log_n=1).log_n is True and MZAggregation(4, log_n=0).log_n is False
    with pytest.raises(ValueError, match="Unknown value operator 'hyper-net'"):
        MZAggregation(4, value='hyper-net', rank=4)


def test_an_input_that_is_not_a_matrix_is_named_as_such():
    with pytest.raises(ValueError, match=re.escape('Expected input of shape (N, 4) (got (6,))')):
        MZAggregation(4)(torch.randn(6), torch.zeros(6, dtype=torch.long))
    from torch_mz.nn.zonotope import InputProjection
    with pytest.raises(ValueError, match=re.escape('Expected input of shape (N, 4) (got (5, 3))')):
        InputProjection(4, 8, 2)(torch.randn(5, 3))


@pytest.mark.parametrize('preset', ['neighbourhood', 'paper'])
def test_empty_sets_are_not_encoded(preset, monkeypatch):
    # the isolated nodes of a graph (dim_size counts them) cost nothing: the non-empty sets are
    # encoded alone, with the values and gradients of the run without the empty sets
    torch.manual_seed(0)
    aggr = MZAggregation(F_IN, preset=preset, dim=8, heads=2, d_ff=8, num_inducing=3).double()
    seen = []
    encode = aggr._encode
    monkeypatch.setattr(aggr, '_encode', lambda x, s, b: seen.append(b) or encode(x, s, b))
    x = _x(7, 1).requires_grad_()
    compact = torch.tensor([0, 0, 1, 1, 1, 2, 2])
    expected = aggr(x, compact)
    (g_expected, ) = torch.autograd.grad(expected.pow(2).sum(), x)
    where = torch.tensor([5, 9_998, 40])  # the same sets among 10,000, out of order
    out = aggr(x, where[compact], dim_size=10_000)
    assert seen == [3, 3]  # three sets encoded, not 10,000
    torch.testing.assert_close(out[where], expected, rtol=1e-12, atol=1e-12)
    rest = torch.ones(10_000, dtype=torch.bool)
    rest[where] = False
    assert bool((out[rest] == 0).all())
    (grad, ) = torch.autograd.grad(out.pow(2).sum(), x)
    torch.testing.assert_close(grad, g_expected, rtol=1e-12, atol=1e-12)
    out, ihw = aggr.pool(x, where[compact], 10_000)  # the uncertainty too
    assert bool((ihw[rest] == 0).all()) and bool((ihw[where] > 0).all())


def test_chunk_groups_count_the_tokens_each_set_adds(monkeypatch):
    # many small sets are grouped as what they cost: a set of one element encodes its inducing
    # tokens and seeds too (17 tokens in the paper's configuration), so groups of chunk_size
    # count them beside the rows
    torch.manual_seed(0)
    aggr = MZAggregation(F_IN, preset='paper', dim=8, heads=2, d_ff=8, num_inducing=3,
                         chunk_size=10).double()
    assert aggr.set_tokens == 3 + 1  # 3 inducing tokens, 1 seed
    assert MZAggregation(F_IN).set_tokens == 1  # a SAB encoder adds none
    calls = _spy_on_groups(monkeypatch, aggr)
    index = torch.arange(12)  # 12 sets of one row: 5 "rows" each, 60 > 10
    plain = MZAggregation(F_IN, preset='paper', dim=8, heads=2, d_ff=8, num_inducing=3,
                          chunk_size=None).double()
    plain.load_state_dict(aggr.state_dict())
    with torch.no_grad():
        x = _x(12, 3)
        torch.testing.assert_close(aggr(x, index), plain(x, index), rtol=1e-12, atol=1e-12)
    assert calls == [2] * 6  # two sets (10 rows and tokens) a group (by rows alone: 10 and 2)


def test_float64_input_under_autocast_is_named():
    # autocast casts float32 inputs, not float64 ones: the check stepped aside under any autocast
    # and a bare matmul error followed
    aggr = MZAggregation(F_IN)
    index = torch.tensor([0, 0, 1])
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert aggr(torch.randn(3, F_IN), index).shape == (2, F_IN)
        assert aggr(torch.randn(3, F_IN, dtype=torch.float16), index).shape == (2, F_IN)
        with pytest.raises(ValueError, match=r"module's dtype torch.float32 \(got torch.float64"):
            aggr(torch.randn(3, F_IN, dtype=torch.float64), index)


def test_torch_jit_trace_is_refused_with_a_message():
    # the trace failed deep inside ("'num_sets' must be an integer >= 0 (got tensor(3))"),
    # though a docstring said chunk_size=None traces; a trace would keep the traced sets'
    # sizes as constants (PyG's SetTransformerAggregation, traced, silently gives other values
    # on other set sizes), so it is refused at the boundary, naming torch.compile
    import warnings

    from torch_mz.models import build_model
    from torch_mz.nn import FlatSetTransformerAggregation
    x, index = torch.randn(12, 8), torch.tensor([0] * 5 + [1] * 7)
    models = (MZAggregation(8, chunk_size=None), MZAggregation(8, preset='paper'),
              FlatSetTransformerAggregation(8, heads=2), build_model('rigid', 8, 1),
              build_model('perceiver', 8, 1))  # (it traced, and other set sizes went wrong)
    for model in models:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # (the tracer's own warnings)
            with pytest.raises(RuntimeError, match='cannot be recorded by torch.jit.trace.*'
                               'torch.compile'):
                torch.jit.trace(model.eval(), (x, index))


def test_torch_jit_script_is_refused_with_a_message():
    # scripting the aggregation, or a SAGEConv holding it (PyG's own SetTransformerAggregation
    # scripts in one), failed inside on the first construct TorchScript lacks ("Comprehension ifs
    # are not supported yet", at the fold_keys property): refused, naming torch.compile
    from torch_geometric.nn.aggr import SetTransformerAggregation
    torch.jit.script(SAGEConv(8, 4, aggr=SetTransformerAggregation(8, heads=2)))
    aggr = MZAggregation(8)
    for module in (aggr, SAGEConv(8, 4, aggr=MZAggregation(8))):
        with pytest.raises(RuntimeError, match=r'MZAggregation cannot be compiled by '
                                               r'torch.jit.script.*Use torch.compile'):
            torch.jit.script(module)
    x = torch.randn(5, 8)
    assert aggr(x, torch.tensor([0, 0, 1, 1, 1])).shape == (2, 8)  # eager use unchanged


@pytest.mark.parametrize('call, match', [
    # the number of sets passed third, as global pooling takes it (global_mean_pool(x, batch,
    # size)): that is ptr in PyG's signature
    (lambda a, x, b: a(x, b, 2), r"Expected 'ptr' to be a tensor or None \(got int\); the "
                                 r"third argument is ptr: pass the number of sets by name, "
                                 r"dim_size=2$"),
    (lambda a, x, b: a(x, b.tolist()), r"Expected 'index' to be a tensor or None \(got list\)$"),
    (lambda a, x, b: a(x, index=b.numpy()), r"'index' to be a tensor or None \(got ndarray\)"),
    (lambda a, x, b: a(x, ptr=[0, 2, 5]), r"'ptr' to be a tensor or None \(got list\)$"),
    (lambda a, x, b: a(x, b, np.int64(2)), r"\(got int64\); the third .* dim_size=2$"),
    (lambda a, x, b: a(x, ptr=2), r"'ptr' to be a tensor or None \(got int\)$"),
])
def test_an_index_or_ptr_that_is_not_a_tensor_is_named(call, match):
    # PyG's Aggregation.__call__ failed on them with "AttributeError: 'int' object has no
    # attribute 'numel'"
    aggr = _aggr(dtype=torch.float32)
    x, batch = torch.randn(5, F_IN), torch.tensor([0, 0, 1, 1, 1])
    with pytest.raises(ValueError, match=match):
        call(aggr, x, batch)
    assert aggr(x, batch, None, 2).shape == (2, F_IN)  # positional None and dim_size


def test_an_input_without_elements_gives_every_parameter_a_zero_gradient():
    # a graph without edges: zeros, and every parameter in the graph with a zero gradient (it
    # left all but the last bias without one, which DistributedDataParallel's
    # find_unused_parameters=False takes for an error)
    from torch_mz.models import PRESETS, build_model
    from torch_mz.nn import FlatSetTransformerAggregation
    for aggr in (MZAggregation(8), MZAggregation(8, preset='paper')):
        out = aggr(torch.randn(0, 8), torch.zeros(0, dtype=torch.long), dim_size=3)
        assert torch.equal(out, torch.zeros(3, 8))
        out.sum().backward()
        assert all(p.grad is not None and not p.grad.any() for p in aggr.parameters())
    flat = FlatSetTransformerAggregation(8, heads=2)  # (PyG's values: its seeds, not zeros)
    flat(torch.randn(0, 8), torch.zeros(0, dtype=torch.long), dim_size=3).sum().backward()
    assert all(p.grad is not None for p in flat.parameters())
    # the set models (not EGNN: its last layer's coordinate update reaches no output, so
    # those parameters get no gradient on any input, as in the authors' model)
    for name in PRESETS:
        if name.startswith('egnn'):
            continue
        model = build_model(name, 3, 2)
        pred, _ = model(torch.randn(0, 3), torch.zeros(0, dtype=torch.long), num_sets=2)
        assert torch.equal(pred, torch.zeros(2, 2))
        pred.sum().backward()
        assert all(p.grad is not None and not p.grad.any() for p in model.parameters()), name


def test_an_input_without_elements_keeps_the_input_in_the_graph():
    # as PyG's aggregations: the messages of a graph without edges get their (empty) gradient;
    # the zeros were joined to the parameters only, so torch.autograd.grad(out, x) raised
    # (unused tensor), and with a frozen aggregation the output required no gradient at all
    from torch_geometric.nn import SimpleConv
    x = torch.randn(4, 8, requires_grad=True)
    no_edges = torch.zeros(2, 0, dtype=torch.long)
    for aggr in ('sum', MZAggregation(8), MZAggregation(8, preset='paper')):
        conv = SimpleConv(aggr=aggr)  # (the output is the aggregation alone)
        grad, = torch.autograd.grad(conv(x, no_edges).sum(), x)
        assert torch.equal(grad, torch.zeros(4, 8))
        if not isinstance(aggr, str):
            aggr.requires_grad_(False)
            out = aggr(x[:0], torch.zeros(0, dtype=torch.long), dim_size=3)
            assert out.requires_grad and torch.equal(out, torch.zeros(3, 8))
            grad, = torch.autograd.grad(out.sum(), x)
            assert torch.equal(grad, torch.zeros(4, 8))


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_an_input_without_elements_under_autocast_has_the_dtype_of_one_with_elements(dtype):
    # the zeros came out in the module's float32 where a call with elements gives the autocast
    # dtype (one batch's output could not be written into another's); float64 is not cast
    for module_dtype in (torch.float32, torch.float64):
        aggr = _aggr(dtype=module_dtype)
        x, index = _x(5, dtype=module_dtype), make_index([2, 3])
        with torch.autocast('cpu', dtype=dtype):
            out, ihw = aggr.pool(x, *aggr.validate(x, index))
            none, none_ihw = aggr.pool(x[:0], *aggr.validate(x[:0], index[:0], dim_size=2))
        expected = dtype if module_dtype == torch.float32 else torch.float64
        assert out.dtype == none.dtype == ihw.dtype == none_ihw.dtype == expected
        assert torch.equal(none, torch.zeros(2, F_IN, dtype=expected))


def test_signed_readout_reads_the_generator_sum_and_ihw_its_magnitudes():
    # readout='signed' had no test of its effect (reading the IHW under either name passed):
    # the same pooled tokens read out as centers then sum_g G_g, or centers then sum_g |G_g|
    from torch_mz.nn import Zonotope
    g = torch.Generator().manual_seed(3)
    ihw, signed = MZAggregation(4, num_seeds=2), MZAggregation(4, num_seeds=2, readout='signed')
    d, ng = ihw.dim, ihw.num_generators
    z = Zonotope(torch.randn(6, d, generator=g), torch.randn(6, ng, d, generator=g))  # 3 sets
    centers = z.center.reshape(3, 2 * d)
    torch.testing.assert_close(ihw._readout(z, 3), torch.cat(
        [centers, z.gens.abs().sum(1).reshape(3, 2 * d)], -1))
    torch.testing.assert_close(signed._readout(z, 3), torch.cat(
        [centers, z.gens.sum(1).reshape(3, 2 * d)], -1))
    flipped = Zonotope(z.center, -z.gens)  # the IHW cannot see a generator's sign
    torch.testing.assert_close(ihw._readout(flipped, 3), ihw._readout(z, 3))
    assert not torch.allclose(signed._readout(flipped, 3), signed._readout(z, 3))


@pytest.mark.parametrize('kwargs', [dict(), dict(summary='mean+std'), dict(log_n=True)])
def test_float16_aggregation_of_a_set_larger_than_float16_counts(kwargs):
    # one set of 70,000 points came out NaN in a float16 aggregation and under float16 autocast:
    # the gate summary (set_mean / set_std) summed and divided in float16, whose largest finite
    # value 65,504 is below the count, and log_n took log of the count cast to float16; both
    # now match the float32 aggregation within float16's precision (2e-2 on outputs of about 2)
    torch.manual_seed(0)
    aggr = MZAggregation(F_IN, **dict(SMALL, encoder='isab', **kwargs)).eval()
    half = MZAggregation(F_IN, **dict(SMALL, encoder='isab', **kwargs)).eval()
    half.load_state_dict(aggr.state_dict())
    half.half()
    n = 70_000
    x = _x(n + 3, dtype=torch.float32) + 2.0
    index = torch.cat([torch.zeros(n, dtype=torch.long), torch.tensor([1, 1, 2])])
    with torch.no_grad():
        ref = aggr(x, index)
        out = half(x.half(), index)
        with torch.autocast('cpu', dtype=torch.float16):
            auto = aggr(x, index)
    assert torch.isfinite(ref).all()
    for o in (out, auto):
        assert o.dtype == torch.float16 and torch.isfinite(o).all()
        torch.testing.assert_close(o.float(), ref, rtol=2e-2, atol=2e-2)


def test_float16_autocast_applies_the_float16_magnitude_limit():
    # under float16 autocast the float32 limit (1e15) was applied, so float32 input of magnitude
    # 1e5 (beyond float16's 65,504) passed the check and came out NaN; the limit is now that of
    # the precision the input projection computes in (float16: half of 65,504 over the largest
    # absolute row sum of the weights that take the input), where it is narrower
    from torch_mz.nn.aggr import input_magnitude_limit
    aggr = _aggr(dtype=torch.float32)
    index = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    x = _x(7, dtype=torch.float32)
    x = x / x.abs().max()
    limit = input_magnitude_limit(torch.float16, aggr, F_IN)
    rows = max(float(m.weight.abs().sum(1).max()) for m in aggr.modules()
               if isinstance(m, torch.nn.Linear) and m.in_features == F_IN)
    assert limit == pytest.approx(0.5 * 65504 / rows) and 1e3 < limit < 3e4
    with torch.autocast('cpu', dtype=torch.float16):
        with pytest.raises(ValueError, match=r'exceed [\d.e+]+, beyond which the first linear '
                                             r'map of the input overflows in torch.float16 '
                                             r'\(under '):
            aggr(x * 2 * limit, index)
        at_limit = aggr(x * (0.999 * limit), index)
    # the largest accepted magnitude: finite and close to float32 (2e-2 on outputs of about 1)
    assert torch.isfinite(at_limit).all()
    torch.testing.assert_close(at_limit.float(), aggr(x * (0.999 * limit), index), rtol=2e-2,
                               atol=2e-2)
    # a float16 module on float16 input has the same limit; bfloat16 autocast and float64 input
    # (which autocast does not cast) keep their own
    with pytest.raises(ValueError, match=r'in torch.float16; rescale'):
        _aggr(dtype=torch.float16)((x * 1.5 * limit).half(), index)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert torch.isfinite(aggr(x * 1e5, index)).all()
        with pytest.raises(ValueError, match=r'exceed 1e\+15'):
            aggr(x * 1e16, index)
    with torch.autocast('cpu', dtype=torch.float16):
        assert torch.isfinite(_aggr()(x.double() * 1e5, index)).all()


def test_the_float16_limit_reads_the_input_layers_only():
    # every Linear taking as many features as the input counted: with in_channels equal to the
    # width (64, a usual GNN setting) 26 layers, and a limit below what computes finitely
    from torch_mz.nn.aggr import input_layers, input_magnitude_limit
    from torch_mz.nn.zonotope import InputProjection
    torch.manual_seed(0)
    aggr = MZAggregation(64, 64)
    proj = next(m for m in aggr.modules() if isinstance(m, InputProjection))
    assert input_layers(aggr, 64) == [proj.lin_c, proj.lin_g]
    rows = max(float(lin.weight.abs().sum(1).max()) for lin in (proj.lin_c, proj.lin_g))
    assert input_magnitude_limit(torch.float16, aggr, 64) == pytest.approx(0.5 * 65504 / rows)
    deep = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    assert input_layers(deep, 4) == [deep[0]]
    assert input_magnitude_limit(torch.float16, torch.nn.Linear(3, 2), 5) == 1e4  # none reads it


def test_a_module_autocast_does_not_cast_is_named():
    # autocast casts float32 weights and float32 / float16 / bfloat16 inputs where they meet in
    # a matrix product: the check stepped aside under any autocast for any module, and a float64
    # module ('mat1 and mat2 must have the same dtype') or a module of the other half precision
    # (its LayerNorms: 'mixed dtype (CPU): expect parameter to have scalar type of Float') failed
    # inside, also on input of the module's own dtype
    index = torch.tensor([0, 0, 1])
    x = _x(3, dtype=torch.float32)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        for came in (torch.float32, torch.bfloat16, torch.float16):
            with pytest.raises(ValueError, match=r"module's dtype torch.float64 \(got "
                                                 rf"{came}\); .*does not cast a float64"):
                _aggr(dtype=torch.float64)(x.to(came), index)
            with pytest.raises(ValueError, match=r"module of float32 or torch.bfloat16 "
                                                 r"parameters under torch.autocast to "
                                                 r"torch.bfloat16 \(got torch.float16 "):
                _aggr(dtype=torch.float16)(x.to(came), index)
        # what autocast does take: float32 and bfloat16 modules, and float64 input of a float64
        # module (left alone)
        for dtype in (torch.float32, torch.bfloat16):
            assert torch.isfinite(_aggr(dtype=dtype)(x, index)).all()
        assert _aggr(dtype=torch.float64)(x.double(), index).dtype == torch.float64
    with torch.autocast('cpu', dtype=torch.float16):
        assert torch.isfinite(_aggr(dtype=torch.float16)(x, index)).all()
    # without autocast the remedy named fits the module: none for a float64 module, autocast to
    # the module's own dtype for a half-precision one
    with pytest.raises(ValueError, match=r"\(e.g. .to\(torch.float32\)\); torch.autocast does "
                                         r"not cast a float64 module's weights$"):
        _aggr(dtype=torch.float64)(x, index)
    with pytest.raises(ValueError, match=r"run under torch.autocast\('cpu', "
                                         r"dtype=torch.float16\) \(which"):
        _aggr(dtype=torch.float16)(x, index)


def test_the_layer_norm_refusals_under_autocast_are_the_cpus_alone(monkeypatch):
    # the CPU's autocast leaves LayerNorms as they are (a half-precision module under autocast
    # to the other half precision failed there, and is refused); CUDA's runs them in float32,
    # casting inputs and weights, so off the CPU the module is left to autocast (the refusal
    # would have turned away what runs there)
    from torch_mz.nn import Zonotope
    from torch_mz.nn.aggr import check_set_input
    from torch_mz.nn.attention import check_token_dtype
    monkeypatch.setattr(torch, 'is_autocast_enabled', lambda device=None: True)
    monkeypatch.setattr(torch, 'get_autocast_dtype', lambda device: torch.float16)
    for device in ('cpu', 'meta'):  # ('meta' stands for a device other than the CPU)
        x = torch.zeros(3, 4, dtype=torch.bfloat16, device=device)
        tokens = Zonotope(x, x.new_zeros(3, 0, 4))
        calls = (lambda: check_set_input(x, 4, torch.bfloat16, layer_norm=True),
                 lambda: check_set_input(x.float(), 4, torch.bfloat16, layer_norm=True,
                                         norm_input=True),
                 lambda: check_token_dtype(torch.bfloat16, tokens, layer_norm=True))
        for call in calls:
            if device == 'cpu':
                with pytest.raises(ValueError, match='torch.autocast|LayerNorm'):
                    call()
            else:
                call()
        check_set_input(x, 4, torch.bfloat16, layer_norm=False)  # (no LayerNorm: both take it)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA not available')
def test_cuda_autocast_takes_a_half_precision_model_of_the_other_half_precision():
    # the LayerNorm refusals under autocast are the CPU's alone, on the premise that CUDA's
    # autocast runs LayerNorms in float32 (casting inputs and weights): a float16 model with
    # LayerNorms under bfloat16 autocast runs there, and is taken (benchmarks/gpu_check.sh)
    from torch_mz.models import build_model
    norm = torch.nn.LayerNorm(8).cuda().half()
    with torch.autocast('cuda', dtype=torch.bfloat16):
        assert torch.isfinite(norm(torch.randn(5, 8, device='cuda',
                                               dtype=torch.bfloat16))).all()
    torch.manual_seed(0)
    model = build_model('mz-slim', 3, 2).cuda().eval()
    x = torch.randn(40, 3, device='cuda')
    batch = torch.arange(4, device='cuda').repeat_interleave(10)
    with torch.no_grad():
        ref = model(x, batch).prediction
        with torch.autocast('cuda', dtype=torch.bfloat16):
            out = model.half()(x.half(), batch).prediction
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, rtol=0.1, atol=0.1 * float(ref.abs().max()))


@pytest.mark.parametrize('sizes', [dict(num_encoder_blocks=2 ** 70),
                                   dict(num_decoder_blocks=2 ** 70),
                                   dict(encoder='isab', num_encoder_blocks=10 ** 12),
                                   dict(dim=2 ** 40, heads=1)])
def test_sizes_that_could_not_fit_in_memory_are_refused_before_any_block(sizes, monkeypatch):
    # num_encoder_blocks=2**70 built blocks without end
    import torch_mz.nn.aggr as aggr

    def built(*args, **kwargs):
        raise AssertionError('a block was built')
    for name in ('ISAB', 'SAB', 'PMA'):
        monkeypatch.setattr(aggr, name, built)
    with pytest.raises(ValueError, match="^num_encoder_blocks=.*beyond this machine's"):
        MZAggregation(8, **sizes)
