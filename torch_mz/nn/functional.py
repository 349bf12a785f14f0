r"""Set-grouped attention on PyG's flat layout, without padding to the largest set.

Queries and keys/values are flat token tensors whose rows belong to sets (a ``set id`` per row,
as PyG's ``batch``/``index`` vector). Attention never crosses sets. Two exact paths compute the
same result:

* ``'scatter'``: every (query, key) pair of the same set is enumerated, scores are normalised
  with a segment softmax (:func:`torch_geometric.utils.softmax`), and values are aggregated by a
  sparse-times-dense product (no per-pair copy of the values). Memory :math:`O(P H + N w)` for
  :math:`P = \sum_b n^q_b n^k_b` pairs.
* ``'dense'``: sets are grouped into buckets of similar size (sizes rounded up to at most 25%
  above the true size, then neighbouring buckets merged while the merged padding costs at most
  25% more pairs plus a fixed allowance that stands for the per-bucket launch cost), each bucket
  is gathered into a dense block padded to its largest set and attended with batched matrix
  products (:func:`torch.nn.functional.scaled_dot_product_attention`). Where every set has the
  same size and the rows are sorted, there is a single bucket, no padding and no gather: the
  exact dense path. Cost :math:`O(\sum_b n^q_b n^k_b)` up to the bucket padding.

No Python loop runs over individual sets: the only loop is over the (few) size buckets.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.utils import softmax as segment_softmax

PATHS = ('auto', 'dense', 'scatter')


def check_choice(what: str, value: str, choices) -> None:
    r"""Raises a :class:`ValueError` naming :obj:`what` unless :obj:`value` is one of
    :obj:`choices`."""
    if value not in choices:
        raise ValueError(f"Unknown {what} '{value}' (expected one of {tuple(choices)})")


def set_counts(set_id: Tensor, num_sets: int) -> Tensor:
    r"""Number of rows per set, shape :obj:`(num_sets,)`."""
    return torch.bincount(set_id, minlength=num_sets)


def repeat_per_set(num_sets: int, k: int, device: torch.device) -> Tensor:
    r"""Set ids of :obj:`k` tokens per set: :obj:`[0]*k + [1]*k + ...`, shape :obj:`(num_sets*k,)`."""
    return torch.arange(num_sets, device=device).repeat_interleave(k)


def set_mean(x: Tensor, set_id: Tensor, num_sets: int) -> Tensor:
    r"""Mean of the rows of each set, zero for an empty set. Shape :obj:`(num_sets, F)`."""
    out = x.new_zeros(num_sets, x.size(-1)).index_add_(0, set_id, x)  # (B, F)
    count = set_counts(set_id, num_sets).clamp(min=1).to(x.dtype)  # (B,)
    return out / count.unsqueeze(-1)


def set_std(x: Tensor, set_id: Tensor, num_sets: int, mean: Optional[Tensor] = None,
            eps: float = 1e-6) -> Tensor:
    r"""Per-feature standard deviation of the rows of each set, :math:`\sqrt{\mathrm{Var}+\epsilon}`
    (population variance; a set of zero or one rows has variance 0). Shape :obj:`(num_sets, F)`."""
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


# Merging two size buckets saves a round of kernel launches; it is done when the padded cost of
# the merged bucket (in query-key pairs) is at most MERGE_RATIO times the separate costs plus
# MERGE_OVERHEAD pairs.
MERGE_RATIO = 1.25
MERGE_OVERHEAD = 8192


def _merge_buckets(keys: Tensor, sizes: Tensor) -> Tuple[Tensor, Tensor]:
    r"""Groups sets into padded buckets. :obj:`keys` are the rounded ``(n_q, n_k)`` of each set;
    sets with equal keys share a bucket, and neighbouring buckets (ordered by padded cost) are
    merged greedily while that costs little padding. Returns the padded ``(n_q, n_k)`` of each
    bucket, shape :obj:`(U, 2)`, and the bucket of each set."""
    uniq, inverse, counts = torch.unique(keys, dim=0, return_inverse=True, return_counts=True)
    # the true largest sizes in each key group (padding only up to what is there)
    max_q = torch.zeros(uniq.size(0), dtype=torch.long, device=keys.device)
    max_k = torch.zeros(uniq.size(0), dtype=torch.long, device=keys.device)
    max_q.scatter_reduce_(0, inverse, sizes[:, 0], reduce='amax')
    max_k.scatter_reduce_(0, inverse, sizes[:, 1], reduce='amax')
    order = torch.argsort(max_q * max_k).tolist()
    mq, mk, cnt = max_q.tolist(), max_k.tolist(), counts.tolist()
    group = [0] * len(order)
    padded = []
    cur_q = cur_k = cur_n = 0
    cur_sep = 0
    for i in order:
        new_q, new_k = max(cur_q, mq[i]), max(cur_k, mk[i])
        sep = cur_sep + cnt[i] * mq[i] * mk[i]
        if cur_n == 0 or (cur_n + cnt[i]) * new_q * new_k <= MERGE_RATIO * sep + MERGE_OVERHEAD:
            cur_q, cur_k, cur_n, cur_sep = new_q, new_k, cur_n + cnt[i], sep
        else:
            padded.append((cur_q, cur_k))
            cur_q, cur_k, cur_n, cur_sep = mq[i], mk[i], cnt[i], cnt[i] * mq[i] * mk[i]
        group[i] = len(padded)
    padded.append((cur_q, cur_k))
    group_t = torch.tensor(group, dtype=torch.long, device=keys.device)
    return torch.tensor(padded, dtype=torch.long, device=keys.device), group_t[inverse]


def _sorted_layout(set_id: Tensor, num_sets: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""Returns (perm, counts, ptr, local): :obj:`perm` sorts rows by set (stable), :obj:`ptr` is the
    CSR offset of each set in sorted order and :obj:`local[i]` is the position of row :obj:`i`
    inside its set (in the original row order)."""
    counts = set_counts(set_id, num_sets)  # (B,)
    ptr = torch.zeros(num_sets + 1, dtype=torch.long, device=set_id.device)
    ptr[1:] = torch.cumsum(counts, 0)
    if set_id.numel() > 1 and bool((set_id[1:] >= set_id[:-1]).all()):
        perm = torch.arange(set_id.numel(), device=set_id.device)
    else:
        perm = torch.argsort(set_id, stable=True)
    local_sorted = torch.arange(set_id.numel(), device=set_id.device) - ptr[set_id[perm]]  # (N,)
    local = torch.empty_like(local_sorted)
    local[perm] = local_sorted
    return perm, counts, ptr, local


