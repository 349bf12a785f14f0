import json
import math
import os
import shutil

import numpy as np
import pytest
import torch

from tests.test_files import flip_bit_in_record
from torch_mz.train import (CheckpointError, Trainer, load_checkpoint, save_checkpoint,
                            seed_everything, train)

from tests.train._common import (H, REG_TRAIN, REG_VAL, config, params, strip_times,
                                 assert_same_params)


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


@pytest.mark.parametrize('schedule', ['step', 'epoch'])
def test_a_run_resumed_in_its_warm_up_trains_at_the_uninterrupted_runs_rates(tmp_path,
                                                                            schedule):
    # stopped after epoch 1 of a 3-epoch warm-up: every later epoch's learning rate (and so
    # its losses) is the uninterrupted run's
    options = dict(epochs=5, warmup_epochs=3, schedule=schedule)
    _, full, _ = _resume_run(tmp_path / 'full', **options)
    with pytest.raises(RuntimeError, match='simulated crash'):
        _resume_run(tmp_path / 'cut', crash_at=2, **options)
    checkpoint = tmp_path / 'cut' / 'checkpoint.pt'
    assert load_checkpoint(checkpoint)['epoch'] == 1
    _, resumed, ran = _resume_run(tmp_path / 'cut', resume=str(checkpoint), init_seed=123,
                                  **options)
    assert ran == [2, 3, 4]
    lrs = [r['lr'] for r in resumed.history]
    assert lrs == [r['lr'] for r in full.history]
    assert 0 < lrs[1] < lrs[2] < lrs[3] == config().lr > lrs[4] > 0  # warm-up, peak, decay
    assert strip_times(resumed.history) == strip_times(full.history)


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


def test_a_finished_run_resumed_to_train_on_removes_its_result_until_it_finishes(tmp_path):
    # a finished run resumed in its folder with more epochs kept its result.json: stopped
    # before it finished (here at a deadline), the file described the 2-epoch run beside a
    # checkpoint of epoch 3
    from torch_mz.train import TrainingStopped, stop_by
    run = tmp_path / 'run'
    _resume_run(run, epochs=2)
    assert json.loads((run / 'result.json').read_text())['epochs_run'] == 2
    now = [0.0]

    def tick(epoch):
        now[0] += 10.0
    with stop_by(15.0, clock=lambda: now[0]):
        with pytest.raises(TrainingStopped) as stopped:
            _resume_run(run, resume=str(run / 'checkpoint.pt'), on_epoch=tick, epochs=5)
    assert stopped.value.epoch == 3 and load_checkpoint(run / 'checkpoint.pt')['epoch'] == 3
    assert not (run / 'result.json').exists()
    _, result, ran = _resume_run(run, resume=str(run / 'checkpoint.pt'), epochs=5)
    assert ran == [4] and json.loads((run / 'result.json').read_text())['epochs_run'] == 5


def test_a_finished_run_resumed_keeps_its_result_until_a_file_goes_further(tmp_path):
    # the resume removed result.json before its first epoch: one that failed in that epoch
    # (a crash, Ctrl-C, a divergence) left the finished run's folder, unchanged, without the
    # only record of its test figures
    run = tmp_path / 'run'
    _resume_run(run, epochs=2)
    kept = (run / 'result.json').read_text()
    files = {name: (run / name).read_bytes() for name in ('checkpoint.pt', 'metrics.jsonl')}
    best = load_checkpoint(run / 'best.pt')['epoch']
    with pytest.raises(RuntimeError, match='simulated crash'):
        _resume_run(run, resume=str(run / 'checkpoint.pt'), crash_at=2, epochs=5)
    assert (run / 'result.json').read_text() == kept
    assert {name: (run / name).read_bytes() for name in files} == files
    assert load_checkpoint(run / 'best.pt')['epoch'] == best
    # checkpoints after the last epoch only: a crash in epoch 3 leaves the finished run's
    # checkpoint beside the logs of epoch 2: its result no longer describes the folder
    with pytest.raises(RuntimeError, match='simulated crash'):
        _resume_run(run, resume=str(run / 'checkpoint.pt'), crash_at=3, epochs=5,
                    checkpoint_every=0)
    assert load_checkpoint(run / 'checkpoint.pt')['epoch'] == 1
    assert not (run / 'result.json').exists()
    _, result, ran = _resume_run(run, resume=str(run / 'checkpoint.pt'), epochs=5)
    assert ran == [2, 3, 4] and json.loads((run / 'result.json').read_text())['epochs_run'] == 5


def test_a_finished_run_resumed_keeps_its_result_when_its_first_validation_fails(
        tmp_path, monkeypatch):
    # the bug: result.json went once the first resumed epoch had trained, before its
    # validation: a divergence (or Ctrl-C) there left the finished run's files unchanged but
    # its result gone
    from torch_mz.train import TrainingDiverged
    run = tmp_path / 'run'
    _resume_run(run, epochs=2)
    # (best.pt is rewritten from the checkpoint on resuming: the same epoch, other bytes)
    files = {p.name: p.read_bytes() for p in run.iterdir() if p.name != 'best.pt'}
    assert 'result.json' in files
    best = load_checkpoint(run / 'best.pt')['epoch']
    evaluate = Trainer.evaluate

    def diverging(self, dataset):
        return dict(evaluate(self, dataset), loss=math.nan)
    monkeypatch.setattr(Trainer, 'evaluate', diverging)
    with pytest.raises(TrainingDiverged):
        _resume_run(run, resume=str(run / 'checkpoint.pt'), epochs=5)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != 'best.pt'} == files
    assert load_checkpoint(run / 'best.pt')['epoch'] == best
    monkeypatch.setattr(Trainer, 'evaluate', evaluate)  # (trains on: it goes, as before)
    _, _, ran = _resume_run(run, resume=str(run / 'checkpoint.pt'), epochs=3, crash_at=None)
    assert ran == [2] and json.loads((run / 'result.json').read_text())['epochs_run'] == 3


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

    # a changed bit in a weight (which torch.load would load): the stored CRC tells
    damaged = tmp_path / 'damaged.pt'
    damaged.write_bytes(good)
    name = flip_bit_in_record(damaged, 'data/0')
    with pytest.raises(CheckpointError, match=f"damaged.pt' is damaged: its record '{name}' does "
                       f"not read back as written"):
        load_checkpoint(damaged)

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

    # fields of the wrong type (a crafted or foreign file): CheckpointError, not a TypeError
    for field, value, match in (('history', None, r'history \(NoneType\) of the wrong type'),
                                ('epoch', 'x', r'epoch \(str\) of the wrong type'),
                                ('rng', [{}], 'Random-number state .* cannot be restored'),
                                ('rng', [], 'rng or history'),
                                # (an AttributeError, or a TypeError once every epoch had run)
                                ('optimizer', None, r'optimizer \(NoneType\) of the wrong'),
                                ('model', None, r'model \(NoneType\) of the wrong type'),
                                ('scheduler', [], r'scheduler \(list\) of the wrong type'),
                                ('best_model', 'x', r'best_model \(str\) of the wrong type'),
                                # a wrong type inside them: a TypeError or AttributeError
                                ('optimizer', dict(state['optimizer'], param_groups=5),
                                 'Optimizer/scheduler state .* does not fit'),
                                ('optimizer', dict(state['optimizer'], state=[1]),
                                 'Optimizer/scheduler state .* does not fit'),
                                ('scheduler', dict(state['scheduler'], lr_lambdas=5),
                                 'Optimizer/scheduler state .* does not fit')):
        damaged = tmp_path / 'damaged.pt'
        torch.save(dict(state, **{field: value}), damaged)
        with pytest.raises(CheckpointError, match=match):
            Trainer(H.ToyDeepSets(3, 2), config(epochs=1, resume=str(damaged))).fit(
                REG_TRAIN[:16], REG_VAL[:8])

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
    monkeypatch.setattr(fused, '_ENABLED', None)  # auto mode (the choice is auto mode's)
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


@pytest.mark.parametrize('info', [{'task': object()}, {'lr': math.nan}, ['task'],
                                  {'lr': np.float32('nan')}])
def test_run_info_must_be_json_values(info):
    with pytest.raises(ValueError, match='run_info'):
        Trainer(H.ToyDeepSets(3, 2), config(), run_info=info)


def test_run_info_takes_numpy_numbers_as_python_ones():
    # recorded_options writes them so; a run_info of one's own holding one was refused
    info = {'task': {'args': {'d': np.int64(4), 'noise': np.float32(0.5), 'on': np.bool_(True)}}}
    trainer = Trainer(H.ToyDeepSets(3, 2), config(), run_info=info)
    args = trainer.run_info['task']['args']
    assert args == {'d': 4, 'noise': 0.5, 'on': True}
    assert [type(v) for v in args.values()] == [int, float, bool]


