"""`attnkit evaluate`: BLEU of a translation model on a Multi30k split or a pair of files, or
the loss of a GPT language model on a text file (``--text``)."""

from __future__ import annotations

import argparse
import json
import sys

from attnkit.cli.commands.translate import (
    SEARCH_DESTS,
    SEARCH_FLAGS,
    add_decoding_arguments,
    add_progress_argument,
    build_translator,
    compute_dtype,
    translate_lines,
    warn_truncated,
)
from attnkit.cli.options import STDIN, check_input_path

NAME = "evaluate"
HELP = "translate a test set and print BLEU and speed, or score a text with a GPT (--text)"
DESCRIPTION = """\
Translate a test set and score it with attnkit's BLEU (equal to sacreBLEU: detokenized output,
cased, 13a tokenization), printing the score, its signature and the decoding speed in
sentences per second (model loading excluded). Without --model, the shipped multi30k_de_en
model is used; without --src/--ref, Multi30k test2016 in the model's direction (German ->
English for the shipped model and for folders that do not say).

--src and --ref are UTF-8 files (.gz allowed) with one sentence a line and the same number of
lines; either (not both) may be - for standard input. Source lines are normalised as
`attnkit translate` does (byte-order mark dropped, control characters and runs of white space
become one space, ends stripped; an empty line gives an empty translation); references are
scored as they are. An empty file is an error. More than 2,000 source lines are translated
2,000 at a time, with a progress bar on standard error when it is a terminal (--no-progress:
none).

--json prints one object: {"bleu": ..., "signature": ..., "sentences_per_sec": ...,
"sentences": ..., "seconds": ..., "test_set": ..., "model": ..., "beam": ..., "lenpen": ...,
"dtype": ...} (dtype: what the linear layers computed in: float32, bfloat16 or int8)

Language models: [--model GPT_DIR] --text FILE scores FILE (UTF-8, .gz allowed, - = standard
input; an empty file is an error) with a GPT folder (an attnkit language model or a Hugging
Face GPT-2 folder with its tokenizer.json; without --model, the shipped Shakespeare GPT):
the text is read as lines each ended by a newline, tokenized, and every token is predicted
after the model's bos token (an attnkit language model's is the newline), in consecutive
windows of the model's context length (8 a batch; a progress bar on a terminal from 10
batches on, --no-progress: none). It prints the
cross-entropy per token and per character (total nats / characters) and bits per character;
--json prints {"loss_per_token": ..., "nats_per_char": ..., "bits_per_char": ...,
"tokens": ..., "characters": ..., "model": ..., "text": ...}.

examples:
  attnkit evaluate
  attnkit evaluate --model runs/multi30k/best --split val --beam 1
  attnkit evaluate --model runs/en-de --src test.en --ref test.de --json
  attnkit evaluate --text macbeth.txt --json
  attnkit evaluate --model runs/shakespeare_char/best --text macbeth.txt --json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--split",
        default=None,
        help="Multi30k split: test2016 (default), val or train; not with --src/--ref",
    )
    parser.add_argument(
        "--src-lang",
        default=None,
        help="Multi30k source language (default: the one the model was trained on, from the "
        "training settings in its folder; de when the folder does not say)",
    )
    parser.add_argument(
        "--tgt-lang",
        default=None,
        help="Multi30k reference language (default: the model's; en when the folder does not "
        "say). A direction other than the model's is refused: use --src/--ref for that",
    )
    parser.add_argument(
        "--src", metavar="FILE", default=None, help="source sentences, one a line (- = stdin)"
    )
    parser.add_argument(
        "--ref", metavar="FILE", default=None, help="references, one a line (- = stdin)"
    )
    parser.add_argument(
        "--text",
        metavar="FILE",
        default=None,
        help="language models: score this text file with the GPT of --model (- = stdin)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_decoding_arguments(parser)
    add_progress_argument(parser, text=True)


def _test_set(args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    from attnkit.data import load_named_corpus, load_parallel

    if (args.src is None) != (args.ref is None):
        raise ValueError("--src and --ref go together: give both files, or neither")
    if args.src is not None:
        if args.split is not None:
            raise ValueError(f"--split {args.split} and --src/--ref exclude each other")
        if args.src == args.ref == STDIN:
            raise ValueError("--src and --ref: only one of them can be - (standard input)")
        check_input_path(args.src, "--src")
        check_input_path(args.ref, "--ref")
        corpus = load_parallel(args.src, args.ref, names=("--src", "--ref"))
        return corpus.src, corpus.tgt, f"{args.src} -> {args.ref}"
    split = args.split or "test2016"
    src_lang, tgt_lang = _languages(args)
    corpus = load_named_corpus("multi30k", split=split, src_lang=src_lang, tgt_lang=tgt_lang)
    return corpus.src, corpus.tgt, f"multi30k {split} {src_lang}-{tgt_lang}"


def _languages(args: argparse.Namespace) -> tuple[str, str]:
    """The Multi30k direction to score: the model's own (its folder's training settings), or
    de-en for a folder that does not say; --src-lang / --tgt-lang may only repeat the model's.
    (Before, de-en was scored whatever the model translated: an en-de model got BLEU 0.1.)"""
    from attnkit.decoding.loading import model_languages

    trained = model_languages(args.model)
    src = args.src_lang or (trained[0] if trained else "de")
    tgt = args.tgt_lang or (trained[1] if trained else "en")
    if trained is not None and (src, tgt) != trained:
        model = args.model or "the shipped model"
        raise ValueError(
            f"--src-lang {src} --tgt-lang {tgt}: {model} was trained to translate "
            f"{trained[0]} -> {trained[1]} (the training settings in its folder); leave both "
            f"options out to score that direction, or give --src FILE --ref FILE"
        )
    return src, tgt


def _evaluate_text(args: argparse.Namespace) -> int:
    """``--text``: the loss of the GPT of ``--model`` on a text file."""
    import torch

    from attnkit.cli.options import resolve_device
    from attnkit.data.corpus import read_text
    from attnkit.pretrained_loading import load_pretrained
    from attnkit.training.lm import text_loss

    if args.dtype == "int8":
        raise ValueError("--dtype int8: for translation models; --text scores in float32 or bf16")
    search = [(SEARCH_FLAGS[field], getattr(args, dest)) for field, dest in SEARCH_DESTS.items()]
    for flag, value in (("--src", args.src), ("--ref", args.ref), ("--split", args.split), *search):
        if value is not None:
            raise ValueError(
                f"--text and {flag} exclude each other: --text scores a language model"
            )
    if args.model is None:
        from attnkit.pretrained import default_gpt_dir, shipped_gpt_dir

        args.model = default_gpt_dir()
        if args.model is None:
            raise ValueError(
                f"--text: give --model DIR, the GPT folder to score the text with (the shipped "
                f"GPT is not installed at {shipped_gpt_dir()})"
            )
    check_input_path(args.text, "--text")
    text = read_text(args.text)
    if not text:
        raise ValueError(f"--text: {args.text!r} is empty, expected text to score")
    device = resolve_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    loaded = load_pretrained(
        # Scores are reported to 4 decimals and compared across runs: auto = float32 here.
        args.model,
        device=device,
        dtype=compute_dtype(args, device, auto=torch.float32),
    )
    kind, model, tokenizer, _ = loaded
    if not loaded.is_gpt:
        raise ValueError(
            f"--model {args.model!r}: a {kind} model folder; --text scores a GPT language model "
            "(a GPT-2, Llama, Mistral or Qwen2 folder)"
        )
    if tokenizer is None:
        raise ValueError(f"--model {args.model!r}: no tokenizer.json; --text needs the tokenizer")
    loss = text_loss(model, tokenizer, text, progress=not args.no_progress)
    report = {
        "loss_per_token": loss.loss_per_token,
        "nats_per_char": loss.nats_per_char,
        "bits_per_char": loss.bits_per_char,
        "tokens": loss.tokens,
        "characters": loss.characters,
        "model": str(args.model),
        "text": str(args.text),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{args.text}: {loss.loss_per_token:.4f} nats/token, {loss.nats_per_char:.4f} "
            f"nats/char, {loss.bits_per_char:.4f} bits/char ({loss.tokens} tokens, "
            f"{loss.characters} characters)"
        )
    return 0


def _dtype_name(model) -> str:
    """``float32``, ``bfloat16``, ...: the dtype of the model's weights."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def run(args: argparse.Namespace) -> int:
    import time

    if args.text is not None:
        return _evaluate_text(args)

    import torch

    from attnkit.metrics import corpus_bleu

    src, refs, name = _test_set(args)
    with build_translator(args) as translator:  # stops its worker processes when done
        if translator.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = translate_lines(translator, src, progress=not args.no_progress)
        if translator.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    warn_truncated(result, NAME)
    bleu = corpus_bleu(result.translations, [refs], tokenize="13a")
    speed = len(src) / seconds if seconds > 0 else float("inf")
    if args.json:
        report = {
            "bleu": bleu.score,
            "signature": bleu.signature,
            "sentences_per_sec": speed,
            "sentences": len(src),
            "seconds": seconds,
            "test_set": name,
            "model": str(args.model) if args.model else "multi30k_de_en (shipped)",
            "beam": translator.config.beam_size,
            "lenpen": translator.config.lenpen,
            "dtype": "int8" if translator.int8 else _dtype_name(translator.model),
        }
        print(json.dumps(report))
    else:
        print(f"BLEU = {bleu.score:.2f} {bleu.verbose_score}")
        print(bleu.signature)
        print(
            f"{name}: {len(src)} sentences in {seconds:.2f} s = {speed:.1f} sentences/s "
            f"(beam {translator.config.beam_size}, length penalty {translator.config.lenpen:g}, "
            f"{translator.device.type})",
            file=sys.stdout,
        )
    return 0
