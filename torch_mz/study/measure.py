r"""Measurement for the studies in ``benchmarks/``: timing with medians, peak memory, FLOP
counts, set-size generators, measurements in a fresh process and a record of the environment.
Library code: nothing here prints."""
import ctypes
import gc
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from torch_mz._checks import check_count, check_number
from torch_mz._optional import WITH_TORCH_SCATTER

__all__ = ['skewed_sizes', 'uniform_sizes', 'time_call', 'time_interleaved', 'peak_memory_bytes',
           'allocator_peak_bytes',
           'count_flops', 'matmul_peak_flops', 'MeasurementFailed', 'in_fresh_process',
           'environment']


def skewed_sizes(num_sets: int, total: int, sigma: float = 1.0, seed: int = 0) -> List[int]:
    r"""Log-normal set sizes (each at least 1) that sum to exactly :obj:`total`: the weights'
    shares of :obj:`total` rounded down, raised to 1 where below, then the difference to
    :obj:`total` added to or taken from the largest set one element at a time. Where many sets
    are raised to 1 (a small mean size with a large :obj:`sigma`, e.g. 1,000 sets of 2 points
    on average at sigma 2) the excess comes out of the largest sets, which end up flattened
    (all 22 there, where the shares give 163, 88, 58): the committed ``speed.py`` batches
    (64 sets of 128 points on average) are drawn so, barely touched (599 against 567), and are
    kept as they are.

    A :obj:`num_sets` below 1, a :obj:`total` below it, a :obj:`total` that is no integer or a
    :obj:`sigma` that is negative or not finite raises a :class:`ValueError` (``(3, 10.5)``
    and a NaN :obj:`sigma` never returned, ``(0, 0)`` gave no sets), as does a :obj:`sigma` so
    large that the weights overflow."""
    num_sets = check_count('num_sets', num_sets)
    total = check_count('total', total)
    sigma = check_number('sigma', sigma, allow_zero=True)
    if total < num_sets:
        raise ValueError(f"Need at least one element per set (got {total} < {num_sets})")
    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, sigma, num_sets)
    with np.errstate(over='ignore', invalid='ignore'):  # (refused below)
        shares = w / w.sum() * total
    if not np.isfinite(shares).all():
        raise ValueError(f"Expected a sigma whose log-normal weights fit a float64 (got sigma "
                         f"{sigma}: the weights overflow)")
    sizes = np.maximum(1, np.floor(shares)).astype(int)
    while sizes.sum() != total:  # fix rounding on the largest sets
        i = int(np.argmax(sizes))
        sizes[i] += 1 if sizes.sum() < total else -1
    return sizes.tolist()


def uniform_sizes(num_sets: int, total: int) -> List[int]:
    r"""Sizes as equal as possible (each at least 1) that sum to :obj:`total`: a
    :obj:`num_sets` below 1 or a :obj:`total` below it raises a :class:`ValueError`, as in
    :func:`skewed_sizes` (``(3, 2)`` gave a set of size 0, ``(3, -1)`` negative sizes)."""
    num_sets = check_count('num_sets', num_sets)
    total = check_count('total', total)
    if total < num_sets:
        raise ValueError(f"Need at least one element per set (got {total} < {num_sets})")
    base, rest = divmod(total, num_sets)
    return [base + (1 if i < rest else 0) for i in range(num_sets)]


def _sync(device: torch.device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], repeats: int = 7, warmup: int = 2,
              device: Optional[torch.device] = None) -> List[float]:
    r"""Wall-clock seconds of :obj:`repeats` calls of :obj:`fn` after :obj:`warmup` calls. A
    :obj:`repeats` below 1 or a negative :obj:`warmup` raises a :class:`ValueError` (no times:
    their median was NaN)."""
    repeats, warmup = check_count('repeats', repeats), check_count('warmup', warmup, 0)
    device = torch.device(device or 'cpu')
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        gc.collect()
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def time_interleaved(fns: Dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 1,
                     device: Optional[torch.device] = None) -> Dict[str, List[float]]:
    r"""Wall-clock seconds of :obj:`repeats` calls of each of :obj:`fns`, interleaved: round
    :math:`r` calls every function once, in an order rotated by one place per round, so that a
    slow spell of a shared machine falls on every function alike instead of on whichever was
    measured then (:func:`time_call` measures one function after another). :obj:`warmup` untimed
    calls of each first. A :obj:`repeats` below 1 or a negative :obj:`warmup` raises a
    :class:`ValueError`, as in :func:`time_call`."""
    repeats, warmup = check_count('repeats', repeats), check_count('warmup', warmup, 0)
    device = torch.device(device or 'cpu')
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            gc.collect()
            _sync(device)
            start = time.perf_counter()
            fns[name]()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return times


