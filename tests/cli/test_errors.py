"""Errors of the command line: one line `attnkit COMMAND: error: ...`, exit 2, never a traceback
(`-v` gives the traceback); numeric flags checked by argparse; BLEU and embed file errors."""

from __future__ import annotations

import argparse
import errno
import importlib
import io
import json
import math
import subprocess
import sys

import pytest

from attnkit.cli import build_parser, main
from attnkit.cli.options import MAX_BATCH_SIZE, integer, real

walkthrough_cmd = importlib.import_module("attnkit.cli.commands.walkthrough")


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


# --------------------------------------------------------------------------- the last resort


@pytest.mark.parametrize(
    "error, message, status",
    [
        (
            RuntimeError("CUDA error: device-side assert\nmore lines"),
            "CUDA error: device-side assert (run with -v for the traceback)",
            2,
        ),
        (
            RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 24 GB"),
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 24 GB (run with -v",
            2,
        ),
        (MemoryError(), "out of memory (run with -v for the traceback)", 2),
        (
            OSError(errno.ENOSPC, "No space left on device", "out.png"),
            "no space left on the device while writing 'out.png'",
            2,
        ),
        (OSError(errno.EIO, "Input/output error", "x.png"), "'x.png': Input/output error", 2),
        (
            PermissionError(errno.EACCES, "Permission denied", "/etc/x"),
            "permission denied: '/etc/x' cannot be opened",
            2,
        ),
        (
            IsADirectoryError(errno.EISDIR, "Is a directory", "d"),
            "'d' is a directory, expected a file",
            2,
        ),
        (
            NotADirectoryError(errno.ENOTDIR, "Not a directory", "f/x"),
            "a part of 'f/x' is a file",
            2,
        ),
        (
            FileNotFoundError(errno.ENOENT, "No such file", "gone"),
            "'gone': no such file or directory",
            2,
        ),
        (OSError("no errno at all"), "no errno at all", 2),
        (ValueError("first line\nsecond line"), "first line", 2),
        (KeyboardInterrupt(), "interrupted", 130),
    ],
)
def test_failures_are_one_line(monkeypatch, capsys, error, message, status):
    def run(args):
        raise error

    monkeypatch.setattr(walkthrough_cmd, "run", run)
    assert main(["walkthrough"]) == status
    err = capsys.readouterr().err
    assert err.startswith(f"attnkit walkthrough: error: {message}"), err
    assert err.count("\n") == 1


def test_an_interrupt_while_the_arguments_are_parsed_is_one_line(monkeypatch, capsys):
    """Parsing imports torch for some options' checks (train's --max-steps: the first half
    second of `attnkit train`): a Ctrl-C there gave Python's traceback and status 1."""

    def interrupted(self, args=None, namespace=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", interrupted)
    assert main(["train", "--resume", "x"]) == 130
    assert capsys.readouterr().err == "attnkit: error: interrupted\n"


# A Ctrl-C while numpy is first imported: raised at that import, in a fresh interpreter.
_INTERRUPTED_NUMPY = """
import builtins, sys
real = builtins.__import__
def first_numpy_import_interrupted(name, *args, **kwargs):
    if name == "numpy" and not getattr(builtins, "interrupted", False):
        builtins.interrupted = True
        raise KeyboardInterrupt
    return real(name, *args, **kwargs)
builtins.__import__ = first_numpy_import_interrupted
from attnkit.cli import main
sys.exit(main(["walkthrough"]))
"""


def test_an_interrupt_while_numpy_is_imported_stops_the_command():
    """torch's C code imports numpy and clears what that import raises: a Ctrl-C there was
    lost (the command ran on and exited 0) or left numpy half made (a later AttributeError,
    status 1). attnkit imports numpy first, where the interrupt is its one line."""
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_NUMPY], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 130, done.stderr[-2000:]
    assert done.stderr == "attnkit: error: interrupted\n"
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("error", "status"),
    [(RuntimeError("boom"), 2), (ValueError("boom"), 2), (KeyboardInterrupt("boom"), 130)],
)
def test_verbose_gives_the_traceback_and_the_same_status(monkeypatch, capsys, error, status):
    """-v adds the traceback before the one-line error; the exit status is the one without it
    (before: -v re-raised, and the status became Python's 1)."""

    def run(args):
        raise error

    monkeypatch.setattr(walkthrough_cmd, "run", run)
    for argv in (["-v", "walkthrough"], ["walkthrough", "-v"]):  # after the command too
        assert main(argv) == status
        err = capsys.readouterr().err
        assert err.startswith("Traceback (most recent call last):"), err
        assert f"{type(error).__name__}: boom" in err
        assert err.splitlines()[-1].startswith("attnkit walkthrough: error: ")
        assert "run with -v" not in err  # the advice is for runs without it
    assert main(["walkthrough"]) == status  # and no traceback when absent from both places
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "words"),
    [(["translate", "one.de"], "one.de"), (["evaluate", "--beams", "3"], "--beams 3")],
)
def test_unrecognized_arguments_are_the_commands_error(capsys, argv, words):
    """Reported by the command's parser, with its usage, as every other argument error (before:
    the top-level usage and 'attnkit: error:')."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: attnkit {argv[0]} ")
    assert err.endswith(f"attnkit {argv[0]}: error: unrecognized arguments: {words}\n")


def test_bugs_keep_their_traceback(monkeypatch):
    def run(args):
        raise KeyError("a bug")

    monkeypatch.setattr(walkthrough_cmd, "run", run)
    with pytest.raises(KeyError):
        main(["walkthrough"])


def test_closed_pipe_is_quiet(monkeypatch, capsys):
    def run(args):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(walkthrough_cmd, "run", run)
    assert main(["walkthrough"]) == 0
    assert capsys.readouterr().err == ""


def test_full_disk_at_the_final_flush(monkeypatch, capsys):
    class Full(io.StringIO):
        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sys, "stdout", Full())
    assert main(["walkthrough", "a b"]) == 2
    assert "no space left on the device while writing the output" in capsys.readouterr().err


# --------------------------------------------------------------------------- argparse types


@pytest.mark.parametrize("text", ["0", "-1", "x", "1.5", "nan", "inf", "", "1e3", "11"])
def test_integer_refuses(text):
    with pytest.raises(
        argparse.ArgumentTypeError, match=rf"expected an integer from 1 to 10, got {text!r}"
    ):
        integer(1, 10)(text)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-0.1", "x", "", "1e400"])
def test_real_refuses(text):
    with pytest.raises(
        argparse.ArgumentTypeError, match=rf"expected a finite number >= 0, got {text!r}"
    ):
        real(0)(text)


def test_types_accept():
    assert integer(1, 10)("10") == 10 and integer(0)(" 7 ") == 7
    assert real(0)("1e30") == 1e30 and real()("-2.5") == -2.5 and not math.isnan(real()("0"))


MY_COMMANDS = (
    "translate",
    "evaluate",
    "embed",
    "walkthrough",
    "bleu",
    "attention",
    "average",
    "train",
    "generate",
)


def test_every_numeric_flag_is_checked():
    """No bare int/float type is left in these commands: each numeric flag goes through a
    checked type (train's budgets through the bounds of their config fields), so nan, inf and
    out-of-range values are refused with a message."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in MY_COMMANDS:
        for action in sub.choices[name]._actions:
            assert action.type not in (int, float), (name, action.option_strings)


@pytest.mark.parametrize("command", MY_COMMANDS)
def test_every_help_works(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: attnkit " + command in capsys.readouterr().out


def test_translate_help_tells_the_rules(capsys):
    with pytest.raises(SystemExit):
        main(["translate", "--help"])
    out = capsys.readouterr().out
    for words in (
        "byte-order mark",
        "control characters",
        "runs of white space",
        "stripped",
        "empty line",
        "N lines in, N lines out",
        "1024",
        "memory",
        "- for standard input",
    ):
        assert words in out, words


# --------------------------------------------------------------------------- bleu


@pytest.fixture
def texts(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a b c\nd e\n")
    ref.write_text("a b c\nd e f\n")
    return hyp, ref


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{d}", "-r", "{ref}"], "HYP: '{d}' is a directory, expected a text file"),
        (["{hyp}", "-r", "{d}/nope.txt"], "-r: '{d}/nope.txt' does not exist"),
        (["-", "-r", "-"], "HYP, -r: only one of the files can be - (standard input)"),
        (
            ["{hyp}", "-r", "{ref}", "--ci", "--ci-samples", "100000000"],
            "--ci-samples: 100000000 resamples of 2 lines draw 200,000,000 indices",
        ),
    ],
)
def test_bleu_file_errors(capsys, tmp_path, texts, argv, message):
    hyp, ref = texts
    fill = dict(d=tmp_path, hyp=hyp, ref=ref)
    assert main(["bleu", *(a.format(**fill) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnkit bleu: error: {message.format(**fill)}"), err


def test_bleu_bom_and_crlf_are_line_ends_not_text(capsys, tmp_path, texts):
    hyp, ref = texts
    windows = tmp_path / "windows.txt"
    windows.write_bytes(b"\xef\xbb\xbfa b c\r\nd e\r\n")
    assert main(["bleu", str(hyp), "-r", str(ref)]) == 0
    plain = capsys.readouterr().out
    assert main(["bleu", str(windows), "-r", str(ref)]) == 0
    assert capsys.readouterr().out == plain


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--confidence-n", "1", "expected an integer >= 2, got '1'"),
        ("--width", "-1", "expected an integer from 0 to 16, got '-1'"),
        ("--smooth-value", "nan", "expected a finite number >= 0, got 'nan'"),
        ("--smooth-value", "inf", "expected a finite number >= 0, got 'inf'"),
        ("--seed", "-3", "expected an integer >= 0, got '-3'"),
    ],
)
def test_bleu_bad_numbers(capsys, texts, flag, value, message):
    hyp, ref = texts
    with pytest.raises(SystemExit) as exit_info:
        main(["bleu", str(hyp), "-r", str(ref), f"{flag}={value}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err  # argparse names the flag by all its spellings
    assert "attnkit bleu: error: argument " in err and f"{flag}: {message}" in err


# --------------------------------------------------------------------------- embed (no model needed)


def test_embed_non_utf8_stdin_names_line_and_byte(monkeypatch, capsys):
    _stdin(monkeypatch, b"fine\nalso fine\ncaf\xe9 au lait\n")
    assert main(["embed"]) == 2
    assert capsys.readouterr().err == (
        "attnkit embed: error: <stdin>: line 3 is not valid UTF-8 (invalid continuation byte: "
        "byte 0xe9 at byte 4 of line 3, byte offset 18 of the file)\n"
    )


def test_embed_reads_a_terminal_too_saying_so(monkeypatch, capsys):
    """Before: embed on a terminal without TEXT refused ('give at least one text') where its
    help says texts come from standard input, and translate and generate read theirs."""

    class Terminal(io.TextIOWrapper):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal(io.BytesIO(b"one\ntwo\n"), encoding="utf-8"))
    assert main(["embed", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["texts"] == ["one", "two"]
    assert "attnkit embed: reading texts from the terminal, one a line; end with" in captured.err


def test_embed_bad_arguments(monkeypatch, capsys):
    assert main(["embed", "ok", "caf\udce9"]) == 2
    assert capsys.readouterr().err == (
        "attnkit embed: error: TEXT 2: not valid UTF-8 (byte 0xe9 at character 4)\n"
    )
    _stdin(monkeypatch, b"")
    assert main(["embed"]) == 2
    assert "TEXT: give at least one text" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["embed", "--batch-size", "0", "x"])
    assert "argument --batch-size: expected a batch size from 1 to 1024, got '0'" in (
        capsys.readouterr().err
    )


# --------------------------------------------------------------------------- bounds


@pytest.mark.parametrize("value", ["0", "-1", "1025", "1000000", "1e3", "nan", "inf", "2.5"])
@pytest.mark.parametrize("command", ["embed", "generate"])
def test_batch_size_is_bounded(command, value, monkeypatch, capsys):
    """--batch-size goes from 1 to MAX_BATCH_SIZE, refused by argparse before any model
    is loaded, as translate's --beam is bounded."""
    from attnkit.models import bert, gpt

    for module, name in ((bert.BertModel, "from_pretrained"), (gpt.GPT, "from_pretrained")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--batch-size", value, "some text"])
    assert exit_info.value.code == 2
    assert (
        f"attnkit {command}: error: argument --batch-size: expected a batch size from 1 to "
        f"{MAX_BATCH_SIZE}, got {value!r}"
    ) in capsys.readouterr().err


@pytest.mark.parametrize("command", ["embed", "generate"])
def test_the_largest_batch_size_is_accepted(command):
    args = build_parser().parse_args([command, "--batch-size", str(MAX_BATCH_SIZE), "text"])
    assert args.batch_size == MAX_BATCH_SIZE


def test_library_warnings_read_as_the_commands_own_lines(tmp_path):
    """Before: `WARNING attnkit.viz.capture: source: ...` beside `attnkit translate: warning:`
    lines; now one form. A 300-word text is cut to the shipped model's length, with a warning
    logged by the library."""
    import subprocess

    text = " ".join(["Hund"] * 300)
    out = tmp_path / "a.html"
    done = subprocess.run(
        [sys.executable, "-m", "attnkit", "attention", text, "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "attnkit attention: warning: source: 300 tokens, cut to the model's" in done.stderr
    assert "WARNING" not in done.stderr


def test_info_lines_keep_their_level_and_logger():
    import logging

    from attnkit.cli import _CommandFormatter

    formatter = _CommandFormatter("serve")
    info = logging.LogRecord(
        "attnkit.serve", logging.INFO, __file__, 1, "listening on %s", ("x",), None
    )
    warning = logging.LogRecord("attnkit.x", logging.WARNING, __file__, 1, "odd: %d", (3,), None)
    assert formatter.format(info) == "INFO attnkit.serve: listening on x"
    assert formatter.format(warning) == "attnkit serve: warning: odd: 3"
