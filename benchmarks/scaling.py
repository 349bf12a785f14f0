r"""How MZAggregation scales with the number of points (inference).

Forward passes of ``MZAggregation`` (``--model mz``: the paper's preset, ISAB encoders + PMA;
``--model rigid``: the same with plain vector tokens; ``--model default``: the aggregation's own
default, the neighbourhood preset) under ``torch.inference_mode`` on batches of points (3D by
default, ``--in-channels``) with a fixed set size, from 10^3 to 10^6 points, processed in
groups of whole sets of about ``--chunk-size`` points (``chunk_size`` of ``MZAggregation``; the
result does not depend on it). Reports the
median time, time per point and peak memory above the resident set before the call (measured in
a fresh subprocess per size, on the second call: the first may compile kernels), and fits the
slope of log(time) against log(points): a slope near 1 is linear growth.

    python benchmarks/scaling.py --quick                  # 10^3 .. 10^5 points
    python benchmarks/scaling.py                          # 10^3 .. 10^6 points
    python benchmarks/scaling.py --model default --in-channels 8 --set-size 1 --quick
                                                          # up to 10^5 sets of one element

Results go to ``<out>/scaling_<model>[_sets_of_<k>][_in<c>][_quick|_full].*``
(:func:`results_name`), so that a run with other settings leaves the other runs' files alone.
They are written after every size: while sizes remain, to ``<name>.partial.{json,md}``, marked
partial (``pending``: the sizes not yet run), which the complete report replaces, so that a run
cut off (Ctrl-C) or stopped keeps the sizes it measured and leaves an earlier run's complete
results alone; ``--resume`` measures only the sizes the partial report lacks. A size that fails
(out of memory, say) is listed under the table with its error (``failed``), and the sizes after
it still run. A run whose failed sizes the earlier complete report there measured does not
replace it (it would lose them): its report stays partial (``lost``: those sizes), and
``--resume`` measures them again, or ``--overwrite`` replaces the earlier report with it. A
complete report there of other settings (renamed, or written by hand) is not replaced without
``--overwrite``: the run is refused before anything is measured.
"""
import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import torch

from torch_mz.nn import MZAggregation
from torch_mz.study import (EXIT_INTERRUPTED, MeasurementFailed, PartialUnit,
                            add_partial_arguments, check_out_folder, environment,
                            in_fresh_process, interruptible, markdown_table, nonnegative_int,
                            out_of_memory, overwriting, partial_problem, peak_memory_bytes,
                            positive_int, pyplot, read_partial, replace_plot, replace_problem,
                            stale_partial_done, time_call, write_results_so_far)
from torch_mz.study.plots import save_figure

SET_SIZE, IN_CHANNELS = 1024, 3  # the defaults: the paper's configuration
#: The measurement settings of the committed runs (``--chunk-size``, ``--repeats``; ``--threads``
#: defaults to this machine's thread count, 2 where they ran)
CHUNK_SIZE, REPEATS, THREADS = 131072, 3, 2
#: Runs whose results are referred to (README.md, benchmarks/README.md, benchmarks/targets.py)
#: under a name without these settings: ``--model default --set-size 1 --in-channels 8 --quick``
#: writes ``scaling_default_sets_of_1.*``.
REFERENCE = {'scaling_default_sets_of_1': dict(in_channels=8, quick=True)}
#: The settings a partial report must share with a run that resumes it (its name tells them
#: apart too; checked in case the file was renamed or written by hand)
SETTINGS = ('model', 'set_size', 'in_channels', 'chunk_size', 'repeats', 'threads', 'quick')
#: What a partial report holds, as ``--resume`` / ``--overwrite`` and their messages name it
UNIT = PartialUnit('sizes', 'size')
COLS = ['points', 'sets', 'median_s', 'us_per_point', 'peak_mib']


