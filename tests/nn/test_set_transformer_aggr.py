import inspect
import re

import pytest
import torch
from torch_geometric.nn.aggr import SetTransformerAggregation

from torch_mz.nn import FlatSetTransformerAggregation

CONFIGS = [  # (num_seed_points, num_encoder_blocks, num_decoder_blocks, concat, layer_norm)
    (1, 1, 1, True, False),
    (1, 1, 0, True, True),
    (3, 2, 1, True, False),
    (2, 0, 2, False, True),
]


def pair(channels=16, heads=4, k=1, enc=1, dec=1, concat=True, layer_norm=False, dropout=0.0,
         path='auto', dtype=torch.float64):
    torch.manual_seed(0)
    pyg = SetTransformerAggregation(channels, k, enc, dec, heads=heads, concat=concat,
                                    layer_norm=layer_norm, dropout=dropout).to(dtype)
    flat = FlatSetTransformerAggregation(channels, k, enc, dec, heads=heads, concat=concat,
                                         layer_norm=layer_norm, dropout=dropout,
                                         path=path).to(dtype)
    flat.load_state_dict(pyg.state_dict())
    return pyg, flat


def grads(module, x, out):
    return torch.autograd.grad(out.square().sum(), [x] + list(module.parameters()))


@pytest.mark.parametrize('k,enc,dec,concat,layer_norm', CONFIGS)
@pytest.mark.parametrize('path', ['dense', 'scatter'])
def test_equals_pyg_values_and_gradients(k, enc, dec, concat, layer_norm, path):
    pyg, flat = pair(k=k, enc=enc, dec=dec, concat=concat, layer_norm=layer_norm, path=path)
    # sets of 3, 1, 0 (empty), 5, 2 elements and a trailing empty set; rows shuffled for ours
    index = torch.tensor([0, 0, 0, 1, 3, 3, 3, 3, 3, 4, 4])
    x = torch.randn(index.numel(), 16, dtype=torch.float64, requires_grad=True)
    perm = torch.randperm(index.numel(), generator=torch.Generator().manual_seed(1))
    expected = pyg(x, index, dim_size=6)
    out = flat(x[perm], index[perm], dim_size=6)
    assert out.shape == expected.shape == (6, 16 * (k if concat else 1))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    for a, b in zip(grads(flat, x, out), grads(pyg, x, expected)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_equals_pyg_on_a_skewed_batch_float32_eval():
    # one large set and many small ones: PyG pads all to the largest, ours buckets by size
    pyg, flat = pair(channels=32, heads=4, dtype=torch.float32)
    pyg.eval()
    flat.eval()
    sizes = torch.tensor([300] + [1, 2, 3, 5, 8] * 20)
    index = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
    x = torch.randn(index.numel(), 32)
    with torch.no_grad():
        torch.testing.assert_close(flat(x, index), pyg(x, index), rtol=1e-5, atol=1e-5)


def test_ptr_agrees_with_index_and_sets_of_one():
    _, flat = pair()
    sizes = torch.tensor([1, 4, 1, 1, 7])
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    index = torch.repeat_interleave(torch.arange(5), sizes)
    x = torch.randn(int(sizes.sum()), 16, dtype=torch.float64)
    torch.testing.assert_close(flat(x, ptr=ptr), flat(x, index))


def test_state_dict_is_pygs():
    pyg, flat = pair(k=2, enc=2, dec=1, layer_norm=True)
    assert list(flat.state_dict()) == list(pyg.state_dict())
    other = SetTransformerAggregation(16, 2, 2, 1, heads=4, layer_norm=True).double()
    other.load_state_dict(flat.state_dict())  # and back into PyG's class


def test_dropout_only_in_training():
    pyg, flat = pair(dropout=0.5)
    index = torch.tensor([0, 0, 1, 1, 1])
    x = torch.randn(5, 16, dtype=torch.float64)
    pyg.eval()
    flat.eval()
    torch.testing.assert_close(flat(x, index), pyg(x, index), rtol=0, atol=1e-12)
    flat.train()
    x.requires_grad_(True)
    out = flat(x, index)
    assert not torch.allclose(out, pyg(x, index))  # half the attention weights dropped
    for module in (flat, pyg):  # dropout follows each attention's own training flag
        for m in module.modules():
            if isinstance(m, torch.nn.MultiheadAttention):
                m.eval()
    torch.testing.assert_close(flat(x, index), pyg(x, index), rtol=0, atol=1e-12)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in flat.parameters())


