"""attnkit.export.ctranslate2: a model exported with CTranslate2's spec API computes what the
attnkit model computes (CTranslate2's own scoring and beam search are the reference), and
options the spec cannot express are refused by name."""

from __future__ import annotations

import json

import ctranslate2
import pytest
import torch
from torch import nn

from attnkit.data import load_named_corpus
from attnkit.decoding import (
    DecodingConfig,
    Translator,
    load_translation_model,
    model_decoding,
)
from attnkit.export import export_ctranslate2, translate_options
from attnkit.export.ctranslate2 import CONFIG_FIELDS, UNUSED_TOKEN, build_spec, check_config
from attnkit.models import Transformer, TransformerConfig
from tests.helpers.export import (
    attnkit_ids,
    ctranslate2_ids,
    target_vocabulary,
    tiny_config,
    write_tiny_model,
)

# Every architecture option attnkit has, each away from the shipped model's choice once.
VARIANTS = {
    "pre-LN, ReLU, sinusoidal, shared and tied": {},
    "post-LN": {"norm_first": False},
    "GELU": {"activation": "gelu"},
    "learned positions": {"positional": "learned"},
    "separate source and target embeddings": {"share_embeddings": False},
    "untied output layer": {"share_embeddings": False, "tie_output": False},
    "3 encoder layers, 1 decoder layer": {"num_encoder_layers": 3, "num_decoder_layers": 1},
    "LayerNorm epsilon 0.1": {"layer_norm_eps": 0.1},
    "more embedding rows than tokens": {"share_embeddings": False, "tgt_vocab_size": 608},
}


@pytest.fixture(params=list(VARIANTS), ids=list(VARIANTS))
def exported(request, tmp_path, tokenizer):
    """(attnkit model, CTranslate2 folder) of a tiny random model of one variant."""
    config = tiny_config(tokenizer.vocab_size, **VARIANTS[request.param])
    folder = write_tiny_model(tmp_path / "model", config, tokenizer)
    out = export_ctranslate2(folder, tmp_path / "ct2")
    model, _, _ = load_translation_model(folder)
    return model, out


def test_scores_equal_attnkit_log_probs(exported, tokenizer, pairs):
    """CTranslate2's score_batch (log p of each target token, eos included) equals attnkit's
    teacher-forced log-probabilities: every weight, position and norm is in its place."""
    model, out = exported
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    results = translator.score_batch(
        [tokenizer.tokens(de) for de, _ in pairs], [tokenizer.tokens(en) for _, en in pairs]
    )
    for (source, target), result in zip(pairs, results, strict=True):
        src = torch.tensor([[*tokenizer.encode(source), tokenizer.eos_id]])  # (1, S)
        ids = tokenizer.encode(target)
        tgt_in = torch.tensor([[tokenizer.bos_id, *ids]])  # (1, T)
        tgt_out = torch.tensor([*ids, tokenizer.eos_id])  # (T,)
        with torch.no_grad():
            logits = model(src, tgt_in)[0]  # (T, V)
        ours = logits.log_softmax(-1).gather(1, tgt_out[:, None]).squeeze(1)  # (T,)
        assert result.tokens == [tokenizer.id_to_token(i) for i in tgt_out.tolist()]
        torch.testing.assert_close(torch.tensor(result.log_probs), ours, atol=2e-4, rtol=1e-4)


# The search does not depend on the architecture (the scores above check that): two random
# models, each with the eos scale at which its outputs end at various lengths before the limit.
SEARCH_MODELS = {
    "pre-LN, shared and tied": ({}, 6.0),
    "untied output layer": ({"share_embeddings": False, "tie_output": False}, 3.0),
}


