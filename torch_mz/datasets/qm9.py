r"""QM9 as a dataset of atom sets (MZAttn paper, Appendix A.2, Task H and Appendix D.5.2)."""
import contextlib
import csv
import ctypes
import hashlib
import importlib.util
import os
import os.path as osp
import re
import shutil
import sys
import tempfile
import zipfile
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data, download_url, extract_zip
from tqdm import tqdm

from torch_mz._optional import require
from torch_mz.datasets.common import (
    CorruptRawFileError,
    ProcessedDataset,
    ProcessedFileError,
    SkipCounter,
    check_integer,
    check_processed_sizes,
    default_root,
    fingerprint_files,
    load_stats,
)

IndexLike = Union[Tensor, Sequence[int]]

#: The 12 standard regression targets, in the order of :obj:`y`'s columns.
QM9_TARGETS: Tuple[str, ...] = ('mu', 'alpha', 'homo', 'lumo', 'gap', 'r2', 'zpve', 'u0', 'u298',
                                'h298', 'g298', 'cv')

#: Units of the targets in :obj:`y` (energies in eV, as :class:`torch_geometric.datasets.QM9`).
QM9_UNITS: Dict[str, str] = {
    'mu': 'D',  # dipole moment, Debye
    'alpha': 'a0^3',  # isotropic polarizability, cubic Bohr
    'homo': 'eV',
    'lumo': 'eV',
    'gap': 'eV',
    'r2': 'a0^2',  # electronic spatial extent, squared Bohr
    'zpve': 'eV',
    'u0': 'eV',
    'u298': 'eV',
    'h298': 'eV',
    'g298': 'eV',
    'cv': 'cal/(mol K)',  # heat capacity at 298.15 K
}

#: Hartree in eV (CODATA 2018; the factor :class:`torch_geometric.datasets.QM9` uses).
HARTREE_TO_EV = 27.211386246
# the targets that both raw sources give in Hartree
_HARTREE_TARGETS = ('homo', 'lumo', 'gap', 'zpve', 'u0', 'u298', 'h298', 'g298')
_TO_UNITS = np.array([HARTREE_TO_EV if t in _HARTREE_TARGETS else 1.0 for t in QM9_TARGETS])

#: Elements of QM9, in the order of the one-hot part of :obj:`x`.
QM9_ELEMENTS: Tuple[str, ...] = ('H', 'C', 'N', 'O', 'F')
_ATOMIC_NUMBER = {'H': 1, 'C': 6, 'N': 7, 'O': 8, 'F': 9}

QM9_RAW_URL = 'https://deepchemdata.s3-us-west-1.amazonaws.com/datasets/molnet_publish/qm9.zip'
QM9_UNCHARACTERIZED_URL = 'https://ndownloader.figshare.com/files/3195404'

#: Columns of the CSV files of the ``qm9pack`` package holding the targets, in :data:`QM9_TARGETS`
#: order (Debye, Bohr^3, Hartree, Bohr^2, cal/(mol K), as the original QM9 release).
QM9PACK_TARGET_COLUMNS: Tuple[str, ...] = ('Dipole_debye', 'Polarizability_bohr3', 'HOMO_au',
                                           'LUMO_au', 'HOMO_LUMO_gap_au', 'R2_bohr2', 'ZPVE_au',
                                           'InternalEnergy_0K_au', 'InternalEnergy_298K_au',
                                           'Enthalphy_298K_au', 'GibbsFreeEnergy_298K_au',
                                           'Heatcapacity_Cv_cal_mol_K')
QM9PACK_FILES: Tuple[str, ...] = ('qm9_part1.csv', 'qm9_part2.csv', 'qm9_part3.csv')


def qm9pack_csv_paths() -> List[str]:
    r"""The QM9 CSV files shipped in the installed ``qm9pack`` package (located without importing
    it: its ``__init__`` needs pandas and ``pkg_resources``)."""
    spec = importlib.util.find_spec('qm9pack')
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("The offline QM9 source (source='qm9pack') reads the CSV files of the "
                          "'qm9pack' package, which is not installed. Install it with: "
                          "pip install 'torch_mz[qm9]' (or pass csv_path=... to a CSV of that "
                          "format)")
    folder = osp.join(list(spec.submodule_search_locations)[0], 'data')
    return [osp.join(folder, name) for name in QM9PACK_FILES]


