r"""Operations dispatched by one forward + backward of a message-passing convolution, against the
size of the graph: on a GPU nearly every one of them that computes is a kernel launch, with a
cost of its own whatever the size of its tensors, so their number sets a floor under the time.

On one H200 (``benchmarks/results/gpu/``) PyG's ``SetTransformerAggregation`` took 9.6, 18.4 and
149 ms on Poisson graphs of 10^3, 10^4 and 10^5 nodes (d = 64) and ``rigid`` 27, 164 and 1,117
ms, about 33-57 us per kernel counted here across a 200-fold range of counts (an observation
from the two files, not a profile). This script counts, on the CPU, the ATen operations one
``SAGEConv`` call and its backward pass dispatch. The count depends on the graph, the code and
the library versions, not on the clock (the committed run: torch 2.13 on the CPU; the GPU run
had torch 2.11, and a GPU takes other attention kernels for some calls):

* ``ops``: every ATen operation (``TorchDispatchMode`` sees each once; composite operations are
  counted as the operations they decompose into);
* ``kernels``: the operations that compute: every one except views of an input (``view``,
  ``transpose``, ``as_strided``, ``expand``, ``_unsafe_view`` and the like) and bare
  allocations (``empty``, ``empty_like``, ``new_empty``, ``empty_strided``), which launch
  nothing on a GPU;
* ``syncs``: the operations among them that read a device result on the host
  (``_local_scalar_dense``, which ``int(t)``, ``bool(t)`` and ``t.item()`` dispatch;
  ``nonzero``, ``unique``, ``bincount`` and ``repeat_interleave`` without ``output_size``, whose
  output size the host must know): on a GPU each drains the queue of launched kernels before
  the host can go on. ``.tolist()`` of a CPU tensor dispatches nothing (on a GPU it is a copy to
  the host, one more sync), so this is a lower bound;
* ``kernels_per_1k_edges`` and, per aggregation, the slope of log(kernels) against
  log(nodes + edges): 0 where the number of launches does not grow with the graph, 1 where it
  grows in proportion.

The aggregations are those of ``benchmarks/message_passing.py`` (``pyg``, ``pyg-flat``, ``rigid``,
``rigid-whole``, ``default``, ...), built the same way. The compiled generator kernels are off
(``set_fused_kernels(False)``): their automatic mode runs them for large CPU float32 inputs only,
so the eager operations are what a GPU runs, and what is counted here.

    python benchmarks/launches.py
    python benchmarks/launches.py --nodes 1000,10000 --aggrs rigid,rigid-whole   # a quick look
"""
import argparse
import os
import sys
import time
from collections import Counter
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import message_passing as mp  # noqa: E402  (the graphs and aggregations of that benchmark)

from torch_mz.nn import set_fused_kernels  # noqa: E402
from torch_mz.study import (choice_list, environment, int_list, markdown_table,  # noqa: E402
                            positive_int, pyplot, try_plot, write_results)

NAME = 'launches'
DEFAULT_AGGRS = ('pyg', 'pyg-flat', 'rigid', 'rigid-whole', 'default')


#: Operations that return a view without saying so in their schema.
UNANNOTATED_VIEWS = frozenset({'_unsafe_view'})
#: Operations that only reserve memory (no kernel).
ALLOCATIONS = frozenset({'empty', 'empty_like', 'new_empty', 'empty_strided'})
#: Operations that read a device result on the host (see the module's docstring;
#: ``repeat_interleave`` only without ``output_size``).
SYNC_OPS = frozenset({'_local_scalar_dense', 'nonzero', '_unique2', 'unique_consecutive',
                      'unique_dim', 'bincount', 'repeat_interleave'})


def _is_view(func) -> bool:
    r"""Whether the ATen operation :obj:`func` returns a view of an input (an alias that is not
    written to): such operations only make a new tensor header and launch no kernel."""
    if func.overloadpacket.__name__ in UNANNOTATED_VIEWS:
        return True
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                 for r in returns)


class OpCounter(TorchDispatchMode):
    r"""Counts the ATen operations dispatched while it is active, each once: :attr:`ops` all of
    them, :attr:`kernels` those that are neither views nor bare allocations, :attr:`syncs`
    those that read a result on the host (:data:`SYNC_OPS`), :attr:`by_name` the kernels by
    name."""
    def __init__(self):
        super().__init__()
        self.ops = 0
        self.kernels = 0
        self.syncs = 0
        self.by_name: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        name = func.overloadpacket.__name__
        if not _is_view(func) and name not in ALLOCATIONS:
            self.kernels += 1
            self.syncs += name in SYNC_OPS and not (
                name == 'repeat_interleave' and (kwargs or {}).get('output_size') is not None)
            self.by_name[name] += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], None]) -> OpCounter:
    r"""The operations one call of :obj:`fn` dispatches (the backward pass included when
    :obj:`fn` runs it: autograd's engine dispatches under the same mode)."""
    with OpCounter() as counter:
        fn()
    return counter


