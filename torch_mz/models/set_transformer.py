r"""Set models on PyG's flat layout: the MZ-Set Transformer (with its value operators also the
standard Set Transformer, ST + FiLM and HyperNet baselines) and the Perceiver baseline, both built
from the same blocks (:mod:`torch_mz.nn.blocks`) so that they differ only where they should, and
Deep Sets, which uses none of them (MLPs and pooling)."""
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Linear, ModuleList

from torch_mz._checks import check_count, check_fits, check_optional_count, check_rate
from torch_mz.models.base import SetModel
from torch_mz.models.mlp import gelu_mlp, reset_linear_layers
from torch_mz.nn.aggr import MZAggregation, preset_defaults
from torch_mz.nn.blocks import MAB, PMA, SAB, LearnedTokens
from torch_mz.nn.functional import set_counts
from torch_mz.nn.zonotope import InputProjection


class MZSetTransformer(SetModel):
    r"""The MZ-Set Transformer (Section 2.4 of the MZAttn paper):

    .. math::
        \mathrm{InputProj} \to \mathrm{ISAB}_m^{\,L_{enc}} \to \mathrm{PMA}_k \to
        \mathrm{SAB}^{\,L_{dec}} \to \mathrm{MLP}([c, \mathrm{IHW}])

    The body is an :class:`~torch_mz.nn.MZAggregation` (whose final linear layer is the first
    layer of the two-layer head); the head reads the pooled centers and interval-hull widths
    (``readout='ihw'``) or signed generator sums (``readout='signed'``). ``value`` selects the
    value operator, so ``value='rigid', num_generators=0`` is a standard Set Transformer with the
    same routing, and ``'film'``/``'hypernet'`` are the ST + FiLM and HyperNet baselines.

    The forward returns a :class:`~torch_mz.models.base.SetPrediction` ``(prediction, ihw)``:
    ``ihw`` :math:`(B,)` is the summed interval-hull width of the pooled output tokens, the
    single-pass uncertainty estimate (zero without generators). An empty set predicts zero
    (the contract of :mod:`torch_mz.models.base`); the input is validated once, by the body's
    :meth:`~torch_mz.nn.MZAggregation.validate`.

    Args:
        in_channels (int): Element width :math:`F_{in}`.
        out_channels (int): Output width (targets or classes).
        hidden_channels (int, optional): Width of the head's hidden layer; :obj:`None` uses
            :obj:`dim` (default: :obj:`None`).
        **kwargs: Passed to :class:`~torch_mz.nn.MZAggregation` (``preset``, by default
            :obj:`'paper'`: the paper's body; ``dim``, ``heads``,
            ``num_generators``, ``value``, ``num_matrix_generators``, ``rank``,
            ``num_inducing``, ``num_seeds``, ``num_encoder_blocks``, ``encoder``,
            ``num_decoder_blocks``, ``d_ff``, ``summary``, ``dropout``, ``log_n``, ``readout``,
            ``path``, ``chunk_size``, ``checkpoint``, ``fold_keys``). ``checkpoint`` defaults
            to :obj:`False` here, not to the aggregation's :obj:`'auto'`: a training batch is
            encoded at once
            (the batch size is the memory knob), and ``chunk_size='auto'`` groups large inputs
            in inference, and in training only where glibc's ``malloc`` maps large blocks
            afresh (no :func:`torch_mz.runtime.keep_freed_memory`): there a batch whose widest
            activation exceeds 32 MiB (``mz``: more than 16,384 points) is trained (and
            inferred) in groups of whole sets, every activation kept and nothing recomputed
            (:func:`~torch_mz.nn.aggr.malloc_chunk_rows`; the same values and gradients up to
            rounding, but dropout masks drawn group by group; ``chunk_size=None`` trains the
            whole batch). On 128 clouds of 1,024 points (131,072 rows, kept memory, one
            thread; above the automatic
            grouping's 65,536 at ``dim = 64``) the recomputed groups took one training step of
            ``mz`` from 7.5 to 11.3 s and its peak from 7,270 to 4,294 MiB (``rigid``: 2.8 to
            3.0 s, 3,319 to 1,557 MiB; ``benchmarks/results/training_step_large_batch``):
            pass ``checkpoint='auto'`` (or ``'chunks'``) for that trade.

    Shapes:
        - **input:** a PyG batch with ``pos`` :math:`(N, D)` and/or ``x`` :math:`(N, F)`, read
          as ``[pos, x]`` :math:`(N, F_{in})` (:func:`~torch_mz.models.base.set_features`), and
          ``batch`` :math:`(N,)`; or ``(x, batch)``
        - **output:** :class:`~torch_mz.models.base.SetPrediction`: :math:`(B, F_{out})` and
          :math:`(B,)`
    """
    def __init__(self, in_channels: int, out_channels: int,
                 hidden_channels: Optional[int] = None, **kwargs):
        super().__init__()
        in_channels = check_count('in_channels', in_channels)
        out_channels = check_count('out_channels', out_channels)
        hidden_channels = check_optional_count('hidden_channels', hidden_channels)
        check_optional_count('dim', kwargs.get('dim'))  # (named as given, not as the body's)
        check_count('heads', kwargs.get('heads', 4))  # (before the preset's width divides by it)
        kwargs.setdefault('preset', 'paper')  # the paper's body unless sizes are given
        kwargs.setdefault('checkpoint', False)  # a training batch at once (see above)
        dim = kwargs.get('dim') or preset_defaults(kwargs['preset'], in_channels,
                                                   kwargs.get('heads', 4))['dim']
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.hidden_channels = hidden_channels or dim
        self.body = MZAggregation(in_channels, self.hidden_channels, **kwargs)
        self.out = Linear(self.hidden_channels, out_channels)
        self.reset_parameters()

    def reset_parameters(self):
        self.body.reset_parameters()
        torch.nn.init.xavier_uniform_(self.out.weight)
        torch.nn.init.zeros_(self.out.bias)

    def validate(self, x: Tensor, batch: Optional[Tensor],
                 num_sets: Optional[int]) -> Tuple[Tensor, int]:
        return self.body.validate(x, batch, dim_size=num_sets, names=('batch', 'num_sets'))

    def predict(self, x: Tensor, set_id: Tensor, num_sets: int) -> Tuple[Tensor, Tensor]:
        pooled, ihw = self.body.pool(x, set_id, num_sets)  # (B, hidden), (B,)
        return self.out(F.gelu(pooled)), ihw

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, {self.out_channels}, '
                f'body={self.body})')


