"""BLEU (Papineni et al., 2002), equal to sacreBLEU 2.x.

Seed 003 defines ``BLEU = BP * exp(sum_n w_n log p_n)`` with uniform weights ``w_n = 1/N``,
clipped n-gram precisions ``p_n`` and the brevity penalty ``BP = 1`` if ``c > r`` else
``exp(1 - r/c)`` (``c`` hypothesis length, ``r`` reference length). As in sacreBLEU, precisions
and the score are percentages, and a precision of zero is smoothed as ``smooth_method`` says:

* ``none``: no smoothing, so any zero precision gives BLEU 0;
* ``floor``: a zero count becomes ``smooth_value`` (default 0.1);
* ``add-k``: ``smooth_value`` (default 1) is added to counts and totals for n > 1;
* ``exp``: the k-th zero precision becomes ``1 / (2^k * t_n)`` (mteval-v13a; the default).

With ``effective_order``, orders with no hypothesis n-grams at all are left out of the mean
rather than counting as zero (meant for sentence-level BLEU).

The statistics are computed by :mod:`attnkit.metrics.statistics`; this module turns them into
a score. The arithmetic follows sacreBLEU's ``BLEU.compute_bleu`` operation by operation, so
the numbers agree to the last bit, including on the float32 statistics of its bootstrap.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from attnkit.metrics.signature import SMOOTH_DEFAULTS, bleu_signature, check_smoothing
from attnkit.metrics.statistics import BLEUStatistics, bleu_statistics

if TYPE_CHECKING:
    from attnkit.metrics.bootstrap import ConfidenceInterval

logger = logging.getLogger(__name__)

# log(0), floored as mteval and sacreBLEU do, so that exp() of the mean gives 0.
_LOG_ZERO = -9999999999


@dataclass(frozen=True)
class BLEUScore:
    """A BLEU score with the statistics behind it (sacreBLEU's ``BLEUScore`` attributes).

    Attributes:
        score: BLEU in percent (0-100).
        counts: Clipped n-gram matches per order (with ``add-k``, after adding k for n > 1).
        totals: Hypothesis n-grams per order (likewise).
        precisions: Smoothed n-gram precisions in percent.
        bp: Brevity penalty.
        sys_len: Hypothesis length in tokens.
        ref_len: Reference length in tokens.
        signature: The settings, as :func:`attnkit.metrics.bleu_signature` formats them.
        ci: Bootstrap confidence interval, if one was asked for.
    """

    name: ClassVar[str] = "BLEU"

    score: float
    counts: list
    totals: list
    precisions: list[float]
    bp: float
    sys_len: int
    ref_len: int
    signature: str = ""
    ci: ConfidenceInterval | None = None

    @property
    def ratio(self) -> float:
        """Hypothesis to reference length ratio (0 without reference tokens)."""
        return self.sys_len / self.ref_len if self.ref_len else 0

    @property
    def verbose_score(self) -> str:
        """Precisions and lengths, as sacreBLEU prints them after the score."""
        prec = "/".join(f"{p:.1f}" for p in self.precisions)
        return (
            f"{prec} (BP = {self.bp:.3f} ratio = {self.ratio:.3f} "
            f"hyp_len = {self.sys_len:d} ref_len = {self.ref_len:d})"
        )

    def format(
        self, width: int = 2, *, score_only: bool = False, with_signature: bool = True
    ) -> str:
        """The score line of sacreBLEU's text format.

        Args:
            width: Decimals of the score (sacreBLEU's command line uses 1).
            score_only: Only the number (and the interval, if any).
            with_signature: Put the signature after the name, ``BLEU|nrefs:1|... = 34.12 ...``.

        Returns:
            For example ``BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:0.1.0 =
            34.12 65.3/40.1/27.0/19.2 (BP = 0.987 ratio = 0.987 hyp_len = 12000 ref_len = 12160)``.
        """
        sc = f"{self.score:.{width}f}"
        if self.ci is not None:
            sc += f" (μ = {self.ci.mean:.{width}f} ± {self.ci.half_width:.{width}f})"
        if score_only:
            return sc
        head = f"{self.name}|{self.signature}" if with_signature and self.signature else self.name
        return f"{head} = {sc} {self.verbose_score}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary: the fields above plus ``name``, ``ratio``, ``verbose_score``."""
        d: dict[str, Any] = {
            "name": self.name,
            "score": self.score,
            "signature": self.signature,
            "verbose_score": self.verbose_score,
            "counts": list(self.counts),
            "totals": list(self.totals),
            "precisions": list(self.precisions),
            "bp": self.bp,
            "ratio": self.ratio,
            "sys_len": self.sys_len,
            "ref_len": self.ref_len,
        }
        if self.ci is not None:
            d["confidence"] = self.ci.to_dict()
        return d

    def __str__(self) -> str:
        return self.format()


def _check_counts(counts, totals, sys_len, ref_len) -> None:
    """Statistics BLEU can come from: numbers, ``0 <= c_n <= t_n``, lengths >= 0 (a match
    count above its total gave BLEU 500; a negative one, a math domain error)."""
    for n, (c, t) in enumerate(zip(counts, totals, strict=True), start=1):
        ok = all(_is_number(v) and v >= 0 for v in (c, t)) and c <= t
        if not ok:
            raise ValueError(
                f"counts, totals: order {n} has {c!r} matches of {t!r} n-grams; expected "
                "numbers with 0 <= matches <= n-grams"
            )
    for name, value in (("sys_len", sys_len), ("ref_len", ref_len)):
        if not (_is_number(value) and value >= 0):
            raise ValueError(f"{name}: expected a number >= 0, got {value!r}")


def _is_number(value) -> bool:
    # numpy scalars (the bootstrap's sums) count; bools and NaN do not
    return not isinstance(value, bool | str) and isinstance(value, numbers.Real) and value == value


def compute_bleu(
    counts: Sequence[float],
    totals: Sequence[float],
    sys_len: int,
    ref_len: int,
    *,
    smooth_method: str = "exp",
    smooth_value: float | None = None,
    effective_order: bool = False,
) -> BLEUScore:
    """BLEU from summed statistics (sacreBLEU's ``BLEU.compute_bleu``).

    Args:
        counts: Clipped n-gram matches ``c_1..c_N``.
        totals: Hypothesis n-gram counts ``t_1..t_N``.
        sys_len: Hypothesis length in tokens.
        ref_len: Reference length in tokens.
        smooth_method: ``"none"``, ``"floor"``, ``"add-k"`` or ``"exp"``.
        smooth_value: The value for ``floor`` / ``add-k``; ``None`` for the default.
        effective_order: Leave out orders without hypothesis n-grams.

    Returns:
        The score, without a signature.

    Raises:
        ValueError: On an unknown smoothing method or ``counts`` and ``totals`` of
            different lengths.
    """
    check_smoothing(smooth_method, smooth_value)
    if len(counts) != len(totals) or not len(counts):
        raise ValueError(
            f"counts and totals need one entry per n-gram order, got {len(counts)} and {len(totals)}"
        )
    _check_counts(counts, totals, sys_len, ref_len)
    if smooth_value is None:
        smooth_value = SMOOTH_DEFAULTS[smooth_method]
    max_order = len(counts)
    counts, totals = list(counts), list(totals)

    bp = 1.0
    if sys_len < ref_len:
        bp = math.exp(1 - ref_len / sys_len) if sys_len > 0 else 0.0

    precisions = [0.0] * max_order
    if not any(counts):
        return BLEUScore(0.0, counts, totals, precisions, bp, sys_len, ref_len)

    smooth_mteval = 1.0
    eff_order = max_order
    for n in range(max_order):
        if smooth_method == "add-k" and n > 0:
            counts[n] += smooth_value
            totals[n] += smooth_value
        if totals[n] == 0:
            break
        if effective_order:
            eff_order = n + 1
        if counts[n] == 0:
            if smooth_method == "exp":
                smooth_mteval *= 2
                precisions[n] = 100.0 / (smooth_mteval * totals[n])
            elif smooth_method == "floor":
                precisions[n] = 100.0 * smooth_value / totals[n]
        else:
            precisions[n] = 100.0 * counts[n] / totals[n]

    # Summed left to right as a list, as sacreBLEU does, for bit-identical results.
    log_sum = sum([math.log(p) if p != 0.0 else _LOG_ZERO for p in precisions[:eff_order]])
    score = bp * math.exp(log_sum / eff_order)
    return BLEUScore(score, counts, totals, precisions, bp, sys_len, ref_len)


def bleu_from_statistics(
    stats: BLEUStatistics,
    *,
    smooth_method: str = "exp",
    smooth_value: float | None = None,
    effective_order: bool = False,
) -> BLEUScore:
    """Score summed statistics, with the signature of their settings.

    Args:
        stats: Statistics of a corpus (possibly several added together).
        smooth_method: ``"none"``, ``"floor"``, ``"add-k"`` or ``"exp"``.
        smooth_value: The value for ``floor`` / ``add-k``; ``None`` for the default.
        effective_order: Leave out orders without hypothesis n-grams.

    Returns:
        The corpus score with its signature.
    """
    score = compute_bleu(
        stats.counts,
        stats.totals,
        stats.sys_len,
        stats.ref_len,
        smooth_method=smooth_method,
        smooth_value=smooth_value,
        effective_order=effective_order,
    )
    signature = bleu_signature(
        nrefs=stats.nrefs,
        tokenize=stats.tokenize,
        lowercase=stats.lowercase,
        effective_order=effective_order,
        smooth_method=smooth_method,
        smooth_value=smooth_value,
    )
    return replace(score, signature=signature)


def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str | None]],
    *,
    tokenize: str = "13a",
    lowercase: bool = False,
    smooth_method: str = "exp",
    smooth_value: float | None = None,
    max_ngram_order: int = 4,
    effective_order: bool = False,
    n_bootstrap: int = 1,
    seed: int | None = 12345,
) -> BLEUScore:
    """Corpus BLEU, as ``sacrebleu.corpus_bleu`` / ``BLEU(...).corpus_score``.

    Args:
        hypotheses: One system output per line.
        references: Reference streams, each with one line per hypothesis (several streams =
            several references per line); ``None`` marks a missing reference.
        tokenize: ``"none"``, ``"13a"``, ``"intl"``, ``"char"`` or ``"zh"``.
        lowercase: Lowercase everything first (``case:lc``).
        smooth_method: ``"none"``, ``"floor"``, ``"add-k"`` or ``"exp"``.
        smooth_value: The value for ``floor`` (default 0.1) / ``add-k`` (default 1).
        max_ngram_order: N of BLEU-N.
        effective_order: Leave out orders without hypothesis n-grams.
        n_bootstrap: If more than 1, also estimate a 95% confidence interval from this many
            bootstrap resamples of the lines (sacreBLEU's ``--confidence``; 1000 is usual).
        seed: Seed of the resampling (sacreBLEU's default is 12345); ``None`` for fresh
            entropy.

    Returns:
        The score, its statistics and signature (and ``ci`` with bootstrap).

    Raises:
        TypeError: If the inputs are not sequences of strings.
        ValueError: On bad settings or reference streams of the wrong length. Unlike
            sacreBLEU, which silently truncates to the shortest stream, mismatched lengths
            are an error. Empty input is not: it scores 0 with zero statistics.

    Example:
        >>> refs = [["The dog bit the man.", "It was not unexpected.", "The man bit him first."],
        ...         ["The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."]]
        >>> hyps = ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]
        >>> print(corpus_bleu(hyps, refs).format(with_signature=False))
        BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)
    """
    check_smoothing(smooth_method, smooth_value)
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, int) or n_bootstrap < 1:
        raise ValueError(
            f"n_bootstrap must be an integer >= 1 (1 = no confidence interval), got {n_bootstrap!r}"
        )
    stats = bleu_statistics(
        hypotheses,
        references,
        tokenize=tokenize,
        lowercase=lowercase,
        max_ngram_order=max_ngram_order,
    )
    if len(stats) >= 100 and sum(h.endswith(" .") for h in hypotheses) >= 100:
        # sacreBLEU's warning: BLEU expects detokenized text and tokenizes it itself.
        logger.warning(
            "%d hypothesis lines end in a tokenized period (' .'); BLEU expects detokenized "
            "text, and scores of tokenized text are not comparable to published ones",
            sum(h.endswith(" .") for h in hypotheses),
        )
    score = bleu_from_statistics(
        stats,
        smooth_method=smooth_method,
        smooth_value=smooth_value,
        effective_order=effective_order,
    )
    if n_bootstrap > 1:
        from attnkit.metrics.bootstrap import with_confidence

        score = with_confidence(
            score,
            stats,
            n_samples=n_bootstrap,
            seed=seed,
            smooth_method=smooth_method,
            smooth_value=smooth_value,
            effective_order=effective_order,
        )
    return score


