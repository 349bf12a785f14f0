r"""Set-grouped attention on PyG's flat layout, without padding to the largest set.

Queries and keys/values are flat token tensors whose rows belong to sets (a ``set id`` per row,
as PyG's ``batch``/``index`` vector). Attention never crosses sets. Two exact paths compute the
same result:

* ``'scatter'``: every (query, key) pair of the same set is enumerated, scores are normalised
  with a segment softmax (:func:`torch_geometric.utils.softmax`; in float32 for half-precision
  scores, as :func:`torch.softmax` normalises them), and values are aggregated by a
  sparse-times-dense product (no per-pair copy of the values). Memory :math:`O(P H + N w)` for
  :math:`P = \sum_b n^q_b n^k_b` pairs.
* ``'dense'``: sets are grouped into buckets of similar size (sizes rounded up to at most 25%
  above the true size, then neighbouring buckets merged while the merged bucket's padded pairs
  are no more than the merged classes' own plus a fixed allowance that stands for the
  per-bucket launch cost, and its padded rows at most 25% more than theirs plus 1,024), each bucket
  is gathered into a dense block padded to its largest set and attended with batched matrix
  products (:func:`torch.nn.functional.scaled_dot_product_attention`). Where every set has the
  same size and the rows are sorted, there is a single bucket, no padding and no gather: the
  exact dense path. Cost :math:`O(\sum_b n^q_b n^k_b)` up to the bucket padding.

No Python loop runs over individual sets: the only loop is over the (few) size buckets.
"""
import contextlib
import numbers
import threading
import weakref
from collections import OrderedDict
from typing import (Any, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union,
                    overload)

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.utils import softmax as segment_softmax

from torch_mz.nn._context import _attention_written_out, _functorch_active, _plain_ops

PATHS = ('auto', 'dense', 'scatter')


def check_choice(what: str, value: str, choices) -> None:
    r"""Raises a :class:`ValueError` naming :obj:`what` unless :obj:`value` is one of
    :obj:`choices`."""
    if value not in choices:
        raise ValueError(f"Unknown {what} '{value}' (expected one of {tuple(choices)})")


def set_counts(set_id: Tensor, num_sets: int) -> Tensor:
    r"""Number of rows per set, shape :obj:`(num_sets,)`. Under :func:`torch.compile` a sum of
    ones into :obj:`num_sets` slots, whose shape is known when tracing (that of
    :func:`torch.bincount` depends on the largest id: a graph break each time); the same
    counts, since the ids were checked to lie in :math:`[0, B)`. Otherwise (eagerly) an id
    outside :math:`[0, B)` raises a :class:`ValueError`, read from the counts' length (the
    bincount's own read of the device; no other) or from the bincount's refusal of a negative
    id, so that a block called with wrong set ids says so instead of failing further in."""
    if torch.compiler.is_compiling():
        return torch.zeros(num_sets, dtype=torch.long, device=set_id.device).scatter_add_(
            0, set_id, torch.ones_like(set_id, dtype=torch.long))
    try:
        counts = torch.bincount(set_id, minlength=num_sets)  # (max(B, largest id + 1),)
    except RuntimeError:
        # (only on this error path: the smallest id, read to name it)
        if (set_id.dim() == 1 and set_id.numel() > 0 and not set_id.is_floating_point()
                and not set_id.is_complex() and set_id.dtype != torch.bool
                and int(set_id.min()) < 0):
            raise ValueError(f"Expected set ids in [0, {num_sets}) for {num_sets} sets (got "
                             f"negative ids, down to {int(set_id.min())})") from None
        raise
    if counts.numel() > num_sets:
        raise ValueError(f"Expected set ids in [0, {num_sets}) for {num_sets} sets (got ids up "
                         f"to {counts.numel() - 1})")
    return counts


_repeat_cache: 'OrderedDict[tuple, Tuple[Tensor, Tensor]]' = OrderedDict()  # (ids, copy)
_cache_lock = threading.RLock()  # re-entrant: a weakref callback may run while it is held


def _caching() -> bool:
    r"""Whether the small caches of this module may be used: not while compiling (dynamo traces
    plain tensor code), not while :func:`torch.jit.trace` records (a cached layout would enter
    the trace as constants of another call's set ids), not in :func:`torch.inference_mode`
    (its tensors must not outlive it in a cache, and they have no version counter) and not
    under :mod:`torch.func` transforms (whose wrapped tensors must not outlive them: a layout
    cached under ``hessian`` failed a later ``grad`` on the same sets)."""
    return not (torch.compiler.is_compiling() or torch.jit.is_tracing()
                or torch.is_inference_mode_enabled() or _functorch_active())


def repeat_per_set(num_sets: int, k: int, device: torch.device) -> Tensor:
    r"""Set ids of :obj:`k` tokens per set: :obj:`[0]*k + [1]*k + ...`, shape :obj:`(num_sets*k,)`.

    The same tensor is returned again for the same arguments (the last few are kept, with a
    private copy against which each is checked, so a tensor changed in place, even where its
    version counter does not see it, is made again), so that every block of a model that
    attends over learned tokens (inducing points, seeds) passes the same set ids and shares one
    attention layout (see :func:`grouped_attention`). Do not modify it in place."""
    device = torch.device(device)
    if not _caching() or (device.type != 'cpu' and device.index is None):
        return torch.arange(num_sets, device=device).repeat_interleave(k)
    key = (num_sets, k, device)
    with _cache_lock:
        entry = _repeat_cache.get(key)
        if entry is not None and entry[0]._version == 0 and torch.equal(*entry):
            _repeat_cache.move_to_end(key)
            return entry[0]
    ids = torch.arange(num_sets, device=device).repeat_interleave(k)
    with _cache_lock:
        _repeat_cache[key] = (ids, ids.clone())
        while len(_repeat_cache) > 8:
            _repeat_cache.popitem(last=False)
    return ids


# float16 holds no count above 65,504 and loses a sum of many rows (the spacing near 2,048 is 2):
# a set's sums and counts are taken in float32 for these inputs, and the result cast back
_ACCUMULATE_IN_FLOAT32 = (torch.float16, torch.bfloat16)


def set_mean(x: Tensor, set_id: Tensor, num_sets: int) -> Tensor:
    r"""Mean of the rows of each set, zero for an empty set. Shape :obj:`(num_sets, F)`. A
    float16 or bfloat16 input is summed and divided in float32 and the mean cast back to its
    dtype (float16 holds no count above 65,504)."""
    if x.dtype in _ACCUMULATE_IN_FLOAT32:
        return set_mean(x.float(), set_id, num_sets).to(x.dtype)
    out = x.new_zeros(num_sets, x.size(-1)).index_add_(0, set_id, x)  # (B, F)
    count = set_counts(set_id, num_sets).clamp(min=1).to(x.dtype)  # (B,)
    return out / count.unsqueeze(-1)


def set_std(x: Tensor, set_id: Tensor, num_sets: int, mean: Optional[Tensor] = None,
            eps: float = 1e-6) -> Tensor:
    r"""Per-feature standard deviation of the rows of each set, :math:`\sqrt{\mathrm{Var}+\epsilon}`
    (population variance; a set of zero or one rows has variance 0). Shape :obj:`(num_sets, F)`.
    A float16 or bfloat16 input is computed in float32 and the result cast back, as in
    :func:`set_mean`."""
    if x.dtype in _ACCUMULATE_IN_FLOAT32:
        return set_std(x.float(), set_id, num_sets, None if mean is None else mean.float(),
                       eps).to(x.dtype)
    if mean is None:
        mean = set_mean(x, set_id, num_sets)
    sq = set_mean((x - mean[set_id]).pow(2), set_id, num_sets)  # (B, F)
    return torch.sqrt(sq + eps)


