r"""E(n)-equivariant graph neural network (EGNN), the equivariant comparison model.

Satorras, Hoogeboom and Welling, "E(n) Equivariant Graph Neural Networks", ICML 2021
(https://arxiv.org/abs/2102.09844). PyG ships no EGNN, so :mod:`torch_mz` provides:

- :class:`EGNNConv`, one equivariant message-passing layer acting on invariant features ``h`` and
  coordinates ``pos`` of any dimension;
- :class:`EGNN`, a set/molecule model (embedding, ``num_layers`` x :class:`EGNNConv`, invariant
  pooling, MLP head) for regression and classification on PyG batches;
- :func:`fully_connected_edge_index` and :func:`radius_edge_index`, the per-set graphs the model
  builds from the ``batch`` vector (no ``torch-cluster`` needed), and :func:`split_pos_features`,
  which reads coordinates from the first columns of ``x`` (for tensors ``x = [pos, features]``,
  such as what :func:`~torch_mz.models.base.set_features` reads from a data object).
"""
import contextlib
import math
import numbers
from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch.nn import Linear, Module, ModuleList, Sequential
from torch_geometric.data import Batch
from torch_geometric.data.data import BaseData
from torch_geometric.nn import MessagePassing
import torch_geometric.nn.aggr as pyg_aggr
from torch_geometric.nn.aggr import (Aggregation, GRUAggregation, LSTMAggregation,
                                     MultiAggregation, SumAggregation)
from torch_geometric.nn.resolver import activation_resolver
from torch_geometric.utils import scatter

from torch_mz._checks import (check_count, check_fits, check_flag, check_number,
                              check_optional_count, refuse_jit_script, refuse_jit_trace)
from torch_mz.models.base import SetPrediction, batch_vector, zero_empty_sets
from torch_mz.nn.aggr import check_set_ids
from torch_mz.nn._context import _hooked, tie_parameters
from torch_mz.nn.functional import _sorted_layout, set_pairs

__all__ = [
    'EGNNConv',
    'EGNN',
    'fully_connected_edge_index',
    'radius_edge_index',
    'split_pos_features',
]

_COORD_AGGRS = ('mean', 'sum')
_POOLS = ('sum', 'mean')
# PyG's aggregations whose output depends on the order of the messages: EGNNConv, invariant to
# permutations of the nodes, refuses them, alone or inside another aggregation (a
# DegreeScalerAggregation or MultiAggregation around one)
_ORDER_DEPENDENT_AGGRS = (LSTMAggregation, GRUAggregation) + tuple(
    getattr(pyg_aggr, name) for name in ('MLPAggregation', 'PatchTransformerAggregation')
    if hasattr(pyg_aggr, name))  # (not in every PyG release setup.cfg admits)


# --------------------------------------------------------------------------------------------------
# Per-set graphs
# --------------------------------------------------------------------------------------------------
def fully_connected_edge_index(batch: Tensor, num_sets: Optional[int] = None) -> Tensor:
    r"""All ordered pairs :math:`(j, i)`, :math:`i \neq j`, of elements of the same set.

    Built without a Python loop over sets from :func:`torch_mz.nn.functional.set_pairs` (every pair
    of elements of a set), with the self-pairs dropped. Two different sets are never linked.
    ``batch`` need not be sorted.

    Args:
        batch (torch.Tensor): Set id of every element.
        num_sets (int, optional): Number of sets; ids above ``batch.max()`` are empty sets.
            (default: :obj:`None`, i.e. ``batch.max() + 1``)

    Returns:
        torch.Tensor: ``edge_index`` with :math:`\sum_s n_s (n_s - 1)` columns, sorted by
        ``edge_index[0]`` (source) when ``batch`` is sorted.

    Shapes:
        - **input:** batch :math:`(N)`
        - **output:** edge_index :math:`(2, \sum_s n_s (n_s - 1))`
    """
    batch, num_sets = check_set_ids(batch, batch.numel(), num_sets, 'batch')
    src, dst = set_pairs(batch, batch, num_sets)  # (sum_s n_s^2,) each, self-pairs included
    keep = src != dst
    return torch.stack([src[keep], dst[keep]], dim=0)  # (2, sum_s n_s (n_s - 1))


