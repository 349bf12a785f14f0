r"""Where the time of a GPU call goes: the GPU's busy time against the wall time.

The GPU check (``gpu_check.sh``) found ``rigid`` 2.9-8.9x slower than PyG's aggregation in
message passing on one H200, and read the cause, from the kernel counts of
``benchmarks/launches.py`` and the times per kernel, as launch and host overhead rather than
arithmetic: a reading of two files, not a profile. This script takes the profile. For each row
it runs the call a few times unprofiled (the median wall time), then ``--profiled`` calls under
:mod:`torch.profiler` with CUDA activity, and reads the trace it exports:

* ``kernels``: GPU kernels per call (memory copies and sets counted apart, in ``copies``),
* ``busy_ms``: the time per call at least one kernel, copy or set ran on the GPU (the union of
  their intervals),
* ``busy / wall``: that time over the unprofiled wall time. Near 1 the call is bound by the
  GPU's work; far below 1 the GPU waits on the host (launches, Python, synchronisations), and
  fewer or fused kernels are what would make it faster, not fewer FLOPs,
* ``syncs``: host waits on the device per call (``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize``, ``cudaEventSynchronize`` and blocking ``cudaMemcpy``),
* the kernels that took the most GPU time, summed over the profiled calls (``top``),
* ``gflop`` and ``pct_of_peak``: the call's matrix-product FLOPs
  (:func:`~torch_mz.study.count_flops`, one more call under the FLOP counter) and their rate at
  the unprofiled wall time as a percentage of the measured float32 matmul peak of the device
  (:func:`~torch_mz.study.matmul_peak_flops`, once per run).

Rows: ``SAGEConv`` forward + backward with PyG's ``SetTransformerAggregation`` and ``rigid``
(and ``default`` with ``--aggrs``) on the Poisson graphs of ``message_passing.py``, and the
point-cloud training step and inference of the presets of ``training_step.py`` (32 clouds of
1,024 points). Writes ``gpu_profile.{json,md,png}`` under ``--out``, after every workload: a
run cut off keeps what it measured, its report marked partial (``pending``: the workloads not
run); a call that failed (out of memory, say) is listed under the table (``failed``).

    python benchmarks/gpu_profile.py --device cuda --out benchmarks/results/gpu/profile

``--device cpu`` runs the same plumbing on the CPU (the trace then holds no GPU events and every
GPU column is empty): what the tests run.
"""
import argparse
import json
import os
import shlex
import tempfile
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from torch_mz.study import (check_out_folder, choice_list, count_flops, environment, int_list,
                            markdown_table, matmul_peak_flops, positive_int)
from torch_mz._files import atomic_write
from torch_mz.study.measure import time_call
from torch_mz.study.plots import replace_plot, save_figure, try_plot
from torch_mz.study.workloads import (MERGED, build_aggr, make_batch, preset_calls,
                                      pyg_width_problem, random_graph)

GPU_CATS = ('kernel', 'gpu_memcpy', 'gpu_memset')
SYNC_CALLS = ('cudaStreamSynchronize', 'cudaDeviceSynchronize', 'cudaEventSynchronize',
              'cudaMemcpy')  # (cudaMemcpyAsync is not a wait by itself: its sync follows it)
NAME = 'gpu_profile'


def union_ms(intervals: List[tuple]) -> float:
    r"""Milliseconds covered by the union of ``(start_us, end_us)`` intervals."""
    total, end = 0.0, -float('inf')
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total / 1000


def trace_summary(events: List[dict], calls: int, top: int = 5) -> dict:
    r"""Per-call counts and GPU busy time of a Chrome trace's events (``traceEvents``) that
    :obj:`calls` calls left, and the :obj:`top` kernels by summed duration."""
    gpu = [e for e in events if e.get('ph') == 'X' and e.get('cat') in GPU_CATS]
    kernels = [e for e in gpu if e['cat'] == 'kernel']
    by_name: Dict[str, float] = {}
    for e in kernels:
        by_name[e['name']] = by_name.get(e['name'], 0.0) + float(e['dur'])
    syncs = sum(1 for e in events if e.get('ph') == 'X' and e.get('cat') == 'cuda_runtime'
                and e.get('name') in SYNC_CALLS)
    busy = union_ms([(float(e['ts']), float(e['ts']) + float(e['dur'])) for e in gpu])
    kernel_ms = sum(float(e['dur']) for e in kernels) / 1000
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return dict(kernels=len(kernels) / calls, copies=(len(gpu) - len(kernels)) / calls,
                busy_ms=busy / calls, kernel_ms=kernel_ms / calls, syncs=syncs / calls,
                top=[dict(name=n[:120], ms_per_call=d / 1000 / calls,
                          share=d / 1000 / kernel_ms if kernel_ms else None)
                     for n, d in ranked])


