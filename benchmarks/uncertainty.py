r"""Uncertainty calibration on set matching (Appendix D.3, Tables 19-21 of the MZAttn paper):
MZAttn's single-pass interval-hull width (IHW) against MC-Dropout and a deep ensemble.

Design (the paper gives the task and the methods, not the protocol):

* Task: set matching, the ``chamfer`` task (Task B: Chamfer distance between a cloud and either a
  rotated-noisy copy or an independent cloud, d = 3, 10-30 points per cloud), one fixed data draw
  (seed 0) for every run.
* One base architecture, the ``mz`` preset (MZ-Set Transformer, n_g = 8, L = 4, dropout 0.1), and
  one training budget for every model (AdamW, warm-up + cosine, batch 64, target normalisation,
  best-validation weights).
* Per study seed, K models are trained with different seeds (the data are the same).
  (1) **MZAttn (IHW)**: member 0, eval mode, one pass; uncertainty = its IHW (latent units).
  (2) **MC-Dropout**: member 0 with dropout active (the whole model in training mode; its only
  training-mode behaviour is dropout on attention weights and FFN outputs), P passes; prediction
  = mean, uncertainty = standard deviation (divisor P) in target units.
  (3) **Deep Ensemble**: all K members in eval mode; prediction = mean, uncertainty = standard
  deviation (divisor K). The quick mode thus trains K models in all.
* The IHW is a width in latent units, not a standard deviation, so every method's raw uncertainty
  s is mapped to sigma = a s + b (a >= 0, b > 0) fitted on the validation split by minimising the
  Gaussian NLL (:func:`torch_mz.uncertainty.fit_affine_sigma`); ECE and NLL are reported on the
  test split. For transparency MC-Dropout and the ensemble are also scored with their raw standard
  deviation as sigma, and the IHW as-is (a unit mismatch, shown because the paper does not say how
  its IHW became a sigma).
* Metrics (test split): MSE of the prediction; Spearman and Pearson correlation of the raw
  uncertainty with |error| (invariant to the affine map); quantile bins of the uncertainty
  (Table 19); Gaussian NLL including 0.5 log(2 pi); regression ECE over the central intervals
  p = 0.05, ..., 0.95. Inference time: median of 3 calls (after one warm-up) over the first
  ``--timing-sets`` test sets in one batch, all passes or members included.
* A member whose training diverges is recorded as diverged, and its study seed with it: the
  seed's ensemble (and, for member 0, its IHW and MC-Dropout) cannot be formed, so the seed's
  remaining members are not trained, and the seed is left out of the tables, verdicts and plot
  and named in the report; the other study seeds go on, as the other studies' runs do
  (``train_models(record_diverged=True)``).
* Every finished study seed (its members' records and every method's figures, or its
  divergence) is kept as one file in ``<out>/runs`` (:class:`~torch_mz.study.RunStore`): the
  same command with ``--resume`` trains only the study seeds an interrupted call had not
  finished (the members of the seed in progress are trained again: the methods need their
  weights, which are not kept); without ``--resume`` a folder that holds study seeds is
  refused, and ``--overwrite`` removes them and trains every one again. Ctrl-C ends a run with
  one line that gives the command to go on (status 130).

    python benchmarks/uncertainty.py --quick   # 1 seed, K = 3, 30 passes, 1000 sets, 10 epochs
    python benchmarks/uncertainty.py           # 3 seeds, K = 5, 30 passes, 5000 sets, 100 epochs
"""
import argparse
import json
import os
import sys
import time
import warnings
from dataclasses import replace

import numpy as np
import torch

from torch_mz.datasets import TASKS as SYNTHETIC_TASKS
from torch_mz.models import build_model, count_parameters
from torch_mz.options import parse_key_values
from torch_mz.study import (EXIT_INTERRUPTED, RunStore, environment, interruptible,
                            markdown_table, positive_int, pyplot, replace_plot, time_call,
                            try_plot, write_report)
from torch_mz.study.plots import save_figure
from torch_mz.study.budget import (Budget, add_budget_arguments, add_resume_argument,
                                   choose_budget, study_config)
from torch_mz.study.statistics import mean_std, paired_gap, resolved_ordering
from torch_mz.tasks import load_task
from torch_mz.train import Trainer, TrainingDiverged, predict, resolve_device, seed_everything
from torch_mz.uncertainty import (DEFAULT_LEVELS, METHODS, binned_by_uncertainty,
                                  error_correlation, fit_affine_sigma, gaussian_nll,
                                  interval_coverage, mc_dropout_predict, method_predictions,
                                  regression_ece)
from torch_mz.study.report import check_out_folder
from torch_mz._files import nan_for_none
# Table 20: method -> (Spearman, Pearson, inference seconds, passes)
PAPER_T20 = {'MZAttn (IHW)': (0.513, 0.442, 0.10, 1), 'MC-Dropout': (0.553, 0.547, 0.37, 10),
             'Deep Ensemble': (0.470, 0.542, 0.40, 5)}
# Table 21 (mean ± std over 3 seeds): method -> (MSE, std, ECE, std, NLL, std, passes, models)
PAPER_T21 = {'MZAttn (IHW)': (55.0, 10.5, 0.316, 0.001, 5.02, 0.03, 1, 1),
             'MC-Dropout': (59.8, 6.1, 0.197, 0.030, 3.52, 0.43, 30, 1),
             'Deep Ensemble': (47.8, 1.1, 0.337, 0.019, 9.17, 1.96, 1, 5)}
