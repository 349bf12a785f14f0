r"""The plain MLP of the MLP models: :class:`~torch_mz.models.DeepSets`' :math:`\phi` and
:math:`\rho` and :class:`~torch_mz.models.MeanMLP`'s :math:`\rho`."""
import torch
from torch.nn import Linear, Sequential

from torch_mz._checks import check_fits

__all__ = ['gelu_mlp', 'reset_linear_layers']


def gelu_mlp(in_channels: int, hidden_channels: int, out_channels: int,
             num_layers: int) -> Sequential:
    r""":obj:`num_layers` hidden layers of width :obj:`hidden_channels`, each a linear layer and
    a GELU, then a linear layer to :obj:`out_channels`:
    ``Linear(in, hidden), GELU, ..., Linear(hidden, hidden), GELU, Linear(hidden, out)``.
    Raises a :class:`ValueError` for :obj:`num_layers` below 1, and for sizes whose layers could
    not fit in this machine's memory (:func:`~torch_mz._checks.check_fits`)."""
    if num_layers < 1:
        raise ValueError(f"'num_layers' must be at least 1 (got {num_layers})")
    # (a Linear(hidden, hidden) and a GELU a layer after the first, checked before the list of
    # widths and the layers are made)
    check_fits(f'num_layers={num_layers}, hidden_channels={hidden_channels}',
               (num_layers - 1) * hidden_channels * hidden_channels, 2 * num_layers)
    dims = [in_channels] + [hidden_channels] * num_layers
    layers = []
    for i in range(num_layers):
        layers += [Linear(dims[i], dims[i + 1]), torch.nn.GELU()]
    layers.append(Linear(hidden_channels, out_channels))
    return Sequential(*layers)


def reset_linear_layers(*mlps: Sequential) -> None:
    r"""Re-initialises every linear layer of :obj:`mlps`."""
    for mlp in mlps:
        for m in mlp:
            if isinstance(m, Linear):
                m.reset_parameters()