@pytest.mark.parametrize(
    ("overrides", "eos_scale"), SEARCH_MODELS.values(), ids=list(SEARCH_MODELS)
)
def test_beam_search_equals_attnkit(tmp_path, tokenizer, sentences, overrides, eos_scale):
    """Beam 4 with translate_options gives attnkit's tokens, sentence for sentence, on outputs
    that end with eos before attnkit's length limit (where the two searches are the same).

    min_len 0: with min_len 1 eos is forbidden at the first step, and CTranslate2 renormalises
    the other tokens' probabilities (attnkit does not), which adds log(1 / (1 - p(eos))) to
    every hypothesis; eos is made likely here, so that would not be negligible as it is for a
    trained model (the shipped model's test below keeps min_len 1)."""
    config = tiny_config(tokenizer.vocab_size, **overrides)
    folder = write_tiny_model(tmp_path / "model", config, tokenizer, eos_scale=eos_scale)
    out = export_ctranslate2(folder, tmp_path / "ct2")
    model, _, _ = load_translation_model(folder)
    search = DecodingConfig(beam_size=4, min_len=0, max_len_a=0.0, max_len_b=config.max_len)
    ours = attnkit_ids(model, tokenizer, sentences, search)
    lengths = [len(ids) for ids in ours]
    assert max(lengths) < config.max_len - 1  # no output was cut by the limit
    assert len(set(lengths)) >= 4  # ... and they end at various lengths
    theirs = ctranslate2_ids(out, tokenizer, sentences, search, max_len=config.max_len)
    assert theirs == ours


def test_vocabulary_is_the_tokenizer(tmp_path, tokenizer):
    config = tiny_config(tokenizer.vocab_size, share_embeddings=False, tgt_vocab_size=603)
    out = export_ctranslate2(write_tiny_model(tmp_path / "m", config, tokenizer), tmp_path / "o")
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    assert json.loads((out / "source_vocabulary.json").read_text()) == tokens
    extra = [UNUSED_TOKEN.format(i) for i in range(tokenizer.vocab_size, 603)]
    assert target_vocabulary(out) == tokens + extra
    ct2_config = json.loads((out / "config.json").read_text())
    assert ct2_config["bos_token"] == ct2_config["decoder_start_token"] == "<s>"
    assert (ct2_config["eos_token"], ct2_config["add_source_eos"]) == ("</s>", True)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("activation", "gelu_tanh", "expresses only 'relu' or 'gelu'"),
        ("positional", "rotary", "expresses only 'sinusoidal' or 'learned'"),
        ("num_heads", 2**15, "16-bit integer"),
    ],
)
def test_refuses_option_values_the_spec_cannot_express(field, value, reason):
    """A config from elsewhere (set after its checks) with a value CTranslate2 lacks."""
    config = TransformerConfig()
    setattr(config, field, value)
    with pytest.raises(ValueError, match=rf"^{field}={value!r}: .*{reason}") as err:
        check_config(config)
    assert "cannot export to CTranslate2" in str(err.value)


def test_refuses_an_option_it_does_not_know():
    """A TransformerConfig field added later is refused until its mapping is written down."""
    from dataclasses import dataclass

    @dataclass
    class Future(TransformerConfig):
        rms_norm: bool = False

    with pytest.raises(ValueError, match=r"^rms_norm=False: .*does not know this model option"):
        check_config(Future())
    assert set(CONFIG_FIELDS) == {f for f in TransformerConfig.__dataclass_fields__}


def test_refuses_a_tensor_it_has_no_place_for(tokenizer):
    model = Transformer(tiny_config(tokenizer.vocab_size)).eval()
    model.decoder.layers[0].gate = nn.Parameter(torch.ones(32))  # e.g. a future layer scale
    with pytest.raises(ValueError, match=r"no place for: \['decoder.layers.0.gate'\]"):
        build_spec(model, tokenizer)


def test_translate_options_refuse_gnmt_length_penalty(tokenizer):
    with pytest.raises(ValueError, match="^lenpen_style='gnmt': CTranslate2's only length"):
        translate_options(DecodingConfig(lenpen_style="gnmt"), tokenizer, max_len=64)


def test_unknown_quantization_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^quantization: expected one of .*got 'int4'"):
        export_ctranslate2(None, tmp_path / "out", quantization="int4")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("quantization", ["int8", "int16"])
