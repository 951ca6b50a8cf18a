"""The shipped GPT (issue 16): ``src/attnkit/pretrained/shakespeare_gpt``, declared as package
data, present and within the 25 MB cap; its recorded validation metric is what `attnkit
evaluate --text` gives on the validation text; `attnkit generate` and `attnkit serve` use it
when no model is named.

These tests need the shipped weights: when the folder is declared but missing they fail,
saying how to ship it (``scripts/ship_model.py``); they never skip.
"""

from __future__ import annotations

import importlib.resources
import json
import tomllib
from pathlib import Path

import pytest

from attnkit import pretrained
from attnkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DATA = "pretrained/shakespeare_gpt/*"
MAX_BYTES = 25 * 10**6  # the cap: "at most 25 MB"
SHIP = (
    "python scripts/ship_model.py --run RUN --out src/attnkit/pretrained/shakespeare_gpt "
    "(RUN: the Shakespeare GPT run, e.g. runs/shakespeare_bpe)"
)


@pytest.fixture(scope="module")
def shipped() -> Path:
    """The shipped GPT's folder; fails (never skips) when it is declared but not there."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    declared = config["tool"]["setuptools"]["package-data"]["attnkit"]
    assert PACKAGE_DATA in declared, f"pyproject.toml: package-data lacks {PACKAGE_DATA!r}"
    folder = pretrained.default_gpt_dir()
    if folder is None:
        pytest.fail(
            f"the shipped GPT is declared as package data ({PACKAGE_DATA}) but missing: no "
            f"model.safetensors in {pretrained.shipped_gpt_dir()}; ship it with: {SHIP}",
            pytrace=False,
        )
    return folder


@pytest.fixture(scope="module")
def provenance(shipped) -> dict:
    path = shipped / "provenance.json"
    assert path.is_file(), f"{path}: missing; the shipped GPT carries its record ({SHIP})"
    return json.loads(path.read_text(encoding="utf-8"))


def test_folder_is_a_complete_gpt_within_the_cap(shipped):
    names = {p.name for p in shipped.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "provenance.json"} <= names
    size = sum(p.stat().st_size for p in shipped.iterdir())
    assert size <= MAX_BYTES, f"{shipped}: {size:,} bytes, more than {MAX_BYTES:,}"
    config = json.loads((shipped / "config.json").read_text(encoding="utf-8"))
    assert config["model_type"] == "gpt2"


def test_recorded_val_metric_is_what_evaluate_gives(shipped, provenance, capsys):
    """`attnkit evaluate --model SHIPPED --text val.txt.gz` against provenance.json's "val"
    (computed by scripts/ship_model.py on the shipped files, possibly on another processor:
    hence a relative tolerance of 1e-6; AVX2 against AVX-512 differs by about 1e-8)."""
    from attnkit.data.corpus import load_named_text

    recorded = provenance["val"]
    assert recorded["text"] == "shakespeare val"  # the whole validation text, nothing else
    val = importlib.resources.files("attnkit.data") / "shakespeare" / "val.txt.gz"
    with importlib.resources.as_file(val) as path:
        argv = ["evaluate", "--model", str(shipped), "--text", str(path), "--json"]
        assert main(argv) == 0, capsys.readouterr().err
    measured = json.loads(capsys.readouterr().out)
    assert measured["characters"] == recorded["characters"]
    assert measured["characters"] == len(load_named_text("shakespeare", "val"))
    assert measured["tokens"] == recorded["tokens"]
    assert measured["nats_per_char"] == pytest.approx(recorded["nats_per_char"], rel=1e-6)
    assert measured["bits_per_char"] == pytest.approx(recorded["bits_per_char"], rel=1e-6)
    (chosen,) = [
        c
        for c in provenance["selection"]["candidates"]
        if c["checkpoint"] == provenance["checkpoint"]
    ]
    others = provenance["selection"]["candidates"]
    assert chosen["val_nats_per_char"] == min(c["val_nats_per_char"] for c in others)


def test_generate_without_model_uses_it(shipped, capsys):
    outputs = []
    for model in ([], ["--model", str(shipped)]):
        argv = ["generate", *model, "ROMEO.", "--max-new-tokens", "12", "--json"]
        assert main(argv) == 0, capsys.readouterr().err
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1] and len(outputs[0]["token_ids"]) > 0


def test_serve_loads_it_by_default(shipped):
    from attnkit.serve import ServeSettings, load_models

    models = load_models(ServeSettings(translation_model=None, bert_model=None))
    assert models.gpt is not None and models.describe()["gpt"] == str(shipped)


def test_from_pretrained_none_is_the_shipped_gpt(shipped, tmp_path, monkeypatch):
    """Before: a pathlib TypeError; load_translation_model(None) and BertModel's None already
    meant the packaged model."""
    import torch

    from attnkit.models import GPT

    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(
            GPT.from_pretrained(None)(ids).logits, GPT.from_pretrained(shipped)(ids).logits
        )
    monkeypatch.setattr(pretrained, "shipped_gpt_dir", lambda: tmp_path / "shakespeare_gpt")
    with pytest.raises(
        ValueError, match=r"^folder: None is the shipped Shakespeare GPT, which is not installed"
    ):
        GPT.from_pretrained(None)
