import json
import math
import os
import shutil
from dataclasses import replace

import pytest

import torch_mz.reproduce as reproduce
import torch_mz.study.grid as grid
from torch_mz.reproduce import BUDGETS, CLAIMS, Reproduction

from tests.reproduce._common import TINY, SUM, CLAIM, MAX, CLAIM2, _counting, _child_while_held


def test_sweep_gives_every_model_the_same_grid(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    repro = Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    chosen = repro.sweep('sum', CLAIM.models)
    for model in CLAIM.models:
        tried = [(lr, wd) for _, _, name, seed, lr, wd in calls if name == model.split(':')[0]]
        assert tried == list(TINY.sweep)  # the identical grid, seed 0 only
        assert chosen[model] in TINY.sweep
    assert {c[3] for c in calls} == {0}
    # the choice is the lowest validation loss of the model's sweep runs
    records = [json.loads(p.read_text()) for p in tmp_path.rglob('records/tiny/**/*.json')]
    for model in CLAIM.models:
        runs = [r for r in records if r['model'] == model]
        best = min(runs, key=lambda r: r['val']['loss'])['key']['config']
        assert chosen[model] == (best['lr'], best['weight_decay'])


def test_interrupted_reproduction_resumes_and_a_second_run_trains_nothing(tmp_path,
                                                                          monkeypatch):
    calls = _counting(monkeypatch)
    out = str(tmp_path)
    records, runs = Reproduction(TINY, out, device='cpu', sweep_cells={'sum': SUM}).run(CLAIM)
    # 3 sweep points x 2 models on the sweep cell (seed 0 of the chosen point is reused on
    # that cell), then 2 cells x 2 models x 2 seeds
    assert len(calls) == 3 * 2 + 2 * 2 * 2 - 2
    assert len(runs) == 8 and records[0]['ours']['seeds'] == 2
    # no patience: every run trained the budget's every epoch, which the record says per model
    assert records[0]['epochs_run']['at_cap'] == {m: 2 for m in CLAIM.models}
    assert records[0]['verdict'] in ('reproduced', 'direction only', 'not reproduced',
                                     'inconclusive')
    files = sorted(tmp_path.rglob('records/tiny/**/*.json'))
    assert len(files) == len(calls)
    assert not any(tmp_path.rglob('runs/tiny/*/checkpoint.pt'))  # removed when finished

    # a second invocation trains nothing and builds no data (a progress bar is not part of
    # what identifies a run)
    calls.clear()
    loads = []
    again, runs2 = Reproduction(TINY, out, device='cpu', sweep_cells={'sum': SUM},
                                load=lambda *a, **k: loads.append(a), progress=True).run(CLAIM)
    assert calls == [] and loads == []
    assert again == records

    # an interrupted one (one run's file lost) trains exactly that run
    lost = next(p for p in files if '_s1_' in p.name)
    lost.unlink()
    again, _ = Reproduction(TINY, out, device='cpu', sweep_cells={'sum': SUM}).run(CLAIM)
    assert len(calls) == 1 and calls[0][3] == 1
    assert lost.exists()


def test_a_fixed_protocol_trains_every_model_there_without_a_sweep(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    fixed = replace(CLAIM, name='fixed', protocol=(2e-3, 0.05))
    repro = Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    # before training: no sweep stage, every run of the claim pending at the fixed point
    stages = repro.status(fixed)
    assert [s['stage'] for s in stages] == ['fixed runs on sum']
    assert stages[0]['pending'] == 2 * 2 * 2 and stages[0]['unknown'] == 0
    records, runs = repro.run(fixed)
    # 2 cells x 2 models x 2 seeds, all at the fixed point: no sweep run at all
    assert len(calls) == 2 * 2 * 2
    assert {(lr, wd) for *_, lr, wd in calls} == {(2e-3, 0.05)}
    assert all(r['key']['config']['lr'] == 2e-3 for r in runs)
    assert records[0]['sweep'] == {f'{m} on sum': dict(lr=2e-3, weight_decay=0.05, fixed=True)
                                   for m in CLAIM.models}
    assert repro.status(fixed)[0]['done'] == 8
    rows = repro.finished_runs(fixed)
    assert len(rows) == 8 and {(r['lr'], r['weight_decay']) for r in rows} == {(2e-3, 0.05)}
    # the same claim with the sweep trains the whole grid on top (the fixed runs are not its
    # points)
    calls.clear()
    repro.run(CLAIM)
    assert calls and {(lr, wd) for *_, lr, wd in calls} == set(TINY.sweep)


def test_a_protocol_claim_takes_the_papers_batch_on_geometric_tasks(tmp_path):
    r"""A claim at the paper's fixed protocol trains geometric tasks (MEB) with the paper's
    batch of 256, as the ``paper`` budget does; the same task swept, and a protocol claim on
    another task, keep the budget's batch."""
    repro = Reproduction(BUDGETS['converged'], str(tmp_path), device='cpu')
    base = repro.base_config('meb-radius').batch_size
    assert base == 128
    fixed = repro.claim_config(CLAIMS['table3-protocol'], 'meb-radius', 1e-4, 1e-5)
    assert (fixed.batch_size, fixed.lr, fixed.weight_decay) == (256, 1e-4, 1e-5)
    assert repro.claim_config(CLAIMS['table3'], 'meb-radius', 1e-3, 0.1).batch_size == 128
    assert repro.claim_config(CLAIMS['table1-protocol'], 'quadratic-tdof', 1e-4,
                              1e-5).batch_size == 128
    paper = Reproduction(BUDGETS['paper'], str(tmp_path), device='cpu')
    assert paper.base_config('meb-radius').batch_size == 256


def test_a_second_process_skips_a_held_run_then_waits_for_it_and_takes_it_over(tmp_path):
    # this process holds the lock of the first sweep run, as another worker training it would;
    # the child trains every other sweep run, then waits, and when the lock is let go without
    # the run finished (its holder died), trains it itself and completes the claim
    out = str(tmp_path)
    repro = Reproduction(TINY, out, device='cpu', sweep_cells={'sum': SUM})
    cell = repro.sized(SUM)
    held = (cell, CLAIM.models[0], 0, replace(repro.base_config('sum'), lr=TINY.sweep[0][0],
                                              weight_decay=TINY.sweep[0][1]))
    others = [(cell, m, 0, replace(repro.base_config('sum'), lr=lr, weight_decay=wd))
              for lr, wd in TINY.sweep for m in CLAIM.models]
    others.remove(held)
    child = ("import sys\nfrom tests.reproduce._common import TINY, CLAIM, SUM\n"
             "from torch_mz.reproduce import Reproduction\n"
             "Reproduction(TINY, sys.argv[1], device='cpu', sweep_cells={'sum': SUM}, on_wait="
             "lambda *a: print('WAIT', *a, flush=True)).run(CLAIM)\nprint('DONE', flush=True)\n")
    with _child_while_held(repro, held, child, out) as proc:
        lines = []  # (other lines first, e.g. warnings on the merged stderr; reading to the end
        # here would wait for a child that waits for this process's lock)
        while not lines or not lines[-1].startswith('WAIT'):
            line = proc.stdout.readline()
            if not line:  # the child ended
                break
            lines.append(line)
        assert lines and lines[-1].startswith('WAIT sum d=2'), ''.join(lines)
        assert all(repro.store.stored(*job) for job in others)
        assert not repro.store.stored(*held)
        with repro.store.lock(*held, wait=False) as second:
            assert second is False  # held: a non-waiting look skips it
    rest, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0 and rest.strip().endswith('DONE'), rest
    assert repro.store.stored(*held)
    assert len(list(tmp_path.rglob('records/tiny/**/*.json'))) == 3 * 2 + 2 * 2 * 2 - 2


def test_a_claim_whose_runs_are_held_waits_behind_the_other_claims(tmp_path):
    # the first sweep run of 'tiny' is held (another worker): the child goes on with 'tiny2'
    # and finishes it before it waits for the held run, then completes 'tiny'
    out = str(tmp_path)
    repro = Reproduction(TINY, out, device='cpu', sweep_cells={'sum': SUM})
    held = (repro.sized(SUM), CLAIM.models[0], 0,
            replace(repro.base_config('sum'), lr=TINY.sweep[0][0], weight_decay=TINY.sweep[0][1]))
    child = ("import sys\nfrom tests.reproduce._common import TINY, CLAIM, CLAIM2, SUM, MAX\n"
             "from torch_mz.reproduce import Reproduction, run_claims\n"
             "repro = Reproduction(TINY, sys.argv[1], device='cpu', sweep_cells={'sum': SUM, "
             "'max': MAX}, on_wait=lambda *a: print('WAIT', *a, flush=True))\n"
             "for claim, records, error in run_claims(repro, [CLAIM, CLAIM2], on_held=lambda c, "
             "e: print('HELD', c.name, flush=True)):\n"
             "    print('DONE', claim.name, error, flush=True)\n")
    with _child_while_held(repro, held, child, out) as proc:
        lines = []
        while not lines or not lines[-1].startswith('WAIT'):
            line = proc.stdout.readline()
            assert line, ''.join(lines)
            lines.append(line)
        # (after 'tiny2' it looks once more without waiting, then waits: no claim is left)
        assert [ln.split()[:2] for ln in lines] == [['HELD', 'tiny'], ['DONE', 'tiny2'],
                                                   ['HELD', 'tiny'], ['WAIT', 'sum']], lines
    rest, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0 and rest.split() == ['DONE', 'tiny', 'None'], rest
    assert repro.store.stored(*held)


def test_a_run_held_on_one_task_does_not_hold_up_the_claims_other_tasks(tmp_path):
    both = replace(CLAIM2, name='both', cells=(SUM, MAX))
    repro = Reproduction(TINY, str(tmp_path), device='cpu',
                         sweep_cells={'sum': SUM, 'max': MAX})
    held = (repro.sized(SUM), CLAIM.models[0], 0,
            replace(repro.base_config('sum'), lr=TINY.sweep[0][0], weight_decay=TINY.sweep[0][1]))
    with repro.store.lock(*held):  # another open file: as another process's lock
        with pytest.raises(reproduce.RunsHeld):
            repro.run(both, wait=False)
    stages = {s['stage']: s for s in repro.status(both)}
    # 'sum' waits for its held sweep run (its other sweep runs trained); 'max' is finished
    assert stages['sweep on sum (sum d=2)']['done'] == 2 * len(TINY.sweep) - 1
    assert stages['sweep on max (max d=2)']['pending'] == 0
    on_max = stages['both runs on max']
    assert on_max['done'] == 2 * 2 and on_max['pending'] == 0
    records, _ = repro.run(both)  # the held run trained now
    assert repro.store.stored(*held) and records[0]['ours']['seeds'] == 2


def test_a_held_task_is_retried_before_the_claim_stops_at_the_time_limit(tmp_path,
                                                                          monkeypatch):
    # one task waits for another process's run, another does not fit the time limit: the
    # claim goes back to the queue (RunsHeld), and the retry, which waits, trains the held
    # task before the claim stops at the limit
    both = replace(CLAIM2, name='both', cells=(SUM, MAX))
    repro = Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM, 'max': MAX})
    done = []

    def run_task(claim, task, seeds, runs, files, wait):
        if task == 'max':
            raise reproduce.TimeLimit('max does not fit')
        if not wait:
            raise reproduce.RunsHeld('sum is held')
        done.append(task)
    monkeypatch.setattr(repro, '_run_task', run_task)
    with pytest.raises(reproduce.RunsHeld):
        repro.run(both, wait=False)
    results = list(reproduce.run_claims(repro, [both]))
    assert [(c.name, type(e).__name__) for c, _, e in results] == [('both', 'TimeLimit')]
    assert done == ['sum']


