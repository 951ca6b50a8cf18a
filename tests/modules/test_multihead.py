"""MultiHeadAttention against torch.nn.MultiheadAttention (batch_first=True), same weights."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from attnkit.attention import causal_mask
from attnkit.modules import AttentionOutput, MultiHeadAttention

D, H = 8, 2
TOL = dict(atol=1e-6, rtol=0)


def make_pair(*, kv_dim=None, bias=True, dropout=0.0, seed=0):
    """A torch.nn.MultiheadAttention with random weights and biases, and an attnkit copy."""
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(
        D, H, dropout=dropout, bias=bias, batch_first=True, kdim=kv_dim, vdim=kv_dim
    )
    # torch initialises biases to zero; random ones make a misplaced bias visible.
    for p in ref.parameters():
        nn.init.normal_(p, std=0.3)
    ours = MultiHeadAttention(D, H, dropout=dropout, bias=bias, kv_dim=kv_dim)
    pairs = [(ours.out_proj.weight, ref.out_proj.weight)]
    if kv_dim is None:
        pairs.append((ours.in_proj.weight, ref.in_proj_weight))
    else:
        kv_weight = torch.cat([ref.k_proj_weight, ref.v_proj_weight])  # (2D, kv_dim)
        pairs += [(ours.q_proj.weight, ref.q_proj_weight), (ours.kv_proj.weight, kv_weight)]
    if bias:
        pairs.append((ours.out_proj.bias, ref.out_proj.bias))
        if kv_dim is None:
            pairs.append((ours.in_proj.bias, ref.in_proj_bias))
        else:
            pairs += [
                (ours.q_proj.bias, ref.in_proj_bias[:D]),
                (ours.kv_proj.bias, ref.in_proj_bias[D:]),
            ]
    with torch.no_grad():
        for mine, theirs in pairs:
            mine.copy_(theirs)
    return ours, ref


def key_padding(lengths, t_k):
    """torch's key_padding_mask (True = ignore) and attnkit's key mask (True = may attend)."""
    ignore = torch.arange(t_k)[None, :] >= torch.tensor(lengths)[:, None]  # (B, T_k)
    return ignore, ~ignore[:, None, :]  # (B, T_k), (B, 1, T_k)


def _max_diff(a, b):
    return (a - b).abs().max().item()


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_matches_torch(mode, bias):
    ours, ref = make_pair(bias=bias)
    ours.train(mode == "train")
    ref.train(mode == "train")
    x = torch.randn(3, 5, D)
    expected, _ = ref(x, x, x, need_weights=False)
    torch.testing.assert_close(ours(x).output, expected, **TOL)
    torch.testing.assert_close(ours(x, return_weights=True).output, expected, **TOL)


@pytest.mark.parametrize("cross", [False, True])
def test_return_shape_is_fixed(cross):
    # Like torch.nn.MultiheadAttention, always a pair: weights None unless asked for.
    ours, _ = make_pair()
    x = torch.randn(2, 3, D)
    context = torch.randn(2, 4, D) if cross else None
    plain = ours(x, context)
    assert type(plain) is AttentionOutput and plain.weights is None
    assert plain.output.shape == (2, 3, D)
    out, w = ours(x, context, return_weights=True)
    assert w.shape == (2, H, 3, 4 if cross else 3)
    torch.testing.assert_close(out, plain.output, **TOL)


def test_cross_attention_matches_torch():
    ours, ref = make_pair()
    x, context = torch.randn(2, 3, D), torch.randn(2, 6, D)
    expected, expected_w = ref(x, context, context, average_attn_weights=False)
    out, w = ours(x, context, return_weights=True)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(w, expected_w, **TOL)
    torch.testing.assert_close(ours(x, context).output, expected, **TOL)


@pytest.mark.parametrize("return_weights", [True, False])
def test_key_padding_mask_matches_torch(return_weights):
    ours, ref = make_pair()
    x, context = torch.randn(3, 4, D), torch.randn(3, 6, D)
    ignore, keep = key_padding([6, 2, 4], 6)
    expected, _ = ref(x, context, context, key_padding_mask=ignore)
    res = ours(x, context, keep, return_weights=return_weights)
    torch.testing.assert_close(res.output, expected, **TOL)
    # Changing what sits under the padding must not change anything.
    context2 = context.clone()
    context2[1, 2:] = 100.0
    res2 = ours(x, context2, keep, return_weights=return_weights)
    torch.testing.assert_close(res2.output, expected, **TOL)


@pytest.mark.parametrize("how", ["causal=True", "additive mask", "boolean mask"])
@pytest.mark.parametrize("return_weights", [True, False])
def test_causal_self_attention_matches_torch(how, return_weights):
    ours, ref = make_pair()
    t = 5
    x = torch.randn(2, t, D)
    generated = nn.Transformer.generate_square_subsequent_mask(t)  # 0 / -inf, (T, T)
    expected, _ = ref(x, x, x, attn_mask=generated, is_causal=True, need_weights=False)
    kwargs = {
        "causal=True": dict(causal=True),
        "additive mask": dict(mask=generated),
        "boolean mask": dict(mask=causal_mask(t)),
    }[how]
    res = ours(x, return_weights=return_weights, **kwargs)
    torch.testing.assert_close(res.output, expected, **TOL)


def test_causal_plus_key_padding_matches_torch():
    ours, ref = make_pair()
    x = torch.randn(3, 5, D)
    ignore, keep = key_padding([5, 3, 1], 5)
    generated = nn.Transformer.generate_square_subsequent_mask(5)
    ignore_add = torch.zeros(ignore.shape).masked_fill(ignore, float("-inf"))  # same type
    expected, expected_w = ref(
        x, x, x, attn_mask=generated, key_padding_mask=ignore_add, average_attn_weights=False
    )
    out, w = ours(x, mask=keep, causal=True, return_weights=True)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(w, expected_w, **TOL)
    torch.testing.assert_close(ours(x, mask=keep, causal=True).output, expected, **TOL)


def test_per_head_weights_match_torch():
    ours, ref = make_pair()
    x, context = torch.randn(2, 4, D), torch.randn(2, 7, D)
    ignore, keep = key_padding([7, 3], 7)
    out_t, w_t = ref(
        x, context, context, key_padding_mask=ignore, need_weights=True, average_attn_weights=False
    )
    _, w_avg = ref(x, context, context, key_padding_mask=ignore, need_weights=True)
    out, w = ours(x, context, keep, return_weights=True)
    assert w.shape == (2, H, 4, 7) == w_t.shape
    torch.testing.assert_close(out, out_t, **TOL)
    torch.testing.assert_close(w, w_t, **TOL)
    torch.testing.assert_close(w.mean(dim=1), w_avg, **TOL)


def test_per_head_mask_matches_torch_3d_attn_mask():
    ours, ref = make_pair()
    x = torch.randn(2, 4, D)
    keep = torch.rand(2, H, 4, 4) < 0.6
    keep[..., 0] = True  # at least one key per row (torch would give NaN otherwise)
    # torch: True = not allowed, one (T_q, T_k) mask per (batch, head), shape (B * H, T_q, T_k)
    expected, expected_w = ref(
        x, x, x, attn_mask=~keep.reshape(2 * H, 4, 4), average_attn_weights=False
    )
    out, w = ours(x, mask=keep, return_weights=True)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(w, expected_w, **TOL)
    torch.testing.assert_close(ours(x, mask=keep).output, expected, **TOL)


@pytest.mark.parametrize("return_weights", [True, False])
def test_kv_dim_cross_attention_matches_torch(return_weights):
    ours, ref = make_pair(kv_dim=5)
    assert not hasattr(ours, "in_proj")
    x, context = torch.randn(2, 3, D), torch.randn(2, 6, 5)
    ignore, keep = key_padding([6, 4], 6)
    expected, expected_w = ref(
        x, context, context, key_padding_mask=ignore, average_attn_weights=False
    )
    res = ours(x, context, keep, return_weights=return_weights)
    torch.testing.assert_close(res.output, expected, **TOL)
    if return_weights:
        torch.testing.assert_close(res.weights, expected_w, **TOL)
    else:
        assert res.weights is None


def test_fully_masked_row_gives_zeros_where_torch_gives_nan():
    ours, ref = make_pair()
    x = torch.randn(2, 4, D)
    keep = torch.ones(4, 4, dtype=torch.bool)
    keep[2] = False  # query 2 may attend to nothing
    out_t, w_t = ref(x, x, x, attn_mask=~keep, average_attn_weights=False)
    assert torch.isnan(out_t[:, 2]).all() and torch.isnan(w_t[:, :, 2]).all()  # torch: NaN
    for return_weights in (True, False):
        res = ours(x, mask=keep, return_weights=return_weights)
        out = res.output
        assert torch.isfinite(out).all()
        # The attention output of that row is zero, so the layer gives out_proj(0) = its bias.
        torch.testing.assert_close(out[:, 2], ours.out_proj.bias.expand(2, D), rtol=0, atol=0)
        rows = [0, 1, 3]
        torch.testing.assert_close(out[:, rows], out_t[:, rows], **TOL)
        if return_weights:
            assert (res.weights[:, :, 2] == 0).all()
            torch.testing.assert_close(res.weights[:, :, rows], w_t[:, :, rows], **TOL)


def test_batch_size_one_and_length_one():
    ours, ref = make_pair()
    for t_q, t_k in [(1, 1), (1, 4), (3, 1)]:
        x, context = torch.randn(1, t_q, D), torch.randn(1, t_k, D)
        expected, _ = ref(x, context, context)
        torch.testing.assert_close(ours(x, context).output, expected, **TOL)
    x = torch.randn(1, 1, D)
    torch.testing.assert_close(ours(x, causal=True).output, ref(x, x, x)[0], **TOL)


def test_d_model_not_divisible_by_heads_raises():
    with pytest.raises(ValueError, match=r"d_model=10.*num_heads=3"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match=r"d_model=8.*num_heads=0"):
        MultiHeadAttention(8, 0)


def test_bad_shapes_raise():
    mha = MultiHeadAttention(D, H)
    with pytest.raises(ValueError, match=r"x: expected shape \(B, T, 8\), got \(2, 3, 6\)"):
        mha(torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match=r"x: expected shape \(B, T, 8\), got \(3, 8\)"):
        mha(torch.randn(3, 8))
    with pytest.raises(
        ValueError,
        match=r"context: expected shape \(B_ctx, T_k, 8\) with B_ctx dividing the 2 "
        r"query rows, got \(3, 4, 8\)",
    ):
        mha(torch.randn(2, 3, D), torch.randn(3, 4, D))
    with pytest.raises(ValueError, match=r"dropout: .*got 1\.0"):
        MultiHeadAttention(D, H, dropout=1.0)
    cross = MultiHeadAttention(D, H, kv_dim=5)
    with pytest.raises(ValueError, match=r"context: required.*kv_dim=5.*d_model=8"):
        cross(torch.randn(2, 3, D))


def test_gradcheck_double_module():
    ours, _ = make_pair()
    ours.double()
    x = torch.randn(2, 3, D, dtype=torch.float64, requires_grad=True)
    context = torch.randn(2, 4, D, dtype=torch.float64, requires_grad=True)
    keep = torch.ones(2, 1, 4, dtype=torch.bool)
    keep[1, 0, 1:] = False

    def f(x, context):
        a = ours(x, causal=True).output
        b, w = ours(x, context, keep, return_weights=True)
        return a, b, w

    assert torch.autograd.gradcheck(f, (x, context))


# --------------------------------------------------------------------------- dropout


def test_dropout_in_train_mode_is_random_and_seeded():
    ours, _ = make_pair(dropout=0.5)
    ours.train()
    x = torch.randn(2, 6, D)
    for return_weights in (False, True):

        def run(seed=None, return_weights=return_weights):
            if seed is not None:
                torch.manual_seed(seed)
            return ours(x, return_weights=return_weights).output

        assert not torch.equal(run(), run())
        torch.testing.assert_close(run(seed=3), run(seed=3), rtol=0, atol=0)


@pytest.mark.parametrize("return_weights", [True, False])
def test_attention_dropout_is_off_in_eval_mode(return_weights):
    with_dropout, ref = make_pair(dropout=0.5)
    without, _ = make_pair(dropout=0.0)
    with_dropout.eval()
    ref.eval()
    x = torch.randn(2, 6, D)
    a = with_dropout(x, return_weights=return_weights)
    b = with_dropout(x, return_weights=return_weights)
    c = without(x, return_weights=return_weights)
    a, b, c = (r.output for r in (a, b, c))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, c, **TOL)
    torch.testing.assert_close(a, ref(x, x, x)[0], **TOL)


def test_context_rows_shared_by_consecutive_query_rows():
    # Beam search: the hypotheses of one sentence are consecutive rows sharing its memory row.
    # The result equals cross-attention to the memory repeated for every row.
    mha = MultiHeadAttention(D, H).eval()
    x, context = torch.randn(6, 2, D), torch.randn(2, 5, D)  # 3 query rows per context row
    key_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])[:, None, :]
    out, w = mha(x, context, key_mask, return_weights=True)
    rep_out, rep_w = mha(
        x, context.repeat_interleave(3, 0), key_mask.repeat_interleave(3, 0), return_weights=True
    )
    torch.testing.assert_close(out, rep_out, atol=1e-6, rtol=0)
    torch.testing.assert_close(w, rep_w, atol=1e-6, rtol=0)
    torch.testing.assert_close(mha(x, context, key_mask).output, rep_out, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="causal"):
        mha(x, context, causal=True)


# --------------------------------------------------------------------------- GQA, RoPE, window
# References: Hugging Face's LlamaAttention and Qwen2Attention (eager), given Hugging Face's own
# rotary angles and masks made by its masking_utils rules.


def _hf_attention(kind: str, *, heads=4, kv_heads=2, d=32, attention_bias=False, seed=0):
    import transformers
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention

    common = dict(
        hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 100.0},
    )  # fmt: skip
    if kind == "llama":
        config = transformers.LlamaConfig(**common, attention_bias=attention_bias)
        cls = LlamaAttention
    else:
        config = transformers.Qwen2Config(**common)
        cls = Qwen2Attention
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    hf = cls(config, 0).eval()
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return hf, LlamaRotaryEmbedding(config)


def _ours_like(hf, *, qkv_bias, bias, window=None):
    from attnkit.modules import RotaryEmbedding

    d, heads = hf.config.hidden_size, hf.config.num_attention_heads
    kv_heads = hf.config.num_key_value_heads
    ours = MultiHeadAttention(
        d, heads, num_kv_heads=kv_heads, bias=bias, qkv_bias=qkv_bias, window=window
    ).eval()
    with torch.no_grad():
        ours.in_proj.weight.copy_(torch.cat([hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight]))
        if qkv_bias:
            ours.in_proj.bias.copy_(torch.cat([hf.q_proj.bias, hf.k_proj.bias, hf.v_proj.bias]))
        ours.out_proj.weight.copy_(hf.o_proj.weight)
        if bias:
            ours.out_proj.bias.copy_(hf.o_proj.bias)
    return ours, RotaryEmbedding(d // heads, base=100.0)


def _hf_mask(keep, window=None):
    """Hugging Face's mask rules (masking_utils) evaluated on every (query, key) slot: an
    additive (B, 1, T, T) mask, and our boolean key mask (B, 1, T)."""
    from transformers.masking_utils import (
        and_masks,
        causal_mask_function,
        padding_mask_function,
        sliding_window_causal_mask_function,
    )

    rule = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    rule = and_masks(rule, padding_mask_function(keep))
    b, t = keep.shape
    rows, slots = torch.arange(b)[:, None, None], torch.arange(t)
    allowed = rule(rows, torch.tensor(0), slots[None, :, None], slots[None, None, :])
    allowed = allowed.expand(b, t, t)[:, None]  # (B, 1, T, T)
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return additive, keep[:, None, :]


# Outputs of a few units: float32 rounding of two orders of summation.
TOL_HF = dict(atol=1e-5, rtol=1e-5)
LEFT_PADDED = torch.tensor([[True] * 9, [False, False, False] + [True] * 6])


def _positions(keep):
    return (keep.long().cumsum(-1) - 1).clamp(min=0)  # Hugging Face's cumsum(mask) - 1


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize(
    "kind,bias,qkv_bias", [("llama", False, False), ("llama", True, True), ("qwen2", False, True)]
)
@pytest.mark.parametrize("window", [None, 3])
def test_gqa_with_rope_equals_hugging_face_attention(kv_heads, kind, bias, qkv_bias, window):
    hf, hf_rope = _hf_attention(kind, kv_heads=kv_heads, attention_bias=bias)
    ours, rope = _ours_like(hf, qkv_bias=qkv_bias, bias=bias, window=window)
    assert ours.in_proj.weight.shape == (32 + 2 * kv_heads * 8, 32)
    keep = LEFT_PADDED
    positions = _positions(keep)
    x = torch.randn(2, 9, 32)
    additive, key_mask = _hf_mask(keep, window)
    with torch.no_grad():
        want, _ = hf(x, position_embeddings=hf_rope(x, positions), attention_mask=additive)
        got = ours(x, mask=key_mask, causal=True, rotary=rope(positions)).output
        _, weights = ours(
            x, mask=key_mask, causal=True, rotary=rope(positions), return_weights=True
        )
    torch.testing.assert_close(got[keep], want[keep], **TOL_HF)
    assert weights.shape == (2, 4, 9, 9)
    if window is not None:  # no query row looks further back than the window
        i, j = torch.meshgrid(torch.arange(9), torch.arange(9), indexing="ij")
        assert (weights[..., (j <= i - window)] == 0).all()


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("window", [None, 3, 5])
@pytest.mark.parametrize("prefill", [1, 4, 7])
def test_incremental_decoding_equals_the_full_pass(kv_heads, window, prefill):
    # Prefill some slots, then one token at a time, on a cache that holds the key/value heads
    # only and, with a window, at most `window` slots (a ring buffer); padded rows included.
    hf, _ = _hf_attention("llama", kv_heads=kv_heads)
    ours, rope = _ours_like(hf, qkv_bias=False, bias=False, window=window)
    keep = LEFT_PADDED
    positions = _positions(keep)
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        full = ours(x, mask=keep[:, None], causal=True, rotary=rope(positions)).output
        cache = ours.init_cache(2, 9)
        capacity = 9 if window is None else min(9, window)
        assert cache.k.shape == cache.v.shape == (2, kv_heads, capacity, 8)
        steps = [(0, prefill)] + [(t, t + 1) for t in range(prefill, 9)]
        parts = []
        for a, b in steps:
            out = ours(
                x[:, a:b],
                mask=keep[:, None, :b],
                causal=True,
                cache=cache,
                rotary=rope(positions[:, a:b]),
            )
            parts.append(out.output)
    torch.testing.assert_close(torch.cat(parts, 1)[keep], full[keep], **TOL_HF)


def test_the_cache_of_grouped_query_attention_is_smaller():
    full = MultiHeadAttention(64, 8).init_cache(1, 4096)
    grouped = MultiHeadAttention(64, 8, num_kv_heads=2).init_cache(1, 4096)
    size = lambda c: c.k.numel() * c.k.element_size() + c.v.numel() * c.v.element_size()  # noqa: E731
    assert size(grouped) * 4 == size(full)
    windowed = MultiHeadAttention(64, 8, num_kv_heads=2, window=256).init_cache(1, 4096)
    assert size(windowed) * 16 == size(grouped) and windowed.max_len == 4096


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            dict(num_kv_heads=3),
            r"num_heads must be a multiple of num_kv_heads.*num_heads=4, num_kv_heads=3",
        ),
        (dict(num_kv_heads=8), r"num_kv_heads=8"),
        (dict(num_kv_heads=0), r"num_kv_heads=0"),
        (dict(window=0), r"window: expected an integer >= 1 or None, got 0"),
        (dict(window=2.5), r"window: expected an integer >= 1 or None, got 2\.5"),
    ],
)
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(16, 4, **kwargs)


def test_window_and_rotary_are_for_causal_self_attention():
    from attnkit.modules import RotaryEmbedding

    x = torch.randn(2, 3, 16)
    windowed = MultiHeadAttention(16, 4, window=2)
    with pytest.raises(ValueError, match=r"window=2: a sliding window is causal"):
        windowed(x)
    with pytest.raises(ValueError, match=r"window, rotary: options of self-attention"):
        windowed(x, torch.randn(2, 5, 16))
    rope = RotaryEmbedding(4)
    with pytest.raises(ValueError, match=r"rotary: angles for 2 positions, but x has 3"):
        MultiHeadAttention(16, 4)(x, rotary=rope(torch.arange(2)))


def test_the_split_for_rotary_heads_equals_the_plain_split():
    # Angle 0 (every position 0) rotates nothing: the (B, T, H + 2 H_kv, hd) split taken with
    # rotary gives the plain path's numbers exactly, for the same weights.
    from attnkit.modules import RotaryEmbedding

    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    zero = RotaryEmbedding(4)(torch.zeros(2, 5, dtype=torch.long))
    with torch.no_grad():
        plain = mha(x, causal=True).output
        rotated = mha(x, causal=True, rotary=zero).output
    torch.testing.assert_close(rotated, plain, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # before: torch's "empty(): argument 'size'", "'<=' not supported", negative dimension
        (dict(d_model=32.0, num_heads=4), r"d_model: expected a positive integer, got 32.0"),
        (dict(d_model="32", num_heads=4), r"d_model: expected a positive integer, got '32'"),
        (dict(d_model=32, num_heads=4, dropout="0.1"), r"dropout: expected a probability"),
        (dict(d_model=32, num_heads=4, kv_dim=-3), r"kv_dim: expected a positive integer or"),
        (dict(d_model=32, num_heads=4, kv_dim=0), r"kv_dim: expected a positive integer or"),
    ],
)
def test_bad_constructor_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)


def test_inputs_of_another_dtype_than_the_weights_are_named():
    """Before: torch's "mat1 and mat2 must have the same dtype" from inside a linear layer."""
    mha = MultiHeadAttention(16, 4, kv_dim=8)
    x = torch.randn(2, 3, 16)
    with pytest.raises(TypeError, match=r"x: dtype torch.float64 differs from the weights'"):
        mha(x.double())
    with pytest.raises(TypeError, match=r"context: dtype torch.float64 differs from the"):
        mha(x, torch.randn(2, 5, 8, dtype=torch.float64))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts for the projections
        assert mha(x.bfloat16(), torch.randn(2, 5, 8)).output.shape == (2, 3, 16)


