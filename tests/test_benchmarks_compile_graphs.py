r"""``benchmarks/compile_graphs.py``: the graphs torch.compile makes of a call, counted by
``torch._dynamo.explain``; the attention layouts are found outside the compiled graph, one break
per attention, not one per host read of the search."""
import json
import shlex
import sys

import pytest

from tests._scripts import BENCHMARKS, load_script, recorded_argv, usage_error


def test_counts_the_graphs_of_a_message_passing_call_and_a_preset(tmp_path):
    script = load_script('compile_graphs')
    out = tmp_path / 'cg'
    script.main(['--aggrs', 'rigid', '--nodes', '50', '--dims', '16', '--presets', 'deepsets',
                 '--out', str(out)])
    rows = json.loads((out / 'compile_graphs.json').read_text())['rows']
    assert [r['model'] for r in rows] == ['rigid', 'deepsets']
    for r in rows:
        assert r['graphs'] == r['breaks'] + 1 >= 1
    # the layout search is one disabled call per attention (it broke the graph at each of its
    # host reads: more than 70 graphs for this call before)
    rigid = rows[0]
    assert rigid['graphs'] <= 40, rigid['reasons']
    assert any('_dense_layout' in k or 'functional.py' in k for k in rigid['reasons'])
    assert 'compile_graphs.py --aggrs rigid' in (out / 'compile_graphs.md').read_text()


def test_the_docstring_says_which_workloads_are_called_eagerly_first(monkeypatch):
    # the docstring said every workload was called once eagerly before explain; the presets
    # never were (their counts are the same either way)
    script = load_script('compile_graphs')
    calls = []

    def explain(module, *args):
        calls.append(('explain', type(module).__name__))
        return dict(graphs=1, breaks=0, reasons={}, **{'top reasons': ''})

    def counting(module):
        module.register_forward_pre_hook(lambda m, a: calls.append(('call', type(m).__name__)))
        return module
    monkeypatch.setattr(script, 'explain', explain)
    build, build_aggr = script.build, script.build_aggr
    monkeypatch.setattr(script, 'build', lambda *a: counting(build(*a)))
    monkeypatch.setattr(script, 'build_aggr', lambda *a: counting(build_aggr(*a)))
    script.message_passing_row('rigid', 50, 16)
    assert [c[0] for c in calls] == ['call', 'explain']  # the aggregation eagerly first
    calls.clear()
    script.preset_row('deepsets', 2, 8)
    assert [c[0] for c in calls] == ['explain']  # the preset on its first call
    doc = ' '.join(script.__doc__.split())
    assert 'each convolution is called once eagerly first' in doc
    assert 'the presets are explained on their first call' in doc


def test_pyg_at_a_width_its_heads_do_not_divide_is_refused(tmp_path, monkeypatch, capsys):
    # an AssertionError traceback once the rows before had been explained
    out = tmp_path / 'graphs'
    usage_error('compile_graphs', ['--nodes', '10', '--dims', '8,6', '--aggrs', 'rigid,pyg',
                                   '--out', str(out)], monkeypatch, capsys,
                '--dims', '6 not a multiple of the 4 heads of pyg')
    assert not out.exists()


def test_the_command_is_recorded_as_given(tmp_path, monkeypatch):
    # the arguments were joined unquoted: an --out with a space read as two words
    script = load_script('compile_graphs')
    monkeypatch.setattr(script, 'explain', lambda module, *args: dict(
        graphs=1, breaks=0, reasons={}, **{'top reasons': ''}))
    out = tmp_path / 'with space'
    argv = ['--aggrs', 'rigid', '--nodes', '50', '--dims', '16', '--presets', 'deepsets',
            '--out', str(out)]
    script.main(argv)
    expected = shlex.join(['python', 'benchmarks/compile_graphs.py'] + argv)
    assert json.loads((out / 'compile_graphs.json').read_text())['environment']['command'] == \
        expected
    assert shlex.split(expected)[-1] == str(out)


