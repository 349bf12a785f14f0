r"""The one split type of every task: train / val / test sequences of PyG :class:`Data` with
the metadata a model needs. :func:`torch_mz.tasks.load_task` returns it for every task, and
:func:`torch_mz.datasets.make_task` for the synthetic ones. And how a dataset's items are
divided among the splits: :func:`split_indices` (moved here verbatim from
:mod:`torch_mz.datasets.common`, which still exports it)."""
import math
import numbers
import operator
import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

__all__ = ['SPLITS', 'TaskSplits', 'split_indices']

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
        split (dict): How :func:`~torch_mz.tasks.load_task` drew the splits (empty where it
            did not build them, e.g. :func:`~torch_mz.datasets.make_task`): ``seed`` and the
            sizes ``n_train``, ``n_val``, ``n_test``, for a synthetic task the counts drawn (a
            size left at the task's default is recorded as that count), for a real dataset the
            sizes asked for (:obj:`None` for the default; ModelNet40's and ScanObjectNN's
            ``n_test``, where given, as the count taken from the official test files, with
            ``test_subset``), which checkpoints record so that ``torch-mz predict`` and a
            resumed run see the same data (for a synthetic task the seed also draws the task's
            own parameters; for QM9 it draws the split, so another seed's test split holds
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

    def __contains__(self, split: object) -> bool:  # ('train' in splits: by name, as indexed;
        return split in SPLITS  # without it Python indexed 0, 1, ... and raised a KeyError)

    # Not iterable (Python's way of saying so: iter() and unpacking raise a TypeError, and it
    # is no collections.abc.Iterable); without it Python fell back to indexing 0, 1, ... and
    # raised a KeyError. Take the splits as splits.train, splits.val, splits.test.
    __iter__ = None

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


def _size(value: Any, name: str) -> Union[int, float]:
    r"""A split size by the type of its value: an integral number (Python, NumPy or a one-element
    tensor) is a count, returned as :obj:`int`; a real one is a fraction, returned as
    :obj:`float`. A bool (a count or a fraction?) raises. A fraction held in fewer than 64 bits
    (:obj:`np.float32(0.8)`, :obj:`torch.tensor(0.8)`, float16, bfloat16) is the shortest
    decimal that its type reads as that value (:func:`_as_written`): 0.8, as the Python float
    0.8 is, not 0.800000011920929, so that such fractions give the counts of the Python floats
    (those summing to 1 share out the whole pool)."""
    narrow: Optional[Callable[[float], float]] = None  # rounds a float to the value's type
    if isinstance(value, (Tensor, np.ndarray)):
        if (value.numel() if isinstance(value, Tensor) else value.size) != 1:
            raise ValueError(f"'{name}' must be one number, a count or a fraction (got a tensor "
                             f"or an array of shape {tuple(value.shape)})")
        narrow = _narrowing(value.dtype)
        value = value.item()  # a Python bool, int or float, by the dtype
    elif isinstance(value, np.floating):
        narrow = _narrowing(value.dtype)
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"'{name}' must be a count (an integer) or a fraction (a float in "
                         f"[0, 1]), not a bool (got {value!r})")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if narrow is None else _as_written(float(value), narrow)
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"'{name}' must be a count (an integer) or a fraction (a float in "
                         f"[0, 1]) (got {value!r})") from None


def _narrowing(dtype: Any) -> Optional[Callable[[float], float]]:
    r"""What rounds a Python float to :obj:`dtype` (a NumPy or torch dtype) and back, for a
    floating-point type of fewer than 64 bits; :obj:`None` for any other type (float64 and
    wider ones, integers, bools)."""
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point or dtype.itemsize >= 8:
            return None
        return lambda x: torch.tensor(x, dtype=dtype).item()
    dtype = np.dtype(dtype)
    if dtype.kind != 'f' or dtype.itemsize >= 8:
        return None
    return lambda x: float(dtype.type(x))


def _as_written(value: float, narrow: Callable[[float], float]) -> float:
    r"""The shortest decimal (as a Python float) that :obj:`narrow` rounds to :obj:`value`, a
    number of a narrower floating-point type: 0.8 for the float32 0.800000011920929. A value
    that is not finite is returned as it is."""
    if not math.isfinite(value):
        return value
    for digits in range(1, 18):
        written = float(f'{value:.{digits}g}')
        if narrow(written) == value:
            return written
    return value


