import random

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform, Compose, FixedPoints, RandomRotate

from torch_mz.datasets.transforms import RandomJitter


def cloud(n: int = 50, seed: int = 0) -> Data:
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randn(n, 3, generator=gen)
    return Data(pos=pos, y=torch.tensor([3]), mask=torch.arange(n) % 3 == 0)


def test_jitter_is_a_pyg_base_transform():
    t = RandomJitter()
    assert isinstance(t, BaseTransform) and 'RandomJitter' in repr(t)


def test_pyg_rotation_about_y_keeps_up_coordinate_and_norms():
    random.seed(0)
    data = cloud()
    pos = data.pos.clone()
    out = RandomRotate(180, axis=1)(data)  # what replaced torch_mz's RandomRotateUp
    assert torch.allclose(out.pos[:, 1], pos[:, 1])
    assert torch.allclose(out.pos.norm(dim=1), pos.norm(dim=1), atol=1e-5)
    assert not torch.allclose(out.pos, pos)
    assert torch.equal(out.mask, cloud().mask) and torch.equal(out.y, torch.tensor([3]))


def test_jitter_rejects_data_without_pos():
    with pytest.raises(ValueError, match='pos'):
        RandomJitter()(Data(x=torch.zeros(4, 3)))


def test_jitter_is_clipped():
    torch.manual_seed(3)
    data = cloud(2000)
    pos = data.pos.clone()
    out = RandomJitter(sigma=0.05, clip=0.02)(data)
    delta = out.pos - pos
    assert delta.abs().max().item() <= 0.02 + 1e-6  # float32 rounding of (pos + noise) - pos
    assert (delta.abs() > 0.02 - 1e-6).float().mean() > 0.5  # the clip is active at this sigma
    out = RandomJitter(sigma=0.05, clip=None)(cloud(2000))
    assert (out.pos - pos).abs().max().item() > 0.1
    assert (out.pos - pos).std().item() == pytest.approx(0.05, rel=0.1)
    assert torch.equal(RandomJitter(sigma=0.0)(cloud()).pos, cloud().pos)


def test_pyg_fixed_points_keeps_rows_aligned():
    torch.manual_seed(4)
    data = cloud(50)
    pos, mask = data.pos.clone(), data.mask.clone()
    out = FixedPoints(20, replace=False)(data)  # what replaced torch_mz's RandomPointSubset
    assert out.pos.shape == (20, 3) and out.mask.shape == (20, )
    # every kept row is a distinct original row, with its own mask entry
    match = (out.pos[:, None, :] == pos[None, :, :]).all(-1)  # (20, 50)
    rows = match.float().argmax(dim=1)
    assert match.any(dim=1).all() and rows.unique().numel() == 20
    assert torch.equal(out.mask, mask[rows])
    assert torch.equal(out.y, torch.tensor([3]))


def test_invalid_arguments():
    with pytest.raises(ValueError):
        RandomJitter(sigma=-1.0)
    with pytest.raises(ValueError):
        RandomJitter(clip=-1.0)


def test_paper_training_pipeline_composes():
    torch.manual_seed(6)
    random.seed(6)
    t = Compose([FixedPoints(32, replace=False), RandomRotate(180, axis=1), RandomJitter()])
    data = cloud(100)
    pos = data.pos.clone()
    out = t(data)
    assert out.pos.shape == (32, 3) and 'x' not in out
    match = ((out.pos[:, None, 1] - pos[None, :, 1]).abs() <= 0.05 + 1e-6)  # y only jittered
    assert match.any(dim=1).all()


@pytest.mark.parametrize('cls', [RandomJitter])
def test_docstring_documents_every_argument(cls):
    import inspect
    params = [p for p in inspect.signature(cls.__init__).parameters if p != 'self']
    assert [p for p in params if f'{p} (' not in cls.__doc__] == []


# --------------------------------------------------------------------------------------------------
# PyG transforms reach the models (issue 13, item 1)

MODELS = {  # small versions of the presets: name -> overrides
    'mz': dict(dim=8, heads=2, d_ff=8, num_inducing=3),
    'rigid': dict(dim=8, heads=2, d_ff=8, num_inducing=3),
    'perceiver': dict(dim=8, heads=2, d_ff=8, num_latents=3),
    'deepsets': dict(hidden_channels=8),
    'egnn': dict(hidden_channels=8, num_layers=2),
}  # not mean-mlp: the point clouds are centered, so their mean does not move


