"""attnkit.training.datasets.check_files: data files are checked before a run folder is made."""

from __future__ import annotations

import os

import pytest

from attnkit.training.datasets import check_files


def test_files_that_open_pass_and_empty_names_and_stdin_are_skipped(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    check_files({"data.train_src": str(tmp_path / "a.txt"), "data.val_src": "", "k": "-"})


@pytest.mark.parametrize(
    "name,message",
    [
        ("missing.txt", r"^data.train_src: cannot read '.*missing.txt' \(No such file"),
        (".", r"^data.train_src: '.*' is a directory, expected a text file"),
        ("a.txt/b", r"^data.train_src: cannot read '.*a.txt/b' \(Not a directory"),
    ],
)
def test_a_file_that_cannot_be_read_names_the_key(tmp_path, name, message):
    (tmp_path / "a.txt").write_text("x\n")
    with pytest.raises(ValueError, match=message):
        check_files({"data.train_src": str(tmp_path / name)})


def test_an_unreadable_file_names_the_key(tmp_path, monkeypatch):
    """Tests run as root, who reads every file: the permission error is simulated."""
    path = tmp_path / "secret.txt"
    path.write_text("x\n")
    real_open = open

    def refusing_open(file, *args, **kwargs):
        if os.fspath(file) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refusing_open)
    with pytest.raises(ValueError, match=r"^data.train_file: cannot read .*Permission denied"):
        check_files({"data.train_file": str(path)})
