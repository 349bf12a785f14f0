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
