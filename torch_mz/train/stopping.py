r"""Stopping training at a time, between epochs, so that a run can go on elsewhere.

A job with a time limit (a cluster allocation, a CI session) that is killed loses the epoch in
progress and, if the kill lands in the middle of writing, leaves nothing to clean up only because
checkpoints are written atomically. :func:`stop_by` does better: inside its ``with`` block a
:class:`~torch_mz.train.Trainer` that writes files (``out_dir`` set) checks the time after every
epoch and, once it is past the deadline with epochs left, writes ``checkpoint.pt`` (whatever
``checkpoint_every`` says) and raises :class:`TrainingStopped`. Resuming from that checkpoint
(``TrainConfig(resume=...)``) continues exactly as the uninterrupted run would have (the
trainer's resumption is exact), so a run may span several jobs. A run that has nowhere to write a
checkpoint is not stopped (stopping it would only lose it).
"""
import contextvars
import math
import numbers
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Tuple

__all__ = ['TrainingDiverged', 'TrainingStopped', 'stop_by']

_DEADLINE: contextvars.ContextVar[Optional[Tuple[float, Callable[[], float]]]] = \
    contextvars.ContextVar('torch_mz_train_deadline', default=None)


class TrainingStopped(RuntimeError):
    r"""Raised by :meth:`Trainer.fit <torch_mz.train.Trainer.fit>` inside :func:`stop_by` when
    the deadline has passed: the checkpoint of the last finished epoch (:attr:`epoch`) is at
    :attr:`checkpoint`, ready to resume from."""
    def __init__(self, epoch: int, checkpoint: str):
        super().__init__(f'training stopped at its deadline after epoch {epoch}; resume from '
                         f'{checkpoint!r}')
        self.epoch = epoch
        self.checkpoint = checkpoint

    def __reduce__(self):  # (pickled by process pools: rebuilt from its arguments)
        return type(self), (self.epoch, self.checkpoint)


class TrainingDiverged(FloatingPointError):
    r"""Raised by :meth:`Trainer.fit <torch_mz.train.Trainer.fit>` when an epoch's training loss
    or validation loss is not finite (NaN or inf): the run cannot go on (weights that give a
    NaN validation loss are never the best, and early stopping would only wait out the
    patience), and resuming it from its last checkpoint would diverge again at the same epoch
    (resumption is exact). :attr:`epoch` is the epoch (0-based) whose loss was :attr:`loss`, on
    the split :attr:`split` (``'training'`` or ``'validation'``; ``'weights'`` where the loss
    was finite but the weights the epoch's last steps left are not); the checkpoint and metrics of
    the epochs before it are left as they were. A :class:`FloatingPointError`, as before it had a
    name. :attr:`train_loss` is :attr:`loss` (its name before validation losses were checked)."""
    def __init__(self, epoch: int, loss: float, split: str = 'training'):
        if split == 'weights':  # the last optimiser steps of an epoch overflowed
            super().__init__(f'The weights are not finite after epoch {epoch}; lower the '
                             f'learning rate or check the data for NaN/inf')
        else:
            hint = ('lower the learning rate or check the data for NaN/inf'
                    if split == 'training'
                    else 'the weights overflowed, or the validation data holds NaN/inf')
            super().__init__(f'{split.capitalize()} loss is {loss} in epoch {epoch}; {hint}')
        self.epoch = epoch
        self.loss = self.train_loss = loss
        self.split = split

    def __reduce__(self):  # (pickled by process pools: rebuilt from its arguments)
        return type(self), (self.epoch, self.loss, self.split)


@contextmanager
def stop_by(deadline: Optional[float],
            clock: Callable[[], float] = time.time) -> Iterator[None]:
    r"""Within the block, training stops after the first epoch that ends at or past
    :obj:`deadline` (read against :obj:`clock`, :func:`time.time` seconds by default) and
    raises :class:`TrainingStopped` once the epoch's checkpoint is written. :obj:`None` sets no
    deadline. Not for distributed training (its processes could disagree on the time): a
    :class:`~torch_mz.train.Trainer` launched with ``torchrun`` refuses it. A deadline that is
    not a number (text, a bool) or is NaN (which no time reaches: the run would never stop)
    raises a :class:`ValueError`."""
    if deadline is not None and (isinstance(deadline, bool)
                                 or not isinstance(deadline, numbers.Real)
                                 or math.isnan(deadline)):
        raise ValueError(f"'deadline' must be a time in seconds read against 'clock' (e.g. "
                         f"time.time() + 3600) or None (got {deadline!r})")
    if not callable(clock):
        raise ValueError(f"'clock' must be a callable returning seconds (got {clock!r})")
    token = _DEADLINE.set(None if deadline is None else (float(deadline), clock))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _stop_due() -> bool:
    r"""Whether a :func:`stop_by` deadline is set and has passed."""
    limit = _DEADLINE.get()
    return limit is not None and limit[1]() >= limit[0]


def _stop_requested() -> bool:
    r"""Whether a :func:`stop_by` deadline is set at all."""
    return _DEADLINE.get() is not None
