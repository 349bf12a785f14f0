import json
import os
import os.path as osp
import pickle
import shutil
import warnings

import numpy as np
import pytest
import torch

from tests.datasets.raw_formats import write_crafted_pickle
from torch_mz.datasets import common
from torch_mz.datasets.common import (
    CorruptRawFileError,
    ProcessedFileError,
    SkipCounter,
    TrainTestSets,
    default_root,
    load_processed,
    load_stats,
    normalize_unit_sphere,
    read_h5,
    save_stats,
    split_indices,
)
from torch_mz.datasets.scanobjectnn import ScanObjectNN


def test_default_root_in_a_checkout_is_the_repository_datasets_folder(monkeypatch):
    monkeypatch.delenv(common.ENV_DATA_ROOT, raising=False)
    repo = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    assert default_root('ModelNet40') == osp.join(repo, 'datasets', 'ModelNet40')


def test_default_root_environment_variable_wins(monkeypatch, tmp_path):
    monkeypatch.setenv(common.ENV_DATA_ROOT, str(tmp_path))
    assert default_root('QM9') == osp.join(str(tmp_path), 'QM9')


def test_default_root_of_an_installed_package_is_under_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(common.ENV_DATA_ROOT, raising=False)
    site = tmp_path / 'site-packages'
    (site / 'datasets').mkdir(parents=True)  # e.g. another package called 'datasets'
    monkeypatch.setattr(common, '_REPO_DIR', str(site))
    monkeypatch.chdir(tmp_path)
    assert default_root('QM9') == osp.join(str(tmp_path), 'datasets', 'QM9')


def test_normalize_unit_sphere():
    rng = np.random.default_rng(0)
    pos = rng.normal(size=(100, 3)) * 5 + 3
    out = normalize_unit_sphere(pos)
    assert out.dtype == np.float32
    assert np.allclose(out.mean(axis=0), 0, atol=1e-6)
    assert np.linalg.norm(out, axis=1).max() == pytest.approx(1.0, abs=1e-6)
    # same shape up to scale: ratios of distances are kept
    d_in = np.linalg.norm(pos[0] - pos[1]) / np.linalg.norm(pos[2] - pos[3])
    d_out = np.linalg.norm(out[0] - out[1]) / np.linalg.norm(out[2] - out[3])
    assert d_out == pytest.approx(d_in, rel=1e-5)
    assert np.array_equal(normalize_unit_sphere(np.ones((4, 3))), np.zeros((4, 3),
                                                                           dtype=np.float32))
    # finite coordinates whose squared norms overflow float64: the same set as at a sane scale
    # (it was every point at the origin)
    huge = normalize_unit_sphere(pos * 1e200)
    assert np.isfinite(huge).all()
    assert np.allclose(huge, out, atol=1e-6)
    assert np.linalg.norm(huge, axis=1).max() == pytest.approx(1.0, abs=1e-6)
    # ... and whose squares underflow (every point came out 0)
    assert np.allclose(normalize_unit_sphere(pos * 1e-170), out, atol=1e-6)


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


def test_corrupt_raw_file_error_names_the_file_and_pickles():
    err = CorruptRawFileError('/data/x.h5', 'truncated')
    assert '/data/x.h5' in str(err) and 'truncated' in str(err)
    assert isinstance(err, ValueError)
    again = pickle.loads(pickle.dumps(err))
    assert again.path == '/data/x.h5' and str(again) == str(err)


def test_skip_counter_reports_only_when_something_was_skipped():
    counter = SkipCounter(keep=2)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        counter.report('nothing')  # no warning
    for i in range(3):
        counter.add('bad', i)
    counter.add('worse', 'a')
    assert counter.total == 4
    assert counter.as_dict() == {
        'counts': {
            'bad': 3,
            'worse': 1
        },
        'examples': {
            'bad': ['0', '1'],
            'worse': ['a']
        }
    }
    with pytest.warns(UserWarning, match='4 record'):
        counter.report('thing')


def test_read_h5_errors_name_the_file(tmp_path):
    from tests.datasets.raw_formats import write_h5
    path = write_h5(str(tmp_path / 'a.h5'), data=np.zeros((2, 3)))
    assert read_h5(path, ('data', ))['data'].shape == (2, 3)
    assert 'label' not in read_h5(path, ('data', ), optional=('label', ))
    with pytest.raises(CorruptRawFileError, match="a.h5.*'label'"):
        read_h5(path, ('data', 'label'))
    bad = tmp_path / 'b.h5'
    bad.write_bytes(b'this is not an HDF5 file')
    with pytest.raises(CorruptRawFileError, match='b.h5'):
        read_h5(str(bad), ('data', ))
    with pytest.raises(FileNotFoundError):
        read_h5(str(tmp_path / 'missing.h5'), ('data', ))