# Table 19: IHW bins -> (mean IHW, mean |error|, count)
PAPER_T19 = [(5.33, 1.13, 400), (5.52, 2.01, 400), (5.72, 3.15, 400), (6.03, 4.20, 400),
             (6.64, 6.81, 400)]
NUM_BINS = 5
BOOTSTRAP = 200  # paired bootstrap resamples of the test split
QUICK = Budget(seeds=1, n_train=1000, n_val=500, n_test=1000, epochs=10, lr=1e-3)
FULL = Budget(seeds=3, n_train=5000, n_val=1000, n_test=2000, epochs=100, lr=1e-4)
MEMBERS = {'quick': 3, 'full': 5}  # ensemble size K
PASSES = 30  # MC-Dropout passes
TIMING_SETS = 128  # test sets in the timed batch


def train_member(task, seed, config):
    seed_everything(seed)
    model = build_model('mz', task.in_channels, task.out_channels)
    trainer = Trainer(model, config, task.task_type)
    result = trainer.fit(task.train, task.val, task.test)
    return model, trainer.normalizer, result


def score(pred, target, raw, val_pred, val_target, val_raw):
    r"""Metrics of one method on the test split; the affine sigma is fitted on validation."""
    fit = fit_affine_sigma(val_pred, val_target, val_raw)
    sigma = fit(raw)
    out = dict(mse=float(np.mean((pred - target) ** 2)),
               **error_correlation(pred, target, raw),
               bins=binned_by_uncertainty(pred, target, raw, NUM_BINS),
               fit=dict(a=fit.a, b=fit.b),
               calibrated=dict(ece=regression_ece(pred, target, sigma),
                               nll=gaussian_nll(pred, target, sigma),
                               coverage=interval_coverage(pred, target, sigma).tolist()))
    # raw uncertainty taken as sigma (floored at float32 eps to keep the NLL finite)
    raw_sigma = np.maximum(raw, np.finfo(np.float32).eps)
    out['raw'] = dict(ece=regression_ece(pred, target, raw_sigma),
                      nll=gaussian_nll(pred, target, raw_sigma),
                      coverage=interval_coverage(pred, target, raw_sigma).tolist())
    return out


def bootstrap(inputs, y_val, y_test, resamples=BOOTSTRAP, seed=0):
    r"""Paired bootstrap over the test sets (the same resampled indices for every method, the
    recalibration kept as fitted): per method, the resampled Spearman, Pearson, recalibrated ECE
    and NLL, for the sampling error of differences between methods within one study seed."""
    rng = np.random.default_rng(seed)
    n = y_test.shape[0]
    idx = rng.integers(0, n, size=(resamples, n))  # (R, N)
    out = {}
    for method in METHODS:
        (vp, vs), (tp, ts) = inputs[method]['val'], inputs[method]['test']
        sigma = fit_affine_sigma(vp, y_val, vs)(ts)
        corr = [error_correlation(tp[i], y_test[i], ts[i]) for i in idx]
        out[method] = dict(
            spearman=[c['spearman'] for c in corr], pearson=[c['pearson'] for c in corr],
            ece=[regression_ece(tp[i], y_test[i], sigma[i]) for i in idx],
            nll=[gaussian_nll(tp[i], y_test[i], sigma[i]) for i in idx])
    return out


