"""A full disk (ENOSPC) while a picture or page is written: the earlier file stays as it was,
no temporary file is left, and the command line says so in one line naming the file.

The disk fills when the data is flushed (``fsync``: file systems with delayed allocation
report ENOSPC there) or when the new file is put in place (``os.replace``)."""

from __future__ import annotations

import errno
import os

import pytest
import torch

from attnkit.cli import main
from attnkit.viz import write_html
from attnkit.viz.plots import heatmap
from tests.helpers.viz import SENTENCE

OLD = b"an earlier picture"


def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture(params=["fsync", "replace"])
def full_disk(request, monkeypatch):
    """Makes the disk full at ``os.fsync`` or at ``os.replace``."""
    return lambda: monkeypatch.setattr(os, request.param, _full)


def _earlier(path):
    path.write_bytes(OLD)
    return path


def _assert_left_alone(path):
    assert path.read_bytes() == OLD
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file


def test_a_plot_is_written_whole_or_not_at_all(tmp_path, full_disk):
    out = _earlier(tmp_path / "plot.png")
    weights = torch.softmax(torch.randn(3, 3, generator=torch.Generator().manual_seed(0)), -1)
    full_disk()
    with pytest.raises(OSError) as info:
        heatmap(weights, list("abc"), list("abc"), out=out)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(out)
    _assert_left_alone(out)


def test_a_page_is_written_whole_or_not_at_all(tmp_path, translation_maps, full_disk):
    out = _earlier(tmp_path / "attention.html")
    full_disk()
    with pytest.raises(OSError) as info:
        write_html(translation_maps, out)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(out)
    _assert_left_alone(out)


def test_walkthrough_plot_on_a_full_disk_is_one_line(tmp_path, full_disk, capsys):
    out = _earlier(tmp_path / "walk.png")
    full_disk()
    assert main(["walkthrough", "The sun rises", "--plot", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"attnkit walkthrough: error: no space left on the device while writing {str(out)!r}; "
        "free some space or write elsewhere\n"
    )
    _assert_left_alone(out)


@pytest.mark.parametrize("name", ["attention.html", "attention.png"])
def test_attention_on_a_full_disk_is_one_line(tmp_path, translation_dir, full_disk, capsys, name):
    folder = tmp_path / "out"
    folder.mkdir()
    out = _earlier(folder / name)
    full_disk()
    assert main(["attention", "--model", str(translation_dir), SENTENCE, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.endswith(
        f"attnkit attention: error: no space left on the device while writing {str(out)!r}; "
        "free some space or write elsewhere\n"
    )
    assert "Traceback" not in err
    _assert_left_alone(out)
