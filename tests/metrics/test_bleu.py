"""corpus_bleu, sentence_bleu and compute_bleu against sacreBLEU, computed in the test."""

from __future__ import annotations

import itertools
import math

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU

from attnkit.metrics import (
    TOKENIZERS,
    bleu_from_statistics,
    bleu_statistics,
    compute_bleu,
    corpus_bleu,
    sentence_bleu,
)
from tests.helpers.corpora import CORPORA, corpus
from tests.helpers.metrics import TOL, assert_same_bleu, sacre_corpus, sacre_rows, signature_fields

SMOOTHINGS = [
    ("none", None),
    ("floor", None),
    ("floor", 0.5),
    ("add-k", None),
    ("add-k", 2),
    ("exp", None),
]


def _corpus_cases():
    # Every corpus, tokenizer and case with variable references (one or two per line, so both
    # single- and multi-reference lines); with the default tokenizer also one reference and two
    # on every line.
    for name, tokenize, lowercase in itertools.product(CORPORA, TOKENIZERS, [False, True]):
        kinds = ("one", "two", "var") if tokenize == "13a" else ("var",)
        for kind in kinds:
            yield pytest.param(
                name, tokenize, lowercase, kind, id=f"{name}-{tokenize}-{lowercase}-{kind}"
            )


@pytest.mark.parametrize("name, tokenize, lowercase, kind", list(_corpus_cases()))
def test_corpus_bleu_matches_sacrebleu(name, tokenize, lowercase, kind):
    """Corpus BLEU, its statistics and signature equal sacreBLEU's, and so does corpus BLEU with
    every smoothing method computed from the same statistics. With variable references, the
    per-line statistics are compared too for 13a and for the Chinese corpus (the n-gram and
    reference-length logic does not depend on the tokenizer, whose tokens test_tokenizers
    compares line by line)."""
    c = corpus(name)
    theirs, their_signature = sacre_corpus(name, tokenize, lowercase, kind)
    stats = bleu_statistics(
        list(c.hypotheses), c.references(kind), tokenize=tokenize, lowercase=lowercase
    )
    ours = bleu_from_statistics(stats)
    assert_same_bleu(ours, theirs)
    assert signature_fields(ours.signature) == signature_fields(their_signature)
    assert ours.verbose_score == theirs._verbose
    if kind == "var" and (tokenize == "13a" or name == "zh"):
        assert list(stats.segments) == sacre_rows(name, tokenize, lowercase, kind)
    for smooth_method, smooth_value in SMOOTHINGS:
        for effective_order in (False, True):
            kwargs = dict(
                smooth_method=smooth_method,
                smooth_value=smooth_value,
                effective_order=effective_order,
            )
            expected = BLEU.compute_bleu(
                list(theirs.counts), list(theirs.totals), theirs.sys_len, theirs.ref_len, **kwargs
            )
            assert_same_bleu(bleu_from_statistics(stats, **kwargs), expected)


def _sentence_rows() -> list[tuple[int, ...]]:
    rows = set()
    rows.update(sacre_rows("en", "13a", False, "var"))
    rows.update(sacre_rows("zh", "zh", False, "var"))
    # Degenerate statistics: nothing matched, nothing to match, no hypothesis, no reference.
    rows.update(
        [
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
            (0, 5, 0, 0, 0, 0, 0, 0, 0, 0),
            (3, 0, 0, 0, 0, 0, 3, 2, 1, 0),
            (1, 1, 1, 0, 0, 0, 1, 0, 0, 0),
            (2, 7, 2, 1, 0, 0, 2, 1, 0, 0),
            (6, 6, 6, 5, 4, 0, 6, 5, 4, 3),
        ]
    )
    return sorted(rows)


@pytest.mark.parametrize("effective_order", [False, True])
@pytest.mark.parametrize("smooth_method, smooth_value", SMOOTHINGS)
def test_sentence_scores_match_sacrebleu(smooth_method, smooth_value, effective_order):
    """Sentence BLEU of every line of every corpus, from sacreBLEU's per-line statistics
    (which the corpus test shows equal ours), plus degenerate statistics."""
    kwargs = dict(
        smooth_method=smooth_method, smooth_value=smooth_value, effective_order=effective_order
    )
    for row in _sentence_rows():
        theirs = BLEU.compute_bleu(list(row[2:6]), list(row[6:]), row[0], row[1], **kwargs)
        ours = compute_bleu(row[2:6], row[6:], row[0], row[1], **kwargs)
        assert_same_bleu(ours, theirs)


