"""Modern attention: the KV cache of grouped-query attention against full multi-head attention
at 4,096 tokens, and a Llama-shaped model's generation against Hugging Face's
``LlamaForCausalLM.generate`` with the same random weights, in one run, with PASS/FAIL
columns against the targets of the issue.

Part 1, ``--part gqa`` (attnkit on both sides): two Llama-shaped models that differ only in
their key/value heads, 8 query heads and 2 key/value heads (GQA) against 8 and 8 (MHA); width
512 (head width 64), ``--gqa-layers`` layers (4), vocabulary 32,000, random weights
(``torch.manual_seed(0)``). One row; a prompt of 4,096 - ``--gqa-new-tokens`` random ids, then
``--gqa-new-tokens`` (128) greedy tokens, so that the cache ends at 4,096 tokens. Measured:
the bytes of the KV cache that ``generate`` allocated (read from the cache object it made, at
the same dtype), the tokens/s of the whole call (prefill included) and of the decoding steps
alone (from the first new token to the last). A third model with a sliding window of 1,024
shows the bounded cache (reported, no target). Targets: GQA's cache <= 1/3 of MHA's, and GQA's
tokens/s >= MHA's (the decoding steps; the whole call is shown too).

Part 2, ``--part hf``: a Llama-shaped model, ``transformers.LlamaForCausalLM(LlamaConfig(
hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
num_key_value_heads=2, vocab_size=32000))`` with ``torch.manual_seed(0)``, saved with
``save_pretrained`` and read back by ``attnkit.models.GPT.from_pretrained``; both sides in eval
mode and ``torch.inference_mode()``, float32 or bfloat16 (weights cast on load). Prompts: batch
1 (16 ids) or batch 8 (8, 10, ..., 22 ids, left-padded with an attention mask on both sides),
random ids from ``torch.manual_seed(1)``; exactly ``--new-tokens`` (128) greedy new tokens per
row on both sides (no eos). attnkit as users get it (``generate``: oneDNN-prepacked weights on
a CPU); Hugging Face's ``generate`` with its defaults (sdpa attention, dynamic cache). The last
column says whether the greedy tokens were the same (float32 must be; bfloat16 rounds
differently in the two implementations, so it may drift apart at a near-tie). Target:
attnkit >= 1.5x Hugging Face's tokens/s in float32 and bfloat16.

Every setting starts with a warm-up call per side; then ``--rounds`` rounds in which the sides
take turns (the first side rotating), so that load from other processes slows every side
alike. Printed: medians of each side and the median over rounds of the per-round ratio (wall
clock) and of the ratio of CPU seconds per token (steadier on a loaded machine). One thread by
default (``--threads``). ``--profile`` adds a torch.profiler table of one call per side and
batch size of ``--batches`` (where the time goes). ``--compile`` adds a third side to part 2, attnkit with its one-token
steps compiled (``GenerationConfig(compile=True)``, ``attnkit.generation.compiled``), in a row
of its own against the same Hugging Face rounds; its warm-up call compiles.

    python benchmarks/llama.py                       # both parts (about 15 minutes)
    python benchmarks/llama.py --part gqa --dtypes float32
    python benchmarks/llama.py --part hf --dtypes bfloat16 --batches 1 --rounds 1 --profile
    python benchmarks/llama.py --part hf --compile --rounds 5
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from generate import (  # noqa: E402  (benchmarks/generate.py: the shared timing and printing)
    DTYPES,
    attnkit_side,
    check_context,
    hf_side,
    machine_info,
    prompt_lengths,
    same_tokens,
    summary,
    time_sides,
    verdict,
)
from machine import (  # noqa: E402
    argument_parser,
    load_average,
    names_from,
    positive_int,
    positive_ints,
    thread_count,
)

from attnkit.cli.options import integer  # noqa: E402
from attnkit.generation import GenerationConfig, generate_steps  # noqa: E402
from attnkit.models import GPT, GPTConfig  # noqa: E402

VOCAB = 32000
GQA_CACHE_TARGET = 1 / 3  # GQA's cache bytes over MHA's, at most
GQA_SPEED_TARGET = 1.0  # GQA's decoding tokens/s over MHA's, at least
HF_TARGET = 1.5  # attnkit's tokens/s over Hugging Face's
COMPILED = "attnkit compiled"  # part 2's side with --compile
CONTEXT = 4096
HF_SHAPE = dict(
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    vocab_size=VOCAB,
)


def make_prompts(batch: int, *, length: int = 16) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lengths = [length] if batch == 1 else prompt_lengths(batch)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


# --------------------------------------------------------------------------- part 1: GQA


def gqa_model(kv_heads: int, layers: int, dtype: torch.dtype, window: int | None = None) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig.llama(
        vocab_size=VOCAB, context_length=CONTEXT, d_model=512, num_heads=8,
        num_kv_heads=kv_heads, num_layers=layers, d_ff=1408, window=window,
    )  # fmt: skip
    return GPT(config).to(dtype).eval()


def gqa_side(model: GPT, prompt: list[int], new_tokens: int, record: dict):
    """A function: () -> the new tokens; it records the cache bytes ``generate`` allocated
    and the seconds of the decoding steps (first new token to last) in ``record``."""
    config = GenerationConfig(max_new_tokens=new_tokens, eos_ids=())
    allocate = model.init_cache

    def init_cache(*args, **kwargs):
        cache = allocate(*args, **kwargs)
        record["cache_bytes"] = sum(c.nbytes for c in cache.layers)
        return cache

    def run() -> list[list[int]]:
        model.init_cache = init_cache  # the instance attribute hides the method for this call
        tokens, first = [], None
        try:
            for step in generate_steps(model, [prompt], config):
                first = time.perf_counter() if first is None else first
                tokens.append(step.tokens[0])
        finally:
            del model.init_cache
        record.setdefault("decode", []).append((len(tokens) - 1) / (time.perf_counter() - first))
        return [tokens]

    return run


def compare_gqa(args) -> list[str]:
    new = args.gqa_new_tokens
    # the last new token is never fed back: prompt + new - 1 = CONTEXT slots in the cache
    prompt = make_prompts(1, length=CONTEXT - new + 1)[0]
    print(
        f"Part 1: 8 query heads, 2 (GQA) or 8 (MHA) key/value heads, width 512, "
        f"{args.gqa_layers} layers; one row, a {len(prompt)}-token prompt + {new} greedy "
        f"tokens: {CONTEXT} tokens in the cache (the last new token is never fed back)\n"
    )
    print(
        "| dtype | model | KV cache (MiB) | cache vs MHA | whole call tokens/s | decoding "
        "tokens/s | decoding vs MHA (wall) | targets |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    failures = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        models = {
            "MHA 8/8": gqa_model(8, args.gqa_layers, dtype),
            "GQA 8/2": gqa_model(2, args.gqa_layers, dtype),
            "GQA 8/2, window 1024": gqa_model(2, args.gqa_layers, dtype, window=1024),
        }
        records = {name: {} for name in models}
        sides = {n: gqa_side(m, prompt, new, records[n]) for n, m in models.items()}
        warm = {n: gqa_side(m, prompt[-64:], 4, {}) for n, m in models.items()}
        res = time_sides(sides, warm, args.rounds)
        mha = records["MHA 8/8"]
        for name in models:
            rec = records[name]
            whole = statistics.median(n / wall for wall, _, n, _ in res[name])
            decode = statistics.median(rec["decode"])
            speed = statistics.median(
                a / b for a, b in zip(rec["decode"], mha["decode"], strict=True)
            )  # per-round ratio
            share = rec["cache_bytes"] / mha["cache_bytes"]
            target = "-"
            if name == "GQA 8/2":
                ok = share <= GQA_CACHE_TARGET and speed >= GQA_SPEED_TARGET
                target = (
                    f"cache <= 1/3: {'PASS' if share <= GQA_CACHE_TARGET else 'FAIL'}, "
                    f"speed >= 1x: {verdict(speed, GQA_SPEED_TARGET)}"
                )
                if not ok:
                    failures.append(f"GQA {dtype_name}: cache {share:.3f} of MHA, {speed:.2f}x")
            print(
                f"| {dtype_name} | {name} | {rec['cache_bytes'] / 2**20:.1f} | {share:.3f} | "
                f"{whole:.1f} | {decode:.1f} | {speed:.2f}x | {target} |",
                flush=True,
            )
        same = same_tokens(res["GQA 8/2"][0][3], res["GQA 8/2"][-1][3])
        print(f"|  | (GQA's tokens the same in every round: {same}) |  |  |  |  |  |  |")
        del models
    return failures


# --------------------------------------------------------------------------- part 2: vs HF


def build_llama(dtype: torch.dtype, folder: str):
    """(Hugging Face LlamaForCausalLM, attnkit GPT) with the same random weights, in dtype."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_SHAPE)).eval()
    hf.save_pretrained(folder)
    return hf.to(dtype), GPT.from_pretrained(folder, dtype=dtype)


