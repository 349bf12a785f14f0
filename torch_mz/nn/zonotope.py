r"""Zonotope tokens and the input projection of MZAttn (Section 2.2 of the paper).

A token is a zonotope :math:`\mathcal{Z} = \{c + \sum_g \alpha_g G_g : \alpha_g \in [-1, 1]\}` with
center :math:`c \in \mathbb{R}^d` and :math:`n_g` generator rows :math:`G_g \in \mathbb{R}^d`.
"""
import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import LayerNorm, Linear, Module

from torch_mz._checks import check_count
from torch_mz.nn._context import _hooked, _plain_ops
from torch_mz.nn.fused import (LayerNormJacobianFused, LayerNormJacobianSumFused,
                               _kernels_requested)


class _Tokens:
    r"""What token batches with a center :math:`(N, d)` share."""
    __slots__ = ('center', )
    center: Tensor

    @property
    def num_tokens(self) -> int:
        return self.center.size(0)

    @property
    def dim(self) -> int:
        return self.center.size(1)


class Zonotope(_Tokens):
    r"""A batch of zonotope tokens: centers :obj:`center` of shape :obj:`(N, d)` and generators
    :obj:`gens` of shape :obj:`(N, n_g, d)` (row :obj:`g` of token :obj:`i` is generator :obj:`g`).

    Operations (all exact for zonotopes):

    * a linear map :math:`A` with bias :math:`b` acts as :math:`(A c + b, G A^\top)`, the bias on the
      center only (:meth:`linear`);
    * addition adds centers and adds generator slots row by row, keeping the fixed budget
      :math:`n_g` (:meth:`__add__`);
    * the interval-hull width :math:`\mathrm{IHW} = \sum_g |G_g|` is a vector in
      :math:`\mathbb{R}^d` (:meth:`ihw`); :meth:`signed_sum` is :math:`\sum_g G_g`.
    """
    __slots__ = ('gens', )

    def __init__(self, center: Tensor, gens: Tensor):
        if center.dim() != 2 or gens.dim() != 3:
            raise ValueError(f"Expected 'center' of shape (N, d) and 'gens' of shape (N, n_g, d) "
                             f"(got {tuple(center.shape)} and {tuple(gens.shape)})")
        if gens.size(0) != center.size(0) or gens.size(2) != center.size(1):
            raise ValueError(f"Shapes of 'center' {tuple(center.shape)} and 'gens' "
                             f"{tuple(gens.shape)} do not match")
        self.center = center
        self.gens = gens

    @property
    def num_generators(self) -> int:
        return self.gens.size(1)

    def linear(self, weight: Tensor, bias: Optional[Tensor] = None) -> 'Zonotope':
        r"""The image under :math:`x \mapsto W x + b`: :math:`(W c + b, G W^\top)`."""
        return Zonotope(F.linear(self.center, weight, bias), F.linear(self.gens, weight))

    def __add__(self, other: 'Zonotope') -> 'Zonotope':
        if not isinstance(other, Zonotope):
            return NotImplemented
        return Zonotope(self.center + other.center, self.gens + other.gens)

    def __getitem__(self, idx: Union[Tensor, slice]) -> 'Zonotope':
        return Zonotope(self.center[idx], self.gens[idx])

    def ihw(self) -> Tensor:
        r"""Interval-hull half-width :math:`\sum_g |G_g|`, shape :obj:`(N, d)`."""
        return self.gens.abs().sum(dim=1)

    def signed_sum(self) -> Tensor:
        r"""Signed generator sum :math:`\sum_g G_g`, shape :obj:`(N, d)`."""
        return self.gens.sum(dim=1)

    def to(self, *args, **kwargs) -> 'Zonotope':
        return Zonotope(self.center.to(*args, **kwargs), self.gens.to(*args, **kwargs))

    def __repr__(self) -> str:
        return (f'Zonotope(num_tokens={self.num_tokens}, dim={self.dim}, '
                f'num_generators={self.num_generators})')



