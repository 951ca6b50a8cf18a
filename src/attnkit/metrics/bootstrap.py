"""Bootstrap resampling of BLEU statistics: confidence intervals and paired tests.

Resampling reuses the per-segment statistics, so no line is tokenized twice. Both functions
reproduce sacreBLEU 2.x exactly (``--confidence`` and ``--paired-bs``): the sample indices come
from ``numpy.random.default_rng(seed).choice(S, size=(n_samples, S))`` with seed 12345 by
default, the resampled statistics are summed in float32 as sacreBLEU does, and the 95% interval
is read off the sorted scores at ``n // 40`` and ``n - n // 40 - 1``. sacreBLEU reports it as
``mean ± half_width``; :class:`ConfidenceInterval` also keeps the two ends.
"""

from __future__ import annotations

import statistics as pystats
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from attnkit.metrics.bleu import BLEUScore, bleu_from_statistics, compute_bleu
from attnkit.metrics.signature import bleu_signature
from attnkit.metrics.statistics import BLEUStatistics

DEFAULT_SEED = 12345
"""sacreBLEU's default seed (its ``SACREBLEU_SEED``)."""


@dataclass(frozen=True)
class ConfidenceInterval:
    """A bootstrap 95% confidence interval of BLEU.

    Attributes:
        mean: Mean of the resampled scores (sacreBLEU's ``μ``).
        half_width: Half of ``upper - lower`` (sacreBLEU's ``±``).
        lower: 2.5th percentile of the resampled scores.
        upper: 97.5th percentile of the resampled scores.
        n_samples: Number of resamples.
        seed: Seed of the resampling (``None``: fresh entropy, not reproducible).
    """

    mean: float
    half_width: float
    lower: float
    upper: float
    n_samples: int
    seed: int | None
    level: float = 0.95

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "mean": self.mean,
            "half_width": self.half_width,
            "lower": self.lower,
            "upper": self.upper,
            "level": self.level,
            "n_samples": self.n_samples,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class PairedBootstrap:
    """Result of a paired bootstrap test of a system against a baseline.

    Attributes:
        baseline: Corpus score of the baseline.
        system: Corpus score of the system.
        p_value: Probability of a difference at least this large if the systems were equally
            good (Koehn 2004, as in Moses and sacreBLEU).
        baseline_ci: Confidence interval of the baseline's score from the resamples.
        system_ci: Confidence interval of the system's score from the same resamples.
    """

    baseline: BLEUScore
    system: BLEUScore
    p_value: float
    baseline_ci: ConfidenceInterval
    system_ci: ConfidenceInterval


MAX_RESAMPLED_LINES = 1 << 27
"""The most line indices one bootstrap draws (n_samples x lines): 1 GiB of int64 indices plus
the (n_samples, 2 + 2N) sums. More is refused with a message rather than left to the kernel."""


