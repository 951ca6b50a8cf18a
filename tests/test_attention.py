"""The numerical core: scaled_dot_product_attention and the mask helpers.

Reference values come from a float64 softmax(Q K^T * scale + mask) V written out below, with
its own masking and causal logic (it does not call anything from attnkit).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import attention
from attnkit.attention import (
    _broadcast,
    causal_mask,
    lengths_to_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from attnkit.attention_short import SHORT_KEYS_MAX, ShortAttention

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
# Output tolerances against the float64 reference (inputs are rounded to the dtype first, so
# only the arithmetic inside the attention counts). Half precision: about 8 ulps of O(1) values.
TOL = {
    torch.float64: dict(atol=1e-12, rtol=1e-12),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.bfloat16: dict(atol=4e-2, rtol=4e-2),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
}


def reference_attention(q, k, v, mask=None, *, causal=False, scale=None):
    """float64 softmax(Q K^T * scale + mask) V; rows with no allowed key get zeros."""
    q, k, v = q.double(), k.double(), v.double()
    t_q, t_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale  # (..., T_q, T_k)
    allowed = torch.ones(scores.shape, dtype=torch.bool)
    if mask is not None and mask.dtype == torch.bool:
        allowed = allowed & mask
    elif mask is not None:
        allowed = allowed & (mask != float("-inf"))
        scores = scores + torch.where(allowed, mask.double(), torch.zeros((), dtype=torch.float64))
    if causal:
        i = torch.arange(t_q)[:, None]
        j = torch.arange(t_k)[None, :]
        allowed = allowed & (j <= i + (t_k - t_q))  # end-aligned
    allowed = allowed.expand(scores.shape)
    has_key = allowed.any(dim=-1, keepdim=True)  # (..., T_q, 1)
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float64)
    scores = torch.where(allowed, scores, neg_inf)
    row_max = torch.where(has_key, scores.amax(dim=-1, keepdim=True), 0.0)
    e = torch.where(allowed, torch.exp(scores - row_max), 0.0)
    denom = torch.where(has_key, e.sum(dim=-1, keepdim=True), 1.0)
    weights = e / denom
    return weights @ v, weights, has_key.squeeze(-1)


# --------------------------------------------------------------------------- property test


@st.composite
def attention_cases(draw):
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    return dict(
        lead=lead,
        # key/value with size-1 leading dims that broadcast against the query's
        kv_lead=draw(st.sampled_from([lead, tuple(1 for _ in lead)])),
        t_q=draw(st.integers(1, 5)),
        t_k=draw(st.integers(1, 5)),
        d_k=draw(st.integers(1, 6)),
        d_v=draw(st.integers(1, 6)),
        mask_kind=draw(st.sampled_from(["none", "bool", "float"])),
        # (*lead, T_q, T_k), (T_q, T_k) for every batch row, or a key mask (*lead, 1, T_k)
        mask_shape=draw(st.sampled_from(["full", "shared", "keys"])),
        empty_row=draw(st.booleans()),
        causal=draw(st.booleans()),
        scale=draw(st.none() | st.floats(0.25, 2.0)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def _make_case(case, dtype):
    g = torch.Generator().manual_seed(case["seed"])
    lead, t_q, t_k = case["lead"], case["t_q"], case["t_k"]
    q = torch.randn(*lead, t_q, case["d_k"], generator=g).to(dtype)
    k = torch.randn(*case["kv_lead"], t_k, case["d_k"], generator=g).to(dtype)
    v = torch.randn(*case["kv_lead"], t_k, case["d_v"], generator=g).to(dtype)
    mask = None
    if case["mask_kind"] != "none":
        shape = {
            "full": (*lead, t_q, t_k),
            "shared": (t_q, t_k),
            "keys": (*lead, 1, t_k),
        }[case["mask_shape"]]
        keep = torch.rand(shape, generator=g) < 0.7
        if case["empty_row"]:
            keep[..., case["seed"] % shape[-2], :] = False
        if case["mask_kind"] == "bool":
            mask = keep
        else:
            mask = torch.randn(shape, generator=g).masked_fill(~keep, float("-inf"))
    return q, k, v, mask


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@settings(max_examples=40, deadline=None)
@given(case=attention_cases())
def test_both_paths_match_float64_reference(case, dtype):
    q, k, v, mask = _make_case(case, dtype)
    kw = dict(causal=case["causal"], scale=case["scale"])
    ref_out, ref_w, has_key = reference_attention(q, k, v, mask, **kw)
    empty = ~has_key  # (..., T_q): rows that may attend to nothing

    out_r, w_r = scaled_dot_product_attention(q, k, v, mask, return_weights=True, **kw)
    out_f = scaled_dot_product_attention(q, k, v, mask, return_weights=False, **kw)

    for out in (out_r, out_f):
        assert out.dtype == dtype
        assert out.shape == ref_out.shape
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), ref_out, **TOL[dtype])
        assert (out[empty] == 0).all()  # exactly zero, not just small
    assert w_r.dtype == dtype
    assert torch.isfinite(w_r).all()
    torch.testing.assert_close(w_r.double(), ref_w, **TOL[dtype])
    assert (w_r[empty] == 0).all()


# --------------------------------------------------------------------------- targeted cases


@pytest.mark.parametrize("return_weights", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fully_masked_rows_are_zero_not_nan(dtype, return_weights):
    q = torch.randn(2, 3, 4).to(dtype)
    k = torch.randn(2, 5, 4).to(dtype)
    v = torch.randn(2, 5, 6).to(dtype)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[0, 1] = False  # one row of one batch element
    mask[1] = False  # a whole batch element
    res = scaled_dot_product_attention(q, k, v, mask, return_weights=return_weights)
    out = res[0] if return_weights else res
    assert not torch.isnan(out).any()
    assert (out[0, 1] == 0).all() and (out[1] == 0).all()
    assert (out[0, 0] != 0).any() and (out[0, 2] != 0).any()
    if return_weights:
        w = res[1]
        assert (w[0, 1] == 0).all() and (w[1] == 0).all()
        torch.testing.assert_close(w[0, [0, 2]].float().sum(-1), torch.ones(2), atol=1e-2, rtol=0)


@pytest.mark.parametrize("return_weights", [True, False])
def test_float_mask_all_minus_inf_row_is_zero(return_weights):
    q, k, v = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5, 2)
    mask = torch.zeros(3, 5)
    mask[2] = float("-inf")
    res = scaled_dot_product_attention(q, k, v, mask, return_weights=return_weights)
    out = res[0] if return_weights else res
    assert (out[2] == 0).all() and torch.isfinite(out).all()


@pytest.mark.parametrize("return_weights", [True, False])
def test_causal_with_more_queries_than_keys_masks_leading_rows(return_weights):
    # End-aligned: with T_q=4, T_k=2, query i sees keys j <= i - 2, so rows 0 and 1 see nothing.
    q, k, v = torch.randn(4, 3), torch.randn(2, 3), torch.randn(2, 3)
    res = scaled_dot_product_attention(q, k, v, causal=True, return_weights=return_weights)
    out = res[0] if return_weights else res
    assert (out[:2] == 0).all()
    torch.testing.assert_close(out[2], v[0])  # the only key it may see
    expected = reference_attention(q, k, v, causal=True)[0][3]  # float64
    torch.testing.assert_close(out[3], expected.float(), atol=1e-6, rtol=1e-6)


def test_causal_with_fewer_queries_sees_the_past():
    # Incremental decoding: the last query (T_q=1) sees every key.
    q, k, v = torch.randn(2, 1, 4), torch.randn(2, 6, 4), torch.randn(2, 6, 3)
    full = scaled_dot_product_attention(q, k, v)
    for rw in (True, False):
        res = scaled_dot_product_attention(q, k, v, causal=True, return_weights=rw)
        torch.testing.assert_close(res[0] if rw else res, full)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_finite_additive_mask_beyond_half_range(dtype):
    # -7e4 is finite in float32/bfloat16 but overflows float16 (max 65504). Adding the same
    # constant to a whole row does not change its softmax, so both paths must still give
    # softmax(scores) V for that row, not zeros or NaN.
    q, k, v = torch.randn(3, 4).to(dtype), torch.randn(5, 4).to(dtype), torch.randn(5, 2).to(dtype)
    mask = torch.zeros(3, 5)
    mask[1] = -7e4
    mask[2, :2] = -7e4
    ref = reference_attention(q, k, v, mask)[0]
    out_r = scaled_dot_product_attention(q, k, v, mask, return_weights=True)[0]
    out_f = scaled_dot_product_attention(q, k, v, mask)
    for out in (out_r, out_f):
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("return_weights", [True, False])
def test_batch_size_one_and_length_one(return_weights):
    for shape_q, shape_k in [((1, 1, 4), (1, 1, 4)), ((1, 1, 4), (1, 3, 4)), ((1, 4), (1, 4))]:
        q, k = torch.randn(shape_q), torch.randn(shape_k)
        v = torch.randn(*shape_k[:-1], 2)
        res = scaled_dot_product_attention(q, k, v, causal=True, return_weights=return_weights)
        out = res[0] if return_weights else res
        assert out.shape == (*shape_q[:-1], 2)
        torch.testing.assert_close(out.double(), reference_attention(q, k, v, causal=True)[0])
    # A single key: the output is that key's value, whatever the scores.
    q, k, v = torch.randn(1, 1, 4), torch.randn(1, 1, 4), torch.randn(1, 1, 2)
    res = scaled_dot_product_attention(q, k, v, return_weights=return_weights)
    torch.testing.assert_close(res[0] if return_weights else res, v)


def test_weights_rows_sum_to_one_and_respect_the_mask():
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    mask = torch.rand(2, 3, 5) < 0.6
    mask[..., 0] = True
    _, w = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3))
    assert (w[~mask] == 0).all()


def test_default_scale_is_inverse_sqrt_d_k():
    q, k, v = torch.randn(3, 9), torch.randn(4, 9), torch.randn(4, 2)
    out = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, scaled_dot_product_attention(q, k, v, scale=1 / 3))
    assert not torch.allclose(out, scaled_dot_product_attention(q, k, v, scale=1.0))


# --------------------------------------------------------------------------- gradients


def _grad_inputs(t_q=3, t_k=4):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, t_q, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, t_k, 3, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, t_k, 2, generator=g, dtype=torch.float64, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("return_weights", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_with_boolean_mask_and_empty_row(causal, return_weights):
    q, k, v = _grad_inputs()
    mask = torch.tensor(
        [[True, False, True, True], [False, False, False, False], [True, True, False, True]]
    )  # (T_q, T_k); row 1 is fully masked

    def f(q, k, v):
        return scaled_dot_product_attention(
            q, k, v, mask, causal=causal, return_weights=return_weights
        )

    assert torch.autograd.gradcheck(f, (q, k, v))
    out = f(q, k, v)
    out = out[0] if return_weights else out
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[:, 1] == 0).all()  # the empty row gets no gradient


@pytest.mark.parametrize("return_weights", [True, False])
def test_gradcheck_causal_and_float_mask(return_weights):
    q, k, v = _grad_inputs(t_q=3, t_k=5)
    add = torch.randn(3, 5, dtype=torch.float64)
    add[0, 4] = float("-inf")

    def f(q, k, v):
        a = scaled_dot_product_attention(q, k, v, causal=True, return_weights=return_weights)
        b = scaled_dot_product_attention(q, k, v, add, return_weights=return_weights)
        return (a[0], b[0]) if return_weights else (a, b)

    assert torch.autograd.gradcheck(f, (q, k, v))


# --------------------------------------------------------------------------- dropout


@pytest.mark.parametrize("return_weights", [True, False])
def test_dropout_is_random_and_seeded(return_weights):
    q, k, v = torch.randn(2, 6, 4), torch.randn(2, 6, 4), torch.randn(2, 6, 4)

    def run(seed=None):
        if seed is not None:
            torch.manual_seed(seed)
        res = scaled_dot_product_attention(q, k, v, dropout=0.5, return_weights=return_weights)
        return res[0] if return_weights else res

    a, b = run(), run()
    assert not torch.equal(a, b)
    torch.testing.assert_close(run(seed=7), run(seed=7), rtol=0, atol=0)
    assert not torch.equal(run(), scaled_dot_product_attention(q, k, v))


def test_dropout_on_weights_zeroes_or_rescales():
    q, k, v = torch.randn(4, 8, 4), torch.randn(4, 8, 4), torch.randn(4, 8, 4)
    _, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    torch.manual_seed(0)
    out_d, w_d = scaled_dot_product_attention(q, k, v, dropout=0.25, return_weights=True)
    dropped = w_d == 0
    assert dropped.any() and not dropped.all()
    torch.testing.assert_close(w_d[~dropped], w[~dropped] / 0.75)
    torch.testing.assert_close(out_d, w_d @ v)  # dropout acts on the weights, before V


# --------------------------------------------------------------------------- bad input


def _qkv(t_q=3, t_k=4, d_k=5, d_v=6, batch=(2,)):
    return (
        torch.randn(*batch, t_q, d_k),
        torch.randn(*batch, t_k, d_k),
        torch.randn(*batch, t_k, d_v),
    )


BAD_INPUTS = {
    "query rank 1": (
        lambda: (torch.randn(5), *_qkv()[1:]),
        {},
        ValueError,
        r"query: .*at least 2 dims, got \(5,\)",
    ),
    "key rank 1": (
        lambda: (_qkv()[0], torch.randn(5), _qkv()[2]),
        {},
        ValueError,
        r"key: .*at least 2 dims, got \(5,\)",
    ),
    "value rank 0": (
        lambda: (*_qkv()[:2], torch.tensor(1.0)),
        {},
        ValueError,
        r"value: .*at least 2 dims, got \(\)",
    ),
    "d_k mismatch": (
        lambda: (torch.randn(2, 3, 5), torch.randn(2, 4, 7), torch.randn(2, 4, 6)),
        {},
        ValueError,
        r"d_k must match.*query \(\.\.\., T_q, 5\).*key \(\.\.\., T_k, 7\)",
    ),
    "T_k != T_v": (
        lambda: (torch.randn(2, 3, 5), torch.randn(2, 4, 5), torch.randn(2, 6, 6)),
        {},
        ValueError,
        r"T_k must equal T_v.*key \(2, 4, 5\).*value \(2, 6, 6\)",
    ),
    "batch dims do not broadcast": (
        lambda: (torch.randn(2, 3, 5), torch.randn(3, 4, 5), torch.randn(3, 4, 6)),
        {},
        ValueError,
        r"do not broadcast.*query \(2, 3, 5\).*key \(3, 4, 5\)",
    ),
    "mask does not broadcast": (
        _qkv,
        {"mask": torch.ones(3, 5, dtype=torch.bool)},
        ValueError,
        r"mask: shape \(3, 5\) does not broadcast.*\(2, 3, 4\)",
    ),
    "key padding mask given as (B, T_k)": (
        lambda: (torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)),
        {"mask": torch.ones(2, 5, dtype=torch.bool)},
        ValueError,
        r"mask: shape \(2, 5\) does not broadcast to \(\.\.\., T_q, T_k\) = \(2, 3, 5\) "
        r"\(a key mask \(B, T_k\) is given as \(B, 1, T_k\): mask\[:, None, :\]\)$",
    ),
    "mask with extra leading dims": (
        _qkv,
        {"mask": torch.ones(7, 2, 3, 4, dtype=torch.bool)},
        ValueError,
        r"mask: shape \(7, 2, 3, 4\)",
    ),
    "integer mask": (
        _qkv,
        {"mask": torch.ones(3, 4, dtype=torch.int64)},
        TypeError,
        r"mask: .*torch\.int64",
    ),
    "uint8 mask": (
        _qkv,
        {"mask": torch.ones(3, 4, dtype=torch.uint8)},
        TypeError,
        r"mask: .*torch\.uint8",
    ),
    "mask not a tensor": (
        _qkv,
        {"mask": [[True] * 4] * 3},
        TypeError,
        r"mask: expected a torch\.Tensor, got list",
    ),
    "dropout 1.0": (_qkv, {"dropout": 1.0}, ValueError, r"dropout: .*\[0, 1\), got 1\.0"),
    "dropout -0.1": (_qkv, {"dropout": -0.1}, ValueError, r"dropout: .*\[0, 1\), got -0\.1"),
    "integer query": (
        lambda: (torch.ones(3, 5, dtype=torch.int64), torch.randn(4, 5), torch.randn(4, 6)),
        {},
        TypeError,
        r"query: .*floating-point.*torch\.int64",
    ),
    "mixed dtypes": (
        lambda: (torch.randn(3, 5), torch.randn(4, 5).double(), torch.randn(4, 6)),
        {},
        TypeError,
        r"one dtype.*torch\.float32, torch\.float64, torch\.float32",
    ),
    "1-D mask of the wrong length": (
        _qkv,
        {"mask": torch.ones(5, dtype=torch.bool)},
        ValueError,
        r"mask: shape \(5,\) does not broadcast.*\(2, 3, 4\)",
    ),
    "1-D float mask of the wrong length": (
        _qkv,
        {"mask": torch.zeros(3)},
        ValueError,
        r"mask: shape \(3,\) does not broadcast",
    ),
    "0-d integer mask": (
        _qkv,
        {"mask": torch.tensor(1)},
        TypeError,
        r"mask: .*torch\.int64",
    ),
    "int32 1-D mask": (
        _qkv,
        {"mask": torch.ones(4, dtype=torch.int32)},
        TypeError,
        r"mask: .*torch\.int32",
    ),
    "complex mask": (
        _qkv,
        {"mask": torch.zeros(3, 4, dtype=torch.complex64)},
        TypeError,
        r"mask: .*torch\.complex64",
    ),
    "mask with T_q wrong": (
        _qkv,
        {"mask": torch.ones(2, 2, 4, dtype=torch.bool)},
        ValueError,
        r"mask: shape \(2, 2, 4\) does not broadcast",
    ),
    "d_k of 0": (
        lambda: (torch.randn(2, 3, 0), torch.randn(2, 4, 0), torch.randn(2, 4, 6)),
        {},
        ValueError,
        r"d_k must be >= 1.*got query \(2, 3, 0\)",
    ),
    "scale NaN": (_qkv, {"scale": float("nan")}, ValueError, r"scale: .*got nan"),
    "scale a string": (_qkv, {"scale": "0.5"}, ValueError, r"scale: .*got '0\.5'"),
    "query not a tensor": (
        lambda: ([[1.0]], torch.randn(4, 5), torch.randn(4, 6)),
        {},
        TypeError,
        r"query: expected a torch\.Tensor, got list",
    ),
}


@pytest.mark.parametrize("path", ["readable", "fused", "short"])
@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_raises_with_a_message_naming_it(name, path):
    # Every backend sees the same checks: the short kernel is what training (grad) takes.
    make, kwargs, error, match = BAD_INPUTS[name]
    inputs = make()
    if path == "short":
        inputs = [t.requires_grad_() if _grad_capable(t) else t for t in inputs]
    with pytest.raises(error, match=match):
        scaled_dot_product_attention(*inputs, return_weights=path == "readable", **kwargs)


def _grad_capable(t):
    return isinstance(t, torch.Tensor) and t.is_floating_point()


# --------------------------------------------------------------------------- mask helpers


@pytest.mark.parametrize("q_len,k_len", [(1, 1), (4, 4), (2, 5), (5, 2), (1, 6), (3, 0)])
def test_causal_mask_is_end_aligned(q_len, k_len):
    m = causal_mask(q_len, k_len)
    assert m.shape == (q_len, k_len) and m.dtype == torch.bool
    for i in range(q_len):
        for j in range(k_len):
            assert bool(m[i, j]) == (j <= i + k_len - q_len), (i, j)


def test_causal_mask_defaults_to_square_lower_triangle():
    expected = torch.tensor(
        [[True, False, False], [True, True, False], [True, True, True]], dtype=torch.bool
    )
    assert torch.equal(causal_mask(3), expected)
    # The same as torch's additive causal mask, in the other convention.
    generated = torch.nn.Transformer.generate_square_subsequent_mask(5)
    assert torch.equal(causal_mask(5), generated == 0)


def test_causal_mask_rejects_negative_lengths():
    with pytest.raises(ValueError, match=r"q_len=-1, k_len=3"):
        causal_mask(-1, 3)
    for bad in (3.0, True):  # before: torch's TypeError from ones()
        with pytest.raises(ValueError, match=r"lengths must be integers >= 0, got q_len="):
            causal_mask(bad)


def test_causal_must_be_a_bool():
    """causal="no" was true."""
    q = torch.randn(1, 2, 3)
    with pytest.raises(TypeError, match=r"causal: expected a bool, got 'no'"):
        scaled_dot_product_attention(q, q, q, causal="no")


def test_padding_mask():
    ids = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0], [0, 3, 0, 4]])
    m = padding_mask(ids, pad_id=0)
    expected = torch.tensor(
        [[True, True, True, False], [True, False, False, False], [False, True, False, True]]
    )
    assert m.shape == (3, 1, 4) and m.dtype == torch.bool
    assert torch.equal(m[:, 0], expected)
    assert torch.equal(padding_mask(ids, pad_id=4)[2, 0], torch.tensor([True, True, True, False]))
    with pytest.raises(ValueError, match=r"ids: expected shape \(B, T\), got \(4,\)"):
        padding_mask(ids[0], pad_id=0)
    for bad in (None, "0", 0.0, True):  # None raised an AttributeError from inside
        with pytest.raises(TypeError, match=f"pad_id: expected an integer token id, got {bad!r}"):
            padding_mask(ids, pad_id=bad)


def test_lengths_to_mask():
    m = lengths_to_mask(torch.tensor([3, 1, 0]))
    expected = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])
    assert m.shape == (3, 1, 3) and m.dtype == torch.bool
    assert torch.equal(m[:, 0], expected)
    m5 = lengths_to_mask(torch.tensor([3, 1]), max_len=5)
    assert m5.shape == (2, 1, 5)
    assert torch.equal(m5[:, 0].sum(-1), torch.tensor([3, 1]))
    assert not m5[:, 0, 3:].any()
    for bad in (torch.tensor([1.0, 2.0]), torch.tensor([[1, 2]]), torch.tensor([True]), [1, 2]):
        with pytest.raises(ValueError, match=r"lengths: expected a 1-D integer tensor"):
            lengths_to_mask(bad)
    # Before: a negative length was a row of padding, a max_len shorter than a length cut that
    # sequence silently, max_len=-1 raised torch's arange error.
    with pytest.raises(ValueError, match=r"lengths: expected lengths >= 0, got -1"):
        lengths_to_mask(torch.tensor([2, -1]))
    with pytest.raises(ValueError, match=r"max_len=2 is shorter than the longest length 3"):
        lengths_to_mask(torch.tensor([3, 1]), max_len=2)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=r"max_len: expected an integer >= 0 or None"):
            lengths_to_mask(torch.tensor([1]), max_len=bad)


@pytest.mark.parametrize("return_weights", [True, False])
def test_key_mask_equals_attending_to_the_real_keys_only(return_weights):
    lengths = torch.tensor([5, 2, 3])
    q, k, v = torch.randn(3, 4, 6), torch.randn(3, 5, 6), torch.randn(3, 5, 2)
    res = scaled_dot_product_attention(
        q, k, v, lengths_to_mask(lengths), return_weights=return_weights
    )
    out = res[0] if return_weights else res
    for b, n in enumerate(lengths.tolist()):
        alone = reference_attention(q[b], k[b, :n], v[b, :n])[0]
        torch.testing.assert_close(out[b].double(), alone, atol=1e-6, rtol=1e-6)


# ------------------------------------------------- short-sequence CPU training kernel


def _count_calls(monkeypatch, owner, name: str) -> list:
    """Replace ``owner.name`` by a wrapper that records the shape of each call's first
    argument; returns the list it appends to."""
    calls = []
    original = getattr(owner, name)

    def counting(*args):
        calls.append(args[0].shape)
        return original(*args)

    monkeypatch.setattr(owner, name, counting)
    return calls


def _count_short_kernel(monkeypatch):
    return _count_calls(monkeypatch, ShortAttention, "apply")


def _torch_reference(q, k, v, bool_mask, causal):
    """torch's own SDPA (math backend) with the same mask, rows with no key zeroed."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    allowed = torch.ones(t_q, t_k, dtype=torch.bool)
    if bool_mask is not None:
        allowed = allowed & bool_mask
    if causal:
        allowed = allowed & torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q)
    row_ok = allowed.any(-1, keepdim=True)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~row_ok)
    return out * row_ok