def _version(t: Tensor) -> Optional[int]:
    r"""The version counter of :obj:`t` (:obj:`None` for an inference tensor, made under
    :func:`torch.inference_mode`, which keeps none; not asked under :func:`torch.compile`, where
    the question breaks the graph and no inference tensor is traced)."""
    if not torch.compiler.is_compiling() and t.is_inference():
        return None
    return t._version


class AffineZonotope(Zonotope):
    r"""Zonotope tokens whose generators are an affine function of narrow input rows, as the
    input projection makes them: :math:`G_i[g] = A_g u_i + b_g` with :obj:`inputs` :math:`u`
    :math:`(N, p)`, :obj:`gen_weight` :math:`A` :math:`(n_g, d, p)` and :obj:`gen_bias`
    :math:`b` :math:`(n_g, d)` (or :obj:`None`). The generators :obj:`gens` are given too (formed
    once), so every operator takes these tokens as a plain :class:`Zonotope`, and every
    operation on them gives one.

    The description lets the key/value side of :class:`~torch_mz.nn.attention.MZAttention`,
    where generators meet only the attention-weighted sum and the value map, aggregate the
    :math:`p` input columns (and the attention mass, for the bias) instead of the
    :math:`n_g d` generator columns, and map the result after:
    :math:`\sum_j a_{ij} G_j[g] = A_g \sum_j a_{ij} u_j + b_g \sum_j a_{ij}`, exact up to
    rounding. With point coordinates (:math:`p = 3`) and the paper's :math:`n_g d = 512` this is
    most of the first inducing-point attention of an ISAB encoder. The description holds for the
    generators it was made with: once :obj:`gens` is replaced or changed in place
    (:meth:`describes_gens` is then :obj:`False`), attention uses the generators themselves.
    """
    __slots__ = ('inputs', 'gen_weight', 'gen_bias', '_formed')

    def __init__(self, center: Tensor, gens: Tensor, inputs: Tensor, gen_weight: Tensor,
                 gen_bias: Optional[Tensor] = None):
        super().__init__(center, gens)
        N, ng, d = gens.shape
        if (inputs.dim() != 2 or inputs.size(0) != N
                or tuple(gen_weight.shape) != (ng, d, inputs.size(1))
                or (gen_bias is not None and tuple(gen_bias.shape) != (ng, d))):
            raise ValueError(f"Expected 'inputs' ({N}, p), 'gen_weight' ({ng}, {d}, p) and "
                             f"'gen_bias' ({ng}, {d}) (got {tuple(inputs.shape)}, "
                             f"{tuple(gen_weight.shape)} and "
                             f"{None if gen_bias is None else tuple(gen_bias.shape)})")
        self.inputs = inputs
        self.gen_weight = gen_weight
        self.gen_bias = gen_bias
        self._formed = (gens, _version(gens), _version(inputs))

    def describes_gens(self) -> bool:
        r"""Whether :obj:`gens` and :obj:`inputs` are still the tensors the description was made
        with, unchanged (an in-place change of an inference tensor, which keeps no version
        counter, is not seen)."""
        gens, version, inputs_version = self._formed
        return (self.gens is gens and (version is None or gens._version == version)
                and (inputs_version is None or self.inputs._version == inputs_version))


