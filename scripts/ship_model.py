"""Copy a trained run's best checkpoint into the package as the shipped model (bf16 weights).

    .venv/bin/python scripts/ship_model.py runs/NAME [--out src/attnkit/pretrained/multi30k_de_en]

Writes model.safetensors (bfloat16), config.json and tokenizer.json, plus the run's
config.toml, metrics.jsonl and train.log and the checkpoint's state.json (as
checkpoint_state.json: its step and, for an average, the checkpoints averaged), so the shipped
model carries its own record.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from attnkit.decoding import load_translation_model, save_translation_model

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src/attnkit/pretrained/multi30k_de_en"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder written by `attnkit train`")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="destination folder")
    parser.add_argument(
        "--checkpoint",
        default="best",
        help="checkpoint folder inside the run: best (default), last, or one written by "
        "`attnkit average` (e.g. averaged)",
    )
    args = parser.parse_args()
    model, tokenizer, _ = load_translation_model(args.run / args.checkpoint)
    save_translation_model(args.out, model, tokenizer, dtype=torch.bfloat16)
    for name in ("config.toml", "metrics.jsonl", "train.log"):
        shutil.copyfile(args.run / name, args.out / name)
    # step, metrics and (for an average) the averaged checkpoints
    shutil.copyfile(args.run / args.checkpoint / "state.json", args.out / "checkpoint_state.json")
    size = (args.out / "model.safetensors").stat().st_size / 2**20
    print(f"shipped {args.run / args.checkpoint} -> {args.out} ({size:.1f} MiB of weights)")


if __name__ == "__main__":
    main()
