r"""The statistics the studies' verdicts rest on: gaps between models with their standard errors,
orderings whose adjacent gaps are resolved or not, the winner of a cell up to seed spread, and a
model's gap to the best of its rivals. Numbers only: the scripts in ``benchmarks/`` word them.

A gap counts as *resolved* when it exceeds :obj:`z` (2 by default) times its standard error, or
twice the seed spread where only spreads are known.
"""
import math
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = ['mean_std', 'mean_or_nan', 'std_or_nan', 'paired_gap', 'Ordering',
           'resolved_ordering', 'winner', 'Lead', 'lead_over_best']


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    r"""Mean and population standard deviation of :obj:`values`."""
    return float(np.mean(values)), float(np.std(values))


def mean_or_nan(values: Sequence[float]) -> float:
    r"""The mean of :obj:`values`, or NaN for none."""
    return float(np.mean(values)) if len(values) else math.nan


def std_or_nan(values: Sequence[float], ddof: int = 0) -> float:
    r"""The standard deviation of :obj:`values` with :obj:`ddof`, or NaN for too few."""
    return float(np.std(values, ddof=ddof)) if len(values) > ddof else math.nan


def paired_gap(a: Sequence[float], b: Sequence[float],
               boot_a: Optional[Sequence[float]] = None,
               boot_b: Optional[Sequence[float]] = None) -> Tuple[float, float]:
    r"""Mean of the paired differences ``a - b`` (one value per seed) and its standard error:
    over the seeds when there are several (sample standard deviation over :math:`\sqrt{n}`), else
    the standard deviation of the differences of the paired bootstrap resamples
    :obj:`boot_a` - :obj:`boot_b` (resamples that are NaN are ignored)."""
    if (np.ndim(a) != 1 or np.ndim(b) != 1 or len(a) != len(b)
            or len(a) == 0):  # (numpy would broadcast one seed, or a column, against several)
        raise ValueError(f"Expected one value per seed on both sides, paired (got {len(a)} and "
                         f"{len(b)})")
    diffs = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if len(diffs) > 1:
        return float(diffs.mean()), float(diffs.std(ddof=1) / np.sqrt(len(diffs)))
    if boot_a is None or boot_b is None:
        raise ValueError('one seed: the standard error needs the bootstrap resamples')
    if (np.ndim(boot_a) != 1 or np.ndim(boot_b) != 1 or len(boot_a) != len(boot_b)
            or len(boot_a) == 0):
        raise ValueError(f"Expected paired bootstrap resamples (got {len(boot_a)} and "
                         f"{len(boot_b)})")
    d = np.asarray(boot_a, dtype=float) - np.asarray(boot_b, dtype=float)
    return float(diffs[0]), float(np.nanstd(d))


@dataclass
class Ordering:
    r"""Names from best to worst; ``gaps[i]`` (absolute) and ``errors[i]`` are those between
    ``names[i]`` and ``names[i + 1]``, ``resolved[i]`` whether that gap exceeds ``z`` errors."""
    names: List[str]
    gaps: List[float]
    errors: List[float]
    resolved: List[bool]


def resolved_ordering(values: Mapping[str, Sequence[float]],
                      bootstrap: Optional[Mapping[str, Sequence[float]]] = None,
                      higher_is_better: bool = False, z: float = 2.0) -> Ordering:
    r"""Orders the entries of :obj:`values` (name -> one value per seed) by their mean, best
    first (ties keep the order of :obj:`values`; a NaN mean, a missing figure, last), with every
    adjacent gap's standard error from :func:`paired_gap` (:obj:`bootstrap`: name -> resamples,
    needed with one seed)."""
    def key(name: str) -> Tuple[bool, float]:
        mean = float(np.mean(values[name]))
        if math.isnan(mean):  # (a NaN key made the sort depend on the entries' order)
            return True, 0.0
        return False, -mean if higher_is_better else mean

    names = sorted(values, key=key)
    gaps, errors, resolved = [], [], []
    for a, b in zip(names, names[1:]):
        boot = (None, None) if bootstrap is None else (bootstrap[a], bootstrap[b])
        g, se = paired_gap(values[a], values[b], *boot)
        gaps.append(abs(g))
        errors.append(se)
        resolved.append(abs(g) > z * se)
    return Ordering(names, gaps, errors, resolved)


