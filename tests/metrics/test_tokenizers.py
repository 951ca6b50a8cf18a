"""Every tokenizer gives sacreBLEU's tokens for every line of the test corpora and more."""

from __future__ import annotations

import random

import pytest
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
from sacrebleu.tokenizers.tokenizer_char import TokenizerChar
from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International
from sacrebleu.tokenizers.tokenizer_none import NoneTokenizer
from sacrebleu.tokenizers.tokenizer_zh import TokenizerZh

from attnkit.metrics.tokenizers import TOKENIZERS, get_tokenizer
from attnkit.metrics.tokenizers.tokenizer_13a import (
    mteval_punctuation,
    mteval_punctuation_reference,
)
from attnkit.metrics.tokenizers.tokenizer_zh import is_chinese_char
from tests.helpers.corpora import CHINESE, CORPORA, PUNCT, UNICODE, corpus

SACRE = {
    "none": NoneTokenizer,
    "13a": Tokenizer13a,
    "intl": TokenizerV14International,
    "char": TokenizerChar,
    "zh": TokenizerZh,
}

# Characters that exercise every rule of 13a and zh: digits next to . , -, entities, symbols,
# CJK and the general punctuation that zh treats as CJK, odd whitespace.
TRICKY = "ab1 2.,.,-&;<>!?'\"()[]/\\@#\t\nxé中，。—“”€\u00a0\u3000"


def _lines() -> list[str]:
    lines = []
    for name in CORPORA:
        c = corpus(name)
        lines += c.hypotheses + c.reference + tuple(s for s in c.second if s is not None)
    lines += UNICODE + CHINESE + PUNCT + ["", " ", "\t", "&amp;lt;", "<skipped>-\nx", "x -\n"]
    return lines


def test_registry_lists_the_sacrebleu_tokenizers():
    assert sorted(TOKENIZERS) == sorted(SACRE)
    for name in SACRE:
        assert get_tokenizer(name) is TOKENIZERS[name]


@pytest.mark.parametrize("name", list(SACRE))
def test_same_tokens_as_sacrebleu_on_every_line(name):
    ours, theirs = get_tokenizer(name), SACRE[name]()
    assert theirs.signature() == name
    for line in _lines():
        # BLEU lowercases first and strips the end, so test those variants too.
        for variant in {line, line.lower().rstrip()}:
            assert ours(variant) == theirs(variant), variant


@pytest.mark.parametrize("name", ["13a", "zh", "intl"])
def test_same_tokens_as_sacrebleu_on_random_strings(name):
    rng = random.Random(f"tokenizer-{name}")
    ours, theirs = get_tokenizer(name), SACRE[name]()
    for _ in range(5_000):
        line = "".join(rng.choice(TRICKY) for _ in range(rng.randint(0, 12)))
        assert ours(line) == theirs(line), repr(line)


def test_fast_13a_rules_equal_the_regular_expressions():
    """The regex-free path of rules 3-6 equals sacreBLEU's regular expressions."""
    rng = random.Random("mteval")
    for _ in range(10_000):
        line = "".join(rng.choice(TRICKY) for _ in range(rng.randint(0, 12)))
        assert mteval_punctuation(line) == mteval_punctuation_reference(line), repr(line)
    for line in _lines()[:3000]:
        assert mteval_punctuation(f" {line} ") == mteval_punctuation_reference(f" {line} ")


def test_zh_splits_the_same_characters_as_sacrebleu():
    """Every BMP code point, and the astral ones around sacreBLEU's misread ranges."""
    theirs = TokenizerZh._is_chinese_char
    astral = [0x10000, 0x1FFFF, 0x20000, 0x20001, 0x2A6D6, 0x2A6D7, 0x2F800, 0x2FA1D, 0x10FFFF]
    for code in [*range(0xD800), *range(0xE000, 0x10000), *astral]:
        char = chr(code)
        assert is_chinese_char(char) == theirs(char), hex(code)


def test_unknown_tokenizer_error_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"tokenize='ja-mecab' is not a known tokenizer") as err:
        get_tokenizer("ja-mecab")
    assert all(repr(name) in str(err.value) for name in SACRE)
