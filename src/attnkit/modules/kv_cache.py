"""A preallocated key/value cache for incremental decoding (the gpt-fast design)."""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Keys and values of one attention layer, kept between decoding steps.

    The buffers are allocated once at their full length, so every step writes in place and
    shapes stay fixed; :meth:`reorder` follows the hypotheses that beam search keeps.

    Args:
        batch_size: rows (sentences x beams).
        num_heads: attention heads H.
        max_len: the most positions the cache will hold.
        head_dim: size of one head's keys and values.
        dtype: buffer dtype.
        device: buffer device.
    """

    def __init__(
        self,
        batch_size: int,
        num_heads: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (batch_size, num_heads, max_len, head_dim)  # (B, H, T_max, hd)
        # Uninitialised: only the first `length` positions are ever read, and zero-filling
        # every buffer costs a noticeable share of a short decode.
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append (B, H, T, hd) keys and values; return everything cached so far."""
        b, h, _, hd = self.k.shape
        if k.shape != v.shape or k.dim() != 4 or (k.shape[0], k.shape[1], k.shape[3]) != (b, h, hd):
            raise ValueError(
                f"KVCache.update: expected k and v of shape ({self.k.shape[0]}, "
                f"{self.k.shape[1]}, T, {self.k.shape[3]}), got {tuple(k.shape)} and "
                f"{tuple(v.shape)}"
            )
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(
                f"KVCache.update: {end} positions exceed the cache's max_len={self.max_len}"
            )
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, H, T_so_far, hd) each

    def get(self) -> tuple[Tensor, Tensor]:
        """Everything cached so far, (B, H, T_so_far, hd) each."""
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (B',) of the batch, e.g. the beams selected at this step.

        With as many rows as before (a beam step) only the filled positions are gathered and
        written back in place, so the buffers keep their size and address and a step costs
        O(length), not O(max_len); a shrinking batch (finished sentences) gets new buffers.
        """
        n = self.length
        if index.shape[0] == self.k.shape[0]:
            # The right side is gathered into a new tensor before the write: no aliasing.
            self.k[:, :, :n] = self.k[:, :, :n].index_select(0, index)
            self.v[:, :, :n] = self.v[:, :, :n].index_select(0, index)
        else:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)
