"""attnkit.cli.options.check_output_path: outputs are checked before any work, through
symbolic links, FIFOs accepted; what is not a file is refused by name, by the check and by the
writer alike. The writer itself is tested in tests/test_files.py. Only tmp_path is written
(never a real device)."""

from __future__ import annotations

import io
import os
import re
import socket
import sys

import pytest

from attnkit import files
from attnkit.cli import main, options
from attnkit.cli.options import check_output_path
from attnkit.files import write_text


def test_the_writer_is_re_exported_for_the_commands():
    assert options.write_file is files.write_file and options.write_text is files.write_text


def test_a_fifo_is_accepted_as_an_output(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert check_output_path(fifo, "--output") == fifo


@pytest.mark.parametrize("kind", ["directory", "socket", "link to a directory"])
def test_what_is_not_a_file_is_refused_by_name(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)  # a short socket path (sun_path holds ~108 bytes)
    path = tmp_path / "out"
    sock = None
    if kind == "directory":
        path.mkdir()
        (path / "keep.txt").write_text("precious")
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind("out")
    else:
        (tmp_path / "d").mkdir()
        path.symlink_to(tmp_path / "d")
    try:
        what = "a socket" if kind == "socket" else "a directory"
        with pytest.raises(
            ValueError, match=rf"^{re.escape(repr(str(path)))} is {what}, expected a file"
        ):
            write_text(path, "x")
        with pytest.raises(
            ValueError, match=rf"^--output: {re.escape(repr(str(path)))} is {what}, expected"
        ):
            check_output_path(path, "--output")
    finally:
        if sock is not None:
            sock.close()
    if kind == "directory":
        assert (path / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["out", *(["d"] if kind == "link to a directory" else [])]
    )


def test_a_link_into_a_missing_folder_is_refused_before_work(tmp_path):
    link = tmp_path / "out.txt"
    link.symlink_to(tmp_path / "gone" / "out.txt")
    with pytest.raises(ValueError, match=r"the folder '.*gone' of '.*out.txt' does not exist"):
        check_output_path(link, "--output")


def test_cli_names_a_socket_output_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("w.png")
        assert main(["walkthrough", "a b", "--plot", "w.png"]) == 2
    err = capsys.readouterr().err
    assert err == "attnkit walkthrough: error: --plot: 'w.png' is a socket, expected a file name\n"


@pytest.mark.parametrize("how", ["same path", "symbolic link", "hard link"])
def test_an_output_that_is_an_input_is_refused(tmp_path, how):
    """`translate -i x.de -o x.de` replaced the source with its translation (exit 0)."""
    source = tmp_path / "x.de"
    source.write_text("Ein Hund.\n")
    out = source
    if how != "same path":
        out = tmp_path / "out.txt"
        (out.symlink_to if how == "symbolic link" else out.hardlink_to)(source)
    with pytest.raises(ValueError, match=r"^--output: '.*' is the --input file; writing it"):
        check_output_path(out, "--output", inputs=[(source, "--input")])
    assert source.read_text() == "Ein Hund.\n"
    other = tmp_path / "x.en"
    other.write_text("old\n")  # another existing file, or standard input: written as before
    assert check_output_path(other, "--output", inputs=[(source, "--input"), ("-", "-i")]) == other


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    "stdin, path, said",
    [(_Terminal(), "-", True), (io.StringIO(), "-", False), (_Terminal(), "in.txt", False)],
    ids=["terminal", "pipe", "file"],
)
def test_reading_a_terminal_is_said_and_how_to_end_it(monkeypatch, capsys, stdin, path, said):
    from attnkit.cli.options import note_terminal_input

    monkeypatch.setattr(sys, "stdin", stdin)
    note_terminal_input(path, "translate", "sentences")
    expected = (
        "attnkit translate: reading sentences from the terminal, one a line; end with Ctrl-D "
        "(Ctrl-C to stop)\n"
    )
    assert capsys.readouterr().err == (expected if said else "")


def test_translate_on_a_terminal_says_so_then_translates_what_is_typed():
    """Before: `attnkit translate` on a terminal waited without a word."""
    import pty
    import select
    import subprocess

    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnkit", "translate", "--dtype", "float32"],
        stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(terminal)
    try:
        err = b""
        while b"Ctrl-D" not in err:  # the hint comes before anything is read
            ready, _, _ = select.select([proc.stderr], [], [], 120)
            assert ready, f"no hint on standard error: {err!r}"
            chunk = os.read(proc.stderr.fileno(), 4096)
            assert chunk, f"the command ended before the hint: {err!r}"  # (no busy loop)
            err += chunk
        os.write(controller, b"Ein Hund rennt.\n\x04")  # a line, then Ctrl-D
        out, rest = proc.communicate(timeout=300)
    finally:
        proc.kill()
        os.close(controller)
    assert proc.returncode == 0, rest
    assert b"attnkit translate: reading sentences from the terminal" in err
    assert out.decode().strip().lower().startswith("a dog"), out