def test_a_cell_no_model_learns_is_not_reproduced_whatever_the_difference(tmp_path):
    # the literal rotation target: every model near R² 0, where the paper has 0.9; two seeds
    # whose differences happen to match the paper's gap of 0.036 must not read as reproduced
    claim = CLAIMS['table4']
    comparison = next(c for c in claim.comparisons if c.cell == 'rot d=8')
    repro = Reproduction(BUDGETS['converged'], str(tmp_path), device='cpu')
    fits = dict(mz=(0.031, 0.029), rigid=(-0.004, -0.006), **{
        m: (-0.01, -0.02) for m in claim.models if m not in ('mz', 'rigid')})
    runs = [dict(cell='rot d=8', model=m, seed=k, test=dict(r2=r2), epochs_run=30,
                 stopped_early=True) for m, pair in fits.items() for k, r2 in enumerate(pair)]
    record = repro.record(comparison, claim, runs, 2, {})
    assert record['ours']['b'] == 'rigid' and abs(record['ours']['mean'] - 0.035) < 1e-12
    assert record['verdict'] == 'not reproduced'
    learned = [dict(r, test=dict(r2=r['test']['r2'] + 0.8)) for r in runs]
    assert repro.record(comparison, claim, learned, 2, {})['verdict'] == 'reproduced'


