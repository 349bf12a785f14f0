r"""What the rotation-matching sweep's models reach, against features a model can compute.

Table 4's learning-rate sweep (``python benchmarks/reproduce.py --budget converged --claims
table4``) trains every model on the un-aligned rotation-matching target (Task F,
:math:`\mathrm{CD}(A, B)`, :math:`d = 8`, 5,000 / 1,000 / 2,000 sets, seed 0). Its figures
group: at lr 3e-4 several models stop near R^2 0.5, the attention models' best points lie near
0.75, Deep Sets near 0.82. This script, on the same draws, measures:

* how much of the target least-squares fits on per-cloud moments explain on the test split
  (linear, and with squares, products and cubes), grouped by whether the fit sees the set size
  :math:`n`: the clouds' mean squared norms alone; every moment without :math:`n` (mean squared
  and fourth-power norms, squared norm of each cloud's mean, the product of the two means, the
  largest and smallest squared norms); :math:`n` alone; and the same with :math:`n`;
* which models compute a function of the set's empirical distribution: each model (untrained,
  seed 0, float64, eval mode) on a set and on the set with every element repeated twice (a
  softmax-pooled model gives the same output; a sum-pooled one need not); the target too;
* from the sweep's run records (read, not trained): each model's chosen point (lowest
  validation loss) and its runs at lr 3e-4, with their test R^2.

    python benchmarks/rotation_matching_features.py           # ~1 min on 1 thread, trains nothing
    python benchmarks/rotation_matching_features.py --quick   # smoke run, 200 training sets

Writes ``benchmarks/results/rotation_matching/features.json``, ``features.md`` and, where
matplotlib is installed, ``features.png``.
"""
import argparse
import glob
import math
import os
import shlex
import time

import numpy as np
import torch

from torch_mz.models import build_model
from torch_mz.models.base import set_features
from torch_mz.reproduce.budgets import BUDGETS
from torch_mz.reproduce.claims import SWEEP_CELLS
from torch_mz.reproduce.store import read_record
from torch_mz import geometry
from torch_mz.study import (environment, markdown_table, positive_int, pyplot, replace_plot,
                            write_report)
from torch_mz.study.plots import save_figure
from torch_mz.tasks import load_task
from torch_mz.study.report import check_out_folder

HERE = os.path.dirname(os.path.abspath(__file__))
CELL = SWEEP_CELLS['rotation-matching']
RECORDS = os.path.join(HERE, 'results', 'reproduction', 'records', 'converged',
                       'rotation-matching')
PLATEAU_LR = 3e-4
# Moments of one cloud (A or B); with both clouds' and the set size, the features below.
NO_SIZE = ('msq A', 'msq B', 'm4 A', 'm4 B', 'mean A', 'mean B', 'means dot', 'max A', 'max B',
           'min A', 'min B')
GROUPS = {  # label -> (features, sees the set size)
    'mean squared norms of A and B': (('msq A', 'msq B'), False),
    'every moment, no set size': (NO_SIZE, False),
    'set size n alone': (('n', ), True),
    'mean squared norms and n': (('n', 'msq A', 'msq B'), True),
    'every moment and n': (('n', ) + NO_SIZE, True),
}


def r2(pred, y):
    r"""Coefficient of determination of :obj:`pred` for :obj:`y` (both 1-D)."""
    return float(1.0 - np.mean((y - pred) ** 2) / np.var(y))


def clouds(data):
    r"""The clouds A and B of a packed two-cloud set (indicator in the last column), float64."""
    x = set_features(data).double()
    flag = x[:, -1]
    return x[flag == 0, :-1], x[flag == 1, :-1]


def moments(a, b):
    r"""The named features of one set (clouds :obj:`a`, :obj:`b` of shape ``(n, d)``)."""
    feats = {'n': float(len(a))}
    for name, p in (('A', a), ('B', b)):
        sq = (p ** 2).sum(1)
        feats.update({f'msq {name}': float(sq.mean()), f'm4 {name}': float((sq ** 2).mean()),
                      f'mean {name}': float((p.mean(0) ** 2).sum()),
                      f'max {name}': float(sq.max()), f'min {name}': float(sq.min())})
    feats['means dot'] = float(a.mean(0) @ b.mean(0))
    return feats


