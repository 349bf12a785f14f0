
import pytest
import torch

from torch_mz.train import TargetNormalizer, Trainer, load_checkpoint

from tests.train._common import H, REG_TRAIN, config, targets


def test_target_normalizer_round_trip_and_state_dict():
    g = torch.Generator().manual_seed(0)
    y = torch.randn(50, 3, generator=g) * torch.tensor([5.0, 0.1, 1.0]) + torch.tensor([7, -3, 0])
    y[:, 2] = 4.0  # a constant column keeps std 1 instead of dividing by zero
    norm = TargetNormalizer().fit(y)
    z = norm.transform(y)
    assert torch.allclose(z[:, :2].mean(0), torch.zeros(2), atol=1e-5)
    assert torch.allclose(z[:, :2].std(0, unbiased=False), torch.ones(2), atol=1e-5)
    assert torch.equal(z[:, 2], torch.zeros(50))
    assert torch.allclose(norm.inverse_transform(z), y, atol=1e-5)
    assert torch.allclose(norm.inverse_scale(torch.ones(1, 3)),
                          torch.tensor([[y[:, 0].std(unbiased=False), y[:, 1].std(unbiased=False),
                                         1.0]]), atol=1e-5)

    state = norm.state_dict()
    assert all(torch.is_tensor(state[k]) for k in ('mean', 'std'))
    other = TargetNormalizer().load_state_dict(state)
    assert torch.equal(other.transform(y), z)

    one = TargetNormalizer().fit(torch.tensor([1.0, 2.0, 3.0]))  # 1-D targets: one column
    assert torch.allclose(one.inverse_transform(one.transform(torch.tensor([5.0]))),
                          torch.tensor([5.0]))
    with pytest.raises(ValueError, match='3 column'):
        norm.transform(torch.zeros(4, 2))
    with pytest.raises(RuntimeError, match='not fitted'):
        TargetNormalizer().transform(y)


def test_normalizer_uses_train_statistics_only(tmp_path):
    val = H.make_regression_sets(48, seed=11, offset=1000.0, scale=50.0)  # very different
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=1, out_dir=str(tmp_path)))
    trainer.fit(REG_TRAIN, val)
    y = targets(REG_TRAIN).double()
    assert torch.allclose(trainer.normalizer.mean, y.mean(0))
    assert torch.allclose(trainer.normalizer.std, y.std(0, unbiased=False))
    # ... and it is stored in the checkpoint
    ckpt = load_checkpoint(tmp_path / 'checkpoint.pt')
    assert torch.equal(ckpt['normalizer']['mean'], trainer.normalizer.mean)
    assert torch.equal(ckpt['normalizer']['std'], trainer.normalizer.std)


def test_the_wrapper_torch_compile_returns_is_refused_and_model_compile_trains(tmp_path):
    # train(torch.compile(model)) ran every epoch, then failed to attach the normaliser, and its
    # checkpoints held '_orig_mod.' keys that load_model refused; model.compile() (in place)
    # trains and writes checkpoints that load
    import torch
    from torch_geometric.data import Batch

    from torch_mz import load_model
    from torch_mz.models import build_model
    from torch_mz.train import TargetNormalizer, TrainConfig, Trainer, attach_normalizer, train
    from tests.train._common import REG_TRAIN, REG_VAL
    model = build_model('deepsets', 3, 2)
    wrapped = torch.compile(model, backend='aot_eager')
    with pytest.raises(ValueError, match=r'model\.compile\(\)'):
        Trainer(wrapped, TrainConfig(device='cpu', progress=False))
    with pytest.raises(ValueError, match=r'model\.compile\(\)'):
        attach_normalizer(wrapped, TargetNormalizer())
    model.compile(backend='aot_eager')
    train(model, REG_TRAIN[:32], REG_VAL[:16], config=TrainConfig(
        epochs=1, batch_size=16, warmup_epochs=1, device='cpu', progress=False,
        out_dir=str(tmp_path)))
    again = load_model(str(tmp_path / 'best.pt'))
    batch = Batch.from_data_list(REG_VAL[:4])
    model.eval()
    again.eval()
    torch.testing.assert_close(again(batch)[0], model(batch)[0], rtol=1e-5, atol=1e-5)


