"""Fixtures of the export tests: a small joint tokenizer, and tiny random translation model
folders built from it (their configs are the test's parameters)."""

from __future__ import annotations

import pytest

from attnkit.data import SubwordTokenizer, load_named_corpus

PAIRS = 300


@pytest.fixture(scope="session")
def tokenizer() -> SubwordTokenizer:
    """A BPE of 600 tokens trained on the first 300 Multi30k training pairs."""
    corpus = load_named_corpus("multi30k", split="train", src_lang="de", tgt_lang="en")
    return SubwordTokenizer.train(corpus.src[:PAIRS] + corpus.tgt[:PAIRS], vocab_size=600)


@pytest.fixture(scope="session")
def pairs(tokenizer) -> list[tuple[str, str]]:
    """24 (German, English) pairs the tiny models have not seen (Multi30k val), each side at
    most 40 tokens (the tiny models' positions hold 128)."""
    val = load_named_corpus("multi30k", split="val", src_lang="de", tgt_lang="en")
    short = [
        (de, en)
        for de, en in zip(val.src, val.tgt, strict=True)
        if max(len(tokenizer.encode(de)), len(tokenizer.encode(en))) <= 40
    ]
    return short[:24]


@pytest.fixture(scope="session")
def sentences(pairs) -> list[str]:
    return [de for de, _ in pairs]
