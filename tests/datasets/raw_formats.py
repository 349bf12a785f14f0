r"""Writers of tiny raw files in the real formats of ModelNet40 (OFF meshes, PointNet's HDF5
release), ScanObjectNN (HDF5) and QM9 (gdb9.sdf, gdb9.sdf.csv, uncharacterized.txt, qm9pack's CSV),
used by the dataset tests through the fixtures of ``conftest.py``; and the hostile inputs of the
robustness tests (a crafted pickle, a download without network)."""
import csv
import os
import os.path as osp
import shutil
from typing import Dict, List, Sequence
from urllib.error import URLError

import numpy as np
import pytest

# --------------------------------------------------------------------------------------------------
# ModelNet40 meshes


def write_off(path: str, vertices: Sequence[Sequence[float]], faces: Sequence[Sequence[int]],
              merged_header: bool = False, comment: bool = False) -> str:
    r"""Writes an OFF file; :obj:`merged_header` writes the ModelNet quirk ``OFF<nv> <nf> 0``."""
    os.makedirs(osp.dirname(path), exist_ok=True)
    lines = []
    if merged_header:
        lines.append(f'OFF{len(vertices)} {len(faces)} 0')
    else:
        lines += ['OFF', f'{len(vertices)} {len(faces)} 0']
    if comment:
        lines.insert(1, '# written by the torch_mz tests')
    lines += [' '.join(f'{c:.6f}' for c in v) for v in vertices]
    lines += [' '.join(str(i) for i in [len(f), *f]) for f in faces]
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return path


CUBE_VERTICES = [(0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 1, 0), (0, 0, 1), (1, 0, 1), (1, 1, 1),
                 (0, 1, 1)]
CUBE_QUADS = [(0, 3, 2, 1), (4, 5, 6, 7), (0, 1, 5, 4), (1, 2, 6, 5), (2, 3, 7, 6), (3, 0, 4, 7)]
CUBE_TRIANGLES = [t for a, b, c, d in CUBE_QUADS for t in ((a, b, c), (a, c, d))]
TETRA_VERTICES = [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]
TETRA_FACES = [(0, 2, 1), (0, 1, 3), (0, 3, 2), (1, 2, 3)]
PYRAMID_VERTICES = [(0, 0, 0), (2, 0, 0), (2, 2, 0), (0, 2, 0), (1, 1, 3)]
PYRAMID_FACES = [(0, 3, 2, 1), (0, 1, 4), (1, 2, 4), (2, 3, 4), (3, 0, 4)]  # quad base + triangles
OCTA_VERTICES = [(1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)]
OCTA_FACES = [(0, 2, 4), (2, 1, 4), (1, 3, 4), (3, 0, 4), (2, 0, 5), (1, 2, 5), (3, 1, 5),
              (0, 3, 5)]

# relative path -> (vertices, faces, merged header); bed_0001 has no surface area (skipped)
MODELNET_MESHES = {
    'airplane/train/airplane_0001.off': (CUBE_VERTICES, CUBE_QUADS, True),
    'airplane/train/airplane_0002.off': (TETRA_VERTICES, TETRA_FACES, False),
    'chair/train/chair_0001.off':
    ([(2 * x, y, 0.5 * z) for x, y, z in CUBE_VERTICES], CUBE_TRIANGLES, False),
    'bed/train/bed_0001.off': ([(0, 0, 0), (1, 1, 1), (2, 2, 2)], [(0, 1, 2)], False),
    'chair/test/chair_0002.off': (PYRAMID_VERTICES, PYRAMID_FACES, True),
    'xbox/test/xbox_0001.off': (OCTA_VERTICES, OCTA_FACES, False),
}

# --------------------------------------------------------------------------------------------------
# HDF5 point clouds (PointNet's ModelNet40 release, ScanObjectNN)


def write_h5(path: str, **arrays: np.ndarray) -> str:
    h5py = pytest.importorskip('h5py')  # (the [datasets] extra: skipped without it)
    os.makedirs(osp.dirname(path), exist_ok=True)
    with h5py.File(path, 'w') as f:
        for key, value in arrays.items():
            f.create_dataset(key, data=value)
    return path


#: The ways an HDF5 entry leads out of its file (:func:`write_h5_leading_elsewhere`).
H5_ELSEWHERE = ('external_link', 'soft_link', 'virtual', 'external_storage')


