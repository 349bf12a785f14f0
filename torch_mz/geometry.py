r"""Ground-truth functions of the synthetic set tasks (Appendix A.2 and D of the MZAttn paper).

Every function here is pure NumPy / SciPy: it takes arrays, returns arrays or Python floats, draws
randomness only from the :class:`numpy.random.Generator` or seed it is given (an ``rng`` of
:obj:`None` is fresh randomness from the operating system, as :func:`numpy.random.default_rng`
gives; never NumPy's global state), and never touches torch. The
task generators in :mod:`torch_mz.datasets.synthetic` call them; the tests call them again on the
generated ``x`` to check the stored targets.

Point sets are ``(n, d)`` arrays, one point per row; all computation is in ``float64``.
"""
from __future__ import annotations

import math
import numbers
import operator
from typing import Any, Optional, Tuple, Union

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.spatial import ConvexHull, QhullError
from scipy.spatial.distance import cdist, pdist, squareform

from torch_mz._checks import check_flag, check_number, check_rate

__all__ = [
    'chamfer_distance',
    'aligned_chamfer_distance',
    'procrustes_rotation',
    'mst_weight',
    'convex_hull_volume',
    'min_enclosing_ball',
    'givens_rotation',
    'num_givens_angles',
    'frobenius_orthogonal_matrices',
    'quadratic_tdof_target',
    'sample_covariance',
    'covariance_frobenius_norm',
    'max_mahalanobis_distance',
    'pca_residual',
]

SeedLike = Union[None, int, np.random.Generator]


def _as_points(points, name: str = 'points', allow_empty: bool = True) -> np.ndarray:
    r"""Validates an ``(n, d)`` point array and returns it as ``float64``."""
    arr = np.asarray(points, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"'{name}' must be a 2-D array of shape (n, d), got shape {arr.shape}")
    if arr.shape[1] < 1:
        raise ValueError(f"'{name}' must have at least one coordinate (d >= 1), "
                         f"got shape {arr.shape}")
    if not allow_empty and arr.shape[0] == 0:
        raise ValueError(f"'{name}' must contain at least one point, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"'{name}' must be finite, got NaN or inf")
    return arr


def _as_integer(value: Any) -> Optional[int]:
    r"""``value`` as a Python :obj:`int` where it is an integer: a Python or NumPy integer, or a
    0-dimensional integer array or tensor (read through ``__index__``, without importing torch);
    :obj:`None` for anything else, among them a bool, a float (``2.0`` too) and a string."""
    if (isinstance(value, (bool, np.bool_)) or 'bool' in str(getattr(value, 'dtype', ''))
            or getattr(value, 'ndim', 0) != 0):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _as_generator(rng: SeedLike) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(rng)


# Magnitudes (of coordinates, or of distances) within which the plain float64 computations below
# are accurate: from _SAFE_LO to _SAFE_HI, about 3.9e-121 to 2.6e120, squares and pairwise products
# (about 1.5e-241 to 6.7e240) stay far inside the normal range, with room for sums, ratios and
# tolerances. Inputs beyond, where squaring could underflow (distinct points at distance 0,
# subnormal round-off) or overflow (inf, NaN), are scaled by a power of two to unit magnitude
# first; inputs within never are, and give the values of the plain computation, bit for bit.
# (mst_weight has a threshold of its own, _MST_DENSE_NULL.)
_SAFE_LO = 2.0 ** -400
_SAFE_HI = 2.0 ** 400


def _unit_exponent(*arrays: np.ndarray) -> int:
    r"""The exponent :math:`e` with :math:`2^{e-1} \leq \max |x| < 2^e` over the entries of
    ``arrays`` (:math:`0` when they are all zero): ``np.ldexp(x, -e)`` brings the largest to
    :math:`[1/2, 1)`, exactly (a power of two) except for entries that become subnormal, below
    :math:`2^{-1022}` once scaled, which lose low bits."""
    return math.frexp(max(float(np.abs(x).max(initial=0.0)) for x in arrays))[1]


def _scale_back(value: float, e: int, what: str) -> float:
    r""":math:`\text{value} \cdot 2^e` for a value computed on points scaled by :math:`2^{-e}`; a
    clear error where it leaves the float64 range (rather than inf, or 0 for a positive value)."""
    try:
        out = math.ldexp(value, e)
    except OverflowError:
        raise OverflowError(f"{what} ({value!r} * 2**{e}) exceeds the float64 range "
                            f"(about 1.8e308)") from None
    if out == 0.0 and value != 0.0:
        raise ValueError(f"{what} ({value!r} * 2**{e}) is below the smallest positive float64 "
                         f"(about 4.9e-324)")
    return out


def _unit_magnitude_if_extreme(x: np.ndarray) -> np.ndarray:
    r"""``x`` itself when its largest absolute entry is :math:`0` or lies in
    ``[_SAFE_LO, _SAFE_HI]``; otherwise ``x`` scaled by a power of two to a largest entry in
    :math:`[1/2, 1)` (for quantities that do not change under positive scaling)."""
    big = float(np.abs(x).max(initial=0.0))
    if big == 0.0 or _SAFE_LO <= big <= _SAFE_HI:
        return x
    return np.ldexp(x, -math.frexp(big)[1])


def _norms(diff: np.ndarray) -> np.ndarray:
    r"""Euclidean norms along the last axis of finite differences, each row divided by its largest
    absolute entry before squaring, so that no norm under- or overflows when the result does not
    (a norm is 0 only for a zero row)."""
    big = np.abs(diff).max(axis=-1, initial=0.0)  # (...,)
    unit = diff / np.where(big > 0.0, big, 1.0)[..., None]  # (..., d), entries in [-1, 1]
    return big * np.sqrt((unit * unit).sum(axis=-1))


# ---------------------------------------------------------------------------------------------
# Chamfer distances (Tasks B and F)
# ---------------------------------------------------------------------------------------------
def chamfer_distance(a, b, squared: bool = True, reduction: str = 'mean') -> float:
    r"""Symmetric Chamfer distance between two point sets (Task B of the paper).

    .. math::
        \mathrm{CD}(A, B) = \frac{1}{|A|} \sum_{a \in A} \min_{b \in B} \|a - b\|^2
        + \frac{1}{|B|} \sum_{b \in B} \min_{a \in A} \|a - b\|^2,

    the usual point-cloud convention (mean of squared nearest-neighbour distances, both ways).
    With ``squared=False`` plain Euclidean distances replace the squared ones; with
    ``reduction='sum'`` the nearest-neighbour distances are summed instead of averaged (the
    :math:`1/|A|` and :math:`1/|B|` factors dropped), so the value grows with the set sizes.

    With ``squared=False``, where a distance between distinct points is below about
    :math:`10^{-120}` (its square may underflow) or above about :math:`10^{154}` (its square
    overflows), the sets are scaled by a power of two to unit magnitude and the value scaled
    back, an :class:`OverflowError` where it exceeds the float64 range: the value is right at
    any common magnitude, but not for sets that mix magnitudes across float64's range: beside a
    point at :math:`10^{300}`, points :math:`10^{-300}` apart become one point once scaled, so
    their distance counts as 0. Squared distances are computed as they are, so beyond
    about :math:`10^{\pm 154}` they under- or overflow.

    Args:
        a (array_like): First set, shape :math:`(n_A, d)`, :math:`n_A \geq 1`.
        b (array_like): Second set, shape :math:`(n_B, d)`, :math:`n_B \geq 1`.
        squared (bool, optional): Use squared distances. (default: :obj:`True`)
        reduction (str, optional): ``'mean'`` or ``'sum'`` over the points of each set.
            (default: :obj:`'mean'`)

    Returns:
        float: :math:`\mathrm{CD}(A, B) \geq 0`; symmetric in its arguments, zero iff the two sets
        contain the same points.
    """
    a = _as_points(a, 'a', allow_empty=False)
    b = _as_points(b, 'b', allow_empty=False)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"'a' and 'b' must have the same dimension, "
                         f"got {a.shape[1]} and {b.shape[1]}")
    squared = check_flag('squared', squared)  # (the text 'False' was true: squared distances)
    if reduction not in ('mean', 'sum'):
        raise ValueError(f"'reduction' must be 'mean' or 'sum', got {reduction!r}")
    dist = cdist(a, b, 'sqeuclidean' if squared else 'euclidean')  # (n_A, n_B)
    if not squared:
        # cdist squares: a distance below _SAFE_LO may have underflowed (0 for distinct points),
        # an inf overflowed. Exact coincidences (0) are right; anything else: rescaled.
        i, j = np.nonzero(~(dist >= _SAFE_LO) | np.isinf(dist))
        if (a[i] != b[j]).any():
            return _chamfer_distance_rescaled(a, b, reduction)
    reduce = np.mean if reduction == 'mean' else np.sum
    return float(reduce(dist.min(axis=1)) + reduce(dist.min(axis=0)))


