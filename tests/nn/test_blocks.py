import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_mz.nn import ISAB, MAB, PMA, SAB, GeneratorFeedForward, Zonotope
from torch_mz.nn.blocks import FeedForward
from torch_mz.nn.zonotope import MappedZonotope
from torch_mz.testing import permute_within_sets
from tests.nn._sets import make_index

D, NG = 8, 2
KW = dict(heads=2, num_generators=NG, d_ff=16, num_matrix_generators=2)


def _tokens(n, seed):
    g = torch.Generator().manual_seed(seed)
    return Zonotope(torch.randn(n, D, generator=g, dtype=torch.float64),
                    torch.randn(n, NG, D, generator=g, dtype=torch.float64) * 0.3)


def _block(kind, value='mz', seed=0, **extra):
    torch.manual_seed(seed)
    kwargs = dict(KW, value=value, **extra)
    if kind == 'sab':
        return SAB(D, **kwargs).double().eval()
    if kind == 'isab':
        return ISAB(D, num_inducing=3, **kwargs).double().eval()
    return PMA(D, num_seeds=2, **kwargs).double().eval()


sizes_strategy = st.lists(st.integers(0, 7), min_size=1, max_size=5)


@settings(max_examples=15, deadline=None)
@given(sizes=sizes_strategy, seed=st.integers(0, 10_000),
       kind=st.sampled_from(['sab', 'isab']), value=st.sampled_from(['mz', 'rigid']))
def test_sab_isab_permutation_equivariant_within_sets(sizes, seed, kind, value):
    block = _block(kind, value)
    index = make_index(sizes)
    x = _tokens(index.numel(), seed)
    perm = permute_within_sets(index, torch.Generator().manual_seed(seed))
    out = block(x, index, len(sizes))
    out_perm = block(x[perm], index[perm], len(sizes))
    torch.testing.assert_close(out_perm.center, out.center[perm])
    torch.testing.assert_close(out_perm.gens, out.gens[perm])
    assert torch.isfinite(out.center).all() and torch.isfinite(out.gens).all()


@settings(max_examples=15, deadline=None)
@given(sizes=sizes_strategy, seed=st.integers(0, 10_000), value=st.sampled_from(['mz', 'rigid']))
def test_pma_invariant_to_any_row_order(sizes, seed, value):
    block = _block('pma', value)
    index = make_index(sizes)
    x = _tokens(index.numel(), seed)
    shuffle = torch.randperm(index.numel(), generator=torch.Generator().manual_seed(seed))
    out = block(x, index, len(sizes))
    out2 = block(x[shuffle], index[shuffle], len(sizes))  # unsorted index, rows moved anywhere
    torch.testing.assert_close(out2.center, out.center)
    torch.testing.assert_close(out2.gens, out.gens)
    assert out.center.shape == (2 * len(sizes), D)


@pytest.mark.parametrize('kind', ['sab', 'isab', 'pma'])
def test_changing_one_set_leaves_other_sets_unchanged(kind):
    block = _block(kind)
    index = make_index([3, 1, 4, 0, 2])
    x = _tokens(index.numel(), 1)
    y = _tokens(index.numel(), 2)
    mask = index == 2
    x2 = Zonotope(torch.where(mask[:, None], y.center, x.center),
                  torch.where(mask[:, None, None], y.gens, x.gens))
    out, out2 = block(x, index, 5), block(x2, index, 5)
    out_set = index if kind != 'pma' else torch.arange(5).repeat_interleave(2)
    keep = out_set != 2
    torch.testing.assert_close(out2.center[keep], out.center[keep])
    torch.testing.assert_close(out2.gens[keep], out.gens[keep])
    assert not torch.allclose(out2.center[~keep], out.center[~keep])


@pytest.mark.parametrize('kind', ['sab', 'isab', 'pma'])
def test_dense_and_scatter_paths_agree(kind):
    dense = _block(kind, path='dense')
    scatter = _block(kind, path='scatter')
    scatter.load_state_dict(dense.state_dict())
    index = make_index([5, 0, 1, 9, 3], shuffle=True, generator=torch.Generator().manual_seed(0))
    x = _tokens(index.numel(), 3)
    a, b = dense(x, index, 5), scatter(x, index, 5)
    torch.testing.assert_close(a.center, b.center)
    torch.testing.assert_close(a.gens, b.gens)


