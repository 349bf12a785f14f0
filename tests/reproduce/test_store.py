import json
import os
import re
import shutil
from dataclasses import replace

import pytest

import torch_mz.reproduce as reproduce
from torch_mz.reproduce import BUDGETS, CLAIMS, Reproduction

from tests.reproduce._common import TINY, SUM, CLAIM


def test_the_committed_runs_are_found_by_this_code(tmp_path):
    # the store finds a finished run by a digest of its key (task arguments, model, seed and the
    # training configuration that changes results): a change to the key, the digest, the
    # budget or a default of TrainConfig would make every committed run look missing and
    # retrain it for hours, silently. The finished claims must stay finished (a copy of the
    # records: looking up a run takes a lock file beside its checkpoint)
    committed = os.path.join(os.path.dirname(__file__), '..', '..', 'benchmarks', 'results',
                             'reproduction', 'records', 'converged')
    shutil.copytree(committed, tmp_path / 'records' / 'converged')
    repro = Reproduction(BUDGETS['converged'], str(tmp_path), device='cpu')
    for name in ('table1', 'table1-protocol', 'table3', 'table3-protocol', 'table7', 'table28'):
        stages = repro.status(CLAIMS[name])
        if name == 'table28':  # in training; its sweep is finished
            stages = [s for s in stages if s['stage'].startswith('sweep')]
        assert stages
        for stage in stages:
            assert stage['done'] > 0 and stage['pending'] == stage['started'] == 0, (name, stage)
            assert stage['unknown'] == stage['training'] == 0, (name, stage)


def test_a_stopped_run_is_not_taken_for_a_finished_one_of_the_same_cell_model_and_seed(
        tmp_path, monkeypatch):
    from torch_mz.train import Trainer
    budget = replace(TINY, epochs=4)
    cells = {'sum': SUM}
    # two claims on the same cells, models and seeds at two points (as table3 and
    # table3-protocol): the second's runs are finished
    first = replace(CLAIM, name='first', protocol=(2e-3, 0.05))
    second = replace(CLAIM, name='second', protocol=(1e-3, 1e-5))
    Reproduction(budget, str(tmp_path), device='cpu', sweep_cells=cells).run(second)
    before = {p: p.read_text() for p in tmp_path.rglob('records/tiny/**/*.json')}
    assert len(before) == 8
    now = [0.0]
    original = Trainer._train_epoch

    def ticking(self, loader, epoch):
        now[0] += 10.0
        return original(self, loader, epoch)
    monkeypatch.setattr(Trainer, '_train_epoch', ticking)
    repro = Reproduction(budget, str(tmp_path), device='cpu', sweep_cells=cells,
                         deadline=5.0, clock=lambda: now[0], carry=True)
    # the first claim's first run stops after one epoch; the second claim is read back (each
    # of its runs handed to the store as the trainer hands a finished one)
    results = list(reproduce.run_claims(repro, [first, second]))
    assert [(c.name, type(e).__name__) for c, _, e in results] == [('first', 'TimeLimit'),
                                                                  ('second', 'NoneType')]
    after = {p: p.read_text() for p in tmp_path.rglob('records/tiny/**/*.json')}
    assert after == before  # no record written for the stopped run, none changed
    assert len(list(tmp_path.glob('runs/tiny/*/checkpoint.pt'))) == 1  # it resumes later
    # a record read back from the store is never saved as a newly trained run
    d2 = repro.sized(SUM)
    config = repro.claim_config(first, 'sum', 2e-3, 0.05)
    run_config = repro.store.config_for(d2, CLAIM.models[0], 0, config)
    assert repro.store.cached(d2, CLAIM.models[0], 0, run_config) is None  # pending now
    stored = json.loads(next(iter(before.values())))
    assert repro.store.save(dict(stored, cell=d2['label'], model=CLAIM.models[0],
                                 seed=0)) is None
    assert {p: p.read_text() for p in tmp_path.rglob('records/tiny/**/*.json')} == before


