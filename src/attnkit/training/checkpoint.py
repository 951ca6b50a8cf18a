"""Checkpoints: a folder per checkpoint, written atomically.

Layout of ``runs/NAME/last/`` (and ``best/``)::

    model.safetensors   weights (tied tensors stored once)
    config.json         the full training config, model vocabulary sizes filled in
    tokenizer.json      the subword tokenizer
    state.json          step, epoch, position in the data, metrics (human-readable)
    resume.pt           optimizer, scheduler, grad scaler and RNG states (``last`` only)

A checkpoint is a model folder of the run's kind with two more files: a translation folder
(``attnkit translate --model runs/NAME/best``; ``config.json`` is the training config), or for
a language model a GPT-2 folder (``attnkit generate --model runs/NAME/best``;
``GPT.from_pretrained`` reads it) whose ``config.json`` holds Hugging Face's GPT-2 keys and
the training config under :data:`TRAIN_CONFIG_KEY`. The files, the errors and the atomic
write are :mod:`attnkit.model_folder`'s. Atomicity: the folder is written as ``last.tmp-<pid>/``, every
file and the folder are fsynced, then the old ``last`` is renamed to ``last.old-<pid>``, the
new folder is renamed to ``last`` and the old one is deleted. Only complete folders ever carry
the name ``last`` or ``last.old-*``, so a run killed at any moment leaves a loadable
checkpoint: :func:`find_checkpoint` takes ``last``, or ``last.old-*`` if the kill came between
the two renames, and never a ``.tmp-`` folder. A folder attnkit did not write is never
replaced (:func:`attnkit.model_folder.check_replaceable`).
"""

from __future__ import annotations

import io
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnkit import model_folder as mf
from attnkit.decoding.loading import load_translation_model, write_translation_files
from attnkit.models import gpt_hf
from attnkit.models.gpt import GPT
from attnkit.models.transformer import Transformer
from attnkit.training.config import TrainConfig, with_saved_defaults

logger = logging.getLogger(__name__)

__all__ = [
    "TOKENIZER",
    "TRAIN_CONFIG_KEY",
    "find_checkpoint",
    "load_model",
    "load_resume_state",
    "load_weights",
    "read_state",
    "read_train_config",
    "save_checkpoint",
]

TOKENIZER = mf.TOKENIZER_FILE  # the name the trainer reads a run's tokenizer under
# GPT checkpoints: the config.json key holding the training config beside GPT-2's own keys.
TRAIN_CONFIG_KEY = "attnkit_train_config"


def write_model_files(folder: Path, model: nn.Module, config: TrainConfig, tokenizer) -> None:
    """Weights, ``config.json`` and tokenizer of a checkpoint into ``folder`` (a temporary
    folder of :func:`attnkit.model_folder.atomic_folder`), in the layout of the model's kind
    (module docstring)."""
    if isinstance(model, GPT):
        hf_config = {**gpt_hf.config_to_hf(model.config), TRAIN_CONFIG_KEY: config.to_dict()}
        mf.write_json(folder / mf.CONFIG_FILE, hf_config)
        mf.write_weights(folder / mf.WEIGHTS_FILE, gpt_hf.state_to_hf(model))
        tokenizer.save(folder / mf.TOKENIZER_FILE)
    else:
        write_translation_files(folder, model, tokenizer, config.to_dict())


def save_checkpoint(
    folder: str | os.PathLike[str],
    *,
    model: nn.Module,
    config: TrainConfig,
    tokenizer: Any,
    state: dict[str, Any],
    resume: dict[str, Any] | None = None,
    what: str = "checkpoint folder",
) -> Path:
    """Writes a checkpoint folder atomically (see the module docstring).

    Args:
        folder: The checkpoint folder, e.g. ``runs/NAME/last``.
        model: The (unwrapped) model.
        config: The training config with the model's vocabulary sizes filled in.
        tokenizer: The tokenizer (a SubwordTokenizer, or a GPTTokenizer for a GPT).
        state: JSON-serialisable run position and metrics (``state.json``).
        resume: Optimizer/scheduler/RNG states for an exact resume (``resume.pt``).
        what: What the errors call ``folder`` (the option it was given by, e.g. ``--out``).

    Returns:
        The folder path.

    Raises:
        ValueError: If ``folder`` exists and is not a folder attnkit wrote.
        OSError: If a file cannot be written (e.g. a full disk), naming ``folder``; the
            previous checkpoint there is left as it was.
    """
    folder = Path(folder)
    with mf.atomic_folder(folder, what=what) as tmp:
        write_model_files(tmp, model, config, tokenizer)
        mf.write_json(tmp / mf.STATE_FILE, state)
        if resume is not None:
            # Serialised in memory, then written by Python: torch.save straight into the file
            # reports a full disk as RuntimeError("[enforce fail at inline_container.cc...]
            # unexpected pos"); this way it is the OSError it is, naming the file.
            buffer = io.BytesIO()
            torch.save(resume, buffer)
            mf.write_bytes(tmp / mf.RESUME_FILE, buffer.getbuffer())
    return folder


def _step(folder: Path) -> int:
    try:
        return read_state(folder)["step"]
    except ValueError:
        return -1  # unreadable: the last choice


