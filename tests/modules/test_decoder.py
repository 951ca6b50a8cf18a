"""DecoderLayer / Decoder against torch.nn.TransformerDecoderLayer / TransformerDecoder."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from attnkit.modules import Decoder, DecoderLayer, DecoderLayerOutput, DecoderOutput

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


def decoder_layer_pairs(ours: DecoderLayer, ref: nn.TransformerDecoderLayer):
    """(attnkit parameter, torch parameter) for every parameter of a decoder layer."""
    return [
        *_mha_pairs(ours.self_attn, ref.self_attn),
        *_mha_pairs(ours.cross_attn, ref.multihead_attn),
        *_linear_pairs(ours.ffn.linear1, ref.linear1),
        *_linear_pairs(ours.ffn.linear2, ref.linear2),
        *_linear_pairs(ours.self_block.norm, ref.norm1),
        *_linear_pairs(ours.cross_block.norm, ref.norm2),
        *_linear_pairs(ours.ffn_block.norm, ref.norm3),
    ]


def load_torch_weights(ours: nn.Module, ref: nn.Module, pairs) -> None:
    """Copy torch's weights into attnkit's; every parameter on both sides must be mapped."""
    assert len(pairs) == len(list(ours.parameters())) == len(list(ref.parameters()))
    with torch.no_grad():
        for mine, theirs in pairs:
            assert mine.shape == theirs.shape
            mine.copy_(theirs)


def _perturb(module: nn.Module) -> None:
    # Random biases and LayerNorm affine parameters, different weights per layer of a stack.
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn_like(p))


def make_layer_pair(norm_first, activation, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    kw = dict(dropout=dropout, activation=activation, norm_first=norm_first)
    ref = nn.TransformerDecoderLayer(D, H, FF, batch_first=True, **kw)
    _perturb(ref)
    ours = DecoderLayer(D, H, FF, **kw)
    load_torch_weights(ours, ref, decoder_layer_pairs(ours, ref))
    return ours, ref


def padding(lengths, t):
    """torch's key_padding_mask (True = pad) and attnkit's key mask (True = real)."""
    pad = torch.arange(t)[None, :] >= torch.tensor(lengths)[:, None]  # (B, T)
    return pad, ~pad[:, None, :]  # (B, T), (B, 1, T)


def _set_mode(mode, *modules):
    for m in modules:
        m.train(mode == "train")
    return torch.no_grad() if mode == "eval" else contextlib.nullcontext()


def _inputs(b=3, t=4, s=5, src_lengths=(5, 3, 1)):
    tgt, memory = torch.randn(b, t, D), torch.randn(b, s, D)
    return tgt, memory, *padding(list(src_lengths), s)


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(norm_first, activation, mode):
    ours, ref = make_layer_pair(norm_first, activation)
    tgt, memory, src_pad, src_keep = _inputs()
    causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
    with _set_mode(mode, ours, ref):
        expected = ref(
            tgt, memory, tgt_mask=causal, memory_key_padding_mask=src_pad, tgt_is_causal=True
        )
        out = ours(tgt, memory, memory_mask=src_keep).hidden  # causal by default
        out_w, self_w, cross_w = ours(tgt, memory, memory_mask=src_keep, return_weights=True)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(out_w, expected, **TOL)
    assert self_w.shape == (3, H, 4, 4) and cross_w.shape == (3, H, 4, 5)
    assert (self_w.triu(diagonal=1) == 0).all()  # no look-ahead
    assert (cross_w[2, ..., 1:] == 0).all()  # source 2 has one real token


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_with_target_padding_matches_torch(norm_first):
    ours, ref = make_layer_pair(norm_first, "relu")
    tgt, memory, src_pad, src_keep = _inputs()
    tgt_pad, tgt_keep = padding([4, 2, 3], 4)
    causal = nn.Transformer.generate_square_subsequent_mask(4)
    expected = ref(
        tgt,
        memory,
        tgt_mask=causal,
        tgt_key_padding_mask=tgt_pad.float().masked_fill(tgt_pad, float("-inf")),
        memory_key_padding_mask=src_pad.float().masked_fill(src_pad, float("-inf")),
    )
    out = ours(tgt, memory, self_mask=tgt_keep, memory_mask=src_keep).hidden
    torch.testing.assert_close(out, expected, **TOL)


def test_decoder_layer_without_causal_matches_torch():
    ours, ref = make_layer_pair(True, "gelu")
    tgt, memory, src_pad, src_keep = _inputs()
    expected = ref(tgt, memory, memory_key_padding_mask=src_pad)
    out = ours(tgt, memory, None, src_keep, causal=False).hidden
    torch.testing.assert_close(out, expected, **TOL)


def test_decoder_layer_batch_size_one_length_one():
    ours, ref = make_layer_pair(False, "relu")
    tgt, memory = torch.randn(1, 1, D), torch.randn(1, 1, D)
    torch.testing.assert_close(ours(tgt, memory).hidden, ref(tgt, memory), **TOL)


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_stack_matches_torch(norm_first, activation, mode):
    torch.manual_seed(2)
    kw = dict(dropout=0.0, activation=activation, norm_first=norm_first)
    ref = nn.TransformerDecoder(
        nn.TransformerDecoderLayer(D, H, FF, batch_first=True, **kw),
        num_layers=2,
        norm=nn.LayerNorm(D) if norm_first else None,
    )
    _perturb(ref)
    ours = Decoder(2, final_norm=norm_first, d_model=D, num_heads=H, d_ff=FF, **kw)
    pairs = [
        p for a, b in zip(ours.layers, ref.layers, strict=True) for p in decoder_layer_pairs(a, b)
    ]
    if norm_first:
        pairs += _linear_pairs(ours.norm, ref.norm)
    load_torch_weights(ours, ref, pairs)

    tgt, memory, src_pad, src_keep = _inputs(t=5, s=6, src_lengths=(6, 4, 2))
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    with _set_mode(mode, ours, ref):
        expected = ref(
            tgt, memory, tgt_mask=causal, memory_key_padding_mask=src_pad, tgt_is_causal=True
        )
        out = ours(tgt, memory, memory_mask=src_keep).hidden
        out_w, self_ws, cross_ws = ours(tgt, memory, memory_mask=src_keep, return_weights=True)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(out_w, expected, **TOL)
    assert len(self_ws) == len(cross_ws) == 2


def test_dropout_in_train_mode_is_random_and_seeded_and_off_in_eval():
    ours, _ = make_layer_pair(True, "relu", dropout=0.3)
    plain, ref = make_layer_pair(True, "relu", dropout=0.0)
    tgt, memory, _, _ = _inputs()
    ours.train()

    def run(seed=None):
        if seed is not None:
            torch.manual_seed(seed)
        return ours(tgt, memory).hidden

    assert not torch.equal(run(), run())
    torch.testing.assert_close(run(seed=5), run(seed=5), rtol=0, atol=0)
    ours.eval()
    torch.testing.assert_close(ours(tgt, memory).hidden, plain(tgt, memory).hidden, **TOL)
    causal = nn.Transformer.generate_square_subsequent_mask(4)
    expected = ref(tgt, memory, tgt_mask=causal)
    torch.testing.assert_close(ours(tgt, memory).hidden, expected, **TOL)


def test_decoder_returns_a_fixed_shape():
    torch.manual_seed(0)
    dec = Decoder(2, d_model=D, num_heads=H, d_ff=FF, dropout=0.0)
    tgt, memory, _, src_keep = _inputs()
    plain = dec(tgt, memory, memory_mask=src_keep)
    assert type(plain) is DecoderOutput
    assert plain.self_weights is None and plain.cross_weights is None
    layer_out = dec.layers[0](tgt, memory, memory_mask=src_keep)
    assert type(layer_out) is DecoderLayerOutput
    assert layer_out.self_weights is None and layer_out.cross_weights is None
    hidden, self_ws, cross_ws = dec(tgt, memory, memory_mask=src_keep, return_weights=True)
    torch.testing.assert_close(hidden, plain.hidden, **TOL)
    assert [w.shape for w in self_ws] == [(3, H, 4, 4)] * 2
    assert [w.shape for w in cross_ws] == [(3, H, 4, 5)] * 2
    with pytest.raises(ValueError, match=r"caches: expected one \(self, cross\) KVCache pair"):
        dec(tgt, memory, caches=dec.init_cache(3, 4, 5)[:1])


def test_memory_is_required():
    """Without memory, cross-attention would attend over the targets themselves."""
    torch.manual_seed(0)
    dec = Decoder(2, d_model=D, num_heads=H, d_ff=FF, dropout=0.0)
    tgt, *_ = _inputs()
    message = r"memory: expected the encoder output, a \(B, S, d_model\) tensor, got NoneType"
    with pytest.raises(TypeError, match=message):
        dec.layers[0](tgt, None)
    with pytest.raises(TypeError, match=message):
        dec(tgt, None)
