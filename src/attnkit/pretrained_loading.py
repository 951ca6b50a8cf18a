"""Loading any model folder attnkit reads: a translation folder, a Hugging Face BERT folder, a
GPT-2 folder (attnkit's language models included) or a Hugging Face Llama, Mistral or Qwen2
folder, by what its ``config.json`` says.

It sits above :mod:`attnkit.decoding` and :mod:`attnkit.models`, whose loaders it calls;
:mod:`attnkit.model_folder` (below them) tells the kinds apart
(:func:`~attnkit.model_folder.folder_kind`) without knowing a model class.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from attnkit import model_folder as mf
from attnkit.decoding.loading import load_translation_model, resolve_model_dir
from attnkit.models.bert import BertModel
from attnkit.models.gpt import GPT

__all__ = ["LoadedModel", "load_pretrained"]


class LoadedModel(NamedTuple):
    """What :func:`load_pretrained` returns."""

    model_type: str  # the folder's kind: "translation", "bert" or one of mf.GPT_KINDS
    model: nn.Module  # in eval mode
    tokenizer: Any  # SubwordTokenizer, BertTokenizer or GPTTokenizer (None: no tokenizer.json)
    folder: Path

    @property
    def is_gpt(self) -> bool:
        """A decoder-only language model (:class:`~attnkit.models.GPT`): GPT-2 or Llama-family."""
        return self.model_type in mf.GPT_KINDS


def load_pretrained(
    folder: str | os.PathLike[str] | None,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str = torch.float32,
) -> LoadedModel:
    """Loads a translation, Hugging Face BERT, GPT-2 (attnkit's language models included),
    Llama, Mistral or Qwen2 folder, by what its ``config.json`` says
    (:func:`~attnkit.model_folder.folder_kind`); None = the shipped translation model. The
    model is in eval mode on ``device`` in ``dtype``.

    Raises:
        ValueError: If the folder or its ``config.json`` is missing or unreadable, or it
            holds a kind of model attnkit does not load (naming the file).
    """
    dtype = mf.floating_dtype(dtype)  # before reading anything
    folder = resolve_model_dir(folder)
    kind = mf.expect_kind(folder, mf.read_config(folder), *mf.LOADABLE_KINDS)
    if kind == "bert":
        model = BertModel.from_pretrained(folder, dtype=dtype).to(device)
        return LoadedModel(kind, model, model.tokenizer, folder)
    if kind in mf.GPT_KINDS:
        model = GPT.from_pretrained(folder, device=device, dtype=dtype)
        return LoadedModel(kind, model, model.tokenizer, folder)
    loaded = load_translation_model(folder, device=device, dtype=dtype)
    return LoadedModel(kind, loaded.model, loaded.tokenizer, folder)
