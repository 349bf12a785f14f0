r"""Equivariance versus context-adaptivity (Table 7 of the MZAttn paper).

``mz``, ``st-large`` and ``egnn`` are trained with the same data, budget, schedule and target
normalisation on rotation- and translation-invariant targets (rotation matching, convex-hull
volume, MEB radius, the statistical targets covariance norm / Mahalanobis distance / PCA error)
and on the fixed-frame quadratic-TDOF target. The paper's claim: EGNN wins every invariant
target, MZAttn wins the quadratic-TDOF target where an invariant model collapses to R^2 ~ 0.

    python benchmarks/equivariance.py --quick      # 8 cells, 2 seeds, small data (~40 min, 1 thread)
    python benchmarks/equivariance.py              # all 13 cells of Table 7, 3 seeds

The quadratic-TDOF target uses d = 16 (as the demo and the set-size study); the paper does not
give Table 7's d.
A cell's ``winner`` is the model with the highest mean R², or a tie when the lead is within
twice the seed spread (see :func:`verdict`). The statistical targets' input distribution and exact statistics are this
package's choice (see :class:`torch_mz.datasets.synthetic.CorrelatedGaussianTask`).
"""
import argparse
import os
import sys
import time

from torch_mz.paper import TABLE7, TABLE7_CELLS
from torch_mz.study import (EXIT_INTERRUPTED, SPREAD_NOTE, RunStore, check_grid, choice_list,
                            environment, interruptible, markdown_table, plot_grid,
                            replace_plot, run_grid, split_model_specs, write_report)
from torch_mz.study.budget import (Budget, add_budget_arguments, add_resume_argument,
                                   choose_budget, study_config)
from torch_mz.study.statistics import winner

MODELS = ('mz', 'st-large', 'egnn')

# label -> (task, task arguments); the order of Table 7.
CELLS = {
    'rot d=8': ('rotation-matching', dict(d=8)),
    'rot d=32': ('rotation-matching', dict(d=32)),
    'rot d=64': ('rotation-matching', dict(d=64)),
    'hull d=3': ('hull-volume', dict(d=3)),
    'hull d=9': ('hull-volume', dict(d=9)),
    'MEB d=8': ('meb-radius', dict(d=8)),
    'MEB d=32': ('meb-radius', dict(d=32)),
    'CN d=8': ('covariance-norm', dict(d=8)),
    'Mah d=8': ('mahalanobis', dict(d=8)),
    'PCA d=16': ('pca-error', dict(d=16)),
    'quad L=4': ('quadratic-tdof', dict(d=16, tdof=4)),
    'quad L=8': ('quadratic-tdof', dict(d=16, tdof=8)),
    'quad L=16': ('quadratic-tdof', dict(d=16, tdof=16)),
}
QUICK_CELLS = ('rot d=8', 'hull d=3', 'MEB d=8', 'CN d=8', 'Mah d=8', 'PCA d=16', 'quad L=4',
               'quad L=8')
QUICK = Budget(seeds=2, n_train=640, epochs=10, lr=1e-3)
FULL = Budget(seeds=3, n_train=5000, epochs=100, lr=1e-4)

# Table 7 of the paper: R^2 per (cell, model).
PAPER = {(cell, model): values[i] for model, values in TABLE7.items()
         for i, cell in enumerate(TABLE7_CELLS)}


def verdict(row, seeds: int = 2):
    r"""The cell's measured winner and the paper's. The measured winner is the model with the
    highest mean R², or ``'tie: a/b'`` (all models within the lead) when the lead over the
    runner-up is under twice the larger of their seed standard deviations; with one seed
    (no spread to weigh the lead against) the highest, marked ``'(one seed)'``."""
    tied = winner({m: row[f'{m} r2'] for m in MODELS},
                  {m: row.get(f'{m} r2 std', 0.0) for m in MODELS})
    ours = tied[0] if len(tied) == 1 else 'tie: ' + '/'.join(tied)
    if seeds < 2:
        ours = tied[0] + ' (one seed)'
    return ours, winner({m: PAPER[(row['cell'], m)] for m in MODELS})[0]


