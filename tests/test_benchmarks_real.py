r"""The real-data benchmark scripts ``benchmarks/point_clouds.py`` and ``benchmarks/qm9.py``: their
``main()`` end to end on tiny raw files in the real formats (the fixtures of ``tests/datasets``)
with a budget of one epoch, and the message and exit status when the data is missing."""
import json
import math
import os.path as osp

import pytest

from torch_mz.study.statistics import lead_over_best

from tests._scripts import load_script, without_matplotlib
# The raw-file fixtures of the dataset tests: importing them registers them for this module.
from tests.datasets.conftest import modelnet_h5_root, qm9_root, scanobjectnn_root

FIXTURES = (modelnet_h5_root, qm9_root, scanobjectnn_root)  # used by name, as test arguments
TINY = ['--seeds', '1', '--epochs', '1', '--device', 'cpu']


@pytest.fixture(scope='module')
def point_clouds():
    pytest.importorskip('h5py')
    return load_script('point_clouds')


@pytest.fixture(scope='module')
def qm9():
    pytest.importorskip('rdkit')
    return load_script('qm9')


@pytest.mark.filterwarnings('ignore:ModelNet40 .* skipped:UserWarning')  # the fixture's NaN shape
def test_point_clouds_end_to_end(point_clouds, modelnet_h5_root, scanobjectnn_root, tmp_path):
    out = tmp_path / 'results'
    # both fixtures live below tmp_path: ModelNet40/ (5 usable training shapes, 3 test shapes, 128
    # points) and ScanObjectNN/ (OBJ_BG: 5 training objects, 3 test objects, 256 points)
    status = point_clouds.main(['--dataset', 'both', '--root', str(tmp_path),
                                '--modelnet-source', 'hdf5', '--num-points', '64', '--n-train',
                                '4', '--n-val', '1', '--batch-size', '4', '--out', str(out)]
                               + TINY)
    assert status == 0
    with open(out / 'point_clouds.json') as f:
        results = json.load(f)
    cells = {(r['dataset'], r['model']): r for r in results['rows']}
    assert set(cells) == {(d, m) for d in point_clouds.DATASETS for m in point_clouds.MODELS}
    for (dataset, model), row in cells.items():
        assert 0.0 <= row['accuracy'] <= 1.0
        assert row['seeds'] == 1 and row['params'] > 0
        assert row['paper_accuracy'] == point_clouds.PAPER_ACCURACY[model][dataset][0]
    assert results['setup']['sizes'] == {'modelnet40': {'train': 4, 'val': 1, 'test': 3},
                                         'scanobjectnn': {'train': 4, 'val': 1, 'test': 3}}
    assert len(results['runs']) == len(cells)
    text = (out / 'point_clouds.md').read_text()
    assert text.startswith('# ') and 'Command: `python benchmarks/point_clouds.py' in text
    assert '78.1 ± 0.7' in text and '72.9 ± 2.4' in text  # the paper's MZAttn / ST-Large
    assert '## Against the paper' in text and '**ScanObjectNN**' in text
    assert 'standard deviation over seeds (the population one, ddof = 0' in text  # (unsaid)
    assert (out / 'point_clouds.png').stat().st_size > 0
    assert '![plot](point_clouds.png)' in text


