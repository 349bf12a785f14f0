import math
from dataclasses import replace

import pytest

from torch_mz.study.grid import run_grid, train_models, train_one
from torch_mz.tasks import load_task
from torch_mz.train import TrainConfig


def test_train_one_records_task_and_model_in_checkpoints(tmp_path):
    import torch
    task = load_task('max', n_train=8, n_val=4, n_test=4, d=2, set_size=(2, 3))
    config = TrainConfig(epochs=1, warmup_epochs=0, batch_size=8, progress=False,
                         out_dir=str(tmp_path))
    train_one(task, 'deepsets', 0, config, hidden_channels=8)
    state = torch.load(tmp_path / 'checkpoint.pt', weights_only=True)
    assert state['run_info'] == {'task': {'name': 'max', 'args': {'d': 2, 'set_size': [2, 3]},
                                          'split': {'seed': 0, 'n_train': 8, 'n_val': 4,
                                                    'n_test': 4}},
                                 'model': {'name': 'deepsets', 'args': {'hidden_channels': 8},
                                           'in_channels': 2, 'out_channels': 2, 'pos_dim': 2,
                                           'feature_columns': None}}


def test_run_grid_shares_data_and_seeds():
    loads = []

    def load(name, seed, **kwargs):
        loads.append((name, seed))
        return load_task(name, seed=seed, **kwargs)

    cells = [dict(label='sum d=2', task='sum', kwargs=dict(d=2, reduce='sum', n_train=16,
                                                         n_val=4, n_test=8)),
             dict(label='max d=3', task='max', kwargs=dict(d=3, reduce='mean', n_train=16,
                                                         n_val=4, n_test=8))]
    config = TrainConfig(epochs=1, warmup_epochs=1, batch_size=8, lr=1e-3, progress=False)
    seen = []
    runs, rows = run_grid(cells, ['deepsets', 'deepsets:hidden_channels=8'], 2, config,
                          load=load, on_result=seen.append)
    assert loads == [('sum', 0), ('max', 0)]  # each cell's data built once, from seed 0
    assert config.seed == 0  # the caller's config is not modified
    assert len(runs) == len(seen) == 2 * 2 * 2
    assert [r['seed'] for r in runs[:2]] == [0, 1]
    assert [row['cell'] for row in rows] == ['sum d=2', 'max d=3']
    small = rows[0]['deepsets:hidden_channels=8 params']
    assert small < rows[0]['deepsets params']
    for row in rows:
        for model in ('deepsets', 'deepsets:hidden_channels=8'):
            r2 = [r['test']['r2'] for r in runs
                  if r['cell'] == row['cell'] and r['model'] == model]
            assert row[f'{model} r2'] == pytest.approx(sum(r2) / 2)
            assert math.isfinite(row[f'{model} r2 std'])
    # Same seed, same data, same model: same result; another seed: another result (the seed
    # reaches the trainer).
    again, _ = run_grid(cells[:1], ['deepsets'], 1, config)
    assert again[0]['test']['r2'] == pytest.approx(runs[0]['test']['r2'])
    assert runs[0]['test']['r2'] != pytest.approx(runs[1]['test']['r2'])


def test_a_grid_row_holds_the_columns_its_docstring_names():
    # run_grid's docstring promised the standard deviation over seeds of the test R² and MSE:
    # a row holds that of the R² alone (the population one), and the parameter count's column
    import numpy as np
    cells = [dict(label='c', task='max', kwargs=dict(d=2, n_train=8, n_val=4, n_test=4,
                                                     set_size=(2, 3)))]
    config = TrainConfig(epochs=1, warmup_epochs=0, batch_size=8, progress=False)
    runs, rows = run_grid(cells, ['deepsets:hidden_channels=4,num_layers=1'], 2, config)
    m = 'deepsets:hidden_channels=4,num_layers=1'
    assert set(rows[0]) == {'cell', f'{m} r2', f'{m} r2 std', f'{m} mse', f'{m} params'}
    assert rows[0][f'{m} r2 std'] == pytest.approx(np.std([r['test']['r2'] for r in runs]))
    doc = ' '.join(run_grid.__doc__.split())
    assert 'standard deviation over seeds of the test R² and MSE' not in doc
    assert "population standard deviation (``'<model> r2'``, ``'<model> r2 std'``)" in doc
    assert "(``'<model> params'``)" in doc


