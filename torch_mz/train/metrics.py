r"""Metrics of predictions against targets, in ``float64``: squared and absolute error, :math:`R^2`
(also from the sums :meth:`~torch_mz.train.Trainer.evaluate` accumulates) and accuracy."""
import torch
from torch import Tensor

__all__ = ['mse', 'mae', 'r2_score', 'accuracy']


def mse(pred: Tensor, target: Tensor) -> Tensor:
    r"""Mean squared error over all elements."""
    return (pred.to(torch.float64) - target.to(torch.float64)).pow(2).mean()


def mae(pred: Tensor, target: Tensor) -> Tensor:
    r"""Mean absolute error over all elements."""
    return (pred.to(torch.float64) - target.to(torch.float64)).abs().mean()


def r2_score(pred: Tensor, target: Tensor) -> Tensor:
    r"""Coefficient of determination :math:`R^2 = 1 - \sum (y - \hat y)^2 / \sum (y - \bar y)^2`,
    computed per target column of a :math:`(N, t)` input (a 1-D input is one column) and averaged
    uniformly over columns (scikit-learn's ``multioutput='uniform_average'``). A constant target
    column scores 1 if predicted exactly and 0 otherwise."""
    p = pred.to(torch.float64).reshape(target.size(0), -1)  # (N, t)
    y = target.to(torch.float64).reshape(target.size(0), -1)  # (N, t)
    ss_res = (y - p).pow(2).sum(dim=0)
    ss_tot = (y - y.mean(dim=0)).pow(2).sum(dim=0)
    return _r2_from_sums(ss_res, ss_tot)


def _r2_from_sums(ss_res: Tensor, ss_tot: Tensor) -> Tensor:
    constant = ss_tot <= 0
    r2 = 1.0 - ss_res / torch.where(constant, torch.ones_like(ss_tot), ss_tot)
    r2 = torch.where(constant, (ss_res <= 0).to(r2.dtype), r2)
    return r2.mean()


def accuracy(pred: Tensor, target: Tensor) -> Tensor:
    r"""Fraction of correct class predictions; ``pred`` holds logits/probabilities of shape
    :math:`(N, C)` or class indices of shape :math:`(N,)`."""
    labels = pred.argmax(dim=-1) if pred.dim() > 1 else pred
    return (labels.view(-1) == target.view(-1)).to(torch.float64).mean()
