r"""Point-cloud classification on ModelNet40 and ScanObjectNN (Tasks C and E of the MZAttn paper).

The MZ-Set Transformer (``mz``), the standard Set Transformer (``rigid``) and the
parameter-matched wider Set Transformer (``st-large``) -- optionally Deep Sets (``deepsets``) --
are trained on the official training files (a seeded 10% held out for validation; random rotation
about the up axis and jitter as augmentation) with the same budget and schedule; the table reports
test accuracy (mean ± std over seeds), parameters and minutes per run next to the paper's Table 2
(ST-Large 79.9% / 72.9%, MZAttn 78.1% / 69.4%).

    python benchmarks/point_clouds.py --quick                       # both datasets, small budget
    python benchmarks/point_clouds.py --dataset modelnet40          # all files, paper schedule

The data is read from ``--root`` (the folder holding ``ModelNet40/`` and ``ScanObjectNN/``).
ModelNet40's meshes are downloaded when missing (unless ``--no-download``); ScanObjectNN is shared
by its authors on request and never downloaded. When a dataset is missing the script says how to
get it and where to put it, and exits with status 2. Processing a dataset (the first run;
ModelNet40's meshes are sampled one by one) shows progress bars on stderr, and a download names
what it fetches, unless ``--no-progress``. Training on 1,024-point sets is slow on a CPU: one
epoch over 100 sets took mz about 48 s, rigid 3 s and st-large 4 s on one (shared) thread, so
the quick mode takes about an hour per dataset there, and the full budget wants a GPU
(``--device cuda``).
"""
import argparse
import math
import os.path as osp
import shlex
import sys
import time
from typing import Dict, List, Optional, Sequence

from torch_mz.datasets.common import default_root
from torch_mz.datasets.modelnet import HDF5_FOLDER, MODELNET40_URL, modelnet40_raw_files
from torch_mz.datasets.scanobjectnn import (SCANOBJECTNN_PAGE, SCANOBJECTNN_VARIANTS,
                                           scanobjectnn_file, scanobjectnn_raw_files)
from torch_mz.study import (EXIT_INTERRUPTED, SPREAD_NOTE, RunStore, check_models, environment,
                            interruptible, markdown_table, plot_bars, positive_int,
                            replace_plot, split_model_specs, summarize, train_models,
                            write_report)
from torch_mz.study.budget import (Budget, add_budget_arguments, add_resume_argument,
                                   choose_budget, study_config)
from torch_mz.tasks import load_task

EXIT_ERROR = 2  # missing data or impossible arguments, as the torch-mz command
DATASETS = ('modelnet40', 'scanobjectnn')
FOLDERS = {'modelnet40': 'ModelNet40', 'scanobjectnn': 'ScanObjectNN'}
MODELS = ('mz', 'rigid', 'st-large')
# Table 2 of the paper: test accuracy (mean, std over 3-5 seeds), ModelNet40 and ScanObjectNN
# (OBJ_BG), keyed by our model preset. (The Deep Sets row of that table cannot be read
# unambiguously for these columns, so it is left out.)
PAPER_ACCURACY: Dict[str, Dict[str, tuple]] = {
    'rigid': {'modelnet40': (0.775, 0.006), 'scanobjectnn': (0.716, 0.022)},
    'film': {'modelnet40': (0.784, 0.008), 'scanobjectnn': (0.689, 0.032)},
    'st-large': {'modelnet40': (0.799, 0.010), 'scanobjectnn': (0.729, 0.024)},
    'perceiver': {'modelnet40': (0.750, 0.003), 'scanobjectnn': (0.673, 0.012)},
    'hypernet': {'modelnet40': (0.755, 0.017), 'scanobjectnn': (0.661, 0.009)},
    'mz': {'modelnet40': (0.781, 0.007), 'scanobjectnn': (0.694, 0.037)},
}
PAPER_SETUP = ('1,024 points, all training files, 200 epochs with early stopping (patience 20), '
               'lr 1e-4, ModelNet40 5 seeds, ScanObjectNN OBJ_BG')
