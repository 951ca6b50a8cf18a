"""The seed notes' teaching forms of attention, done right.

Each class keeps the seed's parameter names and initialisation order, so with the seed's
``torch.manual_seed`` it produces the numbers the seed prints; each computes attention by calling
the one core function, :func:`attnkit.scaled_dot_product_attention`, instead of repeating it.
Where a seed is wrong (the seed notes' own list of their mistakes) the class here does the right
thing:

* 001 ``SelfAttention_v1/_v2`` scale by a *global* ``d_k``; here the scale comes from the keys.
* 001's last cell builds ``CausalAttention`` where it means ``MultiHeadAttention``; here
  :class:`MultiHeadAttention` is the weight-split form that cell meant to show.
* 002 ``TransformerEncoderLayer.forward`` passes ``mask`` where ``query_mask`` goes; here
  masks have one meaning (boolean, True = may attend) and one place.
* Every seed returns NaN for a query that may attend to nothing; the core returns zeros.

After the seeds' classes come, in the same style, the two changes Llama-family models made to
attention: :class:`RotaryEmbedding` (RoPE) with :class:`RoPECausalAttention`, and
:class:`GroupedQueryAttention` (GQA and MQA), written out step by step beside the library's
fast path (:class:`attnkit.modules.RotaryEmbedding`, ``MultiHeadAttention(num_kv_heads=...)``
with ``rotary``), checked against Hugging Face's Llama and equal to the fast path.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor, nn

from attnkit.attention import scaled_dot_product_attention


def _check_sizes(**sizes) -> None:
    """Refuse a size that is not a positive integer, by its name."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")


def _check_dropout(dropout) -> None:
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
        raise ValueError(f"dropout: expected a probability in [0, 1), got {dropout!r}")


