import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F

from torch_mz.nn import InputProjection, Zonotope, zonotope_layer_norm
from tests.nn._grads import assert_graph_branch_gradients_match


def _vertices(z: Zonotope, i: int):
    r"""All points c + sum_g alpha_g G_g with alpha in {-1, 1}^n_g of token i."""
    ng = z.num_generators
    alphas = torch.tensor(list(itertools.product([-1.0, 1.0], repeat=ng)), dtype=z.center.dtype)
    return z.center[i] + alphas @ z.gens[i]  # (2^ng, d)


def test_linear_map_is_exact_on_points():
    g = torch.Generator().manual_seed(0)
    z = Zonotope(torch.randn(3, 4, generator=g, dtype=torch.float64),
                 torch.randn(3, 2, 4, generator=g, dtype=torch.float64))
    W = torch.randn(5, 4, generator=g, dtype=torch.float64)
    b = torch.randn(5, generator=g, dtype=torch.float64)
    out = z.linear(W, b)
    alpha = torch.rand(3, 2, generator=g, dtype=torch.float64) * 2 - 1
    points = z.center + torch.einsum('ng,ngd->nd', alpha, z.gens)
    mapped = out.center + torch.einsum('ng,ngd->nd', alpha, out.gens)
    torch.testing.assert_close(mapped, points @ W.T + b)


def test_addition_and_interval_hull():
    g = torch.Generator().manual_seed(1)
    a = Zonotope(torch.randn(2, 3, generator=g), torch.randn(2, 3, 3, generator=g))
    b = Zonotope(torch.randn(2, 3, generator=g), torch.randn(2, 3, 3, generator=g))
    s = a + b
    torch.testing.assert_close(s.center, a.center + b.center)
    torch.testing.assert_close(s.gens, a.gens + b.gens)
    # IHW is the half-width of the tightest box: the largest deviation over all vertices.
    for i in range(2):
        half_width = (_vertices(a, i) - a.center[i]).abs().max(dim=0).values
        torch.testing.assert_close(a.ihw()[i], half_width)
    torch.testing.assert_close(a.signed_sum(), a.gens.sum(1))


def test_zonotope_rejects_bad_shapes():
    with pytest.raises(ValueError, match='shape'):
        Zonotope(torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match='do not match'):
        Zonotope(torch.zeros(2, 3), torch.zeros(2, 1, 4))


def test_layer_norm_maps_generators_by_its_jacobian():
    g = torch.Generator().manual_seed(2)
    norm = torch.nn.LayerNorm(6).double()
    with torch.no_grad():
        norm.weight.copy_(torch.rand(6, generator=g, dtype=torch.float64) + 0.5)
        norm.bias.copy_(torch.randn(6, generator=g, dtype=torch.float64))
    z = Zonotope(torch.randn(4, 6, generator=g, dtype=torch.float64),
                 torch.randn(4, 3, 6, generator=g, dtype=torch.float64))
    out = zonotope_layer_norm(z, norm)
    torch.testing.assert_close(out.center, norm(z.center))
    for gi in range(3):
        _, tangent = torch.func.jvp(norm, (z.center, ), (z.gens[:, gi], ))
        torch.testing.assert_close(out.gens[:, gi], tangent)
    # linear in the generators: sign flip flips, zero stays zero
    neg = zonotope_layer_norm(Zonotope(z.center, -z.gens), norm)
    torch.testing.assert_close(neg.gens, -out.gens)
    zero = zonotope_layer_norm(Zonotope(z.center, torch.zeros_like(z.gens)), norm)
    assert torch.equal(zero.gens, torch.zeros_like(z.gens))


def test_input_projection_matches_eq2():
    proj = InputProjection(5, 8, num_generators=3).double()
    x = torch.randn(7, 5, dtype=torch.float64)
    z = proj(x)
    expected_c = F.layer_norm(F.gelu(x @ proj.lin_c.weight.T + proj.lin_c.bias), (8, ),
                              proj.norm.weight, proj.norm.bias)
    expected_g = (x @ proj.lin_g.weight.T + proj.lin_g.bias).view(7, 3, 8) / (3 * 8)**0.5
    torch.testing.assert_close(z.center, expected_c)
    torch.testing.assert_close(z.gens, expected_g)
    assert 'num_generators=3' in repr(proj)


