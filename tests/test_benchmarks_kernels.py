r"""``benchmarks/kernels.py``: the rows it reports (timing itself is the benchmark's business,
not a test's), and options refused before anything compiles."""

import math

import pytest
import torch

from tests._scripts import load_script, usage_error


def test_rows_give_medians_ratios_and_the_difference_from_the_reference():
    script = load_script('kernels')
    x = torch.linspace(-3, 3, 1000)
    variants = dict(copy=lambda: x.clone(), eager=lambda: torch.tanh(x),
                    other=lambda: torch.tanh(x) * (1 + 1e-3))  # a different function shows
    rows = {r['variant']: r for r in script.measure('tanh', variants, repeats=4)}
    assert rows['eager']['/ eager'] == 1.0 and rows['eager']['max_rel_diff'] == 0.0
    assert rows['copy']['max_rel_diff'] is None and 'less copy_ms' not in rows['copy']
    assert rows['other']['max_rel_diff'] == pytest.approx(1e-3, rel=1e-2)
    for row in rows.values():
        t = row['times_s']
        assert len(t) == 4 and row['median_ms'] == pytest.approx(1e3 * (t[1] + t[2]) / 2)
        assert row['min_ms'] <= row['median_ms'] <= row['max_ms']
        assert row['/ eager'] == pytest.approx(row['median_ms'] / rows['eager']['median_ms'])
    assert rows['eager']['less copy_ms'] == pytest.approx(
        rows['eager']['median_ms'] - rows['copy']['median_ms'])


def test_the_difference_shows_every_broken_result():
    script = load_script('kernels')
    diff = script.max_relative_difference
    x = torch.tensor([1.0, -2.0, 4.0])
    # tuples (an output and its gradients) compare element by element, the worst counts
    assert diff((x, 2 * x), (x, x)) == pytest.approx(1.0)
    # a NaN or an infinity in any element, first or not, is NaN
    for broken in (torch.tensor([1.0, float('nan'), 4.0]), torch.tensor([float('inf'), 0, 0])):
        assert math.isnan(diff((x, broken), (x, x))) and math.isnan(diff((broken, x), (x, x)))
    # an all-zero reference: the absolute difference, not a ratio to a tiny number
    assert diff(torch.full((3, ), 1e-3), torch.zeros(3)) == pytest.approx(1e-3)
    assert diff(torch.zeros(3), torch.zeros(3)) == 0.0
    # results that do not pair up are an error, not a silent truncation
    with pytest.raises(ValueError, match='2 results against 1'):
        diff((x, x), (x, ))
    with pytest.raises(ValueError, match='shapes differ'):
        diff(x, x[:2])
    with pytest.raises(ValueError, match='tensor with a tuple'):
        diff((x, ), x)


def test_the_tanh_variants_compute_tanh_from_the_same_input_every_call():
    script = load_script('kernels')
    variants = script.tanh_variants(64, 8)
    g = torch.Generator().manual_seed(0)
    x = 2.0 * torch.randn(64, 8, generator=g)
    assert torch.equal(variants['copy'](), x)
    for name in ('eager', 'compiled', 'fused'):
        first = variants[name]().clone()
        assert torch.equal(variants[name](), first)  # in place, but from the same input
        assert script.max_relative_difference(first, torch.tanh(x)) < 1e-6, name


def test_the_eager_layer_norm_variants_agree_with_the_reference():
    r"""Forward and forward + backward variants return what the reference autograd formula
    gives (the compiled ones are checked against these by tests/nn/test_fused.py)."""
    from torch_mz.nn.zonotope import Zonotope, zonotope_layer_norm_reference
    script = load_script('kernels')
    for backward in (False, True):
        eager = script.layer_norm_variants(16, 3, 8, backward)['eager']()
        g = torch.Generator().manual_seed(1)
        c = torch.randn(16, 8, generator=g)
        gens = 0.1 * torch.randn(16, 3, 8, generator=g)
        weight = 1.0 + 0.1 * torch.randn(8, generator=g)
        grad = torch.randn(16, 3, 8, generator=g)
        norm = torch.nn.LayerNorm(8, eps=1e-5)
        with torch.no_grad():
            norm.weight.copy_(weight)
        gens.requires_grad_()
        out = zonotope_layer_norm_reference(Zonotope(c, gens), norm).gens
        if backward:
            c.requires_grad_()
            gens.grad = None
            out = zonotope_layer_norm_reference(Zonotope(c, gens), norm).gens
            out.backward(grad)
            assert torch.allclose(eager[0], out.detach(), atol=1e-6)
            assert torch.allclose(eager[1], c.grad, atol=1e-5)
            assert torch.allclose(eager[2], gens.grad, atol=1e-5)
            assert torch.allclose(eager[3], norm.weight.grad, atol=1e-4)
        else:
            assert torch.allclose(eager, out.detach(), atol=1e-6)


