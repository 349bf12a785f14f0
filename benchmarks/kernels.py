r"""The compiled generator kernels of :mod:`torch_mz.nn.fused` against the eager functions they
replace, each alone, on the shapes of the ``mz`` preset's training step (32 clouds of 1,024
points: 32,768 tokens, 8 generators, width 64):

* ``tanh`` of the generator feed-forward's hidden layer, a :math:`(32768 \cdot 8, 64)` float32
  tensor, in place: ATen's :func:`torch.tanh_` (``eager``), :func:`torch.tanh` under
  :func:`torch.compile` (``compiled``), and the kernel :class:`~torch_mz.nn.fused.OddTanhFused`
  runs (``fused``: an exactly odd rational approximation, compiled). Each call first copies the
  same input into the buffer (the ``copy`` row times that copy alone), so every call sees the
  same values;
* the LayerNorm Jacobian on generators (:func:`~torch_mz.nn.zonotope.zonotope_layer_norm`'s
  generator map) on centers :math:`(32768, 64)` and generators :math:`(32768, 8, 64)`: the
  hand-written eager function (``eager``) and the compiled one (``fused``), forward alone
  (no gradients) and forward + backward.

Every variant of one operation is timed in interleaved rounds (each round calls each once, the
order rotated), medians of ``--repeats``, on ``--threads`` threads (1 by default: the
reproduction trains on one thread per process); the first calls, which compile, are not timed.
Each row also gives the largest difference of its output (and, with backward, of its input
gradients) from the eager function's, relative to the largest magnitude there, so a fast row
that computes something else shows. Run it
on a quiet machine: pause training processes while it runs.

The report is written after every operation: while operations remain, to
``kernels.partial.{json,md}``, marked partial (``pending``: the operations not yet measured),
which the complete report ``kernels.{json,md,png}`` replaces, so that a run cut off (Ctrl-C, a
failure) keeps the operations it measured and leaves an earlier run's complete report alone.
``--resume`` measures only the operations the partial report lacks (a partial report of other
options, or of another torch, is refused); ``--overwrite`` measures every one again, and a
folder holding a partial report is refused without either. A folder holding the complete report
of another command (other options) is refused without ``--overwrite``, before anything is
measured; a run of the same options replaces it. Ctrl-C ends a run with one line that gives the
command to go on (status 130). Where compiling the fused kernels fails (a warning says so), the
``fused`` rows time the eager functions: the operation is not written, and the run ends with
status 1 (the operations measured before it stay in the partial report).

    python benchmarks/kernels.py
    python benchmarks/kernels.py --tokens 4096 --repeats 3   # a quick look
"""
import argparse
import functools
import math
import os
import shlex
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from torch_mz.nn import fused
from torch_mz.nn.zonotope import _LayerNormJacobian
from torch_mz.study import (EXIT_INTERRUPTED, PartialUnit, add_partial_arguments, environment,
                            in_turn, interruptible, markdown_table, partial_problem,
                            positive_int, pyplot, read_partial, replace_plot, replace_problem,
                            stale_partial_done, time_interleaved, write_results_so_far)
from torch_mz.study.plots import save_figure
from torch_mz.study.report import check_out_folder

TOKENS, GENERATORS, WIDTH, TANH_HIDDEN = 32768, 8, 64, 64
NAME = 'kernels'  # <out>/kernels.{json,md,png}: the complete report
PARTIAL = NAME + '.partial'  # <out>/kernels.partial.{json,md}: a run not yet complete
#: The settings a partial report must share with a run that resumes it (``--resume``), and a
#: complete report with a run that replaces it without ``--overwrite``
SETTINGS = ('tokens', 'generators', 'width', 'repeats', 'threads')
#: ... and the environment's (no option sets it: the torch whose kernels are timed)
ENVIRONMENT = ('torch', )
#: What a partial report holds, as ``--resume`` / ``--overwrite`` and their messages name it
UNIT = PartialUnit('operations', 'operation')
COLS = ['operation', 'variant', 'median_ms', 'min_ms', 'max_ms', '/ eager', 'less copy_ms',
        'max_rel_diff']


