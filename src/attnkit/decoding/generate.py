"""Greedy and beam search over a :class:`~attnkit.models.Transformer`, batched over sentences.

The decoding is split as in gpt-fast's ``generate.py``: :func:`prefill` and
:func:`decode_one_token` (:mod:`attnkit.decoding.state`) make and advance the decoder's state;
here :func:`greedy_search` / :func:`beam_search` loop over steps, and :func:`generate` picks one.

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

Bounds. :class:`~attnkit.decoding.config.DecodingConfig` refuses settings outside its bounds
when it is made; the length limit is clamped to the model's ``max_len - 1`` before it becomes
an integer (:func:`max_lengths`), so any finite ``max_len_a`` works; before allocating, each
search calls :func:`~attnkit.decoding.memory_bound.check_decoding_memory`, which refuses,
naming the estimate and the memory free, what cannot fit.

:class:`DecodingConfig`, :data:`MAX_BEAM_SIZE`, the memory bound and the state functions are
re-exported here, where they were first defined; their homes are :mod:`.config`,
:mod:`.memory_bound` and :mod:`.state`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from attnkit.decoding.config import (
    DEFAULT_BOS_ID,
    DEFAULT_EOS_ID,
    MAX_BEAM_SIZE,
    DecodingConfig,
)
from attnkit.decoding.memory_bound import (
    available_memory,
    check_decoding_memory,
    decoding_memory,
)
from attnkit.decoding.search import BeamSearch
from attnkit.decoding.state import DecoderState, decode_one_token, lprob_slices, prefill

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
    "check_special_ids",
    "decoding_memory",
    "decode_one_token",
    "generate",
    "greedy_search",
    "max_lengths",
    "prefill",
]


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


def _constrained_slices(
    model, state: DecoderState, step: int, row_max: Tensor | None, config: DecodingConfig, pad: int
):
    """:func:`lprob_slices` with :func:`_constrain` applied to each slice (``row_max``: (N,)
    or None); yields ``(rows, lprobs)``, lprobs (rows, V), valid until the next slice."""
    for rows, lprobs in lprob_slices(model, state, step):
        row_limit = None if row_max is None else row_max[rows]
        yield rows, _constrain(lprobs, step, row_limit, config, pad)


def check_special_ids(model, config: DecodingConfig) -> None:
    """Refuse a bos or eos id outside the model's target vocabulary, or an eos that is the
    model's pad id: the search never produces pad (:func:`_constrain`), so it could never end
    a sentence.

    Raises:
        ValueError: naming the id, its value and the model's vocabulary or ``pad_id``.
    """
    vocab, pad = model.config.tgt_vocab_size, model.config.pad_id
    for name, value in (("bos_id", config.bos), ("eos_id", config.eos)):
        if value >= vocab:
            raise ValueError(
                f"{name}: {value} is not in the model's target vocabulary of {vocab} ids"
            )
    if config.eos == pad:
        raise ValueError(
            f"eos_id: {config.eos} is the model's pad_id={pad}; the search never produces pad, "
            "so no sentence could end"
        )


def _check_inputs(model, src: Tensor, config: DecodingConfig) -> None:
    """Check a search's arguments once per call. The source ids' range is checked where the
    model reads them, once per call too (``model.encode`` in :func:`prefill`)."""
    if not isinstance(src, Tensor):
        raise TypeError(f"src: expected a torch.Tensor of token ids, got {type(src).__name__}")
    if src.dim() != 2 or src.shape[0] == 0 or src.dtype != torch.long:
        raise ValueError(
            f"src: expected a non-empty (B, S) int64 tensor, got shape {tuple(src.shape)} "
            f"dtype {src.dtype}"
        )
    if src.shape[1] > model.config.max_len:
        raise ValueError(
            f"src: {src.shape[1]} positions exceed the model's max_len={model.config.max_len}"
        )
    check_special_ids(model, config)


# --------------------------------------------------------------------------- searches


@torch.inference_mode()
def greedy_search(
    model, src: Tensor, config: DecodingConfig | None = None
) -> list[list[Hypothesis]]:
    """Pick the most probable token at every step (the same result as a beam of 1).

    Args:
        model: a :class:`~attnkit.models.Transformer`.
        src: (B, S) source ids, eos-terminated and right-padded.
        config: the lengths, special ids and ``use_cache`` (``beam_size`` is ignored);
            None: the default :class:`DecodingConfig`.

    Returns:
        One list with one :class:`Hypothesis` per sentence, in input order.
    """
    config = DecodingConfig.of(config)
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
        n = state.tokens.shape[0]
        best = torch.empty(n, dtype=torch.float32, device=src.device)  # (n,)
        token = torch.empty(n, dtype=torch.long, device=src.device)  # (n,)
        for rows, lprobs in _constrained_slices(model, state, step, row_max, config, pad):
            torch.max(lprobs, dim=-1, out=(best[rows], token[rows]))
        _no_nan(best, sent, step)
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


@torch.inference_mode()
def beam_search(model, src: Tensor, config: DecodingConfig | None = None) -> list[list[Hypothesis]]:
    """fairseq-style beam search (module docstring), batched over sentences.

    Args:
        model: a :class:`~attnkit.models.Transformer`.
        src: (B, S) source ids, eos-terminated and right-padded.
        config: beam size, length penalty, lengths, ``n_best``, ``use_cache``; None: the
            default :class:`DecodingConfig`.

    Returns:
        For every sentence, its ``n_best`` hypotheses, best first.
    """
    config = DecodingConfig.of(config)
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
    vocab = model.config.tgt_vocab_size
    for step in range(max_steps + 1):
        b, group = len(sent), state.group  # group: 1 at step 0, then k
        row_max = limits.repeat_interleave(group) if step in limit_steps else None
        # The search's step runs on every slice of log-probabilities while it is in cache
        # (slices hold whole sentences: all `group` rows of each).
        count = min(2 * k, group * vocab)  # candidates search.step returns a sentence
        cand_scores = torch.empty(b, count, dtype=torch.float32, device=device)  # (b, 2k)
        cand_tokens = torch.empty(b, count, dtype=torch.long, device=device)  # (b, 2k)
        cand_beams = torch.empty(b, count, dtype=torch.long, device=device)  # (b, 2k)
        for rows, lprobs in _constrained_slices(model, state, step, row_max, config, pad):
            part = slice(rows.start // group, rows.stop // group)  # the slice's sentences
            cand_scores[part], cand_tokens[part], cand_beams[part] = search.step(
                step, lprobs.view(-1, group, vocab), None if scores is None else scores[part]
            )
        _no_nan(cand_scores, sent, step)
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


def _no_nan(scores: Tensor, sent: list[int], step: int) -> None:
    """Refuse a step whose best scores (rows of live sentences ``sent``) hold a NaN: a NaN
    log-probability ranks above every number (max and top-k take it first), so the search would
    go on with meaningless hypotheses, or none. One reduction over the step's few best scores."""
    nan = torch.isnan(scores)
    if bool(nan.any()):
        rows = nan.reshape(scores.shape[0], -1).any(dim=1).nonzero().flatten()
        sentences = [sent[i] for i in rows.tolist()]
        raise ValueError(
            f"log-probabilities: NaN for sentence(s) {sentences[:8]} (of the batch's "
            f"{len(sent)} still decoding) at step {step}, so no token can be chosen; the "
            "model's output is not a number (broken weights, or an overflow in its dtype)"
        )


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
        TypeError: for a ``config`` that is not a :class:`DecodingConfig` (or None).
        ValueError: for a malformed ``src`` or source ids outside the model's vocabulary,
            special ids outside the target vocabulary or an eos that is the model's pad id
            (:func:`check_special_ids`), or a search whose caches and scores would not fit in
            the memory free on ``src``'s device (:func:`check_decoding_memory`, checked before
            anything is allocated).
    """
    config = DecodingConfig.of(config)
    was_training = model.training
    model.eval()
    try:
        if config.beam_size == 1:
            return greedy_search(model, src, config)
        return beam_search(model, src, config)
    finally:
        model.train(was_training)
