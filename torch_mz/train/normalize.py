r"""Target normalisation: :class:`TargetNormalizer` (statistics of the training split) and
:class:`TargetUnits`, which a model carries so that it predicts in target units."""
import contextvars
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from torch_mz._checks import refuse_compiled_wrapper
from torch_mz.train.contract import ModelOutput

__all__ = [
    'TargetNormalizer',
    'TargetUnits',
    'TARGET_UNITS',
    'attach_normalizer',
    'detach_normalizer',
    'carried_normalizer',
]


class TargetNormalizer:
    r"""Per-target standardisation :math:`\tilde y = (y - \mu) / \sigma` with :math:`\mu, \sigma`
    fitted on the training targets only (in float64). A constant target column,
    :math:`\sigma \le \epsilon\,|\mu|` (rounding's spread of a column of one value; exactly
    zero for :math:`\mu = 0`), keeps :math:`\sigma = 1`. The test is relative, so targets in
    small units (:math:`\sigma = 10^{-9}` about a mean of 0) are standardised like any others
    (before 0.3.0 an absolute :math:`\sigma < 10^{-8}` counted as constant, and such a model could
    not fit them).

    The maps run in at least float32: a float16 or bfloat16 prediction (:func:`torch.autocast`)
    is mapped back to target units in float32, where bfloat16 would round a prediction of 1000
    to a multiple of 8; and in float64 where the normaliser was fitted on float64 targets
    (:attr:`float64`; the Trainer keeps float64 and integer targets in float64), so that a
    float32 prediction of targets about 1e8 is not rounded to a multiple of 8 in target
    units. Predictions of a normaliser fitted on float32 targets stay float32.

    Args:
        eps (float, optional): The largest standard deviation, relative to the column's
            mean's magnitude, that counts as constant. (default: :obj:`1e-12`)

    Shapes:
        - **fit input:** :math:`(N, t)` or :math:`(N,)`
        - **transform / inverse_transform:** any shape whose last dimension is :math:`t` (or
          :math:`(N,)` when :math:`t = 1`), returned unchanged in shape.
    """
    float64 = False  # (class default: an instance pickled before the attribute existed)

    def __init__(self, eps: float = 1e-12):
        self.eps = eps
        self.mean: Optional[Tensor] = None  # (t,) float64
        self.std: Optional[Tensor] = None  # (t,) float64
        self.float64 = False  # fitted on float64 targets: maps back in float64

    @property
    def fitted(self) -> bool:
        return self.mean is not None

    def fit(self, y: Tensor, missing: bool = False) -> 'TargetNormalizer':
        r"""Fits the statistics to :obj:`y`. With :obj:`missing`, NaN entries are missing
        targets, left out of their column's statistics (a loss of one's own that masks them,
        :class:`~torch_mz.train.Trainer`'s ``loss_fn``); a column must keep one finite entry."""
        if not torch.is_tensor(y) or y.numel() == 0:
            raise ValueError('Expected a non-empty tensor of targets to fit the normaliser')
        if y.dim() == 0:  # (an IndexError in the reshape below)
            raise ValueError('Expected targets of shape (N, t) or (N,) to fit the normaliser '
                             '(got a 0-dimensional tensor)')
        self.float64 = y.dtype == torch.float64
        y = y.detach().to(torch.float64)
        y = y.view(-1, 1) if y.dim() == 1 else y.reshape(y.size(0), -1)  # (N, t)
        known = ~torch.isnan(y) if missing else torch.ones_like(y, dtype=torch.bool)
        if not bool(torch.isfinite(y[known]).all()) or not bool(known.any(dim=0).all()):
            raise ValueError('Expected finite targets to fit the normaliser (got NaN or inf'
                             + (', or a column with no target' if missing else '') + ')')
        if missing:  # each column over its known entries
            count = known.sum(dim=0)  # (t,)
            mean = torch.where(known, y, 0.0).sum(dim=0) / count
            std = (torch.where(known, y - mean, 0.0).pow(2).sum(dim=0) / count).sqrt()
        else:  # (as before: the same statistics, bit for bit)
            mean, std = y.mean(dim=0), y.std(dim=0, unbiased=False)
        self.mean = mean.cpu()
        std = std.cpu()
        constant = (std == 0) | (std <= self.eps * self.mean.abs())
        self.std = torch.where(constant, torch.ones_like(std), std)
        return self

    def _stats(self, y: Tensor) -> Tuple[Tensor, Tensor]:
        if not torch.is_tensor(y) or not (y.is_floating_point() or y.is_complex()):
            raise ValueError(f"Expected a floating-point tensor of targets (got "
                             f"{y.dtype if torch.is_tensor(y) else type(y).__name__}; "
                             f"e.g. y.float(): integer arithmetic would round the statistics)")
        if not self.fitted:
            raise RuntimeError('TargetNormalizer is not fitted; call fit() or load_state_dict()')
        assert self.mean is not None and self.std is not None
        return _stats_like(y, self.mean, self.std)

    def transform(self, y: Tensor) -> Tensor:
        y = _wide(y, self.float64)
        mean, std = self._stats(y)
        return (y - mean) / std

    def inverse_transform(self, y: Tensor) -> Tensor:
        y = _wide(y, self.float64)
        mean, std = self._stats(y)
        return y * std + mean

    def inverse_scale(self, s: Tensor) -> Tensor:
        r"""Maps a scale (e.g. a predicted standard deviation) from normalised to original units:
        multiplies by :math:`\sigma` without adding :math:`\mu`."""
        s = _wide(s, self.float64)
        return s * self._stats(s)[1]

    def state_dict(self) -> Dict[str, Any]:
        # (the relative threshold under its own key: 'eps' was an absolute one before 0.3.0,
        # which a state of then still holds and which is not read as relative)
        return {'mean': self.mean, 'std': self.std, 'relative_eps': self.eps,
                'float64': self.float64}

    def load_state_dict(self, state: Dict[str, Any]) -> 'TargetNormalizer':
        self.mean, self.std = state['mean'], state['std']
        self.eps = float(state.get('relative_eps', self.eps))
        self.float64 = bool(state.get('float64', False))
        return self

    def __repr__(self) -> str:
        if not self.fitted:
            return f'{self.__class__.__name__}(unfitted)'
        assert self.mean is not None and self.std is not None
        return (f'{self.__class__.__name__}(mean={self.mean.tolist()}, '
                f'std={self.std.tolist()})')