def test_a_diverged_run_makes_the_comparison_inconclusive_on_either_side(tmp_path):
    # a baseline's diverged seed (R² NaN) was passed over as the weakest baseline, and the
    # model compared with the next one: here 'not reproduced' became 'direction only' when the
    # strongest baseline lost a seed, while a diverged seed of the model made it inconclusive
    claim = CLAIMS['table3']
    comparison = next(c for c in claim.comparisons if c.cell == 'MEB d=16')
    repro = Reproduction(BUDGETS['converged'], str(tmp_path), device='cpu')
    base = dict(mz=[0.8, 0.8], rigid=[0.7, 0.7], **{'st-large': [0.9, 0.9]}, **{
        m: [0.5, 0.5] for m in claim.models if m not in ('mz', 'rigid', 'st-large')})

    def runs(r2):
        return [dict(cell=comparison.cell, model=m, seed=k, epochs_run=10, stopped_early=True,
                     test={} if v is None else dict(r2=v), **({} if v is not None else dict(
                         diverged='Training loss is nan'))) for m, vals in r2.items()
                for k, v in enumerate(vals)]
    record = repro.record(comparison, claim, runs(base), 2, {})
    assert record['ours']['b'] == 'st-large' and record['verdict'] == 'not reproduced'
    for side in ('st-large', 'mz'):
        record = repro.record(comparison, claim, runs(dict(base, **{side: [base[side][0], None]})),
                              2, {})
        assert record['verdict'] == 'inconclusive' and record['ours']['b'] == 'st-large', side
        assert record['epochs_run']['diverged'] == 1


def test_a_claim_records_each_models_spread_as_the_sample_standard_deviation(tmp_path):
    # each model's r2_std (summary.md's "Every model, every cell") was the population standard
    # deviation (ddof 0), 1/sqrt(2) of the sample one at two seeds, while the verdict's s of
    # the differences is the sample one (ddof 1), and neither file said which
    import statistics
    claim = CLAIMS['table3']
    comparison = next(c for c in claim.comparisons if c.cell == 'MEB d=16')
    repro = Reproduction(BUDGETS['converged'], str(tmp_path), device='cpu')
    r2 = {m: (0.5 + 0.01 * i, 0.6 + 0.03 * i) for i, m in enumerate(claim.models)}
    runs = [dict(cell=comparison.cell, model=m, seed=k, epochs_run=10, stopped_early=True,
                 test=dict(r2=v)) for m, pair in r2.items() for k, v in enumerate(pair)]
    record = repro.record(comparison, claim, runs, 2, {})
    for m, pair in r2.items():
        assert record['ours']['models'][m]['r2_std'] == pytest.approx(statistics.stdev(pair))
    b = record['ours']['b']
    assert record['ours']['std'] == pytest.approx(statistics.stdev(
        [a - c for a, c in zip(r2['mz'], r2[b])]))
    # one seed: no spread (NaN, written null), not 0
    one = repro.record(comparison, claim, [r for r in runs if r['seed'] == 0], 1, {})
    assert all(math.isnan(v['r2_std']) for v in one['ours']['models'].values())


def test_a_missing_run_makes_the_comparison_inconclusive(tmp_path):
    # rule 1 reads a missing run inconclusive: with three seeds and the model's third run
    # missing, the record compared the two seeds left and gave 'direction only'
    claim = CLAIMS['table3']
    comparison = next(c for c in claim.comparisons if c.cell == 'MEB d=16')
    repro = Reproduction(BUDGETS['converged'], str(tmp_path), device='cpu')
    r2 = dict(mz=0.8, rigid=0.7, **{m: 0.1 for m in claim.models if m not in ('mz', 'rigid')})
    runs = [dict(cell=comparison.cell, model=m, seed=k, epochs_run=10, stopped_early=True,
                 test=dict(r2=v)) for m, v in r2.items() for k in range(3)]
    assert repro.record(comparison, claim, runs, 3, {})['verdict'] == 'direction only'
    for model in ('mz', 'rigid', 'perceiver'):  # A, the best of B, another model of B
        short = [r for r in runs if (r['model'], r['seed']) != (model, 2)]
        record = repro.record(comparison, claim, short, 3, {})
        assert record['verdict'] == 'inconclusive' and record['seeds'] == 3, model
    # a model outside the comparison (Deep Sets) missing a run leaves the verdict as it is
    short = [r for r in runs if (r['model'], r['seed']) != ('deepsets', 2)]
    assert repro.record(comparison, claim, short, 3, {})['verdict'] == 'direction only'
    # rule 0 comes first: two models that learn nothing where the paper's A does
    flat = [dict(r, test=dict(r2=0.01)) for r in runs if (r['model'], r['seed']) != ('mz', 2)]
    assert repro.record(comparison, claim, flat, 3, {})['verdict'] == 'not reproduced'


