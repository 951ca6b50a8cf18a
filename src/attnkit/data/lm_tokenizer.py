"""Language-model tokenizers: characters, or a byte-level BPE, both Hugging Face ``tokenizers``.

Both are saved as one ``tokenizer.json`` that ``tokenizers.Tokenizer.from_file`` reads (and so
:meth:`attnkit.models.GPT.from_pretrained`, ``attnkit generate`` and Hugging Face), and both
are exactly reversible: ``decode(encode(text)) == text`` for every string. Neither has special
tokens; a model's ``bos_token_id`` is the newline's id (:func:`newline_id`), so an empty prompt
starts as a new line does and a text is scored from the start of a line.

* :func:`char_tokenizer`: one token per character, as the character-level GPT tutorials
  tokenize. The vocabulary is the characters of the training text (the newline always among
  them), sorted by code point, then the 256 byte tokens ``<0x00>`` ... ``<0xFF>``: a BPE model
  with no merges and byte fallback, after a pre-tokenizer that isolates every character. A
  character never seen in training is encoded as its UTF-8 bytes, never as an unknown token,
  so a model scores any text honestly.
* :func:`byte_bpe_tokenizer`: GPT-2's kind of tokenizer (the ByteLevel pre-tokenizer, BPE
  merges over bytes, the ByteLevel decoder) trained on the text, ``vocab_size`` ids in all,
  its 256 byte symbols included.

Training is deterministic: the same text and settings give the same ``tokenizer.json``.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = [
    "BYTE_TOKENS",
    "LM_TOKENIZERS",
    "byte_bpe_tokenizer",
    "char_tokenizer",
    "newline_id",
    "train_lm_tokenizer",
]

LM_TOKENIZERS = ("char", "bpe")
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))
# Oniguruma (the regex engine of `tokenizers`): (?m) lets "." match a newline too.
_ONE_CHARACTER = Regex("(?m).")


def char_tokenizer(text: str) -> Tokenizer:
    """A character tokenizer whose vocabulary is the characters of ``text`` (module docstring).

    Raises:
        ValueError: If ``text`` is empty.
    """
    if not text:
        raise ValueError("text: expected the training text, got an empty string")
    chars = sorted(set(text) | {"\n"})
    vocab = {c: i for i, c in enumerate(chars)}
    for token in BYTE_TOKENS:
        vocab[token] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(_ONE_CHARACTER, behavior="isolated")
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return tokenizer


def byte_bpe_tokenizer(text: str, vocab_size: int, *, min_frequency: int = 2) -> Tokenizer:
    """A byte-level BPE with ``vocab_size`` ids trained on ``text`` (module docstring).

    Args:
        text: The training text.
        vocab_size: Ids in all, the 256 byte symbols included (at least 257: one merge).
        min_frequency: A merge needs this many occurrences (fewer ids if merges run out).

    Raises:
        ValueError: If ``text`` is empty or ``vocab_size`` leaves no room for a merge.
    """
    if not text:
        raise ValueError("text: expected the training text, got an empty string")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 257:
        raise ValueError(
            f"vocab_size: expected an integer >= 257 (256 bytes and a merge), got {vocab_size!r}"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    # Lines as the training items: the ByteLevel pre-tokenizer never joins across a newline
    # into a word, so the counts are those of the whole text.
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer)
    return tokenizer


def train_lm_tokenizer(
    kind: str, text: str, *, vocab_size: int = 2048, min_frequency: int = 2
) -> Tokenizer:
    """``char_tokenizer(text)`` for ``kind="char"``, ``byte_bpe_tokenizer(...)`` for ``"bpe"``."""
    if kind == "char":
        return char_tokenizer(text)
    if kind == "bpe":
        return byte_bpe_tokenizer(text, vocab_size, min_frequency=min_frequency)
    raise ValueError(f"kind: expected one of {list(LM_TOKENIZERS)}, got {kind!r}")


def newline_id(tokenizer: Tokenizer) -> int | None:
    """The id of ``"\\n"`` alone (a model's bos), or None if it takes more than one id."""
    ids = tokenizer.encode("\n", add_special_tokens=False).ids
    return ids[0] if len(ids) == 1 else None
