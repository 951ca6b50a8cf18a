"""Translation model folders: ``config.json`` + ``model.safetensors`` + ``tokenizer.json``.

The folder layout is the one the trainer writes and the package ships in
``attnkit/pretrained/multi30k_de_en/``:

* ``config.json``: the :class:`~attnkit.models.TransformerConfig` fields, either under a
  ``"model"`` key (other top-level keys, such as training settings, are then ignored) or at
  the top level (keys that are not config fields are ignored there);
* ``model.safetensors``: the state dict, in any floating dtype (the shipped model is bfloat16);
  tied weights may be stored once (``safetensors.torch.save_model`` drops the aliases);
* ``tokenizer.json``: a :class:`~attnkit.data.SubwordTokenizer`.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import fields
from pathlib import Path
from typing import NamedTuple

import torch

import attnkit
from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.models.transformer import Transformer, TransformerConfig

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
SHIPPED_MODEL = "multi30k_de_en"


class TranslationModel(NamedTuple):
    """A loaded folder: the model (eval mode, on the requested device and dtype), its
    tokenizer and the folder it came from."""

    model: Transformer
    tokenizer: SubwordTokenizer
    path: Path


def shipped_model_dir() -> Path:
    """Where the package's pretrained Multi30k de-en model lives (it may be absent)."""
    return Path(attnkit.__file__).resolve().parent / "pretrained" / SHIPPED_MODEL


def resolve_model_dir(path: str | os.PathLike[str] | None) -> Path:
    """``path``, or the shipped model when ``path`` is None.

    Raises:
        FileNotFoundError: If ``path`` is None and the shipped model is not installed; the
            message says to pass ``--model`` or train a model.
    """
    if path is not None:
        return Path(path)
    folder = shipped_model_dir()
    if not (folder / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(
            f"no model given and the shipped model is not installed (looked in {folder}); "
            f"pass --model DIR, a folder with {CONFIG_FILE}, {WEIGHTS_FILE} and "
            f"{TOKENIZER_FILE}, or train one (see the training section of the README)"
        )
    return folder


def read_config(path: str | os.PathLike[str]) -> TransformerConfig:
    """The :class:`TransformerConfig` of a ``config.json`` (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: missing; expected the model's {CONFIG_FILE}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a valid JSON file ({err})") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if "model" in data:
        fields_ = data["model"]
        if not isinstance(fields_, dict):
            raise ValueError(f"{path}: expected \"model\" to be an object of TransformerConfig fields")
    else:
        known = {f.name for f in fields(TransformerConfig)}
        fields_ = {key: value for key, value in data.items() if key in known}
        if not fields_:
            raise ValueError(
                f"{path}: no TransformerConfig fields found, expected them at the top level or "
                f"under a \"model\" key; got keys {sorted(data)}"
            )
        ignored = sorted(set(data) - known)
        if ignored:
            logger.debug("%s: ignoring keys that are not TransformerConfig fields: %s", path, ignored)
    try:
        return TransformerConfig.from_dict(fields_)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: bad model config: {err}") from err


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise ValueError(f"{path}: missing; expected the model's {WEIGHTS_FILE}")
    try:
        return load_file(path)
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise ValueError(f"{path}: not a readable safetensors file ({err})") from err


def _fill_tied(model: Transformer, state: dict[str, torch.Tensor], path: Path) -> dict:
    """Give every alias of a tied parameter the tensor stored under one of its names."""
    groups: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), []).append(name)
    state = dict(state)
    for names in groups.values():
        present = [n for n in names if n in state]
        if not present or len(names) == 1:
            continue
        first = state[present[0]]
        for other in present[1:]:
            if state[other].shape != first.shape or not torch.equal(state[other], first):
                raise ValueError(
                    f"{path}: {present[0]!r} and {other!r} are tied in the model but differ "
                    "in the file"
                )
        for name in names:
            state.setdefault(name, first)
    return state


def load_translation_model(
    path: str | os.PathLike[str] | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> TranslationModel:
    """Load a model folder for decoding.

    Weights are cast to ``dtype`` whatever their stored dtype (bfloat16 -> float32 by default,
    which is also the fast choice on CPUs without bfloat16 matmul units).

    Args:
        path: the folder; None = the shipped model (:func:`resolve_model_dir`).
        device: where to put the model.
        dtype: floating dtype of the parameters.

    Returns:
        A :class:`TranslationModel` (model in eval mode).

    Raises:
        FileNotFoundError: If ``path`` is None and no model is shipped.
        ValueError: If ``path`` is not a folder, or a file is missing or corrupt, or the
            weights do not fit the config (the message names the file).
    """
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
    folder = resolve_model_dir(path)
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder; expected a model folder with {CONFIG_FILE}, "
                         f"{WEIGHTS_FILE} and {TOKENIZER_FILE}")
    config = read_config(folder / CONFIG_FILE)
    tokenizer_path = folder / TOKENIZER_FILE
    if not tokenizer_path.is_file():
        raise ValueError(f"{tokenizer_path}: missing; expected the model's {TOKENIZER_FILE}")
    try:
        tokenizer = SubwordTokenizer.load(tokenizer_path)
    except Exception as err:  # tokenizers raises plain Exception on malformed JSON
        raise ValueError(f"{tokenizer_path}: not a readable tokenizer ({err})") from err
    if tokenizer.vocab_size > config.tgt_vocab_size:
        raise ValueError(
            f"{tokenizer_path}: {tokenizer.vocab_size} tokens, more than the model's "
            f"tgt_vocab_size={config.tgt_vocab_size} in {folder / CONFIG_FILE}"
        )

    weights_path = folder / WEIGHTS_FILE
    state = _read_weights(weights_path)
    model = Transformer(config)
    state = _fill_tied(model, state, weights_path)
    try:
        model.load_state_dict(state, strict=True)  # copy_ casts e.g. bfloat16 -> float32
    except RuntimeError as err:
        raise ValueError(f"{weights_path}: does not match {folder / CONFIG_FILE}: {err}") from err
    model.to(device=device, dtype=dtype).eval()
    return TranslationModel(model, tokenizer, folder)


def save_translation_model(
    path: str | os.PathLike[str],
    model: Transformer,
    tokenizer: SubwordTokenizer,
    *,
    dtype: torch.dtype | None = None,
    extra_config: dict | None = None,
) -> Path:
    """Write a folder that :func:`load_translation_model` reads.

    Args:
        path: the folder (created if needed).
        model: the model; tied weights are written once.
        tokenizer: its tokenizer.
        dtype: cast the weights on the way out (e.g. bfloat16 to halve the file).
        extra_config: more top-level ``config.json`` keys (e.g. training settings).

    Returns:
        The folder.
    """
    from safetensors.torch import save_model

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model": model.config.to_dict(), **(extra_config or {})}
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tokenizer.save(folder / TOKENIZER_FILE)
    if dtype is None:
        save_model(model, os.fspath(folder / WEIGHTS_FILE))
    else:
        copy = Transformer(model.config)
        copy.load_state_dict(model.state_dict())
        save_model(copy.to(dtype), os.fspath(folder / WEIGHTS_FILE))
    return folder
