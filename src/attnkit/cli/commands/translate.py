"""`attnkit translate`: translate sentences, one a line, from standard input or a file."""

from __future__ import annotations

import argparse
import sys

from attnkit.cli.options import (
    check_input_path,
    check_output_path,
    integer,
    note_terminal_input,
    option_error,
    real,
    resolve_device,
    threads,
    write_text,
)

# Translator's kinds of worker (attnkit.decoding.translate.PARALLEL, the CLI's default first;
# not imported, as SEARCH_DESTS below).
PARALLEL = ("processes", "threads")
MAX_LENPEN = 10.0  # attnkit.decoding.config.MAX_LENPEN (not imported either)
# Lines per Translator call when there are more: one step of the progress bar. Calls of 2,000
# lines kept the speed of one call (8,000 Multi30k train lines: 467 and 423 sentences/s
# against 459 and 437, two passes); 1,000 was a few percent slower.
PART_LINES = 2000

NAME = "translate"
HELP = "translate sentences (one a line) with a translation model"
DESCRIPTION = """\
Translate one sentence a line from standard input (or --input FILE, - for standard input) to
standard output (or --output FILE), in the same order: N lines in, N lines out. Without
--model, the model shipped in attnkit/pretrained/multi30k_de_en (German -> English,
Multi30k) is used.

Input is UTF-8 (a line that is not is an error naming the line and byte offset; a gzip file
is decompressed). Each line is normalised before translation: a byte-order mark is dropped,
control characters (NUL included) become spaces, runs of white space (spaces, tabs,
no-break and other Unicode spaces) become one space, and both ends are stripped. A line
that is then empty gives an empty line, without running the model.

Lines are sorted by length and batched under --batch-tokens, and a batch is split further
when its decoder caches would not fit in half the free memory. In float32 neither changes the
output. In bfloat16 (what --dtype auto picks on AVX-512 and AMX CPUs) a sentence can round
differently in another batch and come out otherwise: 15 of test2016's first 300 lines changed
with --batch-tokens 100 on an AMX Xeon. --dtype float32 gives outputs that never depend on the
lines beside them.
The search settings (--beam, --lenpen, --lenpen-style, --max-len-a, --max-len-b, --min-len)
default to the model's: those in the "decoding" object of its config.json (the shipped
model's length penalty 1.4 was chosen on the validation set), else beam 5, length penalty 1.0.
--beam goes up to 1024 and is also refused, with the memory it would need, when one
sentence's search cannot fit in memory. A line longer than the model allows is cut to fit;
a warning on standard error counts such lines. --output is written whole or not at all (a
full disk leaves the old file as it was). More than 2,000 lines are translated 2,000 at a
time, with a progress bar on standard error when it is a terminal (--no-progress: none).

examples:
  echo "Ein Hund rennt über eine Wiese." | attnkit translate
  attnkit translate --model runs/multi30k/best --input test.de --beam 5 --output test.hyp.en
"""


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """Model and search options shared with `attnkit evaluate`."""
    parser.add_argument(
        "--model",
        metavar="DIR",
        default=None,
        help="model folder (config.json, model.safetensors, tokenizer.json); "
        "default: the shipped multi30k_de_en model",
    )
    parser.add_argument(
        "--beam", type=integer(1), default=None, metavar="K",
        help="beam size, 1 to 1024 (and what memory allows); 1 = greedy (default: the model's, "
        "else 5)",
    )  # fmt: skip
    parser.add_argument(
        "--batch-tokens",
        type=integer(1),
        default=4000,
        metavar="N",
        help="padded source tokens per batch, >= 1 (default 4000)",
    )
    parser.add_argument(
        "--max-len-a",
        type=real(0),
        default=None,
        metavar="A",
        help="output limit = A * source tokens + B, capped by the model's length; "
        "A finite, >= 0 (default: the model's, else 1.2)",
    )
    parser.add_argument(
        "--max-len-b", type=integer(0), default=None, metavar="B",
        help="see --max-len-a; >= 0 (default: the model's, else 10)",
    )  # fmt: skip
    parser.add_argument(
        "--min-len", type=integer(0), default=None, metavar="N",
        help="shortest output in tokens, >= 0 (default: the model's, else 1)",
    )  # fmt: skip
    parser.add_argument(
        "--lenpen", type=real(-MAX_LENPEN, MAX_LENPEN), default=None, metavar="ALPHA",
        help=f"length penalty exponent, from {-MAX_LENPEN:g} to {MAX_LENPEN:g}; higher favours "
        "longer outputs (default: the model's, 1.4 for the shipped one, else 1.0)",
    )  # fmt: skip
    parser.add_argument(
        "--lenpen-style",
        choices=("fairseq", "gnmt"),
        default=None,
        help="fairseq: len**a; gnmt: ((5 + len) / 6)**a (default: the model's, else fairseq)",
    )
    parser.add_argument(
        "--no-cache",
        dest="use_cache",
        action="store_false",
        help="recompute the prefix at every step instead of using the KV cache (slow)",
    )
    parser.add_argument(
        "--device",
        default=None,
        help="cpu, cuda, cuda:N or mps, if this machine has it (default: cuda if available)",
    )
    parser.add_argument(
        "--threads", type=threads, default=None, metavar="N",
        help="CPU threads for torch, 1 to the CPUs available (default: torch's)",
    )  # fmt: skip
    parser.add_argument(
        "--workers", type=integer(1, 256), default=None, metavar="N",
        help="on a CPU, batches decoded at once, each by its own worker (see --parallel) "
        "(default: one per thread, which translates test2016 about 1.4x faster than one batch "
        "across 2 threads); 1 = one batch at a time",
    )  # fmt: skip
    parser.add_argument(
        "--parallel", choices=PARALLEL, default="processes",
        help="what the --workers are: processes (default; forked once, one operator thread "
        "each, sharing the model's memory; about 1.17x the sentences/s of threads on test2016; "
        "Linux, elsewhere threads) or threads of this process (threads/N operator threads "
        "each). The translations are the same in float32 (in bfloat16 a sentence can round "
        "differently in another batch: see above)",
    )  # fmt: skip
    parser.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16", "int8"),
        default="auto",
        help="compute dtype; weights are cast on load. auto (default): bfloat16 where this "
        "device computes it natively (CUDA, AVX-512 or AMX CPUs: 2x the sentences/s of float32 "
        "for the shipped model on an AMX Xeon, test2016 BLEU 43.01 against 43.04), float32 "
        "elsewhere; "
        "float32 forces full precision; int8 (CPU): the linear layers in int8 (float32 weights "
        "quantized at the first call, as CTranslate2's int8): 1.2-1.3x the speed of float32, "
        "test2016 BLEU 42.88-43.35 against 43.04 (bfloat16 is faster where native)",
    )


