import json
import re
import sys
from dataclasses import replace

import pytest
import torch

from torch_mz.reproduce import CLAIM_NAMES, CLAIMS, Reproduction

from tests.reproduce._common import TINY, SUM, CLAIM


def test_time_limit_option_reads_minutes_or_hours_and_minutes():
    import argparse
    from tests._scripts import load_script
    duration = load_script('reproduce').duration
    assert duration('90') == 5400.0 and duration('7.5') == 450.0
    assert duration('1:30') == 5400.0 and duration('2:50:15') == 10215.0
    for bad in ('', 'abc', '1:75', '1:2:3:4', '0', '-5', 'inf', '1:-1', '-0:30', '-1:30'):
        with pytest.raises(argparse.ArgumentTypeError):
            duration(bad)


def test_carry_needs_a_time_limit(tmp_path, capsys):
    from tests._scripts import load_script
    with pytest.raises(SystemExit) as e:
        load_script('reproduce').main(['--carry', '--out', str(tmp_path)])
    assert e.value.code == 2 and '--carry needs --time-limit' in capsys.readouterr().err


def test_a_seed_count_below_one_is_refused_not_replaced(tmp_path, capsys):
    # --seeds -1 counted negative runs in --status; --seeds 0 fell back to the budget's count
    from tests._scripts import load_script
    for bad in ('-1', '0'):
        with pytest.raises(SystemExit) as e:
            load_script('reproduce').main(['--status', '--seeds', bad, '--out', str(tmp_path)])
        assert e.value.code == 2 and 'expected an integer >= 1' in capsys.readouterr().err
    with pytest.raises(ValueError, match="'seeds' must be an integer >= 1 or None"):
        Reproduction(TINY, str(tmp_path), device='cpu', seeds=0)


def test_status_calibrate_times_the_models_without_runs(tmp_path, monkeypatch, capsys):
    from tests._scripts import load_script
    script = load_script('reproduce')
    repro = Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    deepsets, mlp = CLAIM.models
    # a real timing: a positive figure, cached, on one thread, and nothing stored by it
    threads = torch.get_num_threads()
    seconds = repro.timed_epoch('sum', deepsets, steps=1)
    assert seconds > 0 and repro.timed_epoch('sum', deepsets) == seconds
    assert torch.get_num_threads() == threads  # restored
    assert not list(tmp_path.rglob('*.json')) and not list(tmp_path.rglob('*.pt'))
    with pytest.raises(ValueError, match='steps'):
        repro.timed_epoch('sum', mlp, steps=0)

    # the estimate's arithmetic, with made-up times per epoch (an hour and two): no finished
    # run anywhere, so a run counts the budget's maximum of epochs
    per_epoch = {deepsets: 3600.0, mlp: 7200.0}
    monkeypatch.setattr(Reproduction, 'timed_epoch',
                        lambda self, task, spec, steps=3: per_epoch[spec])
    assert repro.status(CLAIM)[0].get('estimated_s') is None  # only when asked
    sweep, after = repro.status(CLAIM, calibrate=True)
    assert sweep['left_s'] is None and sweep['timed'] == sorted(CLAIM.models)
    assert sweep['estimated_s'] == pytest.approx(3 * 3 * 3600 * TINY.epochs)  # 3 grid points
    assert after['note'] == 'after the sweep' and after['timed'] == sorted(CLAIM.models)
    assert after['estimated_s'] == pytest.approx(3 * 3600 * TINY.epochs * 2 * 2)  # cells, seeds
    # two claims with the same runs: the totals count each run once (9 + 12 h)
    twin = replace(CLAIM, name='twin')
    for claims in ([CLAIM], [CLAIM, twin]):
        script.print_status(repro, claims, calibrate=True)
        assert 'with the models timed now: about 21.0 h' in capsys.readouterr().out

    # one model's sweep done: its runs counted as they stand (known times), the other's
    # unknown and estimated
    repro.sweep('sum', [deepsets])
    sweep, after = repro.status(CLAIM, calibrate=True)
    assert sweep['timed'] == [mlp] and sweep['estimated_s'] == pytest.approx(3 * 7200)
    # (its seed-0 run on the sweep cell at the chosen point is the sweep's own run: done)
    assert (after['done'], after['pending'], after['unknown']) == (1, 3, 4)
    assert after['note'] == 'after the sweep'
    mean_wall, _ = repro.store.mean_time('sum', deepsets)
    assert after['left_s'] == pytest.approx(3 * mean_wall)
    assert after['estimated_s'] == pytest.approx(3 * mean_wall + 4 * 7200 * 1.0)
    assert repro.store.mean_epochs() == pytest.approx(TINY.epochs)

    # every sweep done: the finished runs give the times, nothing is timed, the estimate is
    # the plain one
    repro.sweep('sum', CLAIM.models)
    sweep, runs = repro.status(CLAIM, calibrate=True)
    assert sweep['estimated_s'] == 0.0 and runs['timed'] == [] and runs['unknown'] == 0
    assert runs['estimated_s'] == pytest.approx(runs['left_s']) and runs['left_s'] > 0
    script.print_status(repro, [CLAIM], calibrate=True)
    printed = capsys.readouterr().out
    assert 'with the models timed now: about' in printed
    # the model whose finished runs took longest per epoch, timed (made-up figures here)
    assert re.search(r'check: \S+ on sum timed now at (3600|7200)\.0 s per epoch', printed)

    # a model that cannot be timed: said, left out of the estimate, the status goes on
    def failing(self, task, spec, steps=3):
        raise RuntimeError('no data here')
    monkeypatch.setattr(Reproduction, 'timed_epoch', failing)
    fresh = Reproduction(TINY, str(tmp_path / 'other'), device='cpu', sweep_cells={'sum': SUM})
    script.print_status(fresh, [CLAIM], calibrate=True)
    printed = capsys.readouterr().out
    assert 'could not time deepsets:hidden_channels=8 on sum: RuntimeError: no data' in printed
    assert 'run(s) whose model could not be timed' in printed
    with pytest.raises(SystemExit):
        script.main(['--calibrate', '--out', str(tmp_path)])


