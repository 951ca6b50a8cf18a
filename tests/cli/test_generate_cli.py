"""`attnkit generate` end to end on a tiny random GPT-2 folder with a byte-level BPE."""

from __future__ import annotations

import io
import json
import sys

import pytest

from attnkit.cli import main
from attnkit.generation import GenerationConfig, generate_text
from attnkit.models import GPT
from tests.helpers.generation import byte_bpe, load_pair

PROMPTS = ["hello world", "你好 😀", "the cat sat"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2_cli")
    load_pair(folder, byte_bpe())
    return folder


@pytest.fixture(scope="module")
def gpt(model_dir):
    return GPT.from_pretrained(model_dir)


def _stdin(monkeypatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8"))


def _expected(gpt, prompts, **settings):
    return generate_text(gpt, None, prompts, GenerationConfig(**settings))


def test_prompt_argument_greedy(model_dir, gpt, capsys):
    assert main(["generate", "--model", str(model_dir), PROMPTS[0], "--max-new-tokens", "12"]) == 0
    (result,) = _expected(gpt, PROMPTS[:1], max_new_tokens=12)
    assert capsys.readouterr().out == PROMPTS[0] + result.text + "\n"


def test_stdin_json_with_ids_and_logprobs(model_dir, gpt, monkeypatch, capsys):
    _stdin(monkeypatch, "\n".join(PROMPTS) + "\n")
    argv = ["generate", "--model", str(model_dir), "--json", "--max-new-tokens", "8",
            "--temperature", "0.7", "--top-p", "0.9", "--seed", "3", "--batch-size", "8"]  # fmt: skip
    assert main(argv) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = _expected(
        gpt, PROMPTS, max_new_tokens=8, temperature=0.7, top_p=0.9, seed=3, logprobs=True
    )
    assert [r["prompt"] for r in records] == PROMPTS
    for record, result in zip(records, expected, strict=True):
        assert record["text"] == result.text and record["token_ids"] == result.tokens
        assert record["logprobs"] == pytest.approx(result.logprobs, abs=1e-6)
        assert record["finish_reason"] == result.finish_reason
        assert all(lp <= 0 for lp in record["logprobs"])


def test_compile_writes_the_same_json(model_dir, gpt, capsys):
    # Compiled steps, float32: the ids of eager generation and log-probabilities within 1e-5.
    argv = ["generate", "--model", str(model_dir), "--json", "--compile", "--max-new-tokens",
            "10", PROMPTS[2]]  # fmt: skip
    assert main(argv) == 0
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (result,) = _expected(gpt, PROMPTS[2:], max_new_tokens=10, logprobs=True)
    assert record["token_ids"] == result.tokens and record["text"] == result.text
    assert record["logprobs"] == pytest.approx(result.logprobs, abs=1e-5)


def test_stream_writes_the_same_text(model_dir, gpt, capsys):
    argv = ["generate", "--model", str(model_dir), PROMPTS[1], "--stream", "--max-new-tokens", "20",
            "--top-k", "10", "--seed", "1"]  # fmt: skip
    assert main(argv) == 0
    (result,) = _expected(gpt, PROMPTS[1:2], max_new_tokens=20, temperature=1.0, top_k=10, seed=1)
    assert capsys.readouterr().out == PROMPTS[1] + result.text + "\n"


def test_stop_string(model_dir, gpt, capsys):
    (free,) = _expected(gpt, PROMPTS[2:], max_new_tokens=30)
    stop = next(
        free.text[i : i + 2]
        for i in range(5, len(free.text))
        if "\ufffd" not in free.text[i : i + 2]
    )
    argv = [
        "generate",
        "--model",
        str(model_dir),
        PROMPTS[2],
        "--max-new-tokens",
        "30",
        "--stop",
        stop,
    ]
    assert main(argv) == 0
    assert capsys.readouterr().out == PROMPTS[2] + free.text[: free.text.index(stop)] + "\n"


def _exit_code(argv) -> int:
    """main's return value, or argparse's exit status for a flag it refuses."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


def _ship(monkeypatch, folder) -> None:
    """Make ``folder`` the shipped GPT's place (it may be absent)."""
    from attnkit import pretrained

    monkeypatch.setattr(pretrained, "shipped_gpt_dir", lambda: folder)


def test_without_model_the_shipped_gpt_is_used(model_dir, gpt, monkeypatch, capsys):
    _ship(monkeypatch, model_dir)
    assert main(["generate", PROMPTS[2], "--max-new-tokens", "9", "--json"]) == 0
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (expected,) = _expected(gpt, PROMPTS[2:], max_new_tokens=9)
    assert record["text"] == expected.text and record["token_ids"] == expected.tokens


def test_without_model_and_no_shipped_gpt_the_error_says_so(tmp_path, monkeypatch, capsys):
    absent = tmp_path / "shakespeare_gpt"
    _ship(monkeypatch, absent)
    assert main(["generate", "hello"]) == 2
    err = capsys.readouterr().err
    assert f"the shipped GPT is not installed (looked in {absent}); pass --model DIR" in err
    absent.mkdir()  # a folder without weights is not an installed model either
    (absent / "config.json").write_text("{}")
    assert main(["generate", "hello"]) == 2
    assert "the shipped GPT is not installed" in capsys.readouterr().err


def test_help_names_the_shipped_default(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "Without --model, the GPT shipped in attnkit/pretrained/shakespeare_gpt" in help_text
    assert "default: the shipped Shakespeare GPT" in help_text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--temperature", "-1"], "--temperature: expected a finite number >= 0"),
        (["--temperature", "nan"], "--temperature"),
        # one bound in every message (before: -0.5 was told "from 0.0 to 1.0")
        (["--top-p", "0"], "--top-p: expected a finite probability > 0 and <= 1.0, got '0'"),
        (["--top-p", "-0.5"], "--top-p: expected a finite probability > 0 and <= 1.0, got"),
        (["--top-p", "1.5"], "--top-p: expected a finite probability > 0 and <= 1.0, got"),
        (["--top-k", "-2"], "--top-k: expected an integer >= 0"),
        (["--temperature", "0", "--top-k", "5"], "--temperature 0 means greedy"),
        (["--max-new-tokens", "0"], "--max-new-tokens: expected an integer >= 1"),
        (["--max-new-tokens", "97"], "--max-new-tokens: expected at most 96"),
        (["--max-new-tokens", "96"], "max_new_tokens: the longest prompt has"),
        (["--repetition-penalty", "0"], "--repetition-penalty: expected a finite penalty > 0"),
        (["--repetition-penalty", "-1"], "--repetition-penalty: expected a finite penalty > 0"),
        (["--stop", ""], "--stop"),
        (["--batch-size", "0"], "--batch-size"),
        (["--seed", "1.5"], "--seed: expected an integer"),
        (["--seed", "-1"], "--seed: expected an integer from 0 to 18446744073709551615, got '-1'"),
        (["--seed", "99999999999999999999999"], "--seed: expected an integer from 0 to"),
        (["--stream", "--json"], "not allowed with"),
        (["--device", "nonsense"], "--device"),
    ],
)
def test_bad_flags_are_named(model_dir, flags, message, capsys):
    assert _exit_code(["generate", "--model", str(model_dir), "hello world", *flags]) == 2
    assert message in capsys.readouterr().err


def test_not_a_gpt_folder(tmp_path, capsys):
    assert _exit_code(["generate", "--model", str(tmp_path), "hi"]) == 2
    assert str(tmp_path) in capsys.readouterr().err


def test_a_hub_name_is_told_that_nothing_is_downloaded(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no folder named gpt2 here
    assert _exit_code(["generate", "--model", "gpt2", "hi"]) == 2
    err = capsys.readouterr().err
    assert "gpt2: not a folder (does not exist)" in err
    assert "attnkit reads folders on disk; it downloads nothing" in err


@pytest.mark.parametrize(
    "flags",
    [["--temperature", "1e-45"], ["--temperature", "1e-300", "--top-p", "0.5"]],
    ids=" ".join,
)
def test_a_tiny_temperature_writes_the_greedy_text(model_dir, gpt, flags, capsys):
    argv = ["generate", "--model", str(model_dir), PROMPTS[2], "--max-new-tokens", "10",
            "--seed", "0", *flags]  # fmt: skip
    assert main(argv) == 0
    (greedy,) = _expected(gpt, PROMPTS[2:], max_new_tokens=10)
    assert capsys.readouterr().out == PROMPTS[2] + greedy.text + "\n"


def test_a_tiny_repetition_penalty_is_not_an_error(model_dir, capsys):
    argv = ["generate", "--model", str(model_dir), PROMPTS[0], "--max-new-tokens", "10",
            "--temperature", "1", "--repetition-penalty", "1e-40", "--json"]  # fmt: skip
    assert main(argv) == 0
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(record["token_ids"]) == 10


def test_a_prompt_too_long_is_named_by_its_line(model_dir, gpt, monkeypatch, capsys):
    long = "the king " * 30
    n = len(gpt.tokenizer.encode(long))
    assert n > gpt.config.context_length == 96
    _stdin(monkeypatch, f"hello\n{long}\nthe cat\n")
    assert _exit_code(["generate", "--model", str(model_dir), "--max-new-tokens", "5"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before anything is generated
    assert (
        f"error: <stdin>: line 2: prompt too long: {n} tokens; at most 96 fit the model's "
        "context_length=96"
    ) in captured.err
    assert _exit_code(["generate", "--model", str(model_dir), long]) == 2
    assert f"error: PROMPT: prompt too long: {n} tokens; at most 96 fit" in capsys.readouterr().err
