"""Helpers of the server tests: a real uvicorn in a thread, metric readings, SSE parsing, and
`attnkit serve` as a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import uvicorn

from attnkit.serve.server import listen

DEADLINE = 120.0  # seconds a helper waits for something that must happen (a bound, not a test)


def wait_until(condition, what: str, deadline: float = DEADLINE, every: float = 0.02):
    """Poll ``condition()`` until it is truthy; fail naming ``what`` after ``deadline`` s."""
    end = time.monotonic() + deadline
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline} s waiting for {what}")
        time.sleep(every)


class ThreadedServer:
    """``with ThreadedServer(app) as server:`` serves ``app`` on 127.0.0.1 (a free port) in a
    thread; ``server.url`` is its address."""

    def __init__(self, app) -> None:
        self.app = app
        self.sock = listen("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), "uvicorn to start")
        assert self.server.started, "uvicorn did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(DEADLINE)
        self.sock.close()


def metric(app, name: str, **labels) -> float:
    """A sample of the app's Prometheus registry (0 when absent)."""
    registry = app.state.attnkit.metrics.registry
    return registry.get_sample_value(name, labels) or 0.0


def parse_metric(text: str, name: str, **labels) -> float | None:
    """A sample from Prometheus text (``GET /metrics``), or None."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if labels else "") + r" (\S+)"
    found = re.search(r"^" + pattern + r"$", text, re.M)
    return float(found.group(1)) if found else None


def sse_events(text: str) -> list[tuple[str, dict]]:
    """(event name, data) of a Server-Sent Events body; "message" when unnamed."""
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name, data = "message", []
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        events.append((name, json.loads("\n".join(data))))
    return events


def http_request(path: str, body: dict) -> bytes:
    """The bytes of an HTTP/1.1 POST of ``body`` as JSON (for raw-socket tests)."""
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


class ServeProcess:
    """``attnkit serve ARGS --port 0`` in a subprocess; ``url`` once it listens."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "attnkit", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.log: list[str] = []
        self._port = threading.Event()
        self.url = None
        threading.Thread(target=self._read_log, daemon=True).start()
        wait_until(lambda: self._port.is_set() or self.proc.poll() is not None, "the port")
        assert self.url is not None, "attnkit serve did not start:\n" + "".join(self.log)

    def _read_log(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            found = re.search(r"listening on (http://\S+:\d+)", line)
            if found:
                self.url = found.group(1)
                self._port.set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(DEADLINE)
