import pytest
import torch
from torch_geometric.utils import scatter

from torch_mz.testing import (
    assert_equivariant,
    default_tolerance,
    permute_within_sets,
    random_orthogonal,
)


def centred(pos, batch):
    num_sets = int(batch.max()) + 1
    return pos - scatter(pos, batch, dim=0, dim_size=num_sets, reduce='mean')[batch]  # (N, D)


def equivariant_fn(pos, features, batch):
    # Points pushed away from their set's centroid by a feature- and distance-dependent amount,
    # the per-set sum of squared radii, and the per-element displacement.
    rel = centred(pos, batch)  # (N, D)
    radius2 = rel.pow(2).sum(-1, keepdim=True)  # (N, 1)
    weight = torch.tanh(radius2) * (1.0 + features[:, :1])  # (N, 1)
    set_radius2 = scatter(radius2, batch, dim=0, reduce='sum')  # (S, 1)
    return pos + weight * rel, set_radius2, weight * rel


def sets(dtype, dim=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 2])
    pos = torch.randn(batch.numel(), dim, generator=g, dtype=torch.float64).to(dtype)
    features = torch.rand(batch.numel(), 2, generator=g, dtype=torch.float64).to(dtype)
    return pos, batch, features


KINDS = {'rotation', 'reflection', 'translation', 'permutation'}
DECLARED = dict(equivariant_outputs=(0, ), invariant_outputs=(1, ), vector_outputs=(2, ),
                set_outputs=(1, ))


def test_random_orthogonal():
    g = torch.Generator().manual_seed(0)
    for det in (1, -1):
        q = random_orthogonal(5, 4, det=det, generator=g)
        assert q.shape == (5, 4, 4)
        torch.testing.assert_close(q @ q.transpose(-1, -2), torch.eye(4).expand(5, 4, 4).double())
        torch.testing.assert_close(torch.linalg.det(q), torch.full((5, ), float(det)).double())
    q = random_orthogonal(200, 3, generator=g)
    dets = torch.linalg.det(q)
    assert (dets > 0).any() and (dets < 0).any()  # both components of O(3) are drawn
    assert random_orthogonal(2, 3, dtype=torch.float32).dtype == torch.float32
    with pytest.raises(ValueError, match='det'):
        random_orthogonal(1, 3, det=2)


def test_permute_within_sets():
    g = torch.Generator().manual_seed(0)
    batch = torch.tensor([2, 0, 1, 0, 2, 2, 0, 1, 2])  # unsorted on purpose
    seen = set()
    for _ in range(20):
        perm = permute_within_sets(batch, generator=g)
        assert sorted(perm.tolist()) == list(range(batch.numel()))
        assert torch.equal(batch[perm], batch)
        seen.add(tuple(perm.tolist()))
    assert len(seen) > 1  # it does shuffle
    assert permute_within_sets(torch.zeros(0, dtype=torch.long)).numel() == 0


def test_permute_within_sets_never_draws_the_identity_when_it_can_move_something():
    # a set of two was left in place by half the draws: assert_equivariant's three permutation
    # trials then checked nothing in one run of eight
    g = torch.Generator().manual_seed(0)
    for batch in (torch.tensor([0, 0]), torch.tensor([3, 1, 3, 0])):
        for _ in range(64):
            perm = permute_within_sets(batch, generator=g)
            assert torch.equal(batch[perm], batch)
            assert not torch.equal(perm, torch.arange(batch.numel()))
    # uniform over the other permutations: all five of a set of three are drawn
    seen = {tuple(permute_within_sets(torch.zeros(3, dtype=torch.long), g).tolist())
            for _ in range(200)}
    assert len(seen) == 5 and (0, 1, 2) not in seen
    # sets of one element each: nothing can move
    assert torch.equal(permute_within_sets(torch.tensor([2, 0, 1]), g), torch.arange(3))


