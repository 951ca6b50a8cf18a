"""The fixed return shapes of attnkit's layers (x-transformers' "always the same tuple").

Every module returns the same NamedTuple whatever its flags: a weights field is ``None`` unless
``return_weights=True`` was asked for, so callers unpack one shape (``hidden, _ = layer(x)``)
or read fields by name (``layer(x).hidden``).
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class AttentionOutput(NamedTuple):
    """What :class:`~attnkit.modules.MultiHeadAttention` returns."""

    output: Tensor  # (B, T_q, d_model)
    weights: Tensor | None  # (B, H, T_q, T_k) per-head weights, or None


class LayerOutput(NamedTuple):
    """What :class:`~attnkit.modules.EncoderLayer` returns."""

    hidden: Tensor  # (B, T, d_model)
    weights: Tensor | None  # (B, H, T, T_k) self-attention weights, or None


class EncoderOutput(NamedTuple):
    """What :class:`~attnkit.modules.Encoder` returns."""

    hidden: Tensor  # (B, T, d_model), after the final LayerNorm if there is one
    weights: list[Tensor] | None  # one (B, H, T, T_k) per layer, or None


class DecoderLayerOutput(NamedTuple):
    """What :class:`~attnkit.modules.DecoderLayer` returns."""

    hidden: Tensor  # (B, T, d_model)
    self_weights: Tensor | None  # (B, H, T, T_k), or None
    cross_weights: Tensor | None  # (B, H, T, S), or None


class DecoderOutput(NamedTuple):
    """What :class:`~attnkit.modules.Decoder` returns."""

    hidden: Tensor  # (B, T, d_model), after the final LayerNorm if there is one
    self_weights: list[Tensor] | None  # one (B, H, T, T_k) per layer, or None
    cross_weights: list[Tensor] | None  # one (B, H, T, S) per layer, or None


class EncodeOutput(NamedTuple):
    """What :meth:`attnkit.models.Transformer.encode` returns."""

    memory: Tensor  # (B, S, d_model)
    src_mask: Tensor  # (B, 1, S) bool, True = real source token
    weights: list[Tensor] | None  # one (B, H, S, S) per encoder layer, or None


class DecodeOutput(NamedTuple):
    """What :meth:`attnkit.models.Transformer.decode` returns."""

    output: Tensor  # logits (B, T, V), or hidden states (B, T, d_model) with project=False
    self_weights: list[Tensor] | None  # one (B, H, T, T_k) per decoder layer, or None
    cross_weights: list[Tensor] | None  # one (B, H, T, S) per decoder layer, or None
