"""attnkit: attention and Transformers from the seed notes, done right.

The numerical core is :func:`attnkit.scaled_dot_product_attention`; its docstring states the
one mask convention (boolean, True = may attend).
"""

from attnkit.attention import causal_mask, lengths_to_mask, padding_mask, scaled_dot_product_attention
from attnkit.models import Transformer, TransformerConfig
from attnkit.modules import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    KVCache,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
)

__version__ = "0.1.0"

__all__ = [
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "KVCache",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "SinusoidalPositionalEncoding",
    "Transformer",
    "TransformerConfig",
    "causal_mask",
    "lengths_to_mask",
    "padding_mask",
    "scaled_dot_product_attention",
]
