r"""Where issue 10's operator-cost targets stand, read from the committed benchmark results.

Nothing is timed here: every figure comes from the JSON file a benchmark wrote (each names the
command that produced it), so the table can be rebuilt on any machine in a second and always
says what the results files say. A target is *met* when every measurement of it meets the
threshold, *not met* when none does, *mixed* otherwise (read the measurements: a ratio at the
threshold on a noisy host, or a regime where it fails), and *not measured* when no results file
has it.

The targets (issue 10, "What to build", item 2):

* message passing (``message_passing.py``, ``SAGEConv``/``GraphConv``): ``rigid`` (PyG's block
  structure, 1 SAB + PMA) at <= 1.0x PyG's time on Poisson-degree graphs and <= 0.5x its peak
  memory, >= 100x faster on power-law graphs; the default ``MZAggregation`` within 3x ``rigid``'s
  time; its forward + backward on the 10^5-node graph (10^6 edges) within 4 GB (4e9 bytes);
  memory linear in N + E (fitted log-log slope <= 1.1, this script's tolerance);
* 10^5 singleton sets through the default aggregation in inference within 1 GB (1e9 bytes,
  ``scaling.py --set-size 1``);
* point-cloud training (``training_step.py``, 32 x 1,024 points; the small-set run of 128 x 20
  points and the large-batch run of 128 x 1,024 points are listed too, regimes beyond the
  issue's batch): ``mz`` training step <= 4x ``rigid``'s,
  inference <= 3x, the ``mz`` path at no lower a fraction of the matmul peak than ``rigid``'s
  (each pair with the same options: plain, or both with kept memory), every preset at >= 40% of
  the measured matmul peak;
* ``speed.py``: ``rigid`` at <= 1.0x PyG's time on the uniform batches (SAB and PMA), >= 10x
  faster on the skewed SAB batch.

Companion rows (not targets of the issue) put some of these beside what bounds them: PyG's own
blocks on the flat layout (``pyg-flat``), ``rigid`` in recomputed groups, and the inference
FLOP ratio of ``mz`` to ``rigid``, the time ratio both would have at the same FLOP rate (fixed
by the paper's architecture: more than half of ``mz``'s inference products are the generator
feed-forward on every generator row), and PyG's FLOPs over ``rigid``'s on the skewed SAB batch,
the speed-up both would have at the same FLOP rate (``rigid`` computes exactly the
:math:`\sum_i n_i^2` scores of its sets; PyG pads every set to the largest), and the message-passing
memory ratio read as the tensor memory held at once (the allocator's peak) where the runs record
it, beside the resident-set ratio of the target. Full-graph inference (``message_passing.py
--inference``: one forward pass in ``eval()`` mode without gradients, a regime the issue does not
name) gets the message-passing time and memory thresholds as companion rows of its own; its
memory slopes count in the linear-memory target.

Run: ``python benchmarks/targets.py`` (writes ``benchmarks/results/targets/targets.{json,md,png}``).
"""
import argparse
import json
import os
import shlex
import sys
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, 'results')

