"""Model folders: round trip, bfloat16 upcast, both config layouts, clear errors."""

from __future__ import annotations

import json

import pytest
import torch

from attnkit.data import SubwordTokenizer, load_named_corpus
from attnkit.decoding import loading
from attnkit.decoding.loading import load_translation_model, save_translation_model
from attnkit.models import Transformer
from tests.helpers.bad_files import BAD_JSON, BAD_SIZES, TRUNCATIONS, truncate
from tests.helpers.decoding import tiny_config


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


def test_the_dtype_may_be_given_by_its_torch_name(tmp_path, model, tokenizer):
    """GPT.from_pretrained and BertModel.from_pretrained take "bfloat16"; so does this loader,
    with the same reading and the same refusal."""
    save_translation_model(tmp_path, model, tokenizer)
    loaded, _, _ = load_translation_model(tmp_path, dtype="bfloat16")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    with pytest.raises(ValueError, match=r"dtype: expected a floating-point torch.dtype or its "):
        load_translation_model(tmp_path, dtype="bf16")


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


# --------------------------------------------------------------------------- bad folders


@pytest.mark.parametrize(
    "content,message",
    BAD_JSON
    + [
        (b'{"model": [16, 2]}', r"\"model\": expected an object of TransformerConfig"),
        (b'{"model": "base"}', r"\"model\": expected an object"),
        (
            b'{"model_type": "bert", "hidden_size": 8}',
            r"this is a Hugging Face BERT folder; use `attnkit embed --model DIR`",
        ),
        (b'{"model_type": "gpt2"}', r"this is a GPT-2 folder"),
    ],
)
def test_config_json_of_the_wrong_shape_is_named(tmp_path, model, tokenizer, content, message):
    save_translation_model(tmp_path, model, tokenizer)
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match=rf"config.json: .*{message}"):
        load_translation_model(tmp_path)


@pytest.mark.parametrize(
    "field,value,message",
    [
        (field, value, rf"{field}: expected an integer from 1 to ")
        for field in ("d_model", "num_heads", "d_ff", "max_len", "num_encoder_layers")
        for value in BAD_SIZES
    ]
    + [
        ("dropout", 1.5, r"dropout: expected a number in \[0.0, 1.0\)"),
        ("attn_dropout", -0.1, r"attn_dropout: expected a number"),
        ("activation", "swish", r"activation: expected one of \['relu', 'gelu'\]"),
        ("positional", 3, r"positional: expected one of"),
        ("tie_output", "yes", r"tie_output: expected true or false"),
        ("pad_id", 10**6, r"pad_id: expected an integer from 0 to"),
        ("src_vocab_size", 10**12, r"src_vocab_size: expected an integer from 1 to 1,048,576"),
    ],
)
def test_bad_values_in_config_json_name_the_file_and_field(
    tmp_path, model, tokenizer, field, value, message
):
    save_translation_model(tmp_path, model, tokenizer)
    data = json.loads((tmp_path / "config.json").read_text())
    data["model"][field] = value
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"config.json: bad model config: {message}"):
        load_translation_model(tmp_path)


@pytest.mark.parametrize("keep", TRUNCATIONS)
def test_truncated_and_empty_weights_are_named(tmp_path, model, tokenizer, keep):
    save_translation_model(tmp_path, model, tokenizer)
    truncate(tmp_path / "model.safetensors", keep)
    with pytest.raises(ValueError, match=r"model.safetensors: (empty|not a readable safetensors)"):
        load_translation_model(tmp_path)


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin", "model.pt"])
def test_pickled_weights_are_refused(tmp_path, model, tokenizer, name):
    save_translation_model(tmp_path, model, tokenizer)
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / name)
    with pytest.raises(ValueError, match=rf"{name}: .*(pickle).*arbitrary code.*convert it once"):
        load_translation_model(tmp_path)


def test_weights_of_the_wrong_dtype_or_a_missing_tensor(tmp_path, model, tokenizer):
    from safetensors.torch import load_file, save_file

    save_translation_model(tmp_path, model, tokenizer)
    stored = load_file(tmp_path / "model.safetensors")
    name = "encoder.layers.0.ffn.linear1.weight"
    assert name in stored
    save_file({**stored, name: stored[name].to(torch.int64)}, tmp_path / "model.safetensors")
    with pytest.raises(
        ValueError, match=rf"expected floating-point tensors, got \['{name}: torch.int64'\]"
    ):
        load_translation_model(tmp_path)
    del stored[name]
    save_file(stored, tmp_path / "model.safetensors")
    with pytest.raises(
        ValueError, match=rf"does not match .*config.json.*missing keys \['{name}'\]"
    ):
        load_translation_model(tmp_path)


