"""Checkpoint averaging: the element-wise mean of the weights of a run's last checkpoints.

A short schedule ends at a high learning rate, where the weights still move around the
minimum from step to step; their mean over the last few evaluations sits closer to it
(Vaswani et al. 2017 average the last 5 checkpoints for their base models; fairseq's
``average_checkpoints.py``). A run keeps those checkpoints when ``optim.keep_checkpoints``
is set: ``runs/NAME/steps/step_NNNNNNN/``.

    attnkit average runs/NAME --last 5        # -> runs/NAME/averaged/
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from attnkit.training import checkpoint as ckpt

STEPS_DIR = "steps"


def step_checkpoints(run: str | os.PathLike[str]) -> list[Path]:
    """The complete ``steps/step_*`` checkpoints of a run, oldest first."""
    folder = Path(run) / STEPS_DIR
    found = [ckpt.find_checkpoint(p) for p in sorted(folder.glob("step_*")) if p.is_dir()]
    return [p for p in found if p is not None and ".tmp-" not in p.name and ".old-" not in p.name]


def average_checkpoints(
    folders: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]
) -> Path:
    """Writes a checkpoint whose weights are the mean of ``folders``' weights.

    The config, tokenizer and state come from the last folder (``state.json`` also lists the
    averaged folders). Written atomically like every checkpoint.

    Raises:
        ValueError: If ``folders`` is empty or the checkpoints do not share one model config.
    """
    if not folders:
        raise ValueError("average_checkpoints: no checkpoints to average")
    folders = [Path(f) for f in folders]
    model, tokenizer, config = ckpt.load_model(folders[-1])
    total = {name: t.double() for name, t in model.state_dict().items()}
    for folder in folders[:-1]:
        other, _, other_config = ckpt.load_model(folder)
        if other_config.model != config.model:
            raise ValueError(
                f"{os.fspath(folder)!r}: model config differs from {os.fspath(folders[-1])!r}"
            )
        for name, t in other.state_dict().items():
            total[name] += t.double()
    with torch.no_grad():
        for name, t in model.state_dict().items():
            t.copy_(total[name] / len(folders))
    state = ckpt.read_state(folders[-1])
    state["averaged"] = [os.fspath(f) for f in folders]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return ckpt.save_checkpoint(out, model=model, config=config, tokenizer=tokenizer, state=state)