def _bucket_size(n: Tensor) -> Tensor:
    r"""Rounds each size up to a multiple of :math:`2^{\max(0, \lfloor\log_2 n\rfloor - 2)}`, which
    is at most 25% above it (sizes up to 8 are kept exact)."""
    n = n.clamp(min=1)
    step = torch.pow(2, (torch.floor(torch.log2(n.double())) - 2).clamp(min=0)).long()
    return ((n + step - 1) // step) * step


# Merging two size buckets saves a round of kernel launches (about a dozen operations forward and
# as many backward). Two neighbouring buckets are merged when the padded work of the merged
# bucket is at most MERGE_RATIO times their separate work plus MERGE_OVERHEAD, where work is
# counted in multiply-adds of the attention (query-key pairs times heads times (d_k + w)):
# MERGE_OVERHEAD is about what one bucket's launches cost on a CPU core, in the same unit.
MERGE_RATIO = 1.0
MERGE_OVERHEAD = 400_000
# ... and only while the merged bucket's padded query rows and key rows stay within
# MERGE_ROWS_RATIO times the rows of the buckets merged, plus MERGE_ROWS_OVERHEAD rows. The
# padded query, key and value buffers and their gradients are rows, not pairs: with one query per
# set (a PMA with one seed) the work of a bucket is its key rows, and the launch allowance alone
# let every neighbourhood of a 10^3-node graph (10^4 Poisson edges, degrees 1-21) be padded to
# the largest, 2.1x the rows (the four PMA key / value buffers and gradients then held a third
# of a `rigid` aggregation's peak). The rows of the buckets merged are counted as each size class
# pads them (to the largest set of the class, which _bucket_size rounds to within 25%), so
# against the sets' real rows the bound is about 1.25 x 1.25 = 1.56x plus MERGE_ROWS_OVERHEAD.
MERGE_ROWS_RATIO = 1.25
MERGE_ROWS_OVERHEAD = 1024


def _merge_buckets(keys: Tensor, sizes: Tensor, pair_cost: int = 1) -> Tuple[Tensor, Tensor]:
    r"""Groups sets into padded buckets. :obj:`keys` are the rounded ``(n_q, n_k)`` of each set;
    sets with equal keys share a bucket, and neighbouring buckets (ordered by padded cost) are
    merged greedily while that costs little padding. :obj:`pair_cost` is the work of one padded
    query-key pair (heads times (d_k + w)). Returns the padded ``(n_q, n_k)`` of each bucket,
    shape :obj:`(U, 2)`, and the bucket of each set."""
    # one integer per key (torch.unique over rows of a 2-D tensor is much slower)
    flat = keys[:, 0] * (int(keys[:, 1].max()) + 1) + keys[:, 1]  # (B',)
    _, inverse, counts = torch.unique(flat, return_inverse=True, return_counts=True)
    U = counts.numel()
    # the true largest sizes in each key group (padding only up to what is there)
    max_q = torch.zeros(U, dtype=torch.long, device=keys.device)
    max_k = torch.zeros(U, dtype=torch.long, device=keys.device)
    max_q.scatter_reduce_(0, inverse, sizes[:, 0], reduce='amax')
    max_k.scatter_reduce_(0, inverse, sizes[:, 1], reduce='amax')
    order = torch.argsort(max_q * max_k).tolist()
    mq, mk, cnt = max_q.tolist(), max_k.tolist(), counts.tolist()
    overhead = MERGE_OVERHEAD / max(pair_cost, 1)  # in padded pairs
    group = [0] * U
    padded = []
    cur_q = cur_k = cur_n = 0
    cur_sep = cur_rq = cur_rk = 0  # separate work, query rows, key rows of the current bucket
    for i in order:
        new_q, new_k, n = max(cur_q, mq[i]), max(cur_k, mk[i]), cur_n + cnt[i]
        sep = cur_sep + cnt[i] * mq[i] * mk[i]
        rq, rk = cur_rq + cnt[i] * mq[i], cur_rk + cnt[i] * mk[i]
        if cur_n == 0 or (n * new_q * new_k <= MERGE_RATIO * sep + overhead
                          and n * new_q <= MERGE_ROWS_RATIO * rq + MERGE_ROWS_OVERHEAD
                          and n * new_k <= MERGE_ROWS_RATIO * rk + MERGE_ROWS_OVERHEAD):
            cur_q, cur_k, cur_n, cur_sep, cur_rq, cur_rk = new_q, new_k, n, sep, rq, rk
        else:
            padded.append((cur_q, cur_k))
            cur_q, cur_k, cur_n = mq[i], mk[i], cnt[i]
            cur_sep, cur_rq, cur_rk = cnt[i] * mq[i] * mk[i], cnt[i] * mq[i], cnt[i] * mk[i]
        group[i] = len(padded)
    padded.append((cur_q, cur_k))
    group_t = torch.tensor(group, dtype=torch.long, device=keys.device)
    return torch.tensor(padded, dtype=torch.long, device=keys.device), group_t[inverse]


def _sorted_layout(set_id: Tensor,
                   num_sets: int) -> Tuple[Optional[Tensor], Tensor, Tensor, Tensor]:
    r"""Returns (perm, counts, ptr, local): :obj:`perm` sorts rows by set (stable), :obj:`ptr` is the
    CSR offset of each set in sorted order and :obj:`local[i]` is the position of row :obj:`i`
    inside its set (in the original row order). :obj:`perm` is :obj:`None` when the rows are
    already sorted."""
    counts = set_counts(set_id, num_sets)  # (B,)
    ptr = torch.zeros(num_sets + 1, dtype=torch.long, device=set_id.device)
    ptr[1:] = torch.cumsum(counts, 0)
    if set_id.numel() <= 1 or bool((set_id[1:] >= set_id[:-1]).all()):
        perm = None
        local = torch.arange(set_id.numel(), device=set_id.device) - ptr.index_select(
            0, set_id)  # (N,)
    else:
        perm = torch.argsort(set_id, stable=True)
        local_sorted = torch.arange(set_id.numel(), device=set_id.device) - ptr[set_id[perm]]
        local = torch.empty_like(local_sorted)
        local[perm] = local_sorted  # (N,)
    return perm, counts, ptr, local


@overload
def grouped_attention(q: Tensor, k: Tensor, v: Tensor, query_set: Tensor, kv_set: Tensor,
                      num_sets: int, dropout: float = ..., training: bool = ...,
                      path: str = ..., chunk: Optional[int] = ...,
                      _key_col: Optional[int] = ...) -> Tensor:
    ...


@overload
def grouped_attention(q: Tensor, k: Tensor, v: Union[Tuple[Tensor, ...], List[Tensor]],
                      query_set: Tensor, kv_set: Tensor, num_sets: int, dropout: float = ...,
                      training: bool = ..., path: str = ...,
                      chunk: Optional[int] = ...,
                      _key_col: Optional[int] = ...) -> Tuple[Tensor, ...]:
    ...


def grouped_attention(q: Tensor, k: Tensor, v: Union[Tensor, Sequence[Tensor]], query_set: Tensor,
                      kv_set: Tensor, num_sets: int, dropout: float = 0.0,
                      training: bool = False, path: str = 'auto',
                      chunk: Optional[int] = None,
                      _key_col: Optional[int] = None) -> Union[Tensor, Tuple[Tensor, ...]]:
    r"""Multi-head attention from each query to the keys/values of its own set.

    .. math::
        \mathrm{out}_i = \sum_{j:\, s(j) = s(i)} \mathrm{softmax}_j\big(q_i^\top k_j\big)\, v_j

    Scores are used as given (scale :obj:`q` beforehand, e.g. by :math:`1/\sqrt{d_k}`). A query
    whose set has no keys gets a zero output.

    Values are either per head, :math:`(N_k, H, w)`, or shared by all heads, :math:`(N_k, w)`:
    then every head aggregates the same rows with its own weights (one matrix product per set for
    all heads, with no copy of the values per head). Shared values are what a block needs when it
    applies its value map after the aggregation (exact, since a linear map commutes with the
    attention-weighted sum). Several shared value tensors (a tuple) are aggregated with the same
    attention weights (one softmax, one dropout draw) without joining them into one tensor first.

    Args:
        q (Tensor): Queries :math:`(N_q, H, d_k)`.
        k (Tensor): Keys :math:`(N_k, H, d_k)`.
        v (Tensor or tuple): Values :math:`(N_k, H, w)`, or :math:`(N_k, w)` shared by the
            heads, or a tuple of shared values :math:`(N_k, w_i)`.
        query_set (Tensor): Set id of each query :math:`(N_q,)`, need not be sorted.
        kv_set (Tensor): Set id of each key :math:`(N_k,)`, need not be sorted.
        num_sets (int): Number of sets :math:`B` (ids lie in :obj:`[0, B)`).
        dropout (float): Dropout probability on attention weights (default: :obj:`0.0`).
        training (bool): Whether dropout is active (default: :obj:`False`).
        path (str): :obj:`'dense'` (bucketed), :obj:`'scatter'`, or :obj:`'auto'` (dense)
            (default: :obj:`'auto'`).
        chunk (int, optional): If set (a divisor :math:`c` of every value width), each output is
            returned as :math:`(N_q, w / c, H, c)`: every head's row cut into pieces of
            :math:`c` features, the heads interleaved piece by piece, in the same copy that
            brings the outputs into query order. With :math:`c = d_k` and values
            :math:`[v^c \,|\, V^g]` this is the token layout :math:`(1 + n_g, H d_k)` of a
            zonotope's center and generators (no second, transposing copy).
            (default: :obj:`None`, the :math:`(N_q, H, w)` layout)
        _key_col (int, optional): Private: the caller's statement that the keys (one head,
            :math:`(N_k, 1, d_k)`) are a view of the columns ``_key_col`` up to (not including)
            ``_key_col + d_k`` of the first shared value, with their gradients
            (:class:`~torch_mz.nn.MZAttention`'s folded keys beside a column of ones). The
            dense path's packed layout (sets of different sizes) then reads the keys from the
            values' packed buffer instead of packing them too: one buffer fewer to fill and to
            keep for the backward pass, the same numbers; the uniform layout and the scatter
            path read the keys as given. Stated, not inferred from the memory: keys that share
            the values' memory but not their gradients (a detached view) must be packed as they
            are; the memory is checked where it can be read. (default: :obj:`None`)

    Shapes:
        - **output:** :math:`(N_q, H, w)` (a tuple of :math:`(N_q, H, w_i)` for a tuple of
          values), or :math:`(N_q, w / c, H, c)` with :obj:`chunk`

    Shapes and dtypes are checked; the values of the set ids only as far as counting each set's
    rows shows them (:func:`set_counts`: an id outside :math:`[0, B)` raises a
    :class:`ValueError`), not with a read of the device of their own: check them once where they
    enter, e.g. with :func:`torch_mz.nn.aggr.check_set_ids`.
    """
    check_choice('attention path', path, PATHS)
    if q.dim() != 3 or k.dim() != 3 or q.size(1) != k.size(1) or q.size(2) != k.size(2):
        raise ValueError(f"Expected queries (N_q, H, d_k) and keys (N_k, H, d_k) with the same "
                         f"H and d_k (got {tuple(q.shape)} and {tuple(k.shape)})")
    for name, ids, rows in (('query_set', query_set, q.size(0)), ('kv_set', kv_set, k.size(0))):
        if (ids.dim() != 1 or ids.numel() != rows or ids.is_floating_point() or ids.is_complex()
                or ids.dtype == torch.bool):
            raise ValueError(f"Expected '{name}' to hold the integer set id of each of the "
                             f"{rows} rows, shape ({rows},) (got shape {tuple(ids.shape)}, "
                             f"dtype {ids.dtype})")
    if (not isinstance(num_sets, (numbers.Integral, torch.SymInt)) or isinstance(num_sets, bool)
            or num_sets < 0):  # (a SymInt under torch.compile)
        raise ValueError(f"'num_sets' must be an integer >= 0 (got {num_sets!r})")
    if not (isinstance(dropout, numbers.Real) and 0.0 <= dropout < 1.0):  # (not silently 0)
        raise ValueError(f"'dropout' must be a number in [0, 1) (got {dropout!r})")
    several = isinstance(v, (tuple, list))
    values = tuple(v) if several else (v, )
    if any(t.dtype != q.dtype for t in (k, ) + values):
        raise ValueError(f"Expected queries, keys and values of one dtype (got {q.dtype}, "
                         f"{k.dtype} and {[t.dtype for t in values]})")
    for vi in values:
        if (vi.dim() not in (2, 3) or vi.size(0) != k.size(0)
                or (vi.dim() == 3 and (several or vi.size(1) != k.size(1)))):
            raise ValueError(f"Expected values of shape ({k.size(0)}, {k.size(1)}, w) or "
                             f"({k.size(0)}, w), or a tuple of ({k.size(0)}, w_i) (got "
                             f"{[tuple(x.shape) for x in values] if several else tuple(vi.shape)})")
    if not values:
        raise ValueError("Expected at least one value tensor")
    if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk <= 0
                              or any(vi.size(-1) % chunk for vi in values)):
        raise ValueError(f"'chunk' must divide every value width (got {chunk} for widths "
                         f"{[vi.size(-1) for vi in values]})")
    if _key_col is not None:
        v0 = values[0]
        if (not isinstance(_key_col, int) or isinstance(_key_col, bool) or k.dim() != 3
                or k.size(1) != 1 or k.size(2) != q.size(2) or v0.dim() != 2
                or k.dtype != v0.dtype or k.dtype != q.dtype
                or not 0 <= _key_col <= v0.size(1) - k.size(2)
                # where the memory can be read (not under torch.func, nor compiling): a view of
                # those columns
                or (not _functorch_active() and not torch.compiler.is_compiling()
                    and k.numel() > 0 and (
                    k.untyped_storage().data_ptr() != v0.untyped_storage().data_ptr()
                    or k.storage_offset() != v0.storage_offset() + _key_col * v0.stride(1)
                    or k.stride(0) != v0.stride(0) or k.stride(2) != v0.stride(1)))):
            raise ValueError(f"'_key_col' names the first shared value's columns that the keys "
                             f"(N_k, 1, d_k) are a view of: got {_key_col!r} for keys "
                             f"{tuple(k.shape)} and values {tuple(v0.shape)}")
    fn = _attention_scatter if path == 'scatter' else _attention_dense
    outs = fn(q, k, values, query_set, kv_set, num_sets, dropout, training, chunk, _key_col)
    return tuple(outs) if several else outs[0]