@pytest.mark.parametrize(
    "shape, causal, masked",
    [
        ((3, 4, 7, 7, 8), False, True),  # self-attention with key padding
        ((3, 4, 7, 7, 8), True, False),  # decoder self-attention
        ((2, 2, 5, 9, 6), True, True),  # end-aligned causal, T_q < T_k, padding
        ((2, 3, 6, 11, 4), False, True),  # cross-attention, a fully masked row
        ((1, 1, 1, SHORT_KEYS_MAX, 8), False, False),  # the longest key length it takes
    ],
)
def test_short_kernel_matches_torch_values_and_gradients(monkeypatch, shape, causal, masked):
    b, h, t_q, t_k, d = shape
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(b, h, t, d, generator=g, dtype=torch.float64).requires_grad_()
        for t in (t_q, t_k, t_k)
    )
    mask = None
    if masked:
        mask = torch.rand(b, 1, t_q, t_k, generator=g) > 0.3
        mask[0, 0, 0] = False  # a query row with no key at all
    calls = _count_short_kernel(monkeypatch)
    got = scaled_dot_product_attention(q, k, v, mask, causal=causal)
    assert len(calls) == 1, "the short-sequence kernel should take this case"
    want = _torch_reference(q, k, v, mask, causal)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    grad_out = torch.randn(got.shape, generator=g, dtype=torch.float64)
    got_grads = torch.autograd.grad(got, (q, k, v), grad_out)
    want_grads = torch.autograd.grad(want, (q, k, v), grad_out)
    for a, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, w, rtol=1e-10, atol=1e-12)


