r"""Named model presets (the paper's configurations and baselines), parameter counting and
budget matching. The Set Transformer presets (``mz`` to ``hypernet`` below) are one
:class:`~torch_mz.models.MZSetTransformer`, whose body is the shared blocks of
:mod:`torch_mz.nn.blocks`; they differ only in the value operator, the generator budget and the
sizes given here. ``perceiver`` is built from the same MAB/SAB/PMA blocks with the ``'rigid'``
value operator but routes through learned latents. ``deepsets`` and ``mean-mlp`` are MLPs with
pooling, and ``egnn`` and ``egnn-qm9`` pass messages on a graph of the coordinates
(:class:`~torch_mz.models.EGNN`): none of these uses the attention blocks.

Presets (paper defaults: d = 64, H = 4, d_ff = 128, 16 inducing points, dropout 0.1):

==============  ==================================================================================
``mz``          MZ-Set Transformer, 2 ISAB, n_g = 8, L = 4 (the paper's default)
``mz-slim``     n_g = 2, L = 1
``mz-large``    n_g = 16, L = 8
``mz-1l``       one MZ ISAB layer (depth-separation study)
``rigid``       standard Set Transformer: same routing, ``value='rigid'``, no generators, 2 ISAB
``st-4l``       standard Set Transformer with 4 ISAB layers
``st-large``    standard Set Transformer widened to d = 80, d_ff = 200 (the paper's parameter
                match to ``mz``; here 363K against ``mz``'s 311K for 3 input channels, where
                ``match='mz'`` picks d = 72)
``film``        ST + FiLM: rigid with a FiLM modulation from the set summary
``hypernet``    rank-8 input-dependent value update (``value='hypernet'``), width matched to ``mz``
``perceiver``   Perceiver-style latent cross-attention, width matched to ``mz``
``deepsets``    Deep Sets (sum pooling)
``mean-mlp``    oracle reference: an MLP on the exact set mean (the ceiling on targets that are
                functions of the mean, such as quadratic TDOF; not a set model to compare with)
``egnn``        EGNN, 4 layers, width 96 (coordinates from the task's ``pos_dim``): 289K parameters
                on QM9 (about the same on the synthetic tasks' 0-1 invariant features), the
                paper's parameter match (~303K, Appendix, Table 7;
                the paper's width 140 gives 613K with these layers on QM9)
``egnn-qm9``    the EGNN authors' QM9 model: 7 layers, width 128, attention (edge gate) on,
                coordinates never updated (they enter only through squared distances)
==============  ==================================================================================

"Width matched to ``mz``" (the option ``match='mz'``, which any preset takes): the width (``dim``;
``hidden_channels`` for Deep Sets, the mean MLP and EGNN) whose parameter count is closest to
that of the ``mz`` preset with its own defaults for the same input and output widths, among
32-128 in steps of 8 that the heads divide (where none is, the multiples of the heads up to
256; for the hidden width 16-256 in steps of 4); the other options given apply to the matched
model, not to the reference. Giving the width itself turns the match off.
"""
import copy
import warnings
from typing import Dict, List, Optional

import numpy as np
from torch import Tensor
from torch.nn import Module

from torch_mz._checks import (check_count, check_number, check_optional_count,
                              refuse_jit_script)

from torch_mz.models.egnn import EGNN
from torch_mz.models.mean_mlp import MeanMLP
from torch_mz.models.set_transformer import DeepSets, MZSetTransformer, PerceiverSet

_ST = dict(dim=64, heads=4, d_ff=128, encoder='isab', num_inducing=16, num_encoder_blocks=2,
           num_seeds=1, num_decoder_blocks=1, dropout=0.1)

#: The presets that read ``pos_dim`` (the coordinates' width): EGNN's. Every other preset
#: reads ``pos`` as features whatever ``pos_dim`` says.
EGNN_PRESETS = ('egnn', 'egnn-qm9')

PRESETS: Dict[str, dict] = {
    'mz': dict(_ST, value='mz', num_generators=8, num_matrix_generators=4),
    'mz-slim': dict(_ST, value='mz', num_generators=2, num_matrix_generators=1),
    'mz-large': dict(_ST, value='mz', num_generators=16, num_matrix_generators=8),
    'mz-1l': dict(_ST, value='mz', num_generators=8, num_matrix_generators=4,
                  num_encoder_blocks=1),
    'rigid': dict(_ST, value='rigid', num_generators=0),
    'st-4l': dict(_ST, value='rigid', num_generators=0, num_encoder_blocks=4),
    'st-large': dict(_ST, value='rigid', num_generators=0, dim=80, d_ff=200),
    'film': dict(_ST, value='film', num_generators=0),
    'hypernet': dict(_ST, value='hypernet', num_generators=0, rank=8, match='mz'),
    'perceiver': dict(dim=64, heads=4, d_ff=128, num_latents=16, num_cross=2,
                      num_latent_blocks=1, dropout=0.1, match='mz'),
    'deepsets': dict(hidden_channels=128, num_layers=3, pool='sum'),
    'mean-mlp': dict(hidden_channels=128, num_layers=3),
    'egnn': dict(hidden_channels=96, num_layers=4, pool='sum'),
    'egnn-qm9': dict(hidden_channels=128, num_layers=7, pool='sum', edge_gate=True,
                     update_coords=False),
}

