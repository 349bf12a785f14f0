r"""The store of finished study runs (:mod:`torch_mz.study.resume`) that lets an interrupted
study resume."""
import os

import pytest

from torch_mz.train import TrainConfig

QUICK_CONFIG = TrainConfig(epochs=1, warmup_epochs=1, batch_size=8, lr=1e-3, progress=False)


def test_a_store_ignores_a_file_it_cannot_read(tmp_path):
    from torch_mz.study import RunStore
    store = RunStore(str(tmp_path))
    key = dict(cell='a', model='mz', seed=0, data=dict(task='max'))
    path = store.put(key, QUICK_CONFIG, dict(model='mz', test=dict(r2=0.5)))
    assert store.get(key, QUICK_CONFIG) == dict(model='mz', test=dict(r2=0.5))
    with open(path, 'w') as f:
        f.write('{"identity": ')  # cut short
    with pytest.warns(UserWarning, match='cannot be read.*trained again'):  # (was silent)
        assert store.get(key, QUICK_CONFIG) is None


def test_a_study_store_starts_empty_unless_it_resumes(tmp_path):
    from torch_mz.study import RunStore
    key = dict(cell='a', model='mz', seed=0, data=dict(task='max'))
    RunStore.for_study(str(tmp_path), resume=False).put(key, QUICK_CONFIG, dict(model='mz'))
    (tmp_path / 'runs' / 'notes.txt').write_text('kept')
    assert RunStore.for_study(str(tmp_path), resume=True).get(key, QUICK_CONFIG) == dict(
        model='mz')
    # neither resuming nor overwriting: refused, the finished run kept (re-running the command
    # of an interrupted call without --resume had removed every run it finished)
    with pytest.raises(FileExistsError, match='holds 1 run.*--resume.*--overwrite'):
        RunStore.for_study(str(tmp_path), resume=False)
    assert RunStore.for_study(str(tmp_path), resume=True).get(key, QUICK_CONFIG) is not None
    store = RunStore.for_study(str(tmp_path), resume=False, overwrite=True)
    assert store.get(key, QUICK_CONFIG) is None
    assert [p.name for p in (tmp_path / 'runs').iterdir()] == ['notes.txt']


def test_a_study_store_cannot_live_in_a_file_and_keeps_other_entries(tmp_path):
    from torch_mz.study import RunStore
    (tmp_path / 'file').write_text('x')
    with pytest.raises(OSError):  # raised before anything trains, not after the first run
        RunStore.for_study(str(tmp_path / 'file'), resume=False)
    (tmp_path / 'out' / 'runs' / 'odd.json').mkdir(parents=True)  # a folder with a .json name
    store = RunStore.for_study(str(tmp_path / 'out'), resume=False)
    assert (tmp_path / 'out' / 'runs' / 'odd.json').is_dir()
    # a key without a cell (train_models' labels, e.g. a QM9 target) names the file
    path = store.put(dict(target='mu', data={}, model='mz', options={}, seed=1), QUICK_CONFIG,
                     dict(model='mz'))
    assert os.path.basename(path).startswith('mu--mz--seed1-')


def test_a_store_reads_an_option_written_as_an_integer_or_a_float_alike(tmp_path):
    from torch_mz.study import RunStore
    store = RunStore(str(tmp_path))
    key = dict(cell='a', model='mz', seed=0, data=dict(task='max', noise=0, scale=2),
               options=dict(dropout=0.0))
    store.put(key, QUICK_CONFIG, dict(model='mz'))
    same = dict(key, data=dict(task='max', noise=0.0, scale=2.0), options=dict(dropout=0))
    assert store.get(same, QUICK_CONFIG) == dict(model='mz')
    # another value is another run
    assert store.get(dict(key, data=dict(task='max', noise=0.5, scale=2)), QUICK_CONFIG) is None
    assert len(list(tmp_path.iterdir())) == 1
    # the labels and the seed that name the file, too (train_models' keys have no cell)
    labelled = dict(target=1, data={}, model='mz', options={}, seed=0)
    path = store.put(labelled, QUICK_CONFIG, dict(model='mz'))
    assert os.path.basename(path).startswith('1--mz--seed0-')
    assert store.get(dict(labelled, target=1.0, seed=0.0), QUICK_CONFIG) == dict(model='mz')


