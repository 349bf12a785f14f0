r"""Training loop for set models on PyTorch Geometric data.

The recipe follows the MZAttn paper: AdamW (learning rate :math:`10^{-4}`, weight decay
:math:`10^{-5}`), a linear warm-up from 0 to the learning rate over the first 5 epochs followed by a
cosine decay to 0 over the remaining epochs, gradient clipping to an :math:`\ell_2` norm of 1.0,
batch size 128, and early stopping on the validation loss with a patience of 20 epochs (the best
weights are restored at the end).

Around that recipe the :class:`Trainer` provides target normalisation (statistics of the training
split only; the trained model carries them and predicts in target units), metrics in the original
units of the targets, seeding, device choice, an optional
:mod:`tqdm` progress bar, a per-epoch metrics log (JSON lines and CSV), atomic checkpoints that load
with ``torch.load(path, weights_only=True)``, exact resumption, and distributed data-parallel
training when launched with ``torchrun`` (gloo on CPU, NCCL on GPU).

Model contract: a model is an :class:`torch.nn.Module` called as ``model(batch)`` on a PyG
:class:`~torch_geometric.data.Batch` and returns either a tensor of shape ``(B, out_dim)`` or a
tuple whose first element is that tensor (e.g. ``(pred, uncertainty)``). For
``task_type='regression'`` each graph's ``y`` holds ``t`` float targets (``batch.y`` of shape
``(B, t)``); for ``task_type='classification'`` it holds one class index (``batch.y`` of shape
``(B,)`` or ``(B, 1)``) and ``out_dim`` is the number of classes.
"""
import copy
import csv
import dataclasses
import gc
import io
import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import Sampler
from torch.utils.data.distributed import DistributedSampler
from torch_geometric.loader import DataLoader
from tqdm.auto import tqdm

from torch_mz._files import atomic_write

__all__ = [
    'CheckpointError',
    'TrainConfig',
    'TrainResult',
    'Trainer',
    'TargetNormalizer',
    'TargetUnits',
    'attach_normalizer',
    'detach_normalizer',
    'carried_normalizer',
    'DistInfo',
    'train',
    'predict',
    'seed_everything',
    'resolve_device',
    'cosine_with_warmup',
    'save_checkpoint',
    'load_checkpoint',
    'mse',
    'mae',
    'r2_score',
    'accuracy',
]

log = logging.getLogger(__name__)

TASK_TYPES = ('regression', 'classification')
SCHEDULES = ('step', 'epoch')
CHECKPOINT_FORMAT = 'torch_mz.train'
CHECKPOINT_VERSION = 1
LAST_CHECKPOINT = 'checkpoint.pt'  # full training state, written every `checkpoint_every` epochs
BEST_CHECKPOINT = 'best.pt'  # model weights (+ normaliser) of the best validation epoch
METRICS_JSONL = 'metrics.jsonl'
METRICS_CSV = 'metrics.csv'
RESULT_JSON = 'result.json'
#: Every file a :class:`Trainer` writes into ``out_dir``.
RUN_FILES = (LAST_CHECKPOINT, BEST_CHECKPOINT, METRICS_JSONL, METRICS_CSV, RESULT_JSON)

ModelOutput = Union[Tensor, Tuple[Tensor, ...]]
LossFn = Callable[[ModelOutput, Tensor], Tensor]


class CheckpointError(ValueError):
    r"""Raised when a checkpoint is missing, unreadable (corrupt or truncated), not a ``torch_mz``
    training checkpoint, or does not fit the model it is loaded into."""


# --------------------------------------------------------------------------------------------------
# Seeds, devices, distributed set-up
# --------------------------------------------------------------------------------------------------
def seed_everything(seed: int, deterministic: bool = False) -> None:
    r"""Seeds Python's :mod:`random`, NumPy and PyTorch (CPU and all CUDA devices).

    Args:
        seed (int): The seed.
        deterministic (bool, optional): If :obj:`True`, also asks PyTorch for deterministic
            algorithms (``torch.use_deterministic_algorithms(True, warn_only=True)``) and
            disables the cuDNN auto-tuner. (default: :obj:`False`)
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def resolve_device(device: Union[str, torch.device] = 'auto') -> torch.device:
    r"""Turns ``'auto'`` into ``cuda`` when a GPU is available (else ``cpu``); any other value is
    passed to :class:`torch.device`, with a :class:`ValueError` for a name it does not know or a
    CUDA device on a machine without one."""
    if isinstance(device, torch.device):
        dev = device
    elif device == 'auto':
        dev = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    else:
        try:
            dev = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"Expected device 'auto', 'cpu', 'cuda' or 'cuda:<index>' "
                             f"(got {device!r})") from e
    if dev.type == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f"Device {str(dev)!r} was requested but CUDA is not available")
    return dev


@dataclass(frozen=True)
class DistInfo:
    r"""Where this process stands in a (possibly) distributed run: read from the ``RANK``,
    ``WORLD_SIZE`` and ``LOCAL_RANK`` environment variables that ``torchrun`` sets, or from an
    already initialised process group."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> 'DistInfo':
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(),
                       int(os.environ.get('LOCAL_RANK', dist.get_rank())))
        return cls(int(os.environ.get('RANK', 0)), int(os.environ.get('WORLD_SIZE', 1)),
                   int(os.environ.get('LOCAL_RANK', 0)))


def _setup_distributed(device: Union[str, torch.device]) -> Tuple[DistInfo, torch.device]:
    r"""Resolves the device and, under ``torchrun`` with more than one process, initialises the
    default process group (NCCL for CUDA, gloo otherwise) unless it already is."""
    info = DistInfo.from_env()
    dev = resolve_device(device)
    if not info.is_distributed:
        return info, dev
    if dev.type == 'cuda':
        dev = torch.device('cuda', info.local_rank)  # one GPU per process
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        backend = 'nccl' if dev.type == 'cuda' else 'gloo'
        dist.init_process_group(backend=backend, init_method='env://', rank=info.rank,
                                world_size=info.world_size)
        log.info('Initialised process group (%s): rank %d of %d', backend, info.rank,
                 info.world_size)
    return info, dev


# --------------------------------------------------------------------------------------------------
# Learning-rate schedule
# --------------------------------------------------------------------------------------------------
def cosine_with_warmup(optimizer: torch.optim.Optimizer, warmup_steps: int,
                       total_steps: int) -> LambdaLR:
    r"""Linear warm-up followed by a cosine decay to zero, as a :class:`~torch.optim.lr_scheduler.
    LambdaLR`. With :math:`w` warm-up steps and :math:`T` steps in total the factor applied to
    each base learning rate at step :math:`s` (one call of ``scheduler.step()`` per step) is

    .. math::
        \lambda(s) = \begin{cases} s / w & s < w \\
        \tfrac{1}{2}\left(1 + \cos\left(\pi\,\frac{s - w}{T - w}\right)\right) & w \le s \le T \\
        0 & s > T \end{cases}

    so the learning rate is 0 at the start (when :math:`w > 0`), peaks after the warm-up and is 0 at
    step :math:`T`.

    Args:
        optimizer (torch.optim.Optimizer): The optimiser whose learning rates are scheduled.
        warmup_steps (int): Number of linear warm-up steps :math:`w`.
        total_steps (int): Total number of steps :math:`T` (:math:`\ge w`, :math:`> 0`).
    """
    if total_steps <= 0 or warmup_steps < 0 or warmup_steps > total_steps:
        raise ValueError(f'Expected 0 <= warmup_steps <= total_steps and total_steps > 0 '
                         f'(got warmup_steps={warmup_steps}, total_steps={total_steps})')

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps
        if step >= total_steps:
            return 0.0
        progress = (step - warmup_steps) / (total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)


