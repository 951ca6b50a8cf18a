"""The CPU kernels for short keys: the seed formula with its backward written out for training
(:class:`ShortAttention`), and as element-wise products for one query per row
(:func:`one_query_attention`, a decoding step in float32).

:func:`attnkit.attention.scaled_dot_product_attention` picks them (see ``_select_backend``
there) for keys no longer than :data:`SHORT_KEYS_MAX`; nothing else calls them.
"""

from __future__ import annotations

import math

import torch

from attnkit.dropout import dropout_mask
from attnkit.hardware import cpu_float_vector_width

__all__ = ["SHORT_KEYS_MAX", "ShortAttention", "one_query_attention"]

# Keys up to this length take the kernel: the (N, T_q, T_k) weights it keeps for the backward
# stay small, and PyTorch's fused CPU kernel, tiled for long sequences, is 2-3x slower here.
SHORT_KEYS_MAX = 96

HALF = (torch.bfloat16, torch.float16)


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    """``torch.softmax(scores, dim=-1)`` of float (N, T_q, T_k) scores, overwriting them.

    Rows shorter than one vector of torch's CPU kernels (:func:`cpu_float_vector_width`: 16
    floats with AVX-512, 8 with AVX2) take torch's element-by-element loop, 4-6x slower than
    the formula as separate vectorised passes (max, exp, sum, divide), which those rows use:
    the same weights to float32 rounding. A NaN score makes its row NaN in both forms.
    """
    width = scores.shape[-1]
    if scores.device.type != "cpu" or width == 0 or width >= cpu_float_vector_width():
        return torch.softmax(scores, dim=-1)
    scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()  # the largest entry of a row is 1
    return scores.div_(scores.sum(dim=-1, keepdim=True))


class ShortAttention(torch.autograd.Function):
    """softmax(Q K^T * scale + bias) V as three batched matmuls, with an explicit backward.

    PyTorch's fused CPU kernel is tiled for long sequences; at translation lengths (T ~ 20)
    its forward and backward spend most of their time in per-tile overhead (in bf16 training
    its backward is 8x slower than this kernel, docs/benchmarks.md), and autograd's own
    backward of ``matmul`` on transposed 4-d views falls back to a slow per-matrix loop. Here
    the (N, T_q, T_k) weights are kept (small at these lengths) and the backward is four
    contiguous ``bmm`` calls:

        dV = P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(dP * P)) * scale,
        dQ = dS K,     dK = dS^T Q.

    In bfloat16 or float16 the matmuls run in that dtype and the softmax (and, in training,
    its backward) in float32, as torch's fused kernel does. With ``dropout`` > 0 each weight
    is dropped with that probability after the softmax and the kept ones are scaled, as
    ``torch.nn.functional.scaled_dot_product_attention`` does (the mask from
    :func:`attnkit.dropout.dropout_mask`).

    Call as ``ShortAttention.apply(query, key, value, bias, scale[, dropout])``: query
    (..., T_q, d_k), key (..., T_k, d_k), value (..., T_k, d_v) with the same leading dims;
    ``bias`` None or an additive mask in the query's dtype broadcastable to (..., T_q, T_k) in
    which every row has a finite entry (the caller opens rows with no allowed key and zeroes
    them afterwards).
    """

    @staticmethod
    def forward(ctx, query, key, value, bias, scale, dropout=0.0):
        # query (..., T_q, d_k), key (..., T_k, d_k), value (..., T_k, d_v), same batch dims
        *batch, q_len, _ = query.shape
        k_len, v_dim = key.shape[-2], value.shape[-1]
        n = math.prod(batch)  # explicit, so that empty tensors reshape too
        q = query.reshape(n, q_len, query.shape[-1])  # (N, T_q, d_k)
        k = key.reshape(n, k_len, key.shape[-1])  # (N, T_k, d_k)
        v = value.reshape(n, k_len, v_dim)  # (N, T_k, d_v)
        scores = torch.bmm(q, k.transpose(1, 2))  # (N, T_q, T_k)
        if query.dtype in HALF:
            scores = scores.float()  # softmax (and its gradient) in float32
        scores.mul_(scale)
        if bias is not None:
            scores.view(*batch, q_len, k_len).add_(bias)
        weights = _softmax(scores)  # (N, T_q, T_k)
        probs, mask = weights, None
        if dropout > 0.0:
            mask = dropout_mask(
                weights.shape, dropout, dtype=weights.dtype, device=weights.device
            )  # (N, T_q, T_k): 0 or 1 / P(keep)
            probs = weights * mask
        ctx.save_for_backward(q, k, v, weights, mask)
        ctx.scale = scale
        return torch.bmm(probs.to(v.dtype), v).view(*batch, q_len, v_dim)  # (..., T_q, d_v)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, weights, mask = ctx.saved_tensors
        batch_shape = grad_out.shape[:-2]
        # contiguous: a broadcast gradient (from .sum()) would send bmm down a slow path
        d_out = grad_out.contiguous().view(q.shape[0], *grad_out.shape[-2:])  # (N, T_q, d_v)
        probs = weights if mask is None else weights * mask  # (N, T_q, T_k)
        grad_v = torch.bmm(probs.to(v.dtype).transpose(1, 2), d_out)  # (N, T_k, d_v)
        d_weights = torch.bmm(d_out, v.transpose(1, 2)).to(weights.dtype)  # (N, T_q, T_k)
        if mask is not None:
            d_weights.mul_(mask)
        row = (d_weights * weights).sum(dim=-1, keepdim=True)  # (N, T_q, 1)
        d_scores = d_weights.sub_(row).mul_(weights).mul_(ctx.scale).to(q.dtype)  # (N, T_q, T_k)
        grad_q = torch.bmm(d_scores, k)  # (N, T_q, d_k)
        grad_k = torch.bmm(d_scores.transpose(1, 2), q)  # (N, T_k, d_k)
        grads = (
            grad_q.view(*batch_shape, *grad_q.shape[-2:]),
            grad_k.view(*batch_shape, *grad_k.shape[-2:]),
            grad_v.view(*batch_shape, *grad_v.shape[-2:]),
            None,
            None,
            None,
        )
        return grads[: len(ctx.needs_input_grad)]  # called with or without ``dropout``


