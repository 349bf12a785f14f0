import random

import numpy as np
import torch
from torch.utils.data import DataLoader

from torch_mz.train.runtime import seed_everything
from torch_mz.train.sampling import _worker_init_fn


class _Draws(torch.utils.data.Dataset):
    r"""Each item: one number from each of torch's, Python's and NumPy's global generators (as
    PyG's random transforms draw: RandomJitter and FixedPoints torch's, RandomRotate Python's)."""
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([torch.rand(()).item(), random.random(), np.random.rand()],
                            dtype=torch.float64)


def _epochs(num_workers: int, seed: int = 0, epochs: int = 2):
    seed_everything(seed)
    loader = DataLoader(_Draws(), batch_size=1, num_workers=num_workers,
                        worker_init_fn=_worker_init_fn)
    return [torch.cat(list(loader)) for _ in range(epochs)]  # epochs of (4, 3)


def test_worker_draws_are_reproducible_and_differ_across_workers_and_epochs():
    first, again = _epochs(2), _epochs(2)
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # a seed gives the same draws
    for epoch in first:  # items 0, 2 from worker 0, items 1, 3 from worker 1: no shared stream
        for k in range(3):
            assert len(set(epoch[:, k].tolist())) == 4, k
    for k in range(3):  # every epoch's workers draw anew, with every library
        assert not set(first[0][:, k].tolist()) & set(first[1][:, k].tolist()), k
    assert not torch.equal(_epochs(2, seed=1)[0], first[0])
    # the documented difference: workers draw from streams of their own, not the main
    # process's, so the draws (and augmentations) differ from num_workers=0's
    assert not torch.equal(_epochs(0)[0], first[0])