def write_h5_leading_elsewhere(path: str, kind: str, key: str, other: str,
                               **arrays: np.ndarray) -> str:
    r"""Writes the HDF5 file :obj:`path` holding :obj:`arrays`, and under :obj:`key` an entry
    that reads :obj:`key` of the HDF5 file :obj:`other` instead (:data:`H5_ELSEWHERE`): an
    external link, a soft link through an external link to its root, a virtual dataset, or a
    dataset stored in a raw copy of the array (``<other>.bin``), as a crafted file would."""
    h5py = pytest.importorskip('h5py')
    os.makedirs(osp.dirname(path), exist_ok=True)
    with h5py.File(other, 'r') as f:
        shape, dtype = f[key].shape, f[key].dtype
        values = f[key][()]
    with h5py.File(path, 'w') as f:
        for name, value in arrays.items():
            f.create_dataset(name, data=value)
        if kind == 'external_link':
            f[key] = h5py.ExternalLink(other, '/' + key)
        elif kind == 'soft_link':
            f['elsewhere'] = h5py.ExternalLink(other, '/')
            f[key] = h5py.SoftLink('/elsewhere/' + key)
        elif kind == 'virtual':
            layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
            layout[...] = h5py.VirtualSource(other, key, shape=shape)
            f.create_virtual_dataset(key, layout)
        else:  # external_storage
            raw = other + '.bin'
            values.tofile(raw)
            f.create_dataset(key, shape=shape, dtype=dtype, external=[(raw, 0, values.nbytes)])
    return path


def write_h5_user_defined_link(path: str, key: str, **arrays: np.ndarray) -> str:
    r"""Writes the HDF5 file :obj:`path` holding :obj:`arrays`, and under :obj:`key` a
    user-defined link (of a link class registered only while it is written, through the HDF5
    library that h5py loaded; skipped where it is not found), as a crafted file would."""
    import ctypes
    h5py = pytest.importorskip('h5py')
    try:  # (Linux: the shared libraries mapped into this process)
        with open('/proc/self/maps') as maps:
            libs = {line.split()[-1] for line in maps
                    if 'libhdf5' in line and '_hl' not in line and '.so' in line}
    except OSError:
        libs = set()
    if len(libs) != 1:
        pytest.skip(f'the HDF5 library that h5py loaded is not found ({sorted(libs)})')
    lib = ctypes.CDLL(libs.pop())
    hid_t = ctypes.c_int64
    trav_t = ctypes.CFUNCTYPE(hid_t, ctypes.c_char_p, hid_t, ctypes.c_void_p, ctypes.c_size_t,
                              hid_t, hid_t)

    class LinkClass(ctypes.Structure):  # (H5L_class_t, version 1)
        _fields_ = [('version', ctypes.c_int), ('id', ctypes.c_int),
                    ('comment', ctypes.c_char_p), ('create', ctypes.c_void_p),
                    ('move', ctypes.c_void_p), ('copy', ctypes.c_void_p), ('trav', trav_t),
                    ('delete', ctypes.c_void_p), ('query', ctypes.c_void_p)]

    link_type = 200  # (in [H5L_TYPE_UD_MIN, H5L_TYPE_MAX])
    trav = trav_t(lambda *args: -1)  # (kept alive while the class is registered)
    cls = LinkClass(1, link_type, b'torch_mz test', None, None, None, trav, None, None)
    if lib.H5Lregister(ctypes.byref(cls)) < 0:
        pytest.skip('the HDF5 library takes no user-defined link class')
    try:
        os.makedirs(osp.dirname(path), exist_ok=True)
        with h5py.File(path, 'w') as f:
            for name, value in arrays.items():
                f.create_dataset(name, data=value)
            lib.H5Lcreate_ud.argtypes = [hid_t, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p,
                                         ctypes.c_size_t, hid_t, hid_t]
            assert lib.H5Lcreate_ud(f.id.id, key.encode(), link_type, None, 0, 0, 0) >= 0
    finally:
        lib.H5Lunregister(link_type)
    return path


#: A filter id that no library here registers (the id HDF5's registry gives to bzip2, whose
#: plugin is not installed with h5py).
FOREIGN_FILTER = 307


