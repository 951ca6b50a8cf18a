"""The sampler draws from the distribution it is given (chi-square at a fixed seed) and a seed
makes it reproducible."""

import pytest
import torch
from scipy.stats import chisquare

from attnkit.generation import make_generator, sample, select, top_k_filter


def test_draws_follow_the_distribution():
    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02])
    n = 20_000
    logits = probs.log().expand(n, -1)  # n independent rows of the same distribution
    draws = sample(logits, make_generator(1234))  # (n,)
    counts = torch.bincount(draws, minlength=len(probs)).double()
    result = chisquare(counts.numpy(), (probs.double() * n).numpy())
    assert result.pvalue > 0.01, (counts.tolist(), result)


def test_filtered_tokens_are_never_drawn():
    logits = torch.randn(2000, 50)
    kept = top_k_filter(logits, 3)
    draws = sample(kept, make_generator(0))
    assert torch.isfinite(kept.gather(1, draws[:, None])).all()


def test_seed_reproduces_and_differs():
    logits = torch.randn(8, 100)
    a = sample(logits, make_generator(7))
    assert torch.equal(a, sample(logits, make_generator(7)))
    assert not torch.equal(a, sample(logits, make_generator(8)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_greedy_is_torch_argmax_ties_and_nan_included(dtype):
    logits = torch.randn(6, 50257).to(dtype)
    logits[1, [7, 300, 9000]] = 100.0  # ties: the first index wins
    logits[2, 11] = float("nan")  # NaN counts as the largest value
    logits[3] = float("-inf")
    logits[3, 4000] = -1e30
    logits[4] = 0.0
    got = select(logits, None)
    assert got.dtype == torch.int64 and got.shape == (6,)
    assert torch.equal(got, torch.argmax(logits, dim=1))
    assert got[1:5].tolist() == [7, 11, 4000, 0]
    assert torch.equal(select(logits[:, ::2], None), torch.argmax(logits[:, ::2], dim=1))


def test_seed_must_be_int():
    with pytest.raises(TypeError, match="seed"):
        make_generator("3")
