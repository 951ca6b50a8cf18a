"""attnkit: attention and Transformers from the seed notes, done right.

The numerical core is :func:`attnkit.scaled_dot_product_attention`; its docstring states the
one mask convention (boolean, True = may attend).

Names are imported on first use (PEP 562), so ``attnkit bleu`` and ``attnkit.metrics`` do not
pay for importing torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "scaled_dot_product_attention": "attnkit.attention",
    "causal_mask": "attnkit.attention",
    "lengths_to_mask": "attnkit.attention",
    "padding_mask": "attnkit.attention",
    "Transformer": "attnkit.models.transformer",
    "TransformerConfig": "attnkit.models.transformer",
    "Decoder": "attnkit.modules.decoder",
    "DecoderLayer": "attnkit.modules.decoder",
    "Encoder": "attnkit.modules.encoder",
    "EncoderLayer": "attnkit.modules.encoder",
    "FeedForward": "attnkit.modules.feed_forward",
    "KVCache": "attnkit.modules.kv_cache",
    "MultiHeadAttention": "attnkit.modules.multihead",
    "LearnedPositionalEmbedding": "attnkit.modules.positional",
    "SinusoidalPositionalEncoding": "attnkit.modules.positional",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'attnkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
