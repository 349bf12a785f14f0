r"""Test helpers shipped with :mod:`torch_mz`: checking E(n) equivariance and permutation symmetry
of functions on batched point sets.

:func:`assert_equivariant` applies random rotations, reflections (random orthogonal matrices with
determinant :math:`+1` and :math:`-1`, drawn from the Haar measure through the QR decomposition of a
Gaussian matrix), translations and permutations inside each set, and compares the function's outputs
with the correspondingly transformed reference outputs. It is a pure library function: it returns
the worst errors and raises :class:`AssertionError`; it never prints.
"""
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

__all__ = [
    'assert_equivariant',
    'default_tolerance',
    'permute_within_sets',
    'random_orthogonal',
]

# (atol, rtol) by the dtype of the coordinates. float64 leaves room for deep networks and large
# coordinates while still catching anything that is not exact up to rounding; float32 errors of a
# few layers on O(1)-sized inputs are ~1e-6 relative.
_TOLERANCES = {
    torch.float64: (1e-9, 1e-9),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}

_KINDS = ('rotation', 'reflection', 'translation', 'permutation')

Outputs = Union[Tensor, Sequence[Tensor]]


def default_tolerance(dtype: torch.dtype) -> Tuple[float, float]:
    r"""The default ``(atol, rtol)`` of :func:`assert_equivariant` for coordinates of ``dtype``:
    ``(1e-9, 1e-9)`` for float64, ``(1e-4, 1e-4)`` for float32, ``(1e-2, 1e-2)`` for float16 and
    ``(5e-2, 5e-2)`` for bfloat16."""
    if dtype not in _TOLERANCES:
        raise ValueError(f"No default tolerance for dtype {dtype}; expected one of "
                         f"{list(_TOLERANCES)}")
    return _TOLERANCES[dtype]


def random_orthogonal(
    num: int,
    dim: int,
    det: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.float64,
    device: Optional[torch.device] = None,
) -> Tensor:
    r"""Draws ``num`` random orthogonal :math:`D \times D` matrices, uniformly (Haar) distributed
    over :math:`O(D)`, or over its component with determinant ``det`` (``+1``: rotations, ``-1``:
    reflections composed with a rotation).

    The matrices come from the QR decomposition of a Gaussian matrix, with the signs of :math:`R`'s
    diagonal moved into :math:`Q`; the determinant is then fixed by negating the first column. They
    are computed in float64 on the CPU (so ``generator`` must be a CPU generator) and cast to
    ``dtype`` and ``device``.

    Shapes:
        - **output:** :math:`(\text{num}, D, D)`
    """
    if det not in (None, 1, -1):
        raise ValueError(f"'det' must be None, 1 or -1, got {det}")
    gauss = torch.randn(num, dim, dim, generator=generator, dtype=torch.float64)  # (B, D, D)
    q, r = torch.linalg.qr(gauss)  # (B, D, D), (B, D, D)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # scale columns
    if det is not None:
        flip = torch.sign(torch.linalg.det(q)) != det  # (B,)
        q[flip, :, 0] = -q[flip, :, 0]
    return q.to(dtype=dtype, device=device)


