"""Which GPT `attnkit serve` loads: the shipped one by default when it is installed (none,
with /v1/generate answering 503, when it is not), a folder that is given, or none at all
with ``--gpt-model none``."""

from __future__ import annotations

import logging
import re

import pytest

from attnkit import pretrained
from attnkit.cli import build_parser
from attnkit.serve import DEFAULT, ServeSettings, load_models

# Only the GPT: the other models are left out so that each load takes a moment.
NO_OTHERS = {"translation_model": None, "bert_model": None}


def _ship(monkeypatch, folder) -> None:
    monkeypatch.setattr(pretrained, "shipped_gpt_dir", lambda: folder)


def test_the_default_gpt_is_the_shipped_one(gpt_dir, gpt, monkeypatch):
    import torch

    _ship(monkeypatch, gpt_dir)
    assert ServeSettings().gpt_model == DEFAULT
    models = load_models(ServeSettings(**NO_OTHERS))
    assert models.describe() == {"translation": None, "bert": None, "gpt": str(gpt_dir)}
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(models.gpt(ids).logits, gpt(ids).logits)


def test_without_a_shipped_gpt_none_is_loaded_and_the_log_says_why(tmp_path, monkeypatch, caplog):
    _ship(monkeypatch, tmp_path / "shakespeare_gpt")
    with caplog.at_level(logging.INFO, logger="attnkit.serve.loading"):
        models = load_models(ServeSettings(**NO_OTHERS))
    assert models.gpt is None and models.describe()["gpt"] is None
    assert "no GPT model: the shipped one is not installed" in caplog.text
    assert str(tmp_path / "shakespeare_gpt") in caplog.text


def test_none_leaves_the_shipped_gpt_out(gpt_dir, monkeypatch):
    _ship(monkeypatch, gpt_dir)
    assert load_models(ServeSettings(gpt_model=None, **NO_OTHERS)).gpt is None


def test_a_given_folder_must_load_even_with_a_shipped_gpt(gpt_dir, tmp_path, monkeypatch):
    _ship(monkeypatch, gpt_dir)
    with pytest.raises(ValueError, match=re.escape(str(tmp_path))):
        load_models(ServeSettings(gpt_model=tmp_path, **NO_OTHERS))


@pytest.mark.parametrize(
    ("flags", "expected"),
    [([], DEFAULT), (["--gpt-model", "none"], None), (["--gpt-model", "g2"], "g2")],
)
def test_gpt_model_flag(flags, expected):
    assert build_parser().parse_args(["serve", *flags]).gpt_model == expected


@pytest.mark.parametrize("dtype", ["auto", "float32", "bfloat16"])
def test_dtype_setting_is_the_translation_models_dtype(dtype):
    """--dtype float32 gives answers that never depend on other requests (a batch is shared);
    auto is what `attnkit translate` takes by default."""
    import torch

    from attnkit.hardware import fast_inference_dtype

    models = load_models(ServeSettings(dtype=dtype, gpt_model=None, bert_model=None))
    want = fast_inference_dtype(torch.device("cpu")) if dtype == "auto" else getattr(torch, dtype)
    assert {p.dtype for p in models.translation.model.parameters()} == {want}


def test_dtype_flag_and_its_choices():
    from attnkit.cli.commands import serve as serve_command
    from attnkit.serve.settings import DTYPES

    assert serve_command.DTYPES == DTYPES
    assert build_parser().parse_args(["serve"]).dtype == "auto"
    assert build_parser().parse_args(["serve", "--dtype", "float32"]).dtype == "float32"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--dtype", "float16"])


def test_help_names_the_shipped_default(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "without --gpt-model, the shipped Shakespeare GPT when it is installed" in help_text
    assert "'none' = no generation (default: the shipped Shakespeare GPT if installed)" in help_text


def test_serve_refuses_to_serve_no_model(capsys):
    """Before: a server started whose every endpoint answered 503, without a word."""
    from attnkit.cli import main

    flags = ["--translation-model", "none", "--gpt-model", "none", "--bert-model", "none"]
    assert main(["serve", *flags, "--port", "0"]) == 2
    assert capsys.readouterr().err == (
        "attnkit serve: error: --translation-model, --gpt-model, --bert-model: all 'none', so "
        "every endpoint would answer 503; keep at least one model\n"
    )
