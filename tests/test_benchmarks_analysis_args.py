r"""The command lines of the analysis studies in ``benchmarks/`` (``targets.py``,
``rotation_matching_analysis.py``, ``uncertainty.py``, ``what_mz_learns.py``,
``set_size_generalisation.py``): a mistaken option ends as argparse's usage error (exit status 2,
naming the option) before any model is trained, and nothing is written half or from another
run's figures. Training is replaced by a function that fails the test, so a check that comes
only after training shows as that failure."""
import json
import math
import os
import shutil

import numpy as np
import pytest

from tests._scripts import BENCHMARKS, load_script, run_script, usage_error, without_matplotlib

RESULTS = os.path.join(BENCHMARKS, 'results')


@pytest.fixture
def no_training(monkeypatch):
    r"""Every training run (``Trainer.fit``, which ``train``, ``train_one`` and the scripts' own
    loops call) fails the test: the option must be refused before."""
    from torch_mz.train.trainer import Trainer

    def fit(*args, **kwargs):
        raise AssertionError('a model was trained before the command line was checked')
    monkeypatch.setattr(Trainer, 'fit', fit)


# --- targets.py ------------------------------------------------------------------------------

def test_targets_missing_results_folder_is_an_error(tmp_path, capsys):
    targets = load_script('targets')
    missing = str(tmp_path / 'nowhere')
    with pytest.raises(SystemExit) as exit_:
        targets.main(['--results', missing, '--out', str(tmp_path / 'out')])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert '--results' in err and missing in err and 'does not exist' in err
    assert not (tmp_path / 'out').exists()


def test_targets_results_file_or_empty_folder_is_an_error(tmp_path, capsys):
    targets = load_script('targets')
    (tmp_path / 'file.json').write_text('{}')
    (tmp_path / 'empty').mkdir()
    for path, why in ((tmp_path / 'file.json', 'not a folder'),
                      (tmp_path / 'empty', 'holds none of the results files')):
        with pytest.raises(SystemExit) as exit_:
            targets.main(['--results', str(path), '--out', str(tmp_path / 'out')])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert str(path) in err and why in err


@pytest.mark.parametrize('text', ['{"rows": [', '[1, 2]', '\xff\xfe'])
def test_targets_corrupt_results_file_names_it(tmp_path, capsys, text):
    targets = load_script('targets')
    bad = tmp_path / 'speed' / 'speed.json'
    bad.parent.mkdir()
    bad.write_bytes(text.encode('latin-1'))
    with pytest.raises(SystemExit) as exit_:
        targets.main(['--results', str(tmp_path), '--out', str(tmp_path / 'out')])
    assert exit_.value.code == 2
    assert str(bad) in capsys.readouterr().err
    with pytest.raises(targets.ResultsError, match='speed.json'):
        targets.load_sources(str(tmp_path))


def test_targets_failed_write_keeps_the_earlier_files(tmp_path, monkeypatch):
    # A record JSON cannot serialise (a numpy float) fails json.dump partway through the file:
    # the earlier targets.json and targets.md must stay whole, with no temporary file left.
    targets = load_script('targets')
    results, out = tmp_path / 'results', tmp_path / 'out'
    (results / 'speed_fold').mkdir(parents=True)
    shutil.copy(os.path.join(RESULTS, 'speed_fold', 'speed.json'), results / 'speed_fold')
    monkeypatch.setattr(targets, 'plot', lambda records, path: None)
    argv = ['--results', str(results), '--out', str(out)]
    targets.main(argv)
    before = {name: (out / name).read_text() for name in ('targets.json', 'targets.md')}
    json.loads(before['targets.json'])
    evaluate = targets.evaluate

    def unserialisable(data):
        records = evaluate(data)
        records[-1]['threshold'] = np.float32(records[-1]['threshold'])
        return records
    monkeypatch.setattr(targets, 'evaluate', unserialisable)
    with pytest.raises(TypeError, match='float32'):
        targets.main(argv)
    assert {name: (out / name).read_text() for name in before} == before
    assert sorted(os.listdir(out)) == ['targets.json', 'targets.md']


# --- rotation_matching_analysis.py -----------------------------------------------------------

SMALL_ROTATION = ['--quick', '--n-train', '10', '--epochs', '1']


