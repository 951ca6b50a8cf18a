"""Argument checks shared by the modules: sizes that must be positive integers, and inputs
that must be floating-point tensors of a given width. The messages name the argument."""

from __future__ import annotations

import numbers

from torch import Tensor


def check_size(name: str, value: object) -> None:
    """Raises a ValueError naming ``name`` unless ``value`` is an integer >= 1 (a width, a
    length: 0 or less would build empty or invalid weights, or fail later in torch's words)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")


def check_features(x: object, width: int, name: str = "x") -> None:
    """Raises unless ``x`` is a floating-point tensor whose last dimension is ``width``:
    TypeError for integer or bool tensors (a float module cannot take them; adding a float
    table to them truncates it), ValueError for the wrong width."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"{name}: expected a floating-point tensor (embeddings, hidden states), got "
            f"dtype {x.dtype}"
        )
    if x.dim() == 0 or x.shape[-1] != width:
        raise ValueError(f"{name}: expected shape (..., {width}), got {tuple(x.shape)}")
