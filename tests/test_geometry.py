import itertools
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import nnls

from torch_mz.geometry import (
    aligned_chamfer_distance,
    chamfer_distance,
    convex_hull_volume,
    covariance_frobenius_norm,
    frobenius_orthogonal_matrices,
    givens_rotation,
    max_mahalanobis_distance,
    min_enclosing_ball,
    mst_weight,
    num_givens_angles,
    pca_residual,
    procrustes_rotation,
    quadratic_tdof_target,
    sample_covariance,
)


def random_rotation(rng, d):
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


# ---------------------------------------------------------------------------------------------
# Chamfer
# ---------------------------------------------------------------------------------------------
def test_chamfer_hand_case():
    a = np.array([[0.0]])
    b = np.array([[1.0], [3.0]])
    # A -> B: min(1, 9) = 1; B -> A: mean(1, 9) = 5.
    assert chamfer_distance(a, b) == pytest.approx(6.0)
    # Unsquared: 1 + mean(1, 3) = 3.
    assert chamfer_distance(a, b, squared=False) == pytest.approx(3.0)


def test_chamfer_identical_symmetric_and_permutation_invariant():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((12, 3))
    b = rng.standard_normal((7, 3))
    assert chamfer_distance(a, a) == 0.0
    assert chamfer_distance(a, a[rng.permutation(12)]) == 0.0
    assert chamfer_distance(a, b) == pytest.approx(chamfer_distance(b, a))
    assert chamfer_distance(a, b) == pytest.approx(chamfer_distance(a[::-1], b[rng.permutation(7)]))
    assert chamfer_distance(a, b) > 0.0
    # Invariant under a common rigid motion.
    rot, shift = random_rotation(rng, 3), rng.standard_normal(3)
    assert chamfer_distance(a @ rot.T + shift, b @ rot.T + shift) == pytest.approx(
        chamfer_distance(a, b))


def test_chamfer_sum_reduction_hand_case():
    # B is A turned by 90 degrees: nearest squared distances 2, 0 (A to B) and 0, 2 (B to A).
    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    rot = np.array([[0.0, -1.0], [1.0, 0.0]])
    b = a @ rot.T  # [[0, 1], [-1, 0]]
    assert chamfer_distance(a, b) == pytest.approx(2.0)
    assert chamfer_distance(a, b, reduction='sum') == pytest.approx(4.0)
    assert aligned_chamfer_distance(a, b, rotation=rot, reduction='sum') == pytest.approx(0.0)
    # Unequal sizes: each side is summed over its own points.
    c = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    d = np.array([[0.0, 1.0]])
    assert chamfer_distance(c, d, reduction='sum') == pytest.approx((1 + 10 + 1) + 1)
    assert chamfer_distance(c, d) == pytest.approx(12 / 3 + 1)
    with pytest.raises(ValueError, match='reduction'):
        chamfer_distance(a, b, reduction='max')


