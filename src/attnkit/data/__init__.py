"""Data for training: corpora and texts, tokenizers, token batches, collation.

Translation, end to end::

    corpus = load_named_corpus("multi30k", split="train", src_lang="de", tgt_lang="en")
    tokenizer = SubwordTokenizer.train(corpus.src + corpus.tgt, vocab_size=8000)
    pairs = encode_pairs(corpus, tokenizer)
    sampler = TokenBatchSampler(pairs, max_tokens=4096, max_len=128, seed=0)
    loader = DataLoader(pairs, batch_sampler=sampler,
                        collate_fn=Collator.for_tokenizer(tokenizer))

A language model, end to end::

    text = load_named_text("shakespeare", split="train")
    tokenizer = char_tokenizer(text)  # or byte_bpe_tokenizer(text, vocab_size=2048)
    ids = torch.tensor(tokenizer.encode(text).ids)
    windows = RandomWindows(ids, context=128, batch_size=32, seed=0)
"""

from attnkit.data.batching import TokenBatchSampler, pair_length
from attnkit.data.collate import Batch, Collator, iter_batches
from attnkit.data.corpus import (
    NAMED_CORPORA,
    NAMED_TEXTS,
    NamedCorpus,
    ParallelCorpus,
    load_named_corpus,
    load_named_text,
    load_parallel,
    read_lines,
    read_text,
)
from attnkit.data.dataset import encode_pairs
from attnkit.data.lm import LMBatch, RandomWindows, eval_batches, eval_windows
from attnkit.data.lm_tokenizer import (
    byte_bpe_tokenizer,
    char_tokenizer,
    newline_id,
    train_lm_tokenizer,
)
from attnkit.data.synthetic import copy_task_ids, copy_task_pairs, pseudo_word
from attnkit.data.tokenizer import SubwordTokenizer

__all__ = [
    "NAMED_CORPORA",
    "NAMED_TEXTS",
    "Batch",
    "Collator",
    "LMBatch",
    "NamedCorpus",
    "ParallelCorpus",
    "RandomWindows",
    "SubwordTokenizer",
    "TokenBatchSampler",
    "byte_bpe_tokenizer",
    "char_tokenizer",
    "copy_task_ids",
    "copy_task_pairs",
    "encode_pairs",
    "eval_batches",
    "eval_windows",
    "iter_batches",
    "load_named_corpus",
    "load_named_text",
    "load_parallel",
    "newline_id",
    "pair_length",
    "pseudo_word",
    "read_lines",
    "read_text",
    "train_lm_tokenizer",
]
