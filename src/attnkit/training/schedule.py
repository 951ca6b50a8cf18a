"""The paper's learning-rate schedule: linear warmup, then inverse square root decay.

    lr(step) = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)     (step >= 1)

It peaks at ``step = warmup`` with ``scale * (d_model * warmup)^-0.5``. The paper uses
``scale = 1``; with short schedules on small data a larger scale trains faster.

A run with a fixed budget (steps, epochs or minutes) can end with a *cooldown*: over the
last ``cooldown`` fraction of the budget the rate falls linearly to zero,

    lr(step) * min(1, (1 - progress) / cooldown)        progress = budget spent, in [0, 1]

the "warmup-stable-decay" shape (Hägele et al. 2024, "Scaling Laws and Compute-Optimal
Training Beyond Fixed Training Durations"): the schedule does not need to know the number of
steps in advance, which a wall-time budget cannot give. The trainer sets ``progress``.
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


def cooldown_factor(progress: float, cooldown: float) -> float:
    """1 until the last ``cooldown`` fraction of the budget, then linearly down to 0 at the end.

    Args:
        progress: Fraction of the budget spent (clamped to [0, 1]).
        cooldown: Fraction of the budget the decay takes, in [0, 1]; 0 = no cooldown.
    """
    if not 0.0 <= cooldown <= 1.0:
        raise ValueError(f"cooldown: expected a fraction in [0, 1], got {cooldown}")
    if cooldown == 0.0:
        return 1.0
    progress = min(max(progress, 0.0), 1.0)
    return min(1.0, (1.0 - progress) / cooldown)


@dataclass
class InverseSqrtSchedule:
    """Picklable ``LambdaLR`` factor; its fields are saved in the scheduler's state dict."""

    d_model: int
    warmup: int
    scale: float = 1.0
    cooldown: float = 0.0  # fraction of the budget for the final linear decay (0 = none)
    progress: float = 0.0  # budget spent, set by the trainer before each scheduler.step()

    def __call__(self, completed_steps: int) -> float:
        # LambdaLR passes the number of scheduler steps taken so far; the next optimizer step
        # is number completed_steps + 1.
        lr = inverse_sqrt_lr(
            completed_steps + 1, d_model=self.d_model, warmup=self.warmup, scale=self.scale
        )
        return lr * cooldown_factor(self.progress, self.cooldown)


def inverse_sqrt_scheduler(
    optimizer: Optimizer, *, d_model: int, warmup: int, scale: float = 1.0, cooldown: float = 0.0
) -> LambdaLR:
    """A ``LambdaLR`` that sets every group's lr to :func:`inverse_sqrt_lr` of the next step.

    The optimizer's own lr must be 1.0 (LambdaLR multiplies it by the factor). With
    ``cooldown > 0``, call :func:`set_progress` before each ``scheduler.step()``.
    """
    cooldown_factor(0.0, cooldown)  # validates the fraction
    for group in optimizer.param_groups:
        if group.get("initial_lr", group["lr"]) != 1.0:
            raise ValueError(
                f"optimizer: expected lr=1.0 (the schedule gives the value), got {group['lr']}"
            )
    return LambdaLR(optimizer, InverseSqrtSchedule(d_model, warmup, scale, cooldown))


def set_progress(scheduler: LambdaLR, progress: float) -> None:
    """Tells an :func:`inverse_sqrt_scheduler` how much of the budget is spent (for the next
    ``scheduler.step()``); the value is saved in ``scheduler.state_dict()``."""
    for factor in scheduler.lr_lambdas:
        factor.progress = float(progress)
