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


_TOPK_BLOCK = 64  # columns per block of row_topk's first pass


def row_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``torch.topk(x, k, dim=1)`` of (N, V) rows, sorted, in two passes when rows are long.

    torch's CPU top-k copies every row into (value, index) pairs before its partial sort.
    The k largest values of a row lie in at most k of its blocks of 64 columns, the blocks
    with the k largest maxima: one vectorised pass takes the blocks' maxima, and the top-k
    then runs over those k blocks (and the columns after the last whole block) only. Same
    values as ``torch.topk``; among equal values it may return other columns.

    Returns:
        (values, columns), each (N, k).
    """
    n, v = x.shape
    block = _TOPK_BLOCK
    blocks = v // block
    if blocks < 4 * k or not x.is_contiguous():
        return torch.topk(x, k, dim=1)
    whole = blocks * block
    maxima = x[:, :whole].view(n, blocks, block).amax(dim=2)  # (N, blocks)
    best = maxima.topk(k, dim=1, sorted=False).indices  # (N, k)
    cols = best.unsqueeze(2) * block + torch.arange(block, device=x.device)  # (N, k, block)
    cols = cols.view(n, k * block)
    if whole < v:  # the columns after the last whole block are always candidates
        tail = torch.arange(whole, v, device=x.device).expand(n, v - whole)
        cols = torch.cat((cols, tail), dim=1)  # (N, k * block + tail)
    values, where = x.gather(1, cols).topk(k, dim=1)  # (N, k) each, sorted
    return values, cols.gather(1, where)


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
        # Two stages, same result: the best 2k of a sentence are among the best 2k tokens of
        # each of its beams (a beam adds one constant to all its tokens). Adding the scores
        # to (B, beam, 2k) instead of (B, beam, V) saves a pass over the vocabulary.
        top_lprobs, top_tokens = torch.topk(lprobs, self.per_beam(lprobs.shape[2]), dim=2)
        return self.combine(step, top_lprobs, top_tokens, scores)  # (B, beams, per_beam) each

    def per_beam(self, vocab: int) -> int:
        """How many of each beam's best tokens :meth:`combine` needs: ``min(2 x beam, V)``."""
        return min(2 * self.beam_size, vocab)

    def combine(
        self, step: int, top_lprobs: Tensor, top_tokens: Tensor, scores: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The second stage of :meth:`step`, from each beam's best tokens.

        Args:
            step: as in :meth:`step`.
            top_lprobs: (B, beams, per_beam) each beam's :meth:`per_beam` best
                log-probabilities, sorted (``torch.topk``); beams is 1 at step 0.
            top_tokens: (B, beams, per_beam) their tokens.
            scores: as in :meth:`step`.

        Returns:
            As :meth:`step`.
        """
        if top_lprobs.dim() != 3 or top_tokens.shape != top_lprobs.shape:
            raise ValueError(
                f"top_lprobs, top_tokens: expected one shape (B, beams, per_beam), got "
                f"{tuple(top_lprobs.shape)} and {tuple(top_tokens.shape)}"
            )
        if step == 0:  # every beam is the same bos: expand beam 0 only
            top_lprobs, top_tokens = top_lprobs[:, :1], top_tokens[:, :1]
        b, beams, per_beam = top_lprobs.shape
        if step > 0:
            if scores is None or scores.shape != (b, beams):
                got = None if scores is None else tuple(scores.shape)
                raise ValueError(f"scores: expected shape {(b, beams)}, got {got}")
            top_lprobs = top_lprobs + scores.unsqueeze(-1)
        flat = top_lprobs.reshape(b, beams * per_beam)  # (B, beams * per_beam)
        k = min(2 * self.beam_size, flat.shape[1])
        cand_scores, index = torch.topk(flat, k, dim=1)  # (B, k) each, sorted
        cand_beams = torch.div(index, per_beam, rounding_mode="floor")
        cand_tokens = top_tokens.reshape(b, -1).gather(1, index)
        return cand_scores, cand_tokens, cand_beams
