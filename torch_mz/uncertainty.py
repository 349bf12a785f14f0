r"""Quality of predictive uncertainty for single-target regression (Appendix D.3 of the MZAttn
paper, Tables 19-21): ranking metrics (does a larger uncertainty go with a larger error?),
calibration metrics of a Gaussian predictive distribution :math:`\mathcal{N}(\hat y, \sigma^2)`
(negative log-likelihood and regression ECE), a post-hoc affine map from any raw uncertainty to a
standard deviation, and the two sampling baselines (MC-Dropout, deep ensembles).

The MZ models' single-pass uncertainty is the interval-hull width (IHW) of the output zonotope, a
width in latent units, not a standard deviation in target units. Calibration metrics therefore
compare methods after the same recalibration :math:`\sigma = a s + b` (:func:`fit_affine_sigma`),
fitted on held-out data, for every raw uncertainty :math:`s`.

Every function takes predictions, targets and uncertainties as tensors or arrays of shape
:math:`(N,)` or :math:`(N, 1)` (one target per sample), in any float dtype; computation is in
``float64``. Library code: nothing here prints.
"""
import math
import numbers
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from torch_mz._checks import check_count

__all__ = [
    'DEFAULT_LEVELS',
    'AffineSigma',
    'as_vector',
    'error_correlation',
    'binned_by_uncertainty',
    'gaussian_nll',
    'interval_coverage',
    'regression_ece',
    'fit_affine_sigma',
    'predictive_moments',
    'mc_dropout_predict',
    'METHODS',
    'method_predictions',
]

ArrayLike = Union[Tensor, np.ndarray, Sequence[float]]

#: Confidence levels of :func:`regression_ece`: 0.05, 0.10, ..., 0.95.
DEFAULT_LEVELS: Tuple[float, ...] = tuple(round(0.05 * k, 2) for k in range(1, 20))

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


# --------------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------------
def as_vector(name: str, x: ArrayLike) -> np.ndarray:
    r"""Converts :obj:`x` of shape :math:`(N,)` or :math:`(N, 1)` to a finite ``float64`` vector
    :math:`(N,)`, with a :class:`ValueError` naming :obj:`name` for any other shape or for NaN/inf.
    """
    if torch.is_tensor(x):
        x = x.detach().cpu().to(torch.float64).numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]  # (N,)
    if arr.ndim != 1:
        raise ValueError(f"Expected '{name}' of shape (N,) or (N, 1), one target per sample "
                         f"(got shape {tuple(arr.shape)})")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"Expected finite values in '{name}' (found NaN or inf)")
    return arr


def _vectors(min_size: int = 1, **named: ArrayLike) -> List[np.ndarray]:
    out = [as_vector(name, x) for name, x in named.items()]
    sizes = {name: v.shape[0] for name, v in zip(named, out)}
    if len(set(sizes.values())) != 1:
        raise ValueError(f'Expected inputs with the same number of samples (got {sizes})')
    if out[0].shape[0] < min_size:
        raise ValueError(f'Expected at least {min_size} sample(s) (got {out[0].shape[0]})')
    return out


def _check_sigma(sigma: np.ndarray) -> None:
    if np.any(sigma <= 0):
        raise ValueError(f"Expected a positive standard deviation 'sigma' for every sample "
                         f"(smallest: {sigma.min():.4g})")


def _check_levels(levels: Union[Sequence[float], np.ndarray]) -> np.ndarray:
    lv = np.asarray(levels, dtype=np.float64).reshape(-1)
    # (NaN passed both comparisons, and the ECE came out NaN)
    if lv.size == 0 or not np.all((lv > 0) & (lv < 1)):
        raise ValueError(f'Expected confidence levels in the open interval (0, 1) '
                         f'(got {lv.tolist()})')
    return lv