#: The results files read, by label: the current runs of each benchmark.
SOURCES = {
    'message_passing': 'message_passing/message_passing.json',
    'message_passing_small': 'message_passing_small/message_passing.json',
    'message_passing_checkpoint': 'message_passing_checkpoint/message_passing.json',
    'message_passing_ckpt_d64': 'message_passing_ckpt_d64/message_passing.json',
    'message_passing_chunks': 'message_passing_chunks/message_passing.json',
    'message_passing_chunks_keep': 'message_passing_chunks_keep/message_passing.json',
    'message_passing_flat': 'message_passing_flat/message_passing.json',
    'message_passing_flat_1e5': 'message_passing_flat_1e5/message_passing.json',
    'message_passing_flat_power_law': 'message_passing_flat_power_law/message_passing.json',
    'message_passing_chunks_1e4': 'message_passing_chunks_1e4/message_passing.json',
    'message_passing_auto_1e5': 'message_passing_auto_1e5/message_passing.json',
    'message_passing_kernels': 'message_passing_kernels/message_passing.json',
    'message_passing_fold': 'message_passing_fold/message_passing.json',
    'message_passing_fold_power_law': 'message_passing_fold_power_law/message_passing.json',
    'message_passing_fold_1e5': 'message_passing_fold_1e5/message_passing.json',
    'message_passing_rows': 'message_passing_rows/message_passing.json',
    'speed': 'speed/speed.json',
    'speed_rerun': 'speed_rerun/speed.json',
    'speed_fold': 'speed_fold/speed.json',
    'speed_fold_rerun': 'speed_fold_rerun/speed.json',
    'speed_current': 'speed_current/speed.json',
    # (the input projection's activation recomputed by a function of its own, no checkpoint)
    'speed_projection': 'speed_projection/speed.json',
    'training_step': 'training_step/training_step.json',
    'training_step_small_sets': 'training_step_small_sets/training_step.json',
    'training_step_egnn': 'training_step_egnn/training_step.json',
    'training_step_rounds': 'training_step_rounds/training_step.json',
    'training_step_large_batch': 'training_step_large_batch/training_step.json',
    'training_step_thp': 'training_step_thp/training_step.json',
    'training_step_fold': 'training_step_fold/training_step.json',
    'training_step_current': 'training_step_current/training_step.json',
    # (`+kept` rows beside the defaults: the MZ body in groups of 4,096 rows, all kept)
    'training_step_kept': 'training_step_kept/training_step.json',
    'training_step_kept_presets': 'training_step_kept_presets/training_step.json',
    # (the presets' default trains large batches in kept groups without kept memory; `+whole`
    # rows: the whole batch, the default before)
    'training_step_groups': 'training_step_groups/training_step.json',
    'training_step_groups_large_batch': 'training_step_groups_large_batch/training_step.json',
    # (auto mode's tanh measured per process, unrecorded in this run's rows: ATen's by
    # kernels_20261205's measurement on that host; `+fused` rows: every kernel compiled)
    'training_step_tanh': 'training_step_tanh/training_step.json',
    # on a GPU (one NVIDIA H200, benchmarks/gpu_check.sh; see benchmarks/results/gpu/README.md)
    'gpu_message_passing': 'gpu/message_passing/message_passing.json',
    # (`--new-graph`: the attention layouts computed in every call, as with mini-batches)
    'gpu_message_passing_new_graph': 'gpu/message_passing_new_graph/message_passing.json',
    'message_passing_cached': 'message_passing_cached/message_passing.json',
    'message_passing_new_graph': 'message_passing_new_graph/message_passing.json',
    'message_passing_inference': 'message_passing_inference/message_passing.json',
    'gpu_message_passing_inference': 'gpu/message_passing_inference/message_passing.json',
    # (`pyg-nofast`: PyG's aggregation with PyTorch's attention fast path off, beside `pyg`)
    'message_passing_inference_nofast': 'message_passing_inference_nofast/message_passing.json',
    # (the 10^3-node Poisson graphs of that run again, 9 calls per row)
    'message_passing_inference_small': 'message_passing_inference_small/message_passing.json',
    # (after the dense attention dropped its packed buffers before reordering its outputs)
    'message_passing_inference_freed': 'message_passing_inference_freed/message_passing.json',
    # (the folded keys read from the packed values' buffer, grouped_attention(_key_col=...))
    'message_passing_shared_keys': 'message_passing_shared_keys/message_passing.json',
    # (d = 16, after the input projection's activation left torch.utils.checkpoint)
    'message_passing_projection': 'message_passing_projection/message_passing.json',
    # (the power-law graph of 10^4 nodes before and after wide values took the fused kernel
    # with padded keys, and the 10^3-node one after)
    'message_passing_power_law_1e4': 'message_passing_power_law_1e4/message_passing.json',
    'message_passing_power_law_1e4_padded':
        'message_passing_power_law_1e4_padded/message_passing.json',
    'message_passing_power_law_padded': 'message_passing_power_law_padded/message_passing.json',
    'message_passing_power_law_1e4_d64_padded':
        'message_passing_power_law_1e4_d64_padded/message_passing.json',
    'message_passing_inference_power_law_padded':
        'message_passing_inference_power_law_padded/message_passing.json',
    # (inference at 10^4 nodes, d = 64, with and without malloc keeping freed memory)
    'message_passing_inference_malloc': 'message_passing_inference_malloc/message_passing.json',
    'message_passing_inference_malloc_keep':
        'message_passing_inference_malloc_keep/message_passing.json',
    # (torch.compile, 2026-12-06: the compiled runs are listed, not counted, since compiling
    # changes both sides of a ratio differently (PyG's aggregation 1.58-1.73x slower compiled
    # at d = 64, rigid 0.81-1.09x); the same commands eager, their `_eager` twins, count)
    'message_passing_compile': 'message_passing_compile/message_passing.json',
    'message_passing_compile_eager': 'message_passing_compile_eager/message_passing.json',
    'message_passing_compile_d64': 'message_passing_compile_d64/message_passing.json',
    'message_passing_compile_d64_eager':
        'message_passing_compile_d64_eager/message_passing.json',
    'message_passing_compile_power_law':
        'message_passing_compile_power_law/message_passing.json',
    'message_passing_compile_power_law_eager':
        'message_passing_compile_power_law_eager/message_passing.json',
    'message_passing_compile_inference':
        'message_passing_compile_inference/message_passing.json',
    'message_passing_compile_inference_eager':
        'message_passing_compile_inference_eager/message_passing.json',
    # (the presets compiled beside eager, before and after dropout's masks stopped taking
    # inductor's generated random numbers, 2026-12-06)
    'training_step_compile': 'training_step_compile/training_step.json',
    'training_step_compile_rng': 'training_step_compile_rng/training_step.json',
    # (the three regimes again on the code of 2026-12-07, nothing else running: the first
    # timing since the benchmark scripts learned to keep partial reports)
    'training_step_20261207': 'training_step_20261207/training_step.json',
    'message_passing_20261207': 'message_passing_20261207/message_passing.json',
    'speed_20261207': 'speed_20261207/speed.json',
    'gpu_speed': 'gpu/speed/speed.json',
    'gpu_training_step': 'gpu/training_step/training_step.json',
    # on one NVIDIA H100 (benchmarks/gpu_check.sh and benchmarks/gpu_profile.py, 2026-12-06;
    # see benchmarks/results/gpu_h100/README.md): the first GPU run of chunk_size='auto' sized
    # by the device's memory (these graphs at once), and the presets' step times from the
    # profile (its unprofiled wall times; training_step.py was cut off by its limit there)
    'gpu_h100_message_passing': 'gpu_h100/message_passing/message_passing.json',
    'gpu_h100_message_passing_new_graph':
        'gpu_h100/message_passing_new_graph/message_passing.json',
    'gpu_h100_message_passing_inference':
        'gpu_h100/message_passing_inference/message_passing.json',
    'gpu_h100_speed': 'gpu_h100/speed/speed.json',
    'gpu_h100_profile': 'gpu_h100/profile/gpu_profile.json',
    'scaling_sets_of_1': 'scaling/scaling_default_sets_of_1.json',
    'scaling_mz': 'scaling/scaling_mz.json',
}
#: Rows of a results file measured before a change that a newer file measures again:
#: (source label, row name) -> the reason. They are listed, not counted.
_UNFOLDED = ("measured before the key map joined the queries of blocks with few queries per set "
             "(`MZAttention(fold_keys=True)`, 2026-12-03); the default's configuration is measured "
             "in `speed_fold` (its `-unfolded` rows are the earlier one)")
_WHOLE = ("measured before the presets' default trained (and inferred) large batches in kept "
          "groups where glibc's malloc does not keep freed memory (`malloc_chunk_rows`, "
          "2026-12-05): this row trained the whole batch without kept memory, what the "
          "`+whole` rows of `training_step_groups` (listed too) measure")
SUPERSEDED: Dict[Tuple[str, str], str] = {
    ('speed', 'rigid'): _UNFOLDED,
    ('speed_rerun', 'rigid'): _UNFOLDED,
    **{(label, model): _WHOLE
       for label, models in (('training_step', ('mz', 'mz+eager')),
                             ('training_step_rounds', ('mz', )),
                             ('training_step_thp', ('mz', 'mz+thp')),
                             ('training_step_fold', ('mz', )),
                             ('training_step_current', ('mz', )),
                             ('training_step_kept', ('mz', )),
                             ('training_step_groups', ('mz+whole', 'rigid+whole')),
                             ('training_step_groups_large_batch', ('mz+whole', 'rigid+whole')))
       for model in models},
}
MESSAGE_PASSING = ('message_passing', 'message_passing_small', 'message_passing_checkpoint',
                   'message_passing_ckpt_d64', 'message_passing_chunks',
                   'message_passing_chunks_keep', 'message_passing_flat',
                   'message_passing_flat_1e5', 'message_passing_flat_power_law',
                   'message_passing_chunks_1e4', 'message_passing_auto_1e5',
                   'message_passing_kernels', 'message_passing_fold',
                   'message_passing_fold_power_law', 'message_passing_fold_1e5',
                   'message_passing_rows', 'gpu_message_passing',
                   'gpu_message_passing_new_graph', 'message_passing_cached',
                   'message_passing_new_graph', 'message_passing_shared_keys',
                   'message_passing_projection', 'message_passing_power_law_1e4',
                   'message_passing_power_law_1e4_padded', 'message_passing_power_law_padded',
                   'message_passing_power_law_1e4_d64_padded', 'gpu_h100_message_passing',
                   'gpu_h100_message_passing_new_graph', 'message_passing_compile_eager',
                   'message_passing_compile_d64_eager', 'message_passing_compile_power_law_eager',
                   'message_passing_20261207')
