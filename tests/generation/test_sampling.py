"""The sampler draws from the distribution it is given (chi-square at a fixed seed), from the
limit distribution where logits are +inf, refuses NaN, and a seed makes it reproducible."""

import pytest
import torch
from scipy.stats import chisquare

from attnkit.generation import make_generator, sample, select, top_k_filter
from attnkit.generation.sampling import argmax


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
def test_argmax_is_torch_argmax_ties_and_nan_included(dtype):
    logits = torch.randn(6, 50257).to(dtype)
    logits[1, [7, 300, 9000]] = 100.0  # ties: the first index wins
    logits[2, 11] = float("nan")  # NaN counts as the largest value
    logits[3] = float("-inf")
    logits[3, 4000] = -1e30
    logits[4] = 0.0
    got = argmax(logits)
    assert got.dtype == torch.int64 and got.shape == (6,)
    assert torch.equal(got, torch.argmax(logits, dim=1))
    assert got[1:5].tolist() == [7, 11, 4000, 0]
    assert torch.equal(argmax(logits[:, ::2]), torch.argmax(logits[:, ::2], dim=1))
    finite = logits[[0, 1, 3, 4, 5]]
    assert torch.equal(select(finite, None), torch.argmax(finite, dim=1))
    assert torch.equal(select(finite[:, ::3], None), torch.argmax(finite[:, ::3], dim=1))


def test_plus_inf_logits_are_drawn_evenly_and_alone():
    """softmax is NaN on a row with +inf logits; its limit is even over those ids."""
    n, v = 4000, 11
    logits = torch.randn(n, v)
    logits[:, [2, 9]] = float("inf")
    logits[:, 5] = 1e30
    draws = sample(logits, make_generator(0))
    counts = torch.bincount(draws, minlength=v)
    assert counts.sum() == n and counts[2] + counts[9] == n
    assert chisquare(counts[[2, 9]].numpy()).pvalue > 0.01, counts.tolist()
    one = torch.full((3, v), float("-inf"))
    one[:, 4] = float("inf")
    assert sample(one, make_generator(1)).tolist() == [4, 4, 4]


def test_a_row_with_inf_leaves_the_other_rows_draws_alone():
    finite = torch.randn(3, 50)
    logits = finite.clone()
    logits[1, 17] = float("inf")
    draws = sample(logits, make_generator(5))
    assert draws[1] == 17
    assert draws[[0, 2]].tolist() == sample(finite, make_generator(5))[[0, 2]].tolist()


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sample"])
@pytest.mark.parametrize("where", ["row", "one"])
def test_nan_logits_are_an_error_not_an_id(greedy, where):
    logits = torch.randn(4, 50)
    if where == "row":
        logits[2] = float("nan")
    else:
        logits[2, 30] = float("nan")
    with pytest.raises(ValueError, match=r"logits: NaN in row\(s\) \[2\]"):
        select(logits, None if greedy else make_generator(0))


def test_a_row_of_minus_inf_cannot_be_drawn():
    logits = torch.randn(2, 50)
    logits[1] = float("-inf")
    with pytest.raises(ValueError, match=r"every logit of row\(s\) \[1\] is -inf"):
        sample(logits, make_generator(0))


def test_seed_must_be_int():
    with pytest.raises(TypeError, match="seed"):
        make_generator("3")


@pytest.mark.parametrize("seed", [-1, 2**64, 10**23])
def test_seed_must_be_in_the_generators_range(seed):
    with pytest.raises(ValueError, match=r"seed: expected an integer from 0 to 2\*\*64 - 1"):
        make_generator(seed)


def test_seed_range_ends_are_distinct_seeds():
    x = torch.randn(8, 100)
    assert not torch.equal(sample(x, make_generator(0)), sample(x, make_generator(2**64 - 1)))
