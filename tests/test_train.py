import copy
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch_geometric.data import Data

from torch_mz.train import (
    CheckpointError,
    TargetNormalizer,
    TargetUnits,
    Trainer,
    TrainConfig,
    attach_normalizer,
    carried_normalizer,
    cosine_with_warmup,
    detach_normalizer,
    load_checkpoint,
    predict,
    resolve_device,
    save_checkpoint,
    seed_everything,
    train,
)
from torch_mz.train.metrics import r2_from_sums

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _load_helpers():
    # Loaded by path: the helpers double as the torchrun worker script, and tests/ is no package.
    spec = importlib.util.spec_from_file_location('_train_helpers', HERE / '_ddp_worker.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


H = _load_helpers()


REG_TRAIN = H.make_regression_sets(128, seed=10)
REG_VAL = H.make_regression_sets(48, seed=11)
CLS_TRAIN = H.make_classification_sets(128, seed=10)
CLS_VAL = H.make_classification_sets(48, seed=11)


def config(**kwargs) -> TrainConfig:
    base = dict(epochs=3, batch_size=16, lr=1e-2, warmup_epochs=1, device='cpu', progress=False,
                patience=None)
    base.update(kwargs)
    return TrainConfig(**base)


def targets(dataset) -> torch.Tensor:
    return torch.cat([d.y.view(1, -1) for d in dataset], dim=0)


def params(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def strip_times(history: list) -> list:
    return [{k: v for k, v in r.items() if k != 'epoch_time'} for r in history]


def assert_same_params(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# --------------------------------------------------------------------------------------------------
# Schedule
# --------------------------------------------------------------------------------------------------
def test_cosine_with_warmup_values():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = cosine_with_warmup(opt, warmup_steps=4, total_steps=20)
    lrs = [opt.param_groups[0]['lr']]
    for _ in range(22):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]['lr'])
    assert lrs[0] == 0.0
    assert lrs[:5] == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1])  # linear warm-up
    assert lrs[4] == pytest.approx(0.1) and max(lrs) == pytest.approx(0.1)
    assert lrs[12] == pytest.approx(0.05)  # half-way through the cosine
    assert lrs[20] == pytest.approx(0.0, abs=1e-12) and lrs[22] == 0.0
    decay = lrs[4:21]
    assert all(a > b for a, b in zip(decay, decay[1:]))  # strictly decreasing cosine
    expected = [0.05 * (1 + math.cos(math.pi * (s - 4) / 16)) for s in range(4, 21)]
    assert decay == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize('warmup,total', [(-1, 10), (11, 10), (0, 0)])
def test_cosine_with_warmup_rejects_bad_arguments(warmup, total):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match='warmup_steps'):
        cosine_with_warmup(opt, warmup, total)


@pytest.mark.parametrize('schedule', ['epoch', 'step'])
def test_trainer_follows_schedule(schedule):
    data = REG_TRAIN[:32]  # 2 steps per epoch at batch size 16
    cfg = config(epochs=6, warmup_epochs=2, lr=1e-3, schedule=schedule)
    result = Trainer(H.ToyDeepSets(3, 2), cfg).fit(data)
    steps = 1 if schedule == 'epoch' else 2
    total, warm = 6 * steps, 2 * steps

    def factor(s):
        return s / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm)))

    # `lr` in the history is the learning rate of the first step of each epoch
    assert [r['lr'] for r in result.history] == pytest.approx(
        [1e-3 * factor(e * steps) for e in range(6)])
    assert result.history[0]['lr'] == 0.0


# --------------------------------------------------------------------------------------------------
# Target normaliser
# --------------------------------------------------------------------------------------------------
def test_target_normalizer_round_trip_and_state_dict():
    g = torch.Generator().manual_seed(0)
    y = torch.randn(50, 3, generator=g) * torch.tensor([5.0, 0.1, 1.0]) + torch.tensor([7, -3, 0])
    y[:, 2] = 4.0  # a constant column keeps std 1 instead of dividing by zero
    norm = TargetNormalizer().fit(y)
    z = norm.transform(y)
    assert torch.allclose(z[:, :2].mean(0), torch.zeros(2), atol=1e-5)
    assert torch.allclose(z[:, :2].std(0, unbiased=False), torch.ones(2), atol=1e-5)
    assert torch.equal(z[:, 2], torch.zeros(50))
    assert torch.allclose(norm.inverse_transform(z), y, atol=1e-5)
    assert torch.allclose(norm.inverse_scale(torch.ones(1, 3)),
                          torch.tensor([[y[:, 0].std(unbiased=False), y[:, 1].std(unbiased=False),
                                         1.0]]), atol=1e-5)

    state = norm.state_dict()
    assert all(torch.is_tensor(state[k]) for k in ('mean', 'std'))
    other = TargetNormalizer().load_state_dict(state)
    assert torch.equal(other.transform(y), z)

    one = TargetNormalizer().fit(torch.tensor([1.0, 2.0, 3.0]))  # 1-D targets: one column
    assert torch.allclose(one.inverse_transform(one.transform(torch.tensor([5.0]))),
                          torch.tensor([5.0]))
    with pytest.raises(ValueError, match='3 column'):
        norm.transform(torch.zeros(4, 2))
    with pytest.raises(RuntimeError, match='not fitted'):
        TargetNormalizer().transform(y)


def test_normalizer_uses_train_statistics_only(tmp_path):
    val = H.make_regression_sets(48, seed=11, offset=1000.0, scale=50.0)  # very different
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=1, out_dir=str(tmp_path)))
    trainer.fit(REG_TRAIN, val)
    y = targets(REG_TRAIN).double()
    assert torch.allclose(trainer.normalizer.mean, y.mean(0))
    assert torch.allclose(trainer.normalizer.std, y.std(0, unbiased=False))
    # ... and it is stored in the checkpoint
    ckpt = load_checkpoint(tmp_path / 'checkpoint.pt')
    assert torch.equal(ckpt['normalizer']['mean'], trainer.normalizer.mean)
    assert torch.equal(ckpt['normalizer']['std'], trainer.normalizer.std)