def results_name(model: str, set_size: int, in_channels: int, quick: bool,
                 chunk_size: int = CHUNK_SIZE, repeats: int = REPEATS,
                 threads: int = THREADS) -> str:
    r"""The results' file name (without extension) of a run: ``scaling_<model>``, then the
    settings that differ from the reference run of that model and set size (the defaults,
    in_channels 3 and the full range of sizes, unless :data:`REFERENCE` names other ones):
    ``_sets_of_<k>``, ``_in<c>``, ``_quick`` (or ``_full`` where the reference is quick),
    ``_chunk<c>`` (``--chunk-size``; ``_chunk0`` for no chunking), ``_r<n>`` (``--repeats``) and
    ``_t<n>`` (``--threads``; the committed runs used 2 threads, so a run on a machine with
    another default gets its own name). Runs that differ in any of these settings get different
    names."""
    name = f'scaling_{model}' + ('' if set_size == SET_SIZE else f'_sets_of_{set_size}')
    reference = REFERENCE.get(name, dict(in_channels=IN_CHANNELS, quick=False))
    if in_channels != reference['in_channels']:
        name += f'_in{in_channels}'
    if quick != reference['quick']:
        name += '_quick' if quick else '_full'
    if chunk_size != CHUNK_SIZE:
        name += f'_chunk{chunk_size}'
    if repeats != REPEATS:
        name += f'_r{repeats}'
    if threads != THREADS:
        name += f'_t{threads}'
    return name


def build(model: str, chunk_size, in_channels: int = 3) -> MZAggregation:
    torch.manual_seed(0)
    if model == 'default':
        return MZAggregation(in_channels, chunk_size=chunk_size).eval()
    if model == 'rigid':
        return MZAggregation(in_channels, 64, preset='paper', value='rigid', num_generators=0,
                             chunk_size=chunk_size).eval()
    return MZAggregation(in_channels, 64, preset='paper', value='mz',
                         chunk_size=chunk_size).eval()