@pytest.mark.parametrize("window", [None, 3])
def test_a_call_that_fails_after_the_cache_update_takes_it_back(window):
    """A mask of the wrong shape fails in the attention, after the cache took the new keys:
    the cache was left longer, and the retry with the right mask saw those keys twice (or ran
    past max_len). Every chunk here fails once, then runs, and the outputs are the full
    pass's; with a window the chunks overrun the ring (which rewrites all of it) and a single
    step overwrites its oldest slot."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, window=window).eval()
    x = torch.randn(2, 9, 16)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, :2] = False  # a left-padded row
    with torch.no_grad():
        full = mha(x, mask=keep[:, None], causal=True).output
        cache = mha.init_cache(2, 9)
        parts = []
        for a, b in [(0, 4), (4, 6), (6, 7), (7, 9)]:
            wrong = torch.ones(2, 1, b + 1, dtype=torch.bool)  # one key too many
            with pytest.raises(ValueError, match=r"mask: shape"):
                mha(x[:, a:b], mask=wrong, causal=True, cache=cache)
            assert cache.length == a
            parts.append(mha(x[:, a:b], mask=keep[:, None, :b], causal=True, cache=cache).output)
    torch.testing.assert_close(torch.cat(parts, 1), full, **TOL)


def test_a_cross_attention_call_that_fails_leaves_its_cache_empty():
    """The first call fills a cross-attention cache; when it then fails, the retry (here with
    the context the caller meant) projects its context instead of reusing the failed call's."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    x, meant, other = torch.randn(2, 3, 16), torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    cache = mha.init_cache(2, 5)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"mask: shape"):
            mha(x, other, mask=torch.ones(2, 1, 6, dtype=torch.bool), cache=cache)
        assert cache.length == 0
        out = mha(x, meant, cache=cache).output
        torch.testing.assert_close(out, mha(x, meant).output, **TOL)


