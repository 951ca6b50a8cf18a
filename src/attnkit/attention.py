"""Scaled dot-product attention: the one numerical core of attnkit.

Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V   (seed notes 000-004)

Every module in attnkit calls :func:`scaled_dot_product_attention`. Four backends compute it
and give the same numbers; ``_select_backend`` picks one per call, by the rule written there:

* ``readable``: the seed formula written out, the only one that can return the weights, and
  the reference for how NaN and inf propagate;
* ``short``: :class:`~attnkit.attention_short.ShortAttention`, the same formula as three batched
  matmuls with an explicit backward, for CPU training with short keys (2-3x faster there);
* ``step``: :func:`~attnkit.attention_short.one_query_attention`, element-wise products for
  one query per row over a position-major cache, a float32 decoding step on a CPU where MKL
  runs torch's kernel in generic code;
* ``fused``: :func:`torch.nn.functional.scaled_dot_product_attention` (fused kernels, no
  T_q x T_k tensor in memory), everywhere else.

Two rules narrow what a query sees, and two shapes share keys between heads:

* ``causal``: query ``i`` sees keys ``j <= i`` (aligned to the end when T_q < T_k);
* ``window=N`` (sliding-window attention, Mistral): query ``i`` sees keys ``i - N < j <= i``, the
  causal rule with a lower bound, aligned the same way; combined with any mask;
* grouped-query attention (GQA, MQA): key and value may have fewer heads (dim -3) than the
  query, H_kv dividing H; key/value head ``j`` serves query heads ``j * G .. j * G + G - 1``
  (G = H / H_kv), as if repeated with ``repeat_interleave(G, dim=-3)``, which only the readable
  and short paths do; the fused path gives torch's kernel the H_kv heads (``enable_gqa``, or,
  for a single query, the G queries that share a key head as one row of G queries).

Mask convention (the only one in attnkit)
-----------------------------------------
A mask is a **boolean** tensor broadcastable to ``(..., T_q, T_k)`` where **True means "may
attend"**. A floating-point mask is *added* to the scores (0 keeps a score, ``-inf`` removes it).
Everything else (pad ids, key-padding masks with True = pad, lengths) is converted to this
convention at the edges with the helpers below.

Rows and non-finite values (the same on every backend)
------------------------------------------------------
* A query row that may attend to no key at all (masked everywhere, or ``T_k == 0``) gets
  all-zero weights and a zero output, whatever the inputs hold, never NaN.
* Otherwise row ``i`` depends only on query ``i``, mask row ``i`` and the keys and values that
  row may attend to; a key it may not attend to never enters its arithmetic. A NaN or inf among
  those inputs (or a NaN / +inf mask entry) propagates as IEEE arithmetic of the formula says,
  so a NaN query gives a NaN row, never a quietly zero one. The readable path implements
  exactly this; a fast result that shows NaN or inf inputs is computed again there.

Why one module of about 400 lines: the input checks, the backend rule, the mask preparation and
the readable path are one contract (the conventions above), and every backend must honour all
of it; kept together, a change to the contract is read and made in one place. The CPU kernels
for short keys, which only compute, are apart in :mod:`attnkit.attention_short`.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.attention_short import SHORT_KEYS_MAX, ShortAttention, one_query_attention
from attnkit.hardware import cpu_attention_has_amx, mkl_gemv_is_generic

__all__ = [
    "scaled_dot_product_attention",
    "causal_mask",
    "kv_groups",
    "padding_mask",
    "lengths_to_mask",
]


# --------------------------------------------------------------------------- mask helpers


def causal_mask(
    q_len: int,
    k_len: int | None = None,
    *,
    window: int | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Boolean causal mask (True = may attend), aligned to the end; a band with ``window``.

    Query ``i`` may see key ``j`` when ``j <= i + k_len - q_len``: with ``q_len == k_len`` that is
    the usual lower triangle; with fewer queries than keys (incremental decoding, where the
    queries are the last ``q_len`` positions) every query still sees itself and its past. With
    ``window=N`` also ``j > i + k_len - q_len - N``: each query sees itself and the N - 1 keys
    before it (sliding-window attention).

    Args:
        q_len: number of queries T_q.
        k_len: number of keys T_k (default ``q_len``).
        window: how many keys, itself included, a query sees at most (None: all before it).
        device: where to build the mask.

    Returns:
        Tensor of shape (T_q, T_k), dtype bool.
    """
    k_len = q_len if k_len is None else k_len
    if not all(_is_count(n) for n in (q_len, k_len)):
        raise ValueError(
            f"causal_mask: lengths must be integers >= 0, got q_len={q_len!r}, k_len={k_len!r}"
        )
    window = check_window(window)
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    mask = torch.tril(ones, diagonal=k_len - q_len)  # (T_q, T_k)
    if window is not None:
        mask = torch.triu(mask, diagonal=k_len - q_len - window + 1)  # (T_q, T_k), a band
    return mask