def tanh_variants(rows: int, width: int) -> Dict[str, Callable[[], torch.Tensor]]:
    r"""The in-place tanh variants on a :math:`(rows, width)` float32 buffer, each call
    starting from the same input (copied in first), and the copy alone."""
    g = torch.Generator().manual_seed(0)
    x = 2.0 * torch.randn(rows, width, generator=g)  # pre-activations of the hidden layer
    buffers = {name: torch.empty_like(x) for name in ('copy', 'eager', 'compiled', 'fused')}
    compiled_tanh = torch.compile(lambda t: t.copy_(torch.tanh(t)), dynamic=False)

    def copy():
        return buffers['copy'].copy_(x)

    def eager():
        return torch.tanh_(buffers['eager'].copy_(x))

    def compiled():
        return compiled_tanh(buffers['compiled'].copy_(x))

    def fused_tanh():
        with torch.no_grad():
            return fused.OddTanhFused.apply(buffers['fused'].copy_(x))
    return dict(copy=copy, eager=eager, compiled=compiled, fused=fused_tanh)


def layer_norm_variants(tokens: int, generators: int, width: int, backward: bool
                        ) -> Dict[str, Callable[[], object]]:
    r"""The LayerNorm Jacobian on generators, eager (hand-written backward) and compiled, forward
    alone or forward + backward (returning the output and the gradients of the center, the
    generators and the weight)."""
    g = torch.Generator().manual_seed(1)
    c = torch.randn(tokens, width, generator=g)
    gens = 0.1 * torch.randn(tokens, generators, width, generator=g)
    weight = 1.0 + 0.1 * torch.randn(width, generator=g)
    grad = torch.randn(tokens, generators, width, generator=g)
    functions = dict(eager=_LayerNormJacobian.apply, fused=fused.LayerNormJacobianFused.apply)

    def make(apply):
        if not backward:
            def forward():
                with torch.no_grad():
                    return apply(c, gens, weight, 1e-5)
            return forward

        def forward_backward():
            ci, gi, wi = (t.detach().requires_grad_() for t in (c, gens, weight))
            out = apply(ci, gi, wi, 1e-5)
            out.backward(grad)
            return out.detach(), ci.grad, gi.grad, wi.grad
        return forward_backward
    return {name: make(apply) for name, apply in functions.items()}


def max_relative_difference(a, b) -> float:
    r"""The largest difference between :obj:`a` and :obj:`b` (tensors of one shape, or tuples of
    them of one length, compared one by one) relative to the largest magnitude in :obj:`b`: the
    absolute difference where :obj:`b` is all zeros, NaN where either holds a NaN or an
    infinity (a broken result shows, whichever element it is in)."""
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        raise ValueError('cannot compare a tensor with a tuple')
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape:
            raise ValueError(f'shapes differ: {tuple(a.shape)} and {tuple(b.shape)}')
        if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
            return math.nan
        scale = float(b.abs().max()) if b.numel() else 0.0
        diff = float((a - b).abs().max()) if a.numel() else 0.0
        return diff / scale if scale > 0 else diff
    if len(a) != len(b):
        raise ValueError(f'{len(a)} results against {len(b)}')
    diffs = [max_relative_difference(x, y) for x, y in zip(a, b)]
    return math.nan if any(math.isnan(d) for d in diffs) else max(diffs, default=0.0)


def measure(name: str, variants: Dict[str, Callable[[], object]], repeats: int,
            reference: str = 'eager') -> List[dict]:
    r"""One row per variant of operation :obj:`name`: the median and spread of its calls, its
    ratio to :obj:`reference`, and the largest difference of its result from the reference's
    (:func:`max_relative_difference`; none for the ``copy`` row)."""
    times = time_interleaved(variants, repeats=repeats, warmup=2)
    expected = variants[reference]()
    rows = []
    for variant, fn in variants.items():
        seconds = sorted(times[variant])
        median = statistics.median(seconds)
        diff = None if variant == 'copy' else max_relative_difference(fn(), expected)
        rows.append(dict(operation=name, variant=variant, median_ms=1e3 * median,
                         min_ms=1e3 * seconds[0], max_ms=1e3 * seconds[-1], times_s=seconds,
                         max_rel_diff=diff))
    base = next(r['median_ms'] for r in rows if r['variant'] == reference)
    copy = next((r['median_ms'] for r in rows if r['variant'] == 'copy'), None)
    for row in rows:
        row['/ eager'] = row['median_ms'] / base
        if copy is not None and row['variant'] != 'copy':  # the operation less its input copy
            row['less copy_ms'] = row['median_ms'] - copy
    return rows