def test_small_units_are_standardised_and_constant_columns_found_relative_to_the_mean():
    # an absolute threshold (sigma < 1e-8) kept sigma = 1 for targets in small units, which a
    # model could then not fit (test R^2 -4.7e10 at 1e-9 scale against 0.9998 at scale 1)
    g = torch.Generator().manual_seed(0)
    y = torch.randn(200, 2, generator=g, dtype=torch.float64) * 1e-9
    y[:, 1] = 0.1  # a constant column: float64 statistics leave at most rounding's spread
    y[::3, 1] = torch.tensor(0.1, dtype=torch.float64).nextafter(torch.tensor(1.0,
                                                                              dtype=torch.float64))
    norm = TargetNormalizer().fit(y)
    assert norm.std[0] == pytest.approx(float(y[:, 0].std(unbiased=False)), rel=1e-12)
    assert norm.std[1] == 1.0  # a spread of one ulp of its mean: constant
    z = norm.transform(y)
    assert float(z[:, 0].std(unbiased=False)) == pytest.approx(1.0, rel=1e-9)
    assert TargetNormalizer().fit(torch.zeros(10, 1)).std.item() == 1.0


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_narrow_predictions_map_back_to_target_units_in_float32(dtype):
    # under autocast a model's standardised output is bfloat16 / float16: mapped back in its own
    # dtype, a prediction near 1000 came out as a multiple of 8 (every one exactly 1000.0)
    from torch_mz.train import TargetUnits
    g = torch.Generator().manual_seed(0)
    norm = TargetNormalizer().fit(1000.0 + torch.randn(100, 1, generator=g))
    z = torch.linspace(-2, 2, 9).view(9, 1)
    exact = norm.inverse_transform(z)  # float32
    for mapped in (norm.inverse_transform(z.to(dtype)), TargetUnits(norm)(z.to(dtype))):
        assert mapped.dtype == torch.float32
        # only z's own rounding to the narrow type is left (about 1e-2 of a std at |z| = 2)
        assert torch.allclose(mapped, exact, atol=0.02 * float(norm.std), rtol=0)
    assert len(set(TargetUnits(norm)(z.to(dtype)).view(-1).tolist())) == 9


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16, torch.float32])
def test_casting_the_model_keeps_the_carried_statistics(dtype):
    # .half() / .to(bfloat16) / .float() of a model cast its TargetUnits buffers too: a
    # bfloat16 model mapped an empty set to 1000.0 instead of the mean 1000.39 (float16:
    # 1000.5), and .float() rounded the float64 mean of targets about 1e8 to a multiple of 8
    from torch_mz.train import attach_normalizer, carried_normalizer
    g = torch.Generator().manual_seed(0)
    y = (1e8 if dtype == torch.float32 else 1000.0) + torch.randn(64, 1, generator=g,
                                                                   dtype=torch.float64)
    norm = TargetNormalizer().fit(y if dtype == torch.float32 else y.float())
    model = H.ToyDeepSets(3, 1)
    attach_normalizer(model, norm).to(dtype)
    z = torch.tensor([[0.0], [1.0]], dtype=dtype)
    mapped = model.target_units(z)
    assert torch.equal(mapped, norm.inverse_transform(z))
    assert torch.equal(mapped[0], norm.mean.to(mapped.dtype))  # the mean, to the map's dtype
    # (and the normaliser it carries is the one given: predict(model, ..., normalizer=norm)
    # refused a float16 / bfloat16 model's as a different one)
    carried = carried_normalizer(model)
    assert torch.equal(carried.mean, norm.mean) and torch.equal(carried.std, norm.std)


def test_a_model_moved_to_meta_and_made_again_with_to_empty_keeps_its_statistics():
    # model.to('meta') then model.to_empty(device=...) (deferred initialisation) failed with
    # "Cannot copy out of meta tensor; no data!" on the statistics (load_state_dict, which
    # fills the weights after it, does not hold them: their buffers are not persistent)
    from torch_mz.train import attach_normalizer, carried_normalizer
    norm = TargetNormalizer().fit(torch.tensor([[1.0], [3.0], [8.0]], dtype=torch.float64))
    model = attach_normalizer(H.ToyDeepSets(3, 1), norm)
    model.to('meta')
    assert model.target_units.mean.is_meta
    model.to_empty(device='cpu')
    carried = carried_normalizer(model)
    assert torch.equal(carried.mean, norm.mean) and torch.equal(carried.std, norm.std)
    assert model.target_units.mean.dtype == torch.float64


