"""Warmup + cosine decay: the factor against torch's CosineAnnealingLR, and the learning
rates a step-budgeted run logs."""

from __future__ import annotations

import pytest
import torch

from attnkit.training.config import OptimConfig
from attnkit.training.cosine_schedule import CosineSchedule, build_lr_scheduler
from attnkit.training.metrics_log import read_metrics
from attnkit.training.trainer import Trainer, train
from tests.helpers.lm import tiny_lm_config


def torch_cosine(peak: float, low: float, total: int, steps_done: int) -> float:
    """CosineAnnealingLR's learning rate after ``steps_done`` of ``total`` steps."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total, eta_min=low)
    for _ in range(steps_done):
        opt.step()
        sched.step()
    return sched.get_last_lr()[0]


@pytest.mark.parametrize("progress_steps", [0, 1, 7, 13, 20])
def test_after_warmup_the_factor_is_torchs_cosine(progress_steps):
    schedule = CosineSchedule(peak_lr=1e-3, min_lr=1e-4, warmup=5, progress=progress_steps / 20)
    assert schedule(10) == pytest.approx(torch_cosine(1e-3, 1e-4, 20, progress_steps), rel=1e-12)


def test_warmup_is_linear_to_the_peak_and_a_cooldown_multiplies():
    schedule = CosineSchedule(peak_lr=2e-3, min_lr=0.0, warmup=4)
    assert [schedule(k) for k in range(4)] == pytest.approx([5e-4, 1e-3, 1.5e-3, 2e-3])
    cooled = CosineSchedule(peak_lr=2e-3, min_lr=0.0, warmup=4, cooldown=0.5, progress=0.75)
    plain = CosineSchedule(peak_lr=2e-3, min_lr=0.0, warmup=4, progress=0.75)
    assert cooled(10) == pytest.approx(plain(10) * 0.5)


def test_the_logged_learning_rates_follow_warmup_then_cosine_over_the_steps(tmp_path):
    """Step j's rate comes from the budget spent before it, (j - 1) / max_steps."""
    train(tiny_lm_config("optim.max_steps=20", "optim.warmup_steps=5"), tmp_path, progress=False)
    lrs = {r["step"]: r["lr"] for r in read_metrics(tmp_path / "metrics.jsonl") if "lr" in r}
    assert sorted(lrs) == list(range(1, 21))
    for step, lr in lrs.items():
        if step <= 5:
            expected = 3e-3 * step / 5
        else:
            expected = torch_cosine(3e-3, 3e-4, 20, step - 1)
        assert lr == pytest.approx(expected, rel=1e-9), step


def test_cosine_needs_a_fixed_budget(tmp_path):
    config = tiny_lm_config("optim.patience=3")
    with pytest.raises(ValueError, match=r'schedule="cosine" needs a fixed budget'):
        Trainer(config, tmp_path)


def test_inverse_sqrt_stays_the_default():
    optimizer = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = build_lr_scheduler(optimizer, OptimConfig(warmup_steps=10), d_model=16)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(16**-0.5 * 10**-1.5)
    assert type(scheduler.lr_lambdas[0]).__name__ == "InverseSqrtSchedule"
