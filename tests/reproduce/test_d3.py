import math

import pytest

from torch_mz.reproduce import CLAIMS, Budget, Claim, Reproduction
from torch_mz.reproduce import d3_records
from torch_mz.uncertainty import METHODS

from tests.reproduce._common import SUM, _counting


def test_d3_scores_the_kept_members_and_resumes(tmp_path, monkeypatch):
    # a tiny Appendix D.3: 2 study seeds x 2 members of a small MZ model on a sum task
    spec = 'mz:dim=8,num_inducing=2,d_ff=8'
    claim = Claim('d3', 'tiny D.3', (SUM, ), (spec, ), CLAIMS['d3'].comparisons, members=2,
                  evaluate=d3_records, keep_weights=CLAIMS['d3'].keep_weights)
    assert claim.keep_weights
    out = str(tmp_path)
    budget = Budget('tiny', 16, 8, 8, (16, 8, 8), 2, 1, None, 1, 8, ((1e-3, 1e-5), ))
    records, runs = Reproduction(budget, out, device='cpu', sweep_cells={'sum': SUM}).run(claim)
    assert len(runs) == 4 and sorted(r['seed'] for r in runs) == [0, 1, 2, 3]
    assert len(list(tmp_path.rglob('runs/tiny/weights/*.pt'))) == 4  # every member kept
    assert len(records) == len(claim.comparisons)
    for r, c in zip(records, claim.comparisons):
        metric, a, b = c.b
        methods = r['ours']['methods']
        assert set(methods) == set(METHODS) and r['ours']['seeds'] == 2
        assert all(math.isfinite(methods[m][k]) for m in METHODS for k in methods[m])
        assert 0.0 <= methods[a]['ece'] <= 0.5 and -1.0 <= methods[a]['spearman'] <= 1.0
        assert r['verdict'] in ('reproduced', 'direction only', 'not reproduced', 'inconclusive')
    # the difference is of the two methods' metric, per seed (its mean over seeds of a
    # difference equals the difference of the means)
    first = records[0]
    m = first['ours']['methods']
    metric, a, b = claim.comparisons[0].b
    assert first['ours']['mean'] == pytest.approx(m[a][metric] - m[b][metric])
    # the members' spread of test R² is the sample standard deviation (ddof 1), as elsewhere
    import statistics
    assert first['ours']['models'][spec]['r2_std'] == pytest.approx(
        statistics.stdev([r['test']['r2'] for r in runs]))

    # read back: nothing trained, the same records (MC-Dropout masks are seeded)
    calls = _counting(monkeypatch)
    again, _ = Reproduction(budget, out, device='cpu', sweep_cells={'sum': SUM}).run(claim)
    assert calls == [] and again == records

    # every member's weights are kept with the results too (weights/, committed), one file
    # beside each run's record
    kept = sorted(tmp_path.rglob('weights/tiny/**/*.pt'))
    records_files = sorted(tmp_path.rglob('records/tiny/**/*.json'))
    assert len(kept) == 4
    assert {k.stem for k in kept} <= {r.stem for r in records_files}

    # a member whose weights are lost (a clone without the untracked runs/, before they were
    # kept) is trained again, its file replaced, and its study seed scored as before
    import os
    repro = Reproduction(budget, out, device='cpu', sweep_cells={'sum': SUM})
    repro.sweep('sum', claim.models)
    cell = repro.sized(SUM)
    config = repro.base_config('sum')
    for _ in range(2):  # the committed copy, then the one in runs/
        gone = repro.store.weights(cell, spec, 3, config)
        assert gone is not None
        os.remove(gone)
    assert repro.store.weights(cell, spec, 3, config) is None
    stage = repro.status(claim)[-1]
    assert (stage['done'], stage['pending'], stage['again']) == (3, 1, 1)
    assert stage['left_s'] > 0
    redone, runs = repro.run(claim)
    assert [c[3] for c in calls] == [3]
    assert repro.store.weights(cell, spec, 3, config) is not None
    assert len(list(tmp_path.rglob('weights/tiny/**/*.pt'))) == 4
    assert redone[0]['ours']['seeds'] == 2
    assert [r['ours']['mean'] for r in redone] == pytest.approx(
        [r['ours']['mean'] for r in records], abs=1e-6)  # (this tiny run is deterministic)

    # scored without a member's weights (d3_records alone), its study seed is left out
    for _ in range(2):
        os.remove(repro.store.weights(cell, spec, 3, config))
    fewer = d3_records(repro, claim, runs, 2, {})
    assert fewer[0]['ours']['seeds'] == 1 and 'seeds [3]' in fewer[0]['ours']['note']
    assert fewer[0]['verdict'] == 'inconclusive'


