"""`attnkit serve`: the shipped models over HTTP (FastAPI + uvicorn), with dynamic batching.

    from attnkit.serve import ServeSettings, create_app
    app = create_app(ServeSettings(max_wait_ms=5))     # run with any ASGI server

Endpoints: ``POST /v1/translate``, ``/v1/embed``, ``/v1/attention``, ``/v1/generate`` (JSON or
Server-Sent Events), ``GET /healthz``, ``/readyz``, ``/metrics`` (Prometheus), ``/docs``
(OpenAPI) and ``/`` (a web page: translation with its cross-attention heatmap, and a GPT
prompt that streams).

Modules: :mod:`~attnkit.serve.settings` (:class:`ServeSettings`),
:mod:`~attnkit.serve.loading` (the models), :mod:`~attnkit.serve.batcher` (dynamic batching),
:mod:`~attnkit.serve.jobs` (generations and captures off the event loop),
:mod:`~attnkit.serve.memory` (freed memory back to the system when idle),
:mod:`~attnkit.serve.services` (what each endpoint does with its model),
:mod:`~attnkit.serve.schemas` (request and response bodies), :mod:`~attnkit.serve.limits`
and :mod:`~attnkit.serve.errors` (limits and JSON errors), :mod:`~attnkit.serve.metrics`
(Prometheus), :mod:`~attnkit.serve.app` (routes, lifespan, page) and
:mod:`~attnkit.serve.server` (uvicorn with a drain on SIGTERM). Needs the ``serve`` extra.
"""

from attnkit.serve.app import create_app
from attnkit.serve.loading import LoadedModels, load_models
from attnkit.serve.settings import DEFAULT, ServeSettings

__all__ = ["DEFAULT", "LoadedModels", "ServeSettings", "create_app", "load_models"]
