"""Sufficient statistics of BLEU, kept apart from the score (as sacreBLEU does).

For every segment (one hypothesis line and its references) BLEU needs only
``2 + 2 * max_ngram_order`` integers: the hypothesis length, the closest reference length,
the clipped n-gram matches ``c_n`` and the hypothesis n-gram counts ``t_n`` for
``n = 1..max_ngram_order``. A corpus score is a function of their column sums, so statistics
of batches and files add up, and bootstrap resampling only has to resample rows.

The statistics of a segment follow Papineni et al. (2002) and sacreBLEU 2.x:

* a line is lowercased (optionally), right-stripped, tokenized and split on whitespace;
* ``c_n = sum over hypothesis n-grams g of min(count_hyp(g), max over references count_ref(g))``;
* the reference length is that of the reference closest in length to the hypothesis, the
  shorter one on a tie.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from attnkit.metrics.tokenizers import get_tokenizer

Row = tuple[int, ...]
"""One segment: ``(sys_len, ref_len, c_1, ..., c_N, t_1, ..., t_N)``, sacreBLEU's layout."""

MAX_NGRAM_ORDER = 100
"""The largest ``max_ngram_order`` accepted. BLEU-4 is the standard; every line counts its
n-grams of each order up to N, so a mistyped N (10**9) would take all the memory."""


@dataclass(frozen=True)
class BLEUStatistics:
    """Per-segment sufficient statistics of BLEU for a corpus, with the settings that made them.

    Add two with ``+`` (or ``sum``) to score batches or files as one corpus; the settings must
    agree. Score them with :func:`attnkit.metrics.bleu_from_statistics`, resample them with
    :func:`attnkit.metrics.bootstrap_ci`.

    Attributes:
        segments: One :data:`Row` per segment, in corpus order.
        max_ngram_order: The largest n-gram order N counted.
        tokenize: Name of the tokenizer the lines went through.
        lowercase: Whether the lines were lowercased first.
        nrefs: References per segment, or ``"var"`` if it differs between segments (the
            ``nrefs`` field of the signature).
    """

    segments: tuple[Row, ...] = ()
    max_ngram_order: int = 4
    tokenize: str = "13a"
    lowercase: bool = False
    nrefs: int | str = 1
    _sums: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        width = 2 + 2 * self.max_ngram_order
        if self.segments:
            sums = tuple(sum(column) for column in zip(*self.segments, strict=True))
            if len(sums) != width:
                raise ValueError(
                    f"segments has rows of {len(sums)} numbers, expected 2 + 2 * max_ngram_order "
                    f"= {width}"
                )
        else:
            sums = (0,) * width
        object.__setattr__(self, "_sums", sums)

    def __len__(self) -> int:
        return len(self.segments)

    @property
    def sys_len(self) -> int:
        """Total hypothesis length in tokens."""
        return self._sums[0]

    @property
    def ref_len(self) -> int:
        """Total (closest) reference length in tokens."""
        return self._sums[1]

    @property
    def counts(self) -> list[int]:
        """Clipped n-gram matches ``c_1..c_N`` summed over segments."""
        return list(self._sums[2 : 2 + self.max_ngram_order])

    @property
    def totals(self) -> list[int]:
        """Hypothesis n-gram counts ``t_1..t_N`` summed over segments."""
        return list(self._sums[2 + self.max_ngram_order :])

    @cached_property
    def settings(self) -> tuple[int, str, bool]:
        """``(max_ngram_order, tokenize, lowercase)``: statistics add only if these agree."""
        return (self.max_ngram_order, self.tokenize, self.lowercase)

    def __add__(self, other: BLEUStatistics) -> BLEUStatistics:
        if not isinstance(other, BLEUStatistics):
            return NotImplemented
        if other.settings != self.settings:
            raise ValueError(
                "cannot add BLEU statistics made with different settings: "
                f"(max_ngram_order, tokenize, lowercase) = {self.settings} and {other.settings}"
            )
        if not other.segments:
            nrefs = self.nrefs
        elif not self.segments:
            nrefs = other.nrefs
        else:
            nrefs = self.nrefs if self.nrefs == other.nrefs else "var"
        return BLEUStatistics(
            segments=self.segments + other.segments,
            max_ngram_order=self.max_ngram_order,
            tokenize=self.tokenize,
            lowercase=self.lowercase,
            nrefs=nrefs,
        )

    def __radd__(self, other: object) -> BLEUStatistics:
        # Lets sum() start from its default 0.
        if isinstance(other, int) and other == 0:
            return self
        return NotImplemented


def _closest_length(hyp_len: int, ref_lens: list[int]) -> int:
    """The reference length closest to ``hyp_len``; the shorter one on a tie."""
    return min(ref_lens, key=lambda r: (abs(hyp_len - r), r))


def _grams(shifts: list[list[str]], n: int):
    """The n-grams of a token list given its shifted copies ``[tokens, tokens[1:], ...]``.

    Unigrams are the tokens themselves and higher orders tuples, so keys never collide
    across orders and hypotheses and references agree on them.
    """
    # zip stops at the shortest shift, which is exactly the last n-gram.
    return shifts[0] if n == 1 else zip(*shifts[:n], strict=False)


