import importlib.util
import json
import os

import pytest
import torch

from torch_mz.cli import DEMO_ARGS, build_parser, main

# The raw-file fixture of the dataset tests: importing it registers it for this module.
from tests.datasets.conftest import scanobjectnn_root

FIXTURES = (scanobjectnn_root, )  # used by name, as a test argument

PLOTS = importlib.util.find_spec('matplotlib') is not None

TINY = ['--task', 'quadratic-tdof', '--n-train', '48', '--n-val', '16', '--n-test', '16',
        '--task-arg', 'd=4', '--task-arg', 'tdof=2', '--set-size', '3,6', '--epochs', '2',
        '--warmup-epochs', '1', '--batch-size', '16', '--lr', '1e-3', '--no-progress']


def test_listings(capsys):
    assert main(['tasks']) == 0
    out = capsys.readouterr().out
    for name in ('quadratic-tdof', 'meb-radius', 'qm9', 'modelnet40'):
        assert name in out
    assert main(['--no-keep-freed-memory', 'models']) == 0  # the allocator flag goes first
    out = capsys.readouterr().out
    for name in ('mz', 'mz-1l', 'st-4l', 'egnn', 'deepsets', 'perceiver'):
        assert f'\n{name} ' in '\n' + out
    # each count is that of the model for the footnote's 3 input channels, EGNN's taken as
    # coordinates (egnn-qm9 was counted with 3 invariant features beside coordinates)
    from torch_mz.models import build_model, count_parameters
    rows = {line.split()[0]: int(line.split()[1].replace(',', ''))
            for line in out.splitlines()[1:] if line and not line.startswith('*')}
    assert '* for 3 input channels' in out
    for name in ('egnn', 'egnn-qm9', 'mz', 'deepsets'):
        pos_dim = 3 if name.startswith('egnn') else None
        assert rows[name] == count_parameters(build_model(name, 3, 1, pos_dim=pos_dim)), name


def test_train_writes_logs_and_resumes(tmp_path, capsys):
    out = str(tmp_path / 'run')
    assert main(['train', *TINY, '--model', 'mz-slim', '--out', out]) == 0
    result = json.load(open(os.path.join(out, 'result.json')))
    assert result['epochs_run'] == 2 and 'r2' in result['test_metrics']
    lines = open(os.path.join(out, 'metrics.jsonl')).read().strip().splitlines()
    assert len(lines) == 2
    # resume for one more epoch from the checkpoint
    assert main(['train', *[a if a != '2' else '3' for a in TINY], '--model', 'mz-slim',
                 '--out', out, '--resume', os.path.join(out, 'checkpoint.pt')]) == 0
    assert json.load(open(os.path.join(out, 'result.json')))['epochs_run'] == 3
    assert 'test' in capsys.readouterr().out
    # without --out the run goes on in the checkpoint's folder (it went to runs/<task>/...,
    # leaving a stale best.pt where the run was)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(['train', *[a if a != '2' else '4' for a in TINY], '--model', 'mz-slim',
                     '--resume', os.path.join('run', 'checkpoint.pt')]) == 0
    finally:
        os.chdir(cwd)
    assert json.load(open(os.path.join(out, 'result.json')))['epochs_run'] == 4
    assert not os.path.exists(tmp_path / 'runs')
    assert f"logs and checkpoints in {os.path.join('run')}" in capsys.readouterr().out


def test_train_and_compare_say_the_units_of_their_figures(tmp_path, capsys):
    # train printed "test loss 0.53, mse 1.77, ...": the loss on standardised targets beside
    # the mse in the target's units, read as two measures of one error
    import re
    out = str(tmp_path / 'run')
    assert main(['train', *TINY, '--model', 'deepsets', '--out', out]) == 0
    test = json.load(open(os.path.join(out, 'result.json')))['test_metrics']
    printed = capsys.readouterr().out
    assert re.search(r'test loss [-.\de]+ \(on standardised targets\); in target units: mse '
                     r'[-.\de]+, mae [-.\de]+, r2 [-.\de]+\n', printed), printed
    assert f"loss {test['loss']:.4g} (on standardised targets)" in printed
    from torch_mz.cli.train import _figures_with_units
    figures = dict(loss=2.0, mse=2.0, mae=1.0, r2=0.5)
    assert _figures_with_units(figures, 'regression', False) == (
        'loss 2, mse 2, mae 1, r2 0.5 (in target units)')
    assert _figures_with_units(dict(loss=0.7, accuracy=0.5, cross_entropy=0.7),
                               'classification', True) == (
        'loss 0.7, accuracy 0.5, cross_entropy 0.7')
    cmp = str(tmp_path / 'cmp')
    assert main(['compare', *TINY, '--models', 'deepsets', '--seeds', '1', '--out', cmp]) == 0
    note = ("Test mse and mae are in the target's units (mse squared); each run's `loss` in "
            "results.json (val and test) is the training criterion, the MSE of the "
            "standardised targets (not the mse).")
    assert note in open(os.path.join(cmp, 'results.md')).read()
    assert note in capsys.readouterr().out


def test_train_and_compare_say_several_targets_figures_are_means_over_them(tmp_path,
                                                                          capsys):
    # QM9's mu and alpha: the mse and mae were said to be "in target units", each the mean of
    # a figure in Debye^2 and one in bohr^6 (no one unit)
    from tests.datasets.raw_formats import write_qm9pack_csv
    from torch_mz.cli.compare import _units_note
    from torch_mz.cli.train import _figures_with_units
    csv_path = write_qm9pack_csv(str(tmp_path / 'pack' / 'qm9_part1.csv'))  # 4 molecules
    assert main(['train', '--task', 'qm9', '--root', str(tmp_path / 'QM9'), '--task-arg',
                 f'csv_path={csv_path}', '--task-arg', 'target=["mu", "alpha"]', '--n-train',
                 '2', '--n-val', '1', '--n-test', '1', '--model', 'deepsets', '--epochs', '1',
                 '--warmup-epochs', '0', '--batch-size', '2', '--no-progress', '--out',
                 str(tmp_path / 'run')]) == 0
    assert ('(on standardised targets); in target units, each the mean over the 2 targets: '
            'mse ') in capsys.readouterr().out
    figures = dict(loss=2.0, mse=2.0, mae=1.0, r2=0.5)
    assert _figures_with_units(figures, 'regression', False, 3) == (
        'loss 2, mse 2, mae 1, r2 0.5 (in target units, each the mean over the 3 targets)')
    assert _figures_with_units(figures, 'regression', False, 1) == (
        'loss 2, mse 2, mae 1, r2 0.5 (in target units)')
    assert "the means over the 2 targets, each target's in its own units" in _units_note(
        'regression', True, 2)
    assert "in the target's units" in _units_note('regression', True, 1)


def test_compare_writes_table_json_and_plot(tmp_path, capsys):
    out = str(tmp_path / 'cmp')
    assert main(['compare', *TINY, '--models', 'mz-slim,rigid,egnn', '--seeds', '2',
                 '--out', out]) == 0
    payload = json.load(open(os.path.join(out, 'results.json')))
    assert [s['model'] for s in payload['summary']] == ['mz-slim', 'rigid', 'egnn']
    assert all(s['seeds'] == 2 for s in payload['summary'])
    assert len(payload['runs']) == 6
    # the two seeds of one model are different runs
    r2 = [r['test']['r2'] for r in payload['runs'] if r['model'] == 'rigid']
    assert r2[0] != r2[1]
    table = open(os.path.join(out, 'results.md')).read()
    assert '| mz-slim |' in table and 'test r2' in table
    if PLOTS:  # (the [plot] extra: without matplotlib the plot is left out, with a note)
        assert os.path.getsize(os.path.join(out, 'results.png')) > 1000
    assert '| egnn |' in capsys.readouterr().out


@pytest.mark.parametrize('argv, message', [
    (['train', '--task', 'nope', '--model', 'mz'], "unknown task 'nope'"),
    (['train', *TINY, '--model', 'transformer'], "unknown model 'transformer'"),
    (['train', *TINY[:-1], '--set-size', '5,2', '--model', 'mz'], 'LOW <= HIGH'),
    (['train', *TINY, '--model', 'mz', '--task-arg', 'tdof'], 'KEY=VALUE'),
    (['train', *TINY, '--model', 'mz', '--epochs', '0'], 'epochs'),
    (['train', *TINY, '--model', 'mz', '--n-train', '0'], '--n-train must be at least 1'),
    (['train', *TINY, '--model', 'mz', '--resume', 'missing.pt'], 'does not exist'),
    (['compare', *TINY, '--models', 'mz,,', '--seeds', '0'], 'seeds'),
])
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and 'Traceback' not in err
    assert err.count('\n') == 1


# the reproduction of issue 12 (T): tiny sizes, one epoch
T = ['--n-train', '32', '--n-val', '8', '--n-test', '8', '--batch-size', '16', '--no-progress',
     '--warmup-epochs', '0', '--epochs', '1']
SMALL = ['--model-arg', 'dim=8', '--model-arg', 'num_inducing=2', '--model-arg', 'd_ff=8']


@pytest.mark.parametrize('extra, message', [
    (['--task-arg', 'nosuch=3'], "task 'max' has no option 'nosuch' (options: d, reduce"),
    (['--task-arg', 'd=abc'], "task 'max': option 'd' expects an integer (got 'abc')"),
    (['--model-arg', 'foo=bar'], "--model-arg: model 'mz': "),
    (['--model-arg', 'dim=abc'], "--model-arg: model 'mz': option 'dim' expects an integer"),
    (['--lr', '1e6'], 'lower the learning rate'),
])
def test_bad_options_and_a_diverging_run_exit_2_with_one_line(extra, message, tmp_path, capsys):
    assert main(['train', '--task', 'max', '--model', 'mz', *T, *extra,
                 '--out', str(tmp_path / 'run')]) == 2
    err = capsys.readouterr().err
    assert message in err and 'Traceback' not in err
    assert err.count('\n') == 1
    if extra[0] == '--model-arg':
        assert extra[1].split('=')[0] in err


def test_missing_dataset_names_what_and_where(tmp_path, monkeypatch, capsys):
    pytest.importorskip('trimesh')  # (asked for before any download: the [datasets] extra)
    from tests.datasets.raw_formats import offline_download_url
    from torch_mz.datasets import modelnet
    # never the real 400 MB download
    monkeypatch.setattr(modelnet, 'download_url', offline_download_url)
    empty = tmp_path / 'empty'
    empty.mkdir()
    assert main(['train', '--task', 'modelnet40', '--model', 'mz', '--root', str(empty), *T]) == 2
    err = capsys.readouterr().err
    assert 'Traceback' not in err and err.count('\n') == 1
    raw = os.path.join(str(empty), 'raw')
    assert 'ModelNet40' in err and raw in err and modelnet.MODELNET40_URL in err
    assert 'no network' in err


def _snapshot(folder):
    return {os.path.relpath(os.path.join(d, n), folder): open(os.path.join(d, n), 'rb').read()
            for d, _, names in os.walk(folder) for n in names}


def test_train_refuses_to_overwrite_an_earlier_run(tmp_path, capsys):
    out = str(tmp_path / 'run')
    argv = ['train', '--task', 'max', '--model', 'rigid', *T, *SMALL, '--out', out]
    assert main(argv) == 0
    first = _snapshot(out)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"'{out}' already holds a run" in err and '--overwrite' in err and '--resume' in err
    assert err.count('\n') == 1
    assert _snapshot(out) == first  # nothing touched
    # resuming into the run's own folder is allowed; into another run's folder it is not
    other = str(tmp_path / 'other')
    assert main(['train', '--task', 'max', '--model', 'rigid', *T, *SMALL, '--out', other]) == 0
    capsys.readouterr()
    assert main([*argv[:-2], '--out', other, '--epochs', '2', '--resume',
                 os.path.join(out, 'checkpoint.pt')]) == 2
    assert 'choose another --out' in capsys.readouterr().err
    assert main([*argv, '--resume', os.path.join(out, 'checkpoint.pt'), '--overwrite']) == 2
    # --overwrite replaces the run, and files that are not the run's stay
    open(os.path.join(out, 'notes.txt'), 'w').write('mine')
    assert main([*argv, '--overwrite', '--data-seed', '1']) == 0
    after = _snapshot(out)
    assert after['notes.txt'] == b'mine'
    assert after['checkpoint.pt'] != first['checkpoint.pt']
    assert sorted(after) == sorted([*first, 'notes.txt'])


def test_train_and_compare_refuse_a_folder_another_command_is_writing(tmp_path, capsys,
                                                                      monkeypatch):
    # a second command into the folder of a run in progress went ahead: with --overwrite it
    # removed that run's files (and the other run wrote on beside its own), without it both
    # wrote their checkpoints and results between each other's while the first had none yet
    from tests.test_files import held_by_another_process
    from torch_mz.cli import _common
    run, cmp = str(tmp_path / 'run'), str(tmp_path / 'cmp')
    assert main(['train', '--task', 'max', '--model', 'deepsets', *T, '--out', run]) == 0
    assert main(['compare', '--task', 'max', '--models', 'deepsets', *T, '--seeds', '1',
                 '--out', cmp]) == 0
    first = _snapshot(str(tmp_path))
    capsys.readouterr()

    def load(*args, **kwargs):
        raise ValueError('the data were loaded')
    monkeypatch.setattr(_common, '_load', load)  # (refused before the data are read)
    for out, argv in ((run, ['train', '--model', 'deepsets', '--overwrite']),
                      (run, ['train', '--model', 'deepsets', '--resume',
                             os.path.join(run, 'checkpoint.pt')]),
                      (cmp, ['compare', '--models', 'deepsets', '--seeds', '1', '--overwrite']),
                      (cmp, ['compare', '--models', 'deepsets', '--resume'])):
        with held_by_another_process(out):
            assert main([*argv, '--task', 'max', *T, '--out', out]) == 2, argv
        err = capsys.readouterr().err
        assert err == (f"torch-mz: error: '{out}' is in use by another process (a run writing "
                       f"its files there): wait for it to end, or choose another --out\n"), argv
        assert _snapshot(str(tmp_path)) == first  # nothing removed, nothing written
    new = str(tmp_path / 'new')
    with held_by_another_process(new):  # a folder inside a held one is another folder
        assert main(['train', '--model', 'deepsets', '--task', 'max', *T, '--out',
                     os.path.join(new, 'run')]) == 2
        assert capsys.readouterr().err == 'torch-mz: error: the data were loaded\n'
    assert os.listdir(new) == []  # (made for the hold, left empty: removed again)


def test_train_overwrite_keeps_holding_the_folder_it_empties(tmp_path, capsys, monkeypatch):
    # --overwrite removed the earlier run's files, then the emptied folder: the command's hold
    # was on a folder that no longer existed, and until the trainer made it again another
    # command could take it (this run was then refused, its data loaded)
    import threading
    from torch_mz._files import FolderInUseError, folder_lock
    from torch_mz.cli import _common
    out = str(tmp_path / 'run')
    argv = ['train', '--task', 'max', '--model', 'deepsets', *T, '--out', out]
    assert main(argv) == 0
    held = os.stat(out).st_ino
    run, seen = _common._run, []

    def checked(*args, **kwargs):
        def other_command():  # (another thread stands for it: refused the same way)
            try:
                with folder_lock(out):
                    seen.append('taken')
            except FolderInUseError:
                seen.append('refused')
        thread = threading.Thread(target=other_command)
        thread.start()
        thread.join()
        seen.append(os.path.isdir(out) and os.stat(out).st_ino == held)
        return run(*args, **kwargs)
    monkeypatch.setattr(_common, '_run', checked)
    assert main([*argv, '--overwrite', '--data-seed', '1']) == 0, capsys.readouterr().err
    assert seen == ['refused', True]
    assert {'checkpoint.pt', 'result.json'} <= set(os.listdir(out))


@pytest.mark.skipif(not hasattr(os, 'symlink'), reason='no symbolic links here')
def test_overwrite_into_a_run_folder_that_is_a_link_replaces_the_run(tmp_path, capsys):
    # the earlier run's files were removed, then the emptied folder: rmdir refused the link
    # ("[Errno 20] Not a directory"), and the command ended having trained nothing
    real = tmp_path / 'disk' / 'run'
    real.mkdir(parents=True)
    link = str(tmp_path / 'run')
    os.symlink(real, link)
    argv = ['train', '--task', 'max', '--model', 'deepsets', *T, '--out', link]
    assert main(argv) == 0
    first = _snapshot(str(real))
    capsys.readouterr()
    assert main([*argv, '--overwrite', '--data-seed', '1']) == 0, capsys.readouterr().err
    assert os.path.islink(link) and os.path.realpath(link) == str(real.resolve())
    after = _snapshot(str(real))
    assert sorted(after) == sorted(first) and after['checkpoint.pt'] != first['checkpoint.pt']


def test_compare_refuses_to_overwrite_and_overwrite_removes_stale_model_folders(tmp_path,
                                                                                capsys):
    out = str(tmp_path / 'cmp')
    argv = ['compare', '--task', 'max', *T, '--seeds', '1', '--out', out]
    assert main([*argv, '--models', 'deepsets,rigid']) == 0
    first = _snapshot(out)
    assert {'rigid-seed0/result.json', 'deepsets-seed0/result.json', 'results.json'} <= set(first)
    capsys.readouterr()
    assert main([*argv, '--models', 'deepsets']) == 2
    err = capsys.readouterr().err
    assert 'already holds the results of a comparison' in err and '--overwrite' in err
    assert 'rigid-seed0' in err and err.count('\n') == 1
    assert _snapshot(out) == first
    assert main([*argv, '--models', 'deepsets', '--overwrite']) == 0
    assert sorted(os.listdir(out)) == ['comparison.json', 'deepsets-seed0', 'results.json',
                                       'results.md'] + (['results.png'] if PLOTS else [])
    # (the old rigid-seed0 is gone)
    assert [r['model'] for r in json.load(open(os.path.join(out, 'results.json')))['runs']] == [
        'deepsets']


@pytest.mark.parametrize('second, message', [
    # another task with the same shapes, or another preset: refused before the data are built
    (['--task', 'sum', '--model', 'rigid'], "a run of task 'max', not 'sum': pass --task max"),
    (['--task', 'max', '--model', 'st-4l'],
     "a run of model 'rigid', not 'st-4l': pass --model rigid"),
    (['--task', 'max', '--model', 'rigid', '--model-arg', 'dropout=0'],  # other model options
     'was written by another run'),
])
def test_resume_from_another_task_or_model_is_refused(second, message, tmp_path, capsys,
                                                      monkeypatch):
    out = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', '--model', 'rigid', *T, *SMALL, '--out', out]) == 0
    capsys.readouterr()
    if 'dropout=0' not in second:
        from torch_mz.cli import _common as cli
        monkeypatch.setattr(cli, '_load', lambda *a, **k: pytest.fail('the data were built'))
    assert main(['train', *second, *T, *SMALL, '--epochs', '2', '--out', out,
                 '--resume', os.path.join(out, 'checkpoint.pt')]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count('\n') == 1


def test_resume_with_the_other_target_normalisation_is_refused(tmp_path, capsys):
    # it only warned: the weights went on training in the other units, early stopping compared
    # validation losses across the switch, and best.pt kept the earlier (normalised) weights
    # under normalize_targets=False: predictions with mean 0 written as target units
    out = str(tmp_path / 'run')
    assert main(['train', '--task', 'sum', '--model', 'rigid', *T, *SMALL, '--out', out]) == 0
    capsys.readouterr()
    assert main(['train', '--task', 'sum', '--model', 'rigid', *T, *SMALL, '--epochs', '2',
                 '--no-normalize', '--out', out, '--resume',
                 os.path.join(out, 'checkpoint.pt')]) == 2
    err = capsys.readouterr().err
    assert 'normalize_targets=True' in err and 'without --no-normalize' in err
    assert err.count('\n') == 1


def test_corrupt_checkpoint_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / 'checkpoint.pt'
    bad.write_bytes(b'not a checkpoint')
    assert main(['train', *TINY, '--model', 'rigid', '--out', str(tmp_path / 'r'),
                 '--resume', str(bad)]) == 2
    err = capsys.readouterr().err
    assert 'checkpoint' in err and 'Traceback' not in err


def test_demo_arguments_parse():
    args = build_parser().parse_args(DEMO_ARGS)
    assert args.models == 'mz-1l,st-4l,egnn,deepsets' and args.task == 'quadratic-tdof'
    assert args.overwrite  # the demo may be run again over its own output


# issue 13, item 6: model specs with options, read as the benchmarks read them
def test_compare_and_train_take_model_specs_with_options(tmp_path, capsys):
    out = str(tmp_path / 'cmp')
    assert main(['compare', '--task', 'max', *T, '--seeds', '1', '--out', out, '--models',
                 'rigid:dim=8,num_inducing=2,d_ff=8,deepsets:hidden_channels=8']) == 0
    payload = json.load(open(os.path.join(out, 'results.json')))
    assert [s['model'] for s in payload['summary']] == [
        'rigid:dim=8,num_inducing=2,d_ff=8', 'deepsets:hidden_channels=8']
    assert sorted(n for n in os.listdir(out) if n.endswith('seed0')) == [
        'deepsets_hidden_channels=8-seed0', 'rigid_dim=8_num_inducing=2_d_ff=8-seed0']
    ckpt = torch.load(os.path.join(out, 'rigid_dim=8_num_inducing=2_d_ff=8-seed0', 'best.pt'),
                      weights_only=True)
    assert ckpt['run_info']['model']['args'] == {'dim': 8, 'num_inducing': 2, 'd_ff': 8}
    capsys.readouterr()
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', *T, '--model', 'deepsets:hidden_channels=8',
                 '--out', run]) == 0
    ckpt = torch.load(os.path.join(run, 'best.pt'), weights_only=True)
    assert ckpt['run_info']['model']['args'] == {'hidden_channels': 8}


