import pytest

from torch_mz.datasets import SPLITS, TaskSplits, make_task


def test_split_access_repr_and_deprecated_names():
    splits = make_task('sum', n_train=2, n_val=1, n_test=1, d=3, set_size=(2, 4), seed=5)
    assert [len(splits[s]) for s in SPLITS] == [2, 1, 1]
    with pytest.raises(KeyError, match='validation'):
        splits['validation']
    assert repr(splits) == 'TaskSplits(SumTask(d=3, reduce=None), seed=5, train=2, val=1, test=1)'
    real = TaskSplits('qm9', [], [], [], in_channels=9, out_channels=1, task_type='regression',
                      pos_dim=None, description='')
    assert repr(real) == "TaskSplits('qm9', train=0, val=0, test=0)"
    # the former SyntheticSplits names still read, with a warning
    with pytest.warns(DeprecationWarning, match='in_channels'):
        assert splits.d_in == 3
    with pytest.warns(DeprecationWarning, match='out_channels'):
        assert splits.out_dim == 3
    with pytest.warns(DeprecationWarning, match='set_sizes'):
        assert splits.set_sizes == {s: (2, 4) for s in SPLITS}