@pytest.mark.parametrize('argv, needles', [
    (['--models', 'deepsets,deepsets'], ('argument --models', 'deepsets given twice')),
    (['--models', 'deepsets,nosuchmodel'], ('argument --models', "unknown model 'nosuchmodel'")),
    (['--models', 'deepsets:nosuchoption=1'], ('argument --models', 'nosuchoption')),
    (['--n-train', '0'], ('argument --n-train', "'0'")),
    (['--n-train', '4'], ('--n-train 4 is too few', )),
    (['--epochs', '0'], ('argument --epochs', "'0'")),
    (['--lr', '-1'], ('argument --lr', "'-1'")),
    (['--d', '1'], ('argument --d', "'1'")),
    (['--sweep-dims', '16,x'], ('argument --sweep-dims', "'x'")),
    (['--sweep-dims', '16,16'], ('argument --sweep-dims', 'given twice')),
    (['--sweep-dims', '8'], ('--sweep-dims 8 repeats --d 8', )),
    (['--threads', '0'], ('argument --threads', "'0'")),
])
def test_rotation_matching_refuses_bad_options(argv, needles, tmp_path, monkeypatch, capsys,
                                               no_training):
    usage_error('rotation_matching_analysis',
                SMALL_ROTATION + ['--out', str(tmp_path)] + argv, monkeypatch, capsys, *needles)
    assert not os.listdir(tmp_path)


def test_rotation_matching_notes_are_not_another_runs(tmp_path, monkeypatch, no_training):
    # A small run, no model: its notes carry none of the reference run's figures.
    argv = SMALL_ROTATION + ['--models', '', '--sweep-dims', '', '--out', str(tmp_path)]
    assert run_script('rotation_matching_analysis', argv, monkeypatch) == 0
    text = (tmp_path / 'analysis.md').read_text()
    assert 'Findings: none are written for this configuration' in text
    for figure in ('seven orders', '3,478', '52%', '0.82 / 0.84 / 0.83', 'deepsets r2'):
        assert figure not in text


def test_rotation_matching_reference_findings_read_the_rows():
    study = load_script('rotation_matching_analysis')
    with open(os.path.join(RESULTS, 'rotation_matching', 'analysis.json')) as f:
        saved = json.load(f)
    setup = saved['setup']
    assert {k: setup[k] for k in ('n_train', 'epochs', 'lr', 'models')} == {
        k: study.REFERENCE[k] for k in ('n_train', 'epochs', 'lr', 'models')}
    paper_var = [mse / (1.0 - r) for _, mse, r in study.PAPER_TABLE2]
    rows = saved['rows']
    text = study.notes_for(rows, ['deepsets'], paper_var, reference=True)
    for figure in ('(3.4e-4) is seven\n  orders', 'explains\n  52% (11% at d = 16, 2% at d = 32)',
                   '0.82 / 0.84 / 0.83', 'variance, 3,478,', '(scale 1.1)', 'about six times',
                   'is 74% set size', 'moments 0.47, Deep Sets 0.45', study.REFERENCE_COMMAND):
        assert figure in text
    # other figures, other sentences: nothing in them is fixed text
    changed = [dict(r, var=r['var'] * 100.0) if r['reading'] == 'literal' and r['d'] == 8
               else dict(r, **{'deepsets r2': 0.5}) if r['reading'] == 'unaligned' else r
               for r in rows]
    text = study.notes_for(changed, ['deepsets'], paper_var, reference=True)
    assert '(3.4e-2) is five\n  orders' in text and '0.50 / 0.50 / 0.50' in text
    other = study.notes_for(rows, ['deepsets', 'mz'], paper_var, reference=False)
    assert 'seven' not in other and '`mz r2` a short `mz` run (one seed)' in other


# --- rotation_matching_features.py -----------------------------------------------------------

SMALL_FEATURES = ['--n-train', '10', '--replication-sets', '2']


def _record(folder, model, lr, val_loss, test_r2, cell=None, d=8):
    study = load_script('rotation_matching_features')
    cell = cell or study.CELL['label']
    path = folder / model / f'{model}_{lr}_{val_loss}_{d}.json'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(
        cell=cell, seed=0, model=model, best_epoch=3, epochs_run=5,
        key=dict(kwargs=dict(d=d, alignment='none'), config=dict(lr=lr, weight_decay=1e-5)),
        val=dict(loss=val_loss), test=dict(r2=test_r2))))  # (the fields a record holds)


def test_rotation_features_read_the_sweep_and_check_replication(tmp_path, monkeypatch,
                                                                no_training):
    pytest.importorskip('matplotlib')  # (its figure: the [plot] extra)
    records = tmp_path / 'records'
    _record(records, 'rigid', 3e-4, 0.5, 0.55)
    _record(records, 'rigid', 3e-3, 0.3, 0.74)  # the chosen point: lowest validation loss
    _record(records, 'rigid', 1e-3, 0.4, 0.99)
    _record(records, 'rigid', 3e-3, 0.1, 0.99, cell='another cell')  # not the sweep's cell
    _record(records, 'rigid', 3e-3, 0.1, 0.98, d=16)  # not its d
    _record(records, 'deepsets', 1e-4, 0.2, 0.82)
    out = tmp_path / 'out'
    argv = SMALL_FEATURES + ['--records', str(records), '--out', str(out)]
    assert run_script('rotation_matching_features', argv, monkeypatch) == 0
    saved = json.loads((out / 'features.json').read_text())
    rigid = saved['sweep']['rigid']
    assert rigid['chosen']['test_r2'] == 0.74 and rigid['chosen']['lr'] == 3e-3
    assert [p['test_r2'] for p in rigid['plateau']] == [0.55] and len(rigid['points']) == 3
    gaps = saved['replication_gap']
    assert gaps['rigid'] < 1e-9 and gaps['mz'] < 1e-9 and gaps['target'] < 1e-9
    assert gaps['deepsets'] > 1e-3 and gaps['egnn'] > 1e-3
    text = (out / 'features.md').read_text()
    assert 'lr-3e-4 runs' in text and 'deepsets 0.820' in text and (out / 'features.png').exists()


