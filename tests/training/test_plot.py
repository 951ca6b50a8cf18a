"""The validation-loss plot from metrics.jsonl."""

from __future__ import annotations

import json

import matplotlib  # noqa: F401  (a dev dependency: missing must fail, not skip)
import pytest

from attnkit.training.plot import main, plot_val_loss  # noqa: E402


def test_plot_writes_a_png(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "train_loss": 5.0, "elapsed_sec": 3.0}]
    rows += [
        {"step": s, "val_loss": 4.0 / s, "val_ppl": 1.0, "elapsed_sec": 60.0 * s} for s in (1, 2, 3)
    ]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = plot_val_loss(metrics, tmp_path / "docs" / "val.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([str(metrics), str(tmp_path / "again.png")]) == 0


def test_plot_needs_evaluations(tmp_path, capsys):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "train_loss": 5.0, "elapsed_sec": 1.0}) + "\n")
    with pytest.raises(ValueError, match="no val_loss records"):
        plot_val_loss(metrics, tmp_path / "x.png")
    assert main([str(metrics), str(tmp_path / "x.png")]) == 2
