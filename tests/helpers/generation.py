"""Generation test helpers: a tiny random GPT-2 folder read by both Hugging Face and attnkit,
a byte-level BPE that splits CJK characters and emoji over several ids, and a tokenizer with
one id per UTF-8 byte."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer

from attnkit.models import GPT, GPTConfig
from tests.helpers.gpt import train_byte_bpe, write_hf_gpt2_folder

VOCAB = 300
CONTEXT = 96
# English only: every non-ASCII character is left as 2-4 byte-level ids.
TEXT = (
    "hello world, the cat sat on the mat. the quick brown fox jumps over the lazy dog; "
    "pack my box with five dozen liquor jugs. sphinx of black quartz, judge my vow! "
)


class ByteTokenizer:
    """Every UTF-8 byte is one id (0..255): every multi-byte character spans several ids."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def byte_bpe() -> Tokenizer:
    """GPT-2's kind of tokenizer with ``VOCAB`` ids (``<|endoftext|>`` is id 0)."""
    tok = train_byte_bpe([TEXT * 20], vocab_size=VOCAB)
    assert tok.get_vocab_size() == VOCAB
    return tok


def tiny_llama_config(**overrides) -> transformers.LlamaConfig:
    """A Llama with grouped-query attention (4 query heads, 2 key/value heads), 2 layers, width
    32, context ``CONTEXT``, the vocabulary of :func:`byte_bpe`; eos = bos = 0. ``overrides``
    change any field (e.g. Mistral's ``sliding_window`` through a MistralConfig's fields)."""
    fields = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
        bos_token_id=0, eos_token_id=0, initializer_range=0.1,
    )  # fmt: skip
    return transformers.LlamaConfig(**{**fields, **overrides})


def tiny_gpt2_config() -> transformers.GPT2Config:
    """2 layers, width 32, context ``CONTEXT``; eos = bos = 0 (``<|endoftext|>``). The init is
    wider than GPT-2's (std 0.3), so next-token distributions are peaked and greedy outputs
    vary instead of repeating one token."""
    return transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=4,
        bos_token_id=0, eos_token_id=0, initializer_range=0.3,
    )  # fmt: skip


def load_pair(folder: Path, tokenizer: Tokenizer | None = None, *, seed: int = 0):
    """(Hugging Face GPT2LMHeadModel, attnkit GPT) with the same random weights."""
    hf = write_hf_gpt2_folder(folder, tiny_gpt2_config(), tokenizer, seed=seed)
    return hf, GPT.from_pretrained(folder)


def tiny_llama_gpt(**options) -> GPT:
    """An attnkit Llama with random weights (seed 0), in eval mode: grouped-query attention (4
    query heads, 2 key/value heads), 2 layers, width 32, a vocabulary of 97 ids, context 128,
    init std 0.3 (peaked next-token distributions); ``options`` are more
    :meth:`~attnkit.models.GPTConfig.llama` fields (``window=4``, ...)."""
    torch.manual_seed(0)
    config = GPTConfig.llama(
        vocab_size=97, context_length=128, d_model=32, num_heads=4, num_kv_heads=2,
        num_layers=2, d_ff=48, initializer_range=0.3, **options,
    )  # fmt: skip
    return GPT(config).eval()