def grouped_attention(q: Tensor, k: Tensor, v: Tensor, q_set: Tensor, kv_set: Tensor,
                      num_sets: int, dropout: float = 0.0, training: bool = False,
                      path: str = 'auto') -> Tensor:
    r"""Multi-head attention from each query to the keys/values of its own set.

    .. math::
        \mathrm{out}_i = \sum_{j:\, s(j) = s(i)} \mathrm{softmax}_j\big(q_i^\top k_j\big)\, v_j

    Scores are used as given (scale :obj:`q` beforehand, e.g. by :math:`1/\sqrt{d_k}`). A query
    whose set has no keys gets a zero output.

    Args:
        q (Tensor): Queries :math:`(N_q, H, d_k)`.
        k (Tensor): Keys :math:`(N_k, H, d_k)`.
        v (Tensor): Values :math:`(N_k, H, w)`.
        q_set (Tensor): Set id of each query :math:`(N_q,)`, need not be sorted.
        kv_set (Tensor): Set id of each key :math:`(N_k,)`, need not be sorted.
        num_sets (int): Number of sets :math:`B` (ids lie in :obj:`[0, B)`).
        dropout (float): Dropout probability on attention weights (default: :obj:`0.0`).
        training (bool): Whether dropout is active (default: :obj:`False`).
        path (str): :obj:`'dense'` (bucketed), :obj:`'scatter'`, or :obj:`'auto'` (dense)
            (default: :obj:`'auto'`).

    Shapes:
        - **output:** :math:`(N_q, H, w)`
    """
    check_choice('attention path', path, PATHS)
    if path == 'scatter':
        return _attention_scatter(q, k, v, q_set, kv_set, num_sets, dropout, training)
    return _attention_dense(q, k, v, q_set, kv_set, num_sets, dropout, training)