def compare_hf(args, folder: str) -> list[str]:
    shape = ", ".join(f"{k}={v}" for k, v in HF_SHAPE.items())
    print(f"Part 2: LlamaForCausalLM({shape}), {args.new_tokens} greedy tokens per row\n")
    print(
        "| dtype | batch | attnkit tokens/s | HF tokens/s | attnkit is (wall) | attnkit is "
        f"(CPU s) | >= {HF_TARGET}x | same greedy tokens |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    failures = []
    for dtype_name in args.dtypes:
        hf, gpt = build_llama(getattr(torch, dtype_name), folder)
        for batch in args.batches:
            prompts = make_prompts(batch)
            sides = {
                "attnkit": attnkit_side(gpt, prompts, args.new_tokens, "greedy"),
                "hf": hf_side(hf, prompts, args.new_tokens, "greedy"),
            }
            warm = {
                "attnkit": attnkit_side(gpt, prompts, 8, "greedy"),
                "hf": hf_side(hf, prompts, 8, "greedy"),
            }
            if args.compile:  # warmed up over the whole length: its graphs are made then
                sides[COMPILED] = warm[COMPILED] = attnkit_side(
                    gpt, prompts, args.new_tokens, "greedy", compile=True
                )
            res = time_sides(sides, warm, args.rounds)
            for name in [s for s in sides if s != "hf"]:
                ours, theirs, wall, cpu = summary(res, name, "hf")
                same = same_tokens(res[name][0][3], res["hf"][0][3])
                if dtype_name == "float32" and same != "yes":
                    failures.append(f"{name}, float32 batch {batch}: tokens differ from HF's")
                label = dtype_name if name == "attnkit" else f"{dtype_name}, {name}"
                print(
                    f"| {label} | {batch} | {ours:.1f} | {theirs:.1f} | {wall:.2f}x | "
                    f"{cpu:.2f}x | {verdict(wall, HF_TARGET)} | {same} |",
                    flush=True,
                )
            if args.profile:
                profile(sides, f"{dtype_name}, batch {batch}")
        del hf, gpt
    return failures


def profile(sides: dict, title: str) -> None:
    """torch.profiler tables of one call per side: where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    for name, run in sides.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
        print(f"\n{name}, {title}: the 15 operators with the most self CPU time")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--part",
        choices=["gqa", "hf", "both"],
        default="both",
        help="gqa: GQA's cache and speed against MHA; hf: the Llama shape against LlamaForCausalLM.generate",
    )
    parser.add_argument(
        "--dtypes", type=names_from(DTYPES), default=",".join(DTYPES),
        help=f"comma-separated, of {', '.join(DTYPES)}",
    )  # fmt: skip
    parser.add_argument(
        "--batches", type=positive_ints, default="1,8", help="part 2's comma-separated batch sizes"
    )
    parser.add_argument(
        "--new-tokens", type=positive_int, default=128, help="part 2's new tokens per row"
    )
    parser.add_argument("--gqa-layers", type=positive_int, default=4, help="part 1's layers")
    parser.add_argument(
        "--gqa-new-tokens", type=integer(2, CONTEXT), default=128,
        help=f"part 1's new tokens, 2 to {CONTEXT} (the decoding steps' speed needs two)",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=positive_int, default=3, help="timed calls per side and setting"
    )
    parser.add_argument("--threads", type=thread_count, default=1, help="torch.set_num_threads")
    parser.add_argument(
        "--profile", action="store_true", help="part 2: profile one call per side and batch"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="part 2: also attnkit with GenerationConfig(compile=True) (its first call, in the "
        "warm-up, compiles for 16-80 s)",
    )
    args = parser.parse_args()
    if args.part in ("hf", "both"):
        check_context(parser, args.new_tokens, args.batches, HF_SHAPE["max_position_embeddings"])
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    print(machine_info())
    print(
        f"a warm-up call, then {args.rounds} round(s) per setting, sides taking turns; "
        "medians; the machine is shared with other work\n"
    )
    failures = []
    if args.part in ("gqa", "both"):
        failures += compare_gqa(args)
        print()
    if args.part in ("hf", "both"):
        with tempfile.TemporaryDirectory() as folder:
            failures += compare_hf(args, folder)
    print(f"\nload average at the end {load_average():.1f}")
    if failures:
        print("NOT MET: " + "; ".join(failures))


if __name__ == "__main__":
    main()
