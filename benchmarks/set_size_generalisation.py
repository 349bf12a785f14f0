r"""Set-size generalisation (Appendix D.2.3, Table 16 of the MZAttn paper), with and without
log-n attention scaling.

Every model is trained on sets of 10-30 elements of the quadratic-TDOF task and evaluated on
test sets of 10-30, 30-50, 50-80 and 80-120 elements (independent draws from the same task; the
training data are identical for all models). Models: the standard Set Transformer (``rigid``)
and MZAttn (``mz``), each with ``log_n=False`` and ``log_n=True`` (logits multiplied by the log of
the key-set size), same budget, schedule and target normalisation.

    python benchmarks/set_size_generalisation.py --quick   # 1 seed, 640 training sets, 10 epochs
    python benchmarks/set_size_generalisation.py           # 3 seeds, 5000 sets, 100 epochs
    python benchmarks/set_size_generalisation.py --quick --seeds 2 --n-train 64 --n-test 32 \
        --epochs 2                                         # a smoke run (under a minute)

With several seeds the table gives the mean ± std over seeds (one seed: the value alone). A run
whose training diverges is recorded as diverged (no test figures), left out of the means (NaN
where every seed of a configuration diverged) and named below the table; the other runs go on,
as in the other studies (``train_models(record_diverged=True)``).

Every finished run (its test figures on every range, or its divergence) is kept as one file in
``<out>/runs`` (:class:`~torch_mz.study.RunStore`): the same command with ``--resume`` trains
only the runs an interrupted call had not finished; without ``--resume`` a folder that holds
runs is refused, and ``--overwrite`` removes them and trains every run again. Ctrl-C ends a run
with one line that gives the command to go on (status 130).
"""
import argparse
import os
import sys
import time
import warnings

from torch_mz.models import build_model, count_parameters
from torch_mz._files import nan_for_none
from torch_mz.study import (EXIT_INTERRUPTED, RunStore, environment, interruptible,
                            markdown_table, positive_int, pyplot, replace_plot, write_report)
from torch_mz.study.plots import save_figure
from torch_mz.study.budget import (Budget, add_budget_arguments, add_resume_argument,
                                   choose_budget, study_config)
from torch_mz.study.statistics import mean_or_nan, std_or_nan
from torch_mz.tasks import load_task
from torch_mz.train import Trainer, TrainingDiverged, seed_everything
from torch_mz.study.report import check_out_folder

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
        name = name_of(model, log_n)
        ax.plot(labels, [r[name] for r in rows], marker='o', label=name,
                linestyle='--' if log_n else '-')
    ax.set_xlabel('test set size (trained on 10-30)')
    ax.set_ylabel('test R²')
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def name_of(model, log_n):
    r"""The column name of a configuration of :data:`CONFIGS` (``'mz + log_n'``)."""
    return f"{model}{' + log_n' if log_n else ''}"


def table_rows(results, seeds):
    r"""One row per test range of :data:`TEST_SIZES`: each configuration's mean test R² over
    seeds (:obj:`results` maps ``(name, range)`` to the R² of the seeds that did not diverge;
    NaN where none), with several seeds also its (population) standard deviation
    (``'<name> std'``), and the paper's figures."""
    rows = []
    for rng in TEST_SIZES:
        row = dict(test_sizes=f'{rng[0]}-{rng[1]}')
        for model_name, log_n in CONFIGS:
            name = name_of(model_name, log_n)
            row[name] = mean_or_nan(results.get((name, rng), []))
            if seeds > 1:
                row[f'{name} std'] = std_or_nan(results.get((name, rng), []))
        row['paper ST'], row['paper MZ'] = PAPER[rng]
        rows.append(row)
    return rows


