"""`attnkit train`: help, errors that name the problem, a short run, resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from attnkit.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny_copy.toml")
FAST = [
    "--set",
    "model.d_model=16",
    "--set",
    "model.num_heads=2",
    "--set",
    "model.d_ff=32",
    "--set",
    "model.num_encoder_layers=1",
    "--set",
    "model.num_decoder_layers=1",
    "--set",
    "data.copy_train_pairs=50",
    "--set",
    "data.copy_val_pairs=10",
    "--set",
    "data.max_tokens=128",
]


def test_help_explains_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in [
        "--config",
        "--set",
        "--out",
        "--resume",
        "--max-steps",
        "--max-minutes",
        "--no-progress",
        "metrics.jsonl",
        "torchrun",
    ]:
        assert option in out, option


@pytest.mark.parametrize(
    "args,message",
    [
        (["--config", "nope.toml", "--out", "x"], "config file 'nope.toml' does not exist"),
        (["--out", "x"], "--config: required"),
        (["--config", TINY], "--out: required"),
        (["--config", TINY, "--out", "x", "--set", "model.dropout"], "expected section.key=value"),
        (["--config", TINY, "--out", "x", "--set", "model.heads=2"], "unknown key model.heads"),
        (["--config", TINY, "--out", "x", "--set", "optim.max_steps=1.5"], "expected int"),
        (["--config", TINY, "--resume", "x"], "--config: not allowed with --resume"),
    ],
)
def test_errors_are_one_clear_line(capsys, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnkit train: error:") and message in err, err
    assert "Traceback" not in err


def test_unknown_key_in_file_lists_known_keys(capsys, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[optim]\nlearning_rate = 0.1\n")
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "optim.learning_rate" in err and "'lr_scale'" in err and "'warmup_steps'" in err


def test_resume_without_checkpoint(capsys, tmp_path):
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "no `last` checkpoint" in capsys.readouterr().err


def test_resume_of_a_missing_folder_or_a_file_says_so(capsys, tmp_path):
    assert main(["train", "--resume", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert f"error: --resume '{tmp_path / 'nope'}': no such folder (expected a run" in err, err
    (tmp_path / "file").write_text("x")
    assert main(["train", "--resume", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert f"error: --resume '{tmp_path / 'file'}': is a file, expected a run folder" in err, err
    assert not (tmp_path / "nope").exists() and (tmp_path / "file").read_text() == "x"


def test_a_config_that_is_not_utf8_or_a_directory_is_named(capsys, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe")
    out = tmp_path / "run"
    assert main(["train", "--config", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: config file '{bad}': line 1 is not valid UTF-8" in err, err
    assert "byte 0xff" in err and "byte offset 0 of the file" in err, err
    assert main(["train", "--config", str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: config file '{tmp_path}' is a directory, not a TOML config file" in err, err
    assert not out.exists()


BEFORE_THE_RUN_FOLDER = [
    (['data.corpus="foo"'], "data.corpus: expected one of ['multi30k', 'copy', '']"),
    (["data.corpus=multi30k", "data.src_lang=fr"], "data.src_lang: expected one of ['de', 'en']"),
    (["data.corpus=", "data.train_src=no.de", "data.train_tgt=no.en"], "data.train_src: cannot"),
    (["optim.betas=[0.9]"], "optim.betas: expected a list of 2 numbers, got [0.9] (1 number)"),
]


@pytest.mark.parametrize("items,message", BEFORE_THE_RUN_FOLDER)
def test_config_errors_come_before_the_run_folder(capsys, tmp_path, monkeypatch, items, message):
    monkeypatch.chdir(tmp_path)
    sets = [arg for item in items for arg in ("--set", item)]
    assert main(["train", "--config", TINY, "--out", "runs/new", *sets]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()


def test_threads_beyond_the_cpus_are_refused_naming_optim_threads(capsys, tmp_path):
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = tmp_path / "run"
    args = ["train", "--config", TINY, "--out", str(out), "--set", f"optim.threads={cpus + 1}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"error: optim.threads={cpus + 1}: expected 0 (the default: the physical cores" in err
    assert f"to {cpus}, the CPUs this process may use" in err and "--set optim.threads=0" in err
    assert not out.exists()


def test_a_data_error_found_while_reading_leaves_no_run_folder(capsys, tmp_path):
    """Files that open but do not pair up fail only once the run folder is made: the folders
    this run made go again, and a folder the user had stays."""
    (tmp_path / "two.de").write_text("a\nb\n")
    (tmp_path / "one.en").write_text("a\n")
    items = ["data.corpus=", f"data.train_src={tmp_path / 'two.de'}",
             f"data.train_tgt={tmp_path / 'one.en'}"]  # fmt: skip
    sets = [arg for item in items for arg in ("--set", item)]
    mine = tmp_path / "mine"
    mine.mkdir()
    for out in (tmp_path / "runs" / "new", mine):
        assert main(["train", "--no-progress", "--config", TINY, "--out", str(out), *sets]) == 2
        assert "has 2 lines but" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert mine.is_dir() and not any(mine.iterdir())


def test_short_run_then_resume_with_a_larger_budget(capsys, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--no-progress", "--config", TINY, "--out", str(out), *FAST]
    assert main([*args, "--max-steps", "3"]) == 0
    assert json.loads((out / "last" / "state.json").read_text())["step"] == 3
    assert main([*args, "--max-steps", "3"]) == 2  # the folder already holds a run
    assert "already holds a run" in capsys.readouterr().err
    assert main(["train", "--no-progress", "--resume", str(out), "--max-steps", "5"]) == 0
    assert json.loads((out / "last" / "state.json").read_text())["step"] == 5
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 5
    assert "resuming run" in (out / "train.log").read_text()


def test_a_full_disk_at_a_checkpoint_is_one_line_and_the_run_resumes(capsys, tmp_path, monkeypatch):
    """ENOSPC while `last` is saved: one line, no traceback; the previous `last` and the
    run stay usable (no temporary folder left, the lock released), and a resume continues."""
    import errno

    from attnkit import model_folder

    out = tmp_path / "run"
    args = ["train", "--no-progress", "--config", TINY, "--out", str(out), *FAST]
    assert main([*args, "--max-steps", "2"]) == 0
    capsys.readouterr()

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(model_folder, "_fsync_file", full)
        assert main(["train", "--no-progress", "--resume", str(out), "--max-steps", "4"]) == 2
    err = capsys.readouterr().err
    assert "attnkit train: error: no space left on the device" in err and "Traceback" not in err
    assert json.loads((out / "last" / "state.json").read_text())["step"] == 2
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    assert main(["train", "--no-progress", "--resume", str(out), "--max-steps", "4"]) == 0
    assert json.loads((out / "last" / "state.json").read_text())["step"] == 4
