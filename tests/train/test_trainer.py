import copy
import json
import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch_geometric.data import Data

from torch_mz.train import (TargetNormalizer, TargetUnits, Trainer, attach_normalizer,
                            carried_normalizer, detach_normalizer, load_checkpoint, predict,
                            seed_everything, train)

from tests.train._common import (H, REG_TRAIN, REG_VAL, CLS_TRAIN, CLS_VAL, config, targets, params,
                                 strip_times, assert_same_params)


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


def test_an_improvement_must_exceed_min_delta():
    # as TrainConfig documents it: a decrease of exactly min_delta is no improvement
    curve = [4.0, 3.5, 3.0, 2.75, 2.5, 1.0]  # 3.5 and 2.5 are exactly 0.5 below 4.0 and 3.0
    seed_everything(0)
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=6, patience=2, min_delta=0.5))
    calls = []

    def scripted_evaluate(dataset):  # called once after each training epoch
        calls.append(dataset)
        return {'loss': curve[len(calls) - 1]}

    trainer.evaluate = scripted_evaluate
    result = trainer.fit(REG_TRAIN[:32], REG_VAL)
    assert result.best_epoch == 2 and result.best_val_loss == 3.0
    assert result.stopped_early and result.epochs_run == 5
    # (so the best epoch is not that of the lowest loss, 2.5 at epoch 4, as TrainResult says)
    assert min(r['val_loss'] for r in result.history) == 2.5


def test_a_seed_whose_last_rank_passes_2_to_the_32_is_refused():
    # rank 1 of seed 2**32 - 1 seeded torch with 2**32, whose low 32 bits are seed 0's
    from torch_mz.train.runtime import DistInfo
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=1, warmup_epochs=0, seed=2 ** 32 - 1))
    trainer.dist = DistInfo(rank=1, world_size=2, local_rank=0)  # as under torchrun
    with pytest.raises(ValueError, match=r'Expected seed \+ max\(world_size, epochs\) <= '
                                         r'2\*\*32 .*got seed 4294967295 with world_size 2'):
        trainer.fit(REG_TRAIN[:32])
    trainer.dist = DistInfo()  # one process: the largest seed is taken
    assert trainer.fit(REG_TRAIN[:32]).epochs_run == 1
    # the shuffling of epoch e seeds with seed + e: epoch 1 of seed 2**32 - 1 drew the order of
    # epoch 0 of seed 0 (found by the review), so two epochs of the largest seed are refused
    two = Trainer(H.ToyDeepSets(3, 2), config(epochs=2, warmup_epochs=0, seed=2 ** 32 - 1))
    with pytest.raises(ValueError, match=r'with world_size 1 and 2 epochs'):
        two.fit(REG_TRAIN[:32])
    fits = Trainer(H.ToyDeepSets(3, 2), config(epochs=2, warmup_epochs=0, seed=2 ** 32 - 2))
    assert fits.fit(REG_TRAIN[:32]).epochs_run == 2


@pytest.mark.parametrize('restore_best', [True, False])
def test_the_result_says_which_epoch_the_model_and_its_test_metrics_are_of(tmp_path,
                                                                          restore_best):
    # with restore_best=False, val_metrics and best_epoch were the best epoch's while the model
    # (and test_metrics) were the last epoch's, and result.json did not say so
    curve = [3.0, 2.0, 2.5]  # best at epoch 1
    seed_everything(0)
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=3, warmup_epochs=0, patience=None,
                                                 restore_best=restore_best,
                                                 out_dir=str(tmp_path)))
    calls = []

    def scripted_evaluate(dataset):  # after each epoch, then on the test set
        calls.append(dataset)
        return {'loss': curve[len(calls) - 1] if len(calls) <= 3 else 0.0}

    trainer.evaluate = scripted_evaluate
    result = trainer.fit(REG_TRAIN[:32], REG_VAL, REG_VAL[:8])
    assert result.best_epoch == 1 and result.val_metrics == {'loss': 2.0}
    assert result.model_epoch == (1 if restore_best else 2)
    assert json.loads((tmp_path / 'result.json').read_text())['model_epoch'] == result.model_epoch
    # without a validation set the model is the last epoch's, which is the best
    alone = Trainer(H.ToyDeepSets(3, 2), config(epochs=2, warmup_epochs=0,
                                                restore_best=restore_best)).fit(REG_TRAIN[:32])
    assert alone.model_epoch == alone.best_epoch == 1


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


