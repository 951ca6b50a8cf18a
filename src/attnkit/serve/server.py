"""Run the app with uvicorn, with a graceful drain on SIGTERM (and Ctrl-C).

The port answers from the start: the app loads its models in the background, ``/healthz``
answering 200 and ``/readyz`` 503 until they are loaded. Models that fail to load stop the
server, and :func:`serve` raises their error.

On SIGTERM the server drains, and keeps listening while it does: ``/readyz`` answers 503
(``/healthz`` and ``/metrics`` as before), new API requests get 503 (``Connection: close``),
and the batchers stop waiting for companions, so queued requests run at once; the requests in
flight finish. Once none is left (or ``drain_seconds`` after the signal, when those still in
flight are cut), uvicorn shuts down: it stops listening (new connections are refused) and runs
the app's lifespan shutdown. The process then exits with status 0: a drained shutdown is a
success. Ctrl-C drains the same way, and the command then reports the interrupt (status 130).
A second signal during the drain starts uvicorn's shutdown at once: the port closes, and the
requests in flight get what is left of ``drain_seconds``.
"""

from __future__ import annotations

import logging
import signal
import socket
import time

import uvicorn

from attnkit.generation import blas
from attnkit.serve.app import create_app
from attnkit.serve.loading import LoadedModels
from attnkit.serve.settings import ServeSettings

logger = logging.getLogger(__name__)

__all__ = ["DrainingServer", "listen", "serve"]


class DrainingServer(uvicorn.Server):
    """uvicorn's server; a signal makes it drain, still listening, before uvicorn shuts down.

    ``state``: the app's :class:`~attnkit.serve.app.ServerState`. The drain's bound is the
    config's ``timeout_graceful_shutdown``.
    """

    def __init__(self, config: uvicorn.Config, state) -> None:
        super().__init__(config)
        self.state = state
        self.drain_seconds = config.timeout_graceful_shutdown
        self._drain: tuple[int, float] | None = None  # (signal, when the drain must end)

    def handle_exit(self, sig, frame) -> None:
        if self._drain is None and not self.should_exit:
            logger.info(
                "signal %d: draining (in flight: finish; new: 503; /readyz: 503; "
                "a second signal stops listening at once)",
                sig,
            )
            self.state.begin_drain()
            self._drain = (sig, time.monotonic() + self.drain_seconds)
            return
        if self._drain is not None and not self.should_exit:
            self.config.timeout_graceful_shutdown = max(self._drain[1] - time.monotonic(), 0.0)
        super().handle_exit(sig, frame)  # uvicorn's shutdown (another Ctrl-C: uvicorn's force)

    async def on_tick(self, counter: int) -> bool:
        if not self.should_exit:
            if self.state.load_error is not None:
                self.should_exit = True  # serve() raises the error
            elif self._drain is not None:
                self._drain_step(*self._drain)
        return await super().on_tick(counter)

    def _drain_step(self, sig: int, deadline: float) -> None:
        """Hand over to uvicorn's shutdown once no request is in flight, or at the deadline."""
        left, busy = deadline - time.monotonic(), self.state.busy
        if busy and left > 0:
            return
        if busy:
            logger.warning(
                "drain: %d request(s) still in flight after %g s: cut", busy, self.drain_seconds
            )
            self.config.timeout_graceful_shutdown = 0.0
        else:  # what is left: probes and idle connections, closed at once
            logger.info("drained: no request in flight; shutting down")
            self.config.timeout_graceful_shutdown = max(left, 1.0)
        super().handle_exit(sig, None)


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
    returns after the drain. Without ``models`` the app loads what ``settings`` names while
    the port already answers.

    Raises:
        ValueError, OSError: the models did not load (what
            :func:`~attnkit.serve.loading.load_models` raised).
    """
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
    if server.state.load_error is not None:
        raise server.state.load_error
