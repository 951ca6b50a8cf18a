"""attnkit.serve.jobs: admission control, items handed to the event loop, cancellation."""

import asyncio
import threading

import pytest

from attnkit.serve.batcher import QueueFull
from attnkit.serve.jobs import JobPool, StreamJob
from tests.helpers.serve import DEADLINE


def test_pool_admits_at_most_max_jobs_and_frees_them():
    counts = []
    pool = JobPool(workers=1, max_jobs=2, on_change=counts.append)
    gate = threading.Event()
    running = [pool.submit(gate.wait, DEADLINE), pool.submit(lambda: "second")]
    with pytest.raises(QueueFull, match="2 jobs are running or waiting"):
        pool.submit(lambda: "third")
    gate.set()
    assert running[1].result(DEADLINE) == "second"
    assert running[0].result(DEADLINE) is True
    pool.submit(lambda: None).result(DEADLINE)
    pool.shutdown()
    assert pool.admitted == 0 and max(counts) == 2 and counts[-1] == 0


class Counting:
    """An iterator of 0..n-1 that records how far it got and whether it was closed."""

    def __init__(self, n: int, after_first: threading.Event | None = None) -> None:
        self.n, self.taken, self.closed = n, 0, False
        self.after_first = after_first

    def __iter__(self):
        try:
            for i in range(self.n):
                self.taken += 1
                yield i
                if i == 0 and self.after_first is not None:
                    assert self.after_first.wait(DEADLINE)
        finally:
            self.closed = True


def test_stream_job_yields_every_item_in_order():
    pool = JobPool(workers=1, max_jobs=1)
    source = Counting(50)

    async def main():
        job = StreamJob(pool, lambda: iter(source))
        return [x async for x in job.items()], job

    items, job = asyncio.run(main())
    pool.shutdown()
    assert items == list(range(50)) and job.produced == 50 and source.closed


def test_cancel_stops_the_iterator_at_its_next_item():
    pool = JobPool(workers=1, max_jobs=1)
    go_on = threading.Event()
    source = Counting(1000, after_first=go_on)

    async def main():
        job = StreamJob(pool, lambda: iter(source))
        first = await anext(job.items())
        job.cancel()
        go_on.set()
        await asyncio.wrap_future(job.future)
        return first, job

    first, job = asyncio.run(main())
    pool.shutdown()
    assert first == 0 and job.cancelled
    assert source.closed and source.taken == 2 and job.produced == 2  # not 1000


def test_errors_reach_the_consumer():
    pool = JobPool(workers=1, max_jobs=1)

    def broken():
        yield "a"
        raise ValueError("the model broke")

    async def main():
        job = StreamJob(pool, broken)
        seen = []
        with pytest.raises(ValueError, match="the model broke"):
            async for x in job.items():
                seen.append(x)
        return seen

    assert asyncio.run(main()) == ["a"]
    pool.shutdown()
