r"""``torch.compile`` runs every preset and MZAggregation and matches eager execution.

The tests compile with the ``aot_eager`` backend: TorchDynamo traces the Python (graph
breaks included: the size buckets are data-dependent) and AOTAutograd builds the joint forward and
backward graphs, without generating C++ code, which takes minutes per model on a CPU. Most of them, and the
``inductor`` test (the default ``torch.compile`` backend), are marked slow.
"""
import pytest
import torch
from torch_geometric.data import Batch, Data

from torch_mz.models import build_model, list_models
from torch_mz.nn import MZAggregation
from tests.nn._sets import make_index


def _batch(d_in, sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Batch.from_data_list([Data(x=torch.randn(n, d_in, generator=g)) for n in sizes])


def _small(name):
    kwargs = dict(pos_dim=3) if name.startswith('egnn') else {}
    if name not in ('deepsets', 'mean-mlp', 'perceiver') and not name.startswith('egnn'):
        kwargs.update(dim=16, d_ff=16)
    return kwargs


def _check(model, args, backend):
    r"""Values and parameter gradients of the compiled model against eager (the gradients were
    only checked to be finite: a compiled backward with wrong gradients passed)."""
    torch.manual_seed(0)
    model.eval()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    results = []
    for module in (model, compiled):
        model.zero_grad(set_to_none=True)
        out = module(*args)
        out = out if isinstance(out, tuple) else (out, )
        out[0].square().sum().backward()
        results.append(([o.detach() for o in out if o is not None],
                        [p.grad for p in model.parameters() if p.requires_grad]))
    (eager, eager_grads), (out, grads) = results
    for a, b in zip(eager, out):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert any(g is not None for g in eager_grads)
    for a, b in zip(eager_grads, grads):
        if a is None or b is None:  # a parameter outside the graph: zero either way
            assert all(g is None or not g.any() for g in (a, b))
        else:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


# compiling takes seconds per model even without code generation: the default run covers the
# paper's model and the equivariant baseline, the slow run every preset
FAST = ('mz', 'egnn')


@pytest.mark.parametrize('name', [
    name if name in FAST else pytest.param(name, marks=pytest.mark.slow)
    for name in sorted(list_models())])
def test_compiled_preset_matches_eager(name):
    torch._dynamo.reset()
    model = build_model(name, 3, 2, **_small(name))
    _check(model, (_batch(3, [4, 1, 6]), ), 'aot_eager')


def _train_step_results(model, module, args, seed):
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    out = module(*args)
    out = out[0] if isinstance(out, tuple) else out
    out.square().sum().backward()
    return [out.detach()] + [None if p.grad is None else p.grad.clone()
                             for p in model.parameters()]


@pytest.mark.parametrize('name, backend', [
    ('rigid', 'aot_eager'), pytest.param('mz', 'aot_eager', marks=pytest.mark.slow),
    pytest.param('rigid', 'inductor', marks=pytest.mark.slow)])
def test_compiled_training_draws_the_eager_dropout_masks(name, backend):
    r"""In training mode (dropout 0.1 in the attention and the feed-forward blocks) the compiled
    model under the same seed gives eager's values and gradients: its dropout masks come from
    the operator ``torch_mz::dropout_keep_mask``, called as it is, in eager's order (with
    inductor's own random numbers, or :func:`F.dropout`'s, the masks differed)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build_model(name, 3, 2, **_small(name)).train()
    args = (_batch(3, [4, 1, 6, 9]), )
    compiled = torch.compile(model, backend=backend, dynamic=False)
    eager = _train_step_results(model, model, args, seed=5)
    for _ in range(2):  # the first call compiles, the second runs the compiled graphs
        got = _train_step_results(model, compiled, args, seed=5)
        assert sum(g is not None for g in eager) > 10
        for a, b in zip(eager, got):
            if a is None or b is None:  # a parameter outside the graph: zero either way
                assert all(g is None or not g.any() for g in (a, b))
            else:
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    other = _train_step_results(model, compiled, args, seed=6)  # the masks follow the seed
    assert not torch.allclose(other[0], eager[0])


@pytest.mark.parametrize('kwargs', [{}, pytest.param(dict(preset='paper', dim=16, d_ff=16),
                                                    marks=pytest.mark.slow)])
def test_compiled_aggregation_matches_eager(kwargs):
    torch._dynamo.reset()
    torch.manual_seed(0)
    aggr = MZAggregation(5, **kwargs)
    index = make_index([3, 0, 5, 1], shuffle=True, generator=torch.Generator().manual_seed(1))
    x = torch.randn(index.numel(), 5)
    _check(aggr, (x, index), 'aot_eager')


@pytest.mark.slow
def test_inductor_compiled_aggregation_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    aggr = MZAggregation(5)
    _check(aggr, (torch.randn(9, 5), make_index([4, 5])), 'inductor')


def test_compiled_flat_set_transformer_matches_eager():
    from torch_mz.nn import FlatSetTransformerAggregation
    torch._dynamo.reset()
    torch.manual_seed(0)
    aggr = FlatSetTransformerAggregation(8, heads=2, layer_norm=True)
    index = make_index([3, 0, 5, 1], shuffle=True, generator=torch.Generator().manual_seed(1))
    x = torch.randn(index.numel(), 8)
    _check(aggr, (x, index), 'aot_eager')
    grads = []  # and the gradients of the two agree
    for module in (aggr, torch.compile(aggr, backend='aot_eager', dynamic=False)):
        aggr.zero_grad()
        module(x, index).square().sum().backward()
        grads.append([p.grad.clone() for p in aggr.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_compiled_aggregation_with_the_fused_kernels_on(monkeypatch):
    r"""With the compiled kernels on for every input (``set_fused_kernels(True)``), an outer
    ``torch.compile`` traces the kernels' formulas into its own graph (the kernels' graphs and
    their dynamic-size marks are for eager callers): the same values and finite gradients as
    eager. (The kernels' own compiling is replaced by the plain formula here, so the eager
    reference takes seconds; it runs the formula the kernels compile.)"""
    from torch_mz.nn import fused
    monkeypatch.setattr(fused, '_FAILED', False)
    monkeypatch.setattr(fused, '_ENABLED', True)
    monkeypatch.setattr(fused, '_compiled', lambda name, fn: fn)
    torch._dynamo.reset()
    torch.manual_seed(0)
    aggr = MZAggregation(5, num_generators=2)
    index = make_index([3, 0, 5, 1], shuffle=True, generator=torch.Generator().manual_seed(1))
    x = torch.randn(index.numel(), 5)
    _check(aggr, (x, index), 'aot_eager')


def test_compiled_aggregation_on_other_sets_matches_eager():
    r"""Under ``torch.compile`` each attention's size buckets are found outside the compiled
    graph (one graph break, the layout cache used) and the graph after it is guarded on the
    buckets: a second input with as many rows in other sets runs on its own buckets, not on
    the first input's, and matches eager again, values and gradients."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    aggr = MZAggregation(5, num_generators=2)
    compiled = torch.compile(aggr, backend='aot_eager', dynamic=False)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(12, 5, generator=g)
    for sizes in ([3, 0, 5, 4], [1, 1, 10, 0], [6, 6, 0, 0]):
        index = make_index(sizes, shuffle=True, generator=g)
        results = []
        for module in (aggr, compiled):
            aggr.zero_grad()
            out = module(x, index)
            out.square().sum().backward()
            results.append([out.detach()] + [p.grad.clone() for p in aggr.parameters()
                                              if p.grad is not None])
        assert len(results[0]) == len(results[1])
        for a, b in zip(*results):  # (gradients summed in another order: atol 1e-5)
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_aggregation_compiles_in_few_graphs():
    r"""The host reads that decide the layout (size buckets, id bounds) are made outside the
    compiled graph, once per attention, not at each read: the default aggregation of four sets
    compiles in at most 40 graphs (79 when each read broke the graph; the rest are one break
    per attention for its layout and one per value-order choice)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    aggr = MZAggregation(5)
    index = make_index([3, 0, 5, 1], shuffle=True, generator=torch.Generator().manual_seed(1))
    x = torch.randn(index.numel(), 5, requires_grad=True)
    explained = torch._dynamo.explain(aggr)(x, index)
    assert explained.graph_count <= 40, [r.reason for r in explained.break_reasons]
