"""attnkit.decoding.memory_bound: the estimate of what a search allocates, and the memory
the machine has free. (The searches' refusals are in test_bounds.py.)"""

from __future__ import annotations

import torch

from attnkit.decoding import memory_bound
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


def test_available_memory_is_known_on_this_machine():
    free = memory_bound.available_memory(torch.device("cpu"))
    assert free is not None and free > 0
    assert memory_bound.available_memory(torch.device("meta")) is None


def test_available_memory_reads_meminfo_and_the_cgroup_limit(monkeypatch):
    import io

    files = {
        "/proc/meminfo": "MemTotal: 32000000 kB\nMemAvailable:   8000000 kB\n",
        "/sys/fs/cgroup/memory.max": "4294967296\n",  # 4 GiB
        "/sys/fs/cgroup/memory.current": "3221225472\n",  # 3 GiB used ...
        "/sys/fs/cgroup/memory.stat": "anon 1\ninactive_file 536870912\nfile 2\n",  # 0.5 GiB cache
    }

    def fake_open(path, *args, **kwargs):
        if path not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[path])

    monkeypatch.setattr(memory_bound, "open", fake_open, raising=False)
    cpu = torch.device("cpu")
    assert memory_bound.available_memory(cpu) == (1 << 30) + (1 << 29)  # 4 - 3 + 0.5 GiB
    files["/sys/fs/cgroup/memory.max"] = "max\n"
    assert memory_bound.available_memory(cpu) == 8_000_000 * 1024
    del files["/proc/meminfo"]
    assert memory_bound.available_memory(cpu) is None
