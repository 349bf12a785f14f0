import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from torch_mz import datasets
from torch_mz.tasks import TASKS, is_synthetic, list_tasks, load_task, task_options


def test_task_options_follow_the_constructors():
    defaults, nullable, complete = task_options('max')
    assert complete and defaults['d'] == 16 and 'reduce' in nullable
    # make_task's own option that load_task passes on
    assert 'split_set_sizes' in defaults
    # PCAErrorTask passes **kwargs to its base class: the base's options count too
    defaults, nullable, complete = task_options('pca-error')
    assert complete and {'d', 'k', 'scales', 'center_std'} <= set(defaults) and 'd' in nullable
    # a dimension left at None is the class's own: the same task as that number given
    from torch_mz.tasks import resolved_options
    assert defaults['d'] is None and resolved_options('pca-error', {'d': None}) == {'d': 16}
    assert resolved_options('mst', {'d': None, 'k': 1}) == {'d': 8, 'k': 1}
    assert resolved_options('qm9', {'d': None}) == {'d': None}  # (real datasets: as given)
    # QM9's targets in any form it takes, by name ('mu' and 0 were two tasks to predict)
    for same in ('mu', ['mu'], 0, (0, )):
        assert resolved_options('qm9', {'target': same}) == {'target': 'mu'}
    assert resolved_options('qm9', {'target': [1, 'mu']}) == {'target': ['alpha', 'mu']}
    assert resolved_options('qm9', {'target': 'nu'}) == {'target': 'nu'}  # (QM9 refuses it)
    assert load_task('mst', n_train=2, n_val=1, n_test=1, d=np.int64(8)).in_channels == 8
    # real datasets: what load_real_task sets itself is no option
    defaults, nullable, complete = task_options('modelnet40')
    assert complete and 'num_points' in nullable and defaults['source'] == 'mesh'
    assert not {'root', 'train'} & set(defaults)
    assert 'transform' in defaults  # every split's, after the training augmentation
    with pytest.raises(ValueError, match="Unknown task 'nope'"):
        task_options('nope')


@pytest.mark.parametrize('name, kwargs, match', [
    ('max', dict(nosuch=3), "task 'max' has no option 'nosuch'"),
    ('max', dict(d='abc'), "task 'max': option 'd' expects an integer"),
    ('max', dict(d=True), "option 'd' expects an integer"),
    ('quadratic-tdof', dict(noise='loud'), "option 'noise' expects a number"),
    ('modelnet40', dict(num_points='all'), "option 'num_points' expects an integer"),
    ('qm9', dict(charge_failure=0), "option 'charge_failure' expects a string"),
    # a synthetic task is lists of Data: a PyG transform is refused with what to do instead
    ('meb-radius', dict(transform=abs), r"task 'meb-radius' is synthetic: .* takes no "
     r"'transform'; apply a transform to the sets, e.g. splits.train = \[transform\(d\)"),
])
def test_unknown_or_mistyped_task_options_are_refused_before_any_work(name, kwargs, match,
                                                                      tmp_path):
    with pytest.raises(ValueError, match=match):
        load_task(name, root=str(tmp_path / 'data'), **kwargs)
    assert not (tmp_path / 'data').exists()  # nothing downloaded or processed


def test_task_records_its_arguments():
    task = load_task('quadratic-tdof', n_train=4, n_val=2, n_test=2, set_size=(3, 4), d=4,
                     tdof=2, noise=1)  # an int where a float is expected is fine
    assert task.args == {'d': 4, 'tdof': 2, 'noise': 1, 'set_size': [3, 4]}
    assert load_task('max', n_train=2, n_val=1, n_test=1, d=2).args == {'d': 2}
    # NumPy numbers (refused: "expects an integer (got np.int64(4))") recorded as Python's, which
    # JSON writes
    task = load_task('quadratic-tdof', n_train=4, n_val=2, n_test=2, d=np.int64(4),
                     tdof=np.int64(2), noise=np.float32(0.5))
    assert task.args == {'d': 4, 'tdof': 2, 'noise': 0.5}
    assert json.loads(json.dumps(task.args)) == task.args


