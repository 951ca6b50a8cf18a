"""`attnkit serve` as a process: SIGTERM drains with the port open (/readyz answers 503, new
requests 503, the request in flight completes), then the port closes and the exit status is 0;
start-up errors are one clear line naming the flag. (tests/serve/test_lifecycle.py runs the
same server in the test's process, with models that load slowly or not at all.)"""

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

import httpx
import torch

from attnkit.decoding import Translator, load_translation_model, model_decoding
from attnkit.hardware import fast_inference_dtype
from tests.helpers.serve import DEADLINE, ServeProcess, parse_metric, wait_until

TEXTS = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]


def test_sigterm_drains_with_the_port_open_until_the_request_in_flight_completes():
    """Before: at SIGTERM uvicorn stopped listening, so /readyz was refused, never 503."""
    server = ServeProcess("--bert-model", "none", "--gpt-model", "none")
    port = int(server.url.rsplit(":", 1)[1])
    try:
        # /healthz answers as soon as the port is logged, while the model may still load.
        assert httpx.get(f"{server.url}/healthz", timeout=DEADLINE).status_code == 200
        wait_until(lambda: _ready(server.url), "/readyz")
        # A request in flight for as long as the test wants: its body lacks its last byte.
        body = json.dumps({"texts": TEXTS, "beam": 2}).encode()
        held = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
        held.sendall(
            b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:-1]
        )
        wait_until(lambda: _in_flight(server.url) == 2, "the request to be in flight")
        server.proc.send_signal(signal.SIGTERM)
        with httpx.Client(base_url=server.url, timeout=DEADLINE) as http:
            # A refused connection fails here: the port stays open while the drain lasts.
            ready = wait_until(
                lambda: (r := http.get("/readyz")).status_code == 503 and r, "/readyz 503"
            )
            assert ready.json()["draining"] is True and ready.json()["ready"] is False
            assert http.get("/healthz").status_code == 200
            late = http.post("/v1/translate", json={"texts": TEXTS})
            assert late.status_code == 503 and "shutting down" in late.text
            time.sleep(0.5)
            assert server.proc.poll() is None  # still draining: the request is in flight
            assert http.get("/readyz").status_code == 503
        held.sendall(body[-1:])
        answer = b""
        while chunk := held.recv(65536):
            answer += chunk
        held.close()
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), answer
        # The server's model: its dtype is fast_inference_dtype's (bfloat16 on a CPU with native
        # bfloat16 products), so a float32 reference could part from it at a near-tie.
        translation = load_translation_model(None, dtype=fast_inference_dtype(torch.device("cpu")))
        config = replace(model_decoding(translation.path), beam_size=2)  # the server's
        expected = Translator(translation.model, translation.tokenizer, config)
        assert json.loads(payload)["translations"] == expected.translate(TEXTS).translations
        assert server.proc.wait(DEADLINE) == 0, "".join(server.log)
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0  # refused
        log = "".join(server.log)
        assert "draining" in log and "drained" in log and "Application shutdown complete" in log
    finally:
        server.stop()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=DEADLINE).status_code == 200
    except httpx.TransportError:
        return False


def _in_flight(url: str) -> float | None:
    text = httpx.get(f"{url}/metrics", timeout=DEADLINE).text
    return parse_metric(text, "attnkit_in_flight_requests")  # this /metrics request counts


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnkit", "serve", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


def test_busy_port_and_bad_folder_are_one_line_errors_naming_the_flag(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _serve("--port", str(port), "--bert-model", "none")
    assert done.returncode == 2
    assert f"attnkit serve: error: --host/--port: cannot listen on 127.0.0.1:{port}" in done.stderr
    done = _serve("--port", "0", "--translation-model", str(tmp_path), "--bert-model", "none")
    assert done.returncode == 2, done.stderr
    assert f"attnkit serve: error: --translation-model: {tmp_path}" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_server_holds_openblas_at_one_thread(monkeypatch):
    """A count set from a worker thread is ignored once the main thread has set one, so the
    server holds OpenBLAS at one thread from the main thread for its life: the jobs' one-row
    products (worker threads) can then take it. The counts come back afterwards."""
    from types import SimpleNamespace

    import pytest

    from attnkit.generation import blas
    from attnkit.serve import server
    from tests.helpers.blas import openblas_at_two_threads, openblas_threads

    seen = []
    app = SimpleNamespace(state=SimpleNamespace(attnkit=None))
    monkeypatch.setattr(server, "create_app", lambda settings, models=None: app)

    def run(self, sockets=None):
        worker = threading.Thread(target=lambda: seen.append(blas.single_threaded()))
        worker.start()
        worker.join(10)

    monkeypatch.setattr(server.DrainingServer, "run", run)
    with openblas_at_two_threads(monkeypatch):
        sock = server.listen("127.0.0.1", 0)
        try:
            with pytest.raises(RuntimeError, match="did not start"):
                server.serve(SimpleNamespace(drain_seconds=1), sock)
        finally:
            sock.close()
        assert seen == [True]
        assert set(openblas_threads()) == {2}
