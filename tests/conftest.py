"""Test-wide settings: the tensors here are tiny, so one intra-op thread is fastest and leaves
the rest of a shared machine alone."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_torch():
    """Every test starts from the same random state, so random inputs cannot make it flaky."""
    torch.manual_seed(0)


@pytest.fixture
def uncapped_onednn(monkeypatch):
    """No ``ONEDNN_MAX_CPU_ISA`` / ``DNNL_MAX_CPU_ISA`` (CI's AVX2 pass sets the first), for
    tests that set the processor's rule themselves."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
