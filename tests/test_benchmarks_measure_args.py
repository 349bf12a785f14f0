r"""The command lines of the measuring scripts in ``benchmarks/`` (``speed.py``,
``training_step.py``, ``scaling.py``, ``message_passing.py``): a mistaken option ends as argparse's
usage error (exit status 2, naming the option) before anything is measured, and nothing is
written empty or under another run's name; ``message_passing.py`` writes its report after every
row and resumes an interrupted run. Every measurement is replaced by a function that fails the
test (or by fake rows), so nothing here times anything."""
import json
import os
import sys

import pytest

from tests._scripts import BENCHMARKS, load_script, usage_error

ROOT = os.path.join(BENCHMARKS, '..')


def refuse(*args, **kwargs):
    raise AssertionError('measured before the command line was checked')


@pytest.fixture
def no_measuring(monkeypatch):
    r"""Every measurement the scripts import from :mod:`torch_mz.study` fails the test (the
    scripts run through :func:`runpy.run_path` import them afresh, so they get these)."""
    import torch_mz.study
    import torch_mz.study.traffic
    for name in ('in_fresh_process', 'matmul_peak_flops', 'time_call', 'time_interleaved',
                 'peak_memory_bytes', 'count_flops'):
        monkeypatch.setattr(torch_mz.study, name, refuse)
    monkeypatch.setattr(torch_mz.study.traffic, 'memory_bandwidth', refuse)


# --- speed.py --------------------------------------------------------------------------------

@pytest.mark.parametrize('argv, needles', [
    (['--models', 'rigid,foo'], ['--models', "'foo'"]),
    (['--blocks', 'pma,xyz'], ['--blocks', "'xyz'"]),
    (['--repeats', '0'], ['--repeats', "'0'"]),
    (['--sets', '0'], ['--sets', "'0'"]),
    (['--heads', '3'], ['--heads', '3 heads do not divide --dim 64']),
    (['--dim', '8', '--heads', '16'], ['--heads', '16 heads do not divide --dim 8']),
    (['--device', 'gpu'], ['--device', "'gpu'"]),
    (['--sigma', '-1'], ['--sigma', "'-1'"]),
    (['--sigma', '1000'], ['--sigma', 'the weights overflow']),
    (['--points', '8', '--sets', '16'], ['--points', '8 points', '--sets 16']),
])
def test_speed_refuses_mistakes_before_measuring(argv, needles, tmp_path, monkeypatch, capsys,
                                                 no_measuring):
    out = tmp_path / 'speed'
    usage_error('speed', argv + ['--out', str(out)], monkeypatch, capsys, *needles)
    assert not out.exists()


def test_speed_builds_no_unknown_model():
    speed = load_script('speed')
    with pytest.raises(ValueError, match="Unknown model 'foo'"):
        speed.build('foo', 'pma', 8, 2)
    with pytest.raises(ValueError, match="Unknown block 'isab'"):
        speed.build('rigid', 'isab', 8, 2)
    assert speed.build('mz-unfolded', 'pma', 8, 2) is not None


def test_speed_memory_is_that_of_the_call_after_an_untimed_one(monkeypatch):
    # run_one (--memory, a fresh process per configuration) measured the very first call, with
    # the process's one-time state in it
    speed = load_script('speed')
    calls, measured_after = [], []

    def step():
        calls.append(1)

    def peak(fn, device):
        measured_after.append(len(calls))
        fn()
        return 1234
    monkeypatch.setattr(speed, 'prepare', lambda cfg: (step, dict(model=cfg['model'])))
    monkeypatch.setattr(speed, 'peak_memory_bytes', peak)
    row = speed.run_one(dict(model='rigid', device='cpu'))
    assert row['peak_bytes'] == 1234
    assert measured_after == [1] and len(calls) == 2


def test_speed_plots_a_run_of_one_block(tmp_path):
    pytest.importorskip('matplotlib')
    speed = load_script('speed')
    rows = [dict(model=model, block='pma', batch=batch, median_ms=ms)
            for model, ms in (('rigid', 1.0), ('mz', 3.0)) for batch in ('uniform', 'skewed')]
    speed.plot(rows, str(tmp_path / 'speed.png'))
    assert (tmp_path / 'speed.png').stat().st_size > 0


@pytest.mark.parametrize('argv, repeats', [([], 7), (['--quick'], 3),
                                           (['--quick', '--repeats', '5'], 5),
                                           (['--repeats', '2'], 2)])
def test_speed_quick_leaves_a_given_repeats_and_records_what_ran(argv, repeats, tmp_path,
                                                                  monkeypatch):
    # --quick replaced a --repeats given with 3, while the results' config still said the
    # number given: a record of 5 (or 7) repeats of rows timed 3 times
    speed = load_script('speed')
    ran = []

    def fake_interleaved(cfgs):
        ran.extend(cfg['repeats'] for cfg in cfgs)
        return [dict(model=cfg['model'], block=cfg['block'], batch=cfg['batch'], max_set=1,
                     min_set=1, params=1, median_ms=1.0, times_ms=[1.0] * cfg['repeats'],
                     gflop=1.0, gflop_per_s=1.0) for cfg in cfgs]
    monkeypatch.setattr(speed, 'run_interleaved', fake_interleaved)
    monkeypatch.setattr(speed, 'matmul_peak_flops', lambda device=None: 1e10)
    monkeypatch.setattr(speed, 'plot', lambda rows, path: None)
    out = tmp_path / 'speed'
    monkeypatch.setattr(sys, 'argv', ['speed.py', '--models', 'rigid', '--blocks', 'pma',
                                      '--device', 'cpu', '--out', str(out)] + argv)
    speed.main()
    data = json.loads((out / 'speed.json').read_text())
    assert ran == [repeats, repeats]  # the uniform and the skewed batch
    assert data['config']['repeats'] == repeats
    assert all(len(r['times_ms']) == repeats for r in data['rows'])


@pytest.mark.parametrize('peaks', [dict(pyg=None, rigid=None), dict(pyg=0, rigid=2**20)])
def test_speed_memory_where_the_peak_is_unknown_or_zero(peaks, tmp_path, monkeypatch):
    # peak_memory_bytes gives None where it cannot read the peak (not Linux): None / 2**20
    # raised after the timings; a zero peak of pyg gave a ratio to 1e-9 MiB
    speed = load_script('speed')

    def fake_interleaved(cfgs):
        return [dict(model=cfg['model'], block=cfg['block'], batch=cfg['batch'], max_set=1,
                     min_set=1, params=1, median_ms=1.0, times_ms=[1.0], gflop=1.0,
                     gflop_per_s=1.0) for cfg in cfgs]
    monkeypatch.setattr(speed, 'run_interleaved', fake_interleaved)
    monkeypatch.setattr(speed, 'measure_memory', lambda cfg: peaks[cfg['model']])
    monkeypatch.setattr(speed, 'matmul_peak_flops', lambda device=None: 1e10)
    monkeypatch.setattr(speed, 'plot', lambda rows, path: None)
    out = tmp_path / 'speed'
    monkeypatch.setattr(sys, 'argv', ['speed.py', '--models', 'pyg,rigid', '--blocks', 'pma',
                                      '--device', 'cpu', '--memory', '--out', str(out)])
    speed.main()
    data = json.loads((out / 'speed.json').read_text())
    assert [r['peak_mib'] for r in data['rows'] if r['model'] == 'rigid'] == [
        None if peaks['rigid'] is None else 1.0] * 2
    assert all(r['rigid/pyg memory'] is None for r in data['ratios'])


def fake_speed_rows(cfgs):
    return [dict(model=cfg['model'], block=cfg['block'], batch=cfg['batch'], max_set=1,
                 min_set=1, params=1, median_ms=2.0 if cfg['model'] == 'pyg' else 1.0,
                 times_ms=[1.0] * cfg['repeats'], gflop=1.0, gflop_per_s=1.0) for cfg in cfgs]


def test_speed_keeps_the_pairs_measured_before_ctrl_c_and_resumes(tmp_path, monkeypatch,
                                                                  capsys):
    # the report was written once, after the last (block, batch) pair: Ctrl-C (or a failure
    # late in the run) lost every pair measured
    from torch_mz.study import EXIT_INTERRUPTED
    speed = load_script('speed')
    calls: list = []

    def fake_interleaved(cfgs):
        pair = (cfgs[0]['block'], cfgs[0]['batch'])
        if pair == ('sab', 'uniform') and 'stopped' not in calls:
            calls.append('stopped')
            raise KeyboardInterrupt
        calls.append(pair)
        return fake_speed_rows(cfgs)
    peaks = [1e10, 3e10]  # a resumed run keeps the peak its kept rows' pct_of_peak used
    monkeypatch.setattr(speed, 'run_interleaved', fake_interleaved)
    monkeypatch.setattr(speed, 'measure_memory', lambda cfg: 2**20)
    monkeypatch.setattr(speed, 'matmul_peak_flops', lambda device=None: peaks.pop(0))
    monkeypatch.setattr(speed, 'plot', lambda rows, path: None)
    out = tmp_path / 'speed'
    out.mkdir()
    earlier = out / 'speed.json'
    earlier.write_text('{"rows": []}')  # an earlier run's complete report: left alone
    argv = ['speed.py', '--models', 'pyg,rigid', '--device', 'cpu', '--repeats', '2',
            '--memory', '--out', str(out)]
    monkeypatch.setattr(sys, 'argv', argv)
    try:
        assert speed.main() == EXIT_INTERRUPTED
    except KeyboardInterrupt:
        pytest.fail('Ctrl-C ended speed.py with a traceback')
    err = capsys.readouterr().err.strip()
    partial = out / 'speed.partial.json'
    assert len(err.splitlines()) == 1 and str(partial) in err and '--resume' in err
    data = json.loads(partial.read_text())
    assert [(r['block'], r['batch'], r['model']) for r in data['rows']] == [
        ('pma', 'uniform', 'pyg'), ('pma', 'uniform', 'rigid'), ('pma', 'skewed', 'pyg'),
        ('pma', 'skewed', 'rigid')]
    assert data['pending'] == 2 and len(data['ratios']) == 2
    assert 'Partial: 2 more (block, batch) pair(s)' in (out / 'speed.partial.md').read_text()
    assert earlier.read_text() == '{"rows": []}'
    # without --resume or --overwrite the partial report is not replaced
    usage_error('speed', argv[1:], monkeypatch, capsys, 'interrupted run', '--resume',
                '--overwrite')
    usage_error('speed', argv[1:] + ['--resume', '--sets', '32'], monkeypatch, capsys,
                'other settings', 'sets 64 there, 32 here',
                f"is the partial report of another command (`{data['environment']['command']}`)",
                '--resume --sets 32`) would replace')
    usage_error('speed', argv[1:] + ['--resume', '--overwrite'], monkeypatch, capsys,
                '--overwrite: not allowed with --resume')
    # the same options under another thread count (no option sets it: OMP_NUM_THREADS): the
    # pairs kept and the pairs measured now were put in one table, timed with other threads
    import torch
    with monkeypatch.context() as m:
        m.setattr(torch, 'get_num_threads', lambda: data['environment']['threads'] + 2)
        usage_error('speed', argv[1:] + ['--resume'], monkeypatch, capsys, 'other settings',
                    f"threads {data['environment']['threads']} there")
    assert json.loads(partial.read_text()) == data
    monkeypatch.setattr(sys, 'argv', argv + ['--resume'])
    calls[:] = ['stopped']
    assert speed.main() is None
    assert calls == ['stopped', ('sab', 'uniform'), ('sab', 'skewed')]  # (the kept not again)
    result = json.loads(earlier.read_text())
    assert [(r['block'], r['batch'], r['model']) for r in result['rows']] == [
        (block, batch, model) for block in ('pma', 'sab') for batch in ('uniform', 'skewed')
        for model in ('pyg', 'rigid')]
    assert all(r['pct_of_peak'] == pytest.approx(10.0) for r in result['rows'])  # 1 of 10
    assert result['matmul_peak_gflop_per_s'] == 10.0
    assert [r['pyg/rigid time'] for r in result['ratios']] == [2.0] * 4
    # the complete report as before (and the pairs kept, which it names since 2026-12-07: the
    # Markdown alone gave their number), no --resume / --overwrite in its config
    assert sorted(result) == ['config', 'environment', 'kept_pairs', 'matmul_peak_gflop_per_s',
                              'ratios', 'replaces_partial', 'rows']
    assert result['kept_pairs'] == [dict(block='pma', batch='uniform'),
                                    dict(block='pma', batch='skewed')]
    assert ('2 of the (block, batch) pairs (pma uniform, pma skewed) were measured by the run '
            'resumed') in (out / 'speed.md').read_text()
    assert 'resume' not in result['config'] and 'overwrite' not in result['config']
    assert 'Partial' not in (out / 'speed.md').read_text()
    assert not partial.exists() and not (out / 'speed.partial.md').exists()
    # --overwrite measures every pair again where a partial report is found
    partial.write_text(json.dumps(data))
    monkeypatch.setattr(sys, 'argv', argv + ['--overwrite'])
    calls[:] = ['stopped']
    peaks.append(1e10)
    assert speed.main() is None
    assert len(calls) == 5 and not partial.exists()
    # a run of one call where nothing failed: the keys of every complete report before, and
    # the partial report it replaced
    assert sorted(json.loads(earlier.read_text())) == [
        'config', 'environment', 'matmul_peak_gflop_per_s', 'ratios', 'replaces_partial', 'rows']
    assert 'failed' not in (out / 'speed.md').read_text()


