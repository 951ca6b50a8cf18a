"""int8 linear layers (``packed_linears(int8=True)``): the product of torch.ao's dynamic
quantized ``Linear`` (the reference users would reach for), used by a model's linear layers
inside the block, and a Translator that runs on them."""

import warnings

import pytest
import torch
from torch import nn

import attnkit.generation.packed as packed
from attnkit.decoding import DecodingConfig, Translator
from attnkit.generation.packed import int8_available, packed_linears
from attnkit.models import Transformer, TransformerConfig

pytestmark = pytest.mark.skipif(not int8_available(), reason="torch without FBGEMM (not x86)")


def tiny_transformer(vocab: int, max_len: int, d_model: int = 32) -> Transformer:
    torch.manual_seed(0)
    config = TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d_model, num_heads=4,
        num_encoder_layers=1, num_decoder_layers=1, d_ff=2 * d_model, max_len=max_len,
    )  # fmt: skip
    return Transformer(config).eval()


def reference_int8(module: nn.Linear) -> nn.Module:
    """torch.ao's dynamic quantized Linear of ``module``: int8 weights per output channel
    (symmetric), inputs quantized per call, on FBGEMM."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao's deprecation notices
            return quantize_dynamic(
                nn.Sequential(module), {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8
            )[0]
    finally:
        torch.backends.quantized.engine = engine


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 48), (2, 5, 48), (1, 1, 48)])
def test_int8_product_is_torch_aos_dynamic_linear(bias, shape):
    torch.manual_seed(0)
    module = nn.Linear(48, 70, bias=bias)
    x = torch.randn(shape)
    model = nn.Sequential(module)
    with torch.inference_mode(), packed_linears(model, int8=True):
        got = model(x)
    want = reference_int8(nn.Linear(48, 70, bias=bias).requires_grad_(False))
    want.set_weight_bias(*_quantized(module))  # the same weights, quantized by torch.ao
    with torch.inference_mode():
        expected = want(x.reshape(-1, 48)).view(*shape[:-1], 70)
    assert got.shape == (*shape[:-1], 70)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # ... and within int8's rounding of the float32 product, which it is not.
    exact = nn.functional.linear(x, module.weight, module.bias)
    assert 0 < (got - exact).abs().max() < 0.05 * exact.abs().max()


def _quantized(module: nn.Linear):
    """(int8 weight, float bias) of ``module`` as torch.ao's per-channel observer makes them."""
    from torch.ao.quantization import default_per_channel_weight_observer

    observer = default_per_channel_weight_observer()
    observer(module.weight.detach())
    scale, zero_point = observer.calculate_qparams()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        weight = torch.quantize_per_channel(
            module.weight.detach(), scale.double(), zero_point, 0, torch.qint8
        )
    return weight, None if module.bias is None else module.bias.detach()


def test_relu_feed_forward_and_cross_attention_queries_run_in_int8():
    """Inside the block a Transformer gives other logits than float32 (its nn.Linear layers,
    the fused ReLU layer and the cross-attention queries in int8; the cross-attention keys and
    values, a slice of in_proj, stay float32), close to them; outside it the float32 logits
    again; gradients take float32."""
    model = tiny_transformer(50, 16)
    src, tgt = torch.randint(3, 50, (2, 7)), torch.randint(3, 50, (2, 5))
    with torch.inference_mode():
        before = model(src, tgt)  # (2, 5, 50) logits
        with packed_linears(model, int8=True):
            int8 = model(src, tgt)
            patched = {(type(m).__name__, name) for m in model.modules() for name in m.__dict__
                       if name in ("forward", "_project_q")}  # fmt: skip
        after = model(src, tgt)
    assert {("Linear", "forward"), ("FeedForward", "forward")} <= patched
    assert ("MultiHeadAttention", "_project_q") in patched
    assert packed._INT8 and all(isinstance(v[1], torch.ScriptObject) for v in packed._INT8.values())
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    assert 0 < (int8 - before).abs().max() < 0.1 * before.abs().max()
    with packed_linears(model, int8=True):
        grad = model(src, tgt)  # gradients on: float32 products
    torch.testing.assert_close(grad, before)


def test_translator_int8_translates_close_to_float32(monkeypatch):
    calls = []
    real = packed._int8_product
    monkeypatch.setattr(packed, "_int8_product", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = tiny_transformer(40, 12)

    class Ids:  # a tokenizer of ids written as words
        pad_id, bos_id, eos_id, vocab_size = 0, 1, 2, 40

        def encode_batch(self, lines):
            return [[int(w) for w in line.split()] for line in lines]

        def decode_batch(self, rows):
            return [" ".join(map(str, r)) for r in rows]

    lines = [" ".join(str(3 + (5 * i + j) % 37) for j in range(3 + i % 5)) for i in range(12)]
    search = DecodingConfig(beam_size=2, max_len_a=0, max_len_b=6)
    plain = Translator(model, Ids(), search).translate(lines).translations
    assert not calls
    int8 = Translator(model, Ids(), search, int8=True).translate(lines).translations
    assert calls  # the linear layers ran in int8
    assert len(int8) == len(lines) and all(int8)
    assert sum(a == b for a, b in zip(plain, int8, strict=True)) >= len(lines) // 2


def test_translator_int8_refuses_what_it_cannot_run():
    class Ids:
        pad_id, bos_id, eos_id, vocab_size = 0, 1, 2, 20

    model = tiny_transformer(20, 8, d_model=16)
    with pytest.raises(TypeError, match=r"int8: expected True or False, got 'yes'"):
        Translator(model, Ids(), int8="yes")
    with pytest.raises(ValueError, match=r"int8: expected a float32 model on a CPU.*bfloat16"):
        Translator(model.to(torch.bfloat16), Ids(), int8=True)


def test_int8_weights_follow_load_state_dict():
    """The int8 packing is made again when the weights change (load_state_dict bumps their
    version): the products are those of a fresh packing of the new weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8))
    x = torch.randn(3, 16)
    with torch.inference_mode(), packed_linears(model, int8=True):
        first = model(x)
    new = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(new)
    with torch.inference_mode(), packed_linears(model, int8=True):
        second = model(x)
    fresh = nn.Sequential(nn.Linear(16, 8))
    fresh.load_state_dict(new)
    with torch.inference_mode(), packed_linears(fresh, int8=True):
        expected = fresh(x)
    torch.testing.assert_close(second, expected, rtol=0, atol=0)
    assert not torch.equal(first, second)


def test_an_input_of_nan_is_refused_by_name():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8))
    with torch.inference_mode(), packed_linears(model, int8=True):
        with pytest.raises(ValueError, match=r"int8: a linear layer's input holds NaN or inf"):
            model(torch.full((2, 16), float("nan")))
