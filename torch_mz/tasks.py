r"""One entry point to every task the ``torch-mz`` command and the benchmarks train on: the
synthetic set tasks of the paper (:mod:`torch_mz.datasets.synthetic`) and the real datasets
(ModelNet40, ScanObjectNN, QM9), each returned as train / val / test splits with the metadata a
model needs (input width, output width, task type, which columns are coordinates)."""
import inspect
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

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
        args (dict): The task options :func:`load_task` was given (``set_size`` and the task's
            keyword arguments), which checkpoints record.
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
    repository's ``datasets/`` folder) and split with :obj:`seed`. :obj:`task_kwargs` are checked
    against :func:`task_options` first: an unknown option or a value of the wrong type raises a
    :class:`ValueError` naming it."""
    if name not in SYNTHETIC_TASKS and name not in REAL_TASKS:
        raise ValueError(f"Unknown task '{name}' (available: {', '.join(list_tasks())})")
    from torch_mz.compare import check_options
    defaults, nullable, complete = task_options(name)
    check_options(task_kwargs, defaults, f"task '{name}'", complete=complete, nullable=nullable)
    args = dict(task_kwargs, **({} if set_size is None else {'set_size': list(set_size)}))
    if name in SYNTHETIC_TASKS:
        splits = make_task(name, n_train=n_train, n_val=n_val, n_test=n_test, seed=seed,
                           set_size=set_size, progress=progress, **task_kwargs)
        info = dict(splits.task.hparams(), set_sizes=splits.set_sizes)
        return TaskData(name, splits.train, splits.val, splits.test, splits.d_in,
                        splits.out_dim, splits.task_type, getattr(splits.task, 'd', None),
                        splits.description, info, args)
    from torch_mz.datasets.real import load_real_task
    task = load_real_task(name, seed=seed, n_train=n_train, n_val=n_val, n_test=n_test,
                          root=root, progress=progress, **task_kwargs)
    task.args = args
    return task


def task_options(name: str) -> Tuple[Dict[str, Any], List[str], bool]:
    r"""The options :func:`load_task` accepts as keyword arguments of task :obj:`name`: a dict of
    option names and their defaults (read from the constructor of the task or dataset class), the
    names that also accept :obj:`None`, and whether the dict is complete (:obj:`False` when a
    constructor passes ``**kwargs`` on to something that cannot be inspected)."""
    if name in SYNTHETIC_TASKS:
        defaults, nullable, complete = _constructor_options(SYNTHETIC_TASKS[name], exclude=())
        # make_task's own options that load_task does not set (split_set_sizes)
        own = _constructor_options(make_task, exclude=inspect.signature(load_task).parameters)
        return dict(own[0], **defaults), own[1] + nullable, complete
    if name in REAL_TASKS:
        from torch_mz.datasets.real import REAL_DATASETS, SET_BY_LOAD
        return _constructor_options(REAL_DATASETS[name], exclude=SET_BY_LOAD[name])
    raise ValueError(f"Unknown task '{name}' (available: {', '.join(list_tasks())})")


def _constructor_options(cls: Any, exclude: Sequence[str]
                         ) -> Tuple[Dict[str, Any], List[str], bool]:
    r"""Keyword arguments of a class's constructor (following ``**kwargs`` up the base classes)
    or of a function, as :func:`task_options` returns them."""
    defaults: Dict[str, Any] = {}
    nullable: List[str] = []
    for klass in getattr(cls, '__mro__', [cls]):
        if klass is object:
            break
        init = vars(klass).get('__init__') if isinstance(klass, type) else klass
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())
        for p in params[1 if isinstance(klass, type) else 0:]:  # past self
            if (p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in exclude
                    and p.name not in defaults):
                defaults[p.name] = None if p.default is p.empty else p.default
                if p.default is None or type(None) in typing.get_args(p.annotation):
                    nullable.append(p.name)
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break  # this constructor passes nothing further up
    else:
        return defaults, nullable, False
    return defaults, nullable, True
