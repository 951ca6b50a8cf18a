"""`attnkit translate` and `attnkit evaluate` end to end on a tiny saved model folder."""

from __future__ import annotations

import io
import json
import os
import sys

import pytest
import torch

from attnkit.cli import main
from attnkit.data import SubwordTokenizer, load_named_corpus
from attnkit.decoding import DecodingConfig, Translator, loading, save_translation_model
from attnkit.models import Transformer, TransformerConfig

# float32, as the `expected` reference computes (--dtype auto would pick bfloat16 on AVX-512).
FAST = ["--beam", "2", "--max-len-a", "0.5", "--max-len-b", "3", "--device", "cpu",
        "--dtype", "float32"]  # fmt: skip
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
    assert out[2].endswith("(beam 2, length penalty 1, cpu)")


@pytest.fixture
def corpus_calls(monkeypatch):
    """``load_named_corpus`` replaced by a one-pair corpus; the list of its calls'
    (name, split, src_lang, tgt_lang)."""
    import attnkit.data

    calls = []

    def small_corpus(name, split, src_lang, tgt_lang):
        calls.append((name, split, src_lang, tgt_lang))
        return attnkit.data.ParallelCorpus(src=["Ein Hund."], tgt=["A dog."])

    monkeypatch.setattr(attnkit.data, "load_named_corpus", small_corpus)
    return calls


def test_evaluate_named_split(model_dir, corpus_calls, capsys):
    calls = corpus_calls
    assert main(["evaluate", "--model", str(model_dir), "--json", *FAST]) == 0
    assert calls == [("multi30k", "test2016", "de", "en")]
    assert json.loads(capsys.readouterr().out)["sentences"] == 1
    assert main(["evaluate", "--model", str(model_dir), "--split", "val", "--src-lang", "en",
                 "--tgt-lang", "de", "--json", *FAST]) == 0  # fmt: skip
    assert calls[-1] == ("multi30k", "val", "en", "de")


def test_evaluate_scores_the_direction_the_model_was_trained_on(
    model_dir, corpus_calls, capsys, tmp_path
):
    """A folder that says it was trained en -> de (``attnkit train`` writes ``"data"`` into
    config.json) is scored en -> de without flags; asking for de -> en is refused, naming both
    directions (before: de -> en was scored, BLEU near 0, exit status 0)."""
    model, tokenizer, _ = loading.load_translation_model(model_dir)
    data = {"corpus": "multi30k", "src_lang": "en", "tgt_lang": "de"}
    en_de = save_translation_model(
        tmp_path / "en_de", model, tokenizer, extra_config={"data": data}
    )
    calls = corpus_calls
    assert main(["evaluate", "--model", str(en_de), "--json", *FAST]) == 0
    assert calls == [("multi30k", "test2016", "en", "de")]
    assert json.loads(capsys.readouterr().out)["test_set"] == "multi30k test2016 en-de"
    assert main(["evaluate", "--model", str(en_de), "--src-lang", "en", "--json", *FAST]) == 0
    assert calls[-1] == ("multi30k", "test2016", "en", "de")
    capsys.readouterr()
    for flags in (["--src-lang", "de", "--tgt-lang", "en"], ["--tgt-lang", "en"]):
        assert main(["evaluate", "--model", str(en_de), *flags, *FAST]) == 2
        err = capsys.readouterr().err
        assert "was trained to translate en -> de" in err and "--src FILE --ref FILE" in err
    assert len(calls) == 2  # refused before any test set was read


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


# --------------------------------------------------------------------------- input


def test_dash_means_standard_input(model_dir, expected, monkeypatch, capsys, tmp_path):
    _stdin(monkeypatch, ("\n".join(LINES) + "\n").encode())
    assert main(["translate", "--model", str(model_dir), "--input", "-", *FAST]) == 0
    assert capsys.readouterr().out.split("\n")[:-1] == expected


