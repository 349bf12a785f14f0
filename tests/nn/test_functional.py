import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_mz.nn import functional
from torch_mz.nn.functional import _bucket_size, grouped_attention, set_mean, set_std
from tests.nn._sets import make_index
from tests.nn._grads import assert_graph_branch_gradients_match


def _reference(q, k, v, query_set, kv_set):
    r"""Per-query loop: softmax over the keys of the query's set."""
    out = torch.zeros(q.size(0), q.size(1), v.size(-1), dtype=v.dtype)
    for i in range(q.size(0)):
        keys = kv_set == query_set[i]
        if keys.any():
            a = torch.softmax(torch.einsum('hd,jhd->hj', q[i], k[keys]), dim=-1)
            out[i] = torch.einsum('hj,jhw->hw', a, v[keys])
    return out


def _random_problem(q_sizes, k_sizes, seed, shuffle=True):
    g = torch.Generator().manual_seed(seed)
    query_set = make_index(q_sizes, shuffle=shuffle, generator=g)
    kv_set = make_index(k_sizes, shuffle=shuffle, generator=g)
    H, dk, w = 2, 3, 5
    q = torch.randn(query_set.numel(), H, dk, generator=g, dtype=torch.float64)
    k = torch.randn(kv_set.numel(), H, dk, generator=g, dtype=torch.float64)
    v = torch.randn(kv_set.numel(), H, w, generator=g, dtype=torch.float64)
    return q, k, v, query_set, kv_set


@pytest.mark.parametrize('path', ['dense', 'scatter'])
def test_paths_match_per_query_reference(path):
    q_sizes = [3, 0, 1, 7, 2, 20, 4]
    k_sizes = [4, 2, 0, 7, 1, 19, 4]
    q, k, v, query_set, kv_set = _random_problem(q_sizes, k_sizes, seed=0)
    out = grouped_attention(q, k, v, query_set, kv_set, len(q_sizes), path=path)
    torch.testing.assert_close(out, _reference(q, k, v, query_set, kv_set))
    # queries of set 2 have no keys: zero output
    assert torch.equal(out[query_set == 2], torch.zeros_like(out[query_set == 2]))



@pytest.mark.parametrize('path', ['dense', 'scatter'])
@pytest.mark.parametrize('chunk', [None, 2])
def test_no_query_key_pair_keeps_queries_keys_and_values_in_the_graph(path, chunk):
    # no key (an input without rows) or none in a query's set: the zeros came detached, so
    # out.sum().backward() raised (nothing required a gradient) and torch.autograd.grad found
    # the queries unused; as a scatter (PyG's) gives, each now gets its zero gradient
    q = torch.randn(3, 2, 4, dtype=torch.float64)
    q[0, 0, 0] = float('nan')  # (a query's entries never reach the zeros)
    query_set = torch.tensor([0, 1, 1])
    for kv_set in (torch.zeros(0, dtype=torch.long), torch.tensor([2, 2])):
        k, v = torch.randn(2, kv_set.numel(), 2, 4, dtype=torch.float64).unbind(0)
        ins = [t.clone().requires_grad_() for t in (q, k, v)]
        out = grouped_attention(*ins, query_set, kv_set, 3, path=path, chunk=chunk)
        assert out.requires_grad and out.shape == ((3, 2, 4) if chunk is None else (3, 2, 2, 2))
        assert torch.equal(out, torch.zeros_like(out)) and not out.signbit().any()
        grads = torch.autograd.grad(out.sum(), ins)
        assert all(torch.equal(g, torch.zeros_like(t)) for g, t in zip(grads, ins))
        # shared values, several of them
        outs = grouped_attention(ins[0], ins[1], (v[:, 0], v[:, 1]), query_set, kv_set, 3,
                                 path=path)
        assert all(o.requires_grad and not o.any() for o in outs)
        torch.autograd.grad(sum(o.sum() for o in outs), ins[:2])
    out = grouped_attention(q, k, v, query_set, kv_set, 3, path=path)  # (none requires one)
    assert not out.requires_grad and out.grad_fn is None


@pytest.mark.parametrize('merge', [True, False])
def test_many_buckets_match_reference(monkeypatch, merge):
    r"""Without merging every rounded size is its own bucket; merging joins some of them."""
    q_sizes = [1, 2, 3, 5, 9, 17, 33, 0, 12, 200]
    k_sizes = [40, 1, 3, 6, 9, 15, 30, 2, 0, 180]
    keys = torch.stack([_bucket_size(torch.tensor(q_sizes)), _bucket_size(torch.tensor(k_sizes))],
                       dim=1)
    sizes = torch.stack([torch.tensor(q_sizes), torch.tensor(k_sizes)], dim=1)
    merged, _ = functional._merge_buckets(keys, sizes, pair_cost=2 * (3 + 5))
    if not merge:
        monkeypatch.setattr(functional, 'MERGE_RATIO', 1.0)
        monkeypatch.setattr(functional, 'MERGE_OVERHEAD', 0)
        separate, _ = functional._merge_buckets(keys, sizes, pair_cost=2 * (3 + 5))
        assert separate.size(0) == torch.unique(keys, dim=0).size(0) > merged.size(0) > 1
    q, k, v, query_set, kv_set = _random_problem(q_sizes, k_sizes, seed=11)
    out = grouped_attention(q, k, v, query_set, kv_set, len(q_sizes), path='dense')
    torch.testing.assert_close(out, _reference(q, k, v, query_set, kv_set))

def _class_stats(keys: torch.Tensor, sizes: torch.Tensor):
    r"""The size classes of :func:`functional._merge_buckets` (sets with equal rounded
    ``(n_q, n_k)``): the class of each set, and each class's largest query and key sizes and
    set count."""
    flat = keys[:, 0] * (int(keys[:, 1].max()) + 1) + keys[:, 1]
    _, inverse, counts = torch.unique(flat, return_inverse=True, return_counts=True)
    top_q = torch.zeros(counts.numel(), dtype=torch.long).scatter_reduce_(
        0, inverse, sizes[:, 0], reduce='amax')
    top_k = torch.zeros(counts.numel(), dtype=torch.long).scatter_reduce_(
        0, inverse, sizes[:, 1], reduce='amax')
    return inverse, top_q, top_k, counts


def _check_buckets(keys: torch.Tensor, sizes: torch.Tensor, pair_cost: int):
    r"""Checks the buckets of :func:`functional._merge_buckets` against its rule from the
    outside: every bucket pads its sets to its largest query and key sizes, keeps its padded
    pairs within MERGE_RATIO times its classes' pairs plus the launch allowance and its padded
    query rows and key rows within MERGE_ROWS_RATIO times its classes' rows plus
    MERGE_ROWS_OVERHEAD; buckets are runs of classes in the order of their padded pairs; and every
    split between two neighbouring buckets is forced (the next class would break one of the
    three bounds). Returns the buckets' padded ``(n_q, n_k)`` and the bucket of each set."""
    buckets, bucket_of = functional._merge_buckets(keys, sizes, pair_cost=pair_cost)
    inverse, top_q, top_k, counts = _class_stats(keys, sizes)
    U = counts.numel()
    bucket_of_class = torch.zeros(U, dtype=torch.long).scatter_(0, inverse, bucket_of)
    # every set of a class in one bucket
    assert torch.equal(bucket_of_class[inverse], bucket_of)
    overhead = functional.MERGE_OVERHEAD / max(pair_cost, 1)

    def fits(members):
        idx = torch.tensor(members)
        n = int(counts[idx].sum())
        new_q, new_k = int(top_q[idx].max()), int(top_k[idx].max())
        sep = int((counts[idx] * top_q[idx] * top_k[idx]).sum())
        rq, rk = int((counts[idx] * top_q[idx]).sum()), int((counts[idx] * top_k[idx]).sum())
        return (n * new_q * new_k <= functional.MERGE_RATIO * sep + overhead
                and n * new_q <= functional.MERGE_ROWS_RATIO * rq + functional.MERGE_ROWS_OVERHEAD
                and n * new_k <= functional.MERGE_ROWS_RATIO * rk + functional.MERGE_ROWS_OVERHEAD)

    order = torch.argsort(top_q * top_k).tolist()
    runs = [[order[0]]]
    for c in order[1:]:
        if int(bucket_of_class[c]) == int(bucket_of_class[runs[-1][-1]]):
            runs[-1].append(c)
        else:
            # a split is forced: this class would have broken a bound of the run before it
            assert not fits(runs[-1] + [c])
            runs.append([c])
    assert len(runs) == buckets.size(0)  # buckets are contiguous runs of the order
    for b, members in enumerate(runs):
        assert int(bucket_of_class[members[0]]) == b
        assert len(members) == 1 or fits(members)
        idx = torch.tensor(members)
        assert buckets[b].tolist() == [int(top_q[idx].max()), int(top_k[idx].max())]
    return buckets, bucket_of


@pytest.mark.parametrize('shape', ['pma', 'self'])
def test_merged_buckets_bound_the_padded_rows(shape):
    r"""Key sets of 1-21 rows, as in message passing on a 10^3-node graph, with one query per
    set (a PMA's seed) or as many queries as keys (self-attention): every bucket keeps its padded
    query and key rows within MERGE_ROWS_RATIO times its rows plus MERGE_ROWS_OVERHEAD, every
    split between buckets is forced, some size classes do merge, and the attention stays exact.
    With one query per set the launch allowance alone pads every set to the largest (2.1x the
    rows): the old rule gives one bucket."""
    gen = torch.Generator().manual_seed(0)
    k_sizes = (torch.poisson(torch.full((1000, ), 10.0), generator=gen).long().clamp(1, 21))
    k_sizes[0] = 21
    q_sizes = torch.ones_like(k_sizes) if shape == 'pma' else k_sizes.clone()
    keys = torch.stack([_bucket_size(q_sizes), _bucket_size(k_sizes)], dim=1)
    sizes = torch.stack([q_sizes, k_sizes], dim=1)
    pair_cost = 4 * (4 + 4)
    buckets, bucket_of = _check_buckets(keys, sizes, pair_cost)
    classes = _class_stats(keys, sizes)[3].numel()
    assert 1 < buckets.size(0) < classes  # merged, but not into one
    rows_k = int(buckets[bucket_of, 1].sum())
    assert rows_k < 1.5 * int(k_sizes.sum())
    if shape == 'pma':
        assert buckets.size(0) == 2
        # without the row bound (the old rule) one bucket holds them all
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(functional, 'MERGE_ROWS_RATIO', float('inf'))
            assert functional._merge_buckets(keys, sizes, pair_cost=pair_cost)[0].size(0) == 1
    else:
        assert int(buckets[bucket_of, 0].sum()) < 1.5 * int(q_sizes.sum())
    q, k, v, query_set, kv_set = _random_problem(q_sizes.tolist(), k_sizes.tolist(), seed=2)
    out = grouped_attention(q, k, v, query_set, kv_set, len(k_sizes), path='dense')
    torch.testing.assert_close(out, grouped_attention(q, k, v, query_set, kv_set, len(k_sizes),
                                                      path='scatter'))


