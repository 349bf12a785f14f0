r"""Compiled kernels for the per-token generator work.

On a CPU core the MZ models' time goes into passes over the :math:`(N, n_g, d)` generators, and
eager PyTorch makes one pass per operator. Two maps run as compiled kernels: the tanh of the
generator feed-forward (:class:`OddTanhFused`) and the LayerNorm Jacobian on generators
(:class:`LayerNormJacobianFused`; :class:`LayerNormJacobianSumFused` for the LayerNorm of a
residual sum, which forms the sum inside the kernels). :func:`torch.compile` fuses the LayerNorm Jacobian on
generators (:func:`~torch_mz.nn.zonotope.zonotope_layer_norm`) into about two passes forward and
two backward. Measured on one core (each function alone, ``python benchmarks/kernels.py
--repeats 11``, 2026-12-04, the training processes paused, ``benchmarks/results/kernels/``),
:math:`N = 32768, n_g = 8, d = 64`, float32: forward 48 ms and forward + backward 80 ms (medians;
the calls 64-90 ms, and 62 ms in the run before) against 121 ms and 354 ms for the hand-written
eager function. Whole models gain less: the ``mz``
training step on 32 clouds of 1,024 points 2.45 s against 3.07 s eager, inference 0.84 s against
1.11 s, with kept freed memory (``python benchmarks/training_step.py``, rows ``mz+keep`` and
``mz+eager+keep`` of ``benchmarks/results/training_step/``; each row in its own process: the
two alternating in one process, a throwaway script, gave 1.86-1.97 s against 2.24-2.52 s and
0.71-0.84 s against 0.74-0.91 s); in message passing
(``benchmarks/message_passing.py``) the neighbourhood aggregation 0.69-1.04x the eager time
(every size dynamic), 0.86-0.92x with the kernels compiled per width (``message_passing_kernels``).

Three modes, set by :func:`set_fused_kernels` or the environment variable
``TORCH_MZ_FUSED_KERNELS``:

* **auto** (the default; ``set_fused_kernels(None)``, the variable unset, empty or ``auto``): the
  compiled kernels run on CPU float32 generators of at least :data:`AUTO_MIN_ELEMENTS` elements,
  where a call takes tens of milliseconds eagerly; the tanh kernel only where it was measured
  faster than ATen's tanh on this host (:func:`tanh_kernel_faster`: once per process, at the
  first such call); compiling takes a few seconds, once per
  process (the first such call; it needs a C++ compiler), which a training loop or a large
  message-passing workload repays. Small inputs (sets of a few tokens, the test suite), other
  dtypes and devices, code under ``torch.compile`` (which fuses on its own), ``torch.func``
  transforms, forward-mode AD (dual tensors) and dispatch modes run the eager function. The
  choice depends on the input alone (and, for the tanh, on the host measurement made once
  before the process's first such call, which ``TORCH_MZ_TANH_KERNEL=1`` or ``0`` or
  :func:`set_tanh_kernel` fixes instead), never on earlier calls, so a checkpointed block
  recomputes with the function it ran (a choice by call count once switched between a forward
  pass and its recomputation, which :func:`torch.utils.checkpoint.checkpoint` refuses), and
  seeded runs stay reproducible (across processes, fix the tanh's choice for bitwise equal
  results: a measurement near its margin may choose either); the two functions agree up to
  float rounding.
* **on** (``set_fused_kernels(True)``, ``TORCH_MZ_FUSED_KERNELS=1``): compiled for every input
  (also CUDA, through Triton, not measured here).
* **off** (``set_fused_kernels(False)``, ``TORCH_MZ_FUSED_KERNELS=0``): the eager function.

If compiling fails, a warning says why and nothing is compiled from then on: the tanh is
ATen's, and the LayerNorm Jacobian keeps the kernels' functions, their formulas uncompiled, so
that a checkpointed block recomputes with the function its forward pass ran (the hand-written
one keeps other tensors for the backward pass: a failure between a forward pass and its
recomputation had made the backward pass fail with a ``CheckpointError``). Both compute the
same map; the tests check values and first and second derivatives against the autograd
reference in float64. A second derivative (``create_graph=True``) runs the backward formula
uncompiled, so that autograd can differentiate it.
"""
import math
import os
import time
import warnings
from typing import Any, Callable, Dict, Optional, Sequence

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from torch_mz._checks import check_flag
from torch_mz.nn._context import _plain_ops