def winner(means: Mapping[str, float], spreads: Optional[Mapping[str, float]] = None,
           z: float = 2.0) -> List[str]:
    r"""The best entry of :obj:`means` (highest), followed by every other entry whose mean is
    within :obj:`z` times the larger seed spread of the best and the runner-up: one name for a
    clear winner, several for a tie. Entries are ranked by mean, ties in the order given (an
    exact tie without spreads: the first); a NaN mean (a missing figure) ranks last and wins
    nothing unless every mean is NaN. A NaN spread of an entry whose mean is a number raises a
    :class:`ValueError` (an unknown spread decides no tie: the answer depended on the entries'
    order)."""
    if not means:
        raise ValueError('Expected at least one entry')
    _check_spreads(means, means, spreads)
    ranked = sorted(means, key=lambda k: (not math.isnan(means[k]), means[k]), reverse=True)
    ranked = [k for k in ranked if not math.isnan(means[k])] or ranked
    best = ranked[0]
    if len(ranked) == 1:
        return [best]
    spreads = spreads or {}
    spread = max(spreads.get(best, 0.0), spreads.get(ranked[1], 0.0))
    return [best] + [k for k in ranked[1:] if means[best] - means[k] < z * spread]


def _check_spreads(means: Mapping[str, float], names: Iterable[str],
                   spreads: Optional[Mapping[str, float]]) -> None:
    r"""Refuses a NaN spread where the mean is a number (Python's ``max`` with a NaN gave an
    answer that depended on the order of its arguments)."""
    for name in names:
        spread = (spreads or {}).get(name, 0.0)
        if math.isnan(spread) and not math.isnan(means[name]):
            raise ValueError(f"the spread of {name!r} is NaN while its mean is {means[name]!r}: "
                             f"give a number (0.0 for one seed) or leave it out")


@dataclass
class Lead:
    r"""How a model stands against the best of its rivals: ``gap`` = model - best (positive: the
    model leads), ``spread`` the larger of the two seed spreads (NaN where either is: a missing
    figure's)."""
    best: str
    gap: float
    spread: float = 0.0


def lead_over_best(means: Mapping[str, float], model: str, rivals: Iterable[str],
                   spreads: Optional[Mapping[str, float]] = None) -> Optional[Lead]:
    r""":obj:`model`'s :class:`Lead` over the best (highest mean) of the :obj:`rivals` present in
    :obj:`means`; :obj:`None` when :obj:`model` or every rival is missing. A NaN spread of
    :obj:`model` or a rival whose mean is a number raises a :class:`ValueError`, as in
    :func:`winner`."""
    if isinstance(rivals, str):  # (a string was read as its characters)
        raise ValueError(f"Expected a collection of model names as rivals (got the string "
                         f"{rivals!r}; e.g. [{rivals!r}])")
    rivals = set(rivals)
    present = [k for k in means if k in rivals and k != model]  # ties: the first in means
    if model not in means or not present:
        return None
    # a NaN mean (a missing figure, a diverged run) is no best rival unless all are NaN
    present = [k for k in present if not math.isnan(means[k])] or present
    _check_spreads(means, [model] + present, spreads)
    best = max(present, key=lambda r: means[r])
    pair = [(spreads or {}).get(k, 0.0) for k in (model, best)]
    # (max(nan, s) was nan but max(s, nan) s: NaN, unknown, whichever it is)
    spread = math.nan if any(math.isnan(v) for v in pair) else max(pair)
    return Lead(best, means[model] - means[best], spread)
