import pytest
import torch
from torch.nn import GELU, Linear

from torch_mz.models.mlp import gelu_mlp, reset_linear_layers


def test_gelu_mlp_layers():
    mlp = gelu_mlp(3, 8, 2, num_layers=2)
    assert [type(m) for m in mlp] == [Linear, GELU, Linear, GELU, Linear]
    assert [(m.in_features, m.out_features) for m in mlp if isinstance(m, Linear)] == [
        (3, 8), (8, 8), (8, 2)]
    assert mlp(torch.randn(5, 3)).shape == (5, 2)
    assert [type(m) for m in gelu_mlp(4, 6, 1, num_layers=1)] == [Linear, GELU, Linear]
    with pytest.raises(ValueError, match="'num_layers' must be at least 1"):
        gelu_mlp(3, 8, 2, num_layers=0)


def test_reset_linear_layers_draws_what_a_fresh_mlp_draws():
    torch.manual_seed(0)
    fresh = [gelu_mlp(3, 8, 2, 2), gelu_mlp(2, 4, 1, 1)]
    trained = [gelu_mlp(3, 8, 2, 2), gelu_mlp(2, 4, 1, 1)]
    for mlp in trained:
        for p in mlp.parameters():
            p.data.fill_(0.5)
    torch.manual_seed(0)
    reset_linear_layers(*trained)
    for a, b in zip(fresh, trained):
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert torch.equal(pa, pb)


@pytest.mark.parametrize('num_layers, hidden', [(2 ** 70, 128), (10 ** 7, 64)])
def test_layer_counts_that_could_not_fit_in_memory_are_refused_before_any_layer(
        num_layers, hidden, monkeypatch):
    # 2**70 ended in an OverflowError (a list of as many widths), 10**7 built layers until
    # memory ran out
    import torch_mz.models.mlp as mlp

    def built(*args, **kwargs):
        raise AssertionError('a layer was built')
    monkeypatch.setattr(mlp, 'Linear', built)
    with pytest.raises(ValueError, match=f"^num_layers={num_layers}, hidden_channels={hidden}: "
                                         f".*beyond this machine's"):
        gelu_mlp(3, hidden, 1, num_layers)