def test_short_kernel_float_mask_and_broadcast_batch(monkeypatch):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 3, 5, 4, generator=g).requires_grad_()
    k = torch.randn(1, 3, 6, 4, generator=g).requires_grad_()  # broadcast over the batch
    v = torch.randn(1, 3, 6, 4, generator=g).requires_grad_()
    mask = torch.randn(2, 1, 1, 6, generator=g)
    calls = _count_short_kernel(monkeypatch)
    got = scaled_dot_product_attention(q, k, v, mask)
    assert len(calls) == 1
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), attn_mask=mask
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, w in zip(
        torch.autograd.grad(got.sum(), (q, k, v)),
        torch.autograd.grad(want.sum(), (q, k, v)),
        strict=True,
    ):
        torch.testing.assert_close(a, w, rtol=1e-5, atol=1e-5)


def test_short_kernel_gradcheck():
    g = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(2, 2, t, 3, generator=g, dtype=torch.float64).requires_grad_()
        for t in (4, 5, 5)
    )
    mask = torch.rand(2, 1, 4, 5, generator=g) > 0.4
    assert torch.autograd.gradcheck(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, mask, causal=True), (q, k, v)
    )


@pytest.mark.parametrize("case", ["no_grad", "long_keys", "weights", "no_grad_dropout_bf16"])
def test_short_kernel_is_not_taken_outside_short_cpu_training(monkeypatch, case):
    t_k = SHORT_KEYS_MAX + 1 if case == "long_keys" else 8
    dtype = torch.bfloat16 if "bf16" in case else torch.float32
    q, k, v = (torch.randn(2, 2, t, 4, dtype=dtype).requires_grad_() for t in (8, t_k, t_k))
    calls = _count_short_kernel(monkeypatch)
    kwargs = {"dropout": 0.1} if "dropout" in case else {}
    kwargs.update({"return_weights": True} if case == "weights" else {})
    with torch.set_grad_enabled(not case.startswith("no_grad")):
        scaled_dot_product_attention(q, k, v, causal=True, **kwargs)
    assert calls == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_short_kernel_takes_training_in_any_dtype_and_with_dropout(monkeypatch, dtype, dropout):
    """Training (autograd recording) at short keys takes the short kernel whatever the dtype,
    and passes it the attention dropout: with the same seed, the output equals the kernel's."""
    g = torch.Generator().manual_seed(14)
    q, k, v = (torch.randn(2, 3, t, 4, generator=g).to(dtype).requires_grad_() for t in (5, 6, 6))
    calls = _count_short_kernel(monkeypatch)
    torch.manual_seed(15)
    got = scaled_dot_product_attention(q, k, v, causal=True, dropout=dropout)
    assert len(calls) == 1
    torch.manual_seed(15)
    bias = torch.zeros(5, 6, dtype=dtype).masked_fill(~causal_mask(5, 6), float("-inf"))
    want = ShortAttention.apply(q, k, v, bias, 0.5, dropout)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("amx", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal, t_q", [(True, 1), (False, 5), (True, 7)])
@pytest.mark.parametrize("batch", [3, 40])
def test_short_kernel_serves_half_precision_inference(monkeypatch, dtype, causal, t_q, amx, batch):
    """Without autograd, bf16/fp16 at short keys (a decoder step, cross-attention of a beam,
    an encoder) take the short kernel and give the float64 reference's values; where torch's
    fused kernel has AMX, a single query per row (a decoder step) or at most
    AMX_FUSED_MAX_ROWS query rows in all (3 x 4 heads x T_q here; 40 x 4 x T_q is more) go to
    it instead."""
    monkeypatch.setattr(attention, "cpu_attention_has_amx", lambda dtype: amx)
    g = torch.Generator().manual_seed(4)
    t_k = 7
    q, k, v = (
        torch.randn(batch, 4, t, 8, generator=g, dtype=torch.float64) for t in (t_q, t_k, t_k)
    )
    mask = torch.rand(batch, 1, 1, t_k, generator=g) > 0.3
    mask[..., -1] = True  # every row has a key
    calls = _count_short_kernel(monkeypatch)
    with torch.inference_mode():
        got = scaled_dot_product_attention(*(t.to(dtype) for t in (q, k, v)), mask, causal=causal)
    few = t_q == 1 or batch * 4 * t_q <= attention.AMX_FUSED_MAX_ROWS
    assert t_q == 1 or (batch * 4 * t_q <= attention.AMX_FUSED_MAX_ROWS) is (batch == 3)
    assert len(calls) == (0 if amx and few else 1) and got.dtype == dtype
    want = _torch_reference(*(t.to(dtype).double() for t in (q, k, v)), mask, causal)
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("amx", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_half_precision_decoding_step(monkeypatch, dtype, kv_heads, amx):
    """One query per row, long keys, no autograd (a GPT decoding step). Without AMX the fused
    path runs in float32 and rounds once at the end, so it equals the float32 result cast
    back; with AMX torch's kernel runs in the inputs' dtype, checked against the formula in
    float64 (on this machine's kernels when AMX is only pretended, on AMX tiles on an AMX CPU)."""
    monkeypatch.setattr(attention, "cpu_attention_has_amx", lambda dtype: amx)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, 4, 1, 16, generator=g).to(dtype)
    k, v = (torch.randn(3, kv_heads, SHORT_KEYS_MAX + 20, 16, generator=g).to(dtype) for _ in "kv")
    mask = torch.rand(3, 1, 1, SHORT_KEYS_MAX + 20, generator=g) > 0.2
    with torch.no_grad():
        got = scaled_dot_product_attention(q, k, v, mask, causal=True)
        want = scaled_dot_product_attention(q.float(), k.float(), v.float(), mask, causal=True)
    assert got.dtype == dtype
    if not amx:
        torch.testing.assert_close(got, want.to(dtype), rtol=0, atol=0)
        return
    # With AMX the kernel rounds in the inputs' dtype (the weights too, on AMX tiles): against
    # the seed formula in float64 on the same inputs, with room for a few roundings of outputs
    # below 1 in magnitude (a bfloat16 step there is at most 2^-8, a float16 one 2^-11).
    group = 4 // kv_heads
    k64, v64 = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    scores = q.double() @ k64.transpose(-1, -2) / math.sqrt(16)  # (3, 4, 1, T_k)
    weights = torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1)
    reference = weights @ v64  # (3, 4, 1, 16)
    tol = 6e-3 if dtype == torch.bfloat16 else 2e-3  # here: 1.3e-3 and 2.6e-4 at most
    torch.testing.assert_close(got.double(), reference, rtol=0, atol=tol)
    torch.testing.assert_close(want.double(), reference, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_a_half_precision_step_does_not_depend_on_its_batch(monkeypatch, dtype, kv_heads):
    """A decoding step's row (one query, grouped or not, no AMX) gives the same bits alone and
    beside other rows: the widening rule reads neither the batch size nor the grouping (a
    review found a rule that widened all but a single row of grouped queries)."""
    monkeypatch.setattr(attention, "cpu_attention_has_amx", lambda dtype: False)
    g = torch.Generator().manual_seed(12)
    t_k = SHORT_KEYS_MAX + 20
    q = torch.randn(3, 4, 1, 16, generator=g).to(dtype)
    k, v = (torch.randn(3, kv_heads, t_k, 16, generator=g).to(dtype) for _ in "kv")
    with torch.no_grad():
        together = scaled_dot_product_attention(q, k, v, causal=True)  # (3, 4, 1, 16)
        for row in range(3):
            alone = scaled_dot_product_attention(
                q[row : row + 1], k[row : row + 1], v[row : row + 1], causal=True
            )
            torch.testing.assert_close(alone, together[row : row + 1], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_fast_result_check_rejects_exactly_the_suspect_outputs(dtype):
    """The fast paths' result check, on outputs built to each case: trusted when every row is
    finite and none is all zeros, whatever the magnitudes (sums that cancel to 0, sums too
    small to invert, sums near the dtype's largest value); rejected for a NaN, an inf, or a
    row of zeros (+0 or -0), which may be torch's fused kernel hiding NaN scores."""
    big = torch.finfo(dtype).max / 16
    tiny = torch.finfo(dtype).tiny / 4  # subnormal: 1 / sum overflows
    nan, inf = math.nan, math.inf
    cases = {
        "plain": ([[1.0, 2.0, 3.0, 4.0] * 2] * 3, True),
        "sum cancels to 0": ([[1.0, -1.0] * 4] * 3, True),
        "subnormal rows": ([[tiny] * 8] * 3, True),
        "huge rows": ([[big / 8] * 8] * 3, True),
        "a row of zeros": ([[1.0] * 8, [0.0] * 8, [2.0] * 8], False),
        "a row of -0": ([[1.0] * 8, [-0.0] * 8, [2.0] * 8], False),
        "NaN": ([[1.0] * 8, [1.0] * 7 + [nan], [2.0] * 8], False),
        "inf": ([[1.0] * 8, [inf] + [1.0] * 7, [2.0] * 8], False),
        "inf and -inf": ([[inf, -inf] + [1.0] * 6] * 3, False),
    }
    for name, (rows, want) in cases.items():
        out = torch.tensor(rows, dtype=torch.float64).to(dtype)  # (3, 8)
        out = out.reshape(1, 3, 1, 8).expand(2, 3, 1, 8)  # (B, H, T_q, d), not contiguous
        if name == "subnormal rows" and not bool((out != 0).all()):
            want = False  # flushed to zero (a library loaded with fast-math): rows of zeros
        got = attention._fast_result_trusted(out, attention.FUSED)
        assert got is want, name


def test_a_row_whose_sum_cancels_is_trusted_but_a_row_of_zeros_is_checked(monkeypatch):
    """The fused path's result check (a row of zeros may be torch's kernel hiding NaN scores)
    must not send a result to the readable path only because a row's values cancel to a sum
    of exactly 0 (in bf16 about one beam-search call in eight did)."""
    readable = _count_calls(monkeypatch, attention, "_attention_readable")
    g = torch.Generator().manual_seed(6)
    q, k = (torch.randn(2, 3, 4, 8, generator=g) for _ in "qk")
    v = torch.randn(2, 3, 4, 2, generator=g)
    v[..., 1] = -v[..., 0]  # every output row is (a, -a): its sum is exactly 0, a is not
    with torch.no_grad():
        out = scaled_dot_product_attention(q, k, v)
    assert readable == [] and bool((out.sum(-1) == 0).all())
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    with torch.no_grad():
        out = scaled_dot_product_attention(q, k, torch.zeros_like(v))  # rows of zeros
    assert len(readable) == 1 and bool((out == 0).all())


def test_short_kernel_leaves_float32_inference_and_grouped_heads_to_torch(monkeypatch):
    """float32 without autograd is as fast in torch's kernel; grouped key/value heads would
    have to be repeated for the short kernel (the fused path folds them instead)."""
    q = torch.randn(2, 4, 1, 8, dtype=torch.bfloat16)
    kv = torch.randn(2, 2, 6, 8, dtype=torch.bfloat16)  # 2 key/value heads for 4 query heads
    calls = _count_short_kernel(monkeypatch)
    with torch.no_grad():
        scaled_dot_product_attention(
            q.float(), kv.repeat(1, 2, 1, 1).float(), kv.repeat(1, 2, 1, 1).float()
        )
        scaled_dot_product_attention(q, kv, kv)
    assert calls == []


def _short_case(dtype, *, seed, shape=(3, 4, 6, 7, 8)):
    """Inputs of the short kernel called directly: q, k, v (float64 values rounded to dtype)
    requiring grad, an additive key mask in dtype (every row has a key), the scale."""
    b, h, t_q, t_k, d = shape
    g = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(b, h, t, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
        for t in (t_q, t_k, t_k)
    )
    keep = torch.rand(b, 1, 1, t_k, generator=g) > 0.3
    keep[..., 0] = True
    bias = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, float("-inf"))
    return q, k, v, bias, d**-0.5


def _written_out(q, k, v, bias, scale, drop=None):
    """float64 softmax(Q K^T * scale + bias) [* drop] V, differentiable."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    weights = torch.softmax(q @ k.transpose(-2, -1) * scale + bias.double(), dim=-1)
    if drop is not None:
        weights = weights * drop
    return (q, k, v), weights @ v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_short_kernel_trains_in_half_precision_with_a_float32_softmax(dtype):
    """bf16/fp16 with autograd (training under autocast): values and all three gradients match
    the float64 formula on the same rounded inputs to half-precision rounding."""
    q, k, v, bias, scale = _short_case(dtype, seed=5)
    out = ShortAttention.apply(q, k, v, bias, scale)
    assert out.dtype == dtype
    inputs, want = _written_out(q, k, v, bias, scale)
    torch.testing.assert_close(out.double(), want, **TOL[dtype])
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(6)).to(dtype)
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    wanted = torch.autograd.grad(want, inputs, grad_out.double())
    for a, w in zip(got, wanted, strict=True):
        assert a.dtype == dtype
        torch.testing.assert_close(a.double(), w, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_short_kernel_dropout_drops_weights_after_the_softmax(dtype):
    """With dropout, out = (softmax(...) * keep / P(keep)) V with the mask keep_mask draws from
    the same seed; gradients through the same mask."""
    from attnkit.dropout import keep_mask

    q, k, v, bias, scale = _short_case(dtype, seed=9)
    torch.manual_seed(10)
    out = ShortAttention.apply(q, k, v, bias, scale, 0.25)
    torch.manual_seed(10)
    keep, keep_scale = keep_mask((3 * 4, 6, 7), 0.25)
    drop = (keep.double() * keep_scale).view(3, 4, 6, 7)
    assert 0 < int((~keep).sum()) < keep.numel()
    inputs, want = _written_out(q, k, v, bias, scale, drop)
    tol = TOL[dtype] if dtype != torch.float64 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.double(), want, **tol)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(11)).to(dtype)
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    wanted = torch.autograd.grad(want, inputs, grad_out.double())
    for a, w in zip(got, wanted, strict=True):
        torch.testing.assert_close(a.double(), w, **tol)


def test_short_kernel_dropout_gradcheck():
    q, k, v, bias, scale = _short_case(torch.float64, seed=12, shape=(2, 2, 4, 5, 3))

    def attend(q, k, v):
        torch.manual_seed(13)  # the same mask at every evaluation
        return ShortAttention.apply(q, k, v, bias, scale, 0.3)

    assert torch.autograd.gradcheck(attend, (q, k, v))


# --------------------------------------------------------------------------- every path alike


PATHS = ["readable", "fused", "short"]


def _run_path(path, q, k, v, mask=None, **kw):
    """One call on the named path: readable (weights asked for), fused (no autograd), or the
    short CPU training kernel (inputs that require grad, float32/64, short keys)."""
    if path == "readable":
        return scaled_dot_product_attention(q, k, v, mask, return_weights=True, **kw)[0]
    if path == "fused":
        with torch.no_grad():
            return scaled_dot_product_attention(q, k, v, mask, **kw)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    return scaled_dot_product_attention(q, k, v, mask, **kw).detach()


ODD_MASKS = {
    "1-D bool key mask": lambda t_k: torch.arange(t_k) != 1,
    "1-D float key mask": lambda t_k: torch.zeros(t_k).index_fill(0, torch.tensor([1]), -math.inf),
    "1-D additive, no -inf": lambda t_k: torch.linspace(-1.0, 1.0, t_k),
    "0-d True": lambda t_k: torch.tensor(True),
    "0-d False (no key at all)": lambda t_k: torch.tensor(False),
    "0-d float 0": lambda t_k: torch.tensor(0.0),
    "0-d float -inf": lambda t_k: torch.tensor(-math.inf),
    "length-1 bool": lambda t_k: torch.tensor([True]),
    "float64 mask for float32 inputs": lambda t_k: torch.zeros(1, t_k, dtype=torch.float64),
    "float16 mask for float32 inputs": lambda t_k: torch.zeros(3, t_k, dtype=torch.float16),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lead", [(), (2,), (2, 3)], ids=["2-D", "3-D", "4-D"])
@pytest.mark.parametrize("name", list(ODD_MASKS))
def test_low_rank_and_odd_dtype_masks_broadcast_alike_on_every_path(name, lead, causal, path):
    # Issue 13: a 1-D mask went through validation and then crashed inside torch's fused
    # kernel with 4-D inputs. Any mask that broadcasts to (..., T_q, T_k) works on every path.
    g = torch.Generator().manual_seed(4)
    q = torch.randn(*lead, 3, 4, generator=g)
    k, v = torch.randn(*lead, 5, 4, generator=g), torch.randn(*lead, 5, 2, generator=g)
    mask = ODD_MASKS[name](5)
    out = _run_path(path, q, k, v, mask, causal=causal)
    want = reference_attention(q, k, v, mask, causal=causal)[0]
    assert out.shape == (*lead, 3, 2) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("masked", [False, True])
def test_no_keys_or_no_queries_alike_on_every_path(path, masked):
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 0, 4), torch.randn(2, 0, 5)
    mask = torch.ones(3, 0, dtype=torch.bool) if masked else None
    out = _run_path(path, q, k, v, mask)
    assert out.shape == (2, 3, 5) and (out == 0).all()  # no key at all: zero rows
    out = _run_path(path, torch.randn(2, 0, 4), torch.randn(2, 6, 4), torch.randn(2, 6, 5))
    assert out.shape == (2, 0, 5)


def test_a_real_zero_output_row_stays_zero():
    # Values that average to zero: the fast path double-checks such rows on the readable path
    # (a zero row can also mean NaN scores, see the next tests) and must still give zeros.
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    v = torch.zeros(2, 5, 3)
    for path in PATHS:
        assert (_run_path(path, q, k, v) == 0).all()


# --------------------------------------------------------------------------- NaN and inf


def per_row_reference(q, k, v, mask, causal):
    """float64, one query row at a time, written from the documented rule: a row with no
    allowed key is zero; otherwise only the keys it may attend to enter its arithmetic, and
    NaN / inf propagate by IEEE arithmetic (exp(s - max) / sum, then sum of w_j v_j)."""
    q, k, v = q.double(), k.double(), v.double()
    t_q, t_k = q.shape[-2], k.shape[-2]
    add = torch.zeros(t_q, t_k, dtype=torch.float64)
    allowed = torch.ones(t_q, t_k, dtype=torch.bool)
    if mask is not None and mask.dtype == torch.bool:
        allowed &= mask
    elif mask is not None:
        allowed &= mask != -math.inf
        add = torch.where(allowed, mask.double(), 0.0)
    if causal:
        allowed &= torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q)
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float64)
    for i in range(t_q):
        keys = allowed[i].nonzero().flatten().tolist()
        if not keys:
            continue
        s = q[..., i : i + 1, :] @ k[..., keys, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
        s = s + add[i, keys]  # (..., 1, n)
        e = torch.exp(s - s.max(dim=-1, keepdim=True).values)  # max propagates NaN
        w = e / e.sum(dim=-1, keepdim=True)
        out[..., i, :] = (w.transpose(-2, -1) * v[..., keys, :]).sum(dim=-2)
    return out


# Rows: 0 may not see key 2, row 1 sees nothing, rows 2 and 3 see key 2 (with causal, rows
# 0 and 1 do not see key 2 either). The bad value sits in query row 2 or key/value row 2.
_ALLOWED = torch.tensor(
    [[True, True, False, True], [False] * 4, [True, False, True, True], [True] * 4]
)


def _nonfinite_case(where, value, mask_kind, dtype):
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 4, 3, generator=g, dtype=dtype) for _ in range(3))
    mask = None
    if mask_kind == "bool":
        mask = _ALLOWED.clone()
    elif mask_kind == "float":
        mask = torch.randn(4, 4, generator=g, dtype=dtype).masked_fill(~_ALLOWED, -math.inf)
    if where == "mask":
        mask = torch.zeros(4, 4, dtype=dtype) if mask is None else mask.to(dtype)
        if mask.dtype == torch.bool:
            mask = torch.zeros(4, 4, dtype=dtype).masked_fill(~_ALLOWED, -math.inf)
        mask[3, 1] = value  # an entry of a row that may attend
    else:
        {"query": q, "key": k, "value": v}[where][0, 2, 1] = value
    return q, k, v, mask


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
@pytest.mark.parametrize(
    "where, value",
    # -inf in a float mask is masking, not a non-finite value (the mask tests cover it)
    [(w, x) for w in ("query", "key", "value") for x in (math.nan, math.inf, -math.inf)]
    + [("mask", math.nan), ("mask", math.inf)],
)
def test_nan_and_inf_propagate_alike_on_every_path(where, value, mask_kind, causal, dtype, path):
    # Issue 13: the fused path turned a NaN query into a zero row where the readable path gave
    # NaN. Now every path gives the documented rule's NaN / inf pattern, row by row.
    q, k, v, mask = _nonfinite_case(where, value, mask_kind, dtype)
    out = _run_path(path, q, k, v, mask, causal=causal)
    want = per_row_reference(q, k, v, mask, causal)
    assert out.dtype == dtype and out.shape == want.shape
    assert not torch.isfinite(want).all()  # the case does reach some row
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5, equal_nan=True)


def test_nan_query_row_is_nan_not_zero_on_the_fused_path():
    # The issue's own example: no mask, no grad, torch's fused kernel.
    q, k, v = torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 3)
    q[0, 0, 2, 1] = math.nan
    with torch.no_grad():
        for causal in (False, True):
            out = scaled_dot_product_attention(q, k, v, causal=causal)
            assert torch.isnan(out[0, 0, 2]).all()
            assert torch.isfinite(out[0, 1]).all() and torch.isfinite(out[0, 0, [0, 1, 3]]).all()


@pytest.mark.parametrize("path", PATHS)
def test_nan_behind_the_mask_never_reaches_a_row(path):
    # A key or value a row may not attend to does not enter that row, NaN or not; a row with
    # no allowed key stays exactly zero whatever the inputs hold.
    q, k, v = torch.randn(2, 4, 3), torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    k[:, 2], v[:, 2] = math.nan, math.inf
    out = _run_path(path, q, k, v, _ALLOWED)
    assert torch.isfinite(out[:, 0]).all() and (out[:, 1] == 0).all()
    assert torch.isnan(out[:, 2:]).all()
    torch.testing.assert_close(
        out[:, 0].double(), per_row_reference(q, k, v, _ALLOWED, False)[:, 0]
    )


def test_readable_weights_follow_the_same_rule():
    q, k, v, mask = _nonfinite_case("key", math.nan, "bool", torch.float32)
    _, w = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert (w[:, 1] == 0).all()  # no allowed key
    assert torch.isnan(w[0, 2:]).all() and torch.isfinite(w[0, 0]).all()  # key 2 NaN: rows 2, 3
    assert (w[0, 0, 2] == 0) and torch.isfinite(w[1]).all()


# --------------------------------------------------------------------------- sliding window


def band_reference(q_len, k_len, window):
    """The window rule written out: query i (end-aligned: position i + k_len - q_len) sees key
    j iff position - window < j <= position."""
    allowed = torch.zeros(q_len, k_len, dtype=torch.bool)
    for i in range(q_len):
        position = i + k_len - q_len
        for j in range(k_len):
            allowed[i, j] = position - window < j <= position
    return allowed


@pytest.mark.parametrize("window", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("q_len,k_len", [(1, 1), (4, 4), (2, 6), (1, 6), (6, 6), (5, 3)])
def test_causal_mask_with_a_window_is_the_band(q_len, k_len, window):
    got = causal_mask(q_len, k_len, window=window)
    assert got.dtype == torch.bool and torch.equal(got, band_reference(q_len, k_len, window))


@pytest.mark.parametrize("window", [0, -2, 1.5, True, "4"])
def test_a_window_must_be_a_positive_integer(window):
    with pytest.raises(ValueError, match=r"window: expected an integer >= 1 or None, got"):
        causal_mask(3, window=window)
    with pytest.raises(ValueError, match=r"window: expected an integer >= 1 or None, got"):
        scaled_dot_product_attention(*_qkv(), causal=True, window=window)


def test_a_numpy_integer_window_is_taken_as_lengths_are():
    """Lengths took numpy integers (numbers.Integral) and the window refused them; the band and
    the output are the int window's, and the reference is the written-out band."""
    np = pytest.importorskip("numpy")
    got = causal_mask(4, 6, window=np.int64(2))
    assert torch.equal(got, band_reference(4, 6, 2))
    q, k, v = _qkv(t_q=4, t_k=6)
    out = scaled_dot_product_attention(q, k, v, causal=True, window=np.int32(2))
    expected, _, _ = reference_attention(q, k, v, band_reference(4, 6, 2))
    torch.testing.assert_close(out, expected.float())
    with pytest.raises(ValueError, match=r"window: expected an integer >= 1 or None, got"):
        causal_mask(4, window=np.int64(0))
    with pytest.raises(ValueError, match=r"window: expected an integer >= 1 or None, got"):
        causal_mask(4, window=np.True_)


def test_a_window_needs_causal():
    with pytest.raises(ValueError, match=r"window=2: a sliding window is causal.*causal=True"):
        scaled_dot_product_attention(*_qkv(), window=2)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mask_kind", ["none", "keys", "float"])
@pytest.mark.parametrize("window", [1, 2, 4, 7])
@pytest.mark.parametrize("q_len,k_len", [(7, 7), (1, 7), (3, 7)])
def test_window_on_every_path_matches_the_written_out_band(path, mask_kind, window, q_len, k_len):
    g = torch.Generator().manual_seed(window * 10 + q_len)
    q = torch.randn(2, 3, q_len, 4, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, k_len, 4, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, k_len, 5, generator=g, dtype=torch.float64)
    band = band_reference(q_len, k_len, window)  # (T_q, T_k)
    mask, combined = None, band
    if mask_kind == "keys":  # padding of the first key in row 1
        mask = torch.ones(2, 1, 1, k_len, dtype=torch.bool)
        mask[1, ..., 0] = False
        combined = band & mask
    elif mask_kind == "float":
        mask = torch.randn(2, 1, q_len, k_len, generator=g, dtype=torch.float64)
        combined = mask.masked_fill(~band, -math.inf)
    out = _run_path(path, q, k, v, mask, causal=True, window=window)
    want, _, _ = reference_attention(q, k, v, combined)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-12)