def test_the_repository_commits_the_checkpoints_of_runs_in_progress():
    import shutil
    import subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    if shutil.which('git') is None or not (root / '.git').exists():
        pytest.skip('not a git checkout')
    runs = 'benchmarks/results/reproduction/runs/converged'
    ignored = {f'{runs}/0123456789/checkpoint.pt': False, f'{runs}/0123456789/best.pt': False,
               'benchmarks/results/reproduction/weights/converged/t/m/r_s0.pt': False,
               f'{runs}/0123456789/metrics.jsonl': False,
               f'{runs}/0123456789/code.jsonl': False,
               f'{runs}/0123456789/.code.jsonl.0a1b2c.tmp': True,
               f'{runs}/0123456789/metrics.csv': True, f'{runs}/0123456789.lock': True,
               f'{runs}/weights/0123456789.pt': True,
               f'{runs}/0123456789/.checkpoint.pt.0a1b2c.tmp': True,
               'benchmarks/results/speed/checkpoint.pt': True, 'runs/x/checkpoint.pt': True}
    out = subprocess.run(['git', 'check-ignore', '--no-index', '--stdin'], cwd=root, text=True,
                         input='\n'.join(ignored) + '\n', capture_output=True)
    assert out.returncode in (0, 1), out.stderr
    found = set(out.stdout.split())
    assert {p: p in found for p in ignored} == ignored


def test_a_run_record_names_the_code_that_trained_it(tmp_path):
    from torch_mz.study.measure import code_version
    Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM}).sweep(
        'sum', CLAIM.models[:1])
    records = [json.loads(p.read_text()) for p in tmp_path.rglob('records/tiny/**/*.json')]
    assert len(records) == len(TINY.sweep)
    version = code_version()  # this checkout's commit (None in an installed copy)
    assert all(r['code'] == version for r in records)
    if version is not None:
        commit = version.split('-')[0]
        assert len(commit) == 10 and int(commit, 16) >= 0


def test_an_unreadable_run_record_is_named_not_a_bare_json_error(tmp_path):
    from torch_mz.reproduce.store import RecordError
    repro = Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    repro.sweep('sum', CLAIM.models[:1])
    path = sorted(tmp_path.rglob('records/tiny/**/*.json'))[0]
    for text, match in (('{"key": ', 'cannot be read'), ('[1, 2]', 'holds a list, not a JSON')):
        path.write_text(text)  # cut short, or not an object (e.g. a bad merge)
        with pytest.raises(RecordError, match=f"run record '{re.escape(str(path))}' {match}"):
            Reproduction(TINY, str(tmp_path), device='cpu',
                         sweep_cells={'sum': SUM}).sweep('sum', CLAIM.models[:1])
    assert issubclass(RecordError, ValueError)


def test_a_damaged_log_of_a_run_in_training_is_named(tmp_path):
    # metrics.jsonl of a run in progress is committed (--carry), so a merge can damage it; it
    # was a bare JSONDecodeError from --status and the scheduler
    from torch_mz.reproduce.store import RecordError, _metrics
    folder = tmp_path / 'run'
    folder.mkdir()
    log = folder / 'metrics.jsonl'
    assert _metrics(str(folder)) == []  # none yet
    log.write_text('{"epoch": 0, "val_loss": 0.5}\n{"epoch": 1, "val_loss": 0.4}\n')
    assert [m['epoch'] for m in _metrics(str(folder))] == [0, 1]
    for text, line in (('<<<<<<< HEAD\n{"epoch": 0}\n', 1), ('{"epoch": 0}\n{"epoch": 1, "va', 2),
                       ('{"epoch": 0}\n[1]\n', 2)):
        log.write_text(text)
        with pytest.raises(RecordError, match=f"run in training '{re.escape(str(log))}' cannot "
                           f"be read \\(line {line}: .*delete it: resuming the run writes it"):
            _metrics(str(folder))


