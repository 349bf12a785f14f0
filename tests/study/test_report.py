import json

import pytest

from torch_mz.study.report import (markdown_table, summarize, summary_markdown, write_report,
                                   write_results)


def test_markdown_table():
    text = markdown_table([dict(a=1, b=0.123456), dict(a=2)], ['a', 'b'])
    assert text.splitlines() == ['| a | b |', '|---|---|', '| 1 | 0.1235 |', '| 2 |  |']


def test_write_report(tmp_path):
    env = dict(command='python study.py', cpu_count=2, torch='2.x', threads=1, cuda=None)
    write_report(str(tmp_path), 'study', 'A study', env, {'seeds': 2}, '| t |\n',
                 dict(rows=[{'cell': 'a'}]), 0.5, notes='A note.')
    payload = json.loads((tmp_path / 'study.json').read_text())
    assert list(payload) == ['environment', 'setup', 'minutes', 'rows']
    assert payload['rows'] == [{'cell': 'a'}] and payload['setup'] == {'seeds': 2}
    assert (tmp_path / 'study.md').read_text() == (
        "# A study\n\nCommand: `python study.py`  \nSetup: {'seeds': 2}; 0.5 min on 2 CPUs "
        "(torch 2.x, 1 thread).\n\n| t |\n\nA note.\n\n![plot](study.png)\n")
    write_report(str(tmp_path), 'gpu', 'On a GPU', dict(env, cuda='H200'), {}, '', {}, 1.0,
                 plot=False)
    assert '1 thread, GPU: H200).' in (tmp_path / 'gpu.md').read_text()
    write_report(str(tmp_path), 'two', 'Two threads', dict(env, threads=2), {}, '', {}, 1.0)
    assert '(torch 2.x, 2 threads).' in (tmp_path / 'two.md').read_text()


def test_summary_over_seeds():
    runs = [dict(model='a', params=10, test=dict(r2=0.5, mse=1.0, mae=0.5), wall_time_s=60),
            dict(model='a', params=10, test=dict(r2=0.7, mse=3.0, mae=1.5), wall_time_s=180),
            dict(model='b', params=20, test=dict(r2=0.1, mse=2.0, mae=1.0), wall_time_s=60)]
    a, b = summarize(runs, 'regression')
    assert (a['model'], a['seeds'], a['params'], b['seeds']) == ('a', 2, 10, 1)
    assert (a['r2'], a['r2_std'], a['mse'], a['minutes']) == pytest.approx((0.6, 0.1, 2.0, 2.0))
    lines = summary_markdown([a, b], 'regression').splitlines()
    assert lines[0] == '| model | params | seeds | test r2 | test mse | test mae | min/run |'
    assert lines[2] == '| a | 10 | 2 | 0.6000 ± 0.1000 | 2.0000 ± 1.0000 | 1.0000 ± 0.5000 | 2.00 |'
    assert lines[-1].startswith('Test figures are the mean ± the standard deviation over seeds '
                                '(the population one, ddof = 0')  # (0.6 ± 0.1 above: ddof 0)


def test_write_results(tmp_path):
    write_results(str(tmp_path / 'new'), 'results', {'b': 1, 'a': [2]}, '# t\n')
    assert (tmp_path / 'new' / 'results.md').read_text() == '# t\n'
    assert (tmp_path / 'new' / 'results.json').read_text() == '{\n  "b": 1,\n  "a": [\n    2\n  ]\n}\n'


def test_check_out_folder_names_what_cannot_be_written(tmp_path):
    from torch_mz.study import check_out_folder
    assert check_out_folder(str(tmp_path / 'new' / 'deep')) is None
    assert not (tmp_path / 'new').exists()  # (the probe's folders removed again)
    assert check_out_folder(str(tmp_path)) is None and list(tmp_path.iterdir()) == []
    (tmp_path / 'afile').write_text('x')
    assert 'is a file, not a folder' in check_out_folder(str(tmp_path / 'afile'))
    assert 'cannot be written' in check_out_folder(str(tmp_path / 'afile' / 'sub'))


def test_summary_leaves_diverged_runs_out_of_the_means_and_counts_them():
    nan = float('nan')
    runs = [dict(model='a', params=10, test=dict(r2=0.5, mse=1.0, mae=0.5), wall_time_s=60),
            dict(model='a', params=None, diverged='Training loss is nan in epoch 3',
                 test=dict(r2=nan, mse=nan, mae=nan), wall_time_s=180),
            dict(model='b', params=None, diverged='Training loss is nan in epoch 0',
                 test=dict(r2=nan, mse=nan, mae=nan), wall_time_s=60)]
    a, b = summarize(runs, 'regression')
    assert (a['seeds'], a['diverged'], a['params'], a['r2'], a['r2_std']) == (2, 1, 10, 0.5, 0.0)
    assert a['minutes'] == pytest.approx(2.0)  # every run's time
    assert (b['diverged'], b['params']) == (1, None) and b['r2'] != b['r2']  # NaN
    lines = summary_markdown([a, b], 'regression').splitlines()
    assert lines[2].startswith('| a | 10 | 2 (1 diverged) | 0.5000 ± 0.0000 |')
    assert lines[3].startswith('| b |  | 1 (1 diverged) | nan ± nan |')
    fine = summarize(runs[:1], 'regression')[0]
    assert 'diverged' not in fine  # (the entry only where a run diverged)


