r"""Helpers shared by the dataset classes of :mod:`torch_mz.datasets`: the default data root,
point normalisation, train/val/test index splits, bookkeeping of skipped raw records and the error
raised for a corrupt raw file."""
import json
import os
import os.path as osp
import warnings
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import InMemoryDataset

from torch_mz._optional import require

ENV_DATA_ROOT = 'TORCH_MZ_DATA'

# <repo>/torch_mz/datasets/common.py -> <repo>
_REPO_DIR = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


class CorruptRawFileError(ValueError):
    r"""A raw dataset file exists but cannot be read as the format it should have (truncated, wrong
    keys, malformed numbers). The message and :attr:`path` name the file.

    Args:
        path (str): The offending file.
        reason (str): What is wrong with it.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"Corrupt raw file '{self.path}': {reason}. Delete it and fetch it again.")

    def __reduce__(self):
        return (self.__class__, (self.path, self.reason))


def default_root(name: str) -> str:
    r"""The folder a dataset called :obj:`name` uses when no :obj:`root` is given.

    In this order: :obj:`$TORCH_MZ_DATA/<name>` when the environment variable is set;
    :obj:`<repo>/datasets/<name>` when :mod:`torch_mz` runs from a source checkout (a folder holding
    ``setup.cfg`` and ``datasets/``); otherwise :obj:`./datasets/<name>` under the working directory
    (an installed package must not write into ``site-packages``).
    """
    env = os.environ.get(ENV_DATA_ROOT)
    if env:
        return osp.join(osp.expanduser(env), name)
    if (osp.isfile(osp.join(_REPO_DIR, 'setup.cfg')) and osp.isdir(osp.join(_REPO_DIR, 'torch_mz'))
            and osp.isdir(osp.join(_REPO_DIR, 'datasets'))):
        return osp.join(_REPO_DIR, 'datasets', name)
    return osp.join(os.getcwd(), 'datasets', name)


def normalize_unit_sphere(pos: np.ndarray) -> np.ndarray:
    r"""Centers a point set at its centroid and scales it so that the largest norm is 1.

    A set whose points all coincide is only centered (it cannot be scaled).

    Shapes:
        - **input:** :math:`(n, 3)`
        - **output:** :math:`(n, 3)`, float32
    """
    pos = np.asarray(pos, dtype=np.float64)
    pos = pos - pos.mean(axis=0, keepdims=True)  # (n, 3)
    scale = np.sqrt((pos**2).sum(axis=1)).max() if len(pos) > 0 else 0.0
    if scale > 0:
        pos = pos / scale
    return pos.astype(np.float32)


def _count(size: Union[int, float], n: int, name: str) -> int:
    if isinstance(size, float):
        if not 0.0 <= size <= 1.0:
            raise ValueError(f"'{name}' as a fraction must lie in [0, 1] (got {size})")
        return int(round(size * n))
    if size < 0:
        raise ValueError(f"'{name}' must be non-negative (got {size})")
    return int(size)


def split_indices(
    n: int,
    train: Union[int, float] = 110_000,
    val: Union[int, float] = 10_000,
    test: Optional[Union[int, float]] = None,
    subsample: Optional[int] = None,
    seed: int = 0,
) -> Tuple[Tensor, Tensor, Tensor]:
    r"""Random, disjoint train/validation/test indices into a dataset of :obj:`n` items.

    Sizes are counts (:obj:`int`) or fractions (:obj:`float`) of the pool, where the pool is either
    all :obj:`n` items or a random subsample of :obj:`subsample` of them. :obj:`test=None` takes
    every remaining item of the pool. The same :obj:`(n, sizes, seed)` always gives the same split.

    The two QM9 protocols:

    - standard (as in DimeNet/SchNet work): :obj:`split_indices(len(ds), 110_000, 10_000)`, the rest
      (10,831 of 130,831) is the test set;
    - the MZAttn paper (Appendix D.5.2): 50K molecules split 80/10/10,
      :obj:`split_indices(len(ds), 0.8, 0.1, 0.1, subsample=50_000)`.

    Args:
        n (int): Number of items.
        train (int or float, optional): Size of the training set. (default: :obj:`110_000`)
        val (int or float, optional): Size of the validation set. (default: :obj:`10_000`)
        test (int or float, optional): Size of the test set, :obj:`None` for the rest of the pool.
            (default: :obj:`None`)
        subsample (int, optional): Draw the pool as this many random items first.
            (default: :obj:`None`)
        seed (int, optional): Seed of the permutation. (default: :obj:`0`)

    Returns:
        Three sorted :obj:`torch.long` index tensors :obj:`(train, val, test)`.
    """
    if n < 0:
        raise ValueError(f"'n' must be non-negative (got {n})")
    pool = n if subsample is None else int(subsample)
    if pool > n or pool < 0:
        raise ValueError(f"'subsample' must lie in [0, n={n}] (got {subsample})")
    n_train = _count(train, pool, 'train')
    n_val = _count(val, pool, 'val')
    n_test = pool - n_train - n_val if test is None else _count(test, pool, 'test')
    if n_test < 0 or n_train + n_val + n_test > pool:
        raise ValueError(f"train + val + test = {n_train} + {n_val} + {max(n_test, 0)} exceeds the "
                         f"{pool} items available")
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=gen)[:pool]
    parts = perm.split([n_train, n_val, n_test, pool - n_train - n_val - n_test])
    return tuple(p.sort().values for p in parts[:3])  # type: ignore[return-value]


class SkipCounter:
    r"""Counts raw records that processing leaves out, by reason, and keeps (up to :obj:`keep`)
    their identifiers for the stats file."""

    def __init__(self, keep: int = 1000) -> None:
        self.keep = keep
        self.counts: Dict[str, int] = {}
        self.examples: Dict[str, List[str]] = {}

    def add(self, reason: str, ident: object) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        examples = self.examples.setdefault(reason, [])
        if len(examples) < self.keep:
            examples.append(str(ident))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> Dict[str, object]:
        return {
            'counts': dict(self.counts),
            'examples': {
                k: list(v)
                for k, v in self.examples.items()
            }
        }

    def report(self, what: str) -> None:
        r"""Warns (once per processing run) how many records of :obj:`what` were left out or
        handled by a fallback, and why."""
        if self.counts:
            detail = ', '.join(f'{k}: {v}' for k, v in sorted(self.counts.items()))
            warnings.warn(
                f'{what}: {self.total} record(s) skipped or handled by a fallback '
                f'({detail}); see the stats file in the processed folder', stacklevel=3)


def save_stats(stats: Dict[str, object], path: str) -> None:
    with open(path, 'w') as f:
        json.dump(stats, f, indent=1, sort_keys=True)


def load_stats(path: str) -> Dict[str, object]:
    with open(path) as f:
        return json.load(f)


def read_h5(path: str, keys: Sequence[str], optional: Sequence[str] = ()) -> Dict[str, np.ndarray]:
    r"""Reads the arrays :obj:`keys` (and, where present, :obj:`optional`) from the HDF5 file
    :obj:`path`; raises :class:`CorruptRawFileError` naming the file when it is not a readable HDF5
    file or lacks a key."""
    h5py = require('h5py')
    try:
        with h5py.File(path, 'r') as f:
            missing = [k for k in keys if k not in f]
            if missing:
                raise CorruptRawFileError(
                    path, f"missing dataset(s) {missing} (found {sorted(f.keys())})")
            return {k: np.asarray(f[k][()]) for k in list(keys) + [k for k in optional if k in f]}
    except FileNotFoundError:
        raise
    except OSError as e:  # h5py reports unreadable and truncated files as OSError
        raise CorruptRawFileError(path, f'not a readable HDF5 file ({e})') from e


class TrainTestSets(InMemoryDataset):
    r"""Shared skeleton of datasets with an official train/test split processed into
    ``train.pt``, ``test.pt`` and ``stats.json``: loading the requested split, the split name,
    and a :meth:`process` that runs ``pre_filter``/``pre_transform``, saves each split and records
    what was skipped. Subclasses implement :meth:`_split_examples` and set :attr:`item_name`."""
    item_name = 'example'

    def _setup(self, root: Optional[str], name: str, train: bool, transform, pre_transform,
               pre_filter, log: bool, force_reload: bool) -> None:
        self.train = train
        super().__init__(default_root(name) if root is None else root, transform, pre_transform,
                         pre_filter, log=log, force_reload=force_reload)
        self.load(self.processed_paths[0] if train else self.processed_paths[1])
        self.stats: Dict[str, object] = load_stats(self.processed_paths[2])

    @property
    def split(self) -> str:
        return 'train' if self.train else 'test'

    @property
    def processed_file_names(self) -> List[str]:
        return ['train.pt', 'test.pt', 'stats.json']

    def _label(self) -> str:
        r"""How messages name this dataset and configuration."""
        return self.__class__.__name__

    def _stats_header(self) -> Dict[str, object]:
        return {}

    def _split_examples(self, split: str, skipped: 'SkipCounter') -> list:
        raise NotImplementedError

    def process(self) -> None:
        stats = self._stats_header()
        for split, path in zip(('train', 'test'), self.processed_paths[:2]):
            skipped = SkipCounter()
            data_list = self._split_examples(split, skipped)
            if self.pre_filter is not None:
                data_list = [d for d in data_list if self.pre_filter(d)]
            if self.pre_transform is not None:
                data_list = [self.pre_transform(d) for d in data_list]
            if not data_list:
                raise RuntimeError(f'{self._label()}: no {split} {self.item_name} left to save '
                                   f'(skipped: {skipped.counts})')
            self.save(data_list, path)
            stats[split] = {f'num_{self.item_name}s': len(data_list),
                            'skipped': skipped.as_dict()}
            skipped.report(f'{self._label()} {split}')
        save_stats(stats, self.processed_paths[2])
