"""Beam-search decoding speed, two suites.

``--suite ctranslate2``: the shipped model (or ``--model DIR``) translating Multi30k test2016
through attnkit's public path against CTranslate2 fed the same weights, see
:func:`ctranslate2_suite`.

``--suite random`` (the default): attnkit with its KV cache, attnkit recomputing the prefix, and
Hugging Face transformers' ``MarianMTModel.generate``, in one run on the same sentences.

Setup of the random suite (stated in the output):

* Both models have the issue's size: d_model 256, 3 encoder + 3 decoder layers, 8 heads,
  d_ff 1024, vocabulary 8000, tied embeddings, random weights (``torch.manual_seed(0)``),
  float32, eval mode, ``torch.inference_mode()``. (attnkit's default is pre-LN with a final
  LayerNorm, Marian is post-LN: the same matrix products, one LayerNorm more per stack.)
* Sources: Multi30k test2016 German (``--limit`` for a prefix), encoded with a SubwordTokenizer
  trained on Multi30k train (vocab 8000), sorted by length and cut into the same batches for
  every side (``--batch-tokens`` padded source tokens per batch, attnkit's batching).
* Beam 5, length penalty 1.0. Random weights have no meaningful eos, so every side is forced
  to the same output length: exactly L tokens then eos, L = the mean token length of the
  test2016 English references (attnkit: ``min_len=L, max_len_a=0, max_len_b=L``; Hugging Face:
  ``min_new_tokens=L, max_new_tokens=L+1, forced_eos_token_id=eos``), i.e. L + 1 decoder steps
  per sentence everywhere. The output lengths are printed as a check.

    python benchmarks/decode.py                          # full test2016 (1000 sentences)
    python benchmarks/decode.py --limit 200 --sides cached,hf
    python benchmarks/decode.py --suite ctranslate2 --threads 2 --rounds 3

Speed = sentences / wall-clock seconds of decoding (encoder included, tokenization and model
building excluded), one thread by default (``--threads``). Sides take turns batch by batch
(the first side rotates), after a small warm-up batch, so that load from other processes slows
every side alike; CPU seconds are printed as a cross-check. The last column is how many times
faster attnkit with its KV cache is than the row's side.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import glob  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from machine import (  # noqa: E402  (benchmarks/machine.py)
    argument_parser,
    cpu_name,
    isa_caps,
    load_average,
    names_from,
    positive_int,
    thread_count,
    usable_cores,
)

from attnkit.data import SubwordTokenizer, load_named_corpus  # noqa: E402
from attnkit.decoding import (  # noqa: E402
    DecodingConfig,
    generate,
    load_translation_model,
    model_decoding,
    normalize_source,
    token_batches,
)
from attnkit.models import Transformer, TransformerConfig  # noqa: E402

PAD, BOS, EOS = 0, 1, 2
RANDOM_SIDES = ("cached", "recompute", "hf")  # --sides of the random suite
SIZE = dict(d_model=256, layers=3, heads=8, d_ff=1024, vocab=8000, max_len=256)


def machine_info() -> str:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    cpu = cpu_name()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"CPU {cpu}; usable cores {affinity}; load average {load:.1f}; torch {torch.__version__} "
        f"({torch.backends.cpu.get_cpu_capability()}), threads {torch.get_num_threads()}; "
        f"transformers {transformers.__version__}; python {platform.python_version()}"
    )


def attnkit_model() -> Transformer:
    torch.manual_seed(0)
    config = TransformerConfig(
        src_vocab_size=SIZE["vocab"], tgt_vocab_size=SIZE["vocab"], d_model=SIZE["d_model"],
        num_heads=SIZE["heads"], num_encoder_layers=SIZE["layers"],
        num_decoder_layers=SIZE["layers"], d_ff=SIZE["d_ff"], max_len=SIZE["max_len"],
        share_embeddings=True, tie_output=True,
    )  # fmt: skip
    return Transformer(config).eval()


def marian_model() -> transformers.MarianMTModel:
    torch.manual_seed(0)
    config = transformers.MarianConfig(
        vocab_size=SIZE["vocab"], decoder_vocab_size=SIZE["vocab"], d_model=SIZE["d_model"],
        encoder_layers=SIZE["layers"], decoder_layers=SIZE["layers"],
        encoder_attention_heads=SIZE["heads"], decoder_attention_heads=SIZE["heads"],
        encoder_ffn_dim=SIZE["d_ff"], decoder_ffn_dim=SIZE["d_ff"],
        max_position_embeddings=SIZE["max_len"], activation_function="relu",
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, decoder_start_token_id=BOS,
        forced_eos_token_id=EOS, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, scale_embedding=True,
    )  # fmt: skip
    return transformers.MarianMTModel(config).eval()


def make_batches(sources: list[list[int]], batch_tokens: int) -> list[tuple[torch.Tensor, ...]]:
    """(src ids, attention mask) per batch, sources eos-terminated and right-padded."""
    batches = []
    for index in token_batches([len(s) for s in sources], batch_tokens):
        width = max(len(sources[i]) for i in index)
        src = torch.full((len(index), width), PAD, dtype=torch.long)  # (B, S)
        for row, i in enumerate(index):
            src[row, : len(sources[i])] = torch.tensor(sources[i])
        batches.append((src, (src != PAD).long()))
    return batches


def attnkit_side(model, length: int, beam: int, use_cache: bool):
    """A function: one batch -> generated tokens (eos excluded)."""
    config = DecodingConfig(
        beam_size=beam, min_len=length, max_len_a=0, max_len_b=length, use_cache=use_cache
    )
    return lambda src, mask: sum(len(h[0].tokens) for h in generate(model, src, config))


def marian_side(model, length: int, beam: int):
    kwargs = dict(
        num_beams=beam, do_sample=False, length_penalty=1.0, early_stopping=False,
        min_new_tokens=length, max_new_tokens=length + 1, use_cache=True,
    )  # fmt: skip

    def run(src, mask):
        with torch.inference_mode():
            out = model.generate(input_ids=src, attention_mask=mask, **kwargs)  # (B, 1 + T)
        gen = out[:, 1:]
        return int(((gen != PAD) & (gen != EOS)).sum())

    return run


def time_sides(sides: dict, batches) -> dict[str, tuple[float, float, int]]:
    """Run every side on every batch, rotating which goes first, so that a noisy shared
    machine slows all sides alike. Returns name -> (wall s, CPU s, tokens)."""
    totals = {name: [0.0, 0.0, 0] for name in sides}
    names = list(sides)
    for i, (src, mask) in enumerate(batches):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            wall, cpu = time.perf_counter(), time.process_time()
            tokens = sides[name](src, mask)
            totals[name][0] += time.perf_counter() - wall
            totals[name][1] += time.process_time() - cpu
            totals[name][2] += tokens
    return {name: tuple(t) for name, t in totals.items()}


# --------------------------------------------------------------------------- CTranslate2 suite

# attnkit sides: name -> the `attnkit evaluate` flags that make it. Every side is built by the
# command's own build_translator and timed on Translator.translate, the call `attnkit evaluate`
# times, so when attnkit's default path gets faster this table shows it. Another variant is one
# line here, e.g. "attnkit bfloat16": ["--dtype", "bfloat16"]. A side whose flags resolve to
# the same settings as an earlier one is measured once.
ATTNKIT_SIDES = {
    "attnkit (default path)": [],
    "attnkit float32": ["--dtype", "float32"],
    "attnkit (threads)": ["--parallel", "threads"],  # the default path's workers as threads
    "attnkit int8": ["--dtype", "int8"],  # float32 weights, int8 linear layers (FBGEMM)
}
# CTranslate2 sides: name -> compute_type, on the float32 export of the same folder.
# Each compute type twice: one batch at a time on all the threads (intra_threads), and one
# batch per thread (inter_threads, as attnkit's default path decodes: one worker per thread).
CT2_SIDES = {
    "CTranslate2 float32": ("float32", "intra"),
    "CTranslate2 int8": ("int8", "intra"),
    "CTranslate2 float32 (inter)": ("float32", "inter"),
    "CTranslate2 int8 (inter)": ("int8", "inter"),
}
FLOAT32_SIDE, CT2_FLOAT32, CT2_INT8 = "attnkit float32", "CTranslate2 float32", "CTranslate2 int8"
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "amx_tile", "amx_bf16", "amx_int8")  # fmt: skip


def cpu_flags() -> str:
    """The instruction-set flags that decide which kernels run, as /proc/cpuinfo lists them."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line.split(":", 1)[1].split() for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        return "?"
    return " ".join(flag for flag in CPU_FLAGS if flag in flags) or "none of " + " ".join(CPU_FLAGS)


