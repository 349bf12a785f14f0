r"""What the matrix zonotope learns (Section 5.4 and Appendix D.1 of the MZAttn paper).

For an :class:`~torch_mz.nn.MZAttention` layer with ``value='mz'`` the realised per-head operator
for a set with summary :math:`\mu` is

.. math::
    M(\mu) = M_c + \sum_{l=1}^{L} \gamma_l(\mu) M_l,\qquad \gamma = \tanh(W_\gamma \mu).

This module computes, from a layer and the summaries of many sets:

* the gates :math:`\gamma` and their activity (the fraction of evaluations with
  :math:`|\gamma_l| > \tau`; the paper does not state its threshold, :math:`\tau = 0.1` here),
* the cosine similarity of the generator matrices in operator space (each :math:`M_l` flattened
  over all heads) and their Frobenius norms,
* the soft effective rank (Roy and Vetterli, 2007: :math:`\exp` of the entropy of the normalised
  singular values) of the operator variation :math:`\{M(\mu_i) - \bar{M}\}_i`, flattened over
  heads,

and collects the summaries :math:`\mu` that a model's layers actually see on a dataset
(:func:`collect_summaries`).

:math:`M(\mu)` is the paper's definition: it leaves out the mixing weights
:math:`W_{\mathrm{mix}} \in \mathbb{R}^{n_g \times L}`, which spread the terms
:math:`\gamma_l M_l \hat{c}` over the generator rows. What a signed readout
:math:`c + \sum_g G_g` of one attention's output reaches (keys without generators) is
:math:`M_c + \sum_l s_l \gamma_l(\mu) M_l`, with :math:`s_l = \sum_g W_{\mathrm{mix}}[g, l]`:
``readout='signed'`` of :func:`operators` and :func:`operator_effective_rank` gives that
operator (a choice of this package, beside the paper's).
"""
import inspect
from typing import Dict, Iterable

import torch
from torch import Tensor
from torch.nn import Module

from torch_mz._checks import check_rate
from torch_mz.nn.attention import MZAttention


def _check_mz(attn: MZAttention):
    if not isinstance(attn, MZAttention) or attn.value != 'mz':
        raise ValueError(f"Expected an MZAttention layer with value='mz' (got {attn!r})")


def _check_summaries(attn: MZAttention, mu: Tensor):
    width = attn.gate.in_features
    if not isinstance(mu, Tensor) or mu.dim() != 2 or mu.size(1) != width:
        got = tuple(mu.shape) if isinstance(mu, Tensor) else type(mu).__name__
        raise ValueError(f"Expected set summaries of shape (n, {width}), one row per set "
                         f"(got {got})")
    if not bool(torch.isfinite(mu).all()):
        raise ValueError('Expected set summaries of finite entries (got NaN or inf: the '
                         'summaries of a model that diverged?)')


def _check_some(n: int, what: str):
    if n == 0:
        raise ValueError(f'{what} takes the summaries of at least one set (got none)')


@torch.no_grad()
def gates(attn: MZAttention, mu: Tensor) -> Tensor:
    r"""Gates :math:`\gamma(\mu) \in [-1, 1]^L` of each summary, shape :obj:`(n, L)`.
    :obj:`mu` is :obj:`(n, |mu|)` with finite entries (else a :class:`ValueError`)."""
    _check_mz(attn)
    _check_summaries(attn, mu)
    return torch.tanh(attn.gate(mu.to(attn.gate.weight.dtype)))


READOUTS = ('paper', 'signed')


@torch.no_grad()
def operators(attn: MZAttention, mu: Tensor, readout: str = 'paper') -> Tensor:
    r"""Realised operators of every head for each summary, shape :obj:`(n, H, d_k, d_k)`:
    the paper's :math:`M(\mu_i) = M_c + \sum_l \gamma_l(\mu_i) M_l` (:obj:`readout`
    ``'paper'``), or the operator a signed readout :math:`c + \sum_g G_g` reaches,
    :math:`M_c + \sum_l s_l \gamma_l(\mu_i) M_l` with :math:`s_l = \sum_g
    W_{\mathrm{mix}}[g, l]` (``'signed'``; see the module docstring)."""
    if readout not in READOUTS:
        raise ValueError(f"'readout' must be one of {READOUTS}, got {readout!r}")
    g = gates(attn, mu)  # (n, L)
    if readout == 'signed':
        g = g * attn.mix.sum(0).to(g.dtype)  # (n, L): s_l gamma_l
    return attn.weight.unsqueeze(0) + torch.einsum('nl,hlde->nhde', g, attn.matrix_gens)


@torch.no_grad()
def gate_activity(attn: MZAttention, mu: Tensor, threshold: float = 0.1) -> float:
    r"""Fraction of (set, gate) evaluations with :math:`|\gamma_l(\mu)| > \tau`, for a
    threshold :math:`\tau` in :math:`[0, 1]` and at least one summary."""
    threshold = check_rate('threshold', threshold, high_inclusive=True)
    g = gates(attn, mu)  # (n, L)
    _check_some(g.size(0), 'gate_activity()')
    return float((g.abs() > threshold).to(torch.float64).mean())


@torch.no_grad()
def generator_cosine(attn: MZAttention) -> Tensor:
    r"""Cosine similarity of the generator matrices :math:`M_l` in operator space (flattened over
    heads), shape :obj:`(L, L)`; the identity for Frobenius-orthogonal generators."""
    _check_mz(attn)
    flat = attn.matrix_gens.transpose(0, 1).reshape(attn.num_matrix_generators, -1)  # (L, H dk^2)
    flat = flat / flat.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return flat @ flat.T