DESCRIPTIONS: Dict[str, str] = {
    'mz': 'MZ-Set Transformer (n_g=8, L=4, 2 ISAB)',
    'mz-slim': 'MZ-Set Transformer, slim (n_g=2, L=1)',
    'mz-large': 'MZ-Set Transformer, large (n_g=16, L=8)',
    'mz-1l': 'MZ-Set Transformer with one MZ ISAB layer',
    'rigid': 'standard Set Transformer (2 ISAB)',
    'st-4l': 'standard Set Transformer (4 ISAB)',
    'st-large': 'standard Set Transformer, d=80, d_ff=200',
    'film': 'Set Transformer + FiLM value modulation',
    'hypernet': 'Set Transformer + rank-8 HyperNet value update',
    'perceiver': 'Perceiver-style latent cross-attention',
    'deepsets': 'Deep Sets (sum pooling)',
    'mean-mlp': 'oracle reference: MLP on the exact set mean',
    'egnn': 'E(n)-equivariant GNN, fully connected inside each set',
    'egnn-qm9': "EGNN authors' QM9 model (7 layers, width 128, attention, fixed coordinates)",
}


def list_models() -> Dict[str, str]:
    r"""Preset names and one-line descriptions."""
    return dict(DESCRIPTIONS)


def count_parameters(model: Module) -> int:
    r"""Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class SelectFeatures(Module):
    r"""Runs :obj:`model` on a batch whose ``x`` keeps only :obj:`columns` (for EGNN on data
    whose ``x`` holds more than its invariant features: the selected columns become the features
    and the coordinates come from ``pos``). Called as the model is: ``model(data)`` or
    ``model(x, pos, batch)``, by position or by name (``x`` :obj:`None` where no column is
    selected)."""
    def __init__(self, model: Module, columns):
        super().__init__()
        self.model = model
        self.columns = check_columns(columns)

    def _select(self, data, kwargs):
        r""":obj:`data` (a tensor ``x`` or a data object) with its ``x`` cut to the columns;
        no columns: no features, whether the data hold an ``x`` or not."""
        if data is None and 'data' in kwargs:  # (the wrapper's first argument was named
            # data: model(data=batch) was refused as data without an x where columns are taken)
            raise TypeError(f"{self.__class__.__name__} takes the data as its first argument, "
                            f"x, as EGNN does: model(batch) or model(x=batch), not data=")
        tensors = data is None or isinstance(data, Tensor)  # model(x, pos, batch)
        x = data if tensors else getattr(data, 'x', None)
        if self.columns:
            if x is None:
                raise ValueError(f'{self.__class__.__name__}: the data hold no x to take the '
                                 f'feature columns {self.columns} from')
            if x.dim() != 2:
                raise ValueError(f'{self.__class__.__name__}: expected x of shape (N, F) to '
                                 f'take the feature columns from (got {tuple(x.shape)})')
            if max(self.columns) >= x.size(-1):
                raise ValueError(f'{self.__class__.__name__}: feature column '
                                 f'{max(self.columns)} is beyond the {x.size(-1)} columns of x')
        x = x[:, self.columns] if self.columns else None
        if tensors:  # model(x, pos, batch): the columns of x (x None: copy.copy(None).x failed)
            return x
        data = copy.copy(data)
        data.x = x
        return data

    def reset_parameters(self):
        r"""Re-initialises the wrapped model (as every model :func:`build_model` returns can)."""
        self.model.reset_parameters()

    def __prepare_scriptable__(self) -> 'SelectFeatures':
        # (refused as every model build_model returns is, naming the wrapper scripted)
        refuse_jit_script(type(self).__name__)

    # (the first argument named as EGNN's, x: model(x=..., pos=..., batch=...) was a TypeError)
    def forward(self, x=None, *args, **kwargs):
        return self.model(self._select(x, kwargs), *args, **kwargs)

    def encode(self, x=None, *args, **kwargs):
        r"""The wrapped model's :meth:`encode` on the selected columns."""
        return self.model.encode(self._select(x, kwargs), *args, **kwargs)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.model}, columns={self.columns})'