@pytest.mark.parametrize('argv, message', [
    (['compare', '--models', 'mz,hypernet:rank=x', '--seeds', '1'],
     "model spec 'hypernet:rank=x': option 'rank' expects an integer (got 'x')"),
    (['compare', '--models', 'mz,nope:rank=4', '--seeds', '1'], "unknown model 'nope'"),
    (['train', '--model', 'rigid:nosuch=1'], "model spec 'rigid:nosuch=1': "),
    (['train', '--model', 'mz,rigid'], '--model takes one model'),
    # a flag given as text other than true/false, a width or count out of range, an option
    # the model would ignore: refused, never a traceback or a silently different model
    (['train', '--model', 'mz:log_n=abc'], "'log_n' must be True or False (got 'abc')"),
    (['train', '--model', 'egnn:edge_gate=abc'], "'edge_gate' must be True or False"),
    (['train', '--model', 'mz:hidden_channels=-5'], "'hidden_channels' must be an integer"),
    (['train', '--model', 'deepsets:hidden_channels=0'], "'hidden_channels' must be an int"),
    (['train', '--model', 'perceiver:num_cross=-1'], "'num_cross' must be an integer >= 1"),
    (['train', '--model', 'rigid:num_matrix_generators=-3'], "'num_matrix_generators' must"),
    (['train', '--model', 'mz:rank=4'], "'rank' is the rank of the HyperNet value operator"),
])
def test_bad_model_specs_exit_2_with_one_line(argv, message, tmp_path, capsys):
    assert main([argv[0], '--task', 'max', *T, *argv[1:], '--out', str(tmp_path / 'o')]) == 2
    err = capsys.readouterr().err
    assert message in err and 'Traceback' not in err and err.count('\n') == 1


# issue 13, item 3: torch-mz predict
def _read_csv(path):
    import csv
    with open(path) as f:
        return list(csv.DictReader(f))


def test_predict_writes_one_row_per_test_set_in_target_units(tmp_path, capsys):
    from torch_mz import load_model
    from torch_mz.tasks import load_task
    from torch_mz.train import predict
    run = str(tmp_path / 'run')
    assert main(['train', *TINY, '--model', 'mz-slim', *SMALL, '--out', run]) == 0
    out = str(tmp_path / 'pred' / 'test.csv')
    # the task options (d=4, tdof=2, set size) come from the checkpoint
    assert main(['predict', os.path.join(run, 'best.pt'), '--task', 'quadratic-tdof',
                 '--n-test', '16', '--out', out]) == 0
    assert 'test.csv' in capsys.readouterr().out
    rows = _read_csv(out)
    assert len(rows) == 16 and list(rows[0]) == ['set', 'prediction', 'target', 'ihw']
    assert [int(r['set']) for r in rows] == list(range(16))  # a synthetic split's positions
    task = load_task('quadratic-tdof', n_train=48, n_val=16, n_test=16, d=4, tdof=2,
                     set_size=(3, 6))
    pred, ihw = predict(load_model(os.path.join(run, 'best.pt')), task.test, device='cpu')
    assert [float(r['target']) for r in rows] == pytest.approx([d.y.item() for d in task.test])
    assert [float(r['prediction']) for r in rows] == pytest.approx(pred.view(-1).tolist(),
                                                                   rel=1e-6, abs=1e-6)
    assert [float(r['ihw']) for r in rows] == pytest.approx(ihw.view(-1).tolist(), rel=1e-6)
    # target units: the predictions scatter around the targets' mean, not around 0
    targets = [float(r['target']) for r in rows]
    mean_target = sum(targets) / len(targets)
    assert abs(pred.mean().item() - mean_target) < 3 * float(torch.tensor(targets).std())
    # several targets: prediction_0, ..., target_0, ...
    run2 = str(tmp_path / 'run2')
    assert main(['train', '--task', 'max', '--task-arg', 'd=2', *T, *SMALL, '--model', 'rigid',
                 '--out', run2]) == 0
    out2 = str(tmp_path / 'max.csv')
    assert main(['predict', os.path.join(run2, 'checkpoint.pt'), '--task', 'max', '--n-test',
                 '5', '--out', out2]) == 0
    assert list(_read_csv(out2)[0]) == ['set', 'prediction_0', 'prediction_1', 'target_0',
                                        'target_1', 'ihw']
    # without --task: the task the checkpoint records (it was required)
    out3 = str(tmp_path / 'max_again.csv')
    assert main(['predict', os.path.join(run2, 'checkpoint.pt'), '--n-test', '5', '--out',
                 out3]) == 0
    assert open(out3).read() == open(out2).read()


def test_predict_says_which_epochs_model_it_used(tmp_path, capsys):
    # predict on checkpoint.pt used the model of the last epoch, whose errors were read as those
    # of the best epoch that result.json gives (and disagreed with them), without a word
    run = str(tmp_path / 'run')
    assert main(['train', *TINY, '--model', 'deepsets', '--out', run]) == 0
    best = torch.load(os.path.join(run, 'best.pt'), weights_only=True)['epoch']
    state = torch.load(os.path.join(run, 'checkpoint.pt'), weights_only=True)
    capsys.readouterr()
    out = str(tmp_path / 'p.csv')
    assert main(['predict', os.path.join(run, 'best.pt'), '--out', out]) == 0
    assert capsys.readouterr().out.endswith(f'-> {out} (the model of epoch {best})\n')
    state.update(epoch=1, best_epoch=0)  # (a run whose last epoch is not its best)
    last = str(tmp_path / 'last.pt')
    torch.save(state, last)
    assert main(['predict', last, '--out', out, '--overwrite']) == 0
    assert capsys.readouterr().out.endswith(
        f'-> {out} (the model of epoch 1, the last trained; the best validation epoch, whose '
        f'test figures result.json gives, is 0: its model is in best.pt)\n')
    state['config']['restore_best'] = False  # (result.json gives the last epoch's figures)
    torch.save(state, last)
    assert main(['predict', last, '--out', out, '--overwrite']) == 0
    assert capsys.readouterr().out.endswith(f'-> {out} (the model of epoch 1)\n')


def test_predict_reads_the_checkpoint_once(tmp_path, capsys, monkeypatch):
    # the test split and the weights come from one read of the file: read three times, a run
    # that replaced best.pt between the reads gave the weights of another epoch than the split's
    run = str(tmp_path / 'run')
    assert main(['train', *TINY, '--model', 'rigid', *SMALL, '--out', run]) == 0
    path = os.path.join(run, 'best.pt')
    reads = []
    load = torch.load

    def counted(f, *args, **kwargs):
        reads.append(os.fspath(f) if isinstance(f, (str, os.PathLike)) else f)
        return load(f, *args, **kwargs)
    monkeypatch.setattr(torch, 'load', counted)
    out = str(tmp_path / 'test.csv')
    assert main(['predict', path, '--n-test', '4', '--out', out]) == 0
    assert reads.count(path) == 1, reads
    assert len(_read_csv(out)) == 4


def test_predict_bad_input_exits_2_with_one_line(tmp_path, capsys):
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', *T, *SMALL, '--model', 'rigid', '--out', run]) == 0
    best = os.path.join(run, 'best.pt')
    taken = tmp_path / 'taken.csv'
    taken.write_text('mine')
    cases = [
        ([os.path.join(run, 'nope.pt'), '--task', 'max'], 'does not exist'),
        ([best, '--task', 'sum'], "was trained on task 'max', not 'sum'"),
        ([best, '--task', 'max', '--task-arg', 'd=3'], 'takes 16 input channels'),
        ([best, '--task', 'nope'], "unknown task 'nope'"),
        ([best, '--task', 'max', '--n-test', '0'], '--n-test must be at least 1'),
        ([os.path.join(run, 'metrics.csv'), '--task', 'max'], 'could not be read'),
    ]
    for argv, message in cases:
        capsys.readouterr()
        assert main(['predict', *argv, '--out', str(tmp_path / 'p.csv'),
                     '--no-progress']) == 2, message  # (no bar of the data drawn first)
        err = capsys.readouterr().err
        assert message in err and 'Traceback' not in err and err.count('\n') == 1, err
    assert not (tmp_path / 'p.csv').exists()
    assert main(['predict', best, '--task', 'max', '--n-test', '3', '--out', str(taken)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert taken.read_text() == 'mine'
    assert main(['predict', best, '--task', 'max', '--n-test', '3', '--out', str(taken),
                 '--overwrite']) == 0
    assert len(_read_csv(taken)) == 3


def test_predict_does_not_replace_a_file_made_while_it_ran(tmp_path, capsys, monkeypatch):
    # --out was checked at the start and replaced at the end: a file another process made
    # meanwhile (the data read, the forward passes: minutes) was replaced without --overwrite
    import torch_mz.inference
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', *T, *SMALL, '--model', 'rigid', '--out', run]) == 0
    best, out = os.path.join(run, 'best.pt'), tmp_path / 'p.csv'
    columns = torch_mz.inference._column_tensors

    def meanwhile(*args, **kwargs):
        out.write_text('theirs')  # (another process)
        return columns(*args, **kwargs)
    monkeypatch.setattr(torch_mz.inference, '_column_tensors', meanwhile)
    capsys.readouterr()
    assert main(['predict', best, '--n-test', '3', '--out', str(out), '--no-progress']) == 2
    assert capsys.readouterr().err == (f"torch-mz: error: '{out}' was made (by another "
                                       f"process) while predict ran; pass --overwrite to "
                                       f"replace it, or choose another --out\n")
    assert out.read_text() == 'theirs'
    assert sorted(os.listdir(tmp_path)) == ['p.csv', 'run']  # (no temporary file left)
    assert main(['predict', best, '--n-test', '3', '--out', str(out), '--overwrite']) == 0
    assert len(_read_csv(out)) == 3


def test_version_is_the_package_version(capsys):
    import torch_mz
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(['--version'])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f'torch-mz {torch_mz.__version__}'


# review of 2026-12-04: predict and resume see the training run's data
def _mse(rows):
    return sum((float(r['prediction']) - float(r['target'])) ** 2 for r in rows) / len(rows)


def test_predict_uses_the_data_seed_and_sizes_the_checkpoint_records(tmp_path, capsys):
    run = str(tmp_path / 'run')
    assert main(['train', *TINY, '--data-seed', '3', '--model', 'rigid', *SMALL,
                 '--out', run]) == 0
    best = os.path.join(run, 'best.pt')
    assert torch.load(best, weights_only=True)['run_info']['task']['split'] == dict(
        seed=3, n_train=48, n_val=16, n_test=16)
    result = json.load(open(os.path.join(run, 'result.json')))
    out = str(tmp_path / 'p.csv')
    # no --data-seed, no --n-test: the training run's test split, so its test MSE
    assert main(['predict', best, '--task', 'quadratic-tdof', '--out', out]) == 0
    rows = _read_csv(out)
    assert len(rows) == 16
    assert _mse(rows) == pytest.approx(result['test_metrics']['mse'], rel=1e-5)
    capsys.readouterr()
    # another seed draws other data: refused, where it used to predict on it silently
    assert main(['predict', best, '--task', 'quadratic-tdof', '--data-seed', '0', '--out',
                 out, '--overwrite']) == 2
    err = capsys.readouterr().err
    assert 'trained on data seed 3' in err and err.count('\n') == 1
    # the same seed given, and more test sets (a synthetic test split is drawn on its own)
    assert main(['predict', best, '--task', 'quadratic-tdof', '--data-seed', '3', '--n-test',
                 '40', '--out', out, '--overwrite']) == 0
    assert [r['target'] for r in _read_csv(out)[:16]] == [r['target'] for r in rows]
    # resuming with data drawn from another seed is refused (a seed not given is the run's)
    capsys.readouterr()
    assert main(['train', *[a if a != '2' else '3' for a in TINY], '--model', 'rigid', *SMALL,
                 '--data-seed', '0', '--out', run, '--resume',
                 os.path.join(run, 'checkpoint.pt')]) == 2
    err = capsys.readouterr().err
    assert 'was written by another run' in err and 'seed=3' in err and 'seed=0' in err


def test_predict_on_qm9_takes_the_training_runs_test_molecules(tmp_path, capsys):
    # the bug: predict --n-test 1 split QM9 as (0, 0, 1) and took a training molecule
    from tests.datasets.raw_formats import write_qm9pack_csv
    from torch_mz.tasks import load_task
    csv_path = write_qm9pack_csv(str(tmp_path / 'pack' / 'qm9_part1.csv'))  # 4 molecules
    data = ['--task', 'qm9', '--root', str(tmp_path / 'QM9'), '--task-arg',
            f'csv_path={csv_path}', '--n-train', '2', '--n-val', '1', '--n-test', '1']
    run = str(tmp_path / 'run')
    assert main(['train', *data, '--model', 'deepsets', '--epochs', '1', '--warmup-epochs', '0',
                 '--batch-size', '2', '--no-progress', '--out', run]) == 0
    task = load_task('qm9', n_train=2, n_val=1, n_test=1, root=str(tmp_path / 'QM9'),
                     csv_path=csv_path)
    out = str(tmp_path / 'p.csv')
    best = os.path.join(run, 'best.pt')
    assert main(['predict', best, '--task', 'qm9', '--root', str(tmp_path / 'QM9'), '--n-test',
                 '1', '--out', out]) == 0
    rows = _read_csv(out)
    # the columns named by QM9's target (mu, the default), for one target too
    assert list(rows[0]) == ['set', 'gdb_idx', 'prediction_mu', 'target_mu']
    assert [float(r['target_mu']) for r in rows] == pytest.approx([task.test[0].y.item()])
    # each row names its molecule: its index in the processed dataset and its QM9 index
    assert [int(r['set']) for r in rows] == list(task.test.indices())
    assert [int(r['gdb_idx']) for r in rows] == [int(task.test[0].gdb_idx)]
    assert all(abs(float(rows[0]['target_mu']) - d.y.item()) > 1e-6 for d in task.train)
    capsys.readouterr()
    assert main(['predict', best, '--task', 'qm9', '--root', str(tmp_path / 'QM9'), '--n-test',
                 '2', '--out', out, '--overwrite']) == 2
    assert 'holds 1 sets' in capsys.readouterr().err


def test_predict_names_the_columns_by_qm9s_targets(tmp_path, capsys):
    # prediction_0, target_0, ... where the task knows its targets' names (mu, alpha)
    from tests.datasets.raw_formats import write_qm9pack_csv
    from torch_mz import load_model
    from torch_mz.tasks import load_task
    from torch_mz.train import predict
    csv_path = write_qm9pack_csv(str(tmp_path / 'pack' / 'qm9_part1.csv'))  # 4 molecules
    root = str(tmp_path / 'QM9')
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'qm9', '--root', root, '--task-arg', f'csv_path={csv_path}',
                 '--task-arg', 'target=["mu", "alpha"]', '--n-train', '2', '--n-val', '1',
                 '--n-test', '1', '--model', 'deepsets', '--epochs', '1', '--warmup-epochs', '0',
                 '--batch-size', '2', '--no-progress', '--out', run]) == 0
    best, out = os.path.join(run, 'best.pt'), str(tmp_path / 'p.csv')
    assert main(['predict', best, '--root', root, '--out', out]) == 0
    rows = _read_csv(out)
    assert list(rows[0]) == ['set', 'gdb_idx', 'prediction_mu', 'prediction_alpha', 'target_mu',
                             'target_alpha']
    task = load_task('qm9', n_train=2, n_val=1, n_test=1, root=root, csv_path=csv_path,
                     target=['mu', 'alpha'])
    pred = predict(load_model(best), task.test, device='cpu')
    got = [float(r[f'{what}_{name}']) for what in ('prediction', 'target') for r in rows
           for name in ('mu', 'alpha')]
    assert got == pytest.approx(pred.view(-1).tolist() + torch.cat(
        [d.y.view(-1) for d in task.test]).tolist(), rel=1e-6, abs=1e-6)
    assert 'prediction_mu, prediction_alpha' in capsys.readouterr().out
    # a target named twice names no one column: numbered, as without names
    assert main(['predict', best, '--root', root, '--task-arg', 'target=["mu", "mu"]',
                 '--out', out, '--overwrite']) == 0
    assert list(_read_csv(out)[0]) == ['set', 'gdb_idx', 'prediction_0', 'prediction_1',
                                       'target_0', 'target_1']
    # targets other than the model's (its mu and alpha scored on alpha and mu): numbered too
    # (its predictions of mu were written as prediction_alpha); the model's own in another form
    # (indices) are named, and no longer warned about as another task
    capsys.readouterr()
    assert main(['predict', best, '--root', root, '--task-arg', 'target=["alpha", "mu"]',
                 '--out', out, '--overwrite']) == 0
    assert list(_read_csv(out)[0]) == ['set', 'gdb_idx', 'prediction_0', 'prediction_1',
                                       'target_0', 'target_1']
    assert 'differs from the training run' in capsys.readouterr().err
    assert main(['predict', best, '--root', root, '--task-arg', 'target=[0, 1]', '--out', out,
                 '--overwrite']) == 0
    assert list(_read_csv(out)[0]) == ['set', 'gdb_idx', 'prediction_mu', 'prediction_alpha',
                                       'target_mu', 'target_alpha']
    assert 'warning' not in capsys.readouterr().err


