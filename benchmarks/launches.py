r"""Operations dispatched by one forward + backward of a message-passing convolution, against the
size of the graph: on a GPU nearly every one of them that computes is a kernel launch, with a
cost of its own whatever the size of its tensors, so their number sets a floor under the time.

On one H200 (``benchmarks/results/gpu/``) PyG's ``SetTransformerAggregation`` took 9.6, 18.4 and
149 ms on Poisson graphs of 10^3, 10^4 and 10^5 nodes (d = 64) and ``rigid`` 27, 164 and 1,117
ms, about 33-57 us per kernel counted here across a 200-fold range of counts (an observation
from the two files, not a profile). This script counts, on the CPU, the ATen operations one
``SAGEConv`` call and its backward pass dispatch (:func:`torch_mz.study.traffic.count_ops`).
The count depends on the graph, the code and the library versions, not on the clock (the
committed run: torch 2.13 on the CPU; the GPU run had torch 2.11, and a GPU takes other
attention kernels for some calls):

* ``ops``: every ATen operation (``TorchDispatchMode`` sees each once; composite operations are
  counted as the operations they decompose into);
* ``kernels``: the operations that compute: every one except views of an input (``view``,
  ``transpose``, ``as_strided``, ``expand``, ``_unsafe_view`` and the like) and bare
  allocations (``empty``, ``empty_like``, ``new_empty``, ``empty_strided``), which launch
  nothing on a GPU;
* ``syncs``: the operations among them that read a device result on the host
  (``_local_scalar_dense``, which ``int(t)``, ``bool(t)`` and ``t.item()`` dispatch;
  ``equal``, ``torch.equal``'s Python bool; ``nonzero``, ``unique``, ``bincount`` and
  ``repeat_interleave`` without ``output_size``, whose output size the host must know): on a
  GPU each drains the queue of launched kernels before the host can go on. ``.tolist()`` of a
  CPU tensor dispatches nothing (on a GPU it is a copy to the host, one more sync), so this is
  a lower bound;
* ``ops_new_graph``, ``kernels_new_graph``, ``syncs_new_graph``: the same on a graph seen for the
  first time (the attention layouts cleared first,
  :func:`torch_mz.nn.functional.clear_layout_cache`): the other columns count a call on the
  graph of the call before (full-batch training; PyG passes a new view of ``edge_index[1]``
  each time, and the layouts are found by value), these a new graph every step (mini-batches);
* ``ops_infer``, ``kernels_infer``, ``syncs_infer``: one forward pass alone in ``eval()`` mode
  without gradients on the same graph (full-graph inference; the layouts found again);
* ``kernels_per_1k_edges`` and, per aggregation, the slope of log(kernels) against
  log(nodes + edges): 0 where the number of launches does not grow with the graph, 1 where it
  grows in proportion.

The aggregations are those of ``benchmarks/message_passing.py`` (``pyg``, ``pyg-flat``, ``rigid``,
``rigid-whole``, ``default``, ...), built the same way (both scripts take their workloads from
``torch_mz.study.workloads``). With ``--presets`` the script counts the
point-cloud presets of ``benchmarks/training_step.py`` instead (``launches_presets.{json,md}``):
one training step without the optimizer (forward, cross-entropy, backward; AdamW runs other
kernels on a GPU, where it takes its ``foreach`` form) and one inference call, on ``--clouds`` x
``--points`` points, beside the GPU inference times of ``benchmarks/results/gpu/training_step``
where that file exists (microseconds per inference kernel). The compiled generator kernels are off
(``set_fused_kernels(False)``): their automatic mode runs them for large CPU float32 inputs only,
so the eager operations are what a GPU runs, and what is counted here.

The counts of the aggregations are written after every graph and aggregation: while some
remain, to ``launches.partial.{json,md}``, marked partial (``pending``: the counts not yet
made), which the complete report ``launches.{json,md,png}`` replaces, so that a run cut off
(Ctrl-C, a failure) keeps what it counted and leaves an earlier run's complete report alone.
``--resume`` makes only the counts the partial report lacks (a partial report of other
options, or of another torch, PyG or torch-scatter, is refused); ``--overwrite`` makes every one
again, and a folder holding a partial report is refused without either. A folder holding the
complete report of another command (other options) is refused without ``--overwrite``, before
anything is counted; a run of the same options replaces it. Ctrl-C ends a run with
one line that gives the command to go on (status 130). (``--presets``, about a minute, writes
its report at the end; a folder holding such a report of other options,
:data:`PRESETS_SETTINGS`, is refused without ``--overwrite`` likewise.)

    python benchmarks/launches.py
    python benchmarks/launches.py --nodes 1000,10000 --aggrs rigid,rigid-whole   # a quick look
    python benchmarks/launches.py --presets rigid,st-large,mz-slim,mz,egnn
"""
import argparse
import json
import os
import shlex
import sys
import time
from typing import Dict, List, Optional, Tuple