def check_columns(columns) -> List[int]:
    r"""Feature columns as a list of distinct non-negative integers (not a string, whose
    characters would be taken as names)."""
    if isinstance(columns, (str, bytes)) or not hasattr(columns, '__iter__'):
        raise ValueError(f"'feature_columns' must be a sequence of column indices (got "
                         f"{columns!r})")
    out = [check_count('feature_columns[]', c, low=0) for c in columns]
    if len(set(out)) != len(out):
        # (out, not columns: an iterator is read by now, and showed as [])
        raise ValueError(f"'feature_columns' names a column twice (got {out!r})")
    return out


def build_model(name: str, in_channels: int, out_channels: int, pos_dim: Optional[int] = None,
                feature_columns=None, **overrides) -> Module:
    r"""Builds preset :obj:`name` for elements of width :obj:`in_channels` and
    :obj:`out_channels` outputs; :obj:`overrides` replace preset options.

    :obj:`in_channels` is the width of what the models read from an element, ``[pos, x]``
    (:func:`~torch_mz.models.base.set_features`). For ``egnn``, :obj:`pos_dim` is the width of the
    coordinates: EGNN reads them from ``data.pos`` (or, for data without ``pos``, from the first
    :obj:`pos_dim` columns of ``x``) and takes the other ``in_channels - pos_dim`` values as
    invariant features, and :obj:`feature_columns` is refused; without it, ``data.pos`` must be
    present and :obj:`feature_columns` (if given) selects the columns of ``x`` used as features.
    Other models do not use :obj:`feature_columns` (but refuse columns beyond
    :obj:`in_channels`).

    Every preset keeps one contract (:mod:`torch_mz.models.base`): ``model(batch)`` returns a
    :class:`~torch_mz.models.base.SetPrediction` ``(prediction, ihw)``, with ``ihw`` :obj:`None`
    for the models without an uncertainty output (all but the MZ-Set-Transformer family), and an
    empty set predicts zero. None can be compiled by :func:`torch.jit.script`, which refuses each
    with a :class:`RuntimeError` naming :func:`torch.compile` (their forward finds each batch's
    set layout in Python).

    The model records how it was built in ``model.build_info`` (``name``, ``in_channels``,
    ``out_channels``, ``pos_dim``, ``feature_columns`` and the overrides as ``args``): the
    trainer's checkpoints store it, and :func:`torch_mz.load_model` rebuilds the model from it.
    """
    if feature_columns is not None:  # (an iterator, read once by the check, was recorded empty)
        feature_columns = check_columns(feature_columns)
    model = _build(name, in_channels, out_channels, pos_dim, feature_columns, **overrides)
    # Module.__setattr__ is typed for tensors and modules, but plain attributes are allowed;
    # NumPy numbers are recorded as Python's (JSON holds them: a checkpoint records how to
    # rebuild the model only where it can be written as JSON)
    model.build_info = _plain(dict(
        name=name, in_channels=in_channels, out_channels=out_channels, pos_dim=pos_dim,
        args=dict(overrides),
        feature_columns=None if feature_columns is None else list(feature_columns)))
    return model


def _plain(value):
    r""":obj:`value` with NumPy scalars as Python numbers, in lists, tuples and dicts too."""
    if isinstance(value, np.generic):
        return value.item()
    if type(value) in (list, tuple):  # (not a named tuple's type, which takes fields)
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _without_ignored_columns(info):
    r"""A model's ``build_info`` (as a checkpoint records it) as the model was built: without
    the :obj:`feature_columns` of an EGNN preset given :obj:`pos_dim` too, which
    :func:`build_model` ignored before it refused them (the runs of that time recorded them,
    and their checkpoints could be neither rebuilt, loaded into a model built now, nor
    resumed). Anything else is returned as it is."""
    if (isinstance(info, dict) and info.get('name') in EGNN_PRESETS
            and info.get('pos_dim') is not None and info.get('feature_columns') is not None):
        return dict(info, feature_columns=None)
    return info


