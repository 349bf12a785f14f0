import csv
import json
import os
import os.path as osp
import re
import shutil
import warnings

import numpy as np
import pytest
import torch

from tests.test_files import flip_bit_in_record

pytest.importorskip('rdkit')  # QM9 is read with RDKit (the [datasets] extra): skipped without it

from tests.datasets.raw_formats import (  # noqa: E402
    QM9_SMILES,
    QM9_UNCHARACTERIZED,
    offline_download_url,
    qm9_molecules,
    qm9_raw_targets,
    write_crafted_pickle,
    write_gdb9,
)
from torch_mz.datasets import qm9 as qm9_module
from torch_mz.datasets.common import CorruptRawFileError, ProcessedFileError, split_indices
from torch_mz.datasets.qm9 import (
    HARTREE_TO_EV,
    QM9,
    QM9_ELEMENTS,
    QM9_PAPER_SPLIT,
    QM9_STANDARD_SPLIT,
    QM9_TARGETS,
    QM9_UNITS,
    gasteiger_charges,
    mol_from_xyz,
    read_uncharacterized,
)
from torch_mz.models.base import set_features

KEPT = [k for k in range(1, len(QM9_SMILES) + 1) if k not in QM9_UNCHARACTERIZED]  # 1-based


def expected_y(gdb_idx: int) -> torch.Tensor:
    raw = qm9_raw_targets(gdb_idx - 1)
    factor = {t: HARTREE_TO_EV if QM9_UNITS[t] == 'eV' else 1.0 for t in QM9_TARGETS}
    return torch.tensor([[raw[t] * factor[t] for t in QM9_TARGETS]])


def test_targets_units_constants():
    assert QM9_TARGETS == ('mu', 'alpha', 'homo', 'lumo', 'gap', 'r2', 'zpve', 'u0', 'u298', 'h298',
                           'g298', 'cv')
    assert set(QM9_UNITS) == set(QM9_TARGETS)
    assert QM9_UNITS['mu'] == 'D' and QM9_UNITS['alpha'] == 'a0^3' and QM9_UNITS['r2'] == 'a0^2'
    assert QM9_UNITS['cv'] == 'cal/(mol K)'
    assert [t for t in QM9_TARGETS if QM9_UNITS[t] == 'eV'
            ] == ['homo', 'lumo', 'gap', 'zpve', 'u0', 'u298', 'h298', 'g298']


def test_sdf_source_set_representation(qm9_root):
    ds = QM9(qm9_root, log=False)
    assert len(ds) == len(KEPT)
    assert [int(d.gdb_idx) for d in ds] == KEPT
    mols = qm9_molecules()
    for data in ds:
        mol = mols[int(data.gdb_idx) - 1]
        n = mol.GetNumAtoms()
        assert data.x.shape == (n, 6) and data.pos.shape == (n, 3) and data.z.shape == (n, )
        symbols = [a.GetSymbol() for a in mol.GetAtoms()]
        onehot = torch.zeros(n, 5)
        onehot[torch.arange(n), [QM9_ELEMENTS.index(s) for s in symbols]] = 1
        assert torch.equal(data.x[:, :5], onehot)
        assert data.z.tolist() == [a.GetAtomicNum() for a in mol.GetAtoms()]
        assert torch.allclose(data.pos,
                              torch.tensor(mol.GetConformer().GetPositions(), dtype=torch.float),
                              atol=1e-4)  # the SDF stores 4 decimals
        # the paper's nine atom values, as a model reads them: [pos, one-hot, charge]
        assert torch.equal(set_features(data), torch.cat([data.pos, data.x], dim=1))
        charges = data.x[:, 5]
        assert torch.isfinite(charges).all() and charges.abs().max() > 0.01
        assert charges.sum().abs().item() < 1e-4  # Gasteiger charges of a neutral molecule sum to 0
        assert data.y.shape == (1, 12)
        assert torch.allclose(data.y, expected_y(int(data.gdb_idx)), rtol=1e-6)
    assert ds.stats['num_uncharacterized_removed'] == len(QM9_UNCHARACTERIZED)
    assert ds.stats['units'] == QM9_UNITS


def test_energies_are_converted_from_hartree_to_ev(qm9_root):
    ds = QM9(qm9_root, log=False)
    raw = qm9_raw_targets(0)  # gdb_1, methane-like targets
    y = ds[0].y[0]
    assert y[QM9_TARGETS.index('u0')].item() == pytest.approx(raw['u0'] * 27.211386246, rel=1e-6)
    assert y[QM9_TARGETS.index('homo')].item() == pytest.approx(-10.5499, abs=1e-3)
    assert y[QM9_TARGETS.index('mu')].item() == pytest.approx(raw['mu'])
    assert y[QM9_TARGETS.index('r2')].item() == pytest.approx(raw['r2'], rel=1e-6)
    assert y[QM9_TARGETS.index('cv')].item() == pytest.approx(raw['cv'], rel=1e-6)


def test_charges_match_a_sanitised_rdkit_molecule(qm9_root):
    from rdkit import Chem
    from rdkit.Chem import rdPartialCharges
    ds = QM9(qm9_root, log=False)
    acetic = ds[len(ds) - 1]
    mol = Chem.Mol(qm9_molecules()[4])
    rdPartialCharges.ComputeGasteigerCharges(mol)
    expected = torch.tensor([a.GetDoubleProp('_GasteigerCharge') for a in mol.GetAtoms()])
    assert torch.allclose(acetic.x[:, 5], expected.float(), atol=1e-5)


def test_gasteiger_needs_sanitisation_and_falls_back():
    from rdkit import Chem
    from rdkit.Chem import rdPartialCharges
    raw = Chem.MolFromMolBlock(Chem.MolToMolBlock(qm9_molecules()[1]), removeHs=False,
                               sanitize=False)
    naive = Chem.Mol(raw)
    rdPartialCharges.ComputeGasteigerCharges(naive)
    assert np.isnan([a.GetDoubleProp('_GasteigerCharge') for a in naive.GetAtoms()]).all()
    charges, status = gasteiger_charges(raw)
    assert status == 'ok' and np.isfinite(charges).all() and charges[0] < 0  # N is negative
    hypervalent = Chem.MolFromSmiles('CN(C)(C)C', sanitize=False)  # fails full sanitisation
    charges, status = gasteiger_charges(hypervalent)
    assert status == 'partial_sanitization' and np.isfinite(charges).all()


def test_uncharacterized_parsing(qm9_root):
    assert read_uncharacterized(osp.join(qm9_root, 'raw',
                                         'uncharacterized.txt')) == QM9_UNCHARACTERIZED


