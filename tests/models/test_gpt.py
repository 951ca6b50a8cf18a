"""attnkit GPT on its own: built from attnkit's layers, causal, padding-proof (left and right, no
NaN), the KV cache equal to full recomputation, and clear errors for bad configs and inputs.
Parity with Hugging Face GPT-2 is in test_gpt_hf.py."""

import re

import pytest
import torch
import torch.nn.functional as F

import attnkit.attention
import attnkit.modules.multihead
from attnkit.models import GPT, GPTCache, GPTConfig
from attnkit.modules import EncoderLayer
from tests.helpers.gpt import padded

TOL = dict(atol=1e-5, rtol=0)
TINY = dict(
    vocab_size=53,
    context_length=24,
    d_model=16,
    num_heads=2,
    num_layers=2,
    d_ff=40,
    dropout=0.0,
    attn_dropout=0.0,
    embed_dropout=0.0,
    initializer_range=0.3,
    bos_token_id=0,
    eos_token_id=0,
)
LENGTHS = (7, 3, 1, 5)


def tiny(**overrides) -> GPT:
    return GPT(GPTConfig(**{**TINY, **overrides})).eval()


@pytest.fixture
def rows():
    return [torch.randint(1, 53, (n,)) for n in LENGTHS]


# --------------------------------------------------------------------------- structure


def test_blocks_are_attnkit_encoder_layers_with_a_tied_head():
    model = tiny()
    assert all(isinstance(layer, EncoderLayer) for layer in model.blocks.layers)
    assert len(model.blocks.layers) == 2 and model.blocks.norm is not None
    assert all(layer.attn_block.norm_first for layer in model.blocks.layers)  # pre-LN
    assert model.lm_head.weight is model.embed.weight
    untied = tiny(tie_output=False)
    assert untied.lm_head.weight is not untied.embed.weight


def test_forward_goes_through_attnkits_one_attention_function(monkeypatch, rows):
    """Every layer calls attnkit.scaled_dot_product_attention, causally, and torch's fused
    kernel is only ever reached from inside it: no second attention implementation."""
    core = attnkit.attention.scaled_dot_product_attention
    fused = F.scaled_dot_product_attention
    calls, depth, stray = [], [0], []

    def spy_core(*args, **kwargs):
        calls.append(kwargs.get("causal", False))
        depth[0] += 1
        try:
            return core(*args, **kwargs)
        finally:
            depth[0] -= 1

    def spy_fused(*args, **kwargs):
        if depth[0] == 0:
            stray.append(args[0].shape)
        return fused(*args, **kwargs)

    monkeypatch.setattr(attnkit.modules.multihead, "scaled_dot_product_attention", spy_core)
    monkeypatch.setattr(attnkit.attention.F, "scaled_dot_product_attention", spy_fused)
    model = tiny()
    ids, mask = padded(rows, "left")
    with torch.no_grad():
        model(ids, attention_mask=mask)
        assert calls == [True, True]  # one call per layer, causal
        model(ids, attention_mask=mask, return_weights=True)
        cache = model.init_cache(len(rows), ids.shape[1] + 1)
        model(ids, attention_mask=mask, cache=cache)
        model(ids[:, :1], cache=cache)
    assert calls == [True] * 8 and not stray


def test_residual_projections_get_gpt2_scaled_init():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY, "d_model": 64, "d_ff": 256, "num_layers": 8}))
    std = 0.3 / (2 * 8) ** 0.5
    layer = model.blocks.layers[0]
    assert abs(layer.self_attn.out_proj.weight.std().item() - std) < 0.15 * std
    assert abs(layer.self_attn.in_proj.weight.std().item() - 0.3) < 0.15 * 0.3
    assert torch.equal(layer.self_attn.in_proj.bias, torch.zeros(3 * 64))


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_causal_a_later_token_never_changes_earlier_logits(positional):
    model = tiny(positional=positional)
    ids = torch.randint(0, 53, (2, 9))
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 7) % 53
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=0, rtol=0)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_sinusoidal_positions_are_the_attnkit_encoding():
    """With sinusoidal positions, token + PE(pos) goes into the first block."""
    model = tiny(positional="sinusoidal")
    seen = {}
    model.blocks.layers[0].register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0]))
    ids = torch.randint(0, 53, (1, 6))
    with torch.no_grad():
        model(ids)
    expected = model.positions(model.embed(ids))  # SinusoidalPositionalEncoding adds PE(0..5)
    torch.testing.assert_close(seen["x"], expected, atol=0, rtol=0)