def test_predict_and_train_name_what_is_wrong_with_their_data():
    model = H.ToyDeepSets(3, 2)
    with pytest.raises(ValueError, match='empty dataset'):
        predict(model, [])
    with pytest.raises(ValueError, match=r'for a single set pass \[data\]'):
        predict(model, REG_TRAIN[0])
    # a DataLoader failed inside the batching, a list of Batch objects with an error about set
    # ids: both named now
    from torch_geometric.data import Batch
    from torch_geometric.loader import DataLoader
    with pytest.raises(ValueError, match='not a DataLoader'):
        predict(model, DataLoader(REG_TRAIN[:4], batch_size=2))
    with pytest.raises(ValueError, match='not a list of Batch objects'):
        predict(model, [Batch.from_data_list(REG_TRAIN[:4])])
    labels = [Data(x=torch.randn(4, 3), y=torch.tensor([k % 5])) for k in range(16)]
    with pytest.raises(ValueError, match=r'Class labels must be in \[0, 3\) for a model with 3 '
                                         r'outputs; the batch holds labels from 0 to 4'):
        Trainer(H.ToyDeepSets(3, 3), config(epochs=1), 'classification').fit(labels)
    labels = [Data(x=torch.randn(4, 3), y=torch.tensor([k % 3 - 1])) for k in range(16)]
    with pytest.raises(ValueError, match='labels from -1 to 1'):
        Trainer(H.ToyDeepSets(3, 3), config(epochs=1), 'classification').fit(labels)


class _InfiniteInEval(torch.nn.Module):
    r"""A toy model whose outputs are finite in training and infinite in eval mode."""
    def __init__(self):
        super().__init__()
        self.inner = H.ToyDeepSets(3, 2)

    def forward(self, batch):
        out = self.inner(batch)
        return out if self.training else out + float('inf')


def test_a_non_finite_validation_loss_stops_training_as_diverged(tmp_path):
    # the training loss stays finite, the validation loss is not; before, such a run trained on
    # for its patience with no best epoch and reported success with NaN test figures
    from torch_mz.train import TrainingDiverged
    seed_everything(0)
    with pytest.raises(TrainingDiverged) as info:
        train(_InfiniteInEval(), REG_TRAIN, REG_VAL, config=config(out_dir=str(tmp_path)),
              task_type='regression')
    assert info.value.split == 'validation' and info.value.epoch == 0
    assert not math.isfinite(info.value.loss)
    assert str(info.value).startswith('Validation loss is ') and 'in epoch 0;' in str(info.value)
    assert isinstance(info.value, FloatingPointError)


