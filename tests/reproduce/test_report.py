import json
import math
import re
from dataclasses import replace

import pytest

import torch_mz.reproduce as reproduce
import torch_mz.reproduce.budgets as budgets
import torch_mz.reproduce.report as report
from torch_mz.reproduce import (Reproduction, load_claims, overhead_records, save_claim,
                                summary_table)

from tests.reproduce._common import TINY, SUM, CLAIM, MAX, CLAIM2


def test_summary_and_table30(tmp_path):
    step = tmp_path / 'training_step.json'
    step.write_text(json.dumps(dict(rows=[
        dict(model='rigid', params=100, step_s=1.0, step_times_s=[1.0, 1.1, 0.9],
             infer_s=1.0, infer_times_s=[1.0, 1.0, 1.0]),
        dict(model='mz', params=190, step_s=2.2, step_times_s=[2.2, 2.3, 2.1],
             infer_s=5.0, infer_times_s=[5.0, 5.1, 4.9])])))
    records = overhead_records(str(step), 'converged')
    assert [r['verdict'] for r in records] == ['reproduced', 'reproduced', 'direction only']
    assert records[0]['ours']['mean'] == pytest.approx(1.9)
    missing = overhead_records(str(tmp_path / 'none.json'), 'converged')
    assert {r['verdict'] for r in missing} == {'inconclusive'}
    # the command: the benchmark's plain one where the file records none, else the file's own
    assert records[0]['command'] == ('python benchmarks/training_step.py && python '
                                     'benchmarks/reproduce.py --budget converged --claims table30')
    made = json.loads(step.read_text())
    made['environment'] = dict(command='python benchmarks/training_step.py --rounds 3 --out x')
    recorded = tmp_path / 'recorded.json'
    recorded.write_text(json.dumps(made))
    assert {r['command'] for r in overhead_records(str(recorded), 'converged')} == {
        'python benchmarks/training_step.py --rounds 3 --out x && python '
        'benchmarks/reproduce.py --budget converged --claims table30'}
    # a damaged results file is named (it was a bare JSONDecodeError, or an AttributeError)
    for text, match in (('{"rows": [', 'are not valid JSON'),
                        ('[1, 2]', "are not a JSON object with a list of 'rows'"),
                        ('{"rows": [{"params": 1}]}', ".* naming their 'model'")):
        recorded.write_text(text)
        with pytest.raises(ValueError, match=f"results '{re.escape(str(recorded))}' {match}"):
            overhead_records(str(recorded), 'converged')
    save_claim(str(tmp_path), 'table30', 'converged', records)
    loaded = load_claims(str(tmp_path))
    assert loaded == records
    table = summary_table(loaded)
    assert table.count('\n') == 2 + len(records) and '**reproduced**' in table

    # a run in rounds: the spread is over the rounds' own ratios (a failed round skipped), not
    # over the pooled calls
    rows = json.loads(step.read_text())['rows']
    rows[0].update(step_s_rounds=[1.0, None, 1.2], infer_s_rounds=[1.0, 1.0, 1.0])
    rows[1].update(step_s_rounds=[2.0, 2.5, 3.0], infer_s_rounds=[4.0, 5.0, 6.0])
    step.write_text(json.dumps(dict(rows=rows)))
    records = overhead_records(str(step), 'converged')
    assert records[1]['ours']['seeds'] == 2  # the rounds with both rows: 2.0 and 2.5
    assert records[1]['ours']['std'] == pytest.approx(math.sqrt(0.125))
    assert records[2]['ours']['seeds'] == 3 and records[2]['ours']['std'] == pytest.approx(1.0)
    assert records[1]['ours']['mean'] == pytest.approx(2.2)  # the medians' ratio, as before


