r"""``benchmarks/compile_graphs.py``: the graphs torch.compile makes of a call, counted by
``torch._dynamo.explain``; the attention layouts are found outside the compiled graph, one break
per attention, not one per host read of the search."""
import json

from tests._scripts import load_script, usage_error


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
    import shlex
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
