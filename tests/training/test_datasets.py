"""attnkit.training.datasets.check_files: data files are checked before a run folder is made."""

from __future__ import annotations

import dataclasses
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


@pytest.mark.parametrize(
    "val_tgt,message",
    [
        ("", r"^data\.val_tgt='.*empty\.txt' is empty"),
        ("x\n", r"^data\.val_src='.*va\.de' has 2 lines but data\.val_tgt='.*empty\.txt' has 1"),
    ],
)
def test_what_a_data_file_holds_is_named_by_its_key(tmp_path, val_tgt, message):
    from attnkit.training.config import DataConfig
    from attnkit.training.datasets import load_text

    for name, text in (("tr.de", "a\n"), ("tr.en", "b\n"), ("va.de", "c\nd\n")):
        (tmp_path / name).write_text(text)
    (tmp_path / "empty.txt").write_text(val_tgt)
    files = {k: str(tmp_path / v) for k, v in (("train_src", "tr.de"), ("train_tgt", "tr.en"))}
    cfg = DataConfig(
        corpus="", val_src=str(tmp_path / "va.de"), val_tgt=str(tmp_path / "empty.txt"), **files
    )
    with pytest.raises(ValueError, match=message):
        load_text(cfg)


def test_sources_are_cleaned_as_translation_cleans_them_and_targets_kept(tmp_path):
    """What the model trains on is what the Translator will give it: a dirty source line
    loads as its clean form (so the tokenizer, the batches and the weights are those of the
    clean file); the target side is left as written."""
    from attnkit.training.config import DataConfig
    from attnkit.training.datasets import load_text

    dirty = "\ufeff  Ein\tMann\u00a0 fährt\x1b  \nZwei  Hunde.\n"
    clean = "Ein Mann fährt\nZwei Hunde.\n"
    target = "A  man\tdrives.\nTwo dogs.\n"
    for name, text in (("dirty.de", dirty), ("clean.de", clean), ("t.en", target)):
        (tmp_path / name).write_text(text, encoding="utf-8")

    def load_cfg(src: str) -> DataConfig:
        return DataConfig(
            corpus="", train_src=str(tmp_path / src), train_tgt=str(tmp_path / "t.en"),
            val_src=str(tmp_path / src), val_tgt=str(tmp_path / "t.en"),
        )  # fmt: skip

    def load(src: str):
        return load_text(load_cfg(src))

    loaded = load("dirty.de")
    assert loaded == load("clean.de")
    raw = load_text(dataclasses.replace(load_cfg("dirty.de"), clean_sources=False))
    assert raw.train.src[0] == "  Ein\tMann\u00a0 fährt\x1b  "  # as written (BOM: read_lines)
    assert loaded.train.src == loaded.val.src == ["Ein Mann fährt", "Zwei Hunde."]
    assert loaded.train.tgt == ["A  man\tdrives.", "Two dogs."]