def profile(fn, device: torch.device, calls: int) -> dict:
    r"""Runs :obj:`fn` :obj:`calls` times under the profiler and summarises the trace."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    activities = [ProfilerActivity.CPU]
    if device.type == 'cuda':
        activities.append(ProfilerActivity.CUDA)
    if device.type == 'cuda':
        torch.cuda.synchronize()
    with torch_profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if device.type == 'cuda':
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'trace.json')
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get('traceEvents', [])
    return trace_summary(events, calls)


def message_passing_row(aggr: str, nodes: int, dim: int, device, repeats: int,
                        calls: int, peak: float) -> dict:
    from torch_geometric.nn import SAGEConv

    from torch_mz.nn import functional
    from torch_mz.nn.functional import clear_layout_cache
    torch.manual_seed(0)
    edge_index = random_graph(nodes, 'poisson', seed=0).to(device)
    x = torch.randn(nodes, dim, generator=torch.Generator().manual_seed(1)).to(device)
    conv = SAGEConv(dim, dim, aggr=build_aggr(aggr, dim)).to(device)

    def step():
        conv.zero_grad(set_to_none=True)
        conv(x, edge_index).square().mean().backward()

    # rigid-merged: rigid with the attention's size buckets merged more freely (fewer
    # kernels, up to twice the padded rows; message_passing.py's row of that name)
    saved = {k: getattr(functional, k) for k in MERGED}
    if aggr == 'rigid-merged':
        for k, v in MERGED.items():
            setattr(functional, k, v)
    clear_layout_cache()
    try:
        return measure(step, device, repeats, calls, peak,
                       dict(workload=f'SAGEConv fwd+bwd, {nodes:,} nodes, d={dim}', model=aggr,
                            nodes=nodes, edges=int(edge_index.size(1)), dim=dim))
    finally:
        for k, v in saved.items():
            setattr(functional, k, v)
        clear_layout_cache()


def point_cloud_rows(preset: str, clouds: int, points: int, device, repeats: int,
                     calls: int, peak: float) -> List[dict]:
    pos, batch, y = make_batch(clouds, points)
    _, train_step, infer = preset_calls(preset, pos, batch, y, device)
    base = dict(model=preset, clouds=clouds, points=points)
    return [measure(train_step, device, repeats, calls, peak,
                    dict(base, workload=f'training step, {clouds} x {points} points')),
            measure(infer, device, repeats, calls, peak,
                    dict(base, workload=f'inference, {clouds} x {points} points'))]


def measure(fn, device, repeats: int, calls: int, peak: float, row: dict) -> dict:
    fn()  # first call: compiles where compiled kernels run, fills the layout caches
    fn()
    wall = 1000 * float(np.median(time_call(fn, repeats=repeats, warmup=0, device=device)))
    summary = profile(fn, device, calls)
    gpu = device.type == 'cuda'
    if not gpu:  # no GPU events in a CPU trace: nothing to report, rather than zeros
        summary.update(kernels=None, copies=None, busy_ms=None, kernel_ms=None, syncs=None)
    row = dict(row, wall_ms=wall, **summary)
    row['busy / wall'] = summary['busy_ms'] / wall if gpu else None
    row['wall_us_per_kernel'] = 1000 * wall / summary['kernels'] if gpu and summary['kernels'] \
        else None
    flops = count_flops(fn)
    row['gflop'] = flops / 1e9
    row['pct_of_peak'] = 100 * flops / (wall / 1000) / peak
    print(f"{row['workload']:42s} {row['model']:9s} wall {wall:8.2f} ms" + (
        f"  GPU busy {summary['busy_ms']:8.2f} ms  kernels {summary['kernels']:8.0f}  syncs "
        f"{summary['syncs']:5.0f}" if gpu else '') + f"  {row['gflop']:.3g} GFLOP", flush=True)
    return row


def plot(rows: List[dict], path: str) -> None:
    r"""The share of each call's wall time the GPU was busy (a linear axis: the bars compare as
    fractions), each bar labelled with the wall time; with no GPU figures (a CPU run) nothing is
    drawn, and a plot of an earlier run at :obj:`path` is removed."""
    rows = [r for r in rows if r.get('busy / wall') is not None]
    if not rows:  # a CPU run: nothing to draw, nor an earlier run's plot beside these results
        if os.path.isfile(path):
            os.remove(path)
        return
    from torch_mz.study.plots import pyplot
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.2))
    ys = np.arange(len(rows))
    ax.barh(ys, [min(1.0, r['busy / wall']) for r in rows], color='C0')
    for y, r in zip(ys, rows):
        ax.text(min(1.0, r['busy / wall']) + 0.01, y, f"wall {r['wall_ms']:.3g} ms",
                va='center', fontsize=7)
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{r['workload']}, {r['model']}" for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.2)
    ax.axvline(1.0, color='0.5', lw=0.8, ls='--')
    ax.set_xlabel('GPU busy time / wall time (near 1: bound by the GPU; far below: by the host)')
    ax.set_title("Where a call's time goes", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


COLS = ['workload', 'model', 'wall_ms', 'busy_ms', 'busy / wall', 'kernels', 'copies', 'syncs',
        'wall_us_per_kernel', 'gflop', 'pct_of_peak']


def write(rows: List[dict], args, out: str, elapsed: float, peak: float,
          failed: Sequence[dict] = (), pending: int = 0) -> Optional[str]:
    r"""Writes ``gpu_profile.{json,md,png}`` of :obj:`rows`; :obj:`failed` (``call`` and
    ``error`` of each call that failed) and :obj:`pending` (the calls of the command not yet
    run: a report written while the run goes on, kept as it is where the run is cut off) are
    recorded, so that a call missing from the table is said to be missing."""
    os.makedirs(out, exist_ok=True)
    command = 'python benchmarks/gpu_profile.py ' + ' '.join(
        f'--{k.replace("_", "-")} '
        + shlex.quote(','.join(map(str, v)) if isinstance(v, list) else str(v))
        for k, v in vars(args).items() if k != 'replot')
    report = dict(command=command, environment=environment(), elapsed_s=elapsed,
                  matmul_peak_gflops=peak / 1e9, rows=rows, failed=list(failed),
                  pending=pending)
    text = json.dumps(report, indent=1)  # serialised first: a failure writes nothing
    # (atomically: an interrupted write leaves the earlier results whole)
    atomic_write(os.path.join(out, NAME + '.json'), lambda f: f.write(text), binary=False)
    return write_report(report, out)


def write_report(report: dict, out: str, redraw: bool = False) -> Optional[str]:
    r"""``gpu_profile.{md,png}`` from the contents of ``gpu_profile.json`` (``--replot``
    rebuilds them from the file alone, e.g. after a change of the figure: :obj:`redraw`).
    Returns the note of a plot not drawn (an earlier run's is removed then; with
    :obj:`redraw` the figure there, this file's own, is kept), else :obj:`None`."""
    rows, env, command = report['rows'], report['environment'], report['command']
    words = shlex.split(command)  # (--out's path quoted where it needs it)
    args = {w[2:]: v for w, v in zip(words, words[1:]) if w.startswith('--')}
    peak = report.get('matmul_peak_gflops')
    lines = [f"# Where the time of a call goes ({args.get('device')})", '',
             f'Command: `{command}`', '',
             f"Device: {env.get('cuda') or args.get('device')}; torch {env.get('torch')}. "
             f"Wall time: median of {args.get('repeats')} unprofiled calls. The other columns "
             f"come from {args.get('profiled')} calls under torch.profiler, per call: "
             '`busy_ms` is the time at least one kernel, copy or set ran on the GPU, `syncs` '
             'the host waits on the device. ' + (
                 f'Measured float32 matmul peak: {peak / 1e3:.1f} TFLOP/s.' if peak else
                 '(No FLOP columns: this run came before the script counted FLOPs.)'), '',
             markdown_table(rows, COLS), '## Kernels with the most GPU '
             'time', '']
    for r in rows:
        lines.append(f"- {r['workload']}, `{r['model']}`: " + '; '.join(
            f"{t['name'][:60]} {t['ms_per_call']:.3g} ms" for t in r['top']) if r['top']
            else f"- {r['workload']}, `{r['model']}`: no GPU events")
    pending, failed = report.get('pending', 0), report.get('failed', [])
    if pending:  # (a run cut off there, or still running)
        lines[2:2] = [f"Partial: {pending} more of the command's workloads not measured (the "
                      'run was cut off or is still running).', '']
    if failed:
        lines += ['', 'Calls that failed (not in the table):', '']
        lines += [f"- {f['call']}: {f['error']}" for f in failed]
    if not any(r.get('busy / wall') is not None for r in rows):
        lines += ['', f'No plot: no GPU events in this run (`{NAME}.png` is not drawn, and an '
                  'earlier one here is removed).']
    text = '\n'.join(lines) + '\n'
    atomic_write(os.path.join(out, NAME + '.md'), lambda f: f.write(text), binary=False)
    png = os.path.join(out, NAME + '.png')
    if redraw:  # (the run drew it from these rows: kept where it cannot be drawn again here)
        return try_plot(plot, rows, png)
    return replace_plot(png, plot, rows, png)


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cuda')
    parser.add_argument('--nodes', type=int_list(), default='1000,10000,100000')
    parser.add_argument('--dim', type=positive_int, default=64)
    parser.add_argument('--aggrs', type=choice_list(('pyg', 'pyg-flat', 'rigid', 'rigid-merged',
                                                     'default')),
                        default='pyg,rigid')
    parser.add_argument('--presets', type=choice_list(('rigid', 'st-large', 'mz-slim', 'mz',
                                                       'egnn')), default='rigid,mz')
    parser.add_argument('--clouds', type=positive_int, default=32)
    parser.add_argument('--points', type=positive_int, default=1024)
    parser.add_argument('--repeats', type=positive_int, default=5)
    parser.add_argument('--profiled', type=positive_int, default=2)
    parser.add_argument('--replot', action='store_true',
                        help='rebuild gpu_profile.{md,png} in --out from its gpu_profile.json '
                             '(measures nothing)')
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      'gpu', 'profile'))
    args = parser.parse_args()
    if args.replot:
        path = os.path.join(args.out, NAME + '.json')
        if not os.path.isfile(path):
            parser.error(f'argument --replot: no {path}')
        try:
            with open(path) as f:
                report = json.load(f)
        except ValueError as e:
            parser.error(f'argument --replot: {path} is not valid JSON ({e}); restore it or '
                         f'measure again')
        note = write_report(report, args.out, redraw=True)
        if note:
            print(note)
        drawn = note is None and os.path.isfile(os.path.join(args.out, NAME + '.png'))
        print(f"rebuilt {args.out}/{NAME}.{{md{',png' if drawn else ''}}} from {path}")
        return
    if args.device == 'cuda' and not torch.cuda.is_available():
        parser.error("argument --device: 'cuda' is not available here")
    problem = pyg_width_problem(args.aggrs, [args.dim])  # (each such row failed, the rest ran)
    if problem:
        parser.error(f'argument --dim: {problem}')
    problem = check_out_folder(args.out)  # (before anything is measured)
    if problem:
        parser.error(problem)
    device = torch.device(args.device)
    start = time.time()
    peak = matmul_peak_flops(device=device)
    rows: List[dict] = []
    failed: List[dict] = []
    note = None
    jobs = [('mp', a, n) for n in args.nodes for a in args.aggrs]
    jobs += [('pc', p, None) for p in args.presets]
    for done, (kind, name, nodes) in enumerate(jobs, 1):
        try:
            if kind == 'mp':
                rows.append(message_passing_row(name, nodes, args.dim, device, args.repeats,
                                                args.profiled, peak))
            else:
                rows.extend(point_cloud_rows(name, args.clouds, args.points, device,
                                             args.repeats, args.profiled, peak))
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: the other rows go on
            print(f'{kind} {name} {nodes}: failed: {type(e).__name__}: {e}'[:300], flush=True)
            call = (f'SAGEConv fwd+bwd, {nodes:,} nodes, d={args.dim}, {name}' if kind == 'mp'
                    else f'training step and inference, {args.clouds} x {args.points} points, '
                         f'{name}')
            failed.append(dict(call=call, error=f'{type(e).__name__}: {e}'[:300]))
        finally:
            if device.type == 'cuda':
                torch.cuda.empty_cache()
        if rows:  # after every row: a cut-off run keeps what it measured (and a run whose rows
            # all failed so far leaves the earlier results as they were, not an empty report)
            note = write(rows, args, args.out, time.time() - start, peak, failed,
                         pending=len(jobs) - done)
    if not rows:
        raise SystemExit(f'no row was measured; nothing written to {args.out}')
    if note:
        print(note)
    drawn = os.path.isfile(os.path.join(args.out, NAME + '.png'))
    print(f"wrote {args.out}/{NAME}.{{json,md{',png' if drawn else ''}}} in "
          f"{time.time() - start:.0f} s")


if __name__ == '__main__':
    main()