def _mode_from_environment(name: str = 'TORCH_MZ_FUSED_KERNELS') -> Optional[bool]:
    value = os.environ.get(name)
    if value is None or value.strip().lower() in ('', 'auto'):  # (empty: as unset)
        return None
    if value.strip().lower() in ('0', 'false', 'off', 'no'):
        return False
    if value.strip().lower() in ('1', 'true', 'on', 'yes'):
        return True
    raise ValueError(f"{name} must be 'auto' (or empty), '1' (true, on, yes) or '0' (false, "
                     f"off, no) (got {value!r})")


def _mode(name: str, value: Optional[bool]) -> Optional[bool]:
    # True, False or None; text such as 'false' was read as on
    return None if value is None else check_flag(name, value)


# True: always, False: never, None: auto (large CPU float32 inputs)
_ENABLED: Optional[bool] = _mode_from_environment()
_COMPILED: Dict[str, Callable] = {}
_FAILED = False
#: auto mode: the tanh kernel runs only where its measured time on this host was at most this
#: fraction of ATen's (:func:`tanh_kernel_faster`; a near tie goes to ATen's tanh, the more
#: accurate of the two: within 1 ulp against 6)
TANH_MARGIN = 0.8
#: elements of the float32 buffer (16 MiB) on which that measurement times the two
TANH_PROBE_ELEMENTS = 2 ** 22
# that measurement, once per process; TORCH_MZ_TANH_KERNEL=1 or 0 (or set_tanh_kernel) fixes it
_TANH_FASTER: Optional[bool] = _mode_from_environment('TORCH_MZ_TANH_KERNEL')
_clock = time.perf_counter
#: auto mode: the fewest generator elements (N n_g d) that use the compiled kernels (2^20: e.g.
#: a batch of 128 sets of 16 tokens with 8 generators of width 64, or 32,768 edges of a
#: message-passing layer with 2 generators of width 16)
AUTO_MIN_ELEMENTS = 2 ** 20


def set_fused_kernels(enabled: Optional[bool] = True) -> None:
    r"""Compiled (fused) kernels for the LayerNorm Jacobian on generators and the generator
    feed-forward's tanh: :obj:`True` always, :obj:`False` never, :obj:`None` auto (see the
    module docstring), the mode a process starts in unless ``TORCH_MZ_FUSED_KERNELS`` says
    otherwise.

    Args:
        enabled (bool, optional): The mode. (default: :obj:`True`: ``set_fused_kernels()``
            turns the kernels on; ``set_fused_kernels(None)`` returns to auto)
    """
    global _ENABLED, _FAILED
    _ENABLED = _mode('enabled', enabled)
    _FAILED = False  # (compiling is tried again)


def fused_kernels_mode() -> Optional[bool]:
    r"""The mode :func:`set_fused_kernels` set: :obj:`True`, :obj:`False` or :obj:`None` (auto),
    so that a caller can restore it."""
    return _ENABLED


def fused_kernels_enabled() -> bool:
    r"""Whether the compiled kernels are on for every input (mode on, and they have not failed
    to compile)."""
    return _ENABLED is True and not _FAILED


def _functorch_wrapped(t: Tensor) -> bool:
    try:
        return torch._C._functorch.is_functorch_wrapped_tensor(t)
    except AttributeError:  # pragma: no cover (older torch)
        return False