# --------------------------------------------------------------------------- padding


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_each_padded_row_equals_the_row_alone(rows, padding_side, positional):
    model = tiny(positional=positional)
    ids, mask = padded(rows, padding_side)
    with torch.no_grad():
        out = model(ids, attention_mask=mask).logits
        for i, row in enumerate(rows):
            alone = model(row[None]).logits[0]
            torch.testing.assert_close(out[i][mask[i]], alone, **TOL)
    assert not out.isnan().any()


def test_integer_mask_equals_bool_mask_and_all_ones_equals_none(rows):
    model = tiny()
    ids, mask = padded(rows, "left")
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, attention_mask=mask.long()).logits,
            model(ids, attention_mask=mask).logits,
            atol=0,
            rtol=0,
        )
        torch.testing.assert_close(
            model(ids, attention_mask=torch.ones_like(ids)).logits,
            model(ids).logits,
            atol=0,
            rtol=0,
        )


def test_a_row_of_only_padding_gives_no_nan():
    model = tiny()
    ids = torch.randint(0, 53, (2, 4))
    mask = torch.tensor([[True, True, True, True], [False, False, False, False]])
    with torch.no_grad():
        out = model(ids, attention_mask=mask, return_weights=True)
    assert not out.logits.isnan().any()
    assert all(
        not w.isnan().any() and torch.equal(w[1], torch.zeros_like(w[1])) for w in out.weights
    )


# --------------------------------------------------------------------------- cache


def incremental(model, ids, mask, split, *, cache_len=None):
    """Prefill ``ids[:, :split]`` (with its mask), then one column at a time."""
    b, t = ids.shape
    cache = model.init_cache(b, cache_len or t)
    with torch.no_grad():
        outs = [model(ids[:, :split], attention_mask=mask[:, :split], cache=cache).logits]
        for j in range(split, t):
            outs.append(
                model(ids[:, j : j + 1], attention_mask=mask[:, j : j + 1], cache=cache).logits
            )
    return torch.cat(outs, 1), cache


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_prefill_then_steps_equals_one_full_pass(rows, padding_side, positional):
    model = tiny(positional=positional)
    prompt_ids, prompt_mask = padded(rows, padding_side)
    new = torch.randint(1, 53, (len(rows), 4))
    ids = torch.cat([prompt_ids, new], 1)
    mask = torch.cat([prompt_mask, torch.ones(len(rows), 4, dtype=torch.bool)], 1)
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
    steps, cache = incremental(model, ids, mask, prompt_ids.shape[1], cache_len=ids.shape[1] + 3)
    torch.testing.assert_close(steps[mask], full[mask], **TOL)
    assert not steps.isnan().any()
    assert cache.length == ids.shape[1] and cache.max_len == ids.shape[1] + 3
    assert cache.positions.tolist() == [n + 4 for n in LENGTHS]
    # Every row continues exactly as the row alone would (its own positions, no padding seen).
    for i, row in enumerate(rows):
        with torch.no_grad():
            alone = model(torch.cat([row, new[i]])[None]).logits[0, -4:]
        torch.testing.assert_close(steps[i, -4:], alone, **TOL)


def test_one_token_at_a_time_from_the_start_equals_full_pass(rows):
    model = tiny()
    ids, mask = padded(rows, "left")
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
    steps, _ = incremental(model, ids, mask, 1)
    torch.testing.assert_close(steps[mask], full[mask], **TOL)


def test_weights_with_a_cache_equal_the_full_pass_rows(rows):
    model = tiny()
    ids, mask = padded(rows, "left")
    with torch.no_grad():
        full = model(ids, attention_mask=mask, return_weights=True).weights
        cache = model.init_cache(len(rows), ids.shape[1])
        model(ids[:, :-1], attention_mask=mask[:, :-1], cache=cache)
        last = model(ids[:, -1:], cache=cache, return_weights=True).weights
    for f, w in zip(full, last, strict=True):
        torch.testing.assert_close(w[:, :, 0], f[:, :, -1], **TOL)


