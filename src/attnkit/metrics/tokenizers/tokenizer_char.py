"""The ``char`` tokenizer: every character is a token (for languages without spaces)."""

from functools import lru_cache


@lru_cache(maxsize=2**16)
def tokenize_char(line: str) -> str:
    """Put a space between every two characters of ``line``.

    Whitespace characters stay in the string and vanish when BLEU splits it, as in sacreBLEU.

    Args:
        line: One segment.

    Returns:
        The characters of ``line`` joined by single spaces.
    """
    return " ".join(line)
