"""Corpora: parallel text (two aligned files, one sentence a line) and plain text for
language models.

Any corpus is read from two plain or gzip-compressed UTF-8 files where line ``i`` of the
source file translates line ``i`` of the target file. The Multi30k German-English corpus
ships with the package and is read by name::

    corpus = load_named_corpus("multi30k", split="train", src_lang="de", tgt_lang="en")
    src, tgt = corpus[0]

Files are read with :func:`attnkit.metrics.io.read_lines`, the one reader of text files
(gzip, byte-order mark, CRLF and UTF-8 errors are handled there): only the line terminator
(``"\\n"`` or ``"\\r\\n"``) is removed; every other character, including leading, trailing
and repeated spaces, is kept so that detokenized output can be scored against the references
exactly as they are.

Plain text for a language model (:func:`read_text`, :func:`load_named_text`) is the same
lines, each ended by ``"\\n"``. The works of Shakespeare ship with the package
(``attnkit/data/shakespeare/``, its README says what they are)::

    train = load_named_text("shakespeare", split="train")  # 38 works, 4.47 M characters
"""

from __future__ import annotations

import importlib.resources
import os
from collections.abc import Iterator
from dataclasses import dataclass

from attnkit.metrics.io import read_lines

__all__ = [
    "NAMED_CORPORA",
    "NAMED_TEXTS",
    "NamedCorpus",
    "NamedText",
    "ParallelCorpus",
    "load_named_corpus",
    "load_named_text",
    "load_parallel",
    "read_lines",
    "read_text",
]


@dataclass(frozen=True)
class ParallelCorpus:
    """Aligned source and target sentences.

    Attributes:
        src: Source sentences, one per pair.
        tgt: Target sentences, ``tgt[i]`` translates ``src[i]``.
    """

    src: list[str]
    tgt: list[str]

    def __post_init__(self) -> None:
        if len(self.src) != len(self.tgt):
            raise ValueError(
                f"src and tgt must have the same length, got {len(self.src)} and {len(self.tgt)}"
            )

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, index: int) -> tuple[str, str]:
        return self.src[index], self.tgt[index]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return zip(self.src, self.tgt, strict=True)


@dataclass(frozen=True)
class NamedCorpus:
    """A corpus shipped in the package, in ``attnkit/data/<directory>/``.

    Attributes:
        directory: Folder name inside ``attnkit.data``.
        languages: Language codes; each split has one file per language.
        splits: Split name -> file stem; the file is ``<stem>.<lang>.gz``.
    """

    directory: str
    languages: tuple[str, ...]
    splits: dict[str, str]


NAMED_CORPORA: dict[str, NamedCorpus] = {
    "multi30k": NamedCorpus(
        directory="multi30k",
        languages=("de", "en"),
        splits={"train": "train", "val": "val", "test2016": "test_2016_flickr"},
    ),
}


def load_parallel(
    src_path: str | os.PathLike[str],
    tgt_path: str | os.PathLike[str],
    *,
    names: tuple[str, str] = ("src_path", "tgt_path"),
) -> ParallelCorpus:
    """Reads a parallel corpus from two aligned files (see `read_lines`).

    Args:
        src_path: Source-language file, plain or gzipped.
        tgt_path: Target-language file, plain or gzipped.
        names: what the errors call the two files: the arguments, or the options a command
            read them from (``("--src", "--ref")``).

    Returns:
        The aligned sentences.

    Raises:
        ValueError: If a file cannot be read as text (see `read_lines`), is empty or holds
            only blank lines, or the two files have different line counts.
    """
    src = read_lines(src_path)
    tgt = read_lines(tgt_path)
    src_name, tgt_name = (
        f"{name} {os.fspath(path)!r}" if name.startswith("-") else f"{name}={os.fspath(path)!r}"
        for name, path in zip(names, (src_path, tgt_path), strict=True)
    )
    for name, lines in ((src_name, src), (tgt_name, tgt)):
        if not lines:
            raise ValueError(f"{name} is empty, expected one sentence a line")
        if not any(line.strip() for line in lines):
            raise ValueError(
                f"{name} holds only blank lines ({len(lines):,}), expected one sentence a line"
            )
    if len(src) != len(tgt):
        raise ValueError(
            f"{src_name} has {len(src)} lines but {tgt_name} has {len(tgt)} lines; expected the "
            "same count"
        )
    return ParallelCorpus(src=src, tgt=tgt)


