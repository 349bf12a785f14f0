import glob
import json
import os
import os.path as osp
import random
import shutil
import zlib

import numpy as np
import pytest
import torch
from torch_geometric.transforms import RandomRotate

from tests.datasets.raw_formats import (
    CUBE_QUADS,
    CUBE_VERTICES,
    MODELNET_MESHES,
    offline_download_url,
    write_h5,
    write_h5_leading_elsewhere,
    write_off,
)
from torch_mz.datasets.common import CorruptRawFileError
from torch_mz.datasets.modelnet import (
    HDF5_FOLDER,
    MODELNET40_CLASSES,
    MODELNET40_URL,
    Z_UP_TO_Y_UP,
    ModelNet40,
    read_off,
    sample_surface,
)
from torch_mz.datasets.transforms import RandomJitter

# the fixtures hold a flat mesh, a NaN point and class folders without meshes on purpose; tests
# of the warnings use pytest.warns
pytestmark = [pytest.mark.filterwarnings('ignore:ModelNet40 .* skipped:UserWarning'),
              pytest.mark.filterwarnings('ignore:ModelNet40 .* classes have no:UserWarning')]


def sorted_triangles(faces) -> np.ndarray:
    tri = np.sort(np.asarray(faces), axis=1)
    return tri[np.lexsort(tri.T[::-1])]


def test_classes_are_the_40_sorted_names():
    assert len(MODELNET40_CLASSES) == 40
    assert list(MODELNET40_CLASSES) == sorted(MODELNET40_CLASSES)
    assert MODELNET40_CLASSES[0] == 'airplane' and MODELNET40_CLASSES[8] == 'chair'
    assert MODELNET40_CLASSES[39] == 'xbox'


@pytest.mark.parametrize('rel', sorted(MODELNET_MESHES))
def test_read_off_matches_pyg(modelnet_mesh_root, rel):
    from torch_geometric.io import read_off as pyg_read_off
    path = osp.join(modelnet_mesh_root, 'raw', rel)
    vertices, faces = read_off(path)
    pyg = pyg_read_off(path)
    assert np.allclose(vertices, pyg.pos.numpy(), atol=1e-6)
    assert np.array_equal(sorted_triangles(faces), sorted_triangles(pyg.face.t().numpy()))


def test_read_off_merged_header_quads_and_comments(tmp_path):
    merged = write_off(str(tmp_path / 'a.off'), CUBE_VERTICES, CUBE_QUADS, merged_header=True)
    with open(merged) as f:
        assert f.readline().strip() == 'OFF8 6 0'
    vertices, faces = read_off(merged)
    assert vertices.shape == (8, 3) and faces.shape == (12, 3)  # 6 quads -> 12 triangles
    commented = write_off(str(tmp_path / 'b.off'), CUBE_VERTICES, CUBE_QUADS, comment=True)
    v2, f2 = read_off(commented)
    assert np.array_equal(v2, vertices) and np.array_equal(f2, faces)
    # a pentagon is split as a fan
    penta = write_off(str(tmp_path / 'c.off'), [(0, 0, 0), (1, 0, 0), (1, 1, 0), (0.5, 2, 0),
                                                (0, 1, 0)], [(0, 1, 2, 3, 4)])
    assert read_off(penta)[1].tolist() == [[0, 1, 2], [0, 2, 3], [0, 3, 4]]


@pytest.mark.parametrize('text, reason', [
    ('OFF\n8 6 0\n0 0 0\n1 0 0\n1 1 0\n', 'truncated'),
    ('OFF3 1 0\n0 0 0\n1 0 0\n0 1 0\n3 0 1 7\n', 'outside'),
    ('OFF3 1 0\n0 0 0\n1 0 zero\n0 1 0\n3 0 1 2\n', 'malformed vertex'),
    ('OFF3 1 0\n0 0 0\n1 0 0\n0 1 0\n4 0 1 2\n', 'malformed face'),
    ('OFF3 1 0\n0 0\n1 0 0 5\n0 1 0\n3 0 1 2\n', r"vertex 0 \('0 0'\) holds 2 value"),
    ('OFF3 1 0\n0 0 0\n1 0\n0 1 0 1\n3 0 1 2\n', 'vertex 1'),
    ('PLY\n3 1 0\n', "'OFF' header"),
    ('', "'OFF' header"),
])
def test_read_off_corrupt_file_names_the_file(tmp_path, text, reason):
    path = tmp_path / 'broken_0001.off'
    path.write_text(text)
    with pytest.raises(CorruptRawFileError, match=reason) as info:
        read_off(str(path))
    assert str(path) in str(info.value) and info.value.path == str(path)


def test_read_off_fast_and_per_line_paths_agree(tmp_path):
    # fast paths (x y z on every vertex line, k corners on every face line) against the per-line
    # fallbacks: colours after the coordinates, and a triangle and a quad in one file
    rng = np.random.default_rng(0)
    vertices = rng.normal(size=(6, 3))
    plain = write_off(str(tmp_path / 'plain.off'), vertices, [(0, 1, 2), (2, 3, 4, 5)])
    v_fast, f_slow = read_off(plain)
    lines = open(plain).read().splitlines()
    for i in range(2, 8):
        lines[i] += ' 255 0 0'  # colours
    coloured = tmp_path / 'coloured.off'
    coloured.write_text('\n'.join(lines) + '\n')
    v_slow, f_again = read_off(str(coloured))
    assert np.array_equal(v_fast, v_slow) and np.allclose(v_fast, vertices, atol=1e-6)
    assert np.array_equal(f_slow, f_again)
    assert f_slow.tolist() == [[0, 1, 2], [2, 3, 4], [2, 4, 5]]
    # a face line that is one short next to one that is one long: the counts add up, the faces
    # are not the same on the fast path
    shifted = tmp_path / 'shifted.off'
    shifted.write_text('OFF4 2 0\n0 0 0\n1 0 0\n0 1 0\n0 0 1\n3 0 1\n3 3 1 2 3\n')
    with pytest.raises(CorruptRawFileError, match='malformed face line'):
        read_off(str(shifted))


def test_sample_surface_points_lie_on_the_surface_and_follow_area():
    pytest.importorskip('trimesh')  # (the [datasets] extra)
    vertices, faces = np.array(CUBE_VERTICES, dtype=float), np.array(
        [t for a, b, c, d in CUBE_QUADS for t in ((a, b, c), (a, c, d))])
    points = sample_surface(vertices, faces, 500, np.random.SeedSequence(0))
    assert points.shape == (500, 3)
    distance_to_faces = np.minimum(np.abs(points), np.abs(points - 1)).min(axis=1)
    assert distance_to_faces.max() < 1e-9 and points.min() >= -1e-9 and points.max() <= 1 + 1e-9
    # two disjoint triangles of areas 1 and 3: about a quarter of the points on the first
    vertices = np.array([(0, 0, 0), (2, 0, 0), (0, 1, 0), (0, 0, 5), (6, 0, 5), (0, 1, 5)],
                        dtype=float)
    points = sample_surface(vertices, np.array([(0, 1, 2), (3, 4, 5)]), 4000,
                            np.random.SeedSequence(1))
    share = (points[:, 2] < 1).mean()
    assert share == pytest.approx(0.25, abs=0.03)
    same = sample_surface(vertices, np.array([(0, 1, 2), (3, 4, 5)]), 4000,
                          np.random.SeedSequence(1))
    assert np.array_equal(points, same)
    assert sample_surface(vertices[:3] * [1, 0, 0], np.array([(0, 1, 2)]), 10) is None  # no area
    assert sample_surface(vertices, np.zeros((0, 3), dtype=np.int64), 10) is None


