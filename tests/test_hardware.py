"""attnkit.hardware: bfloat16 only where the device computes it natively; the memory free."""

from __future__ import annotations

import pytest
import torch

from attnkit import hardware
from attnkit.hardware import (
    cpu_attention_has_amx,
    cpu_float_vector_width,
    cpu_has_fast_bf16,
    fast_inference_dtype,
)


@pytest.mark.parametrize(
    ("capability", "amx", "fast"),
    [
        ("AVX2", False, False),
        ("DEFAULT", False, False),
        ("AVX512", False, True),
        ("AVX512_BF16", False, True),
        ("AVX2", True, True),  # AMX tiles with a capped dispatch
    ],
)
def test_cpu_rule(capability, amx, fast, monkeypatch, uncapped_onednn):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert cpu_has_fast_bf16() is fast
    assert fast_inference_dtype("cpu") == (torch.bfloat16 if fast else torch.float32)
    assert cpu_attention_has_amx(torch.bfloat16) is amx  # AMX alone decides the path


@pytest.mark.parametrize(
    ("capability", "tiles", "cap", "fast"),
    [
        ("AVX2", True, None, True),
        ("AVX2", True, "ALL", True),
        ("AVX2", True, "avx512_core_amx", True),
        ("AVX2", True, "AVX2", False),  # the AVX2 emulation of CI's second pass
        ("AVX2", True, "AVX512_CORE_BF16", False),
        # torch dispatching AVX-512 while oneDNN, which runs the bf16 products, is capped at
        # AVX2: bfloat16 would be emulated, so float32 (before: bfloat16)
        ("AVX512", False, None, True),
        ("AVX512", False, "AVX2", False),
        ("AVX512", False, "AVX512_CORE", True),
    ],
)
def test_onednn_cap_hides_native_bf16(capability, tiles, cap, fast, monkeypatch, uncapped_onednn):
    """bfloat16 is fast only where oneDNN may still use AMX tiles or AVX-512."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: tiles, raising=False)
    if cap is not None:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert cpu_has_fast_bf16() is fast
    assert fast_inference_dtype("cpu") == (torch.bfloat16 if fast else torch.float32)


@pytest.mark.parametrize(
    ("cap", "amx"),
    [
        (None, True),
        ("ALL", True),
        ("AVX512_CORE_BF16", True),  # measured as fast on the Xeon: the CPU decides
        ("avx512_core_amx", True),
        ("AVX2", False),  # CI's emulation of an AVX2-only CPU: that CPU's path
        ("avx2_vnni", False),
        ("SSE41", False),
        ("AVX", False),
        ("AVX10_1_512", True),
        ("DNNL:avx2", False),  # the old name of the setting
    ],
)
def test_attention_amx_rule_follows_a_cap_below_avx512(cap, amx, monkeypatch, uncapped_onednn):
    """With ONEDNN_MAX_CPU_ISA below AVX-512 an AMX machine takes an AVX2-only CPU's attention
    path (before, CI's AVX2 pass on an AMX Xeon took the AMX path with AVX2 kernels)."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)
    if cap is not None and cap.startswith("DNNL:"):
        monkeypatch.setenv("DNNL_MAX_CPU_ISA", cap.removeprefix("DNNL:"))
    elif cap is not None:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert cpu_attention_has_amx(torch.bfloat16) is amx
    assert cpu_attention_has_amx(torch.float16) is amx


@pytest.mark.parametrize(
    "tiles, fp16, mkldnn",
    [(True, False, True), (True, True, True), (False, False, True), (True, True, False)],
)
def test_attention_amx_rule(tiles, fp16, mkldnn, monkeypatch, uncapped_onednn):
    """torch's attention kernel uses AMX for bf16 with AMX-BF16 tiles, for fp16 only with
    AMX-FP16, and for neither without oneDNN; float32 never."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: tiles, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: fp16, raising=False)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", mkldnn)
    assert cpu_attention_has_amx(torch.bfloat16) is (tiles and mkldnn)
    assert cpu_attention_has_amx(torch.float16) is (fp16 and mkldnn)
    assert cpu_attention_has_amx(torch.float32) is False
    assert fast_inference_dtype(torch.device("cpu")) == fast_inference_dtype("cpu")


@pytest.mark.parametrize("bf16", [True, False])
def test_cuda_rule(bf16, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert fast_inference_dtype("cuda") == (torch.bfloat16 if bf16 else torch.float32)


def test_other_devices_keep_float32():
    assert fast_inference_dtype("meta") == torch.float32


def test_training_precision_uses_the_same_rule():
    from attnkit.training import precision

    assert precision.cpu_has_fast_bf16 is cpu_has_fast_bf16


@pytest.mark.parametrize(
    ("capability", "width"),
    [("AVX512", 16), ("AVX512_BF16", 16), ("AVX2", 8), ("DEFAULT", 0), ("SVE256", 0)],
)
def test_float_vector_width_follows_the_dispatch(capability, width, monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert cpu_float_vector_width.__wrapped__() == width  # the uncached function


@pytest.mark.parametrize(
    ("vendor", "mkl", "generic"),
    [
        ("AuthenticAMD", True, True),
        ("HygonGenuine", True, True),
        ("GenuineIntel", True, False),
        ("", True, False),  # the vendor is unknown (not Linux): not assumed
        ("AuthenticAMD", False, False),  # no MKL in this torch (ARM builds)
    ],
)
def test_mkl_gemv_is_generic_only_where_mkl_meets_another_vendor(vendor, mkl, generic, monkeypatch):
    monkeypatch.setattr(hardware, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: mkl)
    assert hardware.mkl_gemv_is_generic() is generic
    assert hardware.mkl_gemv_is_fast() is (mkl and vendor == "GenuineIntel")


def test_available_memory_is_known_on_this_machine():
    free = hardware.available_memory(torch.device("cpu"))
    assert free is not None and free > 0
    assert hardware.available_memory(torch.device("meta")) is None


def test_available_memory_reads_meminfo_and_the_cgroup_limit(monkeypatch):
    import io

    files = {
        "/proc/meminfo": "MemTotal: 32000000 kB\nMemAvailable:   8000000 kB\n",
        "/sys/fs/cgroup/memory.max": "4294967296\n",  # 4 GiB
        "/sys/fs/cgroup/memory.current": "3221225472\n",  # 3 GiB used ...
        "/sys/fs/cgroup/memory.stat": "anon 1\ninactive_file 536870912\nfile 2\n",  # 0.5 GiB cache
    }

    def fake_open(path, *args, **kwargs):
        if path not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[path])

    monkeypatch.setattr(hardware, "open", fake_open, raising=False)
    cpu = torch.device("cpu")
    assert hardware.available_memory(cpu) == (1 << 30) + (1 << 29)  # 4 - 3 + 0.5 GiB
    files["/sys/fs/cgroup/memory.max"] = "max\n"
    assert hardware.available_memory(cpu) == 8_000_000 * 1024
    del files["/proc/meminfo"]
    assert hardware.available_memory(cpu) is None