def run_one(cfg: dict) -> dict:
    torch.set_num_threads(cfg['threads'])
    module = build(cfg['model'], cfg['chunk_size'], cfg.get('in_channels', 3))
    n, set_size = cfg['points'], cfg['set_size']
    sets = max(1, n // set_size)
    index = torch.arange(n) // set_size
    index = index.clamp(max=sets - 1)
    x = torch.randn(n, cfg.get('in_channels', 3), generator=torch.Generator().manual_seed(0))

    def step():
        with torch.inference_mode():
            module(x, index, dim_size=sets)

    if cfg.get('memory_only'):
        # one call first: where the compiled LayerNorm-Jacobian kernels run (auto mode, large
        # inputs), it compiles them, which is not the call's memory
        step()
        return dict(peak_bytes=peak_memory_bytes(step, torch.device('cpu')))
    times = time_call(step, repeats=cfg['repeats'], warmup=1)
    return dict(points=n, sets=sets, median_s=float(np.median(times)))


def measure_size(cfg: dict) -> dict:
    r"""The row of one size: the median time in this process, the peak memory in a fresh one
    (:func:`run_one`)."""
    n = cfg['points']
    row = run_one(cfg)
    peak = in_fresh_process(__file__, dict(cfg, memory_only=True))['peak_bytes']
    row['us_per_point'] = 1e6 * row['median_s'] / n
    row['peak_mib'] = None if peak is None else peak / 2**20
    return row


def loglog_slope(rows: List[dict]) -> Optional[float]:
    r"""The slope of log(time) against log(points); :obj:`None` with fewer than two sizes."""
    if len(rows) < 2:
        return None
    return float(np.polyfit(np.log([r['points'] for r in rows]),
                            np.log([r['median_s'] for r in rows]), 1)[0])


def earlier_rows(path: str, args: argparse.Namespace, command: Optional[str] = None
                 ) -> Tuple[Dict[int, dict], str]:
    r"""The measured rows of the partial report :obj:`path` (by points) that ``--resume`` keeps,
    and a sentence on what was found; a file damaged or written with other :data:`SETTINGS`
    raises a :class:`ValueError` saying so, naming the report's command and :obj:`command`, this
    run's (:func:`~torch_mz.study.read_partial`)."""
    if not os.path.exists(path):
        return {}, f'nothing to resume: no {path}; measuring every size'
    kept = read_partial(path, args, SETTINGS, UNIT, command=command,
                        keep=lambda earlier: {int(r['points']): r for r in earlier['rows']})
    return kept, f'resuming from {path}: {len(kept)} size(s) kept'


def measured_sizes(path: str) -> Set[int]:
    r"""The sizes (points) the complete report :obj:`path` measured; none where there is no
    such file or it cannot be read (a run then replaces it)."""
    try:
        with open(path) as f:
            return {int(r['points']) for r in json.load(f)['rows']}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def write_report(args: argparse.Namespace, env: dict, name: str, rows: List[dict],
                 failed: List[dict], pending: int, lost: Sequence[int] = (),
                 overwrite: bool = False) -> Optional[str]:
    r"""Writes the report of :obj:`rows` and :obj:`failed` (``points``, ``sets`` and
    ``error`` of each size that failed): while :obj:`pending` sizes remain, or where sizes
    failed that the earlier complete report measured (:obj:`lost`: it is kept),
    ``<name>.partial.{json,md}``, marked partial; else ``<name>.{json,md,png}``, which
    removes the partial report. A partial report records :obj:`overwrite` (the run replaces
    the complete report whatever fails: ``--overwrite``, or resumed from a partial report that
    records it). Returns the note of a plot not drawn, else :obj:`None`."""
    slope = loglog_slope(rows)
    complete = not pending and not lost
    note = None
    if complete:  # (the plot first: the report links it where drawn)
        png = os.path.join(args.out, f'{name}.png')
        note = replace_plot(png, plot, rows, args.model, args.set_size, slope, png)
    head = ''
    if pending:
        head = (f'Partial: {pending} more size(s) not measured (the run was cut off or is still '
                f'running; `--resume` measures the rest)\n\n')
    elif lost:
        head = (f"Partial: {', '.join(f'{n:,}' for n in lost)} points failed here but were "
                f'measured by the earlier `{name}.json`, which is kept (`--resume` measures '
                f'them again; `--overwrite` replaces it with this report)\n\n')
    lines = ''
    if failed:
        lines = '\nSizes that failed (not in the table):\n\n' + ''.join(
            f"- {f['points']:,} points: {f['error']}\n" for f in failed)
    slope_text = 'not fitted (fewer than two sizes)' if slope is None else f'{slope:.3f}'
    markdown = (f'# Inference scaling of MZAggregation ({args.model}), sets of {args.set_size} '
                f'points of width {args.in_channels}, chunk_size {args.chunk_size}\n\n'
                + head +
                f'Command: `{env["command"]}`  \n'
                f'{env["threads"]} threads, torch '
                f'{env["torch"]}\n\n{markdown_table(rows, COLS)}{lines}\nSlope of log(time) '
                f'against log(points): {slope_text}\n'
                + ('' if note or not complete else f'\n![plot]({name}.png)\n'))
    write_results_so_far(args.out, name,
                         dict(environment=env, config=vars(args), rows=rows, loglog_slope=slope,
                              failed=failed, pending=pending,
                              **({'lost': list(lost)} if lost else {}),
                              **({'overwrite': True} if overwrite and not complete else {})),
                         markdown, complete)
    return note


def plot(rows, model, set_size, slope, path):
    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.6))
    pts = [r['points'] for r in rows]
    ax[0].loglog(pts, [r['median_s'] for r in rows], marker='o', label='measured')
    ax[0].loglog(pts, [rows[0]['median_s'] * p / pts[0] for p in pts], linestyle='--',
                 label='linear')
    ax[0].set_xlabel('points')
    ax[0].set_ylabel('inference time, s')
    ax[0].legend()
    ax[1].loglog(pts, [r['peak_mib'] for r in rows], marker='o')
    ax[1].set_xlabel('points')
    ax[1].set_ylabel('peak memory above baseline, MiB')
    fig.suptitle(f'MZAggregation ({model}), sets of {set_size}, slope '
                 + ('-' if slope is None else f'{slope:.2f}'))
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    parser.add_argument('--quick', action='store_true', help='10^3 to 10^5 points')
    parser.add_argument('--model', default='mz', choices=['mz', 'rigid', 'default'])
    parser.add_argument('--in-channels', type=positive_int, default=IN_CHANNELS,
                        help='input width')
    parser.add_argument('--set-size', type=positive_int, default=SET_SIZE)
    parser.add_argument('--chunk-size', type=nonnegative_int, default=CHUNK_SIZE,
                        help="MZAggregation's chunk_size (0: no chunking)")
    parser.add_argument('--repeats', type=positive_int, default=REPEATS)
    parser.add_argument('--threads', type=positive_int, default=torch.get_num_threads())
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      'scaling'))
    add_partial_arguments(parser, UNIT, overwrite_note=', and replace the complete report there '
                          'even where sizes it measured fail here')
    parser.add_argument('--_one', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._one:
        print(json.dumps(run_one(json.loads(args._one))))
        return None
    problem = check_out_folder(args.out)  # (found only once the first size was measured)
    if problem:
        parser.error(problem)
    name = results_name(args.model, args.set_size, args.in_channels, args.quick,
                        chunk_size=args.chunk_size, repeats=args.repeats, threads=args.threads)
    # (a run stopped between writing its complete report and removing the partial one)
    if stale_partial_done(args.out, name, args, SETTINGS,
                          say=lambda note: print(note, flush=True)):
        return None
    partial = os.path.join(args.out, f'{name}.partial.json')
    problem = partial_problem(args.resume, args.overwrite, partial, UNIT, held_note=(
        ' (or of one whose sizes failed where the complete report beside it measured them)'))
    if problem:
        parser.error(problem)
    complete = os.path.join(args.out, f'{name}.json')
    env = environment()
    # (its name tells the settings: another command's report there was renamed or hand-made)
    problem = replace_problem(complete, args, SETTINGS, env['command'],
                              args.overwrite, resumed=args.resume and os.path.exists(partial))
    if problem:
        parser.error(problem)
    # (a run whose sizes fail where the earlier complete report measured them does not replace
    # it, but with --overwrite, or resuming the partial report of a call given it)
    replacing = args.overwrite or (args.resume and overwriting(partial))
    earlier = set() if replacing else measured_sizes(complete)
    kept: Dict[int, dict] = {}
    if args.resume:
        try:
            kept, message = earlier_rows(partial, args, env['command'])
        except ValueError as e:
            parser.error(f'argument --resume: {e}')
        print(message, flush=True)
    top = 5 if args.quick else 6
    sizes = [int(round(10**e)) for e in np.arange(3, top + 0.01, 0.5)]
    rows: List[dict] = []
    failed: List[dict] = []
    note = None
    # (kept: the partial report resumed, else none before this call wrote a report)
    with interruptible(__file__, sys.argv[1:], parser, kept=partial if kept else None,
                       what='sizes') as stop:
        for done, n in enumerate(sizes, 1):
            cfg = dict(model=args.model, points=n, set_size=args.set_size, repeats=args.repeats,
                       threads=args.threads, chunk_size=args.chunk_size or None,
                       in_channels=args.in_channels)
            try:
                row = kept[n] if n in kept else measure_size(cfg)
            except (MeasurementFailed, RuntimeError, MemoryError) as e:  # (the next sizes go on)
                if not (isinstance(e, MeasurementFailed) or out_of_memory(e)):
                    raise  # (a bug's error, e.g. of shapes, not memory running out: its traceback)
                error = (str(e).strip().splitlines() or [''])[0][:200]
                failed.append(dict(points=n, sets=max(1, n // args.set_size),
                                   error=f'{type(e).__name__}: {error}'))
                print(f'{n:>9,d} points: failed: {failed[-1]["error"]}', flush=True)
            else:
                rows.append(row)
                peak = row['peak_mib']
                print(f"{n:>9,d} points: {row['median_s']:.3f} s, "
                      f"{row['us_per_point']:.2f} us/point, "
                      + ('peak unknown' if peak is None else f'peak {peak:.0f} MiB')
                      + (' (kept)' if n in kept else ''), flush=True)
            # the kept sizes not reached yet stay in the partial report (rewritten with the
            # sizes reached alone, a run stopped while it measured again a size that had failed
            # lost them); where only kept sizes remain, it holds them all already
            ahead = [kept[m] for m in sizes[done:] if m in kept]
            pending = len(sizes) - done - len(ahead)
            # (a run whose sizes all failed so far leaves the earlier results alone)
            lost = [] if pending else [f['points'] for f in failed if f['points'] in earlier]
            if (rows or ahead) and (pending or done == len(sizes)):
                note = write_report(args, env, name, rows + ahead, failed, pending=pending,
                                    lost=lost, overwrite=replacing)
                stop.kept = partial if pending or lost else complete
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if not rows:
        raise SystemExit(f'no size was measured (see the messages above); nothing written to '
                         f'{args.out}')
    if note:
        print(note)
    print(markdown_table(rows, COLS))
    slope = loglog_slope(rows)
    print(f"log-log slope {'-' if slope is None else f'{slope:.3f}'}; wrote "
          f"{args.out}/{name}{'.partial' if lost else ''}.*")
    if lost:
        print(f"{', '.join(f'{n:,}' for n in lost)} points failed here but were measured by "
              f'{complete}, which is kept: this report is partial ({partial}); pass --resume to '
              f'measure them again, or --overwrite to replace {complete}', file=sys.stderr,
              flush=True)
    return None


if __name__ == '__main__':
    sys.exit(main())
