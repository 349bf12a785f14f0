import math

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