def _wide(y: Tensor, float64: bool = False) -> Tensor:
    r""":obj:`y` in float32 where it is float16 or bfloat16, in float64 where :obj:`float64`
    (a normaliser fitted on float64 targets) and :obj:`y` is floating point, as it is
    otherwise: the normalisation's arithmetic in at least float32."""
    if float64 and y.is_floating_point():
        return y.double()
    return y.float() if y.dtype in (torch.float16, torch.bfloat16) else y


def _stats_like(y: Tensor, mean: Tensor, std: Tensor) -> Tuple[Tensor, Tensor]:
    r"""``mean`` and ``std`` (each :math:`(t,)`) on ``y``'s device and in its dtype, shaped to
    broadcast against ``y`` (:math:`(..., t)`, or :math:`(N,)` when :math:`t = 1`)."""
    mean = mean.to(device=y.device, dtype=y.dtype)
    std = std.to(device=y.device, dtype=y.dtype)
    if y.dim() <= 1 and mean.numel() == 1:  # (a 0-dimensional y: one value of one target)
        return mean.view(()), std.view(())
    if y.dim() == 0 or y.size(-1) != mean.numel():  # (y.size(-1) of a 0-d y: an IndexError)
        raise ValueError(f'Expected targets with {mean.numel()} column(s) '
                         f'(got shape {tuple(y.shape)})')
    return mean, std


