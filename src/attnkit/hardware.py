"""What the hardware computes fast: the one place that decides when bfloat16 pays.

bfloat16 matrix products are native on CUDA GPUs that support them and on CPUs whose kernels
torch dispatches with AVX-512 (``torch.backends.cpu.get_cpu_capability()`` starts with
``"AVX512"``; AMX CPUs report that too) or that have AMX tiles. Elsewhere, e.g. an AVX2-only
CPU, they are emulated: a 1024x256x1024 product ran 30x slower in bf16 than in float32 on the
AVX2 development machine (docs/benchmarks.md). Training's ``autocast = "auto"``
(:mod:`attnkit.training.precision`) and translation's ``--dtype auto`` both ask here, and
:mod:`attnkit.attention` asks :func:`cpu_attention_has_amx` which path a half-precision
decoding step takes.
"""

from __future__ import annotations

import functools
import os

import torch

__all__ = [
    "available_memory",
    "cpu_attention_has_amx",
    "cpu_has_fast_bf16",
    "cpu_float_vector_width",
    "cpu_vendor",
    "fast_inference_dtype",
    "mkl_gemv_is_fast",
    "mkl_gemv_is_generic",
]


def _cpu_has(feature: str) -> bool:
    """``torch.cpu._is_<feature>_supported()``, False where this torch has no such check."""
    return bool(getattr(torch.cpu, f"_is_{feature}_supported", lambda: False)())


