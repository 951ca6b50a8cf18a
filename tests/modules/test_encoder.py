"""EncoderLayer / Encoder against torch.nn.TransformerEncoderLayer / TransformerEncoder, and the
Residual block they are made of."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnkit.modules import Encoder, EncoderLayer, EncoderOutput, LayerOutput, Residual

D, H, FF = 16, 4, 32
TOL = dict(atol=1e-5, rtol=0)


def _mha_pairs(ours, ref):
    return [
        (ours.in_proj.weight, ref.in_proj_weight),
        (ours.in_proj.bias, ref.in_proj_bias),
        (ours.out_proj.weight, ref.out_proj.weight),
        (ours.out_proj.bias, ref.out_proj.bias),
    ]


def _linear_pairs(ours, ref):
    return [(ours.weight, ref.weight), (ours.bias, ref.bias)]


def encoder_layer_pairs(ours: EncoderLayer, ref: nn.TransformerEncoderLayer):
    """(attnkit parameter, torch parameter) for every parameter of an encoder layer."""
    return [
        *_mha_pairs(ours.self_attn, ref.self_attn),
        *_linear_pairs(ours.ffn.linear1, ref.linear1),
        *_linear_pairs(ours.ffn.linear2, ref.linear2),
        *_linear_pairs(ours.attn_block.norm, ref.norm1),
        *_linear_pairs(ours.ffn_block.norm, ref.norm2),
    ]


def load_torch_weights(ours: nn.Module, ref: nn.Module, pairs) -> None:
    """Copy torch's weights into attnkit's; every parameter on both sides must be mapped."""
    assert len(pairs) == len(list(ours.parameters())) == len(list(ref.parameters()))
    with torch.no_grad():
        for mine, theirs in pairs:
            assert mine.shape == theirs.shape
            mine.copy_(theirs)


def _perturb(module: nn.Module) -> None:
    # Random biases and LayerNorm affine parameters (torch starts them at 0 and 1), and
    # different weights per layer of a stack, so that any mix-up in the mapping shows.
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn_like(p))


def make_layer_pair(norm_first, activation, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    kw = dict(dropout=dropout, activation=activation, norm_first=norm_first)
    ref = nn.TransformerEncoderLayer(D, H, FF, batch_first=True, **kw)
    _perturb(ref)
    ours = EncoderLayer(D, H, FF, **kw)
    load_torch_weights(ours, ref, encoder_layer_pairs(ours, ref))
    return ours, ref


def make_stack_pair(norm_first, activation, seed):
    """A two-layer torch.nn.TransformerEncoder with random parameters and an attnkit copy."""
    torch.manual_seed(seed)
    kw = dict(dropout=0.0, activation=activation, norm_first=norm_first)
    ref = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(D, H, FF, batch_first=True, **kw),
        num_layers=2,
        norm=nn.LayerNorm(D) if norm_first else None,
        enable_nested_tensor=False,
    )
    _perturb(ref)
    ours = Encoder(2, final_norm=norm_first, d_model=D, num_heads=H, d_ff=FF, **kw)
    pairs = [
        p for a, b in zip(ours.layers, ref.layers, strict=True) for p in encoder_layer_pairs(a, b)
    ]
    if norm_first:
        pairs += _linear_pairs(ours.norm, ref.norm)
    load_torch_weights(ours, ref, pairs)
    return ours, ref


def source_padding(lengths, s):
    """torch's src_key_padding_mask (True = pad) and attnkit's key mask (True = real)."""
    pad = torch.arange(s)[None, :] >= torch.tensor(lengths)[:, None]  # (B, S)
    return pad, ~pad[:, None, :]  # (B, S), (B, 1, S)


def _set_mode(mode, *modules):
    for m in modules:
        m.train(mode == "train")
    # eval also runs under no_grad, where torch takes its fused "fast path" encoder kernels
    return torch.no_grad() if mode == "eval" else contextlib.nullcontext()


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_torch(norm_first, activation, mode):
    ours, ref = make_layer_pair(norm_first, activation)
    x = torch.randn(3, 5, D)
    pad, keep = source_padding([5, 3, 1], 5)
    with _set_mode(mode, ours, ref):
        expected = ref(x, src_key_padding_mask=pad)
        out = ours(x, keep).hidden
        out_w, _ = ours(x, keep, return_weights=True)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(out_w, expected, **TOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_without_mask_matches_torch(norm_first):
    ours, ref = make_layer_pair(norm_first, "relu")
    x = torch.randn(2, 4, D)
    torch.testing.assert_close(ours(x).hidden, ref(x), **TOL)
    x1 = torch.randn(1, 1, D)  # batch size 1, length 1
    torch.testing.assert_close(ours(x1).hidden, ref(x1), **TOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_weights_are_torch_self_attention_weights(norm_first):
    ours, ref = make_layer_pair(norm_first, "gelu")
    x = torch.randn(2, 5, D)
    pad, keep = source_padding([5, 2], 5)
    _, w = ours(x, keep, return_weights=True)
    h = ref.norm1(x) if norm_first else x  # what the attention sublayer sees
    _, expected_w = ref.self_attn(h, h, h, key_padding_mask=pad, average_attn_weights=False)
    assert w.shape == (2, H, 5, 5)
    torch.testing.assert_close(w, expected_w, **TOL)
    assert (w[1, :, :, 2:] == 0).all()


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_matches_torch(norm_first, activation, mode):
    ours, ref = make_stack_pair(norm_first, activation, seed=1)
    x = torch.randn(3, 6, D)
    pad, keep = source_padding([6, 4, 2], 6)
    with _set_mode(mode, ours, ref):
        expected = ref(x, src_key_padding_mask=pad)
        out = ours(x, keep).hidden
        out_w, weights = ours(x, keep, return_weights=True)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(out_w, expected, **TOL)
    assert len(weights) == 2 and all(w.shape == (3, H, 6, 6) for w in weights)


def test_dropout_in_train_mode_is_random_and_seeded_and_off_in_eval():
    ours, _ = make_layer_pair(False, "relu", dropout=0.3)
    plain, ref = make_layer_pair(False, "relu", dropout=0.0)
    x = torch.randn(2, 5, D)
    ours.train()

    def run(seed=None):
        if seed is not None:
            torch.manual_seed(seed)
        return ours(x).hidden

    assert not torch.equal(run(), run())
    torch.testing.assert_close(run(seed=5), run(seed=5), rtol=0, atol=0)
    ours.eval()
    torch.testing.assert_close(ours(x).hidden, plain(x).hidden, **TOL)
    torch.testing.assert_close(ours(x).hidden, ref(x), **TOL)


# --------------------------------------------------------------------------- Residual


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_formula(norm_first):
    torch.manual_seed(0)
    block = Residual(D, dropout=0.0, norm_first=norm_first, eps=1e-6)
    _perturb(block)
    f = nn.Linear(D, D)
    x = torch.randn(2, 3, D)
    w, b = block.norm.weight, block.norm.bias
    if norm_first:  # x + f(LN(x))
        expected = x + f(F.layer_norm(x, (D,), w, b, eps=1e-6))
    else:  # LN(x + f(x))
        expected = F.layer_norm(x + f(x), (D,), w, b, eps=1e-6)
    torch.testing.assert_close(block(x, f), expected)
    # The two halves that attention sublayers use give the same.
    torch.testing.assert_close(block.post(x, f(block.pre(x))), expected)


def test_residual_sublayer_must_return_a_tensor():
    block = Residual(D, dropout=0.0, norm_first=True, eps=1e-5)
    x = torch.randn(2, 3, D)
    with pytest.raises(TypeError, match=r"sublayer: expected it to return a Tensor, got tuple"):
        block(x, lambda h: (h, None))


def test_residual_dropout_acts_on_the_sublayer_output_only():
    block = Residual(D, dropout=0.5, norm_first=True, eps=1e-5)
    x = torch.randn(4, 8, D)
    y = block(x, lambda h: torch.zeros_like(h))
    torch.testing.assert_close(y, x)  # dropout of a zero update leaves the residual path


# --------------------------------------------------------------------------- causal (GPT blocks)


def _causal_reference(t):
    return nn.Transformer.generate_square_subsequent_mask(t)  # 0 / -inf, (T, T)


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_causal_encoder_layer_matches_torch_is_causal(norm_first, mode):
    ours, ref = make_layer_pair(norm_first, "gelu")
    x = torch.randn(3, 5, D)
    pad, keep = source_padding([5, 4, 2], 5)
    pad_add = torch.zeros(pad.shape).masked_fill(pad, float("-inf"))  # torch wants one mask type
    with _set_mode(mode, ours, ref):
        expected = ref(x, src_mask=_causal_reference(5), is_causal=True)
        expected_pad = ref(
            x, src_mask=_causal_reference(5), src_key_padding_mask=pad_add, is_causal=True
        )
        out, weights = ours(x, causal=True)
        out_pad = ours(x, keep, causal=True).hidden
    assert weights is None
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(out_pad, expected_pad, **TOL)
    # Not the same as non-causal attention, so the flag is not ignored.
    assert not torch.allclose(out, ours(x).hidden, atol=1e-3)


def test_causal_encoder_layer_weights_are_lower_triangular_and_match_torch():
    ours, ref = make_layer_pair(True, "relu")
    x = torch.randn(2, 4, D)
    _, w = ours(x, causal=True, return_weights=True)
    h = ref.norm1(x)
    _, expected_w = ref.self_attn(
        h, h, h, attn_mask=_causal_reference(4), average_attn_weights=False
    )
    torch.testing.assert_close(w, expected_w, **TOL)
    assert (w.triu(diagonal=1) == 0).all()


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_with_cache_equals_full_causal_pass(norm_first):
    ours, ref = make_layer_pair(norm_first, "relu")
    ours.eval()
    x = torch.randn(2, 6, D)
    with torch.no_grad():
        full = ref(x, src_mask=_causal_reference(6), is_causal=True)
        cache = ours.self_attn.init_cache(2, 6)
        prefill = ours(x[:, :3], causal=True, cache=cache).hidden  # the gpt-fast prefill
        steps = [ours(x[:, t : t + 1], causal=True, cache=cache) for t in range(3, 6)]
    assert cache.length == 6
    got = torch.cat([prefill, *(s.hidden for s in steps)], dim=1)
    torch.testing.assert_close(got, full, **TOL)
    with pytest.raises(ValueError, match=r"max_len=6"):
        ours(x[:, :1], causal=True, cache=cache)


@pytest.mark.parametrize("norm_first", [False, True])
def test_causal_encoder_stack_with_caches_matches_torch(norm_first):
    ours, ref = make_stack_pair(norm_first, "gelu", seed=3)
    ours.eval()
    ref.eval()
    x = torch.randn(2, 5, D)
    with torch.no_grad():
        expected = ref(x, mask=_causal_reference(5), is_causal=True)
        full = ours(x, causal=True)
        full_w = ours(x, causal=True, return_weights=True)
        caches = ours.init_cache(2, 5)
        steps = [ours(x[:, t : t + 1], causal=True, caches=caches).hidden for t in range(5)]
    assert full.weights is None
    assert len(full_w.weights) == 2 and all(w.shape == (2, H, 5, 5) for w in full_w.weights)
    torch.testing.assert_close(full.hidden, expected, **TOL)
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, **TOL)
    assert len(caches) == 2 and all(c.length == 5 and c.max_len == 5 for c in caches)
    with pytest.raises(ValueError, match=r"caches: expected one KVCache per layer \(2\), got 1"):
        ours(x, causal=True, caches=caches[:1])


def test_encoder_returns_a_fixed_shape():
    torch.manual_seed(0)
    enc = Encoder(2, d_model=D, num_heads=H, d_ff=FF, dropout=0.0)
    x = torch.randn(2, 3, D)
    plain = enc(x)
    assert type(plain) is EncoderOutput and plain.weights is None
    layer_out = enc.layers[0](x)
    assert type(layer_out) is LayerOutput and layer_out.weights is None
    hidden, weights = enc(x, return_weights=True)
    torch.testing.assert_close(hidden, plain.hidden, **TOL)
    assert len(weights) == 2


def test_llama_options_reach_every_layer():
    from attnkit.modules import RMSNorm

    enc = Encoder(
        3, final_norm=True, d_model=16, num_heads=4, d_ff=24, norm="rms", gated=True,
        activation="silu", num_kv_heads=2, qkv_bias=True, bias=False, window=4,
        full_attention_layers=1, norm_first=True,
    )  # fmt: skip
    assert isinstance(enc.norm, RMSNorm)
    assert [layer.self_attn.window for layer in enc.layers] == [None, 4, 4]
    layer = enc.layers[0]
    assert isinstance(layer.attn_block.norm, RMSNorm) and isinstance(layer.ffn_block.norm, RMSNorm)
    assert layer.self_attn.in_proj.weight.shape == (16 + 2 * 2 * 4, 16)
    assert layer.self_attn.in_proj.bias is not None and layer.self_attn.out_proj.bias is None
    assert layer.ffn.gated and layer.ffn.linear1.weight.shape == (48, 16)
    assert layer.ffn.linear1.bias is None
    caches = enc.init_cache(2, 10)
    assert [c.capacity for c in caches] == [10, 4, 4] and caches[0].k.shape[1] == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_layers=-1), r"num_layers: expected an integer >= 0, got -1"),  # was identity
        (dict(num_layers=2.0), r"num_layers: expected an integer >= 0, got 2.0"),
        (  # accepted before, and meaningless without a window
            dict(num_layers=2, full_attention_layers=1),
            r"full_attention_layers=1: only with a window",
        ),
        (dict(num_layers=2, layer_norm_eps=-1.0), r"eps: expected a finite number >= 0"),  # NaN
    ],
)
def test_bad_stack_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Encoder(**kwargs, d_model=8, num_heads=2, d_ff=16)
