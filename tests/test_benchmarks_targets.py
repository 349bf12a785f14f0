r"""``benchmarks/targets.py``: issue 10's targets read from results files, on hand-built results
(every status and both directions of a threshold) and on the committed files."""
import json

import pytest

from tests._scripts import load_script


def mp_file(time, memory, default, slope, peak_1e5):
    r"""A message-passing results file whose rows give these ratios (``rigid`` / PyG time and
    memory, default / ``rigid`` time on a Poisson graph; a 200x speed-up on a power-law one) and
    the default's peak on the largest graph (whole, and half that in chunks)."""
    def row(aggr, degrees='poisson', nodes=1000, ms=1.0, mib=1.0, dim=16, **extra):
        return dict(aggr=aggr, degrees=degrees, dim=dim, nodes=nodes, edges=10 * nodes,
                    conv='sage', median_ms=ms, peak_mib=mib, **extra)
    rows = [row('pyg', ms=10.0, mib=100.0, alloc_mib=50.0),
            row('rigid', ms=10.0 * time, mib=100.0 * memory, alloc_mib=50.0 * memory * 1.2),
            row('default', ms=10.0 * time * default),
            row('pyg', 'power-law', ms=200.0), row('rigid', 'power-law', ms=1.0),
            row('default', nodes=100000, mib=peak_1e5, chunk_rows=131072),
            row('rigid', nodes=100000, chunk_rows=131072),  # not read for the 10^5 target
            # measured before chunk_size='auto' (no chunk_rows): left out, and the -chunks row
            # on the same graph read in its place
            row('default', nodes=100000, mib=1e9, dim=64),
            # measured in groups of 131,072 rows, before 'auto' sized its groups by the width
            # (2^21 / 64 = 32,768 rows at d = 64): left out too
            row('rigid', nodes=100000, ms=1e9, dim=64, chunk_rows=131072),
            # groups of another size than the default's (here the script's old default of
            # 131,072 rows, a file without chunk_rows): never read in its place
            row('default-chunks', nodes=100000, mib=1.0, dim=64),
            row('default-chunks', nodes=100000, mib=peak_1e5 / 2, dim=64, chunk_rows=32768)]
    slopes = [dict(aggr='default', degrees='poisson', dim=16, memory_slope=slope),
              dict(aggr='pyg', degrees='poisson', dim=16, memory_slope=3.0)]  # not ours
    return dict(rows=rows, slopes=slopes)


def step_file(rigid, mz, pct):
    return dict(rows=[dict(model='rigid', step_s=rigid, infer_s=rigid / 4, pct_of_peak=pct[0]),
                      dict(model='mz', step_s=mz, infer_s=mz / 4, pct_of_peak=pct[1]),
                      dict(model='mz+keep', step_s=mz, infer_s=mz, pct_of_peak=50.0),
                      # measured again in a newer file (targets.SUPERSEDED): not counted
                      dict(model='egnn', step_s=9.0, infer_s=9.0, pct_of_peak=1.0)])


def by_key(records):
    return {r['key']: r for r in records}


