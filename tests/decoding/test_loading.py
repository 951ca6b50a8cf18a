"""Model folders: round trip, bfloat16 upcast, both config layouts, clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from decoding_helpers import tiny_config

from attnkit.data import SubwordTokenizer, load_named_corpus
from attnkit.decoding import loading
from attnkit.decoding.loading import load_translation_model, save_translation_model
from attnkit.models import Transformer


@pytest.fixture(scope="module")
def tokenizer():
    corpus = load_named_corpus("multi30k", split="val")
    return SubwordTokenizer.train(corpus.src[:200] + corpus.tgt[:200], vocab_size=400)


@pytest.fixture()
def model(tokenizer):
    torch.manual_seed(0)
    return Transformer(tiny_config(tokenizer.vocab_size)).eval()


def test_round_trip_bfloat16_is_upcast(tmp_path, model, tokenizer):
    save_translation_model(tmp_path, model, tokenizer, dtype=torch.bfloat16)
    from safetensors.torch import load_file

    stored = load_file(tmp_path / "model.safetensors")
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    # Tied embeddings / output projection are stored once.
    assert sum(name.endswith("embed.weight") or name == "output.weight" for name in stored) == 1
    loaded, tok, path = load_translation_model(tmp_path)
    assert path == tmp_path and not loaded.training and tok.to_json() == tokenizer.to_json()
    assert loaded.config == model.config
    assert loaded.output.weight is loaded.src_embed.weight  # still tied after loading
    for name, p in loaded.state_dict().items():
        assert p.dtype == torch.float32
        assert torch.equal(p, model.state_dict()[name].to(torch.bfloat16).float()), name


def test_config_fields_at_the_top_level(tmp_path, model, tokenizer):
    save_translation_model(tmp_path, model, tokenizer, extra_config={"training": {"lr": 1e-3}})
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["training"] == {"lr": 1e-3}
    (tmp_path / "config.json").write_text(json.dumps({**data["model"], "format": "attnkit-1"}))
    loaded, _, _ = load_translation_model(tmp_path, dtype=torch.float64)
    assert loaded.config == model.config and loaded.output.weight.dtype == torch.float64
    torch.testing.assert_close(loaded.output.weight.float(), model.output.weight, rtol=0, atol=0)


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json"])
def test_missing_file_is_named(tmp_path, model, tokenizer, missing):
    save_translation_model(tmp_path, model, tokenizer)
    (tmp_path / missing).unlink()
    with pytest.raises(ValueError, match=rf"{missing}: missing"):
        load_translation_model(tmp_path)


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("model.safetensors", b"\x00garbage", r"model.safetensors: not a readable safetensors"),
        ("config.json", b"{not json", r"config.json: not a valid JSON file"),
        ("config.json", b'{"model": {"d_model": 32, "heads": 4}}', r"unknown keys \['heads'\]"),
        ("config.json", b'{"lr": 0.1}', r"config.json: no TransformerConfig fields found"),
        ("tokenizer.json", b"[]", r"tokenizer.json: not a readable tokenizer"),
    ],
)
def test_corrupt_file_is_named(tmp_path, model, tokenizer, name, content, message):
    save_translation_model(tmp_path, model, tokenizer)
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=message):
        load_translation_model(tmp_path)


def test_weights_that_do_not_fit_the_config(tmp_path, model, tokenizer):
    save_translation_model(tmp_path, model, tokenizer)
    data = json.loads((tmp_path / "config.json").read_text())
    data["model"]["d_ff"] = 128
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"model.safetensors: does not match .*config.json"):
        load_translation_model(tmp_path)


def test_not_a_folder(tmp_path):
    with pytest.raises(ValueError, match=r"nope: not a folder"):
        load_translation_model(tmp_path / "nope")


def test_missing_shipped_model_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "shipped_model_dir", lambda: tmp_path / "multi30k_de_en")
    with pytest.raises(FileNotFoundError, match=r"pass --model DIR.*or train one"):
        load_translation_model(None)


def test_shipped_model_location():
    import attnkit

    expected = loading.Path(attnkit.__file__).resolve().parent / "pretrained" / "multi30k_de_en"
    assert loading.shipped_model_dir() == expected
