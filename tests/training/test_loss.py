"""Label-smoothed cross-entropy (seed 003) against torch's label_smoothing and the formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnkit.training.loss import label_smoothed_cross_entropy

PAD = 0


def random_case(n=37, c=11, seed=0, pad_fraction=0.3, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, c, generator=g) * 3).to(dtype)
    target = torch.randint(1, c, (n,), generator=g)
    target[torch.rand(n, generator=g) < pad_fraction] = PAD
    return logits, target


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_equals_torch_label_smoothing_with_padding(epsilon, reduction):
    logits, target = random_case()
    assert (target == PAD).any() and (target != PAD).any()
    got = label_smoothed_cross_entropy(
        logits, target, epsilon=epsilon, ignore_index=PAD, reduction=reduction
    )
    want = F.cross_entropy(
        logits, target, ignore_index=PAD, label_smoothing=epsilon, reduction=reduction
    )
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_float32_matches_torch_to_rounding():
    logits, target = random_case(n=500, c=300, dtype=torch.float32)
    got = label_smoothed_cross_entropy(logits, target, ignore_index=PAD, reduction="none")
    want = F.cross_entropy(logits, target, ignore_index=PAD, label_smoothing=0.1, reduction="none")
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_equals_seed_003_formula_written_out():
    """smooth = (1 - eps) * one_hot + eps / C, loss = -sum_c smooth_c log p_c."""
    logits, target = random_case(pad_fraction=0.0)
    eps, c = 0.1, logits.shape[1]
    smooth = (1 - eps) * F.one_hot(target, c).double() + eps / c
    want = -(smooth * torch.log_softmax(logits, dim=-1)).sum(-1)
    got = label_smoothed_cross_entropy(logits, target, epsilon=eps, reduction="none")
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_padding_contributes_nothing():
    logits, target = random_case()
    logits.requires_grad_(True)
    loss = label_smoothed_cross_entropy(logits, target, ignore_index=PAD, reduction="sum")
    loss.backward()
    pad = target == PAD
    assert torch.all(logits.grad[pad] == 0) and torch.all(logits.grad[~pad] != 0)
    changed = logits.detach().clone()
    changed[pad] = 100.0
    again = label_smoothed_cross_entropy(changed, target, ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(again, loss.detach(), rtol=0, atol=0)


def test_half_precision_logits_use_float32_softmax():
    logits, target = random_case(dtype=torch.float32)
    got = label_smoothed_cross_entropy(logits.bfloat16(), target, ignore_index=PAD)
    want = F.cross_entropy(logits.bfloat16().float(), target, ignore_index=PAD, label_smoothing=0.1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_bad_arguments():
    logits, target = random_case()
    with pytest.raises(ValueError, match=r"logits: expected shape \(N, C\)"):
        label_smoothed_cross_entropy(logits[None], target)
    with pytest.raises(ValueError, match=r"target: expected shape \(37,\)"):
        label_smoothed_cross_entropy(logits, target[:5])
    with pytest.raises(ValueError, match=r"epsilon: expected a number in \[0, 1\), got 1.0"):
        label_smoothed_cross_entropy(logits, target, epsilon=1.0)
    with pytest.raises(ValueError, match=r"reduction: expected one of"):
        label_smoothed_cross_entropy(logits, target, reduction="max")
