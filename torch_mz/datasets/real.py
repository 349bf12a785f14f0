r"""The real datasets as :class:`~torch_mz.datasets.TaskSplits`, for
:func:`torch_mz.tasks.load_task`.

* ``modelnet40`` / ``scanobjectnn``: the official train/test files; the validation set is a
  seeded 10% of the training files, kept out of training (the option ``val_fraction``).
  PointNet, DGCNN and PointMLP train on all of them and pick their reported epoch by test
  accuracy: ``val_fraction=0`` does the same (every training file trains, and the validation
  split *is* the test split, so early stopping and the best epoch are chosen on the test set, an
  optimistic protocol to be reported as such). Training sets get the paper's augmentation,
  PyG's rotation about the up axis y (``RandomRotate(180, axis=1)``) and clipped gaussian
  jitter. Elements are points in ``pos``
  (no ``x``); EGNN takes the coordinates from ``pos`` and no features (a ``transform`` or
  ``pre_transform`` that adds ``x`` widens ``in_channels`` to match). ``n_test`` below the
  official test split's size takes test sets spread evenly over it (:func:`spread_indices`: the
  official files are sorted by class, so their first sets would hold a few classes only); one
  above it takes all of them, with a :class:`TestSetsWarning` naming both counts (so that one
  ``n_test`` serves two datasets of different test sizes), and the task records the count taken.
  A ``transform`` given applies to every split, after the training split's augmentation.
* ``qm9``: by default the offline ``qm9pack`` source and the paper's protocol (50K molecules,
  80/10/10, seeded); ``n_train``/``n_val``/``n_test`` give other sizes. ``pos`` holds the
  coordinates and ``x`` the one-hot atom type (5) and partial charge (1); the set models read
  ``[pos, x]`` (9), EGNN the coordinates from ``pos`` and ``x`` as invariant features.

Every real task's ``transform`` acts on every split (validation and test too): give deterministic
ones there (``NormalizeScale``, ``FixedPoints``...), and a random augmentation of the training
split only by wrapping that split. ``NormalizeScale`` scales by the largest absolute coordinate,
which turns with a set: after the training split's rotation each draw of a training set gets a
scale of its own (up to :math:`\sqrt{2}` apart), the validation and test sets that of their one
pose; and it replaces the unit-sphere scaling of the point clouds' ``normalize=True``.

With ``scanobjectnn``'s ``resample=True`` only the training split redraws its points on every
access; validation and test keep one subset per object. The training and validation sets then
come from two caches of the training files (all points; fixed subsets), which hold the same
objects in the same order: the split is drawn on one and applied to both, and a training dataset
whose length differs from the one the split was drawn on raises a :class:`ValueError`, as does a
``pre_filter`` that removed other objects from the two (it sees every point of an object in the
first cache and its fixed subset in the second: a filter on the coordinates may decide otherwise).
"""
import warnings
from typing import Any, Optional, Tuple

from torch_geometric.transforms import Compose, RandomRotate

from torch_mz.datasets.common import check_integer
from torch_mz.datasets.splits import split_indices
from torch_mz.datasets.modelnet import ModelNet40
from torch_mz.datasets.qm9 import QM9, QM9_PAPER_SPLIT
from torch_mz.datasets.scanobjectnn import ScanObjectNN
from torch_mz.datasets.splits import TaskSplits
from torch_mz.datasets.transforms import RandomJitter
from torch_mz.models.base import set_features


class HeldOutValidation:
    r"""The option the point-cloud tasks add to their dataset class: a mixin placed before the
    dataset class, read by :func:`load_real_task` (see the module docstring).

    Args:
        val_fraction (float, optional): Share of the training files held out for validation;
            :obj:`0` trains on all of them and validates on the test split, as the published
            code does. (default: :obj:`0.1`)
        **kwargs: The arguments of the dataset class.
    """
    def __init__(self, val_fraction: float = 0.1, **kwargs) -> None:
        self.val_fraction = val_fraction
        super().__init__(**kwargs)


class ModelNet40Task(HeldOutValidation, ModelNet40):
    r"""The class behind task ``modelnet40``: :class:`~torch_mz.datasets.ModelNet40` with the
    option ``val_fraction`` of :class:`HeldOutValidation`."""


class ScanObjectNNTask(HeldOutValidation, ScanObjectNN):
    r"""The class behind task ``scanobjectnn``: :class:`~torch_mz.datasets.ScanObjectNN` with
    the option ``val_fraction`` of :class:`HeldOutValidation`."""


#: The class of each real task (its constructor's arguments are the task's options), and the
#: constructor arguments :func:`load_real_task` sets itself.
REAL_DATASETS = {'modelnet40': ModelNet40Task, 'scanobjectnn': ScanObjectNNTask, 'qm9': QM9}
#: One line per real task, for :func:`torch_mz.tasks.list_tasks`.
DESCRIPTIONS = {
    'modelnet40': 'ModelNet40 point-cloud classification (40 classes; needs the data on disk '
                  'or a download)',
    'scanobjectnn': 'ScanObjectNN point-cloud classification (15 classes; data by request from '
                    'the authors)',
    'qm9': 'QM9 molecular property regression (offline source: the qm9pack package)',
}
# (the point-cloud datasets' own 'seed', of the point sampling, stays at its default: load_task's
# seed draws the split, and one name cannot be both)
SET_BY_LOAD = {'modelnet40': ('root', 'train', 'seed'), 'scanobjectnn': ('root', 'train', 'seed'),
               'qm9': ('root', )}
