"""attnkit.viz.plots: valid, non-blank PNGs with the tokens on the axes."""

import warnings

import pytest
import torch
from matplotlib.patches import Rectangle

from attnkit.viz import alignment, head_grid, heatmap
from tests.helpers.viz import NUM_HEADS, assert_image


def _ticks(axis):
    return [label.get_text() for label in axis.get_ticklabels()]


def test_heatmap_png_with_umlauts(tmp_path, translation_maps, caplog):
    rows, cols = translation_maps.axes("encoder")
    assert "##ähr" in rows  # "fährt": the umlaut must be drawn, not replaced by a box
    out = tmp_path / "one.png"
    fig = heatmap(translation_maps.select("encoder", 0, 1), rows, cols, title="t", out=out)
    assert "drawn as boxes" not in caplog.text  # a character no font has is told so
    assert_image(out)
    ax = fig.axes[0]
    assert _ticks(ax.yaxis) == rows and _ticks(ax.xaxis) == cols
    assert ax.get_title() == "t"
    assert len(ax.texts) == len(rows) * len(cols)  # short sentence: values printed in the cells


def test_heatmap_tokens_with_dollar_signs(tmp_path):
    tokens = ["$5", "a$b$", "▁"]
    out = tmp_path / "dollar.png"
    fig = heatmap(torch.softmax(torch.randn(3, 3), -1), tokens, tokens, out=out)
    assert_image(out, min_colours=8)
    fig.canvas.draw()
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [r"\$5", r"a\$b\$", "▁"]


def test_heatmap_no_annotation_for_long_sentences():
    w = torch.softmax(torch.randn(20, 20), -1)
    tokens = [f"t{i}" for i in range(20)]
    assert len(heatmap(w, tokens, tokens).axes[0].texts) == 0
    assert len(heatmap(w, tokens, tokens, annotate=True).axes[0].texts) == 400


def test_head_grid(tmp_path, translation_maps):
    rows, cols = translation_maps.axes("decoder")
    out = tmp_path / "grid.png"
    fig = head_grid(translation_maps.select("decoder", 1), rows, cols, title="layer 1", out=out)
    assert_image(out)
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in panels] == [f"head {h}" for h in range(NUM_HEADS)]
    assert _ticks(panels[0].yaxis) == rows and _ticks(panels[-1].xaxis) == cols
    assert _ticks(panels[1].yaxis) == []  # labels on the left column and the bottom row only
    limits = {ax.images[0].get_clim() for ax in panels}
    assert len(limits) == 1  # one colour scale, so heads compare


def test_alignment(tmp_path, translation_maps):
    m = translation_maps
    cross = m.select("cross", 1)  # (H, T, S): averaged over heads
    assert cross.shape[0] == NUM_HEADS
    out = tmp_path / "align.png"
    fig = alignment(cross, m.src_tokens, m.out_tokens, out=out)
    assert_image(out)
    ax = fig.axes[0]
    assert _ticks(ax.xaxis) == m.src_tokens and _ticks(ax.yaxis) == m.out_tokens
    torch.testing.assert_close(
        torch.as_tensor(ax.images[0].get_array().data), cross.mean(0), atol=1e-7, rtol=0
    )
    boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
    best = cross.mean(0).argmax(1).tolist()
    assert [(b.get_x() + 0.5, b.get_y() + 0.5) for b in boxes] == [
        (j, i) for i, j in enumerate(best)
    ]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: heatmap(torch.ones(3, 4), ["a"] * 3, ["b"] * 3), "4 column tokens"),
        (lambda: heatmap(torch.ones(2, 3, 3), ["a"] * 3, ["b"] * 3), "(T_q, T_k)"),
        (lambda: head_grid(torch.ones(3, 3), ["a"] * 3, ["b"] * 3), "(H, T_q, T_k)"),
        (lambda: heatmap(torch.ones(2, 2), ["a"] * 2, ["b"] * 2, highlight_row=2), "highlight_row"),
        # before: "ncols: expected >= 1, got 0", though no ncols was given
        (lambda: head_grid(torch.ones(0, 2, 2), ["a"] * 2, ["b"] * 2), "at least one head"),
    ],
)
def test_bad_input(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)


@pytest.mark.parametrize("draw", ["heatmap", "head_grid"])
def test_a_long_text_makes_an_image_viewers_open(tmp_path, caplog, draw):
    """600 tokens and 12 heads made a 31,080 x 23,172-pixel PNG in 85 s, which Pillow refuses
    to open (DecompressionBombError): drawn at most 50 inches (7,500 pixels) on a side."""
    from PIL import Image

    from attnkit.viz.plots import MAX_INCHES

    tokens = [f"w{i}" for i in range(300)]  # unshrunk: 200-350 million pixels
    out = tmp_path / "long.png"
    if draw == "heatmap":
        heatmap(torch.rand(300, 300).softmax(-1), tokens, tokens, out=out)
    else:
        head_grid(torch.rand(4, 300, 300).softmax(-1), tokens, tokens, out=out)
    with Image.open(out) as image:  # raises on an image over Pillow's limit
        width, height = image.size
    assert max(width, height) <= MAX_INCHES * 150 * 1.05  # the tight box may add a margin
    assert "drawn at 50 x" in caplog.text


def test_characters_no_font_has_are_one_warning(tmp_path, caplog, monkeypatch):
    """Chinese labels (the seed notes are Chinese) on a machine without a CJK font: one
    warning naming the characters and what to install, not matplotlib's one per character."""
    from attnkit.viz import plots

    monkeypatch.setattr(plots, "CJK_FONTS", ())  # as on a machine with none installed
    tokens = ["你好", "世界", "ok"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        heatmap(torch.eye(3), tokens, tokens, out=tmp_path / "zh.png")
    assert not [w for w in caught if "missing from font" in str(w.message)]
    assert "4 character(s) of the labels are in no installed font" in caplog.text
    assert "你 好 世 界" in caplog.text and "fonts-noto-cjk" in caplog.text


def _families(fig) -> list[str]:
    return fig.axes[0].get_xticklabels()[0].get_fontfamily()


def test_an_installed_cjk_font_follows_the_callers_families(monkeypatch):
    """A CJK font is added after the families the caller set, for labels that need one only:
    other figures are drawn as before (the first version put DejaVu Sans first whatever the
    caller had set, and added the CJK font to every figure)."""
    import matplotlib

    from attnkit.viz import plots

    # "DejaVu Serif" ships with matplotlib: it stands for a CJK font on every machine.
    monkeypatch.setattr(plots, "CJK_FONTS", ("No Such Font", "DejaVu Serif"))
    chinese, english = ["你好", "世界"], ["the", "cat"]
    assert _families(heatmap(torch.eye(2), chinese, chinese)) == ["sans-serif", "DejaVu Serif"]
    assert _families(heatmap(torch.eye(2), english, english)) == ["sans-serif"]
    with matplotlib.rc_context({"font.family": "serif"}):
        assert _families(heatmap(torch.eye(2), chinese, chinese)) == ["serif", "DejaVu Serif"]
        assert _families(head_grid(torch.ones(2, 2, 2), english, english)) == ["serif"]
