r"""Plots of study results, drawn off-screen (matplotlib's Agg backend) into files.
matplotlib is optional (``pip install 'torch_mz[plot]'``): :func:`pyplot` raises an
:class:`ImportError` naming the extra, and :func:`try_plot` turns that into a note for scripts
to print. A script draws its plot with :func:`replace_plot` before it writes its report, and
links the plot there only where it was drawn."""
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from torch_mz._files import atomic_write
from torch_mz._optional import require
from torch_mz.study.report import METRICS

__all__ = ['NO_MATPLOTLIB', 'pyplot', 'try_plot', 'replace_plot', 'remove_earlier_plot',
           'save_figure', 'plot_bars', 'plot_grid', 'plot_summary']

#: What a study prints instead of drawing its plot when matplotlib is missing.
NO_MATPLOTLIB = "matplotlib is not installed: no plot (pip install 'torch_mz[plot]')"


def pyplot():
    r"""``matplotlib.pyplot`` on the off-screen Agg backend (raises an :class:`ImportError` that
    names the ``plot`` extra when matplotlib is missing)."""
    require('matplotlib').use('Agg')
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig: Any, path: str, **kwargs: Any) -> None:
    r"""``fig.savefig(path, **kwargs)``, atomically (:func:`~torch_mz._files.atomic_write`): an
    interrupted save leaves the earlier file, never a truncated image that a report links to.
    The format is ``format`` if given, else the path's extension; a path without one gets
    matplotlib's ``savefig.format`` and its extension appended, as ``savefig`` does."""
    path = os.fspath(path)
    fmt = kwargs.pop('format', None) or os.path.splitext(path)[1][1:].lower()
    if not fmt:
        fmt = str(pyplot().rcParams['savefig.format'])
        path = f'{path}.{fmt}'
    atomic_write(path, lambda f: fig.savefig(f, format=fmt, **kwargs))


def try_plot(plot: Callable[..., None], *args, **kwargs) -> Optional[str]:
    r"""Calls ``plot(*args, **kwargs)``; returns :obj:`None`, or a note for the script to print
    where nothing was drawn: :data:`NO_MATPLOTLIB` when matplotlib is missing, or the error of
    a plot that failed (an :class:`Exception`: a plot is drawn beside a study's results, and its
    failure costs the plot, never the results). A plot that saves to a file a report links:
    :func:`replace_plot`."""
    try:
        plot(*args, **kwargs)
    except ImportError:
        return NO_MATPLOTLIB
    except Exception as e:  # noqa: BLE001 - the plot is lost, not the results it shows
        return f'the plot failed ({type(e).__name__}: {e}): no plot'
    return None


def replace_plot(path: str, plot: Callable[..., None], *args, **kwargs) -> Optional[str]:
    r""":func:`try_plot` of a plot that saves its figure to :obj:`path` (also given to
    :obj:`plot`, among :obj:`args` or :obj:`kwargs`), for a report that links the figure only
    where this run drew it: where nothing was drawn, a file at :obj:`path` -- an earlier run's
    figure -- is removed, so that it does not sit beside results it does not show. Call it
    before the report is written; returns :func:`try_plot`'s note (:obj:`None`: drawn), with
    :func:`remove_earlier_plot`'s words on the file it removed."""
    note = try_plot(plot, *args, **kwargs)
    if note is not None:
        note += remove_earlier_plot(path, note)
    return note


def remove_earlier_plot(path: str, note: str) -> str:
    r"""Removes the figure at :obj:`path`, which an earlier run drew and this run, with
    :func:`try_plot`'s :obj:`note`, did not; returns the words that follow the note where it is
    printed: which file went, why, and how to draw it again (a committed figure went without a
    word); ``''`` where there was none."""
    try:
        os.remove(path)
    except FileNotFoundError:
        return ''
    except OSError as e:  # (said, not raised: the results are still to be written)
        return f"; an earlier run's '{path}' is left there ({e.strerror or e})"
    redraw = ('install matplotlib and run this again' if note == NO_MATPLOTLIB else
              'run this again once the plot draws')
    return (f"; removed the figure an earlier run drew, '{path}', which would not show these "
            f"results: {redraw} to redraw it")


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
    plt = pyplot()
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
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def plot_grid(rows: Sequence[Mapping[str, Any]], models: Sequence[str], path: str,
              paper: Optional[Mapping[Tuple[str, str], float]] = None,
              title: Optional[str] = None, ylim: Optional[Tuple[float, float]] = None):
    r"""Grouped bars of the test R² of :func:`run_grid`'s rows (one group per cell, one bar per
    model, the spread over seeds as error bars) with the paper's value, where :obj:`paper` has it
    under ``(cell label, model)``, as a black dash on the bar (see :func:`plot_bars`). Two rows
    whose cells read alike (``1`` and ``'1'``) raise a :class:`ValueError` (one was dropped)."""
    by_cell = {str(r['cell']): r for r in rows}
    if len(by_cell) < len(rows):
        labels = [r['cell'] for r in rows]
        twice = next(c for i, c in enumerate(labels) if str(c) in map(str, labels[:i]))
        raise ValueError(f"plot_grid: two rows' cells read {str(twice)!r} (a cell of its own "
                         f"label each: {labels})")
    plot_bars(list(by_cell), models, lambda c, m: by_cell[c][f'{m} r2'],
              lambda c, m: by_cell[c][f'{m} r2 std'], path,
              paper=(lambda c, m: paper.get((c, m))) if paper else None, title=title, ylim=ylim)


def plot_summary(summary: List[Dict[str, object]], task_type: str, path: str,
                 title: Optional[str] = None):
    r"""A bar chart of the main test metric (R² or accuracy) with the spread over seeds, one bar
    per model (a grid's summary, whose entries carry a ``cell``, is refused: its cells' bars
    would overlay; :func:`plot_grid` plots a grid)."""
    if any('cell' in e for e in summary):
        raise ValueError('plot_summary draws one bar per model: the summary of a grid (entries '
                         'with a cell) would overlay its cells; plot it with plot_grid')
    plt = pyplot()
    key = METRICS[task_type][0]
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(summary), 3.6))
    ax.bar([e['model'] for e in summary], [e[key] for e in summary],
           yerr=[e[key + '_std'] for e in summary], capsize=4, color='tab:blue')
    ax.axhline(0.0, color='black', linewidth=0.8)
    ax.set_ylabel(f"test {'R²' if key == 'r2' else 'accuracy'} (mean ± std over seeds)")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
