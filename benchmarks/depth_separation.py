r"""Depth separation on the quadratic-TDOF target (Table 1 of the MZAttn paper).

For each TDOF L, a one-layer MZ-Set Transformer (``mz-1l``) and a four-layer standard Set
Transformer (``st-4l``) are trained with the same data, budget, schedule and target
normalisation; the table reports test R^2 (mean ± std over seeds) and the residual-MSE ratio
MSE(st-4l) / MSE(mz-1l), next to the paper's numbers.

    python benchmarks/depth_separation.py --quick      # L in {4, 8, 16, 24, 32}, 2 seeds, small data
    python benchmarks/depth_separation.py              # L in {4, 8, 16, 24, 32}, 3 seeds
"""
import argparse
import os
import sys
import time

import numpy as np

from torch_mz.paper import TABLE1
from torch_mz.study import (EXIT_INTERRUPTED, SPREAD_NOTE, RunStore, check_grid, environment,
                            int_list, interruptible, markdown_table, positive_int, pyplot,
                            replace_plot, run_grid, write_report)
from torch_mz.study.plots import save_figure
from torch_mz.study.budget import (Budget, add_budget_arguments, add_resume_argument,
                                   choose_budget, study_config)

# Table 1 of the paper: L -> (MZAttn-1L R^2, ST-4L R^2, MSE ratio)
PAPER = TABLE1
MODELS = ('mz-1l', 'st-4l')
TDOF = [4, 8, 16, 24, 32]
QUICK = Budget(seeds=2, n_train=640, epochs=10, lr=1e-3)
FULL = Budget(seeds=3, n_train=5000, epochs=100, lr=1e-4)


def plot(rows, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    Ls = [r['L'] for r in rows]
    for model, color in zip(MODELS, ('tab:red', 'tab:blue')):
        ax.errorbar(Ls, [r[f'{model} r2'] for r in rows], yerr=[r[f'{model} r2 std'] for r in rows],
                    marker='o', color=color, capsize=3, label=f'{model} (measured)')
        paper = [L for L in Ls if L in PAPER]
        if paper:
            ax.plot(paper, [PAPER[L][MODELS.index(model)] for L in paper], linestyle='--',
                    color=color, alpha=0.6, label=f'{model} (paper)')
    ax.set_xlabel('TDOF L of the target')
    ax.set_ylabel('test R²')
    ax.set_xticks(Ls)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    add_budget_arguments(parser, quick_help='2 seeds, small budget')
    parser.add_argument('--tdof', type=int_list(low=1), default=None,
                        help='comma-separated L values')
    parser.add_argument('--d', type=positive_int, default=32,
                        help='dimension of the elements (the task default; must be >= every L)')
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      'depth_separation'))
    add_resume_argument(parser)
    args = parser.parse_args()
    budget = choose_budget(args, QUICK, FULL)
    Ls = args.tdof or TDOF
    if max(Ls) > args.d:
        parser.error(f'every L must be at most --d ({args.d}), got L = {max(Ls)}')
    seeds, epochs, lr = budget.seeds, budget.epochs, budget.lr
    n_train, n_val, n_test = budget.split_sizes()
    config = study_config(budget, device=args.device)
    grid = [dict(label=f'L={L}', task='quadratic-tdof',
                 kwargs=dict(d=args.d, tdof=L, n_train=n_train, n_val=n_val, n_test=n_test))
            for L in Ls]
    try:  # every cell and model, and the runs' folder, before the first run trains
        check_grid(grid, MODELS)
        store = RunStore.for_study(args.out, args.resume, args.overwrite)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    start = time.time()

    def report(run):
        print(f"{run['cell']:5s} {run['model']:6s} seed {run['seed']}: test r2 "
              f"{run['test']['r2']:.4f}", flush=True)

    with interruptible(__file__, sys.argv[1:], parser, store.folder) as stop:
        runs, rows = run_grid(grid, MODELS, seeds, config, on_result=report,
                              store=store, check=False, record_diverged=True)
        stop.all_kept()  # (every run is kept: a Ctrl-C from here costs only the report)
        for L, row in zip(Ls, rows):
            row['L'] = L
            row['MSE ratio'] = row['st-4l mse'] / row['mz-1l mse']
            if L in PAPER:
                row['paper mz-1l r2'], row['paper st-4l r2'], row['paper MSE ratio'] = PAPER[L]
        setup = dict(d=args.d, seeds=seeds, n_train=n_train, n_val=n_val, n_test=n_test,
                     epochs=epochs, lr=lr, batch_size=64)
        columns = ['L', 'mz-1l r2', 'mz-1l r2 std', 'st-4l r2', 'st-4l r2 std', 'MSE ratio',
                   'paper mz-1l r2', 'paper st-4l r2', 'paper MSE ratio']
        table = markdown_table(rows, columns)
        ahead = [row['L'] for row in rows if row['mz-1l r2'] > row['st-4l r2']]
        clear = [row['L'] for row in rows if row['mz-1l r2'] - row['st-4l r2']
                 > 2 * max(row['mz-1l r2 std'], row['st-4l r2 std'])]
        spread = (f"by more than twice the seed spread at L = {clear or 'none'}" if seeds > 1 else
                  "with one seed, so no seed spread to weigh the lead against")
        notes = (f"mz-1l has the higher mean R² at L = {ahead or 'none'} (the paper: at every L), "
                 f"{spread}; MSE ratios "
                 f"{np.nanmin([r['MSE ratio'] for r in rows]):.2f}-"
                 f"{np.nanmax([r['MSE ratio'] for r in rows]):.2f} against the paper's 6.5-15.4.")
        diverged = [f"{m} at L = {row['L']} ({row[f'{m} diverged']} of {seeds})" for row in rows
                    for m in MODELS if row.get(f'{m} diverged')]
        if diverged:  # (their means are over the other seeds; NaN where every seed diverged)
            notes += f" Runs that diverged: {', '.join(diverged)}."
        png = os.path.join(args.out, 'depth_separation.png')
        note = replace_plot(png, plot, rows, png)  # (first: the report links it where drawn)
        write_report(args.out, 'depth_separation',
                     'Depth separation on the quadratic-TDOF target (paper Table 1)', environment(),
                     setup, f'{table}\n{SPREAD_NOTE}\n', dict(rows=rows, runs=runs),
                     (time.time() - start) / 60,
                     notes=notes, plot=note is None,
                     run_minutes=sum(r['wall_time_s'] for r in runs) / 60 if args.resume else None)
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if note:
        print(note)
    print(table)
    print(f"wrote {args.out}/depth_separation.json, .md{'' if note else ', .png'}")


if __name__ == '__main__':
    sys.exit(main())
