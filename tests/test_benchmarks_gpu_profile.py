r"""``benchmarks/gpu_profile.py``: the GPU busy time is the union of the GPU events' intervals
(overlaps counted once, gaps not at all), per call; the trace's kernels, copies and host waits
are told apart; the script runs end to end on the CPU and writes its report."""
import json

import pytest
import torch

from tests._scripts import load_script, run_script, usage_error, without_matplotlib


@pytest.fixture(scope='module')
def profile():
    return load_script('gpu_profile')


def test_union_counts_overlaps_once_and_gaps_not_at_all(profile):
    # [0, 10] and [5, 15] overlap: 15 us; [20, 30] after a gap: 10 us; [22, 25] inside it
    assert profile.union_ms([(20, 30), (0, 10), (5, 15), (22, 25)]) == pytest.approx(0.025)
    assert profile.union_ms([]) == 0


def test_trace_summary_per_call(profile):
    def ev(cat, name, ts, dur):
        return dict(ph='X', cat=cat, name=name, ts=ts, dur=dur)

    events = [ev('kernel', 'gemm', 0, 100), ev('kernel', 'gemm', 300, 100),
              ev('kernel', 'softmax', 350, 100),  # overlaps the second gemm by 50 us
              ev('gpu_memcpy', 'Memcpy DtoH', 500, 20),
              ev('cuda_runtime', 'cudaStreamSynchronize', 510, 30),
              ev('cuda_runtime', 'cudaLaunchKernel', 0, 5),
              ev('cpu_op', 'aten::mm', 0, 50), dict(ph='i', cat='kernel', name='marker', ts=0)]
    s = profile.trace_summary(events, calls=2)
    assert s['kernels'] == 1.5 and s['copies'] == 0.5 and s['syncs'] == 0.5
    # busy: [0, 100] + [300, 450] + [500, 520] = 270 us over 2 calls
    assert s['busy_ms'] == pytest.approx(0.135)
    assert s['kernel_ms'] == pytest.approx(0.15)
    assert [t['name'] for t in s['top']] == ['gemm', 'softmax']
    assert s['top'][0]['share'] == pytest.approx(2 / 3)


def test_runs_on_the_cpu(tmp_path, monkeypatch):
    out = tmp_path / 'profile'
    code = run_script('gpu_profile', ['--device', 'cpu', '--nodes', '200', '--aggrs', 'rigid',
                                      '--presets', 'rigid', '--clouds', '2', '--points', '32',
                                      '--repeats', '1', '--profiled', '1', '--out', str(out)],
                      monkeypatch)
    assert code == 0
    data = json.loads((out / 'gpu_profile.json').read_text())
    assert [r['workload'].split(',')[0] for r in data['rows']] == [
        'SAGEConv fwd+bwd', 'training step', 'inference']
    for r in data['rows']:
        assert r['wall_ms'] > 0 and r['gflop'] > 0
        assert r['kernels'] is None and r['busy / wall'] is None  # no GPU in a CPU trace
    # the training step does about three times the products of inference
    train, infer = data['rows'][1]['gflop'], data['rows'][2]['gflop']
    assert 2 < train / infer < 4
    assert '--device cpu' in data['command']
    assert 'gpu_profile.py' in (out / 'gpu_profile.md').read_text()


def test_replot_rebuilds_the_report_from_the_file_alone(tmp_path, monkeypatch, profile):
    out = tmp_path / 'p'
    out.mkdir()
    rows = [dict(workload='training step, 2 x 32 points', model='rigid', clouds=2, points=32,
                 wall_ms=20.0, busy_ms=5.0, kernels=400.0, copies=10.0, syncs=3.0,
                 kernel_ms=5.0, top=[dict(name='gemm', ms_per_call=2.0, share=0.4)],
                 **{'busy / wall': 0.25, 'wall_us_per_kernel': 50.0})]
    report = dict(command='python benchmarks/gpu_profile.py --device cuda --repeats 5 '
                          '--profiled 2', environment=dict(cuda='Some GPU', torch='2.x'),
                  elapsed_s=1.0, rows=rows)
    (out / 'gpu_profile.json').write_text(json.dumps(report))
    assert run_script('gpu_profile', ['--replot', '--out', str(out)], monkeypatch) == 0
    md = (out / 'gpu_profile.md').read_text()
    assert 'Some GPU' in md and 'median of 5 unprofiled calls' in md and '| 0.25 |' in md
    assert 'No FLOP columns' in md and 'gemm 2 ms' in md
    # nothing measured, nothing rewritten: the file is as it was
    assert json.loads((out / 'gpu_profile.json').read_text()) == report
    empty = tmp_path / 'none'
    assert run_script('gpu_profile', ['--replot', '--out', str(empty)], monkeypatch) == 2


