r"""What a run is told (:class:`TrainConfig`) and what it returns (:class:`TrainResult`)."""
import copy
import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from torch_mz.train.normalize import TargetNormalizer

__all__ = ['TrainConfig', 'TrainResult', 'SCHEDULES']

SCHEDULES = ('step', 'epoch')


@dataclass
class TrainConfig:
    r"""Hyper-parameters and run settings of :class:`Trainer`; defaults follow the paper.

    Args:
        epochs (int, optional): Maximum number of epochs. (default: :obj:`100`)
        batch_size (int, optional): Sets per batch (per process under DDP). (default: :obj:`128`)
        eval_batch_size (int, optional): Batch size for evaluation and prediction; :obj:`None` uses
            ``batch_size``. (default: :obj:`None`)
        lr (float, optional): Peak learning rate of AdamW. (default: :obj:`1e-4`)
        weight_decay (float, optional): AdamW weight decay, applied to every parameter
            (biases and normalisation weights too). (default: :obj:`1e-5`)
        warmup_epochs (int, optional): Epochs of linear warm-up from 0 to ``lr`` before the cosine
            decay to 0 at the end of ``epochs``. (default: :obj:`5`)
        schedule (str, optional): Advance the schedule every optimiser ``'step'`` or every
            ``'epoch'`` (the first epoch then runs at learning rate 0 when ``warmup_epochs > 0``).
            (default: :obj:`'step'`)
        grad_clip (float, optional): Maximum :math:`\ell_2` norm of all gradients; :obj:`None`
            disables clipping. (default: :obj:`1.0`)
        patience (int, optional): Stop after this many epochs in a row without a validation-loss
            improvement (see ``min_delta``); :obj:`None` disables early stopping.
            (default: :obj:`20`)
        min_delta (float, optional): An epoch improves on the best validation loss so far only
            if its loss is lower by more than ``min_delta`` (an absolute difference, in the
            units of the validation loss: standardised targets where they are normalised; a
            decrease of exactly ``min_delta`` does not count; with :obj:`0.0` any decrease
            does, a tie does not).
            (default: :obj:`0.0`)
        restore_best (bool, optional): Load the weights of the best validation epoch at the end.
            With :obj:`False` the model keeps the last epoch's weights, which the test metrics
            describe, while ``best_epoch``, ``best_val_loss``, ``val_metrics`` and ``best.pt``
            are the best epoch's (:attr:`TrainResult.model_epoch` says which epoch the model
            holds). (default: :obj:`True`)
        seed (int, optional): Seed for Python, NumPy and PyTorch (``seed + rank`` under DDP) and
            for the shuffling of the training set, in :math:`[0, 2^{32})` (PyTorch's CPU
            generator and NumPy keep 32 bits of a seed); ``seed + epochs`` (epoch e shuffles
            with ``seed + e``) and under DDP ``seed + world_size`` must not exceed
            :math:`2^{32}` (:meth:`Trainer.fit` refuses it). A resume takes the seed of its
            checkpoint's run and no other (another is refused, as the command line's
            ``--seed`` is). (default: :obj:`0`)
        deterministic (bool, optional): Ask PyTorch for deterministic algorithms while the
            run trains (the settings as they were after it). (default: :obj:`False`)
        device (str, optional): ``'auto'`` (CUDA if available, else CPU), ``'cpu'``, ``'cuda'``
            or ``'cuda:<i>'``. Under DDP a CUDA process uses ``cuda:<LOCAL_RANK>``.
            (default: :obj:`'auto'`)
        num_workers (int, optional): DataLoader worker processes. Random transforms
            (augmentations, ScanObjectNN's ``resample``) then run in the workers, each seeded
            (torch, Python and NumPy) from a base seed that the main process draws anew every
            epoch: reproducible for a :obj:`seed` and :obj:`num_workers`, different across
            workers and epochs, but not the draws of another :obj:`num_workers` (nor of
            :obj:`0`, which draws in the main process). (default: :obj:`0`)
        normalize_targets (bool, optional): Standardise regression targets with statistics of the
            training split. (default: :obj:`True`)
        out_dir (str, optional): Directory for ``metrics.jsonl``, ``metrics.csv``,
            ``checkpoint.pt``, ``best.pt`` and ``result.json``; :obj:`None` writes nothing.
            Held while the run trains: a second run into it at the same time is refused
            (:meth:`Trainer.fit`). (default: :obj:`None`)
        checkpoint_every (int, optional): Write ``checkpoint.pt`` every this many epochs (and after
            the last one); 0 writes it only after the last epoch. (default: :obj:`1`)
        resume (str, optional): Path of a ``checkpoint.pt`` to continue from at its next epoch.
            A run that trains further removes its :obj:`out_dir`'s ``result.json`` once its
            first epoch has trained, until it finishes (stopped before, it would describe the
            shorter run). A finished run (no epoch left to train under this configuration)
            resumed with another configuration is refused: it would train nothing, yet
            record the new settings in its ``result.json`` and ``best.pt``. (default:
            :obj:`None`)
        overwrite (bool, optional): A run that does not resume, or resumes from a checkpoint
            in another folder, into an :obj:`out_dir` that holds the files of an earlier run
            (``checkpoint.pt``, ``best.pt``, the metrics, ``result.json``): :obj:`False`
            refuses to start (a stale ``best.pt`` or ``result.json`` would be read as this
            run's: a run without a validation set writes no ``best.pt``); :obj:`True` removes
            those files first. A run resumed in its checkpoint's own folder goes on there.
            (default: :obj:`False`)
        progress (bool, optional): Show a :mod:`tqdm` progress bar (rank 0 only).
            (default: :obj:`True`)
        find_unused_parameters (bool, optional): Passed to
            :class:`~torch.nn.parallel.DistributedDataParallel`, for models with parameters that
            do not contribute to the loss. (default: :obj:`False`)
    """
    epochs: int = 100
    batch_size: int = 128
    eval_batch_size: Optional[int] = None
    lr: float = 1e-4
    weight_decay: float = 1e-5
    warmup_epochs: int = 5
    schedule: str = 'step'
    grad_clip: Optional[float] = 1.0
    patience: Optional[int] = 20
    min_delta: float = 0.0
    restore_best: bool = True
    seed: int = 0
    deterministic: bool = False
    device: str = 'auto'
    num_workers: int = 0
    normalize_targets: bool = True
    out_dir: Optional[str] = None
    checkpoint_every: int = 1
    resume: Optional[str] = None
    overwrite: bool = False
    progress: bool = True
    find_unused_parameters: bool = False

    def __post_init__(self) -> None:
        def expect(ok: bool, what: str, value: Any) -> None:
            if not ok:
                raise ValueError(f'TrainConfig: expected {what} (got {value!r})')

        def integer(value: Any) -> bool:
            return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))

        def real(value: Any) -> bool:
            return (isinstance(value, (int, float, np.integer, np.floating))
                    and not isinstance(value, (bool, np.bool_)) and math.isfinite(value))

        # types first: a string or float where a count belongs ('2', 1.5) fails here, not as a
        # TypeError in a comparison or deep inside the trainer
        for name in ('epochs', 'batch_size', 'warmup_epochs', 'seed', 'num_workers',
                     'checkpoint_every'):
            expect(integer(getattr(self, name)), f'an integer {name}', getattr(self, name))
        for name in ('eval_batch_size', 'patience'):
            value = getattr(self, name)
            expect(value is None or integer(value), f'an integer {name} or None', value)
        for name in ('lr', 'weight_decay', 'min_delta'):
            expect(real(getattr(self, name)), f'a finite number {name}', getattr(self, name))
        for name in ('restore_best', 'deterministic', 'normalize_targets', 'progress',
                     'find_unused_parameters', 'overwrite'):  # (the text 'false' was true)
            value = getattr(self, name)
            expect(isinstance(value, (bool, np.bool_)), f'True or False for {name}', value)
            setattr(self, name, bool(value))
        expect(self.grad_clip is None or real(self.grad_clip), 'a finite number grad_clip or None',
               self.grad_clip)
        # NumPy numbers become Python's: kept, they reached the logs (not JSON), the
        # checkpoints (which a weights-only load then refused), random.seed and the DataLoader
        for name in ('epochs', 'batch_size', 'warmup_epochs', 'seed', 'num_workers',
                     'checkpoint_every', 'eval_batch_size', 'patience'):
            if getattr(self, name) is not None:
                setattr(self, name, int(getattr(self, name)))
        for name in ('lr', 'weight_decay', 'min_delta', 'grad_clip'):
            if isinstance(getattr(self, name), (np.integer, np.floating)):
                setattr(self, name, getattr(self, name).item())
        # PyTorch's CPU generator (a Mersenne twister) and NumPy's legacy seed keep 32 bits of
        # a seed: outside [0, 2**32) two seeds would share streams (s and s + 2**32; and
        # Python's random.seed(-s) is random.seed(s)); the trainer adds the rank (and the
        # sampler the epoch) to it, and refuses seed + max(world_size, epochs) > 2**32
        expect(0 <= self.seed < 2 ** 32, '0 <= seed < 2**32', self.seed)
        expect(self.epochs > 0, 'epochs > 0', self.epochs)
        expect(self.batch_size > 0, 'batch_size > 0', self.batch_size)
        expect(self.eval_batch_size is None or self.eval_batch_size > 0,
               'eval_batch_size > 0 or None', self.eval_batch_size)
        expect(self.lr >= 0, 'lr >= 0', self.lr)
        expect(self.weight_decay >= 0, 'weight_decay >= 0', self.weight_decay)
        expect(0 <= self.warmup_epochs <= self.epochs, '0 <= warmup_epochs <= epochs',
               self.warmup_epochs)
        expect(self.schedule in SCHEDULES, f'schedule in {SCHEDULES}', self.schedule)
        expect(self.grad_clip is None or self.grad_clip > 0, 'grad_clip > 0 or None',
               self.grad_clip)
        expect(self.patience is None or self.patience > 0, 'patience > 0 or None',
               self.patience)
        expect(self.min_delta >= 0, 'min_delta >= 0', self.min_delta)
        expect(self.num_workers >= 0, 'num_workers >= 0', self.num_workers)
        expect(self.checkpoint_every >= 0, 'checkpoint_every >= 0', self.checkpoint_every)
        if self.out_dir is not None:
            self.out_dir = os.fspath(self.out_dir)
        if self.resume is not None:
            self.resume = os.fspath(self.resume)
        # ('' names no file or folder: an out_dir '' failed after the normaliser's fit, at
        # os.makedirs(''), with a FileNotFoundError that named no option)
        for name in ('out_dir', 'resume'):
            expect(getattr(self, name) != '', f'a path {name} or None', getattr(self, name))
        if isinstance(self.device, torch.device):
            self.device = str(self.device)

    def to_dict(self) -> Dict[str, Any]:
        r"""The configuration as a dict of plain Python values (stored in checkpoints)."""
        return dataclasses.asdict(self)


