import argparse

import pytest

from torch_mz.study.budget import Budget, add_budget_arguments, choose_budget, study_config

QUICK = Budget(seeds=2, n_train=640, epochs=10, lr=1e-3)
FULL = Budget(seeds=3, n_train=5000, epochs=100, lr=1e-4, n_test=7)


def parse(argv, **kwargs):
    parser = argparse.ArgumentParser()
    add_budget_arguments(parser, quick_help='small', **kwargs)
    return parser.parse_args(argv)


def test_quick_full_and_overrides():
    assert choose_budget(parse([]), QUICK, FULL) == FULL
    assert choose_budget(parse(['--quick']), QUICK, FULL) == QUICK
    args = parse(['--quick', '--seeds', '5', '--lr', '0.01', '--device', 'cpu'])
    assert choose_budget(args, QUICK, FULL) == Budget(5, 640, 10, 0.01)
    assert args.device == 'cpu'
    # an option that is not offered keeps the budget's value
    args = parse(['--n-test', '3'], overrides=('n_test', 'epochs'))
    assert not hasattr(args, 'seeds')
    assert choose_budget(args, QUICK, FULL) == Budget(3, 5000, 100, 1e-4, n_test=3)
    with pytest.raises(ValueError, match="no budget option 'batch'"):
        parse([], overrides=('batch', ))


@pytest.mark.parametrize('argv', [['--epochs', '0'], ['--seeds', '0'], ['--n-train', '-5'],
                                  ['--lr', '0'], ['--lr', 'nan'], ['--seeds', '1.5']])
def test_a_budget_option_that_is_no_count_is_a_usage_error(argv, capsys):
    # a 0 was read as 'not given' and silently ignored: --epochs 0 trained the full 100 epochs
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    assert f'argument {argv[0]}' in capsys.readouterr().err


def test_choose_budget_refuses_a_value_that_is_no_count():
    # the same rule for a namespace built without the parser's types
    args = argparse.Namespace(quick=False, seeds=None, n_train=None, epochs=0, lr=None)
    with pytest.raises(ValueError, match='--epochs must be a count of at least 1, got 0'):
        choose_budget(args, QUICK, FULL)
    args = argparse.Namespace(quick=True, seeds=2, n_train=None, epochs=None, lr=-1e-3)
    with pytest.raises(ValueError, match='--lr must be a positive learning rate'):
        choose_budget(args, QUICK, FULL)
    args = argparse.Namespace(quick=True, seeds=2, n_train=None, epochs=3, lr=None)
    assert choose_budget(args, QUICK, FULL) == Budget(2, 640, 3, 1e-3)


def test_study_config():
    config = study_config(FULL, device='cpu', seed=4, patience=7)
    assert (config.epochs, config.warmup_epochs, config.lr, config.batch_size) == (100, 5, 1e-4, 64)
    assert (config.seed, config.patience, config.device, config.progress) == (4, 7, 'cpu', False)
    assert study_config(QUICK).warmup_epochs == 1  # a tenth of the epochs, at least 1
    assert study_config(Budget(1, 10, 3, 1e-3)).warmup_epochs == 1
    assert study_config(Budget(1, 10, 30, 1e-3), batch_size=8).batch_size == 8
    with pytest.raises(ValueError, match='lr=None'):
        study_config(Budget(1, 10, 3))


def test_split_sizes():
    assert QUICK.split_sizes() == (640, 160, 320)
    assert FULL.split_sizes() == (5000, 1250, 7)
    assert Budget(1, 3, 1).split_sizes() == (3, 1, 1)
    with pytest.raises(ValueError, match='n_train'):
        Budget(1, None, 1).split_sizes()


def test_a_bad_device_is_a_usage_error_when_parsed(capsys):
    # (a traceback from resolve_device came after the data were built)
    import torch
    parser = argparse.ArgumentParser()
    add_budget_arguments(parser, quick_help='q')
    assert parser.parse_args(['--device', 'cpu']).device == 'cpu'
    bad = ['foo', 'meta', 'mps', 'cpu:3', f'cuda:{torch.cuda.device_count()}'] + (
        [] if torch.cuda.is_available() else ['cuda'])
    for name in bad:
        with pytest.raises(SystemExit):
            parser.parse_args(['--device', name])
        assert '--device' in capsys.readouterr().err


def test_study_config_never_warms_up_the_whole_run():
    # epochs=1 (a script run with --epochs 1) was all warm-up: lr 0, nothing trained. The
    # warm-up is at most half the run, and the studies' budgets (5, 8, 10, 30, 100 and 200
    # epochs) keep theirs: only a run of 1 epoch changes
    warmup = {e: study_config(Budget(1, 10, e, 1e-3)).warmup_epochs
              for e in (1, 2, 3, 5, 8, 10, 19, 20, 30, 59, 60, 100, 200)}
    assert warmup == {1: 0, 2: 1, 3: 1, 5: 1, 8: 1, 10: 1, 19: 1, 20: 2, 30: 3, 59: 5, 60: 5,
                      100: 5, 200: 5}


def test_choose_budget_returns_a_count_as_a_python_int():
    # a count of integral value given as a float was kept a float (every task refuses
    # n_train=4000.0 as a set count, and range() a seed count of 2.0), and a NumPy count refused
    import numpy as np
    args = argparse.Namespace(quick=True, seeds=2.0, n_train=np.int64(4000), n_test=8.0,
                              epochs=np.int32(3), lr=np.float64(1e-3))
    budget = choose_budget(args, QUICK, FULL)
    assert budget == Budget(2, 4000, 3, 1e-3, n_test=8)
    assert all(type(getattr(budget, k)) is int for k in ('seeds', 'n_train', 'n_test', 'epochs'))
    assert type(budget.lr) is float
    for name, value in (('n_train', float('inf')), ('lr', float('inf')), ('seeds', np.bool_(1))):
        with pytest.raises(ValueError, match=f"--{name.replace('_', '-')} must be"):
            choose_budget(argparse.Namespace(quick=True, **{name: value}), QUICK, FULL)