import torch

from torch_mz.models import PRESETS as MODEL_PRESETS
from torch_mz.nn import set_fused_kernels
from torch_mz.nn import functional
from torch_mz.nn.functional import clear_layout_cache
from torch_mz.study import (EXIT_INTERRUPTED, PartialUnit, add_partial_arguments,
                            check_out_folder, choice_list, environment, in_turn, int_list,
                            interruptible, markdown_table, partial_problem, positive_float,
                            positive_int, pyplot, read_partial, replace_plot, replace_problem,
                            stale_partial_done, write_results, write_results_so_far)
# the graphs and aggregations of message_passing.py, the batch and presets of training_step.py
from torch_mz.study import workloads
from torch_mz.study.plots import save_figure
from torch_mz.study.traffic import count_ops

NAME = 'launches'
PARTIAL = NAME + '.partial'  # <out>/launches.partial.{json,md}: a run not yet complete
PRESETS_NAME = 'launches_presets'
#: The settings a partial report must share with a run that resumes it (``--resume``)
SETTINGS = ('nodes', 'dim', 'degrees', 'aggrs', 'pyg_max_nodes')
#: ... and the environment's (no option sets them: the operations dispatched are torch's and
#: PyG's, whose scatter takes torch-scatter's kernels where it is installed)
ENVIRONMENT = ('torch', 'torch_geometric', 'torch_scatter')
#: The settings a complete report of ``--presets`` must share with a run that replaces it
#: without ``--overwrite`` (not ``--gpu-results``: the counts are the same, whichever GPU times
#: are joined)
PRESETS_SETTINGS = ('presets', 'clouds', 'points', 'egnn_radius')
#: What a partial report holds, as ``--resume`` / ``--overwrite`` and their messages name it
UNIT = PartialUnit('counts', 'count', 'make')
DEFAULT_AGGRS = ('pyg', 'pyg-flat', 'rigid', 'rigid-whole', 'default')
GPU_TRAINING_STEP = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results', 'gpu',
                                 'training_step', 'training_step.json')


def count_one(nodes: int, aggr: str, dim: int, degrees: str, seed: int = 0) -> Dict:
    r"""One row: the operations of one ``SAGEConv(dim, dim, aggr=...)`` forward + backward on
    the graph of ``torch_mz.study.workloads.random_graph(nodes, degrees, seed=seed)``, after one
    uncounted call."""
    from torch_geometric.nn import SAGEConv
    torch.manual_seed(0)
    edge_index = workloads.random_graph(nodes, degrees, seed=seed)
    x = torch.randn(nodes, dim, generator=torch.Generator().manual_seed(1))
    conv = SAGEConv(dim, dim, aggr=workloads.build_aggr(aggr, dim))
    merged = aggr == 'rigid-merged'  # workloads.MERGED, for this row only
    saved = {k: getattr(functional, k) for k in workloads.MERGED}
    if merged:
        for k, v in workloads.MERGED.items():
            setattr(functional, k, v)
        clear_layout_cache()
    try:
        return _count_conv(conv, x, edge_index, degrees, dim, nodes, aggr)
    finally:
        if merged:
            for k, v in saved.items():
                setattr(functional, k, v)
            clear_layout_cache()


