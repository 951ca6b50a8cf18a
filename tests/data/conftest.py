"""Shared fixtures for the data tests; loaded once per session to keep the run short."""

import pytest

from attnkit.data.corpus import ParallelCorpus, load_named_corpus
from attnkit.data.tokenizer import SubwordTokenizer


@pytest.fixture(scope="session")
def multi30k_train() -> ParallelCorpus:
    return load_named_corpus("multi30k", split="train", src_lang="de", tgt_lang="en")


@pytest.fixture(scope="session")
def small_tokenizer(multi30k_train) -> SubwordTokenizer:
    """Joint BPE with 1000 tokens trained on all of Multi30k train (both sides)."""
    return SubwordTokenizer.train(multi30k_train.src + multi30k_train.tgt, vocab_size=1000)