def test_cache_reorder_follows_the_selected_rows(rows):
    model = tiny()
    ids, mask = padded(rows, "left")
    cache = model.init_cache(4, ids.shape[1] + 1)
    nxt = torch.randint(1, 53, (4, 1))
    with torch.no_grad():
        model(ids, attention_mask=mask, cache=cache)
        index = torch.tensor([2, 0])
        cache.reorder(index)
        assert cache.batch_size == 2 and cache.positions.tolist() == [LENGTHS[2], LENGTHS[0]]
        got = model(nxt[index], cache=cache).logits[:, 0]
        full = model(
            torch.cat([ids, nxt], 1)[index],
            attention_mask=torch.cat([mask, torch.ones(4, 1, dtype=torch.bool)], 1)[index],
        ).logits[:, -1]
    torch.testing.assert_close(got, full, **TOL)


@pytest.mark.parametrize(
    "index, message",
    [
        (torch.tensor([0, 4]), "index: rows 0 to 4 given, but the cache holds rows 0 to 3"),
        (torch.tensor([-1, 0]), "index: rows -1 to 0 given, but the cache holds rows 0 to 3"),
        (torch.tensor([0.0, 1.0]), "got shape (2,) dtype torch.float32"),
        (torch.tensor([[0, 1]]), "got shape (1, 2) dtype torch.int64"),
        ([0, 1], "expected a 1-D int64 or int32 tensor of rows of the cache, got list"),
    ],
)
def test_cache_reorder_refuses_a_bad_index_and_keeps_the_cache(rows, index, message):
    # Before: torch's IndexError "index out of range in self", an index_select dtype error, or
    # an AttributeError for a list.
    model = tiny()
    ids, mask = padded(rows, "left")
    cache = model.init_cache(4, ids.shape[1] + 1)
    with torch.no_grad():
        model(ids, attention_mask=mask, cache=cache)
        keys = [layer.k.clone() for layer in cache.layers]
        with pytest.raises(ValueError, match=re.escape(message)):
            cache.reorder(index)
    assert cache.batch_size == 4
    for layer, k in zip(cache.layers, keys, strict=True):
        torch.testing.assert_close(layer.k, k, rtol=0, atol=0)


