"""The tutorial's written-out RoPE and grouped-query attention equal the library's fast path:
:class:`attnkit.modules.RotaryEmbedding` (angles once, one rotation of queries and keys) and
``MultiHeadAttention(num_kv_heads=...)`` with ``rotary`` (one fused projection, the key/value
heads broadcast by the attention function instead of repeated).

The tutorial forms are checked against Hugging Face's Llama and Meta's Llama code in
tests/test_tutorial.py; here the two attnkit forms are held to each other.
"""

import pytest
import torch

from attnkit import tutorial
from attnkit.modules import MultiHeadAttention, RotaryEmbedding

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("base", [10_000.0, 500_000.0])
@pytest.mark.parametrize("start", [0, 29])
def test_tutorial_rope_equals_the_fast_path(device, dtype, interleaved, base, start):
    x = torch.randn(2, 7, 3, 8, device=device, dtype=dtype)  # (B, T, heads, hd) as projected
    positions = torch.arange(start, start + 7, device=device)
    fast = RotaryEmbedding(8, base=base, interleaved=interleaved)(positions, dtype=dtype)
    written_out = tutorial.RotaryEmbedding(8, base, interleaved=interleaved)
    expected = written_out(x.transpose(1, 2), positions).transpose(1, 2)  # via (B, heads, T, hd)
    torch.testing.assert_close(fast.rotate(x), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_heads", [1, 2, 4])  # MQA, GQA, MHA
@pytest.mark.parametrize("rope_base", [None, 10_000.0])
@pytest.mark.parametrize("qkv_bias", [False, True])
def test_tutorial_gqa_equals_the_fast_path(device, kv_heads, rope_base, qkv_bias):
    torch.manual_seed(9)
    d, heads, t = 16, 4, 9
    written_out = tutorial.GroupedQueryAttention(
        d, d, t, 0.0, heads, kv_heads, qkv_bias, rope_base=rope_base
    ).to(device)
    fast = MultiHeadAttention(d, heads, num_kv_heads=kv_heads, qkv_bias=qkv_bias).to(device)
    projections = (written_out.Q_weights, written_out.K_weights, written_out.V_weights)
    with torch.no_grad():
        fast.in_proj.weight.copy_(torch.cat([p.weight for p in projections]))
        if qkv_bias:
            fast.in_proj.bias.copy_(torch.cat([p.bias for p in projections]))
        fast.out_proj.load_state_dict(written_out.out_proj.state_dict())
    x = torch.randn(3, t, d, device=device)
    rotary = None
    if rope_base is not None:
        rotary = RotaryEmbedding(d // heads, base=rope_base)(torch.arange(t, device=device))
    out = fast(x, causal=True, rotary=rotary).output
    torch.testing.assert_close(out, written_out(x))