def split_features(dataset):
    r"""Targets ``(N,)`` and a list of feature dicts of a dataset's sets."""
    y, feats = [], []
    for data in dataset:
        y.append(float(data.y.reshape(-1)[0]))
        feats.append(moments(*clouds(data)))
    return np.array(y), feats


def design(feats, names, degree):
    r"""The columns of a fit: the features (degree 1), with their squares, pairwise products
    and cubes (degree 3)."""
    x = np.array([[f[k] for k in names] for f in feats])
    if degree == 1:
        return x
    cols = [x] + [x[:, [i]] * x[:, i:] for i in range(x.shape[1])] + [x ** 3]
    return np.concatenate(cols, 1)


def fit_r2(train, test, names, degree):
    r"""Test R^2 of a least-squares fit on :obj:`names` (standardised on the training split)."""
    (y_tr, f_tr), (y_te, f_te) = train, test
    x_tr, x_te = design(f_tr, names, degree), design(f_te, names, degree)
    mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-12

    def with_bias(x):
        return np.concatenate([np.ones((len(x), 1)), (x - mu) / sd], 1)

    coef = np.linalg.lstsq(with_bias(x_tr), y_tr, rcond=None)[0]
    return r2(with_bias(x_te) @ coef, y_te)


def replicated(data):
    r"""A copy of :obj:`data` whose every element appears twice."""
    copy = data.clone()
    for key in ('x', 'pos'):
        if getattr(copy, key, None) is not None:
            setattr(copy, key, torch.cat([getattr(copy, key)] * 2))
    return copy


def replication_gap(models, task, sets):
    r"""Largest ``|f(X) - f(X with every element twice)|`` over :obj:`sets`, for each model
    (seed 0, untrained, float64, eval mode) and for the target (``'target'``)."""
    from torch_geometric.data import Batch

    def as_batch(items):
        batch = Batch.from_data_list(items)
        for key in ('x', 'pos'):
            if getattr(batch, key, None) is not None:
                setattr(batch, key, getattr(batch, key).double())
        return batch

    gaps = {}
    once, twice = as_batch(sets), as_batch([replicated(s) for s in sets])
    for name in models:
        torch.manual_seed(0)
        model = build_model(name, task.in_channels, task.out_channels,
                            pos_dim=task.pos_dim).double().eval()
        with torch.no_grad():
            out = [model(b) for b in (once, twice)]
        out = [o[0] if isinstance(o, tuple) else o for o in out]
        gaps[name] = float((out[0] - out[1]).abs().max() / out[0].abs().max().clamp_min(1e-300))
    target = [abs(geometry.chamfer_distance(*clouds(s)) -
                  geometry.chamfer_distance(*clouds(replicated(s)))) for s in sets]
    gaps['target'] = float(max(float(t) for t in target))
    return gaps


def sweep_points(records):
    r"""Per model, its chosen sweep point (lowest best validation loss) and its runs at lr
    3e-4, from the run records in :obj:`records` on :data:`CELL` (seed 0). A diverged run's
    record (no validation or test figures) is a point of validation loss inf, as the sweep
    reads it (never chosen unless all are), and test R² NaN."""
    out = {}
    for path in sorted(glob.glob(os.path.join(records, '*', '*.json'))):
        rec = read_record(path)
        key = rec.get('key', {})
        if rec.get('cell') != CELL['label'] or rec.get('seed') != 0:
            continue
        if any(key.get('kwargs', {}).get(k) != v for k, v in CELL['kwargs'].items()):
            continue
        config = key['config']
        point = dict(lr=config['lr'], wd=config['weight_decay'],
                     val_loss=float(rec['val'].get('loss', math.inf)),
                     test_r2=float(rec['test'].get('r2', math.nan)),
                     best_epoch=rec.get('best_epoch'))
        entry = out.setdefault(rec['model'], dict(points=[]))
        entry['points'].append(point)
    for entry in out.values():
        entry['chosen'] = min(entry['points'], key=lambda p: p['val_loss'])
        entry['plateau'] = [p for p in entry['points'] if np.isclose(p['lr'], PLATEAU_LR)]
    return out