@pytest.mark.parametrize("smooth_method", ["none", "floor", "add-k", "exp"])
@pytest.mark.parametrize("lowercase", [False, True])
@pytest.mark.parametrize("tokenize", list(TOKENIZERS))
@pytest.mark.parametrize("name", CORPORA)
def test_sentence_bleu_matches_sacrebleu(name, tokenize, lowercase, smooth_method):
    """The public sentence API on every 60th line, with one and with two references."""
    c = corpus(name)
    metric = BLEU(
        tokenize=tokenize, lowercase=lowercase, smooth_method=smooth_method, effective_order=True
    )
    for i in range(0, len(c.hypotheses), 60):
        for refs in ([c.reference[i]], [c.reference[i], c.second[i]]):
            refs = [r for r in refs if r is not None]
            theirs = metric.sentence_score(c.hypotheses[i], refs)
            ours = sentence_bleu(
                c.hypotheses[i],
                refs,
                tokenize=tokenize,
                lowercase=lowercase,
                smooth_method=smooth_method,
            )
            assert_same_bleu(ours, theirs)
            assert signature_fields(ours.signature) == signature_fields(
                metric.get_signature().format()
            )


@pytest.mark.parametrize("effective_order", [False, True])
@pytest.mark.parametrize("max_ngram_order", [1, 2, 3, 5, 6])
def test_other_orders_and_effective_order_match_sacrebleu(max_ngram_order, effective_order):
    c = corpus("en")
    hyps, refs = list(c.hypotheses[:100]), c.references("var")
    refs = [r[:100] for r in refs]
    kwargs = dict(max_ngram_order=max_ngram_order, effective_order=effective_order)
    theirs = BLEU(**kwargs).corpus_score(hyps, refs)
    assert_same_bleu(corpus_bleu(hyps, refs, **kwargs), theirs)
    for hyp, *line_refs in list(zip(hyps, *refs, strict=True))[:20]:
        line_refs = [r for r in line_refs if r is not None]
        theirs = BLEU(**kwargs).sentence_score(hyp, line_refs)
        assert_same_bleu(sentence_bleu(hyp, line_refs, **kwargs), theirs)


SMALL_CASES = [
    # (hypotheses, reference streams): short, empty and degenerate corpora.
    (["", ""], [["", ""]]),
    (["", ""], [["a b c", "d e"]]),
    (["a b c", "d e"], [["", ""]]),
    (["the cat"], [["the cat sat on the mat"]]),
    (["the the the the"], [["the cat is on the mat"], ["there is a cat on the mat"]]),
    (["a b c"], [["a b"], ["a b c d"]]),  # closest reference length, tie to the shorter
    (["a b c d e f g"], [["a b c d e f g h i"], ["a b"]]),
    (["x"], [["x"]]),
    (["   ", "\t"], [["a", "b"]]),
    (["The dog.", "It is."], [["the dog .", "It is"]]),
]


@pytest.mark.parametrize("smooth_method, smooth_value", SMOOTHINGS)
@pytest.mark.parametrize("hyps, refs", SMALL_CASES)
def test_small_corpora_match_sacrebleu(hyps, refs, smooth_method, smooth_value):
    for effective_order in (False, True):
        kwargs = dict(
            smooth_method=smooth_method, smooth_value=smooth_value, effective_order=effective_order
        )
        theirs = BLEU(**kwargs).corpus_score(hyps, refs)
        assert_same_bleu(corpus_bleu(hyps, refs, **kwargs), theirs)


def test_empty_input_scores_zero_with_statistics():
    score = corpus_bleu([], [[]])
    assert score.score == 0.0
    assert score.counts == [0, 0, 0, 0] and score.totals == [0, 0, 0, 0]
    assert (score.sys_len, score.ref_len, score.bp) == (0, 0, 1.0)
    assert score.precisions == [0.0] * 4
    assert signature_fields(score.signature)["nrefs"] == "1"
    assert corpus_bleu([], [[], []]).signature.startswith("nrefs:2|")


# ---------------------------------------------------------------------------------------------
# sacreBLEU's published values: its README and test/test_bleu.py, test/test_sentence_bleu.py.

README_REFS = [
    ["The dog bit the man.", "It was not unexpected.", "The man bit him first."],
    ["The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."],
]
README_HYPS = ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]


def test_readme_example():
    score = corpus_bleu(README_HYPS, README_REFS)
    assert score.format(with_signature=False) == (
        "BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)"
    )
    assert score.signature.rsplit("|", 1)[0] == "nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp"


@pytest.mark.parametrize(
    "hyps, refs, kwargs, expected",
    [
        (README_HYPS, README_REFS, {}, 48.530827),
        (("", "", ""), README_REFS, {}, 0.0),
        (README_HYPS, README_REFS, {"tokenize": "none"}, 49.1919566),
        (README_HYPS, README_REFS, {"tokenize": "13a"}, 48.530827),
        (README_HYPS, README_REFS, {"tokenize": "intl"}, 43.91623493),
        (README_HYPS, README_REFS, {"smooth_method": "none"}, 48.530827),
    ],
)
def test_published_corpus_scores(hyps, refs, kwargs, expected):
    assert abs(corpus_bleu(hyps, refs, **kwargs).score - expected) < 1e-6