def run_seed(task, study_seed, members, passes, budget, timing_sets, device):
    members_out, models = [], []
    for k in range(members):
        seed = 1000 * study_seed + k
        t0 = time.time()
        try:
            model, normalizer, result = train_member(
                task, seed, study_config(budget, device=device, seed=seed))
        except TrainingDiverged as e:  # (it ended the study with a traceback)
            which = f'member {k + 1}/{members} (seed {seed})'
            warnings.warn(f'study seed {study_seed} {which} diverged ({e}): the study seed is '
                          f'recorded with no figures (its ensemble cannot be formed), the '
                          f'other study seeds go on')
            print(f'study seed {study_seed} {which}: diverged ({e})', flush=True)
            members_out.append(dict(seed=seed, diverged=str(e)))
            return dict(study_seed=study_seed, members=members_out, diverged=f'{which}: {e}')
        models.append((model, normalizer))
        test = result.test_metrics or {}
        members_out.append(dict(seed=seed, best_epoch=result.best_epoch, test=test,
                                wall_time_s=result.wall_time))
        print(f"study seed {study_seed} member {k + 1}/{members} (seed {seed}): test mse "
              f"{test.get('mse', float('nan')):.4f}, r2 {test.get('r2', float('nan')):.4f} "
              f"({time.time() - t0:.0f} s)", flush=True)

    def targets(ds):
        return torch.cat([d.y.view(-1) for d in ds]).double().numpy()

    y_val, y_test = targets(task.val), targets(task.test)
    batch = 256
    # per method and split: (prediction in original units, raw uncertainty)
    t0 = time.time()
    inputs = method_predictions([m for m, _ in models], {'val': task.val, 'test': task.test},
                                passes=passes, seed=study_seed,
                                normalizers=[nz for _, nz in models], batch_size=batch,
                                device=device)
    ihw = {s: inputs['MZAttn (IHW)'][s][1] for s in ('val', 'test')}
    model0, norm0 = models[0]
    print(f"study seed {study_seed}: predictions, MC-Dropout ({passes} passes) and the ensemble "
          f"over val + test ({time.time() - t0:.0f} s)", flush=True)

    results = {}
    for method in METHODS:
        (vp, vs), (tp, ts) = inputs[method]['val'], inputs[method]['test']
        results[method] = score(tp, y_test, ts, vp, y_val, vs)
    boot = bootstrap(inputs, y_val, y_test)
    results['MZAttn (IHW)']['ihw_test'] = ihw['test'].tolist()
    results['MZAttn (IHW)']['abs_error_test'] = np.abs(
        inputs['MZAttn (IHW)']['test'][0] - y_test).tolist()

    # inference time on one batch of the first `timing_sets` test sets
    subset = task.test[:timing_sets]
    dev = resolve_device(device)
    calls = {
        'MZAttn (IHW)': lambda: predict(model0, subset, normalizer=norm0,
                                        batch_size=timing_sets, device=dev),
        'MC-Dropout': lambda: mc_dropout_predict(model0, subset, passes, normalizer=norm0,
                                                 batch_size=timing_sets, device=dev),
        'Deep Ensemble': lambda: [predict(m, subset, normalizer=nz, batch_size=timing_sets,
                                          device=dev) for m, nz in models],
    }
    for method in METHODS:
        results[method]['inference_s'] = float(np.median(time_call(calls[method], repeats=3,
                                                                   warmup=1, device=dev)))
        results[method]['passes'] = {'MZAttn (IHW)': 1, 'MC-Dropout': passes,
                                     'Deep Ensemble': members}[method]
        results[method]['models'] = members if method == 'Deep Ensemble' else 1
    return dict(study_seed=study_seed, members=members_out, methods=results, bootstrap=boot,
                params=count_parameters(model0))


def fmt(values, digits=3):
    m, s = mean_std(values)
    return f'{m:.{digits}f}' if len(values) == 1 else f'{m:.{digits}f} ± {s:.{digits}f}'


def summarize(runs):
    r"""Mean and std over study seeds of every scalar metric, per method."""
    out = {}
    for method in METHODS:
        recs = [r['methods'][method] for r in runs]
        entry = {}
        for key in ('mse', 'spearman', 'pearson', 'inference_s'):
            entry[key] = mean_std([r[key] for r in recs])
        for kind in ('calibrated', 'raw'):
            for key in ('ece', 'nll'):
                entry[f'{kind} {key}'] = mean_std([r[kind][key] for r in recs])
        entry['passes'], entry['models'] = recs[0]['passes'], recs[0]['models']
        out[method] = entry
    return out


def per_seed(runs, method, key, kind=None):
    r"""Metric :obj:`key` (of :obj:`kind`, e.g. ``'calibrated'``) of :obj:`method`, one value
    per study seed."""
    return [r['methods'][method][kind][key] if kind else r['methods'][method][key] for r in runs]


def resamples(runs, method, key):
    r"""The paired bootstrap resamples of :obj:`key` with one study seed (else :obj:`None`: the
    seeds give the standard errors)."""
    return runs[0]['bootstrap'][method][key] if len(runs) == 1 else None


def gap(runs, a, b, key, kind=None):
    r"""Mean difference of metric :obj:`key` between methods :obj:`a` and :obj:`b` and its
    standard error (:func:`torch_mz.study.statistics.paired_gap`)."""
    return paired_gap(per_seed(runs, a, key, kind), per_seed(runs, b, key, kind),
                      resamples(runs, a, key), resamples(runs, b, key))


def ordering(runs, key, kind=None, higher_is_better=False):
    r"""Methods from best to worst as text, with each adjacent gap, its standard error and
    whether it is resolved (:func:`torch_mz.study.statistics.resolved_ordering`)."""
    order = resolved_ordering({m: per_seed(runs, m, key, kind) for m in METHODS},
                              None if len(runs) > 1 else
                              {m: resamples(runs, m, key) for m in METHODS}, higher_is_better)
    parts = [order.names[0]]
    for b, g, se, ok in zip(order.names[1:], order.gaps, order.errors, order.resolved):
        parts.append(f"{'>' if higher_is_better else '<'} {b} (gap {g:.3f} ± {se:.3f}"
                     f"{'' if ok else ', not resolved'})")
    return order.names, ' '.join(parts), order.resolved


def paper_names(table, idx, higher_is_better):
    return sorted(METHODS, key=lambda k: table[k][idx], reverse=higher_is_better)