def _chamfer_distance_rescaled(a: np.ndarray, b: np.ndarray, reduction: str) -> float:
    r"""The unsquared :func:`chamfer_distance` of ``a`` and ``b`` computed on the sets scaled to
    unit magnitude by a power of two (it is homogeneous of degree one), the distances that
    underflow there recomputed by :func:`_norms`, and the value scaled back."""
    e = _unit_exponent(a, b)
    a, b = np.ldexp(a, -e), np.ldexp(b, -e)  # |entries| < 1: no distance overflows
    dist = cdist(a, b, 'euclidean')  # (n_A, n_B)
    i, j = np.nonzero(dist < _SAFE_LO)
    dist[i, j] = _norms(a[i] - b[j])
    reduce = np.mean if reduction == 'mean' else np.sum
    value = float(reduce(dist.min(axis=1)) + reduce(dist.min(axis=0)))
    return _scale_back(value, e, 'the Chamfer distance')


def procrustes_rotation(a, b) -> np.ndarray:
    r"""Rotation :math:`\hat R \in SO(d)` best aligning corresponding rows,
    :math:`b_i \approx \hat R a_i`.

    Solves the orthogonal Procrustes (Kabsch) problem restricted to proper rotations and without
    translation: :math:`\hat R = \arg\min_{R \in SO(d)} \sum_i \|R a_i - b_i\|^2`, from the
    singular value decomposition of :math:`\sum_i b_i a_i^\top`. :math:`\hat R` does not change
    when ``a`` or ``b`` is scaled by a positive factor: a set whose largest absolute coordinate is
    not :math:`0` but below about :math:`10^{-120}` or above about :math:`10^{120}` (where the
    products could under- or overflow) is scaled by a power of two to unit magnitude first. Should
    the decomposition still fail to converge, a :class:`ValueError` says so.

    Args:
        a (array_like): Shape :math:`(n, d)`.
        b (array_like): Shape :math:`(n, d)`, row :math:`i` corresponds to row :math:`i` of ``a``.

    Returns:
        numpy.ndarray: :math:`\hat R`, shape :math:`(d, d)`, orthogonal with determinant :math:`+1`.
    """
    a = _as_points(a, 'a', allow_empty=False)
    b = _as_points(b, 'b', allow_empty=False)
    if a.shape != b.shape:
        raise ValueError(f"'a' and 'b' must have the same shape (corresponding points), "
                         f"got {a.shape} and {b.shape}")
    a, b = _unit_magnitude_if_extreme(a), _unit_magnitude_if_extreme(b)
    cross = b.T @ a  # (d, d): sum_i b_i a_i^T
    try:
        u, _, vt = np.linalg.svd(cross)
    except np.linalg.LinAlgError as err:
        raise ValueError(f"procrustes_rotation: the singular value decomposition of the "
                         f"cross-covariance b^T a did not converge ({err})") from err
    sign = np.ones(a.shape[1])
    sign[-1] = np.sign(np.linalg.det(u @ vt)) or 1.0
    return (u * sign) @ vt  # (d, d)