def set_pairs(q_set: Tensor, kv_set: Tensor, num_sets: int) -> Tuple[Tensor, Tensor]:
    r"""All pairs :math:`(i, j)` of a row :math:`i` of the first group and a row :math:`j` of the
    second group that belong to the same set, :math:`P = \sum_b n^q_b n^k_b` pairs, enumerated
    without a loop over sets. Pairs come grouped by set and, inside a set, by :math:`i`.

    Returns:
        (Tensor, Tensor): row indices :math:`(P,)` into the first and the second group.
    """
    device = q_set.device
    perm_q, counts_q, ptr_q, _ = _sorted_layout(q_set, num_sets)
    perm_k, counts_k, ptr_k, _ = _sorted_layout(kv_set, num_sets)
    pairs = counts_q * counts_k  # (B,)
    P = int(pairs.sum())
    pair_set = torch.repeat_interleave(torch.arange(num_sets, device=device), pairs,
                                       output_size=P)  # (P,)
    pair_ptr = torch.cumsum(pairs, 0) - pairs  # (B,)
    local = torch.arange(P, device=device) - pair_ptr[pair_set]  # (P,)
    nk = counts_k[pair_set]  # (P,)
    iq = perm_q[ptr_q[pair_set] + torch.div(local, nk, rounding_mode='floor')]  # (P,)
    jk = perm_k[ptr_k[pair_set] + local % nk]  # (P,)
    return iq, jk


def _attention_scatter(q: Tensor, k: Tensor, v: Tensor, q_set: Tensor, kv_set: Tensor,
                       num_sets: int, dropout: float, training: bool) -> Tensor:
    Nq, H, _ = q.shape
    Nk, w = k.size(0), v.size(-1)
    device = q.device
    out_dtype = torch.promote_types(q.dtype, v.dtype)
    iq, jk = set_pairs(q_set, kv_set, num_sets)  # (P,), (P,)
    if iq.numel() == 0:
        return v.new_zeros(Nq, H, w, dtype=out_dtype)

    logits = (q[iq] * k[jk]).sum(dim=-1)  # (P, H)
    alpha = segment_softmax(logits, iq, num_nodes=Nq)  # (P, H)
    if dropout > 0 and training:
        alpha = F.dropout(alpha, p=dropout, training=True)

    # out[iq, h] += alpha[p, h] * v[jk, h] as one sparse (Nq H x Nk H) times dense (Nk H x w):
    heads = torch.arange(H, device=device)
    rows = (iq.unsqueeze(1) * H + heads).reshape(-1)  # (P * H,)
    cols = (jk.unsqueeze(1) * H + heads).reshape(-1)  # (P * H,)
    # Sparse kernels do not run in reduced precision everywhere: compute them in float32 or more.
    dtype = torch.promote_types(out_dtype, torch.float32)
    with torch.autocast(device_type=device.type, enabled=False):
        A = torch.sparse_coo_tensor(torch.stack([rows, cols]), alpha.reshape(-1).to(dtype),
                                    (Nq * H, Nk * H), check_invariants=False)
        out = torch.sparse.mm(A, v.reshape(Nk * H, w).to(dtype))  # (Nq * H, w)
    return out.view(Nq, H, w).to(out_dtype)