def test_input_is_normalised_blank_in_blank_out(model_dir, expected, monkeypatch, capsys):
    """A trailing tab, a BOM, NUL bytes and runs of spaces translate as the clean line;
    whitespace-only lines give empty lines; N lines in, N lines out."""
    dirty = [
        "\ufeff" + LINES[0] + "\t",
        " \t ",
        "  " + LINES[2].replace(" ", "  \u00a0") + "\x00\r",
        "\x00" + LINES[3],
        "\x00",
        "\u3000",
    ]
    _stdin(monkeypatch, "\n".join(dirty).encode())
    assert main(["translate", "--model", str(model_dir), *FAST]) == 0
    out = capsys.readouterr().out
    assert out.split("\n")[:-1] == [*expected, "", ""]


def test_non_utf8_file_names_file_line_and_offset(model_dir, tmp_path, capsys):
    path = tmp_path / "latin1.de"
    path.write_bytes("Ein Hund.\nSchöne Grüße\n".encode("latin-1"))
    assert main(["translate", "--model", str(model_dir), "--input", str(path), *FAST]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"attnkit translate: error: {str(path)!r}: line 2 is not valid UTF-8 (invalid "
        "start byte: byte 0xf6 at byte 4 of line 2, byte offset 13 of the file)\n"
    )


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p, "--input: '{p}' is a directory, expected a text file"),
        (lambda p: p / "missing.de", "--input: '{p}/missing.de' does not exist"),
    ],
)
def test_bad_input_paths(model_dir, tmp_path, capsys, make, message):
    path = make(tmp_path)
    assert main(["translate", "--model", str(model_dir), "--input", str(path), *FAST]) == 2
    assert capsys.readouterr().err == f"attnkit translate: error: {message.format(p=tmp_path)}\n"


# --------------------------------------------------------------------------- output


def test_output_file(model_dir, expected, monkeypatch, tmp_path, capsys):
    _stdin(monkeypatch, ("\n".join(LINES) + "\n").encode())
    out = tmp_path / "out.en"
    assert main(["translate", "--model", str(model_dir), "-o", str(out), *FAST]) == 0
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == expected
    assert capsys.readouterr().out == ""
    assert [p.name for p in tmp_path.iterdir()] == ["out.en"]  # no temporary file left


def test_output_to_dev_stdout_keeps_what_the_shell_appends_to(
    model_dir, expected, monkeypatch, tmp_path, capsys
):
    """`-o /dev/stdout >> log.txt`: the translations go after the log's lines, through the
    open descriptor; following /dev/stdout to log.txt and replacing it lost the log."""
    _stdin(monkeypatch, ("\n".join(LINES) + "\n").encode())
    log = tmp_path / "log.txt"
    log.write_text("line 1 of my log\nline 2 of my log\n")
    saved = os.dup(1)
    appending = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        os.dup2(appending, 1)  # the shell's `>> log.txt`
        code = main(["translate", "--model", str(model_dir), "-o", "/dev/stdout", *FAST])
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(appending)
    assert code == 0, capsys.readouterr().err
    lines = log.read_text(encoding="utf-8").split("\n")[:-1]
    assert lines == ["line 1 of my log", "line 2 of my log", *expected]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.txt"]


