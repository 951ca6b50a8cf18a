"""attnkit.serve.batcher: items gathered into batches, each gets its own outputs, bounds.

The worker is held inside a first batch (an Event) while the next items are queued, so what
gathers into the second batch does not depend on timing.
"""

import threading
from concurrent.futures import CancelledError

import pytest

from attnkit.serve.batcher import DynamicBatcher, QueueFull
from tests.helpers.serve import DEADLINE, wait_until


class Recorder:
    """run_batch that records (key, inputs) and answers f"{key}:{x}"; the first batch waits
    for ``release``."""

    def __init__(self, fail_on=None) -> None:
        self.batches = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.fail_on = fail_on

    def __call__(self, inputs, key):
        self.batches.append((key, list(inputs)))
        if len(self.batches) == 1:
            self.started.set()
            assert self.release.wait(DEADLINE)
        if self.fail_on in inputs:
            raise ValueError(f"bad input {self.fail_on!r}")
        return [f"{key}:{x}" for x in inputs]


def make(recorder, **kwargs):
    settings = {"max_batch_cost": 1000, "max_wait_ms": 0, "max_queue": 100, **kwargs}
    return DynamicBatcher(recorder, **settings)


def hold(batcher, recorder):
    """Occupy the worker with a first batch; returns its future."""
    first = batcher.submit(["hold"], 1, "k")
    assert recorder.started.wait(DEADLINE)
    return first


def test_concurrent_items_share_one_batch_and_get_their_own_outputs():
    rec = Recorder()
    batcher = make(rec)
    first = hold(batcher, rec)
    items = [[f"r{i}-{j}" for j in range(i % 3 + 1)] for i in range(12)]
    futures = [batcher.submit(inputs, len(inputs), "k") for inputs in items]
    assert batcher.depth == sum(len(x) for x in items)
    rec.release.set()
    for inputs, future in zip(items, futures, strict=True):
        assert future.result(DEADLINE) == [f"k:{x}" for x in inputs]
    assert first.result(DEADLINE) == ["k:hold"]
    assert rec.batches[1] == ("k", [x for inputs in items for x in inputs])  # one batch
    assert batcher.depth == 0
    batcher.stop()


def test_keys_are_never_mixed_and_order_is_kept():
    rec = Recorder()
    batcher = make(rec)
    hold(batcher, rec)
    plan = [("a", "1"), ("b", "2"), ("a", "3"), ("b", "4"), ("c", "5"), ("a", "6")]
    futures = [batcher.submit([x], 1, key) for key, x in plan]
    rec.release.set()
    for (key, x), future in zip(plan, futures, strict=True):
        assert future.result(DEADLINE) == [f"{key}:{x}"]
    assert rec.batches[1:] == [("a", ["1", "3", "6"]), ("b", ["2", "4"]), ("c", ["5"])]
    batcher.stop()


def test_cost_budget_splits_batches_and_an_oversized_item_runs_alone():
    rec = Recorder()
    batcher = make(rec, max_batch_cost=10)
    hold(batcher, rec)
    costs = {"x1": 4, "x2": 4, "x3": 4, "big": 25, "x4": 2}
    futures = {x: batcher.submit([x], cost, "k") for x, cost in costs.items()}
    rec.release.set()
    for x, future in futures.items():
        assert future.result(DEADLINE) == [f"k:{x}"]
    # FIFO within the budget: x3 would take the first batch to 12 > 10.
    assert [b for _, b in rec.batches[1:]] == [["x1", "x2"], ["x3"], ["big"], ["x4"]]
    batcher.stop()


def test_full_queue_refuses_instead_of_growing():
    rec = Recorder()
    batcher = make(rec, max_queue=5)
    hold(batcher, rec)
    batcher.submit(["a", "b", "c"], 3, "k")
    with pytest.raises(QueueFull, match="3 inputs are waiting; the queue holds 5"):
        batcher.submit(["d", "e", "f"], 3, "k")
    ok = batcher.submit(["d", "e"], 2, "k")  # exactly full is fine
    rec.release.set()
    assert ok.result(DEADLINE) == ["k:d", "k:e"]
    batcher.stop()


