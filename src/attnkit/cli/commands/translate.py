"""`attnkit translate`: translate sentences, one a line, from standard input or a file."""

from __future__ import annotations

import argparse
import sys

NAME = "translate"
HELP = "translate sentences (one a line) with a translation model"
DESCRIPTION = """\
Translate one sentence a line from standard input (or --input FILE) to standard output, in
the same order. An empty line gives an empty line. Without --model, the model shipped in
attnkit/pretrained/multi30k_de_en (German -> English, Multi30k) is used.

Lines are sorted by length and batched under --batch-tokens (which changes the speed, never
the output). A line longer than the model allows is cut to fit; a warning on standard error
counts such lines. A line that is not UTF-8 is an error naming its line number.

examples:
  echo "Ein Hund rennt über eine Wiese." | attnkit translate
  attnkit translate --model runs/multi30k --input test.de --beam 5 > test.hyp.en
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
    parser.add_argument("--beam", type=int, default=5, help="beam size; 1 = greedy (default 5)")
    parser.add_argument(
        "--batch-tokens",
        type=int,
        default=4000,
        metavar="N",
        help="padded source tokens per batch (default 4000)",
    )
    parser.add_argument(
        "--max-len-a",
        type=float,
        default=1.2,
        help="output limit = a * source tokens + b (default a=1.2)",
    )
    parser.add_argument("--max-len-b", type=int, default=10, help="see --max-len-a (default 10)")
    parser.add_argument("--min-len", type=int, default=1, help="shortest output in tokens")
    parser.add_argument(
        "--lenpen", type=float, default=1.0, help="length penalty exponent (default 1.0)"
    )
    parser.add_argument(
        "--lenpen-style",
        choices=("fairseq", "gnmt"),
        default="fairseq",
        help="fairseq: len**a; gnmt: ((5 + len) / 6)**a (default fairseq)",
    )
    parser.add_argument(
        "--no-cache",
        dest="use_cache",
        action="store_false",
        help="recompute the prefix at every step instead of using the KV cache (slow)",
    )
    parser.add_argument(
        "--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda if available)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads for torch (default: torch's)"
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="compute dtype (default float32; weights are cast on load)",
    )


def build_translator(args: argparse.Namespace):
    """Load the model of ``args`` and wrap it in a Translator (heavy imports here)."""
    import torch

    from attnkit.decoding import DecodingConfig, Translator, load_translation_model

    if args.beam < 1:
        raise ValueError(f"--beam: expected >= 1, got {args.beam}")
    if args.batch_tokens < 1:
        raise ValueError(f"--batch-tokens: expected >= 1, got {args.batch_tokens}")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads: expected >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    loaded = load_translation_model(args.model, device=device, dtype=getattr(torch, args.dtype))
    config = DecodingConfig(
        beam_size=args.beam,
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
        min_len=args.min_len,
        lenpen=args.lenpen,
        lenpen_style=args.lenpen_style,
        use_cache=args.use_cache,
        bos_id=loaded.tokenizer.bos_id,
        eos_id=loaded.tokenizer.eos_id,
    )
    return Translator(loaded.model, loaded.tokenizer, config, batch_tokens=args.batch_tokens)


def decode_lines(data: bytes, source: str) -> list[str]:
    """Split bytes into lines ("\\n" or "\\r\\n") and decode each as UTF-8.

    Raises:
        ValueError: naming ``source`` and the 1-based line number of a non-UTF-8 line.
    """
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()  # a final newline does not start another line
    lines = []
    for number, line in enumerate(raw, start=1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(
                f"{source}: line {number} is not valid UTF-8 (byte "
                f"{line[err.start : err.start + 1]!r} at column {err.start + 1})"
            ) from None
        lines.append(text[:-1] if text.endswith("\r") else text)
    return lines


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
        "--input", metavar="FILE", default=None, help="read this file instead of standard input"
    )
    add_decoding_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.input is None:
        data, source = sys.stdin.buffer.read(), "<stdin>"
    else:
        with open(args.input, "rb") as f:
            data, source = f.read(), args.input
    lines = decode_lines(data, source)
    translator = build_translator(args)
    result = translator.translate(lines)
    warn_truncated(result, NAME)
    out = sys.stdout
    for text in result.translations:
        # A generated newline would break the line-for-line correspondence.
        out.write(text.replace("\r", " ").replace("\n", " ") + "\n")
    out.flush()
    return 0
