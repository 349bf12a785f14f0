r"""The contract every model of :mod:`torch_mz.models` keeps: what it takes, what it returns,
what an empty set predicts, and where its input is checked.

* **Input**: a PyG :class:`~torch_geometric.data.Data`/:class:`~torch_geometric.data.Batch`, or
  tensors ``(x, batch)`` (EGNN: ``(x, pos, batch)``), and optionally ``num_sets`` for trailing
  empty sets. From a data object a model reads what a PyG model would: the coordinates ``pos``
  and, when present, the features ``x`` (:func:`set_features`: ``[pos, x]``; EGNN keeps ``pos``
  apart as coordinates), so PyG transforms compose with every model.
* **Output**: a :class:`SetPrediction` ``(prediction, ihw)``: ``prediction``
  :math:`(B, F_{out})`, one row per set (regression targets or class logits), and ``ihw``
  :math:`(B,)`, the MZ models' single-pass uncertainty (the summed interval-hull width of the
  pooled tokens), or :obj:`None` for a model that has none. It unpacks as a tuple
  (``prediction, ihw = model(batch)``) and reads by name (``model(batch).prediction``).
* **Empty sets** predict exactly zero (``ihw`` zero too), as an empty set aggregates to zero in
  :class:`~torch_mz.nn.MZAggregation` and PyG's sum/mean/max aggregations. A model trained on
  standardised targets that carries its normaliser (:func:`torch_mz.train.attach_normalizer`)
  maps that zero to the target mean.
* **Validation** happens once, at the model's boundary (:meth:`SetModel.validate`; for the MZ
  models :meth:`MZAggregation.validate <torch_mz.nn.MZAggregation.validate>`), with a
  :class:`ValueError` that says what was expected and what came.
* **Tracing**: :func:`torch.jit.trace` of a model (EGNN's too) is refused with a
  :class:`RuntimeError` naming :func:`torch.compile`: what a model reads of the sets on the host
  (the number of sets, an attention layout, EGNN's pairs of elements) would enter the trace as
  constants of the traced batch.
"""
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor
from torch.nn import LayerNorm, Module

from torch_mz._checks import refuse_jit_script, refuse_jit_trace
from torch_mz.nn._context import tie_parameters
from torch_mz.nn.aggr import check_input_magnitude, check_set_input, resolve_set_index
from torch_mz.nn.functional import set_counts

__all__ = [
    'SetPrediction', 'SetModel', 'set_features', 'batch_vector', 'batch_tensors',
    'zero_empty_sets'
]


class SetPrediction(NamedTuple):
    r"""The output of every model: ``prediction`` :math:`(B, F_{out})` and ``ihw`` :math:`(B,)`
    or :obj:`None` (see :mod:`torch_mz.models.base`)."""
    prediction: Tensor
    ihw: Optional[Tensor] = None


def set_features(data) -> Tensor:
    r"""What a model reads from a PyG data object, as a PyG point model would: the coordinates
    ``pos`` and the element features ``x`` side by side, ``[pos, x]`` :math:`(N, D + F)`, or
    whichever of the two is present. Coordinates live in ``pos`` only, so
    :mod:`torch_geometric.transforms` that act on ``pos`` (``RandomRotate``, ``RandomJitter``,
    ``NormalizeScale``, ``FixedPoints``, ...) reach every model. The two meet in the wider of
    their dtypes (:func:`torch.promote_types`): float64 features beside float32 coordinates give
    float64 columns, which a float32 model refuses, naming the dtype, rather than features
    rounded to float32 without a word; integer or boolean features take the coordinates'."""
    pos, x = getattr(data, 'pos', None), getattr(data, 'x', None)
    if pos is None and x is None:
        raise ValueError("Expected the batch to have coordinates 'pos' or node features 'x' "
                         "(got neither)")
    if pos is None:
        assert x is not None  # one of the two is present (checked above)
        return x
    if x is None:
        return pos
    if x.dim() != 2 or pos.dim() != 2 or x.size(0) != pos.size(0):
        raise ValueError(f"Expected 'pos' (N, D) and 'x' (N, F) with the same N (got "
                         f"{tuple(pos.shape)} and {tuple(x.shape)})")
    dtype = torch.promote_types(pos.dtype, x.dtype)  # (x was cast to pos's: float64 rounded)
    return torch.cat([pos.to(dtype), x.to(dtype)], dim=-1)  # (N, D + F)


