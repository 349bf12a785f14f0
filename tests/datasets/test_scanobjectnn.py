import os
import os.path as osp
import warnings

import numpy as np
import pytest
import torch

from tests.datasets.raw_formats import H5_ELSEWHERE, write_h5, write_h5_leading_elsewhere
from torch_mz.datasets.common import CorruptRawFileError
from torch_mz.datasets.scanobjectnn import (
    SCANOBJECTNN_CLASSES,
    SCANOBJECTNN_VARIANTS,
    ScanObjectNN,
    scanobjectnn_file,
)


def test_classes_in_the_official_order():
    assert len(SCANOBJECTNN_CLASSES) == 15 and len(set(SCANOBJECTNN_CLASSES)) == 15
    assert SCANOBJECTNN_CLASSES[:10] == ('bag', 'bin', 'box', 'cabinet', 'chair', 'desk', 'display',
                                         'door', 'shelf', 'table')
    assert SCANOBJECTNN_CLASSES[10:] == ('bed', 'pillow', 'sink', 'sofa', 'toilet')


@pytest.mark.parametrize('variant, train, expected', [
    ('OBJ_ONLY', True, 'h5_files/main_split_nobg/training_objectdataset.h5'),
    ('OBJ_BG', False, 'h5_files/main_split/test_objectdataset.h5'),
    ('PB_T25', True, 'h5_files/main_split/training_objectdataset_augmented25_norot.h5'),
    ('PB_T25_R', True, 'h5_files/main_split/training_objectdataset_augmented25rot.h5'),
    ('PB_T50_R', False, 'h5_files/main_split/test_objectdataset_augmentedrot.h5'),
    ('PB_T50_RS', True, 'h5_files/main_split/training_objectdataset_augmentedrot_scale75.h5'),
])
def test_variant_files(variant, train, expected):
    assert scanobjectnn_file(variant, train) == expected.replace('/', os.sep)
    assert variant in SCANOBJECTNN_VARIANTS


def point_rows(points: np.ndarray, pos: np.ndarray) -> np.ndarray:
    r"""Index of each row of :obj:`pos` in :obj:`points` (-1 where absent)."""
    match = (pos[:, None, :] == points[None, :, :]).all(-1)
    return np.where(match.any(axis=1), match.argmax(axis=1), -1)


def test_obj_bg_shapes_labels_subsets_and_masks(scanobjectnn_root):
    root, files = scanobjectnn_root['root'], scanobjectnn_root['files']
    train = ScanObjectNN(root, variant='OBJ_BG', num_points=64, normalize=False, log=False)
    test = ScanObjectNN(root, variant='OBJ_BG', train=False, num_points=64, normalize=False,
                        log=False)
    raw_train = files[osp.join('h5_files', 'main_split', 'training_objectdataset.h5')]
    raw_test = files[osp.join('h5_files', 'main_split', 'test_objectdataset.h5')]
    assert len(train) == 5 and len(test) == 3
    assert [int(d.y) for d in train] == raw_train['label'].tolist()
    assert [int(d.y) for d in test] == raw_test['label'].tolist()
    assert train.num_classes == 15
    for j, data in enumerate(train):
        assert data.pos.shape == (64, 3) and 'x' not in data
        rows = point_rows(raw_train['data'][j], data.pos.numpy())
        assert (rows >= 0).all() and len(np.unique(rows)) == 64  # 64 distinct points of this object
        assert torch.equal(data.mask, torch.from_numpy(raw_train['mask'][j, rows] != -1))
    assert 0 < float(torch.cat([d.mask for d in train]).float().mean()) < 1