def _to_rows(out: Tensor, chunk: Optional[int]) -> Tensor:
    r"""Per-set outputs :math:`(n, H, L_q, w)` as query rows: :math:`(n L_q, H, w)`, or
    :math:`(n L_q, w / c, H, c)` with :obj:`chunk` :math:`c` (one copy either way)."""
    n, H, Lq, w = out.shape
    if chunk is None:
        return out.transpose(1, 2).reshape(n * Lq, H, w)
    return out.view(n, H, Lq, w // chunk, chunk).permute(0, 2, 3, 1, 4).reshape(
        n * Lq, w // chunk, H, chunk)


class _Place(torch.autograd.Function):
    r""":func:`_place` with a backward pass that keeps only the positions
    (:meth:`torch.Tensor.index_copy` keeps its whole source for the backward pass)."""
    @staticmethod
    def forward(ctx, src: Tensor, pos: Tensor, rows: int) -> Tensor:
        ctx.save_for_backward(pos)
        return src.new_zeros((rows, ) + tuple(src.shape[1:])).index_copy_(0, pos, src)

    @staticmethod
    def backward(ctx, grad: Tensor):
        pos, = ctx.saved_tensors
        return grad.index_select(0, pos), None, None


def _place(src: Tensor, pos: Tensor, rows: int) -> Tensor:
    r"""A zero tensor of :obj:`rows` rows with the rows of :obj:`src` at positions :obj:`pos`
    (distinct). Its backward pass keeps only :obj:`pos`, not a copy of :obj:`src` as
    ``index_copy`` does: on the packed queries, keys and values of the dense attention path
    that was about a quarter of the tensors a ``rigid`` aggregation keeps for backward in
    message passing (135.8 -> 103.0 MB, ``SAGEConv``, 10^4 nodes, 10^5 edges). Forward +
    backward on its own: 9.9 against 7.8 ms for ``index_copy`` at (100433, 4, 4), 4.5 against
    6.1 ms at (32768, 4, 16), 43 against 59 ms at (32768, 4, 144) (one core, one run)."""
    if _plain_ops():  # the plain operation (see _plain_ops)
        return src.new_zeros((rows, ) + tuple(src.shape[1:])).index_copy(0, pos, src)
    return _Place.apply(src, pos, rows)


def _zero_rows(v: Tensor, Nq: int, H: int, w: int, dtype: torch.dtype,
               chunk: Optional[int], q: Tensor, k: Tensor) -> Tensor:
    r"""The output for values :obj:`v` where no query has a key of its set: zeros, with the
    queries, keys and values that require gradients in the graph (each then gets its zero
    gradient, as from PyG's scatter; the zeros required none, and ``backward`` raised)."""
    shape = (Nq, H, w) if chunk is None else (Nq, w // chunk, H, chunk)
    out = v.new_zeros(shape, dtype=dtype)
    for t in (q, k, v):
        if t.requires_grad:  # (a sum of no rows: +0.0, whatever the entries, NaN included)
            out = out + t[:0].sum().to(dtype)
    return out


def set_pairs(query_set: Tensor, kv_set: Tensor, num_sets: int) -> Tuple[Tensor, Tensor]:
    r"""All pairs :math:`(i, j)` of a row :math:`i` of the first group and a row :math:`j` of the
    second group that belong to the same set, :math:`P = \sum_b n^q_b n^k_b` pairs, enumerated
    without a loop over sets. Pairs come grouped by set and, inside a set, by :math:`i`.

    Returns:
        (Tensor, Tensor): row indices :math:`(P,)` into the first and the second group.
    """
    device = query_set.device
    perm_q, counts_q, ptr_q, _ = _sorted_layout(query_set, num_sets)
    perm_k, counts_k, ptr_k, _ = _sorted_layout(kv_set, num_sets)
    pairs = counts_q * counts_k  # (B,)
    P = int(pairs.sum())
    pair_set = torch.repeat_interleave(torch.arange(num_sets, device=device), pairs,
                                       output_size=P)  # (P,)
    pair_ptr = torch.cumsum(pairs, 0) - pairs  # (B,)
    local = torch.arange(P, device=device) - pair_ptr[pair_set]  # (P,)
    nk = counts_k[pair_set]  # (P,)
    iq = ptr_q[pair_set] + torch.div(local, nk, rounding_mode='floor')  # (P,) sorted order
    jk = ptr_k[pair_set] + local % nk  # (P,) sorted order
    if perm_q is not None:
        iq = perm_q[iq]
    if perm_k is not None:
        jk = perm_k[jk]
    return iq, jk


# Pairs are processed in chunks of at most this many (pair, head, feature) entries, so that no
# (P, H, d) intermediate is ever built: the scatter path's memory is O(P H + N w).
PAIR_CHUNK = 1 << 21


def _chunks(P: int, width: int):
    step = max(1, PAIR_CHUNK // max(width, 1))
    return [(lo, min(lo + step, P)) for lo in range(0, P, step)]


class _PairDot(torch.autograd.Function):
    r""":math:`s_{ph} = q_{i_p h} \cdot k_{j_p h}` for pairs :math:`(i_p, j_p)`, computed in chunks
    forward and backward (a sampled dense-dense product)."""
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, iq: Tensor, jk: Tensor) -> Tensor:
        H, dk = q.shape[1:]
        out = q.new_empty(iq.numel(), H)  # (P, H)
        for lo, hi in _chunks(iq.numel(), H * dk):
            out[lo:hi] = (q[iq[lo:hi]] * k[jk[lo:hi]]).sum(dim=-1)  # (c, H)
        ctx.save_for_backward(q, k, iq, jk)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, iq, jk = ctx.saved_tensors
        H, dk = q.shape[1:]
        grad_q = torch.zeros_like(q) if ctx.needs_input_grad[0] else None
        grad_k = torch.zeros_like(k) if ctx.needs_input_grad[1] else None
        for lo, hi in _chunks(iq.numel(), H * dk):
            g = grad[lo:hi].unsqueeze(-1)  # (c, H, 1)
            if grad_q is not None:
                grad_q.index_add_(0, iq[lo:hi], g * k[jk[lo:hi]])
            if grad_k is not None:
                grad_k.index_add_(0, jk[lo:hi], g * q[iq[lo:hi]])
        return grad_q, grad_k, None, None


def _pair_aggregate_plain(alpha: Tensor, v: Tensor, iq: Tensor, jk: Tensor, Nq: int) -> Tensor:
    r""":class:`_PairAggregate` as plain operations, in one piece (for :mod:`torch.func`)."""
    vj = v[jk]  # (P, H, w) or (P, w)
    vj = vj.unsqueeze(1) if vj.dim() == 2 else vj  # (P, H or 1, w)
    return v.new_zeros(Nq, alpha.size(1), v.size(-1)).index_add(
        0, iq, alpha.unsqueeze(-1) * vj)  # (Nq, H, w)


class _PairAggregate(torch.autograd.Function):
    r""":math:`o_{ih} = \sum_{p:\, i_p = i} \alpha_{ph} v_{j_p (h)}` for pairs :math:`(i_p, j_p)`,
    values per head :math:`(N_k, H, w)` or shared :math:`(N_k, w)`; computed in chunks forward
    and backward."""
    @staticmethod
    def forward(ctx, alpha: Tensor, v: Tensor, iq: Tensor, jk: Tensor, Nq: int) -> Tensor:
        H, w = alpha.size(1), v.size(-1)
        out = v.new_zeros(Nq, H, w)  # (Nq, H, w)
        for lo, hi in _chunks(iq.numel(), H * w):
            vj = v[jk[lo:hi]]  # (c, H, w) or (c, w)
            if vj.dim() == 2:
                vj = vj.unsqueeze(1)  # (c, 1, w)
            out.index_add_(0, iq[lo:hi], alpha[lo:hi].unsqueeze(-1) * vj)
        ctx.save_for_backward(alpha, v, iq, jk)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        alpha, v, iq, jk = ctx.saved_tensors
        H, w = alpha.size(1), v.size(-1)
        grad_alpha = torch.empty_like(alpha) if ctx.needs_input_grad[0] else None
        grad_v = torch.zeros_like(v) if ctx.needs_input_grad[1] else None
        for lo, hi in _chunks(iq.numel(), H * w):
            gi = grad[iq[lo:hi]]  # (c, H, w)
            if grad_alpha is not None:
                vj = v[jk[lo:hi]]
                vj = vj.unsqueeze(1) if vj.dim() == 2 else vj  # (c, H or 1, w)
                grad_alpha[lo:hi] = (gi * vj).sum(dim=-1)  # (c, H)
            if grad_v is not None:
                contrib = alpha[lo:hi].unsqueeze(-1) * gi  # (c, H, w)
                if v.dim() == 2:
                    contrib = contrib.sum(dim=1)  # (c, w)
                grad_v.index_add_(0, jk[lo:hi], contrib)
        return grad_alpha, grad_v, None, None, None


def _keep_mask(x: Tensor, p: float) -> Tensor:
    r"""Inverted dropout's multiplier for :obj:`x`: 0 where :math:`u < p`, else
    :math:`1 / (1 - p)`, for :math:`u` drawn by :meth:`torch.Tensor.uniform_`; contiguous, in
    :obj:`x`'s dtype (see :func:`dropout`)."""
    # float32 draws for half-precision inputs (whose uniform draws step by 2^-8 or 2^-11)
    draw = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    mask = torch.empty(x.shape, dtype=draw, device=x.device).uniform_().ge_(p)
    return mask.to(x.dtype).div_(1.0 - p)  # 0 or 1 / (1 - p), in place


def _define_keep_mask_op():
    r""":func:`_keep_mask` as an operator of its own, ``torch_mz::dropout_keep_mask``, which
    :func:`torch.compile` calls as it is (an opaque kernel, tagged random; the counter it
    mutates keeps two calls apart and in order, see :data:`_keep_mask_calls`), where inductor
    would draw the numbers with its own generated CPU code: 2.1x the time of eager
    :func:`F.dropout` forward + backward on (32768, 128) float32 (89 against 42 ms; the
    operator's 25 ms; ``benchmarks/compiled_dropout.py``). The same draws as eager
    :func:`dropout` under the same seed. :obj:`None` where this PyTorch has no
    :func:`torch.library.custom_op` with tags (compiled code then takes :func:`F.dropout`)."""
    def keep_mask(x: Tensor, p: float, calls: Tensor) -> Tensor:
        calls.add_(1)
        return _keep_mask(x, p)

    try:
        op = torch.library.custom_op('torch_mz::dropout_keep_mask', keep_mask,
                                     mutates_args=('calls', ),
                                     tags=(torch.Tag.nondeterministic_seeded, ))
    except (AttributeError, TypeError, RuntimeError):  # an older PyTorch, or defined already
        return None

    @op.register_fake
    def _(x: Tensor, p: float, calls: Tensor) -> Tensor:
        return x.new_empty(x.shape)

    return op


_keep_mask_op = _define_keep_mask_op()
#: The calls of ``torch_mz::dropout_keep_mask`` so far, which each call counts in place: the
#: argument that makes two calls on the same tensor two calls (AOTAutograd's common-subexpression
#: pass merges equal calls of operators it does not know to be random, whatever their tags) and
#: keeps them in program order (each reads the count the one before wrote), so the draws are
#: eager's
_keep_mask_calls = torch.zeros((), dtype=torch.long, device='cpu')  # (whatever the default device)


class _Dropout(torch.autograd.Function):
    r"""Inverted dropout with the mask drawn from :meth:`torch.Tensor.uniform_` (see
    :func:`dropout`); the backward pass multiplies by the saved mask, as :func:`F.dropout`'s
    composite CPU path does."""
    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        mask = _keep_mask(x, p)
        ctx.save_for_backward(mask)
        ctx.save_for_forward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        mask, = ctx.saved_tensors
        return grad_out * mask, None

    @staticmethod
    def jvp(ctx, x_tangent: Tensor, p_tangent: Any) -> Tensor:  # forward-mode AD
        mask, = ctx.saved_tensors
        return x_tangent * mask


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    r"""Inverted dropout, as :func:`torch.nn.functional.dropout`: in training every entry is
    kept with probability :math:`1 - p` and scaled by :math:`1 / (1 - p)`, otherwise zeroed.

    On CPU the keep mask is :math:`u \ge p` for :math:`u` drawn by
    :meth:`torch.Tensor.uniform_` (float32 or float64 draws: :math:`P(\text{keep}) = 1 - p` up
    to the draws' resolution, :math:`2^{-24}` in float32), which was 1.6-2.5x faster forward +
    backward than :func:`F.dropout`'s Bernoulli draws on the shapes measured ((524288,),
    (32768, 128), (32, 4, 1024, 16); 1 and 2 threads, ``benchmarks`` host of 2026-12-01). It
    draws a different random stream from :func:`F.dropout`, so results under the same seed
    differ from it (not in distribution). Under :func:`torch.compile` on the CPU the mask comes
    from the operator ``torch_mz::dropout_keep_mask``, which the compiled code calls as it is:
    the same draws as eager under the same seed, where inductor's own generated random numbers
    took 2.1x :func:`F.dropout`'s time and had made compiled training steps of the presets
    slower than eager. One case it does not cover: inside :func:`torch.utils.checkpoint` within
    one compiled graph, the recomputation draws a new mask, so the gradient does not match the
    forward pass (the library's own checkpointed blocks are split by graph breaks and run the
    eager function there; a function of your own that checkpoints this dropout under
    :func:`torch.compile` should use :func:`F.dropout`). Elsewhere (GPUs, whose dropout is
    fused, and :mod:`torch.func` transforms) it is :func:`F.dropout` itself."""
    if not training or p == 0.0:
        return x
    if (x.device.type != 'cpu' or not 0.0 < p < 1.0 or not x.is_floating_point()
            or torch._C._are_functorch_transforms_active()):
        return F.dropout(x, p=p, training=True)
    if torch.compiler.is_compiling():
        if _keep_mask_op is None:
            return F.dropout(x, p=p, training=True)
        return x * _keep_mask_op(x.detach(), p, _keep_mask_calls)  # the gradient: grad * mask
    return _Dropout.apply(x, p)


_dropout = dropout  # for functions whose argument 'dropout' (the rate) hides the name


def _attention_scatter(q: Tensor, k: Tensor, vs: Tuple[Tensor, ...], query_set: Tensor,
                       kv_set: Tensor, num_sets: int, dropout: float,
                       training: bool, chunk: Optional[int] = None,
                       key_col: Optional[int] = None) -> List[Tensor]:
    # (key_col: the keys are read as given; see grouped_attention)
    Nq, H, _ = q.shape
    out_dtype = torch.promote_types(q.dtype, vs[0].dtype)
    iq, jk = set_pairs(query_set, kv_set, num_sets)  # (P,), (P,)
    if iq.numel() == 0:
        return [_zero_rows(v, Nq, H, v.size(-1), out_dtype, chunk, q, k) for v in vs]
    plain = _plain_ops()  # the plain operations (see _plain_ops)
    logits = ((q[iq] * k.to(q.dtype)[jk]).sum(dim=-1) if plain
              else _PairDot.apply(q, k.to(q.dtype), iq, jk))  # (P, H)
    # normalised in at least float32, as torch.softmax normalises half precision: in float16 a
    # query's sum of exponentials exceeds 65,504 beyond that many keys of near-equal scores (a
    # constant set of 70,000 elements: every weight 0, the output a finite 0 or the bias alone)
    alpha = segment_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), iq,
                            num_nodes=Nq)  # (P, H)
    if dropout > 0 and training:
        alpha = _dropout(alpha, dropout)  # the function; 'dropout' is the rate here
    alpha = alpha.to(out_dtype)
    outs = [_pair_aggregate_plain(alpha, v.to(out_dtype), iq, jk, Nq) if plain
            else _PairAggregate.apply(alpha, v.to(out_dtype), iq, jk, Nq)
            for v in vs]  # (Nq, H, w)
    if chunk is None:
        return outs
    return [o.view(Nq, H, -1, chunk).transpose(1, 2).contiguous() for o in outs]


