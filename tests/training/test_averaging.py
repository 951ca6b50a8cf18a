"""Checkpoint averaging: kept step checkpoints, the mean of their weights, `attnkit average`."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnkit.cli import main
from attnkit.training.averaging import average_checkpoints, average_run, step_checkpoints
from attnkit.training.trainer import train
from tests.helpers.bad_files import poison_weights
from tests.helpers.training import ROOT, fast_config, subprocess_env


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    config = fast_config(
        "optim.max_steps=7",
        "optim.save_every=2",
        "optim.keep_checkpoints=3",
        "optim.eval_every=3",
        "optim.val_bleu=false",
    )
    train(config, out, progress=False)
    return out


def test_the_newest_saves_are_kept(run_dir):
    kept = step_checkpoints(run_dir)
    # `last` is saved at steps 2, 4, 6 and at the end (7); only the newest 3 stay.
    assert [p.name for p in kept] == ["step_0000004", "step_0000006", "step_0000007"]
    assert all(not (p / "resume.pt").exists() for p in kept)  # weights only
    last = load_file(run_dir / "last" / "model.safetensors")
    newest = load_file(kept[-1] / "model.safetensors")
    assert last.keys() == newest.keys()
    assert all(torch.equal(last[k], newest[k]) for k in last)


def test_average_is_the_elementwise_mean(run_dir, tmp_path):
    kept = step_checkpoints(run_dir)
    out = average_checkpoints(kept, tmp_path / "avg")
    loaded = [load_file(p / "model.safetensors") for p in kept]
    got = load_file(out / "model.safetensors")
    assert got.keys() == loaded[0].keys()
    for name, tensor in got.items():
        want = (sum(d[name].double() for d in loaded) / len(loaded)).float()
        torch.testing.assert_close(tensor, want, rtol=0, atol=1e-7)
    assert not torch.equal(got[name], loaded[-1][name])  # it did change something
    state = json.loads((out / "state.json").read_text())
    assert [p.split("/")[-1] for p in state["averaged"]] == [p.name for p in kept]


def test_average_of_one_checkpoint_is_that_checkpoint(run_dir, tmp_path):
    kept = step_checkpoints(run_dir)
    out = average_checkpoints(kept[-1:], tmp_path / "one")
    a, b = load_file(out / "model.safetensors"), load_file(kept[-1] / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="no checkpoints"):
        average_checkpoints([], tmp_path / "none")


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "attnkit", "average", *map(str, args)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=ROOT,
        timeout=120,
    )


def test_cli_averages_and_reports_errors(run_dir, tmp_path):
    done = _cli(run_dir, "--last", "2", "--out", tmp_path / "avg2")
    assert done.returncode == 0, done.stderr
    assert "averaged 2 checkpoints (step_0000006, step_0000007)" in done.stdout
    assert (tmp_path / "avg2" / "model.safetensors").is_file()
    too_many = _cli(run_dir, "--last", "9")
    assert too_many.returncode == 2 and "kept only 3 checkpoints; give --last 3" in too_many.stderr
    none = _cli(tmp_path, "--last", "2")
    assert none.returncode == 2 and "keep_checkpoints" in none.stderr


# --------------------------------------------------------------------------- what --out may replace


def _snapshot(folder):
    import hashlib

    return {
        p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize(
    "out,message",
    [
        (".", r"is \(or holds\) the run"),
        ("..", r"is \(or holds\) the run"),
        ("last", r"one of the run's own checkpoints"),
        ("best", r"one of the run's own checkpoints"),
        ("last.old-5", r"one of the run's own checkpoints"),
        ("steps", r"a checkpoint being averaged"),
        ("steps/step_0000007", r"one of the run's own checkpoints"),
        ("steps/step_0000007/sub", r"one of the run's own checkpoints"),
        ("steps/step_0000002", r"one of the run's own checkpoints"),
        ("steps/new", r"one of the run's own checkpoints"),
        # inside a checkpoint: the run could no longer resume (last) or save (best)
        ("last/avg", r"inside the model folder .*last'"),
        ("best/inner/deeper", r"inside the model folder .*best'"),
    ],
)
def test_out_never_lands_on_the_run_or_its_checkpoints(run_dir, out, message):
    from attnkit.training.averaging import average_run

    before = _snapshot(run_dir)
    with pytest.raises(ValueError, match=message):
        average_run(run_dir, last=3, out=run_dir / out)
    assert _snapshot(run_dir) == before


def _theses(folder):
    folder.mkdir()
    (folder / "thesis.tex").write_text("precious")
    (folder / "figures").mkdir()


def _file(path):
    path.write_text("precious")


def _checkpoint_copy(path, run_dir):
    shutil.copytree(run_dir / "last", path)


def _translation_folder(path, run_dir):
    from attnkit.decoding import save_translation_model
    from attnkit.training.checkpoint import load_model

    model, tokenizer, _ = load_model(run_dir / "last")
    save_translation_model(path, model, tokenizer)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p, r: _theses(p), r"refusing to replace it: it holds \['figures', 'thesis.tex'\]"),
        (lambda p, r: _file(p), r"refusing to replace it: a file, not a folder"),
        (_checkpoint_copy, r"refusing to replace it: .* not an earlier `attnkit average` output"),
        (_translation_folder, r"refusing to replace it: .* not an earlier `attnkit average`"),
    ],
)
def test_out_refuses_what_averaging_did_not_write(run_dir, tmp_path, make, message):
    target = tmp_path / "out"
    make(target, run_dir)
    before = _snapshot(tmp_path)
    with pytest.raises(ValueError, match=rf"--out '.*out': {message}"):
        average_checkpoints(step_checkpoints(run_dir), target, run=run_dir)
    assert _snapshot(tmp_path) == before


def test_out_replaces_an_earlier_average_or_an_empty_folder(run_dir, tmp_path):
    kept = step_checkpoints(run_dir)
    (tmp_path / "empty").mkdir()
    average_checkpoints(kept[-1:], tmp_path / "empty")
    out = average_checkpoints(kept[-1:], tmp_path / "avg")
    again = average_checkpoints(kept, out)  # an earlier average: replaced
    assert json.loads((again / "state.json").read_text())["averaged"][0].endswith("step_0000004")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["avg", "empty"]


def test_a_recovered_old_step_checkpoint_is_averaged(run_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    steps = run / "steps"
    os.rename(steps / "step_0000006", steps / "step_0000006.old-77")  # killed between renames
    (steps / "step_0000008.tmp-78").mkdir()  # killed while writing: never counted
    (steps / "step_0000008.tmp-78" / "state.json").write_text('{"step": 8}')
    kept = step_checkpoints(run)
    assert [p.name for p in kept] == ["step_0000004", "step_0000006.old-77", "step_0000007"]
    out = average_checkpoints(kept, tmp_path / "avg", run=run)
    loaded = [load_file(p / "model.safetensors") for p in kept]
    got = load_file(out / "model.safetensors")
    for name, tensor in got.items():
        want = (sum(d[name].double() for d in loaded) / 3).float()
        torch.testing.assert_close(tensor, want, rtol=0, atol=1e-7)


def test_cli_refusals_are_one_line_and_leave_everything(run_dir, tmp_path, capsys):
    before = _snapshot(run_dir)
    _theses(tmp_path / "theses")
    for out, message in [
        (run_dir, "is (or holds) the run"),
        (run_dir / "last", "one of the run's own checkpoints"),
        (run_dir / "best", "one of the run's own checkpoints"),
        (tmp_path / "theses", "refusing to replace it"),
    ]:
        assert main(["average", str(run_dir), "--last", "2", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"attnkit average: error: --out '{out}': {message}" in err, err
    assert (tmp_path / "theses" / "thesis.tex").read_text() == "precious"
    assert _snapshot(run_dir) == before


def test_cli_out_names_another_run_folder_as_one(run_dir, tmp_path, capsys):
    """`--out OTHER_RUN` said it "holds ['.attnkit.lock', 'best', 'last'], which attnkit does
    not write", though attnkit wrote every one of them."""
    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    before = _snapshot(other)
    assert main(["average", str(run_dir), "--last", "2", "--out", str(other)]) == 2
    assert capsys.readouterr().err == (
        f"attnkit average: error: --out '{other}': refusing to replace it: it is a training "
        "run folder (it holds ['.attnkit.lock', 'best', 'last', 'steps']), not a model folder; "
        "give a new folder (a run folder is never replaced)\n"
    )
    assert _snapshot(other) == before