@pytest.mark.parametrize('ratio, rows_ratio', [(1.0, 1.25), (0.0, 1.25), (1.0, 1.0),
                                               (4.0, 2.0)])
@pytest.mark.parametrize('q_high, k_high', [(40, 60), (60, 3), (3, 60)])
def test_merge_rule_checked_from_outside(monkeypatch, ratio, rows_ratio, q_high, k_high):
    r"""The bucket checks above hold for other settings of the rule too (so they do not pass by
    construction at one setting), on mixed query and key sizes: many queries and few keys per
    set, where the query rows bind, and the reverse, where the key rows do."""
    monkeypatch.setattr(functional, 'MERGE_RATIO', ratio)
    monkeypatch.setattr(functional, 'MERGE_ROWS_RATIO', rows_ratio)
    gen = torch.Generator().manual_seed(3)
    q_sizes = torch.randint(1, q_high, (2000, ), generator=gen)
    k_sizes = torch.randint(1, k_high, (2000, ), generator=gen)
    keys = torch.stack([_bucket_size(q_sizes), _bucket_size(k_sizes)], dim=1)
    sizes = torch.stack([q_sizes, k_sizes], dim=1)
    _check_buckets(keys, sizes, pair_cost=16)



@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=6),
       seed=st.integers(0, 1000), shuffle=st.booleans())
def test_dense_and_scatter_paths_agree(sizes, seed, shuffle):
    q, k, v, query_set, kv_set = _random_problem([s[0] for s in sizes], [s[1] for s in sizes], seed,
                                             shuffle)
    dense = grouped_attention(q, k, v, query_set, kv_set, len(sizes), path='dense')
    scatter = grouped_attention(q, k, v, query_set, kv_set, len(sizes), path='scatter')
    torch.testing.assert_close(dense, scatter)


def test_exact_dense_path_for_equal_sizes():
    q, k, v, query_set, kv_set = _random_problem([5] * 4, [5] * 4, seed=3, shuffle=False)
    # the exact path: one reshape of the rows, no packing (the packed layout agreed too, so
    # the values alone could not tell them apart)
    assert functional._compute_dense_layout(query_set, kv_set, 4, 1).uniform
    assert not functional._compute_dense_layout(query_set[:-1], kv_set, 4, 1).uniform
    dense = grouped_attention(q, k, v, query_set, kv_set, 4, path='dense')
    torch.testing.assert_close(dense, _reference(q, k, v, query_set, kv_set))
    torch.testing.assert_close(dense, grouped_attention(q, k, v, query_set, kv_set, 4,
                                                        path='scatter'))


@pytest.mark.parametrize('path', ['dense', 'scatter', 'auto'])
def test_each_path_runs_its_own_implementation(path, monkeypatch):
    # every "the two paths agree" test compares dense with scatter only if each runs what it
    # names: a grouped_attention that ignored path passed them all, dense against dense
    calls = []
    for name in ('_attention_dense', '_attention_scatter'):
        real = getattr(functional, name)
        monkeypatch.setattr(functional, name, lambda *a, _real=real, _name=name: calls.append(
            _name) or _real(*a))
    q, k, v, query_set, kv_set = _random_problem([3, 0, 6], [2, 3, 5], seed=5)
    grouped_attention(q, k, v, query_set, kv_set, 3, path=path)
    assert calls == ['_attention_scatter' if path == 'scatter' else '_attention_dense']


def test_attention_never_crosses_sets():
    q, k, v, query_set, kv_set = _random_problem([3, 4, 5], [6, 2, 3], seed=4)
    base = grouped_attention(q, k, v, query_set, kv_set, 3)
    k2, v2 = k.clone(), v.clone()
    k2[kv_set == 1] += 10.0
    v2[kv_set == 1] -= 3.0
    out = grouped_attention(q, k2, v2, query_set, kv_set, 3)
    other = query_set != 1
    torch.testing.assert_close(out[other], base[other])
    assert not torch.allclose(out[query_set == 1], base[query_set == 1])


def test_attention_gradients_agree_between_paths():
    q, k, v, query_set, kv_set = _random_problem([3, 0, 6], [2, 3, 5], seed=5)
    grads = []
    for path in ('dense', 'scatter'):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        grouped_attention(*inputs, query_set, kv_set, 3, path=path).pow(2).sum().backward()
        grads.append([t.grad for t in inputs])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


# (issue 10) every path of grouped_attention against the per-query loop, values AND gradients:
# sets of 0, 1, 2 and odd sizes, queries without keys and keys without queries, unsorted rows,
# and the exact dense path (equal sizes, sorted); float64 to 1e-10, float32 to 1e-5
_LAYOUTS = {'uneven': ([3, 0, 1, 2, 5, 1, 0], [2, 3, 1, 0, 7, 1, 0], True),
            'uniform': ([3, 3, 3], [5, 5, 5], False)}


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('layout', ['uneven', 'uniform'])
@pytest.mark.parametrize('values', ['narrow', 'wide', 'padded', 'shared', 'tuple'])
@pytest.mark.parametrize('path', ['dense', 'scatter'])
def test_every_path_equals_the_reference_in_values_and_gradients(path, values, layout, dtype,
                                                                 monkeypatch):
    r"""Per-head values as wide as the keys (the fused CPU kernel through
    ``_FlashAttentionCPU``), three times as wide (the three operations written out, or with
    ``values='padded'`` the fused kernel on zero-padded queries and keys, ``_pad_keys``),
    values shared by the heads and a tuple of them, each returned as it is and in the token
    layout (``chunk``), with and without gradients (``no_grad``, ``inference_mode``): the
    reference's values and the gradients of queries, keys and values."""
    q_sizes, k_sizes, shuffle = _LAYOUTS[layout]
    g = torch.Generator().manual_seed(21)
    query_set = make_index(q_sizes, shuffle=shuffle, generator=g)
    kv_set = make_index(k_sizes, shuffle=shuffle, generator=g)
    B, H, dk = len(q_sizes), 2, 3
    assert functional._compute_dense_layout(query_set, kv_set, B, 1).uniform == (
        layout == 'uniform')
    if values == 'padded':  # the fused kernel with padded queries and keys on these blocks
        monkeypatch.setattr(functional, 'FLASH_MIN_LEN', 1)
        monkeypatch.setattr(functional, 'FLASH_MIN_SCORES', 0)
    widths = {'narrow': [dk], 'wide': [3 * dk], 'padded': [3 * dk], 'shared': [5],
              'tuple': [5, 2]}[values]
    per_head = values in ('narrow', 'wide', 'padded')

    def draw(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    q64, k64 = draw(query_set.numel(), H, dk), draw(kv_set.numel(), H, dk)
    v64 = [draw(kv_set.numel(), H, w) if per_head else draw(kv_set.numel(), w) for w in widths]
    cot = [draw(query_set.numel(), H, w) for w in widths]  # output cotangents

    def reference():
        leaves = [t.clone().requires_grad_() for t in [q64, k64] + v64]
        outs = [_reference(leaves[0], leaves[1], v if per_head else
                           v.unsqueeze(1).expand(-1, H, -1), query_set, kv_set)
                for v in leaves[2:]]
        grads = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs, cot)), leaves)
        return [o.detach() for o in outs], list(grads)
    ref_outs, ref_grads = reference()
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    flash = []
    flash_cpu = functional._FLASH_CPU
    if flash_cpu is not None:
        monkeypatch.setattr(functional, '_FLASH_CPU', lambda *a, **kw: flash.append(
            a[0].size(-1)) or flash_cpu(*a, **kw))
    for chunk in (None, 1):
        leaves = [t.to(dtype, copy=True).requires_grad_() for t in [q64, k64] + v64]
        value_arg = leaves[2] if values != 'tuple' else tuple(leaves[2:])
        got = grouped_attention(leaves[0], leaves[1], value_arg, query_set, kv_set, B,
                                path=path, chunk=chunk)
        got = list(got) if values == 'tuple' else [got]
        if chunk is not None:  # (N_q, w, H, 1) -> (N_q, H, w)
            got = [o.squeeze(-1).transpose(1, 2) for o in got]
        grads = torch.autograd.grad(sum((o * c.to(dtype)).sum() for o, c in zip(got, cot)),
                                    leaves)
        for a, b in zip(got + list(grads), ref_outs + ref_grads):
            assert a.dtype == dtype
            torch.testing.assert_close(a.double(), b, **tol)
        for mode in (torch.no_grad, torch.inference_mode):
            with mode():
                got = grouped_attention(*[t.detach() for t in leaves[:2]],
                                        tuple(t.detach() for t in leaves[2:])
                                        if values == 'tuple' else leaves[2].detach(),
                                        query_set, kv_set, B, path=path, chunk=chunk)
            got = list(got) if values == 'tuple' else [got]
            if chunk is not None:
                got = [o.squeeze(-1).transpose(1, 2) for o in got]
            for a, b in zip(got, ref_outs):
                torch.testing.assert_close(a.double(), b, **tol)
    # each case ran the kernel it names (with gradients: the function around the fused kernel)
    if path == 'dense' and flash_cpu is not None:
        expected = {'narrow': {dk}, 'padded': {3 * dk}}.get(values, set())
        assert set(flash) == expected


def test_unknown_path():
    q, k, v, query_set, kv_set = _random_problem([2], [2], seed=0)
    with pytest.raises(ValueError, match='path'):
        grouped_attention(q, k, v, query_set, kv_set, 1, path='padded')


def test_bucket_sizes_bound_padding():
    n = torch.arange(1, 5000)
    b = _bucket_size(n)
    assert bool((b >= n).all())
    assert bool((b <= torch.ceil(1.25 * n)).all())
    assert torch.equal(b[:8], n[:8])
    assert b.unique().numel() < 60


def test_set_mean_and_std():
    x = torch.tensor([[1.0], [3.0], [5.0], [2.0]], dtype=torch.float64)
    index = torch.tensor([0, 0, 2, 0])
    mean = set_mean(x, index, 3)
    torch.testing.assert_close(mean, torch.tensor([[2.0], [0.0], [5.0]], dtype=torch.float64))
    std = set_std(x, index, 3, eps=0.0)
    torch.testing.assert_close(std, torch.tensor([[(2 / 3)**0.5], [0.0], [0.0]],
                                                 dtype=torch.float64))


