import json
import os

import pytest
import torch

from torch_mz.cli import _common, main

DATA = ['--task', 'max', '--n-train', '32', '--n-val', '8', '--n-test', '8', '--batch-size',
        '16', '--no-progress', '--model', 'deepsets:hidden_channels=8', '--epochs', '2']


def _records(out):
    return {name: open(os.path.join(out, name), 'rb').read()
            for name in ('result.json', 'best.pt', 'checkpoint.pt')}


def test_train_resume_of_a_finished_run_refuses_other_training_options(tmp_path, capsys,
                                                                       monkeypatch):
    # a finished run resumed with another --lr (the same --epochs) trained nothing, yet its
    # result.json and best.pt recorded the new lr (the trainer only warned); another --seed
    # was refused so, before any data load
    out = str(tmp_path / 'run')
    assert main(['train', *DATA, '--out', out]) == 0
    capsys.readouterr()
    kept = _records(out)
    checkpoint = os.path.join(out, 'checkpoint.pt')
    load = _common._load

    def no_load(*args, **kwargs):
        raise AssertionError('the data were loaded')
    monkeypatch.setattr(_common, '_load', no_load)
    for flags in (['--lr', '0.002'], ['--weight-decay', '0.3'], ['--batch-size', '8'],
                  ['--grad-clip', '0'], ['--warmup-epochs', '0'], ['--patience', '5'],
                  ['--lr', '0.002', '--weight-decay', '0']):
        args = [*DATA, *flags] if '--batch-size' not in flags else [
            *DATA[:DATA.index('--batch-size')], *DATA[DATA.index('--batch-size') + 2:], *flags]
        assert main(['train', *args, '--resume', checkpoint]) == 2, flags
        err = capsys.readouterr().err
        assert err.count('\n') == 1 and 'finished run' in err and 'has run its 2 epochs' in err
        assert f'{flags[0]} {flags[1]}' in err and '--epochs 3 or more' in err, err
        assert _records(out) == kept, flags
    monkeypatch.setattr(_common, '_load', load)
    assert json.load(open(os.path.join(out, 'result.json')))['config']['lr'] == 1e-4
    assert torch.load(os.path.join(out, 'best.pt'), weights_only=True)['config']['lr'] == 1e-4
    # more epochs train on with it
    assert main(['train', *DATA[:-1], '3', '--lr', '0.002', '--resume', checkpoint]) == 0
    result = json.load(open(os.path.join(out, 'result.json')))
    assert result['epochs_run'] == 3 and result['config']['lr'] == 0.002


def test_train_resume_of_an_interrupted_run_names_what_would_end_it(tmp_path, capsys):
    # a run interrupted after 2 of its 4 epochs: --epochs 1 was told to pass --epochs 2 or
    # more, which was then refused as "the finished run ... has run its 2 epochs", told to
    # "pass --epochs 3 or more to train on with it" (with --epochs 2)
    from torch_mz.train import TrainingStopped, stop_by
    out = str(tmp_path / 'run')
    checkpoint = os.path.join(out, 'checkpoint.pt')
    first = [*DATA[:-1], '4', '--warmup-epochs', '0']
    for argv in (['--out', out], ['--resume', checkpoint]):  # (stopped after each epoch)
        with pytest.raises(TrainingStopped), stop_by(0):
            main(['train', *first, *argv])
    assert torch.load(checkpoint, weights_only=True)['epoch'] == 1
    capsys.readouterr()
    kept = {name: open(os.path.join(out, name), 'rb').read() for name in os.listdir(out)}
    for flags, said in (
            (['--epochs', '1'], "--epochs 1 is fewer than the 2 epochs the checkpoint "
                                f"'{checkpoint}' has run: pass --epochs 3 or more, or leave "
                                "--epochs out to resume it with its own 4\n"),
            (['--epochs', '2'], f"--epochs 2: the run of checkpoint '{checkpoint}' was trained "
                                "with --epochs 4 and is not finished (2 of its 4 epochs run): "
                                "--epochs 2 would end it at once: resumed so, it would train "
                                "nothing, yet record --epochs 2 in its result.json and best.pt;"
                                " leave it out (or pass --epochs 4) to resume it, pass --epochs "
                                "3 or more to train on, or start a new run without --resume\n"),
            (['--epochs', '2', '--lr', '0.1'], "pass --epochs 3 or more to train on with --lr "
                                               "0.1, or start")):
        assert main(['train', *DATA[:-2], *flags, '--resume', checkpoint]) == 2, flags
        err = capsys.readouterr().err
        assert err.count('\n') == 1 and said in err, err
        assert {name: open(os.path.join(out, name), 'rb').read()
                for name in os.listdir(out)} == kept
    # as said: 3 epochs train on
    assert main(['train', *DATA[:-2], '--epochs', '3', '--resume', checkpoint]) == 0
    assert json.load(open(os.path.join(out, 'result.json')))['epochs_run'] == 3
