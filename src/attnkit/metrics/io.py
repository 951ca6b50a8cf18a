"""Reading hypothesis and reference files for BLEU, with errors that name the file and line.

Files are UTF-8, one segment per line, split on ``\\n`` only (as sacreBLEU reads them), so a
stray ``\\r`` or Unicode line separator stays inside its line. ``-`` is standard input and a
name ending in ``.gz`` is read through gzip.
"""

from __future__ import annotations

import gzip
import os
import sys
from collections.abc import Sequence

STDIN = "-"


def _display(path: str | os.PathLike) -> str:
    return "<stdin>" if str(path) == STDIN else repr(os.fspath(path))


def read_lines(path: str | os.PathLike) -> list[str]:
    """Read a UTF-8 text file as a list of lines without their ``\\n``.

    Args:
        path: File name; ``"-"`` for standard input, ``*.gz`` for gzip.

    Returns:
        The lines. A final newline does not start an extra empty line; an empty file has none.

    Raises:
        FileNotFoundError: If the file does not exist.
        ValueError: If the file is not valid UTF-8 (naming the file, the 1-based line and the
            byte offset within it) or cannot be read.
    """
    name = _display(path)
    try:
        if str(path) == STDIN:
            data = sys.stdin.buffer.read()
        elif os.fspath(path).endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except FileNotFoundError:
        raise
    except (OSError, EOFError) as err:
        raise ValueError(f"{name}: cannot read the file ({err})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"{name}: line {line} is not valid UTF-8 ({err.reason}: byte "
            f"0x{data[err.start]:02x} at byte {err.start - line_start + 1} of the line)"
        ) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


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
                f"hypothesis file {_display(hypothesis_path)} has {len(hypotheses)} lines but "
                f"reference file {_display(path)} has {len(lines)} lines; they must match line by line"
            )
        references.append(lines)
    return hypotheses, references