def test_run_info_records_a_transform_by_a_repr_stable_across_processes():
    import functools

    import torch_geometric.transforms as T

    from torch_mz.train.checkpoint import recorded_options, same_run
    recorded = recorded_options({'transform': T.RandomRotate(30), 'fn': len, 'n': 3,
                           'lambdas': T.Compose([T.Center(), lambda d: d]),
                           'partial': functools.partial(lambda d, k: d, k=1)})
    assert recorded['transform'] == 'RandomRotate((-30, 30), axis=0)'  # with its settings
    assert recorded['fn'] == 'len' and recorded['n'] == 3
    # NumPy numbers (which check_options takes) as Python's, not as the text 'np.int64(8)'
    import numpy as np
    assert recorded_options({'dim': np.int64(8), 'p': np.float32(0.5), 'f': np.bool_(True)}) == {
        'dim': 8, 'p': 0.5, 'f': True}
    # a repr holding an address would differ in the next process: the class's name stands in
    assert recorded['lambdas'] == 'Compose' and recorded['partial'] == 'partial'
    run = {'task': {'name': 'qm9', 'args': recorded}}
    other = {'task': {'name': 'qm9', 'args': dict(recorded, transform='RandomRotate((-180, '
                                                                      '180), axis=0)')}}
    assert same_run(run, run) and not same_run(run, other)
    # a checkpoint that recorded the class's name only (before its repr) still resumes
    legacy = {'task': {'name': 'qm9', 'args': dict(recorded, transform='RandomRotate')}}
    assert same_run(legacy, run) and not same_run(legacy, {'task': {
        'name': 'qm9', 'args': dict(recorded, transform='Center()')}})


def test_run_info_records_arrays_and_tensors_by_their_values():
    # QM9 takes a target as a NumPy array or a tensor (of indices or names): recorded by its
    # repr, 'array([0, 1])' named no target, and the run's test split could not be loaded again
    # (load_test_split, predict: "unknown QM9 target 'array([0, 1])'"); a large one's repr
    # ('...') told two runs with other values apart from nothing
    from torch_mz.train.checkpoint import recorded_options, same_run
    recorded = recorded_options({'a': np.arange(2), 'names': np.array(['mu', 'alpha']),
                                 't': torch.tensor(7), 'big': torch.zeros(2000)})
    assert recorded == {'a': [0, 1], 'names': ['mu', 'alpha'], 't': 7, 'big': [0.0] * 2000}
    other = recorded_options({'big': torch.zeros(2000).index_fill(0, torch.tensor([999]), 1)})
    assert not same_run({'model': {'args': recorded}}, {'model': {'args': other}})
    # read back as QM9 reads them: the same targets as the array given
    from torch_mz.tasks import resolved_options
    assert resolved_options('qm9', {'target': recorded['a']}) == {'target': ['mu', 'alpha']}
    assert resolved_options('qm9', {'target': recorded['t']}) == resolved_options(
        'qm9', {'target': torch.tensor(7)})
    # a tensor without data to list (sparse) keeps its earlier record
    sparse = torch.eye(2).to_sparse()
    assert recorded_options({'s': sparse}) == {'s': repr(sparse)}


def test_a_checkpoint_records_the_tanh_that_ran_and_the_fused_mode(tmp_path, monkeypatch,
                                                                   caplog):
    # with the fused kernels off no compiled tanh runs, whatever auto mode would choose: the
    # checkpoint said "compiled" (and a resume warned falsely); with them on it said nothing
    from torch_mz.nn import fused
    out = tmp_path / 'run'
    monkeypatch.setattr(fused, '_ENABLED', False)
    monkeypatch.setattr(fused, '_TANH_FASTER', True)
    Trainer(H.ToyDeepSets(3, 2), config(epochs=1, out_dir=str(out))).fit(REG_TRAIN[:16],
                                                                         REG_VAL[:8])
    state = load_checkpoint(out / 'checkpoint.pt')
    assert state['tanh_kernel'] is False and state['fused_kernels'] is False
    monkeypatch.setattr(fused, '_ENABLED', True)  # resumed with them on: said, not silent
    with caplog.at_level('WARNING'):
        Trainer(H.ToyDeepSets(3, 2), config(epochs=2, resume=str(out / 'checkpoint.pt'))).fit(
            REG_TRAIN[:16], REG_VAL[:8])
    assert 'trained with the fused kernels off, this process has them on' in caplog.text
    for bad in ('false', 0.0, 'auto'):
        with pytest.raises(ValueError, match="'enabled' must be True or False"):
            fused.set_fused_kernels(bad)
        with pytest.raises(ValueError, match="'faster' must be True or False"):
            fused.set_tanh_kernel(bad)


def test_a_new_run_refuses_an_out_dir_holding_an_earlier_run(tmp_path):
    # a second run into the same folder overwrote the first run's checkpoint and results, and a
    # run without a validation set (no best.pt) left the first run's best.pt beside its own
    # checkpoint: load_model read the other model. Now refused, or with overwrite=True the old
    # files go first; a resumed run is not a new one
    out = tmp_path / 'run'
    seed_everything(0)
    Trainer(H.ToyDeepSets(3, 2), config(epochs=2, warmup_epochs=1, out_dir=str(out))).fit(
        REG_TRAIN[:32], REG_VAL[:16])
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    assert 'best.pt' in before
    new = Trainer(H.ToyDeepSets(3, 2, dropout=0.1), config(epochs=2, warmup_epochs=1, out_dir=str(out)))
    with pytest.raises(FileExistsError, match="holds the files of an earlier run .*best.pt.*"
                                              "resume='.*checkpoint.pt' to continue it, "
                                              "overwrite=True"):
        new.fit(REG_TRAIN[:32])
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
    Trainer(H.ToyDeepSets(3, 2, dropout=0.1), config(epochs=2, warmup_epochs=1, out_dir=str(out),
                                        overwrite=True)).fit(REG_TRAIN[:32])
    assert 'best.pt' not in os.listdir(out)  # the earlier run's is gone, none written anew
    assert load_checkpoint(str(out / 'checkpoint.pt'))['config']['overwrite'] is True
    # resuming the run in its own folder is not refused
    Trainer(H.ToyDeepSets(3, 2, dropout=0.1), config(epochs=3, warmup_epochs=1, out_dir=str(out),
                                        resume=str(out / 'checkpoint.pt'))).fit(REG_TRAIN[:32])
    with pytest.raises(ValueError, match='True or False for overwrite'):
        config(overwrite='no')


def test_a_run_resumed_into_another_runs_out_dir_is_refused_or_replaces_it(tmp_path,
                                                                           monkeypatch):
    # a resume skipped the check: resumed into a folder holding another run's files, a run
    # without a validation set left that run's best.pt beside its own checkpoint.pt (and
    # load_model read the other model)
    data, val = REG_TRAIN[:32], REG_VAL[:8]
    Trainer(H.ToyDeepSets(3, 2), config(epochs=2, out_dir=str(tmp_path / 'a'))).fit(data)
    other = tmp_path / 'b'
    Trainer(H.ToyDeepSets(3, 2), config(epochs=2, out_dir=str(other))).fit(data, val)
    before = {name: (other / name).read_bytes() for name in os.listdir(other)}
    assert 'best.pt' in before
    resume = str(tmp_path / 'a' / 'checkpoint.pt')
    with pytest.raises(FileExistsError, match=r"holds the files of another run \(.*best.pt.*"
                                              r"\) than the one resumed from '.*checkpoint.pt': "
                                              r"pass overwrite=True"):
        Trainer(H.ToyDeepSets(3, 2), config(epochs=3, out_dir=str(other),
                                            resume=resume)).fit(data)
    assert {name: (other / name).read_bytes() for name in os.listdir(other)} == before
    Trainer(H.ToyDeepSets(3, 2), config(epochs=3, out_dir=str(other), resume=resume,
                                        overwrite=True)).fit(data)
    assert 'best.pt' not in os.listdir(other)  # the other run's is gone, none written anew
    assert load_checkpoint(other / 'checkpoint.pt')['epoch'] == 2
    # into a new folder, and in its own (named otherwise: a relative path), it goes on
    Trainer(H.ToyDeepSets(3, 2), config(epochs=3, out_dir=str(tmp_path / 'c'),
                                        resume=resume)).fit(data)
    monkeypatch.chdir(tmp_path)
    Trainer(H.ToyDeepSets(3, 2), config(epochs=3, out_dir=str(tmp_path / 'a'),
                                        resume=os.path.join('a', 'checkpoint.pt'))).fit(data)
    assert load_checkpoint(tmp_path / 'a' / 'checkpoint.pt')['epoch'] == 2


