r"""The main demo: ``python -m torch_mz.demo`` (what ``make demo`` runs).

Runs ``torch-mz compare`` on the quadratic-TDOF task of the paper (Eq. 4, TDOF 8, generated
locally, no download) with a one-layer MZ-Set Transformer (``mz-1l``), a four-layer standard Set
Transformer (``st-4l``) and EGNN, two seeds each, with the same data, epochs, learning-rate
schedule and target normalisation for every model, and prints the results table. Extra arguments
are appended to the command (e.g. ``--epochs 50``).
"""
import sys

from torch_mz.cli import DEMO_ARGS, main

if __name__ == '__main__':
    sys.exit(main(DEMO_ARGS + sys.argv[1:]))
