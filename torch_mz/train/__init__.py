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

One module per concern: :mod:`~torch_mz.train.runtime` (seeds, device, process group),
:mod:`~torch_mz.train.schedule` (learning-rate schedule), :mod:`~torch_mz.train.contract` (model
outputs and targets), :mod:`~torch_mz.train.normalize` (target normaliser),
:mod:`~torch_mz.train.metrics`, :mod:`~torch_mz.train.config` (:class:`TrainConfig`,
:class:`TrainResult`), :mod:`~torch_mz.train.checkpoint`, :mod:`~torch_mz.train.sampling`
(evaluation shards, worker seeds), :mod:`~torch_mz.train.prediction` (:func:`predict`),
:mod:`~torch_mz.train.stopping` (:func:`stop_by`: stop between epochs at a deadline) and
:mod:`~torch_mz.train.trainer` (:class:`Trainer`, :func:`train`). Every public name is
importable from :mod:`torch_mz.train` itself, but the checkpoint module's comparisons of runs
(:func:`~torch_mz.train.checkpoint.same_run`, ``describe_run``, ``config_changes``,
``finished_run_changes``), which
:mod:`torch_mz.cli` uses, and the form in which a checkpoint records task options
(:func:`~torch_mz.train.checkpoint.recorded_options`) stay in that module.
"""
from torch_mz.train.checkpoint import (CHECKPOINT_FORMAT, CHECKPOINT_VERSION, CheckpointError,
                                       load_checkpoint, save_checkpoint)
from torch_mz.train.config import SCHEDULES, TrainConfig, TrainResult
from torch_mz.train.contract import TASK_TYPES, LossFn, ModelOutput
from torch_mz.train.normalize import (TARGET_UNITS, TargetNormalizer, TargetUnits,
                                      attach_normalizer, carried_normalizer, detach_normalizer)
from torch_mz.train.prediction import predict
from torch_mz.train.runtime import DistInfo, resolve_device, seed_everything
from torch_mz.train.schedule import cosine_with_warmup
from torch_mz.train.stopping import TrainingDiverged, TrainingStopped, stop_by
from torch_mz.train.trainer import (BEST_CHECKPOINT, LAST_CHECKPOINT, METRICS_CSV, METRICS_JSONL,
                                    RESULT_JSON, RUN_FILES, Trainer, train)

__all__ = [
    'CheckpointError',
    'TrainingDiverged',
    'TrainingStopped',
    'stop_by',
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
    'ModelOutput',
    'LossFn',
    'TASK_TYPES',
    'SCHEDULES',
    'TARGET_UNITS',
    'CHECKPOINT_FORMAT',
    'CHECKPOINT_VERSION',
    'LAST_CHECKPOINT',
    'BEST_CHECKPOINT',
    'METRICS_JSONL',
    'METRICS_CSV',
    'RESULT_JSON',
    'RUN_FILES',
]
