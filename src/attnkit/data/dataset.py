"""Encoded parallel data: the corpus as lists of subword ids, ready for batching."""

from __future__ import annotations

from collections.abc import Iterable

from attnkit.data.tokenizer import SubwordTokenizer


def encode_pairs(
    pairs: Iterable[tuple[str, str]], tokenizer: SubwordTokenizer
) -> list[tuple[list[int], list[int]]]:
    """Encodes text pairs, e.g. a `ParallelCorpus`, into ``(src_ids, tgt_ids)`` pairs.

    The ids carry no bos/eos; `Collator` adds them. The returned list is a valid
    map-style dataset for ``torch.utils.data.DataLoader``.

    Args:
        pairs: ``(source, target)`` sentences.
        tokenizer: The (joint) subword tokenizer.
    """
    pairs = list(pairs)
    src = tokenizer.encode_batch([s for s, _ in pairs])
    tgt = tokenizer.encode_batch([t for _, t in pairs])
    return list(zip(src, tgt, strict=True))