def verdicts(runs, summary, passes, members):
    r"""Plain statements of where the measured numbers agree with the paper's claims. Gaps are
    given with their standard error (over seeds, or from a paired bootstrap of the test split
    with one seed); a gap under two standard errors is called unresolved."""
    m = {k: {kk: v[0] if isinstance(v, tuple) else v for kk, v in e.items()}
         for k, e in summary.items()}

    def compare(names, paper, resolved):
        if names == paper:
            return 'same order as the paper'
        if not all(resolved):
            return 'different order from the paper, but not every gap is resolved'
        return 'different order from the paper'

    lines = []
    r2 = [mem['test'].get('r2', float('nan')) for r in runs for mem in r['members']]
    if np.mean(r2) < 0.5:
        lines.append(
            f"Accuracy first: the trained members reach test R² "
            f"{', '.join(f'{v:.3f}' for v in r2)} -- they explain "
            f"{'almost none' if np.mean(r2) < 0.1 else 'only part'} of the "
            f"target. Errors are then mostly the target's own spread, every uncertainty has little "
            f"to rank, and the recalibrated sigmas are close to a constant; the comparisons below "
            f"check the pipeline more than the paper's claims (use the full budget for those).")
    names, text, res = ordering(runs, 'spearman', higher_is_better=True)
    paper = paper_names(PAPER_T20, 0, True)
    rho = m['MZAttn (IHW)']['spearman']
    lines.append(
        f"Ranking (Spearman of uncertainty with |error|): ours {text}; paper "
        f"{' > '.join(paper)} -- {compare(names, paper, res)}. IHW Spearman {rho:.3f} vs the "
        f"paper's 0.513: {'close (within 0.1)' if abs(rho - 0.513) <= 0.1 else 'not close'}; "
        + ('the IHW does carry error information (rho > 0.1).' if rho > 0.1 else
           'the IHW carries little error information here (rho <= 0.1).'))
    names, text, res = ordering(runs, 'pearson', higher_is_better=True)
    paper = paper_names(PAPER_T20, 1, True)
    lines.append(f"Pearson: ours {' > '.join(names)}; paper {' > '.join(paper)} -- "
                 f"{'same order as the paper' if names == paper else 'different order'}.")
    t_ihw = m['MZAttn (IHW)']['inference_s']
    lines.append(
        f"Cost: MC-Dropout ({passes} passes) took {m['MC-Dropout']['inference_s'] / t_ihw:.1f}x "
        f"and the {members}-model ensemble {m['Deep Ensemble']['inference_s'] / t_ihw:.1f}x the "
        f"time of the single IHW pass (paper: 3.7x for 10 passes and 4.0x for 5 models in "
        f"Table 20, '30x' for 30 passes in Table 21). Only the IHW needs one pass and one stored "
        f"model -- true by construction, as the paper says.")
    names, text, res = ordering(runs, 'ece', 'calibrated')
    cal_eces = ', '.join(f"{k} {m[k]['calibrated ece']:.3f}" for k in METHODS)
    paper = paper_names(PAPER_T21, 2, False)
    lines.append(
        f"ECE, every method recalibrated the same way: ours {text}; paper (recalibration not "
        f"stated) {' < '.join(paper)} -- {compare(names, paper, res)}. The paper's 'MC-Dropout "
        f"has the best ECE' "
        f"{'holds' if names[0] == 'MC-Dropout' and res[0] else 'is not confirmed'} here. "
        + (f"All recalibrated ECEs ({cal_eces}) are below the paper's lowest, 0.197."
           if max(m[k]['calibrated ece'] for k in METHODS) < 0.197 else
           f"Recalibrated ECEs: {cal_eces}."))
    names, text, res = ordering(runs, 'nll', 'calibrated')
    paper = paper_names(PAPER_T21, 4, False)
    g, se = gap(runs, 'MZAttn (IHW)', 'Deep Ensemble', 'nll', 'calibrated')
    verdict = ('holds' if g < -2 * se else 'is contradicted' if g > 2 * se
               else 'is neither confirmed nor contradicted (gap unresolved)')
    # (the paper's "about 2x" is a ratio of NLLs, which moves with the target's units: only the
    # sign of the gap is tested, and the line said the "2x" held for any lower NLL)
    lines.append(
        f"NLL, recalibrated: ours {text}; paper {' < '.join(paper)} -- "
        f"{compare(names, paper, res)}. The paper's 'IHW NLL lower than the ensemble's' (5.02 "
        f"against 9.17) {verdict} here (IHW - ensemble = {g:.3f} ± {se:.3f}); its 'about 2x "
        f"lower' is not tested, a ratio of NLLs having no meaning of its own. Absolute NLLs are "
        f"not comparable with the paper's: the NLL shifts by log c when targets are scaled by c.")
    names = sorted(METHODS, key=lambda k: m[k]['mse'])
    paper = paper_names(PAPER_T21, 0, False)
    lines.append(f"MSE: ours {' < '.join(names)}; paper {' < '.join(paper)} -- "
                 f"{'same order as the paper' if names == paper else 'different order'}.")
    # (it said "every method is poorly calibrated, as in the paper's Table 21" whatever the
    # figures, and the paper does not say whether its sigmas were recalibrated)
    lowered = [k for k in METHODS if m[k]['calibrated ece'] < m[k]['raw ece']]
    effect = ("the recalibration lowers every method's ECE" if len(lowered) == len(METHODS)
              else "the recalibration lowers no method's ECE" if not lowered
              else f"the recalibration lowers the ECE of {', '.join(lowered)} only")
    lines.append(
        f"Raw standard deviations as sigma (no recalibration): ECE MC-Dropout "
        f"{m['MC-Dropout']['raw ece']:.3f}, ensemble {m['Deep Ensemble']['raw ece']:.3f}; the "
        f"IHW as-is gives {m['MZAttn (IHW)']['raw ece']:.3f} (latent units read as target units); "
        f"{effect}. The paper does not say whether its Table 21 sigmas are raw or recalibrated.")
    return lines


