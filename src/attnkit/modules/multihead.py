"""Multi-head attention: self-attention with a fused QKV projection, cross-attention with a
fused KV projection (seeds 001-004), all heads in one call of the core function; with the
options of today's decoder-only models (grouped-query attention, rotary positions, a sliding
window)."""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.attention import check_window, scaled_dot_product_attention
from attnkit.modules.kv_cache import KVCache
from attnkit.modules.outputs import AttentionOutput
from attnkit.modules.packing import Packing
from attnkit.modules.rotary import RotaryAngles


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, ...).

    Parameters follow ``torch.nn.MultiheadAttention``: ``in_proj`` holds W^Q, W^K, W^V stacked
    (3 * d_model, d_model), so self-attention is one matmul, and cross-attention uses its first
    third for the queries and the other two thirds, fused, for keys and values. When the
    context has another width (``kv_dim``), queries and keys/values get their own projections.

    Options of decoder-only models (Llama, Mistral, Qwen):

    * ``num_kv_heads`` < ``num_heads``: grouped-query attention (1: multi-query attention). Keys
      and values have ``num_kv_heads`` heads, each serving ``num_heads / num_kv_heads`` query
      heads; ``in_proj`` is then (d_model + 2 * num_kv_heads * head_dim, d_model) and the cache
      holds only the key/value heads.
    * ``rotary`` (a forward argument, :class:`~attnkit.modules.rotary.RotaryAngles`): queries
      and keys are rotated by their positions before the attention function; the cache stores
      keys already rotated.
    * ``window``: sliding-window attention in causal self-attention; the cache then keeps at
      most ``window`` keys (:class:`KVCache`).

    Args:
        d_model: model width; split into ``num_heads`` heads of ``d_model // num_heads``.
        num_heads: number of heads H.
        dropout: dropout on the attention weights, in training only.
        bias: whether the projections have biases.
        kv_dim: width of the cross-attention context, if it differs from ``d_model``.
        num_kv_heads: key/value heads H_kv (default ``num_heads``); must divide ``num_heads``.
        qkv_bias: whether the query/key/value projections have biases (default ``bias``; Qwen2
            has them without an output bias).
        window: sliding window of causal self-attention (query i sees keys i - window < j <= i).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        kv_dim: int | None = None,
        num_kv_heads: int | None = None,
        qkv_bias: bool | None = None,
        window: int | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("d_model", d_model), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if d_model <= 0 or num_heads <= 0 or d_model % num_heads != 0:
            raise ValueError(
                f"d_model must be a positive multiple of num_heads, got d_model={d_model}, "
                f"num_heads={num_heads}"
            )
        if kv_dim is not None and (
            isinstance(kv_dim, bool) or not isinstance(kv_dim, numbers.Integral) or kv_dim < 1
        ):
            raise ValueError(f"kv_dim: expected a positive integer or None, got {kv_dim!r}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if (
            isinstance(num_kv_heads, bool)
            or not isinstance(num_kv_heads, numbers.Integral)
            or not 1 <= num_kv_heads <= num_heads
            or num_heads % num_kv_heads
        ):
            raise ValueError(
                f"num_heads must be a multiple of num_kv_heads (1 <= num_kv_heads <= num_heads), "
                f"got num_heads={num_heads}, num_kv_heads={num_kv_heads!r}"
            )
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, int | float)
            or not 0.0 <= dropout < 1.0
        ):
            raise ValueError(f"dropout: expected a probability in [0, 1), got {dropout!r}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_model // num_heads
        self.kv_width = num_kv_heads * self.head_dim  # width of all key (or value) heads
        self.dropout = dropout
        self.window = check_window(window)
        self.kv_dim = d_model if kv_dim is None else kv_dim
        qkv_bias = bias if qkv_bias is None else qkv_bias
        if self.kv_dim == d_model:
            self.in_proj = nn.Linear(d_model, d_model + 2 * self.kv_width, bias=qkv_bias)
        else:
            self.q_proj = nn.Linear(d_model, d_model, bias=qkv_bias)
            self.kv_proj = nn.Linear(self.kv_dim, 2 * self.kv_width, bias=qkv_bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        layout: str = "heads",
    ) -> KVCache:
        """An empty :class:`KVCache` for ``max_len`` positions of this layer's key/value heads
        (at most ``window`` of them kept, with a sliding window), stored in ``layout``
        (:class:`KVCache`: ``"positions"`` for beam search, whose steps reorder it)."""
        return KVCache(
            batch_size,
            self.num_kv_heads,
            max_len,
            self.head_dim,
            window=self.window,
            dtype=dtype,
            device=device,
            layout=layout,
        )

    def _split_heads(self, x: Tensor, heads: int | None = None) -> Tensor:
        b, t, _ = x.shape
        heads = self.num_heads if heads is None else heads
        return x.view(b, t, heads, self.head_dim).transpose(1, 2)  # (B, heads, T, hd)

    def _project_q(self, x: Tensor) -> Tensor:
        if self.kv_dim != self.d_model:
            return self.q_proj(x)
        d = self.d_model
        bias = None if self.in_proj.bias is None else self.in_proj.bias[:d]
        return F.linear(x, self.in_proj.weight[:d], bias)  # (B, T_q, D)

    def _project_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        if self.kv_dim != self.d_model:
            kv = self.kv_proj(context)
        else:
            d = self.d_model
            bias = None if self.in_proj.bias is None else self.in_proj.bias[d:]
            kv = F.linear(context, self.in_proj.weight[d:], bias)  # (B, T_k, 2 H_kv hd)
        k, v = kv.chunk(2, dim=-1)  # (B, T_k, H_kv hd) each
        return self._split_heads(k, self.num_kv_heads), self._split_heads(v, self.num_kv_heads)

    def _project_self(
        self, x: Tensor, rotary: RotaryAngles | None, packing: Packing | None = None
    ) -> tuple[Tensor, ...]:
        """Queries, keys and values of self-attention, rotated by ``rotary``: (B, H, T, hd),
        (B, H_kv, T, hd), (B, H_kv, T, hd). With ``packing``, x is (M, D) rows."""
        qkv = self.in_proj(x)  # (B, T, D + 2 H_kv hd) or (M, ...)
        if packing is not None:
            qkv = packing.unpack(qkv)  # (B, T, D + 2 H_kv hd), zeros at padding
        b, t, _ = qkv.shape
        if self.num_kv_heads == self.num_heads and rotary is None:
            qkv = qkv.view(b, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            return qkv.unbind(0)  # (B, H, T, hd) each
        h, h_kv = self.num_heads, self.num_kv_heads
        qkv = qkv.view(b, t, h + 2 * h_kv, self.head_dim)  # (B, T, H + 2 H_kv, hd)
        qk, v = (
            qkv[:, :, : h + h_kv],
            qkv[:, :, h + h_kv :],
        )  # (B, T, H + H_kv, hd), (B, T, H_kv, hd)
        if rotary is not None:
            if rotary.cos.shape[1] != t:
                raise ValueError(
                    f"rotary: angles for {rotary.cos.shape[1]} positions, but x has {t}"
                )
            if rotary.cos.shape[-1] != self.head_dim:  # (named here: rotate sees q and k stacked)
                raise ValueError(
                    f"rotary: angles of head_dim {rotary.cos.shape[-1]} (RotaryEmbedding("
                    f"{rotary.cos.shape[-1]})), but this attention's heads are {self.head_dim} "
                    f"wide (d_model={self.d_model} / num_heads={self.num_heads})"
                )
            qk = rotary.rotate(qk)  # queries and keys in one go
        q, k = qk[:, :, :h], qk[:, :, h:]
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hd)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        causal: bool = False,
        return_weights: bool = False,
        cache: KVCache | None = None,
        rotary: RotaryAngles | None = None,
        packing: Packing | None = None,
    ) -> AttentionOutput:
        """Attend from ``x`` to itself, or to ``context`` (cross-attention).

        Args:
            x: (B, T_q, d_model) queries (and keys/values for self-attention).
            context: (B_ctx, T_k, kv_dim) keys/values source for cross-attention. B_ctx may
                divide B: row ``i`` of the context then serves query rows ``i * B/B_ctx`` to
                ``(i + 1) * B/B_ctx - 1`` (the beams of one sentence share its keys/values).
            mask: boolean (True = may attend) or additive; (T_q, T_k), (B, T_q, T_k) (for all
                heads; a key mask is (B, 1, T_k)) or (B, H, T_q, T_k).
            causal: forbid attending to later positions (aligned to the end with a cache).
            return_weights: also return per-head weights (B, H, T_q, T_k) (the readable path).
            cache: for decoding. Self-attention appends this step's keys/values and attends to
                all of them (or the last ``window``; a mask over every slot so far is cut to
                the keys the cache returns); cross-attention fills it with the context's
                keys/values on the first call and reuses them afterwards without projecting
                ``context`` again. A call that fails after updating the cache (a mask of the
                wrong shape, an interrupt) takes the update back, so it can be retried.
            rotary: self-attention only: the angles of the T_q positions of ``x``
                (:class:`~attnkit.modules.RotaryEmbedding`), rotating queries and keys.
            packing: x holds only the rows :class:`~attnkit.modules.packing.Packing` lists,
                (M, d_model): the projections run on them, the queries, keys and values are
                scattered into the (B, T_q) layout for attention (zeros elsewhere, which the
                mask must hide) and the output is gathered back to (M, d_model). Training
                only: not with a cache or ``return_weights``.

        Returns:
            ``AttentionOutput(output, weights)``: output (B, T_q, d_model) (with
            ``packing``, (M, d_model)); weights
            (B, H, T_q, T_k) with ``return_weights``, else None (as ``torch.nn.MultiheadAttention``
            always returns a pair).
        """
        if packing is not None:
            if x.dim() != 2 or x.shape[-1] != self.d_model:
                raise ValueError(
                    f"x: expected packed rows (M, {self.d_model}), got {tuple(x.shape)}"
                )
            if cache is not None or return_weights:
                raise ValueError("packing: not supported with a cache or return_weights")
            b, t_q = packing.batch, packing.length
        elif x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected shape (B, T, {self.d_model}), got {tuple(x.shape)}")
        else:
            b, t_q, _ = x.shape
        weight = self.out_proj.weight
        for name, t in (("x", x), ("context", context)):
            if t is None:
                continue
            if not t.is_floating_point():
                raise TypeError(
                    f"{name}: expected a floating-point tensor (embeddings, hidden states), got "
                    f"dtype {t.dtype}"
                )
            if t.device != weight.device:
                raise ValueError(
                    f"{name}: on {t.device}, the module's weights on {weight.device}; move one "
                    f"of them ({name}.to({str(weight.device)!r}) or module.to({str(t.device)!r}))"
                )
            # Under autocast the projections cast their inputs (a meta tensor has no autocast).
            if t.dtype != weight.dtype and not (
                torch.amp.is_autocast_available(t.device.type)
                and torch.is_autocast_enabled(t.device.type)
            ):
                raise TypeError(
                    f"{name}: dtype {t.dtype} differs from the weights' {weight.dtype}; convert "
                    f"one of them ({name}.to({weight.dtype}) or module.to({t.dtype}))"
                )
        cross = context is not None
        group = 1  # query rows per context row
        if context is not None:
            if (
                context.dim() != 3
                or context.shape[0] == 0
                or b % context.shape[0] != 0
                or context.shape[-1] != self.kv_dim
            ):
                raise ValueError(
                    f"context: expected shape (B_ctx, T_k, {self.kv_dim}) with B_ctx dividing "
                    f"the {b} query rows, got {tuple(context.shape)}"
                )
            group = b // context.shape[0]
            if group > 1 and causal:
                raise ValueError("causal: not supported when context rows are shared by queries")
        if not cross and self.kv_dim != self.d_model:
            raise ValueError(
                f"context: required, since kv_dim={self.kv_dim} differs from d_model={self.d_model}"
            )
        if cross and (self.window is not None or rotary is not None):
            raise ValueError("window, rotary: options of self-attention, not cross-attention")

        saved = None  # the cache before this call's update, while the call may still fail
        if not cross:
            q, k, v = self._project_self(x, rotary, packing)  # (B, H, T_q, hd), (B, H_kv, ...)
            if cache is not None:
                saved = cache._state()
                k, v = cache.update(k, v)  # (B, H_kv, T_k, hd)
        else:
            # Cross-attention has no order among queries: the `group` query rows that share a
            # context row become one row of group * T_q queries.
            q = self._project_q(x)  # (B, T_q, D) or (M, D)
            if packing is not None:
                q = packing.unpack(q)  # (B, T_q, D)
            q = q.reshape(b // group, group * t_q, self.d_model)
            q = self._split_heads(q)  # (B_ctx, H, group * T_q, hd)
            if cache is not None and cache.length > 0:
                k, v = cache.get()
            else:
                k, v = self._project_kv(context)  # (B, H_kv, T_k, hd)
                if cache is not None:
                    saved = cache._state()
                    k, v = cache.update(k, v)
        # From here on a failure (a bad mask, an interrupt) takes the update back, so that a
        # retry with the cache is correct (GPT.forward does the same for its layers).
        given = None  # a 3-D mask as the caller gave it (named by a shape error)
        try:
            if saved is not None and not cross and mask is not None:
                mask = cache.select_keys(mask)  # (..., T_k)
            if mask is not None and mask.dim() == 3:
                given = mask
                mask = mask.unsqueeze(1)  # (B, 1, T_q, T_k): the same mask for every head
            result = scaled_dot_product_attention(
                q,
                k,
                v,
                mask,
                causal=causal,
                window=self.window,
                dropout=self.dropout if self.training else 0.0,
                return_weights=return_weights,
            )
            out, weights = result if return_weights else (result, None)
            out = out.transpose(1, 2).reshape(b, t_q, self.d_model)  # (B, T_q, D)
            if packing is not None:
                out = packing.pack(out)  # (M, D)
            if weights is not None and group > 1:
                # (B_ctx, H, group * T_q, T_k) -> (B, H, T_q, T_k)
                weights = weights.view(b // group, self.num_heads, group, t_q, -1).transpose(1, 2)
                weights = weights.reshape(b, self.num_heads, t_q, -1)
            return AttentionOutput(self.out_proj(out), weights)
        except BaseException as err:
            if saved is not None:
                cache._undo(saved, k, v)
            said = None if given is None else f"mask: shape {tuple(mask.shape)} "
            if isinstance(err, ValueError) and said and str(err).startswith(said):
                raise ValueError(  # the shape the caller passed, not the one made from it
                    f"mask: shape {tuple(given.shape)} (a (B, T_q, T_k) mask, read as "
                    f"{tuple(mask.shape)} for every head) " + str(err)[len(said) :]
                ) from None
            raise