def test_a_run_into_an_out_dir_another_process_trains_in_is_refused(tmp_path):
    # nothing kept two runs out of one folder at once: a second run (overwrite=True, as the
    # command line and the reproduction pass) removed the files of the run in progress, or
    # both wrote their checkpoints, best.pt and result.json between each other's
    from tests.test_files import held_by_another_process
    data, val = REG_TRAIN[:32], REG_VAL[:8]
    out = tmp_path / 'run'
    Trainer(H.ToyDeepSets(3, 2), config(epochs=2, out_dir=str(out))).fit(data, val)
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    model = H.ToyDeepSets(3, 2)
    weights = params(model)
    with held_by_another_process(out):  # a run in training there
        for options in (dict(overwrite=True), dict(resume=str(out / 'checkpoint.pt'))):
            with pytest.raises(OSError, match=f"^'{out}' is in use by another process "
                                              f".*: wait for it to end, or choose another "
                                              f"out_dir$"):
                Trainer(model, config(epochs=3, out_dir=str(out), **options)).fit(data, val)
            assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
        assert_same_params(params(model), weights)  # nothing trained
    # once that process has ended, the run goes on in its folder
    Trainer(model, config(epochs=3, out_dir=str(out), resume=str(out / 'checkpoint.pt'))).fit(
        data, val)
    assert load_checkpoint(out / 'checkpoint.pt')['epoch'] == 2
    fresh = tmp_path / 'fresh'  # made for the hold of a run refused before its first file
    with pytest.raises(ValueError, match='non-empty train'):
        Trainer(H.ToyDeepSets(3, 2), config(out_dir=str(fresh))).fit([])
    assert not fresh.exists()


@pytest.mark.skipif(not hasattr(os, 'symlink'), reason='no symbolic links here')
def test_a_run_resumed_through_a_link_to_its_own_checkpoint_goes_on_in_its_folder(tmp_path):
    # resume='latest.pt', a link to out_dir's checkpoint.pt, was taken for another run's: with
    # overwrite=True every file of the run was removed, the checkpoint to resume from first
    data, val = REG_TRAIN[:32], REG_VAL[:8]
    run = tmp_path / 'run'
    Trainer(H.ToyDeepSets(3, 2), config(epochs=2, out_dir=str(run))).fit(data, val)
    latest = tmp_path / 'latest.pt'
    os.symlink(run / 'checkpoint.pt', latest)
    for overwrite in (False, True):
        Trainer(H.ToyDeepSets(3, 2), config(epochs=3 + overwrite, out_dir=str(run),
                                            resume=str(latest), overwrite=overwrite)).fit(data, val)
        assert load_checkpoint(run / 'checkpoint.pt')['epoch'] == 2 + overwrite
        assert {'best.pt', 'result.json'} <= set(os.listdir(run))


def test_temporary_files_of_a_killed_write_are_removed_when_the_run_goes_on(tmp_path):
    # SIGKILL during atomic_write runs no cleanup: its temporary file stayed for good
    out = tmp_path / 'run'
    trainer, _, _ = _resume_run(out, epochs=2)
    left = ['.checkpoint.pt.0123456789ab.tmp', '.best.pt.abcdef012345.tmp']
    others = ['.checkpoint.pt.tmp', 'notes.checkpoint.pt.0123456789ab.tmp', '.x.0123456789ab.tmp']
    for name in left + others:
        (out / name).write_bytes(b'half a checkpoint')
    _resume_run(out, epochs=3, resume=str(out / 'checkpoint.pt'))
    names = set(os.listdir(out))
    assert not names & set(left) and set(others) <= names


def test_a_fit_refused_before_training_leaves_the_model_in_target_units(tmp_path):
    # fit took the normaliser off the model before a resume that failed (no checkpoint), so
    # the model, its weights unchanged, predicted standardised values afterwards
    from torch_mz.train.normalize import carried_normalizer
    torch.manual_seed(0)
    model = H.ToyDeepSets(3, 2)
    Trainer(model, config(epochs=1)).fit(REG_TRAIN[:16], REG_VAL[:8])
    carried = carried_normalizer(model)
    assert carried is not None
    weights = params(model)
    with pytest.raises(CheckpointError, match='does not exist'):
        Trainer(model, config(epochs=1, resume=str(tmp_path / 'missing.pt'))).fit(
            REG_TRAIN[:16], REG_VAL[:8])
    assert repr(carried_normalizer(model)) == repr(carried)  # (a copy of it)
    assert_same_params(params(model), weights)
    # refused after the checkpoint's weights were loaded (fewer epochs than it ran): the model
    # had kept the other run's weights beside its own normaliser, and the Trainer had kept the
    # checkpoint's normaliser for evaluate()
    torch.manual_seed(1)
    other = H.ToyDeepSets(3, 2)
    scaled = []  # the other run fitted on targets of other units
    for d in REG_TRAIN[:16]:
        d = d.clone()
        d.y = d.y * 100 + 50
        scaled.append(d)
    Trainer(other, config(epochs=2, out_dir=str(tmp_path / 'other'))).fit(scaled, REG_VAL[:8])
    refused = Trainer(model, config(epochs=1, resume=str(tmp_path / 'other' / 'checkpoint.pt')))
    with pytest.raises(ValueError, match='fewer than'):
        refused.fit(REG_TRAIN[:16], REG_VAL[:8])
    assert repr(carried_normalizer(model)) == repr(carried)
    assert_same_params(params(model), weights)
    assert refused.evaluate(REG_VAL[:8]) == Trainer(model, config(epochs=1)).evaluate(REG_VAL[:8])


def test_a_checkpoint_records_whether_freed_memory_is_kept(tmp_path, monkeypatch, caplog):
    # the aggregation's automatic groups, and so its dropout masks, depend on it: a run resumed
    # under the other setting differs from an uninterrupted one, and says so (it was silent)
    from torch_mz.train import trainer as trainer_module
    out = tmp_path / 'run'
    monkeypatch.setattr(trainer_module, 'freed_memory_kept', lambda: False)
    Trainer(H.ToyDeepSets(3, 2), config(epochs=1, out_dir=str(out))).fit(REG_TRAIN[:16],
                                                                         REG_VAL[:8])
    assert load_checkpoint(out / 'checkpoint.pt')['freed_memory_kept'] is False
    monkeypatch.setattr(trainer_module, 'freed_memory_kept', lambda: True)
    with caplog.at_level('WARNING'):
        Trainer(H.ToyDeepSets(3, 2), config(epochs=2, resume=str(out / 'checkpoint.pt'))).fit(
            REG_TRAIN[:16], REG_VAL[:8])
    assert 'was trained without kept freed memory, this process runs with it' in caplog.text


def test_a_resume_with_other_loader_workers_is_said_to_differ(tmp_path, caplog):
    # loader workers draw their seeds from the main random stream (and random transforms run
    # in them): a resume with another num_workers trains on other random numbers, and was
    # silent, num_workers counting as a setting that changes nothing
    from torch_mz.train.checkpoint import RESUMABLE_CONFIG_CHANGES, config_changes
    assert 'num_workers' not in RESUMABLE_CONFIG_CHANGES
    assert config_changes({'num_workers': 0}, {'num_workers': 2}) == {'num_workers': (0, 2)}
    out = tmp_path / 'run'
    Trainer(H.ToyDeepSets(3, 2), config(epochs=1, out_dir=str(out))).fit(REG_TRAIN[:16],
                                                                         REG_VAL[:8])
    with caplog.at_level('WARNING'):
        Trainer(H.ToyDeepSets(3, 2), config(epochs=2, num_workers=1,
                                            resume=str(out / 'checkpoint.pt'))).fit(
            REG_TRAIN[:16], REG_VAL[:8])
    assert "'num_workers': (0, 1)}; the run will differ" in caplog.text


