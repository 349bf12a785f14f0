r"""Datasets of sets: the paper's synthetic tasks and the real benchmarks (ModelNet40,
ScanObjectNN, QM9). Importing this package does not import rdkit, trimesh or h5py."""
from torch_mz.datasets.common import (CorruptRawFileError, ProcessedFileError, default_root,
                                      split_indices)
from torch_mz.datasets.modelnet import MODELNET40_CLASSES, ModelNet40
from torch_mz.datasets.qm9 import (HARTREE_TO_EV, QM9, QM9_PAPER_SPLIT, QM9_STANDARD_SPLIT,
                                   QM9_TARGETS, QM9_UNITS)
from torch_mz.datasets.scanobjectnn import (SCANOBJECTNN_CLASSES, SCANOBJECTNN_VARIANTS,
                                            ScanObjectNN)
from torch_mz.datasets.synthetic import (SPLITS, TASKS, SyntheticSplits, SyntheticTask,
                                         list_tasks, make_task)
from torch_mz.datasets.transforms import RandomJitter, RandomPointSubset, RandomRotateUp

__all__ = [
    'make_task',
    'list_tasks',
    'TASKS',
    'SPLITS',
    'SyntheticSplits',
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
    'RandomRotateUp',
    'RandomJitter',
    'RandomPointSubset',
    'split_indices',
    'default_root',
    'CorruptRawFileError',
    'ProcessedFileError',
]
