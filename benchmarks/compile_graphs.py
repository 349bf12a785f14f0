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

The report is written after every row: while rows remain, to ``compile_graphs.partial.{json,md}``,
marked partial (``pending``: the rows not yet made), which the complete report
``compile_graphs.{json,md}`` replaces, so that a run cut off (Ctrl-C, a failure) keeps the rows
it made and leaves an earlier run's complete report alone. ``--resume`` makes only the rows the
partial report lacks (a partial report of other options, or of another torch, PyG or
torch-scatter, is refused); ``--overwrite`` makes every one again, and a folder holding a
partial report is refused without either. A folder holding the complete report of another
command (other options) is refused without ``--overwrite``, before anything is explained; a run
of the same options replaces it. Ctrl-C ends a run with one line that gives the command to go on
(status 130).

    python benchmarks/compile_graphs.py
"""
import argparse
import os
import shlex
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from torch_mz.study import (EXIT_INTERRUPTED, PartialUnit, add_partial_arguments, choice_list,
                            environment, in_turn, int_list, interruptible, markdown_table,
                            partial_problem, positive_int, read_partial, remove_results,
                            stale_partial_done, replace_problem, replaced_partial,
                            write_report)
from torch_mz.study.report import check_out_folder
from torch_mz.study.workloads import (AGGRS, build, build_aggr, make_batch, pyg_width_problem,
                                      random_graph)

NAME = 'compile_graphs'  # <out>/compile_graphs.{json,md}: the complete report
PARTIAL = NAME + '.partial'  # <out>/compile_graphs.partial.{json,md}: a run not yet complete
TITLE = 'Graphs torch.compile makes of one call (torch._dynamo.explain)'
COLS = ['workload', 'model', 'graphs', 'breaks', 'top reasons']
#: The settings (a report's ``setup``) a partial report must share with a run that resumes it
#: (``--resume``), and a complete report with a run that replaces it without ``--overwrite``
SETTINGS = ('aggrs', 'nodes', 'dims', 'presets', 'clouds', 'points')
#: ... and the environment's (no option sets them: the graphs are those dynamo makes of torch's
#: and PyG's code, whose scatter takes torch-scatter's kernels where it is installed)
ENVIRONMENT = ('torch', 'torch_geometric', 'torch_scatter')
#: What a partial report holds, as ``--resume`` / ``--overwrite`` and their messages name it
UNIT = PartialUnit('rows', 'row', 'make')


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


def message_passing_workload(nodes: int, dim: int) -> str:
    return f'SAGEConv, {nodes} Poisson nodes, d = {dim}'


def preset_workload(clouds: int, points: int) -> str:
    return f'preset, {clouds} x {points} points'


def message_passing_row(aggr: str, nodes: int, dim: int) -> dict:
    from torch_geometric.nn import SAGEConv
    torch.manual_seed(0)
    edge_index = random_graph(nodes, 'poisson')
    x = torch.randn(nodes, dim, generator=torch.Generator().manual_seed(1))
    conv = SAGEConv(dim, dim, aggr=build_aggr(aggr, dim))
    conv(x, edge_index)  # eager first: the layouts are found again, as in full-batch training
    return dict(workload=message_passing_workload(nodes, dim), model=aggr,
                **explain(conv, x, edge_index))


def preset_row(preset: str, clouds: int, points: int) -> dict:
    from torch_geometric.data import Batch, Data
    pos, batch, _ = make_batch(clouds, points)
    data = Batch.from_data_list([Data(x=pos[batch == i]) for i in range(clouds)])
    model = build(preset, 0.25).train()
    return dict(workload=preset_workload(clouds, points), model=preset, **explain(model, data))


def plan(args: argparse.Namespace) -> Dict[Tuple[str, str], Callable[[], dict]]:
    r"""The rows of the run in order, by (workload, model) as each row names them, with the call
    that makes each: the message-passing rows, then the presets'."""
    rows: Dict[Tuple[str, str], Callable[[], dict]] = {}
    for nodes in args.nodes:
        for dim in args.dims:
            for aggr in args.aggrs:
                rows[(message_passing_workload(nodes, dim), aggr)] = (
                    lambda a=aggr, n=nodes, d=dim: message_passing_row(a, n, d))
    for preset in args.presets:
        rows[(preset_workload(args.clouds, args.points), preset)] = (
            lambda p=preset: preset_row(p, args.clouds, args.points))
    return rows


def setup_of(args: argparse.Namespace) -> Dict[str, object]:
    r"""The options a report records (its ``setup``): :data:`SETTINGS`."""
    return {key: getattr(args, key) for key in SETTINGS}


