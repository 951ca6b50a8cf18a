"""Rotary position embeddings (RoPE, Su et al. 2021): positions as rotations of queries and keys.

Instead of adding a position vector to the token embedding, RoPE rotates each pair of a head's
query and key dimensions by the angle ``position * inv_freq[i]``, so that the score q . k
depends on the two positions only through their difference. :class:`RotaryEmbedding` turns
positions into the cosines and sines of those angles (:class:`RotaryAngles`), once per forward
pass; :class:`~attnkit.modules.MultiHeadAttention` rotates its queries and keys with them
before the one attention function, and its cache stores keys already rotated, so a cached key
never needs its position again.

inv_freq[i] = base^(-2i / head_dim) for i = 0 .. head_dim/2 - 1 (Hugging Face's computation, in
float32), optionally rescaled:

* ``"linear"`` (position interpolation): inv_freq / factor;
* ``"llama3"`` (Llama 3.1): wavelengths 2 pi / inv_freq longer than
  ``original_context / low_freq_factor`` are divided by ``factor``, those shorter than
  ``original_context / high_freq_factor`` are kept, and those between are interpolated smoothly.

Two layouts pair the dimensions differently:

* half-split (Hugging Face, GPT-NeoX): dimension i goes with i + head_dim/2;
* interleaved (GPT-J, Meta's original Llama code): dimension 2i goes with 2i + 1.

They are the same rotation of permuted dimensions: Hugging Face's Llama conversion script
permutes the rows of W_q and W_k so that a model trained interleaved runs half-split.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

__all__ = ["ROPE_SCALINGS", "RotaryAngles", "RotaryEmbedding"]

ROPE_SCALINGS = ("none", "linear", "llama3")


class RotaryAngles(NamedTuple):
    """The cosines and sines of one forward pass's positions, from :class:`RotaryEmbedding`."""

    cos: Tensor  # (B or 1, T, 1, head_dim): broadcasts over the heads of (B, T, heads, head_dim)
    sin: Tensor  # (B or 1, T, 1, head_dim)
    interleaved: bool  # the layout (module docstring)
    # Half-split only: sin with its first half negated, made once per forward pass (None: made
    # at each rotate). (B or 1, T, 1, head_dim)
    signed_sin: Tensor | None = None

    def rotate(self, x: Tensor) -> Tensor:
        """Rotate x (B, T, heads, head_dim), queries or keys laid out as projected.

        Returns:
            (B, T, heads, head_dim): x cos + rotate(x) sin, in x's dtype.
        """
        cos, sin = self.cos, self.sin
        if x.shape[-1] != cos.shape[-1] or cos.shape[0] not in (1, x.shape[0]):
            raise ValueError(
                f"rotary: angles of shape {tuple(cos.shape)} (B or 1, T, 1, head_dim) do not fit "
                f"x of shape {tuple(x.shape)} (B, T, heads, head_dim)"
            )
        if cos.dtype != x.dtype:  # autocast: the projections run in a narrower dtype
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        if self.interleaved:
            pairs = x.unflatten(-1, (-1, 2))  # (B, T, heads, head_dim/2, 2)
            turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
            return x * cos + turned * sin
        # Half-split: rotate(x) = [-x2, x1], so rotate(x) * sin = [x2, x1] * [-sin1, sin2]
        # (the same products, the sign moved: equal bit for bit), and [x2, x1] is one roll
        # where [-x2, x1] is four operators: a decoding step rotates in every layer.
        half = x.shape[-1] // 2
        signed = _signed_sin(sin) if self.signed_sin is None else self.signed_sin
        if signed.dtype != x.dtype:  # autocast; a negation commutes with the rounding
            signed = signed.to(x.dtype)
        return x * cos + torch.roll(x, half, dims=-1) * signed


