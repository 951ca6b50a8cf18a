"""The validation-loss plot from metrics.jsonl."""

from __future__ import annotations

import json
import os

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


def test_a_failed_write_keeps_the_old_png_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "val_loss": 4.0 / s, "elapsed_sec": 60.0 * s} for s in (1, 2)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "plots" / "val.png"
    out.parent.mkdir()
    out.write_bytes(b"the old plot")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)  # the last step of an atomic write
    with pytest.raises(OSError, match="No space left on device"):
        plot_val_loss(metrics, out)
    assert out.read_bytes() == b"the old plot"
    assert sorted(p.name for p in out.parent.iterdir()) == ["val.png"]


def test_the_plot_never_goes_into_a_runs_checkpoint(tmp_path):
    from attnkit.training import train
    from tests.helpers.training import fast_config

    run = tmp_path / "run"
    train(fast_config("optim.max_steps=2", "optim.eval_every=2"), run, progress=False)
    before = sorted(p.name for p in (run / "best").iterdir())
    with pytest.raises(ValueError, match=r"^out_png: '.*/run/best/val\.png' is inside the model"):
        plot_val_loss(run / "metrics.jsonl", run / "best" / "val.png")
    assert sorted(p.name for p in (run / "best").iterdir()) == before
    assert plot_val_loss(run / "metrics.jsonl", run / "val.png").is_file()  # beside it: fine


def test_plot_needs_evaluations(tmp_path, capsys):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "train_loss": 5.0, "elapsed_sec": 1.0}) + "\n")
    with pytest.raises(ValueError, match="no val_loss records"):
        plot_val_loss(metrics, tmp_path / "x.png")
    assert main([str(metrics), str(tmp_path / "x.png")]) == 2


@pytest.mark.parametrize(
    ("name", "message"),
    [("plots", "expected a file name ending in .png"), ("val.jpg", "ending in .png"),
     ("folder.png", "is a folder")],
)  # fmt: skip
def test_plot_writes_only_the_png_it_was_given(tmp_path, capsys, name, message):
    """A name without .png became name.png beside it (printed as the name), .jpg wrote a JPEG,
    and a folder became folder.png in its parent: all refused now, nothing written."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "val_loss": 2.0, "elapsed_sec": 1.0}) + "\n")
    (tmp_path / "folder.png").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match=message):
        plot_val_loss(metrics, tmp_path / name)
    assert main([str(metrics), str(tmp_path / name)]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"\xff\xfe{}\n", "not UTF-8 text"), (b'{"step": 1}\nnot json\n', "line 2: not JSON"),
     (b"[1, 2]\n", "line 1: expected a JSON object")],
)  # fmt: skip
def test_a_bad_metrics_file_is_named(tmp_path, capsys, content, message):
    """(A last line without its newline, cut short by a kill, is dropped instead: below.)"""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_bytes(content)
    assert main([str(metrics), str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert str(metrics) in err and message in err
    assert not (tmp_path / "x.png").exists()


def test_a_last_line_cut_short_by_a_kill_is_dropped(tmp_path):
    from attnkit.training.metrics_log import read_metrics

    metrics = tmp_path / "metrics.jsonl"
    whole = json.dumps({"step": 1, "val_loss": 2.0, "elapsed_sec": 1.0}) + "\n"
    metrics.write_text(whole + '{"step": 2, "val_lo')
    assert read_metrics(metrics) == [json.loads(whole)]
    assert main([str(metrics), str(tmp_path / "x.png")]) == 0