def _unused_descriptor() -> int:
    """A descriptor number nothing holds: the highest the process may open (below 2^31)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    fd = min(soft if soft != resource.RLIM_INFINITY else 1 << 20, 1 << 31) - 1
    try:
        os.fstat(fd)
    except OSError:
        return fd
    pytest.fail(f"descriptor {fd} is open")


@pytest.mark.parametrize(
    "path, message",
    [
        ("/dev/fd/{fd}", "--output: '/dev/fd/{fd}' names descriptor {fd}, which is not open"),
        # beyond any descriptor: was an OverflowError with its traceback
        ("/dev/fd/4294967296", "--output: '/dev/fd/4294967296' names descriptor 4294967296, "
         "which is not open"),
        ("/dev/stdin", "--output: '/dev/stdin' names descriptor 0, open for reading only"),
        ("/dev/stdout", "--output: '/dev/stdout' names descriptor 1, which is the --input file; "
         "writing it would replace the text being read: choose another output file"),
    ],
)  # fmt: skip
def test_output_descriptors_that_cannot_be_written_fail_before_loading(
    model_dir, monkeypatch, tmp_path, capsys, path, message
):
    """Standard input is read from a file (`< in.txt`), standard output leads to the --input
    file opened for reading and writing without appending (`1<> in.txt`): writing there would
    overwrite the text read."""
    monkeypatch.setattr(loading, "load_translation_model", lambda *a, **k: pytest.fail("loaded"))
    source = tmp_path / "in.txt"
    source.write_text("Ein Hund.\n")
    reading = os.open(source, os.O_RDONLY)
    both = os.open(source, os.O_RDWR)
    saved = os.dup(0), os.dup(1)
    unused = _unused_descriptor()
    try:
        os.dup2(reading, 0)  # standard input open for reading only, as a shell's `<`
        os.dup2(both, 1)  # standard output on the input file, as a shell's `1<>`
        code = main(
            ["translate", "--model", str(model_dir), "-i", str(source), "-o",
             path.format(fd=unused), *FAST]
        )  # fmt: skip
    finally:
        os.dup2(saved[0], 0)
        os.dup2(saved[1], 1)
        for fd in (*saved, reading, both):
            os.close(fd)
    assert code == 2
    assert capsys.readouterr().err == f"attnkit translate: error: {message.format(fd=unused)}\n"
    assert source.read_text() == "Ein Hund.\n"


@pytest.mark.parametrize(
    "name, message",
    [
        ("dir", "--output: '{p}/dir' is a directory, expected a file name"),
        (
            "missing/out.en",
            "--output: the folder '{p}/missing' of '{p}/missing/out.en' does not exist",
        ),
        (
            "file/out.en",
            "--output: '{p}/file' is not a folder, so '{p}/file/out.en' cannot be made",
        ),
    ],
)
def test_bad_output_paths_fail_before_loading(
    model_dir, monkeypatch, tmp_path, capsys, name, message
):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(loading, "load_translation_model", lambda *a, **k: pytest.fail("loaded"))
    _stdin(monkeypatch, b"Ein Hund.\n")
    assert main(["translate", "--model", str(model_dir), "-o", str(tmp_path / name), *FAST]) == 2
    assert capsys.readouterr().err == f"attnkit translate: error: {message.format(p=tmp_path)}\n"


@pytest.mark.parametrize("name", ["tokenizer.json", "config.json", "new.txt"])
def test_the_output_is_never_inside_the_model_folder(
    model_dir, monkeypatch, tmp_path, capsys, name
):
    """The model's files are inputs too: -o MODEL/tokenizer.json replaced the tokenizer."""
    model = tmp_path / "model"
    model.mkdir()
    for item in model_dir.iterdir():
        (model / item.name).write_bytes(item.read_bytes())
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    _stdin(monkeypatch, b"Ein Hund.\n")
    assert main(["translate", "--model", str(model), "-o", str(model / name), *FAST]) == 2
    assert capsys.readouterr().err == (
        f"attnkit translate: error: --output: {str(model / name)!r} is inside the model folder "
        f"{str(model)!r}; writing there would change the model: choose another place\n"
    )
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before


