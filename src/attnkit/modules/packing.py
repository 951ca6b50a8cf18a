"""Position-wise sublayers on the real positions only, in training.

A padded batch computes its padding too: in Multi30k's batches of the translation config
(lengths bucketed, widths padded to a multiple of 8 for oneDNN's kernel cache) 21% of the
source and 25% of the target positions are padding. Attention needs the (B, T) layout, but
the feed-forward block (norm, two products, dropout, residual) treats every position alone,
so it can run on the real positions only: gather them into (N, d_model) rows, compute, and
write the results back (the technique of BERT implementations that "unpad", e.g.
FasterTransformer's and Hugging Face's varlen paths). The padding positions keep their input
values: nothing reads them (the keys are masked, the decoder is causal and right-padded, the
loss skips them), so the loss and every gradient are those of the padded computation
(``tests/modules/test_packing.py``), while the padding positions' own outputs are not.

The row count is rounded up to a multiple of :data:`ROW_MULTIPLE` with padding positions, so
that the products see few shapes (oneDNN compiles a kernel per shape, as
:mod:`attnkit.training.loss` pads its chunks for).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

ROW_MULTIPLE = 64

__all__ = ["ROW_MULTIPLE", "on_rows", "real_rows"]


def real_rows(keep: Tensor, multiple: int = ROW_MULTIPLE) -> Tensor | None:
    """The flattened positions a position-wise sublayer must compute.

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


def on_rows(x: Tensor, rows: Tensor | None, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """``fn``, a position-wise function of (..., d) -> (..., d), applied to the positions
    ``rows`` of x (B, T, d) flattened; the other positions keep their values.

    With ``rows`` None, ``fn(x)``.
    """
    if rows is None:
        return fn(x)
    flat = x.reshape(-1, x.shape[-1])  # (B x T, d)
    out = fn(flat.index_select(0, rows))  # (M, d)
    return flat.index_copy(0, rows, out.to(flat.dtype)).view(x.shape)