def test_input_projection_describes_its_generators_affinely():
    from torch_mz.nn.zonotope import AffineZonotope
    proj = InputProjection(5, 8, num_generators=3).double()
    x = torch.randn(7, 5, dtype=torch.float64)
    z = proj(x)
    assert isinstance(z, AffineZonotope) and z.inputs is x
    torch.testing.assert_close(torch.einsum('gdp,np->ngd', z.gen_weight, z.inputs) + z.gen_bias,
                               z.gens, rtol=0, atol=1e-14)
    # operations give plain zonotopes (the description holds for these generators only)
    assert type(z + z) is Zonotope and type(z[:3]) is Zonotope
    handle = proj.lin_g.register_forward_hook(lambda *args: None)  # the hook sees its call
    assert type(proj(x)) is Zonotope
    handle.remove()
    wide = InputProjection(40, 4, num_generators=2).double()  # d_in >= n_g d: nothing to gain
    assert type(wide(torch.randn(3, 40, dtype=torch.float64))) is Zonotope
    with pytest.raises(ValueError, match="'gen_weight'"):
        AffineZonotope(z.center, z.gens, x, z.gen_weight[:, :, :4], z.gen_bias)
    with pytest.raises(ValueError, match="'gen_bias'"):
        AffineZonotope(z.center, z.gens, x, z.gen_weight, z.gen_bias[:2])


def test_input_projection_without_generators():
    proj = InputProjection(5, 8, num_generators=0)
    z = proj(torch.randn(4, 5))
    assert z.gens.shape == (4, 0, 8)
    with pytest.raises(ValueError):
        InputProjection(5, 8, num_generators=-1)


@pytest.mark.parametrize('name, bad', [
    ('in_channels', True), ('in_channels', 2.0), ('in_channels', '2'), ('in_channels', None),
    ('dim', 8.0), ('dim', True), ('dim', 0), ('num_generators', True), ('num_generators', 2.0),
    ('num_generators', None),
])
def test_input_projection_names_a_size_of_the_wrong_type(name, bad):
    # True was taken as 1; 2.0, '2' or None failed inside torch ("empty(): argument 'size'
    # ...", "'<=' not supported") without naming the argument
    kwargs = dict(dict(in_channels=5, dim=8, num_generators=2), **{name: bad})
    with pytest.raises(ValueError, match=f"'{name}' must be an integer"):
        InputProjection(**kwargs)


def _assert_same_map(fn, reference, norm, c, gens):
    r"""Two LayerNorm maps of zonotopes give the same generators and the same gradients of a
    loss with respect to centers, generators and the LayerNorm weight (float64)."""
    results = []
    for f in (fn, reference):
        norm.zero_grad()
        cc, gg = c.clone().requires_grad_(), gens.clone().requires_grad_()
        out = f(Zonotope(cc, gg), norm)
        (out.gens.pow(3).sum() + out.center.sin().sum()).backward()
        results.append([out.gens, cc.grad, gg.grad]
                       + ([norm.weight.grad.clone()] if norm.weight is not None else []))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('affine', [True, False])