@pytest.mark.parametrize('path', ['dense', 'scatter'])
@pytest.mark.parametrize('shuffle', [False, True])
def test_shared_values_equal_per_head_copies(path, shuffle):
    r"""Values shared by the heads, (N_k, w), give what the same values copied per head give."""
    q, k, v, query_set, kv_set = _random_problem([3, 0, 1, 6, 4], [2, 3, 0, 6, 4], seed=8,
                                             shuffle=shuffle)
    shared = v[:, 0]  # (N_k, w)
    out = grouped_attention(q, k, shared, query_set, kv_set, 5, path=path)
    expected = grouped_attention(q, k, shared.unsqueeze(1).expand_as(v).contiguous(), query_set,
                                 kv_set, 5, path=path)
    torch.testing.assert_close(out, expected)
    # the exact dense path (equal sizes, sorted) too
    q, k, v, query_set, kv_set = _random_problem([4] * 3, [5] * 3, seed=9, shuffle=False)
    torch.testing.assert_close(
        grouped_attention(q, k, v[:, 1], query_set, kv_set, 3, path=path),
        _reference(q, k, v[:, 1:2].expand_as(v).contiguous(), query_set, kv_set))


def test_scatter_path_chunks_pairs_exactly(monkeypatch):
    r"""Pairs are processed in chunks (no (P, H, d) intermediate); small chunks give the same
    values and gradients, and the chunked products pass gradcheck."""
    q, k, v, query_set, kv_set = _random_problem([5, 0, 9, 3], [7, 2, 8, 1], seed=12)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = grouped_attention(*inputs, query_set, kv_set, 4, path='dense')
    ref.pow(2).sum().backward()
    monkeypatch.setattr(functional, 'PAIR_CHUNK', 7)
    chunked = [t.clone().requires_grad_() for t in (q, k, v)]
    out = grouped_attention(*chunked, query_set, kv_set, 4, path='scatter')
    out.pow(2).sum().backward()
    torch.testing.assert_close(out, ref)
    for a, b in zip(chunked, inputs):
        torch.testing.assert_close(a.grad, b.grad)
    iq, jk = functional.set_pairs(query_set, kv_set, 4)
    assert torch.autograd.gradcheck(lambda a, b: functional._PairDot.apply(a, b, iq, jk),
                                    (inputs[0].detach()[:, :1].clone().requires_grad_(),
                                     inputs[1].detach()[:, :1].clone().requires_grad_()))
    alpha = torch.rand(iq.numel(), 2, dtype=torch.float64, requires_grad=True)
    for vals in (v[:, :, :2], v[:, 0, :2]):  # per head and shared
        assert torch.autograd.gradcheck(
            lambda a, b: functional._PairAggregate.apply(a, b, iq, jk, q.size(0)),
            (alpha, vals.clone().requires_grad_()))


@pytest.mark.parametrize('path', ['dense', 'scatter'])
def test_several_shared_values_use_one_attention(path):
    r"""A tuple of shared values gives what one joined value tensor gives, with one dropout draw
    for both (the same attention weights), values and gradients."""
    q, k, v, query_set, kv_set = _random_problem([3, 0, 6, 40], [2, 3, 5, 33], seed=7)
    v1, v2 = v[:, 0, :2].clone(), v[:, 1, :].clone()  # (Nk, 2), (Nk, 5)
    for training in (False, True):
        inputs = [t.clone().requires_grad_() for t in (q, k, v1, v2)]
        torch.manual_seed(0)
        a, b = grouped_attention(inputs[0], inputs[1], (inputs[2], inputs[3]), query_set, kv_set, 4,
                                 dropout=0.3, training=training, path=path)
        (a.pow(2).sum() + b.pow(3).sum()).backward()
        joined = [t.clone().requires_grad_() for t in (q, k, v1, v2)]
        torch.manual_seed(0)
        ab = grouped_attention(joined[0], joined[1], torch.cat(joined[2:], -1), query_set, kv_set, 4,
                               dropout=0.3, training=training, path=path)
        (ab[..., :2].pow(2).sum() + ab[..., 2:].pow(3).sum()).backward()
        torch.testing.assert_close(torch.cat([a, b], -1), ab)
        for x, y in zip(inputs, joined):
            torch.testing.assert_close(x.grad, y.grad)
    with pytest.raises(ValueError, match='values'):  # per-head values cannot come as a tuple
        grouped_attention(q, k, (v, v), query_set, kv_set, 4)


@pytest.mark.parametrize('groups', [3, 6])
def test_wide_values_take_the_fused_kernel_with_padded_keys_exactly(monkeypatch, groups):
    r"""Values g times as wide as the keys go to the fused kernel on big blocks with the queries
    and keys padded with zeros to their width (linear memory in the set size): same values and
    gradients as the scatter path, in float64, with masked (padded) keys and shuffled rows; not
    with dropout, nor where the values are as wide as the keys already."""
    g = torch.Generator().manual_seed(groups)
    query_set = make_index([9, 0, 11, 4], generator=g)
    kv_set = make_index([10, 3, 12, 5], generator=g)
    H, dk = 2, 3
    q = torch.randn(query_set.numel(), H, dk, generator=g, dtype=torch.float64)
    k = torch.randn(kv_set.numel(), H, dk, generator=g, dtype=torch.float64)
    v = torch.randn(kv_set.numel(), H, groups * dk, generator=g, dtype=torch.float64)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = grouped_attention(*ref, query_set, kv_set, 4, path='scatter')
    expected.pow(2).sum().backward()
    monkeypatch.setattr(functional, 'FLASH_MIN_LEN', 4)
    monkeypatch.setattr(functional, 'FLASH_MIN_SCORES', 0)
    calls, flash = [], []
    sdpa, flash_cpu = functional._sdpa, functional._FLASH_CPU
    monkeypatch.setattr(functional, '_sdpa', lambda q_, k_, v_, m: calls.append(
        (q_.shape[1:], k_.size(-1), v_.size(-1))) or sdpa(q_, k_, v_, m))
    monkeypatch.setattr(functional, '_FLASH_CPU', lambda *a, **kw: flash.append(
        a[0].size(-1)) or flash_cpu(*a, **kw))
    padded = [t.clone().requires_grad_() for t in (q, k, v)]
    out = grouped_attention(*padded, query_set, kv_set, 4, path='dense')
    out.pow(2).sum().backward()
    # the kernel ran with H heads and queries and keys as wide as the values: PyTorch's fused
    # CPU kernel (where this torch has it) with gradients
    assert calls and all(c[0][0] == H and c[0][-1] == c[1] == c[2] == groups * dk
                         for c in calls)
    if flash_cpu is not None:
        assert flash and set(flash) == {groups * dk}
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    for a, b in zip(padded, ref):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-10)
    # without gradients SDPA itself runs on the padded inputs: the same values (its scale, 1,
    # set explicitly: its default would be that of the padded width)
    calls.clear()
    with torch.no_grad():
        torch.testing.assert_close(grouped_attention(q, k, v, query_set, kv_set, 4,
                                                     path='dense'), expected.detach(),
                                   rtol=1e-10, atol=1e-10)
    assert calls and all(c[1] == groups * dk for c in calls)
    assert not functional._pad_keys(1, H, 300, 300, dk, groups * dk, p=0.1)  # dropout
    assert not functional._pad_keys(1, H, 300, 300, dk, dk, p=0.0)  # already fused
    assert not functional._pad_keys(1, H, 3, 300, dk, groups * dk, p=0.0)  # a small block


def test_per_head_dropout_is_softmax_dropout_product():
    # with dropout on the CPU the per-head path writes out softmax -> dropout -> product: the
    # same seed gives exactly that (mask included), and the expected output over many draws is
    # the output without dropout (inverted dropout is unbiased)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(3, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False  # padded keys of the second set
    torch.manual_seed(7)
    out = functional._attend_per_head(q, k, v, mask, 0.3)
    torch.manual_seed(7)
    a = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~mask, float('-inf')), dim=-1)
    assert torch.equal(out, functional.dropout(a, 0.3) @ v)
    assert torch.isfinite(out).all()  # padded keys are never attended
    mean = torch.stack([functional._attend_per_head(q, k, v, mask, 0.3)
                        for _ in range(4000)]).mean(0)
    torch.testing.assert_close(mean, functional._attend_per_head(q, k, v, mask, 0.0),
                               atol=0.1, rtol=0.0)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16])
def test_dropout_keeps_each_entry_with_probability_one_minus_p_and_rescales(dtype):
    # inverted dropout: entries kept with probability 1 - p (binomial, 6 standard deviations),
    # kept entries are x / (1 - p) exactly as the mask's rounding gives it, the others zero; the
    # gradient is the same mask; the same seed draws the same mask
    p, n = 0.3, 200_000
    x = (torch.rand(n, dtype=torch.float64) + 0.5).to(dtype).requires_grad_()
    torch.manual_seed(3)
    y = functional.dropout(x, p)
    kept = y != 0
    frac = kept.double().mean().item()
    assert abs(frac - (1 - p)) < 6 * (p * (1 - p) / n) ** 0.5
    scale = torch.ones((), dtype=dtype).div(1 - p)
    assert torch.equal(y[kept], x.detach()[kept] * scale)
    g = torch.randn(n, dtype=dtype)
    y.backward(g)
    assert torch.equal(x.grad, g * kept.to(dtype) * scale)
    torch.manual_seed(3)
    assert torch.equal(functional.dropout(x, p), y)
    assert y.dtype == dtype


@pytest.mark.parametrize('backend', ['aot_eager', pytest.param('inductor',
                                                                  marks=pytest.mark.slow)])
def test_compiled_dropout_draws_the_eager_mask(backend):
    r"""Under :func:`torch.compile` (CPU) the mask is the operator
    ``torch_mz::dropout_keep_mask``: the same draws as eager under the same seed, the gradient
    multiplied by that mask, and two dropouts of one tensor in one graph drawn apart (the
    operator is tagged random: never merged)."""
    torch._dynamo.reset()
    x = torch.randn(64, 32, requires_grad=True)

    def two(t):
        return functional.dropout(t, 0.3), functional.dropout(t, 0.3)

    torch.manual_seed(3)
    eager = two(x)
    compiled = torch.compile(two, backend=backend, dynamic=False)
    for _ in range(2):
        torch.manual_seed(3)
        got = compiled(x)
        for a, b in zip(eager, got):
            assert torch.equal(a, b)
    assert not torch.equal(got[0], got[1])
    grad = torch.randn(64, 32)
    (g, ) = torch.autograd.grad(got[0], x, grad)
    assert torch.equal(g, grad * (got[0] != 0).to(grad.dtype).div_(0.7))


