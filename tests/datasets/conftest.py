r"""Fixtures that write tiny raw dataset files in the real formats into a tmp_path (writers in
``raw_formats.py``)."""
import os
import os.path as osp
from typing import Dict

import numpy as np
import pytest
from tests.datasets.raw_formats import (
    MODELNET_MESHES,
    random_clouds,
    write_gdb9,
    write_h5,
    write_off,
    write_qm9pack_csv,
)

from torch_mz.datasets.modelnet import HDF5_FOLDER, MODELNET40_CLASSES


@pytest.fixture
def modelnet_mesh_root(tmp_path) -> str:
    pytest.importorskip('trimesh')  # the meshes are sampled with it (the [datasets] extra)
    root = str(tmp_path / 'ModelNet40')
    raw = osp.join(root, 'raw')
    for name in MODELNET40_CLASSES:
        for split in ('train', 'test'):
            os.makedirs(osp.join(raw, name, split), exist_ok=True)
    for rel, (vertices, faces, merged) in MODELNET_MESHES.items():
        write_off(osp.join(raw, rel), vertices, faces, merged_header=merged)
    return root


@pytest.fixture
def modelnet_h5_root(tmp_path) -> Dict[str, object]:
    rng = np.random.default_rng(0)
    root = str(tmp_path / 'ModelNet40')
    folder = osp.join(root, 'raw', HDF5_FOLDER)
    files = {
        'ply_data_train0.h5': (random_clouds(rng, 4,
                                             128), np.array([[0], [8], [39], [8]], dtype=np.uint8)),
        'ply_data_train1.h5': (random_clouds(rng, 2, 128), np.array([[5], [6]], dtype=np.uint8)),
        'ply_data_test0.h5': (random_clouds(rng, 3, 128), np.array([[1], [2], [3]],
                                                                   dtype=np.uint8)),
    }
    files['ply_data_train1.h5'][0][1, 7, 2] = np.nan  # one shape with a non-finite point
    for name, (data, label) in files.items():
        write_h5(osp.join(folder, name), data=data, label=label)
    os.makedirs(folder, exist_ok=True)
    with open(osp.join(folder, 'shape_names.txt'), 'w') as f:
        f.write('\n'.join(MODELNET40_CLASSES) + '\n')
    for split in ('train', 'test'):  # the release's lists of its files, in its own form
        with open(osp.join(folder, f'{split}_files.txt'), 'w') as f:
            f.writelines(f'data/{HDF5_FOLDER}/{name}\n' for name in files if f'_{split}' in name)
    return {'root': root, 'folder': folder, 'files': files}


@pytest.fixture
def scanobjectnn_root(tmp_path) -> Dict[str, object]:
    rng = np.random.default_rng(1)
    root = str(tmp_path / 'ScanObjectNN')
    files = {}
    for folder, n_train, n_test in (('main_split', 5, 3), ('main_split_nobg', 4, 2)):
        for split, n in (('training', n_train), ('test', n_test)):
            rel = osp.join('h5_files', folder, f'{split}_objectdataset.h5')
            data = random_clouds(rng, n, 256)
            label = rng.integers(0, 15, size=n).astype(np.int64)
            mask = np.where(rng.random((n, 256)) < 0.3, -1, 1).astype(np.int32)
            write_h5(osp.join(root, 'raw', rel), data=data, label=label, mask=mask)
            files[rel] = {'data': data, 'label': label, 'mask': mask}
    return {'root': root, 'files': files}


@pytest.fixture
def qm9_root(tmp_path) -> str:
    root = str(tmp_path / 'QM9')
    write_gdb9(osp.join(root, 'raw'))
    return root


@pytest.fixture
def qm9pack_csv(tmp_path) -> str:
    return write_qm9pack_csv(str(tmp_path / 'qm9pack' / 'qm9_part1.csv'))