@pytest.mark.parametrize('d, ng', [(33, 4), (6, 2)])
def test_fused_layer_norm_jacobian_matches_autograd_reference(affine, d, ng):
    r"""The hand-written backward of the generator map agrees with autograd through the
    elementwise formula (values and gradients of centers, generators and the weight) and passes
    gradcheck in float64."""
    from torch_mz.nn.zonotope import _LayerNormJacobian, zonotope_layer_norm_reference
    g = torch.Generator().manual_seed(5)
    norm = torch.nn.LayerNorm(d, elementwise_affine=affine).double()
    if affine:
        with torch.no_grad():
            norm.weight.copy_(torch.rand(d, generator=g, dtype=torch.float64) + 0.5)
    c = torch.randn(6, d, generator=g, dtype=torch.float64) * 3 + 1
    gens = torch.randn(6, ng, d, generator=g, dtype=torch.float64)
    _assert_same_map(zonotope_layer_norm, zonotope_layer_norm_reference, norm, c, gens)
    weight = norm.weight.detach().clone().requires_grad_() if affine else None
    assert torch.autograd.gradcheck(
        lambda cc, gg, w: _LayerNormJacobian.apply(cc, gg, w, 1e-5),
        (c[:3].clone().requires_grad_(), gens[:3].clone().requires_grad_(), weight))
    # second derivatives too (create_graph=True: forces trained from an energy)
    assert torch.autograd.gradgradcheck(
        lambda cc, gg, w: _LayerNormJacobian.apply(cc, gg, w, 1e-5),
        (c[:2].clone().requires_grad_(), gens[:2].clone().requires_grad_(), weight))
    # and the graph branch's first derivative is the plain one (gradgradcheck cannot see that)
    assert_graph_branch_gradients_match(
        lambda cc, gg, w: _LayerNormJacobian.apply(cc, gg, w, 1e-5),
        (c.clone().requires_grad_(), gens.clone().requires_grad_(), weight))


@pytest.mark.parametrize('compiled', [
    False, pytest.param(True, marks=pytest.mark.slow)])  # compiling takes about a minute
@pytest.mark.parametrize('affine', [True, False])
def test_compiled_layer_norm_jacobian_matches_autograd_reference(monkeypatch, affine, compiled):
    r"""The compiled kernels (torch_mz.nn.fused), forced on, give the reference's values and
    gradients in float64, for several token counts, and fall back to the eager function with a
    warning when compiling fails. The default run checks the functions that are compiled,
    uncompiled; the slow run compiles them."""
    from torch_mz.nn import fused
    from torch_mz.nn.zonotope import zonotope_layer_norm_reference
    monkeypatch.setattr(fused, '_ENABLED', True)
    if not compiled:
        monkeypatch.setattr(fused, '_compiled', lambda name, fn: fn)
    g = torch.Generator().manual_seed(7)
    d, ng = 12, 3
    norm = torch.nn.LayerNorm(d, elementwise_affine=affine).double()
    if affine:
        with torch.no_grad():
            norm.weight.copy_(torch.rand(d, generator=g, dtype=torch.float64) + 0.5)
    for n in (5, 9):
        c = torch.randn(n, d, generator=g, dtype=torch.float64) * 3 + 1
        gens = torch.randn(n, ng, d, generator=g, dtype=torch.float64)
        _assert_same_map(zonotope_layer_norm, zonotope_layer_norm_reference, norm, c, gens)
    assert fused.fused_kernels_enabled()

    calls = []
    monkeypatch.setattr(fused, '_compiled', lambda name, fn: calls.append(name) or fn)
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False):  # a dispatch mode: compiled graphs are not called
        fused.LayerNormJacobianFused.apply(c, gens, None, 1e-5)
    assert calls == []

    def broken(*args, **kwargs):
        raise RuntimeError('no compiler here')
    monkeypatch.setattr(fused, '_compiled', lambda name, fn: broken)
    monkeypatch.setattr(fused, '_FAILED', False)
    with pytest.warns(RuntimeWarning, match='no compiler here'):
        out = fused.LayerNormJacobianFused.apply(c, gens, None, 1e-5)
    torch.testing.assert_close(out, zonotope_layer_norm_reference(
        Zonotope(c, gens), torch.nn.LayerNorm(d, elementwise_affine=False).double()).gens)
    assert not fused.fused_kernels_enabled()  # the eager function from now on


@pytest.mark.parametrize('compiled', [
    False, pytest.param(True, marks=pytest.mark.slow)])  # compiling takes about a minute