def speed_failing(monkeypatch, speed, fail_memory, fail_timings, stop=None):
    r"""``speed.py`` with fake measurements: the peak memory of the (block, batch, model) in
    :obj:`fail_memory` and the timings of the pairs in :obj:`fail_timings` fail (as out of
    memory does), the timings of the pair :obj:`stop` end with Ctrl-C once; returns the list of
    the pairs timed."""
    import torch

    from torch_mz.study import MeasurementFailed
    calls: list = []

    def fake_interleaved(cfgs):
        pair = (cfgs[0]['block'], cfgs[0]['batch'])
        if pair == stop and 'stopped' not in calls:
            calls.append('stopped')
            raise KeyboardInterrupt
        calls.append(pair)
        if pair in fail_timings:
            raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB\nmore')
        return fake_speed_rows(cfgs)

    def fake_memory(cfg):
        if (cfg['block'], cfg['batch'], cfg['model']) in fail_memory:
            raise MeasurementFailed('killed by signal 9 (out of memory?)')
        return 2**20
    monkeypatch.setattr(speed, 'run_interleaved', fake_interleaved)
    monkeypatch.setattr(speed, 'measure_memory', fake_memory)
    monkeypatch.setattr(speed, 'matmul_peak_flops', lambda device=None: 1e10)
    monkeypatch.setattr(speed, 'plot', lambda rows, path: None)
    return calls


def test_speed_lists_the_measurements_that_failed_and_completes_the_run(tmp_path, monkeypatch,
                                                                        capsys):
    # a failure (out of memory) in one pair ended the run with a traceback, and --resume made
    # that pair again and failed again: the complete report was never written
    speed = load_script('speed')
    speed_failing(monkeypatch, speed, fail_memory={('pma', 'skewed', 'rigid')},
                  fail_timings={('sab', 'uniform')})
    out = tmp_path / 'speed'
    monkeypatch.setattr(sys, 'argv', ['speed.py', '--models', 'pyg,rigid', '--device', 'cpu',
                                      '--repeats', '2', '--memory', '--out', str(out)])
    assert speed.main() is None
    assert not (out / 'speed.partial.json').exists()
    data = json.loads((out / 'speed.json').read_text())
    assert [(r['block'], r['batch'], r['model']) for r in data['rows']] == [
        ('pma', 'uniform', 'pyg'), ('pma', 'uniform', 'rigid'), ('pma', 'skewed', 'pyg'),
        ('sab', 'skewed', 'pyg'), ('sab', 'skewed', 'rigid')]
    assert data['failed'] == [
        dict(block='pma', batch='skewed', model='rigid',
             error='MeasurementFailed: killed by signal 9 (out of memory?)'),
        dict(block='sab', batch='uniform', model=None,
             error='OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB')]
    # the ratios of a pair to a model that failed there are left out (not made of other runs)
    ratios = {(r['block'], r['batch']): r for r in data['ratios']}
    assert ratios[('pma', 'uniform')]['pyg/rigid time'] == 2.0
    assert ratios[('sab', 'skewed')]['rigid/pyg memory'] == 1.0
    assert ratios[('pma', 'skewed')] == dict(block='pma', batch='skewed')
    assert ratios[('sab', 'uniform')] == dict(block='sab', batch='uniform')
    assert 'kept_pairs' not in data and 'pending' not in data
    text = (out / 'speed.md').read_text()
    assert 'Measurements that failed' in text and 'Partial' not in text
    assert '- pma, skewed, `rigid`, peak memory: MeasurementFailed: killed by signal 9' in text
    assert '- sab, uniform, the timings of every model (timed together): OutOfMemoryError' in text
    assert 'measurement(s) failed' in capsys.readouterr().err


def test_speed_resumes_a_partial_report_with_a_failure_and_makes_that_pair_again(
        tmp_path, monkeypatch):
    from torch_mz.study import EXIT_INTERRUPTED
    speed = load_script('speed')
    speed_failing(monkeypatch, speed, fail_memory={('pma', 'skewed', 'rigid')},
                  fail_timings={('sab', 'uniform')}, stop=('sab', 'skewed'))
    out = tmp_path / 'speed'
    argv = ['speed.py', '--models', 'pyg,rigid', '--device', 'cpu', '--repeats', '2',
            '--memory', '--out', str(out)]
    monkeypatch.setattr(sys, 'argv', argv)
    assert speed.main() == EXIT_INTERRUPTED
    partial = json.loads((out / 'speed.partial.json').read_text())
    assert len(partial['failed']) == 2 and partial['pending'] == 1
    assert 'and the 2 with a failure (below) again' in (out / 'speed.partial.md').read_text()
    # the failures are gone: --resume keeps the pair measured, makes the others again
    calls = speed_failing(monkeypatch, speed, fail_memory=set(), fail_timings=set())
    monkeypatch.setattr(sys, 'argv', argv + ['--resume'])
    assert speed.main() is None
    assert calls == [('pma', 'skewed'), ('sab', 'uniform'), ('sab', 'skewed')]
    data = json.loads((out / 'speed.json').read_text())
    assert 'failed' not in data and not (out / 'speed.partial.json').exists()
    assert data['kept_pairs'] == [dict(block='pma', batch='uniform')]
    assert [(r['block'], r['batch'], r['model']) for r in data['rows']] == [
        (block, batch, model) for block in ('pma', 'sab') for batch in ('uniform', 'skewed')
        for model in ('pyg', 'rigid')]
    assert [r['pyg/rigid time'] for r in data['ratios']] == [2.0] * 4


def test_speed_keeps_an_earlier_report_that_measured_what_fails_here(tmp_path, monkeypatch,
                                                                     capsys):
    # a complete run whose pair failed (out of memory) replaced the earlier complete report of
    # the same options that had measured it: those rows were lost without a word
    speed = load_script('speed')
    out = tmp_path / 'speed'
    argv = ['speed.py', '--models', 'pyg,rigid', '--blocks', 'pma', '--device', 'cpu',
            '--repeats', '2', '--memory', '--out', str(out)]
    complete, partial = out / 'speed.json', out / 'speed.partial.json'
    speed_failing(monkeypatch, speed, fail_memory=set(), fail_timings=set())
    monkeypatch.setattr(sys, 'argv', argv)
    assert speed.main() is None
    fuller = complete.read_text()
    speed_failing(monkeypatch, speed, fail_memory={('pma', 'uniform', 'rigid')},
                  fail_timings={('pma', 'skewed')})
    capsys.readouterr()
    assert speed.main() is None
    assert complete.read_text() == fuller  # kept: it measured them
    err = capsys.readouterr().err
    assert 'pma uniform `rigid`, pma skewed `pyg`, pma skewed `rigid` failed here' in err
    assert '--resume' in err and '--overwrite' in err
    data = json.loads(partial.read_text())
    assert data['lost'] == [dict(block='pma', batch='uniform', model='rigid'),
                            dict(block='pma', batch='skewed', model='pyg'),
                            dict(block='pma', batch='skewed', model='rigid')]
    assert data['pending'] == 0 and len(data['failed']) == 2
    assert [(r['batch'], r['model']) for r in data['rows']] == [('uniform', 'pyg')]
    text = (out / 'speed.partial.md').read_text()
    assert 'Partial: pma uniform `rigid`, pma skewed `pyg`, pma skewed `rigid` failed here' in text
    # without --resume or --overwrite the partial report is not replaced
    usage_error('speed', argv[1:], monkeypatch, capsys, 'interrupted run',
                'failed where the complete report beside it made them')
    # --resume measures the pairs with a failure again; failing again, the earlier report stays
    calls = speed_failing(monkeypatch, speed, fail_memory=set(), fail_timings={('pma', 'skewed')})
    monkeypatch.setattr(sys, 'argv', argv + ['--resume'])
    assert speed.main() is None
    assert calls == [('pma', 'uniform'), ('pma', 'skewed')]
    assert complete.read_text() == fuller
    assert json.loads(partial.read_text())['lost'] == [
        dict(block='pma', batch='skewed', model='pyg'),
        dict(block='pma', batch='skewed', model='rigid')]
    # measured at last: the complete report replaces the earlier one
    speed_failing(monkeypatch, speed, fail_memory=set(), fail_timings=set())
    assert speed.main() is None
    assert not partial.exists() and len(json.loads(complete.read_text())['rows']) == 4
    # --overwrite replaces it with a report of the failures, which a later run with the same
    # failure replaces too (that report measured nothing more)
    speed_failing(monkeypatch, speed, fail_memory=set(), fail_timings={('pma', 'skewed')})
    for extra in (['--overwrite'], []):
        monkeypatch.setattr(sys, 'argv', argv + extra)
        assert speed.main() is None
        data = json.loads(complete.read_text())
        assert len(data['rows']) == 2 and 'lost' not in data and not partial.exists()


@pytest.mark.parametrize('first, then', [
    (['--quick'], ['--repeats', '3']), (['--repeats', '3'], ['--quick']),
    (['--quick'], ['--quick', '--repeats', '3'])])
def test_speed_resumes_a_partial_report_of_the_same_resolved_settings(first, then, tmp_path,
                                                                     monkeypatch, capsys):
    # a --quick run's partial report was refused to a --resume given --repeats 3 instead
    # ("quick True there, False here"): the same 3 repeats, the same run
    speed = load_script('speed')
    out = tmp_path / 'speed'
    argv = ['speed.py', '--models', 'pyg,rigid', '--blocks', 'pma', '--device', 'cpu',
            '--out', str(out)]
    speed_failing(monkeypatch, speed, fail_memory=set(), fail_timings=set(),
                  stop=('pma', 'skewed'))
    monkeypatch.setattr(sys, 'argv', argv + first)
    assert speed.main() == speed.EXIT_INTERRUPTED
    calls = speed_failing(monkeypatch, speed, fail_memory=set(), fail_timings=set())
    monkeypatch.setattr(sys, 'argv', argv + then + ['--resume'])
    assert speed.main() is None
    assert calls == [('pma', 'skewed')]
    data = json.loads((out / 'speed.json').read_text())
    assert data['kept_pairs'] == [dict(block='pma', batch='uniform')]
    assert data['config']['repeats'] == 3
    # other repeats are another run: refused
    speed_failing(monkeypatch, speed, fail_memory=set(), fail_timings=set(),
                  stop=('pma', 'skewed'))
    monkeypatch.setattr(sys, 'argv', argv + first + ['--overwrite'])
    assert speed.main() == speed.EXIT_INTERRUPTED
    capsys.readouterr()
    usage_error('speed', argv[1:] + ['--quick', '--repeats', '5', '--resume'], monkeypatch,
                capsys, 'other settings', 'repeats 3 there, 5 here')


def test_speed_refuses_to_replace_the_complete_report_of_another_command(tmp_path, monkeypatch,
                                                                        capsys):
    # a run with other options replaced the complete report in --out at its end, unasked
    speed = load_script('speed')
    out = tmp_path / 'speed'
    argv = ['--models', 'pyg,rigid', '--device', 'cpu', '--repeats', '2', '--out', str(out)]
    calls = speed_failing(monkeypatch, speed, fail_memory=set(), fail_timings=set())
    monkeypatch.setattr(sys, 'argv', ['speed.py', '--blocks', 'pma'] + argv)
    assert speed.main() is None
    complete = out / 'speed.json'
    earlier = complete.read_text()
    command = json.loads(earlier)['environment']['command']
    capsys.readouterr()
    calls.clear()
    usage_error('speed', ['--blocks', 'sab'] + argv, monkeypatch, capsys,
                f'{complete} is the complete report of another command (`{command}`)',
                "blocks ['pma'] there, ['sab'] here", '--blocks sab',
                'pass --overwrite to replace it, or give another --out')
    assert calls == [] and complete.read_text() == earlier
    assert sorted(os.listdir(out)) == ['speed.json', 'speed.md']
    # --overwrite replaces it; so does a run of the same options (measuring them again), also
    # where the report gives a list as its text, as reports written before lists were parsed
    monkeypatch.setattr(sys, 'argv', ['speed.py', '--blocks', 'sab', '--overwrite'] + argv)
    assert speed.main() is None
    data = json.loads(complete.read_text())
    assert data['config']['blocks'] == ['sab']
    data['config'].update(blocks='sab', models='pyg,rigid')
    complete.write_text(json.dumps(data))
    calls.clear()
    monkeypatch.setattr(sys, 'argv', ['speed.py', '--blocks', 'sab'] + argv)
    assert speed.main() is None
    assert calls == [('sab', 'uniform'), ('sab', 'skewed')]
    assert json.loads(complete.read_text())['config']['blocks'] == ['sab']


