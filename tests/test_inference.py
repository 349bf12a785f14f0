import pytest
import torch
from torch_geometric.data import Batch

import torch_mz
from torch_mz.study import train_one
from torch_mz.inference import load_model, prediction_columns
from torch_mz.models import build_model
from torch_mz.tasks import load_task
from torch_mz.train import (CheckpointError, TrainConfig, carried_normalizer, load_checkpoint,
                            predict, save_checkpoint, train)

SMALL = dict(dim=8, num_inducing=2, d_ff=8)  # a tiny Set Transformer


def config(out_dir, **kwargs):
    return TrainConfig(**dict(dict(epochs=2, warmup_epochs=0, batch_size=16, lr=1e-3,
                                   device='cpu', progress=False, patience=None,
                                   out_dir=str(out_dir)), **kwargs))


@pytest.fixture(scope='module')
def task():
    # three targets with means far from 0 (the max of 2-5 Gaussian elements per column)
    return load_task('max', n_train=32, n_val=8, n_test=8, d=3, set_size=(2, 5))


def outputs(model, dataset):
    model.eval()
    with torch.no_grad():
        return model(Batch.from_data_list(list(dataset)))


def test_checkpoint_is_self_describing(task, tmp_path):
    train_one(task, 'mz-slim', 0, config(tmp_path), **SMALL)
    for name in ('best.pt', 'checkpoint.pt'):
        raw = torch.load(tmp_path / name, weights_only=True)  # plain values only
        assert raw['torch_mz_version'] == torch_mz.__version__
        assert raw['task_type'] == 'regression'
        assert raw['run_info']['task'] == {
            'name': 'max', 'args': {'d': 3, 'set_size': [2, 5]},
            'split': {'seed': 0, 'n_train': 32, 'n_val': 8, 'n_test': 8}}
        assert raw['run_info']['model'] == {
            'name': 'mz-slim', 'args': SMALL, 'in_channels': 3, 'out_channels': 3,
            'pos_dim': 3, 'feature_columns': None}
        assert set(raw['normalizer']) == {'mean', 'std', 'relative_eps', 'float64'}


def test_load_model_predicts_like_the_trained_model_in_target_units(task, tmp_path):
    torch.manual_seed(0)
    model = build_model('mz-slim', task.in_channels, task.out_channels, **SMALL)
    result = train(model, task.train, task.val, task.test, config=config(tmp_path))
    # the functional API records the preset too: no run_info needed
    state = torch.random.get_rng_state()
    loaded = load_model(tmp_path / 'best.pt')
    assert torch.equal(torch.random.get_rng_state(), state)  # rebuilding draws nothing
    assert not loaded.training and carried_normalizer(loaded) is not None
    pred, ihw = outputs(loaded, task.test)
    ref_pred, ref_ihw = outputs(model, task.test)
    assert torch.equal(pred, ref_pred) and torch.equal(ihw, ref_ihw)
    y = torch.cat([d.y for d in task.test])
    assert torch.allclose(pred.mean(0), y.mean(0), atol=1.0)  # target units, not standardised
    assert ((pred - y) ** 2).mean().item() == pytest.approx(result.test_metrics['mse'], rel=1e-5)
    # a loaded checkpoint dict works as well as its path
    loaded2 = load_model(load_checkpoint(tmp_path / 'checkpoint.pt'))
    assert torch.equal(outputs(loaded2, task.test)[0], ref_pred)  # the last epoch was the best


def test_load_model_rebuilds_in_the_precision_the_model_was_trained_in(task, tmp_path):
    # a model trained in float64 came back in float32: other predictions, and its own float64
    # data refused
    torch.manual_seed(0)
    model = build_model('mz-slim', task.in_channels, task.out_channels, **SMALL).double()

    def wide(split):
        return [d.clone().apply(lambda t: t.double() if t.is_floating_point() else t)
                for d in split]

    train_set, val, test = wide(task.train), wide(task.val), wide(task.test)
    train(model, train_set, val, test, config=config(tmp_path))
    loaded = load_model(tmp_path / 'best.pt')
    assert all(p.dtype == torch.float64 for p in loaded.parameters())
    torch.testing.assert_close(predict(loaded, test)[0], predict(model, test)[0], rtol=0,
                               atol=0)