def radius_edge_index(pos: Tensor, r: float, batch: Optional[Tensor] = None,
                      num_sets: Optional[int] = None, chunk_size: int = 2**20) -> Tensor:
    r"""All ordered pairs :math:`(j, i)`, :math:`i \neq j`, of elements of the same set with
    :math:`\|x_i - x_j\| \le r`.

    A replacement for ``torch_cluster.radius_graph`` (without its neighbour cap) that needs no
    compiled extension: the distances of every pair of a set are computed as a dense
    :math:`(n_s, n_s)` block, sets of similar size together, at most ``chunk_size`` pairs at a
    time (a larger set a slice of its rows at a time). The pairs, their order and the squared
    distances they are kept by are those of :func:`fully_connected_edge_index` filtered pair by
    pair (the same arithmetic; equal bitwise on the CPU, by test; half-precision coordinates
    are compared in float32, a pair at a NaN distance is kept). Time is
    :math:`O(\sum_s n_s^2)`, which suits sets of up to a few thousand elements; work memory is
    bounded by ``chunk_size``.

    Args:
        pos (torch.Tensor): Coordinates.
        r (float): Cut-off distance (inclusive).
        batch (torch.Tensor, optional): Set id of every element. (default: :obj:`None`, one set)
        num_sets (int, optional): Number of sets. (default: :obj:`None`, i.e. ``batch.max() + 1``)
        chunk_size (int, optional): Number of pairs whose distances are computed at once (at
            least one row of a set), which bounds the floating-point work memory to about
            ``chunk_size * D``. (default: :obj:`2**20`)

    Shapes:
        - **input:** pos :math:`(N, D)`, batch :math:`(N)`
        - **output:** edge_index :math:`(2, E)`
    """
    if pos.dim() != 2:
        raise ValueError(f"'pos' must have shape (N, D), got {tuple(pos.shape)}")
    if not isinstance(r, numbers.Real) or isinstance(r, bool) or not r >= 0:
        # (NaN too: it gave no edge, silently)
        raise ValueError(f"'r' must be a non-negative number, got {r!r}")
    # as a float, as EGNN's radius is: an integer r of 4e9 or more failed in the comparison
    # ("int too big to convert": r * r beyond int64), and one beyond float64 is infinite
    try:
        r = float(r)
    except OverflowError:
        r = math.inf
    if (not isinstance(chunk_size, numbers.Integral) or isinstance(chunk_size, bool)
            or chunk_size < 1):
        raise ValueError(f"'chunk_size' must be a positive integer, got {chunk_size!r}")
    if batch is None:
        batch = pos.new_zeros(pos.size(0), dtype=torch.long)
    if batch.numel() != pos.size(0):
        raise ValueError(f"'batch' has {batch.numel()} entries but 'pos' has {pos.size(0)} rows")
    batch, num_sets = check_set_ids(batch, batch.numel(), num_sets, 'batch')
    device = pos.device
    perm, counts, ptr, _ = _sorted_layout(batch, num_sets)
    # sets by size, so that a block pads each set to a similar size
    by_size = torch.argsort(counts, stable=True)  # (B,)
    sizes = counts[by_size].tolist()
    src_parts, dst_parts = [], []
    with torch.no_grad():
        sorted_pos = pos if perm is None else pos.index_select(0, perm)  # (N, D), set by set
        if sorted_pos.dtype in (torch.float16, torch.bfloat16):
            # squared distances of coordinates in the hundreds overflow half precision (inf <=
            # inf kept every pair): compared in float32
            sorted_pos = sorted_pos.float()
        start = 0
        while start < num_sets:
            if sizes[start] < 2:  # no pair
                start += 1
                continue
            # the sets [start, stop) in size order, padded to the largest, <= chunk_size pairs
            stop = start + 1
            while stop < num_sets and (stop + 1 - start) * sizes[stop] ** 2 <= chunk_size:
                stop += 1
            n = sizes[stop - 1]
            sets = by_size[start:stop]  # (g,)
            slot = torch.arange(n, device=device)  # (n,)
            valid = slot < counts[sets].unsqueeze(1)  # (g, n)
            rows = (ptr[sets].unsqueeze(1) + slot).masked_fill(~valid, 0)  # (g, n)
            block = sorted_pos[rows]  # (g, n, D)
            # source rows a slice at a time: a set larger than the chunk is split too
            step = max(1, chunk_size // (len(sets) * n))
            for lo in range(0, n, step):
                hi = min(lo + step, n)
                # (g, s, t): pos[t] - pos[s] of source s and target t, the arithmetic of the
                # pair-by-pair filter
                sq_dist = (block.unsqueeze(1) - block[:, lo:hi].unsqueeze(2)).pow(2).sum(dim=-1)
                # a pair with a NaN distance is kept, so that NaN coordinates give a NaN
                # prediction, as with every pair (not a point silently cut off)
                near = (sq_dist <= r * r) | torch.isnan(sq_dist)
                keep = near & valid[:, lo:hi].unsqueeze(2) & valid.unsqueeze(1)
                keep &= (torch.arange(lo, hi, device=device).unsqueeze(1) != slot)  # no self
                g, s, t = keep.nonzero(as_tuple=True)
                src_parts.append(rows[g, s + lo])
                dst_parts.append(rows[g, t])
            start = stop
    if not src_parts:
        return torch.empty(2, 0, dtype=torch.long, device=device)
    src, dst = torch.cat(src_parts), torch.cat(dst_parts)  # sorted positions
    # the order of fully_connected_edge_index: by set, then source, then target (sorted
    # positions increase with the set)
    order = torch.argsort(src * max(pos.size(0), 1) + dst)
    src, dst = src[order], dst[order]
    if perm is not None:
        src, dst = perm[src], perm[dst]
    return torch.stack([src, dst], dim=0)  # (2, E)


def split_pos_features(x: Tensor, pos_dim: int) -> Tuple[Tensor, Optional[Tensor]]:
    r"""Splits element features into coordinates ``x[:, :pos_dim]`` and the remaining invariant
    features ``x[:, pos_dim:]`` (:obj:`None` when there are no remaining columns).

    The layout of ``[pos, x]`` that the set models read
    (:func:`~torch_mz.models.base.set_features`): each point first, followed by invariant
    attributes such as a type indicator.

    Shapes:
        - **input:** x :math:`(N, D + F)`
        - **output:** pos :math:`(N, D)`, features :math:`(N, F)` or :obj:`None`
    """
    pos_dim = check_count('pos_dim', pos_dim)  # (True read one column; 2.0 failed in slicing)
    if x.dim() != 2 or x.size(1) < pos_dim:
        raise ValueError(f"Expected 'x' of shape (N, >= {pos_dim}) with pos_dim >= 1, got "
                         f"{tuple(x.shape)} and pos_dim={pos_dim}")
    features = x[:, pos_dim:] if x.size(1) > pos_dim else None  # (N, F)
    return x[:, :pos_dim], features  # (N, D)


# --------------------------------------------------------------------------------------------------
# Layer
# --------------------------------------------------------------------------------------------------
def _safe_norm(sq_norm: Tensor, eps: float) -> Tensor:
    # sqrt has an infinite derivative at 0, and 0 * inf = NaN for coincident points. Below eps^2 the
    # clamp passes a zero gradient, so the norm is differentiable everywhere.
    return sq_norm.clamp_min(eps * eps).sqrt()


def _check_eps(eps: float, dtype: torch.dtype, detach_norm: bool) -> None:
    r"""Refuses an :obj:`eps` too small for the normalisation in :obj:`dtype`, the coordinates'
    (float32 for half-precision ones): below the smallest normal number coincident points gave
    NaN coordinates (1e-50 is 0 in float32: 0 / 0) or NaN gradients (1e-43: weight / eps
    overflowed on a new layer; the smallest normal number leaves 1 / eps finite),
    and with :obj:`detach_norm` false, below the root of the smallest subnormal number, whose
    square, the safe norm's clamp, is 0, NaN gradients."""
    info = torch.finfo(dtype)
    least = float(info.tiny) if detach_norm else math.sqrt(float(info.tiny) * float(info.eps))
    if eps < least:
        why = '' if detach_norm else ', with detach_norm=False (the safe norm clamps at eps^2)'
        # (float64 coordinates are no remedy where the bound is float64's already)
        wider = '' if dtype == torch.float64 else ', or float64 coordinates'
        raise ValueError(f"Expected an 'eps' of at least {least:.3g} for coordinates normalised "
                         f"in {dtype}{why}, got {eps!r}: a smaller one gives NaN coordinates or "
                         f"gradients for coincident points (give a larger eps{wider})")


def _activation(act) -> Module:
    r"""A new activation module for :obj:`act`, a PyG activation name (a module given is used
    as it is); a :class:`ValueError` naming ``act`` for anything else (:obj:`None`, a class or a
    function was taken as it is and failed in the first call or inside ``Sequential``)."""
    try:
        module = activation_resolver(act)
    except (ValueError, TypeError) as err:  # an unknown name, a class that needs arguments
        raise ValueError(f"'act' must name a PyG activation such as 'silu' or 'relu' (got "
                         f"{act!r}: {err})") from None
    if not isinstance(module, Module):
        if isinstance(act, str):  # ('swish': PyG's resolver knows the name, as a function)
            raise ValueError(f"'act' {act!r} is a name PyG's resolver gives a plain function "
                             f"for, not an activation module; name a module ('silu' computes "
                             f"x * sigmoid(x), as 'swish' does) or pass one")
        raise ValueError(f"'act' must name a PyG activation such as 'silu' or 'relu', or be an "
                         f"activation module (got {act!r})")
    return module


def _check_layer_options(coord_aggr, act) -> None:
    r"""Refuses the options of :class:`EGNNConv` that no flag check covers: the coordinate
    aggregation and the activation (:class:`EGNN` checks them before it builds any layer: with
    ``num_layers=0`` none was built to refuse them)."""
    if not isinstance(coord_aggr, str) or coord_aggr not in _COORD_AGGRS:
        raise ValueError(f"'coord_aggr' must be one of {_COORD_AGGRS}, got {coord_aggr!r}")
    _activation(act)


def _reset_mlp(mlp: Optional[Module]) -> None:
    r"""Re-initialises every layer of :obj:`mlp` (or :obj:`mlp` itself, a single layer) that
    has parameters: its linear layers and a parametrised activation (``act='prelu'``, whose
    slopes were left as trained)."""
    if mlp is None:
        return
    for child in mlp.modules():
        reset = getattr(child, 'reset_parameters', None)
        if callable(reset):
            reset()


class EGNNConv(MessagePassing):
    r"""The E(n)-equivariant graph convolution from `"E(n) Equivariant Graph Neural Networks"
    <https://arxiv.org/abs/2102.09844>`_ (Satorras, Hoogeboom and Welling, ICML 2021).

    .. math::
        \mathbf{m}_{ij} &= \phi_e\left(\mathbf{h}_i, \mathbf{h}_j,
            \|\mathbf{x}_i - \mathbf{x}_j\|^2, \mathbf{a}_{ij}\right),
            \qquad \mathbf{m}_{ij} \leftarrow \mathbf{m}_{ij}\,
            \sigma\left(\phi_{\mathrm{inf}}(\mathbf{m}_{ij})\right) \text{ (if edge\_gate)}

        \mathbf{x}_i' &= \mathbf{x}_i + C \sum_{j \in \mathcal{N}(i)}
            \left(\mathbf{x}_i - \mathbf{x}_j\right) \phi_x(\mathbf{m}_{ij})

        \mathbf{h}_i' &= \mathbf{h}_i + \phi_h\left(\mathbf{h}_i,
            \textstyle\sum_{j \in \mathcal{N}(i)} \mathbf{m}_{ij}\right)

    with :math:`C = 1 / |\mathcal{N}(i)|` for ``coord_aggr='mean'`` and :math:`C = 1` for ``'sum'``.
    :math:`\phi_e` and :math:`\phi_h` are two-layer MLPs, :math:`\phi_x` is ``Linear -> act ->
    Linear(hidden, 1)`` whose last layer is initialised small (Xavier uniform with gain ``0.001``, as
    in the authors' implementation) so that early layers barely move the points. With
    ``normalize=True``, :math:`\mathbf{x}_i - \mathbf{x}_j` is divided by
    :math:`\|\mathbf{x}_i - \mathbf{x}_j\| + \epsilon`, the norm treated as a constant in
    back-propagation (``detach_norm=True``, as the authors' ``egnn_clean`` does:
    ``torch.sqrt(radial).detach() + epsilon``), or by
    :math:`\max(\|\mathbf{x}_i - \mathbf{x}_j\|, \epsilon) + \epsilon`, differentiated through
    (``detach_norm=False``; the clamp at :math:`\epsilon` keeps the gradients finite for
    coincident points). For pairs at a distance of at least :math:`\epsilon` the two give the same
    values, bit for bit, and position gradients that differ; for a pair closer than
    :math:`\epsilon` ``detach_norm=False`` divides by :math:`2\epsilon` instead, so its coordinate
    update is smaller by the factor :math:`2\epsilon / (\|\mathbf{x}_i - \mathbf{x}_j\| +
    \epsilon) \in (1, 2]` (coincident points: :math:`0` in both). With ``tanh=True``,
    :math:`\phi_x` is bounded by ``coords_range * tanh``. Coordinates may have any dimension
    :math:`D`. Squared distances and norms are computed in at least float32 (a float16 squared
    distance overflows beyond a distance of 256), and the squared distances meet
    :math:`\phi_e`'s first layer in that precision, which :func:`torch.autocast` does not
    narrow there, except where :math:`\phi_e` runs as it is on each edge (fewer edges than
    nodes, or hooks on it), which takes them in its own dtype.

    ``h`` is invariant and ``pos`` equivariant under rotations, reflections and translations of
    ``pos`` (and under permutations of the nodes with ``edge_index`` relabelled).

    Args:
        channels (int): Size of the invariant node features ``h`` (input and output, for the
            residual connection).
        hidden_channels (int, optional): Width of the MLPs and of the messages
            :math:`\mathbf{m}_{ij}`. (default: :obj:`None`, i.e. ``channels``)
        edge_dim (int, optional): Size of the invariant edge attributes :math:`\mathbf{a}_{ij}`;
            ``0`` for none. (default: :obj:`0`)
        aggr (str, list or Aggregation, optional): Aggregation of the messages
            :math:`\mathbf{m}_{ij}`, as PyG's :class:`~torch_geometric.nn.MessagePassing` takes
            it: the name of an aggregation that needs no constructor arguments (``"add"``,
            ``"mean"``, ``"max"``, ``"softmax"``, ``"deepsets"``, ..., in any spelling PyG's
            resolver accepts), a list of them, or an
            :class:`~torch_geometric.nn.aggr.Aggregation` object. It must return one row of
            width ``hidden_channels`` per node (a :class:`ValueError` names the shape at the
            first call otherwise: a list, or a ``MultiAggregation`` in ``mode='cat'``, is
            wider). Refused with a :class:`ValueError`: anything else (:obj:`None`, which
            PyG takes for a layer that aggregates itself), names PyG does not know, names
            needing constructor arguments
            (``"sort"``, ``"set2set"``, ...: pass the object), and aggregations whose output
            depends on the order of the messages (LSTM, GRU, MLP and patch-transformer
            aggregations, alone or inside another), which would break the layer's invariance.
            (default: :obj:`"add"`, as in the paper)
        coord_aggr (str, optional): Aggregation of the coordinate updates, ``"mean"`` or ``"sum"``.
            (default: :obj:`"mean"`)
        edge_gate (bool, optional): Multiply each message by the soft edge weight
            :math:`\sigma(\phi_{\mathrm{inf}}(\mathbf{m}_{ij}))`. (default: :obj:`False`)
        normalize (bool, optional): Use unit coordinate differences in the coordinate update.
            (default: :obj:`False`)
        detach_norm (bool, optional): With ``normalize=True``, do not back-propagate through the
            norm that divides the coordinate differences (the authors' choice); the values differ
            from ``detach_norm=False`` only for pairs closer than ``eps`` (see above).
            (default: :obj:`True`)
        tanh (bool, optional): Bound :math:`\phi_x` by ``coords_range * tanh``. (default: :obj:`False`)
        coords_range (float, optional): Bound of :math:`\phi_x` when ``tanh=True``.
            (default: :obj:`1.0`)
        update_coords (bool, optional): Update ``pos``; if :obj:`False`, ``pos`` is returned
            unchanged and :math:`\phi_x` is not built. (default: :obj:`True`)
        residual (bool, optional): Add ``h`` to :math:`\phi_h`'s output. (default: :obj:`True`)
        act (str, optional): Activation of the MLPs (a PyG activation name that resolves to
            a module: not ``'swish'``, which PyG resolves to a function, the same as
            ``'silu'``). An activation module is used as it is, the one instance in every MLP
            (a parametrised one, such as ``PReLU()``, shares its parameters across them).
            (default: :obj:`"silu"`)
        eps (float, optional): :math:`\epsilon` of the normalisation and of the safe norm, a
            positive number, used only with ``normalize=True`` and coordinate updates. It is
            added in the coordinates' dtype (float32 for half-precision ones), where a call
            refuses with a :class:`ValueError` one that would give NaN coordinates or gradients
            for coincident points: below the smallest normal number (float32: :math:`2^{-126}
            \approx 1.2 \cdot 10^{-38}`, float64: :math:`2^{-1022} \approx 2.2 \cdot
            10^{-308}`) or, with ``detach_norm=False``, whose clamp is at :math:`\epsilon^2`,
            below :math:`2^{-74.5} \approx 3.7 \cdot 10^{-23}` (float64: :math:`2^{-537}
            \approx 2.2 \cdot 10^{-162}`); below the float64 bound already at construction.
            (default: :obj:`1e-8`)

    Shapes:
        - **input:** h :math:`(N, F)`, pos :math:`(N, D)`, edge_index :math:`(2, E)`,
          edge_attr :math:`(E, F_e)` (optional)
        - **output:** h :math:`(N, F)`, pos :math:`(N, D)`
    """
    def __init__(
        self,
        channels: int,
        hidden_channels: Optional[int] = None,
        edge_dim: int = 0,
        aggr: str = 'add',
        coord_aggr: str = 'mean',
        edge_gate: bool = False,
        normalize: bool = False,
        detach_norm: bool = True,
        tanh: bool = False,
        coords_range: float = 1.0,
        update_coords: bool = True,
        residual: bool = True,
        act: str = 'silu',
        eps: float = 1e-8,
    ):
        if not isinstance(aggr, (str, list, tuple, Aggregation)):
            # (None, which PyG takes for a layer that aggregates itself, and other objects
            # failed with an AttributeError)
            raise ValueError(f"'aggr' must be the name of an aggregation, a list of names or an "
                             f"Aggregation object (got {aggr!r})")
        try:
            super().__init__(aggr=aggr)
        except TypeError as err:  # a name PyG resolves to a class that needs arguments
            raise ValueError(f"'aggr' {aggr!r} names an aggregation that needs constructor "
                             f"arguments ({err}); pass the Aggregation object itself, e.g. "
                             f"aggr=SortAggregation(k=4)") from None
        except ValueError as err:  # a name PyG does not know
            raise ValueError(f"'aggr' {aggr!r} names no aggregation of PyG's ({err})") from None
        order_dependent = [type(m).__name__ for m in self.aggr_module.modules()
                           if isinstance(m, _ORDER_DEPENDENT_AGGRS)]
        if order_dependent:
            raise ValueError(f"'aggr' {aggr!r} depends on the order of the messages "
                             f"({', '.join(order_dependent)}), which would break EGNNConv's "
                             f"invariance to permutations of the nodes")
        # (hidden_channels=0 was read as None, i.e. channels; eps <= 0 divided coincident
        # points by zero with normalize, NaN coordinates; a text flag such as 'False' is true)
        channels = check_count('channels', channels)
        hidden_channels = check_optional_count('hidden_channels', hidden_channels)
        edge_dim = check_count('edge_dim', edge_dim, low=0)
        edge_gate, normalize, detach_norm, tanh, update_coords, residual = (
            check_flag(k, v) for k, v in (('edge_gate', edge_gate), ('normalize', normalize),
                                          ('detach_norm', detach_norm), ('tanh', tanh),
                                          ('update_coords', update_coords),
                                          ('residual', residual)))
        coords_range = check_number('coords_range', coords_range, allow_zero=True)
        eps = check_number('eps', eps)
        if normalize and update_coords:  # (eps serves the normalisation alone)
            # too small in every dtype; the coordinates' own is checked at the call (a float64
            # layer on float64 coordinates takes eps=1e-50, which is 0 in float32)
            _check_eps(eps, torch.float64, detach_norm)
        _check_layer_options(coord_aggr, act)
        self.channels = channels
        self.hidden_channels = hidden = hidden_channels or channels
        self.edge_dim = edge_dim
        self.coord_aggr = coord_aggr
        self.edge_gate = edge_gate
        self.normalize = normalize
        self.detach_norm = detach_norm
        self.tanh = tanh
        self.coords_range = coords_range
        self.update_coords = update_coords
        self.residual = residual
        self.act = act
        self.eps = eps

        self.edge_mlp = Sequential(  # phi_e
            Linear(2 * channels + 1 + edge_dim, hidden), _activation(act),
            Linear(hidden, hidden), _activation(act))
        self.gate_lin = Linear(hidden, 1) if edge_gate else None  # phi_inf
        self.coord_mlp = Sequential(  # phi_x
            Linear(hidden, hidden), _activation(act),
            Linear(hidden, 1, bias=False)) if update_coords else None
        self.node_mlp = Sequential(  # phi_h
            Linear(channels + hidden, hidden), _activation(act),
            Linear(hidden, channels))
        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        # (in this order: the same draws as before for the same seed)
        for module in (self.edge_mlp, self.gate_lin, self.coord_mlp, self.node_mlp):
            _reset_mlp(module)
        if self.coord_mlp is not None:
            torch.nn.init.xavier_uniform_(self.coord_mlp[-1].weight, gain=0.001)

    def __prepare_scriptable__(self) -> 'EGNNConv':
        # (torch.jit.script failed inside: "Compiled functions can't take variable number of
        # arguments or use keyword-only arguments with defaults", at forward)
        refuse_jit_script(type(self).__name__, "its forward checks its inputs and chooses how "
                          "to compute the messages in Python")

    def forward(self, h: Tensor, pos: Tensor, edge_index: Tensor,
                edge_attr: Optional[Tensor] = None, *,
                update_coords: bool = True) -> Tuple[Tensor, Tensor]:
        r"""Returns ``(h', pos')``. With ``update_coords=False`` this call computes no
        coordinate update (:math:`\phi_x` is not evaluated) and returns ``pos`` unchanged;
        ``h'`` is the same either way (it never depends on the update): for a last layer whose
        coordinates nothing reads."""
        if h.dim() != 2 or h.size(1) != self.channels:
            raise ValueError(f"Expected 'h' of shape (N, {self.channels}), got {tuple(h.shape)}")
        if pos.dim() != 2 or pos.size(0) != h.size(0) or not pos.is_floating_point():
            # (integer coordinates ran, and with normalize their unit differences were cast
            # back to integers: truncated to 0 or +-1)
            raise ValueError(f"Expected floating 'pos' of shape ({h.size(0)}, D), got "
                             f"{tuple(pos.shape)} and dtype {pos.dtype}")
        if pos.size(1) == 0:  # (it ran without any geometry)
            raise ValueError(f"Expected 'pos' with at least one coordinate column, of shape "
                             f"({h.size(0)}, D) with D >= 1, got {tuple(pos.shape)}")
        if edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise ValueError(f"Expected 'edge_index' of shape (2, E), got "
                             f"{tuple(edge_index.shape)}")
        if self.normalize and self.coord_mlp is not None and update_coords:
            # eps in the dtype the coordinates are normalised in (see message())
            _check_eps(self.eps, torch.promote_types(pos.dtype, torch.float32), self.detach_norm)
        if self.edge_dim > 0:
            if edge_attr is None or edge_attr.dim() != 2 or edge_attr.shape != (
                    edge_index.size(1), self.edge_dim):
                got = None if edge_attr is None else tuple(edge_attr.shape)
                raise ValueError(f"Expected 'edge_attr' of shape ({edge_index.size(1)}, "
                                 f"{self.edge_dim}), got {got}")
        elif edge_attr is not None:
            raise ValueError("'edge_attr' was given but the layer was built with edge_dim=0")
        dtype = self.edge_mlp[0].weight.dtype if hasattr(self.edge_mlp[0], 'weight') else None
        device = h.device.type
        # (the coordinates may come in another dtype: promoted)
        if (dtype is not None and torch.is_autocast_enabled(device)
                and torch.float64 not in (h.dtype, dtype)):
            # autocast casts h where it meets a weight, not where it joins the aggregated
            # messages (of the autocast dtype): float16 beside bfloat16 failed there
            cast = torch.get_autocast_dtype(device)
            if h.dtype not in (torch.float32, cast):
                raise ValueError(f"Expected 'h' of float32 or {cast} under torch.autocast to "
                                 f"{cast} (got {h.dtype}); convert it (e.g. h.float())")
        elif dtype is not None and h.dtype != dtype:
            # (under autocast too where either is float64, which it does not cast: the first
            # matrix product failed)
            raise ValueError(f"Expected 'h' of the layer's dtype {dtype} (got {h.dtype}); "
                             f"convert it, or the layer (e.g. .to({h.dtype}))")

        first = self.edge_mlp[0]
        if (edge_index.size(1) < h.size(0) or type(first) is not Linear
                or _hooked(first) or _hooked(self.edge_mlp)):
            # fewer edges than nodes (mapping each edge's inputs is cheaper), a replaced first
            # layer (e.g. quantized), or hooks (e.g. pruning's): phi_e runs as it is
            a, b, rest = h, h, None
        else:
            # phi_e's first layer on [h_i, h_j, d_ij^2, a_ij] split by its input blocks:
            # W [h_i; h_j; d^2; a] + c = (W_i h + c)_i + (W_j h)_j + w_d d^2 + W_a a, so the two
            # node blocks are mapped once per node, not once per edge (exact up to rounding;
            # no (E, 2F + 1) concatenation; benchmarks/results/training_step_egnn*)
            F_ = self.channels
            a = torch.nn.functional.linear(h, first.weight[:, :F_], first.bias)  # (N, H)
            b = torch.nn.functional.linear(h, first.weight[:, F_:2 * F_])  # (N, H)
            rest = first.weight[:, 2 * F_:]  # (H, 1 + F_e)
        m_aggr, delta = self.propagate(edge_index, a=a, b=b, pos=pos, edge_attr=edge_attr,
                                       rest=rest, coords=update_coords)
        out = self.node_mlp(torch.cat([h, m_aggr], dim=-1))  # (N, F)
        if self.residual:
            out = h + out
        if self.update_coords and update_coords:
            pos = pos + delta  # (N, D)
        return out, pos

    def message(self, a_i: Tensor, b_j: Tensor, pos_i: Tensor, pos_j: Tensor,
                edge_attr: Optional[Tensor], rest: Optional[Tensor],
                coords: bool = True) -> Tuple[Tensor, Tensor]:
        diff = pos_i - pos_j  # (E, D)
        # half-precision coordinates: d^2 (and the norm) in float32, as radius_edge_index has
        # them: float16 squared distances overflow beyond a distance of 256 (the messages were
        # NaN), and eps = 1e-8 is zero in float16 (coincident points gave 0 / 0 with normalize)
        wide = diff.float() if diff.dtype in (torch.float16, torch.bfloat16) else diff
        sq_dist = wide.pow(2).sum(dim=-1, keepdim=True)  # (E, 1)
        if rest is None:  # a, b are h: phi_e as it is
            # (d^2 in the features' dtype: coordinates wider than the layer, e.g. float64
            # beside float32 weights, would promote the concatenation past phi_e's dtype)
            # (and edge attributes too, as the per-node path has them: float64 ones beside
            # float32 weights failed here alone)
            inputs = [a_i, b_j, sq_dist.to(a_i.dtype)] + (
                [edge_attr.to(a_i.dtype)] if edge_attr is not None else [])
            m = self.edge_mlp(torch.cat(inputs, dim=-1))  # (E, H)
        else:  # a, b are the node blocks of phi_e's first layer (see forward)
            # the per-edge columns [d^2, a] meet their weight columns in one matrix product
            # added to a_i + b_j (edge attributes in phi_e's dtype, as the concatenation
            # promotes them): its backward pass is two matrix products, where an elementwise
            # d^2 * w had broadcast products over (E, H) and their sums
            # (in the dtype the concatenation and addcmul promote to: pos may be wider or
            # narrower than the weights, and addmm does not promote)
            # (outside autocast, which would cast d^2 to its dtype: in float16 beyond 65,504)
            dtype = torch.promote_types(sq_dist.dtype, rest.dtype)
            per_edge = sq_dist if edge_attr is None else torch.cat(
                [sq_dist, edge_attr.to(rest.dtype)], dim=-1)  # (E, 1 + F_e)
            device = per_edge.device.type
            with (torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device)
                  else contextlib.nullcontext()):
                m = torch.addmm((a_i + b_j).to(dtype), per_edge.to(dtype),
                                rest.t().to(dtype)).to(rest.dtype)  # (E, H), in phi_e's dtype
            for layer in list(self.edge_mlp.children())[1:]:
                m = layer(m)  # (E, H)
        if self.gate_lin is not None:
            m = m * torch.sigmoid(self.gate_lin(m))  # (E, H)
        if self.coord_mlp is None or not coords:
            return m, diff.new_zeros(diff.size(0), 0)  # (E, H), (E, 0)
        if self.normalize:
            if self.detach_norm:  # egnn_clean: norm = torch.sqrt(radial).detach() + epsilon
                norm = sq_dist.detach().sqrt()  # (E, 1)
            else:
                norm = _safe_norm(sq_dist, self.eps)  # (E, 1)
            diff = (wide / (norm + self.eps)).to(diff.dtype)  # (E, D)
        weight = self.coord_mlp(m)  # (E, 1)
        if self.tanh:
            weight = self.coords_range * torch.tanh(weight)
        return m, diff * weight  # (E, H), (E, D)

    def aggregate(self, inputs: Tuple[Tensor, Tensor], index: Tensor, ptr: Optional[Tensor] = None,
                  dim_size: Optional[int] = None) -> Tuple[Tensor, Tensor]:
        m, delta = inputs
        if dim_size is None:
            dim_size = int(index.max()) + 1 if index.numel() else 0
        if type(self.aggr_module) is SumAggregation and not _hooked(self.aggr_module):
            # the sum of the messages as an index_add_ (backward: an index_select), the same
            # sum as PyG's scatter_add_ over a broadcast index (backward: a gather) up to the
            # order of the additions
            m_aggr = _index_sum(m, index, dim_size)  # (N, H)
        else:
            m_aggr = self.aggr_module(m, index, ptr=ptr, dim_size=dim_size)  # (N, H)
            if m_aggr.shape != (dim_size, m.size(-1)):  # an aggregation object of other width
                raise ValueError(f"EGNNConv's aggregation {self.aggr_module} returned shape "
                                 f"{tuple(m_aggr.shape)}; expected one row of the messages' "
                                 f"width per node, ({dim_size}, {m.size(-1)})")
        delta = _index_sum(delta, index, dim_size)  # (N, D)
        if self.coord_aggr == 'mean' and delta.size(1):  # PyG's scatter mean: sum / max(1, deg)
            degree = torch.bincount(index, minlength=dim_size).clamp_(min=1)  # (N,)
            delta = delta / degree.unsqueeze(-1).to(delta.dtype)
        return m_aggr, delta

    def _aggr_repr(self) -> str:
        r"""``aggr`` as it was given: a name quoted, an Aggregation object as its repr (PyG keeps
        both as text, the object's as ``str(aggr)``), a list of them as a list."""
        def one(text: str, module: Module) -> str:
            return text if text == str(module) else repr(text)
        if isinstance(self.aggr, str):
            return one(self.aggr, self.aggr_module)
        modules = getattr(self.aggr_module, 'aggrs', ())
        if (isinstance(self.aggr, list) and isinstance(self.aggr_module, MultiAggregation)
                and len(modules) == len(self.aggr)):
            return f"[{', '.join(one(t, m) for t, m in zip(self.aggr, modules))}]"
        return repr(self.aggr)

    def __repr__(self) -> str:
        # string options quoted, as EGNN's are: eval(repr(conv)) builds the same layer
        return (f'{self.__class__.__name__}({self.channels}, hidden_channels={self.hidden_channels}, '
                f'edge_dim={self.edge_dim}, aggr={self._aggr_repr()}, '
                f'coord_aggr={self.coord_aggr!r}, '
                f'edge_gate={self.edge_gate}, normalize={self.normalize}, '
                f'detach_norm={self.detach_norm}, tanh={self.tanh}, '
                f'coords_range={self.coords_range}, update_coords={self.update_coords}, '
                f'residual={self.residual}, act={self.act!r}, eps={self.eps})')


