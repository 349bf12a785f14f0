import numpy as np
import collections.abc

import pytest
import torch

from torch_mz.datasets import SPLITS, TaskSplits, make_task, split_indices


def test_split_access_repr_and_deprecated_names():
    splits = make_task('sum', n_train=2, n_val=1, n_test=1, d=3, set_size=(2, 4), seed=5)
    assert [len(splits[s]) for s in SPLITS] == [2, 1, 1]
    with pytest.raises(KeyError, match='validation'):
        splits['validation']
    # by name, as indexed ('train' in splits indexed 0 and raised a KeyError)
    assert 'train' in splits and 'validation' not in splits and 0 not in splits
    with pytest.raises(TypeError, match="'TaskSplits' object is not iterable"):
        train, val, test = splits  # (not the names 'train', 'val', 'test', nor a KeyError)
    assert not isinstance(splits, collections.abc.Iterable)
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


# --------------------------------------------------------------------------------------------------
# split_indices (moved from test_common.py with the function)


def test_split_indices_counts_disjoint_and_deterministic():
    train, val, test = split_indices(100, train=70, val=10, seed=3)
    assert (len(train), len(val), len(test)) == (70, 10, 20)
    union = torch.cat([train, val, test])
    assert union.unique().numel() == 100 and union.min() == 0 and union.max() == 99
    again = split_indices(100, train=70, val=10, seed=3)
    assert all(torch.equal(a, b) for a, b in zip((train, val, test), again))
    other = split_indices(100, train=70, val=10, seed=4)
    assert not torch.equal(train, other[0])
    assert all(torch.equal(t, t.sort().values) for t in (train, val, test))


def test_split_indices_paper_protocol_subsample_fractions():
    train, val, test = split_indices(1000, train=0.8, val=0.1, test=0.1, subsample=500, seed=0)
    assert (len(train), len(val), len(test)) == (400, 50, 50)
    assert torch.cat([train, val, test]).unique().numel() == 500


def test_split_indices_rejects_impossible_sizes():
    with pytest.raises(ValueError, match='exceeds'):
        split_indices(100, train=90, val=20)
    with pytest.raises(ValueError, match='subsample'):
        split_indices(100, subsample=200)
    with pytest.raises(ValueError, match='fraction'):
        split_indices(100, train=1.5, val=0)


# --------------------------------------------------------------------------------------------------
# split_indices: fractions are shared out together where rounding each one alone goes wrong


def _rounded_alone(n, sizes):
    # the counts of the release before: every fraction rounded on its own
    return [int(round(s * n)) if isinstance(s, float) else s for s in sizes]


def test_split_indices_fractions_summing_to_one_use_the_whole_pool():
    assert [len(p) for p in split_indices(3, 0.5, 0.5)] == [2, 1, 0]  # was refused
    assert [len(p) for p in split_indices(30, 0.45, 0.45, 0.1)] == [14, 13, 3]  # was refused
    assert [len(p) for p in split_indices(10, 0.25, 0.25, 0.5)] == [3, 2, 5]  # was 2 + 2 + 5
    assert [len(p) for p in split_indices(10, 0.55, 0.35, 0.09)] == [6, 3, 1]  # was refused
    triples = [(0.8, 0.1, 0.1), (0.45, 0.45, 0.1), (0.25, 0.25, 0.5), (0.35, 0.35, 0.3),
               (1 / 3, 1 / 3, 1 / 3), (0.7, 0.15, 0.15), (0.6, 0.2, 0.2), (0.5, 0.5, 0.0)]
    for n in range(0, 41):
        for sizes in triples:
            parts = split_indices(n, *sizes, seed=1)
            assert sum(map(len, parts)) == n, (n, sizes)
            assert torch.cat(parts).unique().numel() == n
            # with the test set as the rest, train and val fractions summing to 1 are not refused
            parts = split_indices(n, sizes[0], 1 - sizes[0])
            assert sum(map(len, parts)) == n and len(parts[2]) <= 1