def write_h5_foreign_filter(path: str, key: str, values: np.ndarray,
                            **arrays: np.ndarray) -> str:
    r"""Writes the HDF5 file :obj:`path` holding :obj:`arrays`, and under :obj:`key` the 1-D
    :obj:`values` stored as if compressed with the filter :data:`FOREIGN_FILTER` (their bytes
    written as the one chunk, marked as filtered), as a crafted file would: reading it makes
    HDF5 search its plugin path for a library of that filter."""
    h5py = pytest.importorskip('h5py')
    os.makedirs(osp.dirname(path), exist_ok=True)
    with h5py.File(path, 'w') as f:
        for name, value in arrays.items():
            f.create_dataset(name, data=value)
        dataset = f.create_dataset(key, shape=values.shape, dtype=values.dtype,
                                   chunks=values.shape, compression=FOREIGN_FILTER,
                                   allow_unknown_filter=True)
        dataset.id.write_direct_chunk((0, ), values.tobytes(), filter_mask=0)
    return path


def random_clouds(rng: np.random.Generator, n: int, p: int) -> np.ndarray:
    clouds = rng.normal(size=(n, p, 3)) * rng.uniform(0.5, 2.0, size=(n, 1, 3))
    return (clouds / np.linalg.norm(clouds, axis=-1).max(axis=1, keepdims=True)[..., None]).astype(
        np.float32)


# --------------------------------------------------------------------------------------------------
# QM9: gdb9.sdf, gdb9.sdf.csv, uncharacterized.txt and qm9pack-style CSV rows of the same molecules

QM9_SMILES = ['C', 'N', 'O', 'C#N', 'CC(=O)O']
QM9_UNCHARACTERIZED = [3]  # 1-based, as in uncharacterized.txt
GDB9_CSV_HEADER = [
    'mol_id', 'A', 'B', 'C', 'mu', 'alpha', 'homo', 'lumo', 'gap', 'r2', 'zpve', 'u0', 'u298',
    'h298', 'g298', 'cv', 'u0_atom', 'u298_atom', 'h298_atom', 'g298_atom'
]
QM9PACK_HEADER = [
    'XYZ_file', 'Index', 'SMILES', 'InChi', 'N_atoms', 'Stoichiometry', 'Elements', 'XYZ_Ang',
    'Mulliken_pop', 'Harmonic_Freq_cmi', 'RotA_GHz', 'RotB_GHz', 'RotC_GHz', 'Dipole_debye',
    'Polarizability_bohr3', 'HOMO_au', 'LUMO_au', 'HOMO_LUMO_gap_au', 'R2_bohr2', 'ZPVE_au',
    'InternalEnergy_0K_au', 'InternalEnergy_298K_au', 'Enthalphy_298K_au',
    'GibbsFreeEnergy_298K_au', 'Heatcapacity_Cv_cal_mol_K'
]


def qm9_molecules(first_index: int = 1) -> List[object]:
    r"""The molecules of :data:`QM9_SMILES` with 3D coordinates, named ``gdb_<first_index>``,
    ``gdb_<first_index + 1>``, ... (as an excerpt of QM9 that does not start at molecule 1)."""
    pytest.importorskip('rdkit')  # (the [datasets] extra: skipped without it)
    from rdkit import Chem
    from rdkit.Chem import AllChem
    mols = []
    for i, smiles in enumerate(QM9_SMILES):
        mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
        params = AllChem.ETKDGv3()
        params.randomSeed = 42 + i
        assert AllChem.EmbedMolecule(mol, params) == 0
        mol.SetProp('_Name', f'gdb_{first_index + i}')
        mols.append(mol)
    return mols


def qm9_raw_targets(i: int) -> Dict[str, float]:
    r"""Made-up targets of molecule :obj:`i` in the raw units (Hartree for energies)."""
    return {
        'A': 157.7 + i,
        'B': 157.7,
        'C': 157.7 - i,
        'mu': 0.5 * i,
        'alpha': 13.21 + i,
        'homo': -0.3877 + 0.01 * i,
        'lumo': 0.1171 - 0.01 * i,
        'gap': 0.5048 - 0.02 * i,
        'r2': 35.3641 + 10 * i,
        'zpve': 0.044749 + 0.001 * i,
        'u0': -40.47893 - 10 * i,
        'u298': -40.476062 - 10 * i,
        'h298': -40.475117 - 10 * i,
        'g298': -40.498597 - 10 * i,
        'cv': 6.469 + i,
        'u0_atom': -395.999595 - i,
        'u298_atom': -398.64329 - i,
        'h298_atom': -401.014647 - i,
        'g298_atom': -372.471772 - i
    }