def test_weights_that_do_not_fit_leave_the_model_as_it_was(tmp_path):
    # load_state_dict copies every entry that fits before it raises: load_weights of a checkpoint
    # that lacks one layer of the model overwrote all the others, though it was refused
    from torch_mz.train.normalize import carried_normalizer
    torch.manual_seed(0)
    run = config(epochs=1, warmup_epochs=0, out_dir=str(tmp_path / 'run'))
    Trainer(H.ToyDeepSets(3, 2), run).fit(REG_TRAIN[:16], REG_VAL[:8])
    torch.manual_seed(1)
    model = H.ToyDeepSets(3, 2, with_uncertainty=True)  # (a sigma head the checkpoint lacks)
    Trainer(model, config(epochs=1, warmup_epochs=0)).fit(REG_TRAIN[:16], REG_VAL[:8])
    carried, weights = carried_normalizer(model), params(model)
    with pytest.raises(CheckpointError, match=r'(?s)does not fit this model.*Missing key.*sigma'):
        Trainer(model, config()).load_weights(tmp_path / 'run' / 'best.pt')
    assert_same_params(params(model), weights)
    assert repr(carried_normalizer(model)) == repr(carried)
    # a damaged normaliser: refused before the weights load (a bare KeyError after them)
    fitting = Trainer(H.ToyDeepSets(3, 2), config(epochs=1, warmup_epochs=0))
    fitting.fit(REG_TRAIN[:16], REG_VAL[:8])
    carried, weights = carried_normalizer(fitting.model), params(fitting.model)
    state = load_checkpoint(tmp_path / 'run' / 'best.pt')
    state['normalizer'] = {'std': state['normalizer']['std']}
    torch.save(state, tmp_path / 'damaged.pt')
    with pytest.raises(CheckpointError, match='damaged target normaliser'):
        fitting.load_weights(tmp_path / 'damaged.pt')
    assert_same_params(params(fitting.model), weights)
    assert repr(carried_normalizer(fitting.model)) == repr(carried)


def test_a_damaged_normaliser_is_named_on_resume(tmp_path):
    # resuming read the normaliser after the weights and the optimiser, with a bare KeyError
    # (a traceback from the command line, which names CheckpointErrors)
    run = config(epochs=1, warmup_epochs=0, out_dir=str(tmp_path / 'run'))
    Trainer(H.ToyDeepSets(3, 2), run).fit(REG_TRAIN[:16], REG_VAL[:8])
    state = torch.load(tmp_path / 'run' / 'checkpoint.pt', weights_only=True)
    state['normalizer'] = {'std': state['normalizer']['std']}
    torch.save(state, tmp_path / 'damaged.pt')
    model = H.ToyDeepSets(3, 2)
    weights = params(model)
    with pytest.raises(CheckpointError, match='damaged target normaliser'):
        Trainer(model, config(epochs=2, warmup_epochs=0, resume=str(tmp_path / 'damaged.pt'))
                ).fit(REG_TRAIN[:16], REG_VAL[:8])
    assert_same_params(params(model), weights)


def test_a_normaliser_that_cannot_map_the_models_outputs_is_refused_at_load():
    # a std of 0 or below mapped every prediction to the mean (or flipped its sign), statistics
    # of another number of targets than the model's outputs, or not one entry per target, were
    # accepted at load and failed only at prediction (a bare shape error)
    from torch_mz.train.checkpoint import checkpoint_normalizer
    mean, std = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([0.5, 3.0],
                                                                           dtype=torch.float64)
    state = {'run_info': {'model': {'name': 'deepsets', 'in_channels': 3, 'out_channels': 2}}}
    good = {'mean': mean, 'std': std, 'relative_eps': 1e-12, 'float64': True}
    assert torch.equal(checkpoint_normalizer(dict(state, normalizer=good), 'C').std, std)
    positive = 'std that is not positive'
    for damaged, problem in ((dict(good, std=torch.tensor([0.5, 0.0])), positive),
                             (dict(good, std=-std), positive),
                             (dict(good, mean=mean[:1], std=std[:1]),
                              r'1 target\(s\) for a model of 2 output'),
                             (dict(good, mean=mean[:, None], std=std[:, None]),
                              r'shape \(2, 1\), not one entry per target')):
        with pytest.raises(CheckpointError, match=f"Checkpoint 'x.pt' holds a damaged target "
                                                  f"normaliser.*{problem}"):
            checkpoint_normalizer(dict(state, normalizer=damaged), "Checkpoint 'x.pt'")
    # a checkpoint that records no model's outputs: the width is not compared
    assert checkpoint_normalizer({'normalizer': dict(good, mean=mean[:1], std=std[:1])},
                                 'C').mean.numel() == 1


def test_a_resume_with_other_steps_per_epoch_goes_on_from_its_next_epochs_step(tmp_path, caplog):
    # the schedule counts steps: a run resumed with another batch size or number of processes
    # (the checkpoint of 2 processes resumed in 1) went on from the saved step count, which lay
    # inside another epoch of the new schedule: the warm-up went on and the cosine did not end
    # at 0 (or ended early, and the last steps trained at learning rate 0)
    data, val = REG_TRAIN[:64], REG_VAL[:8]
    run = tmp_path / 'run'
    from torch_mz.train import TrainingStopped, stop_by
    with pytest.raises(TrainingStopped), stop_by(0.0):  # after its first epoch
        Trainer(H.ToyDeepSets(3, 2), config(epochs=3, batch_size=32, warmup_epochs=1,
                                            out_dir=str(run))).fit(data, val)
    state = load_checkpoint(run / 'checkpoint.pt')
    assert state['scheduler']['last_epoch'] == 2  # 2 steps in its one epoch
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=3, batch_size=16, warmup_epochs=1,
                                                  out_dir=str(run),
                                                  resume=str(run / 'checkpoint.pt')))
    with caplog.at_level('WARNING', logger='torch_mz.train.trainer'):
        result = trainer.fit(data, val)
    assert 'begins its epoch 1 at step 4' in caplog.text
    uninterrupted = Trainer(H.ToyDeepSets(3, 2), config(epochs=3, batch_size=16,
                                                        warmup_epochs=1)).fit(data, val)
    assert [r['lr'] for r in result.history[1:]] == pytest.approx(
        [r['lr'] for r in uninterrupted.history[1:]])
    assert trainer.scheduler.last_epoch == 12 and trainer.optimizer.param_groups[0]['lr'] == 0


def test_a_regression_checkpoint_without_its_normaliser_is_refused_before_the_weights_load(
        tmp_path):
    # normalize_targets=True with no normaliser: the weights predict standardised values.
    # Resuming refused it; load_weights took it, and the Trainer's predictions failed later
    # ('TargetNormalizer is not fitted')
    run = config(epochs=1, warmup_epochs=0, out_dir=str(tmp_path / 'run'))
    Trainer(H.ToyDeepSets(3, 2), run).fit(REG_TRAIN[:16], REG_VAL[:8])
    for name in ('checkpoint.pt', 'best.pt'):
        state = load_checkpoint(tmp_path / 'run' / name)
        state['normalizer'] = None
        save_checkpoint(state, tmp_path / name)
    model = H.ToyDeepSets(3, 2)
    weights = params(model)
    with pytest.raises(CheckpointError, match='no target normaliser'):
        Trainer(model, config(epochs=2, warmup_epochs=0, resume=str(tmp_path / 'checkpoint.pt'))
                ).fit(REG_TRAIN[:16], REG_VAL[:8])
    assert_same_params(params(model), weights)
    trainer = Trainer(model, config())
    with pytest.raises(CheckpointError, match='no target normaliser'):
        trainer.load_weights(tmp_path / 'best.pt')
    assert_same_params(params(model), weights)
    # without normalised targets a checkpoint holds none, and loads
    state['config']['normalize_targets'] = False
    save_checkpoint(state, tmp_path / 'raw.pt')
    Trainer(model, config(normalize_targets=False)).load_weights(tmp_path / 'raw.pt')


def test_an_unfitted_normalisers_state_in_a_checkpoint_counts_as_none(tmp_path):
    # {'mean': None, 'std': None, ...} (TargetNormalizer().state_dict()) passed as a normaliser:
    # load_weights took it and the Trainer's predictions failed later ('TargetNormalizer is not
    # fitted'), and a resume loaded it where it refuses a checkpoint without one
    from torch_mz.train import TargetNormalizer
    run = config(epochs=1, warmup_epochs=0, out_dir=str(tmp_path / 'run'))
    Trainer(H.ToyDeepSets(3, 2), run).fit(REG_TRAIN[:16], REG_VAL[:8])
    for name in ('checkpoint.pt', 'best.pt'):
        state = load_checkpoint(tmp_path / 'run' / name)
        state['normalizer'] = TargetNormalizer().state_dict()
        save_checkpoint(state, tmp_path / name)
    model = H.ToyDeepSets(3, 2)
    weights = params(model)
    with pytest.raises(CheckpointError, match='no target normaliser'):
        Trainer(model, config()).load_weights(tmp_path / 'best.pt')
    with pytest.raises(CheckpointError, match='no target normaliser'):
        Trainer(model, config(epochs=2, warmup_epochs=0, resume=str(tmp_path / 'checkpoint.pt'))
                ).fit(REG_TRAIN[:16], REG_VAL[:8])
    assert_same_params(params(model), weights)
    # without normalised targets none is needed: it loads, as one that holds none
    state['config']['normalize_targets'] = False
    save_checkpoint(state, tmp_path / 'raw.pt')
    trainer = Trainer(model, config(normalize_targets=False))
    trainer.load_weights(tmp_path / 'raw.pt')
    assert not trainer.normalizer.fitted and trainer.predict(REG_VAL[:4]).shape[0] == 4


