import csv
import json
import os.path as osp
import warnings

import numpy as np
import pytest
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
    # coordinates in pos only, the invariant features in x: EGNN's prediction is
    # rotation-invariant, a set model's (which reads [pos, x]) is not
    assert task.pos_dim == 3 and task.train[0].x.shape[1] == 6
    egnn = build_model('egnn', task.in_channels, 2, pos_dim=task.pos_dim).double().eval()
    rigid = build_model('rigid', task.in_channels, 2, dim=8, num_inducing=2).double().eval()
    data = task.train[0].clone()
    data.x, data.pos = data.x.double(), data.pos.double()
    before = egnn(data).prediction, rigid(data).prediction
    rot, _ = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64))
    data.pos = data.pos @ rot.T + 1.0
    torch.testing.assert_close(egnn(data).prediction, before[0])
    assert not torch.allclose(rigid(data).prediction, before[1])
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


def test_point_cloud_validation_hold_out_is_an_option(modelnet_mesh_root, scanobjectnn_root):
    from torch_mz.tasks import task_options
    for name in ('modelnet40', 'scanobjectnn'):
        assert task_options(name)[0]['val_fraction'] == 0.1
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        held_out = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=32,
                             val_fraction=0.4)
        published = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=32,
                              val_fraction=0)
    # 5 training objects: 40% held out; or all five train and the test split validates
    assert (len(held_out.train), len(held_out.val), len(held_out.test)) == (3, 2, 3)
    assert held_out.info['val_split'] == 'held-out training files'
    assert (len(published.train), len(published.val)) == (5, 3)
    assert published.info['val_split'] == 'test' and published.info['val_fraction'] == 0
    assert all(torch.equal(v.pos, t.pos) for v, t in zip(published.val, published.test))
    train_labels = sorted(int(d.y) for d in published.train)
    assert train_labels == sorted(scanobjectnn_root['files'][
        osp.join('h5_files', 'main_split', 'training_objectdataset.h5')]['label'].tolist())
    with pytest.raises(ValueError, match='val_fraction'):
        load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=32, val_fraction=1.0)
    # the CLI takes it as a task option
    assert main(['train', '--task', 'scanobjectnn', '--root', scanobjectnn_root['root'],
                 '--task-arg', 'num_points=32', '--task-arg', 'val_fraction=0', '--model',
                 'deepsets', '--out', str(modelnet_mesh_root) + '-run', '--epochs', '1',
                 '--warmup-epochs', '0', '--batch-size', '2', '--no-progress']) == 0


def test_scanobjectnn_resample_redraws_training_points_only(scanobjectnn_root):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        task = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=32,
                         resample=True, n_val=1)
    from torch_geometric.transforms import FixedPoints
    # training: a fresh draw of 32 of the 256 points, then the augmentation, every access
    draw = task.train._draw  # in get(), before the augmentation (the dataset's transform)
    assert isinstance(draw, FixedPoints) and draw.num == 32 and not draw.replace
    assert task.train[0].pos.shape == (32, 3) and task.train[0].mask.shape == (32, )
    assert not torch.equal(task.train[0].pos, task.train[0].pos)
    for split in (task.val, task.test):  # evaluation keeps one subset per object
        assert split.transform is None
        assert torch.equal(split[0].pos, split[0].pos) and split[0].pos.shape == (32, 3)


