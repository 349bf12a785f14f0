r"""Point-cloud training steps of the model presets: time, throughput and efficiency.

One AdamW step (forward, cross-entropy on 40 classes, backward, update) and one inference
forward (``eval()``, no gradients) of each preset on a batch of ``--clouds`` point clouds of
``--points`` 3-D points (ModelNet40's batch shape; random points, since speed does not depend on
them). Reported per preset: median step time, points per second, FLOPs per step (matrix products
and attention kernels, counted by torch's FlopCounterMode), the achieved fraction of the measured
float32 matrix-product peak, the bytes its operators read and write (an unfused estimate,
:func:`torch_mz.study.traffic.count_bytes`) and the achieved fraction of the measured memory
bandwidth, median inference time, and the ratios to ``rigid`` measured in the same run.
Plain rows run the library's defaults: for the MZ presets at this size, the LayerNorm Jacobian
on generators runs as compiled kernels (:mod:`torch_mz.nn.fused`, auto mode; compiled in the
untimed first calls). ``+eager`` rows keep the eager
function (``set_fused_kernels(False)``), ``+fused`` rows compile it from the first call
(``set_fused_kernels(True)``), ``+keep`` rows with glibc's malloc keeping freed memory
for reuse (:func:`torch_mz.runtime.keep_freed_memory`), ``+compile`` rows the whole model through
``torch.compile`` (inductor; compiling happens in the untimed first calls, reported as
``first_calls_s``), ``+groups`` rows an MZ-Set-Transformer preset with ``checkpoint='auto'``
(the aggregation's default, not the models': batches of more than 65,536 points at ``dim = 64``
are encoded in groups of whole sets recomputed in the backward pass), ``+whole`` rows one with
``chunk_size=None`` (the whole batch at once in training and inference: the presets group
large inputs when no gradients are recorded, and, where glibc's ``malloc`` does not keep freed
memory, in training too and in smaller groups in inference,
:func:`torch_mz.nn.aggr.malloc_chunk_rows`: ``mz`` at 32 x 1,024 points in groups of 8,192
rows, since 2026-12-05; the plain rows of earlier runs trained the whole batch), ``+kept``
rows one with ``chunk_size=4096, checkpoint=False`` (groups of whole sets of 4,096 rows,
every activation kept, nothing recomputed: the same computation in smaller tensors, in
training and inference, but for the order in which dropout masks are drawn), ``+thp``
rows a process started with
``THP_MEM_ALLOC_ENABLE=1`` (PyTorch's switch, read once at import, for 2 MiB pages on blocks of
2 MiB and more; every other row runs with it set to 0). Every row runs in a fresh process, which
also gives its peak resident set (the process's, import of torch included, over the timed
training steps and inference calls). The paper's Table 30 reports ``mz`` / standard at
2.2-5.5x for training and 2.4-2.7x for inference.

EGNN is fully connected inside each set by default; on 1,024 points that is a million edges per
cloud (tens of GB of edge features), so here it runs on a radius graph (``--egnn-radius``, on
points uniform in the unit ball: about 16 neighbours per point), as EGNN is used on point
clouds.

With ``--rounds R`` every row runs R times, round by round (all rows once per round), and each
row pools its calls of all rounds (``calls``: how many each figure is the median of, fewer
where a round failed); the ratios to ``rigid`` within each round are reported too, so that a
slow spell of a shared host shows as spread instead of as a ratio. A measurement that failed
(out of memory, say) is listed under the table with its error (``failed`` in the JSON).

The report is written after every measurement: while measurements remain, to
``training_step.partial.{json,md}``, marked partial (``pending``: the measurements, row x round,
not yet made; ``measured``: those made), which the complete report
``training_step.{json,md,png}`` replaces, so that a run cut off (Ctrl-C, a failure) keeps what
it measured and leaves an earlier run's complete report alone. ``--resume`` makes only the
measurements the partial report lacks (failed ones again); without it, ``--overwrite`` makes
every one again, and a folder holding a partial report is refused without either. Ctrl-C ends
a run with one line that gives the command to go on (status 130). A folder holding the complete
report of another command (other options) is refused without ``--overwrite``, before anything
is measured; a run of the same options replaces it, unless rows that it measured failed in every
round here: their earlier report is then kept, this run's stays partial (``lost``: those rows),
and ``--resume`` makes them again, or ``--overwrite`` replaces the earlier report with it.

With ``--flops-only`` it only counts the FLOPs of one training step and one inference call of
each preset (no timing, so it need not run on a quiet machine) and writes
``training_step_flops.{json,md}``, at its end; a folder holding such a report of other options
(:data:`FLOPS_SETTINGS`) is refused without ``--overwrite``, before anything is counted, naming
both commands.

    python benchmarks/training_step.py --quick
    python benchmarks/training_step.py
    python benchmarks/training_step.py --flops-only --models rigid,st-large,mz-slim,mz,egnn
    python benchmarks/training_step.py --rounds 3 --models rigid,mz,rigid+keep,mz+keep
"""
import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from torch_mz.models import PRESETS as MODEL_PRESETS
from torch_mz.models import count_parameters
from torch_mz.nn import set_fused_kernels, tanh_kernel_faster
from torch_mz.runtime import keep_freed_memory
from torch_mz.study import (EXIT_INTERRUPTED, MeasurementFailed, PartialUnit,
                            add_partial_arguments, check_out_folder, count_flops,
                            environment, in_fresh_process, interruptible, markdown_table,
                            matmul_peak_flops, overwriting, partial_problem, positive_float,
                            positive_int, process_peak_rss_bytes, pyplot, read_partial,
                            replace_plot, replace_problem, same_settings_report, time_call,
                            stale_partial_done, write_results, write_results_so_far)
