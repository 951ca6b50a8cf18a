"""attnkit.training.run_state: what a resume restores of the schedule, and what it takes from
the resumed config."""

from __future__ import annotations

import math

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

from attnkit.training.cosine_schedule import CosineSchedule
from attnkit.training.distributed import DistInfo
from attnkit.training.run_state import load_resume_states, resume_states
from attnkit.training.schedule import InverseSqrtSchedule


def optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=1.0)


def saved_after(factor, steps: int) -> dict:
    opt = optimizer()
    scheduler = LambdaLR(opt, factor)
    for _ in range(steps):
        opt.step()
        scheduler.step()
    return resume_states(opt, scheduler, torch.amp.GradScaler("cpu", enabled=False), DistInfo())


def test_unchanged_settings_restore_the_saved_rate_untouched():
    saved = saved_after(InverseSqrtSchedule(d_model=64, warmup=10, scale=0.8), 30)
    opt = optimizer()
    scheduler = LambdaLR(opt, InverseSqrtSchedule(d_model=64, warmup=10, scale=0.8))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    load_resume_states(saved, opt, scheduler, scaler, DistInfo(), progress=0.9)
    assert opt.param_groups[0]["lr"] == saved["optimizer"]["param_groups"][0]["lr"]
    assert scheduler.lr_lambdas[0].progress == 0.0  # the saved one: nothing changed


def test_a_new_schedule_starts_from_the_budget_spent_not_from_zero():
    """An inverse-sqrt run without cooldown saved progress 0; resumed as cosine past warmup at
    90% of its budget, its next rate is the cosine curve's at 90% (near min_lr), not peak_lr."""
    saved = saved_after(InverseSqrtSchedule(d_model=64, warmup=10), 30)
    opt = optimizer()
    scheduler = LambdaLR(opt, CosineSchedule(peak_lr=1e-3, min_lr=1e-4, warmup=10))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    load_resume_states(saved, opt, scheduler, scaler, DistInfo(), progress=0.9)
    expected = 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + math.cos(math.pi * 0.9))  # independent
    assert opt.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12)
    assert set(vars(scheduler.lr_lambdas[0])) == {"peak_lr", "min_lr", "warmup", "cooldown",
                                                  "progress"}  # fmt: skip
