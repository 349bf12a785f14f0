r"""Speed and memory of MZAggregation against PyG's SetTransformerAggregation.

Forward + backward of one batch of sets, median over repeated runs, on a batch with uniform set
sizes and one with skewed (log-normal) set sizes of the same total, for

* ``pyg``: ``torch_geometric.nn.aggr.SetTransformerAggregation`` (pads every set to the largest),
* ``pyg-flat``: ``torch_mz.nn.FlatSetTransformerAggregation``, PyG's aggregation itself (its
  blocks and parameters, equal values and gradients) on the flat layout: the cost of the
  flat-layout attention alone, at PyG's FLOPs,
* ``rigid``: ``MZAggregation(value='rigid', num_generators=0)``, a standard Set Transformer on
  the flat layout with the paper's blocks (a two-layer feed-forward and rFF where PyG has one
  layer, an input projection, LayerNorms, a readout: more FLOPs than PyG's),
* ``rigid-zono``: ``MZAggregation(value='rigid', num_generators=8)``, standard attention on the
  same zonotope tokens as ``mz`` (separates the cost of the generator channel from that of the
  matrix-zonotope value operator),
* ``mz``: ``MZAggregation(value='mz')`` at the paper's defaults (n_g = 8, L = 4),
* ``rigid-unfolded``, ``mz-unfolded`` (not run by default): ``rigid`` and ``mz`` with the key map
  kept on the keys (``MZAttention(fold_keys=False)``; by default it joins the queries of blocks
  with few queries per set, such as the PMA),

each with PMA only (no encoder, no decoder) and with one SAB encoder block. Ratios are computed
from medians measured in the same run, with the models of one (block, batch) pair timed in
interleaved rounds (each round runs every model once, the order rotated by one per round).
Peak memory (``--memory``) is measured in a fresh
subprocess per configuration, of the call after one untimed call (CPU: increase of peak RSS;
CUDA: allocator peak; results files written before 2026-12-07 measured the first call).

The report is written after every (block, batch) pair: while pairs remain, to
``speed.partial.{json,md}``, marked partial (``pending``: the pairs not yet measured), which the
complete report ``speed.{json,md,png}`` replaces, so that a run cut off (Ctrl-C, a failure)
keeps the pairs it measured and leaves an earlier run's complete report alone. ``--resume``
measures only the pairs the partial report lacks (the kept rows' ``pct_of_peak`` and the report
use the matmul peak measured by the run resumed; a partial report of other options, torch
threads, torch or PyG version, or torch-scatter is refused); ``--overwrite`` measures every
pair again, and a folder holding a partial report is refused without either; a report written
by a call that resumed names the pairs it kept (``kept_pairs`` in the JSON). Ctrl-C ends a run
with one line that gives the command to go on (status 130). A folder holding the complete report
of another command (other options) is refused without ``--overwrite``, before anything is
measured; a run of the same options replaces it.

A measurement that failed (out of memory: the timings of a pair, which time its models
together, or the peak memory of one model, in its fresh process) is listed under the table with
its error (``failed`` in the JSON, only where something failed): the models that failed have no
row, the pair's ratios to them are left out, and the run goes on with the other pairs (another
error of the timings, a bug's, ends the run with its traceback). ``--resume`` measures a pair
with a failure again (every model of it). A run whose failed measurements the earlier complete
report there (of the same options) made does not replace it (it would lose them): its report
stays partial (``lost``: those measurements), and ``--resume`` measures those pairs again, or
``--overwrite`` replaces the earlier report with it.

    python benchmarks/speed.py --quick
    python benchmarks/speed.py --sets 64 --points 8192 --dim 64 --heads 4 --repeats 7 --memory
"""
import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from torch_mz.nn import FlatSetTransformerAggregation, MZAggregation, MZAttention
from torch_mz.study import (EXIT_INTERRUPTED, MeasurementFailed, PartialUnit,
                            add_partial_arguments, check_out_folder, choice_list, count_flops,
                            environment, in_fresh_process, interruptible, markdown_table,
                            matmul_peak_flops, nonnegative_float, out_of_memory, overwriting,
                            partial_problem, peak_memory_bytes, positive_int, pyplot,
                            read_partial, stale_partial_done, replace_plot, replace_problem,
                            same_settings_report, skewed_sizes, time_interleaved, uniform_sizes,
                            write_results_so_far)