def test_a_split_with_nan_is_refused_before_training(tmp_path):
    # the test loss is computed only after training, so a NaN target there gave NaN test
    # figures for a run that otherwise succeeded; a NaN in the training or validation data
    # showed only after a whole epoch, as a divergence that suggested a lower learning rate
    # (a NaN training target: "Expected finite targets to fit the normaliser", no example
    # named). Every split is refused before the first epoch now, the example named
    for split in ('training', 'validation', 'test'):
        for key in ('y', 'x'):
            sets = {'training': list(REG_TRAIN), 'validation': list(REG_VAL),
                    'test': list(REG_VAL[:8])}
            sets[split] = [d.clone() for d in sets[split]]
            value = getattr(sets[split][5], key).clone()
            value.view(-1)[0] = float('nan')
            setattr(sets[split][5], key, value)
            with pytest.raises(ValueError, match=f"{split} dataset's example 5 holds NaN or "
                               f"inf in '{key}'"):
                train(H.ToyDeepSets(3, 2), sets['training'], sets['validation'], sets['test'],
                      config=config(out_dir=str(tmp_path / split / key)),
                      task_type='regression')
            assert not os.path.exists(tmp_path / split / key)  # before training: nothing
    # the pass over the test set comes before the seeding: a test set whose items draw random
    # numbers (a random transform) leaves the random state training starts from unchanged
    class Drawing(list):
        def __getitem__(self, i):
            torch.rand(1)
            return list.__getitem__(self, i)

    states = []
    original = Trainer._train_epoch

    def first_epoch(self, loader, epoch):
        states.append(torch.get_rng_state())
        return original(self, loader, epoch)
    import unittest.mock
    with unittest.mock.patch.object(Trainer, '_train_epoch', first_epoch):
        for test_set in (Drawing(REG_VAL[:8]), None):
            train(H.ToyDeepSets(3, 2), REG_TRAIN, REG_VAL, test_set, config=config(epochs=1),
                  task_type='regression')
    assert len(states) == 2 and torch.equal(states[0], states[1])


def test_class_labels_trained_as_regression_name_task_type():
    with pytest.raises(ValueError, match="task_type='classification'"):
        train(H.ToyDeepSets(3, 3), CLS_TRAIN, config=config(epochs=1), task_type='regression')


def test_load_weights_follows_the_checkpoints_normalisation(tmp_path):
    # a checkpoint trained with normalised targets, loaded by a Trainer without (or the reverse),
    # would predict in the wrong units: refused; a normaliser the Trainer (or its model)
    # carried before is never reused for a checkpoint that has none
    from torch_mz.train import CheckpointError
    runs = {}
    for norm in (True, False):
        seed_everything(0)
        out = str(tmp_path / f'norm{norm}')
        train(H.ToyDeepSets(3, 2), REG_TRAIN, REG_VAL,
              config=config(epochs=1, out_dir=out, normalize_targets=norm))
        runs[norm] = os.path.join(out, 'best.pt')
    for norm in (True, False):
        trainer = Trainer(H.ToyDeepSets(3, 2), config(normalize_targets=not norm))
        with pytest.raises(CheckpointError, match=f'normalize_targets={norm}'):
            trainer.load_weights(runs[norm])
    trainer = Trainer(H.ToyDeepSets(3, 2), config())
    trainer.load_weights(runs[True])
    normalised = trainer.predict(REG_VAL)
    raw_trainer = Trainer(H.ToyDeepSets(3, 2), config(normalize_targets=False))
    raw_trainer.normalizer = trainer.normalizer  # a stale, fitted normaliser
    raw_trainer.load_weights(runs[False])
    assert not raw_trainer.normalizer.fitted and carried_normalizer(raw_trainer.model) is None
    state = load_checkpoint(runs[False])
    plain = H.ToyDeepSets(3, 2)
    plain.load_state_dict(state['model'])
    plain.eval()
    from torch_geometric.data import Batch
    with torch.no_grad():
        expected = plain(Batch.from_data_list(list(REG_VAL)))
    expected = expected[0] if isinstance(expected, tuple) else expected
    torch.testing.assert_close(raw_trainer.predict(REG_VAL), expected)
    assert not torch.allclose(normalised, raw_trainer.predict(REG_VAL))