def test_predict_rebuilds_the_model_before_reading_the_data(tmp_path, capsys, monkeypatch):
    # a checkpoint whose model cannot be rebuilt was refused only after the test split was
    # built (for QM9 the whole dataset read)
    import torch_mz.tasks
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', *T, *SMALL, '--model', 'rigid', '--out', run]) == 0
    state = torch.load(os.path.join(run, 'best.pt'), weights_only=True)
    unbuildable = dict(state, run_info=dict(state['run_info'], model=dict(
        state['run_info']['model'], args={'no_such_option': 1})))
    unrecorded = dict(state, run_info={k: v for k, v in state['run_info'].items()
                                       if k != 'model'})

    def no_data(*args, **kwargs):
        pytest.fail('predict read the data before rebuilding the model')
    monkeypatch.setattr(torch_mz.tasks, 'load_task', no_data)
    for name, ckpt, message in (('bad.pt', unbuildable, 'cannot be rebuilt'),
                                ('old.pt', unrecorded, 'does not record how to build')):
        path = str(tmp_path / name)
        torch.save(ckpt, path)
        capsys.readouterr()
        assert main(['predict', path, '--out', str(tmp_path / 'p.csv')]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count('\n') == 1, err
    assert not (tmp_path / 'p.csv').exists()


def test_predict_refuses_another_number_of_outputs_and_warns_on_changed_options(tmp_path,
                                                                                capsys):
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', '--task-arg', 'd=4', *T, *SMALL, '--model', 'rigid',
                 '--out', run]) == 0  # four targets: the maximum of each coordinate
    best, out = os.path.join(run, 'best.pt'), str(tmp_path / 'p.csv')
    capsys.readouterr()
    assert main(['predict', best, '--task', 'max', '--task-arg', 'reduce=mean', '--out',
                 out, '--no-progress']) == 2  # one target
    err = capsys.readouterr().err
    assert 'predicts 4 output(s)' in err and err.count('\n') == 1
    assert not os.path.exists(out)
    run2 = str(tmp_path / 'run2')
    assert main(['train', *TINY, '--model', 'deepsets', '--out', run2]) == 0  # tdof=2
    capsys.readouterr()
    assert main(['predict', os.path.join(run2, 'best.pt'), '--task', 'quadratic-tdof',
                 '--task-arg', 'tdof=3', '--out', out]) == 0
    err = capsys.readouterr().err
    assert "warning: --task-arg tdof=3 differs from the training run's tdof=2" in err


def test_compare_resume_continues_an_interrupted_comparison_exactly(tmp_path, capsys):
    from torch_mz.train import TrainingStopped, stop_by
    argv = ['compare', '--task', 'max', *T[:-1], '2', '--seeds', '1', '--models',
            'deepsets,rigid:dim=8,num_inducing=2,d_ff=8']
    whole = str(tmp_path / 'whole')
    assert main([*argv, '--out', whole]) == 0
    cut = str(tmp_path / 'cut')
    with pytest.raises(TrainingStopped), stop_by(0.0):  # stops after the first epoch
        main([*argv, '--out', cut])
    assert sorted(os.listdir(cut)) == ['comparison.json', 'deepsets-seed0']
    capsys.readouterr()
    assert main([*argv, '--out', cut]) == 2
    assert '--resume to continue it' in capsys.readouterr().err
    assert main([*argv, '--out', cut, '--resume', '--lr', '3e-3']) == 2  # other settings
    assert "lr 0.0001, now 0.003" in capsys.readouterr().err
    assert main([*argv, '--out', cut, '--resume']) == 0
    assert 'resuming 1 of 2 runs' in capsys.readouterr().out
    runs = {tag: json.load(open(os.path.join(tag, 'results.json')))['runs']
            for tag in (whole, cut)}
    for a, b in zip(runs[whole], runs[cut]):
        assert a['model'] == b['model'] and a['epochs_run'] == b['epochs_run'] == 2
        assert a['test'] == pytest.approx(b['test'], rel=1e-6)
    # a finished comparison resumed trains nothing more and gives the same table
    assert main([*argv, '--out', cut, '--resume']) == 0
    assert 'resuming 2 of 2 runs' in capsys.readouterr().out
    again = json.load(open(os.path.join(cut, 'results.json')))['runs']
    assert len(again) == len(runs[cut])  # (pytest.approx takes no list of dicts since 9.2)
    for a, b in zip(again, runs[cut]):
        assert a['test'] == pytest.approx(b['test'])


@pytest.mark.parametrize('argv, message', [
    (['compare', '--models', 'deepsets,rigid,deepsets', '--seeds', '1'],
     "'deepsets' is given twice"),
    (['compare', '--models', 'rigid:dim=8 ,rigid:dim=8', '--seeds', '1'], 'given twice'),
    (['train', '--model', 'rigid', '--epochs', '3', '--warmup-epochs', '5'], 'warmup'),
])
def test_duplicate_models_and_bad_settings_exit_2_before_any_data(argv, message, tmp_path,
                                                                  capsys):
    # qm9 from a folder with no data: the settings are refused before loading is tried
    assert main([argv[0], '--task', 'qm9', '--root', str(tmp_path / 'none'), '--no-progress',
                 *argv[1:], '--out', str(tmp_path / 'o')]) == 2
    err = capsys.readouterr().err
    assert message in err and 'Traceback' not in err and err.count('\n') == 1, err


def test_python_spellings_of_flags_are_the_flags():
    # 'False' is not JSON: read as text it was a true flag ('mz:log_n=False' switched it on)
    from torch_mz.options import parse_key_values
    assert parse_key_values(['log_n=False', 'a=True', 'b=None', 'c=false', 'd=Falsy']) == dict(
        log_n=False, a=True, b=None, c=False, d='Falsy')


@pytest.mark.parametrize('extra, message', [
    (['--device', 'gpu'], "Expected device 'auto', 'cpu', 'cuda' or 'cuda:<index>'"),
    (['--seed', '99999999999999999999'], '--seed must be in [0, 2**32)'),
    (['--grad-clip', '-5'], '--grad-clip must be a positive norm, or 0 for no clipping'),
    (['--grad-clip', 'nan'], '--grad-clip must be a positive norm'),
    (['--patience', '-3'], '--patience must be a number of epochs, or 0'),
])
def test_a_bad_setting_with_overwrite_exits_before_the_old_run_is_removed(extra, message,
                                                                          tmp_path, capsys):
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', *T, '--model', 'deepsets', '--out', run]) == 0
    before = sorted(os.listdir(run))
    capsys.readouterr()
    assert main(['train', '--task', 'max', *T, '--model', 'deepsets', '--out', run,
                 '--overwrite', *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and 'Traceback' not in err and err.count('\n') == 1, err
    assert sorted(os.listdir(run)) == before  # nothing lost


def test_zero_turns_clipping_and_early_stopping_off(tmp_path):
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', *T, '--model', 'deepsets', '--out', run,
                 '--grad-clip', '0', '--patience', '0']) == 0
    config = json.load(open(os.path.join(run, 'result.json')))['config']
    assert config['grad_clip'] is None and config['patience'] is None


def test_paths_and_options_that_cannot_work_exit_2_before_any_data(tmp_path, capsys):
    a_file = tmp_path / 'a_file'
    a_file.write_text('mine')
    for argv, message in [
            (['--task', 'max', '--out', str(a_file / 'sub')], 'is a file, not a folder'),
            (['--task', 'qm9', '--set-size', '5,10'], "--set-size draws the sets of a "
                                                      "synthetic task; 'qm9' is a real"),
            (['--task', 'qm9', '--root', str(a_file)], 'is a file, not a dataset folder')]:
        assert main(['train', *T, '--model', 'deepsets', *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and 'Traceback' not in err and err.count('\n') == 1, err
    assert a_file.read_text() == 'mine'
    assert main(['predict', str(a_file), '--task', 'max', '--out', '']) == 2
    assert '--out is empty' in capsys.readouterr().err
    assert main(['predict', str(a_file), '--task', 'max', '--out',
                 str(a_file / 'p.csv')]) == 2
    assert 'is a file, not a folder' in capsys.readouterr().err
    assert main(['models', '--in-channels', '0']) == 2
    assert '--in-channels must be at least 1' in capsys.readouterr().err


def test_an_out_path_of_the_wrong_kind_exits_2(tmp_path, capsys):
    a_file = tmp_path / 'a_file'
    a_file.write_text('mine')
    assert main(['train', '--task', 'max', *T, '--model', 'deepsets', '--out',
                 str(a_file)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', *T, '--model', 'deepsets', '--out', run]) == 0
    capsys.readouterr()
    assert main(['predict', os.path.join(run, 'best.pt'), '--task', 'max', '--out',
                 str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert 'is a folder' in err and 'Traceback' not in err and a_file.read_text() == 'mine'


def test_compare_resume_keeps_the_seeds_of_the_comparison(tmp_path, capsys):
    # without --seeds a resumed comparison took the default 3, training a seed the interrupted
    # 2-seed comparison never had; the seeds are now read from the record it started with
    from torch_mz.train import TrainingStopped, stop_by
    argv = ['compare', '--task', 'max', *T[:-1], '2', '--models', 'deepsets']
    cut = str(tmp_path / 'cut')
    with pytest.raises(TrainingStopped), stop_by(0.0):
        main([*argv, '--seeds', '2', '--out', cut])
    record = json.load(open(os.path.join(cut, 'comparison.json')))
    assert (record['models'], record['seeds']) == (['deepsets'], 2)
    capsys.readouterr()
    assert main([*argv, '--out', cut, '--resume']) == 0
    assert 'seeds 2' in capsys.readouterr().out
    runs = json.load(open(os.path.join(cut, 'results.json')))['runs']
    assert [r['seed'] for r in runs] == [0, 1]
    # a comparison from before the record: its folders hold the seeds that had started,
    # not necessarily all, so --seeds is asked for
    os.unlink(os.path.join(cut, 'comparison.json'))
    assert main([*argv, '--out', cut, '--resume']) == 2
    err = capsys.readouterr().err
    assert 'hold seeds up to 1' in err and 'pass --seeds' in err
    assert main([*argv, '--out', cut, '--resume', '--seeds', '3']) == 0  # more, when asked
    assert [r['seed'] for r in json.load(open(os.path.join(cut, 'results.json')))['runs']] == [
        0, 1, 2]


def test_compare_resume_records_the_runs_own_minutes(tmp_path, capsys, monkeypatch):
    # a resumed comparison's total_minutes counts this call alone (the epochs an earlier call
    # trained are not in it), without a word; run_minutes sums the runs' recorded times, as a
    # resumed study's report does
    import torch_mz.study as study
    from torch_mz.train import TrainingStopped, stop_by
    out = str(tmp_path / 'cmp')
    argv = ['compare', '--task', 'max', *T[:-1], '2', '--models', 'deepsets', '--seeds', '1']
    with pytest.raises(TrainingStopped), stop_by(0.0):
        main([*argv, '--out', out])
    real = study.train_models

    def earlier(*args, **kwargs):  # (runs whose earlier call trained them for 10 minutes)
        rows = real(*args, **kwargs)
        for row in rows:
            row['wall_time_s'] += 600.0
        return rows
    monkeypatch.setattr(study, 'train_models', earlier)
    assert main([*argv, '--out', out, '--resume']) == 0
    payload = json.load(open(os.path.join(out, 'results.json')))
    assert payload['run_minutes'] == pytest.approx(payload['runs'][0]['wall_time_s'] / 60)
    assert payload['run_minutes'] > 10 > payload['total_minutes']
    assert main([*argv, '--out', str(tmp_path / 'fresh')]) == 0  # (not resumed: no such figure)
    assert 'run_minutes' not in json.load(open(tmp_path / 'fresh' / 'results.json'))


def test_compare_writes_a_nan_figure_as_standard_json(tmp_path, capsys, monkeypatch):
    # results.json held a bare NaN (the test R^2 of a model that predicted inf on a test set):
    # invalid JSON for strict readers (jq, JavaScript's JSON.parse)
    import torch_mz.study as study
    real = study.train_models

    def overflowed(*args, **kwargs):
        rows = real(*args, **kwargs)
        rows[0]['test']['r2'] = float('nan')
        return rows
    monkeypatch.setattr(study, 'train_models', overflowed)
    out = str(tmp_path / 'cmp')
    assert main(['compare', '--task', 'max', *T, '--models', 'deepsets', '--seeds', '1',
                 '--out', out]) == 0

    def refuse(word):
        raise ValueError(f'not standard JSON: {word}')
    payload = json.loads(open(os.path.join(out, 'results.json')).read(), parse_constant=refuse)
    assert payload['runs'][0]['test']['r2'] is None and payload['summary'][0]['r2'] is None
    assert 'nan ± nan' in open(os.path.join(out, 'results.md')).read()  # (the table: as it was)


def test_compare_resume_refuses_runs_outside_the_comparison_and_other_data(tmp_path, capsys):
    out = str(tmp_path / 'cmp')
    argv = ['compare', '--task', 'max', *T, '--out', out]
    assert main([*argv, '--models', 'deepsets', '--seeds', '2']) == 0
    capsys.readouterr()
    assert main([*argv, '--models', 'deepsets', '--seeds', '1', '--resume']) == 2
    err = capsys.readouterr().err
    assert 'not in this comparison (deepsets-seed1)' in err and err.count('\n') == 1
    # more models may be added; other data is refused before anything trains
    assert main([*argv, '--models', 'mean-mlp,deepsets', '--seeds', '2', '--resume',
                 '--data-seed', '1']) == 2
    err = capsys.readouterr().err
    assert 'seed=0' in err and 'seed=1' in err and err.count('\n') == 1
    assert not os.path.exists(os.path.join(out, 'mean-mlp-seed0'))
    assert main([*argv, '--models', 'deepsets,mean-mlp', '--seeds', '2', '--resume']) == 0
    runs = json.load(open(os.path.join(out, 'results.json')))['runs']
    assert [(r['model'], r['seed']) for r in runs] == [('deepsets', 0), ('deepsets', 1),
                                                      ('mean-mlp', 0), ('mean-mlp', 1)]


def test_set_size_belongs_to_its_flag_and_an_old_checkpoint_warns_before_loading(tmp_path,
                                                                                 capsys):
    assert main(['train', '--task', 'max', *T, '--task-arg', 'set_size=[2,5]', '--model',
                 'deepsets', '--out', str(tmp_path / 'o')]) == 2
    assert 'is --set-size LOW,HIGH' in capsys.readouterr().err
    run = str(tmp_path / 'run')
    assert main(['train', *TINY, '--model', 'deepsets', '--out', run]) == 0
    best, out = os.path.join(run, 'best.pt'), str(tmp_path / 'p.csv')
    capsys.readouterr()
    assert main(['predict', best, '--task', 'quadratic-tdof', '--task-arg', 'set_size=5',
                 '--out', out]) == 2
    err = capsys.readouterr().err
    assert 'set_size must be a pair [LOW, HIGH]' in err and err.count('\n') == 1
    # set-size generalisation: another range, no warning
    assert main(['predict', best, '--task', 'quadratic-tdof', '--task-arg', 'set_size=[8,12]',
                 '--out', out]) == 0
    assert 'warning' not in capsys.readouterr().err and len(_read_csv(out)) == 16
    # a checkpoint without the split (an earlier torch-mz): seed from --data-seed, a warning
    state = torch.load(best, weights_only=True)
    del state['run_info']['task']['split']
    old = str(tmp_path / 'old.pt')
    torch.save(state, old)
    assert main(['predict', old, '--task', 'quadratic-tdof', '--out', out, '--overwrite']) == 0
    assert 'does not record the data seed' in capsys.readouterr().err


def test_a_one_epoch_run_needs_no_warmup_option(tmp_path):
    # the warm-up defaults to 5 epochs, at most half the run (it was refused; then it was the
    # whole run, whose one step trained at learning rate 0)
    argv = [a for a in TINY if a not in ('--warmup-epochs', '1')]
    argv[argv.index('--epochs') + 1] = '1'
    out = str(tmp_path / 'run')
    assert main(['train', *argv, '--model', 'deepsets', '--out', out]) == 0
    state = torch.load(os.path.join(out, 'checkpoint.pt'), weights_only=True)
    assert state['config']['warmup_epochs'] == 0


def test_compare_names_only_the_files_it_wrote(tmp_path, capsys, monkeypatch):
    import torch_mz.study.plots as plots
    monkeypatch.setattr(plots, 'pyplot', lambda: (_ for _ in ()).throw(
        ImportError('no matplotlib')))
    out = str(tmp_path / 'cmp')
    assert main(['compare', *TINY, '--models', 'deepsets', '--seeds', '1', '--out', out]) == 0
    printed = capsys.readouterr().out
    assert not os.path.exists(os.path.join(out, 'results.png'))
    assert 'results.json' in printed and 'results.png' not in printed.splitlines()[-1]


def test_train_resume_takes_the_options_it_is_not_given_from_the_checkpoint(tmp_path, capsys):
    # `train --resume` continues that run: batch size, learning rate, warm-up... that the
    # command does not repeat are the checkpoint's (they were the defaults: 200 epochs,
    # batch 128, a continued run of another configuration); the ones it gives apply
    out = str(tmp_path / 'run')
    data = ['--task', 'max', '--n-train', '32', '--n-val', '8', '--n-test', '8',
            '--no-progress', '--model', 'deepsets:hidden_channels=8']
    assert main(['train', *data, '--batch-size', '16', '--lr', '0.003', '--patience', '0',
                 '--grad-clip', '0', '--warmup-epochs', '2', '--epochs', '2', '--out',
                 out]) == 0
    capsys.readouterr()
    assert main(['train', *data, '--epochs', '3', '--resume',
                 os.path.join(out, 'checkpoint.pt')]) == 0
    printed = capsys.readouterr().out
    assert ('resuming with the training options of the checkpoint (those not given): '
            'seed=0, batch_size=16, lr=0.003, weight_decay=1e-05, grad_clip=0, patience=0, '
            'no_normalize=False, warmup_epochs=2') in printed
    result = json.load(open(os.path.join(out, 'result.json')))
    assert result['epochs_run'] == 3
    config = result['config']
    assert (config['epochs'], config['batch_size'], config['lr'], config['warmup_epochs'],
            config['grad_clip'], config['patience']) == (3, 16, 0.003, 2, None, None)
    # a new run takes the defaults, as before
    parsed = build_parser().parse_args(['train', '--task', 'max', '--model', 'mz'])
    from torch_mz.cli._common import _fill_training_options
    assert _fill_training_options(parsed) == []
    assert (parsed.epochs, parsed.batch_size, parsed.lr, parsed.warmup_epochs) == (200, 128,
                                                                                   1e-4, None)


def test_an_unknown_model_option_is_named_before_the_data_load(monkeypatch, capsys):
    # (it was reported after every set was generated or processed, as MZAggregation's)
    from torch_mz.cli import _common as cli
    monkeypatch.setattr(cli, '_load', lambda *a, **k: pytest.fail('loaded the data first'))
    for argv in (['train', '--task', 'mst', '--model', 'mz:foo=1'],
                 ['compare', '--task', 'mst', '--models', 'rigid', '--model-arg', 'foo=1']):
        assert main(argv + ['--no-progress']) == 2
        err = capsys.readouterr().err
        assert "preset has no option 'foo'" in err and 'MZAggregation' not in err


def test_only_the_main_process_of_torchrun_prints_results(tmp_path, capsys, monkeypatch):
    # under torchrun every process ran main(): each printed the result lines
    from torch_mz.cli import _common as cli
    monkeypatch.setattr(cli, '_main_process', lambda: False)  # (a rank > 0 of torchrun)
    out = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', *T, '--model', 'deepsets:hidden_channels=8',
                 '--out', out]) == 0
    assert capsys.readouterr().out == ''
    monkeypatch.setattr(cli, '_main_process', lambda: True)
    assert main(['train', '--task', 'max', *T, '--model', 'deepsets:hidden_channels=8',
                 '--out', out, '--overwrite']) == 0
    assert 'logs and checkpoints in' in capsys.readouterr().out


@pytest.mark.parametrize('command', ['train', 'compare'])
def test_only_the_main_process_of_torchrun_draws_the_datas_progress_bars(tmp_path, capsys,
                                                                         monkeypatch, command):
    # under torchrun every rank loads the data: each drew its own bar of the generation (or
    # of a real dataset's processing) on stderr, where the trainer's are rank 0's alone
    from torch_mz.cli import _common as cli
    argv = [command, '--task', 'max', *[a for a in T if a != '--no-progress'],
            '--out', str(tmp_path / 'run'),
            *(['--model', 'deepsets:hidden_channels=8'] if command == 'train' else
              ['--models', 'deepsets:hidden_channels=8', '--seeds', '1'])]
    monkeypatch.setattr(cli, '_main_process', lambda: False)  # (a rank > 0 of torchrun)
    assert main(argv) == 0
    assert 'Generating max' not in capsys.readouterr().err
    monkeypatch.setattr(cli, '_main_process', lambda: True)
    assert main(argv + ['--overwrite']) == 0
    assert 'Generating max' in capsys.readouterr().err  # (the main process draws it)


def test_predict_shows_its_progress_bars_unless_no_progress(tmp_path, capsys, monkeypatch):
    # predict drew no bar: a dataset's processing (QM9, ModelNet40: minutes) and the forward
    # passes ran without a word, where train and compare draw theirs unless --no-progress
    from torch_mz.cli import _common as cli
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', *T, '--model', 'deepsets:hidden_channels=8', '--out',
                 run]) == 0
    capsys.readouterr()
    argv = ['predict', os.path.join(run, 'best.pt'), '--n-test', '4', '--out']
    out, quiet = str(tmp_path / 'bars.csv'), str(tmp_path / 'quiet.csv')
    assert main([*argv, out]) == 0
    err = capsys.readouterr().err
    assert 'Generating max' in err and 'predict: 100%' in err, err
    assert main([*argv, quiet, '--no-progress']) == 0
    assert capsys.readouterr().err == ''
    assert open(out).read() == open(quiet).read()  # (the CSV is the same)
    monkeypatch.setattr(cli, '_main_process', lambda: False)  # (a rank > 0 of torchrun)
    assert main([*argv, out, '--overwrite']) == 0
    assert capsys.readouterr().err == ''


def test_load_tasks_own_arguments_as_task_args_are_named_by_their_flags(tmp_path, capsys):
    # predict's --task-arg seed=1 (root=..., n_train=...) and train's name=x failed inside
    # load_task with a TypeError and its traceback; predict's progress=true, taken once as the
    # switch of the bars, would have been one too now that predict passes its own
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', *T, '--model', 'deepsets:hidden_channels=8', '--out',
                 run]) == 0
    best, out = os.path.join(run, 'best.pt'), str(tmp_path / 'p.csv')
    for arg, flag in (('seed=1', '--data-seed'), ('name="max"', '--task'), ('root="x"', '--root'),
                      ('n_train=3', '--n-train'), ('progress=true', '--no-progress')):
        capsys.readouterr()
        assert main(['predict', best, '--task-arg', arg, '--out', out]) == 2, arg
        err = capsys.readouterr().err
        assert f"--task-arg {arg.split('=')[0]}=... is {flag}, not a --task-arg" in err, err
        assert err.count('\n') == 1 and not os.path.exists(out)
    assert main(['train', '--task', 'max', *T, '--task-arg', 'name="x"', '--model', 'deepsets',
                 '--out', str(tmp_path / 'other')]) == 2
    assert "--task-arg name=... is --task, not a --task-arg" in capsys.readouterr().err


