import json
import os

import pytest

from torch_mz.cli import DEMO_ARGS, build_parser, main

TINY = ['--task', 'quadratic-tdof', '--n-train', '48', '--n-val', '16', '--n-test', '16',
        '--task-arg', 'd=4', '--task-arg', 'tdof=2', '--set-size', '3,6', '--epochs', '2',
        '--warmup-epochs', '1', '--batch-size', '16', '--lr', '1e-3', '--no-progress']


def test_listings(capsys):
    assert main(['tasks']) == 0
    out = capsys.readouterr().out
    for name in ('quadratic-tdof', 'meb-radius', 'qm9', 'modelnet40'):
        assert name in out
    assert main(['models']) == 0
    out = capsys.readouterr().out
    for name in ('mz', 'mz-1l', 'st-4l', 'egnn', 'deepsets', 'perceiver'):
        assert f'\n{name} ' in '\n' + out


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


def test_corrupt_checkpoint_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / 'checkpoint.pt'
    bad.write_bytes(b'not a checkpoint')
    assert main(['train', *TINY, '--model', 'rigid', '--out', str(tmp_path / 'r'),
                 '--resume', str(bad)]) == 2
    err = capsys.readouterr().err
    assert 'checkpoint' in err and 'Traceback' not in err


def test_demo_arguments_parse():
    args = build_parser().parse_args(DEMO_ARGS)
    assert args.models == 'mz-1l,st-4l,egnn' and args.task == 'quadratic-tdof'
