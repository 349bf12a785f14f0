r"""Reproduction of the paper's claims at a stated budget (issue 11): one command, resumable.

Claims: ``table1`` (depth separation on quadratic TDOF, L in {4, 16, 32}: mz-1l, st-4l, rigid,
deepsets and the mean-MLP oracle), ``table3`` (MEB radius at d in {8, 16, 32}: mz, rigid,
st-large, hypernet, perceiver, film, deepsets), ``table4`` (rotation matching at d in {8, 16},
the literal target and the un-aligned one: mz, rigid, st-large, hypernet, perceiver, film,
deepsets), ``table7`` (egnn, mz, st-large, and deepsets, which the paper leaves out, on
quadratic TDOF L = 8, MEB d = 8, covariance norm d = 8), ``table7-rot`` (Table 7's rotation
column: egnn, mz, st-large, deepsets on Table 4's d = 8 cells, sharing Table 4's runs; EGNN on
every pair of 20-60 points costs 6.8-9.5 h a 200-epoch run on one core), ``table28`` (QM9 mu and alpha from
the qm9pack source: mz, rigid, st-large, egnn, deepsets), ``d3`` (Appendix D.3: the mz
model's single-pass IHW against MC-Dropout and a 5-model deep ensemble of it, on quadratic TDOF
L = 8) and ``table30``
(cost ratios mz / rigid read from
``benchmarks/results/training_step_current/training_step.json``, the latest ``training_step.py
--rounds 3`` run, or where that is missing from the one after the PMA's key map joined its seeds,
``training_step_fold/``, the run with rounds before it, ``training_step_rounds/``, or the single
run ``training_step/``). ``table1-protocol``
and ``table3-protocol`` train Table 1's L = 16 cell and Table 3's d = 16 cell at the paper's lr
1e-4 and weight decay 1e-5 (batch 256 on MEB), no sweep.

Budgets: ``quick`` is a smoke run of the commands (128 sets, 2 epochs; not evidence);
``converged`` is the CPU budget (the paper's 5,000 / 1,000 / 2,000 sets, up to 200 epochs with
early stopping at patience 20, 2 seeds, every model swept alike over lr in {1e-3, 3e-4} x AdamW
wd in {1e-5, 0.1} on one cell per task, then steps beyond the grid (lr x 3 or / 3, wd x 3)
while a model's best point lies on the edge of the points tried, up to 3 rounds); ``paper``
follows the paper's protocol (lr 1e-4, wd 1e-5, its seed counts, QM9 on 50K molecules), for a
GPU. The verdict rule is written in
``summary.md`` (see :data:`torch_mz.reproduce.VERDICT_RULE`).

    python benchmarks/reproduce.py --budget quick --claims table1
    python benchmarks/reproduce.py --budget converged                   # hours on one core
    python benchmarks/reproduce.py --budget paper --device cuda
    python benchmarks/reproduce.py --budget converged --status          # trains nothing
    python benchmarks/reproduce.py --budget converged --runs-table      # trains nothing

``--status`` prints, per claim and stage (each task's sweep, then the claim's runs), how many
runs are done, being trained by another process, started (a checkpoint to resume) or pending,
and an estimate of the training time left from the mean time of the finished runs.
``--runs-table`` writes ``<out>/finished_runs.<budget>.{md,json}``: every finished run of the
claims (at its model's chosen sweep point) with its test R² beside the paper's figure, while
a claim is still incomplete (each row of the JSON also names the code that trained the run,
its record's ``code`` and, where kept, ``code_history``), and per claim two figures: the test
R² bars and every run's validation loss by epoch
(``finished_runs.<budget>.<claim>.curves.png``), which shows whether each run reached its
plateau; and per task swept, every lr / weight-decay point each model
tried with its validation loss and test R², and whether the chosen point lies inside the points
tried or on their edge (``finished_runs.<budget>.sweep.<task>.png``), which shows whether every
model was tuned to an optimum of the same search. Without matplotlib no figure is drawn and an
earlier run's is removed (it would not show these runs): the script prints which. With
``--seeds`` other than the claims' own count the table holds those seeds' runs only and is
written as ``finished_runs.<budget>.seeds<N>.*`` (its figures too), and with ``--claims`` naming
some of the claims, it holds theirs only and is written as
``finished_runs.<budget>.claims-<a>+<b>.*`` (``...claims-<a>.seeds<N>.*`` for both), beside the
budget's table, which it does not replace.

The MZ models train with the compiled LayerNorm-Jacobian kernels
(:func:`torch_mz.nn.set_fused_kernels`, the same map up to float rounding; ``--no-fused-kernels``
keeps the eager functions); runs trained either way are the same runs (not part of a run's
identity).

Every (cell, model, seed) run is written to ``<out>/records/<budget>/`` when it finishes and is
read back instead of trained when the command runs again, so an interrupted reproduction resumes
where it stopped (a run cut short resumes from its checkpoint in ``<out>/runs/``, which is not
committed); Ctrl-C ends it with one line that says so and gives the command again (status 130).
Two or more copies of the same command (one per core: ``OMP_NUM_THREADS=1`` each)
share the runs through file locks and each finishes the claims; a copy whose next runs another
copy is training goes on with the other claims meanwhile, and waits only when every claim left
is waiting. After each claim the script writes ``<out>/claims/<claim>.<budget>.json``,
``summary.json``, ``summary.md`` and ``<claim>.<budget>.png`` and prints the files to commit;
with ``--seeds`` other than the budget's count, ``<claim>.<budget>.seeds<N>.json`` and ``.png``
beside the budget's (which it does not replace), both in the summary.

In a job with a time limit (a cluster's, or a session's whose unfinished checkpoints will not
survive it), ``--time-limit 2:50`` (or ``170``, minutes) starts or resumes a run only when 1.25
times the longest it may take fits in what is left (every epoch it has left up to the budget's
maximum, at the mean time per epoch of the finished runs of its model on its task), trains the
runs that fit meanwhile, and exits with status 3 when runs are left for the next invocation,
so no run is cut short at the limit unless its epochs run far slower than before (see
:meth:`torch_mz.reproduce.Reproduction.fits`). A run that could not fit even in the whole
limit is an error (status 2): give it a longer limit. A claim's evaluation after its last run
is not part of the estimate.

``--time-limit 2:50 --carry`` uses the whole limit instead: any run may start while time is
left, and the run in progress stops after the epoch that ends past the limit, its checkpoint
(``<out>/runs/<budget>/<run>/checkpoint.pt`` and ``best.pt``) written for the next invocation,
which resumes it exactly (status 3) with the same torch build, thread count and hardware (the
float rounding is part of a run). The checkpoints of runs in progress in this repository's
results folder are committed (``.gitignore``; the ``quick`` budget's folder is not), so a run
longer than a session goes on in the next session's clone: commit ``<out>/runs/<budget>`` with
the records (``git add -A``, so that the checkpoints of runs finished since are removed too).
Each start and resume of a run adds a line to its ``code.jsonl`` there (the epoch it starts
from, the time, the commit the process runs, the versions, threads, fused-kernel mode and
device; a start or resume that kept no epoch is replaced by the next), which the run's record
keeps as ``code_history`` when it finishes (its ``code`` names the code of the process that
finished it).
The command ends up to one epoch after the limit, plus the evaluation of the claims it then
reads back: give it a limit that leaves that much.
"""
import time