def test_run_grid_config_per_run_and_cached_runs_build_no_data():
    loads = []

    def load(name, seed, **kwargs):
        loads.append(name)
        return load_task(name, seed=seed, **kwargs)

    cell = dict(label='sum d=2', task='sum', kwargs=dict(d=2, reduce='sum', n_train=16, n_val=4,
                                                        n_test=8))
    config = TrainConfig(epochs=1, warmup_epochs=1, batch_size=8, lr=1e-3, progress=False)
    asked = []

    def config_for(c, spec, seed):
        return replace(config, seed=seed, lr=1e-2 if spec == 'deepsets' else 1e-3)

    def cached(c, spec, seed, run_config):
        asked.append((c['label'], spec, seed, run_config.lr))
        return store.get((spec, seed))

    store = {}
    runs, _ = run_grid([cell], ['deepsets', 'mean-mlp'], 2, config, load=load,
                       config_for=config_for, cached=cached,
                       on_result=lambda r: store.setdefault((r['model'], r['seed']), r))
    assert loads == ['sum']
    assert asked == [('sum d=2', 'deepsets', 0, 1e-2), ('sum d=2', 'deepsets', 1, 1e-2),
                     ('sum d=2', 'mean-mlp', 0, 1e-3), ('sum d=2', 'mean-mlp', 1, 1e-3)]
    # every run cached: nothing is trained and the data is never built
    again, rows = run_grid([cell], ['deepsets', 'mean-mlp'], 2, config, load=load,
                           config_for=config_for, cached=cached)
    assert loads == ['sum'] and again == runs
    assert rows[0]['mean-mlp r2'] == pytest.approx((runs[2]['test']['r2']
                                                    + runs[3]['test']['r2']) / 2)


def test_run_grid_overrides_apply_to_every_spec():
    task = load_task('sum', n_train=8, n_val=4, n_test=4, d=2, set_size=(2, 3))
    config = TrainConfig(epochs=1, warmup_epochs=0, batch_size=8, progress=False)
    runs, _ = run_grid([dict(label='sum', task='sum')], ['deepsets', 'deepsets:hidden_channels=4'],
                       1, config, load=lambda name, seed: task, overrides={'hidden_channels': 8})
    # --model-arg style: the override wins over the spec's own option
    assert runs[0]['params'] == runs[1]['params']
    assert [r['model'] for r in runs] == ['deepsets', 'deepsets:hidden_channels=4']


def test_train_models_on_a_built_task_or_a_builder():
    task = load_task('sum', n_train=8, n_val=4, n_test=4, d=2, set_size=(2, 3))
    config = TrainConfig(epochs=1, warmup_epochs=0, batch_size=8, progress=False)
    seen = []
    runs = train_models(task, ['deepsets', 'mean-mlp'], 2, lambda spec, seed: replace(
        config, seed=seed), on_result=seen.append, dataset='sum')
    assert [(r['model'], r['seed'], r['dataset']) for r in runs] == [
        ('deepsets', 0, 'sum'), ('deepsets', 1, 'sum'), ('mean-mlp', 0, 'sum'),
        ('mean-mlp', 1, 'sum')]
    assert seen == runs
    # a builder is called once, and not at all when every run is cached
    built = []

    def build():
        built.append(1)
        return task
    store = {(r['model'], r['seed']): r for r in runs}
    again = train_models(build, ['deepsets', 'mean-mlp'], 2, lambda spec, seed: config,
                         cached=lambda spec, seed, c: store[(spec, seed)])
    assert again == runs and built == []
    train_models(build, ['deepsets'], 2, lambda spec, seed: config)
    assert built == [1]


def test_run_grid_needs_a_config():
    cell = dict(label='sum d=2', task='sum', kwargs=dict(d=2, reduce='sum', n_train=16, n_val=4,
                                                        n_test=8))
    with pytest.raises(ValueError, match="'config' or 'config_for'"):
        run_grid([cell], ['rigid'], 1, None)


SMALL = dict(n_train=16, n_val=4, n_test=8)
QUICK_CONFIG = TrainConfig(epochs=1, warmup_epochs=1, batch_size=8, lr=1e-3, progress=False)


