r"""``benchmarks/compile_graphs.py``: the graphs torch.compile makes of a call, counted by
``torch._dynamo.explain``; the attention layouts are found outside the compiled graph, one break
per attention, not one per host read of the search."""
import json

from tests._scripts import load_script


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
