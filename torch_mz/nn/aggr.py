r"""MZAggregation: a PyG aggregation built from MZ-Set-Transformer blocks."""
import math
import numbers
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor
from torch.nn import Linear, Module, ModuleList
from torch_geometric.nn.aggr import Aggregation

from torch_mz import runtime
from torch_mz._checks import (check_count, check_fits, check_optional_count, check_flag,
                              check_rate, refuse_jit_script, refuse_jit_trace)
from torch_mz.nn.attention import SUMMARIES, VALUE_OPERATORS, MZAttention
from torch_mz.nn.blocks import ISAB, PMA, SAB
from torch_mz.nn._context import _functorch_active, _plain_ops, tie_parameters
from torch_mz.nn.functional import PATHS, check_choice, repeat_per_set, set_counts
from torch_mz.nn.fused import AUTO_MIN_ELEMENTS
from torch_mz.nn.zonotope import AffineZonotope, InputProjection, Zonotope

READOUTS = ('ihw', 'signed')
ENCODERS = ('isab', 'sab')
PRESETS = ('neighbourhood', 'paper')
CHECKPOINTS = ('auto', False, True, 'blocks', 'attention', 'chunks')
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: ``chunk_size='auto'``: the rows of one group times the token width :math:`d` (131,072 rows at
#: :math:`d = 16`, 32,768 at :math:`d = 64`; see :func:`auto_chunk_rows`).
AUTO_CHUNK_ELEMENTS = 2 ** 21
#: ``chunk_size='auto'`` on a CUDA device: one group's row elements (rows times :math:`d`) are
#: the device's total memory in bytes over this (see :func:`auto_chunk_rows`).
AUTO_GPU_BYTES_PER_ELEMENT = 2048
#: ``chunk_size='auto'`` on the CPU with glibc's ``malloc`` not keeping freed memory, in inference
#: and in training with ``checkpoint=False``: the bytes of the widest activation of one group
#: (see :func:`malloc_chunk_rows`); inputs whose widest activation exceeds twice this (32 MiB,
#: glibc's largest mmap threshold) are encoded in such groups.
MALLOC_GROUP_BYTES = 2 ** 24


def device_memory(device: Union[torch.device, str, None]) -> Optional[int]:
    r"""The total memory in bytes of :obj:`device` when it is a CUDA device (ROCm's included),
    else :obj:`None` (the CPU and every other device)."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type != 'cuda':
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


def auto_chunk_rows(dim: int, device_memory: Optional[int] = None) -> int:
    r"""The rows of one group of ``chunk_size='auto'`` for tokens of width :obj:`dim`; inputs
    of more than twice as many rows are encoded in such groups. The activations of a row grow
    with :math:`d`, so the group is a budget of row elements, not of rows:

    * on the CPU (:obj:`device_memory` :obj:`None`): :data:`AUTO_CHUNK_ELEMENTS` :math:`/ d`
      (at least 1): it bounds memory, and on the CPU smaller groups cost little time;
    * on a CUDA device of :obj:`device_memory` bytes: that over
      :data:`AUTO_GPU_BYTES_PER_ELEMENT` :math:`\cdot d`, and no fewer rows than on the CPU.
      On a GPU every group is a forward (and in training a recomputation) of its own, about a
      thousand kernel launches and host synchronisations each whatever its size
      (``benchmarks/launches.py``), so the groups are as large as the memory allows: the
      default aggregation's activations took about 170 bytes per row element on the CPU
      (10,506 MiB on :math:`10^6` rows at :math:`d = 64`,
      ``benchmarks/results/message_passing_chunks``), so a group takes about a twelfth of the
      device's memory (one H200: about 1.15 million rows at :math:`d = 64`, so a graph of
      :math:`10^6` edges is encoded at once; 16 GiB: 131,072 rows)."""
    rows = max(1, AUTO_CHUNK_ELEMENTS // dim)
    if device_memory is not None:
        rows = max(rows, device_memory // (AUTO_GPU_BYTES_PER_ELEMENT * dim))
    return rows


def malloc_chunk_rows(dim: int, num_generators: int, d_ff: int,
                      itemsize: int = 4) -> Optional[int]:
    r"""The rows of one group of ``chunk_size='auto'`` on the CPU where glibc's ``malloc`` does
    not keep freed memory (:func:`torch_mz.runtime.freed_memory_kept`): inputs of more than twice
    as many rows are encoded in such groups, in training with ``checkpoint=False`` every
    activation kept (nothing recomputed), and in inference where these groups are smaller than
    those of :func:`auto_chunk_rows` (which bound memory, and stay the groups recomputed in
    training with ``checkpoint='auto'``).

    A group's widest activation, :math:`\max(d_{ff}, n_g \max(d, d_{ff}/2))` elements per row
    (the center feed-forward's hidden layer; the generators and the generator feed-forward's
    hidden layer) of :obj:`itemsize` bytes, takes :data:`MALLOC_GROUP_BYTES` (16 MiB), and the
    group has at least the :math:`2^{20} / (n_g d)` rows at which the LayerNorm Jacobian runs
    as compiled kernels (:data:`torch_mz.nn.fused.AUTO_MIN_ELEMENTS`), so that a group takes the
    kernels the whole input would; where that floor would make a group's widest activation
    larger than 32 MiB (a feed-forward much wider than :math:`n_g d`), :obj:`None`: no groups,
    which would be mapped afresh too. ``mz`` (:math:`d = 64, n_g = 8, d_{ff} = 128`): groups of
    8,192 rows, inputs of more than 16,384; ``mz-slim`` (:math:`n_g = 2`) and ``rigid``: 32,768
    and 65,536.

    Why: glibc serves each block above its mmap threshold (at most 32 MiB) with fresh pages,
    mapped and faulted in at every allocation, and unmaps it when freed; a training step of the
    whole input allocates such blocks by the dozen. Measured on one core, the workers paused,
    the whole batch and the groups alternating in one process (throwaway A/B, medians of 5
    AdamW steps, 2026-12-05): ``mz`` 32 clouds of 1,024 points 2.48 -> 1.60 s (0.65x; groups of
    4,096: 0.47x), 128 clouds of 1,024 16.0 -> 6.5 s, 256 of 128 3.09 -> 1.98 s, 1,024 of 32
    4.18 -> 2.82 s, 2,048 of 16 7.06 -> 3.83 s; at 32 x 1,024 groups of 8,192 rows also took
    ``rigid`` 0.47 -> 0.43 s, ``mz-slim`` 0.80 -> 0.74 s and ``st-large`` 0.702 -> 0.605 s (below
    this rule's size for them). With freed memory kept (:func:`torch_mz.runtime.keep_freed_memory`,
    which the ``torch-mz`` commands and the reproduction turn on) the groups gained nothing
    (``benchmarks/results/training_step_kept``), so they are not used there. In inference
    (``eval()``, no gradients; the same throwaway A/B, medians of 7 calls): ``mz`` on 32 clouds
    of 1,024 points 0.91 s whole, 0.63 s in groups of 8,192 (0.51 s in groups of 4,096), on 128
    clouds 3.55 s in :func:`auto_chunk_rows`' groups of 32,768, 2.59 s in groups of 8,192; the
    paper-preset aggregation in ``SAGEConv`` on :math:`10^4` nodes and :math:`10^5` Poisson
    edges at :math:`d = 64` 18.4 s whole, 11.3 s in groups of 32,768 and 7.5 s in groups of
    8,192. The default (neighbourhood) aggregation's groups do not change in float32: at
    :math:`d = 16` and :math:`d = 64` its :math:`n_g = 2` and :math:`d_{ff} = d` give the rows of
    :func:`auto_chunk_rows` (in float64 half of them)."""
    width = max(d_ff, num_generators * max(dim, max(1, d_ff // 2)))
    rows = max(1, MALLOC_GROUP_BYTES // (width * itemsize))
    if num_generators > 0:  # the compiled kernels' threshold, rounded up to whole rows
        rows = max(rows, -(-AUTO_MIN_ELEMENTS // (num_generators * dim)))
        if rows * width * itemsize > 2 * MALLOC_GROUP_BYTES:
            return None
    return rows


def preset_defaults(preset: str, in_channels: int, heads: int) -> dict:
    r"""The sizes that :class:`MZAggregation` takes for arguments left at :obj:`None`.

    * ``'neighbourhood'`` (the aggregation's default), for the many small sets of message
      passing: PyG's :class:`~torch_geometric.nn.aggr.SetTransformerAggregation` structure (one
      SAB encoder block, PMA, one SAB decoder block) at the input width (``dim`` =
      the larger of :obj:`in_channels` and 16, rounded up to a multiple of :obj:`heads`), a
      feed-forward
      width ``d_ff = dim`` (PyG's MAB feed-forward is one ``dim x dim`` layer), and the paper's
      Slim generator budget (:math:`n_g = 2`, :math:`L = 1`, Appendix A.1). A
      set of five neighbours does not pay for 16 inducing tokens, and every element carries two
      generator rows instead of eight (the generator channel is most of the cost: with
      :math:`n_g = 8` a forward + backward costs 3.5-10x the rigid aggregation's, see
      ``benchmarks/results/message_passing``).
    * ``'paper'``, the MZ-Set Transformer of the paper (Appendix A.1): ``dim = 64``,
      ``d_ff = 128``, two ISAB encoder blocks with 16 inducing tokens, :math:`n_g = 8`,
      :math:`L = 4` (the :class:`~torch_mz.models.MZSetTransformer` default).
    """
    check_choice('preset', preset, PRESETS)
    if preset == 'paper':
        return dict(dim=64, d_ff=128, encoder='isab', num_encoder_blocks=2, num_inducing=16,
                    num_generators=8, num_matrix_generators=4)
    # (at least 16 before the rounding: with fewer input channels and heads that do not divide
    # 16, e.g. 8 channels and 3 heads, the width is 18, a multiple of the heads)
    dim = -(-max(16, in_channels) // heads) * heads
    return dict(dim=dim, d_ff=dim, encoder='sab', num_encoder_blocks=1, num_inducing=16,
                num_generators=2, num_matrix_generators=1)


def resolve_set_index(x: Tensor, index: Optional[Tensor], ptr: Optional[Tensor],
                      dim_size: Optional[int],
                      names: Tuple[str, str] = ('index', 'dim_size')) -> Tuple[Tensor, int]:
    r"""Validates PyG's ``(index, ptr, dim_size)`` for rows of :obj:`x` and returns the set id of
    every row and the number of sets. ``index`` may be unsorted; ``ptr`` alone is accepted (rows
    grouped by set); ``dim_size`` larger than the largest id keeps trailing empty sets (with
    ``ptr``, it must be the number of sets ``ptr`` describes, as in PyG).
    :obj:`names` are what messages call ``index`` and ``dim_size`` (a model's ``batch`` and
    ``num_sets``)."""
    N = x.size(0)
    if index is None and ptr is None:
        index = torch.zeros(N, dtype=torch.long, device=x.device)
    given_index = index if ptr is not None else None
    if ptr is not None:  # as in PyG, ptr takes precedence; a disagreeing index is refused below
        if (ptr.dim() != 1 or ptr.numel() < 1 or ptr.is_floating_point()
                or ptr.is_complex() or ptr.dtype == torch.bool):
            raise ValueError(f"Expected 'ptr' to be a 1-D integer tensor (got shape "
                             f"{tuple(ptr.shape)} and dtype {ptr.dtype})")
        ptr = ptr.long()  # (as an index of any integer dtype; a narrow one would wrap below)
        sizes = ptr[1:] - ptr[:-1]
        if int(ptr[0]) != 0 or int(ptr[-1]) != N or bool((sizes < 0).any()):
            raise ValueError(f"Expected 'ptr' to be non-decreasing from 0 to the number of rows "
                             f"{N} (got {ptr.tolist() if ptr.numel() <= 10 else ptr})")
        index = torch.repeat_interleave(torch.arange(ptr.numel() - 1, device=x.device), sizes)
        if dim_size is None:
            dim_size = ptr.numel() - 1
        elif dim_size != ptr.numel() - 1:  # (as PyG's Aggregation.__call__ refuses it)
            raise ValueError(f"Expected '{names[1]}' to equal the {ptr.numel() - 1} sets that "
                             f"'ptr' describes (got {dim_size!r})")
    assert index is not None  # given, or built from ptr or for a single set above
    if given_index is not None:
        if (given_index.is_floating_point() or given_index.is_complex()
                or given_index.dtype == torch.bool):  # (as without ptr, check_set_ids)
            raise ValueError(f"Expected an integer '{names[0]}' (got dtype {given_index.dtype})")
        if (given_index.dim() != 1 or given_index.numel() != N
                or not torch.equal(given_index.to(index.device).long(), index)):
            raise ValueError("'index' and 'ptr' were both given and describe different sets "
                             "(give one of them, or make them agree)")
    return check_set_ids(index, N, dim_size, *names)


def check_call_arguments(x: Any, in_channels: int, args: Tuple[Any, ...],
                         kwargs: Dict[str, Any]) -> None:
    r"""What a set aggregation's ``__call__`` checks before PyG's
    :meth:`~torch_geometric.nn.aggr.Aggregation.__call__` (:obj:`args` and :obj:`kwargs` are
    what follows :obj:`x` in the call): the input's shape :math:`(N, F_{in})`, which PyG's would
    name only by its axis (``'-2'``), and that ``index`` and ``ptr`` are tensors or :obj:`None`
    (PyG's failed on their ``.numel()``, an :class:`AttributeError`), e.g. the number of sets
    passed third as global pooling takes it, where PyG's signature has ``ptr``: a
    :class:`ValueError` names the argument and what came."""
    if isinstance(x, Tensor) and x.dim() != 2:
        raise ValueError(f"Expected input of shape (N, {in_channels}) (got {tuple(x.shape)})")
    given = dict(zip(('index', 'ptr'), args))
    given.update((k, v) for k, v in kwargs.items() if k in ('index', 'ptr'))
    for name, value in given.items():
        if value is not None and not isinstance(value, Tensor):
            third = name == 'ptr' and 'ptr' not in kwargs  # (passed by position)
            hint = (f"; the third argument is ptr: pass the number of sets by name, "
                    f"dim_size={int(value)}" if third and not isinstance(value, bool)
                    and isinstance(value, numbers.Integral) else '')
            raise ValueError(f"Expected '{name}' to be a tensor or None (got "
                             f"{type(value).__name__}){hint}")


def check_set_ids(ids: Tensor, num_rows: int, num_sets: Optional[int], name: str = 'index',
                  sets_name: str = 'num_sets') -> Tuple[Tensor, int]:
    r"""Validates a set id per row (PyG's ``index``/``batch``): a 1-D integer tensor of
    :obj:`num_rows` entries in ``[0, num_sets)``; :obj:`num_sets` (named :obj:`sets_name` in
    messages) is a non-negative integer, or :obj:`None` for the largest id plus one. Returns the
    ids as a long tensor and the number of sets; a :class:`ValueError` names :obj:`name` and
    what was expected."""
    if num_sets is not None and (isinstance(num_sets, bool) or int(num_sets) != num_sets
                                 or num_sets < 0):
        raise ValueError(f"Expected '{sets_name}' to be a non-negative integer (got "
                         f"{num_sets!r})")
    if ids.dim() != 1 or ids.numel() != num_rows:
        raise ValueError(f"Expected '{name}' of shape ({num_rows},) (got {tuple(ids.shape)})")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"Expected an integer '{name}' (got dtype {ids.dtype})")
    ids = ids.long()
    given = '' if num_sets is None else f", with '{sets_name}' {num_sets}"
    if num_rows == 0:
        return ids, 0 if num_sets is None else int(num_sets)
    lo, hi = (_id_bounds_eager if torch.compiler.is_compiling() else _id_bounds)(ids)
    if num_sets is None:
        num_sets = hi + 1
    if lo < 0 or hi >= num_sets:
        raise ValueError(f"Expected '{name}' values in [0, {num_sets}) (got range "
                         f"[{lo}, {hi}]{given})")
    return ids, int(num_sets)


def check_max_num_elements(set_id: Tensor, num_sets: int,
                           max_num_elements: Optional[int]) -> None:
    r"""Checks PyG's ``max_num_elements`` (:obj:`None`: nothing to check): an integer
    :math:`\geq 0` that no set of :obj:`set_id` exceeds. PyG's dense aggregations keep only the
    first ``max_num_elements`` rows of a larger set and drop the rest without a word; the flat
    aggregations here drop none, so such a set raises a :class:`ValueError` (a bound that every
    set meets changes nothing)."""
    bound = check_optional_count('max_num_elements', max_num_elements, low=0)
    if bound is None or set_id.numel() == 0:
        return
    largest = int(set_counts(set_id, num_sets).max())
    if largest > bound:
        raise ValueError(f"A set has {largest} elements, more than max_num_elements="
                         f"{bound} (PyG's aggregation would drop the rows beyond it; "
                         f"this one drops none): raise the bound or leave it unset")


def _id_bounds(ids: Tensor) -> Tuple[int, int]:
    r"""The smallest and largest id of a non-empty tensor: one pass, one host read."""
    lo, hi = torch.aminmax(ids)
    return int(lo), int(hi)


# under torch.compile: read outside the graph, one graph break (two reads would be two)
_id_bounds_eager = torch.compiler.disable(_id_bounds)


def largest_finite_magnitude(x: Tensor) -> float:
    r"""The largest magnitude among the finite entries of a non-empty floating-point tensor
    (0 if none is finite). One pass and no allocation when every entry is finite (the minimum and
    maximum together); only an input with NaN or infinite entries pays for masking them out."""
    lo, hi = torch.aminmax(x)
    largest = max(-float(lo), float(hi))
    if math.isfinite(largest):
        return largest
    finite = x[torch.isfinite(x)]
    return float(finite.abs().max()) if finite.numel() > 0 else 0.0


def input_layers(module: Module, in_channels: int) -> List[Linear]:
    r"""The linear layers of :obj:`module` that read its input: the center and generator maps
    of its first :class:`~torch_mz.nn.zonotope.InputProjection`, or where it has none the first
    :class:`~torch.nn.Linear` (in module order) that takes :obj:`in_channels` features (not
    every such layer: a hidden width equal to the input's is not the input)."""
    for m in module.modules():
        if isinstance(m, InputProjection):
            return [lin for lin in (m.lin_c, m.lin_g) if lin is not None]
    first = next((m for m in module.modules()
                  if isinstance(m, Linear) and m.in_features == in_channels), None)
    return [] if first is None else [first]


def input_magnitude_limit(dtype: torch.dtype, module: Optional[Module] = None,
                          in_channels: Optional[int] = None) -> float:
    r"""The largest input magnitude that :func:`check_input_magnitude` accepts when the input
    projection computes in :obj:`dtype`: :math:`10^{15}` in float32 and bfloat16, a margin below
    the magnitude at which the LayerNorm statistics overflow (about :math:`10^{19}`);
    :math:`10^{150}` in float64 (about :math:`10^{154}`). In float16, whose largest finite value
    is 65,504, the first linear maps of the input overflow first: the limit is half of 65,504
    over the largest absolute row sum of the weights of the layers that read :obj:`module`'s
    input (:func:`input_layers`; a bound under which no such map's output exceeds half the
    range, whatever the input), :math:`10^4` where no module is given or it has none."""
    if dtype == torch.float16:
        layers = [] if module is None or in_channels is None else [
            lin for lin in input_layers(module, in_channels) if lin.weight.numel() > 0]
        if not layers:
            return 1e4
        rows = torch.stack([lin.weight.detach().abs().sum(dim=1).max().float()
                            for lin in layers]).max()  # (one read of the device)
        return 0.5 * 65504.0 / max(float(rows), 1e-30)
    return 1e15 if torch.finfo(dtype).max < 1e300 else 1e150


def check_input_magnitude(x: Tensor, float16_only: bool = False,
                          module: Optional[Module] = None) -> None:
    r"""Refuses, with a :class:`ValueError`, input whose finite entries exceed
    :func:`input_magnitude_limit` of the precision the input projection computes in: the
    input's dtype or, under :func:`torch.autocast` for its device (which casts every floating
    input but float64), the autocast dtype where that is narrower. With :obj:`float16_only`
    (models whose first layer is a plain linear map, without the projection's LayerNorm) only
    the float16 limit applies, from :obj:`module`'s first linear layers where it is given
    (:func:`input_magnitude_limit`). NaN and infinite entries are
    not refused (they stay inside their set). Not checked for an empty input or under
    :func:`torch.compile`, where reading the largest entry would break the graph."""
    if x.numel() == 0 or torch.compiler.is_compiling():
        return
    dtype, device = x.dtype, x.device.type
    if dtype != torch.float64 and torch.is_autocast_enabled(device):
        cast = torch.get_autocast_dtype(device)
        if input_magnitude_limit(cast) < input_magnitude_limit(dtype):
            dtype = cast
    if float16_only and dtype != torch.float16:
        return
    limit = input_magnitude_limit(dtype, module, x.size(-1))
    largest = largest_finite_magnitude(x.detach())
    if largest > limit:
        what = ("the first linear map of the input overflows" if dtype == torch.float16
                else "the LayerNorm statistics of the input projection overflow")
        under = ' (under torch.autocast)' if dtype != x.dtype else ''
        raise ValueError(f"Input entries of magnitude up to {largest:.3g} exceed {limit:.3g}, "
                         f"beyond which {what} in {dtype}{under}; rescale the input")


def check_set_input(x: Tensor, in_channels: int, dtype: torch.dtype, *,
                    layer_norm: bool = True, norm_input: bool = False) -> None:
    r"""Checks the element features of a set model or aggregation: a floating-point
    :math:`(N, F_{in})` tensor of the module's :obj:`dtype`, or run under
    :func:`torch.autocast`, which casts float32, float16 and bfloat16 inputs and float32 weights
    where they meet in a matrix product, so that it takes a module of float32 parameters or of
    its own dtype only (it leaves float64 weights as they are, and float16 weights meet
    bfloat16 inputs, or the other way round, in a LayerNorm, which fails); raises a
    :class:`ValueError` saying what was expected and what came.

    :obj:`layer_norm` says whether the module holds LayerNorms (without, autocast casts the
    weights of a half-precision module of the other half precision too, in its matrix
    products, and it runs); :obj:`norm_input`, whether the input itself meets one in a residual
    sum, in its own dtype (then a half-precision module takes input of its own dtype only,
    under autocast too). Both apply on the CPU, whose autocast leaves LayerNorms as they are;
    CUDA's runs them in float32, casting their inputs and weights, so there (and on other
    devices, unchecked) a half-precision module is left to autocast, as before."""
    if x.dim() != 2 or x.size(-1) != in_channels:
        raise ValueError(f"Expected input of shape (N, {in_channels}) (got {tuple(x.shape)})")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"Expected floating-point input (float32, float64, bfloat16 or "
                         f"float16) (got {x.dtype}); convert it with x.float()")
    device = x.device.type
    half = dtype in (torch.float16, torch.bfloat16)
    if device != 'cpu':  # (CUDA's autocast casts LayerNorms to float32: see above)
        layer_norm = norm_input = False
    if torch.is_autocast_enabled(device) and dtype != torch.float64:
        cast = torch.get_autocast_dtype(device)
        # (e.g. a float16 module under bfloat16 autocast: its LayerNorms failed)
        if layer_norm and dtype not in (torch.float32, cast):
            raise ValueError(f"Expected a module of float32 or {cast} parameters under "
                             f"torch.autocast to {cast} (got {dtype} parameters, which it does "
                             f"not cast); convert the module (e.g. .float()), or run under "
                             f"torch.autocast('{device}', dtype={dtype})")
        if x.dtype != torch.float64 and not (norm_input and half and x.dtype != dtype):
            return  # (autocast casts float32, float16 and bfloat16 inputs, not float64 ones)
    if x.dtype == dtype:
        return
    if dtype == torch.float64:
        remedy = (f"convert the input or the module (e.g. .to({x.dtype})); torch.autocast "
                  "does not cast a float64 module's weights")
    elif norm_input and half:
        remedy = (f"convert the input or the module (e.g. .to({x.dtype})); the input meets the "
                  f"module's LayerNorm in a residual sum, which torch.autocast does not cast")
    else:
        how = '' if dtype == torch.float32 else f"({device!r}, dtype={dtype})"
        remedy = (f"convert the input, convert the module (e.g. .to({x.dtype})), or run under "
                  f"torch.autocast{how} (which does not cast float64 input)")
    raise ValueError(f"Expected input of the module's dtype {dtype} (got {x.dtype}); {remedy}")


class MZAggregation(Aggregation):
    r"""Matrix Zonotopic Attention aggregation (Zhang and Alanwar, "Matrix Zonotopic Attention: A
    Context-Adaptive Value Projection for Set Transformers"): the MZ-Set Transformer as a PyG
    aggregation,

    .. math::
        \mathrm{InputProj} \to \mathrm{ISAB}_m^{\,L_{enc}} \to \mathrm{PMA}_k \to
        \mathrm{SAB}^{\,L_{dec}} \to \mathrm{readout} \to \mathrm{Linear},

    computed on PyG's flat layout without padding to the largest set. The readout concatenates,
    over the :math:`k` pooled tokens, the center and the interval-hull width
    :math:`\sum_g |G_g|` (``readout='ihw'``, default) or the signed generator sum
    :math:`\sum_g G_g` (``readout='signed'``, the variant used by the paper's expressiveness
    theorems). The output of an empty set is exactly zero (as PyG's sum/mean/max aggregations;
    PyG's :class:`~torch_geometric.nn.aggr.SetTransformerAggregation` instead returns a learned
    constant on recent torch), and an input with no rows gives a :math:`(B, F_{out})` tensor of
    zeros.

    Sizes left at :obj:`None` come from :obj:`preset` (see :func:`preset_defaults`): by default
    ``'neighbourhood'``, PyG's Set Transformer aggregation structure at the input width (one SAB
    encoder block, PMA, one SAB decoder block), which suits the many small sets of message
    passing (with the paper's Slim generator budget, :math:`n_g = 2`, :math:`L = 1`);
    ``preset='paper'`` gives the paper's MZ-Set Transformer body (``dim=64``, ``d_ff=128``, two
    ISAB blocks with 16 inducing tokens, :math:`n_g = 8`, :math:`L = 4`). The value operator is
    the matrix zonotope (``value='mz'``) in both.

    Inputs are validated once, here: ``x`` must be a floating-point :math:`(N, F_{in})` tensor of
    the module's dtype (or run under :func:`torch.autocast`, a module of float32 parameters or of
    the autocast dtype: :func:`check_set_input`) whose finite entries are at most
    :math:`10^{15}` in magnitude (float32; :math:`10^{150}` in float64), a margin below the
    magnitude at which the LayerNorm statistics of the input projection overflow (about
    :math:`10^{19}` in float32: finite outputs up to :math:`10^{18}` were measured); in float16,
    and under :func:`torch.autocast` to float16, half of 65,504 over the largest absolute row
    sum of the input projection's weights, so that its linear maps cannot overflow
    (:func:`input_magnitude_limit`); not
    checked under :func:`torch.compile`, where reading the largest entry would break the
    graph. NaN or infinite entries are allowed and stay inside their set.

    Models built on it use two public methods instead of its internals: :meth:`validate` checks
    an input (once) and resolves its sets, and :meth:`pool` aggregates a validated input and also
    returns the interval-hull width of each set (``forward`` is ``pool(x, *validate(x, ...))[0]``).

    :func:`torch.jit.trace` and :func:`torch.jit.script` (of the aggregation, or of a conv or
    model that holds it) are refused with a message naming :func:`torch.compile`: a trace would
    keep the traced input's set sizes, and the forward finds each batch's set layout in Python
    that TorchScript does not take (torch prepares every submodule, so a model that lists it in
    ``__jit_ignored_attributes__`` is refused too).

    Args:
        in_channels (int): Input width :math:`F_{in}`.
        out_channels (int, optional): Output width; :obj:`None` keeps :obj:`in_channels`, so the
            aggregation drops into :class:`~torch_geometric.nn.conv.SAGEConv` or
            :class:`~torch_geometric.nn.aggr.MultiAggregation` (default: :obj:`None`).
        preset (str): Where sizes left at :obj:`None` come from, :obj:`'neighbourhood'` or
            :obj:`'paper'` (default: :obj:`'neighbourhood'`).
        dim (int, optional): Token width :math:`d` (default: :obj:`None`, from the preset).
            Not to be confused with the ``dim`` of :meth:`forward`, which is PyG's
            aggregation axis (the name of both is fixed: ``MZAggregation(dim=...)`` is
            public, and ``forward(..., dim=-2)`` is PyG's ``Aggregation`` signature).
        heads (int): Attention heads (default: :obj:`4`).
        num_generators (int, optional): Generator budget :math:`n_g` (default: :obj:`None`, 2
            for ``'neighbourhood'``, 8 for ``'paper'``).
        value (str): Value operator :obj:`'mz'`, :obj:`'rigid'`, :obj:`'film'` or
            :obj:`'hypernet'` (default: :obj:`'mz'`).
        num_matrix_generators (int, optional): :math:`L`, for ``value='mz'`` only (the other
            operators have no matrix generators: given to them, it does nothing, with a
            :class:`UserWarning`) (default: :obj:`None`, 1 for ``'neighbourhood'``, 4 for
            ``'paper'``).
        rank (int, optional): HyperNet rank, for ``value='hypernet'`` only (default:
            :obj:`None`, i.e. 8).
        num_inducing (int, optional): Inducing tokens :math:`m` per set in each ISAB
            (default: :obj:`None`, 16 in both presets); without ISAB encoder blocks
            (``encoder='sab'``, or none) there are none, and a value given, any integer
            :math:`\geq 0`, is not used (so that one set of options serves both encoders).
        num_seeds (int): Seeds :math:`k` of the PMA (default: :obj:`1`).
        num_encoder_blocks (int, optional): :math:`L_{enc}` encoder blocks (default: :obj:`None`,
            1 for ``'neighbourhood'``, 2 for ``'paper'``).
        encoder (str, optional): Encoder block type, :obj:`'isab'` (:math:`O(mN)`, the paper's) or
            :obj:`'sab'` (:math:`O(\sum_b n_b^2)`, as PyG's
            :class:`~torch_geometric.nn.aggr.SetTransformerAggregation`) (default: :obj:`None`,
            :obj:`'sab'` for ``'neighbourhood'``, :obj:`'isab'` for ``'paper'``).
        num_decoder_blocks (int): :math:`L_{dec}` SAB blocks on the :math:`k` pooled tokens
            (default: :obj:`1`).
        d_ff (int, optional): FFN width; the generator FFN has half of it (default:
            :obj:`None`, :math:`d` for ``'neighbourhood'``, 128 for ``'paper'``).
        summary (str): Gate summary :obj:`'mean'` or :obj:`'mean+std'` of the ``'mz'``,
            ``'film'`` and ``'hypernet'`` value operators; ``value='rigid'`` has no gates
            (:obj:`'mean+std'` does nothing there, with a :class:`UserWarning`) (default:
            :obj:`'mean'`).
        dropout (float): Dropout on attention weights and FFN outputs (default: :obj:`0.0`).
        log_n (bool): :math:`\log n` logit scaling (default: :obj:`False`).
        readout (str): :obj:`'ihw'` or :obj:`'signed'` (default: :obj:`'ihw'`).
        path (str): Attention kernel :obj:`'auto'`, :obj:`'dense'` or :obj:`'scatter'`
            (default: :obj:`'auto'`).
        chunk_size (int, str or None): Process groups of whole sets of about this many
            elements at a time (the sets whose first element falls in the same window of
            :obj:`chunk_size` elements; each set counts its :attr:`set_tokens` as elements
            too, so that many small sets are grouped as what they cost), which bounds the
            inference memory of very large batches (e.g. :obj:`131072` for a million points;
            for training, add
            ``checkpoint='chunks'``). The result is the same as without chunking, up to
            rounding (the fused kernels' automatic choice depends on the size of a group; in
            training, dropout masks are drawn group by group). :obj:`None` processes the batch
            at once. :obj:`'auto'` (default): inputs of more than twice
            :func:`auto_chunk_rows` rows (:math:`2^{21} / d` per group: groups of 131,072 rows
            at :math:`d = 16`, so inputs of more than 262,144 rows; of 32,768 at
            :math:`d = 64`, so more than 65,536: the messages of a graph with that many edges)
            are processed in such groups, each recomputed in the backward pass
            (``checkpoint='chunks'``) unless :obj:`checkpoint` chooses another mode
            (``checkpoint=False``: those groups in inference only; when gradients are recorded
            the whole input at once); smaller inputs, and inputs under :func:`torch.compile`, at
            once. On the CPU where glibc's ``malloc`` does not keep freed memory
            (:func:`torch_mz.runtime.freed_memory_kept`), inputs whose widest activation exceeds
            32 MiB are encoded in groups of 16 MiB (:func:`malloc_chunk_rows`: 8,192 rows for
            ``d = 64, n_g = 8``) in inference, where these are smaller, and in training with
            ``checkpoint=False``, every activation kept: 0.4-0.73x the time of a ``mz``
            training step or inference call (the default, neighbourhood, aggregation's groups
            are the same either way in float32; in float64 they halve). Where this groups a
            training batch, its dropout masks are drawn group by group, so a seeded run trains
            differently with freed memory kept (whole, as ``torch-mz train`` and the
            reproduction run) and without (groups). The group is a budget of
            row elements because a row's activations grow with :math:`d`: on 10^4 nodes and
            10^5 edges at d = 64,
            ``value='rigid', num_generators=0`` took 869 ms / 706 MiB whole and 1,144 ms /
            315 MiB with ``chunk_size=32768, checkpoint='chunks'`` (what ``'auto'`` does there
            now), against PyG's 4.04 s /
            1,211 MiB (``benchmarks/results/message_passing_chunks_1e4``). On 10^5 nodes and 10^6
            Poisson edges (``SAGEConv``, forward + backward) this took the default aggregation's
            peak memory from 3,086 to 1,151 MiB at d = 16 and from 10,506 to 3,280 MiB at d = 64,
            with times within the run's noise (10.7 -> 11.1 s and 46.0 -> 42.0 s;
            ``benchmarks/results/message_passing_chunks``); with glibc keeping freed memory
            (:func:`torch_mz.runtime.keep_freed_memory`) the recomputation showed: 7.75 s
            whole, 10.1 s in chunks at d = 16 (``message_passing_chunks_keep``). While grouped,
            forward hooks on submodules run once per group, and again in the backward pass
            where groups are recomputed (:func:`torch.jit.trace` is refused: a trace would
            keep the traced input's set sizes; use :func:`torch.compile`). Those sizes are the
            CPU's; on a CUDA device the group scales with the device's memory
            (:func:`auto_chunk_rows`: about 1.15 million rows at d = 64 on one H200, so that
            graph runs at once there), because on a GPU each group adds about a thousand
            kernel launches and host synchronisations (``benchmarks/launches.py``:
            ``value='rigid', num_generators=0`` dispatched 33,696 kernels on 10^5 nodes and
            10^6 edges at d = 64 in the CPU's groups, 726 at once), which made it 7.5x PyG's
            time there on one H200 (``benchmarks/results/gpu``, measured in the CPU's groups;
            on one H100 the whole graph at once took the default aggregation 7.5x less time
            than those groups, ``benchmarks/results/gpu_h100``). The default aggregation's
            memory there is then about that of the whole graph (10,506 MiB on the CPU at
            d = 64, 14,215 MiB on the H100); to bound it in training pass an integer with
            ``checkpoint='chunks'`` (e.g. ``chunk_size=32768, checkpoint='chunks'``): an
            integer alone recomputes nothing, so in training its groups keep every activation.
        checkpoint (bool or str): Activation checkpointing for training memory, with the same
            values and gradients. :obj:`'attention'`: every attention keeps only its inputs and
            runs its query/key/value maps, the packing of sets into blocks and the attention
            kernel again in the backward pass (one more forward of the attention); on the one
            graph measured (10^5 nodes, 10^6 Poisson edges, d = 16, SAGEConv) this took less
            memory and less time than checkpointing whole blocks
            (``benchmarks/results/message_passing_checkpoint``); other sizes are not measured.
            :obj:`True` (or :obj:`'blocks'`): recompute each block's activations in the backward
            pass
            (:func:`torch.utils.checkpoint.checkpoint`): memory falls to about one block's
            activations plus the block inputs, at the cost of a second forward of each block.
            :obj:`'chunks'` (with :obj:`chunk_size`): each group of sets of
            :obj:`chunk_size` rows keeps only its input rows and runs its whole forward again in
            the backward pass, so the training memory of the aggregation is about one group's
            activations plus its input, whatever the number of rows, as long as no set is
            larger than :obj:`chunk_size` (groups hold whole sets; one group is not rerun);
            one more forward of the whole aggregation.
            :obj:`False`: keep everything: with ``chunk_size='auto'``, large inputs are
            grouped where no gradients are recorded (inference) and run at once where
            they are, but for the kept groups of :func:`malloc_chunk_rows` where glibc maps
            large blocks afresh (what
            :class:`~torch_mz.models.MZSetTransformer` takes by default: there the batch size
            is the user's memory knob, and the recomputation costs time; on 128 clouds of 1,024
            points (kept memory, one thread) one training step in recomputed groups took 1.50x
            (``mz``) and 1.07x
            (``rigid``) the time of the whole batch at once, for 0.59x and 0.47x its peak
            memory, ``benchmarks/results/training_step_large_batch``; an earlier run of the
            same comparison, not kept, gave 1.37x and 1.57x).
            :obj:`'auto'` (default): :obj:`False`, except that the groups of
            ``chunk_size='auto'`` are recomputed in training as with :obj:`'chunks'` (a graph's
            number of edges is not the user's to choose, and the memory of its messages is
            bounded this way). The recomputing modes use saved-tensor hooks, which
            :mod:`torch.func` transforms (``grad``, ``vjp``, ``jacrev``) refuse with PyTorch's
            own error: under those take :obj:`False` or :obj:`'auto'`.
        fold_keys (bool): Let every attention fold its key map into its queries where a count
            of multiply-adds says that is cheaper (the PMA's seeds at :math:`d = 64`; see
            :class:`~torch_mz.nn.attention.MZAttention`). The same values and gradients up to
            rounding; :obj:`False` keeps the key map on the keys, e.g. to compare the two
            (the ``-unfolded`` rows of ``benchmarks/message_passing.py`` and
            ``benchmarks/speed.py``); the attribute of that name reads and sets it for every
            attention after construction too (default: :obj:`True`).

    Shapes:
        - **input:** :math:`(N, F_{in})`, ``index`` :math:`(N,)` in any order (see
          :meth:`forward`) or ``ptr`` :math:`(B+1,)`
        - **output:** :math:`(B, F_{out})`
    """
    def __init__(self, in_channels: int, out_channels: Optional[int] = None,
                 preset: str = 'neighbourhood', dim: Optional[int] = None, heads: int = 4,
                 num_generators: Optional[int] = None, value: str = 'mz',
                 num_matrix_generators: Optional[int] = None,
                 rank: Optional[int] = None, num_inducing: Optional[int] = None,
                 num_seeds: int = 1,
                 num_encoder_blocks: Optional[int] = None, encoder: Optional[str] = None,
                 num_decoder_blocks: int = 1, d_ff: Optional[int] = None, summary: str = 'mean',
                 dropout: float = 0.0, log_n: bool = False, readout: str = 'ihw',
                 path: str = 'auto', chunk_size: Union[int, str, None] = 'auto',
                 checkpoint: Union[bool, str] = 'auto', fold_keys: bool = True):
        super().__init__()
        in_channels, heads = check_count('in_channels', in_channels), check_count('heads', heads)
        out_channels = check_optional_count('out_channels', out_channels)
        check_choice('value operator', value, VALUE_OPERATORS)
        if rank is not None and value != 'hypernet':
            raise ValueError(f"'rank' is the rank of the HyperNet value operator "
                             f"(value='hypernet'); value={value!r} has none: leave it out (or "
                             f"start from a preset of that operator)")
        rank = 8 if rank is None else check_count('rank', rank)
        if num_matrix_generators is not None:  # given (None: the preset's L, unused but by 'mz')
            num_matrix_generators = check_count('num_matrix_generators', num_matrix_generators,
                                                low=0)
            if value != 'mz':  # (warned, not refused: a --model-arg given to every model of a
                # comparison, and the checkpoints of runs that took it, build as before)
                warnings.warn(f"'num_matrix_generators' is the number L of matrix generators of "
                              f"the MZ value operator (value='mz'); value={value!r} has none, so "
                              f"num_matrix_generators={num_matrix_generators} does nothing here",
                              UserWarning, stacklevel=2)
        log_n, fold_keys = check_flag('log_n', log_n), check_flag('fold_keys', fold_keys)
        dropout = check_rate('dropout', dropout)
        defaults = preset_defaults(preset, in_channels, heads)
        dim = defaults['dim'] if dim is None else dim
        d_ff = defaults['d_ff'] if d_ff is None else d_ff
        encoder = defaults['encoder'] if encoder is None else encoder
        num_encoder_blocks = (defaults['num_encoder_blocks'] if num_encoder_blocks is None
                              else num_encoder_blocks)
        num_inducing = defaults['num_inducing'] if num_inducing is None else num_inducing
        if num_generators is None:
            num_generators = defaults['num_generators']
        if num_matrix_generators is None:
            num_matrix_generators = defaults['num_matrix_generators']
        dim, d_ff = check_count('dim', dim), check_count('d_ff', d_ff)
        num_generators = check_count('num_generators', num_generators, low=0)
        num_matrix_generators = check_count('num_matrix_generators', num_matrix_generators,
                                            low=0)
        if readout == 'signed' and num_generators == 0:
            raise ValueError("readout='signed' reads the generators, and num_generators=0 "
                             "gives the tokens none: leave readout out, or give generators")
        self.preset = preset
        if checkpoint not in CHECKPOINTS:
            raise ValueError(f"'checkpoint' must be one of {CHECKPOINTS} (got {checkpoint!r})")
        if not isinstance(checkpoint, str):  # 0, 1, numpy booleans: the modes of False, True
            checkpoint = bool(checkpoint)
        if chunk_size is not None and chunk_size != 'auto':
            if (not isinstance(chunk_size, numbers.Integral) or isinstance(chunk_size, bool)
                    or chunk_size < 1):
                raise ValueError(f"'chunk_size' must be a positive integer, 'auto' or None "
                                 f"(got {chunk_size!r})")
            chunk_size = int(chunk_size)
        if checkpoint == 'chunks' and chunk_size is None:
            raise ValueError("checkpoint='chunks' recomputes groups of sets of 'chunk_size' "
                             "rows: set 'chunk_size' too (e.g. 131072, or 'auto')")
        check_choice('value operator', value, VALUE_OPERATORS)
        check_choice('summary', summary, SUMMARIES)
        if summary != 'mean' and value == 'rigid':
            warnings.warn(f"summary={summary!r} is the set summary that the gates of the 'mz', "
                          f"'film' and 'hypernet' value operators read; value='rigid' has no "
                          f"gates, so it does nothing here", UserWarning, stacklevel=2)
        check_choice('encoder block', encoder, ENCODERS)
        check_choice('readout', readout, READOUTS)
        check_choice('attention path', path, PATHS)
        num_encoder_blocks = check_count('num_encoder_blocks', num_encoder_blocks, low=0)
        num_decoder_blocks = check_count('num_decoder_blocks', num_decoder_blocks, low=0)
        num_seeds = check_count('num_seeds', num_seeds)
        # (unused without ISAB encoder blocks: 0 is taken there, as the docstring says)
        num_inducing = check_count('num_inducing', num_inducing,
                                   low=1 if encoder == 'isab' and num_encoder_blocks > 0 else 0)
        # each MAB (two an ISAB, one a SAB or the PMA) has at least 3 d^2 + 2 d d_ff parameters
        # in 10 modules
        mabs = num_encoder_blocks * (2 if encoder == 'isab' else 1) + 1 + num_decoder_blocks
        check_fits(f'num_encoder_blocks={num_encoder_blocks} ({encoder}), num_decoder_blocks='
                   f'{num_decoder_blocks}, dim={dim}, d_ff={d_ff}',
                   mabs * (3 * dim * dim + 2 * dim * d_ff), 10 * mabs)
        self.in_channels = in_channels
        self.out_channels = in_channels if out_channels is None else out_channels
        self.dim = dim
        self.heads = heads
        self.num_generators = num_generators
        self.value = value
        self.num_matrix_generators = num_matrix_generators
        self.rank = rank
        self.num_inducing = num_inducing
        self.num_seeds = num_seeds
        self.num_encoder_blocks = num_encoder_blocks
        self.encoder = encoder
        self.num_decoder_blocks = num_decoder_blocks
        self.d_ff = d_ff
        self.summary = summary
        self.dropout = dropout
        self.log_n = log_n
        self.readout = readout
        self.path = path
        self.chunk_size = chunk_size
        self.checkpoint = checkpoint

        block_kwargs: Dict[str, Any] = dict(
            heads=heads, num_generators=num_generators, d_ff=d_ff, value=value,
            num_matrix_generators=num_matrix_generators, rank=rank, summary=summary,
            dropout=dropout, log_n=log_n, path=path, recompute=checkpoint == 'attention',
            fold_keys=bool(fold_keys))
        self.input_proj = InputProjection(in_channels, dim, num_generators)
        self.encoders = ModuleList([
            ISAB(dim, num_inducing=num_inducing, **block_kwargs)
            if encoder == 'isab' else SAB(dim, **block_kwargs) for _ in range(num_encoder_blocks)
        ])
        self.pma = PMA(dim, num_seeds=num_seeds, **block_kwargs)
        self.decoders = ModuleList([SAB(dim, **block_kwargs) for _ in range(num_decoder_blocks)])
        # Readout width: centers, plus IHW / signed sums when tokens carry generators.
        self.readout_channels = (2 if num_generators > 0 else 1) * num_seeds * dim
        self.lin = Linear(self.readout_channels, self.out_channels)
        self.reset_parameters()

    def reset_parameters(self):
        self.input_proj.reset_parameters()
        for block in list(self.encoders) + [self.pma] + list(self.decoders):
            block.reset_parameters()
        torch.nn.init.xavier_uniform_(self.lin.weight)
        torch.nn.init.zeros_(self.lin.bias)

    def validate(self, x: Tensor, index: Optional[Tensor] = None, ptr: Optional[Tensor] = None,
                 dim_size: Optional[int] = None, *,
                 names: Tuple[str, str] = ('index', 'dim_size')) -> Tuple[Tensor, int]:
        r"""Checks an input once, at the boundary (see the class docstring), and returns the set
        id of every row :math:`(N,)` and the number of sets :math:`B`, for :meth:`pool`;
        :obj:`names` are what messages call ``index`` and ``dim_size``."""
        refuse_jit_trace(type(self).__name__)
        check_set_input(x, self.in_channels, self.lin.weight.dtype)
        check_input_magnitude(x, module=self)
        return resolve_set_index(x, index, ptr, dim_size, names)

    def pool(self, x: Tensor, set_id: Tensor, num_sets: int) -> Tuple[Tensor, Tensor]:
        r"""The aggregation of an input that :meth:`validate` accepted, without checking it
        again: the output :math:`(B, F_{out})` and the summed interval-hull width of each set's
        :math:`k` pooled tokens :math:`(B,)` (the single-pass uncertainty of the MZ models; zero
        without generators). Both are exactly zero for an empty set.

        Empty sets are not encoded: where some are (e.g. the isolated nodes of a graph, whose
        ``dim_size`` counts them), the non-empty sets are encoded alone and the outputs placed
        among zeros (the same values, up to rounding; a set of nothing cost as much as a set of
        one: 16 inducing tokens per set in the paper's configuration). Under
        :func:`torch.compile` every set is encoded and the empty ones zeroed, which keeps the
        shapes static."""
        counts = set_counts(set_id, num_sets)  # (B,)
        if x.size(0) == 0:  # no elements at all: every set is empty
            dtype = self.lin.weight.dtype  # (under autocast: the dtype of a call with elements)
            if dtype != torch.float64 and torch.is_autocast_enabled(x.device.type):
                dtype = torch.get_autocast_dtype(x.device.type)
            out = x.new_zeros(num_sets, self.out_channels, dtype=dtype)
            # every parameter and the input in the graph, with a zero gradient (as in a call
            # with elements)
            return tie_parameters(out, self, x), out.new_zeros(num_sets)
        nonempty = counts > 0  # (B,)
        if torch.compiler.is_compiling() or bool(nonempty.all()):
            z = self._encode_sets(x, set_id, counts)  # (B * k, d), (B * k, n_g, d)
            keep = nonempty.to(z.center.dtype).unsqueeze(-1)  # (B, 1)
            feats = self._readout(z, num_sets) * keep  # (B, 2kd), 0 if empty
            out = self.lin(feats) * keep  # (B, F_out)
            ihw = z.ihw().reshape(num_sets, -1).sum(-1) * keep.squeeze(-1)  # (B,)
            return out, ihw
        kept = nonempty.nonzero().squeeze(1)  # (B',) the non-empty sets
        compact = torch.cumsum(nonempty, 0) - 1  # (B,) each non-empty set's new id
        z = self._encode_sets(x, compact[set_id], counts[kept])  # (B' * k, d), ...
        out = self.lin(self._readout(z, kept.numel()))  # (B', F_out)
        ihw = z.ihw().reshape(kept.numel(), -1).sum(-1)  # (B',)
        return (out.new_zeros(num_sets, out.size(-1)).index_copy(0, kept, out),
                ihw.new_zeros(num_sets).index_copy(0, kept, ihw))

    def _encode_sets(self, x: Tensor, set_id: Tensor, counts: Tensor) -> Zonotope:
        r"""The pooled tokens of the sets :obj:`set_id` names (:obj:`counts` rows each), at once
        or in groups (:meth:`_chunk_rows`)."""
        num_sets = counts.numel()
        chunk_rows = self._chunk_rows(x.size(0) + num_sets * self.set_tokens, x.device)
        if chunk_rows is not None:
            return self._encode_chunked(x, set_id, counts, chunk_rows)
        return self._encode(x, set_id, num_sets)

    @property
    def set_tokens(self) -> int:
        r"""The tokens each set adds to its rows in a block: its inducing tokens in an ISAB
        encoder and its seeds. The groups of :attr:`chunk_size` count them beside the rows, so
        that many small sets are grouped as what they cost (a set of one element encodes 17
        tokens in the paper's configuration)."""
        isab = self.encoder == 'isab' and self.num_encoder_blocks > 0
        return (self.num_inducing if isab else 0) + self.num_seeds

    def _chunk_rows(self, rows: int,
                    device: Union[torch.device, str, None] = None) -> Optional[int]:
        r"""The group size for an input of :obj:`rows` rows on :obj:`device` (:obj:`None`: the
        CPU's rule), or :obj:`None` to encode it at once (see :attr:`chunk_size`). Rows here
        count each set's :attr:`set_tokens` too."""
        if self.chunk_size == 'auto':
            # compiling first: a size test before it would add a shape guard to a compiled graph
            if torch.compiler.is_compiling():
                return None
            if self.checkpoint is False and torch.is_grad_enabled():
                # kept whole in training, but where glibc maps large blocks afresh (see
                # malloc_chunk_rows): groups of smaller blocks, every activation kept
                group = self._malloc_group_rows(device)
                return None if group is None or rows <= 2 * group else group
            group = auto_chunk_rows(self.dim, device_memory(device))
            if not torch.is_grad_enabled():  # inference: smaller where malloc maps afresh
                small = self._malloc_group_rows(device)
                group = group if small is None else min(group, small)
            return None if rows <= 2 * group else group
        if not isinstance(self.chunk_size, int) or rows <= self.chunk_size:
            return None  # None: at once
        return self.chunk_size

    def _malloc_group_rows(self, device: Union[torch.device, str, None] = None) -> Optional[int]:
        r"""The group of :func:`malloc_chunk_rows` where it applies: on the CPU (:obj:`device`
        :obj:`None` or a CPU device) with glibc not keeping freed memory
        (:func:`torch_mz.runtime.freed_memory_kept`), outside :mod:`torch.func` transforms and
        forward-mode AD; otherwise :obj:`None` (the whole input)."""
        if device is not None and torch.device(device).type != 'cpu':
            return None
        if not runtime.glibc() or runtime.freed_memory_kept() or _plain_ops():
            return None
        return malloc_chunk_rows(self.dim, self.num_generators, self.d_ff,
                                self.lin.weight.element_size())

    def _encode_chunked(self, x: Tensor, set_id: Tensor, counts: Tensor,
                        chunk_rows: int) -> Zonotope:
        r"""Encodes groups of whole sets: the sets whose first row (in set order) falls in the
        same window of :obj:`chunk_rows` rows form a group, so a group holds at most
        ``chunk_rows`` rows plus the remainder of its last set, where each set's
        :attr:`set_tokens` count as rows too. Sets never interact, so the result
        equals the unchunked one. With ``checkpoint='chunks'`` (or ``chunk_size='auto'`` and
        ``checkpoint='auto'``) each group keeps only its input rows for the backward pass and runs
        its forward again there."""
        weights = counts + self.set_tokens  # (B,) rows and the tokens each set adds
        starts = torch.cumsum(weights, 0) - weights  # (B,) where each set starts, in set order
        group = torch.div(starts, chunk_rows, rounding_mode='floor')  # (B,)
        _, sets_per_group = torch.unique_consecutive(group, return_counts=True)
        set_bounds = [0] + torch.cumsum(sets_per_group, 0).tolist()
        if len(set_bounds) == 2:  # one group (e.g. one large set): nothing to bound, no rerun
            return self._encode(x, set_id, counts.numel())
        row_bounds = [0] + torch.cumsum(counts, 0).tolist()
        if bool((set_id[1:] >= set_id[:-1]).all()):  # already in set order (e.g. sorted edges)
            x_sorted, id_sorted = x, set_id
        else:
            order = torch.argsort(set_id, stable=True)  # rows in set order
            x_sorted, id_sorted = x[order], set_id[order]
        rows = [row_bounds[hi] - row_bounds[lo]
                for lo, hi in zip(set_bounds[:-1], set_bounds[1:])]
        # views of one tensor: the backward pass joins the groups' gradients in one allocation
        x_parts, id_parts = x_sorted.split(rows), id_sorted.split(rows)
        # (the default's recomputation steps aside under torch.func transforms, which take no
        # checkpointing; checkpoint='chunks' asked for by name is kept)
        recompute = torch.is_grad_enabled() and (
            self.checkpoint == 'chunks' or (self.chunk_size == 'auto'
                                            and self.checkpoint == 'auto'
                                            and not _functorch_active()))
        centers, gens = [], []
        for x_g, id_g, b_lo, b_hi in zip(x_parts, id_parts, set_bounds[:-1], set_bounds[1:]):
            if recompute:
                c, g = torch.utils.checkpoint.checkpoint(
                    self._encode_group, x_g, id_g - b_lo, b_hi - b_lo, use_reentrant=False)
            else:
                c, g = self._encode_group(x_g, id_g - b_lo, b_hi - b_lo)
            centers.append(c)
            gens.append(g)
        return Zonotope(torch.cat(centers, 0), torch.cat(gens, 0))

    def _encode_group(self, x: Tensor, set_id: Tensor, num_sets: int) -> Tuple[Tensor, Tensor]:
        z = self._encode(x, set_id, num_sets)
        return z.center, z.gens

    def _run(self, block, z: Zonotope, set_id: Tensor, num_sets: int) -> Zonotope:
        r"""Runs one block, under activation checkpointing when :attr:`checkpoint` is set and
        gradients are being recorded."""
        if self.checkpoint not in (True, 'blocks') or not torch.is_grad_enabled():
            return block(z, set_id, num_sets)

        def fn(center: Tensor, gens: Tensor, *affine: Optional[Tensor]):
            # the input projection's affine description of its generators, kept (AffineZonotope)
            tokens = (AffineZonotope(center, gens, *affine)  # type: ignore[arg-type]
                      if affine else Zonotope(center, gens))
            out = block(tokens, set_id, num_sets)
            return out.center, out.gens

        affine = ((z.inputs, z.gen_weight, z.gen_bias)
                  if isinstance(z, AffineZonotope) and z.describes_gens() else ())
        center, gens = torch.utils.checkpoint.checkpoint(fn, z.center, z.gens, *affine,
                                                         use_reentrant=False)
        return Zonotope(center, gens)

    def _encode(self, x: Tensor, set_id: Tensor, num_sets: int) -> Zonotope:
        z = self.input_proj(x)  # (N, d), (N, n_g, d)
        for block in self.encoders:
            z = self._run(block, z, set_id, num_sets)  # (N, d), (N, n_g, d)
        z = self._run(self.pma, z, set_id, num_sets)  # (B * k, d), (B * k, n_g, d)
        pooled_set = repeat_per_set(num_sets, self.num_seeds, x.device)  # the seeds' set ids
        for block in self.decoders:
            z = self._run(block, z, pooled_set, num_sets)  # (B * k, d), (B * k, n_g, d)
        return z

    def _readout(self, z: Zonotope, num_sets: int) -> Tensor:
        r"""The readout vector of each set: centers and IHW (or signed generator sums) of its
        :math:`k` pooled tokens, :math:`(B, 2 k d)` (:math:`(B, k d)` without generators)."""
        feats = z.center.reshape(num_sets, -1)  # (B, k d)
        if self.num_generators > 0:
            gens = z.ihw() if self.readout == 'ihw' else z.signed_sum()  # (B * k, d)
            feats = torch.cat([feats, gens.reshape(num_sets, -1).to(feats.dtype)],
                              dim=-1)  # (B, 2kd)
        return feats

    def __call__(self, x: Tensor, *args, **kwargs) -> Tensor:
        check_call_arguments(x, self.in_channels, args, kwargs)
        return super().__call__(x, *args, **kwargs)

    def __prepare_scriptable__(self) -> 'MZAggregation':
        # (torch.jit.script failed inside: 'Comprehension ifs are not supported yet', at fold_keys)
        refuse_jit_script(type(self).__name__)

    def forward(self, x: Tensor, index: Optional[Tensor] = None, ptr: Optional[Tensor] = None,
                dim_size: Optional[int] = None, dim: int = -2,
                max_num_elements: Optional[int] = None) -> Tensor:
        r"""PyG's aggregation signature. ``index`` need not be sorted (nothing is refused or
        padded: rows in any order give the same output, up to rounding; PyG's
        :class:`~torch_geometric.nn.aggr.SetTransformerAggregation` refuses an unsorted one);
        ``dim_size`` beyond the largest id keeps those sets, empty, with an output of zeros (the
        isolated nodes of a graph). ``max_num_elements`` (PyG's padding bound) is checked, not
        applied: no set is padded to the largest, and a set larger than the bound raises a
        :class:`ValueError` (PyG's dense aggregations drop its rows beyond it)."""
        if dim not in (0, -2):
            raise ValueError(f"MZAggregation aggregates over dimension 0 / -2 (got {dim})")
        set_id, num_sets = self.validate(x, index, ptr, dim_size)
        check_max_num_elements(set_id, num_sets, max_num_elements)
        return self.pool(x, set_id, num_sets)[0]

    @property
    def fold_keys(self) -> bool:
        r"""Whether the attentions may fold their key maps into their queries (all of them;
        setting it sets every attention's :attr:`~torch_mz.nn.attention.MZAttention.fold_keys`)."""
        return all(getattr(m, 'fold_keys', True) for m in self.modules()
                   if isinstance(m, MZAttention))

    @fold_keys.setter
    def fold_keys(self, value: bool) -> None:
        for m in self.modules():
            if isinstance(m, MZAttention):
                m.fold_keys = bool(value)

    def __repr__(self) -> str:
        # (only the options that apply: L for 'mz', the rank for 'hypernet', the summary for the
        # operators with gates, the inducing tokens for ISAB encoder blocks)
        isab = self.encoder == 'isab' and self.num_encoder_blocks > 0
        return (f'{self.__class__.__name__}({self.in_channels}, {self.out_channels}, '
                f'preset={self.preset}, dim={self.dim}, heads={self.heads}, value={self.value}, '
                f'num_generators={self.num_generators}, '
                f'{"L=" + str(self.num_matrix_generators) + ", " if self.value == "mz" else ""}'
                f'{"rank=" + str(self.rank) + ", " if self.value == "hypernet" else ""}'
                f'{"num_inducing=" + str(self.num_inducing) + ", " if isab else ""}'
                f'num_seeds={self.num_seeds}, '
                f'encoder={self.num_encoder_blocks}x{self.encoder}, '
                f'decoder={self.num_decoder_blocks}, d_ff={self.d_ff}, dropout={self.dropout}, '
                f'readout={self.readout}, '
                f'{"summary=" + self.summary + ", " if self.value != "rigid" else ""}'
                f'log_n={self.log_n}, '
                f'path={self.path}, chunk_size={self.chunk_size}, checkpoint={self.checkpoint}'
                f'{"" if self.fold_keys else ", fold_keys=False"})')