def test_weights_that_overflow_in_a_run_without_validation_stop_it(tmp_path):
    # the loss is taken before each step: an overflow in the epoch's last step left NaN
    # weights, a NaN checkpoint and a "successful" run when nothing validated it
    from torch_mz.train import CheckpointError, TrainingDiverged
    from torch.optim.optimizer import register_optimizer_step_post_hook
    seed_everything(0)
    out = str(tmp_path / 'run')

    def overflow(optimizer, args, kwargs):  # the step overflows a weight
        with torch.no_grad():
            optimizer.param_groups[0]['params'][0].fill_(float('inf'))
    handle = register_optimizer_step_post_hook(overflow)
    try:
        with pytest.raises(TrainingDiverged, match='weights are not finite after epoch 0') as e:
            train(H.ToyDeepSets(3, 2), REG_TRAIN[:16], None,
                  config=config(epochs=1, warmup_epochs=0, out_dir=out))
    finally:
        handle.remove()
    assert e.value.split == 'weights'
    assert not os.path.exists(os.path.join(out, 'checkpoint.pt'))
    # a checkpoint that holds such weights (written by another tool) is refused on loading
    seed_everything(0)
    good = str(tmp_path / 'good')
    train(H.ToyDeepSets(3, 2), REG_TRAIN, REG_VAL, config=config(epochs=1, out_dir=good))
    state = load_checkpoint(os.path.join(good, 'best.pt'))
    name = next(iter(state['model']))
    state['model'][name] = torch.full_like(state['model'][name], float('nan'))
    torch.save(state, str(tmp_path / 'nan.pt'))
    from torch_mz.inference import load_model
    for load in (lambda m: Trainer(m, config()).load_weights(str(tmp_path / 'nan.pt')),
                 lambda m: load_model(str(tmp_path / 'nan.pt'), model=m)):
        model = H.ToyDeepSets(3, 2)
        before = copy.deepcopy(model.state_dict())
        with pytest.raises(CheckpointError, match=f"non-finite weights.*{name}"):
            load(model)
        after = model.state_dict()  # refused before anything was loaded
        assert all(torch.equal(before[k], after[k]) for k in before)


def test_an_infinite_buffer_is_not_taken_for_diverged_weights(tmp_path):
    # a model may keep an infinite bound in a buffer: its checkpoints load and resume
    class Bounded(H.ToyDeepSets):
        def __init__(self, *args):
            super().__init__(*args)
            self.register_buffer('upper', torch.tensor(float('inf')))
    seed_everything(0)
    out = str(tmp_path / 'run')
    train(Bounded(3, 2), REG_TRAIN, REG_VAL, config=config(epochs=2, out_dir=out))
    Trainer(Bounded(3, 2), config()).load_weights(os.path.join(out, 'best.pt'))
    train(Bounded(3, 2), REG_TRAIN, REG_VAL,
          config=config(epochs=3, out_dir=out, resume=os.path.join(out, 'checkpoint.pt')))


def test_a_folder_given_as_checkpoint_names_the_files_in_it(tmp_path):
    from torch_mz.train import CheckpointError
    seed_everything(0)
    out = tmp_path / 'run'
    train(H.ToyDeepSets(3, 2), REG_TRAIN, REG_VAL, config=config(epochs=1, out_dir=str(out)))
    with pytest.raises(CheckpointError, match=r"is a folder.*best\.pt.*checkpoint\.pt"):
        load_checkpoint(str(out))
    (tmp_path / 'empty').mkdir()
    with pytest.raises(CheckpointError, match=r'is a folder.*holds no \.pt file'):
        load_checkpoint(str(tmp_path / 'empty'))


def test_resuming_with_fewer_epochs_than_were_run_is_refused(tmp_path):
    seed_everything(0)
    out = str(tmp_path / 'run')
    train(H.ToyDeepSets(3, 2), REG_TRAIN, REG_VAL, config=config(epochs=3, out_dir=out))
    with pytest.raises(ValueError, match='fewer than the 3 epochs'):
        train(H.ToyDeepSets(3, 2), REG_TRAIN, REG_VAL,
              config=config(epochs=2, out_dir=out, resume=os.path.join(out, 'checkpoint.pt')))


def test_the_r2_of_a_constant_test_target_is_zero_unless_predicted_exactly():
    # the one-pass float64 sums leave rounding's remainder as the total sum of squares of a
    # constant column, which gave R^2 = -1.7e15 (documented: 0, or 1 if predicted exactly)
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=1))
    trainer.fit(REG_TRAIN[:32])
    for n in (333, 1000):
        for value in (3.7, 12.9, -1.3):
            test = [Data(x=REG_VAL[i % len(REG_VAL)].x, y=torch.tensor([[value, value]]))
                    for i in range(n)]
            metrics = trainer.evaluate(test)
            assert metrics['r2'] == 0.0 and metrics['mse'] > 0, (n, value)


