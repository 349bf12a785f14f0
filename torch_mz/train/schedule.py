r"""The learning-rate schedule: linear warm-up, then cosine decay to zero."""
import math
import numbers

import torch
from torch.optim.lr_scheduler import LambdaLR

__all__ = ['cosine_with_warmup']


def cosine_with_warmup(optimizer: torch.optim.Optimizer, warmup_steps: int,
                       total_steps: int) -> LambdaLR:
    r"""Linear warm-up followed by a cosine decay to zero, as a :class:`~torch.optim.lr_scheduler.
    LambdaLR`. With :math:`w` warm-up steps and :math:`T` steps in total the factor applied to
    each base learning rate at step :math:`s` (one call of ``scheduler.step()`` per step) is

    .. math::
        \lambda(s) = \begin{cases} s / w & s < w \\
        \tfrac{1}{2}\left(1 + \cos\left(\pi\,\frac{s - w}{T - w}\right)\right) & w \le s \le T \\
        0 & s > T \end{cases}

    so the learning rate is 0 at the start (when :math:`w > 0`), peaks after the warm-up and is 0 at
    step :math:`T`.

    Args:
        optimizer (torch.optim.Optimizer): The optimiser whose learning rates are scheduled.
        warmup_steps (int): Number of linear warm-up steps :math:`w` (an integer).
        total_steps (int): Total number of steps :math:`T` (an integer :math:`\ge w`,
            :math:`> 0`).
    """
    for name, value in (('warmup_steps', warmup_steps), ('total_steps', total_steps)):
        # (a NaN passed every comparison below and gave NaN learning rates; a fraction or a
        # bool was taken as a count of steps)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f'Expected an integer {name} (got {value!r})')
    if total_steps <= 0 or warmup_steps < 0 or warmup_steps > total_steps:
        raise ValueError(f'Expected 0 <= warmup_steps <= total_steps and total_steps > 0 '
                         f'(got warmup_steps={warmup_steps}, total_steps={total_steps})')

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps
        if step >= total_steps:
            return 0.0
        progress = (step - warmup_steps) / (total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