def test_a_claim_record_names_the_models_whose_runs_ran_to_the_epoch_cap(tmp_path):
    # the summary's "epochs run" said how many runs early stopping ended, not whose chosen
    # setting ran every epoch the budget allows (no plateau): here st-4l's two runs and one of
    # mz-1l's, the compared models, while another model's stopped runs hid them in "2/6"
    claim = CLAIMS['table1']
    comparison = next(c for c in claim.comparisons if c.cell == 'L=16')
    repro = Reproduction(BUDGETS['converged'], str(tmp_path), device='cpu')
    cap = dict(config=dict(epochs=200))
    epochs = {'mz-1l': (200, 120), 'st-4l': (200, 200), 'rigid': (40, 50)}
    runs = [dict(cell='L=16', model=m, seed=k, test=dict(r2=0.5), epochs_run=e, key=cap,
                 stopped_early=e < 200) for m, pair in epochs.items() for k, e in enumerate(pair)]
    runs.append(dict(cell='L=16', model='deepsets', seed=0, test={}, epochs_run=7, key=cap,
                     stopped_early=False, diverged='Training loss is nan'))  # not at the cap
    record = repro.record(comparison, claim, runs, 2, {})
    assert record['epochs_run']['at_cap'] == {'mz-1l': 1, 'st-4l': 2}
    assert record['epochs_run']['stopped_early'] == 3
    row = reproduce.summary_table([record]).strip().split('\n')[-1]
    assert '| 7-200 (3/7 stopped early, 1 diverged; at the epoch cap: mz-1l 1, st-4l 2) |' in row


def test_a_run_whose_patience_ran_out_on_its_last_epoch_counts_at_the_cap(tmp_path):
    # the trainer's stopped_early is true where the patience runs out on the very last epoch
    # (two committed records: 200 epochs of 200, best epoch 179, patience 20): the summary
    # counted such a run as stopped early and left it out of "at the epoch cap", and
    # finished_runs starred its 200 epochs, though it trained every epoch the budget allows
    from torch_mz.reproduce.store import at_epoch_cap, stopped_early
    claim = CLAIMS['table1']
    comparison = next(c for c in claim.comparisons if c.cell == 'L=16')
    repro = Reproduction(BUDGETS['converged'], str(tmp_path), device='cpu')
    cap = dict(config=dict(epochs=200))
    runs = [dict(cell='L=16', model=m, seed=k, test=dict(r2=0.5), epochs_run=e, key=cap,
                 stopped_early=True) for m, pair in {'mz-1l': (200, 120),
                                                      'st-4l': (199, 200)}.items()
            for k, e in enumerate(pair)]
    assert [stopped_early(r) for r in runs] == [False, True, True, False]
    assert [at_epoch_cap(r) for r in runs] == [True, False, False, True]
    record = repro.record(comparison, claim, runs, 2, {})
    assert record['epochs_run']['stopped_early'] == 2
    assert record['epochs_run']['at_cap'] == {'mz-1l': 1, 'st-4l': 1}
    row = reproduce.summary_table([record]).strip().split('\n')[-1]
    assert '| 120-200 (2/4 stopped early; at the epoch cap: mz-1l 1, st-4l 1) |' in row
    # a record without its key (no cap to compare with) is read as its flag says
    assert stopped_early(dict(epochs_run=200, stopped_early=True))


def test_status_counts_runs_and_estimates_the_time_left(tmp_path):
    out = str(tmp_path)
    repro = Reproduction(TINY, out, device='cpu', sweep_cells={'sum': SUM})
    # nothing trained: the sweep's 3 points x 2 models pending, the claim's 2 cells x 2 models
    # x 2 seeds unknown until the sweep has chosen; no finished run to estimate from
    before = repro.status(CLAIM)
    assert [(s['done'], s['pending'], s['unknown']) for s in before] == [(0, 6, 0), (0, 0, 8)]
    assert before[0]['left_s'] is None and before[1]['note'] == 'after the sweep'
    assert not list(tmp_path.rglob('records/tiny/**/*.json'))  # status trains nothing

    repro.run(CLAIM)
    after = repro.status(CLAIM)
    assert [(s['done'], s['pending'], s['training'], s['unknown']) for s in after] == [
        (6, 0, 0, 0), (8, 0, 0, 0)]
    assert after[1]['left_s'] == 0.0

    # one claim run lost: pending, and its estimate is the mean time of the model's runs
    lost = next(p for p in tmp_path.rglob('records/tiny/**/*.json') if '_s1_' in p.name)
    model = json.loads(lost.read_text())['model']
    lost.unlink()
    st = repro.status(CLAIM)[1]
    assert (st['done'], st['pending']) == (7, 1)
    mean_wall, _ = repro.store.mean_time('sum', model)
    assert st['left_s'] == pytest.approx(mean_wall)
    # held by another process: training; a checkpoint with one epoch and no holder: started
    lr, wd = repro.sweep('sum', CLAIM.models)[model]
    config = replace(repro.base_config('sum'), lr=lr, weight_decay=wd)
    job = next((c, model, 1, config) for c in map(repro.sized, CLAIM.cells)
               if not repro.store.stored(c, model, 1, config))
    with repro.store.lock(*job):  # another open file: as another process's lock
        assert repro.status(CLAIM)[1]['training'] == 1
    ckpt = tmp_path / repro.store.config_for(*job).out_dir
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / 'metrics.jsonl').write_text(json.dumps({'epoch': 0, 'val_loss': 1.0}) + '\n')
    st = repro.status(CLAIM)[1]
    assert (st['started'], st['epochs'], st['left_s']) == (1, 1, 0.0)  # 1 of 1 epoch run


