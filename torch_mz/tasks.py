r"""The task registry: every task the ``torch-mz`` command and the benchmarks train on, by name,
the synthetic set tasks of the paper (:mod:`torch_mz.datasets.synthetic`) and the real datasets
(ModelNet40, ScanObjectNN, QM9; :mod:`torch_mz.datasets.real`), each loaded as one
:class:`~torch_mz.datasets.TaskSplits`: train / val / test splits with the metadata a model
needs (input width, output width, task type, which columns are coordinates)."""
import inspect
import typing
import warnings
from typing import Any, Collection, Dict, List, Optional, Tuple

from torch_mz.datasets import real, synthetic
from torch_mz.datasets.splits import TaskSplits
from torch_mz._checks import check_count, check_flag
from torch_mz.options import check_options

__all__ = ['TASKS', 'list_tasks', 'load_task', 'check_task', 'task_options', 'is_synthetic',
           'resolved_options']

#: Every task by name, with the class that generates it (a
#: :class:`~torch_mz.datasets.SyntheticTask`) or reads it (a dataset class).
TASKS: Dict[str, type] = dict(synthetic.TASKS, **real.REAL_DATASETS)


def list_tasks() -> Dict[str, str]:
    r"""Every task name of :data:`TASKS` with a one-line description."""
    return {name: synthetic.TASKS[name].description if is_synthetic(name)
            else real.DESCRIPTIONS[name] for name in TASKS}


def is_synthetic(name: str) -> bool:
    r"""Whether task :obj:`name` is generated (from a seed) rather than read from files."""
    return name in synthetic.TASKS


def _check_name(name: str):
    if name not in TASKS:
        raise ValueError(f"Unknown task '{name}' (available: {', '.join(TASKS)})")


def load_task(name: str, seed: int = 0, n_train: Optional[int] = None,
              n_val: Optional[int] = None, n_test: Optional[int] = None,
              set_size: Optional[Tuple[int, int]] = None, root: Optional[str] = None,
              progress: bool = False, **task_kwargs) -> TaskSplits:
    r"""Builds the splits of task :obj:`name` (see :func:`list_tasks`). Synthetic tasks are
    generated from :obj:`seed` (:func:`~torch_mz.datasets.make_task`); real datasets are read from
    :obj:`root` (default: ``$TORCH_MZ_DATA/<Name>`` where that is set, else the checkout's
    ``datasets/<Name>``, else ``./datasets/<Name>``: :func:`~torch_mz.datasets.common.default_root`)
    and split with :obj:`seed`.
    :obj:`task_kwargs` are checked against :func:`task_options` first: an unknown option or a
    value of the wrong type raises a :class:`ValueError` naming it (NumPy numbers are taken as
    Python's)."""
    _check_name(name)
    _check_load_args(name, seed, set_size, progress)
    _check_transforms(name, task_kwargs)
    defaults, nullable, complete = task_options(name)
    # (NumPy numbers as Python's: splits.args are written as JSON)
    task_kwargs = check_options(task_kwargs, defaults, f"task '{name}'", complete=complete,
                                nullable=nullable)
    args = dict(task_kwargs, **({} if set_size is None else {'set_size': list(set_size)}))
    if is_synthetic(name):
        splits = synthetic.make_task(name, n_train=n_train, n_val=n_val, n_test=n_test,
                                     seed=seed, set_size=set_size, progress=progress,
                                     **task_kwargs)
    else:  # (the sizes as Python ints: splits.split records them)
        n_train, n_val, n_test = real.check_load_args(name, n_train, n_val, n_test,
                                                      task_kwargs.get('val_fraction', 0.1))
        splits = real.load_real_task(name, seed=seed, n_train=n_train, n_val=n_val,
                                     n_test=n_test, root=root, progress=progress, **task_kwargs)
    splits.args = args
    if is_synthetic(name):  # the counts drawn: a size left at its default equals it given
        splits.split = dict(seed=seed, n_train=len(splits.train), n_val=len(splits.val),
                            n_test=len(splits.test))
    else:  # as asked: a real dataset's default split is not always one of given sizes (QM9's
        # paper protocol subsamples 50K molecules first)
        splits.split = dict(seed=seed, n_train=n_train, n_val=n_val, n_test=n_test)
        if name in real.OFFICIAL_TEST_SPLIT and n_test is not None:
            # n_test of the official test files, spread over them (a run recorded without
            # this took the first n_test: load_test_split takes those again); all of them where
            # more were asked (warned), and the count taken recorded (the one asked was)
            splits.split['n_test'] = len(splits.test)
            splits.split['test_subset'] = 'spread'
    return splits


def check_task(name: str, seed: int = 0, n_train: Optional[int] = None,
               n_val: Optional[int] = None, n_test: Optional[int] = None,
               set_size: Optional[Tuple[int, int]] = None, root: Optional[str] = None,
               progress: bool = False, **task_kwargs) -> Optional[TaskSplits]:
    r"""Checks what :func:`load_task` would be given, with the same arguments, without
    generating or reading any data: the task name, its options (:func:`task_options`), the set
    counts, for a synthetic task also the values the task itself checks (e.g. ``tdof <= d``)
    and the set-size range, and for a real dataset what :func:`load_task` checks before reading
    its files (a callable ``transform``, ``val_fraction``, QM9's ``n_train`` and ``n_val``).
    Raises the :class:`ValueError` :func:`load_task` would raise, so that a study with many
    cells can refuse a mistaken cell before training the first. Returns, for a synthetic task,
    its splits with no sets (their ``in_channels``, ``out_channels`` and ``pos_dim`` are those
    of the real ones: a model can be built for them); for a real dataset, whose files are only
    read by :func:`load_task`, :obj:`None`."""
    _check_name(name)
    _check_load_args(name, seed, set_size, progress)
    _check_transforms(name, task_kwargs)
    defaults, nullable, complete = task_options(name)
    task_kwargs = check_options(task_kwargs, defaults, f"task '{name}'", complete=complete,
                                nullable=nullable)
    if not is_synthetic(name):  # the sizes and what else load_real_task checks before reading
        real.check_load_args(name, n_train, n_val, n_test, task_kwargs.get('val_fraction', 0.1))
        return None
    for what, count in (('n_train', n_train), ('n_val', n_val), ('n_test', n_test)):
        if count is not None:  # (make_task's check: a NumPy integer too, as load_task takes it)
            check_count(what, count, low=0)
    return synthetic.make_task(name, n_train=0, n_val=0, n_test=0, seed=seed,
                               set_size=set_size, **task_kwargs)


