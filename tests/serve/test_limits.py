"""attnkit.serve.limits (and errors): every limit answers 413 or 422 with JSON naming the field,
the value and the limit; bad JSON, unknown fields and unknown routes are JSON errors too."""

import socket

import pytest
from fastapi.testclient import TestClient

from attnkit.serve import ServeSettings, create_app
from tests.helpers.serve import ThreadedServer

LIMITS = ServeSettings(
    max_texts=3, max_queue=8, max_tokens_per_text=10, max_body_bytes=2000, max_beam=5,
    max_new_tokens=20,
)  # fmt: skip


@pytest.fixture(scope="module")
def app(models):
    return create_app(LIMITS, models=models)


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app) as c:
        yield c


def error(response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()["error"]
    assert body["status"] == status and body["type"]
    return body["message"]


LONG = "Ein sehr langer Satz mit vielen vielen Wörtern, der nicht passt."


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("/v1/translate", {"texts": ["a", "b", "c", "d"]}, 413,
         "texts: 4 items, more than the limit of 3 per request"),
        ("/v1/translate", {"texts": ["Hallo.", LONG]}, 413, "texts[1]: "),
        ("/v1/translate", {"texts": ["a"], "beam": 6}, 422,
         "beam: expected 1 to 5 (the server's max_beam), got 6"),
        ("/v1/translate", {"texts": ["a"], "beam": 0}, 422, "beam: Input should be greater than or equal to 1"),
        ("/v1/translate", {"texts": []}, 422, "texts: List should have at least 1 item"),
        ("/v1/translate", {"texts": ["a", 3]}, 422, "texts[1]: Input should be a valid string"),
        ("/v1/translate", {"text": ["a"]}, 422, "text: Extra inputs are not permitted"),
        ("/v1/embed", {"texts": ["a"] * 4}, 413, "texts: 4 items, more than the limit of 3"),
        ("/v1/embed", {"texts": ["ok", "one two three four five six seven eight nine ten eleven"]},
         413, "texts[1]: 11 tokens, more than the limit of 10 tokens per text"),
        ("/v1/attention", {"text": LONG}, 413, "text: "),
        ("/v1/attention", {"text": "Hallo.", "target": LONG}, 413, "target: "),
        ("/v1/attention", {"text": "Hallo.", "beam": 9}, 422, "beam: expected 1 to 5 (the server's max_beam), got 9"),
        ("/v1/generate", {"prompt": "hi", "max_new_tokens": 21}, 422,
         "max_new_tokens: expected 1 to 20 (the server's limit, and the model's context of 96"),
        ("/v1/generate", {"prompt": "hi", "temperature": 0, "top_k": 3}, 422,
         "they only apply when sampling"),
        ("/v1/generate", {"prompt": "hi", "stop": [""]}, 422, "stop[0]: expected non-empty text"),
        ("/v1/generate", {"prompt": "hi", "top_p": 0}, 422, "top_p: Input should be greater than 0"),
        ("/v1/generate", {"prompt": "the cat " * 40, "max_new_tokens": 20}, 413,
         "with max_new_tokens=20 at most 77 fit the model's context of 96 tokens"),
    ],
)  # fmt: skip
def test_limits_name_the_problem(client, path, body, status, message):
    assert message in error(client.post(path, json=body), status)


@pytest.mark.parametrize(
    "path, body, message",
    [
        ("/v1/translate", {"texts": ["a"], "beam": True}, "beam: Input should be a valid integer"),
        ("/v1/translate", {"texts": ["a"], "beam": "5"}, "beam: Input should be a valid integer"),
        ("/v1/translate", {"texts": ["a"], "beam": 3.0}, "beam: Input should be a valid integer"),
        ("/v1/embed", {"texts": ["a"], "normalize": "yes"}, "normalize: Input should be a valid boolean"),
        ("/v1/attention", {"text": "Hallo.", "html": "on"}, "html: Input should be a valid boolean"),
        ("/v1/attention", {"text": "Hallo.", "html": 1}, "html: Input should be a valid boolean"),
        ("/v1/generate", {"prompt": "hi", "stream": "yes"}, "stream: Input should be a valid boolean"),
        ("/v1/generate", {"prompt": "hi", "stream": 1}, "stream: Input should be a valid boolean"),
        ("/v1/generate", {"prompt": "hi", "max_new_tokens": "3"}, "max_new_tokens: Input should be a valid integer"),
        ("/v1/generate", {"prompt": "hi", "temperature": "0.5"}, "temperature: Input should be a valid number"),
        ("/v1/generate", {"prompt": "hi", "seed": 1.5}, "seed: Input should be a valid integer"),
    ],
)  # fmt: skip
def test_a_value_of_another_json_type_is_refused_not_converted(client, path, body, message):
    assert message in error(client.post(path, json=body), 422)


def test_an_integer_is_a_number(client):
    # JSON has one number type: 1 where a float is expected is 1.0 (JavaScript writes 1.0 as 1)
    body = {"prompt": "hi", "temperature": 1, "top_p": 1, "max_new_tokens": 2, "seed": 3}
    response = client.post("/v1/generate", json=body)
    assert response.status_code == 200, response.text


def test_token_limit_counts_the_tokens(client, translation):
    n = len(translation.tokenizer.encode(LONG))
    assert n > 10
    message = error(client.post("/v1/translate", json={"texts": ["Hallo.", LONG]}), 413)
    assert message == f"texts[1]: {n} tokens, more than the limit of 10 tokens per text"