def test_target_selection(qm9_root):
    full = QM9(qm9_root, log=False)
    two = QM9(qm9_root, target=['gap', 'mu'], log=False)
    one = QM9(qm9_root, target=QM9_TARGETS.index('alpha'), log=False)
    assert two.target_names == ['gap', 'mu'] and one.target_names == ['alpha']
    for a, b, c in zip(full, two, one):
        assert b.y.shape == (1, 2) and c.y.shape == (1, 1)
        assert torch.equal(b.y, a.y[:, [4, 0]]) and torch.equal(c.y, a.y[:, [1]])
    batch = next(
        iter(
            __import__('torch_geometric.loader',
                       fromlist=['DataLoader']).DataLoader(two, batch_size=len(two))))
    assert batch.y.shape == (len(two), 2) and batch.gdb_idx.tolist() == KEPT
    # every way PyG reads y gives the selected columns: the dataset's attribute (a fast path
    # that skips get()), a slice, a subset's, the batch (before, two.y held all 12 columns)
    every = torch.cat([a.y for a in full])  # (N, 12)
    for y in (two.y, two[:].y, two[torch.tensor([0, 1, 2, 3])].y, batch.y):
        assert torch.equal(y, every[:, [4, 0]])
    assert torch.equal(one.y, every[:, [1]]) and torch.equal(full.y, every)
    with pytest.raises(ValueError, match='unknown QM9 target'):
        QM9(qm9_root, target='energy')
    with pytest.raises(ValueError, match='index'):
        QM9(qm9_root, target=12)


def test_numpy_and_torch_integers_select_targets(qm9_root):
    # as the datasets' other integer options, any integral type: a NumPy or torch index was
    # refused as "an index in [0, 12), got np.int64(7)", and a 0-d tensor raised a TypeError
    full = QM9(qm9_root, log=False)
    for target in (np.int64(7), torch.tensor(7), np.array([7, 0]), torch.tensor([7, 0])):
        want = [7] if np.ndim(target) == 0 else [7, 0]
        ds = QM9(qm9_root, target=target, log=False)
        assert ds.target_names == [QM9_TARGETS[c] for c in want]
        assert torch.equal(ds.y, full.y[:, want])
    for bad in (np.bool_(True), torch.tensor(True), np.float64(7.0), np.int64(12)):
        with pytest.raises(ValueError, match=r'an index in \[0, 12\)'):
            QM9(qm9_root, target=bad, log=False)


def test_a_pre_transform_that_changes_the_targets_width_is_refused(qm9_root, tmp_path):
    # a y of 6 columns was read as 12 per row: target=['mu'] gave 2 rows for 4 molecules (two
    # molecules' targets as one row), target=None named 12 columns of 6
    def narrow(data):
        data.y = data.y[:, :6]
        return data
    root = str(tmp_path / 'qm9')
    shutil.copytree(qm9_root, root)
    for target in (['mu'], None):
        with pytest.raises(ValueError, match=r"holds y of shape \(4, 6\) for 4 molecules, where "
                                             r"12 targets per molecule are expected"):
            QM9(root, target=target, pre_transform=narrow, log=False, force_reload=True)

    def scaled(data):  # (the same width: taken, as before)
        data.y = 2 * data.y
        return data
    two = QM9(root, target=['mu'], pre_transform=scaled, log=False, force_reload=True)
    assert torch.equal(two.y, 2 * QM9(qm9_root, target=['mu'], log=False).y)


def test_target_stats_over_a_split(qm9_root):
    ds = QM9(qm9_root, target=['mu', 'u0'], log=False)
    index = torch.tensor([0, 2, 3])
    mean, std = ds.target_stats(index)
    ys = torch.cat([ds[int(i)].y for i in index])
    assert mean.shape == (2, ) and torch.allclose(mean, ys.mean(0)) and torch.allclose(
        std, ys.std(0, unbiased=False))
    # the statistics the trainer's normaliser fits to the same targets (the sample standard
    # deviation was returned, sqrt(3 / 2) times the normaliser's here)
    from torch_mz.train import TargetNormalizer
    fitted = TargetNormalizer().fit(ys)
    torch.testing.assert_close(mean, fitted.mean.float())
    torch.testing.assert_close(std, fitted.std.float())
    sub = ds[torch.tensor([1, 2, 3])]  # a subset view: positions refer to the view
    mean_sub, _ = sub.target_stats([0, 1])
    assert torch.allclose(mean_sub, torch.cat([ds[1].y, ds[2].y]).mean(0))
    with pytest.raises(ValueError, match='at least two'):
        ds.target_stats([0])
    # a boolean mask selects where it is True, as ds[mask] does (it was read as the rows 0, 1)
    mask = torch.zeros(len(ds), dtype=torch.bool)
    mask[index] = True
    for got, want in zip(ds.target_stats(mask), (mean, std)):
        torch.testing.assert_close(got, want)
    for got, want in zip(ds[mask].target_stats(), (mean, std)):
        torch.testing.assert_close(got, want)
    with pytest.raises(IndexError):
        ds.target_stats(torch.tensor([0.0, 2.0]))  # not truncated to rows


def test_split_protocols():
    train, val, test = split_indices(130_831, **QM9_STANDARD_SPLIT)
    assert (len(train), len(val), len(test)) == (110_000, 10_000, 10_831)
    train, val, test = split_indices(130_831, **QM9_PAPER_SPLIT)
    assert (len(train), len(val), len(test)) == (40_000, 5_000, 5_000)


def test_processed_cache_is_reused_for_any_target_selection(qm9_root, monkeypatch):
    first = QM9(qm9_root, log=False)

    def fail(self):
        raise AssertionError('process() must not run when the processed cache exists')

    monkeypatch.setattr(QM9, 'process', fail)
    cached = QM9(qm9_root, target='gap', log=False)
    assert torch.equal(cached[0].y, first[0].y[:, [4]])
    assert torch.equal(cached[1].x, first[1].x)
    with pytest.raises(AssertionError, match='must not run'):
        QM9(qm9_root, charge_failure='drop', log=False)  # another cache


def test_agrees_with_pyg_qm9(qm9_root, tmp_path):
    from torch_geometric.datasets import QM9 as PyGQM9  # reads the raw files, rdkit being installed
    pyg_root = str(tmp_path / 'pyg')
    shutil.copytree(osp.join(qm9_root, 'raw'), osp.join(pyg_root, 'raw'))
    pyg = PyGQM9(pyg_root)
    ours = QM9(qm9_root, log=False)
    assert len(pyg) == len(ours)
    for a, b in zip(pyg, ours):
        assert int(a.idx) + 1 == int(b.gdb_idx)
        assert torch.equal(a.z, b.z)
        assert torch.allclose(a.pos, b.pos)
        assert torch.allclose(a.y[:, :12], b.y, rtol=1e-6)
        assert torch.equal(a.x[:, :5], b.x[:, :5])  # PyG's first five features are the same one-hot


def test_qm9pack_source_matches_sdf_source(qm9_root, qm9pack_csv):
    sdf = QM9(qm9_root, log=False)
    pack = QM9(qm9_root, source='qm9pack', csv_path=qm9pack_csv, log=False)
    assert len(pack) == len(sdf)
    for a, b in zip(sdf, pack):
        assert int(a.gdb_idx) == int(b.gdb_idx)
        assert torch.equal(a.z, b.z)
        assert torch.allclose(a.pos, b.pos, atol=1e-4)
        assert torch.allclose(a.y, b.y, rtol=1e-6)
        # charges from bonds perceived on the coordinates equal those from the SDF's bonds
        assert torch.allclose(a.x[:, 5], b.x[:, 5], atol=1e-3)
    assert pack.stats['skipped']['counts'] == {}


