"""attnkit.cli.options.write_file / check_output_path: outputs are written whole or not at all,
through symbolic links, straight into FIFOs, keeping the file's mode; what is not a file is
refused by name. Only tmp_path is written (never a real device)."""

from __future__ import annotations

import errno
import os
import socket
import stat
import threading

import pytest

from attnkit.cli import main, options
from attnkit.cli.options import check_output_path, write_file, write_text


def test_a_new_file_and_a_replaced_one(tmp_path):
    out = tmp_path / "out.txt"
    write_text(out, "één\n")
    assert out.read_bytes() == "één\n".encode()
    write_file(out, b"\x89PNG")
    assert out.read_bytes() == b"\x89PNG"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary file left


def test_a_symbolic_link_stays_a_link_and_its_target_gets_the_text(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "hyp.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    write_text(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["hyp.txt"]
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "real" / "made.txt")  # the target does not exist yet
    write_text(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "real" / "made.txt").read_text() == "made"


def test_a_fifo_gets_the_text_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []

    def read():
        with open(fifo, "rb") as f:
            received.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    check_output_path(fifo, "--output")
    write_text(fifo, "through the pipe\n")
    reader.join(timeout=30)
    assert received == [b"through the pipe\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_the_mode_of_an_existing_file_is_kept(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old")
    os.chmod(out, 0o640)
    write_text(out, "new")
    assert stat.S_IMODE(out.stat().st_mode) == 0o640 and out.read_text() == "new"
    os.chmod(out, 0o604)
    write_file(out, b"again")
    assert stat.S_IMODE(out.stat().st_mode) == 0o604


def test_the_temporary_file_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", stat.S_ISDIR(os.fstat(fd).st_mode)))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_text(tmp_path / "out.txt", "x")
    # the file's data, then the rename, then the folder holding the new name
    assert events == [("fsync", False), ("replace", "out.txt"), ("fsync", True)]


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
        with pytest.raises(ValueError, match=rf"^{str(path)!r} is {what}, expected a file"):
            write_text(path, "x")
        with pytest.raises(ValueError, match=rf"^--output: {str(path)!r} is {what}, expected"):
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


@pytest.mark.parametrize("where", ["write", "replace"])
def test_a_full_disk_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch, where):
    out = tmp_path / "out.txt"
    out.write_text("old")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "replace":
        monkeypatch.setattr(os, "replace", full)
    else:
        real_open = open

        class Full:
            def __init__(self, path, mode):
                self.f = real_open(path, mode)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            write = staticmethod(full)

        monkeypatch.setattr(options, "open", Full, raising=False)
    with pytest.raises(OSError) as info:
        write_text(out, "new text")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(out)
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_cli_names_a_socket_output_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("w.png")
        assert main(["walkthrough", "a b", "--plot", "w.png"]) == 2
    err = capsys.readouterr().err
    assert err == "attnkit walkthrough: error: --plot: 'w.png' is a socket, expected a file name\n"
