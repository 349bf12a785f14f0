import os
import sys
import textwrap

import pytest
import torch

from torch_mz.study.measure import (MeasurementFailed, allocator_peak_bytes, count_flops,
                                    environment, in_fresh_process, matmul_peak_flops,
                                    peak_memory_bytes, skewed_sizes, time_call,
                                    uniform_sizes)


def test_set_size_generators():
    sizes = skewed_sizes(64, 8192, sigma=1.0, seed=0)
    assert sum(sizes) == 8192 and min(sizes) >= 1 and max(sizes) > 3 * 8192 / 64
    assert skewed_sizes(64, 8192, seed=0) == sizes  # seeded
    assert uniform_sizes(3, 10) == [4, 3, 3]
    with pytest.raises(ValueError):
        skewed_sizes(10, 5)


def test_flop_count_of_a_matrix_product():
    a = torch.randn(64, 32)
    b = torch.randn(32, 16)
    assert count_flops(lambda: a @ b) == 2 * 64 * 32 * 16
    assert matmul_peak_flops(n=128, repeats=2) > 0


def test_flop_count_runs_the_model_as_it_is_timed():
    r"""Counting installs no global module hooks (torch's counter tracks modules with them, and
    with them torch_mz's exact fast paths step aside for plain calls): a PMA with a folded
    feed-forward counts the same FLOPs as the computation that runs without the counter, fewer
    than with a global hook installed."""
    from torch.nn.modules import module as module_state

    from torch_mz.nn import MZAggregation
    seen = []

    def probe():
        seen.append(bool(module_state._global_forward_hooks
                         or module_state._global_forward_pre_hooks))
    count_flops(probe)
    assert seen == [False]
    torch.manual_seed(0)
    aggr = MZAggregation(8, value='rigid', num_generators=0, num_encoder_blocks=0,
                         num_decoder_blocks=0, d_ff=8)
    x, index = torch.randn(40, 8), torch.arange(4).repeat_interleave(10)
    plain = count_flops(lambda: aggr(x, index))
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        hooked = count_flops(lambda: aggr(x, index))
    finally:
        handle.remove()
    assert plain < hooked


@pytest.mark.parametrize('masked', [False, True])
def test_attention_counts_alike_on_every_kernel(masked):
    # torch's counter skips the CPU flash-attention kernels; ours counts them with its CUDA
    # formulas: forward 4 B H L S E, backward twice that, as the math path's products count
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, H, L, S, E = 3, 2, 5, 7, 4
    q = torch.randn(B, H, L, E, requires_grad=True)
    k = torch.randn(B, H, S, E, requires_grad=True)
    v = torch.randn(B, H, S, E, requires_grad=True)
    mask = torch.rand(B, 1, L, S) > 0.3 if masked else None
    mask = None if mask is None else mask | torch.eye(L, S, dtype=torch.bool)

    def forward():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    counts = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
        with sdpa_kernel(backend):
            counts[backend, 'forward'] = count_flops(lambda: forward())
            counts[backend, 'both'] = count_flops(lambda: forward().sum().backward())
    expected = 4 * B * H * L * S * E
    assert counts[SDPBackend.FLASH_ATTENTION, 'forward'] == expected
    assert counts[SDPBackend.FLASH_ATTENTION, 'both'] == 3 * expected
    assert counts[SDPBackend.MATH, 'forward'] == expected
    assert counts[SDPBackend.MATH, 'both'] == 3 * expected


def _can_reset_peak_rss() -> bool:
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        return False
    return True


@pytest.mark.skipif(sys.platform != 'linux' or not _can_reset_peak_rss(),
                    reason='needs a writable /proc/self/clear_refs (Linux)')