@pytest.mark.parametrize('args, expected', [
    (['--dataset', 'both', '--no-download'],
     ['ModelNet40.zip', 'modelnet.cs.princeton.edu', 'hkust-vgd.github.io/scanobjectnn',
      osp.join('ScanObjectNN', 'raw', 'h5_files', 'main_split', 'training_objectdataset.h5')]),
    (['--dataset', 'scanobjectnn'], ['Request access on', 'h5_files.zip']),
    (['--dataset', 'modelnet40', '--modelnet-source', 'hdf5'],
     ['modelnet40_ply_hdf5_2048', 'ply_data_train*.h5', 'ModelNet40.zip']),
    # the release's lists, without which the files read cannot be checked, went unnamed
    (['--dataset', 'modelnet40', '--modelnet-source', 'hdf5', '--no-download'],
     ['ply_data_train*.h5', 'shape_names.txt', 'train_files.txt and test_files.txt']),
])
def test_point_clouds_missing_data(point_clouds, tmp_path, capsys, args, expected):
    out = tmp_path / 'results'
    root = tmp_path / 'empty'
    status = point_clouds.main(args + ['--root', str(root), '--out', str(out)] + TINY)
    err = capsys.readouterr().err
    assert status == point_clouds.EXIT_ERROR != 0
    assert err.startswith('point_clouds.py: error: ') and 'Traceback' not in err
    for text in expected:
        assert text in err
    assert str(root) in err  # says where the files go
    assert not out.exists()  # nothing was trained or written


def test_qm9_end_to_end(qm9, qm9_root, tmp_path):
    # the sdf fixture: 5 molecules of which one is 'uncharacterized', so 4 remain
    out = tmp_path / 'results'
    status = qm9.main(['--source', 'sdf', '--root', str(tmp_path), '--targets', 'mu,homo',
                       '--n-train', '2', '--n-val', '1', '--n-test', '1', '--batch-size', '2',
                       '--out', str(out)] + TINY)
    assert status == 0
    with open(out / 'qm9.json') as f:
        results = json.load(f)
    cells = {(r['target'], r['model']): r for r in results['rows']}
    assert set(cells) == {(t, m) for t in ('mu', 'homo') for m in qm9.MODELS}
    for (target, model), row in cells.items():
        assert math.isfinite(row['mae']) and row['mae'] >= 0
        assert math.isfinite(row['r2']) and row['r2'] <= 1
        assert row['unit'] == {'mu': 'D', 'homo': 'eV'}[target]
        assert row['paper_r2'] == qm9.PAPER_R2.get(model, {}).get(target)
    assert cells['mu', 'mz']['paper_r2'] == 0.761 and cells['mu', 'egnn']['paper_r2'] is None
    text = (out / 'qm9.md').read_text()
    assert 'Command: `python benchmarks/qm9.py --source sdf' in text
    assert '## Against the paper' in text and '**mu**' in text and '**homo**' in text
    assert 'standard deviation over seeds (the population one, ddof = 0' in text  # (unsaid)
    assert (out / 'qm9.png').stat().st_size > 0
    assert '![plot](qm9.png)' in text


def test_qm9_verdict(qm9):
    def row(target, model, r2, std=0.0):
        return dict(target=target, model=model, r2=r2, r2_std=std)

    rows = [row('mu', 'mz', 0.70), row('mu', 'rigid', 0.60), row('mu', 'st-large', 0.72),
            row('alpha', 'mz', 0.95), row('alpha', 'st-large', 0.90),
            row('homo', 'mz', 0.50), row('homo', 'st-large', 0.60), row('homo', 'egnn', 0.99),
            row('gap', 'egnn', 0.9)]  # no mz: no sentence
    lines = qm9.verdict(rows, ['mu', 'alpha', 'homo', 'gap'])
    assert [line.split('**')[1] for line in lines] == ['mu', 'alpha', 'homo']  # gap: no mz
    # the numbers behind the sentences: mz against the best attention baseline (EGNN is none)
    for target, best, gap in (('mu', 'st-large', -0.02), ('alpha', 'st-large', 0.05),
                              ('homo', 'st-large', -0.10)):
        lead = lead_over_best({r['model']: r['r2'] for r in rows if r['target'] == target},
                              'mz', qm9.ATTENTION_BASELINES)
        assert lead.best == best and lead.gap == pytest.approx(gap)
        assert (lead.gap > 0, -qm9.MARGIN <= lead.gap <= 0) == (gap > 0, target == 'mu')