def _is_count(n: object) -> bool:
    return isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 0  # numpy too


def check_window(window: int | None) -> int | None:
    """``window`` as an int (a numpy integer too, as lengths take) or None; a ValueError naming
    it for anything else (a bool, a float, a value < 1). Every module that takes a sliding
    window checks it here."""
    if window is not None and not (_is_count(window) and window >= 1):
        raise ValueError(f"window: expected an integer >= 1 or None, got {window!r}")
    return None if window is None else int(window)


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

    Raises:
        ValueError: for lengths that are not a 1-D integer tensor, a negative length, a
            ``max_len`` that is not an integer >= 0 or is shorter than a length (the mask would
            cut that sequence).
    """
    if (
        not isinstance(lengths, Tensor)
        or lengths.dim() != 1
        or lengths.is_floating_point()
        or lengths.is_complex()
        or lengths.dtype == torch.bool
    ):
        got = (
            f"shape {tuple(lengths.shape)} dtype {lengths.dtype}"
            if isinstance(lengths, Tensor)
            else type(lengths).__name__
        )
        raise ValueError(f"lengths: expected a 1-D integer tensor, got {got}")
    if max_len is not None and not _is_count(max_len):
        raise ValueError(f"max_len: expected an integer >= 0 or None, got {max_len!r}")
    device = lengths.device if device is None else device
    if lengths.numel():
        low, high = (int(v) for v in lengths.aminmax())
        if low < 0:
            raise ValueError(f"lengths: expected lengths >= 0, got {low}")
        if max_len is not None and high > max_len:
            raise ValueError(
                f"max_len={max_len} is shorter than the longest length {high}: the mask would "
                "cut that sequence"
            )
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
    if isinstance(pad_id, bool) or not isinstance(pad_id, numbers.Integral):
        raise TypeError(f"pad_id: expected an integer token id, got {pad_id!r}")
    return (ids != pad_id).unsqueeze(1)  # (B, 1, T)


# --------------------------------------------------------------------------- validation


def _broadcast(*shapes) -> tuple[int, ...] | None:
    """numpy/torch broadcasting of shape tuples, or None when they do not broadcast.

    Plain Python on purpose: ``torch.broadcast_shapes`` imports sympy on its first call (about
    1.5 s per process), a cost every command would pay.
    """
    if all(shape == shapes[0] for shape in shapes[1:]):  # the same shape broadcasts to itself
        return tuple(shapes[0])
    ndim = max(map(len, shapes))
    result = [1] * ndim
    for shape in shapes:
        for i, d in enumerate(shape, ndim - len(shape)):  # aligned to the last dim
            if d != 1:
                # Two comparisons, not `in (1, d)`: dynamo traced that one as False for a
                # symbolic key length equal to the mask's (a compiled step's padding mask).
                if result[i] != 1 and result[i] != d:
                    return None
                result[i] = d
    return tuple(result)


def kv_groups(query: Tensor, key: Tensor, value: Tensor) -> int:
    """How many query heads share one key/value head: G = H / H_kv when key and value have
    fewer heads (dim -3) than the query and H_kv divides H (grouped-query attention), else 1."""
    if min(query.dim(), key.dim(), value.dim()) < 3:
        return 1
    heads, kv_heads = query.shape[-3], key.shape[-3]
    if value.shape[-3] != kv_heads or not 0 < kv_heads < heads or heads % kv_heads:
        return 1
    return heads // kv_heads


def _check_inputs(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    dropout: float,
    scale: float | None,
) -> tuple[tuple[int, ...], int]:
    """Raise on bad input (every backend sees the same checks); return the broadcast batch dims
    (the query's heads included) and the query heads per key/value head (:func:`kv_groups`)."""
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
    if query.shape[-1] == 0 and scale is None:
        raise ValueError(
            f"query/key: d_k must be >= 1 for the default scale 1/sqrt(d_k), got query "
            f"{tuple(query.shape)}"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            f"key/value: T_k must equal T_v, got key {tuple(key.shape)} and value "
            f"{tuple(value.shape)}"
        )
    groups = kv_groups(query, key, value)
    if groups > 1:
        lead = _broadcast(query.shape[:-3], key.shape[:-3], value.shape[:-3])
        batch = None if lead is None else (*lead, query.shape[-3])
    else:
        batch = _broadcast(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    if batch is None:
        raise ValueError(
            f"query/key/value: leading (batch, head) dims do not broadcast: query "
            f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)} (for "
            "grouped-query attention the query's heads, dim -3, must be a multiple of the "
            "key/value heads)"
        )
    if isinstance(dropout, bool) or not (
        isinstance(dropout, numbers.Real) and 0.0 <= dropout < 1.0
    ):
        raise ValueError(f"dropout: expected a probability in [0, 1), got {dropout!r}")
    if scale is not None and not (
        isinstance(scale, numbers.Real) and not isinstance(scale, bool) and math.isfinite(scale)
    ):
        raise ValueError(f"scale: expected a finite number or None, got {scale!r}")
    if mask is not None:
        target = (*batch, query.shape[-2], key.shape[-2])
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask: expected a torch.Tensor, got {type(mask).__name__}")
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise TypeError(
                f"mask: expected dtype bool (True = may attend) or a floating-point additive "
                f"mask, got {mask.dtype}"
            )
        if _broadcast(mask.shape, target) != target:
            hint = ""
            if mask.dim() == 2 and len(target) > 2 and tuple(mask.shape) == (target[0], target[-1]):
                # The shape of a key padding mask (B, T_k): torch.nn's key_padding_mask form.
                ones = len(target) - 2
                hint = (
                    f" (a key mask (B, T_k) is given as (B, {'1, ' * ones}T_k): "
                    f"mask[:, {'None, ' * ones}:])"
                )
            raise ValueError(
                f"mask: shape {tuple(mask.shape)} does not broadcast to (..., T_q, T_k) = "
                f"{target}{hint}"
            )
    return batch, groups


# --------------------------------------------------------------------------- backend and mask

READABLE, SHORT, STEP, FUSED = "readable", "short", "step", "fused"
# Half-precision inference on a CPU with AMX for the dtype: torch's fused kernel up to this many
# query rows (batch x heads x T_q), three matmuls above (docs/benchmarks.md, "Run 10").
AMX_FUSED_MAX_ROWS = 512


@torch.compiler.assume_constant_result
def _attention_has_amx(dtype: torch.dtype) -> bool:
    """:func:`~attnkit.hardware.cpu_attention_has_amx`, taken as a constant where
    ``torch.compile`` traces a call (its checks call functions that dynamo does not trace): a
    compiled step keeps the path chosen when it was compiled."""
    return cpu_attention_has_amx(dtype)


@torch.compiler.assume_constant_result
def _gemv_is_generic() -> bool:
    """:func:`~attnkit.hardware.mkl_gemv_is_generic`, a constant where ``torch.compile``
    traces a call (as :func:`_attention_has_amx`)."""
    return mkl_gemv_is_generic()


def _select_backend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    *,
    dropout: float,
    return_weights: bool,
) -> str:
    """The backend for one call. The rule, first match wins:

    1. ``readable`` when the weights are asked for (only it makes them);
    2. ``short`` on a CPU with keys at most ``SHORT_KEYS_MAX`` long, no gradient for the
       mask, as many key/value heads as query heads, and either autograd recording the call
       (training, in any float dtype, with or without attention dropout: torch's fused CPU
       kernel is 2x slower in float32, 8-12x slower in bfloat16, and takes its unfused math
       path with dropout) or, without autograd and without dropout, bfloat16 or float16
       (inference, where torch's fused CPU kernel is 1.3-3x slower than three matmuls at
       translation lengths; in float32 it is as fast; docs/benchmarks.md), except on a CPU
       with AMX for its dtype (:func:`~attnkit.hardware.cpu_attention_has_amx`), where
       torch's kernel runs half precision on AMX tiles: a single query per row (it reads the
       cache slice in place and is 2.1-2.4x faster) or at most :data:`AMX_FUSED_MAX_ROWS`
       query rows in all (batch x heads x T_q: the cross-attention of a few sentences' beams,
       2-3x faster there; the three matmuls' fixed cost is oneDNN's per call). This rule reads
       the batch size, so on such a CPU a half-precision row can round differently alone and
       in a batch (the README's note on bfloat16);
    3. ``step`` (:func:`~attnkit.attention_short.one_query_attention`) for float32 without
       dropout, one query per row and position-major keys and values (any (B, T, H, d)
       buffer viewed as (B, H, T, d): the translation decoder's self-attention cache, a
       projection split into heads) where MKL runs torch's kernel in its generic code
       (:func:`~attnkit.hardware.mkl_gemv_is_generic`: a CPU that is not Intel's), one
       matrix-vector product per row and head. A beam search on test2016 made 1.03-1.11x
       the sentences/s with one worker on an AMD EPYC, 1.01x with two (within the noise),
       the same translations; for a few rows in cache the step kernel is slower (one row of
       8 heads: 28 against 9 us; docs/benchmarks.md, "Run 15"). The rule reads the layout,
       not the batch size, so that a sentence's translation does not depend on its batch;
    4. ``fused`` otherwise.

    Afterwards, a ``short``, ``step`` or ``fused`` result that :func:`_fast_result_trusted`
    rejects (NaN or inf inputs reached it) is computed again on the readable path, the
    reference for how non-finite values propagate, where the kernels differ.
    """
    if return_weights:
        return READABLE
    if (
        query.device.type != "cpu"
        or key.shape[-2] > SHORT_KEYS_MAX
        or (mask is not None and mask.requires_grad)
        or (key.dim() >= 3 and query.dim() >= 3 and key.shape[-3] != query.shape[-3])
    ):
        return FUSED
    recording = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    half = query.dtype in (torch.bfloat16, torch.float16)
    if recording:
        return SHORT
    if half and dropout == 0.0:
        few = query.shape[-2] == 1 or query.numel() <= AMX_FUSED_MAX_ROWS * query.shape[-1]
        if not (few and _attention_has_amx(query.dtype)):
            return SHORT
    if (
        query.dtype == torch.float32
        and query.shape[-2] == 1
        and _position_major(key)
        and _position_major(value)
        and dropout == 0.0
        and _gemv_is_generic()
    ):
        return STEP
    return FUSED