def test_prediction_columns(task, tmp_path):
    train_one(task, 'mz-slim', 0, config(tmp_path), **SMALL)
    model = load_model(tmp_path / 'best.pt')
    columns = prediction_columns(model, task.test, 'regression', batch_size=3)
    assert list(columns) == ['prediction_0', 'prediction_1', 'prediction_2', 'target_0',
                             'target_1', 'target_2', 'ihw']
    assert all(len(v) == len(task.test) for v in columns.values())
    pred, ihw = predict(model, task.test, device='cpu', batch_size=3)
    assert columns['prediction_1'] == pred[:, 1].tolist()
    assert columns['target_2'] == [d.y[0, 2].item() for d in task.test]
    assert columns['ihw'] == ihw.view(-1).tolist()
    with pytest.raises(ValueError, match='task_type'):
        prediction_columns(model, task.test, 'ranking')


def test_load_test_split_and_prediction_columns_draw_bars_when_asked(task, tmp_path, capsys):
    # torch-mz predict's bars (the data's, the forward passes'): off by default, as they were
    from torch_mz.inference import load_test_split
    train_one(task, 'deepsets', 0, config(tmp_path))
    best = tmp_path / 'best.pt'
    model = load_model(best)
    capsys.readouterr()
    quiet = prediction_columns(model, load_test_split(best).test, 'regression')
    assert capsys.readouterr().err == ''
    shown = prediction_columns(model, load_test_split(best, progress=True).test, 'regression',
                               progress=True)
    err = capsys.readouterr().err
    assert 'Generating max' in err and 'predict: 100%' in err and shown == quiet
    for call in (lambda: load_test_split(best, progress='no'),
                 lambda: prediction_columns(model, task.test, 'regression', progress='no')):
        with pytest.raises(ValueError, match="'progress' must be True or False"):
            call()


def test_load_test_split_names_load_tasks_own_arguments_given_in_task_args(task, tmp_path):
    # they failed inside load_task with a TypeError ("got multiple values for ... 'seed'")
    from torch_mz.inference import load_test_split
    train_one(task, 'deepsets', 0, config(tmp_path))
    best = tmp_path / 'best.pt'
    for key, arg in (('seed', 'data_seed'), ('progress', 'progress'), ('name', 'task')):
        with pytest.raises(ValueError, match=f"task_args holds '{key}', which is no task "
                           f"option: pass it as load_test_split's {arg}="):
            load_test_split(best, task_args={key: 1})


def test_prediction_columns_of_a_bare_model_without_targets():
    from torch_geometric.data import Data
    from torch_geometric.nn import global_mean_pool

    class Mean(torch.nn.Module):  # returns a bare tensor: no ihw column
        def forward(self, batch):
            return global_mean_pool(batch.x, batch.batch)  # (B, 1)

    data = [Data(x=torch.tensor([[1.0], [3.0]])), Data(x=torch.tensor([[5.0]]))]
    assert prediction_columns(Mean(), data, 'regression') == {'prediction': [2.0, 5.0]}


def test_prediction_columns_named_by_the_targets():
    # a task that names its targets (QM9's info['targets']) names the columns by them; the
    # values and their order are those of the numbered columns
    from torch_geometric.data import Data
    from torch_geometric.nn import global_mean_pool

    class Means(torch.nn.Module):  # the mean of x and (with two) twice it
        def __init__(self, outputs=2):
            super().__init__()
            self.outputs = outputs

        def forward(self, batch):
            mean = global_mean_pool(batch.x, batch.batch)
            return torch.cat([mean, 2 * mean][:self.outputs], dim=-1)  # (B, outputs)

    data = [Data(x=torch.tensor([[1.0], [3.0]]), y=torch.tensor([[1.5, 4.0]])),
            Data(x=torch.tensor([[5.0]]), y=torch.tensor([[5.5, 9.0]]))]
    numbered = prediction_columns(Means(), data, 'regression')
    named = prediction_columns(Means(), data, 'regression', target_names=('mu', 'alpha'))
    assert list(named) == ['prediction_mu', 'prediction_alpha', 'target_mu', 'target_alpha']
    assert list(named.values()) == list(numbered.values())
    one = [Data(x=d.x, y=d.y[:, :1]) for d in data]  # one target: named too
    assert prediction_columns(Means(1), one, 'regression', target_names=['mu']) == {
        'prediction_mu': [2.0, 5.0], 'target_mu': [1.5, 5.5]}
    for names, match in ((['mu'], r'2 column\(s\), got 1 name'),
                         (['mu', 'mu'], 'distinct'), (['mu', ''], 'non-empty'),
                         ('mu', 'sequence of strings')):
        with pytest.raises(ValueError, match=match):
            prediction_columns(Means(), data, 'regression', target_names=names)
    with pytest.raises(ValueError, match='class index'):
        prediction_columns(Means(), data, 'classification', target_names=['mu', 'alpha'])