def test_point_clouds_verdict(point_clouds):
    rows = [dict(dataset='modelnet40', model='mz', accuracy=0.70),
            dict(dataset='modelnet40', model='st-large', accuracy=0.75),
            dict(dataset='scanobjectnn', model='mz', accuracy=0.60),
            dict(dataset='scanobjectnn', model='rigid', accuracy=0.50)]
    assert point_clouds.comparison(rows, 'modelnet40') == dict(
        best='st-large', best_accuracy=pytest.approx(75.0), gap=pytest.approx(-5.0),
        paper_gap=pytest.approx(-1.8))
    assert point_clouds.comparison(rows, 'scanobjectnn') == dict(
        best='mz', best_accuracy=pytest.approx(60.0), gap=None, paper_gap=None)  # no st-large
    assert len(point_clouds.verdict(rows, ['modelnet40', 'scanobjectnn'])) == 2


def test_qm9_resume_reads_the_finished_runs(qm9, qm9_root, tmp_path, monkeypatch):
    import torch_mz.study.grid as grid
    out = tmp_path / 'results'
    argv = ['--source', 'sdf', '--root', str(tmp_path), '--targets', 'mu', '--models',
            'deepsets,mz-slim', '--n-train', '2', '--n-val', '1', '--n-test', '1',
            '--batch-size', '2', '--out', str(out)] + TINY
    assert qm9.main(argv) == 0
    first = json.loads((out / 'qm9.json').read_text())
    assert len(list((out / 'runs').iterdir())) == 2  # one file per finished run

    def no_training(*args, **kwargs):
        raise AssertionError('a finished run was trained again')

    monkeypatch.setattr(grid, 'train_one', no_training)
    assert qm9.main(argv + ['--resume']) == 0
    again = json.loads((out / 'qm9.json').read_text())
    assert again['rows'] == first['rows']
    # another budget never reads the runs; without --resume the folder of runs is refused
    # (nothing trains), and --overwrite starts afresh
    with pytest.raises(AssertionError, match='trained again'):
        qm9.main(argv + ['--resume', '--epochs', '2'])
    assert qm9.main(argv) == 2
    with pytest.raises(AssertionError, match='trained again'):
        qm9.main(argv + ['--overwrite'])


@pytest.mark.parametrize('models, message', [('mz,deepsets,mz', "'mz' is given twice"),
                                             ('mz,nope', "unknown model 'nope'")])
def test_benchmarks_refuse_models_before_reading_data(qm9, point_clouds, tmp_path, capsys,
                                                      models, message):
    # a repeated model was counted as more seeds of one model in the table
    for script, name in ((qm9, 'qm9.py'), (point_clouds, 'point_clouds.py')):
        status = script.main(['--models', models, '--root', str(tmp_path / 'empty'), '--out',
                              str(tmp_path / 'out')] + TINY)
        err = capsys.readouterr().err
        assert status == script.EXIT_ERROR != 0
        assert err.startswith(f'{name}: error: ') and message in err
        assert not (tmp_path / 'out').exists()


@pytest.mark.filterwarnings('ignore:ModelNet40 .* skipped:UserWarning')  # the fixture's NaN shape
def test_benchmarks_refuse_a_block_option_before_training(qm9, point_clouds, qm9_root,
                                                          modelnet_h5_root, tmp_path, capsys,
                                                          monkeypatch):
    # an option the preset passes on to its blocks is known only when the model is built for
    # the data: checked after loading, before any run trains
    import torch_mz.study.grid as grid
    monkeypatch.setattr(grid, 'train_one', lambda *a, **k: pytest.fail('trained'))
    out = tmp_path / 'out'
    assert qm9.main(['--source', 'sdf', '--root', str(tmp_path), '--targets', 'mu', '--models',
                     'mz:foo=1', '--n-train', '2', '--n-val', '1', '--n-test', '1', '--out',
                     str(out)] + TINY) == qm9.EXIT_ERROR
    assert "qm9.py: error: model spec 'mz:foo=1'" in capsys.readouterr().err
    assert point_clouds.main(['--dataset', 'modelnet40', '--root', str(tmp_path),
                              '--modelnet-source', 'hdf5', '--num-points', '64', '--n-train', '4',
                              '--n-val', '1', '--models', 'mz:foo=1', '--out', str(out)]
                             + TINY) == point_clouds.EXIT_ERROR
    assert "point_clouds.py: error: model spec 'mz:foo=1'" in capsys.readouterr().err
    assert not out.exists()
    (tmp_path / 'file').write_text('x')
    assert qm9.main(['--out', str(tmp_path / 'file')] + TINY) == qm9.EXIT_ERROR
    assert 'is a file' in capsys.readouterr().err