def test_rotation_features_read_a_diverged_sweep_run(tmp_path, monkeypatch, no_training):
    # a diverged run's record has no validation or test figures (the sweep reads its
    # validation loss as inf): reading it was a KeyError
    pytest.importorskip('matplotlib')  # (its figure: the [plot] extra)
    records = tmp_path / 'records'
    _record(records, 'rigid', 3e-4, 0.5, 0.55)
    _record(records, 'rigid', 3e-3, 0.3, 0.74)
    path = records / 'rigid' / 'diverged.json'
    record = json.loads(next((records / 'rigid').iterdir()).read_text())
    path.write_text(json.dumps(dict(record, val={}, test={}, best_epoch=None,
                                    diverged='Training loss is not finite',
                                    key=dict(record['key'], config=dict(lr=3e-4,
                                                                        weight_decay=0.1)))))
    out = tmp_path / 'out'
    argv = SMALL_FEATURES + ['--records', str(records), '--out', str(out)]
    assert run_script('rotation_matching_features', argv, monkeypatch) == 0
    rigid = json.loads((out / 'features.json').read_text())['sweep']['rigid']
    assert len(rigid['points']) == 3 and rigid['chosen']['test_r2'] == 0.74
    # (standard JSON: the diverged run's inf validation loss and NaN R² are written as null)
    plateau = sorted(rigid['plateau'], key=lambda p: (p['val_loss'] is None, p['val_loss']))
    assert plateau[0]['test_r2'] == 0.55 and plateau[1]['val_loss'] is None
    assert plateau[1]['test_r2'] is None
    text = (out / 'features.md').read_text()
    assert 'end at 0.550-0.550 in their' in text  # (the diverged run's NaN left out)


def test_rotation_features_without_matplotlib_write_their_results(tmp_path, monkeypatch,
                                                                   no_training):
    # it imported matplotlib itself: without it the script ended with an ImportError once the
    # JSON and the Markdown were written, and the Markdown linked features.png all the same (an
    # earlier run's, left there)
    records = tmp_path / 'records'
    _record(records, 'rigid', 3e-4, 0.5, 0.55)
    out = tmp_path / 'out'
    out.mkdir()
    (out / 'features.png').write_bytes(b'an earlier run')
    without_matplotlib(monkeypatch)
    argv = SMALL_FEATURES + ['--records', str(records), '--out', str(out)]
    assert run_script('rotation_matching_features', argv, monkeypatch) == 0
    assert json.loads((out / 'features.json').read_text())['sweep']['rigid']
    assert 'features.png' not in (out / 'features.md').read_text()
    assert not (out / 'features.png').exists()


def test_rotation_features_record_their_arguments_and_draw_a_negative_r2(tmp_path, monkeypatch,
                                                                         no_training):
    # main(argv) recorded the caller's sys.argv as its command, and the plot's axis stopped at
    # R² = 0: a model at R² -0.4 was drawn off the figure
    pytest.importorskip('matplotlib')  # (its figure: the [plot] extra)
    study = load_script('rotation_matching_features')
    records = tmp_path / 'records'
    _record(records, 'rigid', 3e-4, 0.5, -0.4)
    limits = []
    real = study.save_figure

    def save(fig, path, **kwargs):
        limits.append(fig.axes[0].get_xlim())
        real(fig, path, **kwargs)

    monkeypatch.setattr(study, 'save_figure', save)
    monkeypatch.setattr('sys.argv', ['pytest', '-k', 'something else'])
    argv = SMALL_FEATURES + ['--records', str(records), '--out', str(tmp_path / 'out')]
    study.main(argv)
    text = (tmp_path / 'out' / 'features.md').read_text()
    assert ('Command: `python benchmarks/rotation_matching_features.py '
            + ' '.join(argv) + '`') in text
    assert 'something else' not in text
    low, high = limits[0]
    assert low < -0.4 and high == 1.0


def test_rotation_features_fit_an_exact_function_exactly():
    study = load_script('rotation_matching_features')
    rng = np.random.default_rng(0)
    feats = [dict(zip(study.NO_SIZE + ('n', ), rng.normal(size=12))) for _ in range(40)]
    y = np.array([2.0 * f['msq A'] - f['n'] + 1.0 for f in feats])
    split = (y[:30], feats[:30]), (y[30:], feats[30:])
    assert study.fit_r2(*split, ('n', 'msq A'), 1) == pytest.approx(1.0, abs=1e-12)
    assert study.fit_r2(*split, ('msq B', ), 1) < 0.5


