"""attnkit GPT against Hugging Face transformers' GPT2LMHeadModel: folders written by Hugging Face
load into attnkit and give the same logits (left- and right-padded batches), the same attention
weights in every layer (HF eager) and the same greedy continuations as ``generate()``; folders
written by attnkit load back into both; unsupported options and pickles are refused."""

import json
import os
import re
import shutil

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never touch the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers.activations import NewGELUActivation  # noqa: E402

from attnkit.generation import GenerationConfig, generate  # noqa: E402
from attnkit.models import GPT, GPTConfig  # noqa: E402
from attnkit.models.gpt_tokenizer import GPTTokenizer  # noqa: E402
from attnkit.modules.feed_forward import make_activation  # noqa: E402
from tests.helpers.gpt import EOT, padded, train_byte_bpe, write_hf_gpt2_folder  # noqa: E402
from tests.helpers.gpt_parity import (  # noqa: E402
    TOL,
    assert_matches_hf,
    assert_same_greedy,
    hf_greedy,
    hf_positions,
    logit_error,
)

TEXTS = [
    "Attention is all you need.",
    "The animal didn't cross the street because it was too tired.",
    "A GPT is a stack of causal self-attention blocks, each followed by a feed-forward layer.",
    "Keys, queries and values: softmax(QK^T / sqrt(d_k)) V.",
    "Ünïcödé bytes and émojis 🙂 survive a byte-level BPE round trip.",
]
SMALL = dict(n_positions=128, n_embd=64, n_layer=2, n_head=4, initializer_range=0.2)
NEW_TOKENS = 64


def hf_config(tokenizer: Tokenizer, **overrides) -> transformers.GPT2Config:
    eot = tokenizer.token_to_id(EOT)
    kwargs = dict(SMALL, vocab_size=tokenizer.get_vocab_size(), bos_token_id=eot, eos_token_id=eot)
    return transformers.GPT2Config(**{**kwargs, **overrides})


def hf_eager(folder):
    return transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tokenizer():
    return train_byte_bpe(TEXTS * 4)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("gpt2_small")
    write_hf_gpt2_folder(folder, hf_config(tokenizer), tokenizer)
    return folder


@pytest.fixture(scope="module")
def hf_model(small_dir):
    return hf_eager(small_dir)


@pytest.fixture(scope="module")
def model(small_dir):
    return GPT.from_pretrained(small_dir)


@pytest.fixture(scope="module")
def rows(tokenizer):
    rows = [tokenizer.encode(t).ids for t in TEXTS[:4]]
    assert len({len(r) for r in rows}) == len(rows)  # every row a different length
    return rows


# --------------------------------------------------------------------------- loading


def test_config_and_tokenizer_come_from_the_folder(model, small_dir, tokenizer):
    c = model.config
    assert (c.vocab_size, c.context_length, c.d_model, c.num_layers, c.num_heads) == (
        tokenizer.get_vocab_size(),
        128,
        64,
        2,
        4,
    )
    assert c.d_ff == 4 * 64 and c.activation == "gelu_tanh" and c.tie_output
    assert c.eos_token_id == tokenizer.token_to_id(EOT) == model.tokenizer.eos_id
    assert model.lm_head.weight is model.embed.weight
    assert not model.training
    # The tokenizer is the folder's: ids equal those of transformers' fast tokenizer on it.
    reference = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(small_dir / "tokenizer.json")
    )
    for text in TEXTS:
        ids = model.tokenizer.encode(text)
        assert ids == reference(text)["input_ids"]
        assert model.tokenizer.decode(ids) == text


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_logits_match_hugging_face_on_a_padded_batch(model, hf_model, rows, padding_side):
    ids, mask = padded(rows, padding_side)
    got = assert_matches_hf(model, hf_model, ids, mask).logits
    # Each row equals the same prompt alone, unpadded.
    for i, row in enumerate(rows):
        with torch.no_grad():
            alone = hf_model(torch.tensor([row])).logits[0]
        torch.testing.assert_close(got[i][mask[i]], alone, **TOL)


def test_hidden_states_without_the_head_match_hugging_face(model, hf_model, rows):
    ids, mask = padded(rows, "left")
    with torch.no_grad():
        expected = hf_model.transformer(
            ids, attention_mask=mask.long(), position_ids=hf_positions(mask)
        ).last_hidden_state
        out = model(ids, attention_mask=mask, project=False)
        full = model(ids, attention_mask=mask)
    assert out.logits is None and out.hidden.shape == (4, ids.shape[1], 64)
    torch.testing.assert_close(out.hidden[mask], expected[mask], **TOL)
    torch.testing.assert_close(model.lm_head(out.hidden), full.logits, atol=0, rtol=0)


