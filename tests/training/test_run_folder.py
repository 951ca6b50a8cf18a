"""Run folders: a new run only into a new or empty folder, one writer at a time, and a
killed writer's lock does not block a resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnkit.cli import main
from attnkit.training.run_folder import LOCK_FILE, RUN_FILES, RunFolder, RunFolderError
from attnkit.training.trainer import Trainer, train
from tests.helpers.training import FAST, ROOT, TINY_COPY, fast_config, subprocess_env


def test_a_runs_record_may_sit_in_a_model_folder():
    """A shipped model carries its run's record (config.toml, metrics.jsonl, train.log) and
    its checkpoint's state; model_folder (below training) must list the same names."""
    from attnkit import model_folder as mf
    from attnkit.training import run_folder

    record = {run_folder.RUN_CONFIG_FILE, run_folder.METRICS_FILE, run_folder.LOG_FILE}
    assert record == RUN_FILES - {LOCK_FILE, mf.TOKENIZER_FILE}
    assert record | {mf.CHECKPOINT_STATE_FILE, mf.TOKENIZER_FILE} <= mf.FOLDER_FILES


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file and folder under ``folder`` with its bytes and modification time."""
    out = {}
    for path in sorted(folder.rglob("*")):
        data = path.read_bytes() if path.is_file() else b"<dir>"
        out[path.relative_to(folder).as_posix()] = (data, path.stat().st_mtime_ns)
    return out


def make(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


NOT_RUNS = [
    {"notes.txt": "my notes\n"},
    {"best/model.safetensors": "not ours", "last/state.json": '{"step": 3}', "x.py": "1"},
    {"last/README": "a folder called last that is no checkpoint"},
    {"metrics.jsonl": '{"step": 1}\n', "data.csv": "a,b\n"},
    {".hidden": ""},
    {"best/keep.txt": "precious"},
    {"steps/step_0000001/weights.bin": "x"},
    # Run-like names without the lock file every attnkit run leaves: not proof of a run.
    {"config.toml": "# mine"},
    {"train.log": "my own training notes\n"},
    {"metrics.jsonl": '{"accuracy": 0.9}\n'},
    {"config.toml": "[model]\n", "tokenizer.json": "{}", "train.log": "x\n"},
]


@pytest.mark.parametrize("files", NOT_RUNS, ids=range(len(NOT_RUNS)))
def test_a_folder_that_is_not_a_run_is_refused_and_untouched(tmp_path, files):
    folder = make(tmp_path / "out", files)
    before = snapshot(folder)
    with pytest.raises(RunFolderError, match=r"is not empty and is not an attnkit run"):
        train(fast_config("optim.max_steps=2"), folder, progress=False)
    assert snapshot(folder) == before  # nothing written, renamed or deleted, no lock file


def test_cli_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    folder = make(tmp_path / "mine", {"best/model.safetensors": "mine", "notes.txt": "x"})
    before = snapshot(folder)
    sets = [arg for item in FAST for arg in ("--set", item)]
    args = ["train", "--no-progress", "--config", str(TINY_COPY), "--out", str(folder), *sets]
    assert main([*args, "--max-steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "is not an attnkit run" in err and "best, notes.txt" in err and "Traceback" not in err
    assert snapshot(folder) == before


def test_a_new_run_is_never_made_inside_a_checkpoint(tmp_path):
    """`train --out OTHER_RUN/last/x` made a run there, and OTHER_RUN could not resume."""
    last = tmp_path / "other" / "last"
    last.mkdir(parents=True)
    (last / "config.json").write_text('{"model": {}}')  # attnkit's translation layout
    (last / "model.safetensors").write_bytes(b"")
    before = snapshot(tmp_path / "other")
    with pytest.raises(RunFolderError, match=r"inside the model folder .*other/last'"):
        RunFolder(last / "x").open_new()
    assert snapshot(tmp_path / "other") == before


def test_a_file_is_no_run_folder(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(RunFolderError, match=r"is a file, expected a run folder"):
        train(fast_config("optim.max_steps=1"), path, progress=False)
    assert path.read_text() == "x"


def test_a_run_that_stopped_before_its_first_checkpoint_is_started_over(tmp_path):
    """A run killed before anything is saved leaves only attnkit's run files, none of them a
    checkpoint; the same folder takes the next attempt."""
    folder = make(tmp_path / "run", {name: "" for name in RUN_FILES})
    (folder / "metrics.jsonl").write_text('{"step": 7, "train_loss": 1.0}\n')  # a killed run's
    result = train(fast_config("optim.max_steps=2"), folder, progress=False)
    assert result.step == 2
    steps = [
        json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()
    ]
    assert 7 not in steps and max(steps) == 2


def test_run_files_with_a_foreign_file_or_a_link_are_not_taken_over(tmp_path):
    """The lock file proves a run used the folder, but only together with nothing else: a
    user's file beside it, or a run file that is a symbolic link, is refused."""
    for files in ({LOCK_FILE: "", "config.toml": "[model]\n", "notes.txt": "x"},
                  {LOCK_FILE: "", "train.log": "x"}):  # fmt: skip
        folder = make(tmp_path / f"out{len(files)}", files)
        if "train.log" in files:
            (tmp_path / "elsewhere.toml").write_text("# mine")
            (folder / "config.toml").symlink_to(tmp_path / "elsewhere.toml")
        before = snapshot(folder)
        with pytest.raises(RunFolderError, match=r"is not empty and is not an attnkit run"):
            RunFolder(folder).open_new()
        assert snapshot(folder) == before
    assert (tmp_path / "elsewhere.toml").read_text() == "# mine"