def test_predict_on_the_official_test_split_takes_any_seed_and_size(tmp_path, scanobjectnn_root,
                                                                    capsys):
    # ScanObjectNN's test split is the official test file: the data seed draws only the
    # validation sets, so predict neither refuses another seed nor caps --n-test at the run's
    root = scanobjectnn_root['root']
    run = str(tmp_path / 'run')
    assert main(['train', '--task', 'scanobjectnn', '--root', root, '--task-arg',
                 'num_points=64', '--data-seed', '1', '--n-test', '2', '--model', 'rigid',
                 '--out', run, *FAST]) == 0
    best, out = osp.join(run, 'best.pt'), str(tmp_path / 'p.csv')
    labels = scanobjectnn_root['files']['h5_files/main_split/test_objectdataset.h5']['label']
    for seed in ('0', '1'):
        assert main(['predict', best, '--task', 'scanobjectnn', '--root', root, '--data-seed',
                     seed, '--n-test', '3', '--out', out, '--overwrite']) == 0
        with open(out) as f:
            rows = list(csv.DictReader(f))
        assert [int(r['target']) for r in rows] == labels.tolist()


def test_load_test_split_takes_another_data_seed_for_an_official_test_split_as_documented(
        scanobjectnn_root):
    # load_test_split's docstring said the data seed must be the run's wherever the checkpoint
    # records it; for the official test files of ScanObjectNN and ModelNet40 any seed is taken
    from torch_mz.inference import load_test_split
    state = {'task_type': 'classification',
             'run_info': {'task': {'name': 'scanobjectnn', 'args': {'num_points': 64},
                                   'split': {'seed': 0, 'n_train': None, 'n_val': None,
                                             'n_test': None}}}}
    labels = scanobjectnn_root['files']['h5_files/main_split/test_objectdataset.h5']['label']
    for seed in (0, 1):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            splits = load_test_split(state, root=scanobjectnn_root['root'], data_seed=seed)
        assert [int(d.y) for d in splits.test] == labels.tolist()
    doc = ' '.join(load_test_split.__doc__.split())
    assert 'whose test split is the official test files whatever the seed' in doc
    assert 'but for the official test splits of ModelNet40 and ScanObjectNN' in doc


def test_predict_warns_only_on_a_changed_qm9_option(tmp_path, qm9pack_csv, capsys):
    root = str(tmp_path / 'QM9')
    run = str(tmp_path / 'run')
    data = ['--task', 'qm9', '--root', root, '--task-arg', f'csv_path={qm9pack_csv}']
    assert main(['train', *data, '--n-train', '2', '--n-val', '1', '--n-test', '1', '--model',
                 'deepsets', '--out', run, *FAST[:-6]]) == 0
    out = str(tmp_path / 'p.csv')
    capsys.readouterr()
    assert main(['predict', osp.join(run, 'best.pt'), *data, '--task-arg', 'target=mu',
                 '--task-arg', 'source=qm9pack', '--out', out]) == 0
    assert 'warning' not in capsys.readouterr().err  # the defaults the run used
    assert main(['predict', osp.join(run, 'best.pt'), *data, '--task-arg', 'target=alpha',
                 '--out', out, '--overwrite']) == 0
    assert "--task-arg target='alpha' differs from the training run's target='mu'" in (
        capsys.readouterr().err)


def test_qm9_task_targets_splits_and_width(tmp_path, qm9pack_csv):
    import torch_geometric.transforms as T
    root = str(tmp_path / 'QM9')
    kw = dict(root=root, csv_path=qm9pack_csv, n_train=2, n_val=1, n_test=1)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        every = load_task('qm9', target=None, **kw)  # documented: every target (it raised)
        assert every.out_channels == 12 and every.train[0].y.shape == (1, 12)
        assert every.info['targets'][:2] == ['mu', 'alpha']
        for bad in (True, 1.5):  # True was read as column 1 (alpha), 1.5 a TypeError
            with pytest.raises(ValueError, match=f'got {bad}'):
                load_task('qm9', target=bad, **kw)
        assert load_task('qm9', target=range(2), **kw).info['targets'] == ['mu', 'alpha']
        # split sizes without n_train or n_val: no training or validation molecules, said
        # before anything loads (the trainer said "Expected a non-empty val dataset")
        for sizes, match in ((dict(n_train=2), 'no n_val has no validation molecules'),
                             (dict(n_val=1, n_test=1), 'no n_train has no training molecules')):
            with pytest.raises(ValueError, match=match):
                load_task('qm9', root=root, csv_path=qm9pack_csv, **sizes)

        class DropCharge(T.BaseTransform):  # a transform that changes the width of x
            def forward(self, data):
                data = data.clone()
                data.x = data.x[:, :5]
                return data
        narrower = load_task('qm9', transform=DropCharge(), **kw)
    assert every.in_channels == 9 and narrower.in_channels == 8  # [pos, x] as the sets come out
    model = build_model('deepsets', narrower.in_channels, 1, pos_dim=3)
    assert model(narrower.train[0]).prediction.shape == (1, 1)


