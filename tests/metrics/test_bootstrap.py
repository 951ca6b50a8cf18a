"""Bootstrap confidence intervals and paired tests, equal to sacreBLEU's for the same seed."""

from __future__ import annotations

import numpy as np
import pytest
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from attnkit.metrics import bleu_statistics, bootstrap_ci, corpus_bleu, paired_bootstrap
from tests.helpers.corpora import corpus
from tests.helpers.metrics import TOL, assert_same_bleu, signature_fields


@pytest.fixture(autouse=True)
def _default_sacrebleu_seed(monkeypatch):
    monkeypatch.delenv("SACREBLEU_SEED", raising=False)  # sacreBLEU's default: 12345


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("en", {}),
        ("de", {"tokenize": "intl", "lowercase": True, "smooth_method": "add-k"}),
        ("zh", {"tokenize": "zh", "smooth_method": "floor", "smooth_value": 0.2}),
    ],
)
def test_confidence_interval_equals_sacrebleus(name, kwargs):
    c = corpus(name)
    hyps, refs = list(c.hypotheses), c.references("one")
    metric = BLEU(**kwargs)
    theirs = metric.corpus_score(hyps, refs, n_bootstrap=1000)
    ours = corpus_bleu(hyps, refs, n_bootstrap=1000, **kwargs)
    assert_same_bleu(ours, theirs)
    assert ours.ci.mean == pytest.approx(theirs._mean, abs=TOL, rel=0)
    assert ours.ci.half_width == pytest.approx(theirs._ci, abs=TOL, rel=0)
    assert signature_fields(ours.signature) == signature_fields(metric.get_signature().format())
    assert "bs:1000|seed:12345" in ours.signature
    assert ours.format(width=1, with_signature=False) == theirs.format(width=1)


def test_interval_is_deterministic_for_a_seed_and_contains_the_score():
    c = corpus("en")
    stats = bleu_statistics(list(c.hypotheses), c.references("one"))
    score = corpus_bleu(list(c.hypotheses), c.references("one")).score
    first = bootstrap_ci(stats, seed=7)
    assert bootstrap_ci(stats, seed=7) == first
    assert bootstrap_ci(stats, seed=8) != first
    for ci in (first, bootstrap_ci(stats)):
        assert ci.lower <= score <= ci.upper
        assert ci.lower <= ci.mean <= ci.upper
        assert ci.half_width == pytest.approx((ci.upper - ci.lower) / 2)
        assert (ci.n_samples, ci.level) == (1000, 0.95)
    # A 95% interval of ~1000 lines of noisy output is a few BLEU wide, not 0 or 100.
    assert 0.5 < first.upper - first.lower < 20


def test_paired_bootstrap_equals_sacrebleus():
    c = corpus("en")
    refs = c.references("one")
    baseline = list(c.hypotheses)
    rng = np.random.default_rng(0)
    # A better system: the reference itself on a random half of the lines.
    system = [r if rng.random() < 0.5 else h for h, r in zip(baseline, refs[0], strict=True)]
    _, scores = PairedTest(
        [("baseline", baseline), ("system", system)],
        {"BLEU": BLEU(references=refs)},
        references=None,
        test_type="bs",
        n_samples=1000,
    )()
    their_bl, their_sys = scores["BLEU"]
    ours = paired_bootstrap(bleu_statistics(baseline, refs), bleu_statistics(system, refs))
    assert ours.baseline.score == pytest.approx(their_bl.score, abs=TOL, rel=0)
    assert ours.system.score == pytest.approx(their_sys.score, abs=TOL, rel=0)
    assert ours.p_value == their_sys.p_value
    assert ours.system_ci.mean == pytest.approx(their_sys.mean, abs=TOL, rel=0)
    assert ours.system_ci.half_width == pytest.approx(their_sys.ci, abs=TOL, rel=0)
    assert ours.baseline_ci.mean == pytest.approx(their_bl.mean, abs=TOL, rel=0)
    assert ours.baseline_ci.half_width == pytest.approx(their_bl.ci, abs=TOL, rel=0)
    assert ours.p_value < 0.01


def test_bad_bootstrap_input():
    stats = bleu_statistics(["a b"], [["a b"]])
    with pytest.raises(ValueError, match="n_samples"):
        bootstrap_ci(stats, n_samples=0)
    with pytest.raises(ValueError, match="same, non-zero number of lines"):
        paired_bootstrap(stats, bleu_statistics(["a", "b"], [["a", "b"]]))
    empty = bootstrap_ci(bleu_statistics([], [[]]))
    assert (empty.mean, empty.lower, empty.upper, empty.half_width) == (0.0, 0.0, 0.0, 0.0)
