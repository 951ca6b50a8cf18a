"""Dropout with its mask drawn from random bits: torch's distribution, a fraction of its cost on
a CPU.

torch's CPU dropout draws its mask with ``bernoulli_``, about 7-10 ns per element, which in a
bf16 training step at translation sizes was 10-15% of the step (docs/benchmarks.md, "Training
throughput"). Here each element gets 15 random bits (one ``random_`` draw on int64 gives four
elements) and is kept when they are at least ``round(p * 2^15)``: the drop probability is ``p``
rounded to a multiple of 2^-15 (within 1.6e-5 of ``p``), and kept values are scaled by one over
the keep probability, so the expectation of the output is exactly the input. The bits come from
the device's default generator, so ``torch.manual_seed`` and the RNG states a checkpoint saves
govern the masks as they govern torch's dropout (the masks themselves differ from torch's).

Only CPU tensors take this path; elsewhere (CUDA's fused dropout is already fast) and for
``p = 1`` it is :func:`torch.nn.functional.dropout`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Dropout", "dropout", "dropout_mask", "keep_mask"]

BITS = 15  # random bits per element: p is rounded to a multiple of 2^-15
_LEVELS = 1 << BITS


def keep_mask(
    shape: tuple[int, ...] | torch.Size, p: float, *, device: torch.device | str | None = None
) -> tuple[Tensor, float]:
    """A boolean mask, each element True (kept) with probability ``1 - p`` rounded to 2^-15.

    Args:
        shape: the mask's shape.
        p: drop probability in [0, 1).
        device: where to make it (the default generator of that device draws the bits).

    Returns:
        ``(keep, scale)``: the mask (``shape``, bool) and ``1 / P(keep)``, the factor that keeps
        the expectation of the kept values.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p: expected a drop probability in [0, 1), got {p!r}")
    threshold = round(p * _LEVELS)
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_()  # 63 bits each
    # Four 16-bit pieces per word; the top bit of the last is always 0, so keep 15 bits of each.
    bits = words.view(torch.int16)[:n].bitwise_and_(_LEVELS - 1)  # (n,) uniform in [0, 2^15)
    keep = (bits >= threshold).view(shape)
    # p within 2^-16 of 1 rounds to dropping everything: nothing is kept, nothing to scale
    return keep, _LEVELS / (_LEVELS - threshold) if threshold < _LEVELS else 0.0


def dropout_mask(
    shape: tuple[int, ...] | torch.Size,
    p: float,
    *,
    dtype: torch.dtype,
    device: torch.device | str | None = None,
) -> Tensor:
    """``keep * scale`` of :func:`keep_mask` in ``dtype``: multiplying by it drops and rescales."""
    keep, scale = keep_mask(shape, p, device=device)
    return _scaled(keep, scale, dtype)


def _scaled(keep: Tensor, scale: float, dtype: torch.dtype) -> Tensor:
    # through uint8: bool -> float conversion is not vectorised on a CPU, uint8 -> float is
    return keep.view(torch.uint8).to(dtype).mul_(scale)


class _MaskedScale(torch.autograd.Function):
    """x * keep * scale; the boolean mask (one byte per element, as torch's dropout keeps) is
    saved for the backward."""

    @staticmethod
    def forward(ctx, x, p):
        keep, scale = keep_mask(x.shape, p, device=x.device)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x * _scaled(keep, scale, x.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        (keep,) = ctx.saved_tensors
        return grad_out * _scaled(keep, ctx.scale, grad_out.dtype), None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zeroes each element of ``x`` with probability ``p`` and scales the rest to keep the
    expectation; the identity when not ``training`` or ``p == 0`` (module docstring)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p: expected a drop probability in [0, 1], got {p!r}")
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p == 1.0 or not x.is_floating_point():
        return F.dropout(x, p, training=True)
    return _MaskedScale.apply(x, p)


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose CPU mask comes from :func:`keep_mask` (module docstring)."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return F.dropout(x, self.p, self.training, inplace=True)
        return dropout(x, self.p, self.training)
