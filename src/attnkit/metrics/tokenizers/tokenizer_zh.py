"""The ``zh`` tokenizer: every CJK character is a token, the rest is tokenized as ``13a``.

This follows sacreBLEU's ``TokenizerZh`` (by Shujian Huang), which tests each character
against a list of ranges. Two of those ranges are written there as five-digit ``\\u`` escapes
(``'\\u20000'``, ``'\\u2a6d6'``, ``'\\u2f800'``, ``'\\u2fa1d'``), which Python reads as a
four-digit escape plus one more character; compared as strings, they select U+2001..U+2A6D and
U+2F81..U+2FA1 rather than the CJK Extension B and Compatibility Supplement planes. The first
covers general punctuation, currency, arrows and mathematical symbols (``—``, ``“``, ``…``,
``€``). To give sacreBLEU's tokens, :data:`_CJK_RANGES` keeps those effective ranges; a test
checks every code point against sacreBLEU.
"""

from __future__ import annotations

import re
from functools import lru_cache

from attnkit.metrics.tokenizers.tokenizer_13a import mteval_punctuation

_CJK_RANGES = (
    (0x3400, 0x4DB5),  # CJK Unified Ideographs Extension A
    (0x4E00, 0x9FA5),  # CJK Unified Ideographs
    (0x9FA6, 0x9FBB),  # CJK Unified Ideographs, Unicode 4.1
    (0xF900, 0xFA2D),  # CJK Compatibility Ideographs
    (0xFA30, 0xFA6A),  # CJK Compatibility Ideographs, Unicode 3.2
    (0xFA70, 0xFAD9),  # CJK Compatibility Ideographs, Unicode 4.1
    (0x2001, 0x2A6D),  # sacreBLEU's '\u20000'..'\u2a6d6' (meant: Extension B), see above
    (0x2F81, 0x2FA1),  # sacreBLEU's '\u2f800'..'\u2fa1d' (meant: Compatibility Supplement)
    (0xFF00, 0xFFEF),  # full-width ASCII and punctuation, half-width kana and Hangul
    (0x2E80, 0x2EFF),  # CJK Radicals Supplement
    (0x3000, 0x303F),  # CJK punctuation
    (0x31C0, 0x31EF),  # CJK strokes
    (0x2F00, 0x2FDF),  # Kangxi radicals
    (0x2FF0, 0x2FFF),  # ideographic description characters
    (0x3100, 0x312F),  # Bopomofo
    (0x31A0, 0x31BF),  # Bopomofo extended
    (0xFE10, 0xFE1F),  # vertical forms
    (0xFE30, 0xFE4F),  # CJK compatibility forms
    (0x2600, 0x26FF),  # miscellaneous symbols
    (0x2700, 0x27BF),  # dingbats
    (0x3200, 0x32FF),  # enclosed CJK letters and months
    (0x3300, 0x33FF),  # CJK compatibility
)

_CJK_CHAR = re.compile("[" + "".join(f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in _CJK_RANGES) + "]")


def is_chinese_char(char: str) -> bool:
    """Whether ``char`` (one character) is split off as its own token by ``zh``."""
    return _CJK_CHAR.fullmatch(char) is not None


@lru_cache(maxsize=2**16)
def tokenize_zh(line: str) -> str:
    """Tokenize ``line`` for Chinese: CJK characters apart, the rest as ``13a``.

    Args:
        line: One segment.

    Returns:
        The tokens of ``line`` joined by single spaces.
    """
    return mteval_punctuation(_CJK_CHAR.sub(r" \g<0> ", line.strip()))
