"""BLEU tokenizers, one per module, each giving the same tokens as sacreBLEU's of that name.

A tokenizer is a plain function ``str -> str``: it returns the line with its tokens joined by
single spaces, exactly the string sacreBLEU's tokenizer of the same name returns, so the two
can be compared line by line. BLEU then splits that string on whitespace.

==========  ======================================================================
name        what it does
==========  ======================================================================
``none``    nothing: the line is already tokenized
``13a``     mteval-v13a.pl, the WMT standard and sacreBLEU's default
``intl``    mteval-v14.pl ``--international-tokenization`` (Unicode punctuation)
``char``    every character is a token
``zh``      every CJK character is a token, the rest as ``13a``
==========  ======================================================================
"""

from __future__ import annotations

from collections.abc import Callable

from attnkit.metrics.tokenizers.tokenizer_13a import tokenize_13a
from attnkit.metrics.tokenizers.tokenizer_char import tokenize_char
from attnkit.metrics.tokenizers.tokenizer_intl import tokenize_intl
from attnkit.metrics.tokenizers.tokenizer_none import tokenize_none
from attnkit.metrics.tokenizers.tokenizer_zh import tokenize_zh

Tokenizer = Callable[[str], str]

TOKENIZERS: dict[str, Tokenizer] = {
    "none": tokenize_none,
    "13a": tokenize_13a,
    "intl": tokenize_intl,
    "char": tokenize_char,
    "zh": tokenize_zh,
}
"""Every tokenizer by the name sacreBLEU (and the BLEU signature) gives it."""


def get_tokenizer(name: str) -> Tokenizer:
    """Return the tokenizer called ``name``.

    Args:
        name: One of :data:`TOKENIZERS` (``"none"``, ``"13a"``, ``"intl"``, ``"char"``, ``"zh"``).

    Returns:
        A function from a line to its tokens joined by single spaces.

    Raises:
        ValueError: If ``name`` is not a known tokenizer; the message lists the known ones.
    """
    try:
        return TOKENIZERS[name]
    except (KeyError, TypeError):
        known = ", ".join(repr(k) for k in TOKENIZERS)
        raise ValueError(
            f"tokenize={name!r} is not a known tokenizer; expected one of {known}"
        ) from None


__all__ = [
    "TOKENIZERS",
    "Tokenizer",
    "get_tokenizer",
    "tokenize_13a",
    "tokenize_char",
    "tokenize_intl",
    "tokenize_none",
    "tokenize_zh",
]
