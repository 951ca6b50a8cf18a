"""Token-budget batches from a length-bucketed, shuffled, resumable order.

A pair's length is what the model sees: ``len(src) + 1`` for the encoder input (eos
appended) and ``len(tgt) + 1`` for the decoder input and output (bos prepended, eos
appended), so a pair costs ``max(len(src), len(tgt)) + 1`` positions. A batch of ``B``
pairs whose longest pair costs ``L`` is padded to ``B * L`` tokens, and that product is
kept at or below ``max_tokens``.

Per epoch, the order is a pure function of ``(seed, epoch)``:

1. shuffle the kept pairs, then stable-sort them by length (random ties);
2. cut the sorted list greedily into batches of at most ``max_tokens`` padded tokens;
3. shuffle the batches;
4. deal batch ``i`` to shard ``i % num_shards``.

Step 2 depends only on the sorted lengths, so every epoch has the same number and sizes
of batches; only their contents and order change. A resumed run calls
``set_epoch(epoch, skip_batches=n)`` and continues with exactly the batches it would have
seen.

Typical use::

    sampler = TokenBatchSampler(pairs, max_tokens=4096, max_len=128, seed=0)
    loader = DataLoader(pairs, batch_sampler=sampler,
                        collate_fn=Collator.for_tokenizer(tokenizer))
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch, skip_batches=step_in_epoch if epoch == start_epoch else 0)
        for batch in loader: ...
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

logger = logging.getLogger(__name__)


def _check_int(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")


def pair_length(src_ids: Sequence[int], tgt_ids: Sequence[int]) -> int:
    """Positions a pair occupies in a padded batch: ``max(len(src), len(tgt)) + 1``."""
    return max(len(src_ids), len(tgt_ids)) + 1


class NoPairFitsError(ValueError):
    """No pair is short enough for ``max_len`` (:class:`TokenBatchSampler`)."""


class TokenBatchSampler(Sampler[list[int]]):
    """Yields lists of pair indices, each batch within a padded-token budget.

    Args:
        pairs: Encoded pairs ``(src_ids, tgt_ids)`` without bos/eos; only lengths are read.
        max_tokens: Budget per batch: ``batch size * longest pair length``.
        max_len: Longest pair length (see `pair_length`) the model accepts; longer pairs
            are skipped, counted in `num_skipped` and logged.
        seed: Base seed; each epoch's order is derived from ``(seed, epoch)``.
        shuffle: If False, batches come in ascending length order, pairs in index order
            among equal lengths (for evaluation).
        num_shards: Number of distributed ranks sharing the batches.
        shard_index: This rank, in ``[0, num_shards)``.
        drop_last: When the batch count is not a multiple of ``num_shards``, drop the last
            (shuffled) batches if True; otherwise repeat the first ones so every shard gets
            the same count.

    Attributes:
        num_skipped: Pairs longer than ``max_len``.
        skipped_indices: Their indices in ``pairs``.
        batches_per_shard: Batches this shard gets in a full epoch.

    Raises:
        ValueError: On a non-positive budget, ``max_tokens < max_len``, a bad shard
            setting, or when no pair fits ``max_len``.
    """

    def __init__(
        self,
        pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        max_tokens: int,
        max_len: int,
        seed: int = 0,
        shuffle: bool = True,
        num_shards: int = 1,
        shard_index: int = 0,
        drop_last: bool = False,
    ) -> None:
        _check_int("max_len", max_len, 1)
        _check_int("max_tokens", max_tokens, 1)
        if max_tokens < max_len:
            raise ValueError(
                f"max_tokens={max_tokens} must be >= max_len={max_len}, "
                f"else a pair of length max_len fits in no batch"
            )
        _check_int("seed", seed, 0)
        _check_int("num_shards", num_shards, 1)
        _check_int("shard_index", shard_index, 0)
        if shard_index >= num_shards:
            raise ValueError(f"shard_index={shard_index} must be < num_shards={num_shards}")

        lengths = np.fromiter((pair_length(s, t) for s, t in pairs), dtype=np.int64)
        keep = lengths <= max_len
        self.skipped_indices: list[int] = np.flatnonzero(~keep).tolist()
        self.num_skipped = len(self.skipped_indices)
        if self.num_skipped:
            logger.warning(
                "skipped %d of %d pairs longer than max_len=%d tokens",
                self.num_skipped,
                len(lengths),
                max_len,
            )
        if not keep.any():
            raise NoPairFitsError(f"pairs: none of the {len(lengths)} pairs fits max_len={max_len}")
        self._indices = np.flatnonzero(keep)  # (N,) indices into pairs
        self._lengths = lengths[keep]  # (N,)
        self._batch_sizes = self._pack(np.sort(self._lengths), max_tokens)
        num_batches = len(self._batch_sizes)
        if drop_last and num_batches < num_shards:
            raise ValueError(
                f"drop_last=True with num_shards={num_shards} but there are only "
                f"{num_batches} batches; expected at least one batch per shard"
            )

        self.max_tokens = int(max_tokens)
        self.max_len = int(max_len)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.num_shards = int(num_shards)
        self.shard_index = int(shard_index)
        self.drop_last = drop_last
        rounding = math.floor if drop_last else math.ceil
        self.batches_per_shard = rounding(num_batches / num_shards)
        self.epoch = 0
        self.skip_batches = 0

    @staticmethod
    def _pack(sorted_lengths: np.ndarray, max_tokens: int) -> list[int]:
        """Greedy batch sizes over ascending lengths: the newest pair is the longest."""
        sizes = []
        size = 0
        for length in sorted_lengths.tolist():
            if (size + 1) * length > max_tokens:
                sizes.append(size)
                size = 0
            size += 1
        sizes.append(size)
        return sizes

    @property
    def num_pairs(self) -> int:
        """Pairs kept (not longer than ``max_len``)."""
        return len(self._indices)

    def set_epoch(self, epoch: int, *, skip_batches: int = 0) -> None:
        """Selects the epoch whose order the next iteration yields.

        Args:
            epoch: Epoch number, >= 0.
            skip_batches: Leave out this shard's first ``skip_batches`` batches of the epoch
                (to resume mid-epoch); applies to this epoch only.

        Raises:
            ValueError: If ``epoch`` is negative or ``skip_batches`` is outside
                ``[0, batches_per_shard]``.
        """
        _check_int("epoch", epoch, 0)
        _check_int("skip_batches", skip_batches, 0)
        if skip_batches > self.batches_per_shard:
            raise ValueError(
                f"skip_batches={skip_batches} must be <= batches_per_shard={self.batches_per_shard}"
            )
        self.epoch = int(epoch)
        self.skip_batches = int(skip_batches)

    def _epoch_batches(self) -> list[np.ndarray]:
        """All shards' batches of the current epoch, in order, before sharding."""
        if self.shuffle:
            rng = np.random.default_rng([self.seed, self.epoch])
            order = rng.permutation(self.num_pairs)
            order = order[np.argsort(self._lengths[order], kind="stable")]
        else:
            order = np.argsort(self._lengths, kind="stable")
        bounds = np.cumsum(self._batch_sizes)[:-1]
        batches = np.split(self._indices[order], bounds)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._epoch_batches()
        total = self.batches_per_shard * self.num_shards
        # Padding repeats batches from the start of the (shuffled) order, cyclically.
        positions = range(self.shard_index, total, self.num_shards)
        for position in list(positions)[self.skip_batches :]:
            yield batches[position % len(batches)].tolist()

    def __len__(self) -> int:
        """Batches the next iteration yields (after ``skip_batches``)."""
        return self.batches_per_shard - self.skip_batches
