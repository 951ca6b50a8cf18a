"""attnkit.decoding.memory_bound: the estimate of what a search allocates. (The memory the
machine has free is tested in tests/test_hardware.py; the searches' refusals in
test_bounds.py.)"""

from __future__ import annotations

import torch

from attnkit.decoding.memory_bound import decoding_memory
from attnkit.decoding.state import prefill
from tests.helpers.decoding import pad_batch, random_sources


def test_memory_estimate_covers_what_decoding_allocates(random_model):
    """The estimate is at least the bytes of the buffers decoding really allocates (measured
    on the tensors prefill and the first steps make)."""
    src = pad_batch(random_sources(3, 24, 4, 9, seed=1))
    beam, positions = 4, 12
    state = prefill(random_model, src, num_positions=positions, use_cache=True, bos_id=1)
    state.reorder(torch.arange(3).repeat_interleave(beam))  # what the first beam step does
    cache_bytes = sum(
        t.nelement() * t.element_size() for pair in state.caches for c in pair for t in (c.k, c.v)
    )
    rows = 3 * beam
    lprobs = rows * random_model.config.tgt_vocab_size * 4
    tokens = state.tokens.nelement() * state.tokens.element_size()
    estimate = decoding_memory(random_model, sentences=3, beam_size=beam, num_positions=positions,
                               src_len=src.shape[1], use_cache=True)  # fmt: skip
    assert estimate >= cache_bytes + lprobs + tokens
    assert estimate <= 2 * (cache_bytes + lprobs + tokens)  # an estimate, not a wild bound