def test_speed_resumed_after_ctrl_c_replaces_as_its_overwrite_asked(tmp_path, monkeypatch,
                                                                    capsys):
    # a run given --overwrite, stopped by Ctrl-C, goes on as its line says: the same with
    # --resume in place of --overwrite; that call then kept the earlier report where a pair
    # failed, its report left partial, and only a new --overwrite (every pair again) ended it
    speed = load_script('speed')
    out = tmp_path / 'speed'
    argv = ['speed.py', '--models', 'pyg,rigid', '--blocks', 'pma', '--device', 'cpu',
            '--repeats', '2', '--out', str(out)]
    complete, partial = out / 'speed.json', out / 'speed.partial.json'
    speed_failing(monkeypatch, speed, fail_memory=set(), fail_timings=set())
    monkeypatch.setattr(sys, 'argv', argv)
    assert speed.main() is None
    speed_failing(monkeypatch, speed, fail_memory=set(), fail_timings={('pma', 'skewed')},
                  stop=('pma', 'skewed'))
    monkeypatch.setattr(sys, 'argv', argv + ['--overwrite'])
    assert speed.main() == speed.EXIT_INTERRUPTED
    assert json.loads(partial.read_text())['overwrite'] is True
    assert '--resume' in capsys.readouterr().err
    calls = speed_failing(monkeypatch, speed, fail_memory=set(),
                          fail_timings={('pma', 'skewed')})
    monkeypatch.setattr(sys, 'argv', argv + ['--resume'])
    assert speed.main() is None
    assert calls == [('pma', 'skewed')] and not partial.exists()
    data = json.loads(complete.read_text())
    assert len(data['rows']) == 2 and data['failed'] and 'lost' not in data
    assert 'overwrite' not in data


def test_speed_takes_models_and_blocks_in_another_order_as_the_same_run(tmp_path, monkeypatch,
                                                                       capsys):
    # '--models rigid,pyg' was refused as another command where the report had 'pyg,rigid'
    speed = load_script('speed')
    out = tmp_path / 'speed'
    argv = ['speed.py', '--device', 'cpu', '--repeats', '2', '--out', str(out)]
    calls = speed_failing(monkeypatch, speed, fail_memory=set(), fail_timings=set())
    monkeypatch.setattr(sys, 'argv', argv + ['--models', 'pyg,rigid', '--blocks', 'pma,sab'])
    assert speed.main() is None
    calls.clear()
    monkeypatch.setattr(sys, 'argv', argv + ['--models', 'rigid, pyg', '--blocks', 'sab,pma'])
    assert speed.main() is None
    assert len(calls) == 4
    assert json.loads((out / 'speed.json').read_text())['config']['models'] == ['rigid', 'pyg']


def test_speed_writes_nothing_when_every_pair_failed(tmp_path, monkeypatch):
    speed = load_script('speed')
    speed_failing(monkeypatch, speed, fail_memory=set(),
                  fail_timings={('pma', 'uniform'), ('pma', 'skewed')})
    out = tmp_path / 'speed'
    out.mkdir()
    (out / 'speed.json').write_text('{"rows": []}')  # an earlier run's report: left alone
    monkeypatch.setattr(sys, 'argv', ['speed.py', '--models', 'pyg,rigid', '--blocks', 'pma',
                                      '--device', 'cpu', '--out', str(out)])
    with pytest.raises(SystemExit) as exit_:
        speed.main()
    assert 'no (block, batch) pair was measured' in str(exit_.value.code)
    assert (out / 'speed.json').read_text() == '{"rows": []}'
    assert sorted(os.listdir(out)) == ['speed.json']


def test_speed_keeps_the_traceback_of_an_error_that_is_no_failure_of_memory(tmp_path,
                                                                          monkeypatch):
    # every RuntimeError was listed as a failed pair and the run went on: a bug's (shapes that
    # do not match) gave a complete report with an exit status of 0
    speed = load_script('speed')
    speed_failing(monkeypatch, speed, fail_memory=set(), fail_timings=set())

    def broken(cfgs):
        raise RuntimeError('mat1 and mat2 shapes cannot be multiplied (8x64 and 32x64)')
    monkeypatch.setattr(speed, 'run_interleaved', broken)
    out = tmp_path / 'speed'
    monkeypatch.setattr(sys, 'argv', ['speed.py', '--models', 'pyg,rigid', '--blocks', 'pma',
                                      '--device', 'cpu', '--out', str(out)])
    with pytest.raises(RuntimeError, match='shapes cannot be multiplied'):
        speed.main()
    assert not (out / 'speed.json').exists()
    # the CPU allocator's error of memory (a plain RuntimeError) is a failure listed
    assert speed.out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert speed.out_of_memory(MemoryError()) and not speed.out_of_memory(TypeError('x'))


# --- training_step.py ------------------------------------------------------------------------

@pytest.mark.parametrize('argv, needles', [
    (['--models', 'foo'], ['--models', "'foo'", 'unknown preset']),
    (['--models', 'rigid,foo+keep'], ['--models', "'foo+keep'"]),
    (['--models', 'rigid,rigid'], ['--models', 'rigid given twice']),
    (['--models', ''], ['--models']),
    (['--rounds', '0'], ['--rounds', "'0'"]),
    (['--clouds', '0'], ['--clouds', "'0'"]),
    (['--points', '-4'], ['--points', "'-4'"]),
    (['--repeats', '0'], ['--repeats', "'0'"]),
    (['--threads', '0'], ['--threads', "'0'"]),
    (['--egnn-radius', '0'], ['--egnn-radius', "'0'"]),
    (['--device', 'gpu'], ['--device', "'gpu'"]),
])
def test_training_step_refuses_mistakes_before_measuring(argv, needles, tmp_path, monkeypatch,
                                                         capsys, no_measuring):
    out = tmp_path / 'training_step'
    usage_error('training_step', argv + ['--out', str(out)], monkeypatch, capsys, *needles)
    usage_error('training_step', argv + ['--flops-only', '--out', str(out)], monkeypatch,
                capsys, *needles)
    assert not out.exists()


@pytest.mark.parametrize('argv, clouds, repeats', [
    ([], 32, 5), (['--quick'], 8, 3), (['--quick', '--clouds', '2'], 2, 3),
    (['--quick', '--repeats', '1'], 8, 1), (['--quick', '--clouds', '4', '--repeats', '2'], 4, 2),
    (['--clouds', '16'], 16, 5)])
def test_training_step_quick_leaves_the_options_given(argv, clouds, repeats, tmp_path,
                                                      monkeypatch):
    # --quick replaced a --clouds or --repeats given with its own 8 clouds and 3 repeats
    script = load_script('training_step')
    seen = []
    monkeypatch.setattr(script, 'flops_only', lambda args: seen.append(vars(args)))
    monkeypatch.setattr(sys, 'argv', ['training_step.py', '--flops-only', '--models', 'rigid',
                                      '--out', str(tmp_path / 'ts')] + argv)
    script.main()
    assert [(a['clouds'], a['repeats']) for a in seen] == [(clouds, repeats)]


def test_training_step_writes_nothing_when_no_row_was_measured(tmp_path, monkeypatch):
    script = load_script('training_step')

    def fails(path, config, env=None):
        raise script.MeasurementFailed('out of memory')
    monkeypatch.setattr(script, 'in_fresh_process', fails)
    monkeypatch.setattr(script, 'matmul_peak_flops', lambda device=None: 1e10)
    monkeypatch.setattr(script, 'memory_bandwidth', lambda *a, **k: 1e10)
    out = tmp_path / 'training_step'
    monkeypatch.setattr(sys, 'argv', ['training_step.py', '--models', 'rigid,mz',
                                      '--out', str(out)])
    with pytest.raises(SystemExit) as exit_:
        script.main()
    assert 'no row was measured' in str(exit_.value.code)
    assert not out.exists()


def fake_step_row(name: str, repeats: int) -> dict:
    r"""What ``training_step.py --_one`` prints for a row (made-up figures)."""
    return dict(model=name, params=10, step_s=0.5, step_times_s=[0.5] * repeats,
                points_per_s=8.0, gflop_per_step=1.0, gflop_per_s=2.0, gb_per_step=1.0,
                infer_s=0.25, infer_times_s=[0.25] * repeats, infer_gflop=0.5, infer_gb=0.5,
                peak_rss_mib=100.0, first_calls_s=1.0, tanh_kernel_faster=None)


def test_training_step_reports_the_calls_of_each_row_and_the_rows_that_failed(tmp_path,
                                                                              monkeypatch):
    # a row that failed in some rounds was said to be the median of all R x N calls, and one
    # that failed in every round was left out of the report (only printed)
    script = load_script('training_step')

    def measure(path, config, env=None):
        name = config['name']
        calls.append(name)
        if name == 'egnn' or (name == 'mz' and calls.count('mz') == 2):
            raise script.MeasurementFailed('out of memory\nsecond line')
        return fake_step_row(name, config['args']['repeats'])
    calls: list = []
    monkeypatch.setattr(script, 'in_fresh_process', measure)
    monkeypatch.setattr(script, 'matmul_peak_flops', lambda device=None: 1e10)
    monkeypatch.setattr(script, 'memory_bandwidth', lambda *a, **k: 1e10)
    monkeypatch.setattr(script, 'plot', lambda rows, path: None)
    out = tmp_path / 'training_step'
    monkeypatch.setattr(sys, 'argv', ['training_step.py', '--models', 'rigid,mz,egnn',
                                      '--rounds', '3', '--repeats', '2', '--out', str(out)])
    script.main()
    data = json.loads((out / 'training_step.json').read_text())
    by = {r['model']: r for r in data['rows']}
    assert sorted(by) == ['mz', 'rigid']
    assert (by['rigid']['calls'], by['mz']['calls']) == (6, 4)
    assert (by['rigid']['rounds'], by['mz']['rounds']) == (3, 2)
    assert data['failed'] == [dict(model=m, round=k, error='out of memory')  # (in their order)
                              for m, k in (('egnn', 1), ('mz', 2), ('egnn', 2), ('egnn', 3))]
    text = (out / 'training_step.md').read_text()
    assert 'medians of all its 6 calls' not in text
    assert '| calls |' in text and '| 4 |' in text
    assert 'Calls that failed' in text
    assert '- `mz`, round 2: out of memory' in text
    assert '- `egnn`, round 1 (not in the table): out of memory' in text
    assert 'second line' not in text



def test_training_step_keeps_the_measurements_made_before_ctrl_c_and_resumes(tmp_path,
                                                                             monkeypatch,
                                                                             capsys):
    # the report was written once, after the last measurement: Ctrl-C (or a failure late in
    # the run) lost every row measured
    from torch_mz.study import EXIT_INTERRUPTED
    script = load_script('training_step')
    calls: list = []

    def measure(path, config, env=None):
        name = config['name']
        if name == 'egnn' and 'stopped' not in calls:
            calls.append('stopped')
            raise KeyboardInterrupt
        calls.append(name)
        row = fake_step_row(name, config['args']['repeats'])
        return dict(row, peak_rss_mib=float('nan')) if name == 'mz' else row  # (not read)
    monkeypatch.setattr(script, 'in_fresh_process', measure)
    monkeypatch.setattr(script, 'matmul_peak_flops', lambda device=None: 1e10)
    monkeypatch.setattr(script, 'memory_bandwidth', lambda *a, **k: 1e10)
    monkeypatch.setattr(script, 'plot', lambda rows, path: None)
    out = tmp_path / 'training_step'
    out.mkdir()
    earlier = out / 'training_step.json'
    earlier.write_text('{"rows": []}')  # an earlier run's complete report: left alone
    argv = ['training_step.py', '--models', 'rigid,mz,egnn', '--rounds', '2', '--repeats', '2',
            '--out', str(out)]
    monkeypatch.setattr(sys, 'argv', argv)
    try:
        assert script.main() == EXIT_INTERRUPTED
    except KeyboardInterrupt:
        pytest.fail('Ctrl-C ended training_step.py with a traceback')
    err = capsys.readouterr().err.strip()
    partial = out / 'training_step.partial.json'
    assert len(err.splitlines()) == 1 and str(partial) in err and '--resume' in err
    data = json.loads(partial.read_text())
    assert [r['model'] for r in data['rows']] == ['rigid', 'mz'] and data['pending'] == 4
    assert 'Partial: 4 more measurement(s)' in (out / 'training_step.partial.md').read_text()
    assert earlier.read_text() == '{"rows": []}'
    # without --resume or --overwrite the partial report is not replaced
    usage_error('training_step', argv[1:], monkeypatch, capsys, 'interrupted run', '--resume',
                '--overwrite')
    # (another command's: both named, as a complete report of other options names them)
    usage_error('training_step', argv[1:] + ['--resume', '--rounds', '3'], monkeypatch, capsys,
                'other settings', 'rounds 2 there, 3 here',
                f"argument --resume: {partial} is the partial report of another command "
                f"(`{data['environment']['command']}`)",
                '--out {} --resume --rounds 3`) would replace: pass --overwrite (in place of '
                '--resume)'.format(out))
    assert json.loads(partial.read_text()) == data
    monkeypatch.setattr(sys, 'argv', argv + ['--resume'])
    calls[:] = ['stopped']
    assert script.main() is None
    assert calls == ['stopped', 'egnn', 'rigid', 'mz', 'egnn']  # (round 1's kept rows not again)
    data = json.loads(earlier.read_text())
    assert [(r['model'], r['rounds'], r['calls']) for r in data['rows']] == [
        ('rigid', 2, 4), ('mz', 2, 4), ('egnn', 2, 4)]
    assert sorted(data) == ['config', 'environment', 'failed', 'matmul_peak_gflop_per_s',
                            'memory_bandwidth_gb_per_s', 'minutes', 'replaces_partial', 'rows']
    assert 'resume' not in data['config']
    assert 'Partial' not in (out / 'training_step.md').read_text()
    assert not partial.exists() and not (out / 'training_step.partial.md').exists()