def use_fused_kernels(gens: Tensor) -> bool:
    r"""Whether :func:`~torch_mz.nn.zonotope.zonotope_layer_norm` maps these generators (and
    :func:`odd_tanh_` this hidden layer) with the compiled kernels (the mode, and in auto mode
    the input; not once compiling has failed)."""
    return not _FAILED and _kernels_requested(gens)


def _kernels_requested(gens: Tensor) -> bool:
    r"""Whether the mode and the input ask for the kernels (:func:`use_fused_kernels`, whether or
    not compiling has failed): the choice of :func:`~torch_mz.nn.zonotope.zonotope_layer_norm`
    between the kernels' functions and the hand-written one, which keep different tensors for
    the backward pass, so that a checkpointed block recomputes with the function its forward
    pass ran also where compiling failed in between (after a failure the kernels' functions
    run their formulas uncompiled)."""
    if _ENABLED is False:
        return False
    # forward-mode AD (a dual level open: any tensor may carry a tangent) and torch.func
    # transforms take neither function, in any mode: the eager formula (torch differentiates it)
    if _plain_ops():
        return False
    if _ENABLED:
        return True
    return (gens.device.type == 'cpu' and gens.dtype == torch.float32
            and gens.numel() >= AUTO_MIN_ELEMENTS and not torch.compiler.is_compiling()
            and _get_current_dispatch_mode() is None and not _functorch_wrapped(gens))


def _ln_jacobian_forward(c: Tensor, g: Tensor, weight: Tensor, eps: float) -> Tensor:
    xc = c - c.mean(dim=-1, keepdim=True)  # (N, d)
    inv = torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + eps)  # (N, 1)
    c_hat = (xc * inv).unsqueeze(1)  # (N, 1, d)
    g_bar = g.mean(dim=-1, keepdim=True)  # (N, n_g, 1)
    p = ((g - g_bar) * c_hat).mean(dim=-1, keepdim=True)  # (N, n_g, 1)
    return (inv * weight).unsqueeze(1) * (g - g_bar - c_hat * p)  # (N, n_g, d)


def _ln_jacobian_backward(grad_out: Tensor, c: Tensor, g: Tensor, weight: Tensor, eps: float):
    d = c.size(-1)
    xc = c - c.mean(dim=-1, keepdim=True)  # (N, d)
    inv = torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + eps)  # (N, 1)
    c_hat = (xc * inv).unsqueeze(1)  # (N, 1, d)
    a = c_hat.mean(dim=-1, keepdim=True)  # (N, 1, 1), zero up to rounding
    g_bar = g.mean(dim=-1, keepdim=True)  # (N, n_g, 1)
    p = ((g - g_bar) * c_hat).mean(dim=-1, keepdim=True)  # (N, n_g, 1)
    r = grad_out * (inv * weight).unsqueeze(1)  # (N, n_g, d), dL/du
    r_bar = r.mean(dim=-1, keepdim=True)  # (N, n_g, 1)
    q = (r * c_hat).mean(dim=-1, keepdim=True)  # (N, n_g, 1)
    grad_g = r - r_bar - (c_hat - a) * q  # (N, n_g, d)
    grad_c_hat = -((r * p).sum(1) + (g * q).sum(1) - (q * g_bar).sum(1))  # (N, d)
    grad_s = (grad_out * (g - g_bar - c_hat * p)).sum(1)  # (N, d)
    grad_inv = (grad_s * weight).sum(dim=-1, keepdim=True)  # (N, 1)
    grad_w = (grad_s * inv).sum(0)  # (d,)
    lam = (grad_c_hat * xc).sum(dim=-1, keepdim=True) + grad_inv  # (N, 1)
    grad_c = (inv * (grad_c_hat - grad_c_hat.mean(dim=-1, keepdim=True))
              - inv.pow(3) * lam * xc / d)  # (N, d)
    return grad_c, grad_g, grad_w


