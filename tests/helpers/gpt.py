"""GPT test helpers: padded batches of id rows, a GPT-2-style byte-level BPE tokenizer and
Hugging Face GPT-2 and Llama folders with random weights, written by Hugging Face itself."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"


def padded(rows: Sequence[Sequence[int]], padding_side: str, pad: int = 0):
    """(ids (B, T) long, mask (B, T) bool) of id rows padded with ``pad`` on ``padding_side``."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        cols = slice(width - len(row), width) if padding_side == "left" else slice(0, len(row))
        ids[i, cols] = torch.as_tensor(list(row), dtype=torch.long)
        mask[i, cols] = True
    return ids, mask


def train_byte_bpe(texts: Sequence[str], vocab_size: int = 320) -> Tokenizer:
    """GPT-2's kind of tokenizer (ByteLevel pre-tokenizer and decoder, BPE) with ``EOT`` as its
    one special token (id 0), trained on ``texts``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer)
    return tok


def write_hf_gpt2_folder(path: Path, config, tokenizer: Tokenizer | None = None, *, seed: int = 0):
    """Save a random-weights ``transformers.GPT2LMHeadModel(config)`` (and ``tokenizer``) to
    ``path`` as Hugging Face writes it; returns the model in eval mode."""
    import transformers

    torch.manual_seed(seed)
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save(str(Path(path) / "tokenizer.json"))
    return hf


def write_hf_llama_folder(path: Path, config, tokenizer: Tokenizer | None = None, *, seed: int = 0):
    """Save a random-weights ``transformers.LlamaForCausalLM(config)`` (and ``tokenizer``) to
    ``path`` as Hugging Face writes it; returns it reloaded with eager attention (whose
    attention weights can be returned), in eval mode."""
    import transformers

    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save(str(Path(path) / "tokenizer.json"))
    return transformers.LlamaForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
