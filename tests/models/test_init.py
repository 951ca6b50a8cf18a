"""attnkit.models.init.skip_random_init: modules built under it draw nothing from the random
generator, keep their constant fills, and the mode ends with the block."""

from __future__ import annotations

import torch
from torch import nn

from attnkit.models.init import skip_random_init


def _build() -> nn.Module:
    return nn.Sequential(nn.Embedding(11, 4), nn.Linear(4, 6), nn.LayerNorm(6))


def test_nothing_is_drawn_and_constant_fills_stay():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with skip_random_init():
        model = _build()
    assert torch.equal(torch.get_rng_state(), before)  # no random fill ran
    assert torch.equal(model[2].weight, torch.ones(6)) and torch.equal(
        model[2].bias, torch.zeros(6)
    )
    _build()  # outside the block, random init is back
    assert not torch.equal(torch.get_rng_state(), before)
