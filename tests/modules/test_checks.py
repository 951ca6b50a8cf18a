"""Sizes and inputs the modules refuse by name (before: torch's errors from inside a layer,
sizes of 0 accepted, and an integer input to a positional encoding truncated its table)."""

from __future__ import annotations

import pytest
import torch

from attnkit.modules import (
    EncoderLayer,
    FeedForward,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    RMSNorm,
    SinusoidalPositionalEncoding,
)
from attnkit.modules.norm import make_norm


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FeedForward(-1, 4), "d_model: expected a positive integer, got -1"),
        (lambda: FeedForward(8, 0), "d_ff: expected a positive integer, got 0"),
        (lambda: FeedForward(8, 2.5), "d_ff: expected a positive integer, got 2.5"),
        (lambda: EncoderLayer(8, 2, 0), "d_ff: expected a positive integer, got 0"),
        (lambda: RMSNorm(0), "d_model: expected a positive integer, got 0"),
        (lambda: make_norm("layer", 0, eps=1e-5), "d_model: expected a positive integer, got 0"),
        (lambda: SinusoidalPositionalEncoding(4, -1), "max_len: expected a positive integer"),
        (lambda: SinusoidalPositionalEncoding(0, 8), "d_model: expected a positive even number"),
        (lambda: SinusoidalPositionalEncoding(3, 8), "d_model: expected a positive even number"),
        (lambda: LearnedPositionalEmbedding(0, 4), "max_len: expected a positive integer, got 0"),
        (lambda: LearnedPositionalEmbedding(8, True), "d_model: expected a positive integer"),
    ],
)
def test_sizes_are_positive_integers(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    ("module", "x", "error", "message"),
    [
        (FeedForward(8, 16), torch.randn(2, 3, 7), ValueError, r"x: expected shape \(\.\.\., 8\), got \(2, 3, 7\)"),
        (RMSNorm(8), torch.randn(2, 3, 7), ValueError, r"x: expected shape \(\.\.\., 8\), got \(2, 3, 7\)"),
        (FeedForward(8, 16), torch.ones(2, 8, dtype=torch.long), TypeError, "x: expected a floating-point tensor"),
        (RMSNorm(8), torch.ones(2, 8, dtype=torch.long), TypeError, "x: expected a floating-point tensor"),
        (SinusoidalPositionalEncoding(4, 10), torch.full((1, 3, 4), 5), TypeError, "x: expected a floating-point tensor"),
        (LearnedPositionalEmbedding(10, 4), torch.full((1, 3, 4), 5), TypeError, "x: expected a floating-point tensor"),
        (MultiHeadAttention(16, 4), torch.zeros(2, 5, 16, dtype=torch.long), TypeError, "x: expected a floating-point tensor"),
        (MultiHeadAttention(16, 4), torch.zeros(1, 3, 16, device="meta"), ValueError, "x: on meta, the module's weights on cpu"),
    ],
)  # fmt: skip
def test_inputs_are_named(module, x, error, message):
    with pytest.raises(error, match=message):
        module(x)


def test_the_sinusoidal_table_is_added_to_float_inputs_whole():
    """The case that went wrong for integers: a float x gets the table's fractions."""
    pe = SinusoidalPositionalEncoding(4, 10)
    out = pe(torch.full((1, 3, 4), 5.0))
    assert torch.equal(out[0], 5.0 + pe.pe[:3])
    assert out[0, 1, 0].item() == pytest.approx(5.0 + torch.sin(torch.tensor(1.0)).item())