def test_init_cache_defaults_and_dtype():
    model = tiny()
    cache = model.init_cache(3)
    assert isinstance(cache, GPTCache) and cache.max_len == 24 and len(cache.layers) == 2
    assert cache.layers[0].k.shape == (3, 2, 24, 8) and cache.layers[0].k.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.init_cache(1, 4).layers[0].k.dtype == torch.bfloat16
    # A bfloat16 cache may be made ahead of its use under autocast.
    assert model.init_cache(1, 4, dtype=torch.bfloat16).layers[1].v.dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"batch_size: expected a positive integer, got 0"):
        model.init_cache(0)
    with pytest.raises(ValueError, match=r"max_len: expected a positive integer, got -1"):
        model.init_cache(1, -1)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((True, 8), {}, r"batch_size: expected a positive integer, got True \(bool\)"),
        ((2, False), {}, r"max_len: expected a positive integer, got False \(bool\)"),
        ((2, 8.0), {}, r"max_len: expected a positive integer, got 8.0 \(float\)"),
        ((2, 8), {"dtype": torch.long}, r"dtype: expected a floating-point torch.dtype"),
        ((2, 8), {"device": "meta"}, r"device: the model is on cpu, got meta"),
    ],
)
def test_init_cache_refuses_what_the_model_could_not_use(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny().init_cache(*args, **kwargs)


def test_a_cache_made_ahead_for_another_dtype_is_checked_at_the_forward():
    """A float16 cache for use under float16 autocast is made outside the context (the default
    autocast dtype there is bfloat16); a float32 forward with it is refused, untouched."""
    model = tiny()
    cache = model.init_cache(1, 4, dtype=torch.float16)
    ids = torch.ones(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"cache: keys and values in torch.float16, but"):
        model(ids, cache=cache)
    assert cache.layers[0].length == 0
    with torch.autocast("cpu", dtype=torch.float16):
        model(ids, cache=cache)
    assert cache.layers[0].length == 2


def test_cache_refusals_leave_it_as_it_was():
    model = tiny()
    with pytest.raises(ValueError, match=r"cache: made for 2 rows, but ids has 1 rows"):
        model(torch.ones(1, 1, dtype=torch.long), cache=model.init_cache(2, 3))
    for max_len, message in (
        (3, r"4 positions exceed the cache's max_len=3"),
        (30, r"ids: a row reaches position 24, beyond context_length=24"),
    ):
        cache = model.init_cache(2, max_len)
        t = min(max_len, 24)
        with torch.no_grad():
            model(torch.ones(2, t, dtype=torch.long), cache=cache)
            with pytest.raises(ValueError, match=message):
                model(torch.ones(2, 1, dtype=torch.long), cache=cache)
        assert cache.length == t and cache.positions.tolist() == [t, t]


class Boom(Exception):
    pass


def fail_in_layer_1(module, args, output):
    raise Boom("layer 1")


def cache_state(cache: GPTCache) -> tuple:
    return cache.length, cache.positions.tolist(), [layer.length for layer in cache.layers]


@pytest.mark.parametrize("window", [None, 3], ids=["gpt2", "window"])
def test_a_forward_that_fails_part_way_leaves_the_cache_as_it_was(rows, window):
    """An error in layer 1 (after layer 0 and the padding have taken the new slots) puts the
    cache back, and the retry equals the pass without a cache: at the prefill, at a chunk of 3
    (which rewrites a 3-slot window's whole ring) and at one-token steps."""
    model = tiny() if window is None else llama(window=window)
    prompt_ids, prompt_mask = padded(rows, "left")  # (4, 7)
    ids = torch.cat([prompt_ids, torch.randint(1, 53, (4, 5))], 1)  # (4, 12)
    mask = torch.cat([prompt_mask, torch.ones(4, 5, dtype=torch.bool)], 1)
    cache = model.init_cache(4, 12)
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        for a, b in ((0, 7), (7, 10), (10, 11), (11, 12)):
            before = cache_state(cache)
            hook = model.blocks.layers[1].register_forward_hook(fail_in_layer_1)
            with pytest.raises(Boom):
                model(ids[:, a:b], attention_mask=mask[:, a:b], cache=cache)
            hook.remove()
            assert cache_state(cache) == before
            got = model(ids[:, a:b], attention_mask=mask[:, a:b], cache=cache).logits
            torch.testing.assert_close(got[mask[:, a:b]], full[:, a:b][mask[:, a:b]], **TOL)
    assert cache_state(cache)[0] == 12


@pytest.mark.parametrize(
    ("make_cache", "error", "message"),
    [
        (lambda: tiny(num_layers=3).init_cache(2, 5), ValueError,
         r"cache: has 3 layers, but the model has 2; make it with this model's init_cache"),
        (lambda: tiny(d_model=32, d_ff=64).init_cache(2, 5), ValueError,
         r"cache: holds 2 key/value heads of width 16, but the model has 2 of width 8"),
        (lambda: tiny(num_heads=4).init_cache(2, 5), ValueError,
         r"cache: holds 4 key/value heads of width 4, but the model has 2 of width 8"),
        (lambda: tiny().init_cache(2, 5, dtype=torch.bfloat16), ValueError,
         r"cache: keys and values in torch.bfloat16, but the model computes them in "
         r"torch.float32 here"),
        (lambda: tiny().init_cache(2, 5).layers, TypeError,
         r"cache: expected a GPTCache \(from GPT.init_cache\), got list"),
    ],
    ids=["layers", "width", "heads", "dtype", "type"],
)  # fmt: skip
def test_a_cache_that_does_not_fit_the_model_is_refused_untouched(make_cache, error, message):
    model, cache = tiny(), make_cache()
    with torch.no_grad(), pytest.raises(error, match=message):
        model(torch.ones(2, 3, dtype=torch.long), cache=cache)
    if isinstance(cache, GPTCache):
        assert cache_state(cache) == (0, [0, 0], [0] * len(cache.layers))


def test_a_bfloat16_cache_fits_the_model_under_autocast():
    model = tiny()
    cache = model.init_cache(2, 5, dtype=torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.ones(2, 3, dtype=torch.long), cache=cache)
    assert cache.length == 3


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "ids,mask,error,message",
    [
        (
            torch.tensor([[1, 53]]),
            None,
            ValueError,
            r"ids: token id 53 is outside the vocabulary \[0, 53\)",
        ),
        (torch.tensor([[-1, 2]]), None, ValueError, r"ids: token id -1 is outside"),
        (
            torch.ones(1, 25, dtype=torch.long),
            None,
            ValueError,
            r"ids: a row reaches position 24, beyond context_length=24",
        ),
        (
            torch.ones(3, dtype=torch.long),
            None,
            ValueError,
            r"ids: expected integer token ids of shape \(B, T\), got shape \(3,\)",
        ),
        (
            torch.ones(1, 3),
            None,
            ValueError,
            r"ids: expected integer token ids .* dtype torch.float32",
        ),
        (torch.ones(1, 0, dtype=torch.long), None, ValueError, r"ids: expected at least one token"),
        ([[1, 2]], None, TypeError, r"ids: expected a torch.Tensor of token ids, got list"),
        (
            torch.ones(1, 3, dtype=torch.long),
            torch.ones(1, 4, dtype=torch.bool),
            ValueError,
            r"attention_mask: expected the shape of ids \(1, 3\), got \(1, 4\)",
        ),
        (
            torch.ones(1, 3, dtype=torch.long),
            torch.ones(1, 3),
            TypeError,
            r"attention_mask: expected bool or 0/1 integers .* got dtype torch.float32",
        ),
        (
            torch.ones(1, 3, dtype=torch.long),
            torch.tensor([[0, 1, 2]]),
            ValueError,
            r"attention_mask: expected only 0 and 1",
        ),
        (
            torch.ones(1, 3, dtype=torch.long),
            [[1, 1, 1]],
            TypeError,
            r"attention_mask: expected a torch.Tensor, got list",
        ),
    ],
)
def test_bad_inputs_raise_clear_errors(ids, mask, error, message):
    with pytest.raises(error, match=message):
        tiny()(ids, attention_mask=mask)


