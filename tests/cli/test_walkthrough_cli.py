"""`attnkit walkthrough` prints seed 000's numbers (copied from the seed's printed output), and
with ``--rope`` the same queries and keys turned by rotary position embedding."""

import re
import subprocess
import sys

import pytest
import torch

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


# --------------------------------------------------------------------------- --rope
# Expected values are computed here from the seed's recipe and RoPE as complex numbers
# (pair i of position m times e^(i m theta_i)), not with attnkit.

SENTENCE = "The sun rises in the east"
WORDS = SENTENCE.split()


def seed000_qkv(d_k: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seed 000's queries, keys and values of every word (T, d_k), (T, d_k), (T, 4)."""
    dc = {s: i for i, s in enumerate(sorted(WORDS))}
    ids = torch.tensor([dc[s] for s in WORDS])
    torch.manual_seed(123)
    x = torch.nn.Embedding(50_000, 3)(ids).detach()
    torch.manual_seed(123)
    w_query, w_key, w_value = torch.rand(3, d_k), torch.rand(3, d_k), torch.rand(3, 4)
    return x @ w_query, x @ w_key, x @ w_value


def pair_dims(d: int, pair: int, interleaved: bool) -> list[int]:
    return [2 * pair, 2 * pair + 1] if interleaved else [pair, pair + d // 2]


def rotate(v: torch.Tensor, positions, *, base=10_000.0, interleaved=False) -> torch.Tensor:
    """RoPE of v (T, d) in float64 complex arithmetic."""
    t, d = v.shape
    theta = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    angles = torch.tensor(positions, dtype=torch.float64)[:, None] * theta  # (T, d/2)
    dims = [pair_dims(d, i, interleaved) for i in range(d // 2)]
    pairs = v.double()[:, dims]  # (T, d/2, 2): (real, imaginary) of each pair
    turned = torch.view_as_complex(pairs.contiguous()) * torch.polar(
        torch.ones_like(angles), angles
    )
    out = torch.empty(t, d, dtype=torch.float64)
    out[:, dims] = torch.view_as_real(turned)
    return out.float()


def block(out: str, title: str) -> torch.Tensor:
    """The numbers printed under the first line that starts with ``title``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    body = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        body.append(line)
    return torch.tensor([float(v) for v in re.findall(r"-?\d+\.\d*(?:e[-+]\d+)?", " ".join(body))])


def assert_printed(out: str, title: str, expected: torch.Tensor) -> None:
    torch.testing.assert_close(block(out, title), expected.flatten().float(), rtol=0, atol=6e-5)


def test_rope_shows_the_rotation_on_seed_000(capsys):
    assert main(["walkthrough", SENTENCE, "--rope"]) == 0
    out = capsys.readouterr().out
    q, k, v = seed000_qkv()
    positions = list(range(6))
    rq, rk = rotate(q, positions), rotate(k, positions)
    # d_k = 2: one pair, theta_0 = 10000^0 = 1, so token m is turned by m radians.
    assert_printed(out, "10. theta_i = 10000^(-2i/d_k)", torch.tensor([1.0]))
    for m, word in enumerate(WORDS):
        assert f"position {m}  {word!r:<7}  {m}.0000 rad" in out
    assert_printed(out, "12. Queries q = x W_q, dims (0, 1), before RoPE (6x2)", q)
    assert_printed(out, "13. Keys k = x W_k, dims (0, 1), before RoPE (6x2)", k)
    lines = out.splitlines()
    after = [i for i, line in enumerate(lines) if line.strip() == "after RoPE (6x2):"]
    assert len(after) == 2
    assert_printed("\n".join(lines[after[0] :]), "after RoPE", rq)
    assert_printed("\n".join(lines[after[1] :]), "after RoPE", rk)
    assert_printed(out, "14. Scores Q K^T without RoPE (6x6)", q @ k.T)
    rope_scores = rq @ rk.T
    assert_printed(out, "15. Scores with RoPE", rope_scores)
    torch.testing.assert_close(rope_scores.diagonal(), (q * k).sum(1))  # n = m: no turn
    weights = torch.softmax(rope_scores / 2**0.5, dim=-1)
    assert_printed(out, "with RoPE", weights[2])  # token 3, 'rises'
    assert_printed(out, "17. SelfAttention output with RoPE", weights @ v)
    assert "18. The whole sentence moved by 100 positions (positions 100 to 105)" in out
    shifted = rotate(q, range(100, 106)) @ rotate(k, range(100, 106)).T
    assert_printed(out, "18. The whole sentence moved by 100", shifted)
    assert_printed(out, "18. The whole sentence moved by 100", rope_scores)
    diff = float(re.search(r"largest \|difference\| from step 15: (\S+)", out).group(1))
    assert diff < 1e-5
    # And the seed's own steps are still printed first, unchanged.
    assert "[0.1973, 0.0247, 0.2794, 0.1132, 0.3102, 0.0751]" in out


@pytest.mark.parametrize(
    "layout, pair, dims", [("half", 1, (1, 4)), ("interleaved", 1, (2, 3)), ("half", 2, (2, 5))]
)
def test_rope_pair_layout_base_and_shift(capsys, layout, pair, dims):
    argv = ["walkthrough", SENTENCE, "--d-k", "6", "--rope", "--pair", str(pair)]
    argv += ["--rope-layout", layout, "--rope-base", "500000", "--shift", "37", "--token", "5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    q, k, v = seed000_qkv(d_k=6)
    interleaved = layout == "interleaved"
    assert pair_dims(6, pair, interleaved) == list(dims)
    theta = torch.tensor([500_000.0 ** (-2 * i / 6) for i in range(3)])
    assert_printed(out, "10. theta_i = 500000^(-2i/d_k)", theta)
    assert f"11. Pair {pair} = dims {dims}, theta_{pair} = {float(theta[pair]):.4g}" in out
    angles = re.findall(r"position (\d+) +'\w+' +(-?[\d.]+) rad", out)
    torch.testing.assert_close(
        torch.tensor([float(a) for _, a in angles]),
        torch.arange(6.0) * theta[pair],
        rtol=0,
        atol=6e-5,
    )
    rq = rotate(q, range(6), base=500_000.0, interleaved=interleaved)
    rk = rotate(k, range(6), base=500_000.0, interleaved=interleaved)
    assert_printed(out, f"12. Queries q = x W_q, dims {dims}, before RoPE", q[:, list(dims)])
    lines = out.splitlines()
    first_after = next(i for i, line in enumerate(lines) if line.strip() == "after RoPE (6x2):")
    assert_printed("\n".join(lines[first_after:]), "after RoPE", rq[:, list(dims)])
    assert_printed(out, "15. Scores with RoPE", rq @ rk.T)
    assert_printed(out, "with RoPE", torch.softmax(rq @ rk.T / 6**0.5, dim=-1)[4])
    assert_printed(out, "16. Token 5 ('the')", torch.softmax(q[4] @ k.T / 6**0.5, dim=-1))
    shifted = rotate(q, range(37, 43), base=500_000.0, interleaved=interleaved)
    shifted_k = rotate(k, range(37, 43), base=500_000.0, interleaved=interleaved)
    assert_printed(out, "18. The whole sentence moved by 37", shifted @ shifted_k.T)


def test_rope_help_explains_the_options(capsys):
    with pytest.raises(SystemExit):
        main(["walkthrough", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for phrase in [
        "--rope",
        "rotary position embedding (RoPE)",
        "theta_i = base^(-2i/d_k)",
        "--rope-base BASE",
        "--pair I",
        "--shift K",
        "--rope-layout {half,interleaved}",
        "a RoPE score sees only how far apart two tokens are",
    ]:
        assert phrase in help_text, phrase


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pair", "1"], "--pair: only with --rope"),
        (["--shift", "5"], "--shift: only with --rope"),
        (["--rope-base", "100"], "--rope-base: only with --rope"),
        (["--rope-layout", "interleaved"], "--rope-layout: only with --rope"),
        (
            ["--rope", "--d-k", "3"],
            "--d-k: --rope turns pairs of query/key dimensions, expected an even --d-k, got 3",
        ),
        (["--rope", "--pair", "1"], "--pair: expected a pair from 0 to 0 (--d-k 2 has 1), got 1"),
        (
            ["--rope", "--d-k", "8", "--pair", "4"],
            "--pair: expected a pair from 0 to 3 (--d-k 8 has 4), got 4",
        ),
    ],
)
def test_rope_bad_combinations_are_clear_errors(argv, message, capsys):
    assert main(["walkthrough", SENTENCE, *argv]) == 2
    captured = capsys.readouterr()
    assert f"attnkit walkthrough: error: {message}" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rope-base", "1"], "argument --rope-base: expected a finite number >= 2.0, got '1'"),
        (["--rope-base", "inf"], "argument --rope-base: expected a finite number >= 2.0"),
        (["--pair", "-1"], "argument --pair: expected an integer >= 0, got '-1'"),
        (["--shift", "-3"], "argument --shift: expected an integer from 0 to 1000000, got '-3'"),
        (["--shift", "1000001"], "argument --shift: expected an integer from 0 to 1000000"),
        (["--rope-layout", "gptj"], "argument --rope-layout: invalid choice: 'gptj'"),
    ],
)
def test_rope_bad_numbers_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["walkthrough", "a b", "--rope", *argv])
    assert exit_info.value.code == 2
    assert f"attnkit walkthrough: error: {message}" in capsys.readouterr().err


def test_plot_is_never_inside_a_runs_checkpoint(tmp_path, capsys):
    """`walkthrough --plot RUN/best/w.png` was accepted: the run could then no longer save its
    `best` (nor resume, in `last`)."""
    run = tmp_path / "run"
    for name in ("best", "last"):
        (run / name).mkdir(parents=True)
        (run / name / "config.json").write_text('{"model": {}}')  # attnkit's layout
        (run / name / "model.safetensors").write_bytes(b"")
    (run / "steps").mkdir()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for out, message in [
        (run / "best" / "w.png", f"is inside the model folder '{run / 'best'}', which must"),
        (run / "last" / "w.svg", f"is inside the model folder '{run / 'last'}', which must"),
        (run / "steps" / "w.png", f"is inside '{run / 'steps'}', the checkpoints a run keeps"),
    ]:
        assert main(["walkthrough", "a b", "--plot", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"attnkit walkthrough: error: --plot: '{out}' {message}"), err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