def test_layer_norm_of_a_residual_sum_matches_the_written_out_sum(monkeypatch, compiled):
    r"""``zonotope_layer_norm(z, norm, add=r)``, whose compiled kernels form the generators' sum
    themselves (:class:`~torch_mz.nn.fused.LayerNormJacobianSumFused`), equals the map of the
    written-out ``z + r`` and the autograd reference in float64, values and gradients of both
    summands, the center and the weight (first and second order), also for a strided summand
    (a view of a wider layout, as the attention returns); the kernels' names are the sum's."""
    from torch_mz.nn import fused
    from torch_mz.nn.zonotope import zonotope_layer_norm_reference
    calls = []
    monkeypatch.setattr(fused, '_ENABLED', True)
    monkeypatch.setattr(fused, '_FAILED', False)
    if not compiled:
        monkeypatch.setattr(fused, '_compiled', lambda name, fn: calls.append(name) or fn)
    g = torch.Generator().manual_seed(5)
    d, ng, n = 12, 3, 7
    norm = torch.nn.LayerNorm(d).double()
    with torch.no_grad():
        norm.weight.copy_(torch.rand(d, generator=g, dtype=torch.float64) + 0.5)
    c1 = (torch.randn(n, d, generator=g, dtype=torch.float64) * 3 + 1).requires_grad_()
    c2 = torch.randn(n, d, generator=g, dtype=torch.float64).requires_grad_()
    g1 = torch.randn(n, ng, d, generator=g, dtype=torch.float64).requires_grad_()
    wide = torch.randn(n, ng + 1, d, generator=g, dtype=torch.float64).requires_grad_()
    g2 = wide[:, 1:]  # strided: a view of a wider layout
    assert not g2.is_contiguous()
    w = torch.randn(n, ng, d, generator=g, dtype=torch.float64)
    results = []
    for fn in ('sum', 'written', 'reference'):
        norm.zero_grad()
        leaves = (c1, c2, g1, wide)
        for t in leaves:
            t.grad = None
        if fn == 'sum':
            out = zonotope_layer_norm(Zonotope(c1, g1), norm, add=Zonotope(c2, g2))
        elif fn == 'written':
            out = zonotope_layer_norm(Zonotope(c1, g1) + Zonotope(c2, g2), norm)
        else:
            out = zonotope_layer_norm_reference(Zonotope(c1, g1) + Zonotope(c2, g2), norm)
        ((out.gens * w).sum() + out.center.pow(2).sum()).backward()
        results.append([out.center.detach(), out.gens.detach()]
                       + [t.grad.clone() for t in leaves] + [norm.weight.grad.clone()])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    if not compiled:
        assert 'ln_sum_forward' in calls and 'ln_sum_backward' in calls
        # second order (create_graph=True runs the formula uncompiled)
        small = [t.detach()[:3].requires_grad_() for t in (c1, c2, g1, wide)]
        assert torch.autograd.gradgradcheck(
            lambda a, b, x, y: fused.LayerNormJacobianSumFused.apply(
                a + b, x, y[:, 1:], None, 1e-5), small)
        assert_graph_branch_gradients_match(
            lambda a, b, x, y: fused.LayerNormJacobianSumFused.apply(
                a + b, x, y[:, 1:], None, 1e-5), small)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA not available')
@pytest.mark.parametrize('fused_on_cuda', [False, True])
def test_cuda_fused_layer_norm_jacobian_matches_cpu(monkeypatch, fused_on_cuda):
    r"""The LayerNorm Jacobian on CUDA equals the CPU's (eager there), values and gradients: the
    eager functions, and the compiled kernels forced on for the CUDA leg (compiled by Triton;
    a compile failure, which would fall back to the eager functions with a warning, fails)."""
    import warnings

    from torch_mz.nn import fused
    norm = torch.nn.LayerNorm(64).double()
    g = torch.Generator().manual_seed(3)
    c = torch.randn(10, 64, generator=g, dtype=torch.float64)
    gens = torch.randn(10, 8, 64, generator=g, dtype=torch.float64)
    results = []
    for device in ('cpu', 'cuda'):
        monkeypatch.setattr(fused, '_ENABLED', fused_on_cuda and device == 'cuda')
        monkeypatch.setattr(fused, '_FAILED', False)
        n = norm.to(device)
        n.zero_grad()
        # fresh leaves on each device (.to('cpu') would return c itself, leaving it requiring
        # grad, and c.to('cuda') would then be a non-leaf without .grad)
        cc = c.detach().clone().to(device).requires_grad_()
        gg = gens.detach().clone().to(device).requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter('error', RuntimeWarning)  # no silent fallback
            out = zonotope_layer_norm(Zonotope(cc, gg), n)
            out.gens.pow(2).sum().backward()
        assert fused.use_fused_kernels(gg) == (fused_on_cuda and device == 'cuda')
        results.append([t.detach().cpu() for t in (out.gens, cc.grad, gg.grad, n.weight.grad)])
    assert not fused._FAILED
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


