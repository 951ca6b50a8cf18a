"""Label-smoothed cross-entropy, written from seed 003's formula.

Seed 003 replaces the one-hot target of each position by

    smooth = (1 - eps) * one_hot + eps / C

over the C classes (the true class gets ``1 - eps + eps / C``, every other ``eps / C``), and
the loss is the cross-entropy against it, ``-sum_c smooth_c log p_c``. Expanding the sum
avoids building the (N, C) target:

    loss = (1 - eps) * (-log p_target) + eps * (-(1 / C) sum_c log p_c)

This is exactly ``torch.nn.functional.cross_entropy(..., label_smoothing=eps)``, which also
spreads ``eps`` over all C classes including the true one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

REDUCTIONS = ("mean", "sum", "none")


def label_smoothed_cross_entropy(
    logits: Tensor,
    target: Tensor,
    *,
    epsilon: float = 0.1,
    ignore_index: int | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Cross-entropy against seed 003's smoothed targets, skipping padding.

    Args:
        logits: (N, C) unnormalised scores, any float dtype (the softmax runs in float32 or
            wider).
        target: (N,) class ids.
        epsilon: smoothing mass in [0, 1); 0 gives the plain negative log-likelihood.
        ignore_index: a target id (the pad id) whose positions contribute nothing.
        reduction: "mean" (over the positions not ignored, like torch), "sum" or "none".

    Returns:
        A scalar float32 tensor, or (N,) losses with zeros at ignored positions for "none".
    """
    if logits.dim() != 2:
        raise ValueError(f"logits: expected shape (N, C), got {tuple(logits.shape)}")
    if target.shape != logits.shape[:1]:
        raise ValueError(
            f"target: expected shape ({logits.shape[0]},) to match logits "
            f"{tuple(logits.shape)}, got {tuple(target.shape)}"
        )
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon: expected a number in [0, 1), got {epsilon!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {list(REDUCTIONS)}, got {reduction!r}")

    compute = torch.promote_types(logits.dtype, torch.float32)
    log_probs = F.log_softmax(logits.to(compute), dim=-1)  # (N, C)
    keep = None if ignore_index is None else target != ignore_index  # (N,)
    safe_target = target if keep is None else target.masked_fill(~keep, 0)
    nll = -log_probs.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)  # (N,)
    loss = nll if epsilon == 0.0 else (1.0 - epsilon) * nll - epsilon * log_probs.mean(dim=-1)
    if keep is not None:
        loss = loss.masked_fill(~keep, 0.0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    count = target.numel() if keep is None else keep.sum()
    return loss.sum() / count