def test_bad_input_raises():
    with pytest.raises(ValueError, match="multiple of 'heads'"):
        FlatSetTransformerAggregation(10, heads=4)
    with pytest.raises(ValueError, match='attention path'):
        FlatSetTransformerAggregation(16, heads=4, path='fast')
    _, flat = pair()
    with pytest.raises(ValueError, match=r'shape \(N, 16\)'):
        flat(torch.randn(4, 8, dtype=torch.float64), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match='dimension'):
        flat(torch.randn(4, 16, dtype=torch.float64), torch.zeros(4, dtype=torch.long), dim=1)
    with pytest.raises(ValueError, match="'index' values"):
        flat(torch.randn(4, 16, dtype=torch.float64), torch.tensor([0, 0, 5, 1]), dim_size=2)
    assert "path='auto'" in repr(flat)


def test_documented_arguments_are_the_signature():
    documented = re.findall(r'^\s{8}(\w+) \(', FlatSetTransformerAggregation.__doc__, flags=re.M)
    params = inspect.signature(FlatSetTransformerAggregation.__init__).parameters
    assert documented == list(params)[1:]


def test_no_rows_gives_the_empty_set_output():
    # (PyG's own aggregation fails on an input without rows; its empty sets among others give
    # the output checked in test_equals_pyg_values_and_gradients)
    _, flat = pair(k=2)
    x = torch.zeros(0, 16, dtype=torch.float64)
    index = torch.zeros(0, dtype=torch.long)
    out = flat(x, index, dim_size=3)
    assert out.shape == (3, 32)
    one = flat(torch.randn(2, 16, dtype=torch.float64), torch.tensor([1, 1]), dim_size=3)
    torch.testing.assert_close(out, one[[0, 0, 2]])  # every empty set alike


def test_no_rows_keeps_the_input_in_the_graph():
    # as PyG's sum/mean aggregations: an input without rows gets its (empty) gradient, where
    # torch.autograd.grad found it unused; a frozen aggregation's output still requires one
    _, flat = pair()
    x = torch.zeros(0, 16, dtype=torch.float64, requires_grad=True)
    index = torch.zeros(0, dtype=torch.long)
    grad, = torch.autograd.grad(flat(x, index, dim_size=3).sum(), x)
    assert grad.shape == (0, 16)
    flat.requires_grad_(False)
    out = flat(x, index, dim_size=3)
    assert out.requires_grad
    grad, = torch.autograd.grad(out.sum(), x)
    assert grad.shape == (0, 16)


def test_hooks_and_pruning_run_pygs_forward():
    import torch.nn.utils.prune as prune
    pyg, flat = pair(k=2)
    index = torch.tensor([0, 0, 1, 1, 1, 1])
    x = torch.randn(6, 16, dtype=torch.float64)
    calls = []
    handle = flat.pma.mab.attn.register_forward_hook(lambda *args: calls.append(1))
    perm = torch.tensor([3, 0, 4, 1, 2, 5])  # unsorted rows: sorted for PyG's forward
    torch.testing.assert_close(flat(x[perm], index[perm]), pyg(x, index), rtol=0, atol=1e-12)
    assert calls == [1]  # the hook saw its module's call
    handle.remove()
    prune.l1_unstructured(flat.pma.mab.attn, 'in_proj_weight', amount=0.5)
    for _ in range(2):  # the pruned weight is recomputed on every call
        flat(x, index).square().sum().backward()
    empty = flat(x[:0], index[:0], dim_size=2)  # no rows: the flat path (PyG's cannot)
    # each row is what PyG's forward (run here, the module being hooked) gives an empty set
    with torch.no_grad():
        expected = flat(x, index, dim_size=3)[2]
    torch.testing.assert_close(empty.detach(), expected.expand(2, -1), rtol=0, atol=1e-12)


def test_max_num_elements_is_checked_not_applied():
    pyg, flat = pair()
    index = torch.tensor([0, 0, 0, 1])
    x = torch.randn(4, 16, dtype=torch.float64)
    torch.testing.assert_close(flat(x, index, max_num_elements=3), pyg(x, index))
    with pytest.raises(ValueError, match='max_num_elements=2'):
        flat(x, index, max_num_elements=2)


