"""The encoder: self-attention and feed-forward, each in a residual block (seeds 002, 004).

With ``causal=True`` and a :class:`KVCache` per layer the same stack is a decoder-only (GPT)
model: a GPT block is an encoder layer whose self-attention is causal. The options of today's
decoder-only models (RMSNorm, SwiGLU, grouped-query attention, rotary positions, a sliding
window) are options of these same layers.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor, nn

from attnkit.modules.feed_forward import FeedForward
from attnkit.modules.kv_cache import KVCache
from attnkit.modules.multihead import MultiHeadAttention
from attnkit.modules.norm import make_norm
from attnkit.modules.outputs import EncoderOutput, LayerOutput
from attnkit.modules.packing import Packing
from attnkit.modules.residual import Residual
from attnkit.modules.rotary import RotaryAngles


class EncoderLayer(nn.Module):
    """One encoder layer: x -> Residual(self-attention) -> Residual(feed-forward).

    Args:
        d_model: model width.
        num_heads: attention heads.
        d_ff: feed-forward hidden width.
        dropout: residual and feed-forward dropout.
        attn_dropout: dropout on attention weights (default: ``dropout``, as torch.nn does).
        ffn_dropout: dropout on the feed-forward's hidden activations (default: ``dropout``,
            as torch.nn does; BERT uses 0).
        activation: a name of :data:`~attnkit.modules.feed_forward.ACTIVATIONS` (``"relu"``,
            ``"gelu"``, ``"gelu_tanh"``, ``"silu"``).
        norm_first: pre-LN when true, the paper's post-LN when false.
        layer_norm_eps: the norm's epsilon (BERT uses 1e-12).
        bias: whether linear layers have biases.
        norm: ``"layer"`` (LayerNorm) or ``"rms"`` (RMSNorm).
        gated: the gated feed-forward (SwiGLU with ``activation="silu"``).
        num_kv_heads: key/value heads of grouped-query attention (default ``num_heads``).
        qkv_bias: biases of the query/key/value projection (default ``bias``).
        window: sliding window of the (causal) self-attention.
    """

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
        norm: str = "layer",
        gated: bool = False,
        num_kv_heads: int | None = None,
        qkv_bias: bool | None = None,
        window: int | None = None,
    ) -> None:
        super().__init__()
        attn_dropout = dropout if attn_dropout is None else attn_dropout
        ffn_dropout = dropout if ffn_dropout is None else ffn_dropout
        self.self_attn = MultiHeadAttention(
            d_model,
            num_heads,
            dropout=attn_dropout,
            bias=bias,
            num_kv_heads=num_kv_heads,
            qkv_bias=qkv_bias,
            window=window,
        )
        self.ffn = FeedForward(
            d_model, d_ff, activation=activation, dropout=ffn_dropout, bias=bias, gated=gated
        )
        block = dict(dropout=dropout, norm_first=norm_first, eps=layer_norm_eps, norm=norm)
        self.attn_block = Residual(d_model, **block)
        self.ffn_block = Residual(d_model, **block)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        causal: bool = False,
        cache: KVCache | None = None,
        return_weights: bool = False,
        rotary: RotaryAngles | None = None,
        packing: Packing | None = None,
    ) -> LayerOutput:
        """Encode one layer.

        Args:
            x: (B, T, d_model); with a cache, only the positions not yet cached.
            mask: as in :class:`MultiHeadAttention`, (T, T_k) / (B, T, T_k) / (B, H, T, T_k),
                T_k counting the cached positions too.
            causal: forbid attending to later positions (aligned to the end with a cache).
            cache: the self-attention cache: this call's keys/values are appended and the
                queries attend to everything cached so far.
            return_weights: also return the self-attention weights.
            rotary: the angles of the T positions (rotary position embeddings).
            packing: x is (M, d_model), the rows of the (B, T) batch that
                :class:`~attnkit.modules.packing.Packing` lists (training; no cache).

        Returns:
            ``LayerOutput(hidden, weights)``: hidden (B, T, d_model); weights (B, H, T, T_k)
            or None.
        """
        attn = self.self_attn(
            self.attn_block.pre(x),
            mask=mask,
            causal=causal,
            cache=cache,
            return_weights=return_weights,
            rotary=rotary,
            packing=packing,
        )
        x = self.attn_block.post(x, attn.output)
        return LayerOutput(self.ffn_block(x, self.ffn), attn.weights)


class Encoder(nn.Module):
    """A stack of :class:`EncoderLayer` with an optional final norm (needed for pre-LN).

    Args:
        num_layers: number of layers.
        final_norm: apply the layers' norm (LayerNorm or RMSNorm) after the last layer.
        full_attention_layers: with a ``window``, the first this many layers attend to every
            earlier position and the others to the window (Qwen2's ``max_window_layers``).
        **layer_kwargs: the :class:`EncoderLayer` arguments.
    """

    def __init__(
        self,
        num_layers: int,
        *,
        final_norm: bool = False,
        full_attention_layers: int = 0,
        **layer_kwargs,
    ) -> None:
        super().__init__()
        window = layer_kwargs.get("window")
        for name, value in (
            ("num_layers", num_layers),
            ("full_attention_layers", full_attention_layers),
        ):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")
        if full_attention_layers and window is None:
            raise ValueError(
                f"full_attention_layers={full_attention_layers}: only with a window (the other "
                "layers' sliding window); without one every layer attends to everything"
            )
        window = layer_kwargs.pop("window", None)
        self.layers = nn.ModuleList(
            EncoderLayer(**layer_kwargs, window=None if i < full_attention_layers else window)
            for i in range(num_layers)
        )
        eps = layer_kwargs.get("layer_norm_eps", 1e-5)
        norm = layer_kwargs.get("norm", "layer")
        self.norm = make_norm(norm, layer_kwargs["d_model"], eps=eps) if final_norm else None

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> list[KVCache]:
        """One self-attention cache per layer, for ``max_len`` positions (causal decoding; a
        layer with a sliding window keeps at most ``window`` of them)."""
        return [
            layer.self_attn.init_cache(batch_size, max_len, dtype=dtype, device=device)
            for layer in self.layers
        ]

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        causal: bool = False,
        caches: list[KVCache] | None = None,
        return_weights: bool = False,
        rotary: RotaryAngles | None = None,
        packing: Packing | None = None,
    ) -> EncoderOutput:
        """Run every layer (arguments as :meth:`EncoderLayer.forward`, one cache per layer).

        With ``packing`` x is still (B, T, d_model): the stack packs it into rows, runs the
        layers on them, and returns (B, T, d_model) with zeros at the positions not packed.

        Returns:
            ``EncoderOutput(hidden, weights)``: hidden (B, T, d_model); weights a list of one
            (B, H, T, T_k) per layer, or None.
        """
        if caches is not None and len(caches) != len(self.layers):
            raise ValueError(
                f"caches: expected one KVCache per layer ({len(self.layers)}), got {len(caches)}"
            )
        if packing is not None:
            x = packing.pack(x)  # (M, d_model)
        all_weights = []
        for i, layer in enumerate(self.layers):
            cache = None if caches is None else caches[i]
            x, weights = layer(
                x,
                mask,
                causal=causal,
                cache=cache,
                return_weights=return_weights,
                rotary=rotary,
                packing=packing,
            )
            all_weights.append(weights)
        if self.norm is not None:
            x = self.norm(x)
        if packing is not None:
            x = packing.unpack(x)  # (B, T, d_model)
        return EncoderOutput(x, all_weights if return_weights else None)