@pytest.mark.parametrize('target', [np.arange(2), torch.tensor([0, 1]),
                                    np.array(['mu', 'alpha'])])
def test_a_run_with_an_array_of_qm9_targets_loads_its_test_split_again(tmp_path, qm9pack_csv,
                                                                      target):
    # the array was recorded by its repr, 'array([0, 1])', which load_test_split (and predict)
    # gave QM9 as the target: "unknown QM9 target 'array([0, 1])'"
    from torch_mz.inference import load_test_split
    from torch_mz.study.grid import run_info_for
    kw = dict(root=str(tmp_path / 'QM9'), csv_path=qm9pack_csv, n_train=2, n_val=1, n_test=1)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        task = load_task('qm9', target=target, **kw)
        state = dict(run_info=run_info_for(task, 'deepsets', {}), task_type='regression')
        again = load_test_split(state, root=kw['root'])
    assert task.info['targets'] == again.info['targets'] == ['mu', 'alpha']
    assert [int(d.gdb_idx) for d in again.test] == [int(d.gdb_idx) for d in task.test]


def test_a_run_trained_with_a_transform_is_named_by_predict_and_resume(tmp_path, qm9pack_csv,
                                                                      capsys):
    import torch_geometric.transforms as T

    from torch_mz.study import train_one
    from torch_mz.train import CheckpointError, TrainConfig
    root, run = str(tmp_path / 'QM9'), str(tmp_path / 'run')
    kw = dict(root=root, csv_path=qm9pack_csv, n_train=2, n_val=1, n_test=1)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        task = load_task('qm9', transform=T.RandomRotate(30), **kw)
        config = TrainConfig(epochs=1, warmup_epochs=0, batch_size=2, progress=False,
                             out_dir=run)
        train_one(task, 'deepsets', 0, config)
        # the transform is recorded with its settings: resuming with others is another run
        other = load_task('qm9', transform=T.RandomRotate(180), **kw)
        with pytest.raises(CheckpointError, match='RandomRotate'):
            train_one(other, 'deepsets', 0, TrainConfig(
                epochs=2, warmup_epochs=0, batch_size=2, progress=False, out_dir=run,
                resume=osp.join(run, 'checkpoint.pt')))
    info = torch.load(osp.join(run, 'best.pt'), weights_only=True)['run_info']
    assert info['task']['args']['transform'] == repr(T.RandomRotate(30))
    # predict cannot rebuild a Python transform: it says so and how to predict instead (it
    # passed the recorded name on as the transform: "must be a callable ... got 'Center'")
    assert main(['predict', osp.join(run, 'best.pt'), '--task', 'qm9', '--root', root,
                 '--out', str(tmp_path / 'p.csv')]) == 2
    err = capsys.readouterr().err
    assert "trained with transform=RandomRotate((-30, 30), axis=0)" in err and 'Python API' in err
    # the Python API rebuilds the run's test split when given the transform again
    from torch_mz.inference import TestSplitWarning, load_test_split
    best = osp.join(run, 'best.pt')
    with pytest.raises(ValueError, match=r"trained with transform=RandomRotate\(\(-30, 30\), "
                       r"axis=0\) .*pass them again"):
        load_test_split(best, root=root)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # (PyG's and the dataset's own warnings)
        warnings.simplefilter('error', TestSplitWarning)  # the run's own transform: none
        test = load_test_split(best, root=root, transform=T.RandomRotate(30)).test
        again = load_test_split(best, root=root, task_args=dict(transform=T.RandomRotate(30)))
    assert [int(d.gdb_idx) for d in again.test] == [int(d.gdb_idx) for d in test]
    assert [int(d.gdb_idx) for d in test] == [int(d.gdb_idx) for d in task.test]
    with pytest.warns(TestSplitWarning, match=r"transform='RandomRotate\(\(-180, 180\), axis=0\)' "
                      r"differs from the training run's"):
        load_test_split(best, root=root, transform=T.RandomRotate(180))