# DecodingConfig's SEARCH_FIELDS -> the argparse dest of the flag that sets each (the flag is
# --dest with dashes; not imported from attnkit.decoding: the CLI imports torch only when a
# command runs, and a test checks the two agree).
SEARCH_DESTS = {
    "beam_size": "beam",
    "max_len_a": "max_len_a",
    "max_len_b": "max_len_b",
    "min_len": "min_len",
    "lenpen": "lenpen",
    "lenpen_style": "lenpen_style",
}
SEARCH_FLAGS = {field: "--" + dest.replace("_", "-") for field, dest in SEARCH_DESTS.items()}
SEARCH_FLAGS["n_best"] = "--beam"  # n_best <= beam_size: the beam is the flag to change


def decoding_config(args: argparse.Namespace, defaults):
    """The :class:`DecodingConfig` of ``args``: the flags given over ``defaults`` (the model's
    :func:`~attnkit.decoding.model_decoding`). Its errors name the flag, not the field."""
    from dataclasses import replace

    given = {field: getattr(args, dest) for field, dest in SEARCH_DESTS.items()}
    given = {field: value for field, value in given.items() if value is not None}
    try:
        return replace(defaults, **given, use_cache=args.use_cache)
    except ValueError as err:
        raise option_error(err, SEARCH_FLAGS) from None


def compute_dtype(args: argparse.Namespace, device, *, auto=None):
    """The torch dtype of ``--dtype``; ``auto`` is ``auto`` if given, else the fastest dtype of
    ``device`` that keeps translations' BLEU (:func:`attnkit.hardware.fast_inference_dtype`)."""
    import torch

    if args.dtype == "int8":  # float32 weights, quantized by the Translator (int8=True)
        return torch.float32
    if args.dtype != "auto":
        from attnkit.model_folder import floating_dtype

        return floating_dtype(args.dtype, "--dtype")
    if auto is not None:
        return auto
    from attnkit.hardware import fast_inference_dtype

    return fast_inference_dtype(device)


