"""What a training task supplies to the shared training loop.

The :class:`~attnkit.training.Trainer` owns everything a task does not: the process group,
optimizer, schedule, autocast, gradient accumulation, DDP, logging, checkpoints, budgets and
exact resume. A *task* owns the data, the loss and the evaluation. Translation
(:class:`~attnkit.training.translation.TranslationTask`) is the first task, language modelling
(:class:`~attnkit.training.lm.LMTask`) the second; the config's ``task`` picks one
(:func:`~attnkit.training.trainer.default_task`). Each implements these methods:

``check_data(config)`` (optional)
    Check what can be checked of the data before the run folder is touched, such as that
    the files the config names can be opened; raise ``ValueError`` naming the config key.
``prepare(run) -> TrainConfig``
    Load the data and the tokenizer: on a new run rank 0 trains it and saves it as
    ``run.out_dir / "tokenizer.json"`` (inside :func:`~attnkit.training.distributed.raise_together`
    so that a failure stops every rank); on a resume it comes from ``run.resume_from``. Keep it
    as ``self.tokenizer`` (saved with every checkpoint). Return the config with the fields the
    tokenizer decides (vocabulary size, pad id) filled in.
``build_model(config) -> nn.Module``
    A new model (the trainer seeds the RNG first, so every rank builds the same weights).
``loss_module(model) -> nn.Module``
    Model and loss as one module, so that DDP (and ``torch.compile``) see one call:
    ``loss_module(*loss_args(batch), epsilon)`` returns the loss *summed* over the batch's
    ``batch_tokens(batch)`` scored tokens (``epsilon`` = label smoothing; 0 for evaluation).
``loss_args(batch) -> tuple[Tensor, ...]`` and ``batch_tokens(batch) -> int``
    The tensors ``loss_module`` takes, and the number of tokens the loss sums over (the trainer
    divides by that number summed over the micro-batches and ranks of a step).
``batches_per_epoch`` (int)
    This rank's batches in one epoch (for ``max_epochs``, the cooldown and the progress bar).
``train_batches(start: DataPosition) -> Iterator[tuple[batch, DataPosition]]``
    This rank's training batches from ``start`` on, endlessly, each with the position *after*
    it. The order must be a pure function of the config, the rank and the position (its own
    seeded generator, never the global RNG), so that restarting from a saved position gives
    the very same batches. A batch has ``.to(device, non_blocking=...)``.
``evaluate(run, model, loss_module) -> dict[str, float]``
    Validation metrics, the same on every rank; always ``"val_loss"`` (per scored token).
    :func:`sharded_loss_sum` and :func:`on_main_rank` do the collective parts.
``has_validation`` (bool), ``higher_is_better`` (metric name -> bool)
    Whether there is anything to evaluate, and which way each metric improves (for ``best``
    and ``optim.patience``).
``checkpoint_state(position) -> dict`` and ``check_resumed(saved_state)``
    Extra JSON for ``state.json`` (e.g. the sampler's seed and sharding), and a look at it when
    resuming (warn if the data order can no longer match).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnkit.training.config import TrainConfig
from attnkit.training.distributed import DistInfo, all_reduce_sum, broadcast_object
from attnkit.training.precision import autocast_context

logger = logging.getLogger(__name__)

EvalHook = Callable[[nn.Module], dict[str, float]]
"""Called with the (eval-mode) model on rank 0 at each evaluation; returns extra metrics such
as ``{"val_bleu": 38.2}`` that are logged with ``val_loss`` and may select ``best``."""


@dataclass(frozen=True)
class DataPosition:
    """How far into the training data a rank is: ``batch`` batches of ``epoch`` consumed."""

    epoch: int
    batch: int
    batches_per_epoch: int

    @property
    def epochs_done(self) -> int:
        """Complete epochs (the current one counts once all its batches are consumed)."""
        return self.epoch + (self.batch >= self.batches_per_epoch)

    @property
    def epoch_float(self) -> float:
        """Epochs as a fraction, e.g. 2.25."""
        return self.epoch + self.batch / self.batches_per_epoch


@dataclass(frozen=True)
class RunContext:
    """What a task may know of the run: config, process, folders and precision."""

    config: TrainConfig
    info: DistInfo
    out_dir: Path
    resume_from: Path | None  # the `last` checkpoint a resumed run starts from
    autocast_dtype: torch.dtype | None

    @property
    def device(self) -> torch.device:
        return self.info.device

    @property
    def reduce_device(self) -> torch.device:
        """Where collectives run: the GPU for nccl, else the CPU (gloo)."""
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def autocast(self):
        """The run's autocast context (a no-op in float32)."""
        return autocast_context(self.device, self.autocast_dtype)