def test_auto_mode_compiles_only_large_cpu_float32_calls(monkeypatch):
    r"""The default (auto) mode maps generators with the compiled kernels exactly for CPU
    float32 inputs of at least AUTO_MIN_ELEMENTS elements, whatever ran before; the values agree
    with the reference either way. (Compiling is replaced by the uncompiled function here; the
    slow test above compiles.)"""
    from torch_mz.nn import fused
    from torch_mz.nn.zonotope import zonotope_layer_norm_reference
    compiled = []
    monkeypatch.setattr(fused, '_ENABLED', None)
    monkeypatch.setattr(fused, '_FAILED', False)
    monkeypatch.setattr(fused, 'AUTO_MIN_ELEMENTS', 200)
    monkeypatch.setattr(fused, '_compiled', lambda name, fn: compiled.append(name) or fn)
    g = torch.Generator().manual_seed(11)
    norm = torch.nn.LayerNorm(12)
    big = (torch.randn(6, 12, generator=g), torch.randn(6, 3, 12, generator=g))  # 216 elements
    small = (big[0][:5], big[1][:5])  # 180 elements

    def call(c, gens):
        n = norm.to(c.dtype)
        cc, gg = c.clone().requires_grad_(), gens.clone().requires_grad_()
        out = zonotope_layer_norm(Zonotope(cc, gg), n)
        out.gens.square().sum().backward()
        ref = zonotope_layer_norm_reference(Zonotope(c, gens), n)
        torch.testing.assert_close(out.gens, ref.gens)
        return gg.grad

    call(*small)
    call(big[0].double(), big[1].double())
    assert compiled == []  # too small, or float64: eager
    grad = call(*big)  # compiled forward and backward
    assert compiled == ['ln_forward', 'ln_backward']
    call(*small)  # small inputs stay eager afterwards too
    assert compiled == ['ln_forward', 'ln_backward']
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False):  # a dispatch mode: eager
        assert not fused.use_fused_kernels(big[1])
    # the same gradients as the eager function (up to float rounding)
    fused.set_fused_kernels(False)
    torch.testing.assert_close(call(*big), grad)