# --------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------
def np_r2(p: np.ndarray, y: np.ndarray) -> float:
    r"""R² per column, averaged uniformly (scikit-learn's default), independently of torch_mz."""
    p, y = p.reshape(len(y), -1), y.reshape(len(y), -1)
    return float(np.mean(1 - ((y - p) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)))


def test_r2_from_sums():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(40, 3)) * [1.0, 10.0, 0.5]
    p = y + rng.normal(size=(40, 3))

    def r2(p, y):
        return r2_from_sums(torch.from_numpy(((y - p) ** 2).sum(0)),
                            torch.from_numpy(((y - y.mean(0)) ** 2).sum(0))).item()
    assert r2(p, y) == pytest.approx(np_r2(p, y))  # uniform average over columns
    assert r2(y, y) == 1.0  # perfect prediction
    assert r2(np.broadcast_to(y.mean(0), y.shape), y) == pytest.approx(0.0, abs=1e-12)
    const = np.full((5, 1), 2.0)  # a constant column: 1 if predicted exactly, else 0
    assert r2(const, const) == 1.0 and r2(const + 1, const) == 0.0


def test_evaluate_matches_metrics_on_predictions():
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=2, eval_batch_size=7))
    trainer.fit(REG_TRAIN, REG_VAL)
    metrics = trainer.evaluate(REG_VAL)
    pred, y = trainer.predict(REG_VAL), targets(REG_VAL)
    assert pred.shape == y.shape
    # metrics are in original units: compare with numpy on the de-normalised output
    p, t = pred.double().numpy(), y.double().numpy()
    assert metrics['mse'] == pytest.approx(np.mean((p - t) ** 2), rel=1e-6)
    assert metrics['mae'] == pytest.approx(np.mean(np.abs(p - t)), rel=1e-6)
    assert metrics['r2'] == pytest.approx(np_r2(p, t), rel=1e-6, abs=1e-9)
    # the loss is the MSE in normalised units
    z = trainer.normalizer.transform(y.double())
    zp = trainer.normalizer.transform(pred.double())
    assert metrics['loss'] == pytest.approx((zp - z).pow(2).mean().item(), rel=1e-5)
    assert metrics['mse'] > 10 * metrics['loss']  # targets have std ~ 10: units do differ


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------
def test_regression_learns():
    seed_everything(0)
    result = train(H.ToyDeepSets(3, 2), REG_TRAIN, REG_VAL, REG_VAL[:20],
                   config=config(epochs=12), task_type='regression')
    losses = [r['val_loss'] for r in result.history]
    assert losses[-1] < 0.2 * losses[0]
    assert result.val_metrics['r2'] > 0.9
    assert result.test_metrics is not None and result.test_metrics['r2'] > 0.85
    assert result.best_val_loss == min(losses)
    assert result.history[result.best_epoch]['val_loss'] == result.best_val_loss


def test_classification_learns():
    seed_everything(0)
    trainer = Trainer(H.ToyDeepSets(3, 3), config(epochs=10), task_type='classification')
    result = trainer.fit(CLS_TRAIN, CLS_VAL)
    assert set(result.val_metrics) == {'loss', 'accuracy', 'cross_entropy'}
    assert result.val_metrics['accuracy'] > 0.8  # chance is ~1/3
    assert not trainer.normalizer.fitted  # class labels are never normalised

    metrics = trainer.evaluate(CLS_VAL)
    logits = trainer.predict(CLS_VAL)
    labels = torch.cat([d.y for d in CLS_VAL])
    assert logits.shape == (48, 3)
    assert metrics['accuracy'] == pytest.approx(
        (logits.argmax(-1) == labels).double().mean().item())
    assert metrics['cross_entropy'] == pytest.approx(
        F.cross_entropy(logits.double(), labels).item(), rel=1e-6)
    # labels stored as (1, 1) per graph (batch.y of shape (B, 1)) give the same metrics
    as_column = [Data(x=d.x, y=d.y.view(1, 1)) for d in CLS_VAL]
    assert trainer.evaluate(as_column) == pytest.approx(metrics)


def test_predict_with_an_uncertainty_output():
    model = H.ToyDeepSets(3, 2, with_uncertainty=True)
    trainer = Trainer(model, config(epochs=1))
    trainer.fit(REG_TRAIN, REG_VAL)
    pred, width = trainer.predict(REG_VAL)  # the second output is returned as the model gives it
    _, sigma = trainer.predict(REG_VAL, scale_uncertainty=True)  # ... or read as a std
    assert pred.shape == sigma.shape == width.shape == (48, 2)
    from torch_geometric.data import Batch
    bare = copy.deepcopy(model).eval()
    assert detach_normalizer(bare) is not None
    with torch.no_grad():
        raw_pred, raw_sigma = bare(Batch.from_data_list(REG_VAL))  # standardised
    mean, std = trainer.normalizer.mean.float(), trainer.normalizer.std.float()
    assert torch.allclose(pred, raw_pred * std + mean, atol=1e-4)
    assert torch.allclose(width, raw_sigma, atol=1e-6)
    assert torch.allclose(sigma, raw_sigma * std, atol=1e-5)
    # the functional form gives target units too: the trained model carries its normaliser
    p, s = predict(model, REG_VAL, device='cpu', batch_size=5)
    assert torch.allclose(p, pred, atol=1e-5) and torch.allclose(s, raw_sigma, atol=1e-6)
    _, s = predict(model, REG_VAL, device='cpu', scale_uncertainty=True)
    assert torch.allclose(s, sigma, atol=1e-6)
    # the same normaliser passed again is not applied twice; another one is refused
    assert torch.equal(predict(model, REG_VAL, normalizer=trainer.normalizer, device='cpu')[0],
                       predict(model, REG_VAL, device='cpu')[0])
    other = TargetNormalizer().fit(targets(REG_VAL))
    with pytest.raises(ValueError, match='carries its own target normaliser'):
        predict(model, REG_VAL, normalizer=other, device='cpu')
    model.float()  # casts the float64 statistics too: they still match to float32 rounding
    assert torch.allclose(predict(model, REG_VAL, normalizer=trainer.normalizer, device='cpu')[0],
                          pred, atol=1e-4)