def test_training_step_partial_report_counts_the_failed_measurements_resume_makes_again(
        tmp_path, monkeypatch, capsys):
    # the partial report said 4 more measurements were left where --resume made 5: the one
    # that failed was made again too, without a word
    script = load_script('training_step')
    calls: list = []

    def measure(path, config, env=None):
        name = config['name']
        calls.append(name)
        if name == 'mz' and calls.count('mz') == 1:
            raise script.MeasurementFailed('out of memory')
        if name == 'egnn' and not resumed:
            raise KeyboardInterrupt
        return fake_step_row(name, config['args']['repeats'])
    resumed = False
    monkeypatch.setattr(script, 'in_fresh_process', measure)
    monkeypatch.setattr(script, 'matmul_peak_flops', lambda device=None: 1e10)
    monkeypatch.setattr(script, 'memory_bandwidth', lambda *a, **k: 1e10)
    monkeypatch.setattr(script, 'plot', lambda rows, path: None)
    out = tmp_path / 'training_step'
    argv = ['training_step.py', '--models', 'rigid,mz,egnn', '--rounds', '2', '--repeats', '2',
            '--out', str(out)]
    monkeypatch.setattr(sys, 'argv', argv)
    assert script.main() == script.EXIT_INTERRUPTED
    assert ('Partial: 4 more measurement(s) (row x round) not made (the run was cut off or is '
            'still running; `--resume` makes the rest, and the 1 that failed (below) again)'
            in (out / 'training_step.partial.md').read_text())
    monkeypatch.setattr(sys, 'argv', argv + ['--resume'])
    calls[:], resumed = ['mz'], True  # (mz made in the run resumed: it fails no more)
    assert script.main() is None
    assert calls[1:] == ['mz', 'egnn', 'rigid', 'mz', 'egnn']  # (4 left, 1 failed)


def training_step_faking(monkeypatch, script, fails=(), stop=None):
    r"""``training_step.py`` with fake measurements: the rows named in :obj:`fails` fail (out
    of memory) in every round, the row :obj:`stop` ends with Ctrl-C once; returns the list of
    the rows measured."""
    calls: list = []

    def measure(path, config, env=None):
        name = config['name']
        if name == stop and 'stopped' not in calls:
            calls.append('stopped')
            raise KeyboardInterrupt
        calls.append(name)
        if name in fails:
            raise script.MeasurementFailed('out of memory')
        return fake_step_row(name, config['args']['repeats'])
    monkeypatch.setattr(script, 'in_fresh_process', measure)
    monkeypatch.setattr(script, 'matmul_peak_flops', lambda device=None: 1e10)
    monkeypatch.setattr(script, 'memory_bandwidth', lambda *a, **k: 1e10)
    monkeypatch.setattr(script, 'plot', lambda rows, path: None)
    return calls


def test_training_step_keeps_an_earlier_report_that_measured_a_row_failing_here(
        tmp_path, monkeypatch, capsys):
    # a complete run whose row failed in every round (out of memory) replaced the earlier
    # complete report of the same options that had measured it: that row was lost unasked
    script = load_script('training_step')
    out = tmp_path / 'training_step'
    argv = ['training_step.py', '--models', 'rigid,mz,egnn', '--rounds', '2', '--repeats', '1',
            '--out', str(out)]
    complete, partial = out / 'training_step.json', out / 'training_step.partial.json'
    training_step_faking(monkeypatch, script, fails={'egnn'})
    monkeypatch.setattr(sys, 'argv', argv)
    assert script.main() is None  # (egnn failed: not in the report)
    training_step_faking(monkeypatch, script)
    assert script.main() is None
    fuller = complete.read_text()
    assert [r['model'] for r in json.loads(fuller)['rows']] == ['rigid', 'mz', 'egnn']
    training_step_faking(monkeypatch, script, fails={'mz'})
    capsys.readouterr()
    assert script.main() is None
    assert complete.read_text() == fuller  # kept: it measured mz
    assert 'mz failed in every round here' in capsys.readouterr().err
    data = json.loads(partial.read_text())
    assert data['lost'] == ['mz'] and data['pending'] == 0
    assert [r['model'] for r in data['rows']] == ['rigid', 'egnn']
    assert 'Partial: `mz` failed in every round here' in (
        out / 'training_step.partial.md').read_text()
    usage_error('training_step', argv[1:], monkeypatch, capsys, 'interrupted run',
                'rows failed where the complete report beside it measured them')
    # --resume makes the measurements that failed again, and only those
    calls = training_step_faking(monkeypatch, script, fails={'mz'})
    monkeypatch.setattr(sys, 'argv', argv + ['--resume'])
    assert script.main() is None
    assert calls == ['mz', 'mz'] and complete.read_text() == fuller
    calls = training_step_faking(monkeypatch, script)
    assert script.main() is None
    assert calls == ['mz', 'mz'] and not partial.exists()
    assert [r['model'] for r in json.loads(complete.read_text())['rows']] == [
        'rigid', 'mz', 'egnn']
    # --overwrite replaces it with the report of the failure
    training_step_faking(monkeypatch, script, fails={'mz'})
    monkeypatch.setattr(sys, 'argv', argv + ['--overwrite'])
    assert script.main() is None
    data = json.loads(complete.read_text())
    assert [r['model'] for r in data['rows']] == ['rigid', 'egnn'] and 'lost' not in data


@pytest.mark.parametrize('first, then', [
    (['--quick'], ['--clouds', '8', '--repeats', '3']),
    (['--clouds', '8', '--repeats', '3'], ['--quick'])])
def test_training_step_resumes_a_partial_report_of_the_same_resolved_settings(
        first, then, tmp_path, monkeypatch, capsys):
    # a --quick run's partial report was refused to a --resume given its 8 clouds and 3
    # repeats instead ("quick True there, False here"): the same run
    script = load_script('training_step')
    out = tmp_path / 'training_step'
    argv = ['training_step.py', '--models', 'rigid,mz', '--out', str(out)]
    training_step_faking(monkeypatch, script, stop='mz')
    monkeypatch.setattr(sys, 'argv', argv + first)
    assert script.main() == script.EXIT_INTERRUPTED
    calls = training_step_faking(monkeypatch, script)
    monkeypatch.setattr(sys, 'argv', argv + then + ['--resume'])
    assert script.main() is None
    assert calls == ['mz']
    config = json.loads((out / 'training_step.json').read_text())['config']
    assert (config['clouds'], config['repeats']) == (8, 3)
    training_step_faking(monkeypatch, script, stop='mz')
    monkeypatch.setattr(sys, 'argv', argv + first + ['--overwrite'])
    assert script.main() == script.EXIT_INTERRUPTED
    capsys.readouterr()
    usage_error('training_step', argv[1:] + ['--quick', '--clouds', '4', '--resume'],
                monkeypatch, capsys, 'other settings', 'clouds 8 there, 4 here')


def test_training_step_refuses_to_replace_the_complete_report_of_another_command(
        tmp_path, monkeypatch, capsys):
    # a run of other rows into a folder holding a complete report replaced it at its end
    # without a word (a committed results folder was nearly lost this way)
    script = load_script('training_step')
    out = tmp_path / 'training_step'
    argv = ['--repeats', '1', '--out', str(out)]
    calls = training_step_faking(monkeypatch, script)
    monkeypatch.setattr(sys, 'argv', ['training_step.py', '--models', 'rigid,mz'] + argv)
    assert script.main() is None
    complete = out / 'training_step.json'
    earlier = complete.read_text()
    command = json.loads(earlier)['environment']['command']
    calls.clear()
    usage_error('training_step', ['--models', 'egnn'] + argv, monkeypatch, capsys,
                f'{complete} is the complete report of another command (`{command}`)',
                "models ['rigid', 'mz'] there, ['egnn'] here", '--models egnn',
                'pass --overwrite to replace it')
    assert calls == [] and complete.read_text() == earlier
    # the same options measure again and replace it (a list written as its text, as older
    # reports have it, is the same list); --overwrite replaces another command's
    data = json.loads(earlier)
    data['config']['models'] = 'rigid,mz'
    complete.write_text(json.dumps(data))
    monkeypatch.setattr(sys, 'argv', ['training_step.py', '--models', 'rigid,mz'] + argv)
    assert script.main() is None
    assert calls == ['rigid', 'mz'] and json.loads(complete.read_text())['config']['models'] == [
        'rigid', 'mz']
    monkeypatch.setattr(sys, 'argv', ['training_step.py', '--models', 'egnn', '--overwrite']
                        + argv)
    assert script.main() is None
    assert [r['model'] for r in json.loads(complete.read_text())['rows']] == ['egnn']


def test_training_step_flops_only_refuses_to_replace_the_counts_of_another_command(
        tmp_path, monkeypatch, capsys):
    # --flops-only wrote training_step_flops.json over the counts of other options unasked
    script = load_script('training_step')
    counted = []
    monkeypatch.setattr(script, 'count_preset_flops', lambda name, *a: counted.append(name) or
                        dict(model=name, params=1, gflop_per_step=2.0, infer_gflop=1.0))
    monkeypatch.setattr(script.torch, 'set_num_threads', lambda n: None)  # (--threads 2)
    out = tmp_path / 'flops'
    complete = out / 'training_step_flops.json'
    argv = ['training_step.py', '--flops-only', '--models', 'rigid,mz', '--clouds', '2',
            '--points', '8', '--out', str(out)]

    def main(*extra):
        monkeypatch.setattr(sys, 'argv', argv + list(extra))
        capsys.readouterr()
        try:
            script.main()
        except SystemExit as e:
            assert e.code == 2
            return capsys.readouterr().err
        return None
    assert main() is None and counted == ['rigid', 'mz']
    earlier = complete.read_text()
    command = json.loads(earlier)['environment']['command']
    counted.clear()
    for extra, differ in ((['--points', '16'], 'points 8 there, 16 here'),
                          (['--models', 'egnn'], "models ['rigid', 'mz'] there, ['egnn'] here"),
                          (['--egnn-radius', '0.5'], 'egnn_radius 0.25 there, 0.5 here')):
        err = main(*extra)
        assert (f'argument --out: {complete} is the complete report of another command '
                f'(`{command}`)') in err and differ in err, err
        assert f"{' '.join(extra)}`) would replace: pass --overwrite to replace it" in err
    assert '(in place of --resume)' in main('--points', '16', '--resume')
    assert 'not allowed with --resume' in main('--resume', '--overwrite')
    assert counted == [] and complete.read_text() == earlier
    # the same counts (the models as an older report's text; repeats and threads count
    # nothing) are made again and replace it; --overwrite replaces another command's
    data = json.loads(earlier)
    data['config']['models'] = 'rigid,mz'
    complete.write_text(json.dumps(data))
    assert main('--repeats', '2', '--threads', '2') is None and counted == ['rigid', 'mz']
    assert main('--models', 'egnn', '--overwrite') is None
    assert [r['model'] for r in json.loads(complete.read_text())['rows']] == ['egnn']


