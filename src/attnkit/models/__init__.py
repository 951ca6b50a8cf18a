"""Whole models: the encoder-decoder Transformer, BERT-family encoders and the decoder-only GPT."""

from attnkit.models.bert import BertModel as BertModel
from attnkit.models.gpt import GPT, GPTCache, GPTConfig, GPTOutput
from attnkit.models.transformer import Transformer, TransformerConfig

__all__ = [
    "GPT",
    "BertModel",
    "GPTCache",
    "GPTConfig",
    "GPTOutput",
    "Transformer",
    "TransformerConfig",
]