@pytest.mark.parametrize('cells, models, message', [
    # the mistake is in the last cell: nothing may train before it is found
    ([dict(label='a', task='max', kwargs=dict(d=2, **SMALL)),
      dict(label='b', task='quadratic-tdof', kwargs=dict(d=4, tdof=8, **SMALL))],
     ['deepsets'], "'tdof'"),
    ([dict(label='a', task='max', kwargs=dict(d=2, **SMALL)),
      dict(label='b', task='max', kwargs=dict(d=2, colour=3, **SMALL))],
     ['deepsets'], "no option 'colour'"),
    ([dict(label='a', task='max', kwargs=dict(d=2, **SMALL)),
      dict(label='b', task='nope', kwargs={})], ['deepsets'], "Unknown task 'nope'"),
    ([dict(label='a', task='max', kwargs=dict(d=2, **SMALL))], ['deepsets', 'mz-foo'],
     "unknown model 'mz-foo'"),
    ([dict(label='a', task='max', kwargs=dict(d=2, **SMALL))], ['deepsets', 'deepsets'],
     "given twice"),
    ([dict(label='a', task='max', kwargs=dict(d=2, **SMALL))],
     ['deepsets', 'deepsets:hidden_channels=x'], "hidden_channels"),
    ([dict(label='a', task='max', kwargs=dict(d=2, n_train=-3, n_val=4, n_test=8))],
     ['deepsets'], "'n_train' must be an integer >= 0"),
    # a real task's mistake that load_task finds before reading a file (found only when the
    # cell was loaded, after the cells before it trained)
    ([dict(label='a', task='max', kwargs=dict(d=2, **SMALL)),
      dict(label='b', task='qm9', kwargs=dict(n_train=100))],
     ['deepsets'], 'QM9 with split sizes but no n_val'),
])
def test_run_grid_refuses_a_mistake_before_training_anything(cells, models, message,
                                                             monkeypatch):
    import torch_mz.study.grid as grid
    trained = []
    monkeypatch.setattr(grid, 'train_one', lambda *a, **k: trained.append(a) or {})
    with pytest.raises(ValueError, match=message):
        run_grid(cells, models, 1, QUICK_CONFIG)
    assert trained == []


def test_train_models_refuses_a_repeated_spec_before_building_data():
    built = []
    with pytest.raises(ValueError, match="'deepsets' is given twice"):
        train_models(lambda: built.append(1), ['deepsets', 'mz', 'deepsets'], 1,
                     lambda spec, seed: QUICK_CONFIG)
    assert built == []


def test_an_interrupted_grid_resumes_from_its_store(tmp_path, monkeypatch):
    from torch_mz.study import RunStore
    import torch_mz.study.grid as grid
    cells = [dict(label='max d=2', task='max', kwargs=dict(d=2, **SMALL)),
             dict(label='sum d=2', task='sum', kwargs=dict(d=2, **SMALL))]
    models = ['deepsets', 'deepsets:hidden_channels=8']
    store = RunStore(str(tmp_path / 'runs'))
    real_train_one = grid.train_one
    calls = []
    stop_at = [5]

    def train_one(task, name, seed, config, **options):
        if len(calls) == stop_at[0]:
            raise KeyboardInterrupt  # stopped while training the sixth run
        calls.append((task.name, name, seed, options))
        return real_train_one(task, name, seed, config, **options)

    monkeypatch.setattr(grid, 'train_one', train_one)
    with pytest.raises(KeyboardInterrupt):
        run_grid(cells, models, 2, QUICK_CONFIG, store=store)
    assert len(list((tmp_path / 'runs').iterdir())) == 5  # each finished run kept at once
    first = list(calls)
    stop_at[0] = None
    runs, rows = run_grid(cells, models, 2, QUICK_CONFIG, store=store)
    assert len(calls) == 5 + 3  # only the three runs that had not finished trained again
    assert calls[:5] == first
    monkeypatch.setattr(grid, 'train_one', real_train_one)
    fresh, fresh_rows = run_grid(cells, models, 2, QUICK_CONFIG)
    # the resumed table is the table of an uninterrupted run (training is deterministic)
    for resumed, whole in zip(runs, fresh):
        assert (resumed['cell'], resumed['model'], resumed['seed']) == (
            whole['cell'], whole['model'], whole['seed'])
        assert resumed['test']['r2'] == pytest.approx(whole['test']['r2'], abs=1e-6)
    assert rows[1]['deepsets r2'] == pytest.approx(fresh_rows[1]['deepsets r2'], abs=1e-6)
    # another configuration, other data or another seed count never read a stored run
    calls.clear()
    monkeypatch.setattr(grid, 'train_one', train_one)
    run_grid(cells[:1], models[:1], 1, replace(QUICK_CONFIG, lr=2e-3), store=store)
    more = dict(cells[0], kwargs=dict(cells[0]['kwargs'], n_train=12))
    run_grid([more], models[:1], 1, QUICK_CONFIG, store=store)
    assert len(calls) == 2
    # settings that change no result (progress bars, device) do not retrain (the lr=2e-3 run
    # replaced the stored one: a store keeps the latest run of each cell, model and seed)
    run_grid(cells[:1], models[:1], 1,
             replace(QUICK_CONFIG, lr=2e-3, progress=True, device='cpu'), store=store)
    assert len(calls) == 2