# sacrebleu.raw_corpus_bleu(hyps, [refs], smooth_value): floor smoothing, no tokenization,
# effective order.
RAW = dict(tokenize="none", smooth_method="floor", effective_order=True)


@pytest.mark.parametrize(
    "hyps, refs, smooth_value, expected",
    [
        # Published as 0.0037991784 before sacreBLEU 1.4.3; since #141, no match at all gives 0.
        (["this is a test", "another test"], ["ref1", "ref2"], 0.01, 0.0),
        (["this is a test"], ["this is a test"], 0.01, 1.0),
        (["this is a fest"], ["this is a test"], 0.01, 0.223606797749979),
        (["test"], ["a test"], 0.01, 0.3678794411714425),  # effective order
        (["a test"], ["a test"], 0.01, 1.0),
        (["a little test"], ["a test"], 0.01, 0.03218297948685433),
        (
            ["am I am a character sequence"],
            ["I am a symbol string sequence a a"],
            None,
            0.1555722182,
        ),
        (["am I am a character sequence"], ["I am a symbol string sequence a a"], 0.0, 0.0),
    ],
)
def test_published_raw_scores(hyps, refs, smooth_value, expected):
    score = corpus_bleu(hyps, [refs], smooth_value=smooth_value, **RAW)
    assert abs(score.score / 100 - expected) < 1e-8


def test_published_statistics():
    score = corpus_bleu(
        ["am I am a character sequence"],
        [["I am a symbol string sequence a a"]],
        smooth_value=0.01,
        **RAW,
    )
    assert (score.counts, score.totals) == ([4, 2, 1, 0], [6, 5, 4, 3])


def test_published_scoring():
    score = compute_bleu([9, 7, 5, 3], [10, 8, 6, 4], 11, 11, smooth_method="none")
    assert abs(score.score / 100 - 0.8375922397) < 1e-8


@pytest.mark.parametrize(
    "counts, totals, sys_len, ref_len, offset",
    [
        ([0, 0, 0, 0], [4, 4, 2, 1], 0, 1, 0.0),
        ([0, 0, 0, 0], [10, 11, 12, 0], 14, 10, 0.0),
        ([0, 0, 0, 0], [0, 0, 0, 0], 0, 0, 0.0),
        ([6, 5, 4, 0], [6, 5, 4, 3], 6, 6, 0.0),
        ([0, 0, 0, 0], [0, 0, 0, 0], 0, 0, 0.1),
        ([0, 0, 0, 0], [0, 0, 0, 0], 1, 5, 0.01),
    ],
)
def test_published_degenerate_statistics(counts, totals, sys_len, ref_len, offset):
    score = compute_bleu(
        counts, totals, sys_len, ref_len, smooth_method="floor", smooth_value=offset
    )
    assert score.score == 0.0


SENT_REF = "producţia de zahăr brut se exprimă în zahăr alb;"
SENT_HYP = "Producția de zahăr primă va fi exprimată în ceea ce privește zahărul alb;"


@pytest.mark.parametrize(
    "smooth_method, smooth_value, lowercase, tokenize, expected",
    [
        ("exp", None, False, "13a", 8.493),
        ("none", None, False, "13a", 0.0),
        ("floor", None, False, "13a", 4.51688),
        ("floor", 0.1, False, "13a", 4.51688),
        ("floor", 0.5, False, "13a", 10.10),
        ("add-k", None, False, "13a", 14.882),
        ("add-k", 1, False, "13a", 14.882),
        ("add-k", 2, False, "13a", 21.389),
        ("exp", None, False, "none", 7.347),
        ("exp", None, False, "intl", 8.493),
        ("exp", None, False, "char", 40.8759),
        ("exp", None, True, "char", 42.0267),
    ],
)
def test_published_sentence_scores(smooth_method, smooth_value, lowercase, tokenize, expected):
    score = sentence_bleu(
        SENT_HYP,
        [SENT_REF],
        smooth_method=smooth_method,
        smooth_value=smooth_value,
        lowercase=lowercase,
        tokenize=tokenize,
    )
    assert abs(score.score - expected) < 1e-3  # the published precision


@pytest.mark.parametrize("smooth_method", ["exp", "none", "floor", "add-k"])
def test_published_zero_sentence_scores(smooth_method):
    assert sentence_bleu("this is a cat", ["okay thanks"], smooth_method=smooth_method).score == 0.0


