r"""Data-loader pieces: the unpadded evaluation shard of a rank and the seeding of workers."""
import random
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler


class _ShardSampler(Sampler):
    r"""Sequential indices ``rank, rank + world_size, ...``: every element exactly once over all
    ranks (unlike :class:`DistributedSampler`, which pads), so that all-reduced sums are exact."""
    def __init__(self, size: int, rank: int, world_size: int):
        self.indices = list(range(rank, size, world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def _worker_init_fn(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32  # differs per worker and per epoch
    # not torch_geometric.seed_everything: it would also reseed torch with this value, which is
    # the worker's torch seed reduced modulo 2**32, and so change the worker's torch stream
    random.seed(seed)
    np.random.seed(seed)
