"""Attention heatmaps as images (matplotlib, no display needed).

Three pictures, each with the tokens on the axes:

* :func:`heatmap`: one matrix, e.g. one layer and head (rows attend to columns);
* :func:`head_grid`: every head of one layer side by side, on one colour scale;
* :func:`alignment`: cross-attention of a translation, target rows x source columns, the
  source word each target word attends to most outlined in orange.

Figures are built with :class:`matplotlib.figure.Figure`, not ``pyplot``: nothing depends on
(or changes) the global backend, and no window ever opens. Every function returns the figure
and saves it when given ``out`` (the format follows the extension: .png, .svg, .pdf), whole
or not at all: a full disk leaves an earlier file as it was.
Colours run from white (0) to dark blue (the largest weight shown), with a colour bar.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import math
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor

from attnkit.extras import require
from attnkit.files import write_file

# matplotlib is the `plot` extra: a clear ImportError naming it when it is missing.
matplotlib = require("matplotlib", extra="plot", feature="attnkit.viz.plots")
Figure = require("matplotlib.figure", extra="plot", feature="attnkit.viz.plots").Figure
Rectangle = require("matplotlib.patches", extra="plot", feature="attnkit.viz.plots").Rectangle

__all__ = ["alignment", "head_grid", "heatmap"]

logger = logging.getLogger(__name__)

CMAP = "Blues"
CELL = 0.32  # inches per token on each axis
BEST = "#e67e22"  # outlines: a highlighted row, each target row's most-attended source token
ANNOTATE_MAX = 12  # print the values in the cells when both axes have at most this many tokens
# The longest side of a figure, in inches: 7,500 pixels at the 150 dpi images are saved with,
# under the 89-million-pixel size image libraries refuse to open (Pillow's decompression-bomb
# limit). A longer text is drawn smaller, with smaller labels.
MAX_INCHES = 50.0
# Families with Chinese, Japanese and Korean glyphs, tried after matplotlib's own where one is
# installed (the seed notes are Chinese; matplotlib's DejaVu Sans has no CJK glyph).
CJK_FONTS = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans CJK TC",
    "Noto Sans CJK KR",
    "Source Han Sans SC",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "Droid Sans Fallback",
    "Microsoft YaHei",
    "PingFang SC",
)
_MISSING_GLYPH = re.compile(r"Glyph (\d+) .*missing from font")  # matplotlib's warning


def _as_matrix(weights, name: str, dims: int) -> Tensor:
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != dims:
        shape = "(T_q, T_k)" if dims == 2 else "(H, T_q, T_k)"
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(w.shape)}")
    return w


def _check_tokens(w: Tensor, rows: Sequence[str], cols: Sequence[str]) -> None:
    if len(rows) != w.shape[-2] or len(cols) != w.shape[-1]:
        raise ValueError(
            f"tokens: expected {w.shape[-2]} row and {w.shape[-1]} column tokens for weights "
            f"of shape {tuple(w.shape)}, got {len(rows)} and {len(cols)}"
        )


def _label(token: str) -> str:
    return token.replace("$", r"\$")  # a pair of "$" would start mathtext


def _fontsize(n: int) -> float:
    return 9.0 if n <= 30 else max(5.0, 9.0 - (n - 30) / 10)


def _draw(ax, w: Tensor, rows, cols, *, vmax: float, annotate: bool, xticks=True, yticks=True):
    """One matrix on ``ax`` with token tick labels; returns the image (for a colour bar)."""
    image = ax.imshow(w.numpy(), cmap=CMAP, vmin=0.0, vmax=vmax, aspect="equal")
    size = _fontsize(max(len(rows), len(cols)))
    # Panels without labels get no ticks at all: invisible ticks still cost layout time.
    ax.set_xticks(range(len(cols)) if xticks else [])
    ax.set_yticks(range(len(rows)) if yticks else [])
    if xticks:
        ax.set_xticklabels([_label(t) for t in cols], rotation=90, fontsize=size)
    if yticks:
        ax.set_yticklabels([_label(t) for t in rows], fontsize=size)
    ax.tick_params(length=0)
    if annotate:
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                v = float(w[i, j])
                color = "white" if v > 0.6 * vmax else "#222222"
                ax.text(
                    j, i, f"{v:.2f}", ha="center", va="center", fontsize=size - 1.5, color=color
                )
    return image


def _vmax(w: Tensor) -> float:
    top = float(w.max()) if w.numel() else 0.0
    return top if top > 0 else 1.0


def _fit(fig: Figure) -> None:
    """Shrinks a figure longer than :data:`MAX_INCHES` on a side to that size, its tick labels
    with it, saying so: a text of hundreds of tokens would otherwise make an image of hundreds
    of millions of pixels that viewers refuse to open."""
    width, height = fig.get_size_inches()
    scale = MAX_INCHES / max(width, height)
    if scale >= 1:
        return
    fig.set_size_inches(width * scale, height * scale)
    size = max(1.0, 10 * scale)
    for ax in fig.axes:
        ax.tick_params(labelsize=size)
    logger.warning(
        "the figure would be %.0f x %.0f inches; drawn at %.0f x %.0f with %.1f-point labels, "
        "which may overlap (fewer tokens, or one head, draw larger)",
        width, height, width * scale, height * scale, size,
    )  # fmt: skip


def _save(fig: Figure, out: str | os.PathLike[str] | None) -> Figure:
    """Saves ``fig`` to ``out`` whole or not at all (rendered in memory, then written by
    :func:`~attnkit.files.write_file`: temporary file, fsync, rename), at most
    :data:`MAX_INCHES` on a side (:func:`_fit`)."""
    _fit(fig)
    if out is not None:
        name = os.fspath(out)
        fmt = os.path.splitext(name)[1][1:].lower()
        if not fmt:  # as savefig does: no extension means the default format, appended
            fmt = matplotlib.rcParams["savefig.format"]
            name = f"{name}.{fmt}"
        image = io.BytesIO()
        render(fig, image, fmt)
        write_file(name, image.getvalue())
    return fig


def _cjk_fonts() -> list[str]:
    """The installed ones of :data:`CJK_FONTS`."""
    installed = {font.name for font in matplotlib.font_manager.fontManager.ttflist}
    return [f for f in CJK_FONTS if f in installed]


def _has_cjk(text: str) -> bool:
    """Whether ``text`` holds a Chinese, Japanese or Korean character (CJK radicals to Hangul,
    the compatibility ideographs and forms, the supplementary ideographs)."""
    return any(
        "\u2e80" <= c <= "\ud7af" or "\uf900" <= c <= "\ufaff" or "\ufe30" <= c <= "\ufe4f"
        or "\U00020000" <= c <= "\U0003134f"
        for c in text
    )  # fmt: skip


@contextlib.contextmanager
def fonts_for(texts: Iterable[str]) -> Iterator[None]:
    """Figures made inside draw ``texts`` (their labels) with the families the caller set,
    then an installed CJK font (:data:`CJK_FONTS`) when a text holds a Chinese, Japanese or
    Korean character: matplotlib's own fonts have none, and its font fallback takes a
    character the first family lacks from the next. Texts keep the family they were made
    with, so the figures are made inside. Without such a character nothing changes."""
    fonts = _cjk_fonts() if any(_has_cjk(t) for t in texts) else []
    if not fonts:
        yield
        return
    font_log = logging.getLogger("matplotlib.font_manager")
    level = font_log.level
    font_log.setLevel(logging.ERROR)  # "findfont: Failed to find font weight normal ..."
    try:
        with matplotlib.rc_context({"font.family": [*matplotlib.rcParams["font.family"], *fonts]}):
            yield
    finally:
        font_log.setLevel(level)


def _labels(values: Iterable[object]) -> Iterator[str]:
    """The strs among ``values`` and in the sequences among them (a drawing's labels)."""
    for value in values:
        if isinstance(value, str):
            yield value
        elif isinstance(value, Sequence):
            yield from (v for v in value if isinstance(v, str))


def _with_fonts(draw):
    """Runs ``draw`` inside :func:`fonts_for` its labels (every str argument, and the strs
    of every sequence argument: tokens, title)."""

    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        with fonts_for(list(_labels([*args, *kwargs.values()]))):
            return draw(*args, **kwargs)

    return drawn


def render(fig: Figure, image: io.BytesIO, fmt: str) -> None:
    """``fig.savefig`` into ``image``; characters no installed font has are told in one
    warning (they are drawn as boxes), instead of matplotlib's warning a character."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.savefig(image, format=fmt, dpi=150, bbox_inches="tight")
    missing = []
    for warning in caught:
        glyph = _MISSING_GLYPH.search(str(warning.message))
        if glyph is None:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
        elif chr(int(glyph.group(1))) not in missing:
            missing.append(chr(int(glyph.group(1))))
    if missing:
        logger.warning(
            "%d character(s) of the labels are in no installed font and are drawn as boxes: "
            "%s; install a font that has them (Chinese: Debian's fonts-noto-cjk)",
            len(missing), " ".join(missing[:10]) + (" ..." if len(missing) > 10 else ""),
        )  # fmt: skip


@_with_fonts
def heatmap(
    weights,
    row_tokens: Sequence[str],
    col_tokens: Sequence[str],
    *,
    title: str | None = None,
    out: str | os.PathLike[str] | None = None,
    annotate: bool | None = None,
    xlabel: str = "attended to (key)",
    ylabel: str = "attending (query)",
    highlight_row: int | None = None,
) -> Figure:
    """One attention matrix; row ``i`` shows how token ``i`` spreads its attention.

    Args:
        weights: (T_q, T_k) weights, e.g. ``maps.select("encoder", layer, head)``.
        row_tokens: T_q labels (queries).
        col_tokens: T_k labels (keys).
        title: figure title.
        out: save here (format from the extension).
        annotate: print each weight in its cell; default when both axes have at most 12 tokens.
        xlabel, ylabel: axis titles.
        highlight_row: outline this row (e.g. the token a text follows step by step).
    """
    w = _as_matrix(weights, "weights", 2)
    _check_tokens(w, row_tokens, col_tokens)
    annotate = max(w.shape) <= ANNOTATE_MAX if annotate is None else annotate
    width = 2.2 + CELL * len(col_tokens) + (0.15 * len(col_tokens) if annotate else 0)
    height = 1.6 + CELL * len(row_tokens) + (0.1 * len(row_tokens) if annotate else 0)
    fig = Figure(figsize=(max(4.0, width), max(3.0, height)))
    ax = fig.add_subplot()
    image = _draw(ax, w, row_tokens, col_tokens, vmax=_vmax(w), annotate=annotate)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if highlight_row is not None:
        if not 0 <= highlight_row < w.shape[0]:
            raise ValueError(
                f"highlight_row: expected 0 <= highlight_row < {w.shape[0]}, got {highlight_row}"
            )
        width = w.shape[1]
        ax.add_patch(Rectangle((-0.5, highlight_row - 0.5), width, 1, fill=False, ec=BEST, lw=2))
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    return _save(fig, out)


@_with_fonts
def head_grid(
    weights,
    row_tokens: Sequence[str],
    col_tokens: Sequence[str],
    *,
    title: str | None = None,
    out: str | os.PathLike[str] | None = None,
    ncols: int | None = None,
) -> Figure:
    """Every head of one layer, one panel each, on one colour scale (so heads compare).

    Args:
        weights: (H, T_q, T_k), e.g. ``maps.select("encoder", layer)``.
        row_tokens, col_tokens: axis labels, shown on the left column and the bottom row.
        title: figure title.
        out: save here.
        ncols: panels per row (default: about the square root of H, at most 4).
    """
    w = _as_matrix(weights, "weights", 3)
    _check_tokens(w, row_tokens, col_tokens)
    heads = w.shape[0]
    if heads == 0:
        raise ValueError(f"weights: expected at least one head, got shape {tuple(w.shape)}")
    ncols = min(heads, 4, math.ceil(math.sqrt(heads))) if ncols is None else ncols
    if ncols < 1:
        raise ValueError(f"ncols: expected >= 1, got {ncols}")
    nrows = math.ceil(heads / ncols)
    panel_w = max(1.6, 0.2 * len(col_tokens))
    panel_h = max(1.6, 0.2 * len(row_tokens))
    label_space = 0.09 * max(len(t) for t in [*row_tokens, *col_tokens, "x"])
    width = ncols * (panel_w + 0.3) + label_space + 1.2
    height = nrows * (panel_h + 0.5) + label_space + 0.6
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    vmax = _vmax(w)
    image = None
    for h in range(nrows * ncols):
        ax = axes[h // ncols][h % ncols]
        if h >= heads:
            ax.axis("off")
            continue
        last_row = h + ncols >= heads
        first_col = h % ncols == 0
        image = _draw(
            ax,
            w[h],
            row_tokens,
            col_tokens,
            vmax=vmax,
            annotate=False,
            xticks=last_row,
            yticks=first_col,
        )
        ax.set_title(f"head {h}", fontsize=10)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    if title:
        fig.suptitle(title)
    return _save(fig, out)


@_with_fonts
def alignment(
    cross,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    *,
    title: str | None = "cross-attention alignment",
    out: str | os.PathLike[str] | None = None,
    annotate: bool | None = None,
) -> Figure:
    """Cross-attention of a translation: target rows x source columns.

    Args:
        cross: (T, S) weights of one head, or (H, T, S), averaged over heads.
        src_tokens: S source labels (columns).
        tgt_tokens: T target labels (rows), e.g. ``maps.out_tokens``: the word each row writes.
        title: figure title.
        out: save here.
        annotate: print each weight in its cell (default: for short sentences).
    """
    w = torch.as_tensor(cross).detach().float().cpu()
    if w.dim() == 3:
        w = w.mean(dim=0)  # (T, S): the average over heads
    w = _as_matrix(w, "cross", 2)
    fig = heatmap(
        w,
        tgt_tokens,
        src_tokens,
        title=title,
        annotate=annotate,
        xlabel="source",
        ylabel="target (the token each row writes)",
    )
    ax = fig.axes[0]
    for i, j in enumerate(w.argmax(dim=1).tolist()):  # the most-attended source token per row
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor=BEST, lw=1.5))
    return _save(fig, out)
