r"""Training several models on one task with identical budgets, and summarising the runs: the
engine of ``torch-mz compare`` and of the studies in ``benchmarks/``. Library code: no printing."""
import json
import math
from dataclasses import replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from torch_mz.models import build_model, count_parameters
from torch_mz.options import parse_key_values
from torch_mz.train import TrainConfig, seed_everything, train

METRICS = {'regression': ('r2', 'mse', 'mae'), 'classification': ('accuracy', 'loss')}


def train_one(task, model_name: str, seed: int, config: TrainConfig,
              **model_overrides) -> Dict[str, object]:
    r"""Builds preset :obj:`model_name` for :obj:`task` (a
    :class:`~torch_mz.datasets.TaskSplits`), trains it with :obj:`config` (seeded with
    :obj:`seed`) and returns a flat record: model, seed, parameter count, best epoch, epochs run,
    wall time, validation and test metrics. The checkpoints record the task (name and ``task.args``) and the model (preset name and
    overrides), so that resuming one with another task or model is refused."""
    seed_everything(seed)
    model = build_model(model_name, task.in_channels, task.out_channels, pos_dim=task.pos_dim,
                        feature_columns=task.info.get('feature_columns'), **model_overrides)
    run_info = {'task': {'name': task.name, 'args': _json_safe(getattr(task, 'args', {}))},
                'model': {'name': model_name, 'args': _json_safe(model_overrides)}}
    result = train(model, task.train, task.val, task.test, config=config,
                   task_type=task.task_type, run_info=run_info)
    return dict(model=model_name, seed=seed, params=count_parameters(model),
                best_epoch=result.best_epoch, epochs_run=result.epochs_run,
                stopped_early=result.stopped_early, wall_time_s=result.wall_time,
                val=result.val_metrics, test=result.test_metrics or {})


def _json_safe(options: Mapping[str, Any]) -> Dict[str, Any]:
    # objects JSON cannot hold (a transform, a callable) are recorded by their class/function name
    return json.loads(json.dumps(dict(options), sort_keys=True, default=lambda o: getattr(
        o, '__qualname__', type(o).__qualname__)))


def parse_model_spec(spec: str) -> Tuple[str, Dict[str, Any]]:
    r"""Splits a model spec ``'name'`` or ``'name:key=value,key=value'`` (e.g.
    ``'hypernet:rank=64,dim=64'``) into the preset name and its overrides (values read by
    :func:`parse_key_values`)."""
    name, _, rest = spec.partition(':')
    try:
        return name, parse_key_values(filter(None, rest.split(',')))
    except ValueError as e:
        raise ValueError(f"Model spec '{spec}': options {e}") from None


def split_model_specs(text: str) -> List[str]:
    r"""Splits a comma-separated list of model specs, keeping a spec's own ``key=value`` options
    together: ``'mz,hypernet:rank=64,dim=64'`` gives ``['mz', 'hypernet:rank=64,dim=64']`` (a
    piece with ``=`` but no ``:`` continues the spec before it)."""
    specs: List[str] = []
    for piece in (p.strip() for p in text.split(',')):
        if not piece:
            continue
        if '=' in piece and ':' not in piece and specs and ':' in specs[-1]:
            specs[-1] += ',' + piece
        else:
            specs.append(piece)
    return specs


def run_grid(cells: Sequence[Mapping[str, Any]], models: Sequence[str], seeds: int,
             config: TrainConfig, load: Optional[Callable[..., Any]] = None,
             on_result: Optional[Callable[[Dict[str, object]], None]] = None,
             config_for: Optional[Callable[[Mapping[str, Any], str, int], TrainConfig]] = None,
             cached: Optional[Callable[[Mapping[str, Any], str, int, TrainConfig],
                                       Optional[Dict[str, object]]]] = None
             ) -> Tuple[List[Dict[str, object]], List[Dict[str, object]]]:
    r"""Trains every model of :obj:`models` (specs, see :func:`parse_model_spec`) with
    :obj:`seeds` seeds on every cell of :obj:`cells`, all with the same :obj:`config` (only the
    seed changes), and returns ``(runs, rows)``.

    A cell is a dict with ``label`` (a column of the table), ``task`` (a task name) and optional
    ``kwargs`` for :func:`~torch_mz.tasks.load_task` (sizes, task arguments); its data is built
    once, from seed 0, and shared by all models and seeds. ``runs`` holds one record per trained
    model (:func:`train_one`'s record plus ``cell``); ``rows`` one per cell with, for every model,
    the mean and standard deviation over seeds of the test R² and MSE (``'<model> r2'``,
    ``'<model> r2 std'``, ``'<model> mse'``) and its parameter count. :obj:`on_result` is called
    with every run as it finishes (for progress output).

    :obj:`config_for`, if given, replaces the shared configuration: ``config_for(cell, spec,
    seed)`` is the configuration of that run (e.g. with a learning rate chosen per model).
    :obj:`cached`, if given, is asked first, as ``cached(cell, spec, seed, run_config)``, for a
    finished run's record to use instead of training (resumption); a cell whose runs are all
    cached never builds its data. :obj:`on_result` is called for cached runs too."""
    if load is None:
        from torch_mz.tasks import load_task as load
    runs: List[Dict[str, object]] = []
    rows: List[Dict[str, object]] = []
    for cell in cells:
        task = None  # built on the first run that is not cached
        row: Dict[str, object] = dict(cell=cell['label'])
        for spec in models:
            name, overrides = parse_model_spec(spec)
            results = []
            for seed in range(seeds):
                run_config = (replace(config, seed=seed) if config_for is None
                              else config_for(cell, spec, seed))
                record = None if cached is None else cached(cell, spec, seed, run_config)
                if record is None:
                    if task is None:
                        task = load(cell['task'], seed=0, **dict(cell.get('kwargs', {})))
                    record = dict(train_one(task, name, seed, run_config, **overrides),
                                  model=spec, cell=cell['label'])
                results.append(record)
                runs.append(record)
                if on_result is not None:
                    on_result(record)
            r2 = [r['test'].get('r2', math.nan) for r in results]
            row[f'{spec} r2'] = float(np.mean(r2))
            row[f'{spec} r2 std'] = float(np.std(r2))
            row[f'{spec} mse'] = float(np.mean([r['test'].get('mse', math.nan) for r in results]))
            row[f'{spec} params'] = results[0]['params']
        rows.append(row)
    return runs, rows