@pytest.mark.parametrize('argv, needle', [
    (['--tokens', '0'], "argument --tokens: expected an integer >= 1, got '0'"),
    (['--repeats', 'x'], "argument --repeats: expected an integer, got 'x'"),
    (['--threads', '0'], "argument --threads: expected an integer >= 1, got '0'"),
])
def test_bad_options_are_usage_errors(argv, needle, tmp_path, monkeypatch, capsys):
    usage_error('kernels', argv + ['--out', str(tmp_path / 'k')], monkeypatch, capsys, needle)
    (tmp_path / 'file').write_text('x')
    usage_error('kernels', ['--out', str(tmp_path / 'file')], monkeypatch, capsys, 'is a file')
    assert not (tmp_path / 'k').exists()


def test_main_records_the_arguments_it_was_given(tmp_path, monkeypatch):
    # main(argv) recorded the caller's sys.argv as its command (here pytest's), not argv
    import json
    import sys
    script = load_script('kernels')
    row = dict(operation='op', variant='eager', median_ms=1.0, min_ms=1.0, max_ms=1.0,
               **{'/ eager': 1.0, 'max_rel_diff': 0.0})
    # (nothing compiled or timed: the variants, their measurement and auto mode's are stubs)
    monkeypatch.setattr(script, 'tanh_variants', lambda *a: {})
    monkeypatch.setattr(script, 'layer_norm_variants', lambda *a: {})
    monkeypatch.setattr(script, 'measure', lambda name, variants, repeats: [dict(row)])
    monkeypatch.setattr(script.fused, '_FAILED', False)
    monkeypatch.setattr(script.fused, '_tanh_kernel_pays', lambda shape: False)
    monkeypatch.setattr(script.torch, 'set_num_threads', lambda n: None)
    monkeypatch.setattr(sys, 'argv', ['pytest', '-k', 'something else'])
    argv = ['--repeats', '3', '--out', str(tmp_path / 'my results')]
    assert script.main(argv) == 0
    command = json.loads((tmp_path / 'my results' / 'kernels.json').read_text())[
        'environment']['command']
    assert command == f"python benchmarks/kernels.py --repeats 3 --out '{tmp_path}/my results'"
    assert f'Command: `{command}`' in (tmp_path / 'my results' / 'kernels.md').read_text()


def faking_operations(script, monkeypatch, stop=None, fails=None):
    r"""Rows made up for every operation, nothing compiled or timed; Ctrl-C where the first
    operation whose name holds :obj:`stop` is reached the first time, and compiling the fused
    kernels fails in the first one whose name holds :obj:`fails`. Returns the list of the
    operations measured."""
    measured = []

    def measure(name, variants, repeats):
        if stop is not None and stop in name and 'stopped' not in measured:
            measured.append('stopped')
            raise KeyboardInterrupt
        if fails is not None and fails in name:
            script.fused._FAILED = True  # (as torch_mz.nn.fused sets it, with its warning)
        measured.append(name)
        return [dict(operation=name, variant=variant, median_ms=1.0, min_ms=1.0, max_ms=1.0,
                     times_s=[1e-3] * repeats, **{'/ eager': 1.0, 'max_rel_diff': 0.0})
                for variant in ('eager', 'fused')]
    monkeypatch.setattr(script, 'tanh_variants', lambda *a: {})
    monkeypatch.setattr(script, 'layer_norm_variants', lambda *a: {})
    monkeypatch.setattr(script, 'measure', measure)
    monkeypatch.setattr(script, 'plot', lambda rows, path: None)
    monkeypatch.setattr(script.fused, '_FAILED', False)
    monkeypatch.setattr(script.fused, '_tanh_kernel_pays', lambda shape: False)
    monkeypatch.setattr(script.torch, 'set_num_threads', lambda n: None)
    return measured