def _count_conv(conv, x, edge_index, degrees: str, dim: int, nodes: int, aggr: str) -> Dict:
    def step():
        conv.zero_grad(set_to_none=True)
        conv(x, edge_index).square().mean().backward()

    step()  # first call: caches and lazily built state, as in the timed benchmarks
    start = time.perf_counter()
    counter = count_ops(step)  # the same graph again: its attention layouts cached
    seconds = time.perf_counter() - start

    def new_graph():  # a graph seen for the first time: every layout computed
        clear_layout_cache()
        step()

    fresh = count_ops(new_graph)

    def infer():  # full-graph inference on the same graph
        conv.eval()
        try:
            with torch.no_grad():
                conv(x, edge_index)
        finally:
            conv.train()

    infer()  # first call in eval() mode: not counted, as above
    inference = count_ops(infer)
    edges = int(edge_index.size(1))
    module = conv.aggr_module
    chunk_rows = (module._chunk_rows(edges) or 0) if hasattr(module, '_chunk_rows') else None
    return dict(degrees=degrees, dim=dim, nodes=nodes, edges=edges, aggr=aggr,
                chunk_rows=chunk_rows, ops=counter.ops, kernels=counter.kernels,
                syncs=counter.syncs, ops_new_graph=fresh.ops, kernels_new_graph=fresh.kernels,
                syncs_new_graph=fresh.syncs, ops_infer=inference.ops,
                kernels_infer=inference.kernels, syncs_infer=inference.syncs,
                kernels_per_1k_edges=1000 * counter.kernels / max(edges, 1),
                top_kernels=', '.join(f'{n} {c}' for n, c in counter.by_name.most_common(5)),
                seconds=seconds)


def count_preset(name: str, clouds: int, points: int, radius: float = 0.25) -> Dict:
    r"""One row of ``--presets``: the operations of one training step of preset :obj:`name`
    without the optimizer (forward, cross-entropy, backward) and of one inference call, on the
    batch of ``torch_mz.study.workloads.make_batch(clouds, points)`` (EGNN on a radius graph of
    :obj:`radius`), each after one uncounted call, on one thread with the compiled generator
    kernels off (what a GPU runs)."""
    import torch.nn.functional as F
    from torch_geometric.data import Batch, Data
    torch.set_num_threads(1)
    set_fused_kernels(False)
    pos, batch, y = workloads.make_batch(clouds, points)
    model = workloads.build(name, radius)
    data = Batch.from_data_list([Data(x=pos[batch == i]) for i in range(clouds)])

    def forward():
        out = model(data)
        return out[0] if isinstance(out, tuple) else out

    def train():
        model.train()
        model.zero_grad(set_to_none=True)
        F.cross_entropy(forward(), y).backward()

    def infer():
        model.eval()
        with torch.no_grad():
            forward()

    row = dict(model=name, clouds=clouds, points=points, egnn_radius=radius)
    for label, fn in (('train', train), ('infer', infer)):
        fn()
        counter = count_ops(fn)
        row.update({f'{label}_ops': counter.ops, f'{label}_kernels': counter.kernels,
                    f'{label}_syncs': counter.syncs})
    return row


