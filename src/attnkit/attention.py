"""Scaled dot-product attention: the one numerical core of attnkit.

Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V   (seed notes 000-004)

Every module in attnkit calls :func:`scaled_dot_product_attention`. It has two paths that give
the same numbers:

* the readable path, the seed formula written out, which is the only one that can return the
  attention weights;
* the fast path, :func:`torch.nn.functional.scaled_dot_product_attention` (fused kernels, no
  T_q x T_k tensor in memory), taken whenever the weights are not asked for. When training on
  a CPU with short keys (<= 96) and no attention dropout, the fast path is instead
  ``_ShortAttention``: the same formula as three batched matmuls with an explicit backward,
  2-3x faster than the fused CPU kernel at translation lengths.

Mask convention (the only one in attnkit)
-----------------------------------------
A mask is a **boolean** tensor broadcastable to ``(..., T_q, T_k)`` where **True means "may
attend"**. A floating-point mask is *added* to the scores (0 keeps a score, ``-inf`` removes it).
Everything else (pad ids, key-padding masks with True = pad, lengths) is converted to this
convention at the edges with the helpers below. A query row that may attend to no key at all
gets all-zero weights and a zero output on every path, never NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "scaled_dot_product_attention",
    "causal_mask",
    "padding_mask",
    "lengths_to_mask",
]


# --------------------------------------------------------------------------- mask helpers


def causal_mask(
    q_len: int, k_len: int | None = None, *, device: torch.device | str | None = None
) -> Tensor:
    """Boolean causal mask (True = may attend), aligned to the end.

    Query ``i`` may see key ``j`` when ``j <= i + k_len - q_len``: with ``q_len == k_len`` that is
    the usual lower triangle; with fewer queries than keys (incremental decoding, where the
    queries are the last ``q_len`` positions) every query still sees itself and its past.

    Args:
        q_len: number of queries T_q.
        k_len: number of keys T_k (default ``q_len``).
        device: where to build the mask.

    Returns:
        Tensor of shape (T_q, T_k), dtype bool.
    """
    k_len = q_len if k_len is None else k_len
    if q_len < 0 or k_len < 0:
        raise ValueError(f"causal_mask: lengths must be >= 0, got q_len={q_len}, k_len={k_len}")
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    return torch.tril(ones, diagonal=k_len - q_len)  # (T_q, T_k)


def lengths_to_mask(
    lengths: Tensor, max_len: int | None = None, *, device: torch.device | str | None = None
) -> Tensor:
    """Key mask from sequence lengths: True for real positions, False for padding.

    Args:
        lengths: (B,) integer lengths.
        max_len: padded length T (default ``lengths.max()``).

    Returns:
        Tensor (B, 1, T) bool, broadcastable to (B, T_q, T) and, in :class:`MultiHeadAttention`,
        to (B, H, T_q, T).
    """
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(
            f"lengths: expected a 1-D integer tensor, got shape {tuple(lengths.shape)} "
            f"dtype {lengths.dtype}"
        )
    device = lengths.device if device is None else device
    max_len = int(lengths.max()) if max_len is None and lengths.numel() else (max_len or 0)
    positions = torch.arange(max_len, device=device)  # (T,)
    return (positions[None, :] < lengths.to(device)[:, None]).unsqueeze(1)  # (B, 1, T)


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Key mask from token ids: True where ``ids != pad_id``.

    Args:
        ids: (B, T) token ids.
        pad_id: the padding id.

    Returns:
        Tensor (B, 1, T) bool (see :func:`lengths_to_mask` for how it broadcasts).
    """
    if ids.dim() != 2:
        raise ValueError(f"ids: expected shape (B, T), got {tuple(ids.shape)}")
    return (ids != pad_id).unsqueeze(1)  # (B, 1, T)


# --------------------------------------------------------------------------- validation