class MappedZonotope(_Tokens):
    r"""Zonotope tokens whose generators (and optionally centers) are given before a last linear
    map: :obj:`hidden` :math:`(N, n_g, h)` and :obj:`weight` :math:`(d, h)` (no bias) stand for
    the generators ``hidden @ weight.T`` without forming the :math:`(N, n_g, d)` product. Centers
    are :obj:`center` :math:`(N, d)`, or, with :obj:`center_weight` :math:`(d, h_c)` (and
    optionally :obj:`center_bias` :math:`(d,)`), :obj:`center` holds their hidden rows
    :math:`(N, h_c)` and the centers are ``center @ center_weight.T + center_bias``
    (:meth:`center_rows`).

    Only an operator that uses the tokens linearly can take it: the key/value side of
    :class:`~torch_mz.nn.attention.MZAttention`, where generators meet only the
    attention-weighted sum and the value map, and centers only the key map, the value map and
    the set mean, so each map joins the one it meets, exactly up to rounding. The PMA passes the
    hidden layers of its feed-forwards this way (:class:`~torch_mz.nn.blocks.PMA`).
    :meth:`materialize` gives the plain :class:`Zonotope`.
    """
    __slots__ = ('hidden', 'weight', 'center_weight', 'center_bias')

    def __init__(self, center: Tensor, hidden: Tensor, weight: Tensor,
                 center_weight: Optional[Tensor] = None, center_bias: Optional[Tensor] = None):
        if (center.dim() != 2 or hidden.dim() != 3 or weight.dim() != 2
                or (center_weight is not None and center_weight.dim() != 2)):
            raise ValueError(f"Expected 'center' (N, d) or (N, h_c), 'hidden' (N, n_g, h), "
                             f"'weight' (d, h) and 'center_weight' (d, h_c) (got "
                             f"{tuple(center.shape)}, {tuple(hidden.shape)} and "
                             f"{tuple(weight.shape)})")
        d = weight.size(0)
        width = center.size(1) if center_weight is None else center_weight.size(0)
        if (hidden.size(0) != center.size(0) or width != d or weight.size(1) != hidden.size(2)
                or (center_weight is not None and center_weight.size(1) != center.size(1))
                or (center_bias is not None and (center_weight is None
                                                 or tuple(center_bias.shape) != (d, )))):
            raise ValueError(f"Shapes of 'center' {tuple(center.shape)}, 'hidden' "
                             f"{tuple(hidden.shape)}, 'weight' {tuple(weight.shape)} and the "
                             f"center's map do not match")
        self.center = center
        self.hidden = hidden
        self.weight = weight
        self.center_weight = center_weight
        self.center_bias = center_bias

    @property
    def dim(self) -> int:
        return self.weight.size(0)

    @property
    def num_generators(self) -> int:
        return self.hidden.size(1)

    def center_rows(self):
        r"""``(rows, weight, bias)`` with centers ``rows @ weight.T + bias``; :obj:`weight` and
        :obj:`bias` are :obj:`None` where the centers are given as they are."""
        return self.center, self.center_weight, self.center_bias

    def centers(self) -> Tensor:
        r"""The centers :math:`(N, d)`."""
        if self.center_weight is None:
            return self.center
        return F.linear(self.center, self.center_weight, self.center_bias)

    def materialize(self) -> Zonotope:
        r"""The tokens as a :class:`Zonotope`, :math:`(c, H W^\top)`."""
        return Zonotope(self.centers(), F.linear(self.hidden, self.weight))

    def __repr__(self) -> str:
        return (f'MappedZonotope(num_tokens={self.num_tokens}, dim={self.dim}, '
                f'num_generators={self.num_generators}, hidden={self.hidden.size(-1)}'
                + ('' if self.center_weight is None else
                   f', center_hidden={self.center.size(-1)}') + ')')


def _feature_means(t: Tensor, c_hat: Tensor):
    r"""The feature means of :obj:`t` :math:`(N, n_g, d)` and of :math:`\hat{c} \odot t`, each
    :math:`(N, n_g)`."""
    return t.mean(dim=-1), (t * c_hat.unsqueeze(1)).mean(dim=-1)


