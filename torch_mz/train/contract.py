r"""The model contract (see :mod:`torch_mz.train`): what a model returns, what a batch's ``y``
holds for each task type, and the checks that hold both to it."""
from typing import Any, Callable, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.loader import DataLoader

__all__ = ['TASK_TYPES', 'ModelOutput', 'LossFn']

TASK_TYPES = ('regression', 'classification')

ModelOutput = Union[Tensor, Tuple[Tensor, ...]]
LossFn = Callable[[ModelOutput, Tensor], Tensor]


def _first(out: ModelOutput) -> Tensor:
    if isinstance(out, (tuple, list)):
        if len(out) == 0:
            raise ValueError('Model returned an empty tuple; expected (pred, ...)')
        out = out[0]
    if not torch.is_tensor(out):
        raise ValueError(f'Expected the model to return a tensor (B, out_dim) or a tuple whose '
                         f'first element is one (got {type(out).__name__})')
    return out


def _raw_targets(batch: Any, task_type: str) -> Tensor:
    r"""``batch.y`` as ``(B, t)`` float (regression: float64 targets stay float64, integer
    targets become float64, which holds every integer up to :math:`2^{53}`, other floating
    targets float32) or ``(B,)`` long (classification)."""
    y = getattr(batch, 'y', None)
    if y is None:
        raise ValueError('Expected every graph to carry a target `y`')
    num_graphs = batch.num_graphs
    if task_type == 'regression':
        if y.numel() % max(num_graphs, 1) != 0 or y.numel() == 0:
            raise ValueError(f'Expected regression targets with t values per graph (batch.y of '
                             f'shape (B, t) with B={num_graphs}; got {tuple(y.shape)})')
        y = y.reshape(num_graphs, -1)  # (B, t)
        if y.dtype == torch.float64 or not (y.is_floating_point() or y.is_complex()):
            return y.to(torch.float64)  # (float32 would round 1e8 + 2 to 1e8)
        return y.float()
    if y.numel() != num_graphs or y.is_floating_point():
        raise ValueError(f'Expected one integer class index per graph (batch.y of shape (B,) or '
                         f'(B, 1) with B={num_graphs}; got {tuple(y.shape)} {y.dtype})')
    return y.reshape(num_graphs).long()  # (B,)


def _match_pred(pred: Tensor, target: Tensor, task_type: str) -> Tensor:
    if task_type == 'regression':
        if pred.dim() == 1:
            pred = pred.unsqueeze(-1)  # (B, 1)
        if pred.shape != target.shape:
            hint = ("; for class labels in y, train with task_type='classification'"
                    if target.dim() == 2 and target.size(1) == 1 and pred.dim() == 2
                    and pred.size(1) > 1 else '')
            raise ValueError(f'Expected a regression prediction of shape {tuple(target.shape)} '
                             f'(B, t) (got {tuple(pred.shape)}){hint}')
    elif pred.dim() != 2 or pred.size(0) != target.size(0):
        raise ValueError(f'Expected class logits of shape (B={target.size(0)}, n_classes) '
                         f'(got {tuple(pred.shape)})')
    return pred


def _collect_targets(dataset: Sequence, task_type: str, batch_size: int,
                     num_workers: int) -> Tensor:
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    return torch.cat([_raw_targets(b, task_type) for b in loader], dim=0)