def test_the_allocator_flag_is_taken_after_the_command_too():
    parser = build_parser()
    base = ['train', '--task', 'max', '--model', 'mz']
    assert parser.parse_args(base).keep_freed_memory is True
    for argv in (['--no-keep-freed-memory'] + base, base + ['--no-keep-freed-memory'],
                 ['compare', '--task', 'max', '--models', 'mz', '--no-keep-freed-memory'],
                 ['predict', 'best.pt', '--out', 'p.csv', '--no-keep-freed-memory']):
        assert parser.parse_args(argv).keep_freed_memory is False


def test_resume_takes_the_warm_up_it_is_not_given_from_the_checkpoints(tmp_path, capsys):
    # runs made when the default warm-up was min(5, epochs): a resume with the same command
    # (no --warmup-epochs) continues them, where the new default (3 of 6 epochs) was refused as
    # another setting; a train --resume shorter than the checkpoint's warm-up says so
    out = str(tmp_path / 'cmp')
    data = ['--task', 'max', '--n-train', '32', '--n-val', '8', '--n-test', '8', '--batch-size',
            '16', '--no-progress']
    assert main(['compare', *data, '--models', 'deepsets:hidden_channels=8', '--seeds', '1',
                 '--epochs', '6', '--warmup-epochs', '5', '--out', out]) == 0
    capsys.readouterr()
    assert main(['compare', *data, '--models', 'deepsets:hidden_channels=8', '--seeds', '1',
                 '--epochs', '6', '--out', out, '--resume']) == 0
    assert 'warmup_epochs=5' in capsys.readouterr().out
    checkpoint = os.path.join(out, 'deepsets_hidden_channels=8-seed0', 'checkpoint.pt')
    assert main(['train', *data, '--model', 'deepsets:hidden_channels=8', '--epochs', '3',
                 '--resume', checkpoint, '--out', str(tmp_path / 'short')]) == 2
    assert ("--epochs 3 is fewer than the checkpoint's warm-up of 5 epochs: pass "
            "--warmup-epochs too") in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, 'symlink'), reason='no symbolic links here')
def test_train_resumed_through_a_link_to_a_checkpoint_goes_on_in_the_runs_folder(tmp_path,
                                                                                  monkeypatch):
    # --resume latest.pt (a link to run/checkpoint.pt) went on beside the link, away from the
    # run's logs and best.pt; and --out run was refused as another run's folder
    data = ['--task', 'max', '--n-train', '32', '--n-val', '8', '--n-test', '8', '--batch-size',
            '16', '--no-progress', '--model', 'deepsets:hidden_channels=8']
    monkeypatch.chdir(tmp_path)
    assert main(['train', *data, '--epochs', '2', '--out', 'run']) == 0
    os.symlink(os.path.join('run', 'checkpoint.pt'), 'latest.pt')
    assert main(['train', *data, '--epochs', '3', '--resume', 'latest.pt']) == 0
    assert json.load(open(os.path.join('run', 'result.json')))['epochs_run'] == 3
    assert sorted(os.listdir(tmp_path)) == ['latest.pt', 'run']  # nothing written beside it
    assert main(['train', *data, '--epochs', '4', '--resume', 'latest.pt', '--out', 'run']) == 0
    assert json.load(open(os.path.join('run', 'result.json')))['epochs_run'] == 4


def test_train_resume_keeps_the_checkpoints_seed(tmp_path, capsys):
    # (--seed fell back to 0: the run went on as seed 0, and recorded it)
    out = str(tmp_path / 'run')
    data = ['--task', 'max', '--n-train', '32', '--n-val', '8', '--n-test', '8', '--batch-size',
            '16', '--no-progress', '--model', 'deepsets:hidden_channels=8']
    assert main(['train', *data, '--seed', '3', '--epochs', '2', '--out', out]) == 0
    assert main(['train', *data, '--epochs', '3', '--resume',
                 os.path.join(out, 'checkpoint.pt')]) == 0
    assert 'seed=3' in capsys.readouterr().out
    assert json.load(open(os.path.join(out, 'result.json')))['config']['seed'] == 3


def test_train_resume_refuses_another_seed(tmp_path, capsys):
    # a finished seed-0 run resumed with --seed 5 trained nothing, yet its result.json and
    # best.pt said seed 5 (the seed, as the data seed, names the run)
    out = str(tmp_path / 'run')
    data = ['--task', 'max', '--n-train', '32', '--n-val', '8', '--n-test', '8', '--batch-size',
            '16', '--no-progress', '--model', 'deepsets:hidden_channels=8', '--epochs', '2']
    assert main(['train', *data, '--out', out]) == 0
    capsys.readouterr()
    checkpoint = os.path.join(out, 'checkpoint.pt')
    assert main(['train', *data, '--seed', '5', '--resume', checkpoint]) == 2
    err = capsys.readouterr().err
    assert "--seed 5 is not the seed 0 the run of checkpoint" in err and err.count('\n') == 1
    assert json.load(open(os.path.join(out, 'result.json')))['config']['seed'] == 0
    assert torch.load(os.path.join(out, 'best.pt'), weights_only=True)['config']['seed'] == 0
    assert main(['train', *data, '--seed', '0', '--resume', checkpoint]) == 0  # its own


def test_train_resumes_a_run_of_pythons_train_with_a_build_model_model(tmp_path, capsys):
    # README's example: build_model(name, in, out) records pos_dim None, the command line the
    # task's (meb-radius: 8), which no model but EGNN reads; the resume was refused as another
    # run although every option matched
    from torch_mz.models import build_model
    from torch_mz.tasks import load_task
    from torch_mz.train import TrainConfig, train
    out = str(tmp_path / 'meb')
    splits = load_task('meb-radius', n_train=32, n_val=8, n_test=8, seed=0)
    assert splits.pos_dim is not None
    model = build_model('deepsets', splits.in_channels, splits.out_channels, hidden_channels=8)
    train(model, splits.train, splits.val, splits.test, config=TrainConfig(
        epochs=2, warmup_epochs=1, batch_size=16, progress=False, out_dir=out))
    assert main(['train', '--task', 'meb-radius', '--n-train', '32', '--n-val', '8',
                 '--n-test', '8', '--no-progress', '--model', 'deepsets:hidden_channels=8',
                 '--epochs', '3', '--resume', os.path.join(out, 'checkpoint.pt')]) == 0
    assert json.load(open(os.path.join(out, 'result.json')))['epochs_run'] == 3
    capsys.readouterr()
    # another model is refused still
    assert main(['train', '--task', 'meb-radius', '--n-train', '32', '--n-val', '8',
                 '--n-test', '8', '--no-progress', '--model', 'deepsets:hidden_channels=12',
                 '--epochs', '4', '--resume', os.path.join(out, 'checkpoint.pt')]) == 2
    assert 'was written by another run' in capsys.readouterr().err


def test_train_into_a_run_folder_names_its_checkpoint_quoted(tmp_path, capsys):
    # 'pass ... or --resume PATH' named a folder with a space unquoted: two arguments
    out = str(tmp_path / 'my run')
    data = ['--task', 'max', '--n-train', '32', '--n-val', '8', '--n-test', '8', '--batch-size',
            '16', '--no-progress', '--model', 'deepsets:hidden_channels=8', '--epochs', '1',
            '--out', out]
    assert main(['train', *data]) == 0
    capsys.readouterr()
    assert main(['train', *data]) == 2
    err = capsys.readouterr().err
    assert f"or --resume '{os.path.join(out, 'checkpoint.pt')}' to continue it" in err, err


def test_train_resume_of_a_weights_only_checkpoint_is_refused_before_any_data(tmp_path, capsys,
                                                                             monkeypatch):
    # --resume best.pt was refused by the trainer once the data were loaded (QM9's minutes),
    # after the options had been said to be taken from it
    out = str(tmp_path / 'run')
    data = ['--task', 'max', '--n-train', '32', '--n-val', '8', '--n-test', '8', '--batch-size',
            '16', '--no-progress', '--model', 'deepsets:hidden_channels=8']
    assert main(['train', *data, '--epochs', '1', '--out', out]) == 0
    capsys.readouterr()
    from torch_mz.cli import _common as cli

    def no_data(*args, **kwargs):
        raise AssertionError('the data were loaded')
    monkeypatch.setattr(cli, '_load', no_data)
    assert main(['train', *data, '--epochs', '2', '--resume', os.path.join(out, 'best.pt')]) == 2
    captured = capsys.readouterr()
    assert 'resuming with' not in captured.out
    assert (f"holds model weights only (kind 'model'), not a run to continue: pass --resume "
            f"{os.path.join(out, 'checkpoint.pt')}") in captured.err
    assert captured.err.count('\n') == 1


def test_train_resume_of_best_pt_names_the_runs_checkpoint_through_a_link_quoted(
        tmp_path, capsys, monkeypatch):
    # the checkpoint.pt named was that beside a link to best.pt (another run's, here), and a
    # folder with a space was named unquoted: the command given was two arguments
    out = str(tmp_path / 'my run')
    data = ['--task', 'max', '--n-train', '32', '--n-val', '8', '--n-test', '8', '--batch-size',
            '16', '--no-progress', '--model', 'deepsets:hidden_channels=8']
    assert main(['train', *data, '--epochs', '1', '--out', out]) == 0
    here = tmp_path / 'here'
    here.mkdir()
    (here / 'checkpoint.pt').write_bytes(open(os.path.join(out, 'checkpoint.pt'), 'rb').read())
    os.symlink(os.path.join(out, 'best.pt'), here / 'latest.pt')
    monkeypatch.chdir(here)
    for named, run in ((os.path.join(out, 'best.pt'), out),
                       ('latest.pt', os.path.realpath(out))):
        capsys.readouterr()
        assert main(['train', *data, '--epochs', '2', '--resume', named]) == 2
        err = capsys.readouterr().err
        assert err.endswith(f"not a run to continue: pass --resume "
                            f"'{os.path.join(run, 'checkpoint.pt')}'\n"), err


def test_an_abbreviated_option_is_refused():
    # compare --seed 3 was read as --seeds 3 (three seeds)
    with pytest.raises(SystemExit):
        build_parser().parse_args(['compare', '--task', 'max', '--models', 'mz', '--seed', '3'])


def test_train_resume_keeps_the_options_the_command_line_cannot_set(tmp_path, capsys):
    # a run started from Python with schedule='epoch', min_delta, eval_batch_size...: `train
    # --resume` continued it with the per-step schedule (the CLI has no flag for them); and
    # without its loader workers (a run said to differ) and DDP's find_unused_parameters
    from torch_mz.study import train_one
    from torch_mz.tasks import load_task
    from torch_mz.train import TrainConfig
    out = str(tmp_path / 'run')
    task = load_task('max', seed=0, n_train=32, n_val=8, n_test=8)
    config = TrainConfig(epochs=2, batch_size=16, lr=1e-3, warmup_epochs=1, schedule='epoch',
                         min_delta=0.01, eval_batch_size=4, out_dir=out, device='cpu',
                         progress=False, num_workers=1, find_unused_parameters=True)
    train_one(task, 'deepsets', 0, config, hidden_channels=8)
    assert main(['train', '--task', 'max', '--n-train', '32', '--n-val', '8', '--n-test', '8',
                 '--no-progress', '--model', 'deepsets:hidden_channels=8', '--epochs', '3',
                 '--resume', os.path.join(out, 'checkpoint.pt')]) == 0
    printed = capsys.readouterr().out
    assert "schedule='epoch'" in printed and 'min_delta=0.01' in printed
    saved = json.load(open(os.path.join(out, 'result.json')))['config']
    assert (saved['schedule'], saved['min_delta'], saved['eval_batch_size']) == ('epoch', 0.01, 4)
    assert (saved['num_workers'], saved['find_unused_parameters']) == (1, True)
    assert 'num_workers=1' in printed
    # fewer epochs than the checkpoint has run: refused before any data are loaded
    assert main(['train', '--task', 'max', '--model', 'deepsets:hidden_channels=8',
                 '--epochs', '2', '--resume', os.path.join(out, 'checkpoint.pt')]) == 2
    err = capsys.readouterr().err
    assert '--epochs 2 is fewer than the 3 epochs' in err and err.count('\n') == 1


