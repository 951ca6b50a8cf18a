"""What the hardware computes fast: the one place that decides when bfloat16 pays.

bfloat16 matrix products are native on CUDA GPUs that support them and on CPUs whose kernels
torch dispatches with AVX-512 (``torch.backends.cpu.get_cpu_capability()`` starts with
``"AVX512"``; AMX CPUs report that too) or that have AMX tiles. Elsewhere, e.g. an AVX2-only
CPU, they are emulated: a 1024x256x1024 product ran 30x slower in bf16 than in float32 on the
AVX2 development machine (docs/benchmarks.md). Training's ``autocast = "auto"``
(:mod:`attnkit.training.precision`) and translation's ``--dtype auto`` both ask here.
"""

from __future__ import annotations

import torch

__all__ = ["cpu_has_fast_bf16", "fast_inference_dtype"]


def cpu_has_fast_bf16() -> bool:
    """True when this CPU runs bf16 matmuls natively (AVX-512 dispatch or AMX tiles)."""
    capability = torch.backends.cpu.get_cpu_capability()
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    return capability.startswith("AVX512") or bool(amx)


def fast_inference_dtype(device: torch.device | str) -> torch.dtype:
    """bfloat16 where it is native on ``device`` (above), else float32.

    For inference whose result bfloat16 barely moves: the shipped translator's test2016 BLEU
    is 42.09 in bfloat16 against 42.00 in float32 (docs/benchmarks.md, "Translation quality").
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if device.type == "cpu" and cpu_has_fast_bf16():
        return torch.bfloat16
    return torch.float32