def test_n_test_spreads_over_the_official_test_split(scanobjectnn_root):
    # the official files list their shapes class by class: the first N held a few classes
    from torch_mz.datasets.real import spread_indices
    assert spread_indices(10, 2468)[:3] == [0, 246, 493] and spread_indices(10, 2468)[-1] == 2221
    assert spread_indices(5, 5) == spread_indices(9, 5) == [0, 1, 2, 3, 4]
    spread = spread_indices(40, 2468)
    assert len(set(spread)) == 40 and max(b - a for a, b in zip(spread, spread[1:])) <= 62
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        full = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=16)
        two = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=16,
                        n_test=2)
    assert [int(d.y) for d in two.test] == [int(full.test[i].y) for i in spread_indices(2, 3)]


def test_n_test_beyond_the_official_test_split_takes_all_of_it_and_says_so(scanobjectnn_root):
    # it took all 3 test objects without a word, and the run recorded n_test 4; the refusal
    # that replaced it stopped the runs recorded so and a benchmark's one n_test for two
    # datasets: all are taken, with a warning, and the count taken is recorded
    load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=16)  # (processed)
    with pytest.warns(UserWarning, match='scanobjectnn: n_test=4 asks for more test sets than '
                      'the 3 official test files: all 3 are taken') as said:
        task = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=16,
                         n_test=4)
    assert len(task.test) == 3 and task.split['n_test'] == 3
    assert task.split['test_subset'] == 'spread'
    from torch_mz.datasets.real import TestSetsWarning
    assert [w.category for w in said] == [TestSetsWarning]
    with warnings.catch_warnings():
        warnings.simplefilter('error', TestSetsWarning)
        task = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=16, n_test=3)
    assert len(task.test) == 3 and task.split['n_test'] == 3


def test_one_n_test_between_two_datasets_test_sizes_serves_the_point_cloud_benchmark(
        modelnet_h5_root, scanobjectnn_root, tmp_path):
    # benchmarks/point_clouds.py passes one --n-test to both datasets: one between their test
    # sizes (ModelNet40's 2468, ScanObjectNN's 581) refused the whole benchmark
    pytest.importorskip('h5py')
    from tests._scripts import load_script
    point_clouds = load_script('point_clouds')
    out = tmp_path / 'results'
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        status = point_clouds.main([
            '--dataset', 'both', '--root', str(tmp_path), '--modelnet-source', 'hdf5',
            '--variant', 'OBJ_ONLY', '--num-points', '16', '--n-train', '3', '--n-val', '1',
            '--n-test', '3', '--batch-size', '4', '--models', 'deepsets', '--seeds', '1',
            '--epochs', '1', '--device', 'cpu', '--out', str(out)])
    assert status == 0
    with open(out / 'point_clouds.json') as f:  # ModelNet40: 3 test shapes, OBJ_ONLY: 2
        sizes = json.load(f)['setup']['sizes']
    assert sizes['modelnet40']['test'] == 3 and sizes['scanobjectnn']['test'] == 2