def test_rigid_generator_path_is_odd_and_keeps_zero():
    r"""Flipping every generator's sign (the same zonotopes) flips the output generators and
    leaves the centers unchanged; zero generators stay zero."""
    block = _block('isab', 'rigid')
    with torch.no_grad():
        block.inducing.gens.normal_()
    index = make_index([4, 3])
    x = _tokens(7, 5)
    out = block(x, index, 2)
    with torch.no_grad():  # flip the learned inducing generators too: every generator flips
        block.inducing.gens.neg_()
    flipped = block(Zonotope(x.center, -x.gens), index, 2)
    torch.testing.assert_close(flipped.center, out.center)
    torch.testing.assert_close(flipped.gens, -out.gens)
    with torch.no_grad():
        block.inducing.gens.zero_()
    zero = block(Zonotope(x.center, torch.zeros_like(x.gens)), index, 2)
    assert torch.equal(zero.gens, torch.zeros_like(zero.gens))


def test_generator_ffn_is_odd_and_pma_maps_generators_with_it():
    gens = torch.randn(5, 3, D, dtype=torch.float64)
    gffn = GeneratorFeedForward(D, 4).double()
    torch.testing.assert_close(gffn(-gens), -gffn(gens))
    # PMA: rFF on the centers and the generator FFN on the generator rows, then the MAB
    block = _block('pma')
    index = make_index([5])
    x = Zonotope(torch.randn(5, D, dtype=torch.float64), gens[:, :NG].clone())
    seeds, seed_set = block.seeds(1, x.center)
    expected = block.mab(seeds, Zonotope(block.rff(x.center), block.rff_gens(x.gens)), seed_set,
                         index, 1)
    out = block(x, index, 1)
    torch.testing.assert_close(out.center, expected.center)
    torch.testing.assert_close(out.gens, expected.gens)


