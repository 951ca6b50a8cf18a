"""Helpers of the decoding tests (a module with a unique name: `conftest` is taken)."""

from __future__ import annotations

import torch

from attnkit.data import copy_task_ids
from attnkit.models import Transformer, TransformerConfig

PAD, BOS, EOS = 0, 1, 2


def tiny_config(vocab_size: int, **overrides) -> TransformerConfig:
    kw = dict(
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        d_model=32,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        d_ff=64,
        dropout=0.0,
        attn_dropout=0.0,
        max_len=40,
    )
    kw.update(overrides)
    return TransformerConfig(**kw)


def pad_batch(rows: list[list[int]]) -> torch.Tensor:
    """Eos-terminated, right-padded (B, S) source ids."""
    width = max(len(r) for r in rows) + 1
    out = torch.full((len(rows), width), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row) + 1] = torch.tensor([*row, EOS])
    return out


def random_sources(n: int, vocab_size: int, min_len: int, max_len: int, seed: int):
    return [s for s, _ in copy_task_ids(n, vocab_size, min_len, max_len, seed)]


def train_copy_model(steps: int = 150) -> Transformer:
    """Trained a few seconds on copying sequences of 2-10 ids from a 20-token vocabulary."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(20, d_model=64, d_ff=128))
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    for step in range(steps):
        pairs = copy_task_ids(32, 20, 2, 10, seed=step)
        src = pad_batch([s for s, _ in pairs])
        tgt_in = pad_batch([[BOS, *t] for _, t in pairs])[:, :-1]  # drop the appended eos col
        tgt_in = torch.where(tgt_in == EOS, PAD, tgt_in)
        tgt_out = pad_batch([t for _, t in pairs])
        logits = model(src, tgt_in)
        loss = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), tgt_out, ignore_index=PAD
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.final_loss = float(loss.detach())
    return model.eval()
