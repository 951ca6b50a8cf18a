"""CI training check: a tiny model learns the copy task from configs/tiny_copy.toml.

~500 copy pairs, d_model 64, 2+2 layers, 400 steps: well under 2 minutes on one CPU thread.
Checks that the training loss falls and that greedy decoding reproduces held-out sources.
"""

from __future__ import annotations

import torch

from attnkit.data import copy_task_pairs
from attnkit.training import TrainConfig, load_model, train
from attnkit.training.metrics_log import read_metrics

from .conftest import TINY_COPY


@torch.no_grad()
def greedy(model, tokenizer, sources: list[str], max_len: int) -> list[str]:
    """Batched greedy decoding, written out here so the test does not need attnkit.decoding."""
    rows = [tokenizer.encode(s) + [tokenizer.eos_id] for s in sources]
    src = torch.full((len(rows), max(map(len, rows))), tokenizer.pad_id)
    for i, row in enumerate(rows):
        src[i, : len(row)] = torch.tensor(row)
    memory, src_mask = model.encode(src)
    out = torch.full((len(rows), 1), tokenizer.bos_id)
    done = torch.zeros(len(rows), dtype=torch.bool)
    for _ in range(max_len):
        next_id = model.decode(out, memory, src_mask)[:, -1].argmax(-1)  # (B,)
        next_id = next_id.masked_fill(done, tokenizer.pad_id)
        out = torch.cat([out, next_id[:, None]], dim=1)
        done |= next_id == tokenizer.eos_id
        if done.all():
            break
    return tokenizer.decode_batch(out[:, 1:])


def test_tiny_model_learns_to_copy(tmp_path):
    config = TrainConfig.from_toml(TINY_COPY)
    result = train(config, tmp_path, progress=False)
    assert result.stop_reason == "max_steps"

    losses = [
        r["train_loss"] for r in read_metrics(tmp_path / "metrics.jsonl") if "train_loss" in r
    ]
    assert losses[-1] < 0.5 * losses[0], losses
    assert result.metrics["val_loss"] < 0.5
    assert result.best_metric == "val_bleu" and result.metrics["val_bleu"] > 90.0

    model, tokenizer, _ = load_model(tmp_path / "last")
    d = config.data
    held_out = [
        s for s, _ in copy_task_pairs(200, d.copy_words, d.copy_min_len, d.copy_max_len, seed=12345)
    ]
    outputs = greedy(model, tokenizer, held_out, max_len=config.model.max_len - 1)
    exact = sum(o == s for o, s in zip(outputs, held_out, strict=True)) / len(held_out)
    assert exact >= 0.9, list(zip(held_out, outputs, strict=True))[:5]