def test_checkpoint_paths_that_are_folders_or_lack_a_checkpoint(tmp_path, capsys):
    out = str(tmp_path / 'run')
    argv = ['train', '--task', 'max', '--model', 'rigid', *T, *SMALL]
    assert main([*argv, '--out', out]) == 0
    capsys.readouterr()
    for command in ([*argv, '--out', str(tmp_path / 'r2'), '--resume', out],
                    ['predict', out, '--out', str(tmp_path / 'p.csv')]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert 'is a folder' in err and os.path.join(out, 'checkpoint.pt') in err, err
    # a run interrupted in its first epoch (best.pt, no checkpoint.pt): no --resume advice
    os.unlink(os.path.join(out, 'checkpoint.pt'))
    assert main([*argv, '--out', out]) == 2
    err = capsys.readouterr().err
    assert 'no checkpoint.pt to resume from' in err and '--resume' not in err
    # a checkpoint whose weights are not finite: refused, not a CSV of NaN
    state = torch.load(os.path.join(out, 'best.pt'), weights_only=True)
    state['model'] = {k: torch.full_like(v, float('nan')) if v.is_floating_point() else v
                      for k, v in state['model'].items()}
    torch.save(state, str(tmp_path / 'nan.pt'))
    assert main(['predict', str(tmp_path / 'nan.pt'), '--out', str(tmp_path / 'p.csv')]) == 2
    assert 'non-finite weights' in capsys.readouterr().err
    assert not os.path.exists(tmp_path / 'p.csv')


def test_load_tasks_own_arguments_are_not_task_args(tmp_path, capsys):
    # `--task-arg seed=3` reached load_task twice: a TypeError traceback
    for arg, flag in (('seed=3', '--data-seed'), ('n_train=5', '--n-train'),
                      ('root=x', '--root')):
        assert main(['train', '--task', 'max', '--model', 'deepsets', '--task-arg', arg,
                     '--out', str(tmp_path / 'r')]) == 2
        err = capsys.readouterr().err
        assert flag in err and 'Traceback' not in err and err.count('\n') == 1


def test_torch_mz_debug_zero_is_off(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv('TORCH_MZ_DEBUG', '0')
    assert main(['train', '--task', 'nosuchtask', '--model', 'mz']) == 2
    assert capsys.readouterr().err.startswith('torch-mz: error:')


def test_predict_and_resume_refuse_other_data_than_the_runs(tmp_path, capsys):
    # the dataset folder was not recorded: predict (and a resumed run) on another QM9 scored
    # other molecules without a word. The sets a run held are recorded by digest now
    from tests.datasets.raw_formats import write_qm9pack_csv
    csv_path = write_qm9pack_csv(str(tmp_path / 'pack' / 'qm9_part1.csv'))  # 4 molecules
    data = ['--task', 'qm9', '--task-arg', f'csv_path={csv_path}', '--n-train', '2',
            '--n-val', '1', '--n-test', '1']
    run = str(tmp_path / 'run')
    assert main(['train', *data, '--root', str(tmp_path / 'A'), '--model', 'deepsets',
                 '--epochs', '1', '--warmup-epochs', '0', '--batch-size', '2', '--no-progress',
                 '--out', run]) == 0
    best, out = os.path.join(run, 'best.pt'), str(tmp_path / 'p.csv')
    recorded = torch.load(best, weights_only=True)['run_info']['task']['data']
    assert sorted(recorded) == ['test', 'train', 'val'] and all(recorded.values())
    # the same molecules in another folder are the same data
    assert main(['predict', best, '--root', str(tmp_path / 'B'), '--out', out]) == 0
    lines = open(csv_path).read().splitlines()
    with open(csv_path, 'w') as f:  # the same molecules in another order: other splits
        f.write('\n'.join([lines[0]] + lines[1:][::-1]) + '\n')
    capsys.readouterr()
    for root in ('A', 'C'):
        assert main(['predict', best, '--root', str(tmp_path / root), '--out', out,
                     '--overwrite']) == 2
        err = capsys.readouterr().err
        assert 'was trained on other data' in err and '--root' in err, err
    assert main(['train', *data, '--root', str(tmp_path / 'C'), '--model', 'deepsets',
                 '--epochs', '2', '--warmup-epochs', '0', '--batch-size', '2', '--no-progress',
                 '--resume', os.path.join(run, 'checkpoint.pt')]) == 2
    err = capsys.readouterr().err  # the two runs' descriptions, with their sets' digests
    assert err.count('[sets ') == 2 and 'Traceback' not in err, err


def test_a_resume_takes_another_form_of_the_runs_qm9_target(tmp_path, capsys):
    # target=0 names the target 'mu' names (predict took them as one task): train --resume and
    # compare --resume refused the other form as another run
    from tests.datasets.raw_formats import write_qm9pack_csv
    csv_path = write_qm9pack_csv(str(tmp_path / 'pack' / 'qm9_part1.csv'))  # 4 molecules
    data = ['--task', 'qm9', '--root', str(tmp_path / 'QM9'), '--task-arg',
            f'csv_path={csv_path}', '--n-train', '2', '--n-val', '1', '--n-test', '1',
            '--warmup-epochs', '0', '--batch-size', '2', '--no-progress']
    run, out = str(tmp_path / 'run'), str(tmp_path / 'compare')
    assert main(['train', *data, '--epochs', '1', '--task-arg', 'target="mu"', '--model',
                 'deepsets', '--out', run]) == 0
    assert main(['train', *data, '--epochs', '2', '--task-arg', 'target=0', '--model',
                 'deepsets', '--resume', os.path.join(run, 'checkpoint.pt')]) == 0
    assert main(['compare', *data, '--epochs', '1', '--task-arg', 'target="mu"', '--models',
                 'deepsets', '--seeds', '1', '--out', out]) == 0
    capsys.readouterr()
    assert main(['compare', *data, '--epochs', '1', '--task-arg', 'target=[0]', '--models',
                 'deepsets', '--seeds', '1', '--out', out, '--resume']) == 0
    assert 'resuming 1 of 1 runs' in capsys.readouterr().out
    assert main(['train', *data, '--epochs', '3', '--task-arg', 'target=1', '--model',
                 'deepsets', '--resume', os.path.join(run, 'checkpoint.pt')]) == 2
    assert 'was written by another run' in capsys.readouterr().err  # (alpha: another task)


def test_python_dash_m_torch_mz_is_the_command():
    import subprocess
    import sys
    done = subprocess.run([sys.executable, '-m', 'torch_mz', 'tasks'], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and 'quadratic-tdof' in done.stdout, done.stderr


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly():
    # `torch-mz models | head -1`: the writes after head had gone failed with
    # "torch-mz: error: [Errno 32] Broken pipe" (exit status 2); now the command ends without a
    # word, with the status a shell reports for a command SIGPIPE ended
    import signal
    import subprocess
    import sys
    from torch_mz.cli import EXIT_BROKEN_PIPE
    done = subprocess.Popen([sys.executable, '-m', 'torch_mz', 'tasks'], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    done.stdout.close()  # (the reader gone before the first line is written)
    err = done.stderr.read().decode()
    assert done.wait(timeout=120) == EXIT_BROKEN_PIPE == 128 + signal.SIGPIPE, err
    assert err == ''


@pytest.mark.skipif(not os.path.exists('/dev/full'), reason='no /dev/full here')
def test_output_to_a_full_disk_ends_with_an_error_not_a_traceback():
    # `torch-mz tasks > file` on a full disk: the flush that main added for closed pipes raised
    # the OSError out of main (a traceback, then Python's "Exception ignored" and status 120);
    # now the one-line error and status 2 of any other OSError
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONUNBUFFERED'}  # (buffered)
    with open('/dev/full', 'w') as full:
        done = subprocess.run([sys.executable, '-m', 'torch_mz', 'tasks'], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr == 'torch-mz: error: [Errno 28] No space left on device\n'


def test_a_broken_pipe_that_is_not_the_output_is_an_error(capsys, monkeypatch):
    # a BrokenPipeError of another pipe (a DataLoader worker's, a socket) where standard
    # output is no file descriptor (a stream the caller put there, which no reader closed)
    # ended the command without a word, with status 141
    import torch_mz.cli

    def broken(args):
        raise BrokenPipeError(32, 'Broken pipe')
    monkeypatch.setattr(torch_mz.cli, 'cmd_tasks', broken)
    assert main(['tasks']) == 2
    assert capsys.readouterr().err == 'torch-mz: error: [Errno 32] Broken pipe\n'


def test_train_resume_takes_the_data_options_it_is_not_given_from_the_checkpoint(
        tmp_path, capsys, monkeypatch):
    # the data options were the defaults: a resumed run built the task's default data first
    # (5,000 / 1,000 / 2,000 sets; QM9's 50K molecules) only to refuse them
    from torch_mz.cli import _common as cli
    out = str(tmp_path / 'run')
    assert main(['train', '--task', 'quadratic-tdof', '--n-train', '24', '--n-val', '8',
                 '--n-test', '8', '--data-seed', '3', '--task-arg', 'd=4', '--task-arg',
                 'tdof=2', '--set-size', '3,5', '--no-progress', '--model', 'deepsets',
                 '--epochs', '2', '--warmup-epochs', '1', '--out', out]) == 0
    capsys.readouterr()
    loads = []
    load = cli._load
    monkeypatch.setattr(cli, '_load', lambda args, progress: loads.append(
        (args.data_seed, args.n_train, args.n_val, args.n_test, sorted(args.task_arg),
         args.set_size)) or load(args, progress))
    assert main(['train', '--task', 'quadratic-tdof', '--model', 'deepsets', '--epochs', '3',
                 '--no-progress', '--resume', os.path.join(out, 'checkpoint.pt')]) == 0
    printed = capsys.readouterr().out
    assert ('resuming with the data options of the checkpoint (those not given): data_seed=3, '
            'n_train=24, n_val=8, n_test=8, d=4, tdof=2, set_size=3,5') in printed
    assert loads == [(3, 24, 8, 8, ['d=4', 'tdof=2'], '3,5')]
    assert json.load(open(os.path.join(out, 'result.json')))['epochs_run'] == 3
    # a task option given is kept, the others taken from the checkpoint
    loads.clear()
    assert main(['train', '--task', 'quadratic-tdof', '--model', 'deepsets', '--epochs', '3',
                 '--no-progress', '--task-arg', 'd=4', '--resume',
                 os.path.join(out, 'checkpoint.pt')]) == 0
    assert loads[0][4] == ['d=4', 'tdof=2']
    capsys.readouterr()
    # options given on the command line are kept (and checked against the run's)
    assert main(['train', '--task', 'quadratic-tdof', '--model', 'deepsets', '--epochs', '4',
                 '--no-progress', '--data-seed', '1', '--resume',
                 os.path.join(out, 'checkpoint.pt')]) == 2
    assert 'seed=3' in capsys.readouterr().err


def _tasks_raise(monkeypatch, error):
    r"""Makes ``torch-mz tasks`` raise :obj:`error`, for what :func:`main` makes of it."""
    import torch_mz.cli as cli

    def fails(args):
        raise error
    monkeypatch.setattr(cli, 'cmd_tasks', fails)


@pytest.mark.parametrize('error', [
    MemoryError('Unable to allocate 17.1 GiB for an array'),  # numpy's (a subclass)
    RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4 TB"),
    torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 80.00 GiB'),
])
def test_sizes_that_do_not_fit_in_memory_end_in_one_line(error, monkeypatch, capsys):
    # --model-arg dim=1000000 or --set-size 1,100000000 ended in a traceback (exit 1), where
    # every other impossible size ends in one line and exit 2
    _tasks_raise(monkeypatch, error)
    assert main(['tasks']) == 2
    err = capsys.readouterr().err
    assert err.startswith('torch-mz: error: out of memory (') and err.count('\n') == 1
    assert str(error).splitlines()[0] in err


def test_another_runtime_error_keeps_its_traceback(monkeypatch):
    _tasks_raise(monkeypatch, RuntimeError('a bug'))
    with pytest.raises(RuntimeError, match='a bug'):
        main(['tasks'])


@pytest.mark.parametrize('command, flags, message', [
    ('train', ['--data-seed', '-1'], '--data-seed must be an integer >= 0 (got -1)'),
    ('train', ['--batch-size', str(10 ** 20)], '--batch-size must be a number of sets from 1'),
    ('predict', ['--batch-size', '0'], '--batch-size must be a number of sets from 1'),
    ('predict', ['--data-seed', '-2'], '--data-seed must be an integer >= 0 (got -2)'),
])
def test_data_seed_and_batch_size_are_named_before_any_data(command, flags, message, tmp_path,
                                                            capsys, monkeypatch):
    # --data-seed -1 was reported as 'seed', a batch size past sys.maxsize failed inside
    # itertools, and predict's --batch-size 0 in the DataLoader after the data were built
    from torch_mz.cli import _common as cli
    monkeypatch.setattr(cli, '_load', lambda *a, **k: pytest.fail('the data were built'))
    if command == 'train':
        argv = ['train', *TINY, '--model', 'deepsets', '--out', str(tmp_path / 'r'), *flags]
    else:
        ckpt = tmp_path / 'best.pt'
        ckpt.write_bytes(b'x')  # (the flags are checked before the checkpoint is read)
        argv = ['predict', str(ckpt), '--out', str(tmp_path / 'p.csv'), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count('\n') == 1


def test_an_out_folder_that_cannot_be_written_is_named_before_any_data(tmp_path, capsys,
                                                                       monkeypatch):
    # it failed after the data were built, or after the first epoch had trained, naming a
    # hidden temporary file; the folder is probed first (check_out_folder, as the studies do;
    # as root every folder here is writable, so the probe's answer is given)
    from torch_mz.cli import _common as cli
    import torch_mz.study.report as report
    asked = []

    def unwritable(out):
        asked.append(out)
        return f"--out {out!r} cannot be written: Permission denied"

    monkeypatch.setattr(report, 'check_out_folder', unwritable)
    monkeypatch.setattr(cli, '_load', lambda *a, **k: pytest.fail('the data were built'))
    out = str(tmp_path / 'ro' / 'run')
    assert main(['train', *TINY, '--model', 'deepsets', '--out', out]) == 2
    err = capsys.readouterr().err
    assert err == (f"torch-mz: error: --out '{out}': the folder '{out}' cannot be written "
                   f"(Permission denied)\n") and asked == [out]
    ckpt = tmp_path / 'best.pt'
    ckpt.write_bytes(b'x')
    assert main(['predict', str(ckpt), '--out', str(tmp_path / 'ro' / 'p.csv')]) == 2
    assert "the folder '" + str(tmp_path / 'ro') + "' cannot be written" in capsys.readouterr().err


def test_root_for_a_synthetic_task_is_refused(tmp_path, capsys):
    # it was ignored without a word: the sets are generated from the seed
    assert main(['train', *TINY, '--model', 'deepsets', '--root', str(tmp_path / 'data'),
                 '--out', str(tmp_path / 'r')]) == 2
    err = capsys.readouterr().err
    assert "task 'quadratic-tdof' is synthetic" in err and 'drop --root' in err
    assert main(['train', *TINY, '--model', 'deepsets', '--epochs', '1', '--out',
                 str(tmp_path / 'r')]) == 0
    capsys.readouterr()
    assert main(['predict', str(tmp_path / 'r' / 'best.pt'), '--root', str(tmp_path),
                 '--out', str(tmp_path / 'p.csv')]) == 2
    assert 'drop --root' in capsys.readouterr().err


def test_train_resume_takes_the_model_options_it_is_not_given_from_the_checkpoint(tmp_path,
                                                                                  capsys):
    # as the data and training options: a run with --model-arg options resumed without them
    # was refused as another run's
    out = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', '--model', 'rigid', *T, *SMALL, '--out', out]) == 0
    capsys.readouterr()
    assert main(['train', '--task', 'max', '--model', 'rigid', *T, '--epochs', '2', '--resume',
                 os.path.join(out, 'checkpoint.pt')]) == 0
    printed = capsys.readouterr().out
    assert ('resuming with the model options of the checkpoint (no --model-arg given): d_ff=8, '
            'dim=8, num_inducing=2') in printed
    assert json.load(open(os.path.join(out, 'result.json')))['epochs_run'] == 2


def test_demo_help_says_what_the_demo_runs():
    # it printed compare's help alone
    import subprocess
    import sys
    done = subprocess.run([sys.executable, '-m', 'torch_mz.demo', '--help'], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0
    assert done.stdout.startswith("The main demo: 'python -m torch_mz.demo'")
    assert 'torch-mz ' + ' '.join(DEMO_ARGS) in done.stdout
    assert 'usage: torch-mz compare' in done.stdout


def test_command_and_demo_run_with_docstrings_stripped(monkeypatch, capsys):
    # python -OO (PYTHONOPTIMIZE=2) strips docstrings: every torch-mz command failed with an
    # AttributeError on None (its parser's description was the docstring's first line), and
    # so did the demo's --help
    import sys

    import torch_mz.cli
    import torch_mz.demo
    monkeypatch.setattr(torch_mz.cli, '__doc__', None)  # (what python -OO leaves there)
    assert main(['tasks']) == 0
    assert 'quadratic-tdof' in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(['--help'])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith('usage: torch-mz [-h]')
    # the demo's script as python -OO compiles it
    with open(torch_mz.demo.__file__) as f:
        code = compile(f.read(), torch_mz.demo.__file__, 'exec', optimize=2)
    namespace = {'__name__': '__main__', '__doc__': None}  # (a fresh module's, runpy's)
    monkeypatch.setattr(sys, 'argv', ['demo', '--help'])
    with pytest.raises(SystemExit) as done:
        exec(code, namespace)
    assert done.value.code == 0 and namespace['__doc__'] is None  # (compiled without it)
    printed = capsys.readouterr().out
    assert printed.startswith('torch-mz ' + ' '.join(DEMO_ARGS))
    assert 'usage: torch-mz compare' in printed


def test_predict_feeds_a_float64_model_its_sets_in_float64(tmp_path, capsys):
    # load_model rebuilds a model trained in float64 (through the Python API) in float64, and
    # predict's sets came in float32: refused ("convert the input"), where the CSV was written
    import csv

    from torch_mz.models import build_model
    from torch_mz.tasks import load_task
    from torch_mz.train import TrainConfig, predict, train
    task = load_task('max', n_train=32, n_val=8, n_test=8, d=3, set_size=(2, 5))

    def wide(split):
        return [d.clone().apply(lambda t: t.double() if t.is_floating_point() else t)
                for d in split]

    torch.manual_seed(0)
    model = build_model('deepsets', task.in_channels, task.out_channels,
                        hidden_channels=8).double()
    out = str(tmp_path / 'run')
    train(model, wide(task.train), wide(task.val), wide(task.test),
          config=TrainConfig(epochs=1, warmup_epochs=0, batch_size=16, device='cpu',
                             progress=False, out_dir=out))
    csv_path = str(tmp_path / 'p.csv')
    assert main(['predict', os.path.join(out, 'best.pt'), '--task', 'max', '--task-arg', 'd=3',
                 '--task-arg', 'set_size=[2, 5]', '--n-train', '32', '--n-val', '8',
                 '--n-test', '8', '--out', csv_path]) == 0
    rows = list(csv.DictReader(open(csv_path)))
    expected = predict(model, wide(task.test))
    got = torch.tensor([[float(r[f'prediction_{j}']) for j in range(3)] for r in rows],
                       dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(got, expected)  # float64 text: read back bit for bit


def test_predict_writes_float32_values_as_the_shortest_text_that_reads_back(tmp_path):
    # a float32 target 0.0597 was written 0.059700001031160355 (its float64 value)
    import numpy as np

    from torch_mz import load_model
    from torch_mz.tasks import load_task
    from torch_mz.train import predict
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', '--task-arg', 'd=2', *T, *SMALL, '--model', 'rigid',
                 '--out', run]) == 0
    out = str(tmp_path / 'p.csv')
    assert main(['predict', os.path.join(run, 'best.pt'), '--n-test', '5', '--out', out]) == 0
    rows = _read_csv(out)
    task = load_task('max', n_train=32, n_val=8, n_test=8, d=2)
    pred, ihw = predict(load_model(os.path.join(run, 'best.pt')), task.test[:5], device='cpu')
    y = torch.stack([d.y.reshape(-1) for d in task.test[:5]])
    for name, values in (('prediction', pred), ('target', y), ('ihw', ihw.reshape(-1, 1))):
        assert values.dtype == torch.float32
        for j in range(values.size(1)):
            key = f'{name}_{j}' if values.size(1) > 1 else name
            cells = [r[key] for r in rows]
            assert cells == [str(np.float32(v)) for v in values[:, j].tolist()], key
            back = torch.tensor([np.float32(c) for c in cells])  # float32, bit for bit
            assert torch.equal(back, values[:, j]), key
            assert all(len(c.lstrip('-').replace('.', '').split('e')[0].lstrip('0')) <= 9
                       for c in cells), cells


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float64], ids=str)
def test_predict_writes_the_targets_of_the_dataset_for_a_model_of_another_dtype(tmp_path,
                                                                                 dtype):
    # the bug: the sets were cast to the model's dtype, targets included: a bfloat16 model's
    # target column held the targets rounded to bfloat16 (1.53125 for 1.5301529), a float64
    # model's the float32 targets written as their float64 values (1.5301529169082642)
    import numpy as np

    from torch_mz.tasks import load_task
    from torch_mz.train import load_checkpoint, save_checkpoint
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', '--task-arg', 'd=2', *T, *SMALL, '--model', 'rigid',
                 '--out', run]) == 0
    state = load_checkpoint(os.path.join(run, 'best.pt'))
    state['model'] = {k: v.to(dtype) if v.is_floating_point() else v
                      for k, v in state['model'].items()}
    other = str(tmp_path / 'other.pt')
    save_checkpoint(state, other)
    out = str(tmp_path / 'p.csv')
    assert main(['predict', other, '--n-test', '5', '--out', out]) == 0
    rows = _read_csv(out)
    y = torch.stack([d.y.reshape(-1) for d in load_task('max', n_train=32, n_val=8, n_test=8,
                                                        d=2).test[:5]])
    assert y.dtype == torch.float32
    for j in range(2):
        assert [r[f'target_{j}'] for r in rows] == [str(np.float32(v)) for v in y[:, j].tolist()]


def test_predict_casts_the_inputs_by_their_own_dtype_not_the_targets():
    # the dtype read to decide whether to cast was the first floating tensor's, which could be
    # y: float32 targets first and float64 inputs beside a float32 model were not cast
    from torch_geometric.data import Data

    from torch_mz.cli.predict import _in_dtype
    model = torch.nn.Linear(2, 1)
    first = Data()
    first.y = torch.zeros(1, 1)  # (set first: Data(x=..., y=...) stores x first whatever the order)
    first.x = torch.randn(3, 2, dtype=torch.float64)
    sets = [first]
    assert [k for k, _ in first.items()] == ['y', 'x']
    got = _in_dtype(sets, model)
    assert got[0].x.dtype == torch.float32 and torch.equal(got[0].x, sets[0].x.float())
    assert got[0].y.dtype == torch.float32 and sets[0].x.dtype == torch.float64  # (a copy)


def test_train_resume_takes_the_model_options_beside_those_of_the_model_spec(tmp_path, capsys):
    # with options in --model itself, the checkpoint's --model-args were not taken: the data
    # were built and the run refused as another's
    out = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', '--model', 'rigid:dim=8', *T, '--model-arg',
                 'num_inducing=2', '--model-arg', 'd_ff=8', '--out', out]) == 0
    capsys.readouterr()
    assert main(['train', '--task', 'max', '--model', 'rigid:dim=8', *T, '--epochs', '2',
                 '--resume', os.path.join(out, 'checkpoint.pt')]) == 0
    assert ('the model options of the checkpoint (no --model-arg given): d_ff=8, '
            'num_inducing=2') in capsys.readouterr().out


def test_train_resume_of_a_checkpoint_with_a_run_info_of_ones_own_is_one_line(tmp_path,
                                                                             capsys):
    # run_info entries that are no dicts (the Python API takes any): an AttributeError
    from torch_mz.models import build_model
    from torch_mz.tasks import load_task
    from torch_mz.train import TrainConfig, train
    task = load_task('max', n_train=8, n_val=4, n_test=4)
    out = str(tmp_path / 'run')
    torch.manual_seed(0)
    train(build_model('deepsets', task.in_channels, task.out_channels), task.train, task.val,
          task.test, run_info={'task': 'max', 'note': 'x'},
          config=TrainConfig(epochs=1, warmup_epochs=0, batch_size=4, progress=False,
                             out_dir=out))
    assert main(['train', '--task', 'max', '--model', 'deepsets', '--n-train', '8', '--n-val',
                 '4', '--n-test', '4', '--epochs', '2', '--batch-size', '4', '--no-progress',
                 '--resume', os.path.join(out, 'checkpoint.pt')]) == 2
    err = capsys.readouterr().err
    assert 'was written by another run' in err and err.count('\n') == 1


def test_only_the_main_process_probes_the_out_folder(tmp_path, monkeypatch):
    # under torchrun every rank probed, and one removed the folder another was probing
    from torch_mz.cli import _common as cli
    import torch_mz.study.report as report
    monkeypatch.setattr(report, 'check_out_folder', lambda out: pytest.fail('probed'))
    monkeypatch.setattr(cli, '_main_process', lambda: False)
    cli._check_path(str(tmp_path / 'new'), '--out', folder=True)  # no probe, no error