def test_chamfer_validation():
    with pytest.raises(ValueError, match='same dimension'):
        chamfer_distance(np.zeros((2, 3)), np.zeros((2, 2)))
    with pytest.raises(ValueError, match='at least one point'):
        chamfer_distance(np.zeros((0, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match='2-D'):
        chamfer_distance(np.zeros(3), np.zeros((2, 3)))


def test_aligned_chamfer_undoes_rotation():
    rng = np.random.default_rng(1)
    d = 6
    a = rng.standard_normal((20, d))
    rot = givens_rotation(d, rng.uniform(-np.pi, np.pi, num_givens_angles(d)))
    b = a @ rot.T
    # Without alignment the rotated copy is far; after alignment it coincides.
    assert chamfer_distance(a, b) > 0.5
    assert aligned_chamfer_distance(a, b, rotation=rot) == pytest.approx(0.0, abs=1e-20)
    assert aligned_chamfer_distance(a, b) == pytest.approx(0.0, abs=1e-20)
    # With noise, the true-rotation target equals the Chamfer distance of A to A + R^T eps.
    eps = 0.1 * rng.standard_normal(a.shape)
    b = a @ rot.T + eps
    expected = chamfer_distance(a, a + eps @ rot)
    assert aligned_chamfer_distance(a, b, rotation=rot) == pytest.approx(expected, rel=1e-10)
    # Procrustes minimises the corresponding-point residual, so it is at least as good there.
    rot_hat = procrustes_rotation(a, b)
    assert ((a @ rot_hat.T - b) ** 2).sum() <= ((a @ rot.T - b) ** 2).sum() + 1e-12


def test_procrustes_recovers_rotation():
    rng = np.random.default_rng(2)
    for d in (2, 3, 8):
        a = rng.standard_normal((3 * d, d))
        rot = random_rotation(rng, d)
        rot_hat = procrustes_rotation(a, a @ rot.T)
        np.testing.assert_allclose(rot_hat, rot, atol=1e-10)
        assert np.linalg.det(rot_hat) == pytest.approx(1.0)
    # A reflection is not a rotation: the result stays in SO(d).
    a = rng.standard_normal((10, 3))
    reflect = np.diag([1.0, 1.0, -1.0])
    rot_hat = procrustes_rotation(a, a @ reflect)
    assert np.linalg.det(rot_hat) == pytest.approx(1.0)
    np.testing.assert_allclose(rot_hat @ rot_hat.T, np.eye(3), atol=1e-12)
    with pytest.raises(ValueError, match='same shape'):
        procrustes_rotation(np.zeros((3, 2)), np.zeros((4, 2)))


# ---------------------------------------------------------------------------------------------
# MST
# ---------------------------------------------------------------------------------------------
def prim_reference(points):
    n = len(points)
    if n <= 1:
        return 0.0
    dist = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
    in_tree = [0]
    best = dist[0].copy()
    best[0] = np.inf
    total = 0.0
    done = np.zeros(n, dtype=bool)
    done[0] = True
    for _ in range(n - 1):
        j = int(np.argmin(np.where(done, np.inf, best)))
        total += best[j]
        done[j] = True
        in_tree.append(j)
        best = np.minimum(best, dist[j])
    return total


def test_mst_known_cases():
    square = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    assert mst_weight(square) == pytest.approx(3.0)
    line = np.array([[0.0], [3.0], [1.0], [7.5], [2.0]])
    assert mst_weight(line) == pytest.approx(7.5)  # collinear: the span
    direction = np.array([1.0, 2.0, -2.0]) / 3.0
    collinear = np.outer([0.0, 4.0, 1.5, -2.0], direction)
    assert mst_weight(collinear) == pytest.approx(6.0)
    assert mst_weight(np.zeros((1, 4))) == 0.0
    assert mst_weight(np.zeros((0, 4))) == 0.0
    assert mst_weight(np.zeros((5, 4))) == 0.0
    # Duplicates join through zero-length edges.
    assert mst_weight(np.array([[0.0], [0.0], [1.0]])) == pytest.approx(1.0)


def test_mst_matches_prim_and_is_rigid_invariant():
    rng = np.random.default_rng(3)
    for n, d in [(2, 1), (10, 2), (25, 8)]:
        pts = rng.standard_normal((n, d))
        assert mst_weight(pts) == pytest.approx(prim_reference(pts), rel=1e-12)
        rot = random_rotation(rng, d) if d > 1 else np.array([[-1.0]])
        assert mst_weight(pts @ rot.T + 3.0) == pytest.approx(mst_weight(pts), rel=1e-10)
        assert mst_weight(2.5 * pts) == pytest.approx(2.5 * mst_weight(pts), rel=1e-10)


# ---------------------------------------------------------------------------------------------
# Convex hull volume
# ---------------------------------------------------------------------------------------------
def test_hull_volume_cube_and_simplex():
    cube = np.array(list(itertools.product([0.0, 1.0], repeat=3)))
    interior = np.random.default_rng(4).uniform(0.1, 0.9, size=(20, 3))
    assert convex_hull_volume(cube) == pytest.approx(1.0)
    assert convex_hull_volume(np.vstack([cube, interior])) == pytest.approx(1.0)
    for d in (2, 3, 4, 5):
        simplex = np.vstack([np.zeros(d), np.eye(d)])
        assert convex_hull_volume(simplex) == pytest.approx(1.0 / math.factorial(d))
        assert convex_hull_volume(2.0 * simplex) == pytest.approx(2.0 ** d / math.factorial(d))
    assert convex_hull_volume(np.array([[3.0], [-1.0], [0.5]])) == pytest.approx(4.0)  # d = 1


def test_hull_volume_degenerate_is_zero():
    rng = np.random.default_rng(5)
    assert convex_hull_volume(rng.standard_normal((3, 3))) == 0.0  # fewer than d + 1 points
    assert convex_hull_volume(np.zeros((0, 3))) == 0.0
    flat = np.hstack([rng.standard_normal((10, 2)), np.zeros((10, 1))])
    assert convex_hull_volume(flat) == 0.0
    rot = random_rotation(rng, 3)
    assert convex_hull_volume(flat @ rot.T + 1.0) == 0.0  # a tilted plane is flat too
    assert convex_hull_volume(np.ones((6, 4))) == 0.0


def test_hull_volume_rigid_invariance():
    rng = np.random.default_rng(6)
    pts = rng.standard_normal((30, 4))
    rot = random_rotation(rng, 4)
    assert convex_hull_volume(pts @ rot.T - 2.0) == pytest.approx(convex_hull_volume(pts), rel=1e-9)


# ---------------------------------------------------------------------------------------------
# Minimum enclosing ball
# ---------------------------------------------------------------------------------------------
def _circumball(subset):
    p0 = subset[0]
    if len(subset) == 1:
        return p0, 0.0
    v = subset[1:] - p0
    gram = v @ v.T
    if np.linalg.matrix_rank(gram) < len(v):
        return None
    lam = np.linalg.solve(gram, 0.5 * np.diag(gram))
    center = p0 + lam @ v
    return center, float(np.linalg.norm(subset[0] - center))


def brute_force_meb_radius(points):
    r"""Smallest enclosing circumball over all subsets of at most d + 1 points."""
    n, d = points.shape
    best = np.inf
    for k in range(1, min(n, d + 1) + 1):
        for idx in itertools.combinations(range(n), k):
            ball = _circumball(points[list(idx)])
            if ball is None:
                continue
            center, radius = ball
            if np.linalg.norm(points - center, axis=1).max() <= radius * (1 + 1e-9) + 1e-12:
                best = min(best, radius)
    return best


def assert_meb_certificate(points, center, radius):
    r"""Optimality of an enclosing ball: the centre is a convex combination of the points on the
    boundary sphere."""
    dist = np.linalg.norm(points - center, axis=1)
    assert dist.max() <= radius * (1 + 1e-9) + 1e-12
    boundary = points[dist >= radius * (1 - 1e-7) - 1e-12]
    # Solve center = sum_i lam_i b_i, sum_i lam_i = 1, lam >= 0 (weighted equality row).
    mat = np.vstack([boundary.T, 1e3 * np.ones(len(boundary))])
    rhs = np.concatenate([center, [1e3]])
    lam, resid = nnls(mat, rhs)
    assert resid <= 1e-6 * max(1.0, radius)


@pytest.mark.parametrize('method', ['active-set', 'welzl'])
def test_meb_known_cases(method):
    c, r = min_enclosing_ball(np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]), method=method)
    assert r == pytest.approx(np.sqrt(8.0) / 2)
    np.testing.assert_allclose(c, [2.0, 2.0, 2.0], atol=1e-12)
    c, r = min_enclosing_ball(np.array([[0.5, -1.0]]), method=method)
    assert r == 0.0
    np.testing.assert_allclose(c, [0.5, -1.0])
    # Regular simplex: the standard basis of R^{k}, circumradius sqrt((k - 1) / k).
    for k in (3, 5, 8):
        c, r = min_enclosing_ball(np.eye(k), method=method)
        assert r == pytest.approx(np.sqrt((k - 1) / k))
        np.testing.assert_allclose(c, np.full(k, 1.0 / k), atol=1e-12)
    # Points on a sphere that surround its centre (all +-e_i plus random unit vectors).
    rng = np.random.default_rng(7)
    for d in (2, 3, 6):
        unit = rng.standard_normal((40, d))
        unit /= np.linalg.norm(unit, axis=1, keepdims=True)
        pts = 2.5 * np.vstack([np.eye(d), -np.eye(d), unit]) + 1.0
        c, r = min_enclosing_ball(pts, method=method)
        assert r == pytest.approx(2.5)
        np.testing.assert_allclose(c, np.ones(d), atol=1e-9)
    # A cap of the unit sphere (x_0 >= 0.6, rim radius 0.8) has a smaller enclosing ball.
    unit = rng.standard_normal((200, 3))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    cap = np.vstack([unit[unit[:, 0] >= 0.6], [[0.6, 0.8, 0.0], [0.6, -0.8, 0.0]]])
    assert min_enclosing_ball(cap, method=method)[1] == pytest.approx(0.8)
    # Degenerate: collinear points with duplicates, all points equal.
    line = np.array([[0.0, 0.0], [4.0, 0.0], [1.0, 0.0], [1.0, 0.0], [4.0, 0.0]])
    c, r = min_enclosing_ball(line, method=method)
    assert r == pytest.approx(2.0)
    np.testing.assert_allclose(c, [2.0, 0.0], atol=1e-12)
    assert min_enclosing_ball(np.ones((4, 3)), method=method)[1] == 0.0