def _onednn_cap() -> str:
    """``ONEDNN_MAX_CPU_ISA`` (or its old name ``DNNL_MAX_CPU_ISA``), upper case; ``"ALL"``
    when neither is set."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL"
    return cap.strip().upper()


def _onednn_may_use_amx() -> bool:
    """False when oneDNN is capped below AMX (e.g. ``AVX2``, the setting that makes an AMX
    machine compute as an AVX2-only one, or ``AVX512_CORE_BF16``)."""
    cap = _onednn_cap()
    return cap in ("ALL", "DEFAULT") or "AMX" in cap


def _onednn_capped_below_avx512() -> bool:
    """True when oneDNN is capped at an ISA without AVX-512 (``SSE41``, ``AVX``, ``AVX2``,
    ``AVX2_VNNI``, ``AVX2_VNNI_2``), as on an AVX2-only CPU."""
    cap = _onednn_cap()
    return cap.startswith(("SSE", "AVX2")) or cap == "AVX"


def cpu_has_fast_bf16() -> bool:
    """True when this CPU runs bf16 matmuls natively (AVX-512 dispatch or AMX tiles).

    AMX tiles count only where oneDNN, which runs the bf16 products, may use them: with
    ``ONEDNN_MAX_CPU_ISA=AVX2`` (and ``ATEN_CPU_CAPABILITY=avx2``) an AMX Xeon emulates bf16
    as an AVX2 processor does, a training step of the Multi30k config 50x slower than in
    float32 (60 against 1.2 s, measured), so ``auto`` keeps float32 there as on AVX2. For
    the same reason oneDNN capped below AVX-512 counts as an AVX2-only CPU whatever torch's
    own dispatch (``ONEDNN_MAX_CPU_ISA=AVX2`` alone).
    """
    if _onednn_capped_below_avx512():
        return False
    capability = torch.backends.cpu.get_cpu_capability()
    return capability.startswith("AVX512") or (_cpu_has("amx_tile") and _onednn_may_use_amx())


def cpu_attention_has_amx(dtype: torch.dtype = torch.bfloat16) -> bool:
    """True when torch's fused CPU attention kernel runs ``dtype`` on AMX tiles.

    Its flash-attention kernel packs half-precision blocks for oneDNN's brgemm only where the
    CPU has AMX for that dtype (``at::native::cpublas::could_pack``: AMX-BF16 tiles for
    bfloat16, AMX-FP16, newer, for float16) and oneDNN is enabled; elsewhere it computes half
    precision in plain vector code. The two differ by far at a decoding step (one query per
    row), measured in one process on each machine (docs/benchmarks.md, "Text generation"):
    with AMX (Intel Xeon) the bf16 kernel is 1.3-5x faster than widening the inputs to float32
    first, and 2.1-2.4x faster than three matmuls over a cache slice; without it (AMD EPYC
    with avx512_bf16) the bf16 kernel is 2-4x slower than float32. ``attnkit.attention`` picks
    its path for half-precision decoding steps by this. (Capping oneDNN with
    ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16`` on the Xeon left the bf16 kernel as fast, so that
    setting does not change the rule.) Under a cap below AVX-512 (``ONEDNN_MAX_CPU_ISA=AVX2``,
    CI's emulation of an AVX2-only CPU) the rule says False, a routing choice (the kernel's
    speed there was not measured): the attention core then takes an AVX2-only CPU's paths for
    half precision, which is what that emulation is for.
    """
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    if _onednn_capped_below_avx512():
        return False
    if dtype == torch.bfloat16:
        return _cpu_has("amx_tile")
    if dtype == torch.float16:
        return _cpu_has("amx_fp16")
    return False


@functools.cache
def cpu_float_vector_width() -> int:
    """float32 lanes of the vectors torch's CPU kernels use here: 16 with AVX-512 dispatch, 8
    with AVX2, 0 where this module does not know (another ISA, or no vector dispatch).

    torch's softmax over the last dimension loops element by element over rows shorter than
    one vector: 4-6x slower than separate vectorised passes at 1,000 x 5 rows of 4-15 floats,
    measured on an AMX Xeon in both dispatches (docs/benchmarks.md, "Run 9");
    :mod:`attnkit.attention_short` asks here.
    """
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return 16
    if capability.startswith("AVX2"):
        return 8
    return 0


@functools.cache
def cpu_vendor() -> str:
    """The CPU's vendor id from ``/proc/cpuinfo`` (``"GenuineIntel"``, ``"AuthenticAMD"``, ...),
    or ``""`` where it cannot be read (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def mkl_gemv_is_fast() -> bool:
    """True where MKL's float32 matrix-vector product (``F.linear`` with one row) beats a
    weight prepacked for oneDNN: on Intel CPUs, where MKL takes its own fast code paths.

    Measured in one process per machine (docs/benchmarks.md, "Modern attention"): on an Intel
    Xeon one row through ``F.linear`` took 83-197 us for a Llama-shaped layer's weights against
    102-256 us prepacked (MKL 10-20% faster; from 2 rows on, prepacked is 1.2-1.8x faster); on
    an AMD EPYC prepacked was 1.6x faster (GPT-2 small's layers: 11.9 against 19.3 ms).
    :mod:`attnkit.generation.packed` asks here.
    """
    return torch.backends.mkl.is_available() and cpu_vendor() == "GenuineIntel"


def mkl_gemv_is_generic() -> bool:
    """True where torch's MKL runs a float32 matrix-vector product in its generic code: a
    torch built with MKL on a CPU known not to be Intel's (``mkl_blas_def_xsgemv`` in a
    profile of the AVX2-only AMD EPYC, docs/benchmarks.md, "Run 15"; the AVX-512 EPYC takes
    the same rule, unmeasured). False on Intel CPUs, where the vendor cannot be read (not
    Linux) and without MKL (ARM). :mod:`attnkit.attention` asks here for a float32 decoding
    step, :mod:`attnkit.generation.packed` for a one-row product.
    """
    vendor = cpu_vendor()
    return torch.backends.mkl.is_available() and vendor not in ("", "GenuineIntel")


def fast_inference_dtype(device: torch.device | str) -> torch.dtype:
    """bfloat16 where it is native on ``device`` (above), else float32.

    For inference whose result bfloat16 barely moves: the shipped translator's test2016 BLEU
    is 43.04 in float32 and 43.01-43.13 in bfloat16, as the batches fall (docs/benchmarks.md,
    "Translation quality" and "Run 13").
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if device.type == "cpu" and cpu_has_fast_bf16():
        return torch.bfloat16
    return torch.float32


def available_memory(device: torch.device) -> int | None:
    """Bytes that a new allocation on ``device`` can still get, or None if unknown.

    CPU: the smaller of Linux's ``MemAvailable`` and the cgroup's ``memory.max`` less its
    ``memory.current`` plus its reclaimable ``inactive_file`` (a container's limit, which the
    kernel enforces by killing). CUDA:
    ``torch.cuda.mem_get_info``. Other devices: unknown (not checked).
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                current = int(f.read().strip())
            # The cgroup counts page cache too; its inactive part is reclaimed before a kill.
            with open("/sys/fs/cgroup/memory.stat") as f:
                stat = dict(line.split() for line in f if line.count(" ") == 1)
            reclaimable = int(stat.get("inactive_file", 0))
            found.append(max(int(limit) - current + reclaimable, 0))
    except (OSError, ValueError):
        pass
    return min(found) if found else None
