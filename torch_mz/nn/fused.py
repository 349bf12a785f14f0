r"""Compiled kernels for the per-token generator work (opt-in).

On a CPU core the MZ models' time goes into passes over the :math:`(N, n_g, d)` generators, and
eager PyTorch makes one pass per operator. :func:`torch.compile` fuses the LayerNorm Jacobian on
generators (:func:`~torch_mz.nn.zonotope.zonotope_layer_norm`) into about two passes forward and
two backward. Measured on one core (the function alone, a throwaway script, nothing else
running), :math:`N = 32768, n_g = 8, d = 64`, float32: forward 47 ms and backward 49 ms against
95 ms and about 215 ms for the hand-written eager function. Whole models gain less
(``benchmarks/training_step.py``: ``mz-slim`` step 0.77x, ``mz`` 0.97x; in message passing,
``benchmarks/message_passing.py``, the neighbourhood aggregation 0.69-1.04x).

It is off by default: the first call in a process compiles for a few seconds per dtype (and needs
a C++ compiler on CPU, Triton on CUDA). Turn it on with :func:`set_fused_kernels` or the
environment variable ``TORCH_MZ_FUSED_KERNELS=1``; if compiling fails, the eager function is used
and a warning says why. Both compute the same map; the tests check values and gradients against
the autograd reference in float64.
"""
import os
import warnings
from typing import Callable, Dict, Optional

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

_ENABLED = os.environ.get('TORCH_MZ_FUSED_KERNELS', '0') not in ('', '0', 'false', 'False')
_COMPILED: Dict[str, Callable] = {}
_FAILED = False


def set_fused_kernels(enabled: bool = True) -> None:
    r"""Use compiled (fused) kernels for the LayerNorm Jacobian on generators (see the module
    docstring)."""
    global _ENABLED
    _ENABLED = bool(enabled)


def fused_kernels_enabled() -> bool:
    r"""Whether the compiled kernels are on (and have not failed to compile)."""
    return _ENABLED and not _FAILED


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


def _compiled(name: str, fn):
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=True)
    return _COMPILED[name]


# Token counts, generator budgets and widths differ between blocks and models: each new range
# compiles a graph (once), so the compile cache may hold more than dynamo's default of 8.
RECOMPILE_LIMIT = 64


def _run(name: str, fn, *args):
    global _FAILED
    # Under a dispatch mode (FlopCounterMode, a profiler's counters) dynamo cannot use the
    # compiled graphs and calling them there leaves them unusable afterwards (measured: 4x slower
    # for the rest of the process): the eager formula runs instead.
    if not _FAILED and _get_current_dispatch_mode() is None:
        try:
            # detached inputs: the graphs do not depend on whether the caller tracks gradients
            args = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                return _compiled(name, fn)(*args)
        except Exception as err:  # no compiler, unsupported device: fall back, say so once
            _FAILED = True
            warnings.warn(f"torch_mz: compiling the fused kernels failed ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}); using the eager "
                          f"functions", RuntimeWarning)
    return fn(*args)


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
        grad_c, grad_g, grad_w = _run('ln_backward', _ln_jacobian_backward,
                                      grad_out.contiguous(), c, g, w, ctx.eps)
        return (grad_c if ctx.needs_input_grad[0] else None, grad_g,
                grad_w if ctx.has_weight and ctx.needs_input_grad[2] else None, None)
