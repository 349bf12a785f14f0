r"""The workloads the benchmark scripts share: the random graphs and aggregations of
``benchmarks/message_passing.py`` (and ``launches.py``), and the point-cloud batch and model
presets of ``benchmarks/training_step.py`` (and ``launches.py``), so that one script need not
import another. Moved verbatim from those scripts: the same graphs, seeds and models."""
from typing import Optional, Sequence

import numpy as np
import torch

from torch_mz.models import MZSetTransformer, build_model

AGGRS = ('pyg', 'pyg-flat', 'rigid', 'rigid-ckpt-attn', 'rigid-chunks', 'rigid-whole', 'default',
         'default-eager', 'default-fused', 'default-ckpt', 'default-ckpt-attn', 'default-chunks',
         'default-whole', 'mz-ng8', 'paper', 'rigid-unfolded', 'default-unfolded', 'rigid-merged',
         'pyg-nofast')
#: ``rigid-merged``: the dense attention's size buckets merged more freely (module settings of
#: :mod:`torch_mz.nn.functional`, set in that row's own process only)
MERGED = dict(MERGE_OVERHEAD=4_000_000, MERGE_ROWS_RATIO=2.0)
DEGREES = ('poisson', 'power-law')
#: PyG's blocks among :data:`AGGRS` (``pyg-nofast`` is ``pyg`` with PyTorch's attention fast
#: path off) and their heads: their width must be a multiple of the heads
PYG_AGGRS, PYG_HEADS = ('pyg', 'pyg-flat', 'pyg-nofast'), 4


def random_graph(num_nodes: int, degrees: str, avg_degree: int = 10, seed: int = 0):
    r"""``edge_index`` of a random directed graph sorted by destination, with Poisson or
    power-law in-degrees of mean :obj:`avg_degree`; sources are uniform."""
    rng = np.random.default_rng(seed)
    if degrees == 'poisson':
        deg = rng.poisson(avg_degree, num_nodes)
    elif degrees == 'power-law':
        w = 1.0 / np.arange(1, num_nodes + 1)
        deg = np.floor(w / w.sum() * avg_degree * num_nodes).astype(np.int64)
        deg[: avg_degree * num_nodes - deg.sum()] += 1  # exactly avg_degree * num_nodes edges
        deg = rng.permutation(deg)
    else:
        raise ValueError(f"Unknown degree distribution '{degrees}'")
    dst = np.repeat(np.arange(num_nodes), deg)
    src = rng.integers(0, num_nodes, dst.size)
    return torch.from_numpy(np.stack([src, dst])).long()


def pyg_width_problem(aggrs: Sequence[str], dims: Sequence[int]) -> Optional[str]:
    r"""Why :func:`build_aggr` cannot build PyG's blocks among :obj:`aggrs` at the widths
    :obj:`dims` (one not a multiple of their :data:`PYG_HEADS` heads: PyTorch's attention
    asserts it), for a script's usage error before anything is measured; :obj:`None` where it
    can."""
    pyg = [aggr for aggr in aggrs if aggr in PYG_AGGRS]
    odd = [dim for dim in dims if dim % PYG_HEADS]
    if pyg and odd:
        return (f"{', '.join(map(str, odd))} not a multiple of the {PYG_HEADS} heads of "
                f"{', '.join(pyg)} (in --aggrs)")
    return None