def test_the_output_is_never_inside_another_checkpoint_of_the_run(
    model_dir, monkeypatch, tmp_path, capsys
):
    """`translate --model RUN/best -o RUN/last/out.txt` was accepted, and `train --resume RUN`
    then found "no `last` checkpoint": one rule for every model folder attnkit wrote."""
    import shutil

    run = tmp_path / "run"
    for name in ("best", "last"):
        shutil.copytree(model_dir, run / name)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    monkeypatch.setattr(loading, "load_translation_model", lambda *a, **k: pytest.fail("loaded"))
    _stdin(monkeypatch, b"Ein Hund.\n")
    out = run / "last" / "out.txt"
    assert main(["translate", "--model", str(run / "best"), "-o", str(out), *FAST]) == 2
    assert capsys.readouterr().err == (
        f"attnkit translate: error: --output: {str(out)!r} is inside the model folder "
        f"{str(run / 'last')!r}, which must hold its own files only (a run could no longer "
        "resume from it or save it); choose another place\n"
    )
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_the_input_file_is_never_the_output(model_dir, monkeypatch, tmp_path, capsys):
    """Before: the German source was replaced by its translation, exit 0."""
    source = tmp_path / "x.de"
    source.write_text("Ein Hund.\n")
    monkeypatch.setattr(loading, "load_translation_model", lambda *a, **k: pytest.fail("loaded"))
    argv = ["translate", "--model", str(model_dir), "-i", str(source), "-o", str(source), *FAST]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"attnkit translate: error: --output: {str(source)!r} is the --input file; writing it "
        "would replace the text being read: choose another output file\n"
    )
    assert source.read_text() == "Ein Hund.\n"


def test_read_only_output(model_dir, monkeypatch, tmp_path, capsys):
    """Tests run as root, who may write anywhere: the permission check is simulated."""
    import os

    ro = tmp_path / "ro.en"
    ro.write_text("old")
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    _stdin(monkeypatch, b"Ein Hund.\n")
    assert main(["translate", "--model", str(model_dir), "-o", str(ro), *FAST]) == 2
    assert (
        capsys.readouterr().err == f"attnkit translate: error: --output: {str(ro)!r} is read-only\n"
    )
    assert ro.read_text() == "old"


def test_write_errors_on_the_output_file(model_dir, monkeypatch, tmp_path, capsys):
    """A full disk (ENOSPC), or a permission or read-only file system error that appears only
    when writing: one line naming the file, the old file untouched, no temporary file left."""
    import errno
    import os

    from attnkit import files  # the writer translate -o goes through

    out = tmp_path / "out.en"
    out.write_text("old")
    for code, message in [
        (errno.ENOSPC, "no space left on the device while writing"),
        (errno.EACCES, "permission denied:"),
        (errno.EROFS, "is on a read-only file system"),
        (errno.EDQUOT, "disk quota exceeded while writing"),
    ]:

        class Full(io.StringIO):
            def write(self, text, code=code):
                raise OSError(code, os.strerror(code), self.name)

        def fake_open(path, mode="r", encoding=None, Full=Full):
            f = Full()
            f.name = str(path)
            open(path, "w").close()  # the temporary file exists, as with a real open
            return f

        monkeypatch.setattr(files, "open", fake_open, raising=False)
        _stdin(monkeypatch, b"Ein Hund.\n")
        assert main(["translate", "--model", str(model_dir), "-o", str(out), *FAST]) == 2
        err = capsys.readouterr().err
        assert err.startswith("attnkit translate: error: ") and message in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert out.read_text() == "old"
        assert [p.name for p in tmp_path.iterdir()] == ["out.en"]