#: Message-passing files of full-graph inference (``--inference``: forward only, no gradients):
#: read by their own companion rows, never as the training step of the targets above.
MP_INFERENCE = ('message_passing_inference', 'gpu_message_passing_inference',
                'message_passing_inference_nofast', 'message_passing_inference_small',
                'message_passing_inference_freed', 'message_passing_inference_power_law_padded',
                'gpu_h100_message_passing_inference', 'message_passing_inference_malloc',
                'message_passing_inference_malloc_keep', 'message_passing_compile_inference_eager')
#: Message-passing files measured after the PMA's key map joined its seed
#: (``MZAttention(fold_keys=True)``, 2026-12-03). At d = 64 the default configurations fold it
#: (at d = 16 they do not), so ``rigid`` and ``default`` rows at d = 64 in the other files
#: measured another computation: they are listed, not counted, nor their memory slopes (the
#: ``-chunks`` rows too where they stand for them; the recomputed-group companion targets still
#: count ``rigid-chunks`` rows as themselves, measured before the fold or after it). The
#: training-step runs before the fold all count: in training the presets' attention dropout
#: keeps the key map on the keys (the same computation); their inference rows measured
#: ``rigid`` unfolded (5.99 instead of 5.48 GFLOP), which if anything lowers those ``mz`` /
#: ``rigid`` inference ratios.
FOLDED_MP = ('message_passing_fold', 'message_passing_fold_power_law',
             'message_passing_fold_1e5', 'message_passing_rows', 'gpu_message_passing',
             'gpu_message_passing_new_graph', 'message_passing_cached',
             'message_passing_new_graph', 'message_passing_shared_keys',
             'message_passing_projection', 'message_passing_power_law_1e4',
             'message_passing_power_law_1e4_padded',
             'message_passing_power_law_padded',
             'message_passing_power_law_1e4_d64_padded', 'gpu_h100_message_passing',
             'gpu_h100_message_passing_new_graph', 'message_passing_compile_eager',
             'message_passing_compile_d64_eager',
             'message_passing_compile_power_law_eager',
             'message_passing_20261207') + MP_INFERENCE
FOLD_MIN_DIM = 64
#: Message-passing files measured after values wider than the keys took the fused attention
#: kernel with the queries and keys padded with zeros (2026-12-05) instead of split into extra
#: heads: it changed the default aggregation's time on power-law graphs (hubs of more than 256
#: neighbours; no Poisson graph here has a set that large), so its rows there in the other
#: files are listed, not counted
PADDED_MP = ('message_passing_power_law_1e4_padded', 'message_passing_power_law_padded',
             'message_passing_power_law_1e4_d64_padded',
             'message_passing_inference_power_law_padded',
             'message_passing_compile_power_law_eager')
_UNPADDED_MP = ("measured before values wider than the keys took the fused attention kernel "
                "with padded queries and keys (2026-12-05; split into extra heads before), "
                "which the default aggregation does on this graph's hubs; measured again in "
                "`message_passing*power_law*_padded` where that was done")
_UNFOLDED_MP = ("measured before the PMA's key map joined its seed (`fold_keys=True`, "
                "2026-12-03), which the default configurations do at d = 64; this graph's "
                "current configuration is in `message_passing_fold*` where measured again")
#: ``MZAggregation(chunk_size='auto')`` (the default) encodes inputs of more than two groups of
#: ``AUTO_ELEMENTS // d`` rows in recomputed groups of that many rows
#: (``torch_mz.nn.aggr.AUTO_CHUNK_ELEMENTS`` and ``auto_chunk_rows``; a test checks they agree).
AUTO_ELEMENTS = 2 ** 21
#: The rows of a ``-chunks`` row's groups where its file does not say (the script's default then).
OLD_CHUNK_ROWS = 131072
_WHOLE = ("measured before `chunk_size='auto'` became the default: the whole input at once "
          "(rows without `chunk_rows`); the default's configuration on this graph is the "
          "`-chunks` row")
_BY_WIDTH = ("measured before `chunk_size='auto'` sized its groups by the token width (2^21 / d "
             "rows, 2026-12-03): {then}; the default's configuration on this graph is "
             "{now}")


#: On a CUDA device of ``M`` bytes the group is ``M // (AUTO_GPU_BYTES * d)`` rows, no fewer
#: than the CPU's (``torch_mz.nn.aggr.AUTO_GPU_BYTES_PER_ELEMENT``; the same test checks it).
AUTO_GPU_BYTES = 2048
_CPU_GROUPS_ON_GPU = ("measured on a GPU in the CPU's groups of {then:,} rows, before "
                      "`chunk_size='auto'` scaled its groups with a CUDA device's memory "
                      "(2026-12-04; the file does not record the device's memory): on a GPU of "
                      "more than 4 GiB the default's groups are now larger (on one H200 this "
                      "graph runs at once, the `rigid-whole` / `default-whole` configuration)")


