r"""One entry point to every task the ``torch-mz`` command and the benchmarks train on: the
synthetic set tasks of the paper (:mod:`torch_mz.datasets.synthetic`) and the real datasets
(ModelNet40, ScanObjectNN, QM9), each returned as train / val / test splits with the metadata a
model needs (input width, output width, task type, which columns are coordinates)."""
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Tuple

from torch_mz.datasets.synthetic import TASKS as SYNTHETIC_TASKS
from torch_mz.datasets.synthetic import make_task

REAL_TASKS: Dict[str, str] = {
    'modelnet40': 'ModelNet40 point-cloud classification (40 classes; needs the data on disk '
                  'or a download)',
    'scanobjectnn': 'ScanObjectNN point-cloud classification (15 classes; data by request from '
                    'the authors)',
    'qm9': 'QM9 molecular property regression (offline source: the qm9pack package)',
}


@dataclass
class TaskData:
    r"""Splits and metadata of a task.

    Attributes:
        name (str): Task name.
        train, val, test (sequence of Data): The splits.
        in_channels (int): Width of ``x``.
        out_channels (int): Number of targets (regression) or classes (classification).
        task_type (str): ``'regression'`` or ``'classification'``.
        pos_dim (int, optional): Number of leading columns of ``x`` that are coordinates (used by
            EGNN); :obj:`None` when ``data.pos`` holds them.
        description (str): One line.
        info (dict): Task parameters, for the results files.
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


def _first_sentence(doc: Optional[str]) -> str:
    text = ' '.join((doc or '').strip().split('\n\n')[0].split())
    text = re.sub(r':\w+:`~?([^`]*)`', r'\1', text).replace('\\mathbb{R}', 'R')
    return re.split(r'\.\s+(?=[A-Z])', text)[0].rstrip('.')


def list_tasks() -> Dict[str, str]:
    r"""All task names with a one-line description."""
    out = {name: _first_sentence(cls.__doc__) for name, cls in SYNTHETIC_TASKS.items()}
    out.update(REAL_TASKS)
    return out


def load_task(name: str, seed: int = 0, n_train: Optional[int] = None,
              n_val: Optional[int] = None, n_test: Optional[int] = None,
              set_size: Optional[Tuple[int, int]] = None, root: Optional[str] = None,
              progress: bool = False, **task_kwargs) -> TaskData:
    r"""Builds the splits of task :obj:`name` (see :func:`list_tasks`). Synthetic tasks are
    generated from :obj:`seed`; real datasets are read from :obj:`root` (default: the
    repository's ``datasets/`` folder) and split with :obj:`seed`."""
    if name in SYNTHETIC_TASKS:
        splits = make_task(name, n_train=n_train, n_val=n_val, n_test=n_test, seed=seed,
                           set_size=set_size, progress=progress, **task_kwargs)
        info = dict(splits.task.hparams(), set_sizes=splits.set_sizes)
        return TaskData(name, splits.train, splits.val, splits.test, splits.d_in,
                        splits.out_dim, splits.task_type, getattr(splits.task, 'd', None),
                        splits.description, info)
    if name in REAL_TASKS:
        from torch_mz.datasets.real import load_real_task
        return load_real_task(name, seed=seed, n_train=n_train, n_val=n_val, n_test=n_test,
                              root=root, progress=progress, **task_kwargs)
    raise ValueError(f"Unknown task '{name}' (available: {', '.join(list_tasks())})")
