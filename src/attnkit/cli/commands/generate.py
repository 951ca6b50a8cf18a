"""`attnkit generate`: continue prompts with a GPT model (greedy or sampled, streamed or not)."""

from __future__ import annotations

import argparse
import json
import math
import sys

from attnkit.cli.options import (
    MAX_BATCH_SIZE,
    STDIN,
    batch_size,
    check_text_argument,
    integer,
    note_terminal_input,
    real,
    resolve_device,
    threads,
)

NAME = "generate"
HELP = "continue text with a GPT model (Hugging Face GPT-2 folder)"
DESCRIPTION = """\
Continue PROMPT, or every line of standard input (one prompt a line) when PROMPT is absent,
with a GPT model read from a Hugging Face GPT-2 folder (config.json, model.safetensors,
tokenizer.json) on disk: nothing is downloaded, so --model is a folder, not a hub name
(path/to/gpt2 below stands for a folder saved by transformers' save_pretrained). Without
--model, the GPT shipped in attnkit/pretrained/shakespeare_gpt (a byte-level BPE GPT trained
on the works of Shakespeare) is used; if it is not installed, --model is required.

Decoding: greedy by default (--temperature 0). --temperature T > 0 samples from
softmax(logits / T); --top-k and --top-p restrict the sampling (they imply --temperature 1
when no temperature is given); --seed makes sampling reproducible for the same prompts in
the same batch (another --batch-size or other prompts beside it draw differently).
--repetition-penalty discourages ids already seen (prompt included). Generation ends at the
model's end-of-text id, at any --stop string (the text is cut before it) or after --max-new-tokens.

Output: each prompt followed by its continuation, then a newline. --stream writes the text
as it is generated (whole UTF-8 characters only; prompts one after the other). --json writes
one JSON object a line per prompt: prompt, text, token ids, the model's log-probability of
each id (natural log, before temperature or filtering) and why it stopped.

examples:
  attnkit generate "ROMEO." --temperature 0.8 --seed 0 --max-new-tokens 100
  attnkit generate --model path/to/gpt2 "The meaning of life is" --max-new-tokens 40
  attnkit generate --model path/to/gpt2 "Once upon a time" --temperature 0.8 --top-p 0.95 --seed 0 --stream
  printf 'Hello\\nThe cat\\n' | attnkit generate --model path/to/gpt2 --json --max-new-tokens 10
"""

NO_MODEL = (
    "no --model given and the shipped GPT is not installed (looked in {folder}); "
    "pass --model DIR (a Hugging Face GPT-2 folder)"
)


def _above_zero(high: float | None, what: str):
    """An argparse ``type``: a finite number in ``(0, high]``; one message for every value
    refused (before, -0.5 was told "from 0.0 to 1.0" and 0 then refused)."""
    parse_real = real(None, high, what=what)
    bound = f"a finite {what.removeprefix('a ')} > 0" + (f" and <= {high}" if high else "")

    def parse(text: str) -> float:
        try:
            value = parse_real(text)
        except argparse.ArgumentTypeError:
            value = math.nan
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected {bound}, got {text!r}")
        return value

    parse.__name__ = "real"
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "prompt", metavar="PROMPT", nargs="?", default=None,
        help="text to continue (default: every line of standard input)",
    )  # fmt: skip
    parser.add_argument(
        "--model", metavar="DIR", default=None,
        help="Hugging Face GPT-2 folder (config.json, model.safetensors, tokenizer.json); "
        "default: the shipped Shakespeare GPT",
    )  # fmt: skip
    parser.add_argument(
        "--max-new-tokens", type=integer(1), default=64, metavar="N",
        help="tokens to generate at most per prompt (default 64; the model reads the prompt and "
        "every new token but the last: prompt + N - 1 <= context length)",
    )  # fmt: skip
    parser.add_argument(
        "--temperature", type=real(0.0), default=None, metavar="T",
        help="0 = greedy (the default); > 0 = sample (1 when --top-k/--top-p is given)",
    )  # fmt: skip
    parser.add_argument(
        "--top-k", type=integer(0), default=0, metavar="K",
        help="sample from the K most probable ids (default 0 = off)",
    )  # fmt: skip
    parser.add_argument(
        "--top-p", type=_above_zero(1.0, "a probability"), default=1.0, metavar="P",
        help="sample from the smallest set with probability >= P, 0 < P <= 1 (default 1 = off)",
    )  # fmt: skip
    parser.add_argument(
        "--repetition-penalty", type=_above_zero(None, "a penalty"), default=1.0, metavar="R",
        help="> 1 discourages ids already seen, prompt included (default 1 = off)",
    )  # fmt: skip
    parser.add_argument(
        "--stop", action="append", default=[], metavar="TEXT",
        help="stop when this text appears (repeatable); the output is cut before it",
    )  # fmt: skip
    parser.add_argument(
        "--seed", type=integer(0, 2**64 - 1), default=None,
        help="seed for sampling, 0 to 2**64 - 1 (reproducible for the same prompts in the same "
        "batch)",
    )  # fmt: skip
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--stream", action="store_true", help="write text as it is generated")
    output.add_argument(
        "--json", action="store_true", help="one JSON object a line: text, token ids, log-probs"
    )
    parser.add_argument(
        "--batch-size", type=batch_size, default=8, metavar="B",
        help=f"prompts generated together, 1 to {MAX_BATCH_SIZE} (default 8; changes the "
        "speed, not greedy output in float32; in bfloat16 the products round differently in "
        "another batch, and a token may change)",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32",
        help="compute dtype (default float32; weights are cast on load)",
    )  # fmt: skip
    parser.add_argument(
        "--device", default=None, help="cpu, cuda, ... (default: cuda if available)"
    )
    parser.add_argument(
        "--threads", type=threads, default=None,
        help="CPU threads for torch (default: torch's, the usable cores)",
    )  # fmt: skip
    parser.add_argument(
        "--compile", action="store_true",
        help="run the decoding steps through torch.compile: 1.19-1.35x faster steps on an "
        "Intel Xeon with AMX (docs/benchmarks.md; not measured on other CPUs) after a first "
        "call that compiles for 16-80 s (a C++ compiler is needed on a CPU); for long outputs",
    )  # fmt: skip