def batch_vector(data) -> Optional[Tensor]:
    r"""The ``batch`` vector of a PyG data object: its own; for a
    :class:`~torch_geometric.data.Batch` whose ``batch`` was removed, the one its ``ptr``
    describes; :obj:`None` for an object of one set without it. A batch of several sets with
    neither is refused: read as one set, its sets would be pooled together."""
    batch = getattr(data, 'batch', None)
    if batch is not None:
        return batch
    num_graphs = getattr(data, 'num_graphs', None)  # a Batch's (a plain Data has none)
    if num_graphs is None or int(num_graphs) <= 1:
        return None
    ptr = getattr(data, 'ptr', None)
    if not isinstance(ptr, Tensor):
        raise ValueError(f"The batch holds {int(num_graphs)} sets but has no 'batch' vector "
                         f"(nor 'ptr') that says which elements belong to which set")
    if ptr.dim() != 1 or ptr.numel() != int(num_graphs) + 1 or ptr.is_floating_point():
        raise ValueError(f"The batch has no 'batch' vector and its 'ptr' is not the {num_graphs} "
                         f"+ 1 integer offsets of its {num_graphs} sets (got shape "
                         f"{tuple(ptr.shape)}, dtype {ptr.dtype})")
    counts = ptr.diff()
    if bool((counts < 0).any()):
        raise ValueError("The batch has no 'batch' vector and its 'ptr' decreases")
    sets = torch.arange(int(num_graphs), device=ptr.device)
    return torch.repeat_interleave(sets, counts)  # (N,); N against x: checked by the model


def batch_tensors(data_or_x, batch: Optional[Tensor] = None,
                  num_sets: Optional[int] = None) -> Tuple[Tensor, Optional[Tensor], Optional[int]]:
    r"""Reads ``(features, batch, num_sets)`` from a PyG data object (:func:`set_features`,
    ``batch``; ``num_sets`` defaults to ``num_graphs`` of a :class:`~torch_geometric.data.Batch`,
    to one set for an object without ``batch``, and for a plain data object that carries a
    ``batch`` vector to :obj:`None`, i.e. the largest id plus one, as PyG's pooling counts) or
    passes tensors through (without ``batch``, also an empty one, they are one set, as a data
    object without it); checks nothing else (the model's :meth:`~SetModel.validate` does)."""
    if isinstance(data_or_x, Tensor):
        return data_or_x, batch, 1 if batch is None and num_sets is None else num_sets
    data = data_or_x
    x = set_features(data)
    if batch is None:
        batch = batch_vector(data)
    if num_sets is None:
        num_graphs = getattr(data, 'num_graphs', None)  # a Batch's (a plain Data has none)
        if num_graphs is not None:
            num_sets = int(num_graphs)
        elif batch is None:
            num_sets = 1
    return x, batch, num_sets


def zero_empty_sets(prediction: Tensor, set_id: Tensor, num_sets: int) -> Tensor:
    r"""``prediction`` :math:`(B, F)` with the rows of empty sets set to exactly zero (the others
    unchanged, bit for bit)."""
    nonempty = (set_counts(set_id, num_sets) > 0).to(prediction.dtype)  # (B,)
    return prediction * nonempty.unsqueeze(-1)