class TargetUnits(torch.nn.Module):
    r"""Maps the first output of a model trained on standardised targets back to target units,

    .. math::
        y = \tilde y \, \sigma + \mu,

    the :meth:`TargetNormalizer.inverse_transform` of the normaliser it is made from. It is not
    called directly: :func:`attach_normalizer` makes it a sub-module ``target_units`` of a model
    and runs it on the model's output with a forward hook, so that the statistics travel with the
    model (``.to()``, ``copy.deepcopy``, ``torch.save(model)``) as buffers. They follow the
    model's device but keep their dtype (float64) when the model is cast (``.half()``,
    ``.float()``, ``.to(torch.bfloat16)``): the maps run in at least float32 either way (on
    MPS, which has no float64, they are float32; ``.to('meta')`` keeps them aside for a
    ``.to_empty()``). The buffers are not persistent: the model's ``state_dict()`` keeps the
    keys of the bare model, and checkpoints store the normaliser beside the weights.

    Args:
        normalizer (TargetNormalizer): A fitted normaliser.

    Shapes:
        - **input:** the model's output: a prediction :math:`(B, t)` (or :math:`(B,)` when
          :math:`t = 1`), or a tuple or list whose first element is one (the others, e.g. an
          uncertainty, pass unchanged).
        - **output:** the same structure, the prediction in target units.
    """
    mean: Tensor  # buffers, registered in __init__
    std: Tensor
    float64 = False  # (class default: an instance pickled before the attribute existed)

    def __init__(self, normalizer: 'TargetNormalizer'):
        super().__init__()
        if not normalizer.fitted:
            raise ValueError('Expected a fitted TargetNormalizer')
        assert normalizer.mean is not None and normalizer.std is not None
        self.eps = normalizer.eps
        self.float64 = normalizer.float64
        self.register_buffer('mean', normalizer.mean.detach().clone(), persistent=False)  # (t,)
        self.register_buffer('std', normalizer.std.detach().clone(), persistent=False)  # (t,)
        self.enabled = True  # off while a Trainer needs the standardised output

    def _apply(self, fn, recurse=True):
        # ``.to(device)`` moves the statistics; casts of the model (``.half()``, ``.float()``,
        # ``.to(torch.bfloat16)``) leave their dtype: rounded with the weights, a bfloat16
        # model's mean of 1000.39 became 1000.0, and ``.float()`` rounded the float64 mean of
        # targets about 1e8 to a multiple of 8 (the maps run in float32 / float64 anyway)
        stats = (self.mean, self.std)
        if self.mean.is_meta:  # (``.to_empty()`` after ``.to('meta')``: the values kept aside)
            stats = getattr(self, '_off_meta', stats)
        # where the model goes (fn on an empty tensor): MPS has no float64, so the statistics
        # go there in float32 (as a model made .float() first took them before)
        if fn(torch.empty(0, device=self.mean.device)).device.type == 'mps':
            self.mean, self.std = (s.float() for s in stats)
            return super()._apply(fn, recurse)
        super()._apply(fn, recurse)
        device = self.mean.device
        if device.type == 'meta' and not stats[0].is_meta:
            # (a meta tensor has no data: the statistics come back from here)
            self._off_meta = tuple(s.detach().cpu() for s in stats)
        if device.type == 'meta' or not stats[0].is_meta:
            self.mean, self.std = (s.to(device) for s in stats)
        return self

    def normalizer(self) -> 'TargetNormalizer':
        r"""The statistics as a :class:`TargetNormalizer` (on the CPU, ``float64``)."""
        return TargetNormalizer(self.eps).load_state_dict(
            {'mean': self.mean.detach().cpu().double(), 'std': self.std.detach().cpu().double(),
             'float64': getattr(self, 'float64', False)})

    def forward(self, out: ModelOutput) -> ModelOutput:
        if isinstance(out, (tuple, list)):
            items: List[Any] = [self.forward(out[0]), *out[1:]]
            return type(out)(*items) if hasattr(out, '_fields') else type(out)(items)
        # (float16 / bfloat16: mapped in float32, returned so; float64 for float64 targets)
        out = _wide(out, getattr(self, 'float64', False))
        mean, std = _stats_like(out, self.mean, self.std)
        return out * std + mean

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(mean={self.mean.tolist()}, std={self.std.tolist()})'


TARGET_UNITS = 'target_units'  # name of the TargetUnits sub-module of a model


#: The :class:`TargetUnits` (by ``id``) whose models return standardised values in this thread
#: (or task): :class:`_standardised` sets it, so that a Trainer evaluating a model leaves every
#: other caller of it (another thread) its target units.
_STANDARDISED: contextvars.ContextVar[Tuple[int, ...]] = contextvars.ContextVar(
    'torch_mz_standardised', default=())


def _target_units_hook(module: torch.nn.Module, args: Any, out: ModelOutput) -> ModelOutput:
    units = getattr(module, TARGET_UNITS, None)
    if (not isinstance(units, TargetUnits) or not units.enabled
            or id(units) in _STANDARDISED.get()):
        return out
    return units(out)


