"""The FastAPI app of `attnkit serve`: routes, lifespan, metrics and the web page.

    from attnkit.serve import ServeSettings, create_app
    app = create_app(ServeSettings(gpt_model="path/to/gpt2-folder"))   # any ASGI server runs it

Models are passed in, already loaded, or loaded in a background thread that the lifespan hook
starts: the server answers at once, ``/healthz`` with 200 and ``/readyz`` with 503
(``"loading": true``) until the models are loaded, then 200; API requests meanwhile get 503
("the server is starting"). A model that fails to load leaves ``/readyz`` at 503 with the
error (:mod:`attnkit.serve.server` then stops the server and raises it). Inference never runs on
the event loop: translation and embedding requests go to their dynamic batchers, attention
captures and generations to a small job pool (:mod:`attnkit.serve.services`). A request whose
client disconnects is cancelled: a queued batch item is dropped and a generation stops at its
next token. While the server drains (SIGTERM, see :mod:`attnkit.serve.server`) ``/readyz``
answers 503 and new API requests get 503; those in flight finish.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from starlette.background import BackgroundTask

import attnkit
from attnkit.serve.batcher import QueueFull
from attnkit.serve.errors import ApiError, error_body, install_handlers
from attnkit.serve.limits import BodyLimit
from attnkit.serve.loading import LoadedModels, load_models
from attnkit.serve.memory import trim_when_idle
from attnkit.serve.metrics import CONTENT_TYPE_LATEST, Metrics
from attnkit.serve.schemas import (
    AttentionRequest,
    AttentionResponse,
    EmbedRequest,
    EmbedResponse,
    ErrorResponse,
    GenerateRequest,
    GenerateResponse,
    ReadyResponse,
    TranslateRequest,
    TranslateResponse,
)
from attnkit.serve.services import Services, not_loaded, queue_full
from attnkit.serve.settings import ServeSettings

logger = logging.getLogger(__name__)

__all__ = ["ServerState", "create_app"]

CLIENT_GONE = 499  # nginx's status for "the client closed the connection"; logged, never seen
_ALWAYS_OPEN = ("/healthz", "/readyz", "/metrics")  # answered while draining
_KNOWN = frozenset({"/", "/v1/translate", "/v1/embed", "/v1/attention", "/v1/generate"})
_PAGE_CSP = (
    # Nothing leaves the server. 'unsafe-inline' scripts: the attention viewer is a
    # self-contained page shown in an <iframe srcdoc>, which inherits this policy.
    "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; frame-src 'self'; base-uri 'none'; "
    "form-action 'none'"
)
_ERRORS = {
    s: {"model": ErrorResponse, "description": d}
    for s, d in [
        (413, "a limit is exceeded: body bytes, texts per request, tokens per text"),
        (422, "a field is missing, of the wrong type or out of range"),
        (503, "the model is not loaded, the queue is full (Retry-After) or the server drains"),
    ]
}


class ServerState:
    """What the routes share: settings, metrics, services, readiness."""

    def __init__(self, settings: ServeSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.services: Services | None = None
        self.models: LoadedModels | None = None
        self.ready = False
        self.loading = False  # the models are being loaded in the background
        self.load_error: Exception | None = None  # why they did not load
        self.draining = False
        self.answered = 0  # requests answered so far
        self.in_flight = 0  # requests being answered
        self.busy = 0  # of them, those that are not /healthz, /readyz or /metrics

    def start(self, models: LoadedModels) -> None:
        """Serve ``models``: the services start and the server is ready (unless draining)."""
        self.models = models
        self.services = Services(models, self.settings, self.metrics)
        if self.draining:
            self.services.drain()
        self.ready = True

    def begin_drain(self) -> None:
        """Refuse new requests, answer /readyz 503, and run queued batches at once.

        Thread-safe: it is called from the signal handler of :mod:`attnkit.serve.server`."""
        self.draining = True
        if self.services is not None:
            self.services.drain()


class _RequestMetrics:
    """ASGI middleware: counts, latencies, requests in flight; refuses new API requests while
    the server drains."""

    def __init__(self, app, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        m = self.state.metrics
        if self.state.draining and scope["path"] not in _ALWAYS_OPEN:
            m.requests.labels("draining", "503").inc()
            return await JSONResponse(
                error_body(503, "the server is shutting down; it takes no new requests"),
                503,
                {"Connection": "close"},
            )(scope, receive, send)
        start, status = time.perf_counter(), [500]

        async def send_and_count(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        busy = int(scope["path"] not in _ALWAYS_OPEN)
        m.in_flight.inc()
        self.state.in_flight += 1
        self.state.busy += busy
        try:
            await self.app(scope, receive, send_and_count)
        finally:
            m.in_flight.dec()
            self.state.in_flight -= 1
            self.state.busy -= busy
            self.state.answered += 1
            endpoint = self._endpoint(scope)
            m.requests.labels(endpoint, str(status[0])).inc()
            m.latency.labels(endpoint).observe(time.perf_counter() - start)

    @staticmethod
    def _endpoint(scope) -> str:
        """The route template (a bounded label), "/static" for the page's files, or "other"."""
        path = getattr(scope.get("route"), "path", None)
        if path:
            return path
        if scope["path"].startswith("/static/"):
            return "/static"
        return scope["path"] if scope["path"] in _KNOWN else "other"


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed the connection (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _or_cancel(request: Request, work: Awaitable, on_cancel: Callable[[], None]):
    """The result of ``work``; or, if the client goes away first, cancel it and raise
    :class:`_ClientGone`. If the request is cancelled (uvicorn cuts it at the end of a
    drain), the job is cancelled too, so that the shutdown does not wait for it."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the request itself is cut (a drain's deadline): stop the job
        task.cancel()
        on_cancel()
        raise
    finally:
        watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    on_cancel()
    raise _ClientGone


class _ClientGone(Exception):
    pass


LOADER_THREAD = "attnkit-serve-load"


def _in_thread(function: Callable, *args) -> asyncio.Future:
    """``function(*args)`` in a thread of its own. Unlike asyncio.to_thread, a server stopped
    meanwhile (SIGTERM while the models load) does not wait for it: the port closes at once,
    and the process ends when the thread does (a daemon thread, killed inside torch at exit,
    would abort the process)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(outcome: tuple[bool, object]) -> None:
        ok, value = outcome
        if future.done():  # cancelled by a shutdown meanwhile
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def run() -> None:
        try:
            outcome = (True, function(*args))
        except BaseException as err:  # anything: the server must learn the load ended
            outcome = (False, err)
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:  # the loop is closed: the server has stopped
            pass

    threading.Thread(target=run, name=LOADER_THREAD).start()
    return future


def _resource(name: str) -> str:
    return importlib.resources.files("attnkit.serve").joinpath("static", name).read_text("utf-8")


def create_app(
    settings: ServeSettings | None = None, *, models: LoadedModels | None = None
) -> FastAPI:
    """The app; ``models`` already loaded (else the lifespan loads what ``settings`` names).

    ``app.state.attnkit`` is the :class:`ServerState`.
    """
    settings = settings or ServeSettings()
    metrics = Metrics()
    state = ServerState(settings, metrics)

    async def load() -> None:
        try:
            # Making the services checks the folders' settings too (a translation folder's
            # "decoding" section): a failure there stops the server like a failed read.
            state.start(await _in_thread(load_models, settings))
        except Exception as err:
            state.load_error = err
            logger.error("the models did not load: %s", err)
            return
        finally:
            state.loading = False
        logger.info("models loaded: ready")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loading = None
        if models is not None:
            state.start(models)
        else:  # in the background: the port answers (/healthz, /readyz 503) meanwhile
            state.loading = True
            loading = asyncio.ensure_future(load())
        trimmer = asyncio.ensure_future(
            trim_when_idle(lambda: state.answered, lambda: state.in_flight)
        )
        try:
            yield
        finally:
            trimmer.cancel()
            if loading is not None and not loading.done():
                logger.info("stopped while loading the models: the process ends once they are")
                loading.cancel()
            state.ready = False
            state.begin_drain()
            if state.services is not None:
                await asyncio.to_thread(state.services.stop)

    # FastAPIOffline: FastAPI with /docs (Swagger UI) and /redoc served from the package's own
    # files instead of a CDN; the validator badge (a request to another host) is off.
    app = FastAPIOffline(
        title="attnkit",
        version=attnkit.__version__,
        summary="Translation, embeddings, attention weights and GPT text over HTTP",
        description='Every error is JSON: `{"error": {"status", "type", "message"}}`. '
        "A full queue answers 503 with `Retry-After`. `GET /` is a web page for people.",
        lifespan=lifespan,
        swagger_ui_parameters={"validatorUrl": None},
    )
    app.state.attnkit = state
    install_handlers(app)

    @app.exception_handler(_ClientGone)
    async def _gone(request: Request, err: _ClientGone):
        metrics.cancelled.inc()
        return Response(status_code=CLIENT_GONE)

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(_RequestMetrics, state=state)

    def services() -> Services:
        if state.load_error is not None:
            raise ApiError(503, f"the models did not load: {state.load_error}")
        if state.services is None:
            raise ApiError(503, "the server is starting: its models are not loaded yet")
        return state.services

    # ------------------------------------------------------------------ API

    @app.post("/v1/translate", response_model=TranslateResponse, responses=_ERRORS)
    async def translate(body: TranslateRequest, request: Request):
        """Translate texts (the shipped model: German -> English), batched with concurrent
        requests; each text gets what `attnkit translate --beam BEAM` gives it."""
        service = services().translation
        if service is None:
            raise not_loaded("translation")
        beam = service.beam(body.beam)
        work = service.translate(body.texts, beam)
        translations = await _or_cancel(request, work, lambda: None)
        return {"translations": translations, "beam": beam, "model": service.folder}

    @app.post("/v1/embed", response_model=EmbedResponse, responses=_ERRORS)
    async def embed(body: EmbedRequest, request: Request):
        """Sentence embeddings (the BERT folder's own pooling), batched like translations."""
        service = services().embedding
        if service is None:
            raise not_loaded("bert")
        vectors = await _or_cancel(request, service.embed(body.texts, body.normalize), lambda: None)
        normalized = service.normalizes if body.normalize is None else body.normalize
        return {
            "embeddings": vectors,
            "dimension": len(vectors[0]),
            "normalized": normalized,
            "model": service.folder,
        }

    @app.post("/v1/attention", response_model=AttentionResponse, responses=_ERRORS)
    async def attention(body: AttentionRequest, request: Request):
        """Every layer's and head's attention weights of one sentence, with its tokens: what
        the viewer of `attnkit attention` draws (and, with html=true, the viewer page)."""
        s = services()
        try:
            future = s.attention.submit(body.model, body.text, body.target, body.beam)
        except QueueFull as err:
            metrics.rejected.labels("jobs").inc()
            raise queue_full("job", err, settings) from None
        maps = await _or_cancel(request, asyncio.wrap_future(future), future.cancel)
        return await asyncio.to_thread(s.attention.answer, maps, body.html)

    @app.post(
        "/v1/generate",
        response_model=GenerateResponse,
        responses={
            **_ERRORS,
            200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE if stream"},
        },
    )
    async def generate(body: GenerateRequest, request: Request):
        """Continue a prompt with the GPT model (the settings of `attnkit generate`). With
        `"stream": true` the answer is Server-Sent Events: `data: {"text": piece}` per piece
        as it is decoded, then `event: done` with `data: {"text": whole}` (or `event: error`).
        A client that disconnects stops its generation."""
        service = services().generation
        if service is None:
            raise not_loaded("gpt")
        prepared = service.prepare(body)
        try:
            job = service.start(prepared)
        except QueueFull as err:
            metrics.rejected.labels("jobs").inc()
            raise queue_full("job", err, settings) from None
        if body.stream:
            return StreamingResponse(
                _events(job, metrics),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                background=BackgroundTask(job.cancel),  # also if the stream never started
            )

        async def collect() -> str:
            pieces = []
            async for piece in job.items():
                pieces.append(piece)
                metrics.generated_pieces.inc()
            return "".join(pieces)

        text = await _or_cancel(request, collect(), job.cancel)
        return {"prompt": body.prompt, "text": text, "model": service.folder}

    # ------------------------------------------------------------------ operations

    @app.get("/healthz")
    async def healthz():
        """Liveness: 200 while the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", response_model=ReadyResponse, responses={503: {"model": ReadyResponse}})
    async def readyz():
        """Readiness: 200 once the models are loaded, 503 before that (`loading`; `error` if
        they did not load) and while the server drains after SIGTERM (`draining`)."""
        ready = state.ready and not state.draining
        body = {
            "ready": ready,
            "loading": state.loading,
            "draining": state.draining,
            "error": None if state.load_error is None else str(state.load_error),
            "models": state.models.describe() if state.models else {},
        }
        return JSONResponse(body, 200 if ready else 503)

    @app.get("/metrics", response_class=Response)
    async def prometheus():
        """Prometheus text format: requests, latencies, batch sizes, queue depth, rejections."""
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------------ the web page

    page = _resource("index.html")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index():
        return HTMLResponse(page, headers={"Content-Security-Policy": _PAGE_CSP})

    app.mount("/static", StaticFiles(packages=[("attnkit.serve", "static")]), name="static")
    return app


async def _events(job, metrics: Metrics):
    """Server-Sent Events of a generation; a cancelled stream (client gone) cancels the job."""
    pieces, finished = [], False
    try:
        async for piece in job.items():
            pieces.append(piece)
            metrics.generated_pieces.inc()
            yield f"data: {json.dumps({'text': piece}, ensure_ascii=False)}\n\n"
        finished = True
        yield f"event: done\ndata: {json.dumps({'text': ''.join(pieces)}, ensure_ascii=False)}\n\n"
    except Exception as err:  # the headers are sent: the error becomes an event
        finished = True
        logger.exception("generation failed")
        yield f"event: error\ndata: {json.dumps(error_body(500, str(err)))}\n\n"
    finally:
        if not finished:
            job.cancel()
            metrics.cancelled.inc()