def _index_sum(src: Tensor, index: Tensor, dim_size: int) -> Tensor:
    r"""The rows of :obj:`src` summed into :obj:`dim_size` rows by :obj:`index`."""
    return src.new_zeros(dim_size, src.size(1)).index_add_(0, index, src)  # (N, C)


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------
class EGNN(Module):
    r"""The EGNN set/molecule model of `"E(n) Equivariant Graph Neural Networks"
    <https://arxiv.org/abs/2102.09844>`_: an embedding, ``num_layers`` :class:`EGNNConv` layers on
    a graph inside each set, a node-wise MLP, invariant pooling over each set, and an MLP head.

    .. math::
        \mathbf{h}^{(0)}_i &= \mathbf{W}_{\mathrm{emb}} \mathbf{f}_i + \mathbf{b}_{\mathrm{emb}},
            \qquad (\mathbf{h}^{(l+1)}, \mathbf{x}^{(l+1)}) =
            \mathrm{EGNNConv}_l(\mathbf{h}^{(l)}, \mathbf{x}^{(l)})

        \mathbf{y}_s &= \mathrm{MLP}_{\mathrm{out}}\Big(\bigoplus_{i \in s}
            \mathrm{MLP}_{\mathrm{node}}(\mathbf{h}^{(K)}_i)\Big)

    with :math:`\bigoplus` the sum or the mean over the elements of set :math:`s`. The prediction
    :math:`\mathbf{y}_s` is invariant to rotations, reflections and translations of each set's
    coordinates and to permutations inside a set; :meth:`encode` returns the equivariant coordinates.

    The graph is fully connected inside each set (all ordered pairs :math:`i \neq j`, see
    :func:`fully_connected_edge_index`) or, with ``radius``, restricted to pairs at most ``radius``
    apart in the input coordinates (:func:`radius_edge_index`); building either costs
    :math:`O(\sum_s n_s^2)`, and so does each layer on the fully connected graph. The graph is built
    once from the input coordinates and kept for all layers. Sets never exchange information.

    With ``update_coords=False`` no layer moves the points: the coordinates enter only through the
    squared distances :math:`\|\mathbf{x}_i - \mathbf{x}_j\|^2` of the messages, and :meth:`encode`
    returns them unchanged. That is the authors' QM9 model (``E_GCL_mask`` in their
    ``qm9/models.py``, which deletes the coordinate MLP; their ``main_qm9.py`` defaults: 7 layers,
    width 128, attention on, i.e. ``edge_gate=True``, sum pooling), offered as the preset
    ``egnn-qm9`` of :mod:`torch_mz.models.registry`. Their input features (one-hot atom types
    times powers of the charge) are the dataset's business, not the model's.

    Inputs: coordinates come from ``pos``; if ``pos`` is :obj:`None` and ``pos_dim`` is set, the
    first ``pos_dim`` columns of ``x`` are the coordinates and the rest are the invariant features
    (the layout ``[pos, x]`` the set models read, see :func:`split_pos_features`). With
    ``in_channels=0`` the model takes no features and embeds a constant ``1`` for every element.
    ``pos`` must be floating point; ``x`` and ``pos`` meet in the wider of their dtypes, which must
    be the model's (float64 coordinates beside a float32 model raise a :class:`ValueError`, they
    are not cast), except under :func:`torch.autocast` for float32 and half-precision inputs.
    An element with a NaN or infinite coordinate has NaN features (:meth:`encode`) and its set a
    NaN prediction, also where it has no edge (a set of one element; with ``radius``, a point at
    an infinite distance from the others); the other sets are unaffected.

    Args:
        in_channels (int): Number of invariant element features (not counting coordinates);
            ``0`` for none.
        hidden_channels (int, optional): Width of ``h`` and of all MLPs. (default: :obj:`64`)
        out_channels (int, optional): Outputs per set: ``1`` for scalar regression, the number of
            classes (logits) for classification. (default: :obj:`1`)
        num_layers (int, optional): Number of :class:`EGNNConv` layers. (default: :obj:`4`)
        pos_dim (int, optional): If set, coordinates are read from ``x[:, :pos_dim]`` whenever no
            ``pos`` is given. (default: :obj:`None`)
        pool (str, optional): Pooling over each set, ``"sum"`` or ``"mean"``. (default: :obj:`"sum"`)
        radius (float, optional): Cut-off of the radius graph; :obj:`None` for the fully connected
            graph. (default: :obj:`None`)
        coord_aggr (str, optional): Coordinate aggregation of every layer, ``"mean"`` or ``"sum"``.
            (default: :obj:`"mean"`)
        edge_gate (bool, optional): Soft edge gate in every layer. (default: :obj:`False`)
        normalize (bool, optional): Unit coordinate differences in every layer. Without it
            the coordinate updates grow with the coordinates, layer by layer: give coordinates
            of about unit size (e.g. PyG's ``NormalizeScale``), since on coordinates of
            magnitude 10^3 the outputs of an untrained model overflow to NaN, without an error.
            (default: :obj:`False`)
        detach_norm (bool, optional): With ``normalize=True``, treat the norm as a constant in
            back-propagation, as the authors do (see :class:`EGNNConv`). (default: :obj:`True`)
        tanh (bool, optional): ``tanh``-bounded coordinate MLP in every layer. (default: :obj:`False`)
        update_coords (bool, optional): Update the coordinates in every layer; :obj:`False` keeps
            them fixed (the authors' QM9 model). (default: :obj:`True`)
        act (str, optional): Activation, as :class:`EGNNConv` takes it (a PyG activation name
            that resolves to a module, or an activation module, the one instance in every
            layer and MLP). (default: :obj:`"silu"`)

    Shapes:
        - **input:** x :math:`(N, F)` or :math:`(N, D + F)` with ``pos_dim``, pos :math:`(N, D)`,
          batch :math:`(N)`
        - **output:** :meth:`forward`: :class:`~torch_mz.models.base.SetPrediction` with
          prediction :math:`(S, \text{out\_channels})` and ihw :obj:`None`; :meth:`encode`:
          h :math:`(N, \text{hidden\_channels})`, pos :math:`(N, D)`
    """
    def __init__(
        self,
        in_channels: int,
        hidden_channels: int = 64,
        out_channels: int = 1,
        num_layers: int = 4,
        pos_dim: Optional[int] = None,
        pool: str = 'sum',
        radius: Optional[float] = None,
        coord_aggr: str = 'mean',
        edge_gate: bool = False,
        normalize: bool = False,
        detach_norm: bool = True,
        tanh: bool = False,
        update_coords: bool = True,
        act: str = 'silu',
    ):
        super().__init__()
        in_channels = check_count('in_channels', in_channels, low=0)
        out_channels = check_count('out_channels', out_channels)
        pos_dim = check_optional_count('pos_dim', pos_dim)
        radius = None if radius is None else check_number('radius', radius, allow_zero=True)
        hidden_channels = check_count('hidden_channels', hidden_channels)
        num_layers = check_count('num_layers', num_layers, low=0)
        edge_gate, normalize, detach_norm, tanh, update_coords = (
            check_flag(k, v) for k, v in (('edge_gate', edge_gate), ('normalize', normalize),
                                          ('detach_norm', detach_norm), ('tanh', tanh),
                                          ('update_coords', update_coords)))
        if in_channels < 0 or hidden_channels < 1 or out_channels < 1 or num_layers < 0:
            raise ValueError(f"Expected in_channels >= 0, hidden_channels >= 1, out_channels >= 1 "
                             f"and num_layers >= 0, got {in_channels}, {hidden_channels}, "
                             f"{out_channels} and {num_layers}")
        if pos_dim is not None and pos_dim < 1:
            raise ValueError(f"'pos_dim' must be positive, got {pos_dim}")
        if pool not in _POOLS:
            raise ValueError(f"'pool' must be one of {_POOLS}, got '{pool}'")
        # the layers' options, also where no layer is built (num_layers=0 took any)
        _check_layer_options(coord_aggr, act)
        if radius is not None and not radius >= 0:  # (NaN too: it gave no edge)
            raise ValueError(f"'radius' must be non-negative, got {radius}")
        # (each layer: at least 4 h^2 parameters, in its edge and node MLPs, and 10 modules)
        check_fits(f'num_layers={num_layers}, hidden_channels={hidden_channels}',
                   num_layers * 4 * hidden_channels * hidden_channels, 10 * num_layers)
        self.in_channels = in_channels
        self.hidden_channels = hidden_channels
        self.out_channels = out_channels
        self.num_layers = num_layers
        self.pos_dim = pos_dim
        self.pool = pool
        self.radius = radius
        self.coord_aggr = coord_aggr
        self.edge_gate = edge_gate
        self.normalize = normalize
        self.detach_norm = detach_norm
        self.tanh = tanh
        self.update_coords = update_coords
        self.act = act

        self.embedding = Linear(max(in_channels, 1), hidden_channels)
        self.convs = ModuleList([
            EGNNConv(hidden_channels, coord_aggr=coord_aggr, edge_gate=edge_gate,
                     normalize=normalize, detach_norm=detach_norm, tanh=tanh,
                     update_coords=update_coords, act=act) for _ in range(num_layers)
        ])
        self.node_mlp = Sequential(
            Linear(hidden_channels, hidden_channels), _activation(act),
            Linear(hidden_channels, hidden_channels))
        self.head = Sequential(
            Linear(hidden_channels, hidden_channels), _activation(act),
            Linear(hidden_channels, out_channels))
        self.reset_parameters()

    def reset_parameters(self):
        self.embedding.reset_parameters()
        for conv in self.convs:
            conv.reset_parameters()
        for mlp in (self.node_mlp, self.head):
            _reset_mlp(mlp)

    def __prepare_scriptable__(self) -> 'EGNN':
        # (torch.jit.script failed inside, at EGNNConv's keyword-only argument)
        refuse_jit_script(type(self).__name__)

    def _unpack(
        self,
        x: Union[BaseData, Tensor, None],
        pos: Optional[Tensor],
        batch: Optional[Tensor],
        num_sets: Optional[int],
    ) -> Tuple[Tensor, Tensor, Tensor, int]:
        # Returns features (N, max(F, 1)), pos (N, D), batch (N,) and the number of sets.
        # (a trace kept the traced batch's pairs of elements and number of sets: on a batch of
        # the same set sizes with its elements in another order it gave other values)
        refuse_jit_trace(type(self).__name__)
        if isinstance(x, BaseData):
            data = x
            if pos is not None or batch is not None:
                raise ValueError("Pass either a Data/Batch object or tensors (x, pos, batch), "
                                 "not both")
            x, pos, batch = data.x, data.pos, batch_vector(data)
            if num_sets is None and (isinstance(data, Batch) or batch is None):
                num_sets = data.num_graphs if isinstance(data, Batch) else 1
            # (a plain Data carrying 'batch': its largest id plus one, as PyG's pooling counts)
        if pos is None:
            if self.pos_dim is None or x is None:
                raise ValueError("EGNN needs coordinates: pass 'pos' (or 'data.pos'), or build the "
                                 "model with 'pos_dim' to read them from the first columns of 'x'")
            width = x.size(-1) if x.dim() == 2 else None
            pos, x = split_pos_features(x, self.pos_dim)
            split_from = width
        else:
            split_from = None
        if pos.dim() != 2 or not pos.is_floating_point():
            raise ValueError(f"Expected floating 'pos' of shape (N, D), got {tuple(pos.shape)} "
                             f"and dtype {pos.dtype}")
        if pos.size(1) == 0:  # (it ran without any geometry)
            raise ValueError(f"Expected 'pos' with at least one coordinate column, of shape "
                             f"(N, D) with D >= 1, got {tuple(pos.shape)}")
        if self.pos_dim is not None and pos.size(1) != self.pos_dim:
            raise ValueError(f"The model was built with pos_dim={self.pos_dim} but received "
                             f"coordinates of width {pos.size(1)}")
        num_nodes = pos.size(0)
        if x is not None and x.dim() == 2 and x.size(1) == 0:
            x = None
        if self.in_channels == 0:
            if x is not None:
                raise ValueError(f"The model was built with in_channels=0 but received features "
                                 f"of shape {tuple(x.shape)}")
            x = pos.new_ones(num_nodes, 1)  # (N, 1) constant feature
        elif x is None or x.dim() != 2 or x.shape != (num_nodes, self.in_channels):
            got = None if x is None else tuple(x.shape)
            hint = ('' if x is not None else
                    ": the input has no features 'x'; for coordinates alone build EGNN with "
                    "in_channels=0 (build_model('egnn', in_channels, ..., pos_dim=D) counts "
                    "[pos, x], so in_channels=D there)")
            if x is None and split_from is not None and self.pos_dim is not None:
                hint = (f": 'x' has {split_from} columns, and the first pos_dim={self.pos_dim} "
                        f"are read as the coordinates (there is no 'pos'), which leaves "
                        f"{split_from - self.pos_dim} features")
            if (self.pos_dim is None and x is not None and x.dim() == 2
                    and x.size(0) == num_nodes and x.size(1) + pos.size(1) == self.in_channels):
                hint = (f": in_channels={self.in_channels} counts the {pos.size(1)} coordinate "
                        f"columns too (a task's in_channels does): build the model with "
                        f"pos_dim={pos.size(1)} (build_model('egnn', task.in_channels, "
                        f"task.out_channels, pos_dim=task.pos_dim)), or with "
                        f"in_channels={x.size(1)}")
            raise ValueError(f"Expected features of shape ({num_nodes}, {self.in_channels}), "
                             f"got {got}{hint}")
        # x and pos meet in the wider of their dtypes, as set_features has them (x was cast to
        # pos's: float64 features rounded to float32 without a word, and a float64 model
        # refused them beside float32 coordinates); integer or boolean x take pos's
        dtype = torch.promote_types(pos.dtype, x.dtype)
        param = next(self.parameters(), None)
        if param is not None and dtype != param.dtype and (
                torch.float64 in (dtype, param.dtype)
                or not torch.is_autocast_enabled(pos.device.type)):
            # (autocast casts float32, float16 and bfloat16 inputs, not float64 ones, and no
            # float64 weights: a float64 model's matrix products failed on cast inputs)
            what, came = ("'pos'", str(pos.dtype)) if dtype == pos.dtype else (
                "'pos' and 'x'", f"{x.dtype} 'x' beside {pos.dtype} 'pos', which meet in {dtype}")
            if param.dtype == torch.float64:
                remedy = (f"convert the input or the model (e.g. .to({dtype})); torch.autocast "
                          "does not cast a float64 model's weights")
            else:
                remedy = (f"convert the input, convert the model (e.g. .to({dtype})), or run "
                          "under torch.autocast (which does not cast float64 input)")
            raise ValueError(f"Expected {what} of the model's dtype {param.dtype} (got {came}); "
                             f"{remedy}")
        if batch is None:
            batch = torch.zeros(num_nodes, dtype=torch.long, device=pos.device)
            num_sets = 1 if num_sets is None else num_sets
        elif batch.numel() != num_nodes:
            raise ValueError(f"'batch' has {batch.numel()} entries but there are {num_nodes} "
                             f"elements")
        batch, num_sets = check_set_ids(batch, batch.numel(), num_sets, 'batch')
        return x.to(dtype), pos.to(dtype), batch, num_sets

    def build_edge_index(self, pos: Tensor, batch: Tensor,
                         num_sets: Optional[int] = None) -> Tensor:
        r"""The graph the model uses: :func:`radius_edge_index` if ``radius`` is set, else
        :func:`fully_connected_edge_index`."""
        if self.radius is not None:
            return radius_edge_index(pos, self.radius, batch, num_sets)
        return fully_connected_edge_index(batch, num_sets)

    def _encode(self, x: Tensor, pos: Tensor, batch: Tensor, num_sets: int,
                last_coords: bool = True) -> Tuple[Tensor, Tensor]:
        # (last_coords=False: the last layer computes no coordinate update, which forward does
        # not read; pos is then that of the layer before)
        edge_index = self.build_edge_index(pos, batch, num_sets)  # (2, E)
        # elements with a NaN or infinite coordinate: their features are made NaN below, so
        # that their set's prediction is NaN. Through an edge the coordinate reaches them anyway,
        # but an element without edges (a set of one element; with a radius, a point at an
        # infinite distance, cut off) kept finite features, and its set a finite prediction
        invalid = ~torch.isfinite(pos).all(dim=-1, keepdim=True)  # (N, 1)
        h = self.embedding(x)  # (N, hidden)
        for i, conv in enumerate(self.convs):
            update = last_coords or i < len(self.convs) - 1
            h, pos = conv(h, pos, edge_index, update_coords=update)
        # (masked, not added: the features of every other element are left bit for bit)
        return h.masked_fill(invalid, float('nan')), pos

    def encode(
        self,
        x: Union[BaseData, Tensor, None] = None,
        pos: Optional[Tensor] = None,
        batch: Optional[Tensor] = None,
        num_sets: Optional[int] = None,
    ) -> Tuple[Tensor, Tensor]:
        r"""Runs the embedding and the :class:`EGNNConv` layers and returns the per-element
        invariant features ``h`` :math:`(N, \text{hidden\_channels})` and equivariant coordinates
        ``pos`` :math:`(N, D)`. Takes the same inputs as :meth:`forward`."""
        return self._encode(*self._unpack(x, pos, batch, num_sets))

    def forward(
        self,
        x: Union[BaseData, Tensor, None] = None,
        pos: Optional[Tensor] = None,
        batch: Optional[Tensor] = None,
        num_sets: Optional[int] = None,
    ) -> SetPrediction:
        r"""Predicts one output row per set, as a
        :class:`~torch_mz.models.base.SetPrediction` ``(prediction, None)`` (EGNN has no
        uncertainty output).

        Call it as ``model(data)`` with a PyG :class:`~torch_geometric.data.Data` or
        :class:`~torch_geometric.data.Batch` (fields ``x``, ``pos``, ``batch``; ``x`` may be absent
        when ``in_channels=0``, ``pos`` when ``pos_dim`` is set), or as ``model(x, pos, batch)``
        with tensors. ``num_sets`` defaults to ``data.num_graphs`` for a batch, otherwise to
        ``batch.max() + 1``; pass it when trailing sets may be empty. An empty set predicts zero
        (the contract of :mod:`torch_mz.models.base`).

        Args:
            x (torch_geometric.data.Data or torch.Tensor, optional): A PyG data object, or the
                element features (:obj:`None` when ``in_channels=0``). (default: :obj:`None`)
            pos (torch.Tensor, optional): Coordinates. (default: :obj:`None`)
            batch (torch.Tensor, optional): Set id of every element. (default: :obj:`None`, one set)
            num_sets (int, optional): Number of sets. (default: :obj:`None`)
        """
        x, pos, batch, num_sets = self._unpack(x, pos, batch, num_sets)
        h, _ = self._encode(x, pos, batch, num_sets, last_coords=False)  # (N, hidden)
        h = self.node_mlp(h)  # (N, hidden)
        h = scatter(h, batch, dim=0, dim_size=num_sets, reduce=self.pool)  # (S, hidden)
        prediction = zero_empty_sets(self.head(h), batch, num_sets)  # (S, out_channels)
        last = self.convs[-1].coord_mlp if self.num_layers > 0 else None
        if isinstance(last, Module) and torch.is_grad_enabled():
            # the last layer's coordinate update reaches no prediction (it is not computed): its
            # coordinate MLP got no gradient, which DistributedDataParallel
            # (find_unused_parameters=False) took for an error at the next step; joined at
            # weight zero (the same values), it gets a zero
            prediction = tie_parameters(prediction, last)
        return SetPrediction(prediction)

    def __repr__(self) -> str:
        # out_channels by name: the second argument of EGNN is hidden_channels (EGNN(6, 1, ...)
        # read as (in, out) gave hidden_channels twice)
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'out_channels={self.out_channels}, '
                f'hidden_channels={self.hidden_channels}, num_layers={self.num_layers}, '
                f'pos_dim={self.pos_dim}, pool={self.pool!r}, radius={self.radius}, '
                f'coord_aggr={self.coord_aggr!r}, edge_gate={self.edge_gate}, '
                f'normalize={self.normalize}, detach_norm={self.detach_norm}, tanh={self.tanh}, '
                f'update_coords={self.update_coords}, act={self.act!r})')
