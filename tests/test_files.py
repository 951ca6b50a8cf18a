"""attnkit.files.write_file: a file is written whole or not at all, through symbolic links,
straight into FIFOs, keeping the file's mode; a full disk leaves the old file and no temporary
file. Only tmp_path is written (never a real device). And the layering it exists for: the
library writes files without importing the command line."""

from __future__ import annotations

import ast
import errno
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import attnkit
from attnkit import files
from attnkit.files import write_file, write_text


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
    write_text(fifo, "through the pipe\n")
    reader.join(timeout=30)
    assert received == [b"through the pipe\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_descriptor_names_the_open_descriptors_a_path_leads_to(tmp_path):
    assert files.descriptor("/dev/stdout") == 1
    assert files.descriptor("/dev/stderr") == 2
    assert files.descriptor("/dev/fd/7") == 7
    assert files.descriptor(f"/proc/{os.getpid()}/fd/5") == 5
    assert files.descriptor("/proc/self/fd/3") == 3
    link = tmp_path / "to_stdout"
    link.symlink_to("/dev/stdout")
    again = tmp_path / "again"
    again.symlink_to(link)
    assert files.descriptor(again) == 1
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert files.descriptor(plain) is None
    assert files.descriptor(tmp_path / "missing.txt") is None
    assert files.descriptor(f"/proc/{os.getpid() + 1}/fd/1") is None  # another process's
    folder = tmp_path / "fds"
    folder.symlink_to("/dev/fd")  # a link to the folder, not to the descriptor
    assert files.descriptor(folder / "4") == 4
    assert files.descriptor(f"/proc/self/task/{threading.get_native_id()}/fd/6") == 6
    relative = Path(os.path.relpath("/dev/stdout"))
    assert files.descriptor(relative) == 1


def test_a_full_non_blocking_pipe_is_waited_for_and_gets_everything():
    """A non-blocking descriptor (as some process managers give) took 64 KiB, then raised
    BlockingIOError."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    blob = bytes(range(256)) * 2048  # 512 KiB, more than a pipe holds
    received = bytearray()

    def drain():
        while chunk := os.read(read_end, 65536):
            received.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        write_file(f"/dev/fd/{write_end}", blob)
    finally:
        os.close(write_end)
    reader.join(timeout=60)
    os.close(read_end)
    assert bytes(received) == blob


def test_a_descriptor_number_beyond_any_is_an_os_error_naming_the_path():
    with pytest.raises(OSError, match="/dev/fd/4294967296"):
        write_file("/dev/fd/4294967296", "x")


_CHILD = (
    "import sys; from attnkit.files import write_file; "
    "print('printed first', flush=False); write_file(sys.argv[1], 'written\\n')"
)


@pytest.mark.parametrize("name", ["/dev/stdout", "link"])
def test_dev_stdout_is_written_through_the_descriptor_after_the_printed_text(tmp_path, name):
    """A file the shell opened for appending (`>> log`) keeps its lines: /dev/stdout leads to
    it, and replacing it whole (as a regular file is written) would lose them."""
    link = tmp_path / "link"
    link.symlink_to("/dev/stdout")
    path = str(link) if name == "link" else name
    log = tmp_path / "log.txt"
    log.write_text("kept\n")
    with open(log, "ab") as appending:
        subprocess.run([sys.executable, "-c", _CHILD, path], stdout=appending, check=True)
    assert log.read_text() == "kept\nprinted first\nwritten\n"
    piped = subprocess.run(
        [sys.executable, "-c", _CHILD, path], stdout=subprocess.PIPE, check=True
    )  # a pipe: /dev/stdout leads to no file at all
    assert piped.stdout == b"printed first\nwritten\n"


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

        monkeypatch.setattr(files, "open", Full, raising=False)
    with pytest.raises(OSError) as info:
        write_text(out, "new text")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(out)
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_default_file_mode_is_what_a_new_file_gets(tmp_path, umask):
    old = os.umask(umask)
    try:
        (tmp_path / "new").touch()
        assert files.default_file_mode() == stat.S_IMODE((tmp_path / "new").stat().st_mode)
    finally:
        os.umask(old)


def _attnkit_imports(path: Path) -> set[str]:
    """Every attnkit module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n == "attnkit" or n.startswith("attnkit.")}
    return found


def test_the_library_never_imports_the_command_line():
    package = Path(attnkit.__file__).parent
    offenders = {
        str(path.relative_to(package)): sorted(i for i in imports if i.startswith("attnkit.cli"))
        for path in package.rglob("*.py")
        if path.relative_to(package).parts[0] not in ("cli", "__main__.py")
        for imports in [_attnkit_imports(path)]
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_files_imports_nothing_from_attnkit():
    assert _attnkit_imports(Path(files.__file__)) == set()