def test_a_diverged_run_is_recorded_and_the_studies_go_on(qm9, qm9_root, tmp_path, monkeypatch):
    # one diverging run ended qm9.py (and point_clouds.py) with a traceback, and --resume
    # trained it again into the same divergence; it is recorded, counted and left out of the
    # means, and the other runs go on
    import torch_mz.study.grid as grid
    from torch_mz.train import TrainingDiverged
    real = grid.train_one

    def deepsets_diverges(task, name, seed, config, **options):
        if name == 'deepsets':
            raise TrainingDiverged(0, math.nan)
        return real(task, name, seed, config, **options)

    monkeypatch.setattr(grid, 'train_one', deepsets_diverges)
    out = tmp_path / 'results'
    argv = ['--source', 'sdf', '--root', str(tmp_path), '--targets', 'mu', '--models',
            'deepsets,mz-slim', '--n-train', '2', '--n-val', '1', '--n-test', '1',
            '--batch-size', '2', '--out', str(out)] + TINY
    with pytest.warns(UserWarning, match='deepsets seed 0 diverged'):
        assert qm9.main(argv) == 0
    rows = {r['model']: r for r in json.loads((out / 'qm9.json').read_text())['rows']}
    assert rows['deepsets']['diverged'] == 1 and rows['deepsets']['params'] is None
    assert rows['deepsets']['r2'] is None and math.isfinite(rows['mz-slim']['r2'])  # (NaN: null)
    assert 'diverged' not in rows['mz-slim']
    assert '| 1 (1 diverged) |' in (out / 'qm9.md').read_text()
    monkeypatch.setattr(grid, 'train_one', lambda *a, **k: pytest.fail('trained again'))
    assert qm9.main(argv + ['--resume']) == 0  # the diverged run is read back too


def test_verdicts_pass_over_models_whose_every_run_diverged(qm9, point_clouds):
    nan = math.nan
    rows = [dict(target='mu', model='mz', r2=nan, r2_std=nan),
            dict(target='mu', model='rigid', r2=0.6, r2_std=0.0),
            dict(target='alpha', model='mz', r2=0.7, r2_std=0.0),
            dict(target='alpha', model='st-large', r2=nan, r2_std=nan),
            dict(target='alpha', model='egnn', r2=nan, r2_std=nan)]
    mu, alpha = qm9.verdict(rows, ['mu', 'alpha'])
    assert mu == '- **mu**: no verdict: every run of mz diverged.'
    assert alpha == '- **alpha**: no verdict: every run of every attention baseline diverged.'
    acc = [dict(dataset='modelnet40', model='mz', accuracy=0.70),
           dict(dataset='modelnet40', model='st-large', accuracy=nan),
           dict(dataset='scanobjectnn', model='mz', accuracy=nan)]
    assert point_clouds.comparison(acc, 'modelnet40') == dict(
        best='mz', best_accuracy=pytest.approx(70.0), gap=None, paper_gap=None)
    assert point_clouds.verdict(acc, ['scanobjectnn']) == [
        '- **ScanObjectNN**: no verdict: every run diverged.']