def test_statuses_and_thresholds(monkeypatch):
    targets = load_script('targets')
    monkeypatch.setattr(targets, 'SUPERSEDED', {('training_step', 'egnn'): 'measured again'})
    # these files stand for runs after the fold (test_rows_measured_before_the_fold_... below)
    monkeypatch.setattr(targets, 'FOLDED_MP', ('message_passing', 'message_passing_small'))
    data = {'message_passing': mp_file(0.9, 0.6, 2.0, 0.95, 3000.0),
            'message_passing_small': mp_file(1.1, 0.4, 3.5, 1.2, 5000.0),
            'training_step': step_file(1.0, 3.0, (30.0, 45.0)),
            'speed': dict(ratios=[dict(block='sab', batch='uniform', **{'pyg/rigid time': 1.25}),
                                  dict(block='sab', batch='skewed', **{'pyg/rigid time': 8.0})],
                          rows=[dict(model=m, block='sab', batch=b, gflop=g)
                                for m, b, g in (('pyg', 'skewed', 24.0), ('rigid', 'skewed', 3.0),
                                                ('mz', 'skewed', 15.0),
                                                ('pyg', 'uniform', 2.0),
                                                ('rigid', 'uniform', 2.0))]),
            'scaling_sets_of_1': dict(rows=[dict(points=10**3, sets=10**3, peak_mib=2.0),
                                            dict(points=10**5, sets=10**5, peak_mib=200.0)])}
    r = by_key(targets.evaluate(data))
    assert r['mp-time']['status'] == 'mixed' and r['mp-time']['met'] == 1  # 0.9 yes, 1.1 no
    assert r['mp-memory']['status'] == 'mixed'  # 0.6 no, 0.4 yes
    # the tensor memory held at once, where the rows record it: 0.72 no, 0.48 yes
    assert [m['value'] for m in r['mp-memory-allocated']['measurements']] == pytest.approx(
        [0.72, 0.48])
    assert r['mp-memory-allocated']['met'] == 1
    assert r['mp-power-law']['status'] == 'met'  # 1 / 0.005 = 200x in both files
    assert [m['value'] for m in r['mp-power-law']['measurements']] == pytest.approx([200, 200])
    # default / rigid on the same graph: 2.0 and 3.5 on the small graphs, 1.0 on the largest
    # (no rigid row at d = 64)
    assert sorted(m['value'] for m in r['mp-default']['measurements']) == pytest.approx(
        [1.0, 1.0, 2.0, 3.5])
    left_out = targets.superseded(data)
    assert ('message_passing', 'default, poisson, d=64, 100000 nodes, sage') in left_out
    assert 'groups of 131,072 rows' in left_out[
        ('message_passing', 'rigid, poisson, d=64, 100000 nodes, sage')]
    # a row measured whole before 'auto' existed: at d = 16 the old -chunks rows are the
    # default's configuration, at d = 64 no longer (groups of 32,768 rows now)
    reason_64 = left_out[('message_passing', 'default, poisson, d=64, 100000 nodes, sage')]
    assert 'the whole input at once' in reason_64 and 'groups of 32,768 rows' in reason_64
    whole_16 = dict(aggr='default', degrees='poisson', dim=16, nodes=100000, edges=10**6,
                    conv='sage')
    assert targets._mp_stale(whole_16) and targets._stale_reason(whole_16) == targets._WHOLE
    assert sum(label.startswith('message_passing') for label, _ in left_out) == 4
    assert r['mp-default']['met'] == 3
    # the default's rows and the default-chunks rows (its configuration on large graphs):
    # 3000 and 1500 MiB within 4 GB, 5000 MiB not, 2500 MiB within
    memory = r['mp-1e5-memory']['measurements']
    assert [m['value'] for m in memory] == pytest.approx([3000, 1500, 5000, 2500])
    assert r['mp-1e5-memory']['met'] == 3
    assert [m['where'].endswith('default-chunks (MiB)') for m in memory] == [False, True] * 2
    # slopes: 0.95 and 1.2 from the files (not PyG's), and 1.0 fitted from the scaling rows
    lin = r['mp-linear']['measurements']
    assert [m['value'] for m in lin] == pytest.approx([0.95, 1.2, 1.0])
    assert r['singletons']['status'] == 'met'
    # mz / rigid pairs with the same options only: the plain pair (step 3.0 <= 4, inference
    # 0.75 / 0.25 = 3.0 <= 3, a threshold met exactly); no pair for mz+keep (no rigid+keep)
    assert [m['value'] for m in r['step']['measurements']] == pytest.approx([3.0])
    assert r['step']['status'] == 'met' and r['inference']['status'] == 'met'
    assert r['mz-peak-fraction']['measurements'][0]['value'] == pytest.approx(15.0)
    # every preset row, options included: 30 no, 45 yes, 50 yes
    assert (r['preset-peak']['met'], r['preset-peak']['measured']) == (2, 3)
    assert r['speed-sab-uniform']['measurements'][0]['value'] == pytest.approx(0.8)
    assert r['speed-sab-uniform']['status'] == 'met'
    assert r['speed-sab-skewed']['status'] == 'not met'  # 8x < 10x
    # PyG's FLOPs over rigid's on the skewed batch only (not mz's, not the uniform batch)
    assert [m['value'] for m in r['speed-sab-skewed-flops']['measurements']] == \
        pytest.approx([8.0])
    assert r['speed-pma-uniform']['status'] == 'not measured'


