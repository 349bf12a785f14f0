r"""Writing a study's results: JSON for machines, Markdown tables for people, and the summary of
a model x seed grid (mean and spread over seeds). Library code: nothing here prints."""
import math
import os
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import numpy as np

from torch_mz._files import atomic_write, strict_json

__all__ = ['METRICS', 'SPREAD_NOTE', 'write_json', 'write_results', 'write_report',
           'markdown_table', 'summarize', 'summary_markdown']

METRICS = {'regression': ('r2', 'mse', 'mae'), 'classification': ('accuracy', 'loss')}
#: The line below a table of means over seeds that says which standard deviation its ± gives
#: (:func:`summarize`'s, :func:`summary_markdown`'s and the studies' tables).
SPREAD_NOTE = ('Test figures are the mean ± the standard deviation over seeds (the population '
               'one, ddof = 0; one seed gives ± 0).')


def check_out_folder(out: str) -> Optional[str]:
    r"""Whether a study can write its results into :obj:`out`, asked before anything is
    trained (a study that found out at its end lost every run): the folder is made, a probe
    file written there and removed, and the folders made for the probe removed again (a usage
    error found later leaves nothing behind). Returns :obj:`None`, or the reason it cannot, in
    one line for a usage error (a path through a file, no permission, ...)."""
    if os.path.exists(out) and not os.path.isdir(out):
        return f'--out {out!r} is a file, not a folder'
    made = []  # the folders that do not exist yet, deepest first
    folder = os.path.abspath(out)
    while not os.path.exists(folder):
        made.append(folder)
        folder = os.path.dirname(folder)
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, f'.write-probe-{os.getpid()}')
        with open(probe, 'w'):
            pass
        os.remove(probe)
    except OSError as e:
        return f"--out {out!r} cannot be written: {e.strerror or e}"
    finally:
        for folder in made:  # deepest first
            if not os.path.lexists(folder):  # (never made: the probe failed above it)
                continue
            try:
                os.rmdir(folder)
            except OSError:  # (not empty: something else writes there now)
                break
    return None


def write_json(path: str, payload: Dict[str, object]):
    r"""Writes :obj:`payload` as indented JSON (creating the folder), atomically: an interrupted
    write leaves the earlier file whole.

    The file is standard JSON: a NaN or infinite float (e.g. the R² of a model whose every run
    diverged, :func:`summarize`) is written as ``null`` (:func:`~torch_mz._files.strict_json`),
    which strict parsers (``jq``, JavaScript's ``JSON.parse``) read; Python's :mod:`json`
    wrote the bare words ``NaN`` / ``Infinity``, which they refuse. A reader that expects a
    float there reads ``null`` back as NaN (:func:`~torch_mz._files.nan_for_none`, as the
    studies' resumption does); files written before still load (:func:`json.load` reads
    ``NaN`` as the float)."""
    _write_json(path, payload)


def _write_json(path: str, payload: Dict[str, object],
                before_replace: Optional[Callable[[], None]] = None) -> None:
    # write_json's, with atomic_write's before_replace
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    text = strict_json(payload, indent=2) + '\n'  # serialised first: a failure writes nothing
    atomic_write(path, lambda f: f.write(text), binary=False, before_replace=before_replace)


def write_results(out: str, name: str, payload: Dict[str, object], markdown: str) -> None:
    r"""Writes ``<out>/<name>.json`` (:obj:`payload`, see :func:`write_json`) and
    ``<out>/<name>.md`` (:obj:`markdown`), creating :obj:`out`, as a pair: the Markdown file
    replaces the earlier one only once the JSON file is written, and the JSON file replaces
    its earlier one right after, so that a write interrupted (Ctrl-C) or failing before then
    leaves both earlier files, not a new table beside the earlier figures."""
    os.makedirs(out, exist_ok=True)
    _write_json(os.path.join(out, f'{name}.json'), payload, before_replace=lambda: atomic_write(
        os.path.join(out, f'{name}.md'), lambda f: f.write(markdown), binary=False))