class _Oracle(torch.nn.Module):
    r"""Returns each set's standardised target, in float64, read from the batch."""
    def __init__(self, mean: float, std: float):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))
        self.mean, self.std = mean, std

    def forward(self, batch):
        return (batch.y.view(-1, 1).double() - self.mean) / self.std + 0 * self.w


def _far_float64_targets():
    r"""64 sets whose float64 targets are 1e8 + N(0, 2), and the targets stacked."""
    g = torch.Generator().manual_seed(0)
    sets = [Data(x=torch.randn(4, 3, generator=g),
                 y=(1e8 + 2 * torch.randn(1, generator=g, dtype=torch.float64)).view(1, 1))
            for _ in range(64)]
    return sets, torch.cat([d.y for d in sets])


def test_float64_targets_are_not_rounded_to_float32():
    # targets of 1e8 + N(0, 2) in float64 were rounded to float32 (spacing 8): an exact float64
    # oracle scored mse 7.2 and R^2 0.67; integer targets above 2**24 were rounded alike
    from torch_mz.train.contract import _raw_targets
    from torch_geometric.loader import DataLoader
    sets, y = _far_float64_targets()
    trainer = Trainer(_Oracle(float(y[:48].mean()), float(y[:48].std(unbiased=False))),
                      config(epochs=1, lr=0.0, warmup_epochs=0))
    result = trainer.fit(sets[:48], None, sets[48:])
    assert result.test_metrics['mse'] < 1e-12 and result.test_metrics['r2'] == 1.0
    batch = next(iter(DataLoader(sets, batch_size=64)))
    assert torch.equal(_raw_targets(batch, 'regression'), y)
    import types
    ints = types.SimpleNamespace(y=torch.tensor([2 ** 24 + 1, 2 ** 40 + 3]), num_graphs=2)
    assert _raw_targets(ints, 'regression').view(-1).tolist() == [2 ** 24 + 1, 2 ** 40 + 3]


def test_a_label_of_minus_100_is_refused_like_any_other_out_of_range_label():
    # torch's cross_entropy ignores -100 by default: such a label left the loss while the
    # accuracy counted it wrong, and a batch of them gave a NaN loss reported as a divergence
    labels = [d.clone() for d in CLS_TRAIN[:32]]
    labels[3].y = torch.tensor([-100])
    with pytest.raises(ValueError, match=r'Class labels must be in \[0, 3\).*from -100'):
        Trainer(H.ToyDeepSets(3, 3), config(epochs=1), 'classification').fit(labels)


def test_the_r2_of_a_column_far_from_zero_is_that_of_the_two_pass_variance():
    # without a normaliser the sums were not centred, and the tolerance for constant columns
    # read y = 1e4 +- 1e-2 as constant (R^2 0; the uncentred one-pass value was 0.988): the
    # targets' moments are merged batch by batch now
    g = torch.Generator().manual_seed(0)
    sets = [Data(x=torch.randn(3, 3, generator=g),
                 y=(1e4 + 1e-2 * torch.randn(1, generator=g, dtype=torch.float64)).view(1, 1))
            for _ in range(200)]
    y = torch.cat([d.y for d in sets]).view(-1)
    shift = 1e-3 * torch.randn(200, generator=g, dtype=torch.float64)  # the model's errors
    for d, s in zip(sets, shift):
        d.y_pred = d.y + s

    class Off(_Oracle):
        def forward(self, batch):
            return batch.y_pred.view(-1, 1) + 0 * self.w
    trainer = Trainer(Off(0.0, 1.0), config(batch_size=16, normalize_targets=False))
    r2 = trainer.evaluate(sets)['r2']
    two_pass = 1 - float(shift.pow(2).sum()) / float((y - y.mean()).pow(2).sum())
    assert 0.9 < two_pass < 1 and r2 == pytest.approx(two_pass, rel=1e-9)


