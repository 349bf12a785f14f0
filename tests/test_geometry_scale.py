r"""torch_mz.geometry at extreme magnitudes (under- and overflow of squared coordinates), the
orthogonality check of aligned_chamfer_distance and the documented flatness tolerance of
convex_hull_volume."""
import itertools
import math

import numpy as np
import pytest

from tests.test_geometry import random_rotation
from torch_mz.geometry import (
    aligned_chamfer_distance,
    chamfer_distance,
    convex_hull_volume,
    givens_rotation,
    max_mahalanobis_distance,
    min_enclosing_ball,
    mst_weight,
    procrustes_rotation,
)


def prim(points):
    r"""MST weight by Prim's algorithm on distances computed by np.linalg.norm (which does not
    square through the underflow range at unit magnitude)."""
    dist = np.linalg.norm(points[:, None] - points[None], axis=-1)
    best, done, total = dist[0].copy(), np.zeros(len(points), dtype=bool), 0.0
    done[0] = True
    for _ in range(len(points) - 1):
        j = int(np.argmin(np.where(done, np.inf, best)))
        total, done[j] = total + best[j], True
        best = np.minimum(best, dist[j])
    return total


# ---------------------------------------------------------------------------------------------
# F1: MST
# ---------------------------------------------------------------------------------------------
def test_mst_keeps_edges_whose_square_overflows():
    # pdist squares: distances above ~1.3e154 were inf, which the sparse graph read as missing
    # edges (a spanning forest of weight 1.0 instead of 2e154)
    assert mst_weight([[0.0, 0.0], [1.0, 0.0], [2e154, 0.0]]) == pytest.approx(2e154, rel=1e-15)
    assert mst_weight([[0.0], [1e160]]) == 1e160  # (was 0.0)
    x = np.random.default_rng(0).standard_normal((12, 5))
    for k in (520, 900, 1015):
        assert mst_weight(np.ldexp(x, k)) == pytest.approx(math.ldexp(prim(x), k), rel=1e-13)


def test_mst_keeps_edges_the_dense_matrix_reads_as_missing():
    # minimum_spanning_tree reads dense entries <= 1e-8 as missing edges (scipy issue 11391):
    # a set of extent 1e-9 had MST weight 0, and single short edges were dropped
    x = np.random.default_rng(1).standard_normal((15, 3))
    for scale in (1e-9, 1e-12, 1e-100, 1e-170, 1e-300):
        assert mst_weight(x * scale) == pytest.approx(prim(x) * scale, rel=1e-13)
    assert mst_weight([[0.0], [3e-170]]) == 3e-170  # (was 0.0)
    # one edge of 5e-9 next to edges of length 1: the tree is 2 + 5e-9, not 3 by a detour
    pts = np.array([[0.0, 0.0], [0.0, 5e-9], [1.0, 0.0], [2.0, 0.0]])
    assert mst_weight(pts) == pytest.approx(2.0 + 5e-9, rel=1e-15, abs=0)
    # coincident points still count once; n <= 1 is 0
    assert mst_weight([[1e-300, 0.0], [1e-300, 0.0], [0.0, 0.0]]) == 1e-300
    assert mst_weight([[5e-324]]) == 0.0


def test_mst_weight_beyond_float64_raises():
    with pytest.raises(OverflowError, match='MST weight .* exceeds the float64 range'):
        mst_weight([[-1.7e308, -1.7e308], [1.7e308, 1.7e308]])
    # just inside the range
    assert mst_weight([[-1.7e308], [0.0], [1e300]]) == pytest.approx(1.7e308 + 1e300)


# ---------------------------------------------------------------------------------------------
# F2: minimum enclosing ball
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize('method', ['active-set', 'welzl'])
def test_meb_at_extreme_magnitudes(method):
    # squared centred coordinates under- or overflowed: radius 0 for distinct points (1e-300),
    # 12% off in the subnormal range (1e-160), inf (1e300)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((20, 5))
    c0, r0 = min_enclosing_ball(q, method=method)
    for s in (1e-160, 1e-200, 1e-300, 1e150, 1e300):
        c, r = min_enclosing_ball(q * s, method=method)
        assert r == pytest.approx(r0 * s, rel=1e-12)
        np.testing.assert_allclose(c / s, c0, rtol=0, atol=1e-9)
    # an offset far larger than the extent: centred, the extent is 1e-150
    c, r = min_enclosing_ball(q * 1e-150 + 1e-140, method=method)
    assert r == pytest.approx(r0 * 1e-150, rel=1e-5)  # (the offset's rounding: 1e-10 relative)
    assert min_enclosing_ball([[0.0], [1e-300]], method=method)[1] == 5e-301
    assert min_enclosing_ball([[1e300], [-1e300]], method=method)[1] == 1e300
    assert min_enclosing_ball(np.full((3, 2), 1e300), method=method)[1] == 0.0


