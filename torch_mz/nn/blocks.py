r"""Set Transformer blocks on zonotope tokens in PyG's flat layout: MAB, SAB, ISAB and PMA
(Lee et al., 2019, with the MZ value operator of Section 2.4 of the MZAttn paper).

Every block takes a :class:`~torch_mz.nn.zonotope.Zonotope` of tokens, the set id of each token
(``set_id``, PyG's ``batch``/``index`` vector, need not be sorted) and the number of sets. The
blocks are the inner loop and do not check the set ids (a check of their values would cost a
host synchronisation per block): pass ids that :func:`~torch_mz.nn.aggr.resolve_set_index`
(or :meth:`MZAggregation.validate <torch_mz.nn.MZAggregation.validate>`) returned, a long
tensor with one id in ``[0, num_sets)`` per token; other ids fail inside PyTorch's kernels.
Learned inducing points (ISAB) and seeds (PMA) are replicated per set, so ISAB costs
:math:`O(m N)` and PMA :math:`O(k N)`; SAB costs :math:`O(\sum_b n_b^2)`.

Post-norm as in the Set Transformer. For the generators:

* residual connections add generator slots row by row;
* LayerNorm maps generators by its Jacobian at the center
  (:func:`~torch_mz.nn.zonotope.zonotope_layer_norm`);
* the MAB feed-forward on generators is a lighter network (width :math:`d_{ff}/2`) applied to each
  generator row, :math:`G \mapsto G + \tanh(G W_1^\top) W_2^\top`, bias-free with an odd
  activation, so zero generators stay zero and a generator's sign flip (which leaves the zonotope
  unchanged) flips its image;
* PMA's row-wise feed-forward :math:`\mathrm{rFF}` (no residual, as in the Set Transformer) is
  paired, as everywhere in the paper (Appendix A.1), with the lighter generator feed-forward on
  the generator rows: :math:`G \mapsto \tanh(G W_1^\top) W_2^\top`.
"""
from typing import Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import LayerNorm, Linear, Module, Parameter

from torch_mz._checks import check_count, check_rate
from torch_mz.nn.attention import MZAttention, check_token_dtype, check_token_sets
from torch_mz.nn._context import _hooked, _plain_ops
from torch_mz.nn.functional import dropout, repeat_per_set
from torch_mz.nn.fused import odd_tanh_, use_fused_kernels
from torch_mz.nn.zonotope import MappedZonotope, Zonotope, zonotope_layer_norm