def test_check_models_reads_specs_not_strings():
    from torch_mz.study import check_models
    for models in (['mz', 'mz:'], ['deepsets:hidden_channels=8,dropout=0.1',
                                   'deepsets:dropout=0.1,hidden_channels=8']):
        with pytest.raises(ValueError, match='given twice'):
            check_models(models)
    check_models(['deepsets', 'deepsets:hidden_channels=8'])  # two models


def test_check_models_compares_options_by_value_over_the_presets_defaults():
    # 'mz-slim:dropout=0' and 'mz-slim:dropout=0.0' (one value) or 'deepsets' and
    # 'deepsets:pool=sum' (the preset's default) trained one model twice, two identical rows
    from torch_mz.study import check_models
    for models in (['mz-slim:dropout=0', 'mz-slim:dropout=0.0'],
                   ['deepsets:hidden_channels=8', 'deepsets:hidden_channels=8.0'],
                   ['deepsets', 'deepsets:pool=sum'],
                   ['deepsets:hidden_channels=8', 'deepsets:hidden_channels=8,pool=sum'],
                   ['mz', 'mz:dropout=0.1,dim=64']):
        with pytest.raises(ValueError, match='given twice'):
            check_models(models)
    check_models(['deepsets', 'deepsets:pool=mean', 'mz-slim:dropout=0',
                  'mz-slim:dropout=0.01'])
    from torch_mz.study.grid import model_key
    assert model_key('egnn-qm9', {'edge_gate': True}) != model_key('egnn-qm9',
                                                                   {'edge_gate': 1})


def test_a_matched_width_and_the_listed_width_are_two_models():
    # hypernet and perceiver match their width to mz's parameter count unless a width is given;
    # their presets list dim=64 too, so 'hypernet' and 'hypernet:dim=64' (327,392 and 409,104
    # parameters) were refused as one model
    from torch_mz.study import check_models
    from torch_mz.study.grid import model_key
    for name in ('hypernet', 'perceiver'):
        assert model_key(name, {}) != model_key(name, {'dim': 64})
        assert model_key(name, {}) == model_key(name, {'match': 'mz'})
        assert model_key(name, {'dim': 64}) == model_key(name, {'dim': 64, 'match': None})
    check_models(['hypernet', 'hypernet:dim=64'])
    with pytest.raises(ValueError, match='given twice'):
        check_models(['hypernet:dim=64', 'hypernet:dim=64.0'])


def test_check_grid_names_the_cell_it_refuses():
    from torch_mz.study import check_grid
    cells = [dict(label='MEB d=8', task='meb-radius', kwargs=dict(d=8)),
             dict(label='rot d=1', task='rotation-matching', kwargs=dict(d=1))]
    with pytest.raises(ValueError, match=r"cell 'rot d=1' \(task 'rotation-matching'\): 'd'"):
        check_grid(cells, ['deepsets'])


