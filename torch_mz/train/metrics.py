r"""Metrics from the sums :meth:`~torch_mz.train.Trainer.evaluate` accumulates over batches (and,
under DDP, over processes)."""
import torch
from torch import Tensor

__all__ = []


def r2_from_sums(ss_res: Tensor, ss_tot: Tensor) -> Tensor:
    r"""Coefficient of determination :math:`R^2 = 1 - \sum (y - \hat y)^2 / \sum (y - \bar y)^2`
    from the residual and total sums of squares of each target column, averaged uniformly over
    columns (scikit-learn's ``multioutput='uniform_average'``). A constant target column scores 1
    if predicted exactly and 0 otherwise.

    Shapes:
        - **input:** ss_res :math:`(t)`, ss_tot :math:`(t)`
        - **output:** a scalar
    """
    constant = ss_tot <= 0
    r2 = 1.0 - ss_res / torch.where(constant, torch.ones_like(ss_tot), ss_tot)
    r2 = torch.where(constant, (ss_res <= 0).to(r2.dtype), r2)
    return r2.mean()