@pytest.mark.parametrize('checkpoint', [True, 'attention'])
def test_auto_mode_under_checkpointing(monkeypatch, checkpoint):
    r"""A checkpointed block (``checkpoint=True``) recomputes the LayerNorm Jacobian with the
    function its forward pass chose (torch.utils.checkpoint refuses a recomputation that keeps
    other tensors; a choice by call count switched between the two and failed there):
    MZAggregation with checkpointing in auto mode gives the eager run's values and gradients.
    (``'attention'`` recomputes the attention alone, which makes no such choice: that case
    checks the agreement only.)"""
    from torch_mz.nn import MZAggregation, fused
    monkeypatch.setattr(fused, '_FAILED', False)
    monkeypatch.setattr(fused, 'AUTO_MIN_ELEMENTS', 64)
    monkeypatch.setattr(fused, '_compiled', lambda name, fn: fn)
    monkeypatch.setattr(fused, '_TANH_FASTER', True)  # the tanh kernel too, not measured here
    torch.manual_seed(0)
    aggr = MZAggregation(8, checkpoint=checkpoint)
    x = torch.randn(40, 8)
    index = torch.arange(10).repeat_interleave(4)
    results = []
    for mode in (None, False):  # auto (compiled on these sizes), then eager
        monkeypatch.setattr(fused, '_ENABLED', mode)
        aggr.zero_grad()
        xx = x.clone().requires_grad_()
        out = aggr(xx, index, dim_size=10)
        out.square().sum().backward()
        results.append((out, xx.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('failing', ['forward', 'backward'])
def test_a_compile_failure_inside_a_checkpointed_block_keeps_its_function(monkeypatch, failing):
    r"""Compiling fails in the forward pass of a checkpointed block (no C++ compiler: the first
    call of a process) or in the backward pass: the recomputation maps the generators with the
    function the forward pass ran (the kernels' formulas, uncompiled), not the hand-written
    one, whose tensors kept for the backward pass differ (torch.utils.checkpoint raised a
    CheckpointError); the values and gradients are the eager run's, in auto mode on float32
    (the default) and in mode on."""
    from torch_mz.nn import MZAggregation, fused

    def compiled(name, fn):
        if name.endswith(failing):
            def broken(*args):
                raise RuntimeError('no compiler here')
            return broken
        return fn
    monkeypatch.setattr(fused, 'AUTO_MIN_ELEMENTS', 64)
    monkeypatch.setattr(fused, '_compiled', compiled)
    monkeypatch.setattr(fused, '_TANH_FASTER', True)
    for mode, dtype in ((None, torch.float32), (True, torch.float64)):
        torch.manual_seed(0)
        aggr = MZAggregation(8, checkpoint=True).to(dtype)
        x = torch.randn(40, 8, dtype=dtype)
        index = torch.arange(10).repeat_interleave(4)
        results = []
        for enabled in (mode, False):
            monkeypatch.setattr(fused, '_ENABLED', enabled)
            monkeypatch.setattr(fused, '_FAILED', False)
            aggr.zero_grad()
            xx = x.clone().requires_grad_()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter('always')
                out = aggr(xx, index, dim_size=10)
                out.square().sum().backward()
            failed = [w for w in caught if 'compiling the fused kernels failed' in str(w.message)]
            assert len(failed) == (0 if enabled is False else 1)
            results.append([out.detach(), xx.grad] + [p.grad for p in aggr.parameters()])
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10,
                                                                               atol=1e-12)
        for a, b in zip(*results):
            torch.testing.assert_close(a, b, **tol)


def test_fused_kernels_give_second_derivatives(monkeypatch):
    r"""A second derivative through the compiled function (create_graph=True) runs its backward
    formula uncompiled, so autograd differentiates it: gradgradcheck in float64. (Before, the
    backward ran on detached inputs and second derivatives came out silently wrong.)"""
    from torch_mz.nn import fused
    monkeypatch.setattr(fused, '_FAILED', False)
    monkeypatch.setattr(fused, '_compiled', lambda name, fn: fn)
    g = torch.Generator().manual_seed(12)
    c = torch.randn(3, 7, generator=g, dtype=torch.float64, requires_grad=True)
    gens = torch.randn(3, 2, 7, generator=g, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(7, generator=g, dtype=torch.float64) + 0.5).requires_grad_()
    fn = lambda cc, gg, ww: fused.LayerNormJacobianFused.apply(cc, gg, ww, 1e-5)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (c, gens, w))
    assert torch.autograd.gradgradcheck(fn, (c, gens, w))


@pytest.mark.parametrize('value, mode', [(None, None), ('auto', None), ('1', True),
                                         ('on', True), ('0', False), ('', None),
                                         ('false', False)])
def test_fused_kernel_mode_from_the_environment(monkeypatch, value, mode):
    from torch_mz.nn import fused
    if value is None:
        monkeypatch.delenv('TORCH_MZ_FUSED_KERNELS', raising=False)
    else:
        monkeypatch.setenv('TORCH_MZ_FUSED_KERNELS', value)
    assert fused._mode_from_environment() is mode


def test_a_mistyped_fused_kernel_mode_is_refused(monkeypatch):
    from torch_mz.nn import fused
    monkeypatch.setenv('TORCH_MZ_FUSED_KERNELS', 'yes please')
    with pytest.raises(ValueError, match=r"'auto' \(or empty\), '1' \(true, on, yes\) or '0'"):
        fused._mode_from_environment()