#: Kernels compiled for each width: every size static but the first (token) dimension of their
#: tensor arguments of two or more dimensions, which is marked dynamic. Knowing :math:`n_g` and
#: :math:`d`, the compiler vectorises the LayerNorm Jacobian's reductions over the features:
#: measured on one core with nothing else running (:math:`N = 32768, n_g = 8, d = 64`, the two
#: compiled forms alternating, medians of 9, two processes), forward 10.1-13.4 ms and backward
#: 34.7-47.2 ms against 17.5-25.4 and 44.2-57.7 ms with every size dynamic; the tanh kernel on
#: the :math:`(32768, 8, 64)` hidden layer 10.1 against 12.2 ms. In message passing (the default
#: aggregation, :math:`n_g = 2`, ``SAGEConv`` forward + backward on 10^4 nodes and 10^5 Poisson
#: edges, one run, ``benchmarks/results/message_passing_kernels``) 606 against 706 ms eager at
#: :math:`d = 16` and 2,545 against 2,777 ms at :math:`d = 64`. Each
#: generator budget and width compiles its own graphs (once); token counts of 0 and 1 are
#: specialised by the compiler. In the ``mz`` preset's training step on 32 clouds of 1,024
#: points (measured with the LayerNorm kernels static and the tanh dynamic; the tanh was made
#: static after this measurement): 1.82-2.12 s against 2.24-2.48 s, inference
#: 0.60-0.69 against 0.67-0.77 s (fresh processes alternating, three rounds, medians of 5 calls).
STATIC_WIDTHS = ('ln_forward', 'ln_backward', 'ln_sum_forward', 'ln_sum_backward',
                 'tanh_in_place')


def _ln_jacobian_sum_forward(c: Tensor, g1: Tensor, g2: Tensor, weight: Tensor,
                             eps: float) -> Tensor:
    return _ln_jacobian_forward(c, g1 + g2, weight, eps)  # the sum fused into the kernel


def _ln_jacobian_sum_backward(grad_out: Tensor, c: Tensor, g1: Tensor, g2: Tensor,
                              weight: Tensor, eps: float):
    return _ln_jacobian_backward(grad_out, c, g1 + g2, weight, eps)


def _compiled(name: str, fn):
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=name not in STATIC_WIDTHS)
    return _COMPILED[name]


# Token counts, generator budgets and widths differ between blocks and models: each new range
# compiles a graph (once), so the compile cache may hold more than dynamo's default of 8.
RECOMPILE_LIMIT = 64


def _limit_setting(config: Any) -> str:
    r"""The name of dynamo's setting of how many graphs one function may compile:
    ``recompile_limit`` since torch 2.7, ``cache_size_limit`` in torch 2.5 and 2.6 (setup.cfg's
    floor), where patching the new name raised a :class:`KeyError` that switched the kernels
    off as if compiling had failed."""
    return 'recompile_limit' if hasattr(config, 'recompile_limit') else 'cache_size_limit'


def _run(name: str, fn, *args):
    global _FAILED
    # Under an outer torch.compile the formula is traced into the caller's graph (which fuses
    # it on its own); the kernels' compiled graphs and their dynamic-size marks are for eager
    # callers (the mode 'on' reaches here under compile too).
    if torch.compiler.is_compiling():
        return fn(*args)
    # Under a dispatch mode (FlopCounterMode, a profiler's counters) dynamo cannot use the
    # compiled graphs and calling them there leaves them unusable afterwards (measured: 4x slower
    # for the rest of the process): the eager formula runs instead.
    if not _FAILED and _get_current_dispatch_mode() is None:
        try:
            # detached inputs: the graphs do not depend on whether the caller tracks gradients
            detached = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)
            if name in STATIC_WIDTHS:  # the token count varies from call to call
                for a in detached:
                    if isinstance(a, Tensor) and a.dim() >= 2:
                        torch._dynamo.maybe_mark_dynamic(a, 0)
            limit = {_limit_setting(torch._dynamo.config): RECOMPILE_LIMIT}
            with torch._dynamo.config.patch(limit):
                return _compiled(name, fn)(*detached)
        except Exception as err:  # no compiler, unsupported device: fall back, say so once
            # an error of the input itself (or one the eager function meets too, such as running
            # out of memory) is the caller's: the eager function raises it, and the kernels stay
            out = fn(*args)
            _FAILED = True
            warnings.warn(f"torch_mz: compiling the fused kernels failed ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}); running their formulas "
                          f"uncompiled (TORCH_MZ_FUSED_KERNELS=0 does not try; "
                          f"set_fused_kernels tries again)", RuntimeWarning)
            return out
    return fn(*args)