class PerceiverSet(SetModel):
    r"""Perceiver-style latent cross-attention baseline (Jaegle et al., 2021) on the flat layout:
    :math:`m` learned latents per set cross-attend to the elements, then
    :obj:`num_latent_blocks` self-attention blocks refine the latents, repeated
    :obj:`num_cross` times; a PMA pools the latents and a two-layer MLP predicts. Built from the
    same MAB/SAB/PMA blocks as the Set Transformers with the ``'rigid'`` value operator and plain
    vector tokens. The forward returns ``(prediction, None)``: it has no uncertainty output. Its
    input passes through the same input projection (a LayerNorm) as the Set Transformers', and
    is checked against the same magnitude limit (:meth:`~torch_mz.nn.MZAggregation.validate`).

    Args:
        in_channels (int): Element width.
        out_channels (int): Output width.
        dim (int): Token width (default: :obj:`64`).
        heads (int): Attention heads (default: :obj:`4`).
        num_latents (int): Latents per set (default: :obj:`16`).
        num_cross (int): Cross-attention rounds (default: :obj:`2`).
        num_latent_blocks (int): Latent self-attention blocks per round (default: :obj:`1`).
        d_ff (int): FFN width (default: :obj:`128`).
        dropout (float): Dropout (default: :obj:`0.0`).
    """
    has_input_projection = True  # validate() applies the input projection's magnitude limit

    def __init__(self, in_channels: int, out_channels: int, dim: int = 64, heads: int = 4,
                 num_latents: int = 16, num_cross: int = 2, num_latent_blocks: int = 1,
                 d_ff: int = 128, dropout: float = 0.0):
        super().__init__()
        in_channels = check_count('in_channels', in_channels)
        out_channels = check_count('out_channels', out_channels)
        dim, heads, d_ff = (check_count(k, v) for k, v in
                            (('dim', dim), ('heads', heads), ('d_ff', d_ff)))
        num_latents = check_count('num_latents', num_latents)
        num_cross = check_count('num_cross', num_cross)  # the latents' only view of the set
        num_latent_blocks = check_count('num_latent_blocks', num_latent_blocks, low=0)
        dropout = check_rate('dropout', dropout)
        mabs = num_cross * (1 + num_latent_blocks) + 1  # (MZAggregation's bound of each)
        check_fits(f'num_cross={num_cross}, num_latent_blocks={num_latent_blocks}, dim={dim}, '
                   f'd_ff={d_ff}', mabs * (3 * dim * dim + 2 * dim * d_ff), 10 * mabs)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.dim = dim
        self.heads = heads
        self.d_ff = d_ff
        self.dropout = dropout
        self.num_latents = num_latents
        self.num_cross = num_cross
        self.num_latent_blocks = num_latent_blocks
        kw: Dict[str, Any] = dict(heads=heads, num_generators=0, d_ff=d_ff, value='rigid',
                                  dropout=dropout)
        self.input_proj = InputProjection(in_channels, dim, num_generators=0)
        self.latents = LearnedTokens(num_latents, dim, 0)
        self.cross = ModuleList([MAB(dim, **kw) for _ in range(num_cross)])
        self.latent_blocks = ModuleList(
            [SAB(dim, **kw) for _ in range(num_cross * num_latent_blocks)])
        self.pma = PMA(dim, num_seeds=1, **kw)
        self.head = gelu_mlp(dim, dim, out_channels, num_layers=1)

    def reset_parameters(self):
        for m in [self.input_proj, self.latents, self.pma] + list(self.cross) + \
                list(self.latent_blocks):
            m.reset_parameters()
        reset_linear_layers(self.head)

    def predict(self, x: Tensor, batch: Tensor, num_sets: int) -> Tuple[Tensor, None]:
        elements = self.input_proj(x)  # (N, d)
        lat, lat_set = self.latents(num_sets, elements.center)  # (B * m, d)
        for r, cross in enumerate(self.cross):
            lat = cross(lat, elements, lat_set, batch, num_sets)  # (B * m, d)
            for block in self.latent_blocks[r * self.num_latent_blocks:
                                            (r + 1) * self.num_latent_blocks]:
                lat = block(lat, lat_set, num_sets)
        pooled = self.pma(lat, lat_set, num_sets).center  # (B, d)
        return self.head(pooled), None  # empty sets: zeroed by SetModel.forward

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, {self.out_channels}, '
                f'dim={self.dim}, heads={self.heads}, num_latents={self.num_latents}, '
                f'num_cross={self.num_cross}, num_latent_blocks={self.num_latent_blocks}, '
                f'd_ff={self.d_ff}, dropout={self.dropout})')


