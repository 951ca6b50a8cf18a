"""`attnkit translate` and `attnkit evaluate` end to end on a tiny saved model folder."""

from __future__ import annotations

import io
import json
import sys

import pytest
import torch

from attnkit.cli import main
from attnkit.data import SubwordTokenizer, load_named_corpus
from attnkit.decoding import DecodingConfig, Translator, loading, save_translation_model
from attnkit.models import Transformer, TransformerConfig

FAST = ["--beam", "2", "--max-len-a", "0.5", "--max-len-b", "3", "--device", "cpu"]
LINES = ["Ein Hund rennt.", "", "Zwei Männer stehen auf der Straße.", "Eine Frau."]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """Random weights (stored in bfloat16, like the shipped model), a real tokenizer, and a
    short max_len so that long lines must be truncated."""
    corpus = load_named_corpus("multi30k", split="val")
    tokenizer = SubwordTokenizer.train(corpus.src[:300] + corpus.tgt[:300], vocab_size=500)
    torch.manual_seed(0)
    config = TransformerConfig(
        src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, d_model=32,
        num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64, max_len=24,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("model")
    return save_translation_model(folder, Transformer(config), tokenizer, dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def expected(model_dir):
    """What the library gives for LINES with the FAST settings."""
    model, tokenizer, _ = loading.load_translation_model(model_dir)
    config = DecodingConfig(beam_size=2, max_len_a=0.5, max_len_b=3)
    return Translator(model, tokenizer, config).translate(LINES).translations


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_translate_stdin_in_order_with_empty_lines(model_dir, expected, monkeypatch, capsys):
    _stdin(monkeypatch, ("\n".join(LINES) + "\n").encode())
    assert main(["translate", "--model", str(model_dir), *FAST]) == 0
    captured = capsys.readouterr()
    assert captured.out.split("\n")[:-1] == expected
    assert expected[1] == "" and all(expected[i] for i in (0, 2, 3))
    assert captured.err == ""


def test_translate_input_file_crlf_and_batching(model_dir, expected, tmp_path, capsys):
    path = tmp_path / "in.de"
    path.write_bytes("\r\n".join(LINES).encode())  # CRLF, no final newline
    assert main(["translate", "--model", str(model_dir), "--input", str(path), *FAST,
                 "--batch-tokens", "5"]) == 0  # fmt: skip
    assert capsys.readouterr().out.split("\n")[:-1] == expected


def test_translate_non_utf8_line_is_an_error_naming_it(model_dir, monkeypatch, capsys):
    _stdin(monkeypatch, b"Ein Hund.\nZwei\n\xff\xfe kaputt\nEnde\n")
    assert main(["translate", "--model", str(model_dir), *FAST]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "<stdin>: line 3 is not valid UTF-8" in captured.err


def test_translate_truncates_long_lines_with_a_count(model_dir, monkeypatch, capsys):
    long_line = " ".join(["Ein sehr langer Satz über einen Hund."] * 40)
    _stdin(monkeypatch, f"Ein Hund.\n{long_line}\nEine Frau.\n{long_line}\n".encode())
    assert main(["translate", "--model", str(model_dir), *FAST]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.split("\n")[:-1]) == 4
    assert "warning: 2 line(s) longer than 23 source tokens were truncated (line 2, 4)" in (
        captured.err
    )


def test_translate_empty_input(model_dir, monkeypatch, capsys):
    _stdin(monkeypatch, b"")
    assert main(["translate", "--model", str(model_dir), *FAST]) == 0
    assert capsys.readouterr().out == ""


def test_missing_shipped_model_is_a_clear_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(loading, "shipped_model_dir", lambda: tmp_path / "multi30k_de_en")
    _stdin(monkeypatch, b"Ein Hund.\n")
    assert main(["translate", *FAST]) == 2
    err = capsys.readouterr().err
    assert "shipped model is not installed" in err and "--model" in err


def test_evaluate_json_on_files(model_dir, expected, tmp_path, capsys):
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    ref.write_text("\n".join(["A dog runs.", "", "Two men.", "A woman."]) + "\n")
    args = ["evaluate", "--model", str(model_dir), "--src", str(src), "--ref", str(ref), *FAST]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"bleu", "signature", "sentences_per_sec"} <= set(report)
    from attnkit.metrics import corpus_bleu

    reference = corpus_bleu(expected, [["A dog runs.", "", "Two men.", "A woman."]])
    assert report["bleu"] == reference.score and report["signature"] == reference.signature
    assert "tok:13a" in report["signature"] and "case:mixed" in report["signature"]
    assert report["sentences"] == 4 and report["sentences_per_sec"] > 0

    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"BLEU = {reference.score:.2f} ")
    assert out[1] == reference.signature and "sentences/s" in out[2]


def test_evaluate_named_split(model_dir, monkeypatch, capsys):
    import attnkit.data

    calls = []

    def small_corpus(name, split, src_lang, tgt_lang):
        calls.append((name, split, src_lang, tgt_lang))
        return attnkit.data.ParallelCorpus(src=["Ein Hund."], tgt=["A dog."])

    monkeypatch.setattr(attnkit.data, "load_named_corpus", small_corpus)
    assert main(["evaluate", "--model", str(model_dir), "--json", *FAST]) == 0
    assert calls == [("multi30k", "test2016", "de", "en")]
    assert json.loads(capsys.readouterr().out)["sentences"] == 1
    assert main(["evaluate", "--model", str(model_dir), "--split", "val", "--src-lang", "en",
                 "--tgt-lang", "de", "--json", *FAST]) == 0  # fmt: skip
    assert calls[-1] == ("multi30k", "val", "en", "de")


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--src", "a.txt"], "--src and --ref go together"),
        (["--src", "a", "--ref", "b", "--split", "val"], "exclude each other"),
    ],
)
def test_evaluate_bad_arguments(model_dir, capsys, extra, message):
    assert main(["evaluate", "--model", str(model_dir), *extra]) == 2
    assert message in capsys.readouterr().err