@pytest.mark.parametrize('grad_clip', [None, 0.01])
def test_gradients_are_clipped_before_each_step(grad_clip):
    norms = []

    def record(optimizer, args, kwargs):
        grads = [p.grad for g in optimizer.param_groups for p in g['params'] if p.grad is not None]
        norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())

    handle = register_optimizer_step_pre_hook(record)
    try:
        seed_everything(0)
        Trainer(H.ToyDeepSets(3, 2), config(epochs=2, grad_clip=grad_clip)).fit(REG_TRAIN[:64])
    finally:
        handle.remove()
    assert len(norms) == 2 * 4
    if grad_clip is None:
        assert max(norms) > 0.05  # the unclipped gradients are larger than the clip below
    else:
        assert max(norms) <= grad_clip * (1 + 1e-4)


def test_wrong_output_shape_is_a_clear_error():
    with pytest.raises(ValueError, match=r'regression prediction of shape \(16, 2\)'):
        Trainer(H.ToyDeepSets(3, 3), config(epochs=1)).fit(REG_TRAIN)


def test_early_stopping_stops_at_patience_and_restores_best(tmp_path):
    curve = [5.0, 4.0, 3.0, 2.0, 2.5, 2.6, 2.7, 1.0, 0.5, 0.1]  # best at epoch 3
    seed_everything(0)
    trainer = Trainer(H.ToyDeepSets(3, 2),
                      config(epochs=10, patience=3, out_dir=str(tmp_path), lr=1e-2))
    snapshots = []

    def scripted_evaluate(dataset):  # called once after each training epoch
        snapshots.append(params(trainer.model))
        return {'loss': curve[len(snapshots) - 1]}

    trainer.evaluate = scripted_evaluate
    result = trainer.fit(REG_TRAIN[:32], REG_VAL)
    # 3 epochs without improvement after epoch 3: stops after epoch 6
    assert [r['epoch'] for r in result.history] == list(range(7))
    assert result.stopped_early and result.best_epoch == 3 and result.best_val_loss == 2.0
    assert_same_params(params(trainer.model), snapshots[3])  # best weights restored
    assert any(not torch.equal(snapshots[3][k], snapshots[6][k]) for k in snapshots[3])
    best = load_checkpoint(tmp_path / 'best.pt')
    assert best['epoch'] == 3 and best['kind'] == 'model'
    assert_same_params(best['model'], snapshots[3])
    assert load_checkpoint(tmp_path / 'checkpoint.pt')['epoch'] == 6

    # resuming a run that already stopped early trains no further and restores the same weights
    resumed = Trainer(H.ToyDeepSets(3, 2), config(epochs=10, patience=3, lr=1e-2,
                                                  resume=str(tmp_path / 'checkpoint.pt')))
    again = resumed.fit(REG_TRAIN[:32], REG_VAL)
    assert again.stopped_early and strip_times(again.history) == strip_times(result.history)
    assert_same_params(params(resumed.model), snapshots[3])


def test_trained_model_predicts_in_target_units():
    # issue 13, item 2: after train() the model itself answers in target units
    model = H.ToyDeepSets(3, 2)
    result = train(model, REG_TRAIN, REG_VAL, REG_VAL, config=config(epochs=4))
    y = targets(REG_VAL)
    from torch_geometric.data import Batch
    model.eval()
    with torch.no_grad():
        out = model(Batch.from_data_list(REG_VAL))
    assert out.shape == y.shape
    # the targets have means 100 and 110 and std ~ 5: standardised outputs would be near 0
    assert torch.allclose(out.mean(0), y.mean(0), atol=3.0)
    assert (out.double() - y.double()).pow(2).mean().item() == pytest.approx(
        result.test_metrics['mse'], rel=1e-5)
    # TrainResult exposes the normaliser, fitted on the training split
    assert isinstance(result.normalizer, TargetNormalizer)
    assert torch.allclose(result.normalizer.mean, targets(REG_TRAIN).double().mean(0))
    assert torch.equal(carried_normalizer(model).mean, result.normalizer.mean)
    # ... and predict() returns the same target units
    assert torch.allclose(predict(model, REG_VAL, device='cpu'), out, atol=1e-5)
    # the bare weights stay as they were: the normaliser's buffers are not in the state_dict
    assert set(model.state_dict()) == set(H.ToyDeepSets(3, 2).state_dict())
    assert isinstance(model.target_units, TargetUnits) and 'TargetUnits' in repr(model)
    assert 'normalizer' not in result.to_dict()  # result.json is unchanged


def test_fit_and_load_weights_leave_the_model_in_eval_mode_and_predict_restores_the_mode(tmp_path):
    # model(batch) right after fit (here without a validation or test set, which used to leave
    # the model in train mode) or load_weights draws no dropout masks
    from torch_geometric.data import Batch
    batch = Batch.from_data_list(REG_VAL[:8])
    model = H.ToyDeepSets(3, 2, dropout=0.5)
    train(model, REG_TRAIN[:32], config=config(epochs=1, out_dir=str(tmp_path / 'run')))
    assert not model.training
    with torch.no_grad():
        assert torch.equal(model(batch), model(batch))
    again = H.ToyDeepSets(3, 2, dropout=0.5)
    Trainer(again, config()).load_weights(tmp_path / 'run' / 'checkpoint.pt')
    assert not again.training
    with torch.no_grad():
        assert torch.equal(again(batch), model(batch))
    # predict() runs in eval mode and puts the model back in the mode it found
    again.train()
    out = predict(again, REG_VAL[:8], device='cpu')
    assert again.training and torch.allclose(out, model(batch).detach(), atol=1e-6)