def auto_group(dim: int, device_memory: Optional[int] = None) -> int:
    r"""The rows of one group of ``chunk_size='auto'`` at token width :obj:`dim`, on the CPU
    or on a CUDA device of :obj:`device_memory` bytes."""
    rows = max(1, AUTO_ELEMENTS // dim)
    if device_memory is not None:
        rows = max(rows, device_memory // (AUTO_GPU_BYTES * dim))
    return rows


def auto_chunk(edges: int, dim: int, device_memory: Optional[int] = None) -> int:
    r"""The group rows ``chunk_size='auto'`` takes for :obj:`edges` messages of width
    :obj:`dim` (on a CUDA device of :obj:`device_memory` bytes), 0 for the whole input."""
    group = auto_group(dim, device_memory)
    return group if edges > 2 * group else 0


def _on_gpu(r: Mapping[str, Any]) -> bool:
    return str(r.get('device') or 'cpu').startswith('cuda')


def auto_chunk_of(r: Mapping[str, Any]) -> Optional[int]:
    r"""The group rows ``chunk_size='auto'`` now takes on the graph and device of row
    :obj:`r` (0: at once), :obj:`None` where that is unknown: a GPU row that does not record
    its device's memory (written before the groups scaled with it)."""
    if _on_gpu(r) and r.get('device_memory') is None:
        return None
    return auto_chunk(r.get('edges', 0), r['dim'],
                      r.get('device_memory') if _on_gpu(r) else None)


def _mp_stale(r: Mapping[str, Any]) -> bool:
    r"""A ``rigid`` or ``default`` row measured in another configuration than the one these
    names run now (the whole input where the default now takes groups, or groups of another
    size; a file without ``chunk_rows`` measured the whole input). A GPU row that does not
    record its device's memory is stale where it took groups: they were the CPU's, smaller than
    those of any GPU of more than 4 GiB."""
    if r['aggr'] not in ('rigid', 'default'):
        return False
    group = auto_chunk_of(r)
    if group is None:
        return bool(r.get('chunk_rows', 0))
    return r.get('chunk_rows', 0) != group


def _stale_reason(r: Mapping[str, Any]) -> str:
    group = auto_chunk_of(r)
    if group is None:
        return _CPU_GROUPS_ON_GPU.format(then=r['chunk_rows'])
    if 'chunk_rows' not in r and group == OLD_CHUNK_ROWS:  # the `-chunks` row is the default's
        return _WHOLE
    then = (f"groups of {r['chunk_rows']:,} rows" if r.get('chunk_rows')
            else 'the whole input at once')
    now = (f"groups of {group:,} rows (a `-chunks` row with `chunk_rows` {group}, or a newer "
           f"file)" if group else 'the whole input (a newer file)')
    return _BY_WIDTH.format(then=then, now=now)


def _mp_unpadded(label: Optional[str], name: str, degrees: str) -> bool:
    r"""Whether :obj:`label`'s ``default`` rows on a power-law graph were measured before the
    padded keys (see :data:`PADDED_MP`)."""
    return (label is not None and label not in PADDED_MP and name == 'default'
            and degrees == 'power-law')


def _mp_unfolded(label: Optional[str], name: str, dim: int) -> bool:
    r"""Whether :obj:`label`'s rows of :obj:`name` (``rigid`` or ``default``) at width
    :obj:`dim` were measured before the fold (see :data:`FOLDED_MP`)."""
    return (label is not None and label not in FOLDED_MP and name in ('rigid', 'default')
            and dim >= FOLD_MIN_DIM)


def superseded(data: Mapping[str, Mapping]) -> Dict[Tuple[str, str], str]:
    r"""Every row listed and not counted: :data:`SUPERSEDED` and the stale message-passing
    rows."""
    out = dict(SUPERSEDED)
    for label in MESSAGE_PASSING + MP_INFERENCE:
        for r in data.get(label, {}).get('rows', []):
            where = (f"{r['aggr']}, {r['degrees']}, d={r['dim']}, {r['nodes']} nodes, "
                     f"{r['conv']}")
            if _mp_stale(r):
                out[(label, where)] = _stale_reason(r)
            elif _mp_unfolded(label, r['aggr'], r['dim']):
                out[(label, where)] = _UNFOLDED_MP
            elif _mp_unpadded(label, r['aggr'], r['degrees']):
                out[(label, where)] = _UNPADDED_MP
            elif r['aggr'] == 'rigid-chunks' and _mp_unfolded(label, 'rigid', r['dim']):
                out[(label, where)] = _UNFOLDED_MP + (' (not counted as `rigid`; the '
                                                      'recomputed-group companion rows, which '
                                                      'read `rigid-chunks` as itself, count it)')
            elif r['aggr'] == 'default-chunks' and _mp_unfolded(label, 'default', r['dim']):
                out[(label, where)] = _UNFOLDED_MP + ' (not counted as the default)'
    return out


def _mp_as(rows: Sequence[Mapping[str, Any]], name: str,
           graph: Mapping[str, Any], label: str) -> Optional[Mapping[str, Any]]:
    r"""The row measuring :obj:`name` (``pyg``, ``rigid`` or ``default``) on :obj:`graph`: the
    row of that name unless stale, else, on a graph the default chunks, its ``-chunks`` row
    (the same configuration, measured under its own name before ``'auto'``); none from a file
    (:obj:`label`) measured before the fold at this width."""
    if _mp_unfolded(label, name, graph['dim']) or _mp_unpadded(label, name, graph['degrees']):
        return None
    same = [r for r in rows if all(r.get(k) == graph[k]
                                   for k in ('degrees', 'dim', 'nodes', 'conv'))]
    for r in same:
        if r['aggr'] == name and not _mp_stale(r):
            return r
    group = auto_chunk_of(same[0]) if same else None
    if name != 'pyg' and group:
        for r in same:  # only groups of the default's size (`--chunk-rows` may choose others)
            if r['aggr'] == f'{name}-chunks' and r.get(
                    'chunk_rows', r.get('group_rows', OLD_CHUNK_ROWS)) == group:
                return r
    return None


# speed.py's runs (speed_fold, speed_fold_rerun, speed_current and speed_projection: after the
# key map joined the PMA's seed)
SPEED = ('speed', 'speed_rerun', 'speed_fold', 'speed_fold_rerun', 'speed_current',
         'speed_projection', 'gpu_speed', 'gpu_h100_speed', 'speed_20261207')
TRAINING_STEP = ('training_step', 'training_step_small_sets', 'training_step_egnn',
                 'training_step_rounds', 'training_step_large_batch', 'training_step_thp',
                 'training_step_fold', 'training_step_current', 'training_step_kept',
                 'training_step_kept_presets', 'training_step_groups',
                 'training_step_groups_large_batch', 'training_step_tanh', 'gpu_training_step',
                 'gpu_h100_profile', 'training_step_compile', 'training_step_compile_rng',
                 'training_step_20261207')
#: ``gpu_profile.py`` files among them: their rows are calls (a workload and a model each),
#: read as one row per preset by :func:`_step_rows`
PROFILES = ('gpu_h100_profile', )
GB = 1e9 / 2**20  # MiB in one (decimal) gigabyte
LINEAR_SLOPE = 1.1
PRESETS = ('rigid', 'st-large', 'mz-slim', 'mz', 'egnn')

#: One measurement: (source label, where in it, value).
Measurement = Tuple[str, str, float]


def _mp_graphs(rows: Sequence[Mapping[str, Any]],
              degrees: Optional[str] = None) -> List[Mapping[str, Any]]:
    keys = ('degrees', 'dim', 'nodes', 'conv', 'edges')
    graphs = {tuple(r.get(k) for k in keys): r for r in rows
              if degrees is None or r['degrees'] == degrees}
    return [dict(zip(keys, g)) for g in graphs]


def _mp_rows(data: Mapping[str, Mapping], label: str) -> List[Mapping[str, Any]]:
    r"""The rows of :obj:`label` that did not fail and measured what its kind of file holds:
    the forward pass alone in the inference files (:data:`MP_INFERENCE`), forward + backward
    in the others (a row with ``inference`` in a training file is never read as training)."""
    inference = label in MP_INFERENCE
    return [r for r in data.get(label, {}).get('rows', [])
            if 'error' not in r and bool(r.get('inference')) == inference]


def _mp_pairs(data: Mapping[str, Mapping], mine: str, other: str, key: str,
              degrees: Optional[str] = None,
              labels: Sequence[str] = MESSAGE_PASSING) -> Iterator[Measurement]:
    r"""The ratio ``key`` of :obj:`mine`'s row to :obj:`other`'s on each graph and convolution
    of one file (medians of one run) of :obj:`labels` (the training files by default), the rows
    chosen by :func:`_mp_as`."""
    for label in labels:
        rows = _mp_rows(data, label)
        for graph in _mp_graphs(rows, degrees):
            a, b = _mp_as(rows, mine, graph, label), _mp_as(rows, other, graph, label)
            if a is None or b is None or not a.get(key) or not b.get(key):
                continue
            where = f"{graph['degrees']}, d={graph['dim']}, {graph['nodes']} nodes, " \
                    f"{graph['conv']}"
            names = [r['aggr'] for r in (a, b) if r['aggr'] not in (mine, other)]
            if names:
                where += ' (' + ' / '.join(names) + ')'
            yield label, where, float(a[key]) / float(b[key])


def _mp_speedup(data: Mapping[str, Mapping], mine: str = 'rigid',
                labels: Sequence[str] = MESSAGE_PASSING,
                other: str = 'pyg') -> Iterator[Measurement]:
    for label, where, v in _mp_pairs(data, mine, other, 'median_ms', 'power-law', labels):
        yield label, where, 1.0 / v


def _mp_memory_1e5(data: Mapping[str, Mapping]) -> Iterator[Measurement]:
    r"""The default aggregation's peak on the largest graphs."""
    for label in MESSAGE_PASSING:
        rows = _mp_rows(data, label)
        for graph in _mp_graphs(rows, 'poisson'):
            r = _mp_as(rows, 'default', graph, label) if graph['nodes'] >= 100000 else None
            if r is not None and r.get('peak_mib') is not None:
                yield (label, f"d={r['dim']}, {r['nodes']} nodes, {r['edges']} edges, "
                       f"{r['conv']}, {r['aggr']} (MiB)", float(r['peak_mib']))


def _mp_slopes(data: Mapping[str, Mapping]) -> Iterator[Measurement]:
    for label in MESSAGE_PASSING + MP_INFERENCE:
        rows = data.get(label, {}).get('rows', [])
        for r in data.get(label, {}).get('slopes', []):
            if (r['aggr'] in ('rigid', 'default') and r.get('memory_slope') is not None
                    and not _mp_unfolded(label, r['aggr'], r['dim'])
                    and not _mp_unpadded(label, r['aggr'], r['degrees'])):
                stale = [q for q in rows if _mp_stale(q) and (q['aggr'], q['degrees'], q['dim'])
                         == (r['aggr'], r['degrees'], r['dim'])]
                note = ''
                if stale:  # the fit includes a configuration the default no longer runs
                    note = (' (groups of another size on the largest graph)'
                            if any(q.get('chunk_rows') for q in stale)
                            else ' (whole input on the largest graph)')
                yield (label, f"{r['aggr']}, {r['degrees']}, d={r['dim']}" + note,
                       float(r['memory_slope']))
    for label, where in (('scaling_mz', 'paper configuration, sets of 1,024, inference'),
                         ('scaling_sets_of_1', 'default, sets of 1, inference')):
        rows = [r for r in data.get(label, {}).get('rows', []) if r.get('peak_mib')]
        if len(rows) >= 2:  # the fitted slope of log peak memory against log points
            yield label, where, _slope([r['points'] for r in rows],
                                       [r['peak_mib'] for r in rows])


def _slope(x: Sequence[float], y: Sequence[float]) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])  # as scaling.py fits its time slope


