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
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.attention import scaled_dot_product_attention


class SelfAttention(nn.Module):
    """Seed 000: x W_q, x W_k, x W_v with d_q = d_k = ``d_out_kq`` and d_v = ``d_out_v``.

    Weights are ``torch.rand`` Parameters created in the order W_query, W_key, W_value.
    """

    def __init__(self, d_in: int, d_out_kq: int, d_out_v: int) -> None:
        super().__init__()
        self.d_out_kq = d_out_kq
        self.W_query = nn.Parameter(torch.rand(d_in, d_out_kq))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out_kq))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out_v))

    def forward(self, x: Tensor, *, return_weights: bool = False):
        """x (..., T, d_in) -> context (..., T, d_out_v) [, weights (..., T, T)]."""
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
        self.Q_weights = nn.Parameter(torch.rand(d_in, d_out))
        self.K_weights = nn.Parameter(torch.rand(d_in, d_out))
        self.V_weights = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x: Tensor) -> Tensor:
        """x (..., T, d_in) -> (..., T, d_out)."""
        return scaled_dot_product_attention(
            x @ self.Q_weights, x @ self.K_weights, x @ self.V_weights
        )


class SelfAttentionV2(nn.Module):
    """Seed 001 ``SelfAttention_v2``: the same with ``nn.Linear`` projections (better init)."""

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False) -> None:
        super().__init__()
        self.Q_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.K_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.V_weights = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: Tensor, *, causal: bool = False, return_weights: bool = False):
        """x (..., T, d_in) -> (..., T, d_out) [, weights (..., T, T)]."""
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
        self.d_out = d_out
        self.context_len = context_len
        self.Q_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.K_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.V_weights = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, d_in) -> (B, T, d_out)."""
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
        self.q = nn.Linear(embed_dim, head_dim)
        self.k = nn.Linear(embed_dim, head_dim)
        self.v = nn.Linear(embed_dim, head_dim)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        """(B, T_q, E), (B, T_k, E), (B, T_k, E) -> (B, T_q, head_dim)."""
        return scaled_dot_product_attention(self.q(query), self.k(key), self.v(value), mask)


class PerHeadMultiHeadAttention(nn.Module):
    """Seed 002 ``MultiHeadAttention``: a list of :class:`AttentionHead` and ``output_linear``.

    Same function as :class:`attnkit.MultiHeadAttention`, computed one head at a time; the
    library's class does all heads in one call.
    """

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
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