def aligned_chamfer_distance(a, b, rotation=None, squared: bool = True,
                             reduction: str = 'mean') -> float:
    r"""Post-alignment Chamfer distance of rotation-dependent set matching (Task F of the paper).

    :math:`B` is modelled as :math:`B = R A + \varepsilon`; the target is the Chamfer distance
    (:func:`chamfer_distance`) after undoing the rotation,

    .. math::
        \mathrm{CD}_{\mathrm{aligned}}(A, B) = \mathrm{CD}(A, \{R^\top b : b \in B\}).

    ``rotation`` is the true :math:`R`. When it is :obj:`None`, :math:`R` is estimated by
    :func:`procrustes_rotation` from corresponding rows (so ``a`` and ``b`` must then have the same
    shape, row :math:`i` of ``b`` being the noisy image of row :math:`i` of ``a``).

    :math:`R^\top` undoes :math:`R` only for an orthogonal :math:`R`, so a given ``rotation`` must
    be orthogonal: a :class:`ValueError` is raised when an entry of :math:`R^\top R - I` exceeds
    :math:`10\,d\,\epsilon` in absolute value, :math:`\epsilon` the machine epsilon of
    ``rotation``'s floating-point dtype but at least float32's, :math:`2^{-23} \approx 1.2 \cdot
    10^{-7}` (rotations are often stored in float32 and handed back in float64; float16 ones get
    float16's).

    Args:
        a (array_like): Reference set, shape :math:`(n_A, d)`.
        b (array_like): Rotated noisy set, shape :math:`(n_B, d)`.
        rotation (array_like, optional): Orthogonal :math:`(d, d)` matrix :math:`R`, to the
            tolerance above. (default: :obj:`None`, Procrustes estimate)
        squared (bool, optional): Use squared distances. (default: :obj:`True`)
        reduction (str, optional): ``'mean'`` or ``'sum'``, as in :func:`chamfer_distance`.
            (default: :obj:`'mean'`)

    Returns:
        float: The aligned Chamfer distance.
    """
    a = _as_points(a, 'a', allow_empty=False)
    b = _as_points(b, 'b', allow_empty=False)
    d = a.shape[1]
    if b.shape[1] != d:
        raise ValueError(f"'a' and 'b' must have the same dimension, got {d} and {b.shape[1]}")
    if rotation is None:
        rot = procrustes_rotation(a, b)
    else:
        given = np.asarray(rotation)
        rot = np.asarray(rotation, dtype=np.float64)
        if rot.shape != (d, d):
            raise ValueError(f"'rotation' must have shape ({d}, {d}), got {rot.shape}")
        # (b @ R is R^{-1} b only for an orthogonal R: 2I gave CD(a, 2 b), silently)
        dtype = given.dtype if given.dtype.kind == 'f' else np.dtype(np.float64)
        eps = max(float(np.finfo(dtype).eps), float(np.finfo(np.float32).eps))
        tol = 10 * d * eps
        err = float(np.abs(rot.T @ rot - np.eye(d)).max())
        if not err <= tol:
            raise ValueError(f"'rotation' must be orthogonal (R^T R = I): the largest entry of "
                             f"|R^T R - I| is {err:.3g}, above the tolerance 10 d eps = {tol:.3g} "
                             f"(d = {d}, eps = {eps:.3g} for {dtype})")
    # Rows: b_i = R a_i + eps_i  =>  R^T b_i, i.e. b @ R.
    return chamfer_distance(a, b @ rot, squared=squared, reduction=reduction)


# ---------------------------------------------------------------------------------------------
# Minimum spanning tree (Task G) and convex hull volume (Appendix D.4.2)
# ---------------------------------------------------------------------------------------------
# minimum_spanning_tree reads the entries of a dense matrix within 1e-8 of 0 (np.isclose's default
# atol) as missing edges, which left distinct points out of the tree (scipy issue 11391)
_MST_DENSE_NULL = 1e-8


def mst_weight(points) -> float:
    r"""Total Euclidean edge length of the minimum spanning tree of a point set (Task G).

    Computed with :func:`scipy.sparse.csgraph.minimum_spanning_tree` on the dense distance matrix.
    Duplicate points are merged first (they join the tree through zero-length edges, which the
    sparse-graph convention would otherwise read as missing edges). No other edge goes missing:
    where a distance is at most :math:`10^{-8}` (the dense matrix reads such entries as missing
    edges, scipy issue 11391; this includes distances whose square underflows to 0) or above about
    :math:`10^{154}` (its square overflows to inf, also a missing edge), the points are scaled by a
    power of two to unit magnitude, every distance computed without under- or overflow, the tree
    found on a sparse matrix, and the weight scaled back, an :class:`OverflowError` where it
    exceeds the float64 range.

    Args:
        points (array_like): Shape :math:`(n, d)`.

    Returns:
        float: The MST weight; :math:`0` for :math:`n \leq 1` or coincident points, positive
        otherwise.
    """
    pts = _as_points(points)
    if pts.shape[0] <= 1:
        return 0.0
    flat = pdist(pts)  # (n (n - 1) / 2,)
    if not flat.all():
        pts = np.unique(pts, axis=0)
        if pts.shape[0] <= 1:
            return 0.0
        flat = pdist(pts)
    if not (flat.min() > _MST_DENSE_NULL and np.isfinite(flat).all()):
        # an edge the dense matrix would lose: at most 1e-8, or underflowed to 0, or inf
        return _mst_weight_rescaled(pts)
    return float(minimum_spanning_tree(squareform(flat)).sum())


def _mst_weight_rescaled(pts: np.ndarray) -> float:
    r""":func:`mst_weight` of distinct points computed on the points scaled to unit magnitude by a
    power of two (the weight is homogeneous of degree one), every distance by :func:`_norms` (none
    is 0 or inf), on a sparse matrix (which loses no small entry), the weight scaled back."""
    e = _unit_exponent(pts)
    pts = np.unique(np.ldexp(pts, -e), axis=0)  # (tiny entries may merge once scaled down)
    n = pts.shape[0]
    if n <= 1:
        return 0.0
    flat = np.concatenate([_norms(pts[i + 1:] - pts[i]) for i in range(n - 1)])  # pdist's order
    rows, cols = np.triu_indices(n, k=1)  # (n (n - 1) / 2,) each, the same order
    graph = csr_matrix((flat, (rows, cols)), shape=(n, n))
    weight = float(minimum_spanning_tree(graph).sum())
    return _scale_back(weight, e, 'the MST weight')