def test_attention_weights_match_hugging_face_eager_in_every_layer(model, hf_model, rows):
    ids, mask = padded(rows, "left")
    got = assert_matches_hf(model, hf_model, ids, mask, weights=True)
    # Padding query rows attend to nothing in attnkit: zero weights, not NaN.
    for w in got.weights:
        padding_rows = w.permute(0, 2, 1, 3)[~mask]
        assert padding_rows.numel() and torch.equal(padding_rows, torch.zeros_like(padding_rows))


def greedy(model, ids, mask, n, *, use_cache):
    """Greedy decoding written out with the model's own forward (cache or full recompute)."""
    b, t = ids.shape
    new = []
    with torch.no_grad():
        if use_cache:
            cache = model.init_cache(b, t + n)
            logits = model(ids, attention_mask=mask, cache=cache).logits[:, -1]
            for _ in range(n):
                new.append(logits.argmax(-1))
                logits = model(new[-1][:, None], cache=cache).logits[:, -1]
        else:
            for _ in range(n):
                new.append(model(ids, attention_mask=mask).logits[:, -1].argmax(-1))
                ids = torch.cat([ids, new[-1][:, None]], 1)
                mask = torch.cat([mask, torch.ones(b, 1, dtype=torch.bool)], 1)
    return torch.stack(new, 1)  # (B, n)


@pytest.fixture(scope="module", params=[True, False], ids=["hf_cache", "hf_no_cache"])
def hf_continuation(request, hf_model, model, rows):
    """Hugging Face generate(): 64 greedy tokens for the left-padded batch, eos not stopping,
    with or without its cache; with the largest attnkit-HF logit difference along them."""
    ids, mask = padded(rows, "left")
    tokens, logits = hf_greedy(hf_model, ids, mask, NEW_TOKENS, use_cache=request.param)
    assert tokens.shape == (len(rows), NEW_TOKENS)
    return tokens, logits, logit_error(model, ids, mask, tokens, logits)


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_loop_matches_hugging_face_generate(model, rows, hf_continuation, use_cache):
    tokens, logits, error = hf_continuation
    ids, mask = padded(rows, "left")
    ours = greedy(model, ids, mask, NEW_TOKENS, use_cache=use_cache)
    assert_same_greedy(ours, tokens, logits, error, min_steps=NEW_TOKENS)


@pytest.mark.parametrize("use_cache", [True, False])
def test_attnkit_generate_matches_hugging_face_generate(model, rows, hf_continuation, use_cache):
    tokens, logits, error = hf_continuation
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, eos_ids=(), use_cache=use_cache)
    out = generate(model, rows, config)
    assert_same_greedy(out.tokens, tokens, logits, error, min_steps=NEW_TOKENS)
    assert out.finish_reasons == ["length"] * len(rows)


def test_gelu_tanh_is_gpt2s_gelu_new():
    x = torch.linspace(-8, 8, 1001, dtype=torch.float64)
    formula = 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))
    got = make_activation("gelu_tanh")(x)
    torch.testing.assert_close(got, formula, atol=1e-12, rtol=0)
    torch.testing.assert_close(got, NewGELUActivation()(x), atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(activation_function="gelu"),
        dict(activation_function="relu"),
        dict(activation_function="gelu_pytorch_tanh"),
        dict(tie_word_embeddings=False),
        dict(n_inner=48, layer_norm_epsilon=1e-3),
    ],
    ids=["gelu", "relu", "gelu_pytorch_tanh", "untied", "n_inner_eps"],
)
def test_config_variants_match_hugging_face(tmp_path, tokenizer, rows, overrides):
    hf = write_hf_gpt2_folder(tmp_path, hf_config(tokenizer, **overrides))
    model = GPT.from_pretrained(tmp_path)
    assert model.config.tie_output == overrides.get("tie_word_embeddings", True)
    assert (model.lm_head.weight is model.embed.weight) == model.config.tie_output
    assert_matches_hf(model, hf, *padded(rows, "left"))