def test_peak_memory_sees_a_large_temporary():
    def allocate():
        t = torch.ones(64 * 2**20 // 4)  # 64 MiB, freed on return
        t.add_(1)
    peak = peak_memory_bytes(allocate, torch.device('cpu'))
    assert peak is not None and peak >= 48 * 2**20

def test_allocator_peak_counts_what_is_held_at_once():
    r"""Two 8 MiB tensors held together, then a third after both are freed: 16 MiB at once,
    whatever pages the C allocator maps; nothing held gives 0."""
    def allocate():
        a = torch.ones(2 * 2**20)  # 8 MiB
        b = torch.ones(2 * 2**20)
        a.add_(b)
        del a, b
        c = torch.ones(2 * 2**20)
        c.add_(1)
    peak = allocator_peak_bytes(allocate, torch.device('cpu'))
    assert peak is not None and 16 * 2**20 <= peak < 17 * 2**20
    assert allocator_peak_bytes(lambda: None, torch.device('cpu')) == 0
    assert allocator_peak_bytes(allocate, torch.device('meta')) is None  # no such figure


def test_allocator_peak_subtracts_blocks_freed_from_an_earlier_call():
    r"""A step that frees what the previous step left (as ``zero_grad(set_to_none=True)`` frees
    the gradients) and allocates as much again holds no more than before it."""
    kept = [torch.ones(4 * 2**20)]  # 16 MiB from before the measurement

    def step():
        kept.pop()  # frees the previous block
        kept.append(torch.ones(4 * 2**20))
    assert allocator_peak_bytes(step, torch.device('cpu')) == 0


def test_allocator_peak_is_none_where_the_profiler_reports_no_allocations(monkeypatch):
    r"""A profiler that records no allocation events (or a torch whose private event tree is
    gone) gives None, unknown, not 0 (a call that held nothing): the warm-up call allocates a
    probe block, which a reporting profiler always sees."""
    from torch_mz.study import measure
    seen = []

    def no_events(prof, event_type):
        seen.append(prof)
        return []
    monkeypatch.setattr(measure, '_cpu_allocation_events', no_events)
    assert allocator_peak_bytes(lambda: torch.ones(2**20), torch.device('cpu')) is None
    assert len(seen) == 1  # read the warm-up profile, then stopped
    monkeypatch.setattr(measure, '_cpu_allocation_events', lambda prof, event_type: None)
    assert allocator_peak_bytes(lambda: torch.ones(2**20), torch.device('cpu')) is None


def test_allocator_peak_lets_errors_of_the_call_through():
    def fail():
        raise RuntimeError('boom')
    with pytest.raises(RuntimeError, match='boom'):
        allocator_peak_bytes(fail, torch.device('cpu'))



def test_peak_memory_is_none_where_it_cannot_be_read(monkeypatch):
    monkeypatch.setattr(sys, 'platform', 'darwin')
    assert peak_memory_bytes(lambda: None, torch.device('cpu')) is None


def test_environment_records_versions_and_command():
    env = environment()
    assert {'python', 'torch', 'torch_geometric', 'cpu_count', 'threads', 'command'} <= set(env)
    assert isinstance(env['torch_scatter'], bool)
    # the hardware the figures depend on: the CPU (where Linux or the platform names it) and
    # the vector instruction set ATen dispatches to
    assert env['cpu_capability'] == str(torch.backends.cpu.get_cpu_capability())
    assert env['cpu_model'] is None or (isinstance(env['cpu_model'], str) and env['cpu_model'])


def test_environment_records_the_torch_mz_version(monkeypatch):
    # an installed copy is not a git checkout: its results name the package by its version,
    # where the commit (from git) is None
    import torch_mz
    import torch_mz.study.measure as measure
    monkeypatch.setattr(measure, 'code_version', lambda: None)
    env = environment()
    assert env['torch_mz_commit'] is None
    assert env['torch_mz'] == torch_mz.__version__


# A script as the operator benchmarks write them: --_one measures one configuration (here it
# doubles n, or fails as the configuration asks) and prints it as JSON on its last line.
CHILD = textwrap.dedent("""
    import json, os, signal, sys, time
    cfg = json.loads(sys.argv[sys.argv.index('--_one') + 1])
    print('a progress line first')
    if cfg.get('fail'):
        sys.exit('ValueError: no such configuration')
    if cfg.get('kill'):
        os.kill(os.getpid(), signal.SIGKILL)
    if cfg.get('sleep'):
        time.sleep(cfg['sleep'])
    print(json.dumps(dict(cfg, twice=2 * cfg['n'], pid=os.getpid(),
                          extra=os.environ.get('TORCH_MZ_TEST_EXTRA'),
                          path=os.environ.get('PATH'))))
""")


def test_in_fresh_process_returns_the_last_json_line(tmp_path, monkeypatch):
    script = tmp_path / 'child.py'
    script.write_text(CHILD)
    out = in_fresh_process(str(script), dict(n=21))
    assert out['n'] == 21 and out['twice'] == 42
    assert out['pid'] != os.getpid()
    # env: variables set for the child on top of this process's (which it still sees)
    monkeypatch.setenv('TORCH_MZ_TEST_EXTRA', 'parent')
    assert in_fresh_process(str(script), dict(n=1))['extra'] == 'parent'
    out = in_fresh_process(str(script), dict(n=1), env=dict(TORCH_MZ_TEST_EXTRA='child'))
    assert out['extra'] == 'child' and os.environ['TORCH_MZ_TEST_EXTRA'] == 'parent'
    assert out['path'] == os.environ.get('PATH')


@pytest.mark.parametrize('cfg,timeout,reason', [
    (dict(n=1, fail=True), None, 'ValueError: no such configuration'),
    (dict(n=1, kill=True), None, 'killed by signal 9 (out of memory?)'),
    (dict(n=1, sleep=30), 1, 'timed out after 1 s'),
])
def test_in_fresh_process_says_why_a_measurement_failed(tmp_path, cfg, timeout, reason):
    script = tmp_path / 'child.py'
    script.write_text(CHILD)
    with pytest.raises(MeasurementFailed) as info:
        in_fresh_process(str(script), cfg, timeout=timeout)
    assert str(info.value) == reason


def test_time_interleaved_runs_every_function_once_per_round_in_rotated_order():
    r"""Warm-up calls first; then each round calls every function once, the starting one moving
    by one place per round, and each function gets one time per round."""
    from torch_mz.study import time_interleaved
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in 'abc'}
    times = time_interleaved(fns, repeats=4, warmup=1)
    assert calls[:3] == ['a', 'b', 'c']  # warm-up
    assert calls[3:] == ['a', 'b', 'c', 'b', 'c', 'a', 'c', 'a', 'b', 'a', 'b', 'c']
    assert set(times) == {'a', 'b', 'c'}
    assert all(len(t) == 4 and min(t) >= 0 for t in times.values())