class _FeedForwardFn(torch.autograd.Function):
    r""":math:`W_2\,\mathrm{GELU}(W_1 c + b_1) + b_2` keeping only :math:`c` and
    :math:`h = W_1 c + b_1` for the backward pass, where :math:`\mathrm{GELU}(h)` is recomputed
    (autograd through the three operations keeps :math:`\mathrm{GELU}(h)` too: one more
    :math:`(N, d_{ff})` tensor per block until the backward pass). The same operations as
    :meth:`FeedForward.forward`'s plain path, so the values are the same; the tests check values
    and gradients against it."""
    @staticmethod
    def forward(ctx, c: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
        h = F.linear(c, w1, b1)
        ctx.save_for_backward(c, h, w1, b1, w2)
        return F.linear(F.gelu(h), w2, b2)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        c, h, w1, b1, w2 = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True (e.g. forces trained from an energy):
            # h, made inside forward, is not connected to c, w1 and b1; recompute it so the
            # second derivative sees every path (the operations below are differentiable)
            h = F.linear(c, w1, b1)
        go = grad_out.reshape(-1, grad_out.size(-1))  # (N, d)
        a = F.gelu(h).reshape(-1, h.size(-1))  # (N, d_ff)
        grad_h = torch.ops.aten.gelu_backward(go @ w2, h.reshape(-1, h.size(-1)))  # (N, d_ff)
        need = ctx.needs_input_grad
        grad_c = (grad_h @ w1).view_as(c) if need[0] else None
        grad_w1 = grad_h.t() @ c.reshape(-1, c.size(-1)) if need[1] else None
        grad_b1 = grad_h.sum(dim=0) if need[2] else None
        grad_w2 = go.t() @ a if need[3] else None
        grad_b2 = go.sum(dim=0) if need[4] else None
        return grad_c, grad_w1, grad_b1, grad_w2, grad_b2


class FeedForward(Module):
    r"""Row-wise feed-forward :math:`W_2\,\mathrm{GELU}(W_1 c + b_1) + b_2` on centers.

    In training (gradients on, no :func:`torch.autocast`, not under :func:`torch.compile`,
    :mod:`torch.func` transforms, tracing or an open forward-mode AD level, no hooks on its
    layers, which must see their own calls, see :func:`_hooked`) it keeps only its input and
    the pre-activation for the backward pass and recomputes the GELU there
    (:class:`_FeedForwardFn`); otherwise it runs the three operations as they are."""
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        dim, hidden = check_count('dim', dim), check_count('hidden', hidden)
        self.lin1 = Linear(dim, hidden)
        self.lin2 = Linear(hidden, dim)
        self.reset_parameters()

    def reset_parameters(self):
        for lin in (self.lin1, self.lin2):
            torch.nn.init.xavier_uniform_(lin.weight)
            torch.nn.init.zeros_(lin.bias)

    def forward(self, c: Tensor) -> Tensor:
        if (torch.is_grad_enabled() and not torch.is_autocast_enabled(c.device.type)
                and not torch.compiler.is_compiling()
                and (c.requires_grad or self.lin1.weight.requires_grad)
                and not (_hooked(self.lin1) or _hooked(self.lin2))
                and not _plain_ops()  # torch.func, forward-mode AD: the plain operations
                and not torch.jit.is_tracing()):
            return _FeedForwardFn.apply(c, self.lin1.weight, self.lin1.bias, self.lin2.weight,
                                        self.lin2.bias)
        return self.lin2(F.gelu(self.lin1(c)))

    def hidden(self, c: Tensor) -> Tensor:
        r"""The hidden layer :math:`\mathrm{GELU}(W_1 c + b_1)`, before the last map."""
        return F.gelu(self.lin1(c))


class GeneratorFeedForward(Module):
    r"""The lighter generator feed-forward :math:`G \mapsto \tanh(G W_1^\top) W_2^\top`, applied to
    each generator row; bias-free and odd."""
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        dim, hidden = check_count('dim', dim), check_count('hidden', hidden)
        self.lin1 = Linear(dim, hidden, bias=False)
        self.lin2 = Linear(hidden, dim, bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        for lin in (self.lin1, self.lin2):
            torch.nn.init.xavier_uniform_(lin.weight)

    def forward(self, gens: Tensor) -> Tensor:
        return self.lin2(self.hidden(gens))

    def hidden(self, gens: Tensor) -> Tensor:
        r"""The hidden layer :math:`\tanh(G W_1^\top)`, before the last map :math:`W_2` (the
        tanh in place on the product, whose backward pass keeps its inputs, not it: one
        generator-sized allocation fewer, the same values). Large CPU float32 inputs take the
        compiled, exactly odd kernel of :class:`~torch_mz.nn.fused.OddTanhFused` (relative
        error within 4 float32 epsilons of :func:`torch.tanh`; the mode of
        :func:`~torch_mz.nn.fused.set_fused_kernels` decides, and in auto mode only where
        :func:`~torch_mz.nn.fused.tanh_kernel_faster` measured the kernel faster on the
        host)."""
        return odd_tanh_(self.lin1(gens))


class LearnedTokens(Module):
    r"""A bank of :obj:`num` learned zonotope tokens (inducing points or seeds), replicated for
    every set. Centers are Xavier-initialised, generators start at zero."""
    def __init__(self, num: int, dim: int, num_generators: int, name: str = 'num'):
        super().__init__()
        num = check_count(name, num)
        dim, num_generators = check_count('dim', dim), check_count('num_generators',
                                                                  num_generators, 0)
        self.num = num
        self.center = Parameter(torch.empty(num, dim))
        self.gens = Parameter(torch.empty(num, num_generators, dim))
        self.reset_parameters()

    def reset_parameters(self):
        torch.nn.init.xavier_uniform_(self.center)
        torch.nn.init.zeros_(self.gens)

    def forward(self, num_sets: int, like: Tensor):
        r"""Returns the tokens of all sets (set-major: row :obj:`b * num + s`) and their set ids."""
        center = self.center.to(like.dtype)  # (num, d)
        if self.gens.numel() == 0 and self.gens.requires_grad and torch.is_grad_enabled():
            # no generators: the blocks drop the empty bank, which then got no gradient, and
            # DistributedDataParallel (find_unused_parameters=False) failed at the next step;
            # joined to the centers as its sum, nothing (the same values), it gets its empty one
            # (subtracted: c - (+0.0) is c for every c, where c + 0.0 turned -0.0 into +0.0)
            center = center - self.gens.sum().to(like.dtype)
        center = center.repeat(num_sets, 1)  # (B * num, d)
        gens = self.gens.to(like.dtype).repeat(num_sets, 1, 1)  # (B * num, n_g, d)
        return Zonotope(center, gens), repeat_per_set(num_sets, self.num, like.device)


class MAB(Module):
    r"""Multihead attention block on zonotope tokens:

    .. math::
        H = \mathrm{LN}(X + \mathrm{Att}(X, Y)),\qquad
        \mathrm{MAB}(X, Y) = \mathrm{LN}(H + \mathrm{FFN}(H)),

    with generators :math:`G_H = G_X + o_G` and :math:`G_{out} = G_H + \mathrm{FFN}_G(G_H)`
    mapped through the LayerNorms by their Jacobians (see the module docstring).

    Args:
        dim (int): Token width :math:`d`.
        heads (int): Number of heads (default: :obj:`4`).
        num_generators (int): Generator budget :math:`n_g` (default: :obj:`8`).
        d_ff (int): Width of the center FFN; the generator FFN has width
            :obj:`max(1, d_ff // 2)` (default: :obj:`128`).
        value (str): Value operator of the attention (default: :obj:`'mz'`).
        num_matrix_generators (int): :math:`L` (default: :obj:`4`).
        rank (int): HyperNet rank (default: :obj:`8`).
        summary (str): Gate summary (default: :obj:`'mean'`).
        dropout (float): Dropout on attention weights and on the FFN output (default:
            :obj:`0.0`).
        log_n (bool): :math:`\log n` logit scaling (default: :obj:`False`).
        path (str): Attention kernel (default: :obj:`'auto'`).
        recompute (bool): Recompute the attention's projections and kernel in the backward
            pass (see :class:`~torch_mz.nn.attention.MZAttention`) (default: :obj:`False`).
        fold_keys (bool): Let the attention fold its key map into the queries where that is
            cheaper (see :class:`~torch_mz.nn.attention.MZAttention`; the same values up to
            rounding) (default: :obj:`True`).

    Shapes:
        - **input:** queries :math:`(N_q, d), (N_q, n_g, d)`; keys/values
          :math:`(N_k, d), (N_k, n_g, d)`; set ids :math:`(N_q,)`, :math:`(N_k,)`
        - **output:** :math:`(N_q, d), (N_q, n_g, d)`
    """
    def __init__(self, dim: int, heads: int = 4, num_generators: int = 8, d_ff: int = 128,
                 value: str = 'mz', num_matrix_generators: int = 4, rank: int = 8,
                 summary: str = 'mean', dropout: float = 0.0, log_n: bool = False,
                 path: str = 'auto', recompute: bool = False, fold_keys: bool = True):
        super().__init__()
        d_ff = check_count('d_ff', d_ff)
        dropout = check_rate('dropout', dropout)
        self.dim = dim
        self.d_ff = d_ff
        self.dropout = dropout
        self.attn = MZAttention(dim, heads, num_generators, value, num_matrix_generators, rank,
                                summary, dropout, log_n, path, recompute=recompute,
                                fold_keys=fold_keys)
        self.norm1 = LayerNorm(dim)
        self.norm2 = LayerNorm(dim)
        self.ffn = FeedForward(dim, d_ff)
        # Plain vector tokens (n_g = 0) need no generator FFN.
        self.ffn_gens = (GeneratorFeedForward(dim, max(1, d_ff // 2))
                         if num_generators > 0 else None)

    def reset_parameters(self):
        for module in (self.attn, self.norm1, self.norm2, self.ffn, self.ffn_gens):
            if module is not None:
                module.reset_parameters()

    def forward(self, query: Zonotope, key_value: Union[Zonotope, MappedZonotope],
                query_set: Tensor, kv_set: Tensor, num_sets: int) -> Zonotope:
        if query.num_generators != self.attn.num_generators:
            # (the residual sum G_X + o_G adds generator slots row by row: a query with one
            # generator would be broadcast to every slot, and the block's budget would drop it)
            raise ValueError(f"Expected query tokens with {self.attn.num_generators} generators, "
                             f"the block's budget (got {query.num_generators})")
        # (the queries meet norm1 in the residual sum, uncast by autocast)
        check_token_dtype(self.attn.weight.dtype, query, layer_norm=True)
        attended = self.attn(query, key_value, query_set, kv_set, num_sets)
        # In inference the residual sums are formed inside the compiled LayerNorm kernels; in
        # training they are written out, as before: there the kernels would keep both summands
        # for the backward pass (for the first LayerNorm the attention's output, a view of a
        # wider tensor, and the first block's query generators, otherwise freed), and an A/B of
        # the `mz` training step separated neither a gain in time nor a change of the peak from
        # the host's noise (peaks of 1,880-2,200 MiB between runs of the same code)
        fuse_sums = not torch.is_grad_enabled()
        h = (zonotope_layer_norm(query, self.norm1, add=attended) if fuse_sums
             else zonotope_layer_norm(query + attended, self.norm1))
        f_c = dropout(self.ffn(h.center), self.dropout, self.training)
        if self.ffn_gens is not None:
            f_g = self.ffn_gens(h.gens)
            if fuse_sums and use_fused_kernels(h.gens):
                # the residual sum formed inside the compiled LayerNorm kernels (other dtypes
                # fall back to the written-out sum there)
                return zonotope_layer_norm(h, self.norm2, add=Zonotope(f_c, f_g))
            # the residual joins the generator FFN's output in place (a fresh tensor, which
            # the backward pass of its last product does not keep): one (N, n_g, d) allocation
            # fewer, the same sum; out of place where autocast gave the output a lower precision
            gens = f_g.add_(h.gens) if f_g.dtype == h.gens.dtype else h.gens + f_g
        else:  # no generators (n_g = 0): nothing to map
            gens = h.gens
        return zonotope_layer_norm(Zonotope(h.center + f_c, gens), self.norm2)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.attn}, d_ff={self.d_ff})'


class SAB(Module):
    r"""Set attention block :math:`\mathrm{SAB}(X) = \mathrm{MAB}(X, X)`, permutation-equivariant
    inside each set; cost :math:`O(\sum_b n_b^2)`. Arguments as :class:`MAB`."""
    def __init__(self, dim: int, **kwargs):
        super().__init__()
        self.mab = MAB(dim, **kwargs)

    def reset_parameters(self):
        self.mab.reset_parameters()

    def forward(self, x: Zonotope, set_id: Tensor, num_sets: int) -> Zonotope:
        return self.mab(x, x, set_id, set_id, num_sets)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.mab.attn}, d_ff={self.mab.d_ff})'