def load_named_corpus(
    name: str = "multi30k", split: str = "train", src_lang: str = "de", tgt_lang: str = "en"
) -> ParallelCorpus:
    """Reads a split of a corpus shipped with the package, in either direction.

    Args:
        name: Corpus name, a key of `NAMED_CORPORA`.
        split: Split name, e.g. ``"train"``, ``"val"`` or ``"test2016"`` for Multi30k.
        src_lang: Source language code.
        tgt_lang: Target language code, different from ``src_lang``.

    Returns:
        The aligned sentences.

    Raises:
        ValueError: If the corpus, split or a language is unknown (the message lists the
            known ones) or ``src_lang == tgt_lang``.
    """
    if name not in NAMED_CORPORA:
        raise ValueError(
            f"name={name!r} is not a known corpus, expected one of {sorted(NAMED_CORPORA)}"
        )
    spec = NAMED_CORPORA[name]
    if split not in spec.splits:
        raise ValueError(
            f"split={split!r} is not a split of corpus {name!r}, expected one of {list(spec.splits)}"
        )
    for arg, lang in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if lang not in spec.languages:
            raise ValueError(
                f"{arg}={lang!r} is not a language of corpus {name!r}, "
                f"expected one of {list(spec.languages)}"
            )
    if src_lang == tgt_lang:
        raise ValueError(
            f"src_lang={src_lang!r} and tgt_lang={tgt_lang!r} must differ for corpus {name!r}"
        )
    folder = importlib.resources.files(__package__) / spec.directory
    stem = spec.splits[split]
    with (
        importlib.resources.as_file(folder / f"{stem}.{src_lang}.gz") as src_path,
        importlib.resources.as_file(folder / f"{stem}.{tgt_lang}.gz") as tgt_path,
    ):
        return load_parallel(src_path, tgt_path)


# --------------------------------------------------------------------------- plain text


@dataclass(frozen=True)
class NamedText:
    """A plain-text corpus shipped in the package, in ``attnkit/data/<directory>/``.

    Attributes:
        directory: Folder name inside ``attnkit.data``.
        splits: Split name -> file name (UTF-8, gzipped).
    """

    directory: str
    splits: dict[str, str]


NAMED_TEXTS: dict[str, NamedText] = {
    "shakespeare": NamedText(
        directory="shakespeare", splits={"train": "train.txt.gz", "val": "val.txt.gz"}
    ),
}


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 text file (plain or gzipped; ``-`` = standard input) as one string: its lines
    as :func:`read_lines` reads them, each ended by ``"\\n"`` (CRLF becomes LF, a byte-order
    mark is dropped, a last line without a newline gets one).

    Raises:
        FileNotFoundError, PermissionError: as :func:`open` raises them.
        ValueError: If the file is a directory, a damaged gzip file or not UTF-8 (naming the
            file, the line and the byte offset).
    """
    return "".join(line + "\n" for line in read_lines(path))


def load_named_text(name: str = "shakespeare", split: str = "train") -> str:
    """The text of a split of a plain-text corpus shipped with the package.

    Raises:
        ValueError: If the corpus or split is unknown (the message lists the known ones).
    """
    if name not in NAMED_TEXTS:
        raise ValueError(
            f"name={name!r} is not a known text corpus, expected one of {sorted(NAMED_TEXTS)}"
        )
    spec = NAMED_TEXTS[name]
    if split not in spec.splits:
        raise ValueError(
            f"split={split!r} is not a split of corpus {name!r}, expected one of {list(spec.splits)}"
        )
    resource = importlib.resources.files(__package__) / spec.directory / spec.splits[split]
    with importlib.resources.as_file(resource) as path:
        return read_text(path)
