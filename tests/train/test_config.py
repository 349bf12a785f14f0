
import numpy as np
import pytest

from torch_mz.train import (TargetNormalizer, Trainer, TrainConfig, cosine_with_warmup, predict,
                            seed_everything)

from tests.train._common import H, config


@pytest.mark.parametrize('kwargs', [
    {'epochs': 0}, {'batch_size': 0}, {'lr': -1.0}, {'warmup_epochs': 200},
    {'schedule': 'linear'}, {'grad_clip': 0.0}, {'patience': 0}, {'checkpoint_every': -1},
    # types: a string or a fraction where a count belongs, a non-finite rate, a bool
    {'epochs': '2'}, {'lr': '1e-3'}, {'epochs': 1.5}, {'warmup_epochs': 0.5},
    {'epochs': True}, {'grad_clip': float('nan')}, {'weight_decay': float('inf')},
    {'patience': -3}, {'seed': 2 ** 63}, {'seed': -2 ** 63 - 1},
    # seeds keep 32 bits in PyTorch's CPU generator and NumPy: s and s + 2**32 would share streams
    {'seed': -1}, {'seed': 2 ** 32},
    # an empty path names no folder (the run failed at os.makedirs('') after fitting)
    {'out_dir': ''}, {'resume': ''},
])
def test_config_validation(kwargs):
    with pytest.raises(ValueError, match='TrainConfig'):
        TrainConfig(**kwargs)


@pytest.mark.parametrize('obj,params_of', [
    (TrainConfig, TrainConfig), (Trainer, Trainer.__init__), (predict, predict),
    (cosine_with_warmup, cosine_with_warmup), (seed_everything, seed_everything),
    (TargetNormalizer, TargetNormalizer.__init__),
])
def test_documented_arguments_match_signature(obj, params_of):
    import inspect
    import re
    documented = re.findall(r'^\s{8}(\w+) \(', obj.__doc__.split('Args:')[1].split('Returns:')[0]
                            .split('Shapes:')[0], flags=re.M)
    actual = [p for p in inspect.signature(params_of).parameters if p != 'self']
    assert documented == actual


def test_config_defaults_follow_the_paper():
    c = TrainConfig()
    assert (c.lr, c.weight_decay, c.warmup_epochs, c.grad_clip, c.patience, c.batch_size) == (
        1e-4, 1e-5, 5, 1.0, 20, 128)
    assert c.device == 'auto'
    with pytest.raises(ValueError, match='task_type'):
        Trainer(H.ToyDeepSets(3, 2), config(), task_type='ranking')


@pytest.mark.parametrize('name', ['restore_best', 'deterministic', 'normalize_targets',
                                  'progress', 'find_unused_parameters'])
def test_flags_are_true_or_false_not_text(name):
    # the text 'false' was accepted, and true
    with pytest.raises(ValueError, match=f'True or False for {name}'):
        TrainConfig(**{name: 'false'})
    assert getattr(TrainConfig(**{name: np.bool_(False)}), name) is False


def test_numpy_numbers_become_python_numbers_and_the_run_writes_loadable_files(tmp_path):
    # NumPy numbers were accepted and kept: lr=np.float32 trained epoch 0, then the log write
    # failed (not JSON) and the checkpoints it had written were refused by the weights-only
    # load; seed=np.int64 failed in random.seed, batch_size=np.int64 in the DataLoader; a
    # model built with NumPy sizes lost its build record silently
    import torch

    from torch_mz import load_model
    from torch_mz.models import build_model
    from torch_mz.train import train
    from tests.train._common import REG_TRAIN, REG_VAL
    cfg = TrainConfig(epochs=np.int64(2), batch_size=np.int64(16), lr=np.float32(1e-2),
                      weight_decay=np.float64(0.0), grad_clip=np.float32(1.0),
                      seed=np.int64(3), warmup_epochs=np.int64(1), patience=np.int64(5),
                      device='cpu', progress=False, out_dir=str(tmp_path))
    for name in ('epochs', 'batch_size', 'seed', 'warmup_epochs', 'patience'):
        assert type(getattr(cfg, name)) is int
    for name in ('lr', 'weight_decay', 'grad_clip'):
        assert type(getattr(cfg, name)) is float
    model = build_model('deepsets', np.int64(3), np.int64(2), hidden_channels=np.int64(32))
    assert model.build_info['in_channels'] == 3 and type(model.build_info['in_channels']) is int
    assert type(model.build_info['args']['hidden_channels']) is int
    train(model, REG_TRAIN[:32], REG_VAL[:16], config=cfg)
    again = load_model(str(tmp_path / 'best.pt'))  # rebuilt from its record
    from torch_geometric.data import Batch
    batch = Batch.from_data_list(REG_VAL[:4])
    model.eval()
    again.eval()
    torch.testing.assert_close(again(batch)[0], model(batch)[0])