def _count_training(monkeypatch):
    r"""The models :func:`~torch_mz.study.train_one` trains from now on (a list that grows)."""
    import torch_mz.study.grid as grid
    real, trained = grid.train_one, []

    def counted(task, name, *args, **kwargs):
        trained.append(name)
        return real(task, name, *args, **kwargs)
    monkeypatch.setattr(grid, 'train_one', counted)
    return trained


def test_qm9_resume_keys_runs_on_the_folder_read(qm9, tmp_path, monkeypatch):
    # a relative --root named the runs' data: the same command in another working directory,
    # reading another folder, took the first folder's runs as its own
    from tests.datasets.raw_formats import write_gdb9
    for where in ('a', 'b'):
        write_gdb9(str(tmp_path / where / 'data' / 'QM9' / 'raw'))
    out = tmp_path / 'results'
    argv = ['--source', 'sdf', '--root', 'data', '--targets', 'mu', '--models', 'deepsets',
            '--n-train', '2', '--n-val', '1', '--n-test', '1', '--batch-size', '2', '--out',
            str(out)] + TINY
    trained = _count_training(monkeypatch)
    monkeypatch.chdir(tmp_path / 'a')
    assert qm9.main(argv) == 0 and trained == ['deepsets']
    folder = osp.realpath(tmp_path / 'a' / 'data' / 'QM9')
    assert json.loads((out / 'qm9.json').read_text())['setup']['root'] == folder
    (kept, ) = (out / 'runs').iterdir()
    assert json.loads(kept.read_text())['identity']['run']['data']['root'] == folder
    monkeypatch.chdir(tmp_path / 'b')
    assert qm9.main(argv + ['--resume']) == 0
    assert trained == ['deepsets', 'deepsets']  # b's data: trained, not read back
    monkeypatch.chdir(tmp_path / 'a')
    assert qm9.main(argv + ['--resume']) == 0 and len(trained) == 2  # a's again: read back


@pytest.mark.filterwarnings('ignore:ModelNet40 .* skipped:UserWarning')  # the fixture's NaN shape
def test_benchmarks_record_a_root_under_home_as_the_folder_read(qm9, point_clouds,
                                                                scanobjectnn_root, tmp_path,
                                                                monkeypatch):
    # --root '~/data' (quoted: the shell leaves '~'): the datasets read ~/data/<Name>, the
    # results and the runs' key named <cwd>/~/data/<Name>, another folder
    import shutil

    from tests.datasets.raw_formats import write_gdb9
    home, cwd = tmp_path / 'home', tmp_path / 'cwd'
    write_gdb9(str(home / 'data' / 'QM9' / 'raw'))
    shutil.copytree(scanobjectnn_root['root'], home / 'data' / 'ScanObjectNN')
    cwd.mkdir()
    monkeypatch.setenv('HOME', str(home))
    monkeypatch.chdir(cwd)
    out = tmp_path / 'results'
    argv = ['--source', 'sdf', '--root', '~/data', '--targets', 'mu', '--models', 'deepsets',
            '--n-train', '2', '--n-val', '1', '--n-test', '1', '--batch-size', '2', '--out',
            str(out / 'qm9')] + TINY
    assert qm9.main(argv) == 0
    folder = osp.realpath(home / 'data' / 'QM9')
    assert json.loads((out / 'qm9' / 'qm9.json').read_text())['setup']['root'] == folder
    (kept, ) = (out / 'qm9' / 'runs').iterdir()
    assert json.loads(kept.read_text())['identity']['run']['data']['root'] == folder
    argv = ['--dataset', 'scanobjectnn', '--root', '~/data', '--num-points', '64', '--models',
            'deepsets', '--n-train', '4', '--n-val', '1', '--batch-size', '4', '--out',
            str(out / 'pc')] + TINY
    assert point_clouds.main(argv) == 0
    assert json.loads((out / 'pc' / 'point_clouds.json').read_text())['setup']['roots'] == {
        'scanobjectnn': osp.realpath(home / 'data' / 'ScanObjectNN')}
    assert not (cwd / '~').exists()


