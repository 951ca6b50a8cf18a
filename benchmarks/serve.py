"""`attnkit serve` under load: dynamic batching against one request at a time, and overload.

One server process (``attnkit serve`` on 127.0.0.1, a free port, the shipped de-en model,
beam 5) answers, in order:

1. serial: the first ``--sentences`` test2016 German sentences, one request at a time;
2. concurrent: the same sentences from ``--clients`` (64) concurrent clients, one sentence a
   request, each client sending its next sentence when its answer comes;
3. overload: ``--overload-clients`` (256) clients, more than the queue holds
   (``--max-queue``, 64 texts), send ``--overload-requests`` requests: there must be 503s
   (each client has one one-text request in flight, and the texts of the batch being decoded
   have left the queue, so the overload needs well more clients and requests than
   ``--max-queue``; settings with no more than it are refused), the answers must be 200
   or 503 with Retry-After, the server must stay up, and its memory (RSS, sampled every
   50 ms) must come back to its level before the overload (within max(32 MiB, 10%), 5 s
   after);
4. after: the sentences of step 1 again, concurrently: every answer normal.

Every 200 answer must equal the offline translation of its sentence (``attnkit translate
--beam 5`` on the same sentences, run as a separate process; both in ``--dtype`` float32, where
a text's translation does not depend on the texts batched with it, unlike bfloat16's, which
``--dtype auto`` picks on AVX-512 and AMX CPUs): the output counts mismatches
and errors. Throughput = sentences / wall-clock seconds of a step; latency percentiles are per
request (send to answer). Bounded: every request has a timeout, every step a budget
(``--max-seconds`` in all), and the server is stopped (SIGTERM, then SIGKILL) at the end.
The last lines judge the run: each criterion with what the run did, then RESULT: ok or FAIL
(naming the criteria not met).

    python benchmarks/serve.py                       # all 1000 sentences, 64 clients
    python benchmarks/serve.py --sentences 200 --overload-requests 500   # a quick look

The machine's load average is printed: on a shared machine the numbers move with it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from machine import (  # benchmarks/machine.py
    argument_parser,
    cpu_name,
    load_average,
    positive_float,
    positive_int,
    thread_count,
    usable_cores,
)

from attnkit.cli.options import real
from attnkit.data import load_named_corpus
from attnkit.serve.settings import DTYPES  # the server's --dtype choices

BEAM = 5
SETTLE_SECONDS = 5.0  # after the overload, before its memory is read again
MEMORY_SLACK_MIB = 32  # "back to its level": within max(32 MiB, 10%) of the RSS before
THROUGHPUT_TARGET = 3.0  # concurrent clients' sentences/s over one request at a time


@dataclass
class Step:
    """What one step measured."""

    name: str
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # of 200 answers
    statuses: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # transport errors, bad 503s, ...
    mismatches: int = 0  # 200 answers that differ from the offline translation
    answered: int = 0  # 200 answers

    def count(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


# --------------------------------------------------------------------------- server


class Server:
    """``attnkit serve`` in a subprocess; its URL once it listens, its RSS on demand."""

    def __init__(self, args: argparse.Namespace) -> None:
        command = [
            sys.executable, "-m", "attnkit", "serve", "--port", "0", "--bert-model", "none",
            "--gpt-model", "none",  # the translator alone, as docs/benchmarks.md measured
            "--max-queue", str(args.max_queue), "--max-wait-ms", str(args.max_wait_ms),
            "--max-texts", str(min(64, args.max_queue)), "--dtype", args.dtype,
        ]  # fmt: skip
        if args.threads:
            command += ["--threads", str(args.threads)]
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        self.url: str | None = None
        self.log: list[str] = []
        found = threading.Event()

        def read() -> None:
            for line in self.proc.stderr:
                self.log.append(line)
                match = re.search(r"listening on (http://\S+:\d+)", line)
                if match:
                    self.url = match.group(1)
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        found.wait(120)
        if self.url is None:
            self.stop()
            raise SystemExit("attnkit serve did not start:\n" + "".join(self.log))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=10).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SystemExit("attnkit serve did not become ready in 300 s")

    def rss_mib(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return kib / 1024

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(60)
        return self.proc.returncode


# --------------------------------------------------------------------------- clients


async def drive(url, jobs, expected, clients: int, step: Step, budget: float, timeout: float):
    """``clients`` concurrent clients send ``jobs`` (sentence indices), one a request."""
    queue = list(jobs)[::-1]
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    deadline = time.monotonic() + budget

    async def client(http: httpx.AsyncClient) -> None:
        while queue and time.monotonic() < deadline:
            i = queue.pop()
            start = time.perf_counter()
            try:
                r = await http.post("/v1/translate", json={"texts": [expected[i][0]], "beam": BEAM})
            except httpx.HTTPError as err:
                step.errors.append(f"{type(err).__name__}: {err}")
                continue
            step.count(r.status_code)
            if r.status_code == 200:
                step.latencies.append(time.perf_counter() - start)
                step.answered += 1
                if r.json()["translations"] != [expected[i][1]]:
                    step.mismatches += 1
            elif r.status_code == 503 and r.headers.get("retry-after"):
                pass  # refused as designed
            else:
                step.errors.append(f"HTTP {r.status_code}: {r.text[:200]}")

    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        step.seconds = time.perf_counter() - start
    if queue:
        step.errors.append(f"budget of {budget:.0f} s spent with {len(queue)} requests unsent")


def offline_translations(sentences: list[str], dtype: str) -> list[str]:
    """`attnkit translate --beam 5 --dtype DTYPE` on the sentences, as a separate process."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src.de"
        src.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
        done = subprocess.run(
            [sys.executable, "-m", "attnkit", "translate", "--input", str(src), "--beam", str(BEAM),
             "--dtype", dtype],
            capture_output=True, text=True, timeout=1800, check=True,
        )  # fmt: skip
    lines = done.stdout.splitlines()
    assert len(lines) == len(sentences), (len(lines), len(sentences))
    return lines