def test_rotation_features_records_must_be_a_folder(tmp_path, monkeypatch, capsys, no_training):
    usage_error('rotation_matching_features', SMALL_FEATURES + [
        '--records', str(tmp_path / 'nowhere'), '--out', str(tmp_path / 'out')],
        monkeypatch, capsys, '--records', 'is not a folder')
    assert not (tmp_path / 'out').exists()


# --- uncertainty.py --------------------------------------------------------------------------

SMALL_UNCERTAINTY = ['--quick', '--n-train', '8', '--epochs', '1']


@pytest.mark.parametrize('argv, needles', [
    (['--task', 'foo'], ('argument --task', "'foo'")),
    (['--timing-sets', '0'], ('argument --timing-sets', "'0'")),
    (['--timing-sets', '100'], ('--timing-sets 100', 'more than the 8 test sets')),
    (['--members', '0'], ('argument --members', "'0'")),
    (['--members', '1'], ('argument --members', "'1'")),
    (['--passes', '1'], ('argument --passes', "'1'")),
    (['--passes', 'x'], ('argument --passes', "'x'")),
    (['--task-arg', 'nosuchoption=1'], ('--task chamfer --task-arg nosuchoption=1', )),
    (['--task', 'quadratic-tdof', '--task-arg', 'tdof=99'], ('--task-arg tdof=99', 'tdof')),
    (['--seeds', '0'], ('argument --seeds', "'0'")),
    (['--n-test', '0'], ('argument --n-test', "'0'")),
    (['--n-test', '4'], ('--n-test 4 is too few', '5 bins')),
    (['--n-test', '20', '--timing-sets', '30'], ('--timing-sets 30', 'more than the 20 test')),
])
def test_uncertainty_refuses_bad_options(argv, needles, tmp_path, monkeypatch, capsys,
                                         no_training):
    usage_error('uncertainty', SMALL_UNCERTAINTY + ['--out', str(tmp_path)] + argv,
                monkeypatch, capsys, *needles)
    assert not os.listdir(tmp_path)


def test_uncertainty_n_test_sets_the_test_sets(tmp_path, monkeypatch, no_training):
    import torch_mz.tasks
    seen = {}

    class Stop(Exception):
        pass

    def load_task(name, **kwargs):
        seen.update(kwargs)
        raise Stop
    monkeypatch.setattr(torch_mz.tasks, 'load_task', load_task)
    for argv, n_test in (([], 8), (['--n-test', '40'], 40), (['--n-test', '5'], 5)):
        seen.clear()
        with pytest.raises(Stop):
            run_script('uncertainty', SMALL_UNCERTAINTY + ['--out', str(tmp_path)] + argv,
                       monkeypatch)
        assert seen['n_test'] == n_test and seen['n_train'] == 8


def test_uncertainty_records_a_diverged_member(tmp_path, monkeypatch, capsys):
    # one diverged member ended the study with a traceback (the other studies record a diverged
    # run and go on): its study seed (whose ensemble, IHW and MC-Dropout need every member) is
    # recorded, left out of the tables, verdicts and plot, and named in the report
    _diverges_at(monkeypatch, {1})  # study seed 0, member 2 of 3
    without_matplotlib(monkeypatch)
    (tmp_path / 'uncertainty.png').write_bytes(b'an earlier run')
    argv = SMALL_UNCERTAINTY + ['--seeds', '2', '--passes', '2', '--out', str(tmp_path)]
    with pytest.warns(UserWarning, match=r'study seed 0 member 2/3 \(seed 1\) diverged'):
        assert run_script('uncertainty', argv, monkeypatch) == 0
    saved = json.loads((tmp_path / 'uncertainty.json').read_text())
    first, second = saved['runs']
    assert first['diverged'].startswith('member 2/3 (seed 1): ') and 'methods' not in first
    assert [m['seed'] for m in first['members']] == [0, 1] and 'diverged' in first['members'][1]
    assert 'diverged' not in second and [m['seed'] for m in second['members']] == [
        1000, 1001, 1002]
    assert saved['setup']['study_seeds'] == 2 and saved['setup']['params'] > 0
    # the figures are study seed 1's alone
    assert saved['summary']['MC-Dropout']['mse'][0] == second['methods']['MC-Dropout']['mse']
    text = (tmp_path / 'uncertainty.md').read_text()
    assert 'Study seeds left out (a member diverged' in text and 'study seed 0 (member 2/3' in text
    assert 'one study seed' in text and 'paper Table 19; study seed 1)' in text
    assert 'uncertainty.png' not in text and not (tmp_path / 'uncertainty.png').exists()
    assert 'Traceback' not in capsys.readouterr().err
    # every study seed out: the record and a report that says so, no tables; --replot alike
    _diverges_at(monkeypatch, {0})
    with pytest.warns(UserWarning, match='study seed 0 member 1/3'):
        assert run_script('uncertainty', SMALL_UNCERTAINTY + ['--passes', '2', '--out',
                                                             str(tmp_path), '--overwrite'],
                          monkeypatch) == 0
    saved = json.loads((tmp_path / 'uncertainty.json').read_text())
    assert [r['diverged'][:10] for r in saved['runs']] == ['member 1/3']
    assert saved['summary'] == {} and saved['verdicts'] == []
    text = (tmp_path / 'uncertainty.md').read_text()
    assert 'No study seed was scored' in text and 'study seed 0 (member 1/3' in text
    assert run_script('uncertainty', ['--replot', '--out', str(tmp_path)], monkeypatch) == 0
    text = (tmp_path / 'uncertainty.md').read_text()
    assert 'No study seed was scored' in text and 'study seed 0 (member 1/3' in text


