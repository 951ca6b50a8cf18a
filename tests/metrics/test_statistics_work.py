"""BLEU's n-gram matching does work linear in the length of a segment, measured by counting
operations (no clock): every token is an object that counts its ``__hash__`` and ``__eq__``
calls, which any matching must make, and a segment four times longer must cost about four
times as many (a little more: a longer segment repeats a larger share of its n-grams). A
quadratic matching (pairwise comparisons) costs sixteen times as many; the last test shows
the count catches one."""

from __future__ import annotations

import random

import pytest

from attnkit.metrics import bleu_statistics
from attnkit.metrics import statistics as stats_module


class Token(str):
    """A token that counts the hash and equality calls made on it (into ``calls``)."""

    calls = [0]

    def __hash__(self) -> int:
        Token.calls[0] += 1
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        Token.calls[0] += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        Token.calls[0] += 1
        return str.__ne__(self, other)


def _lines(length: int, vocabulary: int | None, seed: int = 0) -> tuple[str, str, str]:
    """A hypothesis of ``length`` words from ``vocabulary`` words (None: all distinct, no
    n-gram repeats) and two references sharing most of it."""
    rng = random.Random(seed)
    size = vocabulary or length
    words = [f"w{rng.randrange(size)}" if vocabulary else f"w{i}" for i in range(length)]
    ref1 = [w if rng.random() < 0.8 else "x" for w in words]
    ref2 = words[: length * 3 // 4]
    return " ".join(words), " ".join(ref1), " ".join(ref2)


def _work(monkeypatch, length: int, vocabulary: int | None) -> int:
    """Hash and equality calls on tokens made by scoring one segment of ``length`` words."""
    real_row = stats_module._segment_row

    def counted_row(hyp, refs, max_order):
        # A fresh object for every token, so that no comparison is skipped by identity.
        row = real_row([Token(t) for t in hyp], [[Token(t) for t in r] for r in refs], max_order)
        assert row == real_row(hyp, refs, max_order)  # counting changes no statistic
        return row

    monkeypatch.setattr(stats_module, "_segment_row", counted_row)
    hyp, ref1, ref2 = _lines(length, vocabulary)
    Token.calls[0] = 0
    bleu_statistics([hyp], [[ref1], [ref2]])
    calls = Token.calls[0]
    monkeypatch.undo()
    return calls


@pytest.mark.parametrize(
    "vocabulary", [10, 3, None], ids=["repeats", "every-ngram-repeats", "no-repeats"]
)
def test_ngram_matching_work_is_linear_in_the_segment_length(monkeypatch, vocabulary):
    short = _work(monkeypatch, 2_000, vocabulary)
    long = _work(monkeypatch, 8_000, vocabulary)
    assert short > 2_000  # the tokens are hashed: the count sees the matching
    ratio = long / short
    # Linear: 4x, a little more as a longer segment repeats a larger share of its n-grams
    # (each repeat costs one comparison more); quadratic: 16x.
    assert 3.5 < ratio < 6, f"4x the words cost {ratio:.2f}x the work; linear is about 4x"


class _PairwiseCounter(dict):
    """A Counter that counts each item by comparing it with every other: quadratic."""

    def __init__(self, items=()) -> None:
        items = list(items)
        super().__init__((x, sum(1 for y in items if y == x)) for x in items)

    def __missing__(self, key) -> int:
        return 0


def test_the_count_catches_quadratic_matching(monkeypatch):
    """The same measure, with the repeated-n-gram counts made pairwise: 4x the words cost
    about 16x the work, far outside the linear bound above."""

    def work(length: int) -> int:
        monkeypatch.setattr(stats_module, "Counter", _PairwiseCounter)
        return _work(monkeypatch, length, 50)

    ratio = work(400) / work(100)
    assert ratio > 10, f"a quadratic matching cost only {ratio:.2f}x"
