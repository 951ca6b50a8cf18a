"""Copy a trained run's checkpoint into the package as a shipped model.

    .venv/bin/python scripts/ship_model.py --run runs/NAME --out DIR [--checkpoint best]
    .venv/bin/python scripts/ship_model.py --run runs/shakespeare_bpe --average 5 --replace-shipped
    .venv/bin/python scripts/ship_model.py --run runs/de_en_r9 --checkpoint avg7 --lenpen 1.4 \\
        --replace-shipped

The run's task (its checkpoint's training config) decides what is shipped and where:

* translation: model.safetensors in bfloat16, config.json and tokenizer.json, by default
  into src/attnkit/pretrained/multi30k_de_en; --lenpen ALPHA stores the length penalty
  chosen on the validation set as the folder's decoding default (config.json "decoding",
  what `attnkit translate` and `evaluate` use unless told otherwise);
* language model (task = "lm"): the checkpoint's GPT-2 folder (config.json, model.safetensors,
  tokenizer.json), by default into src/attnkit/pretrained/shakespeare_gpt. Weights stay
  float32 unless the folder would pass the package's 25 MB cap, then bfloat16 (--dtype
  forces either). With --average N the mean of the run's last N kept checkpoints (as
  `attnkit average` computes it) competes with --checkpoint: the one with the lower
  val_nats_per_char on the run's validation text (the text its metrics.jsonl reports, scored
  as `attnkit evaluate --text` scores it, in float32) is shipped; a tie keeps --checkpoint.

Both carry the run's record: its config.toml, metrics.jsonl, train.log and the checkpoint's
state.json (as checkpoint_state.json: its step and, for an average, the checkpoints
averaged). A language model also gets provenance.json: the validation metrics of the shipped
files, every candidate's val_nats_per_char, a summary of the training metrics, the training
config and the commands. The folder is written atomically.

What --out may be (checked before anything is loaded or written; a refusal names the folder
and why, and leaves everything as it was):

* never the run folder, a folder inside it (its best/, last/, steps/, an average) or one
  holding it; never another run's folder or checkpoint (a folder with state.json or
  resume.pt), nor a folder inside a model folder: shipping into them would cost a run its
  checkpoints (`attnkit train --resume` needs last/) or its float32 best;
* an existing folder is replaced only if it is a model folder attnkit wrote (anything else,
  e.g. a folder of your files, is refused; nothing is deleted);
* a shipped model of the package (src/attnkit/pretrained/*, where the default --out points)
  takes only a run of its task, corpus and languages (its config.toml says which: e.g.
  translation of multi30k de -> en), and an existing one is replaced only with
  --replace-shipped, because `attnkit translate`, `evaluate`, `generate` and `serve` use it:

    .venv/bin/python scripts/ship_model.py --run runs/de_en_r17 --checkpoint avg10 \\
        --lenpen 1.4 --replace-shipped
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import attnkit
from attnkit import model_folder as mf
from attnkit.cli.options import real
from attnkit.decoding import DecodingConfig, load_translation_model, save_translation_model
from attnkit.models import GPT
from attnkit.training import run_folder
from attnkit.training.averaging import average_run
from attnkit.training.checkpoint import find_checkpoint, read_state, read_train_config
from attnkit.training.config import TrainConfig
from attnkit.training.lm import TextLoss, load_lm_text, text_loss
from attnkit.training.metrics_log import read_metrics

ROOT = Path(__file__).resolve().parents[1]
PRETRAINED = ROOT / "src/attnkit/pretrained"
DEFAULT_OUTS = {"translation": PRETRAINED / "multi30k_de_en", "lm": PRETRAINED / "shakespeare_gpt"}
# What the package's shipped models are, by task, when a shipped folder's own record (its
# config.toml) cannot be read: the run it came from must match it (_check_shipped).
SHIPPED_DATA = {
    "translation": {"data.corpus": "multi30k", "data.src_lang": "de", "data.tgt_lang": "en"},
    "lm": {"data.corpus": "shakespeare"},
}
# The run's record, copied from the run folder: what a run writes at its top level
# (run_folder.RUN_FILES: config.toml, metrics.jsonl, train.log), less the tokenizer, which
# the model folder has anyway, and the lock file.
RUN_FILES = tuple(sorted(run_folder.RUN_FILES - {mf.TOKENIZER_FILE, run_folder.LOCK_FILE}))
PROVENANCE_FILE = "provenance.json"  # a shipped language model: how it was chosen and scored
LM_FILES = (mf.CONFIG_FILE, mf.WEIGHTS_FILE, mf.TOKENIZER_FILE)
MAX_BYTES = 25 * 10**6  # the package's cap on a shipped model folder ("at most 25 MB")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SELECTION_METRIC = "val_nats_per_char"


def ship(
    run: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    checkpoint: str = "best",
    *,
    average: int = 0,
    dtype: str = "auto",
    lenpen: float | None = None,
    replace_shipped: bool = False,
    command: str | None = None,
    train_command: str | None = None,
) -> Path:
    """Ships ``run/checkpoint`` (module docstring) into ``out`` (default: by the run's task).

    Args:
        run: A run folder written by ``attnkit train``.
        out: The shipped folder; None = the package's folder for the run's task.
        checkpoint: The checkpoint folder inside the run (best, last, averaged, ...).
        average: Language models: also average the last ``average`` kept checkpoints and ship
            whichever scores the lower val_nats_per_char (0 = no average).
        dtype: "auto", "float32" or "bfloat16" (auto: bfloat16 for a translation model;
            float32 for a language model unless it would not fit in :data:`MAX_BYTES`).
        lenpen: Translation: the length penalty to store as the folder's decoding default
            (None: none stored, decoding uses 1.0).
        replace_shipped: Allow replacing an existing shipped model of the package (the
            default ``out``); without it that is refused (:func:`check_out`).
        command, train_command: Recorded in a language model's provenance.json.

    Returns:
        ``out``.

    Raises:
        ValueError: Naming the argument, if the run, checkpoint, --out (:func:`check_out`),
            --average or --dtype cannot be used; nothing is written then.
    """
    run = Path(run)
    if dtype != "auto" and dtype not in DTYPES:
        raise ValueError(f"--dtype: expected auto or one of {sorted(DTYPES)}, got {dtype!r}")
    if isinstance(average, bool) or not isinstance(average, int) or average < 0:
        raise ValueError(f"--average: expected a number of checkpoints (0 = none), got {average!r}")
    folder = find_checkpoint(run / checkpoint)
    if folder is None:
        raise ValueError(f"{run / checkpoint}: no checkpoint there (no {mf.STATE_FILE})")
    missing = [name for name in RUN_FILES if not (run / name).is_file()]
    if missing:
        raise ValueError(f"{run}: not a run folder written by `attnkit train` (no {missing})")
    config = read_train_config(folder)
    default = out is None
    out = DEFAULT_OUTS[config.task] if default else Path(out)
    check_out(out, run, config, replace_shipped=replace_shipped, default=default)
    if config.task == "lm":
        if lenpen is not None:
            raise ValueError(f"--lenpen {lenpen}: a translation setting; {run} is a language model")
        return _ship_lm(
            run, folder, checkpoint, out, config, average=average, dtype=dtype,
            commands={"ship": command, "train": train_command},
        )  # fmt: skip
    if average:
        raise ValueError(
            f"--average {average}: chooses among a language model's checkpoints by "
            f"{SELECTION_METRIC}; {run} is a {config.task} run (average it with `attnkit "
            "average` and ship --checkpoint averaged)"
        )
    decoding = None if lenpen is None else DecodingConfig(lenpen=lenpen)  # checks it
    mf.check_replaceable(out, what="--out")  # before the model is loaded
    model, tokenizer, _ = load_translation_model(folder)
    return save_translation_model(
        out,
        model,
        tokenizer,
        dtype=torch.float32 if dtype == "float32" else torch.bfloat16,
        extra_files=_record_files(run, folder),
        decoding=decoding,
    )


def check_out(
    out: Path,
    run: Path,
    config: TrainConfig,
    *,
    replace_shipped: bool = False,
    default: bool = False,
) -> None:
    """Raises a ValueError naming ``out`` and why, unless the run may be shipped there (module
    docstring, "What --out may be").

    Args:
        out: The folder to write.
        run: The run folder being shipped.
        config: The training config of the checkpoint being shipped.
        replace_shipped: --replace-shipped was given.
        default: ``out`` is the default for the run's task (no --out given).
    """
    shown = f"--out {os.fspath(out)!r}"
    if default:
        shown += f" (the default for a {config.task} run)"
    verb = "replace" if out.exists() or out.is_symlink() else "write"
    target, run_dir = out.resolve(), run.resolve()
    reason = None
    if target == run_dir or run_dir in target.parents:
        reason = (
            f"it is the run {os.fspath(run)!r} or a folder inside it; shipping never writes "
            "into the run (its last/ resumes it, its best/ stays float32)"
        )
    elif target in run_dir.parents:
        reason = f"it holds the run {os.fspath(run)!r}"
    elif out.is_dir() and mf.is_run_folder(out):
        reason = (
            f"it is a training run folder (it holds {run_folder.LOCK_FILE} or a best/ or "
            "last/ checkpoint)"
        )
    elif find_checkpoint(out) is not None:
        reason = (
            f"it is a training checkpoint (it holds {mf.STATE_FILE}); replacing it would cost "
            "its run the checkpoint (`attnkit train --resume` reads last/)"
        )
    if reason is not None:
        raise ValueError(f"{shown}: refusing to {verb} it: {reason}; give another folder")
    mf.check_outside_models(out, "--out")  # inside another run's checkpoint or steps/
    _check_shipped(out, shown, run, config, replace_shipped=replace_shipped)


def _identity(config: TrainConfig) -> dict[str, str]:
    """What a run learned: its task, corpus and (translation) languages."""
    found = {"task": config.task, "data.corpus": config.data.corpus}
    if config.task == "translation":
        found |= {"data.src_lang": config.data.src_lang, "data.tgt_lang": config.data.tgt_lang}
    return found


def _describe(identity: dict[str, str]) -> str:
    return ", ".join(f"{key} {value!r}" for key, value in identity.items())


def _check_shipped(
    out: Path, shown: str, run: Path, config: TrainConfig, *, replace_shipped: bool
) -> None:
    """Refuses a shipped model folder of the package (one of :data:`DEFAULT_OUTS`, or a folder
    in :data:`PRETRAINED`) for a run of another task, corpus or languages, and an existing one
    without ``replace_shipped``."""
    target = out.resolve()
    slot = next((t for t, p in DEFAULT_OUTS.items() if p.resolve() == target), None)
    if slot is None and target.parent != PRETRAINED.resolve():  # not a shipped model
        if replace_shipped:
            raise ValueError(
                f"--replace-shipped: {shown} is not one of the package's shipped models "
                f"({os.fspath(PRETRAINED)}/*), so there is nothing it could allow; drop the flag"
            )
        return
    record = out / run_folder.RUN_CONFIG_FILE
    expected, source = None, f"its {run_folder.RUN_CONFIG_FILE}"
    if record.is_file():
        try:
            expected = _identity(TrainConfig.from_toml(record))
        except (OSError, ValueError) as err:
            if slot is None:
                raise ValueError(
                    f"{shown}: refusing to replace it: a shipped model whose "
                    f"{os.fspath(record)!r} cannot be read ({err}), so the run cannot be "
                    "checked against it"
                ) from None
    if expected is None and slot is not None:
        expected, source = {"task": slot, **SHIPPED_DATA[slot]}, "the package's shipped model"
    if expected is None:
        if out.exists():
            raise ValueError(
                f"{shown}: refusing to replace it: a folder among the package's shipped models "
                f"without a readable {run_folder.RUN_CONFIG_FILE}, so the run cannot be checked "
                "against it; ship to another folder"
            )
        return  # a new shipped model
    actual = _identity(config)
    differs = [  # the keys both have (a language model has no languages)
        f"{key} {actual[key]!r} (shipped: {expected[key]!r})"
        for key in expected
        if key in actual and actual[key] != expected[key]
    ]
    if differs:
        raise ValueError(
            f"{shown}: refusing to ship {os.fspath(run)!r} there: the package's shipped model "
            f"is {_describe(expected)} ({source}), the run has {', '.join(differs)}; ship it "
            "to another folder with --out DIR"
        )
    if out.exists() and not replace_shipped:
        raise ValueError(
            f"{shown}: refusing to replace the package's shipped model ({_describe(expected)}) "
            "without --replace-shipped: `attnkit translate`, `evaluate`, `generate` and "
            "`serve` use it; give --replace-shipped to replace it deliberately, or --out DIR "
            "to ship elsewhere"
        )


def _record_files(run: Path, folder: Path) -> dict[str, Path]:
    """Shipped name -> file of the run's record (module docstring)."""
    extra = {name: run / name for name in RUN_FILES}
    extra[mf.CHECKPOINT_STATE_FILE] = folder / mf.STATE_FILE  # renamed
    return extra


def _score(folder: Path, text: str) -> TextLoss:
    """The loss of ``text`` under the GPT in ``folder``, as `attnkit evaluate --text` gives
    it (float32 on the CPU)."""
    model = GPT.from_pretrained(folder)
    return text_loss(model, model.tokenizer, text)


def _val_text(config: TrainConfig, run: Path) -> tuple[str, str]:
    """The run's validation text and a description of it (what metrics.jsonl reports on)."""
    data = config.data
    text = load_lm_text(data).val
    if text is None:
        raise ValueError(
            f"{run}: the run has no validation text (data.val_file is empty); a language "
            f"model is chosen by {SELECTION_METRIC} on it"
        )
    name = f"{data.corpus} val" if data.corpus else data.val_file
    if data.max_val_chars:
        name += f", first {data.max_val_chars} characters"
    return text, name


def _weights_dtype(dtype: str, folder: Path, run: Path) -> torch.dtype:
    """``dtype``, or for "auto" float32 when the folder fits in :data:`MAX_BYTES` so."""
    if dtype != "auto":
        return DTYPES[dtype]
    weights = mf.read_weights(folder / mf.WEIGHTS_FILE)
    float32_bytes = sum(t.numel() * 4 for t in weights.values())
    record = [folder / mf.CONFIG_FILE, folder / mf.TOKENIZER_FILE] + list(
        _record_files(run, folder).values()
    )
    other = sum(p.stat().st_size for p in record)
    return torch.float32 if float32_bytes + other + 2**16 <= MAX_BYTES else torch.bfloat16


def _training_summary(run: Path) -> dict:
    """Steps, time, speed and every evaluation of the run's metrics.jsonl."""
    records = read_metrics(run / run_folder.METRICS_FILE)
    steps = [r for r in records if "train_loss" in r]
    evals = [r for r in records if SELECTION_METRIC in r]
    speeds = [r["tokens_per_sec"] for r in steps if r.get("tokens_per_sec")]
    return {
        "last_step": max((r["step"] for r in records), default=0),
        "minutes": round(max((r.get("elapsed_sec", 0) for r in records), default=0) / 60, 2),
        "tokens_per_sec_median": statistics.median(speeds) if speeds else None,
        "evaluations": [
            {key: r[key] for key in ("step", "val_loss", SELECTION_METRIC) if key in r}
            for r in evals
        ],
    }


def _git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
        )
    except OSError:
        return None
    return done.stdout.strip() or None