@pytest.mark.parametrize('n_train', [10 ** 11, pytest.param(10 ** 400, id='10**400')])
def test_set_counts_that_cannot_fit_in_memory_are_refused_before_generating(n_train, tmp_path,
                                                                            capsys):
    # --n-train 100000000000 generated sets without end; 10**400, past a float's range, ended
    # in an OverflowError's traceback
    assert main(['train', '--task', 'mst', '--model', 'deepsets', '--n-train', str(n_train),
                 '--out', str(tmp_path / 'r')]) == 2
    err = capsys.readouterr().err
    assert 'sets of at least 10 elements need more than' in err and '--n-train' in err
    assert err.count('\n') == 1


def test_the_memory_bound_takes_the_tasks_default_dimension(monkeypatch):
    # a d left out was taken as 1 where the task's default is its constructor's (not a class
    # attribute): quadratic-tdof's d = 32 made the bound 32 times low for the points
    from torch_mz.cli import _common as cli
    monkeypatch.setattr(os, 'sysconf', lambda key: 1 if key == 'SC_PAGE_SIZE' else 2 ** 30)
    n = 2 ** 30 // 1000  # sets of 10 points: 1,792 bytes each at d = 32, 552 at d = 1
    for options in ({}, {'d': 32}):
        with pytest.raises(cli.CLIError, match='need more than 1.8 GiB'):
            cli._check_synthetic_size('quadratic-tdof', (n, 0, 0), None, options)
    cli._check_synthetic_size('quadratic-tdof', (n, 0, 0), None, {'d': 1})  # (fits)


def test_predict_takes_d_none_and_d_default_as_one_task(tmp_path, capsys):
    # d=None (the class's 8) given at prediction, or recorded by the run, read as another
    # task than d=8 ("d=None differs from the training run's d=8", and the other way round)
    plain, explicit = str(tmp_path / 'plain'), str(tmp_path / 'none')
    assert main(['train', '--task', 'mst', '--model', 'deepsets', *T, '--out', plain]) == 0
    assert main(['train', '--task', 'mst', '--model', 'deepsets', *T, '--task-arg', 'd=None',
                 '--out', explicit]) == 0
    capsys.readouterr()
    for run, arg in ((plain, 'd=None'), (explicit, 'd=8'), (plain, 'd=8')):
        assert main(['predict', os.path.join(run, 'best.pt'), '--task-arg', arg, '--out',
                     str(tmp_path / 'p.csv'), '--overwrite']) == 0
        assert 'differs' not in capsys.readouterr().err, (run, arg)
    assert main(['predict', os.path.join(plain, 'best.pt'), '--task-arg', 'center_std=3.0',
                 '--out', str(tmp_path / 'p.csv'), '--overwrite']) == 0
    assert 'center_std=3.0 differs from the training run' in capsys.readouterr().err


def test_predict_refuses_test_set_counts_that_cannot_fit_in_memory(tmp_path, capsys):
    out = str(tmp_path / 'run')
    assert main(['train', '--task', 'mst', '--model', 'deepsets', *T, '--out', out]) == 0
    capsys.readouterr()
    assert main(['predict', os.path.join(out, 'best.pt'), '--n-test', str(10 ** 11), '--out',
                 str(tmp_path / 'p.csv')]) == 2
    err = capsys.readouterr().err
    assert 'need more than' in err and err.count('\n') == 1


# the audit of the command line (s44): its findings 1-11

def test_the_same_model_twice_is_refused_before_an_earlier_comparison_is_removed(tmp_path,
                                                                                 capsys):
    # the grid's check ('deepsets' and 'deepsets:' are one model) ran after --overwrite had
    # removed the earlier comparison and comparison.json had been written for the refused one
    out = str(tmp_path / 'cmp')
    argv = ['compare', '--task', 'max', *T, '--seeds', '1']
    assert main([*argv, '--models', 'deepsets', '--out', out]) == 0
    first = _snapshot(out)
    capsys.readouterr()
    for models, extra in (('deepsets,deepsets:', []),
                          ('mz-slim:dropout=0.1,mz-slim:dropout=0.10', []),
                          ('deepsets,deepsets:hidden_channels=8', ['--model-arg',
                                                                   'hidden_channels=8'])):
        for where in (out, str(tmp_path / 'new')):
            assert main([*argv, '--models', models, *extra, '--out', where,
                         '--overwrite']) == 2
            assert _snapshot(out) == first
            assert not os.path.exists(tmp_path / 'new')  # no comparison.json for it
            err = capsys.readouterr().err
            assert 'name the same model and options' in err and err.count('\n') == 1, err


def test_a_model_arg_that_contradicts_a_spec_option_is_refused(tmp_path, capsys):
    # the row labelled dropout=0.1 trained with --model-arg's 0.3
    out = str(tmp_path / 'cmp')
    assert main(['compare', '--task', 'max', *T, '--seeds', '1', '--models',
                 'mz-slim,mz-slim:dropout=0.1', '--model-arg', 'dropout=0.3', '--out',
                 out]) == 2
    err = capsys.readouterr().err
    assert ("--model-arg dropout=0.3 contradicts dropout=0.1, which model spec "
            "'mz-slim:dropout=0.1' sets itself") in err and err.count('\n') == 1
    assert not os.path.exists(out)
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', *T, '--model', 'mz-slim:dropout=0.1',
                 '--model-arg', 'dropout=0.3', '--out', run]) == 2
    assert 'contradicts dropout=0.1' in capsys.readouterr().err and not os.path.exists(run)
    # the same value, or an option the spec does not set: taken
    assert main(['train', '--task', 'max', *T, '--model', 'mz-slim:dropout=0.1',
                 '--model-arg', 'dropout=0.10', '--model-arg', 'd_ff=64', '--out',
                 run]) == 0
    ckpt = torch.load(os.path.join(run, 'best.pt'), weights_only=True)
    assert ckpt['run_info']['model']['args'] == {'dropout': 0.1, 'd_ff': 64}


def test_resume_reads_a_task_arg_spelt_with_a_dash_as_a_fresh_run_does(tmp_path, capsys):
    # center-std=5.0 is center_std; on resume the checkpoint's center_std=2.0 replaced it
    run = str(tmp_path / 'run')
    data = ['--task', 'mst', '--model', 'deepsets', '--n-train', '16', '--n-val', '4',
            '--n-test', '4', '--no-progress']
    assert main(['train', *data, '--epochs', '1', '--task-arg', 'center-std=2.0', '--out',
                 run]) == 0
    capsys.readouterr()
    for spelt in ('center_std', 'center-std'):
        assert main(['train', *data, '--epochs', '2', '--task-arg', f'{spelt}=5.0',
                     '--resume', os.path.join(run, 'checkpoint.pt')]) == 2
        printed = capsys.readouterr()
        assert 'center_std=2.0' not in printed.out  # (not taken from the checkpoint)
        assert 'center_std=5.0' in printed.err and 'center_std=2.0' in printed.err
    assert json.load(open(os.path.join(run, 'result.json')))['epochs_run'] == 1


def test_predict_refuses_to_write_over_the_run_it_reads(tmp_path, capsys):
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', *T, '--model', 'deepsets', '--out', run]) == 0
    first = _snapshot(run)
    capsys.readouterr()
    best = os.path.join(run, 'best.pt')
    for out in ('best.pt', 'checkpoint.pt', 'metrics.csv', 'result.json',
                os.path.join('..', 'run', '.', 'best.pt')):
        assert main(['predict', best, '--out', os.path.join(run, out), '--overwrite']) == 2
        err = capsys.readouterr().err
        assert ('is the checkpoint predict reads' if out.endswith('best.pt') else
                'is a file of the training run') in err and err.count('\n') == 1, err
        assert _snapshot(run) == first
    assert main(['predict', best, '--out', os.path.join(run, 'predictions.csv')]) == 0


def test_compare_resume_with_nothing_to_resume_is_refused(tmp_path, capsys):
    # a mistyped --out started a new comparison (of every default) without a word
    empty = tmp_path / 'empty'
    empty.mkdir()
    for out in (str(tmp_path / 'no-such-folder'), str(empty)):
        assert main(['compare', '--task', 'max', *T, '--models', 'deepsets', '--seeds', '1',
                     '--resume', '--out', out]) == 2
        err = capsys.readouterr().err
        assert f"--resume: '{out}' holds no comparison to resume" in err and err.count('\n') == 1
    assert not os.path.exists(tmp_path / 'no-such-folder') and not os.listdir(empty)


def test_an_empty_out_is_refused(tmp_path, capsys, monkeypatch):
    # '--out ""' (an unset variable) wrote into runs/<task>/...
    monkeypatch.chdir(tmp_path)
    for argv in (['train', '--task', 'max', *T, '--model', 'deepsets'],
                 ['compare', '--task', 'max', *T, '--models', 'deepsets', '--seeds', '1'],
                 ['compare', '--task', 'max', *T, '--models', 'deepsets', '--resume']):
        assert main([*argv, '--out', '']) == 2
        err = capsys.readouterr().err
        assert '--out is empty: name a folder' in err and err.count('\n') == 1
    assert os.listdir(tmp_path) == []


def test_n_test_beyond_the_official_test_files_takes_them_all_and_says_so(scanobjectnn_root,
                                                                         tmp_path, capsys):
    # --n-test 100 on 3 test objects trained on those 3 and recorded 100, without a word (the
    # refusal that replaced it stopped the runs recorded so, finding 3 of the review below)
    data = ['--task', 'scanobjectnn', '--root', scanobjectnn_root['root'], '--task-arg',
            'num_points=16', '--n-train', '3', '--n-val', '1', '--epochs', '1',
            '--batch-size', '2', '--no-progress', '--model', 'deepsets']
    run = str(tmp_path / 'run')
    assert main(['train', *data, '--n-test', '4', '--out', run]) == 0
    said = ('torch-mz: warning: scanobjectnn: n_test=4 asks for more test sets than the 3 '
            'official test files: all 3 are taken')
    assert said in capsys.readouterr().err
    ckpt = torch.load(os.path.join(run, 'checkpoint.pt'), weights_only=True)
    assert ckpt['run_info']['task']['split']['n_test'] == 3  # the count taken
    assert main(['predict', os.path.join(run, 'best.pt'), '--root', scanobjectnn_root['root'],
                 '--n-test', '4', '--out', str(tmp_path / 'p.csv')]) == 0
    assert said in capsys.readouterr().err
    assert len(open(tmp_path / 'p.csv').read().splitlines()) == 1 + 3


def test_only_the_main_process_of_torchrun_says_the_test_files_are_all_taken(
        scanobjectnn_root, tmp_path, capsys, monkeypatch):
    # under torchrun every rank loads the data: each printed the warning on stderr again
    from torch_mz.cli import _common as cli
    monkeypatch.setattr(cli, '_main_process', lambda: False)  # (a rank > 0 of torchrun)
    assert main(['train', '--task', 'scanobjectnn', '--root', scanobjectnn_root['root'],
                 '--task-arg', 'num_points=16', '--n-train', '3', '--n-val', '1',
                 '--n-test', '4', '--epochs', '1', '--batch-size', '2', '--no-progress',
                 '--model', 'deepsets', '--out', str(tmp_path / 'run')]) == 0
    assert 'asks for more test sets' not in capsys.readouterr().err


@pytest.mark.parametrize('extra, message', [
    (['--seed', '-1'], '--seed must be in [0, 2**32) (got -1)'),
    (['--seed', str(2 ** 32)], f'--seed must be in [0, 2**32) (got {2 ** 32})'),
    (['--seed', str(2 ** 63)], f'--seed must be in [0, 2**32) (got {2 ** 63})'),
    (['--epochs', '0'], '--epochs must be at least 1 (got 0)'),
    # the trainer refused it once the data were loaded (found by a review)
    (['--seed', str(2 ** 32 - 1), '--epochs', '2'],
     f'--seed + --epochs must be at most 2**32 (epoch e shuffles with seed + e); got '
     f'{2 ** 32 - 1} + 2'),
    (['--lr', '-1'], '--lr must be a finite number > 0 (got -1.0)'),
    (['--lr', 'inf'], '--lr must be a finite number > 0 (got inf)'),
    # (taken: every epoch trained at learning rate 0, i.e. not at all)
    (['--lr', '0'], '--lr must be a finite number > 0 (got 0.0)'),
    (['--weight-decay=-1e-5'], '--weight-decay must be a finite number >= 0 (got -1e-05)'),
    (['--weight-decay', 'nan'], '--weight-decay must be a finite number >= 0 (got nan)'),
    (['--epochs', '3', '--warmup-epochs', '4'],
     '--warmup-epochs must be in [0, --epochs] = [0, 3] (got 4)'),
    (['--warmup-epochs', '-1'], '--warmup-epochs must be in [0, --epochs]'),
    (['--grad-clip', 'inf'], '--grad-clip must be a positive norm, or 0 for no clipping'),
])
def test_bad_training_settings_name_their_flags_and_true_ranges(extra, message, tmp_path,
                                                                 capsys):
    # the errors named TrainConfig's fields, and --seed's stated range was [-2**63, 2**63)
    argv = ['train', '--task', 'qm9', '--root', str(tmp_path / 'none'), '--no-progress',
            '--model', 'deepsets', *extra, '--out', str(tmp_path / 'o')]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and 'TrainConfig' not in err and err.count('\n') == 1, err
    if extra[0] != '--seed':  # (compare has no --seed)
        argv = ['compare', *argv[1:5], '--models', 'deepsets', *extra, '--out',
                str(tmp_path / 'c')]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and 'TrainConfig' not in err and err.count('\n') == 1, err
    assert main(['compare', *argv[1:5], '--models', 'deepsets', '--seeds', str(2 ** 32 + 1),
                 '--out', str(tmp_path / 'c')]) == 2
    assert '--seeds must be from 1 to 2**32' in capsys.readouterr().err


def test_compare_resume_takes_the_model_args_of_its_checkpoints(tmp_path, capsys):
    # as train --resume does (it was refused: "pass the original options")
    from torch_mz.train import TrainingStopped, stop_by
    out = str(tmp_path / 'cmp')
    argv = ['compare', '--task', 'max', *T[:-1], '2', '--seeds', '1', '--models', 'deepsets']
    with pytest.raises(TrainingStopped), stop_by(0.0):
        main([*argv, '--model-arg', 'hidden_channels=8', '--out', out])
    capsys.readouterr()
    _drop_comparison_options(out)  # (read from comparison.json since it records them: below)
    assert main([*argv, '--resume', '--out', out]) == 0
    printed = capsys.readouterr().out
    assert ('resuming with the model options of the checkpoints (no --model-arg given): '
            'hidden_channels=8') in printed and 'resuming 1 of 1 runs' in printed
    ckpt = torch.load(os.path.join(out, 'deepsets-seed0', 'best.pt'), weights_only=True)
    assert ckpt['run_info']['model']['args'] == {'hidden_channels': 8}
    assert json.load(open(os.path.join(out, 'results.json')))['runs'][0]['epochs_run'] == 2


def test_the_demo_note_follows_only_a_run_that_succeeded(tmp_path):
    import subprocess
    import sys
    done = subprocess.run([sys.executable, '-m', 'torch_mz.demo', '--epochs', '0', '--out',
                           str(tmp_path / 'demo')], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))
    assert done.returncode == 2 and '--epochs must be at least 1' in done.stderr
    assert 'Smoke run' not in done.stdout + done.stderr


def test_a_resumed_comparison_records_a_command_that_reproduces_it(tmp_path, capsys):
    # it recorded the command as typed ('... --out cut --resume'), which in another folder
    # started a comparison of every default
    import shlex
    from torch_mz.train import TrainingStopped, stop_by
    cut = str(tmp_path / 'cut')
    with pytest.raises(TrainingStopped), stop_by(0.0):
        main(['compare', '--task', 'max', *T[:-1], '2', '--seeds', '1', '--models',
              'deepsets', '--lr', '3e-3', '--task-arg', 'd=2', '--model-arg',
              'hidden_channels=8', '--out', cut])
    typed = ['compare', '--task', 'max', '--models', 'deepsets', '--model-arg',
             'hidden_channels=8', '--out', cut, '--resume', '--no-progress']
    assert main(typed) == 0
    payload = json.load(open(os.path.join(cut, 'results.json')))
    command = payload['command']
    argv = shlex.split(command)
    assert argv[:2] == ['torch-mz', 'compare'] and '--resume' not in argv
    assert argv[argv.index('--out') + 1] == cut
    assert payload['resumed_with'] == 'torch-mz ' + ' '.join(shlex.quote(a) for a in typed)
    assert f'Command: `{command}` (resumed with `{payload["resumed_with"]}`)' in open(
        os.path.join(cut, 'results.md')).read()
    again = str(tmp_path / 'again')
    argv[argv.index('--out') + 1] = again
    capsys.readouterr()
    assert main([*argv[1:], '--no-progress']) == 0
    runs = json.load(open(os.path.join(again, 'results.json')))['runs']
    assert len(runs) == len(payload['runs']) == 1
    assert runs[0]['epochs_run'] == payload['runs'][0]['epochs_run'] == 2
    assert runs[0]['params'] == payload['runs'][0]['params']
    assert runs[0]['test'] == pytest.approx(payload['runs'][0]['test'], rel=1e-6)


# the review of those fixes (s44 review): its findings 1-8

def test_compare_records_the_dataset_folder_absolute(tmp_path, monkeypatch):
    # comparison.json records --root as an absolute folder: a resume run from another
    # directory reads the recorded folder, not one of the same name below the new directory
    from torch_mz.cli.compare import _comparison_options
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(['compare', '--task', 'qm9', '--models', 'mz',
                                       '--epochs', '5', '--root', 'data/QM9'])
    assert _comparison_options(args)['root'] == str(tmp_path / 'data' / 'QM9')
    args = build_parser().parse_args(['compare', '--task', 'qm9', '--models', 'mz',
                                       '--epochs', '5'])
    assert _comparison_options(args)['root'] is None  # (no data read yet: the folder read is
    # recorded once they are, below)


def test_root_expands_the_home_folder_as_the_datasets_do(tmp_path, monkeypatch, capsys):
    # --root '~/x' (quoted: the shell leaves '~' as it is) is read by PyG's datasets as ~/x;
    # comparison.json recorded <cwd>/~/x, another folder, and a file at ~/x was not refused
    from torch_mz.cli.compare import _comparison_options
    home = tmp_path / 'home'
    home.mkdir()
    monkeypatch.setenv('HOME', str(home))
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(['compare', '--task', 'qm9', '--models', 'mz',
                                       '--epochs', '5', '--root', '~/data/QM9'])
    assert _comparison_options(args)['root'] == str(home / 'data' / 'QM9')
    (home / 'a_file').write_text('mine')
    assert main(['train', *T, '--model', 'deepsets', '--task', 'qm9', '--root', '~/a_file']) == 2
    assert 'is a file, not a dataset folder' in capsys.readouterr().err
    assert (home / 'a_file').read_text() == 'mine'


def test_compare_records_the_default_dataset_folder_it_read(scanobjectnn_root, tmp_path,
                                                           capsys, monkeypatch):
    # without --root, comparison.json recorded root null, not the folder read: a resume from
    # another directory (an installed package reads ./datasets/<Name>) or with another
    # $TORCH_MZ_DATA resolved the default again, to other data
    monkeypatch.setenv('TORCH_MZ_DATA', str(tmp_path))  # (the fixture's folder: the default)
    monkeypatch.chdir(tmp_path)
    out = 'cmp'  # (relative: the resume below runs from elsewhere)
    argv = ['compare', '--task', 'scanobjectnn', '--models', 'deepsets', '--out', out]
    assert main([*argv, '--task-arg', 'num_points=16', '--n-train', '3', '--n-val', '1',
                 '--n-test', '3', '--epochs', '1', '--batch-size', '2', '--seeds', '1',
                 '--model-arg', 'hidden_channels=8', '--no-progress']) == 0
    record = json.load(open(os.path.join(out, 'comparison.json')))
    assert record['options']['root'] == os.path.abspath(scanobjectnn_root['root'])
    # resumed from another directory, with no $TORCH_MZ_DATA: the folder recorded is read
    monkeypatch.delenv('TORCH_MZ_DATA')
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main([*argv[:-1], str(tmp_path / out), '--resume', '--no-progress']) == 0, (
        capsys.readouterr().err)
    assert f"root={os.path.abspath(scanobjectnn_root['root'])}" in capsys.readouterr().out
    assert os.listdir(elsewhere) == []  # (no datasets/ScanObjectNN made here)
    payload = json.load(open(tmp_path / out / 'results.json'))
    assert f"--root {os.path.abspath(scanobjectnn_root['root'])}" in payload['command']


