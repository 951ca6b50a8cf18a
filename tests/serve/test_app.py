"""attnkit.serve.app: every endpoint against its offline reference, batching under concurrency,
a full queue, readiness while draining, and the metrics.

References are computed offline with the library (Translator, BertModel.encode,
capture_translation, generate_text), never through the server.
"""

import asyncio
import re
import threading
from dataclasses import replace

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from attnkit.data import load_named_corpus
from attnkit.decoding import Translator, model_decoding
from attnkit.generation import GenerationConfig, generate_text
from attnkit.serve import LoadedModels, ServeSettings, create_app
from attnkit.viz import capture_translation
from tests.helpers.serve import (
    DEADLINE,
    ThreadedServer,
    metric,
    parse_metric,
    sse_events,
    wait_until,
)

SENTENCE = "Ein Mann fährt Fahrrad."


def offline(translation, texts, beam):
    """What `attnkit translate --beam BEAM` gives: the model's search settings, this beam."""
    config = replace(model_decoding(translation.path), beam_size=beam)
    return (
        Translator(translation.model, translation.tokenizer, config).translate(texts).translations
    )


@pytest.fixture(scope="module")
def sentences():
    """32 different test2016 sentences."""
    corpus = load_named_corpus("multi30k", split="test2016", src_lang="de", tgt_lang="en")
    chosen = list(dict.fromkeys(corpus.src[:40]))[:32]
    assert len(chosen) == 32
    return chosen


@pytest.fixture(scope="module")
def client(models):
    with TestClient(create_app(ServeSettings(), models=models)) as c:
        yield c


# --------------------------------------------------------------------------- endpoints


def test_translate_equals_offline_translation(client, translation):
    texts = [SENTENCE, "", "  Zwei   Hunde spielen\tim Schnee. ", "Ein Hund rennt."]
    r = client.post("/v1/translate", json={"texts": texts, "beam": 3})
    assert r.status_code == 200, r.text
    assert r.json()["translations"] == offline(translation, texts, 3)
    assert r.json()["translations"][1] == "" and r.json()["beam"] == 3


def test_embed_equals_the_model(client, bert):
    texts = ["A man is riding a bicycle.", "Someone rides a bike.", "A cat sleeps."]
    r = client.post("/v1/embed", json={"texts": texts})
    assert r.status_code == 200, r.text
    got = torch.tensor(r.json()["embeddings"])
    torch.testing.assert_close(got, bert.encode(texts), atol=1e-5, rtol=0)
    assert r.json()["dimension"] == 384 and r.json()["normalized"] is True
    raw = client.post("/v1/embed", json={"texts": texts[:1], "normalize": False}).json()
    assert raw["normalized"] is False
    expected = bert.encode(texts[:1], normalize=False)
    torch.testing.assert_close(torch.tensor(raw["embeddings"]), expected, atol=1e-4, rtol=1e-5)


def test_attention_equals_the_capture(client, translation):
    r = client.post("/v1/attention", json={"text": SENTENCE, "beam": 2, "html": True})
    assert r.status_code == 200, r.text
    data = r.json()
    maps = capture_translation(
        translation.model, translation.tokenizer, SENTENCE, beam=2,
        search=model_decoding(translation.path),
    )  # fmt: skip
    assert data["target"] == maps.target == offline(translation, [SENTENCE], 2)[0]
    assert [k["id"] for k in data["kinds"]] == ["encoder", "decoder", "cross"]
    for kind in data["kinds"]:
        rows, cols = maps.axes(kind["id"])
        assert (kind["rows"], kind["cols"]) == (rows, cols)
        got = torch.tensor(kind["layers"], dtype=torch.float64)  # (L, H, T_q, T_k)
        expected = torch.stack(maps.layers(kind["id"])).double()
        torch.testing.assert_close(got, expected, atol=5e-5, rtol=0)
    page = data["viewer_html"]
    assert page.startswith("<!DOCTYPE html>") and '"initial":{"kind":"cross"' in page


def test_attention_of_bert_and_bad_combinations(client):
    r = client.post("/v1/attention", json={"text": "The cat sat.", "model": "bert"})
    assert r.status_code == 200, r.text
    assert r.json()["model_type"] == "bert" and r.json()["kinds"][0]["rows"][0] == "[CLS]"
    r = client.post("/v1/attention", json={"text": "x", "model": "bert", "target": "y"})
    assert r.status_code == 422 and "target: only for model='translation'" in r.text


