r"""MZAggregation as a neighbourhood aggregation inside PyG message passing, against PyG's own
SetTransformerAggregation with the same block structure.

One forward + backward of ``SAGEConv(d, d, aggr=...)`` (and ``GraphConv``) on random graphs with
average in-degree 10, in-degrees Poisson or power law (``deg_i ~ 1 / rank_i``, scaled to the same
number of edges), ``edge_index`` sorted by destination (PyG's aggregation requires it). Each
configuration runs in a fresh subprocess, which makes one untimed call (compiling, where the
compiled kernels run), measures the peak memory of the next call (peak resident set above the
state before it), then the median time of ``--repeats`` calls, then the tensor memory one more
call holds at once (``alloc_mib``: PyTorch's CPU allocator total under the profiler,
:func:`torch_mz.study.allocator_peak_bytes`, which runs two calls and reads the second; the
results files before ``message_passing_rows`` lack it).
The two memory figures differ where the C allocator reuses freed blocks or maps fresh pages for
large ones: the resident set counts the pages touched, the allocator figure what the tensors
hold. Ratios are taken between medians of the same run. Aggregations:

* ``pyg``: ``SetTransformerAggregation(d, heads=4)`` (one SAB encoder block, PMA, one SAB decoder
  block; pads every neighbourhood to the largest in the batch),
* ``pyg-nofast`` (with ``--inference`` only, and only when named in ``--aggrs``): ``pyg`` with
  PyTorch's ``MultiheadAttention`` fast path off (``torch.backends.mha.set_fastpath_enabled(False)``
  in that row's process): the same module and values. The fast path runs only without
  gradients in ``eval()`` mode, so in training ``pyg`` never takes it; in inference on the
  power-law graph of 10^3 nodes ``pyg`` asked for 28.6 GB there and failed
  (``message_passing_inference``), and this row measures PyG's aggregation on that graph as a
  user who turns the fast path off would run it,
* ``pyg-flat``: ``FlatSetTransformerAggregation(d, heads=4)``: PyG's aggregation itself (its
  blocks and parameters, equal values and gradients) on the flat layout, without padding: the
  cost of the flat-layout attention alone, at PyG's FLOPs,
* ``rigid``: ``MZAggregation(d, value='rigid', num_generators=0)``: the same structure on the flat
  layout (standard attention, no generators) with the paper's blocks, which do more work than
  PyG's (a two-layer feed-forward where PyG has one layer, an input projection, LayerNorms,
  a readout),
* ``default``: ``MZAggregation(d)``: the neighbourhood preset with the matrix-zonotope value
  operator and the Slim generator budget (n_g = 2, L = 1), with the library's defaults: on graphs
  with at least 2^20 generator elements per LayerNorm (32,768 edges at d = 16) the LayerNorm
  Jacobian runs as compiled kernels (:mod:`torch_mz.nn.fused`, auto mode), and (since
  ``chunk_size='auto'`` became the default) graphs of more than two groups of 2^21 / d edges
  (262,144 at d = 16, 65,536 at d = 64; ``torch_mz.nn.aggr.auto_chunk_rows``) are encoded in
  groups of 2^21 / d recomputed in the backward pass, the configuration of ``default-chunks``
  with ``--chunk-rows`` set to that group (on a CUDA device the groups scale with its memory,
  ``auto_chunk_rows(d, device_memory)``: on one H200 every graph here runs at once; each row
  records ``device_memory``, the device's bytes, null on the CPU; GPU rows written before
  2026-12-04 took the CPU's groups); rows of ``default`` on such graphs in results files
  written before that change measured the whole input at once, and rows at d = 64 written
  before 2026-12-03 (when the groups were 131,072 rows at every width) the whole input or
  groups of 131,072 (``benchmarks/targets.py`` lists them as superseded; the same holds for
  ``rigid``, whose configuration there is ``rigid-chunks``); every row of an ``MZAggregation``
  now records ``chunk_rows``, the rows per group (0: the whole input at once); ``-eager`` and
  ``-fused`` rows are the default's configuration, chunked where it is,
* ``default-whole``: ``MZAggregation(d, chunk_size=None)``: the whole input at once, on the same
  graphs as ``default-ckpt``,
* ``rigid-whole``: ``rigid`` with ``chunk_size=None``, the whole input at once, on every graph:
  against ``rigid`` the cost of the recomputed groups that ``chunk_size='auto'`` takes on graphs
  of more than 2 x 2^21 / d edges on the CPU (on a GPU each group adds about a thousand kernel
  launches, ``benchmarks/launches.py``; there ``'auto'`` takes groups sized by the device's
  memory, and ``rigid-chunks`` times the CPU's groups),
* ``default-eager``: the same with the eager functions only (``set_fused_kernels(False)``),
* ``default-fused``: the same with the compiled kernels for every input
  (``set_fused_kernels(True)``),
* ``default-ckpt``: the same with ``checkpoint=True`` (activations recomputed in the backward
  pass) on the whole input (``chunk_size=None``), only on the largest graphs at d = 16, where
  memory matters,
* ``default-ckpt-attn`` and ``rigid-ckpt-attn``: ``default`` and ``rigid`` with
  ``checkpoint='attention'`` (each attention's projections, packing and kernel recomputed in the
  backward pass) on the whole input, on the same graphs as ``default-ckpt``,
* ``default-chunks`` and ``rigid-chunks``: ``default`` and ``rigid`` with
  ``chunk_size=2^21 / d, checkpoint='chunks'`` (the groups of ``chunk_size='auto'`` at that
  width on the CPU, on any device, 131,072 edges at d = 16 and 32,768 at d = 64, each keeping
  only its input rows and run
  again in the backward pass; ``--chunk-rows`` sets another group size; before 2026-12-03 the
  groups were 131,072 edges at every width), on the same graphs as ``default-ckpt``,
* ``rigid-unfolded`` and ``default-unfolded``: ``rigid`` and ``default`` with
  ``fold_keys=False`` (the key map kept on the keys in every block; by default the PMA folds it
  into its seed at d = 64, see :class:`~torch_mz.nn.attention.MZAttention`), for the ratio of
  the two forms on the same graphs,
* ``rigid-merged``: ``rigid`` with the dense attention's size buckets merged more freely
  (``torch_mz.nn.functional.MERGE_OVERHEAD = 4e6``, ``MERGE_ROWS_RATIO = 2.0``, set in that
  row's process only: :data:`MERGED`): fewer buckets, so fewer kernel launches (the whole graph
  with these settings: 992 against 1,332 operations on 10^4 nodes at d = 64, counted ad hoc; on
  the CPU this row takes ``chunk_size='auto'``'s groups there, on one H200 the whole graph), at
  up to twice the padded attention rows; a candidate for a GPU, where each launch costs more
  than the padding,
* ``mz-ng8``: ``MZAggregation(d, num_generators=8, num_matrix_generators=4)``: the paper's
  generator budget in the same structure,
* ``paper``: ``MZAggregation(d, preset='paper')``: the paper's MZ-Set Transformer body (two
  ISAB blocks with 16 inducing tokens per set, d = 64), only on the smallest graphs.

    python benchmarks/message_passing.py --quick
    python benchmarks/message_passing.py
    python benchmarks/message_passing.py --resume   # after a stop: only the rows not yet measured

Every timed call runs on the graph of the call before, as in full-batch training: since
2026-12-04 ``MZAggregation`` then finds its attention layouts again (by the values of the set
ids), and rows written before measured every call computing them. ``--new-graph`` clears them
before every call, as a new mini-batch each step would (rows record ``new_graph``).

``--same-process`` (with ``--device cuda`` only) runs every row in the calling process instead
of a fresh one: the GPU's peak is the allocator's, reset for every row, so a row needs no
process of its own, and a row then costs no start-up of its own (the first GPU check measured
8 rows in 150 s, each in its own process; how much of that was start-up was not measured); each
row still drops the layouts and compiled graphs of the rows before it,
and ``--timeout`` does not apply (rows record ``same_process``).

``--compile`` wraps each row's convolution (with its aggregation) in ``torch.compile``, with
its default backend (inductor), before the untimed first call, which compiles it (rows record
``compile``): whether compiling pays in message passing, for PyG's aggregation and this
package's.

    python benchmarks/message_passing.py --compile --nodes 1000 --dims 16,64 --aggrs pyg,rigid

``--inference`` times the forward pass alone instead, in ``eval()`` mode under
``torch.no_grad()``, as full-graph inference after training runs (rows record ``inference``; the
peak and allocated figures are then those of one forward pass). Without gradients
``chunk_size='auto'`` encodes large inputs in groups without recomputation, so the default's
memory is bounded by the groups there; rows record the groups taken without gradients.

    python benchmarks/message_passing.py --inference --aggrs pyg,pyg-flat,rigid,default

Until its last row, the run writes its report after every row as
``message_passing.partial.json`` / ``.md`` (``"complete": false``, a line ``partial: N of M rows
measured``), so that a stopped run loses nothing and leaves an earlier complete report as it
was; the last row writes ``message_passing.json`` / ``.md`` and removes the partial files, and
the plot is drawn at the end. ``--resume`` keeps the rows of the partial report at ``--out`` (or,
if there is none, of the complete one) that measured one of this run's configurations with the
same settings (repeats, threads, device, keep-freed-memory, allocated, chunk rows) and
measures the others (failed rows again). Without ``--resume`` a folder that holds a partial
report is refused before anything is measured (the first row's report replaced it, and the
interrupted run's rows were lost); ``--overwrite`` measures every row and replaces it. Ctrl-C
ends a run with one line that gives the command to go on (status 130). A folder holding the
complete report of another command (other options, :data:`REPORT_SETTINGS`) is refused without
``--overwrite``, before anything is measured (``--resume`` would keep the rows of this run's
configurations alone), and so, with ``--resume``, is the partial report of another command
(whose other rows this run would drop with it), both commands named; a run of the same options
replaces the complete report, unless rows fail that it measured:
it is then kept, this run's report stays partial (``lost``: those rows), and ``--resume``
measures them again, or ``--overwrite`` replaces the earlier report with it.
"""
import argparse
import json
import os
import sys
import time
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from torch_mz.runtime import keep_freed_memory
from torch_mz.study import (EXIT_INTERRUPTED, MeasurementFailed, PartialUnit,
                            add_partial_arguments, check_out_folder, choice_list,
                            environment, in_fresh_process, in_turn, int_list, interruptible,
                            markdown_table, nonnegative_int, overwriting, partial_problem,
                            peak_memory_bytes, positive_float, positive_int, pyplot,
                            stale_partial_done, replace_plot, replace_problem, resume_problem,
                            same_settings_report, settings_differ, time_call,
                            write_results_so_far)