def test_normalised_and_seeded(scanobjectnn_root):
    root = scanobjectnn_root['root']
    ds = ScanObjectNN(root, num_points=64, log=False)
    for data in ds:
        assert data.pos.norm(dim=1).max().item() == pytest.approx(1.0, abs=1e-5)
        assert torch.allclose(data.pos.mean(dim=0), torch.zeros(3), atol=1e-5)
    again = ScanObjectNN(root, num_points=64, log=False, force_reload=True)
    assert all(torch.equal(a.pos, b.pos) for a, b in zip(ds, again))
    other = ScanObjectNN(root, num_points=64, seed=1, log=False)
    assert not torch.equal(ds[0].pos, other[0].pos)
    full = ScanObjectNN(root, num_points=None, normalize=False, log=False)
    raw = scanobjectnn_root['files'][osp.join('h5_files', 'main_split',
                                              'training_objectdataset.h5')]
    assert np.array_equal(full[1].pos.numpy(), raw['data'][1])


def test_every_seed_shares_the_cache_that_stores_all_points(scanobjectnn_root, monkeypatch):
    # with all points stored (resample, or num_points=None) the seed draws nothing at
    # processing: each seed had built its own, byte-identical cache
    root = scanobjectnn_root['root']
    first = ScanObjectNN(root, num_points=16, resample=True, seed=0, log=False)
    monkeypatch.setattr(ScanObjectNN, 'process', lambda self: pytest.fail('must be reused'))
    for seed in (1, 7):
        again = ScanObjectNN(root, num_points=16, resample=True, seed=seed, log=False)
        assert again.processed_dir == first.processed_dir
    assert ScanObjectNN(root, num_points=None, seed=3, log=False).processed_dir == \
        first.processed_dir
    monkeypatch.undo()
    other = ScanObjectNN(root, num_points=16, seed=1, log=False)  # a subset: its own cache
    assert other.processed_dir != ScanObjectNN(root, num_points=16, seed=0,
                                               log=False).processed_dir


def test_obj_only_reads_the_nobg_split(scanobjectnn_root):
    root, files = scanobjectnn_root['root'], scanobjectnn_root['files']
    ds = ScanObjectNN(root, variant='OBJ_ONLY', num_points=None, normalize=False, log=False)
    raw = files[osp.join('h5_files', 'main_split_nobg', 'training_objectdataset.h5')]
    assert len(ds) == len(raw['label']) == 4
    assert all(np.array_equal(d.pos.numpy(), raw['data'][j]) for j, d in enumerate(ds))


def test_processed_cache_is_reused(scanobjectnn_root, monkeypatch):
    root = scanobjectnn_root['root']
    first = ScanObjectNN(root, num_points=32, log=False)

    def fail(self):
        raise AssertionError('process() must not run when the processed cache exists')

    monkeypatch.setattr(ScanObjectNN, 'process', fail)
    cached = ScanObjectNN(root, num_points=32, log=False)
    assert all(torch.equal(a.pos, b.pos) for a, b in zip(first, cached))
    assert cached.stats['train']['num_objects'] == 5


def test_download_explains_terms_and_location(tmp_path):
    with pytest.raises(FileNotFoundError, match='terms of use') as info:
        ScanObjectNN(str(tmp_path / 'ScanObjectNN'), variant='PB_T50_RS', log=False)
    message = str(info.value)
    assert osp.join(str(tmp_path), 'ScanObjectNN', 'raw') in message
    assert 'training_objectdataset_augmentedrot_scale75.h5' in message


def test_a_pre_filter_that_keeps_nothing_is_named(scanobjectnn_root):
    # both splits are processed together: the message says the filter emptied one
    with pytest.raises(RuntimeError, match=r'no train object left to save \(pre_filter kept none '
                       r'of the \d+ read\); the train and test splits are processed together'):
        ScanObjectNN(scanobjectnn_root['root'], log=False, num_points=16,
                     pre_filter=lambda d: False)


