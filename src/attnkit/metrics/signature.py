"""The BLEU signature: every setting behind a score, in sacreBLEU's format.

``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:0.1.0`` has the fields of sacreBLEU 2.x
in its order (``bs`` and ``seed`` follow ``nrefs`` when a confidence interval was bootstrapped);
only ``version`` is attnkit's rather than sacreBLEU's.
"""

from __future__ import annotations

import math
from functools import lru_cache

SMOOTH_DEFAULTS: dict[str, float | None] = {
    "none": None,
    "floor": 0.1,
    "add-k": 1,
    "exp": None,
}
"""Smoothing methods (Chen and Cherry, WMT 2014) and the value each uses when given ``None``."""

_SHORT = {
    "nrefs": "#",
    "bs": "bs",
    "seed": "rs",
    "case": "c",
    "eff": "e",
    "tok": "tok",
    "smooth": "s",
    "version": "v",
}


@lru_cache(maxsize=1)
def attnkit_version() -> str:
    """attnkit's version as installed, for the ``version`` field."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnkit")
    except PackageNotFoundError:
        return "unknown"


def check_smoothing(smooth_method: str, smooth_value: float | None) -> None:
    """Raise ``ValueError`` unless ``smooth_method`` and ``smooth_value`` make sense together."""
    if smooth_method not in SMOOTH_DEFAULTS:
        known = ", ".join(repr(k) for k in SMOOTH_DEFAULTS)
        raise ValueError(f"smooth_method={smooth_method!r} is not known; expected one of {known}")
    if smooth_value is not None and (
        isinstance(smooth_value, bool) or not isinstance(smooth_value, int | float)
    ):
        raise ValueError(f"smooth_value must be a number or None, got {smooth_value!r}")
    # floor replaces a zero precision by smooth_value / total and add-k adds it to counts and
    # totals: a negative or NaN value made log() fail or the score NaN.
    if smooth_value is not None and not (math.isfinite(smooth_value) and smooth_value >= 0):
        raise ValueError(f"smooth_value: expected a finite number >= 0, got {smooth_value!r}")


def bleu_signature(
    *,
    nrefs: int | str,
    tokenize: str,
    lowercase: bool = False,
    effective_order: bool = False,
    smooth_method: str = "exp",
    smooth_value: float | None = None,
    n_bootstrap: int | None = None,
    seed: int | str | None = None,
    short: bool = False,
) -> str:
    """Format the signature of a BLEU score.

    Args:
        nrefs: References per segment, or ``"var"``.
        tokenize: Tokenizer name.
        lowercase: Whether text was lowercased (``case:lc``) or not (``case:mixed``).
        effective_order: Whether effective order was used (``eff:yes``).
        smooth_method: Smoothing method; ``floor`` and ``add-k`` also show their value.
        smooth_value: Smoothing value, ``None`` for the method's default.
        n_bootstrap: Bootstrap samples behind a confidence interval, if any (``bs:``).
        seed: Seed of those samples (``seed:``; ``"none"`` if unseeded).
        short: Use sacreBLEU's abbreviated field names (``#:1|c:mixed|...``).

    Returns:
        The ``|``-separated ``field:value`` string.
    """
    check_smoothing(smooth_method, smooth_value)
    smooth = smooth_method
    default = SMOOTH_DEFAULTS[smooth_method]
    if default is not None:
        smooth += f"[{default if smooth_value is None else smooth_value:.2f}]"
    fields = {
        "nrefs": nrefs,
        "bs": n_bootstrap,
        "seed": seed,
        "case": "lc" if lowercase else "mixed",
        "eff": "yes" if effective_order else "no",
        "tok": tokenize,
        "smooth": smooth,
        "version": attnkit_version(),
    }
    return "|".join(f"{_SHORT[k] if short else k}:{v}" for k, v in fields.items() if v is not None)