def test_training_again_and_evaluate_use_standardised_outputs():
    seed_everything(0)
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=2))
    first = trainer.fit(REG_TRAIN, REG_VAL)
    # evaluate() on a model that carries its normaliser reports the same metrics as in training
    assert trainer.evaluate(REG_VAL) == pytest.approx(first.val_metrics, rel=1e-6)
    # a second fit starts from standardised outputs again and ends with one normaliser attached
    second = trainer.fit(REG_TRAIN, REG_VAL)
    assert second.history[0]['val_loss'] < 2 * first.history[-1]['val_loss']
    hooks = list(trainer.model._forward_hooks.values())
    assert len(hooks) == 1
    # a new Trainer on a trained model picks its normaliser up
    fresh = Trainer(trainer.model, config())
    assert fresh.evaluate(REG_VAL) == pytest.approx(trainer.evaluate(REG_VAL), rel=1e-6)


def test_attach_and_detach_normalizer():
    model = H.ToyDeepSets(3, 2, with_uncertainty=True).eval()
    from torch_geometric.data import Batch
    batch = Batch.from_data_list(REG_VAL[:5])
    with torch.no_grad():
        z, w = model(batch)
    norm = TargetNormalizer().fit(targets(REG_TRAIN))
    assert attach_normalizer(model, norm) is model
    attach_normalizer(model, norm)  # replaces, never stacks
    with torch.no_grad():
        y, w2 = model(batch)
    assert torch.equal(y, norm.inverse_transform(z)) and torch.equal(w2, w)
    back = detach_normalizer(model)
    assert torch.equal(back.mean, norm.mean) and torch.equal(back.std, norm.std)
    assert carried_normalizer(model) is None and detach_normalizer(model) is None
    with torch.no_grad():
        assert torch.equal(model(batch)[0], z)
    with pytest.raises(ValueError, match='fitted'):
        TargetUnits(TargetNormalizer())


def test_classification_model_is_not_normalised():
    trainer = Trainer(H.ToyDeepSets(3, 3), config(epochs=1), task_type='classification')
    result = trainer.fit(CLS_TRAIN, CLS_VAL)
    assert result.normalizer is None and carried_normalizer(trainer.model) is None


def test_logs_and_checkpoint_contents(tmp_path):
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=3, out_dir=str(tmp_path)))
    result = trainer.fit(REG_TRAIN[:32], REG_VAL)
    lines = (tmp_path / 'metrics.jsonl').read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r['epoch'] for r in records] == [0, 1, 2]
    assert records == result.history
    csv_rows = (tmp_path / 'metrics.csv').read_text().splitlines()
    assert csv_rows[0].split(',') == list(records[0])
    assert len(csv_rows) == 4
    summary = json.loads((tmp_path / 'result.json').read_text())
    assert summary['best_epoch'] == result.best_epoch and summary['config']['epochs'] == 3

    raw = torch.load(tmp_path / 'checkpoint.pt', weights_only=True)  # plain tensors/containers
    assert raw['kind'] == 'train' and raw['epoch'] == 2 and raw['task_type'] == 'regression'
    assert {'model', 'optimizer', 'scheduler', 'normalizer', 'config', 'rng', 'best_model',
            'history'} <= set(raw)
    assert raw['scheduler']['last_epoch'] == 3 * 2  # 2 steps per epoch
    assert raw['config'] == trainer.config.to_dict()
    torch.load(tmp_path / 'best.pt', weights_only=True)
    assert sorted(os.listdir(tmp_path)) == ['best.pt', 'checkpoint.pt', 'metrics.csv',
                                           'metrics.jsonl', 'result.json']  # no temp files

    fresh = Trainer(H.ToyDeepSets(3, 2), config())
    fresh.load_weights(tmp_path / 'best.pt')
    assert fresh.evaluate(REG_VAL) == pytest.approx(trainer.evaluate(REG_VAL))


# --------------------------------------------------------------------------------------------------
# Checkpoints and resume
# --------------------------------------------------------------------------------------------------
def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / 'ckpt.pt'
    save_checkpoint({'x': torch.tensor([1.0])}, path)

    def failing_save(obj, f, *args, **kwargs):
        f.write(b'half a checkpoint')
        raise OSError('disk full')

    monkeypatch.setattr(torch, 'save', failing_save)
    with pytest.raises(OSError, match='disk full'):
        save_checkpoint({'x': torch.tensor([2.0])}, path)
    with pytest.raises(OSError, match='disk full'):
        save_checkpoint({'x': torch.tensor([3.0])}, tmp_path / 'new.pt')
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ['ckpt.pt']  # no partial file, no temp file left behind
    assert torch.equal(torch.load(path, weights_only=True)['x'], torch.tensor([1.0]))