def faking_rows(script, monkeypatch, stop=None):
    r"""Rows made up of the options, nothing explained; Ctrl-C where the model :obj:`stop` is
    reached the first time. Returns the list of the models made."""
    made = []

    def row(workload, model):
        if model == stop and 'stopped' not in made:
            made.append('stopped')
            raise KeyboardInterrupt
        made.append(model)
        return dict(workload=workload, model=model, graphs=2, breaks=1, reasons={'x': 1},
                    **{'top reasons': '1 x x'})
    monkeypatch.setattr(script, 'message_passing_row', lambda aggr, nodes, dim: row(
        f'SAGEConv, {nodes} Poisson nodes, d = {dim}', aggr))
    monkeypatch.setattr(script, 'preset_row', lambda preset, clouds, points: row(
        f'preset, {clouds} x {points} points', preset))
    monkeypatch.setattr(script.torch, 'set_num_threads', lambda n: None)
    return made


ARGV = ['--aggrs', 'pyg,rigid', '--nodes', '50', '--dims', '16', '--presets', 'deepsets']


def refused(script, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        script.main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_rows_made_before_ctrl_c_are_kept_and_resumed(tmp_path, monkeypatch, capsys):
    # the report was written once, at the end: Ctrl-C (or a failure, minutes in) lost every
    # row explained, and there was no --resume
    from torch_mz.study import EXIT_INTERRUPTED
    script = load_script('compile_graphs')
    made = faking_rows(script, monkeypatch, stop='rigid')
    monkeypatch.setattr(sys, 'argv', ['pytest'])
    out = tmp_path / 'cg'
    out.mkdir()
    earlier = out / 'compile_graphs.json'
    earlier.write_text('{"rows": []}')  # an earlier run's complete report: left alone
    argv = ARGV + ['--out', str(out)]
    assert script.main(argv) == EXIT_INTERRUPTED
    err = capsys.readouterr().err.strip()
    partial = out / 'compile_graphs.partial.json'
    assert len(err.splitlines()) == 1 and str(partial) in err and '--resume' in err
    data = json.loads(partial.read_text())
    assert [r['model'] for r in data['rows']] == ['pyg'] and data['pending'] == 2
    assert data['setup']['aggrs'] == ['pyg', 'rigid']
    assert 'Partial: 2 more row(s) not made' in (out / 'compile_graphs.partial.md').read_text()
    assert earlier.read_text() == '{"rows": []}'
    for extra, needles in (([], ('interrupted run', '--resume', '--overwrite')),
                           (['--resume', '--points', '32'], ('other settings',
                                                             'points 64 there, 32 here')),
                           (['--resume', '--overwrite'], ('not allowed with --resume', ))):
        message = refused(script, argv + extra, capsys)
        assert all(needle in message for needle in needles), message
    # another torch_geometric (no option says so): graphs of other code in one table
    with monkeypatch.context() as m:
        m.setattr(script, 'environment',
                  lambda: dict(data['environment'], torch_geometric='0.0'))
        assert 'torch_geometric' in refused(script, argv + ['--resume'], capsys)
    assert json.loads(partial.read_text()) == data
    made[:] = ['stopped']
    assert script.main(argv + ['--resume']) is None
    assert made == ['stopped', 'rigid', 'deepsets']  # (the kept row not made again)
    result = json.loads(earlier.read_text())
    assert [r['model'] for r in result['rows']] == ['pyg', 'rigid', 'deepsets']
    # (it records the partial report it replaced: remove_stale_partial knows that one)
    assert sorted(result) == ['environment', 'minutes', 'replaces_partial', 'rows', 'setup']
    assert sorted(result['setup']) == ['aggrs', 'clouds', 'dims', 'nodes', 'points', 'presets']
    assert 'Partial' not in (out / 'compile_graphs.md').read_text()
    assert not partial.exists() and not (out / 'compile_graphs.partial.md').exists()


def test_a_complete_report_of_another_command_is_not_replaced_unasked(tmp_path, monkeypatch,
                                                                      capsys):
    # a run of other options replaced the complete report in --out at its end, unasked
    script = load_script('compile_graphs')
    made = faking_rows(script, monkeypatch)
    out = tmp_path / 'cg'
    argv = ARGV + ['--out', str(out)]
    assert script.main(argv) is None
    complete = out / 'compile_graphs.json'
    earlier = complete.read_text()
    command = json.loads(earlier)['environment']['command']
    made.clear()
    message = refused(script, argv + ['--nodes', '100'], capsys)
    assert (f'argument --out: {complete} is the complete report of another command '
            f'(`{command}`)') in message
    assert 'nodes [50] there, [100] here' in message and 'pass --overwrite' in message
    assert made == [] and complete.read_text() == earlier
    # the same options (their lists in another order) make every row again and replace it;
    # --overwrite replaces another command's
    assert script.main(['--aggrs', 'rigid,pyg'] + argv[2:]) is None
    assert made == ['rigid', 'pyg', 'deepsets']
    assert script.main(argv + ['--nodes', '100', '--overwrite']) is None
    assert json.loads(complete.read_text())['setup']['nodes'] == [100]


@pytest.mark.parametrize('folder', ['compile_graphs', 'compile_graphs_ede49ff'])
def test_a_committed_report_is_resumed_by_its_own_command(folder, tmp_path, monkeypatch):
    # each committed report, with the command it records (its --out a copy of its folder),
    # is no other command's: --resume makes its rows again and replaces it
    import shutil
    script = load_script('compile_graphs')
    made = faking_rows(script, monkeypatch)
    out = tmp_path / folder
    shutil.copytree(BENCHMARKS / 'results' / folder, out)
    data = json.loads((out / 'compile_graphs.json').read_text())
    argv = recorded_argv(data['environment']['command'], 'compile_graphs', out)
    assert script.main(argv + ['--resume']) is None
    assert len(made) == len(data['rows'])
    assert json.loads((out / 'compile_graphs.json').read_text())['setup'] == data['setup']


def test_a_partial_report_left_beside_the_complete_one_is_not_resumed(tmp_path, monkeypatch,
                                                                      capsys):
    # Ctrl-C between writing the complete report and removing the partial one left both: a
    # call without options was refused, and --resume made the last row again
    from torch_mz.study import EXIT_INTERRUPTED
    script = load_script('compile_graphs')
    made = faking_rows(script, monkeypatch)
    monkeypatch.setattr(sys, 'argv', ['pytest'])
    out = tmp_path / 'cg'
    argv = ARGV + ['--out', str(out)]
    remove_results = script.remove_results

    def stopped(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(script, 'remove_results', stopped)
    assert script.main(argv) == EXIT_INTERRUPTED
    capsys.readouterr()
    partial, complete = out / 'compile_graphs.partial.json', out / 'compile_graphs.json'
    assert partial.exists() and [r['model'] for r in json.loads(complete.read_text())['rows']] \
        == ['pyg', 'rigid', 'deepsets']
    monkeypatch.setattr(script, 'remove_results', remove_results)
    report = complete.read_text()
    made.clear()
    assert script.main(argv + ['--resume']) is None
    assert made == [] and complete.read_text() == report  # nothing made again
    assert capsys.readouterr().out.startswith(f'nothing to resume: {complete} is the complete')
    assert sorted(p.name for p in out.iterdir()) == ['compile_graphs.json', 'compile_graphs.md']
    # left again: a call without options is not refused, and makes every row
    monkeypatch.setattr(script, 'remove_results', stopped)
    assert script.main(argv + ['--overwrite']) == EXIT_INTERRUPTED
    monkeypatch.setattr(script, 'remove_results', remove_results)
    made.clear()
    assert script.main(argv) is None
    assert made == ['pyg', 'rigid', 'deepsets'] and not partial.exists()
    assert f'removed {partial}' in capsys.readouterr().out