@settings(max_examples=25, deadline=None, database=None)
@given(d=st.sampled_from([2, 3, 5]), n=st.integers(1, 8), seed=st.integers(0, 2 ** 32 - 1),
       lattice=st.booleans())
def test_meb_matches_brute_force(d, n, seed, lattice):
    rng = np.random.default_rng(seed)
    pts = rng.standard_normal((n, d))
    if lattice:  # many ties and cospherical / collinear configurations
        pts = np.round(2 * pts) / 2
    expected = brute_force_meb_radius(pts)
    for method in ('active-set', 'welzl'):
        center, radius = min_enclosing_ball(pts, method=method)
        assert radius == pytest.approx(expected, rel=1e-8, abs=1e-12)
        assert_meb_certificate(pts, center, radius)


def test_meb_methods_agree_and_certificate_on_larger_sets():
    rng = np.random.default_rng(8)
    for n, d in [(60, 2), (30, 8), (25, 16)]:
        pts = rng.standard_normal((n, d)) * rng.uniform(0.3, 2.0, size=d)
        c1, r1 = min_enclosing_ball(pts)
        c2, r2 = min_enclosing_ball(pts, method='welzl')
        assert r1 == pytest.approx(r2, rel=1e-9)
        np.testing.assert_allclose(c1, c2, atol=1e-7)
        assert_meb_certificate(pts, c1, r1)
    # n < d (affine hull of lower dimension), the regime of the high-d MEB task.
    pts = rng.standard_normal((12, 32))
    c, r = min_enclosing_ball(pts)
    assert_meb_certificate(pts, c, r)
    # Rigid motions move the centre along and keep the radius.
    rot, shift = random_rotation(rng, 32), rng.standard_normal(32)
    c_moved, r_moved = min_enclosing_ball(pts @ rot.T + shift)
    assert r_moved == pytest.approx(r, rel=1e-9)
    np.testing.assert_allclose(c_moved, rot @ c + shift, atol=1e-8)