def build_aggr(name: str, d: int, group_rows: Optional[int] = None):
    from torch_geometric.nn.aggr import SetTransformerAggregation

    from torch_mz.nn import FlatSetTransformerAggregation, MZAggregation
    from torch_mz.nn.aggr import auto_chunk_rows
    # rows per group (*-chunks): by default the groups 'auto' takes at this width
    group_rows = auto_chunk_rows(d) if group_rows is None else group_rows
    if name in ('pyg', 'pyg-nofast'):  # pyg-nofast: run_one turns the fast path off
        return SetTransformerAggregation(d, heads=PYG_HEADS)
    if name == 'pyg-flat':
        return FlatSetTransformerAggregation(d, heads=PYG_HEADS)
    if name == 'rigid':
        return MZAggregation(d, value='rigid', num_generators=0)
    if name in ('default', 'default-eager', 'default-fused'):
        return MZAggregation(d)
    # the checkpointed variants keep their meaning: the whole input, with their checkpointing
    if name == 'default-ckpt':
        return MZAggregation(d, checkpoint=True, chunk_size=None)
    if name == 'default-ckpt-attn':
        return MZAggregation(d, checkpoint='attention', chunk_size=None)
    if name == 'rigid-ckpt-attn':
        return MZAggregation(d, value='rigid', num_generators=0, checkpoint='attention',
                             chunk_size=None)
    if name == 'default-whole':
        return MZAggregation(d, chunk_size=None)
    if name == 'rigid-whole':
        return MZAggregation(d, value='rigid', num_generators=0, chunk_size=None)
    if name == 'default-chunks':
        return MZAggregation(d, chunk_size=group_rows, checkpoint='chunks')
    if name == 'rigid-chunks':
        return MZAggregation(d, value='rigid', num_generators=0, chunk_size=group_rows,
                             checkpoint='chunks')
    if name == 'rigid-unfolded':
        return MZAggregation(d, value='rigid', num_generators=0, fold_keys=False)
    if name == 'rigid-merged':  # the same module; run_one merges the buckets more freely
        return MZAggregation(d, value='rigid', num_generators=0)
    if name == 'default-unfolded':
        return MZAggregation(d, fold_keys=False)
    if name == 'mz-ng8':
        return MZAggregation(d, num_generators=8, num_matrix_generators=4)
    if name == 'paper':
        return MZAggregation(d, preset='paper')
    raise ValueError(f"Unknown aggregation '{name}'")


def fit_slope(rows, key):
    r"""Least-squares slope of log(key) against log(nodes + edges)."""
    pts = [(np.log(r['nodes'] + r['edges']), np.log(r[key])) for r in rows
           if r.get(key) and 'error' not in r]
    if len(pts) < 2:
        return None
    xs, ys = zip(*pts)
    return float(np.polyfit(xs, ys, 1)[0])


def make_batch(clouds: int, points: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randn(clouds * points, 3, generator=g)
    pos = pos / pos.norm(dim=-1, keepdim=True).clamp(min=1e-6) * torch.rand(
        clouds * points, 1, generator=g).pow(1 / 3)  # uniform in the unit ball
    batch = torch.arange(clouds).repeat_interleave(points)
    y = torch.randint(0, 40, (clouds, ), generator=g)
    return pos, batch, y


def build(name: str, radius: float, body: Optional[dict] = None):
    r"""The preset :obj:`name`; :obj:`body` (the options of a row's ``+whole`` / ``+groups`` /
    ``+kept`` suffix) goes to the MZ-Set-Transformer's aggregation and is refused for other
    presets."""
    torch.manual_seed(0)
    if name == 'egnn' and not body:
        return build_model('egnn', 3, 40, pos_dim=3, radius=radius)
    if body:
        if name == 'egnn' or not isinstance(build_model(name, 3, 40), MZSetTransformer):
            raise ValueError(f"+whole, +groups and +kept apply to the MZ-Set-Transformer "
                             f"presets, not to {name!r}")
        torch.manual_seed(0)
    return build_model(name, 3, 40, **(body or {}))


def preset_calls(preset: str, pos, batch, y, device='cpu', radius: float = 0.25,
                 body: Optional[dict] = None):
    r"""The point-cloud preset :obj:`preset` (:func:`build`) on :obj:`device` and its two measured
    calls (``training_step.py`` and ``gpu_profile.py``): ``train_step(m)`` (forward,
    cross-entropy, backward, AdamW update) and ``infer(m)`` (an ``eval()`` forward without
    gradients), each running :obj:`m` (the model, or its compiled form) on the whole batch of
    clouds ``pos``/``batch`` (:func:`make_batch`) with labels :obj:`y`."""
    import torch.nn.functional as F
    from torch_geometric.data import Batch, Data
    model = build(preset, radius, body)
    clouds = int(batch.max()) + 1
    device = torch.device(device)
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-5)
    data = Batch.from_data_list([Data(x=pos[batch == i]) for i in range(clouds)]).to(
        device)  # x = coordinates for every model
    y = y.to(device)

    def forward(m):
        out = m(data)
        return out[0] if isinstance(out, tuple) else out

    def train_step(m=model):
        model.train()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(forward(m), y).backward()
        opt.step()

    def infer(m=model):
        model.eval()
        with torch.no_grad():
            forward(m)

    return model, train_step, infer