def attnkit_sides(model: str | None, threads: int, beam: int) -> dict:
    """name -> (translate(lines) -> translations, how it was made), built as `attnkit
    evaluate` builds its translator (so its defaults are the command's)."""
    from attnkit.cli import build_parser
    from attnkit.cli.commands.translate import build_translator
    from attnkit.generation.packed import int8_available

    sides, seen = {}, {}
    for name, flags in ATTNKIT_SIDES.items():
        argv = ["evaluate", "--device", "cpu", "--threads", str(threads), "--beam", str(beam)]
        argv += ["--model", model] if model else []
        args = build_parser().parse_args([*argv, *flags])
        settings = tuple(sorted((k, repr(v)) for k, v in vars(args).items() if k != "_run"))
        if settings in seen:
            print(f"{name}: the same settings as {seen[settings]!r}, measured once")
            continue
        seen[settings] = name
        if args.dtype == "int8" and not int8_available():
            print(f"{name}: skipped, this torch has no int8 CPU kernels (FBGEMM)")
            continue
        translator = build_translator(args)
        dtype = next(translator.model.parameters()).dtype
        dtype = f"{dtype}, linear layers int8" if translator.int8 else dtype
        how = f"attnkit evaluate {' '.join(flags) or '(no flags)'}: weights {dtype}"
        sides[name] = (lambda lines, t=translator: t.translate(lines).translations, how)
    return sides