# --------------------------------------------------------------------------------------------------
# Ranking: does the uncertainty order the errors?
# --------------------------------------------------------------------------------------------------
def error_correlation(pred: ArrayLike, target: ArrayLike,
                      uncertainty: ArrayLike) -> Dict[str, float]:
    r"""Spearman (rank) and Pearson (linear) correlation of :obj:`uncertainty` with the absolute
    error :math:`|y - \hat y|` (Table 20 of the paper). Both are invariant to a positive affine
    map of the uncertainty; Spearman is invariant to any strictly increasing map. A constant
    uncertainty or constant error has no correlation: both values are then ``nan``.

    Args:
        pred (Tensor or array): Predictions :math:`\hat y`.
        target (Tensor or array): Targets :math:`y`.
        uncertainty (Tensor or array): Raw uncertainty :math:`s` (any units).

    Returns:
        ``{'spearman': float, 'pearson': float}``

    Shapes:
        - **inputs:** :math:`(N,)` or :math:`(N, 1)` each, :math:`N \ge 2`
    """
    from scipy.stats import pearsonr, spearmanr
    p, y, s = _vectors(2, pred=pred, target=target, uncertainty=uncertainty)
    err = np.abs(y - p)
    if np.ptp(s) == 0 or np.ptp(err) == 0:
        return {'spearman': math.nan, 'pearson': math.nan}
    return {'spearman': float(spearmanr(s, err)[0]), 'pearson': float(pearsonr(s, err)[0])}


def binned_by_uncertainty(pred: ArrayLike, target: ArrayLike, uncertainty: ArrayLike,
                          num_bins: int = 5) -> List[Dict[str, float]]:
    r"""Samples sorted by uncertainty and cut into :obj:`num_bins` quantile bins of (almost) equal
    size (sizes differ by at most one; ties are broken by the sample order, with a
    :class:`UserWarning` where a bin boundary splits a run of equal uncertainties), lowest
    uncertainty first (Table 19 of the paper). Every sample lies in exactly one bin.

    Args:
        pred (Tensor or array): Predictions :math:`\hat y`.
        target (Tensor or array): Targets :math:`y`.
        uncertainty (Tensor or array): Raw uncertainty :math:`s`.
        num_bins (int, optional): Number of bins, at most :math:`N`. (default: :obj:`5`)

    Returns:
        One dict per bin: ``bin`` (1 = lowest uncertainty), ``uncertainty`` (mean :math:`s` in
        the bin), ``abs_error`` (mean :math:`|y - \hat y|`), ``count``.
    """
    p, y, s = _vectors(1, pred=pred, target=target, uncertainty=uncertainty)
    if (not isinstance(num_bins, numbers.Integral) or isinstance(num_bins, bool)
            or not 1 <= num_bins <= s.shape[0]):  # (2.5 made 2 bins, True one)
        raise ValueError(f"Expected 1 <= num_bins <= N={s.shape[0]} (got {num_bins})")
    err = np.abs(y - p)
    order = np.argsort(s, kind='stable')
    bins = np.array_split(order, num_bins)
    split = [float(s[b[0]]) for a, b in zip(bins, bins[1:]) if s[a[-1]] == s[b[0]]]
    if split:  # (a constant IHW gave bins of errors 1.5, 3.5, 5.5, 7.5 by sample order)
        warnings.warn(f"binned_by_uncertainty: {len(split)} of the {num_bins - 1} bin "
                      f"boundaries split a run of equal uncertainties (e.g. {split[0]:g}): "
                      f"those samples are placed by their order in the data, not by their "
                      f"uncertainty, so the bins' errors may show a trend the uncertainty does "
                      f"not have", UserWarning, stacklevel=2)
    rows = []
    for k, idx in enumerate(bins):
        rows.append({'bin': k + 1, 'uncertainty': float(s[idx].mean()),
                     'abs_error': float(err[idx].mean()), 'count': int(idx.size)})
    return rows


# --------------------------------------------------------------------------------------------------
# Calibration of a Gaussian predictive distribution
# --------------------------------------------------------------------------------------------------
def gaussian_nll(pred: ArrayLike, target: ArrayLike, sigma: ArrayLike) -> float:
    r"""Mean Gaussian negative log-likelihood of the targets under
    :math:`\mathcal{N}(\hat y_i, \sigma_i^2)`, **with** the constant
    :math:`\tfrac12 \log 2\pi \approx 0.919`:

    .. math::
        \mathrm{NLL} = \frac{1}{N} \sum_{i=1}^N \left[ \tfrac12 \log(2\pi) + \log \sigma_i +
        \frac{(y_i - \hat y_i)^2}{2 \sigma_i^2} \right]

    For exactly calibrated Gaussian errors its expectation is
    :math:`\tfrac12 \log(2\pi) + \tfrac12 + \overline{\log \sigma}`. It depends on the units of
    :math:`y` (rescaling :math:`y` by :math:`c` adds :math:`\log c`).

    Args:
        pred (Tensor or array): Predictive means :math:`\hat y`.
        target (Tensor or array): Targets :math:`y`.
        sigma (Tensor or array): Predictive standard deviations :math:`\sigma > 0`, in the units
            of :math:`y`.

    Shapes:
        - **inputs:** :math:`(N,)` or :math:`(N, 1)` each
    """
    p, y, sd = _vectors(1, pred=pred, target=target, sigma=sigma)
    _check_sigma(sd)
    return float(np.mean(_HALF_LOG_2PI + np.log(sd) + 0.5 * ((y - p) / sd) ** 2))


