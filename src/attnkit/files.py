"""Writing one file whole or not at all: :func:`write_file`, the one writer of the single files
attnkit produces (plots, HTML pages, ``translate --output``, a run's ``config.toml`` and
``metrics.jsonl``), and the folder fsync the folder writer shares.

It sits at the bottom of the package (it imports nothing from attnkit), so the library
(``model_folder``, ``viz``, ``training``) and the command line all use the same writer.
"""

from __future__ import annotations

import errno
import os
import re
import select
import shutil
import stat
import sys
from pathlib import Path

__all__ = [
    "default_file_mode",
    "descriptor",
    "fsync_folder",
    "replace_folder",
    "temp_beside",
    "unwritable_kind",
    "write_file",
    "write_text",
]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISBLK, "a block device"),
)


def unwritable_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` (followed through symbolic links) is when no output may go there: a
    directory, a socket, a block device or another special file; None for a regular file, a
    character device, a FIFO or nothing."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "a special file")


_LINK_HOPS = 40  # symbolic links followed before giving up (the kernel's limit)


def descriptor(path: str | os.PathLike) -> int | None:
    """The number of this process's open file descriptor that ``path`` names (``/dev/stdout``,
    ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``, ``/proc/self/task/T/fd/N``, through
    symbolic links to them or to their folders), else None.

    Such a path must be written through the descriptor itself: following it leads to whatever
    the shell connected (a file opened for appending, ``>>``, a file other output also goes
    to, a pipe), and opening or replacing that would truncate it or fail.
    """
    pid = os.getpid()
    own = re.compile(
        rf"/(?:dev/fd|proc/(?:self|thread-self|{pid})(?:/task/\d+)?/fd)/(\d+)"
    )  # (the folders' own names, and what they resolve to: /proc/PID/fd, /proc/PID/task/T/fd)
    current = os.path.abspath(os.fspath(path))
    for _ in range(_LINK_HOPS):
        found = own.fullmatch(current)
        if found:
            return int(found.group(1))
        # the folder through its links (/dev/fd -> /proc/self/fd -> /proc/PID/fd), then the name
        folder, name = os.path.split(current)
        current = os.path.join(os.path.realpath(folder), name)
        found = own.fullmatch(current)
        if found:
            return int(found.group(1))
        if not os.path.islink(current):
            return None
        current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
    return None


def _flush_streams() -> None:
    """Flush what Python buffered for standard output and error (as replaced or not): the
    text printed before an output written through a descriptor comes before it, whichever
    descriptor the streams and the output share."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (AttributeError, OSError, ValueError):  # closed, or a stream without a flush
            pass


def _write_descriptor(fd: int, blob: bytes, given: str) -> None:
    """Write ``blob`` to the open descriptor ``fd`` at its own position (append mode kept),
    waiting while a non-blocking one is full. Not whole-or-nothing: a pipe or terminal takes
    the text as it comes (a full disk or a closed pipe can leave part of it written)."""
    _flush_streams()
    view = memoryview(blob)
    try:
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:  # a non-blocking descriptor that is full: wait for room
                select.select([], [fd], [])
    except (OSError, OverflowError) as err:  # (OverflowError: a number beyond any descriptor)
        errno_ = getattr(err, "errno", None) or errno.EBADF
        raise OSError(errno_, getattr(err, "strerror", None) or str(err), given) from err


def write_file(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` whole or not at all; returns ``path``.

    A regular file (or a new one) is written to a temporary file in the same folder, which is
    fsynced and then renamed over the target with ``os.replace``, so a full disk or an
    interrupt never leaves half an output behind and the old file stays as it was; the
    target's permission bits (and, when allowed, owner) are kept, and the folder is fsynced
    after the rename (best effort). A symbolic link stays a link: its target is written. A
    character device or a FIFO (``/dev/null``, a named pipe) is written directly: renaming
    over it would replace the device by a file. A path naming one of the process's open
    descriptors (``/dev/stdout``, :func:`descriptor`) is written through that descriptor, after
    what the process printed, whatever it leads to (a pipe, a file the shell opened with
    ``>>``: its contents stay); such a write is not whole-or-nothing (a stream cannot be).

    Raises:
        ValueError: if ``path`` is a directory, a socket, a block device or another special
            file (naming it).
        OSError: if writing fails (e.g. a full disk); the error names ``path``, and no
            temporary file is left behind.
    """
    given = os.fspath(path)
    blob = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    fd = descriptor(given)
    if fd is not None:
        _write_descriptor(fd, blob, given)
        return Path(given)
    kind = unwritable_kind(given)
    if kind is not None:
        raise ValueError(f"{given!r} is {kind}, expected a file to write")
    target = Path(os.path.realpath(given))  # through symbolic links: a link stays a link
    try:
        old = os.stat(target)
    except FileNotFoundError:
        old = None
    try:
        if old is not None and not stat.S_ISREG(old.st_mode):  # a character device or FIFO
            with open(target, "wb") as f:
                f.write(blob)
            return Path(given)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            if old is not None:
                _keep_mode_and_owner(tmp, old)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as err:
        if err.errno is not None and (err.filename is None or os.fspath(err.filename) != given):
            # Name the file the user gave, not the temporary file or the resolved link.
            raise OSError(err.errno, err.strerror or str(err), given) from err
        raise
    fsync_folder(target.parent)
    return Path(given)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all (see :func:`write_file`)."""
    write_file(path, text)