def test_a_window_as_long_as_the_keys_is_plain_causal():
    q, k, v = torch.randn(2, 6, 4), torch.randn(2, 6, 4), torch.randn(2, 6, 3)
    with torch.no_grad():
        plain = scaled_dot_product_attention(q, k, v, causal=True)
        for window in (6, 7, 100):
            got = scaled_dot_product_attention(q, k, v, causal=True, window=window)
            torch.testing.assert_close(got, plain, atol=0, rtol=0)


# --------------------------------------------------------------------------- grouped heads


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 3), (6, 2), (4, 1)])
@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("mask_kind", ["none", "keys", "per_head", "window"])
def test_grouped_heads_equal_repeated_heads_on_every_path(path, heads, kv_heads, q_len, mask_kind):
    # GQA / MQA: key/value head j serves query heads j*G .. j*G + G - 1 (Hugging Face's
    # repeat_kv, i.e. repeat_interleave), whichever path computes it.
    g = torch.Generator().manual_seed(heads * 7 + kv_heads + q_len)
    k_len, group = 5, heads // kv_heads
    q = torch.randn(2, heads, q_len, 4, generator=g, dtype=torch.float64)
    k = torch.randn(2, kv_heads, k_len, 4, generator=g, dtype=torch.float64)
    v = torch.randn(2, kv_heads, k_len, 3, generator=g, dtype=torch.float64)
    kw, mask, combined = dict(causal=True), None, band_reference(q_len, k_len, k_len)
    if mask_kind == "keys":
        mask = torch.tensor([[True] * k_len, [False, True, False, True, True]])[:, None, None, :]
        combined = combined & mask
    elif mask_kind == "per_head":
        mask = torch.rand(2, heads, q_len, k_len, generator=g) < 0.7
        combined = combined & mask
    elif mask_kind == "window":
        kw["window"] = 2
        combined = band_reference(q_len, k_len, 2)
    out = _run_path(path, q, k, v, mask, **kw)
    repeated = [t.repeat_interleave(group, dim=-3) for t in (k, v)]
    want, _, _ = reference_attention(q, *repeated, combined)
    assert out.shape == (2, heads, q_len, 3)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-12)