def test_corrupt_files_are_named(scanobjectnn_root):
    root = scanobjectnn_root['root']
    path = osp.join(root, 'raw', 'h5_files', 'main_split', 'test_objectdataset.h5')
    write_h5(path, data=np.zeros((2, 256, 3), dtype=np.float32))
    with pytest.raises(CorruptRawFileError, match="test_objectdataset.h5.*'label'"):
        ScanObjectNN(root, log=False, num_points=16)
    write_h5(path, data=np.zeros((2, 256, 3), dtype=np.float32), label=np.array([0, 15]))
    with pytest.raises(CorruptRawFileError, match=r'labels outside \[0, 15\)'):
        ScanObjectNN(root, log=False, num_points=16)
    # labels stored as floats must be whole numbers (int() would read 2.5 as class 2)
    write_h5(path, data=np.zeros((2, 256, 3), dtype=np.float32), label=np.array([0.0, 2.5]))
    with pytest.raises(CorruptRawFileError, match='test_objectdataset.h5.*not whole numbers'):
        ScanObjectNN(root, log=False, num_points=16)
    write_h5(path, data=np.zeros((0, 256, 3), dtype=np.float32), label=np.zeros(0, np.int64))
    with pytest.raises(CorruptRawFileError, match='test_objectdataset.h5.*holds no objects'):
        ScanObjectNN(root, log=False, num_points=16)
    with open(path, 'wb') as f:
        f.write(b'\x89HDF\r\n\x1a\n' + b'\0' * 40)  # an HDF5 signature and nothing behind it
    with pytest.raises(CorruptRawFileError, match='test_objectdataset.h5'):
        ScanObjectNN(root, log=False, num_points=16)


@pytest.mark.parametrize('kind', H5_ELSEWHERE)
def test_a_file_whose_points_lie_in_another_file_is_refused(scanobjectnn_root, tmp_path, kind):
    # the bug: 'data' as an external link, a soft link through one, a virtual dataset or
    # external storage was followed: a crafted file had the loader read any file on disk
    root, files = scanobjectnn_root['root'], scanobjectnn_root['files']
    rel = osp.join('h5_files', 'main_split', 'test_objectdataset.h5')
    outside = write_h5(str(tmp_path / 'outside' / 'other.h5'), data=files[rel]['data'])
    arrays = {k: v for k, v in files[rel].items() if k != 'data'}
    write_h5_leading_elsewhere(osp.join(root, 'raw', rel), kind, 'data', outside, **arrays)
    with pytest.raises(CorruptRawFileError,
                       match=r"test_objectdataset\.h5': 'data' is an? .*(other\.h5|/elsewhere)"):
        ScanObjectNN(root, log=False, num_points=16)


def test_a_file_stored_with_a_filter_that_is_not_built_in_is_refused(scanobjectnn_root):
    # the bug: reading it made HDF5 search its plugin path and load a library found there
    from tests.datasets.raw_formats import FOREIGN_FILTER, write_h5_foreign_filter
    root, files = scanobjectnn_root['root'], scanobjectnn_root['files']
    rel = osp.join('h5_files', 'main_split', 'test_objectdataset.h5')
    arrays = {k: v for k, v in files[rel].items() if k != 'label'}
    write_h5_foreign_filter(osp.join(root, 'raw', rel), 'label', files[rel]['label'], **arrays)
    with pytest.raises(CorruptRawFileError, match=f"test_objectdataset\\.h5': dataset 'label' "
                       f"is stored with the filter {FOREIGN_FILTER}"):
        ScanObjectNN(root, log=False, num_points=16)


@pytest.mark.parametrize('change, match', [
    # (a (2, 2) array beside 4 objects was read as their labels)
    (dict(label=np.array([[0, 1], [2, 3]])), r"dataset 'label' has shape \(2, 2\): expected "
     r"one class index per example of 'data', \(4,\) or \(4, 1\)"),
    (dict(label=np.array([0, np.nan, 1, 2])), r"dataset 'label' holds labels that are not "
     r"whole numbers \(nan at index 1\)"),
    (dict(label=np.array([0, 1, 2, 15])), r"dataset 'label' holds labels outside \[0, 15\) "
     r"\(15 at index 3\)"),
    (dict(data=np.ones((4, 256, 3), dtype=bool)), "dataset 'data' holds booleans, not "
     "coordinates"),
])
def test_labels_and_points_that_cannot_be_the_objects_are_named(scanobjectnn_root, change,
                                                                  match):
    root = scanobjectnn_root['root']
    arrays = dict(data=np.zeros((4, 256, 3), dtype=np.float32), label=np.arange(4),
                  mask=np.ones((4, 256), dtype=np.int32))
    arrays.update(change)
    write_h5(osp.join(root, 'raw', 'h5_files', 'main_split', 'test_objectdataset.h5'), **arrays)
    with pytest.raises(CorruptRawFileError, match="test_objectdataset\\.h5': " + match):
        ScanObjectNN(root, log=False, num_points=16)


