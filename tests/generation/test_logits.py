"""The logits filters against Hugging Face's processors of the same name, on random logits."""

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from attnkit.generation import (
    apply_temperature,
    process_logits,
    repetition_penalty,
    seen_tokens,
    top_k_filter,
    top_p_filter,
)
from attnkit.generation.sampling import sample

V = 97


def _logits(b: int = 6, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, V, generator=g) * 3  # (B, V)


def _same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Equal to 1e-6, -inf in the same places."""
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    finite = torch.isfinite(theirs)
    torch.testing.assert_close(ours[finite], theirs[finite], rtol=0, atol=1e-6)


@pytest.mark.parametrize("t", [0.3, 1.0, 1.7])
def test_temperature_equals_hf(t):
    x = _logits()
    _same(apply_temperature(x, t), TemperatureLogitsWarper(t)(None, x.clone()))


@pytest.mark.parametrize("k", [1, 5, 40, V, V + 10])
def test_top_k_equals_hf(k):
    x = _logits()
    x[0, :10] = x[0, 0]  # ties at the k-th value are kept by both
    ours = top_k_filter(x, k)
    _same(ours, TopKLogitsWarper(k)(None, x.clone()))
    assert (torch.isfinite(ours).sum(dim=1) >= min(k, V)).all()


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999, 1.0])
def test_top_p_equals_hf(p):
    x = _logits(seed=1)
    ours = top_p_filter(x, p)
    _same(ours, TopPLogitsWarper(p)(None, x.clone()))
    assert (torch.isfinite(ours).sum(dim=1) >= 1).all()


@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.3, 2.0])
def test_repetition_penalty_equals_hf(penalty):
    x = _logits()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, V, (6, 30), generator=g)  # repeats within rows
    ours = repetition_penalty(x, seen_tokens(ids, V), penalty)
    _same(ours, RepetitionPenaltyLogitsProcessor(penalty)(ids, x.clone()))


def test_seen_tokens_ignores_padding():
    ids = torch.tensor([[5, 5, 7, 3], [1, 2, 3, 4]])
    mask = torch.tensor([[False, True, True, True], [False, False, True, True]])
    seen = seen_tokens(ids, 10, mask)
    assert seen[0].nonzero().flatten().tolist() == [3, 5, 7]
    assert seen[1].nonzero().flatten().tolist() == [3, 4]  # 1 and 2 are padding


def test_process_logits_equals_hf_chain():
    """Repetition penalty, temperature, top-k, top-p in Hugging Face's order."""
    x = _logits(seed=3)
    ids = torch.randint(0, V, (6, 12))
    hf = LogitsProcessorList([
        RepetitionPenaltyLogitsProcessor(1.2),
        TemperatureLogitsWarper(0.7),
        TopKLogitsWarper(20),
        TopPLogitsWarper(0.8),
    ])  # fmt: skip
    ours = process_logits(
        x, seen=seen_tokens(ids, V), repetition=1.2, temperature=0.7, top_k=20, top_p=0.8
    )
    _same(ours, hf(ids, x.clone()))


def test_process_logits_greedy_applies_only_the_penalty():
    x = _logits()
    assert torch.equal(process_logits(x, temperature=0.0), x)
    ids = torch.randint(0, V, (6, 5))
    _same(
        process_logits(x, seen=seen_tokens(ids, V), repetition=1.5, temperature=0.0),
        RepetitionPenaltyLogitsProcessor(1.5)(ids, x.clone()),
    )


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda x: apply_temperature(x, 0.0), "temperature"),
        (lambda x: top_k_filter(x, 0), "top_k"),
        (lambda x: top_p_filter(x, 0.0), "top_p"),
        (lambda x: top_p_filter(x, 1.5), "top_p"),
        (lambda x: repetition_penalty(x, torch.zeros_like(x, dtype=torch.bool), 0.0), "repetition"),
        (lambda x: process_logits(x, repetition=1.2), "seen"),
    ],
)
def test_bad_arguments_name_themselves(call, name):
    with pytest.raises(ValueError, match=name):
        call(_logits())


def test_top_p_keeps_every_token_tied_at_the_cut():
    """The cut is a logit threshold: ties with the smallest kept logit all stay (Hugging Face
    keeps or drops them by its sort order)."""
    x = torch.tensor([[0.0, 0.0, 0.0, 0.0, -5.0]])
    assert torch.isfinite(top_p_filter(x, 0.5)).tolist() == [[True, True, True, True, False]]


@pytest.mark.parametrize("t", [0.3, 1.7, 1e-3])
def test_temperature_is_a_plain_division_where_it_does_not_overflow(t):
    x = _logits()
    assert torch.equal(apply_temperature(x, t), x / t)


@pytest.mark.parametrize("t", [1e-45, 1e-46, 1e-300, 5e-324])
def test_a_tiny_temperature_gives_the_limit_not_inf_or_nan(t):
    """``x / t`` overflows to +inf (and to 0 / 0 = NaN below float32's smallest temperature):
    the row's largest logits become 0, the others -inf, as the temperature goes to 0."""
    x = _logits()
    x[1, :] = torch.arange(V) * 1e-3  # logits close together
    x[2, 40] = x[2].max()  # a tie at the top
    x[3] -= x[3].max()  # the top is exactly 0
    x[4, :5] = float("-inf")  # already filtered
    scaled = apply_temperature(x, t)
    top = x == x.amax(dim=1, keepdim=True)
    assert torch.equal(scaled == 0, top)
    assert torch.isneginf(scaled[~top]).all()


def test_temperature_keeps_inf_and_nan_logits():
    x = _logits(b=3)
    x[0, 3] = float("inf")
    x[1, 4] = float("nan")
    x[2] = float("-inf")
    for t in (0.5, 1e-45):
        scaled = apply_temperature(x, t)
        assert torch.equal(torch.isposinf(scaled), torch.isposinf(x))
        assert torch.equal(torch.isnan(scaled), torch.isnan(x))
        assert torch.isneginf(scaled[2]).all()


def test_a_tiny_repetition_penalty_gives_the_limit():
    """logits [1, 3, -5], both positive ids seen: 1 / 1e-39 and 3 / 1e-39 overflow to +inf, and
    a draw among the +inf ids took id 0 about 60% of the time; as the penalty goes to 0 the
    distribution puts everything on the larger logit, id 1."""
    logits = torch.tensor([[1.0, 3.0, -5.0], [1.0, 3.0, -5.0]])
    seen = torch.tensor([[True, True, False], [False, False, False]])
    out = repetition_penalty(logits, seen, 1e-39)
    assert out[0].tolist() == [float("-inf"), 0.0, float("-inf")]
    assert torch.equal(out[1], logits[1])  # nothing seen: untouched
    assert sample(out[:1].expand(200, 3), torch.Generator().manual_seed(0)).eq(1).all()
    # where nothing overflows, the plain rule (Hugging Face's), also for penalties < 1
    torch.testing.assert_close(
        repetition_penalty(logits, seen, 0.5), torch.tensor([[2.0, 6.0, -5.0], [1.0, 3.0, -5.0]])
    )
