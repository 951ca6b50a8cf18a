"""The decoder's state between steps, and the two calls that make and advance it.

The decoding is split as in gpt-fast's ``generate.py``; this module is its first two parts,
the searches in :mod:`attnkit.decoding.generate` are the third:

* :func:`prefill` encodes the source once and allocates the decoder caches, with one row per
  sentence: every beam starts as the same bos, so the first step is computed once per
  sentence and the first beam step copies each row to its beams;
* :func:`decode_one_token` runs the decoder on the newest token only, reading and extending the
  per-layer self-attention :class:`~attnkit.modules.KVCache` (preallocated, reordered into a spare
  when beams are selected). Cross-attention keys/values are projected once per sentence on the
  first step and shared by its beams. With ``use_cache=False`` it recomputes the whole prefix
  with ``model.decode`` instead (the reference path, and the baseline of
  ``benchmarks/decode.py``).

:class:`DecoderState` keeps the bookkeeping: hypothesis rows and sentence rows, the encoder
memory (one row per sentence) and :meth:`DecoderState.reorder`, which both follows the beams
and drops the sentences that are done from the tokens, the memory and every cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.modules.kv_cache import KVCache

_HEAD_CHUNK_ELEMENTS = 1 << 21  # logits per slice of the output layer (8 MB in float32)

__all__ = ["DecoderState", "decode_one_token", "lprob_slices", "prefill"]


@dataclass
class DecoderState:
    """Everything the decoder needs between steps.

    Hypotheses are rows ``sentence * group + j``: one row per sentence after :func:`prefill`
    (all beams of a sentence are the same bos), ``beam`` rows after the first beam step.
    What depends only on the sentence is kept once per sentence.

    Attributes:
        tokens: (N, num_positions) bos, then the tokens generated so far (pad after them).
        memory: (B, S, d_model) encoder output, one row per sentence.
        src_mask: (B, 1, S) source key mask (True = real token).
        caches: per layer, the self-attention cache (N rows) and the cross-attention cache
            (B rows: filled on the first step, shared by the beams); None = recompute.
        lprobs: the buffer :func:`decode_one_token` and :func:`lprob_slices` write into.
        spare: the buffer a beam step's :meth:`~attnkit.modules.KVCache.reorder` gathers the
            next layer's keys into (one for all layers).
    """

    tokens: Tensor
    memory: Tensor
    src_mask: Tensor
    caches: list[tuple[KVCache, KVCache]] | None
    lprobs: Tensor | None = None  # (rows, V) reused output of decode_one_token / lprob_slices
    spare: Tensor | None = None  # the self-attention caches' spare buffer (KVCache.reorder)

    @property
    def group(self) -> int:
        """Hypotheses (rows) per sentence."""
        return self.tokens.shape[0] // self.memory.shape[0]

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep hypotheses ``rows`` (N',), in their new order (N' may be a multiple of N: the
        first beam step copies each sentence's row to its beams); when finished sentences
        leave the batch, also keep only ``sentences`` (B',), with ``N' = B' x beam``."""
        self.tokens = self.tokens.index_select(0, rows)
        if sentences is not None:
            self.memory = self.memory.index_select(0, sentences)
            self.src_mask = self.src_mask.index_select(0, sentences)
        spare = self.spare
        for self_cache, cross_cache in self.caches or ():
            spare = self_cache.reorder(rows, spare)  # one spare buffer passed along the layers
            if sentences is not None:
                cross_cache.reorder(sentences)
        self.spare = spare


def prefill(
    model, src: Tensor, *, num_positions: int, use_cache: bool, bos_id: int
) -> DecoderState:
    """Encode ``src`` (B, S) and set up decoding, one hypothesis (bos) per sentence.

    Beam search widens the state to ``beam`` rows per sentence at its first step, so the
    decoder reads bos once per sentence, not once per beam.

    Args:
        model: a :class:`~attnkit.models.Transformer` (in eval mode).
        src: (B, S) source ids, eos-terminated, right-padded with ``model.config.pad_id``.
        num_positions: the most decoder inputs any row will read: bos and the generated
            tokens, never the final eos (so the token limit + 1).
        use_cache: allocate KV caches for ``num_positions`` decoder positions.
        bos_id: the id every hypothesis starts with.

    Returns:
        A :class:`DecoderState` with B rows.
    """
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, S)
    caches = model.init_cache(memory.shape[0], num_positions, memory) if use_cache else None
    tokens = torch.full(
        (memory.shape[0], num_positions), model.config.pad_id, dtype=torch.long,
        device=src.device,
    )  # (B, num_positions)  # fmt: skip
    tokens[:, 0] = bos_id
    return DecoderState(tokens, memory, src_mask, caches)


