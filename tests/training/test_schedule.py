"""The inverse-square-root warmup schedule and the optimizer settings of the paper."""

from __future__ import annotations

import pytest
import torch

from attnkit.training.config import OptimConfig
from attnkit.training.optim import build_optimizer
from attnkit.training.schedule import (
    cooldown_factor,
    inverse_sqrt_lr,
    inverse_sqrt_scheduler,
    set_progress,
)


def paper_lr(step, d_model, warmup, scale=1.0):
    # "lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)", Sec. 5.3.
    return scale * (d_model**-0.5) * min(step**-0.5, step * warmup**-1.5)


def test_known_values():
    # d_model 512, warmup 4000: peak 512^-0.5 * 4000^-0.5 = 1 / sqrt(2048000)
    assert inverse_sqrt_lr(4000, d_model=512, warmup=4000) == pytest.approx(6.987712e-4, rel=1e-6)
    assert inverse_sqrt_lr(1, d_model=512, warmup=4000) == pytest.approx(
        1 / (512**0.5 * 4000**1.5), rel=1e-12
    )
    assert inverse_sqrt_lr(16000, d_model=512, warmup=4000) == pytest.approx(
        6.987712e-4 / 2, rel=1e-6
    )


@pytest.mark.parametrize(
    "d_model,warmup,scale", [(512, 4000, 1.0), (256, 1500, 2.0), (64, 10, 0.5)]
)
def test_matches_formula(d_model, warmup, scale):
    for step in [1, 2, warmup - 1, warmup, warmup + 1, 3 * warmup, 100_000]:
        got = inverse_sqrt_lr(step, d_model=d_model, warmup=warmup, scale=scale)
        assert got == pytest.approx(paper_lr(step, d_model, warmup, scale), rel=1e-12)


def test_peak_is_at_warmup():
    lrs = [inverse_sqrt_lr(s, d_model=256, warmup=50) for s in range(1, 200)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == 50


def test_scheduler_sets_the_lr_of_each_optimizer_step():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.Adam([p], lr=1.0)
    sched = inverse_sqrt_scheduler(opt, d_model=64, warmup=5, scale=2.0)
    for step in range(1, 12):
        assert opt.param_groups[0]["lr"] == pytest.approx(paper_lr(step, 64, 5, 2.0), rel=1e-12)
        p.grad = torch.ones(3)
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2 = torch.optim.Adam([torch.nn.Parameter(torch.zeros(3))], lr=1.0)
    sched2 = inverse_sqrt_scheduler(opt2, d_model=1, warmup=1)
    sched2.load_state_dict(state)
    assert sched2.last_epoch == 11 and sched2.lr_lambdas[0].warmup == 5


@pytest.mark.parametrize(
    "progress,want",
    [(0.0, 1.0), (0.5, 1.0), (0.75, 1.0), (0.8, 0.8), (0.9, 0.4), (1.0, 0.0), (1.3, 0.0)],
)
def test_cooldown_factor_is_linear_to_zero_over_the_last_fraction(progress, want):
    # cooldown 0.25: flat until 75% of the budget, then (1 - p) / 0.25 down to 0 at 100%.
    assert cooldown_factor(progress, 0.25) == pytest.approx(want, abs=1e-12)
    assert cooldown_factor(progress, 0.0) == 1.0  # no cooldown: the plain schedule


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_cooldown_must_be_a_fraction(bad):
    with pytest.raises(ValueError, match=r"cooldown: expected a fraction in \[0, 1\]"):
        cooldown_factor(0.5, bad)
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=r"cooldown: expected a fraction"):
        inverse_sqrt_scheduler(opt, d_model=64, warmup=5, cooldown=bad)


def test_scheduler_cools_down_with_the_progress_it_is_given():
    """lr = paper formula x linear ramp; the progress survives state_dict (exact resume)."""
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.Adam([p], lr=1.0)
    sched = inverse_sqrt_scheduler(opt, d_model=64, warmup=5, scale=2.0, cooldown=0.5)
    total = 20
    for step in range(1, total + 1):
        spent = (step - 1) / total  # budget spent before this step
        ramp = min(1.0, (1.0 - spent) / 0.5)
        want = paper_lr(step, 64, 5, 2.0) * ramp
        assert opt.param_groups[0]["lr"] == pytest.approx(want, rel=1e-12)
        p.grad = torch.ones(3)
        opt.step()
        set_progress(sched, step / total)
        sched.step()
    # after 20 of 20 steps the budget is spent: the next lr would be 0
    assert opt.param_groups[0]["lr"] == 0.0
    opt2 = torch.optim.Adam([torch.nn.Parameter(torch.zeros(3))], lr=1.0)
    sched2 = inverse_sqrt_scheduler(opt2, d_model=1, warmup=1)
    sched2.load_state_dict(sched.state_dict())
    assert sched2.lr_lambdas[0].progress == 1.0 and sched2.lr_lambdas[0].cooldown == 0.5


def test_scheduler_needs_unit_base_lr():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    with pytest.raises(ValueError, match=r"expected lr=1.0"):
        inverse_sqrt_scheduler(opt, d_model=64, warmup=5)


def test_bad_step():
    with pytest.raises(ValueError, match=r"step: expected an optimizer step >= 1, got 0"):
        inverse_sqrt_lr(0, d_model=64, warmup=10)


def test_optimizer_is_adam_with_paper_betas():
    model = torch.nn.Linear(4, 4)
    opt = build_optimizer(model, OptimConfig())
    assert isinstance(opt, torch.optim.Adam)
    group = opt.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0
    assert group["lr"] == 1.0  # the schedule supplies the value
