r"""The :class:`Trainer` (the recipe of :mod:`torch_mz.train`) and its functional shortcut
:func:`train`."""
import contextlib
import copy
import csv
import gc
import io
import logging
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data.distributed import DistributedSampler
from torch_geometric.loader import DataLoader
from tqdm.auto import tqdm

from torch_mz._checks import refuse_compiled_wrapper
from torch_mz._files import atomic_write, folder_lock, remove_stale_temp_files, strict_json
from torch_mz.runtime import freed_memory_kept
from torch_mz.nn.fused import fused_kernels_mode, set_tanh_kernel, tanh_kernel_in_use
from torch_mz.train.checkpoint import (CHECKPOINT_FORMAT, CHECKPOINT_VERSION, CheckpointError,
                                       _cpu_state_dict, _finished_how, _json_values,
                                       _rng_difference,
                                       _rng_state, _set_rng_state, _torch_mz_version,
                                       _unfinished_as_trained, _with_build_info,
                                       checkpoint_normalizer, config_changes, describe_run,
                                       finished_run_changes,
                                       load_checkpoint, load_weights_into, same_run,
                                       save_checkpoint)
from torch_mz.train.config import TrainConfig, TrainResult
from torch_mz.train.contract import (TASK_TYPES, LossFn, ModelOutput, _collect_targets, _first,
                                     _match_pred, _raw_targets)
from torch_mz.train.metrics import r2_from_sums
from torch_mz.train.normalize import (TargetNormalizer, _standardised, attach_normalizer,
                                      carried_normalizer, detach_normalizer)
from torch_mz.train.prediction import predict
from torch_mz.train.runtime import (_setup_distributed, deterministic_algorithms,
                                    seed_everything)
from torch_mz.train.sampling import _ShardSampler, _worker_init_fn
from torch_mz.train.schedule import cosine_with_warmup
from torch_mz.train.stopping import (TrainingDiverged, TrainingStopped, _stop_due,
                                     _stop_requested)

__all__ = [
    'Trainer',
    'train',
    'LAST_CHECKPOINT',
    'BEST_CHECKPOINT',
    'METRICS_JSONL',
    'METRICS_CSV',
    'RESULT_JSON',
    'RUN_FILES',
]

log = logging.getLogger(__name__)

LAST_CHECKPOINT = 'checkpoint.pt'  # full training state, written every `checkpoint_every` epochs
BEST_CHECKPOINT = 'best.pt'  # model weights (+ normaliser) of the best validation epoch
METRICS_JSONL = 'metrics.jsonl'
METRICS_CSV = 'metrics.csv'
RESULT_JSON = 'result.json'
#: Every file a :class:`Trainer` writes into ``out_dir``.
RUN_FILES = (LAST_CHECKPOINT, BEST_CHECKPOINT, METRICS_JSONL, METRICS_CSV, RESULT_JSON)


@dataclass
class _FitState:
    r"""What :meth:`Trainer.fit` carries from epoch to epoch, and a training checkpoint stores."""
    start: float  # time.perf_counter() when fit() was called
    history: List[Dict[str, float]] = field(default_factory=list)
    next_epoch: int = 0
    best_epoch: int = -1
    best_val: float = math.inf
    bad_epochs: int = 0
    prior_time: float = 0.0  # seconds spent before a resume
    best_state: Optional[Dict[str, Tensor]] = None
    stopped_early: bool = False

    def wall_time(self) -> float:
        return self.prior_time + time.perf_counter() - self.start


def _merge_moments(moments: Optional[Tuple[int, Tensor, Tensor]],
                   y: Tensor) -> Tuple[int, Tensor, Tensor]:
    r"""Merges a batch of targets :obj:`y` :math:`(B, t)` into ``(count, mean, M2)`` (the
    pairwise update of Chan, Golub and LeVeque), :obj:`None` meaning no targets yet."""
    nb = y.size(0)
    mb = y.mean(dim=0)
    m2b = (y - mb).pow(2).sum(dim=0)
    if moments is None:
        return nb, mb, m2b
    na, ma, m2a = moments
    total = na + nb
    delta = mb - ma
    return total, ma + delta * (nb / total), m2a + m2b + delta.pow(2) * (na * nb / total)


#: An ``ignore_index`` no label has (the smallest int64), so that every label counts.
_NO_LABEL = -2**63


def _cross_entropy(pred: Tensor, target: Tensor, **kwargs) -> Tensor:
    r""":func:`torch.nn.functional.cross_entropy`, with a label outside the model's classes
    named as such (torch's CPU kernel says only "Target 4 is out of bounds"). No label is
    ignored: torch's default ``ignore_index=-100`` would leave a label -100 out of the loss
    while the accuracy counts it wrong (and a batch of such labels gives a NaN loss)."""
    kwargs.setdefault('ignore_index', _NO_LABEL)
    try:
        return F.cross_entropy(pred, target, **kwargs)
    except IndexError:
        low, high = int(target.min()), int(target.max())
        if low >= 0 and high < pred.size(-1):
            raise
        raise ValueError(f'Class labels must be in [0, {pred.size(-1)}) for a model with '
                         f'{pred.size(-1)} outputs; the batch holds labels from {low} to '
                         f'{high}: build the model with out_channels = the number of classes, '
                         f'and number the classes from 0') from None