@pytest.mark.parametrize('given, read_back', [('absolute', True), ('none', True),
                                              ('relative', False)])
def test_qm9_resume_reads_runs_kept_under_the_root_as_given(qm9, qm9_root, tmp_path,
                                                           monkeypatch, given, read_back):
    # runs kept before the key named the folder read, resolved, named the root as given: they
    # are read back where that named one folder (an absolute --root, or none), not otherwise
    from torch_mz.study import RunStore
    root = {'absolute': str(tmp_path), 'none': None, 'relative': '.'}[given]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('TORCH_MZ_DATA', str(tmp_path))  # (the default root: tmp_path/QM9)
    out = tmp_path / 'results'
    argv = ((['--root', root] if root else []) + [
        '--source', 'sdf', '--targets', 'mu', '--models', 'deepsets', '--n-train', '2',
        '--n-val', '1', '--n-test', '1', '--batch-size', '2', '--out', str(out)] + TINY)
    kept, put = [], RunStore.put
    monkeypatch.setattr(RunStore, 'put', lambda self, key, config, record: kept.append(
        (self, key, config, record)) or put(self, key, config, record))
    assert qm9.main(argv) == 0 and len(kept) == 1
    store, key, config, record = kept.pop()
    assert key['data']['root'] == osp.realpath(qm9_root)
    (out / 'runs' / osp.basename(store._path(key))).unlink()
    put(store, dict(key, data=dict(key['data'], root=root)), config, record)  # the old key
    trained = _count_training(monkeypatch)
    assert qm9.main(argv + ['--resume']) == 0
    assert trained == ([] if read_back else ['deepsets'])
    if read_back:  # kept under the folder read from then on, the file under the old key gone
        (file, ) = (out / 'runs').iterdir()
        assert json.loads(file.read_text())['identity']['run']['data']['root'] == osp.realpath(
            qm9_root)


@pytest.mark.filterwarnings('ignore:ModelNet40 .* skipped:UserWarning')  # the fixture's NaN shape
def test_point_clouds_resume_keys_runs_on_the_folder_read(point_clouds, scanobjectnn_root,
                                                          tmp_path, monkeypatch):
    import shutil
    for where in ('a', 'b'):
        shutil.copytree(scanobjectnn_root['root'], tmp_path / where / 'data' / 'ScanObjectNN')
    out = tmp_path / 'results'
    argv = ['--dataset', 'scanobjectnn', '--root', 'data', '--num-points', '64', '--models',
            'deepsets', '--n-train', '4', '--n-val', '1', '--batch-size', '4', '--out',
            str(out)] + TINY
    trained = _count_training(monkeypatch)
    monkeypatch.chdir(tmp_path / 'a')
    assert point_clouds.main(argv) == 0 and trained == ['deepsets']
    assert json.loads((out / 'point_clouds.json').read_text())['setup']['roots'] == {
        'scanobjectnn': osp.realpath(tmp_path / 'a' / 'data' / 'ScanObjectNN')}
    monkeypatch.chdir(tmp_path / 'b')
    assert point_clouds.main(argv + ['--resume']) == 0
    assert trained == ['deepsets', 'deepsets']  # b's data: trained, not read back


def test_point_clouds_plot_draws_the_papers_figures_where_the_table_does(point_clouds,
                                                                         monkeypatch, tmp_path):
    # the paper reports ScanObjectNN's OBJ_BG only: another variant's bars had its dashes
    drawn = {}

    def bars(groups, models, value, error, path, paper=None, **kwargs):
        drawn.update({(g, m): paper(g, m) for g in groups for m in models})
    monkeypatch.setattr(point_clouds, 'plot_bars', bars)
    rows = [dict(dataset='modelnet40', model='mz', accuracy=0.7, accuracy_std=0.0,
                 paper_accuracy=0.781),
            dict(dataset='scanobjectnn', model='mz', accuracy=0.6, accuracy_std=0.0,
                 paper_accuracy=None)]  # (a variant other than OBJ_BG)
    point_clouds.plot(rows, ['modelnet40', 'scanobjectnn'], ['mz'], str(tmp_path / 'p.png'))
    assert drawn == {('modelnet40', 'mz'): pytest.approx(78.1), ('scanobjectnn', 'mz'): None}


