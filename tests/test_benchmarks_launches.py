r"""``benchmarks/launches.py``: the rows show what grows with the graph (the recomputed groups of
``chunk_size='auto'``), and GPU times are joined only to counts of the same batch. (The counter
itself, :func:`torch_mz.study.traffic.count_ops`, is tested in ``tests/study/test_traffic.py``.)"""
import json

import pytest

from tests._scripts import load_script, usage_error


@pytest.fixture(scope='module')
def launches():
    return load_script('launches')


def test_recomputed_groups_multiply_the_kernels_and_the_whole_input_does_not(launches,
                                                                             monkeypatch):
    from torch_mz.nn import aggr as aggr_module
    monkeypatch.setattr(aggr_module, 'AUTO_CHUNK_ELEMENTS', 64 * 16)  # groups of 64 rows, d = 16
    small = {a: launches.count_one(10, a, 16, 'poisson') for a in ('rigid', 'rigid-whole')}
    large = {a: launches.count_one(60, a, 16, 'poisson') for a in ('rigid', 'rigid-whole')}
    assert small['rigid']['edges'] <= 128 < large['rigid']['edges']  # one group, then several
    assert small['rigid']['chunk_rows'] == 0 and large['rigid']['chunk_rows'] == 64
    assert large['rigid-whole']['chunk_rows'] == 0
    # the same computation where nothing is grouped, the same operations
    assert small['rigid']['kernels'] == small['rigid-whole']['kernels']
    groups = -(-large['rigid']['edges'] // 64)
    assert large['rigid']['kernels'] > (groups - 1) * small['rigid']['kernels']
    assert large['rigid-whole']['kernels'] < 2 * small['rigid-whole']['kernels']
    # inference: the forward pass alone, fewer operations than forward + backward, and in
    # groups (without gradients the groups are not recomputed) more than the whole input
    for row in (*small.values(), *large.values()):
        assert 0 < row['kernels_infer'] < row['kernels'] and row['syncs_infer'] <= row['syncs']
    assert small['rigid']['kernels_infer'] == small['rigid-whole']['kernels_infer']
    assert large['rigid']['kernels_infer'] > large['rigid-whole']['kernels_infer']


def test_run_writes_counts_and_slopes_and_leaves_pyg_out_above_its_limit(launches, tmp_path):
    launches.main(['--nodes', '10,40', '--dim', '8', '--aggrs', 'pyg,rigid',
                   '--pyg-max-nodes', '10', '--out', str(tmp_path)])
    data = json.loads((tmp_path / 'launches.json').read_text())
    assert [(r['nodes'], r['aggr']) for r in data['rows']] == [(10, 'pyg'), (10, 'rigid'),
                                                                 (40, 'rigid')]
    assert [s['aggr'] for s in data['slopes']] == ['rigid']  # pyg: one graph, no slope
    rigid = [r for r in data['rows'] if r['aggr'] == 'rigid']
    assert data['slopes'][0]['largest_over_smallest'] == pytest.approx(
        rigid[1]['kernels'] / rigid[0]['kernels'])
    assert 'Command:' in (tmp_path / 'launches.md').read_text()


@pytest.mark.parametrize('argv, needle', [(['--nodes', '0'], '--nodes'),
                                          (['--aggrs', 'nonsense'], '--aggrs'),
                                          (['--dim', '-1'], '--dim')])
def test_options_are_checked(argv, needle, monkeypatch, capsys):
    usage_error('launches', argv, monkeypatch, capsys, needle)


def _gpu_file(path, **config):
    path.write_text(json.dumps(dict(
        environment=dict(command='python benchmarks/training_step.py --device cuda',
                         torch='2.11.0+cu130', torch_mz_commit='abc'),
        config=dict(dict(clouds=2, points=16, egnn_radius=0.25, device='cuda'), **config),
        rows=[dict(model='rigid', infer_s=0.002), dict(model='mz', infer_s=0.006)])))
    return path


def test_presets_are_counted_and_joined_to_the_gpu_times_of_the_same_batch(launches, tmp_path):
    gpu = _gpu_file(tmp_path / 'gpu.json')
    launches.main(['--presets', 'rigid,mz', '--clouds', '2', '--points', '16',
                   '--gpu-results', str(gpu), '--out', str(tmp_path / 'out')])
    data = json.loads((tmp_path / 'out' / 'launches_presets.json').read_text())
    rigid, mz = data['rows']
    for row, ms in ((rigid, 2.0), (mz, 6.0)):
        assert 0 < row['infer_kernels'] < row['train_kernels'] <= row['train_ops']
        assert row['gpu_infer_ms'] == pytest.approx(ms)
        assert row['gpu_us_per_infer_kernel'] == pytest.approx(1e3 * ms / row['infer_kernels'])
    assert mz['infer_kernels'] > rigid['infer_kernels']  # the generator channel's work
    assert mz['infer kernels / rigid'] == pytest.approx(
        mz['infer_kernels'] / rigid['infer_kernels'])
    assert mz['gpu infer / rigid'] == pytest.approx(3.0)
    markdown = (tmp_path / 'out' / 'launches_presets.md').read_text()
    assert 'training_step.py --device cuda' in markdown and 'torch_mz abc' in markdown
    # the counts do not depend on what ran before (compiled kernels, threads: set inside)
    assert launches.count_preset('rigid', 2, 16) == {
        k: v for k, v in rigid.items() if not k.startswith(('gpu', 'infer kernels'))}


@pytest.mark.parametrize('config, why', [(dict(clouds=3), 'measured (clouds, points'),
                                         (dict(egnn_radius=0.5), 'EGNN radius'),
                                         (dict(device='cpu'), "measured on 'cpu'")])
def test_gpu_times_of_another_batch_or_device_are_not_joined(launches, tmp_path, config, why):
    gpu = _gpu_file(tmp_path / 'gpu.json', **config)
    rows = [dict(model='rigid', clouds=2, points=16, egnn_radius=0.25, infer_kernels=10)]
    note = launches.join_gpu_inference(rows, str(gpu))
    assert note.startswith('No GPU results joined') and why in note
    assert 'gpu_infer_ms' not in rows[0]


def test_an_unreadable_gpu_file_leaves_the_counts_alone(launches, tmp_path, capsys):
    rows = [dict(model='rigid', clouds=2, points=16, egnn_radius=0.25, infer_kernels=10)]
    for text in ('{not json', '{"rows": []}', '[1, 2]', '{"config": null, "rows": []}',
                 '{"config": {}, "environment": null, "rows": [1]}'):
        bad = tmp_path / 'gpu.json'
        bad.write_text(text)
        assert 'unreadable' in launches.join_gpu_inference(rows, str(bad))
        assert 'unreadable' in capsys.readouterr().out
    bad.write_text(json.dumps(dict(config=dict(clouds=2, points=16, egnn_radius=0.25,
                                               device='cuda'),
                                   rows=[dict(model='rigid', infer_s='fast')])))
    assert 'no inference time' in launches.join_gpu_inference(rows, str(bad))
    assert 'no ' in launches.join_gpu_inference(rows, str(tmp_path / 'missing.json'))
    assert rows == [dict(model='rigid', clouds=2, points=16, egnn_radius=0.25,
                         infer_kernels=10)]


def test_main_records_the_arguments_it_was_given(launches, tmp_path, monkeypatch):
    # main(argv) recorded the caller's sys.argv as its command (here pytest's), not argv, in
    # both of its reports
    import sys
    counted = dict(ops=10, kernels=8, syncs=0, kernels_per_1k_edges=1.0)
    monkeypatch.setattr(launches, 'count_one', lambda nodes, aggr, dim, degrees: dict(
        counted, nodes=nodes, edges=10 * nodes, aggr=aggr, dim=dim, degrees=degrees))
    monkeypatch.setattr(launches, 'count_preset', lambda name, *a: dict(
        model=name, train_kernels=8, train_syncs=0, infer_kernels=4, infer_syncs=0))
    monkeypatch.setattr(launches, 'set_fused_kernels', lambda on: None)
    monkeypatch.setattr(launches.torch, 'set_num_threads', lambda n: None)
    monkeypatch.setattr(sys, 'argv', ['pytest', '-k', 'something else'])
    for argv, name in ((['--nodes', '10,20', '--aggrs', 'rigid'], 'launches'),
                       (['--presets', 'rigid', '--gpu-results', str(tmp_path / 'none.json')],
                        'presets')):
        argv = argv + ['--out', str(tmp_path / name)]
        launches.main(argv)
        (found, ) = (tmp_path / name).glob('*.json')
        command = json.loads(found.read_text())['environment']['command']
        assert command == ' '.join(['python', 'benchmarks/launches.py'] + argv)
        assert f'Command: `{command}`' in found.with_suffix('.md').read_text()


def test_the_gpu_note_names_the_torch_mz_version_of_an_installed_copy(launches, tmp_path,
                                                                       monkeypatch):
    # the note named torch_mz by its git commit alone: 'torch_mz None' for an installed copy
    gpu = tmp_path / 'gpu.json'
    record = json.loads(_gpu_file(gpu).read_text())
    record['environment'].update(torch_mz='0.3.0.dev0', torch_mz_commit=None)
    gpu.write_text(json.dumps(record))
    rows = [dict(model='rigid', clouds=2, points=16, egnn_radius=0.25, infer_kernels=10)]
    note = launches.join_gpu_inference(rows, str(gpu), 'torch 2.13, torch_mz 0.3.0.dev0')
    assert '(torch 2.11.0+cu130, torch_mz 0.3.0.dev0)' in note and 'None' not in note
    monkeypatch.setattr(launches, 'count_preset', lambda name, *a: dict(
        model=name, clouds=2, points=16, egnn_radius=0.25, train_kernels=8, train_syncs=0,
        infer_kernels=4, infer_syncs=0))
    monkeypatch.setattr(launches, 'set_fused_kernels', lambda on: None)
    monkeypatch.setattr(launches.torch, 'set_num_threads', lambda n: None)
    here = dict(launches.environment(), torch_mz='0.3.0.dev0', torch_mz_commit=None)
    monkeypatch.setattr(launches, 'environment', lambda: dict(here))
    launches.main(['--presets', 'rigid', '--clouds', '2', '--points', '16', '--gpu-results',
                   str(gpu), '--out', str(tmp_path / 'out')])
    markdown = (tmp_path / 'out' / 'launches_presets.md').read_text()
    assert f"these counts: torch {here['torch']}, torch_mz 0.3.0.dev0." in markdown, markdown
    here.update(torch_mz_commit='abc')  # (from a checkout: both)
    assert launches._torch_mz_of(here) == 'torch_mz 0.3.0.dev0 at abc'


def test_a_run_with_nothing_to_count_is_refused_and_writes_nothing(tmp_path, monkeypatch,
                                                                   capsys):
    # every graph above --pyg-max-nodes: an empty report replaced the earlier one
    out = tmp_path / 'launches'
    out.mkdir()
    (out / 'launches.json').write_text('{"an earlier": "run"}')
    usage_error('launches', ['--nodes', '20000', '--aggrs', 'pyg', '--out', str(out)],
                monkeypatch, capsys, 'nothing to count', '--pyg-max-nodes 10000')
    assert (out / 'launches.json').read_text() == '{"an earlier": "run"}'
    assert not (out / 'launches.md').exists()


@pytest.mark.parametrize('argv, needles', [
    # PyG's blocks at a width their 4 heads do not divide: an AssertionError traceback once the
    # rows before had been counted
    (['--dim', '6', '--aggrs', 'rigid,pyg'], ['--dim', '6 not a multiple of the 4 heads of pyg']),
    (['--dim', '6', '--aggrs', 'pyg-flat'], ['--dim', 'heads of pyg-flat']),
])
def test_pyg_at_a_width_its_heads_do_not_divide_is_refused(argv, needles, tmp_path, monkeypatch,
                                                           capsys):
    out = tmp_path / 'launches'
    usage_error('launches', ['--nodes', '10'] + argv + ['--out', str(out)], monkeypatch, capsys,
                *needles)
    assert not out.exists()


def test_an_out_that_is_a_file_is_refused_before_counting(tmp_path, monkeypatch, capsys):
    out = tmp_path / 'a_file'
    out.write_text('')
    usage_error('launches', ['--nodes', '10', '--aggrs', 'rigid', '--out', str(out)],
                monkeypatch, capsys, 'is a file, not a folder')


def test_counts_made_before_ctrl_c_are_kept_and_resumed(launches, tmp_path, monkeypatch,
                                                         capsys):
    # the report was written once, after the last count: Ctrl-C (or a failure late in the
    # run, minutes in) lost every count made
    import sys

    from torch_mz.study import EXIT_INTERRUPTED
    calls = []

    def count_one(nodes, aggr, dim, degrees):
        if (nodes, aggr) == (40, 'rigid') and 'stopped' not in calls:
            calls.append('stopped')
            raise KeyboardInterrupt
        calls.append((nodes, aggr))
        return dict(ops=10 * nodes, kernels=nodes, syncs=0, kernels_per_1k_edges=1.0,
                    nodes=nodes, edges=10 * nodes, aggr=aggr, dim=dim, degrees=degrees)
    monkeypatch.setattr(launches, 'count_one', count_one)
    monkeypatch.setattr(launches, 'set_fused_kernels', lambda on: None)
    monkeypatch.setattr(launches.torch, 'set_num_threads', lambda n: None)
    monkeypatch.setattr(launches, 'plot', lambda rows, path: None)
    monkeypatch.setattr(sys, 'argv', ['pytest'])
    out = tmp_path / 'launches'
    out.mkdir()
    earlier = out / 'launches.json'
    earlier.write_text('{"rows": []}')  # an earlier run's complete report: left alone
    argv = ['--nodes', '10,40', '--dim', '8', '--aggrs', 'pyg,rigid', '--out', str(out)]
    assert launches.main(argv) == EXIT_INTERRUPTED
    err = capsys.readouterr().err.strip()
    partial = out / 'launches.partial.json'
    assert len(err.splitlines()) == 1 and str(partial) in err and '--resume' in err
    data = json.loads(partial.read_text())
    assert [(r['nodes'], r['aggr']) for r in data['rows']] == [(10, 'pyg'), (10, 'rigid'),
                                                               (40, 'pyg')]
    assert data['pending'] == 1
    assert 'Partial: 1 more count(s)' in (out / 'launches.partial.md').read_text()
    assert earlier.read_text() == '{"rows": []}'
    # without --resume or --overwrite the partial report is not replaced
    for extra, needles in (([], ('interrupted run', '--resume', '--overwrite')),
                           (['--resume', '--dim', '16'], ('other settings', 'dim 8 there')),
                           (['--resume', '--overwrite'], ('not allowed with --resume', )),
                           (['--resume', '--presets', 'rigid'], ('not allowed with --presets',
                                                                  ))):
        with pytest.raises(SystemExit) as exit_:
            launches.main(argv + extra)
        assert exit_.value.code == 2
        message = capsys.readouterr().err
        assert all(needle in message for needle in needles), message
    # the same options with torch-scatter installed since (no option says so): PyG's counts
    # of the other scatter path were put beside those kept in one table
    with monkeypatch.context() as m:
        scatter = not data['environment']['torch_scatter']
        m.setattr(launches, '_environment',
                  lambda argv: dict(data['environment'], torch_scatter=scatter))
        with pytest.raises(SystemExit) as exit_:
            launches.main(argv + ['--resume'])
        assert exit_.value.code == 2
        assert f'torch_scatter {not scatter!r} there' in capsys.readouterr().err
    assert json.loads(partial.read_text()) == data
    calls[:] = ['stopped']
    assert launches.main(argv + ['--resume']) is None
    assert calls == ['stopped', (40, 'rigid')]  # (the kept counts not made again)
    result = json.loads(earlier.read_text())
    assert [(r['nodes'], r['aggr']) for r in result['rows']] == [
        (10, 'pyg'), (10, 'rigid'), (40, 'pyg'), (40, 'rigid')]
    assert sorted(result) == ['config', 'environment', 'minutes', 'replaces_partial', 'rows',
                              'slopes']  # (replaces_partial: the partial report it replaced)
    assert 'resume' not in result['config'] and len(result['slopes']) == 2
    assert 'Partial' not in (out / 'launches.md').read_text()
    assert not partial.exists() and not (out / 'launches.partial.md').exists()


def test_a_complete_report_of_another_command_is_not_replaced_unasked(launches, tmp_path,
                                                                      monkeypatch, capsys):
    # a run with other options replaced the complete report in --out at its end, unasked
    calls = []

    def count_one(nodes, aggr, dim, degrees):
        calls.append((nodes, aggr))
        return dict(ops=10 * nodes, kernels=nodes, syncs=0, kernels_per_1k_edges=1.0,
                    nodes=nodes, edges=10 * nodes, aggr=aggr, dim=dim, degrees=degrees)
    monkeypatch.setattr(launches, 'count_one', count_one)
    monkeypatch.setattr(launches, 'set_fused_kernels', lambda on: None)
    monkeypatch.setattr(launches.torch, 'set_num_threads', lambda n: None)
    monkeypatch.setattr(launches, 'plot', lambda rows, path: None)
    out = tmp_path / 'launches'
    argv = ['--nodes', '10', '--aggrs', 'rigid', '--out', str(out)]
    assert launches.main(argv + ['--dim', '8']) is None
    complete = out / 'launches.json'
    earlier = complete.read_text()
    calls.clear()
    with pytest.raises(SystemExit) as exit_:
        launches.main(argv + ['--dim', '16'])
    assert exit_.value.code == 2
    message = capsys.readouterr().err
    assert (f'{complete} is the complete report of another command (`python '
            f'benchmarks/launches.py --nodes 10 --aggrs rigid --out {out} --dim 8`)') in message
    assert 'dim 8 there, 16 here' in message and '--overwrite' in message
    assert calls == [] and complete.read_text() == earlier
    assert launches.main(argv + ['--dim', '8']) is None  # (the same options: counted again)
    assert launches.main(argv + ['--dim', '16', '--overwrite']) is None
    assert json.loads(complete.read_text())['config']['dim'] == 16
    assert calls == [(10, 'rigid')] * 2


def test_a_presets_report_of_another_command_is_not_replaced_unasked(launches, tmp_path,
                                                                     monkeypatch, capsys):
    # --presets wrote launches_presets.json over the counts of other presets unasked (and
    # refused --overwrite, the one way to replace them)
    calls = []
    monkeypatch.setattr(launches, 'count_preset', lambda name, clouds, points, radius: (
        calls.append(name) or dict(model=name, clouds=clouds, points=points, egnn_radius=radius,
                                   train_ops=9, train_kernels=8, train_syncs=0, infer_ops=5,
                                   infer_kernels=4, infer_syncs=0)))
    monkeypatch.setattr(launches, 'set_fused_kernels', lambda on: None)
    monkeypatch.setattr(launches.torch, 'set_num_threads', lambda n: None)
    out = tmp_path / 'launches'
    argv = ['--clouds', '2', '--points', '16', '--out', str(out)]
    gpu = ['--gpu-results', str(tmp_path / 'none.json')]
    assert launches.main(['--presets', 'rigid,mz'] + argv + gpu) is None
    complete = out / 'launches_presets.json'
    earlier = complete.read_text()
    command = json.loads(earlier)['environment']['command']
    calls.clear()
    for extra, differ in ((['--presets', 'egnn'], "presets ['rigid', 'mz'] there, ['egnn'] here"),
                          (['--presets', 'rigid,mz', '--egnn-radius', '0.5'],
                           'egnn_radius 0.25 there, 0.5 here')):
        with pytest.raises(SystemExit) as exit_:
            launches.main(extra + argv + gpu)
        assert exit_.value.code == 2
        message = capsys.readouterr().err
        assert (f'argument --out: {complete} is the complete report of another command '
                f'(`{command}`)') in message and differ in message, message
        assert 'pass --overwrite to replace it' in message
    assert calls == [] and complete.read_text() == earlier
    # the same presets (in another order, other GPU times joined: the same counts) count
    # again and replace it, whatever the aggregations' report beside it holds; --overwrite
    # replaces another command's
    (out / 'launches.json').write_text(json.dumps(dict(config=dict(dim=8), rows=[])))
    assert launches.main(['--presets', 'mz,rigid'] + argv + [
        '--gpu-results', str(tmp_path / 'other.json')]) is None
    assert calls == ['mz', 'rigid']
    assert launches.main(['--presets', 'egnn', '--overwrite'] + argv + gpu) is None
    assert [r['model'] for r in json.loads(complete.read_text())['rows']] == ['egnn']
    assert json.loads((out / 'launches.json').read_text()) == dict(config=dict(dim=8), rows=[])