def test_meb_radius_outside_float64_raises():
    with pytest.raises(OverflowError, match='radius .* exceeds the float64 range'):
        min_enclosing_ball([[-1.7e308, -1.7e308], [1.7e308, 1.7e308]])
    # distinct points 5e-324 apart: the radius 2.5e-324 rounds to 0
    with pytest.raises(ValueError, match='radius .* below the smallest positive float64'):
        min_enclosing_ball([[0.0], [5e-324]])
    c, r = min_enclosing_ball([[-1.7e308], [1.7e308]])  # representable
    assert r == 1.7e308 and c[0] == 0.0


# ---------------------------------------------------------------------------------------------
# F3: Mahalanobis distance
# ---------------------------------------------------------------------------------------------
def test_max_mahalanobis_distance_is_scale_invariant_at_extreme_magnitudes():
    # the covariance underflowed to 0 (1e-170: "all points coincide", 0.0) or overflowed
    # (1e160: NaN)
    rng = np.random.default_rng(5)
    p = rng.standard_normal((12, 3))
    m0 = max_mahalanobis_distance(p)
    for s in (1e-170, 1e-300, 1e160, 1e300):
        assert max_mahalanobis_distance(p * s) == pytest.approx(m0, rel=1e-12)
        assert max_mahalanobis_distance(p * s + 10 * s) == pytest.approx(m0, rel=1e-9)
    assert max_mahalanobis_distance(np.full((4, 2), 1e300)) == 0.0  # coincident points


# ---------------------------------------------------------------------------------------------
# F4: unsquared Chamfer distance, Procrustes
# ---------------------------------------------------------------------------------------------
def test_unsquared_chamfer_at_extreme_magnitudes():
    # cdist squares: 0.0 at 1e-170, inf at 1e160
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((4, 3))
    for reduction in ('mean', 'sum'):
        c0 = chamfer_distance(a, b, squared=False, reduction=reduction)
        for s in (1e-170, 1e-300, 1e160, 1e300):
            value = chamfer_distance(a * s, b * s, squared=False, reduction=reduction)
            assert value == pytest.approx(c0 * s, rel=1e-13)
    # shared points (distance exactly 0) next to tiny distinct ones
    shared = np.vstack([a, b[:1]]) * 1e-300
    assert chamfer_distance(shared, b * 1e-300, squared=False) == pytest.approx(
        chamfer_distance(np.vstack([a, b[:1]]), b, squared=False) * 1e-300, rel=1e-13)
    assert chamfer_distance(a * 1e-300, a * 1e-300, squared=False) == 0.0
    with pytest.raises(OverflowError, match='Chamfer distance .* exceeds the float64 range'):
        chamfer_distance([[1.7e308]], [[-1.7e308]], squared=False)


def test_procrustes_at_extreme_magnitudes():
    # b^T a underflowed to the zero matrix (the identity returned) or overflowed (a bare
    # LinAlgError: SVD did not converge)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 3))
    q = random_rotation(rng, 3)
    for s, t in [(1e-170, 1e-170), (1e160, 1e160), (1e-300, 1e300), (1e300, 1.0), (1.0, 1e-200)]:
        np.testing.assert_allclose(procrustes_rotation(a * s, (a @ q.T) * t), q, atol=1e-12)
    # aligned_chamfer_distance with the estimate, unsquared, at 1e-170
    b = (a @ q.T) * 1e-170
    value = aligned_chamfer_distance(a * 1e-170, b, squared=False)
    assert value == pytest.approx(0.0, abs=1e-12 * 1e-170)


def test_procrustes_does_not_let_a_bare_linalg_error_escape(monkeypatch):
    def failing_svd(*args, **kwargs):
        raise np.linalg.LinAlgError('SVD did not converge')
    monkeypatch.setattr(np.linalg, 'svd', failing_svd)
    with pytest.raises(ValueError, match='procrustes_rotation: .* did not converge') as info:
        procrustes_rotation(np.eye(3), np.eye(3))
    assert type(info.value) is ValueError