def test_same_run_takes_the_forms_of_an_option_that_give_the_same_task():
    # QM9's target 0 and 'mu' are one task (resolved_options; predict took them so), but a
    # resume given the other form (train --resume, compare --resume) was refused as another run
    from torch_mz.train.checkpoint import same_run

    def run(name, **args):
        return {'task': {'name': name, 'args': args, 'split': {'seed': 0}},
                'model': {'name': 'mz', 'args': {}}}
    for form in (0, [0], ['mu'], 'mu'):
        assert same_run(run('qm9', target='mu', source='qm9pack'),
                        run('qm9', target=form, source='qm9pack')), form
    assert same_run(run('qm9', target=[1, 'mu']), run('qm9', target=['alpha', 0]))
    assert not same_run(run('qm9', target='mu'), run('qm9', target=1))
    assert not same_run(run('qm9', target=['mu', 'alpha']), run('qm9', target=['alpha', 'mu']))
    assert not same_run(run('qm9', target='mu', source='qm9pack'),
                        run('qm9', target=0, source='sdf'))
    assert not same_run(run('qm9', target='nu'), run('qm9', target=0))  # (refused: as given)
    # a dimension left at None is the task's own
    assert same_run(run('meb-radius', d=None), run('meb-radius', d=8))
    assert not same_run(run('meb-radius', d=None), run('meb-radius', d=16))


def test_same_run_takes_a_pos_dim_no_model_but_egnn_reads_as_none():
    # build_model('mz', in, out) records pos_dim None, the command line's model the task's:
    # a run of train() could not be resumed with torch-mz train --resume
    from torch_mz.train.checkpoint import same_run

    def run(name, pos_dim):
        return {'model': {'name': name, 'args': {}, 'in_channels': 8, 'out_channels': 1,
                          'pos_dim': pos_dim, 'feature_columns': None}}
    assert same_run(run('mz', None), run('mz', 4)) and same_run(run('deepsets', 4), run(
        'deepsets', None))
    for name in ('egnn', 'egnn-qm9', 'my-model'):  # (EGNN reads it; a label may be an EGNN)
        assert not same_run(run(name, None), run(name, 4)), name
    assert not same_run(run('mz', None), dict(run('mz', 4), model=dict(
        run('mz', 4)['model'], in_channels=9)))


def test_same_run_takes_an_option_left_out_as_its_default():
    # a run records the task options given: one trained without d (QM9: without target)
    # resumed with the default given (train --resume --task-arg d=8, compare --resume) was
    # refused as another run
    from torch_mz.train.checkpoint import same_run

    def run(name, **args):
        return {'task': {'name': name, 'args': args, 'split': {'seed': 0}},
                'model': {'name': 'mz', 'args': {}}}
    assert same_run(run('meb-radius'), run('meb-radius', d=8))
    assert same_run(run('meb-radius', d=None), run('meb-radius'))
    assert same_run(run('quadratic-tdof', tdof=2), run('quadratic-tdof', d=32, tdof=2))
    assert same_run(run('meb-radius'), run('meb-radius', spread=[0.3, 1.0]))
    assert not same_run(run('meb-radius'), run('meb-radius', d=16))
    assert not same_run(run('quadratic-tdof'), run('quadratic-tdof', d=16))
    for form in (0, 'mu', ['mu']):  # (load_task's target, not the class's: all twelve)
        assert same_run(run('qm9'), run('qm9', target=form, source='qm9pack')), form
    assert not same_run(run('qm9'), run('qm9', target=None))
    assert not same_run(run('qm9'), run('qm9', source='sdf'))
    assert not same_run(run('qm9'), run('qm9', target=1))
    # a task this version does not know: as recorded
    assert not same_run(run('no-such-task'), run('no-such-task', d=8))


def _scripted_patience_run(out_dir, crash_at=None, resume=None):
    # validation losses by epoch (the model's own metrics kept, its loss replaced): best at
    # epoch 5 (2.9), 3.0 at epoch 3 a tie (no improvement), 2.96 at epoch 7 within min_delta
    curve = [5.0, 4.0, 3.0, 3.0, 3.5, 2.9, 3.1, 2.96, 3.3, 1.0]
    seed_everything(0)
    trainer = Trainer(H.ToyDeepSets(3, 2), config(
        epochs=10, patience=3, min_delta=0.05, out_dir=str(out_dir), resume=resume))
    evaluate, train_epoch, epochs = trainer.evaluate, trainer._train_epoch, []

    def scripted_train_epoch(loader, epoch):
        if epoch == crash_at:
            raise RuntimeError('simulated crash')
        epochs.append(epoch)
        return train_epoch(loader, epoch)

    def scripted_evaluate(dataset):
        return dict(evaluate(dataset), loss=curve[epochs[-1]])

    trainer._train_epoch, trainer.evaluate = scripted_train_epoch, scripted_evaluate
    return trainer, trainer.fit(REG_TRAIN[:32], REG_VAL[:16]), epochs


def test_a_resumed_run_goes_on_counting_its_patience_from_the_same_best(tmp_path):
    full, want, _ = _scripted_patience_run(tmp_path / 'full')
    assert want.stopped_early and want.best_epoch == 5 and want.best_val_loss == 2.9
    assert want.epochs_run == 9  # epochs 6, 7, 8 without an improvement of more than 0.05
    with pytest.raises(RuntimeError, match='simulated crash'):
        _scripted_patience_run(tmp_path / 'crashed', crash_at=7)  # epoch 6 the one bad one
    assert load_checkpoint(tmp_path / 'crashed' / 'checkpoint.pt')['bad_epochs'] == 1
    resumed, got, ran = _scripted_patience_run(
        tmp_path / 'crashed', resume=str(tmp_path / 'crashed' / 'checkpoint.pt'))
    assert ran == [7, 8]  # stops where the uninterrupted run stopped
    assert (got.stopped_early, got.best_epoch, got.best_val_loss, got.epochs_run) == (
        True, 5, 2.9, 9)
    assert got.val_metrics == want.val_metrics == {
        k[4:]: v for k, v in want.history[5].items() if k.startswith('val_')}
    assert strip_times(got.history) == strip_times(want.history)
    assert_same_params(params(resumed.model), params(full.model))  # the best epoch's weights
    summary = json.loads((tmp_path / 'crashed' / 'result.json').read_text())
    assert summary['best_epoch'] == 5 and summary['val_metrics'] == want.val_metrics
    assert load_checkpoint(tmp_path / 'crashed' / 'best.pt')['epoch'] == 5


def test_a_run_that_validated_is_not_resumed_without_its_validation_set(tmp_path):
    # every epoch without one became the best while the best weights and loss stayed the
    # validated epoch's: result.json named the last epoch best, restore_best loaded epoch 1's
    _resume_run(tmp_path / 'run', epochs=3)
    checkpoint = str(tmp_path / 'run' / 'checkpoint.pt')
    seed_everything(0)
    model = H.ToyDeepSets(3, 2, dropout=0.3)
    before = params(model)
    trainer = Trainer(model, config(epochs=5, warmup_epochs=1, out_dir=str(tmp_path / 'run'),
                                    resume=checkpoint))
    with pytest.raises(ValueError, match=r"was trained with a validation set \(best epoch \d, "
                                         r"0-based\); expected one to resume it"):
        trainer.fit(REG_TRAIN[:48])
    assert_same_params(params(model), before)  # refused before any epoch: the model as it came
    assert load_checkpoint(checkpoint)['epoch'] == 2


