"""Run folders: a new run only into a new or empty folder, one writer at a time, and a
killed writer's lock does not block a resume."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.training.run_folder import LOCK_FILE, RUN_FILES, RunFolder, RunFolderError
from attnkit.training.trainer import Trainer, train
from tests.helpers.training import FAST, ROOT, TINY_COPY, fast_config, subprocess_env, weights


def test_a_runs_record_may_sit_in_a_model_folder():
    """A shipped model carries its run's record (config.toml, metrics.jsonl, train.log) and
    its checkpoint's state; model_folder (below training) must list the same names."""
    from attnkit import model_folder as mf
    from attnkit.training import run_folder

    record = {run_folder.RUN_CONFIG_FILE, run_folder.METRICS_FILE, run_folder.LOG_FILE}
    assert record == RUN_FILES - {LOCK_FILE, mf.TOKENIZER_FILE}
    assert mf.RUN_LOCK_FILE == LOCK_FILE  # how model_folder tells a run folder from a model's
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
        with pytest.raises(
            RunFolderError,
            match=r"holds an attnkit run without a `last` checkpoint to resume, and also "
            r"(notes\.txt|config\.toml), which a run does not write there",
        ):
            RunFolder(folder).open_new()
        assert snapshot(folder) == before
    assert (tmp_path / "elsewhere.toml").read_text() == "# mine"


def _killed_in_first_save(tmp_path: Path, *, best: bool = False) -> Path:
    """A run folder as SIGKILL leaves it during its first checkpoint's write: the run files,
    and ``last.tmp-<pid>`` with part of a checkpoint (copied from a real run). With ``best``,
    killed later: after the first ``best`` was saved, while ``last`` was being written."""
    done = tmp_path / "done"
    train(fast_config("optim.max_steps=2", "optim.eval_every=2"), done, progress=False)
    folder = tmp_path / "killed"
    folder.mkdir()
    for name in RUN_FILES:
        (folder / name).write_bytes((done / name).read_bytes())
    partial = folder / "last.tmp-4242"
    partial.mkdir()
    for name in ("config.json", "model.safetensors"):  # resume.pt, state.json not yet written
        (partial / name).write_bytes((done / "last" / name).read_bytes())
    if best:
        shutil.copytree(done / "best", folder / "best")
    return folder