def _check_input(x, d_in: int, *, batched: bool, name: str = "x") -> None:
    """Refuse x unless it is a floating tensor (B, T, d_in), or (..., T, d_in) unbatched."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"{name}: expected a floating-point tensor, got {got}")
    if (x.dim() != 3 if batched else x.dim() < 2) or x.shape[-1] != d_in:
        form = "(B, T, " if batched else "(..., T, "
        raise ValueError(f"{name}: expected shape {form}{d_in}), got {tuple(x.shape)}")


class SelfAttention(nn.Module):
    """Seed 000: x W_q, x W_k, x W_v with d_q = d_k = ``d_out_kq`` and d_v = ``d_out_v``.

    Weights are ``torch.rand`` Parameters created in the order W_query, W_key, W_value.
    """

    def __init__(self, d_in: int, d_out_kq: int, d_out_v: int) -> None:
        super().__init__()
        _check_sizes(d_in=d_in, d_out_kq=d_out_kq, d_out_v=d_out_v)
        self.d_out_kq = d_out_kq
        self.W_query = nn.Parameter(torch.rand(d_in, d_out_kq))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out_kq))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out_v))

    def forward(self, x: Tensor, *, return_weights: bool = False):
        """x (..., T, d_in) -> context (..., T, d_out_v) [, weights (..., T, T)]."""
        _check_input(x, self.W_query.shape[0], batched=False)
        return scaled_dot_product_attention(
            x @ self.W_query, x @ self.W_key, x @ self.W_value, return_weights=return_weights
        )


class SelfAttentionV1(nn.Module):
    """Seed 001 ``SelfAttention_v1``: Parameters Q_weights, K_weights, V_weights (torch.rand).

    The seed divides by ``d_k**0.5`` with a *global* ``d_k``; here the scale is 1/sqrt of the
    keys' own width, so the module is correct whatever else is defined around it.
    """

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        _check_sizes(d_in=d_in, d_out=d_out)
        self.Q_weights = nn.Parameter(torch.rand(d_in, d_out))
        self.K_weights = nn.Parameter(torch.rand(d_in, d_out))
        self.V_weights = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x: Tensor) -> Tensor:
        """x (..., T, d_in) -> (..., T, d_out)."""
        _check_input(x, self.Q_weights.shape[0], batched=False)
        return scaled_dot_product_attention(
            x @ self.Q_weights, x @ self.K_weights, x @ self.V_weights
        )


class SelfAttentionV2(nn.Module):
    """Seed 001 ``SelfAttention_v2``: the same with ``nn.Linear`` projections (better init)."""

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False) -> None:
        super().__init__()
        _check_sizes(d_in=d_in, d_out=d_out)
        self.Q_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.K_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.V_weights = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: Tensor, *, causal: bool = False, return_weights: bool = False):
        """x (..., T, d_in) -> (..., T, d_out) [, weights (..., T, T)]."""
        _check_input(x, self.Q_weights.in_features, batched=False)
        return scaled_dot_product_attention(
            self.Q_weights(x),
            self.K_weights(x),
            self.V_weights(x),
            causal=causal,
            return_weights=return_weights,
        )


class CausalAttention(nn.Module):
    """Seed 001 ``CausalAttention``: batched, causal, dropout on the attention weights.

    ``context_len`` is the longest sequence accepted (the seed's mask buffer size); the causal
    mask itself comes from the core function.
    """

    def __init__(
        self, d_in: int, d_out: int, context_len: int, dropout: float, qkv_bias: bool = False
    ) -> None:
        super().__init__()
        _check_sizes(d_in=d_in, d_out=d_out, context_len=context_len)
        _check_dropout(dropout)
        self.d_out = d_out
        self.context_len = context_len
        self.Q_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.K_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.V_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, d_in) -> (B, T, d_out)."""
        _check_input(x, self.Q_weights.in_features, batched=False)
        if x.shape[-2] > self.context_len:
            raise ValueError(f"x: {x.shape[-2]} tokens exceed context_len={self.context_len}")
        return scaled_dot_product_attention(
            self.Q_weights(x),
            self.K_weights(x),
            self.V_weights(x),
            causal=True,
            dropout=self.dropout if self.training else 0.0,
        )


class MultiHeadAttentionWrapper(nn.Module):
    """Seed 001: ``heads`` independent :class:`CausalAttention` modules, outputs concatenated."""

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_len: int,
        dropout: float,
        heads: int,
        qkv_bias: bool = False,
    ) -> None:
        super().__init__()
        _check_sizes(heads=heads)
        self.heads = nn.ModuleList(
            CausalAttention(d_in, d_out, context_len, dropout, qkv_bias) for _ in range(heads)
        )

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, d_in) -> (B, T, heads * d_out)."""
        return torch.cat([head(x) for head in self.heads], dim=-1)


class MultiHeadAttention(nn.Module):
    """Seed 001 ``MultiHeadAttention`` by weight split: one projection, viewed as heads.

    This is what the seed's last cell meant to run (it builds ``CausalAttention`` instead).
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_len: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
    ) -> None:
        super().__init__()
        _check_sizes(d_in=d_in, d_out=d_out, context_len=context_len, num_heads=num_heads)
        _check_dropout(dropout)
        if d_out % num_heads != 0:
            raise ValueError(
                f"d_out must be divisible by num_heads, got d_out={d_out}, num_heads={num_heads}"
            )
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.context_len = context_len
        self.Q_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.K_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.V_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = dropout

    def _heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, d_in) -> (B, T, d_out)."""
        _check_input(x, self.Q_weights.in_features, batched=True)
        b, t, _ = x.shape
        if t > self.context_len:
            raise ValueError(f"x: {t} tokens exceed context_len={self.context_len}")
        context = scaled_dot_product_attention(
            self._heads(self.Q_weights(x)),
            self._heads(self.K_weights(x)),
            self._heads(self.V_weights(x)),
            causal=True,
            dropout=self.dropout if self.training else 0.0,
        )  # (B, H, T, hd)
        context = context.transpose(1, 2).reshape(b, t, self.d_out)  # (B, T, d_out)
        return self.out_proj(context)


class AttentionHead(nn.Module):
    """Seed 002 ``AttentionHead``: one head with its own q, k, v projections.

    The seed takes ``query_mask``/``key_mask`` and multiplies them into a mask; here a key mask
    and a query mask are plain boolean masks (True = may attend) combined by broadcasting.
    """

    def __init__(self, embed_dim: int, head_dim: int) -> None:
        super().__init__()
        _check_sizes(embed_dim=embed_dim, head_dim=head_dim)
        self.q = nn.Linear(embed_dim, head_dim)
        self.k = nn.Linear(embed_dim, head_dim)
        self.v = nn.Linear(embed_dim, head_dim)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        """(B, T_q, E), (B, T_k, E), (B, T_k, E) -> (B, T_q, head_dim)."""
        for name, x in (("query", query), ("key", key), ("value", value)):
            _check_input(x, self.q.in_features, batched=False, name=name)
        return scaled_dot_product_attention(self.q(query), self.k(key), self.v(value), mask)


class PerHeadMultiHeadAttention(nn.Module):
    """Seed 002 ``MultiHeadAttention``: a list of :class:`AttentionHead` and ``output_linear``.

    Same function as :class:`attnkit.MultiHeadAttention`, computed one head at a time; the
    library's class does all heads in one call.
    """

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        _check_sizes(embed_dim=embed_dim, num_heads=num_heads)
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim must be divisible by num_heads, got embed_dim={embed_dim}, "
                f"num_heads={num_heads}"
            )
        head_dim = embed_dim // num_heads
        self.heads = nn.ModuleList(AttentionHead(embed_dim, head_dim) for _ in range(num_heads))
        self.output_linear = nn.Linear(embed_dim, embed_dim)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        """(B, T_q, E) -> (B, T_q, E)."""
        x = torch.cat([head(query, key, value, mask) for head in self.heads], dim=-1)
        return self.output_linear(x)


# --------------------------------------------------------------------------- modern attention
# Not in the seeds: what Llama-family models (Llama, Mistral, Qwen) changed, in the same style.


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE, Su et al. 2021): positions as rotations, not additions.

    The ``head_dim`` = d dimensions of a query or key form d/2 pairs. Pair ``i`` of the token at
    position ``m`` is turned by the angle ``m * theta_i``, with ``theta_i = base^(-2i/d)``: the
    first pair turns one radian per position, the last almost not at all. Turning both vectors
    keeps their lengths, and since R(a)^T R(b) = R(b - a),

        (R(m) q) . (R(n) k) = q . R(n - m) k,

    a score depends on the two positions only through their distance ``m - n``.

    Two layouts pair the dimensions differently (the same rotation, the dimensions permuted):

    * ``interleaved=False``: pair i is (i, i + d/2), Hugging Face Llama and GPT-NeoX (their
      ``rotate_half``);
    * ``interleaved=True``: pair i is (2i, 2i + 1), the RoPE paper, GPT-J and Meta's Llama code
      (there each pair is one complex number, multiplied by ``e^(i m theta_i)``).

    Args:
        head_dim: d, the width of the vectors rotated; even.
        base: the base of the angles (10,000 in the paper and Llama 2; Llama 3 uses 500,000).
        interleaved: the pairing of the dimensions, as above.
    """

    def __init__(self, head_dim: int, base: float = 10_000.0, *, interleaved: bool = False):
        super().__init__()
        even = (
            isinstance(head_dim, numbers.Integral)
            and not isinstance(head_dim, bool)
            and head_dim % 2 == 0
        )
        if not even or head_dim <= 0:
            raise ValueError(f"head_dim: expected a positive even number, got {head_dim!r}")
        if isinstance(base, bool) or not isinstance(base, numbers.Real) or not base > 1.0:
            raise ValueError(f"base: expected a number > 1, got {base!r}")
        self.head_dim = head_dim
        self.base = float(base)
        self.interleaved = interleaved

    def angles(self, positions: Tensor) -> Tensor:
        """positions (T,) -> angles (T, d/2): ``angles[m, i] = positions[m] * theta_i``.

        In float32 (float64 for float64 positions), as Hugging Face computes them.
        """
        dtype = torch.float64 if positions.dtype == torch.float64 else torch.float32
        i = torch.arange(self.head_dim // 2, dtype=dtype, device=positions.device)  # (d/2,)
        theta = 1.0 / self.base ** (2 * i / self.head_dim)  # (d/2,) base^(-2i/d)
        return positions.to(dtype)[:, None] * theta[None, :]  # (T, d/2)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Rotate x (..., T, d) by its positions (T,), default 0, 1, ..., T - 1."""
        if x.dim() < 2 or x.shape[-1] != self.head_dim:
            raise ValueError(f"x: expected shape (..., T, {self.head_dim}), got {tuple(x.shape)}")
        t = x.shape[-2]
        if positions is None:
            positions = torch.arange(t, device=x.device)
        if positions.shape != (t,):
            raise ValueError(
                f"positions: expected shape ({t},), one per token of x, got {tuple(positions.shape)}"
            )
        angles = self.angles(positions)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)  # (T, d/2) each
        if self.interleaved:
            x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., T, d/2): dims 0, 2, ... and 1, 3, ...
        else:
            x1, x2 = x.chunk(2, dim=-1)  # (..., T, d/2): first half, second half
        # Each pair (x1, x2) times the 2x2 rotation [[cos, -sin], [sin, cos]]:
        y1 = x1 * cos - x2 * sin
        y2 = x1 * sin + x2 * cos
        if self.interleaved:
            return torch.stack((y1, y2), dim=-1).flatten(-2)  # (..., T, d/2, 2) -> (..., T, d)
        return torch.cat((y1, y2), dim=-1)  # (..., T, d)