def _resume_run(out_dir, crash_at=None, resume=None, init_seed=0, device='cpu',
                on_epoch=None, **options):
    seed_everything(init_seed)
    model = H.ToyDeepSets(3, 2, dropout=0.3)  # dropout: the random streams must be restored too
    cfg = config(**dict(dict(epochs=5, warmup_epochs=1, patience=10, restore_best=False,
                             out_dir=None if out_dir is None else str(out_dir), resume=resume,
                             device=device), **options))
    trainer = Trainer(model, cfg)
    ran = []
    original = trainer._train_epoch

    def train_epoch(loader, epoch):
        if epoch == crash_at:
            raise RuntimeError('simulated crash')
        ran.append(epoch)
        if on_epoch is not None:
            on_epoch(epoch)
        return original(loader, epoch)

    trainer._train_epoch = train_epoch
    return trainer, trainer.fit(REG_TRAIN[:48], REG_VAL[:16]), ran


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason='CUDA not available'))])
def test_resume_matches_uninterrupted_run(tmp_path, device):
    # (on CUDA: pinned loaders, and the CUDA random streams saved and restored with the run)
    full, full_result, _ = _resume_run(tmp_path / 'full', device=device)

    with pytest.raises(RuntimeError, match='simulated crash'):
        _resume_run(tmp_path / 'crashed', crash_at=3, device=device)
    checkpoint = tmp_path / 'crashed' / 'checkpoint.pt'
    assert load_checkpoint(checkpoint)['epoch'] == 2

    resumed, resumed_result, ran = _resume_run(tmp_path / 'crashed', resume=str(checkpoint),
                                               init_seed=123,  # different init: weights loaded
                                               device=device)
    assert ran == [3, 4]  # continues at the next epoch
    if device == 'cpu':
        assert_same_params(params(resumed.model), params(full.model))
        assert strip_times(resumed_result.history) == strip_times(full_result.history)
    else:
        # CUDA sums scattered rows with atomic adds, whose order varies from run to run, so
        # even two uninterrupted runs differ in the last bits; a random stream not restored
        # (other dropout masks) would move the weights by orders of magnitude more than this
        a, b = params(resumed.model), params(full.model)
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k: (
                f'{k}: largest difference {(a[k] - b[k]).abs().max().item():.3g}; {m}'))
        assert len(resumed_result.history) == len(full_result.history)
        for got, want in zip(strip_times(resumed_result.history),
                             strip_times(full_result.history)):
            assert got.keys() == want.keys()
            for key in got:
                assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    assert resumed_result.best_epoch == full_result.best_epoch
    lines = (tmp_path / 'crashed' / 'metrics.jsonl').read_text().splitlines()
    assert [json.loads(line)['epoch'] for line in lines] == [0, 1, 2, 3, 4]


def test_a_resumed_run_rewrites_its_logs_and_best_weights_from_the_checkpoint(tmp_path):
    # each epoch writes best.pt, checkpoint.pt, then the logs: a kill between them leaves the
    # logs an epoch behind (a run resumed with no epoch left never rewrote them) or best.pt of
    # an epoch the resumed run trains again
    _, full_result, _ = _resume_run(tmp_path / 'run', epochs=3)
    out = tmp_path / 'run'
    checkpoint = load_checkpoint(out / 'checkpoint.pt')
    want_best = torch.load(out / 'best.pt', weights_only=True)
    lines = (out / 'metrics.jsonl').read_text().splitlines()
    (out / 'metrics.jsonl').write_text('\n'.join(lines[:2]) + '\n')  # the last epoch's lost
    stale = dict(want_best, model={k: torch.zeros_like(v) for k, v in want_best['model'].items()})
    torch.save(stale, out / 'best.pt')  # ahead of the checkpoint
    _, resumed, ran = _resume_run(out, resume=str(out / 'checkpoint.pt'), epochs=3)
    assert ran == []  # nothing left to train
    assert [json.loads(line)['epoch'] for line in
            (out / 'metrics.jsonl').read_text().splitlines()] == [0, 1, 2]
    best = torch.load(out / 'best.pt', weights_only=True)
    assert best['epoch'] == checkpoint['best_epoch'] == want_best['epoch']
    assert_same_params(best['model'], checkpoint['best_model'])
    assert best['metrics'] == want_best['metrics']  # as the epoch's validation wrote them
    assert resumed.best_epoch == full_result.best_epoch


def test_a_finished_run_extended_on_resume_takes_the_new_schedules_rate(tmp_path):
    # a finished run's optimiser holds the cosine's last rate, 0: resumed with more epochs, its
    # next epoch trains at the new schedule's rate for that step, as an uninterrupted run of
    # the new length does (it trained a first extended epoch at 0)
    data, val = REG_TRAIN[:32], REG_VAL[:8]
    Trainer(H.ToyDeepSets(3, 2), config(epochs=2, warmup_epochs=1,
                                        out_dir=str(tmp_path / 'run'))).fit(data, val)
    extended = Trainer(H.ToyDeepSets(3, 2), config(
        epochs=4, warmup_epochs=1, out_dir=str(tmp_path / 'run'),
        resume=str(tmp_path / 'run' / 'checkpoint.pt'))).fit(data, val)
    longer = Trainer(H.ToyDeepSets(3, 2), config(epochs=4, warmup_epochs=1)).fit(data, val)
    assert [r['epoch'] for r in extended.history] == [0, 1, 2, 3]
    got = [r['lr'] for r in extended.history[2:]]
    assert got[0] > 0 and got == pytest.approx([r['lr'] for r in longer.history[2:]])
    # a changed base rate and weight decay are taken too (the optimiser state held the saved)
    base = config(epochs=4, warmup_epochs=1).lr
    trainer = Trainer(H.ToyDeepSets(3, 2), config(
        epochs=6, warmup_epochs=1, lr=2 * base, weight_decay=0.5, out_dir=str(tmp_path / 'run'),
        resume=str(tmp_path / 'run' / 'checkpoint.pt')))
    again = trainer.fit(data, val)
    doubled = Trainer(H.ToyDeepSets(3, 2), config(epochs=6, warmup_epochs=1,
                                                  lr=2 * base)).fit(data, val)
    assert [r['lr'] for r in again.history[4:]] == pytest.approx(
        [r['lr'] for r in doubled.history[4:]])
    assert trainer.optimizer.param_groups[0]['weight_decay'] == 0.5


