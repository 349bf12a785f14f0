r"""What the tests of :mod:`torch_mz.train` share: the toy data and models of
``_ddp_worker.py`` (also the torchrun worker script of the DDP test), a small configuration,
comparisons and a stand-in for a device this machine lacks."""
import importlib.util
from pathlib import Path

import torch
from torch_geometric.data.data import BaseData

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


def fake_device(monkeypatch, kind='mps'):
    r"""Device :obj:`kind` as one that holds CPU tensors, for the tests of what runs on a device
    without one: ``Module.to`` and a batch's ``to`` leave the tensors where they are for it, and
    every move of a module is recorded; returns the list of ``(module, device)`` moves."""
    moves = []
    module_to, batch_to = torch.nn.Module.to, BaseData.to

    def to(self, *args, **kwargs):
        dev = torch.device(args[0]) if args and isinstance(args[0], (str, torch.device)) else None
        moves.append((self, dev))
        return self if dev is not None and dev.type == kind else module_to(self, *args, **kwargs)

    def to_batch(self, device, *args, **kwargs):
        return self if torch.device(device).type == kind else batch_to(self, device, *args,
                                                                       **kwargs)
    monkeypatch.setattr(torch.nn.Module, 'to', to)
    monkeypatch.setattr(BaseData, 'to', to_batch)
    return moves
