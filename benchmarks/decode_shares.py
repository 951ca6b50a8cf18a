"""How ``attnkit evaluate``'s worker processes should share a call: the exponent of
``attnkit.decoding.translate.decode_cost`` (a sentence's cost = its length ** exponent), A/B in
one run.

The default path of ``attnkit evaluate`` (``--threads 2``: two forked worker processes of one
operator thread each) sorts a call's sentences by length and cuts them into one run per worker
of equal summed cost. With equal tokens (exponent 1) the worker given the long sentences took
13% longer than the other on test2016; this script measures the split for several exponents on
the same translations, sides taking turns.

For every exponent, one translator built as ``attnkit evaluate`` builds it (the shipped model
or ``--model DIR``, beam 5, ``--threads``), its workers forked and warmed by a first call of
``--chunk`` sentences; then ``--rounds`` rounds, each translating Multi30k test2016 (1,000
sentences) in calls of ``--chunk`` sentences, every call going to every exponent in turn, the
first rotating. Printed per round: sentences/s of each exponent, and each worker's decoding
seconds (the slower share bounds the call); at the end the medians and the median per-round
ratio of every exponent to the first.

    python benchmarks/decode_shares.py                        # exponents 1.0,1.3 (about 2 min)
    python benchmarks/decode_shares.py --exponents 1.0,1.2,1.3,1.4 --rounds 6
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch
from machine import (  # benchmarks/machine.py
    argument_parser,
    cpu_name,
    floats,
    load_average,
    positive_int,
    thread_count,
    usable_cores,
)

import attnkit.decoding.translate as translate_module
from attnkit.cli import build_parser
from attnkit.cli.commands.translate import build_translator
from attnkit.data import load_named_corpus

_EXPONENT = {"value": translate_module.DECODE_COST_EXPONENT}  # what decode_cost uses now
_TIMES = Path(f"/tmp/attnkit-decode-shares-{os.getpid()}.txt")  # the workers' seconds


def _decode_cost(length: int) -> float:
    return length ** _EXPONENT["value"]


def _timed_part(sources, _inner=translate_module._translate_part):
    """A worker's share, its decoding seconds appended to _TIMES (in the forked worker)."""
    start = time.perf_counter()
    out = _inner(sources)
    with _TIMES.open("a", encoding="utf-8") as f:
        f.write(f"{os.getpid()} {len(sources)} {time.perf_counter() - start:.4f}\n")
    return out


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--exponents", type=floats, default="1.0,1.3",
        help="comma-separated exponents of a sentence's length, each once",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=positive_int, default=5, help="rounds of the sides taking turns"
    )
    parser.add_argument("--chunk", type=positive_int, default=250, help="sentences per call")
    parser.add_argument("--threads", type=thread_count, default=2, help="evaluate's --threads")
    parser.add_argument(
        "--model", default=None, help="a translation model folder (default: the shipped translator)"
    )
    args = parser.parse_args()
    exponents = list(args.exponents)
    lines = load_named_corpus("multi30k", split="test2016", src_lang="de", tgt_lang="en").src

    # Patched before any worker is forked: the workers inherit the timed function, and the
    # split (made in this process) reads the exponent of the side whose turn it is.
    translate_module.decode_cost = _decode_cost
    translate_module._translate_part = _timed_part
    argv = ["evaluate", "--device", "cpu", "--threads", str(args.threads)]
    argv += ["--model", args.model] if args.model else []
    print(
        f"CPU {cpu_name()}; usable cores {usable_cores()}; load average {load_average():.1f}; "
        f"torch {torch.__version__}; attnkit evaluate {' '.join(argv[1:])}; "
        f"{len(lines)} sentences in calls of {args.chunk}, {args.rounds} rounds, turns\n"
    )
    translators = {}
    for e in exponents:
        _EXPONENT["value"] = e
        translators[e] = build_translator(build_parser().parse_args(argv))
        translators[e].translate(lines[: args.chunk])  # fork and warm the workers
    speeds = {e: [] for e in exponents}
    print("| round | " + " | ".join(f"length ** {e}: sentences/s (slower share / faster)"
                                     for e in exponents) + " |")  # fmt: skip
    print("| --- |" + " --- |" * len(exponents))
    try:
        for r in range(args.rounds):
            seconds = dict.fromkeys(exponents, 0.0)
            slow = {e: [] for e in exponents}
            for i, begin in enumerate(range(0, len(lines), args.chunk)):
                k = (r + i) % len(exponents)
                for e in exponents[k:] + exponents[:k]:
                    _EXPONENT["value"] = e
                    _TIMES.write_text("", encoding="utf-8")
                    start = time.perf_counter()
                    translators[e].translate(lines[begin : begin + args.chunk])
                    seconds[e] += time.perf_counter() - start
                    shares = [float(x.split()[2]) for x in _TIMES.read_text().splitlines()]
                    if len(shares) > 1:
                        slow[e].append(max(shares) / min(shares))
            cells = []
            for e in exponents:
                speeds[e].append(len(lines) / seconds[e])
                balance = f"{statistics.median(slow[e]):.2f}" if slow[e] else "-"
                cells.append(f"{speeds[e][-1]:.1f} ({balance})")
            print(f"| {r} | " + " | ".join(cells) + " |", flush=True)
    finally:
        _TIMES.unlink(missing_ok=True)
        for t in translators.values():
            t.close()
    first = exponents[0]
    print()
    for e in exponents:
        ratio = statistics.median(a / b for a, b in zip(speeds[e], speeds[first], strict=True))
        print(
            f"length ** {e}: median {statistics.median(speeds[e]):.1f} sentences/s, "
            f"{ratio:.3f}x length ** {first} (median of the per-round ratios)"
        )
    print(f"load average at the end {load_average():.1f}")


if __name__ == "__main__":
    main()
