r"""ScanObjectNN as a dataset of point sets (MZAttn paper, Appendix A.2, Task E)."""
import os.path as osp
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.data.dataset import IndexType
from torch_geometric.transforms import FixedPoints
from tqdm import tqdm

from torch_mz._checks import check_flag
from torch_mz.datasets.common import (
    CorruptRawFileError,
    SkipCounter,
    TrainTestSets,
    check_integer,
    h5_class_labels,
    integer_valued,
    normalize_unit_sphere,
    optional_points,
    read_h5,
)

# label -> name, in the order of the authors' release (their mapping2.py and label files)
SCANOBJECTNN_CLASSES: Tuple[str, ...] = ('bag', 'bin', 'box', 'cabinet', 'chair', 'desk', 'display',
                                         'door', 'shelf', 'table', 'bed', 'pillow', 'sink', 'sofa',
                                         'toilet')

# variant -> (folder under h5_files/, file-name suffix after '<split>_objectdataset')
SCANOBJECTNN_VARIANTS: Dict[str, Tuple[str, str]] = {
    'OBJ_ONLY': ('main_split_nobg', ''),
    'OBJ_BG': ('main_split', ''),
    'PB_T25': ('main_split', '_augmented25_norot'),
    'PB_T25_R': ('main_split', '_augmented25rot'),
    'PB_T50_R': ('main_split', '_augmentedrot'),
    'PB_T50_RS': ('main_split', '_augmentedrot_scale75'),
}

SCANOBJECTNN_PAGE = 'https://hkust-vgd.github.io/scanobjectnn/'


def scanobjectnn_file(variant: str, train: bool) -> str:
    r"""The path of a variant's HDF5 file relative to the raw folder, e.g.
    ``h5_files/main_split/training_objectdataset_augmentedrot_scale75.h5`` for PB_T50_RS."""
    folder, suffix = SCANOBJECTNN_VARIANTS[variant]
    split = 'training' if train else 'test'
    return osp.join('h5_files', folder, f'{split}_objectdataset{suffix}.h5')


def scanobjectnn_raw_files(variant: str) -> List[str]:
    r"""The raw files (relative to ``<root>/raw``) of :obj:`variant` that :class:`ScanObjectNN`
    reads: its training and test HDF5 files."""
    return [scanobjectnn_file(variant, True), scanobjectnn_file(variant, False)]


