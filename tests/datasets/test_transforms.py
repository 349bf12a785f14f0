import math

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform, Compose

from torch_mz.datasets.transforms import RandomJitter, RandomPointSubset, RandomRotateUp


def cloud(n: int = 50, seed: int = 0) -> Data:
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randn(n, 3, generator=gen)
    return Data(pos=pos, x=pos.clone(), y=torch.tensor([3]), mask=torch.arange(n) % 3 == 0)


def test_transforms_are_pyg_base_transforms():
    for t in (RandomRotateUp(), RandomJitter(), RandomPointSubset(8)):
        assert isinstance(t, BaseTransform)
        assert t.__class__.__name__ in repr(t)


def test_rotate_up_fixed_angle_matches_hand_computed_rotation():
    data = Data(pos=torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0]]))
    data.x = data.pos.clone()
    out = RandomRotateUp(degrees=(90.0, 90.0))(data)
    # R_y(90 deg) maps x -> -z and z -> x and keeps y
    expected = torch.tensor([[0.0, 0.0, -1.0], [0.0, 2.0, 0.0], [1.0, 0.0, 0.0]])
    assert torch.allclose(out.pos, expected, atol=1e-6)
    assert torch.equal(out.x, out.pos)


@pytest.mark.parametrize('axis', [0, 1, 2])
def test_rotation_matrices_are_proper_rotations_about_the_axis(axis):
    t = RandomRotateUp(axis=axis)
    for angle in (0.3, -2.0, math.pi):
        rot = t.rotation(angle, torch.double)
        assert torch.allclose(rot @ rot.t(), torch.eye(3, dtype=torch.double), atol=1e-12)
        assert torch.linalg.det(rot).item() == pytest.approx(1.0)
        assert torch.equal(rot[axis], torch.eye(3, dtype=torch.double)[axis])
    # positive angles turn counter-clockwise seen from +axis (right-handed), as R_x, R_y, R_z do
    i, j = [a for a in range(3) if a != axis]
    e_i = torch.zeros(3, dtype=torch.double)
    e_i[i] = 1.0
    rotated = t.rotation(math.pi / 2, torch.double) @ e_i
    expected = torch.cross(torch.eye(3, dtype=torch.double)[axis], e_i, dim=0)
    assert torch.allclose(rotated, expected, atol=1e-12)


def test_random_rotation_keeps_up_coordinate_norms_and_x_consistent():
    torch.manual_seed(0)
    data = cloud()
    pos = data.pos.clone()
    out = RandomRotateUp()(data)
    assert torch.allclose(out.pos[:, 1], pos[:, 1])
    assert torch.allclose(out.pos.norm(dim=1), pos.norm(dim=1), atol=1e-5)
    assert not torch.allclose(out.pos, pos)
    assert torch.equal(out.x, out.pos)
    assert torch.equal(out.mask, cloud().mask) and torch.equal(out.y, torch.tensor([3]))


def test_rotation_angles_cover_the_range():
    torch.manual_seed(1)
    t = RandomRotateUp(degrees=30.0)
    angles = []
    for _ in range(200):
        out = t(Data(pos=torch.tensor([[1.0, 0.0, 0.0]])))
        angles.append(math.degrees(math.atan2(-out.pos[0, 2].item(), out.pos[0, 0].item())))
    assert max(angles) <= 30.0 + 1e-4 and min(angles) >= -30.0 - 1e-4
    assert max(angles) > 25.0 and min(angles) < -25.0


def test_coords_in_x_offset_and_none():
    torch.manual_seed(2)
    pos = torch.randn(6, 3)
    other = torch.randn(6, 5)
    x = torch.cat([other, pos, torch.ones(6, 1)], dim=1)  # QM9 layout: coordinates in columns 5..7
    out = RandomRotateUp(coords_in_x=5)(Data(pos=pos.clone(), x=x.clone()))
    assert torch.equal(out.x[:, 5:8], out.pos)
    assert torch.equal(out.x[:, :5], other) and torch.equal(out.x[:, 8], torch.ones(6))
    untouched = RandomJitter(coords_in_x=None)(Data(pos=pos.clone(), x=x.clone()))
    assert torch.equal(untouched.x, x) and not torch.equal(untouched.pos, pos)


def test_mismatched_x_is_rejected():
    data = Data(pos=torch.zeros(4, 3), x=torch.zeros(4, 2))
    with pytest.raises(ValueError, match='coordinates'):
        RandomRotateUp()(data)
    with pytest.raises(ValueError, match='pos'):
        RandomJitter()(Data(x=torch.zeros(4, 3)))


def test_jitter_is_clipped_and_keeps_x_consistent():
    torch.manual_seed(3)
    data = cloud(2000)
    pos = data.pos.clone()
    out = RandomJitter(sigma=0.05, clip=0.02)(data)
    delta = out.pos - pos
    assert delta.abs().max().item() <= 0.02 + 1e-6  # float32 rounding of (pos + noise) - pos
    assert (delta.abs() > 0.02 - 1e-6).float().mean() > 0.5  # the clip is active at this sigma
    assert torch.equal(out.x, out.pos)
    out = RandomJitter(sigma=0.05, clip=None)(cloud(2000))
    assert (out.pos - pos).abs().max().item() > 0.1
    assert (out.pos - pos).std().item() == pytest.approx(0.05, rel=0.1)
    assert torch.equal(RandomJitter(sigma=0.0)(cloud()).pos, cloud().pos)


def test_point_subset_keeps_rows_aligned():
    torch.manual_seed(4)
    data = cloud(50)
    pos, mask = data.pos.clone(), data.mask.clone()
    out = RandomPointSubset(20)(data)
    assert out.pos.shape == (20, 3) and out.x.shape == (20, 3) and out.mask.shape == (20, )
    assert torch.equal(out.x, out.pos)
    # every kept row is a distinct original row, with its own mask entry
    match = (out.pos[:, None, :] == pos[None, :, :]).all(-1)  # (20, 50)
    rows = match.float().argmax(dim=1)
    assert match.any(dim=1).all() and rows.unique().numel() == 20
    assert torch.equal(out.mask, mask[rows])
    assert torch.equal(out.y, torch.tensor([3]))


def test_point_subset_larger_than_set_only_shuffles():
    torch.manual_seed(5)
    data = cloud(10)
    pos = data.pos.clone()
    out = RandomPointSubset(64)(data)
    assert out.pos.shape == (10, 3)
    assert torch.equal(out.pos[out.pos[:, 0].argsort()], pos[pos[:, 0].argsort()])


def test_invalid_arguments():
    with pytest.raises(ValueError):
        RandomRotateUp(degrees=(10.0, -10.0))
    with pytest.raises(ValueError):
        RandomRotateUp(axis=3)
    with pytest.raises(ValueError):
        RandomJitter(sigma=-1.0)
    with pytest.raises(ValueError):
        RandomPointSubset(0)


def test_paper_training_pipeline_composes():
    torch.manual_seed(6)
    t = Compose([RandomPointSubset(32), RandomRotateUp(), RandomJitter()])
    out = t(cloud(100))
    assert out.pos.shape == (32, 3) and torch.equal(out.x, out.pos)


@pytest.mark.parametrize('cls', [RandomRotateUp, RandomJitter, RandomPointSubset])
def test_docstring_documents_every_argument(cls):
    import inspect
    params = [p for p in inspect.signature(cls.__init__).parameters if p != 'self']
    assert [p for p in params if f'{p} (' not in cls.__doc__] == []