#: The largest dimension :func:`convex_hull_volume` passes to QHull. A hull of :math:`n` points
#: in :math:`d` dimensions may have on the order of :math:`n^{\lfloor d/2 \rfloor}` facets, so
#: QHull's cost grows about exponentially with :math:`d`, and on 52 points at :math:`d = 32`
#: scipy's ``ConvexHull`` ended the process with a segmentation fault; the paper's hull task
#: takes :math:`d \leq 9`.
MAX_HULL_DIM = 12


def convex_hull_volume(points, rtol: float = 1e-10) -> float:
    r"""Volume (:math:`d`-dimensional Lebesgue measure) of the convex hull of a point set.

    Computed with QHull (:class:`scipy.spatial.ConvexHull`) for :math:`d \geq 2`, and as
    :math:`\max - \min` for :math:`d = 1`, except for input judged degenerate, whose volume is
    :math:`0`, returned without calling QHull: fewer than :math:`d + 1` points, or points judged
    flat, i.e. whose smallest singular value after centring is at most ``rtol`` times the largest.

    That flatness test is relative, so it also gives :math:`0` for a full-dimensional set that is
    merely thin: a :math:`1 \times 1 \times 10^{-12}` box has volume :math:`10^{-12}`, which QHull
    computes, but gets :math:`0` at the default ``rtol``; a smaller ``rtol`` (e.g. ``1e-13``, or
    ``0`` to leave only exactly flat sets) passes such sets to QHull. A
    :class:`scipy.spatial.QhullError` raised on nearly flat input that passed the test is also
    mapped to :math:`0`.

    QHull's cost grows about exponentially with :math:`d` (and scipy's ``ConvexHull`` crashed the
    process at :math:`d = 32`), so a set that would reach it with :math:`d >`
    :data:`MAX_HULL_DIM` (12) raises a :class:`ValueError` instead, a volume beyond the
    float64 range an :class:`OverflowError`, and a positive one below the smallest positive
    float64 a :class:`ValueError`.

    Args:
        points (array_like): Shape :math:`(n, d)`.
        rtol (float, optional): Relative singular-value tolerance of the flatness test, a
            number in :math:`[0, 1)` (the ratio is at most :math:`1`, so from :math:`1` on every
            set, a cube too, would be flat): sets whose singular-value ratio is at most ``rtol``
            (flat or thin) have volume :math:`0`. (default: :obj:`1e-10`)

    Returns:
        float: The hull volume, :math:`\geq 0`.
    """
    # (rtol=True, and any rtol >= 1, made every set flat, volume 0; NaN none, not even an
    # exactly flat one)
    rtol = check_rate('rtol', rtol)
    pts = _as_points(points)
    n, d = pts.shape
    if n < d + 1:
        return 0.0
    if d == 1:
        with np.errstate(over='ignore'):
            length = float(pts.max() - pts.min())
        if math.isinf(length):  # (it returned inf)
            raise OverflowError(f"the convex hull volume ({float(pts.max())!r} - "
                                f"{float(pts.min())!r}) exceeds the float64 range (about 1.8e308)")
        return length
    centred = pts - pts.mean(axis=0)
    sv = np.linalg.svd(centred, compute_uv=False)
    if sv[0] == 0.0 or sv[d - 1] <= rtol * sv[0]:
        return 0.0
    if d > MAX_HULL_DIM:
        raise ValueError(f"convex_hull_volume: d = {d} is above MAX_HULL_DIM = {MAX_HULL_DIM}: "
                         f"QHull's cost grows about exponentially with d (scipy's ConvexHull "
                         f"crashed the process at d = 32)")
    # (a centred extent below 2**-200 QHull measured without an error but wrongly: 1.7% too
    # small at 2**-270, d = 3; such a set, and coordinates beyond 2**200, go to unit extent)
    extreme = (float(np.abs(pts).max()) > 2.0 ** 200
               or float(np.abs(centred).max()) < 2.0 ** -200)
    try:
        volume = float(ConvexHull(pts).volume) if not extreme else math.inf
        if math.isfinite(volume):
            return volume
    except QhullError:
        pass
    # QHull's precision checks fail at extreme magnitudes (coordinates of 1e80) although the
    # flatness test passed, and its volume overflowed to inf: once more at unit extent (a power
    # of two, exact), the volume scaled back by 2**(d e) in one step (extent ** d overflowed for
    # a thin set whose volume does not)
    e = _unit_exponent(centred)
    try:
        volume = float(ConvexHull(np.ldexp(centred, -e)).volume)
    except QhullError:
        return 0.0
    return _scale_back(volume, d * e, 'the convex hull volume')


# ---------------------------------------------------------------------------------------------
# Minimum enclosing ball (Appendix D.4.1)
# ---------------------------------------------------------------------------------------------
def _affine_coefficients(support: np.ndarray) -> Optional[np.ndarray]:
    r"""Affine coordinates :math:`\lambda` (:math:`\sum_i \lambda_i = 1`) of the circumcentre of
    ``support`` (``k`` affinely independent points) within their affine hull, or :obj:`None` when
    the points are (numerically) affinely dependent.

    The circumcentre is :math:`c = p_0 + V^\top \beta` with :math:`V = (p_i - p_0)_{i \geq 1}` and
    :math:`(V V^\top) \beta = \frac12 \mathrm{diag}(V V^\top)`; then
    :math:`\lambda = (1 - \sum\beta, \beta)`.
    """
    k = support.shape[0]
    if k == 1:
        return np.ones(1)
    v = support[1:] - support[0]  # (k - 1, d)
    gram = v @ v.T  # (k - 1, k - 1)
    eig = np.linalg.eigvalsh(gram)
    if eig[0] <= 1e-12 * max(eig[-1], np.finfo(np.float64).tiny):
        return None
    beta = np.linalg.solve(gram, 0.5 * np.diag(gram))  # (k - 1,)
    return np.concatenate([[1.0 - beta.sum()], beta])