# Wide values (w = g d_k, e.g. an MZ token with its generators) keep PyTorch's fused ("flash")
# SDPA kernel from running: it needs values as wide as the keys. Without it the L_q x L_k
# scores are materialised (memory quadratic in the set size: one neighbourhood of 4,000 elements
# holds 0.8 GB at 4 heads). For large blocks the queries and keys are padded with zeros to the
# values' width instead: the zeros add nothing to a score (the same scores, up to the order of
# the sum), and the kernel runs once per head, memory linear in the set size, at w / d_k times
# the multiply-adds of each score but one exponential per score. Until 2026-12-05 the values
# were split into g groups of width d_k that became extra heads sharing the head's queries and
# keys (g exponentials per score). Padding took 0.26-0.92x the split's time (a throwaway
# script, not committed, 2026-12-05: forward + backward on one set, one core, the two
# alternating in one process; the default MZAggregation, n_g = 2, g = 3, at d = 16: 0.88x on
# 260 elements, 0.66x on 600, 0.44x on 2,000 and 0.37x on 10,218, the hub of
# benchmarks/message_passing.py's power-law graph of 10^4 nodes; at d = 64 0.71-0.92x on
# 260-3,000; n_g = 8, g = 9, on 3,000: 0.26x at d = 16 and 0.60x at d = 64). The materialised
# scores, against which an earlier throwaway script measured the split (g = 3 as fast at
# 256 x 256 blocks, 1.2-1.3x faster at 512-1,000 (d_k = 4), 1.7x faster with 0.09 instead of
# 0.77 GB at 4,000 (d_k = 16); g = 9 1.4-1.9x slower from 512 to 2,000 elements), are still
# faster for g = 9 on mid-size blocks (padding 1.26-1.29x their time at d = 64 from 700 to 1,500
# elements, 0.93x at d = 16 on 1,000, in the throwaway script of 2026-12-05): such wide values
# take the kernel only where the scores are big.
FULL_PRECISION = (torch.float32, torch.float64)
FLASH_MIN_LEN = 256  # both block lengths at least this
FLASH_MAX_GROUPS = 4  # the kernel at any size above FLASH_MIN_LEN for values this many times
FLASH_MIN_SCORES = 1 << 24  # ... as wide as the keys, and wider where a block has this many