def interval_coverage(pred: ArrayLike, target: ArrayLike, sigma: ArrayLike,
                      levels: Union[Sequence[float], np.ndarray] = DEFAULT_LEVELS) -> np.ndarray:
    r"""Observed coverage of the central Gaussian intervals: for each confidence level
    :math:`p`, the fraction of samples with

    .. math::
        |y_i - \hat y_i| \le z_p\, \sigma_i, \qquad z_p = \Phi^{-1}\!\left(\tfrac{1 + p}{2}\right)

    (:math:`\Phi` the standard normal CDF), i.e. whose target lies in the central :math:`p`
    interval of :math:`\mathcal{N}(\hat y_i, \sigma_i^2)`. A calibrated model covers a fraction
    :math:`p`.

    Args:
        pred (Tensor or array): Predictive means :math:`\hat y`.
        target (Tensor or array): Targets :math:`y`.
        sigma (Tensor or array): Predictive standard deviations :math:`\sigma > 0`.
        levels (sequence of float, optional): Confidence levels in :math:`(0, 1)`.
            (default: :obj:`DEFAULT_LEVELS`, 0.05, 0.10, ..., 0.95)

    Returns:
        Coverage per level, shape :math:`(L,)`.
    """
    from scipy.stats import norm
    p, y, sd = _vectors(1, pred=pred, target=target, sigma=sigma)
    _check_sigma(sd)
    lv = _check_levels(levels)
    z = norm.ppf(0.5 * (1.0 + lv))  # (L,)
    inside = np.abs(y - p)[None, :] <= z[:, None] * sd[None, :]  # (L, N)
    return inside.mean(axis=1)


def regression_ece(pred: ArrayLike, target: ArrayLike, sigma: ArrayLike,
                   levels: Sequence[float] = DEFAULT_LEVELS) -> float:
    r"""Expected calibration error of a Gaussian regressor: the mean over the confidence levels
    :math:`p \in P` of the gap between the observed coverage of the central :math:`p` interval
    (:func:`interval_coverage`) and :math:`p`,

    .. math::
        \mathrm{ECE} = \frac{1}{|P|} \sum_{p \in P} \left| \frac{1}{N} \sum_{i=1}^N
        \mathbb{1}\!\left[|y_i - \hat y_i| \le z_p \sigma_i\right] - p \right|,
        \qquad P = \{0.05, 0.10, \ldots, 0.95\}.

    The coverage grows with :math:`p`, so for the default levels the ECE lies in
    :math:`[0, 0.5]`, with 0.5 reached when no interval covers its target (:math:`\sigma` far too
    small) or every interval does (:math:`\sigma` far too large); 0 means calibrated at every
    level, up to sampling noise of order :math:`\sqrt{p(1-p)/N}`.

    Args:
        pred (Tensor or array): Predictive means :math:`\hat y`.
        target (Tensor or array): Targets :math:`y`.
        sigma (Tensor or array): Predictive standard deviations :math:`\sigma > 0`.
        levels (sequence of float, optional): The set :math:`P`.
            (default: :obj:`DEFAULT_LEVELS`)
    """
    lv = _check_levels(levels)
    return float(np.mean(np.abs(interval_coverage(pred, target, sigma, lv) - lv)))


@dataclass(frozen=True)
class AffineSigma:
    r"""The recalibration :math:`\sigma = a\, s + b` from a raw uncertainty :math:`s \ge 0` to a
    predictive standard deviation (:math:`a \ge 0`, :math:`b > 0`), as fitted by
    :func:`fit_affine_sigma`.

    Args:
        a (float): Slope, in target units per unit of :math:`s`.
        b (float): Offset, in target units.
    """
    a: float
    b: float

    def __post_init__(self) -> None:
        if not (self.a >= 0 and self.b > 0 and math.isfinite(self.a)
                and math.isfinite(self.b)):  # (negative sigmas followed)
            raise ValueError(f"Expected a >= 0 and b > 0 (got a={self.a}, b={self.b})")

    def __call__(self, uncertainty: ArrayLike) -> np.ndarray:
        s = as_vector('uncertainty', uncertainty)
        if np.any(s < 0):
            raise ValueError(f"Expected a non-negative 'uncertainty' (smallest: {s.min():.4g})")
        return self.a * s + self.b