def _circumball(support: np.ndarray) -> Tuple[np.ndarray, float]:
    r"""Smallest ball with every row of ``support`` (``k <= d + 1`` points) on its boundary; an
    affinely dependent support (reachable only through round-off) falls back to least squares."""
    lam = _affine_coefficients(support)
    if lam is None:
        v = support[1:] - support[0]  # (k - 1, d)
        gram = v @ v.T
        beta = np.linalg.lstsq(gram, 0.5 * np.diag(gram), rcond=None)[0]
        center = support[0] + beta @ v
    else:
        center = lam @ support  # (d,)
    return center, float(((support - center) ** 2).sum(axis=1).max())


def _mtf_ball(points: np.ndarray, order: list, end: int, support: list,
              tol: float) -> Tuple[Optional[np.ndarray], float]:
    r"""Smallest ball enclosing ``points[order[:end]]`` with ``points[support]`` on its boundary.

    Welzl's recursion unrolled over the list ``order[:end]`` (move-to-front variant): the recursion
    depth is bounded by the support size, at most :math:`d + 1`, never by the number of points.
    """
    d = points.shape[1]
    if support:
        center, r2 = _circumball(points[support])
    else:
        center, r2 = None, -1.0
    if len(support) == d + 1:
        return center, r2
    i = 0
    while i < end:
        if center is None:
            j = i  # empty ball: every point violates it
        else:
            cand = points[order[i:end]]  # (end - i, d)
            dist2 = ((cand - center) ** 2).sum(axis=1)
            outside = np.flatnonzero(dist2 > r2 + tol)
            if outside.size == 0:
                break
            j = i + int(outside[0])
        p = order[j]
        center, r2 = _mtf_ball(points, order, j, support + [p], tol)
        # Move the violator to the front; order[:j + 1] keeps the same set of points.
        del order[j]
        order.insert(0, p)
        i = j + 1
    return center, r2


def _welzl(points: np.ndarray, tol: float) -> np.ndarray:
    r"""Centre of the minimum enclosing ball by Welzl's algorithm, move-to-front variant."""
    # Farthest-from-centroid first: extreme points enter the support early (a deterministic
    # stand-in for Welzl's random order that needs fewer restarts).
    order = np.argsort(-(points ** 2).sum(axis=1), kind='stable').tolist()
    center, _ = _mtf_ball(points, order, len(order), [], tol)
    assert center is not None  # at least one point, so the first one opens a ball
    return center


def _active_set(points: np.ndarray, tol: float, max_iter: int) -> Optional[np.ndarray]:
    r"""Centre of the minimum enclosing ball by a primal active-set method on the dual problem

    .. math::
        \min_{\lambda \in \Delta_n} \|P^\top \lambda\|^2 - \sum_i \lambda_i \|p_i\|^2,
        \qquad c = P^\top \lambda,

    a simplex-like pivoting scheme in the spirit of Fischer, Gärtner and Kutz (2003): the working
    set is an affinely independent set of boundary candidates whose circumcentre is the current
    sub-problem optimum. Returns :obj:`None` when it does not finish within ``max_iter`` pivots.
    """
    sq = (points ** 2).sum(axis=1)  # (n,)
    work = [int(np.argmax(sq))]
    lam = np.ones(1)  # affine weights of the working set, all >= 0, summing to one
    for _ in range(max_iter):
        target = _affine_coefficients(points[work])
        if target is None:
            return None
        if target.min() >= 0.0:
            # Sub-problem optimum is feasible: the ball through the working set, centred in its
            # convex hull. Optimal iff no point lies outside; otherwise pivot the farthest one in.
            lam = target
            center = lam @ points[work]  # (d,)
            dist2 = ((points - center) ** 2).sum(axis=1)  # (n,)
            r2 = float(dist2[work].max())
            j = int(np.argmax(dist2))
            if dist2[j] <= r2 + tol:
                return center
            base = points[work[0]]
            v = points[work[1:]] - base  # (k - 1, d)
            coef = (np.linalg.lstsq(v.T, points[j] - base, rcond=None)[0]
                    if len(work) > 1 else np.zeros(0))
            resid = points[j] - base - coef @ v  # (d,)
            if float(resid @ resid) > 1e-12 * max(float(v.ravel() @ v.ravel()), tol):
                work.append(j)
                lam = np.concatenate([lam, [0.0]])
                continue
            # p_j lies in the affine hull of the working set: along the affine dependency
            # delta (sum 0, sum delta_i p_i = 0, delta_j = 1) the centre stays put while the
            # objective decreases; walk until a working point's weight hits zero, then swap.
            delta = np.concatenate([[coef.sum() - 1.0], -coef])  # weights on the working set
            neg = delta < 0.0
            ratios = np.full(delta.shape, np.inf)
            ratios[neg] = lam[neg] / -delta[neg]
            k = int(np.argmin(ratios))
            lam = lam + ratios[k] * delta
            lam = np.concatenate([np.delete(lam, k), [ratios[k]]])
            work = [w for i, w in enumerate(work) if i != k] + [j]
            continue
        # Infeasible sub-problem optimum: step towards it until the first weight hits zero.
        step = target - lam
        neg = step < 0.0
        ratios = np.full(step.shape, np.inf)
        ratios[neg] = lam[neg] / -step[neg]
        k = int(np.argmin(ratios))
        alpha = min(1.0, float(ratios[k]))
        lam = np.delete(lam + alpha * step, k)
        lam = np.clip(lam, 0.0, None)
        lam = lam / lam.sum()
        del work[k]
    return None


