"""Helpers of the training tests: the tiny copy-task configs, CLI subprocesses, saved weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from attnkit.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]  # the repository
CONFIGS = ROOT / "configs"
TINY_COPY = CONFIGS / "tiny_copy.toml"

# An even smaller copy task for the loop mechanics (resume, DDP): seconds, not minutes.
FAST = [
    "model.d_model=32",
    "model.num_heads=2",
    "model.d_ff=64",
    "model.num_encoder_layers=1",
    "model.num_decoder_layers=1",
    "data.copy_train_pairs=300",
    "data.copy_val_pairs=40",
    "data.max_tokens=128",
    "optim.warmup_steps=20",
    "optim.log_every=1",
    "optim.threads=1",
]


def fast_config(*overrides: str) -> TrainConfig:
    return TrainConfig.from_toml(TINY_COPY, [*FAST, *overrides])


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnkit", "train", "--no-progress", *args]


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run(cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    done = subprocess.run(
        cmd, env=subprocess_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert done.returncode == 0, f"{cmd} failed:\n{done.stderr[-4000:]}"
    return done


def weights(run_dir: Path, name: str = "last") -> dict[str, torch.Tensor]:
    return load_file(run_dir / name / "model.safetensors")
