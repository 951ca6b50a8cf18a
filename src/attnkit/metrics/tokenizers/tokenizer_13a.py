"""The ``13a`` tokenizer: mteval-v13a.pl, the WMT standard and sacreBLEU's default.

The rules, in order, on the line padded with a space at each end:

1. drop ``<skipped>``, join ``-`` + newline, newlines become spaces;
2. unescape ``&quot;``, ``&amp;``, ``&lt;``, ``&gt;`` (in that order);
3. split off every ASCII symbol and punctuation mark except ``.``, ``,``, ``-`` and ``'``:
   ``re.sub(r"([\\{-\\~\\[-\\` -\\&\\(-\\+\\:-\\@\\/])", r" \\1 ", line)``;
4. split off ``.`` and ``,`` unless preceded by a digit: ``re.sub(r"([^0-9])([\\.,])", r"\\1 \\2 ", line)``;
5. split off ``.`` and ``,`` unless followed by a digit: ``re.sub(r"([\\.,])([^0-9])", r" \\1 \\2", line)``;
6. split off ``-`` after a digit: ``re.sub(r"([0-9])(-)", r"\\1 \\2 ", line)``;

then whitespace is normalised. Rules 3-6 are sacreBLEU's ``TokenizerRegexp``, which the ``zh``
tokenizer reuses through :func:`mteval_punctuation`.

Rules 3-5 are written here without regular expressions because they dominate the cost of
BLEU: rule 3 replaces only the characters that occur in the line, and rules 4-5 visit only the
positions of ``.`` and ``,`` while keeping the left-to-right, non-overlapping match semantics
of ``re.sub`` (a character consumed by one match cannot start or end the next one). The
readable regular expressions are kept in ``_REFERENCE_RULES``; the tests check both paths
against each other and against sacreBLEU.
"""

from __future__ import annotations

import re
from functools import lru_cache

_REFERENCE_RULES = (
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),
)

# Rule 3's character class, less the space: padding a space with spaces changes nothing once
# whitespace is normalised, and rules 4-6 treat one space and three spaces alike.
_SYMBOLS = frozenset(
    chr(c)
    for lo, hi in (
        (0x7B, 0x7E),
        (0x5B, 0x60),
        (0x21, 0x26),
        (0x28, 0x2B),
        (0x3A, 0x40),
        (0x2F, 0x2F),
    )
    for c in range(lo, hi + 1)
)
_PERIOD_COMMA = re.compile(r"[.,]")
_DIGIT_DASH = re.compile(r"([0-9])(-)")
_DIGITS = frozenset("0123456789")


def _split_symbols(line: str) -> str:
    for ch in _SYMBOLS.intersection(line):
        line = line.replace(ch, f" {ch} ")
    return line


def _split_after_non_digit(line: str) -> str:
    # == re.sub(r"([^0-9])([\.,])", r"\1 \2 ", line)
    out, last, prev = [], 0, -1  # prev: position of the [.,] the previous match consumed
    for m in _PERIOD_COMMA.finditer(line):
        j = m.start()
        if j and j - 1 != prev and line[j - 1] not in _DIGITS:
            out.append(line[last:j])
            out.append(f" {line[j]} ")
            last, prev = j + 1, j
    if not out:
        return line
    out.append(line[last:])
    return "".join(out)


def _split_before_non_digit(line: str) -> str:
    # == re.sub(r"([\.,])([^0-9])", r" \1 \2", line)
    out, last, consumed, n = [], 0, -1, len(line)
    for m in _PERIOD_COMMA.finditer(line):
        i = m.start()
        if i != consumed and i + 1 < n and line[i + 1] not in _DIGITS:
            out.append(line[last:i])
            out.append(f" {line[i]} {line[i + 1]}")
            last = i + 2
            consumed = i + 1
    if not out:
        return line
    out.append(line[last:])
    return "".join(out)


def mteval_punctuation(line: str) -> str:
    """Apply rules 3-6 of ``13a`` (sacreBLEU's ``TokenizerRegexp``) and normalise whitespace.

    Args:
        line: One segment, already through rules 1-2 (``13a``) or CJK splitting (``zh``).

    Returns:
        The tokens joined by single spaces.
    """
    line = _split_symbols(line)
    if "." in line or "," in line:
        line = _split_before_non_digit(_split_after_non_digit(line))
    if "-" in line:
        line = _DIGIT_DASH.sub(r"\1 \2 ", line)
    return " ".join(line.split())


def mteval_punctuation_reference(line: str) -> str:
    """Rules 3-6 with sacreBLEU's regular expressions: the readable path, for tests."""
    for pattern, repl in _REFERENCE_RULES:
        line = pattern.sub(repl, line)
    return " ".join(line.split())


@lru_cache(maxsize=2**16)
def tokenize_13a(line: str) -> str:
    """Tokenize ``line`` as mteval-v13a.pl does.

    Args:
        line: One segment.

    Returns:
        The tokens of ``line`` joined by single spaces.
    """
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        line = line.replace("&quot;", '"').replace("&amp;", "&")
        line = line.replace("&lt;", "<").replace("&gt;", ">")
    return mteval_punctuation(f" {line} ")