def plot(path, fits, sweep):
    r"""The cubic fits' test R² as bars, each model's chosen point and lr-3e-4 runs as marks, on
    an axis from 0 (or below the lowest R² drawn, where one is negative) to 1."""
    plt = pyplot()
    labels = list(fits)
    fig, ax = plt.subplots(figsize=(8, 0.45 * (len(labels) + len(sweep)) + 1.2))
    for i, label in enumerate(labels):
        ax.barh(i, fits[label]['cubic'], color='tab:orange' if GROUPS[label][1] else 'tab:blue')
        ax.text(fits[label]['cubic'] + 0.01, i, f"{fits[label]['cubic']:.3f}", va='center')
    for j, (model, entry) in enumerate(sorted(sweep.items()), start=len(labels)):
        ax.plot(entry['chosen']['test_r2'], j, 'ko')
        for p in entry['plateau']:
            ax.plot(p['test_r2'], j, 'kx')
    names = labels + [f'{m} (sweep run)' for m in sorted(sweep)]
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    drawn = [f['cubic'] for f in fits.values()] + [
        p['test_r2'] for e in sweep.values() for p in [e['chosen']] + e['plateau']]
    low = min([0.0] + [v for v in drawn if math.isfinite(v)])  # (a negative R² was cut off)
    ax.set_xlim(low - 0.05 * (1.0 - low) if low < 0 else 0.0, 1.0)
    if low < 0:
        ax.axvline(0.0, color='black', linewidth=0.8)
    ax.set_xlabel('test R^2: bars, cubic fits on moments (orange: with the set size n); '
                  'o, a model\'s chosen point; x, its runs at lr 3e-4', fontsize=8)
    ax.set_title('Rotation matching, un-aligned, d = 8', fontsize=10)
    save_figure(fig, path, dpi=100, bbox_inches='tight')  # (atomically)
    plt.close(fig)


NOTES = """
Columns: `linear` and `cubic` are the test R^2 of least-squares fits on the named per-set
features (cubic: with their squares, pairwise products and cubes), fitted on the training split.
`msq` is a cloud's mean squared norm, `m4` the mean fourth power of the norm, `mean` the squared
norm of its mean, `max` / `min` its largest and smallest squared norm.

Sweep records read: {records} ({n_models} models; chosen point = lowest best validation loss, as
the sweep chooses). Replication gap: the largest relative change of an untrained model's output
(seed 0, float64, eval mode) when every element of {n_sets} test sets appears twice;
{invariant} give the same output to {worst_invariant:.1e} (functions of the set's empirical
distribution: softmax pooling averages), {counting} change (sum pooling: they count). The
target does not change either ({target_gap:.1e}): a mean of nearest-neighbour distances.

Reading (cubic fits): without the set size, the two mean squared norms explain {msq:.3f} of the
target and every moment {nosize:.3f}; with it, {msq_n:.3f} and {all_n:.3f}. The models whose
output a replicated set leaves unchanged end at {plateau_lo:.3f}-{plateau_hi:.3f} in their
lr-3e-4 runs and at {chosen_lo:.3f}-{chosen_hi:.3f} at their chosen points; the models that
count at {counting_chosen}. The figures line up with the fits, but that is a comparison of
numbers, not a proof of what each model computes: the target is itself a function of the
empirical distribution, so a model that cannot count can still infer n from the sample (n
distinct points), only not by pooling.
"""


