"""The memory bound of decoding: refuse, before allocating, a search that cannot fit.

"Memory" here is the device's (RAM or GPU memory), not the encoder output that the decoder
attends to. :func:`decoding_memory` estimates from the sizes alone what a search allocates (its
KV caches, scores and token buffer); :func:`available_memory` (:mod:`attnkit.hardware`'s,
re-exported here) asks the operating system (and a container's cgroup) what a new allocation
can still get; :func:`check_decoding_memory` compares the two and raises a ValueError naming
both and the largest beam that fits. :func:`~attnkit.decoding.generate.greedy_search` and
:func:`~attnkit.decoding.generate.beam_search` call it before they allocate, and
:class:`~attnkit.decoding.Translator` splits its batches to stay under half of what is free.
"""

from __future__ import annotations

from torch import Tensor

from attnkit.decoding.config import DecodingConfig
from attnkit.hardware import available_memory

__all__ = ["available_memory", "check_decoding_memory", "decoding_memory"]


def decoding_memory(
    model, *, sentences: int, beam_size: int, num_positions: int, src_len: int, use_cache: bool
) -> int:
    """Bytes that decoding ``sentences`` sentences at once allocates, estimated from the sizes.

    Counted: the self-attention caches (``sentences x beam`` rows of ``num_positions``
    keys and values per decoder layer), the cross-attention caches, a (rows, V) float32
    table of log-probabilities (an upper bound: the searches reduce them a slice of about 8 MB
    at a time, :func:`~attnkit.decoding.state.lprob_slices`), the token buffer and, without
    the cache, the (rows, positions, V) logits of a full recomputation. One more
    self-attention buffer is counted for the spare a beam reorder gathers into. Activations
    of a single step are small next to these.
    """
    c = model.config
    rows = sentences * beam_size
    elem = next(model.parameters()).element_size()
    d = c.d_model
    layers = c.num_decoder_layers
    total = rows * c.tgt_vocab_size * 4 + rows * num_positions * 8  # lprobs, tokens
    if use_cache:
        self_kv = layers * 2 * rows * num_positions * d * elem
        cross_kv = layers * 2 * sentences * src_len * d * elem
        total += self_kv + cross_kv + self_kv // (2 * layers)
    else:
        total += rows * num_positions * (c.tgt_vocab_size * elem + 4 * layers * d * elem)
    return total


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_decoding_memory(
    model, src: Tensor, config: DecodingConfig, num_positions: int, *, available: int | None
) -> None:
    """Raise before allocating if decoding ``src`` with ``config`` cannot fit in memory.

    Args:
        available: bytes free on the device (:func:`available_memory`); None skips the check.

    Raises:
        ValueError: naming the estimate, the memory available and the largest beam that fits.
    """
    if available is None:
        return
    sizes = dict(num_positions=num_positions, src_len=src.shape[1], use_cache=config.use_cache)
    need = decoding_memory(model, sentences=src.shape[0], beam_size=config.beam_size, **sizes)
    if need <= available:
        return
    one = decoding_memory(model, sentences=src.shape[0], beam_size=1, **sizes)
    fits = max(0, int(config.beam_size * available / need)) if one <= available else 0
    raise ValueError(
        f"beam_size: decoding {src.shape[0]} sentence(s) with beam_size={config.beam_size} "
        f"and up to {num_positions} positions needs about {_gib(need)} (decoder caches and "
        f"scores), more than the {_gib(available)} of memory available on {src.device}; "
        + (
            f"use a beam of at most {fits} or fewer sentences per batch"
            if fits >= 1
            else "decode fewer sentences per batch or shorter outputs (max_len_a, max_len_b)"
        )
    )