def test_full_disk_on_standard_output(model_dir, monkeypatch, capsys):
    import errno

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    _stdin(monkeypatch, b"Ein Hund.\n")
    monkeypatch.setattr(sys, "stdout", Full())
    assert main(["translate", "--model", str(model_dir), *FAST]) == 2
    assert capsys.readouterr().err == (
        "attnkit translate: error: no space left on the device while writing the output; "
        "free some space or write elsewhere\n"
    )


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize("device", ["tpu", "cuda:7", "cuda", "meta", "cpu:3", "", "gpu0", "mps"])
@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_unknown_device(model_dir, monkeypatch, tmp_path, capsys, command, device):
    import torch

    if torch.cuda.is_available() and device == "cuda":
        pytest.skip("this machine has CUDA")  # never the case on attnkit's CPU machines
    monkeypatch.setattr(loading, "load_translation_model", lambda *a, **k: pytest.fail("loaded"))
    _stdin(monkeypatch, b"Ein Hund.\n")
    args = [command, "--model", str(model_dir), *FAST[:-2], "--device", device]
    if command == "evaluate":
        (tmp_path / "ref.en").write_text("A dog.\n")
        args += ["--src", "-", "--ref", str(tmp_path / "ref.en")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == (
        f"attnkit {command}: error: --device: {device!r} is not available here; available: cpu\n"
    )


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--beam", "0", "expected an integer >= 1, got '0'"),
        ("--beam", "-5", "expected an integer >= 1, got '-5'"),
        ("--beam", "2.5", "expected an integer >= 1, got '2.5'"),
        ("--beam", "nan", "expected an integer >= 1, got 'nan'"),
        ("--batch-tokens", "0", "expected an integer >= 1, got '0'"),
        ("--max-len-a", "inf", "expected a finite number >= 0, got 'inf'"),
        ("--max-len-a", "nan", "expected a finite number >= 0, got 'nan'"),
        ("--max-len-a", "-1", "expected a finite number >= 0, got '-1'"),
        ("--max-len-b", "-1", "expected an integer >= 0, got '-1'"),
        ("--max-len-b", "1e9", "expected an integer >= 0, got '1e9'"),
        ("--min-len", "-1", "expected an integer >= 0, got '-1'"),
        ("--lenpen", "nan", "expected a finite number from -10.0 to 10.0, got 'nan'"),
        ("--lenpen", "-inf", "expected a finite number from -10.0 to 10.0, got '-inf'"),
        ("--lenpen", "1000", "expected a finite number from -10.0 to 10.0, got '1000'"),
        ("--lenpen", "-500", "expected a finite number from -10.0 to 10.0, got '-500'"),
        ("--threads", "0", "expected a thread count from 1 to"),
        ("--threads", "100000", "expected a thread count from 1 to"),
    ],
)
@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_bad_numbers_are_refused_by_argparse(capsys, command, flag, value, message):
    with pytest.raises(SystemExit) as exit_info:
        main([command, f"{flag}={value}"])
    assert exit_info.value.code == 2
    assert f"attnkit {command}: error: argument {flag}: {message}" in capsys.readouterr().err


def test_huge_beam_is_refused_before_loading(monkeypatch, capsys):
    monkeypatch.setattr(loading, "load_translation_model", lambda *a, **k: pytest.fail("loaded"))
    _stdin(monkeypatch, b"Ein Hund.\n")
    assert main(["translate", "--beam", "100000"]) == 2
    assert capsys.readouterr().err == (
        "attnkit translate: error: --beam: expected at most MAX_BEAM_SIZE=1024, got 100000 "
        "(beams of 4-10 are usual)\n"
    )


