"""A joint, exactly reversible BPE subword tokenizer built on Hugging Face `tokenizers`.

``decode(encode(text)) == text`` for every string, so BLEU computed on decoded output is
computed on exactly the text a reference would be written in. Three choices make that hold:

* No normalizer apart from prepending one space, so the first word looks like every other
  word; no Unicode normalisation (NFC would alter decomposed input).
* Pre-tokens are split *before* each space, with the space kept inside the token
  (``" a  b"`` -> ``" a"``, ``" "``, ``" b"``). The decoder concatenates tokens and removes
  the one prepended space. Unlike SentencePiece's ``"▁"`` stand-in, a literal ``"▁"`` in the
  input survives.
* Byte fallback: the 256 tokens ``<0x00>`` ... ``<0xFF>`` are in the vocabulary, so a
  character never seen in training is encoded as its UTF-8 bytes instead of ``<unk>``.

Special tokens have fixed ids (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3) and live in
the model vocabulary only: they are deliberately not registered as `tokenizers` "added
tokens", which would be matched inside raw text (``"<s>"`` typed by a user would become id 1
and break the round trip). `encode` therefore never returns a special id; the batching code
adds bos/eos itself.

Training is deterministic: the same texts and settings give a byte-identical
``tokenizer.json``, so there is no seed to set.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from attnkit.texts import check_ids

logger = logging.getLogger(__name__)

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # position = id
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))
_RESERVED = len(SPECIAL_TOKENS) + len(BYTE_TOKENS)

Ids = Sequence[int] | torch.Tensor


def _set_pipeline(tokenizer: Tokenizer) -> None:
    """Installs the reversible normalizer / pre-tokenizer / decoder (module docstring)."""
    tokenizer.normalizer = normalizers.Prepend(" ")
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_next")
    tokenizer.decoder = decoders.Sequence(
        [decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )


class SubwordTokenizer:
    """Joint BPE subword tokenizer with fixed special ids and exact round trip.

    Args:
        tokenizer: A `tokenizers.Tokenizer` as built by `train` (special tokens at ids
            0-3, byte tokens, reversible pipeline). Use `train` or `load` rather than
            calling this directly.

    Raises:
        ValueError: If ``tokenizer`` does not have the special tokens at their fixed ids.
    """

    pad_id = 0
    bos_id = 1
    eos_id = 2
    unk_id = 3

    def __init__(self, tokenizer: Tokenizer) -> None:
        for expected_id, token in enumerate(SPECIAL_TOKENS):
            got = tokenizer.token_to_id(token)
            if got != expected_id:
                raise ValueError(f"tokenizer has {token!r} at id {got}, expected id {expected_id}")
        self._tokenizer = tokenizer

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2
    ) -> SubwordTokenizer:
        """Learns a joint BPE vocabulary from ``texts`` (pass both languages).

        Args:
            texts: Training sentences; read once.
            vocab_size: Total vocabulary size including the 4 special and 256 byte tokens.
                The result is smaller only when the text has too few pairs occurring at
                least ``min_frequency`` times (a warning is logged).
            min_frequency: A pair must occur this often to be merged.

        Returns:
            The trained tokenizer.

        Raises:
            ValueError: If ``vocab_size`` leaves no room for learned tokens or
                ``min_frequency`` is below 1.
        """
        if vocab_size <= _RESERVED:
            raise ValueError(
                f"vocab_size={vocab_size} must be greater than {_RESERVED} "
                f"(4 special + 256 byte tokens)"
            )
        if min_frequency < 1:
            raise ValueError(f"min_frequency={min_frequency} must be at least 1")
        learned_size = vocab_size - _RESERVED
        raw = Tokenizer(models.BPE())
        _set_pipeline(raw)
        # limit_alphabet: rare characters beyond the budget fall back to bytes.
        trainer = trainers.BpeTrainer(
            vocab_size=learned_size,
            min_frequency=min_frequency,
            limit_alphabet=learned_size,
            show_progress=False,
        )
        raw.train_from_iterator(texts, trainer)
        learned = json.loads(raw.to_str())["model"]
        tokenizer = cls._with_reserved_tokens(learned["vocab"], learned["merges"])
        if tokenizer.vocab_size < vocab_size:
            logger.warning(
                "vocab_size=%d requested but the text only supports %d tokens",
                vocab_size,
                tokenizer.vocab_size,
            )
        return tokenizer

    @classmethod
    def _with_reserved_tokens(
        cls, learned_vocab: dict[str, int], merges: list[list[str]]
    ) -> SubwordTokenizer:
        """Rebuilds a trained BPE with specials at 0-3 and byte tokens at 4-259."""
        # A learned token spelled like a reserved one (only if the text contains "<s>" or
        # "<0x41>" often) would alias it; drop its merge and every merge built on it.
        known = set(SPECIAL_TOKENS) | set(BYTE_TOKENS)
        alphabet = [t for t in sorted(learned_vocab, key=learned_vocab.get) if len(t) == 1]
        vocab = {t: i for i, t in enumerate((*SPECIAL_TOKENS, *BYTE_TOKENS, *alphabet))}
        kept_merges = []
        for left, right in merges:
            merged = left + right
            if left in vocab and right in vocab and merged not in known:
                vocab.setdefault(merged, len(vocab))
                kept_merges.append((left, right))
        bpe = models.BPE(vocab=vocab, merges=kept_merges, unk_token=UNK, byte_fallback=True)
        tokenizer = Tokenizer(bpe)
        _set_pipeline(tokenizer)
        return cls(tokenizer)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the tokenizer as one JSON file (conventionally ``tokenizer.json``).

        Args:
            path: File to write; its folder must exist.
        """
        self._tokenizer.save(os.fspath(path))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SubwordTokenizer:
        """Reads a tokenizer written by `save`.

        Args:
            path: The JSON file.

        Raises:
            ValueError: If the file does not exist, is not a tokenizer ``tokenizers`` can read
                (damaged, cut short), or has the wrong special ids; naming the file.
        """
        if not Path(path).is_file():
            raise ValueError(f"path={os.fspath(path)!r} is not a file, expected a tokenizer.json")
        try:
            tokenizer = Tokenizer.from_file(os.fspath(path))
        except Exception as err:  # tokenizers raises a bare Exception for malformed JSON
            raise ValueError(f"{os.fspath(path)}: not a readable tokenizer ({err})") from None
        try:
            return cls(tokenizer)
        except ValueError as err:  # another tokenizer's special ids
            raise ValueError(f"{os.fspath(path)}: {err}") from None

    def with_bpe_dropout(self, p: float) -> SubwordTokenizer:
        """A copy that drops each BPE merge with probability ``p`` while encoding
        (BPE-dropout, Provilkov et al. 2020: the same text gets a different segmentation each
        time, a regulariser for training data; ``tokenizers``' own implementation, seeded by
        its own random source, not by torch's). ``decode`` of its ids gives the text back
        exactly, as for ``self``; ``p == 0`` returns ``self``.

        Raises:
            ValueError: If ``p`` is not in [0, 1).
        """
        if not (isinstance(p, (int, float)) and 0.0 <= p < 1.0):
            raise ValueError(f"bpe_dropout: expected a probability in [0, 1), got {p!r}")
        if p == 0.0:
            return self
        copy = Tokenizer.from_str(self._tokenizer.to_str())
        copy.model.dropout = float(p)
        return SubwordTokenizer(copy)

    def to_json(self) -> str:
        """Returns the serialised tokenizer (the content `save` writes)."""
        return self._tokenizer.to_str()

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials and byte tokens included; the embedding size."""
        return self._tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Encodes one sentence into subword ids, without bos/eos."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encodes many sentences (in parallel threads); see `encode`."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def tokens(self, text: str) -> list[str]:
        """Returns the subword strings of ``text``, for inspection."""
        return self._tokenizer.encode(text, add_special_tokens=False).tokens

    def id_to_token(self, token_id: int) -> str | None:
        """Returns the string of one id, or None if out of range."""
        return self._tokenizer.id_to_token(token_id)

    def _strip_specials(self, ids: Ids) -> list[int]:
        """Cuts at the first eos and drops pad, bos and unk, after checking that ``ids`` are
        integer ids of the vocabulary (a float id is refused, not rounded; one outside the
        vocabulary is refused, not dropped)."""
        out = []
        for i in check_ids(ids, self._tokenizer.get_vocab_size(with_added_tokens=True)):
            if i == self.eos_id:
                break
            if i > self.unk_id:
                out.append(i)
        return out

    def decode(self, ids: Ids) -> str:
        """Decodes ids back to text.

        Stops at the first eos; pad, bos and unk are skipped (``encode`` never produces
        unk, thanks to byte fallback). Byte tokens that do not form valid UTF-8 decode to
        U+FFFD.

        Args:
            ids: A list or 1-D tensor of ids, e.g. a row of decoder output.
        """
        return self._tokenizer.decode(self._strip_specials(ids), skip_special_tokens=False)

    def decode_batch(self, batch: Sequence[Ids] | torch.Tensor) -> list[str]:
        """Decodes many id sequences (a list of lists or a 2-D tensor); see `decode`."""
        rows = [self._strip_specials(ids) for ids in batch]
        return self._tokenizer.decode_batch(rows, skip_special_tokens=False)