def agrees(ours, paper):
    r"""Whether a measured winner (or tie) includes the paper's winner."""
    ours = ours.removesuffix(' (one seed)')
    return ours == paper or (ours.startswith('tie: ') and paper in ours[5:].split('/'))


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    add_budget_arguments(parser, quick_help='8 cells, 2 seeds, small budget')
    parser.add_argument('--cells', type=choice_list(tuple(CELLS)), default=None,
                        help=f"comma-separated subset of: {', '.join(CELLS)}")
    parser.add_argument('--models', default=','.join(MODELS))
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      'equivariance'))
    add_resume_argument(parser)
    args = parser.parse_args()
    budget = choose_budget(args, QUICK, FULL)
    cells = QUICK_CELLS if args.quick else tuple(CELLS)
    if args.cells:
        cells = args.cells
    models = split_model_specs(args.models)
    if not models:  # (it wrote a report with no model in it)
        parser.error('--models names no model')
    seeds, epochs, lr = budget.seeds, budget.epochs, budget.lr
    n_train, n_val, n_test = budget.split_sizes()
    config = study_config(budget, device=args.device)
    grid = [dict(label=c, task=CELLS[c][0],
                 kwargs=dict(CELLS[c][1], n_train=n_train, n_val=n_val, n_test=n_test))
            for c in cells]
    try:  # every cell and model, and the runs' folder, before the first run trains
        check_grid(grid, models)
        store = RunStore.for_study(args.out, args.resume, args.overwrite)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    start = time.time()

    def report(run):
        print(f"{run['cell']:10s} {run['model']:9s} seed {run['seed']}: test r2 "
              f"{run['test']['r2']:.4f} ({run['wall_time_s'] / 60:.1f} min)", flush=True)

    with interruptible(__file__, sys.argv[1:], parser, store.folder) as stop:
        runs, rows = run_grid(grid, models, seeds, config, on_result=report,
                              store=store, check=False, record_diverged=True)
        stop.all_kept()  # (every run is kept: a Ctrl-C from here costs only the report)
        for row in rows:
            for m in models:
                row[f'paper {m}'] = PAPER.get((row['cell'], m))
            if set(models) == set(MODELS):
                row['winner'], row['paper winner'] = verdict(row, seeds)
        env = environment()
        params = {m: rows[0][f'{m} params'] for m in models} if rows else {}
        setup = dict(seeds=seeds, n_train=n_train, n_val=n_val, n_test=n_test, epochs=epochs,
                     lr=lr, batch_size=64, params_first_cell=params)
        columns = ['cell'] + [c for m in models for c in (f'{m} r2', f'{m} r2 std')]
        columns += [f'paper {m}' for m in models]
        if set(models) == set(MODELS):
            columns += ['winner', 'paper winner']
        table = markdown_table(rows, columns)
        notes = ''
        if set(models) == set(MODELS):
            same = [r['cell'] for r in rows if agrees(r['winner'], r['paper winner'])]
            differ = [f"{r['cell']} ({r['winner']}; paper: {r['paper winner']})" for r in rows
                      if not agrees(r['winner'], r['paper winner'])]
            notes = (f"The best model of a cell (or a tie within twice the seed spread that "
                     f"includes the paper's best) is the paper's on {len(same)} of {len(rows)} "
                     f"cells"
                     + (f"; it differs on {', '.join(differ)}." if differ else '.'))
        # (the plot first: the report links it where drawn)
        png = os.path.join(args.out, 'equivariance.png')
        note = replace_plot(png, plot_grid, rows, models, png, paper=PAPER,
                            title='Table 7: test R² (bars: measured; ticks: paper)')
        write_report(args.out, 'equivariance',
                     'Equivariance versus context-adaptivity (paper Table 7)', env, setup,
                     f'{table}\n{SPREAD_NOTE}\n',
                     dict(cells={c: CELLS[c] for c in cells}, rows=rows, runs=runs),
                     (time.time() - start) / 60, notes=notes,
                     plot=note is None,
                     run_minutes=sum(r['wall_time_s'] for r in runs) / 60 if args.resume else None)
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if note:
        print(note)
    print(table)
    print(f"wrote {args.out}/equivariance.json, .md{'' if note else ', .png'}")


if __name__ == '__main__':
    sys.exit(main())