class ISAB(Module):
    r"""Induced set attention block
    :math:`\mathrm{ISAB}_m(X) = \mathrm{MAB}(X, \mathrm{MAB}(I, X))` with :obj:`num_inducing`
    learned inducing tokens :math:`I` per set; permutation-equivariant inside each set; cost
    :math:`O(m N)`. Other arguments as :class:`MAB`."""
    def __init__(self, dim: int, num_inducing: int = 16, num_generators: int = 8, **kwargs):
        super().__init__()
        self.num_inducing = num_inducing
        self.inducing = LearnedTokens(num_inducing, dim, num_generators, 'num_inducing')
        self.mab1 = MAB(dim, num_generators=num_generators, **kwargs)
        self.mab2 = MAB(dim, num_generators=num_generators, **kwargs)

    def reset_parameters(self):
        for module in (self.inducing, self.mab1, self.mab2):
            module.reset_parameters()

    def forward(self, x: Zonotope, set_id: Tensor, num_sets: int) -> Zonotope:
        check_token_sets(set_id, x.num_tokens, num_sets)
        inducing, inducing_set = self.inducing(num_sets, x.center)  # (B * m, d)
        h = self.mab1(inducing, x, inducing_set, set_id, num_sets)  # (B * m, d)
        return self.mab2(x, h, set_id, inducing_set, num_sets)  # (N, d)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(num_inducing={self.num_inducing}, {self.mab1.attn}, '
                f'd_ff={self.mab1.d_ff})')