def _singletons(data: Mapping[str, Mapping]) -> Iterator[Measurement]:
    for r in data.get('scaling_sets_of_1', {}).get('rows', []):
        if r['sets'] >= 100000 and r.get('peak_mib') is not None:
            yield 'scaling_sets_of_1', f"{r['sets']} sets (MiB)", float(r['peak_mib'])


def _step_rows(data: Mapping[str, Mapping], label: str) -> List[Dict[str, Any]]:
    r"""The rows of a training-step file, one per preset; a ``gpu_profile.py`` file
    (:data:`PROFILES`) holds one row per call, joined here into ``training_step.py``'s columns:
    ``step_s`` and ``infer_s`` (the unprofiled medians), ``gflop_per_step``, ``infer_gflop`` and
    ``pct_of_peak`` (of the training step) where the file counted FLOPs."""
    rows = data.get(label, {}).get('rows', [])
    if label not in PROFILES:
        return list(rows)
    joined: Dict[str, Dict[str, Any]] = {}
    for r in rows:
        if 'clouds' not in r:  # a message-passing call
            continue
        row = joined.setdefault(r['model'], dict(model=r['model']))
        if r['workload'].startswith('training step'):
            row.update(step_s=r['wall_ms'] / 1000, gflop_per_step=r.get('gflop'),
                       pct_of_peak=r.get('pct_of_peak'))
        elif r['workload'].startswith('inference'):
            row.update(infer_s=r['wall_ms'] / 1000, infer_gflop=r.get('gflop'))
    return list(joined.values())


def _step_pairs(data: Mapping[str, Mapping], column: str, ratio: bool = True,
                over: str = 'mz') -> Iterator[Measurement]:
    for label in TRAINING_STEP:
        rows = {r['model']: r for r in _step_rows(data, label)}
        for suffix in ('', '+keep'):  # the defaults (+whole, +groups: other configurations)
            a, b = rows.get(over + suffix), rows.get('rigid' + suffix)
            if (not a or not b or a.get(column) is None or b.get(column) is None
                    or (label, over + suffix) in SUPERSEDED):
                continue
            if ratio:
                yield label, f'{over}{suffix} / rigid{suffix}', a[column] / b[column]
            else:  # a difference of percentages
                yield (label, f'{over}{suffix} - rigid{suffix} (points of %)',
                       a[column] - b[column])


def _preset_peak(data: Mapping[str, Mapping]) -> Iterator[Measurement]:
    for label in TRAINING_STEP:
        for r in _step_rows(data, label):
            base = r['model'].split('+')[0]
            if (base in PRESETS and r.get('pct_of_peak') is not None
                    and (label, r['model']) not in SUPERSEDED):
                yield label, r['model'], float(r['pct_of_peak'])