def min_enclosing_ball(points, method: str = 'active-set',
                       tol: float = 1e-10) -> Tuple[np.ndarray, float]:
    r"""Exact minimum enclosing ball (smallest enclosing sphere) of a point set in any dimension.

    The ball :math:`B(c, r)` minimising :math:`r` subject to :math:`\|p_i - c\| \leq r` for every
    point is unique; it is determined by at most :math:`d + 1` boundary points and its centre lies
    in their convex hull (the optimality certificate checked by the tests).

    Two exact (combinatorial, finite) algorithms are available and agree to round-off:

    * ``'welzl'``: Welzl's algorithm [Welzl, 1991] in its move-to-front form, as used for the
      paper's MEB ground truth (Appendix D.4.1). Fast for :math:`d \lesssim 10`; its cost grows
      quickly with the support size.
    * ``'active-set'`` (default): a simplex-like pivoting method on the dual quadratic program
      (Fischer, Gärtner and Kutz, 2003), fast in high dimension as well; falls back to ``'welzl'``
      should it exceed its pivot budget (only conceivable on degenerate input).

    Points are centred first for numerical stability. A point counts as inside when its squared
    distance to the centre exceeds :math:`r^2` by at most ``tol`` times the squared extent of the
    set. The returned radius is the largest distance of the centred points to the centre found,
    so in the centred coordinates the ball encloses every point exactly; the returned centre is
    shifted back by the points' mean, whose rounding can leave a point outside by a few units in
    the last place of the coordinates (2e-8 relative at an offset of 1e9).

    The algorithms work on squared coordinates, so a set whose coordinates exceed about
    :math:`10^{120}`, or whose centred extent is below about :math:`10^{-120}` without being
    :math:`0`, is scaled by a power of two to unit magnitude first, and the ball scaled back: the
    result is that of the scaled set, exactly rescaled. A radius beyond the float64 range raises
    an :class:`OverflowError`, a positive one that rounds to :math:`0` a :class:`ValueError`
    (radii below about :math:`2.2 \cdot 10^{-308}` keep the reduced precision of subnormal
    numbers).

    Args:
        points (array_like): Shape :math:`(n, d)`, :math:`n \geq 1`.
        method (str, optional): ``'active-set'`` or ``'welzl'``. (default: :obj:`'active-set'`)
        tol (float, optional): Relative inside-tolerance. (default: :obj:`1e-10`)

    Returns:
        (numpy.ndarray, float): The centre, shape :math:`(d,)`, and the radius :math:`r \geq 0`.
    """
    if method not in ('active-set', 'welzl'):
        raise ValueError(f"'method' must be 'active-set' or 'welzl', got {method!r}")
    if (isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not math.isfinite(tol)
            or tol < 0):  # (a negative one grew the ball far beyond the smallest)
        raise ValueError(f"'tol' must be a finite number >= 0, got {tol!r}")
    pts = _as_points(points, allow_empty=False)
    if float(np.abs(pts).max()) > _SAFE_HI:  # (before the mean, which may overflow)
        return _min_enclosing_ball_rescaled(pts, method, tol)
    shift = pts.mean(axis=0)
    centred = pts - shift  # (n, d)
    if 0.0 < float(np.abs(centred).max()) < _SAFE_LO:
        return _min_enclosing_ball_rescaled(pts, method, tol)
    return _min_enclosing_ball_centred(centred, shift, method, tol)


def _min_enclosing_ball_centred(centred: np.ndarray, shift: np.ndarray, method: str,
                                tol: float) -> Tuple[np.ndarray, float]:
    r""":func:`min_enclosing_ball` of the points ``centred + shift``, given centred."""
    scale = float((centred ** 2).sum(axis=1).max())
    if scale == 0.0:
        return shift, 0.0
    center = None
    if method == 'active-set':
        center = _active_set(centred, tol * scale,
                             max_iter=50 * (centred.shape[0] + centred.shape[1]))
    if center is None:
        center = _welzl(centred, tol * scale)
    radius = float(np.sqrt(((centred - center) ** 2).sum(axis=1).max()))
    return center + shift, radius


def _min_enclosing_ball_rescaled(pts: np.ndarray, method: str,
                                 tol: float) -> Tuple[np.ndarray, float]:
    r""":func:`min_enclosing_ball` computed on the points scaled to unit magnitude by a power of
    two, where no square under- or overflows, the ball scaled back exactly."""
    e = _unit_exponent(pts)
    unit = np.ldexp(pts, -e)  # (n, d), largest |entry| in [1/2, 1)
    shift = unit.mean(axis=0)
    center, radius = _min_enclosing_ball_centred(unit - shift, shift, method, tol)
    with np.errstate(over='ignore'):
        center = np.ldexp(center, e)
    if not np.isfinite(center).all():  # (only by rounding beyond a coordinate near 1.8e308)
        raise OverflowError(f"the centre of the minimum enclosing ball exceeds the float64 range "
                            f"(about 1.8e308): {center}")
    return center, _scale_back(radius, e, 'the minimum enclosing ball radius')


# ---------------------------------------------------------------------------------------------
# Rotations (Task F) and the quadratic TDOF target (Eq. 4)
# ---------------------------------------------------------------------------------------------
def num_givens_angles(d: int) -> int:
    r"""Number of Givens planes (coordinate planes) in :math:`\mathbb{R}^d`, :math:`d(d-1)/2`.

    Args:
        d (int): Dimension.
    """
    n = _as_integer(d)
    if n is None or n < 0:  # (2.0 and True were refused here but not by givens_rotation)
        raise ValueError(f"'d' must be an integer >= 0 (got {d!r})")
    return n * (n - 1) // 2