def test_processed_file_error_names_the_file_and_pickles():
    for unsafe in (False, True):
        err = ProcessedFileError('/data/processed/data.pt', 'is broken', unsafe=unsafe)
        assert "'/data/processed/data.pt' is broken" in str(err) and isinstance(err, ValueError)
        assert ('Delete it' in str(err)) == unsafe
        again = pickle.loads(pickle.dumps(err))
        assert (again.path, again.unsafe, str(again)) == (err.path, unsafe, str(err))


def test_load_processed_reads_weights_only_and_never_runs_code(tmp_path):
    from torch_geometric.data import Data, InMemoryDataset
    data, slices = InMemoryDataset.collate([Data(x=torch.ones(2, 1)), Data(x=torch.zeros(3, 1))])
    good = str(tmp_path / 'good.pt')
    torch.save((data.to_dict(), slices, Data), good)
    out = load_processed(good)
    assert out[2] is Data and torch.equal(out[0]['x'], data.x)
    crafted, marker = str(tmp_path / 'crafted.pt'), str(tmp_path / 'code-ran')
    write_crafted_pickle(crafted, marker)
    with pytest.raises(ProcessedFileError, match='crafted.pt. holds objects other') as info:
        load_processed(crafted)
    assert info.value.unsafe and not osp.exists(marker)
    for name, content in (('empty.pt', b''), ('half.pt', open(good, 'rb').read()[:100])):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ProcessedFileError, match=f'{name}. cannot be read') as info:
            load_processed(str(tmp_path / name))
        assert not info.value.unsafe
    # PyG's registration of Data survives (torch's safe_globals context would drop it)
    assert Data in torch.serialization.get_safe_globals()


def test_processed_file_must_name_a_data_class(tmp_path):
    # the weights-only allow-list is process-wide (PyG registers dict, list, HeteroData, ...):
    # a file naming another class as its data class is refused with its name, not an
    # AttributeError from that class
    from torch_geometric.data import Data, InMemoryDataset
    from torch_mz.datasets.common import ProcessedDataset
    data, slices = InMemoryDataset.collate([Data(x=torch.ones(2, 1)), Data(x=torch.zeros(3, 1))])
    for i, cls in enumerate((dict, list)):
        path = str(tmp_path / f'odd{i}.pt')
        torch.save((data.to_dict(), slices, cls), path)
        dataset = ProcessedDataset.__new__(ProcessedDataset)
        with pytest.raises(ProcessedFileError, match=f'odd{i}.pt. names .* as its data class'):
            dataset.load(path)
    good = str(tmp_path / 'good.pt')
    torch.save((data.to_dict(), slices, Data), good)
    dataset = ProcessedDataset.__new__(ProcessedDataset)
    dataset.load(good)
    assert torch.equal(dataset._data.x, data.x)


def test_integer_valued_labels():
    from torch_mz.datasets.common import integer_valued
    assert integer_valued(np.array([0, 3], dtype=np.uint8))
    assert integer_valued(np.array([0.0, 3.0])) and integer_valued(np.zeros(0))
    assert not integer_valued(np.array([0.0, 3.7]))
    assert not integer_valued(np.array([np.nan])) and not integer_valued(np.array(['a']))


def test_stats_are_written_atomically_with_the_data_sizes_and_read_back(tmp_path):
    data = tmp_path / 'data.pt'
    data.write_bytes(b'x' * 10)
    path = str(tmp_path / 'stats.json')
    save_stats({'num': 1}, path, [str(data)])
    assert load_stats(path) == {'num': 1, 'processed_files': {'data.pt': 10}}
    assert sorted(os.listdir(tmp_path)) == ['data.pt', 'stats.json']
    with open(path, 'w') as f:
        f.write('{"num": ')
    with pytest.raises(ProcessedFileError, match="stats.json' is truncated or not JSON"):
        load_stats(path)
    with open(path, 'wb') as f:
        f.write(b'{"num": "\xff"}')
    with pytest.raises(ProcessedFileError, match='stats.json'):
        load_stats(path)
    with open(path, 'w') as f:
        f.write('[1, 2]')
    with pytest.raises(ProcessedFileError, match='not hold a JSON object'):
        load_stats(path)


def _cache(root):
    folder = osp.join(root, 'processed', 'OBJ_BG_32_seed0_pos-only')
    return {name: osp.join(folder, name) for name in ('train.pt', 'test.pt', 'stats.json',
                                                       'pre_transform.pt', 'pre_filter.pt')}


@pytest.mark.parametrize('damage, match', [
    (lambda c: open(c['test.pt'], 'wb').close(), r"test.pt' has 0 bytes"),
    (lambda c: shutil.copy(c['train.pt'], c['test.pt']), r"test.pt' has \d+ bytes but"),
    (lambda c: open(c['pre_filter.pt'], 'wb').close(), "pre_filter.pt' cannot be read"),
])
def test_train_test_sets_rebuild_a_broken_cache(scanobjectnn_root, damage, match):
    root = scanobjectnn_root['root']
    first = ScanObjectNN(root, train=False, num_points=32, log=False)
    damage(_cache(root))
    with pytest.warns(UserWarning, match=f"Processed file '.*{match}.*rebuilding"):
        again = ScanObjectNN(root, train=False, num_points=32, log=False)
    assert len(again) == len(first) and all(torch.equal(a.pos, b.pos) for a, b in zip(first, again))
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        ScanObjectNN(root, train=False, num_points=32, log=False)


