"""The texts and encoded pairs of a run, as its ``[data]`` section describes them; source
lines cleaned as the Translator cleans them (:func:`~attnkit.decoding.normalize_source`)."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from attnkit.data import (
    ParallelCorpus,
    SubwordTokenizer,
    copy_task_pairs,
    encode_pairs,
    load_named_corpus,
    load_parallel,
)
from attnkit.decoding.translate import normalize_source
from attnkit.metrics.io import STDIN
from attnkit.training.config import COPY_CORPUS, DataConfig

logger = logging.getLogger(__name__)

Pairs = list[tuple[list[int], list[int]]]


@dataclass(frozen=True)
class TextData:
    """Training and (optional) validation sentences."""

    train: ParallelCorpus
    val: ParallelCorpus | None


def load_text(cfg: DataConfig) -> TextData:
    """Reads the corpus named by ``cfg.corpus``, the synthetic copy task, or two file pairs."""
    if cfg.corpus == COPY_CORPUS:

        def copy_corpus(n: int, seed: int) -> ParallelCorpus:
            pairs = copy_task_pairs(n, cfg.copy_words, cfg.copy_min_len, cfg.copy_max_len, seed)
            return ParallelCorpus(src=[s for s, _ in pairs], tgt=[t for _, t in pairs])

        train = copy_corpus(cfg.copy_train_pairs, cfg.seed)
        val = copy_corpus(cfg.copy_val_pairs, cfg.seed + 1) if cfg.copy_val_pairs else None
    elif cfg.corpus:
        langs = dict(name=cfg.corpus, src_lang=cfg.src_lang, tgt_lang=cfg.tgt_lang)
        train = load_named_corpus(split=cfg.train_split, **langs)
        val = load_named_corpus(split=cfg.val_split, **langs) if cfg.val_split else None
    else:
        # errors name the config keys, as check_files does
        train = load_parallel(cfg.train_src, cfg.train_tgt, names=_keys("train"))
        val = load_parallel(cfg.val_src, cfg.val_tgt, names=_keys("val")) if cfg.val_src else None
    # The source side as the Translator will give it to the model (white space collapsed,
    # control characters and byte-order marks gone): no subword or weight is spent on what
    # inference never shows it.
    if cfg.clean_sources:
        train, val = (None if c is None else _clean_sources(c) for c in (train, val))
    if cfg.max_train_pairs and len(train) > cfg.max_train_pairs:
        n = cfg.max_train_pairs
        train = ParallelCorpus(src=train.src[:n], tgt=train.tgt[:n])
    logger.info(
        "data: %d training pairs, %d validation pairs (%s)",
        len(train),
        0 if val is None else len(val),
        cfg.corpus or f"{cfg.train_src}, {cfg.train_tgt}",
    )
    return TextData(train=train, val=val)


def _clean_sources(corpus: ParallelCorpus) -> ParallelCorpus:
    return ParallelCorpus(src=[normalize_source(s) for s in corpus.src], tgt=corpus.tgt)


def _keys(split: str) -> tuple[str, str]:
    return f"data.{split}_src", f"data.{split}_tgt"


def check_files(files: Mapping[str, str]) -> None:
    """Checks that each data file can be opened, before the run folder is made.

    Args:
        files: Config key (``"data.train_src"``) -> file name; ``""`` (no file) and ``-``
            (standard input) are skipped. Only regular files are opened (a named pipe would
            wait for a writer); what the files hold is checked when they are read.

    Raises:
        ValueError: Naming the key and the file, if it is missing, a directory or unreadable.
    """
    for key, name in files.items():
        if not name or name == STDIN:
            continue
        try:
            mode = os.stat(name).st_mode
            if stat.S_ISREG(mode):
                open(name, "rb").close()
        except OSError as err:
            raise ValueError(f"{key}: cannot read {name!r} ({err.strerror or err})") from None
        if stat.S_ISDIR(mode):
            raise ValueError(f"{key}: {name!r} is a directory, expected a text file")


def train_tokenizer(text: TextData, cfg: DataConfig) -> SubwordTokenizer:
    """A joint BPE over both sides of the training text."""
    tokenizer = SubwordTokenizer.train(
        text.train.src + text.train.tgt, cfg.vocab_size, min_frequency=cfg.min_frequency
    )
    logger.info("tokenizer: joint BPE with %d tokens", tokenizer.vocab_size)
    return tokenizer


def encode(corpus: ParallelCorpus | None, tokenizer: SubwordTokenizer) -> Pairs:
    """Subword id pairs without bos/eos (empty for no corpus)."""
    return [] if corpus is None else encode_pairs(corpus, tokenizer)