class Trainer:
    r"""Trains a set model with AdamW, warm-up + cosine schedule, gradient clipping and early
    stopping (see :mod:`torch_mz.train` for the model contract).

    Under ``torchrun`` (``WORLD_SIZE > 1``) the trainer initialises the default process group if
    needed (gloo on CPU, NCCL on CUDA, one GPU per process), wraps the model in
    :class:`~torch.nn.parallel.DistributedDataParallel`, shards the training set with a
    :class:`~torch.utils.data.distributed.DistributedSampler` (without ``drop_last``: it pads
    each epoch's shuffled order to a multiple of the world size with its first sets, which then
    train twice that epoch and count twice in its ``train_loss``, the mean over every rank's
    sets) and the evaluation sets without padding, all-reduces every metric (all ranks report
    the same global values), seeds rank :math:`r` with ``seed + r`` (dropout), and writes logs
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
            :func:`torch_mz.study.train_one` records). Stored in every checkpoint; resuming from
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
        refuse_compiled_wrapper(model, 'Trainer')
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
        self._steps_per_epoch = 1  # schedule steps per epoch (set with the optimiser)
        self._stale_result: Optional[str] = None  # (_run_epochs, _remove_stale_result)

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
        # typed for a torch Dataset, but only len(dataset) is used: any sized sequence works
        sampler: DistributedSampler = DistributedSampler(
            dataset, num_replicas=self.dist.world_size,  # type: ignore[arg-type]
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
            first = _first(out)
            if (self.task_type == 'regression' and target.is_floating_point()
                    and torch.is_tensor(first) and first.is_floating_point()):
                # in the output's precision, as the default loss takes them (float64 targets,
                # kept for the metrics, gave a float32 model a float64 loss whose backward
                # failed in torch's losses)
                target = target.to(first.dtype)
            return self.loss_fn(out, target)
        pred = _match_pred(_first(out), target, self.task_type)
        if self.task_type == 'regression':
            return F.mse_loss(pred, target.to(pred.dtype))
        return _cross_entropy(pred, target)

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
        ``accuracy`` and ``cross_entropy`` (classification). The regression metrics score the
        predictions :meth:`predict` (and ``model(batch)``) return: mapped back to target units
        in the normaliser's precision (float32 for float32 targets, float64 for float64 ones:
        :class:`~torch_mz.train.TargetNormalizer`), then widened to float64 for the sums; so
        the reported MSE is that of the returned predictions, not of predictions mapped in
        float64, which no caller receives. Under DDP every rank evaluates a disjoint shard and
        the sums are all-reduced, so all ranks return the same global values; all ranks must
        call it."""
        if len(dataset) == 0:
            raise ValueError('Expected a non-empty dataset to evaluate')
        if self.uses_normalizer and not self.normalizer.fitted:
            raise RuntimeError('Targets are normalised but the normaliser is not fitted; call '
                               'fit() or load_weights() first')
        module = self.model  # not the DDP wrapper: shards may hold different numbers of batches
        module.eval()
        acc = self._acc_dtype
        sums: Optional[Tensor] = None
        moments: Optional[Tuple[int, Tensor, Tensor]] = None  # targets' (count, mean, M2)
        for batch in self._eval_loader(dataset):
            batch = batch.to(self.device)
            y, target = self._targets(batch)
            # a model carrying its normaliser gives standardised outputs where this Trainer
            # normalises (its loss is on standardised targets), target units otherwise
            with _standardised(module) if self.uses_normalizer else contextlib.nullcontext():
                out = module(batch)
            n = y.size(0)
            loss_sum = self._loss(out, target).to(acc) * n
            pred = _match_pred(_first(out), y, self.task_type)
            if self.task_type == 'regression':
                # the predictions predict() returns (mapped in the normaliser's precision:
                # float32 for float32 targets), their errors summed in float64
                err = self._to_original(pred).to(acc) - y.to(acc)  # (B, t)
                part = torch.cat([loss_sum.new_tensor([n]), loss_sum.view(1), err.pow(2).sum(0),
                                  err.abs().sum(0)])
                moments = _merge_moments(moments, y.to(acc))
            else:
                correct = (pred.argmax(dim=-1) == y).sum().to(acc)
                ce = _cross_entropy(pred.to(acc), y, reduction='sum')
                part = torch.stack([loss_sum.new_tensor(n), loss_sum, correct, ce])
            sums = part if sums is None else sums + part
        if sums is None:  # this rank's shard is empty (fewer elements than ranks)
            sums = self._empty_sums(dataset)
        shift = None
        if self.task_type == 'regression':
            sums, shift = self._with_target_sums(sums, moments, (sums.numel() - 2) // 2)
        sums = self._all_reduce(sums)
        return self._metrics_from_sums(sums, shift)

    def _with_target_sums(self, sums: Tensor, moments: Optional[Tuple[int, Tensor, Tensor]],
                          t: int) -> Tuple[Tensor, Tensor]:
        r"""``sums`` with the targets' sum and sum of squares about a shift appended, and the
        shift: this rank's mean (rank 0's under DDP, broadcast, so that the ranks' sums add
        up), from the moments merged batch by batch (Chan et al.), so that the total sum of
        squares is not the difference of two large sums (uncentred sums gave R^2 0 or -1.7e15
        for targets far from zero)."""
        acc = self._acc_dtype
        if moments is None:
            count, mean = 0, torch.zeros(t, dtype=acc, device=self.device)
            m2 = torch.zeros_like(mean)
        else:
            count, mean, m2 = moments
        shift = mean.clone()
        if self.dist.is_distributed:
            dist.broadcast(shift, src=0)
        offset = mean - shift  # (t,), zero without DDP
        return torch.cat([sums, count * offset, m2 + count * offset.pow(2)]), shift

    def _empty_sums(self, dataset: Sequence) -> Tensor:
        if self.task_type == 'classification':
            return torch.zeros(4, dtype=self._acc_dtype, device=self.device)
        t = _raw_targets(next(iter(DataLoader(dataset, batch_size=1))), 'regression').size(1)
        # count, loss, and the errors' sums (t each); the targets' come from their moments
        return torch.zeros(2 + 2 * t, dtype=self._acc_dtype, device=self.device)

    def _metrics_from_sums(self, sums: Tensor,
                           shift: Optional[Tensor] = None) -> Dict[str, float]:
        n = sums[0]
        if self.task_type == 'classification':
            return {'loss': (sums[1] / n).item(), 'accuracy': (sums[2] / n).item(),
                    'cross_entropy': (sums[3] / n).item()}
        t = (sums.numel() - 2) // 4
        sse, sae, ysum, ysq = sums[2:].view(4, t)  # each (t,)
        ss_tot = (ysq - ysum.pow(2) / n).clamp_min(0)
        # a constant column leaves rounding's spread about its mean (a few ulp of it per
        # target; it gave R^2 = -1.7e15 for a constant test target): constant where the
        # deviation is within 64 eps of the mean's magnitude (rounding's spread alone; a
        # narrower test than TargetNormalizer's sigma <= 1e-12 |mu|)
        mean = ysum / n + (0 if shift is None else shift)
        tol = n * (64 * torch.finfo(ss_tot.dtype).eps * mean.abs()).pow(2)
        ss_tot = torch.where(ss_tot <= tol, torch.zeros_like(ss_tot), ss_tot)
        return {'loss': (sums[1] / n).item(), 'mse': (sse.sum() / (n * t)).item(),
                'mae': (sae.sum() / (n * t)).item(), 'r2': r2_from_sums(sse, ss_tot).item()}

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
        state = _rng_state(self.device)
        if not self.dist.is_distributed:
            return [state]
        states: List[Any] = [None] * self.dist.world_size
        dist.all_gather_object(states, state)
        return states

    def _check_normalization(self, state: Dict[str, Any], where: str, advice: str) -> None:
        r"""Refuses a regression checkpoint trained with the other ``normalize_targets``
        (:obj:`advice` formatted with ``saved``, ``now`` and the command line's ``flag``)."""
        saved = (state.get('config') or {}).get('normalize_targets')
        now = self.config.normalize_targets
        if self.task_type == 'regression' and isinstance(saved, bool) and saved != now:
            raise CheckpointError(f'{where} was trained with normalize_targets={saved}, '
                                  + advice.format(saved=saved, now=now,
                                                  flag='without' if saved else 'with'))

    def load_weights(self, path: Union[str, os.PathLike]) -> Dict[str, Any]:
        r"""Loads model weights (and the target normaliser) from ``best.pt`` or ``checkpoint.pt``
        for evaluation or prediction; returns the checkpoint dict. Afterwards the model carries
        the normaliser (when targets are normalised), is in ``eval()`` mode and predicts in
        target units, as after :meth:`fit`. A model made by
        :func:`~torch_mz.models.build_model` must have been built as the checkpoint records
        (:func:`torch_mz.inference.load_model`'s check); a refused checkpoint (another task
        type, weights that do not fit) leaves the model as it was.

        Raises:
            CheckpointError: If the checkpoint is missing, unreadable or foreign, is of another
                task type or normalisation, or its weights do not fit the model or were trained
                in a model built otherwise.
        """
        state = load_checkpoint(path, map_location='cpu')
        self._check_task(state, path)
        self._check_normalization(
            state, f'Checkpoint {os.fspath(path)!r}', 'this Trainer has {now}: its predictions '
            'would not be in target units; build the Trainer with '
            'TrainConfig(normalize_targets={saved}) or load it with torch_mz.load_model')
        # weights of the same shapes from a model built otherwise (another readout...) loaded
        # and predicted something else: refused, as load_model(path, model=...) refuses them
        from torch_mz.inference import check_built_as_recorded  # (it imports this package)
        try:  # (the model as built, or as this Trainer records it: under its caller's label)
            check_built_as_recorded(state, self.model, f'Checkpoint {os.fspath(path)!r}')
        except CheckpointError:
            own = (self.run_info or {}).get('model')
            if own is None:
                raise
            check_built_as_recorded(state, self.model, f'Checkpoint {os.fspath(path)!r}', own)
        # the checkpoint's normaliser, never one this Trainer or its model carried before; read
        # before the weights, so that a damaged or missing one leaves the model as it was
        normalizer = checkpoint_normalizer(state, f'Checkpoint {os.fspath(path)!r}',
                                           required=self.uses_normalizer)
        # (the weights first: a refused checkpoint leaves the model as it was; the normaliser
        # is no part of the state dict)
        self._load_model_state(state['model'], path)
        detach_normalizer(self.model)
        self.normalizer = TargetNormalizer() if normalizer is None else normalizer
        self._attach_normalizer()
        self.model.eval()  # for evaluation or prediction: no dropout draws in model(batch)
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
        if isinstance(saved, dict) and isinstance(saved.get('model'), dict):
            # (an EGNN's columns beside pos_dim, recorded by an earlier torch_mz: never read)
            from torch_mz.models.registry import _without_ignored_columns
            saved = dict(saved, model=_without_ignored_columns(saved['model']))
        if saved is None or self.run_info is None or same_run(saved, self.run_info):
            return
        raise CheckpointError(f'Checkpoint {os.fspath(path)!r} was written by another run '
                              f'({describe_run(saved)}), not by this one '
                              f'({describe_run(self.run_info)})')

    def _load_model_state(self, model_state: Dict[str, Tensor], path: Any) -> None:
        load_weights_into(self.model, model_state, f'Checkpoint {os.fspath(path)!r}')

    # -- logs ----------------------------------------------------------------------------------
    def _write_logs(self, history: List[Dict[str, float]]) -> None:
        r"""Rewrites ``metrics.jsonl`` and ``metrics.csv`` from the full history (so the logs
        always agree with the checkpoint, also after a resume)."""
        out = self.config.out_dir
        assert out is not None
        # (standard JSON: a NaN figure, e.g. the R^2 of validation targets a loss of one's own
        # masks, as null)
        jsonl = ''.join(strict_json(rec) + '\n' for rec in history)
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
            try:
                out = net(batch)
            except ValueError as err:  # (torch's words alone, at the end of the first epoch)
                if target.size(0) != 1 or 'more than 1 value per channel' not in str(err):
                    raise
                size = len(loader.sampler)
                # (the next batch size that leaves no set alone; none for a single set)
                fits = next((b for b in range(cfg.batch_size + 1, size + 1) if size % b != 1),
                            None)
                choose = (f'Choose a batch_size that does not leave one set (e.g. {fits}), or '
                          f'drop or add a training set' if fits is not None else
                          'Add a training set')
                rank = " of this rank" if self.dist.is_distributed else ""
                # (batch_size=1 was said to leave one set over in the last batch: every batch
                # is one set there, and dropping or adding a set does not help)
                which = (f'the first batch of epoch {epoch}: batch_size=1 gives every batch one '
                         f'set (of the {size} training sets{rank}). Choose a batch_size of at '
                         f'least 2 (e.g. {fits})' if cfg.batch_size == 1 and fits is not None
                         else f'the last batch of epoch {epoch}, the {size} training sets{rank} '
                         f'in batches of batch_size={cfg.batch_size} leaving one set over. '
                         + choose)
                raise ValueError(
                    "A batch of one set cannot be normalised by batch statistics: the model's "
                    'batch normalisation refused ' + which) from err
            loss = self._loss(out, target)
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
            raise TrainingDiverged(epoch, train_loss)
        # the loss is computed before each step: the epoch's last steps may have overflowed
        # the weights (caught by the next validation, but not in a run without one)
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            raise TrainingDiverged(epoch, math.nan, split='weights')
        return train_loss

    def fit(self, train_dataset: Sequence, val_dataset: Optional[Sequence] = None,
            test_dataset: Optional[Sequence] = None) -> TrainResult:
        r"""Trains on ``train_dataset``, early-stopping on the loss over ``val_dataset``, and
        evaluates the final (best, restored) model on ``test_dataset`` if given; the model is
        left in ``eval()`` mode, predicting in target units. With
        ``config.resume`` set it continues from that checkpoint at its next epoch; with the same
        configuration, device, torch_mz version and deterministic kernels the result equals that
        of an uninterrupted run (a resume that differs in one of them is said in a warning;
        one with another configuration that has no epoch left to train, a finished run's, or
        with another ``seed``, is refused with a :class:`~torch_mz.train.CheckpointError`: it
        would record settings the run never trained with).
        Inside :func:`~torch_mz.train.stop_by` it stops after the epoch that ends past the
        deadline, writes that epoch's checkpoint and raises
        :class:`~torch_mz.train.TrainingStopped` (with ``out_dir`` set; a run with nowhere to
        write one trains on). A run resumed from a checkpoint trained with a validation set
        needs one (:class:`ValueError`). Under DDP all ranks must call it with the same
        datasets. With
        ``config.deterministic`` PyTorch's deterministic algorithms are on while it runs, and
        as they were after it. Where it raises, the model predicts in target units again: as it
        came, weights and normaliser, if no epoch began (a resume refused, say), with this run's
        normaliser if one did (:class:`~torch_mz.train.TrainingStopped`, a divergence).
        While it runs it holds ``out_dir`` (:func:`~torch_mz._files.folder_lock`, the main
        process): a second run into the same folder at the same time, from another process or
        thread, is refused before anything is read or written there
        (:class:`~torch_mz._files.FolderInUseError`, an :class:`OSError` naming the folder)."""
        with deterministic_algorithms(self.config.deterministic), self._holding_out_dir():
            return self._fit(train_dataset, val_dataset, test_dataset)

    def _holding_out_dir(self) -> Any:
        r"""The hold of ``out_dir`` for :meth:`fit` (the main process, where it writes files):
        two runs writing one folder at once each replaced the other's files (a ``result.json``
        of one beside the ``best.pt`` of the other), and one with ``overwrite`` removed the
        files of the run in progress."""
        if not self._writes_files:
            return contextlib.nullcontext()
        assert self.config.out_dir is not None  # _writes_files needs it
        return folder_lock(self.config.out_dir, busy='wait for it to end, or choose another '
                           'out_dir')

    def _fit(self, train_dataset: Sequence, val_dataset: Optional[Sequence],
             test_dataset: Optional[Sequence]) -> TrainResult:
        cfg = self.config
        if _stop_requested() and self.dist.is_distributed:
            raise ValueError('torch_mz.train.stop_by is not for distributed training (its '
                             'processes could disagree on the time): give the job its time '
                             'limit and resume from the last checkpoint instead')
        if cfg.seed + max(self.dist.world_size, cfg.epochs) > 2 ** 32:
            # rank r seeds with seed + r and the shuffling of epoch e with seed + e, and PyTorch
            # keeps the low 32 bits of a seed: past 2**32 - 1 a rank or an epoch would draw a
            # small seed's stream (rank 1 of 2**32 - 1: seed 0's; epoch 1 the order of epoch 0
            # of seed 0)
            raise ValueError(f'Expected seed + max(world_size, epochs) <= 2**32 (rank r seeds '
                             f'with seed + r, the shuffling of epoch e with seed + e, and '
                             f'PyTorch keeps 32 bits of a seed); got seed {cfg.seed} with '
                             f'world_size {self.dist.world_size} and {cfg.epochs} epochs')
        start = time.perf_counter()
        for name, ds in (('train', train_dataset), ('val', val_dataset), ('test', test_dataset)):
            if ds is not None and len(ds) == 0:
                raise ValueError(f'Expected a non-empty {name} dataset')
        # every split (before the seeding: the pass may draw random numbers): a NaN in the
        # training or validation data would be found only after an epoch, as a divergence
        for name, ds in (('training', train_dataset), ('validation', val_dataset),
                         ('test', test_dataset)):
            if ds is not None:
                # a loss of one's own may mask missing targets marked NaN in training (the
                # test metrics would still be NaN)
                _check_finite(ds, name, targets=self.loss_fn is None or name == 'test')
        self._check_out_dir()
        seed_everything(cfg.seed + self.dist.rank)  # (deterministic kernels: fit)
        # trains on (and checkpoints) the standardised outputs
        carried = detach_normalizer(self.model)
        # a resume may load the checkpoint's weights before it is refused (fewer epochs than the
        # checkpoint's, an optimizer state that does not fit): put back the model's own
        weights = _cpu_state_dict(self.model) if cfg.resume is not None else None
        normalizer = copy.deepcopy(self.normalizer)  # (a resume loads the checkpoint's)
        try:
            loader, sampler = self._train_loader(train_dataset)
            self._make_optimizer(len(loader))
            run = self._start_or_resume(train_dataset, start)
            if val_dataset is None and run.best_state is not None:
                # (without one every epoch became the best while the best weights and loss
                # stayed the validated epoch's: best_epoch named the last epoch, restore_best
                # loaded another's weights)
                raise ValueError(f'Checkpoint {cfg.resume!r} was trained with a validation set '
                                 f'(best epoch {run.best_epoch}, 0-based); expected one to '
                                 f'resume it (got val_dataset=None)')
            self._wrap_ddp()
            if self._writes_files:
                assert cfg.out_dir is not None  # _writes_files needs it
                os.makedirs(cfg.out_dir, exist_ok=True)
                # (a run killed while writing a checkpoint left its temporary file)
                remove_stale_temp_files(cfg.out_dir, RUN_FILES)
                if cfg.resume is not None:
                    self._resync_files(run)
        except BaseException:  # before any epoch: the model as it came, with its normaliser
            if weights is not None:
                self.model.load_state_dict(weights)
            self.normalizer = normalizer  # (evaluate() pairs it with the weights)
            if carried is not None and carried_normalizer(self.model) is None:
                attach_normalizer(self.model, carried)
            raise
        try:
            self._run_epochs(run, loader, sampler, val_dataset)
        except BaseException:  # stopped, diverged, interrupted: its weights are this run's
            self._attach_normalizer()
            raise
        return self._finish(run, val_dataset, test_dataset)

    def _check_out_dir(self) -> None:
        r"""A run that does not resume, or resumes into an ``out_dir`` other than its
        checkpoint's folder (as named, or the folder of the file a link names), refuses an
        ``out_dir`` holding an earlier run's files
        (:data:`RUN_FILES`), or with ``overwrite`` removes them (the main process), before
        anything trains: the old ``best.pt`` stayed beside the new ``checkpoint.pt`` where the
        new run wrote none (no validation set), and ``load_model`` read the other model."""
        cfg = self.config
        if cfg.out_dir is None or not os.path.isdir(cfg.out_dir):
            return
        # (the checkpoint named through a link, e.g. 'latest.pt' -> '<out_dir>/checkpoint.pt',
        # is in out_dir too: overwrite removed the very checkpoint the run was to resume from)
        if cfg.resume is not None and any(
                _same_folder(os.path.dirname(path) or '.', cfg.out_dir)
                for path in (cfg.resume, os.path.realpath(cfg.resume))):
            return  # the run goes on in its own folder
        stale = [name for name in RUN_FILES if os.path.isfile(os.path.join(cfg.out_dir, name))]
        if not stale:
            return
        if not cfg.overwrite:
            if cfg.resume is not None:  # (every resume skipped the check: another run's
                # best.pt stayed beside the checkpoint of a run resumed without validation)
                raise FileExistsError(
                    f"out_dir '{cfg.out_dir}' holds the files of another run ({', '.join(stale)})"
                    f" than the one resumed from '{cfg.resume}': pass overwrite=True to replace "
                    f"them, or another out_dir")
            resume = (f"resume='{os.path.join(cfg.out_dir, LAST_CHECKPOINT)}' to continue it, "
                      if LAST_CHECKPOINT in stale else '')  # (none: stopped in its first epoch)
            raise FileExistsError(
                f"out_dir '{cfg.out_dir}' holds the files of an earlier run "
                f"({', '.join(stale)}): pass {resume}overwrite=True to replace it, or another "
                f"out_dir")
        if self.dist.is_main:  # (the other processes write nothing here)
            for name in stale:
                os.unlink(os.path.join(cfg.out_dir, name))

    def _make_optimizer(self, batches_per_epoch: int) -> None:
        cfg = self.config
        steps = batches_per_epoch if cfg.schedule == 'step' else 1
        self._steps_per_epoch = steps  # (a resume puts the schedule at its next epoch's step)
        if 0 < cfg.warmup_epochs == cfg.epochs and self.dist.is_main:  # (once under torchrun)
            warnings.warn(f'Every one of the {cfg.epochs} epoch(s) is warm-up: the learning rate '
                          f'rises from 0 (the first step trains nothing) and never reaches lr '
                          f'{cfg.lr:g} nor decays; set warmup_epochs below epochs',
                          stacklevel=4)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr,
                                           weight_decay=cfg.weight_decay)
        self.scheduler = cosine_with_warmup(self.optimizer, cfg.warmup_epochs * steps,
                                            cfg.epochs * steps)

    def _start_or_resume(self, train_dataset: Sequence, start: float) -> _FitState:
        r"""The state of a new run (after fitting the normaliser on the training targets), or
        that of ``config.resume`` with the model, optimiser, schedule, normaliser and random
        streams restored."""
        cfg = self.config
        if cfg.resume is None:
            if self.uses_normalizer:
                # (a loss of one's own may mask missing targets marked NaN: left out of the
                # statistics)
                self.normalizer.fit(_collect_targets(train_dataset, 'regression',
                                                     cfg.eval_batch_size or cfg.batch_size,
                                                     cfg.num_workers),
                                    missing=self.loss_fn is not None)
            return _FitState(start=start)
        ckpt = self._load_resume(cfg.resume)
        if ckpt['epoch'] + 1 > cfg.epochs:  # (it would end at once, its result past epochs)
            ran = ckpt['epoch'] + 1
            # (an interrupted run's: as many as it has run would end it without its own
            # epochs, refused as a finished run's other settings are: _load_resume)
            saved = ckpt.get('config')
            own = saved.get('epochs') if isinstance(saved, dict) else None
            least = ran if own in (None, ran) else ran + 1
            raise ValueError(f'TrainConfig(epochs={cfg.epochs}) is fewer than the {ran} '
                             f'epochs checkpoint {cfg.resume!r} has run; resume with '
                             f'epochs={least} or more'
                             + ('' if least == ran else f', or with its own epochs={own}'))
        return _FitState(start=start, history=list(ckpt['history']),
                         next_epoch=ckpt['epoch'] + 1, best_epoch=ckpt['best_epoch'],
                         best_val=ckpt['best_val_loss'], bad_epochs=ckpt['bad_epochs'],
                         prior_time=ckpt['wall_time'], best_state=ckpt['best_model'])

    def _resync_files(self, run: _FitState) -> None:
        r"""Rewrites the logs and ``best.pt`` of a resumed run from its checkpoint. Each epoch
        writes ``best.pt`` (on a new best), then ``checkpoint.pt``, then the logs: a process
        killed between them leaves logs one epoch behind (which a run resumed with no epoch
        left would never rewrite) or a ``best.pt`` of an epoch the resumed run trains again.
        (The ``result.json`` of the run it extends stays until the run trains on:
        :meth:`_run_epochs`.)"""
        cfg = self.config
        assert cfg.out_dir is not None
        self._write_logs(run.history)
        if run.best_state is None:
            return
        record = next((r for r in run.history if r['epoch'] == run.best_epoch), None)
        if record is None:  # (not written by this trainer): best.pt is left as it is
            log.warning('The checkpoint has no history of its best epoch %d; best.pt is not '
                        'rewritten', run.best_epoch)
            return
        best = self._checkpoint_base('model')
        best.update(model=run.best_state, epoch=run.best_epoch,
                    # the record as _validate saw it (before the epoch's time was added)
                    metrics={k: v for k, v in record.items() if k != 'epoch_time'})
        save_checkpoint(best, os.path.join(cfg.out_dir, BEST_CHECKPOINT))

    def _wrap_ddp(self) -> None:
        if self.dist.is_distributed and self._ddp is None:
            self._ddp = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == 'cuda' else None,
                find_unused_parameters=self.config.find_unused_parameters)

    @property
    def _writes_files(self) -> bool:
        return self.config.out_dir is not None and self.dist.is_main

    def _run_epochs(self, run: _FitState, loader: DataLoader, sampler: DistributedSampler,
                    val_dataset: Optional[Sequence]) -> None:
        cfg = self.config
        assert self.optimizer is not None
        # a resumed run that had already stopped early trains no further
        run.stopped_early = cfg.patience is not None and run.bad_epochs >= cfg.patience
        epochs = range(run.next_epoch, cfg.epochs if not run.stopped_early else run.next_epoch)
        bar = tqdm(epochs, initial=run.next_epoch, total=cfg.epochs, desc='train',
                   disable=not self._show_progress)
        # a resumed run that trains on removes the result.json of the run it extends
        # (_finish writes it again) before its first file (best.pt, the logs, checkpoint.pt):
        # stopped before it finishes (a deadline, a divergence, Ctrl-C), it described the
        # shorter run beside files further on; stopped in its first epoch, before any, the
        # finished run's folder keeps it (_remove_stale_result)
        self._stale_result = (os.path.join(cfg.out_dir, RESULT_JSON) if cfg.resume is not None
                              and cfg.out_dir is not None and self.dist.is_main else None)
        for epoch in bar:
            t_epoch = time.perf_counter()
            sampler.set_epoch(epoch)
            lr = self.optimizer.param_groups[0]['lr']
            record: Dict[str, float] = {'epoch': epoch, 'lr': lr,
                                        'train_loss': self._train_epoch(loader, epoch)}
            if val_dataset is not None:
                self._validate(run, val_dataset, epoch, record)
            else:
                run.best_epoch = epoch
            record['epoch_time'] = time.perf_counter() - t_epoch
            run.history.append(record)
            bar.set_postfix({k: f'{v:.4g}' for k, v in record.items()
                             if k in ('train_loss', 'val_loss')})
            more = epoch < cfg.epochs - 1 and not run.stopped_early
            stop = more and cfg.out_dir is not None and _stop_due()  # torch_mz.train.stop_by
            self._save_epoch(run, epoch, force=stop)
            if stop:
                assert cfg.out_dir is not None  # only a run that checkpoints is stopped
                bar.close()
                log.info('Stopped at the deadline after epoch %d', epoch)
                raise TrainingStopped(epoch, os.path.join(cfg.out_dir, LAST_CHECKPOINT))
            if run.stopped_early:
                log.info('Early stopping after epoch %d; best epoch %d (val loss %.6g)', epoch,
                         run.best_epoch, run.best_val)
                break
        bar.close()

    def _validate(self, run: _FitState, val_dataset: Sequence, epoch: int,
                  record: Dict[str, float]) -> None:
        r"""Adds the validation metrics to the epoch's ``record``; keeps the weights of a new
        best epoch (and writes ``best.pt``), else counts an epoch without improvement towards
        early stopping."""
        cfg = self.config
        val = self.evaluate(val_dataset)
        if not math.isfinite(val['loss']):
            raise TrainingDiverged(epoch, val['loss'], split='validation')
        record.update({f'val_{k}': v for k, v in val.items()})
        if val['loss'] < run.best_val - cfg.min_delta:
            run.best_val, run.best_epoch, run.bad_epochs = val['loss'], epoch, 0
            run.best_state = _cpu_state_dict(self.model)
            if self._writes_files:
                assert cfg.out_dir is not None  # _writes_files needs it
                self._remove_stale_result()
                best = self._checkpoint_base('model')
                best.update(model=run.best_state, epoch=epoch, metrics=dict(record))
                save_checkpoint(best, os.path.join(cfg.out_dir, BEST_CHECKPOINT))
        else:
            run.bad_epochs += 1
        run.stopped_early = cfg.patience is not None and run.bad_epochs >= cfg.patience

    def _save_epoch(self, run: _FitState, epoch: int, force: bool = False) -> None:
        r"""Writes ``checkpoint.pt`` (every ``checkpoint_every`` epochs, after the last one and
        when :obj:`force`\ d) and the metrics logs."""
        cfg = self.config
        self._remove_stale_result()
        last = epoch == cfg.epochs - 1 or run.stopped_early or force
        periodic = cfg.checkpoint_every > 0 and (epoch + 1) % cfg.checkpoint_every == 0
        if cfg.out_dir is not None and (last or periodic):
            rng = self._gather_rng()  # collective: every rank takes part
            if self.dist.is_main:
                assert self.optimizer is not None and self.scheduler is not None
                ckpt = self._checkpoint_base('train')
                ckpt.update(
                    model=_cpu_state_dict(self.model),
                    optimizer=self.optimizer.state_dict(),
                    scheduler=self.scheduler.state_dict(), epoch=epoch,
                    best_epoch=run.best_epoch, best_val_loss=run.best_val,
                    bad_epochs=run.bad_epochs, best_model=run.best_state, history=run.history,
                    rng=rng, wall_time=run.wall_time(), world_size=self.dist.world_size,
                    # the generator feed-forward's tanh this process computes with (None:
                    # auto mode, not chosen yet), and the fused kernels' mode, so that a
                    # resumed run computes with the same functions (or says it does not)
                    tanh_kernel=tanh_kernel_in_use(), fused_kernels=fused_kernels_mode(),
                    # whether malloc keeps freed memory, on which the aggregation's automatic
                    # groups, and so its dropout masks, depend (torch_mz.runtime)
                    freed_memory_kept=freed_memory_kept())
                save_checkpoint(ckpt, os.path.join(cfg.out_dir, LAST_CHECKPOINT))
        if self._writes_files:
            self._write_logs(run.history)

    def _remove_stale_result(self) -> None:
        r"""Removes the ``result.json`` of the run a resumed run extends (:meth:`_run_epochs`)
        just before the first file further on is written: an epoch stopped before then (in
        its validation too: a divergence, Ctrl-C) leaves the finished run's folder as it was,
        its result included."""
        if self._stale_result is not None and os.path.isfile(self._stale_result):
            os.unlink(self._stale_result)
        self._stale_result = None

    def _finish(self, run: _FitState, val_dataset: Optional[Sequence],
                test_dataset: Optional[Sequence]) -> TrainResult:
        r"""Restores the best weights, attaches the normaliser, evaluates on the test set and
        writes ``result.json``."""
        cfg = self.config
        restored = cfg.restore_best and run.best_state is not None
        if restored:
            assert run.best_state is not None
            self.model.load_state_dict(run.best_state)
        self._attach_normalizer()  # from here on the model predicts in target units
        # ... in eval() mode, without or with a test set (model(batch) drew dropout masks
        # after a fit without one)
        self.model.eval()
        result = TrainResult(history=run.history, best_epoch=run.best_epoch,
                             best_val_loss=run.best_val if run.best_state is not None else math.nan,
                             epochs_run=len(run.history), stopped_early=run.stopped_early,
                             normalizer=copy.deepcopy(self.normalizer) if self.uses_normalizer
                             else None,
                             # (the epoch the model's weights, and so the test metrics, are of)
                             model_epoch=run.best_epoch if restored
                             else int(run.history[-1]['epoch']) if run.history else -1)
        if 0 <= run.best_epoch and val_dataset is not None:
            rec = next(r for r in run.history if r['epoch'] == run.best_epoch)
            result.val_metrics = {k[4:]: v for k, v in rec.items() if k.startswith('val_')}
        if test_dataset is not None:
            result.test_metrics = self.evaluate(test_dataset)
        result.wall_time = run.wall_time()
        if self._writes_files:
            self._write_result(result)
        return result

    def _write_result(self, result: TrainResult) -> None:
        summary = result.to_dict()
        summary.pop('history')
        summary.update(config=self.config.to_dict(), task_type=self.task_type,
                       world_size=self.dist.world_size)
        # standard JSON: best_val_loss of a run without a validation set (NaN) as null
        text = strict_json(summary, indent=2) + '\n'
        assert self.config.out_dir is not None
        atomic_write(os.path.join(self.config.out_dir, RESULT_JSON), lambda f: f.write(text),
                     binary=False)

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
        wrong = [f'{k} ({type(state[k]).__name__})' for k, kind in _RESUME_FIELD_TYPES.items()
                 if not isinstance(state[k], kind) or isinstance(state[k], bool)]
        if not wrong and not (state['rng'] and all(isinstance(r, dict) for r in state['rng'])
                              and all(isinstance(r, dict) for r in state['history'])):
            wrong = ['rng or history (not a list of dicts)']
        if wrong:
            raise CheckpointError(f'Checkpoint {path!r} is damaged: {", ".join(wrong)} of the '
                                  f'wrong type')
        self._check_task(state, path)
        self._check_run_info(state, path)
        old = state.get('config', {})
        # the saved weights (and the best ones) predict in the saved run's units: training on
        # would mix the two, early stopping would compare validation losses across the switch,
        # and best.pt would keep the earlier weights under the new setting (predictions in
        # normalised units written as target units)
        self._check_normalization(
            state, f'Checkpoint {path!r}', 'this run has {now}: its weights predict in the other '
            'units; resume with normalize_targets={saved} (the command line: {flag} '
            '--no-normalize), or start a new run')
        changed = config_changes(old, self.config.to_dict())
        unused = finished_run_changes(state, self.config.to_dict(), self.dist.world_size)
        if unused:  # (as the command line refuses another --seed): it would train nothing,
            # and write result.json and best.pt anew under settings the run never trained with
            how, needs = _finished_how(state, self.config.to_dict())
            unfinished = _unfinished_as_trained(state)
            run = (f'a finished run ({how})' if unfinished is None else
                   f'a run not finished ({unfinished[0]} of its {unfinished[1]} epochs run) '
                   f'that this configuration ends at once')
            others = [k for k in unused if k not in needs]  # (those a run that trains on takes)
            raise CheckpointError(
                f'Checkpoint {path!r} holds {run}: resumed with other '
                f'settings (' + ', '.join(f'{k} {a!r}, now {b!r}' for k, (a, b)
                                          in unused.items())
                + ') it would train nothing, yet its result.json and best.pt would record '
                'them; resume with the settings it was trained with, or with '
                + ' and '.join(f'{k} >= {v}' for k, v in needs.items())
                + ' to train on' + (f" under the new {', '.join(others)}" if others else '')
                + ', or start a new run')
        if 'seed' in changed:  # (as the command line refuses another --seed): the run's own
            # epochs shuffle with seed + epoch, so the next ones would be another run's, and
            # its result.json and best.pt would name a seed it did not start with
            saved_seed, seed = changed['seed']
            raise CheckpointError(
                f'Checkpoint {path!r} was trained with seed {saved_seed!r}, not {seed!r}: '
                f'resumed with another seed its next epochs would shuffle as another run\'s, '
                f'and its result.json and best.pt would record a seed it did not start with; '
                f'resume with seed={saved_seed!r}, or start a new run')
        # what holds for every process (the checkpoint, the configuration, the number of
        # processes) is said by the main one alone: under torchrun each rank said it again
        main = self.dist.is_main
        if changed and main:
            log.warning('Resuming %s with a changed configuration %s; the run will differ from '
                        'an uninterrupted one', path, changed)
        normalizer = checkpoint_normalizer(state, f'Checkpoint {path!r}')  # (a damaged one:
        if state['best_model'] is not None:  # refused before the weights load)
            # loaded once every epoch has run (restore_best) and written to best.pt before the
            # first: best weights that do not fit the model (or hold NaN) are refused now, not
            # after the whole run has trained (the model's own weights load next)
            load_weights_into(self.model, state['best_model'], f'Checkpoint {path!r} (its '
                              f'best_model)')
        self._load_model_state(state['model'], path)
        assert self.optimizer is not None and self.scheduler is not None
        try:
            self.optimizer.load_state_dict(state['optimizer'])
            self.scheduler.load_state_dict(state['scheduler'])
        except (ValueError, KeyError, RuntimeError, TypeError, AttributeError) as e:
            # (TypeError, AttributeError: an entry of the wrong type inside either dict)
            raise CheckpointError(f'Optimizer/scheduler state in {path!r} does not fit: '
                                  f'{e}') from e
        if 'weight_decay' in changed:  # (the loaded optimiser state holds the saved one)
            for group in self.optimizer.param_groups:
                group['weight_decay'] = self.config.weight_decay
        # the schedule counts steps: with other steps per epoch (another batch size or number
        # of processes) the saved count fell inside another epoch of this run's schedule (the
        # warm-up went on, the cosine ended before the last epoch or not at all): it goes on
        # from the step at which this run's next epoch begins
        step = (state['epoch'] + 1) * self._steps_per_epoch
        moved = self.scheduler.last_epoch != step
        if moved and main:
            log.warning('Checkpoint %s stopped at step %d of its schedule; this run, with %d '
                        'steps per epoch, begins its epoch %d at step %d: the schedule goes on '
                        'from there', path, self.scheduler.last_epoch, self._steps_per_epoch,
                        state['epoch'] + 1, step)
        if moved:
            self.scheduler.last_epoch = step
        if moved or {'epochs', 'warmup_epochs', 'lr'} & set(changed):
            # the optimiser holds the learning rate of the saved schedule's last step (0 at the
            # end of a finished run's cosine) and the schedule its saved base rate: the next
            # epoch takes the new schedule's rate for the same step, from the configured base
            # rate, rather than training a first extended epoch at the saved one (a change of
            # 'schedule' or of the steps per epoch is only warned about)
            if 'lr' in changed:
                self.scheduler.base_lrs = [self.config.lr for _ in self.optimizer.param_groups]
                for group in self.optimizer.param_groups:
                    group['initial_lr'] = self.config.lr
            for group, base, factor in zip(self.optimizer.param_groups, self.scheduler.base_lrs,
                                           self.scheduler.lr_lambdas):
                group['lr'] = base * factor(self.scheduler.last_epoch)
            self.scheduler._last_lr = [g['lr'] for g in self.optimizer.param_groups]
        if normalizer is not None:  # (checked before the weights loaded)
            self.normalizer.load_state_dict(state['normalizer'])
        elif self.uses_normalizer:
            raise CheckpointError(f'Checkpoint {path!r} has no target normaliser but '
                                  f'normalize_targets=True')
        rng = state['rng']
        if len(rng) != self.dist.world_size and main:
            log.warning('Checkpoint %s was written with %d process(es), now %d: random streams '
                        'will differ from an uninterrupted run', path, len(rng),
                        self.dist.world_size)
        saved_rng = rng[self.dist.rank] if self.dist.rank < len(rng) else rng[0]
        try:
            _set_rng_state(saved_rng, self.device)
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
            raise CheckpointError(f'Random-number state in {path!r} cannot be restored: '
                                  f'{type(e).__name__}: {e}') from e
        # another device (a GPU run resumed on the CPU; config_changes lets 'device' pass), or
        # a GPU whose state the checkpoint lacks (written where fewer were visible): resumed
        # all the same, but said not to be the same stream
        moved_device = _rng_difference(saved_rng, self.device,
                                       old.get('device') if isinstance(old, dict) else None)
        if moved_device is not None and main:
            log.warning('Checkpoint %s: %s; its random stream (dropout masks) is not the '
                        "run's, which will differ from an uninterrupted one", path, moved_device)
        version = state.get('torch_mz_version')
        if isinstance(version, str) and version != _torch_mz_version() and main:
            log.warning('Checkpoint %s was written by torch_mz %s, this is torch_mz %s: the run '
                        'may differ from an uninterrupted one', path, version,
                        _torch_mz_version())
        saved_tanh = state.get('tanh_kernel')
        if saved_tanh is not None:
            # the tanh the run computed with (torch_mz.nn.fused.tanh_kernel_in_use), unless
            # this process has chosen already (the fused kernels' mode, TORCH_MZ_TANH_KERNEL,
            # set_tanh_kernel, a call)
            if tanh_kernel_in_use() is None:
                set_tanh_kernel(bool(saved_tanh))
            elif tanh_kernel_in_use() != bool(saved_tanh):
                log.warning('Checkpoint %s was trained with %s tanh, this process runs %s: '
                            'the run will differ from an uninterrupted one by float rounding',
                            path, *('the compiled' if k else "ATen's"
                                    for k in (saved_tanh, tanh_kernel_in_use())))
        if 'fused_kernels' in state and state['fused_kernels'] != fused_kernels_mode():
            log.warning('Checkpoint %s was trained with the fused kernels %s, this process has '
                        'them %s: the run will differ from an uninterrupted one by float '
                        'rounding', path, *({True: 'on', False: 'off', None: 'in auto mode'}[m]
                                            for m in (state['fused_kernels'],
                                                      fused_kernels_mode())))
        if ('freed_memory_kept' in state
                and bool(state['freed_memory_kept']) != freed_memory_kept()):
            log.warning('Checkpoint %s was trained %s kept freed memory, this process runs %s '
                        'it (torch_mz.runtime.keep_freed_memory; the command line keeps it): '
                        'large inputs are encoded in other groups, which draw other dropout '
                        'masks, so the run will differ from an uninterrupted one', path,
                        *('with' if k else 'without'
                          for k in (state['freed_memory_kept'], freed_memory_kept())))
        if main:
            log.info('Resumed from %s at epoch %d', path, state['epoch'] + 1)
        return state


