r"""Computational geometry across dimensions (Tables 3, 4, 5, 17 and 18 of the MZAttn paper).

MEB radius, rotation matching, MST weight and convex-hull volume, each at several point
dimensions d, for ``mz`` and the baselines (``rigid``, the paper's "Standard", and ``film`` at
the paper's widths, about two thirds and four fifths of ``mz``'s parameters; ``st-large``, ``hypernet`` and
``perceiver`` matched to ``mz``'s count), all trained with the same data,
budget, schedule and target normalisation. The paper's numbers shown next to ours are its Table 3
(MEB), Table 4 (rotation matching), and its target-normalised Tables 17 (MST) and 18 (hull): our
trainer always normalises targets, so those are the comparable ones. The HyperNet rank sweep of
Table 5 is available as extra model specs, e.g. ``--models hypernet:rank=16,hypernet:rank=64``
(a spec's options override the preset; the paper's r = 64 model is not parameter-matched, add
``dim=64`` to keep the width of ``rigid``).

    python benchmarks/geometry.py --quick     # 9 cells x 6 models, 2 seeds, small data (~25 min, 1 thread)
    python benchmarks/geometry.py             # all cells of Tables 3/4/17/18, 3 seeds

Not reproduced: the paper's LA-ST (linear attention), Mamba + PMA and mean-pool rows, which are
not models of this package.
"""
import argparse
import os
import sys
import time

from torch_mz.paper import GEOMETRY, GEOMETRY_MODELS
from torch_mz.study import (EXIT_INTERRUPTED, SPREAD_NOTE, RunStore, check_grid, choice_list,
                            environment, int_list, interruptible, markdown_table, plot_grid,
                            replace_plot, run_grid, split_model_specs, write_report)
from torch_mz.study.budget import (Budget, add_budget_arguments, add_resume_argument,
                                   choose_budget, study_config)
from torch_mz.study.statistics import lead_over_best, winner

MODELS = ('rigid', 'st-large', 'hypernet', 'perceiver', 'film', 'mz')
TASKS = {'MEB': 'meb-radius', 'rot': 'rotation-matching', 'MST': 'mst', 'hull': 'hull-volume'}
DIMS = {'MEB': (8, 16, 32), 'rot': (16, 32, 64, 128, 256), 'MST': (16, 32, 64, 128, 256),
        'hull': (3, 6, 9)}
QUICK_DIMS = {'MEB': (8, 16, 32), 'rot': (16, 32), 'MST': (16, 32), 'hull': (3, 6)}
QUICK = Budget(seeds=2, n_train=640, epochs=10, lr=1e-3)
FULL = Budget(seeds=3, n_train=5000, epochs=100, lr=1e-4)