def _check_load_args(name: str, seed: Any, set_size: Any, progress: Any) -> None:
    r"""The arguments of :func:`load_task` that every task takes: a seed (an integer >= 0; a
    real dataset's failed only in its split, after the files were read), a flag for the
    progress bars (text such as ``'no'`` was true), and no set-size range for a real dataset
    (its sets are read from files: the range was recorded in the splits' args, unapplied)."""
    check_count('seed', seed, low=0)
    check_flag('progress', progress)
    if set_size is not None and not is_synthetic(name):
        raise ValueError(f"task '{name}' reads its sets from files: 'set_size' applies to the "
                         f"synthetic tasks only (got {set_size!r})")


def _check_transforms(name: str, task_kwargs: Dict[str, Any]) -> None:
    r"""A real dataset's ``transform``, ``pre_transform`` and ``pre_filter``: callables (or
    :obj:`None`); a synthetic task takes none of them."""
    given = [k for k in ('transform', 'pre_transform', 'pre_filter') if k in task_kwargs]
    if is_synthetic(name) and given:
        raise ValueError(
            f"task '{name}' is synthetic: its splits are lists of Data generated from the seed, "
            f"not a PyG dataset, so it takes no {', '.join(repr(k) for k in given)}; apply a "
            f"transform to the sets, e.g. splits.train = [transform(d) for d in splits.train] "
            f"(once), or per access in your own Dataset")
    for key in given:  # text from the CLI, or a typo: refused before a dataset is processed
        if task_kwargs[key] is not None and not callable(task_kwargs[key]):
            raise ValueError(f"'{key}' must be a callable (a PyG transform or filter), got "
                             f"{task_kwargs[key]!r}")


def task_options(name: str) -> Tuple[Dict[str, Any], List[str], bool]:
    r"""The options :func:`load_task` accepts as keyword arguments of task :obj:`name`: a dict of
    option names and their defaults (read from the constructor of the task or dataset class), the
    names that also accept :obj:`None`, and whether the dict is complete (:obj:`False` when a
    constructor passes ``**kwargs`` on to something that cannot be inspected). The defaults are
    those :func:`load_task` applies (QM9's ``source='qm9pack'``; ``target`` is listed as
    :obj:`None`, any of its forms accepted, and means ``'mu'``)."""
    _check_name(name)
    if is_synthetic(name):
        defaults, nullable, complete = _constructor_options(TASKS[name], exclude=())
        # make_task's own options that load_task does not set (split_set_sizes)
        own = _constructor_options(synthetic.make_task,
                                   exclude=inspect.signature(load_task).parameters)
        return dict(own[0], **defaults), own[1] + nullable, complete
    defaults, nullable, complete = _constructor_options(TASKS[name],
                                                        exclude=real.SET_BY_LOAD[name])
    # the defaults load_task applies over the class's (QM9's offline source; its target, None
    # in the class, any of its types, is 'mu' when not given); the processing's progress bars
    # follow load_task's progress, off
    defaults.update({k: v for k, v in real.LOAD_DEFAULTS.get(name, {}).items()
                     if defaults.get(k) is not None})
    if 'log' in defaults:
        defaults['log'] = False
    return defaults, nullable, complete


def resolved_options(name: str, options: Dict[str, Any]) -> Dict[str, Any]:
    r""":obj:`options` of task :obj:`name` with a dimension ``d`` left at :obj:`None` (given so,
    or recorded so) read as the one the task takes then, its class's ``default_d`` (the paper's,
    e.g. 8 for MEB): for comparing what two runs were given, in which ``d=None`` and ``d=8`` are
    the same task; and QM9's ``target`` in any form it takes by the names it selects (one name
    alone), so that ``'mu'``, ``['mu']`` and ``0`` are one target (a form QM9 refuses is left as
    given)."""
    default_d = getattr(TASKS.get(name), 'default_d', None) if is_synthetic(name) else None
    if default_d is not None and 'd' in options and options['d'] is None:
        return dict(options, d=default_d)
    if name == 'qm9' and options.get('target') is not None:
        from torch_mz.datasets.qm9 import _target_names
        try:
            names = _target_names(options['target'])
        except (ValueError, TypeError):
            return dict(options)
        return dict(options, target=names[0] if len(names) == 1 else names)
    return dict(options)


def _constructor_options(cls: Any, exclude: Collection[str]
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


def __getattr__(name: str) -> Any:
    # TaskData was this module's split type before torch_mz 0.2.0 had one for every task.
    if name == 'TaskData':
        warnings.warn('torch_mz.tasks.TaskData is deprecated; use torch_mz.datasets.TaskSplits',
                      DeprecationWarning, stacklevel=2)
        return TaskSplits
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
