"""attnkit.export.folder: an export replaces only an empty folder or an earlier export, and is
written whole or not at all."""

from __future__ import annotations

import json
import os
import re

import pytest

from attnkit.export.folder import (
    RECORD_FILE,
    atomic_export_folder,
    check_export_target,
    is_export_folder,
)


def write_export(folder, **record) -> None:
    """A folder that looks like an earlier attnkit export."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.bin").write_bytes(b"old")
    (folder / "config.json").write_text("{}")
    body = {"writer": "attnkit", "format": "ctranslate2", **record}
    (folder / RECORD_FILE).write_text(json.dumps(body))


def test_new_empty_and_earlier_exports_are_accepted(tmp_path):
    check_export_target(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    check_export_target(tmp_path / "empty")
    write_export(tmp_path / "old")
    check_export_target(tmp_path / "old")
    assert is_export_folder(tmp_path / "old") and not is_export_folder(tmp_path / "empty")


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: (p.mkdir(), (p / "notes.txt").write_text("mine")), "holds notes.txt"),
        (lambda p: p.write_text("a file"), "a file, not a folder"),
        (lambda p: (p.mkdir(), (p / "model.bin").write_bytes(b"x")), f"no readable {RECORD_FILE}"),
        (lambda p: write_export(p, writer="someone"), "does not say attnkit wrote"),
        (lambda p: (write_export(p), (p / "sub").mkdir()), "holds sub"),
    ],
    ids=["user files", "a file", "no record", "another writer", "a subfolder"],
)
def test_other_folders_are_refused_and_left_alone(tmp_path, make, reason):
    out = tmp_path / "out"
    make(out)
    before = sorted(os.walk(out)) if out.is_dir() else out.read_text()
    with pytest.raises(
        ValueError, match=f"--out '{re.escape(str(out))}': refusing to replace it: .*{reason}"
    ):
        with atomic_export_folder(out) as tmp:
            (tmp / "model.bin").write_bytes(b"new")
    assert (sorted(os.walk(out)) if out.is_dir() else out.read_text()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folder left


def test_a_symbolic_link_is_refused(tmp_path):
    target = tmp_path / "target"
    write_export(target)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ValueError, match="a symbolic link"):
        check_export_target(tmp_path / "link")


def test_the_model_folder_itself_is_refused(tmp_path):
    (tmp_path / "model").mkdir()
    with pytest.raises(ValueError, match="the model folder itself"):
        check_export_target(tmp_path / "model", source=tmp_path / "model")


def test_an_earlier_export_is_replaced_whole(tmp_path):
    out = tmp_path / "out"
    write_export(out)
    (out / "shared_vocabulary.json").write_text("[]")  # not in the new export
    with atomic_export_folder(out) as tmp:
        (tmp / "model.bin").write_bytes(b"new")
        (tmp / RECORD_FILE).write_text(json.dumps({"writer": "attnkit", "format": "ctranslate2"}))
    assert sorted(p.name for p in out.iterdir()) == [RECORD_FILE, "model.bin"]
    assert (out / "model.bin").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_write_leaves_the_earlier_export(tmp_path):
    out = tmp_path / "out"
    write_export(out)
    with pytest.raises(OSError, match="disk full"):
        with atomic_export_folder(out) as tmp:
            (tmp / "model.bin").write_bytes(b"partial")
            raise OSError(28, "disk full")
    assert (out / "model.bin").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_stray_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"\['notes.txt'\] are not export files"):
        with atomic_export_folder(tmp_path / "out") as tmp:
            (tmp / "notes.txt").write_text("x")
    assert not (tmp_path / "out").exists()


def test_leftovers_of_a_killed_export_are_removed(tmp_path):
    """A writer killed between its renames leaves NAME.old-<pid> (or a partial NAME.tmp-<pid>);
    the next export removes them, and nothing that holds other files."""
    write_export(tmp_path / "out.old-123")
    (tmp_path / "out.tmp-456").mkdir()
    (tmp_path / "out.tmp-456" / "model.bin").write_bytes(b"partial")
    (tmp_path / "out.tmp-789").mkdir()
    (tmp_path / "out.tmp-789" / "notes.txt").write_text("not ours")
    with atomic_export_folder(tmp_path / "out") as tmp:
        (tmp / "model.bin").write_bytes(b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.tmp-789"]
