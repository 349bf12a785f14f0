r"""The training budget of a study: a quick (smoke) and a full setting, each overridable from the
script's command line, and the training configuration every run of the study shares.

A script declares its two budgets and lets its parser take the overrides::

    QUICK = Budget(seeds=2, n_train=640, epochs=10, lr=1e-3)
    FULL = Budget(seeds=3, n_train=5000, epochs=100, lr=1e-4)

    parser = argparse.ArgumentParser()
    add_budget_arguments(parser, quick_help='2 seeds, small budget')
    args = parser.parse_args()
    budget = choose_budget(args, QUICK, FULL)       # --quick picks QUICK, --seeds etc. override
    config = study_config(budget, device=args.device)

Library code: the script owns and parses the command line; these functions only declare and read
the budget's options.
"""
import argparse
import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Mapping, Optional, Sequence, Tuple

from torch_mz.study.arguments import positive_float, positive_int
from torch_mz.train import TrainConfig

__all__ = ['Budget', 'add_budget_arguments', 'add_resume_argument', 'choose_budget',
           'study_config']


@dataclass(frozen=True)
class Budget:
    r"""How much a study trains.

    Args:
        seeds (int): Training seeds per model and cell.
        n_train (int, optional): Training sets (:obj:`None`: the task's or dataset's own).
        epochs (int): Training epochs.
        lr (float, optional): Peak learning rate (:obj:`None`: the script sets it otherwise).
        n_val (int, optional): Validation sets. (default: :obj:`None`)
        n_test (int, optional): Test sets. (default: :obj:`None`)
    """
    seeds: int
    n_train: Optional[int]
    epochs: int
    lr: Optional[float] = None
    n_val: Optional[int] = None
    n_test: Optional[int] = None

    def split_sizes(self) -> Tuple[int, int, int]:
        r"""``(n_train, n_val, n_test)``, validation and test defaulting to a quarter and a half
        of the training sets (at least one each)."""
        if self.n_train is None:
            raise ValueError('split_sizes needs n_train')
        return (self.n_train, self.n_val or max(1, self.n_train // 4),
                self.n_test or max(1, self.n_train // 2))


# every budget option is a count of at least one or a positive learning rate: a 0 or a negative
# value is argparse's usage error (it used to be read as 'not given' and silently ignored)
_TYPES = {'seeds': positive_int, 'n_train': positive_int, 'n_val': positive_int,
          'n_test': positive_int, 'epochs': positive_int, 'lr': positive_float}


def device_name(text: str) -> str:
    r"""An argparse type: 'auto', 'cpu', 'cuda' or 'cuda:<index>' of a CUDA device this machine
    has, returned as given."""
    import re

    import torch
    match = re.fullmatch(r'cuda(?::(\d+))?', text)
    if text in ('auto', 'cpu'):
        return text
    if match is None:
        raise argparse.ArgumentTypeError(f"expected 'auto', 'cpu', 'cuda' or 'cuda:<index>', "
                                         f"got {text!r}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(match.group(1) or 0)
    if index >= count:
        raise argparse.ArgumentTypeError(
            f'{text!r}: this machine has {count} CUDA device(s)' if count else
            f'{text!r}: CUDA is not available here')
    return text


def add_budget_arguments(parser: argparse.ArgumentParser, quick_help: str,
                         overrides: Sequence[str] = ('seeds', 'n_train', 'epochs', 'lr'),
                         device: bool = True, helps: Optional[Mapping[str, str]] = None) -> None:
    r"""Adds ``--quick`` (help text :obj:`quick_help`), one option per name of :obj:`overrides`
    (``--seeds``, ``--n-train``, ``--n-val``, ``--n-test``, ``--epochs``, ``--lr``, each
    defaulting to :obj:`None`: the budget's value; a count below 1 or a learning rate that is not
    positive is a usage error; :obj:`helps` gives help texts by name) and,
    with :obj:`device`, ``--device`` (default ``'auto'``) to :obj:`parser`."""
    parser.add_argument('--quick', action='store_true', help=quick_help)
    helps = helps or {}
    for name in overrides:
        if name not in _TYPES:
            raise ValueError(f"no budget option '{name}' (options: {', '.join(_TYPES)})")
        parser.add_argument('--' + name.replace('_', '-'), type=_TYPES[name], default=None,
                            help=helps.get(name))
    if device:  # (checked as it is parsed: a bad name was a traceback after the data built)
        parser.add_argument('--device', default='auto', type=device_name)


def add_resume_argument(parser: argparse.ArgumentParser) -> None:
    r"""Adds ``--resume`` and ``--overwrite`` to :obj:`parser`: the study reads back the runs
    an interrupted call with the same settings finished, or removes them; without either, an
    output folder that holds runs is refused (:meth:`~torch_mz.study.RunStore.for_study`).
    The line a study prints on Ctrl-C gives the command with them:
    :func:`~torch_mz.study.interrupted_note`."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument('--resume', action='store_true',
                       help='keep the runs an interrupted call with the same settings finished '
                       '(kept one file each in <out>/runs) instead of training them again')
    group.add_argument('--overwrite', action='store_true',
                       help='remove the runs an earlier call kept in <out>/runs and train every '
                       'run again (without --resume or --overwrite such a folder is refused)')


def choose_budget(args: argparse.Namespace, quick: Budget, full: Budget) -> Budget:
    r""":obj:`quick` if ``args.quick`` else :obj:`full`, with every budget option given on the
    command line (a value other than :obj:`None`) in place of the budget's own, a count as a
    Python :obj:`int` (a NumPy integer, or a float of integral value such as ``4000.0``). A value
    that is not a positive count (finite learning rate) raises a :class:`ValueError` naming the
    option (the parser's types refuse it first, from the command line)."""
    base = quick if args.quick else full
    given = {f.name: getattr(args, f.name) for f in fields(Budget)
             if getattr(args, f.name, None) is not None}
    for name, value in given.items():
        # (a NumPy number too; a count of integral value as a Python int: 4000.0 was kept a
        # float, which every task refuses as a set count and range() as a seed count)
        number = (float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool)
                  else math.nan)
        if not 0 < number < math.inf or (name != 'lr' and not number.is_integer()):
            what = 'a positive learning rate' if name == 'lr' else 'a count of at least 1'
            raise ValueError(f"--{name.replace('_', '-')} must be {what}, got {value!r}")
        given[name] = number if name == 'lr' else int(number)
    return replace(base, **given)


def study_config(budget: Budget, device: str = 'auto', batch_size: int = 64,
                 **options) -> TrainConfig:
    r"""The training configuration shared by a study's runs: :obj:`budget`'s epochs and learning
    rate, a linear warm-up over a tenth of the epochs (1 to 5, and at most half the run: none
    for 1 epoch), batch size :obj:`batch_size`, no progress bars; :obj:`options` set
    any other :class:`~torch_mz.train.TrainConfig` field (e.g. ``seed``, ``patience``)."""
    if budget.lr is None:
        raise ValueError("study_config needs a budget with a learning rate (got lr=None)")
    return TrainConfig(epochs=budget.epochs, warmup_epochs=_study_warmup(budget.epochs),
                       batch_size=batch_size, lr=budget.lr, device=device, progress=False,
                       **options)


def _study_warmup(epochs: int) -> int:
    r"""The warm-up epochs of a study's run of :obj:`epochs` epochs: a tenth of the run, 1 to 5,
    and at most half the run, as the command line's (``torch-mz train``), so that one epoch is
    no warm-up (it was all warm-up: one step per epoch trained at learning rate 0, i.e. not at
    all). Only a run of 1 epoch changes: 0 there, as before 1 for 2 to 19 epochs, ``epochs //
    10`` for 20 to 59 and 5 from 60 (the studies' budgets of 5, 8, 10, 30, 100 and 200 epochs
    keep 1, 1, 1, 3, 5 and 5)."""
    return min(5, max(1, epochs // 10), max(epochs, 0) // 2)