def test_training_step_refuses_more_rounds_over_a_report_older_than_rounds(
        tmp_path, monkeypatch, capsys, no_measuring):
    # a report written before --rounds (no 'rounds' in its config: one round) was replaced
    # unasked by a run of three rounds, as if the rounds were not a setting
    script = load_script('training_step')
    out = tmp_path / 'training_step'
    argv = ['--models', 'rigid,mz', '--repeats', '1', '--out', str(out)]
    calls = training_step_faking(monkeypatch, script)
    monkeypatch.setattr(sys, 'argv', ['training_step.py'] + argv)
    assert script.main() is None
    complete = out / 'training_step.json'
    data = json.loads(complete.read_text())
    del data['config']['rounds']
    complete.write_text(json.dumps(data))
    calls.clear()
    usage_error('training_step', argv + ['--rounds', '3'], monkeypatch, capsys,
                'complete report of', 'rounds 1 there, 3 here', '--overwrite')
    assert calls == [] and json.loads(complete.read_text()) == data
    monkeypatch.setattr(sys, 'argv', ['training_step.py'] + argv)
    assert script.main() is None  # (one round, as it ran: the same run)
    assert calls == ['rigid', 'mz']


def test_training_step_resumed_after_ctrl_c_replaces_as_its_overwrite_asked(
        tmp_path, monkeypatch, capsys):
    # the resumed call of a run given --overwrite kept the earlier report where a row failed
    script = load_script('training_step')
    out = tmp_path / 'training_step'
    argv = ['training_step.py', '--models', 'rigid,mz,egnn', '--repeats', '1', '--out',
            str(out)]
    complete, partial = out / 'training_step.json', out / 'training_step.partial.json'
    training_step_faking(monkeypatch, script)
    monkeypatch.setattr(sys, 'argv', argv)
    assert script.main() is None
    training_step_faking(monkeypatch, script, fails={'mz'}, stop='egnn')
    monkeypatch.setattr(sys, 'argv', argv + ['--overwrite'])
    assert script.main() == script.EXIT_INTERRUPTED
    assert json.loads(partial.read_text())['overwrite'] is True
    capsys.readouterr()
    calls = training_step_faking(monkeypatch, script, fails={'mz'})
    monkeypatch.setattr(sys, 'argv', argv + ['--resume'])
    assert script.main() is None
    assert calls == ['mz', 'egnn'] and not partial.exists()
    data = json.loads(complete.read_text())
    assert [r['model'] for r in data['rows']] == ['rigid', 'egnn'] and 'lost' not in data


# --- scaling.py ------------------------------------------------------------------------------

@pytest.mark.parametrize('argv, needles', [
    (['--set-size', '0'], ['--set-size', "'0'"]),
    (['--threads', '0'], ['--threads', "'0'"]),
    (['--in-channels', '0'], ['--in-channels', "'0'"]),
    (['--repeats', '0'], ['--repeats', "'0'"]),
    (['--chunk-size', '-1'], ['--chunk-size', "'-1'"]),
])
def test_scaling_refuses_mistakes_before_measuring(argv, needles, tmp_path, monkeypatch, capsys,
                                                   no_measuring):
    out = tmp_path / 'scaling'
    usage_error('scaling', argv + ['--out', str(out)], monkeypatch, capsys, *needles)
    assert not out.exists()


def test_scaling_results_names_tell_runs_apart():
    r"""Every setting in the name differs between runs that differ in it; the default run and
    the README's sets-of-one run keep the names the READMEs and targets.py refer to."""
    scaling = load_script('scaling')
    name = scaling.results_name
    assert name('mz', 1024, 3, False) == 'scaling_mz'
    assert name('default', 1, 8, True) == 'scaling_default_sets_of_1'
    for readme in ('README.md', os.path.join('benchmarks', 'README.md')):
        with open(os.path.join(ROOT, readme)) as f:
            text = f.read()
        assert 'scaling/scaling_mz.md' in text and 'scaling/scaling_default_sets_of_1.md' in text
    names = {(model, size, width, quick): name(model, size, width, quick)
             for model in ('mz', 'rigid', 'default') for size in (1, 1024, 64)
             for width in (3, 8) for quick in (False, True)}
    assert len(set(names.values())) == len(names)
    assert name('mz', 1024, 3, True) == 'scaling_mz_quick'
    assert name('mz', 1024, 8, False) == 'scaling_mz_in8'
    assert name('default', 1, 3, False) == 'scaling_default_sets_of_1_in3_full'
    # the measurement settings: chunking, repeats and threads other than the committed runs'
    assert name('mz', 1024, 3, False, chunk_size=0) == 'scaling_mz_chunk0'
    assert name('mz', 1024, 3, False, chunk_size=65536) == 'scaling_mz_chunk65536'
    assert name('mz', 1024, 3, False, repeats=5) == 'scaling_mz_r5'
    assert name('mz', 1024, 3, False, threads=16) == 'scaling_mz_t16'
    assert name('default', 1, 8, True, threads=1, repeats=1) == 'scaling_default_sets_of_1_r1_t1'
    assert name('mz', 1024, 3, False, chunk_size=scaling.CHUNK_SIZE, repeats=scaling.REPEATS,
                threads=scaling.THREADS) == 'scaling_mz'


def test_scaling_quick_run_leaves_the_main_results_alone(tmp_path, monkeypatch):
    scaling = load_script('scaling')
    monkeypatch.setattr(scaling, 'run_one', lambda cfg: dict(points=cfg['points'], sets=1,
                                                             median_s=cfg['points'] * 1e-6))
    monkeypatch.setattr(scaling, 'in_fresh_process', lambda path, cfg: dict(peak_bytes=2**20))
    monkeypatch.setattr(scaling, 'plot', lambda *args: None)
    for argv, written in ((['--quick'], 'scaling_mz_quick'),
                          (['--in-channels', '8'], 'scaling_mz_in8'),
                          (['--model', 'default', '--in-channels', '8', '--set-size', '1',
                            '--quick'], 'scaling_default_sets_of_1')):
        monkeypatch.setattr(sys, 'argv', ['scaling.py', '--out', str(tmp_path), '--threads',
                                          str(scaling.THREADS)] + argv)
        scaling.main()
        assert (tmp_path / f'{written}.json').exists() and (tmp_path / f'{written}.md').exists()
    assert not (tmp_path / 'scaling_mz.json').exists()
    # another chunk size or thread count does not overwrite the committed runs either
    for argv, written in ((['--chunk-size', '0', '--threads', str(scaling.THREADS)],
                           'scaling_mz_chunk0'),
                          (['--threads', '1'], 'scaling_mz_t1')):
        monkeypatch.setattr(sys, 'argv', ['scaling.py', '--out', str(tmp_path)] + argv)
        scaling.main()
        assert (tmp_path / f'{written}.json').exists()
    assert not (tmp_path / 'scaling_mz.json').exists()


def test_scaling_where_the_peak_is_unknown(tmp_path, monkeypatch, capsys):
    # peak_memory_bytes gives None where it cannot read the peak (not Linux): the row kept it
    # as None, and then the printed line formatted None as a number
    scaling = load_script('scaling')
    monkeypatch.setattr(scaling, 'run_one', lambda cfg: dict(points=cfg['points'], sets=1,
                                                             median_s=cfg['points'] * 1e-6))
    monkeypatch.setattr(scaling, 'in_fresh_process', lambda path, cfg: dict(peak_bytes=None))
    monkeypatch.setattr(scaling, 'plot', lambda *args: None)
    monkeypatch.setattr(sys, 'argv', ['scaling.py', '--out', str(tmp_path), '--quick'])
    scaling.main()
    assert 'peak unknown' in capsys.readouterr().out
    name = next(tmp_path.glob('*.json'))
    assert all(r['peak_mib'] is None for r in json.loads(name.read_text())['rows'])


def test_scaling_records_a_size_that_failed_and_measures_the_next(tmp_path, monkeypatch,
                                                                   capsys):
    # a MeasurementFailed of one size ended the run: every size measured before it was lost
    from torch_mz.study import MeasurementFailed
    scaling = load_script('scaling')
    monkeypatch.setattr(scaling, 'run_one', lambda cfg: dict(points=cfg['points'], sets=1,
                                                             median_s=cfg['points'] * 1e-6))

    def peak(path, cfg):
        if cfg['points'] == 10000:
            raise MeasurementFailed('killed by signal 9 (out of memory?)')
        return dict(peak_bytes=2**20)
    monkeypatch.setattr(scaling, 'in_fresh_process', peak)
    monkeypatch.setattr(scaling, 'plot', lambda *args: None)
    monkeypatch.setattr(sys, 'argv', ['scaling.py', '--out', str(tmp_path), '--quick',
                                      '--threads', str(scaling.THREADS)])
    assert scaling.main() is None
    data = json.loads((tmp_path / 'scaling_mz_quick.json').read_text())
    assert [r['points'] for r in data['rows']] == [1000, 3162, 31623, 100000]
    assert data['failed'] == [dict(points=10000, sets=9, error='MeasurementFailed: killed by '
                                                                'signal 9 (out of memory?)')]
    assert data['pending'] == 0
    text = (tmp_path / 'scaling_mz_quick.md').read_text()
    assert 'Sizes that failed (not in the table):' in text
    assert '- 10,000 points: MeasurementFailed: killed by signal 9' in text
    assert not list(tmp_path.glob('*.partial.*'))


def test_scaling_keeps_the_sizes_measured_before_ctrl_c_and_resumes(tmp_path, monkeypatch,
                                                                     capsys):
    # the results were written once, after the last size: Ctrl-C lost every size measured
    from torch_mz.study import EXIT_INTERRUPTED
    scaling = load_script('scaling')
    measured = []

    def run_one(cfg):
        if cfg['points'] == 10000 and not measured.count('stopped'):
            measured.append('stopped')
            raise KeyboardInterrupt
        measured.append(cfg['points'])
        return dict(points=cfg['points'], sets=1, median_s=cfg['points'] * 1e-6)
    monkeypatch.setattr(scaling, 'run_one', run_one)
    monkeypatch.setattr(scaling, 'in_fresh_process', lambda path, cfg: dict(peak_bytes=2**20))
    monkeypatch.setattr(scaling, 'plot', lambda *args: None)
    earlier = tmp_path / 'scaling_mz_quick.json'
    earlier.write_text('{"rows": []}')  # an earlier run's complete results: left alone
    argv = ['scaling.py', '--out', str(tmp_path), '--quick', '--threads', str(scaling.THREADS)]
    monkeypatch.setattr(sys, 'argv', argv)
    try:
        assert scaling.main() == EXIT_INTERRUPTED
    except KeyboardInterrupt:
        pytest.fail('Ctrl-C ended scaling.py with a traceback')
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    partial = tmp_path / 'scaling_mz_quick.partial.json'
    assert str(partial) in err and '--resume' in err
    data = json.loads(partial.read_text())
    assert [r['points'] for r in data['rows']] == [1000, 3162] and data['pending'] == 3
    assert 'Partial: 3 more size(s) not measured' in (
        tmp_path / 'scaling_mz_quick.partial.md').read_text()
    assert earlier.read_text() == '{"rows": []}'
    # without --resume or --overwrite the partial report is not replaced
    usage_error('scaling', argv[1:], monkeypatch, capsys, 'interrupted run', '--resume',
                '--overwrite')
    assert json.loads(partial.read_text()) == data
    monkeypatch.setattr(sys, 'argv', argv + ['--resume'])
    measured.clear()
    measured.append('stopped')
    assert scaling.main() is None
    assert measured == ['stopped', 10000, 31623, 100000]  # (the kept sizes not measured again)
    data = json.loads(earlier.read_text())
    assert [r['points'] for r in data['rows']] == [1000, 3162, 10000, 31623, 100000]
    assert not partial.exists() and not (tmp_path / 'scaling_mz_quick.partial.md').exists()


def stopped_between_the_reports(monkeypatch) -> None:
    r"""Ctrl-C where :func:`~torch_mz.study.write_results_so_far` has written the complete
    report and is about to remove the partial one (the first removal of a partial report)."""
    import torch_mz.study.partial

    def remove_results(out, name):
        raise KeyboardInterrupt
    monkeypatch.setattr(torch_mz.study.partial, 'remove_results', remove_results)


def test_scaling_resumed_after_ctrl_c_between_its_reports_measures_nothing_again(
        tmp_path, monkeypatch, capsys):
    # Ctrl-C between the complete report and the partial one's removal left both: --resume
    # measured the last size again (and a call without options was refused)
    from torch_mz.study import EXIT_INTERRUPTED
    scaling = load_script('scaling')
    measured = []

    def run_one(cfg):
        measured.append(cfg['points'])
        return dict(points=cfg['points'], sets=1, median_s=cfg['points'] * 1e-6)
    monkeypatch.setattr(scaling, 'run_one', run_one)
    monkeypatch.setattr(scaling, 'in_fresh_process', lambda path, cfg: dict(peak_bytes=2**20))
    monkeypatch.setattr(scaling, 'plot', lambda *args: None)
    argv = ['scaling.py', '--out', str(tmp_path), '--quick', '--threads', str(scaling.THREADS)]
    monkeypatch.setattr(sys, 'argv', argv)
    with monkeypatch.context() as m:
        stopped_between_the_reports(m)
        assert scaling.main() == EXIT_INTERRUPTED
    complete = tmp_path / 'scaling_mz_quick.json'
    partial = tmp_path / 'scaling_mz_quick.partial.json'
    assert partial.exists() and len(json.loads(complete.read_text())['rows']) == 5
    report_before = complete.read_text()
    measured.clear()
    capsys.readouterr()
    monkeypatch.setattr(sys, 'argv', argv + ['--resume'])
    assert scaling.main() is None
    assert measured == [] and complete.read_text() == report_before
    assert capsys.readouterr().out.startswith('nothing to resume: ')
    assert not partial.exists() and not (tmp_path / 'scaling_mz_quick.partial.md').exists()


