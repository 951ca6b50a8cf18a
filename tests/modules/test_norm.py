"""RMSNorm against Hugging Face's LlamaRMSNorm and torch.nn.RMSNorm; make_norm by name."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from attnkit.modules import RMSNorm
from attnkit.modules.norm import make_norm


def _pair(d=16, eps=1e-6, seed=0):
    torch.manual_seed(seed)
    ours, hf = RMSNorm(d, eps=eps), LlamaRMSNorm(d, eps=eps)
    with torch.no_grad():
        hf.weight.normal_()
        ours.weight.copy_(hf.weight)
    return ours, hf


@pytest.mark.parametrize("eps", [1e-6, 1e-5, 0.5])
@pytest.mark.parametrize("shape", [(3, 5, 16), (16,), (1, 1, 16)])
def test_rms_norm_equals_hugging_face_in_float32(shape, eps):
    ours, hf = _pair(eps=eps)
    x = torch.randn(shape) * 3
    torch.testing.assert_close(ours(x), hf(x), atol=0, rtol=0)
    reference = nn.RMSNorm(16, eps=eps)
    with torch.no_grad():
        reference.weight.copy_(ours.weight)
    torch.testing.assert_close(ours(x), reference(x), atol=1e-6, rtol=1e-6)


def test_rms_norm_in_bfloat16_is_one_rounding_of_the_formula():
    # torch's fused kernel rounds once; Hugging Face rounds x / rms to bfloat16 and then g * it
    # again. Ours is within one bfloat16 rounding of the formula (on the bfloat16 inputs) and
    # of Hugging Face's result, and on average at least as close to the formula.
    ours, hf = _pair()
    ours, hf = ours.to(torch.bfloat16), hf.to(torch.bfloat16)
    x = (torch.randn(40, 7, 16) * 3).to(torch.bfloat16)
    g, xd = ours.weight.detach().double(), x.double()
    exact = g * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + ours.eps)
    got, theirs = ours(x), hf(x)
    assert got.dtype == torch.bfloat16
    half_ulp = 2**-8  # bfloat16 keeps 8 significant bits
    torch.testing.assert_close(got.double(), exact, atol=0, rtol=half_ulp)
    torch.testing.assert_close(got.double(), theirs.double(), atol=0, rtol=4 * half_ulp)
    assert (got.double() - exact).abs().mean() <= (theirs.double() - exact).abs().mean()


def test_rms_norm_gradients_match_the_formula():
    ours, _ = _pair(d=6)
    ours = ours.double()
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ours, (x,))

    def formula(x):
        return ours.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + ours.eps)

    torch.testing.assert_close(ours(x), formula(x))


def test_make_norm_by_name():
    assert isinstance(make_norm("layer", 8, eps=1e-5), nn.LayerNorm)
    rms = make_norm("rms", 8, eps=1e-3)
    assert isinstance(rms, RMSNorm) and rms.eps == 1e-3 and rms.weight.shape == (8,)
    assert [name for name, _ in rms.named_parameters()] == ["weight"]  # no shift
    with pytest.raises(ValueError, match=r"norm: expected one of \['layer', 'rms'\], got 'batch'"):
        make_norm("batch", 8, eps=1e-5)


@pytest.mark.parametrize("eps", [1e-6, 0.5])
@pytest.mark.parametrize("shape", [(3, 5, 16), (16,), (2, 1, 16)])
def test_rms_norm_inference_path_equals_hugging_face(shape, eps):
    """Without autograd on a CPU, RMSNorm runs as LayerNorm over [x, -x] (one fused kernel):
    equal to Hugging Face's LlamaRMSNorm up to float32 rounding, and in bfloat16 within one
    rounding of the formula, as the autograd path."""
    ours, hf = _pair(eps=eps)
    x = torch.randn(shape) * 3
    with torch.no_grad():
        fast, want = ours(x), hf(x)
    torch.testing.assert_close(fast, want, atol=1e-6, rtol=2e-6)
    with torch.no_grad():
        ours_bf16 = ours.to(torch.bfloat16)
        xb = x.to(torch.bfloat16)
        got = ours_bf16(xb)
    g, xd = ours_bf16.weight.detach().double(), xb.double()
    exact = g * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    torch.testing.assert_close(got.double(), exact, atol=0, rtol=2**-8)


@pytest.mark.parametrize("eps", [-1.0, math.nan, math.inf, "1e-6"])
def test_a_bad_epsilon_is_named(eps):
    """A negative epsilon gave NaN outputs (the root of a negative variance)."""
    with pytest.raises(ValueError, match=r"eps: expected a finite number >= 0"):
        RMSNorm(8, eps=eps)
    with pytest.raises(ValueError, match=r"eps: expected a finite number >= 0"):
        make_norm("layer", 8, eps=eps)