def read_uncharacterized(path: str) -> List[int]:
    r"""The 1-based QM9 indices listed in ``uncharacterized.txt`` (molecules whose relaxed geometry
    no longer matches their SMILES). Every line whose first field is an integer is an entry; the
    header, the separator lines and the footer are skipped.

    The file is checked for completeness, since a download cut short can still arrive without an
    error (an HTTP body that ends early): every entry must end in its number (the Coulomb-matrix
    distance D_IJ, so an entry cut inside its index is caught), and a closing rule of ``=``
    characters must follow the last entry. Otherwise :class:`CorruptRawFileError` names the
    file: a truncated list would keep molecules that should be removed, or remove the wrong
    one."""
    indices = []
    closed = False  # a rule line after the last entry
    with open(path, encoding='latin-1') as f:
        for number, line in enumerate(f, start=1):
            fields = line.split()
            if fields and fields[0].isdigit():
                if len(fields) < 2 or not _is_number(fields[-1]):
                    raise CorruptRawFileError(
                        path, f'line {number} is not a complete entry (index, SMILES strings and '
                        f'D_IJ): the file is cut short or damaged')
                indices.append(int(fields[0]))
                closed = False
            elif indices and line.strip().startswith('='):
                closed = True
    if not indices:
        raise CorruptRawFileError(path, 'no molecule index found')
    if not closed:
        raise CorruptRawFileError(path, 'no closing rule (a line of "=") after the last entry: '
                                  'the file is cut short')
    return indices


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _csv_rows(path: str, required: Sequence[str]) -> Iterator[Tuple[int, Dict[str, str]]]:
    r"""The rows of a CSV file with a header, as ``(line number, row)``: the line of the file
    where the row ends (:attr:`csv.reader.line_num`; blank lines, which the reader skips, and
    quoted fields that span lines counted). A file that does not end with a line break (its
    last row is cut off), a row with fewer or more fields than the header, and bytes that are
    not UTF-8 raise :class:`CorruptRawFileError` naming the file. A UTF-8 byte-order mark, which
    spreadsheet programs write, is skipped (it made the first column's name another)."""
    csv.field_size_limit(2**31 - 1)  # qm9pack has long list-valued fields
    with open(path, 'rb') as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) not in (b'\n', b'\r'):
                raise CorruptRawFileError(path, 'the file does not end with a line break: its '
                                          'last line is cut off (truncated file)')
    try:
        with open(path, newline='', encoding='utf-8-sig') as f:
            reader = csv.DictReader(f)
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise CorruptRawFileError(
                    path, f'missing column(s) {missing} (found {reader.fieldnames})')
            for row in reader:
                row_number = reader.line_num  # (not the records read: blank lines count)
                if None in row.values():
                    raise CorruptRawFileError(path, f'line {row_number} is truncated (fewer '
                                              f'fields than the header)')
                if None in row:
                    raise CorruptRawFileError(path, f'line {row_number} has more fields than '
                                              f'the header')
                yield row_number, row
    except UnicodeDecodeError as e:
        raise CorruptRawFileError(path, f'{_first_non_utf8_line(path)} is not UTF-8 text '
                                  f'({e.reason})') from e


def _first_non_utf8_line(path: str) -> str:
    with open(path, 'rb') as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode('utf-8')
            except UnicodeDecodeError:
                return f'line {number}'
    return 'a line'


def _floats(values: Sequence[str], path: str, row_number: int,
            what: str = 'target value') -> np.ndarray:
    try:
        out = np.array([float(v) for v in values], dtype=np.float64)
    except ValueError as e:
        raise CorruptRawFileError(path, f'line {row_number}: malformed number ({e})') from e
    if not np.isfinite(out).all():
        raise CorruptRawFileError(path, f'line {row_number}: non-finite {what}')
    return out


def read_sdf_targets(path: str) -> Tuple[List[str], np.ndarray]:
    r"""Reads ``gdb9.sdf.csv``: the molecule ids (``gdb_1``, ...) and the 12 targets in the units of
    the file (Hartree for energies).

    Shapes:
        - **targets:** :math:`(N, 12)`, float64, in :data:`QM9_TARGETS` order
    """
    ids, targets, _ = _read_sdf_targets(path)
    return ids, targets


def _read_sdf_targets(path: str) -> Tuple[List[str], np.ndarray, List[int]]:
    r""":func:`read_sdf_targets`, with the line of the file each row ends on."""
    ids, rows, lines = [], [], []
    for row_number, row in _csv_rows(path, ('mol_id', ) + QM9_TARGETS):
        ids.append(row['mol_id'])
        rows.append(_floats([row[t] for t in QM9_TARGETS], path, row_number))
        lines.append(row_number)
    return ids, np.array(rows, dtype=np.float64).reshape(-1, len(QM9_TARGETS)), lines


_GDB_NAME = re.compile(r'gdb_(\d+)')


def gdb_index(name: str) -> Optional[int]:
    r"""The QM9 index :math:`k` of a molecule named ``gdb_<k>`` (:obj:`None` for another name)."""
    found = _GDB_NAME.fullmatch(name.strip())
    return int(found.group(1)) if found else None


@contextlib.contextmanager
def _silence_c_output() -> Iterator[None]:
    # RDKit's extended-Hueckel bond perception writes warnings straight to file descriptors 1 and 2
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    saved = []
    try:
        with open(os.devnull, 'w') as devnull:
            for fd in (1, 2):
                try:
                    saved.append((fd, os.dup(fd)))
                except OSError:  # descriptor not open: nothing to silence
                    continue
                os.dup2(devnull.fileno(), fd)
            try:
                yield
            finally:
                _flush_c_streams()  # what the C library still buffers goes to /dev/null too
                for fd, copy in saved:
                    os.dup2(copy, fd)
    finally:
        for _, copy in saved:
            os.close(copy)


def _flush_c_streams() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no C library handle on this platform
        pass


def mol_from_xyz(symbols: Sequence[str], pos: np.ndarray) -> Tuple[Optional[object], str]:
    r"""An RDKit molecule with bonds perceived from 3D coordinates
    (:func:`rdkit.Chem.rdDetermineBonds.DetermineBonds`, neutral total charge).

    The default connectivity (covalent radii) over-connects some strained cages of QM9; for those
    the extended-Hueckel connectivity is used. Returns :obj:`(mol, status)` with status
    :obj:`'ok'`, :obj:`'hueckel_connectivity'` or :obj:`'failed'` (then :obj:`mol` is :obj:`None`).
    """
    Chem = require('rdkit.Chem')
    rdDetermineBonds = require('rdkit.Chem.rdDetermineBonds')
    rdBase = require('rdkit.rdBase')
    block = f'{len(symbols)}\n\n' + '\n'.join(f'{s} {x:.10f} {y:.10f} {z:.10f}'
                                              for s, (x, y, z) in zip(symbols, pos))
    with rdBase.BlockLogs():
        for status, kwargs in (('ok', {}), ('hueckel_connectivity', {'useHueckel': True})):
            mol = Chem.MolFromXYZBlock(block)
            if mol is None:
                return None, 'failed'
            try:
                if kwargs:
                    with _silence_c_output():
                        rdDetermineBonds.DetermineBonds(mol, charge=0, **kwargs)
                else:
                    rdDetermineBonds.DetermineBonds(mol, charge=0)
                return mol, status
            except (ValueError, RuntimeError):  # no valid bond-order / charge assignment
                continue
    return None, 'failed'