def test_an_interrupted_rebuild_is_redone_not_read_as_a_mixed_cache(scanobjectnn_root,
                                                                   monkeypatch):
    # a rebuild writes train.pt, test.pt, then stats.json and the markers: stopped after
    # train.pt, the next start must not take the new train.pt and the old test.pt for one cache
    root = scanobjectnn_root['root']
    first = ScanObjectNN(root, train=False, num_points=32, log=False)
    cache = _cache(root)
    original = ScanObjectNN.save

    def save_then_stop(data_list, path, **kwargs):
        original(data_list, path, **kwargs)
        if path.endswith('train.pt'):
            raise KeyboardInterrupt  # the session ends here

    monkeypatch.setattr(ScanObjectNN, 'save', staticmethod(save_then_stop))
    with pytest.raises(KeyboardInterrupt):
        ScanObjectNN(root, train=False, num_points=32, log=False, force_reload=True)
    monkeypatch.undo()
    assert osp.exists(cache['train.pt']) and osp.exists(cache['test.pt'])
    assert not osp.exists(cache['stats.json'])  # (written last: the cache is incomplete)
    calls = []
    monkeypatch.setattr(ScanObjectNN, 'process', lambda self: (calls.append(1),
                                                               original_process(self)))
    original_process = TrainTestSets.process
    again = ScanObjectNN(root, train=False, num_points=32, log=False)
    assert calls == [1]  # rebuilt
    assert len(again) == len(first) and all(torch.equal(a.pos, b.pos) for a, b in zip(first, again))
    assert osp.exists(cache['stats.json'])


def test_train_test_sets_refuse_a_crafted_split_file(scanobjectnn_root, tmp_path):
    root = scanobjectnn_root['root']
    ScanObjectNN(root, num_points=32, log=False)
    cache = _cache(root)
    marker = str(tmp_path / 'code-ran')
    write_crafted_pickle(cache['train.pt'], marker)
    stats = json.load(open(cache['stats.json']))  # made to fit, as by one who swaps the file
    stats['processed_files']['train.pt'] = osp.getsize(cache['train.pt'])
    json.dump(stats, open(cache['stats.json'], 'w'))
    with pytest.raises(ProcessedFileError, match="train.pt' holds objects other"):
        ScanObjectNN(root, num_points=32, log=False)
    assert not osp.exists(marker)


class _MyData(__import__('torch_geometric.data', fromlist=['Data']).Data):
    pass


@pytest.mark.parametrize('make', ['subclass', 'numpy'])
def test_a_pre_transform_making_unloadable_files_is_named_not_rebuilt_forever(
        make, scanobjectnn_root):
    # what pre_transform returns is saved, then loaded weights-only: a Data subclass or a numpy
    # attribute is refused. Before, the message said "delete it to rebuild", which wrote the
    # same file again; now it says what to change, and the file is gone
    def pre_transform(data):
        if make == 'subclass':
            return _MyData(**data.to_dict())
        data.meta = np.zeros(2)
        return data

    root = scanobjectnn_root['root']
    with pytest.raises(ProcessedFileError, match='was just written from the raw files') as info:
        ScanObjectNN(root, num_points=16, pre_transform=pre_transform, log=False)
    message = str(info.value)
    assert 'add_safe_globals' in message and 'Delete it' not in message and info.value.unsafe
    assert not osp.exists(info.value.path)
    if make == 'subclass':  # allowed as the message says, the same dataset builds and loads
        with torch.serialization.safe_globals([_MyData]):
            ds = ScanObjectNN(root, num_points=16, pre_transform=pre_transform, log=False)
        assert len(ds) == 5 and type(ds[0]) is _MyData and ds[0].pos.shape == (16, 3)
    # without pre_transform: the default cache, no error
    assert len(ScanObjectNN(root, num_points=16, log=False, force_reload=True)) == 5


def test_a_rebuild_holds_the_cache_lock(scanobjectnn_root, monkeypatch):
    # two processes opening one dataset at once take turns: the one building holds
    # <processed_dir>.lock, which the other waits for before it checks the cache
    import fcntl
    root = scanobjectnn_root['root']
    first = ScanObjectNN(root, train=False, num_points=32, log=False)
    lock = first.processed_dir.rstrip(os.sep) + '.lock'
    held = []
    original = TrainTestSets.process

    def process(self):
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)
        original(self)

    monkeypatch.setattr(ScanObjectNN, 'process', process)
    ScanObjectNN(root, train=False, num_points=32, log=False, force_reload=True)
    assert held == [True]
    assert not osp.exists(osp.join(first.processed_dir, osp.basename(lock)))  # beside, not in