def test_a_record_without_a_numeric_wall_time_is_named(tmp_path):
    from torch_mz.reproduce.store import RecordError
    repro = Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    repro.sweep('sum', CLAIM.models[:1])
    assert repro.store.mean_time('sum', CLAIM.models[0]) is not None
    path = sorted(tmp_path.rglob('records/tiny/**/*.json'))[0]
    path.write_text(json.dumps(dict(json.loads(path.read_text()), wall_time_s=None)))
    with pytest.raises(RecordError, match=f"run record '{re.escape(str(path))}' holds "
                       f"wall_time_s=None"):
        repro.store.mean_time('sum', CLAIM.models[0])


def test_an_edited_record_is_named_not_trained_again_and_replaced(tmp_path):
    # a record whose key was edited (or lost) was taken for a missing run: trained again and
    # overwritten without a word; one without its metrics failed later with a bare KeyError
    from torch_mz.reproduce.store import RecordError
    repro = Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    repro.sweep('sum', CLAIM.models[:1])
    path = sorted(tmp_path.rglob('records/tiny/**/*.json'))[0]
    good = json.loads(path.read_text())
    edits = [(dict(good, key=dict(good['key'], seed=7)), 'holds a key other than'),
             ({k: v for k, v in good.items() if k != 'key'}, r'lacks key \(of type dict\)'),
             ({k: v for k, v in good.items() if k != 'test'}, r'lacks test \(of type dict\)'),
             (dict(good, epochs_run='3'), r'lacks epochs_run \(of type int\)')]
    for record, match in edits:
        path.write_text(json.dumps(record))
        with pytest.raises(RecordError, match=f"run record '{re.escape(str(path))}' {match}"):
            Reproduction(TINY, str(tmp_path), device='cpu',
                         sweep_cells={'sum': SUM}).sweep('sum', CLAIM.models[:1])
        assert json.loads(path.read_text()) == record  # not replaced


def _stopped_before_the_folders_went(tmp_path, monkeypatch):
    r"""A tiny sweep whose finished runs' checkpoint folders were not removed (a stop after each
    record): the reproduction and those folders, sorted."""
    import torch_mz.reproduce.store as store
    monkeypatch.setattr(store.shutil, 'rmtree', lambda *a, **k: None)  # the stop
    repro = Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    repro.sweep('sum', CLAIM.models[:1])
    monkeypatch.undo()
    left = sorted(p for p in (tmp_path / 'runs' / 'tiny').iterdir() if p.is_dir()
                  and p.name != 'weights')
    return repro, left


def test_tidy_removes_the_folders_a_stop_after_the_record_left(tmp_path, monkeypatch):
    # stopped between writing a run's record and removing its checkpoint folder: the folder
    # stayed for good (and went into the commit of the runs in progress)
    import torch_mz.reproduce.store as store
    repro, left = _stopped_before_the_folders_went(tmp_path, monkeypatch)
    assert len(left) == len(TINY.sweep)
    weights = sorted((tmp_path / 'runs' / 'tiny' / 'weights').iterdir())
    assert len(weights) == len(TINY.sweep)  # written before the record
    # a run being trained again for its weights (fewer epochs in its log than its record) and
    # a run whose lock is held keep their folders
    (left[0] / 'metrics.jsonl').write_text('')
    with store.file_lock(str(left[1]) + '.lock', wait=False, strict=True) as held:
        assert held
        removed = Reproduction(TINY, str(tmp_path), device='cpu',
                               sweep_cells={'sum': SUM}).store.tidy()
    assert sorted(removed) == sorted(str(p) for p in left[2:])
    assert left[0].exists() and left[1].exists() and not any(p.exists() for p in left[2:])
    assert repro.store.tidy() == [str(left[1])]  # its lock now free


