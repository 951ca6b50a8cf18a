"""The signature has sacreBLEU's fields, in its order, for every setting."""

from __future__ import annotations

import itertools
from importlib.metadata import version

import pytest
from sacrebleu.metrics import BLEU

from attnkit.metrics import TOKENIZERS, bleu_signature, corpus_bleu

SMOOTHINGS = [
    ("none", None),
    ("floor", None),
    ("floor", 0.25),
    ("add-k", None),
    ("add-k", 3),
    ("exp", None),
]


@pytest.mark.parametrize("smooth_method, smooth_value", SMOOTHINGS)
def test_signature_fields_equal_sacrebleus(smooth_method, smooth_value):
    hyps = ["a b c", "d e"]
    for tokenize, lowercase, effective_order, nrefs in itertools.product(
        TOKENIZERS, [False, True], [False, True], [1, 2, "var"]
    ):
        refs = [["a b", "d"], ["a", "e"]][: 1 if nrefs == 1 else 2]
        if nrefs == "var":
            refs = [["a b", "d"], ["a", None]]
        kwargs = dict(
            tokenize=tokenize,
            lowercase=lowercase,
            effective_order=effective_order,
            smooth_method=smooth_method,
            smooth_value=smooth_value,
        )
        metric = BLEU(**kwargs)
        metric.corpus_score(hyps, refs)
        ours = corpus_bleu(hyps, refs, **kwargs).signature
        for short in (False, True):
            theirs = metric.get_signature().format(short=short)
            mine = bleu_signature(nrefs=nrefs, short=short, **kwargs)
            assert mine.rsplit("|", 1)[0] == theirs.rsplit("|", 1)[0]
        assert ours == bleu_signature(nrefs=nrefs, **kwargs)


def test_version_is_attnkits():
    assert corpus_bleu(["a"], [["a"]]).signature.endswith(f"|version:{version('attnkit')}")
