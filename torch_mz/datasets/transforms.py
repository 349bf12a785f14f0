r"""Training-time augmentations for point-cloud sets, as used for ModelNet40 and ScanObjectNN in the
MZAttn paper (Appendix A.2, Tasks C and E): random rotation about the up axis (y), clipped gaussian
jitter, and an optional random subset of the points.

The point-cloud datasets of :mod:`torch_mz.datasets` store the coordinates twice, as :obj:`pos` and
as the set features :obj:`x`. Each transform here changes both the same way, so :obj:`x` stays
equal to :obj:`pos` (more generally: the three columns :obj:`x[:, coords_in_x:coords_in_x + 3]`
stay equal to :obj:`pos`). Randomness comes from :mod:`torch`'s global generator, as in
:mod:`torch_geometric.transforms`, so :func:`torch.manual_seed` makes an epoch reproducible.
"""
import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform


def _check_coords(data: Data, coords_in_x: Optional[int]) -> bool:
    if data.pos is None or data.pos.dim() != 2 or data.pos.size(-1) != 3:
        shape = None if data.pos is None else tuple(data.pos.shape)
        raise ValueError(f"expected 'pos' of shape (n, 3), got {shape}")
    if coords_in_x is None or data.x is None:
        return False
    if data.x.dim() != 2 or data.x.size(0) != data.pos.size(0) or data.x.size(1) < coords_in_x + 3:
        raise ValueError(
            f"expected 'x' of shape (n={data.pos.size(0)}, >= {coords_in_x + 3}) with the "
            f"coordinates in columns {coords_in_x}..{coords_in_x + 2}, got {tuple(data.x.shape)}")
    return True


def _set_coords(data: Data, pos: Tensor, coords_in_x: Optional[int], with_x: bool) -> Data:
    data.pos = pos
    if with_x:
        x = data.x.clone()
        x[:, coords_in_x:coords_in_x + 3] = pos.to(x.dtype)  # (n, F)
        data.x = x
    return data


class RandomRotateUp(BaseTransform):
    r"""Rotates a point set about the up axis by an angle drawn uniformly from
    :math:`[-\theta, \theta]`:

    .. math::
        \mathbf{p}' = R_y(\phi)\,\mathbf{p}, \qquad
        R_y(\phi) = \begin{pmatrix} \cos\phi & 0 & \sin\phi \\ 0 & 1 & 0 \\
        -\sin\phi & 0 & \cos\phi \end{pmatrix}, \quad \phi \sim U[-\theta, \theta].

    Args:
        degrees (float or (float, float), optional): :math:`\theta` in degrees, or an explicit
            :obj:`(low, high)` range. (default: :obj:`180.0`, any rotation about the axis)
        axis (int, optional): The up axis (:obj:`1` is y, as in ModelNet40 and ScanObjectNN).
            (default: :obj:`1`)
        coords_in_x (int, optional): First of the three columns of :obj:`x` that hold the
            coordinates; :obj:`None` leaves :obj:`x` untouched. (default: :obj:`0`)

    Shapes:
        - **pos:** :math:`(n, 3)`, and :obj:`x` :math:`(n, F)`, :math:`F \geq` ``coords_in_x + 3``
    """

    def __init__(self, degrees: Union[float, Tuple[float, float]] = 180.0, axis: int = 1,
                 coords_in_x: Optional[int] = 0) -> None:
        if isinstance(degrees, (int, float)):
            degrees = (-abs(float(degrees)), abs(float(degrees)))
        if len(degrees) != 2 or degrees[0] > degrees[1]:
            raise ValueError(f"'degrees' must be a number or a (low, high) pair, got {degrees}")
        if axis not in (0, 1, 2):
            raise ValueError(f"'axis' must be 0, 1 or 2, got {axis}")
        self.degrees = (float(degrees[0]), float(degrees[1]))
        self.axis = axis
        self.coords_in_x = coords_in_x

    def rotation(self, angle: float, dtype: torch.dtype = torch.float) -> Tensor:
        r"""The :math:`3 \times 3` rotation by :obj:`angle` (radians) about :attr:`axis`."""
        c, s = math.cos(angle), math.sin(angle)
        i, j = [a for a in range(3) if a != self.axis]  # the rotated plane
        rot = torch.eye(3, dtype=dtype)
        # right-handed rotations: R_x and R_z put -sin above the diagonal, R_y (plane (x, z)) below
        sign = -1.0 if self.axis == 1 else 1.0
        rot[i, i], rot[j, j] = c, c
        rot[i, j], rot[j, i] = -sign * s, sign * s
        return rot

    def forward(self, data: Data) -> Data:
        with_x = _check_coords(data, self.coords_in_x)
        low, high = self.degrees
        angle = math.radians(low + (high - low) * float(torch.rand(())))
        rot = self.rotation(angle, data.pos.dtype)
        return _set_coords(data, data.pos @ rot.t(), self.coords_in_x, with_x)  # (n, 3)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(degrees={self.degrees}, axis={self.axis}, '
                f'coords_in_x={self.coords_in_x})')


