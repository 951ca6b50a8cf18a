"""Work that is not batched (generations, attention captures), run off the event loop.

A :class:`JobPool` runs jobs in a few threads and admits at most ``max_jobs`` running or
waiting; one more is refused with :class:`~attnkit.serve.batcher.QueueFull` (503). A
:class:`StreamJob` runs an iterator in the pool and hands its items to the event loop as they
come; :meth:`StreamJob.cancel` (the client went away) makes the thread stop at the next item
and close the iterator, so a generation stops within one token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from attnkit.serve.batcher import QueueFull

logger = logging.getLogger(__name__)

__all__ = ["JobPool", "StreamJob"]


class JobPool:
    """Threads for jobs, with admission control.

    Args:
        workers: jobs that run at once.
        max_jobs: jobs admitted (running or waiting) at once; >= workers makes sense.
        on_change: called with the number of admitted jobs whenever it changes (a gauge).
    """

    def __init__(
        self, workers: int, max_jobs: int, on_change: Callable[[int], None] | None = None
    ) -> None:
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="attnkit-job")
        self.max_jobs = max_jobs
        self._admitted = 0
        self._lock = threading.Lock()
        self._on_change = on_change

    @property
    def admitted(self) -> int:
        return self._admitted

    def _change(self, delta: int) -> None:
        with self._lock:
            if delta > 0 and self._admitted + delta > self.max_jobs:
                raise QueueFull(
                    f"{self._admitted} jobs are running or waiting (limit {self.max_jobs})"
                )
            self._admitted += delta
            count = self._admitted
        if self._on_change is not None:
            self._on_change(count)

    def submit(self, fn: Callable[..., Any], *args) -> Future:
        """Run ``fn(*args)`` in a worker thread.

        Raises:
            QueueFull: if ``max_jobs`` jobs are admitted already.
        """
        self._change(+1)
        try:
            future = self._executor.submit(fn, *args)
        except BaseException:
            self._change(-1)
            raise
        future.add_done_callback(lambda _: self._change(-1))
        return future

    def shutdown(self) -> None:
        """Wait for the admitted jobs, then end the threads."""
        self._executor.shutdown(wait=True, cancel_futures=False)


class StreamJob:
    """Items of ``make_iterator()`` (called in a pool thread), as an async iterator.

    Must be made inside a running event loop. ``produced`` counts the items taken from the
    iterator; ``cancelled`` tells whether :meth:`cancel` stopped it.
    """

    def __init__(self, pool: JobPool, make_iterator: Callable[[], Iterator]) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._cancel = threading.Event()
        self.produced = 0
        self.future = pool.submit(self._run, make_iterator)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Stop the iterator at its next item (thread-safe, idempotent)."""
        self._cancel.set()

    def _put(self, kind: str, value: Any = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._cancel.set()

    def _run(self, make_iterator: Callable[[], Iterator]) -> None:
        iterator = None
        try:
            if self._cancel.is_set():
                return
            iterator = make_iterator()
            for item in iterator:
                self.produced += 1
                if self._cancel.is_set():
                    return
                self._put("item", item)
            self._put("done")
        except BaseException as err:  # handed to the awaiting request
            self._put("error", err)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    async def items(self) -> AsyncIterator:
        """The iterator's items as they come; its exception is raised here."""
        while True:
            kind, value = await self._queue.get()
            if kind == "item":
                yield value
            elif kind == "done":
                return
            else:
                raise value
