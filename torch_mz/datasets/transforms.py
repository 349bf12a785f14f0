r"""Training-time augmentation for point-cloud sets that :mod:`torch_geometric.transforms` lacks.

The datasets of :mod:`torch_mz.datasets` keep coordinates in :obj:`pos` only, and every model
reads :obj:`pos` (and :obj:`x` where there are features), so PyG's transforms of point sets
(those that read :obj:`pos`, :obj:`x`, :obj:`y`) compose with every dataset and model; those
that need mesh faces (``SamplePoints``, ``FaceToEdge``) do not apply, as no dataset stores
:obj:`face`. The paper's augmentation for ModelNet40 and ScanObjectNN (Appendix A.2,
Tasks C and E) is, written the PyG way::

    from torch_geometric.transforms import Compose, FixedPoints, RandomRotate
    from torch_mz.datasets.transforms import RandomJitter

    augment = Compose([RandomRotate(180, axis=1),  # about the up axis y
                       RandomJitter()])             # PointNet's clipped gaussian jitter
    subset = FixedPoints(1024, replace=False)       # a random subset of the points

PyG has the rotation (:class:`~torch_geometric.transforms.RandomRotate`) and the point subset
(:class:`~torch_geometric.transforms.FixedPoints`); its
:class:`~torch_geometric.transforms.RandomJitter` adds *uniform* noise, so PointNet's clipped
*gaussian* jitter is here.
"""
import math
from typing import Any, Optional

import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

__all__ = ['RandomJitter']


def _number(value: Any) -> float:
    # a number (a Python, NumPy or one-element torch number) as a float; anything else (text,
    # and a truth value of any type, which float() reads as 0 or 1) as NaN, which is refused
    if (isinstance(value, (str, bytes, bool))
            or str(getattr(value, 'dtype', '')) in ('bool', 'torch.bool')):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return math.nan


class RandomJitter(BaseTransform):
    r"""Adds clipped gaussian noise to every coordinate (PointNet's jitter):

    .. math::
        \mathbf{p}' = \mathbf{p} + \mathrm{clip}(\boldsymbol{\epsilon}, -c, c), \qquad
        \boldsymbol{\epsilon} \sim \mathcal{N}(0, \sigma^2 I).

    Acts on :obj:`pos` only (as PyG's transforms do). Randomness comes from :mod:`torch`'s global
    generator, so :func:`torch.manual_seed` makes an epoch reproducible; the noise is drawn in
    :obj:`float32`, row by row, and then cast, so a seed gives the same noise (rounded to the
    dtype) whatever the floating dtype and memory layout of :obj:`pos`.

    Args:
        sigma (float, optional): Standard deviation :math:`\sigma`, finite and non-negative.
            (default: :obj:`0.01`)
        clip (float, optional): Clipping bound :math:`c`, non-negative (not NaN; :obj:`inf`
            clips nothing); :obj:`None` for no clipping. (default: :obj:`0.05`)

    Shapes:
        - **pos:** :math:`(n, D)`, floating point, returned with the same shape and dtype
    """

    def __init__(self, sigma: float = 0.01, clip: Optional[float] = 0.05) -> None:
        # (NaN passes a `< 0` check, and NaN or an infinite sigma makes every coordinate NaN
        # or infinite)
        if not math.isfinite(_number(sigma)) or _number(sigma) < 0:
            raise ValueError(f"'sigma' must be a finite non-negative number, got {sigma!r}")
        if clip is not None and not _number(clip) >= 0:
            raise ValueError(f"'clip' must be a non-negative number (not NaN) or None, got "
                             f"{clip!r}")
        self.sigma = float(sigma)
        # (a float, as sigma: clip=1 and clip=1.0 are one transform, with one cache key)
        self.clip = None if clip is None else float(clip)

    def forward(self, data: Data) -> Data:
        if data.pos is None or data.pos.dim() != 2:
            shape = None if data.pos is None else tuple(data.pos.shape)
            raise ValueError(f"expected 'pos' of shape (n, D), got {shape}")
        if not data.pos.is_floating_point():  # (torch's kernels refused it by their names)
            raise ValueError(f"expected floating-point 'pos' (gaussian noise is real-valued), "
                             f"got {data.pos.dtype}")
        # (randn_like drew other numbers for float64 than for float32, and for a transposed
        # pos than for a contiguous one, from one seed)
        # (float32 whatever the default dtype: under torch.set_default_dtype(torch.float64)
        # the noise was drawn in float64, other numbers than the float32 ones)
        noise = torch.randn(data.pos.shape, dtype=torch.float32,
                            device=data.pos.device)  # (n, D)
        noise = noise.to(data.pos.dtype) * self.sigma  # (n, D)
        if self.clip is not None:
            noise = noise.clamp(-self.clip, self.clip)
        data.pos = data.pos + noise
        return data

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(sigma={self.sigma}, clip={self.clip})'