def givens_rotation(d: int, angles) -> np.ndarray:
    r"""Rotation composed of Givens rotations in all :math:`d(d-1)/2` coordinate planes (Task F).

    .. math::
        R(\theta) = \prod_{(i, j):\, i < j} G_{ij}(\theta_{ij}), \qquad
        G_{ij}(\theta) = I + (\cos\theta - 1)(e_i e_i^\top + e_j e_j^\top)
        - \sin\theta\,(e_i e_j^\top - e_j e_i^\top),

    with the planes in lexicographic order :math:`(0,1), (0,2), \dots, (d-2, d-1)` and the product
    taken left to right. :math:`R(\theta) \in SO(d)`; :math:`R(0) = I`.

    Args:
        d (int): Dimension, :math:`d \geq 1`.
        angles (array_like): Angles :math:`\theta`, shape :math:`(\dots, d(d-1)/2)`; leading
            dimensions are batch dimensions.

    Returns:
        numpy.ndarray: Shape :math:`(\dots, d, d)`.
    """
    n = _as_integer(d)
    if n is None or n < 1:  # (int(d) != d let 2.0, and True as d = 1, through)
        raise ValueError(f"'d' must be a positive integer, got {d!r}")
    d = n
    theta = np.asarray(angles, dtype=np.float64)
    num = num_givens_angles(d)
    if theta.ndim == 0 or theta.shape[-1] != num:
        raise ValueError(f"'angles' must have shape (..., {num}) for d={d}, got {theta.shape}")
    if not np.isfinite(theta).all():  # (NaN or inf gave a NaN matrix, silently)
        raise ValueError("'angles' must be finite, got NaN or inf")
    batch = theta.shape[:-1]
    # Work on R^T, whose rows are the columns of R: right-multiplying R by G_ij only mixes
    # columns i and j, i.e. two contiguous rows of R^T.
    rot_t = np.broadcast_to(np.eye(d), batch + (d, d)).copy()  # (..., d, d)
    cos, sin = np.cos(theta)[..., None], np.sin(theta)[..., None]  # (..., P, 1)
    k = 0
    for i in range(d - 1):
        for j in range(i + 1, d):
            c, s = cos[..., k, :], sin[..., k, :]  # (..., 1)
            row_i = rot_t[..., i, :]  # (..., d)
            row_j = rot_t[..., j, :]  # (..., d)
            new_i = c * row_i + s * row_j
            rot_t[..., j, :] = c * row_j - s * row_i
            rot_t[..., i, :] = new_i
            k += 1
    return np.ascontiguousarray(np.swapaxes(rot_t, -1, -2))


def frobenius_orthogonal_matrices(num: int, d: int, rng: SeedLike = None) -> np.ndarray:
    r"""Random :math:`d \times d` matrices orthonormal in the Frobenius inner product.

    Draws :math:`d^2 \times` ``num`` i.i.d. standard Gaussians, orthonormalises the columns by a QR
    decomposition (signs fixed so that the result is Haar-distributed on the Stiefel manifold) and
    reshapes each column into a matrix, so that
    :math:`\langle M_i, M_j \rangle_F = \mathrm{tr}(M_i^\top M_j) = \delta_{ij}`.

    Args:
        num (int): Number of matrices, :math:`1 \leq` ``num`` :math:`\leq d^2`.
        d (int): Matrix size.
        rng (numpy.random.Generator or int, optional): Random source or seed. (default: :obj:`None`)

    Returns:
        numpy.ndarray: Shape :math:`(\text{num}, d, d)`.
    """
    size, count = _as_integer(d), _as_integer(num)
    if size is None or size < 1:  # (int(d) != d let 2.0, and True as d = 1, through)
        raise ValueError(f"'d' must be a positive integer, got {d!r}")
    if count is None or count < 1 or count > size * size:
        raise ValueError(f"'num' must be an integer in [1, d^2 = {size * size}] (at most d^2 "
                         f"matrices can be Frobenius-orthonormal in R^{size}x{size}), got {num!r}")
    num, d = count, size
    gauss = _as_generator(rng).standard_normal((d * d, num))
    q, r = np.linalg.qr(gauss)  # q: (d^2, num)
    signs = np.sign(np.diag(r))
    signs[signs == 0] = 1.0
    q = q * signs
    return np.ascontiguousarray(q.T.reshape(num, d, d))


