"""attnkit.serve.server in this process: the port answers while the models load (``/healthz``
200, ``/readyz`` 503, API requests 503), models that do not load stop the server with their
error, and a signal drains with the port open (``/readyz`` 503, new requests 503) until the
requests in flight finish, at most ``drain_seconds``.

:func:`serve` runs in the main thread (only it gets signals); a driver thread makes the
requests and sends the signals. A request is held in flight by sending its body but for the
last byte.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from dataclasses import replace

import httpx
import pytest

from attnkit.decoding import Translator, model_decoding
from attnkit.serve import ServeSettings, create_app
from attnkit.serve import app as app_module
from attnkit.serve.server import listen, serve
from tests.helpers.serve import DEADLINE, ThreadedServer, parse_metric, wait_until

TEXTS = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
SHORT = 10.0  # seconds a probe may take: far more than it does, far less than a hang


@pytest.fixture(autouse=True)
def _no_stray_sigterm():
    """A SIGTERM that reaches this process outside serve() is ignored (it would end pytest)."""
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: None)
    yield
    signal.signal(signal.SIGTERM, previous)


def run_server(settings, driver, *, models=None, on_failure=lambda: None):
    """serve(settings) here while ``driver(url)`` runs in a thread: (its result, what serve
    raised or None). A failing driver calls ``on_failure`` (to let go of what it holds) and
    stops the server with SIGTERMs; its error is raised here."""
    sock = listen("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    outcome, done = {}, threading.Event()

    def drive():
        try:
            outcome["result"] = driver(url)
        except BaseException as err:
            outcome["error"] = err
            on_failure()
            while not done.wait(0.5):
                os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=drive)
    thread.start()
    raised = None
    try:
        serve(settings, sock, models=models, log_level="warning")
    except BaseException as err:
        raised = err
    finally:
        done.set()
        sock.close()
    thread.join(DEADLINE)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"], raised


class HeldRequest:
    """``POST /v1/translate`` with its body sent but for the last byte: in flight until
    :meth:`finish` sends it."""

    def __init__(self, url: str, texts: list[str]) -> None:
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"texts": texts, "beam": 2}).encode()
        head = (
            f"POST /v1/translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        self.sock = socket.create_connection((host, int(port)), timeout=DEADLINE)
        self.sock.sendall(head.encode() + body[:-1])
        self.rest = body[-1:]

    def finish(self) -> tuple[int, dict]:
        """Send the last byte; the status and JSON of the answer."""
        self.sock.sendall(self.rest)
        head, _, payload = self.read().partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(payload)

    def read(self) -> bytes:
        """What the server sends until it closes the connection."""
        data = b""
        try:
            while chunk := self.sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
        self.sock.close()
        return data

    def close(self) -> None:
        self.sock.close()


def in_flight(url: str) -> float | None:
    text = httpx.get(f"{url}/metrics", timeout=SHORT).text
    return parse_metric(text, "attnkit_in_flight_requests")  # this /metrics request counts


def hold(url: str, held: list[HeldRequest]) -> HeldRequest:
    request = HeldRequest(url, TEXTS)
    held.append(request)
    wait_until(lambda: in_flight(url) == 2, "the held request to be in flight")
    return request


def draining_readyz(http: httpx.Client) -> httpx.Response | None:
    """/readyz once it answers 503; a refused connection fails (the port must stay open)."""
    r = http.get("/readyz")
    return r if r.status_code == 503 else None


def refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) != 0


def offline(translation, texts, beam):
    config = replace(model_decoding(translation.path), beam_size=beam)
    return (
        Translator(translation.model, translation.tokenizer, config).translate(texts).translations
    )


# --------------------------------------------------------------------------- loading


def _slow_load(monkeypatch, models) -> threading.Event:
    """load_models waits for the returned event, then gives ``models``."""
    release = threading.Event()

    def load(settings):
        assert release.wait(DEADLINE), "never released"
        return models

    monkeypatch.setattr(app_module, "load_models", load)
    return release


def test_the_port_answers_while_the_models_load(models, monkeypatch):
    """Before: the lifespan loaded the models before uvicorn answered anything."""
    release = _slow_load(monkeypatch, models)

    def driver(url):
        with httpx.Client(base_url=url, timeout=SHORT) as http:
            health, ready = http.get("/healthz"), http.get("/readyz")
            early = http.post("/v1/translate", json={"texts": TEXTS})
            release.set()
            loaded = wait_until(
                lambda: (r := http.get("/readyz")).status_code == 200 and r, "/readyz 200"
            )
            later = http.post("/v1/translate", json={"texts": TEXTS})
        os.kill(os.getpid(), signal.SIGTERM)
        return health, ready, early, loaded, later

    result, raised = run_server(ServeSettings(), driver, on_failure=release.set)
    health, ready, early, loaded, later = result
    assert raised is None
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert ready.status_code == 503
    assert ready.json() == {
        "ready": False, "loading": True, "draining": False, "error": None, "models": {},
    }  # fmt: skip
    assert early.status_code == 503
    assert early.json()["error"]["message"] == (
        "the server is starting: its models are not loaded yet"
    )
    assert loaded.json()["ready"] is True and loaded.json()["loading"] is False
    assert loaded.json()["models"] == models.describe()
    assert later.status_code == 200 and len(later.json()["translations"]) == 2


def test_a_signal_while_the_models_load_stops_the_server_at_once(models, monkeypatch):
    release = _slow_load(monkeypatch, models)

    def driver(url):
        with httpx.Client(base_url=url, timeout=SHORT) as http:
            ready = http.get("/readyz")
        os.kill(os.getpid(), signal.SIGTERM)
        return ready

    ready, raised = run_server(ServeSettings(), driver, on_failure=release.set)
    try:
        assert ready.status_code == 503 and ready.json()["loading"] is True
        assert raised is None
        assert not release.is_set()  # serve() returned while the models were still loading
    finally:
        release.set()
    # The loading thread ends by itself (the process waits for it, as for any thread).
    for thread in threading.enumerate():
        if thread.name == app_module.LOADER_THREAD:
            thread.join(DEADLINE)
            assert not thread.is_alive()


def test_models_that_do_not_load_answer_503_with_the_error(tmp_path):
    """Any ASGI server: /readyz answers 503 with the error, and so do the API endpoints."""
    settings = ServeSettings(translation_model=tmp_path, gpt_model=None, bert_model=None)
    with (
        ThreadedServer(create_app(settings)) as server,
        httpx.Client(base_url=server.url, timeout=SHORT) as http,
    ):
        ready = wait_until(
            lambda: (r := http.get("/readyz")).json()["error"] and r, "the load to fail"
        )
        translate = http.post("/v1/translate", json={"texts": TEXTS})
        health = http.get("/healthz")
    assert ready.status_code == 503 and ready.json()["loading"] is False
    error = ready.json()["error"]
    assert error.startswith(f"translation_model: {tmp_path}")
    assert translate.status_code == 503
    assert translate.json()["error"]["message"] == f"the models did not load: {error}"
    assert health.status_code == 200


def test_models_that_do_not_load_stop_serve_with_their_error(tmp_path):
    settings = ServeSettings(translation_model=tmp_path, gpt_model=None, bert_model=None)
    url, raised = run_server(settings, lambda url: url)
    assert isinstance(raised, ValueError), repr(raised)
    assert str(raised).startswith(f"translation_model: {tmp_path}")
    assert refused(url)


def test_a_folder_whose_settings_are_refused_after_loading_stops_serve(tmp_path):
    """The weights load, then making the services refuses the folder's "decoding" section:
    before, that error was lost in the background task and the server answered "starting"
    for ever."""
    import shutil

    from attnkit.decoding.loading import shipped_model_dir

    folder = tmp_path / "model"
    shutil.copytree(shipped_model_dir(), folder)
    config = json.loads((folder / "config.json").read_text())
    config["decoding"] = {**config.get("decoding", {}), "lenpen_style": "bogus"}
    (folder / "config.json").write_text(json.dumps(config))
    settings = ServeSettings(translation_model=folder, gpt_model=None, bert_model=None)
    url, raised = run_server(settings, lambda url: url)
    assert isinstance(raised, ValueError), repr(raised)
    assert "lenpen_style" in str(raised)
    assert refused(url)


# --------------------------------------------------------------------------- draining


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_drains_with_the_port_open_until_requests_in_flight_finish(
    models, translation, sig
):
    """Before: uvicorn stopped listening at the signal, so /readyz was never seen at 503."""
    held: list[HeldRequest] = []

    def driver(url):
        request = hold(url, held)
        os.kill(os.getpid(), sig)
        with httpx.Client(base_url=url, timeout=SHORT) as http:
            ready = wait_until(lambda: draining_readyz(http), "/readyz 503")
            health, metrics = http.get("/healthz"), http.get("/metrics")
            new = http.post("/v1/translate", json={"texts": TEXTS})
            time.sleep(0.5)  # 5 ticks of uvicorn's loop: the held request keeps the port open
            still = http.get("/readyz")
        answer = request.finish()
        return url, ready, health, metrics, new, still, answer

    result, raised = run_server(
        ServeSettings(), driver, models=models, on_failure=lambda: [h.close() for h in held]
    )
    url, ready, health, metrics, new, still, (status, body) = result
    assert ready.json()["draining"] is True and ready.json()["ready"] is False
    assert health.status_code == 200 and metrics.status_code == 200
    assert new.status_code == 503 and new.headers["connection"] == "close"
    assert "shutting down" in new.json()["error"]["message"]
    assert still.status_code == 503
    assert status == 200 and body["translations"] == offline(translation, TEXTS, 2)
    assert refused(url)  # after the drain
    if sig == signal.SIGTERM:
        assert raised is None  # `attnkit serve` exits with status 0
    else:
        assert isinstance(raised, KeyboardInterrupt)  # `attnkit serve`: status 130


def test_requests_still_in_flight_after_drain_seconds_are_cut(models):
    drain = 10.0  # seconds: time for the probe to get in on a busy 2-core machine
    held: list[HeldRequest] = []

    def driver(url):
        request = hold(url, held)
        start = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        with httpx.Client(base_url=url, timeout=SHORT) as http:
            ready = wait_until(lambda: draining_readyz(http), "/readyz 503")
        sent = request.read()  # the body is never finished: the server closes the connection
        return url, ready, time.monotonic() - start, sent

    result, raised = run_server(
        ServeSettings(drain_seconds=drain), driver, models=models,
        on_failure=lambda: [h.close() for h in held],
    )  # fmt: skip
    url, ready, elapsed, sent = result
    assert raised is None
    assert ready.status_code == 503 and ready.json()["draining"] is True
    assert drain <= elapsed < drain + SHORT
    assert b" 200 " not in sent.split(b"\r\n", 1)[0]
    assert refused(url)


def test_a_generation_cut_at_the_drains_end_stops_and_frees_the_shutdown(models, monkeypatch):
    """A non-streamed generation still running when ``drain_seconds`` ends: uvicorn cuts the
    request, and its job must be cancelled too; before, the shutdown waited for the whole
    generation (slowed down here to 30 s) after the deadline."""
    import attnkit.generation
    from attnkit.generation import GenerationConfig

    real, pieces, first = attnkit.generation.stream_text, [], threading.Event()
    full = sum(1 for _ in real(models.gpt, None, "the cat", GenerationConfig(max_new_tokens=80)))
    pause = 30.0 / full  # the whole generation takes 30 s

    def slow(*args, **kwargs):
        for piece in real(*args, **kwargs):
            pieces.append(piece)
            first.set()
            time.sleep(pause)
            yield piece

    monkeypatch.setattr(attnkit.generation, "stream_text", slow)
    drain = 2.0
    body = {"prompt": "the cat", "max_new_tokens": 80}
    holder: list[socket.socket] = []

    def driver(url):
        host, port = url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=DEADLINE)
        holder.append(sock)
        payload = json.dumps(body).encode()
        sock.sendall(
            f"POST /v1/generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            + payload
        )
        assert first.wait(DEADLINE), "the generation did not start"
        start = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        return start

    started = time.monotonic()
    start, raised = run_server(
        ServeSettings(drain_seconds=drain), driver, models=models,
        on_failure=lambda: [s.close() for s in holder],
    )  # fmt: skip
    shutdown = time.monotonic() - start
    for sock in holder:
        sock.close()
    assert raised is None and started <= start
    assert shutdown < drain + SHORT  # not the 30 s of the whole generation
    assert len(pieces) < full


def test_a_second_signal_stops_listening_and_lets_requests_in_flight_finish(models):
    held: list[HeldRequest] = []

    def driver(url):
        request = hold(url, held)
        os.kill(os.getpid(), signal.SIGTERM)
        with httpx.Client(base_url=url, timeout=SHORT) as http:
            wait_until(lambda: draining_readyz(http), "/readyz 503")
        os.kill(os.getpid(), signal.SIGTERM)
        wait_until(lambda: refused(url), "the port to close")
        return request.finish()

    (status, body), raised = run_server(
        ServeSettings(), driver, models=models, on_failure=lambda: [h.close() for h in held]
    )
    assert raised is None
    assert status == 200 and len(body["translations"]) == 2
