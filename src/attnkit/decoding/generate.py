"""Greedy and beam search over a :class:`~attnkit.models.Transformer`, batched over sentences.

The decoding is split as in gpt-fast's ``generate.py``:

* :func:`prefill` encodes the source once and allocates the decoder caches, with one row per
  sentence: every beam starts as the same bos, so the first step is computed once per
  sentence and the first beam step copies each row to its beams;
* :func:`decode_one_token` runs the decoder on the newest token only, reading and extending the
  per-layer self-attention :class:`~attnkit.modules.KVCache` (preallocated, reordered in place
  when beams are selected). Cross-attention keys/values are projected once per sentence on the
  first step and shared by its beams. With ``use_cache=False`` it recomputes the whole prefix
  with ``model.decode`` instead (the reference path, and the baseline of
  ``benchmarks/decode.py``);
* :func:`greedy_search` / :func:`beam_search` loop over steps; :func:`generate` picks one.

Beam search follows fairseq's ``SequenceGenerator``: :meth:`BeamSearch.step` proposes
``2 x beam`` candidates; eos candidates among the best ``beam`` become finished hypotheses
(scored with the length penalty) and the best ``beam`` others stay active. A sentence is done
when it has ``beam`` finished hypotheses, or at its maximum length, where eos is forced.

Batch-size invariance. Every decision is per sentence: the maximum length comes from the
sentence's own source length, finished hypotheses and scores are kept per sentence, and padding
is masked in the encoder and in cross-attention. Sentences that are done leave the batch (their
rows are dropped from the tokens, the memory and every cache), so they cost nothing afterwards
and cannot interact with the others. Translating sentences one at a time or many at a time
gives the same tokens (up to float rounding differences between batch shapes, which only
matter at exact ties).

Bounds. :class:`DecodingConfig` refuses beams above :data:`MAX_BEAM_SIZE`, non-finite or
negative length settings and non-finite length penalties; the length limit is clamped to the
model's ``max_len - 1`` before it becomes an integer, so any finite ``max_len_a`` works. Before
allocating, :func:`check_decoding_memory` compares an estimate of the caches and scores
(:func:`decoding_memory`) with the memory free on the device and refuses, naming both, what
cannot fit; :class:`~attnkit.decoding.Translator` splits its batches to stay under half of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.decoding.search import LENGTH_PENALTY_STYLES, BeamSearch, LengthPenalty
from attnkit.modules.kv_cache import KVCache

_HEAD_CHUNK_ELEMENTS = 1 << 21  # logits per slice of the output layer (8 MB in float32)
DEFAULT_BOS_ID = SubwordTokenizer.bos_id  # the ids of attnkit's tokenizer, used when a
DEFAULT_EOS_ID = SubwordTokenizer.eos_id  # DecodingConfig leaves bos_id/eos_id unset

__all__ = [
    "DEFAULT_BOS_ID",
    "DEFAULT_EOS_ID",
    "MAX_BEAM_SIZE",
    "DecoderState",
    "DecodingConfig",
    "Hypothesis",
    "available_memory",
    "beam_search",
    "check_decoding_memory",
    "decoding_memory",
    "decode_one_token",
    "generate",
    "greedy_search",
    "max_lengths",
    "prefill",
]


MAX_BEAM_SIZE = 1024
"""The largest beam :class:`DecodingConfig` accepts. Quality stops improving long before (beams
of 4-10 are usual, and larger beams favour short outputs); the memory check of
:func:`check_decoding_memory` is the bound that matters for a given model and batch."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class DecodingConfig:
    """How to search. Lengths count generated tokens without bos and eos.

    ``bos_id`` / ``eos_id`` None (the default) means "the tokenizer's":
    :class:`~attnkit.decoding.Translator` fills them from its tokenizer (:meth:`with_ids`), and
    :func:`generate` called directly on ids uses :data:`DEFAULT_BOS_ID` / :data:`DEFAULT_EOS_ID`,
    the fixed ids of attnkit's :class:`~attnkit.data.SubwordTokenizer`.
    """

    beam_size: int = 5  # 1 = greedy search; 1 <= beam_size <= MAX_BEAM_SIZE (and memory)
    max_len_a: float = 1.2  # a sentence stops after max_len_a * src_len + max_len_b tokens
    max_len_b: int = 10  # (src_len without eos/pad; capped by the model's max_len - 1)
    min_len: int = 1  # eos is forbidden before this many tokens (capped like the limit)
    lenpen: float = 1.0  # length penalty exponent alpha; 0 = rank by summed log-prob
    lenpen_style: str = "fairseq"  # "fairseq": len**alpha, "gnmt": ((5 + len) / 6)**alpha
    n_best: int = 1  # hypotheses returned per sentence (<= beam_size)
    use_cache: bool = True  # False: recompute the whole prefix at every step
    bos_id: int | None = None  # None: the tokenizer's (see the class docstring)
    eos_id: int | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.beam_size) or self.beam_size < 1:
            raise ValueError(f"beam_size: expected an integer >= 1, got {self.beam_size!r}")
        if self.beam_size > MAX_BEAM_SIZE:
            raise ValueError(
                f"beam_size: expected at most MAX_BEAM_SIZE={MAX_BEAM_SIZE}, got {self.beam_size} "
                "(beams of 4-10 are usual)"
            )
        for name in ("max_len_a", "max_len_b"):
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"max_len_a, max_len_b: expected >= 0 and finite, got {name}={value!r}"
                )
        if not _is_int(self.max_len_b):
            raise ValueError(f"max_len_b: expected an integer >= 0, got {self.max_len_b!r}")
        if not _is_int(self.min_len) or self.min_len < 0:
            raise ValueError(f"min_len: expected an integer >= 0, got {self.min_len!r}")
        if not _is_real(self.lenpen) or not math.isfinite(self.lenpen):
            raise ValueError(f"lenpen: expected a finite number, got {self.lenpen!r}")
        if self.lenpen_style not in LENGTH_PENALTY_STYLES:
            raise ValueError(
                f"lenpen_style: expected one of {LENGTH_PENALTY_STYLES}, got {self.lenpen_style!r}"
            )
        if not _is_int(self.n_best) or not 1 <= self.n_best <= self.beam_size:
            raise ValueError(
                f"n_best: expected 1 <= n_best <= beam_size={self.beam_size}, got {self.n_best!r}"
            )
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 0):
                raise ValueError(f"{name}: expected None or an id >= 0, got {value!r}")

    @property
    def length_penalty(self) -> LengthPenalty:
        return LengthPenalty(self.lenpen_style, self.lenpen)

    @property
    def bos(self) -> int:
        """The bos id in use: ``bos_id``, or attnkit's tokenizer's when None."""
        return DEFAULT_BOS_ID if self.bos_id is None else self.bos_id

    @property
    def eos(self) -> int:
        """The eos id in use: ``eos_id``, or attnkit's tokenizer's when None."""
        return DEFAULT_EOS_ID if self.eos_id is None else self.eos_id

    def with_ids(self, tokenizer) -> DecodingConfig:
        """This config with the bos and eos ids of ``tokenizer``.

        Raises:
            ValueError: if the config names other ids than the tokenizer's.
        """
        for name in ("bos_id", "eos_id"):
            mine, theirs = getattr(self, name), getattr(tokenizer, name)
            if mine is not None and mine != theirs:
                raise ValueError(
                    f"{name}: the config says {mine} but the tokenizer's is {theirs}; leave "
                    f"{name} unset to use the tokenizer's"
                )
        return replace(self, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)