def test_scaling_resumed_keeps_the_sizes_after_one_measured_again(tmp_path, monkeypatch,
                                                                    capsys):
    # a resumed run rewrote the partial report with the sizes it had reached: stopped while it
    # measured again a size that had failed, it lost the kept sizes after that one
    from torch_mz.study import EXIT_INTERRUPTED, MeasurementFailed
    scaling = load_script('scaling')
    script: list = []  # what each call of run_one does, in turn

    def run_one(cfg):
        what = script.pop(0)
        if what == 'fail':
            raise MeasurementFailed('out of memory')
        if what == 'stop':
            raise KeyboardInterrupt
        return dict(points=cfg['points'], sets=1, median_s=cfg['points'] * 1e-6)
    monkeypatch.setattr(scaling, 'run_one', run_one)
    monkeypatch.setattr(scaling, 'in_fresh_process', lambda path, cfg: dict(peak_bytes=2**20))
    monkeypatch.setattr(scaling, 'plot', lambda *args: None)
    argv = ['scaling.py', '--out', str(tmp_path), '--quick', '--threads', str(scaling.THREADS)]
    partial = tmp_path / 'scaling_mz_quick.partial.json'
    monkeypatch.setattr(sys, 'argv', argv)
    script[:] = ['ok', 'fail', 'ok', 'stop']  # 3,162 failed, stopped in 31,623
    assert scaling.main() == EXIT_INTERRUPTED
    assert [r['points'] for r in json.loads(partial.read_text())['rows']] == [1000, 10000]
    capsys.readouterr()
    monkeypatch.setattr(sys, 'argv', argv + ['--resume'])
    script[:] = ['stop']  # stopped in 3,162, measured again
    assert scaling.main() == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert str(partial) in err and '--resume' in err and 'before it kept any' not in err
    data = json.loads(partial.read_text())
    assert [r['points'] for r in data['rows']] == [1000, 10000]
    assert data['pending'] == 3
    script[:] = ['ok', 'ok', 'ok']  # 3,162, 31,623 and 100,000: 10,000 is kept
    assert scaling.main() is None
    data = json.loads((tmp_path / 'scaling_mz_quick.json').read_text())
    assert [r['points'] for r in data['rows']] == [1000, 3162, 10000, 31623, 100000]
    assert not script and not partial.exists()



def test_scaling_lists_memory_running_out_and_keeps_a_bug_s_traceback(tmp_path, monkeypatch):
    # every RuntimeError was listed as a failed size and the run went on (status 0): a bug's
    # error (shapes) too; only memory running out is a failure the report lists
    scaling = load_script('scaling')
    error: list = [RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to "
                                "allocate 8 GB")]

    def run_one(cfg):
        if cfg['points'] == 100000:
            raise error[0]
        return dict(points=cfg['points'], sets=1, median_s=cfg['points'] * 1e-6)
    monkeypatch.setattr(scaling, 'run_one', run_one)
    monkeypatch.setattr(scaling, 'in_fresh_process', lambda path, cfg: dict(peak_bytes=2**20))
    monkeypatch.setattr(scaling, 'plot', lambda *args: None)
    argv = ['scaling.py', '--out', str(tmp_path), '--quick', '--threads', str(scaling.THREADS)]
    monkeypatch.setattr(sys, 'argv', argv)
    assert scaling.main() is None
    data = json.loads((tmp_path / 'scaling_mz_quick.json').read_text())
    assert [f['points'] for f in data['failed']] == [100000]
    assert "can't allocate memory" in data['failed'][0]['error']
    error[0] = RuntimeError('mat1 and mat2 shapes cannot be multiplied (8x64 and 32x64)')
    monkeypatch.setattr(sys, 'argv', argv + ['--overwrite'])
    with pytest.raises(RuntimeError, match='shapes cannot be multiplied'):
        scaling.main()


def test_scaling_keeps_a_fuller_earlier_report_where_a_size_fails(tmp_path, monkeypatch, capsys):
    # a complete run whose largest size failed replaced the earlier report that measured it
    from torch_mz.study import MeasurementFailed
    scaling = load_script('scaling')
    fails: set = set()

    def run_one(cfg):
        if cfg['points'] in fails:
            raise MeasurementFailed('out of memory')
        return dict(points=cfg['points'], sets=1, median_s=cfg['points'] * 1e-6)
    monkeypatch.setattr(scaling, 'run_one', run_one)
    monkeypatch.setattr(scaling, 'in_fresh_process', lambda path, cfg: dict(peak_bytes=2**20))
    monkeypatch.setattr(scaling, 'plot', lambda *args: None)
    argv = ['scaling.py', '--out', str(tmp_path), '--quick', '--threads', str(scaling.THREADS)]
    complete = tmp_path / 'scaling_mz_quick.json'
    partial = tmp_path / 'scaling_mz_quick.partial.json'
    monkeypatch.setattr(sys, 'argv', argv)
    assert scaling.main() is None
    fuller = complete.read_text()
    sizes = [1000, 3162, 10000, 31623, 100000]
    assert [r['points'] for r in json.loads(fuller)['rows']] == sizes
    fails.add(100000)
    assert scaling.main() is None
    assert complete.read_text() == fuller  # kept: it measured 100,000 points
    err = capsys.readouterr().err
    assert '100,000 points failed here' in err and '--resume' in err and '--overwrite' in err
    data = json.loads(partial.read_text())
    assert data['lost'] == [100000] and data['pending'] == 0
    assert [r['points'] for r in data['rows']] == sizes[:4]
    assert 'Partial: 100,000 points failed here' in (
        tmp_path / 'scaling_mz_quick.partial.md').read_text()
    usage_error('scaling', argv[1:], monkeypatch, capsys, 'interrupted run', '--resume')
    monkeypatch.setattr(sys, 'argv', argv + ['--resume'])  # 100,000 failing again: still kept
    assert scaling.main() is None
    assert complete.read_text() == fuller and json.loads(partial.read_text())['lost'] == [100000]
    monkeypatch.setattr(sys, 'argv', argv + ['--overwrite'])  # replaced on request
    assert scaling.main() is None
    data = json.loads(complete.read_text())
    assert [r['points'] for r in data['rows']] == sizes[:4] and data['failed']
    assert not partial.exists()
    data['rows'][0]['median_s'] = 1.0  # (marked, to see it replaced)
    complete.write_text(json.dumps(data))
    monkeypatch.setattr(sys, 'argv', argv)  # (one the report there did not measure fails: the
    assert scaling.main() is None  # report is replaced)
    data = json.loads(complete.read_text())
    assert [r['points'] for r in data['rows']] == sizes[:4] and data['rows'][0]['median_s'] < 1
    assert not partial.exists()


def test_scaling_resumed_after_ctrl_c_replaces_as_its_overwrite_asked(tmp_path, monkeypatch,
                                                                      capsys):
    # the resumed call of a run given --overwrite kept the earlier report where a size failed
    from torch_mz.study import MeasurementFailed
    scaling = load_script('scaling')
    fails: set = set()
    stop = []

    def run_one(cfg):
        if cfg['points'] in stop:
            stop.clear()
            raise KeyboardInterrupt
        if cfg['points'] in fails:
            raise MeasurementFailed('out of memory')
        return dict(points=cfg['points'], sets=1, median_s=cfg['points'] * 1e-6)
    monkeypatch.setattr(scaling, 'run_one', run_one)
    monkeypatch.setattr(scaling, 'in_fresh_process', lambda path, cfg: dict(peak_bytes=2**20))
    monkeypatch.setattr(scaling, 'plot', lambda *args: None)
    argv = ['scaling.py', '--out', str(tmp_path), '--quick', '--threads', str(scaling.THREADS)]
    complete = tmp_path / 'scaling_mz_quick.json'
    partial = tmp_path / 'scaling_mz_quick.partial.json'
    monkeypatch.setattr(sys, 'argv', argv)
    assert scaling.main() is None
    fails.add(100000)
    stop.append(31623)
    monkeypatch.setattr(sys, 'argv', argv + ['--overwrite'])
    assert scaling.main() == scaling.EXIT_INTERRUPTED
    assert json.loads(partial.read_text())['overwrite'] is True
    capsys.readouterr()
    monkeypatch.setattr(sys, 'argv', argv + ['--resume'])
    assert scaling.main() is None
    assert not partial.exists()
    data = json.loads(complete.read_text())
    assert [r['points'] for r in data['rows']] == [1000, 3162, 10000, 31623]
    assert 'lost' not in data and data['failed']


def test_scaling_refuses_to_replace_a_complete_report_of_other_settings(tmp_path, monkeypatch,
                                                                       capsys):
    # (its name tells the settings apart: one of other settings under it was renamed)
    scaling = load_script('scaling')
    monkeypatch.setattr(scaling, 'run_one', lambda cfg: dict(points=cfg['points'], sets=1,
                                                             median_s=cfg['points'] * 1e-6))
    monkeypatch.setattr(scaling, 'in_fresh_process', lambda path, cfg: dict(peak_bytes=2**20))
    monkeypatch.setattr(scaling, 'plot', lambda *args: None)
    argv = ['scaling.py', '--out', str(tmp_path), '--quick', '--threads', str(scaling.THREADS)]
    monkeypatch.setattr(sys, 'argv', argv + ['--repeats', '1'])
    assert scaling.main() is None
    os.replace(tmp_path / 'scaling_mz_quick_r1.json', tmp_path / 'scaling_mz_quick.json')
    renamed = (tmp_path / 'scaling_mz_quick.json').read_text()
    usage_error('scaling', argv[1:], monkeypatch, capsys, 'complete report of another command',
                'repeats 1 there, 3 here', '--overwrite')
    assert (tmp_path / 'scaling_mz_quick.json').read_text() == renamed
    monkeypatch.setattr(sys, 'argv', argv + ['--overwrite'])
    assert scaling.main() is None
    assert json.loads((tmp_path / 'scaling_mz_quick.json').read_text())['config']['repeats'] == 3


# --- message_passing.py ----------------------------------------------------------------------

@pytest.mark.parametrize('argv, needles', [
    (['--aggrs', 'rigid,foo'], ['--aggrs', "'foo'"]),
    (['--degrees', 'poisson,uniform'], ['--degrees', "'uniform'"]),
    (['--dims', 'x'], ['--dims', "'x'"]),
    (['--dims', '16,16'], ['--dims', 'given twice']),
    (['--nodes', '0'], ['--nodes', "'0'"]),
    (['--nodes', '1000,ten'], ['--nodes', "'ten'"]),
    # (the default --aggrs: PyG's two aggregations, not the inference-only pyg-nofast)
    (['--dims', '6'], ['--dims', '6 not a multiple of the 4 heads of pyg, pyg-flat (in --aggrs)']),
    (['--dims', '6', '--inference', '--aggrs', 'pyg-nofast'],
     ['--dims', '6 not a multiple of the 4 heads of pyg-nofast']),
    (['--ckpt-dims', 'y'], ['--ckpt-dims', "'y'"]),
    (['--repeats', '0'], ['--repeats', "'0'"]),
    (['--threads', '0'], ['--threads', "'0'"]),
    (['--timeout', '0'], ['--timeout', "'0'"]),
    (['--chunk-rows', '0'], ['--chunk-rows', "'0'"]),
    (['--device', 'gpu'], ['--device', "'gpu'"]),
    (['--degrees', 'power-law', '--nodes', '100000'], ['nothing to measure']),
    (['--aggrs', 'pyg,pyg-nofast'], ['--aggrs', 'pyg-nofast only with --inference']),
])
def test_message_passing_refuses_mistakes_before_measuring(argv, needles, tmp_path, monkeypatch,
                                                           capsys, no_measuring):
    out = tmp_path / 'message_passing'
    usage_error('message_passing', argv + ['--out', str(out)], monkeypatch, capsys, *needles)
    assert not out.exists()


MP_ARGV = ['--aggrs', 'pyg,rigid', '--degrees', 'poisson', '--dims', '16',
           '--nodes', '1000,10000', '--graphconv-nodes', '0']  # four rows


