"""The generation head equals the model's lm_head in every layout, and follows weight changes."""

import pytest
import torch
from torch import nn

from attnkit.generation.head import OutputHead


class _Model(nn.Module):
    def __init__(self, dtype, bias=False):
        super().__init__()
        self.lm_head = nn.Linear(16, 50, bias=bias).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_equals_lm_head(dtype, bias):
    model = _Model(dtype, bias)
    x = torch.randn(3, 16, dtype=dtype)
    head = OutputHead(model)
    assert (head.transposed is not None) == (dtype == torch.float32)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(head(x), model.lm_head(x), **tol)


def test_copy_is_reused_and_refreshed_after_an_in_place_change():
    model = _Model(torch.float32)
    first = OutputHead(model).transposed
    assert OutputHead(model).transposed is first
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    x = torch.randn(2, 16)
    head = OutputHead(model)
    assert head.transposed is not first
    torch.testing.assert_close(head(x), model.lm_head(x))