def test_same_run_takes_a_set_size_left_out_as_the_tasks_default_range():
    # load_task records set_size only where it is given: a run without --set-size resumed with
    # the task's default range (the same sets) was refused as another run
    from torch_mz.tasks import TASKS, load_task
    from torch_mz.train.checkpoint import same_run

    def run(name, **args):
        return {'task': {'name': name, 'args': args, 'split': {'seed': 0}},
                'model': {'name': 'mz', 'args': {}}}
    assert TASKS['max'].default_set_size == (10, 50)  # (not every task's (10, 30))
    assert same_run(run('max'), run('max', set_size=[10, 50]))
    assert same_run(run('meb-radius', set_size=[10, 30]), run('meb-radius', d=8))
    assert not same_run(run('max'), run('max', set_size=[10, 30]))
    assert not same_run(run('max'), run('max', set_size=[10, 51]))
    assert not same_run(run('max', set_size=[10, 30]), run('max', set_size=[10, 50]))
    # the premise: the default range given draws the sets of none given
    plain, given = (load_task('max', n_train=2, n_val=1, n_test=1, set_size=size)
                    for size in (None, (10, 50)))
    assert 'set_size' not in plain.args and given.args['set_size'] == [10, 50]
    for a, b in zip(plain.train + plain.val + plain.test, given.train + given.val + given.test):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a.keys())


def test_a_full_disk_stops_the_run_naming_the_file_and_keeps_the_last_checkpoint(tmp_path,
                                                                                  monkeypatch):
    # the error said '[Errno 28] No space left on device', naming no file
    import errno
    out = tmp_path / 'run'
    save = torch.save

    def full_at_epoch_1(obj, f, *args, **kwargs):
        if obj.get('kind') == 'train' and obj.get('epoch') == 1:
            f.write(b'half a checkpoint')
            raise OSError(errno.ENOSPC, 'No space left on device')
        save(obj, f, *args, **kwargs)
    monkeypatch.setattr(torch, 'save', full_at_epoch_1)
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=3, out_dir=str(out)))
    with pytest.raises(OSError) as failed:  # stops: no epoch trains on without its checkpoint
        trainer.fit(REG_TRAIN[:32], REG_VAL[:16])
    monkeypatch.undo()
    assert str(failed.value) == (f"[Errno 28] No space left on device: "
                                 f"'{out / 'checkpoint.pt'}'")
    assert sorted(os.listdir(out)) == ['best.pt', 'checkpoint.pt', 'metrics.csv',
                                       'metrics.jsonl']  # no temporary file
    assert load_checkpoint(out / 'checkpoint.pt')['epoch'] == 0  # epoch 0's, whole
    assert len((out / 'metrics.jsonl').read_text().splitlines()) == 1


def test_cuda_rng_restored_where_another_number_of_gpus_is_visible(monkeypatch):
    # a checkpoint written with one GPU visible, resumed where two are: the state of cuda:0
    # (the device the run trains on) is restored, not skipped
    from torch_mz.train.checkpoint import _rng_state, _set_rng_state
    state = _rng_state()
    state['cuda'] = [torch.tensor([1, 2, 3], dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    monkeypatch.setattr(torch.cuda, 'set_rng_state',
                        lambda s, device='cuda': restored.append((s.tolist(), device)))
    monkeypatch.setattr(torch.cuda, 'set_rng_state_all',
                        lambda states: restored.extend((s.tolist(), i)
                                                       for i, s in enumerate(states)))
    _set_rng_state(state)
    assert restored == [([1, 2, 3], 0)]


def test_a_gpu_run_resumed_on_the_cpu_or_another_gpu_is_said_to_differ(tmp_path, monkeypatch,
                                                                        caplog):
    # a GPU run resumed on a CPU-only machine restored no CUDA stream (its dropout masks now
    # come from the CPU's generator) and said nothing: 'device' is a change config_changes
    # lets pass. Resumed all the same, with a warning that names both devices and GPU counts
    out = tmp_path / 'run'
    Trainer(H.ToyDeepSets(3, 2), config(epochs=1, warmup_epochs=0, out_dir=str(out))).fit(
        REG_TRAIN[:16], REG_VAL[:8])
    state = torch.load(out / 'checkpoint.pt', weights_only=True)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)  # (this machine: no GPU)
    two = [torch.zeros(16, dtype=torch.uint8)] * 2
    gpu = dict(state, rng=[dict(state['rng'][0], device='cuda:0', cuda=two)])
    older = dict(state, rng=[{k: v for k, v in state['rng'][0].items() if k != 'device'}])
    older_gpu = dict(older, config=dict(state['config'], device='auto'),
                     rng=[dict(older['rng'][0], cuda=two)])
    for name, saved, said in (('gpu', gpu, True), ('older_gpu', older_gpu, True),
                              ('cpu', state, False), ('older_cpu', older, False)):
        torch.save(saved, tmp_path / f'{name}.pt')
        caplog.clear()
        with caplog.at_level('WARNING'):
            result = Trainer(H.ToyDeepSets(3, 2), config(
                epochs=1, warmup_epochs=0, resume=str(tmp_path / f'{name}.pt'))).fit(
                    REG_TRAIN[:16], REG_VAL[:8])
        assert result.epochs_run == 1  # (not refused: nothing crashed)
        assert ('this run trains on cpu (the checkpoint holds the random state of 2 CUDA '
                "device(s), this machine has 0); its random stream (dropout masks) is not the "
                "run's" in caplog.text) == said, name
        assert caplog.text == '' or said, name
    assert state['rng'][0]['device'] == 'cpu'  # the device each process trains on


def test_rng_difference_follows_the_device_the_run_trains_on(monkeypatch):
    from torch_mz.train.checkpoint import _rng_difference, _rng_state, _set_rng_state
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 0)
    one, two = ([torch.zeros(16, dtype=torch.uint8)] * n for n in (1, 2))
    cuda0, cuda1 = torch.device('cuda', 0), torch.device('cuda', 1)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    # written on cuda:0 where one GPU was visible, resumed on cuda:0 (or 'cuda') where two are:
    # its stream is restored (test_cuda_rng_restored_where_another_number_of_gpus_is_visible)
    assert _rng_difference({'cuda': one, 'device': 'cuda:0'}, cuda0) is None
    assert _rng_difference({'cuda': one, 'device': 'cuda:0'}, torch.device('cuda')) is None
    assert _rng_difference({'cuda': one, 'device': 'cuda:0'}, cuda1) == (
        'it was trained on cuda:0, this run trains on cuda:1 (the checkpoint holds the random '
        'state of 1 CUDA device(s), this machine has 2)')
    # written on cuda:1 of two, resumed on the one GPU of another machine: cuda:0's state was
    # not the run's stream
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    assert _rng_difference({'cuda': two, 'device': 'cuda:1'}, cuda0) == (
        'it was trained on cuda:1, this run trains on cuda:0 (the checkpoint holds the random '
        'state of 2 CUDA device(s), this machine has 1)')
    assert _rng_difference({'cuda': [], 'device': 'cpu'}, cuda0).startswith(
        'it was trained on cpu, this run trains on cuda:0')
    assert _rng_difference({'cuda': [], 'device': 'cpu'}, torch.device('cpu:0')) is None
    # a checkpoint that does not record its device: the configuration's type, and whether it
    # holds the state of the device now trained on
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    assert _rng_difference({'cuda': two}, cuda1, 'auto') is None
    assert _rng_difference({'cuda': one}, cuda1, 'cuda') == (
        'it holds no random state for cuda:1 (the checkpoint holds the random state of 1 CUDA '
        'device(s), this machine has 2)')
    assert _rng_difference({'cuda': two}, cuda0, 'cpu').startswith('it was trained on cpu')
    assert _rng_difference({'cuda': []}, cuda0, 'auto').startswith('it was trained on cpu')
    # MPS: its own generator, saved and restored where the run trains on it
    calls = []
    monkeypatch.setattr(torch.mps, 'get_rng_state', lambda *a: torch.tensor([7]))
    monkeypatch.setattr(torch.mps, 'set_rng_state', lambda s, *a: calls.append(s.tolist()))
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    mps = torch.device('mps')
    state = _rng_state(mps)
    assert state['device'] == 'mps' and state['mps'].tolist() == [7]
    _set_rng_state(state, mps)
    assert calls == [[7]] and _rng_difference(state, mps) is None
    with pytest.raises(AttributeError):  # (a damaged entry: was neither restored nor said)
        _set_rng_state(dict(state, mps=[7]), mps)
    assert _rng_difference({'cuda': [], 'device': 'mps'}, mps) == 'it holds no random state for mps'