@pytest.mark.parametrize('kwargs, match', [
    (dict(channels=8, heads=2.0), "'heads'"), (dict(channels=8.0), "'channels'"),
    (dict(channels=8, concat='no'), "'concat'"),
    (dict(channels=8, layer_norm='no'), "'layer_norm'"),
    (dict(channels=8, dropout=1.5), "'dropout'"), (dict(channels=8, dropout=-1), "'dropout'"),
    (dict(channels=8, num_encoder_blocks=-1), "'num_encoder_blocks'"),
    (dict(channels=8, num_seed_points=0), "'num_seed_points'"),
])
def test_constructor_arguments_are_checked_at_construction(kwargs, match):
    # PyG's own constructor takes any truthy text as a flag and checks the rate only in a
    # training forward pass
    with pytest.raises(ValueError, match=match):
        FlatSetTransformerAggregation(**kwargs)


def test_a_layer_built_around_it_draws_what_it_draws_around_pygs():
    # SAGEConv resets its aggregation in its constructor: with PyG's reset_parameters (no
    # extra draws), the layer's own weights and the aggregation's come out equal from one seed
    from torch_geometric.nn import SAGEConv
    torch.manual_seed(3)
    around_pyg = SAGEConv(16, 16, aggr=SetTransformerAggregation(16, 1, 1, 0, heads=4))
    torch.manual_seed(3)
    around_flat = SAGEConv(16, 16, aggr=FlatSetTransformerAggregation(16, 1, 1, 0, heads=4))
    a, b = around_flat.state_dict(), around_pyg.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize('module, cast', [(torch.float16, torch.bfloat16),
                                          (torch.bfloat16, torch.float16)])
def test_autocast_takes_what_runs_and_names_what_fails(module, cast):
    # without LayerNorms (layer_norm=False, PyG's default) autocast casts every weight: a
    # half-precision aggregation under autocast to the other half precision ran, and was
    # refused ('Expected a module of float32 or ...'); with LayerNorms the input meets the
    # first encoder's in a residual sum, uncast: input of another dtype than a half-precision
    # module's was taken and failed inside ('mixed dtype (CPU): expect parameter to have
    # scalar type of Float')
    index = torch.tensor([0, 0, 0, 1, 1])
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(0))
    _, plain = pair(dtype=torch.float32)
    ref = plain(x, index)
    plain.to(module)
    with torch.autocast('cpu', dtype=cast):
        for came in (torch.float32, module, cast):
            out = plain(x.to(came), index)
            assert torch.isfinite(out).all()
            torch.testing.assert_close(out.float(), ref, rtol=0.1, atol=0.1)
    _, normed = pair(layer_norm=True, dtype=module)
    with torch.autocast('cpu', dtype=cast):  # the other half precision: refused, as before
        with pytest.raises(ValueError, match=rf"module of float32 or {cast} parameters"):
            normed(x.to(module), index)
    with torch.autocast('cpu', dtype=module):
        assert torch.isfinite(normed(x.to(module), index)).all()
        for came in (torch.float32, cast):
            with pytest.raises(ValueError, match=rf"module's dtype {module} \(got {came}\); "
                                                 r".*meets the module's LayerNorm"):
                normed(x.to(came), index)
    # without encoders the input meets no LayerNorm: any input runs
    _, no_encoder = pair(layer_norm=True, enc=0, dtype=module)
    with torch.autocast('cpu', dtype=module):
        for came in (torch.float32, module, cast):
            assert torch.isfinite(no_encoder(x.to(came), index)).all()
    # and without autocast the remedy named is not autocast, which would not help
    with pytest.raises(ValueError, match=r"convert the input or the module \(e\.g\. "
                                         r"\.to\(torch\.float32\)\); the input meets"):
        normed(x, index)


def test_block_counts_that_could_not_fit_in_memory_are_refused_before_any_block(monkeypatch):
    # num_encoder_blocks=2**70 built PyG's blocks without end
    import torch_geometric.nn.aggr.set_transformer as pyg

    def built(*args, **kwargs):
        raise AssertionError('a block was built')
    monkeypatch.setattr(pyg, 'SetAttentionBlock', built)
    monkeypatch.setattr(pyg, 'PoolingByMultiheadAttention', built)
    with pytest.raises(ValueError, match="^num_encoder_blocks=1180591620717411303424, .*beyond"):
        FlatSetTransformerAggregation(8, num_encoder_blocks=2 ** 70)