def _build(name: str, in_channels: int, out_channels: int, pos_dim: Optional[int],
           feature_columns, **overrides) -> Module:
    if name not in PRESETS:
        raise ValueError(f"Unknown model '{name}' (available: {', '.join(PRESETS)})")
    in_channels = check_count('in_channels', in_channels)
    out_channels = check_count('out_channels', out_channels)
    pos_dim = check_optional_count('pos_dim', pos_dim)
    if feature_columns is not None:
        feature_columns = check_columns(feature_columns)
        if pos_dim is None and feature_columns and max(feature_columns) >= in_channels:
            raise ValueError(f"feature column {max(feature_columns)} is beyond the "
                             f"{in_channels} input channels")
        if pos_dim is not None and name in EGNN_PRESETS:  # (they were ignored)
            raise ValueError(f"'{name}' takes 'feature_columns' or 'pos_dim', not both: with "
                             f"pos_dim={pos_dim} its features are the other "
                             f"{in_channels - pos_dim} input channels (got "
                             f"feature_columns={feature_columns})")
    kwargs = dict(PRESETS[name], **overrides)
    if kwargs.get('value') != 'mz' and 'num_matrix_generators' not in overrides:
        # (an mz preset given another value operator: its own L has nothing to act on)
        kwargs.pop('num_matrix_generators', None)
    if kwargs.get('value') != 'hypernet' and 'rank' not in overrides:
        kwargs.pop('rank', None)  # (nor the hypernet preset's rank)
    match = kwargs.pop('match', None)
    knob = _knob(name)
    if match is not None and knob not in overrides:
        # parameter-matched baseline: choose the width whose count is closest to the reference
        # (the reference preset with its own defaults); widths step by 8, multiples of the heads
        budget = count_parameters(build_model(match, in_channels, out_channels))
        widths = None  # (hidden_channels: match_budget's own candidates)
        if knob == 'dim':
            heads = check_count('heads', kwargs.get('heads', 4))
            widths = [v for v in range(32, 129, 8) if v % heads == 0] or list(
                range(heads, 257, heads))
        return match_budget(name, budget, in_channels, out_channels, knob=knob,
                            candidates=widths, pos_dim=pos_dim, feature_columns=feature_columns,
                            **dict(overrides, match=None))
    if name in EGNN_PRESETS:
        if feature_columns is not None and pos_dim is None:
            model = EGNN(len(feature_columns), out_channels=out_channels, **kwargs)
            return SelectFeatures(model, feature_columns)
        features = in_channels - (pos_dim or 0)
        if features < 0:
            raise ValueError(f"'pos_dim' ({pos_dim}) exceeds the element width ({in_channels})")
        return EGNN(features, out_channels=out_channels, pos_dim=pos_dim, **kwargs)
    if name == 'perceiver':
        return PerceiverSet(in_channels, out_channels, **kwargs)
    if name == 'deepsets':
        return DeepSets(in_channels, out_channels, **kwargs)
    if name == 'mean-mlp':
        return MeanMLP(in_channels, out_channels, **kwargs)
    return MZSetTransformer(in_channels, out_channels, **kwargs)


def match_budget(name: str, budget: int, in_channels: int, out_channels: int,
                 knob: Optional[str] = None, candidates=None, **overrides) -> Module:
    r"""Builds preset :obj:`name` with the size knob (:obj:`knob`, default ``dim`` for attention
    models, ``hidden_channels`` for Deep Sets and EGNN) chosen from :obj:`candidates` (default:
    for ``dim`` the multiples of the head count from the largest one at most 16 (the head count
    itself where it exceeds 16) up to 256: 16 to 256 with 4 heads, 15 to 255 with 3 or 5, 12 to
    252 with 6, 32 to 256 with 32; for ``hidden_channels`` the multiples of 4 from 16 to 256) so
    that the parameter count is closest to :obj:`budget`."""
    target = check_number('budget', budget)
    # the feature columns read once (an iterator was read by the first candidate alone: the
    # others were built without features, and one of them could be chosen)
    if overrides.get('feature_columns') is not None:
        overrides['feature_columns'] = check_columns(overrides['feature_columns'])
    if knob is None:
        knob = _knob(name)
    if candidates is None:
        step = (overrides.get('heads', PRESETS.get(name, {}).get('heads', 4)) if knob == 'dim'
                else 4)
        step = check_count('heads', step)
        candidates = range(max(step, 16 - 16 % step), 257, step)
    best, best_gap = None, None
    for value in candidates:
        model = build_model(name, in_channels, out_channels, **dict(overrides, **{knob: value}))
        gap = abs(count_parameters(model) - target)
        if best_gap is None or gap < best_gap:
            best, best_gap = model, gap
    if best is None:
        raise ValueError(f"Expected at least one candidate value for '{knob}' (got none)")
    assert best_gap is not None
    if best_gap > 0.2 * target:
        chosen = getattr(best, 'build_info', {}).get('args', {}).get(knob)
        warnings.warn(f"match_budget: the closest '{name}' has {count_parameters(best):,} "
                      f"parameters, {100 * best_gap / target:.0f}% from the budget of "
                      f"{target:,.0f} ('{knob}' = {chosen} of the candidates tried); pass "
                      f"other candidates", stacklevel=2)
    return best


def _knob(name: str) -> str:
    r"""The size option :func:`match_budget` varies for preset :obj:`name`."""
    if name in ('deepsets', 'mean-mlp', 'egnn', 'egnn-qm9'):
        return 'hidden_channels'
    return 'dim'  # (the attention models)