def _pad_keys(n: int, H: int, Lq: int, Lk: int, dk: int, w: int, p: float) -> bool:
    r"""Whether the values of one block, :math:`g = w / d_k` times as wide as its keys, go to the
    fused kernel with the queries and keys padded with zeros to their width (see above)."""
    if p > 0 or w == dk or w % dk != 0 or min(Lq, Lk) < FLASH_MIN_LEN:
        return False
    return w // dk <= FLASH_MAX_GROUPS or n * H * Lq * Lk >= FLASH_MIN_SCORES


def _attention_weights(q: Tensor, k: Tensor, mask: Optional[Tensor], p: float) -> Tensor:
    r"""Softmax attention weights :math:`(n, H, L_q, L_k)` of dense blocks (keys where
    :obj:`mask` is False get none), with dropout :obj:`p` (:func:`dropout`)."""
    scores = torch.matmul(q, k.transpose(-1, -2))  # (n, H, Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float('-inf'))
    a = torch.softmax(scores, dim=-1)
    return dropout(a, p) if p > 0 else a


def _attend(q: Tensor, k: Tensor, vs: List[Tensor], mask: Optional[Tensor],
            p: float) -> List[Tensor]:
    r"""Attention on dense blocks: :obj:`q` :math:`(n, H, L_q, d_k)`, :obj:`k`
    :math:`(n, H, L_k, d_k)`, :obj:`vs` one value :math:`(n, H, L_k, w)` per head or values
    :math:`(n, L_k, w_i)` shared by the heads, :obj:`mask` :math:`(n, 1, 1, L_k)` (True = attend)
    or None. Returns a list of :math:`(n, H, L_q, w_i)`."""
    if vs[0].dim() == 4:
        return [_attend_per_head(q, k, vs[0], mask, p)]
    n, H, Lq, _ = q.shape
    a = _attention_weights(q, k, mask, p).reshape(n, H * Lq, -1)  # all heads in one product
    return [torch.bmm(a, v).view(n, H, Lq, -1) for v in vs]  # (n, H, Lq, w_i)


