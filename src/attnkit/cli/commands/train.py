"""`attnkit train`: train a translation Transformer or a GPT language model from a TOML
config."""

from __future__ import annotations

import argparse

NAME = "train"
HELP = "train a translation Transformer or a GPT language model from a TOML config"
DESCRIPTION = """\
Train a model as a TOML config describes. The config names its task at the top and has three
sections; see attnkit.training.config for every key and its default.

  task = "translation" (the default): an encoder-decoder Transformer. [model] holds
      attnkit.models.TransformerConfig fields (the vocabulary sizes come from the tokenizer),
      [data] the corpus, languages, BPE vocabulary and batching.
  task = "lm": a GPT language model. [model] holds attnkit.models.GPTConfig fields (the
      vocabulary and bos come from the tokenizer), [data] the text (corpus = "shakespeare",
      shipped, or corpus = "" with train_file/val_file), the tokenizer ("char" or "bpe"
      with vocab_size), batch_size, context_length and seed.
  [optim]: Adam, schedule (the paper's inverse square root, or "cosine" with peak_lr and
      min_lr), cooldown, label smoothing, budgets, evaluation, checkpoints, autocast, threads.

The run folder OUT receives:
  metrics.jsonl   one JSON object per logging step (step, epoch, train_loss, lr,
                  tokens_per_sec, elapsed_sec) and per evaluation (val_loss, val_ppl; for a
                  language model also val_nats_per_char and val_bits_per_char)
  train.log       the log (a language model writes a generated sample at each evaluation;
                  a Ctrl-C logs the step a --resume continues from)
  tokenizer.json  the tokenizer, trained (or built) before the first step
  config.toml     the resolved config
  last/, best/    checkpoints: model.safetensors, config.json, tokenizer.json, state.json
                  (+ resume.pt in last/), written atomically; a language model's are GPT-2
                  folders that `attnkit generate --model` and Hugging Face read
  steps/          the weights of the last optim.keep_checkpoints saves (step_NNNNNNN/), for
                  `attnkit average` (0 keeps none)
  .attnkit.lock   held while a process writes the run: a second train or --resume into the
                  same folder is refused; a killed run's lock is released by the system

OUT must be new or empty: a folder holding anything else (another run, or files attnkit did
not write) is refused and left untouched. Config errors and missing data files are found
before OUT is made; a new run that fails later but before its first step (e.g. on data that
does not read) takes back the folders and files it made (a folder you had stays).
--resume may change budgets, evaluation and other [optim] keys and the dropouts, but not the
[model] keys or the [data] keys that made the saved weights and tokenizer.

Several processes: torchrun --nproc-per-node 2 -m attnkit train ... (DistributedDataParallel,
gloo on CPU, nccl on CUDA; max_tokens is per process, so the global batch grows with them).

Memory allocator: on Linux, `attnkit train` (and `python -m attnkit train`, torchrun's workers
included) runs on mimalloc, from the cmeel-mimalloc package: the Multi30k config made 1.44-1.58x
the steps of glibc's malloc in 57 minutes (1.25x in 2 minutes), at a lower peak memory. train.log names the allocator.
ATTNKIT_ALLOCATOR=system keeps the C library's; anything already in LD_PRELOAD is kept.

examples:
  attnkit train --config configs/multi30k_de_en.toml --out runs/de_en
  attnkit train --config configs/multi30k_de_en.toml --out runs/en_de \\
      --set data.src_lang=en --set data.tgt_lang=de --set model.dropout=0.3
  attnkit train --resume runs/de_en --max-minutes 90
  attnkit train --config configs/shakespeare_char_gpt.toml --out runs/shakespeare_char
  python -m attnkit.training.plot runs/de_en/metrics.jsonl docs/val_loss.png
"""