@pytest.mark.parametrize('body, reason', [
    ('pass', 'the measuring process printed no result'),
    ("print('done')", "the measuring process ended with 'done', not its JSON result"),
    ('import sys; sys.exit(2)', 'exited with status 2'),
])
def test_in_fresh_process_names_a_child_that_gives_no_result(tmp_path, body, reason):
    # (an IndexError, a JSONDecodeError, and "killed" for a plain exit status)
    script = tmp_path / 'child.py'
    script.write_text(body + '\n')
    with pytest.raises(MeasurementFailed) as info:
        in_fresh_process(str(script), dict(n=1))
    assert str(info.value) == reason


@pytest.mark.parametrize('num_sets,total', [(3, 2), (3, -1), (0, 5), (-1, 5), (2.0, 4)])
def test_uniform_sizes_refuses_what_leaves_a_set_empty(num_sets, total):
    # (3, 2) gave [1, 1, 0], (3, -1) [0, 0, -1], (0, 5) a ZeroDivisionError
    with pytest.raises(ValueError):
        uniform_sizes(num_sets, total)
    assert uniform_sizes(3, 3) == [1, 1, 1]


@pytest.mark.parametrize('num_sets,total,sigma', [
    (0, 0, 1.0), (0, 5, 1.0), (2.0, 4, 1.0), (3, 10.5, 1.0), (3, 10, float('nan')),
    (3, 10, float('inf')), (3, 10, -1.0), (64, 8192, 1000.0)])
def test_skewed_sizes_refuses_what_gives_no_sizes(num_sets, total, sigma):
    # (0, 0) gave [], (0, 5) numpy's argmax error; a total that is no integer, a NaN or infinite
    # sigma, or one whose weights overflow never returned (the rounding loop never met total)
    with pytest.raises(ValueError):
        skewed_sizes(num_sets, total, sigma=sigma)
    assert sum(skewed_sizes(3, 10, sigma=0.0)) == 10


@pytest.mark.parametrize('kwargs', [dict(repeats=0), dict(repeats=-1), dict(warmup=-1),
                                    dict(repeats=2.5)])
def test_timing_refuses_no_repeats(kwargs):
    # repeats=0 gave no times, and their median NaN (matmul_peak_flops returned nan FLOP/s)
    from torch_mz.study import time_interleaved
    with pytest.raises(ValueError):
        time_call(lambda: None, **kwargs)
    with pytest.raises(ValueError):
        time_interleaved({'a': lambda: None}, **kwargs)
    if 'repeats' in kwargs:
        with pytest.raises(ValueError):
            matmul_peak_flops(n=8, repeats=kwargs['repeats'])
    with pytest.raises(ValueError):
        matmul_peak_flops(n=0, repeats=1)
    assert len(time_call(lambda: None, repeats=1, warmup=0, device='cpu')) == 1
