r"""Matrix Zonotopic multi-head attention over set-grouped zonotope tokens (Section 2.3, Eq. 3).

The value operator is pluggable, so that baselines share the routing code exactly:

* ``'rigid'``: :math:`W^{(h)} \hat{c}` (standard attention with a per-head output map),
* ``'mz'``: the matrix zonotope :math:`M(\mu) = M_c + \sum_l \gamma_l(\mu) M_l`,
* ``'film'``: rigid followed by a FiLM modulation :math:`(1 + \gamma(\mu)) \odot \cdot + \beta(\mu)`,
* ``'hypernet'``: :math:`(W^{(h)} + U^{(h)}(\mu) V^{(h)}) \hat{c}` with a rank-:math:`r` update.
"""
import math
import numbers
import warnings
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Linear, Module, Parameter

from torch_mz._checks import check_count, check_flag, check_rate
from torch_mz.nn import functional
from torch_mz.nn._context import _hooked
from torch_mz.nn.functional import (PATHS, check_choice, grouped_attention, set_counts, set_mean,
                                    set_std)
from torch_mz.nn.zonotope import AffineZonotope, MappedZonotope, Zonotope

VALUE_OPERATORS = ('rigid', 'mz', 'film', 'hypernet')
SUMMARIES = ('mean', 'mean+std')
VALUE_ORDERS = ('auto', 'before', 'after')


#: How many times the cost of its wider scores the saving of a folded key map must exceed
#: (:meth:`MZAttention._keys_folded`).
FOLD_MARGIN = 8


def _pair_count(query_set: Tensor, counts_k: Tensor, num_sets: int) -> int:
    r"""The number of query-key pairs :math:`P = \sum_b n^q_b n^k_b` (a host sync)."""
    return int((set_counts(query_set, num_sets) * counts_k).sum())


def _generator_order_costs(key_value: Union[Zonotope, MappedZonotope],
                           affine_width: Optional[int], Nq: int, Nk: int, pairs: int,
                           heads: int, dim: int) -> Tuple[int, int]:
    r"""Multiply-adds of the generator channel in the two value orders, ``(before, after)``:
    before, the value map on every key's :math:`n_g` generator rows of width :math:`w_g`
    (:math:`d`, or a mapped zonotope's hidden width :math:`h`) and the per-head aggregation of
    the mapped rows, :math:`N_k n_g w_g d + P n_g d`; after, every head aggregates the
    :math:`c_g` raw columns (:math:`n_g w_g`, or the :math:`p` inputs of affine generators)
    and the map acts on the queries, :math:`P H c_g + N_q n_g w_g d` (affine:
    :math:`N_q n_g d p`)."""
    ng = key_value.num_generators
    if ng == 0:
        return 0, 0
    if affine_width is not None:  # the formed (N_k, n_g, d) rows, or the p inputs
        w_g, raw, after_map = dim, affine_width, Nq * ng * dim * affine_width
    else:
        gens = key_value.hidden if isinstance(key_value, MappedZonotope) else key_value.gens
        w_g = gens.size(2)
        raw, after_map = ng * w_g, Nq * ng * w_g * dim
    return Nk * ng * w_g * dim + pairs * ng * dim, pairs * heads * raw + after_map


def _mix_product(coef: Tensor, rows: Tensor, add: Optional[Tensor] = None,
                 inplace: bool = False) -> Tensor:
    r"""The batched product of the mixing coefficients :obj:`coef` :math:`(N, n_g, L)` with the
    rows :obj:`rows` :math:`(N, L, d)`, plus :obj:`add` :math:`(N, n_g, d)` where given (into
    :obj:`add` itself with :obj:`inplace`). With :math:`L = 1` (the neighbourhood preset's
    budget) the product is an outer product and is formed by broadcasting: the same products,
    with no sum to take; a batched matrix product of inner size 1 runs one tiny product per row
    (2.4 against 0.27 ms at :math:`(10017, 2, 1) \times (10017, 1, 64)`, one CPU core on an
    otherwise idle host, equal values)."""
    if coef.size(-1) == 1:
        if add is None:
            return coef * rows
        return add.addcmul_(coef, rows) if inplace else torch.addcmul(add, coef, rows)
    if add is None:
        return torch.bmm(coef, rows)
    return add.baddbmm_(coef, rows) if inplace else torch.baddbmm(add, coef, rows)


def check_token_sets(set_id: Tensor, num_tokens: int, num_sets: int, name: str = 'set_id') -> None:
    r"""Checks what can be checked of the set ids of :obj:`num_tokens` tokens without waiting for
    the device: an integer tensor :math:`(N,)` and an integer :obj:`num_sets` :math:`\geq 0`
    (the ids' values are checked where they enter, e.g. by
    :func:`~torch_mz.nn.aggr.check_set_ids`)."""
    if (not isinstance(num_sets, (numbers.Integral, torch.SymInt)) or isinstance(num_sets, bool)
            or num_sets < 0):  # (a SymInt under torch.compile)
        raise ValueError(f"'num_sets' must be an integer >= 0 (got {num_sets!r})")
    if (not isinstance(set_id, Tensor) or set_id.dim() != 1 or set_id.numel() != num_tokens
            or set_id.is_floating_point() or set_id.is_complex() or set_id.dtype == torch.bool):
        got = (f'shape {tuple(set_id.shape)}, dtype {set_id.dtype}'
               if isinstance(set_id, Tensor) else type(set_id).__name__)
        raise ValueError(f"Expected '{name}' to hold the integer set id of each of the "
                         f"{num_tokens} tokens, shape ({num_tokens},) (got {got})")


