"""CI training check: a tiny model learns the copy task from configs/tiny_copy.toml.

~500 copy pairs, d_model 64, 2+2 layers. Trained to a criterion, not for a fixed number of
steps: the run is resumed 100 steps at a time until greedy decoding reproduces 95% of 200
held-out sources (500-800 steps here, natively and with AVX2 kernels), up to a cap of 2,000
steps. Checks that the loop gets there, that the training loss falls and that the run logs
its BLEU evaluations.
"""

from __future__ import annotations

import pytest
import torch

from attnkit.data import copy_task_pairs
from attnkit.training import TrainConfig, load_model, train
from attnkit.training.metrics_log import read_metrics
from tests.helpers.training import TINY_COPY


@torch.no_grad()
def greedy(model, tokenizer, sources: list[str], max_len: int) -> list[str]:
    """Batched greedy decoding, written out here so the test does not need attnkit.decoding."""
    rows = [tokenizer.encode(s) + [tokenizer.eos_id] for s in sources]
    src = torch.full((len(rows), max(map(len, rows))), tokenizer.pad_id)
    for i, row in enumerate(rows):
        src[i, : len(row)] = torch.tensor(row)
    memory, src_mask, _ = model.encode(src)
    out = torch.full((len(rows), 1), tokenizer.bos_id)
    done = torch.zeros(len(rows), dtype=torch.bool)
    for _ in range(max_len):
        next_id = model.decode(out, memory, src_mask).output[:, -1].argmax(-1)  # (B,)
        next_id = next_id.masked_fill(done, tokenizer.pad_id)
        out = torch.cat([out, next_id[:, None]], dim=1)
        done |= next_id == tokenizer.eos_id
        if done.all():
            break
    return tokenizer.decode_batch(out[:, 1:])


ROUND = 100  # steps per resumed round; the config evaluates every 100 steps
MAX_STEPS = 2000  # the cap: the criterion takes 500-800 steps
CRITERION = 0.95  # fraction of the held-out sources greedy decoding must reproduce


def test_tiny_model_learns_to_copy(tmp_path):
    d = TrainConfig.from_toml(TINY_COPY).data
    held_out = [
        s for s, _ in copy_task_pairs(200, d.copy_words, d.copy_min_len, d.copy_max_len, seed=12345)
    ]
    history = []  # (step, val_loss, val_bleu, exact copies of the held-out sources)
    for max_steps in range(ROUND, MAX_STEPS + 1, ROUND):
        config = TrainConfig.from_toml(TINY_COPY, [f"optim.max_steps={max_steps}"])
        result = train(config, tmp_path, resume=max_steps > ROUND, progress=False)
        assert result.stop_reason == "max_steps" and result.step == max_steps
        model, tokenizer, _ = load_model(tmp_path / "last")
        outputs = greedy(model, tokenizer, held_out, max_len=config.model.max_len - 1)
        exact = sum(o == s for o, s in zip(outputs, held_out, strict=True)) / len(held_out)
        m = result.metrics
        history.append((result.step, round(m["val_loss"], 4), round(m["val_bleu"], 2), exact))
        if exact >= CRITERION:
            break
    else:
        pytest.fail(
            f"greedy decoding reproduced < {CRITERION:.0%} of the held-out sources after "
            f"{MAX_STEPS} steps; (step, val_loss, val_bleu, exact): {history}; "
            f"e.g. {list(zip(held_out, outputs, strict=True))[:3]}"
        )

    losses = [
        r["train_loss"] for r in read_metrics(tmp_path / "metrics.jsonl") if "train_loss" in r
    ]
    assert losses[-1] < 0.5 * losses[0], losses
    evals = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "val_loss" in r]
    assert [r["step"] for r in evals] == [step for step, *_ in history]  # one per round
    assert all(0.0 <= r["val_bleu"] <= 100.0 for r in evals)
    assert result.best_metric == "val_bleu"