def earlier_rows(path: str, args: argparse.Namespace, env: Dict[str, object]
                 ) -> Tuple[Dict[Tuple[str, str], dict], float, str]:
    r"""The rows of the partial report :obj:`path` that ``--resume`` keeps, by (workload,
    model), the minutes they took, and a sentence on what was found; a file damaged or written
    with other :data:`SETTINGS` (or, given this run's environment :obj:`env`, in another
    :data:`ENVIRONMENT`: the graphs of other code, which one table would mix) raises a
    :class:`ValueError` saying so (:func:`~torch_mz.study.read_partial`)."""
    if not os.path.exists(path):
        return {}, 0.0, f'nothing to resume: no {path}; making every row'
    kept, minutes = read_partial(
        path, args, SETTINGS, UNIT, env=env, environment=ENVIRONMENT, record='setup',
        keep=lambda earlier: ({(str(r['workload']), str(r['model'])): dict(r)
                               for r in earlier['rows']}, float(earlier['minutes'])))
    return kept, minutes, f'resuming from {path}: {len(kept)} row(s) kept'


def write_rows(args: argparse.Namespace, env: Dict[str, object], rows: List[dict], pending: int,
               minutes: float) -> None:
    r"""Writes the report of :obj:`rows`: while :obj:`pending` rows remain,
    ``compile_graphs.partial.{json,md}``, marked partial; else ``compile_graphs.{json,md}``,
    which removes the partial report."""
    head = '' if not pending else (
        f'Partial: {pending} more row(s) not made (the run was cut off or is still running; '
        f'`--resume` makes the rest)\n\n')
    write_report(args.out, PARTIAL if pending else NAME, TITLE, env, setup_of(args),
                 head + markdown_table(rows, COLS),
                 dict(rows=rows, **({'pending': pending} if pending else
                                    replaced_partial(args.out, NAME))),
                 minutes,
                 plot=False)
    if not pending:  # the complete report replaces the partial one
        remove_results(args.out, PARTIAL)


def main(argv: Optional[List[str]] = None) -> Optional[int]:
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    parser.add_argument('--aggrs', type=choice_list(AGGRS), default='pyg,rigid,default')
    parser.add_argument('--nodes', type=int_list(), default='1000')
    parser.add_argument('--dims', type=int_list(), default='16,64')
    parser.add_argument('--presets', type=choice_list(('rigid', 'st-large', 'mz-slim', 'mz',
                                                       'egnn', 'deepsets')), default='rigid,mz')
    parser.add_argument('--clouds', type=positive_int, default=4)
    parser.add_argument('--points', type=positive_int, default=64)
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results', NAME))
    add_partial_arguments(parser, UNIT)
    args = parser.parse_args(argv)
    problem = check_out_folder(args.out)  # (its message names --out)
    if problem:
        parser.error(problem)
    problem = pyg_width_problem(args.aggrs, args.dims)  # (a traceback after the other rows)
    if problem:
        parser.error(f'argument --dims: {problem}')
    # (a run stopped between writing its complete report and removing the partial one)
    if stale_partial_done(args.out, NAME, args, SETTINGS, record='setup',
                          say=lambda note: print(note, flush=True)):
        return None
    partial = os.path.join(args.out, f'{PARTIAL}.json')
    problem = partial_problem(args.resume, args.overwrite, partial, UNIT)
    if problem:
        parser.error(problem)
    env = environment()
    if argv is not None:  # (called from Python: the arguments given, not the caller's)
        env['command'] = shlex.join(['python', 'benchmarks/compile_graphs.py'] + list(argv))
    # (a complete report of other options is not replaced unasked)
    problem = replace_problem(os.path.join(args.out, f'{NAME}.json'), args, SETTINGS,
                              str(env['command']), args.overwrite,
                              resumed=args.resume and os.path.exists(partial), record='setup')
    if problem:
        parser.error(problem)
    kept: Dict[Tuple[str, str], dict] = {}
    earlier_minutes = 0.0
    if args.resume:
        try:
            kept, earlier_minutes, message = earlier_rows(partial, args, env)
        except ValueError as e:
            parser.error(f'argument --resume: {e}')
        print(message, flush=True)
    torch.set_num_threads(1)
    start = time.time()
    jobs = plan(args)
    kept = {key: row for key, row in kept.items() if key in jobs}
    shown: List[dict] = []
    # (kept: the partial report resumed, else none before this call wrote a report)
    with interruptible(__file__, sys.argv[1:] if argv is None else argv, parser,
                       kept=partial if kept else None, what='rows') as stop:
        for turn in in_turn(list(jobs), kept, lambda key: jobs[key]()):
            workload, model = turn.key
            print(f"{workload}, {model}: {turn.value['graphs']} graphs"
                  + (' (kept)' if turn.kept else ''), flush=True)
            if turn.write:
                shown = turn.reached
                write_rows(args, env, shown, turn.pending,
                           earlier_minutes + (time.time() - start) / 60)
                stop.kept = partial if turn.pending else os.path.join(args.out, f'{NAME}.json')
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    print(markdown_table(shown, COLS))
    print(f'wrote {args.out}/{NAME}.json, .md')
    return None


if __name__ == '__main__':
    sys.exit(main())