def test_a_permutation_dependence_within_a_set_of_two_is_always_caught():
    def first_element(pos, features, batch):  # every row is the set's first element
        return pos[:1].expand_as(pos) * 1.0

    pos = torch.randn(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for seed in range(40):
        with pytest.raises(AssertionError, match='permutation'):
            assert_equivariant(first_element, pos, torch.zeros(2, dtype=torch.long),
                               invariant_outputs=(0, ), rotations=False, reflections=False,
                               translations=False, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('dim', [3, 8])
def test_passes_on_equivariant_function(dtype, dim):
    pos, batch, features = sets(dtype, dim)
    errors = assert_equivariant(equivariant_fn, pos, batch, features, **DECLARED,
                                generator=torch.Generator().manual_seed(1))
    assert set(errors) == KINDS
    atol, rtol = default_tolerance(dtype)
    assert all(0.0 <= e <= 10 * (atol + rtol) for e in errors.values())


def test_fails_on_absolute_coordinate():
    pos, batch, features = sets(torch.float64)

    def fn(pos, features, batch):  # uses |x_0|, which no rigid motion preserves
        return scatter(pos[:, :1].abs(), batch, dim=0, reduce='sum')

    with pytest.raises(AssertionError) as info:
        assert_equivariant(fn, pos, batch, features, invariant_outputs=(0, ), set_outputs=(0, ))
    message = str(info.value)
    for kind in ('rotation', 'reflection', 'translation'):
        assert f'{kind}: worst error' in message and 'FAIL' in message
    assert 'permutation: worst error' in message
    assert 'not equivariant under rotation, reflection, translation' in message
    # A sum over the set is permutation-invariant: only the geometric kinds fail.
    assert_equivariant(fn, pos, batch, features, invariant_outputs=(0, ), set_outputs=(0, ),
                       rotations=False, reflections=False, translations=False)


def test_each_kind_is_caught_alone():
    pos, batch, features = sets(torch.float64)

    def not_translation_invariant(pos, features, batch):  # norm about the origin
        return pos.norm(dim=-1, keepdim=True)

    def chiral(pos, features, batch):  # signed volume spanned by three moments of each set
        rel = centred(pos, batch)  # (N, 3)
        radius2 = rel.pow(2).sum(-1, keepdim=True)  # (N, 1)
        moments = [scatter(rel * radius2**p, batch, dim=0, reduce='sum') for p in (1, 2, 3)]
        volume = torch.linalg.det(torch.stack(moments, dim=1))  # (S,)
        return volume[batch].unsqueeze(-1)  # (N, 1)

    def order_dependent(pos, features, batch):  # cumulative sum depends on the element order
        return centred(pos, batch).norm(dim=-1, keepdim=True).cumsum(0)

    for fn, bad in ((not_translation_invariant, 'translation'), (chiral, 'reflection'),
                    (order_dependent, 'permutation')):
        with pytest.raises(AssertionError, match=f'not equivariant under {bad} '):
            assert_equivariant(fn, pos, batch, features, invariant_outputs=(0, ))
        others = {kind: kind != bad for kind in ('rotation', 'reflection', 'translation')}
        kwargs = {kind + 's': on for kind, on in others.items()}
        kwargs['permutations'] = bad != 'permutation'
        errors = assert_equivariant(fn, pos, batch, features, invariant_outputs=(0, ), **kwargs)
        assert bad not in errors


def test_equivariant_output_declared_invariant_fails():
    pos, batch, features = sets(torch.float64)
    with pytest.raises(AssertionError, match='rotation'):
        assert_equivariant(equivariant_fn, pos, batch, features, invariant_outputs=(0, 1, 2),
                           set_outputs=(1, ))
    # A displacement is not moved by translations: declared as a point it must fail.
    with pytest.raises(AssertionError, match='not equivariant under translation'):
        assert_equivariant(equivariant_fn, pos, batch, features, equivariant_outputs=(0, 2),
                           invariant_outputs=(1, ), set_outputs=(1, ))


def test_independent_sets_catch_cross_set_leakage():
    pos, batch, features = sets(torch.float64)

    def leaky(pos, features, batch):  # every set sees the centroid of all elements
        return (pos - pos.mean(dim=0)).norm(dim=-1, keepdim=True)

    # One rigid motion of everything is a symmetry of 'leaky' ...
    assert_equivariant(leaky, pos, batch, features, invariant_outputs=(0, ), independent_sets=False)
    # ... but moving the sets independently exposes the leak.
    with pytest.raises(AssertionError):
        assert_equivariant(leaky, pos, batch, features, invariant_outputs=(0, ))


def test_dtype_tolerances():
    def float32_inside(pos, features, batch):  # exact up to float32 rounding only
        out, set_radius2, _ = equivariant_fn(pos.float(), features.float(), batch)
        return out.to(pos.dtype), set_radius2.to(pos.dtype)

    declared = dict(equivariant_outputs=(0, ), invariant_outputs=(1, ), set_outputs=(1, ))
    pos64, batch, features64 = sets(torch.float64)
    with pytest.raises(AssertionError, match='float64'):
        assert_equivariant(float32_inside, pos64, batch, features64, **declared)
    errors = assert_equivariant(float32_inside, pos64, batch, features64, atol=1e-4, rtol=1e-4,
                                **declared)
    assert max(errors.values()) > 1e-9  # the float32 rounding is really there
    pos32, _, features32 = sets(torch.float32)
    assert_equivariant(float32_inside, pos32, batch, features32, **declared)

    assert default_tolerance(torch.float64) == (1e-9, 1e-9)
    assert default_tolerance(torch.float32) == (1e-4, 1e-4)
    with pytest.raises(ValueError, match='tolerance'):
        default_tolerance(torch.int64)


def test_generator_makes_it_reproducible():
    pos, batch, features = sets(torch.float32)
    runs = [
        assert_equivariant(equivariant_fn, pos, batch, features, **DECLARED,
                           generator=torch.Generator().manual_seed(7)) for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_set_level_point_outputs():
    pos, batch, features = sets(torch.float64)

    def centroids(pos, features, batch, num_sets=None):  # one point per set, and its spread
        centroid = scatter(pos, batch, dim=0, dim_size=num_sets, reduce='mean')  # (S, D)
        spread = scatter(centred(pos, batch).norm(dim=-1), batch, dim=0, dim_size=num_sets)
        return centroid, spread

    declared = dict(equivariant_outputs=(0, ), invariant_outputs=(1, ), set_outputs=(0, 1))
    errors = assert_equivariant(centroids, pos, batch, features, **declared)
    assert set(errors) == KINDS
    assert_equivariant(centroids, pos, batch, features, independent_sets=False, **declared)
    with pytest.raises(AssertionError, match='translation'):  # a point is moved by translations
        assert_equivariant(centroids, pos, batch, features, vector_outputs=(0, ),
                           invariant_outputs=(1, ), set_outputs=(0, 1))
    # a trailing empty set is fine for invariant outputs, but has no transformation for points
    assert_equivariant(lambda *args: centroids(*args, num_sets=4)[1], pos, batch, features,
                       invariant_outputs=(0, ), set_outputs=(0, ))
    with pytest.raises(ValueError, match='trailing empty sets'):
        assert_equivariant(lambda *args: centroids(*args, num_sets=4), pos, batch, features,
                           **declared)


def test_nan_output_fails():
    pos, batch, features = sets(torch.float64)

    def nan_after_rotation(pos, features, batch):
        out = pos.norm(dim=-1, keepdim=True)
        return out if torch.equal(pos, pos_ref) else out * float('nan')

    pos_ref = pos
    with pytest.raises(AssertionError, match='inf'):
        assert_equivariant(nan_after_rotation, pos, batch, features, invariant_outputs=(0, ),
                           translations=False, permutations=False, reflections=False)


def test_invalid_declarations():
    pos, batch, features = sets(torch.float64)
    with pytest.raises(ValueError, match='not declared'):
        assert_equivariant(equivariant_fn, pos, batch, features, equivariant_outputs=(0, ))
    with pytest.raises(ValueError, match='both'):
        assert_equivariant(equivariant_fn, pos, batch, features, equivariant_outputs=(0, ),
                           invariant_outputs=(0, 1, 2), set_outputs=(1, ))
    with pytest.raises(ValueError, match='out of range'):
        assert_equivariant(equivariant_fn, pos, batch, features, **{**DECLARED,
                                                                     'vector_outputs': (2, 5)})
    with pytest.raises(ValueError, match='one row per element'):
        assert_equivariant(equivariant_fn, pos, batch, features, equivariant_outputs=(0, ),
                           invariant_outputs=(1, ), vector_outputs=(2, ))
    with pytest.raises(ValueError, match='does not end in D'):
        assert_equivariant(equivariant_fn, pos, batch, features, equivariant_outputs=(0, 1),
                           vector_outputs=(2, ), set_outputs=(1, ))
    with pytest.raises(ValueError, match='floating'):
        assert_equivariant(equivariant_fn, pos.long(), batch, features, **DECLARED)
    with pytest.raises(ValueError, match='batch'):
        assert_equivariant(equivariant_fn, pos, batch[:-1], features, **DECLARED)


def test_assert_equivariant_fails_an_infinite_output():
    # an inf made the tolerance infinite: any function passed
    from torch_mz.testing import assert_equivariant
    pos = torch.randn(10, 3, dtype=torch.float64)
    batch = torch.tensor([0] * 5 + [1] * 5)

    def f(p, feat, b):  # the x coordinate (not invariant), behind an infinite first entry
        return torch.cat([torch.full((1, ), float('inf'), dtype=p.dtype), p[1:, 0]])

    with pytest.raises(AssertionError, match='not equivariant'):
        assert_equivariant(f, pos, batch, invariant_outputs=[0])


def test_a_point_output_of_a_set_without_elements_is_refused_not_failed():
    # a set in the middle of 'batch' without elements: an exactly equivariant centroid (0 there)
    # was compared with a translated 0 and reported as 'not equivariant under translation'
    pos, _, features = sets(torch.float64)
    batch = torch.tensor([0, 0, 0, 2, 2, 3, 3, 3, 3, 3])  # set 1 is empty

    def centroids(pos, features, batch):
        return scatter(pos, batch, dim=0, dim_size=4, reduce='mean')  # (4, D)

    for independent in (True, False):
        with pytest.raises(ValueError, match=r'no elements in sets \[1\]'):
            assert_equivariant(centroids, pos, batch, features, equivariant_outputs=(0, ),
                               set_outputs=(0, ), independent_sets=independent)
    # an invariant per-set output is fine there (it is compared unchanged)
    assert_equivariant(lambda *args: centroids(*args).norm(dim=-1), pos,
                       torch.tensor([0, 0, 0, 2, 2, 2, 2, 2, 2, 2]), features,
                       invariant_outputs=(0, ), set_outputs=(0, ), rotations=False,
                       reflections=False, translations=False)
    with pytest.raises(ValueError, match='set ids >= 0'):
        assert_equivariant(centroids, pos, batch - 1, features, equivariant_outputs=(0, ),
                           set_outputs=(0, ))
    # a vector per set is 0 for an empty one, and Q 0 = 0: checked, not refused, in both modes

    def spreads(pos, features, batch):
        c = scatter(pos, batch, dim=0, dim_size=4, reduce='mean')  # (4, D)
        return scatter(features[:, :1] * (pos - c[batch]), batch, dim=0, dim_size=4)  # (4, D)

    for independent in (True, False):
        assert_equivariant(spreads, pos, batch, features, vector_outputs=(0, ),
                           set_outputs=(0, ), independent_sets=independent)
    with pytest.raises(ValueError, match='trailing empty sets'):  # (no transformation drawn)
        assert_equivariant(lambda *a: torch.cat([spreads(*a), spreads(*a)[:1] * 0]), pos,
                           batch, features, vector_outputs=(0, ), set_outputs=(0, ))