def _sub_rank_two(out: Tensor, a0: Tensor, b0: Tensor, a1: Tensor, b1: Tensor) -> Tensor:
    r"""In place, :math:`out \mathrel{-}= a_0 \otimes b_0 + a_1 \otimes b_1` for :math:`a_i`
    :math:`(N, n_g)` and :math:`b_i` :math:`(N, d)`."""
    out.addcmul_(a0.unsqueeze(-1), b0.unsqueeze(1), value=-1.0)
    return out.addcmul_(a1.unsqueeze(-1), b1.unsqueeze(1), value=-1.0)


def _weighted_row_sum(t: Tensor, w: Tensor) -> Tensor:
    r""":math:`\sum_g w_g t_g`, :math:`(N, d)`, for :obj:`t` :math:`(N, n_g, d)` and :obj:`w`
    :math:`(N, n_g)`."""
    return (t * w.unsqueeze(-1)).sum(dim=1)


def _layer_norm_stats(xc: Tensor, inv: Tensor, weight: Optional[Tensor]):
    r"""From the centered center :obj:`xc` :math:`(N, d)` and :math:`1/\sigma` :obj:`inv`
    :math:`(N, 1)`: :math:`\hat{c}`, its feature mean (zero up to rounding) and the scale
    :math:`s = w / \sigma` :math:`(N, d)`."""
    N, d = xc.shape
    c_hat = xc * inv  # (N, d)
    a = c_hat.mean(dim=-1, keepdim=True)  # (N, 1)
    s = (inv if weight is None else inv * weight).expand(N, d)  # (N, d)
    return c_hat, a, s


