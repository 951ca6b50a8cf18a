"""attnkit.decoding.state: the decoder's state between steps and its reordering."""

from __future__ import annotations

import torch

from attnkit.decoding.state import prefill
from tests.helpers.decoding import BOS, pad_batch


def test_beam_reorder_keeps_the_cache_buffers(random_model):
    """The first beam step widens one row per sentence to its beams; later beam steps gather
    the filled positions in place: the preallocated buffers stay."""
    state = prefill(random_model, pad_batch([[5, 6]]), num_positions=4, use_cache=True,
                    bos_id=BOS)  # fmt: skip
    self_cache, cross_cache = state.caches[0]
    assert state.group == 1 and self_cache.k.shape[0] == 1 and self_cache.max_len == 4
    self_cache.update(torch.randn(1, 4, 1, 8), torch.randn(1, 4, 1, 8))
    state.reorder(torch.tensor([0, 0, 0]))  # the first step: 3 beams of sentence 0
    assert state.group == 3 and self_cache.k.shape[0] == 3 and self_cache.max_len == 4
    self_cache.update(torch.randn(3, 4, 1, 8), torch.randn(3, 4, 1, 8))
    k_before, ptr = self_cache.k.clone(), self_cache.k.data_ptr()
    state.reorder(torch.tensor([2, 2, 0]))
    assert self_cache.k.data_ptr() == ptr and self_cache.max_len == 4
    assert torch.equal(self_cache.k[:, :, :2], k_before[[2, 2, 0], :, :2])
    assert cross_cache.k.shape[0] == 1  # once per sentence