def test_non_finite_objects_are_counted(scanobjectnn_root):
    root, files = scanobjectnn_root['root'], scanobjectnn_root['files']
    rel = osp.join('h5_files', 'main_split', 'training_objectdataset.h5')
    data = files[rel]['data'].copy()
    data[2, :, 0] = np.inf
    write_h5(osp.join(root, 'raw', rel), data=data, label=files[rel]['label'],
             mask=files[rel]['mask'])
    with pytest.warns(UserWarning, match='non_finite_points: 1'):
        ds = ScanObjectNN(root, num_points=16, log=False)
    assert len(ds) == 4
    assert ds.stats['train']['skipped']['examples'] == {
        'non_finite_points': ['training_objectdataset.h5[2]']
    }


def test_invalid_arguments(scanobjectnn_root):
    with pytest.raises(ValueError, match='variant'):
        ScanObjectNN(scanobjectnn_root['root'], variant='PB_T99')
    with pytest.raises(ValueError, match='fewer than num_points'):
        ScanObjectNN(scanobjectnn_root['root'], num_points=1024, log=False)


def test_missing_h5py_names_the_pip_extra(scanobjectnn_root, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, 'h5py', None)  # makes 'import h5py' raise ImportError
    with pytest.raises(ImportError, match=r"torch_mz\[datasets\]"):
        ScanObjectNN(scanobjectnn_root['root'], num_points=16, log=False)


def test_docstring_documents_every_argument():
    import inspect
    params = [p for p in inspect.signature(ScanObjectNN.__init__).parameters if p != 'self']
    assert [p for p in params if f'{p} (' not in ScanObjectNN.__doc__] == []


def test_resample_draws_a_new_subset_on_every_access(scanobjectnn_root):
    root, files = scanobjectnn_root['root'], scanobjectnn_root['files']
    raw = files[osp.join('h5_files', 'main_split', 'training_objectdataset.h5')]
    fixed = ScanObjectNN(root, num_points=64, normalize=False, log=False)
    assert torch.equal(fixed[0].pos, fixed[0].pos)  # one subset per object
    ds = ScanObjectNN(root, num_points=64, normalize=False, resample=True, log=False)
    assert ds.stored_points is None and 'resample=True' in repr(ds)
    torch.manual_seed(0)
    draws = [ds[0] for _ in range(3)]
    for data in draws:  # 64 distinct points of object 0, each with its own mask entry
        rows = point_rows(raw['data'][0], data.pos.numpy())
        assert data.pos.shape == (64, 3) and (rows >= 0).all() and len(np.unique(rows)) == 64
        assert torch.equal(data.mask, torch.from_numpy(raw['mask'][0, rows] != -1))
    assert not torch.equal(draws[0].pos, draws[1].pos)
    torch.manual_seed(0)
    assert torch.equal(ds[0].pos, draws[0].pos)  # reproducible from torch's generator
    # normalised as a whole object (as the authors' files), then drawn: no re-normalisation
    whole = ScanObjectNN(root, num_points=None, log=False)
    normalised = ScanObjectNN(root, num_points=64, resample=True, log=False)
    assert point_rows(whole[0].pos.numpy(), normalised[0].pos.numpy()).min() >= 0


def test_resample_refuses_more_points_than_stored_with_or_without_a_cache(scanobjectnn_root):
    # the fixtures hold 256 points per object: 512 was refused while the raw file was read,
    # and accepted (256 points per draw, the repr saying 512) once another num_points had
    # built the shared cache of all points
    root = scanobjectnn_root['root']
    for num_points in (512, 64, 512):
        if num_points == 64:
            assert ScanObjectNN(root, num_points=64, resample=True, log=False)[0].pos.shape == (
                64, 3)
            continue
        with pytest.raises(ValueError, match='holds 256 points per object, fewer than '
                                             'num_points=512'):
            ScanObjectNN(root, num_points=512, resample=True, log=False)


