r"""What the tests of :mod:`torch_mz.train` share: the toy data and models of
``_ddp_worker.py`` (also the torchrun worker script of the DDP test), a small configuration and
comparisons."""
import importlib.util
from pathlib import Path

import torch

from torch_mz.train import TrainConfig

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent  # the repository


def _load_helpers():
    # Loaded by path: the helpers double as the torchrun worker script (run as a file).
    spec = importlib.util.spec_from_file_location('_train_helpers', HERE / '_ddp_worker.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


H = _load_helpers()


REG_TRAIN = H.make_regression_sets(128, seed=10)
REG_VAL = H.make_regression_sets(48, seed=11)
CLS_TRAIN = H.make_classification_sets(128, seed=10)
CLS_VAL = H.make_classification_sets(48, seed=11)


def config(**kwargs) -> TrainConfig:
    base = dict(epochs=3, batch_size=16, lr=1e-2, warmup_epochs=1, device='cpu', progress=False,
                patience=None)
    base.update(kwargs)
    return TrainConfig(**base)


def targets(dataset) -> torch.Tensor:
    return torch.cat([d.y.view(1, -1) for d in dataset], dim=0)


def params(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def strip_times(history: list) -> list:
    return [{k: v for k, v in r.items() if k != 'epoch_time'} for r in history]


def assert_same_params(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