class _LayerNormJacobian(torch.autograd.Function):
    r"""The generator map of :func:`zonotope_layer_norm` with a hand-written backward.

    Forward and backward each take a few passes over the :math:`(N, n_g, d)` generators and keep
    only the generators, the center, :math:`1/\sigma` and two :math:`(N, n_g)` means for the
    backward, where the other per-token vectors are recomputed (autograd through the
    elementwise formula keeps five tensors of the generators' size and takes several times as
    many passes).
    The reductions and rank-two corrections run elementwise. (Earlier versions used two-column
    batched matrix products and an in-place :func:`torch.baddbmm` for :math:`n_g \ge 4`,
    :math:`d \ge 32`; on the AMD EPYC host of 2026-12-01 those were 1.3-2.0x slower forward +
    backward in every measured shape, (32768, 2-16, 64) and (10^5, 4-8, 16-32).)
    :func:`zonotope_layer_norm_reference` is the autograd reference; the tests check values and
    gradients (first and second order) against it in float64.
    """
    @staticmethod
    def forward(ctx, c: Tensor, g: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
        xc = c - c.mean(dim=-1, keepdim=True)  # (N, d)
        inv = torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + eps)  # (N, 1)
        c_hat, a, s = _layer_norm_stats(xc, inv, weight)
        g_bar, m = _feature_means(g, c_hat)  # (N, n_g) each
        p = m - g_bar * a  # (N, n_g), mean((g - g_bar) * c_hat)
        # out = s * (g - g_bar - c_hat p) = g * s - g_bar (x) s - p (x) (c_hat * s)
        out = _sub_rank_two(g * s.unsqueeze(1), g_bar, s, p, c_hat * s)
        # the per-token (N, d) tensors xc, c_hat and s are recomputed in the backward
        # pass from c (which the center's LayerNorm keeps anyway) and inv by the same
        # operations, so they are bitwise the same: saving them would keep three to five more
        # (N, d) tensors per LayerNorm alive until the backward pass
        ctx.save_for_backward(g, c, inv, g_bar, p, weight)
        ctx.has_weight = weight is not None
        ctx.eps = eps
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        g, c, inv, g_bar, p, weight = ctx.saved_tensors
        # autograd's immutable zeros (e.g. in gradgradcheck; not under torch.compile, whose
        # tracer takes no such test: a graph break at every generator LayerNorm)
        if not torch.compiler.is_compiling() and grad_out._is_zerotensor():
            return (torch.zeros_like(c), torch.zeros_like(g),
                    None if weight is None else torch.zeros_like(weight), None)
        d = c.size(-1)
        # create_graph=True (a second derivative, e.g. forces trained from an energy): inv,
        # g_bar and p, made inside forward, are not connected to c and g, so they are
        # recomputed from the inputs, and nothing below works in place on a tensor the graph
        # keeps; the operations are differentiable
        graph = torch.is_grad_enabled()
        xc = c - c.mean(dim=-1, keepdim=True)  # (N, d)
        if graph:
            inv = torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + ctx.eps)
        c_hat, a, s = _layer_norm_stats(xc, inv, weight)
        if graph:
            g_bar, m = _feature_means(g, c_hat)
            p = m - g_bar * a
        grad_out = grad_out.contiguous()
        r = grad_out * s.unsqueeze(1)  # (N, n_g, d), dL/du
        r_bar, q = _feature_means(r, c_hat)  # mean(r), q = mean(r * c_hat): (N, n_g)
        # dL/ds = sum_g grad_out * u, u = g - g_bar - c_hat p
        gu0 = _weighted_row_sum(grad_out, g_bar)  # (N, d)
        gu1 = _weighted_row_sum(grad_out, p)  # (N, d)
        grad_s = (grad_out * g).sum(dim=1) - gu0 - c_hat * gu1  # (N, d)
        # dL/dc_hat = -sum_g r_g p_g - sum_g q_g (g_g - g_bar_g), where sum_g r_g p_g = s * gu1
        # (r = grad_out * s): a per-token product instead of a pass over the generators
        grad_c_hat = -(s * gu1 + _weighted_row_sum(g, q)
                       - (q * g_bar).sum(dim=-1, keepdim=True))  # (N, d)
        # dL/dg = r - mean(r) - (c_hat - a) q, in place on r
        if graph:  # out of place (r may be an immutable zero tensor in a double backward)
            grad_g = r - r_bar.unsqueeze(-1) - q.unsqueeze(-1) * (c_hat - a).unsqueeze(1)
        else:
            grad_g = _sub_rank_two(r, r_bar, torch.ones_like(c_hat), q, c_hat - a)
        grad_w = None
        if ctx.has_weight:
            grad_inv = (grad_s * weight).sum(dim=-1, keepdim=True)  # (N, 1)
            if ctx.needs_input_grad[2]:
                grad_w = (grad_s * inv).sum(dim=0)  # (d,)
        else:
            grad_inv = grad_s.sum(dim=-1, keepdim=True)  # (N, 1)
        grad_c = None
        if ctx.needs_input_grad[0]:
            # c_hat = xc * inv with inv = (var + eps)^(-1/2); the mean of a row of c_hat's
            # gradient term cancels against the mean subtraction in xc
            lam = (grad_c_hat * xc).sum(dim=-1, keepdim=True) + grad_inv  # dL/dinv, (N, 1)
            grad_c = (inv * (grad_c_hat - grad_c_hat.mean(dim=-1, keepdim=True))
                      - inv.pow(3) * lam * xc / d)  # (N, d)
        return grad_c, grad_g, grad_w, None