def build_translator(args: argparse.Namespace):
    """Check ``args``, then load the model and wrap it in a Translator (heavy imports here).

    The search settings are the flags given over the model's (:func:`decoding_config`); the
    bos and eos ids come from the model's tokenizer.
    """
    import torch

    from attnkit.decoding import Translator, load_translation_model, model_decoding

    config = decoding_config(args, model_decoding(args.model))  # before the weights are read
    # int8 runs on a CPU: without --device it is the CPU even where CUDA is.
    device = resolve_device("cpu" if args.dtype == "int8" and args.device is None else args.device)
    if args.dtype == "int8" and device.type != "cpu":
        raise ValueError(f"--dtype int8: runs on a CPU (--device cpu), not on {device}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    loaded = load_translation_model(args.model, device=device, dtype=compute_dtype(args, device))
    workers = torch.get_num_threads() if args.workers is None else args.workers
    try:  # it checks the settings against the model (--min-len against its longest output)
        return Translator(
            loaded.model, loaded.tokenizer, config, batch_tokens=args.batch_tokens,
            workers=workers, parallel=args.parallel, int8=args.dtype == "int8",
        )  # fmt: skip
    except ValueError as err:
        raise option_error(err, SEARCH_FLAGS) from None


def translate_lines(translator, lines: list[str], *, progress: bool = True):
    """``translator.translate(lines)``, :data:`PART_LINES` lines a call when there are more,
    with a tqdm bar (lines) on standard error, shown only when standard error is a terminal
    and ``progress`` is on. The parts do not depend on the bar: the same input gives the same
    output with it or without.

    Returns:
        One :class:`~attnkit.decoding.TranslationOutput` for all the lines (``truncated``
        indices into ``lines``).
    """
    if len(lines) <= PART_LINES:
        return translator.translate(lines)
    from tqdm import tqdm

    from attnkit.decoding import TranslationOutput

    translations: list[str] = []
    truncated: list[int] = []
    limit = 0
    bar = tqdm(
        total=len(lines), unit="line", desc="translating", file=sys.stderr,
        disable=None if progress else True, dynamic_ncols=True,
    )  # fmt: skip
    with bar:
        for start in range(0, len(lines), PART_LINES):
            part = translator.translate(lines[start : start + PART_LINES])
            translations += part.translations
            truncated += [start + i for i in part.truncated]
            limit = part.max_src_tokens
            bar.update(len(part.translations))
    return TranslationOutput(translations, truncated, limit)


def add_progress_argument(parser: argparse.ArgumentParser, *, text: bool = False) -> None:
    """``--no-progress``; ``text``: the command also scores a ``--text`` (evaluate)."""
    also = " or a --text of 10 batches or more" if text else ""
    parser.add_argument(
        "--no-progress", action="store_true",
        help="no progress bar (shown on a terminal only, for more than 2,000 lines to "
        f"translate{also})",
    )  # fmt: skip


def warn_truncated(result, command: str) -> None:
    """One warning on standard error counting the inputs cut to the model's length."""
    if result.truncated:
        shown = ", ".join(str(i + 1) for i in result.truncated[:10])
        more = ", ..." if len(result.truncated) > 10 else ""
        print(
            f"attnkit {command}: warning: {len(result.truncated)} line(s) longer than "
            f"{result.max_src_tokens} source tokens were truncated (line {shown}{more})",
            file=sys.stderr,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-i", "--input", metavar="FILE", default="-",
        help="read this file (UTF-8, .gz allowed) instead of standard input; - = standard input",
    )  # fmt: skip
    parser.add_argument(
        "-o", "--output", metavar="FILE", default="-",
        help="write this file instead of standard output; - = standard output",
    )  # fmt: skip
    add_decoding_arguments(parser)
    add_progress_argument(parser)


def _refuse_output_in_the_model(output: str, model: str | None) -> None:
    """The model's files are inputs too: an output inside its folder (its tokenizer.json, a
    new file beside its weights) would change the model; nor may it go into another model
    folder attnkit wrote (a run's `last` or `best`: the run could no longer resume or save).
    The rule of every output file (:func:`attnkit.model_folder.check_output_file`)."""
    from attnkit.decoding.loading import resolve_model_dir
    from attnkit.model_folder import check_output_file

    check_output_file(output, "--output", model=resolve_model_dir(model))


def run(args: argparse.Namespace) -> int:
    from attnkit.metrics.io import read_lines

    check_input_path(args.input, "--input")
    if args.output != "-":
        check_output_path(args.output, "--output", inputs=[(args.input, "--input")])
        _refuse_output_in_the_model(args.output, args.model)
    note_terminal_input(args.input, NAME, "sentences")
    lines = read_lines(args.input)
    with build_translator(args) as translator:  # stops its worker processes when done
        result = translate_lines(translator, lines, progress=not args.no_progress)
    warn_truncated(result, NAME)
    # A generated newline would break the line-for-line correspondence.
    text = "".join(t.replace("\r", " ").replace("\n", " ") + "\n" for t in result.translations)
    if args.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_text(args.output, text)
    return 0