def plot(runs, path):
    if not runs:
        raise ValueError('no study seed was scored (each had a diverged member)')
    plt = pyplot()
    run = runs[0]
    colors = dict(zip(METHODS, ('tab:red', 'tab:blue', 'tab:green')))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ax = axes[0]
    ihw = np.asarray(run['methods']['MZAttn (IHW)']['ihw_test'])
    err = np.asarray(run['methods']['MZAttn (IHW)']['abs_error_test'])
    ax.scatter(ihw, err, s=4, alpha=0.4, color=colors['MZAttn (IHW)'])
    ax.set_xlabel('IHW (latent units)')
    ax.set_ylabel('|error| (target units)')
    ax.set_title(f"MZAttn: IHW vs |error| (Spearman "
                 f"{run['methods']['MZAttn (IHW)']['spearman']:.2f})", fontsize=9)
    ax = axes[1]
    for method in METHODS:
        bins = run['methods'][method]['bins']
        ax.plot([b['bin'] for b in bins], [b['abs_error'] for b in bins], marker='o',
                color=colors[method], label=method)
    ax.set_xlabel('uncertainty quantile bin (1 = lowest)')
    ax.set_ylabel('mean |error|')
    ax.set_xticks(range(1, NUM_BINS + 1))
    ax.set_title('Error by uncertainty bin (Table 19 style)', fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[2]
    ax.plot([0, 1], [0, 1], color='black', linewidth=0.8)
    for method in METHODS:
        r = run['methods'][method]
        ax.plot(DEFAULT_LEVELS, r['calibrated']['coverage'], marker='o', markersize=3,
                color=colors[method], label=f'{method} (recalibrated)')
        if method != 'MZAttn (IHW)':
            ax.plot(DEFAULT_LEVELS, r['raw']['coverage'], linestyle='--', color=colors[method],
                    label=f'{method} (raw std)')
    ax.set_xlabel('nominal level p of the central interval')
    ax.set_ylabel('observed coverage (test)')
    ax.set_title('Reliability (ECE = mean gap to the diagonal)', fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def tables(runs, summary):
    r"""The Markdown tables of the report: Table 20 (ranking and cost), Table 21 (calibration),
    Table 19 (bins of study seed 0), the recalibration fits and the ensemble members."""
    t_ihw = summary['MZAttn (IHW)']['inference_s'][0]
    rows20 = []
    for method in METHODS:
        p = PAPER_T20[method]
        rows20.append({'method': method, 'Spearman': fmt(per_seed(runs, method, 'spearman')),
                       'Pearson': fmt(per_seed(runs, method, 'pearson')),
                       'inference (s)': fmt(per_seed(runs, method, 'inference_s')),
                       'x IHW time': f"{summary[method]['inference_s'][0] / t_ihw:.1f}",
                       'passes': summary[method]['passes'],
                       'paper Spearman': p[0], 'paper Pearson': p[1],
                       'paper inference (s)': p[2], 'paper passes': p[3]})
    rows21 = []
    for method in METHODS:
        p = PAPER_T21[method]
        for kind in ('calibrated', 'raw'):
            label = {'calibrated': 'a·s + b (val NLL fit)',
                     'raw': 'IHW as-is (latent units)' if method == 'MZAttn (IHW)'
                     else 'raw std'}[kind]
            rows21.append({'method': method, 'sigma': label,
                           'MSE': fmt(per_seed(runs, method, 'mse'), 4),
                           'ECE': fmt(per_seed(runs, method, 'ece', kind)),
                           'NLL': fmt(per_seed(runs, method, 'nll', kind)),
                           'passes': summary[method]['passes'],
                           'models': summary[method]['models'],
                           'paper MSE': f'{p[0]} ± {p[1]}', 'paper ECE': f'{p[2]} ± {p[3]}',
                           'paper NLL': f'{p[4]} ± {p[5]}'})
    rows19 = []
    for b, paper in zip(runs[0]['methods']['MZAttn (IHW)']['bins'], PAPER_T19):
        rows19.append({'bin': b['bin'], 'IHW (mean)': b['uncertainty'],
                       'mean |error|': b['abs_error'], 'count': b['count'],
                       'paper IHW': paper[0], 'paper mean |error|': paper[1],
                       'paper count': paper[2]})
    fits = [{'method': method, 'a': r['methods'][method]['fit']['a'],
             'b': r['methods'][method]['fit']['b'], 'study seed': r['study_seed']}
            for r in runs for method in METHODS]
    members_rows = [dict(seed=mem['seed'], best_epoch=mem['best_epoch'],
                         test_mse=mem['test'].get('mse'), test_r2=mem['test'].get('r2'))
                    for r in runs for mem in r['members']]
    return dict(t20=markdown_table(rows20, list(rows20[0])),
                t21=markdown_table(rows21, list(rows21[0])),
                t19=markdown_table(rows19, list(rows19[0])),
                fits=markdown_table(fits, ['method', 'study seed', 'a', 'b']),
                members=markdown_table(members_rows, ['seed', 'best_epoch', 'test_mse',
                                                      'test_r2']))


def left_out(runs):
    r"""The sentence naming the study seeds left out (a member diverged), or ``''``."""
    out = [f"study seed {r['study_seed']} ({r['diverged']})" for r in runs if 'diverged' in r]
    return ('Study seeds left out (a member diverged: the seed\'s ensemble, IHW and MC-Dropout '
            f'need every member): {"; ".join(out)}.\n\n' if out else '')


def report_body(t, lines, task_name, target_std, seeds, members, passes, timing_sets,
                first_seed=0):
    r"""The Markdown report below its title, command and setup lines (:obj:`seeds`: the
    study seeds scored, the first of them :obj:`first_seed`)."""
    return (
        'Methods share one architecture (`mz`) and one training budget. IHW = member 0 in '
        f'eval mode, one pass; MC-Dropout = member 0 with dropout active, {passes} passes; '
        f'Deep Ensemble = {members} independently seeded members. Every raw uncertainty s '
        'is mapped to a Gaussian sigma = a·s + b fitted on the validation split (NLL); ECE '
        '(central intervals p = 0.05..0.95) and NLL (with 0.5·log 2π) are on the test split. '
        'Spearman/Pearson are of the raw uncertainty with |error| and do not depend on the '
        'recalibration. Inference: median of 3 calls on one batch of '
        f'{timing_sets} test sets, all passes/members included. Values are '
        + (f'mean ± std over {seeds} study seeds' if seeds > 1 else 'one study seed') +
        '; the paper\'s are as printed.\n\n'
        '## Ranking quality and cost (paper Table 20)\n\n' + t['t20'] +
        '\n## Calibration (paper Table 21)\n\n' + t['t21'] +
        f'\n## Test samples binned by IHW (paper Table 19; study seed {first_seed})\n\n'
        + t['t19'] +
        '\n## Where we agree and disagree with the paper\n\n'
        'Gaps between methods are given ± their standard error: '
        + ('over study seeds' if seeds > 1 else
           f'from a paired bootstrap of the test split ({BOOTSTRAP} resamples, '
           'recalibration held fixed)')
        + '; a gap under two standard errors is called not resolved.\n\n' +
        ''.join(f'- {line}\n' for line in lines) +
        (('\nCaveat: the paper measures this on set matching (`chamfer`); this run uses '
          f'`{task_name}` (target std {target_std:.2f}), so only the comparison '
          'between methods and scale-free quantities (correlations, ECE, cost ratios) carry '
          'over.\n\n') if task_name != 'chamfer' else
         ('\nCaveat: for Task B the paper states d = 3, 10-30 points per cloud, 5K/1K/1K '
          'sets and 200 epochs, but not the noise level, the rotation range, nor how the '
          'IHW became a sigma; its MSE of ~50 means its targets are on another scale than '
          f'this chamfer task (target std {target_std:.2f}), so only orderings and '
          'scale-free quantities (correlations, ECE, cost ratios) are comparable.\n\n')) +
        '## Recalibration fits (sigma = a·s + b) and ensemble members\n\n' +
        t['fits'] + '\n' + t['members'])


def target_std_of(task) -> float:
    r"""The standard deviation of :obj:`task`'s test targets (the report's caveat gives it)."""
    return float(np.std([float(d.y) for d in task.test]))


def write_study(out, record, redraw: bool = False):
    r"""Writes ``uncertainty.{json,md,png}`` in :obj:`out` from :obj:`record` (the environment,
    setup, summary, runs, verdict lines, minutes and test target std of one study); the
    paper's figures are added. A note where the plot could not be drawn (the report links none,
    and an earlier run's is removed), else ``None``. With :obj:`redraw` (``--replot``: the
    figure there is this record's own) a figure not drawn again is kept, and linked. The setup
    line shows the setup as the JSON keeps it (the task's set sizes as ``[10, 30]``, not the
    tuples the study holds), so that ``--replot`` writes the study's report again."""
    setup, runs = json.loads(json.dumps(record['setup'])), record['runs']
    scored = [r for r in runs if 'diverged' not in r]  # (the others: named, left out)
    title = ('Uncertainty calibration on '
             + ('set matching' if setup['task'] == 'chamfer' else f"`{setup['task']}`")
             + ' (paper Appendix D.3, Tables 19-21)')
    if scored:
        body = left_out(runs) + report_body(
            tables(scored, record['summary']), record['verdicts'], setup['task'],
            record['target_std'], len(scored), setup['ensemble_members'], setup['mc_passes'],
            setup['timing_sets'], scored[0]['study_seed'])
    else:
        body = 'No study seed was scored: no figures. ' + left_out(runs)
    payload = dict(summary=record['summary'], runs=runs,
                   paper=dict(table19=PAPER_T19, table20=PAPER_T20, table21=PAPER_T21),
                   verdicts=record['verdicts'], target_std=record['target_std'])
    env, minutes = record['environment'], record['minutes']
    notes = ''
    if record.get('read_back'):  # (a resumed study: its study seeds measured by two calls)
        payload['read_back'] = record['read_back']
        notes = (f"{record['read_back']} of the {len(runs)} study seed(s) were read back from "
                 f"`runs/` (kept by an earlier call): their figures, inference times included, "
                 f"were measured by that call, and the {minutes:.1f} min above count this call "
                 f"alone. The methods of a study seed were timed together; the means over study "
                 f"seeds mix the calls.")
    # the plot after the record is read (a record missing a field leaves the earlier files as
    # they were) and before the report, which links it where it was drawn
    png = os.path.join(out, 'uncertainty.png')
    # (--replot: the study drew the figure there from these runs, kept where it cannot be
    # drawn again here; it was removed, and the report rebuilt without it)
    redraw = redraw and bool(scored)  # (none scored: no figure of them to keep)
    note = try_plot(plot, scored, png) if redraw else replace_plot(png, plot, scored, png)
    kept = redraw and note is not None and os.path.isfile(png)
    if kept:
        note += "; the study's own uncertainty.png is kept"
    write_report(out, 'uncertainty', title, env, setup, body, payload, minutes, notes=notes,
                 plot=note is None or kept)
    return note


def replot(recorded, out):
    r"""Rebuilds ``uncertainty.{md,png}`` (and rewrites the JSON, figures unchanged) from a
    recorded study: the tables and verdicts as recorded, in the current report's layout (a
    plot that cannot be drawn here keeps the study's own figure, and the report links it).
    Records written before the test target std was stored get it from the task, generated
    again from the recorded setup (a :class:`ValueError` where it is not the recorded task)."""
    record = dict(recorded)
    # a NaN figure (a correlation of a constant uncertainty) is kept as null (write_report
    # writes standard JSON): read back as the NaN the tables show, as the study showed it
    if isinstance(record.get('summary'), dict):
        record['summary'] = _nan_for_null(record['summary'])
    if isinstance(record.get('runs'), list):
        record['runs'] = [_nan_figures(r) if isinstance(r, dict) else r for r in record['runs']]
    if 'target_std' not in record:
        setup = record['setup']
        options = {k: v for k, v in setup['task_params'].items() if k != 'set_sizes'}
        task = load_task(setup['task'], seed=0, n_train=setup['n_train'], n_val=setup['n_val'],
                         n_test=setup['n_test'], **options)
        if json.loads(json.dumps(task.info)) != setup['task_params']:
            raise ValueError(f"the task generated again is not the recorded one ({task.info} "
                             f"against {setup['task_params']})")
        record['target_std'] = target_std_of(task)
    return write_study(out, record, redraw=True)


def _nan_for_null(value):
    r""":obj:`value` with every :obj:`None` at any depth of dicts and lists as NaN: the figures
    of a study's methods and summary, where no entry is ever null but a NaN written as one."""
    if value is None:
        return float('nan')
    if isinstance(value, dict):
        return {k: _nan_for_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_for_null(v) for v in value]
    return value


def _nan_figures(run):
    r"""A recorded run with the figures of its methods, bootstrap and members' test metrics
    that were written as null (NaN) as NaN (a member's ``best_epoch`` of null stays)."""
    run = dict(run)
    for key in ('methods', 'bootstrap'):
        if key in run:
            run[key] = _nan_for_null(run[key])
    if isinstance(run.get('members'), list):
        run['members'] = [dict(m, test=nan_for_none(m['test'])) if isinstance(m, dict)
                          and 'test' in m else m for m in run['members']]
    return run


def at_least_two(text):
    r"""An integer >= 2 (a spread needs two samples)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected an integer, got {text!r}') from None
    if value < 2:
        raise argparse.ArgumentTypeError(f'expected an integer >= 2 (a spread needs two '
                                         f'samples), got {text!r}')
    return value


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    add_budget_arguments(parser, quick_help='1 seed, K=3, 1000 training sets, 10 epochs')
    parser.add_argument('--members', type=at_least_two, default=None, help='ensemble size K')
    parser.add_argument('--passes', type=at_least_two, default=None, help='MC-Dropout passes')
    parser.add_argument('--task', default='chamfer', choices=sorted(SYNTHETIC_TASKS),
                        metavar='TASK',
                        help="synthetic task (default: 'chamfer', the paper's set matching; "
                             f"one of {', '.join(sorted(SYNTHETIC_TASKS))})")
    parser.add_argument('--task-arg', action='append', default=[], metavar='KEY=VALUE',
                        help='task option, e.g. tdof=8 (repeatable; integers and floats parsed)')
    parser.add_argument('--timing-sets', type=positive_int, default=None,
                        help=f'test sets in the timed batch (default: {TIMING_SETS}, or all the '
                             'test sets where there are fewer; at most the test sets)')
    parser.add_argument('--n-test', type=positive_int, default=None,
                        help=f'test sets (default: the budget\'s, or as many as --n-train where '
                             f'that is given; at least {NUM_BINS}, one per uncertainty bin)')
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      'uncertainty'))
    parser.add_argument('--replot', action='store_true',
                        help='rebuild uncertainty.{md,png} in --out from its uncertainty.json '
                             '(trains and measures nothing)')
    add_resume_argument(parser)
    args = parser.parse_args()
    if args.replot:
        path = os.path.join(args.out, 'uncertainty.json')
        try:
            with open(path) as f:
                recorded = json.load(f)
        except FileNotFoundError:
            parser.error(f'argument --replot: no {path}')
        except ValueError as e:
            parser.error(f'argument --replot: {path} is not valid JSON ({e}); restore it or '
                         'run the study again')
        try:
            note = replot(recorded, args.out)
        except (KeyError, ValueError) as e:
            parser.error(f'argument --replot: {path} is not a record of this study ({e!r})')
        if note:
            print(note)
        print(f"rebuilt {args.out}/uncertainty.{{md{'' if note else ',png'}}} from {path}")
        return
    problem = check_out_folder(args.out)  # (before anything runs: a folder it cannot write)
    if problem:
        parser.error(problem)
    budget = choose_budget(args, QUICK, FULL)
    if args.n_train:
        budget = replace(budget, n_val=max(2, args.n_train // 2),
                         n_test=max(NUM_BINS, args.n_train))
    if args.n_test is not None:
        if args.n_test < NUM_BINS:
            parser.error(f'--n-test {args.n_test} is too few: the calibration table has '
                         f'{NUM_BINS} bins of test sets')
        budget = replace(budget, n_test=args.n_test)
    members = args.members if args.members is not None else MEMBERS[
        'quick' if args.quick else 'full']
    passes = args.passes if args.passes is not None else PASSES
    if args.timing_sets is None:
        args.timing_sets = min(TIMING_SETS, budget.n_test)
    elif args.timing_sets > budget.n_test:
        parser.error(f'--timing-sets {args.timing_sets} is more than the {budget.n_test} test '
                     'sets (the timed batch is taken from them)')
    try:
        task_args = parse_key_values(args.task_arg)
    except ValueError as e:
        parser.error(f'--task-arg {e}')
    start = time.time()
    try:  # the task checks its options before generating anything
        task = load_task(args.task, seed=0, n_train=budget.n_train, n_val=budget.n_val,
                         n_test=budget.n_test, **task_args)
    except ValueError as e:
        given = ' '.join([f'--task {args.task}'] + [f'--task-arg {a}' for a in args.task_arg])
        parser.error(f'{given}: {e}')
    try:  # the runs' folder, before the first member trains
        store = RunStore.for_study(args.out, args.resume, args.overwrite)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    # what identifies a study seed's data and methods in the store
    data = dict(task=args.task, options=task_args, seed=0, n_train=budget.n_train,
                n_val=budget.n_val, n_test=budget.n_test)
    # (and the device the methods are timed on: the training settings' identity leaves it out,
    # and a study seed timed on the CPU was read back into a study timed on a GPU)
    options = dict(members=members, passes=passes, timing_sets=args.timing_sets,
                   timed_on=resolve_device(args.device).type)
    with interruptible(__file__, sys.argv[1:], parser, store.folder) as stop:
        runs = [kept_seed(store, data, options, task, s, budget, args.device)
                for s in range(budget.seeds)]
        read_back = sum(r.pop('_read_back', False) for r in runs)  # (measured by another call)
        stop.all_kept()  # (every study seed is kept: a Ctrl-C from here costs only the report)
        report(args, task, runs, members, passes, budget, start, read_back)
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    return None


def kept_seed(store: RunStore, data: dict, options: dict, task, study_seed: int,
              budget: Budget, device: str) -> dict:
    r"""The record of one study seed (:func:`run_seed`): read back from :obj:`store` where a
    call with the same data, members, passes, timed sets, device type and training settings
    finished it (its figures written as null, NaN, read back as NaN; marked ``_read_back``,
    which the caller removes and counts), else run (and kept there)."""
    key = dict(study='uncertainty', data=data, model='mz', options=options, seed=study_seed)
    config = study_config(budget, device=device, seed=study_seed)
    record = store.get(key, config)
    if record is not None:
        run = _nan_figures(record)
        print(f"study seed {study_seed}: read back from {store.folder}"
              + (f" (diverged: {run['diverged']})" if 'diverged' in run else ''), flush=True)
        return dict(run, _read_back=True)
    run = run_seed(task, study_seed, options['members'], options['passes'], budget,
                   options['timing_sets'], device)
    store.put(key, config, run)
    return run


def report(args, task, runs, members, passes, budget, start, read_back: int = 0) -> None:
    r"""Writes the study's record and report (:func:`write_study`) and prints its tables;
    :obj:`read_back`: how many of :obj:`runs` an earlier call measured (named in the report)."""
    scored = [r for r in runs if 'diverged' not in r]  # (a member diverged: left out)
    summary = summarize(scored) if scored else {}
    minutes = (time.time() - start) / 60
    params = count_parameters(build_model('mz', task.in_channels, task.out_channels))
    setup = dict(task=args.task, model='mz', params=params,
                 study_seeds=budget.seeds, ensemble_members=members, mc_passes=passes,
                 n_train=budget.n_train, n_val=budget.n_val, n_test=budget.n_test,
                 epochs=budget.epochs, lr=budget.lr, batch_size=64,
                 timing_sets=args.timing_sets, device=args.device, task_params=task.info)
    lines = verdicts(scored, summary, passes, members) if scored else []
    note = write_study(args.out, dict(environment=environment(), setup=setup, summary=summary,
                                      runs=runs, verdicts=lines, minutes=minutes,
                                      target_std=target_std_of(task),
                                      **({'read_back': read_back} if read_back else {})))
    if note:
        print(note)
    if scored:
        t = tables(scored, summary)
        print(t['t20'])
        print(t['t21'])
    if left_out(runs):
        print(left_out(runs).rstrip())
    for line in lines:
        print('-', line)
    print(f"{minutes:.1f} min; wrote {args.out}/uncertainty.json, .md{'' if note else ', .png'}")


if __name__ == '__main__':
    sys.exit(main())