class _Dropout(torch.nn.Module):
    def forward(self, x):
        return functional.dropout(x, 0.5, training=self.training)


def test_exported_dropout_keeps_the_mask_operator_in_training_only():
    r""":func:`torch.export.export` of a module with this dropout: in eval mode the graph holds no
    ``torch_mz`` operator and is the identity; in training mode it holds
    ``torch_mz::dropout_keep_mask``, runs, draws eager's mask under the same seed and a new one
    at the next call."""
    x = torch.ones(64, 5)
    for training in (False, True):
        program = torch.export.export(_Dropout().train(training), (x, ))
        ops = [str(n.target) for n in program.graph.nodes if n.op == 'call_function']
        assert ('torch_mz.dropout_keep_mask.default' in ops) == training
        assert not any('torch_mz' in op for op in ops if 'dropout_keep_mask' not in op)
        torch.manual_seed(0)
        first, second = program.module()(x), program.module()(x)
        if not training:
            assert torch.equal(first, x) and torch.equal(second, x)
    torch.manual_seed(0)
    assert torch.equal(first, functional.dropout(x, 0.5))
    assert not torch.equal(first, second)
    assert set(first.unique().tolist()) == {0.0, 2.0}


def test_shared_set_ids_changed_unseen_by_the_version_counter_are_made_again():
    # repeat_per_set hands every block the same tensor; a NumPy write to it (no version
    # counter moves) had changed the seed ids of every later model in the process
    from torch_mz.nn import MZAggregation
    torch.manual_seed(0)
    aggr = MZAggregation(4, 3).double().eval()
    x, index = torch.randn(20, 4).double(), torch.tensor([0] * 5 + [1] * 7 + [2] * 8)
    expected = aggr(x, index)
    shared = functional.repeat_per_set(3, aggr.num_seeds, 'cpu')
    assert functional.repeat_per_set(3, aggr.num_seeds, 'cpu') is shared  # (kept)
    shared.numpy()[0] = 1
    assert functional.repeat_per_set(3, 1, 'cpu').tolist() == [0, 1, 2]
    torch.testing.assert_close(aggr(x, index), expected, rtol=0, atol=0)


def test_dropout_off_and_elsewhere():
    x = torch.randn(5, 4, requires_grad=True)
    assert functional.dropout(x, 0.5, training=False) is x
    assert functional.dropout(x, 0.0) is x
    assert torch.equal(functional.dropout(x, 1.0), torch.zeros(5, 4))  # as F.dropout
    torch.autograd.gradcheck(lambda t: (torch.manual_seed(0), functional.dropout(t, 0.4))[1],
                             (torch.randn(6, 3, dtype=torch.float64, requires_grad=True), ))


def test_values_of_a_wrong_shape_are_refused():
    q, k, v, query_set, kv_set = _random_problem([2], [3], seed=0)
    with pytest.raises(ValueError, match='values'):
        grouped_attention(q, k, v[:2], query_set, kv_set, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA not available')
@pytest.mark.parametrize('path', ['dense', 'scatter'])
def test_cuda_attention_matches_cpu(path):
    q, k, v, query_set, kv_set = _random_problem([3, 0, 1, 6, 40], [2, 3, 0, 6, 35], seed=13)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = grouped_attention(*inputs, query_set, kv_set, 5, path=path)
    ref.pow(2).sum().backward()
    cuda = [t.detach().cuda().requires_grad_() for t in (q, k, v)]
    out = grouped_attention(*cuda, query_set.cuda(), kv_set.cuda(), 5, path=path)
    out.pow(2).sum().backward()
    torch.testing.assert_close(out.cpu(), ref)
    for a, b in zip(cuda, inputs):
        torch.testing.assert_close(a.grad.cpu(), b.grad)


@pytest.mark.parametrize('path', ['dense', 'scatter'])
@pytest.mark.parametrize('q_sizes, k_sizes, shuffle', [
    ([3, 0, 1, 7, 2, 20, 4], [4, 2, 0, 7, 1, 19, 4], True),  # buckets, queries without keys
    ([5] * 4, [6] * 4, False),  # the exact dense path (a reshape, no gather)
    ([2, 3], [0, 0], False),  # no set has keys
])
def test_chunked_layout_is_a_permutation_of_the_rows(path, q_sizes, k_sizes, shuffle):
    r"""``chunk=c`` returns the same numbers as the (N_q, H, w) layout, cut into pieces of c
    features with the heads interleaved piece by piece, and the same gradients."""
    q, k, v, query_set, kv_set = _random_problem(q_sizes, k_sizes, seed=4, shuffle=shuffle)
    v = torch.randn(v.size(0), v.size(1), 6, dtype=v.dtype)  # w = 6 = 3 pieces of 2
    B = len(q_sizes)
    plain = grouped_attention(q, k, v, query_set, kv_set, B, path=path)  # (Nq, H, 6)
    chunked = grouped_attention(q, k, v, query_set, kv_set, B, path=path, chunk=2)
    assert chunked.shape == (q.size(0), 3, q.size(1), 2) and chunked.is_contiguous()
    torch.testing.assert_close(chunked, plain.view(-1, q.size(1), 3, 2).transpose(1, 2),
                               rtol=0, atol=0)
    # tuples of shared values, and gradients through the permuted copy
    vs = tuple(torch.randn(k.size(0), w, dtype=q.dtype, requires_grad=True) for w in (4, 2))
    outs = grouped_attention(q, k, vs, query_set, kv_set, B, path=path, chunk=2)
    refs = grouped_attention(q, k, vs, query_set, kv_set, B, path=path)
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out.transpose(1, 2).reshape(ref.shape), ref, rtol=0, atol=0)
    if k.size(0):
        gv = torch.autograd.grad(sum((o * o).sum() for o in outs), vs)
        gr = torch.autograd.grad(sum((o * o).sum() for o in refs), vs)
        for a, b in zip(gv, gr):
            torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="'chunk' must divide"):
        grouped_attention(q, k, v, query_set, kv_set, B, path=path, chunk=4)


def test_dense_layout_is_reused_only_for_the_same_unchanged_set_ids(monkeypatch):
    r"""Blocks attending over set ids of the same values share one layout, whatever tensor holds
    them (PyG passes a new view of ``edge_index[1]`` at every call); changed values (in place
    or in another tensor) get their own; a small entry outlives its tensors, a large one is
    dropped when they are freed; results equal those computed without the cache."""
    import gc
    calls = []
    compute = functional._compute_dense_layout
    monkeypatch.setattr(functional, '_compute_dense_layout',
                        lambda *a: calls.append(1) or compute(*a))
    monkeypatch.setattr(functional, '_layout_cache', type(functional._layout_cache)())
    q, k, v, query_set, kv_set = _random_problem([3, 0, 5, 2], [4, 2, 0, 6], seed=7)
    first = grouped_attention(q, k, v, query_set, kv_set, 4)
    again = grouped_attention(q, k, v, query_set, kv_set, 4)
    assert len(calls) == 1 and torch.equal(first, again)
    torch.testing.assert_close(first, _reference(q, k, v, query_set, kv_set))
    # the same ids in another tensor (a view of a larger one, as PyG passes them): reused
    both = torch.stack([query_set, query_set])
    other = grouped_attention(q, k, v, both[1], kv_set.clone(), 4)
    assert len(calls) == 1 and torch.equal(first, other)
    # another number of sets, or other merge settings: a layout of their own
    grouped_attention(q, k, v, query_set, kv_set, 5)
    assert len(calls) == 2
    monkeypatch.setattr(functional, 'MERGE_OVERHEAD', 0)
    grouped_attention(q, k, v, query_set, kv_set, 4)
    assert len(calls) == 3
    monkeypatch.undo()
    monkeypatch.setattr(functional, '_compute_dense_layout',
                        lambda *a: calls.append(1) or compute(*a))
    monkeypatch.setattr(functional, '_layout_cache', type(functional._layout_cache)())
    calls.clear()
    grouped_attention(q, k, v, query_set, kv_set, 4)
    # changed in place: recomputed, and right for the new sets
    query_set[:2] = 3
    changed = grouped_attention(q, k, v, query_set, kv_set, 4)
    assert len(calls) == 2
    torch.testing.assert_close(changed, _reference(q, k, v, query_set, kv_set))
    # the same values in a new tensor after the change: the new layout, not the old one
    torch.testing.assert_close(grouped_attention(q, k, v, query_set.clone(), kv_set, 4), changed)
    assert len(calls) == 2
    # without the cache: the same numbers
    monkeypatch.setattr(functional, 'LAYOUT_CACHE_SIZE', 0)
    assert torch.equal(grouped_attention(q, k, v, query_set, kv_set, 4), changed)
    monkeypatch.setattr(functional, 'LAYOUT_CACHE_SIZE', 4)
    # a small entry outlives its set ids; a large one goes when they are freed
    ids = query_set.clone()
    ids[0] = 0
    grouped_attention(q, k, v, ids, kv_set, 4)
    n = len(functional._layout_cache)
    del ids
    gc.collect()
    assert len(functional._layout_cache) == n
    monkeypatch.setattr(functional, 'LAYOUT_KEEP_ROWS', 0)
    ids = query_set.clone()
    ids[0] = 1
    grouped_attention(q, k, v, ids, kv_set, 4)
    assert len(functional._layout_cache) == min(n + 1, functional.LAYOUT_CACHE_SIZE)
    n = len(functional._layout_cache)
    del ids
    gc.collect()
    assert len(functional._layout_cache) == n - 1
    functional.clear_layout_cache()
    assert len(functional._layout_cache) == 0