def _count(size: Union[int, float], n: int, name: str) -> int:
    if isinstance(size, float):
        if not 0.0 <= size <= 1.0:
            raise ValueError(f"'{name}' as a fraction must lie in [0, 1] (got {size})")
        return int(round(size * n))
    if size < 0:
        raise ValueError(f"'{name}' must be non-negative (got {size})")
    return int(size)


def _apportion(shares: Sequence[Fraction], total: int) -> List[int]:
    r""":obj:`total` items split in proportion to :obj:`shares` (largest remainder: each part
    gets the whole part of its quota, and the items left go one each to the parts with the
    largest remainders, the earlier part first on a tie); the counts sum to :obj:`total`."""
    whole = sum(shares)
    quotas = [share * total / whole if whole else Fraction(0) for share in shares]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda i: (counts[i] - quotas[i], i))
    for i in order[:total - sum(counts)]:
        counts[i] += 1
    return counts


def _split_counts(sizes: Sequence[Union[int, float]], pool: int, rest: bool,
                  names: Sequence[str]) -> List[int]:
    r"""The counts of the given split sizes over :obj:`pool` items (:obj:`rest`: the test set is
    the rest of the pool and not among :obj:`sizes`).

    Each fraction is rounded to the nearest count on its own. Only where that goes wrong are
    sizes that are all fractions apportioned together (:func:`_apportion`): fractions summing
    to 1 whose separate roundings exceed the pool (``0.5, 0.5`` of 3 items: 2 + 2, refused
    before) or, with a test fraction given, leave items of the pool unused (``0.25, 0.25, 0.5``
    of 10: 2 + 2 + 5 before, one item silently dropped; now 3 + 2 + 5), and fractions summing to
    less than 1 whose roundings exceed the pool. Every other size keeps its count (counts, the
    QM9 protocols, fractions with ``test=None``), so the splits drawn with them stay the same;
    the splits of the apportioned cases differ from those drawn before."""
    # a count of 0 is the fraction 0: (0.9, 0.1, 0) shares out the pool as (0.9, 0.1, 0.0) does
    # (of 15 items its roundings, 14 + 2 + 0, were refused as exceeding the pool)
    sizes = [0.0 if not isinstance(size, float) and size == 0 else size for size in sizes]
    counts = [_count(size, pool, name) for size, name in zip(sizes, names)]
    if not sizes or not all(isinstance(size, float) for size in sizes):
        return counts
    # the fractions as written (0.1 is 1/10, not the nearest binary number)
    shares = [Fraction(repr(size)) for size in sizes]
    whole = abs(float(sum(shares)) - 1.0) <= 1e-9
    if sum(counts) > pool and (whole or sum(shares) < 1):
        return _apportion(shares, pool if whole else min(pool, round(sum(shares) * pool)))
    if whole and not rest and sum(counts) < pool:
        return _apportion(shares, pool)
    return counts


def _subsample(value: Any) -> int:
    r""":obj:`subsample` as a Python :obj:`int`: any integral type is taken (a Python or NumPy
    integer, an integer tensor of one element), and a float of integral value (``500.0``,
    ``5e4``); a fractional float (``int()`` truncated 0.5 to an empty pool) or a bool raises."""
    flag = (isinstance(value, (bool, np.bool_))
            or (isinstance(value, Tensor) and value.dtype == torch.bool)
            or (isinstance(value, np.ndarray) and value.dtype.kind == 'b'))
    if not flag:
        try:
            return int(operator.index(value))
        except TypeError:
            pass
        if isinstance(value, (Tensor, np.ndarray)) and (
                value.numel() if isinstance(value, Tensor) else value.size) == 1:
            value = value.item()
        if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
            return int(float(value))
    raise ValueError(f"'subsample' must be an integer, the number of items to draw the pool from "
                     f"(got {value!r})")


