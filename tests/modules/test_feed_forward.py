"""FeedForward: W_2 act(W_1 x + b_1) + b_2, checked against torch.nn.functional."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

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
        ValueError, match=r"activation: expected one of \['gelu', 'gelu_tanh', 'relu'\], got 'tanh'"
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