def test_a_point_cloud_task_takes_a_transform_for_every_split(scanobjectnn_root):
    # (it was refused: "task 'scanobjectnn' has no option 'transform'")
    from torch_geometric.transforms import BaseTransform

    class Shift(BaseTransform):  # x + 10: after the rotation about y, the mean's x stays 10
        def forward(self, data):
            data.pos = data.pos + torch.tensor([10.0, 0.0, 0.0])
            return data

    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        plain = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=16)
        shifted = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=16,
                            transform=Shift())
    for split in ('val', 'test'):
        for a, b in zip(getattr(plain, split), getattr(shifted, split)):
            torch.testing.assert_close(b.pos, a.pos + torch.tensor([10.0, 0.0, 0.0]))
    # the training split: augmented (rotated about y, jittered), then shifted; shifted first,
    # the rotation would have turned the shift away from x
    for seed in range(5):
        torch.manual_seed(seed)
        centre = shifted.train[0].pos.mean(0) - plain.train[0].pos.mean(0)  # (both centred)
        assert abs(float(centre[0]) - 10) < 1.5 and abs(float(centre[2])) < 1.5


def test_a_run_recorded_before_the_spread_subset_predicts_on_its_first_n(scanobjectnn_root,
                                                                        tmp_path):
    # a run that recorded no test_subset took the first n_test official test files: predict
    # scores those again (the spread subset would score other sets than the run reported)
    from torch_mz.inference import load_test_split
    from torch_mz.study import train_one
    from torch_mz.train import TrainConfig, load_checkpoint
    from torch_mz.datasets.real import spread_indices
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        task = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=16,
                         n_test=2)
        full = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=16)
        assert task.split['test_subset'] == 'spread'
        train_one(task, 'deepsets', 0, TrainConfig(epochs=1, warmup_epochs=0, batch_size=2,
                                                   progress=False, out_dir=str(tmp_path)),
                  hidden_channels=8)
        state = load_checkpoint(tmp_path / 'best.pt')
        spread = load_test_split(state, root=scanobjectnn_root['root']).test
        del state['run_info']['task']['split']['test_subset']  # as recorded before
        first = load_test_split(state, root=scanobjectnn_root['root']).test
    labels = [int(d.y) for d in full.test]
    assert [int(d.y) for d in spread] == [labels[i] for i in spread_indices(2, len(labels))]
    assert [int(d.y) for d in first] == labels[:2]


@pytest.mark.parametrize('n_test', [-1, -3, 1.5, True, '2'])
def test_a_point_cloud_n_test_that_is_no_count_is_refused(scanobjectnn_root, n_test):
    # a negative n_test gave an empty test split without a word
    with pytest.raises(ValueError, match=r"scanobjectnn: 'n_test' must be an integer >= 0 "
                       r"\(got .*\)"):
        load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=16, n_test=n_test)
    import numpy as np
    splits = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=16,
                       n_test=np.int64(2))
    assert len(splits.test) == 2


def test_scanobjectnn_resample_splits_the_same_objects_for_training_and_validation(tmp_path):
    # object 0 has a NaN point outside its fixed subset: the cache of all points (training)
    # left it out, the fixed-subset one (validation, where the split is drawn) kept it, so the
    # split's indices selected shifted objects in training (validation objects trained on) or
    # ran past its end (IndexError)
    from tests.datasets.test_scanobjectnn import _nan_outside_the_subset
    root = str(tmp_path)
    _nan_outside_the_subset(root, 128)
    for seed in range(6):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            task = load_task('scanobjectnn', root=root, seed=seed, num_points=128,
                             resample=True, val_fraction=0.3)
        train = [int(d.y) for d in task.train]
        val = [int(d.y) for d in task.val]
        assert not set(train) & set(val) and len(train) == len(set(train))
        assert sorted(train + val) == list(range(1, 15)), seed