def test_a_time_limit_trains_the_runs_that_fit_and_leaves_the_rest(tmp_path, monkeypatch):
    import os
    out = str(tmp_path)
    cells = {'sum': SUM, 'max': MAX}
    budget = replace(TINY, epochs=3)  # no early stopping (patience None): 3 epochs a run
    Reproduction(budget, out, device='cpu', sweep_cells=cells).run(CLAIM)
    Reproduction(budget, out, device='cpu', sweep_cells=cells).run(CLAIM2)
    # the runs on 'sum' took 100 s (deepsets) and 10 s (mean-mlp), as far as the store knows
    wall = {'deepsets': 100.0, 'mean-mlp': 10.0}
    for p in tmp_path.rglob('records/tiny/sum/**/*.json'):
        r = json.loads(p.read_text())
        assert r['epochs_run'] == 3
        p.write_text(json.dumps(dict(r, wall_time_s=wall[r['model'].split(':')[0]])))
    # three claim runs are lost: deepsets and mean-mlp on 'sum d=2', mean-mlp on 'sum d=3'
    lost = sorted(p for p in tmp_path.rglob('records/tiny/sum/**/*_s1_*.json')
                  if 'mean-mlp' in str(p) or 'd=2' in p.name)
    assert len(lost) == 3
    for p in lost:
        p.unlink()
    calls = _counting(monkeypatch)
    counted = grid.train_one
    now = [1000.0]

    def ticking(task, name, seed, config, **overrides):  # each run takes its time on the clock
        now[0] += wall[name]
        return dict(counted(task, name, seed, config, **overrides), wall_time_s=wall[name])
    monkeypatch.setattr(grid, 'train_one', ticking)
    repro = Reproduction(budget, out, device='cpu', sweep_cells=cells, deadline=now[0] + 22.0,
                         clock=lambda: now[0])
    repro.started = now[0] - 1000.0  # a job of about 1,000 s, near its end
    chosen = repro.sweep('sum', CLAIM.models)
    config = {m: replace(repro.base_config('sum'), lr=chosen[m][0], weight_decay=chosen[m][1])
              for m in CLAIM.models}
    deepsets, mlp = CLAIM.models
    d2, d3 = map(repro.sized, CLAIM.cells)
    # the longest time a run may take: its epochs left at the mean time per epoch; the status's
    # estimate: the mean time of a run, less the share already run
    assert repro.time_bound(d2, deepsets, 1, config[deepsets]) == pytest.approx(100.0)
    assert repro.time_bound(d2, mlp, 1, config[mlp]) == pytest.approx(10.0)
    ckpt = tmp_path / repro.store.config_for(d2, deepsets, 1, config[deepsets]).out_dir
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / 'metrics.jsonl').write_text(json.dumps({'epoch': 0, 'val_loss': 1.0}) + '\n')
    assert repro.time_bound(d2, deepsets, 1, config[deepsets]) == pytest.approx(100.0 * 2 / 3)
    assert repro.time_needed(d2, deepsets, 1, config[deepsets]) == pytest.approx(100.0 * 2 / 3)
    (ckpt / 'metrics.jsonl').unlink()
    # a model with no finished run on the task: the largest time per epoch in the store
    other = (repro.sized(MAX), 'deepsets:hidden_channels=16', 0, repro.base_config('max'))

    def jobs_of(r, task):  # the finished sweep runs of a task
        return [(r.sized(cells[task]), m, 0, replace(r.base_config(task), lr=lr,
                                                        weight_decay=wd))
                for lr, wd in budget.sweep for m in CLAIM.models]
    assert repro.time_bound(*other) == pytest.approx(100.0)
    assert repro.time_needed(*other) is None

    # 22 s left: the deepsets run (1.25 x 100 s) is passed over, the first mean-mlp run
    # (1.25 x 10 s) trained; 12 s are left then, too few for the second; the claim stops at the
    # limit, and the next claim (read back) is still done
    results = list(reproduce.run_claims(repro, [CLAIM, CLAIM2]))
    assert [(c.name, type(e).__name__) for c, _, e in results] == [('tiny', 'TimeLimit'),
                                                                  ('tiny2', 'NoneType')]
    assert 'would not finish before the time limit' in str(results[0][2])
    assert not results[0][2].never
    assert [(c[2], c[1]) for c in calls] == [('mean-mlp', 2)]
    assert [p.exists() for p in lost] == [False, True, False]  # d=2 deepsets, mlp; d=3 mlp
    # with 13 s more the second mean-mlp run fits; then 125 s for the deepsets one
    repro.deadline = now[0] + 13.0
    with pytest.raises(reproduce.TimeLimit):
        repro.run(CLAIM)
    assert [c[2] for c in calls] == ['mean-mlp', 'mean-mlp']
    repro.deadline = now[0] + 125.0
    records, _ = repro.run(CLAIM)
    assert [c[2] for c in calls] == ['mean-mlp', 'mean-mlp', 'deepsets']
    assert all(p.exists() for p in lost)
    # past the deadline nothing starts, not even a run that cannot be estimated
    empty = Reproduction(budget, str(tmp_path / 'empty'), device='cpu', sweep_cells=cells,
                         deadline=now[0], clock=lambda: now[0])
    with pytest.raises(reproduce.TimeLimit):
        empty.run(CLAIM)
    assert len(calls) == 3
    # a run longer than the whole limit can never fit: an error that says so
    short = Reproduction(budget, out, device='cpu', sweep_cells=cells, deadline=now[0] + 60.0,
                         clock=lambda: now[0])
    assert short.too_long(*jobs_of(short, 'max')[0]) is None  # (those have a time: 10 s)
    assert 'more than the whole time limit' in short.too_long(*other)
    with pytest.raises(reproduce.TimeLimit, match='more than the whole time limit') as e:
        short._train_missing([other])
    assert e.value.never and len(calls) == 3
    # a run another process holds is not waited for when it would not fit
    p = next(tmp_path.rglob('records/tiny/sum/**/*_s1_*.json'))
    job = next(j for j in [(c, m, 1, config[m]) for c in (d2, d3) for m in CLAIM.models]
               if repro.store.files(*j) == str(p))
    p.unlink()
    repro.deadline = now[0] + 1.0
    with repro.store.lock(*job):  # another open file: as another process's lock
        with pytest.raises(reproduce.TimeLimit, match='being trained by another process'):
            repro._train_missing([job], wait=True)
    assert len(calls) == 3
    # ... nor resumed when its holder lets it go unfinished after the deadline (it died)
    import threading
    repro.deadline = now[0] + 1000.0
    acquired, release = threading.Event(), threading.Event()

    def holder():
        with repro.store.lock(*job):
            acquired.set()
            release.wait(30)
            now[0] += 2000.0  # it held the run past the deadline
    thread = threading.Thread(target=holder)
    thread.start()
    assert acquired.wait(30)
    threading.Timer(0.3, release.set).start()
    with pytest.raises(reproduce.TimeLimit, match='too late to resume'):
        repro._train_missing([job], wait=True)
    thread.join(30)
    assert len(calls) == 3 and not repro.store.stored(*job)
    # without a limit it is the same claim
    assert Reproduction(budget, out, device='cpu', sweep_cells=cells).run(CLAIM)[0] == records

    # a claim that keeps its runs' weights, stopped by the limit, keeps those it trained: two
    # runs' weights lost (a new clone), time for the mean-mlp one only
    keeping = replace(CLAIM, keep_weights=True)
    repro = Reproduction(budget, out, device='cpu', sweep_cells=cells, clock=lambda: now[0])
    repro.run(keeping)  # copies every run's weights into weights/ (committed)
    assert len(list(tmp_path.glob('weights/tiny/sum/*/*.pt'))) == 8
    for spec in CLAIM.models:
        for _ in range(2):  # the committed copy, then the one in runs/
            os.remove(repro.store.weights(d2, spec, 0, config[spec]))
    before = len(calls)
    repro.deadline, repro.started = now[0] + 20.0, now[0] - 1000.0
    with pytest.raises(reproduce.TimeLimit):
        repro.run(keeping)
    assert [c[2] for c in calls[before:]] == ['mean-mlp']
    kept = repro.store.weights(d2, mlp, 0, config[mlp])
    assert kept is not None and kept.startswith(str(tmp_path / 'weights'))
    assert repro.store.weights(d2, deepsets, 0, config[deepsets]) is None