def test_rows_measured_before_the_fold_are_left_out():
    # at d = 64 the default configurations fold the PMA's key map: `rigid` and `default` rows
    # at d = 64 from files measured before it are listed and not counted (d = 16 rows are);
    # a -chunks row there is not read as them, but its companion target still counts it
    targets = load_script('targets')

    def row(aggr, dim, ms, mib=1.0, nodes=1000):
        return dict(aggr=aggr, degrees='poisson', dim=dim, nodes=nodes, edges=10 * nodes,
                    conv='sage', median_ms=ms, peak_mib=mib, chunk_rows=0)
    old = [row('pyg', 16, 10.0), row('rigid', 16, 5.0), row('pyg', 64, 10.0),
           row('rigid', 64, 2.0), row('default', 64, 4.0),
           row('pyg', 64, 10.0, nodes=10000), dict(row('rigid-chunks', 64, 3.0, nodes=10000),
                                                   chunk_rows=32768)]
    new = [row('pyg', 64, 10.0), row('rigid', 64, 8.0), row('default', 64, 20.0)]
    slopes = [dict(aggr='rigid', degrees='poisson', dim=d, memory_slope=v)
              for d, v in ((16, 0.9), (64, 0.95))]
    data = {'message_passing': dict(rows=old, slopes=slopes),
            'message_passing_fold': dict(rows=new, slopes=[dict(
                aggr='default', degrees='poisson', dim=64, memory_slope=1.05)])}
    r = by_key(targets.evaluate(data))
    assert sorted(m['value'] for m in r['mp-time']['measurements']) == pytest.approx([0.5, 0.8])
    assert [m['source'] for m in r['mp-default']['measurements']] == ['message_passing_fold']
    assert [m['value'] for m in r['mp-default']['measurements']] == pytest.approx([2.5])
    assert [m['value'] for m in r['mp-time-chunks']['measurements']] == pytest.approx([0.3])
    # memory slopes: d = 16 of the old file and the fold file's, not the old one at d = 64
    assert [m['value'] for m in r['mp-linear']['measurements']] == pytest.approx([0.9, 1.05])
    left_out = targets.superseded(data)
    for name in ('rigid', 'default'):
        assert left_out[('message_passing', f'{name}, poisson, d=64, 1000 nodes, sage')] \
            == targets._UNFOLDED_MP
    assert 'companion rows' in left_out[
        ('message_passing', 'rigid-chunks, poisson, d=64, 10000 nodes, sage')]
    assert not any(label == 'message_passing_fold' for label, _ in left_out)
    assert ('message_passing', 'rigid, poisson, d=16, 1000 nodes, sage') not in left_out


def test_default_rows_on_power_law_graphs_before_the_padded_keys_are_left_out():
    # the default aggregation's rows on power-law graphs (hubs: wide values in big blocks)
    # from files measured before the queries and keys were padded are listed and not counted,
    # nor their memory slopes; rigid rows, Poisson rows and the padded files' rows count
    targets = load_script('targets')

    def row(aggr, degrees, ms):
        return dict(aggr=aggr, degrees=degrees, dim=16, nodes=1000, edges=10000, conv='sage',
                    median_ms=ms, peak_mib=1.0, chunk_rows=0)
    old = [row('rigid', 'power-law', 10.0), row('default', 'power-law', 35.0),
           row('rigid', 'poisson', 10.0), row('default', 'poisson', 20.0)]
    padded = [row('rigid', 'power-law', 10.0), row('default', 'power-law', 13.0)]
    slopes = [dict(aggr=a, degrees=g, dim=16, memory_slope=v)
              for a, g, v in (('default', 'power-law', 0.5), ('rigid', 'power-law', 0.9),
                              ('default', 'poisson', 1.0))]
    data = {'message_passing': dict(rows=old, slopes=slopes),
            'message_passing_power_law_padded': dict(rows=padded)}
    r = by_key(targets.evaluate(data))
    assert sorted((m['source'], m['value']) for m in r['mp-default']['measurements']) == [
        ('message_passing', pytest.approx(2.0)),
        ('message_passing_power_law_padded', pytest.approx(1.3))]
    assert r['mp-default']['status'] == 'met'
    assert sorted(m['value'] for m in r['mp-linear']['measurements']) == pytest.approx([0.9, 1.0])
    left_out = targets.superseded(data)
    assert left_out[('message_passing', 'default, power-law, d=16, 1000 nodes, sage')] \
        == targets._UNPADDED_MP
    assert not any(label == 'message_passing_power_law_padded' for label, _ in left_out)
    assert ('message_passing', 'rigid, power-law, d=16, 1000 nodes, sage') not in left_out
    assert ('message_passing', 'default, poisson, d=16, 1000 nodes, sage') not in left_out


