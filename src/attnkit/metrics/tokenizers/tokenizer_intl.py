"""The ``intl`` tokenizer: mteval-v14.pl's international tokenization.

Punctuation (Unicode category P) is split off unless it sits between digits, as a thousands
or decimal separator does; symbols (category S) are always split off. Like mteval-v14.pl and
sacreBLEU, a number followed by a final period keeps the period (``"in 2019."`` stays one
token), because the second rule needs a non-digit after the punctuation.
"""

from functools import lru_cache

import regex

# The three rules of mteval-v14.pl, applied in this order; `regex` has the Unicode property
# classes that the standard `re` module lacks.
_RULES = (
    (regex.compile(r"(\P{N})(\p{P})"), r"\1 \2 "),  # punctuation after a non-number
    (regex.compile(r"(\p{P})(\P{N})"), r" \1 \2"),  # punctuation before a non-number
    (regex.compile(r"(\p{S})"), r" \1 "),  # every symbol
)


@lru_cache(maxsize=2**16)
def tokenize_intl(line: str) -> str:
    """Tokenize ``line`` on Unicode punctuation and symbols.

    Args:
        line: One segment.

    Returns:
        The tokens of ``line`` joined by single spaces.
    """
    for pattern, repl in _RULES:
        line = pattern.sub(repl, line)
    return " ".join(line.split())