def _integer(value: Any, name: str, low: int = 0, high: Optional[int] = None) -> int:
    r""":obj:`value` as a Python :obj:`int` in :math:`[low, high)`: any integral type is taken (a
    Python or NumPy integer, an integer tensor of one element); a bool, a float or text raises
    a :class:`ValueError` naming :obj:`name` (a NumPy seed failed in torch with a
    :class:`TypeError`, a float ``n`` in :func:`torch.randperm`, and ``n=True`` was one item)."""
    number = None
    if not (isinstance(value, (bool, np.bool_))
            or (isinstance(value, Tensor) and value.dtype == torch.bool)):
        try:
            number = operator.index(value)
        except TypeError:
            pass
    if number is None or number < low or (high is not None and number >= high):
        bound = '' if high is None else f' and < {high}'
        raise ValueError(f"'{name}' must be an integer >= {low}{bound} (got {value!r})")
    return int(number)


def split_indices(
    n: int,
    train: Union[int, float] = 110_000,
    val: Union[int, float] = 10_000,
    test: Optional[Union[int, float]] = None,
    subsample: Optional[int] = None,
    seed: int = 0,
) -> Tuple[Tensor, Tensor, Tensor]:
    r"""Random, disjoint train/validation/test indices into a dataset of :obj:`n` items.

    Sizes are counts (integers) or fractions (real numbers in :math:`[0, 1]`) of the pool, told
    apart by the type of the value (a NumPy or torch scalar too: :obj:`np.float32(0.8)` is a
    fraction, read as the 0.8 it prints as, :obj:`np.int64(8)` a count; a bool is refused),
    where the pool is either all :obj:`n` items or a random subsample of :obj:`subsample` of
    them. :obj:`test=None` takes every remaining item of the pool. Each fraction is rounded to
    the nearest count; fractions that sum to 1 always share out the whole pool (where the
    separate roundings would not, the items go by largest remainder, the earlier split first on
    a tie; a size of 0, a count or a fraction, is the fraction 0 there). The same
    :obj:`(n, sizes, seed)` always gives the same split.

    The two QM9 protocols:

    - standard (as in DimeNet/SchNet work): :obj:`split_indices(len(ds), 110_000, 10_000)`, the rest
      (10,831 of 130,831) is the test set;
    - the MZAttn paper (Appendix D.5.2): 50K molecules split 80/10/10,
      :obj:`split_indices(len(ds), 0.8, 0.1, 0.1, subsample=50_000)`.

    Args:
        n (int): Number of items, an integer >= 0 of any integral type.
        train (int or float, optional): Size of the training set. (default: :obj:`110_000`)
        val (int or float, optional): Size of the validation set. (default: :obj:`10_000`)
        test (int or float, optional): Size of the test set, :obj:`None` for the rest of the pool.
            (default: :obj:`None`)
        subsample (int, optional): Draw the pool as this many random items first, an integer
            (a float of integral value such as ``5e4`` is read as one; a fractional float or a
            bool raises). (default: :obj:`None`)
        seed (int, optional): Seed of the permutation, an integer in :math:`[0, 2^{64})` of
            any integral type. (default: :obj:`0`)

    Returns:
        Three sorted :obj:`torch.long` index tensors :obj:`(train, val, test)`.
    """
    n = _integer(n, 'n')
    seed = _integer(seed, 'seed', high=2**64)  # (what torch's generator takes)
    pool = n if subsample is None else _subsample(subsample)
    if pool > n or pool < 0:
        raise ValueError(f"'subsample' must lie in [0, n={n}] (got {subsample})")
    names = ['train', 'val'] + ([] if test is None else ['test'])
    sizes = [_size(value, name) for value, name in zip((train, val, test), names)]
    counts = _split_counts(sizes, pool, test is None, names)
    n_train, n_val = counts[:2]
    n_test = pool - n_train - n_val if test is None else counts[2]
    if n_test < 0 or n_train + n_val + n_test > pool:
        raise ValueError(f"train + val + test = {n_train} + {n_val} + {max(n_test, 0)} exceeds the "
                         f"{pool} items available")
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=gen)[:pool]
    parts = perm.split([n_train, n_val, n_test, pool - n_train - n_val - n_test])
    return tuple(p.sort().values for p in parts[:3])