# tanh(x) ~ x P(x^2) / Q(x^2) on [-9, 9] (clamped outside, where float32 tanh is +-1): a
# rational function fitted to relative error (Sanathanan-Koerner iterations in float64, degrees
# 5 and 3 in x^2), within a relative error of 4 float32 epsilons (6 units in the last place)
# of tanh (tests/nn/test_fused.py checks both on a fine grid) and exactly odd: x^2 is the same
# for x and -x, the clamps symmetric.
_TANH_CLAMP = 9.0
_TANH_P = (0.9999999748137831, 0.12933943275877616, 0.002936400642897618,
           9.406456623830113e-06, -1.3182327703547462e-08, 1.924230804230113e-11)
_TANH_Q = (1.0, 0.4626725051235826, 0.02382768045054745, 0.00023023734941106196)


def _rational_tanh(x: Tensor) -> Tensor:
    x = x.clamp(-_TANH_CLAMP, _TANH_CLAMP)
    z = x * x
    p = z * _TANH_P[-1] + _TANH_P[-2]
    for coef in _TANH_P[-3::-1]:
        p = p * z + coef
    q = z * _TANH_Q[-1] + _TANH_Q[-2]
    for coef in _TANH_Q[-3::-1]:
        q = q * z + coef
    return (x * p / q).clamp(-1.0, 1.0)


def _tanh_in_place(h: Tensor) -> Tensor:
    if h.dtype == torch.float64:  # the rational function is float32-accurate only
        return h.tanh_()
    if h.dtype != torch.float32:
        # evaluated in float16 or bfloat16 its rounding errors reached 3.6 units in the last
        # place (ATen's tanh: 0.5) and broke monotonicity (bfloat16: 0.988 at 8.5, 0.996 at 5);
        # in float32 and rounded once, within ATen's accuracy in these dtypes
        return h.copy_(_rational_tanh(h.float()))
    return h.copy_(_rational_tanh(h))


class OddTanhFused(torch.autograd.Function):
    r""":math:`\tanh` in place on the generator feed-forward's hidden layer
    (:meth:`~torch_mz.nn.blocks.GeneratorFeedForward.hidden`), as one compiled pass.

    ATen's vectorised float32 :math:`\tanh` was slow on the CPU of 2026-12-04: on one core, on
    the :math:`(32768 \cdot 8, 64)` hidden layer of the ``mz`` preset (32 clouds of 1,024
    points), 53 ms, against 29 ms for :func:`torch.tanh` compiled and 10 ms for this kernel
    (``python benchmarks/kernels.py --repeats 11``: the three alternating, medians, each less the
    5.4 ms copy of the input every call makes first; ``benchmarks/results/kernels/``). Hosts
    differ: on that of 2026-12-05 ATen's took 10 ms and this kernel 32 ms
    (``benchmarks/results/kernels_20261205``), so auto mode measures the two once per process
    (:func:`tanh_kernel_faster`). For float32 (and lower precisions, evaluated in float32 and
    rounded once) the kernel evaluates a rational approximation :math:`x P(x^2) / Q(x^2)` on
    :math:`[-9, 9]` (clamped beyond, where float32 :math:`\tanh` rounds to :math:`\pm 1`),
    within a relative error of 4 float32 epsilons of :math:`\tanh` (at most 6 units in the last
    place; ATen's is within 1) and exactly odd, so a generator's sign flip still flips its
    image bit for bit; float64 runs :func:`torch.tanh`. The backward pass is
    :math:`(1 - y^2)\,\bar{y}` from the saved output, differentiable (second derivatives)."""
    @staticmethod
    def forward(ctx, h: Tensor) -> Tensor:
        _run('tanh_in_place', _tanh_in_place, h)
        ctx.mark_dirty(h)
        ctx.save_for_backward(h)
        return h

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        y, = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad_out, y)