def _speed_flops(data: Mapping[str, Mapping], block: str, batch: str,
                 mine: str = 'rigid') -> Iterator[Measurement]:
    r"""PyG's FLOPs over :obj:`mine`'s in one ``speed.py`` run: the speed-up both would have at
    the same FLOP rate."""
    for label in SPEED:
        if (label, mine) in SUPERSEDED:
            continue
        by = {r['model']: r for r in data.get(label, {}).get('rows', [])
              if r.get('block') == block and r.get('batch') == batch and r.get('gflop')}
        if 'pyg' in by and mine in by:
            yield label, f'{block}, {batch}', float(by['pyg']['gflop']) / float(by[mine]['gflop'])


def _speed(data: Mapping[str, Mapping], block: str, batch: str, speedup: bool,
           mine: str = 'rigid') -> Iterator[Measurement]:
    for label, r in ((label, r) for label in SPEED
                     for r in data.get(label, {}).get('ratios', [])
                     if (label, mine) not in SUPERSEDED):
        if r['block'] == block and r['batch'] == batch and r.get(f'pyg/{mine} time'):
            v = float(r[f'pyg/{mine} time'])
            yield label, f'{block}, {batch}', v if speedup else 1.0 / v


#: (key, target, threshold, 'max' (value <= threshold) or 'min' (value >= threshold), measure)
TARGETS: Sequence[Tuple[str, str, float, str, Callable[[Mapping], Iterator[Measurement]]]] = (
    ('mp-time', "message passing: `rigid` / PyG time, Poisson degrees", 1.0, 'max',
     lambda d: _mp_pairs(d, 'rigid', 'pyg', 'median_ms', 'poisson')),
    ('mp-power-law', 'message passing: PyG / `rigid` time (speed-up), power-law degrees', 100.0,
     'min', _mp_speedup),
    ('mp-memory', 'message passing: `rigid` / PyG peak memory, Poisson degrees', 0.5, 'max',
     lambda d: _mp_pairs(d, 'rigid', 'pyg', 'peak_mib', 'poisson')),
    # beside it: the same ratio of the tensor memory held at once (PyTorch's allocator total
    # under the profiler, `alloc_mib`, in the runs that record it): the resident set above
    # counts the pages a call touches, which favours many reused blocks over a few large
    # freshly mapped ones
    ('mp-memory-allocated', 'message passing: `rigid` / PyG tensor memory held at once '
     "(allocator's peak), Poisson degrees", 0.5, 'max',
     lambda d: _mp_pairs(d, 'rigid', 'pyg', 'alloc_mib', 'poisson')),
    ('mp-default', 'message passing: default `MZAggregation` / `rigid` time', 3.0, 'max',
     lambda d: _mp_pairs(d, 'default', 'rigid', 'median_ms')),
    ('mp-1e5-memory', 'message passing: default forward + backward peak on 10^5 nodes '
     '(MiB; 4 GB)', 4 * GB, 'max', _mp_memory_1e5),
    ('mp-linear', f'memory linear in N + E (log-log slope; tolerance {LINEAR_SLOPE})',
     LINEAR_SLOPE, 'max', _mp_slopes),
    ('singletons', '10^5 singleton sets, default aggregation, inference peak (MiB; 1 GB)',
     1 * GB, 'max', _singletons),
    ('step', 'training step: `mz` / `rigid` time', 4.0, 'max',
     lambda d: _step_pairs(d, 'step_s')),
    ('inference', 'inference: `mz` / `rigid` time', 3.0, 'max',
     lambda d: _step_pairs(d, 'infer_s')),
    # beside it: the ratio of the two presets' inference FLOPs (matrix products), which the
    # time ratio reaches where both run at the same FLOP rate; below it only if `mz` ran its
    # products faster than `rigid` does
    ('inference-flops', 'inference: `mz` / `rigid` FLOPs (the time ratio at equal FLOP rates)',
     3.0, 'max', lambda d: _step_pairs(d, 'infer_gflop')),
    ('mz-peak-fraction', 'training step: `mz` minus `rigid` fraction of the matmul peak', 0.0,
     'min', lambda d: _step_pairs(d, 'pct_of_peak', ratio=False)),
    ('preset-peak', 'training step: fraction of the measured matmul peak (%), every preset',
     40.0, 'min', _preset_peak),
    ('speed-sab-uniform', '`speed.py`: `rigid` / PyG time, one SAB, uniform batch', 1.0, 'max',
     lambda d: _speed(d, 'sab', 'uniform', False)),
    ('speed-pma-uniform', '`speed.py`: `rigid` / PyG time, PMA, uniform batch', 1.0, 'max',
     lambda d: _speed(d, 'pma', 'uniform', False)),
    ('speed-sab-skewed', '`speed.py`: PyG / `rigid` time (speed-up), one SAB, skewed batch',
     10.0, 'min', lambda d: _speed(d, 'sab', 'skewed', True)),
    # beside it: PyG's FLOPs over `rigid`'s on that batch (PyG pads every set to the largest;
    # `rigid` does the sum of n_i^2 score products, PyG's own blocks on the flat layout as
    # many), the speed-up at equal FLOP rates: above it only if `rigid` ran its products faster
    # than PyG runs its padded ones
    ('speed-sab-skewed-flops', '`speed.py`: PyG / `rigid` FLOPs, one SAB, skewed batch (the '
     'speed-up at equal FLOP rates)', 10.0, 'min', lambda d: _speed_flops(d, 'sab', 'skewed')),
    # companions of the targets above: PyG's own blocks on the flat layout
    # (FlatSetTransformerAggregation, `pyg-flat`), the same FLOPs as PyG's padded aggregation,
    # so that the flat layout's cost is seen apart from that of the paper's larger blocks
    ('mp-time-flat', "message passing: `pyg-flat` (PyG's blocks, flat layout) / PyG time, "
     "Poisson degrees", 1.0, 'max',
     lambda d: _mp_pairs(d, 'pyg-flat', 'pyg', 'median_ms', 'poisson')),
    ('mp-power-law-flat', 'message passing: PyG / `pyg-flat` time (speed-up), power-law '
     'degrees', 100.0, 'min', lambda d: _mp_speedup(d, 'pyg-flat')),
    ('mp-memory-flat', "message passing: `pyg-flat` / PyG peak memory, Poisson degrees", 0.5,
     'max', lambda d: _mp_pairs(d, 'pyg-flat', 'pyg', 'peak_mib', 'poisson')),
    ('speed-sab-uniform-flat', "`speed.py`: `pyg-flat` / PyG time, one SAB, uniform batch", 1.0,
     'max', lambda d: _speed(d, 'sab', 'uniform', False, 'pyg-flat')),
    ('speed-pma-uniform-flat', "`speed.py`: `pyg-flat` / PyG time, PMA, uniform batch", 1.0,
     'max', lambda d: _speed(d, 'pma', 'uniform', False, 'pyg-flat')),
    ('speed-sab-skewed-flat', "`speed.py`: PyG / `pyg-flat` time (speed-up), one SAB, skewed "
     "batch", 10.0, 'min', lambda d: _speed(d, 'sab', 'skewed', True, 'pyg-flat')),
    # companions of the message-passing targets: `rigid` with the option that bounds its
    # training memory, recomputed groups of whole neighbourhoods (`checkpoint='chunks'`; the
    # group size, `--chunk-rows`, is in each file's command and each row's `group_rows`; the
    # default does this only above 2^22 / d messages: 262,144 at d = 16, 65,536 at d = 64)
    ('mp-time-chunks', "message passing: `rigid` in recomputed groups (`checkpoint='chunks'`) / "
     "PyG time, Poisson degrees", 1.0, 'max',
     lambda d: _mp_pairs(d, 'rigid-chunks', 'pyg', 'median_ms', 'poisson')),
    ('mp-memory-chunks', "message passing: `rigid` in recomputed groups (`checkpoint='chunks'`) "
     "/ PyG peak memory, Poisson degrees", 0.5, 'max',
     lambda d: _mp_pairs(d, 'rigid-chunks', 'pyg', 'peak_mib', 'poisson')),
    # companions in a regime the issue does not name: full-graph inference (one forward pass,
    # eval() mode, no gradients: `message_passing.py --inference`), with the thresholds of the
    # training targets
    ('mp-infer-time', 'message passing inference (forward, no gradients): `rigid` / PyG time, '
     'Poisson degrees', 1.0, 'max',
     lambda d: _mp_pairs(d, 'rigid', 'pyg', 'median_ms', 'poisson', MP_INFERENCE)),
    ('mp-infer-power-law', 'message passing inference: PyG / `rigid` time (speed-up), power-law '
     'degrees', 100.0, 'min', lambda d: _mp_speedup(d, 'rigid', MP_INFERENCE)),
    ('mp-infer-memory', 'message passing inference: `rigid` / PyG peak memory, Poisson degrees',
     0.5, 'max', lambda d: _mp_pairs(d, 'rigid', 'pyg', 'peak_mib', 'poisson', MP_INFERENCE)),
    ('mp-infer-default', 'message passing inference: default `MZAggregation` / `rigid` time',
     3.0, 'max', lambda d: _mp_pairs(d, 'default', 'rigid', 'median_ms', None, MP_INFERENCE)),
    # the same against PyG's aggregation with PyTorch's MultiheadAttention fast path off
    # (`pyg-nofast`, `torch.backends.mha.set_fastpath_enabled(False)`): in inference the fast
    # path is PyG's default, and on the power-law graph it asked for 28.6 GB and failed
    ('mp-infer-time-nofast', 'message passing inference: `rigid` / PyG with the attention fast '
     'path off (`pyg-nofast`) time, Poisson degrees', 1.0, 'max',
     lambda d: _mp_pairs(d, 'rigid', 'pyg-nofast', 'median_ms', 'poisson', MP_INFERENCE)),
    ('mp-infer-power-law-nofast', 'message passing inference: PyG with the attention fast path '
     'off (`pyg-nofast`) / `rigid` time (speed-up), power-law degrees', 100.0, 'min',
     lambda d: _mp_speedup(d, 'rigid', MP_INFERENCE, 'pyg-nofast')),
    ('mp-infer-memory-nofast', 'message passing inference: `rigid` / PyG with the attention '
     'fast path off (`pyg-nofast`) peak memory, Poisson degrees', 0.5, 'max',
     lambda d: _mp_pairs(d, 'rigid', 'pyg-nofast', 'peak_mib', 'poisson', MP_INFERENCE)),
)