@pytest.mark.parametrize('value', ['mz', 'rigid', 'film', 'hypernet'])
@pytest.mark.parametrize('order', ['before', 'after'])
@pytest.mark.parametrize('path', ['dense', 'scatter'])
@pytest.mark.parametrize('d_ff, summary', [(16, 'mean'), (8, 'mean'), (4, 'mean+std')])
def test_pma_generator_ffn_last_map_after_the_aggregation_is_exact(value, order, path, d_ff,
                                                                  summary):
    # the PMA hands the attention its generator FFN's hidden rows and W_2 (MappedZonotope), and
    # W_2 joins the value map; where d_ff <= d the center rFF's W_2 and bias join the key and
    # value maps and the gates' set mean too: the literal order (W_2 on every row, then the MAB)
    # gives the same values and gradients (inputs and every parameter) to float64 rounding,
    # with the value map before and after the aggregation, a set without elements and dropout
    # off
    block = _block('pma', value, seed=3, path=path, d_ff=d_ff, summary=summary)
    block.mab.attn.value_order = order
    seen = []
    block.mab.register_forward_pre_hook(lambda m, args: seen.append(args[1]))
    index = make_index([5, 0, 3, 1])
    x = _tokens(index.numel(), 4)
    for name, p in block.named_parameters():  # non-zero context-dependent parameters
        if 'gens' in name or p.abs().sum() == 0:
            with torch.no_grad():
                p.copy_(torch.randn_like(p) * 0.3)

    def literal(c, g):
        seeds, seed_set = block.seeds(4, c)
        kv = Zonotope(block.rff(c), block.rff_gens(g))
        return block.mab(seeds, kv, seed_set, index, 4)

    c = x.center.clone().requires_grad_()
    g = x.gens.clone().requires_grad_()
    params = [p for p in block.parameters()]
    outs = []
    for fn in (lambda c, g: block(Zonotope(c, g), index, 4), literal):
        out = fn(c, g)
        loss = (out.center.sin().sum() + out.gens.cos().sum())
        outs.append((out, torch.autograd.grad(loss, [c, g] + params, allow_unused=True)))
    (fast, fast_grads), (ref, ref_grads) = outs
    assert isinstance(seen[0], MappedZonotope)
    assert (seen[0].center_weight is not None) == (d_ff <= D)  # the center folded
    torch.testing.assert_close(fast.center, ref.center, atol=1e-10, rtol=0)
    torch.testing.assert_close(fast.gens, ref.gens, atol=1e-10, rtol=0)
    for a, b in zip(fast_grads, ref_grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize('value', ['rigid', 'film'])
def test_pma_without_generators_folds_the_center_map_exactly(value):
    # a plain Set Transformer PMA (no generators) with d_ff <= d: the center rFF's W_2 joins the
    # key and value maps; values and gradients as in the literal order
    torch.manual_seed(4)
    block = PMA(D, num_seeds=2, heads=2, num_generators=0, d_ff=D, value=value).double().eval()
    index = make_index([3, 0, 4])
    c = torch.randn(index.numel(), D, dtype=torch.float64, requires_grad=True)
    g = torch.zeros(index.numel(), 0, D, dtype=torch.float64)
    params = list(block.parameters())

    def literal(c):
        seeds, seed_set = block.seeds(3, c)
        return block.mab(seeds, Zonotope(block.rff(c), g), seed_set, index, 3)
    outs = []
    for fn in (lambda c: block(Zonotope(c, g), index, 3), literal):
        out = fn(c)
        outs.append((out.center, torch.autograd.grad(out.center.sin().sum(), [c] + params,
                                                     allow_unused=True)))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-10, rtol=0)
    for a, b in zip(outs[0][1], outs[1][1]):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_mapped_zonotope_shapes_and_materialize():
    c, h, w = torch.randn(4, 6), torch.randn(4, 2, 3), torch.randn(6, 3)
    z = MappedZonotope(c, h, w)
    assert (z.num_tokens, z.dim, z.num_generators) == (4, 6, 2)
    m = z.materialize()
    torch.testing.assert_close(m.gens, torch.einsum('ngh,dh->ngd', h, w))
    assert m.center is c
    with pytest.raises(ValueError, match='do not match'):
        MappedZonotope(c, h, torch.randn(5, 3))
    with pytest.raises(ValueError, match='do not match'):
        MappedZonotope(c, torch.randn(3, 2, 3), w)
    with pytest.raises(ValueError, match='Expected'):
        MappedZonotope(c, h[0], w)
    # centers given by hidden rows (4, 5) and their map (6, 5) with a bias
    ch, cw, cb = torch.randn(4, 5), torch.randn(6, 5), torch.randn(6)
    z = MappedZonotope(ch, h, w, cw, cb)
    assert (z.num_tokens, z.dim, z.num_generators) == (4, 6, 2)
    torch.testing.assert_close(z.materialize().center, ch @ cw.T + cb)
    assert 'center_hidden=5' in repr(z)
    with pytest.raises(ValueError, match='do not match'):
        MappedZonotope(ch, h, w, torch.randn(6, 4))
    with pytest.raises(ValueError, match='do not match'):
        MappedZonotope(c, h, w, None, cb)  # a bias without a map


def test_mab_post_norm_structure():
    mab = MAB(D, **KW, value='rigid').double().eval()
    index = make_index([4])
    x = _tokens(4, 6)
    # post-norm: every output center is LayerNorm-normalised (mean bias, std weight)
    with torch.no_grad():
        mab.norm2.weight.fill_(1.0)
        mab.norm2.bias.zero_()
    out = mab(x, x, index, index, 1)
    torch.testing.assert_close(out.center.mean(-1), torch.zeros(4, dtype=torch.float64))
    torch.testing.assert_close(out.center.var(-1, unbiased=False),
                               torch.ones(4, dtype=torch.float64), atol=1e-4, rtol=0)


def test_empty_sets_give_learned_constant_seeds():
    r"""PMA on an empty set: the seeds attend to nothing, the output is the same for every empty
    set and finite."""
    block = _block('pma')
    index = make_index([0, 3, 0])
    out = block(_tokens(3, 7), index, 3)
    torch.testing.assert_close(out.center[0:2], out.center[4:6])
    assert torch.isfinite(out.center).all()


@pytest.mark.parametrize('kind', ['isab', 'pma'])
def test_learned_tokens_without_generators_get_a_gradient(kind):
    # with num_generators=0 the blocks drop the tokens' empty generator bank, which got no
    # gradient (None): DistributedDataParallel with find_unused_parameters=False then failed
    # at the second step of a rigid, film, hypernet or perceiver model
    block = _block(kind, value='rigid', num_generators=0)
    index = make_index([3, 1])
    tokens = Zonotope(torch.randn(4, D, dtype=torch.float64),
                      torch.zeros(4, 0, D, dtype=torch.float64))
    out = block(tokens, index, 2)
    out.center.sum().backward()
    for name, p in block.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    with torch.no_grad():  # the same values as without the empty bank joined
        assert torch.equal(block(tokens, index, 2).center, out.center)


