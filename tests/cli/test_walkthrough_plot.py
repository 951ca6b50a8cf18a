"""`attnkit walkthrough --plot`: seed 000's weights drawn with attnkit.viz.plots.heatmap."""

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