def test_stop_by_stops_between_epochs_and_the_run_resumes_exactly(tmp_path):
    from torch_mz.train import DistInfo, TrainingStopped, stop_by
    # checkpoints every 3 epochs: the stop writes its own
    full, full_result, _ = _resume_run(tmp_path / 'full', checkpoint_every=3)
    now = [0.0]

    def tick(epoch):  # each epoch takes 10 s on this clock
        now[0] += 10.0
    # the deadline falls inside epoch 1: the run stops when it ends, not before, not later
    with stop_by(15.0, clock=lambda: now[0]):
        with pytest.raises(TrainingStopped) as stopped:
            _resume_run(tmp_path / 'cut', on_epoch=tick, checkpoint_every=3)
    assert stopped.value.epoch == 1
    checkpoint = tmp_path / 'cut' / 'checkpoint.pt'
    assert stopped.value.checkpoint == str(checkpoint)
    assert load_checkpoint(checkpoint)['epoch'] == 1
    # the stop ends with the block: resumed elsewhere (only the checkpoint and best.pt, as a
    # clone carries them), the run continues at epoch 2 and ends as the uninterrupted one
    clone = tmp_path / 'clone'
    clone.mkdir()
    for name in ('checkpoint.pt', 'best.pt'):
        shutil.copy(tmp_path / 'cut' / name, clone / name)
    resumed, resumed_result, ran = _resume_run(clone, resume=str(clone / 'checkpoint.pt'),
                                               init_seed=123, checkpoint_every=3)
    assert ran == [2, 3, 4]
    assert_same_params(params(resumed.model), params(full.model))
    assert strip_times(resumed_result.history) == strip_times(full_result.history)
    assert [json.loads(line)['epoch'] for line in
            (clone / 'metrics.jsonl').read_text().splitlines()] == [0, 1, 2, 3, 4]

    # past the deadline at the last epoch there is nothing to stop: the run finishes
    now[0] = 0.0
    with stop_by(1.0, clock=lambda: now[0]):
        _, last, ran = _resume_run(tmp_path / 'late', on_epoch=tick, epochs=1)
    assert ran == [0] and last.epochs_run == 1
    # a run with nowhere to write a checkpoint is not stopped (that would only lose it)
    now[0] = 0.0
    with stop_by(1.0, clock=lambda: now[0]):
        _, kept_on, ran = _resume_run(None, on_epoch=tick)
    assert ran == [0, 1, 2, 3, 4] and kept_on.epochs_run == 5
    # not under DDP: its processes could disagree on the time
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=1))
    trainer.dist = DistInfo(rank=0, world_size=2)
    with stop_by(1.0, clock=lambda: 0.0):
        with pytest.raises(ValueError, match='not for distributed training'):
            trainer.fit(REG_TRAIN[:16], REG_VAL[:8])
    # stop_by(None) sets no deadline
    with stop_by(None):
        _, whole, _ = _resume_run(tmp_path / 'none', epochs=2)
    assert whole.epochs_run == 2


