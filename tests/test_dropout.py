"""attnkit.dropout: the mask's distribution, the scale, the gradient, seeding, and the paths
that stay torch's dropout. Expected keep rates are computed from p (2^-15 rounding written out
here), counts are checked against binomial bounds on fixed seeds."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnkit.dropout import Dropout, dropout, keep_mask


def expected_keep(p: float) -> float:
    return 1.0 - round(p * 32768) / 32768


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_keep_rate_and_scale(p):
    torch.manual_seed(0)
    n = 1 << 20
    keep, scale = keep_mask((n,), p)
    assert keep.dtype == torch.bool and keep.shape == (n,)
    rate = expected_keep(p)
    assert abs(rate - (1 - p)) <= 2**-16
    assert scale * rate == pytest.approx(1.0, rel=1e-12)  # expectation kept exactly
    sigma = math.sqrt(rate * (1 - rate) / n)
    assert abs(keep.float().mean().item() - rate) < 6 * sigma


def test_every_lane_of_a_random_word_has_the_same_rate():
    """Four elements share one 64-bit draw whose top bit is always 0: each of the four lanes
    (element index mod 4) must still be kept with probability 1 - p."""
    torch.manual_seed(1)
    n = 1 << 20
    keep, _ = keep_mask((n,), 0.5)
    sigma = math.sqrt(0.25 / (n // 4))
    for lane in range(4):
        assert abs(keep[lane::4].float().mean().item() - 0.5) < 6 * sigma, lane


def test_masks_are_independent_of_position_pairs():
    """Neighbouring elements (which come from the same draw) are uncorrelated."""
    torch.manual_seed(2)
    n = 1 << 20
    keep, _ = keep_mask((n,), 0.3)
    a, b = keep[0::2].float(), keep[1::2].float()
    both = (a * b).mean().item()
    rate = expected_keep(0.3)
    sigma = math.sqrt(rate**2 * (1 - rate**2) / (n // 2))
    assert abs(both - rate**2) < 6 * sigma


def test_seeded_like_torch_dropout_and_different_between_calls():
    x = torch.ones(4, 1000)
    torch.manual_seed(3)
    a = dropout(x, 0.4)
    torch.manual_seed(3)
    b = dropout(x, 0.4)
    assert torch.equal(a, b)
    assert not torch.equal(dropout(x, 0.4), dropout(x, 0.4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_values_are_zero_or_scaled_and_the_gradient_uses_the_same_mask(dtype):
    torch.manual_seed(4)
    x = (torch.rand(7, 33, dtype=torch.float64) + 0.5).to(dtype).requires_grad_()
    torch.manual_seed(5)
    y = dropout(x, 0.25)
    torch.manual_seed(5)
    keep, scale = keep_mask(x.shape, 0.25)
    assert y.dtype == dtype
    want = torch.where(keep, x.detach() * torch.tensor(scale, dtype=dtype), 0)
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    grad_out = torch.randn(x.shape, dtype=torch.float64).to(dtype)
    (grad,) = torch.autograd.grad(y, x, grad_out)
    torch.testing.assert_close(
        grad, torch.where(keep, grad_out * torch.tensor(scale, dtype=dtype), 0), rtol=0, atol=0
    )


def test_expectation_is_the_input():
    torch.manual_seed(6)
    x = torch.full((1 << 20,), 2.0, dtype=torch.float64)
    mean = dropout(x, 0.3).mean().item()
    rate = expected_keep(0.3)
    sigma = 2.0 * math.sqrt((1 - rate) / rate / x.numel())
    assert abs(mean - 2.0) < 6 * sigma


def test_identity_outside_training_or_without_dropout():
    x = torch.randn(3, 5)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x


def test_p_one_and_other_devices_are_torch_dropout():
    x = torch.randn(3, 5)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    meta = torch.empty(3, 5, device="meta")
    assert dropout(meta, 0.5).shape == (3, 5)  # not a CPU tensor: F.dropout


def test_nearly_one_drops_everything_without_inf():
    torch.manual_seed(7)
    x = torch.ones(1000)
    y = dropout(x, 1 - 2**-17)  # rounds to dropping all
    assert torch.equal(y, torch.zeros_like(x))


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_bad_probability(p):
    with pytest.raises(ValueError, match=r"p: expected a drop probability"):
        dropout(torch.ones(3), p)
    with pytest.raises(ValueError, match=r"p: expected a drop probability in \[0, 1\)"):
        keep_mask((3,), p)
    with pytest.raises(ValueError, match=r"p: expected a drop probability in \[0, 1\)"):
        keep_mask((3,), 1.0)


def test_module_is_an_nn_dropout_that_follows_train_and_eval():
    torch.manual_seed(8)
    layer = Dropout(0.5)
    assert isinstance(layer, nn.Dropout) and layer.p == 0.5
    assert repr(layer) == repr(nn.Dropout(0.5))
    x = torch.ones(2000)
    kept = (layer(x) != 0).float().mean().item()
    assert 0.45 < kept < 0.55
    layer.eval()
    assert torch.equal(layer(x), x)


def test_inplace_module_is_torch_inplace_dropout():
    torch.manual_seed(9)
    x = torch.ones(100)
    torch.manual_seed(9)
    want = F.dropout(torch.ones(100), 0.5, training=True)
    torch.manual_seed(9)
    Dropout(0.5, inplace=True)(x)
    assert torch.equal(x, want)