def zonotope_layer_norm(z: Zonotope, norm: LayerNorm, add: Optional[Zonotope] = None) -> Zonotope:
    r"""Applies :class:`~torch.nn.LayerNorm` to a zonotope token (to :obj:`z` + :obj:`add` where
    :obj:`add` is given: a residual connection; where the compiled kernels run, the generators'
    sum is formed inside them instead of written out: the same sum, its map equal up to float
    rounding).

    The center is normalised as usual. Each generator row is mapped by the Jacobian of the
    LayerNorm at the center (first-order propagation of the zonotope through the normalisation):

    .. math::
        J g = \frac{w}{\sigma} \odot \Big(g - \overline{g}
              - \hat{c}\, \overline{\hat{c} \odot g}\Big),
        \qquad \hat{c} = \frac{c - \overline{c}}{\sigma},\quad
        \sigma = \sqrt{\mathrm{Var}(c) + \epsilon},

    where :math:`\overline{\,\cdot\,}` is the mean over features and :math:`w` the LayerNorm
    weight. This is the documented LayerNorm treatment of generators in torch_mz: it is linear in
    the generators (zero generators stay zero, flipping a generator's sign flips its image), acts
    per token (so it commutes with permutations of tokens), scales each generator by the same
    per-token factor :math:`w / \sigma` as the center, and removes the components LayerNorm itself
    removes (the feature mean and the radial direction :math:`\hat{c}`).

    The generator map runs as one autograd function with a hand-written backward, which keeps
    only the generators and per-token vectors for the backward pass and takes a few passes over
    the generators instead of the dozen that autograd through the elementwise formula takes
    (:func:`zonotope_layer_norm_reference`, the tested reference). On large CPU float32 inputs
    (by default: at least 2^20 generator elements) or wherever
    :func:`torch_mz.nn.set_fused_kernels` turns them on, the map runs as compiled kernels
    instead (:mod:`torch_mz.nn.fused`).
    """
    if add is not None:
        if (add.gens.shape == z.gens.shape and add.gens.dtype == z.gens.dtype
                and z.gens.size(1) > 0 and norm.normalized_shape == (z.center.size(-1), )
                and not _plain_ops() and _kernels_requested(z.gens)):
            c = z.center + add.center
            out_c = norm(c)
            if out_c.dtype != z.gens.dtype:  # (autocast) the sum in the generators' precision
                return zonotope_layer_norm(Zonotope(c, z.gens + add.gens), norm)
            weight = norm.weight.to(out_c.dtype) if norm.weight is not None else None
            g = LayerNormJacobianSumFused.apply(c.to(out_c.dtype), z.gens, add.gens, weight,
                                                norm.eps)
            return Zonotope(out_c, g)
        z = z + add
    c = z.center
    d = c.size(-1)
    if norm.normalized_shape != (d, ):
        raise ValueError(f"LayerNorm over {norm.normalized_shape} cannot normalise tokens of "
                         f"width {d}")
    out_c = norm(c)
    if z.gens.size(1) == 0:  # plain vector tokens
        return Zonotope(out_c, z.gens.to(out_c.dtype))
    if _plain_ops():  # the plain operations (see torch_mz.nn._context._plain_ops)
        return zonotope_layer_norm_reference(z, norm)
    weight = norm.weight.to(out_c.dtype) if norm.weight is not None else None
    gens = z.gens.to(out_c.dtype)
    # compiled kernels (torch_mz.nn.fused); chosen by the mode and the input alone, also once
    # compiling has failed (their formulas then run uncompiled), so that a checkpointed block
    # recomputes with the function its forward pass ran
    if _kernels_requested(gens):
        g = LayerNormJacobianFused.apply(c.to(out_c.dtype), gens.contiguous(), weight, norm.eps)
        return Zonotope(out_c, g)
    g = _LayerNormJacobian.apply(c.to(out_c.dtype), gens.contiguous(), weight, norm.eps)
    return Zonotope(out_c, g)


def zonotope_layer_norm_reference(z: Zonotope, norm: LayerNorm) -> Zonotope:
    r"""The map of :func:`zonotope_layer_norm` written elementwise and differentiated by autograd
    (the reference that the fused function is tested against)."""
    c = z.center
    d = c.size(-1)
    out_c = norm(c)
    if z.gens.size(1) == 0:
        return Zonotope(out_c, z.gens.to(out_c.dtype))
    c32 = c.to(out_c.dtype)
    mean = c32.mean(dim=-1, keepdim=True)
    var = (c32 - mean).pow(2).mean(dim=-1, keepdim=True)  # (N, 1)
    inv_std = torch.rsqrt(var + norm.eps)  # (N, 1)
    c_hat = (c32 - mean) * inv_std  # (N, d)
    g = z.gens.to(out_c.dtype)
    g = g - g.mean(dim=-1, keepdim=True)  # (N, n_g, d)
    proj = (g * c_hat.unsqueeze(1)).sum(dim=-1, keepdim=True) / d  # (N, n_g, 1)
    g = (g - c_hat.unsqueeze(1) * proj) * inv_std.unsqueeze(1)  # (N, n_g, d)
    if norm.weight is not None:
        g = g * norm.weight
    return Zonotope(out_c, g)