@pytest.mark.parametrize("exists", [False, True])
def test_a_new_or_empty_folder_is_taken(tmp_path, exists):
    folder = tmp_path / "a" / "b"
    if exists:
        folder.mkdir(parents=True)
    result = train(fast_config("optim.max_steps=1"), folder, progress=False)
    assert result.step == 1 and (folder / "last" / "state.json").is_file()


def _mismatched_files(tmp_path: Path) -> list[str]:
    """Overrides naming two files of 2 and 1 lines: they open, and fail when they are read,
    after the run folder is made."""
    (tmp_path / "two.de").write_text("a\nb\n")
    (tmp_path / "one.en").write_text("a\n")
    return ["data.corpus=", f"data.train_src={tmp_path / 'two.de'}",
            f"data.train_tgt={tmp_path / 'one.en'}"]  # fmt: skip


def test_a_run_that_fails_in_its_setup_takes_back_the_folders_it_made(tmp_path):
    folder = tmp_path / "runs" / "a" / "b"
    bad = fast_config("optim.max_steps=2", *_mismatched_files(tmp_path))
    with pytest.raises(ValueError, match=r"has 2 lines but .* has 1 lines"):
        train(bad, folder, progress=False)
    assert not (tmp_path / "runs").exists()


def test_a_run_that_fails_in_its_setup_leaves_what_was_there_before(tmp_path):
    """The user's empty folder stays, and so do the files of an earlier run that stopped
    before its first checkpoint; only the files this run created go."""
    bad = fast_config("optim.max_steps=2", *_mismatched_files(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"has 2 lines"):
        train(bad, empty, progress=False)
    assert empty.is_dir() and not any(empty.iterdir())
    stopped = make(tmp_path / "stopped", {LOCK_FILE: "", "train.log": "an earlier run\n"})
    with pytest.raises(ValueError, match=r"has 2 lines"):
        train(bad, stopped, progress=False)
    assert sorted(p.name for p in stopped.iterdir()) == [LOCK_FILE, "train.log"]
    assert (stopped / "train.log").read_text().startswith("an earlier run\n")


def test_discard_new_removes_only_what_the_run_made(tmp_path):
    folder = RunFolder(tmp_path / "new" / "run")
    folder.open_new()
    make(folder.path, {"train.log": "x", "tokenizer.json": "{}", "notes.txt": "a user's"})
    folder.discard_new()
    assert not folder.locked
    assert sorted(p.name for p in (tmp_path / "new" / "run").iterdir()) == ["notes.txt"]
    folder = RunFolder(tmp_path / "new2")
    folder.open_new()
    (folder.path / "sub").mkdir()  # not a run file: neither it nor its folder is removed
    folder.discard_new()
    assert (tmp_path / "new2" / "sub").is_dir() and not (tmp_path / "new2" / LOCK_FILE).exists()
    RunFolder(tmp_path / "never").discard_new()  # never opened: nothing to take back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "new2"]


def test_discard_new_deletes_nothing_without_the_lock(tmp_path):
    folder = RunFolder(tmp_path / "run")
    folder.open_new()
    folder.unlock()
    folder.discard_new()
    assert (tmp_path / "run" / LOCK_FILE).is_file()


def test_a_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path):
    folder = tmp_path / "run"
    train(fast_config("optim.max_steps=2"), folder, progress=False)
    before = snapshot(folder)
    first = RunFolder(folder)
    first.open_for_resume()
    try:
        for attempt in (
            lambda: train(fast_config("optim.max_steps=4"), folder, resume=True, progress=False),
            lambda: Trainer(fast_config("optim.max_steps=4"), folder, resume=True).evaluate(),
            lambda: RunFolder(folder).lock(),
        ):
            with pytest.raises(RunFolderError, match=r"is in use: another attnkit process"):
                attempt()
        assert snapshot(folder) == before
    finally:
        first.unlock()
    assert train(fast_config("optim.max_steps=4"), folder, resume=True, progress=False).step == 4