class RotaryEmbedding(nn.Module):
    """Positions -> :class:`RotaryAngles` (module docstring).

    The inverse frequencies are kept in float32 outside the module's buffers, so that casting a
    model to bfloat16 does not round them (the angles are cast to the model's dtype at the end,
    as Hugging Face does).

    Args:
        head_dim: width of one head (even).
        base: the base of the frequencies (Hugging Face ``rope_theta``).
        scaling: ``"none"``, ``"linear"`` or ``"llama3"``.
        factor: the scaling factor (``"linear"``, ``"llama3"``).
        low_freq_factor: ``"llama3"``'s ``low_freq_factor``.
        high_freq_factor: ``"llama3"``'s ``high_freq_factor``.
        original_context: ``"llama3"``'s ``original_max_position_embeddings``.
        interleaved: pair dimensions 2i, 2i+1 (GPT-J) instead of i, i + head_dim/2 (HF).
    """

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        scaling: str = "none",
        factor: float = 1.0,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        original_context: int = 8192,
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        if (
            isinstance(head_dim, bool)
            or not isinstance(head_dim, int)
            or head_dim < 2
            or head_dim % 2
        ):
            raise ValueError(f"head_dim: expected a positive even integer, got {head_dim!r}")
        _check_positive("base", base)
        if scaling not in ROPE_SCALINGS:
            raise ValueError(
                f"scaling: unsupported RoPE scaling {scaling!r}; expected one of "
                f"{list(ROPE_SCALINGS)}"
            )
        if scaling != "none":
            _check_positive("factor", factor)
        if scaling == "llama3":
            _check_positive("low_freq_factor", low_freq_factor)
            if not high_freq_factor > low_freq_factor:
                raise ValueError(
                    f"high_freq_factor: expected more than low_freq_factor={low_freq_factor}, got "
                    f"{high_freq_factor!r}"
                )
            if isinstance(original_context, bool) or not (
                isinstance(original_context, int) and original_context >= 1
            ):
                raise ValueError(
                    f"original_context: expected a positive integer, got {original_context!r}"
                )
        self.head_dim = head_dim
        self.interleaved = bool(interleaved)
        self.settings = dict(
            base=base,
            scaling=scaling,
            factor=factor,
            low_freq_factor=low_freq_factor,
            high_freq_factor=high_freq_factor,
            original_context=original_context,
        )
        self._inv_freq = {torch.device("cpu"): _inv_freq(head_dim, **self.settings)}

    @property
    def inv_freq(self) -> Tensor:
        """(head_dim / 2,) float32, on the CPU."""
        return self._inv_freq[torch.device("cpu")]

    def forward(self, positions: Tensor, *, dtype: torch.dtype = torch.float32) -> RotaryAngles:
        """Angles of integer ``positions`` (B, T) or (T,), cast to ``dtype``.

        Returns:
            :class:`RotaryAngles` with cos and sin (B or 1, T, 1, head_dim).
        """
        if positions.dim() == 1:
            positions = positions[None]  # (1, T)
        if (
            positions.dim() != 2
            or positions.is_floating_point()
            or positions.is_complex()
            or positions.dtype == torch.bool
        ):
            raise ValueError(
                f"positions: expected integer positions (B, T) or (T,), got shape "
                f"{tuple(positions.shape)} dtype {positions.dtype}"
            )
        device = positions.device
        if device not in self._inv_freq:
            self._inv_freq[device] = self.inv_freq.to(device)
        # Hugging Face's order of operations, so the angles are the same floats.
        freqs = positions[..., None].float() * self._inv_freq[device]  # (B, T, hd/2)
        if self.interleaved:
            angles = freqs.repeat_interleave(2, dim=-1)  # (B, T, hd): f0 f0 f1 f1 ...
        else:
            angles = torch.cat((freqs, freqs), dim=-1)  # (B, T, hd): f0 f1 ... f0 f1 ...
        cos = angles.cos().to(dtype)[:, :, None, :]  # (B, T, 1, hd)
        sin = angles.sin().to(dtype)[:, :, None, :]
        signed = None if self.interleaved else _signed_sin(sin)
        return RotaryAngles(cos, sin, self.interleaved, signed)

    def extra_repr(self) -> str:
        layout = "interleaved" if self.interleaved else "half-split"
        return f"head_dim={self.head_dim}, {layout}, " + ", ".join(
            f"{k}={v}" for k, v in self.settings.items()
        )


def _signed_sin(sin: Tensor) -> Tensor:
    """(..., head_dim) -> [-sin[..., :half], sin[..., half:]], half = head_dim / 2."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _check_positive(name: str, value) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not (ok and value > 0):
        raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")


def _inv_freq(
    head_dim: int,
    *,
    base: float,
    scaling: str,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_context: int,
) -> Tensor:
    """(head_dim / 2,) float32 inverse frequencies, computed as Hugging Face computes them."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (float(base) ** exponents)  # (hd/2,)
    if scaling == "linear":
        return inv_freq / factor
    if scaling == "llama3":
        low_freq_wavelen = original_context / low_freq_factor
        high_freq_wavelen = original_context / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (original_context / wavelen - low_freq_factor) / (
            high_freq_factor - low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv_freq
