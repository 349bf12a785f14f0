r"""The report: finished claims on disk, ``summary.{md,json}`` with its tables and plots, and
``finished_runs.<budget>.{md,json}`` (every finished run, the sweeps) that
``benchmarks/reproduce.py`` writes. Trains nothing, prints nothing."""
import json
import math
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from torch_mz._files import atomic_write, strict_json
from torch_mz.reproduce.budgets import BUDGETS, SWEEP_STEP, sweep_verdicts, untried_neighbours
from torch_mz.reproduce.claims import CLAIM_NAMES, CLAIMS, SWEEP_CELLS
from torch_mz.reproduce.verdict import VERDICT_RULE
from torch_mz.study import (environment, markdown_table, plot_bars, pyplot, remove_earlier_plot,
                            try_plot, write_report)
from torch_mz.study.plots import save_figure


def claim_path(out: str, claim: str, budget: str, seeds: Optional[int] = None) -> str:
    r"""Where a finished claim's records are kept: ``claims/<claim>.<budget>.json``, or for a
    claim run with :obj:`seeds` study seeds other than its budget's (``--seeds``),
    ``claims/<claim>.<budget>.seeds<N>.json`` beside it (it replaced the budget's record)."""
    tag = '' if seeds is None else f'.seeds{seeds}'
    return os.path.join(out, 'claims', f'{claim}.{budget}{tag}.json')


def save_claim(out: str, claim: str, budget: str, records: Sequence[Mapping],
               seeds: Optional[int] = None) -> str:
    r"""Writes a finished claim's :obj:`records` to :func:`claim_path` (with :obj:`seeds`, a
    seed count other than the budget's, beside the budget's own record); returns the path.
    The file is standard JSON: a NaN figure (the mean of a claim with a diverged run) is
    written as ``null``, which :func:`load_claims` reads back as NaN."""
    path = claim_path(out, claim, budget, seeds)
    text = strict_json(list(records), indent=1) + '\n'
    atomic_write(path, lambda f: f.write(text), binary=False)
    return path


def load_claims(out: str) -> List[Dict[str, object]]:
    r"""Every claim record kept under :obj:`out`, in :data:`CLAIM_NAMES` order, then by
    budget; a figure of ``ours`` (and of its ``models``) kept as ``null`` (a NaN,
    :func:`save_claim`) as NaN."""
    folder = os.path.join(out, 'claims')
    if not os.path.isdir(folder):
        return []
    order = {n: i for i, n in enumerate(CLAIM_NAMES)}
    names = sorted(os.listdir(folder), key=lambda n: (order.get(n.split('.')[0], 99), n))
    records: List[Dict[str, object]] = []
    for name in names:
        if name.endswith('.json'):
            path = os.path.join(folder, name)
            try:
                with open(path) as f:
                    got = json.load(f)
            except ValueError as e:
                raise ValueError(f"claim file '{path}' is not valid JSON ({e}); restore it "
                                 f"(e.g. with git) or delete it to rebuild the claim") from e
            if not (isinstance(got, list) and all(isinstance(r, dict) for r in got)):
                raise ValueError(f"claim file '{path}' does not hold a list of claim records; "
                                 f"restore it (e.g. with git) or delete it to rebuild the claim")
            got = [_nan_figures(r) for r in got]
            lacking = sorted({f for r in got for f in _lacking(r)})
            if lacking:  # (the summary's tables read them: a KeyError after the training)
                raise ValueError(f"claim file '{path}' holds records without "
                                 f"{', '.join(lacking)}; restore it (e.g. with git) or delete "
                                 f"it to rebuild the claim")
            records += got
    return records


def _nan_figures(record: Dict[str, Any]) -> Dict[str, Any]:
    r""":obj:`record` with the figures of ``ours`` that :func:`save_claim` wrote as ``null``
    (NaN: no finite mean, a spread of one seed, a model whose runs diverged) read back as NaN,
    as the summary's tables and plots read them (``ours.mean``, ``ours.std`` and each of
    ``ours.models``' ``r2`` and ``r2_std``)."""
    ours = record.get('ours')
    if not isinstance(ours, dict):
        return record
    ours = dict(ours, **{k: math.nan for k in ('mean', 'std') if k in ours and ours[k] is None})
    if isinstance(ours.get('models'), dict):
        ours['models'] = {m: dict(v, **{k: math.nan for k in ('r2', 'r2_std')
                                        if k in v and v[k] is None})
                          if isinstance(v, dict) else v for m, v in ours['models'].items()}
    return dict(record, ours=ours)


