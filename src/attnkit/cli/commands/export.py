"""`attnkit export`: write a translation model in another inference engine's format."""

from __future__ import annotations

import argparse

NAME = "export"
HELP = "export a translation model for another inference engine (CTranslate2)"
DESCRIPTION = """\
Write a translation model folder (--model; default: the shipped multi30k_de_en model) as a
CTranslate2 model folder (--out), built with CTranslate2's own TransformerSpec: model.bin,
config.json and the vocabulary, plus the model's tokenizer.json (tokenize with it, translate
the token strings with CTranslate2, detokenize with it) and attnkit_export.json (what was
exported, and the translate_batch options that reproduce attnkit's beam search with the
model's search settings, those of `attnkit translate`). A model option the spec cannot
express is refused, naming the option.

--quantization sets the type of the weights on disk: float32 (default; with the options in
attnkit_export.json, CTranslate2 then gives attnkit's float32 translations token for token),
int16 or int8 (smaller and faster; CTranslate2 can also quantize a float32 export when it
loads it, compute_type="int8").

--out must be new, empty, or an earlier `attnkit export`; it is written whole or not at all.
Needs ctranslate2: pip install 'attnkit[export]'.

examples:
  attnkit export --format ctranslate2 --out multi30k_ct2
  attnkit export --format ctranslate2 --model runs/de_en/best --out de_en_ct2 --quantization int8
"""

FORMATS = ("ctranslate2",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from attnkit.export.ctranslate2 import QUANTIZATIONS

    parser.add_argument(
        "--format", required=True, choices=FORMATS, help="the engine to export to (ctranslate2)"
    )
    parser.add_argument(
        "--model",
        metavar="DIR",
        default=None,
        help="translation model folder (config.json, model.safetensors, tokenizer.json); "
        "default: the shipped multi30k_de_en model",
    )
    parser.add_argument(
        "--out", metavar="DIR", required=True,
        help="folder to write: new, empty, or an earlier attnkit export",
    )  # fmt: skip
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default="float32",
        help="weight type on disk (default float32)",
    )


def run(args: argparse.Namespace) -> int:
    from attnkit.export import export_ctranslate2

    try:
        out = export_ctranslate2(args.model, args.out, quantization=args.quantization)
    except ImportError as err:  # the message names the extra to install
        raise ValueError(str(err)) from None
    print(f"exported {args.model or 'the shipped multi30k_de_en model'} -> {out} "
          f"(CTranslate2, {args.quantization} weights)")  # fmt: skip
    return 0
