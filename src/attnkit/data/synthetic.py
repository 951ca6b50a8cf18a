"""A seedable synthetic copy task (target = source) for training tests.

Two forms of the same data:

* `copy_task_ids`: id pairs for a model trained without a tokenizer; ids are drawn from
  ``[first_id, vocab_size)`` so the special ids 0-3 never occur.
* `copy_task_pairs`: the same sequences as text, each id written as a lowercase
  pseudo-word (`pseudo_word`: 4 -> "e", 26 -> "ba", ...) joined by single spaces, so the
  data goes through the same tokenizer / batching path as a real corpus.

Both are pure functions of their arguments (``numpy.random.default_rng(seed)``).
"""

from __future__ import annotations

import numpy as np

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def pseudo_word(token_id: int) -> str:
    """Spells a non-negative id in base 26 with letters: 0 -> "a", 25 -> "z", 26 -> "ba"."""
    if token_id < 0:
        raise ValueError(f"token_id={token_id} must be >= 0")
    word = ""
    while True:
        token_id, digit = divmod(token_id, 26)
        word = _LETTERS[digit] + word
        if token_id == 0:
            return word


def copy_task_ids(
    n: int, vocab_size: int, min_len: int, max_len: int, seed: int, *, first_id: int = 4
) -> list[tuple[list[int], list[int]]]:
    """Random id sequences paired with a copy of themselves.

    Args:
        n: Number of pairs.
        vocab_size: Ids are drawn uniformly from ``[first_id, vocab_size)``.
        min_len: Shortest sequence, >= 1.
        max_len: Longest sequence (inclusive); lengths are uniform in between.
        seed: Random seed, >= 0.
        first_id: Lowest id drawn; 4 leaves pad/bos/eos/unk out.

    Returns:
        ``n`` pairs ``(ids, ids)`` (two distinct lists with equal content), no bos/eos.

    Raises:
        ValueError: On a negative ``n``/``seed``, an empty id range or a bad length range.
    """
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    if seed < 0:
        raise ValueError(f"seed={seed} must be >= 0")
    if not 0 <= first_id < vocab_size:
        raise ValueError(
            f"vocab_size={vocab_size} must be > first_id={first_id} >= 0, expected a non-empty id range"
        )
    if not 1 <= min_len <= max_len:
        raise ValueError(f"min_len={min_len}, max_len={max_len}: expected 1 <= min_len <= max_len")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len, size=n, endpoint=True)
    pairs = []
    for length in lengths.tolist():
        ids = rng.integers(first_id, vocab_size, size=length).tolist()
        pairs.append((ids, list(ids)))
    return pairs


def copy_task_pairs(
    n: int, vocab_size: int, min_len: int, max_len: int, seed: int
) -> list[tuple[str, str]]:
    """The `copy_task_ids` sequences as text pairs of space-separated pseudo-words.

    ``vocab_size`` is the number of distinct pseudo-words (ids ``0 .. vocab_size - 1``).
    ``min_len``/``max_len`` count words, not subword tokens.
    """
    pairs = copy_task_ids(n, vocab_size, min_len, max_len, seed, first_id=0)
    return [(" ".join(map(pseudo_word, s)), " ".join(map(pseudo_word, t))) for s, t in pairs]