def odd_tanh_(h: Tensor) -> Tensor:
    r""":math:`\tanh` of :obj:`h` in place: the compiled kernel of :class:`OddTanhFused` where
    :func:`use_fused_kernels` says so (in auto mode, only where :func:`tanh_kernel_faster`
    measured it faster on this host), :func:`torch.tanh_` otherwise."""
    if use_fused_kernels(h) and (_ENABLED is True or _tanh_kernel_pays(h.shape[1:])):
        return OddTanhFused.apply(h)
    return torch.tanh_(h)


def tanh_kernel_faster() -> Optional[bool]:
    r"""Whether auto mode runs the compiled tanh (:class:`OddTanhFused`) on this host: the
    measurement made once per process, at the first call of :func:`odd_tanh_` that would take
    the kernel (:obj:`None` before it). The two tanh functions' speeds differ by host, and
    either way round: on one core of the host these figures come from, the kernel took 10 ms
    against ATen's 53 ms on the ``mz`` preset's hidden layer of 32 clouds of 1,024 points
    (``benchmarks/results/kernels``, 2026-12-04), and 32 ms against 10 ms on the host of
    2026-12-05 (``benchmarks/results/kernels_20261205``), each less the copy of its input.
    The measurement times each on one float32 CPU buffer of about :data:`TANH_PROBE_ELEMENTS`
    elements in rows of the caller's row shape (at least two rows), three times in
    alternation, and takes the kernel where its fastest call took at most :data:`TANH_MARGIN`
    times ATen's (0.15 s on one core of the host of 2026-12-05 once the kernel's graph for
    that row shape is compiled; compiling it, which the call would do anyway, takes seconds
    more in a fresh process without the compiler's cache). The two agree to
    within 4 float32 epsilons of relative error, so the choice changes results by float
    rounding only; both are exactly odd. A choice made
    with :func:`set_tanh_kernel` or the environment variable ``TORCH_MZ_TANH_KERNEL`` (``1``:
    the kernel, ``0``: ATen's, read at import) is returned as it is, and nothing is
    measured."""
    return _TANH_FASTER


def set_tanh_kernel(faster: Optional[bool]) -> None:
    r"""Fix auto mode's tanh: :obj:`True` the compiled kernel, :obj:`False` ATen's, instead of
    the measurement of :func:`tanh_kernel_faster` (for results equal bit for bit across
    processes); :obj:`None` measures again at the next large call. Mode on
    (:func:`set_fused_kernels`) runs the kernel whatever is set here."""
    global _TANH_FASTER
    _TANH_FASTER = _mode('faster', faster)


def tanh_kernel_in_use() -> Optional[bool]:
    r"""The generator feed-forward's tanh of this process, as a checkpoint records it: the
    compiled kernel (:obj:`True`) with the fused kernels on, ATen's (:obj:`False`) with them
    off or after compiling failed, and in auto mode :func:`tanh_kernel_faster`'s choice
    (:obj:`None`: not chosen yet)."""
    if _FAILED:
        return False
    return _ENABLED if _ENABLED is not None else _TANH_FASTER


def _tanh_kernel_pays(row_shape: Sequence[int]) -> bool:
    global _TANH_FASTER
    if _TANH_FASTER is None:
        _TANH_FASTER = _measure_tanh(tuple(int(s) for s in row_shape))
    return _TANH_FASTER