def decode_one_token(model, state: DecoderState, step: int) -> Tensor:
    """Log-probabilities (N, V), in float32, of the token after position ``step``.

    The result lives in a buffer of ``state`` that the next call overwrites: it is computed
    in slices of rows (each slice's logits stay in cache between the projection and the
    softmax, and no (N, V) tensor is allocated per step; together about 1.3x faster for the
    output layer at (1000, 8000) on CPU). :func:`lprob_slices` hands the slices over instead,
    for a search that reduces each one while it is still in cache.
    """
    n = 0
    for rows, _ in lprob_slices(model, state, step, keep=True):
        n = rows.stop
    return state.lprobs[:n]


def lprob_slices(
    model, state: DecoderState, step: int, *, keep: bool = False
) -> Iterator[tuple[slice, Tensor]]:
    """The log-probabilities of :func:`decode_one_token`, a slice of rows at a time.

    Yields ``(rows, lprobs)``: lprobs (rows, V) float32 of the hypotheses ``rows``, computed
    just before it is yielded; a slice holds whole sentences (all :attr:`DecoderState.group`
    rows of each). Without ``keep`` every slice is written to the same scratch
    buffer (about 8 MB), valid until the next slice is asked for: a search that reduces each
    slice at once (top-k, max) reads it from cache, not from memory, and no (N, V) tensor is
    written at all (at beam 5 with 500 sentences, 60 MB a step). With ``keep`` the slices are
    the rows of ``state.lprobs``, as :func:`decode_one_token` returns them.
    """
    if state.caches is None:
        group = state.group
        prefix = state.tokens[:, : step + 1]  # (N, step + 1)
        memory = state.memory.repeat_interleave(group, dim=0)  # (N, S, D)
        src_mask = state.src_mask.repeat_interleave(group, dim=0)  # (N, 1, S)
        full = model.decode(prefix, memory, src_mask).output[:, -1]  # (N, V)

        def logits(rows: slice) -> Tensor:
            return full[rows]
    else:
        # Each sentence's memory row serves its `group` consecutive hypotheses: cross-attention
        # keys/values are computed and cached once per sentence, not once per beam.
        new = state.tokens[:, step : step + 1]  # (N, 1)
        hidden = model.decode(
            new, state.memory, state.src_mask, caches=state.caches, offset=step, project=False
        ).output[:, -1]  # (N, D)

        def logits(rows: slice) -> Tensor:
            return model.output(hidden[rows])  # (rows, V)

    n, vocab, group = state.tokens.shape[0], model.config.tgt_vocab_size, state.group
    chunk = max(1, _HEAD_CHUNK_ELEMENTS // vocab)
    chunk = max(group, chunk - chunk % group)  # whole sentences: all `group` rows of each
    rows_needed = n if keep else min(n, chunk)
    if state.lprobs is None or state.lprobs.shape[0] < rows_needed:
        state.lprobs = torch.empty(
            rows_needed, vocab, dtype=torch.float32, device=state.tokens.device
        )
    for start in range(0, n, chunk):
        rows = slice(start, min(start + chunk, n))
        out = state.lprobs[rows] if keep else state.lprobs[: rows.stop - start]  # (rows, V)
        x = logits(rows)  # (rows, V), the model's dtype
        if x.dtype != torch.float32:
            # Cast into the float32 buffer, then in place: log_softmax(dtype=) would allocate
            # (and page in) an 8 MB float32 copy at every slice.
            out.copy_(x)
            x = out
        torch.log_softmax(x, dim=-1, out=out)
        yield rows, out