# The paper's R^2 per (task, d) for GEOMETRY_MODELS (Tables 3, 4, 17, 18; rotation matching at
# d = 8: Table 2's Task F).
PAPER = {(f'{task} d={d}', model): value for (task, d), values in GEOMETRY.items()
         for model, value in zip(GEOMETRY_MODELS, values)}


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    add_budget_arguments(parser, quick_help='9 cells, 2 seeds, small budget')
    parser.add_argument('--tasks', type=choice_list(tuple(TASKS)), default=','.join(TASKS),
                        help=f"comma-separated subset of {', '.join(TASKS)}")
    parser.add_argument('--dims', type=int_list(low=1), default=None,
                        help='comma-separated dimensions (default: per task, see DIMS)')
    parser.add_argument('--models', default=','.join(MODELS))
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      'geometry'))
    add_resume_argument(parser)
    args = parser.parse_args()
    budget = choose_budget(args, QUICK, FULL)
    dims = QUICK_DIMS if args.quick else DIMS
    tasks = args.tasks
    if args.dims:
        dims = {t: tuple(args.dims) for t in tasks}
    models = split_model_specs(args.models)
    if not models:  # (it failed once the empty grid had run, with no result written)
        parser.error('--models names no model')
    seeds, epochs, lr = budget.seeds, budget.epochs, budget.lr
    n_train, n_val, n_test = budget.split_sizes()
    config = study_config(budget, device=args.device)
    grid = [dict(label=f'{t} d={d}', task=TASKS[t],
                 kwargs=dict(d=d, n_train=n_train, n_val=n_val, n_test=n_test))
            for t in tasks for d in dims[t]]
    try:  # every cell and model, and the runs' folder, before the first run trains
        check_grid(grid, models)
        store = RunStore.for_study(args.out, args.resume, args.overwrite)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    start = time.time()

    def report(run):
        print(f"{run['cell']:11s} {run['model']:10s} seed {run['seed']}: test r2 "
              f"{run['test']['r2']:.4f} ({run['wall_time_s'] / 60:.1f} min)", flush=True)

    with interruptible(__file__, sys.argv[1:], parser, store.folder) as stop:
        runs, rows = run_grid(grid, models, seeds, config, on_result=report,
                              store=store, check=False, record_diverged=True)
        stop.all_kept()  # (every run is kept: a Ctrl-C from here costs only the report)
        for row in rows:
            for m in models:
                row[f'paper {m}'] = PAPER.get((row['cell'], m))
            ours = winner({m: row[f'{m} r2'] for m in models})[0]  # (a NaN, all diverged, last)
            row['best'] = ours
            rivals = [m for m in models if not m.startswith('mz')]
            lead = lead_over_best({m: row[f'{m} r2'] for m in models}, 'mz', rivals)
            if lead is not None:
                row['mz - best baseline'] = lead.gap
                paper = lead_over_best({m: PAPER[(row['cell'], m)] for m in models
                                        if (row['cell'], m) in PAPER}, 'mz', rivals)
                if paper is not None:
                    row['paper mz - best baseline'] = paper.gap
        env = environment()
        params = {m: rows[0][f'{m} params'] for m in models} if rows else {}
        setup = dict(seeds=seeds, n_train=n_train, n_val=n_val, n_test=n_test, epochs=epochs, lr=lr,
                     batch_size=64, params_first_cell=params)
        columns = ['cell'] + [f'{m} r2' for m in models] + ['best', 'mz - best baseline',
                                                          'paper mz - best baseline']
        table = markdown_table(rows, columns)
        paper_cols = ['cell'] + [f'paper {m}' for m in models if any(f'paper {m}' in r and
                                                                     r[f'paper {m}'] is not None
                                                                     for r in rows)]
        notes = ('Spread over seeds (std of test R²):\n\n'
                 + markdown_table(rows, ['cell'] + [f'{m} r2 std' for m in models])
                 + f'\n{SPREAD_NOTE}\n\n'
                 + 'The paper\'s R² for the same cells (Tables 3, 4, 17, 18; "rigid" is its '
                   '"Standard"):\n\n' + markdown_table(rows, paper_cols))
        if 'mz - best baseline' in columns and rows and 'mz - best baseline' in rows[0]:
            ahead = [r['cell'] for r in rows if r['mz - best baseline'] > 0]
            notes += (f"\n`mz` is ahead of every baseline on {len(ahead)} of {len(rows)} cells"
                      f"{': ' + ', '.join(ahead) if ahead else ''}.\n")
        png = os.path.join(args.out, 'geometry.png')  # (first: the report links it where drawn)
        note = replace_plot(png, plot_grid, rows, models, png, paper=PAPER,
                            title='Computational geometry: test R² (bars: measured; ticks: paper)')
        write_report(args.out, 'geometry', 'Computational geometry across dimensions '
                     '(paper Tables 3, 4, 17, 18)', env, setup, table,
                     dict(cells=grid, rows=rows, runs=runs), (time.time() - start) / 60,
                     notes=notes, plot=note is None,
                     run_minutes=sum(r['wall_time_s'] for r in runs) / 60 if args.resume else None)
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if note:
        print(note)
    print(table)
    print(f"wrote {args.out}/geometry.json, .md{'' if note else ', .png'}")


if __name__ == '__main__':
    sys.exit(main())