def join_gpu_inference(rows: List[Dict], path: str, counted_with: str = '') -> str:
    r"""Adds to each row of ``--presets`` the GPU inference time of the same preset, batch and
    EGNN radius from the ``training_step.py`` results at :obj:`path` (``gpu_infer_ms``), the
    microseconds per inference kernel counted here (a ratio of a GPU time to a CPU count, not
    a profile) and the ratio to ``rigid``. Returns a sentence for the report: which file and
    command were joined (with the code each was measured with, and :obj:`counted_with`, the
    code of the counts), or why none was (no file, unreadable, not a GPU run, another batch)."""
    shown = os.path.relpath(path)
    if not os.path.exists(path):
        return f'No GPU results joined: no {shown}.'
    try:
        with open(path) as f:
            data = json.load(f)
        config, environment = data['config'], data.get('environment') or {}
        if not isinstance(config, dict) or not isinstance(environment, dict):
            raise TypeError('config and environment must be objects')
        by = {r['model']: r for r in data['rows']}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f'not reading GPU times from {shown} (unreadable: {type(e).__name__}: {e})')
        return f'No GPU results joined: {shown} is unreadable.'
    if config.get('device') != 'cuda':
        return f"No GPU results joined: {shown} was measured on {config.get('device')!r}."
    ours = (rows[0]['clouds'], rows[0]['points'], rows[0]['egnn_radius'])
    theirs = (config.get('clouds'), config.get('points'), config.get('egnn_radius'))
    if theirs != ours:
        return (f'No GPU results joined: {shown} measured (clouds, points, EGNN radius) '
                f'{theirs}, these counts {ours}.')
    joined = 0
    for row in rows:
        infer_s = (by.get(row['model']) or {}).get('infer_s')
        if isinstance(infer_s, (int, float)) and infer_s > 0:
            row['gpu_infer_ms'] = 1e3 * infer_s
            row['gpu_us_per_infer_kernel'] = 1e6 * infer_s / row['infer_kernels']
            joined += 1
    base = next((r for r in rows if r['model'] == 'rigid'), None)
    for row in rows:
        if base is not None and row.get('gpu_infer_ms') and base.get('gpu_infer_ms'):
            row['gpu infer / rigid'] = row['gpu_infer_ms'] / base['gpu_infer_ms']
    if not joined:
        return f'No GPU results joined: {shown} has no inference time of these presets.'
    return (f"`gpu_infer_ms`: the median inference call on the GPU from `{shown}` (torch "
            f"{environment.get('torch')}, {_torch_mz_of(environment)}), "
            f"measured by `{environment.get('command')}`; these counts: {counted_with}. Per "
            f"kernel: that time over the inference kernels counted here (a ratio, not a "
            f"profile; the GPU's attention kernels differ from the CPU's).")


def _torch_mz_of(environment: Dict[str, object]) -> str:
    r"""The torch_mz an :func:`~torch_mz.study.environment` record names: its version and, from a
    git checkout, its commit (the commit alone was named: 'torch_mz None' for an installed
    copy, which has none; a record made before the version was recorded gives the commit)."""
    version, commit = environment.get('torch_mz'), environment.get('torch_mz_commit')
    if version is None:
        return f'torch_mz {commit}' if commit is not None else 'torch_mz (version not recorded)'
    return f'torch_mz {version}' + (f' at {commit}' if commit is not None else '')


def _environment(argv: Optional[List[str]]) -> Dict[str, object]:
    r"""The environment the counts were made in, whose command is :obj:`argv` where
    :func:`main` was given it (called from Python: the caller's ``sys.argv`` was recorded)."""
    env = environment()
    if argv is not None:
        env['command'] = shlex.join(['python', 'benchmarks/launches.py'] + list(argv))
    return env


def run_presets(args: argparse.Namespace, argv: Optional[List[str]] = None) -> None:
    start = time.time()
    rows = []
    for name in args.presets:
        row = count_preset(name, args.clouds, args.points, args.egnn_radius)
        rows.append(row)
        print(f"{name:9s} train {row['train_kernels']:6d} kernels {row['train_syncs']:4d} "
              f"syncs  inference {row['infer_kernels']:6d} kernels {row['infer_syncs']:4d} "
              f"syncs", flush=True)
    base = next((r for r in rows if r['model'] == 'rigid'), None)
    if base is not None:
        for row in rows:
            row['infer kernels / rigid'] = row['infer_kernels'] / base['infer_kernels']
    env = _environment(argv)
    gpu_note = join_gpu_inference(
        rows, args.gpu_results, f"torch {env['torch']}, {_torch_mz_of(env)}")
    minutes = (time.time() - start) / 60
    cols = ['model', 'train_ops', 'train_kernels', 'train_syncs', 'infer_ops', 'infer_kernels',
            'infer_syncs', 'infer kernels / rigid', 'gpu_infer_ms', 'gpu infer / rigid',
            'gpu_us_per_infer_kernel']
    markdown = (f'# Operations dispatched by the point-cloud presets, {args.clouds} clouds x '
                f'{args.points} points\n\n'
                f"Command: `{env['command']}`  \n"
                f"torch {env['torch']}; {minutes:.1f} min. Counted on the CPU with the compiled "
                f"generator kernels off (what a GPU runs): `train` = forward, cross-entropy and "
                f"backward (the optimizer left out), `infer` = one `eval()` forward without "
                f"gradients; kernels = operations that are neither views nor bare allocations; "
                f"syncs = host reads of a device result (a lower bound). {gpu_note}\n\n"
                + markdown_table(rows, cols))
    write_results(args.out, PRESETS_NAME, dict(environment=env, config=config_of(args),
                                               minutes=minutes, rows=rows,
                                               gpu_note=gpu_note), markdown)
    print(markdown_table(rows, cols))
    print(gpu_note)
    print(f'wrote {args.out}/{PRESETS_NAME}.json, .md')


