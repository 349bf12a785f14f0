r"""The main demo: ``python -m torch_mz.demo`` (what ``make demo`` runs).

Runs ``torch-mz compare`` on the quadratic-TDOF task of the paper (Eq. 4, TDOF 8, generated
locally, no download) with a one-layer MZ-Set Transformer (``mz-1l``), a four-layer standard Set
Transformer (``st-4l``), EGNN and Deep Sets, two seeds each, with the same data, epochs,
learning-rate schedule and target normalisation for every model, and prints the results table.
Extra arguments are appended to the command (e.g. ``--epochs 50``).

The budget (640 training sets, 10 epochs) shows the command working in a few minutes; no model
is near its validation plateau, so the table is a smoke run, not evidence about the paper (the
converged comparison is ``benchmarks/reproduce.py --budget converged``; its Table 1 result is in
``benchmarks/results/reproduction/summary.md``).
"""
import sys

from torch_mz.cli import DEMO_ARGS, main

SMOKE_NOTE = ('Smoke run: 640 training sets and 10 epochs, far from convergence; for the '
              'converged comparison run, from a checkout of the repository (benchmarks/ is not '
              'in the installed package): python benchmarks/reproduce.py --budget converged '
              '--claims table1 (its result, 5,000 sets and 2 seeds trained to the plateau: '
              'benchmarks/results/reproduction/summary.md)')
CHANGED_NOTE = ('Smoke run of the demo command with your extra arguments ({}); for the converged '
                'comparison run, from a checkout of the repository: python '
                'benchmarks/reproduce.py --budget converged --claims table1')

if __name__ == '__main__':
    if {'-h', '--help'} & set(sys.argv[1:]):  # what the demo is, then the options it passes on
        # (the docstring's first two paragraphs; none under python -OO, which strips docstrings)
        about = '\n\n'.join((__doc__ or '').split('\n\n')[:2]).replace('``', "'")
        print((about + '\n\n' if about else '') + 'torch-mz ' + ' '.join(DEMO_ARGS)
              + '\n\nThe options of torch-mz compare, which extra arguments may add or '
              'change:\n')
    status = main(DEMO_ARGS + sys.argv[1:])
    if status == 0:  # (not after an error or Ctrl-C: there is no smoke run to speak of)
        print(CHANGED_NOTE.format(' '.join(sys.argv[1:])) if sys.argv[1:] else SMOKE_NOTE)
    sys.exit(status)