from torch_mz.study.plots import save_figure
from torch_mz.study.workloads import (AGGRS, DEGREES, MERGED, build_aggr, fit_slope,
                                      pyg_width_problem, random_graph)
from torch_mz.study.measure import allocator_peak_bytes

#: Measured only when named in ``--aggrs`` (not in its default), and only with ``--inference``
INFERENCE_ONLY = ('pyg-nofast', )
CKPT_AGGRS = ('default-ckpt', 'default-ckpt-attn', 'rigid-ckpt-attn', 'default-chunks',
              'rigid-chunks', 'default-whole')
CONVS = ('sage', 'graph')
#: The run's settings (``vars(args)``) besides a row's own configuration that change its figures:
#: ``--resume`` reuses no row of a report written with other ones.
FIGURE_SETTINGS = ('repeats', 'threads', 'device', 'keep_freed_memory', 'allocated', 'chunk_rows')
#: The options that say what a run measures (the configurations and their settings; resolved,
#: ``--quick`` as the graphs, widths and repeats it sets): a complete report written with other
#: ones is another command's, which a run does not replace without ``--overwrite``
#: (``chunk_rows`` only where it sets a row's groups: :func:`report_settings`).
REPORT_SETTINGS = ('nodes', 'dims', 'degrees', 'aggrs', 'graphconv_nodes', 'paper_max_nodes',
                   'ng8_max_nodes', 'ckpt_min_nodes', 'ckpt_dims', 'power_law_max_nodes',
                   'new_graph', 'inference', 'same_process', 'compile') + FIGURE_SETTINGS