def test_uncertainty_keeps_the_study_seeds_finished_before_ctrl_c_and_resumes(tmp_path,
                                                                             monkeypatch,
                                                                             capsys):
    # the study seeds were kept only in memory until the report: Ctrl-C (or a failure late in
    # the study) lost every member trained and every method scored
    from torch_mz.study import EXIT_INTERRUPTED
    from torch_mz.train.trainer import Trainer
    real, fits = Trainer.fit, []

    def fit(self, *args, **kwargs):
        if len(fits) == 4 and 'stopped' not in fits:  # (study seed 1's second member)
            fits.append('stopped')
            raise KeyboardInterrupt
        fits.append('fit')
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Trainer, 'fit', fit)
    argv = SMALL_UNCERTAINTY + ['--seeds', '2', '--passes', '2', '--out', str(tmp_path)]
    assert run_script('uncertainty', argv, monkeypatch) == EXIT_INTERRUPTED
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / 'runs') in err and '--resume' in err
    assert len(os.listdir(tmp_path / 'runs')) == 1 and not (tmp_path / 'uncertainty.json').exists()
    usage_error('uncertainty', argv, monkeypatch, capsys, '--resume', '--overwrite')
    assert run_script('uncertainty', argv + ['--resume'], monkeypatch) == 0
    assert fits == ['fit'] * 4 + ['stopped'] + ['fit'] * 3  # (study seed 0 not trained again)
    saved = json.loads((tmp_path / 'uncertainty.json').read_text())
    assert [r['study_seed'] for r in saved['runs']] == [0, 1]
    assert all('diverged' not in r and r['methods'] for r in saved['runs'])
    assert [m['seed'] for m in saved['runs'][0]['members']] == [0, 1, 2]
    assert saved['summary']['MC-Dropout']['mse'][0] == pytest.approx(np.mean(
        [r['methods']['MC-Dropout']['mse'] for r in saved['runs']]))
    assert 'Study seeds left out' not in (tmp_path / 'uncertainty.md').read_text()
    # the report says which study seed an earlier call measured (its inference times too: the
    # 'x IHW time' means mix the calls); it read as though this call had measured them all
    assert saved['read_back'] == 1
    assert '1 of the 2 study seed(s) were read back' in (tmp_path / 'uncertainty.md').read_text()


def test_uncertainty_does_not_read_back_a_study_seed_timed_on_another_device(tmp_path,
                                                                           monkeypatch):
    # the store's identity leaves the device out (it changes no trained figure), but the
    # methods' inference times were measured on it: a study seed timed on the CPU was read
    # back into a study on a GPU, its 'x IHW time' averaged with the GPU's
    import torch
    from torch_mz.train.trainer import Trainer
    argv = SMALL_UNCERTAINTY + ['--passes', '2', '--out', str(tmp_path)]
    assert run_script('uncertainty', argv + ['--device', 'cpu'], monkeypatch) == 0

    class TrainedAgain(Exception):
        pass

    def init(self, *args, **kwargs):
        raise TrainedAgain
    monkeypatch.setattr(Trainer, '__init__', init)
    assert run_script('uncertainty', argv + ['--device', 'cpu', '--resume'], monkeypatch) == 0
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)  # (auto: cuda)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *args: 'a GPU')
    with pytest.raises(TrainedAgain):
        run_script('uncertainty', argv + ['--resume'], monkeypatch)


# --- what_mz_learns.py -----------------------------------------------------------------------

SMALL_WHAT = ['--quick', '--n-train', '16', '--epochs', '1', '--n-probe', '8']