def fit_affine_sigma(pred: ArrayLike, target: ArrayLike,
                     uncertainty: ArrayLike) -> AffineSigma:
    r"""Fits :math:`\sigma = a s + b`, :math:`a \ge 0`, :math:`b > 0`, by minimising
    :func:`gaussian_nll` of :obj:`target` under :math:`\mathcal{N}(\hat y, \sigma^2)` (L-BFGS-B
    with the analytic gradient, on :math:`s` and the errors rescaled to unit size, from two starting
    points). Fit it on data the model was not trained on (a validation split) and apply it to the
    test split. With :math:`a = 0` it is a constant :math:`\sigma`; the fitted NLL is never worse
    than the best constant's, :math:`\tfrac12\log(2\pi e\, \overline{(y - \hat y)^2})`, up to the
    optimiser's tolerance.

    Args:
        pred (Tensor or array): Predictions :math:`\hat y` (validation split).
        target (Tensor or array): Targets :math:`y`.
        uncertainty (Tensor or array): Raw uncertainty :math:`s \ge 0` (e.g. IHW or an MC/ensemble
            standard deviation).

    Shapes:
        - **inputs:** :math:`(N,)` or :math:`(N, 1)` each, :math:`N \ge 2`
    """
    from scipy.optimize import minimize
    p, y, s = _vectors(2, pred=pred, target=target, uncertainty=uncertainty)
    if np.any(s < 0):
        raise ValueError(f"Expected a non-negative 'uncertainty' (smallest: {s.min():.4g})")
    r_scale = float(np.sqrt(np.mean((y - p) ** 2)))
    if r_scale == 0:
        raise ValueError('All errors are zero: no standard deviation can be fitted')
    s_scale = float(np.mean(s)) or 1.0
    r2 = ((y - p) / r_scale) ** 2  # (N,) squared errors in units of their RMS
    u = s / s_scale  # (N,) uncertainty with mean 1

    def objective(theta: np.ndarray) -> Tuple[float, np.ndarray]:
        sd = theta[0] * u + theta[1]  # (N,)
        g = 1.0 / sd - r2 / sd**3  # d(loss_i) / d(sigma_i)
        loss = np.mean(np.log(sd) + 0.5 * r2 / sd**2)
        return float(loss), np.array([np.mean(g * u), np.mean(g)])

    bounds = [(0.0, None), (1e-6, None)]
    best = None
    for start in ((0.0, 1.0), (1.0, 1e-3)):
        res = minimize(objective, np.array(start), jac=True, method='L-BFGS-B', bounds=bounds)
        if best is None or res.fun < best.fun:
            best = res
    assert best is not None  # the loop ran
    a, b = best.x
    return AffineSigma(a=float(a) * r_scale / s_scale, b=float(b) * r_scale)


# --------------------------------------------------------------------------------------------------
# Sampling baselines
# --------------------------------------------------------------------------------------------------
def _check_passes(passes: int) -> int:
    passes = check_count('passes', passes)
    if passes < 2:  # (one pass has a spread of exactly zero, returned without a word)
        raise ValueError(f'MC-Dropout needs at least 2 passes for a spread (got passes='
                         f'{passes}, whose standard deviation is 0 for every set): pass '
                         f'passes=2 or more (default 30)')
    return passes


