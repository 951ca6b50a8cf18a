"""attnkit.decoding.state: the decoder's state between steps and its reordering."""

from __future__ import annotations

import torch

from attnkit.decoding.state import prefill
from tests.helpers.decoding import BOS, pad_batch


def test_beam_reorder_keeps_the_cache_buffers(random_model):
    """The first beam step widens one row per sentence to its beams; later beam steps gather
    the filled positions into one spare buffer passed along the layers: after the first such
    step the same buffers circulate, none is allocated, and each holds what it should."""
    state = prefill(random_model, pad_batch([[5, 6]]), num_positions=4, use_cache=True,
                    bos_id=BOS)  # fmt: skip
    self_cache, cross_cache = state.caches[0]
    assert state.group == 1 and self_cache.k.shape[0] == 1 and self_cache.max_len == 4
    self_cache.update(torch.randn(1, 4, 1, 8), torch.randn(1, 4, 1, 8))
    state.reorder(torch.tensor([0, 0, 0]))  # the first step: 3 beams of sentence 0
    assert state.group == 3 and self_cache.k.shape[0] == 3 and self_cache.max_len == 4
    for layer_self, _ in state.caches:
        layer_self.update(torch.randn(3, 4, 1, 8), torch.randn(3, 4, 1, 8))

    def buffers() -> set[int]:
        ptrs = {state.spare.data_ptr()} if state.spare is not None else set()
        for layer_self, _ in state.caches:
            ptrs |= {layer_self.k.data_ptr(), layer_self.v.data_ptr()}
        return ptrs

    state.reorder(torch.tensor([1, 0, 2]))  # the first same-size reorder makes the spare
    before = buffers()
    assert len(before) == 2 * len(state.caches) + 1
    k_before, v_before = self_cache.k.clone(), self_cache.v.clone()
    state.reorder(torch.tensor([2, 2, 0]))
    assert buffers() == before and self_cache.max_len == 4
    assert torch.equal(self_cache.k[:, :, :2], k_before[[2, 2, 0], :, :2])
    assert torch.equal(self_cache.v[:, :, :2], v_before[[2, 2, 0], :, :2])
    assert cross_cache.k.shape[0] == 1  # once per sentence
