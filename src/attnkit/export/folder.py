"""Export folders: which folder an export may replace, and writing one whole or not at all.

An export folder holds another engine's files, so :func:`attnkit.model_folder.atomic_folder`
(which replaces only attnkit *model* folders, recognised by their weights or ``config.json``)
does not recognise it. The rules are the same: it is written into ``NAME.tmp-<pid>/``, every
file and the folder are fsynced, an existing ``NAME`` is renamed to ``NAME.old-<pid>``, the new
folder takes the name and the old one is deleted, so a process killed at any moment leaves a
complete folder under ``NAME`` or ``NAME.old-<pid>`` (the next export of ``NAME`` deletes such
leftovers). An existing ``NAME`` is replaced only if
it is empty or an export attnkit wrote: nothing but :data:`EXPORT_FILES`, and an
``attnkit_export.json`` that says so (:func:`is_export_folder`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from attnkit import model_folder as mf
from attnkit.files import fsync_folder, replace_folder, temp_beside

_STALE = re.compile(r"\.(tmp|old)-\d+")  # the suffix of a writer's temporary folder
RECORD_FILE = "attnkit_export.json"
EXPORT_FORMAT = "ctranslate2"
# What a CTranslate2 export holds: CTranslate2's files (model.bin, config.json and a shared or
# a source and a target vocabulary), the model's tokenizer.json and attnkit's record.
EXPORT_FILES = frozenset(
    {
        "model.bin",
        mf.CONFIG_FILE,
        "shared_vocabulary.json",
        "source_vocabulary.json",
        "target_vocabulary.json",
        mf.TOKENIZER_FILE,
        RECORD_FILE,
    }
)


def _unrecognised(folder: Path) -> str | None:
    """Why ``folder`` is not an export attnkit may replace, or None if it is (or is absent or
    empty)."""
    if folder.is_symlink():
        return "a symbolic link"
    if not folder.exists():
        return None
    if not folder.is_dir():
        return "a file, not a folder"
    entries = list(folder.iterdir())
    if not entries:
        return None
    foreign = sorted(
        p.name for p in entries if p.name not in EXPORT_FILES or not p.is_file() or p.is_symlink()
    )
    if foreign:
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        return f"it holds {shown}, which an attnkit export does not"
    try:
        record = mf.read_json(folder / RECORD_FILE, what="attnkit export record")
    except ValueError:
        return f"it has no readable {RECORD_FILE}, so attnkit did not write it"
    if record.get("writer") != "attnkit" or record.get("format") != EXPORT_FORMAT:
        return f"its {RECORD_FILE} does not say attnkit wrote a {EXPORT_FORMAT} export there"
    return None


def is_export_folder(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` is a non-empty export attnkit wrote."""
    folder = Path(folder)
    return folder.is_dir() and any(folder.iterdir()) and _unrecognised(folder) is None


def check_export_target(out: Path, *, source: Path | None = None) -> None:
    """Raises a ValueError naming ``out`` unless an export may be written there: absent, an
    empty folder, or an earlier attnkit export (never ``source``, the model being exported)."""
    if source is not None and out.exists() and out.resolve() == source.resolve():
        raise ValueError(f"--out {os.fspath(out)!r}: the model folder itself; give a new folder")
    mf.check_outside_models(out, "--out")
    reason = _unrecognised(out)
    if reason is not None:
        raise ValueError(
            f"--out {os.fspath(out)!r}: refusing to replace it: {reason}; give a new or empty "
            "folder, or one attnkit export wrote"
        )
    parent = out.parent if str(out.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise ValueError(f"--out {os.fspath(out)!r}: {os.fspath(parent)!r} is not a folder")


@contextmanager
def atomic_export_folder(out: str | os.PathLike[str]) -> Iterator[Path]:
    """Yields an empty temporary folder beside ``out``; on a clean exit puts it in place of
    ``out`` (module docstring). On an exception the temporary folder is removed and ``out``
    is untouched.

    Raises:
        ValueError: before anything is written, if ``out`` may not be replaced
            (:func:`check_export_target`) or nothing can be created beside it; after the
            writes, if they put a file in the folder that is not in :data:`EXPORT_FILES`.
        OSError: if writing or flushing fails (e.g. a full disk); ``out`` is untouched.
    """
    out = Path(out)
    check_export_target(out)
    tmp, old = temp_beside(out, "--out")
    try:
        yield tmp
        stray = sorted(p.name for p in tmp.iterdir() if p.name not in EXPORT_FILES)
        if stray:
            raise ValueError(f"atomic_export_folder: {stray} are not export files")
        for path in tmp.iterdir():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        fsync_folder(tmp, strict=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_folder(tmp, out, old, "--out")
    _remove_stale(out)


def _remove_stale(out: Path) -> None:
    """Deletes ``NAME.tmp-<pid>`` / ``NAME.old-<pid>`` folders left by killed writers, once
    ``out`` is in place; only folders holding nothing but export files."""
    for stale in out.parent.glob(f"{mf.glob_escape(out.name)}.*-*"):
        if not (stale.is_dir() and _STALE.fullmatch(stale.name[len(out.name) :])):
            continue
        if all(p.name in EXPORT_FILES and p.is_file() for p in stale.iterdir()):
            shutil.rmtree(stale, ignore_errors=True)
