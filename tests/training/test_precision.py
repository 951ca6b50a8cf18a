"""Which autocast dtype "auto" picks, and that it says why."""

from __future__ import annotations

import logging

import pytest
import torch

from attnkit.training import precision
from attnkit.training.precision import resolve_autocast

CPU = torch.device("cpu")


def test_explicit_modes():
    assert resolve_autocast("none", CPU) is None
    assert resolve_autocast("bf16", CPU) is torch.bfloat16
    assert resolve_autocast("fp16", CPU) is torch.float16
    with pytest.raises(ValueError, match=r"autocast: expected one of"):
        resolve_autocast("int8", CPU)


@pytest.mark.parametrize(
    "capability,amx,expected",
    [
        ("AVX2", False, None),
        ("AVX512", False, torch.bfloat16),
        ("AVX2", True, torch.bfloat16),
        ("DEFAULT", False, None),
    ],
)
def test_auto_on_cpu_follows_capability(
    monkeypatch, caplog, capability, amx, expected, uncapped_onednn
):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    with caplog.at_level(logging.INFO, logger=precision.__name__):
        assert resolve_autocast("auto", CPU) is expected
    assert "autocast auto" in caplog.text and capability in caplog.text