def test_a_removal_stopped_part_way_leaves_nothing_tidy_keeps(tmp_path, monkeypatch):
    # the checkpoint folder of a finished run is removed with its log last: stopped part-way
    # (here, before the last step), the folder holds the log alone, no checkpoint; emptied,
    # tidy() removes it too. Before, a stop after the log went left checkpoint.pt and best.pt,
    # which tidy() kept for good (no log: fewer epochs than the record)
    repro, left = _stopped_before_the_folders_went(tmp_path, monkeypatch)
    assert len(left) == len(TINY.sweep) >= 2
    for folder in left:
        assert sorted(p.name for p in folder.iterdir()) == ['metrics.jsonl']
    (left[0] / 'metrics.jsonl').unlink()  # a stop after the log went: an empty folder
    assert sorted(repro.store.tidy()) == sorted(str(p) for p in left)
    assert not any(p.exists() for p in left)


def test_status_makes_no_lock_files(tmp_path):
    repro = Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    stages = repro.status(CLAIM)
    assert stages and stages[0]['pending'] > 0
    assert not list(tmp_path.rglob('*.lock'))


def test_tidy_passes_over_what_it_cannot_read_and_takes_diverged_runs(tmp_path, monkeypatch):
    repro, left = _stopped_before_the_folders_went(tmp_path, monkeypatch)
    (left[0] / 'metrics.jsonl').write_text('<<<<<<< HEAD\n')  # damaged: named where needed
    # a diverged run's log lacks the epoch that diverged
    record = next(p for p in tmp_path.rglob('records/tiny/**/*.json')
                  if p.name.endswith(f'_{left[1].name}.json'))
    data = json.loads(record.read_text())
    record.write_text(json.dumps(dict(data, epochs_run=data['epochs_run'] + 1,
                                      diverged='Training loss is nan')))
    removed = repro.store.tidy()
    assert sorted(removed) == sorted(str(p) for p in left[1:]) and left[0].exists()


def test_a_full_disk_while_the_weights_are_copied_leaves_no_partial_file(tmp_path,
                                                                        monkeypatch):
    # the best weights were copied to '<hash>.pt.tmp' and renamed: a disk that filled part-way
    # left the partial copy there for good, unflushed, and the error named no file
    import errno
    from torch_mz.reproduce.store import RunStore
    from torch_mz.train import TrainConfig
    store = RunStore(str(tmp_path / 'records'), str(tmp_path / 'checkpoints'))
    cell = dict(task='sum', label='c', kwargs=dict(n_train=8))
    config = store.config_for(cell, 'mz', 0, TrainConfig(epochs=1, warmup_epochs=0))
    assert store.cached(cell, 'mz', 0, config) is None  # (remembered for save)
    os.makedirs(config.out_dir)
    with open(os.path.join(config.out_dir, 'best.pt'), 'wb') as f:
        f.write(b'the best weights' * 4096)
    weights = os.path.join(str(tmp_path / 'checkpoints'), 'weights',
                           os.path.basename(config.out_dir) + '.pt')
    os.makedirs(os.path.dirname(weights))
    with open(weights, 'wb') as f:
        f.write(b'an earlier run of this key')

    def full(*args):  # half the weights written, then no room (the kernel's copy, or Python's)
        out = args[1]
        if isinstance(out, int):
            os.write(out, b'half')
        else:
            out.write(b'half')
        raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(os, 'sendfile', full)
    monkeypatch.setattr(shutil, 'copyfileobj', full)
    with pytest.raises(OSError) as failed:
        store.save(dict(cell='c', model='mz', seed=0, epochs_run=1, best_epoch=0,
                        val=dict(loss=0.5), test=dict(loss=0.25)))
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == weights
    assert os.listdir(os.path.dirname(weights)) == [os.path.basename(weights)]
    assert open(weights, 'rb').read() == b'an earlier run of this key'
    # the run is not stored, and its checkpoint folder stays: it is saved again
    assert store.read(cell, 'mz', 0, config) is None and os.path.isdir(config.out_dir)
    monkeypatch.undo()
    store.expect(cell, 'mz', 0, config)
    store.save(dict(cell='c', model='mz', seed=0, epochs_run=1, best_epoch=0,
                    val=dict(loss=0.5), test=dict(loss=0.25)))
    assert open(weights, 'rb').read() == b'the best weights' * 4096
    assert store.read(cell, 'mz', 0, config)['test'] == dict(loss=0.25)


