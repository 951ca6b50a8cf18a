"""Checks for model config fields, shared by every model config's ``__post_init__``.

Configs arrive from ``config.json`` files written by other programs, so every field is checked
for its type as well as its range: an integer size must be a real ``int`` (not a bool, not a
string such as ``"384"``, not ``384.0``), a probability a number in [0, 1). Each error names the
field, what was given and what was expected; the code that reads a file adds the file's path.

Bounds. No size may exceed :data:`MAX_SIZE` (2**20 = 1,048,576: more than any vocabulary,
width or length a model here uses), and a config whose parameters would exceed
:data:`MAX_PARAMETERS` (2**33, about 8.6 billion: 34 GB in float32) is refused before anything
is allocated, so a typo such as ``"d_model": 10000000`` is an error, not an out-of-memory kill.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

MAX_SIZE = 2**20
MAX_PARAMETERS = 2**33


def _given(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_size(name: str, value: Any, *, minimum: int = 1, maximum: int = MAX_SIZE) -> None:
    """``value`` must be an int (not a bool) in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValueError(
            f"{name}: expected an integer from {minimum} to {maximum:,}, got {_given(value)}"
        )


def check_number(
    name: str,
    value: Any,
    *,
    low: float,
    high: float,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """``value`` must be a finite int or float (not a bool) between ``low`` and ``high``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (
            value < high if high_open else value <= high
        )
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name}: expected a number in {interval}, got {_given(value)}")


def check_probability(name: str, value: Any, *, allow_none: bool = False) -> None:
    """``value`` must be a number in [0, 1) (a dropout rate); None too with ``allow_none``."""
    if value is None and allow_none:
        return
    check_number(name, value, low=0.0, high=1.0, high_open=True)


def check_bool(name: str, value: Any) -> None:
    """``value`` must be True or False (not 0/1, not "true")."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false, got {_given(value)}")


def check_choice(name: str, value: Any, choices: Sequence[str]) -> None:
    """``value`` must be one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}, got {_given(value)}")


def check_divisible(name: str, value: int, divisor_name: str, divisor: int) -> None:
    """``value`` must be a multiple of ``divisor`` (e.g. the width of the heads)."""
    if value % divisor:
        raise ValueError(
            f"{name} must be a multiple of {divisor_name}, got {name}={value}, "
            f"{divisor_name}={divisor}"
        )


def check_parameters(owner: str, count: int, detail: str) -> None:
    """Refuses a config whose (estimated) parameter count exceeds :data:`MAX_PARAMETERS`."""
    if count > MAX_PARAMETERS:
        raise ValueError(
            f"{owner}: about {count:,} parameters ({detail}), more than the {MAX_PARAMETERS:,} "
            "attnkit allocates; check the sizes"
        )