def _broadcast(*shapes) -> tuple[int, ...] | None:
    """numpy/torch broadcasting of shape tuples, or None when they do not broadcast.

    Plain Python on purpose: ``torch.broadcast_shapes`` imports sympy on its first call (about
    1.5 s per process), a cost every command would pay.
    """
    ndim = max(len(s) for s in shapes)
    result = []
    for dims in zip(*((1,) * (ndim - len(s)) + tuple(s) for s in shapes), strict=True):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            return None
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def _check_inputs(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, dropout: float):
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(
                f"{name}: expected shape (..., T, d) with at least 2 dims, got {tuple(t.shape)}"
            )
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            f"query, key, value: expected one dtype, got {query.dtype}, {key.dtype}, {value.dtype}"
        )
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            f"query/key: d_k must match, got query (..., T_q, {query.shape[-1]}) and "
            f"key (..., T_k, {key.shape[-1]})"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            f"key/value: T_k must equal T_v, got key {tuple(key.shape)} and value "
            f"{tuple(value.shape)}"
        )
    batch = _broadcast(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    if batch is None:
        raise ValueError(
            f"query/key/value: leading (batch, head) dims do not broadcast: query "
            f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if not (isinstance(dropout, (int, float)) and 0.0 <= dropout < 1.0):
        raise ValueError(f"dropout: expected a probability in [0, 1), got {dropout!r}")
    target = (*batch, query.shape[-2], key.shape[-2])
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask: expected a torch.Tensor, got {type(mask).__name__}")
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise TypeError(
                f"mask: expected dtype bool (True = may attend) or a floating-point additive "
                f"mask, got {mask.dtype}"
            )
        if _broadcast(mask.shape, target) != target:
            raise ValueError(
                f"mask: shape {tuple(mask.shape)} does not broadcast to (..., T_q, T_k) = {target}"
            )
    return batch


def _merge_causal(mask: Tensor | None, q_len: int, k_len: int, device) -> Tensor:
    """Combine a user mask with the end-aligned causal mask (boolean result or additive float)."""
    causal = causal_mask(q_len, k_len, device=device)  # (T_q, T_k)
    if mask is None:
        return causal
    if mask.dtype == torch.bool:
        return mask & causal
    return mask.masked_fill(~causal, float("-inf"))


def _allowed(mask: Tensor) -> Tensor:
    """Boolean 'may attend' view of a boolean or additive mask."""
    return mask if mask.dtype == torch.bool else mask > float("-inf")


# --------------------------------------------------------------------------- the core


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    dropout: float = 0.0,
    scale: float | None = None,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(Q K^T * scale + mask) V, the seed formula, on any leading batch/head dims.

    Args:
        query: (..., T_q, d_k).
        key: (..., T_k, d_k).
        value: (..., T_k, d_v); d_v may differ from d_k.
        mask: boolean, True = may attend, or floating-point added to the scores; broadcastable
            to (..., T_q, T_k).
        causal: also forbid attending to later positions, aligned to the end when T_q != T_k
            (query ``i`` sees keys ``j <= i + T_k - T_q``).
        dropout: probability of dropping an attention weight (apply only in training).
        scale: score scale; default ``1 / sqrt(d_k)``.
        return_weights: also return the attention weights (forces the readable path).

    Returns:
        The output (..., T_q, d_v) in the input dtype, or ``(output, weights)`` with weights
        (..., T_q, T_k) when ``return_weights`` is true. Rows with no allowed key are zero.
    """
    batch = _check_inputs(query, key, value, mask, dropout)
    q_len, k_len = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)

    if causal and q_len == 1:
        causal = False  # end-aligned, a single query is the newest position: it sees every key
    if causal and (mask is not None or q_len != k_len or return_weights):
        mask, causal = _merge_causal(mask, q_len, k_len, query.device), False

    if return_weights:
        return _attention_readable(query, key, value, mask, dropout, scale)

    # Fast path. A row that may attend to nothing is given every key (so no kernel can produce
    # NaN, on any device) and its output is then zeroed: the same result as the readable path.
    row_ok = None
    if mask is not None:
        row_ok = _allowed(mask).any(dim=-1, keepdim=True)  # (..., T_q, 1)
        mask = mask.masked_fill(~row_ok, True if mask.dtype == torch.bool else 0.0)
        if mask.is_floating_point() and mask.dtype != query.dtype:
            # Softmax ignores a per-row constant: move each row's largest entry to 0 so that
            # large finite values (-1e9) cannot overflow to -inf in a narrower dtype.
            mask = mask.to(torch.promote_types(mask.dtype, query.dtype))
            mask = (mask - mask.amax(dim=-1, keepdim=True)).to(query.dtype)
    query, key, value = (
        t if tuple(t.shape[:-2]) == batch else t.expand(*batch, *t.shape[-2:])
        for t in (query, key, value)
    )
    if _use_short_kernel(query, key, value, mask, dropout):
        if causal:
            mask, causal = causal_mask(q_len, k_len, device=query.device), False
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                ~mask, float("-inf")
            )
        out = _ShortAttention.apply(query, key, value, mask, scale)  # (..., T_q, d_v)
    else:
        out = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=mask,
            dropout_p=dropout,
            is_causal=causal,
            scale=scale,
        )  # (..., T_q, d_v)
    if row_ok is not None:
        out = out * row_ok.to(out.dtype)
    return out


# Keys up to this length take the short-sequence training kernel on CPU (see _ShortAttention).
SHORT_KEYS_MAX = 96


def _use_short_kernel(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, dropout: float
) -> bool:
    """CPU training of short float32/float64 sequences without attention dropout."""
    return (
        query.device.type == "cpu"
        and key.shape[-2] <= SHORT_KEYS_MAX
        and dropout == 0.0
        and query.dtype in (torch.float32, torch.float64)
        and torch.is_grad_enabled()
        and any(t.requires_grad for t in (query, key, value))
        and (mask is None or not mask.requires_grad)
    )


class _ShortAttention(torch.autograd.Function):
    """The seed formula as three batched matmuls, with its backward written out.

    PyTorch's fused CPU kernel is tiled for long sequences; at translation lengths (T ~ 20)
    its forward and backward spend most of their time in per-tile overhead, and autograd's
    own backward of ``matmul`` on transposed 4-d views falls back to a slow per-matrix loop.
    Here the (N, T_q, T_k) weights are kept (small at these lengths) and the backward is
    four contiguous ``bmm`` calls:

        dV = P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(dP * P)) * scale,
        dQ = dS K,     dK = dS^T Q.

    The mask is additive here (the caller converts booleans) and every row has an allowed
    key (the caller opens empty rows and zeroes their output afterwards).
    """

    @staticmethod
    def forward(ctx, query, key, value, bias, scale):
        # query (..., T_q, d_k), key (..., T_k, d_k), value (..., T_k, d_v), same batch dims
        *batch, q_len, _ = query.shape
        k_len, v_dim = key.shape[-2], value.shape[-1]
        q = query.reshape(-1, q_len, query.shape[-1])  # (N, T_q, d_k)
        k = key.reshape(-1, k_len, key.shape[-1])  # (N, T_k, d_k)
        v = value.reshape(-1, k_len, v_dim)  # (N, T_k, d_v)
        scores = torch.bmm(q, k.transpose(1, 2)).mul_(scale)  # (N, T_q, T_k)
        if bias is not None:
            scores.view(*batch, q_len, k_len).add_(bias)
        weights = torch.softmax(scores, dim=-1)  # (N, T_q, T_k)
        ctx.save_for_backward(q, k, v, weights)
        ctx.scale = scale
        return torch.bmm(weights, v).view(*batch, q_len, v_dim)  # (..., T_q, d_v)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, weights = ctx.saved_tensors
        batch_shape = grad_out.shape[:-2]
        d_out = grad_out.reshape(-1, *grad_out.shape[-2:])  # (N, T_q, d_v)
        grad_v = torch.bmm(weights.transpose(1, 2), d_out)  # (N, T_k, d_v)
        d_weights = torch.bmm(d_out, v.transpose(1, 2))  # (N, T_q, T_k)
        row = (d_weights * weights).sum(dim=-1, keepdim=True)  # (N, T_q, 1)
        d_scores = d_weights.sub_(row).mul_(weights).mul_(ctx.scale)  # (N, T_q, T_k)
        grad_q = torch.bmm(d_scores, k)  # (N, T_q, d_k)
        grad_k = torch.bmm(d_scores.transpose(1, 2), q)  # (N, T_k, d_k)
        return (
            grad_q.view(*batch_shape, *grad_q.shape[-2:]),
            grad_k.view(*batch_shape, *grad_k.shape[-2:]),
            grad_v.view(*batch_shape, *grad_v.shape[-2:]),
            None,
            None,
        )


def _attention_readable(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, dropout: float, scale: float
) -> tuple[Tensor, Tensor]:
    """The seed formula written out; softmax in float32 for half-precision inputs."""
    compute = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    scores = torch.matmul(query.to(compute), key.to(compute).transpose(-2, -1)) * scale
    # scores: (..., T_q, T_k)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(compute)
    # A row of -inf everywhere would give 0/0 = NaN in softmax: give it zero weights instead.
    empty = scores.amax(dim=-1, keepdim=True) == float("-inf")  # (..., T_q, 1)
    weights = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    if dropout > 0.0:
        weights = F.dropout(weights, p=dropout)
    out = torch.matmul(weights, value.to(compute))  # (..., T_q, d_v)
    return out.to(query.dtype), weights.to(query.dtype)
