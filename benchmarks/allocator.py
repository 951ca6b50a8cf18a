"""The memory allocator under a real training run: `attnkit train` on the C library's malloc
against mimalloc (what the `attnkit` program preloads on Linux, attnkit.allocator).

Each round runs the same command twice, once per allocator (ATTNKIT_ALLOCATOR=system, then
mimalloc; the next round starts with the other one), for a fixed wall-clock budget
(``optim.max_minutes``, validation BLEU off), and reads from each run the steps it made (its
last log line), its peak resident memory and its minor page faults (``os.wait4``, per child).
The steps of a budget are what the allocator is for: a training run's wall clock is fixed
(the shipped translator trains for 57 minutes), so more steps in the same minutes is the
result. Runs take turns, so a host that slows down for a while costs both sides; run nothing
else beside it (a second process on a 2-core machine slows a 2-thread run tenfold).

    python benchmarks/allocator.py --minutes 2 --rounds 3
    python benchmarks/allocator.py --config configs/shakespeare_char_gpt.toml --minutes 1
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import (  # noqa: E402
    argument_parser,
    cpu_name,
    load_average,
    positive_float,
    positive_int,
    usable_cores,
)

ROOT = Path(__file__).resolve().parents[1]
DONE = re.compile(r"done: step (\d+)")
USED = re.compile(r"memory allocator (\w+)")


def run_once(allocator: str, config: Path, minutes: float, out: Path) -> dict:
    """One `attnkit train` run on ``allocator``: its steps, peak RSS (GB), minor faults."""
    # Neither side gets the caller's allocator settings (LD_PRELOAD, glibc's MALLOC_* and
    # tunables, MIMALLOC_*): each runs as a user's `attnkit train` does.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MALLOC_", "MIMALLOC_", "GLIBC_TUNABLES", "_ATTNKIT_ALLOCATOR"))
        and k != "LD_PRELOAD"
    }
    env["ATTNKIT_ALLOCATOR"] = allocator
    command = [
        sys.executable, "-m", "attnkit", "train", "--config", str(config), "--out", str(out),
        "--set", f"optim.max_minutes={minutes}", "--set", "optim.val_bleu=false",
    ]  # fmt: skip
    log = out.with_suffix(".log")
    with open(log, "w", encoding="utf-8") as f:
        child = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(child.pid, 0)
    text = log.read_text(encoding="utf-8", errors="replace")
    steps = DONE.findall(text)
    if os.waitstatus_to_exitcode(status) != 0 or not steps:
        raise SystemExit(f"attnkit train on {allocator} failed; its log: {log}\n{text[-2000:]}")
    used = USED.findall(text)
    if used != [allocator]:  # e.g. the preload failed: the "mimalloc" side ran on glibc
        raise SystemExit(f"asked for {allocator}, the run logged memory allocator {used}")
    # rusage of the child's pid, which `attnkit` keeps when it executes itself again with
    # mimalloc preloaded (the peak RSS survives exec; the faults add up).
    return {
        "steps": int(steps[-1]),
        "rss_gib": usage.ru_maxrss / 2**20,  # KiB on Linux
        "minor_faults": usage.ru_minflt,
    }


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--config",
        type=Path,
        default=ROOT / "configs" / "multi30k_de_en.toml",
        help="training config (default: the shipped translator's)",
    )
    parser.add_argument(
        "--minutes", type=positive_float, default=2.0, help="wall-clock budget of each run"
    )
    parser.add_argument("--rounds", type=positive_int, default=3, help="runs per allocator")
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("the allocator is preloaded on Linux only")
    config = args.config.resolve()

    print(
        f"machine: {cpu_name()}, {usable_cores()} usable cores, load {load_average():.2f}; "
        f"config {args.config.name}, {args.minutes:g} min a run, {args.rounds} rounds"
    )
    results: dict[str, list[dict]] = {"system": [], "mimalloc": []}
    with tempfile.TemporaryDirectory(prefix="attnkit-allocator-") as tmp:
        for r in range(args.rounds):
            order = ["system", "mimalloc"] if r % 2 == 0 else ["mimalloc", "system"]
            for name in order:
                res = run_once(name, config, args.minutes, Path(tmp) / f"{name}{r}")
                results[name].append(res)
                print(
                    f"round {r + 1} {name:8s}: {res['steps']:5d} steps, peak RSS "
                    f"{res['rss_gib']:.2f} GiB, {res['minor_faults']:,} minor page faults",
                    flush=True,
                )
    print()
    print("| allocator | steps (median) | peak RSS GiB (median) | minor page faults (median) |")
    print("| --- | ---: | ---: | ---: |")
    for name, runs in results.items():
        print(
            f"| {name} | {statistics.median(x['steps'] for x in runs):.0f} "
            f"| {statistics.median(x['rss_gib'] for x in runs):.2f} "
            f"| {statistics.median(x['minor_faults'] for x in runs):,.0f} |"
        )
    pairs = zip(results["system"], results["mimalloc"], strict=True)
    ratios = [m["steps"] / s["steps"] for s, m in pairs]
    print(
        f"\nsteps in {args.minutes:g} min, mimalloc / system: median {statistics.median(ratios):.2f}x "
        f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})"
    )


if __name__ == "__main__":
    main()
