"""Language-model data: windows of ``context + 1`` token ids cut from one long text.

A window's first ``context`` ids are the model's input and its last ``context`` ids the
targets, so every window scores ``context`` next-token predictions.

Training (:class:`RandomWindows`): each batch holds ``batch_size`` windows at random offsets
of the training ids. The batches of an epoch form one global sequence, dealt to the ``R``
ranks in turn (rank ``r`` takes global batches ``r, r + R, r + 2R, ...``, as the translation
sampler deals its batches), and the offsets of global batch ``k`` of epoch ``e`` are drawn
from ``numpy.random.default_rng([seed, e, k])``: a pure function of those numbers, touching no
global random state. So a run restarted from a saved position draws the very same windows,
and R processes take exactly the windows one process takes with R-fold gradient
accumulation. An *epoch* is ``len(ids) // (context * batch_size * R)`` batches per rank,
about the training text once over all ranks.

Validation (:func:`eval_windows`): the whole text is scored once, as consecutive
non-overlapping windows: with ``bos`` the sequence ``[bos] + ids`` is cut at ``0, context,
2 context, ...`` into windows of ``context + 1`` ids (the last one shorter), so every id of
the text is predicted exactly once, each from the ids since its window's start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["LMBatch", "RandomWindows", "eval_batches", "eval_windows"]


@dataclass(frozen=True)
class LMBatch:
    """Windows of ``T + 1`` ids, ``(B, T + 1)`` long: inputs ``[:, :-1]``, targets ``[:, 1:]``."""

    ids: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> LMBatch:
        return LMBatch(self.ids.to(device, non_blocking=non_blocking))

    @property
    def inputs(self) -> Tensor:
        return self.ids[:, :-1]  # (B, T)

    @property
    def targets(self) -> Tensor:
        return self.ids[:, 1:]  # (B, T)

    @property
    def num_tokens(self) -> int:
        """Next-token predictions scored: ``B * T``."""
        return self.ids.shape[0] * (self.ids.shape[1] - 1)


def _as_ids(ids: Sequence[int] | Tensor | np.ndarray, name: str) -> Tensor:
    ids = torch.as_tensor(ids)
    if ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(
            f"{name}: expected a 1-D sequence of integer ids, got shape {tuple(ids.shape)} "
            f"dtype {ids.dtype}"
        )
    return ids.long()


class RandomWindows:
    """Training batches of windows at seeded random offsets (module docstring).

    Args:
        ids: The training text's ids, (N,).
        context: Predictions per window (the window holds ``context + 1`` ids).
        batch_size: Windows per batch.
        seed: Seed of the offsets.
        num_shards: Ranks drawing windows (each from its own stream).
        shard_index: This rank.

    Raises:
        ValueError: If the text is shorter than one window, or a size is not positive.
    """

    def __init__(
        self,
        ids: Sequence[int] | Tensor | np.ndarray,
        *,
        context: int,
        batch_size: int,
        seed: int = 0,
        num_shards: int = 1,
        shard_index: int = 0,
    ) -> None:
        self.ids = _as_ids(ids, "ids")
        for name, value in (("context", context), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"shard_index: expected 0 <= shard_index < {num_shards}")
        if len(self.ids) < context + 1:
            raise ValueError(
                f"ids: {len(self.ids)} tokens, fewer than one window of context + 1 = "
                f"{context + 1}; give a longer training text or a shorter context"
            )
        self.context = context
        self.batch_size = batch_size
        self.seed = seed
        self.num_shards = num_shards
        self.shard_index = shard_index
        self._span = torch.arange(context + 1)  # (T + 1,)

    @property
    def batches_per_epoch(self) -> int:
        """This rank's batches in one epoch (about the whole text once over all ranks)."""
        per_batch = self.context * self.batch_size * self.num_shards
        return max(1, len(self.ids) // per_batch)

    def offsets(self, epoch: int, batch: int) -> Tensor:
        """(B,) first positions of the windows of this rank's ``batch`` of ``epoch``: global
        batch ``batch * num_shards + shard_index`` (module docstring)."""
        index = batch * self.num_shards + self.shard_index
        rng = np.random.default_rng([self.seed, epoch, index])
        starts = rng.integers(0, len(self.ids) - self.context, size=self.batch_size)
        return torch.from_numpy(starts)

    def batch(self, epoch: int, batch: int) -> LMBatch:
        """Batch ``batch`` of ``epoch``: (B, context + 1) ids."""
        index = self.offsets(epoch, batch)[:, None] + self._span  # (B, T + 1)
        return LMBatch(self.ids[index])


def eval_windows(
    ids: Sequence[int] | Tensor | np.ndarray, context: int, bos: int | None = None
) -> list[Tensor]:
    """Consecutive non-overlapping windows of ``[bos] + ids`` (module docstring): each (<=
    context + 1,) and predicting ``len(ids)`` ids in all (``len(ids) - 1`` without ``bos``).
    """
    ids = _as_ids(ids, "ids")
    if bos is not None:
        ids = torch.cat([torch.tensor([bos], dtype=torch.long), ids])
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"context: expected a positive integer, got {context!r}")
    return [ids[start : start + context + 1] for start in range(0, len(ids) - 1, context)]


def eval_batches(
    ids: Sequence[int] | Tensor | np.ndarray,
    context: int,
    batch_size: int,
    bos: int | None = None,
) -> list[LMBatch]:
    """:func:`eval_windows` stacked ``batch_size`` at a time; a last, shorter window is a
    batch of its own."""
    windows = eval_windows(ids, context, bos)
    full = [w for w in windows if len(w) == context + 1]
    batches = [
        LMBatch(torch.stack(full[i : i + batch_size])) for i in range(0, len(full), batch_size)
    ]
    batches += [LMBatch(w[None]) for w in windows if len(w) != context + 1]
    return batches