def test_a_graph_aggregated_again_reuses_its_layouts(monkeypatch):
    r"""A PyG convolution called again on the same graph finds every attention layout of its
    ``MZAggregation`` in the cache (no layout is computed), with the values and gradients of a
    call without the cache."""
    from torch_geometric.nn import SAGEConv

    from torch_mz.nn import MZAggregation
    calls = []
    compute = functional._compute_dense_layout
    monkeypatch.setattr(functional, '_compute_dense_layout',
                        lambda *a: calls.append(1) or compute(*a))
    functional.clear_layout_cache()
    torch.manual_seed(0)
    edge_index = torch.stack([torch.randint(0, 30, (120, )),
                              torch.arange(30).repeat_interleave(4)])
    x = torch.randn(30, 8, dtype=torch.double)
    conv = SAGEConv(8, 8, aggr=MZAggregation(8)).double()
    grads = []
    for cache in (4, 4, 0):
        monkeypatch.setattr(functional, 'LAYOUT_CACHE_SIZE', cache)
        calls.clear()
        conv.zero_grad()
        out = conv(x, edge_index)
        out.square().sum().backward()
        grads.append((out, [p.grad.clone() for p in conv.parameters()], len(calls)))
    assert grads[0][2] == 3  # SAB, PMA and the decoder's SAB over the seeds
    assert grads[1][2] == 0 and grads[2][2] == 3
    for out, gs, _ in grads[1:]:
        torch.testing.assert_close(out, grads[0][0], rtol=0, atol=0)
        for a, b in zip(gs, grads[0][1]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    # two layers of different widths (a layout per width): six layouts, all found again
    monkeypatch.setattr(functional, 'LAYOUT_CACHE_SIZE', 12)
    functional.clear_layout_cache()
    wide = SAGEConv(8, 8, aggr=MZAggregation(8, dim=32)).double()
    counts = []
    for _ in range(2):
        calls.clear()
        wide(conv(x, edge_index), edge_index).sum().backward()
        counts.append(len(calls))
    assert counts == [6, 0]


def test_layout_cache_edge_cases(monkeypatch):
    r"""A self-attention entry does not serve cross-attention over other ids of the same shape;
    a weak reference's callback that fires while the cache is held (the cyclic garbage
    collector) queues its key, which leaves when the cache is let go; the layouts kept beyond
    their tensors are bounded in rows; nothing is taken from the cache while
    :func:`torch.jit.trace` records."""
    import warnings
    monkeypatch.setattr(functional, '_layout_cache', type(functional._layout_cache)())
    torch.manual_seed(0)
    a = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])[torch.randperm(12)]
    b = torch.tensor([0, 0, 1, 1, 1, 1, 1, 2, 2, 3, 3, 3])[torch.randperm(12)]
    q, k, v = (torch.randn(12, 2, 3, dtype=torch.double) for _ in range(3))
    grouped_attention(q, k, v, a, a, 4)  # a self-attention entry on a
    torch.testing.assert_close(grouped_attention(q, k, v, a, b, 4),
                               _reference(q, k, v, a, b))
    torch.testing.assert_close(grouped_attention(q, k, v, b, a, 4),
                               _reference(q, k, v, b, a))
    # a callback inside the cache: queued, then applied
    key = next(iter(functional._layout_cache))
    with functional._layout_cache_held():
        functional._drop_layout(key)
        assert key in functional._layout_cache and functional._layout_dropped == [key]
    assert key not in functional._layout_cache and functional._layout_dropped == []
    # at most LAYOUT_KEEP_TOTAL_ROWS rows kept beyond their tensors (the newest entry stays)
    monkeypatch.setattr(functional, 'LAYOUT_KEEP_TOTAL_ROWS', 50)
    for shift in range(4):  # 24 rows each: other values, other entries
        grouped_attention(q, k, v, (a + shift) % 4, (a + shift) % 4, 4)
    assert sum(e[5] for e in functional._layout_cache.values()) <= 50
    assert len(functional._layout_cache) == 2
    # tracing: a layout cached from the same ids before must not become the trace's constants
    functional.clear_layout_cache()
    c = a[torch.randperm(12)]  # the same set sizes, rows in another order

    def f(q, k, v, ids):
        return grouped_attention(q, k, v, ids, ids, 4)

    f(q, k, v, a.clone())
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        traced = torch.jit.trace(f, (q, k, v, a.clone()), check_trace=False)
    torch.testing.assert_close(traced(q, k, v, c), _reference(q, k, v, c, c))


def test_dense_layout_sees_writes_that_leave_the_version_alone():
    r"""Set ids refilled through ``.data`` (or a NumPy array sharing their memory) keep their
    version counter; the layout is still the one of the new ids."""
    q, k, v, query_set, kv_set = _random_problem([3, 4, 5], [4, 2, 6], seed=9)
    grouped_attention(q, k, v, query_set, kv_set, 3)
    query_set.data[:3] = 2 - query_set.data[:3]  # a write autograd does not count
    torch.testing.assert_close(grouped_attention(q, k, v, query_set, kv_set, 3),
                               _reference(q, k, v, query_set, kv_set))


def test_caches_stay_out_of_inference_mode():
    r"""Under :func:`torch.inference_mode` nothing is cached (its tensors have no version counter
    and must not reach later calls), and later calls with gradients still work."""
    from torch_mz.nn import MZAggregation
    from torch_mz.nn.functional import repeat_per_set
    aggr = MZAggregation(3, 2, dim=8)
    x, index = torch.randn(5, 3), torch.tensor([0, 0, 1, 1, 1])
    with torch.inference_mode():
        ids = repeat_per_set(2, 3, torch.device('cpu'))
        assert torch.equal(repeat_per_set(2, 3, torch.device('cpu')), ids)
        out = aggr(x, index)
        q, k, v, query_set, kv_set = _random_problem([3, 4], [4, 2], seed=1)
        grouped_attention(q, k, v, query_set, kv_set, 2)
    again = aggr(x, index)
    again.sum().backward()
    torch.testing.assert_close(again.detach(), out)
    assert not repeat_per_set(2, 3, torch.device('cpu')).is_inference()


def test_dropout_under_forward_mode_ad_and_torch_func():
    x = torch.randn(50, 4, dtype=torch.float64)
    t = torch.randn(50, 4, dtype=torch.float64)
    import torch.autograd.forward_ad as fwAD
    torch.manual_seed(5)
    with fwAD.dual_level():
        y = functional.dropout(fwAD.make_dual(x, t), 0.4)
        primal, tangent = fwAD.unpack_dual(y)
    scale = primal / x  # the mask: 0 or 1 / (1 - p), up to the rounding of the division

    def is_mask(m):
        return bool(((m == 0) | torch.isclose(m, torch.full_like(m, 1 / 0.6))).all())
    assert is_mask(scale) and (scale == 0).any() and (scale != 0).any()
    torch.testing.assert_close(tangent, t * scale)
    # torch.func transforms take F.dropout (the same distribution): gradients are the mask
    g = torch.func.grad(lambda z: functional.dropout(z, 0.4).sum())(x)
    assert is_mask(g) and (g == 0).any()


def test_dense_packing_keeps_positions_not_copies_and_has_second_derivatives():
    # the packed queries, keys and values (and the rows of queries with keys, placed among
    # those without) keep only their positions for the backward pass; gradients of gradients
    # agree with finite differences through the bucketed dense path
    q, k, v, query_set, kv_set = _random_problem([3, 0, 5, 2, 4], [4, 3, 0, 6, 1], seed=3)
    src = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    placed = functional._place(src, torch.tensor([5, 0, 2, 3]), 7)
    assert [t.shape for t in placed.grad_fn.saved_tensors] == [torch.Size([4])]
    assert torch.equal(placed[[5, 0, 2, 3]], src) and not placed[[1, 4, 6]].any()

    def f(q, k, v):
        return grouped_attention(q, k, v, query_set, kv_set, 5, path='dense')
    inputs = tuple(t.clone().requires_grad_() for t in (q, k, v))
    torch.autograd.gradcheck(f, inputs)
    torch.autograd.gradgradcheck(f, inputs)


@pytest.mark.parametrize('shuffle', [False, True])
def test_rows_are_placed_without_a_gather_when_all_take_part(monkeypatch, shuffle):
    # every set has queries and keys (the usual case): the rows are placed as they lie; the
    # values and gradients are bitwise those of the gathered rows, and match the reference
    q, k, v, query_set, kv_set = _random_problem([3, 5, 2, 9], [4, 1, 6, 8], seed=5,
                                                 shuffle=shuffle)
    lay = functional._compute_dense_layout(query_set, kv_set, 4, pair_cost=2 * (3 + 5))
    assert lay.q_all and lay.k_all and not lay.uniform
    partial = functional._compute_dense_layout(*_random_problem([3, 0, 2], [4, 1, 0], 5)[3:],
                                               3, pair_cost=2 * (3 + 5))
    assert not partial.q_all and not partial.k_all

    def run():
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = grouped_attention(*inputs, query_set, kv_set, 4, path='dense')
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
        return out.detach(), [t.grad for t in inputs]

    out, grads = run()
    torch.testing.assert_close(out, _reference(q, k, v, query_set, kv_set))
    original = functional._compute_dense_layout
    monkeypatch.setattr(functional, 'LAYOUT_CACHE_SIZE', 0)
    monkeypatch.setattr(functional, '_compute_dense_layout', lambda *a: original(*a)._replace(
        q_all=False, k_all=False))  # the gathered rows
    gathered, gathered_grads = run()
    assert torch.equal(out, gathered)
    assert all(torch.equal(a, b) for a, b in zip(grads, gathered_grads))


