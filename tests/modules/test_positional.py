"""Positional encodings: the paper's sinusoids, computed here with Python's math, and learned
position embeddings."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.modules import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


def paper_encoding(pos: int, d_model: int) -> list[float]:
    """PE(pos, 2i) = sin(pos / 10000^(2i / d_model)), PE(pos, 2i + 1) = cos(same)."""
    row = []
    for j in range(d_model):
        angle = pos / 10000 ** ((j - j % 2) / d_model)
        row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
    return row


@pytest.mark.parametrize("d_model", [2, 6, 16])
def test_sinusoidal_values_match_the_formula(d_model):
    pe = SinusoidalPositionalEncoding(d_model, max_len=600)
    x = torch.zeros(1, 600, d_model)
    out = pe(x)[0]
    for pos in (0, 1, 2, 7, 50, 599):
        expected = torch.tensor(paper_encoding(pos, d_model))
        torch.testing.assert_close(out[pos], expected, atol=1e-6, rtol=0)
    assert torch.equal(out[0, 0::2], torch.zeros(d_model // 2))  # sin(0)
    assert torch.equal(out[0, 1::2], torch.ones(d_model // 2))  # cos(0)


def test_sinusoidal_is_added_with_offset_and_keeps_dtype():
    pe = SinusoidalPositionalEncoding(8, max_len=20)
    x = torch.randn(2, 3, 8)
    out = pe(x, offset=5)
    expected = torch.tensor([paper_encoding(p, 8) for p in (5, 6, 7)])
    torch.testing.assert_close(out - x, expected.expand(2, 3, 8), atol=1e-6, rtol=0)
    # Decoding one position at a time gives the same as the whole sequence at once.
    whole = pe(x)
    steps = torch.cat([pe(x[:, t : t + 1], offset=t) for t in range(3)], dim=1)
    torch.testing.assert_close(steps, whole, rtol=0, atol=0)
    for dtype in (torch.float64, torch.bfloat16):
        assert pe(x.to(dtype)).dtype == dtype


def test_sinusoidal_table_is_not_a_parameter_or_saved():
    pe = SinusoidalPositionalEncoding(8, max_len=20)
    assert list(pe.parameters()) == []
    assert "pe" not in pe.state_dict()


def test_sequence_longer_than_max_len_raises():
    pe = SinusoidalPositionalEncoding(8, max_len=10)
    pe(torch.zeros(1, 10, 8))  # exactly max_len is fine
    with pytest.raises(ValueError, match=r"sequence length 11 .*max_len=10"):
        pe(torch.zeros(1, 11, 8))
    with pytest.raises(
        ValueError, match=r"sequence length 12 \(offset 9 \+ length 3\).*max_len=10"
    ):
        pe(torch.zeros(1, 3, 8), offset=9)


@pytest.mark.parametrize("d_model", [0, 7, -2])
def test_sinusoidal_needs_positive_even_width(d_model):
    with pytest.raises(
        ValueError, match=rf"d_model: expected a positive even number, got {d_model}"
    ):
        SinusoidalPositionalEncoding(d_model)


def test_learned_positions_shape_and_offset():
    torch.manual_seed(0)
    pos = LearnedPositionalEmbedding(max_len=10, d_model=4)
    table = pos.embedding.weight
    assert table.shape == (10, 4) and table.requires_grad
    x = torch.randn(2, 3, 4)
    out = pos(x)
    assert out.shape == (2, 3, 4)
    torch.testing.assert_close(out, x + table[:3])
    torch.testing.assert_close(pos(x, offset=6), x + table[6:9])
    torch.testing.assert_close(pos(x[:, :1], offset=9), x[:, :1] + table[9:10])
    assert pos(torch.zeros(1, 1, 4)).shape == (1, 1, 4)
    with pytest.raises(
        ValueError, match=r"sequence length 11 \(offset 8 \+ length 3\).*max_len=10"
    ):
        pos(x, offset=8)


def test_learned_positions_get_gradients():
    pos = LearnedPositionalEmbedding(max_len=6, d_model=4)
    pos(torch.zeros(1, 2, 4), offset=3).sum().backward()
    grad = pos.embedding.weight.grad
    assert (grad[3:5] == 1).all() and (grad[:3] == 0).all() and (grad[5:] == 0).all()


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
@pytest.mark.parametrize(
    ("shape", "offset", "message"),
    [
        # before: sinusoidal added positions 7 and 8 (the table read from its end), learned
        # raised torch's IndexError, a float offset a TypeError about slices
        ((1, 2, 32), -3, r"offset: expected an integer >= 0 \(the first position\), got -3"),
        ((1, 2, 32), 1.0, r"offset: expected an integer >= 0 \(the first position\), got 1.0"),
        ((1, 2, 32), True, r"offset: expected an integer >= 0"),
        ((1, 2, 16), 0, r"x: expected shape \(B, T, 32\), got \(1, 2, 16\)"),  # a broadcast error
        ((2, 32), 0, r"x: expected shape \(B, T, 32\), got \(2, 32\)"),
    ],
)
def test_bad_offsets_and_widths_are_named(kind, shape, offset, message):
    module = (
        SinusoidalPositionalEncoding(32, 10)
        if kind == "sinusoidal"
        else (LearnedPositionalEmbedding(10, 32))
    )
    with pytest.raises(ValueError, match=message):
        module(torch.zeros(shape), offset=offset)
