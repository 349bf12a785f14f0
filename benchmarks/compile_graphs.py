r"""How many graphs ``torch.compile`` makes of one call: the graph breaks TorchDynamo finds
(``torch._dynamo.explain``) in a ``SAGEConv`` forward pass with each aggregation on a Poisson
graph, and in the point-cloud presets on a small batch. Each break is a point where compiled code
hands back to Python (a host read of a tensor, an output whose size depends on the data, a call
dynamo does not trace); under CUDA graphs (``mode='reduce-overhead'``) each graph is captured on
its own. Nothing is timed or compiled to code: the counts depend on the code and the library
versions, not on the clock. The aggregations and presets are built as in
``benchmarks/message_passing.py`` and ``training_step.py`` (``torch_mz.study.workloads``); each
convolution is called once eagerly first, as in full-batch training, where the attention layouts
are then found again; the presets are explained on their first call (as the committed counts
were made).

    python benchmarks/compile_graphs.py
"""
import argparse
import os
import shlex
import time
from typing import List, Optional

import torch

from torch_mz.study import (choice_list, environment, int_list, markdown_table, positive_int,
                            write_report)
from torch_mz.study.report import check_out_folder
from torch_mz.study.workloads import (AGGRS, build, build_aggr, make_batch, pyg_width_problem,
                                      random_graph)

NAME = 'compile_graphs'
COLS = ['workload', 'model', 'graphs', 'breaks', 'top reasons']


def explain(module, *args) -> dict:
    r"""Graphs and breaks of one call of :obj:`module`, and its most frequent break reasons."""
    torch._dynamo.reset()
    result = torch._dynamo.explain(module)(*args)
    reasons: dict = {}
    for b in result.break_reasons:
        frame = b.user_stack[-1] if b.user_stack else None
        where = (f"{os.path.basename(frame.filename)}:{frame.lineno}" if frame else '?')
        key = f"{where} {b.reason.splitlines()[0][:60]}"
        reasons[key] = reasons.get(key, 0) + 1
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
    return dict(graphs=result.graph_count, breaks=result.graph_break_count,
                reasons=reasons, **{'top reasons': '; '.join(f'{n} x {k}' for k, n in top)})


def message_passing_row(aggr: str, nodes: int, dim: int) -> dict:
    from torch_geometric.nn import SAGEConv
    torch.manual_seed(0)
    edge_index = random_graph(nodes, 'poisson')
    x = torch.randn(nodes, dim, generator=torch.Generator().manual_seed(1))
    conv = SAGEConv(dim, dim, aggr=build_aggr(aggr, dim))
    conv(x, edge_index)  # eager first: the layouts are found again, as in full-batch training
    return dict(workload=f'SAGEConv, {nodes} Poisson nodes, d = {dim}', model=aggr,
                **explain(conv, x, edge_index))


def preset_row(preset: str, clouds: int, points: int) -> dict:
    from torch_geometric.data import Batch, Data
    pos, batch, _ = make_batch(clouds, points)
    data = Batch.from_data_list([Data(x=pos[batch == i]) for i in range(clouds)])
    model = build(preset, 0.25).train()
    return dict(workload=f'preset, {clouds} x {points} points', model=preset,
                **explain(model, data))


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--aggrs', type=choice_list(AGGRS), default='pyg,rigid,default')
    parser.add_argument('--nodes', type=int_list(), default='1000')
    parser.add_argument('--dims', type=int_list(), default='16,64')
    parser.add_argument('--presets', type=choice_list(('rigid', 'st-large', 'mz-slim', 'mz',
                                                       'egnn', 'deepsets')), default='rigid,mz')
    parser.add_argument('--clouds', type=positive_int, default=4)
    parser.add_argument('--points', type=positive_int, default=64)
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results', NAME))
    args = parser.parse_args(argv)
    problem = check_out_folder(args.out)
    if problem:
        parser.error(f'argument --out: {problem}')
    problem = pyg_width_problem(args.aggrs, args.dims)  # (a traceback after the other rows)
    if problem:
        parser.error(f'argument --dims: {problem}')
    torch.set_num_threads(1)
    start = time.time()
    rows = []
    for nodes in args.nodes:
        for dim in args.dims:
            for aggr in args.aggrs:
                rows.append(message_passing_row(aggr, nodes, dim))
                print(f"{rows[-1]['workload']}, {aggr}: {rows[-1]['graphs']} graphs", flush=True)
    for preset in args.presets:
        rows.append(preset_row(preset, args.clouds, args.points))
        print(f"{rows[-1]['workload']}, {preset}: {rows[-1]['graphs']} graphs", flush=True)
    env = environment()
    if argv is not None:  # (called from Python: the arguments given, not the caller's)
        env['command'] = shlex.join(['python', 'benchmarks/compile_graphs.py'] + list(argv))
    write_report(args.out, NAME, 'Graphs torch.compile makes of one call (torch._dynamo.explain)',
                 env, dict(aggrs=args.aggrs, nodes=args.nodes, dims=args.dims,
                           presets=args.presets, clouds=args.clouds, points=args.points),
                 markdown_table(rows, COLS), dict(rows=rows), (time.time() - start) / 60,
                 plot=False)
    print(markdown_table(rows, COLS))
    print(f'wrote {args.out}/{NAME}.json, .md')


if __name__ == '__main__':
    main()
