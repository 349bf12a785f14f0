import torch
from torch_geometric.data import Batch, Data

from torch_mz.models import MeanMLP, build_model
from torch_mz.testing import permute_within_sets
from tests.nn._sets import make_index


def test_hand_built_sets_give_the_mlp_of_their_mean():
    model = MeanMLP(2, 1, hidden_channels=8).double().eval()
    x = torch.tensor([[1., 3.], [3., 5.], [0., 0.], [-2., 1.], [2., -1.]], dtype=torch.float64)
    index = torch.tensor([0, 0, 1, 2, 2])
    means = torch.tensor([[2., 4.], [0., 0.], [0., 0.]], dtype=torch.float64)
    pred, ihw = model(x, index)
    torch.testing.assert_close(pred, model.rho(means))
    assert ihw is None  # no uncertainty output
    # sets 1 and 2 differ in size and elements but share the mean: the same prediction
    torch.testing.assert_close(pred[1], pred[2])


def test_permutation_invariant_and_sees_only_the_mean():
    torch.manual_seed(0)
    model = build_model('mean-mlp', 3, 2).double().eval()
    index = make_index([4, 1, 6, 3])
    x = torch.randn(index.numel(), 3, dtype=torch.float64)
    pred, _ = model(x, index)
    assert pred.shape == (4, 2) and torch.isfinite(pred).all()
    perm = permute_within_sets(index, torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(x[perm], index[perm])[0], pred)
    # moving elements of a set without moving its mean changes nothing ...
    shift = torch.randn(index.numel(), 3, dtype=torch.float64)
    for s in range(4):
        shift[index == s] -= shift[index == s].mean(0)
    torch.testing.assert_close(model(x + shift, index)[0], pred)
    # ... moving the mean of one set changes that set only
    x2 = x.clone()
    x2[index == 2] += 1.0
    pred2, _ = model(x2, index)
    keep = torch.tensor([0, 1, 3])
    torch.testing.assert_close(pred2[keep], pred[keep])
    assert not torch.allclose(pred2[2], pred[2])


def test_batch_input_and_finite_gradients():
    torch.manual_seed(0)
    model = MeanMLP(3, 1)
    g = torch.Generator().manual_seed(2)
    batch = Batch.from_data_list([Data(x=torch.randn(n, 3, generator=g)) for n in (3, 5, 2)])
    pred, _ = model(batch)
    assert pred.shape == (3, 1)
    pred.sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert 'hidden_channels=128' in repr(model)
