"""Checkpoints: a folder per checkpoint, written atomically.

Layout of ``runs/NAME/last/`` (and ``best/``)::

    model.safetensors   weights (tied tensors stored once)
    config.json         the full training config, model vocabulary sizes filled in
    tokenizer.json      the subword tokenizer
    state.json          step, epoch, position in the data, metrics (human-readable)
    resume.pt           optimizer, scheduler, grad scaler and RNG states (``last`` only)

Atomicity: the folder is written as ``last.tmp-<pid>/``, every file and the folder are
fsynced, then the old ``last`` is renamed to ``last.old-<pid>``, the new folder is renamed to
``last`` and the old one is deleted. Only complete folders ever carry the name ``last`` or
``last.old-*``, so a run killed at any moment leaves a loadable checkpoint:
:func:`find_checkpoint` takes ``last``, or ``last.old-*`` if the kill came between the two
renames, and never a ``.tmp-`` folder.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model as load_safetensors_model
from safetensors.torch import save_model as save_safetensors_model
from torch import nn

from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.models.transformer import Transformer, TransformerConfig
from attnkit.training.config import TrainConfig

logger = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
STATE = "state.json"
RESUME = "resume.pt"


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open folders; rename is still atomic there
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Writes a file via a temporary file in the same folder, fsync and ``os.replace``."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save_checkpoint(
    folder: str | os.PathLike[str],
    *,
    model: nn.Module,
    config: TrainConfig,
    tokenizer: SubwordTokenizer,
    state: dict[str, Any],
    resume: dict[str, Any] | None = None,
) -> Path:
    """Writes a checkpoint folder atomically (see the module docstring).

    Args:
        folder: The checkpoint folder, e.g. ``runs/NAME/last``; its parent must exist.
        model: The (unwrapped) model.
        config: The training config with the model's vocabulary sizes filled in.
        tokenizer: The tokenizer.
        state: JSON-serialisable run position and metrics (``state.json``).
        resume: Optimizer/scheduler/RNG states for an exact resume (``resume.pt``).

    Returns:
        The folder path.
    """
    folder = Path(folder)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    old = folder.with_name(f"{folder.name}.old-{os.getpid()}")
    for stale in (tmp, old):
        if stale.exists():
            shutil.rmtree(stale)
    tmp.mkdir()
    save_safetensors_model(model, str(tmp / WEIGHTS), metadata={"format": "pt"})
    (tmp / CONFIG).write_text(json.dumps(config.to_dict(), indent=2) + "\n", encoding="utf-8")
    tokenizer.save(tmp / TOKENIZER)
    (tmp / STATE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    if resume is not None:
        torch.save(resume, tmp / RESUME)
    for path in tmp.iterdir():
        _fsync_file(path)
    _fsync_dir(tmp)
    if folder.exists():
        os.rename(folder, old)
    os.rename(tmp, folder)
    _fsync_dir(folder.parent)
    if old.exists():
        shutil.rmtree(old)
    _remove_stale(folder)
    return folder


def _remove_stale(folder: Path) -> None:
    """Deletes ``<name>.tmp-*`` / ``<name>.old-*`` left by killed runs, once ``folder`` exists."""
    for stale in folder.parent.glob(f"{folder.name}.*-*"):
        if stale.is_dir() and stale.name.split(".")[-1].startswith(("tmp-", "old-")):
            shutil.rmtree(stale, ignore_errors=True)


def find_checkpoint(folder: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint for ``folder`` (e.g. ``runs/NAME/last``), or None.

    ``folder`` itself when it exists; otherwise the newest ``<name>.old-*`` (a run killed
    between the two renames of :func:`save_checkpoint`). ``.tmp-*`` folders may be partial
    and are never returned.
    """
    folder = Path(folder)
    if (folder / STATE).is_file():
        return folder
    olds = [p for p in folder.parent.glob(f"{folder.name}.old-*") if (p / STATE).is_file()]
    if not olds:
        return None
    return max(olds, key=lambda p: json.loads((p / STATE).read_text())["step"])


def read_state(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``state.json`` of a checkpoint folder."""
    return json.loads((Path(folder) / STATE).read_text(encoding="utf-8"))


def read_config(folder: str | os.PathLike[str]) -> TrainConfig:
    """The training config saved in a checkpoint folder."""
    raw = json.loads((Path(folder) / CONFIG).read_text(encoding="utf-8"))
    return TrainConfig.from_dict(raw, allow_tokenizer_keys=True)


def load_resume_state(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The optimizer/scheduler/RNG states of a ``last`` checkpoint."""
    path = Path(folder) / RESUME
    if not path.is_file():
        raise ValueError(f"{os.fspath(folder)!r} has no {RESUME}: not a resumable checkpoint")
    return torch.load(path, map_location="cpu", weights_only=True)


def load_weights(model: nn.Module, folder: str | os.PathLike[str]) -> None:
    """Loads ``model.safetensors`` into ``model`` (strict: every tensor must match)."""
    try:
        missing, unexpected = load_safetensors_model(
            model, str(Path(folder) / WEIGHTS), strict=False
        )
    except RuntimeError as err:  # shape mismatches
        raise ValueError(f"{os.fspath(folder)!r}: weights do not match the model: {err}") from None
    if missing or unexpected:
        raise ValueError(
            f"{os.fspath(folder)!r}: weights do not match the model: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )


def load_model(
    folder: str | os.PathLike[str], *, device: str | torch.device = "cpu"
) -> tuple[Transformer, SubwordTokenizer, TrainConfig]:
    """Rebuilds a trained model from a checkpoint folder, in eval mode.

    Args:
        folder: A checkpoint folder (``runs/NAME/best`` or ``runs/NAME/last``) or a run folder
            (its ``best`` checkpoint, else ``last``).

    Returns:
        ``(model, tokenizer, config)``.
    """
    folder = Path(folder)
    if not (folder / WEIGHTS).is_file():
        found = find_checkpoint(folder / "best") or find_checkpoint(folder / "last")
        if found is None:
            raise ValueError(f"{os.fspath(folder)!r} holds no checkpoint ({WEIGHTS} not found)")
        folder = found
    config = read_config(folder)
    model = Transformer(TransformerConfig.from_dict(config.to_dict()["model"]))
    load_weights(model, folder)
    tokenizer = SubwordTokenizer.load(folder / TOKENIZER)
    return model.to(device).eval(), tokenizer, config