def _position_major(t: Tensor) -> bool:
    """Whether ``t`` (..., H, T, d) holds each position's heads side by side (a view of a
    (..., T, H, d) buffer, as the translation decoder's self-attention cache), so that one
    head's positions are not adjacent in memory."""
    return t.dim() >= 3 and t.shape[-3] > 1 and t.shape[-2] > 1 and t.stride(-3) < t.stride(-2)


def _fast_result_trusted(out: Tensor, backend: str) -> bool:
    """Whether a fast kernel's output holds no trace of NaN or inf inputs.

    Finite inputs always pass. NaN or inf inputs reach the output as NaN or inf, except in
    torch's fused CPU kernel, which gives a row whose scores are all NaN the zeros of a fully
    masked row: there a row of zeros fails too (a real one only costs a second, readable
    pass). A few reductions over the output, which has one row per query: the row sums first,
    and only when one of them is exactly 0 (which also happens by chance, half-precision
    values cancelling: about one call in eight of a bf16 beam search) or too small to invert
    (subnormal) each row's largest magnitude, to tell a row of zeros from a sum that cancels.
    A meta tensor (a shape without data: ``torch.device("meta")``) has nothing to check.
    """
    out = out.detach()
    if out.numel() == 0 or out.is_meta:
        return True
    # float16 sums can overflow (65,504) where the values are finite: sum in float32 there.
    # bfloat16 has float32's range and torch sums it in float32, then rounds: no cast needed
    # (a cast copies the whole output, 0.1 ms at a 500-row decoding step).
    wide = torch.float32 if out.dtype == torch.float16 else None
    if backend in (SHORT, STEP):  # their softmax turns NaN scores into NaN rows, never zeros
        return math.isfinite(float(out.sum(dtype=wide)))
    rows = out.sum(dim=-1, dtype=wide).reshape(-1)  # (rows,)
    # The sum of rows * (1 / rows): finite (1 per row) only if every row sum is finite and none
    # is 0 (0 * inf, inf * 0 and NaN are NaN); one dot product where a sum took three
    # operators. A sum so small that 1 / sum overflows fails it too and goes to the tests below.
    if math.isfinite(float(torch.dot(rows, rows.reciprocal()))):
        return True
    if not math.isfinite(float(rows.sum())):  # NaN or inf reached a row
        return False
    return not bool((out.abs().amax(dim=-1) == 0).any())  # no row of zeros