class _GeluLayerNormFn(torch.autograd.Function):
    r""":math:`\mathrm{LayerNorm}(\mathrm{GELU}(h))` keeping only :math:`h` (and the
    LayerNorm's per-row mean and inverse deviation, :math:`(N, 1)` each) for the backward pass,
    where the GELU runs again: the same kernels autograd runs for the two operations
    (``gelu_backward``, ``native_layer_norm_backward``) on the same inputs, so the same values
    and gradients, without :func:`torch.utils.checkpoint.checkpoint`'s machinery (its hooks
    and wrappers cost about 0.6 ms a call: a third of the fixed cost of a small PMA
    aggregation's forward + backward, ``benchmarks/README.md``)."""
    @staticmethod
    def forward(ctx, h: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                eps: float, shape: Tuple[int, ...]) -> Tensor:
        a = F.gelu(h)
        out, mean, rstd = torch.native_layer_norm(a, shape, weight, bias, eps)
        ctx.eps, ctx.shape = eps, shape
        ctx.save_for_backward(h, weight, bias, mean, rstd)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        h, weight, bias, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph=True: differentiate the plain operations
            inputs = [t for t, n in zip((h, weight, bias), need[:3]) if n]
            with torch.enable_grad():
                out = F.layer_norm(F.gelu(h), ctx.shape, weight, bias, ctx.eps)
            grads = iter(torch.autograd.grad(out, inputs, grad_out, create_graph=True))
            return tuple(next(grads) if n else None for n in need[:3]) + (None, None)
        a = F.gelu(h)
        grad_a, grad_w, grad_b = torch.ops.aten.native_layer_norm_backward(
            grad_out, a, ctx.shape, mean, rstd, weight, bias,
            [need[0], need[1] and weight is not None, need[2] and bias is not None])
        grad_h = torch.ops.aten.gelu_backward(grad_a, h) if need[0] else None
        return grad_h, grad_w, grad_b, None, None