def test_missing_or_corrupt_checkpoint_raises_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match='does not exist'):
        load_checkpoint(tmp_path / 'nope.pt')
    assert issubclass(CheckpointError, ValueError)

    garbage = tmp_path / 'garbage.pt'
    garbage.write_bytes(b'\x00not a checkpoint' * 10)
    with pytest.raises(CheckpointError, match='could not be read'):
        load_checkpoint(garbage)

    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=1, out_dir=str(tmp_path / 'run')))
    trainer.fit(REG_TRAIN[:16], REG_VAL[:8])
    good = (tmp_path / 'run' / 'checkpoint.pt').read_bytes()
    truncated = tmp_path / 'truncated.pt'
    truncated.write_bytes(good[:len(good) // 2])
    with pytest.raises(CheckpointError, match='could not be read'):
        load_checkpoint(truncated)

    state = torch.load(tmp_path / 'run' / 'checkpoint.pt', weights_only=True)
    for version in ('2', 1.5, None):  # a version that is not an integer: named, not a TypeError
        odd = tmp_path / 'odd_version.pt'
        torch.save(dict(state, version=version), odd)
        with pytest.raises(CheckpointError, match=f'has version {version!r}; expected an int'):
            load_checkpoint(odd)

    foreign = tmp_path / 'foreign.pt'
    torch.save({'weights': torch.zeros(2)}, foreign)
    with pytest.raises(CheckpointError, match='not a torch_mz training checkpoint'):
        load_checkpoint(foreign)

    unsafe = tmp_path / 'unsafe.pt'
    torch.save({'format': 'torch_mz.train', 'obj': torch.nn.Linear(1, 1)}, unsafe)  # a module
    with pytest.raises(CheckpointError, match='weights-only') as info:
        load_checkpoint(unsafe)
    # one line, which names the object and does not pass on torch's advice to load the file
    # with weights_only=False (which would run code from it)
    message = str(info.value)
    assert '\n' not in message and 'weights_only' not in message
    assert 'holds objects other than tensors' in message and 'Linear' in message
    garbage = tmp_path / 'pickled_garbage.pt'
    garbage.write_bytes(b'garbage')  # the weights-only unpickler refuses it: said so, plainly
    with pytest.raises(CheckpointError, match='the weights-only unpickler refused it') as info:
        load_checkpoint(garbage)
    assert 'weights_only' not in str(info.value) and 'holds objects' not in str(info.value)

    # resuming needs the full training state, not the model-only best.pt
    with pytest.raises(CheckpointError, match='model weights only'):
        Trainer(H.ToyDeepSets(3, 2), config(resume=str(tmp_path / 'run' / 'best.pt'))).fit(
            REG_TRAIN[:16])
    with pytest.raises(CheckpointError, match='does not fit this model'):
        Trainer(H.ToyDeepSets(3, 2, hidden=8), config()).load_weights(tmp_path / 'run/best.pt')
    with pytest.raises(CheckpointError, match='task_type'):
        Trainer(H.ToyDeepSets(3, 2), config(), 'classification').load_weights(
            tmp_path / 'run' / 'best.pt')
    with pytest.raises(CheckpointError, match='does not exist'):
        Trainer(H.ToyDeepSets(3, 2), config(resume=str(tmp_path / 'nope.pt'))).fit(REG_TRAIN)


def test_checkpoint_records_run_info_and_refuses_another_run(tmp_path):
    run = {'task': {'name': 'max', 'args': {'d': 3, 'set_size': (2, 5)}},
           'model': {'name': 'toy', 'args': {}}}
    out = tmp_path / 'run'
    Trainer(H.ToyDeepSets(3, 2), config(epochs=1, out_dir=str(out)), run_info=run).fit(
        REG_TRAIN[:16], REG_VAL[:8])
    stored = {'task': {'name': 'max', 'args': {'d': 3, 'set_size': [2, 5]}},
              'model': {'name': 'toy', 'args': {}}}  # JSON values: the tuple became a list
    for name in ('checkpoint.pt', 'best.pt'):
        assert torch.load(out / name, weights_only=True)['run_info'] == stored
    resume = str(out / 'checkpoint.pt')

    # another task (same shapes, so the weights would load) or other model options: refused
    other_task = dict(run, task={'name': 'sum', 'args': {'d': 3, 'set_size': (2, 5)}})
    other_model = dict(run, model={'name': 'toy', 'args': {'dropout': 0.0}})
    for info, match in ((other_task, "task 'max'.*not by this one.*task 'sum'"),
                        (other_model, "dropout=0.0")):
        with pytest.raises(CheckpointError, match=match):
            Trainer(H.ToyDeepSets(3, 2), config(epochs=2, resume=resume), run_info=info).fit(
                REG_TRAIN[:16], REG_VAL[:8])
    # the same run (a tuple or a list alike) continues
    result = Trainer(H.ToyDeepSets(3, 2), config(epochs=2, resume=resume),
                     run_info=stored).fit(REG_TRAIN[:16], REG_VAL[:8])
    assert result.epochs_run == 2
    # a trainer that does not say what it trains is not compared
    assert Trainer(H.ToyDeepSets(3, 2), config(epochs=2, resume=resume)).fit(
        REG_TRAIN[:16], REG_VAL[:8]).epochs_run == 2


def test_checkpoint_without_run_info_still_resumes(tmp_path):
    out = tmp_path / 'old'
    Trainer(H.ToyDeepSets(3, 2), config(epochs=1, out_dir=str(out))).fit(REG_TRAIN[:16],
                                                                         REG_VAL[:8])
    state = torch.load(out / 'checkpoint.pt', weights_only=True)
    del state['run_info']  # as written before checkpoints recorded it
    save_checkpoint(state, out / 'checkpoint.pt')
    run = {'task': {'name': 'max', 'args': {}}, 'model': {'name': 'toy', 'args': {}}}
    result = Trainer(H.ToyDeepSets(3, 2), config(epochs=2, resume=str(out / 'checkpoint.pt')),
                     run_info=run).fit(REG_TRAIN[:16], REG_VAL[:8])
    assert result.epochs_run == 2


def test_resume_computes_with_the_tanh_the_run_chose(tmp_path, monkeypatch, caplog):
    r"""A checkpoint records auto mode's tanh choice (torch_mz.nn.fused.tanh_kernel_faster),
    and a resumed run in a process that has not chosen takes it over, so that it computes with
    the same function; a process that has chosen otherwise keeps its choice and warns."""
    from torch_mz.nn import fused
    out = tmp_path / 'run'
    monkeypatch.setattr(fused, '_TANH_FASTER', False)  # as measured in the first process
    Trainer(H.ToyDeepSets(3, 2), config(epochs=1, out_dir=str(out))).fit(REG_TRAIN[:16],
                                                                         REG_VAL[:8])
    assert load_checkpoint(out / 'checkpoint.pt')['tanh_kernel'] is False
    resume = config(epochs=2, resume=str(out / 'checkpoint.pt'))
    monkeypatch.setattr(fused, '_TANH_FASTER', None)  # a new process, nothing chosen yet
    Trainer(H.ToyDeepSets(3, 2), resume).fit(REG_TRAIN[:16], REG_VAL[:8])
    assert fused.tanh_kernel_faster() is False
    monkeypatch.setattr(fused, '_TANH_FASTER', True)  # chosen otherwise (e.g. by the variable)
    with caplog.at_level('WARNING'):
        Trainer(H.ToyDeepSets(3, 2), resume).fit(REG_TRAIN[:16], REG_VAL[:8])
    assert fused.tanh_kernel_faster() is True
    assert "trained with ATen's tanh, this process runs the compiled" in caplog.text


@pytest.mark.parametrize('info', [{'task': object()}, {'lr': math.nan}, ['task']])
def test_run_info_must_be_json_values(info):
    with pytest.raises(ValueError, match='run_info'):
        Trainer(H.ToyDeepSets(3, 2), config(), run_info=info)


# --------------------------------------------------------------------------------------------------
# Seeds, devices, configuration
# --------------------------------------------------------------------------------------------------
def test_seed_everything_reproduces_all_generators():
    import random

    def draw():
        return random.random(), float(np.random.rand()), torch.rand(3).tolist()

    seed_everything(7)
    first = draw()
    seed_everything(7)
    assert draw() == first
    seed_everything(8)
    assert draw()[0] != first[0]


def test_predict_and_train_name_what_is_wrong_with_their_data():
    model = H.ToyDeepSets(3, 2)
    with pytest.raises(ValueError, match='empty dataset'):
        predict(model, [])
    with pytest.raises(ValueError, match=r'for a single set pass \[data\]'):
        predict(model, REG_TRAIN[0])
    labels = [Data(x=torch.randn(4, 3), y=torch.tensor([k % 5])) for k in range(16)]
    with pytest.raises(ValueError, match=r'Class labels must be in \[0, 3\) for a model with 3 '
                                         r'outputs; the batch holds labels from 0 to 4'):
        Trainer(H.ToyDeepSets(3, 3), config(epochs=1), 'classification').fit(labels)
    labels = [Data(x=torch.randn(4, 3), y=torch.tensor([k % 3 - 1])) for k in range(16)]
    with pytest.raises(ValueError, match='labels from -1 to 1'):
        Trainer(H.ToyDeepSets(3, 3), config(epochs=1), 'classification').fit(labels)


def test_resolve_device():
    expected = 'cuda' if torch.cuda.is_available() else 'cpu'
    assert resolve_device('auto').type == expected
    assert resolve_device('cpu') == torch.device('cpu')
    with pytest.raises(ValueError, match='device'):
        resolve_device('not-a-device')
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match='CUDA is not available'):
            resolve_device('cuda')


@pytest.mark.parametrize('kwargs', [
    {'epochs': 0}, {'batch_size': 0}, {'lr': -1.0}, {'warmup_epochs': 200},
    {'schedule': 'linear'}, {'grad_clip': 0.0}, {'patience': 0}, {'checkpoint_every': -1},
    # types: a string or a fraction where a count belongs, a non-finite rate, a bool
    {'epochs': '2'}, {'lr': '1e-3'}, {'epochs': 1.5}, {'warmup_epochs': 0.5},
    {'epochs': True}, {'grad_clip': float('nan')}, {'weight_decay': float('inf')},
    {'patience': -3}, {'seed': 2 ** 63}, {'seed': -2 ** 63 - 1},
])
def test_config_validation(kwargs):
    with pytest.raises(ValueError, match='TrainConfig'):
        TrainConfig(**kwargs)


@pytest.mark.parametrize('obj,params_of', [
    (TrainConfig, TrainConfig), (Trainer, Trainer.__init__), (predict, predict),
    (cosine_with_warmup, cosine_with_warmup), (seed_everything, seed_everything),
    (TargetNormalizer, TargetNormalizer.__init__),
])
def test_documented_arguments_match_signature(obj, params_of):
    import inspect
    import re
    documented = re.findall(r'^\s{8}(\w+) \(', obj.__doc__.split('Args:')[1].split('Returns:')[0]
                            .split('Shapes:')[0], flags=re.M)
    actual = [p for p in inspect.signature(params_of).parameters if p != 'self']
    assert documented == actual


def test_config_defaults_follow_the_paper():
    c = TrainConfig()
    assert (c.lr, c.weight_decay, c.warmup_epochs, c.grad_clip, c.patience, c.batch_size) == (
        1e-4, 1e-5, 5, 1.0, 20, 128)
    assert c.device == 'auto'
    with pytest.raises(ValueError, match='task_type'):
        Trainer(H.ToyDeepSets(3, 2), config(), task_type='ranking')


# --------------------------------------------------------------------------------------------------
# Distributed data parallel
# --------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not (torch.distributed.is_available()
                         and torch.distributed.is_gloo_available()), reason='needs gloo')