def find_checkpoint(folder: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint for ``folder`` (e.g. ``runs/NAME/last``), or None.

    ``folder`` itself when it exists; otherwise the newest ``<name>.old-*`` (a run killed
    between the two renames of :func:`save_checkpoint`). ``.tmp-*`` folders may be partial
    and are never returned.
    """
    return mf.recover_folder(folder, mf.STATE_FILE, newest=_step)


def read_state(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``state.json`` of a checkpoint folder.

    Raises:
        ValueError: If it is missing, not a JSON object, or has no non-negative ``step``.
    """
    path = Path(folder) / mf.STATE_FILE
    state = mf.read_json(path, what=f"checkpoint {mf.STATE_FILE}")
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f'{path}: "step": expected a non-negative integer, got {step!r}')
    return state


def read_train_config(folder: str | os.PathLike[str]) -> TrainConfig:
    """The training config saved in a checkpoint folder's ``config.json``.

    Raises:
        ValueError: Naming the file and field, if it is unreadable, another kind of model's,
            or a value is of the wrong type or out of range.
    """
    folder = Path(folder)
    raw = mf.read_config(folder)
    if mf.expect_kind(folder, raw, "translation", "gpt2") == "gpt2":
        train = raw.get(TRAIN_CONFIG_KEY)
        if not isinstance(train, dict):
            raise ValueError(
                f"{folder / mf.CONFIG_FILE}: a GPT-2 folder but not an attnkit training "
                f"checkpoint (no {TRAIN_CONFIG_KEY!r} object)"
            )
        raw = train
    try:
        return TrainConfig.from_dict(with_saved_defaults(raw), allow_tokenizer_keys=True)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{folder / mf.CONFIG_FILE}: bad training config: {err}") from None


def load_resume_state(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The optimizer/scheduler/RNG states of a ``last`` checkpoint.

    Raises:
        ValueError: If ``resume.pt`` is missing, unreadable (truncated, corrupt, not written
            by torch.save) or not a dict. It is read with ``weights_only=True``.
    """
    path = Path(folder) / mf.RESUME_FILE
    if not path.is_file():
        raise ValueError(
            f"{os.fspath(folder)!r} has no {mf.RESUME_FILE}: not a resumable checkpoint"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # EOFError, UnpicklingError, RuntimeError, BadZipFile, ...
        # torch's own message for a file it cannot unpickle safely advises weights_only=False,
        # which would run whatever the file holds: not advice to pass on for a damaged file.
        if isinstance(err, pickle.UnpicklingError):
            # torch's reason (an unsupported global, an invalid opcode) sits between its advice
            # and its pointer to the docs; the advice and the pointer are dropped
            skip = ("Weights only load failed", "Please file an issue", "Check the documentation")
            reason = " ".join(
                line.strip()
                for line in str(err).splitlines()
                if line.strip() and not line.strip().startswith(skip)
            )
            why = f"UnpicklingError: {reason[:200] or 'not a file torch.save wrote'}"
        else:
            lines = str(err).strip().splitlines() or [""]
            why = f"{type(err).__name__}: {lines[0][:200]}"
        raise ValueError(
            f"{path}: not a readable resume state ({why}); the checkpoint is damaged: restore "
            "the file, or start a new run from its weights"
        ) from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a dict of training states, got {type(state).__name__}")
    return state


def load_weights(model: nn.Module, folder: str | os.PathLike[str]) -> None:
    """Loads ``model.safetensors`` into ``model`` (strict: every tensor must match; a GPT's
    from Hugging Face's GPT-2 names).

    Raises:
        ValueError: If the file is missing, damaged or does not fit the model, or a tensor
            holds NaN or inf (a run that diverged, or a damaged file: nothing to train on),
            naming the file and the first such tensor; the model is left as it was.
    """
    source = mf.weights_path(folder)
    stored = mf.read_weights(source)
    mf.check_finite(stored, source, use="these weights cannot be trained on")
    if isinstance(model, GPT):
        stored = gpt_hf.state_from_hf(stored, model.config, source=source)
    mf.load_state_dict_into(model, stored, source=source)


def load_model(
    folder: str | os.PathLike[str], *, device: str | torch.device = "cpu"
) -> tuple[Transformer | GPT, Any, TrainConfig]:
    """Rebuilds a trained model from a checkpoint folder, in eval mode (a Transformer and its
    SubwordTokenizer, or a GPT and its GPTTokenizer).

    Args:
        folder: A checkpoint folder (``runs/NAME/best`` or ``runs/NAME/last``) or a run folder
            (its ``best`` checkpoint, else ``last``).

    Returns:
        ``(model, tokenizer, config)``.
    """
    folder = Path(folder)
    if not (folder / mf.WEIGHTS_FILE).is_file():
        found = find_checkpoint(folder / "best") or find_checkpoint(folder / "last")
        if found is None:
            raise ValueError(
                f"{os.fspath(folder)!r} holds no checkpoint ({mf.WEIGHTS_FILE} not found)"
            )
        folder = found
    config = read_train_config(folder)
    if config.task == "lm":
        model = GPT.from_pretrained(folder, device=device)
        return model, model.tokenizer, config
    model, tokenizer, _ = load_translation_model(folder, device=device)
    return model, tokenizer, config
