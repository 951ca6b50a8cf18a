"""The memory allocator of the `attnkit` program: `train` on mimalloc (preloaded on Linux), the
other commands and the user's choice (ATTNKIT_ALLOCATOR, anything in LD_PRELOAD) kept on
theirs, a bad value refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from attnkit import allocator
from tests.helpers.training import FAST, TINY_COPY

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="LD_PRELOAD and the mimalloc wheel are Linux's"
)


# What a user's shell may hold that decides the allocator: none of it reaches the tests.
_SETTINGS = (
    "LD_PRELOAD",
    "MIMALLOC_PURGE_DELAY",
    allocator.ENV_VAR,
    "_ATTNKIT_ALLOCATOR_PRELOADED",
)


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in _SETTINGS}, **extra}


@pytest.fixture
def clean_environ(monkeypatch):
    """This process's own environment without those settings (reexec_if_needed reads it)."""
    for name in _SETTINGS:
        monkeypatch.delenv(name, raising=False)


@linux_only
def test_the_mimalloc_wheel_ships_a_shared_library():
    path = allocator.mimalloc_path()
    assert path is not None and path.is_file()
    assert path.read_bytes()[:4] == b"\x7fELF"


@pytest.fixture
def on_linux_with_mimalloc(monkeypatch, tmp_path):
    """The decision alone, on any platform: Linux with a mimalloc library at a fake path."""
    library = tmp_path / "libmimalloc.so"
    monkeypatch.setattr(allocator.sys, "platform", "linux")
    monkeypatch.setattr(allocator, "mimalloc_path", lambda: library)
    return library


def test_the_command_line_preloads_mimalloc_and_never_returns_memory(on_linux_with_mimalloc):
    env = allocator.preload_env(_env(), "train")
    assert env is not None
    assert env["LD_PRELOAD"] == str(on_linux_with_mimalloc)
    assert env["MIMALLOC_PURGE_DELAY"] == "-1"
    # Executed again with it, the process does not execute itself a third time.
    assert allocator.preload_env(env, "train") is None
    # The user's own mimalloc settings stand.
    tuned = allocator.preload_env(_env(MIMALLOC_PURGE_DELAY="50"), "train")
    assert tuned is not None and tuned["MIMALLOC_PURGE_DELAY"] == "50"


@pytest.mark.parametrize(
    ("extra", "command"),
    [
        ({"ATTNKIT_ALLOCATOR": "system"}, "train"),
        ({"ATTNKIT_ALLOCATOR": " System "}, "train"),
        ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "train"),
        ({"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"}, "evaluate"),
        ({"LD_PRELOAD": "/usr/lib/gcc/libasan.so.8"}, "train"),  # must come first
        ({}, "serve"),  # returns idle memory with glibc's malloc_trim (attnkit.serve.memory)
        ({}, "evaluate"),  # beam search measured slower on mimalloc
        ({}, "translate"),
        ({}, None),  # `attnkit` alone, or only options
    ],
)
def test_no_preload_when_the_user_or_the_command_says_otherwise(
    on_linux_with_mimalloc, extra, command
):
    assert allocator.preload_env(_env(**extra), command) is None


def test_no_preload_off_linux(on_linux_with_mimalloc, monkeypatch):
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert allocator.preload_env(_env(), "train") is None


def test_no_preload_without_the_library(monkeypatch, capsys):
    monkeypatch.setattr(allocator.sys, "platform", "linux")
    monkeypatch.setattr(allocator, "mimalloc_path", lambda: None)
    assert allocator.preload_env(_env(), "train") is None
    assert capsys.readouterr().err == ""  # the default: nothing to say
    assert allocator.preload_env(_env(ATTNKIT_ALLOCATOR="mimalloc"), "train") is None
    assert "pip install cmeel-mimalloc" in capsys.readouterr().err  # asked for: said


class _Exec:
    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple] = []
        self.error = error

    def __call__(self, path, args, env):
        self.calls.append((path, args, env))
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the signals blocked now
        if self.error is not None:
            raise self.error


def test_reexec_keeps_the_interpreter_its_options_and_the_arguments(
    on_linux_with_mimalloc, clean_environ, monkeypatch
):
    execve = _Exec()
    monkeypatch.setattr(allocator.os, "execve", execve)
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-X", "utf8", "-m", "attnkit", "-v", "train"])
    allocator.reexec_if_needed(["-v", "train"])
    [(path, args, env)] = execve.calls
    assert path == sys.executable
    assert args == [sys.executable, "-X", "utf8", "-m", "attnkit", "-v", "train"]
    assert env["LD_PRELOAD"] == str(on_linux_with_mimalloc)

    execve.calls.clear()
    allocator.reexec_if_needed(["-v", "serve"])  # the other commands stay on glibc
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-c", "import attnkit.cli"])
    allocator.reexec_if_needed(["train"])  # a program calling the entry itself is not replaced
    assert execve.calls == []


def test_a_failed_reexec_runs_on_and_says_so(
    on_linux_with_mimalloc, clean_environ, monkeypatch, capsys
):
    monkeypatch.setattr(allocator.os, "execve", _Exec(PermissionError(13, "Permission denied")))
    monkeypatch.setattr(sys, "orig_argv", ["/venv/bin/python", "/venv/bin/attnkit", "train"])
    allocator.reexec_if_needed(["train"])  # returns
    err = capsys.readouterr().err
    assert err.startswith("attnkit: warning: running on the C library's malloc: could not start")