def write_uncharacterized(path: str, indices: Sequence[int]) -> str:
    # the layout of the real file: 9 header lines, one line per molecule, a closing rule
    rule = '=' * 158
    lines = [
        '', ' List of molecules among the 133885 GDB9 molecules for which the Corina generated '
        'Cartesian coordinates and the B3LYP/6-31G(2df,p)',
        ' equilibrium geometry lead to different SMILES and InChI strings when parsed through '
        'the program Openbabel.',
        ' Given are the indices of these molecules in the database, the original GDB17 SMILES and '
        'the SMILES for the two geometries,',
        ' as well as the L1 norm of the difference between the Coulomb matrices (D_IJ in au).', '',
        rule, '#   Index        GDB17 SMILES        SMILES for B3LYP XYZ        SMILES for Corina '
        'generated XYZ        D_IJ', rule
    ]
    lines += [f'{k:8d}{"O":>24}{"O":>29}{"O":>45}{6.036217:20.6f}' for k in indices]
    lines.append(rule)
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return path


def write_gdb9(raw_dir: str, first_index: int = 1) -> Dict[str, object]:
    r"""Writes ``gdb9.sdf``, ``gdb9.sdf.csv`` and ``uncharacterized.txt`` of the molecules of
    :func:`qm9_molecules` (named from ``gdb_<first_index>`` on; the uncharacterized one is the
    third, whatever its index)."""
    pytest.importorskip('rdkit')  # (the [datasets] extra: skipped without it)
    from rdkit import Chem
    os.makedirs(raw_dir, exist_ok=True)
    mols = qm9_molecules(first_index)
    writer = Chem.SDWriter(osp.join(raw_dir, 'gdb9.sdf'))
    for mol in mols:
        writer.write(mol)
    writer.close()
    with open(osp.join(raw_dir, 'gdb9.sdf.csv'), 'w', newline='') as f:
        out = csv.writer(f)
        out.writerow(GDB9_CSV_HEADER)
        for i in range(len(mols)):
            targets = qm9_raw_targets(i)
            out.writerow([f'gdb_{first_index + i}'] + [targets[c] for c in GDB9_CSV_HEADER[1:]])
    write_uncharacterized(osp.join(raw_dir, 'uncharacterized.txt'),
                          [first_index - 1 + k for k in QM9_UNCHARACTERIZED])
    return {'raw_dir': raw_dir, 'mols': mols}


def write_qm9pack_csv(path: str, skip: Sequence[int] = QM9_UNCHARACTERIZED) -> str:
    r"""The molecules of :func:`write_gdb9` as rows of qm9pack's ``qm9_part*.csv`` (which, like the
    package, leave out the uncharacterized ones)."""
    os.makedirs(osp.dirname(path), exist_ok=True)
    mols = qm9_molecules()
    with open(path, 'w', newline='') as f:
        out = csv.writer(f, quoting=csv.QUOTE_NONNUMERIC, lineterminator='\n')
        out.writerow(QM9PACK_HEADER)
        for i, mol in enumerate(mols):
            if i + 1 in skip:
                continue
            t = qm9_raw_targets(i)
            symbols = [a.GetSymbol() for a in mol.GetAtoms()]
            pos = mol.GetConformer().GetPositions()
            elements = '[' + ','.join(f"'{s}'" for s in symbols) + ']'
            xyz = '[' + ','.join('[' + ','.join(repr(float(c)) for c in p) + ']' for p in pos) + ']'
            zeros = '[' + ','.join('0.' for _ in symbols) + ']'
            out.writerow([
                f'dsgdb9nsd_{i + 1:06d}.xyz', i + 1, QM9_SMILES[i], 'InChI=1S/x',
                len(symbols), '[0,0,0,0,0]', elements, xyz, zeros, '[1000.0]', t['A'], t['B'],
                t['C'], t['mu'], t['alpha'], t['homo'], t['lumo'], t['gap'], t['r2'], t['zpve'],
                t['u0'], t['u298'], t['h298'], t['g298'], t['cv']
            ])
    return path


# --------------------------------------------------------------------------------------------------
# Hostile inputs


class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):  # shutil is not blocked by torch: PyG's loader would run this
        return (shutil.copyfile, (__file__, self.marker))


def write_crafted_pickle(path: str, marker: str) -> str:
    r"""Writes a torch file at :obj:`path` whose unpickling runs code: it creates the file
    :obj:`marker`, so a test can tell whether it ran. It uses a function of a module that torch
    does not block outright, so that a loader which retries with ``weights_only=False`` (PyG's
    ``fs.torch_load``) would run it."""
    import torch
    torch.save(_Payload(marker), path)
    return path


def offline_download_url(url: str, folder: str, log: bool = True) -> str:
    r"""Stands in for :func:`torch_geometric.data.download_url` on a machine without network."""
    raise URLError('no network')