def test_carry_stops_a_run_at_the_limit_and_a_clone_resumes_it_exactly(tmp_path, monkeypatch):
    import shutil
    from torch_mz.train import Trainer, load_checkpoint
    budget = replace(TINY, epochs=4)  # no early stopping: 4 epochs a run
    fixed = replace(CLAIM, name='fixed', protocol=(2e-3, 0.05))  # 8 runs, no sweep
    cells = {'sum': SUM}
    whole, whole_runs = Reproduction(budget, str(tmp_path / 'whole'), device='cpu',
                                     sweep_cells=cells).run(fixed)
    now = [1000.0]
    original = Trainer._train_epoch

    def ticking(self, loader, epoch):  # each epoch takes 10 s on the clock
        now[0] += 10.0
        return original(self, loader, epoch)
    monkeypatch.setattr(Trainer, '_train_epoch', ticking)
    calls = _counting(monkeypatch)
    cut = tmp_path / 'cut'
    # 45 s: the first run (40 s) finishes, and the second starts though it cannot finish (no
    # time bound with carry) and stops after the epoch that ends past the limit, at 50 s
    repro = Reproduction(budget, str(cut), device='cpu', sweep_cells=cells,
                         deadline=now[0] + 45.0, clock=lambda: now[0], carry=True)
    assert repro.too_long(repro.sized(SUM), fixed.models[0], 0,
                          repro.claim_config(fixed, 'sum', 2e-3, 0.05)) is None
    with pytest.raises(reproduce.TimeLimit) as e:
        repro.run(fixed)
    assert not e.value.never and len(calls) == 2
    # past the limit, the message says so (not that the runs "would not finish")
    assert str(e.value).startswith('the time limit is reached: 7 run(s) it needs are left')
    assert len(list(cut.rglob('records/tiny/**/*.json'))) == 1
    stopped = list(cut.glob('runs/tiny/*/checkpoint.pt'))
    assert len(stopped) == 1 and load_checkpoint(stopped[0])['epoch'] == 0
    # another clone gets what the repository commits (.gitignore): the records, the kept
    # weights and each run in progress's checkpoint.pt, best.pt, metrics.jsonl and code.jsonl,
    # no lock, CSV log or weights of finished runs
    clone = tmp_path / 'clone'
    for path in cut.rglob('*'):
        rel = path.relative_to(cut)
        carried = (rel.parts[0] in ('records', 'weights') or len(rel.parts) == 4
                   and rel.parts[0] == 'runs' and rel.parts[2] != 'weights'
                   and rel.name in ('checkpoint.pt', 'best.pt', 'metrics.jsonl', 'code.jsonl'))
        if path.is_file() and carried:
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, clone / rel)
    stage, = Reproduction(budget, str(clone), device='cpu', sweep_cells=cells).status(fixed)
    assert (stage['done'], stage['started'], stage['pending'], stage['epochs']) == (1, 1, 6, 1)
    # without a limit there: the stopped run resumes at its second epoch, the others start;
    # every run as the uninterrupted reproduction's
    epochs = []
    monkeypatch.setattr(Trainer, '_train_epoch',
                        lambda self, loader, epoch: epochs.append(epoch) or
                        original(self, loader, epoch))
    again, again_runs = Reproduction(budget, str(clone), device='cpu',
                                     sweep_cells=cells).run(fixed)
    assert len(calls) == 2 + 7 and epochs.count(0) == 6 and epochs.count(1) == 7
    assert not list(clone.glob('runs/tiny/*/checkpoint.pt'))  # removed when finished

    def same(run):
        return (run['cell'], run['model'], run['seed'], run['epochs_run'], run['test'],
                run['val'], run['val_loss_curve'])
    assert sorted(map(same, again_runs)) == sorted(map(same, whole_runs))
    assert again == whole
    # the best weights of every run trained there, the resumed one's from its carried best.pt
    # (those of the run finished in the first clone stayed there: this claim keeps none)
    there = Reproduction(budget, str(clone), device='cpu', sweep_cells=cells)
    config = there.claim_config(fixed, 'sum', 2e-3, 0.05)
    assert sum(there.store.weights(there.sized(c), m, k, config) is not None
               for c in fixed.cells for m in fixed.models for k in range(2)) == 7
    assert (clone / 'runs' / 'tiny' / 'weights' / (stopped[0].parent.name + '.pt')).exists()