def attach_normalizer(model: torch.nn.Module, normalizer: TargetNormalizer) -> torch.nn.Module:
    r"""Makes ``model`` predict in target units: adds :class:`TargetUnits` of ``normalizer`` as
    the sub-module ``model.target_units`` and a forward hook that applies it to every output (in
    training and in eval mode). A normaliser attached before is replaced. :class:`Trainer` does
    this at the end of :meth:`Trainer.fit` for regression with ``normalize_targets=True``;
    :func:`detach_normalizer` undoes it. Returns ``model``."""
    refuse_compiled_wrapper(model, 'attach_normalizer')
    detach_normalizer(model)
    model.add_module(TARGET_UNITS, TargetUnits(normalizer))
    ref = next(model.parameters(), None)
    if ref is not None:
        getattr(model, TARGET_UNITS).to(ref.device)
    model.register_forward_hook(_target_units_hook)
    return model


def detach_normalizer(model: torch.nn.Module) -> Optional[TargetNormalizer]:
    r"""Removes what :func:`attach_normalizer` added, so that ``model`` returns standardised
    values again; returns the normaliser it carried (:obj:`None` if none)."""
    # as torch.nn.utils.remove_weight_norm finds its hook: by what it is
    for key in [k for k, hook in model._forward_hooks.items() if hook is _target_units_hook]:
        del model._forward_hooks[key]
    units = model._modules.pop(TARGET_UNITS, None)
    return units.normalizer() if isinstance(units, TargetUnits) else None


def carried_normalizer(model: torch.nn.Module) -> Optional[TargetNormalizer]:
    r"""The normaliser :func:`attach_normalizer` gave ``model`` (:obj:`None` if none), i.e.
    whether ``model`` already predicts in target units."""
    units = getattr(model, TARGET_UNITS, None)
    return units.normalizer() if isinstance(units, TargetUnits) else None


class _standardised:
    r"""Context in which a model that carries a normaliser returns standardised values, in this
    thread only (a context variable, not a flag on the shared model: another thread calling the
    model meanwhile gets target units, and two evaluations at once leave it as it was)."""
    def __init__(self, model: torch.nn.Module):
        self.units = getattr(model, TARGET_UNITS, None)
        self.entered = False

    def __enter__(self) -> None:
        if isinstance(self.units, TargetUnits):
            _STANDARDISED.set(_STANDARDISED.get() + (id(self.units), ))
            self.entered = True

    def __exit__(self, *exc: Any) -> None:
        # one entry of this model taken out (entries counted: contexts left in any order leave
        # the model standardised exactly while one of them is open)
        if self.entered:
            ids = list(_STANDARDISED.get())
            ids.remove(id(self.units))
            _STANDARDISED.set(tuple(ids))
            self.entered = False


def _same_statistics(a: TargetNormalizer, b: TargetNormalizer) -> bool:
    r"""Whether ``a`` is fitted and has the statistics of the fitted ``b``, to float32 rounding
    (a model moved to MPS, or pickled before its cast kept the statistics' float64)."""
    if not a.fitted:
        return False
    assert a.mean is not None and a.std is not None and b.mean is not None and b.std is not None
    return all(x.shape == y.shape and torch.allclose(x.cpu().double(), y, rtol=1e-6, atol=0.0)
               for x, y in ((a.mean, b.mean), (a.std, b.std)))


def _pending_normalizer(model: torch.nn.Module, normalizer: Optional[TargetNormalizer]
                        ) -> Tuple[Optional[TargetNormalizer], Optional[TargetNormalizer]]:
    r"""For prediction: ``(the normaliser still to apply to the model's outputs, the one in force
    for scaling uncertainties)``. A model that carries its normaliser already predicts in target
    units; a ``normalizer`` passed with it must have the same statistics (it is not applied
    twice)."""
    carried = carried_normalizer(model)
    if carried is None:
        return normalizer, normalizer
    same = normalizer is None or _same_statistics(normalizer, carried)
    if not same:
        raise ValueError(f'The model carries its own target normaliser ({carried}) and already '
                         f'predicts in target units; the normalizer passed ({normalizer}) '
                         f'differs from it. Pass normalizer=None')
    return None, carried