def test_a_new_run_is_refused_while_another_starts_in_the_folder(tmp_path):
    """Another process has locked an empty folder (it is starting up): a second new run there
    is refused, not interleaved with it."""
    folder = tmp_path / "run"
    folder.mkdir()
    first = RunFolder(folder)
    first.open_new()
    try:
        with pytest.raises(RunFolderError, match=r"is in use"):
            train(fast_config("optim.max_steps=1"), folder, progress=False)
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_FILE]
    finally:
        first.unlock()


HOLD_LOCK = """
import sys, time
from attnkit.training.run_folder import RunFolder
folder = RunFolder(sys.argv[1])  # kept: the lock lives as long as the object
folder.lock()
print("locked", flush=True)
time.sleep(120)
"""


def hold_lock_in_subprocess(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(folder)],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_another_process_holding_the_lock_blocks_the_cli_and_its_kill_frees_it(tmp_path):
    """Across processes (flock): `attnkit train --resume` is refused while another process
    holds the run's lock; after that process is killed with SIGKILL its lock file is still
    there but no longer held, and the resume goes ahead."""
    folder = tmp_path / "run"
    train(fast_config("optim.max_steps=2"), folder, progress=False)
    proc = hold_lock_in_subprocess(folder)
    try:
        refused = subprocess.run(
            [sys.executable, "-m", "attnkit", "train", "--no-progress", "--resume", str(folder)],
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert "is in use: another attnkit process" in refused.stderr
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL and (folder / LOCK_FILE).exists()
    result = train(fast_config("optim.max_steps=3"), folder, resume=True, progress=False)
    assert result.step == 3


def test_a_lock_left_by_a_killed_process_is_free(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    proc = hold_lock_in_subprocess(folder)
    with pytest.raises(RunFolderError, match=r"is in use"):
        RunFolder(folder).lock()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    deadline = time.monotonic() + 10  # the kernel drops the flock as the process goes
    folder_lock = RunFolder(folder)
    while True:
        try:
            folder_lock.lock()
            break
        except RunFolderError:
            assert time.monotonic() < deadline, "the killed process's lock was never released"
            time.sleep(0.05)
    assert folder_lock.locked
    folder_lock.unlock()


def test_two_runs_started_into_one_folder_do_not_mix(tmp_path):
    """The second `attnkit train --out F` started while the first writes F is refused; the
    first finishes with one clean metrics.jsonl and its own checkpoints."""
    folder = tmp_path / "run"
    sets = [arg for item in [*FAST, "optim.save_every=5"] for arg in ("--set", item)]

    def command(steps: int) -> list[str]:
        return [sys.executable, "-m", "attnkit", "train", "--no-progress", "--config",
                str(TINY_COPY), "--out", str(folder), "--max-steps", str(steps), *sets]  # fmt: skip

    first = subprocess.Popen(
        command(60), env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (folder / "metrics.jsonl").is_file():  # the first run is under way
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.02)
        second = subprocess.run(
            command(30), env=subprocess_env(), capture_output=True, text=True, timeout=120,
            cwd=ROOT,
        )  # fmt: skip
        assert first.wait(timeout=240) == 0, first.stderr.read()
    finally:
        if first.poll() is None:
            first.kill()
        first.stderr.close()
    assert second.returncode == 2, second.stderr[-2000:]
    assert "is in use" in second.stderr or "already holds a run" in second.stderr
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train_loss" in r] == list(range(1, 61))
    assert json.loads((folder / "last" / "state.json").read_text())["step"] == 60
    assert not list(folder.glob("last.*-*"))