NAME = 'message_passing'  # <out>/message_passing.{json,md,png}
#: ``--nodes``, ``--dims`` and ``--repeats`` where not given, without and with ``--quick`` (an
#: option given wins over ``--quick``)
DEFAULTS = dict(nodes=[1000, 10000, 100000], dims=[16, 64], repeats=5)
QUICK = dict(nodes=[1000, 10000], dims=[16], repeats=3)
PARTIAL = NAME + '.partial'  # <out>/message_passing.partial.{json,md}: a run not yet complete
#: What a partial report holds, as ``--resume`` / ``--overwrite`` and their messages name it
UNIT = PartialUnit('rows', 'row')


def run_one(cfg: dict) -> dict:
    r"""One configuration: peak memory (resident set) of one forward + backward (with
    ``inference``: one forward in ``eval()`` mode without gradients), the median time, then
    (unless ``allocated`` is off) the tensor memory held at once, under the profiler
    (:func:`~torch_mz.study.allocator_peak_bytes`: two more calls). A failure of that last
    figure alone leaves the row's other figures and records ``alloc_error``."""
    from torch_geometric.nn import GraphConv, SAGEConv
    torch.set_num_threads(cfg['threads'])
    if cfg.get('keep') and not keep_freed_memory():
        raise RuntimeError('keep_freed_memory() does not apply here (not glibc)')
    torch.manual_seed(0)
    device = torch.device(cfg.get('device', 'cpu'))
    edge_index = random_graph(cfg['nodes'], cfg['degrees'], seed=cfg['seed']).to(device)
    x = torch.randn(cfg['nodes'], cfg['dim'],
                    generator=torch.Generator().manual_seed(1)).to(device)
    conv_cls = SAGEConv if cfg['conv'] == 'sage' else GraphConv
    conv = conv_cls(cfg['dim'], cfg['dim'], aggr=build_aggr(cfg['aggr'], cfg['dim'],
                                                    cfg.get('group_rows'))).to(device)
    inference = bool(cfg.get('inference'))
    if inference:
        conv.eval()
    if cfg.get('compile'):  # compiled in the untimed first call (torch.compile's default backend)
        conv = torch.compile(conv)

    def step():
        if cfg.get('new_graph'):  # mini-batches: every call on a graph not seen before
            clear_layout_cache()
        if inference:
            with torch.no_grad():
                conv(x, edge_index)
            return
        conv.zero_grad(set_to_none=True)
        conv(x, edge_index).square().mean().backward()

    from torch_mz.nn import functional, set_fused_kernels
    from torch_mz.nn.functional import clear_layout_cache
    from torch_mz.nn.fused import fused_kernels_mode
    saved = {k: getattr(functional, k) for k in MERGED}
    saved_mode = fused_kernels_mode()  # (restored below, for rows run in one process)
    saved_fastpath = torch.backends.mha.get_fastpath_enabled()
    if cfg['aggr'] == 'pyg-nofast':
        torch.backends.mha.set_fastpath_enabled(False)
    if cfg['aggr'] == 'rigid-merged':  # (restored below: run_one also runs in-process in tests)
        for k, v in MERGED.items():
            setattr(functional, k, v)
        clear_layout_cache()
    if cfg['aggr'].endswith('-fused'):
        set_fused_kernels(True)
    elif cfg['aggr'].endswith('-eager'):
        set_fused_kernels(False)
    try:
        step()  # compiles where the compiled kernels run: not part of the peak memory or timings
        peak = peak_memory_bytes(step, device)
        times = time_call(step, repeats=cfg['repeats'], warmup=0, device=device)
        alloc, alloc_error = None, None
        if cfg.get('allocated', True):
            try:  # under the profiler: after the timings
                alloc = allocator_peak_bytes(step, device)
            except Exception as e:  # e.g. another profiler active: keep the figures measured
                alloc_error = f'{type(e).__name__}: {e}'
    finally:
        set_fused_kernels(saved_mode)
        torch.backends.mha.set_fastpath_enabled(saved_fastpath)
        if cfg['aggr'] == 'rigid-merged':
            for k, v in saved.items():
                setattr(functional, k, v)
            clear_layout_cache()
    deg = torch.bincount(edge_index[1], minlength=cfg['nodes'])
    aggr = conv.aggr_module
    chunk_rows = None
    if hasattr(aggr, '_chunk_rows'):  # MZAggregation: rows per group, 0 for the whole input
        with torch.set_grad_enabled(not inference):  # (the groups depend on gradients)
            chunk_rows = aggr._chunk_rows(edge_index.size(1), device) or 0
    from torch_mz.nn import tanh_kernel_faster
    from torch_mz.nn.aggr import device_memory
    return dict(cfg, edges=int(edge_index.size(1)), max_degree=int(deg.max()),
                chunk_rows=chunk_rows, device_memory=device_memory(device),
                tanh_kernel_faster=tanh_kernel_faster(),  # auto mode's tanh, None if unmeasured
                median_ms=1000 * float(np.median(times)), times_ms=[1000 * t for t in times],
                peak_mib=None if peak is None else peak / 2**20,
                alloc_mib=None if alloc is None else alloc / 2**20,
                **({} if alloc_error is None else dict(alloc_error=alloc_error)))


