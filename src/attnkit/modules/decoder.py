"""The decoder: masked self-attention, cross-attention to the encoder, feed-forward."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.modules.feed_forward import FeedForward
from attnkit.modules.kv_cache import KVCache
from attnkit.modules.multihead import MultiHeadAttention
from attnkit.modules.residual import Residual


class DecoderLayer(nn.Module):
    """One decoder layer: Residual(causal self-attention) -> Residual(cross-attention) ->
    Residual(feed-forward). Arguments as :class:`~attnkit.modules.encoder.EncoderLayer`."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.1,
        attn_dropout: float | None = None,
        ffn_dropout: float | None = None,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ) -> None:
        super().__init__()
        attn_dropout = dropout if attn_dropout is None else attn_dropout
        ffn_dropout = dropout if ffn_dropout is None else ffn_dropout
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=attn_dropout, bias=bias)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=attn_dropout, bias=bias)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, dropout=ffn_dropout, bias=bias)
        block = dict(dropout=dropout, norm_first=norm_first, eps=layer_norm_eps)
        self.self_block = Residual(d_model, **block)
        self.cross_block = Residual(d_model, **block)
        self.ffn_block = Residual(d_model, **block)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        *,
        causal: bool = True,
        cache: tuple[KVCache, KVCache] | None = None,
        return_weights: bool = False,
    ):
        """Decode one layer.

        Args:
            x: (B, T, d_model) target states.
            memory: (B, S, d_model) encoder output.
            self_mask: extra mask for self-attention, (T, T) / (B, T, T) / (B, H, T, T).
            memory_mask: mask for cross-attention, usually the source key mask (B, 1, S).
            causal: mask later target positions (aligned to the end with a cache).
            cache: (self-attention cache, cross-attention cache) for incremental decoding.
            return_weights: also return self- and cross-attention weights.

        Returns:
            (B, T, d_model), or ``(x, self_weights, cross_weights)``.
        """
        self_cache, cross_cache = cache if cache is not None else (None, None)
        x = self.self_block(
            x,
            lambda h: self.self_attn(
                h, mask=self_mask, causal=causal, return_weights=return_weights, cache=self_cache
            ),
        )
        x, self_w = x if return_weights else (x, None)
        x = self.cross_block(
            x,
            lambda h: self.cross_attn(
                h, memory, mask=memory_mask, return_weights=return_weights, cache=cross_cache
            ),
        )
        x, cross_w = x if return_weights else (x, None)
        x = self.ffn_block(x, self.ffn)
        return (x, self_w, cross_w) if return_weights else x


class Decoder(nn.Module):
    """A stack of :class:`DecoderLayer` with an optional final LayerNorm.

    Args:
        num_layers: number of layers.
        final_norm: apply LayerNorm after the last layer (needed for pre-LN).
        **layer_kwargs: the :class:`DecoderLayer` arguments.
    """

    def __init__(self, num_layers: int, *, final_norm: bool = False, **layer_kwargs) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(**layer_kwargs) for _ in range(num_layers))
        eps = layer_kwargs.get("layer_norm_eps", 1e-5)
        self.norm = nn.LayerNorm(layer_kwargs["d_model"], eps=eps) if final_norm else None

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        memory_len: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> list[tuple[KVCache, KVCache]]:
        """One (self, cross) cache pair per layer, for ``max_len`` target positions."""
        caches = []
        for layer in self.layers:
            h, hd = layer.self_attn.num_heads, layer.self_attn.head_dim
            kw = dict(dtype=dtype, device=device)
            caches.append(
                (
                    KVCache(batch_size, h, max_len, hd, **kw),
                    KVCache(batch_size, h, memory_len, hd, **kw),
                )
            )
        return caches

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        *,
        causal: bool = True,
        caches: list[tuple[KVCache, KVCache]] | None = None,
        return_weights: bool = False,
    ):
        """(B, T, d_model) -> (B, T, d_model); with weights, also lists of per-layer self- and
        cross-attention weights."""
        self_ws, cross_ws = [], []
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                memory,
                self_mask,
                memory_mask,
                causal=causal,
                cache=None if caches is None else caches[i],
                return_weights=return_weights,
            )
            if return_weights:
                x, sw, cw = x
                self_ws.append(sw)
                cross_ws.append(cw)
        if self.norm is not None:
            x = self.norm(x)
        return (x, self_ws, cross_ws) if return_weights else x