@dataclass(frozen=True)
class Hypothesis:
    """One finished output.

    Attributes:
        tokens: generated ids, without bos and the final eos.
        score: ``log_prob`` divided by the length penalty of ``len(tokens) + 1``; ranks
            hypotheses.
        log_prob: summed log-probability of ``tokens`` and the eos.
    """

    tokens: list[int]
    score: float
    log_prob: float


# --------------------------------------------------------------------------- the decoding split


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
        lprobs: the buffer :func:`decode_one_token` writes into.
    """

    tokens: Tensor
    memory: Tensor
    src_mask: Tensor
    caches: list[tuple[KVCache, KVCache]] | None
    lprobs: Tensor | None = None  # (>= N, V) reused output of decode_one_token

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
        for self_cache, cross_cache in self.caches or ():
            self_cache.reorder(rows)
            if sentences is not None:
                cross_cache.reorder(sentences)


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
    output layer at (1000, 8000) on CPU).
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

    n, vocab = state.tokens.shape[0], model.config.tgt_vocab_size
    if state.lprobs is None or state.lprobs.shape[0] < n:
        state.lprobs = torch.empty(n, vocab, dtype=torch.float32, device=state.tokens.device)
    out = state.lprobs[:n]  # (N, V)
    chunk = max(1, _HEAD_CHUNK_ELEMENTS // vocab)
    for start in range(0, n, chunk):
        rows = slice(start, min(start + chunk, n))
        torch.log_softmax(logits(rows).float(), dim=-1, out=out[rows])
    return out


# --------------------------------------------------------------------------- constraints


def max_lengths(src: Tensor, config: DecodingConfig, model_max_len: int, pad_id: int) -> Tensor:
    """Per-sentence token limit (eos excluded): ``floor(a * src_len + b)``.

    ``src_len`` counts the source ids that are neither pad nor eos. The limit is at least
    ``min_len`` and at most ``model_max_len - 1`` (bos takes a decoder position).

    Returns:
        (B,) int64 on ``src``'s device.
    """
    src_len = ((src != pad_id) & (src != config.eos)).sum(dim=1)  # (B,)
    # Clamped in float64 before the cast: a huge a or b must give the model's limit, not an
    # int64 overflow.
    limit = torch.floor(src_len.double() * config.max_len_a + config.max_len_b)
    return limit.clamp(min=config.min_len).clamp(max=model_max_len - 1).long()


def _constrain(
    lprobs: Tensor, step: int, row_max: Tensor | None, config: DecodingConfig, pad_id: int
) -> Tensor:
    """In place: forbid pad and bos, eos before ``min_len``, and every token but eos in the
    rows whose limit is this step (``row_max == step``; None when no row is at its limit)."""
    eos = config.eos
    eos_lprobs = lprobs[:, eos].clone() if row_max is not None else None  # (N,)
    lprobs[:, pad_id] = float("-inf")
    lprobs[:, config.bos] = float("-inf")
    if step < config.min_len:
        lprobs[:, eos] = float("-inf")
    if row_max is not None:
        at_max = row_max == step  # (N,)
        lprobs.masked_fill_(at_max[:, None], float("-inf"))
        lprobs[:, eos] = torch.where(at_max, eos_lprobs, lprobs[:, eos])
    return lprobs


def _check_inputs(model, src: Tensor, config: DecodingConfig) -> None:
    if src.dim() != 2 or src.shape[0] == 0 or src.dtype != torch.long:
        raise ValueError(
            f"src: expected a non-empty (B, S) int64 tensor, got shape {tuple(src.shape)} "
            f"dtype {src.dtype}"
        )
    if src.shape[1] > model.config.max_len:
        raise ValueError(
            f"src: {src.shape[1]} positions exceed the model's max_len={model.config.max_len}"
        )
    vocab = model.config.tgt_vocab_size
    for name, value in (("bos_id", config.bos), ("eos_id", config.eos)):
        if value >= vocab:
            raise ValueError(
                f"{name}: {value} is not in the model's target vocabulary of {vocab} ids"
            )


# --------------------------------------------------------------------------- memory bound


def decoding_memory(
    model, *, sentences: int, beam_size: int, num_positions: int, src_len: int, use_cache: bool
) -> int:
    """Bytes that decoding ``sentences`` sentences at once allocates, estimated from the sizes.

    Counted: the self-attention caches (``sentences x beam`` rows of ``num_positions``
    keys and values per decoder layer), the cross-attention caches, the (rows, V) float32
    log-probabilities, the token buffer and, without the cache, the (rows, positions, V)
    logits of a full recomputation. One more self-attention buffer is counted for the copy
    a beam reorder makes. Activations of a single step are small next to these.
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