def test_d3_epochs_leave_diverged_members_out_of_those_stopped_early(tmp_path):
    # d3's records counted every run marked stopped early, diverged ones too (a record stored
    # before 2026-12-04 marks a diverged run so), and gave no count of those that diverged,
    # as the other claims' records do
    spec = 'mz:dim=8,num_inducing=2,d_ff=8'
    claim = Claim('d3', 'tiny D.3', (SUM, ), (spec, ), CLAIMS['d3'].comparisons[:1], members=2,
                  evaluate=d3_records, keep_weights=True)
    budget = Budget('tiny', 16, 8, 8, (16, 8, 8), 1, 1, None, 1, 8, ((1e-3, 1e-5), ))
    repro = Reproduction(budget, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    records, runs = repro.run(claim)
    assert len(runs) == 2 and records[0]['epochs_run'].get('diverged', 0) == 0
    # (the second as stopped before a cap of 2 epochs: stopped on its last epoch, at the cap
    # of 1, it ran every epoch and counts at the cap)
    key = runs[1]['key']
    marked = [dict(runs[0], stopped_early=True, diverged='non-finite loss'),
              dict(runs[1], stopped_early=True, key=dict(key, config=dict(key['config'],
                                                                          epochs=2)))]
    epochs = d3_records(repro, claim, marked, 1, {})[0]['epochs_run']
    assert (epochs['stopped_early'], epochs.get('diverged'), epochs['runs']) == (1, 1, 2)


def test_d3_leaves_a_diverged_member_out_and_reads_inconclusive(tmp_path, monkeypatch):
    # a member whose run diverged (no test figures) keeps the weights of its best epoch before
    # the divergence: they were scored as a trained member, its study seed counted, the
    # verdicts given as if no run were missing, and the record did not say so
    import torch_mz.study.grid as grid
    from torch_mz.train import TrainingDiverged
    spec = 'mz:dim=8,num_inducing=2,d_ff=8'
    claim = Claim('d3', 'tiny D.3', (SUM, ), (spec, ), CLAIMS['d3'].comparisons, members=2,
                  evaluate=d3_records, keep_weights=True)
    budget = Budget('tiny', 16, 8, 8, (16, 8, 8), 3, 2, None, 1, 8, ((1e-3, 1e-5), ))
    real = grid.train_one

    def diverging(task, name, seed, config, **options):
        trained = real(task, name, seed, config, **options)  # best.pt written, as by the
        if seed == 5:  # epochs before a divergence
            raise TrainingDiverged(trained['epochs_run'] - 1, math.nan)
        return trained
    monkeypatch.setattr(grid, 'train_one', diverging)
    repro = Reproduction(budget, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    records, runs = repro.run(claim)
    assert [r['seed'] for r in runs if 'diverged' in r] == [5]
    assert repro.store.weights(repro.sized(SUM), spec, 5, repro.base_config('sum')) is not None
    for r in records:
        # study seeds 0 and 1 scored, 2 left out: rule 1 reads a missing run inconclusive
        assert r['ours']['seeds'] == 2 and r['seeds'] == 3
        assert 'seeds [5] diverged' in r['ours']['note']
        assert r['verdict'] == 'inconclusive'
        assert r['ours']['models'][spec]['seeds'] == 4
        assert math.isfinite(r['ours']['models'][spec]['r2'])
    # the same study seed left out for a member without weights (not diverged): the same
    # figures, and inconclusive too, though two study seeds are left (rule 1, not 'seeds < 2')
    import os
    for _ in range(2):  # the committed copy, then the one in runs/
        os.remove(repro.store.weights(repro.sized(SUM), spec, 5, repro.base_config('sum')))
    kept = [{k: v for k, v in r.items() if k != 'diverged'} for r in runs]
    lost = d3_records(repro, claim, kept, 3, {})
    for r, before in zip(lost, records):
        assert 'no best-validation weights for seeds [5]' in r['ours']['note']
        assert r['ours']['mean'] == pytest.approx(before['ours']['mean'])
        assert (r['ours']['seeds'], r['verdict']) == (2, 'inconclusive')