def test_grouped_heads_weights_and_gradients():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    out, weights = scaled_dot_product_attention(q, k, v, causal=True, return_weights=True)
    _, want_w, _ = reference_attention(
        q.detach(), *(t.detach().repeat_interleave(2, dim=-3) for t in (k, v)), causal=True
    )
    assert weights.shape == (2, 4, 3, 3)
    torch.testing.assert_close(weights, want_w)
    # Gradients reach the shared key/value heads (summed over the query heads they serve), on
    # the short training kernel and on the readable path alike.
    for return_weights in (False, True):
        assert torch.autograd.gradcheck(
            lambda q, k, v, rw=return_weights: _first(
                scaled_dot_product_attention(q, k, v, causal=True, return_weights=rw)
            ),
            (q, k, v),
        )


def _first(result):
    return result[0] if isinstance(result, tuple) else result


def test_heads_that_do_not_group_are_refused():
    q, k, v = torch.randn(2, 6, 3, 4), torch.randn(2, 4, 5, 4), torch.randn(2, 4, 5, 4)
    with pytest.raises(ValueError, match=r"do not broadcast.*multiple of the key/value heads"):
        scaled_dot_product_attention(q, k, v)


_SIZES = st.sampled_from([0, 1, 2, 3])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_SIZES, max_size=4).map(tuple), min_size=1, max_size=3))
def test_shape_broadcast_check_agrees_with_torch(shapes):
    # The plain-Python broadcast of the input checks against torch's own rule.
    try:
        expected = tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        expected = None
    assert _broadcast(*shapes) == expected


