import json
import os.path as osp
import warnings

import torch

from torch_mz.cli import main
from torch_mz.models import build_model
from torch_mz.tasks import load_task

FAST = ['--epochs', '1', '--warmup-epochs', '0', '--batch-size', '2', '--no-progress',
        '--model-arg', 'dim=8', '--model-arg', 'num_inducing=2', '--model-arg', 'd_ff=8']


def test_qm9_task_and_cli(tmp_path, qm9pack_csv):
    root = str(tmp_path / 'QM9')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        task = load_task('qm9', root=root, csv_path=qm9pack_csv, target=['mu', 'alpha'],
                         n_train=2, n_val=1, n_test=1)
    assert task.task_type == 'regression' and task.out_channels == 2 and task.in_channels == 9
    assert task.train[0].y.shape == (1, 2)
    ids = [int(d.gdb_idx) for split in (task.train, task.val, task.test) for d in split]
    assert len(set(ids)) == 4  # disjoint splits
    # EGNN sees the invariant columns only: its prediction is rotation-invariant
    model = build_model('egnn', task.in_channels, 2, pos_dim=task.pos_dim,
                        feature_columns=task.info['feature_columns']).double().eval()
    data = task.train[0].clone()
    data.x, data.pos = data.x.double(), data.pos.double()
    data.batch = torch.zeros(data.num_nodes, dtype=torch.long)
    pred = model(data)
    rot, _ = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64))
    data.pos = data.pos @ rot.T + 1.0
    data.x[:, 5:8] = data.pos  # the coordinate columns move with pos
    torch.testing.assert_close(model(data), pred)
    out = str(tmp_path / 'run')
    assert main(['train', '--task', 'qm9', '--root', root, '--task-arg', f'csv_path={qm9pack_csv}',
                 '--n-train', '2', '--n-val', '1', '--n-test', '1', '--model', 'rigid', '--out',
                 out, *FAST]) == 0
    assert 'r2' in json.load(open(osp.join(out, 'result.json')))['test_metrics']


def test_modelnet_task_and_cli(tmp_path, modelnet_mesh_root):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        task = load_task('modelnet40', root=modelnet_mesh_root, num_points=32)
    assert task.task_type == 'classification' and task.out_channels == 40
    # the fixture has 4 training meshes, one of them degenerate (skipped and counted)
    assert len(task.train) + len(task.val) == 3 and len(task.test) == 2
    # training sets are augmented (rotation about the up axis), validation sets are not
    a, b = task.train[0].pos, task.train[0].pos
    assert not torch.allclose(a, b)
    torch.testing.assert_close(task.val[0].pos, task.val[0].pos)
    out = str(tmp_path / 'run')
    assert main(['compare', '--task', 'modelnet40', '--root', modelnet_mesh_root, '--task-arg',
                 'num_points=32', '--models', 'deepsets,egnn', '--seeds', '1', '--out', out,
                 '--epochs', '1', '--warmup-epochs', '0', '--batch-size', '2',
                 '--no-progress']) == 0
    summary = json.load(open(osp.join(out, 'results.json')))['summary']
    assert [s['model'] for s in summary] == ['deepsets', 'egnn']
    assert 0.0 <= summary[0]['accuracy'] <= 1.0


def test_scanobjectnn_task(scanobjectnn_root):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        task = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=64)
    assert task.out_channels == 15 and len(task.test) == 3
    assert task.train[0].pos.shape == (64, 3)


def test_missing_data_is_a_clear_cli_error(tmp_path, capsys):
    root = str(tmp_path / 'ScanObjectNN')
    assert main(['train', '--task', 'scanobjectnn', '--root', root, '--model', 'rigid',
                 *FAST]) == 2
    err = capsys.readouterr().err
    assert 'ScanObjectNN' in err and 'Traceback' not in err
