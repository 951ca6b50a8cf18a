"""Run the app with uvicorn, with a graceful drain on SIGTERM (and Ctrl-C).

On SIGTERM uvicorn stops listening (new connections are refused), lets the requests in flight
finish (at most ``drain_seconds``), then runs the app's lifespan shutdown. Before that, the
app's readiness flag goes down (``/readyz`` answers 503, new requests on open connections get
503) and the batchers stop waiting for companions, so queued requests run at once. The process
then exits with status 0: a drained shutdown is a success.
"""

from __future__ import annotations

import logging
import signal
import socket

import uvicorn

from attnkit.generation import blas
from attnkit.serve.app import create_app
from attnkit.serve.loading import LoadedModels
from attnkit.serve.settings import ServeSettings

logger = logging.getLogger(__name__)

__all__ = ["DrainingServer", "listen", "serve"]


class DrainingServer(uvicorn.Server):
    """uvicorn's server; its signal handler first tells the app to drain."""

    def __init__(self, config: uvicorn.Config, state) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig, frame) -> None:
        if not self.state.draining:
            logger.info("signal %d: draining (in flight: finish; new: refused)", sig)
        self.state.begin_drain()
        super().handle_exit(sig, frame)


def _ignore(sig, frame) -> None:
    pass


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free port, see ``getsockname()``).

    Raises:
        ValueError: naming the address when it cannot be bound (in use, not an address here).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise ValueError(
            f"--host/--port: cannot listen on {host}:{port} ({err.strerror or err})"
        ) from None
    sock.set_inheritable(True)
    return sock


def serve(
    settings: ServeSettings,
    sock: socket.socket,
    *,
    models: LoadedModels | None = None,
    log_level: str = "info",
) -> None:
    """Serve on the listening socket ``sock`` (:func:`listen`) until SIGTERM or Ctrl-C;
    returns after the drain."""
    app = create_app(settings, models=models)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        log_level=log_level,
        timeout_graceful_shutdown=settings.drain_seconds,
        lifespan="on",
        access_log=False,
    )
    server = DrainingServer(config, app.state.attnkit)
    # uvicorn re-raises a caught SIGTERM once it has shut down, under the handler that was in
    # place before; a no-op there makes a drained shutdown end with status 0, not -15.
    previous = signal.signal(signal.SIGTERM, _ignore)
    logger.info("listening on http://%s:%d (the web page is at /, the API at /docs)", host, port)
    try:
        # OpenBLAS ignores a thread count set from a worker thread once the main thread has set
        # one: held here for the server's life, so that the jobs' one-row products can take it
        # (attnkit.generation.blas; nothing is held where they would not).
        with blas.one_thread():
            server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not server.started:
        raise RuntimeError(f"the server on {host}:{port} did not start (see the log above)")