#: The speed-up targets whose other side can fail on their graphs (PyG's aggregation asked for
#: 28.6 GB on the power-law graph in inference): key -> (files, the other side's aggregation).
#: A target with no measurement says so when that side's rows failed.
FAILING_SIDE = {
    'mp-power-law': (MESSAGE_PASSING, 'pyg'),
    'mp-power-law-flat': (MESSAGE_PASSING, 'pyg'),
    'mp-infer-power-law': (MP_INFERENCE, 'pyg'),
    'mp-infer-power-law-nofast': (MP_INFERENCE, 'pyg-nofast'),
}


def _failed_sides(key: str, data: Mapping[str, Mapping]) -> List[str]:
    r"""The failed power-law rows of the side :data:`FAILING_SIDE` names for :obj:`key`, as
    ``label: aggr, d=..., nodes``, where every power-law row of that side failed (empty where
    the target has no such side, or where that side ran on some power-law graph: the missing
    ratio then has another cause)."""
    if key not in FAILING_SIDE:
        return []
    labels, aggr = FAILING_SIDE[key]
    rows = [(label, r) for label in labels for r in data.get(label, {}).get('rows', [])
            if r.get('aggr') == aggr and r.get('degrees') == 'power-law']
    if any(not r.get('error') for _, r in rows):  # it ran on some graph: not why
        return []
    return [f"{label}: {r['aggr']}, d={r['dim']}, {r['nodes']} nodes" for label, r in rows]


class ResultsError(ValueError):
    r"""A results folder or file :func:`load_sources` cannot read (the message names it)."""


def load_sources(root: str = RESULTS,
                 sources: Mapping[str, str] = SOURCES) -> Dict[str, Dict[str, Any]]:
    r"""The results files that exist under :obj:`root`, by label. Raises a
    :class:`ResultsError` naming the path when :obj:`root` is not a folder, when it holds none
    of :obj:`sources` (every target would silently read as not measured), or when a file is not
    a JSON object (a truncated or corrupt file)."""
    if not os.path.isdir(root):
        what = 'is a file, not a folder' if os.path.exists(root) else 'does not exist'
        raise ResultsError(f'results folder {root!r} {what}')
    data = {}
    for label, rel in sources.items():
        path = os.path.join(root, rel)
        if os.path.exists(path):
            try:
                with open(path) as f:
                    loaded = json.load(f)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ResultsError(f'results file {path!r} is not valid JSON ({e}); '
                                   'restore it (git checkout) or run its benchmark again') \
                    from None
            if not isinstance(loaded, dict):
                raise ResultsError(f'results file {path!r} holds a JSON '
                                   f'{type(loaded).__name__}, not an object')
            data[label] = loaded
    if sources and not data:
        raise ResultsError(f'results folder {root!r} holds none of the results files '
                           f"({', '.join(sorted(sources.values()))})")
    return data


