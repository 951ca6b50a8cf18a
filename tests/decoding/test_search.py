"""The pure beam step and the length penalties, against values worked out by hand / brute force."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.decoding.search import BeamSearch, LengthPenalty, top_candidates


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


def _check_candidates(lprobs, scores, count, values, tokens, beams):
    """values equal torch.topk's over every (beam, token) of a sentence, and each (beam, token)
    returned holds its value, each pair once."""
    b, g, v = lprobs.shape
    total = lprobs if scores is None else lprobs + scores.unsqueeze(-1)
    expected = torch.topk(total.reshape(b, g * v), count, dim=1).values
    assert torch.equal(values, expected)
    assert torch.equal(total[torch.arange(b)[:, None], beams, tokens], values)
    pairs = (beams * v + tokens).tolist()
    assert all(len(set(row)) == count for row in pairs)  # distinct candidates a sentence


@pytest.mark.parametrize("vocab", [6000, 6001, 6063, 50257])
@pytest.mark.parametrize("rounding", [None, torch.bfloat16])
@pytest.mark.parametrize("beams", [1, 5])
def test_top_candidates_equal_torch_topk(vocab, rounding, beams):
    """Same values as torch.topk over all of a sentence's candidates, sorted: whole blocks
    only and with a tail of columns after the last block, one beam (step 0) or five with
    their scores; bf16-rounded values make many ties."""
    torch.manual_seed(vocab + beams)
    lprobs = torch.log_softmax(torch.randn(7, beams, vocab) * 3, dim=-1)
    if rounding is not None:
        lprobs = lprobs.to(rounding).float()
    lprobs[:, :, 3] = float("-inf")  # a forbidden token, as beam search sets them
    scores = None if beams == 1 else torch.randn(7, beams) - 4
    values, tokens, beams_ = top_candidates(lprobs, scores, 10)
    _check_candidates(lprobs, scores, 10, values, tokens, beams_)


def test_top_candidates_in_one_block_in_the_tail_and_across_beams():
    """The best candidates all in one block of one beam, in the columns after the last whole
    block, or spread by the beams' scores."""
    v = 64 * 50 + 7
    lprobs = torch.zeros(3, 2, v)
    lprobs[0, 1, 128:138] = torch.arange(10.0, 20.0)  # ten winners in block 2 of beam 1
    lprobs[1, 0, -7:] = torch.arange(1.0, 8.0)  # seven winners in beam 0's tail
    lprobs[1, 1, 5] = 0.5
    lprobs[2, 0, 9] = 3.0  # beam 0's best, but beam 1's score lifts all of beam 1 above it
    scores = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 5.0]])
    values, tokens, beams = top_candidates(lprobs, scores, 10)
    _check_candidates(lprobs, scores, 10, values, tokens, beams)
    assert tokens[0].tolist() == list(range(137, 127, -1)) and beams[0].tolist() == [1] * 10
    assert tokens[1, :8].tolist() == [*range(v - 1, v - 8, -1), 5]
    assert beams[1, :8].tolist() == [0] * 7 + [1]
    assert values[1, :8].tolist() == [7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.5]
    assert beams[2].tolist() == [1] * 10 and values[2, 0].item() == 5.0


def test_top_candidates_short_rows_and_nan_as_torch():
    """Rows too short for blocks rank every candidate; NaN ranks first, as in torch.topk."""
    lprobs = torch.randn(3, 2, 100)
    scores = torch.randn(3, 2)
    values, tokens, beams = top_candidates(lprobs, scores, 4)
    _check_candidates(lprobs, scores, 4, values, tokens, beams)
    y = torch.randn(2, 1, 6000)
    y[1, 0, 4321] = float("nan")
    values, tokens, beams = top_candidates(y, None, 5)
    assert math.isnan(values[1, 0].item()) and tokens[1, 0].item() == 4321
    assert torch.equal(values[0], torch.topk(y[0, 0], 5).values)


@pytest.mark.parametrize("vocab", [6000, 6001])
def test_top_candidates_of_a_sentence_do_not_depend_on_the_batch(vocab):
    """Each sentence's candidates are the same ranked alone or with others (ties included: a
    batch of beams decodes the same tokens whatever else it holds)."""
    torch.manual_seed(vocab)
    lprobs = torch.log_softmax(torch.randn(6, 5, vocab) * 3, dim=-1).to(torch.bfloat16).float()
    scores = (torch.randn(6, 5) - 4).to(torch.bfloat16).float()  # ties across beams too
    together = top_candidates(lprobs, scores, 10)
    for i in range(6):
        alone = top_candidates(lprobs[i : i + 1].contiguous(), scores[i : i + 1], 10)
        for a, b in zip(alone, together, strict=True):
            assert torch.equal(a[0], b[i])