@pytest.mark.parametrize("vector", [0, 8, 16])
@pytest.mark.parametrize("t_k", [1, 4, 7, 8, 15, 16, 17, 40])
def test_short_kernel_softmax_equals_torch_on_both_sides_of_the_vector_width(
    monkeypatch, vector, t_k
):
    """Rows shorter than a vector take the separate passes, longer ones torch.softmax: the
    same weights either way (float32 rounding), -inf entries give 0, a NaN score a NaN row,
    and the scores passed in are overwritten, not copied."""
    from attnkit import attention_short

    monkeypatch.setattr(attention_short, "cpu_float_vector_width", lambda: vector)
    g = torch.Generator().manual_seed(t_k)
    scores = torch.randn(6, 5, t_k, generator=g) * 4
    scores[0, 0, 0] = float("nan")
    if t_k > 1:
        scores[1, :, -1] = float("-inf")  # a masked key
    want = torch.softmax(scores, dim=-1)
    got = attention_short._softmax(scores.clone())
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, equal_nan=True)
    assert torch.isnan(got[0, 0]).all() and not torch.isnan(got[1:]).any()
    if t_k > 1:
        assert (got[1, :, -1] == 0).all()
    if t_k < vector:  # the separate passes work in place
        inplace = scores.clone()
        assert attention_short._softmax(inplace).data_ptr() == inplace.data_ptr()