def count_one(nodes: int, aggr: str, dim: int, degrees: str, seed: int = 0) -> Dict:
    r"""One row: the operations of one ``SAGEConv(dim, dim, aggr=...)`` forward + backward on
    the graph of ``message_passing.random_graph(nodes, degrees, seed=seed)``, after one
    uncounted call."""
    from torch_geometric.nn import SAGEConv
    torch.manual_seed(0)
    edge_index = mp.random_graph(nodes, degrees, seed=seed)
    x = torch.randn(nodes, dim, generator=torch.Generator().manual_seed(1))
    conv = SAGEConv(dim, dim, aggr=mp.build_aggr(aggr, dim))

    def step():
        conv.zero_grad(set_to_none=True)
        conv(x, edge_index).square().mean().backward()

    step()  # first call: caches and lazily built state, as in the timed benchmarks
    start = time.perf_counter()
    counter = count_ops(step)
    seconds = time.perf_counter() - start
    edges = int(edge_index.size(1))
    module = conv.aggr_module
    chunk_rows = (module._chunk_rows(edges) or 0) if hasattr(module, '_chunk_rows') else None
    return dict(degrees=degrees, dim=dim, nodes=nodes, edges=edges, aggr=aggr,
                chunk_rows=chunk_rows, ops=counter.ops, kernels=counter.kernels,
                syncs=counter.syncs,
                kernels_per_1k_edges=1000 * counter.kernels / max(edges, 1),
                top_kernels=', '.join(f'{n} {c}' for n, c in counter.by_name.most_common(5)),
                seconds=seconds)


def slopes(rows: List[Dict]) -> List[Dict]:
    r"""Per aggregation: the least-squares slope of log(kernels) against log(nodes + edges), and
    the kernels on the largest graph over those on the smallest."""
    out = []
    for aggr in dict.fromkeys(r['aggr'] for r in rows):
        sel = sorted((r for r in rows if r['aggr'] == aggr), key=lambda r: r['nodes'])
        if len(sel) < 2:
            continue
        xs = np.log([r['nodes'] + r['edges'] for r in sel])
        ys = np.log([r['kernels'] for r in sel])
        out.append(dict(aggr=aggr, kernel_slope=float(np.polyfit(xs, ys, 1)[0]),
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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--nodes', type=int_list(), default=[1000, 10000, 100000])
    parser.add_argument('--dim', type=positive_int, default=64)
    parser.add_argument('--degrees', choices=mp.DEGREES, default='poisson')
    parser.add_argument('--aggrs', type=choice_list(mp.AGGRS), default=list(DEFAULT_AGGRS))
    parser.add_argument('--pyg-max-nodes', type=positive_int, default=10000,
                        help="count 'pyg' only on graphs of at most this many nodes: it pads "
                             'every neighbourhood to the largest (16,383 MiB of tensors at 10^5 '
                             'nodes, d = 64, on the GPU run), and its count does not depend on '
                             'the graph')
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      NAME))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    set_fused_kernels(False)  # what a GPU runs (see the module's docstring)
    start = time.time()
    rows = []
    for nodes in args.nodes:
        for aggr in args.aggrs:
            if aggr == 'pyg' and nodes > args.pyg_max_nodes:
                continue
            row = count_one(nodes, aggr, args.dim, args.degrees)
            rows.append(row)
            print(f"N={nodes:7d} E={row['edges']:8d} {aggr:12s} {row['ops']:7d} ops "
                  f"{row['kernels']:7d} kernels ({row['kernels_per_1k_edges']:.2f} per 1k "
                  f"edges) {row['syncs']:6d} syncs", flush=True)
    fits = slopes(rows)
    env = environment()
    minutes = (time.time() - start) / 60
    markdown = (f'# Operations dispatched by one SAGEConv forward + backward\n\n'
                f"Command: `{env['command']}`  \n"
                f"torch {env['torch']}, torch_geometric {env['torch_geometric']}; "
                f"{minutes:.1f} min. {args.degrees} in-degrees (mean 10), d = {args.dim}; "
                f"counted on the CPU with the compiled generator kernels off (what a GPU "
                f"runs); `kernels` = operations whose output is not a view (each a launch on a "
                f"GPU); `syncs` = those that read a result on the host (each drains a GPU's "
                f"queue); `chunk_rows` = rows per recomputed group of `chunk_size='auto'` (0: "
                f"the whole input at once). See `benchmarks/launches.py` for what is counted.\n\n"
                f'## Growth with the graph\n\n'
                + markdown_table(fits, ['aggr', 'kernel_slope', 'largest_over_smallest'])
                + '\n## All counts\n\n'
                + markdown_table(rows, ['degrees', 'dim', 'nodes', 'edges', 'aggr', 'chunk_rows',
                                        'ops', 'kernels', 'syncs', 'kernels_per_1k_edges',
                                        'top_kernels'])
                + f'\n![plot]({NAME}.png)\n')
    write_results(args.out, NAME, dict(environment=env, config=vars(args), minutes=minutes,
                                       rows=rows, slopes=fits), markdown)
    note = try_plot(plot, rows, os.path.join(args.out, f'{NAME}.png'))
    if note:
        print(note)
    print(markdown_table(fits, ['aggr', 'kernel_slope', 'largest_over_smallest']))
    print(f'wrote {args.out}/{NAME}.json, .md, .png')


if __name__ == '__main__':
    main()