def test_resample_on_a_split_of_one_object(tmp_path):
    # PyG keeps no offsets for a dataset of one object: the check of the stored points read
    # them, and failed with an AssertionError
    from tests.datasets.raw_formats import random_clouds
    rng = np.random.default_rng(1)
    for split in ('training', 'test'):
        write_h5(str(tmp_path / 'raw' / 'h5_files' / 'main_split' / f'{split}_objectdataset.h5'),
                 data=random_clouds(rng, 1, 256), label=np.array([3]))
    ds = ScanObjectNN(str(tmp_path), num_points=64, resample=True, log=False)
    assert len(ds) == 1 and ds[0].pos.shape == (64, 3)
    with pytest.raises(ValueError, match='holds 256 points per object'):
        ScanObjectNN(str(tmp_path), num_points=512, resample=True, log=False)


def test_resample_survives_a_transform_set_later(scanobjectnn_root):
    # PyG users set ds.transform after construction: the draw must not live in it
    from torch_geometric.transforms import NormalizeScale
    root = scanobjectnn_root['root']
    ds = ScanObjectNN(root, num_points=64, resample=True, log=False)
    assert ds.transform is None
    ds.transform = NormalizeScale()
    torch.manual_seed(0)
    data = ds[0]
    assert data.pos.shape == (64, 3)
    assert float(data.pos.abs().max()) == pytest.approx(1.0, abs=1e-5)  # the user's, after
    ds.transform = None
    whole = ScanObjectNN(root, num_points=None, log=False)
    a, b = ds[0].pos, ds[0].pos  # still drawn on every access, from the object's points
    assert a.shape == (64, 3) and not torch.equal(a, b)
    assert point_rows(whole[0].pos.numpy(), a.numpy()).min() >= 0


@pytest.mark.parametrize('dtype, match', [
    (np.uint8, "'mask' holds uint8: expected signed integers"),
    (bool, "'mask' holds bool: expected signed integers"),
    ('fraction', "'mask' holds float64 values that are not whole numbers"),
])
def test_a_mask_that_cannot_mark_background_points_is_refused(scanobjectnn_root, dtype, match):
    # -1 marks a background point: read as uint8 (255) or bool, every point was the object's
    root, files = scanobjectnn_root['root'], scanobjectnn_root['files']
    rel = osp.join('h5_files', 'main_split', 'training_objectdataset.h5')
    arrays = dict(files[rel])
    arrays['mask'] = (arrays['mask'] + 0.5 if dtype == 'fraction' else
                      (arrays['mask'] == 1) if dtype is bool else arrays['mask'].astype(dtype))
    write_h5(osp.join(root, 'raw', rel), **arrays)
    with pytest.raises(CorruptRawFileError, match=f'training_objectdataset.h5.*{match}'):
        ScanObjectNN(root, num_points=16, log=False)


def test_a_mask_of_whole_floats_is_read_as_integers(scanobjectnn_root):
    root, files = scanobjectnn_root['root'], scanobjectnn_root['files']
    expected = [d.mask for d in ScanObjectNN(root, num_points=16, log=False)]
    rel = osp.join('h5_files', 'main_split', 'training_objectdataset.h5')
    write_h5(osp.join(root, 'raw', rel), **dict(files[rel], mask=files[rel]['mask'] * 1.0))
    with pytest.warns(UserWarning, match='rebuilding'):
        ds = ScanObjectNN(root, num_points=16, log=False)
    assert all(torch.equal(d.mask, m) for d, m in zip(ds, expected))


