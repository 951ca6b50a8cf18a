"""A padded batch's real positions as rows: the layers compute padding only inside attention.

A padded batch computes its padding too: in Multi30k's batches of the translation config
(lengths bucketed, widths padded to a multiple of 8 for oneDNN's kernel cache) 21% of the
source and 25% of the target positions are padding. Only attention needs the (B, T) layout;
the norms, projections, dropout, residual additions and the feed-forward layer treat every
position alone. So in training the encoder and decoder carry their states as (M, d_model)
rows of real positions (:meth:`Packing.pack`), and multi-head attention scatters its
projected queries, keys and values into the (B, T) layout for the one attention function and
gathers its output back (:meth:`Packing.unpack`, :meth:`Packing.pack`): the technique of the
BERT implementations that "unpad" (FasterTransformer, Hugging Face's varlen paths).

Padding positions enter attention as zero vectors, which the masks hide from every real
position (source keys by the padding mask; the decoder is causal and right-padded), so the
states at real positions, the loss and every gradient are those of the padded computation
(``tests/modules/test_packing.py``); the stack's output has zeros at padding positions.

The row count M is rounded up to a multiple of :data:`ROW_MULTIPLE` with padding positions,
so that the products see few shapes (oneDNN compiles a kernel per shape, as
:mod:`attnkit.training.loss` pads its chunks for).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

ROW_MULTIPLE = 64

__all__ = ["ROW_MULTIPLE", "Packing", "real_rows"]


def real_rows(keep: Tensor, multiple: int = ROW_MULTIPLE) -> Tensor | None:
    """The flattened positions the layers must compute.

    Args:
        keep: (B, T) bool, True at real (non-pad) positions.
        multiple: round the row count up to a multiple of this with padding positions.

    Returns:
        (M,) int64 indices into the flattened (B x T) positions: every real position in
        order, then padding positions up to M = the next multiple of ``multiple``; None when
        M would be every position (nothing to skip).
    """
    if keep.dim() != 2 or keep.dtype != torch.bool:
        raise ValueError(
            f"keep: expected a (B, T) bool tensor, got {tuple(keep.shape)} {keep.dtype}"
        )
    flat = keep.reshape(-1)  # (B x T,)
    total = flat.numel()
    rows = min(total, -(-int(flat.sum()) // multiple) * multiple)
    if rows >= total:
        return None
    # Stable: real positions first, in order, then the padding positions.
    order = torch.argsort((~flat).to(torch.uint8), stable=True)  # (B x T,)
    return order[:rows]


@dataclass(frozen=True)
class Packing:
    """Which positions of a (B, T) batch are computed as rows.

    Attributes:
        rows: (M,) indices into the flattened B x T positions (:func:`real_rows`).
        batch: B.
        length: T.
    """

    rows: Tensor
    batch: int
    length: int

    @classmethod
    def of(cls, keep: Tensor, multiple: int = ROW_MULTIPLE) -> Packing | None:
        """The packing of ``keep`` (B, T) (True = real position), or None when nothing would
        be skipped."""
        rows = real_rows(keep, multiple)
        return None if rows is None else cls(rows, keep.shape[0], keep.shape[1])

    def pack(self, x: Tensor) -> Tensor:
        """(B, T, d) -> (M, d): the rows' states."""
        if x.dim() != 3 or x.shape[:2] != (self.batch, self.length):
            raise ValueError(
                f"x: expected shape ({self.batch}, {self.length}, d), got {tuple(x.shape)}"
            )
        return x.reshape(-1, x.shape[-1]).index_select(0, self.rows)

    def unpack(self, x: Tensor) -> Tensor:
        """(M, d) -> (B, T, d), zeros at the positions that are not rows."""
        if x.dim() != 2 or x.shape[0] != self.rows.numel():
            raise ValueError(f"x: expected shape ({self.rows.numel()}, d), got {tuple(x.shape)}")
        full = x.new_zeros(self.batch * self.length, x.shape[-1])
        return full.index_copy(0, self.rows, x).view(self.batch, self.length, -1)