def fake_row(cfg: dict) -> dict:
    r"""A row as :func:`run_one` returns it, with figures that depend on the configuration."""
    per_node = {'pyg': 0.3, 'rigid': 0.1}[cfg['aggr']]
    return dict(cfg, edges=10 * cfg['nodes'], max_degree=20, chunk_rows=None,
                median_ms=per_node * cfg['nodes'] ** 1.1, times_ms=[1.0],
                peak_mib=per_node * cfg['nodes'] / 100, alloc_mib=None)


def run_message_passing(mp, argv, monkeypatch, measure):
    monkeypatch.setattr(mp, 'run_subprocess', lambda cfg, timeout: measure(cfg))
    monkeypatch.setattr(mp, 'plot', lambda rows, path: None)
    monkeypatch.setattr(sys, 'argv', ['message_passing.py'] + argv)
    return mp.main()


def report(out, name='message_passing'):
    with open(out / f'{name}.json') as f:
        return json.load(f), (out / f'{name}.md').read_text()


def test_message_passing_writes_each_row_and_resumes(tmp_path, monkeypatch, capsys):
    r"""The report is written after every row, marked partial until the last; an interrupted
    run's rows are kept by ``--resume`` (not measured again), and the figures are those of an
    uninterrupted run."""
    mp = load_script('message_passing')
    out, whole = tmp_path / 'stopped', tmp_path / 'whole'
    measured = []

    def stops_at_the_third(cfg):
        if len(measured) == 2:
            raise KeyboardInterrupt
        measured.append((cfg['aggr'], cfg['nodes']))
        return fake_row(cfg)
    out.mkdir()
    (out / 'message_passing.json').write_text('{"an earlier": "complete report"}')
    # (Ctrl-C: a line that says how to go on, status 130)
    assert run_message_passing(mp, MP_ARGV + ['--out', str(out)], monkeypatch,
                               stops_at_the_third) == 130
    # a stopped run leaves the earlier complete report as it was, its rows in the partial one
    assert (out / 'message_passing.json').read_text() == '{"an earlier": "complete report"}'
    data, markdown = report(out, 'message_passing.partial')
    assert data['complete'] is False and data['planned_rows'] == 4
    assert [(r['aggr'], r['nodes']) for r in data['rows']] == measured
    assert 'partial: 2 of 4 rows measured' in markdown
    first = list(measured)

    measured.clear()
    capsys.readouterr()
    run_message_passing(mp, MP_ARGV + ['--out', str(out), '--resume'], monkeypatch,
                        lambda cfg: measured.append((cfg['aggr'], cfg['nodes']))
                        or fake_row(cfg))
    assert len(measured) == 2 and not set(measured) & set(first)
    printed = capsys.readouterr().out
    assert 'resuming from' in printed and printed.count('(kept)') == 2
    data, markdown = report(out)
    assert data['complete'] is True and len(data['rows']) == 4
    assert 'partial:' not in markdown
    assert not (out / 'message_passing.partial.json').exists()
    assert not (out / 'message_passing.partial.md').exists()

    run_message_passing(mp, MP_ARGV + ['--out', str(whole)], monkeypatch, fake_row)
    reference, reference_md = report(whole)
    assert data['rows'] == reference['rows']
    assert data['ratios'] == reference['ratios'] and data['slopes'] == reference['slopes']
    assert data['ratios'][0]['rigid/pyg time'] == pytest.approx(1 / 3)
    # the same tables, under a heading that says where the medians come from (it said "this
    # run" of rows kept from the run resumed)
    heading, tables = markdown.split('## Ratios')[1].split('\n', 1)
    reference_heading, reference_tables = reference_md.split('## Ratios')[1].split('\n', 1)
    assert tables == reference_tables
    assert reference_heading == ' (medians of this run)'
    assert heading == (' (medians of this run and of the run it resumed: 2 of 4 rows kept from '
                       'that run by `--resume`)')


def test_message_passing_resumed_after_ctrl_c_between_its_reports_measures_nothing_again(
        tmp_path, monkeypatch, capsys):
    # Ctrl-C between the complete report and the partial one's removal left both: --resume
    # measured the last row again
    mp = load_script('message_passing')
    measured = []

    def measure(cfg):
        measured.append((cfg['aggr'], cfg['nodes']))
        return fake_row(cfg)
    argv = MP_ARGV + ['--out', str(tmp_path)]
    with monkeypatch.context() as m:
        stopped_between_the_reports(m)
        assert run_message_passing(mp, argv, monkeypatch, measure) == 130
    assert (tmp_path / 'message_passing.partial.json').exists() and len(measured) == 4
    data, _ = report(tmp_path)
    assert data['complete'] is True and len(data['rows']) == 4
    measured.clear()
    capsys.readouterr()
    assert run_message_passing(mp, argv + ['--resume'], monkeypatch, measure) is None
    assert measured == [] and report(tmp_path)[0] == data
    assert capsys.readouterr().out.startswith('nothing to resume: ')
    assert sorted(p.name for p in tmp_path.iterdir()) == ['message_passing.json',
                                                          'message_passing.md']


def test_message_passing_keeps_an_earlier_report_of_rows_failing_here_and_another_command_s(
        tmp_path, monkeypatch, capsys):
    # a complete run whose row failed (timed out) replaced the earlier complete report of the
    # same options that had measured it; a run of other options replaced another command's
    mp = load_script('message_passing')
    out = tmp_path / 'mp'
    complete, partial = out / 'message_passing.json', out / 'message_passing.partial.json'
    measured = []

    def fails(*which):
        def measure(cfg):
            measured.append((cfg['aggr'], cfg['nodes']))
            return (dict(cfg, error='timed out') if (cfg['aggr'], cfg['nodes']) in which
                    else fake_row(cfg))
        return measure
    run_message_passing(mp, MP_ARGV + ['--out', str(out)], monkeypatch, fails())
    fuller = complete.read_text()
    capsys.readouterr()
    run_message_passing(mp, MP_ARGV + ['--out', str(out)], monkeypatch,
                        fails(('pyg', 10000)))
    assert complete.read_text() == fuller  # kept: it measured that row
    assert 'poisson d=16 N=10000 sage pyg failed here' in capsys.readouterr().err
    data, markdown = report(out, 'message_passing.partial')
    assert data['complete'] is False and [(c['aggr'], c['nodes']) for c in data['lost']] == [
        ('pyg', 10000)]
    assert 'partial: 1 row(s) failed here (poisson d=16 N=10000 sage pyg)' in markdown
    usage_error('message_passing', MP_ARGV + ['--out', str(out)], monkeypatch, capsys,
                'interrupted run', 'rows failed where the complete report beside it measured')
    measured.clear()
    run_message_passing(mp, MP_ARGV + ['--out', str(out), '--resume'], monkeypatch, fails())
    assert measured == [('pyg', 10000)] and not partial.exists()
    assert len(report(out)[0]['rows']) == 4
    # another command's complete report: refused before anything is measured
    earlier = complete.read_text()
    command = json.loads(earlier)['environment']['command']
    measured.clear()
    usage_error('message_passing', MP_ARGV + ['--out', str(out), '--repeats', '2'], monkeypatch,
                capsys, f'is the complete report of another command (`{command}`)',
                'repeats 5 there, 2 here')
    assert complete.read_text() == earlier and not measured
    run_message_passing(mp, MP_ARGV + ['--out', str(out), '--repeats', '2', '--overwrite'],
                        monkeypatch, fails())
    assert report(out)[0]['config']['repeats'] == 2 and len(measured) == 4


def test_message_passing_compares_what_an_older_report_ran_and_its_rows_use(
        tmp_path, monkeypatch, capsys, no_measuring):
    # a report written before --inference (no 'inference' in its config: forward + backward)
    # was replaced unasked by an --inference run; one written when --chunk-rows defaulted to
    # 131072 was refused to its own command, whose rows no --chunk-rows changes
    mp = load_script('message_passing')
    out = tmp_path / 'mp'
    complete = out / 'message_passing.json'
    measured = []

    def measure(cfg):
        measured.append((cfg['aggr'], cfg['nodes']))
        return fake_row(cfg)
    run_message_passing(mp, MP_ARGV + ['--out', str(out)], monkeypatch, measure)
    data = json.loads(complete.read_text())
    for key in mp.ROW_FLAGS:
        del data['config'][key]
    data['config']['chunk_rows'] = 131072
    complete.write_text(json.dumps(data))
    measured.clear()
    usage_error('message_passing', MP_ARGV + ['--out', str(out), '--inference'], monkeypatch,
                capsys, 'complete report of', 'inference False there, True here')
    assert not measured and json.loads(complete.read_text()) == data
    run_message_passing(mp, MP_ARGV + ['--out', str(out)], monkeypatch, measure)
    assert len(measured) == 4
    # a *-chunks row takes its groups from --chunk-rows: there it is compared
    data = json.loads(complete.read_text())
    data['config'].update(aggrs=['pyg', 'rigid-chunks'], chunk_rows=131072)
    complete.write_text(json.dumps(data))
    usage_error('message_passing', ['--aggrs', 'pyg,rigid-chunks'] + MP_ARGV[2:]
                + ['--out', str(out)], monkeypatch, capsys, 'chunk_rows 131072 there, None here')
    assert len(measured) == 4


def test_message_passing_resumed_after_ctrl_c_replaces_as_its_overwrite_asked(
        tmp_path, monkeypatch, capsys):
    # the resumed call of a run given --overwrite kept the earlier report where a row failed
    mp = load_script('message_passing')
    out = tmp_path / 'mp'
    complete, partial = out / 'message_passing.json', out / 'message_passing.partial.json'
    calls = []

    def measure(fail=(), stop=()):
        def run(cfg):
            key = (cfg['aggr'], cfg['nodes'])
            if key in stop and 'stopped' not in calls:
                calls.append('stopped')
                raise KeyboardInterrupt
            calls.append(key)
            return dict(cfg, error='timed out') if key in fail else fake_row(cfg)
        return run
    run_message_passing(mp, MP_ARGV + ['--out', str(out)], monkeypatch, measure())
    assert run_message_passing(mp, MP_ARGV + ['--out', str(out), '--overwrite'], monkeypatch,
                               measure(fail={('pyg', 1000)}, stop={('pyg', 10000)})
                               ) == mp.EXIT_INTERRUPTED
    assert json.loads(partial.read_text())['overwrite'] is True
    capsys.readouterr()
    calls.clear()
    run_message_passing(mp, MP_ARGV + ['--out', str(out), '--resume'], monkeypatch,
                        measure(fail={('pyg', 1000)}))
    assert ('pyg', 1000) in calls and not partial.exists()
    data = json.loads(complete.read_text())
    assert 'lost' not in data and [r for r in data['rows'] if 'error' in r]


@pytest.mark.parametrize('argv, nodes, dims, repeats', [
    ([], [1000, 10000, 100000], [16, 64], 5),
    (['--quick'], [1000, 10000], [16], 3),
    (['--quick', '--nodes', '500'], [500], [16], 3),
    (['--quick', '--dims', '8'], [1000, 10000], [8], 3),
    (['--quick', '--repeats', '2'], [1000, 10000], [16], 2),
    (['--nodes', '500', '--dims', '8', '--repeats', '1'], [500], [8], 1)])
def test_message_passing_quick_leaves_the_options_given(argv, nodes, dims, repeats, tmp_path,
                                                        monkeypatch):
    # --quick replaced a --nodes, --dims or --repeats given with its own graphs, width and
    # repeats (the report recorded those, not the ones asked for)
    mp = load_script('message_passing')
    out = tmp_path / 'mp'
    run_message_passing(mp, ['--aggrs', 'rigid', '--degrees', 'poisson', '--graphconv-nodes',
                             '0', '--out', str(out)] + argv, monkeypatch, fake_row)
    data, _ = report(out)
    assert sorted({r['nodes'] for r in data['rows']}) == nodes
    assert sorted({r['dim'] for r in data['rows']}) == dims
    assert {r['repeats'] for r in data['rows']} == {repeats}
    assert (data['config']['nodes'], data['config']['dims'],
            data['config']['repeats']) == (nodes, dims, repeats)


def test_message_passing_records_the_threads_of_its_rows(tmp_path, monkeypatch):
    # the environment's threads were this (parent) process's, not the --threads every row ran
    # with: 2 against 1 in the committed reports
    import torch
    mp = load_script('message_passing')
    threads = torch.get_num_threads() + 2
    out = tmp_path / 'mp'
    run_message_passing(mp, MP_ARGV + ['--threads', str(threads), '--out', str(out)],
                        monkeypatch, fake_row)
    data, markdown = report(out)
    assert {r['threads'] for r in data['rows']} == {threads}
    assert data['environment']['threads'] == threads
    assert f'{threads} thread(s)' in markdown


