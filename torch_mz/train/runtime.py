r"""Seeds, devices and the distributed set-up of a training run."""
import contextlib
import logging
import os
import random
from dataclasses import dataclass
from typing import Iterator, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist

__all__ = ['seed_everything', 'resolve_device', 'DistInfo']

log = logging.getLogger(__name__)


def seed_everything(seed: int, deterministic: bool = False) -> None:
    r"""Seeds Python's :mod:`random`, NumPy and PyTorch (CPU and all CUDA devices).

    Seeds in :math:`[0, 2^{32})` seed the three libraries alike, as
    :func:`torch_geometric.seed_everything` does. Outside that range Python and NumPy get
    streams of their own for every seed, but PyTorch's CPU generator keeps only the low 32 bits
    of a seed (:func:`torch.manual_seed`): :class:`~torch_mz.train.TrainConfig` takes seeds in
    :math:`[0, 2^{32})`.

    Args:
        seed (int): The seed.
        deterministic (bool, optional): If :obj:`True`, also asks PyTorch for deterministic
            algorithms (``torch.use_deterministic_algorithms(True, warn_only=True)``) and
            disables the cuDNN auto-tuner. (default: :obj:`False`)
    """
    # Not torch_geometric.seed_everything: it seeds NumPy with `seed` itself, which raises for a
    # seed outside [0, 2**32) (a negative one, or `seed + rank` past the range); and it has no
    # `deterministic` switch. For seeds in range both seed the same generators alike
    # (torch.manual_seed also seeds every CUDA device). A seed outside the range seeds each
    # library with a value of its own that no other seed gives: Python's random.seed takes
    # |seed| (s and -s shared a stream), NumPy's legacy seed 32 bits (s and s + 2**32 shared
    # one), so negative seeds go to Python as 2**64 - seed and to NumPy as the 32-bit words of
    # the seed and its sign
    seed = int(seed)
    if 0 <= seed < 2**32:
        random.seed(seed)
        np.random.seed(seed)
    else:
        random.seed(seed if seed >= 0 else 2**64 - seed)
        magnitude = abs(seed)
        np.random.seed([magnitude & 0xFFFFFFFF, (magnitude >> 32) & 0xFFFFFFFF,
                        (magnitude >> 64) & 0xFFFFFFFF, int(seed < 0), 0x5EED])
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        _use_deterministic_algorithms()


def _use_deterministic_algorithms() -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool) -> Iterator[None]:
    r"""Within the block, PyTorch's deterministic algorithms (``warn_only``) and cuDNN without
    its auto-tuner where :obj:`enabled`; after it, the settings as they were (a training run
    with ``deterministic=True`` left them on for the rest of the process). With :obj:`enabled`
    false nothing changes."""
    if not enabled:
        yield
        return
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    _use_deterministic_algorithms()
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2:]


def resolve_device(device: Union[str, torch.device] = 'auto') -> torch.device:
    r"""Turns ``'auto'`` into ``cuda`` when a GPU is available (else ``cpu``); any other value is
    passed to :class:`torch.device`, with a :class:`ValueError` for a name it does not know, a
    CUDA device on a machine without one, or a CUDA index past the machine's devices."""
    if isinstance(device, torch.device):
        dev = device
    elif device == 'auto':
        dev = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    else:
        try:
            dev = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"Expected device 'auto', 'cpu', 'cuda' or 'cuda:<index>' "
                             f"(got {device!r})") from e
    if dev.type == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f"Device {str(dev)!r} was requested but CUDA is not available")
    if dev.type == 'cuda' and dev.index is not None and dev.index >= torch.cuda.device_count():
        # (accepted, it failed at the first move to it, with CUDA's "invalid device ordinal")
        count = torch.cuda.device_count()
        raise ValueError(f"Device {str(dev)!r} was requested but this machine has {count} CUDA "
                         f"device(s), cuda:0 to cuda:{count - 1}")
    return dev


@dataclass(frozen=True)
class DistInfo:
    r"""Where this process stands in a (possibly) distributed run: read from the ``RANK``,
    ``WORLD_SIZE`` and ``LOCAL_RANK`` environment variables that ``torchrun`` sets, or from an
    already initialised process group."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> 'DistInfo':
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(),
                       int(os.environ.get('LOCAL_RANK', dist.get_rank())))
        return cls(int(os.environ.get('RANK', 0)), int(os.environ.get('WORLD_SIZE', 1)),
                   int(os.environ.get('LOCAL_RANK', 0)))


def _setup_distributed(device: Union[str, torch.device]) -> Tuple[DistInfo, torch.device]:
    r"""Resolves the device and, under ``torchrun`` with more than one process, initialises the
    default process group (NCCL for CUDA, gloo otherwise) unless it already is."""
    info = DistInfo.from_env()
    dev = resolve_device(device)
    if not info.is_distributed:
        return info, dev
    if dev.type == 'cuda':
        dev = torch.device('cuda', info.local_rank)  # one GPU per process
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        backend = 'nccl' if dev.type == 'cuda' else 'gloo'
        dist.init_process_group(backend=backend, init_method='env://', rank=info.rank,
                                world_size=info.world_size)
        log.info('Initialised process group (%s): rank %d of %d', backend, info.rank,
                 info.world_size)
    return info, dev