def predictive_moments(samples: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
    r"""Mean and standard deviation over :math:`P` predictions of the same samples (MC-Dropout
    passes or ensemble members). The standard deviation is the population one (divisor
    :math:`P`), the usual predictive spread of an equally weighted mixture of point predictions.

    Args:
        samples (sequence of Tensor): :math:`P \ge 1` tensors of equal shape :math:`(N, t)`.

    Returns:
        ``(mean, std)``, each :math:`(N, t)`.
    """
    if len(samples) == 0:
        raise ValueError('Expected at least one prediction')
    shapes = {tuple(t.shape) for t in samples}
    if len(shapes) != 1:
        raise ValueError(f'Expected predictions of equal shape (got {sorted(shapes)})')
    stack = torch.stack([t.to(torch.float64) for t in samples], dim=0)  # (P, N, t)
    return stack.mean(dim=0), stack.std(dim=0, unbiased=False)


@torch.no_grad()
def mc_dropout_predict(model: torch.nn.Module, dataset: Sequence, passes: int = 30,
                       normalizer=None, batch_size: int = 128,
                       device: Union[str, torch.device] = 'cpu',
                       seed: int = 0) -> Tuple[Tensor, Tensor]:
    r"""MC-Dropout (Gal & Ghahramani, 2016): :obj:`passes` stochastic forward passes over
    :obj:`dataset` with the model in training mode, so that its dropout stays active, and the
    :func:`predictive_moments` of the predictions.

    The whole model is put in training mode, which is MC-Dropout only for models whose sole
    training-mode behaviour is dropout (true for the Set Transformers and MZ models of this
    package, whose normalisation is :class:`~torch.nn.LayerNorm`); a model with a layer that
    updates running statistics in training mode (batch normalisation, an instance norm that
    tracks them) raises a :class:`ValueError`. The model's mode and device are restored
    afterwards (as :func:`~torch_mz.train.predict` restores them), and the passes draw from a
    private random stream seeded with :obj:`seed`: the generators of the device they run on (the
    CPU's, and the one CUDA device's or the MPS device's), saved before and restored after, so
    the global streams, every other GPU's included, are left as they were. On another kind of
    device (XPU, ...) only the CPU's generator is seeded: the masks drawn there are not.

    The mean and standard deviation are of the model's raw outputs, for regression the
    predictions. For a classifier they are of its class logits, not of probabilities (the rows
    of the mean do not sum to 1, and the softmax of the mean logits is not the mean of the
    passes' softmax probabilities): for MC-Dropout class probabilities, run the passes yourself
    and average the softmax of each.

    Args:
        model (torch.nn.Module): The model, called as ``model(batch)``; returns a prediction
            :math:`(B, t)` or a tuple whose first element is one.
        dataset (Sequence): PyG dataset, list of :class:`~torch_geometric.data.Data` or one
            :class:`~torch_geometric.data.Batch`; the same checks as
            :func:`~torch_mz.train.predict` (not a DataLoader, one Data or a list of Batch
            objects). Every pass reads it again, so every read must give the same sets in the
            same order: one that gives other sets (another number, another order, a random
            transform) is refused with a :class:`ValueError` (checked by each set's size and
            the sums of its ``x`` and ``pos``).
        passes (int, optional): Number of stochastic passes :math:`P \ge 2` (one pass has no
            spread). (default: :obj:`30`)
        normalizer (TargetNormalizer, optional): If given, each pass is mapped back to original
            units with its :meth:`~torch_mz.train.TargetNormalizer.inverse_transform`, so that the
            mean and standard deviation are in original units. A model that carries its
            normaliser (a trained one) predicts in target units already: a normaliser passed with
            it must have the same statistics and is not applied twice. (default: :obj:`None`)
        batch_size (int, optional): Sets per batch. (default: :obj:`128`)
        device (str or torch.device, optional): Device to run on. (default: :obj:`'cpu'`)
        seed (int, optional): Seed of the dropout masks. (default: :obj:`0`)

    Returns:
        ``(mean, std)`` on the CPU, each :math:`(N, t)`, ``float64``.
    """
    from torch_geometric.loader import DataLoader

    from torch_mz.train import resolve_device
    from torch_mz.train.normalize import _pending_normalizer
    from torch_mz.train.prediction import _check_sets, _moved
    normalizer, _ = _pending_normalizer(model, normalizer)
    passes = _check_passes(passes)
    # predict()'s checks (a DataLoader was indexed, a list of Batch objects batched again)
    _check_sets(dataset, 'mc_dropout_predict', batch_ok=True)
    tracking = [type(m).__name__ for m in model.modules()
                if isinstance(m, torch.nn.modules.batchnorm._NormBase)
                and m.track_running_stats]  # (BatchNorm, InstanceNorm(track_running_stats))
    if tracking:
        raise ValueError(f"MC-Dropout in training mode would update the running statistics of "
                         f"the model's {', '.join(sorted(set(tracking)))} layers")
    dev = resolve_device(device)
    modes = [(m, m.training) for m in model.modules()]  # each module's own, restored after
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False)
    runs: List[Tensor] = []
    marks: List[Tensor] = []  # each pass's sets: their sizes and input sums
    try:
        with _moved(model, dev), _seeded(dev, seed):
            model.train()
            for k in range(passes):
                preds: List[Tensor] = []
                seen: List[Tensor] = []
                for batch in loader:
                    seen.append(_fingerprint(batch))
                    out = model(batch.to(dev))
                    pred = out[0] if isinstance(out, (tuple, list)) else out
                    pred = pred.unsqueeze(-1) if pred.dim() == 1 else pred  # (B, t)
                    if normalizer is not None:
                        pred = normalizer.inverse_transform(pred)
                    preds.append(pred.cpu())
                if not preds and k == 0:  # (a stream without a length: predict()'s words)
                    raise ValueError('mc_dropout_predict() got an empty dataset: there is '
                                     'nothing to predict')
                if not preds:  # (torch.cat's error: a one-shot stream is read once)
                    raise ValueError(
                        f'mc_dropout_predict: pass {k + 1} of {passes} got no sets from the '
                        f'dataset; every pass reads it again, so it must be one that can be read '
                        f'more than once (a list, a Dataset), not a one-shot iterator')
                marks.append(torch.cat(seen))  # sizes and input sums of the sets
                if not torch.equal(marks[-1], marks[0]):  # (stack's error, or a silent mix)
                    counts = (sum(len(r) for r in runs[:1]), sum(len(p) for p in preds))
                    raise ValueError(_changed_stream('mc_dropout_predict', f'pass {k + 1} of '
                                                     f'{passes}', 'pass 1', counts))
                runs.append(torch.cat(preds, dim=0))  # (N, t)
    finally:
        for module, mode in modes:
            module.train(mode)
    if all(torch.equal(r, runs[0]) for r in runs[1:]):
        # (a spread of exactly zero was returned without a word)
        warnings.warn('mc_dropout_predict: every pass gave the same predictions, so the spread '
                      'is zero: the model has no active dropout (a rate of 0, or a model '
                      'without dropout); train it with dropout for MC-Dropout', stacklevel=2)
    return predictive_moments(runs)