@pytest.mark.parametrize('argv, needles', [
    (['--L', '4,0'], ('argument --L', "'0'")),
    (['--L', '4,4'], ('argument --L', 'given twice')),
    (['--L', 'four'], ('argument --L', "'four'")),
    (['--L', ''], ('argument --L', )),
    (['--tdof', '20'], ('--d 16 --tdof 20', 'tdof')),
    (['--d', '0'], ('argument --d', "'0'")),
    (['--n-probe', '0'], ('argument --n-probe', "'0'")),
    (['--n-probe', '1'], ('--n-probe 1 is too few', )),
    (['--threshold', '-0.1'], ('argument --threshold', "'-0.1'")),
    (['--threshold', '1.5'], ('--threshold 1.5 is above 1', )),  # every activity read 0
    (['--seeds', '0'], ('argument --seeds', "'0'")),
])
def test_what_mz_learns_refuses_bad_options(argv, needles, tmp_path, monkeypatch, capsys,
                                            no_training):
    usage_error('what_mz_learns', SMALL_WHAT + ['--out', str(tmp_path)] + argv, monkeypatch,
                capsys, *needles)
    assert not os.listdir(tmp_path)


def test_what_mz_learns_records_a_diverged_run(tmp_path, monkeypatch, capsys):
    # one diverged run ended the study with a traceback; it is recorded, left out of the
    # trained figures, and an L whose every seed diverged carries no verdict; without
    # matplotlib the report linked an earlier run's figure, left there
    _diverges_at(monkeypatch, {1})  # the second L's one seed
    without_matplotlib(monkeypatch)
    (tmp_path / 'what_mz_learns.png').write_bytes(b'an earlier run')
    argv = ['--quick', '--L', '1,2', '--d', '4', '--tdof', '2', '--n-train', '8', '--n-probe',
            '4', '--epochs', '1', '--out', str(tmp_path)]
    with pytest.warns(UserWarning, match='L=2 seed 0 diverged'):
        assert run_script('what_mz_learns', argv, monkeypatch) == 0
    saved = json.loads((tmp_path / 'what_mz_learns.json').read_text())
    rows = {(r['L'], r['state']): r for r in saved['rows']}
    assert rows[2, 'trained']['seeds'] == 0 and rows[2, 'trained']['diverged'] == 1
    assert rows[2, 'trained']['effective_rank'] is None  # (NaN, in standard JSON null)
    assert rows[2, 'init']['seeds'] == 1 and np.isfinite(rows[2, 'init']['effective_rank'])
    assert rows[1, 'trained']['seeds'] == 1 and np.isfinite(rows[1, 'trained']['effective_rank'])
    assert all(r['L'] == 1 for r in saved['per_layer'])
    text = (tmp_path / 'what_mz_learns.md').read_text()
    assert 'runs that diverged, left out of the trained rows: L=2 seed 0' in text
    assert 'L=2:' not in ' '.join(saved['verdicts'])
    assert 'what_mz_learns.png' not in text and not (tmp_path / 'what_mz_learns.png').exists()
    assert 'Traceback' not in capsys.readouterr().err


def test_what_mz_learns_keeps_the_runs_trained_before_ctrl_c_and_resumes(tmp_path, monkeypatch,
                                                                         capsys):
    # the runs were kept only in memory until the report: Ctrl-C (or a failure late in the
    # study) lost every model trained and probed
    from torch_mz.study import EXIT_INTERRUPTED
    from torch_mz.train.trainer import Trainer
    real, fits = Trainer.fit, []

    def fit(self, *args, **kwargs):
        if len(fits) == 1 and 'stopped' not in fits:  # (the second run: L=2)
            fits.append('stopped')
            raise KeyboardInterrupt
        fits.append('fit')
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Trainer, 'fit', fit)
    argv = ['--quick', '--L', '1,2', '--d', '4', '--tdof', '2', '--n-train', '8', '--n-probe',
            '4', '--epochs', '1', '--out', str(tmp_path)]
    assert run_script('what_mz_learns', argv, monkeypatch) == EXIT_INTERRUPTED
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / 'runs') in err and '--resume' in err
    assert len(os.listdir(tmp_path / 'runs')) == 1
    usage_error('what_mz_learns', argv, monkeypatch, capsys, '--resume', '--overwrite')
    assert run_script('what_mz_learns', argv + ['--resume'], monkeypatch) == 0
    assert fits == ['fit', 'stopped', 'fit']  # (L=1 read back, not trained again)
    saved = json.loads((tmp_path / 'what_mz_learns.json').read_text())
    assert [(r['L'], r['state']) for r in saved['runs']] == [
        (1, 'init'), (1, 'trained'), (2, 'init'), (2, 'trained')]
    assert all(r['layers'] and 'diverged' not in r for r in saved['runs'])
    # the layers of the run read back (L=1) in the model's order, as the fresh run's (L=2):
    # sorted, the per-layer table and the plot's first layer changed on a resume
    assert list(saved['runs'][1]['layers']) == list(saved['runs'][3]['layers'])
    rows = {(r['L'], r['state']): r for r in saved['rows']}
    assert rows[1, 'trained']['seeds'] == 1 and np.isfinite(rows[1, 'trained']['effective_rank'])
    assert np.isfinite(rows[1, 'trained']['test r2'])
    assert saved['run_minutes'] >= 0


