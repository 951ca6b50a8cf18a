"""Text generation speed: attnkit's GPT with ``attnkit.generation`` against Hugging Face
``GPT2LMHeadModel.generate`` on the same weights, and attnkit's KV cache against recomputing
the prefix, in one run, with a PASS/FAIL column against the targets of issue 15.

Setup (stated in the output):

* Two GPT-2 shapes with GPT-2's vocabulary (50,257) and context (1,024): "124M" (GPT-2 small:
  12 layers, width 768, 12 heads) and "small" (4 layers, width 256, 4 heads). Random weights:
  ``transformers.GPT2LMHeadModel(GPT2Config(...))`` with ``torch.manual_seed(0)``, saved with
  ``save_pretrained`` and read back by ``attnkit.models.GPT.from_pretrained``; both sides in
  eval mode and ``torch.inference_mode()``, in float32 or bfloat16 (weights cast on load).
* Prompts: batch 1 (16 ids) or batch 8 (8, 10, ..., 22 ids: different lengths, left-padded
  with an attention mask on both sides), random ids from ``torch.manual_seed(1)``.
* Exactly ``--new-tokens`` (256) new tokens per row on every side: no eos (attnkit
  ``eos_ids=()``, Hugging Face ``eos_token_id=None, min_new_tokens=256``).
* greedy: ``temperature=0`` / ``do_sample=False``; top-p: temperature 1, top-p 0.9, no top-k
  (Hugging Face's ``top_k`` default of 50 is switched off with ``top_k=0``), seeded.
* attnkit as users get it by default (``generate``: oneDNN-prepacked weights on a CPU, made
  by the warm-up call); Hugging Face's ``generate`` with its defaults (sdpa attention).

Speed = new tokens / wall-clock seconds of one generate call (prompt tokenization and model
loading excluded), one thread by default (``--threads``). Every setting starts with a warm-up
call per side; then ``--rounds`` rounds in which the sides take turns (the first side rotates),
so that load from other processes slows every side alike. Printed: the median tokens/s of
each side, the median over rounds of the per-round ratio (wall clock, the target's measure)
and of the ratio of CPU seconds per token (steadier on a loaded machine), and PASS/FAIL of
the wall-clock ratio against the target. For greedy rows the last column says whether
attnkit's and Hugging Face's tokens were the same (float32 must be; bfloat16 rounds
differently in the two implementations, so it may drift apart at a near-tie).

Targets (issue 15): attnkit >= 1.5x Hugging Face's tokens/s in every row; with the cache,
>= 5x the tokens/s of recomputing the prefix at 256 new tokens.

    python benchmarks/generate.py                          # everything (about half an hour)
    python benchmarks/generate.py --shapes small --dtypes float32 --rounds 1
    python benchmarks/generate.py --recompute-only         # the cache against recomputing
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from machine import (  # noqa: E402  (benchmarks/machine.py)
    argument_parser,
    attnkit_commit,
    cpu_name,
    load_average,
    names_from,
    positive_int,
    positive_ints,
    thread_count,
    usable_cores,
)

from attnkit.generation import GenerationConfig, generate  # noqa: E402
from attnkit.generation.generate import positions_read  # noqa: E402
from attnkit.models import GPT  # noqa: E402

SHAPES = {
    "124M": dict(n_layer=12, n_embd=768, n_head=12),
    "small": dict(n_layer=4, n_embd=256, n_head=4),
}
CONTEXT = 1024  # GPT-2's positions (GPT2Config's default n_positions)
# Recomputing the prefix at the 124M shape takes 25-50 s per 256-token call for one row on one
# core, about 8 times that for 8 rows, so the recompute table has batch 8 for "small" only.
RECOMPUTE_BATCHES = {"small": (1, 8), "124M": (1,)}
DTYPES = ("float32", "bfloat16")
MODES = ("greedy", "top-p")
TOP_P = 0.9
HF_TARGET = 1.5  # attnkit's tokens/s over Hugging Face's
CACHE_TARGET = 5.0  # the KV cache's tokens/s over recomputing the prefix


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            line = next(line for line in f if line.startswith("flags"))
        return set(line.split(":", 1)[1].split())
    except (OSError, StopIteration):
        return set()


def bf16_note() -> str:
    """Whether bfloat16 matrix products run on bfloat16 instructions or are emulated."""
    native = sorted(cpu_flags() & {"avx512_bf16", "amx_bf16", "avx_ne_convert"})
    onednn = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if native:
        return f"bfloat16 native ({', '.join(native)}; oneDNN bf16 {onednn})"
    return f"bfloat16 EMULATED (no avx512_bf16/amx_bf16 on this CPU; oneDNN bf16 {onednn})"


def machine_info() -> str:
    return (
        f"CPU {cpu_name()}; usable cores {usable_cores()}; load average {load_average():.1f}; "
        f"torch {torch.__version__} (capability {torch.backends.cpu.get_cpu_capability()}), "
        f"threads {torch.get_num_threads()}; {bf16_note()}; transformers "
        f"{transformers.__version__}; numpy {numpy.__version__}; python "
        f"{platform.python_version()}; attnkit commit {attnkit_commit()}"
    )


def build_models(shape: str, dtype: torch.dtype, folder: str):
    """(Hugging Face model, attnkit GPT) with the same random weights, in ``dtype``."""
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SHAPES[shape])).eval()
    hf.save_pretrained(folder)
    return hf.to(dtype), GPT.from_pretrained(folder, dtype=dtype)


def prompt_lengths(batch: int) -> list[int]:
    """The prompts' lengths at ``batch`` rows: 16 for one row, else 8, 10, 12, ..."""
    return [16] if batch == 1 else [8 + 2 * i for i in range(batch)]