def test_a_run_with_a_nan_figure_is_kept_as_standard_json_and_read_back_as_nan(tmp_path):
    # the store wrote the bare word NaN; now null, read back as NaN (the finished runs' and
    # sweep's float(record['test']['r2']) had raised a TypeError on a null)
    import math
    from torch_mz.reproduce.store import RunStore
    from torch_mz.train import TrainConfig
    store = RunStore(str(tmp_path / 'records'), str(tmp_path / 'checkpoints'))
    cell = dict(task='sum', label='c', kwargs=dict(n_train=8))
    config = TrainConfig(epochs=1, warmup_epochs=0)
    assert store.cached(cell, 'mz', 0, config) is None  # (remembered for save)
    store.save(dict(cell='c', model='mz', seed=0, epochs_run=1, best_epoch=0,
                    val=dict(loss=0.5, r2=math.nan), test=dict(loss=0.25, r2=math.nan)))
    path = store.files(cell, 'mz', 0, config)

    def refuse(word):
        raise ValueError(f'not standard JSON: {word}')
    with open(path) as f:
        assert json.loads(f.read(), parse_constant=refuse)['test'] == dict(loss=0.25, r2=None)
    record = store.read(cell, 'mz', 0, config)
    assert record['test']['loss'] == 0.25 and math.isnan(record['test']['r2'])
    assert math.isnan(record['val']['r2']) and record['best_epoch'] == 0


def test_the_code_log_keeps_the_entries_of_the_epochs_the_checkpoint_kept(tmp_path,
                                                                        monkeypatch):
    import torch_mz.reproduce.store as store
    from torch_mz.reproduce.store import CODE_LOG, RecordError, RunStore
    from torch_mz.train import TrainConfig
    runs = RunStore(str(tmp_path / 'records'), str(tmp_path / 'checkpoints'))
    cell = dict(task='sum', label='c', kwargs=dict(n_train=8))
    config = runs.config_for(cell, 'mz', 0, TrainConfig(epochs=9, device='cpu'))
    log = os.path.join(config.out_dir, CODE_LOG)

    def epochs():
        return [(e['epoch'], e['code']) for e in store._code_log(config.out_dir)]
    for version in ('a', 'b'):  # a start that wrote no checkpoint is replaced by the next
        runs.code = version  # (the code of the process: code_version when the store is made)
        assert runs.log_start(cell, 'mz', 0, config)['epoch'] == 0
    assert epochs() == [(0, 'b')]
    resume = replace(config, resume=os.path.join(config.out_dir, 'checkpoint.pt'))
    checkpoint = {'epoch': 3}
    monkeypatch.setattr(store, 'load_checkpoint', lambda path: checkpoint)
    for version in ('c', 'd'):  # a resume that kept no epoch is replaced by the next
        runs.code = version  # (the code of the process: code_version when the store is made)
        assert runs.log_start(cell, 'mz', 0, resume)['epoch'] == 4
    checkpoint = {'epoch': 6}
    runs.log_start(cell, 'mz', 0, resume)
    assert epochs() == [(0, 'b'), (4, 'd'), (7, 'd')]
    checkpoint = {'epoch': 5}  # (an earlier checkpoint, e.g. restored with git)
    runs.log_start(cell, 'mz', 0, resume)
    assert epochs() == [(0, 'b'), (4, 'd'), (6, 'd')]
    os.remove(log)  # a run begun by code that kept no log
    runs.log_start(cell, 'mz', 0, resume)
    assert epochs() == [(0, None), (6, 'd')]
    assert store._code_log(config.out_dir)[0]['note'].startswith('unknown')
    with open(log, 'a') as f:
        f.write('<<<<<<< HEAD\n')  # a bad merge of the committed file
    with pytest.raises(RecordError, match=f"code log of a run in training "
                       f"'{re.escape(log)}' cannot be read \\(line 3"):
        runs.log_start(cell, 'mz', 0, resume)