#: The types of a training checkpoint's fields that :meth:`Trainer._load_resume` reads.
_RESUME_FIELD_TYPES: Dict[str, Union[type, Tuple[type, ...]]] = {
    'epoch': int, 'best_epoch': int, 'bad_epochs': int, 'best_val_loss': (int, float),
    'wall_time': (int, float), 'history': list, 'rng': list, 'model': dict, 'optimizer': dict,
    'scheduler': dict, 'best_model': (dict, type(None))}


def _same_folder(a: str, b: str) -> bool:
    r"""Whether the paths :obj:`a` and :obj:`b` name one folder (links resolved)."""
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def _check_finite(dataset: Sequence, name: str, targets: bool = True) -> None:
    r"""Raises :class:`ValueError` naming the first example of :obj:`dataset` with a NaN or inf
    in what the models and losses read (``pos``, ``x``, ``y``; other attributes may hold NaN or
    inf on purpose, e.g. a mask). Run on every split before training: the test set's loss is
    computed only once training has ended, and a NaN in the training or validation data would
    show only after a whole epoch, as a :class:`~torch_mz.train.TrainingDiverged` that
    suggests a lower learning rate. Without :obj:`targets`, ``y`` is not checked (a loss of
    one's own, ``loss_fn``, may mask missing targets marked NaN)."""
    keys = ('pos', 'x', 'y') if targets else ('pos', 'x')
    for i in range(len(dataset)):
        data = dataset[i]
        for key in keys:
            value = getattr(data, key, None)
            if (torch.is_tensor(value) and value.is_floating_point()
                    and not bool(torch.isfinite(value).all())):
                raise ValueError(f"The {name} dataset's example {i} holds NaN or inf in "
                                 f"'{key}': its {name} loss and metrics would be NaN; remove or "
                                 f"fix the example")


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