def test_an_interrupt_during_the_reexec_is_kept_for_the_new_program(
    on_linux_with_mimalloc, clean_environ, monkeypatch, capsys
):
    """SIGINT is blocked across the exec (a Ctrl-C that reached the signal handler but not
    yet Python was lost with the old process image: the run went on, exit status 0), and
    unblocked again when the exec fails."""
    execve = _Exec(PermissionError(13, "Permission denied"))
    monkeypatch.setattr(allocator.os, "execve", execve)
    monkeypatch.setattr(sys, "orig_argv", ["/venv/bin/python", "/venv/bin/attnkit", "train"])
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signal.SIGINT not in before
    allocator.reexec_if_needed(["train"])
    assert signal.SIGINT in execve.mask
    assert execve.calls[0][2]["_ATTNKIT_UNBLOCK_SIGINT"] == "1"
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    # Blocked already (by the launcher): the new program is not told to unblock it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        allocator.reexec_if_needed(["train"])
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
    assert "_ATTNKIT_UNBLOCK_SIGINT" not in execve.calls[1][2]
    capsys.readouterr()


_BLOCKED_BY_THE_LAUNCHER = """
import os, signal
from attnkit import allocator
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # the launcher's choice
os.environ["_ATTNKIT_ALLOCATOR_PRELOADED"] = "1"  # re-executed, with no unblock marker
allocator.unblock_interrupts()
print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
"""


def test_a_sigint_block_the_launcher_chose_is_kept():
    """Only the block of the exec itself is lifted: a program started with SIGINT blocked
    keeps it blocked, re-executed or not."""
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKED_BY_THE_LAUNCHER], capture_output=True, text=True, timeout=60
    )
    assert done.stdout == "True\n", done.stderr


_PENDING_INTERRUPT = """
import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
os.kill(os.getpid(), signal.SIGINT)  # pressed during the exec: pending, blocked
os.environ["_ATTNKIT_ALLOCATOR_PRELOADED"] = "1"  # what the re-executed program finds
os.environ["_ATTNKIT_UNBLOCK_SIGINT"] = "1"  # blocked for the exec, not before it
sys.argv = ["attnkit", "walkthrough"]
from attnkit.cli import entry
entry()
"""


def test_the_reexecuted_program_stops_on_an_interrupt_pressed_during_the_exec():
    done = subprocess.run(
        [sys.executable, "-c", _PENDING_INTERRUPT], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr, done.stdout) == (130, "attnkit: error: interrupted\n", "")


def test_an_unknown_allocator_is_refused_by_name():
    with pytest.raises(
        ValueError,
        match=r"ATTNKIT_ALLOCATOR must be one of mimalloc, system "
        r"\(got 'jemalloc'\)",
    ):
        allocator.preload_env(_env(ATTNKIT_ALLOCATOR="jemalloc"), "train")


def test_importing_attnkit_never_changes_the_allocator():
    """Only the `attnkit` program preloads; a program that imports attnkit runs on its own."""
    code = (
        "import os, attnkit, attnkit.cli, attnkit.training\n"
        "from attnkit import allocator\n"
        "print(allocator.active(), os.environ.get('_ATTNKIT_ALLOCATOR_PRELOADED'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["system", "None"]


def _train(tmp_path: Path, env: dict[str, str], console_script: bool = False):
    """Two steps of the tiny copy task through the program; its train.log's first line."""
    # The console script pip wrote beside this interpreter, or `python -m attnkit`.
    program = [str(Path(sys.executable).parent / "attnkit")] if console_script else [
        sys.executable, "-m", "attnkit",
    ]  # fmt: skip
    out = tmp_path / "run"
    done = subprocess.run(
        [*program, "-v", "train", "--no-progress", "--config", str(TINY_COPY), "--out", str(out),
         *(f"--set={o}" for o in (*FAST, "optim.max_steps=2", "optim.val_bleu=false"))],
        capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"}, timeout=240,
    )  # fmt: skip
    log = out / "train.log"
    first = log.read_text(encoding="utf-8").splitlines()[0] if log.exists() else ""
    return done, first


@linux_only
@pytest.mark.parametrize("console_script", [False, True], ids=["python-m", "console-script"])
def test_train_runs_on_mimalloc(tmp_path, console_script):
    done, first = _train(tmp_path, _env(), console_script)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "memory allocator: mimalloc" in done.stderr  # -v: the program's own check
    assert first.endswith(", memory allocator mimalloc"), first  # what the run folder keeps


def test_train_runs_on_the_system_allocator_when_asked(tmp_path):
    done, first = _train(tmp_path, _env(ATTNKIT_ALLOCATOR="system"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "memory allocator: system" in done.stderr
    assert first.endswith(", memory allocator system"), first


@linux_only
def test_other_commands_stay_on_the_system_allocator(tmp_path):
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("a black dog runs across the green field .\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "attnkit", "-v", "bleu", str(hyp), "-r", str(hyp)],
        capture_output=True, text=True, env=_env(), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "memory allocator: system" in done.stderr
    assert " = 100.00 " in done.stdout


def test_the_program_names_a_bad_allocator_and_exits_2():
    done = subprocess.run(
        [sys.executable, "-m", "attnkit", "bleu", "-", "-r", "-"],
        capture_output=True, text=True, env=_env(ATTNKIT_ALLOCATOR="fast"), timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "attnkit: error: ATTNKIT_ALLOCATOR must be one of mimalloc, system (got 'fast')"
    )
    assert done.stdout == ""