def test_classification_checkpoint(tmp_path):
    from torch_geometric.data import Data
    g = torch.Generator().manual_seed(0)
    data = [Data(x=torch.randn(4, 3, generator=g) + k, y=torch.tensor([k]))
            for k in (0, 1, 2) for _ in range(8)]
    model = build_model('rigid', 3, 3, **SMALL)
    train(model, data, data, config=config(tmp_path), task_type='classification')
    loaded = load_model(tmp_path / 'best.pt')
    assert carried_normalizer(loaded) is None  # class logits are never rescaled
    columns = prediction_columns(loaded, data, 'classification')
    assert list(columns) == ['prediction', 'target', 'ihw']  # rigid returns a (zero) width
    assert columns['target'] == [k for k in (0, 1, 2) for _ in range(8)]
    logits = outputs(loaded, data)
    logits = logits[0] if isinstance(logits, tuple) else logits
    assert columns['prediction'] == logits.argmax(-1).tolist()


def test_old_or_foreign_checkpoints(task, tmp_path):
    train_one(task, 'rigid', 0, config(tmp_path), **SMALL)
    state = load_checkpoint(tmp_path / 'best.pt')
    # as written before checkpoints recorded the model's channels: still loads into a given model
    state['run_info']['model'] = {'name': 'rigid', 'args': SMALL}
    del state['torch_mz_version']
    save_checkpoint(state, tmp_path / 'old.pt')
    with pytest.raises(CheckpointError, match='does not record how to build its model.*'
                                              'in_channels, out_channels'):
        load_model(tmp_path / 'old.pt')
    model = build_model('rigid', 3, 3, **SMALL)
    assert load_model(tmp_path / 'old.pt', model=model) is model
    reference = load_model(tmp_path / 'best.pt')
    assert torch.equal(outputs(model, task.test)[0], outputs(reference, task.test)[0])
    with pytest.raises(CheckpointError, match=r"built otherwise than the one given \(d_ff 8, "
                       r"given 128, dim 8, given 16"):
        load_model(tmp_path / 'old.pt', model=build_model('rigid', 3, 3, dim=16))
    unrecorded = build_model('rigid', 3, 3, dim=16)
    del unrecorded.build_info  # (a model that does not say how it was built: its weights tell)
    with pytest.raises(CheckpointError, match='does not fit this model'):
        load_model(tmp_path / 'old.pt', model=unrecorded)
    with pytest.raises(CheckpointError, match='does not exist'):
        load_model(tmp_path / 'missing.pt')


def test_load_model_names_an_argument_that_is_no_checkpoint():
    with pytest.raises(TypeError, match='takes the path of a checkpoint or the dict'):
        load_model(None)
    # a model's own state dict, or one wrapped by hand: it failed with a bare KeyError
    weights = build_model('deepsets', 3, 3, hidden_channels=8).state_dict()
    for given, match in ((weights, r"lacks \['model', 'task_type'\]"),
                         ({'model': weights}, r"lacks \['task_type'\]"),
                         ({'model': None, 'task_type': 'regression'}, 'holds a NoneType')):
        with pytest.raises(CheckpointError, match=match + '.*load_checkpoint'):
            load_model(given, model=build_model('deepsets', 3, 3, hidden_channels=8))