from torch_mz.study.plots import save_figure

MODELS = ('pyg', 'pyg-flat', 'rigid', 'rigid-zono', 'mz')
UNFOLDED = '-unfolded'  # suffix: the model with MZAttention(fold_keys=False) everywhere
#: Every model ``--models`` takes: the default ones and the MZAggregation ones with ``-unfolded``
#: (PyG's have no MZAttention, whose key map the suffix keeps on the keys).
ALL_MODELS = MODELS + tuple(m + UNFOLDED for m in ('rigid', 'rigid-zono', 'mz'))
BLOCKS = ('pma', 'sab')
DEVICES = ('auto', 'cpu', 'cuda')  # auto: cuda where available, else cpu
BATCHES = ('uniform', 'skewed')
NAME = 'speed'  # <out>/speed.{json,md,png}: the complete report
PARTIAL = NAME + '.partial'  # <out>/speed.partial.{json,md}: a run not yet complete
#: The settings a partial report must share with a run that resumes it (``--resume``), and a
#: complete report with a run that replaces it without ``--overwrite``: resolved (``--quick``
#: is its 3 repeats, not a setting of its own, so a ``--quick`` run and one given
#: ``--repeats 3`` are the same run)
SETTINGS = ('sets', 'points', 'dim', 'heads', 'repeats', 'sigma', 'device', 'models', 'blocks',
            'memory')
#: ... and the environment's (no option sets them: torch's threads, from OMP_NUM_THREADS or the
#: cores, the versions timed, and whether PyG's blocks scatter with torch-scatter)
ENVIRONMENT = ('threads', 'torch', 'torch_geometric', 'torch_scatter')
#: What a partial report holds, as ``--resume`` / ``--overwrite`` and their messages name it
UNIT = PartialUnit('(block, batch) pairs', 'pair')


def build(model: str, block: str, dim: int, heads: int) -> torch.nn.Module:
    r"""The aggregation :obj:`model` (one of :data:`ALL_MODELS`) with PMA only
    (:obj:`block` ``'pma'``) or one SAB encoder block first (``'sab'``)."""
    if model not in ALL_MODELS:
        raise ValueError(f"Unknown model {model!r} (available: {', '.join(ALL_MODELS)})")
    if block not in BLOCKS:
        raise ValueError(f"Unknown block {block!r} (available: {', '.join(BLOCKS)})")
    if model.endswith(UNFOLDED):
        module = build(model[:-len(UNFOLDED)], block, dim, heads)
        for m in module.modules():
            if isinstance(m, MZAttention):
                m.fold_keys = False
        return module
    enc = 1 if block == 'sab' else 0
    if model == 'pyg':
        from torch_geometric.nn.aggr import SetTransformerAggregation
        return SetTransformerAggregation(dim, num_seed_points=1, num_encoder_blocks=enc,
                                         num_decoder_blocks=0, heads=heads)
    if model == 'pyg-flat':
        return FlatSetTransformerAggregation(dim, num_seed_points=1, num_encoder_blocks=enc,
                                             num_decoder_blocks=0, heads=heads)
    kwargs = dict(dim=dim, heads=heads, num_encoder_blocks=enc, encoder='sab',
                  num_decoder_blocks=0, num_seeds=1)
    if model == 'rigid':
        return MZAggregation(dim, value='rigid', num_generators=0, **kwargs)
    if model == 'rigid-zono':
        return MZAggregation(dim, value='rigid', num_generators=8, **kwargs)
    assert model == 'mz'
    return MZAggregation(dim, value='mz', num_generators=8, num_matrix_generators=4, **kwargs)


