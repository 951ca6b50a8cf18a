"""Checkpoint averaging: kept step checkpoints, the mean of their weights, `attnkit average`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from attnkit.training.averaging import average_checkpoints, step_checkpoints
from attnkit.training.trainer import train

from .conftest import ROOT, fast_config, subprocess_env


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    config = fast_config(
        "optim.max_steps=7",
        "optim.save_every=2",
        "optim.keep_checkpoints=3",
        "optim.eval_every=3",
        "optim.val_bleu=false",
    )
    train(config, out, progress=False)
    return out


def test_the_newest_saves_are_kept(run_dir):
    kept = step_checkpoints(run_dir)
    # `last` is saved at steps 2, 4, 6 and at the end (7); only the newest 3 stay.
    assert [p.name for p in kept] == ["step_0000004", "step_0000006", "step_0000007"]
    assert all(not (p / "resume.pt").exists() for p in kept)  # weights only
    last = load_file(run_dir / "last" / "model.safetensors")
    newest = load_file(kept[-1] / "model.safetensors")
    assert last.keys() == newest.keys()
    assert all(torch.equal(last[k], newest[k]) for k in last)


def test_average_is_the_elementwise_mean(run_dir, tmp_path):
    kept = step_checkpoints(run_dir)
    out = average_checkpoints(kept, tmp_path / "avg")
    loaded = [load_file(p / "model.safetensors") for p in kept]
    got = load_file(out / "model.safetensors")
    assert got.keys() == loaded[0].keys()
    for name, tensor in got.items():
        want = (sum(d[name].double() for d in loaded) / len(loaded)).float()
        torch.testing.assert_close(tensor, want, rtol=0, atol=1e-7)
    assert not torch.equal(got[name], loaded[-1][name])  # it did change something
    state = json.loads((out / "state.json").read_text())
    assert [p.split("/")[-1] for p in state["averaged"]] == [p.name for p in kept]


def test_average_of_one_checkpoint_is_that_checkpoint(run_dir, tmp_path):
    kept = step_checkpoints(run_dir)
    out = average_checkpoints(kept[-1:], tmp_path / "one")
    a, b = load_file(out / "model.safetensors"), load_file(kept[-1] / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="no checkpoints"):
        average_checkpoints([], tmp_path / "none")


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "attnkit", "average", *map(str, args)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=ROOT,
        timeout=120,
    )


def test_cli_averages_and_reports_errors(run_dir, tmp_path):
    done = _cli(run_dir, "--last", "2", "--out", tmp_path / "avg2")
    assert done.returncode == 0, done.stderr
    assert "averaged 2 checkpoints (step_0000006, step_0000007)" in done.stdout
    assert (tmp_path / "avg2" / "model.safetensors").is_file()
    too_many = _cli(run_dir, "--last", "9")
    assert too_many.returncode == 2 and "kept only 3 checkpoints" in too_many.stderr
    none = _cli(tmp_path, "--last", "2")
    assert none.returncode == 2 and "keep_checkpoints" in none.stderr
