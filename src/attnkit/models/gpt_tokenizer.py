"""GPT-2's byte-level BPE tokenizer, read from a Hugging Face ``tokenizer.json``.

The file carries the whole pipeline (byte-level pre-tokeniser, BPE merges, byte-level
decoder), so ``decode(encode(text)) == text`` for any string. This class adds what a language
model needs around it: no special tokens added on encoding, the end-of-text id from the
model's config, and batches padded to one length with an attention mask (on the left by
default, so every row's last prompt token is in the last column).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import Tensor

from attnkit.texts import check_ids


class GPTTokenizer:
    """Text <-> token ids for a GPT model.

    Args:
        tokenizer: a `tokenizers.Tokenizer` (GPT-2's byte-level BPE, or any other).
        eos_id: the end-of-text id (Hugging Face ``eos_token_id``), if the model has one.
    """

    def __init__(self, tokenizer: Tokenizer, *, eos_id: int | None = None) -> None:
        vocab = tokenizer.get_vocab_size(with_added_tokens=True)
        if vocab == 0:  # every text would encode to nothing
            raise ValueError("tokenizer: an empty vocabulary, no token to encode text with")
        if eos_id is not None and not 0 <= eos_id < vocab:
            raise ValueError(f"eos_id: expected an id in [0, {vocab}), got {eos_id}")
        self.tokenizer = tokenizer
        self.eos_id = eos_id

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, eos_id: int | None = None) -> GPTTokenizer:
        """Read a ``tokenizer.json``."""
        path = Path(path)
        try:
            tokenizer = Tokenizer.from_file(os.fspath(path))
        except Exception as err:  # tokenizers raises a bare Exception for missing/bad files
            raise ValueError(f"{path}: not a readable tokenizer.json ({err})") from None
        # Settings saved in the file would pad or cut encode(); batch() pads itself.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        try:
            return cls(tokenizer, eos_id=eos_id)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ``tokenizer.json``."""
        self.tokenizer.save(os.fspath(path))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, got {type(text).__name__}")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int] | Tensor, *, skip_special_tokens: bool = False) -> str:
        """Token ids -> text.

        Raises:
            ValueError: for an id that is not an integer of the vocabulary (never dropped or
                rounded; :func:`attnkit.texts.check_ids`).
        """
        ids = check_ids(ids, self.vocab_size)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def batch(self, texts: Sequence[str], *, padding_side: str = "left") -> tuple[Tensor, Tensor]:
        """Encode and pad a batch.

        Args:
            texts: the texts; each must give at least one token.
            padding_side: ``"left"`` (for generation) or ``"right"``.

        Returns:
            ``(ids, attention_mask)``: (B, T) long ids (padding is ``eos_id``, or 0) and
            (B, T) bool, True = real token.
        """
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts: expected a sequence of str")
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side: expected 'left' or 'right', got {padding_side!r}")
        if not texts:
            raise ValueError("texts: expected at least one text, got none")
        rows = [self.encode(t) for t in texts]
        empty = [i for i, r in enumerate(rows) if not r]
        if empty:
            raise ValueError(f"texts: entries {empty} encode to no tokens")
        width = max(len(r) for r in rows)
        pad = 0 if self.eos_id is None else self.eos_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, row in enumerate(rows):
            cols = slice(width - len(row), width) if padding_side == "left" else slice(0, len(row))
            ids[i, cols] = torch.tensor(row, dtype=torch.long)
            mask[i, cols] = True
        return ids, mask