QUICK = Budget(seeds=1, n_train=1000, n_test=500, epochs=5, lr=1e-3)
FULL = Budget(seeds=3, n_train=None, n_test=None, epochs=200, lr=1e-4)  # every file


def how_to_get(dataset: str, root: str, source: str = 'mesh', variant: str = 'OBJ_BG') -> str:
    r"""Where to download (or request) :obj:`dataset` and where its files go under :obj:`root`
    (the wording of the dataset classes' docstrings and messages)."""
    raw = osp.join(root, 'raw')
    if dataset == 'modelnet40':
        return (f"ModelNet40 (--modelnet-source mesh, the default) needs the Princeton meshes of "
                f"ModelNet40.zip ({MODELNET40_URL}): extract it and move the 40 class folders of "
                f"its 'ModelNet40/' folder into '{raw}', so that the meshes lie as "
                f"'{osp.join(raw, '<class>', '{train,test}', '<class>_NNNN.off')}' (the script "
                f"fetches the archive itself where it can reach that address, unless "
                f"--no-download). "
                f"Alternatively place PointNet's '{HDF5_FOLDER}' release (ply_data_train*.h5, "
                f"ply_data_test*.h5, shape_names.txt, and train_files.txt and test_files.txt, "
                f"the lists of its files that tell a copy stopped part way) in "
                f"'{osp.join(raw, HDF5_FOLDER)}' and pass --modelnet-source hdf5.")
    return (f'ScanObjectNN is distributed by its authors under terms of use and is not '
            f'downloaded automatically. Request access on {SCANOBJECTNN_PAGE}, download '
            f"h5_files.zip and extract it into '{raw}' (so that "
            f"'{osp.join(raw, scanobjectnn_file(variant, True))}' exists).")


def _raw_missing(dataset: str, root: str, source: str, variant: str) -> bool:
    r"""Whether the raw files the dataset class looks for are absent (what
    :class:`~torch_geometric.data.Dataset` checks before it downloads)."""
    raw = osp.join(root, 'raw')
    names = (modelnet40_raw_files(source) if dataset == 'modelnet40'
             else scanobjectnn_raw_files(variant))
    return not all(osp.exists(osp.join(raw, name)) for name in names)


def load(dataset: str, args, budget: Budget, root: str):
    r"""The task of :obj:`dataset`, or a message (str) saying why it could not be loaded."""
    kwargs = dict(num_points=args.num_points)
    if dataset == 'modelnet40':
        kwargs['source'] = args.modelnet_source
    else:
        kwargs['variant'] = args.variant
    if args.no_download and _raw_missing(dataset, root, args.modelnet_source, args.variant):
        return (f"{FOLDERS[dataset]} is not in '{root}'.\nHow to get it: "
                f'{how_to_get(dataset, root, args.modelnet_source, args.variant)}')
    try:
        return load_task(dataset, seed=0, n_train=budget.n_train, n_val=budget.n_val,
                         n_test=budget.n_test, root=root,
                         progress=not args.no_progress, **kwargs)
    except (FileNotFoundError, OSError) as e:  # files absent, or the download failed
        message = f"{FOLDERS[dataset]} is not available under '{root}' ({e})"
        if SCANOBJECTNN_PAGE not in str(e):  # ScanObjectNN's own message already says how
            how = how_to_get(dataset, root, args.modelnet_source, args.variant)
            message += f'.\nHow to get it: {how}'
        return message
    except (ValueError, ImportError) as e:  # impossible sizes, corrupt files, h5py missing
        return f'{FOLDERS[dataset]}: {e}'