class PMA(Module):
    r"""Pooling by multihead attention :math:`\mathrm{PMA}_k(X) = \mathrm{MAB}(S, \mathrm{rFF}(X))`
    with :obj:`num_seeds` learned seed tokens :math:`S` per set; permutation-invariant inside each
    set; cost :math:`O(k N)`. The output holds :math:`k` tokens per set, set-major (row
    :obj:`b * k + s`), also for empty sets (whose seeds attend to nothing). Other arguments as
    :class:`MAB`.

    Computed in a cheaper, exact order: the generator rFF's last linear map acts after the
    attention-weighted sum, on the :math:`B k` pooled rows, instead of on all :math:`N n_g`
    generator rows (:class:`~torch_mz.nn.zonotope.MappedZonotope`); where :math:`d_{ff} \le d`
    the center rFF's last map joins the attention's key and value maps (and the set mean of its
    gates), one :math:`(d, d_{ff})` product per key instead of :math:`W_2` and a
    :math:`(d, d)` one. Measured (one core, forward
    + backward, in-process alternation, medians of 8): 32 sets of 1,024 tokens, :math:`d = 64`,
    :math:`n_g = 8`, :math:`d_{ff} = 128`: 530 -> 371 ms (inference 213 -> 148 ms); 10,000 sets of
    10, :math:`d = 16`, :math:`n_g = 2`, :math:`d_{ff} = 16`: 162 -> 122 ms (inference 56 -> 53 ms).
    """
    def __init__(self, dim: int, num_seeds: int = 1, num_generators: int = 8,
                 d_ff: int = 128, **kwargs):
        super().__init__()
        self.num_seeds = num_seeds
        self.seeds = LearnedTokens(num_seeds, dim, num_generators, 'num_seeds')
        self.rff = FeedForward(dim, d_ff)
        self.rff_gens = (GeneratorFeedForward(dim, max(1, d_ff // 2))
                         if num_generators > 0 else None)
        self.mab = MAB(dim, num_generators=num_generators, d_ff=d_ff, **kwargs)

    def reset_parameters(self):
        for module in (self.seeds, self.rff, self.rff_gens, self.mab):
            if module is not None:
                module.reset_parameters()

    def forward(self, x: Zonotope, set_id: Tensor, num_sets: int) -> Zonotope:
        attn = self.mab.attn
        if x.dim != attn.dim or x.num_generators != attn.num_generators:
            # (before the rFF, whose product would fail without naming the tokens)
            raise ValueError(f"Expected tokens of width {attn.dim} with {attn.num_generators} "
                             f"generators (got width {x.dim}, {x.num_generators} generators)")
        # (before the rFF, as above; the seeds take the tokens' dtype and meet the LayerNorms)
        check_token_dtype(attn.weight.dtype, x, layer_norm=True)
        check_token_sets(set_id, x.num_tokens, num_sets)
        seeds, seed_set = self.seeds(num_sets, x.center)  # (B * k, d)
        ffn, rff = self.rff_gens, self.rff
        # The feed-forwards' last maps W_2 are linear (the center's with a bias), and the
        # attention uses the key/value generators only through the attention-weighted sum and
        # the value map, the centers only through the key and value maps and the set mean: each
        # W_2 joins the maps it meets, which then act on the hidden rows (generators: on the B k
        # pooled rows instead of all N n_g generator rows; centers: one (d, d_ff) product per
        # key instead of W_2 and a (d, d) one, cheaper where d_ff <= d). Exact up to rounding.
        # Layers with hooks (e.g. torch.nn.utils.prune's) run as they are, and so do the
        # feed-forwards with hooks of their own (the fold never calls them).
        # (a hooked key map must see the centers: then they are written out)
        fold_center = (not _hooked(rff) and not _hooked(rff.lin2)
                       and not _hooked(self.mab.attn.lin_k)
                       and rff.lin2.weight.size(1) <= rff.lin2.weight.size(0))
        if ffn is None or _hooked(ffn) or _hooked(ffn.lin2):
            gens = x.gens if ffn is None else ffn(x.gens)  # (N, n_g, d)
            if not fold_center:
                return self.mab(seeds, Zonotope(rff(x.center), gens), seed_set, set_id,
                                num_sets)
            hidden, weight = gens, torch.eye(gens.size(-1), dtype=gens.dtype,
                                             device=gens.device)  # W_2 = I: nothing to fold
        else:
            hidden, weight = ffn.hidden(x.gens), ffn.lin2.weight
        if fold_center:
            kv = MappedZonotope(rff.hidden(x.center), hidden, weight, rff.lin2.weight,
                                rff.lin2.bias)
        else:
            kv = MappedZonotope(rff(x.center), hidden, weight)
        return self.mab(seeds, kv, seed_set, set_id, num_sets)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(num_seeds={self.num_seeds}, {self.mab.attn}, '
                f'd_ff={self.mab.d_ff})')
