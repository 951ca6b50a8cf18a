"""Reading hypothesis and reference files, and the errors that name file and line."""

from __future__ import annotations

import gzip
import io
import sys

import pytest

from attnkit.metrics.io import read_corpus, read_lines


@pytest.mark.parametrize(
    "data, lines",
    [
        (b"", []),
        (b"\n", [""]),
        (b"a\nb", ["a", "b"]),
        (b"a\nb\n", ["a", "b"]),
        (b"a\n\nb\n", ["a", "", "b"]),
        (b"a\r\nb\r\n", ["a\r", "b\r"]),  # \r stays; BLEU strips line ends itself
        ("x\u2028y\x85z\x0cw\n".encode(), ["x\u2028y\x85z\x0cw"]),  # split on \n only
        ("caf\u00e9 \u4e2d\n".encode(), ["caf\u00e9 \u4e2d"]),
    ],
)
def test_read_lines(tmp_path, data, lines):
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    assert read_lines(path) == lines
    gz = tmp_path / "f.txt.gz"
    gz.write_bytes(gzip.compress(data))
    assert read_lines(gz) == lines


def test_read_lines_from_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"one\ntwo\n")))
    assert read_lines("-") == ["one", "two"]


def test_non_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("fine\nalso fine\ncaf\u00e9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt'?: line 3 is not valid UTF-8"):
        read_lines(path)


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    hyp, ref, ref2 = tmp_path / "hyp.txt", tmp_path / "ref.txt", tmp_path / "ref2.txt"
    hyp.write_text("a\nb\nc\n")
    ref.write_text("a\nb\nc\n")
    ref2.write_text("a\nb\n")
    hyps, refs = read_corpus(hyp, [ref])
    assert hyps == ["a", "b", "c"] and refs == [["a", "b", "c"]]
    with pytest.raises(ValueError) as err:
        read_corpus(hyp, [ref, ref2])
    message = str(err.value)
    assert "hyp.txt" in message and "3 lines" in message
    assert "ref2.txt" in message and "2 lines" in message


def test_unreadable_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_lines(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="cannot read"):
        read_lines(tmp_path)  # a directory
    bad = tmp_path / "bad.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"bad\.gz.*cannot read"):
        read_lines(bad)