def test_meb_falls_back_to_welzl(monkeypatch):
    import torch_mz.geometry as geometry_module
    pts = np.random.default_rng(13).standard_normal((15, 4))
    expected = min_enclosing_ball(pts, method='welzl')
    monkeypatch.setattr(geometry_module, '_active_set', lambda *args, **kwargs: None)
    center, radius = min_enclosing_ball(pts)
    assert radius == pytest.approx(expected[1], rel=1e-12)
    np.testing.assert_allclose(center, expected[0], atol=1e-12)


def test_meb_validation():
    with pytest.raises(ValueError, match='method'):
        min_enclosing_ball(np.zeros((2, 2)), method='ritter')
    with pytest.raises(ValueError, match='at least one point'):
        min_enclosing_ball(np.zeros((0, 2)))
    with pytest.raises(ValueError, match='finite'):
        min_enclosing_ball(np.array([[0.0, np.nan]]))


# ---------------------------------------------------------------------------------------------
# Givens rotations, Frobenius-orthogonal matrices, quadratic TDOF target
# ---------------------------------------------------------------------------------------------
def test_givens_rotation_matches_explicit_product():
    rng = np.random.default_rng(9)
    d = 5
    angles = rng.uniform(-np.pi, np.pi, num_givens_angles(d))
    expected = np.eye(d)
    for k, (i, j) in enumerate(itertools.combinations(range(d), 2)):
        g = np.eye(d)
        c, s = np.cos(angles[k]), np.sin(angles[k])
        g[i, i], g[j, j], g[i, j], g[j, i] = c, c, -s, s
        expected = expected @ g
    np.testing.assert_allclose(givens_rotation(d, angles), expected, atol=1e-13)