@torch.no_grad()
def generator_norms(attn: MZAttention) -> Tensor:
    r"""Frobenius norm of each generator matrix over all heads, shape :obj:`(L,)`."""
    _check_mz(attn)
    return attn.matrix_gens.transpose(0, 1).reshape(attn.num_matrix_generators, -1).norm(dim=1)


def soft_effective_rank(matrix: Tensor, eps: float = 1e-12) -> float:
    r"""Soft effective rank :math:`\exp(-\sum_i p_i \log p_i)`, :math:`p_i = \sigma_i / \sum_j
    \sigma_j`, of a matrix's singular values; equals :math:`k` for :math:`k` equal non-zero
    singular values and 0 for the zero matrix. Singular values at most :obj:`eps` times the
    largest count as zero (relative: a matrix of small entries keeps its rank; :obj:`eps` in
    :math:`[0, 1)`). A matrix with a NaN or infinite entry (an infinite one gave 1.0), or a
    tensor that is not 2-D (a batch of matrices gave one rank of all their singular values),
    raises a :class:`ValueError`."""
    eps = check_rate('eps', eps)
    if not isinstance(matrix, Tensor) or matrix.dim() != 2:
        got = tuple(matrix.shape) if isinstance(matrix, Tensor) else type(matrix).__name__
        raise ValueError(f'soft_effective_rank takes one matrix, a 2-D tensor (got {got})')
    if not bool(torch.isfinite(matrix).all()):
        raise ValueError('soft_effective_rank takes a matrix of finite entries (got NaN or inf: '
                         'the operators of a model that diverged?)')
    s = torch.linalg.svdvals(matrix.to(torch.float64))
    if s.numel() == 0 or float(s.max()) == 0.0:
        return 0.0
    s = s[s > eps * s.max()]
    total = s.sum()
    p = s / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


@torch.no_grad()
def operator_effective_rank(attn: MZAttention, mu: Tensor, readout: str = 'paper') -> float:
    r"""Soft effective rank of :math:`\{M(\mu_i) - \bar{M}\}_i` (rows flattened over heads;
    :obj:`readout` as in :func:`operators`); at most :math:`L`, and 0 for a single summary."""
    ops = operators(attn, mu, readout)  # (n, H, dk, dk)
    _check_some(ops.size(0), 'operator_effective_rank()')
    ops = ops.reshape(ops.size(0), -1)  # (n, H dk^2)
    return soft_effective_rank(ops - ops.mean(0, keepdim=True))


_FORWARD = inspect.signature(MZAttention.forward)  # (self, query, key_value, ...)


@torch.no_grad()
def collect_summaries(model: Module, batches: Iterable) -> Dict[str, Tensor]:
    r"""Runs :obj:`model` (in eval mode) on every batch of :obj:`batches` and returns, for every
    ``value='mz'`` :class:`~torch_mz.nn.MZAttention` inside it, the set summaries
    :math:`\mu` it computed, stacked over all sets of all batches: ``{module name: (n, |mu|)}``."""
    found = {name: m for name, m in model.named_modules()
             if isinstance(m, MZAttention) and m.value == 'mz'}
    if not found:
        raise ValueError('The model has no MZAttention layer with value=\'mz\'')
    store: Dict[str, list] = {name: [] for name in found}
    handles = []
    for name, module in found.items():
        def hook(mod, args, kwargs, output, name=name):
            # (the arguments as MZAttention.forward names them, given by position or keyword)
            bound = _FORWARD.bind(mod, *args, **kwargs).arguments
            store[name].append(mod.key_value_summary(bound['key_value'], bound['kv_set'],
                                                     bound['num_sets']))
        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    modes = [(m, m.training) for m in model.modules()]  # each module's own, restored after
    model.eval()
    try:
        for batch in batches:
            model(batch)
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes:
            m.train(mode)
    if not any(store.values()):
        raise ValueError('collect_summaries() got no batches (or the model never called its '
                         'MZAttention layers): there is nothing to collect')
    idle = [name for name, chunks in store.items() if not chunks]
    if idle:
        raise ValueError(f"collect_summaries(): the model never called {', '.join(idle)} on "
                         f"these batches: nothing to collect there")
    return {name: torch.cat(chunks, 0) for name, chunks in store.items()}


@torch.no_grad()
def probe(model: Module, batches: Iterable, threshold: float = 0.1) -> Dict[str, dict]:
    r"""Per ``'mz'`` layer: gate activity, generator cosine matrix and norms, and the operator
    effective rank over the sets of :obj:`batches` (see the module docstring)."""
    check_rate('threshold', threshold, high_inclusive=True)  # (before the model runs)
    summaries = collect_summaries(model, batches)
    modules = dict(model.named_modules())
    out = {}
    for name, mu in summaries.items():
        attn = modules[name]
        out[name] = dict(
            num_sets=int(mu.size(0)),
            num_matrix_generators=attn.num_matrix_generators,
            gate_activity=gate_activity(attn, mu, threshold),
            generator_cosine=generator_cosine(attn).tolist(),
            generator_norms=generator_norms(attn).tolist(),
            operator_effective_rank=operator_effective_rank(attn, mu),
        )
    return out
