"""Checks shared by the commands: numeric flags, devices, output paths and text arguments.

:func:`write_file` and :func:`write_text`, the writer of the files the commands produce, live in
:mod:`attnkit.files` (the library uses them too) and are re-exported here.

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
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from attnkit.cpus import usable_cpus
from attnkit.files import descriptor, unwritable_kind, write_file, write_text

__all__ = [
    "MAX_BATCH_SIZE",
    "STDIN",
    "batch_size",
    "check_input_path",
    "check_output_path",
    "check_text_argument",
    "integer",
    "note_terminal_input",
    "real",
    "resolve_device",
    "threads",
    "write_file",
    "write_text",
]

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
    return integer(1, usable_cpus(), what="a thread count")(text)


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


def check_output_path(
    path: str | os.PathLike, flag: str, *, inputs: Sequence[tuple[str | os.PathLike, str]] = ()
) -> Path:
    """Check, before any work, that a file can be written at ``path``.

    A symbolic link is checked (and later written) through to its target; a character device
    or a FIFO (``/dev/null``, a named pipe) is accepted and written directly; a path naming an
    open descriptor of the process (``/dev/stdout``: :func:`attnkit.files.descriptor`) must be
    open for writing, and is written through it. ``inputs``:
    (path, flag) of the files the command reads; writing over one of them would lose it.

    Raises:
        ValueError: if the path is a directory or another file that is neither a regular file,
            a character device nor a FIFO, its folder does not exist or is not a folder, the
            file or folder is not writable, or it is one of ``inputs`` (naming ``flag`` and
            the path).
    """
    out = Path(path)
    if str(path) == "":
        raise ValueError(f"{flag}: expected a file name, got an empty string")
    fd = descriptor(out)
    if fd is not None:
        _check_writable_descriptor(fd, out, flag, inputs)
        return out
    if out.is_dir():
        raise ValueError(f"{flag}: {str(out)!r} is a directory, expected a file name")
    kind = unwritable_kind(out)
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
    for source, source_flag in inputs:
        if str(source) != STDIN and target.is_file() and _same_file(target, source):
            raise ValueError(
                f"{flag}: {str(out)!r} is the {source_flag} file; writing it would replace the "
                "text being read: choose another output file"
            )
    if not target.exists() and not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag}: cannot create files in the read-only folder {str(folder)!r}")
    return out


def _check_writable_descriptor(
    fd: int, out: Path, flag: str, inputs: Sequence[tuple[str | os.PathLike, str]]
) -> None:
    """A descriptor ``out`` names (:func:`attnkit.files.descriptor`) must be open for writing,
    not lead to a block device, and not be one of ``inputs`` opened without appending (``1<>
    in.txt``: the output would overwrite the text being read)."""
    name = f"{flag}: {str(out)!r} names descriptor {fd}"
    try:
        import fcntl  # POSIX; a path naming a descriptor is a POSIX notion too

        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        info = os.fstat(fd)
    except ImportError:
        return
    except (OSError, OverflowError):  # (OverflowError: a number beyond any descriptor)
        raise ValueError(f"{name}, which is not open") from None
    if flags & os.O_ACCMODE not in (os.O_WRONLY, os.O_RDWR):
        raise ValueError(f"{name}, open for reading only")
    if stat.S_ISBLK(info.st_mode):
        raise ValueError(f"{name}, which leads to a block device, expected a file or a stream")
    if stat.S_ISREG(info.st_mode) and not flags & os.O_APPEND:
        for source, source_flag in inputs:
            if str(source) != STDIN and _same_file(out, source):  # (out leads to the fd's file)
                raise ValueError(
                    f"{name}, which is the {source_flag} file; writing it would replace the text "
                    "being read: choose another output file"
                )


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)  # through links, hard and symbolic
    except OSError:  # one of them does not exist (yet)
        return False


def note_terminal_input(path: str | os.PathLike, command: str, what: str) -> None:
    """Say on standard error that ``path`` (``-``) is read from the terminal, and how to end
    it: without a word the command would seem to hang. Nothing when input is a file or pipe."""
    stdin = str(path) == STDIN or descriptor(path) == 0  # `-` or /dev/stdin
    if stdin and sys.stdin is not None and sys.stdin.isatty():
        end = "Ctrl-Z then Enter" if os.name == "nt" else "Ctrl-D"
        print(
            f"attnkit {command}: reading {what} from the terminal, one a line; "
            f"end with {end} (Ctrl-C to stop)",
            file=sys.stderr,
            flush=True,
        )


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


def option_error(err: ValueError, options: Mapping[str, str]) -> ValueError:
    """``err`` naming the option a command-line user typed (``--min-len: ...``) where the
    library named its argument (``min_len: ...``); ``options``: argument -> option. Other
    messages are kept as they are."""
    message = str(err)
    for name, option in options.items():
        if message.startswith(name + ":"):
            return ValueError(option + message[len(name) :])
    return ValueError(message)