def test_mesh_dataset_shapes_labels_normalisation_and_skips(modelnet_mesh_root):
    with pytest.warns(UserWarning, match='mesh_without_area: 1'):
        train = ModelNet40(modelnet_mesh_root, train=True, num_points=64, log=False)
    test = ModelNet40(modelnet_mesh_root, train=False, num_points=64, log=False)
    assert len(train) == 3 and len(test) == 2
    label = MODELNET40_CLASSES.index
    assert [int(d.y) for d in train] == [label('airplane'), label('airplane'), label('chair')]
    assert [int(d.y) for d in test] == [label('chair'), label('xbox')]
    for data in list(train) + list(test):
        assert data.pos.shape == (64, 3) and data.pos.dtype == torch.float32
        assert 'x' not in data  # the coordinates live in pos only
        assert data.y.shape == (1, )
        assert data.pos.norm(dim=1).max().item() == pytest.approx(1.0, abs=1e-5)
        assert torch.allclose(data.pos.mean(dim=0), torch.zeros(3), atol=1e-5)
    assert train.stats['train']['skipped']['counts'] == {'mesh_without_area': 1}
    assert train.stats['train']['skipped']['examples'] == {
        'mesh_without_area': ['bed/train/bed_0001.off']
    }
    assert train.stats['test'] == {'num_shapes': 2, 'skipped': {'counts': {}, 'examples': {}},
                                   'classes_without_meshes': [
                                       n for n in MODELNET40_CLASSES if n not in ('chair', 'xbox')]}
    assert train.num_classes == 40  # the fixed class list, not the largest label present + 1
    assert 'split=train' in repr(train) and 'num_points=64' in repr(train)


def test_classes_without_meshes_of_a_split_are_warned_about_and_recorded(modelnet_mesh_root):
    # a class whose train/ or test/ folder holds no mesh (a copy stopped part way) was left out
    # of that split without a word (the fixture leaves most of its class folders empty)
    os.unlink(osp.join(modelnet_mesh_root, 'raw', 'xbox', 'test', 'xbox_0001.off'))
    with pytest.warns(UserWarning, match=r"39 of the 40 classes have no test meshes \('.*"
                      r"test.*'\): airplane, bathtub, bed, bench, bookshelf and 34 more\. "
                      r"The test split holds no shape of them") as caught:
        test = ModelNet40(modelnet_mesh_root, train=False, num_points=16, log=False)
    train_warnings = [str(w.message) for w in caught if 'no train meshes' in str(w.message)]
    assert len(train_warnings) == 1  # once per split
    assert ('37 of the 40 classes have no train meshes' in train_warnings[0]
            and ': bathtub, bench, bookshelf, bottle, bowl and 32 more.' in train_warnings[0])
    assert {w.filename for w in caught if 'classes have no' in str(w.message)} == {__file__}
    with_meshes = {'train': ('airplane', 'bed', 'chair'), 'test': ('chair', )}
    with open(test.processed_paths[2]) as f:
        stats = json.load(f)
    for split, present in with_meshes.items():
        assert stats[split]['classes_without_meshes'] == [
            n for n in MODELNET40_CLASSES if n not in present]
    assert test.stats['test']['classes_without_meshes'][-1] == 'xbox'


def test_a_cache_built_before_classes_without_meshes_were_recorded_names_them(
        modelnet_mesh_root, monkeypatch):
    # the bug: a cache built before processing looked for classes without meshes (its stats
    # file records no 'classes_without_meshes', and the check bumped no processing version,
    # so it is reused) served splits without those classes, and no word, until processed again
    import warnings
    with pytest.warns(UserWarning, match='classes have no'):
        first = ModelNet40(modelnet_mesh_root, num_points=16, log=False)
    with open(first.processed_paths[2]) as f:
        stats = json.load(f)
    for split in ('train', 'test'):
        del stats[split]['classes_without_meshes']  # (as a cache of the earlier release)
    with open(first.processed_paths[2], 'w') as f:
        json.dump(stats, f)
    # an empty split folder removed: processing would refuse it (the fingerprint, of the
    # meshes, is the same, so the cache is reused)
    os.rmdir(osp.join(modelnet_mesh_root, 'raw', 'bathtub', 'test'))

    def fail(self):
        raise AssertionError('an old cache is reused, not rebuilt')

    monkeypatch.setattr(ModelNet40, 'process', fail)
    with pytest.warns(UserWarning, match=r"38 of the 40 classes have no test meshes .*"
                      r"airplane, bathtub, bed, bench, bookshelf and 33 more\. The test split "
                      r"holds no shape of them .*built before .*force_reload=True") as caught:
        test = ModelNet40(modelnet_mesh_root, train=False, num_points=16, log=False)
    assert not [w for w in caught if 'no train meshes' in str(w.message)]  # (the split read)
    assert {w.filename for w in caught if 'classes have no' in str(w.message)} == {__file__}
    assert test.stats['test']['classes_without_meshes'] == [
        n for n in MODELNET40_CLASSES if n not in ('chair', 'xbox')]
    monkeypatch.undo()
    os.makedirs(osp.join(modelnet_mesh_root, 'raw', 'bathtub', 'test'))
    with pytest.warns(UserWarning, match='classes have no test meshes'):
        ModelNet40(modelnet_mesh_root, train=False, num_points=16, log=False, force_reload=True)
    with warnings.catch_warnings():  # a cache that records them says nothing on reopening
        warnings.simplefilter('error')
        reopened = ModelNet40(modelnet_mesh_root, train=False, num_points=16, log=False)
    assert reopened.stats['test']['classes_without_meshes'] == [
        n for n in MODELNET40_CLASSES if n not in ('chair', 'xbox')]


def test_mesh_points_lie_on_the_normalised_mesh(modelnet_mesh_root):
    data = ModelNet40(modelnet_mesh_root, train=True, num_points=64, log=False)[0]  # the unit cube
    pos = data.pos.double().numpy()
    # undo the normalisation: the cube's sampled points fill a box whose faces are 1 apart
    extent = pos.max(axis=0) - pos.min(axis=0)
    assert np.allclose(extent, extent[0], rtol=0.05)
    cube = (pos - pos.min(axis=0)) / extent
    assert np.minimum(np.abs(cube), np.abs(cube - 1)).min(axis=1).max() < 1e-5


def test_mesh_sampling_is_seeded_and_cached(modelnet_mesh_root, monkeypatch):
    first = ModelNet40(modelnet_mesh_root, num_points=64, log=False)
    again = ModelNet40(modelnet_mesh_root, num_points=64, log=False, force_reload=True)
    assert all(torch.equal(a.pos, b.pos) for a, b in zip(first, again))
    other_seed = ModelNet40(modelnet_mesh_root, num_points=64, seed=1, log=False)
    assert not torch.equal(first[0].pos, other_seed[0].pos)

    def fail(self):
        raise AssertionError('process() must not run when the processed cache exists')

    monkeypatch.setattr(ModelNet40, 'process', fail)
    cached = ModelNet40(modelnet_mesh_root, num_points=64, log=False)
    assert all(torch.equal(a.pos, b.pos) for a, b in zip(first, cached))
    with pytest.raises(AssertionError, match='must not run'):
        ModelNet40(modelnet_mesh_root, num_points=32, log=False)  # another cache


def test_a_mesh_cache_records_the_trimesh_version_and_names_another_one(modelnet_mesh_root,
                                                                        modelnet_h5_root,
                                                                        monkeypatch):
    # the points are trimesh's samples of the meshes: the cache recorded no version, so one
    # sampled by another trimesh was read without a word
    import warnings
    import trimesh
    first = ModelNet40(modelnet_mesh_root, num_points=16, log=False)
    stats_json = first.processed_paths[2]
    stats = json.load(open(stats_json))
    assert stats['parser_versions'] == {'trimesh': trimesh.__version__}
    stats['parser_versions'] = {'trimesh': '3.9.0'}
    json.dump(stats, open(stats_json, 'w'))
    monkeypatch.setattr(ModelNet40, 'process', lambda self: pytest.fail('the cache must be used'))
    with pytest.warns(UserWarning, match=r"made with trimesh 3\.9\.0 \(installed: "):
        again = ModelNet40(modelnet_mesh_root, num_points=16, log=False)
    assert all(torch.equal(a.pos, b.pos) for a, b in zip(first, again))
    del stats['parser_versions']  # a cache built before the versions were recorded
    json.dump(stats, open(stats_json, 'w'))
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        ModelNet40(modelnet_mesh_root, num_points=16, log=False)
    monkeypatch.undo()  # the HDF5 release's points are read as they are: no version
    h5 = ModelNet40(modelnet_h5_root['root'], source='hdf5', num_points=100, log=False)
    assert 'parser_versions' not in h5.stats


