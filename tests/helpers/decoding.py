"""Helpers of the decoding tests: tiny configs, padded id batches and a trained copy model.

The copy model is trained to a criterion, never for a fixed number of steps: it trains until it
copies every sequence of a held-out set (:func:`copy_held_out`) with probability at least
``exp(-COPY_MAX_NLL)`` under teacher forcing, so tests that decode those sequences assert what
no processor's rounding can move (every token wins by more than 2 nats), whatever number of
steps the processor needed to get there.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from attnkit.data import copy_task_ids
from attnkit.models import Transformer, TransformerConfig

logger = logging.getLogger(__name__)

PAD, BOS, EOS = 0, 1, 2

COPY_VOCAB = 20  # ids 4..19 are copied; 0-3 are pad/bos/eos/unk
COPY_MIN_LEN, COPY_MAX_LEN = 2, 10
COPY_HELD_OUT_SEED = 10_000  # the training batches use seeds 1_000_000 + step
COPY_MAX_NLL = 0.1
"""Criterion: -log p(copy + eos | source) of every held-out sequence, in nats. At most 0.1 means
each of its tokens has probability >= 0.9 and every other token <= 0.1: a margin of 2.2 nats
that float32 or bfloat16 rounding cannot close."""
COPY_CHECK_EVERY = 10  # steps between two checks of the criterion
COPY_MAX_STEPS = 3000  # the step cap; ~600-900 steps reach the criterion


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


def copy_held_out(n: int = 64) -> list[list[int]]:
    """The held-out sources (2-10 ids) the copy model is trained until it copies."""
    return random_sources(n, COPY_VOCAB, COPY_MIN_LEN, COPY_MAX_LEN, seed=COPY_HELD_OUT_SEED)


def teacher_forcing_batch(sources: list[list[int]]):
    """(src, tgt_in, tgt_out) for copying ``sources``: tgt_in = bos + ids, tgt_out = ids + eos."""
    src = pad_batch(sources)  # (B, S)
    tgt_out = src.clone()  # (B, S): ids, eos, pad
    tgt_in = torch.full_like(src, PAD)
    tgt_in[:, 0] = BOS
    tgt_in[:, 1:] = torch.where(src[:, :-1] == EOS, PAD, src[:, :-1])  # (B, S): bos, ids, pad
    return src, tgt_in, tgt_out


@torch.no_grad()
def copy_nll(model: Transformer, sources: list[list[int]]) -> torch.Tensor:
    """-log p(ids + eos | ids) of each source under teacher forcing, (B,) float64."""
    src, tgt_in, tgt_out = teacher_forcing_batch(sources)
    lprobs = model(src, tgt_in).double().log_softmax(-1)  # (B, S, V)
    token_lp = lprobs.gather(-1, tgt_out[..., None])[..., 0]  # (B, S)
    return -(token_lp * (tgt_out != PAD)).sum(1)


def train_copy_model(seed: int = 0, max_steps: int = COPY_MAX_STEPS) -> Transformer:
    """A copy model trained until every held-out sequence has NLL <= ``COPY_MAX_NLL``.

    Adam (peak lr 3e-3, 100 warm-up steps, then inverse square root decay), batches of 32
    random sequences of 2-10 ids from a 20-token vocabulary, gradients clipped at norm 1.

    Raises:
        AssertionError: The criterion is not met within ``max_steps``; the message holds the
            history of (step, training loss, worst held-out NLL).
    """
    torch.manual_seed(seed)
    model = Transformer(tiny_config(COPY_VOCAB, d_model=64, d_ff=128))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    warmup = 100
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, (warmup / (s + 1)) ** 0.5)
    )
    held_out = copy_held_out()
    history: list[tuple[int, float, float]] = []
    for step in range(1, max_steps + 1):
        model.train()
        pairs = copy_task_ids(32, COPY_VOCAB, COPY_MIN_LEN, COPY_MAX_LEN, seed=1_000_000 + step)
        src, tgt_in, tgt_out = teacher_forcing_batch([s for s, _ in pairs])
        logits = model(src, tgt_in)  # (B, S, V)
        loss = F.cross_entropy(logits.transpose(1, 2), tgt_out, ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % COPY_CHECK_EVERY == 0:
            model.eval()
            worst = float(copy_nll(model, held_out).max())
            history.append((step, round(loss.item(), 4), round(worst, 4)))
            if worst <= COPY_MAX_NLL:
                logger.info("copy model: criterion met at step %d (worst NLL %.4f)", step, worst)
                return model
    raise AssertionError(
        f"the copy model did not reach worst held-out NLL <= {COPY_MAX_NLL} in {max_steps} "
        f"steps; (step, train loss, worst held-out NLL): {history}"
    )