def test_a_run_killed_while_writing_its_first_checkpoint_is_started_over(tmp_path, capsys):
    """Before: `--resume` said there was no `last`, and a new run refused the folder as 'not an
    attnkit run' (it held last.tmp-<pid>): the run could be neither resumed nor restarted."""
    folder = _killed_in_first_save(tmp_path)
    assert RunFolder(folder).stopped_before_first_checkpoint()
    assert main(["train", "--resume", str(folder), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert (
        "the run stopped before its first one, so there is nothing to resume; start it over" in err
    )
    assert f"attnkit train --config {folder / 'config.toml'} --out {folder}" in err
    result = train(fast_config("optim.max_steps=2"), folder, progress=False)
    assert result.step == 2 and (folder / "last" / "state.json").is_file()
    assert not (folder / "last.tmp-4242").exists()  # the first save removed the partial one


def test_a_run_killed_after_its_first_best_keeps_it(tmp_path):
    """A `best` without `last` cannot be resumed, and a new run would replace it: refused,
    naming it, the folder untouched."""
    folder = _killed_in_first_save(tmp_path, best=True)
    before = snapshot(folder)
    with pytest.raises(
        RunFolderError,
        match=r"holds a run without a `last` checkpoint, the only one a run resumes from, but "
        r"with best: a new run there would replace them\. Move them out to keep them",
    ):
        RunFolder(folder).open_new()
    assert snapshot(folder) == before


def test_resume_given_a_checkpoint_folder_names_its_run(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "run"
    train(fast_config("optim.max_steps=1"), folder, progress=False)
    assert main(["train", "--resume", str(folder / "last"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "this is a checkpoint folder, not a run folder; resume its run with " in err
    assert f"`attnkit train --resume {folder}`" in err
    monkeypatch.chdir(folder / "last")  # from inside the checkpoint: the run is ..
    assert main(["train", "--resume", ".", "--no-progress"]) == 2
    assert "resume its run with `attnkit train --resume ..`" in capsys.readouterr().err


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


def _contents(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (the lock file aside: locking may touch it)."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


STRAY_FILES = [  # (files put into the run's checkpoint folders, the folders named)
    (["last/out.txt"], ["last"]),
    (["best/attn.html", "best/w.png"], ["best"]),
    (["last/out.txt", "best/attn.html"], ["last", "best"]),
    (["steps/step_0000002/notes.txt"], ["steps/step_0000002"]),
]


@pytest.mark.parametrize("stray,named", STRAY_FILES, ids=["+".join(n) for _, n in STRAY_FILES])
def test_a_resume_is_refused_before_any_step_when_it_could_not_save(tmp_path, stray, named):
    """A file in `last` gave "no `last` checkpoint" (it is there); files in `best` let the
    resume train, evaluate, and then fail to save `best`: its steps were lost, at every retry.
    Now the resume names the files and what to do before it trains a step, and the files stay."""
    run = tmp_path / "run"
    keep = ["optim.val_bleu=false", "optim.save_every=2", "optim.keep_checkpoints=2"]
    train(fast_config("optim.max_steps=4", *keep), run, progress=False)
    assert (run / "steps" / "step_0000002").is_dir()
    for name in stray:
        (run / name).write_text("a user's file")
    before = _contents(run)
    with pytest.raises(RunFolderError) as caught:
        train(fast_config("optim.max_steps=8", *keep), run, resume=True, progress=False)
    message = str(caught.value)
    assert message.startswith(f"--resume '{run}': checkpoint folder '{run / named[0]}': ")
    for folder in named:
        names = sorted(Path(s).name for s in stray if s.startswith(folder + "/"))
        assert (
            f"checkpoint folder '{run / folder}': refusing to replace it: it holds {names}, "
            "which attnkit does not write" in message
        )
    assert message.endswith(
        "; move the files attnkit did not write out of "
        + ("it" if len(named) == 1 else "these folders")
        + " (attnkit never deletes or replaces files it did not write), then run "
        f"`attnkit train --resume {run}` again; nothing was trained"
    )
    assert _contents(run) == before  # no step, no log line, every file where it was
    for name in stray:  # moved out, the resume goes on
        (run / name).rename(tmp_path / Path(name).name)
    assert (
        train(fast_config("optim.max_steps=6", *keep), run, resume=True, progress=False).step == 6
    )


def test_the_cli_resume_names_the_stray_file(tmp_path, capsys):
    """The QA report's case: `translate -o RUN/last/out.txt` (refused now) had left a file in
    `last`, and `train --resume RUN` said there was no `last` checkpoint."""
    run = tmp_path / "run"
    train(fast_config("optim.max_steps=2", "optim.val_bleu=false"), run, progress=False)
    (run / "last" / "out.txt").write_text("a translation")
    assert main(["train", "--no-progress", "--resume", str(run), "--max-steps", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"attnkit train: error: --resume '{run}': checkpoint folder '{run / 'last'}': refusing "
        "to replace it: it holds ['out.txt'], which attnkit does not write; move the files "
        "attnkit did not write out of it"
    ), err
    assert "no `last` checkpoint" not in err and "Traceback" not in err


def test_files_put_into_best_during_the_run_cost_no_step(tmp_path, caplog):
    """A file put into `best` while the run trains: the run refuses to replace `best`, saves
    `last` first (so that its steps are kept), and stops saying what to do; the resume then
    writes the `best` that was due and goes on."""
    run = tmp_path / "run"
    scores = iter([1.0, 2.0])  # step 2, then a new best at step 4, when best/ holds a file

    def hook(model):
        score = next(scores)
        if score == 2.0:
            (run / "best" / "notes.txt").write_text("mine")
        return {"val_bleu": score}

    config = fast_config("optim.max_steps=6", "optim.eval_every=2")
    with pytest.raises(RunFolderError) as caught:
        train(config, run, eval_hook=hook, progress=False)
    assert str(caught.value) == (
        f"checkpoint folder '{run / 'best'}': refusing to replace it: it holds ['notes.txt'], "
        "which attnkit does not write; move the files attnkit did not write out of it (attnkit "
        f"never deletes or replaces files it did not write), then run `attnkit train --resume "
        f"{run}` again; the run's steps up to 4 are saved in '{run / 'last'}'"
    )
    assert json.loads((run / "last" / "state.json").read_text())["step"] == 4
    assert json.loads((run / "best" / "state.json").read_text())["step"] == 2
    assert (run / "best" / "notes.txt").read_text() == "mine"
    step4 = weights(run, "last")
    (run / "best" / "notes.txt").rename(tmp_path / "notes.txt")
    with caplog.at_level("INFO"):
        result = train(config, run, resume=True, eval_hook=lambda m: {"val_bleu": 0.0},
                       progress=False)  # fmt: skip
    assert result.step == 6 and result.best_value == 2.0
    assert "saving the best checkpoint of step 4, which was not saved" in caplog.text
    assert json.loads((run / "best" / "state.json").read_text())["step"] == 4
    best = weights(run, "best")
    assert all(torch.equal(best[k], step4[k]) for k in step4)


def test_a_resume_keeps_a_best_newer_than_last(tmp_path):
    """`best` saved at step 6 after `last` at step 4, then the run is killed before its next
    `last`: the resume must not take `best` for one that was not saved and overwrite it with
    the step-4 weights."""
    run = tmp_path / "run"
    options = ["optim.max_steps=10", "optim.eval_every=2", "optim.save_every=4",
               "optim.val_bleu=false"]  # fmt: skip
    scores = iter([1.0, 2.0, 3.0])  # steps 2, 4, 6: a new best each time

    def hook(model):
        score = next(scores, None)
        if score is None:  # step 8, before its `last`: the run is stopped
            raise KeyboardInterrupt
        return {"val_bleu": score}

    with pytest.raises(KeyboardInterrupt):
        train(fast_config(*options), run, eval_hook=hook, progress=False)
    assert json.loads((run / "last" / "state.json").read_text())["step"] == 4
    assert json.loads((run / "best" / "state.json").read_text())["step"] == 6
    step6 = weights(run, "best")

    def stop(model):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(fast_config(*options), run, resume=True, eval_hook=stop, progress=False)
    assert json.loads((run / "best" / "state.json").read_text())["step"] == 6
    best = weights(run, "best")
    assert all(torch.equal(best[k], step6[k]) for k in step6)


def test_a_kept_step_checkpoint_holding_a_users_file_is_not_deleted(tmp_path, monkeypatch, caplog):
    """With keep_checkpoints the run deletes its older steps/ checkpoints: one a user put a
    file into during the run was deleted with the file."""
    run = tmp_path / "run"
    calls = []
    original = Trainer._train_step

    def step(self, batches):
        calls.append(1)
        if len(calls) == 3:  # steps/step_0000002 is there
            (run / "steps" / "step_0000002" / "notes.txt").write_text("mine")
        return original(self, batches)

    monkeypatch.setattr(Trainer, "_train_step", step)
    config = fast_config(
        "optim.max_steps=6", "optim.save_every=2", "optim.keep_checkpoints=1",
        "optim.val_bleu=false",
    )  # fmt: skip
    with caplog.at_level("WARNING"):
        train(config, run, progress=False)
    assert (run / "steps" / "step_0000002" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (run / "steps").iterdir()) == ["step_0000002", "step_0000006"]
    assert f"kept {run / 'steps' / 'step_0000002'}, not deleting it: it holds" in caplog.text


KEEP = ["optim.val_bleu=false", "optim.save_every=2", "optim.keep_checkpoints=2"]


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A run of 4 steps with `last`, `best` and two kept `steps/` checkpoints; each test takes
    a copy (:func:`_copy_run`)."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    train(fast_config("optim.max_steps=4", *KEEP), run, progress=False)
    assert {p.name for p in run.iterdir() if p.is_dir()} == {"best", "last", "steps"}
    return run


def _copy_run(stopped_run: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(stopped_run, tmp_path / "run"))


def _no_resume_advice(run: Path) -> str:
    kept = ", ".join(
        repr(str(run / n)) for n in ("best", "steps/step_0000002", "steps/step_0000004")
    )
    return (
        "a run resumes only from its `last` checkpoint (weights with the optimizer, schedule "
        "and data order), and attnkit cannot use this one, so the run cannot be resumed; its "
        f"trained weights are kept in {kept} (models to translate or evaluate with, not runs to "
        f"resume). To train on, start a new run in another folder: `attnkit train --config "
        f"{run / 'config.toml'} --out NEW_FOLDER`; nothing was trained"
    )


def test_a_last_attnkit_cannot_read_as_its_own_is_not_advised_aside(stopped_run, tmp_path):
    """`last` holding nothing but attnkit's file names, written by something else (weights
    without attnkit's mark, a config.json without its "model" section): the refusal said
    "move it aside, then resume", and a resume without `last` has nothing to resume from."""
    run = _copy_run(stopped_run, tmp_path)
    last = run / "last"
    from safetensors.torch import load_file, save_file

    save_file(load_file(last / "model.safetensors"), last / "model.safetensors")  # no mark
    config = json.loads((last / "config.json").read_text())
    (last / "config.json").write_text(json.dumps({**config.pop("model"), **config}))
    before = _contents(run)
    with pytest.raises(RunFolderError) as caught:
        train(fast_config("optim.max_steps=8", *KEEP), run, resume=True, progress=False)
    message = str(caught.value)
    assert message == (
        f"--resume '{run}': checkpoint folder '{last}': refusing to replace it: neither "
        'attnkit\'s writer mark in model.safetensors nor its "model" section in config.json; '
        + _no_resume_advice(run)
    )
    assert "aside" not in message
    assert _contents(run) == before
    # The advice holds: the kept weights are models, and a new run in another folder trains.
    from attnkit.decoding.loading import load_translation_model

    load_translation_model(run / "best")
    assert (
        train(fast_config("optim.max_steps=2", *KEEP), tmp_path / "new", progress=False).step == 2
    )


def test_a_corrupt_last_names_the_file_and_what_is_kept(stopped_run, tmp_path):
    """A truncated `last/model.safetensors` ended the resume with the reader's error alone."""
    run = _copy_run(stopped_run, tmp_path)
    (run / "last" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(RunFolderError) as caught:
        train(fast_config("optim.max_steps=8", *KEEP), run, resume=True, progress=False)
    assert str(caught.value).startswith(
        f"--resume '{run}': {run / 'last' / 'model.safetensors'}: not a readable safetensors file ("
    )
    assert str(caught.value).endswith("truncated or corrupt; " + _no_resume_advice(run))


def test_a_link_for_last_is_advised_to_be_replaced_by_its_folder(stopped_run, tmp_path):
    """`last` as a link to the real checkpoint (a run never writes through a link): the advice
    was to move it aside, after which there was no `last`; now it is to put the folder in its
    place, which done, the resume goes on."""
    run = _copy_run(stopped_run, tmp_path)
    real = tmp_path / "elsewhere"
    (run / "last").rename(real)
    (run / "last").symlink_to(real, target_is_directory=True)
    with pytest.raises(RunFolderError) as caught:
        train(fast_config("optim.max_steps=6", *KEEP), run, resume=True, progress=False)
    assert str(caught.value) == (
        f"--resume '{run}': checkpoint folder '{run / 'last'}': refusing to replace it: a "
        f"symbolic link; put the folder the link '{run / 'last'}' points to in its place (a run "
        "replaces `last` at every save, never through a link) (attnkit never deletes or "
        f"replaces files it did not write), then run `attnkit train --resume {run}` again; "
        "nothing was trained"
    )
    (run / "last").unlink()
    real.rename(run / "last")
    assert (
        train(fast_config("optim.max_steps=6", *KEEP), run, resume=True, progress=False).step == 6
    )