def test_one_registry_of_every_task():
    synthetic = list(datasets.TASKS)
    assert list(TASKS) == synthetic + ['modelnet40', 'scanobjectnn', 'qm9']
    descriptions = list_tasks()
    assert list(descriptions) == list(TASKS) and all(descriptions.values())
    # a loaded task carries the registry's description
    task = load_task('max', n_train=2, n_val=1, n_test=1, d=2)
    assert isinstance(task, datasets.TaskSplits) and task.description == descriptions['max']
    assert [is_synthetic(name) for name in TASKS] == [True] * len(synthetic) + [False] * 3
    # load_task and make_task give the same tensors from the same seed
    made = datasets.make_task('mst', n_train=3, n_val=2, n_test=2, seed=4, d=3)
    loaded = load_task('mst', n_train=3, n_val=2, n_test=2, seed=4, d=3)
    for split in ('train', 'val', 'test'):
        for a, b in zip(made[split], loaded[split]):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a.keys())
    assert (loaded.in_channels, loaded.out_channels, loaded.pos_dim) == (3, 1, 3)
    with pytest.warns(DeprecationWarning, match='TaskSplits'):
        from torch_mz.tasks import TaskData
    assert TaskData is datasets.TaskSplits


def test_datasets_do_not_import_the_registry():
    # the registry imports the datasets, never the other way round (no import cycle)
    code = ('import sys, torch_mz.datasets.real, torch_mz.datasets.synthetic; '
            "assert 'torch_mz.tasks' not in sys.modules")
    subprocess.run([sys.executable, '-c', code], check=True)


def test_task_options_of_the_wrong_kind_are_refused_before_any_data():
    with pytest.raises(ValueError, match="'split_set_sizes' must map splits"):
        load_task('quadratic-tdof', n_train=2, n_val=2, n_test=2, split_set_sizes=[1, 2])
    for key in ('transform', 'pre_filter'):  # text, e.g. from the CLI: not a callable
        with pytest.raises(ValueError, match=f"'{key}' must be a callable"):
            load_task('qm9', root='/nonexistent/qm9', **{key: 'x'})
    # k = d keeps every direction: the target would be 0 for every set
    with pytest.raises(ValueError, match="'k' must be below d = 4"):
        load_task('pca-error', n_train=2, n_val=2, n_test=2, d=4, k=4)
    assert len(load_task('pca-error', n_train=2, n_val=2, n_test=2, d=4, k=3).train) == 2


def test_load_task_arguments_every_task_takes_are_checked():
    # a real dataset recorded an unapplied set_size and failed on a bad seed only in its split
    for name in ('modelnet40', 'qm9'):
        with pytest.raises(ValueError, match="reads its sets from files: 'set_size'"):
            load_task(name, set_size=(5, 30))
        for seed in ('x', 1.5, -1, True):
            with pytest.raises(ValueError, match="'seed' must be an integer >= 0"):
                load_task(name, seed=seed)
    with pytest.raises(ValueError, match="'progress' must be True or False"):
        load_task('max', progress='no', n_train=2, n_val=1, n_test=1)
    # the point clouds' own sampling seed is no task option (load_task's seed is the split's:
    # `--task-arg seed=3` ended in a TypeError); QM9's defaults are those load_task applies
    assert 'seed' not in task_options('modelnet40')[0]
    assert 'seed' not in task_options('scanobjectnn')[0]
    defaults = task_options('qm9')[0]
    assert defaults['source'] == 'qm9pack' and defaults['log'] is False


def test_check_task_refuses_what_load_task_refuses_and_takes_what_it_takes():
    # check_task (run_grid's check of every cell before training) refused a NumPy count that
    # load_task takes, and passed a real task's mistakes that load_task refuses before reading
    # a file: a grid stopped there after training its earlier cells
    from torch_mz.tasks import check_task
    preview = check_task('max', n_train=np.int64(3), n_val=np.int64(2), n_test=2, d=2)
    assert preview.in_channels == 2
    assert len(load_task('max', n_train=np.int64(3), n_val=2, n_test=2, d=2).train) == 3
    for name, kwargs, match in [
            ('qm9', dict(n_train=100), 'QM9 with split sizes but no n_val'),
            ('qm9', dict(n_train=0.8, n_val=0.1), "qm9: 'n_train' must be an integer >= 0"),
            ('scanobjectnn', dict(val_fraction=1.0), "'val_fraction' must lie in"),
            ('modelnet40', dict(n_test=-1), "modelnet40: 'n_test' must be an integer >= 0"),
            ('qm9', dict(transform='x'), "'transform' must be a callable"),
            ('max', dict(n_train=-3), "'n_train' must be an integer >= 0"),
            ('max', dict(n_train=2.0), "'n_train' must be an integer >= 0")]:
        for check in (check_task, load_task):
            with pytest.raises(ValueError, match=match):
                check(name, root='/nonexistent/data', **kwargs)