@pytest.mark.parametrize('path', ['dense', 'scatter'])
@pytest.mark.parametrize('preset', ['neighbourhood', 'paper'])
def test_torch_func_grad_matches_autograd(path, preset):
    # torch.func transforms take neither hand-written autograd functions without setup_context
    # nor checkpointing: the fast paths run as the plain operations they stand for, with the
    # same gradients (inputs and parameters)
    from torch.func import functional_call, grad

    from torch_mz.nn import MZAggregation
    torch.manual_seed(0)
    extra = dict(dim=16, d_ff=16) if preset == 'paper' else {}
    aggr = MZAggregation(3, preset=preset, path=path, **extra).double()
    index = torch.tensor([0] * 9 + [2] * 8 + [3])
    x = torch.randn(index.numel(), 3, dtype=torch.float64)
    params = {k: v.detach() for k, v in aggr.named_parameters()}

    def loss(p, xx):
        return functional_call(aggr, p, (xx, index), {'dim_size': 4}).square().sum()

    g_params, g_x = grad(loss, argnums=(0, 1))(params, x)
    xr = x.clone().requires_grad_()
    loss(dict(aggr.named_parameters()), xr).backward()
    torch.testing.assert_close(g_x, xr.grad, rtol=1e-10, atol=1e-12)
    for name, p in aggr.named_parameters():
        torch.testing.assert_close(g_params[name], p.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('several', [False, True])
def test_inference_drops_the_packed_buffers_before_the_outputs_are_reordered(several):
    # without gradients the packed queries, keys and values, and the buckets' own outputs, are
    # freed before the joined outputs are reordered into query order (the last gather), so
    # the peak of inference does not hold them beside both copies of the outputs; the values
    # are those of the reference
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    q, k, v, query_set, kv_set = _random_problem([3, 5, 2, 9, 4], [4, 1, 6, 8, 2], seed=7)
    values = (v[:, 0], v[:, 1]) if several else v
    created, alive_at_reorder = [], []

    class Track(TorchDispatchMode):
        # the packed buffers (new_zeros), the attention kernels' outputs, the copies that
        # bring them into query rows (clone) and the views of all these, created during the
        # call (the layout's cached 1-D positions are not followed)
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.index_select.default and args[0].size(0) > q.size(0):
                # the reorder of the joined outputs (tot_q padded rows into N_q): what is alive
                # besides the joined outputs themselves
                alive_at_reorder.append([name for name, ref in created
                                         if ref() is not None and ref() is not args[0]])
            out = func(*args, **(kwargs or {}))
            name = str(func)
            first = out[0] if isinstance(out, tuple) else out
            if ((func in (torch.ops.aten.new_zeros.default, torch.ops.aten.bmm.default,
                          torch.ops.aten.clone.default, torch.ops.aten._unsafe_view.default,
                          torch.ops.aten.view.default)
                 or name.startswith('aten._scaled_dot_product'))
                    and first.dim() >= 3):  # rows of tokens, not the layout's positions
                created.append((name, weakref.ref(first)))
            return out

    with torch.no_grad(), Track():
        out = grouped_attention(q, k, values, query_set, kv_set, 5, path='dense')
    assert len(alive_at_reorder) == (2 if several else 1)
    assert any(name == 'aten.new_zeros.default' for name, _ in created)
    # no packed buffer at any reorder; at the last one nothing else either (the outputs of a
    # value still to be joined are alive while an earlier value's are reordered)
    assert not any('new_zeros' in name for names in alive_at_reorder for name in names), \
        alive_at_reorder
    assert not alive_at_reorder[-1], alive_at_reorder
    outs = out if several else (out, )
    expected = _reference(q, k, v, query_set, kv_set)
    for i, o in enumerate(outs):
        if several:  # values shared by the heads: every head aggregates the same rows
            expected = _reference(q, k, v[:, i:i + 1].expand(-1, q.size(1), -1), query_set,
                                  kv_set)
        torch.testing.assert_close(o, expected)


@pytest.mark.parametrize('path', ['dense', 'scatter'])
@pytest.mark.parametrize('uniform', [False, True])
def test_keys_that_are_columns_of_the_values_are_packed_once(path, uniform):
    # folded keys (one head) stated to be columns of the shared values (the raw rows beside a
    # column of ones, as MZAttention passes them, `_key_col`): the same values and gradients as
    # the same keys in a tensor of their own, and on the dense path the key buffer is a view of
    # the values' buffer, so the tensors kept for the backward pass hold one packed buffer fewer
    q_sizes, k_sizes = ([3] * 4, [5] * 4) if uniform else ([3, 1, 2, 4], [6, 0, 9, 2])
    g = torch.Generator().manual_seed(3)
    query_set = make_index(q_sizes, shuffle=not uniform, generator=g)
    kv_set = make_index(k_sizes, shuffle=not uniform, generator=g)
    dk = 4
    q0 = torch.randn(query_set.numel(), 1, dk, generator=g, dtype=torch.float64)
    rows0 = torch.randn(kv_set.numel(), dk, generator=g, dtype=torch.float64)
    gens0 = torch.randn(kv_set.numel(), 6, generator=g, dtype=torch.float64)

    def run(stated):
        q, rows, gens = (t.clone().requires_grad_() for t in (q0, rows0, gens0))
        raw = torch.cat([rows.new_ones(rows.size(0), 1), rows], dim=-1)  # (Nk, 1 + dk)
        k = raw[:, 1:].unsqueeze(1) if stated else rows.unsqueeze(1)
        saved = []

        def pack(t):
            saved.append((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()))
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            outs = grouped_attention(q, k, (raw, gens), query_set, kv_set, len(q_sizes),
                                     path=path, _key_col=1 if stated else None)
        loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum()
                   for o in outs)
        loss.backward()
        return outs, (q.grad, rows.grad, gens.grad), sum(dict(saved).values())

    outs_v, grads_v, kept_v = run(True)
    outs_c, grads_c, kept_c = run(False)
    for a, b in zip(outs_v + grads_v, outs_c + grads_c):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    if path == 'dense' and not uniform:  # the packed keys: one (tot_k, 1, dk) buffer
        assert kept_c - kept_v >= kv_set.numel() * dk * 8
    else:  # the uniform path and the scatter path pack nothing: nothing changes
        assert kept_v <= kept_c


def test_keys_sharing_the_values_memory_are_read_as_given_unless_stated():
    # sharing memory is not inferred: detached keys that view the values' columns keep their
    # own (absent) gradients, as a copy of them does; a wrong statement is refused
    query_set, kv_set = make_index([2, 3]), make_index([4, 5])
    g = torch.Generator().manual_seed(4)
    q = torch.randn(5, 1, 3, generator=g, dtype=torch.float64)
    rows = torch.randn(9, 3, generator=g, dtype=torch.float64, requires_grad=True)
    raw = torch.cat([rows.new_ones(9, 1), rows], dim=-1)
    grads = []
    for k in (raw[:, 1:].detach().unsqueeze(1), rows.detach().clone().unsqueeze(1)):
        out = grouped_attention(q, k, raw, query_set, kv_set, 2, path='dense')
        grads.append(torch.autograd.grad(out.sin().sum(), rows)[0])
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    k = raw[:, 1:].unsqueeze(1)
    for bad, keys, values in ((2, k, raw),  # beyond the values' columns
                              (1, raw[:, :3].reshape(9, 1, 3)[:, :, :2], raw),  # width != q's
                              (1, k.expand(9, 2, 3), raw),  # two heads
                              (1, k, raw.unsqueeze(1)),  # values per head
                              (0, k, raw),  # not the columns the keys are a view of
                              (True, k, raw),  # not an int
                              (1, k.clone(), raw)):  # a copy, not a view
        # (keys unlike the queries are refused before the statement is read)
        with pytest.raises(ValueError, match="'_key_col'|with the same H and d_k"):
            grouped_attention(q, keys, values, query_set, kv_set, 2, _key_col=bad)