def test_a_store_keeps_numpy_labels_as_numbers_and_refuses_what_json_cannot_hold(tmp_path):
    # np.int64(2) was kept as the text '2' (a resumed record's n + 1 raised a TypeError), and
    # the label np.int64(3) named the file of the label '3'
    import numpy as np
    from torch_mz.study import RunStore
    store = RunStore(str(tmp_path))
    key = dict(n=np.int64(2), frac=np.float32(0.5), sizes=np.arange(2), ok=np.bool_(True),
               data={}, model='mz', options=dict(dim=np.int32(8)), seed=np.int64(0))
    path = store.put(key, QUICK_CONFIG, dict(model='mz', n=np.int64(2), frac=np.float32(0.5)))
    record = store.get(key, QUICK_CONFIG)
    assert record == dict(model='mz', n=2, frac=0.5)
    assert type(record['n']) is int and type(record['frac']) is float
    plain = dict(n=2, frac=0.5, sizes=[0, 1], ok=True, data={}, model='mz',
                 options=dict(dim=8), seed=0)
    assert store.get(plain, QUICK_CONFIG) == record  # the same run, the same file
    assert store._path(plain) == path
    assert store._path(dict(plain, n='2')) != path  # a text is another label
    with pytest.raises(TypeError, match="holds <object object .*cannot keep"):
        store.get(dict(plain, n=object()), QUICK_CONFIG)
    # plain values name the files they named before (a resumed study finds its runs)
    key = dict(cell='L=16', data=dict(task='quadratic-tdof', kwargs=dict(
        d=32, tdof=16, n_train=640, set_size=(2, 3))), model='mz:dim=64',
        options=dict(dim=64, dropout=0.0), seed=2)
    assert os.path.basename(store._path(key)) == 'L=16--mz_dim=64--seed2-d9831db385.json'
    key = dict(target='mu', data=dict(source='qm9pack', root=None, n_train=2000), model='mz',
               options={}, seed=0)
    assert os.path.basename(store._path(key)) == 'mu--mz--seed0-5af6075f35.json'


def test_a_store_reads_back_runs_of_other_loader_workers_and_of_earlier_stores(tmp_path):
    # num_workers left the resumable configuration changes (loader workers change the random
    # streams of a resumed checkpoint), which made it part of a stored run's identity: a store
    # written before read back as empty, and every finished run was trained again
    import dataclasses
    import json
    from torch_mz.study import RunStore
    store = RunStore(str(tmp_path))
    key = dict(cell='a', model='mz', seed=0, data=dict(task='max'))
    path = store.put(key, QUICK_CONFIG, dict(model='mz'))
    workers = dataclasses.replace(QUICK_CONFIG, num_workers=2)
    assert store.get(key, workers) == dict(model='mz')
    with open(path) as f:
        stored = json.load(f)
    assert 'num_workers' not in stored['identity']['config']


def test_a_store_reads_back_a_run_file_whose_identity_holds_num_workers(tmp_path):
    # files written while num_workers counted toward a run's identity (earlier on 2026-12-06)
    # were read back as no run, and every finished run was trained again
    import json
    from torch_mz.study import RunStore
    store = RunStore(str(tmp_path))
    key = dict(cell='a', model='mz', seed=0, data=dict(task='max'))
    path = store.put(key, QUICK_CONFIG, dict(model='mz'))
    with open(path) as f:
        stored = json.load(f)
    stored['identity']['config']['num_workers'] = 0
    with open(path, 'w') as f:
        json.dump(stored, f)
    assert store.get(key, QUICK_CONFIG) == dict(model='mz')


def test_a_store_reads_back_a_run_whatever_the_settings_its_docstring_names(tmp_path):
    # RunStore's docstring named the device, progress bars and checkpoint folders as the
    # settings that do not identify a run: how often checkpoints are written, resume,
    # overwrite, the evaluation batch size and the loader workers do not either
    from dataclasses import replace
    from torch_mz.study import RunStore
    store = RunStore(str(tmp_path))
    key = dict(cell='a', model='mz', seed=0)
    store.put(key, QUICK_CONFIG, dict(model='mz', test=dict(r2=0.5)))
    doc = ' '.join(RunStore.__doc__.split())
    for name, value in (('device', 'cpu'), ('progress', True), ('out_dir', str(tmp_path)),
                        ('checkpoint_every', 3), ('resume', 'x.pt'), ('overwrite', True),
                        ('eval_batch_size', 5), ('num_workers', 2)):
        assert store.get(key, replace(QUICK_CONFIG, **{name: value})) is not None, name
        assert f'``{name}``' in doc, name
    for name, value in (('lr', 1.0), ('deterministic', True), ('batch_size', 4)):
        assert store.get(key, replace(QUICK_CONFIG, **{name: value})) is None, name
        assert f'``{name}``' not in doc, name


