r"""Memory traffic of a computation and the measured memory bandwidth: the second axis of a
roofline. On a CPU core the MZ models' per-token work (every generator row of every token) is
bound by memory traffic, not by matrix-product FLOPs, so a time is compared with both the
matmul peak (:func:`~torch_mz.study.measure.matmul_peak_flops`) and the bytes it had to move.

:func:`count_bytes` counts, for every ATen operator that writes memory (a new tensor or an
in-place update), the bytes of its tensor inputs and outputs; views cost nothing, a broadcast
(stride 0) input counts its distinct elements once. It assumes no cache reuse between operators,
so it is an upper estimate of the traffic (an unfused estimate: what eager PyTorch moves).
"""
import math
import time
from typing import Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def tensor_bytes(t: torch.Tensor) -> int:
    r"""Bytes of the distinct elements a tensor view covers (broadcast dimensions count once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


class _ByteCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        inputs = {t.untyped_storage().data_ptr() for t in ins}
        fresh = any(t.untyped_storage().data_ptr() not in inputs for t in outs)
        writes = any(a.alias_info is not None and a.alias_info.is_write
                     for a in func._schema.arguments)
        if fresh or writes:  # views (outputs aliasing inputs, nothing written) move no data
            self.bytes += sum(map(tensor_bytes, ins)) + sum(map(tensor_bytes, outs))
        return out


def count_bytes(fn: Callable[[], None]) -> int:
    r"""Bytes read and written by the operators of one call of :obj:`fn` (see the module
    docstring for what is counted)."""
    with _ByteCounter() as counter:
        fn()
    return counter.bytes


def memory_bandwidth(mib: int = 256, repeats: int = 5,
                     device: Optional[torch.device] = None) -> float:
    r"""Measured bytes per second of one copy of a :obj:`mib` MiB float32 tensor into another
    (bytes read plus bytes written, the best of :obj:`repeats`) on :obj:`device` (the CPU by
    default; on a GPU the copy is timed between synchronisations of the device): the practical
    bandwidth that :func:`count_bytes` traffic is compared with."""
    device = torch.device(device or 'cpu')
    a = torch.empty(mib * 2**20 // 4, device=device).uniform_()
    b = torch.empty_like(a)
    sync = ((lambda: torch.cuda.synchronize(device)) if device.type == 'cuda'
            else (lambda: None))
    b.copy_(a)  # first touch and, on a GPU, the kernel's first launch
    best = math.inf
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        b.copy_(a)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * a.numel() * a.element_size() / best