# --------------------------------------------------------------------------------------------------
# Target normalisation
# --------------------------------------------------------------------------------------------------
class TargetNormalizer:
    r"""Per-target standardisation :math:`\tilde y = (y - \mu) / \sigma` with :math:`\mu, \sigma`
    fitted on the training targets only. Targets with :math:`\sigma < \epsilon` keep
    :math:`\sigma = 1`.

    Args:
        eps (float, optional): Smallest standard deviation treated as non-constant.
            (default: :obj:`1e-8`)

    Shapes:
        - **fit input:** :math:`(N, t)` or :math:`(N,)`
        - **transform / inverse_transform:** any shape whose last dimension is :math:`t` (or
          :math:`(N,)` when :math:`t = 1`), returned unchanged in shape.
    """
    def __init__(self, eps: float = 1e-8):
        self.eps = eps
        self.mean: Optional[Tensor] = None  # (t,) float64
        self.std: Optional[Tensor] = None  # (t,) float64

    @property
    def fitted(self) -> bool:
        return self.mean is not None

    def fit(self, y: Tensor) -> 'TargetNormalizer':
        if not torch.is_tensor(y) or y.numel() == 0:
            raise ValueError('Expected a non-empty tensor of targets to fit the normaliser')
        y = y.detach().to(torch.float64)
        y = y.view(-1, 1) if y.dim() == 1 else y.reshape(y.size(0), -1)  # (N, t)
        self.mean = y.mean(dim=0).cpu()
        std = y.std(dim=0, unbiased=False).cpu()
        self.std = torch.where(std < self.eps, torch.ones_like(std), std)
        return self

    def _stats(self, y: Tensor) -> Tuple[Tensor, Tensor]:
        if not self.fitted:
            raise RuntimeError('TargetNormalizer is not fitted; call fit() or load_state_dict()')
        assert self.mean is not None and self.std is not None
        return _stats_like(y, self.mean, self.std)

    def transform(self, y: Tensor) -> Tensor:
        mean, std = self._stats(y)
        return (y - mean) / std

    def inverse_transform(self, y: Tensor) -> Tensor:
        mean, std = self._stats(y)
        return y * std + mean

    def inverse_scale(self, s: Tensor) -> Tensor:
        r"""Maps a scale (e.g. a predicted standard deviation) from normalised to original units:
        multiplies by :math:`\sigma` without adding :math:`\mu`."""
        return s * self._stats(s)[1]

    def state_dict(self) -> Dict[str, Any]:
        return {'mean': self.mean, 'std': self.std, 'eps': self.eps}

    def load_state_dict(self, state: Dict[str, Any]) -> 'TargetNormalizer':
        self.mean, self.std = state['mean'], state['std']
        self.eps = float(state.get('eps', self.eps))
        return self

    def __repr__(self) -> str:
        if not self.fitted:
            return f'{self.__class__.__name__}(unfitted)'
        return (f'{self.__class__.__name__}(mean={self.mean.tolist()}, '
                f'std={self.std.tolist()})')


def _stats_like(y: Tensor, mean: Tensor, std: Tensor) -> Tuple[Tensor, Tensor]:
    r"""``mean`` and ``std`` (each :math:`(t,)`) on ``y``'s device and in its dtype, shaped to
    broadcast against ``y`` (:math:`(..., t)`, or :math:`(N,)` when :math:`t = 1`)."""
    mean = mean.to(device=y.device, dtype=y.dtype)
    std = std.to(device=y.device, dtype=y.dtype)
    if y.dim() == 1 and mean.numel() == 1:
        return mean.view(()), std.view(())
    if y.size(-1) != mean.numel():
        raise ValueError(f'Expected targets with {mean.numel()} column(s) '
                         f'(got shape {tuple(y.shape)})')
    return mean, std


class TargetUnits(torch.nn.Module):
    r"""Maps the first output of a model trained on standardised targets back to target units,

    .. math::
        y = \tilde y \, \sigma + \mu,

    the :meth:`TargetNormalizer.inverse_transform` of the normaliser it is made from. It is not
    called directly: :func:`attach_normalizer` makes it a sub-module ``target_units`` of a model
    and runs it on the model's output with a forward hook, so that the statistics travel with the
    model (``.to()``, ``copy.deepcopy``, ``torch.save(model)``) as buffers. The buffers are not
    persistent: the model's ``state_dict()`` keeps the keys of the bare model, and checkpoints
    store the normaliser beside the weights.

    Args:
        normalizer (TargetNormalizer): A fitted normaliser.

    Shapes:
        - **input:** the model's output: a prediction :math:`(B, t)` (or :math:`(B,)` when
          :math:`t = 1`), or a tuple or list whose first element is one (the others, e.g. an
          uncertainty, pass unchanged).
        - **output:** the same structure, the prediction in target units.
    """
    def __init__(self, normalizer: 'TargetNormalizer'):
        super().__init__()
        if not normalizer.fitted:
            raise ValueError('Expected a fitted TargetNormalizer')
        self.eps = normalizer.eps
        self.register_buffer('mean', normalizer.mean.detach().clone(), persistent=False)  # (t,)
        self.register_buffer('std', normalizer.std.detach().clone(), persistent=False)  # (t,)
        self.enabled = True  # off while a Trainer needs the standardised output

    def normalizer(self) -> 'TargetNormalizer':
        r"""The statistics as a :class:`TargetNormalizer` (on the CPU, ``float64``)."""
        return TargetNormalizer(self.eps).load_state_dict(
            {'mean': self.mean.detach().cpu().double(), 'std': self.std.detach().cpu().double()})

    def forward(self, out: ModelOutput) -> ModelOutput:
        if isinstance(out, (tuple, list)):
            return type(out)([self.forward(out[0]), *out[1:]])
        mean, std = _stats_like(out, self.mean, self.std)
        return out * std + mean

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(mean={self.mean.tolist()}, std={self.std.tolist()})'


TARGET_UNITS = 'target_units'  # name of the TargetUnits sub-module of a model


def _target_units_hook(module: torch.nn.Module, args: Any, out: ModelOutput) -> ModelOutput:
    units = getattr(module, TARGET_UNITS, None)
    return units(out) if isinstance(units, TargetUnits) and units.enabled else out


def attach_normalizer(model: torch.nn.Module, normalizer: TargetNormalizer) -> torch.nn.Module:
    r"""Makes ``model`` predict in target units: adds :class:`TargetUnits` of ``normalizer`` as
    the sub-module ``model.target_units`` and a forward hook that applies it to every output (in
    training and in eval mode). A normaliser attached before is replaced. :class:`Trainer` does
    this at the end of :meth:`Trainer.fit` for regression with ``normalize_targets=True``;
    :func:`detach_normalizer` undoes it. Returns ``model``."""
    detach_normalizer(model)
    model.add_module(TARGET_UNITS, TargetUnits(normalizer))
    ref = next(model.parameters(), None)
    if ref is not None:
        getattr(model, TARGET_UNITS).to(ref.device)
    model.register_forward_hook(_target_units_hook)
    return model


