r"""Every Python example in README.md runs as written, and the converged reproduction's figures
there are the committed claim files', each ± with the standard deviation it names."""
import json
import math
import os
import re

import pytest

README = os.path.join(os.path.dirname(__file__), '..', 'README.md')


def _blocks():
    text = open(README).read()
    return re.findall(r'```python\n(.*?)```', text, flags=re.S)


@pytest.mark.parametrize('index', range(len(_blocks())))
def test_readme_python_example_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = _blocks()[index]
    exec(compile(code, f'README.md[python block {index}]', 'exec'), {'__name__': '__readme__'})


# -- the converged reproduction's figures, against the committed claim files ------------------

CLAIMS = os.path.join(os.path.dirname(__file__), '..', 'benchmarks', 'results', 'reproduction',
                      'claims')
#: A reproduction table's claim file, by the bold title of the paragraph above it.
_TABLE_CLAIMS = [(r"\*\*Table 7's rotation column", 'table7-rot'), (r'\*\*Table 1,', 'table1'),
                 (r'\*\*Table 3, MEB', 'table3'), (r'\*\*Table 7,', 'table7'),
                 (r'\*\*Table 28,', 'table28'), (r'\*\*Table 4,', 'table4')]
#: A table row's cell (its first column) as its claim's label names it (``table4 rot d=8
#: un-aligned: ...``), by table.
_TABLE7_CELLS = {'quadratic TDOF, L = 8, d = 32': 'quad L=8', 'MEB radius, d = 8': 'MEB d=8',
                 'covariance norm, d = 8': 'CN d=8'}
_ROW_LABELS = {
    'table1': lambda row: f'L={row}', 'table3': lambda row: f'MEB d={row}',
    'table28': lambda row: f'QM9 {row}', 'table7': _TABLE7_CELLS.__getitem__,
    'table4': lambda row: 'rot ' + row.replace(' ', '').replace(',literal', '')
                                      .replace(',un-aligned', ' un-aligned')}
_ROW_LABELS['table7-rot'] = _ROW_LABELS['table4']
_MODELS = {'Deep Sets': 'deepsets', 'mean-MLP oracle': 'mean-mlp', 'HyperNet': 'hypernet',
           'Perceiver': 'perceiver', 'FiLM': 'film', 'EGNN': 'egnn'}
_FIGURE = re.compile(r'^([+-]?\d+\.\d{3})(?: ± (\d+\.\d{3}))?')


def _claims():
    r"""Every claim of the committed converged reproduction, by its label (``table3 MEB d=8``)."""
    claims = {}
    for name in sorted(os.listdir(CLAIMS)):
        if not name.endswith('.converged.json'):  # (a lock file a regeneration leaves there)
            continue
        with open(os.path.join(CLAIMS, name)) as f:
            for claim in json.load(f):
                claims[claim['claim'].split(':')[0]] = claim
    return claims


def _reproduction_blocks():
    r"""README's converged-reproduction section as paragraphs and tables (blank-line separated)."""
    text = open(README).read()
    section = text.split('### Converged reproduction')[1].split('### Quick-mode studies')[0]
    return [b.strip() for b in re.split(r'\n\s*\n', section) if b.strip()]


def _spread(model: dict, ddof: int) -> float:
    r"""A model's spread over its seeds with :obj:`ddof` from the claim's sample one (ddof 1)."""
    n = model['seeds']
    return model['r2_std'] * (math.sqrt((n - 1) / n) if ddof == 0 else 1.0)


def _model_ddof(caption: str) -> int:
    r"""The ddof a caption gives the models' spreads (it must give one)."""
    assert 'ddof' in caption, f'a ± without its ddof: {caption[:80]!r}'
    return 0 if 'ddof 0' in caption else 1