def test_benchmarks_take_a_spec_with_several_options(qm9, point_clouds, tmp_path, capsys):
    # '--models hypernet:rank=4,dim=64' was split at every comma: "unknown model 'dim=64'"
    for script, name in ((qm9, 'qm9.py'), (point_clouds, 'point_clouds.py')):
        status = script.main(['--models', 'mz,hypernet:rank=4,dim=64', '--root',
                              str(tmp_path / 'empty'), '--no-download' if script is point_clouds
                              else '--source=sdf', '--out', str(tmp_path / 'out')] + TINY)
        err = capsys.readouterr().err
        assert status == script.EXIT_ERROR
        assert 'not available' in err or 'is not in' in err, err  # the data, not the spec
        assert 'dim=64' not in err


def test_point_clouds_refuses_an_unknown_variant(point_clouds, tmp_path, capsys):
    # with --no-download an unknown variant was a KeyError traceback
    with pytest.raises(SystemExit) as exit_:
        point_clouds.main(['--dataset', 'scanobjectnn', '--variant', 'FOO', '--no-download',
                           '--root', str(tmp_path / 'empty'), '--out', str(tmp_path / 'out')]
                          + TINY)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --variant: invalid choice: 'FOO'" in err
    assert 'OBJ_BG' in err and not (tmp_path / 'out').exists()


def test_qm9_links_only_a_plot_it_drew(qm9, qm9_root, tmp_path, monkeypatch, capsys):
    # without matplotlib the report linked qm9.png all the same: an earlier run's figure,
    # left beside results it does not show
    without_matplotlib(monkeypatch)
    out = tmp_path / 'results'
    out.mkdir()
    (out / 'qm9.png').write_bytes(b'an earlier run')
    assert qm9.main(['--source', 'sdf', '--root', str(tmp_path), '--targets', 'mu', '--models',
                     'deepsets', '--n-train', '2', '--n-val', '1', '--n-test', '1',
                     '--batch-size', '2', '--out', str(out)] + TINY) == 0
    assert 'qm9.png' not in (out / 'qm9.md').read_text()
    assert not (out / 'qm9.png').exists()
    printed = capsys.readouterr().out
    assert 'matplotlib is not installed' in printed and '.png' not in printed.splitlines()[-1]


def test_qm9_resume_says_what_its_minutes_count(qm9, qm9_root, tmp_path, monkeypatch):
    # a resumed study's report gave the minutes of the call that read the runs back, as if the
    # study had taken them
    import torch_mz.study.grid as grid
    real = grid.train_one

    def ten_minutes(*args, **kwargs):  # (a run that took ten minutes, by its record)
        return dict(real(*args, **kwargs), wall_time_s=600.0)

    monkeypatch.setattr(grid, 'train_one', ten_minutes)
    out = tmp_path / 'results'
    argv = ['--source', 'sdf', '--root', str(tmp_path), '--targets', 'mu', '--models',
            'deepsets', '--n-train', '2', '--n-val', '1', '--n-test', '1', '--batch-size', '2',
            '--out', str(out)] + TINY
    assert qm9.main(argv) == 0
    assert 'min in this call' not in (out / 'qm9.md').read_text()
    monkeypatch.setattr(grid, 'train_one', lambda *a, **k: pytest.fail('trained again'))
    assert qm9.main(argv + ['--resume']) == 0
    text = (out / 'qm9.md').read_text()
    assert ("min in this call (runs read back from an earlier call are not in it; the runs' "
            "own recorded times, those included, sum to 10.0 min)") in text
    assert json.loads((out / 'qm9.json').read_text())['run_minutes'] == 10.0