def build_config(args: argparse.Namespace, context_length: int):
    """The GenerationConfig of ``args`` (ranges are checked by argparse); errors name the flag."""
    from attnkit.generation import GenerationConfig
    from attnkit.generation.generate import positions_read

    if positions_read(1, args.max_new_tokens) > context_length:  # a prompt has a token
        raise ValueError(
            f"--max-new-tokens: expected at most {context_length} (the model's context length: "
            "it reads the prompt and every new token but the last), got "
            f"{args.max_new_tokens}"
        )
    sampling_filters = bool(args.top_k) or args.top_p < 1
    temperature = args.temperature
    if temperature is None:
        temperature = 1.0 if sampling_filters else 0.0
    if temperature == 0 and sampling_filters:
        raise ValueError(
            "--top-k/--top-p: they shape sampling, but --temperature 0 means greedy; "
            "give a temperature > 0 or leave it out"
        )
    for i, stop in enumerate(args.stop):
        if not stop:
            raise ValueError("--stop: expected non-empty text, got ''")
        check_text_argument(stop, f"--stop #{i + 1}")
    return GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        stop_strings=tuple(args.stop),
        seed=args.seed,
        logprobs=args.json,  # only --json writes them
        compile=args.compile,
    )


def model_dir(args: argparse.Namespace) -> str:
    """``--model``, or the shipped GPT's folder when it is omitted.

    Raises:
        ValueError: If ``--model`` is omitted and the shipped GPT is not installed.
    """
    if args.model is not None:
        return args.model
    from attnkit import pretrained

    folder = pretrained.default_gpt_dir()
    if folder is None:
        raise ValueError(NO_MODEL.format(folder=pretrained.shipped_gpt_dir()))
    return str(folder)


def load(args: argparse.Namespace):
    """The GPT of ``--model``, or the shipped one (heavy imports here)."""
    import torch

    from attnkit.models import GPT

    folder = model_dir(args)
    device = resolve_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = GPT.from_pretrained(folder, device=device, dtype=args.dtype)
    if model.tokenizer is None:
        raise ValueError(f"{folder}: no tokenizer.json; generate needs the model's tokenizer")
    return model


def _prompts(args: argparse.Namespace) -> list[str]:
    if args.prompt is not None:
        return [check_text_argument(args.prompt, "PROMPT")]
    from attnkit.metrics.io import read_lines

    note_terminal_input(STDIN, NAME, "prompts")
    return read_lines(STDIN)


def _check_prompt_lengths(model, args: argparse.Namespace, prompts: list[str]) -> None:
    """Refuse a prompt longer than the context before anything is generated, naming it as the
    user gave it (PROMPT, or its line of standard input)."""
    from attnkit.generation.generate import check_prompt_length
    from attnkit.generation.text import encode_prompts
    from attnkit.metrics.io import display_name

    context = model.config.context_length
    for i, ids in enumerate(encode_prompts(model, model.tokenizer, prompts)):
        name = "PROMPT" if args.prompt is not None else f"{display_name(STDIN)}: line {i + 1}"
        check_prompt_length(len(ids), context, name=name)


def run(args: argparse.Namespace) -> int:
    from attnkit.generation import generate_text, stream_text

    model = load(args)
    config = build_config(args, model.config.context_length)
    prompts = _prompts(args)
    _check_prompt_lengths(model, args, prompts)
    out = sys.stdout
    if args.stream:
        for prompt in prompts:
            out.write(prompt)
            out.flush()
            for piece in stream_text(model, None, prompt, config):
                out.write(piece)
                out.flush()
            out.write("\n")
            out.flush()
        return 0
    for start in range(0, len(prompts), args.batch_size):
        batch = prompts[start : start + args.batch_size]
        for prompt, result in zip(batch, generate_text(model, None, batch, config), strict=True):
            if args.json:
                record = {
                    "prompt": prompt,
                    "text": result.text,
                    "token_ids": result.tokens,
                    "logprobs": [round(lp, 6) for lp in result.logprobs],
                    "finish_reason": result.finish_reason,
                }
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
            else:
                out.write(prompt + result.text + "\n")
        out.flush()
    return 0
