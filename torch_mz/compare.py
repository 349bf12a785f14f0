r"""Training several models on one task with identical budgets, and summarising the runs: the
engine of ``torch-mz compare`` and of the studies in ``benchmarks/``. Library code: no printing."""
import math
from typing import Dict, List, Optional

import numpy as np

from torch_mz.models import build_model, count_parameters
from torch_mz.train import TrainConfig, seed_everything, train

METRICS = {'regression': ('r2', 'mse', 'mae'), 'classification': ('accuracy', 'loss')}


def train_one(task, model_name: str, seed: int, config: TrainConfig,
              **model_overrides) -> Dict[str, object]:
    r"""Builds preset :obj:`model_name` for :obj:`task` (a :class:`~torch_mz.tasks.TaskData`),
    trains it with :obj:`config` (seeded with :obj:`seed`) and returns a flat record: model, seed,
    parameter count, best epoch, epochs run, wall time, validation and test metrics."""
    seed_everything(seed)
    model = build_model(model_name, task.in_channels, task.out_channels, pos_dim=task.pos_dim,
                        feature_columns=task.info.get('feature_columns'), **model_overrides)
    result = train(model, task.train, task.val, task.test, config=config,
                   task_type=task.task_type)
    return dict(model=model_name, seed=seed, params=count_parameters(model),
                best_epoch=result.best_epoch, epochs_run=result.epochs_run,
                stopped_early=result.stopped_early, wall_time_s=result.wall_time,
                val=result.val_metrics, test=result.test_metrics or {})


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