def test_split_indices_keeps_the_counts_and_indices_of_sizes_that_worked():
    # counts that added up (or, with test=None, did not exceed the pool) stay as they were, so
    # that a split recorded with them is drawn again
    sizes_tried = [(0.8, 0.1, 0.1), (0.7, 0.2, 0.1), (0.6, 0.2, 0.2), (0.5, 0.25, 0.25),
                   (0.25, 0.75, None), (0.5, 0.5, None), (0.3, 0.3, 0.3), (0.1, 0.1, None)]
    for n in range(0, 60):
        for train, val, test in sizes_tried:
            old = _rounded_alone(n, [train, val] + ([] if test is None else [test]))
            if test is None:
                if sum(old) > n:
                    continue
                old.append(n - sum(old))
            elif sum(old) != n and abs(train + val + test - 1) < 1e-9:
                continue  # (the cases fixed)
            elif sum(old) > n:
                continue
            assert [len(p) for p in split_indices(n, train, val, test)] == old, (n, train, val)
    a = split_indices(1000, 0.8, 0.1, 0.1, subsample=500, seed=4)
    b = split_indices(1000, 400, 50, 50, subsample=500, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_split_indices_reads_numpy_and_torch_numbers_by_their_type():
    expected = [len(p) for p in split_indices(100, 0.8, 0.1, 0.1)]
    assert expected == [80, 10, 10]
    for frac in (np.float32(0.8), np.float64(0.8), torch.tensor(0.8), np.array(0.8)):
        # (a NumPy or torch fraction was taken as the count int(0.8) = 0)
        assert [len(p) for p in split_indices(100, frac, 0.1, 0.1)] == expected, repr(frac)
    for count in (np.int64(80), np.int32(80), torch.tensor(80)):
        assert [len(p) for p in split_indices(100, count, 10)] == [80, 10, 10], repr(count)
    for flag in (True, np.bool_(True), torch.tensor(True)):
        with pytest.raises(ValueError, match="'train' must be a count .* not a bool"):
            split_indices(100, flag, 10)
    with pytest.raises(ValueError, match="'val' must be one number"):
        split_indices(100, 10, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="'test' must be a count"):
        split_indices(100, 10, 10, 'all')
    with pytest.raises(ValueError, match="'val' as a fraction must lie in"):
        split_indices(100, 10, float('nan'))


def test_split_indices_is_importable_where_it_was():
    # moved from torch_mz.datasets.common to its room, torch_mz.datasets.splits
    from torch_mz.datasets import common, splits
    assert common.split_indices is splits.split_indices is split_indices


@pytest.mark.parametrize('kind', ['np.float32', 'torch', 'np.float16', 'torch.bfloat16',
                                  'array'])
def test_split_indices_float32_fractions_give_the_counts_of_the_python_floats(kind):
    # float32 fractions summing to 1 were read as 0.800000011920929 + ...: their sum missed 1
    # by about 1e-8, so an item of the pool was left out (n=3: [2, 0, 0]) or the call raised
    # (n=7: 6 + 1 + 1 exceeds the 7 items)
    make = {'np.float32': np.float32, 'torch': torch.tensor, 'np.float16': np.float16,
            'torch.bfloat16': lambda f: torch.tensor(f, dtype=torch.bfloat16),
            'array': lambda f: np.array(f, dtype=np.float32)}[kind]
    for sizes in ((0.8, 0.1, 0.1), (0.6, 0.05, 0.35), (0.7, 0.2, 0.1), (0.7, 0.1, 0.2)):
        for n in range(0, 30):
            expected = split_indices(n, *sizes, seed=2)
            got = split_indices(n, *map(make, sizes), seed=2)
            assert [len(p) for p in got] == [len(p) for p in expected], (n, sizes)
            assert all(torch.equal(a, b) for a, b in zip(got, expected)), (n, sizes)
    assert [len(p) for p in split_indices(3, *map(make, (0.8, 0.1, 0.1)))] == [3, 0, 0]


def test_split_indices_refuses_a_subsample_that_is_no_integer():
    # int() truncated it: subsample=0.5 or 0.99 gave three empty splits, True one item
    for subsample in (0.5, 0.99, 2.7, float('nan'), True, np.bool_(True), torch.tensor(True),
                      torch.tensor(4.5), np.float32(3.5)):
        with pytest.raises(ValueError, match="'subsample' must be an integer"):
            split_indices(100, 0.8, 0.1, 0.1, subsample=subsample)
    # any integral type is taken, and a float of integral value (5e1, as before)
    expected = [p.tolist() for p in split_indices(100, 0.8, 0.1, 0.1, subsample=50)]
    for count in (np.int64(50), np.int32(50), torch.tensor(50), np.array(50), 50.0, 5e1,
                  np.float32(50), torch.tensor(50.0)):
        got = [p.tolist() for p in split_indices(100, 0.8, 0.1, 0.1, subsample=count)]
        assert got == expected, count


def test_split_indices_takes_any_integral_n_and_seed_and_refuses_others():
    # a NumPy seed failed in torch with "TypeError: an integer is required", a float n in
    # torch.randperm, and n=True split one item
    expected = [p.tolist() for p in split_indices(20, 10, 5, seed=3)]
    for n in (np.int64(20), np.int32(20), torch.tensor(20)):
        for seed in (3, np.int64(3), np.uint8(3), torch.tensor(3)):
            assert [p.tolist() for p in split_indices(n, 10, 5, seed=seed)] == expected
    assert [len(p) for p in split_indices(1, 1, 0, seed=2**64 - 1)] == [1, 0, 0]
    for seed in (1.5, 3.0, True, np.bool_(False), '3', -1, 2**64, None):
        with pytest.raises(ValueError, match=f"'seed' must be an integer >= 0 and < {2**64}"):
            split_indices(20, 10, 5, seed=seed)
    for n in (20.0, True, torch.tensor(True), '20', -1):
        with pytest.raises(ValueError, match="'n' must be an integer >= 0"):
            split_indices(n, 10, 5)


def test_split_indices_fractions_summing_to_one_beside_a_count_of_zero_use_the_whole_pool():
    # a test size of 0 given as a count (as torch_mz.datasets.real passes it) left the two
    # fractions' roundings alone: 14 + 2 of 15 items were refused as exceeding the pool, and
    # 2 + 2 of 5 dropped one item, where the fraction 0.0 shares the pool out
    for n in range(0, 41):
        for train in (0.9, 0.5, 0.7, 0.25):
            want = [len(p) for p in split_indices(n, train, 1 - train, 0.0, seed=2)]
            got = split_indices(n, train, 1 - train, 0, seed=2)
            assert [len(p) for p in got] == want and sum(want) == n, (n, train)
    assert [len(p) for p in split_indices(15, 0.9, 0.1, 0)] == [14, 1, 0]
    assert [len(p) for p in split_indices(5, 0.5, 0.5, 0)] == [3, 2, 0]
    assert [len(p) for p in split_indices(10, 0, 0.5, 0.5)] == [0, 5, 5]


def test_split_records_what_its_docstring_says_the_counts_of_a_synthetic_task_drawn():
    # TaskSplits.split was documented as the sizes asked for, None for the task's default: a
    # synthetic task records the counts drawn (n_val left at the default as its 1,000 sets)
    from torch_mz.tasks import load_task
    splits = load_task('max', n_train=3, n_test=2, d=2, set_size=(2, 3))
    assert splits.split == dict(seed=0, n_train=3, n_val=1000, n_test=2)
    assert make_task('max', n_train=1, n_val=1, n_test=1, d=2).split == {}  # not load_task's
    doc = ' '.join(TaskSplits.__doc__.split())
    assert "(:obj:`None` for the task's default)" not in doc
    assert 'for a synthetic task the counts drawn' in doc and 'make_task' in doc
