"""Copy a trained run's best checkpoint into the package as the shipped model (bf16 weights).

    .venv/bin/python scripts/ship_model.py runs/NAME [--out src/attnkit/pretrained/multi30k_de_en]

Writes model.safetensors (bfloat16), config.json and tokenizer.json, plus the run's
config.toml, metrics.jsonl and train.log and the checkpoint's state.json (as
checkpoint_state.json: its step and, for an average, the checkpoints averaged), so the shipped
model carries its own record. The folder is written atomically; an existing --out is replaced
only if it is a model folder attnkit wrote (anything else is refused, nothing is deleted).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from attnkit import model_folder as mf
from attnkit.decoding import load_translation_model, save_translation_model
from attnkit.training import run_folder
from attnkit.training.checkpoint import find_checkpoint

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src/attnkit/pretrained/multi30k_de_en"
# The run's record, copied from the run folder: what a run writes at its top level
# (run_folder.RUN_FILES: config.toml, metrics.jsonl, train.log), less the tokenizer, which
# save_translation_model writes, and the lock file.
RUN_FILES = tuple(sorted(run_folder.RUN_FILES - {mf.TOKENIZER_FILE, run_folder.LOCK_FILE}))
CHECKPOINT_STATE_FILE = "checkpoint_state.json"  # the checkpoint's state.json, renamed


def ship(run: Path, out: Path, checkpoint: str = "best") -> Path:
    """Writes ``run/checkpoint`` (bf16) and the run's record into ``out``; returns ``out``."""
    folder = find_checkpoint(run / checkpoint)
    if folder is None:
        raise ValueError(f"{run / checkpoint}: no checkpoint there (no {mf.STATE_FILE})")
    missing = [name for name in RUN_FILES if not (run / name).is_file()]
    if missing:
        raise ValueError(f"{run}: not a run folder written by `attnkit train` (no {missing})")
    mf.check_replaceable(out, what="--out")  # before the model is loaded
    model, tokenizer, _ = load_translation_model(folder)
    extra = {name: run / name for name in RUN_FILES}
    # step, metrics and (for an average) the averaged checkpoints
    extra[CHECKPOINT_STATE_FILE] = folder / mf.STATE_FILE
    return save_translation_model(out, model, tokenizer, dtype=torch.bfloat16, extra_files=extra)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="a run folder written by `attnkit train`")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="destination folder")
    parser.add_argument(
        "--checkpoint",
        default="best",
        help="checkpoint folder inside the run: best (default), last, or one written by "
        "`attnkit average` (e.g. averaged)",
    )
    args = parser.parse_args()
    try:
        out = ship(args.run, args.out, args.checkpoint)
    except ValueError as err:
        print(f"ship_model: error: {err}", file=sys.stderr)
        return 2
    size = (out / mf.WEIGHTS_FILE).stat().st_size / 2**20
    print(f"shipped {args.run / args.checkpoint} -> {out} ({size:.1f} MiB of weights)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
