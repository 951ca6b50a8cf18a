"""Dynamic batching: requests that arrive together run as one model batch, off the event loop.

A request is :meth:`DynamicBatcher.submit`-ted as one item: its inputs (a list), its cost in
tokens and a key (e.g. the beam size; only items with equal keys share a batch). One worker
thread takes the oldest item and waits up to ``max_wait_ms`` for more of the same key, until
their cost reaches ``max_batch_cost`` (the first item always goes, whatever its cost); then it
runs ``run_batch`` on the concatenated inputs and hands each item exactly its own slice of the
outputs, in order. A batch of one key leaves the items of other keys in the queue, in order.

Bounds and shutdown. Items that would take the queue past ``max_queue`` inputs are refused
with :class:`QueueFull` (the server answers 503 with Retry-After) instead of growing the queue.
An item cancelled before its batch starts (its client went away) is skipped. :meth:`drain`
stops the waiting for companions (a server that is shutting down gets no new requests), and
:meth:`stop` runs what is queued, then ends the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["DynamicBatcher", "QueueFull"]


class QueueFull(Exception):
    """The queue holds ``max_queue`` inputs already; try again later."""


@dataclass
class _Item:
    inputs: list
    cost: int
    key: Hashable
    future: Future = field(default_factory=Future)
    queued_at: float = field(default_factory=time.monotonic)


class DynamicBatcher:
    """Gathers concurrent items into batches for ``run_batch`` (module docstring).

    Args:
        run_batch: ``(inputs, key) -> outputs``, one output per input, in order; called in the
            worker thread.
        max_batch_cost: the cost (tokens) a batch may reach; >= 1.
        max_wait_ms: how long the oldest item waits for others, >= 0 (0: no waiting).
        max_queue: inputs allowed to wait; >= 1.
        on_batch: called after every batch with ``(inputs, cost, seconds)``, for metrics,
            before its requests are answered (an error in it is logged).
        name: the worker thread's name.
    """

    def __init__(
        self,
        run_batch: Callable[[list, Hashable], Sequence],
        *,
        max_batch_cost: int,
        max_wait_ms: float,
        max_queue: int,
        on_batch: Callable[[int, int, float], None] | None = None,
        name: str = "batcher",
    ) -> None:
        if max_batch_cost < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError(
                f"max_batch_cost={max_batch_cost}, max_queue={max_queue}, "
                f"max_wait_ms={max_wait_ms}: expected >= 1, >= 1 and >= 0"
            )
        self.run_batch = run_batch
        self.max_batch_cost = max_batch_cost
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self.on_batch = on_batch
        self._queue: deque[_Item] = deque()
        self._queued_inputs = 0
        self._lock = threading.Condition()
        self._draining = False
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Inputs waiting for a batch."""
        return self._queued_inputs

    def submit(self, inputs: Sequence[Any], cost: int, key: Hashable = None) -> Future:
        """Queue one request's ``inputs``; the future gets its outputs (a list, same order).

        Raises:
            QueueFull: if the queue would hold more than ``max_queue`` inputs.
            RuntimeError: after :meth:`stop`.
        """
        item = _Item(list(inputs), int(cost), key)
        if not item.inputs:
            item.future.set_result([])
            return item.future
        with self._lock:
            if self._stopping:
                raise RuntimeError("the batcher is stopped")
            if self._queued_inputs + len(item.inputs) > self.max_queue:
                raise QueueFull(
                    f"{self._queued_inputs} inputs are waiting; the queue holds {self.max_queue}"
                )
            self._queue.append(item)
            self._queued_inputs += len(item.inputs)
            self._lock.notify_all()
        return item.future

    def drain(self) -> None:
        """Run queued items at once from now on, without waiting for companions."""
        with self._lock:
            self._draining = True
            self._lock.notify_all()

    def stop(self, timeout: float | None = None) -> None:
        """Run what is queued, then end the worker thread."""
        with self._lock:
            self._draining = self._stopping = True
            self._lock.notify_all()
        self._thread.join(timeout)

    # ------------------------------------------------------------------ worker

    def _gather(self) -> tuple[list[_Item], bool]:
        """The items of the next batch (same key as the oldest, in order, within the cost
        budget) and whether the batch is complete (full, or something is left waiting)."""
        first = self._queue[0]
        batch, cost = [first], first.cost
        for item in list(self._queue)[1:]:
            if item.key != first.key:
                continue
            if cost + item.cost > self.max_batch_cost:
                return batch, True
            batch.append(item)
            cost += item.cost
        return batch, cost >= self.max_batch_cost

    def _next_batch(self) -> list[_Item] | None:
        with self._lock:
            while True:
                while not self._queue and not self._stopping:
                    self._lock.wait()
                if not self._queue:
                    return None  # stopping, nothing left
                batch, full = self._gather()
                remaining = self._queue[0].queued_at + self.max_wait - time.monotonic()
                if full or self._draining or remaining <= 0:
                    break
                self._lock.wait(remaining)
            for item in batch:
                self._queue.remove(item)
                self._queued_inputs -= len(item.inputs)
            return batch

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            live = [item for item in batch if item.future.set_running_or_notify_cancel()]
            if not live:
                continue
            inputs = [x for item in live for x in item.inputs]
            start = time.perf_counter()
            try:
                outputs = list(self.run_batch(inputs, live[0].key))
                if len(outputs) != len(inputs):
                    raise RuntimeError(
                        f"run_batch returned {len(outputs)} outputs for {len(inputs)} inputs"
                    )
            except BaseException as err:  # every waiting request gets the error, not a hang
                logger.exception("batch of %d inputs failed", len(inputs))
                for item in live:
                    item.future.set_exception(err)
                continue
            seconds = time.perf_counter() - start
            # Recorded before any request is answered: a client that reads the metrics after
            # its answer sees its batch (recorded after, the last batch raced the reader).
            if self.on_batch is not None:
                try:
                    self.on_batch(len(inputs), sum(item.cost for item in live), seconds)
                except Exception:  # metrics must not keep the answers from the requests
                    logger.exception("on_batch failed")
            at = 0
            for item in live:
                item.future.set_result(outputs[at : at + len(item.inputs)])
                at += len(item.inputs)