class RoPECausalAttention(CausalAttention):
    """Seed 001's :class:`CausalAttention` with RoPE: queries and keys rotated before the scores.

    Nothing is added to the inputs: the positions enter only through the rotation, so the
    scores see how far apart two tokens are, not where they are. Values are not rotated.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_len: int,
        dropout: float,
        qkv_bias: bool = False,
        *,
        base: float = 10_000.0,
        interleaved: bool = False,
    ) -> None:
        super().__init__(d_in, d_out, context_len, dropout, qkv_bias)
        self.rope = RotaryEmbedding(d_out, base, interleaved=interleaved)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, d_in) -> (B, T, d_out)."""
        _check_input(x, self.Q_weights.in_features, batched=False)
        if x.shape[-2] > self.context_len:
            raise ValueError(f"x: {x.shape[-2]} tokens exceed context_len={self.context_len}")
        queries = self.rope(self.Q_weights(x))  # (B, T, d_out), token m turned by m * theta
        keys = self.rope(self.K_weights(x))  # (B, T, d_out)
        values = self.V_weights(x)  # (B, T, d_out)
        return scaled_dot_product_attention(
            queries, keys, values, causal=True, dropout=self.dropout if self.training else 0.0
        )


class GroupedQueryAttention(nn.Module):
    """Grouped-query attention (GQA, Ainslie et al. 2023): fewer key/value heads than queries.

    ``num_heads`` query heads share ``num_kv_heads`` key/value heads: the query heads form
    ``num_kv_heads`` groups of ``num_heads // num_kv_heads`` consecutive heads, and group ``j``
    reads key/value head ``j``. The keys and values (and a decoder's KV cache) shrink by that
    factor; the queries keep every head. ``num_kv_heads = num_heads`` is seed 001's
    :class:`MultiHeadAttention` (same parameters, same result); ``num_kv_heads = 1`` is
    multi-query attention (MQA, Shazeer 2019). Causal, as in a decoder; with ``rope_base``,
    queries and keys are rotated per head by :class:`RotaryEmbedding` (Llama's attention).

    Parameters keep seed 001's names; ``K_weights`` and ``V_weights`` are narrower:
    (d_in -> num_kv_heads * head_dim).
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_len: int,
        dropout: float,
        num_heads: int,
        num_kv_heads: int,
        qkv_bias: bool = False,
        *,
        rope_base: float | None = None,
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        _check_sizes(
            d_in=d_in,
            d_out=d_out,
            context_len=context_len,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
        )
        _check_dropout(dropout)
        if d_out % num_heads != 0:
            raise ValueError(
                f"d_out must be a multiple of num_heads, got d_out={d_out}, num_heads={num_heads}"
            )
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads must be a multiple of num_kv_heads, got num_heads={num_heads}, "
                f"num_kv_heads={num_kv_heads}"
            )
        self.d_out = d_out
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_out // num_heads
        self.context_len = context_len
        self.Q_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.K_weights = nn.Linear(d_in, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.V_weights = nn.Linear(d_in, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = dropout
        self.rope = (
            None
            if rope_base is None
            else RotaryEmbedding(self.head_dim, rope_base, interleaved=interleaved)
        )

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, d_in) -> (B, T, d_out)."""
        _check_input(x, self.Q_weights.in_features, batched=True)
        b, t, _ = x.shape
        if t > self.context_len:
            raise ValueError(f"x: {t} tokens exceed context_len={self.context_len}")
        hd = self.head_dim
        q = self.Q_weights(x).view(b, t, self.num_heads, hd).transpose(1, 2)  # (B, H, T, hd)
        k = self.K_weights(x).view(b, t, self.num_kv_heads, hd).transpose(1, 2)  # (B, H_kv, T, hd)
        v = self.V_weights(x).view(b, t, self.num_kv_heads, hd).transpose(1, 2)  # (B, H_kv, T, hd)
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)  # every head turned by the same angles
        # Each key/value head serves its group of query heads: repeat it group times, so that
        # query head h meets key/value head h // group.
        group = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(group, dim=1)  # (B, H, T, hd)
        v = v.repeat_interleave(group, dim=1)  # (B, H, T, hd)
        context = scaled_dot_product_attention(
            q, k, v, causal=True, dropout=self.dropout if self.training else 0.0
        )  # (B, H, T, hd)
        context = context.transpose(1, 2).reshape(b, t, self.d_out)  # (B, T, d_out)
        return self.out_proj(context)