def _ship_lm(
    run: Path,
    folder: Path,
    checkpoint: str,
    out: Path,
    config: TrainConfig,
    *,
    average: int,
    dtype: str,
    commands: dict[str, str | None],
) -> Path:
    """A language model: choose by :data:`SELECTION_METRIC`, copy, score, record."""
    extra = {PROVENANCE_FILE}
    mf.check_replaceable(out, what="--out", extra_files=extra)  # before anything is loaded
    text, text_name = _val_text(config, run)
    with tempfile.TemporaryDirectory(prefix="ship_model-") as tmp:
        candidates = [(checkpoint, folder)]
        if average:
            averaged, _ = average_run(run, last=average, out=Path(tmp) / "averaged")
            candidates.append((f"average of the last {average} kept checkpoints", averaged))
        scored = [(name, path, _score(path, text)) for name, path in candidates]
        name, chosen, _ = min(scored, key=lambda c: c[2].nats_per_char)  # first on a tie
        weights_dtype = _weights_dtype(dtype, chosen, run)
        state = read_state(chosen)
        with mf.atomic_folder(out, what="--out", extra_files=extra) as dest:
            for file in (mf.CONFIG_FILE, mf.TOKENIZER_FILE):
                shutil.copyfile(chosen / file, dest / file)
            mf.write_weights(
                dest / mf.WEIGHTS_FILE,
                mf.read_weights(chosen / mf.WEIGHTS_FILE),
                dtype=weights_dtype,
            )
            for file, source in _record_files(run, chosen).items():
                shutil.copyfile(source, dest / file)
            shipped = _score(dest, text)  # the files as shipped (bfloat16 weights included)
            provenance = {
                "run": os.fspath(run.resolve()),
                "checkpoint": name,
                "step": state["step"],
                "averaged": state.get("averaged"),
                "weights_dtype": str(weights_dtype).removeprefix("torch."),
                "parameters": GPT.from_pretrained(dest).num_parameters(),
                "val": {
                    "text": text_name,
                    "characters": shipped.characters,
                    "tokens": shipped.tokens,
                    "loss_per_token": shipped.loss_per_token,
                    "nats_per_char": shipped.nats_per_char,
                    "bits_per_char": shipped.bits_per_char,
                },
                "selection": {
                    "metric": SELECTION_METRIC,
                    "candidates": [
                        {
                            "checkpoint": n,
                            "step": read_state(p)["step"],
                            SELECTION_METRIC: loss.nats_per_char,
                        }
                        for n, p, loss in scored
                    ],
                },
                "training": _training_summary(run),
                "config": config.to_dict(),
                "commands": {
                    **commands,
                    "reproduce": f"attnkit train --config config.toml --out runs/{run.name} "
                    "(config.toml: the run's resolved config, every override applied)",
                },
                "versions": {
                    "attnkit": attnkit.__version__,
                    "commit": _git_commit(),
                    "torch": torch.__version__,
                },
            }
            mf.write_json(dest / PROVENANCE_FILE, provenance)
            size = sum(p.stat().st_size for p in dest.iterdir())
            if size > MAX_BYTES:
                raise ValueError(
                    f"--out {os.fspath(out)!r}: {size:,} bytes, more than the package's "
                    f"{MAX_BYTES:,}; ship bfloat16 weights (--dtype bfloat16) or a smaller model"
                )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "run_arg", metavar="RUN", type=Path, nargs="?", default=None,
        help="a run folder written by `attnkit train` (or --run)",
    )  # fmt: skip
    parser.add_argument("--run", type=Path, default=None, help="the run folder (or RUN)")
    parser.add_argument(
        "--out", type=Path, default=None,
        help="destination folder (default: the package's folder for the run's task: "
        "pretrained/multi30k_de_en or pretrained/shakespeare_gpt; replacing the model there "
        "takes --replace-shipped); never the run, a run's checkpoint or a folder of other files",
    )  # fmt: skip
    parser.add_argument(
        "--checkpoint", default="best",
        help="checkpoint folder inside the run: best (default), last, or one written by "
        "`attnkit average` (e.g. averaged)",
    )  # fmt: skip
    parser.add_argument(
        "--average", type=int, default=0, metavar="N",
        help=f"language models: also average the last N kept checkpoints and ship the one "
        f"with the lower {SELECTION_METRIC} on the validation text",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", choices=("auto", *DTYPES), default="auto",
        help="weights dtype (auto: bfloat16 for translation; float32 for a language model "
        "unless it would pass 25 MB)",
    )  # fmt: skip
    parser.add_argument(
        "--lenpen", type=real(), default=None, metavar="ALPHA",
        help="translation: the length penalty chosen on the validation set, stored as the "
        "model's decoding default (default: none stored, decoding uses 1.0)",
    )  # fmt: skip
    parser.add_argument(
        "--replace-shipped", action="store_true",
        help="replace the package's existing shipped model (src/attnkit/pretrained/"
        "multi30k_de_en or shakespeare_gpt, the default --out) with this run; refused without "
        "it, and refused anyway for a run of another task, corpus or languages",
    )  # fmt: skip
    parser.add_argument(
        "--train-command", default=None, metavar="TEXT",
        help="the command that trained the run, recorded in provenance.json",
    )  # fmt: skip
    args = parser.parse_args()
    if (args.run is None) == (args.run_arg is None):
        parser.error("give the run folder once: RUN or --run RUN")
    run = args.run or args.run_arg
    command = shlex.join(["python", "scripts/ship_model.py", *sys.argv[1:]])
    try:
        out = ship(
            run, args.out, args.checkpoint, average=args.average, dtype=args.dtype,
            lenpen=args.lenpen, replace_shipped=args.replace_shipped, command=command,
            train_command=args.train_command,
        )  # fmt: skip
    except ValueError as err:
        print(f"ship_model: error: {err}", file=sys.stderr)
        return 2
    size = (out / mf.WEIGHTS_FILE).stat().st_size / 2**20
    print(f"shipped {run / args.checkpoint} -> {out} ({size:.1f} MiB of weights)")
    if (out / PROVENANCE_FILE).is_file():
        record = json.loads((out / PROVENANCE_FILE).read_text(encoding="utf-8"))
        for candidate in record["selection"]["candidates"]:
            print(f"  {candidate['checkpoint']} (step {candidate['step']}): "
                  f"{candidate[SELECTION_METRIC]:.4f} {SELECTION_METRIC}")  # fmt: skip
        val = record["val"]
        print(
            f"shipped {record['checkpoint']} ({record['weights_dtype']}): "
            f"{val['nats_per_char']:.4f} nats/char, {val['bits_per_char']:.4f} bits/char on "
            f"{val['text']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