def test_table30_and_claim_files_refuse_mismatched_or_malformed_input(tmp_path):
    # rows with different sample counts: an error, not ratios of the shorter row's samples
    step = tmp_path / 'training_step.json'
    step.write_text(json.dumps(dict(rows=[
        dict(model='rigid', params=100, step_s=1.0, step_times_s=[1.0, 1.1, 0.9],
             infer_s=1.0, infer_times_s=[1.0, 1.0, 1.0]),
        dict(model='mz', params=190, step_s=2.2, step_times_s=[2.2, 2.3],
             infer_s=5.0, infer_times_s=[5.0, 5.1, 4.9])])))
    with pytest.raises(ValueError, match="'mz' and 'rigid' rows have 2 and 3 'step_times_s'"):
        overhead_records(str(step), 'converged')
    # a claim file that is not a list of records, or not JSON: named, not added key by key
    folder = tmp_path / 'out' / 'claims'
    folder.mkdir(parents=True)
    bad = folder / 'table1.converged.json'
    bad.write_text(json.dumps(dict(claim='table1')))
    with pytest.raises(ValueError, match='table1.converged.json. does not hold a list'):
        load_claims(str(tmp_path / 'out'))
    bad.write_text('[{"claim": "table1"')
    with pytest.raises(ValueError, match='table1.converged.json. is not valid JSON'):
        load_claims(str(tmp_path / 'out'))


def test_finished_runs_table_says_which_earlier_figures_it_removed(tmp_path, monkeypatch):
    # without matplotlib, --runs-table removed the committed figures and said only "wrote
    # finished_runs.<budget>.md, .json" (the Markdown named no file, the curves not at all)
    out = str(tmp_path)
    repro = Reproduction(TINY, out, device='cpu', sweep_cells={'sum': SUM})
    row = dict(cell='sum d=2', model='deepsets:hidden_channels=8', lr=1e-3, weight_decay=1e-5,
               seed=0, r2=0.5, paper=None, epochs_run=2, best_epoch=1, stopped_early=False,
               val_loss_curve=[2.0, 1.0])
    monkeypatch.setattr(repro, 'finished_runs', lambda claim: [row])
    monkeypatch.setattr(report, 'sweep_section', lambda *args, **kwargs: ('', []))
    no_matplotlib = lambda: (_ for _ in ()).throw(ImportError('no matplotlib'))  # noqa: E731
    monkeypatch.setattr(report, 'pyplot', no_matplotlib)
    monkeypatch.setattr('torch_mz.study.plots.pyplot', no_matplotlib)
    figures = [tmp_path / 'finished_runs.tiny.tiny.png',
               tmp_path / 'finished_runs.tiny.tiny.curves.png']
    for figure in figures:
        figure.write_bytes(b'an earlier run')
    notes = []
    path = report.write_runs_table(repro, [CLAIM], out, on_note=notes.append)
    assert not any(figure.exists() for figure in figures)
    assert notes == [f"matplotlib is not installed: no plot (pip install 'torch_mz[plot]'); "
                     f"removed the figure an earlier run drew, '{figure}', which would not show "
                     f"these results: install matplotlib and run this again to redraw it"
                     for figure in figures]
    text = open(path + '.md').read()  # (no path of this machine in the committed Markdown)
    assert 'matplotlib is not installed' in text and 'removed' not in text
    notes.clear()
    report.write_runs_table(repro, [CLAIM], out, on_note=notes.append)
    assert notes == []  # (nothing there to remove)