def test_a_mask_of_zeros_and_ones_without_background_marks_warns(scanobjectnn_root):
    # a file marking background with 0 (no -1 anywhere) read every point as the object's
    root, files = scanobjectnn_root['root'], scanobjectnn_root['files']
    rel = osp.join('h5_files', 'main_split', 'training_objectdataset.h5')
    zero_one = np.where(files[rel]['mask'] == -1, 0, 1).astype(np.int32)
    write_h5(osp.join(root, 'raw', rel), **dict(files[rel], mask=zero_one))
    with pytest.warns(UserWarning, match=r"training_objectdataset.h5': no point of its 'mask' "
                                         r"is -1.*holds only 0 and 1"):
        ds = ScanObjectNN(root, num_points=16, log=False)
    assert all(bool(d.mask.all()) for d in ds)  # (read as documented: -1 alone marks background)
    # the release's own marks (-1 and other values) and a mask of one value do not warn
    for mask in (files[rel]['mask'], np.ones_like(zero_one)):
        write_h5(osp.join(root, 'raw', rel), **dict(files[rel], mask=mask))
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            warnings.filterwarnings('ignore', message='.*rebuilding')
            ScanObjectNN(root, num_points=16, log=False, force_reload=True)


def test_boolean_labels_are_refused(scanobjectnn_root):
    root, files = scanobjectnn_root['root'], scanobjectnn_root['files']
    rel = osp.join('h5_files', 'main_split', 'test_objectdataset.h5')
    write_h5(osp.join(root, 'raw', rel), **dict(files[rel], label=files[rel]['label'] > 5))
    with pytest.raises(CorruptRawFileError, match="test_objectdataset.h5.*'label' holds booleans"):
        ScanObjectNN(root, num_points=16, log=False)


