"""`attnkit serve` as a process: SIGTERM drains (the request in flight completes, new ones are
refused, exit status 0), and start-up errors are one clear line."""

import signal
import socket
import subprocess
import sys
import threading
from dataclasses import replace

import httpx
import torch

from attnkit.decoding import Translator, load_translation_model, model_decoding
from attnkit.hardware import fast_inference_dtype
from tests.helpers.serve import DEADLINE, ServeProcess, parse_metric, wait_until

TEXTS = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]


def test_sigterm_drains_in_flight_requests_and_refuses_new_ones():
    # The request waits in the batcher for companions (a minute): it is in flight, for sure,
    # when SIGTERM comes; the drain must run it at once instead.
    server = ServeProcess("--bert-model", "none", "--max-wait-ms", "60000")
    try:
        wait_until(lambda: _ready(server.url), "/readyz")
        answer = {}

        def slow_request():
            with httpx.Client(base_url=server.url, timeout=DEADLINE) as http:
                answer["r"] = http.post("/v1/translate", json={"texts": TEXTS, "beam": 2})

        worker = threading.Thread(target=slow_request)
        worker.start()
        wait_until(lambda: _queued(server.url) == len(TEXTS), "the request to be queued")
        server.proc.send_signal(signal.SIGTERM)
        worker.join(DEADLINE)
        assert answer["r"].status_code == 200, answer["r"].text
        # The server's model: its dtype is fast_inference_dtype's (bfloat16 on a CPU with native
        # bfloat16 products), so a float32 reference could part from it at a near-tie.
        translation = load_translation_model(None, dtype=fast_inference_dtype(torch.device("cpu")))
        config = replace(model_decoding(translation.path), beam_size=2)  # the server's
        expected = Translator(translation.model, translation.tokenizer, config)
        assert answer["r"].json()["translations"] == expected.translate(TEXTS).translations
        # New requests: the port is closed (or, for a moment, they get 503).
        try:
            late = httpx.post(f"{server.url}/v1/translate", json={"texts": TEXTS}, timeout=DEADLINE)
        except httpx.TransportError:
            pass
        else:
            assert late.status_code == 503 and "shutting down" in late.text
        assert server.proc.wait(DEADLINE) == 0, "".join(server.log)
        with socket.socket() as s:
            port = int(server.url.rsplit(":", 1)[1])
            assert s.connect_ex(("127.0.0.1", port)) != 0  # refused
        log = "".join(server.log)
        assert "draining" in log and "Application shutdown complete" in log
    finally:
        server.stop()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=DEADLINE).status_code == 200
    except httpx.TransportError:
        return False


def _queued(url: str) -> float | None:
    text = httpx.get(f"{url}/metrics", timeout=DEADLINE).text
    return parse_metric(text, "attnkit_queue_depth", model="translation")


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnkit", "serve", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


def test_busy_port_and_bad_folder_are_one_line_errors(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _serve("--port", str(port), "--bert-model", "none")
    assert done.returncode == 2
    assert f"attnkit serve: error: --host/--port: cannot listen on 127.0.0.1:{port}" in done.stderr
    done = _serve("--port", "0", "--translation-model", str(tmp_path), "--bert-model", "none")
    assert done.returncode == 2 and "attnkit serve: error:" in done.stderr
    assert str(tmp_path) in done.stderr and "Traceback" not in done.stderr


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