def test_a_module_built_on_the_meta_device_gives_meta_outputs():
    """Built under torch.device("meta") (weights without memory), self-attention (with a cache,
    a window and grouped heads) and cross-attention give meta outputs of the shapes a CPU
    module gives; the data-dependent checks of the attention failed on them."""
    with torch.device("meta"):
        mha = MultiHeadAttention(16, 4, num_kv_heads=2, window=3)
        cross = MultiHeadAttention(16, 4, kv_dim=8)
        x, context = torch.randn(2, 5, 16), torch.randn(2, 7, 8)
        keep = torch.ones(2, 1, 5, dtype=torch.bool)
        out = mha(x, mask=keep, causal=True)
        cache = mha.init_cache(2, 6)
        prefill = mha(x, mask=keep, causal=True, cache=cache)
        step = mha(x[:, :1], causal=True, cache=cache)
        crossed = cross(x, context, return_weights=True)
    assert out.output.shape == prefill.output.shape == (2, 5, 16)
    assert step.output.shape == (2, 1, 16) and cache.length == 6
    assert crossed.output.shape == (2, 5, 16) and crossed.weights.shape == (2, 4, 5, 7)
    assert all(t.is_meta for t in (out.output, step.output, crossed.output, crossed.weights))


def test_a_numpy_integer_window_is_taken_and_stored_as_an_int():
    np = pytest.importorskip("numpy")
    torch.manual_seed(0)
    plain = MultiHeadAttention(16, 4, window=3)
    numpy_window = MultiHeadAttention(16, 4, window=np.int64(3))
    numpy_window.load_state_dict(plain.state_dict())
    assert type(numpy_window.window) is int and numpy_window.window == 3
    assert numpy_window.init_cache(1, 8).capacity == 3
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(
            numpy_window(x, causal=True).output, plain(x, causal=True).output, atol=0, rtol=0
        )


