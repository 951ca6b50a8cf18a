"""Data for translation training: corpora, subword tokenizer, token batches, collation.

The pipeline, end to end::

    corpus = load_named_corpus("multi30k", split="train", src_lang="de", tgt_lang="en")
    tokenizer = SubwordTokenizer.train(corpus.src + corpus.tgt, vocab_size=8000)
    pairs = encode_pairs(corpus, tokenizer)
    sampler = TokenBatchSampler(pairs, max_tokens=4096, max_len=128, seed=0)
    loader = DataLoader(pairs, batch_sampler=sampler,
                        collate_fn=Collator.for_tokenizer(tokenizer))
"""

from attnkit.data.batching import TokenBatchSampler, pair_length
from attnkit.data.collate import Batch, Collator, iter_batches
from attnkit.data.corpus import (
    NAMED_CORPORA,
    NamedCorpus,
    ParallelCorpus,
    load_named_corpus,
    load_parallel,
    read_lines,
)
from attnkit.data.dataset import encode_pairs
from attnkit.data.synthetic import copy_task_ids, copy_task_pairs, pseudo_word
from attnkit.data.tokenizer import SubwordTokenizer

__all__ = [
    "NAMED_CORPORA",
    "Batch",
    "Collator",
    "NamedCorpus",
    "ParallelCorpus",
    "SubwordTokenizer",
    "TokenBatchSampler",
    "copy_task_ids",
    "copy_task_pairs",
    "encode_pairs",
    "iter_batches",
    "load_named_corpus",
    "load_parallel",
    "pair_length",
    "pseudo_word",
    "read_lines",
]
