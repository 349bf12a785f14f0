r"""PyG's :class:`~torch_geometric.nn.aggr.SetTransformerAggregation` on the flat layout: the
same blocks and parameters, without padding every set to the largest."""
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.aggr import SetTransformerAggregation

from torch_mz._checks import (check_count, check_fits, check_flag, check_rate, refuse_jit_script,
                              refuse_jit_trace)
from torch_mz.nn.aggr import (check_call_arguments, check_max_num_elements, check_set_input,
                              resolve_set_index)
from torch_mz.nn._context import _hooked, tie_parameters
from torch_mz.nn.functional import PATHS, check_choice, grouped_attention, repeat_per_set


class FlatSetTransformerAggregation(SetTransformerAggregation):
    r"""PyG's :class:`~torch_geometric.nn.aggr.SetTransformerAggregation` (Lee et al., 2019, "Set
    Transformer") computed on PyG's flat layout of variable-size sets.

    A subclass with PyG's constructor, sub-modules, initialisation and ``state_dict`` (so
    ``flat.load_state_dict(pyg_aggr.state_dict())`` copies a trained PyG aggregation, and the other
    way round); only the forward pass differs. PyG pads every set to the largest one
    (:meth:`~torch_geometric.nn.aggr.Aggregation.to_dense_batch`) and attends over the padded
    block; here every block attends within each set with
    :func:`~torch_mz.nn.functional.grouped_attention` (sets bucketed by size, or one reshape when
    all sets have the same size and the rows are sorted), so a batch of one large and many small
    sets costs :math:`O(\sum_b n_b^2)` instead of :math:`O(B\, n_{\max}^2)`. The blocks are PyG's:

    .. math::
        \mathrm{MAB}(X, Y) = h + \mathrm{ReLU}(W h + b), \quad
        h = X + \mathrm{Multihead}(X, Y, Y)

    (each sum followed by a LayerNorm with ``layer_norm=True``), SAB encoders, PMA
    :math:`\mathrm{MAB}(S, \mathrm{ReLU}(W x + b))` with :obj:`num_seed_points` seeds, SAB
    decoders on the seeds of each set; the :math:`k` pooled rows are concatenated
    (``concat=True``) or averaged. The multi-head attention is
    :class:`torch.nn.MultiheadAttention`'s (its packed input projection with biases, scores
    scaled by :math:`1/\sqrt{d/H}`, dropout on the attention weights, output projection).

    Values and gradients equal PyG's to rounding (tested in float64, with and without LayerNorm,
    several seeds, decoders, unsorted ``index``, ``ptr``, empty sets). The parameters and
    :meth:`reset_parameters` are PyG's, so a layer built around it (``SAGEConv(aggr=...)``, whose
    constructor resets its aggregation) draws the same weights as around PyG's from one seed;
    like PyG's, :meth:`reset_parameters` leaves the attentions' output projection weights as
    they are (:class:`torch.nn.MultiheadAttention` resets only that layer's bias). An empty
    set's output is its seeds with a zero attention output, passed through the blocks, which is
    PyG's on the torch this project uses (2.13; older torch gave PyG NaN there, which its
    :meth:`~torch.Tensor.nan_to_num` turned into 0). Documented differences:

    * PyG passes the output through :meth:`~torch.Tensor.nan_to_num`, which turns NaN into 0 and
      infinities into the largest finite numbers; here non-finite values are left as they are,
      so that a diverging model is seen, not hidden;
    * PyG's ``max_num_elements`` keeps only the first rows of a larger set and drops the rest
      without a word; here a set larger than ``max_num_elements`` raises a
      :class:`ValueError` (no row is dropped), and a bound that every set meets changes nothing;
    * the flat computation reads the blocks' weights directly; where a sub-module has hooks
      (e.g. :mod:`torch.nn.utils.prune`'s), global module hooks are installed (e.g. by
      :class:`torch.utils.flop_counter.FlopCounterMode`, whose module tracker registers them;
      :func:`torch_mz.study.count_flops` counts without) or the attention options PyG does not
      set (``add_bias_kv``, ``add_zero_attn``), PyG's padded forward runs instead, on the rows
      sorted by set, so the hooks see their modules' calls: with PyG's cost, and with its
      output through :meth:`~torch.Tensor.nan_to_num` (an input without rows, which PyG's
      forward cannot take, stays on the flat path).

    With dropout in training the two draw different masks (same probability).
    :func:`torch.jit.trace` and :func:`torch.jit.script` (of the aggregation, or of a conv or
    model that holds it), which PyG's takes, are refused with a message naming
    :func:`torch.compile` (as :class:`~torch_mz.nn.MZAggregation`'s are).

    Args:
        channels (int): Size of each input sample.
        num_seed_points (int, optional): Number of seed points :math:`k`. (default: :obj:`1`)
        num_encoder_blocks (int, optional): Number of SAB encoder blocks. (default: :obj:`1`)
        num_decoder_blocks (int, optional): Number of SAB decoder blocks. (default: :obj:`1`)
        heads (int, optional): Number of attention heads. (default: :obj:`1`)
        concat (bool, optional): Concatenate the :math:`k` pooled rows (else average them).
            (default: :obj:`True`)
        layer_norm (bool, optional): LayerNorm after each residual sum. (default: :obj:`False`)
        dropout (float, optional): Dropout probability of the attention weights.
            (default: :obj:`0`)
        path (str, optional): Attention kernel of
            :func:`~torch_mz.nn.functional.grouped_attention`, :obj:`'auto'`, :obj:`'dense'` or
            :obj:`'scatter'`. (default: :obj:`'auto'`)

    Shapes:
        - **input:** node features :math:`(N, F)`, set ids ``index`` :math:`(N,)` (need not be
          sorted) or ``ptr`` :math:`(B + 1,)`
        - **output:** :math:`(B, k F)` with ``concat=True``, else :math:`(B, F)`
    """
    def __init__(self, channels: int, num_seed_points: int = 1, num_encoder_blocks: int = 1,
                 num_decoder_blocks: int = 1, heads: int = 1, concat: bool = True,
                 layer_norm: bool = False, dropout: float = 0.0, path: str = 'auto'):
        channels, heads = check_count('channels', channels), check_count('heads', heads)
        if channels % heads:
            raise ValueError(f"'channels' must be a positive multiple of 'heads' (got {channels} "
                             f"and {heads})")
        num_seed_points = check_count('num_seed_points', num_seed_points)
        num_encoder_blocks = check_count('num_encoder_blocks', num_encoder_blocks, 0)
        num_decoder_blocks = check_count('num_decoder_blocks', num_decoder_blocks, 0)
        # (each of PyG's blocks: at least 4 c^2 parameters, in its attention and its Linear, and
        # 5 modules: a SAB, its MAB, the attention, its output Linear and the MAB's Linear)
        blocks = num_encoder_blocks + 1 + num_decoder_blocks
        check_fits(f'num_encoder_blocks={num_encoder_blocks}, num_decoder_blocks='
                   f'{num_decoder_blocks}, channels={channels}',
                   blocks * 4 * channels * channels, 5 * blocks)
        # (PyG's own constructor takes any truthy text as a flag and checks the rate only in a
        # training forward pass)
        concat, layer_norm = check_flag('concat', concat), check_flag('layer_norm', layer_norm)
        dropout = check_rate('dropout', dropout)
        check_choice('attention path', path, PATHS)
        super().__init__(channels, num_seed_points, num_encoder_blocks, num_decoder_blocks,
                         heads, concat, layer_norm, dropout)
        self.path = path

    def _mab(self, mab, x: Tensor, y: Tensor, x_set: Tensor, y_set: Tensor,
             num_sets: int) -> Tensor:
        r"""PyG's :class:`~torch_geometric.nn.aggr.utils.MultiheadAttentionBlock` with queries
        :obj:`x` :math:`(N_x, F)` attending to the rows of :obj:`y` :math:`(N_y, F)` of their
        own set."""
        attn = mab.attn
        Nx, Ny, F_ = x.size(0), y.size(0), x.size(-1)
        H = attn.num_heads
        dk = F_ // H
        w_q, w_k, w_v = attn.in_proj_weight.chunk(3)  # (F, F) each
        b_q, b_k, b_v = ((None, None, None) if attn.in_proj_bias is None
                         else attn.in_proj_bias.chunk(3))
        q = F.linear(x, w_q, b_q).mul(1.0 / math.sqrt(dk)).view(Nx, H, dk)  # (Nx, H, dk)
        k = F.linear(y, w_k, b_k).view(Ny, H, dk)  # (Ny, H, dk)
        v = F.linear(y, w_v, b_v).view(Ny, H, dk)  # (Ny, H, dk)
        o = grouped_attention(q, k, v, x_set, y_set, num_sets, dropout=attn.dropout,
                              training=attn.training, path=self.path)  # (Nx, H, dk)
        out = attn.out_proj(o.reshape(Nx, F_)) + x  # (Nx, F)
        if mab.layer_norm1 is not None:
            out = mab.layer_norm1(out)
        out = out + mab.lin(out).relu()
        if mab.layer_norm2 is not None:
            out = mab.layer_norm2(out)
        return out

    def __call__(self, x: Tensor, *args, **kwargs) -> Tensor:
        check_call_arguments(x, self.channels, args, kwargs)  # (as MZAggregation's)
        return super().__call__(x, *args, **kwargs)

    def __prepare_scriptable__(self) -> 'FlatSetTransformerAggregation':
        # (torch.jit.script failed inside: 'Expected a value of type 'Tensor' for argument
        # '0'', at refuse_jit_trace; in a conv: "Can't redefine method: forward")
        refuse_jit_script(type(self).__name__)

    def forward(self, x: Tensor, index: Optional[Tensor] = None, ptr: Optional[Tensor] = None,
                dim_size: Optional[int] = None, dim: int = -2,
                max_num_elements: Optional[int] = None) -> Tensor:
        r"""PyG's aggregation signature; ``max_num_elements`` (PyG's padding bound) is checked,
        not applied: a larger set raises a :class:`ValueError` (see the class docstring)."""
        refuse_jit_trace(type(self).__name__)
        if dim not in (0, -2):
            raise ValueError(f"FlatSetTransformerAggregation aggregates over dimension 0 / -2 "
                             f"(got {dim})")
        # (without LayerNorms autocast casts every weight; with them the input meets the first
        # encoder's in the residual sum)
        check_set_input(x, self.channels, self.pma.lin.weight.dtype, layer_norm=self.layer_norm,
                        norm_input=self.layer_norm and len(self.encoders) > 0)
        set_id, B = resolve_set_index(x, index, ptr, dim_size)
        check_max_num_elements(set_id, B, max_num_elements)
        if x.size(0) > 0 and self._runs_as_pyg():  # (PyG's forward cannot take no rows)
            order = torch.sort(set_id, stable=True).indices  # PyG needs rows sorted by set
            return super().forward(x[order], set_id[order], dim_size=B)
        for encoder in self.encoders:
            x = self._mab(encoder.mab, x, x, set_id, set_id, B)
        pma = self.pma
        h = pma.lin(x).relu()  # (N, F)
        k = pma.seed.size(1)
        seed_set = repeat_per_set(B, k, x.device)  # (B k,), set-major
        seeds = pma.seed[0].repeat(B, 1)  # (B k, F)
        out = self._mab(pma.mab, seeds, h, seed_set, set_id, B)  # (B k, F)
        for decoder in self.decoders:
            out = self._mab(decoder.mab, out, out, seed_set, seed_set, B)
        out = out.view(B, k, self.channels)  # (B, k, F)
        out = out.flatten(1, 2) if self.concat else out.mean(dim=1)
        if x.size(0) == 0:  # every parameter (DDP) and the input in the graph, zero gradients
            out = tie_parameters(out, self, x)
        return out

    def _runs_as_pyg(self) -> bool:
        r"""Whether PyG's padded forward must run: hooks on a sub-module (which must see its
        call) or attention options the flat computation does not read."""
        for module in self.modules():
            if module is not self and _hooked(module):
                return True
            if isinstance(module, torch.nn.MultiheadAttention) and (
                    module.bias_k is not None or module.add_zero_attn
                    or not module._qkv_same_embed_dim):
                return True
        return False

    def __repr__(self) -> str:
        # (PyG's repr, which this one extended, leaves out the blocks and concat: layers of two
        # encoder blocks, or averaging the seeds, printed as the defaults)
        return (f'{self.__class__.__name__}({self.channels}, '
                f'num_seed_points={self.num_seed_points}, '
                f'num_encoder_blocks={len(self.encoders)}, '
                f'num_decoder_blocks={len(self.decoders)}, heads={self.heads}, '
                f'concat={self.concat}, layer_norm={self.layer_norm}, dropout={self.dropout}, '
                f'path={self.path!r})')