def test_message_passing_resumes_nothing_measured_otherwise(tmp_path, monkeypatch, capsys):
    r"""``--resume`` measures failed rows again, and refuses a complete or partial report of
    other settings, which the run would replace (``--overwrite`` does); a partial report whose
    rows no setting that differs changes (``--chunk-rows`` without ``*-chunks`` rows) is
    measured again, every row (and said so); without ``--resume`` every row is measured."""
    mp = load_script('message_passing')
    out = tmp_path / 'mp'
    measured = []

    def counts(cfg):
        measured.append(cfg['aggr'])
        row = fake_row(cfg)
        if cfg['aggr'] == 'pyg' and cfg['nodes'] == 10000 and len(measured) <= 4:
            return dict(cfg, error='timed out')  # fails in the first run only
        return row
    run_message_passing(mp, MP_ARGV + ['--out', str(out)], monkeypatch, counts)
    assert len(measured) == 4
    run_message_passing(mp, MP_ARGV + ['--out', str(out), '--resume'], monkeypatch, counts)
    assert measured[4:] == ['pyg']  # the failed row only
    data, _ = report(out)
    assert not any('error' in r for r in data['rows'])
    capsys.readouterr()
    other_out = tmp_path / 'other'
    for other in (['--repeats', '2'], ['--threads', '2'], ['--no-allocated'],
                  ['--keep-freed-memory'], ['--chunk-rows', '64']):
        measured.clear()
        run_message_passing(mp, MP_ARGV + ['--out', str(other_out), '--overwrite'],
                            monkeypatch, counts)  # the reference, with the default settings
        # (its complete report: another command's, which the run would replace; not where the
        # option changes none of its rows: --chunk-rows sets the groups of *-chunks rows alone)
        if other != ['--chunk-rows', '64']:
            usage_error('message_passing', MP_ARGV + other + ['--out', str(other_out),
                                                              '--resume'],
                        monkeypatch, capsys, 'complete report of another command',
                        '--overwrite (in place of --resume)')
        # (as a partial report: another command's, refused likewise; where no row changes,
        # measured again, every row)
        os.replace(other_out / 'message_passing.json', other_out / 'message_passing.partial.json')
        measured.clear()
        capsys.readouterr()
        if other != ['--chunk-rows', '64']:
            usage_error('message_passing', MP_ARGV + other + ['--out', str(other_out),
                                                              '--resume'],
                        monkeypatch, capsys, 'partial report of another command',
                        '--overwrite (in place of --resume)')
            assert not measured
            continue
        run_message_passing(mp, MP_ARGV + other + ['--out', str(other_out), '--resume'],
                            monkeypatch, counts)
        assert len(measured) == 4, other
        printed = capsys.readouterr().out
        assert 'not resuming' in printed and 'other settings' in printed, printed
    measured.clear()
    run_message_passing(mp, MP_ARGV + ['--out', str(out)], monkeypatch, counts)
    assert len(measured) == 4


def test_message_passing_resumed_keeps_the_rows_ahead_in_its_partial_report(
        tmp_path, monkeypatch, capsys):
    # --resume rewrote the partial report after every row with the rows reached alone: the
    # kept rows not reached yet left it, and a second Ctrl-C (or a failure) in the row before
    # them lost them, so that the next --resume measured them again
    mp = load_script('message_passing')
    out = tmp_path / 'mp'
    partial = out / 'message_passing.partial.json'
    measured = []

    def first(cfg):  # (pyg 1000, rigid 1000 timed out, pyg 10000, Ctrl-C at rigid 10000)
        if (cfg['aggr'], cfg['nodes']) == ('rigid', 10000):
            raise KeyboardInterrupt
        measured.append((cfg['aggr'], cfg['nodes']))
        return (dict(cfg, error='timed out') if (cfg['aggr'], cfg['nodes']) == ('rigid', 1000)
                else fake_row(cfg))
    assert run_message_passing(mp, MP_ARGV + ['--out', str(out)], monkeypatch,
                               first) == mp.EXIT_INTERRUPTED
    rows = json.loads(partial.read_text())['rows']
    assert [(r['aggr'], r['nodes'], 'error' in r) for r in rows] == [
        ('pyg', 1000, False), ('rigid', 1000, True), ('pyg', 10000, False)]
    kept = rows[2]
    capsys.readouterr()

    def stops(cfg):  # Ctrl-C while the row that timed out is measured again
        raise KeyboardInterrupt
    argv = MP_ARGV + ['--out', str(out), '--resume']
    assert run_message_passing(mp, argv, monkeypatch, stops) == mp.EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert f'the rows finished so far are kept in {partial}' in err, err
    assert [(r['aggr'], r['nodes']) for r in json.loads(partial.read_text())['rows']
            if 'error' not in r] == [('pyg', 1000), ('pyg', 10000)]
    measured.clear()
    run_message_passing(mp, argv, monkeypatch,
                        lambda cfg: measured.append((cfg['aggr'], cfg['nodes'])) or fake_row(cfg))
    assert measured == [('rigid', 1000), ('rigid', 10000)]  # (pyg 10000 kept, not again)
    data, markdown = report(out)
    assert data['complete'] is True and data['rows'][2] == kept
    assert '2 of 4 rows kept from that run' in markdown


def test_message_passing_ctrl_c_before_a_row_is_written_names_the_rows_kept(
        tmp_path, monkeypatch, capsys):
    # a resumed run stopped in its first row said it was "interrupted before it kept any of
    # its rows; to start again", where the partial report it resumed keeps them
    mp = load_script('message_passing')
    out = tmp_path / 'mp'
    partial = out / 'message_passing.partial.json'

    def first(cfg):  # (pyg 1000 timed out, rigid 1000, Ctrl-C at pyg 10000)
        if cfg['nodes'] == 10000:
            raise KeyboardInterrupt
        return dict(cfg, error='timed out') if cfg['aggr'] == 'pyg' else fake_row(cfg)
    argv = MP_ARGV + ['--out', str(out)]
    assert run_message_passing(mp, argv, monkeypatch, first) == mp.EXIT_INTERRUPTED
    earlier = partial.read_text()
    capsys.readouterr()

    def stops(cfg):
        raise KeyboardInterrupt
    assert run_message_passing(mp, argv + ['--resume'], monkeypatch,
                               stops) == mp.EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert 'before it kept any' not in err, err
    assert f'the rows finished so far are kept in {partial}' in err and '--resume' in err, err
    assert partial.read_text() == earlier


def test_message_passing_resume_refuses_the_partial_report_of_another_command(
        tmp_path, monkeypatch, capsys):
    # --resume of a run with other graphs kept the rows of the interrupted run's partial
    # report that matched, measured its own, and replaced that report: the other command's
    # rows (here its 10^3-node graph) were lost without a word
    mp = load_script('message_passing')
    out = tmp_path / 'mp'
    partial = out / 'message_passing.partial.json'
    measured = []

    def stops_at_the_third(cfg):
        if len(measured) == 2:
            raise KeyboardInterrupt
        measured.append((cfg['aggr'], cfg['nodes']))
        return fake_row(cfg)
    assert run_message_passing(mp, MP_ARGV + ['--out', str(out)], monkeypatch,
                               stops_at_the_third) == mp.EXIT_INTERRUPTED
    earlier = partial.read_text()
    command = json.loads(earlier)['environment']['command']
    measured.clear()
    capsys.readouterr()
    other = ['--aggrs', 'pyg,rigid', '--degrees', 'poisson', '--dims', '16', '--nodes', '10000',
             '--graphconv-nodes', '0', '--out', str(out), '--resume']
    err = usage_error('message_passing', other, monkeypatch, capsys,
                      f'argument --resume: {partial} is the partial report of another command '
                      f'(`{command}`)', 'nodes [1000, 10000] there, [10000] here',
                      'pass --overwrite (in place of --resume)')
    assert 'message_passing.py --aggrs pyg,rigid --degrees poisson --dims 16 --nodes 10000' in err
    assert partial.read_text() == earlier and not measured
    # its own command resumes it; --overwrite replaces it
    run_message_passing(mp, MP_ARGV + ['--out', str(out), '--resume'], monkeypatch,
                        lambda cfg: measured.append((cfg['aggr'], cfg['nodes'])) or fake_row(cfg))
    assert measured == [('pyg', 10000), ('rigid', 10000)] and not partial.exists()
    assert len(report(out)[0]['rows']) == 4


@pytest.mark.parametrize('damaged', [
    dict(config=[]),  # a config that is no object
    dict(minutes='a while'),  # minutes that are no number
    dict(rows=3),  # rows that are no list of rows
    dict(rows=['a row']),
])
@pytest.mark.parametrize('name', ['message_passing.partial', 'message_passing'])
def test_message_passing_resume_measures_again_a_damaged_report(name, damaged, tmp_path,
                                                                 monkeypatch, capsys):
    # the lenient reader ended in an AttributeError (a config that is no object), a
    # ValueError (minutes) or a TypeError in the first row's match (rows) traceback
    mp = load_script('message_passing')
    out = tmp_path / 'mp'
    run_message_passing(mp, MP_ARGV + ['--out', str(out)], monkeypatch, fake_row)
    data, _ = report(out)  # (of these settings: read but for the damage)
    (out / 'message_passing.json').unlink()
    (out / f'{name}.json').write_text(json.dumps(dict(data, **damaged)))
    measured = []
    capsys.readouterr()
    run_message_passing(mp, MP_ARGV + ['--out', str(out), '--resume'], monkeypatch,
                        lambda cfg: measured.append(cfg) or fake_row(cfg))
    assert len(measured) == 4
    assert 'unreadable' in capsys.readouterr().out
    data, _ = report(out)
    assert data['complete'] is True and len(data['rows']) == 4


def test_message_passing_resume_matches_rows_by_configuration():
    r"""A kept row measured the configuration: every entry of it, the group size of the
    ``*-chunks`` rows included, and it did not fail."""
    mp = load_script('message_passing')
    cfg = dict(aggr='rigid-chunks', conv='sage', degrees='poisson', dim=16, nodes=1000,
               repeats=5, threads=1, seed=0, device='cpu', keep=False, allocated=True)
    row = fake_row(dict(cfg, aggr='rigid'))
    row['aggr'] = 'rigid-chunks'
    assert mp.measured(row, cfg)
    assert not mp.measured(dict(row, error='timed out'), cfg)
    assert not mp.measured(dict(row, group_rows=64), cfg)
    assert not mp.measured(row, dict(cfg, group_rows=64))
    assert mp.measured(dict(row, group_rows=64), dict(cfg, group_rows=64))
    for key, other in (('aggr', 'rigid'), ('conv', 'graph'), ('degrees', 'power-law'),
                       ('dim', 64), ('nodes', 10000), ('repeats', 3), ('threads', 2),
                       ('device', 'cuda'), ('keep', True), ('allocated', False)):
        assert not mp.measured(row, dict(cfg, **{key: other})), key


# --- every measuring script --------------------------------------------------------------------

@pytest.mark.parametrize('name, argv', [
    ('speed', ['--sets', '2', '--points', '4', '--dim', '4', '--heads', '1', '--repeats', '1']),
    ('training_step', ['--models', 'rigid', '--clouds', '1', '--points', '4']),
    ('training_step', ['--models', 'rigid', '--flops-only']),
    ('scaling', ['--quick', '--repeats', '1']),
    ('message_passing', MP_ARGV),
])
def test_an_out_that_cannot_be_written_is_refused_before_measuring(name, argv, tmp_path,
                                                                    monkeypatch, capsys,
                                                                    no_measuring):
    # a file at --out: found by the first write, once every row had been measured (speed.py,
    # training_step.py and scaling.py ended in a FileExistsError traceback, their figures lost)
    out = tmp_path / 'a_file'
    out.write_text('not a folder')
    usage_error(name, argv + ['--out', str(out)], monkeypatch, capsys, 'is a file, not a folder')
    assert out.read_text() == 'not a folder'


def test_message_passing_without_resume_refuses_a_folder_with_an_interrupted_run(
        tmp_path, monkeypatch, capsys, no_measuring):
    # the first row's report replaced the partial report of the interrupted run: its rows lost
    out = tmp_path / 'mp'
    out.mkdir()
    partial = out / 'message_passing.partial.json'
    partial.write_text('{"complete": false, "rows": []}')
    usage_error('message_passing', MP_ARGV + ['--out', str(out)], monkeypatch, capsys,
                '--out', 'holds the rows of an interrupted run', '--resume', '--overwrite')
    usage_error('message_passing', MP_ARGV + ['--out', str(out), '--resume', '--overwrite'],
                monkeypatch, capsys, '--overwrite: not allowed with --resume')
    assert partial.read_text() == '{"complete": false, "rows": []}'
    mp = load_script('message_passing')
    run_message_passing(mp, MP_ARGV + ['--out', str(out), '--overwrite'], monkeypatch, fake_row)
    data, _ = report(out)
    assert data['complete'] is True and len(data['rows']) == 4
    assert not partial.exists()