def test_a_training_dataset_of_another_length_than_the_split_is_refused(scanobjectnn_root):
    # (two caches that leave out other objects, such as one built before that was fixed): the
    # indices drawn on one were applied to the other
    from torch_mz.datasets.real import _point_cloud_task
    from torch_mz.datasets.scanobjectnn import ScanObjectNN

    class OneObjectFewer(ScanObjectNN):  # the resampled training dataset lacks its last object
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            if self.resample and self.train:
                self._indices = range(self.len() - 1)

    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        with pytest.raises(ValueError, match=r'scanobjectnn: the training dataset .* holds 4 '
                           r'sets but the one the training/validation split is drawn on .* '
                           r'holds 5.*force_reload=True'):
            _point_cloud_task('scanobjectnn', OneObjectFewer, 0, None, 1, None,
                              scanobjectnn_root['root'], 15, num_points=32, resample=True,
                              log=False)
        task = _point_cloud_task('scanobjectnn', ScanObjectNN, 0, None, 1, None,
                                 scanobjectnn_root['root'], 15, num_points=32, resample=True,
                                 log=False)
    assert (len(task.train), len(task.val)) == (4, 1)


def test_a_point_cloud_task_reports_the_width_a_transform_gives(scanobjectnn_root):
    # in_channels was 3 whatever the transform or pre_transform did: a model built with it
    # refused every batch of sets that a transform had given x ("build it with in_channels=4")
    import torch_geometric.transforms as T
    from torch_geometric.loader import DataLoader

    from torch_mz.models.base import set_features
    root = scanobjectnn_root['root']
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        plain = load_task('scanobjectnn', root=root, num_points=16)
        by_transform = load_task('scanobjectnn', root=root, num_points=16,
                                 transform=T.Constant(1.0))
        by_pre_transform = load_task('scanobjectnn', root=root, num_points=16,
                                     pre_transform=T.Compose([T.Constant(1.0),
                                                              T.Constant(2.0)]))
    assert plain.in_channels == 3
    for task, width in ((by_transform, 4), (by_pre_transform, 5)):
        assert task.in_channels == width
        for split in (task.train, task.val, task.test):
            assert set_features(split[0]).size(-1) == width
        model = build_model('deepsets', task.in_channels, task.out_channels)
        batch = next(iter(DataLoader(task.train, batch_size=2)))
        assert model(batch).prediction.shape == (2, 15)


def test_force_reload_processes_each_point_cloud_cache_once(scanobjectnn_root, modelnet_h5_root,
                                                           monkeypatch):
    # the training, validation and test datasets each rebuilt the cache that the train and
    # test splits share: three processings of every raw file (ModelNet40's meshes sampled
    # three times) where one rebuilds it
    from torch_mz.datasets.common import TrainTestSets
    built = []
    process = TrainTestSets.process

    def counting(self):
        built.append(osp.basename(self.processed_dir))
        process(self)

    monkeypatch.setattr(TrainTestSets, 'process', counting)
    root = scanobjectnn_root['root']
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        task = load_task('modelnet40', root=modelnet_h5_root['root'], source='hdf5',
                         num_points=16, force_reload=True)  # (its class has no resample)
        assert built == ['hdf5_16_pos-only'] and len(task.test) == 3
        built.clear()
        load_task('scanobjectnn', root=root, num_points=16)
        assert built == ['OBJ_BG_16_seed0_pos-only']
        built.clear()
        task = load_task('scanobjectnn', root=root, num_points=16, force_reload=True)
        assert built == ['OBJ_BG_16_seed0_pos-only']
        assert (len(task.train) + len(task.val), len(task.test)) == (5, 3)
        built.clear()
        # resampled: the training split's cache of all points and the fixed subsets' cache
        load_task('scanobjectnn', root=root, num_points=16, resample=True, force_reload=True)
    assert built == ['OBJ_BG_all_pos-only', 'OBJ_BG_16_seed0_pos-only']


