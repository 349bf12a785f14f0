import math

import numpy as np
import pytest

from torch_mz.study.statistics import (Lead, lead_over_best, mean_std, paired_gap,
                                       resolved_ordering, winner)


def test_paired_gap_over_seeds_and_from_the_bootstrap():
    # several seeds: mean paired difference, standard error = sample std / sqrt(n)
    g, se = paired_gap([0.5, 0.52, 0.58], [0.3, 0.32, 0.3])
    d = np.array([0.2, 0.2, 0.28])
    assert g == pytest.approx(d.mean()) and se == pytest.approx(d.std(ddof=1) / np.sqrt(3))
    # one seed: the spread of the paired bootstrap differences (NaN resamples ignored)
    g, se = paired_gap([0.5], [0.4], [0.5, 0.6, 0.4, np.nan], [0.4, 0.2, 0.6, 0.1])
    assert g == pytest.approx(0.1) and se == pytest.approx(np.std([0.1, 0.4, -0.2]))
    with pytest.raises(ValueError, match='bootstrap'):
        paired_gap([0.5], [0.4])
    assert mean_std([1.0, 3.0]) == (2.0, 1.0)


def test_resolved_ordering():
    # two seeds: a leads clearly in both; b and c swap places between the seeds
    order = resolved_ordering({'b': [0.30, 0.32], 'a': [0.50, 0.52], 'c': [0.29, 0.35]},
                              higher_is_better=True)
    assert order.names == ['a', 'c', 'b']
    assert order.gaps == pytest.approx([0.19, 0.01])
    assert order.errors == pytest.approx([0.02, 0.02])
    assert order.resolved == [True, False]
    # lower is better; one seed: standard errors from the bootstrap resamples
    order = resolved_ordering({'x': [0.2], 'y': [0.1]},
                              bootstrap={'x': [0.2, 0.3, 0.1], 'y': [0.1, 0.1, 0.1]})
    assert order.names == ['y', 'x'] and order.gaps == pytest.approx([0.1])
    assert order.errors == pytest.approx([np.std([0.1, 0.2, 0.0])])  # 0.082: 0.1 < 2 x 0.082
    assert order.resolved == [False]
    assert resolved_ordering({'x': [0.2], 'y': [0.1]}, {'x': [0.2] * 3, 'y': [0.1] * 3},
                             z=1.0).resolved == [True]


def test_winner_and_ties():
    assert winner({'a': 0.5, 'b': 0.6, 'c': 0.0}) == ['b']
    # within twice the larger spread of the best two: a tie, ranked by mean
    assert winner({'a': -0.004, 'b': -0.002, 'c': -0.009},
                  {'a': 0.006, 'b': 0.005, 'c': 0.010}) == ['b', 'a', 'c']
    assert winner({'a': -0.004, 'b': -0.002, 'c': -0.5},
                  {'a': 0.006, 'b': 0.005, 'c': 0.010}) == ['b', 'a']
    assert winner({'a': 0.3, 'b': 0.3}) == ['a']  # an exact tie without spread: the first
    assert winner({'only': 1.0}) == ['only']


def test_lead_over_best():
    means = {'mz': 0.70, 'rigid': 0.60, 'st-large': 0.72, 'egnn': 0.99}
    lead = lead_over_best(means, 'mz', ('rigid', 'st-large'), {'mz': 0.01, 'st-large': 0.03})
    assert lead.best == 'st-large' and lead.gap == pytest.approx(-0.02) and lead.spread == 0.03
    assert lead_over_best(means, 'mz', ('rigid', )) == Lead('rigid', pytest.approx(0.1), 0.0)
    assert lead_over_best(means, 'mz', ('perceiver', )) is None  # no rival measured
    assert lead_over_best({'rigid': 0.5}, 'mz', ('rigid', )) is None  # no mz


