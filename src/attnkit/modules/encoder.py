"""The encoder: self-attention and feed-forward, each in a residual block (seeds 002, 004)."""

from __future__ import annotations

from torch import Tensor, nn

from attnkit.modules.feed_forward import FeedForward
from attnkit.modules.multihead import MultiHeadAttention
from attnkit.modules.residual import Residual


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
        activation: ``"relu"`` or ``"gelu"``.
        norm_first: pre-LN when true, the paper's post-LN when false.
        layer_norm_eps: LayerNorm epsilon (BERT uses 1e-12).
        bias: whether linear layers have biases.
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
    ) -> None:
        super().__init__()
        attn_dropout = dropout if attn_dropout is None else attn_dropout
        ffn_dropout = dropout if ffn_dropout is None else ffn_dropout
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=attn_dropout, bias=bias)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, dropout=ffn_dropout, bias=bias)
        block = dict(dropout=dropout, norm_first=norm_first, eps=layer_norm_eps)
        self.attn_block = Residual(d_model, **block)
        self.ffn_block = Residual(d_model, **block)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, *, return_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """x (B, T, d_model), mask as in :class:`MultiHeadAttention`; weights (B, H, T, T)."""
        x = self.attn_block(
            x, lambda h: self.self_attn(h, mask=mask, return_weights=return_weights)
        )
        x, weights = x if return_weights else (x, None)
        x = self.ffn_block(x, self.ffn)
        return (x, weights) if return_weights else x


class Encoder(nn.Module):
    """A stack of :class:`EncoderLayer` with an optional final LayerNorm (needed for pre-LN).

    Args:
        num_layers: number of layers.
        final_norm: apply LayerNorm after the last layer.
        **layer_kwargs: the :class:`EncoderLayer` arguments.
    """

    def __init__(self, num_layers: int, *, final_norm: bool = False, **layer_kwargs) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(**layer_kwargs) for _ in range(num_layers))
        eps = layer_kwargs.get("layer_norm_eps", 1e-5)
        self.norm = nn.LayerNorm(layer_kwargs["d_model"], eps=eps) if final_norm else None

    def forward(
        self, x: Tensor, mask: Tensor | None = None, *, return_weights: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """x (B, T, d_model) -> (B, T, d_model), and each layer's weights when asked."""
        all_weights = []
        for layer in self.layers:
            x = layer(x, mask, return_weights=return_weights)
            if return_weights:
                x, w = x
                all_weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return (x, all_weights) if return_weights else x