def test_gpt2model_checkpoint_without_prefix_and_with_mask_buffers(
    tmp_path, small_dir, model, rows
):
    """The original ``gpt2`` checkpoint's layout: GPT2Model names (no ``transformer.``) and the
    causal-mask buffers ``h.N.attn.bias`` / ``h.N.attn.masked_bias``."""
    state = load_file(small_dir / "model.safetensors")
    bare = {k.removeprefix("transformer."): v for k, v in state.items() if k != "lm_head.weight"}
    for i in range(2):
        bare[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 128, 128, dtype=torch.bool))
        bare[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(bare, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((small_dir / "config.json").read_text())
    loaded = GPT.from_pretrained(tmp_path)
    ids, mask = padded(rows, "right")
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(ids, attention_mask=mask).logits,
            model(ids, attention_mask=mask).logits,
            atol=0,
            rtol=0,
        )


# --------------------------------------------------------------------------- saving


def test_save_pretrained_round_trips_and_hugging_face_reads_it(tmp_path, model, rows):
    out = tmp_path / "saved"
    assert model.save_pretrained(out) == out
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["activation_function"] == "gelu_new"
    stored = load_file(out / "model.safetensors")
    assert "lm_head.weight" not in stored  # tied: stored once, as Hugging Face does
    assert stored["transformer.h.0.attn.c_attn.weight"].shape == (64, 192)  # Conv1D (in, out)

    again = GPT.from_pretrained(out)
    for (name, a), (_, b) in zip(
        model.state_dict().items(), again.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert again.lm_head.weight is again.embed.weight
    assert again.tokenizer.encode(TEXTS[0]) == model.tokenizer.encode(TEXTS[0])

    assert_matches_hf(model, hf_eager(out), *padded(rows, "left"))
    model.save_pretrained(out)  # replacing a folder attnkit wrote is allowed


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("positional", "sinusoidal", r"positional='sinusoidal': a GPT-2 folder holds learned"),
        ("bias", False, r"bias=False: GPT-2 folders hold linear layers with biases only"),
    ],
)
def test_save_refuses_what_gpt2_folders_cannot_hold(tmp_path, field, value, message):
    model = GPT(
        GPTConfig(
            vocab_size=50,
            context_length=16,
            d_model=16,
            num_heads=2,
            num_layers=1,
            d_ff=32,
            bos_token_id=0,
            eos_token_id=0,
            **{field: value},
        )
    )
    with pytest.raises(ValueError, match=message):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- refusals


def test_weights_holding_nan_are_refused_naming_the_stored_tensor(tmp_path, small_dir):
    """Before: loaded; `attnkit evaluate --text` on such a model printed nan nats a token,
    status 0."""
    from tests.helpers.bad_files import poison_weights

    shutil.copytree(small_dir, tmp_path / "nan")
    path = tmp_path / "nan" / "model.safetensors"
    name, size = poison_weights(path)
    message = (
        f"{path}: tensor {name!r} (1 NaN, 0 inf of {size} values) holds NaN or inf; these "
        "weights cannot be used (a run that diverged, or a damaged file)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        GPT.from_pretrained(tmp_path / "nan")


def test_pickle_checkpoint_is_refused_with_a_conversion_hint(tmp_path, small_dir):
    (tmp_path / "config.json").write_text((small_dir / "config.json").read_text())
    torch.save(load_file(small_dir / "model.safetensors"), tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin: pickled weights") as err:
        GPT.from_pretrained(tmp_path)
    assert "unpickling a file can run arbitrary code" in str(err.value)
    assert "save_file(torch.load('pytorch_model.bin', weights_only=True)" in str(err.value)


@pytest.mark.parametrize(
    "option,value",
    [
        ("scale_attn_by_inverse_layer_idx", True),
        ("reorder_and_upcast_attn", True),
        ("add_cross_attention", True),
        ("scale_attn_weights", False),
    ],
)
def test_unsupported_config_options_are_refused(tmp_path, small_dir, option, value):
    config = json.loads((small_dir / "config.json").read_text())
    config[option] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=rf"config\.json: {option}={json.dumps(value)} is not supported"
    ):
        GPT.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("activation_function", "quick_gelu", r"activation_function='quick_gelu' is not supported"),
        ("n_head", 5, r"config\.json: d_model must be a multiple of num_heads"),
        ("n_embd", "64", r"config\.json: d_model: expected an integer"),
        ("eos_token_id", [1, 2], r"config\.json: eos_token_id: expected one id or null"),
        ("model_type", "bert", r"this is a Hugging Face BERT folder"),
    ],
)
def test_bad_config_fields_are_named(tmp_path, small_dir, field, value, message):
    config = json.loads((small_dir / "config.json").read_text())
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((small_dir / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match=message):
        GPT.from_pretrained(tmp_path)


def test_missing_and_unknown_keys_are_named(tmp_path, small_dir):
    (tmp_path / "config.json").write_text((small_dir / "config.json").read_text())
    state = load_file(small_dir / "model.safetensors")
    del state["transformer.h.1.mlp.c_fc.bias"]
    state["transformer.h.0.attn.q_attn.weight"] = torch.zeros(64, 64)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError) as err:
        GPT.from_pretrained(tmp_path)
    message = str(err.value)
    assert "missing keys ['transformer.h.1.mlp.c_fc.bias']" in message
    assert "unknown keys ['transformer.h.0.attn.q_attn.weight']" in message