def _fingerprint(batch: Any) -> Tensor:
    r"""What identifies the sets of :obj:`batch`, cheaply: each set's number of elements and the
    sum of its :obj:`x` and :obj:`pos` entries, as a ``float64`` vector :math:`(2 B)` or
    :math:`(3 B)`."""
    # (on the CPU: a dataset of CUDA tensors collates its ptr there, and torch.cat failed)
    sizes = torch.diff(batch.ptr).to('cpu', torch.float64)  # (B,)
    parts = [sizes]
    for key in ('x', 'pos'):
        t = getattr(batch, key, None)
        if torch.is_tensor(t) and t.dim() >= 1 and t.size(0) == batch.batch.numel():
            flat = t.detach().to('cpu', torch.float64)
            # (reshape(N, -1) failed for a batch of empty sets alone: N = 0 rows)
            per_elem = flat.flatten(1).sum(1) if flat.dim() > 1 else flat  # (N,)
            sums = torch.zeros(sizes.numel(), dtype=torch.float64)  # (B,)
            parts.append(sums.index_add_(0, batch.batch.cpu(), per_elem))
    return torch.cat(parts).nan_to_num(nan=0.0)  # (a NaN input: unequal to itself)


def _stream_marks(dataset: Sequence, batch_size: int) -> Tuple[Tensor, int]:
    r"""The :func:`_fingerprint` of every set of :obj:`dataset`, read as :func:`predict` reads it
    (without the model), and the number of sets."""
    from torch_geometric.loader import DataLoader
    # a generator of its own: the caller's random stream is left as it was
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False,
                        generator=torch.Generator())
    seen = [(_fingerprint(batch), batch.num_graphs) for batch in loader]
    return (torch.cat([m for m, _ in seen]) if seen else torch.zeros(0),
            sum(n for _, n in seen))


def _changed_stream(caller: str, read: str, first: str, counts: Tuple[int, int]) -> str:
    what = (f'{counts[0]} sets, then {counts[1]}' if counts[0] != counts[1] else
            f'{counts[0]} sets each time, of other sizes or inputs, or in another order')
    return (f'{caller}: the dataset gave other sets on {read} than on {first} ({what}): every '
            f'read must give the same sets in the same order, or the predictions of different '
            f'sets are averaged. Pass a list or a Dataset without shuffling or a random '
            f'transform (e.g. list(dataset) of a fixed split)')


