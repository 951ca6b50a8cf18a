"""Padded tensors for one batch of encoded pairs (teacher forcing layout).

For a pair ``(src, tgt)`` without specials::

    src     = src + [eos]          encoder input          (B, S)
    tgt_in  = [bos] + tgt          decoder input          (B, T)
    tgt_out = tgt + [eos]          decoder target         (B, T)

each right-padded with ``pad_id``. ``num_tgt_tokens`` counts the non-pad entries of
``tgt_out``, the denominator of a per-token loss.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace

import torch

from attnkit.data.batching import TokenBatchSampler


@dataclass(frozen=True, eq=False)  # eq on tensors would be ambiguous
class Batch:
    """One padded batch.

    Attributes:
        src: Encoder input ids, eos appended, (B, S) int64.
        tgt_in: Decoder input ids, bos prepended, (B, T) int64.
        tgt_out: Decoder target ids, eos appended, (B, T) int64.
        num_src_tokens: Non-pad entries of ``src``.
        num_tgt_tokens: Non-pad entries of ``tgt_out``, for loss normalisation.
        pad_id: The padding id.
        indices: Index of each row's pair in the dataset, (B,) int64, or None when the
            collator was not given them.

    Masks are not stored: build them from the ids with
    ``attnkit.attention.padding_mask(batch.src, batch.pad_id)``.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    num_src_tokens: int
    num_tgt_tokens: int
    pad_id: int
    indices: torch.Tensor | None = None

    @property
    def size(self) -> int:
        """Number of pairs B."""
        return self.src.shape[0]

    def _map_tensors(self, fn) -> Batch:
        changes = {
            f.name: fn(getattr(self, f.name))
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **changes)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """Returns a copy with every tensor on ``device``."""
        return self._map_tensors(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """Returns a copy in pinned memory (called by ``DataLoader(pin_memory=True)``)."""
        return self._map_tensors(lambda t: t.pin_memory())


def _pad(
    rows: list[list[int]], pad_id: int, multiple: int = 1, cap: int | None = None
) -> torch.Tensor:
    width = max(len(r) for r in rows)
    rounded = -(-width // multiple) * multiple  # the next multiple of `multiple`
    width = max(width, min(rounded, cap)) if cap is not None else rounded
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, W)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


@dataclass(frozen=True, kw_only=True)
class Collator:
    """Turns a list of encoded pairs into a `Batch`; picklable for DataLoader workers.

    The special ids have no defaults: they are the tokenizer's (:meth:`for_tokenizer`), never
    assumed.

    Attributes:
        pad_id: Padding id.
        bos_id: Id prepended to the decoder input.
        eos_id: Id appended to the source and to the decoder target.
        pad_multiple: Pad the source and target widths up to a multiple of this (1 = to the
            longest row only). Fewer distinct batch shapes: oneDNN, which runs bf16 matmuls on
            a CPU, compiles kernels for every new shape (12 ms a matmul on an AMX Xeon) and
            keeps them in a cache of limited size, so a run whose shapes repeat spends its time
            computing instead (docs/benchmarks.md, "Training throughput").
        max_width: Never pad beyond this width (the model's ``max_len``) for the rounding; a
            row longer than it is still padded to its own length.
    """

    pad_id: int
    bos_id: int
    eos_id: int
    pad_multiple: int = 1
    max_width: int | None = None

    def __post_init__(self) -> None:
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}: expected an id >= 0, got {value!r}")
        for name, value in (("pad_multiple", self.pad_multiple), ("max_width", self.max_width)):
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            if not (ok or (name == "max_width" and value is None)):
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")

    @classmethod
    def for_tokenizer(cls, tokenizer, **options) -> Collator:
        """Takes the special ids from a `SubwordTokenizer` (or anything with ``*_id``);
        ``options``: ``pad_multiple``, ``max_width``."""
        return cls(
            pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, **options
        )

    def __call__(
        self,
        pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
        indices: Sequence[int] | None = None,
    ) -> Batch:
        """Pads ``pairs`` ``(src_ids, tgt_ids)`` (no specials) into a `Batch`.

        Raises:
            ValueError: If ``pairs`` is empty or ``indices`` has a different length.
        """
        if len(pairs) == 0:
            raise ValueError("pairs is empty, expected at least one (src_ids, tgt_ids) pair")
        if indices is not None and len(indices) != len(pairs):
            raise ValueError(
                f"indices has {len(indices)} entries but pairs has {len(pairs)}, expected equal"
            )
        src = [[*s, self.eos_id] for s, _ in pairs]
        tgt_in = [[self.bos_id, *t] for _, t in pairs]
        tgt_out = [[*t, self.eos_id] for _, t in pairs]
        pad = dict(pad_id=self.pad_id, multiple=self.pad_multiple, cap=self.max_width)
        return Batch(
            src=_pad(src, **pad),
            tgt_in=_pad(tgt_in, **pad),
            tgt_out=_pad(tgt_out, **pad),
            num_src_tokens=sum(map(len, src)),
            num_tgt_tokens=sum(map(len, tgt_out)),
            pad_id=self.pad_id,
            indices=None if indices is None else torch.tensor(list(indices), dtype=torch.long),
        )


def iter_batches(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    sampler: TokenBatchSampler,
    collator: Collator,
) -> Iterator[Batch]:
    """Yields batches with ``indices`` set, without a DataLoader (e.g. for evaluation,
    where outputs must be put back in corpus order)."""
    for batch_indices in sampler:
        yield collator([pairs[i] for i in batch_indices], indices=batch_indices)
