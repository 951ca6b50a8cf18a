"""Speed and memory of attnkit's attention against what a user would pick instead.

Run:  .venv/bin/python benchmarks/attention.py [--quick]

1. MultiHeadAttention forward+backward, B=8, T=512, d_model=512, 8 heads, float32 and bfloat16:
   attnkit vs torch.nn.MultiheadAttention (batch_first, need_weights=False) vs the same
   projections calling torch's fused scaled_dot_product_attention directly.
2. Long context, T=16,384, one sequence, 8 heads of 64, causal, no weights: peak resident
   memory of attnkit's core vs torch's fused attention, each in a fresh process.
3. Achieved GFLOP/s of the core at T=2048 next to a large matmul on the same cores.
All sides run in this one script; the machine is printed with the results.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from machine import cpu_name, positive_int  # noqa: E402  (benchmarks/machine.py)

import attnkit


def machine() -> str:
    cpu = cpu_name()
    return (
        f"{platform.platform()} | CPU {cpu} | torch {torch.__version__} | "
        f"threads {torch.get_num_threads()} | capability "
        f"{torch.backends.cpu.get_cpu_capability()}"
    )


def timeit(fn, *, warmup: int, reps: int) -> float:
    """Median seconds of ``fn()`` over ``reps`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_mha(dtype: torch.dtype, *, batch: int, seq: int, reps: int) -> dict:
    d_model, heads = 512, 8
    torch.manual_seed(0)
    ours = attnkit.MultiHeadAttention(d_model, heads).to(dtype)
    theirs = torch.nn.MultiheadAttention(d_model, heads, batch_first=True).to(dtype)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.in_proj.weight)
        theirs.in_proj_bias.copy_(ours.in_proj.bias)
        theirs.out_proj.load_state_dict(ours.out_proj.state_dict())
    x = torch.randn(batch, seq, d_model, dtype=dtype, requires_grad=True)

    def direct() -> torch.Tensor:
        # What a user writes by hand: the same projections around torch's fused kernel.
        b, t, _ = x.shape
        qkv = F.linear(x, ours.in_proj.weight, ours.in_proj.bias)  # (B, T, 3D)
        q, k, v = qkv.view(b, t, 3, heads, d_model // heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, hd)
        return F.linear(
            out.transpose(1, 2).reshape(b, t, d_model), ours.out_proj.weight, ours.out_proj.bias
        )

    sides = {
        "attnkit": lambda: ours(x).output,
        "torch.nn.MultiheadAttention": lambda: theirs(x, x, x, need_weights=False)[0],
        "direct fused SDPA": direct,
    }
    return interleaved(
        {name: (lambda fwd=fwd: fwd().sum().backward()) for name, fwd in sides.items()},
        warmup=1 if dtype == torch.bfloat16 else 2,
        reps=reps,
    )


def interleaved(fns: dict, *, warmup: int, reps: int) -> dict:
    """Median seconds per side, the sides taking turns so that load on the machine hits all."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    names = list(fns)
    for rep in range(reps):
        # Rotate who goes first: the side after another's backward pass pays for its memory
        # traffic, and a fixed order would charge that to the same side every time.
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            fn = fns[name]
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _vm_hwm_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def long_context_child(side: str, seq: int) -> None:
    """Runs in a fresh process: prints the peak RSS growth of one causal attention forward."""
    heads, hd = 8, 64

    def attend(q, k, v):
        if side == "attnkit":
            return attnkit.scaled_dot_product_attention(q, k, v, causal=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    attend(*(torch.randn(1, heads, 128, hd) for _ in range(3)))  # first-call set-up, both sides
    q, k, v = (torch.randn(1, heads, seq, hd) for _ in range(3))
    # Reset the kernel's peak-RSS mark (VmHWM) to the current RSS, so the peak below is the
    # attention call's own, not the import of torch.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _vm_hwm_kib()
    t = time.perf_counter()
    out = attend(q, k, v)
    elapsed = time.perf_counter() - t
    peak = _vm_hwm_kib()
    print(
        json.dumps(
            {
                "peak_growth_mib": (peak - base) / 1024,
                "seconds": elapsed,
                "out_mib": out.numel() * 4 / 2**20,
            }
        )
    )


def bench_long_context(seq: int) -> dict:
    results = {}
    for side in ("attnkit", "torch fused"):
        proc = subprocess.run(
            [sys.executable, __file__, "--child", side, "--seq", str(seq)],
            capture_output=True,
            text=True,
            check=True,
        )
        results[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    return results


def bench_gflops(seq: int, reps: int) -> dict:
    heads, hd = 8, 64
    q, k, v = (torch.randn(1, heads, seq, hd) for _ in range(3))
    secs = timeit(lambda: attnkit.scaled_dot_product_attention(q, k, v), warmup=2, reps=reps)
    attn_flop = 4 * heads * seq * seq * hd  # QK^T and PV, 2 flop per multiply-add
    n = 4096
    a, b = torch.randn(n, n), torch.randn(n, n)
    mm_secs = timeit(lambda: a @ b, warmup=1, reps=reps)
    return {
        "attention_gflops": attn_flop / secs / 1e9,
        "attention_seconds": secs,
        "matmul_gflops": 2 * n**3 / mm_secs / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, smaller bf16")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--seq", type=positive_int, default=16384, help=argparse.SUPPRESS)
    parser.add_argument("--skip-bf16", action="store_true", help="skip the bfloat16 MHA run")
    args = parser.parse_args()
    if args.child:
        long_context_child(args.child, args.seq)
        return

    print(f"machine: {machine()}")
    reps = 3 if args.quick else 7
    dtypes = [torch.float32] if args.skip_bf16 else [torch.float32, torch.bfloat16]
    for dtype in dtypes:
        r = bench_mha(dtype, batch=8, seq=512, reps=reps if dtype == torch.float32 else 2)
        ours = r["attnkit"]
        print(f"\n[1] MultiHeadAttention fwd+bwd B=8 T=512 d_model=512 heads=8 {dtype}")
        for name, secs in r.items():
            print(
                f"    {name:30s} {secs * 1e3:9.1f} ms   attnkit speed / this = {secs / ours:5.3f}x"
            )

    r = bench_long_context(args.seq)
    print(
        f"\n[2] causal attention, T={args.seq}, 1 sequence, 8 heads x 64, no weights, "
        "fresh process each"
    )
    for name, d in r.items():
        print(
            f"    {name:12s} peak RSS growth {d['peak_growth_mib']:8.1f} MiB "
            f"(output alone {d['out_mib']:.0f} MiB)  {d['seconds']:.1f} s"
        )
    ratio = r["attnkit"]["peak_growth_mib"] / max(r["torch fused"]["peak_growth_mib"], 1e-9)
    tt = 8 * args.seq * args.seq * 4 / 2**30
    print(
        f"    attnkit / torch peak = {ratio:.3f}x; the seed formula's T x T weights alone "
        f"would need {tt:.1f} GiB"
    )

    g = bench_gflops(2048, reps)
    print(
        "\n[3] core attention T=2048, 8 heads x 64, float32: "
        f"{g['attention_gflops']:.1f} GFLOP/s ({g['attention_seconds'] * 1e3:.1f} ms); "
        f"4096^2 matmul: {g['matmul_gflops']:.1f} GFLOP/s; ratio "
        f"{g['attention_gflops'] / g['matmul_gflops']:.2f}"
    )


if __name__ == "__main__":
    main()