#: Options :func:`load_real_task` sets where they are not given, over the class's defaults.
LOAD_DEFAULTS = {'qm9': {'source': 'qm9pack', 'target': 'mu'}}
#: Real tasks whose test split is the official test files, drawn with no seed (the seed draws the
#: validation sets from the training files only).
OFFICIAL_TEST_SPLIT = ('modelnet40', 'scanobjectnn')


class TestSetsWarning(UserWarning):
    r"""Warned where ``n_test`` asks for more test sets than the official test files hold: all of
    them are taken (see the module docstring)."""


def spread_indices(n: int, total: int):
    r""":obj:`n` of the indices ``0 .. total - 1`` spread evenly over them, ``i * total // n``
    (all of them where :obj:`n` is at least :obj:`total`): a subset of the official test split
    that no seed draws and that spans its classes (the files list them class by class)."""
    if n >= total:
        return list(range(total))
    return [i * total // n for i in range(n)]


def _subset(dataset, index):
    return dataset.index_select(index)


def check_load_args(name: str, n_train: Any = None, n_val: Any = None, n_test: Any = None,
                    val_fraction: Any = 0.1) -> Tuple[Optional[int], ...]:
    r"""The arguments of :func:`load_real_task` that are checked before any file is read, here
    for :func:`torch_mz.tasks.check_task` too (which reads none): the split sizes, each an
    integer >= 0 of any integral type or :obj:`None` (a float was read as a fraction of the
    pool: ``n_train=0.5`` took half the training files, and ``n_val=0.5`` was refused as a
    fraction ``'train'`` of 4.5), returned as Python :obj:`int`; a point-cloud task's
    ``val_fraction`` in :math:`[0, 1)`; QM9's ``n_train`` and ``n_val`` where any size is
    given."""
    sizes = []
    for what, size in (('n_train', n_train), ('n_val', n_val), ('n_test', n_test)):
        if size is not None:  # (a negative n_test took no test set, a float failed in range())
            try:
                size = check_integer(what, size)
            except ValueError as e:
                hint = 'a number of sets, or None'
                if what == 'n_test' and name in OFFICIAL_TEST_SPLIT:
                    hint = ('the number of test sets, taken from the official test split, or '
                            'None for all of it')
                raise ValueError(f'{name}: {e}: {hint}') from None
        sizes.append(size)
    n_train, n_val, n_test = sizes
    if name in OFFICIAL_TEST_SPLIT and not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"{name}: 'val_fraction' must lie in [0, 1), got {val_fraction}")
    if name == 'qm9' and any(n is not None for n in sizes) and (n_train is None or n_val is None):
        lacking = ' and '.join(k for k, n in (('n_train', n_train), ('n_val', n_val))
                               if n is None)
        raise ValueError(f'QM9 with split sizes but no {lacking} has no '
                         f"{'training' if n_train is None else 'validation'} molecules: "
                         f'give n_train and n_val (--n-train, --n-val; n_test defaults to '
                         f'the rest), or none of the three for the paper\'s split (50K '
                         f'molecules, 80/10/10)')
    return n_train, n_val, n_test


