"""Speed of attnkit's corpus BLEU against sacreBLEU's, on the same input in the same process.

Run:  .venv/bin/python benchmarks/bleu.py [--lines 100000] [--repeats 3]

Input: Multi30k train English references (29,000 lines, repeated to --lines) and a hypothesis
for each, made from its reference by seeded corruptions (dropped, repeated and swapped words,
case changes, punctuation, empty lines), so nearly every hypothesis line is distinct. Both
sides compute corpus BLEU with the 13a tokenizer and exp smoothing from the raw strings, with
cold tokenizer caches each run (a new sacreBLEU ``BLEU`` object; attnkit's caches cleared),
taking turns so that load on a shared machine hits both. The best of --repeats runs is
reported, as wall time and as process CPU time, and the two scores must be identical.

A second case scores one very long segment (--long-words words, 20,000 by default, drawn
from 50 words so that n-grams repeat, against a reference with a fifth of them replaced):
n-gram matching must stay linear in the length of a segment (it was quadratic: 11.9 s
against sacreBLEU's 0.17 s for such a line).
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import sacrebleu
from machine import argument_parser, cpu_name, positive_int  # noqa: E402  (benchmarks/machine.py)
from sacrebleu.metrics import BLEU

from attnkit.metrics import corpus_bleu
from attnkit.metrics.signature import attnkit_version
from attnkit.metrics.tokenizers import tokenize_13a

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k" / "train.en.gz"


def machine() -> dict:
    cpu = cpu_name()
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "sacrebleu": sacrebleu.__version__,
        "attnkit": attnkit_version(),
    }


def corpus(n_lines: int, seed: int = 0) -> tuple[list[str], list[str]]:
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        train = f.read().split("\n")[:-1]
    rng = random.Random(seed)
    hyps, refs = [], []
    for i in range(n_lines):
        ref = train[i % len(train)]
        words = ref.split()
        r = rng.random()
        if r < 0.02:
            words = []
        elif r < 0.3 and words:
            del words[rng.randrange(len(words))]
        elif r < 0.5 and len(words) > 1:
            j = rng.randrange(len(words) - 1)
            words[j], words[j + 1] = words[j + 1], words[j]
        elif r < 0.6 and words:
            j = rng.randrange(len(words))
            words.insert(j, words[j])
        elif r < 0.7:
            words = [w.lower() for w in words]
        if words and rng.random() < 0.3:
            words[-1] = words[-1].rstrip(".") + rng.choice([" .", "!", ",", ""])
        hyps.append(" ".join(words))
        refs.append(ref)
    return hyps, refs


def long_line(n_words: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """One hypothesis of ``n_words`` words from a 50-word vocabulary and its reference."""
    rng = random.Random(seed)
    words = [f"w{rng.randrange(50)}" for _ in range(n_words)]
    ref = [w if rng.random() < 0.8 else "x" for w in words]
    return [" ".join(words)], [" ".join(ref)]


def run_sacrebleu(hyps: list[str], refs: list[str]):
    return BLEU(tokenize="13a").corpus_score(hyps, [refs])


def run_attnkit(hyps: list[str], refs: list[str]):
    tokenize_13a.cache_clear()
    return corpus_bleu(hyps, [refs], tokenize="13a")


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--lines",
        type=positive_int,
        default=100_000,
        help="segments of the Multi30k training English scored as a corpus",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="timed scorings per side (the best is printed)",
    )
    parser.add_argument(
        "--long-words",
        type=positive_int,
        default=20_000,
        help="words of the one long segment of the second test",
    )
    args = parser.parse_args()

    info = machine()
    hyps, refs = corpus(args.lines)
    n_tokens = sum(len(h.split()) for h in hyps)
    print(f"machine: {info}")
    print(
        f"input: {len(hyps)} hypothesis lines ({len(set(hyps))} distinct, {n_tokens} words), "
        f"{len(refs)} reference lines ({len(set(refs))} distinct), 1 reference per line"
    )

    wall, cpu, scores, identical = compare(hyps, refs, args.repeats)
    ours, theirs = scores["attnkit"], scores["sacrebleu"]

    long_hyps, long_refs = long_line(args.long_words)
    print(f"long line: 1 segment of {args.long_words} words")
    long_wall, _, long_scores, long_identical = compare(long_hyps, long_refs, args.repeats)
    result = {
        "lines": len(hyps),
        "best_wall_s": {k: round(min(v), 3) for k, v in wall.items()},
        "best_cpu_s": {k: round(min(v), 3) for k, v in cpu.items()},
        "speedup_wall": round(min(wall["sacrebleu"]) / min(wall["attnkit"]), 2),
        "speedup_cpu": round(min(cpu["sacrebleu"]) / min(cpu["attnkit"]), 2),
        "bleu": ours.score,
        "identical_to_sacrebleu": identical,
        "long_line": {
            "words": args.long_words,
            "best_wall_s": {k: round(min(v), 3) for k, v in long_wall.items()},
            "bleu": long_scores["attnkit"].score,
            "identical_to_sacrebleu": long_identical,
        },
        "machine": info,
    }
    print(f"BLEU attnkit {ours.score!r}  sacreBLEU {theirs.score!r}  identical: {identical}")
    print(
        f"best of {args.repeats}: sacreBLEU {min(wall['sacrebleu']):.2f} s, attnkit "
        f"{min(wall['attnkit']):.2f} s wall -> attnkit {result['speedup_wall']}x as fast "
        f"(CPU: {min(cpu['sacrebleu']):.2f} s vs {min(cpu['attnkit']):.2f} s, {result['speedup_cpu']}x)"
    )
    print(
        f"long line ({args.long_words} words), best of {args.repeats}: sacreBLEU "
        f"{min(long_wall['sacrebleu']):.3f} s, attnkit {min(long_wall['attnkit']):.3f} s, "
        f"identical: {long_identical}"
    )
    print(json.dumps(result))
    return 0 if identical and long_identical else 1


def compare(hyps: list[str], refs: list[str], repeats: int):
    """Best-of-``repeats`` wall and CPU times of both sides, their scores, and whether equal."""
    sides = {"sacrebleu": run_sacrebleu, "attnkit": run_attnkit}
    wall = {name: [] for name in sides}
    cpu = {name: [] for name in sides}
    scores = {}
    for rep in range(repeats):
        for name, fn in sides.items():
            t_wall, t_cpu = time.perf_counter(), time.process_time()
            scores[name] = fn(hyps, refs)
            wall[name].append(time.perf_counter() - t_wall)
            cpu[name].append(time.process_time() - t_cpu)
            print(
                f"  run {rep + 1}: {name:9s} wall {wall[name][-1]:7.2f} s  cpu {cpu[name][-1]:7.2f} s",
                flush=True,
            )
    ours, theirs = scores["attnkit"], scores["sacrebleu"]
    identical = (ours.score, ours.counts, ours.totals, ours.sys_len, ours.ref_len, ours.bp) == (
        theirs.score,
        theirs.counts,
        theirs.totals,
        theirs.sys_len,
        theirs.ref_len,
        theirs.bp,
    )
    return wall, cpu, scores, identical


if __name__ == "__main__":
    sys.exit(main())