def _attention_dense(q: Tensor, k: Tensor, v: Tensor, q_set: Tensor, kv_set: Tensor,
                     num_sets: int, dropout: float, training: bool) -> Tensor:
    Nq, H, dk = q.shape
    w = v.size(-1)
    device = q.device
    p = dropout if training else 0.0
    perm_q, counts_q, _, local_q = _sorted_layout(q_set, num_sets)
    perm_k, counts_k, _, local_k = _sorted_layout(kv_set, num_sets)

    # Exact dense path: rows sorted by set and all sets of one size -> a reshape, no gather.
    nq0, nk0 = (int(counts_q[0]), int(counts_k[0])) if num_sets > 0 else (0, 0)
    if (num_sets > 0 and nq0 > 0 and nk0 > 0 and bool((counts_q == nq0).all())
            and bool((counts_k == nk0).all())
            and bool((perm_q == torch.arange(Nq, device=device)).all())
            and bool((perm_k == torch.arange(k.size(0), device=device)).all())):
        qd = q.view(num_sets, nq0, H, dk).transpose(1, 2)  # (B, H, nq, dk)
        kd = k.view(num_sets, nk0, H, dk).transpose(1, 2)  # (B, H, nk, dk)
        vd = v.view(num_sets, nk0, H, w).transpose(1, 2)  # (B, H, nk, w)
        out = F.scaled_dot_product_attention(qd, kd, vd, dropout_p=p, scale=1.0)  # (B,H,nq,w)
        return out.transpose(1, 2).reshape(Nq, H, w)

    bq = _bucket_size(counts_q)  # (B,)
    bk = _bucket_size(counts_k)  # (B,)
    active = (counts_q > 0) & (counts_k > 0)  # (B,)
    keys = torch.stack([bq, bk], dim=1)[active]  # (B', 2)
    sets_active = torch.nonzero(active).view(-1)  # (B',)
    if sets_active.numel() > 0:
        # exact sizes of each active set, to size merged buckets by their largest member
        sizes = torch.stack([counts_q, counts_k], dim=1)[active]  # (B', 2)
        buckets, bucket_of = _merge_buckets(keys, sizes)
    else:
        buckets = keys
    set_bucket = torch.full((num_sets, ), -1, dtype=torch.long, device=device)
    slot = torch.zeros(num_sets, dtype=torch.long, device=device)
    if sets_active.numel() > 0:
        set_bucket[sets_active] = bucket_of
        # position of each set inside its bucket (ranks within groups, vectorised)
        order = torch.argsort(bucket_of, stable=True)
        first = torch.searchsorted(bucket_of[order], bucket_of[order], right=False)
        slot[sets_active[order]] = torch.arange(order.numel(), device=device) - first
    qb_of_row = set_bucket[q_set]  # (Nq,)
    kb_of_row = set_bucket[kv_set]  # (Nk,)
    sets_per_bucket = torch.bincount(bucket_of, minlength=buckets.size(0)).tolist() \
        if sets_active.numel() > 0 else []
    rows_out, vals_out = [], []
    for b, (pq, pk) in enumerate(buckets.tolist()):
        q_rows = torch.nonzero(qb_of_row == b).view(-1)  # (n_q_b,)
        k_rows = torch.nonzero(kb_of_row == b).view(-1)  # (n_k_b,)
        nb = sets_per_bucket[b]
        q_pos = slot[q_set[q_rows]] * pq + local_q[q_rows]  # (n_q_b,)
        k_pos = slot[kv_set[k_rows]] * pk + local_k[k_rows]  # (n_k_b,)
        qd = q.new_zeros(nb * pq, H, dk).index_copy(0, q_pos, q[q_rows])  # (nb*pq, H, dk)
        kd = k.new_zeros(nb * pk, H, dk).index_copy(0, k_pos, k[k_rows])  # (nb*pk, H, dk)
        vd = v.new_zeros(nb * pk, H, w).index_copy(0, k_pos, v[k_rows])  # (nb*pk, H, w)
        mask = torch.zeros(nb * pk, dtype=torch.bool, device=device)
        mask[k_pos] = True
        mask = mask.view(nb, 1, 1, pk)  # (nb, 1, 1, pk), True = attend
        qd = qd.view(nb, pq, H, dk).transpose(1, 2)  # (nb, H, pq, dk)
        kd = kd.view(nb, pk, H, dk).transpose(1, 2)  # (nb, H, pk, dk)
        vd = vd.view(nb, pk, H, w).transpose(1, 2)  # (nb, H, pk, w)
        od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, dropout_p=p, scale=1.0)
        od = od.transpose(1, 2).reshape(nb * pq, H, w)  # (nb*pq, H, w)
        rows_out.append(q_rows)
        vals_out.append(od[q_pos])
    if not rows_out:
        return v.new_zeros(Nq, H, w, dtype=torch.promote_types(q.dtype, v.dtype))
    vals = torch.cat(vals_out, 0)  # (Nq', H, w)
    return vals.new_zeros(Nq, H, w).index_copy(0, torch.cat(rows_out, 0), vals)