class MemorySampler:
    """The server's RSS every ``every`` seconds, in a thread, while in a ``with`` block."""

    def __init__(self, server: Server, every: float = 0.05) -> None:
        self.server, self.every, self.samples = server, every, []
        self._stop = threading.Event()

    def __enter__(self):
        def run() -> None:
            while not self._stop.is_set() and self.server.alive():
                self.samples.append(self.server.rss_mib())
                time.sleep(self.every)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------- report


def report(step: Step, sentences: int | None = None) -> None:
    lat = step.latencies
    rate = step.answered / step.seconds if step.seconds else float("nan")
    statuses = ", ".join(f"{k}: {v}" for k, v in sorted(step.statuses.items()))
    print(
        f"{step.name:<11} {step.answered:>5} answered in {step.seconds:7.2f} s = {rate:7.2f} "
        f"sentences/s | latency p50 {percentile(lat, 50) * 1000:7.0f} ms, p99 "
        f"{percentile(lat, 99) * 1000:7.0f} ms | statuses {{{statuses}}} | errors "
        f"{len(step.errors)} | mismatches {step.mismatches}"
    )
    for err in step.errors[:5]:
        print(f"    error: {err}")


def criteria(
    steps: list[Step],
    *,
    ratio: float,
    clients: int,
    alive: bool,
    memory: tuple[float, float],
    sentences: int,
) -> list[tuple[str, str, bool]]:
    """Each criterion of the run: (what it asks, what the run did, whether it is met).
    ``steps``: serial, concurrent, overload and after; ``memory``: the server's RSS (MiB)
    before the overload and SETTLE_SECONDS after it."""
    overload, after = steps[2], steps[3]
    errors = sum(len(s.errors) for s in steps)
    mismatches = sum(s.mismatches for s in steps)
    per_step = ", ".join(f"{s.name} {len(s.errors)}/{s.mismatches}" for s in steps)
    refused, sent = overload.statuses.get(503, 0), sum(overload.statuses.values())
    before, later = memory
    slack = max(MEMORY_SLACK_MIB, 0.1 * before)
    return [
        (f"throughput >= {THROUGHPUT_TARGET:g}x", f"{clients} clients / one at a time = "
         f"{ratio:.2f}x", ratio >= THROUGHPUT_TARGET),
        ("0 errors and 0 mismatches", f"{errors} errors, {mismatches} mismatches (errors/"
         f"mismatches: {per_step})", errors == 0 and mismatches == 0),
        ("503s under overload", f"{refused} of {sent} answered overload requests refused",
         refused > 0),
        ("server alive", "alive" if alive else "exited", alive),
        (f"memory back within {slack:.0f} MiB", f"{later:.0f} MiB {SETTLE_SECONDS:g} s after "
         f"the overload, {before:.0f} MiB before ({later - before:+.0f} MiB)",
         later <= before + slack),
        ("every sentence answered after", f"{after.answered} of {sentences} answered",
         after.answered == sentences),
    ]  # fmt: skip