from torch_mz.study.plots import save_figure
from torch_mz.study.traffic import count_bytes, memory_bandwidth
from torch_mz.study.workloads import build, make_batch, preset_calls

PRESETS = ('rigid', 'st-large', 'mz-slim', 'mz', 'mz-slim+eager', 'mz+eager', 'egnn',
           'rigid+keep', 'st-large+keep', 'mz-slim+keep', 'mz+keep', 'mz-slim+eager+keep',
           'mz+eager+keep', 'rigid+compile+keep', 'mz+compile+keep', 'egnn+keep')
FUSED = '+fused'  # suffix: the preset with torch_mz.nn.set_fused_kernels(True)
EAGER = '+eager'  # suffix: the preset with torch_mz.nn.set_fused_kernels(False)
KEEP = '+keep'  # suffix: the preset with torch_mz.runtime.keep_freed_memory()
COMPILE = '+compile'  # suffix: the whole model through torch.compile (inductor)
WHOLE = '+whole'  # suffix: an MZ-Set-Transformer preset with chunk_size=None (no groups)
GROUPS = '+groups'  # suffix: an MZ-Set-Transformer preset with checkpoint='auto' (recomputed)
KEPT = '+kept'  # suffix: an MZ-Set-Transformer preset encoding groups of KEPT_ROWS rows, kept
#: Rows per group of the ``+kept`` rows (whole sets; four clouds of 1,024 points)
KEPT_ROWS = 4096
THP = '+thp'  # suffix: the row's process started with THP_MEM_ALLOC_ENABLE=1 (2 MiB pages)
NAME = 'training_step'  # <out>/training_step.{json,md,png}: the complete report
PARTIAL = NAME + '.partial'  # <out>/training_step.partial.{json,md}: a run not yet complete
#: The settings a partial report must share with a run that resumes it (``--resume``), and a
#: complete report with a run that replaces it without ``--overwrite``: resolved (``--quick``
#: is its 8 clouds and 3 repeats, not a setting of its own, so a ``--quick`` run and one given
#: ``--clouds 8 --repeats 3`` are the same run)
SETTINGS = ('models', 'clouds', 'points', 'repeats', 'rounds', 'threads', 'device',
            'egnn_radius')
#: ... as a complete report written before ``--rounds`` was an option ran them (its config has
#: no ``rounds``): in one round, so that a run of more rounds does not replace it unasked
PREDATED = dict(rounds=1)
#: What a partial report holds, as ``--resume`` / ``--overwrite`` and their messages name it
UNIT = PartialUnit('measurements', 'measurement', 'make')
FLOPS_NAME = 'training_step_flops'  # <out>/training_step_flops.{json,md}: --flops-only's report
#: The settings a ``--flops-only`` report must share with a run that replaces it without
#: ``--overwrite``: those that change a count (nothing is timed: not the repeats, rounds or
#: threads)
FLOPS_SETTINGS = ('models', 'clouds', 'points', 'device', 'egnn_radius')
#: The options of the MZ-Set-Transformer body each suffix sets.
BODY_OPTIONS = {WHOLE[1:]: dict(chunk_size=None), GROUPS[1:]: dict(checkpoint='auto'),
                KEPT[1:]: dict(chunk_size=KEPT_ROWS, checkpoint=False)}


def split_name(name: str):
    r"""``'mz+fused+keep'`` -> ``('mz', {'fused', 'keep'})``."""
    preset, *flags = name.split('+')
    unknown = set(flags) - {FUSED[1:], EAGER[1:], KEEP[1:], COMPILE[1:], WHOLE[1:], GROUPS[1:],
                            KEPT[1:], THP[1:]}
    if unknown:
        raise ValueError(f'unknown row suffixes {sorted(unknown)} in {name!r} (+fused, +eager, '
                         f'+keep, +compile, +whole, +groups, +kept, +thp)')
    if len({WHOLE[1:], GROUPS[1:], KEPT[1:]} & set(flags)) > 1:
        raise ValueError(f'{name!r}: +whole, +groups and +kept exclude each other')
    if {FUSED[1:], EAGER[1:]} <= set(flags):
        raise ValueError(f'{name!r}: +fused and +eager exclude each other')
    return preset, set(flags)