def test_mab_with_the_kernels_on_equals_the_eager_block(monkeypatch):
    r"""An ISAB (the first MAB's query an input projection's tokens, the second's keys the
    inducing tokens) and a PMA with the kernels forced on equal the eager blocks in float64,
    values and gradients, in training and in inference; the LayerNorms of the residual sums take
    the sum kernels in inference only (in training they kept more memory for the backward
    pass)."""
    from torch_mz.nn import fused
    from torch_mz.nn.blocks import ISAB, PMA
    from torch_mz.nn.functional import repeat_per_set
    from torch_mz.nn.zonotope import InputProjection
    calls = []
    monkeypatch.setattr(fused, '_FAILED', False)
    monkeypatch.setattr(fused, '_compiled', lambda name, fn: calls.append(name) or fn)
    torch.manual_seed(0)
    proj = InputProjection(3, 8, 2).double()
    isab = ISAB(8, num_inducing=3, num_generators=2, heads=2, d_ff=8).double()
    pma = PMA(8, num_seeds=1, num_generators=2, heads=2, d_ff=8).double()
    x = torch.randn(12, 3, dtype=torch.float64)
    set_id = repeat_per_set(3, 4, x.device)

    def run(train):
        for m in (proj, isab, pma):
            m.zero_grad()
        with torch.set_grad_enabled(train):
            z = pma(isab(proj(x), set_id, 3), set_id, 3)
            if train:
                (z.center.square().sum() + z.gens.square().sum()).backward()
        return [z.center.detach(), z.gens.detach()] + (
            [p.grad.clone() for m in (proj, isab, pma) for p in m.parameters()
             if p.grad is not None] if train else [])

    for train in (True, False):
        monkeypatch.setattr(fused, '_ENABLED', False)
        eager = run(train)
        calls.clear()
        monkeypatch.setattr(fused, '_ENABLED', True)
        on = run(train)
        assert len(on) == len(eager) > (2 if train else 1)  # gradients in training
        for a, b in zip(on, eager):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
        # 3 MABs with 2 LayerNorms each: as sums in inference, written out in training
        assert calls.count('ln_sum_forward') == (0 if train else 6)
        assert calls.count('ln_forward') == (6 if train else 0)


def test_input_projection_recomputes_its_activation_without_checkpointing(monkeypatch):
    # in training the center's GELU and LayerNorm run again in the backward pass from the kept
    # pre-activation, by a function of their own (no torch.utils.checkpoint): the same values
    # and gradients as the plain operations, bit for bit; second derivatives too; a hooked
    # LayerNorm is checkpointed instead (its hook sees the forward call)
    import torch.utils.checkpoint as ckpt
    calls = []
    real = ckpt.checkpoint
    monkeypatch.setattr(ckpt, 'checkpoint', lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    proj = InputProjection(5, 8, num_generators=3)
    torch.nn.init.normal_(proj.norm.weight)
    torch.nn.init.normal_(proj.norm.bias)
    x = torch.randn(11, 5, requires_grad=True)
    params = [x, proj.lin_c.weight, proj.lin_c.bias, proj.norm.weight, proj.norm.bias]
    g = torch.randn(11, 8)

    def plain():
        return F.layer_norm(F.gelu(F.linear(x, proj.lin_c.weight, proj.lin_c.bias)), (8, ),
                            proj.norm.weight, proj.norm.bias, proj.norm.eps)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t,
                                                  lambda t: t):
        center = proj(x).center
    assert not calls
    assert sum(1 for s in saved if tuple(s) == (11, 8)) == 1  # the pre-activation only
    expected = plain()
    assert torch.equal(center, expected)
    for a, b in zip(torch.autograd.grad(center, params, g),
                    torch.autograd.grad(expected, params, g)):
        assert torch.equal(a, b)
    # second derivatives (create_graph) through the recomputation, in float64
    proj64 = InputProjection(5, 8, num_generators=0).double()
    torch.nn.init.normal_(proj64.norm.weight)
    x64 = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: proj64(t).center, (x64, ))
    assert_graph_branch_gradients_match(lambda t: proj64(t).center, (x64, ))
    # a hooked LayerNorm: checkpointed, as its own call, which its hook sees (the
    # recomputation stops once the LayerNorm's saved tensors are made, before the hook)
    seen = []
    handle = proj.norm.register_forward_hook(lambda m, args, out: seen.append(1))
    center = proj(x).center
    center.backward(g)
    handle.remove()
    assert calls and len(seen) == 1
    assert torch.equal(center, expected)


