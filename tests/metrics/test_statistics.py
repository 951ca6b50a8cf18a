"""Sufficient statistics: per line as sacreBLEU's, and adding across batches and files."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sacrebleu.metrics import BLEU

from attnkit.metrics import BLEUStatistics, bleu_from_statistics, bleu_statistics
from tests.helpers.corpora import corpus
from tests.helpers.metrics import assert_same_bleu, sacre_corpus, signature_fields


def test_batches_add_up_to_the_corpus():
    c = corpus("en")
    refs = c.references("var")
    cuts = [0, 100, 101, 600, len(c.hypotheses)]
    batches = [
        bleu_statistics(list(c.hypotheses[a:b]), [r[a:b] for r in refs])
        for a, b in zip(cuts, cuts[1:], strict=False)
    ]
    whole = bleu_statistics(list(c.hypotheses), refs)
    assert sum(batches) == whole
    assert batches[0] + batches[1] + batches[2] + batches[3] == whole
    theirs, signature = sacre_corpus("en", "13a", False, "var")
    assert_same_bleu(bleu_from_statistics(sum(batches)), theirs)
    assert signature_fields(bleu_from_statistics(sum(batches)).signature) == signature_fields(
        signature
    )


def test_files_add_up_like_one_concatenated_corpus():
    en, de = corpus("en"), corpus("de")
    stats = bleu_statistics(list(en.hypotheses), en.references("one")) + bleu_statistics(
        list(de.hypotheses), de.references("one")
    )
    hyps = list(en.hypotheses + de.hypotheses)
    refs = [list(en.reference + de.reference)]
    assert_same_bleu(bleu_from_statistics(stats), BLEU().corpus_score(hyps, refs))
    assert len(stats) == len(hyps)


def test_rows_have_sacrebleus_layout():
    stats = bleu_statistics(["the cat sat", ""], [["the cat sat down", "x"]], max_ngram_order=3)
    assert stats.segments == ((3, 4, 3, 2, 1, 3, 2, 1), (0, 1, 0, 0, 0, 0, 0, 0))
    assert (stats.sys_len, stats.ref_len, stats.counts, stats.totals) == (
        3,
        5,
        [3, 2, 1],
        [3, 2, 1],
    )


def test_nrefs_of_a_sum():
    one = bleu_statistics(["a"], [["a"]])
    two = bleu_statistics(["a"], [["a"], ["b"]])
    empty = bleu_statistics([], [[], []])
    assert (one + one).nrefs == 1
    assert (one + two).nrefs == "var"
    assert (empty + one).nrefs == 1 and (one + empty).nrefs == 1
    assert bleu_statistics(["a", "b"], [["a", "b"], [None, "c"]]).nrefs == "var"


def test_adding_different_settings_is_an_error():
    a = bleu_statistics(["a"], [["a"]])
    with pytest.raises(ValueError, match="different settings"):
        a + bleu_statistics(["a"], [["a"]], lowercase=True)
    with pytest.raises(ValueError, match="different settings"):
        a + bleu_statistics(["a"], [["a"]], tokenize="intl")
    with pytest.raises(TypeError):
        a + 1


def test_empty_statistics():
    stats = BLEUStatistics()
    assert (len(stats), stats.sys_len, stats.counts, stats.totals) == (0, 0, [0] * 4, [0] * 4)
    with pytest.raises(ValueError, match="rows of 3 numbers"):
        BLEUStatistics(segments=((1, 2, 3),))


# --------------------------------------------------------------------------- repeated n-grams

_WORDS = st.sampled_from(["a", "b", "c", "a.", "B", "-", "é", "a-b", "'s"])
_LINE = st.lists(_WORDS, max_size=30).map(" ".join)


def _sacre_rows(hyps, refs, max_ngram_order=4):
    metric = BLEU(max_ngram_order=max_ngram_order)
    return [tuple(int(x) for x in row) for row in metric._extract_corpus_statistics(hyps, refs)]


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.tuples(_LINE, _LINE, _LINE), min_size=1, max_size=6),
    nrefs=st.integers(1, 2),
    order=st.integers(1, 6),
)
def test_rows_equal_sacrebleus_with_repeated_ngrams(lines, nrefs, order):
    """A vocabulary of a few words makes nearly every n-gram repeat, the case counted from
    Counters (the path that was quadratic)."""
    hyps = [h for h, _, _ in lines]
    refs = [[r1 for _, r1, _ in lines], [r2 for _, _, r2 in lines]][:nrefs]
    ours = bleu_statistics(hyps, refs, max_ngram_order=order)
    assert list(ours.segments) == _sacre_rows(hyps, refs, order)


@pytest.mark.parametrize(
    "hyp, refs",
    [
        ("a a a a a a", ["a a", "a a a"]),  # clipped by the larger reference count
        ("a a a a", ["b b", "c"]),  # repeated, never matched
        ("a b a b a b", ["a b a b a b a b"]),  # more in the reference than the hypothesis
        ("a b a b a b", ["b a b a", "a b"]),
        ("x", ["x x x x"]),
        ("", ["a a"]),
        ("a a", [""]),
    ],
)
def test_tricky_repeats_equal_sacrebleu(hyp, refs):
    stats = bleu_statistics([hyp], [[r] for r in refs])
    assert list(stats.segments) == _sacre_rows([hyp], [[r] for r in refs])


def test_a_20000_word_segment_is_scored_like_sacrebleu():
    """One very long segment from a 50-word vocabulary (every n-gram order repeats), against
    two references; n-gram matching is linear, so this takes a fraction of a second."""
    rng = random.Random(0)
    words = [f"w{rng.randrange(50)}" for _ in range(20_000)]
    hyp = " ".join(words)
    ref1 = " ".join(w if rng.random() < 0.8 else "x" for w in words)
    ref2 = " ".join(words[:15_000])
    ours = bleu_statistics([hyp], [[ref1], [ref2]])
    assert list(ours.segments) == _sacre_rows([hyp], [[ref1], [ref2]])
    assert_same_bleu(bleu_from_statistics(ours), BLEU().corpus_score([hyp], [[ref1], [ref2]]))