def test_tokenizer_batches_pad_on_the_side_asked(model):
    tok = model.tokenizer
    assert isinstance(tok, GPTTokenizer)
    ids, mask = tok.batch(["Attention", "Attention is all you need."])
    n = len(tok.encode("Attention"))
    assert mask[0].tolist() == [False] * (ids.shape[1] - n) + [True] * n
    assert ids[0, -n:].tolist() == tok.encode("Attention")
    ids, mask = tok.batch(["Attention", "Attention is all you need."], padding_side="right")
    assert mask[0].tolist() == [True] * n + [False] * (ids.shape[1] - n)
    with pytest.raises(ValueError, match=r"texts: entries \[1\] encode to no tokens"):
        tok.batch(["a", ""])
    with pytest.raises(ValueError, match=r"padding_side: expected 'left' or 'right', got 'top'"):
        tok.batch(["a"], padding_side="top")


def test_from_pretrained_casts_to_the_dtype_asked(small_dir, model, rows):
    half = GPT.from_pretrained(small_dir, dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert half.lm_head.weight is half.embed.weight
    ids, mask = padded(rows, "left")
    with torch.no_grad():
        got = half(ids, attention_mask=mask).logits
        expected = model(ids, attention_mask=mask).logits
    assert got.dtype == torch.bfloat16
    # bfloat16 keeps 8 bits of mantissa: close to float32, not equal.
    torch.testing.assert_close(got[mask].float(), expected[mask], atol=0.3, rtol=0.05)


def test_from_pretrained_takes_a_dtype_by_its_torch_name(small_dir):
    """The name "bfloat16" reached torch's .to() as a device ("Invalid device string")."""
    for name in ("bfloat16", "torch.bfloat16"):
        half = GPT.from_pretrained(small_dir, dtype=name)
        assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    with pytest.raises(ValueError, match=r"dtype: expected a floating-point torch.dtype or its "
                       r"name \(float32, bfloat16, float16 or float64.*got 'bf16'"):  # fmt: skip
        GPT.from_pretrained(small_dir, dtype="bf16")


def test_tokenizer_that_does_not_fit_the_model_is_refused(tmp_path, small_dir, tokenizer):
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_bytes((small_dir / name).read_bytes())
    config = json.loads((small_dir / "config.json").read_text())
    n = tokenizer.get_vocab_size()
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": n - 10}))
    with pytest.raises(
        ValueError, match=rf"tokenizer\.json: {n} tokens, more than vocab_size={n - 10}"
    ):
        GPT.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"tokenizer\.json: not a readable tokenizer\.json"):
        GPT.from_pretrained(tmp_path)
    # An empty vocabulary: every prompt would encode to nothing (before: `generate` printed the
    # prompt and no continuation, exit 0).
    empty = json.loads((small_dir / "tokenizer.json").read_text())
    empty["model"]["vocab"], empty["model"]["merges"], empty["added_tokens"] = {}, [], []
    (tmp_path / "tokenizer.json").write_text(json.dumps(empty))
    with pytest.raises(ValueError, match=r"tokenizer\.json: tokenizer: an empty vocabulary"):
        GPT.from_pretrained(tmp_path)


def test_a_shape_mismatch_is_named_in_the_files_terms(tmp_path, small_dir):
    """Before: 'blocks.layers.0.ffn.linear1.weight: file (64, 256), ...': attnkit's name and
    the transposed shape, where the file holds transformer.h.0.mlp.c_fc.weight as (n_embd,
    n_inner) (a Conv1D)."""
    config = json.loads((small_dir / "config.json").read_text())
    stored = load_file(small_dir / "model.safetensors")
    c_fc = next(k for k in stored if k.endswith("h.0.mlp.c_fc.weight"))
    n_embd, n_inner = stored[c_fc].shape
    config["n_inner"] = n_inner // 2  # the config says another width than the weights
    (tmp_path / "config.json").write_text(json.dumps(config))
    os.link(small_dir / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"shapes differ") as err:
        GPT.from_pretrained(tmp_path)
    assert (
        f"transformer.h.0.mlp.c_fc.weight: file ({n_embd}, {n_inner}), model ({n_embd}, "
        f"{n_inner // 2}) (attnkit's " in str(err.value)
    )