@contextmanager
def _seeded(dev: torch.device, seed: int) -> Iterator[None]:
    r"""The block run with the generators that passes on :obj:`dev` draw from seeded with
    :obj:`seed`, and restored afterwards: the CPU's, and :obj:`dev`'s own for a CUDA device (that
    one alone; ``'cuda'`` is the current one, not device 0) or the MPS device (its one
    generator)."""
    if dev.type == 'cuda':
        devices = [dev.index if dev.index is not None else torch.cuda.current_device()]
    else:  # (MPS: its dropout masks were drawn unseeded, and its stream advanced)
        devices = [0] if dev.type == 'mps' else []
    with torch.random.fork_rng(devices=devices, device_type=dev.type if devices else None):
        # the generators the passes draw from, alone: torch.manual_seed would also seed every
        # CUDA device (queued, where CUDA has not started), which fork_rng restores only for
        # the devices it is given
        torch.default_generator.manual_seed(seed)  # (restored by fork_rng)
        if dev.type == 'cuda':
            with torch.cuda.device(devices[0]):
                torch.cuda.manual_seed(seed)
        elif dev.type == 'mps':
            torch.mps.manual_seed(seed)
        yield


#: The three uncertainty estimators of Appendix D.3, in report order.
METHODS: Tuple[str, ...] = ('MZAttn (IHW)', 'MC-Dropout', 'Deep Ensemble')


