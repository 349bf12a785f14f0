r"""Datasets of sets: the paper's synthetic tasks and the real benchmarks (ModelNet40,
ScanObjectNN, QM9). Importing this package does not import rdkit, trimesh or h5py."""
from torch_mz.datasets.common import CorruptRawFileError, ProcessedFileError, default_root
from torch_mz.datasets.modelnet import MODELNET40_CLASSES, ModelNet40
from torch_mz.datasets.qm9 import (HARTREE_TO_EV, QM9, QM9_PAPER_SPLIT, QM9_STANDARD_SPLIT,
                                   QM9_TARGETS, QM9_UNITS)
from torch_mz.datasets.scanobjectnn import (SCANOBJECTNN_CLASSES, SCANOBJECTNN_VARIANTS,
                                            ScanObjectNN)
from torch_mz.datasets.splits import SPLITS, TaskSplits, split_indices
from torch_mz.datasets import synthetic
from torch_mz.datasets.synthetic import TASKS, SyntheticTask, make_task
from torch_mz.datasets.transforms import RandomJitter

__all__ = [
    'make_task',
    'TASKS',
    'SPLITS',
    'TaskSplits',
    'SyntheticTask',
    'ModelNet40',
    'MODELNET40_CLASSES',
    'ScanObjectNN',
    'SCANOBJECTNN_CLASSES',
    'SCANOBJECTNN_VARIANTS',
    'QM9',
    'QM9_TARGETS',
    'QM9_UNITS',
    'QM9_STANDARD_SPLIT',
    'QM9_PAPER_SPLIT',
    'HARTREE_TO_EV',
    'RandomJitter',
    'split_indices',
    'default_root',
    'CorruptRawFileError',
    'ProcessedFileError',
]


def __getattr__(name: str):
    # Deprecated names (torch_mz 0.2.0), kept importable: see torch_mz.datasets.synthetic.
    if name in ('SyntheticSplits', 'list_tasks'):
        return getattr(synthetic, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