def test_the_trimesh_version_warning_names_the_line_that_opened_the_dataset(
        modelnet_mesh_root):
    # it named a line of PyG's Dataset constructor (stacklevel=3 from inside the cache checks),
    # not the caller's
    first = ModelNet40(modelnet_mesh_root, num_points=16, log=False)
    stats_json = first.processed_paths[2]
    stats = json.load(open(stats_json))
    stats['parser_versions'] = {'trimesh': '3.9.0'}
    json.dump(stats, open(stats_json, 'w'))
    with pytest.warns(UserWarning, match='made with trimesh 3.9.0') as caught:
        ModelNet40(modelnet_mesh_root, num_points=16, log=False)
    assert [w.filename for w in caught if 'trimesh 3.9.0' in str(w.message)] == [__file__]


def test_mesh_labels_agree_with_pyg_modelnet(modelnet_mesh_root, tmp_path):
    from torch_geometric.datasets import ModelNet
    pyg_root = str(tmp_path / 'pyg')
    shutil.copytree(osp.join(modelnet_mesh_root, 'raw'), osp.join(pyg_root, 'raw'))
    for train in (True, False):
        pyg = ModelNet(pyg_root, name='40', train=train)
        ours = ModelNet40(modelnet_mesh_root, train=train, num_points=16, log=False)
        skipped = [MODELNET40_CLASSES.index('bed')] if train else []  # PyG keeps the flat mesh
        assert sorted(int(d.y) for d in pyg) == sorted([int(d.y) for d in ours] + skipped)
        # the vertices PyG stores are the ones our reader passes to the sampler
        for data in pyg:
            ours_vertices = [
                read_off(p)[0] for p in glob.glob(
                    osp.join(modelnet_mesh_root, 'raw', MODELNET40_CLASSES[int(data.y)], ours.split,
                             '*.off'))
            ]
            assert any(
                v.shape == tuple(data.pos.shape) and np.allclose(v, data.pos.numpy(), atol=1e-6)
                for v in ours_vertices)


def test_training_transform_rotates_about_y_and_jitters(modelnet_mesh_root):
    torch.manual_seed(0)
    random.seed(0)
    transform = RandomRotate(180, axis=1)
    ds = ModelNet40(modelnet_mesh_root, num_points=64, log=False,
                    transform=lambda d: RandomJitter()(transform(d)))
    raw = ModelNet40(modelnet_mesh_root, num_points=64, log=False)
    data, base = ds[0], raw[0]
    assert 'x' not in data
    assert not torch.allclose(data.pos, base.pos)
    assert torch.allclose(data.pos[:, 1], base.pos[:, 1], atol=0.05 + 1e-6)  # y only jittered