class ScanObjectNN(TrainTestSets):
    r"""ScanObjectNN (Uy et al., `"Revisiting Point Cloud Classification: A New Benchmark Dataset
    and Classification Model on Real-World Data" <https://arxiv.org/abs/1908.04616>`_): 15 classes
    of objects scanned in real rooms, the real-world point-cloud task of the MZAttn paper (Appendix
    A.2, Task E, variant OBJ_BG, 1,024 points).

    Reads the authors' HDF5 release (datasets ``data`` :math:`(N, 2048, 3)`, ``label`` :math:`(N,)`,
    ``mask`` :math:`(N, 2048)`), placed as ``raw/h5_files/...``; a dataset that leads to another
    file (an HDF5 link, a virtual dataset, external storage), that is stored with a filter HDF5
    and h5py do not build in (whose plugin library HDF5 would load) or that lacks data of its
    declared shape is refused, naming the file and the key
    (:func:`~torch_mz.datasets.common.read_h5`), as is a ``label`` that is not one class index
    per object. The variants and their files:

    ============  =====================================================================
    OBJ_ONLY      ``main_split_nobg/{training,test}_objectdataset.h5``
    OBJ_BG        ``main_split/{training,test}_objectdataset.h5``
    PB_T25        ``main_split/{training,test}_objectdataset_augmented25_norot.h5``
    PB_T25_R      ``main_split/{training,test}_objectdataset_augmented25rot.h5``
    PB_T50_R      ``main_split/{training,test}_objectdataset_augmentedrot.h5``
    PB_T50_RS     ``main_split/{training,test}_objectdataset_augmentedrot_scale75.h5``
    ============  =====================================================================

    The files are shared by the authors under their terms of use, so :meth:`download` only explains
    how to obtain them. At processing time each object keeps a random subset of :obj:`num_points` of
    its points (fixed by :obj:`seed`), centered and scaled to the unit sphere when :obj:`normalize`.
    This one fixed subset per object differs from the authors' training code, which redraws
    1,024 of the 2,048 points every epoch: :obj:`resample=True` does that instead (the cache keeps
    all points, normalised as a whole, and every access draws :obj:`num_points` of them anew
    without replacement with :class:`torch_geometric.transforms.FixedPoints`, from
    :mod:`torch`'s global generator, before :obj:`transform`). The objects are y-up, as are
    :class:`~torch_mz.datasets.ModelNet40`'s, and the training rotation turns about y.
    Labels index :data:`SCANOBJECTNN_CLASSES`. Every example holds :obj:`pos` :math:`(n, 3)`,
    :obj:`y` :math:`(1,)` and, where the file has it, :obj:`mask` :math:`(n,)`
    (:obj:`True` for points of the object, :obj:`False` for background points: read from the
    file's ``mask``, where :obj:`-1` marks a background point and any other value a point of
    the object, as in the authors' code; a mask of only 0 and 1 without a -1, as a file that
    marks the background with 0 would hold, is read so too, with a warning). Objects with a
    non-finite coordinate among any of their points in the file (not only among the subset
    kept) are left out, counted in :attr:`stats` and reported with a warning: every cache of a
    variant (a fixed subset or all points, any :obj:`num_points` and :obj:`seed`) holds the same
    objects in the same order (before a :obj:`pre_filter`), so that indices drawn on one select
    the same objects in another (the task ``scanobjectnn`` splits its training files so, for the
    resampled training split and the fixed validation split). :obj:`pre_filter` and then
    :obj:`pre_transform` see each object as its cache stores it: the fixed subset of
    :obj:`num_points`, or with :obj:`resample` (and :obj:`num_points=None`) every point of the
    object, normalised as a whole, before any draw. A :obj:`pre_filter` that reads the points
    may then keep other objects in the two caches (the task refuses that, naming it), and with
    :obj:`resample` a :obj:`pre_transform` that adds edges is refused (the draw would not
    renumber them). ``data`` must hold the points along its second axis, :math:`(N, P, C)`
    with :math:`C \geq 3` values per point (x, y, z first); an array with more values per
    point than points, such as a channels-first :math:`(N, 3, P)`, is refused.
    A copy (:meth:`copy`) holds every stored point of each object and, with :obj:`resample`,
    keeps drawing a new subset on every access.

    Args:
        root (str, optional): Root folder. (default: :obj:`ScanObjectNN` under
            ``$TORCH_MZ_DATA``, else under a checkout's or the working directory's ``datasets/``:
            :func:`~torch_mz.datasets.common.default_root`)
        variant (str, optional): One of :data:`SCANOBJECTNN_VARIANTS`. (default: :obj:`'OBJ_BG'`)
        train (bool, optional): Load the training split, else the test split. (default: :obj:`True`)
        num_points (int, optional): Points per object, a positive integer; :obj:`None` keeps
            all. (default: :obj:`1024`)
        normalize (bool, optional): Center and scale every set to the unit sphere.
            (default: :obj:`True`)
        seed (int, optional): Seed of the point subsets, an integer >= 0. (default: :obj:`0`)
        resample (bool, optional): Draw a new subset of :obj:`num_points` points on every access
            (the authors' training protocol) instead of one fixed subset per object.
            (default: :obj:`False`)
        transform (callable, optional): Applied to every example on access. (default: :obj:`None`)
        pre_transform (callable, optional): Applied once before saving. (default: :obj:`None`)
        pre_filter (callable, optional): Keeps the examples for which it returns :obj:`True`
            (given the points the cache stores, see above). (default: :obj:`None`)
        log (bool, optional): Show progress bars while processing. (default: :obj:`True`)
        force_reload (bool, optional): Re-process even if a processed cache exists.
            (default: :obj:`False`)

    Shapes:
        - **pos:** :math:`(n, 3)`, the only copy of the coordinates; **mask:** :math:`(n,)`, bool
        - **y:** :math:`(1,)`, long, in :math:`[0, 15)`
    """
    classes = SCANOBJECTNN_CLASSES
    variants = SCANOBJECTNN_VARIANTS
    item_name = 'object'
    #: 3: an object is left out for a non-finite point anywhere in the file, in every cache (a
    #: fixed-subset cache checked its subset alone, and kept objects that the cache of all
    #: points left out), and a channels-first ``data`` array is refused; 4: ``stats.json``
    #: records which objects a ``pre_filter`` removed (``removed_by_pre_filter``), so that the
    #: task ``scanobjectnn`` can tell whether two caches of the training files hold the same
    processing_version = 4

    def __init__(
        self,
        root: Optional[str] = None,
        variant: str = 'OBJ_BG',
        train: bool = True,
        num_points: Optional[int] = 1024,
        normalize: bool = True,
        seed: int = 0,
        resample: bool = False,
        transform: Optional[Callable] = None,
        pre_transform: Optional[Callable] = None,
        pre_filter: Optional[Callable] = None,
        log: bool = True,
        force_reload: bool = False,
    ) -> None:
        if variant not in SCANOBJECTNN_VARIANTS:
            raise ValueError(
                f"'variant' must be one of {list(SCANOBJECTNN_VARIANTS)}, got '{variant}'")
        num_points = optional_points(num_points)  # a plain int: it names the cache
        self.variant = variant
        self.num_points = num_points
        # (flags: the text 'False' is true, and normalised or resampled)
        self.normalize = check_flag('normalize', normalize)
        self.seed = check_integer('seed', seed)
        self.resample = check_flag('resample', resample) and num_points is not None
        # a fresh subset on every access (in get(), before the user's transform, which stays
        # theirs alone: setting ds.transform later keeps the draw)
        self._draw = (FixedPoints(num_points, replace=False, allow_duplicates=False)
                      if self.resample else None)
        self._setup(root, 'ScanObjectNN', train, transform, pre_transform, pre_filter, log,
                    force_reload)
        if self.resample and self.num_points is not None and len(self) > 0:
            # the cache of all points is shared by every num_points: checked against it too
            # (checked only when the raw file was read, a cache that another num_points had
            # built gave fewer points than asked for, silently)
            if self.slices is not None:  # the offsets of each object's points
                fewest = int((self.slices['pos'][1:] - self.slices['pos'][:-1]).min())
            else:  # one object (PyG keeps no offsets then)
                fewest = int(self._data.pos.size(0))
            if fewest < self.num_points:
                path = self.raw_paths[0 if self.train else 1]
                raise ValueError(f"'{path}' holds {fewest} points per object, fewer than "
                                 f"num_points={self.num_points}")
            # the draw (FixedPoints) takes the node attributes' rows and leaves edges as they
            # are: edges built by pre_transform on every point named points not drawn
            edges = sorted(k for k in self._data.keys() if 'edge' in k)
            if edges:
                raise ValueError(
                    f"ScanObjectNN with resample=True draws num_points={self.num_points} of "
                    f"each object's stored points on every access, after pre_transform; expected "
                    f"a pre_transform that adds no edges, got one that adds {edges}, whose "
                    f"indices would name points of the whole object, not those drawn: build "
                    f"them in transform (applied after the draw), or use resample=False")

    @property
    def num_classes(self) -> int:
        return len(SCANOBJECTNN_CLASSES)

    def get(self, idx: int) -> Data:
        data = super().get(idx)  # a copy: drawing from it leaves the cached object whole
        return data if self._draw is None else self._draw(data)

    def copy(self, idx: Optional[IndexType] = None) -> 'ScanObjectNN':
        r"""A copy of the dataset, or of the objects :obj:`idx` (PyG's
        :meth:`~torch_geometric.data.InMemoryDataset.copy`), that holds every point the dataset
        stores of each object and, with :obj:`resample`, keeps drawing :obj:`num_points` of
        them anew on every access, as the dataset does. (PyG's copy collates what :meth:`get`
        returns: with :obj:`resample`, one draw of each object, whose points the copy would
        then only have permuted.)"""
        draw, self._draw = self._draw, None  # get() returns the stored objects whole
        try:
            out = super().copy(idx)
        finally:
            self._draw = draw
        out._draw = draw  # (the copy's, made while it was None)
        return out

    @property
    def raw_file_names(self) -> List[str]:
        return scanobjectnn_raw_files(self.variant)

    @property
    def stored_points(self) -> Optional[int]:
        r"""Points per object in the processed cache: all of them with :obj:`resample`."""
        return None if self.resample else self.num_points

    @property
    def processed_dir(self) -> str:
        # (every point stored: the seed, which draws the resampled points, changes nothing)
        points = 'all' if self.stored_points is None else f'{self.stored_points}_seed{self.seed}'
        tag = f'{self.variant}_{points}' + ('' if self.normalize else '_raw')
        # 'pos-only': caches that also stored x = pos (torch_mz 0.2.0) are not reused
        return osp.join(self.root, 'processed', tag + '_pos-only')

    def download(self) -> None:
        missing = [p for p in self.raw_paths if not osp.exists(p)]
        raise FileNotFoundError(
            f'ScanObjectNN is distributed by its authors under terms of use and is not '
            f'downloaded automatically. Request access on {SCANOBJECTNN_PAGE}, download '
            f"h5_files.zip and extract it into '{self.raw_dir}' (so that '{self.raw_paths[0]}' "
            f'exists). Missing: {missing}')

    def _label(self) -> str:
        return f'ScanObjectNN {self.variant}'

    def _stats_header(self) -> Dict[str, object]:
        return {'variant': self.variant, 'num_points': self.stored_points,
                'normalize': self.normalize,
                'seed': None if self.stored_points is None else self.seed}

    def _split_examples(self, split: str, skipped: SkipCounter) -> List[Data]:
        return self._process_file(self.raw_paths[0 if split == 'train' else 1], split, skipped)

    def _process_file(self, path: str, split: str, skipped: SkipCounter) -> List[Data]:
        arrays = read_h5(path, ('data', 'label'), optional=('mask', ))
        points, mask = arrays['data'], arrays.get('mask')
        if points.ndim != 3 or points.shape[-1] < 3:
            raise CorruptRawFileError(
                path, f"expected 'data' of shape (N, P, 3), got {points.shape}")
        if points.dtype.kind == 'b':
            raise CorruptRawFileError(path, "dataset 'data' holds booleans, not coordinates")
        labels = h5_class_labels(path, arrays['label'], len(points), len(SCANOBJECTNN_CLASSES))
        if points.shape[-1] > 3 and points.shape[-1] > points.shape[1]:
            # more values per point than points: channels first, (N, 3, P) (as ModelNet40's
            # HDF5 reader asks for (N, P, 3); extra values per point are taken here, after
            # x, y, z, but a point set has more points than values per point)
            raise CorruptRawFileError(
                path, f"'data' of shape {points.shape} holds {points.shape[1]} points of "
                f"{points.shape[-1]} values each: expected the points along the second axis, "
                f"(N, P, 3) or (N, P, C) with x, y, z first, not channels-first (N, C, P)")
        if mask is not None and mask.shape != points.shape[:2]:
            raise CorruptRawFileError(
                path, f"expected 'mask' of shape {points.shape[:2]}, got {mask.shape}")
        if mask is not None and not (mask.dtype.kind == 'i' or (mask.dtype.kind == 'f'
                                                                and integer_valued(mask))):
            # -1 marks a background point: unsigned or boolean values cannot hold it (every
            # point would be taken for the object's), fractions are no marks
            raise CorruptRawFileError(
                path, f"dataset 'mask' holds {mask.dtype}"
                f"{'' if mask.dtype.kind != 'f' else ' values that are not whole numbers'}: "
                f"expected signed integers (-1 for background points)")
        if mask is not None and mask.size and not (mask == -1).any() and (
                set(np.unique(mask).tolist()) == {0, 1}):
            # (a file that marks background points with 0 instead of -1 read as the object's
            # points every one, without a word; the release marks them -1, and a file without
            # background has no 0/1 mask of both values)
            warnings.warn(f"'{path}': no point of its 'mask' is -1, which marks a background "
                          f"point, and it holds only 0 and 1: every point is read as the "
                          f"object's (mask True). If 0 marks the background in this file, "
                          f"write -1 for it (np.where(mask == 0, -1, mask)) and process again",
                          UserWarning, stacklevel=2)
        if not len(points):  # (every file of the release holds objects: one cut short)
            raise CorruptRawFileError(path, 'holds no objects')
        num_available = points.shape[1]
        num_points = self.stored_points
        if self.num_points is not None and num_available < self.num_points:
            raise ValueError(f"'{path}' holds {num_available} points per object, fewer than "
                             f"num_points={self.num_points}")
        rng = np.random.default_rng([self.seed, 0 if split == 'train' else 1])
        data_list = []
        for j in tqdm(range(len(points)), desc=f'ScanObjectNN {self.variant} {split}',
                      disable=not self.log):
            if num_points is None:
                keep = np.arange(num_available)
            else:
                keep = np.sort(rng.choice(num_available, num_points, replace=False))
            shape = points[j, keep, :3]  # (n, 3)
            # every point of the object checked, not the subset alone: every cache of the
            # variant leaves out the same objects (the subset is drawn first, so the subsets
            # of the other objects are those drawn before)
            if not np.isfinite(points[j, :, :3]).all():
                skipped.add('non_finite_points', f'{osp.basename(path)}[{j}]')
                continue
            if self.normalize:
                shape = normalize_unit_sphere(shape)
            pos = torch.from_numpy(np.ascontiguousarray(shape, dtype=np.float32))  # (n, 3)
            data = Data(pos=pos, y=torch.tensor([int(labels[j])], dtype=torch.long))
            if mask is not None:
                data.mask = torch.from_numpy(mask[j, keep] != -1)  # (n,), -1 marks background
            data_list.append(data)
        return data_list

    def __repr__(self) -> str:
        return (
            f'{self.__class__.__name__}({len(self)}, variant={self.variant}, split={self.split}, '
            f'num_points={self.num_points}, resample={self.resample})')