def available_memory(device: torch.device) -> int | None:
    """Bytes that a new allocation on ``device`` can still get, or None if unknown.

    CPU: the smaller of Linux's ``MemAvailable`` and the cgroup's ``memory.max`` less its
    ``memory.current`` plus its reclaimable ``inactive_file`` (a container's limit, which the
    kernel enforces by killing). CUDA:
    ``torch.cuda.mem_get_info``. Other devices: unknown (not checked).
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                current = int(f.read().strip())
            # The cgroup counts page cache too; its inactive part is reclaimed before a kill.
            with open("/sys/fs/cgroup/memory.stat") as f:
                stat = dict(line.split() for line in f if line.count(" ") == 1)
            reclaimable = int(stat.get("inactive_file", 0))
            found.append(max(int(limit) - current + reclaimable, 0))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


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


# --------------------------------------------------------------------------- searches


def greedy_search(model, src: Tensor, config: DecodingConfig) -> list[list[Hypothesis]]:
    """Pick the most probable token at every step (the same result as a beam of 1).

    Args:
        model: a :class:`~attnkit.models.Transformer`.
        src: (B, S) source ids, eos-terminated and right-padded.
        config: the lengths, special ids and ``use_cache`` (``beam_size`` is ignored).

    Returns:
        One list with one :class:`Hypothesis` per sentence, in input order.
    """
    _check_inputs(model, src, config)
    pad, eos = model.config.pad_id, config.eos
    penalty = config.length_penalty
    limits = max_lengths(src, config, model.config.max_len, pad)  # (B,)
    max_steps = int(limits.max())
    check_decoding_memory(
        model, src, replace(config, beam_size=1, n_best=1), max_steps + 1,
        available=available_memory(src.device),
    )  # fmt: skip
    state = prefill(
        model, src, num_positions=max_steps + 1, use_cache=config.use_cache, bos_id=config.bos
    )
    limit_steps = set(limits.tolist())  # steps at which some sentence must end
    sent = list(range(src.shape[0]))  # original sentence of each row
    log_prob = torch.zeros(src.shape[0], dtype=torch.float32, device=src.device)  # (B,)
    results: list[list[Hypothesis]] = [[] for _ in sent]
    for step in range(max_steps + 1):
        row_max = limits if step in limit_steps else None
        lprobs = _constrain(decode_one_token(model, state, step), step, row_max, config, pad)
        best, token = lprobs.max(dim=-1)  # (n,) each
        log_prob = log_prob + best
        if step < max_steps:
            state.tokens[:, step + 1] = token
        done = token == eos  # (n,)
        if not bool(done.any()):
            continue
        finished = done.nonzero().squeeze(1).tolist()
        rows = state.tokens[finished, 1 : step + 1].tolist()
        for i, toks, lp in zip(finished, rows, log_prob[finished].tolist(), strict=True):
            score = penalty.normalize(lp, step + 1)
            results[sent[i]] = [Hypothesis(toks, float(score), lp)]
        keep = (~done).nonzero().squeeze(1)  # (n',)
        if keep.numel() == 0:
            break
        state.reorder(keep, keep)
        kept = keep.tolist()
        sent = [sent[i] for i in kept]
        log_prob, limits = log_prob[keep], limits[keep]
    return results


def beam_search(model, src: Tensor, config: DecodingConfig) -> list[list[Hypothesis]]:
    """fairseq-style beam search (module docstring), batched over sentences.

    Args:
        model: a :class:`~attnkit.models.Transformer`.
        src: (B, S) source ids, eos-terminated and right-padded.
        config: beam size, length penalty, lengths, ``n_best``, ``use_cache``.

    Returns:
        For every sentence, its ``n_best`` hypotheses, best first.
    """
    _check_inputs(model, src, config)
    k, pad, eos = config.beam_size, model.config.pad_id, config.eos
    search, penalty = BeamSearch(k), config.length_penalty
    device = src.device
    limits = max_lengths(src, config, model.config.max_len, pad)  # (b,) for live sentences
    max_steps = int(limits.max())
    check_decoding_memory(model, src, config, max_steps + 1, available=available_memory(src.device))
    state = prefill(
        model, src, num_positions=max_steps + 1, use_cache=config.use_cache, bos_id=config.bos
    )
    limit_steps = set(limits.tolist())  # steps at which some sentence must end
    sent = list(range(src.shape[0]))  # original index of each live sentence
    finalized: list[list[Hypothesis]] = [[] for _ in sent]
    scores = None  # (b, k) summed log-probs of the active hypotheses
    for step in range(max_steps + 1):
        b, group = len(sent), state.group  # group: 1 at step 0, then k
        lprobs = decode_one_token(model, state, step)  # (b * group, V)
        row_max = limits.repeat_interleave(group) if step in limit_steps else None
        lprobs = _constrain(lprobs, step, row_max, config, pad)
        lprobs = lprobs.view(b, group, -1)  # (b, group, V)
        cand_scores, cand_tokens, cand_beams = search.step(step, lprobs, scores)
        # (b, 2k) each; pad with impossible candidates if the vocabulary is tiny
        cand_scores, cand_tokens, cand_beams = _pad_candidates(
            cand_scores, cand_tokens, cand_beams, 2 * k
        )
        finite = cand_scores > float("-inf")
        is_eos = (cand_tokens == eos) & finite  # (b, 2k)

        # Finished hypotheses: eos among the best k candidates (fairseq's rule).
        eos_top = is_eos[:, :k]
        if bool(eos_top.any()):
            base = torch.arange(b, device=device)[:, None] * group  # (b, 1)
            rows = (base + cand_beams[:, :k])[eos_top]  # (n_eos,) rows of state
            where = eos_top.nonzero().tolist()
            prefixes = state.tokens[rows, 1 : step + 1].tolist()
            eos_scores = cand_scores[:, :k][eos_top].tolist()
            for (i, _), toks, lp in zip(where, prefixes, eos_scores, strict=True):
                hyps = finalized[sent[i]]
                if len(hyps) < k:
                    hyps.append(Hypothesis(toks, float(penalty.normalize(lp, step + 1)), lp))

        # A sentence is done with k finished hypotheses, at its length limit (all candidates
        # were eos), or when no candidate can continue.
        done = ~(finite & ~is_eos).any(dim=1)  # (b,)
        if step in limit_steps:
            done |= limits == step
        done |= torch.tensor([len(finalized[s]) >= k for s in sent], device=device)
        keep = (~done).nonzero().squeeze(1)  # (b',)
        if keep.numel() == 0:
            break

        # The k best non-eos candidates stay active: rank eos candidates after all others.
        width = cand_scores.shape[1]
        rank = is_eos.long() * width + torch.arange(width, device=device)  # (b, 2k)
        active = rank[keep].topk(k, dim=1, largest=False).indices  # (b', k), best first
        scores = cand_scores[keep].gather(1, active)  # (b', k)
        new_tokens = cand_tokens[keep].gather(1, active)  # (b', k)
        beams = cand_beams[keep].gather(1, active)  # (b', k)
        rows = (keep[:, None] * group + beams).view(-1)  # (b' * k,) rows of the old state
        state.reorder(rows, keep if keep.numel() != b else None)
        state.tokens[:, step + 1] = new_tokens.view(-1)
        if keep.numel() != b:
            kept = keep.tolist()
            sent = [sent[i] for i in kept]
            limits = limits[keep]
    return [
        sorted(hyps, key=lambda h: h.score, reverse=True)[: config.n_best] for hyps in finalized
    ]


def _pad_candidates(scores: Tensor, tokens: Tensor, beams: Tensor, width: int):
    """Extend (b, c) candidates to (b, width) with ``-inf`` placeholders (extending beam 0)."""
    missing = width - scores.shape[1]
    if missing <= 0:
        return scores, tokens, beams
    b = scores.shape[0]
    scores = torch.cat([scores, scores.new_full((b, missing), float("-inf"))], dim=1)
    tokens = torch.cat([tokens, tokens.new_zeros((b, missing))], dim=1)
    beams = torch.cat([beams, beams.new_zeros((b, missing))], dim=1)
    return scores, tokens, beams


@torch.inference_mode()
def generate(model, src: Tensor, config: DecodingConfig | None = None) -> list[list[Hypothesis]]:
    """Translate a batch: greedy search for ``beam_size == 1``, else beam search.

    The model is put in eval mode for the call (dropout off) and restored afterwards.

    Args:
        model: a :class:`~attnkit.models.Transformer`.
        src: (B, S) source ids, each ``tokens + [eos]``, right-padded with the model's pad id.
        config: a :class:`DecodingConfig` (default: beam 5). Its ``bos_id`` / ``eos_id``
            default to attnkit's tokenizer's; :class:`~attnkit.decoding.Translator` sets them
            from its tokenizer.

    Returns:
        For every sentence, its best hypotheses (``config.n_best``), best first.

    Raises:
        ValueError: for a malformed ``src``, special ids outside the target vocabulary, or a
            search whose caches and scores would not fit in the memory free on ``src``'s
            device (:func:`check_decoding_memory`, checked before anything is allocated).
    """
    config = DecodingConfig() if config is None else config
    was_training = model.training
    model.eval()
    try:
        if config.beam_size == 1:
            return greedy_search(model, src, config)
        return beam_search(model, src, config)
    finally:
        model.train(was_training)