def test_what_mz_learns_checks_the_control_on_the_ls_it_compares():
    # the control (initialisation) of an L whose every seed diverged still counted: its
    # generators, not near-orthogonal at init, made the verdict read 'it does not hold at
    # initialisation, so training produced it' of the Ls that held there too
    study = load_script('what_mz_learns')

    def row(L, state, cos, seeds=1):
        figures = {key: (1.0 if seeds else math.nan) for key in study.KEYS}
        return dict(figures, L=L, state=state, seeds=seeds, chance_abs_cos=0.03,
                    mean_abs_offdiag_cos=cos if seeds else math.nan)
    rows = [row(4, 'init', 0.5), row(4, 'trained', None, seeds=0),
            row(8, 'init', 0.05), row(8, 'trained', 0.04)]
    ortho = study.verdicts(rows, tdof=8, threshold=0.1)[0]
    assert ortho.startswith('**Near-orthogonal generators: agrees**')
    assert 'holds equally at initialisation' in ortho and 'training produced it' not in ortho


# --- set_size_generalisation.py --------------------------------------------------------------

@pytest.mark.parametrize('argv, needles', [
    (['--n-train', '0'], ('argument --n-train', "'0'")),
    (['--n-test', '0'], ('argument --n-test', "'0'")),
    (['--n-test', '1'], ('--n-test 1 is too few', )),
    (['--epochs', '0'], ('argument --epochs', "'0'")),
    (['--lr', '0'], ('argument --lr', "'0'")),
    (['--seeds', '0'], ('argument --seeds', "'0'")),
    (['--tdof', '20'], ('--d 16 --tdof 20', 'tdof')),
    (['--d', 'x'], ('argument --d', "'x'")),
])
def test_set_size_generalisation_refuses_bad_options(argv, needles, tmp_path, monkeypatch,
                                                     capsys, no_training):
    usage_error('set_size_generalisation', ['--quick', '--out', str(tmp_path)] + argv,
                monkeypatch, capsys, *needles)
    assert not os.listdir(tmp_path)


def test_set_size_generalisation_table_spread_over_seeds():
    study = load_script('set_size_generalisation')
    names = [study.name_of(m, ln) for m, ln in study.CONFIGS]
    assert names == ['rigid', 'rigid + log_n', 'mz', 'mz + log_n']
    results = {(name, rng): [0.5 + 0.1 * i, 0.7 + 0.1 * i] for i, name in enumerate(names)
               for rng in study.TEST_SIZES}
    rows = study.table_rows(results, seeds=2)
    assert rows[0]['rigid'] == pytest.approx(0.6) and rows[0]['rigid std'] == pytest.approx(0.1)
    assert rows[0]['mz + log_n'] == pytest.approx(0.9)
    shown = study.shown(rows, seeds=2)
    assert shown[0]['rigid'] == '0.6 ± 0.1' and 'rigid std' not in shown[0]
    assert rows[0]['rigid'] == pytest.approx(0.6)  # the rows themselves unchanged
    # one seed: the value alone, as the committed (quick) results show it
    one = study.table_rows({k: v[:1] for k, v in results.items()}, seeds=1)
    assert study.shown(one, seeds=1) == one and 'rigid std' not in one[0]
    assert one[0]['rigid'] == pytest.approx(0.5) and one[0]['paper ST'] == 0.957


def _diverges_at(monkeypatch, calls):
    r"""``Trainer.fit`` (and so ``train``) raises :class:`TrainingDiverged` at the calls
    numbered in :obj:`calls` (0-based), and trains at the others."""
    import math

    from torch_mz.train import TrainingDiverged
    from torch_mz.train.trainer import Trainer
    real, count = Trainer.fit, [0]

    def fit(self, *args, **kwargs):
        count[0] += 1
        if count[0] - 1 in calls:
            raise TrainingDiverged(0, math.nan)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Trainer, 'fit', fit)