def test_huge_length_factor_gives_the_model_limit(model_dir, monkeypatch, capsys):
    """--max-len-a 1e30 overflowed to 1-token outputs; now it is the model's limit, the same
    as any factor large enough to reach it (1000 here)."""
    outputs = {}
    for a in ("1000", "1e30"):
        _stdin(monkeypatch, ("\n".join(LINES) + "\n").encode())
        argv = ["translate", "--model", str(model_dir), "--beam", "1", "--max-len-a", a,
                "--min-len", "23", "--device", "cpu"]  # fmt: skip
        assert main(argv) == 0
        outputs[a] = capsys.readouterr().out
    assert outputs["1e30"] == outputs["1000"]
    model, tokenizer, _ = loading.load_translation_model(model_dir)
    first = outputs["1e30"].split("\n")[0]
    assert len(tokenizer.encode(first)) >= 20  # 23 tokens before detokenization merges any


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_min_len_beyond_the_models_longest_output_is_refused(
    model_dir, monkeypatch, capsys, command
):
    """--min-len 1000 ran, writing the model's 255-token limit of filler on every line; a
    minimum the model cannot reach (max_len 24 here: 23 tokens after bos) is an error now."""
    _stdin(monkeypatch, b"Ein Hund rennt.\n")
    argv = [command, "--model", str(model_dir), "--min-len", "24", "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"attnkit {command}: error: --min-len: 24 tokens is more than this model" in err
    assert "within 23 tokens (max_len=24" in err


# --------------------------------------------------------------------------- evaluate


def test_evaluate_reads_the_source_from_stdin(model_dir, expected, monkeypatch, tmp_path, capsys):
    ref = tmp_path / "ref.en"
    ref.write_text("A dog runs.\n\nTwo men.\nA woman.\n")
    _stdin(monkeypatch, ("\n".join(LINES) + "\n").encode())
    args = ["evaluate", "--model", str(model_dir), "--src", "-", "--ref", str(ref), "--json", *FAST]
    assert main(args) == 0
    from attnkit.metrics import corpus_bleu

    report = json.loads(capsys.readouterr().out)
    assert (
        report["bleu"] == corpus_bleu(expected, [["A dog runs.", "", "Two men.", "A woman."]]).score
    )


@pytest.mark.parametrize(
    "src, ref, message",
    [
        ("-", "-", "--src and --ref: only one of them can be - (standard input)"),
        ("empty", "ref", "--src '{p}/empty' is empty, expected one sentence a line"),
        ("src", "dir", "--ref: '{p}/dir' is a directory, expected a text file"),
        ("nothere", "ref", "--src: '{p}/nothere' does not exist"),
        ("src", "short", "--src '{p}/src' has 2 lines but --ref '{p}/short' has 1 lines"),
    ],
)
def test_evaluate_file_errors(model_dir, tmp_path, capsys, src, ref, message):
    (tmp_path / "empty").write_text("")
    (tmp_path / "src").write_text("Ein Hund.\nEine Katze.\n")
    (tmp_path / "ref").write_text("A dog.\nA cat.\n")
    (tmp_path / "short").write_text("A dog.\n")
    (tmp_path / "dir").mkdir()
    paths = [p if p == "-" else str(tmp_path / p) for p in (src, ref)]
    args = ["evaluate", "--model", str(model_dir), "--src", paths[0], "--ref", paths[1], *FAST]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnkit evaluate: error: ") and message.format(p=tmp_path) in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("capability", "dtype"), [("AVX2", torch.float32), ("AVX512", torch.bfloat16)]
)
def test_dtype_auto_is_bfloat16_only_where_native(
    model_dir, capability, dtype, monkeypatch, capsys, uncapped_onednn
):
    """--dtype auto (the default) loads the model in the dtype the CPU computes fastest (the
    processor's rule set here, whatever ONEDNN_MAX_CPU_ISA the run has)."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    seen = []
    real = loading.load_translation_model

    def spy(*args, **kwargs):
        seen.append(kwargs["dtype"])
        return real(*args, **kwargs)

    monkeypatch.setattr(loading, "load_translation_model", spy)
    monkeypatch.setattr("attnkit.decoding.load_translation_model", spy)
    _stdin(monkeypatch, b"Ein Hund.\n")
    fast = FAST[: FAST.index("--dtype")]
    assert main(["translate", "--model", str(model_dir), *fast]) == 0
    assert main(["translate", "--model", str(model_dir), *fast, "--dtype", "float32"]) == 0
    assert seen == [dtype, torch.float32]
    capsys.readouterr()


def test_workers_default_to_one_forked_process_per_thread(model_dir, monkeypatch, capfd):
    import attnkit.decoding

    seen = []
    real = attnkit.decoding.Translator

    def spy(*args, **kwargs):
        seen.append((kwargs["workers"], kwargs["parallel"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(attnkit.decoding, "Translator", spy)
    for extra, want in (
        ([], (torch.get_num_threads(), "processes")),
        (["--workers", "1"], (1, "processes")),
        (["--parallel", "threads"], (torch.get_num_threads(), "threads")),
    ):
        _stdin(monkeypatch, b"Ein Hund.\nZwei Hunde.\n")
        assert main(["translate", "--model", str(model_dir), *FAST, *extra]) == 0
        assert seen[-1] == want
        assert len(capfd.readouterr().out.splitlines()) == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--model", str(model_dir), *FAST, "--workers", "0"])
    assert exit_info.value.code == 2
    assert "--workers: expected an integer from 1 to 256, got '0'" in capfd.readouterr().err


def test_search_flags_default_to_the_models_settings(model_dir, tmp_path, monkeypatch, capsys):
    """A folder's config.json "decoding" settings are the commands' defaults; a flag given
    overrides only its own setting."""
    model, tokenizer, _ = loading.load_translation_model(model_dir)
    stored = DecodingConfig(beam_size=4, lenpen=3.0, max_len_a=0.5, max_len_b=3)
    tuned = save_translation_model(tmp_path / "tuned", model, tokenizer, decoding=stored)
    lines = [line for line in LINES if line]

    def library(config):
        return Translator(model, tokenizer, config).translate(lines).translations

    def command(*flags):
        _stdin(monkeypatch, ("\n".join(lines) + "\n").encode())
        cpu = ["--device", "cpu", "--dtype", "float32"]
        assert main(["translate", "--model", str(tuned), *cpu, *flags]) == 0
        return capsys.readouterr().out.split("\n")[:-1]

    assert command() == library(stored)
    # (random weights rarely end a sentence, so the length limit is what shows here)
    overridden = DecodingConfig(beam_size=4, lenpen=3.0, max_len_a=0.5, max_len_b=1)
    assert command("--max-len-b", "1") == library(overridden)
    assert library(stored) != library(overridden)

    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ref.write_text("A dog runs.\nTwo men.\nA woman.\n", encoding="utf-8")
    args = ["evaluate", "--model", str(tuned), "--src", str(src), "--ref", str(ref), "--json"]
    for flags, searched in (([], (4, 3.0)), (["--beam", "2", "--lenpen", "0"], (2, 0.0))):
        assert main([*args, "--device", "cpu", *flags]) == 0
        report = json.loads(capsys.readouterr().out)
        assert (report["beam"], report["lenpen"]) == searched


def test_the_cli_knows_every_search_setting_and_kind_of_worker():
    """The CLI keeps its own copies (it imports torch only when a command runs): they must
    name the library's search settings and kinds of worker."""
    from attnkit.cli.commands import translate as command
    from attnkit.decoding import SEARCH_FIELDS
    from attnkit.decoding.config import MAX_LENPEN
    from attnkit.decoding.translate import PARALLEL

    assert set(command.SEARCH_DESTS) == set(SEARCH_FIELDS)
    assert set(command.PARALLEL) == set(PARALLEL)
    assert command.MAX_LENPEN == MAX_LENPEN
    from attnkit.cli import build_parser

    defaults = vars(build_parser().parse_args(["translate"]))
    assert all(
        defaults[dest] is None for dest in command.SEARCH_DESTS.values()
    )  # None: the model's
    assert defaults["parallel"] == command.PARALLEL[0] == "processes"