def gasteiger_charges(mol: object) -> Tuple[Optional[np.ndarray], str]:
    r"""Gasteiger partial charges of every atom of an RDKit molecule (left unchanged).

    Gasteiger charges need hybridisation and valence information, which a molecule read with
    :obj:`sanitize=False` lacks (every charge would be NaN). A copy is sanitised first; when full
    sanitisation fails, it gets a partial one (property cache without strict valence checks,
    aromaticity, conjugation, hybridisation). Returns :obj:`(charges, status)` with status
    :obj:`'ok'`, :obj:`'partial_sanitization'` or :obj:`'failed'` (non-finite charges; then
    :obj:`charges` is :obj:`None`).

    Shapes:
        - **charges:** :math:`(n,)`, float64
    """
    Chem = require('rdkit.Chem')
    rdPartialCharges = require('rdkit.Chem.rdPartialCharges')
    rdBase = require('rdkit.rdBase')
    work = Chem.Mol(mol)
    status = 'ok'
    with rdBase.BlockLogs():  # sanitisation failures are expected here and reported by status
        try:
            Chem.SanitizeMol(work)
        except ValueError:  # rdkit's MolSanitizeException derives from ValueError
            status = 'partial_sanitization'
            work = Chem.Mol(mol)
            work.UpdatePropertyCache(strict=False)
            flags = Chem.SanitizeFlags
            Chem.SanitizeMol(
                work, flags.SANITIZE_FINDRADICALS | flags.SANITIZE_SETAROMATICITY
                | flags.SANITIZE_SETCONJUGATION | flags.SANITIZE_SETHYBRIDIZATION
                | flags.SANITIZE_SYMMRINGS, catchErrors=True)
        try:
            rdPartialCharges.ComputeGasteigerCharges(work)
            charges = np.array([a.GetDoubleProp('_GasteigerCharge') for a in work.GetAtoms()])
        except (ValueError, RuntimeError, KeyError):
            return None, 'failed'
    if not np.isfinite(charges).all():
        return None, 'failed'
    return charges, status


def atom_set_features(symbols: Sequence[str], charges: np.ndarray) -> Tensor:
    r"""The atom features of the paper's 9-dimensional atom vectors other than the coordinates
    (which live in ``pos``): one-hot element over :data:`QM9_ELEMENTS` and Gasteiger partial
    charge. A model reads ``[pos, x]``, the paper's nine values per atom.

    Shapes:
        - **output:** :math:`(n, 6)`, float32
    """
    onehot = np.zeros((len(symbols), len(QM9_ELEMENTS)), dtype=np.float32)  # (n, 5)
    onehot[np.arange(len(symbols)), [QM9_ELEMENTS.index(s) for s in symbols]] = 1.0
    x = np.concatenate([onehot, charges.astype(np.float32)[:, None]], axis=1)
    return torch.from_numpy(x)  # (n, 6)


def _target_columns(
        target: Union[None, int, str, Sequence[Union[int, str]]]) -> Optional[List[int]]:
    if target is None:
        return None
    # one target (a name, an index, or something to refuse), or a sequence of them (a list, a
    # tuple, a range, an array of names or indices); a zero-dimensional array or tensor is one
    items = ([target] if isinstance(target, (str, int, float)) or not hasattr(target, '__iter__')
             or getattr(target, 'ndim', None) == 0 else list(target))
    if not items:
        raise ValueError("'target' must name at least one target (or be None for all)")
    columns = []
    for item in items:
        if isinstance(item, str):
            if item not in QM9_TARGETS:
                raise ValueError(
                    f"unknown QM9 target '{item}', expected one of {list(QM9_TARGETS)}")
            columns.append(QM9_TARGETS.index(item))
        elif 0 <= _index(item) < len(QM9_TARGETS):
            columns.append(_index(item))
        else:
            raise ValueError(f"a QM9 target must be a name in {list(QM9_TARGETS)} or an index in "
                             f"[0, {len(QM9_TARGETS)}), got {item!r}")
    return columns


def _index(item: Any) -> int:
    r""":obj:`item` as a Python :obj:`int` where it is an integer of any integral type (a Python
    or NumPy integer, an integer tensor of one element: ``target=np.arange(3)`` names columns
    0 to 2; they were refused as "an index in [0, 12), got 0"); -1 for anything else (a bool,
    a float, text)."""
    try:
        return check_integer('target', item)
    except ValueError:
        return -1


def _target_names(target: Union[None, int, str, Sequence[Union[int, str]]]) -> List[str]:
    r"""The names of the targets :obj:`target` selects, in any form :class:`QM9` takes (a name,
    an index, or a sequence of them; all twelve for :obj:`None`), as :attr:`QM9.target_names`
    names them; a :class:`ValueError` for one it refuses."""
    columns = _target_columns(target)
    return [QM9_TARGETS[c] for c in (range(len(QM9_TARGETS)) if columns is None else columns)]


def _same_file(a: str, b: str) -> bool:
    r"""Whether :obj:`a` and :obj:`b` are one existing file (:func:`os.path.samefile`)."""
    try:
        return osp.samefile(a, b)
    except OSError:  # (a missing file is named later, when it is read)
        return False


