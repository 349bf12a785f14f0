r"""Toy set data and a tiny Deep-Sets model for the tests in ``tests/train/``, and the worker
script that the distributed test launches with ``python -m torch.distributed.run
--nproc_per_node=2``.

As a script: ``_ddp_worker.py OUT_DIR`` trains the toy regression problem with DDP (gloo on CPU)
and writes ``OUT_DIR/rank<r>.pt`` with the final parameters, the all-reduced validation metrics and
the history of each rank. The test imports this file by path for the model and data.
"""
import os
import sys
from typing import List

import torch
from torch import nn
from torch_geometric.data import Data
from torch_geometric.nn import global_mean_pool

# Settings shared by the DDP worker and the single-process reference run in the test.
DDP_N_TRAIN, DDP_N_VAL, DDP_BATCH_PER_RANK, DDP_EPOCHS = 64, 21, 8, 3
# A rank still running after this many seconds prints its stack and exits; the test waits 30 s
# longer, so the traceback of a hung rank ends up in the test's failure message.
WORKER_TIMEOUT_S = 90


class ToyDeepSets(nn.Module):
    r"""Deep Sets: per-element MLP, mean pool, MLP. Returns ``(pred, sigma)`` when
    ``with_uncertainty`` is set."""
    def __init__(self, in_dim: int, out_dim: int, hidden: int = 32, dropout: float = 0.0,
                 with_uncertainty: bool = False):
        super().__init__()
        self.with_uncertainty = with_uncertainty
        self.phi = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.rho = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, out_dim))
        self.sigma = nn.Linear(hidden, out_dim) if with_uncertainty else None

    def forward(self, batch):
        h = global_mean_pool(self.phi(batch.x), batch.batch, size=batch.num_graphs)  # (B, hidden)
        pred = self.rho(h)  # (B, out_dim)
        if self.sigma is not None:
            return pred, nn.functional.softplus(self.sigma(h))
        return pred


def make_regression_sets(n: int, seed: int, in_dim: int = 3, offset: float = 100.0,
                         scale: float = 10.0) -> List[Data]:
    r"""Sets of 2-8 Gaussian elements; two targets ``offset + scale * [mean(x0), mean(x1^2)]``
    (y of shape (1, 2)), far from zero mean / unit variance so normalisation matters."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        size = int(torch.randint(2, 9, (1,), generator=g))
        x = torch.randn(size, in_dim, generator=g)
        y = torch.stack([x[:, 0].mean(), x[:, 1].pow(2).mean()]).view(1, 2)
        out.append(Data(x=x, y=offset + scale * y))
    return out


def make_classification_sets(n: int, seed: int, in_dim: int = 3) -> List[Data]:
    r"""Sets of 2-8 elements; the class is the feature with the largest set mean (y of shape
    (1,), long), so there are ``in_dim`` classes."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        size = int(torch.randint(2, 9, (1,), generator=g))
        x = torch.randn(size, in_dim, generator=g)
        out.append(Data(x=x, y=x.mean(dim=0).argmax().view(1)))
    return out


def ddp_data():
    return (make_regression_sets(DDP_N_TRAIN, seed=1), make_regression_sets(DDP_N_VAL, seed=2))


def main(out_dir: str) -> None:
    import faulthandler

    import torch.distributed as dist

    # A hung rank prints where it hangs and exits instead of lingering after the test gave up.
    faulthandler.dump_traceback_later(WORKER_TIMEOUT_S, exit=True)

    from torch_mz.train import Trainer, TrainConfig, seed_everything

    seed_everything(0)
    model = ToyDeepSets(3, 2)
    train_ds, val_ds = ddp_data()
    config = TrainConfig(epochs=DDP_EPOCHS, batch_size=DDP_BATCH_PER_RANK, lr=1e-2,
                         warmup_epochs=1, patience=None, device='cpu', progress=False,
                         out_dir=os.path.join(out_dir, 'run'))
    trainer = Trainer(model, config, task_type='regression')
    result = trainer.fit(train_ds, val_ds)
    metrics = trainer.evaluate(val_ds)
    rank = dist.get_rank()
    torch.save({'rank': rank, 'world_size': dist.get_world_size(),
                'backend': dist.get_backend(),
                'params': {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
                'metrics': metrics, 'history': result.history},
               os.path.join(out_dir, f'rank{rank}.pt'))
    trainer.close()  # drop the DDP wrapper while the process group is alive, then destroy it
    dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1])