def ct2_sides(folder: str, tokenizer, options: dict, threads: int, batch_tokens: int) -> dict:
    """name -> (translate(lines) -> translations, how): the same normalisation and tokenizer
    as attnkit (timed with the translation, as Translator.translate times its own)."""
    import ctranslate2

    vocab = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    ids = {token: i for i, token in enumerate(vocab)}
    eos = tokenizer.id_to_token(tokenizer.eos_id)
    sides = {}
    for name, (compute_type, parallel) in CT2_SIDES.items():
        intra, inter = (threads, 1) if parallel == "intra" else (1, threads)
        translator = ctranslate2.Translator(
            folder, device="cpu", compute_type=compute_type, intra_threads=intra,
            inter_threads=inter,
        )  # fmt: skip

        def run(lines, translator=translator):
            sources = tokenizer.encode_batch([normalize_source(line) for line in lines])
            results = translator.translate_batch(
                [[vocab[i] for i in row] for row in sources],
                max_batch_size=batch_tokens, batch_type="tokens", **options,
            )  # fmt: skip
            hyps = [r.hypotheses[0] for r in results]
            return tokenizer.decode_batch([[ids[t] for t in h if t != eos] for h in hyps])

        sides[name] = (
            run, f"compute_type={compute_type!r}, intra_threads={intra}, inter_threads={inter}"
        )  # fmt: skip
    return sides


def cpu_seconds() -> float:
    """CPU seconds of this process (every thread's) and of its children, finished or running
    (attnkit's forked decoding workers live from a translator's first call to its close)."""
    finished = resource.getrusage(resource.RUSAGE_CHILDREN)
    running = 0
    pids = []
    for children in glob.glob("/proc/self/task/*/children"):
        try:
            pids += Path(children).read_text().split()
        except OSError:  # the thread ended meanwhile
            continue
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the child ended meanwhile: counted as finished
            continue
        running += int(fields[11]) + int(fields[12])  # utime, stime in clock ticks
    return (
        time.process_time()
        + finished.ru_utime
        + finished.ru_stime
        + running / os.sysconf("SC_CLK_TCK")
    )


def take_turns(sides: dict, lines: list[str], rounds: int, chunk: int):
    """Every side translates all ``lines`` once per round, in chunks of ``chunk`` lines: each
    chunk goes to every side in turn, the first side rotating from chunk to chunk, so that
    load from other processes slows every side alike. Returns name -> (wall seconds per round,
    CPU seconds per round (:func:`cpu_seconds`), translations, whether every round gave the
    same translations)."""
    names = list(sides)
    seconds = {name: [0.0] * rounds for name in names}
    cpu = {name: [0.0] * rounds for name in names}
    outputs: dict[str, list[list[str]]] = {name: [[] for _ in range(rounds)] for name in names}
    turn = 0
    for r in range(rounds):
        for begin in range(0, len(lines), chunk):
            part = lines[begin : begin + chunk]
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                start, start_cpu = time.perf_counter(), cpu_seconds()
                outputs[name][r] += sides[name](part)
                seconds[name][r] += time.perf_counter() - start
                cpu[name][r] += cpu_seconds() - start_cpu
            turn += 1
    return {
        name: (
            seconds[name],
            cpu[name],
            outputs[name][0],
            all(o == outputs[name][0] for o in outputs[name]),
        )
        for name in names
    }