def remove_results(out: str, name: str) -> None:
    r"""Removes ``<out>/<name>.json`` and ``<out>/<name>.md`` where they exist: the partial
    report of a run that :func:`write_results` has now written whole."""
    for ext in ('json', 'md'):
        path = os.path.join(out, f'{name}.{ext}')
        if os.path.isfile(path):
            os.remove(path)


def write_report(out: str, name: str, title: str, env: Dict[str, Any],
                 setup: Dict[str, object], table: str, payload: Dict[str, object],
                 minutes: float, notes: str = '', plot: bool = True,
                 run_minutes: Optional[float] = None) -> None:
    r"""Writes a study's results as ``<out>/<name>.json`` (:obj:`payload` plus the environment,
    setup and run time) and ``<out>/<name>.md``: the title, the command and setup it ran with,
    :obj:`table`, :obj:`notes` and (if :obj:`plot`) a link to ``<name>.png``.

    :obj:`plot` says whether this run drew ``<name>.png``: pass ``note is None`` of
    :func:`~torch_mz.study.replace_plot`, called before (an earlier run's figure, linked where
    this run drew none, showed other results). :obj:`minutes` is the wall time of this call; a
    study that resumes (reads back the finished runs of an earlier call instead of training
    them) gives also :obj:`run_minutes`, its runs' own recorded times summed, those read back
    included, and the report says which figure counts what (``run_minutes`` in the JSON too)."""
    plural = '' if env['threads'] == 1 else 's'
    took = f'{minutes:.1f} min'
    if run_minutes is not None:
        took += (f" in this call (runs read back from an earlier call are not in it; the runs' "
                 f"own recorded times, those included, sum to {run_minutes:.1f} min)")
    markdown = (f"# {title}\n\nCommand: `{env['command']}`  \n"
                f"Setup: {setup}; {took} on {env['cpu_count']} CPUs "
                f"(torch {env['torch']}, {env['threads']} thread{plural}"
                f"{', GPU: ' + env['cuda'] if env.get('cuda') else ''}).\n\n{table}\n")
    if notes:
        markdown += notes.rstrip() + '\n\n'
    if plot:
        markdown += f'![plot]({name}.png)\n'
    resumed = {} if run_minutes is None else dict(run_minutes=run_minutes)
    write_results(out, name, dict(environment=env, setup=setup, minutes=minutes, **resumed,
                                  **payload), markdown)


def markdown_table(rows: List[Dict[str, object]], columns: List[str]) -> str:
    r"""A GitHub Markdown table of :obj:`rows` (dicts) in the given column order: floats (NumPy's
    too) to 4 significant digits, :obj:`None` or a missing entry as an empty cell, and a ``|``
    in a cell or column name escaped (``\|``: it ended the cell, shifting the row)."""
    def fmt(v):
        if isinstance(v, np.generic):  # (np.float32 is no float: it came out as 0.12345679)
            v = v.item()
        if isinstance(v, float):
            return f'{v:.4g}'
        return '' if v is None else _cell(str(v))
    lines = ['| ' + ' | '.join(_cell(str(c)) for c in columns) + ' |',
             '|' + '---|' * len(columns)]
    lines += ['| ' + ' | '.join(fmt(r.get(c)) for c in columns) + ' |' for r in rows]
    return '\n'.join(lines) + '\n'


def _cell(text: str) -> str:
    r""":obj:`text` as one Markdown table cell: a ``|`` escaped."""
    return text.replace('|', '\\|')


def label_key(value: Any) -> Hashable:
    r""":obj:`value` as a key: equal numbers alike (1, 1.0, ``np.int64(1)``), a text apart
    from a number (a cell ``'1'`` is not the cell ``1``)."""
    try:
        hash(value)
    except TypeError:
        return 'unhashable', repr(value)
    return isinstance(value, str), value


