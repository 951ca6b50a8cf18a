"""`attnkit average`: average the weights of a run's last checkpoints."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "average"
HELP = "average the weights of a run's last N kept checkpoints into a new checkpoint"
DESCRIPTION = """\
Average the weights of the newest N checkpoints a run kept in RUN/steps/ (train with
--set optim.keep_checkpoints=N) and write them as a checkpoint folder (default RUN/averaged)
that `attnkit translate/evaluate --model` accept. The config and tokenizer are the newest
checkpoint's.

examples:
  attnkit average runs/de_en --last 5
  attnkit evaluate --model runs/de_en/averaged --split val
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, help="a run folder written by `attnkit train`")
    parser.add_argument("--last", type=int, default=5, help="how many newest checkpoints (5)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (RUN/averaged)")


def run(args: argparse.Namespace) -> int:
    from attnkit.training.averaging import average_checkpoints, step_checkpoints

    if args.last < 1:
        raise ValueError(f"--last: expected a positive number, got {args.last}")
    found = step_checkpoints(args.run)
    if not found:
        raise ValueError(
            f"{args.run}: no kept checkpoints in {args.run / 'steps'} "
            "(train with --set optim.keep_checkpoints=N)"
        )
    if len(found) < args.last:
        raise ValueError(f"--last {args.last}: {args.run} kept only {len(found)} checkpoints")
    chosen = found[-args.last :]
    out = average_checkpoints(chosen, args.out or args.run / "averaged")
    names = ", ".join(p.name for p in chosen)
    print(f"averaged {len(chosen)} checkpoints ({names}) -> {out}")
    return 0
