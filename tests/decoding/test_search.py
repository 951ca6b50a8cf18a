"""The pure beam step and the length penalties, against values worked out by hand / brute force."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.decoding.search import BeamSearch, LengthPenalty


@pytest.mark.parametrize(
    "style,alpha,length,expected",
    [
        ("fairseq", 1.0, 7, 7.0),
        ("fairseq", 0.5, 9, 3.0),
        ("fairseq", 0.0, 9, 1.0),
        ("gnmt", 1.0, 1, 1.0),  # (5 + 1) / 6
        ("gnmt", 1.0, 7, 2.0),  # (5 + 7) / 6
        ("gnmt", 0.6, 13, 3.0**0.6),
        ("gnmt", 0.0, 13, 1.0),
    ],
)
def test_length_penalty_values(style, alpha, length, expected):
    penalty = LengthPenalty(style, alpha)
    assert math.isclose(penalty(length), expected, rel_tol=1e-12)
    assert math.isclose(penalty.normalize(-6.0, length), -6.0 / expected, rel_tol=1e-12)


def test_length_penalty_rejects_unknown_style():
    with pytest.raises(ValueError, match=r"style: expected one of \('fairseq', 'gnmt'\), got 'x'"):
        LengthPenalty("x", 1.0)


def _brute_force(step, lprobs, scores, k):
    """All (score, beam, token) of every sentence, sorted best first, cut to k."""
    out = []
    for b in range(lprobs.shape[0]):
        beams = range(1) if step == 0 else range(lprobs.shape[1])
        cands = [
            ((0.0 if step == 0 else float(scores[b, j])) + float(lprobs[b, j, t]), j, t)
            for j in beams
            for t in range(lprobs.shape[2])
        ]
        out.append(sorted(cands, key=lambda c: -c[0])[:k])
    return out


@pytest.mark.parametrize("step", [0, 3])
def test_step_returns_the_best_two_beam_candidates(step):
    torch.manual_seed(step)
    b, beam, vocab = 3, 4, 11
    lprobs = torch.randn(b, beam, vocab, dtype=torch.float64).log_softmax(-1)
    scores = torch.randn(b, beam, dtype=torch.float64) - 5
    cand_scores, cand_tokens, cand_beams = BeamSearch(beam).step(step, lprobs, scores)
    assert cand_scores.shape == cand_tokens.shape == cand_beams.shape == (b, 2 * beam)
    expected = _brute_force(step, lprobs, scores, 2 * beam)
    for i in range(b):
        got = list(
            zip(
                cand_scores[i].tolist(),
                cand_beams[i].tolist(),
                cand_tokens[i].tolist(),
                strict=True,
            )
        )
        assert [(j, t) for _, j, t in got] == [(j, t) for _, j, t in expected[i]]
        assert [s for s, _, _ in got] == pytest.approx([s for s, _, _ in expected[i]], abs=1e-12)


def test_step_zero_expands_only_the_first_beam():
    lprobs = torch.full((1, 2, 3), -10.0)
    lprobs[0, 1, 0] = -0.1  # better, but on beam 1: at step 0 all beams are bos, so ignored
    lprobs[0, 0] = torch.tensor([-3.0, -1.0, -2.0])
    scores, tokens, beams = BeamSearch(2).step(0, lprobs, None)
    # Only 3 candidates exist at step 0 (one beam x 3 tokens).
    assert tokens.tolist() == [[1, 2, 0]] and beams.tolist() == [[0, 0, 0]]
    assert scores.tolist() == [[-1.0, -2.0, -3.0]]


def test_step_checks_shapes():
    search = BeamSearch(2)
    with pytest.raises(ValueError, match=r"lprobs: expected shape \(B, 2, V\), got \(1, 3, 5\)"):
        search.step(1, torch.zeros(1, 3, 5), torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"scores: expected shape \(1, 2\), got None"):
        search.step(1, torch.zeros(1, 2, 5), None)
    with pytest.raises(ValueError, match=r"beam_size: expected an integer >= 1, got 0"):
        BeamSearch(0)