def sentence_bleu(
    hypothesis: str,
    references: Sequence[str],
    *,
    tokenize: str = "13a",
    lowercase: bool = False,
    smooth_method: str = "exp",
    smooth_value: float | None = None,
    max_ngram_order: int = 4,
    effective_order: bool = True,
) -> BLEUScore:
    """BLEU of one sentence, as ``sacrebleu.sentence_bleu``.

    Args:
        hypothesis: One system output.
        references: Its references, one string each (not streams).
        tokenize: ``"none"``, ``"13a"``, ``"intl"``, ``"char"`` or ``"zh"``.
        lowercase: Lowercase everything first.
        smooth_method: ``"none"``, ``"floor"``, ``"add-k"`` or ``"exp"``.
        smooth_value: The value for ``floor`` / ``add-k``; ``None`` for the default.
        max_ngram_order: N of BLEU-N.
        effective_order: Leave out orders without hypothesis n-grams; on by default, as in
            ``sacrebleu.sentence_bleu``, since a short sentence has no 4-grams.

    Returns:
        The score with its statistics and signature.

    Raises:
        TypeError: If ``hypothesis`` is not a string or ``references`` not strings.
    """
    if not isinstance(hypothesis, str):
        raise TypeError(f"hypothesis must be a string, got {type(hypothesis).__name__}")
    if isinstance(references, str):
        raise TypeError(
            "references must be a sequence of reference strings, got a single str; wrap it: [ref]"
        )
    if not isinstance(references, Sequence):  # None, a number: "not iterable" named nothing
        raise TypeError(
            f"references must be a sequence of reference strings, got {type(references).__name__}"
        )
    return corpus_bleu(
        [hypothesis],
        [[ref] for ref in references],
        tokenize=tokenize,
        lowercase=lowercase,
        smooth_method=smooth_method,
        smooth_value=smooth_value,
        max_ngram_order=max_ngram_order,
        effective_order=effective_order,
    )
