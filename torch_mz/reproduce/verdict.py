r"""The verdict rule of a claim."""
import math
from typing import Optional, Tuple

import numpy as np

VERDICTS = ('reproduced', 'direction only', 'not reproduced', 'inconclusive')
TOL_ABS = 0.02  # R² units: how close to the paper's figure counts as the same
TOL_REL = 0.25  # ... or this fraction of the paper's figure, whichever is larger
NOT_LEARNED = 0.1  # R²: below this a model has not learned the task ...
LEARNED_IN_PAPER = 0.5  # ... where the paper's model A reaches at least this

VERDICT_RULE = f"""\
Each claim is one number: a difference of test R² between two models, R²(A) - R²(B), positive
when A is better (Table 30's rows show a cost ratio r, mz / rigid, and the rule below reads
r - 1, the paper's figure likewise; there "ours" is the ratio of the medians over all the
benchmark's calls and s the standard deviation of the ratios within each of its rounds, the
independent samples, or of its calls paired in order). Otherwise "ours" is the mean over seeds
of the
per-seed differences (same seed index, same data), with s their standard deviation (ddof = 1)
over n seeds; "paper" is the paper's figure p. With tol = max({TOL_ABS}, {TOL_REL:g} |p|):

0. not reproduced: where the paper gives model A an R² of at least {LEARNED_IN_PAPER} and our
   mean R² of both A and B is below {NOT_LEARNED}: neither model learns the task here, and a
   difference between two fits at the noise level says nothing about the paper's difference;
1. inconclusive: fewer than 2 seeds, a missing run, or a seed spread as large as the paper's
   effect (2 s > max(|p|, tol));
2. reproduced: |ours - p| <= tol;
3. direction only: ours has the paper's sign and |ours| > 2 s (A beats B, by another margin);
4. not reproduced: otherwise, when the paper's figure lies outside ours ± 2 s (the opposite
   sign, or no resolved difference where the paper has one);
5. inconclusive: otherwise.

Exact figures (parameter counts) have no spread and skip the seed conditions."""


def verdict(paper: float, mean: float, spread: float, seeds: Optional[int],
            levels: Optional[Tuple[float, float, float]] = None,
            complete: bool = True) -> str:
    r"""The verdict of one claim by :data:`VERDICT_RULE`: the paper's figure :obj:`paper`, ours
    :obj:`mean` with seed standard deviation :obj:`spread` over :obj:`seeds` seeds
    (:obj:`None` for an exact figure, e.g. a parameter count). :obj:`levels`, for a difference
    of R², is ``(ours A, ours B, paper's A)``, the mean R² of the two models and the paper's R²
    of A (:obj:`nan` where the paper has none), for rule 0. :obj:`complete` false: a run of
    the claim is missing (rule 1), whatever :obj:`seeds` are left. Returns one of
    :data:`VERDICTS`."""
    if levels is not None:
        ours_a, ours_b, paper_a = levels
        if (paper_a >= LEARNED_IN_PAPER and ours_a < NOT_LEARNED
                and ours_b < NOT_LEARNED):  # (False for nan)
            return 'not reproduced'
    if not (math.isfinite(paper) and math.isfinite(mean)):
        return 'inconclusive'
    if not complete:
        return 'inconclusive'
    if seeds is None:
        spread = 0.0
    elif seeds < 2 or not math.isfinite(spread):
        return 'inconclusive'
    tol = max(TOL_ABS, TOL_REL * abs(paper))
    # (the thresholds compare as the rule's decimals: 0.07 - 0.05 is 0.020000000000000004 in
    # floats, which read as beyond tol = 0.02)
    if _beyond(2 * spread, max(abs(paper), tol)):
        return 'inconclusive'
    if not _beyond(abs(mean - paper), tol):
        return 'reproduced'
    if np.sign(mean) == np.sign(paper) and _beyond(abs(mean), 2 * spread):
        return 'direction only'
    if _beyond(abs(mean - paper), 2 * spread):
        return 'not reproduced'
    return 'inconclusive'


def _beyond(value: float, threshold: float) -> bool:
    r"""Whether :obj:`value` > :obj:`threshold` by more than float rounding (a value at the
    threshold up to rounding is not beyond it)."""
    return value > threshold and not math.isclose(value, threshold, rel_tol=1e-9,
                                                  abs_tol=1e-12)