def row_names(text: str) -> List[str]:
    r"""``--models``: a comma-separated list of distinct row names, each a preset of
    :func:`torch_mz.models.build_model` with optional suffixes (``'rigid,mz+keep'``). An unknown
    preset is refused here (argparse's usage error); unknown or conflicting suffixes by
    :func:`check_rows`."""
    names = [name.strip() for name in text.split(',')]
    if not text.strip() or not all(names):
        raise argparse.ArgumentTypeError(f'expected a comma-separated list, got {text!r}')
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{', '.join(repeated)} given twice in {text!r}")
    unknown = [name for name in names if name.split('+')[0] not in MODEL_PRESETS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown preset in {', '.join(map(repr, unknown))} (choose from "
            f"{', '.join(MODEL_PRESETS)}, each with optional suffixes +fused, +eager, +keep, "
            f"+compile, +whole, +groups, +kept, +thp)")
    return names


def measure(name: str, args, pos, batch, y) -> dict:
    r"""One row, in this process (``--_one`` runs it in a fresh one)."""
    preset, flags = split_name(name)
    if THP[1:] in flags and os.environ.get('THP_MEM_ALLOC_ENABLE') != '1':
        raise MeasurementFailed('a +thp row runs in a process started with '
                                'THP_MEM_ALLOC_ENABLE=1 (PyTorch reads it once, at import)')
    if 'keep' in flags and not keep_freed_memory():
        raise MeasurementFailed('keep_freed_memory() does not apply here (not glibc)')
    # compiling happens in the untimed first calls
    set_fused_kernels(True if 'fused' in flags else False if 'eager' in flags else None)
    try:
        return _measure(name, preset, args, pos, batch, y, compiled='compile' in flags,
                        body=body_options(flags))
    finally:
        set_fused_kernels(None)  # the default


def measure_one(config: dict) -> dict:
    args = argparse.Namespace(**config['args'])
    torch.set_num_threads(args.threads)
    pos, batch, y = make_batch(args.clouds, args.points)
    return measure(config['name'], args, pos, batch, y)


def transparent_hugepages() -> Optional[str]:
    r"""Linux's transparent-huge-page mode (``'always'``, ``'madvise'`` or ``'never'``), on which
    ``THP_MEM_ALLOC_ENABLE`` depends (PyTorch asks for such pages with ``madvise``); :obj:`None`
    where it cannot be read (not Linux)."""
    try:
        with open('/sys/kernel/mm/transparent_hugepage/enabled') as f:
            text = f.read()
    except OSError:
        return None
    chosen = [w[1:-1] for w in text.split() if w.startswith('[') and w.endswith(']')]
    return chosen[0] if chosen else None


def check_rows(names: List[str], radius: float) -> None:
    r"""Refuses, before anything is measured, a row name with unknown or conflicting suffixes,
    ``+whole`` / ``+groups`` on a preset that is not an MZ-Set-Transformer, and ``+thp`` where
    Linux gives no transparent huge pages on request (``madvise``: the only mode in which the
    switch changes anything)."""
    for name in names:
        preset, flags = split_name(name)
        if body_options(flags):
            build(preset, radius, body_options(flags))
        if THP[1:] in flags and transparent_hugepages() != 'madvise':
            raise ValueError(f"{name!r}: +thp needs Linux's transparent huge pages in 'madvise' "
                             f"mode (here: {transparent_hugepages()!r})")


def body_options(flags) -> dict:
    r"""The aggregation options a row's suffixes set (``+whole``, ``+groups``, ``+kept``)."""
    return {k: v for flag in sorted(flags) for k, v in BODY_OPTIONS.get(flag, {}).items()}


def _calls(preset: str, args, pos, batch, y, body: Optional[dict] = None):
    r"""The preset's model and its two measured calls
    (:func:`torch_mz.study.workloads.preset_calls`)."""
    return preset_calls(preset, pos, batch, y, args.device, args.egnn_radius, body)


def _measure(name: str, preset: str, args, pos, batch, y, compiled: bool = False,
             body: Optional[dict] = None) -> dict:
    device = torch.device(args.device)
    model, train_step, infer = _calls(preset, args, pos, batch, y, body)
    # the timed calls run the compiled model for '+compile' rows (compiling in the warm-up
    # calls, once for training and once for eval mode); the counters run the eager one (the
    # same operations; compiled graphs run under a dispatch mode are not what is timed)
    runner = torch.compile(model) if compiled else model

    start = time.perf_counter()
    train_step(runner)  # the first call (compiles for '+compile' and auto rows), untimed
    infer(runner)
    first_call_s = time.perf_counter() - start
    step_times = time_call(lambda: train_step(runner), repeats=args.repeats, warmup=0,
                           device=device)
    infer_times = time_call(lambda: infer(runner), repeats=args.repeats, warmup=0, device=device)
    peak_rss = (process_peak_rss_bytes() or float('nan')) / 2**20  # before the counters
    flops = count_flops(train_step)
    infer_flops = count_flops(infer)
    step = float(np.median(step_times))
    return dict(model=name, params=count_parameters(model), step_s=step,
                step_times_s=step_times, points_per_s=pos.size(0) / step,
                gflop_per_step=flops / 1e9, gflop_per_s=flops / 1e9 / step,
                gb_per_step=count_bytes(train_step) / 1e9,
                infer_s=float(np.median(infer_times)), infer_times_s=infer_times,
                infer_gflop=infer_flops / 1e9,
                infer_gb=count_bytes(infer) / 1e9, peak_rss_mib=peak_rss,
                first_calls_s=first_call_s,
                # auto mode's tanh in this row's process (None: never measured, e.g. no
                # generators, small inputs or mode on/off; torch_mz.nn.fused.tanh_kernel_faster)
                tanh_kernel_faster=tanh_kernel_faster())


def combine_rounds(by_round: List[Optional[dict]], points: int) -> dict:
    r"""One row from the measurements of one preset in several rounds (:obj:`None` for a round
    where it failed): the medians of all their calls (``calls``: how many, per figure), each
    round's own median (``step_s_rounds``, ``infer_s_rounds``; :obj:`None` for a failed round),
    the rounds measured (``rounds``), the largest peak resident set and the first measured
    round's first calls."""
    measured = [m for m in by_round if m is not None]
    row = dict(measured[0])
    step_times = [t for m in measured for t in m['step_times_s']]
    infer_times = [t for m in measured for t in m['infer_times_s']]
    step = float(np.median(step_times))
    row.update(step_s=step, step_times_s=step_times, points_per_s=points / step,
               gflop_per_s=row['gflop_per_step'] / step,
               infer_s=float(np.median(infer_times)), infer_times_s=infer_times,
               step_s_rounds=[None if m is None else m['step_s'] for m in by_round],
               infer_s_rounds=[None if m is None else m['infer_s'] for m in by_round],
               peak_rss_mib=max(m['peak_rss_mib'] for m in measured), rounds=len(measured),
               calls=len(step_times))
    return row


def count_preset_flops(name: str, args, pos, batch, y) -> dict:
    r"""FLOPs of one training step and one inference call of a preset, the calls the timed rows
    make (the kernel and memory flags do not change them: the counter runs the eager operators
    either way; ``+groups`` and ``+whole`` do, and are applied)."""
    preset, flags = split_name(name)
    model, train_step, infer = _calls(preset, args, pos, batch, y, body_options(flags))
    return dict(model=name, params=count_parameters(model),
                gflop_per_step=count_flops(train_step) / 1e9, infer_gflop=count_flops(infer) / 1e9)


def flops_only(args) -> None:
    pos, batch, y = make_batch(args.clouds, args.points)
    rows = []
    for name in args.models:
        rows.append(count_preset_flops(name, args, pos, batch, y))
        print(f"{name:9s} step {rows[-1]['gflop_per_step']:6.2f} GFLOP  inference "
              f"{rows[-1]['infer_gflop']:6.2f} GFLOP", flush=True)
    ref = next((r for r in rows if r['model'] == 'rigid'),
               next((r for r in rows if r['model'] == 'rigid' + KEEP), None))
    for r in rows:
        if ref is not None:
            r['flops / rigid'] = r['gflop_per_step'] / ref['gflop_per_step']
            r['infer flops / rigid'] = r['infer_gflop'] / ref['infer_gflop']
    env = environment()
    cols = ['model', 'params', 'gflop_per_step', 'infer_gflop', 'flops / rigid',
            'infer flops / rigid']
    markdown = (f'# FLOPs of a training step and of inference, {args.clouds} clouds x '
                f'{args.points} points, 40 classes\n\n'
                f"Command: `{env['command']}`  \n"
                f"torch {env['torch']}. Matrix products and attention kernels, counted by "
                f"`torch_mz.study.count_flops` (torch's FlopCounterMode, plus the CPU "
                f"attention kernels it skips); element-wise work not included. The training "
                f"step is forward, cross-entropy, backward and the AdamW update (which has no "
                f"matrix products), as in the timed rows; inference is one `eval()` forward "
                f"without gradients.\n\n" + markdown_table(rows, cols))
    write_results(args.out, FLOPS_NAME, dict(environment=env, config=vars(args), rows=rows),
                  markdown)
    print(f'wrote {args.out}/{FLOPS_NAME}.json, .md')


def failed_text(failed: List[dict], rows: List[dict], rounds: int) -> str:
    r"""The lines under the table that list the measurements that failed (``model``, ``round``
    and the error's first line of each, :obj:`failed`), so that a row missing from the table,
    or one that pools fewer calls, is said to be so; ``''`` where none failed."""
    if not failed:
        return ''
    shown = {r['model'] for r in rows}
    lines = ['', 'Calls that failed (a row that failed in every round is not in the table; one '
             'that failed in some rounds pools the calls of the others, `calls`):', '']
    for f in failed:
        where = f", round {f['round']}" if rounds > 1 else ''
        gone = '' if f['model'] in shown else ' (not in the table)'
        lines.append(f"- `{f['model']}`{where}{gone}: {f['error']}")
    return '\n'.join(lines) + '\n'


def plot(rows, path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = [r['model'] for r in rows]
    xs = np.arange(len(rows))
    axes[0].bar(xs - 0.2, [r['step_s'] for r in rows], 0.4, label='training step')
    axes[0].bar(xs + 0.2, [r['infer_s'] for r in rows], 0.4, label='inference')
    axes[0].set_ylabel('median seconds per batch')
    axes[0].set_xticks(xs, names)
    axes[0].legend()
    axes[1].bar(xs - 0.2, [r['pct_of_peak'] for r in rows], 0.4, label='% of matmul peak')
    axes[1].bar(xs + 0.2, [r['pct_of_bandwidth'] for r in rows], 0.4,
                label='% of memory bandwidth')
    axes[1].axhline(40, color='k', ls='--', lw=1, label='40% of peak: target')
    axes[1].set_ylabel('training step')
    axes[1].set_xticks(xs, names)
    axes[1].legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def table_rows(runs: Dict[str, List[Optional[dict]]], args, peak: float,
               bandwidth: float) -> List[dict]:
    r"""The rows of the report: each row name's measurements in every round (:obj:`None`
    where it failed or was not run yet) pooled (:func:`combine_rounds`), with its fractions
    of the measured :obj:`peak` (GFLOP/s) and :obj:`bandwidth` (GB/s) and its ratios to
    ``rigid``; a row name with no measurement is left out."""
    rows = []
    for name, by_round in runs.items():
        if all(m is None for m in by_round):
            continue
        row = combine_rounds(by_round, args.points * args.clouds)
        row['pct_of_peak'] = 100 * row['gflop_per_s'] / peak
        row['pct_of_bandwidth'] = 100 * row['gb_per_step'] / row['step_s'] / bandwidth
        row['infer_pct_of_bandwidth'] = 100 * row['infer_gb'] / row['infer_s'] / bandwidth
        rows.append(row)
    ref = next((r for r in rows if r['model'] == 'rigid'),
               next((r for r in rows if r['model'] == 'rigid' + KEEP), None))
    if ref is not None:
        for r in rows:
            r['step / rigid'] = r['step_s'] / ref['step_s']
            r['inference / rigid'] = r['infer_s'] / ref['infer_s']
            r['flops / rigid'] = r['gflop_per_step'] / ref['gflop_per_step']
            r['infer flops / rigid'] = r['infer_gflop'] / ref['infer_gflop']
            r['bytes / rigid'] = r['gb_per_step'] / ref['gb_per_step']
            r['infer bytes / rigid'] = r['infer_gb'] / ref['infer_gb']
    for r in rows:  # the same ratios to the rigid row run alike (memory kept, body options)
        flags = split_name(r['model'])[1]
        base, alike = None, set()
        for alike in (flags & {KEEP[1:], WHOLE[1:], GROUPS[1:], KEPT[1:], THP[1:]},
                      flags & {KEEP[1:]}):
            base = next((b for b in rows if split_name(b['model']) == ('rigid', alike)), None)
            if alike and base is not None:
                break
        if base is not None and alike:
            r['step / rigid'] = r['step_s'] / base['step_s']
            r['inference / rigid'] = r['infer_s'] / base['infer_s']
            if alike & set(BODY_OPTIONS):  # FLOPs and bytes of the same grouping
                r['flops / rigid'] = r['gflop_per_step'] / base['gflop_per_step']
                r['infer flops / rigid'] = r['infer_gflop'] / base['infer_gflop']
                r['bytes / rigid'] = r['gb_per_step'] / base['gb_per_step']
                r['infer bytes / rigid'] = r['infer_gb'] / base['infer_gb']
        else:
            base = ref
        if base is not None and args.rounds > 1:  # the ratio within each round: its spread
            for key, of in (('step / rigid by round', 'step_s_rounds'),
                            ('inference / rigid by round', 'infer_s_rounds')):
                r[key] = [None if a is None or b is None else a / b
                          for a, b in zip(r[of], base[of])]  # None: a round without both
    return rows


def write_report(args, env: dict, runs: Dict[str, List[Optional[dict]]], failed: List[dict],
                 peak: float, bandwidth: float, minutes: float, pending: int,
                 earlier_minutes: float = 0.0, lost: Sequence[str] = (),
                 overwrite: bool = False) -> Tuple[List[dict], Optional[str]]:
    r"""Writes the report of :obj:`runs` (each row name's measurements in every round,
    :obj:`None` where it failed or was not made yet) and :obj:`failed`: while :obj:`pending`
    measurements remain, or where rows failed in every round that the earlier complete report
    measured (:obj:`lost`: their names; that report is kept),
    ``<out>/training_step.partial.{json,md}``, marked partial (``pending`` and ``measured``,
    the measurements themselves, for ``--resume``, and ``lost``); else
    ``<out>/training_step.{json,md,png}``, which removes the partial report. :obj:`minutes` is
    the time of the measurements, :obj:`earlier_minutes` of them in the run resumed. A partial
    report records :obj:`overwrite` (the run replaces the complete report whatever fails:
    ``--overwrite``, or resumed from a partial report that records it). Writes nothing where
    no row was measured (an earlier run's report is kept). Returns the rows and the note of a
    plot not drawn (else :obj:`None`)."""
    rows = table_rows(runs, args, peak, bandwidth)
    if not rows:
        return rows, None
    complete = not pending and not lost
    cols = ['model', 'params', 'step_s', 'points_per_s', 'gflop_per_step', 'pct_of_peak',
            'gb_per_step', 'pct_of_bandwidth', 'infer_s', 'infer_gflop', 'infer_gb',
            'infer_pct_of_bandwidth',
            'peak_rss_mib', 'first_calls_s', 'calls', 'step / rigid', 'inference / rigid',
            'flops / rigid', 'infer flops / rigid', 'bytes / rigid', 'infer bytes / rigid']
    rounds_text = ''
    shown = rows
    if args.rounds > 1:
        cols += ['step / rigid by round', 'inference / rigid by round']
        shown = [dict(r) for r in rows]  # the table shows the lists as text, the JSON keeps them
        for r in shown:
            for key in ('step / rigid by round', 'inference / rigid by round'):
                if key in r:
                    r[key] = ', '.join('-' if v is None else f'{v:.2f}' for v in r[key])
        rounds_text = (f' {args.rounds} rounds: each round ran every row once, in order, '
                       f'each in a fresh process; a row\'s times are the medians of its '
                       f'calls in all the rounds that measured it (`calls`: '
                       f'{args.rounds * args.repeats} where none failed), and the last columns '
                       f'give its '
                       f'ratio to `rigid` (`rigid+keep`, or the `rigid` row with the same '
                       f'suffixes) within each round, the spread a slow spell of the host '
                       f'leaves.')
    note = None
    if complete:  # (the plot first: the report links it where drawn)
        png = os.path.join(args.out, 'training_step.png')
        note = replace_plot(png, plot, rows, png)
    # (the failed ones were left out: --resume makes them again too)
    again = f', and the {len(failed)} that failed (below) again' if failed else ''
    head = '' if complete else (
        f'Partial: {pending} more measurement(s) (row x round) not made (the run was cut off '
        f'or is still running; `--resume` makes the rest{again})\n\n') if pending else (
        f"Partial: {', '.join(f'`{name}`' for name in lost)} failed in every round here but "
        f"were measured by the earlier `{NAME}.json`, which is kept (`--resume` makes the "
        f"measurements that failed again; `--overwrite` replaces it with this report)\n\n")
    resumed = (f' ({earlier_minutes:.1f} of them in the run resumed, whose measurements are '
               f'kept: a ratio of a row measured there to one measured here is not from one '
               f"run, and every row's percentages use this call's peak and bandwidth)"
               if earlier_minutes else '')
    markdown = (f'# Training step and inference, {args.clouds} clouds x {args.points} points, '
                f'40 classes\n\n' + head +
                f"Command: `{env['command']}`  \n"
                f"torch {env['torch']}, {args.threads} thread(s), device {args.device}, "
                f"{minutes:.1f} min{resumed}; measured "
                f"float32 matmul peak {peak:.1f} GFLOP/s (2048 x 2048), memory bandwidth "
                f"{bandwidth:.1f} GB/s (copy of 256 MiB, read + write). Times are medians "
                f"of `calls` calls ({args.repeats} in each round that measured the row); "
                f"ratios to `rigid` from this run (to `rigid+keep` "
                f"where no plain `rigid` row ran).{rounds_text} EGNN on a radius graph "
                f"(r = {args.egnn_radius}). GB = bytes read and written by the operators of one "
                f"step (unfused estimate, no cache reuse: an upper bound); % of bandwidth = "
                f"GB / step time / bandwidth. Where that is high the step is bound by memory "
                f"traffic and the time ratio follows the bytes ratio, not the FLOP ratio. Plain "
                f"rows run the library's defaults (for the MZ presets here: the compiled "
                f"LayerNorm-Jacobian kernels), `+eager` rows the eager functions, `+fused` rows "
                f"the compiled kernels for every input. Where the kernels are compiled the "
                f"counter sees the unfused operators (compiled code runs eagerly under it), so "
                f"the GB and % of bandwidth of those rows are over-estimates. "
                f"`+keep` rows "
                f"keep freed memory in malloc's heap (`torch_mz.runtime.keep_freed_memory()`); "
                f"their ratios are to `rigid+keep` (those of `+whole`, `+groups`, `+kept` and "
                f"`+thp` rows to the `rigid` row with the same suffixes, where it ran). `+kept` "
                f"rows encode groups of whole sets of {KEPT_ROWS} rows, every activation kept "
                f"(`chunk_size={KEPT_ROWS}, checkpoint=False`). `+thp` rows "
                f"run in a process started with `THP_MEM_ALLOC_ENABLE=1` (PyTorch asks Linux "
                f"for 2 MiB pages for blocks of 2 MiB and more; the other rows with it set to "
                f"0; transparent huge pages here: {transparent_hugepages()}). `+compile` rows "
                f"time `torch.compile(model)` "
                f"(inductor); first_calls_s is the first training step and inference call "
                f"(compiling, for those rows), not timed. The MZ-Set-Transformer presets, by "
                f"their default `chunk_size='auto'`, train a batch at once, except in rows "
                f"without kept memory, where a batch whose widest activation exceeds 32 MiB "
                f"(`mz`: more than 16,384 points) is trained in groups of whole sets, every "
                f"activation kept (`torch_mz.nn.aggr.malloc_chunk_rows`; since 2026-12-05; "
                f"not under `+compile`, which encodes the whole batch), and encode inputs of "
                f"more than 65,536 points (at dim 64; without kept memory `mz` more than 16,384) "
                f"in groups when no gradients are recorded; "
                f"`+groups` rows (`checkpoint='auto'`) also train such batches in groups "
                f"recomputed in the backward pass, `+whole` rows (`chunk_size=None`) group "
                f"nothing. Each row ran in a fresh process; "
                f"peak_rss_mib is that process's peak resident set."
                f"\n\n" + markdown_table(shown, cols) + failed_text(failed, rows, args.rounds)
                + ('' if note or not complete else '\n![plot](training_step.png)\n'))
    config = {k: v for k, v in vars(args).items() if k not in ('resume', 'overwrite')}
    payload = dict(environment=env, config=config, minutes=minutes,
                   matmul_peak_gflop_per_s=peak, memory_bandwidth_gb_per_s=bandwidth,
                   rows=rows, failed=failed)
    if not complete:  # (what --resume reads back: every measurement made so far)
        payload.update(pending=pending, measured=runs)
    if lost:
        payload['lost'] = list(lost)
    if overwrite and not complete:  # (a call that resumes it replaces the earlier report too)
        payload['overwrite'] = True
    write_results_so_far(args.out, NAME, payload, markdown, complete)
    return rows, note


def lost_rows(runs: Dict[str, List[Optional[dict]]], earlier: Optional[dict]) -> List[str]:
    r"""The row names of :obj:`runs` with no measurement (failed in every round) that the
    earlier complete report :obj:`earlier` (of the same settings; :obj:`None`: none) has a row
    of: a report of this run in its place would lose them."""
    if earlier is None:
        return []
    try:
        made = {r['model'] for r in earlier['rows']}
    except (KeyError, TypeError):  # (rows not as written: nothing known to be lost)
        return []
    return [name for name, by_round in runs.items()
            if all(m is None for m in by_round) and name in made]


def earlier_runs(path: str, args, command: Optional[str] = None
                 ) -> Tuple[Dict[str, List[Optional[dict]]], float, str]:
    r"""The measurements of the partial report :obj:`path` that ``--resume`` keeps (each row
    name's, by round; :obj:`None` where it failed or was not made: made again), the minutes
    they took, and a sentence on what was found; a file damaged or written with other
    :data:`SETTINGS` raises a :class:`ValueError` saying so, naming the report's command and
    :obj:`command`, this run's (:func:`~torch_mz.study.read_partial`)."""
    if not os.path.exists(path):
        return {}, 0.0, f'nothing to resume: no {path}; making every measurement'

    def keep(earlier: dict) -> Tuple[Dict[str, List[Optional[dict]]], float]:
        # (a peak not read, NaN, is kept as null by write_json: read back as the NaN it was)
        kept = {str(name): [dict(m, peak_rss_mib=float('nan') if m['peak_rss_mib'] is None
                                 else m['peak_rss_mib'])
                            if isinstance(m, dict) else None for m in by_round]
                for name, by_round in earlier['measured'].items()}
        return kept, float(earlier['minutes'])
    kept, minutes = read_partial(path, args, SETTINGS, UNIT, keep=keep, command=command)
    count = sum(m is not None for by_round in kept.values() for m in by_round)
    return kept, minutes, f'resuming from {path}: {count} measurement(s) kept'


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    parser.add_argument('--models', type=row_names, default=','.join(PRESETS),
                        help='comma-separated row names: presets with optional suffixes')
    parser.add_argument('--clouds', type=positive_int, default=None,
                        help='point clouds per batch (default: 32, with --quick 8)')
    parser.add_argument('--points', type=positive_int, default=1024)
    parser.add_argument('--repeats', type=positive_int, default=None,
                        help='timed calls per row and round (default: 5, with --quick 3)')
    parser.add_argument('--rounds', type=positive_int, default=1,
                        help='run every row this many times, round by round (each in a fresh '
                             'process), and pool the calls: ratios less at the mercy of a slow '
                             'spell of a shared host')
    parser.add_argument('--threads', type=positive_int, default=1)
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu')
    parser.add_argument('--egnn-radius', type=positive_float, default=0.25)
    parser.add_argument('--quick', action='store_true',
                        help='8 clouds, 3 repeats, each unless --clouds or --repeats is given '
                             '(which wins)')
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      'training_step'))
    parser.add_argument('--flops-only', action='store_true',
                        help='only count the FLOPs of a training step and of inference (no '
                             'timing) and write training_step_flops.{json,md}')
    add_partial_arguments(parser, UNIT, overwrite_note=(
        '; with --flops-only: replace the FLOP counts of other options in --out (without it, '
        'such a folder is refused)'))
    parser.add_argument('--_one', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._one:
        print(json.dumps(measure_one(json.loads(args._one))))
        return None
    if args.device == 'cuda' and not torch.cuda.is_available():
        parser.error("argument --device: 'cuda' is not available here")
    if args.clouds is None:  # (an option given wins over --quick)
        args.clouds = 8 if args.quick else 32
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    torch.set_num_threads(args.threads)
    try:  # before minutes of measurements
        check_rows(args.models, args.egnn_radius)
    except ValueError as e:
        parser.error(f'argument --models: {e}')
    problem = check_out_folder(args.out)  # (found only once every row was measured)
    if problem:
        parser.error(problem)
    if args.flops_only:  # (its report, written at the end, is not replaced unasked either)
        problem = partial_problem(args.resume, args.overwrite, None, UNIT) or replace_problem(
            os.path.join(args.out, f'{FLOPS_NAME}.json'), args, FLOPS_SETTINGS,
            environment()['command'], args.overwrite, resumed=False)
        if problem:
            parser.error(problem)
        flops_only(args)
        return None
    # (a run stopped between writing its complete report and removing the partial one)
    if stale_partial_done(args.out, NAME, args, SETTINGS, PREDATED,
                          say=lambda note: print(note, flush=True)):
        return None
    partial = os.path.join(args.out, f'{PARTIAL}.json')
    problem = partial_problem(args.resume, args.overwrite, partial, UNIT, held_note=(
        ' (or of one whose rows failed where the complete report beside it measured them)'))
    if problem:
        parser.error(problem)
    env = environment()
    complete = os.path.join(args.out, f'{NAME}.json')
    # (a complete report of other options is not replaced unasked; one of these options is,
    # but for the rows that fail here in every round, which it keeps: earlier)
    problem = replace_problem(complete, args, SETTINGS, env['command'], args.overwrite,
                              resumed=args.resume and os.path.exists(partial),
                              predated=PREDATED)
    if problem:
        parser.error(problem)
    # (--overwrite, or resuming the partial report of a call given it: replaced whatever fails)
    replacing = args.overwrite or (args.resume and overwriting(partial))
    earlier_report = (None if replacing
                      else same_settings_report(complete, args, SETTINGS, predated=PREDATED))
    kept: Dict[str, List[Optional[dict]]] = {}
    earlier_minutes = 0.0
    if args.resume:
        try:
            kept, earlier_minutes, message = earlier_runs(partial, args, env['command'])
        except ValueError as e:
            parser.error(f'argument --resume: {e}')
        print(message, flush=True)
    start = time.time()
    peak = matmul_peak_flops(device=torch.device(args.device)) / 1e9
    bandwidth = memory_bandwidth(device=torch.device(args.device)) / 1e9
    print(f'measured float32 matmul peak: {peak:.1f} GFLOP/s, memory bandwidth '
          f'{bandwidth:.1f} GB/s', flush=True)
    config = {k: v for k, v in vars(args).items() if k not in ('_one', 'resume', 'overwrite')}
    # each row's measurement in every round, None where it failed there (or is not made yet)
    runs: Dict[str, List[Optional[dict]]] = {name: [None] * args.rounds for name in args.models}
    failed: List[dict] = []  # (model, round and the error's first line of each that failed)
    plan = [(round_, name) for round_ in range(args.rounds) for name in args.models]
    earlier = {(k, name) for name, by_round in kept.items() if name in runs
               for k, m in enumerate(by_round[:args.rounds]) if m is not None}
    rows: List[dict] = []
    note = None
    lost: List[str] = []  # (the rows that failed in every round and the earlier report measured)
    # (kept: the partial report resumed, else none before this call wrote a report)
    with interruptible(__file__, sys.argv[1:], parser, kept=partial if earlier else None,
                       what='measurements') as stop:
        for round_, name in earlier:  # (in every partial report written, from the first)
            runs[name][round_] = kept[name][round_]
        for done, (round_, name) in enumerate(plan, 1):
            # written after every measurement, so that a run cut off keeps what it measured:
            # a partial report while any remain
            pending = sum(1 for item in plan[done:] if item not in earlier)
            if (round_, name) in earlier:
                if pending:  # (nothing new to write)
                    continue
            else:
                try:
                    # PyTorch reads THP_MEM_ALLOC_ENABLE once, at import: set for +thp rows
                    thp = '1' if THP[1:] in split_name(name)[1] else '0'
                    runs[name][round_] = in_fresh_process(
                        __file__, dict(name=name, args=config),
                        env=dict(THP_MEM_ALLOC_ENABLE=thp))
                except MeasurementFailed as e:
                    print(f'{name}: not measured in round {round_ + 1}: {e}', flush=True)
                    failed.append(dict(model=name, round=round_ + 1, error=(
                        str(e).strip().splitlines() or [type(e).__name__])[0]))
            minutes = earlier_minutes + (time.time() - start) / 60
            lost = [] if pending else lost_rows(runs, earlier_report)
            rows, note = write_report(args, env, runs, failed, peak, bandwidth, minutes,
                                      pending, earlier_minutes, lost=lost, overwrite=replacing)
            if rows:  # (none measured yet: nothing written, an earlier report left alone)
                stop.kept = partial if pending or lost else complete
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if not rows:  # keep the results of an earlier run rather than write an empty table
        raise SystemExit(f'no row was measured (see the messages above); nothing written to '
                         f'{args.out}')
    for row in rows:
        print(f"{row['model']:9s} step {row['step_s']:7.3f} s  {row['points_per_s']:9.0f} "
              f"points/s  {row['gflop_per_step']:6.1f} GFLOP  {row['pct_of_peak']:5.1f}% of "
              f"peak  {row['gb_per_step']:6.1f} GB  {row['pct_of_bandwidth']:5.1f}% of "
              f"bandwidth  inference {row['infer_s']:6.3f} s  peak RSS "
              f"{row['peak_rss_mib']:.0f} MiB", flush=True)
    if lost:
        print(f"{', '.join(lost)} failed in every round here but were measured by {complete}, "
              f"which is kept: this report is partial ({partial}); pass --resume to make the "
              f"measurements that failed again, or --overwrite to replace {complete}",
              file=sys.stderr, flush=True)
        print(f'wrote {args.out}/{PARTIAL}.json, .md')
        return None
    if note:
        print(note)
    print(f"wrote {args.out}/training_step.json, .md{'' if note else ', .png'}")
    return None


if __name__ == '__main__':
    sys.exit(main())