def test_corrupt_mesh_stops_processing_with_its_name(modelnet_mesh_root):
    path = osp.join(modelnet_mesh_root, 'raw', 'chair', 'test', 'chair_0002.off')
    with open(path) as f:
        text = f.read()
    with open(path, 'w') as f:
        f.write(text[:len(text) // 2])
    with pytest.raises(CorruptRawFileError, match='chair_0002.off'):
        ModelNet40(modelnet_mesh_root, num_points=16, log=False)


def test_missing_class_folders_are_named_and_nothing_is_downloaded(modelnet_mesh_root,
                                                                   monkeypatch):
    from torch_mz.datasets import modelnet
    shutil.rmtree(osp.join(modelnet_mesh_root, 'raw', 'vase'))
    shutil.rmtree(osp.join(modelnet_mesh_root, 'raw', 'bed'))
    placed = osp.join(modelnet_mesh_root, 'raw', 'chair', 'train', 'chair_0001.off')
    with open(placed) as f:
        text = f.read()
    calls = []
    monkeypatch.setattr(modelnet, 'download_url', lambda *args, **kwargs: calls.append(args))
    with pytest.raises(FileNotFoundError, match=r"2 of the 40 class folders are missing .*: "
                       r"bed, vase\. Nothing is downloaded"):
        ModelNet40(modelnet_mesh_root, num_points=16, log=False)
    assert calls == []
    with open(placed) as f:
        assert f.read() == text


def test_failed_download_names_what_is_missing_and_where(tmp_path, monkeypatch):
    pytest.importorskip('trimesh')  # (asked for before any download: the [datasets] extra)
    from torch_mz.datasets import modelnet
    monkeypatch.setattr(modelnet, 'download_url', offline_download_url)
    root = str(tmp_path / 'ModelNet40')
    with pytest.raises(FileNotFoundError) as info:
        ModelNet40(root, num_points=16, log=False)
    message = str(info.value)
    assert osp.join(root, 'raw') in message and MODELNET40_URL in message
    assert 'no network' in message and '<class>_NNNN.off' in message and '\n' not in message


def test_download_keeps_files_already_in_raw(modelnet_mesh_root, tmp_path, monkeypatch):
    import zipfile

    from torch_mz.datasets import modelnet
    archive = str(tmp_path / 'ModelNet40.zip')
    raw = osp.join(modelnet_mesh_root, 'raw')
    with zipfile.ZipFile(archive, 'w') as z:
        z.writestr('ModelNet40/README.txt', 'from the archive')
        for folder, _, names in os.walk(raw):
            rel = osp.relpath(folder, raw)
            z.write(folder, osp.join('ModelNet40', rel))
            for name in names:
                z.write(osp.join(folder, name), osp.join('ModelNet40', rel, name))
    monkeypatch.setattr(modelnet, 'download_url',
                        lambda url, folder, log=True: shutil.copy(archive, folder))
    root = str(tmp_path / 'fresh')
    os.makedirs(osp.join(root, 'raw', HDF5_FOLDER))
    with open(osp.join(root, 'raw', 'README.txt'), 'w') as f:
        f.write('mine')
    assert len(ModelNet40(root, num_points=16, log=False)) == 3
    with open(osp.join(root, 'raw', 'README.txt')) as f:
        assert f.read() == 'mine'
    assert osp.isdir(osp.join(root, 'raw', HDF5_FOLDER))
    assert osp.isfile(osp.join(root, 'raw', 'chair', 'test', 'chair_0002.off'))
    assert sorted(os.listdir(root)) == ['processed', 'raw']  # no archive, no extraction folder


def test_hdf5_source(modelnet_h5_root):
    root, files = modelnet_h5_root['root'], modelnet_h5_root['files']
    with pytest.warns(UserWarning, match='non_finite_points: 1'):
        train = ModelNet40(root, source='hdf5', num_points=100, log=False)
    test = ModelNet40(root, train=False, source='hdf5', num_points=100, log=False)
    assert len(train) == 5 and len(test) == 3  # 4 + 2 shapes, one with a NaN point left out
    assert [int(d.y) for d in train] == [0, 8, 39, 8, 5]
    assert [int(d.y) for d in test] == [1, 2, 3]
    assert train.stats['train']['skipped']['examples'] == {
        'non_finite_points': ['ply_data_train1.h5[1]']
    }
    # the first num_points points of each shape, centered and scaled to the unit sphere
    expected = files['ply_data_train0.h5'][0][2, :100].astype(np.float64)
    expected = expected - expected.mean(axis=0)
    expected /= np.linalg.norm(expected, axis=1).max()
    assert np.allclose(train[2].pos.numpy(), expected, atol=1e-6)
    assert 'x' not in train[2]
    unnormalised = ModelNet40(root, source='hdf5', num_points=None, normalize=False, log=False)
    assert unnormalised[0].pos.shape == (128, 3)
    assert np.array_equal(unnormalised[0].pos.numpy(), files['ply_data_train0.h5'][0][0])


def test_hdf5_source_errors(modelnet_h5_root, tmp_path):
    root, folder = modelnet_h5_root['root'], modelnet_h5_root['folder']
    with pytest.raises(ValueError, match='fewer than num_points'):
        ModelNet40(root, source='hdf5', num_points=1024, log=False)
    with open(osp.join(folder, 'ply_data_test0.h5'), 'r+b') as f:
        f.truncate(200)
    with pytest.raises(CorruptRawFileError, match='ply_data_test0.h5'):
        ModelNet40(root, source='hdf5', num_points=16, log=False)
    write_h5(osp.join(folder, 'ply_data_test0.h5'), data=np.zeros((2, 32, 3), dtype=np.float32))
    with pytest.raises(CorruptRawFileError, match="ply_data_test0.h5.*'label'"):
        ModelNet40(root, source='hdf5', num_points=16, log=False)
    # float labels must be whole numbers (int() would read 3.7 as class 3)
    write_h5(osp.join(folder, 'ply_data_test0.h5'), data=np.zeros((2, 32, 3), dtype=np.float32),
             label=np.array([[1.0], [3.7]]))
    with pytest.raises(CorruptRawFileError, match='ply_data_test0.h5.*not whole numbers'):
        ModelNet40(root, source='hdf5', num_points=16, log=False)
    # a file with no shapes (written part way) is not read as a split with fewer shapes
    write_h5(osp.join(folder, 'ply_data_test0.h5'), data=np.zeros((0, 32, 3), dtype=np.float32),
             label=np.zeros((0, 1), dtype=np.int64))
    with pytest.raises(CorruptRawFileError, match='ply_data_test0.h5.*holds no shapes'):
        ModelNet40(root, source='hdf5', num_points=16, log=False)
    with pytest.raises(FileNotFoundError, match=HDF5_FOLDER):
        ModelNet40(str(tmp_path / 'empty'), source='hdf5', log=False)


def test_hdf5_labels_stored_in_another_file_are_refused(modelnet_h5_root, tmp_path):
    # the bug: a dataset with external storage read its values from whatever file it named
    root, folder, files = (modelnet_h5_root['root'], modelnet_h5_root['folder'],
                           modelnet_h5_root['files'])
    data, label = files['ply_data_test0.h5']
    outside = write_h5(str(tmp_path / 'outside' / 'other.h5'), label=label)
    write_h5_leading_elsewhere(osp.join(folder, 'ply_data_test0.h5'), 'external_storage',
                               'label', outside, data=data)
    with pytest.raises(CorruptRawFileError, match=r"ply_data_test0\.h5': 'label' is a dataset "
                       r"whose data is stored in the external file\(s\) \['.*other\.h5\.bin'\]"):
        ModelNet40(root, source='hdf5', num_points=16, log=False)


def test_hdf5_release_files_are_checked_against_its_lists(modelnet_h5_root):
    root, folder = modelnet_h5_root['root'], modelnet_h5_root['folder']
    # a list written on Windows names the same files
    with open(osp.join(folder, 'test_files.txt'), 'w') as f:
        f.write('data\\modelnet40_ply_hdf5_2048\\ply_data_test0.h5\r\n')
    assert len(ModelNet40(root, train=False, source='hdf5', num_points=100, log=False)) == 3
    os.unlink(osp.join(folder, 'ply_data_train1.h5'))  # e.g. a copy stopped part way
    with pytest.raises(FileNotFoundError, match=r"lacks \['ply_data_train1.h5'\], which the "
                       r"release's train_files.txt lists"):
        ModelNet40(root, source='hdf5', num_points=100, log=False,
                   force_reload=True)  # not 4 shapes of 6
    # without the lists every file found is read, with a warning that says so
    os.unlink(osp.join(folder, 'train_files.txt'))
    with pytest.warns(UserWarning, match=r"no '.*train_files.txt'.*cannot be checked.*1 file"):
        train = ModelNet40(root, source='hdf5', num_points=100, log=False, force_reload=True)
    assert [int(d.y) for d in train] == [0, 8, 39, 8]


def test_hdf5_cache_of_another_processing_version_is_rebuilt(modelnet_h5_root):
    root = modelnet_h5_root['root']
    train = ModelNet40(root, source='hdf5', num_points=100, log=False)
    assert train.stats['processing_version'] == ModelNet40.hdf5_processing_version
    stats_json = train.processed_paths[2]
    stats = json.load(open(stats_json))
    del stats['processing_version']  # a cache built before versions were recorded
    json.dump(stats, open(stats_json, 'w'))
    with pytest.warns(UserWarning, match='recorded no processing version.*rebuilding'):
        again = ModelNet40(root, source='hdf5', num_points=100, log=False)
    assert [int(d.y) for d in again] == [int(d.y) for d in train]
    assert again.stats['processing_version'] == ModelNet40.hdf5_processing_version


def test_hdf5_every_cache_leaves_out_a_shape_for_a_non_finite_point_outside_those_kept(
        modelnet_h5_root):
    # the kept num_points alone were checked: num_points=4 kept the shape whose point 7 is NaN,
    # the cache of all points left it out (the two held other shapes at index 4 on)
    root = modelnet_h5_root['root']
    caches = []
    for num_points in (4, 100, None):
        with pytest.warns(UserWarning, match='non_finite_points: 1'):
            ds = ModelNet40(root, source='hdf5', num_points=num_points, log=False)
        assert ds.stats['train']['skipped']['examples'] == {
            'non_finite_points': ['ply_data_train1.h5[1]']}
        caches.append([int(d.y) for d in ds])
    assert caches == [[0, 8, 39, 8, 5]] * 3
    # a cache of processing version 2 (it checked the kept points alone) is rebuilt; the mesh
    # source keeps version 2 (a bump would re-sample every mesh)
    assert (ModelNet40.processing_version, ModelNet40.hdf5_processing_version) == (2, 3)
    stats_json = ds.processed_paths[2]
    stats = json.load(open(stats_json))
    stats['processing_version'] = 2
    json.dump(stats, open(stats_json, 'w'))
    with pytest.warns(UserWarning, match='processing version 2.*rebuilding'):
        again = ModelNet40(root, source='hdf5', num_points=None, log=False)
    assert again.stats['processing_version'] == 3


def test_hdf5_datasets_that_are_not_numbers_are_named(modelnet_h5_root):
    root, folder = modelnet_h5_root['root'], modelnet_h5_root['folder']
    path = osp.join(folder, 'ply_data_test0.h5')
    write_h5(path, data=np.zeros((2, 32, 3), dtype=np.float32), label=np.array([b'1', b'2']))
    with pytest.raises(CorruptRawFileError, match=r"ply_data_test0.h5.*'label' holds \|S1, not "
                       r"numbers"):
        ModelNet40(root, train=False, source='hdf5', num_points=16, log=False)


def test_invalid_arguments(tmp_path):
    with pytest.raises(ValueError, match='source'):
        ModelNet40(str(tmp_path), source='ply')
    with pytest.raises(ValueError, match='num_points'):
        ModelNet40(str(tmp_path), source='mesh', num_points=None)
    # (the text 'False' is true: it loaded the training split, or normalised)
    with pytest.raises(ValueError, match="'train' must be True or False"):
        ModelNet40(str(tmp_path), train='False')
    with pytest.raises(ValueError, match="'normalize' must be True or False"):
        ModelNet40(str(tmp_path), normalize='False')
    with pytest.raises(ValueError, match="'log' must be True or False"):
        ModelNet40(str(tmp_path), log='False')  # (the progress bars shown)
    with pytest.raises(ValueError, match="'force_reload' must be True or False"):
        ModelNet40(str(tmp_path), force_reload='False')
    assert not os.listdir(tmp_path)  # validated before touching the disk


def test_default_root_is_the_repository_datasets_folder(monkeypatch):
    monkeypatch.delenv('TORCH_MZ_DATA', raising=False)
    captured = {}

    def init(self, root, *args, **kwargs):
        captured['root'] = root
        raise RuntimeError('stop')

    monkeypatch.setattr('torch_geometric.data.InMemoryDataset.__init__', init)
    with pytest.raises(RuntimeError, match='stop'):
        ModelNet40()
    repo = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    assert captured['root'] == osp.join(repo, 'datasets', 'ModelNet40')


def test_download_extracts_the_archive_into_raw(modelnet_mesh_root, tmp_path, monkeypatch):
    import zipfile

    from torch_mz.datasets import modelnet
    archive = str(tmp_path / 'ModelNet40.zip')  # the layout of the real archive
    with zipfile.ZipFile(archive, 'w') as z:
        raw = osp.join(modelnet_mesh_root, 'raw')
        for folder, dirs, names in os.walk(raw):
            rel = osp.relpath(folder, raw)
            z.write(folder, osp.join('ModelNet40', rel))
            for name in names:
                z.write(osp.join(folder, name), osp.join('ModelNet40', rel, name))
        z.writestr('__MACOSX/ModelNet40/._airplane', b'')
    urls = []

    def fake_download_url(url, folder, log=True):
        urls.append(url)
        return shutil.copy(archive, osp.join(folder, 'ModelNet40.zip'))

    monkeypatch.setattr(modelnet, 'download_url', fake_download_url)
    root = str(tmp_path / 'fresh')
    ds = ModelNet40(root, num_points=16, log=False)
    assert urls == ['http://modelnet.cs.princeton.edu/ModelNet40.zip']
    assert len(ds) == 3 and sorted(os.listdir(root)) == ['processed', 'raw']
    assert osp.isfile(osp.join(root, 'raw', 'chair', 'test', 'chair_0002.off'))

    # a download stopped half way leaves nothing that looks like the archive: the next start
    # downloads again
    def stopped_download(url, folder, log=True):
        with open(osp.join(folder, 'ModelNet40.zip'), 'wb') as f:
            f.write(open(archive, 'rb').read()[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(modelnet, 'download_url', stopped_download)
    again = str(tmp_path / 'again')
    with pytest.raises(KeyboardInterrupt):
        ModelNet40(again, num_points=16, log=False)
    # no archive, no staging folder (it went with the interruption), an empty raw/
    assert sorted(os.listdir(again)) == ['processed', 'raw']
    assert os.listdir(osp.join(again, 'raw')) == []
    monkeypatch.setattr(modelnet, 'download_url', fake_download_url)
    assert len(ModelNet40(again, num_points=16, log=False)) == 3

    # an extraction stopped after some class folders: the archive is still at root, and the
    # next start extracts the missing folders from it (keeping those there) and removes it
    monkeypatch.setattr(modelnet, 'download_url',
                        lambda *args, **kwargs: pytest.fail('nothing may be downloaded'))
    resumed = tmp_path / 'resumed'
    os.makedirs(resumed / 'raw')
    shutil.copy(archive, resumed / 'ModelNet40.zip')
    shutil.copytree(osp.join(root, 'raw', 'airplane'), resumed / 'raw' / 'airplane')
    ds = ModelNet40(str(resumed), num_points=16, log=False)
    assert len(ds) == 3 and not (resumed / 'ModelNet40.zip').exists()
    # (an archive placed by hand goes too: the docstring said only that it is used)
    assert 'is deleted once extracted' in ' '.join(ModelNet40.__doc__.split())
    assert sorted(os.listdir(resumed / 'raw')) == sorted(os.listdir(osp.join(root, 'raw')))

    # a move into raw/ stopped part-way (a copy, where raw/ is on another file system) leaves
    # no class folder under its own name: the next start moves that class again
    real_move = shutil.move

    def stopped_move(src, dst):
        if osp.basename(src) == 'chair':
            os.makedirs(osp.join(dst, 'train'))  # part of the copy
            raise KeyboardInterrupt
        return real_move(src, dst)

    cut = tmp_path / 'cut'
    os.makedirs(cut)
    shutil.copy(archive, cut / 'ModelNet40.zip')
    monkeypatch.setattr(modelnet.shutil, 'move', stopped_move)
    with pytest.raises(KeyboardInterrupt):
        ModelNet40(str(cut), num_points=16, log=False)
    assert not (cut / 'raw' / 'chair').exists() and (cut / 'ModelNet40.zip').exists()
    monkeypatch.setattr(modelnet.shutil, 'move', real_move)
    ds = ModelNet40(str(cut), num_points=16, log=False)
    assert len(ds) == 3 and sorted(os.listdir(cut / 'raw')) == sorted(os.listdir(raw))

    # staging folders a killed download or extraction left behind go at the next download;
    # an archive without the ModelNet40/ folder is named
    killed = tmp_path / 'killed'
    os.makedirs(killed / '.download-abc')
    (killed / '.download-abc' / 'ModelNet40.zip').write_bytes(b'PK partial')
    os.makedirs(killed / '.extract-def' / 'ModelNet40')
    with zipfile.ZipFile(killed / 'ModelNet40.zip', 'w') as z:
        z.writestr('Other/readme.txt', b'not ModelNet40')
    with pytest.raises(CorruptRawFileError, match="ModelNet40.zip': the archive holds no "
                       "ModelNet40/ folder"):
        ModelNet40(str(killed), num_points=16, log=False)
    assert sorted(os.listdir(killed)) == ['ModelNet40.zip', 'processed', 'raw']


def test_missing_trimesh_names_the_pip_extra(modelnet_mesh_root, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, 'trimesh', None)  # makes 'import trimesh' raise ImportError
    with pytest.raises(ImportError, match=r"torch_mz\[datasets\]"):
        ModelNet40(modelnet_mesh_root, num_points=16, log=False)


def test_docstring_documents_every_argument():
    import inspect
    params = [p for p in inspect.signature(ModelNet40.__init__).parameters if p != 'self']
    assert [p for p in params if f'{p} (' not in ModelNet40.__doc__] == []


# a box 1 x 1 x 3, tall along z (the Princeton meshes' up axis)
TALL_BOX_VERTICES = [(x, y, 3 * z) for x, y, z in CUBE_VERTICES]
TALL_BOX = 'wardrobe/train/wardrobe_0001.off'


def test_mesh_source_is_y_up_like_the_hdf5_release(modelnet_mesh_root):
    write_off(osp.join(modelnet_mesh_root, 'raw', TALL_BOX), TALL_BOX_VERTICES, CUBE_QUADS)
    ds = ModelNet40(modelnet_mesh_root, num_points=256, normalize=False, log=False)
    data = next(d for d in ds if int(d.y) == MODELNET40_CLASSES.index('wardrobe'))
    # exactly the file's surface samples, turned by (x, y, z) -> (x, z, -y)
    seq = np.random.SeedSequence([0, zlib.crc32(TALL_BOX.encode())])
    sampled = sample_surface(np.array(TALL_BOX_VERTICES, dtype=np.float64),
                             read_off(osp.join(modelnet_mesh_root, 'raw', TALL_BOX))[1], 256, seq)
    expected = np.stack([sampled[:, 0], sampled[:, 2], -sampled[:, 1]], axis=1)
    assert np.allclose(data.pos.numpy(), expected, atol=1e-6)
    assert np.allclose(Z_UP_TO_Y_UP @ Z_UP_TO_Y_UP.T, np.eye(3))
    assert np.linalg.det(Z_UP_TO_Y_UP) == pytest.approx(1.0)
    extent = (data.pos.max(0).values - data.pos.min(0).values).numpy()
    assert extent == pytest.approx([1.0, 3.0, 1.0], abs=0.05)  # standing upright along y


def test_up_axis_rotation_keeps_a_tall_box_upright(modelnet_mesh_root):
    write_off(osp.join(modelnet_mesh_root, 'raw', TALL_BOX), TALL_BOX_VERTICES, CUBE_QUADS)
    ds = ModelNet40(modelnet_mesh_root, num_points=256, normalize=False, log=False)
    box = next(d for d in ds if int(d.y) == MODELNET40_CLASSES.index('wardrobe'))
    height = float(box.pos[:, 1].max() - box.pos[:, 1].min())
    random.seed(0)
    widths = []
    for _ in range(20):
        turned = RandomRotate(180, axis=1)(box.clone())
        assert float(turned.pos[:, 1].max() - turned.pos[:, 1].min()) == pytest.approx(height,
                                                                                       abs=1e-6)
        assert torch.allclose(turned.pos.norm(dim=1), box.pos.norm(dim=1), atol=1e-5)
        widths.append(float(turned.pos[:, 0].max() - turned.pos[:, 0].min()))
    assert height == pytest.approx(3.0, abs=0.05) and max(widths) - min(widths) > 0.2


def test_both_sources_deliver_the_same_up_axis(modelnet_mesh_root, modelnet_h5_root):
    write_off(osp.join(modelnet_mesh_root, 'raw', TALL_BOX), TALL_BOX_VERTICES, CUBE_QUADS)
    mesh = ModelNet40(modelnet_mesh_root, num_points=256, log=False)
    from_mesh = next(d for d in mesh if int(d.y) == MODELNET40_CLASSES.index('wardrobe'))
    # the same box as PointNet's release stores it: y-up, 2,048 surface points in random order
    points = sample_surface(np.array(TALL_BOX_VERTICES, dtype=np.float64),
                            np.array([t for a, b, c, d in CUBE_QUADS for t in ((a, b, c),
                                                                               (a, c, d))]),
                            2048, np.random.SeedSequence(7))
    points = points[:, [0, 2, 1]] * np.array([1, 1, -1])  # y-up
    root = modelnet_h5_root['root']
    folder = modelnet_h5_root['folder']
    write_h5(osp.join(folder, 'ply_data_train0.h5'), data=points[None].astype(np.float32),
             label=np.array([[MODELNET40_CLASSES.index('wardrobe')]], dtype=np.uint8))
    os.unlink(osp.join(folder, 'ply_data_train1.h5'))
    with open(osp.join(folder, 'train_files.txt'), 'w') as f:
        f.write(f'data/{HDF5_FOLDER}/ply_data_train0.h5\n')
    from_h5 = ModelNet40(root, source='hdf5', num_points=128, log=False)[0]
    for data in (from_mesh, from_h5):
        extent = (data.pos.max(0).values - data.pos.min(0).values).numpy()
        assert int(np.argmax(extent)) == 1 and extent[1] > 2.5 * max(extent[0], extent[2])


def test_hdf5_without_normalize_is_the_published_input(modelnet_h5_root):
    root, files = modelnet_h5_root['root'], modelnet_h5_root['files']
    raw = ModelNet40(root, source='hdf5', num_points=100, normalize=False, log=False)
    normalised = ModelNet40(root, source='hdf5', num_points=100, log=False)
    stored = files['ply_data_train0.h5'][0]
    for j in range(4):  # PointNet/DGCNN: data[:, 0:1024] of the file, as stored
        assert np.array_equal(raw[j].pos.numpy(), stored[j, :100])
    # re-normalising the first points moves them (the file normalises all of its points)
    assert not torch.allclose(raw[0].pos, normalised[0].pos, atol=1e-3)


def test_a_root_with_glob_characters_finds_its_files(modelnet_mesh_root, modelnet_h5_root,
                                                     tmp_path):
    # glob read '[1]' as a character class: no mesh and no HDF5 file was found
    for source, root in (('mesh', modelnet_mesh_root), ('hdf5', modelnet_h5_root['root'])):
        odd = str(tmp_path / f'run[1]*?{source}' / 'ModelNet40')
        shutil.copytree(osp.join(root, 'raw'), osp.join(odd, 'raw'))
        plain = ModelNet40(root, source=source, num_points=16, log=False)
        ds = ModelNet40(odd, source=source, num_points=16, log=False)
        assert len(ds) == len(plain) > 0
        assert all(torch.equal(a.pos, b.pos) for a, b in zip(ds, plain))
    # without the release's lists, the HDF5 files are found by their names' pattern
    os.unlink(osp.join(odd, 'raw', HDF5_FOLDER, 'train_files.txt'))
    with pytest.warns(UserWarning, match='cannot be checked'):
        assert len(ModelNet40(odd, source='hdf5', num_points=16, log=False,
                              force_reload=True)) == 5


@pytest.mark.parametrize('seed, num_points', [(np.int64(2), np.int64(16)),
                                              (torch.tensor(2), np.int32(16))])
def test_integral_seed_and_num_points_of_any_type_are_plain_ints(modelnet_mesh_root, seed,
                                                                 num_points):
    # np.int64 failed at writing stats.json, after the whole split was sampled
    ds = ModelNet40(modelnet_mesh_root, num_points=num_points, seed=seed, log=False)
    plain = ModelNet40(modelnet_mesh_root, num_points=16, seed=2, log=False)
    assert type(ds.seed) is int and type(ds.num_points) is int
    assert ds.processed_dir == plain.processed_dir and ds.processed_dir.endswith(
        'mesh_16_seed2_yup_pos-only')
    assert all(torch.equal(a.pos, b.pos) for a, b in zip(ds, plain))
    assert ds.stats['seed'] == 2 and ds.stats['num_points'] == 16


@pytest.mark.parametrize('kwargs, match', [
    (dict(seed=-1), r"'seed' must be an integer >= 0 \(got -1\)"),
    (dict(seed=True), r"'seed' must be an integer >= 0 \(got True\)"),
    (dict(seed=1.5), r"'seed' must be an integer >= 0 \(got 1.5\)"),
    (dict(num_points=True), "'num_points' must be a positive integer or None, got True"),
    (dict(num_points=2.5), "'num_points' must be a positive integer or None, got 2.5"),
    (dict(num_points=0), "'num_points' must be a positive integer or None, got 0"),
])
def test_invalid_seed_and_num_points_are_refused_before_processing(modelnet_mesh_root,
                                                                   monkeypatch, kwargs, match):
    monkeypatch.setattr(ModelNet40, 'process', lambda self: pytest.fail('refused first'))
    with pytest.raises(ValueError, match=match):
        ModelNet40(modelnet_mesh_root, **dict(dict(num_points=16), **kwargs), log=False)
    assert not osp.exists(osp.join(modelnet_mesh_root, 'processed'))


def _list(folder, split, names):
    with open(osp.join(folder, f'{split}_files.txt'), 'w') as f:
        f.writelines(f'data/{HDF5_FOLDER}/{name}\n' for name in names)


@pytest.mark.parametrize('train_list, test_list, match', [
    (['ply_data_train0.h5', 'ply_data_train1.h5', 'ply_data_train0.h5'], None,
     r"train_files.txt': lists 'ply_data_train0.h5' twice \(lines 1 and 3\)"),
    (['ply_data_train0.h5', 'ply_data_train1.h5', 'ply_data_test0.h5'], None,
     r"train_files.txt': 'ply_data_test0.h5' is one of the train files and the release's "
     r"test_files.txt lists it too"),
    (['ply_data_train0.h5', 'ply_data_train1.h5'], ['ply_data_test0.h5', 'ply_data_train1.h5'],
     r"train_files.txt': 'ply_data_train1.h5' is one of the train files and the release's "
     r"test_files.txt lists it too"),
    (['ply_data_train0.h5', 'ply_data_test0.h5'], 'no list',
     r"train_files.txt': 'ply_data_test0.h5' is one of the train files and its name is that of "
     r"a test file"),
])
def test_hdf5_lists_naming_a_file_twice_or_in_both_splits_are_refused(
        modelnet_h5_root, train_list, test_list, match):
    # before, the repeated file's shapes were read twice, and test shapes went into training
    root, folder = modelnet_h5_root['root'], modelnet_h5_root['folder']
    _list(folder, 'train', train_list)
    if test_list == 'no list':
        os.unlink(osp.join(folder, 'test_files.txt'))
    elif test_list is not None:
        _list(folder, 'test', test_list)
    with pytest.raises(CorruptRawFileError, match=match):
        ModelNet40(root, source='hdf5', num_points=16, log=False)


def test_hdf5_boolean_labels_are_refused(modelnet_h5_root):
    root, folder = modelnet_h5_root['root'], modelnet_h5_root['folder']
    write_h5(osp.join(folder, 'ply_data_test0.h5'), data=np.zeros((2, 32, 3), dtype=np.float32),
             label=np.array([[True], [False]]))
    with pytest.raises(CorruptRawFileError, match="ply_data_test0.h5.*'label' holds booleans"):
        ModelNet40(root, source='hdf5', num_points=16, log=False)


@pytest.mark.parametrize('change, match', [
    # (a (1, 2) array beside 2 shapes was read as their labels)
    (dict(label=np.array([[1, 2]])), r"dataset 'label' has shape \(1, 2\): expected one class "
     r"index per example of 'data', \(2,\) or \(2, 1\)"),
    (dict(label=np.array([[1.0], [np.nan]])), r"dataset 'label' holds labels that are not "
     r"whole numbers \(nan at index 1\)"),
    (dict(label=np.array([[1], [40]])), r"dataset 'label' holds labels outside \[0, 40\) "
     r"\(40 at index 1\)"),
    (dict(data=np.ones((2, 32, 3), dtype=bool)), "dataset 'data' holds booleans, not "
     "coordinates"),
])
def test_hdf5_labels_and_points_that_cannot_be_the_shapes_are_named(modelnet_h5_root, change,
                                                                    match):
    root, folder = modelnet_h5_root['root'], modelnet_h5_root['folder']
    arrays = dict(data=np.zeros((2, 32, 3), dtype=np.float32), label=np.array([[1], [2]]))
    arrays.update(change)
    write_h5(osp.join(folder, 'ply_data_test0.h5'), **arrays)
    with pytest.raises(CorruptRawFileError, match="ply_data_test0\\.h5': " + match):
        ModelNet40(root, source='hdf5', num_points=16, log=False)


def test_added_removed_or_resized_meshes_rebuild_the_cache(modelnet_mesh_root, monkeypatch):
    # the cache was used as it was: shapes added to raw/ never reached the dataset
    from tests.datasets.raw_formats import OCTA_FACES, OCTA_VERTICES, TETRA_FACES
    raw = osp.join(modelnet_mesh_root, 'raw')
    first = ModelNet40(modelnet_mesh_root, num_points=16, log=False)
    chair = osp.join(raw, 'chair', 'train', 'chair_0001.off')
    assert first.stats['raw_files']['chair/train/chair_0001.off'][:2] == [
        osp.getsize(chair), f'mtime_ns:{os.stat(chair).st_mtime_ns}']
    write_off(osp.join(raw, 'xbox', 'train', 'xbox_0002.off'), OCTA_VERTICES, OCTA_FACES)
    write_off(osp.join(raw, 'airplane', 'train', 'airplane_0002.off'),
              [(10 * x, 10 * y, 10 * z) for x, y, z in CUBE_VERTICES[:4]], TETRA_FACES)
    os.unlink(osp.join(raw, 'chair', 'train', 'chair_0001.off'))
    with pytest.warns(UserWarning, match=r"are not those they were built from \(added: "
                      r"xbox/train/xbox_0002.off; removed: chair/train/chair_0001.off; changed "
                      r"in size, contents or modification time: airplane/train/airplane_0002.off\): rebuilding"):
        again = ModelNet40(modelnet_mesh_root, num_points=16, log=False)
    label = MODELNET40_CLASSES.index
    assert [int(d.y) for d in again] == [label('airplane'), label('airplane'), label('xbox')]
    monkeypatch.setattr(ModelNet40, 'process', lambda self: pytest.fail('must be reused'))
    assert len(ModelNet40(modelnet_mesh_root, num_points=16, log=False, train=False)) == 2


def test_an_added_hdf5_file_rebuilds_the_cache(modelnet_h5_root):
    root, folder = modelnet_h5_root['root'], modelnet_h5_root['folder']
    ModelNet40(root, source='hdf5', num_points=16, log=False)
    write_h5(osp.join(folder, 'ply_data_train2.h5'), data=np.zeros((1, 128, 3), np.float32),
             label=np.array([[7]], dtype=np.uint8))
    _list(folder, 'train', ['ply_data_train0.h5', 'ply_data_train1.h5', 'ply_data_train2.h5'])
    with pytest.warns(UserWarning, match=r"added: modelnet40_ply_hdf5_2048/ply_data_train2.h5; "
                      r"changed in size, contents or modification time: modelnet40_ply_hdf5_2048/train_files.txt"):
        train = ModelNet40(root, source='hdf5', num_points=16, log=False)
    assert [int(d.y) for d in train][-1] == 7


def test_an_unlisted_hdf5_file_beside_the_release_does_not_rebuild(modelnet_h5_root,
                                                                  monkeypatch):
    # processing reads only the files the two lists name; a copy beside them had rebuilt the
    # cache (with a warning) into the same data
    root, folder = modelnet_h5_root['root'], modelnet_h5_root['folder']
    first = ModelNet40(root, source='hdf5', num_points=16, log=False)
    shutil.copy(osp.join(folder, 'ply_data_train0.h5'),
                osp.join(folder, 'ply_data_train0_backup.h5'))
    monkeypatch.setattr(ModelNet40, 'process', lambda self: pytest.fail('must be reused'))
    again = ModelNet40(root, source='hdf5', num_points=16, log=False)
    assert all(torch.equal(a.pos, b.pos) for a, b in zip(first, again))


def test_the_docstring_says_which_pyg_transforms_apply(modelnet_mesh_root):
    # it said that any torch_geometric.transforms pipeline works: those needing faces do not
    from torch_geometric import transforms as T
    doc = ' '.join(ModelNet40.__doc__.split())
    assert 'any :mod:`torch_geometric.transforms` pipeline' not in doc
    assert '``SamplePoints``' in doc and 'no :obj:`face` is stored' in doc
    for name in ('NormalizeScale', 'RandomRotate', 'FixedPoints'):
        assert f'``{name}``' in doc
    ds = ModelNet40(modelnet_mesh_root, num_points=16, log=False)
    pipeline = T.Compose([T.NormalizeScale(), T.RandomRotate(180, axis=1), T.FixedPoints(8),
                          T.RandomScale((0.9, 1.1)), T.Center()])
    assert pipeline(ds[0]).pos.shape == (8, 3)
    assert 'face' not in ds[0]
    with pytest.raises(Exception):
        T.SamplePoints(8)(ds[0])


@pytest.mark.parametrize('lines, match', [
    # the fast parse of every vertex (face) line at once named none
    (['OFF', '4 4 0', '0 0 0', '1 0 0', '1 O 0', '0 0 1', '3 0 2 1', '3 0 1 3', '3 0 3 2',
      '3 1 2 3'], r"malformed vertex coordinates: vertex 2 \('1 O 0'\) \(could not convert"),
    (['OFF', '4 1 0', '0 0 0', '1 0 0 255', '0 1 0 255', '0 0 zero 255', '3 0 2 1'],
     r"malformed vertex coordinates: vertex 3 \('0 0 zero 255'\)"),
    (['OFF', '4 4 0', '0 0 0', '1 0 0', '0 1 0', '0 0 1', '3 0 2 1', '3 0 1 3', '3 0 1 3x',
      '3 1 2 3'], r"malformed face line '3 0 1 3x' \(invalid literal"),
    (['OFF', '4 2 0', '0 0 0', '1 0 0', '0 1 0', '0 0 1', '3 0 2 1', '3 0 1 3 red'],
     r"malformed face line '3 0 1 3 red': the values after its corners are no colour"),
])
def test_read_off_names_the_line_of_a_malformed_number(tmp_path, lines, match):
    path = tmp_path / 'bad_0001.off'
    path.write_text('\n'.join(lines) + '\n')
    with pytest.raises(CorruptRawFileError, match=match):
        read_off(str(path))


TETRA_LINES = ['0 0 0', '1 0 0', '0 1 0', '0 0 1', '3 0 2 1', '3 0 1 3', '3 0 3 2', '3 1 2 3']


@pytest.mark.parametrize('name, lines', [
    ('float face colours', ['OFF', '4 4 0'] + TETRA_LINES[:4]
     + [f + ' 0.5 0.25 1.0' for f in TETRA_LINES[4:]]),
    ('float face colours with alpha', ['OFF', '4 4 0'] + TETRA_LINES[:4]
     + [f + ' 0.5 0.25 1.0 0.75' for f in TETRA_LINES[4:]]),
    ('COFF', ['COFF', '4 4 0'] + [v + ' 255 0 0 255' for v in TETRA_LINES[:4]]
     + TETRA_LINES[4:]),
    ('NOFF', ['NOFF', '4 4 0'] + [v + ' 0 0 1' for v in TETRA_LINES[:4]] + TETRA_LINES[4:]),
    ('CNOFF merged', ['CNOFF4 4 0'] + [v + ' 0 0 1 0.5 0.5 0.5 1' for v in TETRA_LINES[:4]]
     + TETRA_LINES[4:]),
    ('STOFF', ['STOFF', '4 4 0'] + [v + ' 0.5 0.5' for v in TETRA_LINES[:4]]
     + TETRA_LINES[4:]),
    ('UTF-8 BOM', ['\ufeffOFF', '4 4 0'] + TETRA_LINES),
    ('UTF-8 BOM, merged header', ['\ufeffOFF4 4 0'] + TETRA_LINES),
])
def test_read_off_reads_the_3d_off_family(tmp_path, name, lines):
    # each was refused: "missing the 'OFF' header" or "malformed face line", with "Delete it and
    # fetch it again" for a file that is not corrupt
    plain = tmp_path / 'plain.off'
    plain.write_text('\n'.join(['OFF', '4 4 0'] + TETRA_LINES) + '\n')
    path = tmp_path / 'variant.off'
    path.write_text('\n'.join(lines) + '\n', encoding='utf-8')
    vertices, faces = read_off(str(path))
    expected_vertices, expected_faces = read_off(str(plain))
    assert np.array_equal(vertices, expected_vertices), name
    assert np.array_equal(faces, expected_faces), name


@pytest.mark.parametrize('header, variant', [('4OFF', '4OFF'), ('nOFF\n4', 'nOFF'),
                                             ('C4OFF', 'C4OFF'), ('OFF BINARY', 'OFF BINARY')])
def test_read_off_names_an_unsupported_variant(tmp_path, header, variant):
    path = tmp_path / 'variant.off'
    path.write_text(header + '\n4 4 0\n' + '\n'.join(TETRA_LINES) + '\n')
    with pytest.raises(ValueError, match=f"unsupported OFF variant '{variant}'") as info:
        read_off(str(path))
    assert not isinstance(info.value, CorruptRawFileError)
    assert 'fetch it again' not in str(info.value) and str(path) in str(info.value)


def test_a_tiny_mesh_is_sampled_not_taken_for_one_without_area(modelnet_mesh_root):
    # a tetrahedron at 1e-170: its area underflowed to 0 and the mesh was left out as
    # 'mesh_without_area'; normalised, it is the unit tetrahedron
    pytest.importorskip('trimesh')
    tetra = np.array(TETRA_VERTICES_F, dtype=np.float64)
    faces = np.array([(0, 2, 1), (0, 1, 3), (0, 3, 2), (1, 2, 3)])
    unit = sample_surface(tetra, faces, 64, np.random.SeedSequence(3))
    for scale in (1e-170, 1e-300, 1e160):
        points = sample_surface(tetra * scale, faces, 64, np.random.SeedSequence(3))
        assert points is not None and np.isfinite(points).all(), scale
        assert np.allclose(points / scale, unit, rtol=1e-9, atol=1e-12), scale
    line = np.array([(0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (2.0, 2.0, 2.0)])  # no area at any scale
    assert sample_surface(line * 1e-170, np.array([(0, 1, 2)]), 8) is None
    raw = osp.join(modelnet_mesh_root, 'raw')
    with open(osp.join(raw, 'cone', 'train', 'cone_0001.off'), 'w') as f:  # (write_off: %.6f)
        f.write('\n'.join(['OFF', '4 4 0'] + [' '.join(repr(c * 1e-170) for c in v)
                                              for v in TETRA_VERTICES_F]
                          + TETRA_LINES[4:]) + '\n')
    write_off(osp.join(raw, 'cone', 'train', 'cone_0002.off'), TETRA_VERTICES_F,
              faces.tolist())
    ds = ModelNet40(modelnet_mesh_root, num_points=32, log=False)
    labels = [int(d.y) for d in ds]
    assert labels.count(MODELNET40_CLASSES.index('cone')) == 2
    tiny, plain = [d for d in ds if int(d.y) == MODELNET40_CLASSES.index('cone')]
    assert torch.isfinite(tiny.pos).all()
    assert float(tiny.pos.norm(dim=1).max()) == pytest.approx(1.0, abs=1e-5)
    assert ds.stats['train']['skipped']['counts'] == {'mesh_without_area': 1}  # the flat bed


TETRA_VERTICES_F = [(0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)]


def test_a_class_folder_without_its_split_folder_is_refused(modelnet_mesh_root):
    # chair/ without test/ (a copy stopped part way): the test split was read without the
    # class, and no word
    shutil.rmtree(osp.join(modelnet_mesh_root, 'raw', 'chair', 'test'))
    with pytest.raises(FileNotFoundError, match=r"1 of the 40 class folders .* lack their "
                       r"'test' folder: chair.test\. Every class"):
        ModelNet40(modelnet_mesh_root, train=False, num_points=16, log=False)
    assert not osp.exists(osp.join(modelnet_mesh_root, 'processed', 'mesh_16_seed0_yup_pos-only',
                                   'stats.json'))


def test_the_docstring_says_normalize_scale_normalises_again(modelnet_mesh_root):
    # NormalizeScale was listed among the transforms that compose, as if a no-op on sets that
    # normalize=True had scaled to the unit sphere: it scales them to its own convention
    from torch_geometric import transforms as T
    import torch_mz.datasets.real as real
    doc = ' '.join(ModelNet40.__doc__.split())
    assert ('``NormalizeScale`` after :obj:`normalize=True` normalises again, to PyG\'s scale: the '
            'largest absolute coordinate 0.999999, not the largest norm 1' in doc)
    assert 'replaces the unit-sphere scaling' in ' '.join(real.__doc__.split())
    plain = ModelNet40(modelnet_mesh_root, num_points=64, log=False)
    scaled = ModelNet40(modelnet_mesh_root, num_points=64, log=False, transform=T.NormalizeScale())
    grown = []
    for a, b in zip(plain, scaled):
        assert a.pos.norm(dim=1).max() == pytest.approx(1.0, abs=1e-5)
        assert b.pos.abs().max() == pytest.approx(0.999999, abs=1e-5)
        grown.append(float(b.pos.norm(dim=1).max()))
    assert max(grown) > 1.1 and max(grown) <= 3**0.5 + 1e-5
    # after a rotation about y the largest coordinate turns with the set: another scale
    box = plain[0]  # the unit cube
    turned = RandomRotate((45, 45), axis=1)(box.clone())
    assert not torch.allclose(T.NormalizeScale()(turned).pos.norm(dim=1).max(),
                              T.NormalizeScale()(box.clone()).pos.norm(dim=1).max(), atol=1e-2)


@pytest.mark.parametrize('remove', ['chair/test', 'test meshes'])
def test_a_missing_test_folder_is_refused_before_the_training_meshes_are_read(
        modelnet_mesh_root, monkeypatch, remove):
    # the bug: the test split's folders were checked only once every training mesh had been
    # sampled (9,843 of them) and train.pt written, with a warning naming a stats file that
    # was never written
    import torch_mz.datasets.modelnet as modelnet_module
    raw = osp.join(modelnet_mesh_root, 'raw')
    if remove == 'chair/test':
        shutil.rmtree(osp.join(raw, 'chair', 'test'))
        match = r"1 of the 40 class folders .* lack their 'test' folder: chair.test\. Every"
    else:
        for path in glob.glob(osp.join(raw, '*', 'test', '*.off')):
            os.unlink(path)
        match = 'no test meshes found'
    read = []
    monkeypatch.setattr(modelnet_module, 'read_off', lambda path: read.append(path))
    with pytest.raises(FileNotFoundError, match=match):
        ModelNet40(modelnet_mesh_root, train=True, num_points=16, log=False)
    assert read == []
    assert not glob.glob(osp.join(modelnet_mesh_root, 'processed', '*', 'train.pt'))