def test_torch_func_grad_matches_autograd_with_folded_keys(monkeypatch):
    # the folded keys read from the values' buffer (grouped_attention's _key_col) under
    # torch.func.grad, on uneven sets (the packed dense path): the gradients of autograd
    from torch.func import functional_call, grad

    from torch_mz.nn import MZAggregation, attention
    monkeypatch.setattr(attention, 'FOLD_MARGIN', 1e-3)  # fold these small sets
    torch.manual_seed(0)
    aggr = MZAggregation(3, dim=16, heads=2, value='rigid', num_generators=0,
                         num_encoder_blocks=0, path='dense').double()
    stated = []
    real = functional.grouped_attention
    monkeypatch.setattr(attention, 'grouped_attention',
                        lambda *a, **k: stated.append(k.get('_key_col')) or real(*a, **k))
    index = torch.tensor([0] * 9 + [2] * 8 + [3] * 3)
    x = torch.randn(index.numel(), 3, dtype=torch.float64)
    params = {k: v.detach() for k, v in aggr.named_parameters()}

    def loss(p, xx):
        return functional_call(aggr, p, (xx, index), {'dim_size': 4}).square().sum()

    g_params, g_x = grad(loss, argnums=(0, 1))(params, x)
    assert 1 in stated
    xr = x.clone().requires_grad_()
    loss(dict(aggr.named_parameters()), xr).backward()
    torch.testing.assert_close(g_x, xr.grad, rtol=1e-10, atol=1e-12)
    for name, p in aggr.named_parameters():
        if p.numel():  # (an empty parameter gets no autograd gradient)
            torch.testing.assert_close(g_params[name], p.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('path', ['dense', 'scatter'])
@pytest.mark.parametrize('preset', ['neighbourhood', 'paper', 'rigid'])
def test_forward_mode_ad_matches_reverse_mode(path, preset):
    # forward-mode AD (dual tensors, torch.func.jvp / jacfwd, tangents on inputs and on
    # parameters) runs the fast paths as their plain operations (no hand-written function has
    # a jvp, PyTorch's fused CPU attention kernel no forward derivative): its Jacobian-vector
    # products equal the reverse-mode Jacobian (the fast paths) times the tangent, on uneven
    # sets with an empty one (packed buckets), a one-element set and a fully-padded bucket
    import torch.autograd.forward_ad as fwAD
    from torch.func import functional_call, jacfwd, jvp

    from torch_mz.nn import MZAggregation
    torch.manual_seed(0)
    kwargs = (dict(value='rigid', num_generators=0) if preset == 'rigid'
              else dict(preset=preset))
    extra = dict(dim=16, d_ff=16) if preset == 'paper' else {}
    aggr = MZAggregation(3, path=path, **kwargs, **extra).double().eval()
    index = torch.tensor([0] * 9 + [2] * 5 + [3] + [4] * 7)
    x = torch.randn(index.numel(), 3, dtype=torch.float64)
    t = torch.randn_like(x)

    def f(xx):
        return aggr(xx, index, dim_size=5)

    jac = torch.autograd.functional.jacobian(f, x)  # (5, d, N, 3), reverse mode
    expected = torch.einsum('abnf,nf->ab', jac, t)
    with fwAD.dual_level():
        out = fwAD.unpack_dual(f(fwAD.make_dual(x, t)))
    torch.testing.assert_close(out.primal, f(x), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out.tangent, expected, rtol=1e-9, atol=1e-11)
    _, tangent = jvp(f, (x, ), (t, ))
    torch.testing.assert_close(tangent, expected, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(jacfwd(f)(x), jac, rtol=1e-9, atol=1e-11)
    # a tangent on every parameter at once against the reverse-mode parameter Jacobians
    params = {k: v.detach() for k, v in aggr.named_parameters()}
    p_t = {k: torch.randn_like(v) for k, v in params.items()}
    _, tangent = jvp(lambda p: functional_call(aggr, p, (x, index), {'dim_size': 5}),
                     (params, ), (p_t, ))
    names = list(params)
    jacs = torch.autograd.functional.jacobian(
        lambda *ps: functional_call(aggr, dict(zip(names, ps)), (x, index), {'dim_size': 5}),
        tuple(params[n] for n in names))
    expected = sum((j * p_t[n]).flatten(2).sum(-1) for n, j in zip(names, jacs))
    torch.testing.assert_close(tangent, expected, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize('value', ['mz', 'rigid'])
def test_hessian_of_an_aggregation_by_forward_over_reverse(value):
    # torch.func.hessian (forward-mode over reverse-mode) of a loss through the default
    # aggregation and its rigid form equals the reverse-over-reverse Hessian of autograd
    from torch.func import hessian

    from torch_mz.nn import MZAggregation
    torch.manual_seed(2)
    aggr = MZAggregation(3, value=value, **({} if value == 'mz' else dict(
        num_generators=0))).double().eval()
    index = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    x = torch.randn(index.numel(), 3, dtype=torch.float64)

    def loss(xx):
        return aggr(xx, index, dim_size=3).square().sum()

    expected = torch.autograd.functional.hessian(loss, x)
    torch.testing.assert_close(hessian(loss)(x), expected, rtol=1e-9, atol=1e-11)


def test_forward_mode_ad_takes_no_compiled_kernel_in_any_mode(monkeypatch):
    # with the compiled kernels forced on, a dual level (any tensor may carry a tangent) and
    # torch.func transforms take the eager formulas, whose derivatives torch has
    import torch.autograd.forward_ad as fwAD

    from torch_mz.nn import MZAggregation, fused
    monkeypatch.setattr(fused, '_ENABLED', True)
    monkeypatch.setattr(fused, '_FAILED', False)
    calls: list = []
    monkeypatch.setattr(fused, '_run', lambda name, fn, *args: calls.append(name) or fn(*args))
    torch.manual_seed(3)
    aggr = MZAggregation(3).double().eval()
    index = torch.tensor([0, 0, 1, 1, 1])
    x, t = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    aggr(x, index)
    assert calls  # the mode is on: without forward AD the kernels run
    calls.clear()
    with fwAD.dual_level():
        got = fwAD.unpack_dual(aggr(fwAD.make_dual(x, t), index)).tangent
    _, expected = torch.func.jvp(lambda xx: aggr(xx, index), (x, ), (t, ))
    assert calls == []
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('masked', [False, True])
def test_flash_attention_function_equals_sdpa_and_has_second_derivatives(dtype, masked):
    # the fused CPU kernel through _FlashAttentionCPU: bit for bit SDPA's values and gradients
    # (the same kernels), and gradients of gradients (which SDPA's fused kernel lacks) that
    # agree with finite differences
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(3, 2, L, 4, generator=g, dtype=dtype) for L in (5, 6, 6))
    mask = None
    if masked:
        mask = torch.rand(3, 1, 1, 6, generator=g) > 0.4
        mask[..., 0] = True  # every row keeps a key, as in the packed buckets
    grad_out = torch.randn(3, 2, 5, 4, generator=g, dtype=dtype)

    def run(fn):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = fn(qq, kk, vv)
        out.backward(grad_out)
        return [out.detach(), qq.grad, kk.grad, vv.grad]

    mine = run(lambda a, b, c: functional._FlashAttentionCPU.apply(a, b, c, mask))
    theirs = run(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=mask,
                                                                scale=1.0))
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
    # with gradients recorded on a CPU in full precision the attention takes the function
    grad_fn = functional._sdpa(q.clone().requires_grad_(), k, v, mask).grad_fn
    assert type(grad_fn).__name__ == '_FlashAttentionCPUBackward'
    if dtype == torch.float64:
        inputs = tuple(t.clone().requires_grad_() for t in (q, k, v))
        assert torch.autograd.gradgradcheck(
            lambda a, b, c: functional._FlashAttentionCPU.apply(a, b, c, mask), inputs)
        assert_graph_branch_gradients_match(
            lambda a, b, c: functional._FlashAttentionCPU.apply(a, b, c, mask), inputs)


def test_second_derivatives_through_a_rigid_aggregation():
    # forces as gradients of an energy (create_graph=True), trained: gradients of the input
    # gradients through the fused attention kernel's blocks agree with finite differences
    from torch_mz.nn import MZAggregation
    torch.manual_seed(6)
    aggr = MZAggregation(3, value='rigid', num_generators=0).double()
    index = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    x = torch.randn(index.numel(), 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda xx: aggr(xx, index, dim_size=3), (x, ))


def test_sdpa_gives_the_function_only_what_sdpa_gives_its_fused_kernel():
    # inputs SDPA sends down its math path (a last dimension of stride > 1, an empty sequence,
    # fewer key heads) reach SDPA itself: the same values as on contiguous copies; the fused
    # kernel's own inputs take the function
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(8)
    s = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    q = torch.randn(8, 4, 2, generator=g).transpose(1, 2)  # (N, H, d_k), stride(-1) = 2
    k, v = torch.randn(8, 2, 4, generator=g), torch.randn(8, 2, 4, generator=g)
    expected = grouped_attention(q.contiguous(), k, v, s, s, 2, path='dense')
    got = grouped_attention(q.detach().requires_grad_(), k, v, s, s, 2, path='dense')
    torch.testing.assert_close(got, expected)
    q4 = torch.randn(2, 3, 0, 4, requires_grad=True)  # no queries
    k4, v4 = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    assert functional._sdpa(q4, k4, v4, None).shape == (2, 3, 0, 4)
    q5 = torch.randn(2, 4, 3, 4, requires_grad=True)  # keys and values of one head, broadcast
    k5, v5 = torch.randn(2, 1, 5, 4), torch.randn(2, 1, 5, 4)
    torch.testing.assert_close(functional._sdpa(q5, k5, v5, None),
                               F.scaled_dot_product_attention(q5, k5, v5, scale=1.0))
    assert type(functional._sdpa(q5, k5.expand(2, 4, 5, 4), v5.expand(2, 4, 5, 4),
                                 None).grad_fn).__name__ == '_FlashAttentionCPUBackward'
    assert type(functional._sdpa(q5, k5, v5, None).grad_fn).__name__ != \
        '_FlashAttentionCPUBackward'


def test_second_derivatives_give_zero_for_rows_without_keys():
    # under create_graph the written-out backward pass gives the kernel's gradients, 0 and no
    # NaN for a query row whose keys are all masked (a set masked whole)
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(3, 2, L, 4, generator=g, dtype=torch.float64) for L in (4, 5, 5))
    mask = torch.ones(3, 1, 1, 5, dtype=torch.bool)
    mask[1] = False  # the second set: no key
    mask[2, ..., 3:] = False
    grad_out = torch.randn(3, 2, 4, 4, generator=g, dtype=torch.float64)

    def grads(create_graph):
        ins = [t.clone().requires_grad_() for t in (q, k, v)]
        out = functional._FlashAttentionCPU.apply(*ins, mask)
        return torch.autograd.grad(out, ins, grad_out, create_graph=create_graph)

    first, written = grads(False), grads(True)
    for a, b in zip(first, written):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    assert not first[0][1].any() and not first[2][1].any()


@pytest.mark.filterwarnings('ignore::DeprecationWarning')  # torch.jit's, in torch 2.13
@pytest.mark.filterwarnings('ignore::torch.jit.TracerWarning')  # the shape checks, traced
def test_traces_record_the_attention_kernel_itself():
    # tracing with inputs that require gradients records SDPA, not the function: on sets of
    # one size the trace checks (traced twice, compared), saves and loads; two masked
    # attentions in a row on uneven sets trace and give the eager values (a trace of the
    # packed path holds the layout of its sets and its Python functions, and is not saved)
    import io
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(8, 2, 4, generator=g, requires_grad=True) for _ in range(3))
    s = torch.tensor([0] * 4 + [1] * 4)
    traced = torch.jit.trace(lambda a, b, c: grouped_attention(a, b, c, s, s, 2, path='dense'),
                             (q, k, v))
    buf = io.BytesIO()
    torch.jit.save(traced, buf)
    buf.seek(0)
    torch.testing.assert_close(torch.jit.load(buf)(q, k, v),
                               grouped_attention(q, k, v, s, s, 2, path='dense'))
    u = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])

    def twice(a, b, c):
        return grouped_attention(grouped_attention(a, b, c, u, u, 3, path='dense'), b, c, u, u,
                                 3, path='dense')
    traced = torch.jit.trace(twice, (q, k, v), check_trace=False)
    torch.testing.assert_close(traced(q, k, v), twice(q, k, v))


@pytest.mark.filterwarnings('ignore:There is a performance drop')  # (vmap of its backward)
def test_reverse_mode_torch_func_keeps_the_fused_kernel(monkeypatch):
    # one reverse-mode derivative under torch.func (grad, and jacrev with its vmap) keeps SDPA's
    # fused kernel (linear memory in the set size), with the parameters passed detached as
    # torch.func does (parameters that require gradients record autograd through the
    # transform: a second derivative may follow, so the attention is written out); forward-mode
    # transforms (jvp, jacfwd, hessian) and dual levels write the attention out
    import torch.autograd.forward_ad as fwAD
    from torch.func import functional_call, grad, jacrev

    from torch_mz.nn import MZAggregation
    calls: list = []
    sdpa = functional.F.scaled_dot_product_attention
    monkeypatch.setattr(functional.F, 'scaled_dot_product_attention',
                        lambda *a, **kw: calls.append(1) or sdpa(*a, **kw))
    torch.manual_seed(11)
    aggr = MZAggregation(3, value='rigid', num_generators=0).double()
    index = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    x = torch.randn(index.numel(), 3, dtype=torch.float64)
    params = {k: v.detach() for k, v in aggr.named_parameters()}

    def f(p, xx):
        return functional_call(aggr, p, (xx, index), {'dim_size': 3})

    grad(lambda p: f(p, x).sum())(params)
    jacrev(f, argnums=1)(params, x)
    assert calls
    calls.clear()
    grad(lambda xx: aggr(xx, index, dim_size=3).sum())(x)  # parameters requiring gradients
    assert not calls
    torch.func.jvp(lambda xx: aggr(xx, index, dim_size=3), (x, ), (x, ))
    assert not calls
    from torch_mz.nn import _context
    assert not _context._forward_ad_active()
    with fwAD.dual_level():  # (torch's private level counter, read by the guard)
        assert _context._forward_ad_active() and _context._attention_written_out()


def test_per_head_attention_passes_dropout_to_the_kernels_off_the_cpu(monkeypatch):
    # off the CPU (here the meta device) the fused kernels take the dropout (it was dropped)
    seen: list = []
    monkeypatch.setattr(functional.F, 'scaled_dot_product_attention',
                        lambda q, k, v, **kw: seen.append(kw.get('dropout_p')) or q)
    q = torch.empty(2, 3, 4, 5, device='meta')
    functional._attend_per_head(q, q, q, None, 0.3)
    functional._attend_per_head(q, q, q, None, 0.0)
    assert seen == [0.3, 0.0]


