"""Text in, text out: tokenization, batching by tokens, decoding, detokenization.

Sentences are sorted by length so that a batch holds sentences of similar length (little
padding, similar output lengths), batched under a token budget, decoded with
:func:`~attnkit.decoding.generate.generate`, and put back in input order. Since decoding is
batch-size invariant, the batching changes the speed, not the output.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from attnkit.decoding.generate import DecodingConfig, generate

logger = logging.getLogger(__name__)


@dataclass
class TranslationOutput:
    """Translations in input order, and which inputs were cut to fit the model.

    Attributes:
        translations: one string per input line ("" for an empty line).
        truncated: 0-based indices of the inputs longer than the model allows.
        max_src_tokens: the source token limit those inputs were cut to.
    """

    translations: list[str]
    truncated: list[int] = field(default_factory=list)
    max_src_tokens: int = 0


def token_batches(lengths: Sequence[int], batch_tokens: int) -> Iterator[list[int]]:
    """Group indices, sorted by length, so that ``rows x longest <= batch_tokens``.

    A single sentence longer than the budget gets a batch of its own. The order is by
    decreasing length (long batches first: memory problems show up at once), ties in input
    order, so the grouping is deterministic.

    Args:
        lengths: per-item length in tokens.
        batch_tokens: the budget of padded source tokens per batch, >= 1.
    """
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens: expected >= 1, got {batch_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batch: list[int] = []
    for i in order:
        longest = lengths[batch[0]] if batch else lengths[i]  # sorted: the first is longest
        if batch and (len(batch) + 1) * longest > batch_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


class Translator:
    """Translate sentences with a model and its tokenizer.

    Args:
        model: a :class:`~attnkit.models.Transformer` (put in eval mode).
        tokenizer: its :class:`~attnkit.data.SubwordTokenizer`.
        config: decoding settings (default: beam 5).
        batch_tokens: padded source tokens per batch (sentences x longest source).
    """

    def __init__(
        self, model, tokenizer, config: DecodingConfig | None = None, *, batch_tokens: int = 4000
    ) -> None:
        if batch_tokens < 1:
            raise ValueError(f"batch_tokens: expected >= 1, got {batch_tokens}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = DecodingConfig() if config is None else config
        self.batch_tokens = batch_tokens
        self.device = next(model.parameters()).device

    @property
    def max_src_tokens(self) -> int:
        """The most subword tokens of a source line; the eos takes the last position."""
        return self.model.config.max_len - 1

    def encode(self, lines: Sequence[str]) -> tuple[list[list[int]], list[int]]:
        """Source ids (eos appended) per line, and the indices of the lines cut to fit."""
        limit = self.max_src_tokens
        eos = self.tokenizer.eos_id
        encoded, truncated = [], []
        for i, ids in enumerate(self.tokenizer.encode_batch(list(lines))):
            if len(ids) > limit:
                truncated.append(i)
                ids = ids[:limit]
            encoded.append([*ids, eos])
        return encoded, truncated

    def translate_ids(self, sources: Sequence[list[int]]) -> list[list[int]]:
        """Best output ids per source (each eos-terminated, as :meth:`encode` makes them)."""
        outputs: list[list[int]] = [[] for _ in sources]
        pad = self.model.config.pad_id
        for batch in token_batches([len(s) for s in sources], self.batch_tokens):
            width = max(len(sources[i]) for i in batch)
            src = torch.full((len(batch), width), pad, dtype=torch.long)  # (B, S)
            for row, i in enumerate(batch):
                src[row, : len(sources[i])] = torch.tensor(sources[i], dtype=torch.long)
            hyps = generate(self.model, src.to(self.device), self.config)
            for i, best in zip(batch, hyps, strict=True):
                outputs[i] = best[0].tokens
        return outputs

    def translate(self, lines: Sequence[str]) -> TranslationOutput:
        """Translate ``lines`` (one sentence each) in order; an empty line gives "".

        Lines longer than the model allows are cut to their first :attr:`max_src_tokens`
        tokens; their indices are reported (and logged at debug level), never raised.
        """
        nonempty = [i for i, line in enumerate(lines) if line != ""]
        sources, cut = self.encode([lines[i] for i in nonempty])
        truncated = [nonempty[j] for j in cut]
        for i in truncated:
            logger.debug("line %d: longer than %d tokens, truncated", i + 1, self.max_src_tokens)
        texts = self.tokenizer.decode_batch(self.translate_ids(sources)) if sources else []
        translations = [""] * len(lines)
        for i, text in zip(nonempty, texts, strict=True):
            translations[i] = text
        return TranslationOutput(translations, truncated, self.max_src_tokens)
