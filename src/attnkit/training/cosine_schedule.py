"""Linear warmup, then cosine decay of the learning rate (GPT-2's and nanoGPT's schedule).

    lr(step) = peak_lr * step / warmup                                            step <= warmup
    lr(step) = min_lr + (peak_lr - min_lr) * (1 + cos(pi * progress)) / 2         after

``progress`` is the fraction of the run's budget spent (:meth:`~attnkit.training.budget.
Budget.progress`: steps, epochs or minutes, whichever is furthest), so the same schedule ends
at ``min_lr`` whether the budget is 2,000 steps or 60 minutes; the trainer sets it before each
``scheduler.step()`` (:func:`~attnkit.training.schedule.set_progress`). ``optim.cooldown``
multiplies in as it does for the paper's schedule (:func:`~attnkit.training.schedule.
cooldown_factor`).

:func:`build_lr_scheduler` picks the schedule ``optim.schedule`` names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from attnkit.training.config import OptimConfig
from attnkit.training.optim import build_scheduler
from attnkit.training.schedule import cooldown_factor


@dataclass
class CosineSchedule:
    """Picklable ``LambdaLR`` factor (module docstring); its fields are saved with the
    scheduler's state dict, ``progress`` included, so a resumed run continues the curve."""

    peak_lr: float
    min_lr: float
    warmup: int
    cooldown: float = 0.0
    progress: float = 0.0  # budget spent, set by the trainer before each scheduler.step()

    def __call__(self, completed_steps: int) -> float:
        step = completed_steps + 1  # LambdaLR passes the steps taken; this is the next one
        if step <= self.warmup:
            lr = self.peak_lr * step / self.warmup
        else:
            progress = min(max(self.progress, 0.0), 1.0)
            lr = self.min_lr + (self.peak_lr - self.min_lr) * 0.5 * (
                1 + math.cos(math.pi * progress)
            )
        return lr * cooldown_factor(self.progress, self.cooldown)


def needs_progress(cfg: OptimConfig) -> bool:
    """Whether the schedule reads the budget's progress (cosine decay or a cooldown)."""
    return cfg.schedule == "cosine" or bool(cfg.cooldown)


def build_lr_scheduler(optimizer: Optimizer, cfg: OptimConfig, d_model: int) -> LambdaLR:
    """The schedule ``cfg.schedule`` names: ``"cosine"`` (this module; the learning rates are
    ``peak_lr`` and ``min_lr``) or ``"inverse_sqrt"`` (the paper's, scaled by ``lr_scale`` and
    ``d_model``). The optimizer's own lr must be 1.0: the factor is the learning rate."""
    if cfg.schedule != "cosine":
        return build_scheduler(optimizer, cfg, d_model)
    for group in optimizer.param_groups:
        if group.get("initial_lr", group["lr"]) != 1.0:
            raise ValueError(
                f"optimizer: expected lr=1.0 (the schedule gives the value), got {group['lr']}"
            )
    return LambdaLR(
        optimizer, CosineSchedule(cfg.peak_lr, cfg.min_lr, cfg.warmup_steps, cfg.cooldown)
    )
