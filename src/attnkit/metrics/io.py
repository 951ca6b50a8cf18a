"""Reading text files one segment a line: the one ``read_lines`` of attnkit.

BLEU files (:func:`read_corpus`), parallel corpora (:func:`attnkit.data.load_parallel`) and
the ``translate`` / ``evaluate`` commands all read text with :func:`read_lines`:

* UTF-8 only; a file that is not names the file, the line and the byte offset;
* a UTF-8 byte-order mark at the start of the file is dropped (sacreBLEU would keep it inside
  the first word of the first line);
* lines are split on ``\\n`` only, and a ``\\r`` just before it is removed (CRLF files); a
  ``\\r``, form feed or Unicode line separator anywhere else stays inside its line, so the
  line count is the count of ``\\n`` (plus one for a last line without one);
* ``-`` is standard input; a file is decompressed when its name ends in ``.gz`` or its content
  starts with gzip's magic bytes (a ``.gz`` that is not gzip is an error).

Nothing else is changed: leading, trailing and repeated spaces stay, so references are
scored exactly as they are (BLEU strips line ends itself; the translator normalises its own
input, :func:`attnkit.decoding.normalize_source`). Nothing here imports torch.
"""

from __future__ import annotations

import gzip
import os
import sys
import zlib
from collections.abc import Sequence

STDIN = "-"
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"


def display_name(path: str | os.PathLike) -> str:
    """How messages name a file: ``<stdin>`` for ``-``, else the quoted path."""
    return "<stdin>" if str(path) == STDIN else repr(os.fspath(path))


def _read_bytes(path: str | os.PathLike, name: str) -> bytes:
    if str(path) == STDIN:
        return sys.stdin.buffer.read()
    if os.path.isdir(path):
        raise ValueError(f"{name}: cannot read the file: it is a directory, expected a text file")
    with open(path, "rb") as f:  # FileNotFoundError / PermissionError go up as they are
        data = f.read()
    if data.startswith(_GZIP_MAGIC) or os.fspath(path).endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise ValueError(
                f"{name}: cannot read the file: not a valid gzip file ({err})"
            ) from None
    return data


def decode_utf8(data: bytes, name: str) -> str:
    """Decode ``data`` as UTF-8, naming ``name``, the line and the byte offset on failure.

    Raises:
        ValueError: ``NAME: line L is not valid UTF-8 (REASON: byte 0xXX at byte C of line L,
            byte offset O of the file)``.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"{name}: line {line} is not valid UTF-8 ({err.reason}: byte "
            f"0x{data[err.start]:02x} at byte {err.start - line_start + 1} of line {line}, "
            f"byte offset {err.start} of the file)"
        ) from None


def read_lines(path: str | os.PathLike) -> list[str]:
    """Read a UTF-8 text file as a list of lines (the module docstring gives every rule).

    Args:
        path: File name; ``"-"`` for standard input; gzip by name (``.gz``) or content.

    Returns:
        The lines without their ``\\n`` / ``\\r\\n``. A final newline does not start an
        extra line; an empty file gives ``[]``.

    Raises:
        FileNotFoundError, PermissionError: as :func:`open` raises them.
        ValueError: if the path is a directory, a damaged gzip file or not valid UTF-8
            (naming the file, the 1-based line and the byte offset).
    """
    name = display_name(path)
    data = _read_bytes(path, name)
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    lines = decode_utf8(data, name).split("\n")  # not splitlines(): \x0b, \u2028... stay
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_corpus(hypothesis_path: str | os.PathLike, reference_paths: Sequence[str | os.PathLike]):
    """Read a hypothesis file and its reference files, checking that the line counts agree.

    Args:
        hypothesis_path: System output, one segment per line (``"-"`` for standard input).
        reference_paths: One or more reference files, each with one line per hypothesis.

    Returns:
        ``(hypotheses, references)``: a list of lines and a list of reference streams.

    Raises:
        ValueError: If no reference file is given, a file is not UTF-8, or a reference file
            has a different number of lines than the hypothesis file (naming both files and
            both counts).
    """
    if not reference_paths:
        raise ValueError("reference_paths: give at least one reference file")
    hypotheses = read_lines(hypothesis_path)
    references = []
    for path in reference_paths:
        lines = read_lines(path)
        if len(lines) != len(hypotheses):
            raise ValueError(
                f"hypothesis file {display_name(hypothesis_path)} has {len(hypotheses)} lines but "
                f"reference file {display_name(path)} has {len(lines)} lines; they must match line by line"
            )
        references.append(lines)
    return hypotheses, references