def test_replot_keeps_the_runs_figure_where_it_cannot_draw(tmp_path, monkeypatch, capsys):
    # --replot without matplotlib removed gpu_profile.png: the figure the run drew of the very
    # rows the file holds (the rows of a CPU run, with nothing to draw, still remove it)
    out = tmp_path / 'p'
    out.mkdir()
    rows = [dict(workload='w', model='rigid', wall_ms=20.0, busy_ms=5.0, top=[],
                 **{'busy / wall': 0.25})]
    report = dict(command='python benchmarks/gpu_profile.py --device cuda',
                  environment=dict(cuda='Some GPU', torch='2.x'), elapsed_s=1.0, rows=rows)
    (out / 'gpu_profile.json').write_text(json.dumps(report))
    (out / 'gpu_profile.png').write_bytes(b'the run drew it')
    without_matplotlib(monkeypatch)
    assert run_script('gpu_profile', ['--replot', '--out', str(out)], monkeypatch) == 0
    assert (out / 'gpu_profile.png').read_bytes() == b'the run drew it'
    printed = capsys.readouterr().out
    assert 'matplotlib is not installed' in printed and 'gpu_profile.{md} from' in printed
    rows[0]['busy / wall'] = None
    (out / 'gpu_profile.json').write_text(json.dumps(report))
    assert run_script('gpu_profile', ['--replot', '--out', str(out)], monkeypatch) == 0
    assert not (out / 'gpu_profile.png').exists()


def test_the_merged_row_restores_the_bucket_settings(profile):
    from torch_mz.nn import functional
    from torch_mz.study.workloads import MERGED
    before = {k: getattr(functional, k) for k in MERGED}
    assert before != MERGED
    row = profile.message_passing_row('rigid-merged', 200, 8, torch.device('cpu'), 1, 1, 1e9)
    assert row['model'] == 'rigid-merged' and row['gflop'] > 0
    assert {k: getattr(functional, k) for k in MERGED} == before


def test_a_failed_write_leaves_the_earlier_results_whole(tmp_path, monkeypatch, profile):
    # a value json cannot encode used to fail half-way through gpu_profile.json, truncating the
    # earlier complete results (and --replot then ended in a JSONDecodeError traceback)
    import argparse

    import numpy as np
    out = tmp_path / 'p'
    out.mkdir()
    earlier = '{"complete": "earlier results"}'
    (out / 'gpu_profile.json').write_text(earlier)
    args = argparse.Namespace(device='cpu', repeats=1)
    rows = [dict(workload='w', model='rigid', wall_ms=np.float32(2.0))]
    with pytest.raises(TypeError):
        profile.write(rows, args, str(out), 1.0, 1e9)
    assert (out / 'gpu_profile.json').read_text() == earlier
    (out / 'gpu_profile.json').write_text(earlier[:20])  # truncated by other means
    assert run_script('gpu_profile', ['--replot', '--out', str(out)], monkeypatch) == 2


def test_a_run_whose_rows_all_fail_leaves_the_earlier_results(tmp_path, monkeypatch, profile):
    # every row failing (out of memory, say) used to write an empty report over the earlier
    # complete one after each failed row, and only then end with 'no row was measured'
    import torch_mz.study
    out = tmp_path / 'p'
    out.mkdir()
    earlier = '{"rows": [{"model": "rigid"}]}'
    (out / 'gpu_profile.json').write_text(earlier)

    def oom(*args, **kwargs):
        raise RuntimeError('out of memory')
    monkeypatch.setattr(torch_mz.study, 'matmul_peak_flops', lambda device=None: 1e9)
    monkeypatch.setattr(torch_mz.study.workloads, 'random_graph', oom)
    monkeypatch.setattr(torch_mz.study.workloads, 'preset_calls', oom)
    code = run_script('gpu_profile', ['--device', 'cpu', '--nodes', '200', '--aggrs', 'rigid',
                                      '--presets', 'rigid', '--out', str(out)], monkeypatch)
    assert 'no row was measured' in str(code)
    assert (out / 'gpu_profile.json').read_text() == earlier
    assert not (out / 'gpu_profile.md').exists()