def _lacking(record: Mapping[str, Any]) -> List[str]:
    r"""The fields of a claim record that :func:`summary_table` and :func:`models_table` read
    and :obj:`record` lacks (or holds as another type)."""
    def number(v: Any, null: bool = True) -> bool:  # (a figure; null where the table allows)
        return (null and v is None) or (isinstance(v, (int, float)) and not isinstance(v, bool))

    lacking = [f for f in ('claim', 'verdict', 'budget') if not isinstance(record.get(f), str)]
    for field, keys in (('paper', ('value', 'source', 'text')), ('ours', ('mean', 'std'))):
        part = record.get(field)
        lacking += [f'{field}.{k}' for k in keys if not (isinstance(part, dict) and k in part)]
    paper, ours = record.get('paper'), record.get('ours')
    lacking += [f'{f}.{k} (a number)' for f, part, k in (
        ('paper', paper, 'value'), ('ours', ours, 'mean'), ('ours', ours, 'std'))
        if isinstance(part, dict) and k in part and not number(part[k])]
    epochs = record.get('epochs_run')
    if epochs and not (isinstance(epochs, dict) and all(
            k in epochs for k in ('min', 'max', 'stopped_early', 'runs'))):
        lacking.append('epochs_run.min/max/stopped_early/runs')
    elif epochs and not isinstance(epochs.get('at_cap', {}), dict):
        lacking.append('epochs_run.at_cap (an object)')
    models = ours.get('models') if isinstance(ours, dict) else None
    if models is not None and not (isinstance(models, dict) and all(  # (formatted: no null)
            isinstance(v, dict) and number(v.get('r2'), False)
            and number(v.get('r2_std'), False) for v in models.values())):
        lacking.append('ours.models[*].r2/r2_std')
    if not isinstance(record.get('command', ''), (str, type(None))):
        lacking.append('command (a text)')
    return lacking


def summary_table(records: Sequence[Mapping[str, Any]]) -> str:
    r"""The summary as a Markdown table (one row per claim record)."""
    def num(v, signed=True):
        return 'n/a' if v is None or not math.isfinite(v) else (f'{v:+.3f}' if signed
                                                                   else f'{v:.3f}')
    lines = ['| claim | paper | ours (mean ± std) | verdict | budget | n_train | epochs run | '
             'seeds |', '|---|---|---|---|---|---|---|---|']
    for r in records:
        ours, ep = r['ours'], r.get('epochs_run')
        capped = ep.get('at_cap') if ep else None  # (older records: not counted)
        # (nothing was shown both where no model ran to the cap and where it was not counted)
        cap = ('not recorded' if capped is None else
               ', '.join(f'{m} {n}' for m, n in capped.items()) or 'none')
        epochs = (f"{ep['min']}-{ep['max']} ({ep['stopped_early']}/{ep['runs']} stopped early"
                  + (f", {ep['diverged']} diverged" if ep.get('diverged') else '')
                  + f"; at the epoch cap: {cap})"
                  if ep else '')
        lines.append(f"| {r['claim']} | {num(r['paper']['value'])} ({r['paper']['source']}) | "
                     f"{num(ours['mean'])} ± {num(ours['std'], False)} | **{r['verdict']}** | "
                     f"{r['budget']} | {r.get('n_train') or ''} | {epochs} | "
                     f"{r.get('seeds') or ''} |")
    return '\n'.join(lines) + '\n'


def _figure(value: float) -> str:
    # (a NaN: a model whose runs diverged, the spread of one seed)
    return f'{value:.3f}' if math.isfinite(value) else 'n/a'