def check_token_dtype(dtype: torch.dtype, *tokens: Union[Zonotope, MappedZonotope],
                      layer_norm: bool = False) -> None:
    r"""Checks that the :obj:`tokens` are of a module's :obj:`dtype` (its parameters'), unless
    :func:`torch.autocast` runs for their device and neither the tokens nor the module are
    float64 (autocast casts the others where they meet a weight);
    a :class:`ValueError` says what was expected and what came (a mismatch failed inside the
    first matrix product, without naming the tokens). With :obj:`layer_norm` (tokens that meet
    the module's LayerNorms in a residual sum, as a block's queries do: the CPU's autocast
    casts neither them nor the LayerNorm's weights) a half-precision module on the CPU takes
    tokens of its own dtype only, under autocast to that dtype only (the LayerNorm failed on
    any other; CUDA's autocast runs LayerNorms in float32, casting both, and is left to it)."""
    if not tokens:
        return
    got = [t.center.dtype for t in tokens]
    device = tokens[0].center.device.type
    autocast = torch.is_autocast_enabled(device)
    half = layer_norm and device == 'cpu' and dtype in (torch.float16, torch.bfloat16)
    cast = torch.get_autocast_dtype(device) if autocast else dtype
    if half and cast != dtype:
        raise ValueError(f"Expected a module of float32 or {cast} parameters under "
                         f"torch.autocast to {cast} (got {dtype} parameters, whose LayerNorms "
                         f"it does not cast); convert the module (e.g. .float()), or run under "
                         f"torch.autocast('{device}', dtype={dtype})")
    if all(g == dtype for g in got):
        return
    wide = dtype == torch.float64 or torch.float64 in got
    if not wide and not half and autocast:
        return  # (autocast casts float32, float16 and bfloat16 tensors, not float64 ones)
    other = next(g for g in got if g != dtype)
    raise ValueError(f"Expected tokens of the module's dtype {dtype} (got "
                     f"{' and '.join(str(g) for g in got)}); convert the tokens (e.g. "
                     f"Zonotope.to({dtype})) or the module (e.g. .to({other}))"
                     + ('' if wide or half else ', or run under torch.autocast')
                     + (", whose LayerNorms take tokens of their own dtype only (autocast "
                        "does not cast them)" if half else ''))


