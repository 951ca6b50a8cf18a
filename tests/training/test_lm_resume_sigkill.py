"""Exact resume of a language-model run after SIGKILL: kill a CLI run of the tiny character
GPT (cosine schedule, dropout) mid-way, resume it, compare with an uninterrupted run."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import torch

from attnkit.training import train
from attnkit.training.checkpoint import find_checkpoint
from tests.helpers.lm import tiny_lm_config, tiny_lm_toml
from tests.helpers.training import cli_command, run, subprocess_env, weights

STEPS = 300
OPTIONS = ["optim.save_every=5", "optim.eval_every=100", f"optim.max_steps={STEPS}"]


def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path):
    killed = tmp_path / "killed"
    config = tiny_lm_toml(tmp_path / "lm.toml", *OPTIONS)
    cmd = cli_command("--config", str(config), "--out", str(killed))
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
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    at_kill = json.loads((find_checkpoint(killed / "last") / "state.json").read_text())["step"]
    assert 10 <= at_kill < STEPS

    run(cli_command("--resume", str(killed)))
    assert json.loads((killed / "last" / "state.json").read_text())["step"] == STEPS

    reference = train(tiny_lm_config(*OPTIONS), tmp_path / "clean", progress=False)
    assert reference.step == STEPS
    got, want = weights(killed), weights(tmp_path / "clean")
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