def models_table(records: Sequence[Mapping[str, Any]]) -> str:
    r"""Test R² of every model in every cell behind the records (mean ± the sample standard
    deviation over seeds, ddof 1, as the records keep it; ``n/a`` where there is none: one
    seed, diverged runs), one line per cell (several claims read the same cell, e.g. the
    uncertainty comparisons of D.3); a cell read at one budget with several seed counts (a
    claim run with ``--seeds`` beside the budget's own) names its seeds."""
    counts: Dict[Any, set] = {}
    for r in records:
        counts.setdefault((r['claim'].split(':')[0], r['budget']), set()).add(r.get('seeds'))
    lines: List[str] = []
    for r in records:
        models = r['ours'].get('models')
        if not models:
            continue
        cell = r['claim'].split(':')[0]
        seeds = (f", {r.get('seeds')} seeds" if len(counts[cell, r['budget']]) > 1 else '')
        cells = ', '.join(f"{m} {_figure(v['r2'])} ± {_figure(v['r2_std'])}"
                          for m, v in models.items())
        line = f"- {cell} ({r['budget']}{seeds}): {cells}; paper: {r['paper']['text']}"
        if line not in lines:
            lines.append(line)
    return '\n'.join(lines) + '\n'


def plot(claim, records, budget, path):
    cells = [c['label'] for c in claim.cells]
    figures = {r['claim'].split(':')[0].split(' ', 1)[1]: r['ours']['models'] for r in records}
    plot_bars(cells, list(claim.models), lambda c, m: figures[c][m]['r2'],
              lambda c, m: figures[c][m]['r2_std'], path,
              paper=lambda c, m: claim.paper_r2.get((c, m)),
              title=f'{claim.name} ({budget}): test R² (bars: ours; dashes: paper)')


def write_summary(out, minutes):
    records = load_claims(out)
    budgets = sorted({r['budget'] for r in records})
    # each claim's rows come from its own command; the Command line above the table is only
    # the invocation that last rewrote this file
    commands: Dict[str, List[str]] = {}
    for r in records:
        names = commands.setdefault(r.get('command') or '(not recorded)', [])
        name = str(r['claim']).split()[0]
        if name not in names:
            names.append(name)
    notes = ('## Commands\n\nThe `Command` line above is the invocation that last rewrote '
             'this file; each claim\'s rows come from its own command (also in '
             '`summary.json`, field `command`):\n\n'
             + '\n'.join(f"- {', '.join(names)}: `{command}`"
                          for command, names in commands.items())
             + '\n\n## Epochs run\n\nThe column `epochs run` gives the fewest and the most '
             'epochs of the runs behind a row (every model of its cell, every seed), how many '
             'of them early stopping ended before the epoch cap (a plateau of the validation '
             'loss) or diverged, and after "at the epoch cap" each model with runs at its '
             'chosen setting that trained every epoch the budget allows, with how many: its '
             'figure may still change with more epochs ("none": no run of the row trained to '
             'the cap; "not recorded": a record written before these were counted). A run '
             'whose patience ran out on its very last epoch counts at the cap, not as stopped '
             'early: it trained every epoch.'
             + '\n\n## Verdict rule\n\n' + VERDICT_RULE + '\n\n## Budgets\n\n'
             + '\n'.join(f'- `{b}`: {BUDGETS[b].note}' for b in budgets if b in BUDGETS)
             + '\n\nThe sweep cell of each task (the lr / wd chosen there, per model by the '
             'lowest validation loss, is used on every cell of that task): '
             + '; '.join(f"{t}: {c['label']}" for t, c in SWEEP_CELLS.items())
             + '. Claims with a fixed protocol train every model at its lr / wd instead, with '
             'no sweep: ' + ', '.join(f'{c.name} (lr {c.protocol[0]:g}, weight decay '
                                      f'{c.protocol[1]:g})' for c in CLAIMS.values()
                                      if c.protocol is not None)
             + '\n\n## Every model, every cell\n\nTest R² of each model, mean ± sample '
             'standard deviation over seeds (ddof 1; n/a for one seed or diverged runs):\n\n'
             + models_table(records) + '\n'
             + '\n'.join(f'![{n}]({n}.png)' for n in sorted(
                 os.path.splitext(f)[0] for f in os.listdir(out) if f.endswith('.png')))
             + '\n')
    env = environment()
    spread = ('Every ± is a sample standard deviation over seeds (ddof 1; table30: over the '
              'timing rounds): in the table, of the per-seed differences the verdict reads; '
              'under "Every model, every cell", of each model\'s test R².\n\n')
    write_report(out, 'summary', "Reproduction of the paper's claims (issue 11)", env,
                 dict(budgets=budgets), spread + summary_table(records), dict(records=records),
                 minutes, notes=notes, plot=False)