def test_status_file_holds_what_status_prints(tmp_path, monkeypatch, capsys):
    from tests._scripts import load_script
    script = load_script('reproduce')
    path = tmp_path / 'notes' / 'status.md'
    argv = ['--budget', 'quick', '--claims', 'table1', '--out', str(tmp_path / 'out'),
            '--status']
    monkeypatch.setattr(sys, 'argv', ['benchmarks/reproduce.py'] + argv
                        + ['--status-file', str(path)])  # as the command line gives them
    assert script.main(argv + ['--status-file', str(path)]) == 0
    printed = capsys.readouterr().out
    text = path.read_text()
    assert text.startswith('# Where the claims stand (quick budget), ')
    assert 'Command: `' in text and '--status-file' in text
    body = text.split('```\n')[1]
    assert 'table1 (quick):' in body and 'known runs: about' in body
    assert printed.startswith(body.rstrip('\n'))  # the same lines, the path after them
    assert not (tmp_path / 'out').exists() or not list((tmp_path / 'out').rglob('*.json'))
    (tmp_path / 'afile').write_text('x')
    for bad, needle in ((['--status-file', str(path)], '--status-file goes with --status'),
                        (['--status', '--status-file', str(tmp_path)], 'is a folder'),
                        (['--status', '--status-file', ''], 'needs a path'),
                        (['--status', '--status-file', str(tmp_path / 'afile' / 's.md')],
                         'cannot make its folder')):
        with pytest.raises(SystemExit) as stop:
            script.main(['--budget', 'quick', '--claims', 'table1', '--out',
                         str(tmp_path / 'out')] + bad)
        assert stop.value.code == 2 and needle in capsys.readouterr().err


