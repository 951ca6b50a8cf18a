"""Whole models: the encoder-decoder Transformer (and BERT-family encoders)."""

from attnkit.models.bert import BertModel as BertModel
from attnkit.models.transformer import Transformer, TransformerConfig

__all__ = ["BertModel", "Transformer", "TransformerConfig"]
