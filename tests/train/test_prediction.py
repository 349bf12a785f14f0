import pytest
import torch

from torch_mz.train import predict

from tests.train._common import H, REG_VAL, fake_device


def test_predict_leaves_the_callers_random_stream_as_it_was():
    # a DataLoader draws a base seed from the global stream even without shuffling: a model
    # built (or a training run) after a seeded predict() was another one than without it
    model = H.ToyDeepSets(3, 2)
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    pred = predict(model, REG_VAL, batch_size=16, device='cpu')
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(torch.rand(4), expected)
    assert pred.shape == (len(REG_VAL), 2)


def test_predict_puts_the_model_back_on_its_device(monkeypatch):
    # the model stayed on the device it predicted on: the caller's next model(batch) with the
    # batch on the model's own device failed
    model = H.ToyDeepSets(3, 2).train()
    expected = predict(model, REG_VAL, batch_size=16, device='cpu')
    moves = fake_device(monkeypatch)
    pred = predict(model, REG_VAL, batch_size=16, device='mps')
    assert [dev for m, dev in moves if m is model] == [torch.device('mps'), torch.device('cpu')]
    assert torch.equal(pred, expected) and model.training


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_predict_on_cuda_puts_the_model_back_on_the_cpu():
    model = H.ToyDeepSets(3, 2)
    predict(model, REG_VAL, batch_size=16, device='cuda')
    assert {p.device.type for p in model.parameters()} == {'cpu'}


def test_predict_names_a_stream_without_sets_as_empty():
    # (a dataset without a length that gave no set: torch.cat's "expected a non-empty list")
    from torch.utils.data import IterableDataset

    class Empty(IterableDataset):
        def __iter__(self):
            return iter([])
    with pytest.raises(ValueError, match='predict\\(\\) got an empty dataset'):
        predict(H.ToyDeepSets(3, 2), Empty(), device='cpu')