def test_cli_names_a_run_folder_that_is_missing_or_a_file(tmp_path, capsys):
    assert main(["average", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert f"error: run '{tmp_path / 'nope'}': no such folder (expected a run folder" in err, err
    (tmp_path / "file").write_text("x")
    assert main(["average", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert f"error: run '{tmp_path / 'file'}': is a file, expected a run folder" in err, err
    assert main(["average", str(tmp_path)]) == 2  # a folder: no kept checkpoints in it
    assert f"no kept checkpoints in {tmp_path / 'steps'}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize(
    "out, message",
    [
        (".", "--out '.': expected a folder's name (not the current or parent folder)"),
        ("sub/..", "--out 'sub/..': expected a folder's name (not the current or parent folder)"),
        ("a_file/x", "--out 'a_file/x': 'a_file' is not a folder"),
        ("a_file/x/y", "--out 'a_file/x/y': 'a_file' is not a folder"),
    ],
)
def test_out_that_cannot_be_written_by_name_is_named(
    run_dir, tmp_path, monkeypatch, capsys, out, message
):
    """Before: "PosixPath('.') has an empty name" (`--out .`, `--out ""`), and for a path under
    a file "checkpoint folder ...: cannot write beside it in 'a_file' (File exists)"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("mine")
    before = _snapshot(tmp_path)
    assert main(["average", str(run_dir), "--last", "2", "--out", out]) == 2
    assert capsys.readouterr().err.startswith(f"attnkit average: error: {message}")
    assert _snapshot(tmp_path) == before


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_out_on_a_file_system_that_takes_no_folder_names_out(run_dir, capsys):
    """Before: "'/proc/x.tmp-1576': no such file or directory", the temporary folder's name."""
    assert main(["average", str(run_dir), "--last", "2", "--out", "/proc/attnkit_x"]) == 2
    assert capsys.readouterr().err == (
        "attnkit average: error: --out '/proc/attnkit_x': cannot write beside it in "
        "'/proc' (No such file or directory)\n"
    )


def test_a_checkpoint_folder_given_as_the_run_names_the_run(run_dir, capsys):
    """Before: "no kept checkpoints in RUN/last/steps"."""
    assert main(["average", str(run_dir / "last")]) == 2
    assert capsys.readouterr().err == (
        f"attnkit average: error: {run_dir / 'last'}: a checkpoint folder, not a run folder; "
        f"average the run's kept checkpoints with `attnkit average {run_dir}`\n"
    )


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "x", "", "nan"])
def test_last_is_a_checked_positive_integer(run_dir, capsys, value):
    with pytest.raises(SystemExit) as exit_info:
        main(["average", str(run_dir), f"--last={value}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"attnkit average: error: argument --last: expected an integer >= 1, got {value!r}" in err
    )


# --------------------------------------------------------------------------- a full disk


@pytest.mark.parametrize("where", ["fsync", "rename"])
def test_a_full_disk_leaves_an_earlier_average_and_no_temporary_folder(
    run_dir, tmp_path, monkeypatch, capsys, where
):
    """ENOSPC while the files are flushed (fsync) or the folder is put in place (rename):
    one line naming the output and the full disk, the earlier average as it was."""
    from attnkit import model_folder

    out = average_checkpoints(step_checkpoints(run_dir)[-1:], tmp_path / "avg", run=run_dir)
    before, run_before = _snapshot(tmp_path), _snapshot(run_dir)

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "fsync":
        monkeypatch.setattr(model_folder, "_fsync_file", full)
    else:
        rename = os.rename
        monkeypatch.setattr(
            os, "rename", lambda a, b: full() if ".tmp-" in os.fspath(a) else rename(a, b)
        )
    assert main(["average", str(run_dir), "--last", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnkit average: error: ") and err.count("\n") == 1, err
    assert str(out) in err and ("no space left" in err or "No space left" in err), err
    assert _snapshot(tmp_path) == before and _snapshot(run_dir) == run_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["avg"]  # no avg.tmp-*, avg.old-*


def test_a_full_disk_inside_safetensors_is_one_line(run_dir, tmp_path, monkeypatch, capsys):
    """What safetensors raises when the disk fills while it writes (its Rust I/O error)."""
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    out = tmp_path / "avg"
    assert main(["average", str(run_dir), "--last", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no space left on the device" in err and str(out) in err
    assert not out.exists() and not list(tmp_path.iterdir())


def _nan_into(folder) -> tuple[str, int]:
    """One NaN in ``folder``'s weights; the tensor's name and size."""
    return poison_weights(folder / "model.safetensors")


def test_a_checkpoint_holding_nan_is_not_averaged(run_dir, tmp_path, capsys):
    """Before: the average was written with 4,096 NaN values, exit status 0."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    poisoned = step_checkpoints(run)[0]
    name, size = _nan_into(poisoned)
    assert main(["average", str(run), "--last", "3"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"attnkit average: error: {poisoned / 'model.safetensors'}: tensor {name!r} (1 NaN, 0 inf "
        f"of {size} values) holds NaN or inf; these weights cannot be used (a run that "
        "diverged, or a damaged file)\n"
    )
    assert not (run / "averaged").exists()


def test_a_language_model_checkpoint_holding_nan_is_not_averaged(tmp_path):
    from tests.helpers.lm import tiny_lm_config

    run = tmp_path / "lm"
    config = tiny_lm_config("optim.max_steps=4", "optim.save_every=1", "optim.keep_checkpoints=2")
    train(config, run, progress=False)
    poisoned = step_checkpoints(run)[-1]
    name, _ = _nan_into(poisoned)
    with pytest.raises(ValueError, match=r"holds NaN or inf; these weights cannot be used"):
        average_checkpoints(step_checkpoints(run), tmp_path / "avg")
    assert not (tmp_path / "avg").exists()


def test_checkpoints_from_before_and_after_a_dropout_change_are_averaged(run_dir, tmp_path):
    """A resume may change the dropout; averaging refused the run's kept checkpoints from
    before and after ("model config differs"), though their weights are alike."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    config = fast_config(
        "optim.max_steps=9",
        "optim.save_every=2",
        "optim.keep_checkpoints=3",
        "optim.eval_every=3",
        "optim.val_bleu=false",
        "model.dropout=0.3",
    )
    train(config, run, resume=True, progress=False)
    kept = step_checkpoints(run)
    assert [p.name for p in kept] == ["step_0000007", "step_0000008", "step_0000009"]
    out, averaged = average_run(run, last=3)
    assert averaged == kept and (out / "model.safetensors").is_file()


def test_checkpoints_of_other_models_are_not_averaged(run_dir, tmp_path):
    other = tmp_path / "other"
    train(fast_config("optim.max_steps=1", "model.d_ff=48"), other, progress=False)
    with pytest.raises(
        ValueError, match=r"are not checkpoints of one model: model.d_ff: 48 and 64$"
    ):
        average_checkpoints([other / "last", step_checkpoints(run_dir)[-1]], tmp_path / "avg")
    assert not (tmp_path / "avg").exists()