def test_float64_targets_are_predicted_in_float64_on_every_path():
    # evaluate mapped float64 targets back in float64, but model(batch), Trainer.predict and
    # predict() did it in float32 (predictions near 1e8 were multiples of 8): a normaliser
    # fitted on float64 targets maps back in float64 everywhere; one fitted on float32 targets
    # keeps float32 predictions
    from torch_mz.train import predict
    sets, y = _far_float64_targets()

    class Float32Oracle(_Oracle):  # a float32 model, as most are (a float64 one hid the bug)
        def forward(self, batch):
            return super().forward(batch).float()
    model = Float32Oracle(float(y[:48].mean()), float(y[:48].std(unbiased=False)))
    trainer = Trainer(model, config(epochs=1, lr=0.0, warmup_epochs=0))
    trainer.fit(sets[:48])
    assert trainer.normalizer.float64
    for pred, expected in ((trainer.predict(sets), y), (predict(model, sets), y),
                           (model(sets[0]), y[:1])):
        pred = pred[0] if isinstance(pred, tuple) else pred
        assert pred.dtype == torch.float64
        assert (pred.view(-1) - expected.view(-1)).abs().max() < 1e-6
    float32 = TargetNormalizer().fit(torch.randn(10, 1))
    assert not float32.float64 and float32.inverse_transform(torch.zeros(2, 1)).dtype == \
        torch.float32
    again = TargetNormalizer().load_state_dict(trainer.normalizer.state_dict())
    assert again.float64


def test_a_loss_of_ones_own_takes_targets_in_the_outputs_precision_and_may_mask_nan():
    # float64 targets (kept for the metrics) reached a custom loss as float64 with a float32
    # output: torch's losses failed in backward; and a NaN marking a missing target, which a
    # masking loss leaves out, was refused before training
    g = torch.Generator().manual_seed(0)
    sets = [Data(x=torch.randn(4, 3, generator=g),
                 y=torch.randn(1, 2, generator=g, dtype=torch.float64)) for _ in range(32)]
    seen = []

    def huber(out, target):
        seen.append(target.dtype)
        return F.huber_loss(out, target)
    Trainer(H.ToyDeepSets(3, 2), config(epochs=1), loss_fn=huber).fit(sets)
    assert set(seen) == {torch.float32}
    for d in sets[::4]:
        d.y = d.y.clone()
        d.y[0, 1] = float('nan')

    def masked(out, target):
        keep = torch.isfinite(target)
        return F.mse_loss(out[keep], target[keep])
    for normalize in (False, True):  # (the normaliser's statistics leave the NaN out)
        trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=1, normalize_targets=normalize),
                          loss_fn=masked)
        result = trainer.fit(sets)
        assert math.isfinite(result.history[-1]['train_loss'])
    known = torch.cat([d.y for d in sets])[:, 1]
    known = known[~torch.isnan(known)]
    assert float(trainer.normalizer.mean[1]) == pytest.approx(float(known.mean()), rel=1e-12)


def _strict(text):
    # what jq or JavaScript's JSON.parse take: no bare NaN or Infinity
    def refuse(word):
        raise ValueError(f'not standard JSON: {word}')
    return json.loads(text, parse_constant=refuse)