STARTED = time.time()  # --time-limit counts from here, before the imports below

import argparse
import os
import shlex
import sys

from torch_mz.reproduce import (BUDGETS, CLAIM_NAMES, CLAIMS, Reproduction, TimeLimit,
                                overhead_records, run_claims, save_claim)
from torch_mz.reproduce.report import load_claims, plot, write_runs_table, write_summary
from torch_mz.reproduce.store import RecordError
from torch_mz.train.runtime import resolve_device
from torch_mz.nn import set_fused_kernels
from torch_mz.runtime import keep_freed_memory
from torch_mz._files import atomic_write, file_lock
from torch_mz.study import environment, positive_int, replace_plot

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, 'results')
#: the training-step runs Table 30's ratios are read from, the first that exists
TABLE30_SOURCES = ('training_step_current', 'training_step_fold', 'training_step_rounds',
                   'training_step')
EXIT_ERROR = 2
EXIT_TIME_LIMIT = 3  # stopped at --time-limit with runs left: run the same command again
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C (128 + SIGINT): run the same command again


def duration(text):
    r"""Seconds of a ``--time-limit``: minutes (``90``, ``7.5``) or ``H:MM`` / ``H:MM:SS``
    (as a cluster job's time limit is written)."""
    parts = text.strip().split(':')
    try:
        if len(parts) == 1:
            seconds = float(parts[0]) * 60
        elif len(parts) in (2, 3):
            if parts[0].strip().startswith('-'):  # ('-0:30' read as 30 minutes)
                raise ValueError(text)
            values = [int(p) for p in parts] + [0] * (3 - len(parts))
            if not all(0 <= v < 60 for v in values[1:]):
                raise ValueError(text)
            seconds = float(values[0] * 3600 + values[1] * 60 + values[2])
        else:
            raise ValueError(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'{text!r} is not a duration: minutes (e.g. 90) or H:MM[:SS] (e.g. 1:30)') from None
    if not seconds > 0 or seconds == float('inf'):
        raise argparse.ArgumentTypeError(f'the time limit must be positive, got {text!r}')
    return seconds


