r"""ModelNet40 as a dataset of point sets (MZAttn paper, Appendix A.2, Task C)."""
import glob
import os
import os.path as osp
import re
import shutil
import tempfile
import warnings
import zipfile
import zlib
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np
import torch
from torch_geometric.data import Data, download_url, extract_zip
from tqdm import tqdm

from torch_mz._checks import check_flag
from torch_mz._optional import require
from torch_mz.datasets.common import (
    CorruptRawFileError,
    SkipCounter,
    TrainTestSets,
    _caller_stacklevel,
    check_integer,
    fingerprint_files,
    h5_class_labels,
    normalize_unit_sphere,
    optional_points,
    read_h5,
)

MODELNET40_CLASSES: Tuple[str, ...] = ('airplane', 'bathtub', 'bed', 'bench', 'bookshelf', 'bottle',
                                       'bowl', 'car', 'chair', 'cone', 'cup', 'curtain', 'desk',
                                       'door', 'dresser', 'flower_pot', 'glass_box', 'guitar',
                                       'keyboard', 'lamp', 'laptop', 'mantel', 'monitor',
                                       'night_stand', 'person', 'piano', 'plant', 'radio',
                                       'range_hood', 'sink', 'sofa', 'stairs', 'stool', 'table',
                                       'tent', 'toilet', 'tv_stand', 'vase', 'wardrobe', 'xbox')

MODELNET40_URL = 'http://modelnet.cs.princeton.edu/ModelNet40.zip'
HDF5_FOLDER = 'modelnet40_ply_hdf5_2048'

#: The rotation by -90 degrees about x that turns the Princeton meshes' z-up frame into the y-up
#: frame of PointNet's HDF5 release and of ScanObjectNN: :math:`(x, y, z) \mapsto (x, z, -y)`.
Z_UP_TO_Y_UP = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])


def _ints(tokens: List[str], path: str, what: str) -> np.ndarray:
    try:
        return np.array(tokens, dtype=np.int64)
    except ValueError as e:
        raise CorruptRawFileError(path, f'malformed {what} ({e})') from e


def _values_per_line(lines: List[str]) -> np.ndarray:
    return np.fromiter(map(len, map(str.split, lines)), dtype=np.int64, count=len(lines))


# the header of the OFF family (Geomview's [ST][C][N][4][n]OFF): texture coordinates, colours
# and normals follow x y z on a vertex line; 4 (4-D vertices) and n (vertices of a dimension
# given on the next line) are no 3-D meshes
_OFF_HEADER = re.compile(r'(ST)?(C)?(N)?(4)?(n)?OFF')
# a UTF-8 byte-order mark, as the file's bytes read as latin-1
_UTF8_BOM = '\xef\xbb\xbf'


def _vertices_by_line(lines: List[str], path: str) -> np.ndarray:
    r"""The first three values of each vertex line, read line by line (where reading all of them
    at once failed): the first line that holds a malformed number is named."""
    vertices = np.empty((len(lines), 3), dtype=np.float64)  # (n_v, 3)
    for i, line in enumerate(lines):
        try:
            vertices[i] = np.array(line.split()[:3], dtype=np.float64)
        except ValueError as e:
            raise CorruptRawFileError(
                path, f"malformed vertex coordinates: vertex {i} ('{line}') ({e})") from e
    return vertices


def _face_corners(line: str, path: str) -> np.ndarray:
    r"""The corner indices of the face :obj:`line` (``k i_1 ... i_k``, then optional colour
    values, integers or floats); a malformed line raises naming it."""
    tokens = line.split()
    try:
        face = np.array(tokens, dtype=np.int64)  # k, the corners, integer colours if any
    except ValueError:  # a colour given as floats, or a malformed number: value by value
        what = f"face line '{line}'"
        k = int(_ints(tokens[:1], path, what)[0])
        face = np.concatenate([np.array([k], dtype=np.int64),
                               _ints(tokens[1:max(k, 0) + 1], path, what)])
        try:  # (what follows the corners: a colour, numbers)
            np.array(tokens[face.size:], dtype=np.float64)
        except ValueError as e:
            raise CorruptRawFileError(path, f"malformed face line '{line}': the values after "
                                      f"its corners are no colour ({e})") from e
    k = int(face[0])
    if k < 3 or face.size < k + 1:
        raise CorruptRawFileError(path, f"malformed face line '{line}'")
    return face[1:k + 1]


