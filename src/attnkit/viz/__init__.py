"""Attention visualisation: capture the weights, draw them as images or an HTML viewer.

    from attnkit.decoding import load_translation_model, model_decoding
    from attnkit.viz import alignment, capture_translation, head_grid, write_html

    model, tokenizer, _ = load_translation_model(None)          # the shipped de-en model
    search = model_decoding(None)                 # its search settings (beam, length penalty)
    maps = capture_translation(model, tokenizer, "Ein Mann fährt Fahrrad.", search=search)
    alignment(maps.select("cross", 2, "mean"), maps.src_tokens, maps.out_tokens, out="a.png")
    head_grid(maps.select("encoder", 0), *maps.axes("encoder"), out="enc0.png")
    write_html(maps, "attn.html")

Modules: :mod:`~attnkit.viz.capture` (one forward pass with ``return_weights=True``; every other
pass keeps the fused kernel), :mod:`~attnkit.viz.plots` (matplotlib PNGs),
:mod:`~attnkit.viz.html` (one self-contained page, ``viewer.html`` + ``viewer.js``).
"""

from attnkit.viz.capture import (
    KINDS,
    AttentionMaps,
    capture_bert,
    capture_gpt,
    capture_translation,
    detect_model_type,
    subword_labels,
)
from attnkit.viz.html import render_html, write_html

_PLOTS = ("alignment", "head_grid", "heatmap")


def __getattr__(name: str):
    """The plot functions import matplotlib (the ``plot`` extra) only when first used."""
    if name in _PLOTS:
        from attnkit.viz import plots

        return getattr(plots, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "KINDS",
    "AttentionMaps",
    "alignment",
    "capture_bert",
    "capture_gpt",
    "capture_translation",
    "detect_model_type",
    "head_grid",
    "heatmap",
    "render_html",
    "subword_labels",
    "write_html",
]