def _point_cloud_task(name: str, cls, seed: int, n_train, n_val, n_test, root, num_classes,
                      val_fraction: float = 0.1, **kwargs):
    augment = Compose([RandomRotate(180, axis=1), RandomJitter()])  # about the up axis y
    given = kwargs.pop('transform', None)  # every split's, after the training augmentation
    train_aug = cls(root=root, train=True,
                    transform=augment if given is None else Compose([augment, given]), **kwargs)
    fixed = {k: v for k, v in kwargs.items() if k != 'resample'}  # evaluation: fixed subsets
    # force_reload rebuilds each processed folder once: the one of the fixed subsets is the
    # training dataset's unless it resamples, and the test split's is that one (the train and
    # test splits are processed together); each reprocessed the same files again
    again = bool(kwargs.get('force_reload', False)) and bool(getattr(train_aug, 'resample', False))
    train_plain = cls(root=root, train=True, transform=given, **dict(fixed, force_reload=again))
    test = cls(root=root, train=False, transform=given, **dict(fixed, force_reload=False))
    n = len(train_plain)
    removed = [getattr(ds, 'stats', {}).get('train', {}).get('removed_by_pre_filter')
               for ds in (train_aug, train_plain)]
    if removed[0] != removed[1]:
        # (scanobjectnn with resample: the pre_filter saw every point of an object in one
        # cache and its fixed subset in the other; the same count would have gone unnoticed)
        differ = sorted(set(removed[0] or ()) ^ set(removed[1] or ()))
        raise ValueError(
            f"{name}: the pre_filter removed other training objects from the training "
            f"dataset ({train_aug!r}) than from the one the training/validation split is "
            f"drawn on ({train_plain!r}): objects {differ[:10]} (positions among those read, "
            f"{len(differ)} in all) in one and not the other. It sees every point of an object "
            f"in the first and its fixed subset in the second, and the indices of the split "
            f"would select other objects in the first, putting validation objects into "
            f"training. Expected a pre_filter that decides alike on both (not on the "
            f"coordinates), or resample=False")
    if len(train_aug) != n:
        # (scanobjectnn with resample: two caches of the training files, all points and fixed
        # subsets; the split is drawn on the second and applied to both, so both must hold the
        # same objects in the same order)
        raise ValueError(
            f'{name}: the training dataset ({train_aug!r}) holds {len(train_aug)} sets but the '
            f'one the training/validation split is drawn on ({train_plain!r}) holds {n}: the '
            f'indices of the split would select other objects in the first, putting validation '
            f'objects into training. Their processed caches left out other objects: rebuild them '
            f'(force_reload=True)')
    test_as_val = n_val is None and val_fraction == 0  # the published protocol
    # (n * val_fraction rounded to 9 decimals first: 100 * 0.29 is 28.999999999999996 in
    # floating point, which int() truncated to 28 held-out files, not 29)
    val_size = 0 if test_as_val else (
        n_val if n_val is not None else max(1, int(round(n * val_fraction, 9))))  # 0.1: n // 10
    train_size = n_train if n_train is not None else n - val_size
    if train_size + val_size > n:
        raise ValueError(f"{name}: {train_size} train + {val_size} val sets exceed the {n} "
                         f"training files")
    if n_test is not None and n_test > len(test):  # (it took all of them, and said nothing)
        warnings.warn(f'{name}: n_test={n_test} asks for more test sets than the {len(test)} '
                      f'official test files: all {len(test)} are taken', TestSetsWarning,
                      stacklevel=4)
    tr, va, _ = split_indices(n, train_size, val_size, 0, seed=seed)
    test_idx = spread_indices(len(test) if n_test is None else n_test, len(test))
    test_split = _subset(test, test_idx)
    # the width of what the models read, [pos, x] as the sets come out: 3 (pos) without a
    # transform, wider where a transform or pre_transform adds x (it was 3 whatever they did)
    width = set_features(test[0]).size(-1)  # (the official test split is never empty)
    return TaskSplits(name, _subset(train_aug, tr),
                      test_split if test_as_val else _subset(train_plain, va),
                      test_split, in_channels=int(width), out_channels=num_classes,
                      task_type='classification', pos_dim=3,
                      description=f'{cls.__name__} classification ({num_classes} classes)',
                      info=dict({k: v for k, v in kwargs.items() if k != 'log'},
                                val_fraction=val_fraction, val_fraction_of_train=val_size / n,
                                val_split='test' if test_as_val else 'held-out training files'))


def load_real_task(name: str, seed: int = 0, n_train: Optional[int] = None,
                   n_val: Optional[int] = None, n_test: Optional[int] = None,
                   root: Optional[str] = None, progress: bool = False, **kwargs):
    r"""Loads a real dataset as :class:`~torch_mz.datasets.TaskSplits` (see the module
    docstring). :obj:`kwargs` go to the dataset class (e.g. ``target='alpha'`` or
    ``source='sdf'`` for QM9, ``variant='PB_T50_RS'`` for ScanObjectNN, ``source='hdf5'`` for
    ModelNet40)."""
    n_train, n_val, n_test = check_load_args(name, n_train, n_val, n_test,
                                             kwargs.get('val_fraction', 0.1))
    kwargs.setdefault('log', progress)  # processing progress bars follow the caller's choice
    if name == 'modelnet40':
        return _point_cloud_task(name, ModelNet40, seed, n_train, n_val, n_test, root, 40,
                                 **kwargs)
    if name == 'scanobjectnn':
        return _point_cloud_task(name, ScanObjectNN, seed, n_train, n_val, n_test, root, 15,
                                 **kwargs)
    if name == 'qm9':
        for key, value in LOAD_DEFAULTS['qm9'].items():
            kwargs.setdefault(key, value)
        ds = QM9(root=root, **kwargs)
        if n_train is None and n_val is None and n_test is None:
            tr, va, te = split_indices(len(ds), **QM9_PAPER_SPLIT, seed=seed)
        else:
            tr, va, te = split_indices(len(ds), n_train or 0, n_val or 0, n_test, seed=seed)
        names = ds.target_names  # (every target for target=None)
        train = ds.index_select(tr)
        # the width of what the models read, [pos, x] as the sets come out (9 without a
        # transform; one may change it)
        width = set_features(train[0]).size(-1) if len(train) else 9
        return TaskSplits(name, train, ds.index_select(va), ds.index_select(te),
                          in_channels=int(width), out_channels=len(names), task_type='regression',
                          pos_dim=3, description=f"QM9 regression of {', '.join(names)}",
                          info=dict({k: v for k, v in kwargs.items() if k != 'log'},
                                    targets=names))
    raise ValueError(f"Unknown real dataset '{name}'")
