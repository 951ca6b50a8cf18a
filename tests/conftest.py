"""Test-wide settings: the tensors here are tiny, so one intra-op thread is fastest and leaves
the rest of a shared machine alone."""

import pytest
import torch

from attnkit import hardware

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_torch():
    """Every test starts from the same random state, so random inputs cannot make it flaky."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_hardware_answers():
    """attnkit.hardware caches what it reads of the processor once per process. A test that
    pretends to run on another CPU (monkeypatching torch's capability) must not leave its
    answer to the tests after it: an AVX-512 vector width cached by a test that pretended
    AVX-512 changed a later training test's softmax path, and so its rounding, on AVX2."""
    cached = (hardware.cpu_float_vector_width, hardware.cpu_vendor)
    for function in cached:
        function.cache_clear()
    yield
    for function in cached:
        function.cache_clear()


@pytest.fixture
def uncapped_onednn(monkeypatch):
    """No ``ONEDNN_MAX_CPU_ISA`` / ``DNNL_MAX_CPU_ISA`` (CI's AVX2 pass sets the first), for
    tests that set the processor's rule themselves."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