def check_seed(seed: int | None) -> None:
    """Raise unless ``seed`` is None or an integer >= 0 (what numpy's ``default_rng`` takes)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed must be None or an integer >= 0, got {seed!r}")


def _check_samples(n_samples: int, lines: int = 0) -> None:
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
    if n_samples * lines > MAX_RESAMPLED_LINES:
        raise ValueError(
            f"n_samples: {n_samples} resamples of {lines} lines draw {n_samples * lines:,} "
            f"indices, more than the {MAX_RESAMPLED_LINES:,} allowed (1 GiB); expected at most "
            f"{max(1, MAX_RESAMPLED_LINES // max(lines, 1)):,} resamples"
        )


def _resampled_scores(stats: BLEUStatistics, idxs: Any, **smoothing: Any) -> list[float]:
    import numpy as np

    rows = np.asarray(stats.segments, dtype=np.float32)  # (S, 2 + 2N), float32 as sacreBLEU
    order = stats.max_ngram_order
    scores = []
    for idx in idxs:
        s = rows[idx].sum(0)  # (2 + 2N,)
        scores.append(
            compute_bleu(s[2 : 2 + order], s[2 + order :], int(s[0]), int(s[1]), **smoothing).score
        )
    return scores


def _interval(scores: list[float], mean: Callable[[list[float]], float], n: int, seed: int | None):
    ordered = sorted(scores)
    lo = n // 40
    lower, upper = ordered[lo], ordered[n - lo - 1]
    return ConfidenceInterval(
        mean=float(mean(ordered)),
        half_width=0.5 * (upper - lower),
        lower=lower,
        upper=upper,
        n_samples=n,
        seed=seed,
    )


def bootstrap_ci(
    stats: BLEUStatistics,
    *,
    n_samples: int = 1000,
    seed: int | None = DEFAULT_SEED,
    smooth_method: str = "exp",
    smooth_value: float | None = None,
    effective_order: bool = False,
) -> ConfidenceInterval:
    """95% confidence interval of corpus BLEU by resampling its lines with replacement.

    Args:
        stats: Per-segment statistics of the corpus.
        n_samples: Number of resampled corpora.
        seed: Seed of numpy's ``default_rng``; ``None`` for fresh entropy.
        smooth_method: Smoothing of each resampled score.
        smooth_value: Its value, ``None`` for the default.
        effective_order: Effective order for each resampled score.

    Returns:
        The interval. An empty corpus gives a zero-width interval at 0.

    Raises:
        ValueError: If ``n_samples`` is not a positive integer.
    """
    import numpy as np

    _check_samples(n_samples, len(stats))
    check_seed(seed)
    if not stats.segments:
        return ConfidenceInterval(0.0, 0.0, 0.0, 0.0, n_samples, seed)
    rng = np.random.default_rng(seed)
    idxs = rng.choice(len(stats), size=(n_samples, len(stats)), replace=True)
    scores = _resampled_scores(
        stats,
        idxs,
        smooth_method=smooth_method,
        smooth_value=smooth_value,
        effective_order=effective_order,
    )
    # sacreBLEU's Score.estimate_ci takes the exact mean of the statistics module.
    return _interval(scores, pystats.mean, n_samples, seed)


def with_confidence(
    score: BLEUScore,
    stats: BLEUStatistics,
    *,
    n_samples: int = 1000,
    seed: int | None = DEFAULT_SEED,
    smooth_method: str = "exp",
    smooth_value: float | None = None,
    effective_order: bool = False,
) -> BLEUScore:
    """``score`` with a bootstrap interval and ``bs``/``seed`` in its signature."""
    ci = bootstrap_ci(
        stats,
        n_samples=n_samples,
        seed=seed,
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
        n_bootstrap=n_samples,
        seed="none" if seed is None else seed,
    )
    return replace(score, ci=ci, signature=signature)


def paired_bootstrap(
    baseline: BLEUStatistics,
    system: BLEUStatistics,
    *,
    n_samples: int = 1000,
    seed: int | None = DEFAULT_SEED,
    smooth_method: str = "exp",
    smooth_value: float | None = None,
    effective_order: bool = False,
) -> PairedBootstrap:
    """Paired bootstrap test: is ``system`` really different from ``baseline``?

    Both systems are scored on the same resampled sets of lines (sacreBLEU's ``--paired-bs``,
    after Moses' ``bootstrap-hypothesis-difference-significance.pl``).

    Args:
        baseline: Statistics of the baseline on the test set.
        system: Statistics of the system on the same lines, with the same settings.
        n_samples: Number of resamples.
        seed: Seed of numpy's ``default_rng``; ``None`` for fresh entropy.
        smooth_method: Smoothing of every score.
        smooth_value: Its value, ``None`` for the default.
        effective_order: Effective order for every score.

    Returns:
        Both corpus scores, the p-value and the system's confidence interval.

    Raises:
        ValueError: If the two have different settings or numbers of lines, or the corpus is
            empty.
    """
    import numpy as np

    _check_samples(n_samples, len(system))
    if baseline.settings != system.settings:
        raise ValueError(
            "baseline and system statistics have different (max_ngram_order, tokenize, "
            f"lowercase): {baseline.settings} and {system.settings}"
        )
    if len(baseline) != len(system) or not len(system):
        raise ValueError(
            f"baseline has {len(baseline)} lines and system {len(system)}; a paired test "
            "needs the same, non-zero number of lines"
        )
    smoothing = {
        "smooth_method": smooth_method,
        "smooth_value": smooth_value,
        "effective_order": effective_order,
    }
    bl_score = bleu_from_statistics(baseline, **smoothing)
    sys_score = bleu_from_statistics(system, **smoothing)
    rng = np.random.default_rng(seed)
    idxs = rng.choice(len(system), size=(n_samples, len(system)), replace=True)
    bl_scores = np.array(_resampled_scores(baseline, idxs, **smoothing))
    sys_scores = np.array(_resampled_scores(system, idxs, **smoothing))
    diff = abs(bl_score.score - sys_score.score)
    sample_diffs = np.abs(sys_scores - bl_scores)
    centred = sample_diffs - sample_diffs.mean()
    p_value = (np.sum(centred > diff).item() + 1) / (n_samples + 1)

    # sacreBLEU's significance.estimate_ci takes numpy's mean of the sorted scores.
    def np_mean(scores: list[float]) -> float:
        return float(np.mean(np.asarray(scores)))

    return PairedBootstrap(
        baseline=bl_score,
        system=sys_score,
        p_value=p_value,
        baseline_ci=_interval(list(bl_scores), np_mean, n_samples, seed),
        system_ci=_interval(list(sys_scores), np_mean, n_samples, seed),
    )