def test_result_json_and_metrics_jsonl_are_standard_json_with_a_nan_figure(tmp_path):
    # result.json held a bare NaN for best_val_loss without a validation set, and metrics.jsonl
    # one for the validation metrics of targets a loss of one's own masks: invalid JSON for
    # strict readers (jq, JavaScript)
    Trainer(H.ToyDeepSets(3, 2), config(epochs=1, warmup_epochs=0,
                                        out_dir=str(tmp_path / 'a'))).fit(REG_TRAIN[:16])
    summary = _strict((tmp_path / 'a' / 'result.json').read_text())
    assert summary['best_val_loss'] is None and summary['best_epoch'] == 0
    val = copy.deepcopy(REG_VAL[:8])
    val[0].y = val[0].y.clone()
    val[0].y.view(-1)[0] = float('nan')

    def masked(out, target):
        keep = torch.isfinite(target)
        return F.mse_loss(out[keep], target[keep])
    result = Trainer(H.ToyDeepSets(3, 2),
                     config(epochs=1, warmup_epochs=0, out_dir=str(tmp_path / 'b')),
                     loss_fn=masked).fit(REG_TRAIN[:16], val)
    assert math.isnan(result.history[0]['val_mse'])  # (the figures in Python: as they were)
    record = _strict((tmp_path / 'b' / 'metrics.jsonl').read_text())
    assert record['val_mse'] is None and math.isfinite(record['val_loss'])
    summary = _strict((tmp_path / 'b' / 'result.json').read_text())
    assert summary['val_metrics']['mse'] is None and summary['best_val_loss'] is not None


def test_evaluating_a_model_carrying_its_normaliser_without_normalising_is_in_target_units():
    # a Trainer that does not normalise compared the standardised outputs of a model carrying
    # its normaliser with raw targets
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=2))
    trainer.fit(REG_TRAIN[:64])
    plain = Trainer(trainer.model, config(normalize_targets=False))
    assert plain.evaluate(REG_VAL)['mse'] == pytest.approx(trainer.evaluate(REG_VAL)['mse'],
                                                           rel=1e-6)


@pytest.mark.parametrize('rank', [0, 1])
def test_resume_warnings_are_said_by_the_main_process_alone(tmp_path, monkeypatch, caplog, rank):
    # what holds for every process (a changed configuration, a schedule moved to another step,
    # another number of processes, an all-warm-up run) was said once per rank under torchrun
    import warnings
    from torch_mz.train import save_checkpoint
    from torch_mz.train.runtime import DistInfo
    run = tmp_path / 'run'
    Trainer(H.ToyDeepSets(3, 2), config(epochs=1, batch_size=32, warmup_epochs=0,
                                        out_dir=str(run))).fit(REG_TRAIN[:64], REG_VAL[:8])
    state = load_checkpoint(run / 'checkpoint.pt')
    state['rng'] = state['rng'] * 2  # (as written by 2 processes)
    save_checkpoint(state, tmp_path / 'two.pt')
    # this process as rank `rank` (the rank itself stays 0: one process has no rank 1's shard)
    monkeypatch.setattr(DistInfo, 'is_main', property(lambda self: rank == 0))
    with caplog.at_level('INFO', logger='torch_mz.train.trainer'), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        Trainer(H.ToyDeepSets(3, 2), config(epochs=2, batch_size=16, warmup_epochs=2, lr=2e-2,
                                            resume=str(tmp_path / 'two.pt'))).fit(
            REG_TRAIN[:64], REG_VAL[:8])
    said = [caplog.text.count(m) for m in ('changed configuration', 'goes on from there',
                                           'written with 2 process(es), now 1', 'Resumed from')]
    warm_up = sum('is warm-up' in str(w.message) for w in caught)
    assert (said, warm_up) == (([1, 1, 1, 1], 1) if rank == 0 else ([0, 0, 0, 0], 0))