def test_a_store_keeps_a_path_in_a_key_as_its_text(tmp_path):
    # NumPy values became numbers, every other value was refused: a data root given as a
    # pathlib.Path (kept as its text before) stopped a study
    import pathlib
    from torch_mz.study import RunStore
    store = RunStore(str(tmp_path))
    key = dict(cell='a', model='mz', seed=0, data=dict(root=pathlib.Path('/tmp/data')))
    store.put(key, QUICK_CONFIG, dict(model='mz', root=pathlib.Path('/tmp/data')))
    assert store.get(key, QUICK_CONFIG) == dict(model='mz', root='/tmp/data')
    assert store.get(dict(key, data=dict(root='/tmp/data')), QUICK_CONFIG) is not None


def test_the_interrupted_note_gives_the_command_that_goes_on(monkeypatch):
    # the studies ended Ctrl-C in a traceback; the line they print instead gives the command
    import argparse
    import shlex
    import sys

    from torch_mz.study import EXIT_INTERRUPTED, add_resume_argument, interrupted_note
    assert EXIT_INTERRUPTED == 130
    parser = argparse.ArgumentParser()
    parser.add_argument('--out')
    parser.add_argument('--rest')  # ('--res' names two options: not read as --resume)
    add_resume_argument(parser)
    script = os.path.join('benchmarks', 'study.py')
    python = os.path.basename(sys.executable)

    def command(argv, kept='out/runs'):
        note = interrupted_note(script, argv, parser, kept)
        assert '\n' not in note and note.startswith('study.py: interrupted')
        return shlex.split(note.split(': ')[-1])

    assert command(['--out', 'a b']) == [python, script, '--out', 'a b', '--resume']
    # the runs finished are this call's: --overwrite would remove them (written out or not)
    for overwrite in ('--overwrite', '--overw', '--ov'):
        assert command([overwrite, '--out', 'x']) == [python, script, '--out', 'x', '--resume']
    for resume in ('--resume', '--resu'):  # given: the same command
        assert command(['--out=x', resume]) == [python, script, '--out=x', resume]
    assert command(['--rest', '1']) == [python, script, '--rest', '1', '--resume']
    # nothing kept yet (the data being read, the runs of an earlier call not yet removed): the
    # same command again
    note = interrupted_note(script, ['--overwrite'], parser, None)
    assert note == (f'study.py: interrupted before it kept any of its runs; to start again: '
                    f'{python} {script} --overwrite')
    assert 'kept in out/runs (the one in progress' in interrupted_note(script, [], parser,
                                                                      'out/runs')
    with pytest.raises(ValueError, match='expected a parser with a --resume option'):
        interrupted_note(script, [], argparse.ArgumentParser(), 'out/runs')