class InputProjection(Module):
    r"""Projects set elements :math:`x_i \in \mathbb{R}^{d_{in}}` to zonotope tokens (Eq. 2 of
    the paper):

    .. math::
        c_i = \mathrm{LayerNorm}(\mathrm{GELU}(W_c x_i + b_c)), \qquad
        G_i = \frac{1}{\sqrt{n_g d}}\,(W_g x_i + b_g) \in \mathbb{R}^{n_g \times d}.

    The factor :math:`1/\sqrt{n_g d}` makes generators start as small perturbations. The tokens
    come as an :class:`AffineZonotope` (the generators with their affine description in the
    inputs, where :math:`d_{in} < n_g d` and neither this module nor :obj:`lin_g` has hooks), so
    that the first inducing-point attention of an ISAB, where it maps values after the
    aggregation, aggregates the :math:`d_{in}` input columns instead of the :math:`n_g d`
    generator columns (exact up to rounding; with 3-D points and the paper's configuration, 9.8%
    fewer FLOPs in an ``mz`` training step). In
    training, the GELU and the LayerNorm run again in the backward pass, so that only the
    pre-activation is kept for it (a hooked :obj:`norm` runs as its own call, which its hooks
    see, in a checkpoint).

    Args:
        in_channels (int): Input width :math:`d_{in}`.
        dim (int): Token width :math:`d`.
        num_generators (int): Generator budget :math:`n_g`; :obj:`0` gives plain vector tokens
            (a standard Set Transformer) (default: :obj:`8`).

    Shapes:
        - **input:** :math:`(N, d_{in})`
        - **output:** :class:`Zonotope` (an :class:`AffineZonotope`, see above) with center
          :math:`(N, d)` and generators :math:`(N, n_g, d)`
    """
    def __init__(self, in_channels: int, dim: int, num_generators: int = 8):
        super().__init__()
        # (True was taken as 1; 2.0, '2' or None failed inside torch, without naming them)
        in_channels, dim = check_count('in_channels', in_channels), check_count('dim', dim)
        num_generators = check_count('num_generators', num_generators, low=0)
        self.in_channels = in_channels
        self.dim = dim
        self.num_generators = num_generators
        self.lin_c = Linear(in_channels, dim)
        self.norm = LayerNorm(dim)
        self.lin_g = Linear(in_channels, num_generators * dim) if num_generators > 0 else None
        self.reset_parameters()

    def reset_parameters(self):
        torch.nn.init.xavier_uniform_(self.lin_c.weight)
        torch.nn.init.zeros_(self.lin_c.bias)
        if self.lin_g is not None:
            torch.nn.init.xavier_uniform_(self.lin_g.weight)
            torch.nn.init.zeros_(self.lin_g.bias)
        self.norm.reset_parameters()

    def forward(self, x: Tensor) -> Zonotope:
        if x.dim() != 2 or x.size(1) != self.lin_c.in_features:
            raise ValueError(f'Expected input of shape (N, {self.lin_c.in_features}) (got '
                             f'{tuple(x.shape)})')
        h = self.lin_c(x)  # (N, d)
        if (torch.is_grad_enabled() and h.requires_grad and not torch.compiler.is_compiling()
                and not _plain_ops()):
            # keep only the pre-activation for the backward pass and run the GELU and the
            # LayerNorm again there (the same operations: the same values and gradients): one
            # (N, d) tensor fewer kept, the GELU's output (in message passing N is the number
            # of edges); a hooked or replaced LayerNorm, or autocast, in a checkpoint (the
            # norm's own call, which its hooks see), and while tracing, which the function does
            # not serve (under forward-mode AD and torch.func, _plain_ops: the plain operations)
            norm = self.norm
            if (type(norm) is LayerNorm and not _hooked(norm) and len(norm.normalized_shape) == 1
                    and not torch.is_autocast_enabled(h.device.type)
                    and not torch.jit.is_tracing()):
                center = _GeluLayerNormFn.apply(h, norm.weight, norm.bias, norm.eps,
                                                tuple(norm.normalized_shape))
            else:
                center = torch.utils.checkpoint.checkpoint(self._activate, h,
                                                           use_reentrant=False)
        else:
            center = self._activate(h)  # (N, d)
        if self.lin_g is None:
            return Zonotope(center, center.new_zeros(x.size(0), 0, self.dim))
        scale = math.sqrt(self.num_generators * self.dim)
        gens = self.lin_g(x) / scale  # (N, n_g * d)
        gens = gens.view(x.size(0), self.num_generators, self.dim)  # (N, n_g, d)
        if (_hooked(self.lin_g) or _hooked(self)
                or x.size(1) >= self.num_generators * self.dim):
            return Zonotope(center, gens)  # hooks see their layer's call; nothing to gain
        # the generators' affine description, for attention that aggregates them
        # (AffineZonotope): the scale joins the (n_g d, d_in) weights
        ng, d = self.num_generators, self.dim
        bias = self.lin_g.bias
        return AffineZonotope(center, gens, x, (self.lin_g.weight / scale).view(ng, d, -1),
                              None if bias is None else (bias / scale).view(ng, d))

    def _activate(self, h: Tensor) -> Tensor:
        return self.norm(F.gelu(h))

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, {self.dim}, '
                f'num_generators={self.num_generators})')