def _datasets(source, request):
    r"""(plain, transform -> transformed) data lists of a dataset, its in_channels and pos_dim."""
    if source == 'modelnet40':
        from torch_mz.datasets import ModelNet40
        root = request.getfixturevalue('modelnet_mesh_root')
        make = lambda t: list(ModelNet40(root, num_points=32, transform=t, log=False))  # noqa
        return make, 3
    if source == 'scanobjectnn':
        from torch_mz.datasets import ScanObjectNN
        root = request.getfixturevalue('scanobjectnn_root')['root']
        make = lambda t: list(ScanObjectNN(root, num_points=32, transform=t, log=False))  # noqa
        return make, 3
    from torch_mz.tasks import load_task
    task = load_task('chamfer', n_train=1, n_val=1, n_test=4, d=3)  # pos (n, 3) and x (n, 1)
    assert task.pos_dim == 3 and task.test[0].x.shape[1] == 1
    make = lambda t: [d.clone() if t is None else t(d.clone()) for d in task.test]  # noqa
    return make, 4


@pytest.mark.filterwarnings('ignore:ModelNet40 .* skipped:UserWarning')
@pytest.mark.filterwarnings('ignore:ModelNet40 .* classes have no:UserWarning')
@pytest.mark.parametrize('source', ['modelnet40', 'scanobjectnn', 'synthetic'])
def test_pyg_transforms_change_predictions_and_invariant_models_ignore_rotations(source,
                                                                                 request):
    from torch_geometric.data import Batch
    from torch_geometric.transforms import LinearTransformation, RandomScale

    from torch_mz.models import build_model
    make, in_channels = _datasets(source, request)
    rot, _ = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(0)))
    rot = rot * torch.linalg.det(rot)  # a proper rotation
    def batch(transform):
        data = Batch.from_data_list(make(transform))
        for key in ('pos', 'x'):
            if key in data:
                data[key] = data[key].double()
        return data

    plain, rotated, scaled = (batch(None), batch(LinearTransformation(rot)),
                              batch(RandomScale((2.0, 2.0))))
    assert 'x' not in plain or source == 'synthetic'  # coordinates in pos only
    torch.testing.assert_close(rotated.pos, plain.pos @ rot.T.double(), atol=1e-5, rtol=1e-5)
    for name, overrides in MODELS.items():
        torch.manual_seed(0)
        model = build_model(name, in_channels, 5, pos_dim=3, **overrides).double().eval()
        before = model(plain).prediction
        after_rotation = model(rotated).prediction
        if name == 'egnn':  # rotation-invariant: the PyG rotation reaches it and changes nothing
            torch.testing.assert_close(after_rotation, before, atol=1e-6, rtol=1e-6)
        else:
            assert (after_rotation - before).abs().max() > 1e-5, name
        assert (model(scaled).prediction - before).abs().max() > 1e-5, name


@pytest.mark.parametrize('kwargs, name', [(dict(sigma=float('nan')), 'sigma'),
                                          (dict(sigma=float('inf')), 'sigma'),
                                          (dict(sigma=float('inf'), clip=None), 'sigma'),
                                          (dict(clip=float('nan')), 'clip'),
                                          (dict(sigma='0.1'), 'sigma')])
def test_jitter_refuses_values_that_make_coordinates_non_finite(kwargs, name):
    # NaN passed the `< 0` checks, and every coordinate came out NaN
    with pytest.raises(ValueError, match=f"'{name}' must be a"):
        RandomJitter(**kwargs)
    out = RandomJitter(sigma=1.0, clip=float('inf'))(cloud(10))  # inf clips nothing
    assert torch.isfinite(out.pos).all()


def test_random_jitter_clip_is_a_float_with_one_cache_key():
    # clip=1 and clip=1.0 gave two reprs (two cache keys for one transform); True was a bound
    from torch_mz.datasets.fingerprint import _describe
    from torch_mz.datasets.transforms import RandomJitter
    assert repr(RandomJitter(clip=1)) == repr(RandomJitter(clip=1.0))
    assert _describe(RandomJitter(clip=1)) == _describe(RandomJitter(clip=1.0))
    assert RandomJitter(clip=None).clip is None
    import numpy as np
    for flag in (True, np.True_):
        with pytest.raises(ValueError, match="'clip' must be a non-negative number"):
            RandomJitter(clip=flag)