def test_command_lines_that_cannot_work_are_refused_before_any_run(tmp_path, capsys):
    from tests._scripts import load_script
    script = load_script('reproduce')
    afile = tmp_path / 'afile'
    afile.write_text('')
    cases = [(['--claims', ','], '--claims names no claim'),
             (['--claims', 'table1,table1'], '--claims names table1 twice'),
             (['--out', str(afile)], 'is a file, not a results folder'),
             (['--status', '--out', str(afile)], 'is a file, not a results folder'),
             (['--device', 'bogus'], '--device:')]
    if not torch.cuda.is_available():
        cases.append((['--device', 'cuda'], 'CUDA is not available'))
    for argv, message in cases:
        argv = argv if '--out' in argv else argv + ['--out', str(tmp_path / 'out')]
        with pytest.raises(SystemExit) as e:
            script.main(['--budget', 'quick'] + argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err, (argv, err)
    assert not (tmp_path / 'out').exists()


def test_runs_table_prints_which_earlier_figures_it_removed(tmp_path, monkeypatch, capsys):
    # without matplotlib the figures README links were removed with only "wrote ...md, .json"
    # printed: write_runs_table's notes on them are printed
    from tests._scripts import load_script
    script = load_script('reproduce')
    out = tmp_path / 'out'

    def writes(repro, claims, folder, on_note=None, every=None):
        on_note("matplotlib is not installed: no plot; removed the figure an earlier run "
                "drew, 'x.png'")
        return str(out / 'finished_runs.quick')
    monkeypatch.setattr(script, 'write_runs_table', writes)
    assert script.main(['--budget', 'quick', '--claims', 'table1-protocol', '--runs-table',
                        '--out', str(out)]) == 0
    printed = capsys.readouterr().out
    assert "removed the figure an earlier run drew, 'x.png'" in printed


def test_runs_table_with_other_seeds_leaves_the_budgets_table_as_it_is(tmp_path, monkeypatch,
                                                                      capsys):
    # --runs-table --seeds 1 wrote over finished_runs.<budget>.{md,json} with one seed's runs
    from tests._scripts import load_script
    script = load_script('reproduce')
    out = tmp_path / 'out'
    import torch_mz.reproduce.report as report
    monkeypatch.setattr(Reproduction, 'finished_runs', lambda self, claim: [
        dict(cell='L=16', model='mz-1l', lr=1e-4, weight_decay=1e-5, seed=k, r2=0.5, paper=None,
             epochs_run=2, best_epoch=1, stopped_early=False, val_loss_curve=[2.0, 1.0])
        for k in range(self.seeds or self.budget.seeds)])
    monkeypatch.setattr(Reproduction, 'sweep_landscape', lambda self, task, models: [])
    no_matplotlib = lambda: (_ for _ in ()).throw(ImportError('no matplotlib'))  # noqa: E731
    monkeypatch.setattr(report, 'pyplot', no_matplotlib)
    monkeypatch.setattr('torch_mz.study.plots.pyplot', no_matplotlib)
    # (every claim: --claims naming some writes their table beside the budget's, below)
    main = ['--budget', 'quick', '--runs-table', '--out', str(out)]
    assert script.main(main) == 0
    every = (out / 'finished_runs.quick.md').read_bytes()
    assert b'| 0 1 |' in every  # both seeds
    capsys.readouterr()
    assert script.main(main + ['--seeds', '1']) == 0
    assert f"wrote {out / 'finished_runs.quick.seeds1'}.md, .json" in capsys.readouterr().out
    assert (out / 'finished_runs.quick.md').read_bytes() == every
    assert 'Written with `--seeds 1`' in (out / 'finished_runs.quick.seeds1.md').read_text()


def test_runs_table_of_some_claims_leaves_the_budgets_table_as_it_is(tmp_path, monkeypatch,
                                                                     capsys):
    # --runs-table --claims table1-protocol wrote over finished_runs.<budget>.{md,json} with that
    # claim's runs alone (as --seeds N did with its seeds'): every other claim's rows were lost
    from tests._scripts import load_script
    script = load_script('reproduce')
    out = tmp_path / 'out'
    import torch_mz.reproduce.report as report
    monkeypatch.setattr(Reproduction, 'finished_runs', lambda self, claim: [
        dict(cell=claim.cells[0]['label'], model=claim.models[0], lr=1e-4, weight_decay=1e-5,
             seed=k, r2=0.5, paper=None, epochs_run=2, best_epoch=1, stopped_early=False,
             val_loss_curve=[2.0, 1.0]) for k in range(self.seeds or self.budget.seeds)])
    monkeypatch.setattr(Reproduction, 'sweep_landscape', lambda self, task, models: [])
    no_matplotlib = lambda: (_ for _ in ()).throw(ImportError('no matplotlib'))  # noqa: E731
    monkeypatch.setattr(report, 'pyplot', no_matplotlib)
    monkeypatch.setattr('torch_mz.study.plots.pyplot', no_matplotlib)
    main = ['--budget', 'quick', '--runs-table', '--out', str(out)]
    assert script.main(main) == 0  # every claim (table30 has no runs)
    table = out / 'finished_runs.quick.md'
    every = table.read_bytes()
    assert all(f'## {name}:'.encode() in every for name in CLAIMS)
    capsys.readouterr()
    some = ['--claims', 'table3,table1-protocol']
    assert script.main(main + some) == 0
    beside = out / 'finished_runs.quick.claims-table1-protocol+table3'
    assert f'wrote {beside}.md, .json' in capsys.readouterr().out
    assert table.read_bytes() == every
    text = (out / f'{beside.name}.md').read_text()
    assert 'Written with `--claims table1-protocol,table3`' in text
    assert '`finished_runs.quick.md`' in text
    assert [line[3:].split(':')[0] for line in text.splitlines() if line.startswith('## ')
            ] == ['table3', 'table1-protocol']  # (in the order given)
    assert json.loads((out / f'{beside.name}.json').read_text())['claims'] == [
        'table1-protocol', 'table3']
    # with --seeds too: beside both
    assert script.main(main + some + ['--seeds', '1']) == 0
    assert f'wrote {beside}.seeds1.md, .json' in capsys.readouterr().out
    assert table.read_bytes() == every
    # every claim named (in another order, table30 with them): the budget's table
    assert script.main(main + ['--claims', ','.join(reversed(CLAIM_NAMES))]) == 0
    assert f"wrote {out / 'finished_runs.quick'}.md, .json" in capsys.readouterr().out
    # table30 alone: no runs to list (it wrote an empty table over every run's)
    with pytest.raises(SystemExit) as e:
        script.main(main + ['--claims', 'table30'])
    assert e.value.code == 2 and '--claims table30 names no claim with runs' in \
        capsys.readouterr().err


def test_damaged_store_files_end_in_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    # --status and --runs-table raised the store's RecordError as a traceback; a damaged claim
    # file of another claim failed the summary after the whole training
    from tests._scripts import load_script
    from torch_mz.reproduce.store import RecordError
    script = load_script('reproduce')
    out = tmp_path / 'out'

    def damaged(*args, **kwargs):
        raise RecordError("run record 'x.json' cannot be read (Expecting value): restore it")
    monkeypatch.setattr(script, 'print_status', damaged)
    monkeypatch.setattr(script, 'write_runs_table', damaged)
    for flag in ('--status', '--runs-table'):
        code = script.main(['--budget', 'quick', '--claims', 'table1-protocol', flag,
                            '--out', str(out)])
        err = capsys.readouterr().err
        assert code == 2 and 'cannot be read' in err and 'Traceback' not in err, err
        assert err.count('\n') == 1
    claims = out / 'claims'
    claims.mkdir(parents=True)
    (claims / 'table3.quick.json').write_text('{"a":')
    assert script.main(['--budget', 'quick', '--claims', 'table1-protocol',
                        '--out', str(out)]) == 2
    err = capsys.readouterr().err
    assert 'table3.quick.json' in err and 'is not valid JSON' in err
    assert not list(out.rglob('records/quick/**/*.json'))  # nothing trained


def test_status_gives_the_epochs_of_each_unfinished_run(capsys):
    # "41 epochs into the unfinished ones" was the sum over two runs, read as each run's
    from tests._scripts import load_script
    script = load_script('reproduce')

    class Stub:
        budget = TINY

        def status(self, claim, calibrate=False):
            return [dict(stage='sweep', task='sum', done=1, training=2, started=0, pending=0,
                         epochs=41, epochs_each=[20, 21], left_s=None, unknown=0, again=0,
                         runs={}, open=[], note='')]

    script.print_status(Stub(), [CLAIM])
    assert '41 epochs into the unfinished ones (20, 21 by run)' in capsys.readouterr().out
    Stub.status = lambda self, claim, calibrate=False: [dict(
        stage='sweep', task='sum', done=1, training=1, started=1, pending=0, epochs=41,
        epochs_each=[0, 41], left_s=None, unknown=0, again=0, runs={}, open=[], note='')]
    script.print_status(Stub(), [CLAIM])  # (a run just begun counts, with 0)
    assert '41 epochs into the unfinished ones (0, 41 by run)' in capsys.readouterr().out


def test_a_damaged_table30_source_is_named_and_the_other_claims_run(tmp_path, monkeypatch,
                                                                    capsys):
    # the operator benchmark's file cut short: overhead_records' ValueError left main as a
    # traceback before any claim that trains had begun (table30 comes first by default)
    from tests._scripts import load_script
    script = load_script('reproduce')
    source = tmp_path / 'results' / script.TABLE30_SOURCES[0]
    source.mkdir(parents=True)
    (source / 'training_step.json').write_text('{"rows": [')
    monkeypatch.setattr(script, 'RESULTS', str(tmp_path / 'results'))
    ran = []

    def run_claims(repro, claims, **kwargs):
        ran.extend(c.name for c in claims)
        return iter(())
    monkeypatch.setattr(script, 'run_claims', run_claims)
    code = script.main(['--budget', 'quick', '--claims', 'table30,table1-protocol',
                        '--out', str(tmp_path / 'out')])
    err = capsys.readouterr().err
    assert code == 2 and ran == ['table1-protocol']
    assert 'table30 not run' in err and 'not valid JSON' in err and 'Traceback' not in err


def test_a_run_with_other_seeds_writes_its_claim_beside_the_budgets(tmp_path, monkeypatch,
                                                                     capsys):
    # --seeds 3 wrote claims/<claim>.<budget>.json and <claim>.<budget>.png over the
    # budget's own (the committed 2-seed figures gone, the file's name the same)
    import json
    import os
    from tests._scripts import load_script
    script = load_script('reproduce')
    out = tmp_path / 'out'

    def record(seeds, mean):
        return dict(claim='table1-protocol L=16: R²(mz-1l) - R²(st-4l)',
                    paper=dict(value=0.1, source='Table 1', text='Table 1'),
                    ours=dict(mean=mean, std=0.01), verdict='inconclusive', budget='quick',
                    n_train=128, seeds=seeds, command=f'--seeds {seeds}')

    def run_claims(repro, claims, **kwargs):
        for claim in claims:
            seeds = repro.seeds or 2  # (the quick budget's)
            yield claim, [record(seeds, 0.2 if seeds == 2 else 0.5)], None
    monkeypatch.setattr(script, 'run_claims', run_claims)

    def plot(claim, records, budget, path):  # (the bars' figure: the seeds it shows)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w') as f:
            f.write(str(records[0]['seeds']))
    monkeypatch.setattr(script, 'plot', plot)
    argv = ['--budget', 'quick', '--claims', 'table1-protocol', '--no-fused-kernels',
            '--out', str(out)]
    assert script.main(argv) == 0
    claims = out / 'claims'
    budgets = json.loads((claims / 'table1-protocol.quick.json').read_text())
    assert script.main([*argv, '--seeds', '2']) == 0  # (the budget's count: its own file)
    assert sorted(p.name for p in claims.glob('*.json')) == ['table1-protocol.quick.json']
    assert script.main([*argv, '--seeds', '3']) == 0
    assert json.loads((claims / 'table1-protocol.quick.json').read_text()) == budgets
    assert (out / 'table1-protocol.quick.png').read_text() == '2'
    beside = json.loads((claims / 'table1-protocol.quick.seeds3.json').read_text())
    assert beside[0]['seeds'] == 3 and beside[0]['ours']['mean'] == 0.5
    assert (out / 'table1-protocol.quick.seeds3.png').read_text() == '3'
    summary = json.loads((out / 'summary.json').read_text())
    assert [r['seeds'] for r in summary['records']] == [2, 3]  # both, the budget's first
    assert 'table1-protocol.quick.seeds3.json' in capsys.readouterr().out  # (to commit)


def test_an_interrupt_says_how_to_go_on_in_one_line(tmp_path, monkeypatch, capsys):
    # Ctrl-C (the stop the script is made to resume from) ended in a traceback
    import os
    import shlex
    from tests._scripts import load_script
    from torch_mz.reproduce import TimeLimit
    script = load_script('reproduce')
    out = tmp_path / 'out'
    records = out / 'records' / 'quick'

    def run_claims(repro, claims, **kwargs):  # a run finished, then the next one interrupted
        records.mkdir(parents=True)
        raise KeyboardInterrupt
        yield  # (a generator, as run_claims is)
    monkeypatch.setattr(script, 'run_claims', run_claims)
    argv = ['--budget', 'quick', '--claims', 'table1-protocol', '--no-fused-kernels',
            '--out', str(out)]
    try:
        code = script.main(argv)
    except KeyboardInterrupt:  # (caught here: pytest would take it for its own and stop)
        pytest.fail('the interrupt left main() as a traceback')
    assert code == 130
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'Traceback' not in err, err
    assert err.startswith('reproduce.py: interrupted; the finished runs are stored'), err
    command = shlex.join([os.path.basename(sys.executable), os.path.relpath(script.__file__),
                          *argv])  # (python benchmarks/reproduce.py --budget quick ...)
    assert (f'run the same command again to go on, {command} (the runs finished so far and the '
            f'checkpoints of those in progress: git add -A {os.path.relpath(records)})') in err
    # the time limit's hint, the same wording (without the command, as before)
    monkeypatch.setattr(script, 'run_claims', lambda repro, claims, **kwargs: iter(
        [(claims[0], None, TimeLimit('the time limit is reached'))]))
    assert script.main(argv) == script.EXIT_TIME_LIMIT
    assert (f'left for the next invocation (the time limit): table1-protocol; run the same '
            f'command again to go on (the runs finished so far and the checkpoints of those '
            f'in progress: git add -A {os.path.relpath(records)})') in capsys.readouterr().out


@pytest.mark.parametrize('device,how', [('auto', '--device auto found no CUDA device'),
                                        ('cpu', '--device cpu')])
def test_the_paper_budget_on_a_cpu_warns_before_any_run(tmp_path, monkeypatch, capsys, device,
                                                        how):
    # --budget paper --device auto on a machine without CUDA trained on the CPU without a word
    from tests._scripts import load_script
    script = load_script('reproduce')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    seen = []

    def run_claims(repro, claims, **kwargs):  # (nothing trains: what was printed before it)
        seen.append(capsys.readouterr().err)
        return iter(())
    monkeypatch.setattr(script, 'run_claims', run_claims)
    argv = ['--claims', 'table1-protocol', '--no-fused-kernels', '--out', str(tmp_path)]
    assert script.main(['--budget', 'paper', '--device', device, *argv]) == 0
    assert len(seen) == 1 and seen[0].count('\n') == 1
    assert f'--budget paper is meant for a GPU, and {how}: it trains on the CPU' in seen[0]
    assert script.main(['--budget', 'quick', '--device', device, *argv]) == 0
    assert 'meant for a GPU' not in seen[-1] + capsys.readouterr().err


def test_the_docstring_names_every_model_each_claim_trains():
    # the script's description of table4 left out film, which the claim trains (FiLM, the
    # paper's headline comparison on rotation matching) and compares with
    from torch_mz.reproduce import CLAIMS
    from tests._scripts import load_script
    doc = load_script('reproduce').__doc__.lower()
    listed = 0
    for name, claim in CLAIMS.items():
        start = doc.find(f'``{name}`` (')
        if start < 0:  # (the protocol claims are described in words)
            continue
        depth, end = 0, doc.index('(', start)
        for end in range(end, len(doc)):  # the entry: up to its closing bracket
            depth += {'(': 1, ')': -1}.get(doc[end], 0)
            if depth == 0:
                break
        entry = doc[start:end]
        missing = [m for m in claim.models if not re.search(rf'(?<![\w-]){re.escape(m)}(?![\w-])',
                                                            entry)]
        assert not missing, (name, missing)
        listed += 1
    assert listed >= 7