# --------------------------------------------------------------------------- the step kernel


def _position_major(g, lead, heads, t_k, d):
    """(..., H, T_k, d) views of a (..., T_max, H, d) buffer, as the translation decoder's
    self-attention cache hands its keys and values to attention."""
    buffer = torch.randn(*lead, t_k + 3, heads, d, generator=g)
    return buffer[..., :t_k, :, :].transpose(-3, -2)


def _step_masks(g, lead, heads, t_k):
    key = torch.rand(*lead, 1, 1, t_k, generator=g) > 0.3
    key[..., 0] = True
    key.view(-1, t_k)[0] = False  # the first row may attend to nothing: a zero output
    per_head = torch.rand(*lead, heads, 1, t_k, generator=g) > 0.4
    per_head[..., -1] = True
    additive = torch.randn(*lead, 1, 1, t_k, generator=g).masked_fill(~key, -math.inf)
    return {
        "none": None,
        "bool key mask": key,
        "bool per head": per_head,
        "additive": additive,
        "float64 additive": additive.double(),
        "1-D key mask": torch.arange(t_k) != 1,
        "per head, no batch dims": per_head.reshape(-1, heads, 1, t_k)[0],  # (H, 1, T_k)
    }


@pytest.mark.parametrize("mask_kind", ["none", "bool key mask", "bool per head", "additive",
                                       "float64 additive", "1-D key mask",
                                       "per head, no batch dims"])  # fmt: skip
