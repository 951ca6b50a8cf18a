"""Position information: the paper's sinusoidal encoding (seeds 003/004) and learned position
embeddings (seed 002, BERT)."""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn

from attnkit.modules._checks import check_size


def _check_input(x: Tensor, offset: int, max_len: int, d_model: int) -> None:
    """x (B, T, d_model) and the first position ``offset`` fit the encoding, or a ValueError
    names what does not (a negative offset read positions from the end of the table)."""
    if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != d_model:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x: expected shape (B, T, {d_model}), got {shape}")
    if not x.is_floating_point():  # an integer x would truncate the encoding to integers
        raise TypeError(
            f"x: expected a floating-point tensor (token embeddings), got dtype {x.dtype}"
        )
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or offset < 0:
        raise ValueError(f"offset: expected an integer >= 0 (the first position), got {offset!r}")
    length = x.shape[1]
    if offset + length > max_len:
        raise ValueError(
            f"sequence length {offset + length} (offset {offset} + length {length}) exceeds "
            f"max_len={max_len} of the positional encoding"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same).

    The table is a non-persistent buffer (it is a formula, not a weight). The arguments come in
    the Annotated Transformer's order, ``(d_model, max_len)``; :class:`LearnedPositionalEmbedding`
    takes ``nn.Embedding``'s, ``(max_len, d_model)``: by name, either reads the same.

    Args:
        d_model: model width (even).
        max_len: the longest sequence it encodes.
    """

    def __init__(self, d_model: int, max_len: int = 1024) -> None:
        super().__init__()
        if (
            isinstance(d_model, bool)
            or not isinstance(d_model, numbers.Integral)
            or d_model <= 0
            or d_model % 2
        ):
            raise ValueError(f"d_model: expected a positive even number, got {d_model!r}")
        check_size("max_len", max_len)
        self.max_len = max_len
        position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (T, 1)
        div = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model)
        )  # (d_model / 2,)
        pe = torch.zeros(max_len, d_model, dtype=torch.float64)
        pe[:, 0::2] = torch.sin(position * div)
        pe[:, 1::2] = torch.cos(position * div)
        self.register_buffer("pe", pe.float(), persistent=False)  # (T_max, d_model)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Add the encoding of positions ``offset .. offset + T - 1`` to x (B, T, d_model)."""
        _check_input(x, offset, self.max_len, self.pe.shape[1])
        return x + self.pe[offset : offset + x.shape[1]].to(x.dtype)


class LearnedPositionalEmbedding(nn.Module):
    """A trained vector per position (seed 002, BERT's ``position_embeddings``).

    The arguments come in ``nn.Embedding``'s order (rows, width), the reverse of
    :class:`SinusoidalPositionalEncoding`'s ``(d_model, max_len)``.

    Args:
        max_len: the number of positions.
        d_model: model width.
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        check_size("max_len", max_len)
        check_size("d_model", d_model)
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Add the embeddings of positions ``offset .. offset + T - 1`` to x (B, T, d_model)."""
        _check_input(x, offset, self.max_len, self.embedding.embedding_dim)
        positions = torch.arange(offset, offset + x.shape[1], device=x.device)  # (T,)
        return x + self.embedding(positions).to(x.dtype)
