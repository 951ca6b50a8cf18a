"""Residual connection with LayerNorm, before (pre-LN) or after (post-LN) the sublayer."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn


class Residual(nn.Module):
    """post-LN: LayerNorm(x + dropout(f(x))), the paper's form;
    pre-LN: x + dropout(f(LayerNorm(x))), seeds 002/004 and most modern models.

    ``f`` may return a tensor or ``(tensor, extra)``; the extra (attention weights) is passed
    through: the result is then ``(y, extra)``.

    Args:
        d_model: width normalised.
        dropout: dropout on the sublayer output, in training only.
        norm_first: pre-LN when true, post-LN when false.
        eps: LayerNorm epsilon.
    """

    def __init__(self, d_model: int, *, dropout: float, norm_first: bool, eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor | tuple]):
        out = sublayer(self.norm(x) if self.norm_first else x)
        out, extra = out if isinstance(out, tuple) else (out, None)
        y = x + self.dropout(out)
        if not self.norm_first:
            y = self.norm(y)
        return y if extra is None else (y, extra)