def test_quantized_exports_load_and_are_smaller(tmp_path, tokenizer, quantization):
    folder = write_tiny_model(tmp_path / "m", tiny_config(tokenizer.vocab_size), tokenizer)
    full = export_ctranslate2(folder, tmp_path / "f32")
    small = export_ctranslate2(folder, tmp_path / quantization, quantization=quantization)
    assert (small / "model.bin").stat().st_size < 0.6 * (full / "model.bin").stat().st_size
    translator = ctranslate2.Translator(str(small), device="cpu")
    result = translator.translate_batch([tokenizer.tokens("Ein Hund.")], max_decoding_length=20)
    assert result[0].hypotheses[0]


# --------------------------------------------------------------------------- the shipped model

SHIPPED_SENTENCES = 100


def test_shipped_model_beam5_equals_attnkit_float32(tmp_path):
    """The issue's check: the shipped model exported in float32 translates the first 100
    test2016 sentences with CTranslate2's beam 5 into attnkit's float32 beam-5 tokens."""
    model, tokenizer, folder = load_translation_model(None, dtype=torch.float32)
    out = export_ctranslate2(None, tmp_path / "ct2", quantization="float32")
    record = json.loads((out / "attnkit_export.json").read_text())
    assert record["translate_batch"]["beam_size"] == 5
    test = load_named_corpus("multi30k", split="test2016", src_lang="de", tgt_lang="en")
    sentences = test.src[:SHIPPED_SENTENCES]
    config = model_decoding(None)  # attnkit translate's defaults: the model's (beam 5, lenpen 1.4)
    assert record["translate_batch"]["length_penalty"] == config.lenpen
    ours = attnkit_ids(model, tokenizer, sentences, config)
    theirs = ctranslate2_ids(out, tokenizer, sentences, config, max_len=model.config.max_len)
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
    assert differ == []


def test_long_sources_are_cut_as_attnkit_cuts(tmp_path, tokenizer):
    """translate_options' max_input_length keeps what Translator.encode keeps of a source
    longer than the model's positions (max_len - 1 tokens, then eos)."""
    config = tiny_config(tokenizer.vocab_size, max_len=32)
    folder = write_tiny_model(tmp_path / "model", config, tokenizer)
    out = export_ctranslate2(folder, tmp_path / "ct2")
    model, _, _ = load_translation_model(folder)
    text = "Ein Hund rennt über eine grüne Wiese. " * 8
    (source,), truncated = Translator(model, tokenizer).encode([text])
    assert truncated == [0] and len(source) == config.max_len
    target = tokenizer.encode("A dog.")
    with torch.no_grad():
        logits = model(torch.tensor([source]), torch.tensor([[tokenizer.bos_id, *target]]))[0]
    ours = logits.log_softmax(-1).gather(1, torch.tensor([*target, tokenizer.eos_id])[:, None])
    options = translate_options(DecodingConfig(), tokenizer, max_len=config.max_len)
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    (result,) = translator.score_batch(
        [tokenizer.tokens(text)],
        [tokenizer.tokens("A dog.")],
        max_input_length=options["max_input_length"],
    )
    torch.testing.assert_close(
        torch.tensor(result.log_probs), ours.squeeze(1), atol=2e-4, rtol=1e-4
    )


def test_the_export_records_the_models_search_settings(tmp_path):
    """attnkit_export.json's translate_batch options are the folder's stored search settings
    (what `attnkit translate` uses); a length penalty CTranslate2 cannot express is refused
    before anything is written, naming where it is set."""
    from tests.helpers.viz import build_translation_model

    folder = build_translation_model(tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    config["decoding"] = {"beam_size": 3, "lenpen": 1.7}
    (folder / "config.json").write_text(json.dumps(config))
    record = json.loads(
        (export_ctranslate2(folder, tmp_path / "ct2") / "attnkit_export.json").read_text()
    )
    assert (
        record["translate_batch"]["beam_size"],
        record["translate_batch"]["length_penalty"],
    ) == (3, 1.7)

    config["decoding"] = {"lenpen_style": "gnmt"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r'config.json: "decoding": lenpen_style=\'gnmt\': CTranslate2'
    ):
        export_ctranslate2(folder, tmp_path / "gnmt")
    assert not (tmp_path / "gnmt").exists()