def test_nested_reverse_mode_torch_func_through_a_rigid_aggregation():
    # more than one reverse-mode derivative under torch.func (jacrev of jacrev, autograd
    # through grad: forces from torch.func.grad, trained) writes the attention out, which has
    # second derivatives; each equals autograd's own (create_graph through the function)
    from torch.func import grad, jacrev

    from torch_mz.nn import MZAggregation
    torch.manual_seed(12)
    aggr = MZAggregation(3, value='rigid', num_generators=0).double()
    index = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    x = torch.randn(index.numel(), 3, dtype=torch.float64)

    def energy(xx):
        return aggr(xx, index, dim_size=3).square().sum()

    expected = torch.autograd.functional.hessian(energy, x)  # create_graph, the function
    torch.testing.assert_close(jacrev(jacrev(energy))(x), expected, rtol=1e-9, atol=1e-11)
    xr = x.clone().requires_grad_()
    grad(energy)(xr).square().sum().backward()  # autograd through torch.func.grad
    xa = x.clone().requires_grad_()
    forces, = torch.autograd.grad(energy(xa), xa, create_graph=True)
    expected_grad, = torch.autograd.grad(forces.square().sum(), xa)
    torch.testing.assert_close(xr.grad, expected_grad, rtol=1e-9, atol=1e-11)
    # a layout found under one transform is not kept for the next (its tensors are wrapped)
    torch.func.hessian(energy)(x)
    torch.testing.assert_close(grad(energy)(x), torch.autograd.grad(energy(xa), xa)[0])


def test_sdpa_leaves_other_inputs_and_switches_to_sdpa(monkeypatch):
    # no heads, masks of other ranks, and the flash kernel switched off reach SDPA itself
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q0 = torch.randn(2, 0, 3, 4, requires_grad=True)
    assert functional._sdpa(q0, q0, q0, None).shape == (2, 0, 3, 4)
    q = torch.randn(2, 3, 5, 4, requires_grad=True)
    k, v = torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
    mask3 = torch.ones(3, 5, 6, dtype=torch.bool)
    torch.testing.assert_close(functional._sdpa(q, k, v, mask3),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask3,
                                                              scale=1.0))
    assert type(functional._sdpa(q, k, v, mask3).grad_fn).__name__ != \
        '_FlashAttentionCPUBackward'
    with sdpa_kernel([SDPBackend.MATH]):
        assert type(functional._sdpa(q, k, v, None).grad_fn).__name__ != \
            '_FlashAttentionCPUBackward'
    assert type(functional._sdpa(q, k, v, None).grad_fn).__name__ == \
        '_FlashAttentionCPUBackward'


@pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA not available')
def test_cuda_forward_mode_ad_and_per_head_dropout():
    # on a GPU: dual tensors through a rigid aggregation (its fused kernels have no forward
    # derivative) equal the CPU's, and the per-head attention's dropout reaches the kernels
    # (training draws differ call to call; eval does not)
    import torch.autograd.forward_ad as fwAD

    from torch_mz.nn import MZAggregation
    torch.manual_seed(14)
    aggr = MZAggregation(3, value='rigid', num_generators=0).double().eval()
    index = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    x = torch.randn(index.numel(), 3, dtype=torch.float64)
    t = torch.randn_like(x)
    with fwAD.dual_level():
        cpu = fwAD.unpack_dual(aggr(fwAD.make_dual(x, t), index)).tangent
        aggr.cuda()
        gpu = fwAD.unpack_dual(aggr(fwAD.make_dual(x.cuda(), t.cuda()), index.cuda())).tangent
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-9, atol=1e-11)
    q = torch.randn(4, 2, 8, 16, device='cuda')
    a, b = (functional._attend_per_head(q, q, q, None, 0.5) for _ in range(2))
    assert not torch.equal(a, b)
    assert torch.equal(functional._attend_per_head(q, q, q, None, 0.0),
                       functional._attend_per_head(q, q, q, None, 0.0))


def test_grouped_attention_checks_shapes_and_dtypes():
    # the audit's inputs: a key or query left out of the ids, ids of another shape or dtype,
    # queries unlike the keys, mixed dtypes: named (a key was dropped or a query zeroed
    # silently on the scatter path, and the dense path failed deep inside)
    q, k, v = torch.randn(5, 2, 4), torch.randn(7, 2, 4), torch.randn(7, 2, 3)
    qs, ks = torch.tensor([0, 0, 1, 1, 2]), torch.tensor([0, 1, 1, 2, 2, 2, 0])
    for path in ('dense', 'scatter'):
        grouped_attention(q, k, v, qs, ks, 3, path=path)
        with pytest.raises(ValueError, match=r"'kv_set' to hold the integer set id of each of "
                           r"the 7 rows, shape \(7,\) \(got shape \(6,\)"):
            grouped_attention(q, k, v, qs, ks[:6], 3, path=path)
        with pytest.raises(ValueError, match=r"'query_set' .* 5 rows"):
            grouped_attention(q, k, v, qs[:4], ks, 3, path=path)
        with pytest.raises(ValueError, match=r"'query_set' .*dtype torch.float32"):
            grouped_attention(q, k, v, qs.float(), ks, 3, path=path)
        with pytest.raises(ValueError, match=r"'kv_set' .*got shape \(1, 7\)"):
            grouped_attention(q, k, v, qs, ks[None], 3, path=path)
        with pytest.raises(ValueError, match='the same H and d_k'):
            grouped_attention(q[:, :1], k, v, qs, ks, 3, path=path)
        with pytest.raises(ValueError, match='the same H and d_k'):
            grouped_attention(q[..., :3], k, v, qs, ks, 3, path=path)
        with pytest.raises(ValueError, match='one dtype'):
            grouped_attention(q.double(), k, v, qs, ks, 3, path=path)
        with pytest.raises(ValueError, match="'num_sets' must be an integer >= 0"):
            grouped_attention(q, k, v, qs, ks, 3.0, path=path)
        # a bool id failed inside bincount; a negative rate was taken as no dropout
        with pytest.raises(ValueError, match=r"'query_set' .*dtype torch.bool"):
            grouped_attention(q, k, v, qs > 0, ks, 3, path=path)
        for rate in (-0.5, 1.0, '0.1'):
            with pytest.raises(ValueError, match="'dropout' must be a number in"):
                grouped_attention(q, k, v, qs, ks, 3, dropout=rate, training=True, path=path)


def test_grouped_attention_names_set_ids_outside_the_sets():
    # an id >= num_sets or a negative one failed inside (an expand of mismatched counts, or
    # bincount's RuntimeError): named by the counting of each set's rows, which reads nothing more
    q, k, v = torch.randn(5, 2, 4), torch.randn(7, 2, 4), torch.randn(7, 2, 3)
    qs, ks = torch.tensor([0, 0, 1, 1, 2]), torch.tensor([0, 1, 1, 2, 2, 2, 0])
    for path in ('dense', 'scatter'):
        with pytest.raises(ValueError, match=r'set ids in \[0, 3\) for 3 sets \(got ids up '
                                             r'to 4\)'):
            grouped_attention(q, k, v, qs, torch.tensor([0, 1, 1, 2, 2, 4, 0]), 3, path=path)
        with pytest.raises(ValueError, match=r'set ids in \[0, 3\) .*got ids up to 3'):
            grouped_attention(q, k, v, torch.tensor([0, 0, 1, 3, 2]), ks, 3, path=path)
        with pytest.raises(ValueError, match=r'set ids in \[0, 2\) .*got ids up to 2'):
            grouped_attention(q, k, v, qs, ks, 2, path=path)
        with pytest.raises(ValueError, match=r'set ids in \[0, 3\) .*negative ids, down to '
                                             r'-2'):
            grouped_attention(q, k, v, torch.tensor([0, -2, 1, 1, 2]), ks, 3, path=path)
    with pytest.raises(ValueError, match=r'set ids in \[0, 2\) .*got ids up to 2'):
        functional.set_counts(torch.tensor([0, 2], dtype=torch.int32), 2)
    assert functional.set_counts(torch.tensor([0, 2]), 4).tolist() == [1, 0, 1, 0]


def test_grouped_attention_takes_numpy_integers_as_num_sets():
    import numpy as np
    q = torch.randn(5, 2, 4)
    ids = torch.tensor([0, 0, 1, 1, 2])
    torch.testing.assert_close(grouped_attention(q, q, q, ids, ids, np.int64(3)),
                               grouped_attention(q, q, q, ids, ids, 3))


@pytest.mark.parametrize('path', ['scatter', 'dense'])
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_attention_to_more_keys_than_float16_holds(dtype, path):
    # one query attending to 70,000 keys of equal scores (a constant set): the scatter path's
    # segment softmax summed the exponentials in float16, and the sum 70,000 overflowed 65,504,
    # so every weight was 0 and the output a finite 0 instead of the values' mean (the dense
    # path, whose kernels normalise in float32, was right); now both are within the dtype's
    # rounding of the float64 result on the same (rounded) values
    g = torch.Generator().manual_seed(0)
    n = 70_000
    q = torch.zeros(1, 2, 4, dtype=dtype)  # every score 0: the weights are exactly 1 / n
    k = torch.randn(n, 2, 4, generator=g).to(dtype)
    v = (1.0 + 0.1 * torch.randn(n, 2, 3, generator=g)).to(dtype)
    query_set, kv_set = torch.zeros(1, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    out = grouped_attention(q, k, v, query_set, kv_set, 1, path=path)
    assert out.dtype == dtype
    expected = v.double().mean(dim=0, keepdim=True)  # (1, 2, 3)
    torch.testing.assert_close(out.double(), expected, rtol=4 * torch.finfo(dtype).eps, atol=0.0)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_set_mean_and_std_of_a_set_larger_than_float16_counts(dtype):
    # one set of 70,000 rows: the sums and the count were taken in the input's dtype, and float16
    # holds no count above 65,504 (the mean of rows of about 0.5 came out as 0.0, the std NaN);
    # now both are taken in float32 and cast back, within one unit of the dtype's precision of
    # the float64 result on the same (rounded) rows
    g = torch.Generator().manual_seed(0)
    n = 70_000
    x = (0.5 + 0.1 * torch.randn(n + 3, 4, generator=g)).to(dtype)
    index = torch.cat([torch.zeros(n, dtype=torch.long), torch.tensor([1, 1, 2])])
    mean, std = set_mean(x, index, 4), set_std(x, index, 4)
    assert mean.dtype == std.dtype == dtype
    tol = dict(rtol=torch.finfo(dtype).eps, atol=0.0)
    torch.testing.assert_close(mean.double(), set_mean(x.double(), index, 4), **tol)
    torch.testing.assert_close(std.double(), set_std(x.double(), index, 4), **tol)
    # float32 and float64 keep their own path, bit for bit
    for wide in (torch.float32, torch.float64):
        y = x.to(wide)
        count = torch.bincount(index, minlength=4).clamp(min=1).to(wide).unsqueeze(-1)
        expected = y.new_zeros(4, 4).index_add_(0, index, y) / count
        assert torch.equal(set_mean(y, index, 4), expected)
        sq = y.new_zeros(4, 4).index_add_(0, index, (y - expected[index]).pow(2)) / count
        assert torch.equal(set_std(y, index, 4), torch.sqrt(sq + 1e-6))