def test_a_diverged_run_is_recorded_and_the_grid_goes_on(tmp_path):
    # one diverging run ended the whole study, and --resume trained it again into the same
    # divergence: the study could never finish. It is recorded with NaN figures, stored, and
    # the other runs go on; train_models alone (torch-mz compare) still raises
    from torch_mz.study import RunStore
    from torch_mz.train import TrainingDiverged
    cells = [dict(label='sum', task='sum', kwargs=dict(d=2, reduce='sum', n_train=16, n_val=4,
                                                       n_test=8))]
    config = TrainConfig(epochs=2, warmup_epochs=0, batch_size=8, lr=1e-3, progress=False)

    def config_for(cell, spec, seed):  # the wide model at a rate that diverges
        return replace(config, seed=seed, lr=1e30 if spec == 'deepsets' else 1e-3,
                       grad_clip=None)

    store = RunStore(str(tmp_path / 'runs'))
    with pytest.raises(TrainingDiverged):  # (the default: the reproduction runner's own way)
        run_grid(cells, ['deepsets'], 1, None, config_for=config_for)
    with pytest.warns(UserWarning, match='deepsets seed 0 diverged'):
        runs, rows = run_grid(cells, ['deepsets', 'mean-mlp'], 2, None, config_for=config_for,
                              store=store, record_diverged=True)
    diverged, _, fine, _ = runs
    assert 'diverged' in diverged and math.isnan(diverged['test']['r2'])
    assert math.isnan(rows[0]['deepsets r2']) and math.isfinite(rows[0]['mean-mlp r2'])
    assert (rows[0]['deepsets diverged'], rows[0]['mean-mlp diverged']) == (2, 0)
    assert math.isfinite(fine['test']['r2'])
    again, _ = run_grid(cells, ['deepsets', 'mean-mlp'], 2, None, config_for=config_for,
                        store=store, record_diverged=True)  # read back, not trained again
    assert again[0]['diverged'] == diverged['diverged']

    def one_diverges(cell, spec, seed):  # one seed of two: the mean is the other's
        return replace(config_for(cell, 'mean-mlp', seed), lr=1e30 if seed == 1 else 1e-3)

    with pytest.warns(UserWarning, match='seed 1 diverged'):
        runs, rows = run_grid(cells, ['deepsets'], 2, None, config_for=one_diverges,
                              record_diverged=True)
    assert rows[0]['deepsets diverged'] == 1
    assert rows[0]['deepsets r2'] == pytest.approx(runs[0]['test']['r2'])
    assert rows[0]['deepsets r2 std'] == 0.0
    task = load_task('sum', d=2, reduce='sum', n_train=16, n_val=4, n_test=8)
    with pytest.raises(TrainingDiverged):
        train_models(task, ['deepsets'], 1, lambda spec, seed: config_for(None, spec, seed))


def test_two_cells_labelled_alike_are_refused_before_anything_is_built():
    # 1 and '1' (or 'A' twice) were accepted, and plot_grid, keying by str(label), drew one
    from torch_mz.study import check_grid

    def load(*args, **kwargs):
        raise AssertionError('no data is built for a grid refused')

    kwargs = dict(n_train=8, n_val=4, n_test=4)
    config = TrainConfig(epochs=1, warmup_epochs=0, batch_size=8, progress=False)
    # (1 and 1.0, True and 1: equal values, which summarize keys alike, though they read apart)
    for labels, said in (((1, '1'), "1 and '1'"), (('A', 'A'), "'A'"), ((1, 1.0), '1 and 1.0'),
                         ((True, 1), 'True and 1')):
        cells = [dict(label=labels[0], task='meb-radius', kwargs=kwargs),
                 dict(label=labels[1], task='mst', kwargs=kwargs)]
        with pytest.raises(ValueError, match=f'two cells are labelled {said}:'):
            check_grid(cells, ['deepsets'])
        for check in (True, False):
            with pytest.raises(ValueError, match=f'two cells are labelled {said}:'):
                run_grid(cells, ['deepsets'], 1, config, load=load, check=check)


def test_train_models_refuses_fewer_than_one_seed():
    # seeds=0 or -3 returned no runs (and an empty summary) without a word
    def task():
        raise AssertionError('no data is built for a call refused')

    for seeds in (0, -3):
        with pytest.raises(ValueError, match="'seeds' must be an integer >= 1"):
            train_models(task, ['deepsets'], seeds, lambda spec, seed: None)


def test_a_misspelt_model_option_is_refused_before_any_data_is_built():
    # check_models(['mz:dimm=3']) passed: the TypeError came after the data was built and the
    # models before it trained
    from torch_mz.study import check_models
    with pytest.raises(ValueError, match="'mz:dimm=3': .*unexpected keyword argument 'dimm'"):
        check_models(['mz:dimm=3'])
    with pytest.raises(ValueError, match="'deepsets': .*'hiden'"):
        check_models(['deepsets', 'mz:dim=8'], overrides=dict(hiden=3))

    def task():
        raise AssertionError('no data is built for a spec refused')

    with pytest.raises(ValueError, match="'mz:dimm=3'"):
        train_models(task, ['deepsets:hidden_channels=8', 'mz:dimm=3'], 1,
                     lambda spec, seed: None)
    with pytest.raises(ValueError, match="'mz:dimm=3'"):
        run_grid([dict(label='a', task='meb-radius')], ['mz:dimm=3'], 1, None, load=task)
    check_models(['mz:dim=8,heads=2', 'deepsets:hidden_channels=8', 'egnn:hidden_channels=8'])


