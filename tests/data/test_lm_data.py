"""Language-model data: windows at seeded offsets (a pure function of seed, rank and position)
and validation windows that score every token once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnkit.data.lm import LMBatch, RandomWindows, eval_batches, eval_windows

IDS = torch.arange(1000) % 97  # a text of 1,000 ids


def windows(**kwargs) -> RandomWindows:
    return RandomWindows(IDS, **{"context": 8, "batch_size": 4, "seed": 5, **kwargs})


def test_a_batch_is_windows_of_context_plus_one_consecutive_ids():
    w = windows()
    batch = w.batch(2, 7)
    offsets = w.offsets(2, 7)
    assert batch.ids.shape == (4, 9) and batch.ids.dtype == torch.long
    for row, start in zip(batch.ids, offsets.tolist(), strict=True):
        assert 0 <= start <= len(IDS) - 9
        assert torch.equal(row, IDS[start : start + 9])
    assert torch.equal(batch.inputs, batch.ids[:, :-1]) and torch.equal(
        batch.targets, batch.ids[:, 1:]
    )
    assert batch.num_tokens == 32


def test_offsets_are_a_pure_function_of_seed_epoch_and_global_batch():
    """numpy's own seeding of [seed, epoch, global batch], whatever was drawn before; rank 1
    of 2 takes global batches 1, 3, 5, ..."""
    torch.manual_seed(0)
    np.random.seed(0)
    a = windows(num_shards=2, shard_index=1).offsets(3, 11)
    torch.rand(5), np.random.rand(5)  # global streams move; the offsets must not
    b = windows(num_shards=2, shard_index=1).offsets(3, 11)
    expected = np.random.default_rng([5, 3, 2 * 11 + 1]).integers(0, 1000 - 8, size=4)
    assert a.tolist() == b.tolist() == expected.tolist()
    assert windows(num_shards=2, shard_index=0).offsets(3, 11).tolist() != a.tolist()
    assert windows(seed=6, num_shards=2, shard_index=1).offsets(3, 11).tolist() != a.tolist()
    assert windows(num_shards=2, shard_index=1).offsets(3, 12).tolist() != a.tolist()


def test_offsets_reach_both_ends_of_the_text():
    w = RandomWindows(torch.arange(12), context=8, batch_size=64, seed=0)
    starts = torch.cat([w.offsets(0, b) for b in range(5)])
    assert set(starts.tolist()) == {0, 1, 2, 3}  # the last window is ids 3..11


def test_ranks_deal_one_sequence_of_batches():
    """R ranks take exactly the batches one process takes, in turn."""
    one = windows()
    two = [windows(num_shards=2, shard_index=r) for r in range(2)]
    for b in range(3):
        for r in range(2):
            assert torch.equal(two[r].batch(1, b).ids, one.batch(1, 2 * b + r).ids)


def test_an_epoch_is_about_the_text_once_over_all_ranks():
    assert windows().batches_per_epoch == 1000 // 32
    assert windows(num_shards=2).batches_per_epoch == 1000 // 64
    assert RandomWindows(torch.arange(10), context=8, batch_size=4).batches_per_epoch == 1


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"context": 0}, r"context: expected a positive integer"),
        ({"batch_size": 0}, r"batch_size: expected a positive integer"),
        ({"context": 1000}, r"1000 tokens, fewer than one window of context \+ 1 = 1001"),
        ({"shard_index": 2, "num_shards": 2}, r"shard_index"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        windows(**kwargs)
    with pytest.raises(ValueError, match=r"1-D sequence of integer ids"):
        RandomWindows(torch.zeros(3, 3), context=1, batch_size=1)


@pytest.mark.parametrize("n,context", [(1, 4), (4, 4), (5, 4), (23, 4), (24, 8), (7, 1)])
@pytest.mark.parametrize("bos", [None, 99])
def test_validation_windows_predict_every_token_once(n, context, bos):
    ids = torch.arange(n) + 10
    found = eval_windows(ids, context, bos)
    sequence = ids if bos is None else torch.cat([torch.tensor([bos]), ids])
    targets = torch.cat([w[1:] for w in found]) if found else torch.zeros(0, dtype=torch.long)
    assert torch.equal(targets, sequence[1:])  # each id after the first, once, in order
    for w in found:
        assert 2 <= len(w) <= context + 1
    starts = [int(w[0]) for w in found]
    assert starts == sequence[: len(sequence) - 1 : context].tolist()  # non-overlapping


def test_validation_batches_stack_the_full_windows():
    batches = eval_batches(torch.arange(23), 4, batch_size=2, bos=0)  # 24 ids: 5 full + 3
    assert [tuple(b.ids.shape) for b in batches] == [(2, 5), (2, 5), (1, 5), (1, 4)]
    assert sum(b.num_tokens for b in batches) == 23
    assert isinstance(batches[0].to("cpu"), LMBatch)