def test_inference_files_count_in_their_own_rows_only():
    # a full-graph inference file (message_passing.py --inference) is read by the mp-infer-*
    # companion rows and the memory slopes, never as the training targets' forward + backward
    targets = load_script('targets')
    inference = mp_file(0.5, 0.3, 1.5, 0.8, 1000.0)
    for row in inference['rows']:
        row['inference'] = True
    training = mp_file(0.9, 0.4, 2.0, 0.95, 3000.0)
    # an inference row in a training file (a run with --inference and --out of a training
    # file) is not read there: were it read, rigid / PyG on this graph would be 0.01
    training['rows'].insert(0, dict(training['rows'][1], median_ms=0.1, inference=True))
    data = {'message_passing_rows': training, 'message_passing_inference': inference}
    r = by_key(targets.evaluate(data))
    assert [m['source'] for m in r['mp-time']['measurements']] == ['message_passing_rows']
    assert [m['value'] for m in r['mp-time']['measurements']] == pytest.approx([0.9])
    assert [m['value'] for m in r['mp-infer-time']['measurements']] == pytest.approx([0.5])
    assert [m['source'] for m in r['mp-infer-time']['measurements']] == [
        'message_passing_inference']
    assert [m['value'] for m in r['mp-infer-memory']['measurements']] == pytest.approx([0.3])
    assert [m['value'] for m in r['mp-infer-power-law']['measurements']] == pytest.approx([200])
    assert 1.5 in [pytest.approx(m['value']) for m in r['mp-infer-default']['measurements']]
    assert all(m['source'] == 'message_passing_inference'
               for key in ('mp-infer-time', 'mp-infer-memory', 'mp-infer-power-law',
                           'mp-infer-default') for m in r[key]['measurements'])
    assert not any(m['source'] == 'message_passing_inference'
                   for key in ('mp-time', 'mp-memory', 'mp-power-law', 'mp-default',
                               'mp-1e5-memory') for m in r[key]['measurements'])
    assert [m['value'] for m in r['mp-linear']['measurements']] == pytest.approx([0.95, 0.8])
    # its stale rows are listed as those of the training files are
    assert any(label == 'message_passing_inference' for label, _ in targets.superseded(data))
    # a failed row (PyG out of memory, say) gives no ratio and is listed with its error
    data['message_passing_inference']['rows'].append(dict(
        aggr='pyg', degrees='power-law', dim=64, nodes=1000, conv='sage', inference=True,
        error='RuntimeError: can\'t allocate\n memory'))
    r = by_key(targets.evaluate(data))
    assert [m['value'] for m in r['mp-infer-power-law']['measurements']] == pytest.approx([200])
    assert targets.failed_rows(data) == [('message_passing_inference',
                                          'pyg, power-law, d=64, 1000 nodes, sage',
                                          "RuntimeError: can't allocate memory")]
    assert "`pyg, power-law, d=64, 1000 nodes, sage`: RuntimeError: can't allocate memory" in \
        targets.markdown(targets.evaluate(data), data, 'cmd')