@pytest.mark.parametrize('kwargs, match', [
    (dict(seed=-1), r"'seed' must be an integer >= 0 \(got -1\)"),
    (dict(seed=True), r"'seed' must be an integer >= 0 \(got True\)"),
    (dict(num_points=True), "'num_points' must be a positive integer or None, got True"),
])
def test_invalid_seed_and_num_points_are_refused_up_front(scanobjectnn_root, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ScanObjectNN(scanobjectnn_root['root'], **dict(dict(num_points=16), **kwargs), log=False)
    assert not osp.exists(osp.join(scanobjectnn_root['root'], 'processed'))


def test_numpy_seed_and_num_points_share_the_cache_of_plain_ints(scanobjectnn_root, monkeypatch):
    root = scanobjectnn_root['root']
    plain = ScanObjectNN(root, num_points=16, seed=2, log=False)
    monkeypatch.setattr(ScanObjectNN, 'process', lambda self: pytest.fail('must be reused'))
    ds = ScanObjectNN(root, num_points=np.int64(16), seed=np.int64(2), log=False)
    assert ds.processed_dir == plain.processed_dir and type(ds.seed) is int
    assert all(torch.equal(a.pos, b.pos) for a, b in zip(ds, plain))


def _nan_outside_the_subset(root: str, num_points: int) -> np.ndarray:
    r"""Writes a training file of 15 objects (labels 0 .. 14) whose object 0 has one NaN point
    that its fixed subset of :obj:`num_points` (seed 0) does not hold; returns the data."""
    from tests.datasets.raw_formats import random_clouds
    rng = np.random.default_rng(1)
    data, label = random_clouds(rng, 15, 256), np.arange(15, dtype=np.int64)
    drawn = np.random.default_rng([0, 0]).choice(256, num_points, replace=False)
    data[0, next(i for i in range(256) if i not in set(drawn.tolist())), 0] = np.nan
    write_h5(osp.join(root, 'raw', scanobjectnn_file('OBJ_BG', True)), data=data, label=label)
    write_h5(osp.join(root, 'raw', scanobjectnn_file('OBJ_BG', False)), data=data[1:4],
             label=label[1:4])
    return data


def test_every_cache_leaves_out_an_object_for_a_non_finite_point_outside_the_subset(tmp_path):
    # the fixed-subset cache checked the subset alone and kept object 0, the cache of all points
    # (resample, num_points=None) left it out: the two held other objects at the same index
    root = str(tmp_path)
    _nan_outside_the_subset(root, 128)
    caches = []
    for kwargs in ({'num_points': 128}, {'num_points': 128, 'resample': True},
                   {'num_points': None}, {'num_points': 64, 'seed': 3}):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # (once per cache: two of them share one)
            ds = ScanObjectNN(root, log=False, **kwargs)
        assert ds.stats['train']['skipped']['examples'] == {
            'non_finite_points': ['training_objectdataset.h5[0]']}
        caches.append([int(d.y) for d in ds])
    assert all(labels == list(range(1, 15)) for labels in caches)


def test_a_cache_of_the_previous_processing_version_is_rebuilt(scanobjectnn_root):
    # (a fixed-subset cache built before the check covered every point may hold an object that
    # the cache of all points leaves out)
    import json
    root = scanobjectnn_root['root']
    ds = ScanObjectNN(root, num_points=16, log=False)
    assert ds.stats['processing_version'] == ScanObjectNN.processing_version == 4
    stats_path = osp.join(ds.processed_dir, 'stats.json')
    with open(stats_path) as f:
        stats = json.load(f)
    stats['processing_version'] = 3  # (3 recorded no objects a pre_filter removed)
    with open(stats_path, 'w') as f:
        json.dump(stats, f)
    with pytest.warns(UserWarning, match='processing version 3'):
        again = ScanObjectNN(root, num_points=16, log=False)
    assert again.stats['processing_version'] == 4


@pytest.mark.parametrize('layout', ['three channels first', 'six channels first'])
def test_a_channels_first_data_array_is_refused(tmp_path, layout):
    # (N, 3, P) was read as 3 points per object (num_points=None), or refused as "holds 3
    # points per object, fewer than num_points"
    from tests.datasets.raw_formats import random_clouds
    rng = np.random.default_rng(0)
    channels_last = {}
    for train in (True, False):
        clouds = random_clouds(rng, 4, 256)  # (N, 256, 3)
        if layout == 'six channels first':
            clouds = np.concatenate([clouds, clouds], axis=-1)  # (N, 256, 6)
        channels_last[train] = clouds
        write_h5(osp.join(str(tmp_path), 'raw', scanobjectnn_file('OBJ_BG', train)),
                 data=clouds.transpose(0, 2, 1), label=np.arange(4))
    for num_points in (None, 128):
        with pytest.raises(CorruptRawFileError, match=r"training_objectdataset.h5.*'data' of "
                           r"shape \(4, \d, 256\).*\(N, P, 3\) or \(N, P, C\) with x, y, z first"):
            ScanObjectNN(str(tmp_path), num_points=num_points, log=False)
    # the same points stored channels last: read, extra values per point left out
    for train, clouds in channels_last.items():
        write_h5(osp.join(str(tmp_path), 'raw', scanobjectnn_file('OBJ_BG', train)),
                 data=clouds, label=np.arange(4))
    ds = ScanObjectNN(str(tmp_path), num_points=None, normalize=False, log=False)
    assert ds[0].pos.shape == (256, 3)
    assert np.array_equal(ds[0].pos.numpy(), channels_last[True][0, :, :3])


@pytest.mark.parametrize('idx', [None, [2, 0]])
def test_a_copy_of_a_resampling_dataset_keeps_every_point_and_resampling(scanobjectnn_root,
                                                                         idx):
    # PyG's copy() collated one draw of each object: the copy permuted those 32 points forever
    root, files = scanobjectnn_root['root'], scanobjectnn_root['files']
    raw = files[osp.join('h5_files', 'main_split', 'training_objectdataset.h5')]
    ds = ScanObjectNN(root, num_points=32, normalize=False, resample=True, log=False)
    copied = ds.copy(idx)
    assert copied.resample and len(copied) == (len(ds) if idx is None else 2)
    first = 0 if idx is None else 2  # the object at index 0 of the copy
    assert int(copied.slices['pos'][1] - copied.slices['pos'][0]) == 256  # every point stored
    torch.manual_seed(0)
    draws = [copied[0] for _ in range(50)]
    seen = {tuple(p) for d in draws for p in d.pos.tolist()}
    assert all(d.pos.shape == (32, 3) for d in draws) and len(seen) > 128
    rows = point_rows(raw['data'][first], draws[0].pos.numpy())
    assert (rows >= 0).all()
    assert torch.equal(draws[0].mask, torch.from_numpy(raw['mask'][first, rows] != -1))
    assert ds._draw is not None and ds[0].pos.shape == (32, 3)  # the dataset itself unchanged
    fixed = ScanObjectNN(root, num_points=32, normalize=False, log=False)
    assert torch.equal(fixed.copy()[1].pos, fixed[1].pos)  # a fixed subset copies as it is


@pytest.mark.parametrize('kwargs, name', [
    (dict(train='False'), 'train'),  # (text is true: it loaded the training split)
    (dict(train=None), 'train'),
    (dict(normalize='False'), 'normalize'),  # (normalised)
    (dict(resample='no'), 'resample'),  # (resampled)
    (dict(normalize=2), 'normalize'),
    (dict(force_reload='False'), 'force_reload'),  # (the cache rebuilt on every open)
    (dict(log='False'), 'log'),  # (the progress bars shown)
    (dict(log=None), 'log'),
])
def test_flags_that_are_no_truth_values_are_refused_up_front(scanobjectnn_root, kwargs, name):
    root = scanobjectnn_root['root']
    with pytest.raises(ValueError, match=f"'{name}' must be True or False"):
        ScanObjectNN(root, num_points=16, **{'log': False, **kwargs})
    assert not os.path.exists(os.path.join(root, 'processed'))  # refused before processing
    # truth values of NumPy and 0 / 1 are taken, as bools
    test = ScanObjectNN(root, train=np.bool_(False), normalize=1, resample=0, num_points=16,
                        log=np.bool_(False))
    assert test.split == 'test' and test.normalize is True and test.resample is False
    assert test.log is False


class _Ring:
    r"""A pre_transform that adds edges (each point to the next), as ``KNNGraph`` does."""
    def __call__(self, data):
        n = data.num_nodes
        data.edge_index = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])  # (2, n)
        return data