def permute_within_sets(batch: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
    r"""A random permutation ``perm`` of the elements that only exchanges elements of the same set,
    so ``batch[perm] == batch``. ``batch`` need not be sorted. ``generator`` must be a CPU generator.

    Whenever some set has at least two elements, ``perm`` moves at least one element: it is drawn
    uniformly from the permutations within sets other than the identity (an identity draw is
    drawn again, as happens with probability at most 1/2), so that a permutation check always
    tests something. With every set a single element (or none) it is the identity.

    Shapes:
        - **input:** batch :math:`(N)`
        - **output:** perm :math:`(N)`
    """
    if batch.dim() != 1:
        raise ValueError(f"'batch' must be 1-D, got shape {tuple(batch.shape)}")
    batch_cpu = batch.detach().cpu()
    identity = torch.arange(batch.numel())  # (N,)
    # some set has two elements or more: a repeated id
    movable = torch.unique(batch_cpu).numel() < batch_cpu.numel()
    slots = torch.argsort(batch_cpu, stable=True)  # (N,)
    while True:
        keys = torch.rand(batch.numel(), generator=generator, dtype=torch.float64)  # (N,) [0, 1)
        # Sorting by (set id, random key) shuffles each set; placing the result at the positions
        # of the stably sorted ids keeps every set on its own positions.
        shuffled = torch.argsort(batch_cpu.to(torch.float64) * 2.0 + keys)  # (N,)
        perm = torch.empty_like(slots)
        perm[slots] = shuffled
        if not movable or not torch.equal(perm, identity):
            return perm.to(batch.device)


def _as_tuple(outputs: Outputs) -> Tuple[Tensor, ...]:
    if isinstance(outputs, Tensor):
        return (outputs, )
    if isinstance(outputs, (tuple, list)) and all(isinstance(o, Tensor) for o in outputs):
        return tuple(outputs)
    raise TypeError(f"'fn' must return a tensor or a tuple/list of tensors, got {type(outputs)}")


def _act(mat: Tensor, shift: Optional[Tensor], y: Tensor) -> Tensor:
    # Applies y -> mat y + shift row by row; y may carry extra middle dimensions.
    out = torch.einsum('nij,n...j->n...i', mat, y)  # (R, ..., D)
    if shift is not None:
        out = out + shift.view(shift.size(0), *([1] * (y.dim() - 2)), shift.size(1))
    return out


def assert_equivariant(
    fn: Callable[[Tensor, Optional[Tensor], Optional[Tensor]], Outputs],
    pos: Tensor,
    batch: Optional[Tensor] = None,
    features: Optional[Tensor] = None,
    *,
    invariant_outputs: Sequence[int] = (),
    equivariant_outputs: Sequence[int] = (),
    vector_outputs: Sequence[int] = (),
    set_outputs: Sequence[int] = (),
    n_trials: int = 3,
    rotations: bool = True,
    reflections: bool = True,
    translations: bool = True,
    permutations: bool = True,
    independent_sets: bool = True,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    generator: Optional[torch.Generator] = None,
) -> Dict[str, float]:
    r"""Checks that ``fn(pos, features, batch)`` is E(n)-equivariant and permutation-equivariant.

    For each enabled kind of transformation and each of ``n_trials`` random draws, the inputs are
    transformed, ``fn`` is called again, and every output is compared with the reference output
    transformed the way its declared type requires:

    - **rotation** / **reflection**: :math:`\mathbf{x} \mapsto Q \mathbf{x}` with a random orthogonal
      :math:`Q`, :math:`\det Q = +1` / :math:`-1` (see :func:`random_orthogonal`);
    - **translation**: :math:`\mathbf{x} \mapsto \mathbf{x} + \mathbf{t}`, with
      :math:`\mathbf{t}` Gaussian, scaled to the size of ``pos``;
    - **permutation**: elements are shuffled inside their sets (``batch`` is unchanged,
      :func:`permute_within_sets`), ``features`` with them; every trial moves at least one
      element when some set has two elements or more.

    Output types, given by position in the tuple ``fn`` returns (a single tensor is position 0);
    every output must be listed in exactly one of the first three:

    - ``invariant_outputs``: unchanged by rotations, reflections and translations;
    - ``equivariant_outputs``: points, last dimension :math:`D`, transformed as
      :math:`Q \mathbf{y} + \mathbf{t}`;
    - ``vector_outputs``: directions/displacements, last dimension :math:`D`, transformed as
      :math:`Q \mathbf{y}` (translations leave them unchanged);
    - ``set_outputs`` (any of the above): one row per set, indexed by set id, hence unchanged by
      permutations. All other outputs have one row per element and are permuted with the elements.
      A set-level point output must have no row for a set without elements (no transformation
      of its elements moves it); a vector output may (:math:`Q \mathbf{0} = \mathbf{0}`), but
      with ``independent_sets=True`` not after the last set id in ``batch``.

    With ``independent_sets=True`` (and a ``batch``), every set gets its own random transformation,
    which also checks that sets do not influence each other; set it to :obj:`False` to transform all
    elements together.

    An output passes when :math:`\max |y' - T(y)| \le \text{atol} + \text{rtol} \cdot \max |T(y)|`
    (computed in float64); non-finite values fail. The default ``atol``/``rtol`` depend on
    ``pos.dtype`` (:func:`default_tolerance`): ``1e-9`` for float64 and ``1e-4`` for float32.

    Args:
        fn (callable): ``fn(pos, features, batch)`` returning a tensor or a tuple of tensors.
        pos (torch.Tensor): Floating-point coordinates.
        batch (torch.Tensor, optional): Set id of every element. (default: :obj:`None`, one set)
        features (torch.Tensor, optional): Invariant element features, permuted with the
            elements and otherwise passed unchanged. (default: :obj:`None`)
        invariant_outputs (sequence of int, optional): Positions of invariant outputs.
            (default: :obj:`()`)
        equivariant_outputs (sequence of int, optional): Positions of point-like outputs.
            (default: :obj:`()`)
        vector_outputs (sequence of int, optional): Positions of vector-like outputs.
            (default: :obj:`()`)
        set_outputs (sequence of int, optional): Positions of outputs with one row per set.
            (default: :obj:`()`)
        n_trials (int, optional): Random draws per kind of transformation. (default: :obj:`3`)
        rotations (bool, optional): Check rotations. (default: :obj:`True`)
        reflections (bool, optional): Check reflections. (default: :obj:`True`)
        translations (bool, optional): Check translations. (default: :obj:`True`)
        permutations (bool, optional): Check permutations inside sets. (default: :obj:`True`)
        independent_sets (bool, optional): One transformation per set. (default: :obj:`True`)
        atol (float, optional): Absolute tolerance. (default: :obj:`None`, by dtype)
        rtol (float, optional): Relative tolerance. (default: :obj:`None`, by dtype)
        generator (torch.Generator, optional): CPU generator for the random transformations.
            (default: :obj:`None`, the global generator)

    Returns:
        dict: For each checked kind (``"rotation"``, ``"reflection"``, ``"translation"``,
        ``"permutation"``), the worst absolute error over trials and outputs (the one largest
        relative to its tolerance).

    Raises:
        AssertionError: If any kind exceeds the tolerance; the message gives, for every kind, the
            worst error, its tolerance, the output position and the trial.
        ValueError: If the inputs or the output declarations are inconsistent, or a set-level
            point output has a row for a set without elements.

    Shapes:
        - **input:** pos :math:`(N, D)`, batch :math:`(N)`, features :math:`(N, *)`
    """
    if pos.dim() != 2 or not pos.is_floating_point():
        raise ValueError(f"Expected floating 'pos' of shape (N, D), got {tuple(pos.shape)} and "
                         f"dtype {pos.dtype}")
    num_nodes, dim = pos.shape
    if batch is not None and (batch.dim() != 1 or batch.numel() != num_nodes
                              or batch.dtype != torch.long):
        raise ValueError(f"Expected a long 'batch' of shape ({num_nodes},), got "
                         f"{tuple(batch.shape)} and dtype {batch.dtype}")
    if batch is not None and num_nodes > 0 and int(batch.min()) < 0:
        raise ValueError(f"Expected set ids >= 0 in 'batch', got {int(batch.min())}")
    if features is not None and features.size(0) != num_nodes:
        raise ValueError(f"'features' has {features.size(0)} rows but 'pos' has {num_nodes}")
    if n_trials < 1:
        raise ValueError(f"'n_trials' must be positive, got {n_trials}")
    default_atol, default_rtol = default_tolerance(pos.dtype)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol

    reference = _as_tuple(fn(pos, features, batch))
    kind_of: Dict[int, str] = {}
    for name, positions in (('invariant', invariant_outputs), ('equivariant', equivariant_outputs),
                            ('vector', vector_outputs)):
        for k in positions:
            if not 0 <= k < len(reference):
                raise ValueError(f"Output position {k} in '{name}_outputs' is out of range: fn "
                                 f"returned {len(reference)} output(s)")
            if k in kind_of:
                raise ValueError(f"Output {k} is declared both '{kind_of[k]}' and '{name}'")
            kind_of[k] = name
    missing = [k for k in range(len(reference)) if k not in kind_of]
    if missing:
        raise ValueError(f"Output(s) {missing} are not declared: list each output in "
                         f"'invariant_outputs', 'equivariant_outputs' or 'vector_outputs'")
    if any(not 0 <= k < len(reference) for k in set_outputs):
        raise ValueError(f"'set_outputs' {list(set_outputs)} out of range for "
                         f"{len(reference)} output(s)")
    set_level = set(set_outputs)
    for k, y in enumerate(reference):
        if kind_of[k] != 'invariant' and (y.dim() < 2 or y.size(-1) != dim):
            raise ValueError(f"Output {k} is declared '{kind_of[k]}' but its shape "
                             f"{tuple(y.shape)} does not end in D={dim}")
        if k not in set_level and (y.dim() == 0 or y.size(0) != num_nodes):
            raise ValueError(f"Output {k} has shape {tuple(y.shape)}, not one row per element "
                             f"({num_nodes}); list it in 'set_outputs' if it has one row per set")

    # One transformation per set id in 'batch' (or a single one for all elements).
    node_set = (batch if batch is not None and independent_sets else
                torch.zeros(num_nodes, dtype=torch.long, device=pos.device))  # (N,)
    num_groups = int(node_set.max()) + 1 if num_nodes > 0 else 1
    set_ids = (batch if batch is not None else node_set).detach().cpu()  # (N,)
    for k in set_level:
        if kind_of[k] == 'invariant':
            continue
        num_rows = reference[k].size(0)
        if kind_of[k] == 'equivariant':
            # (a point of a set without elements moves with no transformation of its elements:
            # an equivariant function's zero centroid there was compared with a translated one)
            counts = torch.bincount(set_ids, minlength=num_rows)[:num_rows]  # (R,)
            empty = (counts == 0).nonzero().flatten()
            if empty.numel() > 0:
                raise ValueError(f"Output {k} is an 'equivariant' set-level output with "
                                 f"{num_rows} rows, but 'batch' has no elements in sets "
                                 f"{empty.tolist()}: a point of an empty set (trailing empty "
                                 f"sets too) has no transformation")
        elif independent_sets and num_rows > num_groups:  # (a vector: Q 0 = 0 where a set is
            # empty, but a set after the last id in 'batch' has no transformation drawn)
            raise ValueError(f"Output {k} is a '{kind_of[k]}' set-level output with {num_rows} "
                             f"rows, but 'batch' has elements in only {num_groups} sets: "
                             f"trailing empty sets have no transformation")
    shift_scale = float(pos.detach().abs().max()) if num_nodes > 0 else 1.0
    shift_scale = shift_scale if shift_scale > 0 else 1.0

    enabled = [kind for kind, on in zip(_KINDS, (rotations, reflections, translations,
                                                 permutations)) if on]
    # kind -> (ratio err / tol, err, tol, output position, trial)
    worst: Dict[str, Tuple[float, float, float, int, int]] = {}
    for kind in enabled:
        for trial in range(n_trials):
            mat = shift = perm = None
            if kind in ('rotation', 'reflection'):
                mat = random_orthogonal(num_groups, dim, det=1 if kind == 'rotation' else -1,
                                        generator=generator, dtype=pos.dtype, device=pos.device)
            elif kind == 'translation':
                eye = torch.eye(dim, dtype=pos.dtype, device=pos.device)
                mat = eye.expand(num_groups, dim, dim)  # (S, D, D)
                shift = shift_scale * torch.randn(num_groups, dim, generator=generator,
                                                  dtype=torch.float64).to(pos)  # (S, D)
            else:
                perm = permute_within_sets(
                    batch if batch is not None else node_set, generator=generator)  # (N,)

            if perm is not None:
                new_pos = pos[perm]
                new_features = features[perm] if features is not None else None
            else:
                assert mat is not None  # set by the rotation, reflection and translation branches
                node_shift = shift[node_set] if shift is not None else None
                new_pos = _act(mat[node_set], node_shift, pos)  # (N, D)
                new_features = features
            outputs = _as_tuple(fn(new_pos, new_features, batch))
            if len(outputs) != len(reference):
                raise AssertionError(f"fn returned {len(outputs)} outputs after a {kind}, "
                                     f"{len(reference)} before")

            for k, (y, y_new) in enumerate(zip(reference, outputs)):
                expected = y.detach().to(torch.float64)
                if perm is not None:
                    if k not in set_level:
                        expected = expected[perm]
                elif kind_of[k] != 'invariant':
                    assert mat is not None
                    rows = (node_set if k not in set_level else
                            torch.arange(y.size(0), device=y.device))  # (R,)
                    if not independent_sets:
                        rows = torch.zeros_like(rows)
                    row_shift = None
                    if shift is not None and kind_of[k] == 'equivariant':
                        row_shift = shift.to(torch.float64)[rows]  # (R, D)
                    expected = _act(mat.to(torch.float64)[rows], row_shift, expected)
                if y_new.shape != expected.shape:
                    raise AssertionError(f"Output {k} changed shape under a {kind}: "
                                         f"{tuple(expected.shape)} -> {tuple(y_new.shape)}")
                diff = (y_new.detach().to(torch.float64) - expected).abs()
                err = float(diff.max()) if diff.numel() > 0 else 0.0
                finite = bool(torch.isfinite(expected).all() and torch.isfinite(y_new).all())
                if not math.isfinite(err) or not finite:  # (inf - inf is NaN: no error read)
                    err = math.inf
                # (an infinite entry would make the tolerance infinite: the finite ones scale it)
                finite_expected = expected[torch.isfinite(expected)]
                scale = (float(finite_expected.abs().max()) if finite_expected.numel() > 0
                         else 0.0)
                tol = atol + rtol * scale
                ratio = err / tol if tol > 0 else (0.0 if err == 0 else math.inf)
                if kind not in worst or ratio > worst[kind][0]:
                    worst[kind] = (ratio, err, tol, k, trial)

    failed = [kind for kind in enabled if worst[kind][0] > 1.0]
    if failed:
        lines: List[str] = []
        for kind in enabled:
            _, err, tol, k, trial = worst[kind]
            status = 'FAIL' if kind in failed else 'ok'
            lines.append(f"  {kind}: worst error {err:.3e} vs tolerance {tol:.3e} "
                         f"(output {k}, {kind_of[k]}, trial {trial}) {status}")
        raise AssertionError(f"fn is not equivariant under {', '.join(failed)} "
                             f"(dtype {pos.dtype}, atol={atol:g}, rtol={rtol:g}):\n"
                             + '\n'.join(lines))
    return {kind: worst[kind][1] for kind in enabled}
