"""The decoder: masked self-attention, cross-attention to the encoder, feed-forward."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.modules.feed_forward import FeedForward
from attnkit.modules.kv_cache import KVCache
from attnkit.modules.multihead import MultiHeadAttention
from attnkit.modules.outputs import DecoderLayerOutput, DecoderOutput
from attnkit.modules.packing import Packing
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
        packing: Packing | None = None,
    ) -> DecoderLayerOutput:
        """Decode one layer.

        Args:
            x: (B, T, d_model) target states.
            memory: (B, S, d_model) encoder output.
            self_mask: extra mask for self-attention, (T, T) / (B, T, T) / (B, H, T, T).
            memory_mask: mask for cross-attention, usually the source key mask (B, 1, S).
            causal: mask later target positions (aligned to the end with a cache).
            cache: (self-attention cache, cross-attention cache) for incremental decoding.
            return_weights: also return self- and cross-attention weights.
            packing: x is (M, d_model), the rows of the (B, T) targets that
                :class:`~attnkit.modules.packing.Packing` lists (training; no cache).

        Returns:
            ``DecoderLayerOutput(hidden, self_weights, cross_weights)``: hidden (B, T, d_model);
            weights (B, H, T, T_k) and (B, H, T, S), or None.

        Raises:
            TypeError: ``memory`` is not a tensor (None would turn cross-attention into a
                second self-attention over ``x``).
        """
        if not isinstance(memory, Tensor):
            raise TypeError(
                "memory: expected the encoder output, a (B, S, d_model) tensor, got "
                f"{type(memory).__name__}"
            )
        self_cache, cross_cache = cache if cache is not None else (None, None)
        self_attn = self.self_attn(
            self.self_block.pre(x),
            mask=self_mask,
            causal=causal,
            return_weights=return_weights,
            cache=self_cache,
            packing=packing,
        )
        x = self.self_block.post(x, self_attn.output)
        cross_attn = self.cross_attn(
            self.cross_block.pre(x),
            memory,
            mask=memory_mask,
            return_weights=return_weights,
            cache=cross_cache,
            packing=packing,
        )
        x = self.cross_block.post(x, cross_attn.output)
        x = self.ffn_block(x, self.ffn)
        return DecoderLayerOutput(x, self_attn.weights, cross_attn.weights)


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
        """One (self, cross) cache pair per layer, for ``max_len`` target positions; the
        self-attention caches position-major, for the reorder of every beam step
        (:class:`~attnkit.modules.KVCache`)."""
        kw = dict(dtype=dtype, device=device)
        return [
            (
                layer.self_attn.init_cache(batch_size, max_len, layout="positions", **kw),
                layer.cross_attn.init_cache(batch_size, memory_len, **kw),
            )
            for layer in self.layers
        ]

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
        packing: Packing | None = None,
    ) -> DecoderOutput:
        """Run every layer (arguments as :meth:`DecoderLayer.forward`, one cache pair per layer).

        With ``packing`` x is still (B, T, d_model): the stack packs it into rows, runs the
        layers on them, and returns (B, T, d_model) with zeros at the positions not packed.

        Returns:
            ``DecoderOutput(hidden, self_weights, cross_weights)``: hidden (B, T, d_model);
            weights lists of one tensor per layer, or None.
        """
        if caches is not None and len(caches) != len(self.layers):
            raise ValueError(
                f"caches: expected one (self, cross) KVCache pair per layer ({len(self.layers)}), "
                f"got {len(caches)}"
            )
        if packing is not None:
            x = packing.pack(x)  # (M, d_model)
        self_ws, cross_ws = [], []
        for i, layer in enumerate(self.layers):
            x, self_w, cross_w = layer(
                x,
                memory,
                self_mask,
                memory_mask,
                causal=causal,
                cache=None if caches is None else caches[i],
                return_weights=return_weights,
                packing=packing,
            )
            self_ws.append(self_w)
            cross_ws.append(cross_w)
        if self.norm is not None:
            x = self.norm(x)
        if packing is not None:
            x = packing.unpack(x)  # (B, T, d_model)
        if not return_weights:
            return DecoderOutput(x, None, None)
        return DecoderOutput(x, self_ws, cross_ws)