# (torch's own binding of the forward, and the backward's overload: 20-40 us a call faster
# than the op packets, measured on (20, 4, 8, 4) blocks)
_FLASH_CPU: Any = getattr(torch, '_scaled_dot_product_flash_attention_for_cpu', None)
_FLASH_CPU_BACKWARD: Any = getattr(getattr(
    torch.ops.aten, '_scaled_dot_product_flash_attention_for_cpu_backward', None), 'default', None)


class _FlashAttentionCPU(torch.autograd.Function):
    r""":func:`F.scaled_dot_product_attention` (scale 1, no dropout) as PyTorch's fused CPU
    kernel, forward and backward: on the inputs SDPA itself gives that kernel (:func:`_sdpa`
    checks them) the same kernels, so the same values and first derivatives bit for bit,
    with a backward pass that can itself be differentiated: PyTorch's fused
    kernel has no second derivative, so gradients of gradients (``create_graph=True``: force
    fields as gradients of an energy, gradient penalties, Hessians) failed through every block
    whose values are as wide as its keys. Under ``create_graph`` the backward pass runs the
    attention's gradients written out (:math:`A = \mathrm{softmax}(Q K^\top + M)`,
    :math:`dV = A^\top G`, :math:`dS = A \odot (G V^\top - \mathrm{rowsum}(A \odot G
    V^\top))`, :math:`dQ = dS\, K`, :math:`dK = dS^\top Q`), which autograd differentiates
    (its scores are materialised there: memory quadratic in the set size, for second
    derivatives only; the same derivatives up to rounding, and rows whose keys are all masked
    give 0, as the kernel's do); otherwise the fused backward kernel. A boolean mask becomes
    the additive mask SDPA makes of it (0 where True, :math:`-\infty` elsewhere)."""
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tensor:
        if mask is not None:  # as SDPA converts it: 0 where True, -inf elsewhere
            mask = torch.where(mask, 0.0, float('-inf')).to(q.dtype)
        out, lse = _FLASH_CPU(q, k, v, 0.0, False, attn_mask=mask, scale=1.0)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, out, lse, mask = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiable operations
            scores = torch.matmul(q, k.transpose(-1, -2))  # (n, H, Lq, Lk)
            valid = None
            if mask is not None:
                # a row with every key masked attends to nothing (the kernel's output and
                # gradients are 0 there): softmax of the unmasked scores, then zeroed, so that
                # no NaN of an all -inf softmax reaches the gradients
                valid = torch.isfinite(mask).any(dim=-1, keepdim=True)  # (.., Lq or 1, 1)
                scores = scores + mask.masked_fill(~valid, 0.0)
            a = torch.softmax(scores, dim=-1)
            if valid is not None:
                a = a * valid
            da = torch.matmul(grad, v.transpose(-1, -2))  # (n, H, Lq, Lk)
            ds = a * (da - (da * a).sum(dim=-1, keepdim=True))
            return (torch.matmul(ds, k), torch.matmul(ds.transpose(-1, -2), q),
                    torch.matmul(a.transpose(-1, -2), grad), None)
        grad_q, grad_k, grad_v = _FLASH_CPU_BACKWARD(grad, q, k, v, out, lse, 0.0,
                                                     False, attn_mask=mask, scale=1.0)
        return grad_q, grad_k, grad_v, None


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], p: float = 0.0) -> Tensor:
    r""":func:`F.scaled_dot_product_attention` with scale 1 and dropout :obj:`p`; where gradients
    are recorded on a CPU in full precision, without dropout, through
    :class:`_FlashAttentionCPU` (second derivatives), on the inputs SDPA itself gives the fused
    kernel (4-D, unit stride in the last dimension, as many batches and heads in q, k and v,
    no empty sequence and heads, a 2-D or 4-D boolean mask or none, the flash kernel not
    switched off), and not under autocast (which SDPA's own call follows), compiling, tracing
    (which records the kernel itself) or :mod:`torch.func` transforms (which take no function
    without ``setup_context``)."""
    # (compiling and tracing are tested first: under torch.compile the backend switch below is
    # a call dynamo does not trace, a graph break at every attention)
    if (p == 0.0 and q.device.type == 'cpu' and q.dtype in FULL_PRECISION
            and not torch.compiler.is_compiling() and not torch.jit.is_tracing()
            and _FLASH_CPU is not None and _FLASH_CPU_BACKWARD is not None
            and torch.is_grad_enabled()
            and (q.requires_grad or k.requires_grad or v.requires_grad)
            and k.dtype == q.dtype and v.dtype == q.dtype
            and q.dim() == 4 and k.dim() == 4 and v.dim() == 4
            and q.shape[:2] == k.shape[:2] == v.shape[:2] and k.size(2) == v.size(2)
            and q.size(-1) == k.size(-1) == v.size(-1) and q.size(2) > 0 and k.size(2) > 0
            and q.size(1) > 0 and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
            and (mask is None or (mask.dtype == torch.bool and mask.dim() in (2, 4)))
            and torch.backends.cuda.flash_sdp_enabled()  # (SDPA's switch of this kernel too)
            and not torch.is_autocast_enabled('cpu') and not _functorch_active()):
        return _FlashAttentionCPU.apply(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=1.0)


def _attend_per_head(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], p: float) -> Tensor:
    r""":func:`_attend` for one value tensor per head :math:`(n, H, L_k, w)`."""
    n, H, Lq, dk = q.shape
    Lk, w = v.shape[-2:]
    if _attention_written_out(q, k, v):  # forward-mode or nested derivatives (see there)
        return torch.matmul(_attention_weights(q, k, mask, p), v)
    if _pad_keys(n, H, Lq, Lk, dk, w, p):  # zero columns: the same scores (no dropout here)
        return _sdpa(F.pad(q, (0, w - dk)), F.pad(k, (0, w - dk)), v, mask)
    if q.device.type == 'cpu' and (p > 0 or (w != dk and q.dtype in FULL_PRECISION)):
        # with dropout, or values wider than the keys, PyTorch's CPU kernel falls back to a
        # composite path of its own (whose softmax also tests every row for being fully
        # masked: two more passes over the scores; no row here is, as only sets with keys are
        # packed; in half precision PyTorch's path computes the scores in float32, so it is
        # kept there); the three operations written out are faster with dropout (e.g. 33 against
        # 41 ms forward + backward for 32 x 4 blocks of 1024 x 16), within the noise without it
        # (one ISAB of 32 x 1,024 tokens, n_g = 8: inference min 315-324 against 327-338 ms),
        # and draw the mask with :func:`dropout` (on GPUs the fused kernels take dropout)
        return torch.matmul(_attention_weights(q, k, mask, p), v)
    return _sdpa(q, k, v, mask, p)  # (elsewhere, e.g. on a GPU, the kernels take the dropout)