def read_off(path: str) -> Tuple[np.ndarray, np.ndarray]:
    r"""Reads an OFF mesh and returns its vertices and its faces split into triangles.

    Handles what the ModelNet40 files contain: the merged header ``OFF<nv> <nf> <ne>`` on one line
    (many of the files) next to the regular ``OFF`` / ``<nv> <nf> <ne>`` pair, ``#`` comments,
    and quad (or larger) faces, which are split as a fan :math:`(v_0, v_i, v_{i+1})`, as
    :func:`torch_geometric.io.read_off` splits quads. Also the rest of the 3-D OFF family: the
    headers ``[ST][C][N]OFF`` (texture coordinates, colours, normals after x y z on each vertex
    line: the first three values are kept, as they are of any longer vertex line), colours
    after a face's corners (integers or floats, left out) and a UTF-8 byte-order mark. A file
    whose header announces more vertices or faces than it holds, a vertex line with fewer than
    three values, a malformed number (its vertex or face line named) or a face index out of
    range raises :class:`~torch_mz.datasets.common.CorruptRawFileError` naming the file; the
    variants that hold no 3-D mesh, ``4OFF`` (4-D vertices), ``nOFF`` (vertices of another
    dimension) and ``OFF BINARY``, raise a :class:`ValueError` that names the variant. Every
    line is checked on its own: a total count that happens to fit (a vertex line with two
    values next to one with four) is no excuse.

    Shapes:
        - **vertices:** :math:`(n_v, 3)`, float64
        - **faces:** :math:`(n_t, 3)`, int64 (:math:`n_t \geq n_f`)
    """
    with open(path, 'rb') as f:
        text = f.read().decode('latin-1')
    if text.startswith(_UTF8_BOM):
        text = text[len(_UTF8_BOM):]
    lines = [line.split('#', 1)[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    found = _OFF_HEADER.match(lines[0]) if lines else None
    if found is None:
        raise CorruptRawFileError(path, "missing the 'OFF' header")
    rest = lines[0][found.end():]  # '' or the counts of a merged header 'OFF8 6 0'
    if found.group(4) or found.group(5) or rest.split()[:1] == ['BINARY']:
        variant = found.group(0) + (' BINARY' if rest.split()[:1] == ['BINARY'] else '')
        what = ('4-D vertices' if found.group(4) else 'vertices of the dimension on its '
                'next line' if found.group(5) else 'binary data')
        raise ValueError(f"'{path}': unsupported OFF variant '{variant}' ({what}): the meshes "
                         f"read are 3-D, in text, with the header OFF, STOFF, COFF, NOFF or "
                         f"their combinations")
    if not rest:
        if len(lines) < 2:
            raise CorruptRawFileError(path, 'missing the vertex/face count line')
        header, body = lines[1].split(), lines[2:]
    else:  # the merged header 'OFF8 6 0'
        header, body = rest.split(), lines[1:]
    counts = _ints(header, path, 'vertex/face count line')
    if counts.size < 2 or (counts[:2] < 0).any():
        raise CorruptRawFileError(path, f'invalid vertex/face counts {counts.tolist()}')
    num_vertices, num_faces = int(counts[0]), int(counts[1])
    if len(body) < num_vertices + num_faces:
        raise CorruptRawFileError(
            path, f'truncated: the header announces {num_vertices} vertices and {num_faces} faces, '
            f'the file holds {len(body)} data lines')

    vertex_lines = body[:num_vertices]
    per_line = _values_per_line(vertex_lines)  # (n_v,)
    if (per_line < 3).any():
        i = int(np.argmax(per_line < 3))
        raise CorruptRawFileError(path, f"vertex {i} ('{vertex_lines[i]}') holds "
                                  f'{per_line[i]} value(s), expected x y z')
    try:
        if (per_line == 3).all():  # fast path: exactly x y z on every line
            vertices = np.fromstring(' '.join(vertex_lines), dtype=np.float64,
                                     sep=' ').reshape(num_vertices, 3)
        else:  # extra per-vertex values (colours): keep the first three of each line
            vertices = np.array([line.split()[:3] for line in vertex_lines], dtype=np.float64)
    except ValueError:  # a malformed number: read line by line, which names its line
        vertices = _vertices_by_line(vertex_lines, path)
    if vertices.shape != (num_vertices, 3) or not np.isfinite(vertices).all():
        raise CorruptRawFileError(path, 'vertex lines must hold three finite coordinates each')

    face_lines = body[num_vertices:num_vertices + num_faces]
    try:
        flat = np.fromstring(' '.join(face_lines), dtype=np.int64, sep=' ')
    except ValueError:  # a colour given as floats, or a malformed number: line by line
        flat = None
    k = 0 if flat is None else int(flat[0]) if flat.size else 3
    if (flat is not None and k >= 3 and flat.size == (k + 1) * num_faces
            and (flat[::k + 1] == k).all() and (_values_per_line(face_lines) == k + 1).all()):
        # fast path: every face has k corners (triangles, or only quads)
        polygons = flat.reshape(num_faces, k + 1)[:, 1:]  # (n_f, k)
        fan = [polygons[:, [0, i, i + 1]] for i in range(1, k - 1)]  # k - 2 times (n_f, 3)
        faces = np.stack(fan, axis=1).reshape(-1,
                                              3)  # (n_f * (k - 2), 3), a face's triangles together
    else:
        triangles: List[tuple] = []  # (i, j, k) corner indices
        for line in face_lines:
            idx = _face_corners(line, path)
            triangles.extend((idx[0], idx[i], idx[i + 1]) for i in range(1, len(idx) - 1))
        faces = np.array(triangles, dtype=np.int64).reshape(-1, 3)
    if faces.size and (faces.min() < 0 or faces.max() >= num_vertices):
        raise CorruptRawFileError(path, f'a face index lies outside [0, {num_vertices})')
    return vertices, faces


def sample_surface(vertices: np.ndarray, faces: np.ndarray, num: int,
                   seed: Optional[np.random.SeedSequence] = None) -> Optional[np.ndarray]:
    r"""Samples :obj:`num` points uniformly on the surface of a triangle mesh (a face is chosen with
    probability proportional to its area, then a uniform point on it) with :mod:`trimesh`.

    Returns :obj:`None` for a mesh without area (no faces, or only degenerate ones), told by
    the area of the mesh scaled to :math:`\max |v| = 1` where its own underflows or overflows
    float64 (a valid mesh of coordinates around 1e-160 is sampled, not taken for one without
    area; one around 1e160 is sampled over all its faces, not on its first alone), where it is
    also sampled, its points scaled back.

    Shapes:
        - **output:** :math:`(\mathrm{num}, 3)`, float64
    """
    trimesh = require('trimesh')
    if len(faces) == 0:
        return None
    mesh = trimesh.Trimesh(vertices=vertices, faces=faces, process=False)
    scale = 1.0
    with np.errstate(over='ignore', under='ignore', invalid='ignore'):  # (told below)
        area = mesh.area
    if not 0 < area < np.inf:
        # no area, or one that underflows float64 (coordinates of 1e-160 and less) or
        # overflows it (1e155 and more: every face's area inf, and every point drawn on the
        # first face): the area of the mesh scaled to max |v| = 1, which only a mesh without
        # area lacks; such a mesh is sampled at that scale and its points scaled back
        scale = float(np.abs(vertices).max()) if len(vertices) else 0.0
        if not (np.isfinite(scale) and scale > 0):
            return None
        mesh = trimesh.Trimesh(vertices=vertices / scale, faces=faces, process=False)
        if not mesh.area > 0:
            return None
    points, _ = trimesh.sample.sample_surface(mesh, num, seed=np.random.default_rng(seed))
    points = np.asarray(points, dtype=np.float64)
    return points if scale == 1.0 else points * scale


def _remove(path: str) -> None:
    r"""Removes a file or folder at :obj:`path`, if any."""
    if osp.isdir(path) and not osp.islink(path):
        shutil.rmtree(path)
    elif osp.lexists(path):
        os.unlink(path)


def modelnet40_raw_files(source: str) -> List[str]:
    r"""The raw files (relative to ``<root>/raw``) whose presence tells :class:`ModelNet40` that
    the raw data of :obj:`source` is there: the 40 class folders of the meshes, or the HDF5
    release's ``shape_names.txt``."""
    if source == 'mesh':
        return list(MODELNET40_CLASSES)
    return [osp.join(HDF5_FOLDER, 'shape_names.txt')]


class ModelNet40(TrainTestSets):
    r"""ModelNet40 (Wu et al., `"3D ShapeNets" <https://arxiv.org/abs/1406.5670>`_) as point sets,
    the point-cloud classification task of the MZAttn paper (Appendix A.2, Task C): 40 classes,
    9,843 training and 2,468 test shapes, each a set of :obj:`num_points` surface points.

    Two raw sources, chosen by :obj:`source`:

    - :obj:`'mesh'`: the Princeton meshes of ``ModelNet40.zip``, laid out as
      ``raw/<class>/{train,test}/<class>_NNNN.off``. When none of the 40 class folders is there,
      :meth:`download` fetches the archive and extracts it into ``raw/`` (a ``ModelNet40.zip``
      placed in :obj:`root` is used instead of a download, and is deleted once extracted, as a
      downloaded one is: keep a copy elsewhere); when only some are there, or the download
      fails, a :class:`FileNotFoundError` names what is missing and where it goes, and nothing
      is downloaded over the files already there; a class folder without its ``train/`` or
      ``test/`` folder raises one too, and a class whose ``train/`` or ``test/`` folder holds
      no mesh is named in a warning and listed in :attr:`stats` (``classes_without_meshes``
      of the split; a cache built before processing looked for them is used as it is, and
      names them from the raw folder, with the warning, when opened). Files other than
      ``<class>_*.off`` in the split folders are not read.
      Each mesh is sampled once, at processing time: :obj:`num_points` points drawn uniformly
      on the surface (area-weighted) with a seed fixed per file (derived from :obj:`seed` and
      the file name), so the cached points are reproducible and training does not re-sample
      meshes every epoch. The meshes are z-up; their points are rotated into the
      y-up frame of the HDF5 release (:data:`Z_UP_TO_Y_UP`,
      :math:`(x, y, z) \mapsto (x, z, -y)`), so both sources stand shapes upright along y, the
      axis the training rotation turns about.
    - :obj:`'hdf5'`: PointNet's ``modelnet40_ply_hdf5_2048`` release (``ply_data_{train,test}*.h5``
      with datasets ``data`` :math:`(N, 2048, 3)` and ``label`` :math:`(N, 1)`, and
      ``shape_names.txt``, and ``train_files.txt`` / ``test_files.txt``, which list the HDF5
      files: a listed file that is missing raises an error, and without the lists every
      ``ply_data_*.h5`` found is read, with a warning), placed by hand in
      ``raw/modelnet40_ply_hdf5_2048/``, y-up as stored. A file whose ``data`` or ``label``
      leads to another file (an HDF5 link, a virtual dataset, external storage), is stored
      with a filter HDF5 and h5py do not build in (whose plugin library HDF5 would load) or
      lacks data of its declared shape is refused, naming the file and the key
      (:func:`~torch_mz.datasets.common.read_h5`), as is a ``label`` that is not one class
      index per shape.
      The first :obj:`num_points` of the 2,048 points of a shape are kept (they are stored in
      random order, and PointNet, DGCNN and PointMLP take the same first 1,024), :obj:`None`
      keeps all. A shape with a non-finite coordinate among any of its points (not only among
      those kept) is left out, so that every cache, of any :obj:`num_points`, holds the same
      shapes in the same order.

    With :obj:`normalize=True` every point set is centered at its centroid and scaled so that its
    largest norm is 1. For the HDF5 source this differs from the published loaders: the release
    is normalised per 2,048-point shape and PointNet/DGCNN/PointMLP feed the first 1,024 points
    as stored, whereas :obj:`normalize=True` re-normalises those 1,024 points;
    :obj:`normalize=False` gives exactly the published input. Labels index
    :data:`MODELNET40_CLASSES` (the 40 class names in sorted order). Every example is a
    :class:`~torch_geometric.data.Data` with :obj:`pos` :math:`(n, 3)`, the only copy of the
    coordinates (there are no other point features, so no :obj:`x`: the models read
    :obj:`pos`), and :obj:`y` :math:`(1,)`. Shapes that processing leaves out (meshes without
    surface area, non-finite points) are counted, reported with a warning, and listed in
    :attr:`stats` (also saved as ``stats.json`` in the processed folder).

    Training augmentation as in the paper, written the PyG way as :obj:`transform`:
    ``Compose([T.RandomRotate(180, axis=1), RandomJitter()])``, a rotation about y (the up axis of
    both sources) and :class:`~torch_mz.datasets.transforms.RandomJitter` (PointNet's clipped
    gaussian jitter). The :mod:`torch_geometric.transforms` that act on point sets, reading
    :obj:`pos` (and :obj:`x`, :obj:`y`), compose with it and reach the model:
    ``NormalizeScale``, ``Center``, ``RandomRotate``, ``RandomScale``, ``RandomJitter``,
    ``RandomFlip``, ``FixedPoints``, ``KNNGraph``, ``RadiusGraph``... Those that need the mesh's
    faces (``SamplePoints``, ``FaceToEdge``, ``GenerateMeshNormals``) do not apply: the examples
    are points sampled once, and no :obj:`face` is stored. ``NormalizeScale`` after
    :obj:`normalize=True` normalises again, to PyG's scale: the largest absolute coordinate
    0.999999, not the largest norm 1 (the sets grow by up to :math:`\sqrt{3}`); give
    :obj:`normalize=False` to normalise with it alone. The train / validation split of
    :func:`torch_mz.tasks.load_task` holds out 10% of the training files for validation (the
    task option ``val_fraction``); PointNet, DGCNN and PointMLP train on all 9,843
    (``val_fraction=0``, which validates on the test split as their code does).

    Args:
        root (str, optional): Root folder (``raw/`` and ``processed/`` below it).
            (default: :obj:`ModelNet40` under ``$TORCH_MZ_DATA``, else under a checkout's or
            the working directory's ``datasets/``: :func:`~torch_mz.datasets.common.default_root`)
        train (bool, optional): Load the training split, else the test split. (default: :obj:`True`)
        source (str, optional): :obj:`'mesh'` or :obj:`'hdf5'`. (default: :obj:`'mesh'`)
        num_points (int, optional): Points per shape, a positive integer; :obj:`None` keeps all
            points of the HDF5 source. (default: :obj:`1024`)
        normalize (bool, optional): Center and scale every set to the unit sphere (after taking
            :obj:`num_points` points); :obj:`False` keeps the HDF5 release's coordinates, as
            PointNet and DGCNN read them. (default: :obj:`True`)
        seed (int, optional): Seed of the mesh surface sampling, an integer >= 0.
            (default: :obj:`0`)
        transform (callable, optional): Applied to every example on access. (default: :obj:`None`)
        pre_transform (callable, optional): Applied once before saving. (default: :obj:`None`)
        pre_filter (callable, optional): Keeps the examples for which it returns :obj:`True`.
            (default: :obj:`None`)
        log (bool, optional): Show progress bars while processing. (default: :obj:`True`)
        force_reload (bool, optional): Re-process even if a processed cache exists.
            (default: :obj:`False`)

    Shapes:
        - **pos:** :math:`(n, 3)` with :math:`n` = :obj:`num_points`, y-up
        - **y:** :math:`(1,)`, long, in :math:`[0, 40)`
    """
    url = MODELNET40_URL
    classes = MODELNET40_CLASSES
    item_name = 'shape'
    #: The :attr:`processing_version` of the HDF5 source's caches (the mesh source's is the
    #: class's, 2: a bump would re-sample every mesh). 3: a shape is left out for a non-finite
    #: point among any of its 2,048 points, in every cache (the kept :obj:`num_points` alone
    #: were checked, so caches of other :obj:`num_points` held other shapes at one index)
    hdf5_processing_version = 3

    def __init__(
        self,
        root: Optional[str] = None,
        train: bool = True,
        source: str = 'mesh',
        num_points: Optional[int] = 1024,
        normalize: bool = True,
        seed: int = 0,
        transform: Optional[Callable] = None,
        pre_transform: Optional[Callable] = None,
        pre_filter: Optional[Callable] = None,
        log: bool = True,
        force_reload: bool = False,
    ) -> None:
        if source not in ('mesh', 'hdf5'):
            raise ValueError(f"'source' must be 'mesh' or 'hdf5', got '{source}'")
        if num_points is None and source == 'mesh':
            raise ValueError("'num_points' must be set for the mesh source")
        self.source = source
        if source == 'hdf5':
            self.processing_version = self.hdf5_processing_version
        # plain ints (any integral type is taken): they name the cache and go to stats.json
        self.num_points = optional_points(num_points)
        self.normalize = check_flag('normalize', normalize)  # ('False' is true: it normalised)
        self.seed = check_integer('seed', seed)
        # the classes without meshes of each split, found by processing (_process_meshes)
        self._without_meshes: Dict[str, List[str]] = {}
        self._setup(root, 'ModelNet40', train, transform, pre_transform, pre_filter, log,
                    force_reload)

    @property
    def num_classes(self) -> int:
        return len(MODELNET40_CLASSES)

    @property
    def raw_file_names(self) -> List[str]:
        return modelnet40_raw_files(self.source)

    @property
    def processed_dir(self) -> str:
        points = 'all' if self.num_points is None else str(self.num_points)
        tag = f'{self.source}_{points}'
        if self.source == 'mesh':
            tag += f'_seed{self.seed}_yup'  # '_yup': caches of the file's z-up axes are not reused
        if not self.normalize:
            tag += '_raw'
        # 'pos-only': caches that also stored x = pos (torch_mz 0.2.0) are not reused
        return osp.join(self.root, 'processed', tag + '_pos-only')

    def download(self) -> None:
        if self.source == 'mesh':
            # the meshes are sampled with trimesh: a missing extra said so only after the
            # archive (about 2 GB) was downloaded and unpacked
            require('trimesh')
            self._download_once(staging=self.root)
        else:
            self._download_raw()

    def _download_raw(self) -> None:
        if self.source == 'hdf5':
            raise FileNotFoundError(
                f"ModelNet40 (source='hdf5') needs PointNet's '{HDF5_FOLDER}' release, which is "
                f"not downloaded automatically. Place its files (ply_data_train*.h5, "
                f"ply_data_test*.h5, shape_names.txt, train_files.txt, test_files.txt) in "
                f"'{osp.join(self.raw_dir, HDF5_FOLDER)}', or use source='mesh'.")
        present = [c for c in MODELNET40_CLASSES if osp.isdir(osp.join(self.raw_dir, c))]
        archive = osp.join(self.root, 'ModelNet40.zip')  # complete: downloads land in staging
        if present and not osp.isfile(archive):  # never download over meshes the user placed
            missing = [c for c in MODELNET40_CLASSES if c not in present]
            raise FileNotFoundError(
                f"ModelNet40 (source='mesh'): {len(missing)} of the 40 class folders are missing "
                f"from '{self.raw_dir}': {', '.join(missing)}. Nothing is downloaded next to the "
                f"{len(present)} already there: place the missing ones as "
                f"'{osp.join(self.raw_dir, '<class>', '{train,test}', '<class>_NNNN.off')}' "
                f"(from {self.url}), or empty '{self.raw_dir}' to download the whole archive.")
        # an archive at root is complete (placed there, or an extraction that was stopped:
        # the missing folders are extracted from it, the others kept); a download goes to a
        # staging folder and joins root only once complete, so a stopped download leaves nothing
        if not osp.isfile(archive):
            self._fetch(archive)
        staging = tempfile.mkdtemp(prefix='.extract-', dir=self.root)
        try:
            try:
                extract_zip(archive, staging, log=self.log)
            except zipfile.BadZipFile as e:
                raise CorruptRawFileError(archive, f'not a complete zip archive ({e})') from e
            folder = osp.join(staging, 'ModelNet40')
            if not osp.isdir(folder):
                raise CorruptRawFileError(archive, 'the archive holds no ModelNet40/ folder')
            os.makedirs(self.raw_dir, exist_ok=True)
            for name in os.listdir(folder):  # into raw/, next to e.g. an HDF5 folder there
                target = osp.join(self.raw_dir, name)
                if not osp.exists(target):  # never over a file the user placed
                    # under a hidden name first, then one rename: where raw/ is on another
                    # file system the move is a copy, and a copy stopped part-way left a class
                    # folder that later starts took for complete
                    partial = osp.join(self.raw_dir, f'.{name}.partial')
                    _remove(partial)  # (of a move stopped before)
                    shutil.move(osp.join(folder, name), partial)
                    os.replace(partial, target)
        finally:
            shutil.rmtree(staging)
        os.unlink(archive)

    def _fetch(self, archive: str) -> None:
        r"""Downloads the archive into a staging folder under ``root``, then moves it to
        :obj:`archive` (the same file system: one rename)."""
        os.makedirs(self.root, exist_ok=True)
        staging = tempfile.mkdtemp(prefix='.download-', dir=self.root)
        try:
            try:
                path = download_url(self.url, staging, log=self.log)
            except OSError as e:  # URLError and HTTPError are OSErrors
                raise FileNotFoundError(
                    f"ModelNet40 (source='mesh'): the meshes are missing from '{self.raw_dir}' "
                    f"and downloading {self.url} failed ({getattr(e, 'reason', e)}). Download "
                    f"ModelNet40.zip yourself and extract its 40 class folders into "
                    f"'{self.raw_dir}' (as "
                    f"'{osp.join(self.raw_dir, '<class>', '{train,test}', '<class>_NNNN.off')}'), "
                    f"or place PointNet's HDF5 release and use source='hdf5'.") from e
            os.replace(path, archive)
        finally:
            shutil.rmtree(staging)

    def _label(self) -> str:
        return f'ModelNet40 ({self.source})'

    def parser_packages(self) -> Tuple[str, ...]:
        r"""trimesh for the meshes, whose surface it samples (the HDF5 release's points are
        read as they are)."""
        return ('trimesh', ) if self.source == 'mesh' else ()

    def _stats_header(self) -> Dict[str, object]:
        return {'source': self.source, 'num_points': self.num_points,
                'normalize': self.normalize, 'seed': self.seed}

    def _split_examples(self, split: str, skipped: SkipCounter) -> List[Data]:
        if self.source == 'mesh':
            return self._process_meshes(split, skipped)
        return self._process_hdf5(split, skipped)

    def _example(self, points: np.ndarray, label: int) -> Data:
        if self.normalize:
            points = normalize_unit_sphere(points)
        pos = torch.from_numpy(np.ascontiguousarray(points, dtype=np.float32))  # (n, 3)
        return Data(pos=pos, y=torch.tensor([label], dtype=torch.long))

    def _mesh_files(self, split: str) -> List[Tuple[str, int]]:
        r"""The meshes of :obj:`split` with their labels: ``raw/<class>/<split>/<class>_*.off``."""
        files = []
        for label, name in enumerate(MODELNET40_CLASSES):
            # (the root may hold glob characters, e.g. 'run[1]')
            pattern = osp.join(glob.escape(osp.join(self.raw_dir, name, split)), f'{name}_*.off')
            files += [(path, label) for path in sorted(glob.glob(pattern))]
        return files

    def raw_fingerprint(self) -> Dict[str, Any]:
        r"""The raw files processing reads, by path relative to ``raw/``, size and time
        (:func:`~torch_mz.datasets.common.fingerprint_files`): the meshes of both splits; or the
        HDF5 files of the release that processing reads (those the two file lists name, or for a
        split without its list every ``ply_data_<split>*.h5``), with ``shape_names.txt`` and the
        two file lists by their contents' hash."""
        if self.source == 'mesh':
            paths = [path for split in ('train', 'test') for path, _ in self._mesh_files(split)]
            return fingerprint_files(paths, self.raw_dir)
        folder = osp.join(self.raw_dir, HDF5_FOLDER)
        lists = [osp.join(folder, name)
                 for name in ('shape_names.txt', 'train_files.txt', 'test_files.txt')]
        names: Set[str] = set()
        for split in ('train', 'test'):
            try:
                listed = self._hdf5_listing(folder, split)
            except (OSError, UnicodeDecodeError):  # (hashed as it is; processing will tell)
                listed = None
            if listed is None:  # processing reads every ply_data_<split>*.h5 (_hdf5_files)
                pattern = osp.join(glob.escape(folder), f'ply_data_{split}*.h5')
                names.update(osp.basename(p) for p in glob.glob(pattern))
            else:  # only the listed files: another .h5 beside them is not read
                names.update(n for n, _ in listed)
        return dict(fingerprint_files(lists, self.raw_dir, content=True),
                    **fingerprint_files([osp.join(folder, n) for n in sorted(names)],
                                        self.raw_dir))

    def _process_meshes(self, split: str, skipped: SkipCounter) -> List[Data]:
        self._check_mesh_folders()
        files = self._mesh_files(split)
        self._warn_classes_without_meshes(split, files)
        assert self.num_points is not None  # required for the mesh source (__init__)
        data_list = []
        for path, label in tqdm(files, desc=f'ModelNet40 {split} meshes', disable=not self.log):
            rel = osp.relpath(path, self.raw_dir).replace(os.sep, '/')
            vertices, faces = read_off(path)
            seq = np.random.SeedSequence([self.seed, zlib.crc32(rel.encode())])
            points = sample_surface(vertices, faces, self.num_points, seq)
            if points is None:
                skipped.add('mesh_without_area', rel)
                continue
            points = points @ Z_UP_TO_Y_UP.T  # (n, 3), z-up -> y-up
            data_list.append(self._example(points, label))
        return data_list

    def _warn_classes_without_meshes(self, split: str, files: List[Tuple[str, int]],
                                     cached: bool = False) -> None:
        r"""Warns where a class's :obj:`split` folder holds no ``<class>_*.off`` mesh, and keeps
        the names for the stats file (:meth:`_split_record`); :obj:`cached` for a cache whose
        stats file does not record them (:meth:`read_cache`)."""
        present = {label for _, label in files}
        names = [name for label, name in enumerate(MODELNET40_CLASSES) if label not in present]
        self._without_meshes[split] = names
        if names:
            # every class of ModelNet40.zip has meshes of both splits: a folder left empty (a
            # copy stopped part way) gave a split without that class, and no word
            more = f' and {len(names) - 5} more' if len(names) > 5 else ''
            listed = ('they are listed in the stats file in the processed folder' if not cached
                      else f"the processed files in '{self.processed_dir}', built before "
                      f"processing looked for them, are used as they are: force_reload=True "
                      f"rebuilds them and lists them in their stats file")
            warnings.warn(
                f"ModelNet40 (source='mesh'): {len(names)} of the 40 classes have no {split} "
                f"meshes ('{osp.join(self.raw_dir, '<class>', split, '<class>_*.off')}'): "
                f"{', '.join(names[:5])}{more}. The {split} split holds no shape of them "
                f"(every class of ModelNet40.zip has {split} meshes: a copy stopped part way?); "
                f"{listed}", stacklevel=_caller_stacklevel())

    def read_cache(self) -> None:
        super().read_cache()
        record = self.stats.get(self.split)
        if (self.source == 'mesh' and isinstance(record, dict)
                and 'classes_without_meshes' not in record):
            # a cache built before processing looked for them (reused: the check changed no
            # data) served a split without those classes, and no word: the raw folder, whose
            # meshes are those the cache was built from, tells, as processing would have
            self._warn_classes_without_meshes(self.split, self._mesh_files(self.split),
                                              cached=True)
            record['classes_without_meshes'] = list(self._without_meshes[self.split])

    def _split_record(self, split: str) -> Dict[str, object]:
        r"""The classes without meshes of :obj:`split` (``classes_without_meshes``), for the
        mesh source."""
        if split not in self._without_meshes:  # (the HDF5 source)
            return {}
        return {'classes_without_meshes': list(self._without_meshes[split])}

    def _check_mesh_folders(self) -> None:
        r"""A :class:`FileNotFoundError` where a split has no meshes, or a class folder lacks its
        ``train/`` or ``test/`` folder, for both splits before any mesh is read (the test
        split's was found only after every training mesh was sampled and ``train.pt``
        written)."""
        for split in ('train', 'test'):
            if not self._mesh_files(split):
                raise FileNotFoundError(
                    f"no {split} meshes found as "
                    f"'{osp.join(self.raw_dir, '<class>', split, '<class>_NNNN.off')}'")
        # every class of ModelNet40.zip has both folders: one without its split folder (a copy
        # stopped part way) gave a split without that class, and no word
        lacking = [osp.join(name, split) for split in ('train', 'test')
                   for name in MODELNET40_CLASSES
                   if not osp.isdir(osp.join(self.raw_dir, name, split))]
        if lacking:
            classes = {osp.dirname(rel) for rel in lacking}
            splits = sorted({osp.basename(rel) for rel in lacking}, reverse=True)  # train first
            raise FileNotFoundError(
                f"ModelNet40 (source='mesh'): {len(classes)} of the 40 class folders in "
                f"'{self.raw_dir}' lack their {' or '.join(repr(s) for s in splits)} folder: "
                f"{', '.join(lacking)}. Every "
                f"class of ModelNet40.zip has train/ and test/ meshes (a copy stopped part "
                f"way?): place them as "
                f"'{osp.join(self.raw_dir, '<class>', '{train,test}', '<class>_NNNN.off')}' "
                f"(from {self.url}), or empty '{self.raw_dir}' to download the whole archive")

    def _process_hdf5(self, split: str, skipped: SkipCounter) -> List[Data]:
        folder = osp.join(self.raw_dir, HDF5_FOLDER)
        names_path = osp.join(folder, 'shape_names.txt')
        with open(names_path) as f:
            names = [line.strip() for line in f if line.strip()]
        if tuple(names) != MODELNET40_CLASSES:
            raise CorruptRawFileError(
                names_path, 'expected the 40 ModelNet40 class names in sorted '
                'order, one per line')
        files = self._hdf5_files(folder, split)
        data_list = []
        for path in files:
            arrays = read_h5(path, ('data', 'label'))
            points = arrays['data']
            if points.ndim != 3 or points.shape[-1] != 3:
                raise CorruptRawFileError(
                    path, f"expected 'data' of shape (N, P, 3), got {points.shape}")
            if points.dtype.kind == 'b':
                raise CorruptRawFileError(path, "dataset 'data' holds booleans, not coordinates")
            labels = h5_class_labels(path, arrays['label'], len(points), len(MODELNET40_CLASSES))
            if not len(points):  # (every file of the release holds shapes: one cut short)
                raise CorruptRawFileError(path, 'holds no shapes')
            if self.num_points is not None and points.shape[1] < self.num_points:
                raise ValueError(f"'{path}' holds {points.shape[1]} points per shape, fewer than "
                                 f"num_points={self.num_points}")
            name = osp.basename(path)
            for j in tqdm(range(len(points)), desc=f'ModelNet40 {name}', disable=not self.log):
                # every point checked, not the kept ones alone: every cache (any num_points)
                # holds the same shapes in the same order
                if not np.isfinite(points[j]).all():
                    skipped.add('non_finite_points', f'{name}[{j}]')
                    continue
                shape = points[j] if self.num_points is None else points[j, :self.num_points]
                data_list.append(self._example(shape, int(labels[j])))
        return data_list

    @staticmethod
    def _hdf5_listing(folder: str, split: str) -> Optional[List[Tuple[str, int]]]:
        r"""The names of the HDF5 files that the release's ``<split>_files.txt`` in :obj:`folder`
        lists, with their line numbers; :obj:`None` where there is no such list."""
        listing = osp.join(folder, f'{split}_files.txt')
        if not osp.isfile(listing):
            return None
        with open(listing) as f:  # lines such as data/modelnet40_ply_hdf5_2048/ply_data_train0.h5
            # (the last part of the path, '/' or '\\' separated: copies edited on Windows)
            return [(line.strip().replace('\\', '/').rsplit('/', 1)[-1], number)
                    for number, line in enumerate(f, start=1) if line.strip()]

    @classmethod
    def _hdf5_files(cls, folder: str, split: str) -> List[str]:
        r"""The release's HDF5 files of :obj:`split`: those its ``<split>_files.txt`` lists (a
        listed file that is missing, e.g. a copy stopped part way, raises
        :class:`FileNotFoundError` rather than giving fewer shapes; a file listed twice, or one
        that the other split's list also names or that is the other split's, raises
        :class:`~torch_mz.datasets.common.CorruptRawFileError`: it would repeat shapes, or put
        test shapes into training), else, with a warning that their completeness cannot be
        checked, every ``ply_data_<split>*.h5`` in :obj:`folder`."""
        pattern = osp.join(folder, f'ply_data_{split}*.h5')
        listing = osp.join(folder, f'{split}_files.txt')
        listed = cls._hdf5_listing(folder, split)
        if listed is None:
            # (glob characters in the root, e.g. 'run[1]', are taken as they are)
            files = sorted(glob.glob(osp.join(glob.escape(folder), f'ply_data_{split}*.h5')))
            if not files:
                raise FileNotFoundError(f"no '{pattern}' files")
            warnings.warn(f"ModelNet40 (source='hdf5'): no '{listing}' (the release lists its "
                          f"files there), so it cannot be checked that every {split} file is "
                          f"present; reading the {len(files)} file(s) matching '{pattern}'")
            names = [osp.basename(p) for p in files]
        else:
            if not listed:
                raise CorruptRawFileError(listing, 'lists no file')
            first: Dict[str, int] = {}
            for name, number in listed:
                if name in first:
                    raise CorruptRawFileError(
                        listing, f"lists '{name}' twice (lines {first[name]} and {number}): its "
                        f"shapes would be read twice. Remove the repeated line, or copy the "
                        f"release's {osp.basename(listing)} again")
                first[name] = number
            names = [name for name, _ in listed]
            absent = [n for n in names if not osp.isfile(osp.join(folder, n))]
            if absent:
                raise FileNotFoundError(f"ModelNet40 (source='hdf5'): '{folder}' lacks {absent}, "
                                        f"which the release's {osp.basename(listing)} lists (a "
                                        f"copy stopped part way?): copy the release's files "
                                        f"again")
        other = 'test' if split == 'train' else 'train'
        other_listed = cls._hdf5_listing(folder, other)
        if other_listed is not None:
            theirs = {n for n, _ in other_listed}
            where = f"the release's {other}_files.txt lists it too"
        else:
            theirs = {osp.basename(p) for p in glob.glob(
                osp.join(glob.escape(folder), f'ply_data_{other}*.h5'))}
            where = f'its name is that of a {other} file (ply_data_{other}*.h5)'
        shared = [n for n in names if n in theirs]
        if shared:
            # (the globs of the two splits never match one file: a list names it)
            raise CorruptRawFileError(
                listing if listed is not None else osp.join(folder, f'{other}_files.txt'),
                f"'{shared[0]}' is one of the {split} files and {where}: a file in both splits "
                f"would put {'test' if split == 'train' else 'training'} shapes into "
                f"{'training' if split == 'train' else 'the test set'}. Copy the release's "
                f"train_files.txt and test_files.txt again")
        return [osp.join(folder, n) for n in names]

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({len(self)}, split={self.split}, source={self.source}, '
                f'num_points={self.num_points})')