@pytest.mark.parametrize("lead", [(3,), (2, 3)], ids=["one batch dim", "two batch dims"])
def test_step_kernel_matches_the_reference(monkeypatch, lead, mask_kind):
    """One query per row over position-major keys, on a CPU whose MKL is slow at it: the step
    kernel computes it, with the float64 reference's values (rows with no allowed key zero)."""
    monkeypatch.setattr(attention, "mkl_gemv_is_generic", lambda: True)
    calls = []
    kernel = attention.one_query_attention
    monkeypatch.setattr(attention, "one_query_attention", lambda *a: calls.append(1) or kernel(*a))
    g = torch.Generator().manual_seed(21)
    heads, t_k, d = 4, 7, 8
    q = torch.randn(*lead, 1, heads, d, generator=g).transpose(-3, -2)  # (..., H, 1, d)
    k, v = (_position_major(g, lead, heads, t_k, d) for _ in "kv")
    mask = _step_masks(g, lead, heads, t_k)[mask_kind]
    with torch.no_grad():
        out = scaled_dot_product_attention(q, k, v, mask)
    assert calls == [1]
    want = reference_attention(q, k, v, mask)[0]
    assert out.shape == (*lead, heads, 1, d) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    if mask_kind == "bool key mask":
        assert (out.reshape(-1, heads, d)[0] == 0).all()


@pytest.mark.parametrize("where", ["query", "key", "value", "masked key", "masked value"])
def test_step_kernel_propagates_nan_as_the_readable_path(monkeypatch, where):
    """A NaN reaches the rows that may attend to it and no other, as on the readable path."""
    monkeypatch.setattr(attention, "mkl_gemv_is_generic", lambda: True)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 1, 3, 4, generator=g).transpose(-3, -2)  # (2, 3, 1, 4)
    k, v = (_position_major(g, (2,), 3, 5, 4) for _ in "kv")
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[0, ..., 2] = False  # row 0 may not see key 2
    if where == "query":
        q[1, 2, 0, 1] = math.nan
    elif where in ("key", "value"):
        (k if where == "key" else v)[1, 0, 3, 2] = math.nan
    else:  # behind row 0's mask: 0 x NaN in the step kernel, recomputed on the readable path
        (k if where == "masked key" else v)[0, 1, 2, 0] = math.nan
    assert attention._select_backend(q, k, v, mask, dropout=0.0, return_weights=False) == "step"
    with torch.no_grad():
        out = scaled_dot_product_attention(q, k, v, mask)
    want = scaled_dot_product_attention(q, k, v, mask, return_weights=True)[0]  # readable
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5, equal_nan=True)
    assert torch.isnan(out).any() == (not where.startswith("masked"))


def test_step_kernel_rule(monkeypatch):
    """The step kernel takes float32 single-query calls over position-major keys without
    dropout or autograd, where MKL runs torch's kernel in generic code; GPT's head-major
    cache, several queries, other dtypes and Intel CPUs keep torch's kernel (or the short
    one for training)."""
    monkeypatch.setattr(attention, "mkl_gemv_is_generic", lambda: True)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(4, 1, 8, 16, generator=g).transpose(1, 2)  # (4, 8, 1, 16)
    k, v = (_position_major(g, (4,), 8, 10, 16) for _ in "kv")

    def pick(q, k, v, dropout=0.0):
        return attention._select_backend(q, k, v, None, dropout=dropout, return_weights=False)

    assert pick(q, k, v) == "step"
    assert pick(q, k.contiguous(), v.contiguous()) == "fused"  # head-major (GPT's cache)
    assert pick(q.expand(4, 8, 2, 16), k, v) == "fused"  # two queries per row
    assert pick(q.double(), k.double(), v.double()) == "fused"
    assert pick(q, k, v, dropout=0.1) == "fused"
    assert pick(q, k[..., :1, :], v[..., :1, :]) == "fused"  # one key: no layout to speak of
    assert pick(q.requires_grad_(), k, v) == "short"  # training
    monkeypatch.setattr(attention, "mkl_gemv_is_generic", lambda: False)
    assert pick(q.detach(), k, v) == "fused"


@pytest.mark.parametrize(
    "case",
    ["plain", "causal", "bool mask", "float mask", "window", "grouped", "weights", "dropout"],
)
def test_meta_tensors_give_meta_outputs_of_the_right_shape(case):
    """Tensors on the meta device (shapes without data: how models are sized and built without
    memory) went through the backends and then failed in the data-dependent checks
    ("Tensor.item() cannot be called on meta tensors"). They give meta outputs of the shapes a
    CPU call gives."""
    kwargs, heads, kv_heads = {}, 4, 4
    if case == "causal":
        kwargs = dict(causal=True)
    elif case == "bool mask":
        kwargs = dict(mask=torch.ones(2, 1, 3, 5, dtype=torch.bool))
    elif case == "float mask":
        kwargs = dict(mask=torch.zeros(3, 5))
    elif case == "window":
        kwargs = dict(causal=True, window=2)
    elif case == "grouped":
        kv_heads = 2
    elif case == "weights":
        kwargs = dict(return_weights=True)
    elif case == "dropout":
        kwargs = dict(dropout=0.1)
    shapes = [(2, heads, 3, 8), (2, kv_heads, 5, 8), (2, kv_heads, 5, 6)]
    cpu = scaled_dot_product_attention(*(torch.randn(s) for s in shapes), **kwargs)
    meta_kwargs = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    meta = scaled_dot_product_attention(
        *(torch.empty(s, device="meta") for s in shapes), **meta_kwargs
    )
    cpu, meta = (x if isinstance(x, tuple) else (x,) for x in (cpu, meta))
    assert [t.shape for t in meta] == [t.shape for t in cpu]
    assert all(t.is_meta for t in meta)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_float32_mask_row_of_large_negatives_gives_the_same_on_every_path(dtype):
    """A float mask adds the same -1e9 to every score of row 1: softmax ignores a constant,
    so the row is the softmax of its own scores, as float64 arithmetic (which keeps the scores
    beside -1e9) computes it. The fast path and the readable one (return_weights) agree; the
    readable one used to lose the scores against -1e9 in float32 and give equal weights."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3 if i == 0 else 4, 8).to(dtype) for i in range(3))
    mask = torch.zeros(3, 4)
    mask[1] = -1e9
    mask[2, 1] = -1e9  # a row with one key left out: the same on both paths as before
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(8) + mask.double()
    reference = torch.softmax(scores, dim=-1) @ v.double()  # (1, 2, 3, 8) float64
    fast = scaled_dot_product_attention(q, k, v, mask)
    readable, weights = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    tol = dict(atol=3e-2, rtol=0) if dtype == torch.bfloat16 else dict(atol=4e-3, rtol=0)
    torch.testing.assert_close(fast.double(), reference, **tol)
    torch.testing.assert_close(readable.double(), reference, **tol)
    assert weights[0, :, 1].float().std(dim=-1).min() > 0.02  # not the equal weights of 0.25