def test_a_checkpoint_load_model_refuses_leaves_the_given_model_as_it_was(task, tmp_path):
    # load_state_dict copies every entry that fits before it raises, and the model's normaliser
    # was taken off first: the refused load left a model of mixed weights in standardised units
    torch.manual_seed(0)
    train(build_model('deepsets', 3, 3, hidden_channels=8), task.train, task.val,
          config=config(tmp_path / 'run'))
    state = load_checkpoint(tmp_path / 'run' / 'best.pt')
    del state['model'][sorted(state['model'])[-1]]  # one entry lacking: the rest fits
    torch.manual_seed(1)
    model = build_model('deepsets', 3, 3, hidden_channels=8)
    train(model, task.train, task.val, config=config(tmp_path / 'own'))
    expected = predict(model, task.test)
    with pytest.raises(CheckpointError, match='(?s)does not fit this model.*Missing key'):
        load_model(state, model=model)
    assert carried_normalizer(model) is not None
    assert torch.equal(predict(model, task.test), expected)
    # a damaged normaliser is refused before the weights load (a bare KeyError after them)
    state = load_checkpoint(tmp_path / 'run' / 'best.pt')
    for damaged in ({'std': state['normalizer']['std']}, dict(state['normalizer'], mean='0'),
                    dict(state['normalizer'], std=torch.full((3,), float('nan'))),
                    # (accepted, then constant predictions or a shape error at prediction)
                    dict(state['normalizer'], std=torch.zeros(3, dtype=torch.float64)),
                    dict(state['normalizer'], mean=state['normalizer']['mean'][:2],
                         std=state['normalizer']['std'][:2])):
        with pytest.raises(CheckpointError, match='damaged target normaliser'):
            load_model(dict(state, normalizer=damaged), model=model)
        assert carried_normalizer(model) is not None
        assert torch.equal(predict(model, task.test), expected)


def test_load_weights_refuses_a_model_built_otherwise(task, tmp_path):
    # weights of the same shapes loaded into a model of another readout and predicted
    # something else; load_model(path, model=...) refused them, Trainer.load_weights did not
    from torch_mz.train import Trainer
    train_one(task, 'mz', 0, config(tmp_path, epochs=1), **SMALL)
    best = str(tmp_path / 'best.pt')
    other = build_model('mz', task.in_channels, 3, readout='signed', **SMALL)
    weights = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"built otherwise than the one given \(readout "
                       r"'ihw', given 'signed'\)"):
        Trainer(other, TrainConfig(device='cpu', progress=False)).load_weights(best)
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in weights.items())
    same = build_model('mz', task.in_channels, 3, dropout=0.3, **SMALL)  # (eval: no difference)
    Trainer(same, TrainConfig(device='cpu', progress=False)).load_weights(best)
    torch.testing.assert_close(predict(same, task.test)[0], predict(load_model(best),
                                                                      task.test)[0])


def test_load_weights_takes_the_weights_of_a_model_built_as_recorded(task, tmp_path):
    # the build check refused legitimate loads: a NumPy width that train_one recorded as the
    # text 'np.int64(8)' against the model's 8, and a Trainer's own checkpoint where its
    # caller labelled the model in run_info (the check compared the bare build record)
    import numpy as np
    from torch_mz.train import Trainer
    train_one(task, 'deepsets', 0, config(tmp_path / 'np', epochs=1),
              hidden_channels=np.int64(8))
    model = build_model('deepsets', task.in_channels, 3, hidden_channels=8)
    Trainer(model, TrainConfig(device='cpu', progress=False)).load_weights(
        tmp_path / 'np' / 'best.pt')
    torch.testing.assert_close(predict(model, task.test),
                               predict(load_model(tmp_path / 'np' / 'best.pt'), task.test))
    labelled = Trainer(build_model('deepsets', task.in_channels, 3, hidden_channels=8),
                       config(tmp_path / 'own', epochs=1),
                       run_info={'model': {'name': 'my-deepsets'}})
    labelled.fit(task.train, task.val)
    labelled.load_weights(tmp_path / 'own' / 'best.pt')
    # and the same Trainer takes a checkpoint of the preset's own name (found by the review)
    labelled.load_weights(tmp_path / 'np' / 'best.pt')
    torch.testing.assert_close(predict(labelled.model, task.test),
                               predict(load_model(tmp_path / 'np' / 'best.pt'), task.test))


def test_prediction_columns_of_a_dataset_without_a_length(task):
    # predict() takes one; prediction_columns ran the model, then failed on len(dataset)
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(task.test)

    torch.manual_seed(0)
    model = build_model('deepsets', task.in_channels, task.out_channels, hidden_channels=8)
    assert prediction_columns(model, Stream(), 'regression') == prediction_columns(
        model, task.test, 'regression')