def test_ddp_two_processes_on_cpu(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get('PYTHONPATH'))
                                          if p))
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
        env.pop(key, None)
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
           str(HERE / '_ddp_worker.py'), str(tmp_path)]
    # own session, so that on a timeout the launcher and both ranks are killed together
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=H.WORKER_TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f'torchrun did not finish in time:\n{output[-6000:]}')
    assert proc.returncode == 0, output[-6000:]

    r0 = torch.load(tmp_path / 'rank0.pt', weights_only=True)
    r1 = torch.load(tmp_path / 'rank1.pt', weights_only=True)
    assert (r0['world_size'], r1['world_size'], r0['backend']) == (2, 2, 'gloo')
    assert_same_params(r0['params'], r1['params'])  # ranks agree bit for bit
    assert r0['metrics'] == r1['metrics']  # all-reduced: every rank reports the global value
    assert strip_times(r0['history']) == strip_times(r1['history'])

    # rank 0 wrote the logs and checkpoints; best.pt holds the final (restored) weights
    run = tmp_path / 'run'
    assert len((run / 'metrics.jsonl').read_text().splitlines()) == H.DDP_EPOCHS
    assert_same_params(load_checkpoint(run / 'best.pt')['model'], r0['params'])

    # the all-reduced metric over 2 shards equals the metric over the whole val set in 1 process
    train_ds, val_ds = H.ddp_data()
    single = Trainer(H.ToyDeepSets(3, 2), config())
    single.load_weights(run / 'best.pt')
    whole = single.evaluate(val_ds)
    assert whole == pytest.approx(r0['metrics'], rel=1e-5)

    # 2 ranks x batch b == 1 process x batch 2b: same samples per step, averaged gradients
    seed_everything(0)
    reference = Trainer(H.ToyDeepSets(3, 2),
                        config(epochs=H.DDP_EPOCHS, batch_size=2 * H.DDP_BATCH_PER_RANK))
    ref_result = reference.fit(train_ds, val_ds)
    for k, v in params(reference.model).items():
        assert torch.allclose(v, r0['params'][k], atol=1e-5), k
    assert [r['val_loss'] for r in ref_result.history] == pytest.approx(
        [r['val_loss'] for r in r0['history']], rel=1e-4)


def test_a_non_finite_validation_loss_stops_training_as_diverged(tmp_path):
    # a validation set with an infinite input: the training loss stays finite, the validation
    # loss is not; before, such a run trained on for its patience with no best epoch and
    # reported success with NaN test figures
    from torch_mz.train import TrainingDiverged
    bad_val = [d.clone() for d in REG_VAL]
    bad_val[3].x = bad_val[3].x.clone()
    bad_val[3].x[0, 0] = float('inf')
    seed_everything(0)
    with pytest.raises(TrainingDiverged) as info:
        train(H.ToyDeepSets(3, 2), REG_TRAIN, bad_val, config=config(out_dir=str(tmp_path)),
              task_type='regression')
    assert info.value.split == 'validation' and info.value.epoch == 0
    assert not math.isfinite(info.value.loss)
    assert str(info.value).startswith('Validation loss is ') and 'in epoch 0;' in str(info.value)
    assert isinstance(info.value, FloatingPointError)


def test_class_labels_trained_as_regression_name_task_type():
    with pytest.raises(ValueError, match="task_type='classification'"):
        train(H.ToyDeepSets(3, 3), CLS_TRAIN, config=config(epochs=1), task_type='regression')