class _DenseLayout(NamedTuple):
    r"""Where every query and key row goes in the padded blocks of :func:`_attention_dense`: a
    function of the set ids alone (and of the bucket-merge cost), so blocks that attend over the
    same sets share it (:func:`_dense_layout`)."""
    uniform: bool  # sorted rows, all sets of one size: a reshape, no gather
    nq0: int
    nk0: int
    empty: bool  # no set has both queries and keys
    q_rows: Tensor  # (Nq',) queries whose set has keys
    q_pos: Tensor  # (Nq',) their row in the flat padded query buffer
    k_rows: Tensor  # (Nk',)
    k_pos: Tensor  # (Nk',)
    tot_q: int
    tot_k: int
    key_mask: Tensor  # (tot_k,), True = a real key
    blocks: List[Tuple[int, int, int]]  # per bucket: (sets, padded queries, padded keys)
    q_all: bool = False  # q_rows is every query row, in order (no gather needed)
    k_all: bool = False  # k_rows is every key row, in order


def _compute_dense_layout(query_set: Tensor, kv_set: Tensor, num_sets: int,
                          pair_cost: int) -> _DenseLayout:
    device = query_set.device
    empty_long = torch.empty(0, dtype=torch.long, device=device)
    empty_bool = torch.empty(0, dtype=torch.bool, device=device)
    perm_q, counts_q, _, local_q = _sorted_layout(query_set, num_sets)
    perm_k, counts_k, _, local_k = ((perm_q, counts_q, None, local_q) if kv_set is query_set
                                    else _sorted_layout(kv_set, num_sets))  # self-attention
    nq0, nk0 = (int(counts_q[0]), int(counts_k[0])) if num_sets > 0 else (0, 0)
    if (num_sets > 0 and nq0 > 0 and nk0 > 0 and perm_q is None and perm_k is None
            and bool((counts_q == nq0).all()) and bool((counts_k == nk0).all())):
        return _DenseLayout(True, nq0, nk0, False, empty_long, empty_long, empty_long,
                            empty_long, 0, 0, empty_bool, [])
    active = (counts_q > 0) & (counts_k > 0)  # (B,)
    sets_active = torch.nonzero(active).view(-1)  # (B',)
    if sets_active.numel() == 0:
        return _DenseLayout(False, 0, 0, True, empty_long, empty_long, empty_long, empty_long,
                            0, 0, empty_bool, [])
    keys = torch.stack([_bucket_size(counts_q), _bucket_size(counts_k)], dim=1)[active]
    sizes = torch.stack([counts_q, counts_k], dim=1)[active]  # (B', 2) exact sizes
    buckets, bucket_of = _merge_buckets(keys, sizes, pair_cost=pair_cost)
    nb = torch.bincount(bucket_of, minlength=buckets.size(0))  # (U,) sets per bucket
    pq, pk = buckets[:, 0], buckets[:, 1]  # (U,)
    # every bucket is a block of nb * pq query rows (nb * pk key rows) in one flat buffer
    off_q = torch.cumsum(nb * pq, 0) - nb * pq  # (U,)
    off_k = torch.cumsum(nb * pk, 0) - nb * pk  # (U,)
    # position of each active set inside its bucket (ranks within groups, vectorised)
    order = torch.argsort(bucket_of, stable=True)
    first = torch.searchsorted(bucket_of[order], bucket_of[order], right=False)
    slot = torch.empty_like(bucket_of)
    slot[order] = torch.arange(order.numel(), device=device) - first  # (B',)
    set_bucket = torch.full((num_sets, ), -1, dtype=torch.long, device=device)
    set_bucket[sets_active] = bucket_of
    set_start_q = torch.zeros(num_sets, dtype=torch.long, device=device)
    set_start_k = torch.zeros(num_sets, dtype=torch.long, device=device)
    set_start_q[sets_active] = off_q[bucket_of] + slot * pq[bucket_of]
    set_start_k[sets_active] = off_k[bucket_of] + slot * pk[bucket_of]

    # (index_select, not indexing: several times faster for these 1-D gathers on a CPU; where
    # every row takes part the gathers by q_rows / k_rows are the identity and skipped)
    q_keep = set_bucket.index_select(0, query_set) >= 0  # (Nq,) queries whose set has keys
    q_rows = torch.nonzero(q_keep).view(-1)  # (Nq',)
    q_all = q_rows.numel() == query_set.numel()
    q_pos = (set_start_q.index_select(0, query_set) + local_q if q_all else
             set_start_q.index_select(0, query_set.index_select(0, q_rows))
             + local_q.index_select(0, q_rows))  # (Nq',)
    k_rows = torch.nonzero(set_bucket.index_select(0, kv_set) >= 0).view(-1)  # (Nk',)
    k_all = k_rows.numel() == kv_set.numel()
    k_pos = (set_start_k.index_select(0, kv_set) + local_k if k_all else
             set_start_k.index_select(0, kv_set.index_select(0, k_rows))
             + local_k.index_select(0, k_rows))  # (Nk',)
    tot_q, tot_k = int((nb * pq).sum()), int((nb * pk).sum())
    key_mask = torch.zeros(tot_k, dtype=torch.bool, device=device)
    key_mask[k_pos] = True  # (tot_k,), True = a real key
    blocks = list(zip(nb.tolist(), pq.tolist(), pk.tolist()))
    return _DenseLayout(False, 0, 0, False, q_rows, q_pos, k_rows, k_pos, tot_q, tot_k, key_mask,
                        blocks, q_all=q_all, k_all=k_all)


# The layouts of the last few (query_set, kv_set) pairs: the blocks of a model attend over the
# same sets again and again in one forward pass (every SAB of a Set Transformer, the two MABs of
# each ISAB), and every call of a PyG aggregation on one graph attends over the same
# neighbourhoods (PyG passes a new view of `edge_index[1]` each time); finding the layout
# (sorting, bucketing, about 275 of the 1,235 operations of a `rigid` SAGEConv step on 10^3 nodes
# and most of its host synchronisations: `benchmarks/launches.py`) costs as much as a small
# block's attention, and on a GPU each operation is a launch. An entry is used for set ids of the
# same values, compared with a copy kept in the entry (whatever tensor holds them: writes that
# leave the version counter alone, through `.data` or a NumPy array sharing the memory, are
# caught too), on the same device, with the same merge settings. Entries of at most
# LAYOUT_KEEP_ROWS set ids (queries plus keys) outlive their tensors, up to LAYOUT_KEEP_TOTAL_ROWS
# in all (their copies and layouts hold about 20-25 bytes per row: about 100 MiB at most); larger
# ones are dropped when either tensor is freed (weak references), so that no large layout
# outlives its input. LAYOUT_CACHE_SIZE entries hold the layouts of a few differently sized
# layers (each width and head count is a layout of its own: three per neighbourhood
# aggregation).
LAYOUT_CACHE_SIZE = 12
LAYOUT_KEEP_ROWS = 2 ** 20
LAYOUT_KEEP_TOTAL_ROWS = 2 ** 22
#: key -> (settings, query-id copy, key-id copy, layout, weak references or None, rows kept)
_layout_cache: 'OrderedDict[int, Tuple[tuple, Tensor, Tensor, _DenseLayout, Any, int]]' = \
    OrderedDict()
_layout_serial = [0]
# A weak reference's callback may run on this thread while the cache is being read or changed
# (the cyclic garbage collector frees set ids at any allocation): it then only queues its key,
# and the key leaves the cache when the outermost holder lets go (_layout_cache_held).
_layout_busy = [0]
_layout_dropped: List[int] = []


@contextlib.contextmanager
def _layout_cache_held() -> Iterator[None]:
    with _cache_lock:
        _layout_busy[0] += 1
        try:
            yield
        finally:
            _layout_busy[0] -= 1
            if not _layout_busy[0]:
                while _layout_dropped:
                    _layout_cache.pop(_layout_dropped.pop(), None)


def _drop_layout(key: int) -> None:
    with _cache_lock:
        if _layout_busy[0]:  # this thread is inside the cache: leave it to the holder
            _layout_dropped.append(key)
        else:
            _layout_cache.pop(key, None)


def clear_layout_cache() -> None:
    r"""Forgets every cached attention layout (see :func:`_dense_layout`): e.g. to release their
    memory, or to count or time the operations of a first call on a graph."""
    with _layout_cache_held():
        _layout_cache.clear()


