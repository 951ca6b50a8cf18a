"""Choosing the next token from (filtered) logits: greedy or a seeded random draw."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["argmax", "make_generator", "sample", "select"]


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded with ``seed`` (reproducible), or from the OS when ``seed`` is None."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed: expected an int or None, got {type(seed).__name__}")
        generator.manual_seed(seed)
    return generator


def sample(logits: Tensor, generator: torch.Generator) -> Tensor:
    """Draw one token per row from ``softmax(logits)`` (B, V); ``-inf`` logits are never drawn.

    Inverse-CDF sampling, as ``torch.multinomial`` does, but ~20x faster on CPU at GPT-2's
    vocabulary (one uniform per row and a binary search in the cumulative probabilities):
    the first id whose cumulative probability exceeds ``u * total`` is drawn, so an id of
    probability 0 (an empty interval) never is.

    Returns:
        (B,) int64 ids.
    """
    probs = torch.softmax(logits.float(), dim=-1)  # (B, V)
    cdf = probs.cumsum(dim=-1)  # (B, V), non-decreasing
    total = cdf[:, -1:]  # (B, 1), 1 up to rounding
    u = torch.rand(total.shape, generator=generator, device=total.device) * total
    u = torch.minimum(u, total.nextafter(torch.zeros_like(total)))  # strictly below the total
    return torch.searchsorted(cdf, u, right=True).squeeze(1)  # (B,)


def argmax(logits: Tensor) -> Tensor:
    """The index of each row's largest logit (the first one of ties), (B,) int64.

    On CPU, float32/float64 rows go to numpy's vectorised argmax: 4 us for a 50,257-wide row
    where ``torch.argmax`` takes 29 us (measured on the benchmark machine). Both return the
    first maximal index, NaN counting as the largest value.
    """
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(np.argmax(logits.detach().numpy(), axis=-1)).long()  # (B,)
    return logits.argmax(dim=-1)


def select(logits: Tensor, generator: torch.Generator | None) -> Tensor:
    """The next tokens (B,): the argmax when ``generator`` is None (greedy), else a draw."""
    if generator is None:
        return argmax(logits)
    return sample(logits, generator)
