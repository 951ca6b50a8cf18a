"""FeedForward: W_2 act(W_1 x + b_1) + b_2, checked against torch.nn.functional."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnkit.dropout import dropout
from attnkit.modules import FeedForward


@pytest.mark.parametrize(
    "activation,fn", [("relu", F.relu), ("gelu", lambda h: F.gelu(h, approximate="none"))]
)
def test_feed_forward_formula(activation, fn):
    torch.manual_seed(0)
    ffn = FeedForward(6, 10, activation=activation)
    x = torch.randn(2, 3, 6)
    l1, l2 = ffn.linear1, ffn.linear2
    expected = (fn(x @ l1.weight.T + l1.bias)) @ l2.weight.T + l2.bias
    torch.testing.assert_close(ffn(x), expected)
    # Any leading dims, batch size 1 and length 1.
    torch.testing.assert_close(ffn(x[0]), expected[0])
    torch.testing.assert_close(ffn(x[:1, :1]), expected[:1, :1])
    assert l1.weight.shape == (10, 6) and l2.weight.shape == (6, 10)


def test_feed_forward_without_bias():
    ffn = FeedForward(4, 8, bias=False)
    assert ffn.linear1.bias is None and ffn.linear2.bias is None
    assert torch.equal(ffn(torch.zeros(1, 2, 4)), torch.zeros(1, 2, 4))


def test_unknown_activation_raises():
    with pytest.raises(
        ValueError,
        match=r"activation: expected one of \['gelu', 'gelu_tanh', 'relu', 'silu'\], got 'tanh'",
    ):
        FeedForward(4, 8, activation="tanh")


def test_dropout_only_in_training():
    torch.manual_seed(0)
    ffn = FeedForward(8, 32, dropout=0.5)
    x = torch.randn(4, 5, 8)
    ffn.train()
    a, b = ffn(x), ffn(x)
    assert not torch.equal(a, b)
    torch.manual_seed(1)
    a = ffn(x)
    torch.manual_seed(1)
    torch.testing.assert_close(ffn(x), a, rtol=0, atol=0)
    ffn.eval()
    l1, l2 = ffn.linear1, ffn.linear2
    torch.testing.assert_close(ffn(x), l2(F.relu(l1(x))))


def test_swiglu_equals_hugging_face_llama_mlp():
    # The gated form with "silu" is Llama's MLP: down(silu(gate(x)) * up(x)); gate and up are
    # stacked in linear1, gate rows first.
    import transformers
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=6, intermediate_size=10, num_attention_heads=2, hidden_act="silu"
    )
    hf = LlamaMLP(config)
    ffn = FeedForward(6, 10, activation="silu", bias=False, gated=True)
    assert ffn.linear1.weight.shape == (20, 6) and ffn.linear2.weight.shape == (6, 10)
    with torch.no_grad():
        ffn.linear1.weight.copy_(torch.cat([hf.gate_proj.weight, hf.up_proj.weight]))
        ffn.linear2.weight.copy_(hf.down_proj.weight)
    x = torch.randn(2, 3, 6)
    torch.testing.assert_close(ffn(x), hf(x), atol=1e-6, rtol=0)
    gate, up = x @ hf.gate_proj.weight.T, x @ hf.up_proj.weight.T
    formula = (gate * torch.sigmoid(gate) * up) @ hf.down_proj.weight.T
    torch.testing.assert_close(ffn(x), formula, atol=1e-6, rtol=0)


def test_gated_dropout_acts_after_the_gating():
    torch.manual_seed(0)
    ffn = FeedForward(4, 8, activation="silu", gated=True, dropout=0.5).train()
    x = torch.randn(3, 4)
    torch.manual_seed(1)
    got = ffn(x)
    gate, up = ffn.linear1(x).chunk(2, dim=-1)
    torch.manual_seed(1)
    want = ffn.linear2(dropout(F.silu(gate) * up, 0.5))  # attnkit's mask, the same stream
    torch.testing.assert_close(got, want)
