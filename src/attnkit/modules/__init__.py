"""Building blocks: multi-head attention, positions (added or rotary), normalisation,
feed-forward, encoder and decoder layers."""

from attnkit.modules.decoder import Decoder, DecoderLayer
from attnkit.modules.encoder import Encoder, EncoderLayer
from attnkit.modules.feed_forward import FeedForward
from attnkit.modules.kv_cache import KVCache
from attnkit.modules.multihead import MultiHeadAttention
from attnkit.modules.norm import RMSNorm
from attnkit.modules.outputs import (
    AttentionOutput,
    DecodeOutput,
    DecoderLayerOutput,
    DecoderOutput,
    EncodeOutput,
    EncoderOutput,
    LayerOutput,
)
from attnkit.modules.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from attnkit.modules.residual import Residual
from attnkit.modules.rotary import RotaryAngles, RotaryEmbedding

__all__ = [
    "AttentionOutput",
    "DecodeOutput",
    "Decoder",
    "DecoderLayer",
    "DecoderLayerOutput",
    "DecoderOutput",
    "EncodeOutput",
    "Encoder",
    "EncoderLayer",
    "EncoderOutput",
    "FeedForward",
    "KVCache",
    "LayerOutput",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "RMSNorm",
    "Residual",
    "RotaryAngles",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
]
