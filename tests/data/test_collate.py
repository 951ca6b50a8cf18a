"""Tests for attnkit.data.collate: padded teacher-forcing tensors."""

import pytest
import torch

from attnkit.data.batching import TokenBatchSampler
from attnkit.data.collate import Collator, iter_batches

COLLATE = Collator(pad_id=0, bos_id=1, eos_id=2)  # ids that matter only by hand-checked layout


def test_layout_and_padding_by_hand():
    batch = COLLATE([([7, 8, 9], [5]), ([6], [4, 4, 4])])
    torch.testing.assert_close(batch.src, torch.tensor([[7, 8, 9, 2], [6, 2, 0, 0]]))
    torch.testing.assert_close(batch.tgt_in, torch.tensor([[1, 5, 0, 0], [1, 4, 4, 4]]))
    torch.testing.assert_close(batch.tgt_out, torch.tensor([[5, 2, 0, 0], [4, 4, 4, 2]]))
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    assert batch.num_src_tokens == 6 and batch.num_tgt_tokens == 6
    assert batch.size == 2
    assert batch.indices is None


def test_other_special_ids_and_empty_sequences():
    batch = Collator(pad_id=9, bos_id=7, eos_id=8)([([], []), ([3], [3])], indices=[4, 2])
    torch.testing.assert_close(batch.src, torch.tensor([[8, 9], [3, 8]]))
    torch.testing.assert_close(batch.tgt_in, torch.tensor([[7, 9], [7, 3]]))
    torch.testing.assert_close(batch.tgt_out, torch.tensor([[8, 9], [3, 8]]))
    assert batch.num_tgt_tokens == 3
    torch.testing.assert_close(batch.indices, torch.tensor([4, 2]))


def test_for_tokenizer_reads_ids(small_tokenizer):
    assert Collator.for_tokenizer(small_tokenizer) == Collator(pad_id=0, bos_id=1, eos_id=2)


def test_special_ids_are_required_keywords():
    """No default ids: a collator without its tokenizer's ids cannot be built."""
    with pytest.raises(TypeError, match="pad_id"):
        Collator()
    with pytest.raises(TypeError):
        Collator(0, 1, 2)
    for name, bad in (("pad_id", -1), ("bos_id", 1.0), ("eos_id", True)):
        ids = {"pad_id": 0, "bos_id": 1, "eos_id": 2, name: bad}
        with pytest.raises(ValueError, match=rf"{name}: expected an id >= 0, got {bad!r}"):
            Collator(**ids)


def test_to_moves_every_tensor():
    batch = COLLATE([([4, 5], [6])], indices=[0])
    moved = batch.to("meta")
    for name in ("src", "tgt_in", "tgt_out", "indices"):
        assert getattr(moved, name).device.type == "meta"
        assert getattr(batch, name).device.type == "cpu"
    assert moved.num_tgt_tokens == batch.num_tgt_tokens


def test_iter_batches_restores_corpus_order():
    pairs = [([4] * n, [5] * (n % 7)) for n in range(50)]
    sampler = TokenBatchSampler(pairs, max_tokens=64, max_len=60, seed=1)
    rows = {}
    for batch in iter_batches(pairs, sampler, COLLATE):
        for row, index in enumerate(batch.indices.tolist()):
            rows[index] = int((batch.src[row] == 4).sum())
    assert rows == {i: i for i in range(50)}


def test_bad_input():
    with pytest.raises(ValueError, match="pairs is empty"):
        COLLATE([])
    with pytest.raises(ValueError, match="indices has 2 entries but pairs has 1"):
        COLLATE([([4], [4])], indices=[0, 1])