def test_a_cpu_run_records_its_out_and_leaves_no_earlier_plot(tmp_path, profile):
    # the recorded command left --out out, and a CPU run (no GPU figures: nothing to plot) left
    # the plot of an earlier GPU run beside its new results
    import argparse
    import shlex
    out = tmp_path / 'a folder'  # (a path the command must quote)
    out.mkdir()
    (out / 'gpu_profile.png').write_bytes(b'an earlier GPU run')
    args = argparse.Namespace(device='cpu', nodes=[200], repeats=1, profiled=1, replot=False,
                              out=str(out))
    rows = [dict(workload='w', model='rigid', wall_ms=2.0, top=[], kernels=None, busy_ms=None,
                 **{'busy / wall': None})]
    profile.write(rows, args, str(out), 1.0, 1e9)
    data = json.loads((out / 'gpu_profile.json').read_text())
    assert data['command'].endswith(f'--out {shlex.quote(str(out))}')
    assert shlex.split(data['command'])[2:] == ['--device', 'cpu', '--nodes', '200', '--repeats',
                                                '1', '--profiled', '1', '--out', str(out)]
    assert not (out / 'gpu_profile.png').exists()
    md = (out / 'gpu_profile.md').read_text()
    assert 'No plot: no GPU events' in md and 'median of 1 unprofiled calls' in md
    assert '# Where the time of a call goes (cpu)' in md


@pytest.mark.parametrize('argv, needle', [
    # PyG's blocks at a width their 4 heads do not divide: each such row failed, the rest ran
    (['--dim', '6', '--aggrs', 'rigid,pyg'], '6 not a multiple of the 4 heads of pyg'),
    (['--out', 'FILE'], 'is a file, not a folder'),  # found by the first row's write
])
def test_mistakes_are_refused_before_measuring(argv, needle, tmp_path, monkeypatch, capsys):
    import torch_mz.study
    a_file = tmp_path / 'a_file'
    a_file.write_text('')

    def refuse(*args, **kwargs):
        raise AssertionError('measured before the command line was checked')
    monkeypatch.setattr(torch_mz.study, 'matmul_peak_flops', refuse)
    argv = [str(a_file) if word == 'FILE' else word for word in argv]
    out = [] if '--out' in argv else ['--out', str(tmp_path / 'profile')]
    usage_error('gpu_profile', ['--device', 'cpu', '--nodes', '10'] + argv + out, monkeypatch,
                capsys, needle)
    assert not (tmp_path / 'profile').exists()


def test_a_cut_off_run_and_a_failed_call_say_so(tmp_path, monkeypatch):
    # the report written after every row read as the whole command's (no word of the workloads
    # not run yet), and a call that failed (out of memory) was left out without a word
    import torch_mz.study
    import torch_mz.study.workloads
    monkeypatch.setattr(torch_mz.study, 'matmul_peak_flops', lambda device=None: 1e9)
    argv = ['--device', 'cpu', '--nodes', '200', '--aggrs', 'rigid', '--presets', 'rigid,mz',
            '--clouds', '2', '--points', '8', '--repeats', '1', '--profiled', '1']

    def cut_off(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(torch_mz.study.workloads, 'preset_calls', cut_off)
    out = tmp_path / 'cut'
    with pytest.raises(KeyboardInterrupt):
        run_script('gpu_profile', argv + ['--out', str(out)], monkeypatch)
    data = json.loads((out / 'gpu_profile.json').read_text())
    assert len(data['rows']) == 1 and data['pending'] == 2 and data['failed'] == []
    assert "Partial: 2 more of the command's workloads not measured" in (
        out / 'gpu_profile.md').read_text()

    def oom(preset, *args, **kwargs):
        raise RuntimeError(f'out of memory ({preset})')
    monkeypatch.setattr(torch_mz.study.workloads, 'preset_calls', oom)
    out = tmp_path / 'failed'
    assert run_script('gpu_profile', argv + ['--out', str(out)], monkeypatch) == 0
    data = json.loads((out / 'gpu_profile.json').read_text())
    assert data['pending'] == 0
    assert [f['call'] for f in data['failed']] == [
        'training step and inference, 2 x 8 points, rigid',
        'training step and inference, 2 x 8 points, mz']
    markdown = (out / 'gpu_profile.md').read_text()
    assert 'Partial' not in markdown
    assert ('- training step and inference, 2 x 8 points, mz: RuntimeError: out of memory (mz)'
            in markdown)
