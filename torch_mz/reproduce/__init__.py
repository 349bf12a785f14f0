r"""Reproduction of the MZAttn paper's claims at a stated budget (issue 11): the claims, the
budgets, a learning-rate / weight-decay sweep that every model gets alike, a store of finished
runs that makes every study resumable, and the verdict rule. The engine of
``benchmarks/reproduce.py``. Library code: no printing.

Every run (task cell, model, seed, training configuration) is written to its own JSON file when it
finishes and is read back instead of trained when asked for again, so an interrupted reproduction
resumes where it stopped, and a run shared by two claims or by the sweep and a claim is trained
once. A run in progress keeps a checkpoint (under ``runs/``) that it resumes from, exactly; in the
repository's own results folder the checkpoints of runs in progress are committed (see
``.gitignore``), so that with ``carry`` (:class:`Reproduction`) a run longer than one job goes on
in the next one, in another clone.

Several processes may run the same reproduction at once (one per core, say) and share its runs:
each run is trained by the process that locks it first (an advisory file lock next to the
checkpoints, released by the operating system when its process ends, so a killed process's run is
taken over), and a process that needs a run another one holds waits for it.
"""

from torch_mz.reproduce.verdict import TOL_ABS, TOL_REL, VERDICTS, VERDICT_RULE, verdict
from torch_mz.reproduce.budgets import (BUDGETS, Budget, SWEEP, SWEEP_MAX_STEPS, SWEEP_STEP,
                                        TIME_MARGIN, sweep_extension)
from torch_mz.reproduce.claims import (CLAIMS, CLAIM_NAMES, Claim, Comparison, D3_MEMBERS,
                                       D3_PASSES, GEOMETRIC_TASKS, PAPER_D3, PAPER_PROTOCOL,
                                       SWEEP_CELLS)
from torch_mz.reproduce.store import RunStore, run_key
from torch_mz.reproduce.runner import Reproduction, RunsHeld, TimeLimit, run_claims
from torch_mz.reproduce.d3 import d3_records
from torch_mz.reproduce.table30 import overhead_records
from torch_mz.reproduce.report import (claim_path, load_claims, models_table, save_claim,
                                       summary_table)

__all__ = ['TOL_ABS', 'TOL_REL', 'VERDICTS', 'VERDICT_RULE', 'verdict', 'BUDGETS', 'Budget',
           'SWEEP', 'SWEEP_MAX_STEPS', 'SWEEP_STEP', 'TIME_MARGIN', 'sweep_extension', 'CLAIMS',
           'CLAIM_NAMES', 'Claim', 'Comparison', 'D3_MEMBERS', 'D3_PASSES', 'GEOMETRIC_TASKS',
           'PAPER_D3', 'PAPER_PROTOCOL', 'SWEEP_CELLS', 'RunStore', 'run_key', 'Reproduction',
           'RunsHeld', 'TimeLimit', 'run_claims', 'd3_records', 'overhead_records', 'claim_path',
           'load_claims', 'models_table', 'save_claim', 'summary_table']