def test_a_checkpoint_of_an_unchecked_flag_or_rank_rebuilds_the_model_it_trained(task,
                                                                                 tmp_path):
    # before the argument checks, 'mz:log_n=False' recorded the text 'False', which the model
    # took as a true flag, and 'mz:rank=4' was ignored: such a checkpoint rebuilds what was
    # trained (log-n on, no rank), with a warning, instead of failing the new checks
    torch.manual_seed(0)
    model = build_model('mz-slim', task.in_channels, task.out_channels, log_n=True, **SMALL)
    train(model, task.train, task.val, task.test, config=config(tmp_path))
    state = load_checkpoint(tmp_path / 'best.pt')
    state['run_info']['model']['args'] = dict(SMALL, log_n='False', rank=4)
    with pytest.warns(UserWarning) as caught:
        loaded = load_model(state)
    text = ' '.join(str(w.message) for w in caught)
    assert "log_n='False'" in text and 'rebuilt with log_n=True' in text
    assert 'rank=4' in text and 'rebuilt without it' in text
    assert loaded.body.log_n is True
    assert torch.equal(outputs(loaded, task.test)[0], outputs(model.eval(), task.test)[0])



def test_a_checkpoint_of_egnn_with_feature_columns_beside_pos_dim_loads_the_model_it_trained(
        task, tmp_path):
    # build_model ignored an EGNN's feature_columns beside pos_dim (it refuses them now) and
    # recorded them: such a checkpoint could be neither rebuilt (the refusal) nor loaded into
    # the model built now (built otherwise, feature_columns [0] against None)
    from torch_mz.train import Trainer

    def egnn():
        return build_model('egnn', task.in_channels, task.out_channels, pos_dim=3,
                           hidden_channels=8, num_layers=1)
    torch.manual_seed(0)
    model = egnn()
    model.build_info['feature_columns'] = [0]  # (as build_model recorded them then)
    train(model, task.train, task.val, config=config(tmp_path, epochs=1))
    best = str(tmp_path / 'best.pt')
    with pytest.warns(UserWarning, match=r"feature_columns=\[0\] with pos_dim=3 for 'egnn'.*"
                      r"rebuilt without them, as the model was trained"):
        rebuilt = load_model(best)
    expected = predict(model, task.test)
    torch.testing.assert_close(predict(rebuilt, task.test), expected)
    torch.testing.assert_close(predict(load_model(best, model=egnn()), task.test), expected)
    trainer = Trainer(egnn(), TrainConfig(device='cpu', progress=False))
    trainer.load_weights(best)
    torch.testing.assert_close(predict(trainer.model, task.test), expected)


def test_predict_takes_a_dataset_without_a_length(task, tmp_path):
    from torch.utils.data import IterableDataset
    from torch_mz.train import predict

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(task.test)

    torch.manual_seed(0)
    model = build_model('deepsets', task.in_channels, task.out_channels, hidden_channels=8)
    assert torch.equal(predict(model, Stream()), predict(model, task.test))