def evaluate(data: Mapping[str, Mapping]) -> List[Dict[str, Any]]:
    r"""One record per target: its measurements, how many meet it, and the status."""
    out = []
    for key, text, threshold, kind, measure in TARGETS:
        values = list(measure(data))
        ok = [v <= threshold if kind == 'max' else v >= threshold for _, _, v in values]
        failed = []
        if not values:
            status = 'not measured'
            failed = _failed_sides(key, data)
        elif all(ok):
            status = 'met'
        elif not any(ok):
            status = 'not met'
        else:
            status = 'mixed'
        out.append(dict(key=key, target=text, threshold=threshold, kind=kind, status=status,
                        met=sum(ok), measured=len(values), failed_other_side=failed,
                        measurements=[dict(source=s, where=w, value=v, meets=m)
                                      for (s, w, v), m in zip(values, ok)]))
    return out


def markdown(records: Sequence[Mapping[str, Any]], data: Mapping[str, Mapping],
             command: str) -> str:
    lines = ["# Issue 10's operator-cost targets, read from the committed benchmark results", '',
             f'Command: `{command}` (reads results files, times nothing). A target is met when '
             'every measurement meets it, mixed when some do. Measurements marked * miss the '
             'target.', '',
             '| target | threshold | status | measurements |', '|---|---|---|---|']
    for r in records:
        sign = '<=' if r['kind'] == 'max' else '>='
        cells = '; '.join(f"{m['value']:.3g}{'' if m['meets'] else '*'} ({m['source']}: "
                          f"{m['where']})" for m in r['measurements'])
        if r.get('failed_other_side'):  # why nothing was measured (listed below)
            n = len(r['failed_other_side'])
            cells = (f"the other side failed on every such graph ({n} row{'s' * (n != 1)}, "
                     'listed under "rows that failed" below)')
        lines.append(f"| {r['target']} | {sign} {r['threshold']:.4g} | **{r['status']}** "
                     f"({r['met']} of {r['measured']}) | {cells} |")
    lines += ['', '## Sources', '', 'Each file with the command that produced it (its Markdown '
              'file and `git log` tell when):', '']
    for label, rel in SOURCES.items():
        cmd = data.get(label, {}).get('environment', {}).get('command')
        # (a file that is not in the repository: named, not linked)
        lines.append(f'- `{label}`: ' + (f'[`{rel}`]({rel.replace(".json", ".md")}), produced '
                                          f'by `{cmd}`' if cmd else f'`{rel}` (missing)'))
    left_out = superseded(data)
    if left_out:
        lines += ['', 'Rows left out (measured again, or measured before a change of the '
                  'code they describe):', '']
        lines += [f'- `{label}`, `{row}`: {why}' for (label, row), why in left_out.items()]
    failed = failed_rows(data)
    if failed:
        lines += ['', 'Message-passing rows that failed (no figure; a ratio to such a row is '
                  'not measured):', '']
        lines += [f'- `{label}`, `{row}`: {error}' for label, row, error in failed]
    return '\n'.join(lines) + '\n'


def failed_rows(data: Mapping[str, Mapping]) -> List[Tuple[str, str, str]]:
    r"""``(label, row, error)`` of every message-passing row that recorded an error (its
    first 200 characters)."""
    out = []
    for label in MESSAGE_PASSING + MP_INFERENCE:
        for r in data.get(label, {}).get('rows', []):
            if r.get('error'):
                error = ' '.join(str(r['error']).split())
                out.append((label, f"{r['aggr']}, {r['degrees']}, d={r['dim']}, "
                           f"{r['nodes']} nodes, {r['conv']}",
                           error[:200] + ('...' if len(error) > 200 else '')))
    return out


def plot(records: Sequence[Mapping[str, Any]], path: str) -> None:
    r"""One row per target: each measurement as its distance from the threshold, as a factor
    (value / threshold for '<=' targets, threshold / value for '>=' ones; a difference in
    points for the fraction-of-peak comparison), so that every target reads alike: left of
    the line meets it."""
    from torch_mz.study.plots import pyplot, save_figure
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(records) + 1.2))
    for i, r in enumerate(records):
        for m in r['measurements']:
            v, t = m['value'], r['threshold']
            if t == 0.0:  # a difference (points of %): shown as a factor around 1
                x = 2.0 ** (-v / 10.0)
            else:
                x = v / t if r['kind'] == 'max' else t / max(v, 1e-12)
            ax.scatter(x, i, color='tab:green' if m['meets'] else 'tab:red', s=18, alpha=0.8)
    ax.axvline(1.0, color='black', lw=1)
    ax.set_xscale('log')
    ax.set_yticks(range(len(records)))
    ax.set_yticklabels([f"{r['key']} ({r['status']})" for r in records], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel('measurement against the target (1 = at the threshold; left meets it; the '
                  'peak-fraction difference as 2^(-points / 10))', fontsize=8)
    ax.set_title("Issue 10's targets, from the committed results files (green: meets, red: "
                 'misses)', fontsize=9)
    fig.tight_layout()
    try:  # atomically, as the JSON and Markdown files: an interrupted save keeps the earlier plot
        save_figure(fig, path, dpi=110, format='png')
    finally:
        plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n')[0] or None)
    parser.add_argument('--results', default=RESULTS, help='folder of the results files')
    parser.add_argument('--out', default=os.path.join(RESULTS, 'targets'))
    args = parser.parse_args(argv)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f'--out {args.out!r} is a file, not a folder')
    try:
        data = load_sources(args.results)
    except ResultsError as e:
        parser.error(f'--results: {e}')
    records = evaluate(data)
    # the arguments given (called from Python: main's, not the caller's), quoted for a shell
    command = shlex.join(['python', 'benchmarks/targets.py']
                         + list(sys.argv[1:] if argv is None else argv))
    os.makedirs(args.out, exist_ok=True)
    # links in the Markdown file are relative to the results folder
    text = markdown(records, data, command)
    rel = os.path.relpath(args.results, args.out)
    text = text.replace('](', f']({rel}/') if rel != '.' else text
    from torch_mz.study.plots import replace_plot
    from torch_mz.study.report import write_results
    png = os.path.join(args.out, 'targets.png')  # (linked where drawn; an earlier one removed)
    note = replace_plot(png, plot, records, png)
    if note is None:
        text += '\n![targets](targets.png)\n'
    else:
        print(note)
    # both files atomically (a temporary file moved into place): an interrupted or failed write
    # leaves the earlier ones whole, and the JSON is serialised before either is touched
    write_results(args.out, 'targets', dict(command=command, sources=SOURCES, targets=records),
                  text)
    for r in records:
        print(f"{r['status']:>12}  {r['met']}/{r['measured']}  {r['target']}")
    print(f"wrote {os.path.join(args.out, 'targets.json')}, .md")


if __name__ == '__main__':
    main()