def _layout_settings(query_set: Tensor, kv_set: Tensor, num_sets: int, pair_cost: int) -> tuple:
    return (num_sets, pair_cost, MERGE_RATIO, MERGE_OVERHEAD, MERGE_ROWS_RATIO,
            MERGE_ROWS_OVERHEAD, query_set.device, kv_set.device, query_set.dtype, kv_set.dtype,
            tuple(query_set.shape), tuple(kv_set.shape))


def _dense_layout(query_set: Tensor, kv_set: Tensor, num_sets: int,
                  pair_cost: int) -> _DenseLayout:
    if torch.compiler.is_compiling():
        # found outside the compiled graph, with the cache: one graph break here instead of
        # one at each host read of the search (a dozen), and a cached layout not found again
        return _dense_layout_eager(query_set, kv_set, num_sets, pair_cost)
    if (LAYOUT_CACHE_SIZE <= 0 or not _caching() or query_set.is_inference()
            or kv_set.is_inference()):
        return _compute_dense_layout(query_set, kv_set, num_sets, pair_cost)
    settings = _layout_settings(query_set, kv_set, num_sets, pair_cost)
    with _layout_cache_held():  # the most recent first
        candidates = [(key, e) for key, e in reversed(_layout_cache.items())
                      if e[0] == settings]
    for key, (_, q_copy, kv_copy, layout, _refs, _rows) in candidates:
        # (a self-attention entry serves a self-attention call with one comparison)
        if torch.equal(q_copy, query_set) and (
                (kv_copy is q_copy and kv_set is query_set) or torch.equal(kv_copy, kv_set)):
            with _layout_cache_held():
                if key in _layout_cache:
                    _layout_cache.move_to_end(key)
            return layout
    layout = _compute_dense_layout(query_set, kv_set, num_sets, pair_cost)
    with _cache_lock:
        _layout_serial[0] += 1
        key = _layout_serial[0]
    rows = query_set.numel() + kv_set.numel()
    refs: Any = None
    if rows > LAYOUT_KEEP_ROWS:  # kept only while its set ids live
        def drop(_ref: Any, key: int = key) -> None:
            _drop_layout(key)

        refs = (weakref.ref(query_set, drop), weakref.ref(kv_set, drop))
        rows = 0
    q_copy = query_set.clone()
    entry = (settings, q_copy, q_copy if kv_set is query_set else kv_set.clone(), layout, refs,
             rows)
    with _layout_cache_held():
        _layout_cache[key] = entry
        while len(_layout_cache) > 1 and (
                len(_layout_cache) > LAYOUT_CACHE_SIZE
                or sum(e[5] for e in _layout_cache.values()) > LAYOUT_KEEP_TOTAL_ROWS):
            _layout_cache.popitem(last=False)  # the least recently used
    return layout


_dense_layout_eager = torch.compiler.disable(_dense_layout)


def _attention_dense(q: Tensor, k: Tensor, vs: Tuple[Tensor, ...], query_set: Tensor,
                     kv_set: Tensor, num_sets: int, dropout: float,
                     training: bool, chunk: Optional[int] = None,
                     key_col: Optional[int] = None) -> List[Tensor]:
    Nq, H, dk = q.shape
    ws = [v.size(-1) for v in vs]
    shared = vs[0].dim() == 2
    p = dropout if training else 0.0
    out_dtype = torch.promote_types(q.dtype, vs[0].dtype)
    lay = _dense_layout(query_set, kv_set, num_sets, H * (dk + sum(ws)))

    # Exact dense path: rows sorted by set and all sets of one size -> a reshape, no gather.
    if lay.uniform:
        nq0, nk0 = lay.nq0, lay.nk0
        qd = q.view(num_sets, nq0, H, dk).transpose(1, 2)  # (B, H, nq, dk)
        kd = k.view(num_sets, nk0, H, dk).transpose(1, 2)  # (B, H, nk, dk)
        vds = [(v.view(num_sets, nk0, w) if shared else
                v.view(num_sets, nk0, H, w).transpose(1, 2)).to(out_dtype)
               for v, w in zip(vs, ws)]  # (B, nk, w) or (B, H, nk, w)
        exact = _attend(qd, kd, vds, None, p)  # (B, H, nq, w) each
        return [_to_rows(out, chunk) for out in exact]
    if lay.empty:
        return [_zero_rows(v, Nq, H, w, out_dtype, chunk, q, k) for v, w in zip(vs, ws)]

    q_rows, q_pos, k_rows, k_pos = lay.q_rows, lay.q_pos, lay.k_rows, lay.k_pos
    # where every row takes part (the usual case) the rows are placed as they lie: no gathered
    # copy (one (N, H, d_k) temporary fewer per buffer; the same values)
    qbuf = _place(q if lay.q_all else q[q_rows], q_pos, lay.tot_q)  # (tot_q, H, dk)
    vbufs = [_place((v if lay.k_all else v[k_rows]).to(out_dtype), k_pos, lay.tot_k)
             for v in vs]
    if key_col is not None:  # the keys are columns of the first values: a view of their buffer
        kbuf = vbufs[0][:, key_col:key_col + dk].unsqueeze(1)  # (tot_k, 1, dk)
    else:
        kbuf = _place(k if lay.k_all else k[k_rows], k_pos, lay.tot_k)  # (tot_k, H, dk)

    outs = _attend_buckets(qbuf, kbuf, vbufs, lay.key_mask, lay.blocks, ws, shared, p, chunk)
    # the packed buffers are dropped before the outputs are joined and reordered: without
    # gradients nothing else holds them, so the peak of inference no longer counts them beside
    # the joined and reordered outputs (with gradients the kernel keeps what its backward needs)
    del qbuf, kbuf, vbufs
    results = []
    for out in outs:
        # index_select: the positions are distinct, so its backward (index_add_ onto zeros)
        # gives the gradients of indexing exactly, and it is several times faster on a CPU
        joined = torch.cat(out, 0) if len(out) > 1 else out[0]  # (tot_q, ...)
        out.clear()  # the buckets' outputs, joined (without gradients, freed here)
        vals = joined.index_select(0, q_pos)  # (Nq', ...)
        del joined
        if q_rows.numel() != Nq:  # some queries have no keys: zero rows for them
            vals = _place(vals, q_rows, Nq)
        results.append(vals)
    return results


def _attend_buckets(qbuf: Tensor, kbuf: Tensor, vbufs: List[Tensor], key_mask: Tensor,
                    blocks: Sequence[Tuple[int, int, int]], ws: List[int], shared: bool,
                    p: float, chunk: Optional[int]) -> List[List[Tensor]]:
    r"""The attention of each size bucket of the packed buffers of :func:`_attention_dense`:
    per value, the buckets' outputs as query rows (their views of the buffers end here)."""
    H, dk = qbuf.shape[1:]
    # split (not slicing): autograd joins the pieces' gradients with one concatenation instead
    # of a full-size zero tensor per bucket
    q_sizes = [nb_b * pq_b for nb_b, pq_b, _ in blocks]
    k_sizes = [nb_b * pk_b for nb_b, _, pk_b in blocks]
    vb_split = list(zip(*[vbuf.split(k_sizes) for vbuf in vbufs]))  # per bucket, per value
    outs: List[List[Tensor]] = [[] for _ in vbufs]  # per value, per bucket
    for b, ((nb_b, pq_b, pk_b), qb, kb, mb) in enumerate(zip(
            blocks, qbuf.split(q_sizes), kbuf.split(k_sizes), key_mask.split(k_sizes))):
        qd = qb.view(nb_b, pq_b, H, dk).transpose(1, 2)  # (n, H, pq, dk)
        kd = kb.view(nb_b, pk_b, H, dk).transpose(1, 2)  # (n, H, pk, dk)
        vds = [vb.view(nb_b, pk_b, w) if shared else vb.view(nb_b, pk_b, H, w).transpose(1, 2)
               for vb, w in zip(vb_split[b], ws)]  # (n, pk, w) or (n, H, pk, w)
        mask = mb.view(nb_b, 1, 1, pk_b)  # (n, 1, 1, pk)
        for i, od in enumerate(_attend(qd, kd, vds, mask, p)):  # (n, H, pq, w)
            outs[i].append(_to_rows(od, chunk))
    return outs
