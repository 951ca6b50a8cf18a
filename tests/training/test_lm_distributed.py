"""Two DDP processes (torchrun, gloo) train the tiny character GPT as one process that
accumulates the same two batches: the ranks deal one sequence of windows."""

from __future__ import annotations

import sys

import pytest
import torch

from attnkit.training import train
from attnkit.training.metrics_log import read_metrics
from tests.helpers.lm import tiny_lm_config, tiny_lm_toml
from tests.helpers.training import run, weights

STEPS = 8
# No dropout: each rank has its own random stream, a single process has one. 16 batches of
# 23 per epoch (22 over two ranks): no epoch boundary, where the two would differ.
OPTIONS = [
    "model.dropout=0.0",
    "model.attn_dropout=0.0",
    "model.embed_dropout=0.0",
    "optim.eval_every=4",
    f"optim.max_steps={STEPS}",
]


def test_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    config = tiny_lm_toml(tmp_path / "lm.toml", *OPTIONS)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "attnkit", "train", "--no-progress", "--config", str(config),
        "--out", str(tmp_path / "ddp"),
    ]  # fmt: skip
    assert "2 process(es)" in run(cmd).stderr
    single = train(
        tiny_lm_config(*OPTIONS, "optim.accumulation=2"), tmp_path / "single", progress=False
    )
    assert single.step == STEPS

    def records(folder, key):
        return [(r["step"], r[key]) for r in read_metrics(folder / "metrics.jsonl") if key in r]

    for key in ("train_loss", "val_loss", "val_nats_per_char"):
        ddp, one = records(tmp_path / "ddp", key), records(tmp_path / "single", key)
        assert [s for s, _ in ddp] == [s for s, _ in one] and ddp
        for (_, a), (_, b) in zip(ddp, one, strict=True):
            assert a == pytest.approx(b, abs=1e-5), key
    got, want = weights(tmp_path / "ddp"), weights(tmp_path / "single")
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-5, msg=name)