def _csv_paths(csv_path: object) -> List[str]:
    r""":class:`QM9`'s :obj:`csv_path` as absolute paths of files; a :class:`ValueError` for no
    path, one that is not a path, an empty one, a folder and a file named twice, also through a
    symbolic or a hard link to it (an empty list said "missing CSV file(s) []", and ``''`` read
    the working directory: "Is a directory")."""
    given = ([csv_path] if isinstance(csv_path, (str, os.PathLike)) or
             not hasattr(csv_path, '__iter__') else list(csv_path))
    expected = "'csv_path' must name one or more CSV files (paths)"
    if not given:
        raise ValueError(f'{expected}, got {csv_path!r}')
    paths: List[str] = []
    for p in given:
        text = os.fspath(p) if isinstance(p, (str, os.PathLike)) else None
        if not isinstance(text, str) or not text:
            where = '' if p is csv_path else f' in {csv_path!r}'
            raise ValueError(f'{expected}, got {p!r}{where}')
        path = osp.abspath(osp.expanduser(text))
        if osp.isdir(path):
            raise ValueError(f"'csv_path' names the folder '{path}': name the CSV file(s) in it "
                             f"(e.g. {', '.join(QM9PACK_FILES)})")
        # (its molecules read twice: "Corrupt raw file ... duplicate Index"); also under another
        # name, a symbolic or a hard link to a file named before
        if any(path == q or _same_file(path, q) for q in paths):
            raise ValueError(f"'csv_path' names the file '{path}' twice, in {csv_path!r}")
        paths.append(path)
    return paths


