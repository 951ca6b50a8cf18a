"""Beam search as a pure step function (fairseq's ``search.BeamSearch``) and length penalties.

:meth:`BeamSearch.step` only ranks: it adds the next-token log-probabilities to the running
scores and returns the best ``2 x beam`` (score, token, beam) candidates of each sentence. Up to
``beam`` of them may end in eos and leave the beam as finished hypotheses; the other ``beam``
(at least that many do not end in eos, as each beam contributes at most one eos candidate) keep
the beam full. Which ones finish, and when a sentence is done, is the generator's business
(:mod:`attnkit.decoding.generate`), so the step has no state and no side effects.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

LENGTH_PENALTY_STYLES = ("fairseq", "gnmt")


@dataclass(frozen=True)
class LengthPenalty:
    """Divides a finished hypothesis' summed log-probability by a function of its length.

    * ``"fairseq"``: ``len ** alpha`` (fairseq's ``--lenpen``; alpha=1 is the mean log-prob);
    * ``"gnmt"``: ``((5 + len) / 6) ** alpha`` (Wu et al. 2016, Google's NMT).

    ``alpha = 0`` turns either off (raw log-probability). ``len`` counts the generated tokens
    including the final eos, excluding bos.

    Attributes:
        style: ``"fairseq"`` or ``"gnmt"``.
        alpha: the exponent, >= 0 is usual (larger favours longer outputs).
    """

    style: str = "fairseq"
    alpha: float = 1.0

    def __post_init__(self) -> None:
        if self.style not in LENGTH_PENALTY_STYLES:
            raise ValueError(f"style: expected one of {LENGTH_PENALTY_STYLES}, got {self.style!r}")

    def __call__(self, length: int | float | Tensor) -> float | Tensor:
        """The divisor for a hypothesis of ``length`` tokens (eos included)."""
        if self.style == "fairseq":
            return length**self.alpha
        return ((5.0 + length) / 6.0) ** self.alpha

    def normalize(self, log_prob: float | Tensor, length: int | float | Tensor):
        """``log_prob / penalty(length)``: the score that ranks finished hypotheses."""
        return log_prob / self(length)


_BLOCK = 64  # columns per block of the first pass of :func:`top_candidates`


def top_candidates(
    lprobs: Tensor, scores: Tensor | None, count: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The ``count`` best ``scores[b, j] + lprobs[b, j, t]`` of every sentence ``b``, over all
    its beams ``j`` and tokens ``t``, sorted best first, in two passes when rows are long.

    torch's CPU top-k pays about a microsecond for every row it ranks, and more for every
    element: ranking each beam's whole row, then the beams' best together, costs twice what
    this does at decoding shapes. Here the vocabulary is cut into blocks of 64 columns; a
    candidate among the ``count`` best lies in one of the ``count`` blocks (of any beam) whose
    best entry plus the beam's score is largest. One vectorised pass takes every block's
    maximum, one top-k per sentence picks those blocks, and one more ranks their entries (and
    the columns after the last whole block). The same values as ranking every candidate with
    ``torch.topk``; among equal values it may return other (beam, token) pairs.

    Args:
        lprobs: (B, beams, V) float log-probabilities (forbidden tokens ``-inf``), contiguous.
        scores: (B, beams) summed log-probabilities of the beams, or None for zeros.
        count: candidates per sentence, at most ``beams x V``.

    Returns:
        ``(values, tokens, beams)``, each (B, count).
    """
    b, g, v = lprobs.shape
    blocks = v // _BLOCK
    if blocks < 4 * count or not lprobs.is_contiguous():  # short rows: rank them all
        total = lprobs if scores is None else lprobs + scores.unsqueeze(-1)  # (B, beams, V)
        values, index = total.reshape(b, g * v).topk(count, dim=1)  # (B, count) each
        beams = torch.div(index, v, rounding_mode="floor")
        return values, index - beams * v, beams
    whole = blocks * _BLOCK
    grid = lprobs[..., :whole].view(b, g, blocks, _BLOCK)  # (B, beams, blocks, 64)
    maxima = grid.amax(dim=3)  # (B, beams, blocks)
    if scores is not None:
        maxima += scores.unsqueeze(-1)
    best = maxima.view(b, g * blocks).topk(count, dim=1, sorted=False).indices  # (B, count)
    beam_of = torch.div(best, blocks, rounding_mode="floor")  # (B, count)
    block_of = best - beam_of * blocks  # (B, count)
    sentence = torch.arange(b, device=lprobs.device).unsqueeze(1)  # (B, 1)
    pool = grid[sentence, beam_of, block_of]  # (B, count, 64): the chosen blocks, copied
    if scores is not None:
        pool += scores.gather(1, beam_of).unsqueeze(-1)
    pool = pool.view(b, count * _BLOCK)
    tail = v - whole  # columns after the last whole block: always candidates
    if tail:
        rest = lprobs[..., whole:]  # (B, beams, tail)
        if scores is not None:
            rest = rest + scores.unsqueeze(-1)
        pool = torch.cat((pool, rest.reshape(b, g * tail)), dim=1)  # (B, count * 64 + beams * tail)
    values, where = pool.topk(count, dim=1)  # (B, count) each, sorted
    chosen = torch.div(where, _BLOCK, rounding_mode="floor").clamp_(max=count - 1)  # (B, count)
    beams = beam_of.gather(1, chosen)
    tokens = block_of.gather(1, chosen).mul_(_BLOCK).add_(where.remainder(_BLOCK))
    if tail:
        past = where - count * _BLOCK  # >= 0: a tail column, beam-major
        in_tail = past >= 0
        tail_beam = torch.div(past, tail, rounding_mode="floor")
        beams = torch.where(in_tail, tail_beam, beams)
        tokens = torch.where(in_tail, past - tail_beam * tail + whole, tokens)
    return values, tokens, beams


class BeamSearch:
    """fairseq's beam step: the best ``2 x beam`` candidates per sentence.

    Args:
        beam_size: hypotheses kept per sentence, >= 1.
    """

    def __init__(self, beam_size: int) -> None:
        if not isinstance(beam_size, int) or beam_size < 1:
            raise ValueError(f"beam_size: expected an integer >= 1, got {beam_size!r}")
        self.beam_size = beam_size

    def step(
        self, step: int, lprobs: Tensor, scores: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Rank the extensions of every hypothesis.

        Args:
            step: 0 for the first generated token. At step 0 all beams of a sentence are the
                same (bos only), so only beam 0 is expanded: otherwise the beam would be
                filled with ``beam`` copies of the best token.
            lprobs: (B, beam, V) log-probabilities of the next token, with forbidden tokens
                already set to ``-inf``; at step 0 also (B, 1, V).
            scores: (B, beam) summed log-probabilities of the hypotheses so far; ignored (may
                be None) at step 0.

        Returns:
            ``(cand_scores, cand_tokens, cand_beams)``, each (B, 2 x beam) and sorted by score,
            best first: the summed log-probability with the new token, the token, and the
            beam it extends. Fewer columns when ``beam x V`` (``V`` at step 0) is smaller.
        """
        beams_ok = lprobs.dim() == 3 and (
            lprobs.shape[1] == self.beam_size or (step == 0 and lprobs.shape[1] == 1)
        )
        if not beams_ok:
            raise ValueError(
                f"lprobs: expected shape (B, {self.beam_size}, V), got {tuple(lprobs.shape)}"
            )
        if step == 0:
            lprobs = lprobs[:, :1, :]  # (B, 1, V)
        k = min(2 * self.beam_size, lprobs.shape[1] * lprobs.shape[2])
        if step > 0:
            if scores is None or scores.shape != lprobs.shape[:2]:
                got = None if scores is None else tuple(scores.shape)
                raise ValueError(f"scores: expected shape {tuple(lprobs.shape[:2])}, got {got}")
            return top_candidates(lprobs, scores, k)
        return top_candidates(lprobs, None, k)