def test_check_out_folder_removes_what_it_made_when_a_deeper_folder_fails(tmp_path):
    # the first folder it could not remove (one never made) stopped the clean-up: a name too
    # long left its parent behind
    from torch_mz.study import check_out_folder
    out = tmp_path / 'leftover' / ('x' * 300)
    assert 'cannot be written' in check_out_folder(str(out))
    assert list(tmp_path.iterdir()) == []


def test_summarize_keeps_the_cells_of_a_grid_apart_and_refuses_a_run_given_twice():
    # run_grid's runs carry their cell: they were averaged across cells (r2 0.7 +- 0.2 from
    # cells at 0.5 and 0.9), and one record passed three times counted as three seeds
    runs = [dict(model='mz', seed=0, params=10, test=dict(r2=0.5, mse=1.0, mae=1.0),
                 wall_time_s=60, cell='easy'),
            dict(model='mz', seed=0, params=10, test=dict(r2=0.9, mse=0.1, mae=0.1),
                 wall_time_s=60, cell='hard')]
    easy, hard = summarize(runs, 'regression')
    assert (easy['cell'], easy['model'], easy['seeds'], easy['r2'], easy['r2_std']) == (
        'easy', 'mz', 1, 0.5, 0.0)
    assert (hard['cell'], hard['r2']) == ('hard', 0.9)
    lines = summary_markdown([easy, hard], 'regression').splitlines()
    assert lines[0].startswith('| cell | model | params | seeds | test r2 |')
    assert lines[3].startswith('| hard | mz | 10 | 1 | 0.9000 ± 0.0000 |')
    with pytest.raises(ValueError, match="model 'mz' seed 0 in cell 'easy' is given twice"):
        summarize(runs[:1] * 3, 'regression')
    plain = [{k: v for k, v in r.items() if k != 'cell'} for r in runs]
    with pytest.raises(ValueError, match="model 'mz' seed 0 is given twice"):
        summarize(plain, 'regression')
    with pytest.raises(ValueError, match="1 of the 2 runs carry a 'cell'"):
        summarize([runs[0], plain[1]], 'regression')
    # a cell 1 and a cell '1' are two cells; seeds 0 and 1 of one cell are one entry
    one, other = summarize([dict(runs[0], cell=1), dict(runs[1], cell='1')], 'regression')
    assert (one['cell'], other['cell']) == (1, '1')
    both = summarize([runs[0], dict(runs[1], cell='easy', seed=1)], 'regression')
    assert len(both) == 1 and (both[0]['seeds'], both[0]['r2']) == (2, pytest.approx(0.7))


def test_markdown_table_escapes_a_bar_and_formats_numpy_numbers():
    import numpy as np
    text = markdown_table([dict(cell='a|b', r2=np.float32(0.123456789), n=np.int64(3))],
                          ['cell', 'r2', 'n', 'mean |error|'])
    assert text.splitlines() == ['| cell | r2 | n | mean \\|error\\| |', '|---|---|---|---|',
                                 '| a\\|b | 0.1235 | 3 |  |']


def test_write_report_says_what_its_minutes_count(tmp_path):
    # a resumed study gave this call's minutes as the study's: the runs read back from an
    # earlier call were not in them
    env = dict(command='python study.py --resume', cpu_count=2, torch='2.x', threads=1)
    write_report(str(tmp_path), 'study', 'A study', env, {}, '', {}, 0.1, plot=False,
                 run_minutes=42.0)
    text = (tmp_path / 'study.md').read_text()
    assert ("; 0.1 min in this call (runs read back from an earlier call are not in it; the "
            "runs' own recorded times, those included, sum to 42.0 min) on 2 CPUs") in text
    payload = json.loads((tmp_path / 'study.json').read_text())
    assert payload['minutes'] == 0.1 and payload['run_minutes'] == 42.0
    write_report(str(tmp_path), 'fresh', 'A study', env, {}, '', {}, 0.1, plot=False)
    assert '; 0.1 min on 2 CPUs' in (tmp_path / 'fresh.md').read_text()
    assert 'run_minutes' not in json.loads((tmp_path / 'fresh.json').read_text())


def test_write_results_interrupted_leaves_the_earlier_pair(tmp_path, monkeypatch):
    # a Ctrl-C while the Markdown file was written left the new JSON beside the earlier table
    import torch_mz.study.report as report
    write_results(str(tmp_path), 'study', {'r2': 0.1}, '| r2 | 0.1 |\n')
    real = report.atomic_write

    def interrupted_at_the_table(path, write, **kwargs):
        if str(path).endswith('.md'):
            raise KeyboardInterrupt
        return real(path, write, **kwargs)
    monkeypatch.setattr(report, 'atomic_write', interrupted_at_the_table)
    with pytest.raises(KeyboardInterrupt):
        write_results(str(tmp_path), 'study', {'r2': 0.9}, '| r2 | 0.9 |\n')
    assert json.loads((tmp_path / 'study.json').read_text()) == {'r2': 0.1}
    assert (tmp_path / 'study.md').read_text() == '| r2 | 0.1 |\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['study.json', 'study.md']


def test_remove_results_removes_the_pair_write_results_wrote(tmp_path):
    from torch_mz.study import remove_results, write_results
    write_results(str(tmp_path), 'x.partial', dict(a=1), '# x\n')
    write_results(str(tmp_path), 'x', dict(a=1), '# x\n')
    remove_results(str(tmp_path), 'x.partial')
    assert sorted(p.name for p in tmp_path.iterdir()) == ['x.json', 'x.md']
    remove_results(str(tmp_path), 'x.partial')  # (nothing left to remove: no error)
