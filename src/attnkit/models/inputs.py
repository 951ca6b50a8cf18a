"""What the models take, checked one way: token ids and 0/1 attention masks.

:class:`~attnkit.models.GPT`, :class:`~attnkit.models.BertModel` and
:class:`~attnkit.models.Transformer` refuse bad ids and masks with the same messages, naming the
argument, where torch would raise an ``IndexError`` from inside an embedding (an id outside the
vocabulary) or silently take a 2 or a 0.5 for "real token".
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_token_ids", "mask_to_bool"]


def check_token_ids(
    name: str, ids: Tensor, vocab_size: int | None, *, shape: str = "(B, T)", what: str = "token id"
) -> None:
    """Refuse ``ids`` that are not a 2-D integer tensor, or hold an id outside
    ``[0, vocab_size)``.

    The range is read back from the device (one sync, one reduction), so a caller checks it
    where ids enter a model, not at every decoding step of a search that chose the ids itself:
    ``vocab_size`` None checks type and shape only, as do meta ids (shapes without values).

    Raises:
        TypeError: ``ids`` is not a tensor.
        ValueError: naming ``name``, for another shape, a dtype other than int64 and int32
            (the embeddings' own: a float, bool or small integer one), or an id outside the
            vocabulary.
    """
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):  # what embeddings take
        raise ValueError(
            f"{name}: expected integer token ids of shape {shape}, got shape {tuple(ids.shape)} "
            f"dtype {ids.dtype} (ids are int64 or int32)"
        )
    if vocab_size is None or ids.numel() == 0 or ids.is_meta or torch.compiler.is_compiling():
        return  # meta ids hold no values; a compiled graph (optim.compile) breaks at a read-back
    low, high = (int(v) for v in torch.aminmax(ids))
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{name}: {what} {bad} is outside the vocabulary [0, {vocab_size})")


def mask_to_bool(attention_mask: Tensor, ids: Tensor, *, ids_name: str = "ids") -> Tensor:
    """``attention_mask`` (bool, or integers 0/1; 1 = real token) as a bool (B, T) tensor on
    ids' device, after checking it has the shape of ``ids`` (called ``ids_name``).

    Raises:
        TypeError: not a tensor, or a float or complex mask.
        ValueError: another shape than ``ids``, or integers other than 0 and 1 (a 2 or a 0.5 is
            not a padding flag, and casting would call it real; a meta mask has no values to
            check).
    """
    if not isinstance(attention_mask, Tensor):
        raise TypeError(
            f"attention_mask: expected a torch.Tensor, got {type(attention_mask).__name__}"
        )
    if attention_mask.shape != ids.shape:
        raise ValueError(
            f"attention_mask: expected the shape of {ids_name} {tuple(ids.shape)}, got "
            f"{tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype != torch.bool:
        if attention_mask.is_floating_point() or attention_mask.is_complex():
            raise TypeError(
                "attention_mask: expected bool or 0/1 integers (1 = real token), got dtype "
                f"{attention_mask.dtype}"
            )
        if not attention_mask.is_meta and bool(
            ((attention_mask != 0) & (attention_mask != 1)).any()
        ):
            raise ValueError("attention_mask: expected only 0 and 1 (1 = real token)")
        attention_mask = attention_mask != 0
    return attention_mask.to(ids.device)