def test_learned_tokens_without_generators_keep_their_centers_bit_for_bit():
    # the empty bank's sum (+0.0) was added to the centers: a center of -0.0 came out +0.0
    block = _block('pma', value='rigid', num_generators=0)
    with torch.no_grad():
        block.seeds.center[0, :3] = -0.0
    like = torch.zeros(1, D, dtype=torch.float64)
    tokens, _ = block.seeds(2, like)
    assert tokens.center.requires_grad  # (the tie ran)
    with torch.no_grad():
        ref, _ = block.seeds(2, like)
    assert torch.signbit(ref.center).any()
    assert torch.equal(torch.signbit(tokens.center), torch.signbit(ref.center))


@pytest.mark.parametrize('dtype,tol', [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_feed_forward_recompute_matches_autograd(dtype, tol):
    # the training path keeps c and the pre-activation only and recomputes GELU in the backward
    # pass: values and every gradient equal autograd through the plain three operations
    torch.manual_seed(0)
    ffn = FeedForward(6, 10).to(dtype)
    c = torch.randn(37, 6, dtype=dtype, requires_grad=True)
    probe = torch.randn(37, 6, dtype=dtype)
    out = ffn(c)
    assert out.grad_fn is not None and 'FeedForwardFn' in type(out.grad_fn).__name__
    grads = torch.autograd.grad((out * probe).sum(), [c, *ffn.parameters()])
    plain = ffn.lin2(torch.nn.functional.gelu(ffn.lin1(c)))
    ref = torch.autograd.grad((plain * probe).sum(), [c, *ffn.parameters()])
    torch.testing.assert_close(out, plain, rtol=tol, atol=tol)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=tol, atol=tol)
    # frozen parameters, input without gradient: only what is asked for is computed
    for p in ffn.parameters():
        p.requires_grad_(False)
    (g_c, ) = torch.autograd.grad((ffn(c) * probe).sum(), [c])
    torch.testing.assert_close(g_c, ref[0], rtol=tol, atol=tol)
    with torch.no_grad():  # the plain path
        torch.testing.assert_close(ffn(c), plain.detach(), rtol=tol, atol=tol)


def test_feed_forward_recompute_second_derivative():
    # double backward (as when forces, -dE/dx, are trained with create_graph=True) agrees
    torch.manual_seed(1)
    ffn = FeedForward(5, 7).double()
    c = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(11, 5, dtype=torch.float64)

    def second(f):
        (g, ) = torch.autograd.grad((f(c) * probe).sum(), [c], create_graph=True)
        return torch.autograd.grad(g.square().sum(), [c, *ffn.parameters()],
                                   materialize_grads=True)  # b2 does not enter dE/dc
    ours = second(ffn)
    ref = second(lambda x: ffn.lin2(torch.nn.functional.gelu(ffn.lin1(x))))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_mab_generator_path_is_the_literal_formula_and_leaves_inputs_alone():
    # the generator FFN (tanh in place on its first product) and the second residual (added in
    # place into the FFN's output) against the formulas written out; the inputs stay as they were
    from torch_mz.nn.zonotope import zonotope_layer_norm
    mab = MAB(D, **KW, value='mz').double().eval()
    index = make_index([4, 3])
    q, kv = _tokens(7, 8), _tokens(7, 9)
    q_copy, kv_copy = (q.center.clone(), q.gens.clone()), (kv.center.clone(), kv.gens.clone())
    out = mab(q, kv, index, index, 2)
    h = zonotope_layer_norm(q + mab.attn(q, kv, index, index, 2), mab.norm1)
    f_g = torch.tanh(h.gens @ mab.ffn_gens.lin1.weight.T) @ mab.ffn_gens.lin2.weight.T
    ref = zonotope_layer_norm(Zonotope(h.center + mab.ffn(h.center), h.gens + f_g), mab.norm2)
    assert torch.equal(out.center, ref.center) and torch.equal(out.gens, ref.gens)
    for a, b in ((q.center, q_copy[0]), (q.gens, q_copy[1]), (kv.center, kv_copy[0]),
                 (kv.gens, kv_copy[1])):
        assert torch.equal(a, b)
    # under autocast the residual sum keeps the generators' precision (float32), not the
    # bfloat16 of the FFN's output: the same as the sum written out of place
    mab32 = MAB(D, **KW, value='mz').eval()
    q32 = Zonotope(q.center.float(), q.gens.float())
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = mab32(q32, q32, index, index, 2)
        h = zonotope_layer_norm(q32 + mab32.attn(q32, q32, index, index, 2), mab32.norm1)
        f_g = mab32.ffn_gens(h.gens)
        assert f_g.dtype == torch.bfloat16 and h.gens.dtype == torch.float32
        ref = zonotope_layer_norm(Zonotope(h.center + mab32.ffn(h.center), h.gens + f_g),
                                  mab32.norm2)
    assert torch.equal(out.gens, ref.gens) and torch.equal(out.center, ref.center)


def test_pma_with_a_pruned_generator_ffn_runs_the_pruned_layer():
    # pruning re-computes lin2.weight in a forward pre-hook: the PMA then runs the layer itself
    # (not the folded weight), so the pruned weights are used
    import torch.nn.utils.prune as prune
    block = _block('pma', seed=5)
    index = make_index([4, 2])
    x = _tokens(6, 11)
    prune.l1_unstructured(block.rff_gens.lin2, 'weight', amount=0.5)
    with torch.no_grad():  # as an optimizer step: lin2.weight is recomputed at its next call
        block.rff_gens.lin2.weight_orig.mul_(2.0)
    out = block(x, index, 2)
    seeds, seed_set = block.seeds(2, x.center)
    ref = block.mab(seeds, Zonotope(block.rff(x.center), block.rff_gens(x.gens)), seed_set,
                    index, 2)
    assert torch.equal(out.gens, ref.gens) and torch.equal(out.center, ref.center)
    assert (block.rff_gens.lin2.weight == 0).sum() >= block.rff_gens.lin2.weight.numel() // 2


def test_pma_with_backward_hooks_runs_the_layers_and_calls_the_hooks():
    # a backward hook fires only when its module is called: the PMA then runs the feed-forward
    # layers as they are (not folded into the attention's maps), the hooks see their gradients,
    # and the values agree with the folded computation
    block = _block('pma', seed=5)
    index = make_index([4, 2])
    x = _tokens(6, 11)
    folded = block(x, index, 2)
    calls = []
    handles = [layer.register_full_backward_hook(lambda m, gi, go, name=name: calls.append(name))
               for name, layer in (('center', block.rff.lin2), ('gens', block.rff_gens.lin2))]
    out = block(x, index, 2)
    (out.center.sum() + out.gens.sum()).backward()
    for handle in handles:
        handle.remove()
    assert sorted(calls) == ['center', 'gens']
    torch.testing.assert_close(out.center, folded.center)
    torch.testing.assert_close(out.gens, folded.gens)


@pytest.mark.parametrize('hooked', ['rff', 'rff_gens'])
def test_pma_with_hooks_on_its_feed_forwards_calls_them(hooked):
    # the fold reads the feed-forwards' layers without calling the feed-forwards themselves:
    # a forward hook on one of them (here one that changes its output) was never called and
    # its output never changed; the PMA now runs that feed-forward as it is (d_ff <= d: the
    # center rFF's last map would join the key and value maps)
    block = _block('pma', seed=5, d_ff=D)
    index = make_index([4, 2])
    x = _tokens(6, 11)
    calls = []

    def double(module, args, out):
        calls.append(module)
        return 2 * out
    handle = getattr(block, hooked).register_forward_hook(double)
    out = block(x, index, 2)
    center, gens = block.rff(x.center), block.rff_gens(x.gens)  # (the hook doubles one)
    handle.remove()
    assert len(calls) == 2
    seeds, seed_set = block.seeds(2, x.center)
    ref = block.mab(seeds, Zonotope(center, gens), seed_set, index, 2)
    torch.testing.assert_close(out.center, ref.center, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out.gens, ref.gens, rtol=1e-10, atol=1e-12)


def test_feed_forward_with_a_pruned_layer_uses_the_pruned_weight_in_training():
    # pruning recomputes lin1.weight in a forward pre-hook: the training path (which otherwise
    # reads the weights directly) calls the layers, so the pruned weight is used
    import torch.nn.utils.prune as prune
    torch.manual_seed(0)
    ffn = FeedForward(6, 8)
    prune.l1_unstructured(ffn.lin1, 'weight', amount=0.5)
    with torch.no_grad():  # as an optimizer step: lin1.weight is recomputed at its next call
        ffn.lin1.weight_orig.mul_(2.0)
    c = torch.randn(5, 6, requires_grad=True)
    out = ffn(c)
    mask = ffn.lin1.weight_mask
    ref = F.linear(F.gelu(F.linear(c, ffn.lin1.weight_orig * mask, ffn.lin1.bias)),
                   ffn.lin2.weight, ffn.lin2.bias)
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize('value', ['mz', 'rigid', 'hypernet'])
def test_isab_on_input_tokens_aggregates_the_inputs_exactly(value):
    # the input projection describes its generators as affine in the inputs (AffineZonotope);
    # the ISAB's first attention (3 inducing tokens per set: fewer queries than keys, the value
    # map after the aggregation) then aggregates the 3 input columns instead of the generators:
    # the same values and gradients as with the generators formed (a hook on the generator
    # layer turns the description off)
    from torch_mz.nn import InputProjection
    from torch_mz.nn.zonotope import AffineZonotope
    block = _block('isab', value, seed=5)
    block.mab1.attn.value_order = 'after'
    torch.manual_seed(6)
    proj = InputProjection(3, D, num_generators=KW['num_generators']).double()
    seen = []
    block.mab1.register_forward_pre_hook(lambda m, args: seen.append(args[1]))
    index = make_index([6, 0, 9, 1])
    x = torch.randn(index.numel(), 3, dtype=torch.float64, requires_grad=True)
    params = list(proj.parameters()) + list(block.parameters())
    results = []
    for affine in (True, False):
        handle = None if affine else proj.lin_g.register_forward_hook(lambda *args: None)
        out = block(proj(x), index, 4)
        loss = out.center.sin().sum() + out.gens.cos().sum()
        results.append([out.center, out.gens] + list(torch.autograd.grad(loss, [x] + params)))
        if handle is not None:
            handle.remove()
    assert isinstance(seen[0], AffineZonotope) and type(seen[1]) is Zonotope
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_changed_affine_generators_are_used_as_they_are():
    # an AffineZonotope whose generators were replaced or changed in place (an ablation) no
    # longer describes them: attention aggregates the generators themselves
    from torch_mz.nn import InputProjection
    block = _block('isab', 'mz', seed=5)
    block.mab1.attn.value_order = 'after'
    torch.manual_seed(6)
    proj = InputProjection(3, D, num_generators=NG).double()
    index = make_index([6, 9, 1])
    x = torch.randn(index.numel(), 3, dtype=torch.float64)
    z = proj(x)
    assert z.describes_gens()
    z.gens.mul_(0.5)  # in place
    assert not z.describes_gens()
    expected = block(Zonotope(z.center, z.gens), index, 3)
    got = block(z, index, 3)
    torch.testing.assert_close(got.gens, expected.gens, atol=1e-12, rtol=0)
    z = proj(x)
    z.gens = z.gens * 0  # replaced
    assert not z.describes_gens()
    torch.testing.assert_close(block(z, index, 3).center,
                               block(Zonotope(z.center, z.gens), index, 3).center)
    handle = proj.register_forward_hook(lambda m, args, out: None)  # output as it is
    assert type(proj(x)) is Zonotope  # a hook on the projection itself: no description
    handle.remove()
    z = proj(x)
    x.mul_(2.0)  # the inputs changed in place after the projection
    assert not z.describes_gens()


def test_affine_cost_model_prefers_aggregating_the_inputs():
    from torch_mz.nn import MZAttention
    attn = MZAttention(64, heads=4, num_generators=8, value='mz', num_matrix_generators=4)
    # 32 inducing tokens per set of 1,024: with formed generators 'before' is cheaper, with 3
    # input columns 'after'
    counts = torch.tensor([1024, 1024])
    query_set = make_index([32, 32])
    assert not attn._values_after(query_set, counts, 64, 2048, 2)
    assert attn._values_after(query_set, counts, 64, 2048, 2, affine_width=3)


def test_pma_with_a_hooked_key_map_runs_it_on_the_written_out_centers():
    # the rFF's last map folds into the key map only where that map has no hooks: a hook on
    # lin_k sees the centers (its input) in every call, and the values agree with the fold
    block = _block('pma', seed=5)
    index = make_index([4, 2])
    x = _tokens(6, 11)
    folded = block(x, index, 2)
    seen = []
    lin_k = block.mab.attn.lin_k
    handle = lin_k.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    out = block(x, index, 2)
    handle.remove()
    assert len(seen) == 1 and seen[0].shape == (6, block.mab.attn.dim)
    torch.testing.assert_close(seen[0], block.rff(x.center))
    torch.testing.assert_close(out.center, folded.center)
    torch.testing.assert_close(out.gens, folded.gens)


@pytest.mark.parametrize('name', ['lin_q', 'lin_v'])
def test_hooks_on_the_query_and_value_maps_are_refused(name):
    # their weights are read directly: a pruned weight would go stale (the second optimizer
    # step failed, or the output ignored weight_orig); a parametrization works instead
    import torch.nn.utils.parametrizations as parametrizations
    import torch.nn.utils.prune as prune
    block = _block('sab', seed=3)
    index = make_index([3, 2])
    x = _tokens(5, 4)
    layer = getattr(block.mab.attn, name)
    prune.l1_unstructured(layer, 'weight', amount=0.5)
    with pytest.raises(RuntimeError, match=f"'{name}' directly, so the forward pre-hooks"
                                           ".*parametriz"):
        block(x, index, 2)
    prune.remove(layer, 'weight')  # the pruning made permanent: a plain weight again
    ref = block(x, index, 2)
    # an observing forward hook (a summary of every layer's output) is told once, not refused
    handle = layer.register_forward_hook(lambda *a: None)
    with pytest.warns(UserWarning, match=f"weight of '{name}' directly: the hooks"):
        block(x, index, 2)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        block(x, index, 2)
    handle.remove()
    parametrizations.weight_norm(layer)  # the same weight, recomputed when read
    out = block(x, index, 2)
    torch.testing.assert_close(out.center, ref.center)
    torch.testing.assert_close(out.gens, ref.gens)


@pytest.mark.parametrize('make, match', [
    (lambda: SAB(8, heads=2, num_generators=2, d_ff=8, log_n='False'), "'log_n'"),
    (lambda: SAB(8, heads=2, num_generators=2, d_ff=8, fold_keys='no'), "'fold_keys'"),
    (lambda: SAB(8, heads=2, num_generators=2, d_ff=8, recompute=None), "'recompute'"),
    (lambda: SAB(8, num_generators=2.5), "'num_generators'"),
    (lambda: SAB(8.0, heads=2), "'dim'"),
    (lambda: SAB(8, heads=2, dropout='0.1'), "'dropout'"),
    (lambda: MAB(8, heads=2, d_ff=0), "'d_ff'"),
    (lambda: ISAB(8, num_inducing=0, heads=2), "'num_inducing'"),
    (lambda: PMA(8, num_seeds=0, heads=2), "'num_seeds'"),
    (lambda: FeedForward(4, 0), "'hidden'"),
    (lambda: GeneratorFeedForward(0, 4), "'dim'"),
])
def test_block_arguments_of_the_wrong_type_or_range_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize('value, num_generators, query_generators', [
    ('mz', NG, 1), ('mz', NG, 3), ('rigid', 0, 1)])
def test_mab_refuses_query_tokens_of_another_generator_budget(value, num_generators,
                                                              query_generators):
    # the residual G_X + o_G adds generator slots row by row: a query with one generator was
    # broadcast to every slot of the block's budget (and dropped by a block without
    # generators) without a word; more generators failed with a bare size mismatch
    torch.manual_seed(0)
    block = MAB(D, **dict(KW, value=value, num_generators=num_generators)).double().eval()
    index = torch.tensor([0, 0, 1])
    g = torch.Generator().manual_seed(1)
    key_value = Zonotope(torch.randn(3, D, generator=g, dtype=torch.float64),
                         torch.randn(3, num_generators, D, generator=g, dtype=torch.float64))
    query = Zonotope(torch.randn(3, D, generator=g, dtype=torch.float64),
                     torch.randn(3, query_generators, D, generator=g, dtype=torch.float64))
    with pytest.raises(ValueError, match=f'query tokens with {num_generators} generators, '
                                         f'the block.s budget \\(got {query_generators}\\)'):
        block(query, key_value, index, index, 2)
    out = block(key_value, key_value, index, index, 2)  # the block's own budget: as before
    assert out.gens.shape == (3, num_generators, D)


@pytest.mark.parametrize('kind', ['sab', 'isab', 'pma'])
def test_blocks_name_set_ids_outside_the_sets_and_tokens_of_another_dtype(kind):
    # ids >= num_sets or negative, and float32 tokens into a float64 block (or the reverse),
    # failed inside with bare RuntimeErrors (index out of bounds, a size mismatch, bincount's
    # refusal, 'expected m1 and m2 to have the same dtype')
    block = _block(kind)
    z = _tokens(6, 0)
    index = torch.tensor([0, 0, 1, 1, 1, 2])
    block(z, index, 3)
    with pytest.raises(ValueError, match=r'set ids in \[0, 3\) for 3 sets \(got ids up to '
                                         r'3\)'):
        block(z, torch.tensor([0, 0, 1, 1, 1, 3]), 3)
    with pytest.raises(ValueError, match=r'set ids in \[0, 2\) .*got ids up to 2'):
        block(z, index, 2)
    with pytest.raises(ValueError, match=r'negative ids, down to -1'):
        block(z, torch.tensor([0, 0, 1, 1, -1, 2]), 3)
    with pytest.raises(ValueError, match=r"tokens of the module's dtype torch.float64 \(got "
                                         r"torch.float32"):
        block(z.to(torch.float32), index, 3)
    with pytest.raises(ValueError, match=r"module's dtype torch.float32 \(got torch.float64"):
        block.float()(z, index, 3)
    out = block(z.to(torch.float32), index, 3)  # the module's dtype: as before
    assert out.center.dtype == torch.float32


def test_block_reprs_show_the_feed_forward_width():
    for make in (lambda d_ff: SAB(D, **dict(KW, d_ff=d_ff)),
                 lambda d_ff: ISAB(D, num_inducing=3, **dict(KW, d_ff=d_ff)),
                 lambda d_ff: PMA(D, num_seeds=2, **dict(KW, d_ff=d_ff)),
                 lambda d_ff: MAB(D, **dict(KW, d_ff=d_ff))):
        assert 'd_ff=16' in repr(make(16)) and repr(make(16)) != repr(make(32))


@pytest.mark.parametrize('kind', ['sab', 'isab', 'pma'])
def test_a_block_under_autocast_takes_what_its_layer_norms_take(kind):
    # the blocks' queries (and a PMA's seeds, of the tokens' dtype) meet their LayerNorms in a
    # residual sum, which autocast does not cast: a half-precision block took tokens of another
    # dtype, or ran under autocast to the other half precision, and failed inside ('mixed dtype
    # (CPU): expect parameter to have scalar type of Float'); the attention alone (no LayerNorm)
    # takes them all, as before
    index = torch.tensor([0, 0, 0, 1, 1])
    z = _tokens(5, 0)
    for module, cast in ((torch.bfloat16, torch.float16), (torch.float16, torch.bfloat16)):
        block = _block(kind).to(module)
        with torch.autocast('cpu', dtype=module):
            assert torch.isfinite(block(z.to(module), index, 2).center).all()
            for came in (torch.float32, cast):
                with pytest.raises(ValueError, match=rf"tokens of the module's dtype {module} "
                                                     rf"\(got {came}.*own dtype only"):
                    block(z.to(came), index, 2)
        with torch.autocast('cpu', dtype=cast):
            with pytest.raises(ValueError, match=rf"module of float32 or {cast} parameters "
                                                 rf"under torch.autocast to {cast} \(got "
                                                 rf"{module} parameters, whose LayerNorms"):
                block(z.to(module), index, 2)
            attn = block.mab.attn if kind == 'pma' else (block.mab if kind == 'sab'
                                                          else block.mab1).attn
            low = z.to(cast)
            assert torch.isfinite(attn(low, low, index, index, 2).center).all()
        with pytest.raises(ValueError, match=r"\(e\.g\. \.to\(torch\.float32\)\), whose "
                                             r"LayerNorms take"):  # (no autocast remedy)
            block(z.to(torch.float32), index, 2)
        # a float32 block takes tokens of any precision but float64 under autocast
        block.float()
        with torch.autocast('cpu', dtype=cast):
            for came in (torch.float32, torch.bfloat16, torch.float16):
                assert torch.isfinite(block(z.to(came), index, 2).center).all()
