"""`attnkit evaluate --model GPT_DIR --text FILE`: the loss of a Hugging Face GPT-2 or Llama
folder (random weights, written by transformers) on a text, against the Hugging Face model's
own loss."""

from __future__ import annotations

import io
import json
import math
import sys

import pytest
import torch

from attnkit.cli import main
from tests.helpers.generation import CONTEXT, TEXT, byte_bpe, tiny_gpt2_config
from tests.helpers.gpt import write_hf_gpt2_folder

LONG = (TEXT * 6).strip() + "\nsecond line, ünïcödé too\n"  # several windows of CONTEXT


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2_eval")
    hf = write_hf_gpt2_folder(folder, tiny_gpt2_config(), byte_bpe())
    return folder, hf


def hf_nats(hf, ids: list[int]) -> float:
    """GPT2LMHeadModel's own summed loss of every id after bos: windows of the context, each
    next window starting where the last one's targets ended (its loss is a mean: times the
    count)."""
    sequence = torch.tensor([hf.config.bos_token_id, *ids])
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(sequence) - 1, CONTEXT):
            inputs = sequence[start : start + CONTEXT]
            targets = sequence[start + 1 : start + CONTEXT + 1]
            inputs = inputs[: len(targets)]
            out = hf(inputs[None], labels=targets[None], shift_labels=targets[None])
            total += float(out.loss) * len(targets)
    return total


def evaluate(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["evaluate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A Llama folder (grouped-query attention, rotary positions) with its Hugging Face model."""
    from tests.helpers.generation import tiny_llama_config
    from tests.helpers.gpt import write_hf_llama_folder

    folder = tmp_path_factory.mktemp("llama_eval")
    return folder, write_hf_llama_folder(folder, tiny_llama_config(), byte_bpe())


@pytest.mark.parametrize("kind", ["gpt_dir", "llama_dir"])
@pytest.mark.parametrize("text", ["the cat sat on the mat.\n", LONG])
def test_json_report_is_hugging_faces_loss(request, kind, tmp_path, capsys, text):
    folder, hf = request.getfixturevalue(kind)
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    code, out, _ = evaluate(capsys, "--model", str(folder), "--text", str(path), "--json")
    assert code == 0
    report = json.loads(out)
    ids = byte_bpe().encode(text, add_special_tokens=False).ids
    nats = hf_nats(hf, ids)
    assert report["tokens"] == len(ids) and report["characters"] == len(text)
    assert report["loss_per_token"] == pytest.approx(nats / len(ids), rel=1e-5)
    assert report["nats_per_char"] == pytest.approx(nats / len(text), rel=1e-5)
    assert report["bits_per_char"] == pytest.approx(nats / len(text) / math.log(2), rel=1e-5)
    if text is LONG:
        assert len(ids) > 2 * CONTEXT  # the windows were exercised


def test_plain_output_and_gzip_input(gpt_dir, tmp_path, capsys):
    import gzip

    folder, _ = gpt_dir
    path = tmp_path / "text.txt.gz"
    path.write_bytes(gzip.compress(b"the quick brown fox\n"))
    code, out, _ = evaluate(capsys, "--model", str(folder), "--text", str(path))
    assert code == 0 and "nats/char" in out and "bits/char" in out and "20 characters" in out


@pytest.mark.parametrize(
    "content,message",
    [
        (b"", r"--text: '.*empty.txt' is empty, expected text to score"),
        (b"ok\n\xff\xfe\n", r"bad.txt': line 2 is not valid UTF-8"),
    ],
    ids=["empty", "not-utf8"],
)
def test_bad_text_files_are_one_line_errors(gpt_dir, tmp_path, capsys, content, message):
    folder, _ = gpt_dir
    path = tmp_path / ("empty.txt" if not content else "bad.txt")
    path.write_bytes(content)
    code, out, err = evaluate(capsys, "--model", str(folder), "--text", str(path))
    assert code == 2 and out == ""
    assert err.startswith("attnkit evaluate: error: ") and len(err.strip().splitlines()) == 1
    assert __import__("re").search(message, err), err


def test_text_needs_a_gpt_model(gpt_dir, tmp_path, capsys, monkeypatch):
    from attnkit import pretrained
    from tests.helpers.viz import build_translation_model

    path = tmp_path / "t.txt"
    path.write_text("hello\n")
    # without --model: the shipped GPT, or an error naming where it was looked for
    monkeypatch.setattr(pretrained, "shipped_gpt_dir", lambda: tmp_path / "absent")
    code, _, err = evaluate(capsys, "--text", str(path))
    assert code == 2 and "--text: give --model DIR" in err and str(tmp_path / "absent") in err
    folder = gpt_dir[0]
    monkeypatch.setattr(pretrained, "shipped_gpt_dir", lambda: folder)
    code, out, _ = evaluate(capsys, "--text", str(path), "--json")
    assert code == 0 and json.loads(out)["model"] == str(folder)
    translation = build_translation_model(tmp_path / "mt")
    code, _, err = evaluate(capsys, "--model", str(translation), "--text", str(path))
    assert code == 2 and "a translation model folder; --text scores a GPT" in err
    code, _, err = evaluate(
        capsys, "--model", str(gpt_dir[0]), "--text", str(path), "--split", "val"
    )
    assert code == 2 and "--text and --split exclude each other" in err
    for flag in (["--beam", "3"], ["--lenpen", "1.2"], ["--lenpen-style", "gnmt"]):
        code, _, err = evaluate(capsys, "--model", str(gpt_dir[0]), "--text", str(path), *flag)
        assert code == 2 and f"--text and {flag[0]} exclude each other" in err
    code, _, err = evaluate(capsys, "--model", str(gpt_dir[0]), "--text", str(tmp_path / "no.txt"))
    assert code == 2 and "no.txt' does not exist" in err


def test_a_gpt_folder_without_text_says_what_reads_it(gpt_dir, capsys):
    code, _, err = evaluate(capsys, "--model", str(gpt_dir[0]))
    assert code == 2 and "evaluate --model DIR --text FILE" in err


def test_hf_reference_agrees_with_a_plain_cross_entropy(gpt_dir):
    """The reference itself: HF's loss with shift_labels is the plain cross-entropy."""
    _, hf = gpt_dir
    ids = torch.tensor([[0, 5, 9, 12, 40]])
    with torch.no_grad():
        logits = hf(ids[:, :-1]).logits[0]
        out = hf(ids[:, :-1], labels=ids[:, 1:], shift_labels=ids[:, 1:])
    plain = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
    assert float(out.loss) == pytest.approx(float(plain), rel=1e-6)


class _Terminal(io.StringIO):
    """Standard error as a terminal (tqdm shows its bar only there)."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [False, True])
def test_a_long_text_shows_a_bar_on_a_terminal(gpt_dir, tmp_path, monkeypatch, capsys, terminal):
    """From PROGRESS_BATCHES batches on, a 'scoring' bar on standard error, only on a
    terminal and not with --no-progress; the report is the same either way."""
    from attnkit.training import lm

    folder, _ = gpt_dir
    path = tmp_path / "text.txt"
    path.write_text(LONG, encoding="utf-8")
    monkeypatch.setattr(lm, "PROGRESS_BATCHES", 1)
    reports = []
    for extra in ([], ["--no-progress"]):
        err = _Terminal() if terminal else io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        code, out, _ = evaluate(
            capsys, "--model", str(folder), "--text", str(path), "--json", *extra
        )
        assert code == 0
        reports.append(json.loads(out))
        assert ("scoring" in err.getvalue()) == (terminal and not extra), err.getvalue()
    assert reports[0] == reports[1]
