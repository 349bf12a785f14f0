r"""An oracle reference for targets that are functions of the set mean: an MLP on the exact mean."""
from typing import Tuple

from torch import Tensor

from torch_mz._checks import check_count
from torch_mz.models.base import SetModel
from torch_mz.models.mlp import gelu_mlp, reset_linear_layers
from torch_mz.nn.functional import set_mean


class MeanMLP(SetModel):
    r"""An MLP on the exact mean of each set,

    .. math::
        f(S) = \rho\Big(\frac{1}{|S|} \sum_{x \in S} x\Big),

    the attainable ceiling on targets that depend on a set only through its mean, such as the
    quadratic-TDOF target of the MZAttn paper (Eq. 4, Table 1): the model is handed the one
    statistic the target needs, so what it misses is what an MLP of this size cannot fit from the
    training sets. It is not a set model to compare with on other targets. The forward returns
    ``(prediction, None)`` (the contract of :mod:`torch_mz.models.base`: an empty set predicts
    zero).

    Args:
        in_channels (int): Element width.
        out_channels (int): Output width.
        hidden_channels (int, optional): MLP width. (default: :obj:`128`)
        num_layers (int, optional): Hidden layers of :math:`\rho`. (default: :obj:`3`)

    Shapes:
        - **input:** a PyG :class:`~torch_geometric.data.Batch` with ``pos`` and/or ``x``, read
          as ``[pos, x]`` :math:`(N, F)` (:func:`~torch_mz.models.base.set_features`), or ``x``
          :math:`(N, F)` and ``batch`` :math:`(N)`
        - **output:** :class:`~torch_mz.models.base.SetPrediction` ``(prediction, None)``,
          prediction :math:`(B, \text{out\_channels})`
    """
    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 128,
                 num_layers: int = 3):
        super().__init__()
        in_channels = check_count('in_channels', in_channels)
        out_channels = check_count('out_channels', out_channels)
        hidden_channels = check_count('hidden_channels', hidden_channels)
        num_layers = check_count('num_layers', num_layers)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.hidden_channels = hidden_channels
        self.num_layers = num_layers
        self.rho = gelu_mlp(in_channels, hidden_channels, out_channels, num_layers)

    def reset_parameters(self):
        reset_linear_layers(self.rho)

    def predict(self, x: Tensor, batch: Tensor, num_sets: int) -> Tuple[Tensor, None]:
        mean = set_mean(x, batch, num_sets)  # (B, F)
        return self.rho(mean), None  # (B, out_channels)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, {self.out_channels}, '
                f'hidden_channels={self.hidden_channels}, num_layers={self.num_layers})')