def summarize(rows: List[Dict[str, Any]], task_type: str) -> List[Dict[str, Any]]:
    r"""Mean and (population) standard deviation over seeds of each model's test metrics, in the
    order the models first appear. Runs recorded as diverged (``train_models(...,
    record_diverged=True)``: a ``diverged`` entry, no test figures) are left out of the means
    and counted in ``diverged`` (an entry present only where a run diverged); a model whose
    every run diverged has NaN means and the parameter count :obj:`None`. ``seeds`` counts every
    run, ``minutes`` is the mean over every run.

    Runs that carry a ``cell`` (:func:`~torch_mz.study.run_grid`'s) are summarised per cell and
    model, in the order each pair first appears, each entry led by its ``cell`` (they were
    averaged across cells); runs with a cell and runs without one are not mixed. A run given
    twice (the same ``model`` and ``seed``, in the same cell) raises a :class:`ValueError`: it
    counted as one more seed."""
    if task_type not in METRICS:
        raise ValueError(f"Expected task_type among {sorted(METRICS)} (got {task_type!r})")
    with_cell = sum('cell' in r for r in rows)
    if 0 < with_cell < len(rows):
        raise ValueError(f"summarize: {with_cell} of the {len(rows)} runs carry a 'cell' and the "
                         f"others do not: summarise the runs of a grid (run_grid) apart from "
                         f"the others")
    seen = set()
    for r in rows:
        if 'seed' not in r:  # (a hand-made record: nothing to tell its seeds apart by)
            continue
        same = (label_key(r['model']), label_key(r['seed']), label_key(r.get('cell')))
        if same in seen:
            where = f" in cell {r['cell']!r}" if with_cell else ''
            raise ValueError(f"summarize: the run of model {r['model']!r} seed {r['seed']!r}"
                             f"{where} is given twice (it would count as one more seed)")
        seen.add(same)

    def group(r: Dict[str, Any]) -> Tuple[Hashable, Hashable]:
        return label_key(r.get('cell')), label_key(r['model'])

    out = []
    for key in dict.fromkeys(group(r) for r in rows):
        runs = [r for r in rows if group(r) == key]
        model = runs[0]['model']
        kept = [r for r in runs if 'diverged' not in r]
        entry: Dict[str, Any] = dict(cell=runs[0]['cell']) if with_cell else {}
        entry.update(model=model, params=kept[0]['params'] if kept else None, seeds=len(runs))
        for k in METRICS[task_type]:
            vals = [r['test'].get(k, math.nan) for r in kept]
            entry[k] = float(np.mean(vals)) if vals else math.nan
            entry[f'{k}_std'] = float(np.std(vals)) if vals else math.nan
        entry['minutes'] = float(np.mean([r['wall_time_s'] for r in runs]) / 60)
        if len(kept) < len(runs):
            entry['diverged'] = len(runs) - len(kept)
        out.append(entry)
    return out


def summary_markdown(summary: List[Dict[str, Any]], task_type: str) -> str:
    r"""The summary as a Markdown table (mean ± std over seeds), led by a ``cell`` column where
    the entries carry one (:func:`summarize` of a grid's runs), and a line below it that says
    which standard deviation the ± gives: the population one (``ddof=0``, as
    :func:`summarize` computes it; two seeds at 0.5 and 0.7 give 0.6 ± 0.1)."""
    keys = METRICS[task_type]
    by_cell = any('cell' in e for e in summary)
    head = (['cell'] if by_cell else []) + ['model', 'params', 'seeds'] + [
        f'test {k}' for k in keys] + ['min/run']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for e in summary:
        seeds = str(e['seeds']) + (f" ({e['diverged']} diverged)" if e.get('diverged') else '')
        cells = [_cell(str(e.get('cell', '')))] if by_cell else []
        cells += [_cell(str(e['model'])), '' if e['params'] is None else f"{e['params']:,}",
                  seeds]
        cells += [f"{e[k]:.4f} ± {e[k + '_std']:.4f}" for k in keys]
        cells.append(f"{e['minutes']:.2f}")
        lines.append('| ' + ' | '.join(cells) + ' |')
    lines += ['', SPREAD_NOTE]
    return '\n'.join(lines) + '\n'