def test_a_diverging_run_is_stored_as_failed_and_not_trained_again(tmp_path, monkeypatch):
    # lr 1e30 overflows the model in its first epoch: the trainer raises TrainingDiverged (a
    # FloatingPointError). The runner stores the run as finished and failed (no validation
    # loss, no test figures) instead of dying and leaving a checkpoint that would diverge
    # again in every process and session; the sweep reads it as the worst point
    from torch_mz.train import TrainingDiverged
    assert issubclass(TrainingDiverged, FloatingPointError)
    budget = replace(TINY, epochs=3, sweep=((1e-3, 1e-5), (1e30, 1e-5)))
    calls = _counting(monkeypatch)
    repro = Reproduction(budget, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    model = 'deepsets:hidden_channels=8'
    chosen = repro.sweep('sum', [model])
    assert chosen[model] == (1e-3, 1e-5)
    records = {json.loads(p.read_text())['key']['config']['lr']: json.loads(p.read_text())
               for p in tmp_path.rglob('records/tiny/**/*.json')}
    bad = records[1e30]
    # the epoch that diverged is the last it ran; the finished epochs' curve is kept
    assert 'diverged' in bad and f"in epoch {bad['epochs_run'] - 1};" in bad['diverged']
    assert len(bad['val_loss_curve']) == bad['epochs_run'] - 1 < budget.epochs
    assert bad['val'] == {} and bad['test'] == {} and bad['wall_time_s'] >= 0
    assert bad['stopped_early'] is False  # it failed; early stopping did not end it
    assert math.isfinite(records[1e-3]['val']['loss'])
    assert not list(tmp_path.rglob('runs/tiny/*/checkpoint.pt'))  # nothing left to resume
    rows = repro.sweep_landscape('sum', [model])
    row = next(r for r in rows if r['lr'] == 1e30)
    assert row['done'] and row['val_loss'] == math.inf and math.isnan(row['r2'])
    # a second process reads both back and trains nothing
    n = len(calls)
    assert Reproduction(budget, str(tmp_path), device='cpu',
                        sweep_cells={'sum': SUM}).sweep('sum', [model]) == chosen
    assert len(calls) == n


def test_a_sweep_whose_every_point_diverged_does_not_step_beyond_the_grid(tmp_path,
                                                                          monkeypatch):
    # every point diverged: the first point was taken for the best and the sweep stepped
    # beyond it (lr / 3) for up to SWEEP_MAX_STEPS rounds, each run diverging again
    budget = replace(TINY, epochs=2, extend_sweep=True, sweep=((1e30, 1e-5), (3e30, 1e-5)))
    calls = _counting(monkeypatch)
    repro = Reproduction(budget, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    model = 'deepsets:hidden_channels=8'
    assert repro.sweep('sum', [model]) == {model: (1e30, 1e-5)}
    assert sorted(c[4] for c in calls) == [1e30, 3e30]  # the grid alone
    rows = repro.sweep_landscape('sum', [model])
    assert len(rows) == 2 and all(r['val_loss'] == math.inf for r in rows)
    # the report's verdict: it read 'on the edge' (a step beyond untried: as though the sweep
    # had stopped at its last round), where it stopped at the grid, every point diverged
    from torch_mz.reproduce.budgets import sweep_verdicts, untried_neighbours
    assert sweep_verdicts(rows) == {model: ((1e30, 1e-5), 'every point diverged')}
    # and no neighbours of the grid's first point listed as untried (it is no optimum)
    assert untried_neighbours(rows, model) == []


def test_a_held_sweep_run_holds_up_only_its_own_model(tmp_path, monkeypatch):
    # another process trains one of the first model's sweep runs: the second model's sweep
    # goes on to its next round (a point one step beyond its grid) and its claim runs are
    # trained meanwhile; the first model waits (RunsHeld), and the retry finishes it
    import torch_mz.reproduce.runner as runner
    beyond = (1e-2, 1e-5)
    monkeypatch.setattr(runner, 'sweep_extension',
                        lambda points, best: [] if beyond in points else [beyond])
    budget = replace(TINY, extend_sweep=True)
    repro = Reproduction(budget, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    first, second = CLAIM.models
    base = repro.base_config('sum')

    def sweep_job(model, point):
        return (repro.sized(SUM), model, 0, replace(base, lr=point[0], weight_decay=point[1]))
    held = sweep_job(first, TINY.sweep[0])
    with repro.store.lock(*held):  # another open file: as another process's lock
        with pytest.raises(reproduce.RunsHeld):
            repro.run(CLAIM, wait=False)
        assert not repro.store.stored(*held)
        assert all(repro.store.stored(*sweep_job(first, p)) for p in TINY.sweep[1:])
        assert not repro.store.stored(*sweep_job(first, beyond))  # its rounds wait
        assert all(repro.store.stored(*sweep_job(second, p)) for p in TINY.sweep + (beyond, ))
        stages = {s['stage']: s for s in repro.status(CLAIM)}
        runs = stages['tiny runs on sum']
        assert runs['done'] == 2 * budget.seeds  # the second model's, on both cells
        assert runs['pending'] == 0  # the first model's wait for its sweep
    records, _ = Reproduction(budget, str(tmp_path), device='cpu',
                              sweep_cells={'sum': SUM}).run(CLAIM)
    assert repro.store.stored(*held) and repro.store.stored(*sweep_job(first, beyond))
    assert records[0]['ours']['seeds'] == budget.seeds


def test_a_checkpoint_that_cannot_be_resumed_is_kept_and_the_way_out_named(tmp_path):
    from torch_mz.train import CheckpointError
    repro = Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    job = (repro.sized(SUM), CLAIM.models[0], 0, replace(repro.base_config('sum'),
                                                          lr=TINY.sweep[0][0],
                                                          weight_decay=TINY.sweep[0][1]))
    folder = repro.store.config_for(*job).out_dir
    os.makedirs(folder)
    with open(os.path.join(folder, 'checkpoint.pt'), 'wb') as f:
        f.write(b'not a checkpoint')  # damaged, or written by code with other shapes
    with pytest.raises(CheckpointError, match='to train it from the start, remove'):
        repro.sweep('sum', CLAIM.models[:1])
    assert os.path.exists(os.path.join(folder, 'checkpoint.pt'))  # nothing discarded unasked
    assert not repro.store.stored(*job)
    shutil.rmtree(folder)  # as the message says: the run trains from the start
    repro.sweep('sum', CLAIM.models[:1])
    assert repro.store.stored(*job)


def test_a_records_command_names_the_seeds_it_was_run_with(tmp_path):
    # --seeds 1 gave records of one seed whose command (without --seeds) ran the budget's two
    claim = CLAIMS['table3']
    comparison = claim.comparisons[0]
    runs = [dict(cell=comparison.cell, model=m, seed=0, test=dict(r2=0.5), epochs_run=3,
                 stopped_early=False) for m in claim.models]
    for seeds, tail in ((None, ''), (1, ' --seeds 1')):
        repro = Reproduction(BUDGETS['converged'], str(tmp_path), device='cpu', seeds=seeds)
        record = repro.record(comparison, claim, runs, 1, {})
        assert record['command'] == ('python benchmarks/reproduce.py --budget converged '
                                     '--claims table3' + tail)


def test_a_diverged_run_of_a_claim_that_keeps_weights_is_not_counted_to_train_again(tmp_path,
                                                                                    monkeypatch):
    # a diverged run has no weights: run() takes it as finished (it would diverge again), and
    # --status counted it as pending, 'a finished run to train again', for good
    calls = _counting(monkeypatch)
    keep = replace(CLAIM, name='keep', cells=(SUM, ), models=CLAIM.models[:1], comparisons=(),
                   protocol=(1e30, 1e-5), keep_weights=True)
    budget = replace(TINY, epochs=3)
    repro = Reproduction(budget, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    repro.run(keep)
    assert len(calls) == budget.seeds
    stage, = repro.status(keep)
    assert (stage['done'], stage['pending'], stage['again']) == (budget.seeds, 0, 0)
    Reproduction(budget, str(tmp_path), device='cpu', sweep_cells={'sum': SUM}).run(keep)
    assert len(calls) == budget.seeds  # nothing trained again


def test_progress_reaches_the_bars_of_building_the_data(tmp_path):
    # --progress showed the runs' epochs alone: QM9's first processing (every molecule read
    # with RDKit) took minutes without a bar, as did generating a synthetic cell's sets
    from torch_mz.tasks import load_task
    asked = []

    def load(name, **kwargs):
        asked.append(kwargs.get('progress'))
        return load_task(name, **kwargs)
    for progress in (True, False):
        repro = Reproduction(TINY, str(tmp_path), device='cpu', load=load, progress=progress)
        task = repro._load('sum', seed=0, n_train=4, n_val=2, n_test=2, d=2)
        assert repro._load('sum', seed=0, n_train=4, n_val=2, n_test=2, d=2) is task
    assert asked == [True, None]  # (not given where no bar is shown: a stand-in need not take it)


@pytest.mark.parametrize('older', [False, True])
def test_a_resumed_run_records_the_code_of_its_start_and_of_its_resume(tmp_path, monkeypatch,
                                                                       older):
    # the record named only the code that finished a run: a run resumed under a later commit
    # did not say which code trained its earlier epochs
    import torch_mz.reproduce.store as store
    from torch_mz.train import Trainer
    budget = replace(TINY, epochs=3, seeds=1)
    fixed = replace(CLAIM, name='fixed', protocol=(2e-3, 0.05))  # 4 runs, no sweep
    now = [1000.0]
    original = Trainer._train_epoch

    def ticking(self, loader, epoch):  # each epoch takes 10 s on the clock
        now[0] += 10.0
        return original(self, loader, epoch)
    monkeypatch.setattr(Trainer, '_train_epoch', ticking)
    monkeypatch.setattr(store, 'code_version', lambda: 'aaaaaaaaaa')
    with pytest.raises(reproduce.TimeLimit):  # the first run stops after its first epoch
        Reproduction(budget, str(tmp_path), device='cpu', sweep_cells={'sum': SUM},
                     deadline=now[0] + 5.0, clock=lambda: now[0], carry=True).run(fixed)
    log, = tmp_path.glob('runs/tiny/*/code.jsonl')  # beside its checkpoint, to be committed
    assert (log.parent / 'checkpoint.pt').exists()
    first, = [json.loads(line) for line in log.read_text().splitlines()]
    assert (first['epoch'], first['code'], first['device']) == (0, 'aaaaaaaaaa', 'cpu')
    if older:  # begun by code that kept no log
        log.unlink()
    monkeypatch.setattr(store, 'code_version', lambda: 'bbbbbbbbbb')
    Reproduction(budget, str(tmp_path), device='cpu', sweep_cells={'sum': SUM}).run(fixed)
    assert not log.parent.exists()  # removed with the checkpoint
    path, = tmp_path.rglob(f'records/tiny/**/*_{log.parent.name}.json')  # (named by digest)
    resumed = json.loads(path.read_text())
    others = [json.loads(p.read_text()) for p in tmp_path.rglob('records/tiny/**/*.json')
              if p != path]
    assert len(others) == 3 and all(r['code'] == 'bbbbbbbbbb' for r in others + [resumed])
    history = resumed['code_history']
    assert [e['epoch'] for e in history] == [0, 1]
    assert history[1]['code'] == 'bbbbbbbbbb' and history[1]['threads'] >= 1
    if older:
        assert history[0]['code'] is None and history[0]['note'].startswith('unknown')
    else:
        assert history[0] == first
    assert all([(e['epoch'], e['code']) for e in r['code_history']] == [(0, 'bbbbbbbbbb')]
               for r in others)


def test_a_checkpoint_without_an_integer_epoch_is_refused_as_the_trainer_refuses_it(tmp_path):
    # the code log read the checkpoint's epoch before the trainer checked it: a checkpoint
    # without one stopped every claim with a bare KeyError (not the CheckpointError naming the
    # way out), and a text epoch '3' was logged as a resume from epoch 4
    from torch_mz.reproduce.store import CODE_LOG
    from torch_mz.train import CheckpointError
    from torch_mz.train.checkpoint import CHECKPOINT_FORMAT, CHECKPOINT_VERSION, save_checkpoint
    repro = Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    job = (repro.sized(SUM), CLAIM.models[0], 0, replace(repro.base_config('sum'),
                                                          lr=TINY.sweep[0][0],
                                                          weight_decay=TINY.sweep[0][1]))
    folder = repro.store.config_for(*job).out_dir
    base = dict(format=CHECKPOINT_FORMAT, version=CHECKPOINT_VERSION, kind='train', model={},
                task_type='regression')
    for epoch in ({}, dict(epoch='3'), dict(epoch=True)):
        save_checkpoint(dict(base, **epoch), os.path.join(folder, 'checkpoint.pt'))
        with pytest.raises(CheckpointError, match="'epoch' is .*to train it from the start"):
            repro.sweep('sum', CLAIM.models[:1])
        assert not os.path.exists(os.path.join(folder, CODE_LOG))  # nothing logged
    shutil.rmtree(folder)  # as the message says: the run trains from the start
    repro.sweep('sum', CLAIM.models[:1])
    assert repro.store.stored(*job)