def test_best_weights_that_do_not_fit_are_refused_before_the_run_trains(tmp_path, monkeypatch):
    # a best_model of the right type that does not fit the model (or holds NaN) passed: the
    # resumed run trained every epoch, then raised a RuntimeError restoring it (restore_best),
    # or left it in best.pt (restore_best=False), which no model loads
    out = tmp_path / 'run'
    Trainer(H.ToyDeepSets(3, 2), config(epochs=1, warmup_epochs=0, out_dir=str(out))).fit(
        REG_TRAIN[:16], REG_VAL[:8])
    state = torch.load(out / 'checkpoint.pt', weights_only=True)
    nan = {k: torch.full_like(v, math.nan) for k, v in state['best_model'].items()}
    trained = []
    train_epoch = Trainer._train_epoch
    monkeypatch.setattr(Trainer, '_train_epoch',
                        lambda self, *args: trained.append(1) or train_epoch(self, *args))
    for best, match in (({}, r'\(its best_model\) does not fit this model'),
                        (nan, r'\(its best_model\) holds non-finite weights')):
        damaged = tmp_path / 'damaged.pt'
        torch.save(dict(state, best_model=best, best_val_loss=0.0), damaged)  # (never beaten)
        for restore_best in (True, False):
            resumed = tmp_path / f'resumed_{restore_best}'
            model = H.ToyDeepSets(3, 2)
            before = params(model)
            with pytest.raises(CheckpointError, match=match):
                Trainer(model, config(epochs=3, warmup_epochs=0, resume=str(damaged),
                                      out_dir=str(resumed), restore_best=restore_best)).fit(
                    REG_TRAIN[:16], REG_VAL[:8])
            assert trained == [] and not (resumed / 'best.pt').exists()
            assert_same_params(params(model), before)  # (the model as it came)


def test_a_checkpoint_of_another_torch_mz_version_is_said_to_differ(tmp_path, caplog):
    out = tmp_path / 'run'
    Trainer(H.ToyDeepSets(3, 2), config(epochs=1, warmup_epochs=0, out_dir=str(out))).fit(
        REG_TRAIN[:16], REG_VAL[:8])
    state = torch.load(out / 'checkpoint.pt', weights_only=True)
    torch.save(dict(state, torch_mz_version='0.1.0'), tmp_path / 'old.pt')
    for path, said in ((out / 'checkpoint.pt', False), (tmp_path / 'old.pt', True)):
        caplog.clear()
        with caplog.at_level('WARNING'):
            Trainer(H.ToyDeepSets(3, 2), config(epochs=1, warmup_epochs=0,
                                                resume=str(path))).fit(REG_TRAIN[:16],
                                                                       REG_VAL[:8])
        assert ('was written by torch_mz 0.1.0, this is torch_mz ' in caplog.text) == said


@pytest.mark.parametrize('stage', ['validation', 'checkpoint'])
def test_a_run_interrupted_in_its_validation_or_checkpoint_resumes_exactly(tmp_path,
                                                                           monkeypatch, stage):
    # Ctrl-C in epoch 3's validation, or while its checkpoint.pt is written (after best.pt):
    # resumed from epoch 2's checkpoint, the run ends as the uninterrupted one, files included
    full, full_result, _ = _resume_run(tmp_path / 'full')
    evaluate, save = Trainer.evaluate, torch.save
    calls = []

    def interrupted_evaluate(self, dataset):
        calls.append(1)
        if len(calls) == 4:  # (epoch 3's)
            raise KeyboardInterrupt
        return evaluate(self, dataset)

    def interrupted_save(obj, f, *args, **kwargs):
        if obj.get('kind') == 'train' and obj.get('epoch') == 3:
            f.write(b'half a checkpoint')
            raise KeyboardInterrupt
        save(obj, f, *args, **kwargs)
    if stage == 'validation':
        monkeypatch.setattr(Trainer, 'evaluate', interrupted_evaluate)
    else:
        monkeypatch.setattr(torch, 'save', interrupted_save)
    out = tmp_path / 'cut'
    with pytest.raises(KeyboardInterrupt):
        _resume_run(out)
    monkeypatch.undo()
    assert load_checkpoint(out / 'checkpoint.pt')['epoch'] == 2
    assert sorted(os.listdir(out)) == ['best.pt', 'checkpoint.pt', 'metrics.csv',
                                       'metrics.jsonl']  # no temporary file
    resumed, result, ran = _resume_run(out, resume=str(out / 'checkpoint.pt'), init_seed=123)
    assert ran == [3, 4]
    assert_same_params(params(resumed.model), params(full.model))
    assert strip_times(result.history) == strip_times(full_result.history)
    for name in ('best.pt', 'checkpoint.pt'):
        got, want = (load_checkpoint(run / name) for run in (out, tmp_path / 'full'))
        assert got['epoch'] == want['epoch'], name
        assert_same_params(got['model'], want['model'])
    assert [json.loads(line)['epoch'] for line in
            (out / 'metrics.jsonl').read_text().splitlines()] == [0, 1, 2, 3, 4]


def test_a_finished_run_resumed_with_other_settings_is_refused_and_its_records_kept(tmp_path):
    # a finished run resumed with another lr (the same epochs) trained nothing, yet wrote its
    # result.json and best.pt anew with the new lr: records of settings it never trained with
    run = tmp_path / 'run'
    data, val = REG_TRAIN[:32], REG_VAL[:8]
    base = dict(epochs=2, out_dir=str(run), grad_clip=1.0)
    Trainer(H.ToyDeepSets(3, 2), config(**base)).fit(data, val, val)
    files = {name: (run / name).read_bytes() for name in ('result.json', 'best.pt',
                                                          'checkpoint.pt')}
    resume = str(run / 'checkpoint.pt')
    for change in (dict(lr=0.5), dict(weight_decay=0.3), dict(batch_size=8),
                   dict(grad_clip=None), dict(warmup_epochs=0), dict(seed=5),
                   dict(schedule='epoch'), dict(patience=4), dict(num_workers=1)):
        with pytest.raises(CheckpointError, match='holds a finished run') as refused:
            train(H.ToyDeepSets(3, 2), data, val, val,
                  config=config(**dict(base, resume=resume, **change)))
        key, value = next(iter(change.items()))
        assert f'{key} ' in str(refused.value) and f'now {value!r}' in str(refused.value)
        assert {name: (run / name).read_bytes() for name in files} == files, change
    # ... or another number of processes (result.json records it)
    state = load_checkpoint(resume)
    save_checkpoint(dict(state, world_size=2, rng=state['rng'] * 2), run / 'two.pt')
    with pytest.raises(CheckpointError, match=r'finished run .*world_size 2, now 1'):
        train(H.ToyDeepSets(3, 2), data, val, val,
              config=config(**dict(base, resume=str(run / 'two.pt'))))
    assert {name: (run / name).read_bytes() for name in files} == files
    # its own settings (and where it is written) resume it: nothing trains
    Trainer(H.ToyDeepSets(3, 2), config(**dict(base, resume=resume, progress=True))).fit(
        data, val, val)
    assert json.loads((run / 'result.json').read_text())['config']['lr'] == config().lr
    # more epochs train on, under the new settings
    result = Trainer(H.ToyDeepSets(3, 2), config(**dict(base, epochs=3, lr=0.5,
                                                        resume=resume))).fit(data, val, val)
    assert result.epochs_run == 3 and result.history[2]['lr'] > 0
    assert json.loads((run / 'result.json').read_text())['config']['lr'] == 0.5
    # fewer epochs than it ran: refused as before, naming them
    with pytest.raises(ValueError, match='is fewer than the 3 epochs'):
        Trainer(H.ToyDeepSets(3, 2), config(**dict(base, epochs=2, resume=resume))).fit(data,
                                                                                          val)


def test_a_run_stopped_early_resumed_with_other_settings_is_refused_unless_it_trains_on(
        tmp_path):
    # (min_delta: no epoch after the first improves; patience 1 stops it after epoch 1)
    run = tmp_path / 'run'
    data, val = REG_TRAIN[:32], REG_VAL[:8]
    base = dict(epochs=4, patience=1, min_delta=1e9, out_dir=str(run))
    first = Trainer(H.ToyDeepSets(3, 2), config(**base)).fit(data, val)
    assert first.stopped_early and first.epochs_run == 2
    kept = (run / 'result.json').read_bytes()
    resume = str(run / 'checkpoint.pt')
    with pytest.raises(CheckpointError, match=r'stopped early: its last 1 epoch did not '
                                              r'improve .*epochs 4, now 6.*patience >= 2 '):
        Trainer(H.ToyDeepSets(3, 2), config(**dict(base, epochs=6, resume=resume))).fit(data,
                                                                                          val)
    assert (run / 'result.json').read_bytes() == kept
    again = Trainer(H.ToyDeepSets(3, 2), config(**dict(base, patience=2, resume=resume))).fit(
        data, val)
    assert again.epochs_run == 3 and again.stopped_early