class DeepSets(SetModel):
    r"""Deep Sets (Zaheer et al., 2017): :math:`\rho\big(\mathrm{pool}_{i}\, \phi(x_i)\big)` with
    two-layer (or deeper) MLPs :math:`\phi, \rho` and sum or mean pooling over each set. The
    forward returns ``(prediction, None)``: it has no uncertainty output.

    Args:
        in_channels (int): Element width.
        out_channels (int): Output width.
        hidden_channels (int): MLP width (default: :obj:`128`).
        num_layers (int): Hidden layers of :math:`\phi` and of :math:`\rho`, each of which has
            ``num_layers + 1`` linear layers (default: :obj:`3`).
        pool (str): :obj:`'sum'` or :obj:`'mean'` (default: :obj:`'sum'`).
    """
    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 128,
                 num_layers: int = 3, pool: str = 'sum'):
        super().__init__()
        if pool not in ('sum', 'mean'):
            raise ValueError(f"Unknown pooling '{pool}' (expected 'sum' or 'mean')")
        in_channels = check_count('in_channels', in_channels)
        out_channels = check_count('out_channels', out_channels)
        hidden_channels = check_count('hidden_channels', hidden_channels)
        num_layers = check_count('num_layers', num_layers)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.hidden_channels = hidden_channels
        self.num_layers = num_layers
        self.pool = pool
        self.phi = gelu_mlp(in_channels, hidden_channels, hidden_channels, num_layers)
        self.rho = gelu_mlp(hidden_channels, hidden_channels, out_channels, num_layers)

    def reset_parameters(self):
        reset_linear_layers(self.phi, self.rho)

    def predict(self, x: Tensor, batch: Tensor, num_sets: int) -> Tuple[Tensor, None]:
        h = self.phi(x)  # (N, hidden)
        pooled = h.new_zeros(num_sets, h.size(-1)).index_add_(0, batch, h)  # (B, hidden)
        if self.pool == 'mean':
            pooled = pooled / set_counts(batch, num_sets).clamp(min=1).to(h.dtype).unsqueeze(-1)
        return self.rho(pooled), None

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, {self.out_channels}, '
                f'hidden_channels={self.hidden_channels}, num_layers={self.num_layers}, '
                f'pool={self.pool!r})')  # (quoted, as EGNN's: the repr evaluates)