def test_load_test_split_rebuilds_the_runs_held_out_sets(task, tmp_path):
    import warnings

    from torch_mz.inference import TestSplitWarning, load_test_split
    result = train_one(task, 'deepsets', 0, config(tmp_path))
    best = str(tmp_path / 'best.pt')
    with warnings.catch_warnings():
        warnings.simplefilter('error', TestSplitWarning)  # the run's own options: no warning
        rebuilt = load_test_split(best)  # the task's name, seed and sizes from the checkpoint
    assert [d.y.tolist() for d in rebuilt.test] == [d.y.tolist() for d in task.test]
    model = load_model(best)
    mse = ((predict(model, rebuilt.test) - torch.cat([d.y for d in task.test])) ** 2).mean()
    assert float(mse) == pytest.approx(result['test']['mse'], rel=1e-5)
    # a synthetic task's test split is drawn apart: more sets, the first the same
    more = load_test_split(best, n_test=12).test
    assert len(more) == 12 and [d.y.tolist() for d in more[:8]] == [d.y.tolist()
                                                                    for d in task.test]
    # set-size generalisation is no change of data; another option is warned about once the
    # task it gives fits the model (here it does not: refused, and no warning)
    with warnings.catch_warnings():
        warnings.simplefilter('error', TestSplitWarning)
        with pytest.raises(ValueError, match='predicts 3 output'):
            load_test_split(best, task_args=dict(reduce='mean'))
    with pytest.warns(TestSplitWarning, match="split_set_sizes=.* differs from the training "
                      "run's split_set_sizes=None"):
        other = load_test_split(best, task_args=dict(split_set_sizes={'test': [6, 7]}))
    assert {d.num_nodes for d in other.test} <= {6, 7}
    assert len(load_test_split(best, task_args=dict(set_size=[8, 9])).test) == 8
    for kwargs, match in ((dict(task='sum'), "trained on task 'max', not 'sum'"),
                          (dict(data_seed=1), 'trained on data seed 0'),
                          (dict(n_train=5), r"records its training run's split \(n_train 32\)"),
                          (dict(n_test=0), "'n_test' must be an integer >= 1"),
                          (dict(n_test=True), "'n_test' must be an integer >= 1"),
                          (dict(data_seed='0'), "'data_seed' must be an integer"),
                          (dict(task_args=dict(transform=None), transform=None),
                           r"\['transform'\] given both in task_args and as keyword")):
        with pytest.raises(ValueError, match=match):
            load_test_split(best, **kwargs)
    with pytest.raises(TypeError, match='unexpected keyword'):
        load_test_split(best, transfrom=None)
    with pytest.raises(TypeError, match='task_args must be a mapping'):
        load_test_split(best, task_args=[('d', 3)])
    with pytest.raises(TypeError, match='takes the path of a checkpoint'):
        load_test_split(3)
    with pytest.raises(CheckpointError, match='has no task_type'):
        load_test_split({'run_info': {}})
    # the recorded options in another form are no change: no warning
    with warnings.catch_warnings():
        warnings.simplefilter('error', TestSplitWarning)
        assert len(load_test_split(load_checkpoint(best), task_args=dict(d=3)).test) == 8


def test_a_set_size_given_for_prediction_replaces_the_runs_test_range(tmp_path):
    # a run trained with split_set_sizes={'test': ...}: a set_size given to predict sizes the
    # test sets (it was ignored: the run's test range overrode it, silently)
    from torch_mz.inference import load_test_split
    task = load_task('sum', n_train=32, n_val=8, n_test=8, split_set_sizes={'test': [20, 22]})
    train_one(task, 'deepsets', 0, config(tmp_path, epochs=1))
    best = str(tmp_path / 'best.pt')
    assert {d.num_nodes for d in load_test_split(best).test} <= {20, 21, 22}
    small = load_test_split(best, task_args=dict(set_size=[5, 6])).test  # (no change of data)
    assert {d.num_nodes for d in small} <= {5, 6}