def test_a_diverged_run_read_back_raises_in_a_call_that_does_not_record_them(tmp_path):
    # runs kept by a call with record_diverged=True were read back by one without it: no
    # TrainingDiverged (a fresh call raises), no 'diverged' column, just NaN
    from torch_mz.study import RunStore
    from torch_mz.train import TrainingDiverged
    config = TrainConfig(epochs=2, warmup_epochs=0, batch_size=8, progress=False)
    store = RunStore(str(tmp_path))
    data = dict(task='sum')
    text = 'Validation loss is nan in epoch 1; the weights overflowed'
    for seed in (0, 1):
        store.put(dict(data=data, model='deepsets', options={}, seed=seed), config,
                  dict(model='deepsets', seed=seed, params=None, epochs_run=2, diverged=text,
                       wall_time_s=1.0, val={}, test=dict(r2=math.nan)))

    def task():
        raise AssertionError('no data is built: every run is in the store')

    runs = train_models(task, ['deepsets'], 2, lambda spec, seed: config, store=store,
                        data=data, record_diverged=True)
    assert [r['diverged'] for r in runs] == [text, text]
    seen = []
    with pytest.raises(TrainingDiverged, match='epoch 1.*deepsets seed 0.*record_diverged') as e:
        train_models(task, ['deepsets'], 2, lambda spec, seed: config, store=store, data=data,
                     on_result=seen.append)
    assert (e.value.epoch, e.value.split, seen) == (1, 'validation', [])


def _store_with_a_run_under(tmp_path, old):
    r"""A run store holding one finished ``deepsets`` run kept under the data :obj:`old`, and
    the training config it was kept under."""
    from torch_mz.study import RunStore
    config = TrainConfig(epochs=2, warmup_epochs=0, batch_size=8, progress=False)
    store = RunStore(str(tmp_path))
    record = dict(model='deepsets', seed=0, params=1, epochs_run=2, wall_time_s=1.0,
                  val=dict(loss=0.5), test=dict(r2=0.25))
    store.put(dict(data=old, model='deepsets', options={}, seed=0), config, record)
    return store, config


def test_runs_kept_under_an_earlier_data_description_are_read_back(tmp_path):
    # a script that names its data anew (a data root resolved, where it was kept as given)
    # reads the runs kept under the earlier description, and only under the one it gives
    old, new = dict(task='sum', root=None), dict(task='sum', root='/data/sum')
    store, config = _store_with_a_run_under(tmp_path, old)

    def task():
        raise AssertionError('trained: the run kept under the earlier description was not read')

    with pytest.raises(AssertionError, match='trained'):  # no earlier description: not read
        train_models(task, ['deepsets'], 1, lambda spec, seed: config, store=store, data=new)
    with pytest.raises(AssertionError, match='trained'):  # another one: not read either
        train_models(task, ['deepsets'], 1, lambda spec, seed: config, store=store, data=new,
                     legacy_data=dict(old, root='elsewhere'))
    (run, ) = train_models(task, ['deepsets'], 1, lambda spec, seed: config, store=store,
                           data=new, legacy_data=old)
    assert run['test'] == dict(r2=0.25)


def test_a_run_read_under_an_earlier_data_description_is_kept_under_the_new_one(tmp_path):
    # read under the earlier description at every call, a run kept under a root that named its
    # environment's folder (no --root: the default root, which $TORCH_MZ_DATA sets) was read
    # as the data of every later environment; now the first read keeps it under the new one
    old, new = dict(task='sum', root=None), dict(task='sum', root='/data/a/sum')
    store, config = _store_with_a_run_under(tmp_path, old)

    def task():
        raise AssertionError('trained')

    def runs(data):
        return train_models(task, ['deepsets'], 1, lambda spec, seed: config, store=store,
                            data=data, legacy_data=old)
    assert runs(new)[0]['test'] == dict(r2=0.25)
    assert store.kept_runs() == 1  # (one file: the run under the new description)
    (run, ) = train_models(task, ['deepsets'], 1, lambda spec, seed: config, store=store,
                           data=new)
    assert run['test'] == dict(r2=0.25)
    with pytest.raises(AssertionError, match='trained'):  # another folder's data: trained
        runs(dict(new, root='/data/b/sum'))
