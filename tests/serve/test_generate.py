"""POST /v1/generate on bad sampling settings: a tiny temperature or repetition penalty samples
their limit (no 500), a seed outside 0 .. 2**64 - 1 is a 422 naming it, a prompt longer than
the context a 413."""

import pytest
from fastapi.testclient import TestClient

from attnkit.generation import GenerationConfig, generate_text
from attnkit.serve import LoadedModels, ServeSettings, create_app


@pytest.fixture(scope="module")
def client(gpt, gpt_dir):
    models = LoadedModels(gpt=gpt, folders={"gpt": str(gpt_dir)})
    with TestClient(create_app(ServeSettings(max_new_tokens=20), models=models)) as c:
        yield c


@pytest.mark.parametrize("settings", [{"temperature": 1e-45}, {"temperature": 1e-300, "top_k": 5}])
def test_a_tiny_temperature_answers_the_greedy_text(client, gpt, settings):
    (greedy,) = generate_text(gpt, None, ["the cat"], GenerationConfig(max_new_tokens=10))
    r = client.post("/v1/generate", json={"prompt": "the cat", "max_new_tokens": 10, **settings})
    assert r.status_code == 200, r.text
    assert r.json()["text"] == greedy.text


def test_a_tiny_repetition_penalty_is_not_an_error(client):
    body = {"prompt": "the cat", "temperature": 1, "repetition_penalty": 1e-40}
    r = client.post("/v1/generate", json=body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("seed", [-1, 2**64, 10**23])
def test_a_seed_out_of_range_is_named(client, seed):
    r = client.post("/v1/generate", json={"prompt": "hi", "temperature": 1, "seed": seed})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["message"] == (
        f"seed: expected an integer from 0 to 2**64 - 1, got {seed}"
    )


def test_a_prompt_longer_than_the_context_is_named(client, gpt):
    prompt = "the king " * 30
    n = len(gpt.tokenizer.encode(prompt))
    r = client.post("/v1/generate", json={"prompt": prompt, "max_new_tokens": 5})
    assert r.status_code == 413, r.text
    assert r.json()["error"]["message"] == (
        f"prompt: {n} tokens; with max_new_tokens=5 at most 92 fit the model's context of 96 tokens"
    )