def test_pyg_without_its_fast_path_has_companion_rows_of_its_own():
    # `pyg-nofast` rows (PyG with PyTorch's attention fast path off) give the mp-infer-*-nofast
    # rows, where the `pyg` row failed too; the rigid / pyg rows stay read from `pyg` alone
    targets = load_script('targets')
    rows = [dict(aggr=a, degrees=deg, dim=16, nodes=1000, edges=10000, conv='sage',
                 median_ms=ms, peak_mib=mib, inference=True)
            for a, deg, ms, mib in (('pyg-nofast', 'poisson', 20.0, 40.0),
                                    ('pyg', 'poisson', 10.0, 100.0),
                                    ('rigid', 'poisson', 5.0, 10.0),
                                    ('pyg-nofast', 'power-law', 5000.0, 900.0),
                                    ('rigid', 'power-law', 10.0, 9.0))]
    rows.append(dict(aggr='pyg', degrees='power-law', dim=16, nodes=1000, conv='sage',
                     inference=True, error='RuntimeError: can\'t allocate memory'))
    r = by_key(targets.evaluate({'message_passing_inference_nofast': dict(rows=rows)}))
    assert [m['value'] for m in r['mp-infer-time-nofast']['measurements']] == \
        pytest.approx([0.25])
    assert [m['value'] for m in r['mp-infer-memory-nofast']['measurements']] == \
        pytest.approx([0.25])
    assert [m['value'] for m in r['mp-infer-power-law-nofast']['measurements']] == \
        pytest.approx([500])
    assert [m['value'] for m in r['mp-infer-time']['measurements']] == pytest.approx([0.5])
    assert r['mp-infer-power-law']['measurements'] == []
    assert r['mp-infer-power-law-nofast']['status'] == 'met'
    # the target with no measurement names the failed side's rows, and the table says so
    assert r['mp-infer-power-law']['failed_other_side'] == \
        ['message_passing_inference_nofast: pyg, d=16, 1000 nodes']
    assert r['mp-infer-power-law-nofast']['failed_other_side'] == []
    assert r['mp-infer-time']['failed_other_side'] == []
    records = targets.evaluate({'message_passing_inference_nofast': dict(rows=rows)})
    text = targets.markdown(records, {}, 'cmd')
    line = next(x for x in text.splitlines()
                if x.startswith('| message passing inference: PyG / `rigid`'))
    assert 'the other side failed on every such graph (1 row,' in line
    # where that side ran on another power-law graph (whose pair has no rigid row), its failure
    # is not said to be why nothing was measured
    more = rows + [dict(aggr='pyg', degrees='power-law', dim=64, nodes=1000, edges=10000,
                        conv='sage', median_ms=9000.0, peak_mib=900.0, inference=True)]
    r = by_key(targets.evaluate({'message_passing_inference_nofast': dict(rows=more)}))
    assert r['mp-infer-power-law']['status'] == 'not measured'
    assert r['mp-infer-power-law']['failed_other_side'] == []


def test_committed_results(tmp_path):
    targets = load_script('targets')
    targets.main(['--out', str(tmp_path)])
    saved = json.loads((tmp_path / 'targets.json').read_text())
    assert [r['key'] for r in saved['targets']] == [t[0] for t in targets.TARGETS]
    text = (tmp_path / 'targets.md').read_text()
    for key, label, *_ in targets.TARGETS:
        assert label in text
    for rec in saved['targets']:
        assert rec['met'] == sum(m['meets'] for m in rec['measurements'])


def test_auto_rows_agree_with_the_library():
    from torch_mz.nn.aggr import AUTO_CHUNK_ELEMENTS, MZAggregation, auto_chunk_rows
    targets = load_script('targets')
    assert targets.AUTO_ELEMENTS == AUTO_CHUNK_ELEMENTS
    for dim in (1, 8, 16, 48, 64, 3000):
        assert targets.auto_group(dim) == auto_chunk_rows(dim)
        aggr = MZAggregation(4, dim=dim, heads=1, num_generators=0, value='rigid')
        for edges in (2 * auto_chunk_rows(dim), 2 * auto_chunk_rows(dim) + 1):
            assert targets.auto_chunk(edges, dim) == (aggr._chunk_rows(edges) or 0)
    # on a CUDA device the groups scale with its memory, as in the library
    for memory in (2 ** 30, 2 ** 34, 141 * 2 ** 30):
        for dim in (16, 64):
            assert targets.auto_group(dim, memory) == auto_chunk_rows(dim, memory)


