import math

import numpy as np
import pytest
import torch

from torch_mz.train import Trainer, cosine_with_warmup

from tests.train._common import H, REG_TRAIN, config


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


@pytest.mark.parametrize('warmup,total,name', [
    (math.nan, 10, 'warmup_steps'), (0, math.nan, 'total_steps'), (2.5, 10, 'warmup_steps'),
    (0, 2.5, 'total_steps'), (True, 3, 'warmup_steps'), ('1', 3, 'warmup_steps')])
def test_cosine_with_warmup_takes_only_integer_step_counts(warmup, total, name):
    # a NaN passed every comparison and scheduled NaN learning rates; 2.5 steps and True
    # were taken as counts
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match=f'Expected an integer {name} .got'):
        cosine_with_warmup(opt, warmup, total)
    assert cosine_with_warmup(opt, np.int64(1), np.int64(3)).get_last_lr() == [0.0]


def _closed_form(s, warm, total):
    if s < warm:
        return s / warm
    return 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm))) if s < total else 0.0


@pytest.mark.parametrize('warmup,total', [(0, 1), (1, 1), (0, 7), (3, 3), (2, 9), (5, 6)])
def test_cosine_with_warmup_follows_its_closed_form_at_every_step(warmup, total):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.3)
    sched = cosine_with_warmup(opt, warmup, total)
    lrs = []
    for _ in range(total + 2):
        lrs.append(opt.param_groups[0]['lr'])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.3 * _closed_form(s, warmup, total)
                                 for s in range(total + 2)], abs=1e-15)
    assert lrs[0] == (0.0 if warmup else 0.3) and lrs[total] == 0.0


@pytest.mark.parametrize('epochs,warmup,schedule', [(1, 0, 'epoch'), (1, 0, 'step'),
                                                    (3, 0, 'step'), (4, 2, 'step'),
                                                    (4, 1, 'epoch')])
def test_the_trainer_steps_at_the_closed_forms_rate(epochs, warmup, schedule):
    # every optimiser step's learning rate: per step or per epoch, from lr itself without a
    # warm-up (a run of one epoch too), never at step T's 0
    data = REG_TRAIN[:40]  # 3 steps per epoch at batch size 16, the last of 8 sets
    seen = []

    class Recording(Trainer):
        def _make_optimizer(self, batches_per_epoch):
            super()._make_optimizer(batches_per_epoch)
            self.optimizer.register_step_pre_hook(
                lambda opt, args, kwargs: seen.append(opt.param_groups[0]['lr']))

    cfg = config(epochs=epochs, warmup_epochs=warmup, lr=1e-3, schedule=schedule)
    Recording(H.ToyDeepSets(3, 2), cfg).fit(data)
    per = 3 if schedule == 'step' else 1
    want = [1e-3 * _closed_form(s // (3 // per), warmup * per, epochs * per)
            for s in range(3 * epochs)]
    assert seen == pytest.approx(want, abs=1e-15)
    assert seen[-1] > 0 and (seen[0] == 1e-3) == (warmup == 0)


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


def test_a_run_that_is_all_warm_up_is_named():
    # with warmup_epochs == epochs the learning rate never reaches lr (a run of one step
    # trained at 0: nothing); a warning says so, and the command line's default warm-up is at
    # most half the run
    from torch_mz.cli._common import _default_warmup
    with pytest.warns(UserWarning, match='Every one of the 1 epoch'):
        Trainer(H.ToyDeepSets(3, 2), config(epochs=1, warmup_epochs=1)).fit(REG_TRAIN[:16])
    assert [_default_warmup(e) for e in (1, 2, 5, 9, 10, 200)] == [0, 1, 2, 4, 5, 5]