def test_a_runs_table_of_other_seeds_goes_beside_the_budgets_not_over_it(tmp_path,
                                                                       monkeypatch):
    # --runs-table --seeds 1 wrote finished_runs.<budget>.{md,json} (and its figures, or
    # removed them without matplotlib) with the runs of one seed: the table of every finished
    # run was lost
    out = str(tmp_path)
    deepsets, mlp = CLAIM.models
    rows = [dict(cell=cell, model=m, lr=1e-3, weight_decay=1e-5, seed=k, r2=0.5 + 0.1 * k,
                 paper=None, epochs_run=2, best_epoch=1, stopped_early=False,
                 val_loss_curve=[2.0, 1.0]) for cell in ('sum d=2', 'sum d=3')
            for m in CLAIM.models for k in (0, 1)]
    monkeypatch.setattr(Reproduction, 'finished_runs', lambda self, claim: [
        r for r in rows if r['seed'] < (self.seeds or self.budget.seeds)])
    monkeypatch.setattr(Reproduction, 'sweep_landscape', lambda self, task, models: [
        dict(task=task, cell='sum d=2', model=m, lr=1e-3, weight_decay=1e-5, done=True,
             val_loss=1.0, r2=0.5, epochs_run=2, chosen=True) for m in models])
    no_matplotlib = lambda: (_ for _ in ()).throw(ImportError('no matplotlib'))  # noqa: E731
    monkeypatch.setattr(report, 'pyplot', no_matplotlib)
    monkeypatch.setattr('torch_mz.study.plots.pyplot', no_matplotlib)
    main = report.write_runs_table(Reproduction(TINY, out, device='cpu'), [CLAIM], out)
    assert main == str(tmp_path / 'finished_runs.tiny')
    figures = [tmp_path / f'finished_runs.tiny.{f}.png' for f in ('tiny', 'tiny.curves',
                                                                  'sweep.sum')]
    for figure in figures:  # (drawn by a run with matplotlib)
        figure.write_bytes(b'every run')
    kept = {p: p.read_bytes() for p in [tmp_path / 'finished_runs.tiny.md',
                                        tmp_path / 'finished_runs.tiny.json'] + figures}
    assert json.loads(kept[tmp_path / 'finished_runs.tiny.json'])['rows'] == [
        {k: v for k, v in r.items() if k != 'val_loss_curve'} for r in rows]
    notes = []
    one = Reproduction(TINY, out, device='cpu', seeds=1)
    path = report.write_runs_table(one, [CLAIM], out, on_note=notes.append)
    assert {p: p.exists() for p in kept} == {p: True for p in kept}
    assert {p: p.read_bytes() for p in kept} == kept  # every file of the budget's table
    assert path == str(tmp_path / 'finished_runs.tiny.seeds1')
    assert report.runs_table_seeds(one, [CLAIM]) == 1
    assert not any('finished_runs.tiny.' + f in n for n in notes
                   for f in ('tiny.png', 'tiny.curves.png', 'sweep.sum.png'))
    text = open(path + '.md').read()
    assert 'Written with `--seeds 1`' in text and '`finished_runs.tiny.md`' in text
    assert text.count('| sum d=') == 4 and '0.5000 / 0.6000' not in text  # seed 0 only
    written = json.loads(open(path + '.json').read())
    assert written['seeds'] == 1 and {r['seed'] for r in written['rows']} == {0}
    # --seeds at the budget's own count is the budget's table
    same = Reproduction(TINY, out, device='cpu', seeds=2)
    assert report.runs_table_seeds(same, [CLAIM]) is None
    assert report.write_runs_table(same, [CLAIM], out) == main


