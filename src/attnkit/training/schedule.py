"""The paper's learning-rate schedule: linear warmup, then inverse square root decay.

    lr(step) = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)     (step >= 1)

It peaks at ``step = warmup`` with ``scale * (d_model * warmup)^-0.5``. The paper uses
``scale = 1``; with short schedules on small data a larger scale trains faster.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def inverse_sqrt_lr(step: int, *, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """The learning rate of optimizer step ``step`` (counted from 1)."""
    if step < 1:
        raise ValueError(f"step: expected an optimizer step >= 1, got {step}")
    if d_model < 1 or warmup < 1:
        raise ValueError(f"d_model and warmup: expected >= 1, got {d_model} and {warmup}")
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@dataclass
class InverseSqrtSchedule:
    """Picklable ``LambdaLR`` factor; its fields are saved in the scheduler's state dict."""

    d_model: int
    warmup: int
    scale: float = 1.0

    def __call__(self, completed_steps: int) -> float:
        # LambdaLR passes the number of scheduler steps taken so far; the next optimizer step
        # is number completed_steps + 1.
        return inverse_sqrt_lr(
            completed_steps + 1, d_model=self.d_model, warmup=self.warmup, scale=self.scale
        )


def inverse_sqrt_scheduler(
    optimizer: Optimizer, *, d_model: int, warmup: int, scale: float = 1.0
) -> LambdaLR:
    """A ``LambdaLR`` that sets every group's lr to :func:`inverse_sqrt_lr` of the next step.

    The optimizer's own lr must be 1.0 (LambdaLR multiplies it by the factor).
    """
    for group in optimizer.param_groups:
        if group.get("initial_lr", group["lr"]) != 1.0:
            raise ValueError(
                f"optimizer: expected lr=1.0 (the schedule gives the value), got {group['lr']}"
            )
    return LambdaLR(optimizer, InverseSqrtSchedule(d_model, warmup, scale))
