"""Parallel corpora: two aligned text files, one sentence a line.

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
"""

from __future__ import annotations

import importlib.resources
import os
from collections.abc import Iterator
from dataclasses import dataclass

from attnkit.metrics.io import read_lines

__all__ = [
    "NAMED_CORPORA",
    "NamedCorpus",
    "ParallelCorpus",
    "load_named_corpus",
    "load_parallel",
    "read_lines",
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
    src_path: str | os.PathLike[str], tgt_path: str | os.PathLike[str]
) -> ParallelCorpus:
    """Reads a parallel corpus from two aligned files (see `read_lines`).

    Args:
        src_path: Source-language file, plain or gzipped.
        tgt_path: Target-language file, plain or gzipped.

    Returns:
        The aligned sentences.

    Raises:
        ValueError: If a file cannot be read as text (see `read_lines`), is empty, or the
            two files have different line counts.
    """
    src = read_lines(src_path)
    tgt = read_lines(tgt_path)
    for arg, path, lines in (("src_path", src_path, src), ("tgt_path", tgt_path, tgt)):
        if not lines:
            raise ValueError(f"{arg}={os.fspath(path)!r} is empty, expected one sentence a line")
    if len(src) != len(tgt):
        raise ValueError(
            f"src_path={os.fspath(src_path)!r} has {len(src)} lines but "
            f"tgt_path={os.fspath(tgt_path)!r} has {len(tgt)} lines; expected the same count"
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