def _drop_comparison_options(out):
    r"""comparison.json as torch-mz wrote it before it recorded the comparison's options."""
    path = os.path.join(out, 'comparison.json')
    record = json.load(open(path))
    record.pop('options', None)
    with open(path, 'w') as f:
        json.dump(record, f)


def _model_args(folder):
    ckpt = torch.load(os.path.join(folder, 'best.pt'), weights_only=True)
    return ckpt['run_info']['model']['args']


def test_compare_resume_gives_every_model_its_own_model_args(tmp_path, capsys):
    # a --model-arg repeating the first model's own option was dropped, as the spec's, from the
    # options of the first checkpoint, which were applied to every model: the second resumed
    # without it (70,288 parameters where the command gives 568)
    from torch_mz.train import TrainingStopped, stop_by
    argv = ['compare', '--task', 'max', *T[:-1], '2', '--seeds', '1', '--models',
            'deepsets:hidden_channels=8,deepsets:num_layers=2']
    first, second = 'deepsets_hidden_channels=8-seed0', 'deepsets_num_layers=2-seed0'
    cuts = {}
    for tag, extra in (('new', ['--model-arg', 'hidden_channels=8']),
                       ('old', ['--model-arg', 'hidden_channels=8']), ('none', [])):
        cuts[tag] = str(tmp_path / tag)
        with pytest.raises(TrainingStopped), stop_by(0.0):  # after the first run's first epoch
            main([*argv, *extra, '--out', cuts[tag]])
        assert sorted(os.listdir(cuts[tag])) == ['comparison.json', first]
    capsys.readouterr()
    # the comparison's --model-args, as its comparison.json records them
    assert main([*argv, '--resume', '--out', cuts['new']]) == 0
    assert _model_args(os.path.join(cuts['new'], second)) == {'num_layers': 2,
                                                             'hidden_channels': 8}
    assert ('resuming with the model options of the comparison (no --model-arg given): '
            'hidden_channels=8') in capsys.readouterr().out
    # one recorded before: the checkpoint cannot tell a --model-arg from the spec's own option
    for tag in ('old', 'none'):
        _drop_comparison_options(cuts[tag])
        assert main([*argv, '--resume', '--out', cuts[tag]]) == 2
        err = capsys.readouterr().err
        assert ("the checkpoints cannot tell whether hidden_channels=8 was a --model-arg"
                in err and "pass the comparison's --model-args" in err
                and err.count('\n') == 1), err
        assert not os.path.exists(os.path.join(cuts[tag], second))
    assert main([*argv, '--resume', '--model-arg', 'hidden_channels=8', '--out',
                 cuts['old']]) == 0
    assert _model_args(os.path.join(cuts['old'], second)) == {'num_layers': 2,
                                                             'hidden_channels': 8}
    assert main([*argv, '--resume', '--model-arg', '', '--out', cuts['none']]) == 0
    assert _model_args(os.path.join(cuts['none'], second)) == {'num_layers': 2}
    # with a checkpoint of a model whose spec does not set it, the checkpoints can tell
    for tag, said in (('old', 'hidden_channels=8'), ('none', None)):
        _drop_comparison_options(cuts[tag])
        capsys.readouterr()
        assert main([*argv, '--resume', '--out', cuts[tag]]) == 0
        printed = capsys.readouterr().out
        assert 'resuming 2 of 2 runs' in printed
        assert (said is None) == ('--model-arg given' not in printed)
        if said is not None:
            assert ('resuming with the model options of the checkpoints (no --model-arg '
                    'given): hidden_channels=8') in printed
        command = json.load(open(os.path.join(cuts[tag], 'results.json')))['command']
        assert ('--model-arg hidden_channels=8' in command) == (said is not None)


def test_compare_resume_of_a_record_with_a_repeated_key_takes_its_last_value(tmp_path, capsys):
    # a comparison started before a repeated --task-arg/--model-arg key was refused records
    # every item, and its runs took the last: its resume was refused as repeating the key
    # (with or without the --model-arg), so that it could not be resumed at all
    from torch_mz.train import TrainingStopped, stop_by
    argv = ['compare', '--task', 'max', *T[:-1], '2', '--seeds', '1', '--models', 'deepsets']
    out = str(tmp_path / 'cut')
    with pytest.raises(TrainingStopped), stop_by(0.0):
        main([*argv, '--model-arg', 'hidden_channels=8', '--task-arg', 'd=16', '--out', out])
    path = os.path.join(out, 'comparison.json')
    record = json.load(open(path))
    record['options'].update(model_arg=['hidden_channels=16', 'hidden-channels=8'],
                             task_arg=['d=8', 'd=16'])
    json.dump(record, open(path, 'w'))
    capsys.readouterr()
    assert main([*argv, '--resume', '--out', out]) == 0
    printed = capsys.readouterr().out
    assert ('resuming with the model options of the comparison (no --model-arg given): '
            'hidden-channels=8\n') in printed
    assert _model_args(os.path.join(out, 'deepsets-seed0')) == {'hidden_channels': 8}
    command = json.load(open(os.path.join(out, 'results.json')))['command']
    assert '--task-arg d=16 --model-arg hidden-channels=8 ' in command, command
    json.dump(record, open(path, 'w'))  # (the --model-arg given, compared with the record)
    assert main([*argv, '--resume', '--model-arg', 'hidden_channels=8', '--out', out]) == 0


def test_an_empty_model_arg_is_for_a_resume_and_may_not_contradict_the_record(tmp_path,
                                                                              capsys):
    # --model-arg '' on a resume of a comparison whose comparison.json records hidden_channels=8
    # dropped it silently (the model trained at 103,312 parameters), and a fresh comparison took
    # it beside other --model-args as nothing
    from torch_mz.train import TrainingStopped, stop_by
    argv = ['compare', '--task', 'max', *T[:-1], '2', '--seeds', '1', '--models',
            'deepsets:num_layers=2']
    out = str(tmp_path / 'cut')
    with pytest.raises(TrainingStopped), stop_by(0.0):
        main([*argv, '--model-arg', 'hidden_channels=8', '--out', out])
    capsys.readouterr()
    for extra in (['--model-arg', ''], ['--model-arg', 'hidden_channels=16']):
        assert main([*argv, '--resume', *extra, '--out', out]) == 2
        err = capsys.readouterr().err
        assert ("records the comparison's model options (--model-arg hidden_channels=8), which "
                "the command contradicts" in err), err
    assert main([*argv, '--model-arg', '', '--out', str(tmp_path / 'fresh')]) == 2
    assert "--model-arg '' (the comparison had no --model-arg) is for --resume" in (
        capsys.readouterr().err)
    assert not os.path.exists(tmp_path / 'fresh')
    assert main([*argv, '--resume', '--model-arg', 'hidden_channels=8', '--out', out]) == 0
    assert _model_args(os.path.join(out, 'deepsets_num_layers=2-seed0')) == {
        'num_layers': 2, 'hidden_channels': 8}


def test_compare_resume_of_an_older_record_is_not_refused_for_an_option_others_do_not_take(
        tmp_path, capsys):
    # a spec option of the started model that the others' presets do not take cannot have been
    # a --model-arg (the comparison would have refused it): nothing to ask
    from torch_mz.train import TrainingStopped, stop_by
    argv = ['compare', '--task', 'max', *T[:-1], '2', '--seeds', '1', '--models',
            'deepsets:pool=mean,mean-mlp']
    out = str(tmp_path / 'cut')
    with pytest.raises(TrainingStopped), stop_by(0.0):
        main([*argv, '--out', out])
    _drop_comparison_options(out)
    capsys.readouterr()
    assert main([*argv, '--resume', '--out', out]) == 0, capsys.readouterr().err


@pytest.mark.parametrize('models, extra', [
    ('mz-slim:dropout=0,mz-slim:dropout=0.0', []),
    ('deepsets:hidden_channels=8,deepsets:hidden_channels=8,pool=sum', []),
    ('deepsets,deepsets:pool=sum', []),  # the preset's default
    ('deepsets:pool=sum,deepsets', ['--model-arg', 'hidden_channels=8']),
])
def test_the_same_model_twice_is_refused_by_value_and_over_the_presets_defaults(
        models, extra, tmp_path, capsys):
    # 0 and 0.0 (and an option given at the preset's default) trained one model twice under
    # two labels, two identical rows
    out = str(tmp_path / 'cmp')
    assert main(['compare', '--task', 'max', *T, '--seeds', '1', '--models', models, *extra,
                 '--out', out]) == 2
    err = capsys.readouterr().err
    assert 'name the same model and options' in err and err.count('\n') == 1, err
    assert not os.path.exists(out)


def test_runs_that_recorded_more_test_sets_than_the_official_files_predict_and_resume(
        scanobjectnn_root, tmp_path, capsys):
    # such a run (the count asked recorded, all 3 files taken) was refused by predict and
    # train --resume: "4 test sets exceed the 3 official test files"; with --n-test 3 given,
    # train --resume was "written by another run", though its sets are these
    import shutil
    root = scanobjectnn_root['root']
    data = ['--task', 'scanobjectnn', '--root', root, '--no-progress', '--model', 'deepsets']
    run = str(tmp_path / 'run')
    assert main(['train', *data, '--task-arg', 'num_points=16', '--n-train', '3', '--n-val', '1',
                 '--n-test', '3', '--epochs', '1', '--batch-size', '2', '--out', run]) == 0
    for name in ('checkpoint.pt', 'best.pt'):  # as recorded before the count taken was
        path = os.path.join(run, name)
        state = torch.load(path, weights_only=True)
        state['run_info']['task']['split']['n_test'] = 4
        torch.save(state, path)
    again = str(tmp_path / 'again')
    shutil.copytree(run, again)
    capsys.readouterr()
    out = str(tmp_path / 'p.csv')
    assert main(['predict', os.path.join(run, 'best.pt'), '--root', root, '--out', out]) == 0
    assert 'n_test=4 asks for more test sets than the 3 official test files: all 3 are taken' in (
        capsys.readouterr().err)
    assert len(open(out).read().splitlines()) == 1 + 3
    legacy = str(tmp_path / 'legacy.pt')  # (recorded before the spread subset: the first N)
    state = torch.load(os.path.join(run, 'best.pt'), weights_only=True)
    del state['run_info']['task']['split']['test_subset']
    torch.save(state, legacy)
    assert main(['predict', legacy, '--root', root, '--out', out, '--overwrite']) == 0
    assert ('the run asks for 4 test sets; the test split holds 3: all of them are taken'
            in capsys.readouterr().err)
    for folder, extra in ((run, []), (again, ['--n-test', '3'])):
        assert main(['train', *data, '--epochs', '2', *extra, '--resume',
                     os.path.join(folder, 'checkpoint.pt')]) == 0, capsys.readouterr().err
        assert json.load(open(os.path.join(folder, 'result.json')))['epochs_run'] == 2
    # other test sets than the run's are still another run
    third = str(tmp_path / 'third')
    shutil.copytree(run, third)
    assert main(['train', *data, '--epochs', '3', '--n-test', '2', '--resume',
                 os.path.join(third, 'checkpoint.pt')]) == 2
    assert 'written by another run' in capsys.readouterr().err


def test_compare_resume_of_a_comparison_cut_in_its_first_epoch_keeps_its_options(
        tmp_path, capsys, monkeypatch):
    # it left comparison.json alone, which recorded only models and seeds: the resume started
    # a comparison of every default (5000/1000/2000 sets, 200 epochs)
    import torch_mz.study as study
    out = str(tmp_path / 'cmp')
    argv = ['compare', '--task', 'max', '--models', 'deepsets', '--out', out]
    options = ['--n-train', '32', '--n-val', '8', '--n-test', '8', '--batch-size', '16',
               '--epochs', '2', '--warmup-epochs', '0', '--lr', '3e-3', '--task-arg', 'd=2',
               '--model-arg', 'hidden_channels=8', '--seeds', '1', '--no-progress']
    asked = []

    def interrupted(task, models, seeds, config_for, **kw):
        asked.append((len(task.train), len(task.val), len(task.test), task.in_channels, seeds,
                      config_for('deepsets', 0), kw.get('overrides')))
        raise KeyboardInterrupt
    monkeypatch.setattr(study, 'train_models', interrupted)
    assert main([*argv, *options]) == 130
    assert os.listdir(out) == ['comparison.json']
    assert main([*argv, '--resume']) == 130  # (interrupted again, before training)
    assert asked[0][:5] == asked[1][:5] == (32, 8, 8, 2, 1)
    from dataclasses import replace
    assert replace(asked[1][5], progress=False) == asked[0][5]  # (--no-progress: not given)
    assert asked[1][6] == {'hidden_channels': 8}
    monkeypatch.undo()
    capsys.readouterr()
    assert main([*argv, '--resume', '--no-progress']) == 0
    printed = capsys.readouterr().out
    assert 'train/val/test = 32/8/8' in printed and '2 epochs, lr 0.003, batch 16' in printed
    assert "resuming with the options of the comparison" in printed
    assert _model_args(os.path.join(out, 'deepsets-seed0')) == {'hidden_channels': 8}
    # one recorded before the options were: refused, with nothing written
    import shutil
    for name in os.listdir(out):
        if name != 'comparison.json':
            (shutil.rmtree if os.path.isdir(os.path.join(out, name)) else os.unlink)(
                os.path.join(out, name))
    _drop_comparison_options(out)
    before = _snapshot(out)
    assert main([*argv, '--resume']) == 2
    err = capsys.readouterr().err
    assert ("holds no checkpoint to resume from" in err and "does not record the comparison's "
            "options" in err and err.count('\n') == 1), err
    assert _snapshot(out) == before


def test_compare_resume_checks_seeds_before_sizing_anything_by_them(tmp_path, capsys,
                                                                     monkeypatch):
    # --seeds 2**32 + 1 (and the valid 2**32) listed a checkpoint path for every seed: memory
    # ran out before the check
    import itertools
    out = str(tmp_path / 'cmp')
    argv = ['compare', '--task', 'max', *T, '--models', 'deepsets', '--out', out]
    assert main([*argv, '--seeds', '1']) == 0
    capsys.readouterr()
    joins, join = itertools.count(), os.path.join

    def counted(*parts):
        if next(joins) > 10000:
            raise AssertionError('a path for every seed')
        return join(*parts)
    monkeypatch.setattr(os.path, 'join', counted)
    assert main([*argv, '--resume', '--seeds', str(2 ** 32 + 1)]) == 2
    err = capsys.readouterr().err
    assert '--seeds must be from 1 to 2**32' in err and err.count('\n') == 1, err
    assert main([*argv, '--resume', '--seeds', str(2 ** 32), '--lr', '3e-3']) == 2
    err = capsys.readouterr().err
    assert 'was trained with other settings' in err and err.count('\n') == 1, err
    for extra, message in ((['--epochs', '0'], '--epochs must be at least 1'),
                           (['--batch-size', '0'], '--batch-size must be a number of sets')):
        assert main([*argv, '--resume', *extra]) == 2
        assert message in capsys.readouterr().err


def test_predict_refuses_to_write_over_the_run_it_reads_through_a_link(tmp_path, capsys):
    # a checkpoint read through a link (latest.pt -> run/best.pt) named the link's folder:
    # --out run/checkpoint.pt --overwrite replaced the run's checkpoint with the CSV
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'max', *T, '--model', 'deepsets', '--out', run]) == 0
    first = _snapshot(run)
    latest = str(tmp_path / 'latest.pt')
    os.symlink(os.path.join(run, 'best.pt'), latest)
    os.symlink(os.path.join(run, 'checkpoint.pt'), str(tmp_path / 'last.pt'))
    capsys.readouterr()
    for out in [os.path.join(run, name) for name in ('metrics.csv', 'checkpoint.pt', 'best.pt',
                                                     'result.json')] + [
            str(tmp_path / 'last.pt')]:
        assert main(['predict', latest, '--out', out, '--overwrite']) == 2
        err = capsys.readouterr().err
        assert ('is the checkpoint predict reads' if out.endswith('best.pt') else
                f"is a file of the training run in '{os.path.realpath(run)}'") in err, err
        assert err.count('\n') == 1
        assert _snapshot(run) == first
    assert main(['predict', latest, '--out', str(tmp_path / 'p.csv')]) == 0


def test_an_empty_path_flag_is_refused(tmp_path, capsys, monkeypatch):
    # '--root ""' was the working directory (its raw/ folder made, or a download made there)
    monkeypatch.chdir(tmp_path)
    real = ['--task', 'scanobjectnn', '--root', '', '--task-arg', 'num_points=16', '--no-progress']
    for argv, message in (
            (['train', *real, '--model', 'deepsets', '--out', 'o'], '--root is empty'),
            (['compare', *real, '--models', 'deepsets', '--out', 'o'], '--root is empty'),
            (['predict', 'x.pt', '--root', '', '--out', 'p.csv'], '--root is empty'),
            (['train', '--task', 'max', *T, '--model', 'deepsets', '--resume', ''],
             '--resume is empty: name a checkpoint file'),
            (['predict', '', '--out', 'p.csv'], 'checkpoint is empty')):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count('\n') == 1, (argv, err)
    assert os.listdir(tmp_path) == []


def test_only_the_main_process_of_torchrun_writes_a_comparisons_files(tmp_path, monkeypatch):
    # under torchrun a rank that came later found the comparison.json the main process had just
    # written and refused the comparison ("already holds the results of a comparison"), or
    # with --overwrite removed it; every rank also wrote results.* and the plot
    from torch_mz.cli import _common as cli
    monkeypatch.setattr(cli, '_main_process', lambda: False)  # (a rank > 0 of torchrun)
    out = tmp_path / 'cmp'
    out.mkdir()
    record = out / 'comparison.json'  # (as the main process wrote it)
    record.write_text('{"models": ["deepsets"], "seeds": 1}')
    argv = ['compare', '--task', 'max', *T, '--models', 'deepsets:hidden_channels=8',
            '--seeds', '1', '--out', str(out)]
    for extra in ([], ['--overwrite']):
        assert main(argv + extra) == 0
        assert record.read_text() == '{"models": ["deepsets"], "seeds": 1}'
        assert not (out / 'results.json').exists() and not (out / 'results.md').exists()


def test_only_the_main_process_of_torchrun_removes_a_runs_files(tmp_path, monkeypatch):
    # train --overwrite under torchrun: every rank removed the earlier run's files, so two ranks
    # removed one file at once, or a later one what the main process had written since
    from torch_mz.cli import _common as cli
    monkeypatch.setattr(cli, '_main_process', lambda: False)  # (a rank > 0 of torchrun)
    removed = []
    monkeypatch.setattr(cli, '_remove_run_files', lambda folder, **kwargs: removed.append(folder))

    class Trained(Exception):
        pass

    def run(*args, **kwargs):
        raise Trained
    monkeypatch.setattr(cli, '_run', run)
    out = tmp_path / 'run'
    out.mkdir()
    (out / 'checkpoint.pt').write_bytes(b'an earlier run')
    with pytest.raises(Trained):
        main(['train', *TINY, '--model', 'rigid', *SMALL, '--out', str(out), '--overwrite'])
    assert removed == []
    monkeypatch.setattr(cli, '_main_process', lambda: True)
    with pytest.raises(Trained):
        main(['train', *TINY, '--model', 'rigid', *SMALL, '--out', str(out), '--overwrite'])
    assert removed == [str(out)]


# the bad-input fuzz of the command line: its findings

FUZZ = ['--task', 'max', '--n-train', '8', '--n-val', '4', '--n-test', '4', '--epochs', '1',
        '--batch-size', '4', '--no-progress']