class Task(ABC):
    """A training task; see the module docstring for the contract."""

    higher_is_better: ClassVar[dict[str, bool]] = {"val_loss": False}
    tokenizer: Any = None

    def check_data(self, config: TrainConfig) -> None:  # noqa: B027 - optional
        """Checks the data ``config`` names before the run folder is touched (default:
        nothing to check)."""

    @abstractmethod
    def prepare(self, run: RunContext) -> TrainConfig: ...

    @abstractmethod
    def build_model(self, config: TrainConfig) -> nn.Module: ...

    @abstractmethod
    def loss_module(self, model: nn.Module) -> nn.Module: ...

    @abstractmethod
    def loss_args(self, batch: Any) -> tuple[Tensor, ...]: ...

    @abstractmethod
    def batch_tokens(self, batch: Any) -> int: ...

    @property
    @abstractmethod
    def batches_per_epoch(self) -> int: ...

    @property
    @abstractmethod
    def has_validation(self) -> bool: ...

    @abstractmethod
    def train_batches(self, start: DataPosition) -> Iterator[tuple[Any, DataPosition]]: ...

    @abstractmethod
    def evaluate(
        self, run: RunContext, model: nn.Module, loss_module: nn.Module
    ) -> dict[str, float]: ...

    def checkpoint_state(self, position: DataPosition) -> dict[str, Any]:
        """Extra top-level keys for ``state.json`` at data position ``position``."""
        return {}

    def check_resumed(self, saved_state: dict[str, Any]) -> None:  # noqa: B027 - optional
        """Looks at the ``state.json`` a resumed run starts from (default: nothing to check)."""


def order_state(
    name: str, seed: int, num_shards: int, position: DataPosition, batch_key: str = "batch"
) -> dict[str, Any]:
    """``{name: {seed, epoch, <batch_key>, num_shards}}``: where a seeded data order stands,
    for :meth:`Task.checkpoint_state`."""
    return {
        name: {
            "seed": seed,
            "epoch": position.epoch,
            batch_key: position.batch,
            "num_shards": num_shards,
        }
    }


def warn_if_order_changed(
    saved_state: dict[str, Any], name: str, seed: int, num_shards: int, what: str
) -> None:
    """For :meth:`Task.check_resumed`: a warning if the saved ``name`` order had another seed
    or sharding, naming ``what`` (e.g. "the windows") whose order can no longer match the saved run."""
    saved = saved_state.get(name, {})
    if (saved.get("num_shards"), saved.get("seed")) != (num_shards, seed):
        logger.warning(
            "data sharding or seed changed since the checkpoint (%s): the data order differs", what
        )


@torch.no_grad()
def sharded_loss_sum(
    run: RunContext,
    task: Task,
    loss_module: nn.Module,
    num_batches: int,
    make_batch: Callable[[int], Any],
) -> tuple[float, float]:
    """Unsmoothed loss and scored tokens summed over batches ``make_batch(0 .. num_batches-1)``,
    all ranks together.

    Rank ``r`` makes and scores batches ``r, r + world_size, ...``; one all-reduce adds the
    sums up, so every rank returns the same two numbers.
    """
    info = run.info
    sums = torch.zeros(2, dtype=torch.float64, device=run.device)
    for i in range(info.rank, num_batches, info.world_size):
        batch = make_batch(i).to(run.device)
        with run.autocast():
            loss = loss_module(*task.loss_args(batch), 0.0)
        sums[0] += loss.to(torch.float64)
        sums[1] += task.batch_tokens(batch)
    sums = all_reduce_sum(sums.to(run.reduce_device), info).cpu()
    return float(sums[0]), float(sums[1])


def on_main_rank(run: RunContext, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()`` run on rank 0 under the run's autocast, its result sent to every rank."""
    result: dict[str, Any] = {}
    if run.info.is_main:
        with run.autocast():
            result = dict(fn())
    return broadcast_object(result, run.info)
