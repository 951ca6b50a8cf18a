"""Helpers of the BLEU tests: sacreBLEU's results for the test corpora (computed once per
session) and comparisons with them."""

from __future__ import annotations

import logging
from functools import cache

import pytest
from sacrebleu.metrics import BLEU

from tests.helpers.corpora import corpus

TOL = 1e-9
"""Every float must equal sacreBLEU's to this (in practice they are bit-identical)."""


def assert_same_bleu(ours, theirs) -> None:
    """Score, precisions, counts, totals, BP and lengths of two BLEU results agree."""
    assert list(ours.counts) == list(theirs.counts)
    assert list(ours.totals) == list(theirs.totals)
    assert (ours.sys_len, ours.ref_len) == (theirs.sys_len, theirs.ref_len)
    assert ours.bp == pytest.approx(theirs.bp, abs=TOL, rel=0)
    assert ours.precisions == pytest.approx(list(theirs.precisions), abs=TOL, rel=0)
    assert ours.score == pytest.approx(theirs.score, abs=TOL, rel=0)


def signature_fields(signature: str) -> dict[str, str]:
    """``{"nrefs": "1", "case": "mixed", ...}`` without ``version`` (attnkit's, not sacreBLEU's)."""
    fields = dict(field.split(":", 1) for field in signature.split("|"))
    fields.pop("version")
    return fields


# sacreBLEU warns about sentence-level BLEU without effective order; the tests do it on purpose.
logging.getLogger("sacrebleu").setLevel(logging.ERROR)


@cache
def sacre_metric(name: str, tokenize: str, lowercase: bool) -> BLEU:
    """One sacreBLEU metric per corpus and tokenization, so its tokenizer cache is reused."""
    return BLEU(tokenize=tokenize, lowercase=lowercase)


@cache
def sacre_corpus(name: str, tokenize: str, lowercase: bool, kind: str):
    """sacreBLEU's corpus score and signature for a test corpus."""
    c = corpus(name)
    metric = sacre_metric(name, tokenize, lowercase)
    score = metric.corpus_score(list(c.hypotheses), c.references(kind))
    return score, metric.get_signature().format()


@cache
def sacre_rows(name: str, tokenize: str, lowercase: bool, kind: str) -> list[tuple[int, ...]]:
    """sacreBLEU's per-line statistics of a test corpus: the rows its corpus_score sums, and
    what its sentence_score computes for each line."""
    c = corpus(name)
    metric = sacre_metric(name, tokenize, lowercase)
    rows = metric._extract_corpus_statistics(list(c.hypotheses), c.references(kind))
    return [tuple(int(x) for x in row) for row in rows]