def other_seeds(seeds, budget, name):
    r"""The ``--seeds`` of a run of claim :obj:`name` where they are not its :obj:`budget`'s own
    count (the budget's, else the claim's paper count), else :obj:`None`: its claim file and
    plot are written beside the budget's (``<claim>.<budget>.seeds<N>.json``), whose figures a
    run with another seed count replaced. Table 30 trains nothing (its figures take no
    seeds)."""
    if seeds is None or name == 'table30':
        return None
    return None if seeds == (budget.seeds or CLAIMS[name].paper_seeds) else seeds


def print_status(repro, claims, calibrate=False, say=print):
    r"""Where each claim stands (:meth:`~torch_mz.reproduce.Reproduction.status`); with
    :obj:`calibrate`, the models without a finished run on a task are timed now and the
    training left is estimated with them. The totals count a run that several claims share
    (a sweep, Table 4's cells in ``table7-rot``) once. Each line goes to :obj:`say`
    (:func:`print`, or a collector that also prints it)."""
    runs, open_sweeps = {}, set()
    for claim in claims:
        say(f'{claim.name} ({repro.budget.name}):')
        for st in repro.status(claim, calibrate=calibrate):
            total_runs = st['done'] + st['training'] + st['started'] + st['pending']
            parts = [f"{st['done']} of {total_runs} done"] if total_runs else []
            parts += [f'{st[k]} {k}' for k in ('training', 'started', 'pending') if st[k]]
            if st.get('again'):
                parts.append(f"{st['again']} of them finished runs to train again (the claim "
                             f"scores their models, whose weights are not here)")
            if st['epochs']:
                each = st.get('epochs_each') or []
                parts.append(f"{st['epochs']} epochs into the unfinished ones"
                             + (f" ({', '.join(map(str, each))} by run)" if len(each) > 1
                                else ' (in one run)' if len(each) == 1 else ''))
            if st['unknown']:
                parts.append(f"{st['unknown']} {'more ' if total_runs else ''}runs "
                             f"{st['note']}" if st['note'] == 'after the sweep' else
                             f"{st['note']} ({st['unknown']} model(s))")
            left = st['left_s']
            if total_runs > st['done']:
                parts.append('time left unknown (a model with no finished run)' if left is None
                             else f'about {left / 3600:.1f} h of training left')
            if calibrate and (left is None and total_runs > st['done']
                              or st['note'] == 'after the sweep'):
                parts.append(f"estimated {st['estimated_s'] / 3600:.1f} h with "
                             f"{', '.join(st['timed']) or 'no model'} timed now")
            runs.update(st['runs'])
            open_sweeps |= {(st['task'], m) for m in st['open']}
            say(f"  {st['stage']}: " + '; '.join(parts or ['nothing to train']))
    known = [k for k, _ in runs.values() if k is not None]
    say(f'known runs: about {sum(known) / 3600:.1f} h of training left (one process; divide '
          f'by the processes running; a run that claims share counted once)'
          + (', more for runs not counted above' if len(known) < len(runs) or open_sweeps
             else ''))
    if calibrate:
        estimated = [e for _, e in runs.values() if e is not None]
        per_epoch = ', '.join(f'{m} on {t} {s:.1f} s'
                              for (t, m), s in sorted(repro._timed.items()))
        epochs = repro.store.mean_epochs()
        say(f'with the models timed now: about {sum(estimated) / 3600:.1f} h of training left '
              f'(one process; a timed model counts '
              + (f"{epochs:.0f} epochs a run, the store's mean" if epochs is not None else
                 f"{repro.budget.epochs} epochs a run, the budget's maximum")
              + f"; per epoch now: {per_epoch or 'none'}"
              + (f'; not counted: {len(runs) - len(estimated)} run(s) whose model could not be '
                 f'timed' if len(estimated) < len(runs) else '')
              + (f'; not counted: the points {len(open_sweeps)} model sweep(s) may add beyond '
                 f'their grids' if open_sweeps else '') + ')')
        for (task, model), error in sorted(repro.timing_errors.items()):
            say(f'could not time {model} on {task}: {error}')
        # a model with finished runs timed the same way: how the timing compares with the
        # epochs the runs took (their validation, checkpoints and the machine's load then)
        pairs = {(c['task'], m) for claim in claims for c in claim.cells for m in claim.models}
        with_runs = sorted((repro.store.epoch_time(t, m), t, m) for t, m in pairs
                           if repro.store.epoch_time(t, m) is not None)
        if with_runs:
            recorded, task, model = with_runs[-1]
            now = repro._timed_or_none(task, model)
            if now is not None:
                say(f'check: {model} on {task} timed now at {now:.1f} s per epoch (its sweep '
                      f'cell), against {recorded:.1f} s per epoch in its finished runs (every '
                      f'cell; {recorded / now:.2f}x): read the timed estimates with that factor')


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    parser.add_argument('--budget', choices=tuple(BUDGETS), default='converged')
    parser.add_argument('--claims', default=','.join(CLAIM_NAMES),
                        help=f"comma-separated subset of {', '.join(CLAIM_NAMES)}")
    parser.add_argument('--seeds', type=positive_int, default=None,
                        help="seeds per (cell, model) instead of the budget's (for d3: study "
                             "seeds, each of 5 ensemble members)")
    parser.add_argument('--device', default='auto')
    parser.add_argument('--no-fused-kernels', dest='fused_kernels', action='store_false',
                        help="train the MZ models with the eager LayerNorm-Jacobian functions "
                             "instead of the compiled ones (torch_mz.nn.set_fused_kernels; on by "
                             "default here: about 15%% faster for mz-1l, the same map up to "
                             "rounding; without a C++ compiler they fall back with a warning)")
    parser.add_argument('--progress', action='store_true',
                        help="a progress bar for every run (epochs and the latest metrics; runs "
                             "of the converged budget take up to an hour each on one core) and "
                             "for building each task's data (QM9's first processing takes "
                             "minutes)")
    parser.add_argument('--calibrate', action='store_true',
                        help='with --status: time a few training steps of each model that has '
                             'no finished run on its task, and estimate the training left with '
                             'them (under the current load: a figure for planning)')
    parser.add_argument('--status', action='store_true',
                        help="print where each claim stands (runs done, being trained by "
                             "another process, started, pending) and an estimate of the "
                             "training time left, from the finished runs; trains nothing")
    parser.add_argument('--status-file', default=None, metavar='PATH',
                        help="with --status: also write what it prints to PATH (Markdown: the "
                             "command and the time first), e.g. "
                             "benchmarks/results/reproduction/status.converged.md, so that the "
                             "estimates quoted elsewhere stay traceable")
    parser.add_argument('--runs-table', action='store_true',
                        help="write finished_runs.<budget>.md and .json: every finished run of "
                             "the claims, its test R² beside the paper's (with --seeds other "
                             "than the claims' own count, finished_runs.<budget>.seeds<N>.*, "
                             "and with --claims naming some of them, "
                             "finished_runs.<budget>.claims-<a>+<b>.*, beside it); trains "
                             "nothing")
    parser.add_argument('--time-limit', type=duration, default=None, metavar='DURATION',
                        help="stop within this time (minutes, or H:MM[:SS]), e.g. a cluster "
                             "job's limit less a few minutes: a run starts (or resumes) only "
                             "when 1.25 times the longest it may take (its epochs left up to "
                             "the maximum, at the mean time per epoch of the finished runs of "
                             "its model on its task) fits in what is left, the runs that fit "
                             "are trained meanwhile, and the command exits with status 3 when "
                             "runs are left for the next invocation (2 if a claim failed, or a "
                             "run could not fit even in the whole limit). A started run is not "
                             "stopped, except with --carry")
    parser.add_argument('--carry', action='store_true',
                        help="with --time-limit: use the whole limit; any run may start while "
                             "time is left, and the run in progress stops after the epoch that "
                             "ends past the limit, its checkpoint kept for the next invocation "
                             "to resume from exactly (commit <out>/runs/<budget> to carry it "
                             "to another clone)")
    parser.add_argument('--out', default=None,
                        help='results folder (default: benchmarks/results/reproduction, and '
                             'benchmarks/results/reproduction/quick for --budget quick)')
    args = parser.parse_args(argv)
    claims = [c.strip() for c in args.claims.split(',') if c.strip()]
    unknown = [c for c in claims if c not in CLAIM_NAMES]
    if unknown:
        parser.error(f"unknown claims {unknown}; available: {', '.join(CLAIM_NAMES)}")
    if not claims:
        parser.error(f"--claims names no claim (got {args.claims!r}); available: "
                     f"{', '.join(CLAIM_NAMES)}")
    twice = sorted({c for c in claims if claims.count(c) > 1})
    if twice:
        parser.error(f"--claims names {', '.join(twice)} twice")
    try:  # before any claim: 'cuda' on a machine without one, a name torch does not know
        if not (args.status or args.runs_table) or args.calibrate:  # (else nothing runs on it)
            resolve_device(args.device)
    except ValueError as e:
        parser.error(f'--device: {e}')
    if args.calibrate and not args.status:
        parser.error("--calibrate goes with --status (it estimates the training left)")
    if args.status_file is not None and not args.status:
        parser.error("--status-file goes with --status (it writes what --status prints)")
    if args.status_file is not None:  # before minutes of timing with --calibrate
        if not args.status_file.strip():
            parser.error('--status-file needs a path')
        if os.path.isdir(args.status_file):
            parser.error(f"--status-file {args.status_file!r} is a folder, not a file")
        folder = os.path.dirname(os.path.abspath(args.status_file))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            parser.error(f"--status-file {args.status_file!r}: cannot make its folder "
                         f"({e.strerror})")
    if args.runs_table and claims == ['table30']:  # (it wrote an empty table over every run's)
        parser.error("--runs-table: --claims table30 names no claim with runs to list (its "
                     "figures are the training step's timings)")
    if args.carry and args.time_limit is None:
        parser.error('--carry needs --time-limit (it says what to do at the limit)')
    out = args.out or os.path.join(RESULTS, 'reproduction', *(
        ('quick', ) if args.budget == 'quick' else ()))
    if os.path.exists(out) and not os.path.isdir(out):
        parser.error(f"--out {out!r} is a file, not a results folder")
    budget = BUDGETS[args.budget]
    if args.status or args.runs_table:
        try:
            return _report(args, claims, budget, out)
        except (RecordError, ValueError, OSError) as e:  # a damaged record or claim file
            print(f'reproduce.py: {e}', file=sys.stderr)
            return EXIT_ERROR
    try:  # a damaged claim file would fail the summary after hours of training: now
        load_claims(out)
    except ValueError as e:
        print(f'reproduce.py: {e}', file=sys.stderr)
        return EXIT_ERROR
    if args.budget == 'paper' and resolve_device(args.device).type == 'cpu':
        # (it trained on the CPU without a word: --device auto finds no GPU there)
        how = ('--device auto found no CUDA device' if args.device == 'auto' else
               f'--device {args.device}')
        print(f'reproduce.py: warning: --budget paper is meant for a GPU, and {how}: it trains '
              f'on the CPU, many times slower; run it with --device cuda on a GPU machine, or '
              f'use --budget converged, the CPU budget', file=sys.stderr, flush=True)
    try:
        return _train(args, claims, budget, out)
    except KeyboardInterrupt:  # (Ctrl-C: a traceback, for a stop the script is meant for)
        command = shlex.join([os.path.basename(sys.executable), os.path.relpath(__file__),
                              *(sys.argv[1:] if argv is None else argv)])
        print(f'reproduce.py: interrupted; the finished runs are stored, and a run cut short '
              f'goes on from its last checkpoint: {_go_on(out, budget.name, command)}',
              file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def _go_on(out, budget, command=None) -> str:
    r"""What to do after a stop with runs left (the time limit, Ctrl-C): run the same command
    (:obj:`command`, where given) again, and the folders to commit to carry the runs finished
    so far and the checkpoints of those in progress to another clone (those of :obj:`out`
    that exist; the ``quick`` budget's checkpoints are not committed)."""
    done = [p for p in (os.path.join(out, 'records', budget),
                        os.path.join(out, 'weights', budget), os.path.join(out, 'runs', budget))
            if os.path.exists(p) and not (p.endswith(os.path.join('runs', 'quick')))]
    return ('run the same command again to go on' + (f', {command}' if command else '') + (
        f" (the runs finished so far and the checkpoints of those in progress: git add -A "
        f"{' '.join(os.path.relpath(p) for p in done)})" if done else ''))


def _report(args, claims, budget, out) -> int:
    r"""``--status`` and ``--runs-table``: what the store holds, nothing trained."""
    if args.calibrate:  # time as training runs (below)
        keep_freed_memory()
        set_fused_kernels(args.fused_kernels)
    repro = Reproduction(budget, out, device=args.device, seeds=args.seeds)
    if args.status:
        lines = []

        def say(text):
            print(text, flush=True)
            lines.append(text)
        print_status(repro, [CLAIMS[n] for n in claims if n != 'table30'],
                     calibrate=args.calibrate, say=say)
        if args.status_file is not None:
            env = environment()
            stamp = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
            text = (f"# Where the claims stand ({budget.name} budget), {stamp}\n\n"
                    f"Command: `{env['command']}` (trains nothing"
                    + ('; the models without a finished run were timed under the load of '
                       'the moment, a figure for planning' if args.calibrate else '')
                    + ')\n\n```\n' + '\n'.join(lines) + '\n```\n')
            atomic_write(args.status_file, lambda f: f.write(text), binary=False)
            print(f'wrote {args.status_file}')
    if args.runs_table:  # (--claims naming some of the claims: their table beside every one's)
        path = write_runs_table(repro, [CLAIMS[n] for n in claims if n != 'table30'], out,
                                on_note=print,  # (an earlier figure removed: which, and why)
                                every=list(CLAIMS))
        print(f'wrote {path}.md, .json')
    return 0


def _train(args, claims, budget, out) -> int:
    r"""Runs the claims (resuming what the store holds) and writes their files and the
    summary."""
    trained = []
    summary = []  # whether a summary was written

    def report(run):
        print(f"  {run['cell']:24s} {run['model']:9s} seed {run['seed']}: "
              + (f"diverged ({run['diverged']}), " if 'diverged' in run else
                 f"test r2 {run['test'].get('r2', float('nan')):.4f}, ")
              + f"{run['epochs_run']} epochs, "
              f"lr {run['key']['config']['lr']:g} wd {run['key']['config']['weight_decay']:g} "
              f"({run['wall_time_s'] / 60:.1f} min)", flush=True)
        trained.append(run)

    def waiting(cell, model, seed):
        print(f'  {cell:24s} {model:9s} seed {seed}: another process is training it; waiting',
              flush=True)

    # this process is ours: faster large CPU batches; and the presets then train every batch
    # whole (without it, batches with activations above 32 MiB in groups, other dropout draws)
    keep_freed_memory()
    set_fused_kernels(args.fused_kernels)  # runs are long: compiling once pays off
    start, failed, later = time.time(), [], []
    repro = Reproduction(budget, out, device=args.device, seeds=args.seeds, on_result=report,
                         on_wait=waiting, progress=args.progress,
                         deadline=None if args.time_limit is None else STARTED + args.time_limit,
                         carry=args.carry)
    repro.started = STARTED
    try:
        tidied = repro.store.tidy()  # the folders of finished runs a stopped process left
    except OSError as e:  # (a read-only store: the claims say more)
        print(f'reproduce.py: the store was not tidied: {e}', file=sys.stderr)
        tidied = []
    if tidied:
        print(f'removed the checkpoint folders of {len(tidied)} finished run(s) that a stopped '
              f'process left: ' + ', '.join(os.path.relpath(p) for p in tidied), flush=True)

    def finish(name, records):
        seeds = other_seeds(args.seeds, budget, name)  # (beside the budget's files, not over)
        png = f"{name}.{budget.name}{'' if seeds is None else f'.seeds{seeds}'}.png"
        if name != 'table30' and CLAIMS[name].evaluate is None:  # bars of test R²
            # summary.md links every figure in out: where none is drawn, an earlier run's goes
            drawn = os.path.join(out, png)
            note = replace_plot(drawn, plot, CLAIMS[name], records, budget.name, drawn)
            if note:
                print(note)
        # under a lock: two processes finishing claims at once would otherwise write
        # summaries each missing the other's claim (read all claims, then write)
        with file_lock(os.path.join(out, 'claims', '.summary.lock')):
            path = save_claim(out, name, budget.name, records, seeds=seeds)
            write_summary(out, (time.time() - start) / 60)
            summary.append(True)
        for r in records:
            print(f"  {r['claim']}: paper {r['paper']['value']:+.3f}, ours "
                  f"{r['ours']['mean']:+.3f} ± {r['ours']['std']:.3f} -> {r['verdict']}")
        commit = [path, os.path.join(out, 'summary.json'), os.path.join(out, 'summary.md')]
        commit += [os.path.join(out, f) for f in (png,
                                                  os.path.join('records', budget.name),
                                                  os.path.join('weights', budget.name),
                                                  os.path.join('runs', budget.name))
                   if os.path.exists(os.path.join(out, f)) and not (
                       f.startswith('runs') and budget.name == 'quick')]  # (not committed)
        # -A: the checkpoints of runs finished since (committed while in progress) go too
        print(f'  {name} done; to commit: git add -A '
              + ' '.join(os.path.relpath(p) for p in commit), flush=True)

    if 'table30' in claims:  # read from the operator benchmark, nothing to train
        print(f'table30 ({budget.name}):', flush=True)
        # the latest run with rounds where there is one (its ratios pool three rounds of the
        # host's spells): the current one, the one after the PMA's key map joined its seeds
        # (fold_keys), the one before it, else the single run
        candidates = [os.path.join(RESULTS, name, 'training_step.json')
                      for name in TABLE30_SOURCES]
        try:  # (a damaged file: named, and the claims that train go on)
            finish('table30', overhead_records(
                next((c for c in candidates if os.path.exists(c)), candidates[-1]),
                budget.name))
        except (ValueError, OSError) as e:
            print(f'reproduce.py: table30 not run: {e}', file=sys.stderr)
            failed.append('table30')

    def starting(claim):
        print(f'{claim.name} ({budget.name}):', flush=True)

    def held(claim, e):
        print(f'  {claim.name} waits ({e}); the other claims first', flush=True)

    for claim, records, error in run_claims(
            repro, [CLAIMS[n] for n in claims if n != 'table30'], on_start=starting,
            on_held=held, errors=(FileNotFoundError, ImportError, OSError, ValueError)):
        if isinstance(error, TimeLimit) and error.never:
            print(f'reproduce.py: {claim.name} stops: {error}', file=sys.stderr)
            failed.append(claim.name)
        elif isinstance(error, TimeLimit):
            print(f'  {claim.name} stops at the time limit: {error}', flush=True)
            later.append(claim.name)
        elif error is not None:
            print(f'reproduce.py: {claim.name} not run: {error}', file=sys.stderr)
            failed.append(claim.name)
        else:
            try:
                finish(claim.name, records)
            except (ValueError, OSError) as e:  # its runs are in the store: none is lost
                print(f'reproduce.py: {claim.name} finished, but its files could not be '
                      f'written: {e}', file=sys.stderr)
                failed.append(claim.name)
    print(f'{len(trained)} runs trained, {(time.time() - start) / 60:.1f} min'
          + (f'; wrote {out}/summary.json, summary.md' if summary else '; no summary written'))
    if later:
        print(f"left for the next invocation (the time limit): {', '.join(later)}; "
              f'{_go_on(out, budget.name)}', flush=True)
    return EXIT_ERROR if failed else EXIT_TIME_LIMIT if later else 0


if __name__ == '__main__':
    sys.exit(main())