def budget(key: str, convert: type[int] | type[float]):
    """An argparse ``type`` for a budget flag: ``convert(text)`` within the bounds the config
    gives ``key`` (:func:`attnkit.training.limits.check_range`), so ``--max-steps -5`` ends in
    argparse's usage line before anything is loaded. The bounds are imported when the flag is
    parsed, not when the parser is built (they live beside torch-importing modules)."""
    what = "an integer" if convert is int else "a number"

    def parse(text: str) -> int | float:
        from attnkit.training.limits import check_range

        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        try:
            check_range(key, value)
        except ValueError as err:  # "optim.max_steps: expected ..., got -5": the flag names it
            raise argparse.ArgumentTypeError(str(err).partition(": ")[2]) from None
        return value

    parse.__name__ = f"budget {key}"
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML config file (required unless --resume)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        metavar="SECTION.KEY=VALUE",
        action="append",
        default=[],
        help="override one config value, parsed as TOML (e.g. model.dropout=0.3, "
        "optim.betas=[0.9,0.98], data.corpus=copy); repeatable",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="run folder for metrics, log and checkpoints (required unless --resume); "
        "must be new or empty, or hold a run that stopped before its first checkpoint (it "
        "starts over there); anything else is refused and left as it is",
    )
    parser.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run in DIR from its `last` checkpoint with its saved config: "
        "same data order, optimizer, schedule and random state",
    )
    parser.add_argument(
        "--max-steps",
        type=budget("optim.max_steps", int),
        metavar="N",
        help="stop after N optimizer steps in total, resumed steps included; 0 = no step "
        "limit (overrides optim.max_steps)",
    )
    parser.add_argument(
        "--max-minutes",
        type=budget("optim.max_minutes", float),
        metavar="M",
        help="stop after M minutes of wall time, resumed time included: a step is started "
        "only if it should end within M; 0 = no time limit (overrides optim.max_minutes)",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (shown on a terminal only; the log still records)",
    )


def _config(args: argparse.Namespace):
    import os
    from pathlib import Path

    from attnkit.training.checkpoint import find_checkpoint, read_train_config
    from attnkit.training.config import TrainConfig
    from attnkit.training.run_folder import RunFolder, check_run_folder

    if args.resume:
        if args.config:
            raise ValueError(
                "--config: not allowed with --resume, which uses the run's saved config; "
                "change budgets with --max-steps/--max-minutes or --set"
            )
        if args.out and Path(args.out).resolve() != Path(args.resume).resolve():
            raise ValueError(f"--out {args.out!r}: with --resume the run folder is {args.resume!r}")
        check_run_folder(args.resume, "--resume")
        folder = find_checkpoint(Path(args.resume) / "last")
        if folder is None:
            raise ValueError(RunFolder(args.resume).no_last_message())
        config = read_train_config(folder).with_overrides(
            args.overrides, source=f"the run's saved config {os.fspath(folder / 'config.json')!r}"
        )
        out = args.resume
    else:
        if not args.config:
            raise ValueError("--config: required (or --resume DIR to continue a run)")
        if not args.out:
            raise ValueError("--out: required, the folder to write the run into")
        config = TrainConfig.from_toml(args.config, args.overrides)
        out = args.out
    budgets = [
        f"{key}={value!r}"
        for key, value in (
            ("optim.max_steps", args.max_steps),
            ("optim.max_minutes", args.max_minutes),
        )
        if value is not None  # checked by argparse (budget)
    ]
    return config.with_overrides(budgets, source="command line"), out


def run(args: argparse.Namespace) -> int:
    import logging

    from attnkit.training.distributed import close_distributed
    from attnkit.training.trainer import Trainer

    config, out = _config(args)
    trainer = Trainer(config, out, resume=bool(args.resume), progress=not args.no_progress)
    finished = False
    try:
        result = trainer.fit()  # a Ctrl-C is logged there, with the step --resume continues from
        finished = True
    finally:
        # Every rank finished: they meet at a barrier first. After a failure a peer may be
        # waiting in a collective of its own, so this rank leaves without waiting for it.
        close_distributed(wait_for_peers=finished)
    logging.getLogger(__name__).info(
        "done: step %d, stopped by %s; checkpoints in %s", result.step, result.stop_reason, out
    )
    return 0