def test_reproduction_tables_match_the_claim_files():
    r"""Every figure of README's converged-reproduction tables is the committed claim file's, and
    every ± says which standard deviation it is: the models' columns as the caption says (ddof 0,
    the population one over the seeds; ``summary.md`` gives ddof 1), the differences with ddof 1,
    as the verdict rule reads them."""
    claims, blocks, caption, tables = _claims(), _reproduction_blocks(), '', 0
    for block in blocks:
        if not block.startswith('|'):
            caption = block if block.startswith('**') else caption + '\n' + block
            continue
        rows = [[c.strip() for c in line.strip().strip('|').split('|')]
                for line in block.splitlines()]
        header, body = rows[0], rows[2:]
        if not any('±' in cell for row in body for cell in row):
            continue  # (D.3's methods table: no spreads)
        key = next(k for pattern, k in _TABLE_CLAIMS if re.match(pattern, caption))
        tables += 1
        for row in body:
            label = f'{key} {_ROW_LABELS[key](row[0])}'
            claim = claims[label]
            for name, value in zip(header[1:], row[1:]):
                figure = _FIGURE.match(value)
                if figure is None:
                    continue  # (the verdict, the paper's lead)
                mean, spread = figure.groups()
                if ' - ' in name or name == 'ours':  # R²(A) - R²(B), the claim's difference
                    assert mean == f"{claim['ours']['mean']:+.3f}", (label, name, value)
                    if spread is not None:
                        assert 'ddof 1' in caption, f'{label}: the difference names no ddof'
                        assert spread == f"{claim['ours']['std']:.3f}", (label, name, value)
                    continue
                model = claim['ours']['models'][
                    _MODELS.get(name.split(' (')[0], name.split(' (')[0].strip('`'))]
                assert mean == f"{model['r2']:.3f}", (label, name, value)
                if spread is not None:
                    expected = _spread(model, _model_ddof(caption))
                    assert spread == f'{expected:.3f}', (label, name, value)
    assert tables == 6


@pytest.mark.parametrize('title,label,model', [
    ('**`table1-protocol`', 'table1-protocol L=16', None),
    ('**`table3-protocol`', 'table3-protocol MEB d=16', None),
    ('**Appendix D.3', 'd3 quad L=8', 'mz')])
def test_reproduction_figures_in_the_text_say_their_ddof(title, label, model):
    r"""The models' test R² ± spread quoted in the protocol claims' and D.3's paragraphs are the
    claim files' figures with the ddof the paragraph names."""
    claim = _claims()[label]
    text = next(b for b in _reproduction_blocks() if b.startswith(title))
    found = re.findall(r'(?:`([\w-]+)`|(Deep\s+Sets)|(test\s+R²))'
                       r'\s+(\d\.\d{3})\s+±\s+(\d\.\d{3})', text)
    assert found
    for name, deepsets, _, mean, spread in found:
        figures = claim['ours']['models'][model or ('deepsets' if deepsets else name)]
        assert mean == f"{figures['r2']:.3f}", (label, name, mean)
        assert spread == f'{_spread(figures, _model_ddof(text)):.3f}', (label, name, spread)


def test_every_spread_of_the_claims_says_its_ddof():
    # D.3's differences against the paper's set-matching figures (ddof 1, as every verdict's)
    # said nothing, under the members' spread labelled ddof 0
    blocks = _reproduction_blocks()
    unsaid = [block.splitlines()[0][:90] for i, block in enumerate(blocks)
              if '±' in block and 'ddof' not in block
              and not (block.startswith('|') and i and 'ddof' in blocks[i - 1])]
    assert unsaid == []


def test_the_figures_of_the_claims_say_their_error_bars():
    # the claims' figures draw the claim files' spreads (ddof 1, since they became sample
    # standard deviations), shown under the tables of Tables 3 and 4, whose captions say ddof 0
    blocks = _reproduction_blocks()
    shown = [i for i, block in enumerate(blocks)
             if re.match(r'!\[[^\]]*\]\(benchmarks/results/reproduction/[\w-]+\.converged\.png\)',
                         block)]
    assert shown  # (Table 3's and Table 4's)
    for i in shown:
        assert 'error bars' in blocks[i - 1] and 'ddof 1' in blocks[i - 1], blocks[i]
