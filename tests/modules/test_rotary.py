"""RotaryEmbedding against Hugging Face's LlamaRotaryEmbedding and apply_rotary_pos_emb (its
default, "linear" and "llama3" rope types), and the interleaved layout against a rotation of
pairs written out here."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from attnkit.modules import RotaryAngles, RotaryEmbedding

HEAD_DIM = 16
SCALINGS = {
    "none": ({}, {"rope_type": "default"}),
    "linear": ({"factor": 4.0}, {"rope_type": "linear", "factor": 4.0}),
    "llama3": (
        {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context": 64},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
}


def hf_rotary(base: float, hf_params: dict) -> LlamaRotaryEmbedding:
    config = transformers.LlamaConfig(
        hidden_size=4 * HEAD_DIM,
        num_attention_heads=4,
        max_position_embeddings=512,
        rope_parameters={"rope_theta": base, **hf_params},
    )
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_angles_and_rotation_equal_hugging_faces(scaling, base):
    ours_kw, hf_params = SCALINGS[scaling]
    rope = RotaryEmbedding(HEAD_DIM, base=base, scaling=scaling, **ours_kw)
    hf = hf_rotary(base, hf_params)
    torch.testing.assert_close(rope.inv_freq, hf.inv_freq, atol=0, rtol=0)

    positions = torch.tensor([[0, 1, 2, 3, 200, 511], [5, 5, 6, 7, 8, 9]])  # (B, T)
    x = torch.randn(2, 6, HEAD_DIM)
    cos, sin = hf(x, positions)  # (B, T, hd)
    angles = rope(positions)
    torch.testing.assert_close(angles.cos[:, :, 0], cos, atol=0, rtol=0)
    torch.testing.assert_close(angles.sin[:, :, 0], sin, atol=0, rtol=0)

    q, k = torch.randn(2, 4, 6, HEAD_DIM), torch.randn(2, 2, 6, HEAD_DIM)  # HF: (B, H, T, hd)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    # attnkit rotates heads laid out as projected: (B, T, H, hd)
    q_ours = angles.rotate(q.transpose(1, 2)).transpose(1, 2)
    k_ours = angles.rotate(k.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(q_ours, q_hf, atol=0, rtol=0)
    torch.testing.assert_close(k_ours, k_hf, atol=0, rtol=0)


def test_bfloat16_angles_and_rotation_equal_hugging_faces():
    rope, hf = RotaryEmbedding(HEAD_DIM), hf_rotary(10000.0, {"rope_type": "default"})
    positions = torch.arange(40)[None]
    x = torch.randn(1, 40, 3, HEAD_DIM, dtype=torch.bfloat16)
    cos, sin = hf(x, positions)
    angles = rope(positions, dtype=torch.bfloat16)
    assert angles.cos.dtype == torch.bfloat16
    q_hf, _ = apply_rotary_pos_emb(x.transpose(1, 2), x.transpose(1, 2), cos, sin)
    torch.testing.assert_close(angles.rotate(x), q_hf.transpose(1, 2), atol=0, rtol=0)


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_rotation_without_the_signed_sines_is_the_same(x_dtype):
    """RotaryAngles built by hand (no ``signed_sin``) or cast under autocast (queries in
    bfloat16, angles in float32) rotate as Hugging Face's ``apply_rotary_pos_emb`` does, bit
    for bit, like the angles RotaryEmbedding makes."""
    rope, hf = RotaryEmbedding(HEAD_DIM), hf_rotary(10000.0, {"rope_type": "default"})
    positions = torch.arange(12)[None]
    x = torch.randn(1, 12, 3, HEAD_DIM).to(x_dtype)
    angles = rope(positions)  # float32 angles
    assert angles.signed_sin is not None
    by_hand = RotaryAngles(angles.cos, angles.sin, False)
    cos, sin = hf(x, positions)  # in x's dtype
    want, _ = apply_rotary_pos_emb(x.transpose(1, 2), x.transpose(1, 2), cos, sin)
    for a in (angles, by_hand):
        torch.testing.assert_close(a.rotate(x), want.transpose(1, 2), atol=0, rtol=0)


def rotate_pairs(x, positions, base):
    """The interleaved (GPT-J, Meta) rotation written out: pair (2i, 2i+1) of the vector at
    position p turns by p * base^(-2i/d). x (T, d), positions (T,) -> (T, d), float64."""
    x = x.double()
    out = torch.empty_like(x)
    d = x.shape[-1]
    for t, p in enumerate(positions.tolist()):
        for i in range(d // 2):
            theta = p * base ** (-2 * i / d)
            a, b = x[t, 2 * i], x[t, 2 * i + 1]
            out[t, 2 * i] = a * math.cos(theta) - b * math.sin(theta)
            out[t, 2 * i + 1] = a * math.sin(theta) + b * math.cos(theta)
    return out


@pytest.mark.parametrize("interleaved", [True, False])
def test_each_layout_turns_its_pairs(interleaved):
    positions = torch.tensor([0, 1, 7, 30])
    x = torch.randn(4, HEAD_DIM)
    got = RotaryEmbedding(HEAD_DIM, interleaved=interleaved)(positions).rotate(x[None, :, None])
    got = got[0, :, 0].double()
    if interleaved:
        want = rotate_pairs(x, positions, 10000.0)
    else:  # half-split: pair (i, i + d/2) is pair (2i, 2i + 1) after a permutation
        order = torch.arange(HEAD_DIM).view(2, -1).t().reshape(-1)  # 0, 8, 1, 9, ...
        want = torch.empty(4, HEAD_DIM, dtype=torch.float64)
        want[:, order] = rotate_pairs(x[:, order], positions, 10000.0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("interleaved", [True, False])
def test_scores_depend_on_the_distance_only(interleaved):
    rope = RotaryEmbedding(HEAD_DIM, interleaved=interleaved)
    q, k = torch.randn(HEAD_DIM, dtype=torch.float64), torch.randn(HEAD_DIM, dtype=torch.float64)

    def score(i, j):
        angles = rope(torch.tensor([i, j]), dtype=torch.float64)
        both = angles.rotate(torch.stack([q, k])[None, :, None])[0, :, 0]  # (2, hd)
        return float(both[0] @ both[1])

    # The angles are float32 (as Hugging Face computes them): equal to about 1e-7.
    assert score(3, 1) == pytest.approx(score(12, 10), abs=1e-5)
    assert score(0, 0) == pytest.approx(float(q @ k), abs=1e-12)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"head_dim": 7}, r"head_dim: expected a positive even integer, got 7"),
        ({"head_dim": 0}, r"head_dim: expected a positive even integer, got 0"),
        ({"scaling": "yarn"}, r"scaling: unsupported RoPE scaling 'yarn'; expected one of"),
        ({"scaling": "dynamic"}, r"unsupported RoPE scaling 'dynamic'"),
        ({"base": 0.0}, r"base: expected a finite number > 0, got 0\.0"),
        ({"scaling": "linear", "factor": -2.0}, r"factor: expected a finite number > 0"),
        (
            {"scaling": "llama3", "low_freq_factor": 4.0, "high_freq_factor": 4.0},
            r"high_freq_factor: expected more than low_freq_factor=4\.0, got 4\.0",
        ),
        ({"scaling": "llama3", "original_context": 0}, r"original_context: expected a positive"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    kwargs = {"head_dim": HEAD_DIM, **kwargs}
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding(kwargs.pop("head_dim"), **kwargs)


def test_positions_must_be_integers_and_the_table_survives_a_cast():
    rope = RotaryEmbedding(HEAD_DIM)
    for bad in (torch.tensor([0.0, 1.0]), torch.tensor([True, False])):  # bool was accepted
        with pytest.raises(ValueError, match=r"positions: expected integer positions"):
            rope(bad)
    before = rope.inv_freq.clone()
    rope.to(torch.bfloat16)  # a model cast to bfloat16 keeps float32 frequencies
    assert rope.inv_freq.dtype == torch.float32 and torch.equal(rope.inv_freq, before)
    assert list(rope.state_dict()) == []  # a formula, not weights


def test_angles_that_do_not_fit_the_heads_are_named():
    """Before: torch's broadcast error from inside the rotation."""
    angles = RotaryEmbedding(HEAD_DIM)(torch.arange(3)[None].expand(2, 3))  # (2, 3, 1, hd)
    for shape in ((2, 3, 4, HEAD_DIM // 2), (3, 3, 4, HEAD_DIM)):  # head_dim, batch
        with pytest.raises(ValueError, match=r"rotary: angles of shape \(2, 3, 1, 16\)"):
            angles.rotate(torch.randn(shape))


def test_angles_of_another_head_width_are_named_by_the_attention():
    """Before: 'angles of shape (1, 5, 1, 4) ... do not fit x of shape (2, 5, 4, 8)', x being
    the queries and keys stacked inside the module, not the caller's x (2, 5, 16)."""
    from attnkit.modules import MultiHeadAttention

    mha = MultiHeadAttention(16, 2).eval()
    angles = RotaryEmbedding(4)(torch.arange(5))
    with pytest.raises(
        ValueError,
        match=r"^rotary: angles of head_dim 4 \(RotaryEmbedding\(4\)\), but this attention's "
        r"heads are 8 wide \(d_model=16 / num_heads=2\)$",
    ):
        mha(torch.randn(2, 5, 16), rotary=angles)
