"""Tests for attnkit.data.synthetic: the copy task."""

import pytest

from attnkit.data.synthetic import copy_task_ids, copy_task_pairs, pseudo_word


def test_pseudo_word_is_base_26():
    expected = {0: "a", 1: "b", 25: "z", 26: "ba", 27: "bb", 26 * 26: "baa"}
    assert {i: pseudo_word(i) for i in expected} == expected
    assert len({pseudo_word(i) for i in range(2000)}) == 2000
    with pytest.raises(ValueError, match="token_id=-1"):
        pseudo_word(-1)


def test_copy_task_ids_is_seeded_copy_in_range():
    pairs = copy_task_ids(200, vocab_size=30, min_len=3, max_len=9, seed=5)
    assert pairs == copy_task_ids(200, vocab_size=30, min_len=3, max_len=9, seed=5)
    assert pairs != copy_task_ids(200, vocab_size=30, min_len=3, max_len=9, seed=6)
    assert all(src == tgt and src is not tgt for src, tgt in pairs)
    lengths = {len(src) for src, _ in pairs}
    assert min(lengths) == 3 and max(lengths) == 9
    assert {i for src, _ in pairs for i in src} == set(range(4, 30))


def test_copy_task_pairs_are_words_of_the_same_sequences():
    texts = copy_task_pairs(50, vocab_size=100, min_len=2, max_len=6, seed=1)
    ids = copy_task_ids(50, vocab_size=100, min_len=2, max_len=6, seed=1, first_id=0)
    assert texts == [(" ".join(map(pseudo_word, s)),) * 2 for s, _ in ids]
    assert all(2 <= len(src.split(" ")) <= 6 for src, _ in texts)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"n": -1}, "n=-1"),
        ({"seed": -2}, "seed=-2"),
        ({"vocab_size": 4}, "vocab_size=4"),
        ({"min_len": 0}, "min_len=0"),
        ({"min_len": 5, "max_len": 4}, "min_len=5, max_len=4"),
    ],
)
def test_copy_task_ids_rejects_bad_arguments(kwargs, pattern):
    args = {"n": 3, "vocab_size": 10, "min_len": 1, "max_len": 4, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=pattern):
        copy_task_ids(**args)
