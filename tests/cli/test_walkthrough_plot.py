"""`attnkit walkthrough --plot`: seed 000's weights drawn with attnkit.viz.plots.heatmap; with
``--rope``, the rotation of each query and key."""

import math

import pytest
import torch

from attnkit.cli import main
from attnkit.viz import plots
from tests.helpers.viz import assert_image

# Seed 000's printed weights of its third token, "rises" (softmax(omega / sqrt(2))).
SEED_ROW = [0.1973, 0.0247, 0.2794, 0.1132, 0.3102, 0.0751]


def test_plot_draws_the_seed_weights(tmp_path, monkeypatch, capsys):
    drawn = []
    real = plots.heatmap

    def spy(weights, rows, cols, **kwargs):
        drawn.append((weights, rows, cols, kwargs))
        return real(weights, rows, cols, **kwargs)

    monkeypatch.setattr(plots, "heatmap", spy)
    out = tmp_path / "walkthrough.png"
    argv = ["walkthrough", "The sun rises in the east", "--seed", "123", "--plot", str(out)]
    assert main(argv) == 0
    assert f"Weights of every token drawn to {out}" in capsys.readouterr().out
    assert_image(out)
    ((weights, rows, cols, kwargs),) = drawn
    assert rows == cols == ["The", "sun", "rises", "in", "the", "east"]
    assert weights.shape == (6, 6) and kwargs["highlight_row"] == 2
    torch.testing.assert_close(weights[2], torch.tensor(SEED_ROW), atol=5e-5, rtol=0)
    torch.testing.assert_close(weights.sum(1), torch.ones(6))


@pytest.mark.parametrize("name", ["w.jpg", "w"])
def test_plot_needs_an_image_extension(tmp_path, capsys, name):
    assert main(["walkthrough", "--plot", str(tmp_path / name)]) == 2
    captured = capsys.readouterr()
    assert "--plot: expected a file ending in .png, .svg, .pdf" in captured.err
    assert captured.out == ""  # checked before anything is printed


@pytest.fixture
def saved(monkeypatch):
    """The figures saved while a test runs (Figure.savefig spied on), in order."""
    from matplotlib.figure import Figure

    figures = []
    real = Figure.savefig

    def spy(self, *args, **kwargs):
        figures.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return figures


def test_rope_plot_draws_each_pair_before_and_after_its_rotation(tmp_path, capsys, saved):
    out = tmp_path / "rope.png"
    assert main(["walkthrough", "The sun rises in the east", "--rope", "--plot", str(out)]) == 0
    assert f"Pair 0 of every query and key drawn to {out}" in capsys.readouterr().out
    assert_image(out)
    (fig,) = saved
    lines = {line.get_gid(): line for ax in fig.axes for line in ax.lines if line.get_gid()}
    assert len(lines) == 2 * 2 * 6  # queries and keys, before and after, six words
    # Seed 000's query of 'rises' (printed there: [-0.2816, -1.3567]) at position 2, so
    # turned by 2 radians (d_k = 2: one pair, theta_0 = 1), computed here by hand.
    q = torch.tensor([-0.2816, -1.3567])
    cos, sin = math.cos(2.0), math.sin(2.0)
    turned = torch.tensor([q[0] * cos - q[1] * sin, q[0] * sin + q[1] * cos])
    before = torch.tensor(lines["query 2 before"].get_xydata(), dtype=torch.float32)
    after = torch.tensor(lines["query 2 after"].get_xydata(), dtype=torch.float32)
    torch.testing.assert_close(before, torch.stack([torch.zeros(2), q]), atol=6e-5, rtol=0)
    torch.testing.assert_close(after, torch.stack([torch.zeros(2), turned]), atol=2e-4, rtol=0)
    # The first word sits at position 0: not turned at all.
    torch.testing.assert_close(
        torch.tensor(lines["key 0 after"].get_xydata()),
        torch.tensor(lines["key 0 before"].get_xydata()),
    )


def test_rope_plot_of_chinese_words_takes_a_cjk_font(tmp_path, monkeypatch, saved):
    """The rotation panels drew Chinese words as boxes, with one warning a character, though
    a CJK font was installed: they go through the heatmap's fonts_for and render."""
    monkeypatch.setattr(plots, "CJK_FONTS", ("DejaVu Serif",))  # stands for one, installed
    out = tmp_path / "rope.png"
    assert main(["walkthrough", "太阳 从 东方 升起", "--rope", "--plot", str(out)]) == 0
    (fig,) = saved
    labels = [t for ax in fig.axes for t in ax.texts if "太阳" in t.get_text()]
    assert labels and all(t.get_fontfamily() == ["sans-serif", "DejaVu Serif"] for t in labels)