def test_interruptible_catches_ctrl_c_with_the_note_of_what_is_kept_by_then():
    # the studies' try / except KeyboardInterrupt around their runs, in one place
    import argparse
    import sys

    from torch_mz.study import add_resume_argument, interruptible, interrupted_note
    parser = argparse.ArgumentParser()
    add_resume_argument(parser)
    script = os.path.join('benchmarks', 'study.py')
    python = os.path.basename(sys.executable)
    with interruptible(script, [], parser) as stop:
        pass
    assert stop.note is None  # (not interrupted)
    with interruptible(script, ['--overwrite'], parser) as stop:
        raise KeyboardInterrupt  # (while the data is read: nothing kept)
    assert stop.note == interrupted_note(script, ['--overwrite'], parser, None)
    with interruptible(script, ['--overwrite'], parser) as stop:
        stop.kept = 'out/runs'  # (the store made)
        raise KeyboardInterrupt
    assert stop.note == interrupted_note(script, ['--overwrite'], parser, 'out/runs')
    assert stop.note.endswith(f'(the one in progress starts again); to go on: {python} '
                              f'{script} --resume')
    with interruptible(script, [], parser, 'out/runs') as stop:
        stop.all_kept()  # (the runs done: the report is being written)
        raise KeyboardInterrupt
    assert stop.note == (f'study.py: interrupted while it wrote its report; all its runs are '
                         f'kept in out/runs (none is done again); to write the report: '
                         f'{python} {script} --resume')
    with pytest.raises(RuntimeError), interruptible(script, [], parser, 'out/runs'):
        raise RuntimeError  # (anything but Ctrl-C goes through)
    with pytest.raises(ValueError, match='expected where the study keeps'):
        with interruptible(script, [], parser) as stop:
            stop.all_kept()  # (nothing kept: nothing for --resume to read back)
    ran = []
    with pytest.raises(ValueError, match='expected a parser with a --resume option'):
        with interruptible(script, [], argparse.ArgumentParser()):
            ran.append(1)
    assert ran == []  # (refused before the block, not at the Ctrl-C)


def test_a_run_with_a_nan_figure_is_kept_as_standard_json_and_read_back_as_nan(tmp_path):
    # write_json wrote the bare word NaN (refused by jq and JSON.parse); now null, which the
    # store reads back as the NaN a fresh run's record holds (the tables of a resumed study
    # are those of the fresh one: a null had been a None, or a TypeError in np.mean)
    import json
    import math
    from torch_mz.study import RunStore
    store = RunStore(str(tmp_path))
    key = dict(cell='a', model='mz', seed=0, data=dict(task='max'))
    record = dict(model='mz', best_epoch=None, val=dict(loss=0.5, r2=math.nan),
                  test=dict(loss=math.inf, r2=math.nan, mse=0.25))
    path = store.put(key, QUICK_CONFIG, record)

    def refuse(word):
        raise ValueError(f'not standard JSON: {word}')
    with open(path) as f:
        stored = json.loads(f.read(), parse_constant=refuse)
    assert stored['record']['test'] == dict(loss=None, r2=None, mse=0.25)
    got = store.get(key, QUICK_CONFIG)
    assert got['best_epoch'] is None and got['val']['loss'] == 0.5 and got['test']['mse'] == 0.25
    assert all(math.isnan(v) for v in (got['val']['r2'], got['test']['r2'], got['test']['loss']))


def test_a_run_whose_key_holds_a_non_finite_value_is_found_again(tmp_path):
    # the identity kept in the file was written as standard JSON (inf as null) and compared
    # with the one asked for (inf): the run was trained again on every resume
    import math
    from torch_mz.study import RunStore
    store = RunStore(str(tmp_path))
    key = dict(cell='a', model='mz', seed=0, data=dict(task='max', noise=math.inf))
    store.put(key, QUICK_CONFIG, dict(model='mz', val=dict(loss=0.5), test=dict(r2=0.9)))
    got = store.get(key, QUICK_CONFIG)
    assert got is not None and got['test'] == dict(r2=0.9)
    other = dict(key, data=dict(task='max', noise=-math.inf))  # (another run: another file)
    assert store._path(other) != store._path(key) and store.get(other, QUICK_CONFIG) is None


def test_a_run_is_read_back_with_its_keys_in_the_order_it_was_kept(tmp_path):
    # the record was written with its keys sorted: a resumed study listed its layers
    # (what_mz_learns.py: decoders before encoders), methods (uncertainty.py) and metrics in
    # another order than the fresh run's, and its per-layer table and plot changed
    from torch_mz.study import RunStore
    store = RunStore(str(tmp_path))
    key = dict(cell='a', model='mz', seed=0, data=dict(task='max'))
    record = dict(study_seed=0, layers={'encoders.0': dict(rank=2, gate=1), 'decoders.0': {}},
                  test=dict(loss=0.5, mse=0.5, mae=0.25, r2=0.75))
    store.put(key, QUICK_CONFIG, record)
    got = store.get(key, QUICK_CONFIG)
    assert got == record and list(got) == list(record)
    assert list(got['layers']) == ['encoders.0', 'decoders.0']
    assert list(got['layers']['encoders.0']) == ['rank', 'gate']
    assert list(got['test']) == ['loss', 'mse', 'mae', 'r2']