def test_resample_refuses_a_pre_transform_that_adds_edges(scanobjectnn_root):
    # the draw on access (FixedPoints) takes rows of the node attributes and leaves edges as
    # they are: edge_index of 256 edges joined points 0 .. 255 of a set of 16 drawn points
    root = scanobjectnn_root['root']
    with pytest.raises(ValueError, match=r"resample=True .* got one that adds \['edge_index'\]"
                       r".*build them in transform"):
        ScanObjectNN(root, num_points=16, resample=True, pre_transform=_Ring(), log=False)
    fixed = ScanObjectNN(root, num_points=16, pre_transform=_Ring(), log=False)  # built on them
    assert fixed[0].edge_index.max() == 15


def test_pre_filter_sees_the_points_the_cache_stores_and_records_what_it_removed(
        scanobjectnn_root):
    root = scanobjectnn_root['root']
    seen = {}

    class Sizes:
        def __init__(self, name):
            self.name = name

        def __call__(self, data):
            seen.setdefault(self.name, []).append(data.num_nodes)
            return int(data.y) != int(scanobjectnn_root['files'][osp.join(
                'h5_files', 'main_split', 'training_objectdataset.h5')]['label'][1])

    fixed = ScanObjectNN(root, num_points=16, pre_filter=Sizes('fixed'), log=False)
    whole = ScanObjectNN(root, num_points=16, resample=True, pre_filter=Sizes('all'), log=False)
    assert set(seen['fixed']) == {16} and set(seen['all']) == {256}  # every point of the object
    assert 1 in fixed.stats['train']['removed_by_pre_filter']
    assert whole.stats['train']['removed_by_pre_filter'] == fixed.stats['train'][
        'removed_by_pre_filter']
    with pytest.warns(UserWarning, match='were made with pre_filter='):  # (rebuilt without)
        plain = ScanObjectNN(root, num_points=16, log=False)
    assert 'removed_by_pre_filter' not in plain.stats['train']
