"""Helpers of the language-model tests: a tiny character GPT run on a slice of Shakespeare."""

from __future__ import annotations

from pathlib import Path

from attnkit.training.config import TrainConfig

# A GPT small enough for the loop mechanics (resume, averaging, DDP) in seconds: 2 layers of
# width 32 over windows of 16 characters, 1,500 training characters (so an epoch is a few
# batches and runs cross epoch boundaries), dropout on (so resume must restore the RNG).
TINY_LM = {
    "task": "lm",
    "model": {
        "d_model": 32,
        "num_heads": 2,
        "num_layers": 2,
        "d_ff": 64,
        "context_length": 16,
        "dropout": 0.1,
        "attn_dropout": 0.1,
        "embed_dropout": 0.1,
    },
    "data": {"max_train_chars": 1500, "max_val_chars": 300, "batch_size": 4, "seed": 3},
    "optim": {
        "schedule": "cosine",
        "peak_lr": 3e-3,
        "min_lr": 3e-4,
        "warmup_steps": 5,
        "log_every": 1,
        "autocast": "none",
        "threads": 1,
        "label_smoothing": 0.0,
    },
}


def tiny_lm_config(*overrides: str) -> TrainConfig:
    """:data:`TINY_LM` with ``section.key=value`` overrides."""
    return TrainConfig.from_dict(TINY_LM).with_overrides(overrides)


def tiny_lm_toml(path: Path, *overrides: str) -> Path:
    """:func:`tiny_lm_config` written as a TOML file at ``path``."""
    path.write_text(tiny_lm_config(*overrides).to_toml(), encoding="utf-8")
    return path
