r"""``benchmarks/compiled_dropout.py``: the median it reports is the median of the timed calls
(also of an even number of them), and its results are written atomically (nothing timed here)."""
import itertools
import json
import shlex
import sys

import numpy as np
import pytest

from tests._scripts import load_script


@pytest.fixture
def script():
    return load_script('compiled_dropout')


def test_the_median_of_an_even_number_of_calls(script, monkeypatch):
    # 3 untimed calls, then 4 timed ones that take 1, 2, 3 and 4 (fake) seconds: the median is
    # 2.5 s (it reported the upper middle one, 3 s)
    clock = itertools.accumulate(itertools.chain([0.0], [1, 0, 2, 0, 3, 0, 4]))
    monkeypatch.setattr(script.time, 'perf_counter', lambda: next(clock))

    class Loss:
        def backward(self):
            pass
    assert script._median_ms(lambda x: Loss(), None, 4) == pytest.approx(2500.0)
    clock = itertools.accumulate(itertools.chain([0.0], [1, 0, 5, 0, 2]))
    assert script._median_ms(lambda x: Loss(), None, 3) == pytest.approx(2000.0)


def test_a_failed_write_leaves_the_earlier_results_whole(script, tmp_path, monkeypatch):
    # a value json cannot encode failed half-way through compiled_dropout.json, which was opened
    # for writing (truncated) before anything was serialised
    out = tmp_path / 'dropout'
    out.mkdir()
    earlier = '{"command": "earlier results"}'
    (out / 'compiled_dropout.json').write_text(earlier)
    monkeypatch.setattr(script, '_median_ms', lambda fn, x, repeats: np.float32(1.0))
    monkeypatch.setattr(script.torch, 'compile', lambda fn: fn)
    monkeypatch.setattr(sys, 'argv', ['compiled_dropout.py', '--repeats', '2', '--out',
                                      str(out)])
    with pytest.raises(TypeError):
        script.main()
    assert (out / 'compiled_dropout.json').read_text() == earlier
    monkeypatch.setattr(script, '_median_ms', lambda fn, x, repeats: 1.0)
    script.main()
    data = json.loads((out / 'compiled_dropout.json').read_text())
    assert data['median_ms']['F.dropout, eager'] == 1.0 and '--repeats 2' in data['command']
    assert '| F.dropout, eager | 1.0 |' in (out / 'compiled_dropout.md').read_text()


def test_repeats_must_be_positive(script, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, 'argv', ['compiled_dropout.py', '--repeats', '0', '--out',
                                      str(tmp_path / 'dropout')])
    with pytest.raises(SystemExit) as e:
        script.main()
    assert e.value.code == 2 and '--repeats' in capsys.readouterr().err
    assert not (tmp_path / 'dropout').exists()


def test_the_recorded_command_quotes_its_arguments(script, tmp_path, monkeypatch):
    # the command was joined unquoted: an --out with a space read back as two arguments
    out = tmp_path / 'with space' / 'dropout'
    monkeypatch.setattr(script, '_median_ms', lambda fn, x, repeats: 1.0)
    monkeypatch.setattr(script.torch, 'compile', lambda fn: fn)
    monkeypatch.setattr(sys, 'argv', ['compiled_dropout.py', '--repeats', '2', '--out',
                                      str(out)])
    script.main()
    command = json.loads((out / 'compiled_dropout.json').read_text())['command']
    assert shlex.split(command)[-2:] == ['--out', str(out)]
    assert f'`{command}`' in (out / 'compiled_dropout.md').read_text()


def test_an_out_file_is_refused_before_timing(script, tmp_path, monkeypatch, capsys):
    # --out naming a file was found only when the results were written, after every timing
    out = tmp_path / 'dropout'
    out.write_text('not a folder')

    def refuse(fn, x, repeats):
        raise AssertionError('timed before --out was checked')
    monkeypatch.setattr(script, '_median_ms', refuse)
    monkeypatch.setattr(sys, 'argv', ['compiled_dropout.py', '--out', str(out)])
    with pytest.raises(SystemExit) as e:
        script.main()
    assert e.value.code == 2 and 'is a file, not a folder' in capsys.readouterr().err