def test_givens_rotation_is_special_orthogonal_and_batched():
    rng = np.random.default_rng(10)
    for d in (2, 3, 8, 17):
        angles = rng.uniform(-np.pi, np.pi, size=(4, num_givens_angles(d)))
        rot = givens_rotation(d, angles)
        assert rot.shape == (4, d, d)
        eye = np.broadcast_to(np.eye(d), rot.shape)
        np.testing.assert_allclose(rot @ rot.transpose(0, 2, 1), eye, atol=1e-12)
        np.testing.assert_allclose(np.linalg.det(rot), 1.0, atol=1e-10)
        np.testing.assert_allclose(givens_rotation(d, angles[1]), rot[1], atol=1e-14)
    np.testing.assert_allclose(givens_rotation(4, np.zeros(6)), np.eye(4))
    t = 0.3
    np.testing.assert_allclose(givens_rotation(2, [t]),
                               [[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
    assert num_givens_angles(8) == 28
    np.testing.assert_array_equal(givens_rotation(1, np.zeros(0)), [[1.0]])
    with pytest.raises(ValueError, match=r'\(\.\.\., 28\)'):
        givens_rotation(8, np.zeros(27))


def test_frobenius_orthogonal_matrices():
    for num, d in [(1, 1), (5, 3), (9, 3), (33, 32)]:
        mats = frobenius_orthogonal_matrices(num, d, rng=np.random.default_rng(11))
        assert mats.shape == (num, d, d)
        gram = np.einsum('aij,bij->ab', mats, mats)  # <M_a, M_b>_F
        np.testing.assert_allclose(gram, np.eye(num), atol=1e-12)
    again = frobenius_orthogonal_matrices(5, 3, rng=np.random.default_rng(11))
    np.testing.assert_array_equal(again, frobenius_orthogonal_matrices(5, 3, rng=11))
    assert not np.allclose(again, frobenius_orthogonal_matrices(5, 3, rng=12))
    with pytest.raises(ValueError, match='d\\^2 = 9'):
        frobenius_orthogonal_matrices(10, 3)


def test_quadratic_tdof_target_hand_case():
    # d = 2, L = 1: f = w^T (M0 + mu_1 M1) mu.
    mu = np.array([2.0, -1.0])
    w = np.array([1.0, 3.0])
    m0 = np.array([[1.0, 0.0], [0.0, 2.0]])
    m1 = np.array([[0.0, 1.0], [1.0, 0.0]])
    # M0 + 2 M1 = [[1, 2], [2, 2]]; times mu = [0, 2]; w^T [0, 2] = 6.
    assert quadratic_tdof_target(mu, w, m0, m1[None]) == pytest.approx(6.0)
    batch = np.stack([mu, np.array([1.0, 1.0])])
    # Second: M0 + M1 = [[1, 1], [1, 2]] @ [1, 1] = [2, 3]; w^T = 11.
    np.testing.assert_allclose(quadratic_tdof_target(batch, w, m0, m1[None]), [6.0, 11.0])


def test_quadratic_tdof_target_matches_loop_and_validates():
    rng = np.random.default_rng(12)
    d, num = 6, 4
    mats = frobenius_orthogonal_matrices(num + 1, d, rng)
    w, mu = rng.standard_normal(d), rng.standard_normal((3, d))
    out = quadratic_tdof_target(mu, w, mats[0], mats[1:])
    for b in range(3):
        op = mats[0] + sum(mu[b, l] * mats[1 + l] for l in range(num))
        assert out[b] == pytest.approx(w @ op @ mu[b])
    with pytest.raises(ValueError, match='L <= d'):
        quadratic_tdof_target(mu, w, mats[0], np.zeros((d + 1, d, d)))
    with pytest.raises(ValueError, match='shapes'):
        quadratic_tdof_target(mu, w[:-1], mats[0], mats[1:])


def test_second_order_statistics_hand_cases():
    # Four points (+-a, 0), (0, +-b): covariance diag(a^2/2, b^2/2).
    a, b = 2.0, 1.0
    pts = np.array([[a, 0], [-a, 0], [0, b], [0, -b]])
    np.testing.assert_allclose(sample_covariance(pts), np.diag([a * a / 2, b * b / 2]))
    assert covariance_frobenius_norm(pts) == pytest.approx(math.hypot(a * a / 2, b * b / 2))
    assert pca_residual(pts, k=1) == pytest.approx(b * b / 2)  # the smaller eigenvalue
    assert pca_residual(pts, k=2) == pytest.approx(0.0, abs=1e-12)
    assert pca_residual(pts, k=0) == pytest.approx((a * a + b * b) / 2)
    # Every point sits at Mahalanobis distance sqrt(2) from the mean.
    assert max_mahalanobis_distance(pts) == pytest.approx(math.sqrt(2), rel=1e-5)
    # An outlier in a symmetric 1-D set: n points, one at t, n-1 at 0.
    n, t = 5, 3.0
    line = np.zeros((n, 1))
    line[0] = t
    assert max_mahalanobis_distance(line) == pytest.approx(math.sqrt(n - 1), rel=1e-5)
    assert max_mahalanobis_distance(np.ones((4, 3))) == 0.0


@pytest.mark.parametrize('d', [2, 5, 8])
def test_second_order_statistics_are_invariant(d):
    rng = np.random.default_rng(d)
    pts = rng.standard_normal((20, d)) @ rng.standard_normal((d, d))
    moved = pts @ random_rotation(rng, d).T + rng.standard_normal(d)
    for fn in (covariance_frobenius_norm, max_mahalanobis_distance,
               lambda p: pca_residual(p, k=1)):
        assert fn(moved) == pytest.approx(fn(pts), rel=1e-8)
        assert fn(pts[rng.permutation(20)]) == pytest.approx(fn(pts), rel=1e-10)
    # Mahalanobis is also invariant under an invertible linear map (up to the ridge); the
    # others scale with it.
    general = rng.standard_normal((d, d)) + 3 * np.eye(d)
    assert max_mahalanobis_distance(pts @ general.T, ridge=1e-12) == pytest.approx(
        max_mahalanobis_distance(pts, ridge=1e-12), rel=1e-6)
    assert covariance_frobenius_norm(2 * pts) == pytest.approx(4 * covariance_frobenius_norm(pts))
    # Bound: at most sqrt(n - 1).
    assert max_mahalanobis_distance(pts) <= math.sqrt(19) + 1e-9


def test_second_order_statistics_validate():
    with pytest.raises(ValueError, match='at least one point'):
        sample_covariance(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="'k'"):
        pca_residual(np.zeros((4, 3)), k=4)
    with pytest.raises(ValueError, match='ridge'):
        max_mahalanobis_distance(np.ones((4, 2)), ridge=0.0)


def test_mst_keeps_points_whose_distance_underflows():
    # distinct points at distance 0.0 (1e-200 apart): the sparse graph read the zero as a
    # missing edge, and the tree went round it (2.0, not 1.0); the edge is now computed without
    # squaring's underflow (it had been dropped by merging the two points: 0.0, not 1e-200)
    from torch_mz.geometry import mst_weight
    assert mst_weight([[1e-200, 0.0], [0.0, 0.0], [1.0, 0.0]]) == pytest.approx(1.0)
    assert mst_weight([[1e-200, 0.0], [0.0, 0.0]]) == 1e-200


def test_hull_volume_at_extreme_magnitudes():
    # QHull's precision check failed at 1e80 although the points are not flat: volume 0
    from torch_mz.geometry import convex_hull_volume
    x = np.random.default_rng(0).standard_normal((30, 3))
    assert convex_hull_volume(x * 1e80) / 1e240 == pytest.approx(convex_hull_volume(x),
                                                                  rel=1e-9)



def test_meb_tolerance_and_givens_count_are_checked():
    # a negative tolerance gave a ball far beyond the smallest (607.7 against 2.561), NaN
    # another; num_givens_angles(-1) was 1
    from torch_mz.geometry import min_enclosing_ball, num_givens_angles
    pts = np.random.default_rng(0).normal(size=(20, 3))
    for tol in (-1.0, float('nan'), float('inf'), True, '1e-9'):
        with pytest.raises(ValueError, match="'tol' must be a finite number >= 0"):
            min_enclosing_ball(pts, tol=tol)
    assert min_enclosing_ball(pts, tol=0)[1] == pytest.approx(min_enclosing_ball(pts)[1])
    assert [num_givens_angles(d) for d in (0, 1, 2, 3, 8)] == [0, 0, 1, 3, 28]
    for d in (-1, 2.0):
        with pytest.raises(ValueError, match="'d' must be an integer"):
            num_givens_angles(d)


def test_covariance_norm_at_extreme_magnitudes():
    # the norm squares the covariance: 0.0 for a set 1e-90 across (its value, about 1e-180, is a
    # normal float64), inf for coordinates of 1e80, 8e-5 off at 1e-80
    x = np.random.default_rng(0).standard_normal((20, 4))
    value = covariance_frobenius_norm(x)
    for scale in (1e-120, 1e-90, 1e-80, 1e80, 1e140):
        assert covariance_frobenius_norm(x * scale) / scale ** 2 == pytest.approx(value,
                                                                                  rel=1e-12)
    offset = x * 1e-90 + 1e-80  # (a power of two scales it exactly into the plain range)
    assert covariance_frobenius_norm(offset) == pytest.approx(
        covariance_frobenius_norm(np.ldexp(offset, 300)) * 2.0 ** -600, rel=1e-12)
    assert covariance_frobenius_norm(np.full((3, 2), 1e-200)) == 0.0  # coincident points
    with pytest.raises(OverflowError, match='covariance Frobenius norm'):
        covariance_frobenius_norm(x * 1e160)
    with pytest.raises(ValueError, match='smallest positive float64'):
        covariance_frobenius_norm(x * 1e-170)


def test_hull_volume_of_thin_set_at_large_magnitude():
    # QHull refuses coordinates of 1e103; the retry at unit extent multiplied by extent ** 3,
    # which overflowed (a bare "OverflowError: (34, 'Numerical result out of range')") although
    # the volume, about 1.8e302, does not
    x = np.random.default_rng(0).standard_normal((30, 3))
    scale = np.array([1e103, 1e103, 1e96])
    assert convex_hull_volume(x * scale) / 1e302 == pytest.approx(convex_hull_volume(x),
                                                                  rel=1e-9)
    with pytest.raises(OverflowError, match='convex hull volume'):
        convex_hull_volume(x * 1e110)
    with pytest.raises(OverflowError, match='convex hull volume'):  # (QHull's volume: inf)
        convex_hull_volume(np.random.default_rng(0).standard_normal((20, 6)) * 1e52)


def test_hull_volume_of_a_tiny_set_that_qhull_measures_wrongly():
    # about 1e-80 across QHull raised no error but gave a wrong volume (1.7% too small at
    # 2**-270, 2e-5 at 2**-266): the retry at unit extent ran only after an error or inf
    x = np.random.default_rng(0).normal(size=(20, 3))
    value = convex_hull_volume(x)
    for k in (-270, -268, -266, -264):
        assert convex_hull_volume(np.ldexp(x, k)) == pytest.approx(np.ldexp(value, 3 * k),
                                                                   rel=1e-12)
    assert convex_hull_volume(x * 1e-80) / 1e-240 == pytest.approx(value, rel=1e-12)


def test_mahalanobis_ridge_and_givens_angles_are_checked():
    # ridge=inf passed 'ridge > 0' and gave NaN; NaN or inf angles gave a NaN rotation
    pts = np.random.default_rng(0).standard_normal((10, 3))
    for ridge in (float('inf'), float('nan'), -1.0, True):
        with pytest.raises(ValueError, match="'ridge' must be a finite number > 0"):
            max_mahalanobis_distance(pts, ridge=ridge)
    for bad in (float('nan'), float('inf')):
        with pytest.raises(ValueError, match="'angles' must be finite"):
            givens_rotation(3, [0.1, bad, 0.2])


def test_integer_arguments_are_checked_alike():
    # givens_rotation, frobenius_orthogonal_matrices and pca_residual took 2.0 (and True as 1:
    # an R^{True}x{True} in the message) through int(d) != d, which num_givens_angles refused
    torch = pytest.importorskip('torch')
    pts = np.random.default_rng(0).standard_normal((10, 3))
    rot = givens_rotation(2, [0.3])
    mats = frobenius_orthogonal_matrices(2, 3, rng=0)
    for two in (2, np.int64(2), np.array(2), torch.tensor(2)):
        assert num_givens_angles(two) == 1
        np.testing.assert_array_equal(givens_rotation(two, [0.3]), rot)
        np.testing.assert_array_equal(frobenius_orthogonal_matrices(two, 3, rng=0), mats)
        np.testing.assert_array_equal(frobenius_orthogonal_matrices(2, two + 1, rng=0), mats)
        assert pca_residual(pts, k=two) == pca_residual(pts, k=2)
    for bad in (2.0, np.float64(2.0), True, np.bool_(True), torch.tensor(True), torch.tensor(2.0),
                np.array([2]), '2', None):
        with pytest.raises(ValueError, match=r"'d' must be an integer >= 0"):
            num_givens_angles(bad)
        with pytest.raises(ValueError, match=r"'d' must be a positive integer"):
            givens_rotation(bad, [0.3])
        with pytest.raises(ValueError, match=r"'d' must be a positive integer"):
            frobenius_orthogonal_matrices(1, bad)
        with pytest.raises(ValueError, match=r"'num' must be an integer in \[1, d\^2 = 9\]"):
            frobenius_orthogonal_matrices(bad, 3)
        with pytest.raises(ValueError, match=r"'k' must be an integer in \[0, d = 3\]"):
            pca_residual(pts, k=bad)


def test_flags_and_tolerances_are_checked():
    # squared='False' is a true text: squared distances; rtol=True made every set flat (volume
    # 0), NaN none
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((6, 3))
    for bad in ('False', None, 2, np.float64(0.0)):
        with pytest.raises(ValueError, match=r"'squared' must be True or False"):
            chamfer_distance(a, b, squared=bad)
        with pytest.raises(ValueError, match=r"'squared' must be True or False"):
            aligned_chamfer_distance(a, b, rotation=np.eye(3), squared=bad)
    assert chamfer_distance(a, b, squared=np.bool_(False)) == chamfer_distance(a, b, squared=False)
    assert chamfer_distance(a, b, squared=0) == chamfer_distance(a, b, squared=False)
    pts = rng.standard_normal((10, 3))
    for bad in (True, float('nan'), float('inf'), -1e-10, '1e-10'):
        with pytest.raises(ValueError, match=r"'rtol' must be a number in \[0, 1\)"):
            convex_hull_volume(pts, rtol=bad)
    assert convex_hull_volume(pts, rtol=0) == convex_hull_volume(pts) > 0


def test_hull_rtol_of_one_or_more_is_refused():
    # a singular-value ratio is at most 1: rtol >= 1 (like rtol=True, which was refused) made
    # every set flat, a unit cube too, volume 0 without a word
    cube = np.array([[x, y, z] for x in (0, 1) for y in (0, 1) for z in (0, 1)], dtype=float)
    assert convex_hull_volume(cube, rtol=0.999) == pytest.approx(1.0)
    for bad in (1, 1.0, np.float64(5.0)):
        with pytest.raises(ValueError, match=r"'rtol' must be a number in \[0, 1\) \(got "
                                             + re.escape(repr(bad))):
            convex_hull_volume(cube, rtol=bad)


def test_hull_volume_in_one_dimension_beyond_the_float64_range():
    # max - min overflowed to inf, returned (with a RuntimeWarning), where the docstring promises
    # an OverflowError
    with pytest.raises(OverflowError, match='convex hull volume'):
        convex_hull_volume(np.array([[-1e308], [1e308]]))
    assert convex_hull_volume(np.array([[-1e307], [1e308], [0.0]])) == 1e308 + 1e307