class _PreparedMask(NamedTuple):
    mask: Tensor | None  # as the backend takes it; every row has an allowed key
    causal: bool  # left to the fused kernel's is_causal
    empty: Tensor | None  # (..., T_q, 1) True for rows with no allowed key, or None if none


def _prepare_mask(
    mask: Tensor | None,
    *,
    causal: bool,
    window: int | None,
    q_len: int,
    k_len: int,
    backend: str,
    dtype: torch.dtype,
    device: torch.device,
) -> _PreparedMask:
    """The mask the chosen backend takes, built once.

    * A 0-d or 1-D mask is viewed as 2-D, so that it broadcasts in every kernel.
    * ``causal`` is merged into the mask, unless the fused kernel can apply it alone (no other
      mask, T_q == T_k: torch's ``is_causal`` is start-aligned, ours end-aligned). A single query
      is the newest position: it sees every key, except those a ``window`` leaves out. A window
      that reaches back over every key changes nothing and is dropped.
    * Rows with no allowed key are found (``empty``) and given every key, so that no kernel
      makes NaN from them; the caller zeroes their output. Meta tensors have no rows to look at.
    * The short kernel takes an additive mask in the query's dtype. A float mask in another
      dtype is shifted so that each row's largest entry is 0 before the cast (softmax ignores a
      per-row constant), so large finite values (-1e9) cannot overflow in a narrower dtype. Every
      backend, the readable one included, takes it so shifted: a row of -1e9 everywhere is
      then the row's own scores, on every path (unshifted, float32 arithmetic would lose the
      scores against -1e9 and give equal weights on one path only).
    """
    if mask is not None and mask.dim() < 2:
        mask = mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))  # (1, T_k) or (1, 1)
    causal = causal and q_len > 1
    window = window if window is not None and window < k_len else None
    if window is not None or (causal and (mask is not None or q_len != k_len or backend != FUSED)):
        allowed = causal_mask(q_len, k_len, window=window, device=device)  # (T_q, T_k)
        if mask is None:
            mask = allowed
        elif mask.dtype == torch.bool:
            mask = mask & allowed
        else:
            mask = mask.masked_fill(~allowed, float("-inf"))
        causal = False
    if mask is None:
        return _PreparedMask(None, causal, None)

    is_bool = mask.dtype == torch.bool
    allowed = mask if is_bool else mask != float("-inf")
    seen = allowed.any(dim=-1, keepdim=True)  # (..., T_q, 1): rows with an allowed key
    empty = None
    # meta: no data, only the output's shape. While dynamo traces (torch.compile), the rows
    # are filled and zeroed whether or not one is empty (the same values, no branch on data).
    if torch.compiler.is_dynamo_compiling() or (not seen.is_meta and not bool(seen.all())):
        empty = ~seen
        mask = mask.masked_fill(empty, True if is_bool else 0.0)
    if backend == SHORT and is_bool:
        additive = torch.zeros(mask.shape, dtype=dtype, device=device)
        mask = additive.masked_fill(~mask, float("-inf"))
    elif not is_bool and mask.dtype != dtype:
        wide = mask.to(torch.promote_types(mask.dtype, dtype))
        mask = (wide - wide.amax(dim=-1, keepdim=True)).to(dtype)
    return _PreparedMask(mask, causal, empty)


