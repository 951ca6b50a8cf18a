"""Hugging Face BERT checkpoints -> :class:`~attnkit.models.bert.BertModel`, key by key.

The mapping is explicit (:func:`hf_key_sources`): every attnkit parameter names the checkpoint
key(s) it is made of. Hugging Face keeps query, key and value as three projections; they are
stacked, in that order, into attnkit's fused ``in_proj``. Checkpoints of task models (a
``bert.`` prefix) and old TensorFlow names (``gamma`` / ``beta``) are read; constant buffers and
pre-training heads (``cls.*``) are skipped. A key that maps nowhere, or a parameter no key
fills, is an error naming them. Files are read by :mod:`attnkit.model_folder`; building the
model is :meth:`BertModel.from_pretrained`'s.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from attnkit.models.bert import BertConfig

logger = logging.getLogger(__name__)

__all__ = ["hf_key_sources", "state_from_hf"]

# Keys that are in Hugging Face checkpoints but are not weights of this model.
_IGNORED_KEYS = ("embeddings.position_ids", "embeddings.token_type_ids")  # constant buffers
_IGNORED_PREFIXES = ("cls.predictions.", "cls.seq_relationship.")  # pre-training heads


def hf_key_sources(config: BertConfig, *, pooler: bool) -> dict[str, tuple[str, ...]]:
    """attnkit parameter name -> the Hugging Face checkpoint key(s) it is made of.

    ``in_proj`` is made of three (query, key and value, stacked in that order).
    """
    sources = {
        "embeddings.word.weight": ("embeddings.word_embeddings.weight",),
        "embeddings.positions.embedding.weight": ("embeddings.position_embeddings.weight",),
        "embeddings.token_type.weight": ("embeddings.token_type_embeddings.weight",),
    }
    for p in ("weight", "bias"):
        sources[f"embeddings.norm.{p}"] = (f"embeddings.LayerNorm.{p}",)
    for i in range(config.num_hidden_layers):
        ours, hf = f"encoder.layers.{i}.", f"encoder.layer.{i}."
        for p in ("weight", "bias"):
            sources[f"{ours}self_attn.in_proj.{p}"] = tuple(
                f"{hf}attention.self.{name}.{p}" for name in ("query", "key", "value")
            )
            sources[f"{ours}self_attn.out_proj.{p}"] = (f"{hf}attention.output.dense.{p}",)
            sources[f"{ours}attn_block.norm.{p}"] = (f"{hf}attention.output.LayerNorm.{p}",)
            sources[f"{ours}ffn.linear1.{p}"] = (f"{hf}intermediate.dense.{p}",)
            sources[f"{ours}ffn.linear2.{p}"] = (f"{hf}output.dense.{p}",)
            sources[f"{ours}ffn_block.norm.{p}"] = (f"{hf}output.LayerNorm.{p}",)
    if pooler:
        for p in ("weight", "bias"):
            sources[f"pooler.{p}"] = (f"pooler.dense.{p}",)
    return sources


def _canonical(key: str) -> str:
    """Strip the ``bert.`` prefix of task-model checkpoints; old TF names gamma/beta."""
    key = key.removeprefix("bert.")
    if key.endswith(".gamma"):
        key = key[: -len("gamma")] + "weight"
    elif key.endswith(".beta"):
        key = key[: -len("beta")] + "bias"
    return key


def state_from_hf(
    checkpoint: dict[str, Tensor], config: BertConfig, source: Path
) -> tuple[dict[str, Tensor], bool]:
    """Hugging Face state dict -> (attnkit state dict, whether it has a pooler)."""
    hf: dict[str, Tensor] = {}
    heads = []
    for key, value in checkpoint.items():
        name = _canonical(key)
        if name in _IGNORED_KEYS:
            continue
        if name.startswith(_IGNORED_PREFIXES):
            heads.append(key)
            continue
        if name in hf:
            raise ValueError(f"{source}: key {key!r} duplicates another key naming {name!r}")
        hf[name] = value
    if heads:
        logger.info("%s: ignored %d keys of pre-training heads (cls.*)", source.name, len(heads))

    add_pooler = any(k.startswith("pooler.") for k in hf)
    sources = hf_key_sources(config, pooler=add_pooler)
    needed = {k for keys in sources.values() for k in keys}
    missing = sorted(needed - hf.keys())
    unknown = sorted(hf.keys() - needed)
    if missing or unknown:
        raise ValueError(
            f"{source}: checkpoint does not match BertModel("
            f"num_hidden_layers={config.num_hidden_layers}): missing keys {missing}, "
            f"unknown keys {unknown}"
        )
    state = {}
    for ours, keys in sources.items():
        parts = [hf[k] for k in keys]
        if len({p.shape for p in parts}) > 1:
            shapes = {k: tuple(p.shape) for k, p in zip(keys, parts, strict=True)}
            raise ValueError(f"{source}: query, key and value differ in shape: {shapes}")
        state[ours] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
    return state, add_pooler
