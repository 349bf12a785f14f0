import os.path as osp
import pickle
import warnings

import numpy as np
import pytest
import torch

from torch_mz.datasets import common
from torch_mz.datasets.common import (
    CorruptRawFileError,
    SkipCounter,
    default_root,
    normalize_unit_sphere,
    read_h5,
    split_indices,
)


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
