"""Sufficient statistics: per line as sacreBLEU's, and adding across batches and files."""

from __future__ import annotations

import pytest
from sacrebleu.metrics import BLEU

from attnkit.metrics import BLEUStatistics, bleu_from_statistics, bleu_statistics

from .conftest import assert_same_bleu, sacre_corpus, signature_fields
from .corpora import corpus


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
    assert signature_fields(bleu_from_statistics(sum(batches)).signature) == signature_fields(signature)


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
    assert (stats.sys_len, stats.ref_len, stats.counts, stats.totals) == (3, 5, [3, 2, 1], [3, 2, 1])


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