def test_evaluating_in_one_thread_leaves_other_threads_target_units():
    # evaluation switched the shared model to standardised outputs with a flag: another thread
    # calling the model meanwhile got standardised values, and two evaluations at once left
    # it standardised for good
    import threading
    from torch_geometric.loader import DataLoader
    from torch_mz.train.normalize import _standardised
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=1))
    trainer.fit(REG_TRAIN[:32])
    model = trainer.model.eval()
    batch = next(iter(DataLoader(REG_TRAIN[:8], batch_size=8)))
    with torch.no_grad():
        units = model(batch)
        inside, seen = threading.Event(), {}
        release = threading.Event()

        def evaluating():
            with _standardised(model):
                seen['standard'] = model(batch)
                inside.set()
                release.wait(10)

        worker = threading.Thread(target=evaluating)
        worker.start()
        inside.wait(10)
        seen['other'] = model(batch)  # while the worker is inside its context
        release.set()
        worker.join()
        assert torch.equal(seen['other'], units)
        assert not torch.allclose(seen['standard'], units)
        # overlapping contexts in one thread, left in either order: standardised while one is
        # open, target units after (a reset to the entry's token left it standardised for good
        # when a was left before b)
        for order in ((0, 1), (1, 0)):
            contexts = [_standardised(model), _standardised(model)]
            for c in contexts:
                c.__enter__()
            contexts[order[0]].__exit__(None, None, None)
            assert not torch.allclose(model(batch), units)
            contexts[order[1]].__exit__(None, None, None)
            assert torch.equal(model(batch), units)


def test_a_state_of_before_the_relative_threshold_keeps_the_new_default():
    # states written before 0.3.0 hold 'eps' 1e-8, an absolute threshold: read as relative it
    # made a refit treat a column of 1e4 +- 5e-5 as constant
    old_state = {'mean': torch.zeros(1, dtype=torch.float64),
                 'std': torch.ones(1, dtype=torch.float64), 'eps': 1e-8}
    norm = TargetNormalizer().load_state_dict(old_state)
    assert norm.eps == 1e-12 and not norm.float64
    y = 1e4 + 5e-5 * torch.randn(100, 1, generator=torch.Generator().manual_seed(0),
                                 dtype=torch.float64)
    assert float(norm.fit(y).std) != 1.0
    assert TargetNormalizer(1e-3).load_state_dict(TargetNormalizer(1e-3).fit(y).state_dict()) \
        .eps == 1e-3


def test_a_normaliser_pickled_before_the_float64_flag_still_works():
    # TargetNormalizer instances pickled by earlier code have no float64 attribute: transform,
    # state_dict and attach_normalizer raised AttributeError
    import pickle
    from torch_mz.train import TargetUnits, attach_normalizer
    norm = TargetNormalizer().fit(torch.randn(10, 1))
    del norm.float64  # as an instance of before
    back = pickle.loads(pickle.dumps(norm))
    assert back.transform(torch.zeros(2, 1)).dtype == torch.float32
    assert back.state_dict()['float64'] is False
    units = TargetUnits(back)
    del units.float64
    assert units(torch.zeros(2, 1)).dtype == torch.float32
    attach_normalizer(torch.nn.Linear(2, 1), back)


def test_a_zero_dimensional_tensor_is_refused_by_fit_and_mapped_by_a_one_target_normaliser():
    # fit(torch.tensor(3.0)) and transform(torch.tensor(5.0)) failed with torch's IndexError
    # ("Dimension specified as 0 but tensor has no dimensions")
    with pytest.raises(ValueError, match=r'shape \(N, t\) or \(N,\).*0-dimensional'):
        TargetNormalizer().fit(torch.tensor(3.0))
    one = TargetNormalizer().fit(torch.tensor([1.0, 2.0, 3.0]))
    assert one.transform(torch.tensor(5.0)).shape == ()
    assert torch.allclose(one.inverse_transform(one.transform(torch.tensor(5.0))),
                          torch.tensor(5.0))
    two = TargetNormalizer().fit(torch.randn(8, 2))
    with pytest.raises(ValueError, match=r'2 column\(s\) \(got shape \(\)\)'):
        two.transform(torch.tensor(5.0))
