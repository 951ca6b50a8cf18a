"""`attnkit average`: average the weights of a run's last checkpoints."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnkit.cli.options import integer

NAME = "average"
HELP = "average the weights of a run's last N kept checkpoints into a new checkpoint"
DESCRIPTION = """\
Average the weights of the newest N checkpoints a run kept in RUN/steps/ (train with
--set optim.keep_checkpoints=N) and write them as a checkpoint folder (default RUN/averaged)
that `attnkit translate/evaluate --model` accept. The config and tokenizer are the newest
checkpoint's.

--out is replaced only if it is an earlier `attnkit average` output (or empty); the run
itself, its last/best/steps checkpoints and folders holding other files are refused.

examples:
  attnkit average runs/de_en --last 5
  attnkit evaluate --model runs/de_en/averaged --split val
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, help="a run folder written by `attnkit train`")
    parser.add_argument(
        "--last", type=integer(1), default=5, metavar="N",
        help="how many newest checkpoints, >= 1 (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (RUN/averaged); an existing one must be an earlier average",
    )


def run(args: argparse.Namespace) -> int:
    from attnkit.training.averaging import average_run

    out, chosen = average_run(args.run, last=args.last, out=args.out)
    names = ", ".join(p.name for p in chosen)
    print(f"averaged {len(chosen)} checkpoints ({names}) -> {out}")
    return 0