def test_compat_functions_agree():
    """sacrebleu.corpus_bleu / sentence_bleu (the 1.x-style functions) give the same numbers."""
    c = corpus("en")
    hyps, refs = list(c.hypotheses[:100]), [list(c.reference[:100])]
    assert_same_bleu(corpus_bleu(hyps, refs), sacrebleu.corpus_bleu(hyps, refs))
    theirs = sacrebleu.sentence_bleu(hyps[3], [refs[0][3]])
    assert_same_bleu(sentence_bleu(hyps[3], [refs[0][3]]), theirs)
    assert abs(sentence_bleu(hyps[3], [refs[0][3]]).score - theirs.score) <= TOL


# ---------------------------------------------------------------------------------------------
# Bad input.


def test_unknown_tokenizer_lists_the_known_ones():
    with pytest.raises(ValueError, match="tokenize='moses'") as err:
        corpus_bleu(["a"], [["a"]], tokenize="moses")
    for name in TOKENIZERS:
        assert repr(name) in str(err.value)


def test_unknown_smoothing_lists_the_known_ones():
    with pytest.raises(
        ValueError, match="smooth_method='add-one'.*'none'.*'floor'.*'add-k'.*'exp'"
    ):
        corpus_bleu(["a"], [["a"]], smooth_method="add-one")


@pytest.mark.parametrize(
    "hyps, refs, error, match",
    [
        ("a b c", [["a b c"]], TypeError, "hypotheses must be a sequence"),
        (["a b c"], ["a b c"], TypeError, r"references\[0\] must be a sequence"),
        (["a", None], [["a", "b"]], TypeError, r"hypotheses\[1\] must be a string"),
        (["a", "b"], [["a"]], ValueError, r"references\[0\] has 1 lines but hypotheses has 2"),
        (["a", "b"], [["a", "b"], ["a"]], ValueError, r"references\[1\] has 1 lines"),
        (["a"], [], ValueError, "at least one reference stream"),
        (["a", "b"], [["a", None], ["a", None]], ValueError, "line 2 has no reference"),
    ],
)
def test_bad_input_raises_naming_the_argument(hyps, refs, error, match):
    with pytest.raises(error, match=match):
        corpus_bleu(hyps, refs)


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="max_ngram_order"):
        corpus_bleu(["a"], [["a"]], max_ngram_order=0)
    with pytest.raises(ValueError, match="smooth_value"):
        corpus_bleu(["a"], [["a"]], smooth_value="0.1")
    # Before: 10**9 took all the memory (the process was killed), -1 a math domain error, NaN a
    # NaN score, 0 bootstrap resamples were silently none.
    with pytest.raises(ValueError, match=r"max_ngram_order must be an integer from 1 to 100"):
        corpus_bleu(["a"], [["a"]], max_ngram_order=10**9)
    for method, value in (("floor", -1), ("add-k", -1), ("floor", math.nan), ("add-k", math.inf)):
        with pytest.raises(ValueError, match=r"smooth_value: expected a finite number >= 0"):
            corpus_bleu(["a b"], [["a c"]], smooth_method=method, smooth_value=value)
    for n in (0, -5, "100", 2.0):
        with pytest.raises(ValueError, match=r"n_bootstrap must be an integer >= 1"):
            corpus_bleu(["a"], [["a"]], n_bootstrap=n)
    for seed in (-1, "x", 1.5):
        with pytest.raises(ValueError, match=r"seed must be None or an integer >= 0"):
            corpus_bleu(["a b c d"], [["a b c d"]], n_bootstrap=10, seed=seed)
    with pytest.raises(TypeError, match="single str"):
        sentence_bleu("a b", "a b")
    with pytest.raises(TypeError, match="references must be a sequence of reference strings, got"):
        sentence_bleu("a b", None)  # before: "'NoneType' object is not iterable"


@pytest.mark.parametrize(
    "counts, totals, sys_len, ref_len, message",
    [
        ([5] * 4, [1] * 4, 3, 3, r"order 1 has 5 matches of 1 n-grams"),  # was BLEU 500
        ([1, -1, 0, 0], [1] * 4, 3, 3, r"order 2 has -1 matches of 1 n-grams"),
        (["a"] * 4, [1] * 4, 3, 3, r"order 1 has 'a' matches"),
        ([1] * 4, [1] * 4, -3, 3, r"sys_len: expected a number >= 0, got -3"),
    ],
)
def test_statistics_that_bleu_cannot_come_from_are_refused(
    counts, totals, sys_len, ref_len, message
):
    with pytest.raises(ValueError, match=message):
        compute_bleu(counts, totals, sys_len, ref_len)


def test_tokenized_input_is_warned_about(caplog):
    hyps = ["a tokenized line ."] * 100
    with caplog.at_level("WARNING", logger="attnkit.metrics.bleu"):
        corpus_bleu(hyps, [hyps])
    assert "100 hypothesis lines end in a tokenized period" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnkit.metrics.bleu"):
        corpus_bleu(hyps[:99], [hyps[:99]])
    assert not caplog.text