def test_load_test_split_of_a_run_that_records_no_task_options_says_so(task, tmp_path):
    # train() called without run_info['task'] (the README's Python example): the options given
    # were said to differ from 'the training run's' d=32, the task's default, which the run
    # (d=3, the model's 3 input channels) had not used
    import warnings

    from torch_mz.inference import TestSplitWarning, load_test_split
    model = build_model('deepsets', task.in_channels, task.out_channels, hidden_channels=8)
    train(model, task.train, task.val, config=config(tmp_path, epochs=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always', TestSplitWarning)
        rebuilt = load_test_split(str(tmp_path / 'best.pt'), 'max',
                                  dict(d=3, set_size=[2, 5]), n_test=8)
    said = [str(w.message) for w in caught if w.category is TestSplitWarning]
    assert [d.y.tolist() for d in rebuilt.test] == [d.y.tolist() for d in task.test]
    assert not any('differs from the training run' in text for text in said), said
    assert any('does not record the task options of its training run' in text
               for text in said), said


def test_load_model_refuses_a_model_built_otherwise(task, tmp_path):
    # weights of the same shapes in a model of other options (here the readout) loaded and
    # predicted something else; the model the checkpoint records, or one built the same, loads
    train_one(task, 'mz', 0, config(tmp_path, epochs=1), **SMALL)
    best = str(tmp_path / 'best.pt')
    other = build_model('mz', task.in_channels, 3, readout='signed', **SMALL)
    with pytest.raises(CheckpointError, match=r"built otherwise than the one given \(readout "
                       r"'ihw', given 'signed'\)"):
        load_model(best, model=other)
    # options that do not change an eval-mode prediction, and a preset's own value given
    # again, are no difference
    same = build_model('mz', task.in_channels, 3, dropout=0.3, chunk_size=None, heads=4,
                       **SMALL)
    expected = outputs(load_model(best), task.test).prediction
    torch.testing.assert_close(outputs(load_model(best, model=same), task.test).prediction,
                               expected)


def test_load_model_takes_a_model_given_options_at_their_defaults(task, tmp_path):
    # readout='ihw' is MZAggregation's default, which the preset does not list: no difference
    train_one(task, 'mz', 0, config(tmp_path, epochs=1), **SMALL)
    best = str(tmp_path / 'best.pt')
    same = build_model('mz', task.in_channels, 3, readout='ihw', **SMALL)
    torch.testing.assert_close(outputs(load_model(best, model=same), task.test).prediction,
                               outputs(load_model(best), task.test).prediction)


def test_load_model_compares_the_options_that_differ(task, tmp_path):
    # a parameter-matched preset's width is told by its weights; preset='paper' is the model's
    # own default; the message names the option that differs
    train_one(task, 'hypernet', 0, config(tmp_path, epochs=1))
    best = str(tmp_path / 'best.pt')
    width = load_model(best).body.dim if hasattr(load_model(best), 'body') else None
    same = build_model('hypernet', task.in_channels, 3, dim=width, preset='paper')
    load_model(best, model=same)
    with pytest.raises(CheckpointError, match=r"\(log_n False, given True\)"):
        load_model(best, model=build_model('hypernet', task.in_channels, 3, dim=width,
                                           log_n=True))


def test_scale_uncertainty_of_a_per_set_width_with_several_targets_names_the_problem(task,
                                                                                      tmp_path):
    # one width per set against three targets' standard deviations: it failed with "Expected
    # targets with 3 column(s) (got shape (8,))", about a tensor that is no target
    torch.manual_seed(0)
    model = build_model('mz-slim', task.in_channels, task.out_channels, **SMALL)
    train(model, task.train, task.val, task.test, config=config(tmp_path))
    with pytest.raises(ValueError, match=r'one uncertainty per set .* 3 standard deviations'):
        predict(model, task.test, scale_uncertainty=True)
    pred, ihw = predict(model, task.test)  # unscaled, as the model gives it
    assert pred.shape == (8, 3) and ihw.shape == (8, )


def test_load_test_split_reads_given_options_as_load_task_does(tmp_path):
    # --task-arg alignment=true reads as JSON's true, which load_task takes as rotation
    # matching's default text 'true': it was warned about as another task than the run's own
    import warnings

    from torch_mz.inference import TestSplitWarning, load_test_split
    from torch_mz.options import parse_key_values
    small = load_task('rotation-matching', n_train=8, n_val=4, n_test=4, d=3)
    train_one(small, 'deepsets', 0, config(tmp_path, epochs=1), hidden_channels=8)
    with warnings.catch_warnings():
        warnings.simplefilter('error', TestSplitWarning)
        for items in (['alignment=true'], ['alignment="true"']):
            rebuilt = load_test_split(str(tmp_path / 'best.pt'),
                                      task_args=parse_key_values(items))
            assert [d.y.tolist() for d in rebuilt.test] == [d.y.tolist() for d in small.test]


def test_a_checkpoint_of_an_option_the_operator_ignores_loads_into_the_model_without_it(
        task, tmp_path):
    # rigid trained with num_matrix_generators=8 (warned: it does nothing) is the model built
    # without it; load_model(path, model=...) refused it as built otherwise
    import warnings
    with pytest.warns(UserWarning, match='does nothing here'):
        train_one(task, 'rigid', 0, config(tmp_path, epochs=1), num_matrix_generators=8,
                  summary='mean+std', **SMALL)
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        model = build_model('rigid', task.in_channels, 3, **SMALL)
        load_model(str(tmp_path / 'best.pt'), model=model)
    with pytest.warns(UserWarning):
        rebuilt = load_model(str(tmp_path / 'best.pt'))  # (the recorded options: warned again)
    torch.testing.assert_close(predict(model, task.test), predict(rebuilt, task.test))


def test_a_model_given_in_a_narrower_dtype_than_the_weights_is_warned_about(task, tmp_path):
    # float64 weights loaded into a float32 model were rounded without a word
    import warnings
    train_one(task, 'deepsets', 0, config(tmp_path, epochs=1), hidden_channels=8)
    state = load_checkpoint(tmp_path / 'best.pt')
    state['model'] = {k: v.double() if v.is_floating_point() else v
                      for k, v in state['model'].items()}
    with pytest.warns(UserWarning, match=r'wider dtype than the model given \(torch.float64 '
                                         r'into torch.float32\)'):
        load_model(state, model=build_model('deepsets', task.in_channels, 3, hidden_channels=8))
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)  # the same precision, or a wider model: none
        load_model(state, model=build_model('deepsets', task.in_channels, 3,
                                            hidden_channels=8).double())
        load_model(str(tmp_path / 'best.pt'),
                   model=build_model('deepsets', task.in_channels, 3, hidden_channels=8))


def test_load_models_and_test_splits_warnings_name_their_callers_line(task, tmp_path):
    # read once (load_model and load_test_split each a reader and a private part), the
    # rounding warning named load_model's own line in torch_mz, not the caller's
    from torch_mz.inference import TestSplitWarning, load_test_split
    train_one(task, 'deepsets', 0, config(tmp_path, epochs=1), hidden_channels=8)
    state = load_checkpoint(tmp_path / 'best.pt')
    state['model'] = {k: v.double() if v.is_floating_point() else v
                      for k, v in state['model'].items()}
    for checkpoint in (state, str(tmp_path / 'best.pt')):
        with pytest.warns(TestSplitWarning) as caught:
            load_test_split(checkpoint, task_args=dict(split_set_sizes={'test': [6, 7]}))
        assert {w.filename for w in caught} == {__file__}
    with pytest.warns(UserWarning, match='wider dtype') as caught:
        load_model(state, model=build_model('deepsets', task.in_channels, 3, hidden_channels=8))
    assert {w.filename for w in caught} == {__file__}


def test_a_regression_checkpoint_without_its_normaliser_is_refused(task, tmp_path):
    # normalize_targets=True with no normaliser (a damaged or foreign file): load_model
    # returned a model that predicts standardised values, and torch-mz predict wrote them to
    # its CSV as target units
    train_one(task, 'rigid', 0, config(tmp_path), **SMALL)
    state = load_checkpoint(tmp_path / 'best.pt')
    state['normalizer'] = None
    save_checkpoint(state, tmp_path / 'bare.pt')
    with pytest.raises(CheckpointError, match='no target normaliser'):
        load_model(tmp_path / 'bare.pt')
    model = build_model('rigid', 3, 3, **SMALL)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match='no target normaliser'):
        load_model(tmp_path / 'bare.pt', model=model)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    # trained without normalised targets, it holds none: its model predicts target units
    state['config']['normalize_targets'] = False
    assert carried_normalizer(load_model(state)) is None
    # a checkpoint given as a dict whose config is None (it failed with an AttributeError)
    state['config'] = None
    state['normalizer'] = load_checkpoint(tmp_path / 'best.pt')['normalizer']
    assert carried_normalizer(load_model(state)) is not None


def test_an_unfitted_normalisers_state_is_no_normaliser(task, tmp_path):
    # TargetNormalizer().state_dict() (no mean, no std) passed for a normaliser: load_model
    # failed attaching it ('Expected a fitted TargetNormalizer', no CheckpointError) after a
    # given model's weights had been replaced
    from torch_mz.train import TargetNormalizer
    train_one(task, 'rigid', 0, config(tmp_path), **SMALL)
    state = load_checkpoint(tmp_path / 'best.pt')
    state['normalizer'] = TargetNormalizer().state_dict()
    save_checkpoint(state, tmp_path / 'unfitted.pt')
    with pytest.raises(CheckpointError, match='no target normaliser'):
        load_model(tmp_path / 'unfitted.pt')
    model = build_model('rigid', 3, 3, **SMALL)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match='no target normaliser'):
        load_model(tmp_path / 'unfitted.pt', model=model)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    state['config']['normalize_targets'] = False  # (none needed: it loads, carrying none)
    assert carried_normalizer(load_model(state)) is None