def _keep_mode_and_owner(tmp: Path, old: os.stat_result) -> None:
    os.chmod(tmp, stat.S_IMODE(old.st_mode))
    if hasattr(os, "chown") and (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
        try:
            os.chown(tmp, old.st_uid, old.st_gid)
        except OSError:  # only root may give a file away; the file keeps its mode anyway
            pass


def fsync_folder(folder: str | os.PathLike, *, strict: bool = False) -> None:
    """fsync a folder so that a rename in it survives a power loss.

    Best effort: a folder that cannot be opened (some platforms) is skipped, and so is an
    fsync that fails, unless ``strict`` (then its OSError is raised: the folder writer's
    temporary folder must reach the disk before it is renamed into place).
    """
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        if strict:
            raise
    finally:
        os.close(fd)


def default_file_mode() -> int:
    """The permission bits ``open(path, "w")`` gives a new file: ``0o666 & ~umask``.

    For writers that create files with a mode of their own (safetensors writes 0o600).
    Linux tells the umask in ``/proc/self/status``; elsewhere it is read by setting it and
    putting it back at once.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def check_folder_target(target: str | os.PathLike, what: str) -> None:
    """Raises a ValueError naming ``what`` (the option or role of the folder) and ``target``
    if a folder cannot be written there by name: an empty path, ``.`` or ``..`` (a folder is
    written beside its name and renamed into place), or a path under a file."""
    given, target = os.fspath(target), Path(target)
    if target.name in ("", ".", ".."):
        raise ValueError(
            f"{what} {given!r}: expected a folder's name (not the current or parent folder): "
            "the folder is written beside it and renamed into place"
        )
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{what} {given!r}: {os.fspath(parent)!r} is not a folder")
            break


def temp_beside(target: Path, what: str) -> tuple[Path, Path]:
    """``(tmp, old)`` beside ``target`` for writing a folder atomically: ``NAME.tmp-<pid>``,
    created empty (a leftover of this process id removed first), and ``NAME.old-<pid>``, free,
    for :func:`replace_folder`. A target that cannot be written by name
    (:func:`check_folder_target`) or a parent that cannot be written is a ValueError naming
    ``what`` (the option or role of the folder) and ``target``."""
    check_folder_target(target, what)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    old = target.with_name(f"{target.name}.old-{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in (tmp, old):
            if stale.exists():
                shutil.rmtree(stale)
        tmp.mkdir()
    except OSError as err:  # no permission, a pseudo file system (/proc), ...
        if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):  # the CLI's advice for these
            raise OSError(err.errno, err.strerror, os.fspath(target)) from None
        raise ValueError(
            f"{what} {os.fspath(target)!r}: cannot write beside it in "
            f"{os.fspath(target.parent)!r} ({err.strerror or err})"
        ) from None
    return tmp, old


def replace_folder(tmp: Path, target: Path, old: Path, what: str) -> None:
    """Put the finished folder ``tmp`` where ``target`` is: ``target`` (if it exists) is
    renamed to ``old``, ``tmp`` to ``target``, the parent folder is synced, then ``old`` is
    deleted. If a rename fails, ``target`` is put back and ``tmp`` removed, and the error is a
    ValueError naming ``what`` (the option or role of the folder) and ``target``."""
    try:
        if target.exists():
            os.rename(target, old)
        os.rename(tmp, target)
    except OSError as err:
        if old.exists() and not target.exists():
            os.rename(old, target)
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(f"{what} {os.fspath(target)!r}: cannot replace it ({err})") from None
    fsync_folder(target.parent, strict=True)
    if old.exists():
        shutil.rmtree(old)
