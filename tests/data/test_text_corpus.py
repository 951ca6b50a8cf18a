"""Plain-text corpora: the shipped works of Shakespeare and text files."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest

from attnkit.data.corpus import load_named_text, read_text

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "shakespeare"


def test_shakespeare_ships_train_and_val_as_the_readme_says():
    train, val = load_named_text("shakespeare", "train"), load_named_text("shakespeare", "val")
    assert (len(train), len(val)) == (4_470_860, 218_307)  # the README's byte counts (ASCII)
    assert train.isascii() and val.isascii()
    assert val.startswith("MACBETH\n") and "TWELFTH NIGHT; OR, WHAT YOU WILL" in val


@pytest.mark.skipif(not SHARED.is_dir(), reason="the reference copy is outside the package")
@pytest.mark.parametrize("split", ["train", "val"])
def test_the_shipped_text_is_the_reference_file(split):
    reference = gzip.decompress((SHARED / f"{split}.txt.gz").read_bytes()).decode("ascii")
    got = load_named_text("shakespeare", split)
    assert hashlib.sha256(got.encode()).digest() == hashlib.sha256(reference.encode()).digest()


def test_read_text_ends_every_line_and_reads_gzip(tmp_path):
    plain = tmp_path / "a.txt"
    plain.write_bytes(b"\xef\xbb\xbfone\r\ntwo\nthree")
    assert read_text(plain) == "one\ntwo\nthree\n"
    packed = tmp_path / "b.txt.gz"
    packed.write_bytes(gzip.compress("ü\n".encode()))
    assert read_text(packed) == "ü\n"
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xff\n")
    with pytest.raises(ValueError, match=r"line 2 is not valid UTF-8"):
        read_text(tmp_path / "bad.txt")


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match=r"not a known text corpus, expected one of \['shake"):
        load_named_text("tiny", "train")
    with pytest.raises(ValueError, match=r"expected one of \['train', 'val'\]"):
        load_named_text("shakespeare", "test")
