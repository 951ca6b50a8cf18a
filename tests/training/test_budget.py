"""Budgets: when a run stops, the time decided before a step with an injected clock."""

from __future__ import annotations

import pytest
import torch

from attnkit.training.budget import Budget, RunClock
from attnkit.training.config import OptimConfig
from attnkit.training.metrics_log import read_metrics
from attnkit.training.trainer import Trainer, train
from tests.helpers.training import fast_config, weights


def budget(batches_per_epoch: int = 10, **optim) -> Budget:
    return Budget(OptimConfig(**optim), batches_per_epoch)


@pytest.mark.parametrize(
    "elapsed,next_step,expected",
    [
        (0.0, 0.0, False),  # first step of a session: taken while time is left
        (59.0, 0.0, False),
        (60.0, 0.0, True),  # the time is spent
        (50.0, 10.0, False),  # ends exactly at the limit
        (50.1, 10.0, True),  # would end past it: not started
        (30.0, 45.0, True),
        (61.0, 0.0, True),
    ],
)
def test_a_step_starts_only_if_it_should_end_in_time(elapsed, next_step, expected):
    assert budget(max_minutes=1.0).out_of_time(elapsed, next_step) is expected


def test_no_time_budget_never_runs_out():
    assert not budget(max_steps=5).out_of_time(1e12, 1e12)
    assert budget(max_steps=5).minutes_left(10.0) is None
    assert budget(max_minutes=2.0).minutes_left(30.0) == 1.5
    assert budget(max_minutes=2.0).minutes_left(500.0) == 0.0


def test_step_and_epoch_budgets():
    b = budget(batches_per_epoch=10, max_steps=7, max_epochs=2, accumulation=3)
    assert b.total_steps() == 7  # min(7, ceil(2 * 10 / 3) = 7)
    assert budget(batches_per_epoch=10, max_epochs=2, accumulation=3).total_steps() == 7
    assert budget(batches_per_epoch=10, max_epochs=3, accumulation=4).total_steps() == 8
    assert budget(max_minutes=3.0).total_steps() is None
    assert b.stop_reason(6, 1) == ""
    assert b.stop_reason(7, 1) == "max_steps"
    assert budget(max_epochs=2).stop_reason(100, 2) == "max_epochs"
    assert budget(max_epochs=2).stop_reason(100, 1) == ""


def test_progress_is_the_largest_fraction_spent():
    b = budget(batches_per_epoch=10, max_steps=100, max_minutes=10.0)
    assert b.progress(25, 60.0) == 0.25  # steps 25 %, time 10 %
    assert b.progress(10, 300.0) == 0.5  # time 50 %
    assert budget(patience=3).progress(50, 1e6) == 0.0  # no fixed budget


def test_budget_needs_batches():
    with pytest.raises(ValueError, match=r"batches_per_epoch: expected >= 1, got 0"):
        budget(batches_per_epoch=0)


def test_run_clock_counts_earlier_sessions_and_steps():
    now = [100.0]
    clock = RunClock(before=30.0, clock=lambda: now[0])
    assert clock.elapsed() == 30.0 and clock.last_step_sec == 0.0
    start = clock.elapsed()
    now[0] = 104.5
    clock.step_done(start)
    assert clock.elapsed() == 34.5 and clock.last_step_sec == 4.5


class StepClock:
    """A fake clock for which every optimizer step takes ``step_sec`` seconds and everything
    else (evaluation, checkpoints) no time."""

    def __init__(self, step_sec: float) -> None:
        self.step_sec = step_sec
        self.trainer: Trainer | None = None

    def __call__(self) -> float:
        return self.step_sec * (self.trainer.state.step if self.trainer else 0)


def timed_trainer(path, minutes: float, step_sec: float, *extra: str, resume: bool = False):
    clock = StepClock(step_sec)
    config = fast_config(f"optim.max_minutes={minutes}", "optim.eval_every=4", *extra)
    trainer = Trainer(config, path, resume=resume, progress=False, clock=clock)
    clock.trainer = trainer
    return trainer


@pytest.mark.parametrize(
    "minutes,steps",
    [
        (1.0, 6),  # 6 steps of 10 s end exactly at 60 s; a 7th would end at 70 s
        (0.95, 5),  # 57 s: the 6th step would end at 60 s (the old check took it)
        (0.1, 1),  # 6 s: the first step is taken (no estimate yet), then no more
        (0.5, 3),
    ],
)
def test_max_minutes_is_not_overshot(tmp_path, minutes, steps):
    result = timed_trainer(tmp_path, minutes, 10.0).fit()
    assert result.stop_reason == "max_minutes" and result.step == steps
    records = read_metrics(tmp_path / "metrics.jsonl")
    elapsed = max(r["elapsed_sec"] for r in records)
    assert elapsed == 10.0 * steps
    assert elapsed <= 60.0 * minutes or steps == 1
    assert elapsed + 10.0 > 60.0 * minutes  # no room was left for another step


def test_resume_after_a_time_stop_reads_the_batches_it_did_not_train_on(tmp_path):
    """The batches drawn for the step that was not taken go back to the data: stopping on
    time at step 5 and resuming to 12 gives the weights of 12 steps in one go."""
    extra = ["optim.accumulation=2", "data.copy_train_pairs=60"]
    first = timed_trainer(tmp_path / "part", 0.95, 10.0, *extra).fit()
    assert first.stop_reason == "max_minutes" and first.step == 5
    resumed = train(
        fast_config("optim.max_steps=12", "optim.eval_every=4", *extra),
        tmp_path / "part",
        resume=True,
        progress=False,
    )
    full = train(
        fast_config("optim.max_steps=12", "optim.eval_every=4", *extra),
        tmp_path / "full",
        progress=False,
    )
    assert resumed.step == full.step == 12 and resumed.epoch == full.epoch
    a, b = weights(tmp_path / "full"), weights(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)