def slopes(rows: List[Dict]) -> List[Dict]:
    r"""Per aggregation: the least-squares slope of log(kernels) against log(nodes + edges)
    (``torch_mz.study.workloads.fit_slope``), and the kernels on the largest graph over those on the
    smallest."""
    out = []
    for aggr in dict.fromkeys(r['aggr'] for r in rows):
        sel = sorted((r for r in rows if r['aggr'] == aggr), key=lambda r: r['nodes'])
        if len(sel) < 2:
            continue
        out.append(dict(aggr=aggr, kernel_slope=workloads.fit_slope(sel, 'kernels'),
                        largest_over_smallest=sel[-1]['kernels'] / sel[0]['kernels']))
    return out


def plot(rows: List[Dict], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for aggr in dict.fromkeys(r['aggr'] for r in rows):
        pts = sorted((r['nodes'] + r['edges'], r['kernels']) for r in rows if r['aggr'] == aggr)
        ax.plot(*zip(*pts), marker='o', label=aggr)
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel('nodes + edges')
    ax.set_ylabel('kernels per forward + backward')
    ax.set_title(f"SAGEConv, {rows[0]['degrees']} in-degrees, d = {rows[0]['dim']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def config_of(args: argparse.Namespace) -> Dict[str, object]:
    r"""The options a report records: every one but ``--resume`` and ``--overwrite`` (the
    reports' format as before they were added)."""
    return {k: v for k, v in vars(args).items() if k not in ('resume', 'overwrite')}


def write_report(args: argparse.Namespace, argv: Optional[List[str]], rows: List[Dict],
                 pending: int, minutes: float) -> Optional[str]:
    r"""Writes the report of the aggregations' counts :obj:`rows`: while :obj:`pending` counts
    remain, ``launches.partial.{json,md}``, marked partial; else ``launches.{json,md,png}``,
    which removes the partial report. Returns the note of a plot not drawn, else
    :obj:`None`."""
    complete = not pending
    fits = slopes(rows)
    env = _environment(argv)
    note = None
    if complete:  # (the plot first: the report links it where drawn)
        png = os.path.join(args.out, f'{NAME}.png')
        note = replace_plot(png, plot, rows, png)
    head = '' if complete else (
        f'Partial: {pending} more count(s) (graph x aggregation) not made (the run was cut off '
        f'or is still running; `--resume` makes the rest)\n\n')
    markdown = ('# Operations dispatched by one SAGEConv forward + backward\n\n' + head +
                f"Command: `{env['command']}`  \n"
                f"torch {env['torch']}, torch_geometric {env['torch_geometric']}; "
                f"{minutes:.1f} min. {args.degrees} in-degrees (mean 10), d = {args.dim}; "
                f"counted on the CPU with the compiled generator kernels off (what a GPU "
                f"runs); `kernels` = operations that are neither views nor bare allocations "
                f"(each a launch on a GPU); `syncs` = those that read a result on the host "
                f"(each drains a GPU's queue); `chunk_rows` = rows per recomputed group of "
                f"`chunk_size='auto'` on the CPU (0: the whole input at once; on a CUDA device "
                f"`'auto'` sizes its groups by the device's memory, and on one H200 every graph "
                f"here runs at once, as `rigid-whole`). See "
                f"`benchmarks/launches.py` for what is counted.\n\n"
                f'## Growth with the graph\n\n'
                + markdown_table(fits, ['aggr', 'kernel_slope', 'largest_over_smallest'])
                + '\n## All counts\n\n'
                + markdown_table(rows, ['degrees', 'dim', 'nodes', 'edges', 'aggr', 'chunk_rows',
                                        'ops', 'kernels', 'syncs', 'ops_new_graph',
                                        'kernels_new_graph', 'syncs_new_graph',
                                        'ops_infer', 'kernels_infer', 'syncs_infer',
                                        'kernels_per_1k_edges', 'top_kernels'])
                + ('' if note or not complete else f'\n![plot]({NAME}.png)\n'))
    payload = dict(environment=env, config=config_of(args), minutes=minutes, rows=rows,
                   slopes=fits)
    if not complete:
        payload['pending'] = pending
    write_results_so_far(args.out, NAME, payload, markdown, complete)
    return note


def earlier_counts(path: str, args: argparse.Namespace, env: Optional[Dict] = None
                   ) -> Tuple[Dict[Tuple[int, str], Dict], float, str]:
    r"""The rows of the partial report :obj:`path` that ``--resume`` keeps, by (nodes,
    aggregation), the minutes they took, and a sentence on what was found; a file damaged or
    written with other :data:`SETTINGS` (or, given this run's environment :obj:`env`, in
    another :data:`ENVIRONMENT`: the counts of another torch, PyG or scatter path, which one
    table would mix) raises a :class:`ValueError` saying so
    (:func:`~torch_mz.study.read_partial`)."""
    if not os.path.exists(path):
        return {}, 0.0, f'nothing to resume: no {path}; making every count'
    kept, minutes = read_partial(
        path, args, SETTINGS, UNIT, env=env, environment=ENVIRONMENT,
        keep=lambda earlier: ({(int(r['nodes']), str(r['aggr'])): r for r in earlier['rows']},
                              float(earlier['minutes'])))
    return kept, minutes, f'resuming from {path}: {len(kept)} count(s) kept'


def main(argv: Optional[List[str]] = None) -> Optional[int]:
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    parser.add_argument('--nodes', type=int_list(), default=[1000, 10000, 100000])
    parser.add_argument('--dim', type=positive_int, default=64)
    parser.add_argument('--degrees', choices=workloads.DEGREES, default='poisson')
    parser.add_argument('--aggrs', type=choice_list(workloads.AGGRS), default=list(DEFAULT_AGGRS))
    parser.add_argument('--pyg-max-nodes', type=positive_int, default=10000,
                        help="count 'pyg' only on graphs of at most this many nodes: it pads "
                             'every neighbourhood to the largest (16,383 MiB of tensors at 10^5 '
                             'nodes, d = 64, on the GPU run), and its count does not depend on '
                             'the graph')
    parser.add_argument('--presets', type=choice_list(MODEL_PRESETS),
                        help='count the training step (without the optimizer) and inference of '
                             f'these presets on --clouds x --points points instead, into '
                             f'<out>/{PRESETS_NAME}.json, .md')
    parser.add_argument('--clouds', type=positive_int, default=32)
    parser.add_argument('--points', type=positive_int, default=1024)
    parser.add_argument('--egnn-radius', type=positive_float, default=0.25,
                        help="EGNN's radius graph in --presets (training_step.py's default)")
    parser.add_argument('--gpu-results', default=GPU_TRAINING_STEP,
                        help="training_step.py's results on a GPU, for the inference times "
                             'beside the counts of --presets (default: %(default)s)')
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      NAME))
    add_partial_arguments(parser, UNIT, resume_note=' (not with --presets)', overwrite_note=(
        f'; with --presets: replace the {PRESETS_NAME} report of other options in --out '
        f'(without it, such a folder is refused)'))
    args = parser.parse_args(argv)
    # (before anything is counted: a run refused at its end had counted for nothing)
    problem = check_out_folder(args.out)
    if problem:
        parser.error(problem)
    # (--presets counts no aggregation)
    problem = None if args.presets else workloads.pyg_width_problem(args.aggrs, [args.dim])
    if problem:
        parser.error(f'argument --dim: {problem}')
    jobs = [(nodes, aggr) for nodes in args.nodes for aggr in args.aggrs
            if not (aggr == 'pyg' and nodes > args.pyg_max_nodes)]
    if not args.presets and not jobs:  # (it wrote an empty report over the earlier one)
        parser.error(f"nothing to count: --aggrs {','.join(args.aggrs)} on --nodes "
                     f"{','.join(map(str, args.nodes))} leaves only 'pyg' above "
                     f"--pyg-max-nodes {args.pyg_max_nodes}")
    if not args.presets:  # (whose report is another: the partial report is the aggregations')
        # (a run stopped between writing its complete report and removing the partial one)
        if stale_partial_done(args.out, NAME, args, SETTINGS,
                              say=lambda note: print(note, flush=True)):
            return None
    partial = os.path.join(args.out, f'{PARTIAL}.json')
    # (--presets writes no partial report: a folder holding one is not refused)
    problem = partial_problem(args.resume, args.overwrite, None if args.presets else partial,
                              UNIT)
    if problem:
        parser.error(problem)
    if args.presets and args.resume:
        parser.error('argument --resume: not allowed with --presets (which writes its report '
                     'at the end, after about a minute)')
    # (a complete report of other options is not replaced unasked: --presets' own, or the
    # aggregations')
    command = str(_environment(argv)['command'])
    problem = (replace_problem(os.path.join(args.out, f'{PRESETS_NAME}.json'), args,
                               PRESETS_SETTINGS, command, args.overwrite, resumed=False)
               if args.presets else
               replace_problem(os.path.join(args.out, f'{NAME}.json'), args, SETTINGS, command,
                               args.overwrite, resumed=args.resume and os.path.exists(partial)))
    if problem:
        parser.error(problem)
    kept: Dict[Tuple[int, str], Dict] = {}
    earlier_minutes = 0.0
    if args.resume:
        try:
            kept, earlier_minutes, message = earlier_counts(partial, args, _environment(argv))
        except ValueError as e:
            parser.error(f'argument --resume: {e}')
        print(message, flush=True)
    torch.set_num_threads(1)
    set_fused_kernels(False)  # what a GPU runs (see the module's docstring)
    if args.presets:
        run_presets(args, argv)
        return None
    start = time.time()
    rows: List[Dict] = []
    note = None
    kept = {job: row for job, row in kept.items() if job in jobs}
    # (kept: the partial report resumed, else none before this call wrote a report)
    with interruptible(__file__, sys.argv[1:] if argv is None else argv, parser,
                       kept=partial if kept else None, what='counts') as stop:
        # (the counts kept not reached yet stay in the partial report: turn.reached)
        for turn in in_turn(jobs, kept, lambda job: count_one(*job, args.dim, args.degrees)):
            (nodes, aggr), row, rows = turn.key, turn.value, turn.reached
            print(f"N={nodes:7d} E={row['edges']:8d} {aggr:12s} {row['ops']:7d} ops "
                  f"{row['kernels']:7d} kernels ({row['kernels_per_1k_edges']:.2f} per 1k "
                  f"edges) {row['syncs']:6d} syncs" + (' (kept)' if turn.kept else ''),
                  flush=True)
            if turn.write:
                minutes = earlier_minutes + (time.time() - start) / 60
                note = write_report(args, argv, rows, turn.pending, minutes)
                stop.kept = partial if turn.pending else os.path.join(args.out, f'{NAME}.json')
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if note:
        print(note)
    print(markdown_table(slopes(rows), ['aggr', 'kernel_slope', 'largest_over_smallest']))
    print(f"wrote {args.out}/{NAME}.json, .md{'' if note else ', .png'}")
    return None


if __name__ == '__main__':
    sys.exit(main())
