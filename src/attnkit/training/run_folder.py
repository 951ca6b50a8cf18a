"""A run folder: which folders a run may write into, and one writer at a time.

Rules (``attnkit train`` and :class:`~attnkit.training.Trainer` follow them):

* A new run goes into a folder that does not exist, is empty, or holds only the files of a
  run that stopped before its first checkpoint (nothing to resume; it starts over there),
  with the partial checkpoint folder (``last.tmp-<pid>``) of a run killed while writing it.
  Such a folder must prove that attnkit wrote it: every run leaves its lock file
  ``.attnkit.lock`` behind (below), so run-like names alone (a user's ``config.toml`` or
  ``train.log``) are not taken over. A folder holding anything else is refused with a message
  and left exactly as it was, whether it holds another run (resume it, or choose a new folder)
  or files attnkit did not write.
* A resume needs a folder holding a run with a ``last`` checkpoint, the only one that holds
  a run's state (optimizer, schedule, data order); ``best`` and the kept ``steps/`` hold
  weights. A ``last`` that attnkit cannot read as its own (corrupt, or written by something
  else) cannot be resumed from: the refusal says so and what is left, rather than advise a
  move that would leave no ``last`` at all.
* A run replaces its checkpoint folders (``last``, ``best``, and with ``keep_checkpoints``
  deletes its old ``steps/`` ones) only when they hold nothing but what attnkit wrote: files
  a user put there are never deleted. So it checks them before its first step
  (:meth:`RunFolder.check_checkpoints`), new run and resume alike, and refuses to start,
  naming the files and saying to move them out, rather than train and then fail to save.
* A new run that fails while it is set up (unreadable data, a tokenizer that cannot be
  trained, an interrupt) takes back what it made (:meth:`RunFolder.discard_new`): the run
  files it created, then the folders it created if they are empty. Files and folders that
  were there before it started are never removed.
* While a run writes its folder it holds an exclusive lock on ``FOLDER/.attnkit.lock``
  (:mod:`filelock`: ``flock`` on Unix, ``LockFileEx`` on Windows). A second ``train`` or
  ``--resume`` into the same folder is refused, so two runs never delete each other's
  temporary checkpoints or interleave ``metrics.jsonl``. The operating system drops the lock
  when its process ends, however it ends: a run killed with SIGKILL leaves the file behind
  but not the lock, and ``--resume`` proceeds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from filelock import FileLock, Timeout

from attnkit.model_folder import (
    RUN_MODELS,
    TOKENIZER_FILE,
    check_outside_models,
    foreign_entries,
    replace_refusal,
)
from attnkit.model_folder import STATE_FILE as _STATE_FILE
from attnkit.training.checkpoint import find_checkpoint

logger = logging.getLogger(__name__)

LOCK_FILE = ".attnkit.lock"
RUN_CONFIG_FILE = "config.toml"  # the run's resolved training config
METRICS_FILE = "metrics.jsonl"  # one JSON line per logged step and evaluation
LOG_FILE = "train.log"  # the run's log messages
# What a run writes at its top level before its first checkpoint; a folder with only these,
# the lock file among them, holds a run attnkit recognises.
RUN_FILES = frozenset({RUN_CONFIG_FILE, METRICS_FILE, LOG_FILE, TOKENIZER_FILE, LOCK_FILE})
# The partial checkpoint a run killed while writing its first one leaves: never loaded.
_PARTIAL_CHECKPOINT = re.compile(rf"({'|'.join(RUN_MODELS)})\.tmp-\d+")
# What a run saves beside its run files: checkpoints (and their kill-time versions) and the
# kept steps.
_RUN_OUTPUT = re.compile(rf"({'|'.join(RUN_MODELS)}|steps)(\.(tmp|old)-\d+)?")


class RunFolderError(ValueError):
    """A run folder that may not be used as asked; nothing in it was changed."""


def check_run_folder(path: str | os.PathLike[str], what: str) -> None:
    """Raises :class:`RunFolderError` naming ``what`` (the option, e.g. ``--resume``) and
    ``path`` if ``path`` does not exist or is not a folder."""
    path = Path(path)
    if not path.exists():
        raise RunFolderError(
            f"{what} {os.fspath(path)!r}: no such folder (expected a run folder written by "
            "`attnkit train`)"
        )
    if not path.is_dir():
        raise RunFolderError(f"{what} {os.fspath(path)!r}: is a file, expected a run folder")


def run_of_checkpoint(checkpoint: str | os.PathLike[str]) -> Path:
    """The run folder that holds a checkpoint folder (``RUN/last``, ``RUN/best``,
    ``RUN/steps/step_N``), relative to the working folder when ``checkpoint`` is (``.`` inside
    ``RUN/last`` gives ``..``)."""
    absolute = Path(os.path.abspath(checkpoint))
    run = absolute.parent.parent if absolute.parent.name == "steps" else absolute.parent
    return run if Path(checkpoint).is_absolute() else Path(os.path.relpath(run))


def _refusal(folder: Path) -> str | None:
    """Why the run may not replace ``folder`` (:func:`attnkit.model_folder.replace_refusal`),
    with weights that cannot be read (a truncated file) as one more reason, not an error."""
    try:
        return replace_refusal(folder)
    except ValueError as err:
        return f"its weights cannot be read ({err})"


def _missing_folders(path: Path) -> list[Path]:
    """The folders ``path.mkdir(parents=True)`` would create, outermost first."""
    missing = []
    while not path.exists() and not path.is_symlink() and path.parent != path:
        missing.append(path)
        path = path.parent
    return missing[::-1]


class RunFolder:
    """A run's folder and its writer lock.

    Args:
        path: The run folder (``runs/NAME``).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock: FileLock | None = None
        # Set by open_new(): the folders it created and the entries the folder held before,
        # so that discard_new() removes only what this run made.
        self._made: list[Path] = []
        self._held: frozenset[str] | None = None

    @property
    def locked(self) -> bool:
        """True while this object holds the folder's lock."""
        return self._lock is not None and self._lock.is_locked

    def last_checkpoint(self) -> Path | None:
        """The run's complete ``last`` checkpoint (one attnkit wrote), or None."""
        found = find_checkpoint(self.path / "last")
        return found if found is not None and _refusal(found) is None else None

    def open_new(self) -> None:
        """Creates (or takes an empty) folder for a new run and locks it.

        Raises:
            RunFolderError: If the folder holds anything but the files of a run that stopped
                before its first checkpoint, or another process holds its lock.
        """
        self._refuse_unless_empty()
        made = []  # the folders this call creates: only those discard_new may remove
        for folder in _missing_folders(self.path):
            try:
                folder.mkdir()
            except FileExistsError:  # another process made it meanwhile: not ours
                continue
            made.append(folder)
        self.path.mkdir(parents=True, exist_ok=True)
        had_lock_file = (self.path / LOCK_FILE).exists()
        self.lock()
        try:
            self._refuse_unless_empty()  # a second writer may have come between the checks
        except RunFolderError:
            self.unlock()
            raise
        # What the folder holds once it is ours (a run that stopped early may have left files):
        # discard_new keeps all of it.
        held = {p.name for p in self.path.iterdir()}
        if not had_lock_file:
            held.discard(LOCK_FILE)
        self._made, self._held = made, frozenset(held)

    def discard_new(self) -> None:
        """Takes back what :meth:`open_new` and the run's setup made, for a new run that
        failed before it began, and releases the lock.

        Deletes the run files (:data:`RUN_FILES`) that were not in the folder when it was
        opened, then the folders :meth:`open_new` created, innermost first, as long as they
        are empty. Anything else stays: files that were there before, files attnkit does not
        write, and every folder the user had. Without the lock (another process may be
        writing) nothing is deleted.
        """
        held, made = self._held, self._made
        self._held, self._made = None, []
        if held is None or not self.locked:
            self.unlock()
            return
        # The lock file last, while still held: no other process takes the folder meanwhile.
        for name in [*sorted(RUN_FILES - held - {LOCK_FILE}), LOCK_FILE]:
            path = self.path / name
            if name not in held and path.is_file() and not path.is_symlink():
                with contextlib.suppress(OSError):  # best effort: the run's error comes first
                    path.unlink()
        self.unlock()
        for folder in reversed(made):
            try:
                folder.rmdir()  # only an empty folder: whatever else appeared in it stays
            except OSError:
                break
        logger.debug("discarded the new run in %s", self.path)

    def open_for_resume(self) -> Path:
        """Locks a run folder and returns its ``last`` checkpoint.

        Raises:
            RunFolderError: If the folder holds no ``last`` checkpoint, one the run may not
                replace (:meth:`check_checkpoints`: files attnkit did not write in it, named
                with what to do), or another process holds its lock.
        """
        check_run_folder(self.path, "--resume")
        if self.last_checkpoint() is None:
            found = find_checkpoint(self.path / "last")
            if found is not None:  # a checkpoint, with something attnkit did not write
                refusal = self.refusal([found, *self.blocked_checkpoints(["best"])])
                raise RunFolderError(
                    f"--resume {os.fspath(self.path)!r}: {refusal}; nothing was trained"
                )
            raise RunFolderError(self.no_last_message())
        self.lock()
        found = self.last_checkpoint()
        if found is None:  # pragma: no cover - removed between the checks
            self.unlock()
            raise RunFolderError(f"--resume {os.fspath(self.path)!r}: no `last` checkpoint")
        return found

    def no_last_message(self) -> str:
        """Why ``--resume`` finds nothing to resume, and what to do: a run that stopped before
        its first checkpoint is started over; a checkpoint folder given for its run is
        named as such."""
        path = os.fspath(self.path)
        if self.stopped_before_first_checkpoint():
            config = self.path / RUN_CONFIG_FILE
            again = (
                f"`attnkit train --config {os.fspath(config)} --out {path}`"
                if config.is_file()
                else f"`attnkit train --config CONFIG --out {path}`"
            )
            return (
                f"--resume {path!r}: no `last` checkpoint: the run stopped before its first "
                f"one, so there is nothing to resume; start it over in the same folder with "
                f"{again}"
            )
        if (self.path / _STATE_FILE).is_file():  # a checkpoint folder, e.g. RUN/last
            return (
                f"--resume {path!r}: this is a checkpoint folder, not a run folder; resume its "
                f"run with `attnkit train --resume {os.fspath(run_of_checkpoint(self.path))}`"
            )
        return f"--resume {path!r}: no `last` checkpoint in that folder"

    def blocked_checkpoints(self, names: Iterable[str] = RUN_MODELS) -> list[Path]:
        """The checkpoint folders among ``names`` (paths relative to the run folder, e.g.
        ``last``, ``best``, ``steps/step_0000100``) that exist and that the run may not
        replace (:func:`attnkit.model_folder.check_replaceable`): files attnkit did not write
        in them, most often. The refusal protects those files; the run must not find out
        only when it saves."""
        return [self.path / n for n in names if _refusal(self.path / n) is not None]

    def check_checkpoints(self, names: Iterable[str] = RUN_MODELS, *, what: str) -> None:
        """Raises :class:`RunFolderError` naming ``what`` (the option, e.g. ``--resume``)
        if the run may not replace one of its checkpoint folders ``names``
        (:meth:`blocked_checkpoints`), before anything is trained: a run that could not save
        them would lose its steps. The message names the folders, the files attnkit did not
        write in them, and says to move them out."""
        blocked = self.blocked_checkpoints(names)
        if blocked:
            raise RunFolderError(
                f"{what} {os.fspath(self.path)!r}: {self.refusal(blocked)}; nothing was trained"
            )

    def refusal(self, folders: Iterable[Path]) -> str:
        """Why the run may not replace ``folders`` and what to do: each folder with its
        reason, then advice that fits the reasons. Files attnkit did not write (most often)
        are moved out, and a folder that is not attnkit's is moved aside, then the run
        resumes; but the ``last`` a resume reads is never advised aside (a resume needs it):
        a link there is replaced by the folder it points to, and a ``last`` attnkit cannot
        read as its own cannot be resumed from (:meth:`no_resume_advice`). Empty when all of
        them may be replaced."""
        reasons = {f: _refusal(f) for f in folders}
        folders = [f for f, why in reasons.items() if why is not None]
        if not folders:
            return ""
        parts = [
            f"checkpoint folder {os.fspath(f)!r}: refusing to replace it: {reasons[f]}"
            for f in folders
        ]
        resumed = find_checkpoint(self.path / "last")  # the folder a resume reads
        last = next((f for f in folders if f == resumed and not foreign_entries(f)), None)
        if last is not None and not last.is_symlink():
            return f"{'; '.join(parts)}; {self.no_resume_advice()}"
        actions = []
        if last is not None:
            actions.append(
                f"put the folder the link {os.fspath(last)!r} points to in its place (a run "
                "replaces `last` at every save, never through a link)"
            )
        others = [f for f in folders if f != last]
        if others:
            it = "it" if len(others) == 1 else "these folders"
            if any(foreign_entries(f) for f in others):
                actions.append(f"move the files attnkit did not write out of {it}")
            else:
                actions.append(f"move {it} aside")
        return (
            f"{'; '.join(parts)}; {' and '.join(actions)} (attnkit never deletes or replaces "
            f"files it did not write), then run `attnkit train --resume {os.fspath(self.path)}` "
            "again"
        )

    def cannot_resume(self, why: object) -> RunFolderError:
        """The error for a resume whose ``last`` checkpoint cannot be used (``why``: a corrupt
        or truncated file in it, read before any step), with :meth:`no_resume_advice`."""
        return RunFolderError(
            f"--resume {os.fspath(self.path)!r}: {why}; {self.no_resume_advice()}; nothing was "
            "trained"
        )

    def no_resume_advice(self) -> str:
        """What to do when the ``last`` checkpoint cannot be used (corrupt, or not attnkit's):
        no resume is possible (moving ``last`` aside leaves nothing to resume from); what the
        run kept, and how to train on in a new run folder."""
        from attnkit.training.averaging import step_checkpoints  # it imports this module

        kept = [self.path / "best"] if self.path.joinpath("best").is_dir() else []
        kept = [f for f in [*kept, *step_checkpoints(self.path)] if _refusal(f) is None]
        if kept:
            names = ", ".join(repr(os.fspath(f)) for f in kept)
            left = (
                f"its trained weights are kept in {names} (models to translate or evaluate "
                "with, not runs to resume)"
            )
        else:
            left = "no other checkpoint of it is kept"
        config = self.path / RUN_CONFIG_FILE
        config = os.fspath(config) if config.is_file() else "CONFIG"
        return (
            "a run resumes only from its `last` checkpoint (weights with the optimizer, schedule "
            "and data order), and attnkit cannot use this one, so the run cannot be resumed; "
            f"{left}. To train on, start a new run in another folder: `attnkit train --config "
            f"{config} --out NEW_FOLDER`"
        )

    def _is_ours(self) -> bool:
        """The folder holds the lock file every run leaves (a file, not a link)."""
        lock = self.path / LOCK_FILE
        return lock.is_file() and not lock.is_symlink()

    def _run_entries(self) -> set[str]:
        """The entries of the folder that a run writes before its first checkpoint: the run
        files, and the partial checkpoint folders of a run killed while writing its first
        one (only checkpoint files in them)."""
        entries = set()
        for entry in self.path.iterdir():
            if entry.is_symlink():
                continue
            if entry.name in RUN_FILES and entry.is_file():
                entries.add(entry.name)
            elif (
                _PARTIAL_CHECKPOINT.fullmatch(entry.name)
                and entry.is_dir()
                and not foreign_entries(entry)
            ):
                entries.add(entry.name)
        return entries

    def stopped_before_first_checkpoint(self) -> bool:
        """The folder holds a run that stopped before its first checkpoint (killed in its first
        steps, or while writing that checkpoint): the run files and partial checkpoint
        folders only, beside the lock file that proves a run used the folder, so run-like
        names alone (a user's ``config.toml``) do not count. Nothing in it can be resumed;
        a new run may start over in it."""
        path = self.path
        if not path.is_dir() or path.is_symlink() or not self._is_ours():
            return False
        entries = {p.name for p in path.iterdir() if p.name != LOCK_FILE}
        return bool(entries) and entries <= self._run_entries()

    def lock(self) -> None:
        """Takes the folder's writer lock, without waiting.

        Raises:
            RunFolderError: If another process (or another :class:`RunFolder`) holds it.
        """
        if self.locked:
            return
        lock = FileLock(self.path / LOCK_FILE, blocking=False)
        try:
            lock.acquire()
        except Timeout:
            raise RunFolderError(
                f"{os.fspath(self.path)!r} is in use: another attnkit process is writing this "
                f"run (it holds {LOCK_FILE}); wait for it to finish or choose another folder"
            ) from None
        self._lock = lock
        logger.debug("locked %s", self.path / LOCK_FILE)

    def unlock(self) -> None:
        """Releases the lock (the lock file stays, as :mod:`filelock` leaves it)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _refuse_unless_empty(self) -> None:
        path = self.path
        try:
            check_outside_models(path, "--out")
        except ValueError as err:
            raise RunFolderError(str(err)) from None
        if not path.exists():
            return
        if not path.is_dir():
            raise RunFolderError(f"--out {os.fspath(path)!r}: is a file, expected a run folder")
        entries = sorted(p.name for p in path.iterdir() if p.name != LOCK_FILE)
        if not entries:  # empty, or a lock file alone (lock() refuses it while held)
            return
        if self.last_checkpoint() is not None:
            raise RunFolderError(
                f"--out {os.fspath(path)!r} already holds a run; resume it with --resume "
                f"{os.fspath(path)!r} or choose a new folder"
            )
        if self.stopped_before_first_checkpoint():
            # Nothing to resume. A new run may take it over unless the run is still going
            # (then lock() refuses). A partial checkpoint is removed by the run's first save.
            if not self.locked:
                self.lock()
                self.unlock()
            logger.info("%s holds a run without checkpoint: starting over in it", path)
            return
        if self._is_ours():  # a run's lock file: a run without `last`, with more than its files
            written = self._run_entries()
            outputs = [e for e in entries if e not in written and _RUN_OUTPUT.fullmatch(e)]
            foreign = [e for e in entries if e not in written and e not in outputs]
            if foreign:
                shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
                raise RunFolderError(
                    f"--out {os.fspath(path)!r} holds an attnkit run without a `last` checkpoint "
                    f"to resume, and also {shown}, which a run does not write there; choose a "
                    "new or empty folder. Nothing in it was changed"
                )
            raise RunFolderError(
                f"--out {os.fspath(path)!r} holds a run without a `last` checkpoint, the only "
                f"one a run resumes from, but with {', '.join(outputs)}: a new run there would "
                "replace them. Move them out to keep them (models to translate or evaluate "
                "with), or choose a new folder. Nothing in it was changed"
            )
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise RunFolderError(
            f"--out {os.fspath(path)!r} is not empty and is not an attnkit run (it holds "
            f"{shown}); choose a new or empty folder. Nothing in it was changed"
        )
