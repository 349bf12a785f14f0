r"""The verdict logic of the synthetic studies in ``benchmarks/`` on hand-built results (the
real-data scripts are tested in ``test_benchmarks_real.py``)."""
import os
import runpy
import sys

import numpy as np
import pytest

from tests.test_benchmarks_real import load_script


def uncertainty_run(spearman, boot=None):
    methods = {m: dict(spearman=v) for m, v in spearman.items()}
    return dict(methods=methods, bootstrap=boot or {})


def test_uncertainty_ordering_and_resolution():
    study = load_script('uncertainty')
    ihw, mc, ens = study.METHODS
    # Several study seeds: the standard error is over seeds.
    runs = [uncertainty_run({ihw: 0.50, mc: 0.30, ens: 0.29}),
            uncertainty_run({ihw: 0.52, mc: 0.32, ens: 0.33})]
    g, se = study.gap(runs, ihw, mc, 'spearman')
    assert g == pytest.approx(0.20) and se == pytest.approx(0.0)
    names, text, resolved = study.ordering(runs, 'spearman', higher_is_better=True)
    assert names[0] == ihw
    assert resolved[0] is True  # 0.20 apart in both seeds
    assert resolved[1] is False  # MC-Dropout and the ensemble swap places between the seeds
    assert 'not resolved' in text
    # One seed: the standard error comes from the paired bootstrap.
    boot = {ihw: {'spearman': [0.5, 0.6, 0.4]}, mc: {'spearman': [0.4, 0.2, 0.6]},
            ens: {'spearman': [0.1, -0.1, 0.3]}}  # moves with MC-Dropout: a tight gap
    one = [uncertainty_run({ihw: 0.5, mc: 0.4, ens: 0.1}, boot)]
    g, se = study.gap(one, ihw, mc, 'spearman')
    assert g == pytest.approx(0.1)
    assert se == pytest.approx(np.std([0.1, 0.4, -0.2]))
    names, _, resolved = study.ordering(one, 'spearman', higher_is_better=True)
    assert names == [ihw, mc, ens] and resolved == [False, True]


def test_equivariance_winner_uses_the_paper_table():
    study = load_script('equivariance')
    row = {'cell': 'quad L=8', 'mz r2': 0.5, 'st-large r2': 0.6, 'egnn r2': 0.0}
    assert study.verdict(row) == ('st-large', 'mz')
    row = {'cell': 'CN d=8', 'mz r2': 0.1, 'st-large r2': 0.0, 'egnn r2': 0.9}
    assert study.verdict(row) == ('egnn', 'egnn')
    # Within twice the seed spread: a tie, which agrees with the paper if it includes its best.
    row = {'cell': 'rot d=8', 'mz r2': -0.004, 'mz r2 std': 0.006, 'st-large r2': -0.002,
           'st-large r2 std': 0.005, 'egnn r2': -0.009, 'egnn r2 std': 0.010}
    ours, paper = study.verdict(row)
    assert ours == 'tie: st-large/mz/egnn' and paper == 'egnn'
    assert study.agrees(ours, paper) and not study.agrees('mz', paper)
    row = dict(row, **{'egnn r2': -0.5})
    assert study.verdict(row)[0] == 'tie: st-large/mz'
    assert not study.agrees(study.verdict(row)[0], 'egnn')
    assert study.PAPER[('MEB d=32', 'egnn')] == 0.78 and len(study.PAPER) == 3 * len(study.CELLS)


BENCHMARKS = os.path.join(os.path.dirname(__file__), '..', 'benchmarks')


@pytest.mark.parametrize('script', sorted(f[:-3] for f in os.listdir(BENCHMARKS)
                                          if f.endswith('.py')))
def test_every_script_prints_its_help(script, capsys):
    r"""``--help`` of every benchmark script works (a stray ``%`` in a help string breaks it)."""
    path = os.path.join(BENCHMARKS, f'{script}.py')
    argv = sys.argv
    sys.argv = [path, '--help']
    try:
        with pytest.raises(SystemExit) as exit_:
            runpy.run_path(path, run_name='__main__')
    finally:
        sys.argv = argv
    assert exit_.value.code == 0
    assert 'usage:' in capsys.readouterr().out