def test_padding_does_not_count_against_the_context():
    """Positions count real tokens: 24 real tokens fit a context of 24 even behind padding."""
    model = tiny()
    ids = torch.ones(1, 30, dtype=torch.long)
    mask = torch.ones(1, 30, dtype=torch.bool)
    mask[0, :6] = False
    with torch.no_grad():
        assert not model(ids, attention_mask=mask).logits.isnan().any()
    mask[0, 5] = True
    with pytest.raises(ValueError, match=r"reaches position 24, beyond context_length=24"):
        model(ids, attention_mask=mask)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("d_model", 15, r"d_model must be a multiple of num_heads, got d_model=15, num_heads=2"),
        ("vocab_size", 0, r"vocab_size: expected an integer from 1"),
        ("context_length", "24", r"context_length: expected an integer"),
        ("dropout", 1.0, r"dropout: expected a number in \[0.0, 1.0\)"),
        (
            "activation",
            "swish",
            r"activation: expected one of \['gelu', 'gelu_tanh', 'relu', 'silu'\]",
        ),
        ("positional", "alibi", r"positional: expected one of \['learned', 'sinusoidal', 'rope'\]"),
        ("eos_token_id", 53, r"eos_token_id: expected an integer from 0 to 52"),
        ("bias", 1, r"bias: expected true or false"),
        ("num_kv_heads", 3, r"num_kv_heads: expected an integer from 1 to 2, got 3"),
        ("num_kv_heads", 0, r"num_kv_heads: expected an integer from 1 to 2, got 0"),
        ("norm", "batch", r"norm: expected one of \['layer', 'rms'\], got 'batch'"),
        ("gated_ffn", "yes", r"gated_ffn: expected true or false"),
        ("qkv_bias", 0, r"qkv_bias: expected true or false"),
        ("rope_scaling", "yarn", r"rope_scaling: expected one of \['none', 'linear', 'llama3'\]"),
        ("rope_base", 0.0, r"rope_base: expected a number in \(0.0, "),
        ("rope_factor", -1.0, r"rope_factor: expected a number in \(0.0, "),
        ("window", 0, r"window: expected an integer from 1"),
        ("window", 2.5, r"window: expected an integer from 1"),
        ("full_attention_layers", 1, r"full_attention_layers=1: needs a window"),
        ("full_attention_layers", 3, r"full_attention_layers: expected an integer from 0 to 2"),
    ],
)
def test_bad_config_fields_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{**TINY, field: value})