@pytest.mark.parametrize('kwargs, name', [(dict(sigma=True), 'sigma'),
                                          (dict(sigma=np.True_), 'sigma'),
                                          (dict(sigma=torch.tensor(True)), 'sigma'),
                                          (dict(clip=torch.tensor(True)), 'clip')])
def test_jitter_refuses_truth_values_of_every_type(kwargs, name):
    # sigma=True was taken as sigma=1.0, a hundred times the default noise (clip=True was
    # refused already, not a bool tensor)
    with pytest.raises(ValueError, match=f"'{name}' must be a"):
        RandomJitter(**kwargs)
    assert RandomJitter(sigma=np.float32(0.5), clip=torch.tensor(0.1)).clip == pytest.approx(0.1)


@pytest.mark.parametrize('dtype', [torch.long, torch.uint8, torch.bool, torch.complex64])
def test_jitter_refuses_coordinates_that_are_not_real_floats(dtype):
    # torch's kernels failed by their names ("normal_kernel_cpu" not implemented for 'Long',
    # clamp is not supported for complex types): no ValueError naming 'pos'
    with pytest.raises(ValueError, match=f"floating-point 'pos'.*{dtype}"):
        RandomJitter()(Data(pos=torch.zeros(4, 3, dtype=dtype)))
    for real in (torch.float16, torch.float64):  # float coordinates keep their dtype
        assert RandomJitter()(Data(pos=torch.zeros(4, 3, dtype=real))).pos.dtype == real


def test_jitter_noise_is_the_same_for_every_dtype_and_layout():
    # randn_like drew other numbers for float64 than for float32 (from 16 values on) and for
    # a column-major pos than for a contiguous one: one seed, other augmentations
    pos = cloud(40).pos  # (40, 3)
    torch.manual_seed(8)
    ref = RandomJitter(clip=None)(Data(pos=pos)).pos - pos  # float32, contiguous
    for dtype in (torch.float64, torch.float16):
        torch.manual_seed(8)
        out = RandomJitter(clip=None)(Data(pos=pos.to(dtype))).pos
        assert out.dtype == dtype
        tol = 1e-6 if dtype == torch.float64 else 1e-2
        torch.testing.assert_close((out - pos.to(dtype)).float(), ref, atol=tol, rtol=0)
    column_major = pos.T.contiguous().T  # the same values, other strides
    assert not column_major.is_contiguous()
    torch.manual_seed(8)
    out = RandomJitter(clip=None)(Data(pos=column_major)).pos
    torch.testing.assert_close(out - pos, ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize('transform', [RandomJitter(), RandomJitter(sigma=0.5, clip=None),
                                       Compose([RandomRotate(180, axis=1), RandomJitter()])])
def test_transforms_leave_their_input_unchanged(transform):
    # a dataset's cached item must not change when a transform runs on it (twice); the last is
    # the real tasks' training augmentation
    random.seed(0)
    data = Data(pos=cloud(10).pos, x=torch.ones(10, 2), batch=torch.zeros(10, dtype=torch.long),
                edge_index=torch.tensor([[0, 1], [1, 0]]), edge_attr=torch.ones(2, 1))
    before = data.clone()
    for _ in range(2):
        out = transform(data)
        assert not torch.equal(out.pos, data.pos) and out.pos.shape == (10, 3)
        for key in ('x', 'batch', 'edge_index', 'edge_attr'):  # carried as they are
            assert torch.equal(out[key], before[key])
    for key in before.keys():
        assert torch.equal(data[key], before[key]), key
    assert transform(Data(pos=torch.zeros(0, 3))).pos.shape == (0, 3)  # an empty set


@pytest.fixture
def float64_default():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def test_jitter_noise_is_drawn_in_float32_whatever_the_default_dtype(float64_default):
    # the bug: torch.randn drew in the default dtype, so under torch.set_default_dtype(float64)
    # a float32 pos got other noise than under float32 (and a float64 pos other than float32's)
    pos = torch.zeros(40, 3, dtype=torch.float32)
    torch.manual_seed(8)
    out = RandomJitter(sigma=1.0, clip=None)(Data(pos=pos)).pos
    torch.manual_seed(8)
    expected = torch.randn(40, 3, dtype=torch.float32)
    assert out.dtype == torch.float32 and torch.equal(out, expected)
    torch.manual_seed(8)
    out = RandomJitter(sigma=1.0, clip=None)(Data(pos=pos.double())).pos
    assert torch.equal(out, expected.double())
