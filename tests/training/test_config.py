"""TOML configs into dataclasses: defaults, overrides, errors, the shipped files."""

from __future__ import annotations

import pytest

from attnkit.models import TransformerConfig
from attnkit.training.config import DataConfig, OptimConfig, TrainConfig, apply_overrides

from .conftest import CONFIGS


def write(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_defaults_are_the_paper_recipe():
    c = TrainConfig()
    assert c.optim.betas == (0.9, 0.98) and c.optim.eps == 1e-9
    assert c.optim.label_smoothing == 0.1 and c.optim.warmup_steps == 4000
    assert c.optim.lr_scale == 1.0 and c.optim.clip_norm > 0
    assert c.model.share_embeddings and c.model.tie_output and c.model.dropout == 0.1


def test_shipped_configs_load():
    m = TrainConfig.from_toml(CONFIGS / "multi30k_de_en.toml")
    assert (m.model.d_model, m.model.num_heads, m.model.d_ff) == (256, 8, 1024)
    assert (m.model.num_encoder_layers, m.model.num_decoder_layers) == (3, 3)
    assert m.data.vocab_size == 6000 and m.data.corpus == "multi30k"
    assert m.optim.autocast == "auto" and m.optim.label_smoothing == 0.1
    assert m.optim.betas == (0.9, 0.98)
    t = TrainConfig.from_toml(CONFIGS / "tiny_copy.toml")
    assert t.data.corpus == "copy" and t.model.d_model == 64


def test_partial_file_and_types(tmp_path):
    path = write(tmp_path, "[model]\nd_model = 128\n[optim]\nbetas = [0.8, 0.9]\nlr_scale = 2\n")
    c = TrainConfig.from_toml(path)
    assert c.model.d_model == 128 and c.model.num_heads == TransformerConfig().num_heads
    assert c.optim.betas == (0.8, 0.9) and c.optim.lr_scale == 2.0
    assert isinstance(c.optim.lr_scale, float)
    assert c.data == DataConfig()


def test_overrides_parse_toml_values(tmp_path):
    path = write(tmp_path, "[model]\ndropout = 0.1\n")
    c = TrainConfig.from_toml(
        path,
        [
            "model.dropout=0.3",
            "optim.betas=[0.9, 0.99]",
            "data.corpus=copy",
            'data.src_lang="en"',
            "model.norm_first=false",
            "optim.max_steps = 7",
        ],
    )
    assert c.model.dropout == 0.3 and c.optim.betas == (0.9, 0.99)
    assert c.data.corpus == "copy" and c.data.src_lang == "en"
    assert c.model.norm_first is False and c.optim.max_steps == 7


def test_unknown_section_and_keys_list_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"unknown config section\(s\) \['trainer'\]; known"):
        TrainConfig.from_toml(write(tmp_path, "[trainer]\nx = 1\n"))
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['model.heads'\].*'num_heads'"):
        TrainConfig.from_toml(write(tmp_path, "[model]\nheads = 4\n"))
    with pytest.raises(ValueError, match=r"unknown key optim.lr;.*'lr_scale'"):
        apply_overrides({}, ["optim.lr=0.1"])
    with pytest.raises(ValueError, match=r"unknown section 'train'"):
        apply_overrides({}, ["train.lr=0.1"])


@pytest.mark.parametrize(
    "item,message",
    [
        ("model.dropout", r"expected section.key=value"),
        ("dropout=0.3", r"expected section.key=value"),
        ("optim.max_steps=abc", r"'abc' is not a TOML value"),
    ],
)
def test_bad_override_syntax(item, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides({}, [item])


@pytest.mark.parametrize(
    "text,message",
    [
        ("[optim]\nmax_steps = 1.5\n", r"optim.max_steps: expected int, got 1.5"),
        ('[optim]\nautocast = "bf32"\n', r"optim.autocast: expected one of"),
        ("[optim]\nbetas = [0.9]\n", r"optim.betas: expected tuple"),
        ('[model]\ndropout = "high"\n', r"model.dropout: expected float"),
        ("[model]\nsrc_vocab_size = 10\n", r"model.src_vocab_size: set from the tokenizer"),
        ("[data]\nmax_tokens = 0\n", r"data.max_tokens: expected a number > 0, got 0"),
        ('[model]\npositional = "rope"\n', r"positional: expected 'sinusoidal' or 'learned'"),
        ("[model\n", r"is not valid TOML"),
    ],
)
def test_bad_values(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_toml(write(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope.toml' does not exist"):
        TrainConfig.from_toml(tmp_path / "nope.toml")


def test_toml_and_dict_round_trip(tmp_path):
    c = TrainConfig.from_toml(CONFIGS / "multi30k_de_en.toml", ["optim.betas=[0.8, 0.9]"])
    again = TrainConfig.from_toml(write(tmp_path, c.to_toml()))
    assert again == c
    assert TrainConfig.from_dict(c.to_dict(), allow_tokenizer_keys=True) == c


def test_with_overrides_keeps_vocab_sizes():
    c = TrainConfig()
    c.model.src_vocab_size = c.model.tgt_vocab_size = 300
    d = c.with_overrides(["optim.max_steps=3"])
    assert d.optim.max_steps == 3 and d.model.src_vocab_size == 300


def test_optim_and_data_validation():
    with pytest.raises(ValueError, match=r"optim.label_smoothing: expected a number in \[0, 1\)"):
        OptimConfig(label_smoothing=1.0)
    with pytest.raises(ValueError, match=r"train_src and train_tgt must name files"):
        DataConfig(corpus="")
    with pytest.raises(ValueError, match=r"give both or neither"):
        DataConfig(val_src="a.txt")


def test_optional_ffn_dropout_defaults_to_dropout_and_round_trips(tmp_path):
    c = TrainConfig.from_toml(CONFIGS / "tiny_copy.toml", ["model.dropout=0.2"])
    assert c.model.ffn_dropout is None
    text = c.to_toml()
    assert "# ffn_dropout = (default)" in text
    assert TrainConfig.from_toml(write(tmp_path, text)) == c
    d = c.with_overrides(["model.ffn_dropout=0"])
    assert d.model.ffn_dropout == 0.0 and isinstance(d.model.ffn_dropout, float)
    with pytest.raises(ValueError, match="ffn_dropout"):
        c.with_overrides(['model.ffn_dropout="x"'])
