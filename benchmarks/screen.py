"""Greedy decoding's output-layer screen (``attnkit.generation.screen``): the int8 copy against
the float16 copy and the float32 product, in one run.

Part 1, the output layer alone: ``torch.nn.functional.linear`` in float32 then ``argmax``,
against ``screen.greedy_tokens`` through each kind of copy (the screened product, the bound,
the candidates multiplied again in float32: the whole token), for the output layers of the
Llama shape of ``benchmarks/llama.py`` (32,000 x 512) and of GPT-2 124M (50,257 x 768), random
weights (normal, std 0.02, ``torch.manual_seed(0)``), inputs normal (std 1, the scale of a
final norm's output), at 1 and 8 rows. ``--copies`` (8) copies of each layer are taken in turn,
so that the weights come from memory, not from the caches, as in a model's step. Printed:
milliseconds a call (median of ``--rounds`` rounds of 50 calls, the sides taking turns; a call
the screen leaves undecided computes the float32 logits, as ``generate`` does, and counts in
its time), the candidates a row that each kind multiplied again, the share of calls left
undecided (more than ``screen.MAX_CANDIDATES`` candidates in a row), and whether every token
equals float32's argmax (it must). Inputs drawn at random give flatter logits than a model's
hidden states (the Llama shape's own: about 67 int8 candidates a row against 92 here).

Part 2, ``--part generate``: the Llama shape itself (``GPTConfig.llama``, 8 layers, random
weights) generating 128 greedy tokens from a 16-token prompt at one row in float32, with the
screen's kind switched between int8 and float16 (``screen.KIND``) between the sides' turns,
tokens/s of each and their ratio; ``--compile`` compiles the one-token steps
(``GenerationConfig(compile=True)``; its warm-up call compiles for 16-80 s). The tokens must be
the same.

    python benchmarks/screen.py                      # both parts (about 2 minutes)
    python benchmarks/screen.py --part generate --compile --rounds 5
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.nn.functional as F
from machine import (
    argument_parser,
    cpu_name,
    isa_caps,
    load_average,
    positive_int,
    thread_count,
    usable_cores,
)
from torch import nn

from attnkit.generation import GenerationConfig, generate, packed, screen
from attnkit.models import GPT, GPTConfig

LAYERS = {"Llama (32,000 x 512)": (32000, 512), "GPT-2 124M (50,257 x 768)": (50257, 768)}
KINDS = ("int8", "float16")


def heads(vocab: int, width: int, copies: int) -> list[nn.Linear]:
    torch.manual_seed(0)
    out = []
    for _ in range(copies):
        head = nn.Linear(width, vocab, bias=False)
        with torch.no_grad():
            head.weight.normal_(0, 0.02)
        out.append(head)
    return out


def made(head: nn.Linear, kind: str) -> screen.Screen:
    """The screen of ``kind`` for ``head``, made now. A screen is kept for the KIND it was made
    under, so each kind's side has heads of its own (sharing the weights)."""
    screen.KIND = kind
    found = screen.screen(head)
    if found is None or found.kind != kind:
        raise SystemExit(f"no {kind} screen here (FBGEMM's {kind} product does not run)")
    return found