def comparison(rows: List[Dict[str, object]], dataset: str) -> Dict[str, object]:
    r"""The numbers the verdict on :obj:`dataset` rests on: the best measured model and its
    accuracy (in %), and, where both ran, mz minus st-large in points next to the paper's."""
    acc = {r['model']: r['accuracy'] for r in rows if r['dataset'] == dataset}
    finite = [m for m in acc if not math.isnan(acc[m])]  # (NaN: every run diverged)
    if not finite:
        return dict(best=None, best_accuracy=None, gap=None, paper_gap=None)
    best = max(finite, key=acc.get)
    out = dict(best=best, best_accuracy=100 * acc[best], gap=None, paper_gap=None)
    if 'mz' in finite and 'st-large' in finite:
        out['gap'] = 100 * (acc['mz'] - acc['st-large'])
        out['paper_gap'] = 100 * (PAPER_ACCURACY['mz'][dataset][0]
                                  - PAPER_ACCURACY['st-large'][dataset][0])
    return out


def verdict(rows: List[Dict[str, object]], datasets: Sequence[str]) -> List[str]:
    r"""Sentences that set the measured accuracies against the paper's reading of Table 2:
    ST-Large best, MZ 1-3 points behind it (78.1% / 69.4% against 79.9% / 72.9%)."""
    lines = []
    for dataset in datasets:
        c = comparison(rows, dataset)
        if c['best'] is None:
            lines.append(f'- **{FOLDERS[dataset]}**: no verdict: every run diverged.')
            continue
        what = f"best measured model {c['best']} ({c['best_accuracy']:.1f}%)"
        what += ', as in the paper' if c['best'] == 'st-large' else ' (the paper: st-large)'
        if c['gap'] is not None:
            what += f"; mz minus st-large: {c['gap']:+.1f} points (paper: {c['paper_gap']:+.1f})"
        lines.append(f'- **{FOLDERS[dataset]}**: {what}.')
    return lines


