"""BERT's WordPiece tokenizer, read from a Hugging Face ``tokenizer.json``.

The file carries the whole pipeline (BERT normaliser with lower-casing for uncased models,
BERT pre-tokeniser, WordPiece, the ``[CLS] ... [SEP]`` template), so this class only adds
batching: padding to the longest text of the batch, attention masks, and truncation to
``max_length`` tokens with a warning. Padding and truncation settings saved inside the file
(all-MiniLM-L6-v2's pads every text to 128) are replaced by these.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import Tensor

from attnkit.texts import check_ids, check_texts

logger = logging.getLogger(__name__)


class BertTokenizer:
    """Batches of texts -> ``input_ids``, ``attention_mask``, ``token_type_ids`` (B, T).

    Args:
        tokenizer: a `tokenizers.Tokenizer` with BERT's pipeline.
        max_length: the most tokens per text, ``[CLS]`` and ``[SEP]`` included.
        pad_token: the padding token (it must be in the vocabulary).
    """

    def __init__(self, tokenizer: Tokenizer, *, max_length: int = 512, pad_token: str = "[PAD]"):
        if max_length < 2:
            raise ValueError(f"max_length: expected at least 2 ([CLS] and [SEP]), got {max_length}")
        pad_id = tokenizer.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"pad_token: {pad_token!r} is not in the tokenizer's vocabulary")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.pad_token = pad_token
        self.pad_id = pad_id
        tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)  # to the longest text
        tokenizer.enable_truncation(max_length=max_length)

    @classmethod
    def from_file(cls, path: str | Path, *, max_length: int = 512) -> BertTokenizer:
        """Read a ``tokenizer.json``; the pad token is the one the file names, else [PAD]."""
        path = Path(path)
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises a bare Exception for missing/bad files
            raise ValueError(f"{path}: not a readable tokenizer.json ({err})") from None
        padding = tokenizer.padding or {}
        return cls(tokenizer, max_length=max_length, pad_token=padding.get("pad_token", "[PAD]"))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def __call__(self, texts: Sequence[str]) -> dict[str, Tensor]:
        """Tokenise a batch.

        Returns:
            ``input_ids``, ``attention_mask`` (1 = real token) and ``token_type_ids``, each
            (B, T) int64 with T the longest text's length (at most ``max_length``).

        Raises:
            TypeError, ValueError: for ``texts`` that :func:`check_texts` refuses.
        """
        encodings = self.tokenizer.encode_batch(check_texts(texts, "texts"))
        truncated = sum(1 for e in encodings if e.overflowing)
        if truncated:
            logger.warning(
                "truncated %d of %d texts to max_length=%d tokens",
                truncated,
                len(encodings),
                self.max_length,
            )
        return {
            "input_ids": torch.tensor([e.ids for e in encodings], dtype=torch.long),
            "attention_mask": torch.tensor([e.attention_mask for e in encodings], dtype=torch.long),
            "token_type_ids": torch.tensor([e.type_ids for e in encodings], dtype=torch.long),
        }  # (B, T) each

    def decode(self, ids: Sequence[int] | Tensor, *, skip_special_tokens: bool = True) -> str:
        """Token ids -> text (WordPiece ``##`` pieces joined).

        Raises:
            ValueError: for an id that is not an integer of the vocabulary (never dropped, as
                the tokenizer alone would; :func:`attnkit.texts.check_ids`).
        """
        ids = check_ids(ids, self.vocab_size)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