def test_finished_runs_table_interrupted_keeps_the_earlier_pair(tmp_path, monkeypatch):
    # the Markdown was replaced first and the JSON after it: a Ctrl-C (or a full disk) between
    # the two left the new table beside the earlier rows
    out = str(tmp_path)
    repro = Reproduction(TINY, out, device='cpu', sweep_cells={'sum': SUM})
    monkeypatch.setattr(repro, 'finished_runs', lambda claim: [])
    monkeypatch.setattr(report, 'sweep_section', lambda *args, **kwargs: ('', []))
    earlier = {ext: tmp_path / f'finished_runs.tiny.{ext}' for ext in ('md', 'json')}
    for ext, path in earlier.items():
        path.write_text(f'an earlier {ext}')
    write = report.atomic_write

    def interrupted(path, *args, **kwargs):
        if str(path).endswith('.json'):
            raise KeyboardInterrupt
        write(path, *args, **kwargs)
    monkeypatch.setattr(report, 'atomic_write', interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.write_runs_table(repro, [CLAIM], out)
    assert {ext: path.read_text() for ext, path in earlier.items()} == dict(
        md='an earlier md', json='an earlier json')
    monkeypatch.setattr(report, 'atomic_write', write)
    report.write_runs_table(repro, [CLAIM], out)  # both replaced
    assert 'No finished run yet.' in earlier['md'].read_text()
    assert json.loads(earlier['json'].read_text())['rows'] == []


def test_finished_runs_table_lists_each_run_beside_the_paper(tmp_path):
    out = str(tmp_path)
    claim = replace(CLAIM, paper_r2={('sum d=3', 'deepsets:hidden_channels=8'): 0.9})
    repro = Reproduction(TINY, out, device='cpu', sweep_cells={'sum': SUM})
    assert repro.finished_runs(claim) == []  # nothing trained, and it trains nothing
    assert not list(tmp_path.rglob('records/tiny/**/*.json'))
    records, _ = repro.run(claim)
    rows = repro.finished_runs(claim)
    # 2 cells x 2 models x 2 seeds, each at its model's chosen point, with the stored R²
    assert len(rows) == 8
    chosen = repro.sweep('sum', claim.models)
    for r in rows:
        assert (r['lr'], r['weight_decay']) == chosen[r['model']]
        config = replace(repro.base_config('sum'), lr=r['lr'], weight_decay=r['weight_decay'])
        cell = next(repro.sized(c) for c in claim.cells if c['label'] == r['cell'])
        assert r['r2'] == repro.store.read(cell, r['model'], r['seed'], config)['test']['r2']
        assert r['paper'] == (0.9 if (r['cell'], r['model']) == (
            'sum d=3', 'deepsets:hidden_channels=8') else None)
        # the validation curve of the run, one loss per epoch run, the kept epoch its minimum
        curve = r['val_loss_curve']
        assert len(curve) == r['epochs_run'] and curve[r['best_epoch']] == min(curve)
        # the code that trained it, as its record names it (the rows named none)
        record = repro.store.read(cell, r['model'], r['seed'], config)
        assert r['code'] == record['code'] and r['code_history'] == record['code_history']
    # one run lost: one row fewer
    lost = next(p for p in tmp_path.rglob('records/tiny/**/*.json') if '_s1_' in p.name)
    lost.unlink()
    assert len(repro.finished_runs(claim)) == 7
    path = report.write_runs_table(repro, [claim], out)
    text = open(path + '.md').read()
    assert text.count('| sum d=') == 4  # one row per cell and model
    assert '| 0.900 |' in text  # the paper's figure beside ours
    png = tmp_path / 'finished_runs.tiny.tiny.png'  # the bars, where matplotlib is installed
    assert (png.exists() and '![tiny](finished_runs.tiny.tiny.png)' in text) or (
        not png.exists() and 'finished_runs.tiny.tiny.png' not in text)
    curves = tmp_path / 'finished_runs.tiny.tiny.curves.png'  # validation loss by epoch
    assert curves.exists() == png.exists()
    assert curves.exists() == ('finished_runs.tiny.tiny.curves.png' in text)
    with open(path + '.json') as f:
        payload = json.load(f)
        rows = payload['rows']
        assert len(rows) == 7 and not any('val_loss_curve' in r for r in rows)  # in records/
        assert all('code' in r and r['code_history'] for r in rows)
    # the sweep of each model: every grid point with its stored figures, the chosen one marked
    sweep = payload['sweeps']
    assert len(sweep) == len(TINY.sweep) * len(claim.models)
    sweep_cell = repro.sized(SUM)
    for r in sweep:
        config = replace(repro.base_config('sum'), lr=r['lr'], weight_decay=r['weight_decay'])
        record = repro.store.read(sweep_cell, r['model'], 0, config)
        assert r['done'] and r['val_loss'] == record['val']['loss']
        assert r['r2'] == record['test']['r2'] and r['epochs_run'] == record['epochs_run']
        assert r['chosen'] == ((r['lr'], r['weight_decay']) == chosen[r['model']])
    assert '## Sweeps' in text and text.count('**chosen**') == len(claim.models)
    where = budgets.sweep_verdicts(sweep)
    assert all(w in ('inside', 'on the edge') and p == chosen[m] for m, (p, w) in where.items())
    # a model whose chosen point has an untried step beyond it is on the edge; an open one open
    edge = [dict(r, chosen=None) if r['model'] == claim.models[0] else r for r in sweep]
    assert budgets.sweep_verdicts(edge)[claim.models[0]] == (None, 'open')
    grid = [dict(model='m', lr=lr, weight_decay=wd, chosen=(lr, wd) == (1e-3, 0.1))
            for lr, wd in ((1e-3, 1e-5), (1e-3, 0.1), (3e-4, 1e-5), (3e-4, 0.1))]
    assert budgets.sweep_verdicts(grid)['m'] == ((1e-3, 0.1), 'on the edge')
    grid += [dict(model='m', lr=3e-3, weight_decay=0.1, chosen=False),
             dict(model='m', lr=1e-3, weight_decay=0.3, chosen=False)]
    assert budgets.sweep_verdicts(grid)['m'] == ((1e-3, 0.1), 'inside')
    # inside the box yet one step from an untried point: lr 1e-3 at weight decay 0.3 tried,
    # lr 3e-3 at 0.1 tried, lr 3e-4 at 0.1 tried (the grid's 3e-4 is 1e-3 / 3)
    assert budgets.untried_neighbours(grid, 'm') == []
    moved = [dict(r, chosen=(r['lr'], r['weight_decay']) == (3e-3, 0.1)) for r in grid]
    assert budgets.sweep_verdicts(moved)['m'] == ((3e-3, 0.1), 'on the edge')
    assert budgets.untried_neighbours(moved, 'm') == [(9e-3, 0.1), (3e-3, 0.3)]
    low = [dict(r, chosen=(r['lr'], r['weight_decay']) == (3e-4, 1e-5)) for r in grid]
    assert budgets.untried_neighbours(low, 'm') == [(1e-4, 1e-5)]  # 1e-5 steps to 0.1: tried
    assert budgets.untried_neighbours(edge, claim.models[0]) == []  # open: none
    # tasks and models: a model two claims share on a task is listed once, a claim with a fixed
    # protocol adds none (its models train at the protocol, not swept), each task its own
    other = replace(claim, name='other', models=(claim.models[1], 'deepsets:hidden_channels=4'))
    fixed = replace(claim, name='fixed', models=('mean-mlp:hidden_channels=4', ),
                    protocol=(1e-3, 1e-5))
    elsewhere = replace(CLAIM2, name='elsewhere', models=(claim.models[0], ))
    repro2 = Reproduction(TINY, out, device='cpu', sweep_cells={'sum': SUM, 'max': MAX})
    tables = report.sweep_tables(repro2, [claim, other, fixed, elsewhere])
    assert list(tables) == ['sum', 'max']
    assert list(dict.fromkeys(r['model'] for r in tables['sum'])) == list(claim.models) + [
        'deepsets:hidden_channels=4']
    assert {r['model'] for r in tables['max']} == {claim.models[0]}
    assert not any(r['done'] for r in tables['max'])  # listed, not trained
    assert report.sweep_tables(repro2, [fixed]) == {}
    # a task with no finished point gets one line, neither a table nor a plot
    text2, rows2 = report.sweep_section(repro2, [claim, elsewhere], out, 'tiny')
    assert '### sum' in text2 and '### max' not in text2 and 'sweep.max.png' not in text2
    assert 'No point finished yet' in text2 and 'max (' in text2.split('No point finished')[1]
    assert not (tmp_path / 'finished_runs.tiny.sweep.max.png').exists()
    assert {r['model'] for r in rows2 if r['task'] == 'max'} == {claim.models[0]}
    one_point = Reproduction(replace(TINY, sweep=((1e-3, 1e-5), )), out, device='cpu',
                             sweep_cells={'sum': SUM})
    assert report.sweep_section(one_point, [claim], out, 'tiny') == ('', [])  # no empty section


def test_models_table_writes_each_cell_once():
    # the four D.3 claims read one cell: its line appears once
    cell = dict(r2=0.98, r2_std=0.001)
    records = [dict(claim=f'd3 quad L=8: comparison {i}', budget='converged',
                    ours=dict(models=dict(mz=cell)), paper=dict(text='Tables 20-21'))
               for i in range(4)]
    records.append(dict(claim='table1 L=4: x', budget='converged',
                        ours=dict(models=dict(mz=dict(r2=0.5, r2_std=0.1))),
                        paper=dict(text='Table 1')))
    lines = reproduce.models_table(records).strip().split('\n')
    assert lines == ['- d3 quad L=8 (converged): mz 0.980 ± 0.001; paper: Tables 20-21',
                     '- table1 L=4 (converged): mz 0.500 ± 0.100; paper: Table 1']


def test_models_table_tells_apart_a_cell_run_with_other_seeds():
    # with a claim run at --seeds N beside its budget's (claims/<claim>.<budget>.seedsN.json),
    # the cell had two lines of other figures, each '- table1 L=4 (quick): ...'
    records = [dict(claim='table1 L=4: x', budget='quick', seeds=seeds,
                    ours=dict(models=dict(mz=dict(r2=r2, r2_std=0.1))),
                    paper=dict(text='Table 1')) for seeds, r2 in ((2, 0.5), (3, 0.6))]
    records.append(dict(claim='table1 L=16: x', budget='quick', seeds=2,
                        ours=dict(models=dict(mz=dict(r2=0.4, r2_std=0.1))),
                        paper=dict(text='Table 1')))
    lines = reproduce.models_table(records).strip().split('\n')
    assert lines == ['- table1 L=4 (quick, 2 seeds): mz 0.500 ± 0.100; paper: Table 1',
                     '- table1 L=4 (quick, 3 seeds): mz 0.600 ± 0.100; paper: Table 1',
                     '- table1 L=16 (quick): mz 0.400 ± 0.100; paper: Table 1']


def test_summary_says_its_spreads_are_sample_standard_deviations(tmp_path):
    # the models' lines gave mean ± std without saying which std (they were ddof 0, the
    # verdicts' ddof 1); a spread there is none of (one seed) reads n/a, as in the table
    record = dict(claim='table1 L=4: R²(mz) - R²(mlp)', verdict='inconclusive',
                  budget='converged', paper=dict(value=0.1, source='Table 1', text='Table 1'),
                  ours=dict(mean=0.1, std=math.nan, seeds=1, a='mz', b='mlp',
                            models=dict(mz=dict(r2=0.6, r2_std=math.nan, seeds=1),
                                        mlp=dict(r2=0.5, r2_std=0.02, seeds=2))),
                  n_train=8, seeds=2, command='python benchmarks/reproduce.py')
    out = tmp_path / 'out'
    save_claim(str(out), 'table1', 'converged', [record])
    report.write_summary(str(out), 0.1)
    text = (out / 'summary.md').read_text()
    head, models = text.split('## Every model, every cell')
    header = head.split('| claim |')[0]  # above the table
    assert 'sample standard deviation over seeds (ddof 1' in header
    assert 'sample standard deviation over seeds (ddof 1' in models.split('\n- ')[0]
    assert '- table1 L=4 (converged): mz 0.600 ± n/a, mlp 0.500 ± 0.020; paper: Table 1' in models


def test_summary_table_counts_diverged_runs_apart_from_early_stopped_ones():
    from torch_mz.reproduce.report import summary_table
    record = dict(claim='c', paper=dict(value=0.5, source='Table 1'),
                  ours=dict(mean=0.1, std=0.02), verdict='inconclusive', budget='converged',
                  n_train=5000, seeds=2,
                  epochs_run=dict(min=3, max=80, stopped_early=2, diverged=1, runs=4))
    row = summary_table([record]).strip().split('\n')[-1]
    assert '| 3-80 (2/4 stopped early, 1 diverged; at the epoch cap: not recorded) |' in row
    record['epochs_run'] = dict(min=50, max=80, stopped_early=4, runs=4)  # older records
    assert ('| 50-80 (4/4 stopped early; at the epoch cap: not recorded) |'
            in summary_table([record]))


def test_summary_table_tells_no_run_at_the_cap_from_a_count_not_recorded():
    # both showed nothing after the epochs figures: a reader could not tell a row whose runs
    # all stopped early from a record written before the runs at the cap were counted
    from torch_mz.reproduce.report import summary_table
    record = dict(claim='c', paper=dict(value=0.5, source='Table 1'),
                  ours=dict(mean=0.1, std=0.02), verdict='inconclusive', budget='converged',
                  n_train=5000, seeds=2,
                  epochs_run=dict(min=50, max=80, stopped_early=4, runs=4, at_cap={}))
    assert '| 50-80 (4/4 stopped early; at the epoch cap: none) |' in summary_table([record])
    del record['epochs_run']['at_cap']
    assert ('| 50-80 (4/4 stopped early; at the epoch cap: not recorded) |'
            in summary_table([record]))
    record['epochs_run']['at_cap'] = {'mz': 1}
    assert '| 50-80 (4/4 stopped early; at the epoch cap: mz 1) |' in summary_table([record])


def test_summary_names_each_claims_command(tmp_path):
    step = tmp_path / 'training_step.json'
    step.write_text(json.dumps(dict(
        environment=dict(command='python benchmarks/training_step.py --rounds 3'),
        rows=[dict(model='rigid', params=100, step_s=1.0, step_times_s=[1.0, 1.1],
                   infer_s=1.0, infer_times_s=[1.0, 1.0]),
              dict(model='mz', params=190, step_s=2.2, step_times_s=[2.2, 2.3],
                   infer_s=5.0, infer_times_s=[5.0, 5.1])])))
    out = tmp_path / 'out'
    save_claim(str(out), 'table30', 'converged', overhead_records(str(step), 'converged'))
    other = dict(overhead_records(str(step), 'converged')[0], claim='table1 L=4: a gap',
                 command='python benchmarks/reproduce.py --budget converged --claims table1')
    save_claim(str(out), 'table1', 'converged', [other])
    report.write_summary(str(out), 0.1)
    text = (out / 'summary.md').read_text()
    commands = text.split('## Commands')[1].split('## Verdict rule')[0]
    assert ('- table30: `python benchmarks/training_step.py --rounds 3 && python '
            'benchmarks/reproduce.py --budget converged --claims table30`') in commands
    assert ('- table1: `python benchmarks/reproduce.py --budget converged --claims table1`'
            in commands)


def test_table30_names_a_row_without_its_figures(tmp_path):
    # a row without 'params' (or a figure that is not a number) was a bare KeyError
    step = tmp_path / 'training_step.json'
    step.write_text(json.dumps(dict(rows=[dict(model='rigid'), dict(model='mz')])))
    with pytest.raises(ValueError, match="have no usable 'params' figures in rows 'mz' and "
                                         "'rigid' .KeyError"):
        overhead_records(str(step), 'converged')
    # an environment that is no object, a model that is no name: named too (an AttributeError
    # and a TypeError stopped every claim; found by the review)
    for damaged in (dict(rows=[dict(model='rigid')], environment=['cmd']),
                    dict(rows=[dict(model=['rigid'])])):
        step.write_text(json.dumps(damaged))
        with pytest.raises(ValueError, match="naming their 'model' .and an 'environment' "):
            overhead_records(str(step), 'converged')


def test_a_claim_file_whose_records_lack_the_summarys_fields_is_named(tmp_path):
    # valid JSON, a list of dicts, but not claim records: the summary failed with a KeyError
    # after the training
    folder = tmp_path / 'claims'
    folder.mkdir()
    (folder / 'table3.converged.json').write_text(json.dumps([dict(claim='table3 x')]))
    with pytest.raises(ValueError, match=r"table3.converged.json' holds records without "
                                         r"budget, ours.mean, ours.std, paper.source"):
        load_claims(str(tmp_path))
    # fields of the wrong type, which the tables read after the training (found by the review)
    whole = dict(claim='table3 x', verdict='reproduced', budget='converged',
                 paper=dict(value=0.5, source='Table 3', text='0.5'), ours=dict(mean=0.4, std=0.1))
    for damage, named in ((dict(paper=dict(whole['paper'], value='0.5')), 'paper.value'),
                          (dict(epochs_run=dict(min=1)), 'epochs_run'),
                          (dict(epochs_run=dict(min=1, max=2, stopped_early=0, runs=2,
                                                at_cap=['mz'])), 'epochs_run.at_cap'),
                          (dict(ours=dict(whole['ours'], models=dict(mz=dict(r2=0.4)))),
                           'ours.models'),
                          (dict(ours=dict(whole['ours'], models=dict(
                              mz=dict(r2='0.4', r2_std=0.1)))), 'ours.models'),
                          (dict(command=['python', 'benchmarks/reproduce.py']), 'command')):
        (folder / 'table3.converged.json').write_text(json.dumps([dict(whole, **damage)]))
        with pytest.raises(ValueError, match=r'holds records without .*' + named):
            load_claims(str(tmp_path))
    (folder / 'table3.converged.json').write_text(json.dumps([whole]))
    assert load_claims(str(tmp_path))[0]['claim'] == 'table3 x'
    # (a model's null R² is a NaN as save_claim writes it: read back as NaN, not refused)
    (folder / 'table3.converged.json').write_text(json.dumps([dict(whole, ours=dict(
        whole['ours'], models=dict(mz=dict(r2=None, r2_std=None))))]))
    assert math.isnan(load_claims(str(tmp_path))[0]['ours']['models']['mz']['r2'])


def test_a_claim_with_a_nan_figure_is_kept_as_standard_json_and_summarised_as_before(tmp_path):
    # save_claim wrote the bare word NaN; now null, which load_claims reads back as NaN, so
    # that the summary's tables and verdicts are those of the records as they were made (a
    # model's null R² had been refused as a damaged file, and crashed the models' table)
    nan = math.nan
    records = [dict(claim='t4 a: R²(mz) - R²(mlp)', verdict='inconclusive', budget='tiny',
                    paper=dict(value=0.1, source='Table 4', text='mz 0.9, mlp 0.8'),
                    ours=dict(mean=nan, std=nan, seeds=1, a='mz', b='mlp',
                              models=dict(mz=dict(r2=nan, r2_std=nan, seeds=1),
                                          mlp=dict(r2=0.5, r2_std=0.0, seeds=1))),
                    epochs_run=dict(min=1, max=2, stopped_early=0, diverged=1, runs=2),
                    n_train=8, seeds=1, command='python benchmarks/reproduce.py')]
    path = save_claim(str(tmp_path), 't4', 'tiny', records)

    def refuse(word):
        raise ValueError(f'not standard JSON: {word}')
    with open(path) as f:
        stored = json.loads(f.read(), parse_constant=refuse)
    assert stored[0]['ours']['mean'] is None and stored[0]['ours']['models']['mz']['r2'] is None
    loaded = load_claims(str(tmp_path))
    assert summary_table(loaded) == summary_table(records)
    assert reproduce.models_table(loaded) == reproduce.models_table(records)
    assert 'n/a ± n/a | **inconclusive**' in summary_table(loaded)
    assert 'mz n/a ± n/a, mlp 0.500 ± 0.000' in reproduce.models_table(loaded)
    assert math.isnan(loaded[0]['ours']['models']['mz']['r2'])
