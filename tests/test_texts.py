"""attnkit.texts: texts are a list of str, each valid UTF-8; the errors name the item."""

from __future__ import annotations

import pytest

from attnkit.texts import check_text, check_texts, check_tokenizer


def test_texts_come_back_as_a_list_an_iterator_read_once():
    assert check_texts(iter(["a", "Straße"]), "lines") == ["a", "Straße"]
    assert check_texts((), "lines") == []


@pytest.mark.parametrize(
    ("texts", "error", "message"),
    [
        ("a b", TypeError, r"^lines: expected an iterable of strings \(one per line\), got a str"),
        ({"a": 1}, TypeError, r"^lines: expected an iterable of strings .* got dict"),
        (5, TypeError, r"^lines: expected an iterable of strings .* got int"),
        (["a", None], TypeError, r"^lines\[1\]: expected a str, got NoneType"),
        (
            ["ok", "ein \udc80 hund"],
            ValueError,
            r"^lines\[1\]: not valid UTF-8 text \(a lone surrogate U\+DC80 at character 5, ",
        ),
    ],
)
def test_what_is_not_text_is_named(texts, error, message):
    with pytest.raises(error, match=message):
        check_texts(texts, "lines", item="line")


def test_one_text_with_or_without_a_name():
    assert check_text("Ein Hund.") == "Ein Hund."
    with pytest.raises(
        ValueError, match=r"^prompt: not valid UTF-8 text \(a lone surrogate U\+D800"
    ):
        check_text("\ud800", "prompt")
    with pytest.raises(ValueError, match=r"^not valid UTF-8 text \(a lone surrogate U\+DFFF at "):
        check_text("ab\udfff")


@pytest.mark.parametrize("text", [None, b"Ein Hund.", ["Ein Hund."], 3])
def test_one_text_that_is_not_a_str_is_named(text):
    """Before: AttributeError from text.isascii(), naming no argument."""
    kind = type(text).__name__
    with pytest.raises(TypeError, match=rf"^src_text: expected a str, got {kind}$"):
        check_text(text, "src_text")
    with pytest.raises(TypeError, match=rf"^text: expected a str, got {kind}$"):
        check_text(text)


def test_a_tokenizer_name_or_path_is_not_a_tokenizer():
    from pathlib import Path

    class Tokenizer:
        def encode(self, text):
            return []

    check_tokenizer(Tokenizer())
    check_tokenizer(None)  # "use the model's own", where the caller allows it
    for given in ("gpt2", b"gpt2", Path("tok.json")):
        with pytest.raises(TypeError, match=r"^tok: expected a tokenizer object .*downloads "):
            check_tokenizer(given, "tok")