def make_batch(kind: str, sets: int, points: int, dim: int, device: torch.device, seed: int = 0,
               sigma: float = 1.0):
    sizes = uniform_sizes(sets, points) if kind == 'uniform' else skewed_sizes(
        sets, points, sigma=sigma, seed=seed)
    index = torch.repeat_interleave(torch.arange(sets), torch.tensor(sizes)).to(device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(points, dim, generator=g).to(device)
    return x, index, sizes


def step_fn(module, x, index, sets):
    def step():
        module.zero_grad(set_to_none=True)
        out = module(x, index, dim_size=sets)
        out.square().mean().backward()
    return step


def prepare(cfg: dict):
    r"""The module of one (model, block, batch) configuration, its forward + backward step and
    the row describing it."""
    torch.manual_seed(0)
    device = torch.device(cfg['device'])
    module = build(cfg['model'], cfg['block'], cfg['dim'], cfg['heads']).to(device)
    x, index, sizes = make_batch(cfg['batch'], cfg['sets'], cfg['points'], cfg['dim'], device,
                                 sigma=cfg.get('sigma', 1.0))
    step = step_fn(module, x, index, cfg['sets'])
    row = dict(model=cfg['model'], block=cfg['block'], batch=cfg['batch'],
               max_set=max(sizes), min_set=min(sizes),
               params=sum(p.numel() for p in module.parameters()))
    return step, row


def run_one(cfg: dict) -> dict:
    r"""Peak memory of one configuration (``--_one``, in a fresh process): of the call after
    one untimed call, as the timings (which start after a warm-up call) and the other scripts
    measure it; the first call also holds the process's one-time state (compiled kernels, lazily
    built buffers), which is no cost of the operator."""
    step, row = prepare(cfg)
    step()  # first call: not part of the peak
    row['peak_bytes'] = peak_memory_bytes(step, torch.device(cfg['device']))
    return row


def run_interleaved(cfgs: List[dict]) -> List[dict]:
    r"""Times the configurations of one (block, batch) pair together: every round runs each
    model's step once (:func:`~torch_mz.study.time_interleaved`), so the ratios between them
    come from the same spells of a shared machine; then counts each step's FLOPs."""
    prepared = {cfg['model']: prepare(cfg) for cfg in cfgs}
    times = time_interleaved({name: step for name, (step, _) in prepared.items()},
                             repeats=cfgs[0]['repeats'], warmup=1,
                             device=torch.device(cfgs[0]['device']))
    rows = []
    for name, (step, row) in prepared.items():
        median = float(np.median(times[name]))
        flops = count_flops(step)
        row.update(median_ms=1000 * median, times_ms=[1000 * t for t in times[name]],
                   gflop=flops / 1e9, gflop_per_s=flops / 1e9 / median)
        rows.append(row)
    return rows


def measure_memory(cfg: dict) -> Optional[int]:
    r"""Peak bytes of one configuration (:func:`run_one` in a fresh process); :obj:`None` where
    :func:`~torch_mz.study.peak_memory_bytes` cannot read it (not Linux)."""
    return in_fresh_process(__file__, dict(cfg, memory_only=True))['peak_bytes']


def memory_ratio(mine: dict, theirs: dict) -> Optional[float]:
    r"""``mine['peak_mib'] / theirs['peak_mib']``, :obj:`None` where either is unknown (not
    Linux) or the second is zero (it was a ratio to 1e-9 MiB)."""
    if mine.get('peak_mib') is None or not theirs.get('peak_mib'):
        return None
    return mine['peak_mib'] / theirs['peak_mib']


def plot(rows, path):
    r"""Bars of the median times, one panel per block of the run (both by default)."""
    plt = pyplot()
    blocks = [b for b in BLOCKS if any(r['block'] == b for r in rows)]
    if not blocks:
        return
    fig, axes = plt.subplots(1, len(blocks), figsize=(5 * len(blocks), 4), squeeze=False)
    # every model of the run, in the order first met (the -unfolded rows too)
    models = list(dict.fromkeys(r['model'] for r in rows))
    for ax, block in zip(axes[0], blocks):
        xs = np.arange(2)
        for i, model in enumerate(models):
            vals = [next((r['median_ms'] for r in rows if r['model'] == model
                          and r['block'] == block and r['batch'] == b), np.nan)
                    for b in ('uniform', 'skewed')]
            width = 0.8 / len(models)
            ax.bar(xs + (i - (len(models) - 1) / 2) * width, vals, width=width, label=model)
        ax.set_xticks(xs, ['uniform', 'skewed'])
        ax.set_yscale('log')
        ax.set_ylabel('forward+backward, median ms')
        ax.set_title('PMA only' if block == 'pma' else 'one SAB encoder + PMA')
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    r"""Refuses (argparse's usage error) what the types alone cannot: heads that do not divide
    the width, fewer points than sets, a sigma whose set sizes cannot be drawn, ``cuda`` where
    there is none; resolves ``--device auto``."""
    if args.dim % args.heads:
        parser.error(f'argument --heads: {args.heads} heads do not divide --dim {args.dim} '
                     f'(every head takes dim / heads channels)')
    if args.points < args.sets:
        parser.error(f'argument --points: {args.points} points cannot fill --sets {args.sets} '
                     f'sets (at least one point per set)')
    try:  # (a sigma whose weights overflow was refused once the timings of a block had run)
        skewed_sizes(args.sets, args.points, sigma=args.sigma)
    except ValueError as e:
        parser.error(f'argument --sigma: {e}')
    if args.device == 'auto':
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    elif args.device == 'cuda' and not torch.cuda.is_available():
        parser.error("argument --device: 'cuda' is not available here (use cpu or auto)")


def ratio_entries(rows: List[dict], pairs: List[Tuple[str, str]], memory: bool) -> List[dict]:
    r"""The ratios between the models of each (block, batch) pair of :obj:`pairs`, from the
    medians (and, with :obj:`memory`, the peaks) of :obj:`rows` measured together."""
    ratios = []
    for block, batch in pairs:
        by = {r['model']: r for r in rows if r['block'] == block and r['batch'] == batch}
        entry = dict(block=block, batch=batch)
        if 'pyg' in by and 'rigid' in by:
            entry['pyg/rigid time'] = by['pyg']['median_ms'] / by['rigid']['median_ms']
            if memory:
                entry['rigid/pyg memory'] = memory_ratio(by['rigid'], by['pyg'])
        if 'pyg' in by and 'pyg-flat' in by:
            entry['pyg/pyg-flat time'] = by['pyg']['median_ms'] / by['pyg-flat']['median_ms']
            if memory:
                entry['pyg-flat/pyg memory'] = memory_ratio(by['pyg-flat'], by['pyg'])
        if 'mz' in by and 'rigid' in by:
            entry['mz/rigid time'] = by['mz']['median_ms'] / by['rigid']['median_ms']
        for m in ('rigid', 'mz'):
            if m in by and m + UNFOLDED in by:
                entry[f'{m}/{m}{UNFOLDED} time'] = (by[m]['median_ms']
                                                   / by[m + UNFOLDED]['median_ms'])
        if 'mz' in by and 'rigid-zono' in by:
            entry['mz/rigid-zono time'] = (by['mz']['median_ms']
                                           / by['rigid-zono']['median_ms'])
        ratios.append(entry)
    return ratios


def failed_text(failed: List[dict]) -> str:
    r"""The lines under the tables that list the measurements that failed (``block``,
    ``batch``, ``model``: :obj:`None` where the timings of the pair failed, which time its
    models together, and the error of each, :obj:`failed`); ``''`` where none failed."""
    if not failed:
        return ''
    lines = ['', 'Measurements that failed (the models that failed have no row, and the ratios '
             'of their pair to them are left out):', '']
    for f in failed:
        what = ('the timings of every model (timed together)' if f['model'] is None
                else f"`{f['model']}`, peak memory")
        lines.append(f"- {f['block']}, {f['batch']}, {what}: {f['error']}")
    return '\n'.join(lines) + '\n'


def write_report(args: argparse.Namespace, env: dict, rows: List[dict],
                 pairs: List[Tuple[str, str]], peak: float, pending: int,
                 kept: Sequence[Tuple[str, str]] = (), failed: Sequence[dict] = (),
                 lost: Sequence[dict] = (), overwrite: bool = False
                 ) -> Tuple[List[dict], List[str], Optional[str]]:
    r"""Writes the report of :obj:`rows`, the models of the (block, batch) :obj:`pairs`
    measured, and of the measurements that :obj:`failed` (``block``, ``batch``, ``model``
    and ``error`` of each, :func:`failed_text`): while :obj:`pending` pairs remain, or where
    measurements failed that the earlier complete report made (:obj:`lost`: ``block``,
    ``batch`` and ``model`` of each; that report is kept), ``speed.partial.{json,md}``, marked
    partial; else ``speed.{json,md,png}``, which removes the partial report. :obj:`kept`: the
    pairs kept from the run resumed. A partial report records :obj:`overwrite` (the run
    replaces the complete report whatever fails: ``--overwrite``, or resumed from a partial
    report that records it). Returns the ratios, their columns and the note of a plot not drawn
    (else :obj:`None`)."""
    complete = not pending and not lost
    ratios = ratio_entries(rows, pairs, args.memory)
    columns = ['block', 'batch', 'model', 'max_set', 'median_ms', 'params', 'gflop',
               'gflop_per_s', 'pct_of_peak']
    if args.memory:
        columns.append('peak_mib')
    ratio_cols = ['block', 'batch', 'pyg/pyg-flat time', 'pyg/rigid time', 'mz/rigid time',
                  'mz/rigid-zono time']
    ratio_cols += [c for c in (f'rigid/rigid{UNFOLDED} time', f'mz/mz{UNFOLDED} time')
                   if any(c in r for r in ratios)]
    if args.memory:
        ratio_cols += ['pyg-flat/pyg memory', 'rigid/pyg memory']
    note = None
    if complete:  # (the plot first: the report links it where drawn)
        png = os.path.join(args.out, 'speed.png')
        note = replace_plot(png, plot, rows, png)
    # (the pairs with a failure lack a row: --resume measures them again too)
    again = (f', and the {len({(f["block"], f["batch"]) for f in failed})} with a failure '
             f'(below) again' if failed else '')
    head = '' if complete else (
        f'Partial: {pending} more (block, batch) pair(s) not measured (the run was cut off or '
        f'is still running; `--resume` measures the rest{again})\n\n') if pending else (
        f'Partial: {lost_text(lost)} failed here but were measured by the earlier '
        f'`{NAME}.json`, which is kept (`--resume` measures their pairs again; `--overwrite` '
        f'replaces it with this report)\n\n')
    resumed = (f" {len(kept)} of the (block, batch) pairs "
               f"({', '.join(f'{block} {batch}' for block, batch in kept)}) were measured by "
               f"the run resumed, with this peak; the models of each pair were measured "
               f"together." if kept else '')
    markdown = (f"# Forward+backward speed, {args.sets} sets, {args.points} points, "
                f"d={args.dim}, {args.heads} heads ({args.device})\n\n" + head +
                f"Command: `{env['command']}`  \n"
                f"torch {env['torch']}, torch_geometric {env['torch_geometric']}, "
                f"{env['threads']} threads, torch-scatter: {env['torch_scatter']}; measured "
                f"float32 matmul peak {peak:.1f} GFLOP/s (2048 x 2048). FLOPs are those of matrix "
                f"products and attention kernels counted by torch's FlopCounterMode "
                f"(forward + backward).{resumed}\n\n"
                + markdown_table(rows, columns) + '\n' + markdown_table(ratios, ratio_cols)
                + failed_text(list(failed))
                + ('' if note or not complete else '\n![plot](speed.png)\n'))
    # (the complete report's config as before: every option but --resume and --overwrite)
    config = {k: v for k, v in vars(args).items() if k not in ('resume', 'overwrite')}
    payload = dict(environment=env, config=config, matmul_peak_gflop_per_s=peak, rows=rows,
                   ratios=ratios)
    # (the keys below only where they apply: a complete report of one call where nothing
    # failed is written as before)
    if failed:
        payload['failed'] = list(failed)
    if kept:
        payload['kept_pairs'] = [dict(block=block, batch=batch) for block, batch in kept]
    if not complete:
        payload['pending'] = pending
    if lost:
        payload['lost'] = list(lost)
    if overwrite and not complete:  # (a call that resumes it replaces the earlier report too)
        payload['overwrite'] = True
    write_results_so_far(args.out, NAME, payload, markdown, complete)
    return ratios, ratio_cols, note


def lost_text(lost: Sequence[dict]) -> str:
    r"""The measurements :obj:`lost` (``block``, ``batch``, ``model``) as the report names
    them: ``'pma skewed `rigid`, sab uniform `pyg`'``."""
    return ', '.join(f"{m['block']} {m['batch']} `{m['model']}`" for m in lost)


def lost_measurements(failed: Sequence[dict], earlier: Optional[dict],
                      models: Sequence[str]) -> List[dict]:
    r"""The measurements of :obj:`failed` (``block``, ``batch``, ``model``, :obj:`None` for
    every one of :obj:`models`, timed together) that the earlier complete report
    :obj:`earlier` (of the same settings; :obj:`None`: none) made: its row of that model in
    that pair, which a report of this run in its place would lose."""
    if earlier is None:
        return []
    try:
        made = {(r['block'], r['batch'], r['model']) for r in earlier['rows']}
    except (KeyError, TypeError):  # (rows not as written: nothing known to be lost)
        return []
    lost = []
    for f in failed:
        for model in models if f['model'] is None else [f['model']]:
            if (f['block'], f['batch'], model) in made:
                lost.append(dict(block=f['block'], batch=f['batch'], model=model))
    return lost


def earlier_pairs(path: str, args: argparse.Namespace, env: Optional[dict] = None
                  ) -> Tuple[Dict[Tuple[str, str], List[dict]], Optional[float], str]:
    r"""The rows of the partial report :obj:`path` that ``--resume`` keeps, by (block, batch)
    pair (the pairs with a row of every model: one with a failure is measured again), the peak
    (GFLOP/s) it measured (:obj:`None` where nothing is kept), and a sentence on what was
    found; a file damaged or written with other :data:`SETTINGS` (or, given this run's
    environment :obj:`env`, in another :data:`ENVIRONMENT`: the times of other threads,
    versions or scatter path, which one table would mix) raises a :class:`ValueError` saying
    so (:func:`~torch_mz.study.read_partial`)."""
    if not os.path.exists(path):
        return {}, None, f'nothing to resume: no {path}; measuring every (block, batch) pair'

    def keep(earlier: dict) -> Tuple[Dict[Tuple[str, str], List[dict]], float]:
        by_pair: Dict[Tuple[str, str], List[dict]] = {}
        for row in earlier['rows']:
            by_pair.setdefault((str(row['block']), str(row['batch'])), []).append(dict(row))
        return by_pair, float(earlier['matmul_peak_gflop_per_s'])
    kept, peak = read_partial(path, args, SETTINGS, UNIT, keep=keep, env=env,
                              environment=ENVIRONMENT)
    # (only pairs with a row of every model: a pair where a measurement failed, or a file
    # written by hand, lacks some)
    kept = {pair: group for pair, group in kept.items()
            if sorted(r.get('model') for r in group) == sorted(args.models)}
    return (kept, peak if kept else None,
            f'resuming from {path}: {len(kept)} (block, batch) pair(s) kept')


def error_line(e: BaseException) -> str:
    r"""The type and first line of the error :obj:`e` (at most 200 characters of it), as the
    report lists a measurement that failed."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def print_row(row: dict, memory: bool, kept: bool = False) -> None:
    text = ''
    if memory:  # (None where the peak cannot be read: not Linux)
        text = ('  peak unknown' if row['peak_mib'] is None
                else f"  peak {row['peak_mib']:8.1f} MiB")
    print(f"{row['block']:4s} {row['batch']:8s} {row['model']:6s} median "
          f"{row['median_ms']:9.1f} ms  {row['gflop_per_s']:6.1f} GFLOP/s" + text
          + ('  (kept)' if kept else ''), flush=True)


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    parser.add_argument('--sets', type=positive_int, default=64)
    parser.add_argument('--points', type=positive_int, default=8192,
                        help='points in all (at least one per set)')
    parser.add_argument('--dim', type=positive_int, default=64)
    parser.add_argument('--heads', type=positive_int, default=4, help='must divide --dim')
    parser.add_argument('--repeats', type=positive_int, default=None,
                        help='timed rounds (default: 7, with --quick 3)')
    parser.add_argument('--sigma', type=nonnegative_float, default=1.0,
                        help='log-normal sigma of the skewed set sizes')
    parser.add_argument('--device', choices=DEVICES, default='auto',
                        help='auto: cuda where available, else cpu')
    parser.add_argument('--models', type=choice_list(ALL_MODELS), default=','.join(MODELS),
                        help=f"comma-separated, of {', '.join(ALL_MODELS)}")
    parser.add_argument('--blocks', type=choice_list(BLOCKS), default=','.join(BLOCKS))
    parser.add_argument('--memory', action='store_true', help='also measure peak memory')
    parser.add_argument('--quick', action='store_true',
                        help='fewer repeats: 3, unless --repeats is given (which wins)')
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      'speed'))
    add_partial_arguments(parser, UNIT)
    parser.add_argument('--_one', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._one:
        print(json.dumps(run_one(json.loads(args._one))))
        return None
    if args.repeats is None:  # (resolved here: the results' config records the repeats run)
        args.repeats = 3 if args.quick else 7
    check_args(parser, args)  # before any measurement
    problem = check_out_folder(args.out)  # (found only once every block was measured)
    if problem:
        parser.error(problem)
    # (a run stopped between writing its complete report and removing the partial one)
    if stale_partial_done(args.out, NAME, args, SETTINGS,
                          say=lambda note: print(note, flush=True)):
        return None
    partial = os.path.join(args.out, f'{PARTIAL}.json')
    problem = partial_problem(args.resume, args.overwrite, partial, UNIT, held_note=(
        ' (or of one whose measurements failed where the complete report beside it made them)'))
    if problem:
        parser.error(problem)
    kept: Dict[Tuple[str, str], List[dict]] = {}
    earlier_peak = None
    env = environment()
    complete = os.path.join(args.out, f'{NAME}.json')
    # (a complete report of other options is not replaced unasked; one of these options is,
    # but for the measurements that fail here, which it keeps: earlier)
    problem = replace_problem(complete, args, SETTINGS, env['command'], args.overwrite,
                              resumed=args.resume and os.path.exists(partial))
    if problem:
        parser.error(problem)
    # (--overwrite, or resuming the partial report of a call given it: replaced whatever fails)
    replacing = args.overwrite or (args.resume and overwriting(partial))
    earlier = None if replacing else same_settings_report(complete, args, SETTINGS)
    if args.resume:
        try:
            kept, earlier_peak, message = earlier_pairs(partial, args, env)
        except ValueError as e:
            parser.error(f'argument --resume: {e}')
        print(message, flush=True)
    pairs = [(block, batch) for block in args.blocks for batch in BATCHES]
    # (each pair's rows in the order of --models, as measured)
    kept = {pair: sorted(group, key=lambda r: args.models.index(r['model']))
            for pair, group in kept.items() if pair in pairs}
    if kept and earlier_peak is not None:  # (the kept rows' pct_of_peak were computed with it)
        peak = earlier_peak
        print(f'float32 matmul peak of the run resumed: {peak:.1f} GFLOP/s', flush=True)
    else:
        peak = matmul_peak_flops(device=torch.device(args.device)) / 1e9
        print(f'measured float32 matmul peak: {peak:.1f} GFLOP/s', flush=True)
    rows: List[dict] = []
    failed: List[dict] = []  # (block, batch, model and error of each measurement that failed)
    ratios: List[dict] = []
    ratio_cols: List[str] = []
    note = None
    lost: List[dict] = []  # (the measurements that failed here and the earlier report made)
    wrote = False  # (whether this call wrote a report yet)
    # (kept: the partial report resumed, else none before this call wrote a report)
    with interruptible(__file__, sys.argv[1:], parser, kept=partial if kept else None,
                       what='(block, batch) pairs') as stop:
        for done, (block, batch) in enumerate(pairs, 1):
            if (block, batch) in kept:
                group = kept[(block, batch)]
                for row in group:
                    print_row(row, args.memory, kept=True)
            else:
                cfgs = [dict(model=model, block=block, batch=batch, sets=args.sets,
                             points=args.points, dim=args.dim, heads=args.heads,
                             repeats=args.repeats, device=args.device, sigma=args.sigma)
                        for model in args.models]
                group = []
                try:
                    measured = run_interleaved(cfgs)
                except (RuntimeError, MemoryError) as e:  # (out of memory: the next pairs go on)
                    if not out_of_memory(e):  # (a bug's error, e.g. of shapes: its traceback)
                        raise
                    measured = []
                    failed.append(dict(block=block, batch=batch, model=None, error=error_line(e)))
                    print(f"{block:4s} {batch:8s} failed: {failed[-1]['error']}", flush=True)
                for cfg, row in zip(cfgs, measured):
                    if args.memory:
                        try:
                            peak_bytes = measure_memory(cfg)
                        except MeasurementFailed as e:  # (no row: the pair's others go on)
                            failed.append(dict(block=block, batch=batch, model=cfg['model'],
                                               error=error_line(e)))
                            print(f"{block:4s} {batch:8s} {cfg['model']:6s} peak memory failed: "
                                  f"{failed[-1]['error']}", flush=True)
                            continue
                        row['peak_mib'] = None if peak_bytes is None else peak_bytes / 2**20
                    row['pct_of_peak'] = 100 * row['gflop_per_s'] / peak
                    group.append(row)
                    print_row(row, args.memory)
            rows.extend(group)
            if (block, batch) in kept and (wrote or done < len(pairs)):
                continue  # (nothing new to write; every pair kept: written at the last)
            # the pairs kept not reached yet stay in the partial report (rewritten with the
            # pairs reached alone, a run stopped now lost them)
            ahead = [p for p in pairs[done:] if p in kept]
            pending = len(pairs) - done - len(ahead)
            reached = pairs[:done] + ahead
            shown = rows + [r for p in ahead for r in kept[p]]
            if not shown:  # (every pair failed so far: nothing written, an earlier report kept)
                continue
            lost = [] if pending else lost_measurements(failed, earlier, args.models)
            ratios, ratio_cols, note = write_report(
                args, env, shown, reached, peak, pending,
                kept=[p for p in pairs if p in kept], failed=failed, lost=lost,
                overwrite=replacing)
            stop.kept = partial if pending or lost else complete
            wrote = True
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if not wrote:  # (every pair failed) keep the results of an earlier run, write no empty table
        raise SystemExit(f'no (block, batch) pair was measured (see the messages above); '
                         f'nothing written to {args.out}')
    if note:
        print(note)
    print(markdown_table(ratios, ratio_cols))
    if lost:
        print(f'{lost_text(lost)} failed here but were measured by {complete}, which is kept: '
              f'this report is partial ({partial}); pass --resume to measure their pairs again, '
              f'or --overwrite to replace {complete}', file=sys.stderr, flush=True)
        print(f'wrote {args.out}/{PARTIAL}.json, {PARTIAL}.md')
        return None
    if failed:
        print(f'{len(failed)} measurement(s) failed: listed in {args.out}/speed.md',
              file=sys.stderr, flush=True)
    print(f"wrote {args.out}/speed.json, speed.md{'' if note else ', speed.png'}")
    return None


if __name__ == '__main__':
    sys.exit(main())
