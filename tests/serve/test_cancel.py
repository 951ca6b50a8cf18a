"""A client that disconnects stops its generation (streamed or not), on a real server.

The generation is wrapped so that, after its first piece, it waits until the server has
counted the disconnect (``attnkit_cancelled_total``); the generation then must stop at its
next piece instead of running to ``max_new_tokens``. What the test checks does not depend on
timing: without the cancellation the wrapped generation runs to its end.
"""

import socket
import threading

import pytest

import attnkit.generation
from attnkit.generation import GenerationConfig, stream_text
from attnkit.serve import ServeSettings, create_app
from tests.helpers.serve import DEADLINE, ThreadedServer, http_request, metric, wait_until

PROMPT = "the cat"
NEW_TOKENS = 80


class Watched:
    """stream_text, pausing after the first piece until the server counts a cancellation."""

    def __init__(self, app) -> None:
        self.app = app
        self.first = threading.Event()
        self.pieces = 0
        self.closed_early = None

    def __call__(self, model, tokenizer, prompt, config):
        finished = False
        try:
            for piece in stream_text(model, tokenizer, prompt, config):
                self.pieces += 1
                yield piece
                if self.pieces == 1:
                    self.first.set()
                    wait_until(lambda: metric(self.app, "attnkit_cancelled_total") >= 1,
                               "the server to see the disconnect")  # fmt: skip
            finished = True
        finally:
            self.closed_early = not finished


@pytest.fixture
def app(models, monkeypatch):
    app = create_app(ServeSettings(), models=models)
    watched = Watched(app)
    monkeypatch.setattr(attnkit.generation, "stream_text", watched)
    app.watched = watched
    return app


@pytest.fixture(scope="module")
def full_pieces(gpt):
    """How many pieces the whole generation has (it must be more than 2 for the test)."""
    config = GenerationConfig(max_new_tokens=NEW_TOKENS)
    n = sum(1 for _ in stream_text(gpt, None, PROMPT, config))
    assert n > 2
    return n


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_stops_the_generation(app, full_pieces, stream):
    body = {"prompt": PROMPT, "max_new_tokens": NEW_TOKENS, "stream": stream}
    with ThreadedServer(app) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(http_request("/v1/generate", body))
            if stream:  # read until the first event arrives
                s.settimeout(DEADLINE)
                received = b""
                while b"data:" not in received:
                    received += s.recv(4096)
            assert app.watched.first.wait(DEADLINE)
        # the socket is closed: the server notices and cancels
        wait_until(lambda: app.watched.closed_early is not None, "the generation to end")
        assert metric(app, "attnkit_cancelled_total") == 1
        assert app.watched.closed_early is True
        assert app.watched.pieces == 2 < full_pieces  # stopped at the piece after the first
        wait_until(lambda: metric(app, "attnkit_jobs") == 0, "the job to be released")
