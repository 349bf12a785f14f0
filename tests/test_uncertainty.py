import math

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from torch_mz.models import build_model
from torch_mz.train import TargetNormalizer, predict
from torch_mz.uncertainty import (DEFAULT_LEVELS, AffineSigma, binned_by_uncertainty,
                                  error_correlation, fit_affine_sigma, gaussian_nll,
                                  interval_coverage, mc_dropout_predict, predictive_moments,
                                  regression_ece)


def gaussian_data(n=20000, seed=0):
    rng = np.random.default_rng(seed)
    pred = rng.normal(size=n)
    sigma = rng.uniform(0.5, 2.0, size=n)
    target = pred + sigma * rng.standard_normal(n)
    return pred, target, sigma


def test_calibrated_gaussian_has_small_ece_and_analytic_nll():
    pred, target, sigma = gaussian_data()
    assert regression_ece(pred, target, sigma) < 0.015
    expected = 0.5 * math.log(2 * math.pi) + 0.5 + np.log(sigma).mean()
    assert gaussian_nll(pred, target, sigma) == pytest.approx(expected, abs=0.03)
    coverage = interval_coverage(pred, target, sigma)
    assert coverage.shape == (len(DEFAULT_LEVELS),)
    assert np.all(np.diff(coverage) >= 0)  # nested intervals
    np.testing.assert_allclose(coverage, DEFAULT_LEVELS, atol=0.02)


def test_nll_by_hand():
    # one sample, error 2, sigma 1: 0.5 log(2 pi) + 0 + 2
    assert gaussian_nll([0.0], [2.0], [1.0]) == pytest.approx(0.5 * math.log(2 * math.pi) + 2)
    # tensors of shape (N, 1) give the same as vectors
    p, y, s = torch.zeros(3, 1), torch.tensor([[1.0], [0.0], [-1.0]]), torch.full((3, 1), 2.0)
    assert gaussian_nll(p, y, s) == pytest.approx(gaussian_nll(p[:, 0], y[:, 0], s[:, 0]))


@pytest.mark.parametrize('factor', [10.0, 0.1])
def test_miscalibrated_sigma_has_large_ece_and_worse_nll(factor):
    pred, target, sigma = gaussian_data()
    ece = regression_ece(pred, target, factor * sigma)
    assert ece > 0.3
    assert ece <= 0.5
    assert gaussian_nll(pred, target, factor * sigma) > gaussian_nll(pred, target, sigma) + 1.0


def test_ece_bound_when_no_interval_covers():
    # a tiny sigma covers no target: every coverage is 0, the ECE is the mean level 0.5
    assert regression_ece([0.0, 0.0], [1.0, -1.0], [1e-9, 1e-9]) == pytest.approx(0.5)


def test_spearman_of_a_monotone_transform_is_one():
    rng = np.random.default_rng(1)
    pred, target = rng.normal(size=500), rng.normal(size=500)
    err = np.abs(target - pred)
    corr = error_correlation(pred, target, np.exp(3 * err))
    assert corr['spearman'] == pytest.approx(1.0)
    assert 0.0 < corr['pearson'] < 0.99  # not linear
    assert error_correlation(pred, target, 2 * err + 1)['pearson'] == pytest.approx(1.0)
    unrelated = error_correlation(pred, target, rng.uniform(size=500))
    assert abs(unrelated['spearman']) < 0.15
    constant = error_correlation(pred, target, np.ones(500))
    assert math.isnan(constant['spearman']) and math.isnan(constant['pearson'])


def test_bins_partition_the_samples():
    # hand-built: uncertainty order 5,1,3,2,4,0 -> bins {5,1}, {3,0}, {4,2} by index
    s = np.array([5.0, 1.0, 3.0, 2.0, 4.0, 0.0])
    err = np.array([50.0, 10.0, 30.0, 20.0, 40.0, 0.0])
    rows = binned_by_uncertainty(np.zeros(6), err, s, num_bins=3)
    assert [r['count'] for r in rows] == [2, 2, 2]
    assert [r['uncertainty'] for r in rows] == [0.5, 2.5, 4.5]
    assert [r['abs_error'] for r in rows] == [5.0, 25.0, 45.0]

    rng = np.random.default_rng(2)
    pred, target, s = rng.normal(size=103), rng.normal(size=103), rng.exponential(size=103)
    rows = binned_by_uncertainty(pred, target, s, num_bins=5)
    counts = [r['count'] for r in rows]
    assert sum(counts) == 103 and max(counts) - min(counts) <= 1
    assert [r['bin'] for r in rows] == [1, 2, 3, 4, 5]
    means = [r['uncertainty'] for r in rows]
    assert means == sorted(means)
    total = sum(r['abs_error'] * r['count'] for r in rows)
    assert total == pytest.approx(np.abs(target - pred).sum())
    with pytest.raises(ValueError):
        binned_by_uncertainty(pred, target, s, num_bins=0)


