r"""Memory traffic of a computation and the measured memory bandwidth: the second axis of a
roofline. On a CPU core the MZ models' per-token work (every generator row of every token) is
bound by memory traffic, not by matrix-product FLOPs, so a time is compared with both the
matmul peak (:func:`~torch_mz.study.measure.matmul_peak_flops`) and the bytes it had to move.

:func:`count_bytes` counts, for every ATen operator that writes memory (a new tensor or an
in-place update), the bytes of its tensor inputs and outputs; views cost nothing, a broadcast
(stride 0) input counts its distinct elements once. It assumes no cache reuse between operators,
so it is an upper estimate of the traffic (an unfused estimate: what eager PyTorch moves).

:func:`count_ops` counts the operations themselves (:class:`OpCounter`): every ATen operation,
the kernels among them (neither views nor bare allocations: each a launch on a GPU, where a
launch has a cost of its own whatever the size of its tensors) and the host synchronisations
(reads of a device result), the floor under the time of small work on a GPU
(``benchmarks/launches.py``).
"""
import math
import time
from collections import Counter
from typing import Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from torch_mz._checks import check_count


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
    bandwidth that :func:`count_bytes` traffic is compared with. A :obj:`mib` or :obj:`repeats`
    below 1 raises a :class:`ValueError` (they gave 0 bytes per second)."""
    mib, repeats = check_count('mib', mib), check_count('repeats', repeats)
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


#: Operations that return a view without saying so in their schema.
UNANNOTATED_VIEWS = frozenset({'_unsafe_view'})
#: Operations that only reserve memory (no kernel).
ALLOCATIONS = frozenset({'empty', 'empty_like', 'new_empty', 'empty_strided'})
#: Operations that read a device result on the host (``int(t)``, ``bool(t)``, ``t.item()``;
#: ``torch.equal``, which returns a Python bool; output sizes the host must know;
#: ``repeat_interleave`` only without ``output_size``).
#: ``.tolist()`` of a CPU tensor dispatches nothing (on a GPU it is one more copy to the host), so
#: the count is a lower bound.
SYNC_OPS = frozenset({'_local_scalar_dense', 'equal', 'nonzero', '_unique2',
                      'unique_consecutive', 'unique_dim', 'bincount', 'repeat_interleave'})


def _is_view(func) -> bool:
    r"""Whether the ATen operation :obj:`func` returns a view of an input (an alias that is not
    written to): such operations only make a new tensor header and launch no kernel."""
    if func.overloadpacket.__name__ in UNANNOTATED_VIEWS:
        return True
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                 for r in returns)


class OpCounter(TorchDispatchMode):
    r"""Counts the ATen operations dispatched while it is active, each once: :attr:`ops` all of
    them, :attr:`kernels` those that are neither views nor bare allocations, :attr:`syncs`
    those that read a result on the host (:data:`SYNC_OPS`), :attr:`by_name` the kernels by
    name."""
    def __init__(self):
        super().__init__()
        self.ops = 0
        self.kernels = 0
        self.syncs = 0
        self.by_name: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        name = func.overloadpacket.__name__
        if not _is_view(func) and name not in ALLOCATIONS:
            self.kernels += 1
            self.syncs += name in SYNC_OPS and not (
                name == 'repeat_interleave' and (kwargs or {}).get('output_size') is not None)
            self.by_name[name] += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], None]) -> OpCounter:
    r"""The operations one call of :obj:`fn` dispatches (the backward pass included when
    :obj:`fn` runs it: autograd's engine dispatches under the same mode)."""
    with OpCounter() as counter:
        fn()
    return counter