@dataclass
class TrainResult:
    r"""What :meth:`Trainer.fit` returns.

    Attributes:
        history: One flat dict per epoch (``epoch``, ``lr`` of the epoch's first step,
            ``train_loss``, ``val_loss``, ``val_<metric>``, ``epoch_time``), as written to
            ``metrics.jsonl`` and ``metrics.csv``.
        best_epoch: 0-based epoch early stopping kept: the last that improved on the best
            validation loss before it by more than ``min_delta`` (with ``min_delta=0``, the
            first epoch of the lowest validation loss; with ``min_delta > 0`` a later epoch may
            have a lower one); the last epoch without a validation set.
        best_val_loss: That epoch's validation loss, the training criterion on standardised
            targets where they are normalised (``nan`` without a validation set; ``null`` in
            ``result.json``, which writes every NaN or infinite figure so: standard JSON).
        epochs_run: Number of epochs completed (including those before a resume).
        stopped_early: Whether early stopping ended the run (also where the patience ran out
            on the last epoch, which ``epochs`` ended anyway: ``epochs_run == epochs``).
        val_metrics: Validation metrics of the best epoch (not of the model
            :meth:`Trainer.fit` leaves where ``restore_best=False``: see ``model_epoch``).
        test_metrics: Metrics on the test set, if one was given, of the model :meth:`Trainer.fit`
            leaves: the best epoch's weights with ``restore_best``, else the last epoch's.
        wall_time: Seconds spent in :meth:`Trainer.fit` (summed over resumed runs).
        normalizer: The target normaliser fitted on the training split (regression with
            ``normalize_targets=True``; else :obj:`None`). The trained model carries it already
            (see :func:`attach_normalizer`) and predicts in target units.
        model_epoch: 0-based epoch whose weights the model :meth:`Trainer.fit` leaves holds,
            the epoch ``test_metrics`` describe: ``best_epoch`` with ``restore_best`` (or
            without a validation set), else the last epoch run.
    """
    history: List[Dict[str, float]] = field(default_factory=list)
    best_epoch: int = -1
    best_val_loss: float = math.nan
    epochs_run: int = 0
    stopped_early: bool = False
    val_metrics: Dict[str, float] = field(default_factory=dict)
    test_metrics: Optional[Dict[str, float]] = None
    wall_time: float = 0.0
    normalizer: Optional[TargetNormalizer] = None
    model_epoch: int = -1

    def to_dict(self) -> Dict[str, Any]:
        r"""Every field but ``normalizer`` (which the checkpoints hold), as plain values."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.name != 'normalizer'}
