"""Text generation speed: attnkit's GPT with ``attnkit.generation`` against Hugging Face
``GPT2LMHeadModel.generate`` on the same weights, and attnkit's KV cache against recomputing
the prefix, in one run.

Setup (stated in the output):

* Two GPT-2 shapes with GPT-2's vocabulary (50,257) and context (1,024): "124M" (GPT-2 small:
  12 layers, width 768, 12 heads) and "small" (4 layers, width 256, 4 heads). Random weights:
  ``transformers.GPT2LMHeadModel(GPT2Config(...))`` with ``torch.manual_seed(0)``, saved with
  ``save_pretrained`` and read back by ``attnkit.models.GPT.from_pretrained``; both sides in
  eval mode and ``torch.inference_mode()``, in float32 or bfloat16 (weights cast on load).
* Prompts: batch 1 (16 ids) or batch 8 (8, 10, ..., 22 ids: different lengths, left-padded
  with an attention mask on both sides), random ids from ``torch.manual_seed(1)``.
* Exactly ``--new-tokens`` (256) new tokens per row on every side: no eos (attnkit
  ``eos_ids=()``, Hugging Face ``eos_token_id=None``).
* greedy: ``temperature=0`` / ``do_sample=False``; top-p: temperature 1, top-p 0.9, no top-k
  (Hugging Face's ``top_k`` default of 50 is switched off with ``top_k=0``), seeded.

Speed = new tokens / wall-clock seconds of the generate call (prompt tokenization and model
loading excluded), one thread by default (``--threads``). Within each setting the sides take
turns (the first side rotates each round), after a warm-up call, so that load from other
processes slows every side alike. The ratio of CPU seconds per token is printed beside the
wall-clock ratio: on a loaded machine it is the steadier of the two.

    python benchmarks/generate.py                          # everything (tens of minutes)
    python benchmarks/generate.py --shapes small --dtypes float32 --rounds 1
    python benchmarks/generate.py --recompute-only         # the cache against recomputing
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import platform  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from machine import cpu_name, load_average, usable_cores  # noqa: E402  (benchmarks/machine.py)

from attnkit.generation import GenerationConfig, generate  # noqa: E402
from attnkit.models import GPT  # noqa: E402

SHAPES = {
    "124M": dict(n_layer=12, n_embd=768, n_head=12),
    "small": dict(n_layer=4, n_embd=256, n_head=4),
}
TOP_P = 0.9


def machine_info() -> str:
    return (
        f"CPU {cpu_name()}; usable cores {usable_cores()}; load average {load_average():.1f}; "
        f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), threads "
        f"{torch.get_num_threads()}; transformers {transformers.__version__}; "
        f"python {platform.python_version()}"
    )


def build_models(shape: str, dtype: torch.dtype, folder: str):
    """(Hugging Face model, attnkit GPT) with the same random weights, in ``dtype``."""
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SHAPES[shape])).eval()
    hf.save_pretrained(folder)
    return hf.to(dtype), GPT.from_pretrained(folder, dtype=dtype)


def make_prompts(batch: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lengths = [16] if batch == 1 else [8 + 2 * i for i in range(batch)]
    return [torch.randint(0, 50257, (n,), generator=g).tolist() for n in lengths]


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)  # (B, T)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)  # (B, T)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    return ids, mask


def attnkit_side(gpt, prompts, new_tokens: int, mode: str, use_cache: bool = True):
    """A function: () -> new tokens generated."""
    sampling = dict(temperature=1.0, top_p=TOP_P, seed=0) if mode == "top-p" else {}
    config = GenerationConfig(
        max_new_tokens=new_tokens, eos_ids=(), use_cache=use_cache, **sampling
    )
    return lambda: sum(map(len, generate(gpt, prompts, config).tokens))


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

    def run() -> int:
        torch.manual_seed(0)
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=mask, **kwargs)  # (B, T + new)
        return out[:, ids.shape[1] :].numel()

    return run


def time_sides(sides: dict, rounds: int) -> dict[str, tuple[float, float, int]]:
    """Run every side ``rounds`` times, rotating which goes first. name -> (wall, CPU, tokens)."""
    totals = {name: [0.0, 0.0, 0] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            wall, cpu = time.perf_counter(), time.process_time()
            tokens = sides[name]()
            totals[name][0] += time.perf_counter() - wall
            totals[name][1] += time.process_time() - cpu
            totals[name][2] += tokens
    return {name: tuple(t) for name, t in totals.items()}


def compare_hf(args, folder: str) -> None:
    print(
        "| shape | dtype | batch | decoding | attnkit tokens/s | HF tokens/s | attnkit is "
        "(wall) | attnkit is (CPU s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for shape in args.shapes.split(","):
        for dtype_name in args.dtypes.split(","):
            hf, gpt = build_models(shape, getattr(torch, dtype_name), folder)
            for batch in map(int, args.batches.split(",")):
                prompts = make_prompts(batch)
                for mode in args.modes.split(","):
                    sides = {
                        "attnkit": attnkit_side(gpt, prompts, args.new_tokens, mode),
                        "hf": hf_side(hf, prompts, args.new_tokens, mode),
                    }
                    warm = {
                        "attnkit": attnkit_side(gpt, prompts, 4, mode),
                        "hf": hf_side(hf, prompts, 4, mode),
                    }
                    time_sides(warm, 1)
                    res = time_sides(sides, args.rounds)
                    ours, theirs = (res[k][2] / res[k][0] for k in ("attnkit", "hf"))
                    cpu_ratio = (res["hf"][1] / res["hf"][2]) / (
                        res["attnkit"][1] / res["attnkit"][2]
                    )
                    print(
                        f"| {shape} | {dtype_name} | {batch} | {mode} | {ours:.1f} | "
                        f"{theirs:.1f} | {ours / theirs:.2f}x | {cpu_ratio:.2f}x |",
                        flush=True,
                    )
            del hf, gpt


def compare_recompute(args, folder: str) -> None:
    print(
        "| shape | dtype | batch | KV cache tokens/s | recompute tokens/s | cache is (wall) | "
        "cache is (CPU s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for shape in args.shapes.split(","):
        _, gpt = build_models(shape, torch.float32, folder)
        prompts = make_prompts(1)
        sides = {
            "cache": attnkit_side(gpt, prompts, args.new_tokens, "greedy", True),
            "recompute": attnkit_side(gpt, prompts, args.new_tokens, "greedy", False),
        }
        res = time_sides(sides, 1)
        cached, recomputed = (res[k][2] / res[k][0] for k in ("cache", "recompute"))
        cpu_ratio = res["recompute"][1] / res["cache"][1]
        print(
            f"| {shape} | float32 | 1 | {cached:.1f} | {recomputed:.1f} | "
            f"{cached / recomputed:.1f}x | {cpu_ratio:.1f}x |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="small,124M")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--modes", default="greedy,top-p")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per side and setting")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--hf-only", action="store_true", help="skip the recompute table")
    which.add_argument("--recompute-only", action="store_true", help="skip the HF table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_info())
    print(
        f"GPT-2 shapes {args.shapes} (vocab 50257, random weights), {args.new_tokens} new "
        f"tokens per row, {args.rounds} timed call(s) per side and setting, sides taking turns"
    )
    with tempfile.TemporaryDirectory() as folder:
        if not args.recompute_only:
            compare_hf(args, folder)
            print()
        if not args.hf_only:
            compare_recompute(args, folder)


if __name__ == "__main__":
    main()
