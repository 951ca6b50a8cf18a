"""attnkit.training.task: the data-order record a task saves with each checkpoint, and the
warning when a resumed run can no longer follow it."""

from __future__ import annotations

import logging

from attnkit.training.task import DataPosition, order_state, warn_if_order_changed


def test_order_state_records_seed_position_and_sharding():
    position = DataPosition(epoch=3, batch=7, batches_per_epoch=10)
    assert order_state("windows", 5, 2, position) == {
        "windows": {"seed": 5, "epoch": 3, "batch": 7, "num_shards": 2}
    }
    # translation's sampler names the batch count as its sampler takes it
    assert order_state("sampler", 0, 1, position, batch_key="skip_batches")["sampler"] == {
        "seed": 0,
        "epoch": 3,
        "skip_batches": 7,
        "num_shards": 1,
    }


def test_a_changed_seed_or_sharding_warns_and_the_same_order_does_not(caplog):
    saved = order_state("windows", 5, 2, DataPosition(1, 0, 4))
    with caplog.at_level(logging.WARNING, logger="attnkit.training.task"):
        warn_if_order_changed(saved, "windows", 5, 2, "the windows")
    assert caplog.records == []
    for seed, shards in [(6, 2), (5, 1)]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="attnkit.training.task"):
            warn_if_order_changed(saved, "windows", seed, shards, "the windows")
        assert [r.getMessage() for r in caplog.records] == [
            "data sharding or seed changed since the checkpoint (the windows): the data order differs"
        ]