def make_prompts(batch: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 50257, (n,), generator=g).tolist() for n in prompt_lengths(batch)]


def check_context(parser, new_tokens: int, batches, context: int) -> None:
    """A usage error unless the longest prompt of ``batches`` and ``new_tokens`` fit the
    models' ``context`` (the last new token is never fed back)."""
    batch = max(batches, key=lambda b: max(prompt_lengths(b)))
    longest = max(prompt_lengths(batch))
    room = context - longest + 1
    if positions_read(longest, new_tokens) > context:
        expected = f"at most {room} new tokens" if room > 0 else "smaller batches"
        parser.error(
            f"argument --new-tokens: the longest prompt ({longest} tokens, at batch {batch}) "
            f"and {new_tokens} new tokens overflow the context of {context} positions: "
            f"expected {expected}"
        )


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)  # (B, T)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)  # (B, T)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    return ids, mask


def attnkit_side(
    gpt, prompts, new_tokens: int, mode: str, use_cache: bool = True, compile: bool = False
):
    """A function: () -> the new tokens of every row."""
    sampling = dict(temperature=1.0, top_p=TOP_P, seed=0) if mode == "top-p" else {}
    config = GenerationConfig(
        max_new_tokens=new_tokens, eos_ids=(), use_cache=use_cache, compile=compile, **sampling
    )
    return lambda: generate(gpt, prompts, config).tokens


def hf_side(hf, prompts, new_tokens: int, mode: str):
    ids, mask = left_padded(prompts)
    sampling = (
        dict(do_sample=True, temperature=1.0, top_p=TOP_P, top_k=0)
        if mode == "top-p"
        else dict(do_sample=False)
    )
    kwargs = dict(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=None,
        pad_token_id=0, use_cache=True, **sampling,
    )  # fmt: skip

    def run() -> list[list[int]]:
        torch.manual_seed(0)
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=mask, **kwargs)  # (B, T + new)
        return out[:, ids.shape[1] :].tolist()

    return run


def time_sides(sides: dict, warm: dict, rounds: int) -> dict:
    """A warm-up call of each side in ``warm``, then ``rounds`` rounds of every side in
    ``sides``, the first side rotating. name -> list of (wall s, CPU s, tokens, output)."""
    for run in warm.values():
        run()
    results = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            wall, cpu = time.perf_counter(), time.process_time()
            out = sides[name]()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            results[name].append((wall, cpu, sum(map(len, out)), out))
    return results


def summary(results: dict, ours: str, theirs: str) -> tuple[float, float, float, float]:
    """(median tokens/s of ``ours``, of ``theirs``, median per-round wall ratio, median
    per-round ratio of CPU seconds per token)."""
    rate = {k: [n / wall for wall, _, n, _ in v] for k, v in results.items()}
    cpu = {k: [c / n for _, c, n, _ in v] for k, v in results.items()}
    wall_ratios = [a / b for a, b in zip(rate[ours], rate[theirs], strict=True)]
    cpu_ratios = [b / a for a, b in zip(cpu[ours], cpu[theirs], strict=True)]
    return (
        statistics.median(rate[ours]),
        statistics.median(rate[theirs]),
        statistics.median(wall_ratios),
        statistics.median(cpu_ratios),
    )


def same_tokens(ours: list[list[int]], theirs: list[list[int]]) -> str:
    if ours == theirs:
        return "yes"
    step = min(
        next(i for i, (a, b) in enumerate(zip(r, s, strict=True)) if a != b)
        for r, s in zip(ours, theirs, strict=True)
        if r != s
    )
    return f"no (from step {step})"


def verdict(ratio: float, target: float) -> str:
    return "PASS" if ratio >= target else "FAIL"