def test_body_size_limit_by_content_length(client):
    message = error(client.post("/v1/translate", json={"texts": ["x" * 3000]}), 413)
    assert "request body: 3" in message and "more than the limit of 2000 bytes" in message


def test_body_size_limit_without_content_length(models):
    """A chunked body has no Content-Length: it is counted as it comes."""
    app = create_app(LIMITS, models=models)
    with ThreadedServer(app) as server, socket.create_connection(("127.0.0.1", server.port)) as s:
        chunk = b'{"texts": ["' + b"x" * 1500
        s.sendall(
            b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(chunk), chunk) * 2
        )
        s.settimeout(60)
        answer = b""
        while b"}}" not in answer:
            data = s.recv(65536)
            if not data:
                break
            answer += data
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    sent = 2 * len(chunk)  # the second chunk takes it over the limit
    assert b"request body: at least %d bytes, more than the limit of 2000 bytes" % sent in answer


def test_malformed_json_and_unknown_routes(client):
    bad = client.post(
        "/v1/translate", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert error(bad, 422) == (
        "body: not valid JSON at character 1 (Expecting property name enclosed in double quotes)"
    )
    assert error(client.get("/v1/nothing"), 404) == "no such endpoint: GET /v1/nothing"
    assert error(client.get("/v1/translate"), 405) == "GET is not allowed on /v1/translate"


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"max_texts": 10, "max_queue": 5}, "expected max_texts <= max_queue"),
        ({"batch_tokens": 0}, "batch_tokens: expected an integer >= 1, got 0"),
        ({"max_wait_ms": -1}, "max_wait_ms: expected a finite number >= 0, got -1"),
        ({"dtype": "float16"}, "dtype: expected one of auto, float32, bfloat16, got 'float16'"),
    ],
)
def test_bad_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        ServeSettings(**settings)


@pytest.mark.parametrize(
    "headers, message",
    [
        ({}, "no Content-Type"),  # curl -d's default is form data, not JSON
        ({"content-type": "text/plain"}, "Content-Type: text/plain"),
    ],
)
def test_json_sent_without_its_content_type_is_told_so(client, headers, message):
    """Before: 'body: Input should be a valid dictionary ... (got b'{...}')' for valid JSON."""
    bad = client.post("/v1/translate", content=b'{"texts": ["Ein Hund."]}', headers=headers)
    assert error(bad, 422) == (
        f"body: expected JSON with the header Content-Type: application/json, got {message}"
    )


def test_a_body_that_is_not_utf8_is_named(client):
    """Before: 400 'There was an error parsing the body'; 422 as any body that is not JSON."""
    bad = client.post(
        "/v1/translate",
        content=b'{"texts": ["\xff"]}',
        headers={"content-type": "application/json"},
    )
    assert error(bad, 422) == (
        "body: not UTF-8 (byte 0xff at offset 12); JSON must be sent as UTF-8"
    )


@pytest.mark.parametrize(
    "content, message",
    [
        (b"[" * 100_000 + b"]" * 100_000, "body: JSON nested too deeply to parse"),
        (
            b'{"texts": ["a"], "beam": ' + b"9" * 5000 + b"}",
            "body: not valid JSON here (an integer with more than 4,300 digits)",
        ),
    ],
    ids=["nested", "long-integer"],
)
def test_json_python_cannot_parse_is_named_with_the_status_of_bad_json(models, content, message):
    """Before: 400 'body: the request body could not be parsed', where a body whose JSON does
    not parse answers 422. (The default body limit, 1 MiB, lets these bodies through.)"""
    with TestClient(create_app(ServeSettings(), models=models)) as client:
        bad = client.post(
            "/v1/translate", content=content, headers={"content-type": "application/json"}
        )
    assert error(bad, 422).startswith(message)


@pytest.mark.parametrize(
    "path, body, where",
    [
        ("/v1/translate", b'{"texts": ["ok", "ein \\udc80 hund"]}', "texts[1]"),
        ("/v1/embed", b'{"texts": ["a \\udc80"]}', "texts[0]"),
        ("/v1/attention", b'{"text": "a \\udc80"}', "text"),
        ("/v1/generate", b'{"prompt": "a \\udc80", "max_new_tokens": 2}', "prompt"),
        ("/v1/generate", b'{"prompt": "a", "stop": ["\\udc80"]}', "stop[0]"),
    ],
)
def test_text_that_is_not_utf8_is_named(client, path, body, where):
    """JSON's \\udc80 escape decodes to a lone surrogate; the tokenizers raised an internal
    error on it (500)."""
    bad = client.post(path, content=body, headers={"content-type": "application/json"})
    message = error(bad, 422)
    # pydantic refuses it itself where the field has a length constraint ("unable to parse
    # raw data as a unicode string"); attnkit's validator elsewhere
    assert message.startswith(f"{where}: ")
    assert "not valid UTF-8 text (a lone surrogate U+DC80 at character" in message or (
        "unicode" in message
    )


@pytest.mark.parametrize(
    "body, message",
    [
        (b'{"prompt": "hi", "temperature": Infinity}', "temperature: expected a finite number, got inf"),
        (b'{"prompt": "hi", "repetition_penalty": Infinity}', "repetition_penalty: expected a finite number, got inf"),
    ],
)  # fmt: skip
def test_a_non_finite_setting_is_named_alone(client, body, message):
    """Before: 'temperature, repetition_penalty: expected finite numbers' for either."""
    bad = client.post("/v1/generate", content=body, headers={"content-type": "application/json"})
    assert error(bad, 422) == message
