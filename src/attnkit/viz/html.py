"""One self-contained HTML file to explore a capture: pick the kind, layer and head, hover a token.

The page is ``viewer.html`` with ``viewer.js`` and the weights (JSON) written into it: no
external file, URL or CDN, and a Content-Security-Policy that forbids fetching anything, so it
works offline in any browser. The URL hash selects a view (``#kind=cross&layer=2&head=mean``,
plus ``&row=3`` or ``&col=1`` to show a hovered token), which bookmarks and tests use.
"""

from __future__ import annotations

import html
import importlib.resources
import json
import os
import re
from pathlib import Path

import torch

from attnkit.files import write_file
from attnkit.viz.capture import AttentionMaps

__all__ = ["render_html", "write_html"]

DECIMALS = 4  # weights are written rounded to this many decimals
_PLACEHOLDER = re.compile(r"__ATTNKIT_(TITLE|DATA|SCRIPT)__")
_AXES = {  # kind -> (row axis, column axis) names shown in the grid's corner
    "encoder": ("query", "key"),
    "decoder": ("writes", "input"),
    "cross": ("target", "source"),
}


def _resource(name: str) -> str:
    return importlib.resources.files("attnkit.viz").joinpath(name).read_text(encoding="utf-8")


def _script_json(data: dict) -> str:
    """JSON that is safe inside <script>: no "<", ">" or "&" can end the element or open a
    comment (they become \\u003c, \\u003e, \\u0026, which JSON.parse reads back)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _rounded(weights: torch.Tensor) -> list:
    # via float64, so that 0.1234 is written as 0.1234, not 0.12340000271797180
    return torch.round(weights.double(), decimals=DECIMALS).tolist()


def _kind_data(maps: AttentionMaps, kind: str) -> dict:
    rows, cols = maps.axes(kind)
    return {
        "id": kind,
        "label": maps.kind_label(kind),
        "rows": list(rows),
        "cols": list(cols),
        "rowAxis": _AXES[kind][0],
        "colAxis": _AXES[kind][1],
        "layers": [_rounded(w) for w in maps.layers(kind)],  # [layer][head][T_q][T_k]
    }


# The page title of each model type captured (render_html's default).
_TITLES = {"bert": "BERT attention", "gpt": "GPT attention", "translation": "Translation attention"}


def render_html(
    maps: AttentionMaps,
    *,
    title: str | None = None,
    kind: str | None = None,
    layer: int | None = None,
    head: int | str = 0,
) -> str:
    """The viewer page for ``maps``.

    Args:
        maps: a capture (:func:`~attnkit.viz.capture.capture_translation`, ``capture_bert``
            or ``capture_gpt``).
        title: page title (default: "BERT attention", "GPT attention" or "Translation
            attention", by the model captured); the
            text (and its translation) is the subtitle.
        kind, layer, head: the view shown first (default: the first kind, its last layer,
            head 0); ``head`` may be ``"mean"``.

    Raises:
        TypeError: for ``maps`` that is not an :class:`~attnkit.viz.capture.AttentionMaps`.
        ValueError: for a kind, layer or head that ``maps`` does not have.
    """
    if not isinstance(maps, AttentionMaps):
        raise TypeError(
            f"maps: expected an AttentionMaps (capture_translation, capture_bert or "
            f"capture_gpt makes one), got {type(maps).__name__}"
        )
    kind = maps.kinds[0] if kind is None else kind
    layer = maps.num_layers(kind) - 1 if layer is None else layer
    maps.select(kind, layer, head)  # validates all three, naming the valid ranges
    if title is None:
        title = _TITLES.get(maps.model_type, "Attention")
    subtitle = maps.source if maps.target is None else f"{maps.source} \u2192 {maps.target}"
    data = {
        "title": title,
        "subtitle": subtitle,
        "kinds": [_kind_data(maps, k) for k in maps.kinds],
        "initial": {"kind": kind, "layer": layer, "head": head},
    }
    script = _resource("viewer.js")
    if "</script" in script.lower():
        raise RuntimeError("viewer.js contains '</script', which would end the inline script")
    values = {"TITLE": html.escape(title), "DATA": _script_json(data), "SCRIPT": script}
    # One pass, so text inserted for one placeholder is never scanned for another.
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], _resource("viewer.html"))


def write_html(maps: AttentionMaps, out: str | os.PathLike[str], **kwargs) -> Path:
    """Write :func:`render_html` (same keyword arguments) to ``out``; returns the path.

    The page is written whole or not at all (:func:`~attnkit.files.write_file`: a
    temporary file, fsync, rename), so a full disk leaves an earlier page as it was.

    Raises:
        ValueError: for ``out`` not ending in ``.html`` or ``.htm`` (an HTML page under an
            image's name opens in no image viewer; images are :mod:`attnkit.viz.plots`').
    """
    if os.path.splitext(os.fspath(out))[1].lower() not in (".html", ".htm"):
        raise ValueError(
            f"out: expected a file ending in .html or .htm, got {os.fspath(out)!r} (images: "
            "attnkit.viz.heatmap, head_grid, alignment)"
        )
    return write_file(out, render_html(maps, **kwargs))