def plot_bars(groups: Sequence[str], models: Sequence[str],
              value: Callable[[str, str], float], error: Callable[[str, str], float], path: str,
              paper: Optional[Callable[[str, str], Optional[float]]] = None,
              ylabel: str = 'test R² (mean ± std over seeds)', title: Optional[str] = None,
              paper_label: str = 'paper', group_labels: Optional[Sequence[str]] = None,
              ylim: Optional[Tuple[float, float]] = None):
    r"""Grouped bars: one group per entry of :obj:`groups`, one bar per model with height
    ``value(group, model)`` and error bar ``error(group, model)``; where ``paper(group, model)``
    is not :obj:`None`, the paper's value is drawn as a black dash on the bar. Saved to
    :obj:`path` (needs matplotlib)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    width = 0.8 / max(1, len(models))
    bars = len(groups) * max(1, len(models))
    fig, ax = plt.subplots(figsize=(min(14.0, max(5.5, 2.5 + 0.2 * bars)), 4.0))
    colors = plt.get_cmap('tab10').colors
    labelled = False  # the paper's dashes get one legend entry
    for j, model in enumerate(models):
        xs = [i + (j - (len(models) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, [value(g, model) for g in groups], width,
               yerr=[error(g, model) for g in groups], capsize=2, color=colors[j % 10],
               label=model)
        marks = [(x, paper(g, model)) for x, g in zip(xs, groups)] if paper else []
        marks = [(x, v) for x, v in marks if v is not None]
        if marks:
            ax.scatter(*zip(*marks), marker='_', s=160, color='black', zorder=3,
                       label=None if labelled else paper_label)
            labelled = True
    ax.axhline(0.0, color='black', linewidth=0.8)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(list(group_labels or groups), rotation=30 if len(groups) > 4 else 0,
                       ha='right' if len(groups) > 4 else 'center', fontsize=8)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc='center left', bbox_to_anchor=(1.0, 0.5))  # off the bars
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_grid(rows: Sequence[Mapping[str, object]], models: Sequence[str], path: str,
              paper: Optional[Mapping[Tuple[str, str], float]] = None,
              title: Optional[str] = None, ylim: Optional[Tuple[float, float]] = None):
    r"""Grouped bars of the test R² of :func:`run_grid`'s rows (one group per cell, one bar per
    model, the spread over seeds as error bars) with the paper's value, where :obj:`paper` has it
    under ``(cell label, model)``, as a black dash on the bar (see :func:`plot_bars`)."""
    by_cell = {str(r['cell']): r for r in rows}
    plot_bars(list(by_cell), models, lambda c, m: by_cell[c][f'{m} r2'],
              lambda c, m: by_cell[c][f'{m} r2 std'], path,
              paper=(lambda c, m: paper.get((c, m))) if paper else None, title=title, ylim=ylim)


def summarize(rows: List[Dict[str, object]], task_type: str) -> List[Dict[str, object]]:
    r"""Mean and (population) standard deviation over seeds of each model's test metrics, in the
    order the models first appear."""
    out = []
    for model in dict.fromkeys(r['model'] for r in rows):
        runs = [r for r in rows if r['model'] == model]
        entry = dict(model=model, params=runs[0]['params'], seeds=len(runs))
        for k in METRICS[task_type]:
            vals = [r['test'].get(k, math.nan) for r in runs]
            entry[k] = float(np.mean(vals))
            entry[f'{k}_std'] = float(np.std(vals))
        entry['minutes'] = float(np.mean([r['wall_time_s'] for r in runs]) / 60)
        out.append(entry)
    return out


def summary_markdown(summary: List[Dict[str, object]], task_type: str) -> str:
    r"""The summary as a Markdown table (mean ± std over seeds)."""
    keys = METRICS[task_type]
    head = ['model', 'params', 'seeds'] + [f'test {k}' for k in keys] + ['min/run']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for e in summary:
        cells = [e['model'], f"{e['params']:,}", str(e['seeds'])]
        cells += [f"{e[k]:.4f} ± {e[k + '_std']:.4f}" for k in keys]
        cells.append(f"{e['minutes']:.2f}")
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def plot_summary(summary: List[Dict[str, object]], task_type: str, path: str,
                 title: Optional[str] = None):
    r"""A bar chart of the main test metric (R² or accuracy) with the spread over seeds."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    key = METRICS[task_type][0]
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(summary), 3.6))
    ax.bar([e['model'] for e in summary], [e[key] for e in summary],
           yerr=[e[key + '_std'] for e in summary], capsize=4, color='tab:blue')
    ax.axhline(0.0, color='black', linewidth=0.8)
    ax.set_ylabel(f"test {'R²' if key == 'r2' else 'accuracy'} (mean ± std over seeds)")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