class _Terminal(io.StringIO):
    """Standard error as a terminal (tqdm shows its bar only there)."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [False, True])
def test_long_inputs_go_in_parts_with_a_bar_on_a_terminal(
    model_dir, expected, monkeypatch, capsys, terminal
):
    """More than PART_LINES lines: translated PART_LINES at a time, the same translations in
    the same order, truncated lines counted by their line in the whole input, and a progress
    bar on standard error only when it is a terminal (not with --no-progress)."""
    from attnkit.cli.commands import translate as command

    monkeypatch.setattr(command, "PART_LINES", 2)
    long_line = " ".join(["Ein sehr langer Satz über einen Hund."] * 40)
    lines = [*LINES, long_line]  # 5 lines: parts of 2, 2 and 1; the long one is line 5
    calls = []
    real = Translator.translate
    monkeypatch.setattr(
        Translator, "translate", lambda self, part: calls.append(len(part)) or real(self, part)
    )
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    for extra in ([], ["--no-progress"]):
        calls.clear()
        err.seek(0), err.truncate()
        _stdin(monkeypatch, ("\n".join(lines) + "\n").encode())
        assert main(["translate", "--model", str(model_dir), *FAST, *extra]) == 0
        out = capsys.readouterr().out.split("\n")[:-1]
        assert out[:4] == expected and len(out) == 5
        assert calls == [2, 2, 1]
        log = err.getvalue()
        assert "warning: 1 line(s) longer than 23 source tokens were truncated (line 5)" in log
        shows_bar = "translating" in log and "5/5" in log
        assert shows_bar == (terminal and not extra), log


def test_evaluate_goes_in_parts_with_the_same_bleu(model_dir, expected, monkeypatch, tmp_path):
    from attnkit.cli.commands import translate as command

    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    ref.write_text("\n".join(["A dog runs.", "", "Two men.", "A woman."]) + "\n")
    args = ["evaluate", "--model", str(model_dir), "--src", str(src), "--ref", str(ref), *FAST]
    calls, reports = [], []
    real = Translator.translate
    monkeypatch.setattr(
        Translator, "translate", lambda self, part: calls.append(len(part)) or real(self, part)
    )
    for part_lines in (2000, 3):
        monkeypatch.setattr(command, "PART_LINES", part_lines)
        out = io.StringIO()
        monkeypatch.setattr(sys, "stdout", out)
        assert main([*args, "--json"]) == 0
        reports.append(json.loads(out.getvalue()))
    assert calls == [4, 3, 1]
    assert reports[0]["bleu"] == reports[1]["bleu"] and reports[1]["sentences"] == 4


@pytest.mark.parametrize("workers", ["1", "2"])
def test_dtype_int8_translates_every_line(model_dir, expected, monkeypatch, capsys, workers):
    """--dtype int8: the float32 weights packed as int8 (in this process, before any worker is
    forked), a translation per line, close to float32's; evaluate reports the dtype."""
    import attnkit.generation.packed as packed

    if not packed.int8_available():
        pytest.skip("torch without FBGEMM (not x86)")
    packs = []
    real = packed._pack_int8
    monkeypatch.setattr(packed, "_pack_int8", lambda w, b: packs.append(w.shape) or real(w, b))
    _stdin(monkeypatch, ("\n".join(LINES) + "\n").encode())
    fast = [f for f in FAST if f != "float32"]
    fast[fast.index("--dtype") + 1 : fast.index("--dtype") + 1] = ["int8"]
    argv = ["translate", "--model", str(model_dir), *fast, "--workers", workers]
    assert main([*argv, "--parallel", "processes"]) == 0
    out = capsys.readouterr().out.split("\n")[:-1]
    assert len(out) == 4 and out[1] == "" and all(out[i] for i in (0, 2, 3))
    assert sum(a == b for a, b in zip(out, expected, strict=True)) >= 2
    assert (64, 32) in packs and (32, 64) in packs  # the feed-forward layers' weights, in int8


def test_evaluate_json_names_the_dtype(model_dir, tmp_path, capsys):
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    ref.write_text("\n".join(["A dog runs.", "", "Two men.", "A woman."]) + "\n")
    args = ["evaluate", "--model", str(model_dir), "--src", str(src), "--ref", str(ref), *FAST]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "float32"
    from attnkit.generation.packed import int8_available

    if int8_available():
        assert main([*args, "--json", "--dtype", "int8"]) == 0
        assert json.loads(capsys.readouterr().out)["dtype"] == "int8"


def test_dtype_int8_is_for_translation(capsys, tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("some text\n", encoding="utf-8")
    assert main(["evaluate", "--text", str(path), "--dtype", "int8"]) == 2
    assert "--dtype int8: for translation models" in capsys.readouterr().err