def method_predictions(members: Sequence[torch.nn.Module], splits: Dict[str, Sequence],
                       passes: int = 30, seed: int = 0,
                       normalizers: Optional[Sequence] = None, batch_size: int = 256,
                       device: Union[str, torch.device] = 'cpu'
                       ) -> Dict[str, Dict[str, Tuple[np.ndarray, np.ndarray]]]:
    r"""Predictions and raw uncertainties of the three estimators of :data:`METHODS` on every
    split of :obj:`splits` (name -> dataset), from :obj:`members`, :math:`K \ge 2` independently
    trained MZ models of one architecture for single-target regression (their first output the
    prediction, their second the IHW):

    * ``'MZAttn (IHW)'``: member 0 in eval mode, one pass; uncertainty = its IHW;
    * ``'MC-Dropout'``: member 0 with dropout active, :obj:`passes` :math:`\ge 2` passes
      (:func:`mc_dropout_predict`, masks seeded with :obj:`seed`); uncertainty = the standard
      deviation of the passes;
    * ``'Deep Ensemble'``: every member in eval mode; uncertainty = the standard deviation of
      their predictions (:func:`predictive_moments`).

    Predictions are in target units (trained models carry their normaliser; :obj:`normalizers`,
    one per member, are for models that do not): members some of which predict in target units
    (a normaliser carried or given) and others not are refused, as their average would mix
    units. An uncertainty that is exactly zero for every set is warned about: the members all
    give the same predictions (the same model twice), or member 0's IHW is zero (a model without
    generators: the presets ``rigid``, ``st-*``, ``film`` and ``hypernet``). Every split is
    read once per member, once per pass and twice more (before and after the passes, to check
    it), :math:`K + P + 2` times, and must give the same sets in the same order each time (as
    for :func:`mc_dropout_predict`; a split that does not is refused). Returns
    ``{method: {split: (prediction (N,), uncertainty (N,))}}`` as ``float64`` arrays."""
    from torch_mz.train import predict
    if len(members) < 2:  # (the ensemble's spread was exactly zero, without a word)
        raise ValueError(f'A deep ensemble needs at least 2 independently trained members for a '
                         f'spread (got {len(members)}): train more members (other seeds) and '
                         f'pass them all; for the IHW alone use torch_mz.train.predict, for '
                         f'MC-Dropout alone mc_dropout_predict')
    passes = _check_passes(passes)
    norms = list(normalizers) if normalizers is not None else [None] * len(members)
    if len(norms) != len(members):  # (zip would drop the members without one)
        raise ValueError(f"Expected one normaliser per member (got {len(norms)} for "
                         f"{len(members)} members)")
    _check_units(members, norms)
    preds = {split: [predict(m, ds, normalizer=nz, batch_size=batch_size, device=device)
                     for m, nz in zip(members, norms)] for split, ds in splits.items()}
    for split in splits:
        if not all(isinstance(p, tuple) for p in preds[split]):
            raise ValueError('Expected members that give an uncertainty (the MZ models\' '
                             'interval-hull width), for the IHW method: a member gives '
                             'predictions alone')
    # every split is read once per member, once per pass and twice here: it must give the same
    # sets each time (checked here and after the passes: predictions of other sets were averaged)
    marks = {split: _stream_marks(ds, batch_size) for split, ds in splits.items()}
    for split in splits:
        counts = [p[0].size(0) for p in preds[split]] + [marks[split][1]]
        other = [c for c in counts if c != counts[0]]
        if other:  # (predictive_moments' shape error)
            raise ValueError(_changed_stream('method_predictions', f"a later read of split "
                                             f"'{split}'", 'its first', (counts[0], other[0])))
    out: Dict[str, Dict[str, Tuple[np.ndarray, np.ndarray]]] = {m: {} for m in METHODS}
    for split, ds in splits.items():
        first = preds[split][0]
        if first[0].dim() > 1 and first[0].size(-1) != 1:  # (the other columns were dropped)
            raise ValueError(f"method_predictions() is for single-target regression (got "
                             f"{first[0].size(-1)} outputs per set). A classifier's outputs are "
                             f"class logits, for which these regression uncertainties do not "
                             f"apply; for several regression targets, train one model per "
                             f"target")
        out['MZAttn (IHW)'][split] = (first[0].double().numpy()[:, 0],
                                      first[1].double().numpy())
    zero_ihw = [split for split in splits if not torch.any(preds[split][0][1] != 0)]
    if zero_ihw:  # (an IHW of exactly 0: NaN correlations and a constant fitted sigma followed)
        warnings.warn(f"method_predictions: member 0's interval-hull width is zero for every set "
                      f"of {_names(zero_ihw)}, so the IHW method's uncertainty is zero: the "
                      f"model has no generators (the presets rigid, st-*, film and hypernet), "
                      f"and no interval hull; use a model with generators (e.g. 'mz') as "
                      f"member 0", stacklevel=2)
    for split, ds in splits.items():
        mean, std = mc_dropout_predict(members[0], ds, passes, normalizer=norms[0],
                                       batch_size=batch_size, device=device, seed=seed)
        out['MC-Dropout'][split] = (mean.numpy()[:, 0], std.numpy()[:, 0])
    for split, ds in splits.items():
        again = _stream_marks(ds, batch_size)
        if not torch.equal(again[0], marks[split][0]):  # (members' predictions of other sets)
            raise ValueError(_changed_stream('method_predictions', f"split '{split}'s last read",
                                             'its first', (marks[split][1], again[1])))
    same = [split for split in splits
            if all(torch.equal(p, preds[split][0][0]) for p, _ in preds[split][1:])]
    if same:  # (the ensemble's spread was exactly zero, without a word)
        warnings.warn(f'method_predictions: every member gave the same predictions on '
                      f'{_names(same)}, so the Deep Ensemble spread is zero: the members are '
                      f'the same model (passed twice, or loaded from the same weights); pass '
                      f'independently trained members (other seeds)', stacklevel=2)
    for split in splits:
        mean, std = predictive_moments([p for p, _ in preds[split]])
        out['Deep Ensemble'][split] = (mean.numpy()[:, 0], std.numpy()[:, 0])
    return out


def _names(splits: Sequence[str]) -> str:
    return ', '.join(f"'{s}'" for s in splits)


def _check_units(members: Sequence[torch.nn.Module], norms: Sequence) -> None:
    r"""Refuses members some of which predict in target units (a normaliser carried or given)
    and others standardised values (neither): their average mixes units."""
    from torch_mz.train.normalize import carried_normalizer
    raw = [k for k, (m, nz) in enumerate(zip(members, norms))
           if carried_normalizer(m) is None and nz is None]
    if not raw or len(raw) == len(members):
        return
    have = [k for k in range(len(members)) if k not in raw]
    verb = 'predicts' if len(have) == 1 else 'predict'
    raise ValueError(f'The members would be averaged in different units: {_members(have)} '
                     f'{verb} in target units (a target normaliser carried, or given in '
                     f'normalizers=), {_members(raw)} standardised values (none carried nor '
                     f'given: weights loaded into a fresh model with load_state_dict come '
                     f'without it). Load every member with torch_mz.load_model, which restores '
                     f'its normaliser, or pass normalizers=[...] with the normaliser of every '
                     f'member (None for one that carries its own)')


def _members(indices: Sequence[int]) -> str:
    return ('member ' if len(indices) == 1 else 'members ') + ', '.join(map(str, indices))