def compare_hf(args, folder: str) -> list[str]:
    print(
        "| shape | dtype | batch | decoding | attnkit tokens/s | HF tokens/s | attnkit is "
        f"(wall) | attnkit is (CPU s) | >= {HF_TARGET}x | same greedy tokens |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    failures = []
    for shape in args.shapes:
        for dtype_name in args.dtypes:
            hf, gpt = build_models(shape, getattr(torch, dtype_name), folder)
            for batch in args.batches:
                prompts = make_prompts(batch)
                for mode in args.modes:
                    sides = {
                        "attnkit": attnkit_side(gpt, prompts, args.new_tokens, mode),
                        "hf": hf_side(hf, prompts, args.new_tokens, mode),
                    }
                    warm = {
                        "attnkit": attnkit_side(gpt, prompts, 8, mode),
                        "hf": hf_side(hf, prompts, 8, mode),
                    }
                    res = time_sides(sides, warm, args.rounds)
                    ours, theirs, wall, cpu = summary(res, "attnkit", "hf")
                    same = "-"
                    if mode == "greedy":
                        same = same_tokens(res["attnkit"][0][3], res["hf"][0][3])
                        if dtype_name == "float32" and same != "yes":
                            failures.append(f"{shape} float32 batch {batch}: tokens differ")
                    print(
                        f"| {shape} | {dtype_name} | {batch} | {mode} | {ours:.1f} | "
                        f"{theirs:.1f} | {wall:.2f}x | {cpu:.2f}x | {verdict(wall, HF_TARGET)} "
                        f"| {same} |",
                        flush=True,
                    )
            del hf, gpt
    return failures


def compare_recompute(args, folder: str) -> list[str]:
    print(
        "| shape | dtype | batch | KV cache tokens/s | recompute tokens/s | cache is (wall) | "
        f"cache is (CPU s) | >= {CACHE_TARGET:g}x | same tokens |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    failures = []
    for shape in args.shapes:
        for dtype_name in args.dtypes:
            _, gpt = build_models(shape, getattr(torch, dtype_name), folder)
            for batch in args.recompute_batches or RECOMPUTE_BATCHES[shape]:
                prompts = make_prompts(batch)
                sides = {
                    "cache": attnkit_side(gpt, prompts, args.new_tokens, "greedy", True),
                    "recompute": attnkit_side(gpt, prompts, args.new_tokens, "greedy", False),
                }
                warm = {
                    "cache": attnkit_side(gpt, prompts, 8, "greedy", True),
                    "recompute": attnkit_side(gpt, prompts, 8, "greedy", False),
                }
                res = time_sides(sides, warm, args.recompute_rounds)
                cached, recomputed, wall, cpu = summary(res, "cache", "recompute")
                same = same_tokens(res["cache"][0][3], res["recompute"][0][3])
                if dtype_name == "float32" and same != "yes":
                    failures.append(f"{shape} float32 batch {batch}: cache != recompute")
                print(
                    f"| {shape} | {dtype_name} | {batch} | {cached:.1f} | {recomputed:.1f} | "
                    f"{wall:.1f}x | {cpu:.1f}x | {verdict(wall, CACHE_TARGET)} | {same} |",
                    flush=True,
                )
            del gpt
    return failures


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--shapes", type=names_from(SHAPES), default="small,124M",
        help=f"comma-separated GPT-2 shapes, of {', '.join(SHAPES)}",
    )  # fmt: skip
    parser.add_argument(
        "--dtypes", type=names_from(DTYPES), default=",".join(DTYPES),
        help=f"comma-separated, of {', '.join(DTYPES)}",
    )  # fmt: skip
    parser.add_argument(
        "--batches", type=positive_ints, default="1,8", help="comma-separated prompts per call"
    )
    parser.add_argument(
        "--modes", type=names_from(MODES), default=",".join(MODES),
        help=f"comma-separated, of {', '.join(MODES)}",
    )  # fmt: skip
    parser.add_argument("--new-tokens", type=positive_int, default=256, help="new tokens per row")
    parser.add_argument(
        "--rounds", type=positive_int, default=3, help="timed calls per side and setting"
    )
    parser.add_argument(
        "--recompute-batches", type=positive_ints,
        help="comma-separated batches of the recompute table (default: 1,8 small, 1 124M)",
    )  # fmt: skip
    parser.add_argument(
        "--recompute-rounds", type=positive_int, default=3,
        help="timed calls per side (recompute table)",
    )  # fmt: skip
    parser.add_argument("--threads", type=thread_count, default=1, help="torch.set_num_threads")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--hf-only", action="store_true", help="skip the recompute table")
    which.add_argument("--recompute-only", action="store_true", help="skip the HF table")
    args = parser.parse_args()
    batches = () if args.recompute_only else args.batches
    if not args.hf_only:
        recompute = args.recompute_batches
        batches += recompute or tuple(b for s in args.shapes for b in RECOMPUTE_BATCHES[s])
    check_context(parser, args.new_tokens, batches, CONTEXT)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    print(machine_info())
    print(
        f"GPT-2 shapes {', '.join(args.shapes)} (vocab 50257, random weights), {args.new_tokens} new "
        f"tokens per row; a warm-up call, then {args.rounds} round(s) per setting "
        f"({args.recompute_rounds} for the recompute table), sides taking turns; medians\n"
    )
    failures = []
    with tempfile.TemporaryDirectory() as folder:
        if not args.recompute_only:
            failures += compare_hf(args, folder)
            print()
        if not args.hf_only:
            failures += compare_recompute(args, folder)
    print(f"\nload average at the end {load_average():.1f}")
    if failures:
        raise SystemExit("float32 tokens differ: " + "; ".join(failures))


if __name__ == "__main__":
    main()