def test_val_fraction_holds_out_its_share_of_the_training_files(tmp_path):
    # int(n * val_fraction) truncated a product that floating point leaves just below a whole
    # number: 0.58 of 50 training files is 28.999999999999996, and 28 were held out, not 29
    import numpy as np

    from tests.datasets.raw_formats import random_clouds, write_h5
    from torch_mz.datasets.scanobjectnn import scanobjectnn_file
    rng = np.random.default_rng(0)
    root = str(tmp_path / 'ScanObjectNN')
    for train, n in ((True, 50), (False, 2)):
        write_h5(osp.join(root, 'raw', scanobjectnn_file('OBJ_BG', train)),
                 data=random_clouds(rng, n, 8), label=np.arange(n) % 15)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        for fraction, held_out in ((0.58, 29), (0.1, 5), (0.3, 15), (0.01, 1)):
            task = load_task('scanobjectnn', root=root, num_points=8, val_fraction=fraction)
            assert (len(task.train), len(task.val)) == (50 - held_out, held_out), fraction
            assert task.info['val_fraction_of_train'] == held_out / 50


class _KeepsOthersOnEveryPoint:
    r"""A pre_filter that decides otherwise on every point of an object than on a subset of 16
    (as one on the coordinates may): object 3 goes where it sees them all, 5 where it sees 16."""
    def __call__(self, data) -> bool:
        return int(data.y) != (3 if data.num_nodes > 16 else 5)


def test_scanobjectnn_resample_refuses_a_pre_filter_that_keeps_other_objects_in_each_cache(
        tmp_path):
    # the resampled training cache (every point) and the fixed one the split is drawn on held
    # other objects, in equal numbers: with seed 1 object 4 was both trained and validated on
    from tests.datasets.raw_formats import random_clouds, write_h5
    from torch_mz.datasets.scanobjectnn import scanobjectnn_file
    root = str(tmp_path)
    data, label = random_clouds(np.random.default_rng(1), 15, 256), np.arange(15)
    write_h5(osp.join(root, 'raw', scanobjectnn_file('OBJ_BG', True)), data=data, label=label)
    write_h5(osp.join(root, 'raw', scanobjectnn_file('OBJ_BG', False)), data=data[:4],
             label=label[:4])
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        with pytest.raises(ValueError, match=r'the pre_filter removed other training objects .*'
                           r'objects \[3, 5\].*putting validation objects into training'):
            load_task('scanobjectnn', root=root, seed=1, num_points=16, resample=True,
                      pre_filter=_KeepsOthersOnEveryPoint(), val_fraction=0.3)
        # without resample both are one cache: the split is the filter's, as it stands
        task = load_task('scanobjectnn', root=root, seed=1, num_points=16,
                         pre_filter=_KeepsOthersOnEveryPoint(), val_fraction=0.3)
    train, val = [int(d.y) for d in task.train], [int(d.y) for d in task.val]
    assert not set(train) & set(val) and sorted(train + val) == [
        k for k in range(15) if k != 5]


@pytest.mark.parametrize('sizes, name', [(dict(n_train=0.5), 'n_train'),
                                         (dict(n_val=0.5), 'n_val'),
                                         (dict(n_train=2.0, n_val=1.0), 'n_train'),
                                         (dict(n_val=-1), 'n_val'),
                                         (dict(n_train=True), 'n_train')])
def test_point_cloud_split_sizes_are_counts(scanobjectnn_root, sizes, name):
    # a float was read as a fraction of the training files (n_train=0.5 took half of them and
    # was recorded as 0.5), or refused as a fraction 'train' of a value never given (n_val=0.5:
    # "'train' as a fraction must lie in [0, 1] (got 4.5)")
    with pytest.raises(ValueError, match=rf"scanobjectnn: '{name}' must be an integer >= 0 "
                       r"\(got .*\): a number of sets"):
        load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=16, **sizes)
    splits = load_task('scanobjectnn', root=scanobjectnn_root['root'], num_points=16,
                       n_val=np.int64(2))
    assert len(splits.val) == 2 and type(splits.split['n_val']) is int  # (recorded as JSON's)
