"""The run's records: ``metrics.jsonl`` (one JSON object a line) and ``train.log``."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnkit.files import write_text
from attnkit.training.distributed import DistInfo, all_reduce_sum

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class MetricsLog:
    """Appends records to ``metrics.jsonl``; a no-op on ranks other than 0.

    Args:
        path: The JSONL file.
        enabled: Write at all (False on ranks other than 0).
    """

    def __init__(self, path: str | os.PathLike[str], *, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled

    def truncate_after(self, step: int) -> None:
        """Drops records after ``step``: a resumed run writes them again."""
        if not (self.enabled and self.path.is_file()):
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
            if record.get("step", 0) <= step:
                kept.append(line + "\n")
        write_text(self.path, "".join(kept))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: _json_number(v) for k, v in record.items()}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(clean) + "\n")


class TrainMeter:
    """Training loss per token and tokens per second over the steps since the last record,
    and the first step whose loss was not finite.

    Args:
        now: The time source, in seconds.
    """

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self.lr = 0.0  # the learning rate of the latest step, set by the trainer
        # The first step with a NaN or infinite loss (inf: none), a float64 tensor on the
        # loss's device: kept there, so that no step waits for the device to tell it.
        self.first_nonfinite: Tensor | None = None
        self.reset()

    def reset(self) -> None:
        self.loss_sum: Tensor | float = 0.0  # stays on the device: no sync per step
        self.tokens = 0
        # Tokens of steps trained before a resume, in loss_sum (carry) but not in the time.
        self.carried_tokens = 0
        self.start = self.now()
        self.paused = 0.0

    def add(self, loss_sum: Tensor, tokens: int, step: int) -> None:
        """One micro-batch of optimizer step ``step``: its summed loss and this rank's scored
        tokens."""
        loss = loss_sum.detach().to(torch.float64)
        self.loss_sum = self.loss_sum + loss
        self.tokens += tokens
        first = self.first_nonfinite
        if first is None:
            first = self.first_nonfinite = torch.full(
                (), math.inf, dtype=loss.dtype, device=loss.device
            )
        # Python scalars are kernel arguments: no host-to-device copy, no sync.
        self.first_nonfinite = torch.where(torch.isfinite(loss), first, first.clamp(max=step))

    def pause(self, seconds: float) -> None:
        """Time spent on other things (evaluation, checkpoints), left out of the throughput."""
        self.paused += seconds

    def summary(self, info: DistInfo, reduce_device: torch.device) -> tuple[float, float]:
        """``(train_loss, tokens_per_sec)`` over all ranks since the last reset (the loss also
        over the steps :meth:`carry` took over); then resets."""
        counts = [float(self.loss_sum), float(self.tokens + self.carried_tokens), self.tokens]
        sums = torch.tensor(counts, dtype=torch.float64)
        sums = all_reduce_sum(sums.to(reduce_device), info).cpu()
        seconds = max(self.now() - self.start - self.paused, 1e-9)
        loss = float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")
        self.reset()
        return loss, float(sums[2]) / seconds

    def pending(self, info: DistInfo, reduce_device: torch.device) -> dict[str, float | int]:
        """The summed loss and tokens of all ranks since the last record (a collective): what
        a checkpoint keeps, so that a run resumed from it records the same training loss as
        one never stopped (its next record averages over the same steps)."""
        counts = [float(self.loss_sum), float(self.tokens + self.carried_tokens)]
        sums = all_reduce_sum(torch.tensor(counts, dtype=torch.float64).to(reduce_device), info)
        return {"loss_sum": float(sums[0]), "tokens": int(sums[1])}

    def carry(self, pending: Any, info: DistInfo) -> None:
        """Take over what :meth:`pending` saved (on rank 0: the sums are all ranks'). Not a
        dict of a number and an integer (a checkpoint from before it was saved): nothing."""
        if not isinstance(pending, dict):
            return
        loss, tokens = pending.get("loss_sum"), pending.get("tokens")
        usable = (
            isinstance(loss, float)
            and math.isfinite(loss)
            and isinstance(tokens, int)
            and not isinstance(tokens, bool)
            and tokens >= 0
        )
        if usable and info.rank == 0:
            self.loss_sum, self.carried_tokens = loss, tokens


def format_metric(value: float) -> str:
    """A metric as the log shows it: 4 decimals, or 4 digits in scientific notation from a
    million on (a diverged run's perplexity, exp(700), took 305 digits with 4 decimals)."""
    return f"{value:.4f}" if abs(value) < 1e6 else f"{value:.3e}"


def _json_number(value: Any) -> Any:
    # JSON has no NaN/inf: write them as null rather than produce an invalid file.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` file (one JSON object a line; blank lines skipped,
    and a last line cut short by a kill, which has no newline, as a resumed run drops it).

    Raises:
        ValueError: naming the file (and the line), for bytes that are not UTF-8 or a line
            that is not a JSON object.
    """
    name = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{name!r}: not UTF-8 text (byte {err.start}): not a metrics.jsonl"
        ) from None
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines) and not text.endswith("\n"):  # cut short by a kill
                break
            raise ValueError(f"{name!r}: line {number}: not JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{name!r}: line {number}: expected a JSON object, got {line[:40]!r}")
        records.append(record)
    return records


def add_file_handler(path: str | os.PathLike[str]) -> logging.Handler:
    """Copies attnkit's log records (INFO and above) into ``path``; returns the handler."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.setLevel(logging.INFO)
    root = logging.getLogger("attnkit")
    root.addHandler(handler)
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    return handler
