"""Normalisation layers: the paper's LayerNorm and RMSNorm (Llama, Mistral, Qwen), chosen by name.

RMSNorm(x) = g * x / sqrt(mean(x^2) + eps): LayerNorm without the mean subtraction and without
a shift (Zhang and Sennrich, 2019). It is computed in float32 and cast back to the input's dtype
before the gain is applied, as Hugging Face's ``LlamaRMSNorm`` does, so that a bfloat16 model
rounds where Hugging Face's does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["NORMS", "RMSNorm", "make_norm"]

NORMS = ("layer", "rms")


class RMSNorm(nn.Module):
    """y = weight * x / sqrt(mean(x^2 over the last dim) + eps).

    Args:
        d_model: width normalised (the last dim).
        eps: added to the mean square.
    """

    def __init__(self, d_model: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """(..., d_model) -> (..., d_model)."""
        shape = (x.shape[-1],)
        if x.dtype == self.weight.dtype and x.dtype in (torch.float32, torch.float64):
            # One fused kernel; the same numbers as the two steps below (a test says so).
            return F.rms_norm(x, shape, self.weight, self.eps)
        normed = F.rms_norm(x.float(), shape, None, self.eps)  # in float32
        return self.weight * normed.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def make_norm(kind: str, d_model: int, *, eps: float) -> nn.Module:
    """``nn.LayerNorm`` for ``"layer"``, :class:`RMSNorm` for ``"rms"``."""
    if kind == "layer":
        return nn.LayerNorm(d_model, eps=eps)
    if kind == "rms":
        return RMSNorm(d_model, eps=eps)
    raise ValueError(f"norm: expected one of {list(NORMS)}, got {kind!r}")