def _segment_row(hyp: list[str], refs: list[list[str]], max_order: int) -> Row:
    """The :data:`Row` of one tokenized hypothesis against its tokenized references.

    ``c_n`` is a multiset intersection. Most hypotheses repeat no n-gram of a given order,
    and then ``c_n`` is the size of a set intersection, computed in C; only repeated n-grams
    need their counts compared, from a :class:`~collections.Counter` per side (as sacreBLEU
    does), so the work stays linear in the length of the segment.
    """
    hyp_len = len(hyp)
    ref_len = len(refs[0]) if len(refs) == 1 else _closest_length(hyp_len, [len(r) for r in refs])
    correct = [0] * max_order
    total = [0] * max_order
    hyp_shifts = [hyp[i:] for i in range(max_order)]
    ref_shifts = [[ref[i:] for i in range(max_order)] for ref in refs]
    for n in range(1, min(max_order, hyp_len) + 1):
        count = total[n - 1] = hyp_len - n + 1
        grams = set(_grams(hyp_shifts, n))
        if len(ref_shifts) == 1:
            common = grams.intersection(_grams(ref_shifts[0], n))
        else:
            common = set().union(*(grams.intersection(_grams(s, n)) for s in ref_shifts))
        matched = len(common)
        if len(grams) < count and matched:
            # Repeated hypothesis n-grams: each matches up to its largest reference count.
            hyp_counts = Counter(_grams(hyp_shifts, n))
            ref_counts = [Counter(_grams(s, n)) for s in ref_shifts]
            for gram in common:
                c = hyp_counts[gram]
                if c > 1:
                    matched += min(c, max(r[gram] for r in ref_counts)) - 1
        correct[n - 1] = matched
    return (hyp_len, ref_len, *correct, *total)


def _as_lines(value: object, name: str) -> list:
    if isinstance(value, str | bytes):
        raise TypeError(
            f"{name} must be a sequence of strings (one per line), got a single {type(value).__name__}"
        )
    try:
        return list(value)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(
            f"{name} must be a sequence of strings, got {type(value).__name__}"
        ) from None


def _check_lines(lines: list, name: str, *, allow_none: bool) -> None:
    for i, line in enumerate(lines):
        if not isinstance(line, str) and not (allow_none and line is None):
            expected = "a string or None" if allow_none else "a string"
            raise TypeError(f"{name}[{i}] must be {expected}, got {type(line).__name__}")


def bleu_statistics(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str | None]],
    *,
    tokenize: str = "13a",
    lowercase: bool = False,
    max_ngram_order: int = 4,
) -> BLEUStatistics:
    """Compute the per-segment BLEU statistics of a corpus.

    Args:
        hypotheses: One system output per line.
        references: Reference streams, each with one reference per line of ``hypotheses``
            (several streams = several references per line). A ``None`` entry means "no
            reference from this stream for this line"; every line needs at least one.
        tokenize: Tokenizer name, one of :data:`attnkit.metrics.tokenizers.TOKENIZERS`.
        lowercase: Lowercase hypotheses and references before tokenizing.
        max_ngram_order: Largest n-gram order N (BLEU-N), at least 1.

    Returns:
        The statistics, one row per line.

    Raises:
        TypeError: If ``hypotheses`` or ``references`` are not sequences of strings (a
            common slip is passing one reference stream without wrapping it in a list).
        ValueError: On an unknown tokenizer, a bad ``max_ngram_order``, no reference
            streams, streams whose length differs from ``hypotheses``, or a line without any
            reference.
    """
    tokenizer = get_tokenizer(tokenize)
    if (
        isinstance(max_ngram_order, bool)
        or not isinstance(max_ngram_order, int)
        or not 1 <= max_ngram_order <= MAX_NGRAM_ORDER
    ):
        raise ValueError(
            f"max_ngram_order must be an integer from 1 to {MAX_NGRAM_ORDER} (BLEU-4 is usual), "
            f"got {max_ngram_order!r}"
        )
    hyps = _as_lines(hypotheses, "hypotheses")
    _check_lines(hyps, "hypotheses", allow_none=False)
    streams = [
        _as_lines(s, f"references[{k}]") for k, s in enumerate(_as_lines(references, "references"))
    ]
    if not streams:
        raise ValueError("references must hold at least one reference stream, got none")
    for k, stream in enumerate(streams):
        if len(stream) != len(hyps):
            raise ValueError(
                f"references[{k}] has {len(stream)} lines but hypotheses has {len(hyps)}; "
                "every reference stream needs one line per hypothesis"
            )
        _check_lines(stream, f"references[{k}]", allow_none=True)

    def prepare(line: str) -> list[str]:
        if lowercase:
            line = line.lower()
        return tokenizer(line.rstrip()).split()

    rows: list[Row] = []
    nrefs: set[int] = set()
    if len(streams) == 1 and all(line is not None for line in streams[0]):
        # The common case, without per-line bookkeeping.
        nrefs.add(1)
        for hyp, ref in zip(hyps, streams[0], strict=True):
            rows.append(_segment_row(prepare(hyp), [prepare(ref)], max_ngram_order))
    else:
        for i, (hyp, *refs) in enumerate(zip(hyps, *streams, strict=True)):
            present = [prepare(r) for r in refs if r is not None]
            if not present:
                raise ValueError(
                    f"line {i + 1} has no reference: every reference stream holds None there"
                )
            nrefs.add(len(present))
            rows.append(_segment_row(prepare(hyp), present, max_ngram_order))
    if not rows:
        nrefs.add(len(streams))
    return BLEUStatistics(
        segments=tuple(rows),
        max_ngram_order=max_ngram_order,
        tokenize=tokenize,
        lowercase=lowercase,
        nrefs=nrefs.pop() if len(nrefs) == 1 else "var",
    )