def run_in_process(cfg: dict) -> dict:
    r"""One configuration in this process (``--same-process``, CUDA only, where the peak is the
    allocator's, reset for every row): the attention layouts and the compiled graphs of the rows
    before are dropped first (each row compiles again in its untimed first call, from the
    compiler's cache on disk), and its tensors and the allocator's cache after it; a failure
    (CUDA out of memory, say) is a row with an ``error``, as in a fresh process."""
    import gc

    from torch_mz.nn.functional import clear_layout_cache
    clear_layout_cache()
    torch._dynamo.reset()
    try:
        return run_one(cfg)
    except Exception as e:  # noqa: BLE001 - the row records it; the run goes on
        return dict(cfg, error=f'{type(e).__name__}: {e}'[:300])
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def run_subprocess(cfg: dict, timeout: float) -> dict:
    r"""One configuration in a fresh process; a failed one is a row with an ``error``."""
    try:
        return in_fresh_process(__file__, cfg, timeout=timeout)
    except MeasurementFailed as e:
        return dict(cfg, error=str(e))


def plot(rows, path):
    plt = pyplot()
    groups = sorted({(r['degrees'], r['dim']) for r in rows if r['conv'] == 'sage'})
    if not groups:  # nothing measured with SAGEConv (e.g. every row filtered out)
        return
    fig, axes = plt.subplots(2, len(groups), figsize=(4 * len(groups), 7), squeeze=False)
    step = 'inference' if any(r.get('inference') for r in rows) else 'forward+backward'
    for col, (degrees, dim) in enumerate(groups):
        for row, (key, label) in enumerate((('median_ms', f'{step}, median ms'),
                                            ('peak_mib', 'peak memory, MiB'))):
            ax = axes[row][col]
            for aggr in AGGRS:
                pts = sorted((r['nodes'] + r['edges'], r[key]) for r in rows
                             if r['conv'] == 'sage' and r['degrees'] == degrees
                             and r['dim'] == dim and r['aggr'] == aggr and r.get(key))
                if pts:
                    ax.plot(*zip(*pts), marker='o', label=aggr)
            ax.set_xscale('log')
            ax.set_yscale('log')
            ax.set_xlabel('nodes + edges')
            ax.set_ylabel(label)
            ax.set_title(f'SAGEConv, {degrees} in-degrees, d = {dim}')
            ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def plan(args: argparse.Namespace) -> List[dict]:
    r"""The configurations a run measures, in order (degree distribution, width, graph size,
    convolution, aggregation), each as the ``cfg`` of :func:`run_one`, after the run's filters
    (largest graphs of ``paper``, ``mz-ng8`` and power-law degrees, the checkpointed rows' sizes
    and widths, padded ``pyg`` on power-law graphs)."""
    cfgs = []
    for degrees in args.degrees:
        for dim in args.dims:
            for nodes in args.nodes:
                if degrees == 'power-law' and nodes > args.power_law_max_nodes:
                    continue
                convs = CONVS if nodes == args.graphconv_nodes else ('sage', )
                for conv in convs:
                    for aggr in args.aggrs:
                        if aggr == 'paper' and nodes > args.paper_max_nodes:
                            continue
                        if aggr == 'mz-ng8' and nodes > args.ng8_max_nodes:
                            continue
                        if aggr in CKPT_AGGRS and (nodes < args.ckpt_min_nodes
                                                   or dim not in args.ckpt_dims):
                            continue
                        if (aggr in ('pyg', 'pyg-nofast') and degrees == 'power-law'
                                and nodes > 1000):
                            # pads every node to the hub's degree: nodes x hub x d floats
                            continue
                        cfg = dict(aggr=aggr, conv=conv, degrees=degrees, dim=dim, nodes=nodes,
                                   repeats=args.repeats, threads=args.threads, seed=0,
                                   device=args.device, keep=args.keep_freed_memory,
                                   allocated=args.allocated)
                        if getattr(args, 'new_graph', False):  # (absent otherwise: old rows match)
                            cfg['new_graph'] = True
                        if getattr(args, 'inference', False):  # (the same)
                            cfg['inference'] = True
                        if getattr(args, 'same_process', False):  # (the same)
                            cfg['same_process'] = True
                        if getattr(args, 'compile', False):  # (the same)
                            cfg['compile'] = True
                        if aggr.endswith('-chunks') and args.chunk_rows is not None:
                            cfg['group_rows'] = args.chunk_rows
                        cfgs.append(cfg)
    return cfgs


def measured(row: dict, cfg: dict) -> bool:
    r"""Whether :obj:`row` (of a results file) is a measurement of configuration :obj:`cfg`:
    every entry of :obj:`cfg` equal (aggregation, convolution, degrees, width, graph size,
    repeats, threads, seed, device, keep, allocated, and the group size of ``*-chunks`` rows,
    present in both or in neither; the switches :data:`ROW_FLAGS` alike, absent read as off),
    and not a failure."""
    return 'error' not in row and all(row.get(key) == cfg.get(key)
                                      for key in (set(cfg) | {'group_rows'}) - set(ROW_FLAGS)) \
        and all(bool(row.get(key)) == bool(cfg.get(key)) for key in ROW_FLAGS)


#: Switches a configuration carries only when on (so that the rows of files written before them
#: still match): a row measured with one is never kept for a run without it, nor the reverse.
ROW_FLAGS = ('new_graph', 'inference', 'same_process', 'compile')
#: ... and as a complete report written before them (its config without them) was made: off, so
#: that a run with one on does not replace such a report of the same other options unasked
PREDATED = dict.fromkeys(ROW_FLAGS, False)


def report_settings(args: argparse.Namespace) -> List[str]:
    r"""The :data:`REPORT_SETTINGS` that change a configuration of the run :obj:`args`:
    ``chunk_rows`` only where it runs a ``*-chunks`` aggregation (the only rows whose groups it
    sets), so that a run without one is the run of a report written when the default of
    ``--chunk-rows`` was another (131072, which older reports record)."""
    chunks = any(aggr.endswith('-chunks') for aggr in args.aggrs)
    return [key for key in REPORT_SETTINGS if chunks or key != 'chunk_rows']