# ---------------------------------------------------------------------------------------------
# F7: aligned_chamfer_distance checks that the rotation is orthogonal
# ---------------------------------------------------------------------------------------------
def test_aligned_chamfer_refuses_a_non_orthogonal_rotation():
    # b @ R is R^{-1} b only for an orthogonal R: rotation=2I gave CD(a, 4a) = 31.3, not 0
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 3))
    for rot in (2 * np.eye(3), np.eye(3) + 1e-4, np.full((3, 3), np.nan), np.zeros((3, 3))):
        with pytest.raises(ValueError, match="'rotation' must be orthogonal"):
            aligned_chamfer_distance(a, 2 * a, rotation=rot)
    # the tolerance, 10 d eps: eps of the rotation's dtype, at least float32's (a rotation
    # stored in float32 passes in float64 too); a float16 rounding passes as float16 only
    d = 8
    rot = givens_rotation(d, rng.uniform(-np.pi, np.pi, size=d * (d - 1) // 2))
    x = rng.standard_normal((10, d))
    y = x @ rot.T
    assert aligned_chamfer_distance(x, y, rotation=rot) == pytest.approx(0.0, abs=1e-25)
    for rot32 in (rot.astype(np.float32), rot.astype(np.float32).astype(np.float64)):
        assert aligned_chamfer_distance(x, y, rotation=rot32) == pytest.approx(0.0, abs=1e-10)
    rot16 = rot.astype(np.float16)
    assert aligned_chamfer_distance(x, y, rotation=rot16) == pytest.approx(0.0, abs=1e-4)
    with pytest.raises(ValueError, match=r'tolerance 10 d eps = 9.54e-06 \(d = 8, eps = 1.19e-07'):
        aligned_chamfer_distance(x, y, rotation=rot16.astype(np.float64))
    with pytest.raises(ValueError, match="'rotation' must be orthogonal"):
        # R^T R = (1 + 2e-5)^2 I: beyond float32's tolerance (9.5e-6 for d = 8)
        aligned_chamfer_distance(x, y, rotation=rot * (1 + 2e-5))
    for d in (2, 16, 64):  # givens_rotation's own round-off stays inside the tolerance
        rot = givens_rotation(d, rng.uniform(-np.pi, np.pi, size=d * (d - 1) // 2))
        z = rng.standard_normal((6, d))
        aligned_chamfer_distance(z, z @ rot.T, rotation=rot)
    aligned_chamfer_distance(x[:, :2], x[:, :2], rotation=[[0, 1], [1, 0]])  # integers, exact


# ---------------------------------------------------------------------------------------------
# F8: convex_hull_volume's flatness tolerance, as documented
# ---------------------------------------------------------------------------------------------
def test_hull_volume_documents_that_thin_sets_get_zero():
    # the docstring said "Computed exactly with QHull"; a full-dimensional 1 x 1 x 1e-12 box
    # gets 0 at the default rtol, its volume with a smaller one
    doc = ' '.join(convex_hull_volume.__doc__.split())
    assert 'Computed exactly' not in doc
    assert 'merely thin' in doc and ':math:`1 \\times 1 \\times 10^{-12}` box' in doc
    box = np.array(list(itertools.product([0.0, 1.0], repeat=3)))
    box[:, 2] *= 1e-12
    assert convex_hull_volume(box) == 0.0
    assert convex_hull_volume(box, rtol=1e-13) == pytest.approx(1e-12, rel=1e-9)
    assert convex_hull_volume(box, rtol=0) == pytest.approx(1e-12, rel=1e-9)


def test_hull_volume_refuses_dimensions_qhull_cannot_take():
    # scipy's ConvexHull ended the process (a segmentation fault) on 52 points at d = 32, and
    # QHull's cost grows about exponentially with d: refused above MAX_HULL_DIM, where QHull
    # would be called
    from torch_mz.geometry import MAX_HULL_DIM
    rng = np.random.default_rng(0)
    d = MAX_HULL_DIM + 1
    with pytest.raises(ValueError, match=r'above MAX_HULL_DIM = 12'):
        convex_hull_volume(rng.standard_normal((d + 3, d)))
    # sets that never reach QHull keep their value: too few points, flat
    assert convex_hull_volume(rng.standard_normal((d, d))) == 0.0
    flat = np.zeros((d + 3, d))
    flat[:, :2] = rng.standard_normal((d + 3, 2))
    assert convex_hull_volume(flat) == 0.0
    # d = 3 unchanged: the unit cube
    cube = np.array([[i, j, k] for i in (0, 1) for j in (0, 1) for k in (0, 1)], float)
    assert convex_hull_volume(cube) == pytest.approx(1.0, rel=1e-12)


def test_hull_task_refuses_a_dimension_above_the_limit():
    from torch_mz.datasets import make_task
    from torch_mz.geometry import MAX_HULL_DIM
    with pytest.raises(ValueError, match=r"'d' must be at most 12 for the hull volume"):
        make_task('hull-volume', n_train=2, n_val=0, n_test=0, d=MAX_HULL_DIM + 1)
    make_task('hull-volume', n_train=2, n_val=0, n_test=0, d=4)