@pytest.mark.parametrize(
    "settings",
    [{"max_new_tokens": 20}, {"max_new_tokens": 15, "temperature": 0.8, "top_k": 20, "seed": 4}],
)
def test_generate_equals_generate_text_json_and_stream(client, gpt, settings):
    prompt = "the cat"
    config = GenerationConfig(**settings)
    (expected,) = generate_text(gpt, None, [prompt], config)
    r = client.post("/v1/generate", json={"prompt": prompt, **settings})
    assert r.status_code == 200, r.text
    assert r.json()["text"] == expected.text and r.json()["prompt"] == prompt
    r = client.post("/v1/generate", json={"prompt": prompt, "stream": True, **settings})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    pieces = [data["text"] for name, data in events if name == "message"]
    assert events[-1] == ("done", {"text": expected.text})
    assert "".join(pieces) == expected.text and len(pieces) > 1  # streamed in pieces


def test_health_readiness_and_openapi(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    assert set(ready.json()["models"]) == {"translation", "bert", "gpt"}
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/translate", "/v1/embed", "/v1/attention", "/v1/generate", "/metrics"):
        assert path in paths
    docs = client.get("/docs").text  # the OpenAPI page, from the package's files, no CDN
    assert "http" not in docs.replace("/openapi.json", "") and "swagger-ui-bundle.js" in docs
    for url in re.findall(r"(?:src|href)=['\"]?(/[^'\" >]+)", docs):
        assert client.get(url).status_code == 200, url


def test_metrics_count_requests_latencies_and_batches(models):
    with TestClient(create_app(ServeSettings(), models=models)) as c:
        for _ in range(3):
            assert c.post("/v1/translate", json={"texts": [SENTENCE], "beam": 1}).status_code == 200
        c.post("/v1/translate", json={"texts": [SENTENCE], "beam": 99})
        text = c.get("/metrics").text
    assert parse_metric(text, "attnkit_requests_total", endpoint="/v1/translate", status="200") == 3
    assert parse_metric(text, "attnkit_requests_total", endpoint="/v1/translate", status="422") == 1
    assert parse_metric(text, "attnkit_request_seconds_count", endpoint="/v1/translate") == 4
    assert parse_metric(text, "attnkit_batch_size_count", model="translation") == 3
    assert parse_metric(text, "attnkit_batch_size_sum", model="translation") == 3
    assert parse_metric(text, "attnkit_queue_depth", model="translation") == 0
    assert parse_metric(text, "attnkit_in_flight_requests") == 1  # this /metrics request


def test_models_that_are_not_loaded_answer_503_naming_them():
    with TestClient(create_app(ServeSettings(), models=LoadedModels())) as c:
        for path, body, name, flag in [
            ("/v1/translate", {"texts": ["a"]}, "translation", "--translation-model"),
            ("/v1/embed", {"texts": ["a"]}, "BERT", "--bert-model"),
            ("/v1/generate", {"prompt": "a"}, "GPT", "--gpt-model"),
            ("/v1/attention", {"text": "a"}, "translation", "--translation-model"),
        ]:
            r = c.post(path, json=body)
            assert r.status_code == 503, (path, r.text)
            message = r.json()["error"]["message"]
            assert message.startswith(f"no {name} model is loaded; start the server with {flag}")
        assert c.get("/readyz").json()["models"] == {"translation": None, "bert": None, "gpt": None}


# --------------------------------------------------------------------------- batching


def test_concurrent_requests_are_batched_and_each_gets_its_own(models, translation, sentences):
    """32 clients at once on a real server: one model batch (its budget is exactly their
    tokens, so it closes when the last arrives), and every answer is its own sentence's."""
    beam = 2
    tokens = sum(len(ids) for ids in Translator(translation.model, translation.tokenizer)
                 .encode(sentences)[0])  # fmt: skip
    settings = ServeSettings(batch_tokens=tokens, max_wait_ms=DEADLINE * 1000)
    app = create_app(settings, models=models)
    expected = offline(translation, sentences, beam)

    async def clients(url):
        async with httpx.AsyncClient(base_url=url, timeout=DEADLINE) as http:
            calls = [
                http.post("/v1/translate", json={"texts": [s], "beam": beam}) for s in sentences
            ]
            return await asyncio.gather(*calls)

    with ThreadedServer(app) as server:
        answers = asyncio.run(clients(server.url))
    assert [r.status_code for r in answers] == [200] * 32
    assert [r.json()["translations"] for r in answers] == [[e] for e in expected]
    assert metric(app, "attnkit_batch_size_count", model="translation") == 1
    assert metric(app, "attnkit_batch_size_sum", model="translation") == 32


def test_multi_text_requests_and_different_beams_under_concurrency(models, translation, sentences):
    app = create_app(ServeSettings(max_wait_ms=50), models=models)
    requests = [(sentences[i : i + 1 + i % 4], 1 + i % 3) for i in range(0, 24, 2)]

    async def clients(url):
        async with httpx.AsyncClient(base_url=url, timeout=DEADLINE) as http:
            calls = [http.post("/v1/translate", json={"texts": t, "beam": b}) for t, b in requests]
            return await asyncio.gather(*calls)

    with ThreadedServer(app) as server:
        answers = asyncio.run(clients(server.url))
    for (texts, beam), r in zip(requests, answers, strict=True):
        assert r.status_code == 200, r.text
        assert r.json()["translations"] == offline(translation, texts, beam), (texts, beam)


def test_full_queue_answers_503_with_retry_after(models, translation):
    """A request waits in the queue for companions (an hour); the queue holds 4 texts; the
    next request is refused, then a drain lets the first one finish."""
    settings = ServeSettings(max_queue=4, max_texts=4, max_wait_ms=3_600_000)
    app = create_app(settings, models=models)
    texts = [SENTENCE, "Ein Hund rennt.", "Zwei Kinder spielen.", "Eine Frau liest."]
    with TestClient(app) as c:
        first = {}
        worker = threading.Thread(
            target=lambda: first.update(r=c.post("/v1/translate", json={"texts": texts}))
        )
        worker.start()
        wait_until(lambda: metric(app, "attnkit_queue_depth", model="translation") == 4, "queue")
        r = c.post("/v1/translate", json={"texts": ["Noch einer."]})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "translation queue is full" in r.json()["error"]["message"]
        assert metric(app, "attnkit_rejected_total", model="translation") == 1
        app.state.attnkit.begin_drain()
        worker.join(DEADLINE)
        assert first["r"].status_code == 200
        assert first["r"].json()["translations"] == offline(translation, texts, 5)


def test_draining_refuses_new_requests_and_is_not_ready(models):
    app = create_app(ServeSettings(), models=models)
    with TestClient(app) as c:
        assert c.get("/readyz").status_code == 200
        app.state.attnkit.begin_drain()
        ready = c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["draining"] is True
        r = c.post("/v1/translate", json={"texts": [SENTENCE]})
        assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
        assert c.get("/healthz").status_code == 200 and c.get("/metrics").status_code == 200


def test_requests_without_a_beam_use_the_models_search_settings(tmp_path):
    """The server translates as `attnkit translate` does: the folder's stored search settings
    (here a 2-token limit and beam 3), a request's beam overriding only the beam."""
    from attnkit.decoding import DecodingConfig, load_translation_model, save_translation_model
    from tests.helpers.viz import build_translation_model

    plain = load_translation_model(build_translation_model(tmp_path / "plain"))
    stored = DecodingConfig(beam_size=3, max_len_a=0.0, max_len_b=2)
    folder = save_translation_model(
        tmp_path / "tuned", plain.model, plain.tokenizer, decoding=stored
    )
    tuned = load_translation_model(folder)
    texts = [SENTENCE, "Zwei Hunde spielen im Schnee."]
    with TestClient(create_app(ServeSettings(), models=LoadedModels(tuned))) as c:
        r = c.post("/v1/translate", json={"texts": texts})
        assert r.status_code == 200, r.text
        assert r.json()["beam"] == 3
        assert r.json()["translations"] == offline(tuned, texts, 3)
        assert all(len(tuned.tokenizer.encode(t)) <= 2 for t in r.json()["translations"])
        r = c.post("/v1/translate", json={"texts": texts, "beam": 1})
        assert (r.json()["beam"], r.json()["translations"]) == (1, offline(tuned, texts, 1))
        r = c.post("/v1/attention", json={"text": SENTENCE})
        assert r.status_code == 200, r.text
        assert r.json()["target"] == offline(tuned, [SENTENCE], 3)[0]
    untuned = Translator(plain.model, plain.tokenizer, DecodingConfig(beam_size=3))
    assert any(len(plain.tokenizer.encode(t)) > 2 for t in untuned.translate(texts).translations)