def test_resuming_an_egnn_run_that_recorded_feature_columns_beside_pos_dim(tmp_path):
    # build_model ignored an EGNN's feature_columns beside pos_dim (it refuses them now) and
    # recorded them: the run could not be resumed with its model built now ("written by
    # another run", the same model)
    from torch_mz.models import build_model
    from torch_mz.train import CheckpointError

    def egnn():
        return build_model('egnn', 3, 2, pos_dim=3, hidden_channels=8, num_layers=1)
    model = egnn()
    model.build_info['feature_columns'] = [0]  # (as build_model recorded them then)
    run = tmp_path / 'run'
    Trainer(model, config(epochs=1, warmup_epochs=0, out_dir=str(run))).fit(REG_TRAIN[:32],
                                                                            REG_VAL[:8])
    result = Trainer(egnn(), config(epochs=2, warmup_epochs=0, out_dir=str(run),
                                    resume=str(run / 'checkpoint.pt'))).fit(REG_TRAIN[:32],
                                                                            REG_VAL[:8])
    assert result.epochs_run == 2
    # another model is still refused
    other = build_model('egnn', 3, 2, pos_dim=3, hidden_channels=16, num_layers=1)
    with pytest.raises(CheckpointError, match='written by another run'):
        Trainer(other, config(epochs=3, warmup_epochs=0, out_dir=str(run),
                              resume=str(run / 'checkpoint.pt'))).fit(REG_TRAIN[:32],
                                                                      REG_VAL[:8])


class _SetBatchNorm(torch.nn.Module):
    r"""A toy model with a batch normalisation of its set embeddings (none of the presets has
    one): a batch of one set cannot be normalised in training mode."""
    def __init__(self):
        super().__init__()
        self.inner = H.ToyDeepSets(3, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, batch):
        return self.head(self.norm(self.inner(batch)))


def test_a_last_batch_of_one_set_names_the_batch_normalisation_and_the_batch_size():
    # torch's "Expected more than 1 value per channel when training" came alone, at the end of
    # the first epoch, without the split size, the batch size or a remedy
    seed_everything(0)
    with pytest.raises(ValueError, match=r'last batch of epoch 0, the 17 training sets in '
                                         r'batches of batch_size=16 leaving one set over.*'
                                         r'\(e\.g\. 17\)'):
        train(_SetBatchNorm(), REG_TRAIN[:17], config=config(epochs=1), task_type='regression')
    train(_SetBatchNorm(), REG_TRAIN[:18], config=config(epochs=1), task_type='regression')


def test_a_batch_size_of_one_under_batch_normalisation_is_named_as_such():
    # batch_size=1 was said to leave one set over in the last batch, with "drop or add a
    # training set" for a remedy: every batch is one set there, the first one refused
    seed_everything(0)
    with pytest.raises(ValueError, match=r'refused the first batch of epoch 0: batch_size=1 '
                                         r'gives every batch one set \(of the 17 training '
                                         r'sets\)\. Choose a batch_size of at least 2 '
                                         r'\(e\.g\. 3\)$'):
        train(_SetBatchNorm(), REG_TRAIN[:17], config=config(epochs=1, batch_size=1),
              task_type='regression')


def test_evaluate_scores_the_predictions_predict_returns():
    # float32 targets near 1e6: evaluate mapped the outputs to target units in float64, predict
    # (and model(batch)) in float32, rounding to 1/16: the reported test MSE (0.1388) was not
    # that of the predictions returned (0.1365)
    seed_everything(0)
    data = H.make_regression_sets(64, seed=3, offset=1e6, scale=1.0)
    assert data[0].y.dtype == torch.float32
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=2))
    result = trainer.fit(data[:48], data[48:56], data[56:])
    test = data[56:]
    pred = trainer.predict(test)
    assert pred.dtype == torch.float32  # (the targets' precision)
    err = pred.double() - targets(test).double()
    assert result.test_metrics['mse'] == pytest.approx(err.pow(2).mean().item(), rel=1e-12)
    assert result.test_metrics['mae'] == pytest.approx(err.abs().mean().item(), rel=1e-12)
    # float64 targets: mapped, returned and scored in float64
    wide = [d.clone() for d in data]
    for d in wide:
        d.y = d.y.double()
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=1, warmup_epochs=0))
    trainer.fit(wide[:48])
    pred = trainer.predict(wide[56:])
    assert pred.dtype == torch.float64
    assert trainer.evaluate(wide[56:])['mse'] == pytest.approx(
        (pred - targets(wide[56:])).pow(2).mean().item(), rel=1e-12)