def test_set_size_generalisation_records_a_diverged_run(tmp_path, monkeypatch, capsys):
    # one diverged run ended the study with a traceback (the other studies record it, leave it
    # out of the means and go on); and without matplotlib the report linked an earlier run's
    # figure, left there
    _diverges_at(monkeypatch, {1, 2, 3})  # rigid seed 1, both seeds of rigid + log_n
    without_matplotlib(monkeypatch)
    (tmp_path / 'set_size_generalisation.png').write_bytes(b'an earlier run')
    argv = ['--quick', '--seeds', '2', '--n-train', '8', '--n-test', '4', '--epochs', '1',
            '--d', '4', '--tdof', '2', '--out', str(tmp_path)]
    with pytest.warns(UserWarning) as caught:
        assert run_script('set_size_generalisation', argv, monkeypatch) == 0
    assert [str(w.message).split(' (')[0] for w in caught if 'diverged' in str(w.message)] == [
        'rigid seed 1 diverged', 'rigid + log_n seed 0 diverged', 'rigid + log_n seed 1 diverged']
    saved = json.loads((tmp_path / 'set_size_generalisation.json').read_text())
    diverged = [(r['model'], r['seed']) for r in saved['runs'] if 'diverged' in r]
    assert diverged == [('rigid', 1), ('rigid + log_n', 0), ('rigid + log_n', 1)]
    row = saved['rows'][0]
    assert row['rigid std'] == 0.0 and np.isfinite(row['rigid'])  # seed 0 alone
    assert row['rigid + log_n'] is None and np.isfinite(row['mz + log_n'])  # (NaN: null)
    text = (tmp_path / 'set_size_generalisation.md').read_text()
    assert 'Runs that diverged (left out of the means' in text and 'rigid seed 1' in text
    assert 'set_size_generalisation.png' not in text
    assert not (tmp_path / 'set_size_generalisation.png').exists()
    assert 'Traceback' not in capsys.readouterr().err


def test_set_size_generalisation_keeps_the_runs_trained_before_ctrl_c_and_resumes(
        tmp_path, monkeypatch, capsys):
    # the runs were kept only in memory until the report: Ctrl-C (or a failure late in the
    # study) lost every model trained
    from torch_mz.study import EXIT_INTERRUPTED
    from torch_mz.train.trainer import Trainer
    real, fits = Trainer.fit, []

    def fit(self, *args, **kwargs):
        if len(fits) == 3 and 'stopped' not in fits:  # (the fourth run: mz seed 0)
            fits.append('stopped')
            raise KeyboardInterrupt
        fits.append(type(self.model).__name__)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Trainer, 'fit', fit)
    argv = ['--quick', '--n-train', '8', '--n-test', '4', '--epochs', '1', '--d', '4',
            '--tdof', '2', '--out', str(tmp_path)]
    assert run_script('set_size_generalisation', argv, monkeypatch) == EXIT_INTERRUPTED
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / 'runs') in err and '--resume' in err
    assert len(os.listdir(tmp_path / 'runs')) == 3
    assert not (tmp_path / 'set_size_generalisation.json').exists()
    # without --resume or --overwrite the runs kept are not removed
    usage_error('set_size_generalisation', argv, monkeypatch, capsys, '--resume', '--overwrite')
    assert len(os.listdir(tmp_path / 'runs')) == 3
    assert run_script('set_size_generalisation', argv + ['--resume'], monkeypatch) == 0
    assert len(fits) == 5  # (only the run stopped trains again: 3 + stopped + 1)
    saved = json.loads((tmp_path / 'set_size_generalisation.json').read_text())
    assert len(saved['runs']) == 4 * 4 and all(np.isfinite(r['r2']) for r in saved['runs'])
    assert [r['model'] for r in saved['runs'][::4]] == ['rigid', 'rigid + log_n', 'mz',
                                                       'mz + log_n']
    assert all(np.isfinite(v) for row in saved['rows'] for k, v in row.items()
               if k != 'test_sizes')
    # --overwrite trains every run again
    assert run_script('set_size_generalisation', argv + ['--overwrite'], monkeypatch) == 0
    assert len(fits) == 9


def test_set_size_generalisation_runs_small(tmp_path, monkeypatch):
    argv = ['--quick', '--seeds', '2', '--n-train', '8', '--n-test', '4', '--epochs', '1',
            '--d', '4', '--tdof', '2', '--out', str(tmp_path)]
    assert run_script('set_size_generalisation', argv, monkeypatch) == 0
    saved = json.loads((tmp_path / 'set_size_generalisation.json').read_text())
    assert saved['setup']['seeds'] == 2 and saved['setup']['n_train'] == 8
    assert len(saved['runs']) == 2 * len(saved['rows']) * 4
    assert all('rigid std' in row for row in saved['rows'])
    text = (tmp_path / 'set_size_generalisation.md').read_text()
    assert text.count(' ± ') >= 4 * 4 and 'over 2 seeds' in text


@pytest.mark.parametrize('script, argv', [
    ('targets', []), ('rotation_matching_analysis', SMALL_ROTATION),
    ('rotation_matching_features', SMALL_FEATURES),
    ('uncertainty', SMALL_UNCERTAINTY), ('what_mz_learns', SMALL_WHAT),
    ('set_size_generalisation', ['--quick'])])
def test_out_that_is_a_file_is_refused_first(script, argv, tmp_path, monkeypatch, capsys,
                                             no_training):
    out = tmp_path / 'results.md'
    out.write_text('not a folder')
    usage_error(script, argv + ['--out', str(out)], monkeypatch, capsys, '--out', str(out))
    assert out.read_text() == 'not a folder'