def test_recalibration_recovers_a_known_scale():
    rng = np.random.default_rng(3)
    n = 20000
    s = rng.uniform(0.0, 2.0, size=n)
    pred = rng.normal(size=n)
    target = pred + (2.0 * s + 0.5) * rng.standard_normal(n)
    fit = fit_affine_sigma(pred, target, s)
    assert fit.a == pytest.approx(2.0, abs=0.1)
    assert fit.b == pytest.approx(0.5, abs=0.05)
    # the units of s do not matter: s in thousandths gives a slope 1000 times smaller
    fit_milli = fit_affine_sigma(pred, target, 1000 * s)
    assert fit_milli.a * 1000 == pytest.approx(fit.a, rel=1e-3)
    assert fit_milli.b == pytest.approx(fit.b, rel=1e-3)
    np.testing.assert_allclose(fit(s), fit.a * s + fit.b)
    # never worse than the best constant sigma
    rms = np.sqrt(np.mean((target - pred) ** 2))
    assert gaussian_nll(pred, target, fit(s)) <= gaussian_nll(pred, target, np.full(n, rms))


def test_recalibration_of_an_uninformative_uncertainty_is_a_constant():
    rng = np.random.default_rng(4)
    n = 5000
    pred = np.zeros(n)
    target = 3.0 * rng.standard_normal(n)
    fit = fit_affine_sigma(pred, target, rng.uniform(size=n))
    assert fit.a * 1.0 < 0.1 * fit.b  # the slope explains almost nothing
    assert fit.b == pytest.approx(3.0, rel=0.1)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match='same number of samples'):
        gaussian_nll(np.zeros(3), np.zeros(4), np.ones(3))
    with pytest.raises(ValueError, match='positive'):
        gaussian_nll(np.zeros(3), np.zeros(3), np.array([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match='positive'):
        regression_ece(np.zeros(3), np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match='one target per sample'):
        error_correlation(np.zeros((3, 2)), np.zeros((3, 2)), np.ones(3))
    with pytest.raises(ValueError, match='finite'):
        gaussian_nll(np.array([0.0, np.nan]), np.zeros(2), np.ones(2))
    with pytest.raises(ValueError, match='levels'):
        regression_ece(np.zeros(3), np.zeros(3), np.ones(3), levels=[0.5, 1.0])
    with pytest.raises(ValueError, match='non-negative'):
        fit_affine_sigma(np.zeros(3), np.ones(3), np.array([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match='non-negative'):
        AffineSigma(1.0, 0.1)(np.array([-1.0]))
    with pytest.raises(ValueError, match='errors are zero'):
        fit_affine_sigma(np.ones(3), np.ones(3), np.ones(3))


def test_predictive_moments():
    samples = [torch.tensor([[1.0], [0.0]]), torch.tensor([[3.0], [0.0]])]
    mean, std = predictive_moments(samples)
    assert torch.equal(mean, torch.tensor([[2.0], [0.0]], dtype=torch.float64))
    assert torch.equal(std, torch.tensor([[1.0], [0.0]], dtype=torch.float64))  # divisor P
    with pytest.raises(ValueError):
        predictive_moments([])
    with pytest.raises(ValueError):
        predictive_moments([torch.zeros(2, 1), torch.zeros(3, 1)])


def tiny_sets(num=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [Data(x=torch.randn(n, 4, generator=g), y=torch.randn(1, 1, generator=g))
            for n in (3, 5, 1, 4, 2, 6)[:num]]


def tiny_mz(dropout):
    torch.manual_seed(0)
    return build_model('mz', 4, 1, dim=16, heads=2, d_ff=16, num_inducing=4,
                       num_generators=2, num_matrix_generators=1, dropout=dropout)


def test_mc_dropout_without_dropout_is_the_deterministic_prediction():
    data = tiny_sets()
    model = tiny_mz(dropout=0.0).eval()
    norm = TargetNormalizer().fit(torch.tensor([[1.0], [3.0]]))
    with pytest.warns(UserWarning, match='every pass gave the same predictions'):
        mean, std = mc_dropout_predict(model, data, passes=3, normalizer=norm, batch_size=4)
    pred, _ = predict(model, data, normalizer=norm, batch_size=4, device='cpu')
    assert mean.shape == (6, 1) and std.shape == (6, 1)
    torch.testing.assert_close(mean, pred.to(torch.float64), atol=1e-5, rtol=1e-5)
    assert torch.all(std < 1e-5)
    assert not model.training  # mode restored


def test_mc_dropout_samples_and_is_reproducible():
    data = tiny_sets()
    model = tiny_mz(dropout=0.5).eval()
    state = torch.get_rng_state()
    mean, std = mc_dropout_predict(model, data, passes=8, seed=1)
    assert torch.equal(torch.get_rng_state(), state)  # global stream untouched
    assert torch.all(torch.isfinite(mean)) and std.max() > 0
    mean2, std2 = mc_dropout_predict(model, data, passes=8, seed=1)
    assert torch.equal(mean, mean2) and torch.equal(std, std2)
    assert not model.training
    with pytest.raises(ValueError):
        mc_dropout_predict(model, data, passes=0)
    with pytest.raises(ValueError, match='BatchNorm'):
        mc_dropout_predict(torch.nn.Sequential(torch.nn.BatchNorm1d(4)), data)


def test_mc_dropout_names_a_one_shot_stream_that_a_later_pass_finds_empty():
    # every pass reads the dataset again: a one-shot iterator gave the second pass nothing,
    # and torch.cat's "expected a non-empty list of Tensors"
    class OneShot(torch.utils.data.IterableDataset):
        def __init__(self, sets):
            self.sets = iter(sets)

        def __iter__(self):
            return self.sets

    model = tiny_mz(dropout=0.5)
    with pytest.raises(ValueError, match='pass 2 of 3 got no sets .* one-shot iterator'):
        mc_dropout_predict(model, OneShot(tiny_sets()), passes=3)
    mean, _ = mc_dropout_predict(model, tiny_sets(), passes=3)  # (a list is read every pass)
    assert mean.shape[0] == len(tiny_sets())


def test_mc_dropout_names_a_stream_empty_from_the_start_an_empty_dataset():
    # no pass had read it before: it was said to be a one-shot iterator that an earlier pass
    # had read, where predict() says the dataset is empty
    class Empty(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([])

    with pytest.raises(ValueError, match=r'mc_dropout_predict\(\) got an empty dataset: there '
                                         r'is nothing to predict'):
        mc_dropout_predict(tiny_mz(dropout=0.5), Empty(), passes=3)


def test_mc_dropout_restores_every_modules_own_mode_and_ensembles_need_one_normaliser_each():
    # model.train(was) put a child frozen in eval back into training mode; a short list of
    # normalisers dropped the members behind it (zip), silently
    from torch_mz.uncertainty import method_predictions
    data = tiny_sets()
    model = tiny_mz(dropout=0.5).train()
    child = next(iter(model.children()))
    child.eval()
    mc_dropout_predict(model, data, passes=2)
    assert model.training and not child.training
    members = [tiny_mz(dropout=0.1) for _ in range(3)]
    norm = TargetNormalizer().fit(torch.tensor([[1.0], [3.0]]))
    with pytest.raises(ValueError, match=r'one normaliser per member \(got 1 for 3 members\)'):
        method_predictions(members, {'test': data}, passes=2, normalizers=[norm])


def test_target_normalizer_refuses_integer_targets_and_non_finite_fits():
    norm = TargetNormalizer().fit(torch.tensor([1., 2., 3., 4.]))
    with pytest.raises(ValueError, match='floating-point tensor of targets'):
        norm.transform(torch.tensor([1, 2, 3, 4]))  # (it rounded the statistics to integers)
    with pytest.raises(ValueError, match='floating-point tensor of targets'):
        norm.inverse_transform(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match='finite targets'):
        TargetNormalizer().fit(torch.tensor([1., float('nan'), 3.]))


def test_scaling_an_uncertainty_without_a_normaliser_is_refused():
    # (the uncertainty came back unscaled, silently)
    with pytest.raises(ValueError, match='scale_uncertainty=True .* there is none'):
        predict(tiny_mz(dropout=0.0), tiny_sets(), device='cpu', scale_uncertainty=True)


def test_uncertainty_methods_name_bad_input():
    from torch_mz.uncertainty import method_predictions
    deepsets = build_model('deepsets', 4, 1, hidden_channels=8)  # no uncertainty output
    with pytest.raises(ValueError, match='members that give an uncertainty'):
        method_predictions([deepsets, deepsets], {'test': tiny_sets()},
                           passes=2)  # (an IndexError)
    with pytest.raises(ValueError, match='empty dataset'):
        mc_dropout_predict(tiny_mz(dropout=0.1), [], passes=2)  # (torch.cat's error)


def test_uncertainty_arguments_that_gave_silent_results_are_refused():
    from torch_mz.uncertainty import interval_coverage
    pred, target, sigma = np.zeros(4), np.ones(4), np.ones(4)
    with pytest.raises(ValueError, match='open interval'):
        interval_coverage(pred, target, sigma, levels=[float('nan')])  # (a NaN ECE)
    with pytest.raises(ValueError, match='open interval'):
        interval_coverage(pred, target, sigma, levels=1.5)  # (a TypeError in the message)
    for bins in (2.5, True):  # (2 bins; 1 bin)
        with pytest.raises(ValueError, match='num_bins'):
            binned_by_uncertainty(pred, target, sigma, num_bins=bins)
    with pytest.raises(ValueError, match='a >= 0 and b > 0'):
        AffineSigma(a=-1.0, b=0.0)  # (negative sigmas)


def test_mc_dropout_seeds_only_the_device_it_runs_on(monkeypatch):
    # torch.manual_seed also seeded every CUDA device (queued where CUDA had not started),
    # which fork_rng restored only for the device given: later GPU draws were seeded by this
    # call. The CPU stream is the one torch.manual_seed(seed) gives, as before
    data = tiny_sets()
    model = tiny_mz(dropout=0.5).eval()
    seeded = []
    monkeypatch.setattr(torch.cuda, 'manual_seed_all', lambda seed: seeded.append(seed))
    monkeypatch.setattr(torch.cuda, 'manual_seed', lambda seed: seeded.append(seed))
    mean, _ = mc_dropout_predict(model, data, passes=3, seed=7)
    assert seeded == []
    monkeypatch.undo()
    from torch_geometric.loader import DataLoader
    runs = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(7)  # the seeding before: the same masks
        model.train()
        for _ in range(3):
            runs.append(torch.cat([model(b)[0] for b in DataLoader(data, batch_size=128)]))
        model.eval()
    torch.testing.assert_close(mean, torch.stack(runs).double().mean(0))


@pytest.mark.parametrize('call, match', [
    (lambda m, d: mc_dropout_predict(m, d[0]), r'for a single set pass \[data\]'),
    (lambda m, d: mc_dropout_predict(m, d, passes=2.5), "'passes' must be an integer"),
    (lambda m, d: mc_dropout_predict(torch.nn.Sequential(
        torch.nn.InstanceNorm1d(4, track_running_stats=True)), d), 'InstanceNorm1d'),
])
def test_mc_dropout_names_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call(tiny_mz(dropout=0.5), tiny_sets())


def test_method_predictions_refuses_several_targets():
    # the first column was kept and the others dropped, silently
    from torch_mz.uncertainty import method_predictions
    torch.manual_seed(0)
    model = build_model('mz', 4, 3, dim=16, heads=2, d_ff=16, num_inducing=4,
                        num_generators=2, num_matrix_generators=1, dropout=0.1)
    with pytest.raises(ValueError, match='single-target regression \\(got 3 outputs'):
        method_predictions([model, model], {'test': tiny_sets()}, passes=2)


def test_method_predictions_refuses_an_ensemble_of_one_member():
    # the Deep Ensemble's spread was exactly zero, without a word
    from torch_mz.uncertainty import method_predictions
    with pytest.raises(ValueError, match=r'at least 2 independently trained members .*got 1\)'):
        method_predictions([tiny_mz(dropout=0.1)], {'test': tiny_sets()}, passes=2)


def test_mc_dropout_refuses_a_single_pass():
    # one pass has a spread of exactly zero, returned without a word (no warning either)
    from torch_mz.uncertainty import method_predictions
    model = tiny_mz(dropout=0.5)
    with pytest.raises(ValueError, match='at least 2 passes .*pass passes=2 or more'):
        mc_dropout_predict(model, tiny_sets(), passes=1)
    with pytest.raises(ValueError, match='at least 2 passes'):
        method_predictions([model, tiny_mz(dropout=0.1)], {'test': tiny_sets()}, passes=1)


def test_method_predictions_warns_when_an_uncertainty_is_identically_zero():
    # the same model twice (an ensemble spread of 0) and a member 0 without generators (an IHW
    # of 0) gave NaN correlations and a constant fitted sigma, silently
    import warnings

    from torch_mz.uncertainty import method_predictions
    data = {'test': tiny_sets()}
    mz = tiny_mz(dropout=0.1)
    with pytest.warns(UserWarning, match="every member gave the same predictions on 'test'"):
        out = method_predictions([mz, mz], data, passes=2)
    assert np.all(out['Deep Ensemble']['test'][1] == 0)
    torch.manual_seed(1)
    rigid = build_model('rigid', 4, 1, dim=16, heads=2, d_ff=16, num_inducing=4, dropout=0.1)
    with pytest.warns(UserWarning, match="interval-hull width is zero .* no generators"):
        out = method_predictions([rigid, mz], data, passes=2)
    assert np.all(out['MZAttn (IHW)']['test'][1] == 0)
    torch.manual_seed(2)
    other = build_model('mz', 4, 1, dim=16, heads=2, d_ff=16, num_inducing=4,
                        num_generators=2, num_matrix_generators=1, dropout=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # distinct members with generators: no warning
        out = method_predictions([mz, other], data, passes=2)
    assert all(np.all(out[m]['test'][1] > 0) for m in out)


def test_method_predictions_refuses_members_in_different_units():
    # a member that carries its normaliser (target units) and one without (standardised
    # values) were averaged into a mean and spread of neither
    from torch_mz.train.normalize import attach_normalizer
    from torch_mz.uncertainty import method_predictions
    data = {'test': tiny_sets()}
    norm = TargetNormalizer().fit(torch.tensor([[100.0], [120.0]]))
    carrying = attach_normalizer(tiny_mz(dropout=0.1), norm)
    torch.manual_seed(1)
    bare = build_model('mz', 4, 1, dim=16, heads=2, d_ff=16, num_inducing=4,
                       num_generators=2, num_matrix_generators=1, dropout=0.1)
    with pytest.raises(ValueError, match=r'member 0 predicts in target units .* member 1 '
                                         r'standardised values .*normalizers='):
        method_predictions([carrying, bare], data, passes=2)
    with pytest.raises(ValueError, match=r'member 1 predicts in target units .* member 0 '):
        method_predictions([bare, bare], data, passes=2, normalizers=[None, norm])
    # given the bare member's normaliser, both are in target units: accepted
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        out = method_predictions([carrying, bare], data, passes=2, normalizers=[None, norm])
    mean, spread = out['Deep Ensemble']['test']
    assert np.all((mean > 90) & (mean < 130)) and np.all(spread < 10)


@pytest.mark.parametrize('wrong', ['loader', 'batches'])
def test_mc_dropout_checks_its_input_as_predict_does(wrong):
    # a DataLoader gave "'DataLoader' object is not subscriptable", a list of Batch objects an
    # error about set ids; predict() explained both
    from torch_geometric.data import Batch
    from torch_geometric.loader import DataLoader
    data = tiny_sets()
    model = tiny_mz(dropout=0.5)
    loader = DataLoader(data, batch_size=4)
    dataset = loader if wrong == 'loader' else list(loader)
    messages = []
    for call in (predict, mc_dropout_predict):
        with pytest.raises(ValueError) as err:
            call(model, dataset)
        messages.append(str(err.value))
    assert messages[0].startswith('predict() takes ')
    assert messages[1] == messages[0].replace('predict()', 'mc_dropout_predict()', 1)
    # one Batch is still taken as its sets
    whole = mc_dropout_predict(model, Batch.from_data_list(data), passes=2)
    assert all(torch.equal(a, b) for a, b in zip(whole, mc_dropout_predict(model, data, passes=2)))


def test_uncertainty_of_a_classifier():
    # method_predictions told a classifier to "train one model per target"; mc_dropout_predict
    # averages its raw logits, which its docstring now says
    from torch_mz.uncertainty import method_predictions
    torch.manual_seed(0)
    clf = build_model('mz', 4, 3, dim=16, heads=2, d_ff=16, num_inducing=4,
                      num_generators=2, num_matrix_generators=1, dropout=0.1)
    with pytest.raises(ValueError, match=r"single-target regression .* A classifier's outputs "
                                         r"are class logits"):
        method_predictions([clf, clf], {'test': tiny_sets()}, passes=2)
    doc = ' '.join(mc_dropout_predict.__doc__.split())
    assert "raw outputs" in doc and 'class logits, not of probabilities' in doc
    assert 'average the softmax of each' in doc


def test_binning_warns_where_a_boundary_splits_equal_uncertainties():
    # a constant uncertainty (an IHW of exactly 0) gave bins of errors 1.5, 3.5, 5.5, 7.5 by
    # sample order: a made-up trend
    import warnings
    from torch_mz.uncertainty import binned_by_uncertainty
    err = np.arange(1.0, 9.0)
    with pytest.warns(UserWarning, match='3 of the 3 bin boundaries split a run of equal'):
        rows = binned_by_uncertainty(np.zeros(8), err, np.zeros(8), num_bins=4)
    assert [r['abs_error'] for r in rows] == [1.5, 3.5, 5.5, 7.5]  # the documented rule kept
    with warnings.catch_warnings():  # ties inside a bin, or none: no warning
        warnings.simplefilter('error')
        binned_by_uncertainty(np.zeros(8), err, np.repeat([0.0, 1.0, 2.0, 3.0], 2), num_bins=4)
        binned_by_uncertainty(np.zeros(8), err, np.arange(8.0), num_bins=4)


def test_mc_dropout_on_mps_seeds_its_generator_and_puts_the_model_back(monkeypatch):
    # the passes seeded the CPU's generator (and CUDA's) only: on MPS the masks were drawn from
    # its own, unseeded, generator and advanced the caller's stream; the model stayed on MPS
    from tests.train._common import fake_device
    data = tiny_sets()
    model = tiny_mz(dropout=0.5).eval()
    expected, _ = mc_dropout_predict(model, data, passes=3, seed=7)
    calls = []
    monkeypatch.setattr(torch.mps, 'manual_seed', lambda seed: calls.append(('seed', seed)))
    monkeypatch.setattr(torch.mps, 'get_rng_state', lambda *a: calls.append('get') or 'state')
    monkeypatch.setattr(torch.mps, 'set_rng_state', lambda s, *a: calls.append(('set', s)))
    moves = fake_device(monkeypatch)  # (the passes run on the CPU: its generator seeded too)
    mean, _ = mc_dropout_predict(model, data, passes=3, seed=7, device='mps')
    assert calls == ['get', ('seed', 7), ('set', 'state')]
    assert [dev for m, dev in moves if m is model] == [torch.device('mps'), torch.device('cpu')]
    assert torch.equal(mean, expected) and not model.training


def test_mc_dropout_on_an_indexed_cpu_device_and_the_ensembles_leave_the_global_stream():
    # device='cpu:0' took the index for a CUDA device's (an AssertionError without CUDA), and
    # method_predictions advanced the caller's stream (its predict() calls' DataLoaders)
    from torch_mz.uncertainty import method_predictions
    data = tiny_sets()
    model = tiny_mz(dropout=0.5)
    mean, std = mc_dropout_predict(model, data, passes=3, seed=1)
    indexed = mc_dropout_predict(model, data, passes=3, seed=1, device='cpu:0')
    assert torch.equal(indexed[0], mean) and torch.equal(indexed[1], std)
    other = tiny_mz(dropout=0.1)
    with torch.no_grad():
        next(other.parameters()).add_(0.1)  # (another member than model)
    state = torch.get_rng_state()
    method_predictions([model, other], {'test': data}, passes=2)
    assert torch.equal(torch.get_rng_state(), state)


class _Reshuffled(torch.utils.data.IterableDataset):
    r"""A stream that gives its sets in another order (or fewer of them) on every read."""
    def __init__(self, sets, drop=False):
        self.sets, self.drop, self.reads = sets, drop, 0

    def __iter__(self):
        self.reads += 1
        order = torch.randperm(len(self.sets), generator=torch.Generator().manual_seed(self.reads))
        sets = [self.sets[i] for i in order]
        return iter(sets[:len(sets) - self.reads + 1] if self.drop else sets)


def test_mc_dropout_and_ensembles_refuse_a_stream_that_changes_between_reads():
    # a stream of fewer sets on a later pass ended in torch.stack's error; a reshuffled one was
    # averaged over the predictions of different sets, silently
    from torch_mz.uncertainty import method_predictions
    model = tiny_mz(dropout=0.5)
    with pytest.raises(ValueError, match=r'other sets on pass 2 of 3 than on pass 1 \(6 sets, '
                                         r'then 5\)'):
        mc_dropout_predict(model, _Reshuffled(tiny_sets(), drop=True), passes=3)
    with pytest.raises(ValueError, match=r'pass 2 of 3 than on pass 1 \(6 sets each time, of '
                                         r'other sizes or inputs, or in another order\)'):
        mc_dropout_predict(model, _Reshuffled(tiny_sets()), passes=3)
    with pytest.raises(ValueError, match='same sets in the same order'):
        method_predictions([model, tiny_mz(dropout=0.1)], {'test': _Reshuffled(tiny_sets())},
                           passes=2)
    with pytest.raises(ValueError, match=r"split 'test' than on its first \(5 sets, then 3\)"):
        method_predictions([model, tiny_mz(dropout=0.1)],
                           {'test': _Reshuffled(tiny_sets(), drop=True)}, passes=2)
    mean, _ = mc_dropout_predict(model, tiny_sets(), passes=3)  # (a list: the same every read)
    assert mean.shape == (6, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_mc_dropout_and_ensembles_take_sets_held_on_a_cuda_device():
    # the check that every read gives the same sets put a CUDA batch's sizes beside CPU sums:
    # torch.cat's device error for a dataset moved to the GPU
    from torch_mz.uncertainty import method_predictions
    model, other = tiny_mz(dropout=0.5), tiny_mz(dropout=0.1)
    data = [d.to('cuda') for d in tiny_sets()]
    mean, _ = mc_dropout_predict(model, data, passes=2, device='cuda')
    ref, _ = mc_dropout_predict(model, tiny_sets(), passes=2, device='cuda')
    assert torch.equal(mean, ref)
    out = method_predictions([model, other], {'test': data}, passes=2, device='cuda')
    assert out['MC-Dropout']['test'][0].shape == (6,)


def test_mc_dropout_and_ensembles_take_a_batch_of_empty_sets_alone():
    # a batch whose sets were all empty (batch_size=1 and one empty set) failed in the check
    # that every read gives the same sets: "cannot reshape tensor of 0 elements"
    from torch_mz.uncertainty import method_predictions
    data = tiny_sets()
    data.insert(2, Data(x=torch.zeros(0, 4), y=torch.zeros(1, 1)))
    model, other = tiny_mz(dropout=0.5), tiny_mz(dropout=0.1)
    with torch.no_grad():
        next(other.parameters()).add_(0.1)  # (another member than model)
    norm = TargetNormalizer().fit(torch.tensor([[1.0], [3.0]]))
    mean, std = mc_dropout_predict(model, data, passes=3, normalizer=norm, batch_size=1)
    assert mean[2].item() == 2.0 and std[2].item() == 0.0  # the target mean, no spread
    assert torch.all(std[[0, 1, 3, 4, 5, 6]] > 0)
    out = method_predictions([model, other], {'test': data}, passes=2, batch_size=1,
                             normalizers=[norm, norm])
    assert all(out[m]['test'][0][2] == 2.0 and out[m]['test'][1][2] == 0.0 for m in out)