def notes(fits, sweep, gaps, records, n_sets):
    invariant = sorted(m for m, g in gaps.items() if m != 'target' and g < 1e-9)
    counting = sorted(m for m, g in gaps.items() if m != 'target' and g >= 1e-9)
    inv_sweep = [sweep[m] for m in invariant if m in sweep]
    # (a diverged run's R² is NaN: left out of the ranges, which min / max gave by order)
    plateau = [p['test_r2'] for e in inv_sweep for p in e['plateau']
               if not math.isnan(p['test_r2'])] or [math.nan]
    chosen = [e['chosen']['test_r2'] for e in inv_sweep
              if not math.isnan(e['chosen']['test_r2'])] or [math.nan]
    counting_chosen = ', '.join(f"{m} {sweep[m]['chosen']['test_r2']:.3f}"
                                for m in counting if m in sweep) or 'none in the records'
    return NOTES.format(
        records=os.path.relpath(records, os.path.dirname(HERE)), n_models=len(sweep),
        n_sets=n_sets, invariant=', '.join(invariant) or 'none',
        worst_invariant=max([gaps[m] for m in invariant], default=float('nan')),
        counting=', '.join(counting) or 'none', target_gap=gaps['target'],
        msq=fits['mean squared norms of A and B']['cubic'],
        nosize=fits['every moment, no set size']['cubic'],
        msq_n=fits['mean squared norms and n']['cubic'],
        all_n=fits['every moment and n']['cubic'],
        plateau_lo=min(plateau), plateau_hi=max(plateau), chosen_lo=min(chosen),
        chosen_hi=max(chosen), counting_chosen=counting_chosen)


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    parser.add_argument('--quick', action='store_true', help='smoke run: 200 training sets')
    parser.add_argument('--n-train', type=positive_int, default=None)
    parser.add_argument('--records', default=RECORDS,
                        help="the sweep's run records (a folder of <model>/<run>.json)")
    parser.add_argument('--replication-sets', type=positive_int, default=16)
    parser.add_argument('--out', default=os.path.join(HERE, 'results', 'rotation_matching'))
    args = parser.parse_args(argv)
    problem = check_out_folder(args.out)  # (before anything runs: a folder it cannot write)
    if problem:
        parser.error(problem)
    if not os.path.isdir(args.records):
        parser.error(f'--records {args.records!r} is not a folder')
    torch.set_num_threads(1)
    start = time.time()
    budget = BUDGETS['converged']
    n_train = args.n_train or (200 if args.quick else budget.n_train)
    n_val, n_test = ((budget.n_val, budget.n_test) if n_train == budget.n_train
                     else (max(1, n_train // 5), max(2, 2 * n_train // 5)))
    sweep = sweep_points(args.records)
    task = load_task(CELL['task'], seed=0, n_train=n_train, n_val=n_val, n_test=n_test,
                     **CELL['kwargs'])
    train, test = split_features(task.train), split_features(task.test)
    fits = {label: dict(features=list(names), sees_set_size=sees,
                        linear=fit_r2(train, test, names, 1), cubic=fit_r2(train, test, names, 3))
            for label, (names, sees) in GROUPS.items()}
    sets = [task.test[i] for i in range(min(args.replication_sets, len(task.test)))]
    models = sorted(set(sweep) | {'mz', 'rigid', 'st-large', 'deepsets', 'egnn'})
    gaps = replication_gap(models, task, sets)
    rows = [dict(fit=label, sees_n='yes' if f['sees_set_size'] else 'no', linear=f['linear'],
                 cubic=f['cubic']) for label, f in fits.items()]
    table = markdown_table(rows, ['fit', 'sees_n', 'linear', 'cubic'])
    model_rows = [dict(model=m, replication_gap=gaps[m],
                       chosen_r2=sweep.get(m, {}).get('chosen', {}).get('test_r2'),
                       chosen_lr=sweep.get(m, {}).get('chosen', {}).get('lr'),
                       chosen_wd=sweep.get(m, {}).get('chosen', {}).get('wd'),
                       lr_3e4_r2=', '.join(f"{p['test_r2']:.4f}"
                                           for p in sweep.get(m, {}).get('plateau', [])))
                  for m in models]
    table += '\n' + markdown_table(model_rows, ['model', 'replication_gap', 'chosen_r2',
                                                'chosen_lr', 'chosen_wd', 'lr_3e4_r2'])
    minutes = (time.time() - start) / 60
    setup = dict(n_train=n_train, n_val=n_val, n_test=n_test, data_seed=0, **CELL['kwargs'],
                 replication_sets=len(sets))
    text = notes(fits, sweep, gaps, args.records, len(sets))
    env = environment()
    if argv is not None:  # (called from Python: the arguments given, not the caller's)
        env['command'] = shlex.join(['python', 'benchmarks/rotation_matching_features.py']
                                    + list(argv))
    png = os.path.join(args.out, 'features.png')  # (first: the report links it where drawn)
    note = replace_plot(png, plot, png, fits, sweep)
    write_report(args.out, 'features', 'Rotation matching (un-aligned, d = 8): what the sweep\'s '
                 'models reach against per-set moments', env, setup, table,
                 dict(fits=fits, replication_gap=gaps, sweep=sweep), minutes, notes=text,
                 plot=note is None)
    print(table + text)
    if note:
        print(note)
    print(f"wrote {args.out}/features.json, features.md{'' if note else ', features.png'}")


if __name__ == '__main__':
    main()