def verdict(judged: list[tuple[str, str, bool]]) -> list[str]:
    """The lines that end the output: every criterion, then RESULT naming the ones not met."""
    lines = [f"{'met' if ok else 'NOT MET'}: {asked}: {did}" for asked, did, ok in judged]
    failed = [asked for asked, _, ok in judged if not ok]
    if failed:
        return [*lines, f"RESULT: FAIL ({len(failed)} not met: {'; '.join(failed)})"]
    return [*lines, f"RESULT: ok ({', '.join(asked for asked, _, _ in judged)})"]


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--sentences", type=positive_int, default=1000,
        help="the first N test2016 sentences (1000: all)",
    )  # fmt: skip
    parser.add_argument(
        "--clients", type=positive_int, default=64,
        help="concurrent clients of the throughput test",
    )  # fmt: skip
    parser.add_argument(
        "--max-queue", type=positive_int, default=64,
        help="the server's queue (texts waiting for a batch; beyond it: 503)",
    )  # fmt: skip
    parser.add_argument(
        "--max-wait-ms", type=real(0, 60_000), default=10.0,
        help="the server's --max-wait-ms (how long a batch waits to fill)",
    )  # fmt: skip
    parser.add_argument(
        "--overload-clients", type=positive_int, default=256,
        help="concurrent clients of the overload test, each with one one-text request in "
        "flight: more than --max-queue, or no request is refused (the texts being decoded "
        "have left the queue, so well more: 4x by default)",
    )  # fmt: skip
    parser.add_argument(
        "--overload-requests", type=positive_int, default=2000,
        help="requests of the overload test: more than --max-queue, as --overload-clients",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", choices=DTYPES, default="float32",
        help="the server's and the offline translation's --dtype",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=thread_count, default=None, help="the server's torch threads"
    )
    parser.add_argument(
        "--max-seconds", type=positive_float, default=1800, help="budget of the whole run"
    )
    args = parser.parse_args()
    for flag in ("overload_clients", "overload_requests"):
        if getattr(args, flag) <= args.max_queue:
            parser.error(
                f"argument --{flag.replace('_', '-')}: {getattr(args, flag)} cannot fill the "
                f"server's queue of {args.max_queue} texts (--max-queue), so no request would "
                f"be refused: expected more than {args.max_queue}"
            )
    started = time.monotonic()

    def budget() -> float:
        return max(1.0, args.max_seconds - (time.monotonic() - started))

    corpus = load_named_corpus("multi30k", split="test2016", src_lang="de", tgt_lang="en")
    sentences = corpus.src[: args.sentences]
    print(f"machine: {cpu_name()}, {usable_cores()} usable cores, load average "
          f"{load_average():.2f} at the start; Python {sys.version.split()[0]}")  # fmt: skip
    print(f"setup: {len(sentences)} test2016 sentences, beam {BEAM}, shipped de-en model; server "
          f"--max-queue {args.max_queue} --max-wait-ms {args.max_wait_ms}; 127.0.0.1")  # fmt: skip
    t = time.perf_counter()
    expected = list(zip(sentences, offline_translations(sentences, args.dtype), strict=True))
    print(f"offline `attnkit translate --beam {BEAM} --dtype {args.dtype}`: {time.perf_counter() - t:.1f} s "
          f"(process start and model load included)")  # fmt: skip

    server = Server(args)
    try:
        jobs = range(len(sentences))
        warm = Step("warm-up")
        asyncio.run(drive(server.url, range(8), expected, 8, warm, budget(), 300))
        serial = Step("serial")
        asyncio.run(drive(server.url, jobs, expected, 1, serial, budget(), 300))
        report(serial)
        concurrent = Step("concurrent")
        asyncio.run(drive(server.url, jobs, expected, args.clients, concurrent, budget(), 300))
        report(concurrent)
        one_at_a_time = serial.answered / serial.seconds if serial.answered else 0.0
        ratio = concurrent.answered / concurrent.seconds / one_at_a_time if one_at_a_time else 0.0
        print(
            f"throughput: {args.clients} clients / one at a time = {ratio:.2f}x "
            f"(target >= {THROUGHPUT_TARGET:g}x)"
        )

        time.sleep(1.0)
        before = server.rss_mib()
        overload = Step("overload")
        many = [i % len(sentences) for i in range(args.overload_requests)]
        with MemorySampler(server) as memory:
            asyncio.run(
                drive(server.url, many, expected, args.overload_clients, overload, budget(), 300)
            )
        report(overload)
        time.sleep(SETTLE_SECONDS)
        after_rss = server.rss_mib()
        peak = max(memory.samples, default=float("nan"))
        print(f"memory (RSS): {before:.0f} MiB before the overload, peak {peak:.0f} MiB, "
              f"{after_rss:.0f} MiB {SETTLE_SECONDS:.0f} s after ({after_rss - before:+.0f} MiB); "
              f"server alive: {server.alive()}")  # fmt: skip
        after = Step("after")
        asyncio.run(drive(server.url, jobs, expected, args.clients, after, budget(), 300))
        report(after)
        judged = criteria(
            [serial, concurrent, overload, after], ratio=ratio, clients=args.clients,
            alive=server.alive(), memory=(before, after_rss), sentences=len(sentences),
        )  # fmt: skip
    finally:
        status = server.stop()
        print(f"server stopped with SIGTERM: exit status {status}; load average "
              f"{load_average():.2f} at the end; {time.monotonic() - started:.0f} s in all")  # fmt: skip
    print("\n".join(verdict(judged)))
    return 0 if all(ok for _, _, ok in judged) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
