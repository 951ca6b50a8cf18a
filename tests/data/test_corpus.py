"""Tests for attnkit.data.corpus: reading parallel text, the shipped Multi30k, errors."""

import gzip
import re

import pytest

from attnkit.data.corpus import NAMED_CORPORA, load_named_corpus, load_parallel, read_lines

# Counts from the Multi30k README (and the upstream repository); first lines read off the
# raw files with zcat.
MULTI30K_LINES = {"train": 29000, "val": 1014, "test2016": 1000}
FIRST_LINES = {
    "train": (
        "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
        "Two young, White males are outside near many bushes.",
    ),
    "val": (
        "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen",
        "A group of men are loading cotton onto a truck",
    ),
    "test2016": (
        "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
        "A man in an orange hat starring at something.",
    ),
}


def write(path, data: bytes, compress: bool = False):
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


@pytest.mark.parametrize("compress", [False, True])
def test_read_lines_strips_only_the_terminator(tmp_path, compress):
    data = "  lead\r\ntrail  \n\n\ttab\u00a0x\r\n é ▁ \rmid\nlast".encode()
    path = write(tmp_path / "a.txt", data, compress)
    assert read_lines(path) == ["  lead", "trail  ", "", "\ttab\u00a0x", " é ▁ \rmid", "last"]


def test_read_lines_final_newline_adds_no_line(tmp_path):
    assert read_lines(write(tmp_path / "a", b"x\ny\n")) == ["x", "y"]
    assert read_lines(write(tmp_path / "b", b"\n")) == [""]


def test_read_lines_detects_gzip_by_content_not_name(tmp_path):
    path = write(tmp_path / "plain_name.txt", "ä\nb\n".encode(), compress=True)
    assert read_lines(path) == ["ä", "b"]


def test_load_parallel_plain_and_gzip(tmp_path):
    src = write(tmp_path / "x.de", "Ein Hündchen.\nZwei  Katzen.\n".encode())
    tgt = write(tmp_path / "x.en.gz", b"A dog.\nTwo  cats.\n", compress=True)
    corpus = load_parallel(src, tgt)
    assert len(corpus) == 2
    assert corpus.src == ["Ein Hündchen.", "Zwei  Katzen."]
    assert corpus[1] == ("Zwei  Katzen.", "Two  cats.")
    assert list(corpus) == [("Ein Hündchen.", "A dog."), ("Zwei  Katzen.", "Two  cats.")]


def test_load_parallel_line_count_mismatch_names_both_files(tmp_path):
    src = write(tmp_path / "s.txt", b"a\nb\nc\n")
    tgt = write(tmp_path / "t.txt", b"a\nb\n")
    with pytest.raises(ValueError) as err:
        load_parallel(src, tgt)
    message = str(err.value)
    assert str(src) in message and str(tgt) in message
    assert "3 lines" in message and "2 lines" in message


def test_non_utf8_names_file_and_line(tmp_path):
    path = write(tmp_path / "bad.txt", "ok\nfine ü\nbad \xe9 latin-1\n".encode("latin-1"))
    # "fine ü" in latin-1 is already invalid UTF-8 on line 2.
    with pytest.raises(ValueError, match=re.escape(str(path)) + r".*line 2\b"):
        read_lines(path)
    path = write(tmp_path / "bad.gz", b"ok\nok\n\xff\n", compress=True)
    with pytest.raises(ValueError, match=re.escape(str(path)) + r".*UTF-8.*line 3\b"):
        load_parallel(write(tmp_path / "good.txt", b"a\nb\nc\n"), path)


@pytest.mark.parametrize("compress", [False, True])
def test_empty_file_names_file(tmp_path, compress):
    path = write(tmp_path / "empty.txt", b"", compress)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*empty"):
        load_parallel(path, path)


def test_a_file_of_blank_lines_names_file(tmp_path):
    """Before: accepted, and a run trained on empty pairs (exit status 0)."""
    (tmp_path / "blank.de").write_text("\n \n\t\n")
    (tmp_path / "ok.en").write_text("a\nb\nc\n")
    with pytest.raises(ValueError, match=r"blank.de' holds only blank lines \(3\), expected one"):
        load_parallel(tmp_path / "blank.de", tmp_path / "ok.en")
    with pytest.raises(ValueError, match=r"blank.de' holds only blank lines"):
        load_parallel(tmp_path / "ok.en", tmp_path / "blank.de")
    (tmp_path / "some.de").write_text("\nx\n\n")  # blank lines among sentences: kept
    assert load_parallel(tmp_path / "some.de", tmp_path / "ok.en").src == ["", "x", ""]


def test_damaged_gzip_names_file(tmp_path):
    path = write(tmp_path / "cut.gz", gzip.compress(b"hello\n" * 100)[:20])
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*gzip"):
        read_lines(path)


@pytest.mark.parametrize("split", sorted(MULTI30K_LINES))
def test_multi30k_splits_both_directions(split):
    de_en = load_named_corpus("multi30k", split=split, src_lang="de", tgt_lang="en")
    en_de = load_named_corpus("multi30k", split=split, src_lang="en", tgt_lang="de")
    assert len(de_en) == len(en_de) == MULTI30K_LINES[split]
    assert de_en[0] == FIRST_LINES[split]
    assert en_de.src == de_en.tgt and en_de.tgt == de_en.src


def test_multi30k_keeps_spaces_and_tabs():
    corpus = load_named_corpus()  # defaults: multi30k train de->en
    # Raw line 5909 of train.de ends with a space; line 7366 holds a tab (zcat | sed -n).
    assert corpus.src[5908] == "Ein junger Mann springt mitten in der Luft auf einem Trampolin. "
    assert "\t" in corpus.src[7365]
    assert corpus.tgt[5908] == "This is a young man jumping midair on a trampoline."


def test_multi30k_ships_readme_with_citation():
    import importlib.resources

    readme = (importlib.resources.files("attnkit.data") / "multi30k" / "README.md").read_text()
    assert "Elliott" in readme and "doi:10.18653/v1/W16-3210" in readme


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"name": "wmt14"}, r"name='wmt14'.*\['multi30k'\]"),
        ({"split": "test"}, r"split='test'.*\['train', 'val', 'test2016'\]"),
        ({"src_lang": "fr"}, r"src_lang='fr'.*\['de', 'en'\]"),
        ({"tgt_lang": "cs"}, r"tgt_lang='cs'.*\['de', 'en'\]"),
        ({"src_lang": "en", "tgt_lang": "en"}, r"src_lang='en'.*tgt_lang='en'.*differ"),
    ],
)
def test_named_corpus_unknown_values_list_known_ones(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        load_named_corpus(**kwargs)


def test_named_corpora_registry_is_consistent():
    assert set(NAMED_CORPORA["multi30k"].splits) == set(MULTI30K_LINES)