class RandomJitter(BaseTransform):
    r"""Adds clipped gaussian noise to every coordinate (PointNet's jitter):

    .. math::
        \mathbf{p}' = \mathbf{p} + \mathrm{clip}(\boldsymbol{\epsilon}, -c, c), \qquad
        \boldsymbol{\epsilon} \sim \mathcal{N}(0, \sigma^2 I).

    Args:
        sigma (float, optional): Standard deviation :math:`\sigma`. (default: :obj:`0.01`)
        clip (float, optional): Clipping bound :math:`c`; :obj:`None` for no clipping.
            (default: :obj:`0.05`)
        coords_in_x (int, optional): First of the three columns of :obj:`x` that hold the
            coordinates; :obj:`None` leaves :obj:`x` untouched. (default: :obj:`0`)

    Shapes:
        - **pos:** :math:`(n, 3)`, and :obj:`x` :math:`(n, F)`
    """

    def __init__(self, sigma: float = 0.01, clip: Optional[float] = 0.05,
                 coords_in_x: Optional[int] = 0) -> None:
        if sigma < 0:
            raise ValueError(f"'sigma' must be non-negative, got {sigma}")
        if clip is not None and clip < 0:
            raise ValueError(f"'clip' must be non-negative or None, got {clip}")
        self.sigma = float(sigma)
        self.clip = clip
        self.coords_in_x = coords_in_x

    def forward(self, data: Data) -> Data:
        with_x = _check_coords(data, self.coords_in_x)
        noise = torch.randn_like(data.pos) * self.sigma  # (n, 3)
        if self.clip is not None:
            noise = noise.clamp(-self.clip, self.clip)
        return _set_coords(data, data.pos + noise, self.coords_in_x, with_x)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(sigma={self.sigma}, clip={self.clip})'


class RandomPointSubset(BaseTransform):
    r"""Keeps a random subset of :obj:`num` points (without replacement), applied to every per-point
    attribute (:obj:`pos`, :obj:`x`, a :obj:`mask`, ...) alike. A set with at most :obj:`num` points
    is only shuffled.

    Args:
        num (int): Number of points to keep.

    Shapes:
        - **input:** :math:`n` points; **output:** :math:`\min(n, \mathrm{num})` points
    """

    def __init__(self, num: int) -> None:
        if num < 1:
            raise ValueError(f"'num' must be a positive integer, got {num}")
        self.num = int(num)

    def forward(self, data: Data) -> Data:
        n = data.num_nodes
        if n is None:
            raise ValueError('cannot take a point subset of a data object without points')
        keep = torch.randperm(n)[:self.num]  # (min(n, num),)
        # decide what is per-point before changing anything: afterwards the point count differs
        node_keys = [
            key for key in data.keys() if isinstance(data[key], Tensor) and data[key].dim() > 0
            and data[key].size(0) == n and (key in ('pos', 'x') or data.is_node_attr(key))
        ]
        for key in node_keys:
            data[key] = data[key][keep]
        return data

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.num})'