def test_a_key_padding_mask_given_as_b_by_t_gets_the_shape_to_use():
    """torch.nn's key_padding_mask form (B, T_k) is not a (T_q, T_k) mask: the error says how
    to give it, and the form it names gives the masked result."""
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(3, 5, 16)
    keys = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "mask: shape (3, 5) does not broadcast to (..., T_q, T_k) = (3, 4, 5, 5) (a key "
            "mask (B, T_k) is given as (B, 1, 1, T_k): mask[:, None, None, :])"
        ),
    ):
        mha(x, mask=keys)
    with torch.no_grad():
        got = mha(x, mask=keys[:, None, None, :]).output
        row = mha(x[1:2, :, :], x[1:2, :3, :]).output  # sentence 1 attends to its 3 real keys
    torch.testing.assert_close(got[1:2], row)


def test_a_bad_3d_mask_is_named_by_the_shape_given():
    """Before: 'mask: shape (2, 1, 1, 5) ...', the shape made from the caller's (2, 1, 5)."""
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)
    with pytest.raises(
        ValueError,
        match=r"^mask: shape \(2, 1, 5\) \(a \(B, T_q, T_k\) mask, read as \(2, 1, 1, 5\) for "
        r"every head\) does not broadcast to \(\.\.\., T_q, T_k\) = \(2, 4, 6, 6\)$",
    ):
        mha(x, mask=torch.ones(2, 1, 5, dtype=torch.bool))
