"""Normalisation layers: the paper's LayerNorm and RMSNorm (Llama, Mistral, Qwen), chosen by name.

RMSNorm(x) = g * x / sqrt(mean(x^2) + eps): LayerNorm without the mean subtraction and without
a shift (Zhang and Sennrich, 2019), computed by ``F.rms_norm``. In float32 that gives Hugging
Face's ``LlamaRMSNorm`` exactly; in bfloat16 it accumulates in float32 and rounds once, where
Hugging Face rounds the normalised x to bfloat16 before multiplying by g, so the two differ by
at most that second rounding (a test says so). In inference on a CPU, where ``F.rms_norm`` is
about a dozen operators, the same value comes from torch's one fused LayerNorm kernel
(:func:`_rms_norm_by_layer_norm`): a decoding step runs two norms per layer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.modules._checks import check_features, check_size

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
        check_size("d_model", d_model)
        _check_eps(eps)
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """(..., d_model) -> (..., d_model), in x's dtype (the gain cast to it: autocast)."""
        check_features(x, self.weight.shape[0])
        weight = self.weight.to(x.dtype)
        if x.device.type == "cpu" and not torch.is_grad_enabled():
            return _rms_norm_by_layer_norm(x, weight, self.eps)
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def _rms_norm_by_layer_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm through torch's fused LayerNorm kernel, for inference on a CPU.

    The values [x, -x] have mean 0 and variance mean(x^2), so LayerNorm over them, with the
    gain [g, g] and no shift, gives RMSNorm(x) in its first half. On a CPU ``F.rms_norm`` is
    about a dozen operators (a float32 round trip in bfloat16) and LayerNorm one kernel: in a
    Llama-shaped model's bf16 decoding step at batch 1 the norms went from 9% of the step to
    nothing measurable (docs/benchmarks.md, "Modern attention"). Equal to ``F.rms_norm`` up
    to float rounding (LayerNorm's mean of the pairs is 0 up to rounding); a test says so.
    """
    d = x.shape[-1]
    both = torch.cat((x, x.neg()), dim=-1)  # (..., 2 d)
    gain = torch.cat((weight, weight))  # (2 d,)
    return F.layer_norm(both, (2 * d,), gain, None, eps)[..., :d]  # (..., d)


def _check_eps(eps: float) -> None:
    """A negative epsilon can make the variance under the root negative: NaN outputs."""
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 <= eps < math.inf:
        raise ValueError(f"eps: expected a finite number >= 0, got {eps!r}")


def make_norm(kind: str, d_model: int, *, eps: float) -> nn.Module:
    """``nn.LayerNorm`` for ``"layer"``, :class:`RMSNorm` for ``"rms"``."""
    _check_eps(eps)
    check_size("d_model", d_model)
    if kind == "layer":
        return nn.LayerNorm(d_model, eps=eps)
    if kind == "rms":
        return RMSNorm(d_model, eps=eps)
    raise ValueError(f"norm: expected one of {list(NORMS)}, got {kind!r}")