def one_query_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:  # fmt: skip
    """softmax(q K^T * scale + mask) V for one query per row, as element-wise products and
    sums over the keys' positions, without autograd.

    torch's fused CPU kernel multiplies each (row, head) by its keys with a BLAS call of one
    query row, a matrix-vector product; MKL runs those in generic code on a CPU that is not
    Intel's, about 1 us a call. At a step of the translation decoder (420-975 rows x 8
    heads, 8-40 keys in a position-major cache) this form was 1.5-1.9x faster on an AMD
    EPYC, and slower for a few rows in cache (one row of 8 heads: 28 against 9 us;
    docs/benchmarks.md, "Run 15"). The products are laid out position-major, (..., T_k, H,
    d), so that a position-major cache is read in its storage order.

    Args:
        query: (..., H, 1, d_k).
        key: (..., H, T_k, d_k), the same leading dims.
        value: (..., H, T_k, d_v).
        mask: None, or a boolean (True = may attend) or additive mask of at least 2 dims
            (as ``_prepare_mask`` gives it) broadcastable to (..., H, 1, T_k), in which every
            row has an allowed key.
        scale: the score scale.

    Returns:
        (..., H, 1, d_v), the query's dtype.
    """
    keys = key.transpose(-3, -2)  # (..., T_k, H, d_k)
    values = value.transpose(-3, -2)  # (..., T_k, H, d_v)
    scores = (query.transpose(-3, -2) * keys).sum(dim=-1)  # (..., T_k, H)
    scores.mul_(scale)
    if mask is not None:
        rows = mask.select(-2, 0)  # (..., H or 1, T_k): the one query's row
        rows = rows.transpose(-1, -2) if rows.dim() >= 2 else rows.unsqueeze(-1)  # (..., T_k, H)
        if rows.dtype == torch.bool:
            scores.masked_fill_(~rows, float("-inf"))
        else:
            scores.add_(rows)
    # softmax over the keys (dim -2), as separate passes: the largest score of each row is 1
    scores.sub_(scores.amax(dim=-2, keepdim=True)).exp_()
    weights = scores.div_(scores.sum(dim=-2, keepdim=True))  # (..., T_k, H)
    out = (weights.unsqueeze(-1) * values).sum(dim=-3)  # (..., H, d_v)
    return out.unsqueeze(-2)  # (..., H, 1, d_v)