def shown(rows, seeds):
    r""":obj:`rows` as the Markdown table shows them: with several seeds each configuration's
    cell reads ``mean ± std`` (4 significant digits), with one the value alone."""
    if seeds == 1:
        return rows
    out = []
    for row in rows:
        row = dict(row)
        for model_name, log_n in CONFIGS:
            name = name_of(model_name, log_n)
            row[name] = f'{row[name]:.4g} ± {row.pop(name + " std"):.4g}'
        out.append(row)
    return out


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    add_budget_arguments(parser, quick_help='small data, 10 epochs, 1 seed',
                         overrides=('seeds', 'n_train', 'n_test', 'epochs', 'lr'),
                         helps=dict(n_test='test sets per test-size range'))
    parser.add_argument('--d', type=positive_int, default=16)
    parser.add_argument('--tdof', type=positive_int, default=8, help='at most --d')
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      'set_size_generalisation'))
    add_resume_argument(parser)
    args = parser.parse_args()
    problem = check_out_folder(args.out)  # (before anything runs: a folder it cannot write)
    if problem:
        parser.error(problem)
    budget = choose_budget(args, QUICK, FULL)
    seeds, n_train, n_test = budget.seeds, budget.n_train, budget.n_test
    if n_test < 2:
        parser.error(f'--n-test {n_test} is too few: at least 2 test sets per range (an R² needs '
                     'a spread of targets)')
    start = time.time()
    try:  # the task checks its options (tdof <= d) before generating anything
        tasks = {rng: load_task('quadratic-tdof', seed=0, n_train=n_train,
                                n_val=max(1, n_train // 4), n_test=n_test, d=args.d,
                                tdof=args.tdof, split_set_sizes={'train': (10, 30),
                                                                 'val': (10, 30), 'test': rng})
                 for rng in TEST_SIZES}
    except ValueError as e:
        parser.error(f'--d {args.d} --tdof {args.tdof}: {e}')
    base = tasks[TEST_SIZES[0]]
    try:  # the runs' folder, before the first run trains
        store = RunStore.for_study(args.out, args.resume, args.overwrite)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    # what identifies a run's data in the store (every range's test sets are drawn from it)
    data = dict(task='quadratic-tdof', seed=0, n_train=n_train, n_val=max(1, n_train // 4),
                n_test=n_test, d=args.d, tdof=args.tdof, train_sizes=[10, 30],
                test_sizes=[list(rng) for rng in TEST_SIZES])
    results = {}
    runs = []
    run_seconds = 0.0  # (the runs' own times, those read back included)
    with interruptible(__file__, sys.argv[1:], parser, store.folder) as stop:
        for model_name, log_n in CONFIGS:
            name = name_of(model_name, log_n)
            for seed in range(seeds):
                record = train_run(store, data, model_name, log_n, seed, budget, args.device,
                                   base, tasks)
                run_seconds += record.get('wall_time_s', 0.0)
                if 'diverged' in record:
                    e = record['diverged']
                    warnings.warn(f'{name} seed {seed} diverged ({e}): recorded with no test '
                                  f'figures (R² NaN), the other runs go on')
                    runs.append(dict(model=name, seed=seed, params=None, diverged=e))
                    print(f'{name:14s} seed {seed}: diverged ({e})', flush=True)
                    continue
                for rng, metrics in zip(TEST_SIZES, record['tests']):
                    results.setdefault((name, rng), []).append(metrics['r2'])
                    runs.append(dict(model=name, seed=seed, test_sizes=list(rng),
                                     params=record['params'], **metrics))
                print(f'{name:14s} seed {seed}: ' + ', '.join(
                    f'{lo}-{hi}: {results[(name, (lo, hi))][-1]:.3f}' for lo, hi in TEST_SIZES),
                    flush=True)
        stop.all_kept()  # (every run is kept: a Ctrl-C from here costs only the report)
        table, note = report(args, runs, results, budget, start, run_seconds)
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if note:
        print(note)
    print(table)
    return None


def train_run(store: RunStore, data: dict, model_name: str, log_n: bool, seed: int,
              budget: Budget, device: str, base, tasks) -> dict:
    r"""The record of one run: read back from :obj:`store` where a call with the same data,
    model, seed and training settings finished it, else trained (and kept there): ``params``
    and ``tests`` (the metrics on the test sets of each range of :data:`TEST_SIZES`), or
    ``diverged`` (the error's text); ``wall_time_s``, the time it took to train."""
    key = dict(study='set_size_generalisation', data=data, model=model_name,
               options=dict(log_n=log_n), seed=seed)
    config = study_config(budget, device=device, seed=seed)
    record = store.get(key, config)
    if record is not None:  # (a figure written as null, NaN, is read back as NaN)
        if 'tests' in record:
            record['tests'] = [nan_for_none(metrics) for metrics in record['tests']]
        return record
    start = time.time()
    seed_everything(seed)
    model = build_model(model_name, base.in_channels, base.out_channels, log_n=log_n)
    trainer = Trainer(model, config, task_type='regression')
    try:
        trainer.fit(base.train, base.val)
    except TrainingDiverged as e:  # (it ended the study with a traceback)
        record = dict(diverged=str(e))
    else:
        record = dict(params=count_parameters(model),
                      tests=[trainer.evaluate(tasks[rng].test) for rng in TEST_SIZES])
    record['wall_time_s'] = time.time() - start
    store.put(key, config, record)
    return record


def report(args, runs, results, budget, start, run_seconds):
    r"""Writes the report; returns its table and the note of a plot not drawn (else
    :obj:`None`)."""
    seeds, n_train, n_test, epochs, lr = (budget.seeds, budget.n_train, budget.n_test,
                                          budget.epochs, budget.lr)
    rows = table_rows(results, seeds)
    env = environment()
    setup = dict(task='quadratic-tdof', d=args.d, tdof=args.tdof, seeds=seeds, n_train=n_train,
                 n_test_per_range=n_test, epochs=epochs, lr=lr, train_sizes=[10, 30])
    columns = ['test_sizes'] + [name_of(m, ln) for m, ln in CONFIGS] + ['paper ST', 'paper MZ']
    table = markdown_table(shown(rows, seeds), columns)
    spread = (f'Values: mean ± std (population) of the test R² over {seeds} seeds. '
              if seeds > 1 else '')
    diverged = [f"{r['model']} seed {r['seed']}" for r in runs if 'diverged' in r]
    if diverged:  # (their configurations' means are over the other seeds; NaN where none)
        spread += (f"Runs that diverged (left out of the means; NaN where every seed did): "
                   f"{', '.join(diverged)}. ")
    png = os.path.join(args.out, 'set_size_generalisation.png')  # (first: linked where drawn)
    note = replace_plot(png, plot, rows, png)
    write_report(args.out, 'set_size_generalisation',
                 'Set-size generalisation (paper Table 16): test R², trained on sizes 10-30', env,
                 setup, table, dict(rows=rows, runs=runs), (time.time() - start) / 60,
                 notes=spread + "The paper's Table 16 does not name the task it was measured "
                       'on; its ST and MZ R² are listed for reference only.', plot=note is None,
                 run_minutes=run_seconds / 60 if args.resume else None)
    return table, note


if __name__ == '__main__':
    sys.exit(main())
