"""Tests for attnkit.data.batching: token budgets, coverage, determinism, shards, resume."""

import logging

import numpy as np
import pytest
from torch.utils.data import DataLoader

from attnkit.data.batching import TokenBatchSampler
from attnkit.data.collate import Batch, Collator

MAX_TOKENS = 200
MAX_LEN = 40


def random_pairs(n=600, longest=60, seed=0):
    """Pairs of independent random lengths 0..longest (some exceed MAX_LEN)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, longest, size=(n, 2), endpoint=True)
    return [([5] * int(s), [6] * int(t)) for s, t in lengths]


@pytest.fixture(scope="module")
def pairs():
    return random_pairs()


def cost(pair):
    """Independent restatement of the budget: eos on src, bos/eos on tgt_in/tgt_out."""
    src, tgt = pair
    return max(len(src) + 1, len(tgt) + 1)


def kept_indices(pairs, max_len=MAX_LEN):
    return [i for i, p in enumerate(pairs) if cost(p) <= max_len]


def make(pairs, **kwargs):
    args = {"max_tokens": MAX_TOKENS, "max_len": MAX_LEN, "seed": 3} | kwargs
    return TokenBatchSampler(pairs, **args)


def epoch(sampler, number, skip=0):
    sampler.set_epoch(number, skip_batches=skip)
    return list(sampler)


def test_batches_within_budget(pairs):
    for batch in epoch(make(pairs), 0):
        assert len(batch) * max(cost(pairs[i]) for i in batch) <= MAX_TOKENS


def test_every_kept_pair_exactly_once_per_epoch(pairs):
    sampler = make(pairs)
    for number in range(3):
        flat = [i for batch in epoch(sampler, number) for i in batch]
        assert sorted(flat) == kept_indices(pairs)


def test_long_pairs_skipped_and_counted(pairs, caplog):
    expected = [i for i, p in enumerate(pairs) if cost(p) > MAX_LEN]
    assert expected, "fixture must contain long pairs"
    with caplog.at_level(logging.WARNING, logger="attnkit.data.batching"):
        sampler = make(pairs)
    assert sampler.num_skipped == len(expected)
    assert sampler.skipped_indices == expected
    assert sampler.num_pairs == len(pairs) - len(expected)
    assert f"skipped {len(expected)} of {len(pairs)} pairs" in caplog.text


def test_boundary_length_is_kept():
    # cost = max(len) + 1: 39 ids -> 40 positions, kept at max_len=40; 40 ids are skipped.
    sampler = make([([1] * 39, [1]), ([1], [1] * 40)])
    assert sampler.skipped_indices == [1]


def test_length_bucketing_keeps_padding_low(pairs):
    sampler = make(pairs, max_tokens=400)
    padded = real = 0
    for batch in epoch(sampler, 0):
        padded += len(batch) * max(cost(pairs[i]) for i in batch)
        real += sum(cost(pairs[i]) for i in batch)
    assert padded / real < 1.15


def test_same_seed_and_epoch_same_order_across_instances(pairs):
    first = epoch(make(pairs), 4)
    resumed = make(pairs)  # a fresh process after a restart
    assert epoch(resumed, 4) == first
    assert epoch(resumed, 4) == first  # iterating twice does not advance anything


def test_different_epoch_or_seed_gives_different_order(pairs):
    sampler = make(pairs)
    assert epoch(sampler, 0) != epoch(sampler, 1)
    assert epoch(make(pairs, seed=4), 0) != epoch(make(pairs, seed=3), 0)


def test_batch_count_constant_across_epochs(pairs):
    sampler = make(pairs)
    counts = {len(epoch(sampler, n)) for n in range(5)}
    assert counts == {len(sampler)}


def test_skip_first_batches_equals_slicing(pairs):
    sampler = make(pairs)
    full = epoch(sampler, 2)
    assert epoch(sampler, 2, skip=5) == full[5:]
    assert len(sampler) == len(full) - 5
    assert epoch(sampler, 2, skip=len(full)) == []
    # The skip applies to one epoch only.
    assert epoch(sampler, 3) == epoch(make(pairs), 3)


@pytest.mark.parametrize("num_shards", [2, 3, 7])
def test_shards_disjoint_equal_and_covering_with_drop_last(pairs, num_shards):
    full = epoch(make(pairs), 1)
    shards = [
        epoch(make(pairs, num_shards=num_shards, shard_index=r, drop_last=True), 1)
        for r in range(num_shards)
    ]
    assert {len(s) for s in shards} == {len(full) // num_shards}
    seen = [tuple(b) for s in shards for b in s]
    assert len(set(seen)) == len(seen), "a batch went to two shards"
    assert set(seen) <= {tuple(b) for b in full}
    assert len(full) - len(seen) < num_shards


@pytest.mark.parametrize("num_shards", [2, 3, 7])
def test_shards_padded_equal_and_covering_without_drop_last(pairs, num_shards):
    full = epoch(make(pairs), 1)
    shards = [
        epoch(make(pairs, num_shards=num_shards, shard_index=r), 1) for r in range(num_shards)
    ]
    expected = -(-len(full) // num_shards)
    assert all(len(s) == expected for s in shards)
    seen = [tuple(b) for s in shards for b in s]
    assert set(seen) == {tuple(b) for b in full}
    assert len(seen) - len(set(seen)) == expected * num_shards - len(full)


def test_shard_resume_skips_within_its_own_share(pairs):
    shard = make(pairs, num_shards=2, shard_index=1)
    assert epoch(shard, 0, skip=3) == epoch(make(pairs, num_shards=2, shard_index=1), 0)[3:]


def test_no_shuffle_is_ascending_and_stable(pairs):
    sampler = make(pairs, shuffle=False)
    first = epoch(sampler, 0)
    assert first == epoch(sampler, 9)
    flat = [i for batch in first for i in batch]
    keys = [(cost(pairs[i]), i) for i in flat]
    assert keys == sorted(keys)


def test_dataloader_integration(pairs):
    sampler = make(pairs)
    loader = DataLoader(
        pairs, batch_sampler=sampler, collate_fn=Collator(pad_id=0, bos_id=1, eos_id=2)
    )
    batches = list(loader)
    assert len(batches) == len(sampler)
    assert all(isinstance(b, Batch) and b.src.numel() <= MAX_TOKENS for b in batches)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"max_tokens": 30}, "max_tokens=30 must be >= max_len=40"),
        ({"max_len": 0}, "max_len=0"),
        ({"seed": -1}, "seed=-1"),
        ({"num_shards": 0}, "num_shards=0"),
        ({"num_shards": 2, "shard_index": 2}, "shard_index=2 must be < num_shards=2"),
        ({"num_shards": 10**6, "drop_last": True}, "only .* batches"),
        ({"max_len": 1}, "none of the 600 pairs fits max_len=1"),
    ],
)
def test_bad_arguments(pairs, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        make(pairs, **kwargs)


def test_bad_set_epoch(pairs):
    sampler = make(pairs)
    with pytest.raises(ValueError, match="epoch=-1"):
        sampler.set_epoch(-1)
    with pytest.raises(ValueError, match=f"skip_batches={sampler.batches_per_shard + 1}"):
        sampler.set_epoch(0, skip_batches=sampler.batches_per_shard + 1)


def test_numpy_integers_accepted(pairs):
    assert epoch(make(pairs, seed=np.int64(3), max_tokens=np.int32(MAX_TOKENS)), 1) == epoch(
        make(pairs), 1
    )