def ctranslate2_suite(args: argparse.Namespace) -> None:
    """attnkit's public translation path against CTranslate2 on Multi30k test2016.

    The model folder (default: the shipped model) is exported in float32 with `attnkit export`'s
    own function; CTranslate2 loads it as float32 and as int8 (quantized on load). Every side
    gets the same sentences (all 1000 unless ``--limit``) and ``--threads`` (torch threads for
    attnkit; intra_threads for CTranslate2, inter_threads 1); beam ``--beam``, attnkit's search
    settings mapped to translate_batch by ``attnkit.export.translate_options``; CTranslate2
    batches by ``--batch-tokens`` tokens. Sides take turns over ``--rounds`` rounds after a
    warm-up, in turns of ``--chunk`` sentences (each chunk goes to every side before the next
    chunk); speed is the median over rounds of sentences / seconds, tokenization and
    detokenization included on both sides. BLEU is attnkit's (equal to sacreBLEU, 13a).
    """
    import ctranslate2

    from attnkit.export import export_ctranslate2, translate_options

    test = load_named_corpus("multi30k", split="test2016", src_lang="de", tgt_lang="en")
    lines = test.src[: args.limit]  # None: all
    refs = test.tgt[: len(lines)]
    model, tokenizer, folder = load_translation_model(args.model)
    sides = dict(attnkit_sides(args.model, args.threads, args.beam))
    with tempfile.TemporaryDirectory() as tmp:
        out = export_ctranslate2(args.model, os.path.join(tmp, "ct2"), quantization="float32")
        search = replace(model_decoding(folder), beam_size=args.beam)  # as attnkit's side
        options = translate_options(
            search.with_ids(tokenizer), tokenizer, max_len=model.config.max_len
        )
        sides.update(ct2_sides(str(out), tokenizer, options, args.threads, args.batch_tokens))
        runs = {name: run for name, (run, _) in sides.items()}
        print(
            f"CPU {cpu_name()}; flags: {cpu_flags()}; usable cores {usable_cores()}; load "
            f"average {load_average():.1f}; torch {torch.__version__} "
            f"({torch.backends.cpu.get_cpu_capability()}); ctranslate2 {ctranslate2.__version__}; "
            f"python {platform.python_version()}"
            + (f"; instruction sets capped: {isa_caps()}" if isa_caps() else "")
        )
        print(
            f"{folder}: Multi30k test2016 de->en, {len(lines)} sentences, beam {args.beam}, "
            f"{args.threads} threads per side, {args.rounds} rounds in turns of {args.chunk} "
            f"sentences; CTranslate2 "
            f"translate_batch({', '.join(f'{k}={v!r}' for k, v in options.items())}, "
            f"max_batch_size={args.batch_tokens}, batch_type='tokens')"
        )
        for name, (_, how) in sides.items():
            print(f"  {name}: {how}")
        take_turns(runs, lines[:50], 1, args.chunk)  # warm-up
        results = take_turns(runs, lines, args.rounds, args.chunk)
    report(results, refs, len(lines))


