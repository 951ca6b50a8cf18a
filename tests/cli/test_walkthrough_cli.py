"""`attnkit walkthrough` prints seed 000's numbers (copied from the seed's printed output)."""

import subprocess
import sys

import pytest

from attnkit.cli import main


def test_default_walkthrough_prints_the_seed_values(capsys):
    assert main(["walkthrough", "The sun rises in the east", "--seed", "123"]) == 0
    out = capsys.readouterr().out
    for printed in [
        "{'The': 0, 'east': 1, 'in': 2, 'rises': 3, 'sun': 4, 'the': 5}",
        "[0, 4, 3, 2, 5, 1]",
        "[ 0.3374, -0.1778, -0.3035]",
        "[-0.5880,  0.3486,  0.6603]",
        "[ 0.4344, -2.5037,  0.9265, -0.3509,  1.0740, -0.9315]",
        "[0.1973, 0.0247, 0.2794, 0.1132, 0.3102, 0.0751]",
        "[-0.5296, -0.2799, -0.4107, -0.6006]",
        "[ 0.5313,  1.3607,  0.7891,  1.3110]",
        "[ 0.1008,  0.4780,  0.2021,  0.3674]",
    ]:
        assert printed in out, printed


def test_sizes_and_any_sentence(capsys):
    assert main(["walkthrough", "a b a c", "--d-model", "8", "--d-k", "5", "--d-v", "3"]) == 0
    out = capsys.readouterr().out
    assert "Embedding 4x8" in out and "W_v 8x3" in out and "d_k = 5" in out
    assert "{'a': 0, 'b': 1, 'c': 2}" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["walkthrough", ""], "empty sentence"),
        (["walkthrough", "a b", "--token", "3"], "position"),
        (["walkthrough", "a b", "--d-k", "0"], "d_k"),
    ],
)
def test_bad_input_is_a_clear_error(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_module_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "attnkit", "walkthrough", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "seed 000" in result.stdout
