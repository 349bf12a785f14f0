r"""The compiled tanh of the generator feed-forward (torch_mz.nn.fused.OddTanhFused). The
LayerNorm-Jacobian kernels are tested with the zonotope LayerNorm (test_zonotope.py)."""
import warnings

import pytest
import torch

from torch_mz.nn import fused
from torch_mz.nn.blocks import GeneratorFeedForward

EPS32 = torch.finfo(torch.float32).eps


def _grid() -> torch.Tensor:
    r"""Float32 points across the whole range: a fine linear grid over [-12, 12] (beyond the
    clamp at 9 too) and magnitudes from 1e-30 to 10 on a log grid, both signs, and zero."""
    tiny = torch.logspace(-30, 1, 20001, dtype=torch.float64)
    return torch.cat([torch.linspace(-12, 12, 1_000_001, dtype=torch.float64), tiny, -tiny,
                      torch.zeros(1, dtype=torch.float64)]).float()


def test_rational_tanh_is_within_4_epsilons_of_tanh_odd_and_bounded():
    r"""The rational approximation evaluated in float32 is within a relative error of 4 float32
    epsilons of the exact tanh (float64), and within 6 units in the last place (the float32
    spacing at the exact value), everywhere on the grid; exactly odd, bit for bit; never beyond
    +-1; exactly +-1 far out and exactly 0 at 0."""
    x = _grid()
    y = fused._rational_tanh(x)
    ref = torch.tanh(x.double())
    err = (y.double() - ref).abs()
    nonzero = ref != 0
    assert float((err[nonzero] / ref[nonzero].abs()).max()) <= 4 * EPS32
    r32 = ref.float().abs()
    ulp = (torch.nextafter(r32, torch.full_like(r32, float('inf'))) - r32).double()
    assert float((err / ulp).max()) <= 6.0
    assert float(y[x == 0].abs().max()) == 0.0
    assert torch.equal(fused._rational_tanh(-x), -y)
    assert float(y.abs().max()) <= 1.0
    far = torch.tensor([9.5, 50.0, 1e30, float('inf')])
    assert torch.equal(fused._rational_tanh(far), torch.ones(4))
    assert torch.equal(fused._rational_tanh(-far), -torch.ones(4))
    # much closer than the float32 tolerance the fast paths are held to (1e-5)
    torch.testing.assert_close(y, torch.tanh(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_kernel_tanh_in_half_precision_is_as_accurate_as_atens_and_monotone(dtype):
    r"""In bfloat16 and float16 the kernel's function is within half a unit in the last place of
    the exact tanh (float64), as ATen's tanh in that dtype, monotone, exactly odd, and keeps
    NaN and +-inf as torch.tanh does (evaluated in the low dtype itself it was 3.6 units off and
    not monotone: bfloat16 gave 0.988 at 8.5 and 0.996 at 5)."""
    x = torch.linspace(0.0, 12.0, 100_001, dtype=torch.float64).to(dtype).unique()  # sorted
    y = fused._tanh_in_place(x.clone())
    ref = torch.tanh(x.double())
    r = ref.to(dtype)
    ulp = (torch.nextafter(r, torch.full_like(r, 2.0)) - r).double()
    assert float(((y.double() - ref).abs() / ulp).max()) <= 0.5 + 1e-3
    assert bool((y[1:] >= y[:-1]).all())
    assert torch.equal(fused._tanh_in_place(-x), -y)
    special = torch.tensor([float('nan'), float('inf'), -float('inf')], dtype=dtype)
    torch.testing.assert_close(fused._tanh_in_place(special.clone()), torch.tanh(special),
                               rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize('compiled', [
    False, pytest.param(True, marks=pytest.mark.slow)])  # compiling takes tens of seconds
def test_odd_tanh_kernel_values_gradients_and_second_derivatives(monkeypatch, compiled):
    r"""The kernel forced on: float64 runs torch.tanh (gradcheck and gradgradcheck pass; the
    backward is (1 - y^2) times the incoming gradient, from the saved output), float32 the
    rational function (values and gradients within 1e-6 of torch.tanh); in place on its input,
    as torch.tanh_. The default run checks the function that is compiled, uncompiled."""
    monkeypatch.setattr(fused, '_ENABLED', True)
    monkeypatch.setattr(fused, '_FAILED', False)
    if not compiled:
        monkeypatch.setattr(fused, '_compiled', lambda name, fn: fn)
    g = torch.Generator().manual_seed(0)
    x64 = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: fused.odd_tanh_(a * 1.0), (x64,))
    assert torch.autograd.gradgradcheck(lambda a: fused.odd_tanh_(a * 1.0), (x64,))
    torch.testing.assert_close(fused.odd_tanh_(x64.detach() * 1.0), torch.tanh(x64.detach()),
                               rtol=0, atol=0)

    x = (torch.randn(300, 7, generator=g) * 3).requires_grad_()
    h = x * 1.0
    y = fused.odd_tanh_(h)
    assert y.data_ptr() == h.data_ptr()  # in place
    torch.testing.assert_close(y, torch.tanh(x), rtol=1e-6, atol=1e-6)
    w = torch.randn(300, 7, generator=g)
    (grad,) = torch.autograd.grad((y * w).sum(), x)
    torch.testing.assert_close(grad, w * (1 - torch.tanh(x.detach()) ** 2), rtol=1e-5,
                               atol=1e-6)


def _auto_mode(monkeypatch, min_elements: int) -> list:
    r"""Auto mode from :obj:`min_elements` elements, compiling replaced by the uncompiled
    function; returns the list of the kernels' names as they are called."""
    calls: list = []
    monkeypatch.setattr(fused, '_ENABLED', None)
    monkeypatch.setattr(fused, '_FAILED', False)
    monkeypatch.setattr(fused, 'AUTO_MIN_ELEMENTS', min_elements)
    monkeypatch.setattr(fused, '_compiled', lambda name, fn: calls.append(name) or fn)
    monkeypatch.setattr(fused, '_TANH_FASTER', True)  # as if measured faster on this host
    return calls


def test_generator_feed_forward_takes_the_kernel_in_auto_mode_and_stays_odd(monkeypatch):
    r"""In auto mode the generator feed-forward takes the kernel for large CPU float32 inputs
    only; it agrees with torch.tanh's result to float32 rounding, and flipping the sign of a
    generator flips its image bit for bit (the zonotope is unchanged by the flip)."""
    calls = _auto_mode(monkeypatch, 1000)
    torch.manual_seed(0)
    ffn = GeneratorFeedForward(8, 16)
    gens = torch.randn(40, 3, 8) * 2
    out = ffn(gens)  # 40 * 3 * 16 hidden elements: the kernel
    assert calls == ['tanh_in_place']
    ref = torch.tanh(gens @ ffn.lin1.weight.T) @ ffn.lin2.weight.T
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(ffn(-gens), -out)
    flipped = gens.clone()
    flipped[:, 1] = -flipped[:, 1]
    out_flipped = ffn(flipped)
    assert torch.equal(out_flipped[:, 1], -out[:, 1])
    assert torch.equal(out_flipped[:, [0, 2]], out[:, [0, 2]])
    assert calls == ['tanh_in_place'] * 3
    ffn(gens[:5])  # 240 hidden elements: torch.tanh_
    ffn.double()(gens.double())  # float64: torch.tanh_
    assert calls == ['tanh_in_place'] * 3


def test_forward_mode_ad_runs_the_eager_functions(monkeypatch):
    r"""Dual tensors (torch.autograd.forward_ad) take the eager functions in auto mode, whose
    forward derivatives torch has: the Jacobian-vector product of the generator feed-forward
    agrees with the reverse-mode one."""
    from torch.autograd import forward_ad as fwAD
    calls = _auto_mode(monkeypatch, 100)
    torch.manual_seed(1)
    ffn = GeneratorFeedForward(6, 12)
    gens, tangent = torch.randn(10, 2, 6), torch.randn(10, 2, 6)
    with fwAD.dual_level():
        out = fwAD.unpack_dual(ffn(fwAD.make_dual(gens, tangent)))
    assert calls == []
    torch.testing.assert_close(out.primal, ffn(gens))
    _, jvp = torch.autograd.functional.jvp(ffn, gens, tangent)
    torch.testing.assert_close(out.tangent, jvp)


def test_auto_mode_takes_the_tanh_kernel_only_where_measured_faster(monkeypatch):
    r"""Auto mode measures the two tanh functions once per process, at the first call that
    would take the kernel, and runs the kernel only where it was the faster: measured slower,
    the generator feed-forward runs torch.tanh_ (no kernel call; the LayerNorm kernels do not
    depend on it); mode on runs the kernel whatever was measured; the result agrees with
    torch.tanh either way and stays exactly odd."""
    calls = _auto_mode(monkeypatch, 1000)
    monkeypatch.setattr(fused, '_TANH_FASTER', None)  # not yet measured in this "process"
    measured: list = []

    def slower(row_shape):
        measured.append(row_shape)
        return False
    monkeypatch.setattr(fused, '_measure_tanh', slower)
    torch.manual_seed(0)
    ffn = GeneratorFeedForward(8, 16)
    gens = torch.randn(40, 3, 8) * 2
    assert fused.tanh_kernel_faster() is None
    out = ffn(gens)
    ffn(gens)
    assert measured == [(3, 16)]  # once, on the caller's row shape
    assert fused.tanh_kernel_faster() is False
    assert calls == []  # ATen's tanh
    torch.testing.assert_close(out, torch.tanh(gens @ ffn.lin1.weight.T) @ ffn.lin2.weight.T,
                               rtol=1e-5, atol=1e-6)
    assert torch.equal(ffn(-gens), -out)
    ffn(gens[:5])  # below the auto range: not measured again
    assert measured == [(3, 16)]
    monkeypatch.setattr(fused, '_ENABLED', True)  # mode on: the kernel, whatever was measured
    ffn(gens)
    assert calls == ['tanh_in_place']
    assert measured == [(3, 16)]


def test_tanh_measurement_times_both_on_the_row_shape(monkeypatch):
    r"""The host measurement itself: it compiles (here: returns) the kernel for a float32 CPU
    buffer of rows of the caller's row shape, whatever the default dtype, times it against
    torch.tanh_ in alternation and takes the kernel only where its fastest call took at most
    TANH_MARGIN of ATen's; the global random state is the same after it; where compiling
    fails, then or before, it answers no. A fake clock: each function call advances it by its
    cost."""
    probes: list = []
    now = [0.0]
    cost = {'kernel': 1.0, 'aten': 3.0}

    def compiled(name, fn):
        def timed_kernel(b):
            probes.append((tuple(b.shape), b.dtype, b.device.type))
            now[0] += cost['kernel']
            return fn(b)
        return timed_kernel

    aten_tanh_ = torch.tanh_

    def timed_aten(b):
        now[0] += cost['aten']
        return aten_tanh_(b)

    _auto_mode(monkeypatch, 1000)
    monkeypatch.setattr(fused, '_compiled', compiled)
    monkeypatch.setattr(fused, '_clock', lambda: now[0])
    monkeypatch.setattr(torch, 'tanh_', timed_aten)
    monkeypatch.setattr(fused, 'TANH_PROBE_ELEMENTS', 2 ** 12)
    state = torch.get_rng_state()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert fused._measure_tanh((5, 7)) is True  # 1 <= 0.8 * 3
    finally:
        torch.set_default_dtype(default)
    # the untimed first call, then three timed: rows of the row shape, float32 on the CPU
    assert probes == [((2 ** 12 // 35, 5, 7), torch.float32, 'cpu')] * 4
    assert torch.equal(torch.get_rng_state(), state)
    cost.update(kernel=3.0, aten=1.0)  # the other way round: ATen's
    assert fused._measure_tanh((5, 7)) is False
    cost.update(kernel=1.0, aten=1.0)
    assert fused._measure_tanh((5, 7)) is False  # a tie goes to ATen's at the margin of 0.8
    monkeypatch.setattr(fused, 'TANH_MARGIN', 1.0)
    assert fused._measure_tanh((5, 7)) is True

    def failing(name, fn):
        raise RuntimeError('no compiler')
    monkeypatch.setattr(fused, '_compiled', failing)
    with pytest.warns(RuntimeWarning, match='compiling the fused kernels failed'):
        assert fused._measure_tanh((5, 7)) is False  # the failure in the measurement itself
    assert fused._FAILED
    assert fused._measure_tanh((5, 7)) is False  # and after it


def test_the_tanh_choice_can_be_fixed(monkeypatch):
    r"""set_tanh_kernel fixes auto mode's tanh without a measurement (and None measures
    again); the environment variable TORCH_MZ_TANH_KERNEL fixes it at import."""
    import subprocess
    import sys
    from torch_mz.nn import set_tanh_kernel, tanh_kernel_faster
    calls = _auto_mode(monkeypatch, 1000)
    monkeypatch.setattr(fused, '_measure_tanh', lambda row_shape: pytest.fail('measured'))
    ffn = GeneratorFeedForward(8, 16)
    gens = torch.randn(40, 3, 8)
    set_tanh_kernel(False)
    ffn(gens)
    assert calls == [] and tanh_kernel_faster() is False
    set_tanh_kernel(True)
    ffn(gens)
    assert calls == ['tanh_in_place'] and tanh_kernel_faster() is True
    set_tanh_kernel(None)
    assert tanh_kernel_faster() is None
    code = 'from torch_mz.nn import tanh_kernel_faster; print(tanh_kernel_faster())'
    for value, expected in (('0', 'False'), ('1', 'True'), ('auto', 'None')):
        out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                             env={**__import__('os').environ, 'TORCH_MZ_TANH_KERNEL': value})
        assert out.stdout.strip().splitlines()[-1] == expected, out.stderr


def test_an_error_of_the_input_leaves_the_kernels_on(monkeypatch):
    # any exception in a compiled call had switched the kernels off for the process, with a
    # "compiling failed" warning, and set_fused_kernels(True) did not switch them on again
    monkeypatch.setattr(fused, '_FAILED', False)
    monkeypatch.setattr(fused, '_ENABLED', True)
    monkeypatch.setattr(fused, '_compiled', lambda name, fn: fn)  # (the formula, uncompiled)

    def formula(x):
        raise ValueError('a bad input')  # raised by the eager function too: the caller's

    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with pytest.raises(ValueError, match='a bad input'):
            fused._run('layer_norm_jacobian', formula, torch.randn(4, 8))
    assert not fused._FAILED and fused.fused_kernels_enabled()

    def failing(name, fn):
        raise RuntimeError('no compiler')

    monkeypatch.setattr(fused, '_compiled', failing)
    with pytest.warns(RuntimeWarning, match='compiling the fused kernels failed'):
        out = fused._run('layer_norm_jacobian', lambda x: x + 1, torch.zeros(2))
    assert out.tolist() == [1.0, 1.0]  # the eager function's result
    assert fused._FAILED and not fused.fused_kernels_enabled()
    assert fused.tanh_kernel_in_use() is False  # (ATen's tanh runs, as checkpoints record)
    fused.set_fused_kernels(True)  # tries again
    assert not fused._FAILED and fused.fused_kernels_enabled()


def test_the_compile_limit_setting_is_named_as_this_torch_names_it():
    # torch 2.5 and 2.6 (setup.cfg's floor is 2.5) call it cache_size_limit: patching
    # recompile_limit there raised a KeyError that switched the kernels off
    import types
    assert fused._limit_setting(types.SimpleNamespace(cache_size_limit=8)) == 'cache_size_limit'
    assert fused._limit_setting(types.SimpleNamespace(recompile_limit=8,
                                                      cache_size_limit=8)) == 'recompile_limit'
    name = fused._limit_setting(torch._dynamo.config)
    with torch._dynamo.config.patch(**{name: fused.RECOMPILE_LIMIT}):
        assert getattr(torch._dynamo.config, name) == fused.RECOMPILE_LIMIT


def test_set_fused_kernels_called_without_an_argument_does_what_its_docstring_says(
        monkeypatch):
    # the docstring read ":obj:`None` auto, the default", but the argument defaults to True:
    # set_fused_kernels() turns the kernels on for every input, it does not return to auto
    import inspect
    monkeypatch.setattr(fused, '_ENABLED', None)
    monkeypatch.setattr(fused, '_FAILED', False)
    fused.set_fused_kernels()
    assert fused.fused_kernels_mode() is True
    assert inspect.signature(fused.set_fused_kernels).parameters['enabled'].default is True
    doc = ' '.join(fused.set_fused_kernels.__doc__.split())
    assert ':obj:`None` auto, the default' not in doc
    assert '(default: :obj:`True`: ``set_fused_kernels()`` turns the kernels on' in doc
