"""Mixed precision: which autocast dtype a run uses.

``"auto"`` takes bfloat16 where it is fast: on CUDA (when the GPU supports it), or on a CPU
whose kernels torch dispatches with AVX-512 (``torch.backends.cpu.get_cpu_capability()`` is
``"AVX512"``; AMX CPUs report that too) or that has AMX tiles. Elsewhere, e.g. an AVX2-only
CPU where bf16 matmuls run ~30x slower than float32, it keeps float32. Weights, gradients and
optimizer state stay float32 in every mode (autocast only lowers the matmul inputs).
"""

from __future__ import annotations

import contextlib
import logging

import torch

from attnkit.hardware import cpu_has_fast_bf16

logger = logging.getLogger(__name__)

__all__ = ["DTYPES", "autocast_context", "cpu_has_fast_bf16", "resolve_autocast"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}


def resolve_autocast(mode: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``mode`` ("auto", "bf16", "fp16", "none") on ``device``.

    Returns:
        ``torch.bfloat16``, ``torch.float16`` or None (float32, no autocast).
    """
    if mode != "auto":
        if mode not in DTYPES:
            raise ValueError(f"autocast: expected one of {['auto', *DTYPES]}, got {mode!r}")
        dtype = DTYPES[mode]
        logger.info("autocast: %s (set explicitly) on %s", mode, device)
        return dtype
    if device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        logger.info("autocast auto: %s on %s", dtype, device)
        return dtype
    capability = torch.backends.cpu.get_cpu_capability()
    if device.type == "cpu" and cpu_has_fast_bf16():
        logger.info("autocast auto: bfloat16 (CPU capability %s)", capability)
        return torch.bfloat16
    logger.info(
        "autocast auto: float32 (no autocast) on %s: CPU capability %s has no fast bf16 matmul",
        device,
        capability,
    )
    return None


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` for ``dtype``, or a no-op context when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