def plot_finished(claim, groups, budget, path):
    r"""Bars of the finished runs' mean test R² per cell and model (error bars: the spread of
    the finished seeds), the paper's figures as dashes; cells and models without a finished
    run are left out."""
    import numpy as np
    cells = [c['label'] for c in claim.cells if any(k[0] == c['label'] for k in groups)]
    models = [m for m in claim.models if any(k[1] == m for k in groups)]

    def r2(cell, model):
        return [r['r2'] for r in groups.get((cell, model), [])]
    plot_bars(cells, models, lambda c, m: float(np.mean(r2(c, m))) if r2(c, m) else np.nan,
              lambda c, m: float(np.std(r2(c, m), ddof=1)) if len(r2(c, m)) > 1 else 0.0, path,
              paper=lambda c, m: claim.paper_r2.get((c, m)),
              title=f'{claim.name} ({budget}, finished runs so far): test R² (dashes: paper)')


def plot_curves(claim, groups, budget, path):
    r"""The validation loss of every finished run against its epoch, one panel per cell (the
    same normalised targets for every model of a cell, so the curves compare), one colour per
    model, one line style per seed, a dot at the epoch whose weights were kept: where a curve
    has flattened before its last epoch the run reached its plateau."""
    plt = pyplot()
    cells = [c['label'] for c in claim.cells if any(k[0] == c['label'] for k in groups)]
    models = [m for m in claim.models if any(k[1] == m for k in groups)]
    colours = {m: f'C{i % 10}' for i, m in enumerate(models)}
    styles = ('-', '--', ':', '-.')
    fig, axes = plt.subplots(1, len(cells), figsize=(max(7, 5 * len(cells)), 4.4),
                             squeeze=False)
    for ax, cell in zip(axes[0], cells):
        for model in models:
            label = model  # on the model's first drawn curve
            for run in groups.get((cell, model), []):
                curve = run.get('val_loss_curve') or []
                if not curve:
                    continue
                ax.plot(range(len(curve)), curve, styles[run['seed'] % len(styles)],
                        color=colours[model], lw=1, label=label)
                label = None
                best = run.get('best_epoch')
                if best is not None and 0 <= best < len(curve):
                    ax.plot([best], [curve[best]], 'o', color=colours[model], ms=3)
        ax.set_yscale('log')
        ax.set_xlabel('epoch')
        ax.set_ylabel('validation loss (normalised targets)')
        ax.set_title(cell, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f'{claim.name} ({budget}, finished runs): validation loss by epoch\n'
                 f'(line style: seed; dot: kept epoch)', fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def sweep_tables(repro, claims):
    r"""The sweep of every task the :obj:`claims` sweep on
    (:meth:`~torch_mz.reproduce.Reproduction.sweep_landscape`), each model with every point it
    reached: ``{task: rows}``, tasks in the claims' order, each task's models in the order the
    claims name them."""
    models = {}
    for claim in claims:
        if claim.protocol is not None:
            continue
        for cell in claim.cells:
            models.setdefault(cell['task'], [])
            models[cell['task']] += [m for m in claim.models if m not in models[cell['task']]]
    return {task: repro.sweep_landscape(task, ms) for task, ms in models.items()}


def plot_sweep(task, rows, budget, path):
    r"""One panel per model: the sweep points it tried in the (lr, weight decay) plane, coloured
    by the best validation loss over the model's lowest (1 = its chosen point), labelled with
    the test R² and that ratio; the chosen point ringed, unfinished points hollow."""
    import numpy as np
    plt = pyplot()
    models = list(dict.fromkeys(r['model'] for r in rows))
    cols = min(4, len(models))
    nrows = (len(models) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 3.2 * nrows), squeeze=False)
    cmap = plt.get_cmap('viridis_r')
    for ax, model in zip(axes.flat, models):
        mine = [r for r in rows if r['model'] == model]
        done = [r for r in mine if r['done'] and np.isfinite(r['val_loss'])]
        best = min((r['val_loss'] for r in done), default=None)
        for r in mine:
            x, y = np.log10(r['lr']), np.log10(r['weight_decay'])
            if r in done and best:
                rel = r['val_loss'] / best
                ax.scatter([x], [y], s=160, color=cmap(min(1.0, (rel - 1) / 1.0)),
                           edgecolors='red' if r['chosen'] else 'black',
                           linewidths=2.5 if r['chosen'] else 0.5, zorder=3)
                ax.annotate(f"{r['r2']:.3f} ({rel:.2f})", (x, y), fontsize=6, ha='left',
                            va='center', xytext=(7, 0), textcoords='offset points')
            else:
                ax.scatter([x], [y], s=160, facecolors='none', edgecolors='grey', zorder=3)
        ax.set_title(model, fontsize=9)
        ax.set_xlabel('log10 lr', fontsize=8)
        ax.set_ylabel('log10 weight decay', fontsize=8)
        ax.margins(0.25)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(models):]:
        ax.axis('off')
    cell = next((r['cell'] for r in rows if r.get('cell')), task)
    fig.suptitle(f'{task} sweep on {cell} ({budget}): each point labelled "test R² (validation '
                 f'loss over the model\'s best)"\n(colour: that ratio, yellow = best, dark = 2x '
                 f'or more; red ring: chosen; hollow: not finished)', fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def _draw(figure: str, plot, *args, on_note=None) -> Optional[str]:
    r"""Draws :obj:`figure` as :func:`~torch_mz.study.replace_plot` does; returns the note of a
    figure not drawn, for the Markdown (which names no path of this machine). Where an earlier
    run's figure was removed, the note and which file went go to :obj:`on_note`, for the script
    to print (the figure went without a word)."""
    note = try_plot(plot, *args)
    if note is not None:
        removed = remove_earlier_plot(figure, note)
        if removed and on_note is not None:
            on_note(note + removed)
    return note


def sweep_section(repro, claims, out, budget, on_note=None, name=None):
    r"""The ``## Sweeps`` section of ``finished_runs.<budget>.md`` (its tables and plots) and its
    rows for the JSON; :obj:`on_note` as in :func:`write_runs_table`; :obj:`name`, the table's
    file name that the figures' names start with (default ``finished_runs.<budget>``)."""
    name = name or f'finished_runs.{budget}'
    parts, every = [], []
    tables = {t: rows for t, rows in sweep_tables(repro, claims).items() if rows}
    if not tables:  # nothing swept (a one-point grid, or fixed protocols only)
        return '', every
    parts.append('\n## Sweeps\n\nEvery lr / weight-decay point each model tried on each task\'s '
                 'sweep cell (seed 0), with its best validation loss (normalised targets: '
                 'the criterion), that loss over the model\'s lowest, its test R² and epochs '
                 'run. "where" says whether the chosen point lies inside the points tried '
                 '(every step the sweep\'s rule takes beyond it tried, and worse) or on their '
                 'edge (a step beyond it untried: the sweep stopped at its last round there; '
                 '"every point diverged": none learned, and the sweep stopped at the grid), '
                 'that is, whether each model was tuned to an optimum of the same search. '
                 'The rule steps beyond the edges of the box of points tried, not around '
                 'each chosen point, so "untried" lists the chosen point\'s neighbours one '
                 f'step away (lr x {SWEEP_STEP:g} and / {SWEEP_STEP:g}, weight decay x '
                 f'{SWEEP_STEP:g}) that no run tried: where it is not empty, the chosen point '
                 'is the best of the points tried, not shown to be a local optimum.\n')
    waiting = []
    for task, rows in tables.items():
        every += rows
        if not any(r['done'] for r in rows):  # no point finished: one line, no table or plot
            cell = next((r['cell'] for r in rows if r.get('cell')), task)
            models = list(dict.fromkeys(r['model'] for r in rows))
            waiting.append(f'{task} ({cell}: {len(models)} models, {len(rows)} points)')
            continue
        verdicts = sweep_verdicts(rows)
        cell = next((r['cell'] for r in rows if r.get('cell')), task)
        parts.append(f'\n### {task} ({cell})\n\n')
        parts.append(markdown_table([dict(
            model=m, chosen='' if p is None else f'lr {p[0]:g}, wd {p[1]:g}', where=w,
            points=sum(1 for r in rows if r['model'] == m),
            finished=sum(1 for r in rows if r['model'] == m and r['done']),
            untried=', '.join(f'lr {a:g} wd {b:g}' for a, b in untried_neighbours(rows, m)))
            for m, (p, w) in verdicts.items()],
            ['model', 'chosen', 'where', 'points', 'finished', 'untried']) + '\n')
        best = {}
        for r in rows:
            if r['done'] and r['val_loss'] is not None and math.isfinite(r['val_loss']):
                best[r['model']] = min(best.get(r['model'], r['val_loss']), r['val_loss'])
        table = []
        for r in sorted(rows, key=lambda r: (list(verdicts).index(r['model']), -r['lr'],
                                              r['weight_decay'])):
            table.append(dict(
                model=r['model'], lr=f"{r['lr']:g}", wd=f"{r['weight_decay']:g}",
                val_loss='' if not r['done'] else f"{r['val_loss']:.4g}",
                over_best=('' if not r['done'] or not best.get(r['model'])
                           else f"{r['val_loss'] / best[r['model']]:.2f}"),
                r2='' if not r['done'] else f"{r['r2']:.4f}",
                epochs='' if not r['done'] else str(r['epochs_run']),
                chosen='**chosen**' if r['chosen'] else ''))
        parts.append('\n' + markdown_table(table, ['model', 'lr', 'wd', 'val_loss', 'over_best',
                                                   'r2', 'epochs', 'chosen']) + '\n')
        png = f'{name}.sweep.{task}.png'
        figure = os.path.join(out, png)  # (not drawn: an earlier run's is removed)
        note = _draw(figure, plot_sweep, task, rows, budget, figure, on_note=on_note)
        parts.append(f'\n{note}\n' if note else f'\n![{task} sweep]({png})\n')
    if waiting:
        parts.append('\nNo point finished yet (the grids, in the JSON): ' + '; '.join(waiting)
                     + '.\n')
    return ''.join(parts), every


def runs_table_seeds(repro, claims) -> Optional[int]:
    r"""The seed count that :obj:`repro` restricts the runs of :obj:`claims` to where it is not
    the one each claim runs by default (its budget's, else the claim's paper count; a
    ``--seeds`` run), else :obj:`None`: :func:`write_runs_table` then writes
    ``finished_runs.<budget>.seeds<N>.*`` beside the budget's table, not over it."""
    if repro.seeds is None:
        return None
    return repro.seeds if any(repro.seeds != (repro.budget.seeds or c.paper_seeds)
                              for c in claims) else None


def runs_table_claims(claims, every: Optional[Sequence[str]] = None) -> Optional[List[str]]:
    r"""The names of :obj:`claims`, in the order of :obj:`every`, where they are fewer than
    :obj:`every` (the claims the budget's table holds; :obj:`None`: :obj:`claims` are all of
    them), else :obj:`None`: :func:`write_runs_table` then writes
    ``finished_runs.<budget>.claims-<a>+<b>.*`` beside the budget's table, not over it (a
    ``--claims`` subset)."""
    if every is None:
        return None
    names = {c.name for c in claims}
    return None if set(every) <= names else [n for n in every if n in names]


def write_runs_table(repro, claims, out, on_note=None, every=None):
    r"""``finished_runs.<budget>.{json,md}``: every finished run of :obj:`claims` at its model's
    chosen sweep point (:meth:`~torch_mz.reproduce.Reproduction.finished_runs`), one row per
    cell and model with each seed's test R² beside the paper's figure; returns the path without
    its extension. Trains nothing. Where :obj:`repro` runs another seed count than the claims'
    own (:func:`runs_table_seeds`), the table and its figures are
    ``finished_runs.<budget>.seeds<N>.*``, and where :obj:`claims` are fewer than :obj:`every`
    (the names of the claims the budget's table holds, :func:`runs_table_claims`; default
    :obj:`None`: :obj:`claims` are all of them) ``finished_runs.<budget>.claims-<a>+<b>.*``
    (``...claims-<a>.seeds<N>.*`` for both), beside the budget's, which they do not replace. A
    figure not drawn (matplotlib missing) removes an earlier run's: :obj:`on_note` (a callable
    taking a str) is told which, why and how to draw it again."""
    budget = repro.budget.name
    seeds = runs_table_seeds(repro, claims)
    subset = runs_table_claims(claims, every)
    name = (f'finished_runs.{budget}' + ('' if subset is None else f".claims-{'+'.join(subset)}")
            + ('' if seeds is None else f'.seeds{seeds}'))
    env = environment()
    stamp = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    parts = [f"# Finished runs of the claims ({budget} budget)\n\n"
             f"Command: `{env['command']}`  \n"
             f"Written {stamp} from the run records in `records/{budget}/` (nothing trained). "
             f"One row per claim cell and model: the test R² of each finished seed at the "
             f"model's swept lr / wd (a claim's fixed lr / wd where it has one, with no sweep), "
             f"their mean, the paper's figure where the claim quotes "
             f"one, and each seed's epochs run with its best epoch in brackets (0-based, as in "
             f"metrics.jsonl: 13 is the 14th; * = stopped "
             f"early by the patience rule, before the epoch cap; 'diverged' = training stopped "
             f"on a non-finite loss, the run stored as failed; otherwise at the epoch cap, a "
             f"run whose patience ran out on its last epoch included). Claims get a verdict "
             f"only in `summary.md`, once all their runs are in.\n"]
    if subset is not None:
        parts.append(f"\nWritten with `--claims {','.join(subset)}`, not every claim: the runs "
                     f"of those claims only. The table of every claim is "
                     f"`finished_runs.{budget}.md`, which this one leaves as it is.\n")
    if seeds is not None:
        parts.append(f"\nWritten with `--seeds {seeds}`, not the claims' own seed count: the "
                     f"runs of those seeds only. The table of every finished run is "
                     f"`finished_runs.{budget}.md`, which this one leaves as it is.\n")
    every = []
    for claim in claims:
        rows = repro.finished_runs(claim)
        every += rows
        parts.append(f"\n## {claim.name}: {claim.title}\n\n")
        if not rows:
            parts.append('No finished run yet.\n')
            continue
        groups = {}
        for r in rows:
            groups.setdefault((r['cell'], r['model']), []).append(r)
        table = []
        for (cell, model), runs in groups.items():
            r2 = [r['r2'] for r in runs]
            table.append(dict(
                cell=cell, model=model, lr=f"{runs[0]['lr']:g}",
                wd=f"{runs[0]['weight_decay']:g}",
                seeds=' '.join(str(r['seed']) for r in runs),
                r2=' / '.join(f'{v:.4f}' for v in r2), mean=f'{sum(r2) / len(r2):.4f}',
                paper='' if runs[0]['paper'] is None else f"{runs[0]['paper']:.3f}",
                epochs=', '.join(f"{r['epochs_run']}{'*' if r['stopped_early'] else ''}"
                                 + (' diverged' if r.get('diverged') else '')
                                 + ('' if r['best_epoch'] is None else f" ({r['best_epoch']})")
                                 for r in runs)))
        parts.append(markdown_table(table, ['cell', 'model', 'lr', 'wd', 'seeds', 'r2', 'mean',
                                            'paper', 'epochs']))
        png = f'{name}.{claim.name}.png'
        figure = os.path.join(out, png)  # (not drawn: an earlier run's is removed)
        note = _draw(figure, plot_finished, claim, groups, budget, figure, on_note=on_note)
        parts.append(f'\n{note}\n' if note else f'\n![{claim.name}]({png})\n')
        curves = f'{name}.{claim.name}.curves.png'
        figure = os.path.join(out, curves)
        note = _draw(figure, plot_curves, claim, groups, budget, figure, on_note=on_note)
        parts.append('' if note else f'\n![{claim.name}: validation curves]({curves})\n')
    path = os.path.join(out, name)
    os.makedirs(out, exist_ok=True)
    sweeps, sweep_rows = sweep_section(repro, claims, out, budget, on_note=on_note, name=name)
    parts.append(sweeps)
    text = ''.join(parts)
    lean = [{k: v for k, v in r.items() if k != 'val_loss_curve'} for r in every]  # in records/
    # standard JSON: a NaN R² (a diverged run) and the inf validation loss of a sweep point
    # whose run diverged as null
    payload = strict_json(dict(environment=env, budget=budget, written=stamp,
                               **({} if subset is None else dict(claims=subset)),
                               **({} if seeds is None else dict(seeds=seeds)), rows=lean,
                               sweeps=sweep_rows), indent=1) + '\n'
    # as a pair (as write_results): the Markdown replaces the earlier one once the JSON is
    # written in full, and the JSON replaces its own right after (an interruption between the
    # two writes left the new table beside the earlier rows)
    atomic_write(path + '.json', lambda f: f.write(payload), binary=False,
                 before_replace=lambda: atomic_write(path + '.md', lambda f: f.write(text),
                                                     binary=False))
    return path