def plot(rows: List[dict], path: str) -> None:
    plt = pyplot()
    operations = list(dict.fromkeys(r['operation'] for r in rows))
    fig, axes = plt.subplots(1, len(operations), figsize=(4.2 * len(operations), 3.6),
                             squeeze=False)
    for ax, operation in zip(axes[0], operations):
        mine = [r for r in rows if r['operation'] == operation]
        ax.bar(range(len(mine)), [r['median_ms'] for r in mine],
               yerr=[[r['median_ms'] - r['min_ms'] for r in mine],
                     [r['max_ms'] - r['median_ms'] for r in mine]],
               color=[f'C{i}' for i in range(len(mine))], capsize=3)
        ax.set_xticks(range(len(mine)))
        ax.set_xticklabels([r['variant'] for r in mine])
        ax.set_title(operation, fontsize=9)
        ax.set_ylabel('ms per call (median; bars: min-max)')
    fig.suptitle('Generator kernels: eager against compiled (torch_mz.nn.fused)', fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def operations(args: argparse.Namespace) -> Dict[str, Callable[[], Dict[str, Callable]]]:
    r"""The operations of the run in order, by the name their rows give, each with the call that
    makes its variants (:func:`tanh_variants`, :func:`layer_norm_variants`)."""
    rows = args.tokens * args.generators
    ops = {f'tanh in place, ({rows}, {args.width})':
           functools.partial(tanh_variants, rows, args.width)}
    shape = f'({args.tokens}, {args.generators}, {args.width})'
    for backward in (False, True):
        name = f"LayerNorm Jacobian {shape}, {'forward + backward' if backward else 'forward'}"
        ops[name] = functools.partial(layer_norm_variants, args.tokens, args.generators,
                                      args.width, backward)
    return ops


def earlier_operations(path: str, args: argparse.Namespace, env: Dict[str, object]
                       ) -> Tuple[Dict[str, List[dict]], float, str]:
    r"""The rows of the partial report :obj:`path` that ``--resume`` keeps, by operation, the
    minutes they took, and a sentence on what was found; a file damaged or written with other
    :data:`SETTINGS` (or, given this run's environment :obj:`env`, in another
    :data:`ENVIRONMENT`) raises a :class:`ValueError` saying so
    (:func:`~torch_mz.study.read_partial`)."""
    if not os.path.exists(path):
        return {}, 0.0, f'nothing to resume: no {path}; measuring every operation'

    def keep(earlier: dict) -> Tuple[Dict[str, List[dict]], float]:
        by_operation: Dict[str, List[dict]] = {}
        for row in earlier['rows']:
            by_operation.setdefault(str(row['operation']), []).append(dict(row))
        return by_operation, float(earlier['minutes'])
    kept, minutes = read_partial(path, args, SETTINGS, UNIT, keep=keep, env=env,
                                 environment=ENVIRONMENT)
    return kept, minutes, f'resuming from {path}: {len(kept)} operation(s) kept'


def write_report(args: argparse.Namespace, env: Dict[str, object], rows: List[dict],
                 pending: int, minutes: float, auto_tanh: Optional[bool] = None
                 ) -> Optional[str]:
    r"""Writes the report of :obj:`rows`: while :obj:`pending` operations remain,
    ``kernels.partial.{json,md}``, marked partial; else ``kernels.{json,md,png}`` with auto
    mode's choice here (:obj:`auto_tanh`), which removes the partial report. Returns the note
    of a plot not drawn, else :obj:`None`."""
    complete = not pending
    note = None
    if complete:  # (the plot first: the report links it where drawn)
        png = os.path.join(args.out, f'{NAME}.png')
        note = replace_plot(png, plot, rows, png)
    head = '' if complete else (
        f'Partial: {pending} more operation(s) not measured (the run was cut off or is still '
        f'running; `--resume` measures the rest)\n\n')
    auto = '' if not complete else (
        f"Auto mode on this host (`torch_mz.nn.fused.tanh_kernel_faster()`, its own "
        f"measurement once per process on rows of ({args.generators}, {args.width}), unless "
        f"`TORCH_MZ_TANH_KERNEL` fixed it: "
        f"{os.environ.get('TORCH_MZ_TANH_KERNEL', 'unset')}): the generator "
        f"feed-forward's tanh runs {'the compiled kernel' if auto_tanh else 'ATen'}'s.\n")
    text = ("# Generator kernels: eager against compiled\n\n" + head +
            f"Command: `{env['command']}`  \n"
            f"{args.threads} thread(s), torch {env['torch']}, medians of {args.repeats} "
            f"interleaved calls after 2 untimed ones (which compile), "
            f"{minutes:.1f} min.\n\n{markdown_table(rows, COLS)}\n"
            f"`max_rel_diff`: the largest difference from the eager row's output (with "
            f"backward, also from each of its gradients), relative to the largest magnitude "
            f"there; the `copy` row is the copy of the input that "
            f"every tanh call makes first, and `less copy_ms` each tanh row's median less it.\n\n"
            + auto + ('' if note or not complete else f"\n![plot]({NAME}.png)\n"))
    # (the config as before: every option but --resume and --overwrite)
    config = {k: v for k, v in vars(args).items() if k not in ('resume', 'overwrite')}
    payload = dict(environment=env, config=config, minutes=minutes, rows=rows)
    if complete:
        payload['auto_tanh_kernel'] = auto_tanh
    else:
        payload['pending'] = pending
    write_results_so_far(args.out, NAME, payload, text, complete)
    return note


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    parser.add_argument('--tokens', type=positive_int, default=TOKENS,
                        help='tokens (32 clouds x 1,024 points by default)')
    parser.add_argument('--generators', type=positive_int, default=GENERATORS)
    parser.add_argument('--width', type=positive_int, default=WIDTH,
                        help='token width d (and the tanh hidden layer\'s width)')
    parser.add_argument('--repeats', type=positive_int, default=7)
    parser.add_argument('--threads', type=positive_int, default=1)
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      NAME))
    add_partial_arguments(parser, UNIT)
    args = parser.parse_args(argv)
    problem = check_out_folder(args.out)  # (before anything runs: a folder it cannot write)
    if problem:
        parser.error(problem)
    # (a run stopped between writing its complete report and removing the partial one)
    if stale_partial_done(args.out, NAME, args, SETTINGS,
                          say=lambda note: print(note, flush=True)):
        return None
    partial = os.path.join(args.out, f'{PARTIAL}.json')
    problem = partial_problem(args.resume, args.overwrite, partial, UNIT)
    if problem:
        parser.error(problem)
    torch.set_num_threads(args.threads)
    env = environment()
    if argv is not None:  # (called from Python: the arguments given, not the caller's)
        env['command'] = shlex.join(['python', 'benchmarks/kernels.py'] + list(argv))
    # (a complete report of other options is not replaced unasked)
    problem = replace_problem(os.path.join(args.out, f'{NAME}.json'), args, SETTINGS,
                              str(env['command']), args.overwrite,
                              resumed=args.resume and os.path.exists(partial))
    if problem:
        parser.error(problem)
    kept: Dict[str, List[dict]] = {}
    earlier_minutes = 0.0
    if args.resume:
        try:
            kept, earlier_minutes, message = earlier_operations(partial, args, env)
        except ValueError as e:
            parser.error(f'argument --resume: {e}')
        print(message, flush=True)
    start = time.time()
    ops = operations(args)
    kept = {name: rows for name, rows in kept.items() if name in ops}
    rows: List[dict] = []
    note = auto_tanh = None
    # (kept: the partial report resumed, else none before this call wrote a report)
    with interruptible(__file__, sys.argv[1:] if argv is None else argv, parser,
                       kept=partial if kept else None, what='operations') as stop:
        for turn in in_turn(list(ops), kept,
                            lambda name: measure(name, ops[name](), args.repeats)):
            if fused._FAILED:  # the 'fused' rows ran the eager formula: they would be mislabelled
                print(f'kernels.py: compiling the fused kernels failed here (see the warning '
                      f'above), so the fused rows of {turn.key!r} timed the eager functions; '
                      f'not written', file=sys.stderr)
                return 1
            for row in turn.value:
                print(f"{row['operation']:60s} {row['variant']:9s} {row['median_ms']:8.1f} ms "
                      f"({row['/ eager']:.2f}x eager)" + (' (kept)' if turn.kept else ''),
                      flush=True)
            if not turn.write:
                continue
            rows = [row for operation in turn.reached for row in operation]
            if not turn.pending:
                # auto mode's own measurement on this host (torch_mz.nn.fused.tanh_kernel_faster),
                # on the row shape of the mz preset's generator feed-forward, (n_g, d_ff / 2), as
                # its first call
                auto_tanh = (fused._tanh_kernel_pays((args.generators, args.width))
                             and not fused._FAILED)
            note = write_report(args, env, rows, turn.pending,
                                earlier_minutes + (time.time() - start) / 60, auto_tanh)
            stop.kept = partial if turn.pending else os.path.join(args.out, f'{NAME}.json')
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if note:
        print(note)
    print(f"auto mode's tanh here: {'compiled kernel' if auto_tanh else 'ATen'}")
    print(f'wrote {args.out}/{NAME}.*')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