def test_tokenizer_that_is_a_folder_or_too_large(tmp_path, model, tokenizer):
    save_translation_model(tmp_path, model, tokenizer)
    bigger = SubwordTokenizer.train(
        ["ab ba abc cab"] * 20 + [chr(i) * 3 for i in range(300, 700)],
        vocab_size=tokenizer.vocab_size + 50,
    )
    assert bigger.vocab_size > tokenizer.vocab_size
    bigger.save(tmp_path / "tokenizer.json")
    with pytest.raises(
        ValueError, match=r"tokenizer.json: \d+ tokens, more than the model's tgt_vocab_size"
    ):
        load_translation_model(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer.json").mkdir()
    with pytest.raises(ValueError, match=r"tokenizer.json: a folder, expected"):
        load_translation_model(tmp_path)


# --------------------------------------------------------------------------- saving


def test_save_is_atomic_marked_and_replaces_only_its_own_folder(tmp_path, model, tokenizer):
    from attnkit import model_folder

    out = save_translation_model(tmp_path / "out", model, tokenizer)
    assert model_folder.weights_metadata(out / "model.safetensors")["writer"] == "attnkit"
    save_translation_model(out, model, tokenizer, dtype=torch.bfloat16)  # its own: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    theses = tmp_path / "theses"
    theses.mkdir()
    (theses / "chapter1.tex").write_text("precious")
    with pytest.raises(ValueError, match=r"refusing to replace it: it holds \['chapter1.tex'\]"):
        save_translation_model(theses, model, tokenizer)
    assert [p.name for p in theses.iterdir()] == ["chapter1.tex"]
    with pytest.raises(ValueError, match=r"refusing to replace it: a file"):
        save_translation_model(theses / "chapter1.tex", model, tokenizer)
    assert (theses / "chapter1.tex").read_text() == "precious"


def test_the_shipped_model_is_a_folder_attnkit_recognises():
    from attnkit import model_folder

    folder = loading.shipped_model_dir()
    assert (folder / "model.safetensors").is_file()  # shipped in the repository
    assert model_folder.is_attnkit_folder(folder)


def test_decoding_defaults_round_trip_through_config_json(tmp_path, model, tokenizer):
    from attnkit.decoding import DecodingConfig, model_decoding

    save_translation_model(tmp_path / "plain", model, tokenizer)
    assert model_decoding(tmp_path / "plain") == DecodingConfig()  # none stored: the defaults
    tuned = DecodingConfig(beam_size=4, lenpen=1.4, max_len_b=7)
    save_translation_model(tmp_path / "tuned", model, tokenizer, decoding=tuned)
    stored = json.loads((tmp_path / "tuned" / "config.json").read_text())["decoding"]
    assert stored == {
        "beam_size": 4, "max_len_a": 1.2, "max_len_b": 7, "min_len": 1, "lenpen": 1.4,
        "lenpen_style": "fairseq",
    }  # fmt: skip
    assert model_decoding(tmp_path / "tuned") == tuned
    partial = {"model": model.config.to_dict(), "decoding": {"lenpen": 0.6}}
    (tmp_path / "tuned" / "config.json").write_text(json.dumps(partial))
    assert model_decoding(tmp_path / "tuned") == DecodingConfig(lenpen=0.6)  # the rest: defaults
    load_translation_model(tmp_path / "tuned")  # the model still loads


@pytest.mark.parametrize(
    ("decoding", "message"),
    [
        ({"lenpen": "high"}, r'config.json: "decoding": lenpen: expected a number from -10 to'),
        # before: OverflowError at the first finished hypothesis (len ** 1000)
        ({"lenpen": 1000}, r'config.json: "decoding": lenpen: expected a number from -10 to'),
        ({"beam_size": 0}, r'config.json: "decoding": beam_size: expected an integer >= 1'),
        ({"n_best": 2}, r"unknown decoding setting\(s\) \['n_best'\]"),
        ({"bos_id": 3}, r"unknown decoding setting\(s\) \['bos_id'\]"),
        ([1.4], r'"decoding": expected an object of decoding settings .*got list'),
    ],
)
def test_bad_decoding_defaults_name_the_file_and_setting(
    tmp_path, model, tokenizer, decoding, message
):
    from attnkit.decoding import model_decoding

    save_translation_model(tmp_path, model, tokenizer)
    config = {"model": model.config.to_dict(), "decoding": decoding}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        model_decoding(tmp_path)


def test_the_shipped_model_decodes_with_its_validation_length_penalty():
    """The shipped folder stores the length penalty chosen on the validation set (docs/
    benchmarks.md, "The shipped model"), and model_decoding(None) reads the shipped folder."""
    from attnkit.decoding import DecodingConfig, model_decoding

    assert model_decoding(None) == DecodingConfig(lenpen=1.4)


def test_model_languages_from_config_json_or_the_toml_beside_it(tmp_path):
    """The direction a folder was trained in: config.json's "data" (what attnkit train writes),
    else config.toml's [data] (the shipped model's); None when neither says or the corpus is
    not Multi30k."""
    from attnkit.decoding.loading import model_languages

    assert model_languages(None) == ("de", "en")  # the shipped model: its config.toml
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model": {}}))
    assert model_languages(folder) is None
    (folder / "config.toml").write_text(
        '[data]\ncorpus = "multi30k"\nsrc_lang = "fr"\ntgt_lang = "en"\n'
    )
    assert model_languages(folder) == ("fr", "en")
    data = {"corpus": "multi30k", "src_lang": "en", "tgt_lang": "cs"}
    (folder / "config.json").write_text(json.dumps({"model": {}, "data": data}))
    assert model_languages(folder) == ("en", "cs")  # config.json first
    (folder / "config.json").write_text(
        json.dumps({"model": {}, "data": {**data, "corpus": "copy"}})
    )
    assert model_languages(folder) is None
    (folder / "config.json").write_text(json.dumps({"model": {}}))
    (folder / "config.toml").write_text("[data\n")
    with pytest.raises(ValueError, match="config.toml: not a valid TOML file"):
        model_languages(folder)
    assert model_languages(tmp_path / "absent") is None  # the loader names a missing folder
