"""Model configs check every field's type and range where they are built: TransformerConfig and
BertConfig refuse bools, strings, floats, negatives, zeros and absurd sizes, naming the field."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest

from attnkit.models import TransformerConfig
from attnkit.models.bert import BertConfig
from attnkit.models.config_checks import MAX_PARAMETERS
from tests.helpers.bad_files import BAD_SIZES

# Every int field is a size, but the pad ids (which may be 0).
TRANSFORMER_SIZES = [
    f.name for f in fields(TransformerConfig) if f.type == "int" and f.name != "pad_id"
]
BERT_SIZES = [f.name for f in fields(BertConfig) if f.type == "int" and f.name != "pad_token_id"]


def test_the_size_fields_are_the_ones_expected():
    assert len(TRANSFORMER_SIZES) == 8 and "d_ff" in TRANSFORMER_SIZES
    assert len(BERT_SIZES) == 7 and "intermediate_size" in BERT_SIZES


def transformer(**changes):
    fields = dict(src_vocab_size=100, tgt_vocab_size=100, d_model=16, num_heads=2, d_ff=32)
    if "src_vocab_size" in changes and "tgt_vocab_size" not in changes:
        changes["tgt_vocab_size"] = changes["src_vocab_size"]  # shared embeddings
    return TransformerConfig(**{**fields, **changes})


@pytest.mark.parametrize("value", BAD_SIZES, ids=repr)
@pytest.mark.parametrize("name", TRANSFORMER_SIZES)
def test_transformer_sizes_must_be_positive_ints_in_bounds(name, value):
    with pytest.raises(
        ValueError, match=rf"^{name}: expected an integer from 1 to 1,048,576, got "
    ):
        transformer(**{name: value})


@pytest.mark.parametrize("value", BAD_SIZES, ids=repr)
@pytest.mark.parametrize("name", BERT_SIZES)
def test_bert_sizes_must_be_positive_ints_in_bounds(name, value):
    tiny = dict(hidden_size=32, num_attention_heads=4, intermediate_size=37, vocab_size=99)
    with pytest.raises(
        ValueError, match=rf"^{name}: expected an integer from 1 to 1,048,576, got "
    ):
        BertConfig(**{**tiny, name: value})


@pytest.mark.parametrize("value", [-0.1, 1.0, 1, 1.5, math.nan, math.inf, "0.1", True, None])
@pytest.mark.parametrize("name", ["dropout", "attn_dropout", "ffn_dropout"])
def test_transformer_dropouts_must_be_probabilities(name, value):
    if name == "ffn_dropout" and value is None:
        assert transformer(ffn_dropout=None).ffn_dropout is None  # None = dropout
        return
    with pytest.raises(ValueError, match=rf"^{name}: expected a number in \[0.0, 1.0\), got "):
        transformer(**{name: value})


@pytest.mark.parametrize("value", [-0.1, 1.0, 2, math.nan, "0.1", False])
@pytest.mark.parametrize("name", ["hidden_dropout_prob", "attention_probs_dropout_prob"])
def test_bert_dropouts_must_be_probabilities(name, value):
    with pytest.raises(ValueError, match=rf"^{name}: expected a number in \[0.0, 1.0\), got "):
        BertConfig(**{name: value})


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"activation": "swish"}, r"activation: expected one of \['relu', 'gelu'\], got 'swish'"),
        ({"activation": "RELU"}, r"activation: expected one of"),
        ({"activation": None}, r"activation: expected one of"),
        ({"positional": "rotary"}, r"positional: expected one of \['sinusoidal', 'learned'\]"),
        ({"norm_first": 1}, r"norm_first: expected true or false, got 1 \(int\)"),
        ({"share_embeddings": "true"}, r"share_embeddings: expected true or false, got 'true'"),
        ({"tie_output": None}, r"tie_output: expected true or false"),
        ({"layer_norm_eps": 0}, r"layer_norm_eps: expected a number in \(0.0, 1.0\], got 0"),
        ({"layer_norm_eps": -1e-5}, r"layer_norm_eps"),
        ({"layer_norm_eps": "1e-5"}, r"layer_norm_eps"),
        ({"pad_id": 100}, r"pad_id: expected an integer from 0 to 99, got 100"),
        ({"pad_id": -1}, r"pad_id: expected an integer from 0 to 99, got -1"),
        ({"pad_id": 0.0}, r"pad_id: expected an integer"),
        (
            {"d_model": 18, "num_heads": 4},
            r"d_model must be a multiple of num_heads, got d_model=18",
        ),
        (
            {"share_embeddings": True, "src_vocab_size": 100, "tgt_vocab_size": 90},
            r"share_embeddings needs one vocabulary",
        ),
    ],
)
def test_transformer_switches_and_relations(changes, message):
    with pytest.raises(ValueError, match=message):
        transformer(**changes)


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"hidden_act": "relu"}, r"hidden_act: expected one of \['gelu'\], got 'relu'"),
        ({"hidden_act": 1}, r"hidden_act: expected one of"),
        ({"layer_norm_eps": 0.0}, r"layer_norm_eps: expected a number in \(0.0, 1.0\]"),
        ({"initializer_range": -0.02}, r"initializer_range: expected a number in \[0.0, 1.0\]"),
        ({"pad_token_id": 30522}, r"pad_token_id: expected an integer from 0 to 30,521"),
        ({"pad_token_id": "0"}, r"pad_token_id: expected an integer"),
        ({"hidden_size": 100}, r"hidden_size must be a multiple of num_attention_heads"),
    ],
)
def test_bert_switches_and_relations(changes, message):
    with pytest.raises(ValueError, match=message):
        BertConfig(**changes)


def test_absurd_totals_are_refused_before_anything_is_allocated():
    # Every size is within MAX_SIZE, but the tables alone would be 2**20 * 2**16 * 4 bytes.
    with pytest.raises(
        ValueError, match=r"TransformerConfig: about [\d,]+ parameters .*check the sizes"
    ):
        transformer(src_vocab_size=2**20, d_model=2**16, num_heads=1)
    with pytest.raises(ValueError, match=r"BertConfig: about [\d,]+ parameters"):
        BertConfig(hidden_size=2**16, num_attention_heads=1, intermediate_size=2**20)
    # d = d_ff = 8,192 with 6 + 6 layers stays below the bound: by hand, an encoder layer holds
    # 4 d^2 (attention) + 2 d^2 (feed-forward), a decoder layer 4 d^2 more (cross-attention):
    # (6 * 6 + 6 * 10) * 8192^2 = 6.44e9 < 2^33 = 8.59e9.
    transformer(d_model=8192, num_heads=8, d_ff=8192, num_encoder_layers=6, num_decoder_layers=6)
    assert MAX_PARAMETERS == 2**33


def test_real_configs_pass():
    TransformerConfig()
    BertConfig.bert_base()
    transformer(ffn_dropout=0.0, dropout=0, attn_dropout=0.999, layer_norm_eps=1, pad_id=99)


@pytest.mark.parametrize("config", [{"d_model": 16}, None, "config.json"])
def test_models_take_their_config_objects_only(config):
    """A dict (or None) reached the layers and failed with an AttributeError."""
    from attnkit.models import GPT, BertModel, Transformer

    for model, kind in (
        (GPT, "GPTConfig"),
        (Transformer, "TransformerConfig"),
        (BertModel, "BertConfig"),
    ):
        with pytest.raises(
            TypeError, match=f"config: expected a {kind}, got {type(config).__name__}"
        ):
            model(config)
