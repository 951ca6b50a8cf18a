"""When a run stops, and how much of its budget it has spent.

A run has up to three fixed budgets, ``optim.max_steps``, ``optim.max_epochs`` and
``optim.max_minutes`` (0 = none), and ``optim.patience`` (evaluations without a new best,
kept by the trainer). The first budget spent stops the run; the final evaluation and the
``last`` checkpoint follow.

Time is decided *before* a step: a step is taken only when the time spent plus the duration
of the previous step still fits in ``max_minutes``, so a run does not overshoot its time by a
step. (The estimate is the previous step's duration; the first step of a session is taken
while any time is left.) Every rank decides with its own clock and the ranks stop together
when any of them is out of time (the trainer sums the votes in its per-step all-reduce).

With ``optim.cooldown`` the schedule needs the fraction of the budget spent,
:meth:`Budget.progress`: the largest over the fixed budgets that are set.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from attnkit.training.config import OptimConfig

Clock = Callable[[], float]
"""Seconds from an arbitrary origin, like :func:`time.perf_counter` (tests inject their own)."""


class RunClock:
    """Wall time of a run, earlier sessions included.

    Args:
        before: Seconds spent by earlier sessions (from the checkpoint).
        clock: The time source.
    """

    def __init__(self, before: float = 0.0, clock: Clock = time.perf_counter) -> None:
        self.clock = clock
        self.before = float(before)
        self.start = clock()
        self.last_step_sec = 0.0  # duration of the latest step; 0 before the first

    def now(self) -> float:
        """The time source's current reading."""
        return self.clock()

    def elapsed(self) -> float:
        """Seconds of this run so far."""
        return self.before + self.clock() - self.start

    def step_done(self, started: float) -> None:
        """Records the duration of a step that began at ``elapsed() == started``."""
        self.last_step_sec = self.elapsed() - started


class Budget:
    """The fixed budgets of ``optim`` for a task with ``batches_per_epoch`` batches per epoch.

    Args:
        optim: The ``[optim]`` config.
        batches_per_epoch: This rank's batches in one epoch.
    """

    def __init__(self, optim: OptimConfig, batches_per_epoch: int) -> None:
        if batches_per_epoch < 1:
            raise ValueError(f"batches_per_epoch: expected >= 1, got {batches_per_epoch}")
        self.optim = optim
        self.batches_per_epoch = batches_per_epoch

    @property
    def seconds(self) -> float | None:
        """The time budget in seconds, or None."""
        return 60.0 * self.optim.max_minutes if self.optim.max_minutes else None

    def total_steps(self) -> int | None:
        """Optimizer steps the step and epoch budgets allow (the smaller), or None."""
        o = self.optim
        totals = []
        if o.max_steps:
            totals.append(o.max_steps)
        if o.max_epochs:
            totals.append(math.ceil(o.max_epochs * self.batches_per_epoch / o.accumulation))
        return min(totals) if totals else None

    def stop_reason(self, step: int, epochs_done: int) -> str:
        """``"max_steps"`` or ``"max_epochs"`` once that budget is spent, else ``""``."""
        o = self.optim
        if o.max_steps and step >= o.max_steps:
            return "max_steps"
        if o.max_epochs and epochs_done >= o.max_epochs:
            return "max_epochs"
        return ""

    def out_of_time(self, elapsed_sec: float, next_step_sec: float) -> bool:
        """True when a step of ``next_step_sec`` started at ``elapsed_sec`` would end past
        ``max_minutes`` (or the time is already spent)."""
        limit = self.seconds
        if limit is None:
            return False
        return elapsed_sec >= limit or elapsed_sec + next_step_sec > limit

    def progress(self, step: int, elapsed_sec: float) -> float:
        """Fraction of the budget spent after ``step`` steps and ``elapsed_sec`` seconds: the
        largest over the budgets that are set; may pass 1, which ``cooldown_factor`` clamps."""
        fractions = []
        total_steps = self.total_steps()
        if total_steps:
            fractions.append(step / total_steps)
        if self.seconds:
            fractions.append(elapsed_sec / self.seconds)
        return max(fractions, default=0.0)

    def minutes_left(self, elapsed_sec: float) -> float | None:
        """Minutes of the time budget left (>= 0), or None without one."""
        if self.seconds is None:
            return None
        return max(self.seconds - elapsed_sec, 0.0) / 60.0