def test_gpu_rows_in_the_cpus_groups_are_stale():
    # a GPU row that took groups before they scaled with the device's memory (no
    # `device_memory` in the row) is listed, not counted; one measured at once still counts,
    # and a row that records its device's memory is judged by that device's groups
    targets = load_script('targets')

    def row(aggr, nodes, chunk_rows, **extra):
        return dict(aggr=aggr, degrees='poisson', dim=64, nodes=nodes, edges=10 * nodes,
                    conv='sage', device='cuda', chunk_rows=chunk_rows, **extra)
    grouped = row('rigid', 10 ** 5, 32768)
    assert targets._mp_stale(grouped)
    assert "the CPU's groups of 32,768 rows" in targets._stale_reason(grouped)
    assert not targets._mp_stale(row('rigid', 1000, 0))
    assert not targets._mp_stale(row('rigid-chunks', 10 ** 5, 32768))  # asked for by name
    h200 = 141 * 2 ** 30
    assert not targets._mp_stale(row('default', 10 ** 5, 0, device_memory=h200))
    assert targets._mp_stale(row('default', 10 ** 5, 32768, device_memory=h200))
    small = 2 ** 34  # 16 GiB: groups of 131,072 rows at d = 64
    assert not targets._mp_stale(row('default', 10 ** 5, 131072, device_memory=small))
    assert targets.auto_chunk_of(row('default', 10 ** 5, 0)) is None
    assert targets.auto_chunk_of(dict(row('default', 10 ** 5, 0), device='cpu')) == 32768
    data = {'gpu_message_passing': dict(rows=[
        dict(row('pyg', 10 ** 5, None), median_ms=100.0, peak_mib=1000.0),
        dict(grouped, median_ms=700.0, peak_mib=50.0),
        dict(row('rigid-chunks', 10 ** 5, 32768), median_ms=700.0, peak_mib=50.0)])}
    left_out = targets.superseded(data)
    assert ('gpu_message_passing', 'rigid, poisson, d=64, 100000 nodes, sage') in left_out
    r = {t['key']: t for t in targets.evaluate(data)}
    assert r['mp-time']['measured'] == 0  # neither the stale row nor the CPU's groups stand in


def test_a_profile_counts_as_one_row_per_preset():
    r"""A ``gpu_profile.py`` file holds one row per call; its training-step and inference
    calls of a preset join into one row (the unprofiled wall times), its message-passing calls
    are not read as presets, and a file without FLOP counts gives no FLOP or peak figures."""
    targets = load_script('targets')
    label = targets.PROFILES[0]

    def call(workload, model, wall_ms, **extra):
        return dict(workload=workload, model=model, wall_ms=wall_ms, **extra)

    pc = dict(clouds=32, points=1024)
    rows = [call('SAGEConv fwd+bwd, 1,000 nodes, d=64', 'rigid', 20.0, nodes=1000),
            call('training step, 32 x 1024 points', 'rigid', 20.0, **pc),
            call('inference, 32 x 1024 points', 'rigid', 10.0, **pc),
            call('training step, 32 x 1024 points', 'mz', 70.0, gflop=9.0, pct_of_peak=12.5,
                 **pc),
            call('inference, 32 x 1024 points', 'mz', 25.0, **pc)]
    data = {label: dict(rows=rows)}
    joined = {r['model']: r for r in targets._step_rows(data, label)}
    assert set(joined) == {'rigid', 'mz'}
    assert joined['rigid']['step_s'] == pytest.approx(0.02)
    assert joined['mz']['infer_s'] == pytest.approx(0.025)
    assert [(w, v) for _, w, v in targets._step_pairs(data, 'step_s')] == [
        ('mz / rigid', pytest.approx(3.5))]
    assert [v for _, _, v in targets._step_pairs(data, 'infer_s')] == [pytest.approx(2.5)]
    assert list(targets._step_pairs(data, 'infer_gflop')) == []  # not counted in this file
    assert [(w, v) for _, w, v in targets._preset_peak(data)] == [('mz', 12.5)]


def test_the_command_is_recorded_as_given(tmp_path, monkeypatch):
    # called as main(argv) from Python the report recorded 'python benchmarks/targets.py'
    # without its arguments, and from the command line it joined them unquoted
    import shlex
    import sys
    targets = load_script('targets')
    out = tmp_path / 'with space'
    targets.main(['--out', str(out)])
    expected = shlex.join(['python', 'benchmarks/targets.py', '--out', str(out)])
    assert json.loads((out / 'targets.json').read_text())['command'] == expected
    assert f'Command: `{expected}`' in (out / 'targets.md').read_text()
    monkeypatch.setattr(sys, 'argv', ['benchmarks/targets.py', '--out', str(out)])
    targets.main()
    assert json.loads((out / 'targets.json').read_text())['command'] == expected