class QM9(ProcessedDataset):
    r"""QM9 (Ramakrishnan et al., `"Quantum chemistry structures and properties of 134 kilo
    molecules" <https://doi.org/10.1038/sdata.2014.22>`_) as sets of atoms, the molecular task of
    the MZAttn paper (Appendix A.2, Task H; Appendix D.5.2): 130,831 molecules with up to 29 atoms
    (H, C, N, O, F), after removing the 3,054 "uncharacterized" ones whose relaxed geometry no
    longer matches their SMILES.

    Every molecule is a :class:`~torch_geometric.data.Data` with

    - :obj:`x` :math:`(n, 6)`: one-hot element (H, C, N, O, F) and Gasteiger partial charge
      (:func:`gasteiger_charges`), the rotation-invariant features,
    - :obj:`pos` :math:`(n, 3)` in Angstrom, the only copy of the coordinates (a model reads
      ``[pos, x]``, the paper's nine values per atom, and PyG transforms act on ``pos``),
      :obj:`z` :math:`(n,)` atomic numbers,
    - :obj:`y` :math:`(1, t)`: the selected targets (all 12 by default) in the units of
      :data:`QM9_UNITS`,
    - :obj:`gdb_idx` :math:`(1,)`: the molecule's 1-based index :math:`k` in QM9, read from its
      name ``gdb_<k>`` (``mol_id`` of ``gdb9.sdf.csv``) or the ``Index`` column of ``qm9pack``.

    ======  ========  ================================================  ====================
    column  name      property                                          unit
    ======  ========  ================================================  ====================
    0       mu        dipole moment                                     D
    1       alpha     isotropic polarizability                          :math:`a_0^3`
    2       homo      energy of the highest occupied orbital            eV
    3       lumo      energy of the lowest unoccupied orbital           eV
    4       gap       lumo - homo                                       eV
    5       r2        electronic spatial extent                         :math:`a_0^2`
    6       zpve      zero-point vibrational energy                     eV
    7       u0        internal energy at 0 K                            eV
    8       u298      internal energy at 298.15 K                       eV
    9       h298      enthalpy at 298.15 K                              eV
    10      g298      free energy at 298.15 K                           eV
    11      cv        heat capacity at 298.15 K                         cal/(mol K)
    ======  ========  ================================================  ====================

    Energies are converted from Hartree to eV with :data:`HARTREE_TO_EV`, as
    :class:`torch_geometric.datasets.QM9` does, so the first 12 columns of its :obj:`y` equal ours.
    Targets are stored as float32 (the absolute energies, about :math:`-10^4` eV, keep about
    :math:`10^{-3}` eV).

    Two raw sources, chosen by :obj:`source`:

    - :obj:`'sdf'`: ``gdb9.sdf``, ``gdb9.sdf.csv`` (DeepChem's QM9 archive, as PyG uses) and
      ``uncharacterized.txt`` (figshare), downloaded into ``raw/``: the archive only when both
      ``gdb9.sdf`` and ``gdb9.sdf.csv`` are missing (a ``qm9.zip`` placed in ``raw/`` is used
      instead of a download), ``uncharacterized.txt`` when it is missing.
      Nothing is downloaded over a file already there: when only one of the two aligned files is
      there, or a download fails, a :class:`FileNotFoundError` names what is missing and where
      it goes. Every molecule is read with RDKit (:obj:`removeHs=False, sanitize=False`); the SDF
      record and the CSV row stay aligned (their counts and ``gdb_<k>`` names are checked) and the
      indices listed in ``uncharacterized.txt`` (QM9 indices :math:`k`) are removed.
    - :obj:`'qm9pack'`: offline, the CSV files shipped in the PyPI package ``qm9pack`` (MIT; already
      without the 3,054 uncharacterized molecules; coordinates in Angstrom, energies in Hartree),
      located through the installed package, or the CSV file(s) of that format given as
      :obj:`csv_path`. Bonds, needed only for the partial charges, are perceived from the
      coordinates (:func:`mol_from_xyz`).

    A raw CSV file (either source) with a row that has fewer or more fields than its header, that
    does not end with a line break (its last row cut off), or with bytes that are not UTF-8
    raises :class:`~torch_mz.datasets.common.CorruptRawFileError` naming the file and line. The
    processed cache is written and read as :class:`~torch_mz.datasets.common.ProcessedDataset`
    describes (atomically; weights-only; rebuilt when broken, or when a raw file is not the one
    it was built from: :meth:`raw_fingerprint`).

    A molecule whose Gasteiger charges cannot be computed (non-finite) gets charge 0 on every atom
    (:obj:`charge_failure='zero'`, keeps the standard 130,831 molecules) or is dropped
    (:obj:`'drop'`). Charges are never NaN. Every fallback (partial sanitisation, extended-Hueckel
    bond perception, failed charges) is counted, reported with a warning and listed with the
    molecule indices in :attr:`stats` (saved as ``stats.json`` in the processed folder).

    Splits: :func:`~torch_mz.datasets.splits.split_indices` with :data:`QM9_STANDARD_SPLIT`
    (110,000 / 10,000 / rest) or :data:`QM9_PAPER_SPLIT` (the paper's 50K subsample split 80/10/10);
    normalisation statistics over the training indices with :meth:`target_stats`. A split is drawn
    over positions in the dataset: with :obj:`charge_failure='zero'` every molecule is kept
    whatever RDKit manages, so a seed gives the same molecules on either source (the installed
    ``qm9pack`` files list them in QM9's order, as ``gdb9.sdf`` does) and with any RDKit version;
    :obj:`'drop'` (or a :obj:`pre_filter`) leaves fewer, and the same seed then draws another
    split altogether, not the default one less the dropped molecules (which ones are dropped may
    change with the RDKit version: :attr:`stats` lists them).

    Args:
        root (str, optional): Root folder. (default: :obj:`QM9` under ``$TORCH_MZ_DATA``, else
            under a checkout's or the working directory's ``datasets/``:
            :func:`~torch_mz.datasets.common.default_root`)
        source (str, optional): :obj:`'sdf'` or :obj:`'qm9pack'`. (default: :obj:`'sdf'`)
        target (str, int or sequence, optional): Target name(s) or column index(es) that :obj:`y`
            keeps, in the given order; :obj:`None` keeps all 12. (default: :obj:`None`)
        csv_path (str or sequence of str, optional): For :obj:`source='qm9pack'`, CSV file(s) in the
            ``qm9pack`` format to read instead of the installed package's (paths or
            :class:`os.PathLike` objects; ``~`` is the home folder; no path, an empty one, a
            folder or a file named twice raises a :class:`ValueError`). (default: :obj:`None`)
        charge_failure (str, optional): :obj:`'zero'` or :obj:`'drop'`, see above.
            (default: :obj:`'zero'`)
        transform (callable, optional): Applied to every example on access. (default: :obj:`None`)
        pre_transform (callable, optional): Applied once before saving; it sees :obj:`y` with
            all 12 targets (the cache holds them all, :obj:`target` selects on loading) and must
            keep them (a :class:`ValueError` on loading says so; change :obj:`y` in
            :obj:`transform`). (default: :obj:`None`)
        pre_filter (callable, optional): Keeps the examples for which it returns :obj:`True`
            (it too sees all 12 targets). (default: :obj:`None`)
        log (bool, optional): Show progress bars while processing. (default: :obj:`True`)
        force_reload (bool, optional): Re-process even if a processed cache exists.
            (default: :obj:`False`)

    Shapes:
        - **x:** :math:`(n, 6)`; **pos:** :math:`(n, 3)`; **z:** :math:`(n,)`
        - **y:** :math:`(1, t)` with :math:`t` the number of selected targets
    """
    targets = QM9_TARGETS
    units = QM9_UNITS
    raw_url = QM9_RAW_URL
    uncharacterized_url = QM9_UNCHARACTERIZED_URL

    def __init__(
        self,
        root: Optional[str] = None,
        source: str = 'sdf',
        target: Union[None, int, str, Sequence[Union[int, str]]] = None,
        csv_path: Union[None, str, os.PathLike, Sequence[Union[str, os.PathLike]]] = None,
        charge_failure: str = 'zero',
        transform: Optional[Callable] = None,
        pre_transform: Optional[Callable] = None,
        pre_filter: Optional[Callable] = None,
        log: bool = True,
        force_reload: bool = False,
    ) -> None:
        if source not in ('sdf', 'qm9pack'):
            raise ValueError(f"'source' must be 'sdf' or 'qm9pack', got '{source}'")
        if csv_path is not None and source != 'qm9pack':
            raise ValueError("'csv_path' applies to source='qm9pack' only")
        if charge_failure not in ('zero', 'drop'):
            raise ValueError(f"'charge_failure' must be 'zero' or 'drop', got '{charge_failure}'")
        self.source = source
        # '~' expanded, as PyG expands it in root ('~/x.csv' was read as '<cwd>/~/x.csv'); a
        # path object is one file (it was iterated: "'PosixPath' object is not iterable")
        self.csv_path = None if csv_path is None else _csv_paths(csv_path)
        self.charge_failure = charge_failure
        self.target_columns = _target_columns(target)
        # (log and force_reload are checked as flags by ProcessedDataset: the text 'False' is
        # true, and rebuilt the cache on every open without a word)
        super().__init__(
            default_root('QM9') if root is None else root, transform, pre_transform, pre_filter,
            log=log, force_reload=force_reload)
        self.open_cache()

    def read_cache(self) -> None:
        data_path, stats_path = self.processed_paths
        self.stats: Dict[str, object] = load_stats(stats_path)
        check_processed_sizes(self.stats, stats_path, [data_path])
        self.load(data_path)
        expected = self.stats.get('num_molecules')
        if expected is not None and expected != len(self):
            raise ProcessedFileError(data_path, f"holds {len(self)} molecules but "
                                     f"'{stats_path}' records {expected}")
        y = getattr(self._data, 'y', None)
        if not torch.is_tensor(y) or y.numel() != len(self) * len(QM9_TARGETS):
            # (a pre_transform that changed y's width: target read the wrong rows, or the
            # rows of two molecules as one, and target_names named 12 columns)
            held = ('no y' if not torch.is_tensor(y) else
                    f'y of shape {tuple(y.shape)} for {len(self)} molecules')
            raise ValueError(f"QM9's processed file '{data_path}' holds {held}, where "
                             f"{len(QM9_TARGETS)} targets per molecule are expected (a "
                             f"pre_transform that changed y?): the cache keeps all 12 and "
                             f"target selects among them on loading; keep y's 12 columns in "
                             f"pre_transform and change them in transform (applied on access, "
                             f"after the selection), then rebuild with force_reload=True")
        # the selected targets in the collated y itself, so that every way PyG reads it
        # (ds[i].y, ds.y, ds[:].y, a DataLoader) gives the same columns (before, get() selected
        # them and PyG's ds.y read all 12 unselected). Nothing per molecule is kept outside
        # self._data: PyG's copy() collates the copied molecules' data alone, and an attribute
        # beside it would still hold every molecule of the dataset copied (target_stats read
        # the wrong rows of such an array)
        if self.target_columns is not None:
            all_targets = self._data.y.view(-1, len(QM9_TARGETS))  # (N, 12)
            self._data.y = all_targets[:, self.target_columns].contiguous()  # (N, t)

    @property
    def target_names(self) -> List[str]:
        r"""Names of the columns of :obj:`y`."""
        columns = self.target_columns or range(len(QM9_TARGETS))
        return [QM9_TARGETS[c] for c in columns]

    @property
    def raw_file_names(self) -> List[str]:
        if self.source == 'sdf':
            return ['gdb9.sdf', 'gdb9.sdf.csv', 'uncharacterized.txt']
        return self.csv_path if self.csv_path is not None else qm9pack_csv_paths()  # absolute paths

    @property
    def processed_dir(self) -> str:
        tag = self.source
        if self.csv_path is not None:
            tag = 'csv-' + hashlib.sha1('\n'.join(self.csv_path).encode()).hexdigest()[:10]
        if self.charge_failure == 'drop':
            tag += '_drop'
        # 'pos-only': caches whose x also held the coordinates (torch_mz 0.2.0) are not reused
        return osp.join(self.root, 'processed', tag + '_pos-only')

    @property
    def processed_file_names(self) -> List[str]:
        return ['data.pt', 'stats.json']

    def raw_fingerprint(self) -> Dict[str, Any]:
        r"""The raw files read as a whole (:func:`~torch_mz.datasets.common.fingerprint_files`
        with :obj:`content`: size and SHA-1, or modification time for a file over
        :data:`~torch_mz.datasets.common.FINGERPRINT_HASH_LIMIT` bytes): ``gdb9.sdf``,
        ``gdb9.sdf.csv`` and ``uncharacterized.txt`` by their names in ``raw/``; the CSV files
        of :obj:`csv_path` by their paths, those of the installed ``qm9pack`` by their names
        (a moved environment reads the same files)."""
        if self.source == 'sdf':
            return fingerprint_files(self.raw_paths, self.raw_dir, content=True)
        if self.csv_path is not None:
            return fingerprint_files(self.raw_paths, content=True)
        return {osp.basename(k): v
                for k, v in fingerprint_files(self.raw_paths, content=True).items()}

    def parser_packages(self) -> Tuple[str, ...]:
        r"""RDKit (both sources): it reads the molecules (their bonds, for ``'qm9pack'``) and
        computes the Gasteiger charges the cache keeps."""
        return ('rdkit', )

    def download(self) -> None:
        if self.source == 'sdf':
            # the molecules are read with RDKit: a missing extra said so only after the
            # download
            require('rdkit')
            self._download_once(staging=self.raw_dir)
        else:
            self._download_raw()

    def _download_raw(self) -> None:
        if self.source == 'qm9pack':
            missing = [p for p in self.raw_paths if not osp.exists(p)]
            raise FileNotFoundError(f'QM9 (qm9pack format): missing CSV file(s) {missing}')
        pair = ('gdb9.sdf', 'gdb9.sdf.csv')
        missing = [n for n in self.raw_file_names if not osp.exists(osp.join(self.raw_dir, n))]
        present = [n for n in pair if n not in missing]
        if present and len(present) < len(pair) and self._extracted_from_archive(present[0]):
            # an extraction stopped between its two moves (the archive is removed only after
            # both): the archive holds both files, aligned, so both are taken from it again
            present = []
        if present and len(present) < len(pair):  # the archive would replace the placed one
            raise FileNotFoundError(
                f"QM9 (source='sdf'): '{self.raw_dir}' holds {present[0]} but not "
                f"{', '.join(missing)}. {self.raw_url} holds gdb9.sdf and gdb9.sdf.csv "
                f"together (they must be aligned), so nothing is downloaded over the file you "
                f"placed: place the missing file(s) there, or remove {present[0]} to download "
                f"both.")
        staging = tempfile.mkdtemp(prefix='.download-', dir=self.raw_dir)
        try:
            if not present:  # a qm9.zip already in raw/ is used as it is
                path = osp.join(self.raw_dir, 'qm9.zip')
                if not osp.isfile(path):  # downloaded into staging: in raw/ only once complete
                    os.replace(self._fetch(self.raw_url, staging, missing), path)
                try:
                    extract_zip(path, staging, log=self.log)
                except zipfile.BadZipFile as e:
                    raise CorruptRawFileError(path, f'not a complete zip archive ({e})') from e
                for name in pair:
                    if not osp.isfile(osp.join(staging, name)):
                        raise CorruptRawFileError(path, f'the archive holds no {name}')
                    os.replace(osp.join(staging, name), osp.join(self.raw_dir, name))
                os.unlink(path)
            if 'uncharacterized.txt' in missing:
                path = self._fetch(self.uncharacterized_url, staging, missing)
                os.replace(path, osp.join(self.raw_dir, 'uncharacterized.txt'))
        finally:
            shutil.rmtree(staging)

    def _extracted_from_archive(self, name: str) -> bool:
        r"""Whether ``raw/<name>`` is the archive's copy of it, left by an extraction stopped
        between its two moves: a complete ``qm9.zip`` is in ``raw/`` and holds a file of that
        name and size (a file placed by hand is not replaced)."""
        archive = osp.join(self.raw_dir, 'qm9.zip')
        if not osp.isfile(archive):
            return False
        try:
            with zipfile.ZipFile(archive) as z:
                size = z.getinfo(name).file_size
        except (zipfile.BadZipFile, KeyError, OSError):
            return False
        return size == osp.getsize(osp.join(self.raw_dir, name))

    def _fetch(self, url: str, folder: str, missing: List[str]) -> str:
        try:
            return download_url(url, folder, log=self.log)
        except OSError as e:  # URLError and HTTPError are OSErrors
            raise FileNotFoundError(
                f"QM9 (source='sdf'): {', '.join(missing)} missing from '{self.raw_dir}' and "
                f"downloading {url} failed ({getattr(e, 'reason', e)}). Place gdb9.sdf and "
                f"gdb9.sdf.csv (from {self.raw_url}) and uncharacterized.txt (from "
                f"{self.uncharacterized_url}) in '{self.raw_dir}', or use source='qm9pack' "
                f"(offline).") from e

    def process(self) -> None:
        rdBase = require('rdkit.rdBase')
        skipped = SkipCounter()
        stats: Dict[str, object] = {
            'source': self.source,
            'charge_failure': self.charge_failure,
            'units': QM9_UNITS,
            'targets': list(QM9_TARGETS),
            'processing_version': self.processing_version,
        }
        with rdBase.BlockLogs():  # RDKit's own log lines; what matters is counted in stats
            if self.source == 'sdf':
                data_list = self._process_sdf(skipped, stats)
            else:
                data_list = self._process_qm9pack(skipped, stats)
        if self.pre_filter is not None:
            data_list = [d for d in data_list if self.pre_filter(d)]
        if self.pre_transform is not None:
            data_list = [self.pre_transform(d) for d in data_list]
        if not data_list:
            raise RuntimeError(
                f'QM9 ({self.source}): no molecule left to save (skipped: {skipped.counts})')
        self._save_processed(data_list, self.processed_paths[0])
        stats['num_molecules'] = len(data_list)
        stats['skipped'] = skipped.as_dict()
        self._finish_cache(stats, self.processed_paths[1], self.processed_paths[:1])
        skipped.report(f'QM9 ({self.source})')

    def _molecule(self, symbols: List[str], pos: np.ndarray, mol: Optional[object], y: np.ndarray,
                  gdb_idx: int, skipped: SkipCounter) -> Optional[Data]:
        charges, status = gasteiger_charges(mol) if mol is not None else (None, 'failed')
        if status == 'partial_sanitization':
            skipped.add('charges_after_partial_sanitization', gdb_idx)
        if charges is None:
            if self.charge_failure == 'drop':
                skipped.add('charges_failed_dropped', gdb_idx)
                return None
            skipped.add('charges_failed_set_to_zero', gdb_idx)
            charges = np.zeros(len(symbols))
        return Data(
            x=atom_set_features(symbols, charges),  # (n, 6)
            pos=torch.from_numpy(pos.astype(np.float32)),  # (n, 3)
            z=torch.tensor([_ATOMIC_NUMBER[s] for s in symbols], dtype=torch.long),  # (n,)
            y=torch.from_numpy((y * _TO_UNITS).astype(np.float32)).view(1, -1),  # (1, 12)
            gdb_idx=torch.tensor([gdb_idx], dtype=torch.long),
        )

    def _process_sdf(self, skipped: SkipCounter, stats: Dict[str, object]) -> List[Data]:
        Chem = require('rdkit.Chem')
        sdf_path, csv_path, unchar_path = self.raw_paths
        ids, targets, lines = _read_sdf_targets(csv_path)
        indices: List[int] = []
        for i, mol_id in enumerate(ids):
            k = gdb_index(mol_id)
            if k is None:
                raise CorruptRawFileError(csv_path, f"line {lines[i]}: mol_id '{mol_id}' is not "
                                          f"gdb_<index>")
            indices.append(k)
        if len(set(indices)) != len(indices):
            seen: Set[int] = set()
            for k in indices:  # the first index met a second time
                if k in seen:
                    break
                seen.add(k)
            raise CorruptRawFileError(csv_path, f"mol_id 'gdb_{k}' appears more than once")
        uncharacterized = set(read_uncharacterized(unchar_path))
        stats['num_uncharacterized_removed'] = len(uncharacterized.intersection(indices))
        supplier = Chem.SDMolSupplier(sdf_path, removeHs=False, sanitize=False)
        if len(supplier) != len(ids):
            raise CorruptRawFileError(
                sdf_path, f'holds {len(supplier)} molecules but '
                f"'{csv_path}' has {len(ids)} rows; the two must be aligned")
        data_list = []
        for i, mol in enumerate(
                tqdm(supplier, total=len(ids), desc='QM9 (gdb9.sdf)', disable=not self.log)):
            gdb_idx = indices[i]  # the QM9 index k of gdb_<k>, not the position in the file
            if gdb_idx in uncharacterized:
                continue
            if mol is not None and mol.GetNumAtoms() < 1:  # (as qm9pack's N_atoms < 1 is)
                raise CorruptRawFileError(sdf_path, f"record {i + 1} ('{ids[i]}') is a molecule "
                                          f"without atoms")
            if mol is None or mol.GetNumConformers() == 0:
                raise CorruptRawFileError(sdf_path,
                                          f'record {i + 1} cannot be read as a 3D molecule')
            name = mol.GetProp('_Name') if mol.HasProp('_Name') else ''
            if name and name != ids[i]:
                raise CorruptRawFileError(
                    sdf_path, f"record {i + 1} is '{name}' but row {i + 1} of "
                    f"'{csv_path}' is '{ids[i]}'")
            symbols = [a.GetSymbol() for a in mol.GetAtoms()]
            if any(s not in _ATOMIC_NUMBER for s in symbols):
                skipped.add('unsupported_element', gdb_idx)
                continue
            pos = np.asarray(mol.GetConformer().GetPositions(), dtype=np.float64)  # (n, 3)
            data = self._molecule(symbols, pos, mol, targets[i], gdb_idx, skipped)
            if data is not None:
                data_list.append(data)
        return data_list

    def _process_qm9pack(self, skipped: SkipCounter, stats: Dict[str, object]) -> List[Data]:
        required = ('Index', 'N_atoms', 'Elements', 'XYZ_Ang') + QM9PACK_TARGET_COLUMNS
        data_list = []
        seen = set()
        for path in self.raw_paths:
            rows = _csv_rows(path, required)
            for row_number, row in tqdm(rows, desc=f'QM9 ({osp.basename(path)})',
                                        disable=not self.log):
                try:
                    gdb_idx = int(row['Index'])
                    num_atoms = int(row['N_atoms'])
                except ValueError as e:
                    raise CorruptRawFileError(path,
                                              f'line {row_number}: malformed Index/N_atoms') from e
                symbols = row['Elements'].translate(_LIST_CHARS).split()
                pos = _floats(row['XYZ_Ang'].translate(_LIST_CHARS).split(), path, row_number,
                              'coordinate')
                if num_atoms < 1:
                    raise CorruptRawFileError(path, f'line {row_number} (Index {gdb_idx}): '
                                              f'N_atoms={num_atoms}, a molecule without atoms')
                if len(symbols) != num_atoms or pos.size != 3 * num_atoms:
                    raise CorruptRawFileError(
                        path, f'line {row_number} (Index {gdb_idx}): N_atoms={num_atoms} but '
                        f'{len(symbols)} elements and {pos.size} coordinates')
                if gdb_idx in seen:
                    raise CorruptRawFileError(path, f'line {row_number}: duplicate Index {gdb_idx}')
                seen.add(gdb_idx)
                if any(s not in _ATOMIC_NUMBER for s in symbols):
                    skipped.add('unsupported_element', gdb_idx)
                    continue
                pos = pos.reshape(num_atoms, 3)  # (n, 3)
                targets = _floats([row[c] for c in QM9PACK_TARGET_COLUMNS], path, row_number)
                mol, status = mol_from_xyz(symbols, pos)
                if status != 'ok':
                    skipped.add(f'bonds_{status}', gdb_idx)
                data = self._molecule(symbols, pos, mol, targets, gdb_idx, skipped)
                if data is not None:
                    data_list.append(data)
        return data_list

    def target_stats(self, index: Optional[IndexLike] = None) -> Tuple[Tensor, Tensor]:
        r"""Mean and standard deviation of the selected targets over the molecules :obj:`index`
        (positions in this dataset, e.g. the training indices of
        :func:`~torch_mz.datasets.splits.split_indices`; :obj:`None` for all), for target
        normalisation: the statistics :class:`~torch_mz.train.TargetNormalizer` fits to those
        targets (the population standard deviation, as the trainer normalises; it was the
        sample one, :math:`\sqrt{m / (m - 1)}` times larger over :math:`m` molecules; 1 for a
        target of one value over them, as the normaliser divides by 1 there), in the targets'
        dtype. They are the stored targets, before any ``transform`` of the dataset.

        Shapes:
            - **mean**, **std:** :math:`(t,)`
        """
        # the selected targets of every molecule of self._data, which holds this dataset's own
        # molecules (a view's indices() point into it; a copy's are all of it)
        y = self._data.y.view(self._data.y.size(0), -1)  # (N, t)
        # (the selection as PyG's indexing reads it, ds[index]: a boolean mask selects where it
        # is True, not the rows 0 and 1; a float index is refused)
        view = self if index is None else self.index_select(index)
        rows = torch.as_tensor(list(view.indices()), dtype=torch.long)
        y = y[rows]  # (m, t)
        if len(y) < 2:
            raise ValueError(f'target statistics need at least two molecules, got {len(y)}')
        from torch_mz.train.normalize import TargetNormalizer  # (torch_mz.train loads datasets)
        fitted = TargetNormalizer().fit(y)
        assert fitted.mean is not None and fitted.std is not None
        return fitted.mean.to(y.dtype), fitted.std.to(y.dtype)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({len(self)}, source={self.source}, '
                f'targets={self.target_names})')


# characters of the list-valued qm9pack fields ("['C','H']", "[[0.1,0.2,0.3],...]") to blank out
_LIST_CHARS = str.maketrans({c: ' ' for c in "[],'\""})

#: :func:`~torch_mz.datasets.splits.split_indices` arguments of the standard QM9 split
#: (110,000 train, 10,000 validation, the rest test).
QM9_STANDARD_SPLIT: Dict[str, Any] = {'train': 110_000, 'val': 10_000, 'test': None}
#: :func:`~torch_mz.datasets.splits.split_indices` arguments of the MZAttn paper's split: 50K
#: molecules drawn at random, split 80/10/10 (Appendix D.5.2).
QM9_PAPER_SPLIT: Dict[str, Any] = {'train': 0.8, 'val': 0.1, 'test': 0.1, 'subsample': 50_000}