def test_bond_perception_from_coordinates(capfd):
    from rdkit import Chem
    mol = qm9_molecules()[3]  # C#N
    perceived, status = mol_from_xyz([a.GetSymbol() for a in mol.GetAtoms()],
                                     mol.GetConformer().GetPositions())
    assert status == 'ok'
    assert perceived.GetBondBetweenAtoms(0, 1).GetBondType() == Chem.BondType.TRIPLE
    methyl = np.array([[0, 0, 0], [1.09, 0, 0], [-0.5, 0.94, 0], [-0.5, -0.94, 0]])
    assert mol_from_xyz(['C', 'H', 'H', 'H'],
                        methyl) == (None, 'failed')  # a radical is not neutral
    # two carbons far too close: the default connectivity fails, the extended-Hueckel one warns on
    # the C level, which must not reach the terminal
    capfd.readouterr()
    _, status = mol_from_xyz(['C', 'C'], np.array([[0, 0, 0], [0.2, 0, 0]]))
    assert status == 'hueckel_connectivity'
    assert capfd.readouterr() == ('', '')


def test_qm9pack_csv_list_of_parts(qm9pack_csv, tmp_path):
    with open(qm9pack_csv) as f:
        lines = f.read().splitlines()
    part1 = tmp_path / 'p1.csv'
    part2 = tmp_path / 'p2.csv'
    part1.write_text('\n'.join(lines[:3]) + '\n')
    part2.write_text('\n'.join([lines[0]] + lines[3:]) + '\n')
    ds = QM9(str(tmp_path / 'root'), source='qm9pack', csv_path=[str(part1), str(part2)], log=False)
    assert [int(d.gdb_idx) for d in ds] == KEPT


def test_qm9pack_csv_path_expands_home(qm9pack_csv, tmp_path, monkeypatch):
    # '~' in csv_path is the home folder, as in root (it was read as '<cwd>/~/...')
    monkeypatch.setenv('HOME', osp.dirname(qm9pack_csv))
    monkeypatch.chdir(tmp_path)
    name = osp.join('~', osp.basename(qm9pack_csv))
    for csv_path in (name, [name]):
        ds = QM9(str(tmp_path / 'root'), source='qm9pack', csv_path=csv_path, log=False)
        assert ds.csv_path == [osp.abspath(qm9pack_csv)]
        assert [int(d.gdb_idx) for d in ds] == KEPT


def test_qm9pack_csv_path_takes_a_path_object(qm9pack_csv, tmp_path):
    # a pathlib.Path was iterated as a sequence of files ("'PosixPath' object is not iterable")
    import pathlib
    for csv_path in (pathlib.Path(qm9pack_csv), [pathlib.Path(qm9pack_csv)]):
        ds = QM9(str(tmp_path / 'root'), source='qm9pack', csv_path=csv_path, log=False)
        assert ds.csv_path == [osp.abspath(qm9pack_csv)]
        assert [int(d.gdb_idx) for d in ds] == KEPT


def test_qm9pack_package_is_located_without_importing_it(monkeypatch, tmp_path):
    paths = qm9_module.qm9pack_csv_paths() if qm9_module.importlib.util.find_spec(
        'qm9pack') else None
    if paths is not None:
        assert [osp.basename(p)
                for p in paths] == ['qm9_part1.csv', 'qm9_part2.csv', 'qm9_part3.csv']
        assert all(osp.isfile(p) for p in paths)
    monkeypatch.setattr(qm9_module.importlib.util, 'find_spec', lambda name, *a: None)
    with pytest.raises(ImportError, match=r"torch_mz\[qm9\]"):
        QM9(str(tmp_path), source='qm9pack', log=False)


def test_charge_failure_policies(qm9_root, monkeypatch):
    real = qm9_module.gasteiger_charges

    def failing_for_ammonia(mol):
        if mol.GetNumAtoms() == 4 and mol.GetAtomWithIdx(0).GetSymbol() == 'N':
            return None, 'failed'
        return real(mol)

    monkeypatch.setattr(qm9_module, 'gasteiger_charges', failing_for_ammonia)
    with pytest.warns(UserWarning, match='charges_failed_set_to_zero: 1'):
        zero = QM9(qm9_root, log=False)
    assert len(zero) == len(KEPT)
    assert torch.equal(zero[1].x[:, 5], torch.zeros(4)) and int(zero[1].gdb_idx) == 2
    assert zero.stats['skipped']['examples'] == {'charges_failed_set_to_zero': ['2']}
    with pytest.warns(UserWarning, match='charges_failed_dropped: 1'):
        drop = QM9(qm9_root, charge_failure='drop', log=False)
    assert [int(d.gdb_idx) for d in drop] == [k for k in KEPT if k != 2]
    with pytest.raises(ValueError, match='charge_failure'):
        QM9(qm9_root, charge_failure='nan')


def corrupt(path: str, fn) -> None:
    with open(path) as f:
        text = f.read()
    with open(path, 'w') as f:
        f.write(fn(text))