@pytest.mark.filterwarnings('ignore::DeprecationWarning')  # torch.jit's, in torch 2.13
@pytest.mark.filterwarnings('ignore::torch.jit.TracerWarning')  # the shape checks, traced
def test_input_projection_under_forward_mode_ad_and_tracing():
    # forward-mode AD (dual tensors, gradients on; tangents on the input or on the weights)
    # and torch.jit.trace step aside from the hand-written functions, which serve neither (the
    # projection into its plain operations under forward-mode AD and into its checkpoint
    # while tracing, the feed-forward to its plain operations): the tangents
    # of the plain operations; traces that save and load and give the eager values
    import io

    import torch.autograd.forward_ad as fwAD
    from torch_mz.nn.blocks import FeedForward
    torch.manual_seed(1)
    proj = InputProjection(5, 8, num_generators=2).double()
    x = torch.randn(6, 5, dtype=torch.float64)
    t = torch.randn_like(x)

    def plain(x):
        return F.layer_norm(F.gelu(F.linear(x, proj.lin_c.weight, proj.lin_c.bias)), (8, ),
                            proj.norm.weight, proj.norm.bias, proj.norm.eps)
    with fwAD.dual_level():
        got = fwAD.unpack_dual(proj(fwAD.make_dual(x, t)).center).tangent
        expected = fwAD.unpack_dual(plain(fwAD.make_dual(x, t))).tangent
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)
    ff = FeedForward(8, 16).double()  # its own recomputing function steps aside the same way
    c = torch.randn(6, 8, dtype=torch.float64)
    with fwAD.dual_level():
        got = fwAD.unpack_dual(ff(fwAD.make_dual(c, t[:, :1].expand(6, 8)))).tangent
        expected = fwAD.unpack_dual(ff.lin2(F.gelu(ff.lin1(
            fwAD.make_dual(c, t[:, :1].expand(6, 8)))))).tangent
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)
    # tangents on the weights only (the LayerNorm's, the feed-forward's last layer)
    from torch.func import functional_call
    w_t = torch.randn_like(proj.norm.weight)
    with fwAD.dual_level():
        params = dict(proj.named_parameters())
        params['norm.weight'] = fwAD.make_dual(params['norm.weight'], w_t)
        got = fwAD.unpack_dual(functional_call(proj, params, (x, )).center).tangent
        expected = fwAD.unpack_dual(F.layer_norm(
            F.gelu(F.linear(x, proj.lin_c.weight, proj.lin_c.bias)), (8, ),
            params['norm.weight'], proj.norm.bias, proj.norm.eps)).tangent
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)
    c.requires_grad_()
    with fwAD.dual_level():
        params = dict(ff.named_parameters())
        params['lin2.weight'] = fwAD.make_dual(params['lin2.weight'],
                                               torch.randn_like(ff.lin2.weight))
        got = fwAD.unpack_dual(functional_call(ff, params, (c, ))).tangent
        expected = fwAD.unpack_dual(F.linear(F.gelu(ff.lin1(c)), params['lin2.weight'],
                                             ff.lin2.bias)).tangent
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)

    class Center(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = proj

        def forward(self, x):
            return self.proj(x).center
    traced = torch.jit.trace(Center(), (x.clone().requires_grad_(), ))
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    torch.testing.assert_close(loaded(x), proj(x).center, rtol=0, atol=0)
    traced_ff = torch.jit.trace(ff, (c, ))  # c requires gradients: the training branch
    torch.testing.assert_close(traced_ff(c), ff(c), rtol=0, atol=0)