class SetModel(Module):
    r"""Base class of the set models on PyG's flat layout (everything but EGNN, which also takes
    coordinates): :meth:`forward` reads the batch, validates it once (:meth:`validate`), runs
    :meth:`predict` and zeroes the predictions of empty sets. Subclasses set
    :attr:`in_channels` and implement :meth:`predict`.

    Shapes:
        - **input:** a PyG batch with ``pos`` :math:`(N, D)` and/or ``x`` :math:`(N, F)`
          (:math:`F_{in} = D + F`) and ``batch`` :math:`(N,)`, or ``(x, batch)``
        - **output:** :class:`SetPrediction`: :math:`(B, F_{out})` and :math:`(B,)` or
          :obj:`None`
    """
    in_channels: int
    #: Whether the input passes through an :class:`~torch_mz.nn.zonotope.InputProjection` (whose
    #: LayerNorm statistics overflow for large entries): :meth:`validate` then refuses entries
    #: beyond the limit of :class:`~torch_mz.nn.MZAggregation`
    #: (:func:`~torch_mz.nn.aggr.check_input_magnitude`); the other models only beyond the
    #: float16 limit where they compute in float16 (their first linear map overflows there).
    has_input_projection: bool = False

    def validate(self, x: Tensor, batch: Optional[Tensor],
                 num_sets: Optional[int]) -> Tuple[Tensor, int]:
        r"""Checks ``x`` (floating point, :math:`(N, F_{in})`, the model's dtype or under
        :func:`torch.autocast`, which takes a model with LayerNorms of float32 or the autocast
        dtype only: :func:`~torch_mz.nn.aggr.check_set_input`; with
        :attr:`has_input_projection`, finite entries within the magnitude limit of
        :class:`~torch_mz.nn.MZAggregation`, otherwise within its float16 limit where the model
        computes in float16) and the set index; returns the set id of every element and the
        number of sets."""
        param = next(self.parameters(), None)
        check_set_input(x, self.in_channels, torch.get_default_dtype() if param is None
                        else param.dtype,
                        layer_norm=any(isinstance(m, LayerNorm) for m in self.modules()))
        check_input_magnitude(x, float16_only=not self.has_input_projection, module=self)
        return resolve_set_index(x, batch, None, num_sets, names=('batch', 'num_sets'))

    def predict(self, x: Tensor, set_id: Tensor, num_sets: int) -> Tuple[Tensor,
                                                                           Optional[Tensor]]:
        r"""The prediction :math:`(B, F_{out})` and uncertainty :math:`(B,)` (or :obj:`None`) of
        validated input."""
        raise NotImplementedError

    def __prepare_scriptable__(self) -> 'SetModel':
        # (torch.jit.script failed inside, on the first construct TorchScript lacks: "try blocks
        # aren't supported", or for the MZ models at their MZAggregation)
        refuse_jit_script(type(self).__name__)

    def forward(self, data_or_x, batch: Optional[Tensor] = None,
                num_sets: Optional[int] = None) -> SetPrediction:
        # (a trace kept the traced batch's number of sets: on a smaller batch it gave rows for
        # sets the batch did not have; the attention presets' layouts too)
        refuse_jit_trace(type(self).__name__)
        x, batch, num_sets = batch_tensors(data_or_x, batch, num_sets)
        try:
            set_id, num_sets = self.validate(x, batch, num_sets)
        except ValueError as e:
            if isinstance(data_or_x, Tensor) or x.dim() != 2 or x.size(-1) == self.in_channels:
                raise
            parts = [f"{k} ({getattr(data_or_x, k).size(-1)} columns)" for k in ('pos', 'x')
                     if isinstance(getattr(data_or_x, k, None), Tensor)]
            raise ValueError(f"{e}: from a data object the model reads [pos, x] side by side "
                             f"(here {' and '.join(parts)}); build it with in_channels="
                             f"{x.size(-1)}, or give the batch the elements it was built for"
                             ) from None
        prediction, ihw = self.predict(x, set_id, num_sets)
        prediction = zero_empty_sets(prediction, set_id, num_sets)
        if x.size(0) == 0:  # no elements: every parameter in the graph with a zero gradient
            prediction = tie_parameters(prediction, self)
        return SetPrediction(prediction, ihw)
