"""Checkpoint averaging: the element-wise mean of the weights of a run's last checkpoints.

A short schedule ends at a high learning rate, where the weights still move around the
minimum from step to step; their mean over the last few evaluations sits closer to it
(Vaswani et al. 2017 average the last 5 checkpoints for their base models; fairseq's
``average_checkpoints.py``). A run keeps those checkpoints when ``optim.keep_checkpoints``
is set: ``runs/NAME/steps/step_NNNNNNN/``.

    attnkit average runs/NAME --last 5        # -> runs/NAME/averaged/

The output replaces only what averaging can prove it wrote: a folder that does not exist, an
empty one, or an earlier average (an attnkit checkpoint whose ``state.json`` lists the
averaged checkpoints). Never the run, its ``last``/``best``, its ``steps/``, nor a folder of
other files.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from pathlib import Path

import torch

from attnkit import model_folder as mf
from attnkit.files import check_folder_target
from attnkit.training import checkpoint as ckpt
from attnkit.training.config import TrainConfig
from attnkit.training.limits import RESUME_FREE_MODEL_KEYS
from attnkit.training.lm_config import LM_RESUME_FREE_MODEL_KEYS
from attnkit.training.run_folder import check_run_folder, run_of_checkpoint

STEPS_DIR = "steps"
AVERAGED_KEY = "averaged"  # state.json key listing the averaged checkpoints
_STEP_NAME = re.compile(r"step_\d+")


def step_checkpoints(run: str | os.PathLike[str]) -> list[Path]:
    """The complete ``steps/step_*`` checkpoints of a run, oldest first.

    A step whose folder was being replaced when the run was killed counts through its
    recovered ``step_N.old-<pid>`` folder (:func:`~attnkit.training.checkpoint.find_checkpoint`);
    ``.tmp-`` folders never count.
    """
    folder = Path(run) / STEPS_DIR
    if not folder.is_dir():
        return []
    names = {p.name.split(".", 1)[0] for p in folder.iterdir() if p.is_dir()}
    found = [ckpt.find_checkpoint(folder / n) for n in sorted(names) if _STEP_NAME.fullmatch(n)]
    return [p for p in found if p is not None]


def _inside(path: Path, other: Path) -> bool:
    """Whether ``path`` is ``other`` or inside it (both resolved)."""
    return path == other or other in path.parents


def check_output(
    out: str | os.PathLike[str],
    folders: Sequence[str | os.PathLike[str]] = (),
    run: str | os.PathLike[str] | None = None,
) -> None:
    """Raises a ValueError naming ``out`` unless averaging may write it (module docstring).

    Args:
        out: The output folder.
        folders: The checkpoints being averaged.
        run: The run they come from, if any.
    """
    target = Path(out).resolve()
    if run is not None:
        run_dir = Path(run).resolve()
        if _inside(run_dir, target):
            raise ValueError(f"--out {os.fspath(out)!r}: is (or holds) the run {os.fspath(run)!r}")
        own = target.parent == run_dir and target.name.split(".", 1)[0] in ("last", "best")
        if own or _inside(target, run_dir / STEPS_DIR) and target != run_dir / STEPS_DIR:
            raise ValueError(
                f"--out {os.fspath(out)!r}: one of the run's own checkpoints (last, best, "
                f"{STEPS_DIR}/); averaging never writes there (default: RUN/averaged)"
            )
    check_folder_target(out, "--out")  # '.', '..', a path under a file
    mf.check_outside_models(out, "--out")  # another run's checkpoints, a shipped model
    for folder in folders:
        source = Path(folder).resolve()
        if _inside(target, source) or _inside(source, target):
            raise ValueError(
                f"--out {os.fspath(out)!r}: is, holds or lies inside {os.fspath(folder)!r}, a "
                "checkpoint being averaged; choose another folder"
            )
    mf.check_replaceable(out, what="--out")
    if Path(out).is_dir() and any(Path(out).iterdir()):
        try:
            state = ckpt.read_state(out)
        except ValueError:
            state = {}
        if AVERAGED_KEY not in state:
            raise ValueError(
                f"--out {os.fspath(out)!r}: refusing to replace it: an attnkit model folder, but "
                f"not an earlier `attnkit average` output (its {mf.STATE_FILE} has no "
                f"{AVERAGED_KEY!r} list); give a new folder"
            )


def _shape_differences(a: TrainConfig, b: TrainConfig) -> list[str]:
    """What differs between two checkpoints' configs among what makes their weights: the task
    and every model key but the dropouts (a run resumed with another dropout keeps averaging
    its checkpoints from before and after), as lines ``"model.d_model: 32 and 64"``."""
    if a.task != b.task:
        return [f"task: {a.task!r} and {b.task!r}"]
    free = LM_RESUME_FREE_MODEL_KEYS if a.task == "lm" else RESUME_FREE_MODEL_KEYS
    mine, theirs = dataclasses.asdict(a.model), dataclasses.asdict(b.model)
    return [
        f"model.{key}: {value!r} and {theirs[key]!r}"
        for key, value in mine.items()
        if key not in free and value != theirs[key]
    ]


def average_checkpoints(
    folders: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    run: str | os.PathLike[str] | None = None,
) -> Path:
    """Writes a checkpoint whose weights are the mean of ``folders``' weights.

    The config, tokenizer and state come from the last folder (``state.json`` also lists the
    averaged folders). Written atomically like every checkpoint.

    Args:
        folders: The checkpoints to average.
        out: The output folder (:func:`check_output` says which may be replaced).
        run: The run the checkpoints come from, so that ``out`` never lands on it.

    Raises:
        ValueError: If ``folders`` is empty, the checkpoints do not share one model config,
            one holds NaN or inf, or ``out`` may not be written; checked before anything is
            written.
        OSError: If writing fails (e.g. a full disk), naming ``out``; an earlier ``out`` is
            left as it was and no temporary folder remains.
    """
    if not folders:
        raise ValueError("average_checkpoints: no checkpoints to average")
    folders = [Path(f) for f in folders]
    check_output(out, folders, run)
    model, tokenizer, config = ckpt.load_model(folders[-1])
    total = {name: t.double() for name, t in model.state_dict().items()}
    for folder in folders[:-1]:
        other, _, other_config = ckpt.load_model(folder)
        differ = _shape_differences(other_config, config)
        if differ:
            raise ValueError(
                f"{os.fspath(folder)!r} and {os.fspath(folders[-1])!r} are not checkpoints of one "
                f"model: {'; '.join(differ)}"
            )
        for name, t in other.state_dict().items():
            total[name] += t.double()
    with torch.no_grad():
        for name, t in model.state_dict().items():
            t.copy_(total[name] / len(folders))
    state = ckpt.read_state(folders[-1])
    state[AVERAGED_KEY] = [os.fspath(f) for f in folders]
    try:
        return ckpt.save_checkpoint(
            out, model=model, config=config, tokenizer=tokenizer, state=state, what="--out"
        )
    except OSError as err:  # e.g. a full disk: name the output, which stays as it was
        if err.filename is None and err.errno is not None:
            raise OSError(err.errno, err.strerror, os.fspath(out)) from err
        raise


def average_run(
    run: str | os.PathLike[str], *, last: int, out: str | os.PathLike[str] | None = None
) -> tuple[Path, list[Path]]:
    """Averages the newest ``last`` kept checkpoints of ``run`` into ``out`` (default
    ``RUN/averaged``).

    Returns:
        ``(out, the averaged checkpoints)``.

    Raises:
        ValueError: If ``last`` is not positive, ``run`` is no folder, the run kept fewer
            checkpoints, or ``out`` may not be written.
    """
    run = Path(run)
    if isinstance(last, bool) or not isinstance(last, int) or last < 1:
        raise ValueError(f"--last: expected a positive number, got {last!r}")
    check_run_folder(run, "run")
    found = step_checkpoints(run)
    if not found and (run / mf.STATE_FILE).is_file():  # RUN/last, RUN/best, a kept step
        raise ValueError(
            f"{os.fspath(run)}: a checkpoint folder, not a run folder; average the run's kept "
            f"checkpoints with `attnkit average {os.fspath(run_of_checkpoint(run))}`"
        )
    if not found:
        raise ValueError(
            f"{os.fspath(run)}: no kept checkpoints in {os.fspath(run / STEPS_DIR)} "
            "(train with --set optim.keep_checkpoints=N)"
        )
    if len(found) < last:
        raise ValueError(
            f"--last {last}: {os.fspath(run)} kept only {len(found)} checkpoints; give "
            f"--last {len(found)} or fewer (`attnkit average` takes 5 without --last)"
        )
    chosen = found[-last:]
    out = run / "averaged" if out is None else Path(out)
    return average_checkpoints(chosen, out, run=run), chosen