def part_layer(args) -> None:
    print("Part 1: the output layer alone; ms a call (median), candidates a row, tokens == argmax")
    print()
    print("| layer | rows | float32 ms | int8 ms | float16 ms | int8 candidates | float16 "
          "candidates | int8 undecided | float16 undecided | float32 / int8 | float16 / int8 "
          "| tokens |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, (vocab, width) in LAYERS.items():
        layer = heads(vocab, width, args.copies)
        own = {kind: [nn.Linear(width, vocab, bias=False) for _ in layer] for kind in KINDS}
        for kind in KINDS:
            for head, weights in zip(own[kind], layer, strict=True):
                head.weight = weights.weight  # the same weights, a screen of this kind
                made(head, kind)
        for rows in (1, 8):
            gen = torch.Generator().manual_seed(1)
            xs = [torch.randn(rows, width, generator=gen) for _ in range(50)]
            expected = [F.linear(x, layer[i % len(layer)].weight).argmax(dim=1) for i, x in
                        enumerate(xs)]  # fmt: skip
            counts = {kind: [] for kind in KINDS}
            undecided = {kind: 0 for kind in KINDS}
            same = [True]

            def float32_side(xs=xs, layer=layer):
                for i, x in enumerate(xs):
                    F.linear(x, layer[i % len(layer)].weight).argmax(dim=1)

            def kind_side(
                kind, xs=xs, heads=own, expected=expected, undecided=undecided, same=same
            ):
                def run():
                    screen.KIND = kind
                    for i, x in enumerate(xs):
                        head = heads[kind][i % len(heads[kind])]
                        tokens = screen.greedy_tokens(head, x)
                        if tokens is None:  # left to the logits, as generate() then does
                            undecided[kind] += 1
                            tokens = F.linear(x, head.weight).argmax(dim=1)
                        same[0] = same[0] and torch.equal(tokens, expected[i])

                return run

            sides = {"float32": float32_side, **{k: kind_side(k) for k in KINDS}}
            times = {k: [] for k in sides}
            for r in range(args.rounds + 1):  # the first round warms up
                order = list(sides)[r % 3 :] + list(sides)[: r % 3]
                for side in order:
                    start = time.perf_counter()
                    sides[side]()
                    if r:
                        times[side].append((time.perf_counter() - start) / len(xs) * 1e3)
            for kind in KINDS:  # candidates a row, counted outside the timed calls
                screen.KIND = kind
                for i, x in enumerate(xs[:10]):
                    found = screen.screen(own[kind][i % len(layer)])
                    counts[kind].append(candidates(found, x))
            ms = {k: statistics.median(v) for k, v in times.items()}
            calls = len(xs) * (args.rounds + 1)
            print(
                f"| {name} | {rows} | {ms['float32']:.2f} | {ms['int8']:.2f} | "
                f"{ms['float16']:.2f} | {statistics.mean(counts['int8']):.1f} | "
                f"{statistics.mean(counts['float16']):.1f} | "
                f"{undecided['int8'] / calls:.0%} | {undecided['float16'] / calls:.0%} | "
                f"{ms['float32'] / ms['int8']:.2f}x | {ms['float16'] / ms['int8']:.2f}x | "
                f"{'same' if same[0] else 'DIFFER'} |"
            )
    screen.KIND = None
    print()


def candidates(found: screen.Screen, x: torch.Tensor) -> float:
    """The ids a row that the bound keeps (the screen's second pass multiplies them again)."""
    approx = found.approx(x).double()  # (M, V)
    err = torch.linalg.vector_norm(x.double(), dim=1, keepdim=True) * found.spread
    if found.step is not None:
        err = err + found.input_step(x.numpy()) * found.step
    err = err + found.tiny
    best = approx.argmax(dim=1, keepdim=True)
    floor = approx.gather(1, best) - err.gather(1, best)
    return float((approx + err >= floor).sum(dim=1).double().mean())


def part_generate(args) -> None:
    torch.manual_seed(0)
    config = GPTConfig.llama(vocab_size=32000, context_length=2048, d_model=512, num_heads=8,
                             num_kv_heads=2, num_layers=8, d_ff=1408)  # fmt: skip
    model = GPT(config).eval()
    models = {"int8": model, "float16": copy.deepcopy(model)}  # a screen of each kind
    prompt = [torch.randint(0, 32000, (16,), generator=torch.Generator().manual_seed(1)).tolist()]
    call = GenerationConfig(max_new_tokens=128, eos_ids=(), compile=args.compile)
    out, times = {}, {k: [] for k in KINDS}
    for kind in KINDS:  # make both screens and warm up (compile)
        made(models[kind].lm_head, kind)
        out[kind] = generate(models[kind], prompt, call).tokens
    for r in range(args.rounds):
        for kind in KINDS[r % 2 :] + KINDS[: r % 2]:
            screen.KIND = kind
            start = time.perf_counter()
            tokens = generate(models[kind], prompt, call).tokens
            times[kind].append(127 / (time.perf_counter() - start))
            assert tokens == out[kind]
    screen.KIND = None
    rate = {k: statistics.median(v) for k, v in times.items()}
    ratios = statistics.median(a / b for a, b in zip(times["int8"], times["float16"], strict=True))
    label = "compiled steps" if args.compile else "eager steps"
    print(f"Part 2: the Llama shape, float32, one row, 128 greedy tokens, {label}")
    print()
    print("| screen | tokens/s | int8 / float16 (median of rounds) | same tokens |")
    print("| --- | --- | --- | --- |")
    same = "yes" if out["int8"] == out["float16"] else "NO"
    print(f"| int8 | {rate['int8']:.1f} | {ratios:.2f}x | {same} |")
    print(f"| float16 | {rate['float16']:.1f} | | |")
    print()


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--part",
        choices=["layer", "generate", "both"],
        default="both",
        help="layer: the output layer alone; generate: the Llama shape generating",
    )
    parser.add_argument("--rounds", type=positive_int, default=5, help="timed rounds per side")
    parser.add_argument(
        "--copies", type=positive_int, default=8, help="part 1: copies of each layer"
    )
    parser.add_argument("--threads", type=thread_count, default=1, help="torch.set_num_threads")
    parser.add_argument("--compile", action="store_true", help="part 2: compiled steps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not (packed.int8_available() and packed.float16_available()):
        raise SystemExit("this benchmark needs FBGEMM's int8 and float16 products (x86, AVX2)")
    caps = isa_caps()
    print(
        f"CPU {cpu_name()}; usable cores {usable_cores()}; load average {load_average():.1f}; "
        f"torch {torch.__version__} (capability {torch.backends.cpu.get_cpu_capability()}), "
        f"threads {torch.get_num_threads()}{'; ' + caps if caps else ''}"
    )
    print()
    with torch.inference_mode():
        if args.part in ("layer", "both"):
            part_layer(args)
        if args.part in ("generate", "both"):
            part_generate(args)
    print(f"load average at the end {load_average():.1f}")


if __name__ == "__main__":
    main()