class MZAttention(Module):
    r"""Multi-head attention from query zonotope tokens to the key/value zonotope tokens of the same
    set, with a context-adaptive value operator (Eq. 3 of the paper).

    For head :math:`h` (of :math:`H`, width :math:`d_k = d / H`), with centers :math:`c` and
    generators :math:`G` of the tokens:

    .. math::
        q_i = W_Q c^q_i,\quad k_j = W_K c^{kv}_j,\quad v_j = W_V c^{kv}_j + b_V,\quad
        V_j = G^{kv}_j W_V^\top

        a_{ij} = \mathrm{softmax}_{j \in S(i)}\big(s_{S}\, q_i^\top k_j / \sqrt{d_k}\big),\quad
        \hat{c}_i = \sum_j a_{ij} v_j,\quad \hat{G}_i = \sum_j a_{ij} V_j

        \gamma = \tanh(W_\gamma \mu(S)) \in [-1, 1]^L

        o^c_i = M_c \hat{c}_i,\qquad
        o^G_i = \hat{G}_i M_c^\top + W_{\mathrm{mix}}\,
        \mathrm{stack}_l\big[\gamma_l M_l \hat{c}_i\big]

    where :math:`\mu(S)` is the mean (optionally also the per-feature std) of the key/value centers
    of the set and :math:`s_S = \log n_S` with ``log_n=True`` (:math:`n_S` the number of keys of
    the set; beyond the paper, for generalisation to larger sets) and :math:`1` otherwise.
    Heads are concatenated; there is no extra output projection (the per-head :math:`M_c` plays
    that role), so with :math:`M_c = I` the center path is exactly standard attention.
    The gate weights :math:`W_\gamma` (no bias, as in the paper) and the mixing matrix
    :math:`W_{\mathrm{mix}} \in \mathbb{R}^{n_g \times L}` are shared by the heads, while
    :math:`M_c^{(h)}, M_l^{(h)}` are per head: the MZ part costs :math:`(L+1)d_k^2` per head plus
    :math:`L \cdot |\mu|` gate and :math:`n_g L` mixing parameters.

    Other value operators (``value=``): ``'rigid'`` uses only :math:`W^{(h)}` (init :math:`I`);
    ``'film'`` computes the rigid output :math:`r` and returns
    :math:`((1 + \gamma_f(\mu)) \odot r^c + \beta(\mu),\ (1 + \gamma_f(\mu)) \odot r^G)` with
    zero-initialised linear :math:`\gamma_f, \beta`; ``'hypernet'`` uses
    :math:`W^{(h)} + U^{(h)}(\mu) V^{(h)}` with :math:`U^{(h)}(\mu) \in \mathbb{R}^{d_k \times r}`
    a zero-initialised linear function of :math:`\mu`. Every operator equals ``'rigid'`` with the
    same weights when its context-dependent parameters are zero; ``'film'`` and ``'hypernet'``
    start there. Initialisation (Appendix A.1): :math:`M_c = I`,
    :math:`M_l \sim \mathcal{N}(0, 0.02^2)`, :math:`W_{\mathrm{mix}} \sim \mathcal{N}(0, 0.1^2)`,
    other linears Xavier uniform, :math:`b_V = 0`.

    A query whose set has no keys receives a zero aggregate (:math:`\hat{c} = 0, \hat{G} = 0`).

    Computed exactly, in a cheaper order: :math:`1/\sqrt{d_k}` is folded into :math:`W_Q`, and for
    ``'rigid'`` and ``'film'`` (whose output needs :math:`W^{(h)} \hat{c}`, not :math:`\hat{c}`)
    :math:`W^{(h)}` is folded into the value map, :math:`W^{(h)}(W_V c + b_V) = (W^{(h)} W_V) c +
    W^{(h)} b_V`; both are :math:`d \times d` products on the weights instead of passes over the
    tokens. In a block with few queries per set (the PMA's seeds, see :attr:`fold_keys`) the key
    map joins the queries instead, :math:`q^\top (W_K c) = (W_K^\top q)^\top c`, and every head
    attends to the raw tokens: the heads become queries of one attention over keys and values
    shared by all, and no map passes over the keys (the part of a mapped center's bias that only
    shifts all scores of a query is dropped, as the softmax ignores it). The results agree with
    the literal order up to rounding (tests compare them). The weights of :obj:`lin_q`,
    :obj:`lin_v` (and :obj:`lin_k` where the keys are folded, unless it is hooked) are read
    directly, so hooks on those layers could not run: a forward refuses forward pre-hooks on
    :obj:`lin_q` or :obj:`lin_v` (e.g. :mod:`torch.nn.utils.prune`'s or the older hook-based
    ``torch.nn.utils.weight_norm``, which would otherwise leave a stale weight), warns once of
    other hooks there (observers, which then see nothing), and runs a hooked :obj:`lin_k` as a
    module. :mod:`torch.nn.utils.parametrize` (and
    ``torch.nn.utils.parametrizations``) works, since a parametrised weight is computed when
    it is read.

    Args:
        dim (int): Token width :math:`d`.
        heads (int): Number of heads :math:`H`; must divide :obj:`dim` (default: :obj:`4`).
        num_generators (int): Generator budget :math:`n_g` (default: :obj:`8`).
        value (str): Value operator, one of :obj:`'rigid'`, :obj:`'mz'`, :obj:`'film'`,
            :obj:`'hypernet'` (default: :obj:`'mz'`).
        num_matrix_generators (int): :math:`L` for :obj:`'mz'` (default: :obj:`4`).
        rank (int): Rank :math:`r` of the :obj:`'hypernet'` update (default: :obj:`8`).
        summary (str): Set summary for the gates, :obj:`'mean'` or :obj:`'mean+std'`
            (default: :obj:`'mean'`).
        dropout (float): Dropout on attention weights (default: :obj:`0.0`).
        log_n (bool): Multiply logits by :math:`\log n` of the key set (default: :obj:`False`).
        path (str): Attention kernel, :obj:`'auto'`, :obj:`'dense'` or :obj:`'scatter'`
            (see :func:`torch_mz.nn.functional.grouped_attention`) (default: :obj:`'auto'`).
        value_order (str): Where the value map :math:`W_V` (and, on generators, :math:`M_c W_V`)
            acts: :obj:`'before'` the aggregation on every key, :obj:`'after'` it on every query
            (all heads aggregate the raw tokens in one product), or :obj:`'auto'`, the cheaper of
            the two by a count of multiply-adds (the first MAB of an ISAB and the PMA usually
            have fewer queries than keys). The result is the same up to rounding
            (default: :obj:`'auto'`).
        recompute (bool): Keep only the inputs of the aggregation for the backward pass and
            run the query/key/value maps, the packing of sets into blocks and the attention
            kernel again there (non-reentrant :func:`torch.utils.checkpoint.checkpoint`), instead
            of keeping the packed queries, keys and values: less training memory for one more
            forward of the attention; the same values and gradients (default: :obj:`False`).
        fold_keys (bool): Fold the key map into the queries where that is cheaper by a count of
            multiply-adds (blocks with few queries per set, such as the PMA's seeds; never with
            ``value_order='before'`` or while dropout on the attention weights is active, whose
            draws would be laid out differently). The same values and gradients up to rounding
            (default: :obj:`True`).

    Shapes:
        - **input:** queries :class:`Zonotope` :math:`(N_q, d), (N_q, n_g, d)`, keys/values
          :class:`Zonotope` :math:`(N_k, d), (N_k, n_g, d)` or
          :class:`~torch_mz.nn.zonotope.MappedZonotope` (generators before a last linear map,
          which joins the value map), set ids :math:`(N_q,)` and :math:`(N_k,)`
        - **output:** :class:`Zonotope` :math:`(N_q, d), (N_q, n_g, d)`
    """
    def __init__(self, dim: int, heads: int = 4, num_generators: int = 8, value: str = 'mz',
                 num_matrix_generators: int = 4, rank: int = 8, summary: str = 'mean',
                 dropout: float = 0.0, log_n: bool = False, path: str = 'auto',
                 value_order: str = 'auto', recompute: bool = False, fold_keys: bool = True):
        super().__init__()
        dim, heads = check_count('dim', dim), check_count('heads', heads)
        if dim % heads != 0:
            raise ValueError(f"'heads' ({heads}) must be positive and divide 'dim' ({dim})")
        num_generators = check_count('num_generators', num_generators, 0)
        dropout = check_rate('dropout', dropout)
        log_n, recompute = check_flag('log_n', log_n), check_flag('recompute', recompute)
        fold_keys = check_flag('fold_keys', fold_keys)
        check_choice('value operator', value, VALUE_OPERATORS)
        check_choice('summary', summary, SUMMARIES)
        check_choice('attention path', path, PATHS)
        check_choice('value order', value_order, VALUE_ORDERS)
        if value == 'mz':
            num_matrix_generators = check_count('num_matrix_generators', num_matrix_generators)
        if value == 'hypernet':
            rank = check_count('rank', rank)
        self.dim = dim
        self.heads = heads
        self.head_dim = dim // heads
        self.num_generators = num_generators
        self.value = value
        self.num_matrix_generators = num_matrix_generators
        self.rank = rank
        self.summary = summary
        self.dropout = dropout
        self.log_n = log_n
        self.path = path
        self.value_order = value_order
        self.recompute = recompute
        self.fold_keys = bool(fold_keys)

        H, dk = heads, self.head_dim
        summary_dim = dim * (2 if summary == 'mean+std' else 1)
        self.lin_q = Linear(dim, dim, bias=False)
        self.lin_k = Linear(dim, dim, bias=False)
        self.lin_v = Linear(dim, dim, bias=True)
        # Per-head center map: M_c for 'mz', W for the other operators. Shape (H, dk, dk).
        self.weight = Parameter(torch.empty(H, dk, dk))
        if value == 'mz':
            L = num_matrix_generators
            self.matrix_gens = Parameter(torch.empty(H, L, dk, dk))  # M_l per head
            self.gate = Linear(summary_dim, L, bias=False)  # W_gamma
            self.mix = Parameter(torch.empty(num_generators, L))  # W_mix
            if num_generators == 0:
                raise ValueError("The 'mz' value operator writes to the generators and needs "
                                 "'num_generators' > 0")
        elif value == 'film':
            self.film_scale = Linear(summary_dim, dim)
            self.film_shift = Linear(summary_dim, dim)
        elif value == 'hypernet':
            self.hyper_u = Linear(summary_dim, H * dk * rank)  # U(mu), flattened
            self.hyper_v = Parameter(torch.empty(H, rank, dk))  # V
        self.reset_parameters()

    def reset_parameters(self):
        for lin in (self.lin_q, self.lin_k, self.lin_v):
            torch.nn.init.xavier_uniform_(lin.weight)
        torch.nn.init.zeros_(self.lin_v.bias)
        with torch.no_grad():
            self.weight.copy_(torch.eye(self.head_dim).expand_as(self.weight))
        if self.value == 'mz':
            torch.nn.init.normal_(self.matrix_gens, std=0.02)
            torch.nn.init.xavier_uniform_(self.gate.weight)
            torch.nn.init.normal_(self.mix, std=0.1)
        elif self.value == 'film':
            for lin in (self.film_scale, self.film_shift):
                torch.nn.init.zeros_(lin.weight)
                torch.nn.init.zeros_(lin.bias)
        elif self.value == 'hypernet':
            torch.nn.init.zeros_(self.hyper_u.weight)
            torch.nn.init.zeros_(self.hyper_u.bias)
            torch.nn.init.xavier_uniform_(self.hyper_v.view(-1, self.head_dim))

    def set_summary(self, center: Tensor, set_id: Tensor, num_sets: int) -> Tensor:
        r"""The permutation-invariant summary :math:`\mu(S)` of each set's key/value centers,
        shape :obj:`(num_sets, d)` or :obj:`(num_sets, 2d)`; zero for an empty set. Float16 and
        bfloat16 centers are summarised in float32 (the std from the unrounded mean) and the
        summary cast back."""
        if self.summary != 'mean' and center.dtype in (torch.float16, torch.bfloat16):
            return self.set_summary(center.float(), set_id, num_sets).to(center.dtype)
        mean = set_mean(center, set_id, num_sets)  # (B, d)
        if self.summary == 'mean':
            return mean
        return torch.cat([mean, set_std(center, set_id, num_sets, mean)], dim=-1)  # (B, 2d)

    def key_value_summary(self, key_value: Union[Zonotope, MappedZonotope], kv_set: Tensor,
                          num_sets: int) -> Tensor:
        r"""The set summary :math:`\mu(S)` (:meth:`set_summary`) of the key/value tokens'
        centers, also for :class:`~torch_mz.nn.zonotope.MappedZonotope` tokens: from the hidden
        rows of mapped centers (the mean commutes with the linear map; the bias counts only for
        sets with elements), and from the centers themselves for the std."""
        if not isinstance(key_value, MappedZonotope) or key_value.center_weight is None:
            return self.set_summary(key_value.center, kv_set, num_sets)
        if self.summary != 'mean':
            return self.set_summary(key_value.centers(), kv_set, num_sets)
        rows, weight, bias = key_value.center_rows()
        mean = F.linear(set_mean(rows, kv_set, num_sets), weight)  # (B, d)
        if bias is None:
            return mean
        nonempty = (set_counts(kv_set, num_sets) > 0).to(mean.dtype).unsqueeze(-1)  # (B, 1)
        return mean.addcmul(nonempty, bias.to(mean.dtype))

    def forward(self, query: Zonotope, key_value: Union[Zonotope, MappedZonotope],
                query_set: Tensor, kv_set: Tensor, num_sets: int) -> Zonotope:
        if query.dim != self.dim or key_value.dim != self.dim:
            raise ValueError(f"Expected tokens of width {self.dim} (got {query.dim} and "
                             f"{key_value.dim})")
        if key_value.num_generators != self.num_generators:
            raise ValueError(f"Expected {self.num_generators} generators per token (got "
                             f"{key_value.num_generators})")
        check_token_dtype(self.weight.dtype, query, key_value)
        check_token_sets(query_set, query.num_tokens, num_sets, 'query_set')
        check_token_sets(kv_set, key_value.num_tokens, num_sets, 'kv_set')
        for name in ('lin_q', 'lin_v'):
            layer = getattr(self, name)
            if layer._forward_pre_hooks:  # (its own; global hooks are served)
                # what prune, weight_norm and spectral_norm register: they recompute the
                # weight, which would go stale (the second optimizer step failed)
                raise RuntimeError(
                    f"MZAttention reads the weight of '{name}' directly, so the forward pre-hooks "
                    f"registered on it would never run (a pruned or hook-normalised weight "
                    f"would go stale): remove them (torch.nn.utils.prune.remove makes a pruning "
                    f"permanent), or use torch.nn.utils.parametrize / "
                    f"torch.nn.utils.parametrizations, whose weights are computed when read")
            if ((layer._forward_hooks or layer._backward_hooks or layer._backward_pre_hooks)
                    and not getattr(layer, '_torch_mz_hooks_warned', False)):
                # (observers, such as summaries of every layer's output: told once)
                layer._torch_mz_hooks_warned = True
                warnings.warn(f"MZAttention reads the weight of '{name}' directly: the hooks "
                              f"registered on that layer do not run", stacklevel=2)
        ng = self.num_generators
        Nq, Nk = query.num_tokens, key_value.num_tokens
        counts_k = set_counts(kv_set, num_sets)  # (B,)
        affine_width = (key_value.inputs.size(1) if isinstance(key_value, AffineZonotope)
                        and key_value.describes_gens() else None)
        # the query-key pair count (one host sync), taken once where either order choice
        # needs it
        pairs = (_pair_count(query_set, counts_k, num_sets)
                 if Nq < Nk and ((self.value_order == 'auto' and self.num_generators > 0)
                                 or self._may_fold(Nq, Nk)) else None)
        after = self._values_after(query_set, counts_k, Nq, Nk, num_sets, affine_width, pairs)
        merged = False
        if pairs is not None and self._may_fold(Nq, Nk):  # (pairs is counted where it may)
            merged = self._keys_folded(
                query_set, counts_k, Nq, Nk, num_sets, key_value.center.size(-1), after, pairs,
                None if after else _generator_order_costs(key_value, affine_width, Nq, Nk,
                                                          pairs, self.heads, self.dim))
        after = after or merged  # the folded keys take the raw tokens as values
        gamma = None
        if self.value == 'mz':
            mu = self.key_value_summary(key_value, kv_set, num_sets)  # (B, |mu|)
            gamma = torch.tanh(self.gate(mu))  # (B, L): the gates of each set
        # 'mz' with the value map before the aggregation: the mixing term joins the values
        # (see _aggregate), so the aggregated generators are the output generators
        mix_in_values = gamma is not None and not after

        if self.recompute and torch.is_grad_enabled():
            # keep only the inputs; projections, packing and the attention kernel run again in
            # the backward pass (the same operations, so the same values and gradients)
            c_hat, g_agg = torch.utils.checkpoint.checkpoint(
                self._aggregate, query, key_value, query_set, kv_set, num_sets, counts_k,
                after, gamma if mix_in_values else None, merged, use_reentrant=False)
        else:
            c_hat, g_agg = self._aggregate(query, key_value, query_set, kv_set, num_sets,
                                           counts_k, after, gamma if mix_in_values else None,
                                           merged)
        weight = self.weight.to(c_hat.dtype)  # (H, dk, dk), M_c or W
        fold = self.value in ('rigid', 'film')
        # (Nq, H, dk): W c_hat (already applied when folded, see above, or with the mixing
        # term in the values)
        out_c = (c_hat if fold or mix_in_values
                 else torch.einsum('nhd,hed->nhe', c_hat, weight))
        if gamma is not None:  # 'mz'
            if mix_in_values:  # (Nq, ng, d), a view of the aggregate's token layout
                out_g = g_agg.transpose(1, 2).reshape(Nq, ng, self.dim)
            else:
                out_g = self._mz_generators(g_agg, c_hat, gamma[query_set])  # (Nq, ng, d)
            return Zonotope(out_c.reshape(Nq, self.dim), out_g)
        if self.value == 'hypernet':
            g_hat = g_agg
            out_g = torch.einsum('nhgd,hed->nhge', g_hat, weight)  # (Nq, H, ng, dk)
        else:
            g_hat, out_g = None, g_agg  # already G_hat M_c^T
        if self.value != 'rigid':
            mu = self.key_value_summary(key_value, kv_set, num_sets)  # (B, |mu|)
            out_c, out_g = self._context(out_c, out_g, c_hat, g_hat, mu, query_set)

        out_c = out_c.reshape(Nq, self.dim)  # (Nq, d)
        out_g = out_g.permute(0, 2, 1, 3).reshape(Nq, ng, self.dim)  # (Nq, ng, d)
        return Zonotope(out_c, out_g)

    def _aggregate(self, query: Zonotope, key_value: Union[Zonotope, MappedZonotope],
                   query_set: Tensor, kv_set: Tensor, num_sets: int, counts_k: Tensor,
                   after: bool, gamma: Optional[Tensor] = None,
                   merged: bool = False) -> Tuple[Tensor, Tensor]:
        r"""The aggregated centers and generators. With the gates :obj:`gamma` (``'mz'``, values
        mapped before the aggregation), the mixing term is added to the values and :math:`M_c`
        maps the center values, so that the aggregate is the output (see :meth:`_mix_terms`)."""
        H, dk, ng, d = self.heads, self.head_dim, self.num_generators, self.dim
        Nq, Nk = query.num_tokens, key_value.num_tokens
        # the score scale 1/sqrt(d_k) is folded into W_Q (a (d, d) product instead of a pass
        # over the (N_q, d) queries)
        q = F.linear(query.center, self.lin_q.weight * (1.0 / math.sqrt(dk))).view(
            Nq, H, dk)  # (Nq, H, dk)
        if self.log_n:
            # the log in at least float32 (float16 holds no count above 65,504), then cast
            n = counts_k.clamp(min=1).to(torch.promote_types(q.dtype, torch.float32))  # (B,)
            q = q * torch.log(n).to(q.dtype)[query_set].view(Nq, 1, 1)
        if isinstance(key_value, MappedZonotope):
            rows, c_weight, c_bias = key_value.center_rows()
            if c_weight is not None:  # in the queries' precision, for every map it joins
                c_weight = c_weight.to(q.dtype)
        else:
            rows, c_weight, c_bias = key_value.center, None, None
        if merged:
            # the key map joins the queries: q^T (W_K c) = (W_K^T q)^T c per head, and the heads
            # become queries of one attention over the raw rows (a mapped center's bias adds
            # the same q^T W_K b_c to every score of a query, which the softmax ignores)
            w_key = self.lin_k.weight.to(q.dtype)  # (d, w_c)
            if c_weight is not None:
                w_key = w_key @ c_weight
            # per head (H, Nq, dk) @ (H, dk, w_c), then query-major: query i, head h at row
            # i H + h of (Nq H, 1, w_c)
            q = torch.matmul(q.transpose(0, 1), w_key.view(H, dk, -1)).transpose(0, 1).reshape(
                Nq * H, 1, w_key.size(-1))
            k = rows.to(q.dtype).unsqueeze(1)  # (Nk, 1, w_c); where the values are mapped
            # after the aggregation (always, when merged) a view of the raw values instead
        elif c_weight is None:
            k = self.lin_k(rows).view(Nk, H, dk)  # (Nk, H, dk)
        else:
            # centers C W_c^T + b_c given by their hidden rows C (Nk, h_c): W_c joins the key
            # map, W_K (W_c h + b_c) = (W_K W_c) h + W_K b_c, and the value map below
            w_k = self.lin_k.weight.to(q.dtype)
            k = F.linear(rows.to(q.dtype), w_k @ c_weight,
                         None if c_bias is None else w_k @ c_bias.to(q.dtype)).view(Nk, H, dk)
        weight = self.weight.to(q.dtype)  # (H, dk, dk), M_c or W
        w_v = self.lin_v.weight.to(q.dtype).view(H, dk, d)  # per-head rows of W_V
        # Generators only ever meet M_c W_V (or W_V, for 'hypernet', which needs G_hat itself),
        # so one per-head matrix maps them: (H, dk, d).
        gen_map = w_v if self.value == 'hypernet' else torch.matmul(weight, w_v)
        if isinstance(key_value, MappedZonotope):
            # generators H W^T given by their hidden rows H (Nk, ng, h): W joins the map,
            # (M_c W_V) (W h) = (M_c W_V W) h, a product on the weights
            gens_kv = key_value.hidden.to(q.dtype)  # (Nk, ng, h)
            gens_map = (torch.matmul(gen_map, key_value.weight.to(q.dtype)) if ng > 0
                        else gen_map)  # (H, dk, h); unused without generators
        else:
            gens_kv = key_value.gens.to(q.dtype)  # (Nk, ng, d)
            gens_map = gen_map
        w_g = gens_kv.size(-1)  # d, or h
        bias_v = (self.lin_v.bias.to(q.dtype).view(H, dk) if self.lin_v.bias is not None
                  else None)  # (H, dk)
        # Operators whose output center needs only W c_hat (not c_hat itself) fold the per-head
        # map W into the value map: W (W_V c + b_V) = (W W_V) c + W b_V, one (d, d) product on
        # the keys (or the aggregated rows) and no second pass over the queries.
        fold = self.value in ('rigid', 'film')
        center_map = gen_map if fold else w_v  # (H, dk, d)
        if fold and bias_v is not None:
            bias_v = (weight * bias_v.unsqueeze(1)).sum(-1)  # (H, dk): W b_V per head
        if c_weight is not None:  # mapped centers: the center map joins the value map too
            if c_bias is not None:
                b_c = torch.matmul(center_map, c_bias.to(q.dtype))  # (H, dk)
                bias_v = b_c if bias_v is None else bias_v + b_c
            center_map = torch.matmul(center_map, c_weight)  # (H, dk, h_c)
        w_c = rows.size(-1)  # d, or h_c

        if after:
            # Aggregate the raw tokens once for all heads, then map them (exact: the value map is
            # linear and commutes with the attention-weighted sum). A column of ones gives the
            # attention mass of each query, which multiplies the bias (1, or 0 without keys).
            # The generators are aggregated as they lie (no copy into a joint value tensor).
            ones = rows.new_ones(Nk, 1).to(q.dtype)
            raw_c = torch.cat([ones, rows.to(q.dtype)], dim=-1)  # (Nk, 1 + d)
            if merged:  # the folded keys as a view of the raw rows beside the ones: the dense
                # path packs them once, in the values' buffer (grouped_attention's _key_col)
                k = raw_c[:, 1:].unsqueeze(1)  # (Nk, 1, w_c)
            # Generators affine in narrow inputs (the input projection's, AffineZonotope):
            # sum_j a_ij (A_g u_j + b_g) = A_g (sum_j a_ij u_j) + b_g (sum_j a_ij), so the p input
            # columns are aggregated instead of the n_g d generator columns
            affine = isinstance(key_value, AffineZonotope) and key_value.describes_gens()
            g_rows = (key_value.inputs.to(q.dtype) if isinstance(key_value, AffineZonotope)
                      and affine else gens_kv.reshape(Nk, ng * w_g))  # (Nk, p) or (Nk, ng w_g)
            shared = (raw_c, g_rows) if g_rows.size(-1) > 0 else (raw_c, )
            outs = grouped_attention(
                q, k, shared, self._per_head(query_set) if merged else query_set, kv_set,
                num_sets, dropout=self.dropout, training=self.training, path=self.path,
                _key_col=1 if merged else None)  # (Nq, H, 1 + d), (Nq, H, p or ng w_g)
            if merged:  # (Nq H, 1, w) -> (Nq, H, w)
                outs = tuple(o.view(Nq, H, o.size(-1)) for o in outs)
            agg_c = outs[0]
            g_raw = outs[1] if len(outs) > 1 else agg_c.new_zeros(Nq, H, 0)
            mass, c_raw = agg_c.split([1, w_c], dim=-1)  # (Nq, H, 1), (Nq, H, d)
            # per head (H, Nq, w) @ (H, w, dk), as a view in query order (Nq, H, dk)
            c_hat = torch.matmul(c_raw.transpose(0, 1),
                                 center_map.transpose(1, 2)).transpose(0, 1)
            if bias_v is not None:
                c_hat = c_hat + mass * bias_v
            if isinstance(key_value, AffineZonotope) and affine:
                # per head and generator, the value map joins A_g: (H, ng, dk, p)
                a_map = torch.einsum('hed,gdp->hgep', gens_map,
                                     key_value.gen_weight.to(q.dtype))
                g_agg = torch.einsum('nhp,hgep->nhge', g_raw, a_map)  # (Nq, H, ng, dk)
                if key_value.gen_bias is not None:
                    b_map = torch.einsum('hed,gd->hge', gens_map,
                                         key_value.gen_bias.to(q.dtype))  # (H, ng, dk)
                    g_agg = g_agg + mass.unsqueeze(-1) * b_map
            elif ng == 0:  # nothing to map
                g_agg = c_hat.new_zeros(Nq, H, 0, dk)
            else:
                g_agg = torch.einsum('nhgd,hed->nhge', g_raw.reshape(Nq, H, ng, w_g),
                                     gens_map)  # (Nq, H, ng, dk)
        else:
            vc = F.linear(rows.to(q.dtype), center_map.reshape(d, w_c),
                          None if bias_v is None else bias_v.reshape(d)).view(
                              Nk, H, dk)  # (Nk, H, dk)
            if ng == 0:  # no generators to map ('mz' needs them, so no mixing term either)
                c_hat = grouped_attention(q, k, vc, query_set, kv_set, num_sets,
                                          dropout=self.dropout, training=self.training,
                                          path=self.path)  # (Nq, H, dk)
                return c_hat, c_hat.new_empty(Nq, H, 0, dk)
            vg = torch.einsum('ngd,hed->nhge', gens_kv, gens_map)  # (Nk, H, ng, dk)
            if gamma is not None:
                # The mixing term W_mix stack_l[gamma_l M_l c_hat_i] is linear in c_hat_i =
                # sum_j a_ij v_j, and the gates are those of the set, which query i and its
                # keys j share: it is sum_j a_ij W_mix stack_l[gamma_l M_l v_j], so it joins
                # the values of the keys (N_k rows: the inducing tokens of an ISAB's MAB(X, H))
                # instead of being formed on every query (exact up to rounding)
                coef, mv = self._mix_terms(vc, gamma[kv_set])
                vg = vg + _mix_product(coef, mv).view(Nk, ng, H, dk).transpose(1, 2)
                # c_hat itself is then needed no more: M_c joins the center values too
                vc = torch.einsum('nhd,hed->nhe', vc, weight)  # (Nk, H, dk), M_c v_j
            values = torch.cat([vc, vg.reshape(Nk, H, ng * dk)], dim=-1)  # (Nk, H, (1+ng) dk)
            # returned in the token layout (Nq, 1 + ng, H, dk): the copy into query order also
            # interleaves the heads, so the generators need no second, transposing copy
            agg = grouped_attention(q, k, values, query_set, kv_set, num_sets,
                                    dropout=self.dropout, training=self.training,
                                    path=self.path, chunk=dk)  # (Nq, 1 + ng, H, dk)
            # split, not sliced: the backward pass joins the two gradients with one
            # concatenation instead of a zero-filled full-size tensor per slice
            c_part, g_part = agg.split([1, ng], dim=1)  # (Nq, 1, H, dk), (Nq, ng, H, dk)
            # c_hat alone (a copy), so that the backward pass does not keep all of agg alive
            # through a view of it: (1 + ng) times the memory of c_hat
            c_hat = c_part.squeeze(1).contiguous()  # (Nq, H, dk)
            g_agg = g_part.transpose(1, 2)  # (Nq, H, ng, dk), a view of the token layout

        return c_hat, g_agg

    def _per_head(self, query_set: Tensor) -> Tensor:
        r""":obj:`query_set` with each id repeated once per head (the folded queries' rows), kept
        with a copy of the ids for the next call with the same ids (compared by value, as the
        layout cache compares them: a write the version counter does not see, through ``.data``
        or NumPy, is found too). The kept tensor is what keeps a large layout of the folded
        queries in the layout cache from call to call (such layouts live only while their set
        ids do). Nothing is kept while compiling, in :func:`torch.inference_mode` or under
        :mod:`torch.func` transforms, and it is left out when the module is pickled or copied."""
        if not functional._caching():
            return query_set.repeat_interleave(self.heads)
        cached = self.__dict__.get('_per_head_ids')
        if (cached is not None and cached[0].shape == query_set.shape
                and cached[0].dtype == query_set.dtype and cached[0].device == query_set.device
                and torch.equal(cached[0], query_set)):
            return cached[1]
        ids = query_set.repeat_interleave(self.heads)
        if not torch.is_inference(query_set):
            self.__dict__['_per_head_ids'] = (query_set.clone(), ids)
        return ids

    def __getstate__(self) -> dict:
        # the per-head ids of the last call (_per_head) are a cache, not state
        state = dict(super().__getstate__())
        state.pop('_per_head_ids', None)
        return state

    def _may_fold(self, Nq: int, Nk: int) -> bool:
        r"""Whether the key map may join the queries at all (:attr:`fold_keys` on, fewer queries
        than keys and at least one, values not fixed before the aggregation, no active
        attention dropout, whose draws would be laid out differently, and no hooks on
        :obj:`lin_k`, whose hooks must see its input)."""
        return (getattr(self, 'fold_keys', True) and self.value_order != 'before'
                and 0 < Nq < Nk and not (self.training and self.dropout > 0)
                and not _hooked(self.lin_k))

    def _keys_folded(self, query_set: Tensor, counts_k: Tensor, Nq: int, Nk: int,
                     num_sets: int, key_width: int, after: bool = True,
                     pairs: Optional[int] = None,
                     gen_costs: Optional[Tuple[int, int]] = None) -> bool:
        r"""Whether the key map joins the queries (:attr:`fold_keys`; see :meth:`_may_fold`).
        For keys of width :math:`w` it saves the key map, :math:`(N_k - N_q) w d`
        multiply-adds net of the queries' map (twice that where the values would otherwise be
        mapped on the keys, :obj:`after` false), and costs wider scores, :math:`P H (w - d_k)`
        for :math:`P` query-key pairs (:obj:`pairs`, counted here where not given), plus, where
        :obj:`after` is false, the center values aggregated raw by every head instead of per
        head, :math:`P H (1 + w - d_k)`, and the generator channel's change of order:
        :obj:`gen_costs` = (before, after) from :func:`_generator_order_costs` (where the
        after order is cheaper the difference counts as saved, otherwise as cost; none given:
        no generators). The scores run as many small per-set products, slower per multiply-add
        than the one large product of the key map, so the saving must exceed
        :data:`FOLD_MARGIN` times the cost (measured: the PMA of 64 sets of 128 elements at
        d = 64 folds, the neighbourhoods of message passing at d = 16 do not)."""
        if not self._may_fold(Nq, Nk):
            return False
        if pairs is None:
            pairs = _pair_count(query_set, counts_k, num_sets)
        if pairs == 0:
            return False
        d, H, dk, w = self.dim, self.heads, self.head_dim, key_width
        saved = (Nk - Nq) * w * d * (1 if after else 2)
        cost = pairs * H * (w - dk) + (0 if after else pairs * H * (1 + w - dk))
        if not after and gen_costs is not None:
            g_before, g_after = gen_costs
            if g_after > g_before:
                cost += g_after - g_before
            else:
                saved += g_before - g_after
        return saved > FOLD_MARGIN * cost

    def _values_after(self, query_set: Tensor, counts_k: Tensor, Nq: int, Nk: int,
                      num_sets: int, affine_width: Optional[int] = None,
                      pairs: Optional[int] = None) -> bool:
        r"""Whether to apply the value map after the aggregation. Before: the map costs
        :math:`N_k (1 + n_g) d^2` and the aggregation :math:`P (1 + n_g) d` for :math:`P` query-key
        pairs; after: :math:`N_q (1 + n_g) d^2` and :math:`P H (1 + n_g) d`. Both are exact; with
        ``value_order='auto'`` the cheaper one is taken when tokens carry generators (without
        them the value map is a single fast product and 'before' keeps the fused attention
        kernel), otherwise the one :attr:`value_order` names. Where the keys' generators are
        affine in :obj:`affine_width` :math:`= p` input columns
        (:class:`~torch_mz.nn.zonotope.AffineZonotope`), 'after' aggregates those instead:
        :math:`N_q d^2 + P H (1 + d + p) + N_q n_g d p` (in blocks with fewer queries than keys
        only, as for the formed generators). :obj:`pairs` is :math:`P` where the caller has
        counted it."""
        if self.value_order != 'auto':
            return self.value_order == 'after'
        if Nq >= Nk or self.num_generators == 0:
            # without generators the value map is one fast matrix product on the keys, and the
            # per-head values keep the fused attention kernel: measured faster either way
            return False
        if pairs is None:
            pairs = _pair_count(query_set, counts_k, num_sets)
        if affine_width is not None:
            # generators affine in p inputs (AffineZonotope): after, the p input columns are
            # aggregated per head and mapped per generator on the queries
            d, H, ng, p = self.dim, self.heads, self.num_generators, affine_width
            before = Nk * (1 + ng) * d * d + pairs * (1 + ng) * d
            after = Nq * d * d + pairs * H * (1 + d + p) + Nq * ng * d * p
            return after < before
        return (Nk - Nq) * self.dim > pairs * (self.heads - 1)

    def _mix_terms(self, c_hat: Tensor, gamma: Tensor) -> Tuple[Tensor, Tensor]:
        r"""The factors of the mixing term :math:`W_{\mathrm{mix}} \mathrm{stack}_l[\gamma_l M_l
        \hat{c}]` of rows :obj:`c_hat` :math:`(N, H, d_k)` with gates :obj:`gamma`
        :math:`(N, L)`: the coefficients :math:`W_{\mathrm{mix}}[g, l] \gamma_l`
        :math:`(N, n_g, L)` and the rows :math:`M_l \hat{c}` :math:`(N, L, d)` (heads
        concatenated), whose batched product is the term."""
        N, H, dk = c_hat.shape
        L = self.num_matrix_generators
        mc = torch.einsum('nhd,hled->nlhe', c_hat, self.matrix_gens.to(c_hat.dtype))
        coef = self.mix.to(c_hat.dtype) * gamma.to(c_hat.dtype).unsqueeze(1)  # (N, ng, L)
        return coef, mc.reshape(N, L, H * dk)

    def _mz_generators(self, g_agg: Tensor, c_hat: Tensor, gamma: Tensor) -> Tensor:
        r"""The output generators of the ``'mz'`` operator,
        :math:`\hat{G}_i M_c^\top + W_{\mathrm{mix}} \mathrm{stack}_l[\gamma_l M_l \hat{c}_i]`,
        in the token layout :math:`(N_q, n_g, d)` (heads concatenated in each row), with the
        gates :obj:`gamma` :math:`(N_q, L)` of each query's set: the mixing term added to the
        aggregated generators as one batched product of :math:`(n_g \times L)` coefficients
        :math:`W_{\mathrm{mix}}[g, l] \gamma_l` with the :math:`(L \times d)` rows
        :math:`M_l \hat{c}` (no generator-sized intermediate). Used when the value map acts
        after the aggregation; before it, the term joins the values (:meth:`_aggregate`)."""
        Nq, H, ng, dk = g_agg.shape
        coef, mc = self._mix_terms(c_hat, gamma)  # (Nq, ng, L), (Nq, L, d)
        g_t = g_agg.transpose(1, 2)  # (Nq, ng, H, dk)
        if g_t.stride(2) == dk * g_t.stride(3):  # a view of the token layout (values before)
            # out of place: reads the view once and writes a fresh tensor (never a view)
            return _mix_product(coef, mc, add=g_t.reshape(Nq, ng, H * dk))
        out_g = g_agg.new_empty(Nq, ng, H * dk)  # (Nq, ng, d), one copy into the layout
        out_g.view(Nq, ng, H, dk).copy_(g_t)
        return _mix_product(coef, mc, add=out_g, inplace=True)

    def _context(self, out_c: Tensor, out_g: Tensor, c_hat: Tensor, g_hat: Optional[Tensor],
                 mu: Tensor, query_set: Tensor) -> Tuple[Tensor, Tensor]:
        H, dk = self.heads, self.head_dim
        Nq = out_c.size(0)
        if self.value == 'film':
            scale = 1.0 + self.film_scale(mu)[query_set].view(Nq, H, dk)  # (Nq, H, dk)
            shift = self.film_shift(mu)[query_set].view(Nq, H, dk)  # (Nq, H, dk)
            return out_c * scale + shift, out_g * scale.unsqueeze(2)
        # hypernet: (W + U(mu) V) acts on the center and, row-wise, on the generators
        assert g_hat is not None  # the hypernet value keeps the aggregated generators
        u = self.hyper_u(mu)[query_set].view(Nq, H, dk, self.rank)  # (Nq, H, dk, r)
        hv = self.hyper_v.to(c_hat.dtype)
        u = u.to(c_hat.dtype)
        vc = torch.einsum('nhd,hrd->nhr', c_hat, hv)  # (Nq, H, r)
        vg = torch.einsum('nhgd,hrd->nhgr', g_hat, hv)  # (Nq, H, ng, r)
        out_c = out_c + torch.einsum('nher,nhr->nhe', u, vc)  # (Nq, H, dk)
        out_g = out_g + torch.einsum('nher,nhgr->nhge', u, vg)  # (Nq, H, ng, dk)
        return out_c, out_g

    def __repr__(self) -> str:
        extra = ''
        if self.value == 'mz':
            extra = f', L={self.num_matrix_generators}, summary={self.summary}'
        elif self.value == 'hypernet':
            extra = f', rank={self.rank}, summary={self.summary}'
        elif self.value == 'film':
            extra = f', summary={self.summary}'
        return (f'{self.__class__.__name__}({self.dim}, heads={self.heads}, '
                f'num_generators={self.num_generators}, value={self.value}{extra}, '
                f'dropout={self.dropout}, log_n={self.log_n}'
                f'{"" if getattr(self, "fold_keys", True) else ", fold_keys=False"})')
