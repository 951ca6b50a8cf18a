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


# --------------------------------------------------------------- fused projection + loss


def linear_case(n=53, d=12, c=37, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    weight = (torch.randn(c, d, generator=g, dtype=dtype) * 0.5).requires_grad_()
    target = torch.randint(0, c, (n,), generator=g)
    return hidden, weight, target


def grads_of(loss, *tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk_size", [1, 7, 53, 1000])
def test_linear_cross_entropy_equals_torch_loss_and_gradients(epsilon, chunk_size):
    from attnkit.training.loss import linear_cross_entropy

    hidden, weight, target = linear_case()
    got = linear_cross_entropy(hidden, weight, target, epsilon=epsilon, chunk_size=chunk_size)
    want = F.cross_entropy(hidden @ weight.T, target, label_smoothing=epsilon, reduction="sum")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-10)
    for g, w in zip(grads_of(got, hidden, weight), grads_of(want, hidden, weight), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_linear_cross_entropy_float32_large_vocabulary():
    from attnkit.training.loss import linear_cross_entropy

    hidden, weight, target = linear_case(n=300, d=32, c=2000, dtype=torch.float32)
    got = linear_cross_entropy(hidden, weight, target, epsilon=0.1, chunk_size=128)
    want = label_smoothed_cross_entropy(hidden @ weight.T, target, epsilon=0.1, reduction="sum")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)
    for g, w in zip(grads_of(got, hidden, weight), grads_of(want, hidden, weight), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_linear_cross_entropy_scales_the_incoming_gradient_and_accumulates():
    from attnkit.training.loss import linear_cross_entropy

    hidden, weight, target = linear_case()
    (2.5 * linear_cross_entropy(hidden, weight, target, chunk_size=10)).backward()
    (0.5 * linear_cross_entropy(hidden, weight, target, chunk_size=10)).backward()  # adds
    want = 3.0 * F.cross_entropy(hidden @ weight.T, target, label_smoothing=0.1, reduction="sum")
    want_h, want_w = grads_of(want, hidden, weight)
    torch.testing.assert_close(hidden.grad, want_h)
    torch.testing.assert_close(weight.grad, want_w)


def test_linear_cross_entropy_gradcheck():
    from attnkit.training.loss import linear_cross_entropy

    hidden, weight, target = linear_case(n=9, d=4, c=6)
    assert torch.autograd.gradcheck(
        lambda h, w: linear_cross_entropy(h, w, target, epsilon=0.2, chunk_size=4),
        (hidden, weight),
    )


def test_linear_cross_entropy_without_grad_and_under_bf16_autocast():
    from attnkit.training.loss import linear_cross_entropy

    hidden, weight, target = linear_case(n=64, d=16, c=50, dtype=torch.float32)
    with torch.no_grad():
        got = linear_cross_entropy(hidden, weight, target)
    want = F.cross_entropy(hidden @ weight.T, target, label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(got, want.detach())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_cross_entropy(hidden, weight, target, chunk_size=16)
        plain = F.cross_entropy(
            (hidden @ weight.T).float(), target, label_smoothing=0.1, reduction="sum"
        )
    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused, plain, rtol=2e-2, atol=0.5)  # bf16 matmuls on both sides
    g_fused = grads_of(fused, hidden, weight)
    assert all(g.dtype == torch.float32 for g in g_fused)
    for g, w in zip(g_fused, grads_of(plain, hidden, weight), strict=True):
        torch.testing.assert_close(g, w, rtol=5e-2, atol=5e-2)


def test_linear_cross_entropy_rejects_bad_input():
    from attnkit.training.loss import linear_cross_entropy

    hidden, weight, target = linear_case()
    with pytest.raises(ValueError, match="share d"):
        linear_cross_entropy(hidden, weight[:, :5], target)
    with pytest.raises(ValueError, match="target"):
        linear_cross_entropy(hidden, weight, target[:3])
    with pytest.raises(ValueError, match="epsilon"):
        linear_cross_entropy(hidden, weight, target, epsilon=1.0)
    with pytest.raises(ValueError, match="chunk_size"):
        linear_cross_entropy(hidden, weight, target, chunk_size=0)


def test_linear_cross_entropy_products_take_few_shapes(monkeypatch):
    """The last chunk is padded to a multiple of ROW_MULTIPLE rows, so that a run whose token
    count changes at every step meets a handful of matmul shapes (oneDNN compiles one kernel
    per shape), and the padding changes nothing (the result equals torch's)."""
    from attnkit.training import loss as loss_module

    shapes = set()
    mm = torch.mm

    def recording_mm(a, b, **kwargs):
        shapes.add((tuple(a.shape), tuple(b.shape)))
        return mm(a, b, **kwargs)

    monkeypatch.setattr(loss_module.torch, "mm", recording_mm)
    for n in range(130, 260, 3):  # 44 token counts
        hidden, weight, target = linear_case(n=n, d=8, c=11)
        got = loss_module.linear_cross_entropy(hidden, weight, target, chunk_size=128)
        want = F.cross_entropy(hidden @ weight.T, target, label_smoothing=0.1, reduction="sum")
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-10)
        for g, w in zip(grads_of(got, hidden, weight), grads_of(want, hidden, weight), strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    rows = {a[0] for a, _ in shapes}
    assert rows <= {64, 128}, rows  # full chunks of 128, last chunks padded to 64 or 128
