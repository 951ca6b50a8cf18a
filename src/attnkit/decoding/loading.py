"""Translation model folders: ``config.json`` + ``model.safetensors`` + ``tokenizer.json``.

The folder layout is the one the trainer writes and the package ships in
``attnkit/pretrained/multi30k_de_en/`` (files, errors and atomic writes:
:mod:`attnkit.model_folder`):

* ``config.json``: the :class:`~attnkit.models.TransformerConfig` fields, either under a
  ``"model"`` key (other top-level keys, such as training settings, are then ignored) or at
  the top level (keys that are not config fields are ignored there);
* ``config.json`` may also hold a ``"decoding"`` object: the search settings the model was
  tuned with (:data:`~attnkit.decoding.config.SEARCH_FIELDS`; the shipped model's length
  penalty was chosen on the validation set), the defaults :func:`model_decoding` returns;
* ``model.safetensors``: the state dict, in any floating dtype (the shipped model is bfloat16);
  tied weights are stored once;
* ``tokenizer.json``: a :class:`~attnkit.data.SubwordTokenizer`.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, NamedTuple

import torch

import attnkit
from attnkit import model_folder as mf
from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.decoding.config import DecodingConfig
from attnkit.models.transformer import Transformer, TransformerConfig

logger = logging.getLogger(__name__)

SHIPPED_MODEL = "multi30k_de_en"
DECODING_KEY = "decoding"  # config.json: the folder's default search settings


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
    if not (folder / mf.WEIGHTS_FILE).is_file():
        raise FileNotFoundError(
            f"no model given and the shipped model is not installed (looked in {folder}); "
            f"pass --model DIR, a folder with {mf.CONFIG_FILE}, {mf.WEIGHTS_FILE} and "
            f"{mf.TOKENIZER_FILE}, or train one (see the training section of the README)"
        )
    return folder


def model_config_from(raw: Mapping[str, Any], path: Path) -> TransformerConfig:
    """The :class:`TransformerConfig` in a ``config.json`` dict (module docstring); ``path``
    names the file in errors."""
    if "model" in raw:
        fields_ = raw["model"]
        if not isinstance(fields_, Mapping):
            raise ValueError(
                f'{path}: "model": expected an object of TransformerConfig fields, got '
                f"{type(fields_).__name__}"
            )
    else:
        known = {f.name for f in fields(TransformerConfig)}
        fields_ = {key: value for key, value in raw.items() if key in known}
        if not fields_:
            raise ValueError(
                f"{path}: no TransformerConfig fields found, expected them at the top level or "
                f'under a "model" key; got keys {sorted(raw)}'
            )
        ignored = sorted(set(raw) - known)
        if ignored:
            logger.debug(
                "%s: ignoring keys that are not TransformerConfig fields: %s", path, ignored
            )
    try:
        return TransformerConfig.from_dict(dict(fields_))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: bad model config: {err}") from None


def read_model_config(folder: str | os.PathLike[str]) -> TransformerConfig:
    """The :class:`TransformerConfig` of a translation folder's ``config.json``.

    Raises:
        ValueError: If the file is missing or unreadable, describes another kind of model
            (a Hugging Face BERT folder), or a field is of the wrong type or out of range.
    """
    folder = Path(folder)
    raw = mf.read_config(folder)
    mf.expect_kind(folder, raw, "translation", allow_unknown=True)  # fields at the top level
    return model_config_from(raw, folder / mf.CONFIG_FILE)


def model_decoding(folder: str | os.PathLike[str] | None) -> DecodingConfig:
    """The decoding defaults of a translation folder (None = the shipped model): its
    ``config.json``'s ``"decoding"`` settings over :class:`DecodingConfig`'s defaults, or those
    defaults when it has none.

    Raises:
        ValueError: naming the file, for a setting that is unknown or out of bounds.
    """
    folder = resolve_model_dir(folder)
    raw = mf.read_config(folder)
    if DECODING_KEY not in raw:
        return DecodingConfig()
    where = f'{folder / mf.CONFIG_FILE}: "{DECODING_KEY}"'
    return DecodingConfig.from_search_settings(raw[DECODING_KEY], where)


def model_languages(folder: str | os.PathLike[str] | None) -> tuple[str, str] | None:
    """``(src_lang, tgt_lang)`` of a folder trained on Multi30k (None = the shipped model), as
    its training settings say: ``config.json``'s ``"data"`` (what ``attnkit train`` writes)
    or, failing that, the ``[data]`` table of the ``config.toml`` beside it (the shipped
    model's). None when the folder does not say, was trained on another corpus, or has no
    ``config.json`` yet (the loader reports that).

    Raises:
        ValueError: naming the file, for a ``config.json`` or ``config.toml`` that is not valid.
    """
    import tomllib

    folder = resolve_model_dir(folder)
    if not (folder / mf.CONFIG_FILE).is_file():
        return None
    data = mf.read_config(folder).get("data")
    toml = folder / "config.toml"
    if not isinstance(data, Mapping) and toml.is_file():
        try:
            data = tomllib.loads(toml.read_text(encoding="utf-8")).get("data")
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
            raise ValueError(f"{toml}: not a valid TOML file ({err})") from None
    if not isinstance(data, Mapping) or data.get("corpus") != "multi30k":
        return None
    src, tgt = data.get("src_lang"), data.get("tgt_lang")
    if not (isinstance(src, str) and isinstance(tgt, str)):
        return None
    return src, tgt


def load_tokenizer(folder: str | os.PathLike[str]) -> SubwordTokenizer:
    """The :class:`SubwordTokenizer` in ``folder/tokenizer.json``, with errors naming it."""
    path = Path(folder) / mf.TOKENIZER_FILE
    if path.is_dir():
        raise ValueError(f"{path}: a folder, expected the model's {mf.TOKENIZER_FILE}")
    if not path.is_file():
        raise mf.MissingFileError(f"{path}: missing; expected the model's {mf.TOKENIZER_FILE}")
    return SubwordTokenizer.load(path)  # a damaged file: a ValueError naming it


def load_translation_model(
    path: str | os.PathLike[str] | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str = torch.float32,
) -> TranslationModel:
    """Load a model folder for decoding.

    Weights are cast to ``dtype`` whatever their stored dtype (bfloat16 -> float32 by default,
    which is also the fast choice on CPUs without bfloat16 matmul units).

    Args:
        path: the folder; None = the shipped model (:func:`resolve_model_dir`).
        device: where to put the model.
        dtype: floating dtype of the parameters, or its name ("bfloat16";
            :func:`attnkit.model_folder.floating_dtype`).

    Returns:
        A :class:`TranslationModel` (model in eval mode).

    Raises:
        FileNotFoundError: If ``path`` is None and no model is shipped.
        ValueError: If ``path`` is not a folder, or a file is missing or corrupt, or the
            weights do not fit the config or hold NaN or inf (the message names the file).
    """
    dtype = mf.floating_dtype(dtype)
    folder = resolve_model_dir(path)
    config = read_model_config(folder)
    tokenizer = load_tokenizer(folder)
    if tokenizer.vocab_size > config.tgt_vocab_size:
        raise ValueError(
            f"{folder / mf.TOKENIZER_FILE}: {tokenizer.vocab_size} tokens, more than the model's "
            f"tgt_vocab_size={config.tgt_vocab_size} in {folder / mf.CONFIG_FILE}"
        )
    state = mf.read_weights(folder)
    mf.check_finite(state, folder / mf.WEIGHTS_FILE, use=mf.USE_NONFINITE)
    model = Transformer(config)
    mf.load_state_dict_into(
        model,
        state,
        source=folder / mf.WEIGHTS_FILE,
        against=os.fspath(folder / mf.CONFIG_FILE),
    )
    model.to(device=device, dtype=dtype).eval()
    return TranslationModel(model, tokenizer, folder)


def write_translation_files(
    folder: Path,
    model: Transformer,
    tokenizer: SubwordTokenizer,
    config: Mapping[str, Any],
    *,
    dtype: torch.dtype | None = None,
) -> None:
    """Writes weights, ``config`` and tokenizer into ``folder`` (a temporary folder of
    :func:`attnkit.model_folder.atomic_folder`)."""
    mf.write_weights(folder / mf.WEIGHTS_FILE, model, dtype=dtype)
    mf.write_json(folder / mf.CONFIG_FILE, config)
    tokenizer.save(folder / mf.TOKENIZER_FILE)


def save_translation_model(
    path: str | os.PathLike[str],
    model: Transformer,
    tokenizer: SubwordTokenizer,
    *,
    dtype: torch.dtype | None = None,
    extra_config: dict | None = None,
    extra_files: Mapping[str, str | os.PathLike[str]] | None = None,
    decoding: DecodingConfig | None = None,
) -> Path:
    """Write a folder that :func:`load_translation_model` reads, atomically.

    An existing ``path`` is replaced only if attnkit wrote it
    (:func:`attnkit.model_folder.check_replaceable`).

    Args:
        path: the folder (its parents are created if needed).
        model: the model; tied weights are written once.
        tokenizer: its tokenizer.
        dtype: cast the weights on the way out (e.g. bfloat16 to halve the file).
        extra_config: more top-level ``config.json`` keys (e.g. training settings).
        extra_files: name in the folder -> file to copy there (names of
            :data:`attnkit.model_folder.FOLDER_FILES`, e.g. ``train.log``).
        decoding: the folder's default search settings (its ``search_settings()``, read back
            by :func:`model_decoding`); None writes none (the defaults of DecodingConfig).

    Returns:
        The folder.
    """
    folder = Path(path)
    config = {"model": model.config.to_dict(), **(extra_config or {})}
    if decoding is not None:
        config[DECODING_KEY] = decoding.search_settings()
    with mf.atomic_folder(folder) as tmp:
        write_translation_files(tmp, model, tokenizer, config, dtype=dtype)
        for name, source in (extra_files or {}).items():
            shutil.copyfile(source, tmp / name)
    return folder