def quadratic_tdof_target(mu, w, m0, ms) -> np.ndarray:
    r"""Quadratic target of transformation degrees of freedom :math:`L` (Eq. 4 of the paper).

    .. math::
        f(S) = w^\top \Big(M_0 + \sum_{l=1}^{L} \mu(S)_l M_l\Big) \mu(S),

    where :math:`\mu(S) \in \mathbb{R}^d` is the set mean; the generators act through the first
    :math:`L` coordinates of :math:`\mu`, so :math:`L \leq d`. With Frobenius-orthogonal
    :math:`M_l` (:func:`frobenius_orthogonal_matrices`) the target has :math:`\mathrm{TDOF} = L`.

    Args:
        mu (array_like): Set means, shape :math:`(d,)` or :math:`(B, d)`.
        w (array_like): Read-out vector, shape :math:`(d,)`.
        m0 (array_like): Constant matrix :math:`M_0`, shape :math:`(d, d)`.
        ms (array_like): Generators :math:`M_1, \dots, M_L`, shape :math:`(L, d, d)`.

    Returns:
        numpy.ndarray: Shape :math:`()` or :math:`(B,)`.
    """
    mu = np.asarray(mu, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    m0 = np.asarray(m0, dtype=np.float64)
    ms = np.asarray(ms, dtype=np.float64)
    if mu.ndim not in (1, 2):
        raise ValueError(f"'mu' must have shape (d,) or (B, d), got {mu.shape}")
    d = mu.shape[-1]
    if w.shape != (d,) or m0.shape != (d, d):
        raise ValueError(f"'w' and 'm0' must have shapes ({d},) and ({d}, {d}), "
                         f"got {w.shape} and {m0.shape}")
    if ms.ndim != 3 or ms.shape[1:] != (d, d) or ms.shape[0] > d:
        raise ValueError(f"'ms' must have shape (L, {d}, {d}) with L <= d = {d}, got {ms.shape}")
    num = ms.shape[0]
    op = m0 + np.einsum('...l,lij->...ij', mu[..., :num], ms)  # (..., d, d)
    return np.einsum('i,...ij,...j->...', w, op, mu)


# ---------------------------------------------------------------------------------------------
# Second-order statistics (the "statistical" targets of Table 7 / Proposition 12)
# ---------------------------------------------------------------------------------------------
def sample_covariance(points) -> np.ndarray:
    r"""Biased sample covariance :math:`\hat\Sigma(S) = \frac{1}{n}\sum_i (x_i - \bar x)
    (x_i - \bar x)^\top` of a point set (the normalisation the paper's Proposition 12 uses).

    Args:
        points (array_like): Shape :math:`(n, d)`, :math:`n \geq 1`.

    Returns:
        numpy.ndarray: Shape :math:`(d, d)`, symmetric positive semi-definite.
    """
    pts = _as_points(points, allow_empty=False)
    centred = pts - pts.mean(axis=0)  # (n, d)
    return centred.T @ centred / pts.shape[0]  # (d, d)


def covariance_frobenius_norm(points) -> float:
    r"""Frobenius norm :math:`\|\hat\Sigma(S)\|_F` of the sample covariance
    (:func:`sample_covariance`); invariant under rotations, reflections and translations.

    The norm squares the covariance, so a set whose coordinates exceed about :math:`10^{60}`, or
    whose centred extent is below about :math:`10^{-60}` without being :math:`0`, is scaled by a
    power of two to unit magnitude first and the value scaled back: an :class:`OverflowError`
    where it exceeds the float64 range, a :class:`ValueError` where a positive value is below
    the smallest positive float64.

    Args:
        points (array_like): Shape :math:`(n, d)`, :math:`n \geq 1`.

    Returns:
        float: :math:`\sqrt{\sum_k \lambda_k^2}` over the eigenvalues of :math:`\hat\Sigma`.
    """
    pts = _as_points(points, allow_empty=False)
    # The norm squares the covariance's entries, i.e. raises the coordinates to the fourth power:
    # beyond 2**200 it overflowed (inf for coordinates of 1e80), below 2**-200 it underflowed
    # (0.0 for points 1e-90 apart), where the value itself does neither. The value is
    # homogeneous of degree two, so such a set is scaled by a power of two to unit magnitude.
    if (float(np.abs(pts).max()) > 2.0 ** 200
            or 0.0 < float(np.abs(pts - pts.mean(axis=0)).max()) < 2.0 ** -200):
        e = _unit_exponent(pts)
        value = float(np.linalg.norm(sample_covariance(np.ldexp(pts, -e)), 'fro'))
        return _scale_back(value, 2 * e, 'the covariance Frobenius norm')
    return float(np.linalg.norm(sample_covariance(pts), 'fro'))


def max_mahalanobis_distance(points, ridge: float = 1e-6) -> float:
    r"""Largest Mahalanobis distance of a point of the set from the set's mean, under the set's own
    (regularised) covariance:

    .. math::
        \max_i \sqrt{(x_i - \bar x)^\top \big(\hat\Sigma(S) + \lambda I\big)^{-1}
        (x_i - \bar x)}, \qquad \lambda = \text{ridge} \cdot \mathrm{tr}\,\hat\Sigma / d.

    The paper names a "Mahalanobis distance" target (Table 7; TDOF :math:`d(d+1)/2`, Proposition 12)
    without saying which point is measured; the largest distance over the set (an outlier score) is
    this package's permutation-invariant choice. The ridge is relative to the mean variance, so the
    target is invariant under rotations, translations and isotropic scaling (and, up to the ridge,
    under every invertible affine map). With :math:`n > d` points in general position
    :math:`\hat\Sigma` is invertible and the value is at most :math:`\sqrt{n - 1}`. The
    covariance would under- or overflow for coordinates beyond about :math:`10^{120}` or a
    centred extent below about :math:`10^{-120}` (other than :math:`0`): such a set is scaled by a
    power of two to unit magnitude first, which leaves the value unchanged.

    Args:
        points (array_like): Shape :math:`(n, d)`, :math:`n \geq 1`.
        ridge (float, optional): Relative ridge :math:`\lambda`, finite and positive.
            (default: :obj:`1e-6`)

    Returns:
        float: The distance; :math:`0` when all points coincide.
    """
    pts = _as_points(points, allow_empty=False)
    ridge = check_number('ridge', ridge)  # (inf passed 'ridge > 0' and gave NaN)
    if (float(np.abs(pts).max()) > _SAFE_HI
            or 0.0 < float(np.abs(pts - pts.mean(axis=0)).max()) < _SAFE_LO):
        # the covariance would under- (0: "all points coincide") or overflow (NaN): the value
        # is scale-invariant, so computed at unit magnitude
        pts = np.ldexp(pts, -_unit_exponent(pts))
    d = pts.shape[1]
    cov = sample_covariance(pts)  # (d, d)
    scale = np.trace(cov) / d
    if scale == 0.0:
        return 0.0
    centred = pts - pts.mean(axis=0)  # (n, d)
    solved = np.linalg.solve(cov + ridge * scale * np.eye(d), centred.T)  # (d, n)
    sq = np.einsum('nd,dn->n', centred, solved)  # (n,)
    return float(np.sqrt(max(sq.max(), 0.0)))


def pca_residual(points, k: int = 2) -> float:
    r"""Mean squared reconstruction error of the set by its own top-:math:`k` principal components:

    .. math::
        \frac{1}{n} \sum_i \big\|(I - P_k)(x_i - \bar x)\big\|^2 = \sum_{j > k} \lambda_j,

    where :math:`P_k` projects onto the :math:`k` leading eigenvectors of :math:`\hat\Sigma(S)`
    (:func:`sample_covariance`) and :math:`\lambda_1 \geq \dots \geq \lambda_d` are its
    eigenvalues. Invariant under rotations, reflections and translations.

    Args:
        points (array_like): Shape :math:`(n, d)`, :math:`n \geq 1`.
        k (int, optional): Number of components kept, :math:`0 \leq k \leq d`.
            (default: :obj:`2`)

    Returns:
        float: The residual, :math:`\geq 0`.
    """
    pts = _as_points(points, allow_empty=False)
    d = pts.shape[1]
    kept = _as_integer(k)
    if kept is None or not 0 <= kept <= d:  # (int(k) != k let 1.0, and True as 1, through)
        raise ValueError(f"'k' must be an integer in [0, d = {d}], got {k!r}")
    eig = np.linalg.eigvalsh(sample_covariance(pts))  # (d,), ascending
    return float(max(eig[:d - kept].sum(), 0.0))