def detach_normalizer(model: torch.nn.Module) -> Optional[TargetNormalizer]:
    r"""Removes what :func:`attach_normalizer` added, so that ``model`` returns standardised
    values again; returns the normaliser it carried (:obj:`None` if none)."""
    # as torch.nn.utils.remove_weight_norm finds its hook: by what it is
    for key in [k for k, hook in model._forward_hooks.items() if hook is _target_units_hook]:
        del model._forward_hooks[key]
    units = model._modules.pop(TARGET_UNITS, None)
    return units.normalizer() if isinstance(units, TargetUnits) else None


def carried_normalizer(model: torch.nn.Module) -> Optional[TargetNormalizer]:
    r"""The normaliser :func:`attach_normalizer` gave ``model`` (:obj:`None` if none), i.e.
    whether ``model`` already predicts in target units."""
    units = getattr(model, TARGET_UNITS, None)
    return units.normalizer() if isinstance(units, TargetUnits) else None


class _standardised:
    r"""Context in which a model that carries a normaliser returns standardised values."""
    def __init__(self, model: torch.nn.Module):
        self.units = getattr(model, TARGET_UNITS, None)
        self.was = getattr(self.units, 'enabled', None)

    def __enter__(self) -> None:
        if isinstance(self.units, TargetUnits):
            self.units.enabled = False

    def __exit__(self, *exc: Any) -> None:
        if isinstance(self.units, TargetUnits):
            self.units.enabled = self.was


def _pending_normalizer(model: torch.nn.Module, normalizer: Optional[TargetNormalizer]
                        ) -> Tuple[Optional[TargetNormalizer], Optional[TargetNormalizer]]:
    r"""For prediction: ``(the normaliser still to apply to the model's outputs, the one in force
    for scaling uncertainties)``. A model that carries its normaliser already predicts in target
    units; a ``normalizer`` passed with it must have the same statistics (it is not applied
    twice)."""
    carried = carried_normalizer(model)
    if carried is None:
        return normalizer, normalizer
    same = (normalizer is None or normalizer.fitted and all(  # to float32 rounding (model.float())
        a.shape == b.shape and torch.allclose(a.cpu().double(), b, rtol=1e-6, atol=0.0)
        for a, b in ((normalizer.mean, carried.mean), (normalizer.std, carried.std))))
    if not same:
        raise ValueError(f'The model carries its own target normaliser ({carried}) and already '
                         f'predicts in target units; the normalizer passed ({normalizer}) '
                         f'differs from it. Pass normalizer=None')
    return None, carried


# --------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------
def mse(pred: Tensor, target: Tensor) -> Tensor:
    r"""Mean squared error over all elements."""
    return (pred.to(torch.float64) - target.to(torch.float64)).pow(2).mean()


def mae(pred: Tensor, target: Tensor) -> Tensor:
    r"""Mean absolute error over all elements."""
    return (pred.to(torch.float64) - target.to(torch.float64)).abs().mean()


def r2_score(pred: Tensor, target: Tensor) -> Tensor:
    r"""Coefficient of determination :math:`R^2 = 1 - \sum (y - \hat y)^2 / \sum (y - \bar y)^2`,
    computed per target column of a :math:`(N, t)` input (a 1-D input is one column) and averaged
    uniformly over columns (scikit-learn's ``multioutput='uniform_average'``). A constant target
    column scores 1 if predicted exactly and 0 otherwise."""
    p = pred.to(torch.float64).reshape(target.size(0), -1)  # (N, t)
    y = target.to(torch.float64).reshape(target.size(0), -1)  # (N, t)
    ss_res = (y - p).pow(2).sum(dim=0)
    ss_tot = (y - y.mean(dim=0)).pow(2).sum(dim=0)
    return _r2_from_sums(ss_res, ss_tot)


def _r2_from_sums(ss_res: Tensor, ss_tot: Tensor) -> Tensor:
    constant = ss_tot <= 0
    r2 = 1.0 - ss_res / torch.where(constant, torch.ones_like(ss_tot), ss_tot)
    r2 = torch.where(constant, (ss_res <= 0).to(r2.dtype), r2)
    return r2.mean()


def accuracy(pred: Tensor, target: Tensor) -> Tensor:
    r"""Fraction of correct class predictions; ``pred`` holds logits/probabilities of shape
    :math:`(N, C)` or class indices of shape :math:`(N,)`."""
    labels = pred.argmax(dim=-1) if pred.dim() > 1 else pred
    return (labels.view(-1) == target.view(-1)).to(torch.float64).mean()