@pytest.mark.parametrize('blocks', [(0, 0), (2, 0), (1, 2)])
def test_memory_check_counts_no_more_than_the_blocks_built(monkeypatch, blocks):
    # the check's counts are lower bounds, so that no aggregation that fits is refused: it
    # counted 7 modules a block where PyG's SAB has 5 (the SAB, its MAB, the attention, its
    # output Linear, the MAB's Linear), and its message named more modules than were built
    import torch_mz.nn.set_transformer_aggr as st
    counted = []
    monkeypatch.setattr(st, 'check_fits', lambda what, p, m=0: counted.append((p, m)))
    aggr = FlatSetTransformerAggregation(4, num_encoder_blocks=blocks[0],
                                         num_decoder_blocks=blocks[1], heads=1)
    (parameters, modules), = counted
    assert parameters <= sum(p.numel() for p in aggr.parameters())
    assert modules <= sum(1 for _ in aggr.modules()) - 3  # (less the aggregation and 2 lists)


@pytest.mark.parametrize('call, match', [
    # the number of sets passed third, as global pooling takes it: that is ptr in PyG's signature
    (lambda a, x, b: a(x, b, 2), r"Expected 'ptr' to be a tensor or None \(got int\); the "
                                 r"third argument is ptr: pass the number of sets by name, "
                                 r"dim_size=2$"),
    (lambda a, x, b: a(x, b.tolist()), r"Expected 'index' to be a tensor or None \(got list\)$"),
    (lambda a, x, b: a(x, ptr=[0, 2, 5]), r"'ptr' to be a tensor or None \(got list\)$"),
    (lambda a, x, b: a(x[:, 0], b), r"Expected input of shape \(N, 8\) \(got \(5,\)\)$"),
])
def test_a_non_tensor_index_or_ptr_or_a_1d_input_is_named(call, match):
    # as MZAggregation's: PyG's Aggregation.__call__ failed with "AttributeError: 'int' object
    # has no attribute 'numel'" (and named a 1-D input only by its axis, "dimension '-2'")
    aggr = FlatSetTransformerAggregation(8, heads=2)
    x, batch = torch.randn(5, 8), torch.tensor([0, 0, 1, 1, 1])
    with pytest.raises(ValueError, match=match):
        call(aggr, x, batch)
    assert aggr(x, batch, None, 2).shape == (2, 8)  # positional None and dim_size


def test_torch_jit_script_is_refused_with_a_message():
    # scripting it failed inside ("Expected a value of type 'Tensor' for argument '0'"; in a
    # SAGEConv "Can't redefine method: forward"), where PyG's SetTransformerAggregation scripts
    from torch_geometric.nn import SAGEConv
    aggr = FlatSetTransformerAggregation(8, heads=2)
    for module in (aggr, SAGEConv(8, 4, aggr=FlatSetTransformerAggregation(8, heads=2))):
        with pytest.raises(RuntimeError, match=r'FlatSetTransformerAggregation cannot be '
                                               r'compiled by torch.jit.script.*Use torch.compile'):
            torch.jit.script(module)
    x = torch.randn(5, 8)
    assert aggr(x, torch.tensor([0, 0, 1, 1, 1])).shape == (2, 8)  # eager use unchanged


def test_repr_shows_every_option_that_shapes_the_aggregation_and_evaluates():
    # PyG's repr, which this one extended, left out the encoder and decoder blocks and concat:
    # two encoder blocks, no decoder or averaged seeds printed as the defaults
    base = dict(num_seed_points=2, num_encoder_blocks=1, num_decoder_blocks=1, heads=2,
                concat=True, layer_norm=False, dropout=0.0, path='auto')
    text = repr(FlatSetTransformerAggregation(8, **base))
    for change in (dict(num_encoder_blocks=2), dict(num_decoder_blocks=0), dict(concat=False),
                   dict(num_seed_points=3), dict(heads=4), dict(layer_norm=True),
                   dict(dropout=0.1), dict(path='scatter')):
        assert repr(FlatSetTransformerAggregation(8, **dict(base, **change))) != text, change
    again = eval(text, {'FlatSetTransformerAggregation': FlatSetTransformerAggregation})
    assert repr(again) == text and len(again.encoders) == 1 and again.concat
