r"""Appendix D.3's claim: the IHW against MC-Dropout and a deep ensemble."""
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Sequence

import numpy as np

from torch_mz.reproduce.claims import Claim, D3_PASSES
from torch_mz.reproduce.store import epochs_figures
from torch_mz.study.statistics import mean_or_nan, std_or_nan
from torch_mz.reproduce.verdict import verdict

if TYPE_CHECKING:  # pragma: no cover
    from torch_mz.reproduce.runner import Reproduction


def d3_records(repro: 'Reproduction', claim: Claim, runs: Sequence[Mapping[str, Any]],
               study_seeds: int, sweep: Mapping[str, Any]) -> List[Dict[str, object]]:
    r"""Appendix D.3's records: for each study seed :math:`s`, the :data:`D3_MEMBERS` runs of
    seeds :math:`5s .. 5s + 4` are the members; member 0 gives the IHW (one pass) and, with
    dropout active, MC-Dropout (:data:`D3_PASSES` passes), all five the deep ensemble
    (:func:`torch_mz.uncertainty.method_predictions`). Every raw uncertainty is mapped to a
    Gaussian sigma by the affine map fitted on the validation split
    (:func:`~torch_mz.uncertainty.fit_affine_sigma`); Spearman (of the raw uncertainty with
    the absolute error), ECE and NLL are on the test split. Each comparison is a per-seed
    difference of one metric between two methods, judged by the verdict rule like the R²
    differences (the same units: a correlation or an ECE in [0, 0.5]). The members' weights come
    from the store (:meth:`RunStore.weights`; :meth:`Reproduction.run` trains a member whose
    weights are lost again first); a run still without them (no best epoch), or one that
    diverged (whose weights, of the epochs before, are no trained member), leaves its study
    seed out, the record says which, and its verdicts are inconclusive (a missing run); the
    members' R² in the record is of the scored members."""
    import torch

    from torch_mz.inference import load_model
    from torch_mz.uncertainty import (METHODS, error_correlation, fit_affine_sigma, gaussian_nll,
                                      method_predictions, regression_ece)
    cell = repro.sized(claim.cells[0])
    spec = claim.models[0]
    lr, wd = repro.sweep(cell['task'], [spec])[spec]  # what run() trained the members with
    config = replace(repro.base_config(cell['task']), lr=lr, weight_decay=wd)
    task = repro._load(cell['task'], seed=0, **dict(cell['kwargs']))
    y = {split: torch.cat([d.y.view(-1) for d in ds]).double().numpy()
         for split, ds in (('val', task.val), ('test', task.test))}
    per_seed: List[Dict[str, Dict[str, float]]] = []
    missing: List[int] = []
    # a run that diverged has no test figures, but the weights of its best epoch before the
    # divergence were kept: scored, they stood in for a trained member without a word
    diverged = {int(r['seed']) for r in runs if r['model'] == spec and r.get('diverged')}
    failed: List[int] = []
    scored: List[int] = []  # the seeds of the members that were scored
    for s in range(study_seeds):
        seeds = list(range(s * claim.members, (s + 1) * claim.members))
        paths = [None if k in diverged else repro.store.weights(cell, spec, k, config)
                 for k in seeds]
        found = [p for p in paths if p is not None]
        if len(found) < len(paths):
            missing += [k for k, p in zip(seeds, paths) if p is None and k not in diverged]
            failed += [k for k in seeds if k in diverged]
            continue
        scored += seeds
        inputs = method_predictions([load_model(p) for p in found],
                                    {'val': task.val, 'test': task.test}, passes=D3_PASSES,
                                    seed=s, device=repro.device)
        metrics = {}
        for method in METHODS:
            (vp, vs), (tp, ts) = inputs[method]['val'], inputs[method]['test']
            sigma = fit_affine_sigma(vp, y['val'], vs)(ts)
            metrics[method] = dict(
                spearman=float(error_correlation(tp, y['test'], ts)['spearman']),
                ece=regression_ece(tp, y['test'], sigma), nll=gaussian_nll(tp, y['test'], sigma),
                mse=float(np.mean((tp - y['test']) ** 2)))
        per_seed.append(metrics)
    member_r2 = [float(r['test'].get('r2', math.nan)) for r in runs
                 if r['model'] == spec and int(r['seed']) in scored]
    members = {spec: dict(r2=mean_or_nan(member_r2), r2_std=std_or_nan(member_r2, ddof=1),
                          seeds=len(member_r2))}
    methods = {m: {k: mean_or_nan([p[m][k] for p in per_seed])
                   for k in ('spearman', 'ece', 'nll', 'mse')} for m in METHODS}
    enough = 'at least' if members[spec]['r2'] >= 0.8 else 'below'
    note = (f"members' test R² {members[spec]['r2']:.3f} ({enough} the 0.8 the comparison "
            f"asks for)"
            + (f'; no best-validation weights for seeds {missing} (a run without a best epoch, '
               f'or scored without the claim: Reproduction.run trains a member with lost '
               f'weights again): their study seeds are left out' if missing else '')
            + (f'; the runs of seeds {failed} diverged: their study seeds are left out'
               if failed else ''))
    out: List[Dict[str, object]] = []
    for comparison in claim.comparisons:
        metric, a, b = comparison.b
        diffs = [p[a][metric] - p[b][metric] for p in per_seed]
        mean, spread = mean_or_nan(diffs), std_or_nan(diffs, ddof=1)
        out.append(dict(
            claim=f'd3 {comparison.cell}: {comparison.a}',
            paper=dict(value=comparison.paper, source=comparison.source, text=comparison.text),
            ours=dict(mean=mean, std=spread, seeds=len(diffs), a=a, b=b, metric=metric,
                      models=members, methods=methods, note=note),
            budget=repro.budget.name, n_train=cell['kwargs']['n_train'],
            epochs_run=epochs_figures(runs),  # (a diverged member: not stopped early)
            seeds=study_seeds, sweep=dict(sweep),
            verdict=verdict(comparison.paper, mean, spread, len(diffs),
                            complete=not (missing or failed)),
            command=repro.command('d3')))
    return out