# --------------------------------------------------------------------------------------------------
# Configuration and result
# --------------------------------------------------------------------------------------------------
@dataclass
class TrainConfig:
    r"""Hyper-parameters and run settings of :class:`Trainer`; defaults follow the paper.

    Args:
        epochs (int, optional): Maximum number of epochs. (default: :obj:`100`)
        batch_size (int, optional): Sets per batch (per process under DDP). (default: :obj:`128`)
        eval_batch_size (int, optional): Batch size for evaluation and prediction; :obj:`None` uses
            ``batch_size``. (default: :obj:`None`)
        lr (float, optional): Peak learning rate of AdamW. (default: :obj:`1e-4`)
        weight_decay (float, optional): AdamW weight decay. (default: :obj:`1e-5`)
        warmup_epochs (int, optional): Epochs of linear warm-up from 0 to ``lr`` before the cosine
            decay to 0 at the end of ``epochs``. (default: :obj:`5`)
        schedule (str, optional): Advance the schedule every optimiser ``'step'`` or every
            ``'epoch'`` (the first epoch then runs at learning rate 0 when ``warmup_epochs > 0``).
            (default: :obj:`'step'`)
        grad_clip (float, optional): Maximum :math:`\ell_2` norm of all gradients; :obj:`None`
            disables clipping. (default: :obj:`1.0`)
        patience (int, optional): Stop after this many epochs without a validation-loss
            improvement; :obj:`None` disables early stopping. (default: :obj:`20`)
        min_delta (float, optional): Smallest decrease of the validation loss that counts as an
            improvement. (default: :obj:`0.0`)
        restore_best (bool, optional): Load the weights of the best validation epoch at the end.
            (default: :obj:`True`)
        seed (int, optional): Seed for Python, NumPy and PyTorch (``seed + rank`` under DDP) and
            for the shuffling of the training set. (default: :obj:`0`)
        deterministic (bool, optional): Ask PyTorch for deterministic algorithms.
            (default: :obj:`False`)
        device (str, optional): ``'auto'`` (CUDA if available, else CPU), ``'cpu'``, ``'cuda'``
            or ``'cuda:<i>'``. Under DDP a CUDA process uses ``cuda:<LOCAL_RANK>``.
            (default: :obj:`'auto'`)
        num_workers (int, optional): DataLoader worker processes. (default: :obj:`0`)
        normalize_targets (bool, optional): Standardise regression targets with statistics of the
            training split. (default: :obj:`True`)
        out_dir (str, optional): Directory for ``metrics.jsonl``, ``metrics.csv``,
            ``checkpoint.pt``, ``best.pt`` and ``result.json``; :obj:`None` writes nothing.
            (default: :obj:`None`)
        checkpoint_every (int, optional): Write ``checkpoint.pt`` every this many epochs (and after
            the last one); 0 writes it only after the last epoch. (default: :obj:`1`)
        resume (str, optional): Path of a ``checkpoint.pt`` to continue from at its next epoch.
            (default: :obj:`None`)
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
    progress: bool = True
    find_unused_parameters: bool = False

    def __post_init__(self) -> None:
        def expect(ok: bool, what: str, value: Any) -> None:
            if not ok:
                raise ValueError(f'TrainConfig: expected {what} (got {value!r})')

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
        best_epoch: 0-based epoch of the lowest validation loss (the last epoch without a
            validation set).
        best_val_loss: That validation loss (``nan`` without a validation set).
        epochs_run: Number of epochs completed (including those before a resume).
        stopped_early: Whether early stopping ended the run.
        val_metrics: Validation metrics of the best epoch.
        test_metrics: Metrics of the final (restored) model on the test set, if one was given.
        wall_time: Seconds spent in :meth:`Trainer.fit` (summed over resumed runs).
        normalizer: The target normaliser fitted on the training split (regression with
            ``normalize_targets=True``; else :obj:`None`). The trained model carries it already
            (see :func:`attach_normalizer`) and predicts in target units.
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

    def to_dict(self) -> Dict[str, Any]:
        r"""Every field but ``normalizer`` (which the checkpoints hold), as plain values."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.name != 'normalizer'}


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------
def save_checkpoint(state: Dict[str, Any], path: Union[str, os.PathLike]) -> None:
    r"""Writes ``state`` with :func:`torch.save` atomically: into a temporary file in the same
    directory, flushed to disk, then moved over ``path`` with :func:`os.replace`. If anything fails
    the temporary file is removed and an existing file at ``path`` is left untouched."""
    atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Union[str, os.PathLike],
                    map_location: Union[str, torch.device] = 'cpu') -> Dict[str, Any]:
    r"""Loads a checkpoint written by :class:`Trainer` with ``torch.load(..., weights_only=True)``.

    Raises:
        CheckpointError: If the file does not exist, cannot be read (corrupt or truncated), holds
            objects other than tensors and plain containers, or is not a ``torch_mz`` checkpoint.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f'Checkpoint {path!r} does not exist')
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch.load raises many types for bad files; report them all alike
        raise CheckpointError(f'Checkpoint {path!r} could not be read; it is corrupt, truncated or '
                              f'not a weights-only torch file ({type(e).__name__}: {e})') from e
    if not isinstance(state, dict) or state.get('format') != CHECKPOINT_FORMAT:
        raise CheckpointError(f'{path!r} is not a torch_mz training checkpoint (expected a dict '
                              f"with format={CHECKPOINT_FORMAT!r})")
    missing = [k for k in ('version', 'kind', 'model', 'task_type') if k not in state]
    if missing:
        raise CheckpointError(f'Checkpoint {path!r} is incomplete: missing {missing}')
    if state['version'] > CHECKPOINT_VERSION:
        raise CheckpointError(f'Checkpoint {path!r} has version {state["version"]}; this torch_mz '
                              f'reads versions up to {CHECKPOINT_VERSION}')
    return state


def _rng_state() -> Dict[str, Any]:
    version, mt, gauss = random.getstate()
    np_state = np.random.get_state()
    return {
        'python': {'version': version, 'state': torch.tensor(mt, dtype=torch.int64),
                   'gauss': gauss},
        'numpy': {'kind': np_state[0], 'state': torch.from_numpy(np_state[1].astype(np.int64)),
                  'pos': int(np_state[2]), 'has_gauss': int(np_state[3]),
                  'cached_gaussian': float(np_state[4])},
        'torch': torch.get_rng_state(),
        'cuda': torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _set_rng_state(state: Dict[str, Any]) -> None:
    py = state['python']
    random.setstate((py['version'], tuple(py['state'].tolist()), py['gauss']))
    n = state['numpy']
    np.random.set_state((n['kind'], n['state'].numpy().astype(np.uint32), n['pos'],
                         n['has_gauss'], n['cached_gaussian']))
    torch.set_rng_state(state['torch'].cpu())
    cuda = state['cuda']
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


def _json_values(value: Optional[Dict[str, Any]], name: str) -> Optional[Dict[str, Any]]:
    r"""``value`` as plain JSON values (tuples become lists), so that what a checkpoint stores
    loads with ``weights_only=True`` and compares equal to what the next run passes."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f'Expected {name} to be a dict or None (got {type(value).__name__})')
    try:
        return json.loads(json.dumps(value, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(f'Expected {name} to hold JSON values only ({e})') from None


def _describe_run(info: Dict[str, Any]) -> str:
    parts = []
    for key, value in sorted(info.items(), key=lambda kv: (kv[0] != 'task', kv[0] != 'model')):
        if isinstance(value, dict) and 'name' in value:
            args = ', '.join(f'{k}={v!r}' for k, v in sorted(value.get('args', {}).items()))
            parts.append(f"{key} {value['name']!r}" + (f' ({args})' if args else ''))
        else:
            parts.append(f'{key} {value!r}')
    return ', '.join(parts)


def _same_run(saved: Dict[str, Any], current: Dict[str, Any]) -> bool:
    r"""Whether two ``run_info`` dicts agree on every entry both record (two levels deep, so that
    a checkpoint written before an entry was recorded still compares)."""
    for key in saved.keys() & current.keys():
        a, b = saved[key], current[key]
        if isinstance(a, dict) and isinstance(b, dict):
            if any(a[k] != b[k] for k in a.keys() & b.keys()):
                return False
        elif a != b:
            return False
    return True


def _with_build_info(run_info: Optional[Dict[str, Any]],
                     model: torch.nn.Module) -> Optional[Dict[str, Any]]:
    r"""``run_info`` with ``run_info['model']`` completed from the ``build_info`` that
    :func:`~torch_mz.models.build_model` leaves on its models (what is given wins)."""
    built = getattr(model, 'build_info', None)
    try:
        json.dumps(built, allow_nan=False)
    except (TypeError, ValueError):  # options JSON cannot hold: the model cannot be rebuilt
        return run_info
    if not isinstance(built, dict):
        return run_info
    if run_info is not None and not isinstance(run_info, dict):
        return run_info  # _json_values names the error
    info = dict(run_info or {})
    given = info.get('model')
    info['model'] = dict(built, **given) if isinstance(given, dict) else dict(built)
    return info


def _torch_mz_version() -> str:
    from torch_mz import __version__  # here: torch_mz/__init__ imports this module's users
    return __version__


def _cpu_state_dict(module: torch.nn.Module) -> Dict[str, Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


# --------------------------------------------------------------------------------------------------
# Data helpers
# --------------------------------------------------------------------------------------------------
class _ShardSampler(Sampler):
    r"""Sequential indices ``rank, rank + world_size, ...``: every element exactly once over all
    ranks (unlike :class:`DistributedSampler`, which pads), so that all-reduced sums are exact."""
    def __init__(self, size: int, rank: int, world_size: int):
        self.indices = list(range(rank, size, world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def _worker_init_fn(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32  # differs per worker and per epoch
    random.seed(seed)
    np.random.seed(seed)


def _first(out: ModelOutput) -> Tensor:
    if isinstance(out, (tuple, list)):
        if len(out) == 0:
            raise ValueError('Model returned an empty tuple; expected (pred, ...)')
        out = out[0]
    if not torch.is_tensor(out):
        raise ValueError(f'Expected the model to return a tensor (B, out_dim) or a tuple whose '
                         f'first element is one (got {type(out).__name__})')
    return out


def _raw_targets(batch: Any, task_type: str) -> Tensor:
    r"""``batch.y`` as ``(B, t)`` float (regression) or ``(B,)`` long (classification)."""
    y = getattr(batch, 'y', None)
    if y is None:
        raise ValueError('Expected every graph to carry a target `y`')
    num_graphs = batch.num_graphs
    if task_type == 'regression':
        if y.numel() % max(num_graphs, 1) != 0 or y.numel() == 0:
            raise ValueError(f'Expected regression targets with t values per graph (batch.y of '
                             f'shape (B, t) with B={num_graphs}; got {tuple(y.shape)})')
        return y.reshape(num_graphs, -1).float()  # (B, t)
    if y.numel() != num_graphs or y.is_floating_point():
        raise ValueError(f'Expected one integer class index per graph (batch.y of shape (B,) or '
                         f'(B, 1) with B={num_graphs}; got {tuple(y.shape)} {y.dtype})')
    return y.reshape(num_graphs).long()  # (B,)


def _match_pred(pred: Tensor, target: Tensor, task_type: str) -> Tensor:
    if task_type == 'regression':
        if pred.dim() == 1:
            pred = pred.unsqueeze(-1)  # (B, 1)
        if pred.shape != target.shape:
            raise ValueError(f'Expected a regression prediction of shape {tuple(target.shape)} '
                             f'(B, t) (got {tuple(pred.shape)})')
    elif pred.dim() != 2 or pred.size(0) != target.size(0):
        raise ValueError(f'Expected class logits of shape (B={target.size(0)}, n_classes) '
                         f'(got {tuple(pred.shape)})')
    return pred


def _collect_targets(dataset: Sequence, task_type: str, batch_size: int,
                     num_workers: int) -> Tensor:
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    return torch.cat([_raw_targets(b, task_type) for b in loader], dim=0)


# --------------------------------------------------------------------------------------------------
# Trainer
# --------------------------------------------------------------------------------------------------
class Trainer:
    r"""Trains a set model with AdamW, warm-up + cosine schedule, gradient clipping and early
    stopping (see the module docstring for the model contract).

    Under ``torchrun`` (``WORLD_SIZE > 1``) the trainer initialises the default process group if
    needed (gloo on CPU, NCCL on CUDA, one GPU per process), wraps the model in
    :class:`~torch.nn.parallel.DistributedDataParallel`, shards the training set with a
    :class:`~torch.utils.data.distributed.DistributedSampler` and the evaluation sets without
    padding, all-reduces every metric (all ranks report the same global values), and writes logs
    and checkpoints from rank 0 only. When done, the caller calls :meth:`close` and then
    ``torch.distributed.destroy_process_group()``.

    Args:
        model (torch.nn.Module): The model, called as ``model(batch)``.
        config (TrainConfig, optional): Settings; :obj:`None` uses the defaults.
            (default: :obj:`None`)
        task_type (str, optional): ``'regression'`` or ``'classification'``.
            (default: :obj:`'regression'`)
        loss_fn (callable, optional): ``loss_fn(output, target) -> scalar`` on the full model
            output and the (normalised) targets, mean-reduced over the batch; :obj:`None` uses the
            MSE (regression) or cross-entropy (classification) of the first output.
            (default: :obj:`None`)
        run_info (dict, optional): What is trained, as JSON values, e.g. ``{'task': {'name':
            'max', 'args': {'d': 8}}, 'model': {'name': 'mz', 'args': {}}}`` (what
            :func:`torch_mz.compare.train_one` records). Stored in every checkpoint; resuming from
            a checkpoint that records different ``run_info`` raises :class:`CheckpointError`
            (a checkpoint without it, or a trainer without it, is not compared; only the entries
            both record are). A model made by :func:`~torch_mz.models.build_model` records how
            (its ``build_info``: preset, arguments, in/out channels), which fills in
            ``run_info['model']``, so that :func:`torch_mz.load_model` can rebuild it from a
            checkpoint. (default: :obj:`None`)

    After :meth:`fit` on regression targets with ``normalize_targets=True`` the model carries
    the fitted target normaliser (:func:`attach_normalizer`) and predicts in target units;
    during training, :meth:`evaluate` and the checkpoints it works on the standardised outputs.
    """
    def __init__(self, model: torch.nn.Module, config: Optional[TrainConfig] = None,
                 task_type: str = 'regression', loss_fn: Optional[LossFn] = None,
                 run_info: Optional[Dict[str, Any]] = None):
        if task_type not in TASK_TYPES:
            raise ValueError(f'Expected task_type in {TASK_TYPES} (got {task_type!r})')
        self.config = config if config is not None else TrainConfig()
        self.task_type = task_type
        self.loss_fn = loss_fn
        self.run_info = _json_values(_with_build_info(run_info, model), 'run_info')
        self.dist, self.device = _setup_distributed(self.config.device)
        self.model = model.to(self.device)
        # a model that predicts in target units already (trained before, or load_model's)
        self.normalizer = carried_normalizer(model) or TargetNormalizer()
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.scheduler: Optional[LambdaLR] = None
        self._ddp: Optional[DistributedDataParallel] = None
        self._acc_dtype = torch.float64 if self.device.type in ('cpu', 'cuda') else torch.float32

    def __repr__(self) -> str:
        c = self.config
        return (f'{self.__class__.__name__}(task_type={self.task_type!r}, device={self.device}, '
                f'world_size={self.dist.world_size}, epochs={c.epochs}, lr={c.lr}, '
                f'batch_size={c.batch_size})')

    def close(self) -> None:
        r"""Releases the :class:`~torch.nn.parallel.DistributedDataParallel` wrapper (the model
        itself is kept). Under DDP call it before ``torch.distributed.destroy_process_group()``:
        a wrapper that outlives the process group destroys the group from its own destructor,
        which can deadlock with gloo's worker thread at exit."""
        if self._ddp is not None:
            self._ddp = None
            gc.collect()  # free the reducer now, while the process group is still registered

    # -- properties ----------------------------------------------------------------------------
    @property
    def uses_normalizer(self) -> bool:
        return self.task_type == 'regression' and self.config.normalize_targets

    @property
    def _show_progress(self) -> bool:
        return self.config.progress and self.dist.is_main

    # -- loaders -------------------------------------------------------------------------------
    def _train_loader(self, dataset: Sequence) -> Tuple[DataLoader, DistributedSampler]:
        # A DistributedSampler also in a single process: its permutation depends only on
        # (seed, epoch), which makes shuffling reproducible across resumes and world sizes.
        sampler = DistributedSampler(dataset, num_replicas=self.dist.world_size,
                                     rank=self.dist.rank, shuffle=True, seed=self.config.seed)
        loader = DataLoader(dataset, batch_size=self.config.batch_size, sampler=sampler,
                            num_workers=self.config.num_workers, worker_init_fn=_worker_init_fn,
                            pin_memory=self.device.type == 'cuda')
        return loader, sampler

    def _eval_loader(self, dataset: Sequence) -> DataLoader:
        # this rank's shard, without the padding a DistributedSampler adds: exact global sums
        sampler = _ShardSampler(len(dataset), self.dist.rank, self.dist.world_size)
        return DataLoader(dataset, batch_size=self.config.eval_batch_size or self.config.batch_size,
                          sampler=sampler,
                          num_workers=self.config.num_workers, worker_init_fn=_worker_init_fn,
                          pin_memory=self.device.type == 'cuda')

    # -- pieces of a step ----------------------------------------------------------------------
    def _targets(self, batch: Any) -> Tuple[Tensor, Tensor]:
        r"""Returns (raw targets, targets in the units of the loss)."""
        y = _raw_targets(batch, self.task_type)
        return y, (self.normalizer.transform(y) if self.uses_normalizer else y)

    def _loss(self, out: ModelOutput, target: Tensor) -> Tensor:
        if self.loss_fn is not None:
            return self.loss_fn(out, target)
        pred = _match_pred(_first(out), target, self.task_type)
        if self.task_type == 'regression':
            return F.mse_loss(pred, target.to(pred.dtype))
        return F.cross_entropy(pred, target)

    def _all_reduce(self, t: Tensor) -> Tensor:
        if self.dist.is_distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def _to_original(self, pred: Tensor) -> Tensor:
        return self.normalizer.inverse_transform(pred) if self.uses_normalizer else pred

    # -- evaluation ----------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, dataset: Sequence) -> Dict[str, float]:
        r"""Metrics of the current model on ``dataset``: ``loss`` (the training criterion, on
        normalised targets), and ``mse``, ``mae``, ``r2`` in original units (regression) or
        ``accuracy`` and ``cross_entropy`` (classification). Under DDP every rank evaluates a
        disjoint shard and the sums are all-reduced, so all ranks return the same global values;
        all ranks must call it."""
        if len(dataset) == 0:
            raise ValueError('Expected a non-empty dataset to evaluate')
        if self.uses_normalizer and not self.normalizer.fitted:
            raise RuntimeError('Targets are normalised but the normaliser is not fitted; call '
                               'fit() or load_weights() first')
        module = self.model  # not the DDP wrapper: shards may hold different numbers of batches
        module.eval()
        acc = self._acc_dtype
        sums: Optional[Tensor] = None
        shift: Optional[Tensor] = None
        for batch in self._eval_loader(dataset):
            batch = batch.to(self.device)
            y, target = self._targets(batch)
            with _standardised(module):
                out = module(batch)
            n = y.size(0)
            loss_sum = self._loss(out, target).to(acc) * n
            pred = _match_pred(_first(out), y, self.task_type)
            if self.task_type == 'regression':
                if shift is None:  # centre y with the train mean for a stable one-pass variance
                    shift = (self.normalizer.mean.to(self.device, acc) if self.uses_normalizer
                             else torch.zeros(y.size(1), dtype=acc, device=self.device))
                err = self._to_original(pred).to(acc) - y.to(acc)  # (B, t)
                yc = y.to(acc) - shift  # (B, t)
                part = torch.cat([loss_sum.new_tensor([n]), loss_sum.view(1), err.pow(2).sum(0),
                                  err.abs().sum(0), yc.sum(0), yc.pow(2).sum(0)])
            else:
                correct = (pred.argmax(dim=-1) == y).sum().to(acc)
                ce = F.cross_entropy(pred.to(acc), y, reduction='sum')
                part = torch.stack([loss_sum.new_tensor(n), loss_sum, correct, ce])
            sums = part if sums is None else sums + part
        if sums is None:  # this rank's shard is empty (fewer elements than ranks)
            sums = self._empty_sums(dataset)
        sums = self._all_reduce(sums)
        return self._metrics_from_sums(sums)

    def _empty_sums(self, dataset: Sequence) -> Tensor:
        if self.task_type == 'classification':
            return torch.zeros(4, dtype=self._acc_dtype, device=self.device)
        t = _raw_targets(next(iter(DataLoader(dataset, batch_size=1))), 'regression').size(1)
        return torch.zeros(2 + 4 * t, dtype=self._acc_dtype, device=self.device)

    def _metrics_from_sums(self, sums: Tensor) -> Dict[str, float]:
        n = sums[0]
        if self.task_type == 'classification':
            return {'loss': (sums[1] / n).item(), 'accuracy': (sums[2] / n).item(),
                    'cross_entropy': (sums[3] / n).item()}
        t = (sums.numel() - 2) // 4
        sse, sae, ysum, ysq = sums[2:].view(4, t)  # each (t,)
        ss_tot = (ysq - ysum.pow(2) / n).clamp_min(0)
        return {'loss': (sums[1] / n).item(), 'mse': (sse.sum() / (n * t)).item(),
                'mae': (sae.sum() / (n * t)).item(), 'r2': _r2_from_sums(sse, ss_tot).item()}

    @torch.no_grad()
    def predict(self, dataset: Sequence,
                scale_uncertainty: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        r"""Predictions of the current model on the whole ``dataset`` (not sharded), in dataset
        order and in original units; see :func:`predict`."""
        carries = carried_normalizer(self.model) is not None
        return predict(self.model, dataset,
                       normalizer=self.normalizer if self.uses_normalizer and not carries else None,
                       batch_size=self.config.eval_batch_size or self.config.batch_size,
                       device=self.device, progress=self._show_progress,
                       scale_uncertainty=scale_uncertainty)

    # -- checkpoints ---------------------------------------------------------------------------
    def _checkpoint_base(self, kind: str) -> Dict[str, Any]:
        return {
            'format': CHECKPOINT_FORMAT,
            'version': CHECKPOINT_VERSION,
            'kind': kind,
            'task_type': self.task_type,
            'run_info': self.run_info,
            'config': self.config.to_dict(),
            'normalizer': self.normalizer.state_dict() if self.normalizer.fitted else None,
            'torch_mz_version': _torch_mz_version(),
        }

    def _gather_rng(self) -> List[Dict[str, Any]]:
        state = _rng_state()
        if not self.dist.is_distributed:
            return [state]
        states: List[Any] = [None] * self.dist.world_size
        dist.all_gather_object(states, state)
        return states

    def load_weights(self, path: Union[str, os.PathLike]) -> Dict[str, Any]:
        r"""Loads model weights (and the target normaliser) from ``best.pt`` or ``checkpoint.pt``
        for evaluation or prediction; returns the checkpoint dict. Afterwards the model carries
        the normaliser (when targets are normalised) and predicts in target units, as after
        :meth:`fit`."""
        state = load_checkpoint(path, map_location='cpu')
        self._check_task(state, path)
        detach_normalizer(self.model)
        self._load_model_state(state['model'], path)
        if state.get('normalizer') is not None:
            self.normalizer.load_state_dict(state['normalizer'])
        self._attach_normalizer()
        return state

    def _attach_normalizer(self) -> None:
        if self.uses_normalizer and self.normalizer.fitted:
            attach_normalizer(self.model, self.normalizer)

    def _check_task(self, state: Dict[str, Any], path: Any) -> None:
        if state['task_type'] != self.task_type:
            raise CheckpointError(f'Checkpoint {os.fspath(path)!r} is for task_type '
                                  f'{state["task_type"]!r}, not {self.task_type!r}')

    def _check_run_info(self, state: Dict[str, Any], path: Any) -> None:
        saved = state.get('run_info')
        if saved is None or self.run_info is None or _same_run(saved, self.run_info):
            return
        raise CheckpointError(f'Checkpoint {os.fspath(path)!r} was written by another run '
                              f'({_describe_run(saved)}), not by this one '
                              f'({_describe_run(self.run_info)})')

    def _load_model_state(self, model_state: Dict[str, Tensor], path: Any) -> None:
        try:
            self.model.load_state_dict(model_state)
        except RuntimeError as e:
            raise CheckpointError(f'Checkpoint {os.fspath(path)!r} does not fit this model: '
                                  f'{e}') from e

    # -- logs ----------------------------------------------------------------------------------
    def _write_logs(self, history: List[Dict[str, float]]) -> None:
        r"""Rewrites ``metrics.jsonl`` and ``metrics.csv`` from the full history (so the logs
        always agree with the checkpoint, also after a resume)."""
        out = self.config.out_dir
        assert out is not None
        jsonl = ''.join(json.dumps(rec) + '\n' for rec in history)
        columns: List[str] = []
        for rec in history:
            columns += [k for k in rec if k not in columns]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator='\n')
        writer.writeheader()
        writer.writerows(history)
        atomic_write(os.path.join(out, METRICS_JSONL), lambda f: f.write(jsonl), binary=False)
        atomic_write(os.path.join(out, METRICS_CSV), lambda f: f.write(buf.getvalue()),
                      binary=False)

    # -- training ------------------------------------------------------------------------------
    def _train_epoch(self, loader: DataLoader, epoch: int) -> float:
        assert self._ddp is not None or not self.dist.is_distributed
        net = self._ddp if self._ddp is not None else self.model
        net.train()
        opt, sched, cfg = self.optimizer, self.scheduler, self.config
        assert opt is not None and sched is not None
        loss_sum = torch.zeros((), dtype=self._acc_dtype, device=self.device)
        count = 0
        batches = tqdm(loader, desc=f'epoch {epoch}', leave=False,
                       disable=not self._show_progress)
        for batch in batches:
            batch = batch.to(self.device)
            _, target = self._targets(batch)
            opt.zero_grad(set_to_none=True)
            loss = self._loss(net(batch), target)
            loss.backward()
            if cfg.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            opt.step()
            if cfg.schedule == 'step':
                sched.step()
            loss_sum += loss.detach().to(self._acc_dtype) * target.size(0)
            count += target.size(0)
        if cfg.schedule == 'epoch':
            sched.step()
        totals = self._all_reduce(torch.stack([loss_sum, loss_sum.new_tensor(count)]))
        train_loss = (totals[0] / totals[1]).item()
        if not math.isfinite(train_loss):
            raise FloatingPointError(f'Training loss is {train_loss} in epoch {epoch}; lower the '
                                     f'learning rate or check the data for NaN/inf')
        return train_loss

    def fit(self, train_dataset: Sequence, val_dataset: Optional[Sequence] = None,
            test_dataset: Optional[Sequence] = None) -> TrainResult:
        r"""Trains on ``train_dataset``, early-stopping on the loss over ``val_dataset``, and
        evaluates the final (best, restored) model on ``test_dataset`` if given. With
        ``config.resume`` set it continues from that checkpoint at its next epoch; with the same
        configuration and deterministic kernels the result equals that of an uninterrupted run.
        Under DDP all ranks must call it with the same datasets."""
        cfg = self.config
        start = time.perf_counter()
        for name, ds in (('train', train_dataset), ('val', val_dataset), ('test', test_dataset)):
            if ds is not None and len(ds) == 0:
                raise ValueError(f'Expected a non-empty {name} dataset')
        seed_everything(cfg.seed + self.dist.rank, deterministic=cfg.deterministic)
        detach_normalizer(self.model)  # trains on (and checkpoints) the standardised outputs

        loader, sampler = self._train_loader(train_dataset)
        steps = len(loader) if cfg.schedule == 'step' else 1
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr,
                                           weight_decay=cfg.weight_decay)
        self.scheduler = cosine_with_warmup(self.optimizer, cfg.warmup_epochs * steps,
                                            cfg.epochs * steps)

        history: List[Dict[str, float]] = []
        start_epoch, best_epoch, bad_epochs = 0, -1, 0
        best_val, prior_time = math.inf, 0.0
        best_state: Optional[Dict[str, Tensor]] = None
        if cfg.resume is not None:
            ckpt = self._load_resume(cfg.resume)
            history = list(ckpt['history'])
            start_epoch = ckpt['epoch'] + 1
            best_epoch, best_val = ckpt['best_epoch'], ckpt['best_val_loss']
            bad_epochs, prior_time = ckpt['bad_epochs'], ckpt['wall_time']
            best_state = ckpt['best_model']
        elif self.uses_normalizer:
            self.normalizer.fit(_collect_targets(train_dataset, 'regression',
                                                 cfg.eval_batch_size or cfg.batch_size,
                                                 cfg.num_workers))
        if self.dist.is_distributed and self._ddp is None:
            self._ddp = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == 'cuda' else None,
                find_unused_parameters=cfg.find_unused_parameters)
        if cfg.out_dir is not None and self.dist.is_main:
            os.makedirs(cfg.out_dir, exist_ok=True)

        # a resumed run that had already stopped early trains no further
        stopped_early = cfg.patience is not None and bad_epochs >= cfg.patience
        epochs = range(start_epoch, cfg.epochs if not stopped_early else start_epoch)
        bar = tqdm(epochs, initial=start_epoch, total=cfg.epochs, desc='train',
                   disable=not self._show_progress)
        for epoch in bar:
            t_epoch = time.perf_counter()
            sampler.set_epoch(epoch)
            lr = self.optimizer.param_groups[0]['lr']
            record: Dict[str, float] = {'epoch': epoch, 'lr': lr,
                                        'train_loss': self._train_epoch(loader, epoch)}
            if val_dataset is not None:
                val = self.evaluate(val_dataset)
                record.update({f'val_{k}': v for k, v in val.items()})
                if val['loss'] < best_val - cfg.min_delta:
                    best_val, best_epoch, bad_epochs = val['loss'], epoch, 0
                    best_state = _cpu_state_dict(self.model)
                    if cfg.out_dir is not None and self.dist.is_main:
                        best = self._checkpoint_base('model')
                        best.update(model=best_state, epoch=epoch, metrics=dict(record))
                        save_checkpoint(best, os.path.join(cfg.out_dir, BEST_CHECKPOINT))
                else:
                    bad_epochs += 1
                stopped_early = cfg.patience is not None and bad_epochs >= cfg.patience
            else:
                best_epoch = epoch
            record['epoch_time'] = time.perf_counter() - t_epoch
            history.append(record)
            bar.set_postfix({k: f'{v:.4g}' for k, v in record.items()
                             if k in ('train_loss', 'val_loss')})

            last = epoch == cfg.epochs - 1 or stopped_early
            periodic = cfg.checkpoint_every > 0 and (epoch + 1) % cfg.checkpoint_every == 0
            if cfg.out_dir is not None and (last or periodic):
                rng = self._gather_rng()  # collective: every rank takes part
                if self.dist.is_main:
                    ckpt = self._checkpoint_base('train')
                    ckpt.update(
                        model=_cpu_state_dict(self.model),
                        optimizer=self.optimizer.state_dict(),
                        scheduler=self.scheduler.state_dict(), epoch=epoch,
                        best_epoch=best_epoch, best_val_loss=best_val, bad_epochs=bad_epochs,
                        best_model=best_state, history=history, rng=rng,
                        wall_time=prior_time + time.perf_counter() - start,
                        world_size=self.dist.world_size)
                    save_checkpoint(ckpt, os.path.join(cfg.out_dir, LAST_CHECKPOINT))
            if cfg.out_dir is not None and self.dist.is_main:
                self._write_logs(history)
            if stopped_early:
                log.info('Early stopping after epoch %d; best epoch %d (val loss %.6g)', epoch,
                         best_epoch, best_val)
                break
        bar.close()

        if cfg.restore_best and best_state is not None:
            self.model.load_state_dict(best_state)
        self._attach_normalizer()  # from here on the model predicts in target units
        result = TrainResult(history=history, best_epoch=best_epoch,
                             best_val_loss=best_val if best_state is not None else math.nan,
                             epochs_run=len(history), stopped_early=stopped_early,
                             normalizer=copy.deepcopy(self.normalizer) if self.uses_normalizer
                             else None)
        if 0 <= best_epoch and val_dataset is not None:
            rec = next(r for r in history if r['epoch'] == best_epoch)
            result.val_metrics = {k[4:]: v for k, v in rec.items() if k.startswith('val_')}
        if test_dataset is not None:
            result.test_metrics = self.evaluate(test_dataset)
        result.wall_time = prior_time + time.perf_counter() - start
        if cfg.out_dir is not None and self.dist.is_main:
            summary = result.to_dict()
            summary.pop('history')
            summary.update(config=cfg.to_dict(), task_type=self.task_type,
                           world_size=self.dist.world_size)
            text = json.dumps(summary, indent=2) + '\n'
            atomic_write(os.path.join(cfg.out_dir, RESULT_JSON), lambda f: f.write(text),
                          binary=False)
        return result

    def _load_resume(self, path: str) -> Dict[str, Any]:
        state = load_checkpoint(path, map_location='cpu')
        if state['kind'] != 'train':
            raise CheckpointError(f'Checkpoint {path!r} holds model weights only (kind '
                                  f'{state["kind"]!r}); resume from {LAST_CHECKPOINT!r}')
        missing = [k for k in ('optimizer', 'scheduler', 'epoch', 'best_epoch', 'best_val_loss',
                               'bad_epochs', 'best_model', 'history', 'rng', 'wall_time')
                   if k not in state]
        if missing:
            raise CheckpointError(f'Checkpoint {path!r} is incomplete: missing {missing}')
        self._check_task(state, path)
        self._check_run_info(state, path)
        old = state.get('config', {})
        changed = {k: (old[k], v) for k, v in self.config.to_dict().items()
                   if k in old and old[k] != v and k not in
                   ('resume', 'out_dir', 'progress', 'device', 'num_workers')}
        if changed:
            log.warning('Resuming %s with a changed configuration %s; the run will differ from '
                        'an uninterrupted one', path, changed)
        self._load_model_state(state['model'], path)
        assert self.optimizer is not None and self.scheduler is not None
        try:
            self.optimizer.load_state_dict(state['optimizer'])
            self.scheduler.load_state_dict(state['scheduler'])
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(f'Optimizer/scheduler state in {path!r} does not fit: '
                                  f'{e}') from e
        if state.get('normalizer') is not None:
            self.normalizer.load_state_dict(state['normalizer'])
        elif self.uses_normalizer:
            raise CheckpointError(f'Checkpoint {path!r} has no target normaliser but '
                                  f'normalize_targets=True')
        rng = state['rng']
        if len(rng) != self.dist.world_size:
            log.warning('Checkpoint %s was written with %d process(es), now %d: random streams '
                        'will differ from an uninterrupted run', path, len(rng),
                        self.dist.world_size)
        _set_rng_state(rng[self.dist.rank] if self.dist.rank < len(rng) else rng[0])
        log.info('Resumed from %s at epoch %d', path, state['epoch'] + 1)
        return state


# --------------------------------------------------------------------------------------------------
# Functional API
# --------------------------------------------------------------------------------------------------
@torch.no_grad()
def predict(model: torch.nn.Module, dataset: Sequence,
            normalizer: Optional[TargetNormalizer] = None, batch_size: int = 128,
            device: Union[str, torch.device] = 'auto', progress: bool = False,
            scale_uncertainty: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    r"""Runs ``model`` in eval mode over ``dataset`` in order.

    Args:
        model (torch.nn.Module): The model, called as ``model(batch)``.
        dataset (Sequence): PyG dataset or list of :class:`~torch_geometric.data.Data`.
        normalizer (TargetNormalizer, optional): If given, predictions are mapped back to
            original units with :meth:`TargetNormalizer.inverse_transform`. Not needed for a
            model that carries its normaliser (every model trained by :func:`train` or
            :class:`Trainer` on normalised targets, and :func:`torch_mz.load_model`'s): it
            predicts in target units already, and a normaliser passed with it must have the same
            statistics (it is not applied twice). (default: :obj:`None`)
        batch_size (int, optional): Sets per batch. (default: :obj:`128`)
        device (str or torch.device, optional): Device to run on. (default: :obj:`'auto'`)
        progress (bool, optional): Show a :mod:`tqdm` progress bar. (default: :obj:`False`)
        scale_uncertainty (bool, optional): Multiply the model's second output by the target
            standard deviation of ``normalizer`` (for a model whose uncertainty is a standard
            deviation in normalised target units). By default it is returned as the model gives
            it, e.g. the MZ models' interval-hull width, a per-set width in latent units.
            (default: :obj:`False`)

    Returns:
        The predictions :math:`(N, \text{out\_dim})` (class logits for classification) on the CPU,
        or ``(predictions, uncertainties)`` if the model returns a tuple (its first two elements).
    """
    normalizer, scale = _pending_normalizer(model, normalizer)
    dev = resolve_device(device)
    model = model.to(dev)
    model.eval()
    preds: List[Tensor] = []
    uncs: List[Tensor] = []
    returns_tuple = False
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False)
    for batch in tqdm(loader, desc='predict', disable=not progress):
        out = model(batch.to(dev))
        pred = _first(out)
        pred = pred.unsqueeze(-1) if pred.dim() == 1 else pred  # (B, out_dim)
        if normalizer is not None:
            pred = normalizer.inverse_transform(pred)
        preds.append(pred.cpu())
        if isinstance(out, (tuple, list)) and len(out) > 1 and torch.is_tensor(out[1]):
            returns_tuple = True
            unc = out[1]
            if scale is not None and scale_uncertainty:
                unc = scale.inverse_scale(unc)
            uncs.append(unc.cpu())
    pred_all = torch.cat(preds, dim=0)
    return (pred_all, torch.cat(uncs, dim=0)) if returns_tuple else pred_all


def train(model: torch.nn.Module, train_dataset: Sequence, val_dataset: Optional[Sequence] = None,
          test_dataset: Optional[Sequence] = None, config: Optional[TrainConfig] = None,
          task_type: str = 'regression', loss_fn: Optional[LossFn] = None,
          run_info: Optional[Dict[str, Any]] = None) -> TrainResult:
    r"""Functional shortcut for ``Trainer(model, config, task_type, loss_fn,
    run_info).fit(train_dataset, val_dataset, test_dataset)``; the model ends up holding the best
    weights and, for normalised regression targets, its normaliser: ``model(batch)`` and
    :func:`predict` give target units (``TrainResult.normalizer`` holds the statistics)."""
    return Trainer(model, config, task_type, loss_fn, run_info).fit(train_dataset, val_dataset,
                                                                    test_dataset)
