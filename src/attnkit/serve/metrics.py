"""Prometheus metrics of one server (``GET /metrics``), in a registry of its own.

Each app gets its own :class:`~prometheus_client.CollectorRegistry`, so several apps in one
process (tests) do not share counters. Endpoints are labelled by route template, never by the
raw path, so the number of series stays bounded.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKEN_BUCKETS = (16, 64, 256, 512, 1000, 2000, 4000, 8000, 16000)


class Metrics:
    """The server's counters, gauges and histograms (names start with ``attnkit_``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "attnkit_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.latency = Histogram(
            "attnkit_request_seconds",
            "time from request to the end of the answer",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("attnkit_in_flight_requests", "requests being answered", registry=r)
        self.queue_depth = Gauge(
            "attnkit_queue_depth", "inputs waiting for a model batch", ["model"], registry=r
        )
        self.jobs = Gauge(
            "attnkit_jobs", "generations and attention captures running or waiting", registry=r
        )
        self.batch_size = Histogram(
            "attnkit_batch_size", "inputs per model batch", ["model"], buckets=_SIZE_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.batch_tokens = Histogram(
            "attnkit_batch_tokens", "tokens per model batch", ["model"], buckets=_TOKEN_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.batch_seconds = Histogram(
            "attnkit_batch_seconds", "model time per batch", ["model"], buckets=_LATENCY_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.rejected = Counter(
            "attnkit_rejected", "requests refused with 503 (queue full)", ["model"], registry=r
        )
        self.generated_pieces = Counter(
            "attnkit_generated_pieces", "text pieces streamed by /v1/generate", registry=r
        )
        self.cancelled = Counter(
            "attnkit_cancelled", "requests whose client went away before the answer", registry=r
        )

    def batch(self, model: str, inputs: int, tokens: int, seconds: float) -> None:
        """Record one model batch."""
        self.batch_size.labels(model).observe(inputs)
        self.batch_tokens.labels(model).observe(tokens)
        self.batch_seconds.labels(model).observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)
