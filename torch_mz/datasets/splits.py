r"""The one split type of every task: train / val / test sequences of PyG :class:`Data` with
the metadata a model needs. :func:`torch_mz.tasks.load_task` returns it for every task, and
:func:`torch_mz.datasets.make_task` for the synthetic ones."""
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence

__all__ = ['SPLITS', 'TaskSplits']

SPLITS = ('train', 'val', 'test')


@dataclass
class TaskSplits:
    r"""Splits and metadata of a task.

    Attributes:
        name (str): Task name (a key of :func:`torch_mz.tasks.list_tasks`).
        train, val, test (sequence of Data): The splits.
        in_channels (int): Width of what a model reads from an element, ``[pos, x]``
            (:func:`torch_mz.models.base.set_features`).
        out_channels (int): Number of targets (regression) or classes (classification).
        task_type (str): ``'regression'`` or ``'classification'``.
        pos_dim (int, optional): Width of ``pos``, the coordinates (EGNN reads them apart from
            the features ``x``); :obj:`None` when the elements have no coordinates.
        description (str): One line.
        info (dict): Task parameters, for the results files (synthetic tasks: the task's
            hyper-parameters and ``set_sizes``, the inclusive set-size range of each split).
        args (dict): The task options :func:`~torch_mz.tasks.load_task` was given (``set_size``
            and the task's keyword arguments), which checkpoints record.
        task (SyntheticTask, optional): For a synthetic task, the generator with its
            hyper-parameters and task-level parameters; :obj:`None` for a real dataset.
        seed (int, optional): The seed the synthetic splits were drawn from (:obj:`None` for a
            real dataset).
        split (dict): How :func:`~torch_mz.tasks.load_task` drew the splits: ``seed`` and the
            sizes asked for, ``n_train``, ``n_val``, ``n_test`` (:obj:`None` for the task's
            default), which checkpoints record so that ``torch-mz predict`` and a resumed run
            see the same data (for a synthetic task the seed also draws the task's own
            parameters; for QM9 it draws the split, so another seed's test split holds
            training molecules).
    """
    name: str
    train: Sequence[Any]
    val: Sequence[Any]
    test: Sequence[Any]
    in_channels: int
    out_channels: int
    task_type: str
    pos_dim: Optional[int]
    description: str
    info: Dict[str, Any] = field(default_factory=dict)
    args: Dict[str, Any] = field(default_factory=dict)
    task: Optional[Any] = None
    seed: Optional[int] = None
    split: Dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, split: str) -> Sequence[Any]:
        if split not in SPLITS:
            raise KeyError(f"split must be one of {SPLITS}, got {split!r}")
        return getattr(self, split)

    def __repr__(self) -> str:
        sizes = ', '.join(f'{s}={len(self[s])}' for s in SPLITS)
        what = repr(self.task) if self.task is not None else repr(self.name)
        seed = '' if self.seed is None else f', seed={self.seed}'
        return f'{self.__class__.__name__}({what}{seed}, {sizes})'

    # Deprecated names of the former SyntheticSplits (torch_mz 0.2.0).
    @property
    def d_in(self) -> int:
        _deprecated('d_in', 'in_channels')
        return self.in_channels

    @property
    def out_dim(self) -> int:
        _deprecated('out_dim', 'out_channels')
        return self.out_channels

    @property
    def set_sizes(self) -> Dict[str, Any]:
        _deprecated('set_sizes', "info['set_sizes']")
        return self.info['set_sizes']


def _deprecated(old: str, new: str):
    warnings.warn(f"TaskSplits.{old} is deprecated; use TaskSplits.{new}", DeprecationWarning,
                  stacklevel=3)
