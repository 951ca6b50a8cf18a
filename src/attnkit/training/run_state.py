"""Where a run is: the :class:`RunState` in every checkpoint's ``state.json``, and the random
streams every rank saves in ``last/resume.pt``.

Together with the optimizer, schedule and grad-scaler states these are everything that
decides what a run does next, so a resumed run continues with the very batches, dropout masks
and learning rates the uninterrupted run would have used.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnkit.training.distributed import DistInfo, gather_objects

logger = logging.getLogger(__name__)


@dataclass
class RunState:
    """Where a run is; saved in ``state.json`` of every checkpoint (key ``"run"``)."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # current epoch (0-based)
    batch_in_epoch: int = 0  # this rank's batches of `epoch` already consumed
    elapsed_sec: float = 0.0  # wall time of the run, earlier sessions included
    target_tokens: int = 0  # tokens the loss was computed on, all ranks
    best_metric: str = ""  # name of the metric selecting `best`
    best_value: float | None = None
    best_step: int = 0
    bad_evals: int = 0  # evaluations since the last new best
    last_eval_step: int = -1
    metrics: dict[str, float] = field(default_factory=dict)  # latest evaluation

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> RunState:
        """The state from a ``state.json``'s ``"run"`` mapping (unknown keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in names})


def capture_rng() -> dict[str, Any]:
    """This process's torch, Python, NumPy (and CUDA) random states, as plain data."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Sets the random states :func:`capture_rng` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def record_eval(state: RunState, name: str, value: float, higher_is_better: bool) -> bool:
    """Counts an evaluation of metric ``name`` in ``state``; True if it is a new best.

    A new metric name (``optim.best_metric = "auto"`` switching to ``val_bleu``) starts over.
    """
    s = state
    better = (
        s.best_value is None
        or s.best_metric != name
        or (value > s.best_value if higher_is_better else value < s.best_value)
    )
    if better:
        s.best_metric, s.best_value, s.best_step, s.bad_evals = name, value, s.step, 0
    else:
        s.bad_evals += 1
    return better


def resume_states(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    info: DistInfo,
) -> dict[str, Any]:
    """What ``resume.pt`` holds: optimizer, schedule and scaler states and every rank's random
    states (a collective: every rank must call it)."""
    return {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": gather_objects(capture_rng(), info),
    }


def _keep_configured_schedule(
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    configured: list[dict[str, Any]],
    progress: float | None,
) -> None:
    """Puts the configured schedule settings back after ``scheduler.load_state_dict`` (which
    wrote the saved ones into the same factor objects) and, if a setting differs, sets each
    group's learning rate for the next step from them (at ``progress``, when given)."""
    changed = False
    for factor, settings in zip(scheduler.lr_lambdas, configured, strict=True):
        saved_progress = getattr(factor, "progress", 0.0)
        if vars(factor) != {**settings, "progress": saved_progress}:
            changed = True
            vars(factor).clear()
            vars(factor).update(settings, progress=saved_progress if progress is None else progress)
    if changed:
        groups = scheduler.optimizer.param_groups
        for group, base, factor in zip(
            groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
        ):
            group["lr"] = base * factor(scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in groups]
        logger.info("schedule: the resumed config's settings from this step on")


def load_resume_states(
    saved: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    info: DistInfo,
    *,
    progress: float | None = None,
) -> None:
    """Restores what :func:`resume_states` saved; this rank takes its own random states.

    The schedule's settings are the resumed config's, not the saved ones (``--resume --set
    optim.lr_scale=...`` lowers the learning rate from the next step on); where the schedule
    is (its step count, and its budget progress) comes from the checkpoint. When the settings
    are unchanged nothing is recomputed, so the resume stays bit-exact; when they changed,
    ``progress`` (the budget spent, as the trainer computes it each step) replaces the saved
    one, which a schedule that did not track it (no cooldown) saved as 0.
    """
    optimizer.load_state_dict(saved["optimizer"])
    configured = [dataclasses.asdict(f) for f in scheduler.lr_lambdas]  # from the new config
    scheduler.load_state_dict(saved["scheduler"])  # LambdaLR restores the saved fields too
    _keep_configured_schedule(scheduler, configured, progress)
    scaler.load_state_dict(saved["scaler"])
    ranks = saved["rng"]
    if len(ranks) != info.world_size:
        logger.warning(
            "checkpoint was written by %d process(es), now %d: random streams differ",
            len(ranks),
            info.world_size,
        )
    restore_rng(ranks[info.rank % len(ranks)])