def test_cancelled_item_is_skipped():
    rec = Recorder()
    batcher = make(rec)
    hold(batcher, rec)
    gone = batcher.submit(["gone"], 1, "k")
    kept = batcher.submit(["kept"], 1, "k")
    assert gone.cancel()
    rec.release.set()
    assert kept.result(DEADLINE) == ["k:kept"]
    with pytest.raises(CancelledError):
        gone.result(DEADLINE)
    assert rec.batches[1] == ("k", ["kept"])
    batcher.stop()


def test_a_failing_batch_fails_its_items_and_the_worker_goes_on():
    rec = Recorder(fail_on="bad")
    batcher = make(rec)
    hold(batcher, rec)
    failing = [batcher.submit(["ok1"], 1, "k"), batcher.submit(["bad"], 1, "k")]
    rec.release.set()
    for future in failing:
        with pytest.raises(ValueError, match="bad input 'bad'"):
            future.result(DEADLINE)
    assert batcher.submit(["later"], 1, "k").result(DEADLINE) == ["k:later"]
    batcher.stop()


def test_wrong_number_of_outputs_is_an_error_not_a_mix_up():
    batcher = DynamicBatcher(lambda inputs, key: inputs[:-1], max_batch_cost=9, max_wait_ms=0,
                             max_queue=9)  # fmt: skip
    with pytest.raises(RuntimeError, match="returned 1 outputs for 2 inputs"):
        batcher.submit(["a", "b"], 2).result(DEADLINE)
    batcher.stop()


def test_a_batch_is_recorded_before_its_requests_are_answered():
    """on_batch runs before any future of the batch resolves (a client reading the metrics
    after its answer sees its batch), and an on_batch that raises still lets them resolve."""
    seen = []
    futures = []

    def on_batch(inputs, cost, seconds):
        seen.append((inputs, cost, [f.done() for f in futures]))
        if len(seen) == 2:
            raise RuntimeError("a broken metrics sink")

    batcher = DynamicBatcher(lambda inputs, key: inputs, max_batch_cost=9, max_wait_ms=0,
                             max_queue=9, on_batch=on_batch)  # fmt: skip
    futures.append(batcher.submit(["a", "b"], 2))
    assert futures[0].result(DEADLINE) == ["a", "b"]
    assert seen == [(2, 2, [False])]
    futures.append(batcher.submit(["c"], 1))
    assert futures[1].result(DEADLINE) == ["c"]  # answered although on_batch raised
    assert seen[1] == (1, 1, [True, False])
    batcher.stop()


def test_drain_and_stop_run_what_is_queued_without_waiting():
    rec = Recorder()
    rec.release.set()
    batcher = make(rec, max_wait_ms=3_600_000)  # an hour: only a drain can start the batch
    futures = [batcher.submit([x], 1, "k") for x in "abc"]
    wait_until(lambda: batcher.depth == 3, "the items to queue")
    batcher.drain()
    assert [f.result(DEADLINE) for f in futures] == [["k:a"], ["k:b"], ["k:c"]]
    later = batcher.submit(["d"], 1, "k")  # draining: runs at once as well
    assert later.result(DEADLINE) == ["k:d"]
    batcher.stop(DEADLINE)
    with pytest.raises(RuntimeError, match="stopped"):
        batcher.submit(["e"], 1, "k")


def test_stop_finishes_queued_items():
    rec = Recorder()
    rec.release.set()
    batcher = make(rec, max_wait_ms=3_600_000)
    futures = [batcher.submit([x], 1, "k") for x in "ab"]
    batcher.stop(DEADLINE)
    assert [f.result(0) for f in futures] == [["k:a"], ["k:b"]]


def test_empty_submission_and_bad_settings():
    batcher = make(Recorder())
    assert batcher.submit([], 0).result(0) == []
    batcher.stop()
    with pytest.raises(ValueError, match="max_batch_cost=0"):
        DynamicBatcher(lambda i, k: i, max_batch_cost=0, max_wait_ms=0, max_queue=1)