def plot(rows: List[Dict[str, object]], datasets: Sequence[str], models: Sequence[str],
         path: str):
    cell = {(r['dataset'], r['model']): r for r in rows}
    # the rows' paper figures, not the table's: none for a ScanObjectNN variant other than
    # OBJ_BG, which the paper does not report (its OBJ_BG dashes were drawn for every variant)
    paper = {k: None if r.get('paper_accuracy') is None else 100 * r['paper_accuracy']
             for k, r in cell.items()}
    plot_bars(datasets, models, lambda d, m: 100 * cell[(d, m)]['accuracy'],
              lambda d, m: 100 * cell[(d, m)]['accuracy_std'], path,
              paper=lambda d, m: paper.get((d, m)),
              ylabel='test accuracy, % (mean ± std over seeds)',
              title='Point clouds (dashes: paper)', paper_label='paper (Table 2)',
              group_labels=[FOLDERS[d] for d in datasets])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    add_budget_arguments(parser, quick_help='1,000 training sets, 500 test sets, 5 epochs, 1 seed',
                         overrides=('seeds', 'n_train', 'n_val', 'n_test', 'epochs', 'lr'),
                         helps=dict(n_train='(default: all training files but the validation '
                                    'ones)', n_val='(default: 10%% of training)',
                                    n_test='(default: all test files)'))
    parser.add_argument('--dataset', default='both', choices=DATASETS + ('both', ))
    # ('~' expanded as the datasets expand it: '~/x' was recorded as <cwd>/~/x, not read)
    parser.add_argument('--root', default=None, type=osp.expanduser,
                        help="folder holding ModelNet40/ and ScanObjectNN/ (default: torch_mz's "
                        "data root, datasets/)")
    parser.add_argument('--modelnet-source', default='mesh', choices=('mesh', 'hdf5'))
    # (an unknown variant with --no-download was a KeyError traceback)
    parser.add_argument('--variant', default='OBJ_BG', choices=tuple(SCANOBJECTNN_VARIANTS),
                        help='ScanObjectNN variant (paper: OBJ_BG)')
    parser.add_argument('--num-points', type=positive_int, default=1024)
    parser.add_argument('--no-download', action='store_true',
                        help='stop with a message instead of downloading ModelNet40')
    parser.add_argument('--no-progress', action='store_true',
                        help="no progress bars while a dataset is processed (its first run: "
                             "ModelNet40's 12,311 meshes are sampled) and no line naming a "
                             "download; the runs print a line each as they finish")
    parser.add_argument('--models', default=','.join(MODELS), help='comma-separated presets')
    add_resume_argument(parser)
    parser.add_argument('--batch-size', type=positive_int, default=32)
    parser.add_argument('--patience', type=positive_int, default=20)
    parser.add_argument('--out', default=osp.join(osp.dirname(__file__), 'results',
                                                  'point_clouds'))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    budget = choose_budget(args, QUICK, FULL)
    datasets = list(DATASETS) if args.dataset == 'both' else [args.dataset]
    models = split_model_specs(args.models)  # ('hypernet:rank=4,dim=64' is one spec)
    # an option of a dataset not read was ignored without a word, and --root '' read as no
    # --root (the default folder)
    unread = [f"--{flag} {value} is an option of {FOLDERS[dataset]}; --dataset {args.dataset} "
              f"does not read it: drop --{flag}"
              for flag, value, default, dataset in (
                  ('modelnet-source', args.modelnet_source, 'mesh', 'modelnet40'),
                  ('variant', args.variant, 'OBJ_BG', 'scanobjectnn'))
              if value != default and dataset not in datasets]
    mistake = ('--root is empty: name the dataset folder (or leave --root out for the default)'
               if args.root == '' else unread[0] if unread else
               '--models names no model' if not models else None)
    if mistake:
        print(f'point_clouds.py: error: {mistake}', file=sys.stderr)
        return EXIT_ERROR
    try:  # unknown presets and repeated ones (read as more seeds) before any data is read
        check_models(models)
        if osp.exists(args.out) and not osp.isdir(args.out):
            raise ValueError(f"--out '{args.out}' is a file, not a folder")
    except ValueError as e:
        print(f'point_clouds.py: error: {e}', file=sys.stderr)
        return EXIT_ERROR

    with interruptible(__file__, argv, parser) as stop:  # (kept: none while the data is read)
        # every dataset is loaded before any training, so a missing one stops the run at once
        tasks, errors, roots = {}, [], {}
        for dataset in datasets:
            root = osp.join(args.root, FOLDERS[dataset]) if args.root else default_root(
                FOLDERS[dataset])
            task = load(dataset, args, budget, root)
            if isinstance(task, str):
                errors.append(task)
            else:
                tasks[dataset] = task
                roots[dataset] = osp.realpath(root)  # (the folder read, resolved)
        if errors:
            for message in errors:
                print(f'point_clouds.py: error: {message}', file=sys.stderr)
            return EXIT_ERROR

        try:  # the models' block options for these datasets' shapes, and the runs' folder
            for task in tasks.values():
                check_models(models, task=task)
            store = RunStore.for_study(args.out, args.resume, args.overwrite)
            stop.kept = store.folder  # (before: nothing of this call kept)
        except (ValueError, OSError) as e:
            print(f'point_clouds.py: error: {e}', file=sys.stderr)
            return EXIT_ERROR
        start = time.time()
        rows, runs, sizes = [], [], {}
        for dataset, task in tasks.items():
            sizes[dataset] = dict(train=len(task.train), val=len(task.val), test=len(task.test))
            # the runs are kept under the folder read, resolved: a relative --root named another
            # folder from another working directory, whose runs --resume read as this data's.
            # Runs kept under the root as given are read where that named one folder (an absolute
            # --root; no --root named the default root of the environment it ran in, taken to be
            # this one's), never under a relative one, and kept under the folder read from then on
            data = dict(dataset=dataset, root=roots[dataset], num_points=args.num_points,
                        sizes=sizes[dataset], **({'source': args.modelnet_source}
                                                 if dataset == 'modelnet40' else
                                                 {'variant': args.variant}))
            legacy = (dict(data, root=args.root) if args.root is None or osp.isabs(args.root)
                      else None)
            dataset_runs = train_models(
                task, models, budget.seeds,
                lambda spec, seed: study_config(budget, device=args.device,
                                                batch_size=args.batch_size, patience=args.patience,
                                                seed=seed),
                on_result=lambda run: print(
                    f"{run['dataset']:12s} {run['model']:9s} seed {run['seed']}: " + (
                        f"diverged ({run['diverged']})" if 'diverged' in run else
                        f"test accuracy {run['test']['accuracy']:.4f}")
                    + f" ({run['wall_time_s']:.0f} s)", flush=True),
                store=store, data=data, legacy_data=legacy, record_diverged=True, dataset=dataset)
            runs += dataset_runs
            for entry in summarize(dataset_runs, 'classification'):
                paper = PAPER_ACCURACY.get(entry['model'], {}).get(dataset, (None, None))
                if dataset == 'scanobjectnn' and args.variant != 'OBJ_BG':
                    paper = (None, None)  # the paper reports OBJ_BG only
                rows.append(dict(dataset=dataset, **entry, paper_accuracy=paper[0],
                                 paper_accuracy_std=paper[1]))
        stop.all_kept()  # (every run is kept: a Ctrl-C from here costs only the report)
        env = environment()
        env['command'] = ' '.join(['python', 'benchmarks/point_clouds.py']
                                  + [shlex.quote(a) for a in argv])
        minutes = (time.time() - start) / 60
        setup = dict(datasets=datasets, roots=roots, models=models, seeds=budget.seeds, sizes=sizes,
                     epochs=budget.epochs, lr=budget.lr, batch_size=args.batch_size,
                     patience=args.patience, num_points=args.num_points,
                     modelnet_source=args.modelnet_source, scanobjectnn_variant=args.variant,
                     split_seed=0)

        def pct(mean, std):
            return '' if mean is None else f'{100 * mean:.1f} ± {100 * std:.1f}'

        cells = [{'dataset': FOLDERS[r['dataset']], 'model': r['model'],
                  'params': '' if r['params'] is None else f"{r['params']:,}",
                  'seeds': f"{r['seeds']} ({r['diverged']} diverged)" if r.get('diverged') else
                  r['seeds'], 'test accuracy (%)': pct(r['accuracy'], r['accuracy_std']),
                  'paper (%)': pct(r['paper_accuracy'], r['paper_accuracy_std']),
                  'min/run': f"{r['minutes']:.2f}"} for r in rows]
        table = markdown_table(cells, ['dataset', 'model', 'params', 'seeds', 'test accuracy (%)',
                                       'paper (%)', 'min/run'])
        lines = verdict(rows, list(tasks))
        png = osp.join(args.out, 'point_clouds.png')  # (first: the report links it where drawn)
        note = replace_plot(png, plot, rows, list(tasks), models, png)
        write_report(args.out, 'point_clouds', 'Point-cloud classification (paper Table 2, Tasks C '
                     'and E)', env, setup,
                     'Every model gets the same sets, augmentation, budget and schedule. Paper: '
                     f'{PAPER_SETUP}; where the budgets differ, compare the ranking of the models '
                     f"rather than the absolute accuracies.\n\n{table}\n{SPREAD_NOTE} The paper's "
                     f'± is the spread it reports.',
                     dict(paper_setup=PAPER_SETUP, rows=rows, runs=runs), minutes,
                     notes='## Against the paper\n\n' + '\n'.join(lines), plot=note is None,
                     run_minutes=sum(r['wall_time_s'] for r in runs) / 60 if args.resume else None)
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if note:
        print(note)
    print(table)
    print('\n'.join(lines))
    print(f"wrote {args.out}/point_clouds.json, .md{'' if note else ', .png'}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