@pytest.mark.parametrize('script, argv, message', [
    ('qm9', ['--root', ''], '--root is empty: name the dataset folder'),
    ('point_clouds', ['--root', ''], '--root is empty: name the dataset folder'),
    ('point_clouds', ['--dataset', 'modelnet40', '--variant', 'PB_T50_RS'],
     '--variant PB_T50_RS is an option of ScanObjectNN; --dataset modelnet40 does not read it'),
    ('point_clouds', ['--dataset', 'scanobjectnn', '--modelnet-source', 'hdf5'],
     '--modelnet-source hdf5 is an option of ModelNet40; --dataset scanobjectnn does not read'),
])
def test_benchmarks_refuse_an_empty_root_and_options_of_a_dataset_not_read(
        qm9, point_clouds, script, argv, message, tmp_path, capsys, monkeypatch):
    # --root '' read the default data folder, and an option of the dataset not read was
    # ignored, all without a word (the torch-mz command refuses both)
    module = dict(qm9=qm9, point_clouds=point_clouds)[script]
    monkeypatch.setattr(module, 'load_task', lambda *a, **k: pytest.fail('data read'))
    status = module.main(argv + ['--out', str(tmp_path / 'out')] + TINY)
    err = capsys.readouterr().err
    assert status == module.EXIT_ERROR and err.startswith(f'{script}.py: error: ')
    assert message in err, err
    assert not (tmp_path / 'out').exists()


def test_point_clouds_takes_the_options_of_the_datasets_it_reads(point_clouds, tmp_path,
                                                                 capsys):
    # (only an option of a dataset not read is refused: here the data is missing, as it is)
    for argv in (['--dataset', 'scanobjectnn', '--variant', 'PB_T50_RS'],
                 ['--dataset', 'both', '--variant', 'PB_T50_RS', '--modelnet-source', 'hdf5']):
        status = point_clouds.main(argv + ['--no-download', '--root', str(tmp_path / 'empty'),
                                           '--out', str(tmp_path / 'out')] + TINY)
        err = capsys.readouterr().err
        assert status == point_clouds.EXIT_ERROR and 'does not read it' not in err
        assert 'is not in' in err, err


@pytest.mark.parametrize('script', ['qm9', 'point_clouds'])
def test_benchmarks_show_the_processing_of_a_dataset_unless_no_progress(
        qm9, point_clouds, qm9_root, scanobjectnn_root, script, tmp_path, capsys):
    # the first run processes the dataset (QM9: every molecule through RDKit; ModelNet40:
    # 12,311 meshes sampled), minutes without a word: load_task's bars were off
    import shutil
    module = {'qm9': qm9, 'point_clouds': point_clouds}[script]
    root = qm9_root if script == 'qm9' else scanobjectnn_root['root']
    argv = (['--source', 'sdf', '--targets', 'mu', '--n-train', '2', '--n-val', '1', '--n-test',
             '1'] if script == 'qm9' else
            ['--dataset', 'scanobjectnn', '--num-points', '64', '--n-train', '4', '--n-val',
             '1'])
    argv += ['--root', str(tmp_path), '--models', 'deepsets', '--batch-size', '2',
             '--out', str(tmp_path / 'out'), *TINY]
    bar = 'QM9 (gdb9.sdf)' if script == 'qm9' else 'ScanObjectNN OBJ_BG train'
    assert module.main(argv + ['--no-progress']) == 0
    assert bar not in capsys.readouterr().err
    shutil.rmtree(osp.join(root, 'processed'))  # processed again
    assert module.main(argv + ['--overwrite']) == 0
    assert bar in capsys.readouterr().err
