"""Reading hypothesis and reference files, and the errors that name file and line."""

from __future__ import annotations

import gzip
import io
import sys

import pytest

from attnkit.metrics.io import read_corpus, read_lines
from tests.helpers.metrics import assert_same_bleu


@pytest.mark.parametrize(
    "data, lines",
    [
        (b"", []),
        (b"\n", [""]),
        (b"a\nb", ["a", "b"]),
        (b"a\nb\n", ["a", "b"]),
        (b"a\n\nb\n", ["a", "", "b"]),
        (b"a\r\nb\r\n", ["a", "b"]),  # CRLF: the \r of the terminator goes
        (b"a\rb\r\r\n", ["a\rb\r"]),  # only one \r, and only before \n
        (b"\xef\xbb\xbfa\nb", ["a", "b"]),  # a byte-order mark at the start is dropped
        (b"a\n\xef\xbb\xbfb", ["a", "\ufeffb"]),  # elsewhere it is text
        (b"  a  \t\n", ["  a  \t"]),  # spaces stay
        (b"\x00\n", ["\x00"]),
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


def test_non_utf8_message_gives_the_byte_offset(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok\nab\xffcd\n")
    with pytest.raises(ValueError) as err:
        read_lines(path)
    assert str(err.value) == (
        f"{str(path)!r}: line 2 is not valid UTF-8 (invalid start byte: byte 0xff at byte 3 "
        "of line 2, byte offset 5 of the file)"
    )


def test_non_utf8_stdin_is_named(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xc3(\n")))
    with pytest.raises(
        ValueError, match=r"^<stdin>: line 1 is not valid UTF-8 \(invalid continuation byte"
    ):
        read_lines("-")


def test_gzip_by_content_and_by_name(tmp_path):
    plain_name = tmp_path / "data.txt"
    plain_name.write_bytes(gzip.compress("\ufeffä\r\nb\n".encode()))
    assert read_lines(plain_name) == ["ä", "b"]
    fake = tmp_path / "fake.gz"
    fake.write_bytes(b"plain text")
    with pytest.raises(
        ValueError, match=r"fake\.gz'?: cannot read the file: not a valid gzip file"
    ):
        read_lines(fake)


def test_one_read_lines_for_corpora_and_bleu():
    from attnkit.data import corpus
    from attnkit.data import read_lines as data_read_lines

    assert corpus.read_lines is read_lines and data_read_lines is read_lines


def test_a_bom_does_not_change_bleu(tmp_path):
    """sacreBLEU reads a BOM as part of the first word; attnkit drops it, so a file saved by a
    Windows editor scores as the same text without it."""
    from sacrebleu.metrics import BLEU

    from attnkit.metrics import corpus_bleu

    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_bytes("\ufeffA dog runs .\nTwo cats\n".encode())
    ref.write_bytes(b"A dog runs .\nTwo cats sleep\n")
    hyps, refs = read_corpus(hyp, [ref])
    assert hyps[0] == "A dog runs ."
    theirs = BLEU().corpus_score(["A dog runs .", "Two cats"], [["A dog runs .", "Two cats sleep"]])
    assert_same_bleu(corpus_bleu(hyps, refs), theirs)