def test_finished_run_changes_names_only_a_resume_that_trains_nothing():
    from torch_mz.train.checkpoint import finished_run_changes
    saved = config(epochs=3, patience=2).to_dict()
    state = {'config': saved, 'epoch': 2, 'bad_epochs': 0}
    assert finished_run_changes(state, dict(saved, lr=0.5)) == {'lr': (saved['lr'], 0.5)}
    assert finished_run_changes(state, dict(saved, device='cuda', out_dir='x')) is None
    assert finished_run_changes(state, dict(saved, epochs=4, lr=0.5)) is None  # (trains on)
    assert finished_run_changes(state, dict(saved, epochs=2, lr=0.5)) is None  # (refused so)
    assert finished_run_changes(dict(state, epoch=1), dict(saved, lr=0.5)) is None
    stopped = dict(state, epoch=1, bad_epochs=2)
    assert finished_run_changes(stopped, dict(saved, lr=0.5)) == {'lr': (saved['lr'], 0.5)}
    assert finished_run_changes(stopped, dict(saved, lr=0.5, patience=3)) is None
    assert finished_run_changes({'config': saved}, dict(saved, lr=0.5)) is None  # (unknown)
    assert finished_run_changes(dict(state, world_size=2), saved, world_size=1) == {
        'world_size': (2, 1)}
    assert finished_run_changes(dict(state, world_size=2), saved) is None


def test_describe_run_shows_what_same_run_compares():
    # a refusal on pos_dim or the channels described both runs as "model 'egnn'"
    from torch_mz.train.checkpoint import describe_run, same_run

    def run(name='egnn', **entries):
        model = dict({'name': name, 'args': {'hidden_channels': 8}, 'in_channels': 3,
                      'out_channels': 1, 'pos_dim': 3, 'feature_columns': None}, **entries)
        return {'task': {'name': 'max', 'args': {}, 'split': {'seed': 0}}, 'model': model}
    for other in (dict(pos_dim=None), dict(in_channels=4), dict(out_channels=2),
                  dict(pos_dim=None, feature_columns=[0, 2])):
        assert not same_run(run(), run(**other)), other
        assert describe_run(run()) != describe_run(run(**other)), other
        for key, value in other.items():
            assert f'{key}={value!r}' in describe_run(run(**other))
    assert describe_run(run()) == ("task 'max' [data: seed=0], model 'egnn' "
                                   "(hidden_channels=8) [in_channels=3, out_channels=1, "
                                   "pos_dim=3]")  # (an EGNN given pos_dim reads no columns)
    # what a preset does not read is not compared, nor shown
    assert same_run(run('mz', pos_dim=None), run('mz', pos_dim=4))
    assert 'pos_dim' not in describe_run(run('mz')) and 'in_channels=3' in describe_run(run(
        'mz'))
    # the trainer's refusal names the difference
    from torch_mz.models import build_model
    trainer = Trainer(build_model('egnn', 3, 1, hidden_channels=8, num_layers=1),
                      config(), run_info={'task': run()['task']})
    with pytest.raises(CheckpointError, match=r"pos_dim=3\].*pos_dim=None"):
        trainer._check_run_info({'run_info': run(args={'hidden_channels': 8,
                                                       'num_layers': 1})}, 'run.pt')


def test_same_run_takes_feature_columns_no_model_reads_as_none(tmp_path):
    # build_model('deepsets', in, out) records feature_columns None, a task's run its columns
    # (train_one, the command line): the same model, refused as another run; so was such a
    # model given to load_model(path, model=...)
    from torch_mz.inference import check_built_as_recorded
    from torch_mz.models import build_model
    from torch_mz.train.checkpoint import same_run

    def run(name, columns, pos_dim=None):
        return {'model': {'name': name, 'args': {}, 'in_channels': 8, 'out_channels': 1,
                          'pos_dim': pos_dim, 'feature_columns': columns}}
    for name in ('mz', 'deepsets', 'perceiver'):
        assert same_run(run(name, None), run(name, [0, 2])), name
    assert same_run(run('egnn', [0], pos_dim=3), run('egnn', None, pos_dim=3))  # (unread)
    for name in ('egnn', 'egnn-qm9', 'my-model'):  # (read without pos_dim; a label may be one)
        assert not same_run(run(name, None), run(name, [0, 2])), name
        assert not same_run(run(name, [0, 1]), run(name, [0, 2])), name
    data, val = REG_TRAIN[:32], REG_VAL[:8]

    def model(columns=None):
        torch.manual_seed(0)
        return build_model('deepsets', 3, 2, feature_columns=columns, hidden_channels=8)
    out = tmp_path / 'run'
    Trainer(model(), config(epochs=1, warmup_epochs=0, out_dir=str(out))).fit(data, val)
    resumed = Trainer(model([0, 2]), config(epochs=2, warmup_epochs=0, out_dir=str(out),
                                            resume=str(out / 'checkpoint.pt'))).fit(data, val)
    assert resumed.epochs_run == 2
    check_built_as_recorded(load_checkpoint(out / 'best.pt'), model([0, 2]), 'best.pt')


def test_a_run_with_epochs_left_resumed_with_another_seed_is_refused(tmp_path):
    # the command line refused another --seed for every resume; train() and Trainer.fit only
    # warned where epochs were left: the next epochs shuffled as another seed's, and
    # result.json and best.pt recorded a seed the run did not start with
    run = tmp_path / 'run'
    data, val = REG_TRAIN[:32], REG_VAL[:8]
    Trainer(H.ToyDeepSets(3, 2), config(epochs=1, warmup_epochs=0, seed=3,
                                        out_dir=str(run))).fit(data, val)
    files = {name: (run / name).read_bytes() for name in os.listdir(run)}
    resume = str(run / 'checkpoint.pt')

    def more(seed):  # one more epoch
        return config(epochs=2, warmup_epochs=0, seed=seed, out_dir=str(run), resume=resume)
    for seed in (0, 4):
        with pytest.raises(CheckpointError, match=rf"trained with seed 3, not {seed}: .*"
                                                  rf"resume with seed=3, or start a new run$"):
            train(H.ToyDeepSets(3, 2), data, val, config=more(seed))
        assert {name: (run / name).read_bytes() for name in os.listdir(run)} == files
    assert train(H.ToyDeepSets(3, 2), data, val, config=more(3)).epochs_run == 2
    assert json.loads((run / 'result.json').read_text())['config']['seed'] == 3


def test_an_interrupted_run_ended_by_its_resume_is_refused_naming_what_ends_it(tmp_path):
    # a run interrupted after 2 of its 4 epochs, resumed with epochs=2: refused as "a finished
    # run (it has run its 2 epochs)", told to resume "with epochs >= 3 to train on under the
    # new ones" (epochs=2); epochs=1 was told "resume with epochs=2 or more"
    from torch_mz.train import TrainingStopped, stop_by
    run = tmp_path / 'run'
    data, val = REG_TRAIN[:32], REG_VAL[:8]

    def fit(**changes):
        return Trainer(H.ToyDeepSets(3, 2), config(**dict(
            dict(epochs=4, warmup_epochs=0, out_dir=str(run)), **changes))).fit(data, val)
    for resume in ({}, dict(resume=str(run / 'checkpoint.pt'))):  # (stopped after each epoch)
        with pytest.raises(TrainingStopped), stop_by(0):
            fit(**resume)
    resume = str(run / 'checkpoint.pt')
    assert load_checkpoint(resume)['epoch'] == 1
    with pytest.raises(ValueError, match=r'resume with epochs=3 or more, or with its own '
                                         r'epochs=4$'):
        fit(epochs=1, resume=resume)
    with pytest.raises(CheckpointError, match=r'holds a run not finished \(2 of its 4 epochs '
                                              r'run\) that this configuration ends at once: '
                                              r'.*epochs 4, now 2.* or with epochs >= 3 to '
                                              r'train on, or start a new run$'):
        fit(epochs=2, resume=resume)
    with pytest.raises(CheckpointError, match=r'epochs >= 3 to train on under the new lr, or '):
        fit(epochs=2, lr=0.5, resume=resume)
    assert fit(epochs=3, resume=resume).epochs_run == 3  # (as said)


def test_the_public_names_torch_mz_train_leaves_in_their_modules_are_the_ones_it_names():
    # torch_mz.train's docstring: every public name is importable from it but the checkpoint
    # module's comparisons of runs, which it names; recorded_options stayed there unnamed
    import importlib
    import pkgutil
    import torch_mz.train as package
    doc = ' '.join(package.__doc__.split())
    left = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f'torch_mz.train.{info.name}')
        left |= {name for name in getattr(module, '__all__', ()) if name not in package.__all__}
    assert left == {'same_run', 'describe_run', 'config_changes', 'finished_run_changes',
                    'recorded_options'}
    for name in left:
        assert name in doc, name
