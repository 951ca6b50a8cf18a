"""Exact resume after SIGKILL: kill a CLI run mid-way, resume it, compare to a clean run."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import torch

from attnkit.training import train
from attnkit.training.checkpoint import find_checkpoint
from attnkit.training.run_folder import LOCK_FILE
from tests.helpers.training import (
    FAST,
    TINY_COPY,
    cli_command,
    fast_config,
    run,
    subprocess_env,
    weights,
)

STEPS = 240  # 3 s after step 10 to kill in (80 steps left 1 s: tight on a busy machine)
OPTIONS = ["optim.save_every=5", "optim.eval_every=20"]


def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path):
    killed = tmp_path / "killed"
    sets = [arg for item in [*FAST, *OPTIONS] for arg in ("--set", item)]
    cmd = cli_command(
        "--config", str(TINY_COPY), "--out", str(killed), "--max-steps", str(STEPS), *sets
    )
    proc = subprocess.Popen(
        cmd, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"run ended before it was killed:\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "no checkpoint appeared"
            folder = find_checkpoint(killed / "last")
            if folder is not None:
                try:
                    step = json.loads((folder / "state.json").read_text())["step"]
                except (OSError, ValueError):  # renamed away while reading
                    step = 0
                if step >= 10:
                    break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    at_kill = json.loads((find_checkpoint(killed / "last") / "state.json").read_text())["step"]
    assert 10 <= at_kill < STEPS
    assert (killed / LOCK_FILE).is_file()  # the killed run's lock file stays; its lock does not

    run(cli_command("--resume", str(killed)))
    state = json.loads((killed / "last" / "state.json").read_text())
    assert state["step"] == STEPS

    reference = train(
        fast_config(*OPTIONS, f"optim.max_steps={STEPS}"), tmp_path / "clean", progress=False
    )
    assert reference.step == STEPS
    got, want = weights(killed), weights(tmp_path / "clean")
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert not list(tmp_path.glob("*/last.*-*")), "stale temporary checkpoint folders"