@pytest.mark.parametrize('command', ['train', 'compare', 'predict'])
@pytest.mark.parametrize('device', ['xla', 'meta'])
def test_a_device_type_the_commands_do_not_run_on_is_named_before_any_data(command, device,
                                                                            tmp_path, capsys):
    # torch.device takes 'xla', 'meta', 'ipu', ...: the run failed with a traceback once the
    # data were loaded ('meta' after the run's folder was made); predict checked its device
    # only after reading the checkpoint and the data
    out = tmp_path / 'out'
    checkpoint = tmp_path / 'best.pt'
    checkpoint.write_bytes(b'not read: the device is checked first')
    argv = {'train': ['train', *FUZZ, '--model', 'deepsets', '--out', str(out)],
            'compare': ['compare', *FUZZ, '--models', 'deepsets', '--seeds', '1', '--out',
                        str(out)],
            'predict': ['predict', str(checkpoint), '--out', str(out)]}[command]
    assert main([*argv, '--device', device]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"torch-mz: error: --device must be 'auto', 'cpu', 'cuda' or "
                          f"'cuda:N' (got '{device}'") and err.count('\n') == 1
    assert not out.exists()


@pytest.mark.parametrize('argv, named', [
    (['train', *FUZZ, '--model', f'deepsets:num_layers={2 ** 70}'],
     f"model spec 'deepsets:num_layers={2 ** 70}': a size too large"),  # (OverflowError)
    (['train', *FUZZ, '--model', f'deepsets:hidden_channels={2 ** 70}'],  # (C++ stack)
     f"model spec 'deepsets:hidden_channels={2 ** 70}': a size too large"),
    (['compare', *FUZZ, '--models', 'deepsets', '--model-arg', f'hidden_channels={2 ** 62}'],
     "--model-arg: model 'deepsets': a size too large"),  # (Storage size ... overflowed)
    (['models', '--in-channels', str(2 ** 70)], f'--in-channels {2 ** 70} is too large'),
    (['models', '--in-channels', str(2 ** 62)], f'--in-channels {2 ** 62} is too large'),
])
def test_sizes_beyond_a_tensors_end_in_one_line_that_names_their_flag(argv, named, tmp_path,
                                                                       capsys):
    # they ended in a traceback (OverflowError, TypeError, RuntimeError), or, for a width of
    # 2**70 given in a model spec, in a message that went on with PyTorch's C++ stack
    out = tmp_path / 'out'
    assert main([*argv, *(['--out', str(out)] if argv[0] != 'models' else [])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f'torch-mz: error: {named}') and err.count('\n') == 1
    assert not out.exists()


@pytest.mark.parametrize('error, kind', [
    (OverflowError("cannot fit 'int' into an index-sized integer"), 'too large'),
    (RuntimeError('Storage size calculation overflowed with sizes=[64, 2**62]'), 'too large'),
    (TypeError('empty(): argument \'size\' failed to unpack the object at pos 2 with error '
               '"Overflow when unpacking long long\nException raised from ...\nframe #0: ...'),
     'too large'),
])
def test_sizes_beyond_a_tensors_anywhere_end_in_one_line(error, kind, monkeypatch, capsys):
    _tasks_raise(monkeypatch, error)
    assert main(['tasks']) == 2
    err = capsys.readouterr().err
    assert err.startswith(f'torch-mz: error: {kind} (') and err.count('\n') == 1


def test_another_type_error_keeps_its_traceback(monkeypatch):
    _tasks_raise(monkeypatch, TypeError('a bug'))
    with pytest.raises(TypeError, match='a bug'):
        main(['tasks'])


@pytest.mark.parametrize('high', [2 ** 70, 2 ** 62, 10 ** 12,
                                  # (past a float's range: an OverflowError's traceback)
                                  pytest.param(10 ** 400, id='10**400')])
def test_a_set_size_range_that_cannot_fit_in_memory_is_named(high, tmp_path, capsys):
    # its smallest size fits: NumPy's 'high is out of bounds for int64' or 'array is too big'
    # (no flag named), or sets drawn until memory ran out
    out = tmp_path / 'out'
    assert main(['train', *FUZZ, '--model', 'deepsets', '--set-size', f'1,{high}', '--out',
                 str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f'torch-mz: error: --set-size 1,{high}: 16 sets of ')
    assert 'give a smaller HIGH' in err and err.count('\n') == 1
    assert not out.exists()


@pytest.mark.parametrize('command, spec', [
    ('train', 'deepsets:hidden_channels=8,hidden_channels=16'),
    ('train', 'deepsets:hidden_channels=8,hidden-channels=8'),
    ('compare', 'mean-mlp,deepsets:pool=sum,pool=mean'),
])
def test_a_model_spec_that_sets_an_option_twice_is_refused(command, spec, tmp_path, capsys):
    # the last value was taken, and the spec (the run's label and folder) named the other too
    out = tmp_path / 'out'
    flag = '--model' if command == 'train' else '--models'
    assert main([command, *FUZZ, flag, spec, '--out', str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f'torch-mz: error: {flag}: model spec ') and 'more than once' in err
    assert err.count('\n') == 1 and not out.exists()


@pytest.mark.parametrize('command', ['train', 'compare', 'predict'])
def test_an_out_path_with_a_nul_character_is_named(command, tmp_path, capsys):
    # the OS's 'embedded null byte' ended the command without naming --out
    checkpoint = tmp_path / 'best.pt'
    checkpoint.write_bytes(b'not read: --out is checked first')
    out = str(tmp_path / 'a\x00b')
    argv = {'train': ['train', *FUZZ, '--model', 'deepsets'],
            'compare': ['compare', *FUZZ, '--models', 'deepsets', '--seeds', '1'],
            'predict': ['predict', str(checkpoint)]}[command]
    assert main([*argv, '--out', out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f'torch-mz: error: --out {out!r} holds a NUL character')
    assert err.count('\n') == 1 and os.listdir(tmp_path) == ['best.pt']


def test_path_flags_expand_the_home_folder_as_root_does(tmp_path, capsys, monkeypatch):
    # --out=~/run (which the shell leaves as it is) wrote into a folder named '~' in the working
    # directory, and --resume / predict's checkpoint '~/...' were not found
    home = tmp_path / 'home'
    home.mkdir()
    monkeypatch.setenv('HOME', str(home))
    monkeypatch.chdir(tmp_path)
    argv = ['train', '--task', 'max', *T, '--model', 'deepsets:hidden_channels=8']
    assert main([*argv, '--out=~/run']) == 0
    assert (home / 'run' / 'checkpoint.pt').is_file() and not (tmp_path / '~').exists()
    assert main(['train', '--task', 'max', *T[:-2], '--epochs', '2',
                 '--model', 'deepsets:hidden_channels=8', '--resume', '~/run/checkpoint.pt']) == 0
    assert len(open(home / 'run' / 'metrics.jsonl').read().splitlines()) == 2
    assert main(['predict', '~/run/best.pt', '--no-progress', '--out', '~/pred.csv']) == 0
    assert (home / 'pred.csv').is_file() and not (tmp_path / '~').exists()
    capsys.readouterr()


@pytest.mark.parametrize('error', [OverflowError('cannot convert float infinity to integer'),
                                   OverflowError('math range error')])
def test_an_overflow_error_of_a_bug_keeps_its_traceback(error, monkeypatch):
    # any OverflowError was taken for a size too large: a bug's (an inf turned into an int)
    # ended as 'too large (...): the sizes asked for ... do not fit', with no traceback
    _tasks_raise(monkeypatch, error)
    with pytest.raises(OverflowError):
        main(['tasks'])


def test_mps_where_there_is_none_is_said_so(monkeypatch, tmp_path, capsys):
    # it was refused as 'a device type torch-mz does not run on', which it runs on where it is
    import torch
    if getattr(torch.backends, 'mps', None) is not None:
        monkeypatch.setattr(torch.backends.mps, 'is_available', lambda: False)
    out = tmp_path / 'out'
    assert main(['train', *FUZZ, '--model', 'deepsets', '--out', str(out), '--device',
                 'mps']) == 2
    err = capsys.readouterr().err
    assert err == "torch-mz: error: --device: Device 'mps' was requested but MPS is not " \
                  "available\n"
    assert not out.exists()


# review of the command line's leftover bad-input cases

@pytest.mark.parametrize('spec, module, blocks', [
    (f'mz:num_encoder_blocks={2 ** 70}', 'torch_mz.nn.aggr', ('ISAB', 'SAB', 'PMA')),
    # (its width matched to mz's: an mz model is built first, whole)
    (f'perceiver:num_cross={2 ** 70}', 'torch_mz.models.set_transformer', ('MAB', 'SAB', 'PMA')),
    (f'egnn:num_layers={2 ** 70}', 'torch_mz.models.egnn', ('EGNNConv', )),
])
def test_a_block_count_that_cannot_fit_in_memory_is_refused_before_any_block_or_data(
        spec, module, blocks, tmp_path, capsys, monkeypatch):
    # they built blocks without end
    import importlib

    import torch_mz.cli._common as common

    def built(*args, **kwargs):
        raise AssertionError('a block was built, or the data loaded')
    for name in blocks:
        monkeypatch.setattr(importlib.import_module(module), name, built)
    monkeypatch.setattr(common, '_load', built)
    out = tmp_path / 'out'
    assert main(['train', *FUZZ, '--model', spec, '--out', str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"torch-mz: error: model spec '{spec}': a size too large for this "
                          f"machine (") and "beyond this machine's" in err
    assert err.count('\n') == 1 and not out.exists()


@pytest.mark.parametrize('command, flag, items, key', [
    ('train', '--task-arg', ['d=2', 'd=3'], 'd'),
    ('compare', '--task-arg', ['d=2', 'd=2'], 'd'),
    ('train', '--model-arg', ['hidden_channels=8', 'hidden-channels=16'], 'hidden_channels'),
    ('compare', '--model-arg', ['pool=sum', 'pool=mean'], 'pool'),
])
def test_a_task_or_model_option_given_twice_is_refused(command, flag, items, key, tmp_path,
                                                       capsys):
    # the last was taken, silently: the run's label did not name the value dropped
    out = tmp_path / 'out'
    models = ['--model', 'deepsets'] if command == 'train' else ['--models', 'deepsets',
                                                                  '--seeds', '1']
    argv = [command, *FUZZ, *models, flag, items[0], flag, items[1], '--out', str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (f"torch-mz: error: {flag} sets '{key}' more than once ('{items[0]}' and "
                   f"'{items[1]}'): give each option once\n")
    assert not out.exists()


@pytest.mark.parametrize('argv, message', [
    (['train', *FUZZ, '--model', 'deepsets', '--epochs', 'x'],
     "argument --epochs: invalid int value: 'x' (see 'torch-mz train --help')"),
    (['compare', '--task', 'max', '--lr', '1e-3x'],
     "argument --lr: invalid float value: '1e-3x' (see 'torch-mz compare --help')"),
    (['predict'], "the following arguments are required: checkpoint, --out (see 'torch-mz "
                  "predict --help')"),
    (['train', *FUZZ, '--model', 'deepsets', '--bogus'], 'unrecognized arguments: --bogus'),
    (['bogus'], "argument command: invalid choice: 'bogus'"),
])
def test_argparse_errors_end_in_one_line_as_the_commands_own(argv, message, capsys):
    # argparse printed its usage lines, then 'torch-mz train: error: ...'
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f'torch-mz: error: {message}') and err.count('\n') == 1, err


#: ``torch-mz`` with ``torch.save`` that, once epoch 1's ``checkpoint.pt`` is written (not yet
#: moved into place), gets SIGTERM (a cluster's time limit) and waits for it.
_SIGTERM_MID_WRITE = r'''
import os, signal, sys, time
import torch
from torch_mz.cli import main
save = torch.save
def save_then_sigterm(obj, f, *args, **kwargs):
    save(obj, f, *args, **kwargs)
    if obj.get('kind') == 'train' and obj.get('epoch') == 1:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)
torch.save = save_then_sigterm
sys.exit(main(sys.argv[1:]))
'''


def test_sigterm_ends_train_as_ctrl_c_does_and_the_run_resumes_exactly(tmp_path, capsys):
    # SIGTERM killed the command at once: no word, and the temporary file of the checkpoint
    # being written left in the run's folder
    import signal
    import subprocess
    import sys
    out = tmp_path / 'cut'
    argv = ['train', *TINY, '--model', 'deepsets', '--out', str(out)]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
    env.pop('WORLD_SIZE', None)
    done = subprocess.run([sys.executable, '-c', _SIGTERM_MID_WRITE, *argv], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + signal.SIGTERM, (done.returncode, done.stderr)
    # (and, since it said nothing of it, the command that goes on)
    import shlex
    command = shlex.join([*argv, '--resume', str(out / 'checkpoint.pt')])
    assert done.stderr.endswith(f'torch-mz: terminated (SIGTERM)\ntorch-mz: to go on: torch-mz '
                                f'{command}\n'), done.stderr
    assert not [n for n in os.listdir(out) if n.endswith('.tmp')], os.listdir(out)
    from torch_mz.train import load_checkpoint
    assert load_checkpoint(out / 'checkpoint.pt')['epoch'] == 0  # the last complete epoch's
    assert len((out / 'metrics.jsonl').read_text().splitlines()) == 1
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # (this process: untouched)
    # that command ends where the uninterrupted run ends
    assert main(shlex.split(command)) == 0
    assert main(['train', *TINY, '--model', 'deepsets', '--out', str(tmp_path / 'full')]) == 0
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # (put back after the command)
    resumed = load_checkpoint(out / 'checkpoint.pt')['model']
    full = load_checkpoint(tmp_path / 'full' / 'checkpoint.pt')['model']
    assert resumed.keys() == full.keys()
    assert all(torch.equal(resumed[k], full[k]) for k in full)


def test_an_ignored_sigterm_stays_ignored(monkeypatch, capsys):
    # started with SIGTERM ignored (`trap '' TERM`, a wrapper that handles it), the command was
    # ended by it all the same (status 143): the handler replaced the ignored disposition
    import signal
    import torch_mz.cli as cli

    def tasks(args):
        os.kill(os.getpid(), signal.SIGTERM)
        return 0
    monkeypatch.setattr(cli, 'cmd_tasks', tasks)
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        assert main(['tasks']) == 0
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert capsys.readouterr().err == ''


def _fake_kept_memory(monkeypatch):
    r"""This process as one that keeps no freed memory yet, :func:`keep_freed_memory` faked
    (it cannot be undone): returns the list its calls are appended to."""
    import torch_mz.runtime as runtime
    calls = []

    def keep(*args, **kwargs):
        calls.append(True)
        monkeypatch.setattr(runtime, '_THRESHOLD', runtime.MAX_BLOCK_BYTES)
        return True
    monkeypatch.setattr(runtime, '_THRESHOLD', None)
    monkeypatch.setattr(runtime, 'keep_freed_memory', keep)
    return calls


def test_train_resume_keeps_the_allocator_setting_of_the_checkpoint(tmp_path, capsys, caplog,
                                                                    monkeypatch):
    # a run started with --no-keep-freed-memory was resumed with freed memory kept (large
    # inputs encoded whole, other dropout masks) and a warning: not as its other options
    calls = _fake_kept_memory(monkeypatch)
    out, three = str(tmp_path / 'run'), [a if a != '2' else '3' for a in TINY]
    assert main(['--no-keep-freed-memory', 'train', *TINY, '--model', 'deepsets', '--out',
                 out]) == 0
    assert calls == []
    capsys.readouterr()
    caplog.clear()
    resume = ['train', *three, '--model', 'deepsets', '--resume', os.path.join(out,
                                                                               'checkpoint.pt')]
    assert main(resume) == 0
    assert calls == []  # (not kept)
    assert ('resuming with the allocator setting of the checkpoint (none given): '
            '--no-keep-freed-memory') in capsys.readouterr().out
    assert 'kept freed memory' not in caplog.text
    # a run that kept it, resumed with --no-keep-freed-memory: as asked, with the warning
    kept = str(tmp_path / 'kept')
    assert main(['train', *TINY, '--model', 'deepsets', '--out', kept]) == 0
    assert calls == [True]
    import torch_mz.runtime as runtime
    monkeypatch.setattr(runtime, '_THRESHOLD', None)
    caplog.clear()
    assert main(['--no-keep-freed-memory', 'train', *three, '--model', 'deepsets', '--resume',
                 os.path.join(kept, 'checkpoint.pt')]) == 0
    assert calls == [True]
    assert 'was trained with kept freed memory' in caplog.text


def test_compare_resume_keeps_the_allocator_setting_of_the_comparison(tmp_path, capsys, caplog,
                                                                      monkeypatch):
    calls = _fake_kept_memory(monkeypatch)
    out = str(tmp_path / 'cmp')
    assert main(['--no-keep-freed-memory', 'compare', *TINY, '--models', 'deepsets', '--seeds',
                 '1', '--out', out]) == 0
    assert calls == []
    record = json.load(open(os.path.join(out, 'comparison.json')))
    assert record['options']['keep_freed_memory'] is False
    for older in (False, True):  # comparison.json's record, then an earlier one's checkpoints
        if older:
            record['options'].pop('keep_freed_memory')
            json.dump(record, open(os.path.join(out, 'comparison.json'), 'w'))
        capsys.readouterr()
        caplog.clear()
        assert main(['compare', '--task', 'quadratic-tdof', '--models', 'deepsets', '--resume',
                     '--no-progress', '--out', out]) == 0
        assert calls == [], older
        assert ('resuming with the allocator setting of the comparison (none given): '
                '--no-keep-freed-memory') in capsys.readouterr().out
        assert 'kept freed memory' not in caplog.text
        # (the command recorded is the one that trains the comparison as it ran)
        command = json.load(open(os.path.join(out, 'results.json')))['command']
        assert command.endswith(f'--no-keep-freed-memory --out {out}'), command


def test_an_interrupted_train_says_the_command_that_goes_on(tmp_path, capsys, monkeypatch):
    # Ctrl-C (and SIGTERM) said 'torch-mz: interrupted' alone
    import shlex

    import torch_mz.cli._common as common
    out = str(tmp_path / 'run')
    argv = ['train', *TINY, '--model', 'deepsets', '--out', out]
    run = common._run

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(common, '_run', stopped)
    assert main([*argv, '--overwrite']) == 130  # stopped before the first checkpoint
    err = capsys.readouterr().err.splitlines()
    again = shlex.join([*argv, '--overwrite'])
    assert err == ['torch-mz: interrupted', f"torch-mz: '{out}' holds no checkpoint yet "
                   f"(stopped before the first was written); to start again: torch-mz {again}"]
    monkeypatch.setattr(common, '_run', run)
    assert main(shlex.split(again)) == 0
    monkeypatch.setattr(common, '_run', stopped)
    checkpoint = os.path.join(out, 'checkpoint.pt')
    three = [a if a != '2' else '3' for a in argv]
    capsys.readouterr()
    assert main([*three, '--resume', checkpoint]) == 130
    err = capsys.readouterr().err.splitlines()
    command = shlex.join([*three, '--resume', checkpoint])
    assert err == ['torch-mz: interrupted', f'torch-mz: to go on: torch-mz {command}'], err
    monkeypatch.setattr(common, '_run', run)
    assert main(shlex.split(command)) == 0
    # stopped before its data are loaded (--overwrite has not yet removed the earlier run, which
    # --resume would continue): no command
    monkeypatch.setattr(common, '_load', stopped)
    assert main([*argv, '--overwrite']) == 130
    assert capsys.readouterr().err == 'torch-mz: interrupted\n'


def test_an_interrupted_compare_says_the_command_that_goes_on(tmp_path, capsys, monkeypatch):
    import shlex

    import torch_mz.study as study
    out = str(tmp_path / 'cmp')
    argv = ['compare', *TINY, '--models', 'deepsets', '--seeds', '1', '--out', out]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(study, 'train_models', interrupted)
    assert main([*argv, '--overwrite']) == 130
    err = capsys.readouterr().err.splitlines()
    assert err == ['torch-mz: interrupted',
                   f"torch-mz: to go on: torch-mz {shlex.join([*argv, '--resume'])}"], err
    monkeypatch.undo()
    assert main([*argv, '--resume']) == 0
