"""Two DDP processes (torchrun, gloo) take the same steps as one process with the same
global batch: per-step losses, validation loss and final weights agree."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from attnkit.training import train
from attnkit.training.metrics_log import read_metrics
from tests.helpers.training import FAST, TINY_COPY, fast_config, run, weights

STEPS = 8
# No dropout: each rank has its own random stream, a single process has one.
OPTIONS = ["model.dropout=0.0", "optim.eval_every=4", f"optim.max_steps={STEPS}"]


def test_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    sets = [arg for item in [*FAST, *OPTIONS] for arg in ("--set", item)]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "attnkit",
        "train",
        "--no-progress",
        "--config",
        str(TINY_COPY),
        "--out",
        str(tmp_path / "ddp"),
        *sets,
    ]
    done = run(cmd)
    assert "2 process(es)" in done.stderr
    # Rank 0 alone reports the run on the terminal (rank 1 repeated every line), and DDP is
    # built without torch 2.13's deprecated broadcast_buffers (a FutureWarning per process).
    for line in ("starting run in", f"step {STEPS}: val_loss", "done: step"):
        assert done.stderr.count(line) == 1, done.stderr
    assert "FutureWarning" not in done.stderr and "broadcast_buffers" not in done.stderr

    # One process, accumulating the two batches the two ranks take at each step
    # (rank r gets batches r, r + 2, ...; accumulation takes 2k and 2k + 1).
    single = train(
        fast_config(*OPTIONS, "optim.accumulation=2"), tmp_path / "single", progress=False
    )
    assert single.step == STEPS

    def records(folder, key):
        return [(r["step"], r[key]) for r in read_metrics(folder / "metrics.jsonl") if key in r]

    ddp_loss, one_loss = (
        records(tmp_path / "ddp", "train_loss"),
        records(tmp_path / "single", "train_loss"),
    )
    assert [s for s, _ in ddp_loss] == [s for s, _ in one_loss] == list(range(1, STEPS + 1))
    for (_, a), (_, b) in zip(ddp_loss, one_loss, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    assert ddp_loss[0][1] > ddp_loss[-1][1]  # it trained
    for (_, a), (_, b) in zip(
        records(tmp_path / "ddp", "val_loss"), records(tmp_path / "single", "val_loss"), strict=True
    ):
        assert a == pytest.approx(b, abs=1e-5)
    got, want = weights(tmp_path / "ddp"), weights(tmp_path / "single")
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-5, msg=name)
    # Rank 0 alone writes: one log, one metrics file, no per-rank files (and its writer lock).
    assert sorted(p.name for p in (tmp_path / "ddp").iterdir()) == [
        ".attnkit.lock",
        "best",
        "config.toml",
        "last",
        "metrics.jsonl",
        "tokenizer.json",
        "train.log",
    ]


AGREE = """
import sys
from pathlib import Path

from attnkit.training.distributed import barrier, close_distributed, init_distributed, raise_together

info = init_distributed("cpu")
results = []
for failing_rank, error in [(0, ValueError), (1, RuntimeError), (None, None), (0, OSError)]:
    try:
        with raise_together(info):
            if info.rank == failing_rank:
                raise error(f"check failed on rank {info.rank}")
        results.append("ok")
    except Exception as err:
        results.append(f"{type(err).__name__}: {err}")
    barrier(info)  # would hang here if one rank raised alone
Path(sys.argv[1], f"rank{info.rank}.txt").write_text("\\n".join(results) + "\\n")
close_distributed()
"""


def test_all_ranks_raise_together_when_one_rank_fails(tmp_path):
    """A check made on one rank (the run folder, the tokenizer) that fails makes every rank
    raise, with the failed rank's message, instead of leaving the others at a barrier."""
    script = tmp_path / "agree.py"
    script.write_text(AGREE)
    run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
            str(tmp_path),
        ],
        timeout=120,
    )
    rank0 = (tmp_path / "rank0.txt").read_text().splitlines()
    rank1 = (tmp_path / "rank1.txt").read_text().splitlines()
    assert rank0 == [
        "ValueError: check failed on rank 0",
        "PeerError: check failed on rank 1 (raised as RuntimeError on rank 1)",
        "ok",
        "OSError: check failed on rank 0",
    ]
    assert rank1 == [
        "ValueError: check failed on rank 0 (raised as ValueError on rank 0)",
        "RuntimeError: check failed on rank 1",
        "ok",
        "PeerError: check failed on rank 0 (raised as OSError on rank 0)",
    ]


DIVERGE = """
import sys
from pathlib import Path

from attnkit.training.config import TrainConfig
from attnkit.training.distributed import close_distributed
from attnkit.training.trainer import Trainer

out = Path(sys.argv[2])
trainer = Trainer(TrainConfig.from_toml(sys.argv[1]), out / "run", progress=False)
trainer.setup()
rank = trainer.run.info.rank
if rank == 1:  # this rank alone: a NaN loss at step 3
    forward = trainer.loss_module.forward

    def nan_at_step_3(*args):
        loss = forward(*args)
        return loss * float("nan") if trainer.state.step == 2 else loss

    trainer.loss_module.forward = nan_at_step_3
try:
    trainer.fit()
    result = "finished"
except Exception as err:
    result = f"{type(err).__name__}: {err}"
Path(out, f"rank{rank}.txt").write_text(result)
close_distributed()
"""


def test_a_loss_that_diverges_on_one_rank_stops_every_rank_at_the_same_check(tmp_path):
    """Rank 1's loss is NaN at step 3 (rank 0's at step 4, after the NaN gradients were
    averaged in): the check before the save of step 4 takes the smallest step over the ranks,
    so both ranks stop there, with the same message, and none waits at a collective; `last`
    stays the checkpoint of step 2."""
    script, config = tmp_path / "diverge.py", tmp_path / "config.toml"
    script.write_text(DIVERGE)
    items = ["optim.max_steps=8", "optim.save_every=2", "optim.log_every=50"]
    config.write_text(fast_config(*items).to_toml())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    run([*cmd, str(script), str(config), str(tmp_path)], timeout=120)
    results = [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)]
    assert results[0] == results[1], results
    assert results[0].startswith(
        "DivergedError: training diverged: the training loss is NaN or infinite at step 3, so "
        "the run stopped unsaved; `last` (step 2) is the last good checkpoint"
    ), results[0]
    assert json.loads((tmp_path / "run" / "last" / "state.json").read_text())["step"] == 2
    assert all(bool(torch.isfinite(t).all()) for t in weights(tmp_path / "run").values())