def test_tidy_removes_the_folder_of_a_finished_run_holding_only_its_code_log(tmp_path,
                                                                            monkeypatch):
    # a finished run trained again for its weights and stopped before its first epoch left a
    # folder holding only the code log of that start: tidy() kept it for good (no epoch in its
    # log against the record's), to be committed with the runs in progress, where the empty
    # folder such a stop left before the code log was removed
    import torch_mz.study.grid as grid
    from torch_mz.reproduce.store import CODE_LOG
    repro = Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    repro.sweep('sum', CLAIM.models[:1])
    job = (repro.sized(SUM), CLAIM.models[0], 0, replace(repro.base_config('sum'),
                                                          lr=TINY.sweep[0][0],
                                                          weight_decay=TINY.sweep[0][1]))
    folder = repro.store.config_for(*job).out_dir
    assert repro.store.stored(*job) and not os.path.exists(folder)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(grid, 'train_one', killed)
    with pytest.raises(KeyboardInterrupt):
        repro._train_one(*job, again=True)
    assert os.listdir(folder) == [CODE_LOG]
    assert repro.store.state(*job)[0] == 'done'
    assert repro.store.tidy() == [folder] and not os.path.exists(folder)


def test_the_code_a_run_names_is_the_code_its_process_runs(tmp_path, monkeypatch):
    # the log and the record read the checkout's commit as each run started and finished: a
    # commit made (or the package edited) while a process trained for hours named code that
    # process had never imported
    import torch_mz.reproduce.store as store
    monkeypatch.setattr(store, 'code_version', lambda: 'aaaaaaaaaa')
    repro = Reproduction(TINY, str(tmp_path), device='cpu', sweep_cells={'sum': SUM})
    monkeypatch.setattr(store, 'code_version', lambda: 'bbbbbbbbbb')  # a commit meanwhile
    repro.sweep('sum', CLAIM.models[:1])
    records = [json.loads(p.read_text()) for p in tmp_path.rglob('records/tiny/**/*.json')]
    assert len(records) == len(TINY.sweep)
    assert all(r['code'] == 'aaaaaaaaaa' for r in records)
    assert all([e['code'] for e in r['code_history']] == ['aaaaaaaaaa'] for r in records)


def test_run_key_holds_the_training_settings_its_docstring_names():
    # run_key's docstring excepted only the device and where files go from the configuration
    # that identifies a run; the evaluation batch size, loader workers, deterministic kernels
    # and how often checkpoints are written are left out too
    from torch_mz.reproduce import run_key
    from torch_mz.train import TrainConfig
    config = TrainConfig(progress=False)
    key = run_key(dict(task='max', kwargs=dict(d=2)), 'mz', 0, config)
    doc = ' '.join(run_key.__doc__.split())
    named = set(re.findall(r'``(\w+)``', doc))
    assert set(key['config']) == named
    for name in ('device', 'eval_batch_size', 'num_workers', 'deterministic',
                 'checkpoint_every', 'out_dir'):
        assert name not in key['config']
        other = replace(config, **{name: {'device': 'cpu', 'eval_batch_size': 3,
                                          'num_workers': 2, 'deterministic': True,
                                          'checkpoint_every': 5, 'out_dir': 'x'}[name]})
        assert run_key(dict(task='max', kwargs=dict(d=2)), 'mz', 0, other) == key, name
    assert 'evaluation batch size, loader workers or deterministic kernels' in doc