def _proc_status_kib(field: str) -> Optional[int]:
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith(field + ':'):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def process_peak_rss_bytes() -> Optional[int]:
    r"""This process's resident-set high-water mark (Linux ``VmHWM``), ``None`` elsewhere.
    Unlike ``resource.getrusage(...).ru_maxrss``, which a process started by ``fork`` and
    ``exec`` inherits from its parent, it counts this process's own memory only."""
    kib = _proc_status_kib('VmHWM')
    return None if kib is None else kib * 1024


def _release_free_heap() -> None:
    r"""Returns the free memory glibc's heap still holds to the system (``malloc_trim(0)``), so
    that a later allocation shows up as new resident memory instead of silently reusing pages
    that are resident already. Does nothing where glibc is not the C library."""
    try:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_memory_bytes(fn: Callable[[], None], device: torch.device) -> Optional[int]:
    r"""Peak memory of one call of :obj:`fn` above what was in use before it: CUDA's allocator
    peak on a GPU; on Linux CPUs the resident-set high-water mark (reset through
    ``/proc/self/clear_refs``) minus the resident set before the call, after returning the free
    heap to the system so that the call's allocations count as new memory. ``None`` where it
    cannot be read."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    if sys.platform != 'linux':
        return None
    gc.collect()
    _release_free_heap()
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')  # reset the high-water mark VmHWM to the current RSS
    except OSError:
        return None
    before = _proc_status_kib('VmRSS')
    fn()
    peak = _proc_status_kib('VmHWM')
    if before is None or peak is None:
        return None
    return int(peak - before) * 1024

def allocator_peak_bytes(fn: Callable[[], None], device: torch.device) -> Optional[int]:
    r"""The most tensor memory one call of :obj:`fn` holds at once above what was held before
    it: CUDA's allocator peak on a GPU; on a CPU the peak of PyTorch's CPU allocator total as
    the profiler's memory events report it (``profile_memory=True``). :obj:`fn` runs twice under
    the profiler and the second call is read: the profiler knows the size of a block only if it
    saw it allocated, so a block from before it started (the previous step's gradients, freed
    by the next step) would not be subtracted when freed. Time the calls apart.

    Where :func:`peak_memory_bytes` reads the pages the process touched (the resident set, what
    the operating system has to give), this reads what the tensors hold, whichever pages the C
    allocator puts them in: the two differ where freed blocks are reused or fresh pages are
    mapped for large blocks (PyG's aggregation on a 10^3-node graph, 10^4 edges, d = 16, in
    ``benchmarks/results/message_passing_rows``: 20.7 MiB of tensors at once against 43.8 MiB
    of touched pages). Memory the kernels take
    outside PyTorch's allocator (BLAS packing buffers) is not in it. ``None`` on other devices,
    or where this torch's profiler does not report allocator totals (a private interface);
    errors of :obj:`fn` itself propagate."""
    if device.type == 'cuda':
        return peak_memory_bytes(fn, device)
    if device.type != 'cpu':
        return None
    try:
        from torch._C._profiler import _EventType
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as warm:
        # a probe block, so that a profiler which reports no allocations reads as None below
        # (not as a call that held nothing)
        probe = torch.empty(256)
        del probe
        fn()  # the profiler learns the sizes of the blocks this call leaves behind
    if not _cpu_allocation_events(warm, _EventType):
        return None  # no events, or the private event tree changed in this torch
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = _cpu_allocation_events(prof, _EventType)
    if events is None:  # pragma: no cover - the same tree read a moment ago
        return None
    if not events:
        return 0  # fn allocated nothing
    events.sort(key=lambda e: e[0])
    base = events[0][2] - events[0][1]  # the total before the first event
    return max(0, max(total for _, _, total in events) - base)


def _cpu_allocation_events(prof: Any, event_type: Any) -> Optional[List[Tuple[int, int, int]]]:
    r"""``(time, size, allocator total)`` of each CPU allocation event a memory profile recorded
    (frees are events of negative size), from the profiler's private event tree; ``None`` where
    that tree is not there in this torch."""
    events = []
    try:
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            ev = stack.pop()
            if ev.tag == event_type.Allocation and ev.extra_fields.device.type == 'cpu':
                events.append((ev.start_time_ns, ev.extra_fields.alloc_size,
                               ev.extra_fields.total_allocated))
            stack.extend(ev.children)
    except AttributeError:
        return None
    return events


def _cpu_attention_flops() -> Dict[Any, Callable[..., int]]:
    r"""Flop formulas for the CPU kernels of ``scaled_dot_product_attention``, which
    :class:`~torch.utils.flop_counter.FlopCounterMode` (torch 2.13) does not count (it counts the
    CUDA kernels and the math path's matrix products). Counted as the math path's products
    count, :math:`4 B H L S E` forward and twice that backward, so that a call counts alike on
    either CPU path (torch's formula for the CUDA flash backward also counts its recomputation
    of the scores, 2.5 times the forward)."""
    from torch.utils import flop_counter as fc
    aten = torch.ops.aten
    mapping: Dict[Any, Callable[..., int]] = {}
    forward = getattr(aten, '_scaled_dot_product_flash_attention_for_cpu', None)
    backward = getattr(aten, '_scaled_dot_product_flash_attention_for_cpu_backward', None)
    if forward is not None and forward not in fc.flop_registry:

        def forward_flops(query_shape, key_shape, value_shape, *args, out_shape=None,
                          **kwargs) -> int:
            return fc.sdpa_flop_count(query_shape, key_shape, value_shape)

        mapping[forward] = forward_flops
    if backward is not None and backward not in fc.flop_registry:

        def backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args,
                           out_shape=None, **kwargs) -> int:
            return 2 * fc.sdpa_flop_count(query_shape, key_shape, value_shape)

        mapping[backward] = backward_flops
    return mapping


def count_flops(fn: Callable[[], None]) -> int:
    r"""Floating-point operations of one call of :obj:`fn` (forward and backward) as counted by
    :class:`torch.utils.flop_counter.FlopCounterMode`: matrix products and attention kernels
    only, so element-wise work is not included. Torch's counter skips the CPU kernels of
    ``scaled_dot_product_attention``; they are counted here as the math path's products count
    (:math:`4 B H L S E` forward, twice that backward), so attention counts alike on either
    CPU path.

    Torch's counter tracks modules with global module hooks, and with global hooks installed
    torch_mz's exact fast paths that read a layer's weights directly (PMA's folded maps,
    :class:`~torch_mz.nn.blocks.FeedForward`'s training path, EGNN's per-node first layer, the
    input projection's affine generators) step aside for the plain calls, so that hooks see them
    (:func:`torch_mz.nn._context._hooked`): the
    count would be of another computation than the one timed (the ``mz`` training step counted
    73.1 GFLOP instead of 66.7). The module tracker is left out here: every FLOP is counted
    under ``'Global'`` alone, and the model runs as it does when it is timed."""
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False, custom_mapping=_cpu_attention_flops())
    counter.mod_tracker = _GlobalOnly()  # type: ignore[assignment]
    with counter:
        fn()
    return int(counter.get_total_flops())


class _GlobalOnly:
    r"""Stands in for :class:`torch.utils.flop_counter.FlopCounterMode`'s module tracker: no
    hooks, and the only parent is ``'Global'``."""
    parents = {'Global'}

    def __enter__(self) -> '_GlobalOnly':
        return self

    def __exit__(self, *args: object) -> None:
        return None


def matmul_peak_flops(n: int = 2048, repeats: int = 5,
                      device: Optional[torch.device] = None) -> float:
    r"""Measured FLOP/s of a dense :math:`n \times n` float32 matrix product (median of
    :obj:`repeats`): the practical peak that achieved FLOP/s are compared with. An :obj:`n` or
    :obj:`repeats` below 1 raises a :class:`ValueError` (they gave 0 or NaN FLOP/s)."""
    n = check_count('n', n)
    device = torch.device(device or 'cpu')
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device)
    b = torch.randn(n, n, generator=g).to(device)
    times = time_call(lambda: torch.mm(a, b), repeats=repeats, warmup=1, device=device)
    return 2.0 * n**3 / float(np.median(times))


#: What PyTorch's CPU allocator and CUDA say when memory runs out (a plain RuntimeError there)
NO_MEMORY = ("can't allocate memory", 'out of memory')


def out_of_memory(e: BaseException) -> bool:
    r"""Whether the error :obj:`e` of a measurement says that memory ran out (NumPy's
    :class:`MemoryError`, PyTorch's :class:`~torch.OutOfMemoryError` and its CPU allocator's
    RuntimeError): a failure a benchmark's report lists. Any other error is a bug's, with its
    traceback."""
    return isinstance(e, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(e, RuntimeError) and any(m in str(e).lower() for m in NO_MEMORY))


class MeasurementFailed(RuntimeError):
    r"""A measurement in a fresh process (:func:`in_fresh_process`) gave no result; the message
    says why in one line."""


def in_fresh_process(script: str, config: Dict[str, Any],
                     timeout: Optional[float] = None,
                     env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    r"""Runs ``python <script> --_one '<config as JSON>'`` in a fresh process and returns the
    JSON object the script prints on its last line of output: a measurement (peak memory above
    all) that must not see what this process has allocated or compiled before.

    Args:
        script (str): The benchmark script; its ``--_one`` option measures one configuration.
        config (dict): The configuration, passed as JSON.
        timeout (float, optional): Seconds before the child is stopped. (default: :obj:`None`)
        env (dict, optional): Environment variables set for the child on top of this
            process's (e.g. ones PyTorch reads once, at import). (default: :obj:`None`)

    Raises:
        MeasurementFailed: the child timed out, was killed by a signal (out of memory?) or
            failed (the last line it wrote to stderr).
    """
    try:
        out = subprocess.run([sys.executable, os.path.abspath(script), '--_one',
                              json.dumps(config)], capture_output=True, text=True,
                             timeout=timeout,
                             env=None if env is None else dict(os.environ, **env))
    except subprocess.TimeoutExpired:
        raise MeasurementFailed(f'timed out after {timeout:.0f} s') from None
    if out.returncode < 0:
        raise MeasurementFailed(f'killed by signal {-out.returncode} (out of memory?)')
    if out.returncode != 0:
        raise MeasurementFailed((out.stderr.strip().splitlines()
                                 or [f'exited with status {out.returncode}'])[-1][:200])
    lines = out.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):  # (no output, or a last line that is not the result)
        raise MeasurementFailed('the measuring process printed no result' if not lines else
                                f'the measuring process ended with {lines[-1][:120]!r}, not '
                                f'its JSON result') from None


def code_version() -> Optional[str]:
    r"""The git commit of the ``torch_mz`` package being run (``'<hash>-dirty'`` when its files
    differ from that commit), or :obj:`None` where the package is not a tracked folder of a git
    checkout (an installed copy, also one in a virtual environment inside a checkout)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the torch_mz folder
    try:
        tracked = subprocess.run(['git', '-C', here, 'ls-files', '--error-unmatch',
                                  '__init__.py'], capture_output=True, text=True, timeout=30)
        if tracked.returncode != 0:
            return None
        head = subprocess.run(['git', '-C', here, 'rev-parse', '--short=10', 'HEAD'],
                              capture_output=True, text=True, timeout=30)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(['git', '-C', here, 'status', '--porcelain',
                                '--untracked-files=no', '--', '.'],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ('-dirty' if dirty.stdout.strip() else '')


def _cpu_model() -> Optional[str]:
    r"""The CPU's model name as Linux reports it (``/proc/cpuinfo``), else the platform's
    processor name, or :obj:`None`."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def _cpu_capability() -> Optional[str]:
    r"""The vector instruction set ATen's CPU kernels dispatch to (e.g. ``'AVX512'``)."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):  # pragma: no cover (older torch)
        return None


def environment() -> Dict[str, object]:
    r"""Versions and hardware the measurement ran on: among them ``torch_mz``, the package's
    version, which identifies an installed copy (``torch_mz_commit``, from git, is
    :obj:`None` there)."""
    import torch_geometric

    from torch_mz import __version__
    info = {
        'python': platform.python_version(),
        'platform': platform.platform(),
        'processor': platform.processor() or platform.machine(),
        'cpu_count': os.cpu_count(),
        'cpu_model': _cpu_model(),
        'cpu_capability': _cpu_capability(),
        'torch': torch.__version__,
        'torch_mz': __version__,
        'torch_mz_commit': code_version(),
        'torch_geometric': torch_geometric.__version__,
        'torch_scatter': WITH_TORCH_SCATTER,
        'threads': torch.get_num_threads(),
        'cuda': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        'command': shlex.join([os.path.basename(sys.executable)] + sys.argv),
    }
    return info