def test_paired_statistics_refuse_unpaired_values_and_winner_ranks_nan_last():
    # one seed against three was broadcast (a gap with a standard error from nothing), a NaN
    # mean (a missing figure) could win by dict order
    from torch_mz.study.statistics import resolved_ordering, winner
    with pytest.raises(ValueError, match=r'one value per seed on both sides, paired \(got 3 '
                       r'and 1\)'):
        paired_gap([1., 2., 3.], [0.5])
    with pytest.raises(ValueError, match='got 1 and 3'):  # (b ranks first)
        resolved_ordering({'a': [1., 2., 3.], 'b': [0.5]})
    with pytest.raises(ValueError, match=r'paired bootstrap resamples \(got 3 and 1\)'):
        paired_gap([1.], [0.], [1., 2., 3.], [0.])
    with pytest.raises(ValueError, match='got 0 and 0'):
        paired_gap([], [])
    nan = float('nan')
    assert winner({'a': nan, 'b': 0.9, 'c': 0.5}) == winner({'b': 0.9, 'a': nan, 'c': 0.5}) == ['b']
    assert winner({'a': nan}) == ['a']
    with pytest.raises(ValueError, match='at least one entry'):
        winner({})


def test_study_helpers_name_bad_arguments():
    from torch_mz.study import run_grid
    from torch_mz.study.report import summarize
    for seeds in (0, -1, 1.5):  # (an IndexError, after the grid's checks)
        with pytest.raises(ValueError, match="'seeds' must be an integer >= 1"):
            run_grid([dict(label='max', task='max')], ['deepsets'], seeds, None)
    with pytest.raises(ValueError, match="task_type among .* 'classifcation'"):
        summarize([], 'classifcation')  # (a bare KeyError)


def test_lead_over_best_refuses_a_string_of_rivals():
    with pytest.raises(ValueError, match="collection of model names"):
        lead_over_best({'mz': 0.7, 'ab': 0.8}, 'mz', 'ab')  # (read as {'a', 'b'}: no rival)


def test_lead_over_best_passes_over_a_nan_rival_and_paired_gap_wants_vectors():
    nan = float('nan')
    for means in ({'mz': .7, 'a': nan, 'b': .5}, {'mz': .7, 'b': .5, 'a': nan}):
        lead = lead_over_best(means, 'mz', ['a', 'b'])
        assert lead.best == 'b' and lead.gap == pytest.approx(0.2)
    with pytest.raises(ValueError, match='one value per seed'):
        paired_gap([[1.], [2.], [3.]], [0., 1., 1.])  # (a column broadcast to 3 x 3)


def test_resolved_ordering_ranks_a_nan_mean_last_whatever_the_order_given():
    # a NaN key made Python's sort depend on the entries' order: c (0.75) below a (0.55)
    for values in ({'a': [.5, .6], 'b': [np.nan, .9], 'c': [.7, .8]},
                   {'b': [np.nan, .9], 'c': [.7, .8], 'a': [.5, .6]}):
        assert resolved_ordering(values, higher_is_better=True).names == ['c', 'a', 'b']
        assert resolved_ordering(values).names == ['a', 'c', 'b']


def test_a_nan_spread_of_a_finite_mean_is_refused_in_either_order():
    # Python's max with a NaN: ['a'] with the NaN on the best, ['a', 'b'] with it on the
    # runner-up; Lead.spread NaN one way round and 0.2 the other
    nan = float('nan')
    means = {'a': 1.0, 'b': 0.9}
    for spreads in ({'a': nan, 'b': 0.2}, {'a': 0.2, 'b': nan}):
        with pytest.raises(ValueError, match='spread of .* is NaN while its mean is'):
            winner(means, spreads)
        with pytest.raises(ValueError, match='spread of .* is NaN while its mean is'):
            lead_over_best(means, 'a', ['b'], spreads)
    # a NaN spread beside a NaN mean (a model whose every run diverged) is no figure at all
    assert winner({'a': nan, 'b': 0.9}, {'a': nan, 'b': 0.2}) == ['b']
    for model, rival in (('a', 'b'), ('b', 'a')):
        means = {model: nan, rival: 0.9}
        lead = lead_over_best(means, model, [rival], {model: nan, rival: 0.2})
        assert lead.best == rival and math.isnan(lead.gap) and math.isnan(lead.spread)
        lead = lead_over_best({model: 0.9, rival: nan}, model, [rival], {model: 0.2, rival: nan})
        assert lead.best == rival and math.isnan(lead.spread)  # (was 0.2)