def test_gpt2_default_ids_outside_a_small_vocabulary_are_explained():
    small = {k: v for k, v in TINY.items() if k not in ("bos_token_id", "eos_token_id")}
    with pytest.raises(ValueError) as err:
        GPTConfig(**{**small, "vocab_size": 10})
    message = str(err.value)
    assert message.startswith("bos_token_id: expected an integer from 0 to 9, got 50256")
    assert "GPT-2's <|endoftext|>, the default of bos_token_id" in message
    assert "your tokenizer's ids, or None" in message
    config = GPTConfig(**{**small, "vocab_size": 10, "bos_token_id": None, "eos_token_id": 9})
    assert (config.bos_token_id, config.eos_token_id) == (None, 9)


def test_a_sliding_window_with_a_cache_refuses_right_padding():
    """The cache's window counts slots: a right-padded row's next token would see padding
    instead of its last real tokens (logits 0.1 away from the row alone). Left padding agrees
    with the row alone."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.llama(vocab_size=100, context_length=64, d_model=32, num_heads=4,
                                num_kv_heads=2, num_layers=2, d_ff=64, window=4)).eval()  # fmt: skip
    long, short = [5, 6, 7, 8, 9, 10, 11, 12], [20, 21]
    with torch.no_grad():
        alone = model(torch.tensor([[*short, 22]])).logits[0, -1]
        cache = model.init_cache(2, 20)
        right = torch.tensor([[1] * 8, [1, 1] + [0] * 6])
        with pytest.raises(ValueError, match=r"^attention_mask: padding after a real token, with"):
            model(torch.tensor([long, short + [0] * 6]), attention_mask=right, cache=cache)
        assert cache.length == 0  # refused before anything was written
        left = torch.tensor([[1] * 8, [0] * 6 + [1, 1]])
        model(torch.tensor([long, [0] * 6 + short]), attention_mask=left, cache=cache)
        step = model(torch.tensor([[13], [22]]), cache=cache).logits[1, 0]
        # Without a cache, right padding is fine: positions count real tokens only.
        full = model(torch.tensor([[*short, 22, 0]]), attention_mask=torch.tensor([[1, 1, 1, 0]]))
    torch.testing.assert_close(step, alone, rtol=0, atol=1e-5)
    torch.testing.assert_close(full.logits[0, 2], alone, rtol=0, atol=1e-5)


def test_dropout_is_active_in_training_only():
    model = tiny(dropout=0.5, attn_dropout=0.5, embed_dropout=0.5)
    ids = torch.randint(0, 53, (2, 6))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model(ids).logits)
        model.train()
        assert not torch.equal(model(ids).logits, model(ids).logits)


def test_num_heads_must_be_a_multiple_of_num_kv_heads():
    with pytest.raises(ValueError, match=r"num_heads must be a multiple of num_kv_heads, got "):
        GPTConfig(**{**TINY, "num_heads": 4, "num_kv_heads": 3})


def test_rope_needs_an_even_head_width_and_llama3_ordered_factors():
    with pytest.raises(ValueError, match=r"positional='rope': the head width .* must be even"):
        GPTConfig(**{**TINY, "d_model": 18, "positional": "rope"})
    with pytest.raises(ValueError, match=r"rope_high_freq_factor=1.0: must exceed"):
        GPTConfig(**{**TINY, "rope_scaling": "llama3", "rope_high_freq_factor": 1.0})


# --------------------------------------------------------------------------- Llama's options

LLAMA = dict(
    vocab_size=53, context_length=40, d_model=16, num_heads=4, num_kv_heads=2, num_layers=2,
    d_ff=24, initializer_range=0.3,
)  # fmt: skip


def llama(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.llama(**{**LLAMA, **overrides})).eval()


def test_llama_style_config_and_model():
    config = GPTConfig.llama(**LLAMA)
    assert (config.positional, config.norm, config.activation) == ("rope", "rms", "silu")
    assert config.gated_ffn and not config.bias and not config.tie_output
    assert (config.dropout, config.attn_dropout, config.embed_dropout) == (0.0, 0.0, 0.0)
    model = GPT(config)
    assert model.positions is None and model.rotary is not None
    names = set(model.state_dict())
    assert not any("bias" in n or "positions" in n for n in names), sorted(names)
    assert model.lm_head.weight is not model.embed.weight
    block = model.blocks.layers[0]
    assert block.self_attn.in_proj.weight.shape == (16 + 2 * 2 * 4, 16)
    assert block.ffn.linear1.weight.shape == (48, 16)
    # The GPT-2 default builds exactly what it built before (no rotary, LayerNorm, biases).
    assert tiny().rotary is None


@pytest.mark.parametrize("options", [{}, {"window": 3}, {"num_kv_heads": 1}])
def test_llama_causal_a_later_token_never_changes_earlier_logits(options):
    model = llama(**options)
    ids = torch.randint(0, 53, (2, 9))
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 7) % 53
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=0, rtol=0)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_a_window_limits_how_far_back_a_token_sees():
    model = llama(window=3)
    ids = torch.randint(0, 53, (1, 9))
    changed = ids.clone()
    changed[0, 0] = (ids[0, 0] + 1) % 53
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    # Two layers of a 3-token window: token 0 reaches positions up to 0 + 2 * (3 - 1) = 4.
    assert not torch.allclose(a[0, 4], b[0, 4])
    torch.testing.assert_close(a[0, 5:], b[0, 5:], atol=0, rtol=0)


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("options", [{}, {"window": 3}, {"qkv_bias": True}])
def test_llama_each_padded_row_equals_the_row_alone(rows, padding_side, options):
    model = llama(**options)
    ids, mask = padded(rows, padding_side)
    with torch.no_grad():
        out = model(ids, attention_mask=mask).logits
        for i, row in enumerate(rows):
            torch.testing.assert_close(out[i][mask[i]], model(row[None]).logits[0], **TOL)
    assert not out.isnan().any()


@pytest.mark.parametrize(
    "options",
    [{}, {"num_kv_heads": 1}, {"window": 3}, {"window": 5, "full_attention_layers": 1}],
    ids=["gqa", "mqa", "window", "qwen2_layers"],
)
@pytest.mark.parametrize("split", [1, 4, 7])
def test_llama_prefill_then_steps_equals_one_full_pass(rows, options, split):
    # Left-padded prompts (as generation pads them); with a window the cache of each windowed
    # layer is a ring of `window` slots, overrun by both the prompt and the steps.
    model = llama(**options)
    prompt_ids, prompt_mask = padded(rows, "left")
    new = torch.randint(1, 53, (len(rows), 6))
    ids = torch.cat([prompt_ids, new], 1)
    mask = torch.cat([prompt_mask, torch.ones(len(rows), 6, dtype=torch.bool)], 1)
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
    steps, cache = incremental(model, ids, mask, split, cache_len=ids.shape[1] + 2)
    torch.testing.assert_close(steps[mask], full[mask], **TOL)
    window = options.get("window")
    for i, layer in enumerate(cache.layers):
        windowed = window is not None and i >= options.get("full_attention_layers", 0)
        assert layer.k.shape == (4, model.config.num_kv_heads or 4, window if windowed else 15, 4)
    for i, row in enumerate(rows):  # each row continues as the row alone
        with torch.no_grad():
            alone = model(torch.cat([row, new[i]])[None]).logits[0, -6:]
        torch.testing.assert_close(steps[i, -6:], alone, **TOL)


def test_llama_cache_reorder_follows_the_selected_rows(rows):
    model = llama(window=2)
    ids, mask = padded(rows, "left")
    cache = model.init_cache(4, ids.shape[1] + 2)
    nxt = torch.randint(1, 53, (4, 2))
    with torch.no_grad():
        model(ids, attention_mask=mask, cache=cache)
        model(nxt[:, :1], cache=cache)
        index = torch.tensor([3, 1])
        cache.reorder(index)
        got = model(nxt[index, 1:], cache=cache).logits[:, 0]
        full = model(
            torch.cat([ids, nxt], 1)[index],
            attention_mask=torch.cat([mask, torch.ones(4, 2, dtype=torch.bool)], 1)[index],
        ).logits[:, -1]
    torch.testing.assert_close(got, full, **TOL)


def test_llama_weights_follow_the_window(rows):
    model = llama(window=3)
    ids, mask = padded(rows, "left")
    with torch.no_grad():
        weights = model(ids, attention_mask=mask, return_weights=True).weights
    t = ids.shape[1]
    i, j = torch.meshgrid(torch.arange(t), torch.arange(t), indexing="ij")
    for w in weights:
        assert w.shape == (4, 4, t, t)
        assert (w[..., (j > i) | (j <= i - 3)] == 0).all()


def test_llama_in_bfloat16_and_under_autocast(rows):
    model = llama()
    ids, mask = padded(rows, "left")
    with torch.no_grad():
        want = model(ids, attention_mask=mask).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = model(ids, attention_mask=mask).logits
        half = model.to(torch.bfloat16)(ids, attention_mask=mask).logits
    for got in (auto, half):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got[mask].float(), want[mask], atol=0.3, rtol=0.05)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_model_built_on_the_meta_device_runs_a_forward(kind):
    """torch.device("meta") builds a model without memory (to count its shapes and parameters):
    its forward, with padding, with a cache and with the weights, gives meta tensors of the
    shapes a CPU model gives (the checks that read ids, masks and positions failed there)."""
    with torch.device("meta"):
        model = tiny() if kind == "gpt2" else llama(window=3)
        ids = torch.randint(0, 53, (2, 7))
        keep = torch.ones(2, 7, dtype=torch.long)
        out = model(ids, attention_mask=keep, return_weights=True)
        cache = model.init_cache(2, 9)
        prefill = model(ids, attention_mask=keep, cache=cache)
        step = model(ids[:, :1], cache=cache)
    assert out.logits.is_meta and out.logits.shape == (2, 7, 53)
    assert out.weights[0].shape == (2, model.config.num_heads, 7, 7)
    assert prefill.logits.shape == (2, 7, 53) and step.logits.shape == (2, 1, 53)
    assert cache.length == 8 and step.hidden.is_meta


def test_a_numpy_integer_window_is_stored_as_an_int(tmp_path):
    """A numpy integer window (as attention takes it) is the config's int: a model with it
    writes its folder (json has no numpy integers) and reads back the same window."""
    np = pytest.importorskip("numpy")
    model = llama(window=np.int64(3))
    assert type(model.config.window) is int and model.config.window == 3
    assert all(
        layer.self_attn.window == 3 and type(layer.self_attn.window) is int
        for layer in model.blocks.layers
    )
    model.save_pretrained(tmp_path / "m")
    assert GPT.from_pretrained(tmp_path / "m").config.window == 3


def test_a_tokenizer_name_is_refused_with_what_to_pass():
    """A name where the tokenizer object goes was kept, and failed later inside generation
    ("LookupError: unknown encoding", from str.encode)."""
    with pytest.raises(TypeError, match=r"tokenizer: expected a tokenizer object .* got the str "
                       r"'gpt2'; attnkit downloads nothing"):  # fmt: skip
        GPT(GPTConfig(**TINY), tokenizer="gpt2")


def test_init_cache_takes_a_dtype_by_name():
    model = tiny()
    assert model.init_cache(1, 4, dtype="bfloat16").layers[0].k.dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"dtype: expected a floating-point torch.dtype or its "):
        model.init_cache(1, 4, dtype="fp16")