# --------------------------------------------------------------------------- the core


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    window: int | None = None,
    dropout: float = 0.0,
    scale: float | None = None,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(Q K^T * scale + mask) V, the seed formula, on any leading batch/head dims.

    Args:
        query: (..., T_q, d_k), heads at dim -3 for grouped-query attention: (..., H, T_q, d_k).
        key: (..., T_k, d_k); (..., H_kv, T_k, d_k) with H_kv dividing H for grouped-query
            attention (module docstring).
        value: (..., T_k, d_v); d_v may differ from d_k.
        mask: boolean, True = may attend, or floating-point added to the scores; broadcastable
            to (..., T_q, T_k) (a 1-D mask is a key mask (T_k,)).
        causal: also forbid attending to later positions, aligned to the end when T_q != T_k
            (query ``i`` sees keys ``j <= i + T_k - T_q``).
        window: sliding-window attention: query ``i`` sees at most ``window`` keys, itself and
            those just before it (``j > i + T_k - T_q - window``); needs ``causal``.
        dropout: probability of dropping an attention weight (apply only in training).
        scale: score scale; default ``1 / sqrt(d_k)``.
        return_weights: also return the attention weights (forces the readable path).

    Returns:
        The output (..., T_q, d_v) in the input dtype, or ``(output, weights)`` with weights
        (..., T_q, T_k) when ``return_weights`` is true. Rows with no allowed key are zero;
        NaN and inf propagate as the module docstring says.
    """
    batch, groups = _check_inputs(query, key, value, mask, dropout, scale)
    if not isinstance(causal, bool):  # "no" would be true
        raise TypeError(f"causal: expected a bool, got {causal!r}")
    window = check_window(window)
    if window is not None and not causal:
        raise ValueError(
            f"window={window}: a sliding window is causal (query i sees keys i - window < j <= i); "
            "pass causal=True"
        )
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    backend = _select_backend(
        query, key, value, mask, dropout=dropout, return_weights=return_weights
    )
    shapes = dict(
        causal=causal, window=window, q_len=query.shape[-2], k_len=key.shape[-2],
        device=query.device,
    )  # fmt: skip
    prepared = _prepare_mask(mask, backend=backend, dtype=query.dtype, **shapes)
    if backend != READABLE:
        kv_batch = (*batch[:-1], batch[-1] // groups) if groups > 1 else batch
        if query.shape[:-2] != batch:
            query = query.expand(*batch, -1, -1)
        if key.shape[:-2] != kv_batch:
            key = key.expand(*kv_batch, -1, -1)  # (*kv_batch, T_k, d_k)
        if value.shape[:-2] != kv_batch:
            value = value.expand(*kv_batch, -1, -1)  # (*kv_batch, T_k, d_v)
        if backend == SHORT:
            if groups > 1:
                key, value = (t.repeat_interleave(groups, dim=-3) for t in (key, value))
            out = ShortAttention.apply(
                query, key, value, prepared.mask, scale, dropout
            )  # (..., T_q, d_v)
        elif backend == STEP:
            out = one_query_attention(query, key, value, prepared.mask, scale)  # (..., 1, d_v)
        else:
            out = _fused(query, key, value, prepared, dropout=dropout, scale=scale, groups=groups)
        # While dynamo traces (a compiled decoding step, attnkit.generation.compiled, or
        # training with compile=True) the fast result is taken as it is: the check reads the
        # output back, a branch on the data that a graph cannot hold.
        if torch.compiler.is_dynamo_compiling() or _fast_result_trusted(out, backend):
            return out if prepared.empty is None else out.masked_fill(prepared.empty, 0.0)
        prepared = _prepare_mask(mask, backend=READABLE, dtype=query.dtype, **shapes)
    if groups > 1:
        key, value = (t.repeat_interleave(groups, dim=-3) for t in (key, value))
    out, weights = _attention_readable(
        query, key, value, prepared.mask, prepared.empty, dropout, scale
    )
    return (out, weights) if return_weights else out


def _fused(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    prepared: _PreparedMask,
    *,
    dropout: float,
    scale: float,
    groups: int,
) -> Tensor:
    """torch's fused kernel on query (..., H, T_q, d) and key/value (..., H / groups, T_k, d).

    With grouped heads and a single query, the G queries that share a key/value head are one row
    of G queries (no causal rule or window reaches inside it: they are the same position), which
    runs torch's kernel 2-10x faster than ``enable_gqa`` on a CPU at decoding shapes.
    """
    mask = prepared.mask
    dtype = query.dtype
    # One query per row in half precision without autograd (a decoding step) on a CPU without
    # AMX: torch's kernel is 2-4x slower in bf16 than in float32 there, more than the cast of
    # the keys and values costs (docs/benchmarks.md, "Text generation"); the result is rounded
    # once. With AMX its bf16 kernel is 1.3-5x faster than the widened one: no widening. The
    # rule reads neither the batch size nor the grouping, so that a row's result does not
    # depend on the rows beside it (folded grouped queries at one batch row run 5-30% faster
    # unwidened; at eight rows slower for short caches, 45.5 against 34.1 us at 16 keys;
    # docs/benchmarks.md, "Modern attention").
    widen = (
        dtype in (torch.bfloat16, torch.float16)
        and query.device.type == "cpu"
        and query.shape[-2] == 1
        and not _attention_has_amx(dtype)
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)))
    )
    if widen:
        query, key, value = query.float(), key.float(), value.float()
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.float()
    if groups > 1 and query.shape[-2] == 1 and not prepared.causal:
        *lead, heads, _, d_k = query.shape
        kv_heads = heads // groups
        folded = query.reshape(*lead, kv_heads, groups, d_k)  # (..., H_kv, G, d_k)
        if mask is not None and mask.dim() >= 3 and mask.shape[-3] == heads:
            mask = mask.reshape(*mask.shape[:-3], kv_heads, groups, mask.shape[-1])  # per head
        out = F.scaled_dot_product_attention(
            folded, key, value, attn_mask=mask, dropout_p=dropout, scale=scale
        )  # (..., H_kv, G, d_v)
        out = out.reshape(*lead, heads, 1, out.shape[-1])  # (..., H, 1, d_v)
    else:
        out = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=mask,
            dropout_p=dropout,
            is_causal=prepared.causal,
            scale=scale,
            enable_gqa=groups > 1,
        )  # (..., H, T_q, d_v)
    return out.to(dtype) if widen else out


def _attention_readable(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    empty: Tensor | None,
    dropout: float,
    scale: float,
) -> tuple[Tensor, Tensor]:
    """The seed formula written out; softmax in float32 for half-precision inputs.

    ``mask`` and ``empty`` come from :func:`_prepare_mask` (every row of the mask has an allowed
    key; ``empty`` marks the rows to zero).
    """
    compute = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    value = value.to(compute)
    scores = torch.matmul(query.to(compute), key.to(compute).transpose(-2, -1)) * scale
    # scores: (..., T_q, T_k)
    allowed = None
    if mask is not None:
        allowed = mask if mask.dtype == torch.bool else mask != float("-inf")
        if mask.is_floating_point():
            scores = scores + mask.to(compute)
        # A key a row may not attend to never enters its arithmetic, not even as a NaN score.
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if empty is not None:
        weights = weights.masked_fill(empty, 0.0)
    if dropout > 0.0:
        weights = F.dropout(weights, p=dropout)
    out = torch.matmul(weights, value)  # (..., T_q, d_v)
    if allowed is not None and not value.is_meta and not bool(torch.isfinite(value).all()):
        # In the matmul 0 x NaN = NaN would carry a masked-out value into every row: sum each
        # row over its allowed keys only.
        terms = weights.unsqueeze(-1) * value.unsqueeze(-3)  # (..., T_q, T_k, d_v)
        out = terms.masked_fill(~allowed.unsqueeze(-1), 0.0).sum(dim=-2)  # (..., T_q, d_v)
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    return out.to(query.dtype), weights.to(query.dtype)