def earlier_rows(path: str, args: argparse.Namespace) -> Tuple[List[dict], float, str]:
    r"""The rows of the report :obj:`path` that a resumed run may keep, the minutes that report
    took, and a sentence on what was found: no rows where the file is missing or unreadable, or
    was written with other :data:`FIGURE_SETTINGS` than :obj:`args`."""
    if not os.path.exists(path):
        return [], 0.0, f'nothing to resume: no {path}; measuring every row'
    try:
        with open(path) as f:
            earlier = json.load(f)
        config, rows = earlier['config'], [dict(r) for r in earlier['rows']]
        # (a config that is no object, or minutes that are no number: damaged, as a key lacking)
        differ = settings_differ(config, vars(args), FIGURE_SETTINGS)
        minutes = float(earlier.get('minutes') or 0.0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return [], 0.0, f'not resuming from {path} (unreadable: {e}); measuring every row'
    if differ:
        return [], 0.0, (f"not resuming from {path}: written with other settings "
                         f"({'; '.join(differ)}); measuring every row")
    return rows, minutes, f'resuming from {path}'


def lost_rows(rows: List[dict], earlier: Optional[dict]) -> List[dict]:
    r"""The configurations of the rows of :obj:`rows` that failed (an ``error``) and that the
    earlier complete report :obj:`earlier` (of the same settings; :obj:`None`: none) measured
    (:func:`measured`): a report of this run in its place would lose them."""
    if earlier is None:
        return []
    try:
        made = [r for r in earlier['rows'] if isinstance(r, dict)]
    except (KeyError, TypeError):  # (rows not as written: nothing known to be lost)
        return []
    lost = []
    for row in rows:
        cfg = {k: v for k, v in row.items() if k != 'error'}  # (a failed row: its cfg)
        if 'error' in row and any(measured(r, cfg) for r in made):
            lost.append(cfg)
    return lost


def lost_text(lost: List[dict]) -> str:
    r"""The configurations :obj:`lost` as the report names them."""
    return ', '.join(f"{c['degrees']} d={c['dim']} N={c['nodes']} {c['conv']} {c['aggr']}"
                     for c in lost)


def row_line(row: dict, kept: bool = False) -> str:
    r"""The line printed for a row."""
    msg = row.get('error') or (f"{row['median_ms']:10.1f} ms  "
                               f"{row['peak_mib'] or 0:9.1f} MiB")
    return (f"{row['degrees']:9s} d={row['dim']:3d} N={row['nodes']:7d} {row['conv']:5s} "
            f"{row['aggr']:13s} {msg}" + ('  (kept)' if kept else ''))


def summarise(rows: List[dict], args: argparse.Namespace) -> Tuple[List[dict], List[dict]]:
    r"""The ratios within each (degrees, dim, nodes, conv) group, from the medians of
    :obj:`rows`, and the slopes of log time and log memory against log(nodes + edges) of each
    (degrees, dim, aggregation) with SAGEConv."""
    ratios = []
    keys = sorted({(r['degrees'], r['dim'], r['nodes'], r['conv']) for r in rows})
    for degrees, dim, nodes, conv in keys:
        by = {r['aggr']: r for r in rows if (r['degrees'], r['dim'], r['nodes'], r['conv'])
              == (degrees, dim, nodes, conv) and 'error' not in r}
        entry = dict(degrees=degrees, dim=dim, nodes=nodes, conv=conv)
        if 'rigid' in by and 'pyg' in by:
            entry['rigid/pyg time'] = by['rigid']['median_ms'] / by['pyg']['median_ms']
            if by['rigid'].get('peak_mib') and by['pyg'].get('peak_mib'):
                entry['rigid/pyg memory'] = by['rigid']['peak_mib'] / by['pyg']['peak_mib']
            if by['rigid'].get('alloc_mib') and by['pyg'].get('alloc_mib'):
                entry['rigid/pyg allocated'] = by['rigid']['alloc_mib'] / by['pyg']['alloc_mib']
        if 'rigid' in by and 'pyg-nofast' in by:  # PyG with the fast path off
            mine, theirs = by['rigid'], by['pyg-nofast']
            entry['rigid/pyg-nofast time'] = mine['median_ms'] / theirs['median_ms']
            if mine.get('peak_mib') and theirs.get('peak_mib'):
                entry['rigid/pyg-nofast memory'] = mine['peak_mib'] / theirs['peak_mib']
        if 'pyg-nofast' in by and 'pyg' in by:
            entry['pyg-nofast/pyg time'] = by['pyg-nofast']['median_ms'] / by['pyg']['median_ms']
        for aggr in ('pyg-flat', 'rigid-ckpt-attn', 'rigid-chunks', 'rigid-whole',
                     'rigid-merged'):
            if aggr in by and 'pyg' in by:
                mine, theirs = by[aggr], by['pyg']
                entry[f'{aggr}/pyg time'] = mine['median_ms'] / theirs['median_ms']
                if mine.get('peak_mib') and theirs.get('peak_mib'):
                    entry[f'{aggr}/pyg memory'] = mine['peak_mib'] / theirs['peak_mib']
                if mine.get('alloc_mib') and theirs.get('alloc_mib'):
                    entry[f'{aggr}/pyg allocated'] = mine['alloc_mib'] / theirs['alloc_mib']
        for aggr in ('default', 'default-eager', 'default-fused', 'default-ckpt',
                     'default-ckpt-attn', 'default-chunks', 'default-whole', 'mz-ng8',
                     'paper'):
            if aggr in by and 'rigid' in by:
                entry[f'{aggr}/rigid time'] = by[aggr]['median_ms'] / by['rigid']['median_ms']
        for aggr in ('rigid-whole', 'rigid-merged'):  # against the default's configuration
            if aggr in by and 'rigid' in by:
                entry[f'{aggr}/rigid time'] = by[aggr]['median_ms'] / by['rigid']['median_ms']
        for aggr in ('rigid', 'default'):  # the folded key maps against the unfolded ones
            if aggr in by and f'{aggr}-unfolded' in by:
                entry[f'{aggr}/{aggr}-unfolded time'] = (by[aggr]['median_ms']
                                                         / by[f'{aggr}-unfolded']['median_ms'])
        ratios.append(entry)
    slopes = []
    for degrees in args.degrees:
        for dim in args.dims:
            for aggr in args.aggrs:
                sel = [r for r in rows if r['degrees'] == degrees and r['dim'] == dim
                       and r['aggr'] == aggr and r['conv'] == 'sage']
                if len(sel) >= 2:
                    slopes.append(dict(degrees=degrees, dim=dim, aggr=aggr,
                                       time_slope=fit_slope(sel, 'median_ms'),
                                       memory_slope=fit_slope(sel, 'peak_mib')))
    return ratios, slopes


RATIO_COLS = ['degrees', 'dim', 'nodes', 'conv', 'pyg-flat/pyg time', 'pyg-flat/pyg memory',
              'pyg-flat/pyg allocated', 'rigid/pyg time', 'rigid/pyg memory',
              'rigid/pyg allocated', 'rigid/pyg-nofast time', 'rigid/pyg-nofast memory',
              'pyg-nofast/pyg time',
              'rigid-ckpt-attn/pyg time', 'rigid-ckpt-attn/pyg memory',
              'rigid-ckpt-attn/pyg allocated',
              'rigid-chunks/pyg time', 'rigid-chunks/pyg memory', 'rigid-chunks/pyg allocated',
              'rigid-whole/pyg time', 'rigid-whole/pyg memory', 'rigid-whole/pyg allocated',
              'rigid-whole/rigid time',
              'rigid-merged/pyg time', 'rigid-merged/pyg memory', 'rigid-merged/pyg allocated',
              'rigid-merged/rigid time',
              'default/rigid time', 'default-eager/rigid time', 'default-fused/rigid time',
              'default-ckpt/rigid time',
              'default-ckpt-attn/rigid time', 'default-chunks/rigid time',
              'default-whole/rigid time',
              'mz-ng8/rigid time',
              'paper/rigid time', 'rigid/rigid-unfolded time',
              'default/default-unfolded time']
ROW_COLS = ['degrees', 'dim', 'nodes', 'edges', 'max_degree', 'conv', 'aggr', 'median_ms',
            'peak_mib', 'alloc_mib', 'alloc_error', 'error']


def write_report(args: argparse.Namespace, env: dict, rows: List[dict], planned: int,
                 minutes: float, earlier_minutes: float = 0.0, kept: int = 0,
                 plot: bool = False, lost: Sequence[dict] = (),
                 overwrite: bool = False) -> List[dict]:
    r"""Writes ``<out>/message_passing.{json,md}`` from :obj:`rows` (of :obj:`planned`);
    while fewer, ``<out>/message_passing.partial.{json,md}`` instead, marked partial
    (``complete: false``, a line ``partial: N of M rows measured``), which the complete report
    removes, and likewise where rows failed that the earlier complete report measured
    (:obj:`lost`: their configurations, listed; that report is kept); :obj:`minutes` in all,
    :obj:`earlier_minutes` of them in the run resumed, whose :obj:`kept` rows (``--resume``)
    the ratios' heading counts. The report links ``message_passing.png`` where :obj:`plot`
    says this run drew it. A partial report records :obj:`overwrite` (the run replaces the
    complete report whatever fails: ``--overwrite``, or resumed from a partial report that
    records it). Returns the ratios."""
    ratios, slopes = summarise(rows, args)
    complete = len(rows) >= planned and not lost
    partial = '' if complete else (
        f'partial: {len(rows)} of {planned} rows measured (the run stopped or is still '
        f'running; `--resume` measures the rest)\n\n') if len(rows) < planned else (
        f'partial: {len(lost)} row(s) failed here ({lost_text(list(lost))}) that the earlier '
        f'`{NAME}.json` measured, which is kept (`--resume` measures them again; '
        f'`--overwrite` replaces it with this report)\n\n')
    resumed = f' ({earlier_minutes:.1f} of them in the run resumed)' if earlier_minutes else ''
    markdown = ('# MZAggregation in message passing against PyG\'s SetTransformerAggregation\n\n'
                + partial +
                f"Command: `{env['command']}`  \n"
                f"torch {env['torch']}, torch_geometric {env['torch_geometric']}, "
                f"{args.threads} thread(s), device {args.device}, "
                f"torch-scatter: {env['torch_scatter']}; "
                f"{minutes:.1f} min{resumed}; glibc malloc keeping freed memory "
                f"(`keep_freed_memory()`): {args.keep_freed_memory}. "
                + ("Inference: one forward pass of one convolution in `eval()` mode under "
                   "`torch.no_grad()` (`--inference`), median of "
                   if getattr(args, 'inference', False) else
                   "Forward + backward of one convolution, median of ")
                + f"{args.repeats} calls, "
                + ("every convolution compiled by `torch.compile` (inductor) in its untimed "
                   "first call (`--compile`), " if getattr(args, 'compile', False) else "")
                + ("each on a graph seen for the first time (`--new-graph`: the attention "
                   "layouts cleared before every call, as with a new mini-batch every step)"
                   if getattr(args, 'new_graph', False) else
                   "each on the graph of the call before (as in "
                   + ("full-graph inference" if getattr(args, 'inference', False)
                      else "full-batch training")
                   + ": `MZAggregation` finds its attention layouts again; `--new-graph` "
                   "clears them before every call)")
                + "; peak memory = "
                + ("the CUDA allocator's peak (the tensor memory held at once)"
                   if args.device == 'cuda' else 'the peak resident set')
                + " of one call above the state before it, "
                + ("every row in this process, the peak reset for each (`--same-process`)"
                   if getattr(args, 'same_process', False) else "in a fresh process per row")
                + ", after one untimed call (which compiles where the compiled kernels run); "
                + ("allocated = the most tensor memory "
                   "one more call holds at once (PyTorch's allocator total under the profiler; "
                   "pages the C allocator reuses or maps fresh are in the first figure, not in "
                   "this one; `alloc_error` where that figure alone failed).\n\n"
                   if args.allocated else
                   "the tensor memory held at once was not measured (`--no-allocated`).\n\n")
                + ('## Ratios (medians of this run)\n\n' if not kept else
                   f'## Ratios (medians of this run and of the run it resumed: {kept} of '
                   f'{len(rows)} rows kept from that run by `--resume`)\n\n')
                + markdown_table(ratios, RATIO_COLS)
                + '\n## Growth with the graph (slope of log time / log memory against '
                  'log(nodes + edges), SAGEConv)\n\n'
                + markdown_table(slopes, ['degrees', 'dim', 'aggr', 'time_slope',
                                          'memory_slope'])
                + '\n## All measurements\n\n' + markdown_table(rows, ROW_COLS)
                + (f'\n![plot]({NAME}.png)\n' if plot else ''))
    write_results_so_far(args.out, NAME,
                         dict(environment=env, config=vars(args), minutes=minutes,
                              complete=complete, planned_rows=planned, rows=rows, ratios=ratios,
                              slopes=slopes, **({'lost': list(lost)} if lost else {}),
                              **({'overwrite': True} if overwrite and not complete else {})),
                         markdown, complete)
    return ratios


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> List[dict]:
    r"""Refuses (argparse's usage error) what the types alone cannot: PyG's aggregations at a
    width that is not a multiple of their heads, ``cuda`` where there is none, a run whose
    filters leave nothing to measure; first sets ``--nodes``, ``--dims`` and ``--repeats`` where
    not given (:data:`DEFAULTS`, with ``--quick`` :data:`QUICK`). Returns the run's
    configurations (:func:`plan`)."""
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key, None) is None:  # (one given on the command line wins)
            setattr(args, key, list(value) if isinstance(value, list) else value)
    problem = pyg_width_problem(args.aggrs, args.dims)
    if problem:
        parser.error(f'argument --dims: {problem}')
    if args.device == 'cuda' and not torch.cuda.is_available():
        parser.error("argument --device: 'cuda' is not available here")
    only = [aggr for aggr in args.aggrs if aggr in INFERENCE_ONLY]
    if only and not getattr(args, 'inference', False):
        parser.error(f"argument --aggrs: {', '.join(only)} only with --inference (PyTorch's "
                     'attention fast path runs only without gradients: in training it is pyg)')
    if getattr(args, 'same_process', False) and args.device != 'cuda':
        parser.error('argument --same-process: only with --device cuda (on the CPU the peak '
                     'is the resident set, which needs a fresh process per row)')
    cfgs = plan(args)
    if not cfgs:
        parser.error('nothing to measure: every configuration of --degrees, --dims, --nodes '
                     'and --aggrs is left out by the size and width limits (--power-law-max-'
                     'nodes, --paper-max-nodes, --ng8-max-nodes, --ckpt-min-nodes, --ckpt-dims)')
    return cfgs


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    parser.add_argument('--nodes', type=int_list(), default=None,
                        help='comma-separated graph sizes (average in-degree 10; default: '
                             '1000,10000,100000, with --quick 1000,10000)')
    parser.add_argument('--dims', type=int_list(), default=None,
                        help='comma-separated widths (default: 16,64, with --quick 16)')
    parser.add_argument('--degrees', type=choice_list(DEGREES), default=','.join(DEGREES))
    parser.add_argument('--aggrs', type=choice_list(AGGRS),
                        default=','.join(a for a in AGGRS if a not in INFERENCE_ONLY),
                        help=f"comma-separated aggregations (default: all but "
                             f"{', '.join(INFERENCE_ONLY)}, which run with --inference only)")
    parser.add_argument('--graphconv-nodes', type=nonnegative_int, default=10000,
                        help='graph size at which GraphConv is also measured (0: never)')
    parser.add_argument('--paper-max-nodes', type=nonnegative_int, default=1000,
                        help="largest graph for the 'paper' body (16 inducing tokens per set)")
    parser.add_argument('--ng8-max-nodes', type=nonnegative_int, default=10000,
                        help="largest graph for 'mz-ng8' (the paper's generator budget)")
    parser.add_argument('--ckpt-min-nodes', type=nonnegative_int, default=100000,
                        help="smallest graph for the checkpointed rows (*-ckpt*)")
    parser.add_argument('--ckpt-dims', type=int_list(), default='16',
                        help="widths for the checkpointed rows (*-ckpt*)")
    parser.add_argument('--power-law-max-nodes', type=nonnegative_int, default=10000,
                        help='largest power-law graph (its hub has ~8%% of all edges, and an SAB '
                             'is quadratic in it)')
    parser.add_argument('--chunk-rows', type=positive_int, default=None,
                        help="rows per recomputed group of the *-chunks aggregations (default: "
                             "the groups of chunk_size='auto' at each width, 2^21 / d)")
    parser.add_argument('--repeats', type=positive_int, default=None,
                        help='timed calls per row (default: 5, with --quick 3)')
    parser.add_argument('--threads', type=positive_int, default=1)
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu',
                        help="GPU memory is the allocator's peak")
    parser.add_argument('--timeout', type=positive_float, default=900,
                        help='seconds per configuration before it is reported as timed out')
    parser.add_argument('--quick', action='store_true',
                        help='graphs of 1,000 and 10,000 nodes, d = 16, 3 repeats, each '
                             'unless --nodes, --dims or --repeats is given (which wins)')
    parser.add_argument('--out', default=None,
                        help=f'results folder (default: benchmarks/results/{NAME}, with '
                             f'--inference benchmarks/results/{NAME}_inference)')
    # (--resume keeps the rows that match of the partial report, else of the complete one)
    add_partial_arguments(parser, UNIT,
                          resume_help=f'keep the rows of <out>/{PARTIAL}.json (an interrupted '
                                      f'run), or where there is none of <out>/{NAME}.json, '
                                      'measured with the same configuration and settings; '
                                      'measure only the others',
                          overwrite_help=f'measure every row where <out> holds the partial '
                                         f'report of an interrupted run ({PARTIAL}.json), which '
                                         f'this run replaces (without it, and without --resume, '
                                         f'such a folder is refused)')
    parser.add_argument('--keep-freed-memory', action='store_true',
                        help="every row with glibc's malloc keeping freed memory for reuse "
                             '(torch_mz.runtime.keep_freed_memory)')
    parser.add_argument('--no-allocated', dest='allocated', action='store_false',
                        help='skip the tensor memory held at once (two more profiled calls per '
                             'row; the resident-set peak and the times are measured either way)')
    parser.add_argument('--new-graph', action='store_true',
                        help='clear the attention layouts before every call (a new graph each '
                             'step, as with mini-batches; otherwise every call after the first '
                             'finds the layouts of the graph again, as in full-batch training)')
    parser.add_argument('--inference', action='store_true',
                        help='time one forward pass in eval() mode without gradients (full-'
                             'graph inference) instead of forward + backward')
    parser.add_argument('--same-process', action='store_true',
                        help='with --device cuda: every row in this process (no CUDA start-up '
                             "per row; the peak is the allocator's, reset per row; --timeout "
                             'does not apply)')
    parser.add_argument('--compile', action='store_true',
                        help='every convolution wrapped in torch.compile (its default backend, '
                             'inductor), compiled in the untimed first call of each row')
    parser.add_argument('--_one', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.out is None:  # inference rows never land among the training runs' files
        args.out = os.path.join(os.path.dirname(__file__), 'results',
                                NAME + ('_inference' if args.inference else ''))
    if args._one:
        print(json.dumps(run_one(json.loads(args._one))))
        return
    cfgs = check_args(parser, args)  # before any measurement
    problem = check_out_folder(args.out)  # (found only once the first row was measured)
    if problem:
        parser.error(problem)
    # (a run stopped between writing its complete report and removing the partial one)
    if stale_partial_done(args.out, NAME, args, report_settings(args), PREDATED,
                          say=lambda note: print(note, flush=True)):
        return None
    partial = os.path.join(args.out, f'{PARTIAL}.json')
    problem = partial_problem(args.resume, args.overwrite, partial, UNIT,
                              keeps='those that match', held_note=(
                                  ' (or of one whose rows failed where the complete report '
                                  'beside it measured them)'))
    if problem:
        parser.error(problem)
    # the rows' threads (each row sets them in its process), not this process's
    env = dict(environment(), threads=args.threads)
    # (nor is the partial report of other options: this run would replace it, keeping the rows
    # of its own configurations alone)
    problem = (resume_problem(partial, args, report_settings(args), env['command'], PREDATED)
               if args.resume else None)
    if problem:
        parser.error(problem)
    kept, earlier_minutes, note = [], 0.0, None
    # (--resume reads the partial report, else the complete one: what a Ctrl-C keeps until
    # this run writes)
    resumed = partial if os.path.exists(partial) else os.path.join(args.out, f'{NAME}.json')
    if args.resume:
        kept, earlier_minutes, note = earlier_rows(resumed, args)
    complete_path = os.path.join(args.out, f'{NAME}.json')
    # (a complete report of other options is not replaced unasked, but by the run that a
    # partial report resumed here began; one of these options is, but for the rows that fail
    # here, which it keeps: earlier)
    problem = replace_problem(complete_path, args, report_settings(args), env['command'],
                              args.overwrite,
                              resumed=bool(kept) and os.path.exists(partial), predated=PREDATED)
    if problem:
        parser.error(problem)
    # (--overwrite, or resuming the partial report of a call given it: replaced whatever fails)
    replacing = args.overwrite or (bool(kept) and overwriting(partial))
    earlier = (None if replacing
               else same_settings_report(complete_path, args, report_settings(args), PREDATED))
    if note:  # (what --resume found)
        print(note, flush=True)
    start = time.time()
    rows, note, lost, ratios = [], None, [], []
    png = os.path.join(args.out, f'{NAME}.png')
    # the rows kept, by their configuration's place in the run (each a row of the report
    # resumed that measured it)
    reused = {i: row for i, row in enumerate(
        next((r for r in kept if measured(r, cfg)), None) for cfg in cfgs) if row is not None}
    minutes_before = earlier_minutes if reused else 0.0

    def measure(i: int) -> dict:
        return (run_in_process(cfgs[i]) if args.same_process
                else run_subprocess(cfgs[i], args.timeout))
    # (kept: the report resumed, else none before this call wrote a row)
    with interruptible(__file__, sys.argv[1:], parser, kept=resumed if reused else None,
                       what='rows') as stop:
        # (the rows kept not reached yet stay in the partial report: turn.reached)
        for turn in in_turn(range(len(cfgs)), reused, measure):
            print(row_line(turn.value, kept=turn.kept), flush=True)
            if not turn.write:
                continue
            rows = turn.reached
            lost = [] if turn.pending else lost_rows(rows, earlier)
            # (the plot first: the report links it if drawn)
            complete = not turn.pending and not lost
            note = replace_plot(png, plot, rows, png) if complete else None
            ratios = write_report(args, env, rows, len(cfgs),
                                  minutes_before + (time.time() - start) / 60, minutes_before,
                                  kept=len(reused), plot=complete and note is None, lost=lost,
                                  overwrite=replacing)
            stop.kept = os.path.join(args.out, f"{NAME if complete else PARTIAL}.json")
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if args.resume:
        print(f'{len(reused)} of {len(cfgs)} rows kept from the earlier report, '
              f'{len(cfgs) - len(reused)} measured', flush=True)
    if lost:
        print(markdown_table(ratios, RATIO_COLS))
        print(f'{lost_text(lost)} failed here but were measured by {complete_path}, which is '
              f'kept: this report is partial ({partial}); pass --resume to measure them again, '
              f'or --overwrite to replace {complete_path}', file=sys.stderr, flush=True)
        print(f'wrote {args.out}/{PARTIAL}.json, .md')
        return
    if note:
        print(note)
    print(markdown_table(ratios, RATIO_COLS))
    print(f"wrote {args.out}/{NAME}.json, .md{'' if note else ', .png'}")


if __name__ == '__main__':
    sys.exit(main())