@pytest.mark.parametrize('name, edit, match', [
    ('gdb9.sdf', lambda t: t[:len(t) // 2], r'gdb9.sdf.*holds \d molecules'),
    ('gdb9.sdf', lambda t: t[:len(t) - 30], 'gdb9.sdf.*record 5'),
    ('gdb9.sdf', lambda t: t.replace('gdb_4', 'gdb_7'), "gdb9.sdf.*'gdb_7'"),
    ('gdb9.sdf.csv', lambda t: t.replace('13.21', '13.2x', 1), 'gdb9.sdf.csv.*line 2'),
    ('gdb9.sdf.csv', lambda t: t.replace(',alpha,', ',beta,'), r"gdb9.sdf.csv.*\['alpha'\]"),
    ('gdb9.sdf.csv', lambda t: t.rsplit(',', 8)[0] + '\n', 'gdb9.sdf.csv.*line 6 is truncated'),
    # the last row cut inside its cv field (10.469): without and with a final line break
    ('gdb9.sdf.csv', lambda t: t[:t.rindex(',10.469') + 4], 'gdb9.sdf.csv.*does not end with a '
     'line break'),
    ('gdb9.sdf.csv', lambda t: t[:t.rindex(',10.469') + 4] + '\n', 'gdb9.sdf.csv.*line 6 is '
     'truncated'),
    ('gdb9.sdf.csv', lambda t: t.replace('\ngdb_2,', '\ngdb_2,0,'), 'line 3 has more fields'),
    ('gdb9.sdf.csv', lambda t: t.replace('gdb_2,', 'mol2,'), "line 3: mol_id 'mol2' is not gdb"),
    ('gdb9.sdf.csv', lambda t: t.replace('gdb_2,', 'gdb_1,'), "'gdb_1' appears more than once"),
    ('uncharacterized.txt', lambda t: 'nothing here\n', 'uncharacterized.txt.*no molecule index'),
])
def test_corrupt_sdf_source_files_are_named(qm9_root, name, edit, match):
    corrupt(osp.join(qm9_root, 'raw', name), edit)
    with pytest.raises(CorruptRawFileError, match=match):
        QM9(qm9_root, log=False)


@pytest.mark.parametrize('edit, match', [
    (lambda t: t.replace('Dipole_debye', 'Dipole'), r"\['Dipole_debye'\]"),
    (lambda t: t.replace('"InChI=1S/x",5,', '"InChI=1S/x",6,', 1), 'line 2 .*N_atoms=6'),
    (lambda t: t.rsplit(',', 5)[0] + '\n', 'line 5 is truncated'),
    (lambda t: t.rstrip('\n')[:-2], 'does not end with a line break'),  # cut in the last column
    # a coordinate that is not finite: named as a coordinate (it was 'non-finite target value')
    (lambda t: re.sub(r'\[\[[^,\]]+', '[[nan', t, count=1), 'line 2: non-finite coordinate'),
])
def test_corrupt_qm9pack_csv_is_named(qm9pack_csv, tmp_path, edit, match):
    corrupt(qm9pack_csv, edit)
    with pytest.raises(CorruptRawFileError, match=match) as info:
        QM9(str(tmp_path / 'root'), source='qm9pack', csv_path=qm9pack_csv, log=False)
    assert info.value.path == qm9pack_csv


def test_non_utf8_csv_names_the_file_and_line(qm9_root, qm9pack_csv, tmp_path):
    for path, line in ((osp.join(qm9_root, 'raw', 'gdb9.sdf.csv'), 3), (qm9pack_csv, 2)):
        with open(path, 'rb') as f:
            lines = f.read().split(b'\n')
        lines[line - 1] = lines[line - 1].replace(b',', b',\xff', 1)
        with open(path, 'wb') as f:
            f.write(b'\n'.join(lines))
    with pytest.raises(CorruptRawFileError, match=r"gdb9.sdf.csv': line 3 is not UTF-8"):
        QM9(qm9_root, log=False)
    with pytest.raises(CorruptRawFileError, match='line 2 is not UTF-8') as info:
        QM9(str(tmp_path / 'root'), source='qm9pack', csv_path=qm9pack_csv, log=False)
    assert info.value.path == qm9pack_csv


def test_gdb_idx_is_the_qm9_index_of_the_molecule_name(tmp_path):
    root = str(tmp_path / 'QM9')
    write_gdb9(osp.join(root, 'raw'), first_index=29)  # an excerpt: gdb_29 ... gdb_33
    ds = QM9(root, log=False)
    assert [int(d.gdb_idx) for d in ds] == [29, 30, 32, 33]  # gdb_31 is uncharacterized
    assert ds.stats['num_uncharacterized_removed'] == 1
    mols = qm9_molecules(29)
    for data in ds:
        k = int(data.gdb_idx)
        assert data.z.tolist() == [a.GetAtomicNum() for a in mols[k - 29].GetAtoms()]
        assert torch.allclose(data.y, expected_y(k - 28), rtol=1e-6)  # row k - 28 of the CSV


def _sdf_cache(root):
    return [osp.join(root, 'processed', 'sdf_pos-only', name) for name in ('data.pt', 'stats.json')]


def _same_dataset(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x.x, y.x) and torch.equal(x.y, y.y) and torch.equal(x.gdb_idx,
                                                                                y.gdb_idx)


@pytest.mark.parametrize('name, damage, legacy, match', [
    # what an interrupted force_reload left before writes were atomic, in a cache whose
    # stats.json does not record the file sizes (as written before) and in one that does
    ('data.pt', lambda b: b'', True, "data.pt' cannot be read: it is empty, truncated"),
    ('data.pt', lambda b: b'', False, r"data.pt' has 0 bytes but '.*stats.json' records \d+"),
    ('data.pt', lambda b: b[:len(b) // 2], True, "data.pt' cannot be read"),
    ('stats.json', lambda b: b[:len(b) // 2], False, "stats.json' is truncated or not JSON"),
    ('stats.json', lambda b: b.replace(b'"num_molecules": 4', b'"num_molecules": 3'), False,
     "data.pt' holds 4 molecules but '.*stats.json' records 3"),
])
def test_broken_processed_cache_is_named_and_rebuilt(qm9_root, name, damage, legacy, match):
    first = QM9(qm9_root, log=False)
    data_pt, stats_json = _sdf_cache(qm9_root)
    if legacy:
        stats = json.load(open(stats_json))
        del stats['processed_files']
        json.dump(stats, open(stats_json, 'w'))
    path = data_pt if name == 'data.pt' else stats_json
    with open(path, 'rb') as f:
        good = f.read()
    with open(path, 'wb') as f:
        f.write(damage(good))
    with pytest.warns(UserWarning, match=f"Processed file '.*{match}.*; rebuilding"):
        again = QM9(qm9_root, log=False)
    _same_dataset(again, first)
    assert again.stats['num_molecules'] == len(first)
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        QM9(qm9_root, log=False)  # the rebuilt cache loads without a warning


@pytest.mark.parametrize('recorded', [None, 0, '1'])
def test_cache_of_another_processing_version_is_rebuilt(qm9_root, recorded, monkeypatch):
    # a cache built before a fix to the processing (here: a cut-short uncharacterized.txt,
    # which this release refuses) is not used as it is: rebuilt, the fix reaches it
    first = QM9(qm9_root, log=False)
    _, stats_json = _sdf_cache(qm9_root)
    version = QM9.processing_version
    assert first.stats['processing_version'] == version >= 2
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        assert len(QM9(qm9_root, log=False)) == len(first)  # this version's cache: reused
    # (a changed raw file is itself seen since version 2: the version is checked first)
    corrupt(osp.join(qm9_root, 'raw', 'uncharacterized.txt'), lambda t: 'nothing here\n')
    stats = json.load(open(stats_json))
    if recorded is None:
        del stats['processing_version']  # (releases before versions were recorded)
    else:
        stats['processing_version'] = recorded
    json.dump(stats, open(stats_json, 'w'))
    built_by = ('recorded no processing version' if recorded is None else
                f'processing version {recorded!r}')
    with pytest.warns(UserWarning, match=f"built by a?.*{re.escape(built_by)}.*version "
                      f"{version}: rebuilding them from the raw files"):
        with pytest.raises(CorruptRawFileError, match='uncharacterized.txt'):
            QM9(qm9_root, log=False)
    write_gdb9(osp.join(qm9_root, 'raw'))  # intact raw files again: rebuilt and recorded
    with pytest.warns(UserWarning, match='rebuilding them from the raw files'):
        again = QM9(qm9_root, log=False)
    _same_dataset(again, first)
    assert json.load(open(stats_json))['processing_version'] == version
    monkeypatch.setattr(QM9, 'process', lambda self: pytest.fail('the cache must be reused'))
    assert len(QM9(qm9_root, log=False)) == len(first)


def test_the_cache_records_the_rdkit_version_and_names_another_one(qm9_root, monkeypatch):
    # the charges (and, from qm9pack's coordinates, the bonds) are RDKit's: a cache recorded
    # no version, so one built by another RDKit was read as this one's without a word
    import rdkit
    first = QM9(qm9_root, log=False)
    _, stats_json = _sdf_cache(qm9_root)
    stats = json.load(open(stats_json))
    assert stats['parser_versions'] == {'rdkit': rdkit.__version__}
    monkeypatch.setattr(QM9, 'process', lambda self: pytest.fail('the cache must be used'))
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        QM9(qm9_root, log=False)  # the same version: not a word
    stats['parser_versions'] = {'rdkit': '2019.03.1'}
    json.dump(stats, open(stats_json, 'w'))
    with pytest.warns(UserWarning, match=rf"made with rdkit 2019\.03\.1 \(installed: "
                      rf"{re.escape(rdkit.__version__)}\): they are used as they are.*"
                      rf"force_reload=True"):
        again = QM9(qm9_root, log=False)  # used as it is, not rebuilt
    _same_dataset(again, first)
    del stats['parser_versions']  # a cache built before the versions were recorded
    json.dump(stats, open(stats_json, 'w'))
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        _same_dataset(QM9(qm9_root, log=False), first)


def test_processed_file_with_a_changed_bit_is_rebuilt(qm9_root):
    first = QM9(qm9_root, log=False)
    data_pt, _ = _sdf_cache(qm9_root)
    name = flip_bit_in_record(data_pt, 'data/0')  # same size: torch.load would read it
    with pytest.warns(UserWarning, match=f"data.pt' cannot be read as written: its record "
                      f"'{name}' does not read back as written.*; rebuilding"):
        again = QM9(qm9_root, log=False)
    _same_dataset(again, first)


def test_data_pt_of_another_processing_run_is_detected(qm9_root):
    first = QM9(qm9_root, log=False)
    data_pt, _ = _sdf_cache(qm9_root)
    QM9.save([first[0], first[1], first[2]], data_pt)  # a valid file, but not the one stats.json
    with pytest.warns(UserWarning, match=r"data.pt' has \d+ bytes but .*stats.json' records"):
        again = QM9(qm9_root, log=False)
    _same_dataset(again, first)


def test_processed_files_are_written_atomically(qm9_root, monkeypatch):
    QM9(qm9_root, log=False)
    paths = _sdf_cache(qm9_root)
    before = {p: open(p, 'rb').read() for p in paths}

    def interrupted_save(obj, f, *args, **kwargs):
        f.write(b'half a file')
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, 'save', interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        QM9(qm9_root, log=False, force_reload=True)
    monkeypatch.undo()
    assert {p: open(p, 'rb').read() for p in paths} == before  # the old cache, untouched
    assert sorted(os.listdir(osp.dirname(paths[0]))) == [
        'data.pt', 'pre_filter.pt', 'pre_transform.pt', 'stats.json']  # no temporary file
    monkeypatch.setattr(QM9, 'process', lambda self: pytest.fail('the cache must be reused'))
    assert len(QM9(qm9_root, log=False)) == len(KEPT)


@pytest.mark.parametrize('name', ['data.pt', 'pre_transform.pt'])
def test_crafted_pickle_in_the_processed_folder_is_refused_and_never_run(qm9_root, tmp_path,
                                                                          name):
    QM9(qm9_root, log=False)
    path = osp.join(qm9_root, 'processed', 'sdf_pos-only', name)
    marker = str(tmp_path / 'code-ran')
    write_crafted_pickle(path, marker)
    stats_json = osp.join(qm9_root, 'processed', 'sdf_pos-only', 'stats.json')
    stats = json.load(open(stats_json))  # as one who replaces data.pt would make it fit
    stats['processed_files'] = {'data.pt': osp.getsize(osp.join(osp.dirname(path), 'data.pt'))}
    json.dump(stats, open(stats_json, 'w'))
    with pytest.raises(ProcessedFileError, match=f"'{path}' holds objects other than tensors"
                       ) as info:
        QM9(qm9_root, log=False)
    assert info.value.unsafe and 'Delete it' in str(info.value)
    assert not osp.exists(marker)
    assert osp.getsize(path) > 0  # left in place for the user to look at
    # force_reload rebuilds the cache without reading the file
    assert len(QM9(qm9_root, log=False, force_reload=True)) == len(KEPT)
    assert not osp.exists(marker)
    assert len(QM9(qm9_root, log=False)) == len(KEPT)


def test_invalid_arguments(tmp_path, qm9pack_csv):
    with pytest.raises(ValueError, match='source'):
        QM9(str(tmp_path), source='xyz')
    with pytest.raises(ValueError, match='csv_path'):
        QM9(str(tmp_path), source='sdf', csv_path=qm9pack_csv)


@pytest.mark.parametrize('kwargs, name', [
    # the text 'False' is true: the cache was rebuilt on every open, without a word
    (dict(force_reload='False', log=False), 'force_reload'),
    (dict(log='False'), 'log'),  # (the progress bars shown)
    (dict(log=2), 'log'),
])
def test_flags_that_are_no_truth_values_are_refused(qm9_root, kwargs, name):
    with pytest.raises(ValueError, match=f"'{name}' must be True or False"):
        QM9(qm9_root, **kwargs)
    assert not osp.exists(osp.join(qm9_root, 'processed'))  # refused before processing


@pytest.mark.parametrize('csv_path', [[], '', [None], 'folder'])
def test_a_csv_path_that_names_no_file_is_refused(tmp_path, csv_path):
    # the bug: [] said "missing CSV file(s) []", '' read the working directory ("Is a
    # directory"), [None] was a TypeError and a folder an IsADirectoryError while processing
    if csv_path == 'folder':
        csv_path = str(tmp_path)
    with pytest.raises(ValueError, match="'csv_path' (must name one or more CSV files|names "
                       "the folder)"):
        QM9(str(tmp_path / 'QM9'), source='qm9pack', csv_path=csv_path, log=False)
    assert not (tmp_path / 'QM9').exists()  # refused before any folder is made


@pytest.mark.parametrize('twice', ['same', 'dot', 'path', 'symlink', 'hardlink'])
def test_a_csv_file_named_twice_is_refused(tmp_path, qm9pack_csv, twice):
    # the bug: its molecules were read twice, and processing said "Corrupt raw file '...':
    # line 2: duplicate Index 1. Delete it and fetch it again" of a sound file (of a file named
    # again through a link, after the names alone were compared)
    import pathlib
    other = {'same': qm9pack_csv, 'path': pathlib.Path(qm9pack_csv),
             'dot': osp.join(osp.dirname(qm9pack_csv), '.', osp.basename(qm9pack_csv)),
             'symlink': str(tmp_path / 'link.csv'), 'hardlink': str(tmp_path / 'hard.csv')}[twice]
    if twice == 'symlink':
        os.symlink(qm9pack_csv, other)
    elif twice == 'hardlink':
        os.link(qm9pack_csv, other)
    with pytest.raises(ValueError, match="'csv_path' names the file '.*' twice"):
        QM9(str(tmp_path / 'QM9'), source='qm9pack', csv_path=[qm9pack_csv, other], log=False)
    assert not (tmp_path / 'QM9').exists()  # refused before any folder is made


def test_a_molecule_under_two_fallbacks_is_counted_once(qm9_root, qm9pack_csv, monkeypatch):
    # the bug: bonds that failed, then charges set to zero, were "2 record(s) skipped or handled
    # by a fallback" for one molecule
    real = qm9_module.mol_from_xyz

    def failing_for_ammonia(symbols, pos):
        return (None, 'failed') if list(symbols) == ['N', 'H', 'H', 'H'] else real(symbols, pos)

    monkeypatch.setattr(qm9_module, 'mol_from_xyz', failing_for_ammonia)
    with pytest.warns(UserWarning, match=r': 1 record\(s\) skipped or handled by a fallback '
                      r'\(bonds_failed: 1, charges_failed_set_to_zero: 1\)'):
        ds = QM9(qm9_root, source='qm9pack', csv_path=qm9pack_csv, log=False)
    assert len(ds) == len(KEPT)
    assert ds.stats['skipped']['examples'] == {'bonds_failed': ['2'],
                                               'charges_failed_set_to_zero': ['2']}


def test_the_split_is_the_same_on_both_sources_and_drop_is_documented(qm9_root, qm9pack_csv):
    sdf = QM9(qm9_root, log=False)
    pack = QM9(qm9_root, source='qm9pack', csv_path=qm9pack_csv, log=False)
    for part_sdf, part_pack in zip(split_indices(len(sdf), 1, 1, seed=3),
                                   split_indices(len(pack), 1, 1, seed=3)):
        assert ([int(sdf[int(i)].gdb_idx) for i in part_sdf]
                == [int(pack[int(i)].gdb_idx) for i in part_pack])
    # 'drop' leaves fewer molecules, and a split is drawn over positions: said where it is chosen
    doc = ' '.join(QM9.__doc__.split())
    assert 'the same seed then draws another split altogether' in doc


@pytest.mark.slow
def test_full_offline_qm9_from_the_installed_package(tmp_path):
    if qm9_module.importlib.util.find_spec('qm9pack') is None:  # optional, not a test dependency
        pytest.skip('qm9pack is not installed')
    ds = QM9(str(tmp_path), source='qm9pack', log=False)
    assert len(ds) == 130_831
    assert torch.isfinite(ds._data.x).all()
    counts = ds.stats['skipped']['counts']
    assert counts.get('charges_failed_set_to_zero', 0) < 10
    with open(qm9_module.qm9pack_csv_paths()[0], newline='') as f:
        row = next(csv.DictReader(f))
    assert int(row['Index']) == int(ds[0].gdb_idx) == 1
    assert ds[0].y[0, QM9_TARGETS.index('u0')].item() == pytest.approx(
        float(row['InternalEnergy_0K_au']) * HARTREE_TO_EV, rel=1e-6)


def test_missing_rdkit_names_the_pip_extra(qm9_root, monkeypatch):
    import sys
    for name in [m for m in sys.modules if m == 'rdkit' or m.startswith('rdkit.')]:
        monkeypatch.setitem(sys.modules, name, None)  # makes 'import rdkit...' raise ImportError
    monkeypatch.setitem(sys.modules, 'rdkit', None)
    with pytest.raises(ImportError, match=r"torch_mz\[datasets\]"):
        QM9(qm9_root, log=False)


def test_download_fetches_archive_and_uncharacterized_list(tmp_path, monkeypatch):
    import zipfile

    from tests.datasets.raw_formats import write_gdb9
    source = write_gdb9(str(tmp_path / 'source'))['raw_dir']
    urls = []

    def fake_download_url(url, folder, log=True):
        urls.append(url)
        if url.endswith('qm9.zip'):
            path = osp.join(folder, 'qm9.zip')
            with zipfile.ZipFile(path, 'w') as z:
                for name in ('gdb9.sdf', 'gdb9.sdf.csv'):
                    z.write(osp.join(source, name), name)
            return path
        return shutil.copy(osp.join(source, 'uncharacterized.txt'),
                           osp.join(folder,
                                    url.rsplit('/', 1)[1]))

    monkeypatch.setattr(qm9_module, 'download_url', fake_download_url)
    root = str(tmp_path / 'QM9')
    ds = QM9(root, log=False)
    assert urls == [QM9.raw_url, QM9.uncharacterized_url]
    assert sorted(os.listdir(osp.join(
        root, 'raw'))) == ['gdb9.sdf', 'gdb9.sdf.csv', 'uncharacterized.txt']
    assert [int(d.gdb_idx) for d in ds] == KEPT

    # a download stopped half way leaves no qm9.zip in raw/ (it would be taken for a placed
    # archive): the next start downloads again
    def stopped_download(url, folder, log=True):
        with open(osp.join(folder, 'qm9.zip'), 'wb') as f:
            f.write(b'PK half an archive')
        raise KeyboardInterrupt

    monkeypatch.setattr(qm9_module, 'download_url', stopped_download)
    again = str(tmp_path / 'again')
    with pytest.raises(KeyboardInterrupt):
        QM9(again, log=False)
    assert os.listdir(osp.join(again, 'raw')) == []
    monkeypatch.setattr(qm9_module, 'download_url', fake_download_url)
    assert [int(d.gdb_idx) for d in QM9(again, log=False)] == KEPT


def test_missing_uncharacterized_list_is_fetched_alone(qm9_root, tmp_path, monkeypatch):
    raw = osp.join(qm9_root, 'raw')
    source = shutil.copy(osp.join(raw, 'uncharacterized.txt'), str(tmp_path / 'list.txt'))
    os.unlink(osp.join(raw, 'uncharacterized.txt'))
    placed = {n: open(osp.join(raw, n), 'rb').read() for n in ('gdb9.sdf', 'gdb9.sdf.csv')}
    urls = []

    def fake_download_url(url, folder, log=True):
        urls.append(url)
        return shutil.copy(source, osp.join(folder, url.rsplit('/', 1)[1]))

    monkeypatch.setattr(qm9_module, 'download_url', fake_download_url)
    ds = QM9(qm9_root, log=False)
    assert urls == [QM9.uncharacterized_url]  # not the archive, which would extract over them
    assert {n: open(osp.join(raw, n), 'rb').read() for n in placed} == placed
    assert sorted(os.listdir(raw)) == ['gdb9.sdf', 'gdb9.sdf.csv', 'uncharacterized.txt']
    assert [int(d.gdb_idx) for d in ds] == KEPT


def test_one_of_the_aligned_files_missing_downloads_nothing(qm9_root, monkeypatch):
    raw = osp.join(qm9_root, 'raw')
    os.unlink(osp.join(raw, 'gdb9.sdf.csv'))
    os.unlink(osp.join(raw, 'uncharacterized.txt'))
    sdf = open(osp.join(raw, 'gdb9.sdf'), 'rb').read()
    monkeypatch.setattr(qm9_module, 'download_url',
                        lambda *args, **kwargs: pytest.fail('nothing may be downloaded'))
    with pytest.raises(FileNotFoundError, match=r"holds gdb9.sdf but not gdb9.sdf.csv, "
                       r"uncharacterized.txt\. .*nothing is downloaded over the file you placed"):
        QM9(qm9_root, log=False)
    assert open(osp.join(raw, 'gdb9.sdf'), 'rb').read() == sdf
    assert sorted(os.listdir(raw)) == ['gdb9.sdf']


def test_placed_archive_is_used_and_a_truncated_one_is_named(qm9_root, tmp_path):
    import zipfile
    source = osp.join(qm9_root, 'raw')
    raw = str(tmp_path / 'mine' / 'raw')
    os.makedirs(raw)
    shutil.copy(osp.join(source, 'uncharacterized.txt'), raw)
    archive = osp.join(raw, 'qm9.zip')  # placed by hand: PyG's download_url uses it as it is
    with zipfile.ZipFile(archive, 'w') as z:
        for name in ('gdb9.sdf', 'gdb9.sdf.csv'):
            z.write(osp.join(source, name), name)
    good = open(archive, 'rb').read()
    with open(archive, 'wb') as f:
        f.write(good[:len(good) // 2])
    with pytest.raises(CorruptRawFileError, match="qm9.zip': not a complete zip archive"):
        QM9(str(tmp_path / 'mine'), log=False)
    assert sorted(os.listdir(raw)) == ['qm9.zip', 'uncharacterized.txt']
    with open(archive, 'wb') as f:
        f.write(good)
    assert [int(d.gdb_idx) for d in QM9(str(tmp_path / 'mine'), log=False)] == KEPT
    assert sorted(os.listdir(raw)) == ['gdb9.sdf', 'gdb9.sdf.csv', 'uncharacterized.txt']


def test_failed_download_names_what_is_missing_and_where(tmp_path, monkeypatch):
    monkeypatch.setattr(qm9_module, 'download_url', offline_download_url)
    root = str(tmp_path / 'QM9')
    with pytest.raises(FileNotFoundError) as info:
        QM9(root, log=False)
    message = str(info.value)
    for part in ('gdb9.sdf, gdb9.sdf.csv, uncharacterized.txt missing', osp.join(root, 'raw'),
                 QM9.raw_url, 'no network', "source='qm9pack'"):
        assert part in message
    assert '\n' not in message and os.listdir(osp.join(root, 'raw')) == []


def test_docstring_documents_every_argument():
    import inspect
    params = [p for p in inspect.signature(QM9.__init__).parameters if p != 'self']
    assert [p for p in params if f'{p} (' not in QM9.__doc__] == []


@pytest.mark.parametrize('cut, match', [
    # cut after an entry: the closing rule is missing (a download cut short arrives without
    # an error: http.client returns the bytes it got)
    (lambda lines: lines[:-1], 'no closing rule'),
    # cut inside the index of the last entry ('3' of ' 37 ...' would remove molecule 3)
    (lambda lines: lines[:-2] + [lines[-2][:7]], 'line 10 is not a complete entry'),
])
def test_a_truncated_uncharacterized_list_is_refused(qm9_root, cut, match):
    from tests.datasets.raw_formats import write_uncharacterized
    path = write_uncharacterized(osp.join(qm9_root, 'raw', 'uncharacterized.txt'), [37])
    assert read_uncharacterized(path) == [37]
    with open(path) as f:
        lines = f.read().split('\n')[:-1]  # the file ends with a line break
    with open(path, 'w') as f:
        f.write('\n'.join(cut(lines)))
    with pytest.raises(CorruptRawFileError, match=match) as info:
        read_uncharacterized(path)
    assert info.value.path == path
    with pytest.raises(CorruptRawFileError, match=match):
        QM9(qm9_root, log=False)  # not a dataset that keeps molecules it should remove


def test_a_qm9pack_molecule_without_atoms_is_refused(qm9pack_csv, tmp_path):
    with open(qm9pack_csv, newline='') as f:
        rows = list(csv.reader(f))
    n_atoms = rows[0].index('N_atoms')
    rows[2][n_atoms: n_atoms + 3] = ['0', '[]', '[]']  # N_atoms, Stoichiometry, Elements
    rows[2][rows[0].index('XYZ_Ang')] = '[]'
    with open(qm9pack_csv, 'w', newline='') as f:
        csv.writer(f, lineterminator='\n').writerows(rows)
    with pytest.raises(CorruptRawFileError, match=r'line 3 \(Index 2\): N_atoms=0'):
        QM9(str(tmp_path / 'root'), source='qm9pack', csv_path=qm9pack_csv, log=False)


def test_an_extraction_stopped_between_its_moves_is_done_again(qm9_root, tmp_path):
    import zipfile
    raw = str(tmp_path / 'stopped' / 'raw')
    os.makedirs(raw)
    stopped_zip = str(tmp_path / 'archive')
    os.makedirs(stopped_zip)
    with zipfile.ZipFile(osp.join(stopped_zip, 'qm9.zip'), 'w') as z:
        for name in ('gdb9.sdf', 'gdb9.sdf.csv'):
            z.write(osp.join(qm9_root, 'raw', name), name)
    shutil.copy(osp.join(stopped_zip, 'qm9.zip'), raw)
    shutil.copy(osp.join(qm9_root, 'raw', 'uncharacterized.txt'), raw)
    # what _download_raw leaves when stopped after moving gdb9.sdf out of its staging folder
    # (the archive is removed only after both moves)
    shutil.copy(osp.join(qm9_root, 'raw', 'gdb9.sdf'), raw)
    ds = QM9(osp.dirname(raw), log=False)
    assert [int(d.gdb_idx) for d in ds] == KEPT
    assert sorted(os.listdir(raw)) == ['gdb9.sdf', 'gdb9.sdf.csv', 'uncharacterized.txt']
    # a gdb9.sdf placed by hand (not the archive's: another size) is not replaced
    placed = str(tmp_path / 'placed' / 'raw')
    os.makedirs(placed)
    for name in ('qm9.zip', 'uncharacterized.txt'):
        shutil.copy(osp.join(raw if name != 'qm9.zip' else stopped_zip, name), placed)
    with open(osp.join(placed, 'gdb9.sdf'), 'w') as f:
        f.write('my own file\n')
    with pytest.raises(FileNotFoundError, match='nothing is downloaded over the file you placed'):
        QM9(osp.dirname(placed), log=False)
    assert open(osp.join(placed, 'gdb9.sdf')).read() == 'my own file\n'


def test_a_cache_made_with_another_pre_transform_is_rebuilt(qm9_root, monkeypatch):
    # PyG warns and uses the cache as it is: a run recorded a pre_transform never applied
    from torch_geometric.transforms import LinearTransformation
    double = LinearTransformation(2 * torch.eye(3))
    plain = QM9(qm9_root, log=False)
    with pytest.warns(UserWarning, match=r"(?s)made with pre_transform=None, not "
                      r"pre_transform=LinearTransformation\(.*\): rebuilding them"):
        doubled = QM9(qm9_root, log=False, pre_transform=double)
    for a, b in zip(plain, doubled):
        torch.testing.assert_close(b.pos, 2 * a.pos)
    monkeypatch.setattr(QM9, 'process', lambda self: pytest.fail('the cache must be reused'))
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        assert len(QM9(qm9_root, log=False, pre_transform=double)) == len(plain)


def test_target_stats_are_the_normalisers_for_a_constant_target(qm9_root):
    # a target of one value over the molecules: the normaliser divides by 1, target_stats gave
    # a standard deviation of 0 (a hand normalisation with it divided by zero)
    from torch_mz.train import TargetNormalizer

    def constant_mu(data):
        data.y = data.y.clone()
        data.y[:, 0] = 2.5
        return data
    ds = QM9(qm9_root, target=['mu', 'u0'], pre_transform=constant_mu, log=False)
    mean, std = ds.target_stats()
    fitted = TargetNormalizer().fit(ds.y)
    assert mean.dtype == std.dtype == ds.y.dtype
    torch.testing.assert_close(mean, fitted.mean.to(ds.y.dtype), rtol=0, atol=0)
    torch.testing.assert_close(std, fitted.std.to(ds.y.dtype), rtol=0, atol=0)
    assert std[0] == 1 and mean[0] == 2.5


@pytest.mark.parametrize('target', [None, 'mu', ['u0', 'mu']])
def test_target_stats_of_a_copy_are_those_of_its_molecules(qm9_root, target):
    # PyG's copy() collates the copied molecules alone: the targets kept beside the data (all
    # 12 of every molecule of the dataset copied) gave the statistics of its first rows
    ds = QM9(qm9_root, target=target, log=False)
    index = torch.tensor([2, 3])
    expected = ds[index].target_stats()
    ys = torch.cat([ds[int(i)].y for i in index])
    torch.testing.assert_close(expected, (ys.mean(0), ys.std(0, unbiased=False)))
    for copy in (ds[index].copy(), ds.copy(index), ds.copy(index.tolist())):
        torch.testing.assert_close(copy.target_stats(), expected)
        torch.testing.assert_close(copy.target_stats([1, 0]), expected)
    full = ds.copy()
    torch.testing.assert_close(full.target_stats(), ds.target_stats())
    torch.testing.assert_close(full.target_stats(index), expected)
    # nothing per molecule beside the data: a copy holds its own molecules only
    for name, value in vars(ds.copy(index)).items():
        if isinstance(value, torch.Tensor):
            assert value.size(0) != len(ds) or len(ds) == len(index), name


def test_an_sdf_record_without_atoms_is_refused(qm9_root):
    path = osp.join(qm9_root, 'raw', 'gdb9.sdf')
    records = open(path).read().split('$$$$\n')
    records[1] = ('gdb_2\n     RDKit          3D\n\n  0  0  0  0  0  0  0  0  0  0999 V2000\n'
                  'M  END\n')
    with open(path, 'w') as f:
        f.write('$$$$\n'.join(records))
    with pytest.raises(CorruptRawFileError, match=r"gdb9.sdf.*record 2 \('gdb_2'\) is a "
                       r"molecule without atoms") as info:
        QM9(qm9_root, log=False)
    assert info.value.path == path


def test_an_edited_csv_file_rebuilds_the_cache(qm9pack_csv, tmp_path, monkeypatch):
    root = str(tmp_path / 'root')
    first = QM9(root, source='qm9pack', csv_path=qm9pack_csv, log=False)
    stats = first.stats['raw_files']
    assert list(stats) == [qm9pack_csv] and stats[qm9pack_csv][1].startswith('sha1:')
    # the same size, another dipole moment of the first molecule
    corrupt(qm9pack_csv, lambda t: t.replace(',0.0,13.21,', ',0.7,13.21,', 1))
    assert osp.getsize(qm9pack_csv) == stats[qm9pack_csv][0]
    with pytest.warns(UserWarning, match=f"are not those they were built from \\(changed in size, "
                      f"contents or modification time: {re.escape(qm9pack_csv)}\\): rebuilding"):
        again = QM9(root, source='qm9pack', csv_path=qm9pack_csv, log=False)
    assert float(again[0].y[0, 0]) == pytest.approx(0.7) and float(first[0].y[0, 0]) == 0.0
    monkeypatch.setattr(QM9, 'process', lambda self: pytest.fail('the cache must be reused'))
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        QM9(root, source='qm9pack', csv_path=qm9pack_csv, log=False)


def test_sdf_raw_files_are_fingerprinted_by_name(qm9_root):
    ds = QM9(qm9_root, log=False)
    assert sorted(ds.stats['raw_files']) == ['gdb9.sdf', 'gdb9.sdf.csv', 'uncharacterized.txt']
    corrupt(osp.join(qm9_root, 'raw', 'uncharacterized.txt'), lambda t: t + '\n')
    with pytest.warns(UserWarning, match=r'changed in size, contents or modification time: uncharacterized.txt'):
        QM9(qm9_root, log=False)


@pytest.mark.parametrize('edit, match', [
    # a blank line after the header, and a malformed number on the next row: its line is 3
    (lambda t: t.replace('\n', '\n\n', 1).replace('13.21', '13.2x', 1),
     r'line 3: malformed number'),
    # blank lines before the fourth row, whose mol_id is malformed
    (lambda t: t.replace('\ngdb_4,', '\n\n\n\nmol4,'), r"line 8: mol_id 'mol4' is not gdb"),
])
def test_sdf_csv_errors_name_the_line_of_the_file_after_blank_lines(qm9_root, edit, match):
    # the rows read were counted (enumerate from 2), not the lines: csv skips blank lines
    path = osp.join(qm9_root, 'raw', 'gdb9.sdf.csv')
    corrupt(path, edit)
    with open(path) as f:  # (the line the message names holds what is wrong)
        lines = f.read().split('\n')
    number = int(re.search(r'line (\d+)', match).group(1))
    assert '13.2x' in lines[number - 1] or 'mol4' in lines[number - 1]
    with pytest.raises(CorruptRawFileError, match=match):
        QM9(qm9_root, log=False)


def test_qm9pack_csv_errors_name_the_line_of_the_file_after_a_blank_line(qm9pack_csv,
                                                                         tmp_path):
    import csv
    import io
    with open(qm9pack_csv) as f:
        lines = f.read().splitlines(True)
    header = next(csv.reader([lines[0]]))
    row = next(csv.reader([lines[4]]))  # the fourth data row
    row[header.index('Dipole_debye')] = '1.5x'
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_NONNUMERIC, lineterminator='\n').writerow(row)
    lines[4] = out.getvalue().replace('"1.5x"', '1.5x')
    lines.insert(1, '\n')  # a blank line after the header: the row is on line 6
    with open(qm9pack_csv, 'w') as f:
        f.writelines(lines)
    assert [n for n, line in enumerate(open(qm9pack_csv), 1) if '1.5x' in line] == [6]
    with pytest.raises(CorruptRawFileError, match=r'line 6: malformed number'):
        QM9(str(tmp_path / 'root'), source='qm9pack', csv_path=qm9pack_csv, log=False)


def test_csv_rows_skip_a_utf8_byte_order_mark(tmp_path):
    # a gdb9.sdf.csv saved by a spreadsheet program begins with a BOM: its first column read as
    # '\ufeffmol_id', and the file was refused for a missing 'mol_id' column
    from torch_mz.datasets.qm9 import _csv_rows
    path = tmp_path / 'gdb9.sdf.csv'
    path.write_bytes('\ufeffmol_id,mu\ngdb_1,0.5\n\ngdb_2,1.5\n'.encode('utf-8'))
    rows = list(_csv_rows(str(path), ['mol_id', 'mu']))
    assert rows == [(2, {'mol_id': 'gdb_1', 'mu': '0.5'}), (4, {'mol_id': 'gdb_2', 'mu': '1.5'})]
