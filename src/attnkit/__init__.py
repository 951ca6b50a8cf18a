"""attnkit: attention and Transformers from the seed notes, done right.

The numerical core is :func:`attnkit.scaled_dot_product_attention`; its docstring states the
one mask convention (boolean, True = may attend).

Names are imported on first use (PEP 562), so ``attnkit bleu`` and ``attnkit.metrics`` do not
pay for importing torch.
"""

from __future__ import annotations

import importlib
import os

# oneDNN, which runs bf16 (and prepacked) matrix products on a CPU, compiles a kernel for every
# new shape (about 12 ms for a training matmul on an AMX Xeon) and keeps the last 1,024 by
# default. Training the shipped translation config meets a few thousand kernels (batch x width
# x layer shapes), so with the default it compiled the same ones again every epoch. Read by oneDNN at its first primitive, so
# set here, before any; a value set by the user wins. Each kept kernel costs memory (about 1
# MB at training shapes): docs/benchmarks.md, "Training throughput".
ONEDNN_CACHE_CAPACITY = 4096
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_CACHE_CAPACITY))

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
