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
        (["walkthrough", ""], "SENTENCE: expected at least one word, got an empty sentence"),
        (["walkthrough", "   "], "SENTENCE: expected at least one word"),
        (["walkthrough", "a b", "--token", "3"], "--token: expected a position from 1 to 2"),
        (["walkthrough", "a \udcff"], "SENTENCE: not valid UTF-8 (byte 0xff at character 3)"),
        (["walkthrough", " ".join(["w"] * 513)], "SENTENCE: expected at most 512 words, got 513"),
        (["walkthrough", "a", "--plot", "missing/w.png"], "--plot: the folder 'missing'"),
        (["walkthrough", "a", "--plot", "w.jpg"], "--plot: expected a file ending in .png"),
    ],
)
def test_bad_input_is_a_clear_error(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"attnkit walkthrough: error: {message}" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--token", "0"], "argument --token: expected a 1-based position >= 1, got '0'"),
        (["--token", "-2"], "argument --token: expected a 1-based position >= 1, got '-2'"),
        (["--d-k", "0"], "argument --d-k: expected an integer from 1 to 1024, got '0'"),
        (["--d-model", "100000"], "argument --d-model: expected an integer from 1 to 1024"),
        (["--d-v", "2.5"], "argument --d-v: expected an integer from 1 to 1024, got '2.5'"),
        (["--seed", "-1"], "argument --seed: expected an integer from 0 to"),
        (["--precision", "99"], "argument --precision: expected an integer from 0 to 16"),
    ],
)
def test_bad_numbers_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["walkthrough", "a b c", *argv])
    assert exit_info.value.code == 2
    assert f"attnkit walkthrough: error: {message}" in capsys.readouterr().err


def test_plot_into_a_directory_or_unwritable_file(tmp_path, capsys, monkeypatch):
    (tmp_path / "dir.png").mkdir()
    assert main(["walkthrough", "a b", "--plot", str(tmp_path / "dir.png")]) == 2
    assert "is a directory, expected a file name" in capsys.readouterr().err
    # Root may write anywhere, so a read-only file is simulated where the check looks.
    import os

    monkeypatch.setattr(os, "access", lambda path, mode: False)
    (tmp_path / "ro.png").write_bytes(b"")
    assert main(["walkthrough", "a b", "--plot", str(tmp_path / "ro.png")]) == 2
    assert "--plot: " in (err := capsys.readouterr().err) and "is read-only" in err
    assert main(["walkthrough", "a b", "--plot", str(tmp_path / "new.png")]) == 2
    assert "cannot create files in the read-only folder" in capsys.readouterr().err


def test_module_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "attnkit", "walkthrough", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "seed 000" in result.stdout
