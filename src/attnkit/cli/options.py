"""Checks shared by the commands: numeric flags, devices, output paths and text arguments;
and :func:`write_file`, the one writer of the files the commands and plots produce.

Numeric flags are checked by argparse ``type`` functions, so a bad value ends in argparse's
usage line and ``attnkit CMD: error: argument --beam: expected an integer >= 1, got '0'``
(exit 2) before anything is loaded. Devices and paths are checked before a model is loaded,
so a typo does not cost the loading time. Nothing here imports torch at import time.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
from pathlib import Path

STDIN = "-"
# The most texts or prompts a command runs through the model at once (--batch-size): far
# beyond what helps on a CPU, and a bound so that a typo (--batch-size 1000000) is refused
# with a message instead of padding a batch that exhausts memory.
MAX_BATCH_SIZE = 1024


def batch_size(text: str) -> int:
    """An argparse ``type`` for ``--batch-size``: an integer from 1 to :data:`MAX_BATCH_SIZE`."""
    return integer(1, MAX_BATCH_SIZE, what="a batch size")(text)


def integer(low: int | None = None, high: int | None = None, *, what: str = "an integer"):
    """An argparse ``type``: an integer in ``[low, high]`` (either bound may be None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if (
            value is None
            or (low is not None and value < low)
            or (high is not None and value > high)
        ):
            raise argparse.ArgumentTypeError(f"expected {_range(what, low, high)}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def real(low: float | None = None, high: float | None = None, *, what: str = "a number"):
    """An argparse ``type``: a finite float in ``[low, high]`` (nan and inf are refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value)
        ok = ok and (low is None or value >= low) and (high is None or value <= high)
        if not ok:
            raise argparse.ArgumentTypeError(
                f"expected {_range('a finite ' + what.removeprefix('a '), low, high)}, got {text!r}"
            )
        return value

    parse.__name__ = "real"
    return parse


def _range(what: str, low, high) -> str:
    if low is not None and high is not None:
        return f"{what} from {low} to {high}"
    if low is not None:
        return f"{what} >= {low}"
    if high is not None:
        return f"{what} <= {high}"
    return what


def threads(text: str) -> int:
    """An argparse ``type`` for ``--threads``: 1 to the number of CPUs this process may use."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return integer(1, cpus or 1, what="a thread count")(text)


def resolve_device(name: str | None):
    """The ``torch.device`` for ``--device``: validated against what this torch build has.

    None picks cuda when it is available, else cpu. ``cuda`` / ``cuda:N`` need CUDA and
    ``N < torch.cuda.device_count()``; ``mps`` needs Apple's MPS backend.

    Raises:
        ValueError: naming the device given and the devices available.
    """
    import torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    available = ["cpu"]
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        available += ["cuda", *(f"cuda:{i}" for i in range(count))]
    if torch.backends.mps.is_available():
        available.append("mps")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        device = None
    ok = device is not None and (
        device.index in (None, 0) if device.type == "cpu" else str(device) in available
    )
    if not ok:
        raise ValueError(
            f"--device: {name!r} is not available here; available: {', '.join(available)}"
        )
    return device


def check_output_path(path: str | os.PathLike, flag: str) -> Path:
    """Check, before any work, that a file can be written at ``path``.

    A symbolic link is checked (and later written) through to its target; a character device
    or a FIFO (``/dev/null``, a named pipe) is accepted and written directly.

    Raises:
        ValueError: if the path is a directory or another file that is neither a regular file,
            a character device nor a FIFO, its folder does not exist or is not a folder, or
            the file or folder is not writable (naming ``flag`` and the path).
    """
    out = Path(path)
    if str(path) == "":
        raise ValueError(f"{flag}: expected a file name, got an empty string")
    if out.is_dir():
        raise ValueError(f"{flag}: {str(out)!r} is a directory, expected a file name")
    kind = _unwritable_kind(out)
    if kind is not None:
        raise ValueError(f"{flag}: {str(out)!r} is {kind}, expected a file name")
    target = Path(os.path.realpath(out)) if out.is_symlink() else out
    folder = target.parent
    if not folder.exists():
        raise ValueError(f"{flag}: the folder {str(folder)!r} of {str(out)!r} does not exist")
    if not folder.is_dir():
        raise ValueError(f"{flag}: {str(folder)!r} is not a folder, so {str(out)!r} cannot be made")
    if target.exists() and not os.access(target, os.W_OK):
        raise ValueError(f"{flag}: {str(out)!r} is read-only")
    if not target.exists() and not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag}: cannot create files in the read-only folder {str(folder)!r}")
    return out


def check_input_path(path: str | os.PathLike, flag: str) -> None:
    """Check that ``path`` (or ``-``) names a readable file, naming ``flag`` otherwise.

    Raises:
        ValueError: if the path does not exist, is a directory or is not readable.
    """
    if str(path) == STDIN:
        return
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{flag}: {str(p)!r} does not exist")
    if p.is_dir():
        raise ValueError(f"{flag}: {str(p)!r} is a directory, expected a text file")
    if not os.access(p, os.R_OK):
        raise ValueError(f"{flag}: {str(p)!r} is not readable (permission denied)")


def check_text_argument(text: str, what: str) -> str:
    """Refuse a command-line text that was not valid UTF-8.

    Python keeps undecodable bytes of ``argv`` as lone surrogates (U+DC80-U+DCFF); they cannot
    be tokenized or printed.

    Raises:
        ValueError: naming ``what`` and the character position of the first bad byte.
    """
    for i, ch in enumerate(text):
        if "\udc80" <= ch <= "\udcff":
            raise ValueError(
                f"{what}: not valid UTF-8 (byte 0x{ord(ch) - 0xDC00:02x} at character {i + 1})"
            )
    return text


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISBLK, "a block device"),
)


def _unwritable_kind(path: Path) -> str | None:
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


def write_file(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` whole or not at all; returns ``path``.

    A regular file (or a new one) is written to a temporary file in the same folder, which is
    fsynced and then renamed over the target with ``os.replace``, so a full disk or an
    interrupt never leaves half an output behind and the old file stays as it was; the
    target's permission bits (and, when allowed, owner) are kept, and the folder is fsynced
    after the rename (best effort). A symbolic link stays a link: its target is written. A
    character device or a FIFO (``/dev/stdout``, a named pipe) is written directly: renaming
    over it would replace the device by a file.

    Raises:
        ValueError: if ``path`` is a directory, a socket, a block device or another special
            file (naming it).
        OSError: if writing fails (e.g. a full disk); the error names ``path``, and no
            temporary file is left behind.
    """
    given = os.fspath(path)
    kind = _unwritable_kind(Path(given))
    if kind is not None:
        raise ValueError(f"{given!r} is {kind}, expected a file to write")
    blob = data.encode("utf-8") if isinstance(data, str) else bytes(data)
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
    _fsync_folder(target.parent)
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


def _fsync_folder(folder: Path) -> None:
    """fsync a folder so that a rename in it survives a power loss (best effort: some file
    systems and platforms cannot open or sync a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
