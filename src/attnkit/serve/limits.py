"""Request limits: body size (an ASGI middleware), texts per request, tokens per text.

Status codes: 413 (Content Too Large) when a request carries more than a limit allows (body
bytes, texts, tokens of one text); 422 for a setting outside its range (``beam``,
``max_new_tokens``); 503 with ``Retry-After`` when the queue is full
(:class:`~attnkit.serve.batcher.QueueFull`). Each message names the field, the value and the
limit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from attnkit.serve.errors import ApiError, error_body

__all__ = ["BodyLimit", "check_count", "check_lengths", "check_range"]


def check_count(field: str, items: Sequence, limit: int) -> None:
    """413 if ``items`` holds more than ``limit`` entries."""
    if len(items) > limit:
        raise ApiError(
            413, f"{field}: {len(items)} items, more than the limit of {limit} per request"
        )


def check_lengths(
    field: str, lengths: Sequence[int], limit: int, *, indexed: bool = True, unit: str = "tokens"
) -> None:
    """413 naming the first entry longer than ``limit`` (``field[i]``, or ``field`` for a
    single text when not ``indexed``)."""
    for i, n in enumerate(lengths):
        if n > limit:
            where = f"{field}[{i}]" if indexed else field
            raise ApiError(
                413, f"{where}: {n} {unit}, more than the limit of {limit} {unit} per text"
            )


def check_range(field: str, value: int, low: int, high: int, why: str = "") -> None:
    """422 unless ``low <= value <= high``."""
    if not low <= value <= high:
        reason = f" ({why})" if why else ""
        raise ApiError(422, f"{field}: expected {low} to {high}{reason}, got {value}")


class BodyLimit:
    """ASGI middleware: a request body of more than ``max_bytes`` gets 413 before any route
    reads it (by its Content-Length when given, else by counting the chunks as they come)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send, int(declared))
        # Read the body here (at most max_bytes + one chunk), then hand it to the app.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await self._refuse(send, size, at_least=True)
            chunks.append(chunk)
            more = message.get("more_body", False)
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: waits for the disconnect

        await self.app(scope, replay, send)

    async def _refuse(self, send, size: int, *, at_least: bool = False) -> None:
        more = "at least " if at_least else ""
        message = f"request body: {more}{size} bytes, more than the limit of {self.max_bytes} bytes"
        payload = json.dumps(error_body(413, message)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
