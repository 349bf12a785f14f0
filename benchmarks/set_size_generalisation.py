r"""Set-size generalisation (Appendix D.2.3, Table 16 of the MZAttn paper), with and without
log-n attention scaling.

Every model is trained on sets of 10-30 elements of the quadratic-TDOF task and evaluated on
test sets of 10-30, 30-50, 50-80 and 80-120 elements (independent draws from the same task; the
training data are identical for all models). Models: the standard Set Transformer (``rigid``)
and MZAttn (``mz``), each with ``log_n=False`` and ``log_n=True`` (logits multiplied by the log of
the key-set size), same budget, schedule and target normalisation.

    python benchmarks/set_size_generalisation.py --quick
    python benchmarks/set_size_generalisation.py
"""
import argparse
import os
import time

import numpy as np

from torch_mz.models import build_model, count_parameters
from torch_mz.study import environment, markdown_table, pyplot, try_plot, write_report
from torch_mz.study.budget import Budget, add_budget_arguments, choose_budget, study_config
from torch_mz.tasks import load_task
from torch_mz.train import Trainer, seed_everything

TEST_SIZES = ((10, 30), (30, 50), (50, 80), (80, 120))
# Table 16 of the paper (its task is not named there): test range -> (ST R^2, MZ R^2)
PAPER = {(10, 30): (0.957, 0.972), (30, 50): (0.978, 0.982), (50, 80): (0.968, 0.977),
         (80, 120): (0.969, 0.972)}
CONFIGS = (('rigid', False), ('rigid', True), ('mz', False), ('mz', True))
QUICK = Budget(seeds=1, n_train=640, n_test=200, epochs=10, lr=1e-3)
FULL = Budget(seeds=3, n_train=5000, n_test=1000, epochs=100, lr=1e-4)


def plot(rows, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    labels = [f'{lo}-{hi}' for lo, hi in TEST_SIZES]
    for model, log_n in CONFIGS:
        name = f"{model}{' + log_n' if log_n else ''}"
        ax.plot(labels, [r[name] for r in rows], marker='o', label=name,
                linestyle='--' if log_n else '-')
    ax.set_xlabel('test set size (trained on 10-30)')
    ax.set_ylabel('test R²')
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_budget_arguments(parser, quick_help='small data, 10 epochs, 1 seed', overrides=('seeds', ))
    parser.add_argument('--d', type=int, default=16)
    parser.add_argument('--tdof', type=int, default=8)
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      'set_size_generalisation'))
    args = parser.parse_args()
    budget = choose_budget(args, QUICK, FULL)
    seeds, n_train, n_test, epochs, lr = (budget.seeds, budget.n_train, budget.n_test,
                                          budget.epochs, budget.lr)
    start = time.time()
    tasks = {rng: load_task('quadratic-tdof', seed=0, n_train=n_train, n_val=n_train // 4,
                            n_test=n_test, d=args.d, tdof=args.tdof,
                            split_set_sizes={'train': (10, 30), 'val': (10, 30), 'test': rng})
             for rng in TEST_SIZES}
    base = tasks[TEST_SIZES[0]]
    results = {}
    runs = []
    for model_name, log_n in CONFIGS:
        name = f"{model_name}{' + log_n' if log_n else ''}"
        for seed in range(seeds):
            seed_everything(seed)
            model = build_model(model_name, base.in_channels, base.out_channels, log_n=log_n)
            config = study_config(budget, device=args.device, seed=seed)
            trainer = Trainer(model, config, task_type='regression')
            trainer.fit(base.train, base.val)
            for rng in TEST_SIZES:
                metrics = trainer.evaluate(tasks[rng].test)
                results.setdefault((name, rng), []).append(metrics['r2'])
                runs.append(dict(model=name, seed=seed, test_sizes=list(rng),
                                 params=count_parameters(model), **metrics))
            print(f'{name:14s} seed {seed}: ' + ', '.join(
                f'{lo}-{hi}: {results[(name, (lo, hi))][-1]:.3f}' for lo, hi in TEST_SIZES),
                flush=True)
    rows = []
    for rng in TEST_SIZES:
        row = dict(test_sizes=f'{rng[0]}-{rng[1]}')
        for model_name, log_n in CONFIGS:
            name = f"{model_name}{' + log_n' if log_n else ''}"
            row[name] = float(np.mean(results[(name, rng)]))
        row['paper ST'], row['paper MZ'] = PAPER[rng]
        rows.append(row)
    env = environment()
    setup = dict(task='quadratic-tdof', d=args.d, tdof=args.tdof, seeds=seeds, n_train=n_train,
                 n_test_per_range=n_test, epochs=epochs, lr=lr, train_sizes=[10, 30])
    columns = ['test_sizes'] + [f"{m}{' + log_n' if ln else ''}" for m, ln in CONFIGS] + \
        ['paper ST', 'paper MZ']
    table = markdown_table(rows, columns)
    write_report(args.out, 'set_size_generalisation',
                 'Set-size generalisation (paper Table 16): test R², trained on sizes 10-30', env,
                 setup, table, dict(rows=rows, runs=runs), (time.time() - start) / 60,
                 notes="The paper's Table 16 does not name the task it was measured on; its ST "
                       'and MZ R² are listed for reference only.')
    note = try_plot(plot, rows, os.path.join(args.out, 'set_size_generalisation.png'))
    if note:
        print(note)
    print(table)


if __name__ == '__main__':
    main()