def report(results: dict, refs: list[str], n: int) -> None:
    """The table, and each target of the issue with the numbers it is judged on."""
    from attnkit.metrics import corpus_bleu

    speed = {name: statistics.median(n / s for s in r[0]) for name, r in results.items()}
    per_cpu = {name: statistics.median(n / s for s in r[1]) for name, r in results.items()}
    bleu = {name: corpus_bleu(r[2], [refs]).score for name, r in results.items()}
    float32_name = FLOAT32_SIDE if FLOAT32_SIDE in results else next(iter(results))
    # The bar for each compute type: CTranslate2's faster way of using the threads.
    best = {
        kind: max((n for n in results if n.startswith(kind)), key=speed.get)
        for kind in (CT2_FLOAT32, CT2_INT8)
    }
    print(f"bars: {best[CT2_FLOAT32]} and {best[CT2_INT8]} (the faster of intra and inter)")
    print()
    print("| side | sentences/s (median) | per round | sentences per CPU-second | BLEU "
          "| translations unlike attnkit float32 | vs CT2 float32 | vs CT2 int8 |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, (secs, _, out, stable) in results.items():
        rounds = ", ".join(f"{n / s:.0f}" for s in secs)
        differ = sum(a != b for a, b in zip(out, results[float32_name][2], strict=True))
        flag = "" if stable else " (rounds differ!)"
        print(
            f"| {name} | {speed[name]:.1f} | {rounds} | {per_cpu[name]:.1f} "
            f"| {bleu[name]:.2f}{flag} | {differ} "
            f"| {speed[name] / speed[best[CT2_FLOAT32]]:.2f}x "
            f"| {speed[name] / speed[best[CT2_INT8]]:.2f}x |"
        )
    base = bleu[float32_name]
    default = next(iter(ATTNKIT_SIDES))
    default = default if default in results else float32_name
    ours = [name for name in results if name in ATTNKIT_SIDES]
    fastest = max((name for name in ours if abs(bleu[name] - base) <= 0.3), key=speed.get)
    print()
    for label, name, against, bound in (
        ("1, default path", default, best[CT2_FLOAT32], 0.1),
        (f"2, fastest attnkit side ({fastest})", fastest, best[CT2_INT8], 0.3),
    ):
        ratio = speed[name] / speed[against]
        fast, close = ratio >= 1.0, abs(bleu[name] - base) <= bound
        print(
            f"target {label}: {ratio:.2f}x {against} (>= 1.0x: {'met' if fast else 'NOT met'}); "
            f"BLEU {bleu[name]:.2f}, {bleu[name] - base:+.2f} from float32 {base:.2f} "
            f"(within {bound}: {'met' if close else 'NOT met'})"
        )


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--suite",
        choices=("random", "ctranslate2"),
        default="random",
        help="random: cached against recompute and Hugging Face on random weights; ctranslate2: the shipped translator against CTranslate2 on test2016",
    )
    parser.add_argument(
        "--limit", type=positive_int, default=None,
        help="the first N test2016 sentences (default: all 1000)",
    )  # fmt: skip
    parser.add_argument("--beam", type=positive_int, default=5, help="beam size")
    parser.add_argument(
        "--batch-tokens", type=positive_int, default=4000, help="source tokens per batch"
    )
    parser.add_argument("--threads", type=thread_count, default=1, help="torch.set_num_threads")
    parser.add_argument(
        "--sides", type=names_from(RANDOM_SIDES), default=",".join(RANDOM_SIDES),
        help=f"random suite: comma-separated sides, of {', '.join(RANDOM_SIDES)}",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=positive_int, default=3, help="ctranslate2 suite: timed rounds"
    )
    parser.add_argument("--model", default=None, help="ctranslate2 suite: model folder")
    parser.add_argument(
        "--chunk", type=positive_int, default=250, help="ctranslate2 suite: sentences per turn"
    )
    args = parser.parse_args()
    if args.suite == "ctranslate2":
        ctranslate2_suite(args)
        return
    random_suite(args)


def random_suite(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)

    train = load_named_corpus("multi30k", split="train", src_lang="de", tgt_lang="en")
    tokenizer = SubwordTokenizer.train(train.src + train.tgt, vocab_size=SIZE["vocab"])
    test = load_named_corpus("multi30k", split="test2016", src_lang="de", tgt_lang="en")
    src_text, ref_text = test.src[: args.limit], test.tgt[: args.limit]  # None: all
    sources = [[*ids, EOS] for ids in tokenizer.encode_batch(src_text)]
    length = round(sum(map(len, tokenizer.encode_batch(ref_text))) / len(ref_text))
    batches = make_batches(sources, args.batch_tokens)
    n = len(sources)

    print(machine_info())
    print(
        f"Multi30k test2016 de->en: {n} sentences, {len(batches)} batches of <= "
        f"{args.batch_tokens} padded source tokens; beam {args.beam}; random weights, float32; "
        f"every output forced to L={length} tokens + eos"
    )
    ours, hf = attnkit_model(), marian_model()
    params = (sum(p.numel() for p in ours.parameters()), sum(p.numel() for p in hf.parameters()))
    print(f"parameters: attnkit {params[0]:,}, Marian {params[1]:,}")
    every = {
        "attnkit, KV cache": ("cached", attnkit_side(ours, length, args.beam, True)),
        "attnkit, recompute prefix": ("recompute", attnkit_side(ours, length, args.beam, False)),
        "HF MarianMTModel.generate": ("hf", marian_side(hf, length, args.beam)),
    }
    sides = {name: fn for name, (key, fn) in every.items() if key in args.sides}
    time_sides(sides, [(src[:2], mask[:2]) for src, mask in batches[-1:]])  # warm-up
    results = time_sides(sides, batches)
    print()
    print("| side | sentences/s | s (wall) | s (CPU) | mean output tokens | cached attnkit is |")
    print("| --- | --- | --- | --- | --- | --- |")
    cached = results.get("attnkit, KV cache")
    for name, (wall, cpu, tokens) in results.items():
        ratio = f"{wall / cached[0]:.2f}x faster" if cached else "-"
        print(f"| {name} | {n / wall:.2f} | {wall:.1f} | {cpu:.1f} | {tokens / n:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
