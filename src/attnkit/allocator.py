"""The memory allocator of ``attnkit train``: mimalloc, preloaded.

A training step allocates and frees some thousand tensors whose sizes change from batch to
batch (batches of different lengths). glibc's malloc returns large freed blocks to the kernel
and maps them again, so the step spends its time in page faults that zero fresh pages (they
showed up as ``memset`` and ``memcpy`` in a profile of the run), and its resident memory
fragments and grows (9.9 GB after 37 minutes of the Multi30k config). mimalloc keeps freed
memory for reuse: the translator's 57-minute run made 1.44-1.58x the steps at a lower peak
(docs/benchmarks.md, "Training throughput", and ``benchmarks/allocator.py``).

An allocator is chosen before a process starts (``LD_PRELOAD``), so :func:`preload_env` says
whether the command line should execute itself once more with the library that the
``cmeel-mimalloc`` wheel ships (a dependency on Linux), and :func:`active` reads which one a
process runs on. ``ATTNKIT_ALLOCATOR=system`` keeps the C library's malloc, as do the other
commands (:data:`PRELOADED_COMMANDS`); anything already in ``LD_PRELOAD`` (the user's own
allocator, a sanitizer, a memory profiler) is left as it is. The library API (``import
attnkit``) never changes the allocator of the program that imports it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "ENV_VAR",
    "CHOICES",
    "PRELOADED_COMMANDS",
    "active",
    "check_choice",
    "mimalloc_path",
    "preload_env",
    "reexec_if_needed",
    "unblock_interrupts",
]

ENV_VAR = "ATTNKIT_ALLOCATOR"
CHOICES = ("mimalloc", "system")
# Set in the environment of the re-executed process, so that it never executes itself again
# (even when the preload failed and the library is not mapped).
_MARK = "_ATTNKIT_ALLOCATOR_PRELOADED"
# Set for the re-executed process when SIGINT was blocked for the exec only (unblock_interrupts).
_UNBLOCK = "_ATTNKIT_UNBLOCK_SIGINT"
# The commands that run on mimalloc: where it was measured to pay. Training makes 1.25x the
# steps of a 2-minute run and 1.47x those of the 57-minute translator run on glibc's malloc;
# beam-search decoding (evaluate, translate) ran slower on it (268-290 against 326-339
# sentences/s on test2016, forked workers), and `serve` gives its idle memory back with glibc's
# malloc_trim (attnkit.serve.memory), so the others stay on the C library's malloc.
# MIMALLOC_PURGE_DELAY=-1: freed memory is never returned to the system before the process
# exits (a training run keeps its peak: 2.9 GB for the translator against glibc's 4.6+).
PRELOADED_COMMANDS = frozenset({"train"})
_KNOWN = (("libmimalloc", "mimalloc"), ("libjemalloc", "jemalloc"), ("libtcmalloc", "tcmalloc"))


def mimalloc_path() -> Path | None:
    """The ``libmimalloc.so`` that the installed ``cmeel-mimalloc`` wheel ships, or None."""
    import importlib.metadata  # here: a fifth of the program's start before it can catch Ctrl-C

    try:
        files = importlib.metadata.files("cmeel-mimalloc") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == "libmimalloc.so" and file.parent.name == "lib":
            path = Path(str(file.locate()))
            if path.is_file():
                return path.resolve()
    return None


def check_choice(environ: Mapping[str, str]) -> str:
    """The allocator ``ATTNKIT_ALLOCATOR`` asks for (``mimalloc`` when unset); ValueError
    naming the variable for anything else."""
    value = environ.get(ENV_VAR, "").strip().lower() or "mimalloc"
    if value not in CHOICES:
        raise ValueError(
            f"{ENV_VAR} must be one of {', '.join(CHOICES)} (got {environ[ENV_VAR]!r})"
        )
    return value


def preload_env(environ: Mapping[str, str], command: str | None) -> dict[str, str] | None:
    """The environment to execute the command line again with mimalloc preloaded, or None
    when this process should run as it is: ``ATTNKIT_ALLOCATOR=system``, not Linux, a command
    other than ``train`` (:data:`PRELOADED_COMMANDS`), already re-executed, anything already
    in ``LD_PRELOAD`` (an allocator of the user's, a sanitizer's runtime or a memory profiler,
    which must come first), or no mimalloc installed (said on standard error when
    ``ATTNKIT_ALLOCATOR=mimalloc`` was set).

    Raises ValueError for an ``ATTNKIT_ALLOCATOR`` that is neither ``mimalloc`` nor
    ``system``.
    """
    if check_choice(environ) == "system" or not sys.platform.startswith("linux"):
        return None
    if command not in PRELOADED_COMMANDS or environ.get(_MARK):
        return None
    if environ.get("LD_PRELOAD", "").strip():  # the user's own preload stands
        return None
    path = mimalloc_path()
    if path is None:
        if environ.get(ENV_VAR, "").strip():
            _warn("the cmeel-mimalloc package is not installed (pip install cmeel-mimalloc)")
        return None
    env = dict(environ)
    env["LD_PRELOAD"] = str(path)
    env[_MARK] = "1"
    env.setdefault("MIMALLOC_PURGE_DELAY", "-1")
    return env


def active() -> str:
    """The allocator this process runs on: ``mimalloc``, ``jemalloc``, ``tcmalloc`` (found
    among the libraries mapped into the process) or ``system``."""
    try:
        maps = Path("/proc/self/maps").read_text(errors="replace")
    except OSError:
        return "system"
    for library, name in _KNOWN:
        if library in maps:
            return name
    return "system"


def _warn(why: str) -> None:
    print(f"attnkit: warning: running on the C library's malloc: {why}", file=sys.stderr)


def reexec_if_needed(argv: list[str]) -> None:
    """Execute this interpreter again with mimalloc preloaded when :func:`preload_env` says
    so; return (and run on with the current allocator) otherwise or if that fails.

    ``argv`` is the command's own arguments (``sys.argv[1:]``). The interpreter is started
    again with its original command line (``sys.orig_argv``: its options and the way it was
    called, console script, ``-m attnkit`` or ``torchrun``), and only when that command line
    ends with ``argv``: a program that calls the entry point itself (a notebook, a test with
    a patched ``sys.argv``) is never replaced. Raises ValueError for a bad
    ``ATTNKIT_ALLOCATOR``.
    """
    command = next((a for a in argv if not a.startswith("-")), None)
    env = preload_env(os.environ, command)
    if env is None:
        return
    original = list(getattr(sys, "orig_argv", []))
    tail = original[len(original) - len(argv) :]
    if not sys.executable or len(original) <= len(argv) or tail != argv:
        return
    # A Ctrl-C that reached this process's signal handler but not yet its Python code would be
    # lost with the process image: blocked across the exec, it waits in the kernel for the new
    # program, which unblocks it (unblock_interrupts) and stops there. (One that came before the
    # block is raised by the interpreter before the exec.)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    if signal.SIGINT not in mask:  # blocked here, not by whoever started this process
        env[_UNBLOCK] = "1"
    try:
        os.execve(sys.executable, [sys.executable, *original[1:]], env)
    except (OSError, ValueError) as err:
        _warn(f"could not start again with mimalloc preloaded ({err})")
    finally:  # reached only when the exec failed
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def unblock_interrupts() -> None:
    """In a process :func:`reexec_if_needed` started: unblock SIGINT, which it blocked across
    the exec (not one the process that started attnkit blocked), so that a Ctrl-C pressed
    meanwhile is raised now (KeyboardInterrupt), not lost."""
    if os.environ.pop(_UNBLOCK, None) and hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