def _measure_tanh(row_shape: tuple) -> bool:
    r"""Whether the compiled tanh is faster than ATen's here (see :func:`tanh_kernel_faster`):
    both in place on a copy of one float32 CPU buffer of rows of :obj:`row_shape`, filled with
    values spread evenly over [-6, 6] (pre-activations of the hidden layer; no random draw, so
    the random state is untouched and the fill costs one pass). Auto mode reaches here for CPU
    float32 inputs only, whatever the default dtype and device."""
    rows = max(2, TANH_PROBE_ELEMENTS // max(1, math.prod(row_shape)))
    x = torch.linspace(-6.0, 6.0, rows * max(1, math.prod(row_shape)), dtype=torch.float32,
                       device='cpu').view((rows, ) + row_shape)
    buf = torch.empty_like(x)

    def kernel(b: Tensor) -> None:
        _run('tanh_in_place', _tanh_in_place, b)

    best = {kernel: math.inf, torch.tanh_: math.inf}
    with torch.no_grad():
        kernel(buf.copy_(x))  # compiles this row shape's graph (the caller's next call uses it)
        if _FAILED:  # compiling failed: the eager function runs from now on anyway
            return False
        for _ in range(3):
            for fn in best:
                buf.copy_(x)
                start = _clock()
                fn(buf)
                best[fn] = min(best[fn], _clock() - start)
    return best[kernel] <= TANH_MARGIN * best[torch.tanh_]


class LayerNormJacobianFused(torch.autograd.Function):
    r"""The generator map of :func:`~torch_mz.nn.zonotope.zonotope_layer_norm` with compiled
    forward and backward (recomputing the per-token statistics in the backward instead of
    saving them)."""
    @staticmethod
    def forward(ctx, c: Tensor, g: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
        w = weight if weight is not None else c.new_ones(c.size(-1))
        ctx.save_for_backward(c, g, w)
        ctx.eps = eps
        ctx.has_weight = weight is not None
        return _run('ln_forward', _ln_jacobian_forward, c, g, w, eps)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        c, g, w = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the formula uncompiled, differentiable
            grad_c, grad_g, grad_w = _ln_jacobian_backward(grad_out, c, g, w, ctx.eps)
        else:
            grad_c, grad_g, grad_w = _run('ln_backward', _ln_jacobian_backward,
                                          grad_out.contiguous(), c, g, w, ctx.eps)
        return (grad_c if ctx.needs_input_grad[0] else None, grad_g,
                grad_w if ctx.has_weight and ctx.needs_input_grad[2] else None, None)


class LayerNormJacobianSumFused(torch.autograd.Function):
    r""":class:`LayerNormJacobianFused` of the sum of two generator tensors (a residual
    connection, :math:`G_1 + G_2`), the sum computed inside the compiled kernels, forward and
    backward, instead of written out and read back: one pass over the generators fewer each
    way, and no generator-sized allocation for the sum. The sum is the same float addition; the
    map of it agrees with that of the written-out sum up to float rounding (another compiled
    graph); both summands receive its gradient."""
    @staticmethod
    def forward(ctx, c: Tensor, g1: Tensor, g2: Tensor, weight: Optional[Tensor],
                eps: float) -> Tensor:
        w = weight if weight is not None else c.new_ones(c.size(-1))
        ctx.save_for_backward(c, g1, g2, w)
        ctx.eps = eps
        ctx.has_weight = weight is not None
        return _run('ln_sum_forward', _ln_jacobian_sum_forward, c, g1, g2, w, eps)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        c, g1, g2, w = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the formula uncompiled, differentiable
            grad_c, grad_g, grad_w = _ln_jacobian_backward(grad_out, c, g1 + g2, w, ctx.eps)
        else:
            grad_c, grad_g, grad_w = _run('ln_sum_backward', _ln_jacobian_sum_backward,
                                          grad_out.contiguous(), c, g1, g2, w, ctx.eps)
        return (grad_c if ctx.needs_input_grad[0] else None,
                grad_g if ctx.needs_input_grad[1] else None,
                grad_g if ctx.needs_input_grad[2] else None,
                grad_w if ctx.has_weight and ctx.needs_input_grad[3] else None, None)