def refused(script, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        script.main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_operations_measured_before_ctrl_c_are_kept_and_resumed(tmp_path, monkeypatch,
                                                                capsys):
    # the report was written once, at the end: Ctrl-C (or a failure, minutes in) lost every
    # operation timed, and there was no --resume
    import json
    import sys

    from torch_mz.study import EXIT_INTERRUPTED
    script = load_script('kernels')
    measured = faking_operations(script, monkeypatch, stop='forward + backward')
    monkeypatch.setattr(sys, 'argv', ['pytest'])
    out = tmp_path / 'kernels'
    out.mkdir()
    earlier = out / 'kernels.json'
    earlier.write_text('{"rows": []}')  # an earlier run's complete report: left alone
    argv = ['--tokens', '16', '--repeats', '3', '--out', str(out)]
    assert script.main(argv) == EXIT_INTERRUPTED
    err = capsys.readouterr().err.strip()
    partial = out / 'kernels.partial.json'
    assert len(err.splitlines()) == 1 and str(partial) in err and '--resume' in err
    data = json.loads(partial.read_text())
    assert [r['operation'] for r in data['rows']] == [measured[0]] * 2 + [measured[1]] * 2
    assert data['pending'] == 1 and 'auto_tanh_kernel' not in data
    text = (out / 'kernels.partial.md').read_text()
    assert 'Partial: 1 more operation(s) not measured' in text and 'Auto mode' not in text
    assert earlier.read_text() == '{"rows": []}'
    for extra, needles in (([], ('interrupted run', '--resume', '--overwrite')),
                           (['--resume', '--tokens', '32'], ('other settings',
                                                             'tokens 16 there, 32 here')),
                           (['--resume', '--overwrite'], ('not allowed with --resume', ))):
        message = refused(script, argv + extra, capsys)
        assert all(needle in message for needle in needles), message
    with monkeypatch.context() as m:  # (another torch: no option says so)
        m.setattr(script, 'environment', lambda: dict(data['environment'], torch='0.0'))
        assert f"torch {data['environment']['torch']!r} there, '0.0' here" in refused(
            script, argv + ['--resume'], capsys)
    assert json.loads(partial.read_text()) == data
    measured[:] = ['stopped']
    assert script.main(argv + ['--resume']) == 0
    assert measured == ['stopped', 'LayerNorm Jacobian (16, 8, 64), forward + backward']
    result = json.loads(earlier.read_text())
    assert len(result['rows']) == 6 and result['auto_tanh_kernel'] is False
    assert sorted(result) == ['auto_tanh_kernel', 'config', 'environment', 'minutes',
                              'replaces_partial', 'rows']  # (the partial report it replaced)
    assert 'resume' not in result['config'] and 'overwrite' not in result['config']
    text = (out / 'kernels.md').read_text()
    assert 'Partial' not in text and 'Auto mode on this host' in text
    assert not partial.exists() and not (out / 'kernels.partial.md').exists()


def test_a_complete_report_of_another_command_is_not_replaced_unasked(tmp_path, monkeypatch,
                                                                      capsys):
    # a run of other options replaced the complete report in --out at its end, unasked
    import json
    script = load_script('kernels')
    measured = faking_operations(script, monkeypatch)
    out = tmp_path / 'kernels'
    argv = ['--tokens', '16', '--out', str(out)]
    assert script.main(argv) == 0
    complete = out / 'kernels.json'
    earlier = complete.read_text()
    command = json.loads(earlier)['environment']['command']
    measured.clear()
    message = refused(script, argv + ['--repeats', '3'], capsys)
    assert (f'argument --out: {complete} is the complete report of another command '
            f'(`{command}`)') in message
    assert 'repeats 7 there, 3 here' in message and 'pass --overwrite' in message
    assert measured == [] and complete.read_text() == earlier
    # the same options measure again and replace it; --overwrite replaces another command's
    assert script.main(argv) == 0 and len(measured) == 3
    assert script.main(argv + ['--repeats', '3', '--overwrite']) == 0
    assert json.loads(complete.read_text())['config']['repeats'] == 3


def test_a_failed_compile_keeps_the_operations_measured_before_it(tmp_path, monkeypatch,
                                                                  capsys):
    # the rows of an operation whose fused kernels could not compile timed the eager
    # functions under the name 'fused': not written, those measured before it kept
    import json
    script = load_script('kernels')
    measured = faking_operations(script, monkeypatch, fails='LayerNorm')
    out = tmp_path / 'kernels'
    assert script.main(['--tokens', '16', '--out', str(out)]) == 1
    assert 'compiling the fused kernels failed' in capsys.readouterr().err
    assert len(measured) == 2 and not (out / 'kernels.json').exists()
    rows = json.loads((out / 'kernels.partial.json').read_text())['rows']
    assert {r['operation'] for r in rows} == {measured[0]} and 'tanh' in measured[0]


@pytest.mark.parametrize('folder', ['kernels', 'kernels_20261205'])
def test_a_committed_report_is_resumed_by_its_own_command(folder, tmp_path, monkeypatch):
    # each committed report, with the command it records (its --out a copy of its folder),
    # is no other command's: --resume measures its operations again and replaces it
    import json
    import shutil

    from tests._scripts import BENCHMARKS, recorded_argv
    script = load_script('kernels')
    measured = faking_operations(script, monkeypatch)
    out = tmp_path / folder
    shutil.copytree(BENCHMARKS / 'results' / folder, out)
    data = json.loads((out / 'kernels.json').read_text())
    argv = recorded_argv(data['environment']['command'], 'kernels', out)
    assert script.main(argv + ['--resume']) == 0
    assert len(measured) == 3
    assert json.loads((out / 'kernels.json').read_text())['config']['repeats'] == \
        data['config']['repeats']
