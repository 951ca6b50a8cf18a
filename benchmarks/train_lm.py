"""Language-model training on Shakespeare: attnkit's GPT and trainer step vs a plain PyTorch
GPT built as nanoGPT builds its model, both in one run.

The baseline (``NanoGPT`` below) is karpathy/nanoGPT's ``model.py`` reduced to training: a
fused QKV ``nn.Linear``, ``F.scaled_dot_product_attention(is_causal=True)``, a GELU MLP,
pre-LN blocks, a tied head over every position and ``F.cross_entropy``; AdamW with nanoGPT's
weight-decay groups (matrices decayed, biases and LayerNorms not), float32, as its README's
CPU recipe runs it. attnkit's side is the trainer's step for ``task = "lm"``: the GPT of
``attnkit.models`` behind ``LMLoss`` (the output projection fused with the loss), attnkit's
optimizer, and the config's autocast (``auto``: bf16 on a CPU with fast bf16, else float32).

Two measurements:

* throughput (default): the same model size and batch (the config's [model] and
  data.batch_size, context = the model's), the same windows from ``RandomWindows``, rounds of
  steps alternating between the two sides in one process (a shared machine's load affects
  both alike); training tokens/s and their ratio.
* ``--budget-minutes M``: each side trains its own recipe for M minutes of wall time, one after
  the other -- the baseline nanoGPT's CPU recipe (4 layers, 4 heads, width 128, context 64,
  batch 12, lr 1e-3 with 100 warmup steps and cosine decay to 1e-4 over 2,000 iterations,
  AdamW beta2 0.99, weight decay 0.1, clip 1.0, dropout 0, float32), attnkit the config's --
  then both are scored on the whole validation text (nats per character, every token after a
  newline, windows of each model's context).

    python benchmarks/train_lm.py --config configs/shakespeare_char_gpt.toml --steps 20

Measured (AMD EPYC, AVX-512 with bf16, 1 thread per side on a busy 2-core machine, attnkit in
bf16 autocast): 2.02x at the char config's size (4 layers of 256, context 128, batch 32:
8,386 vs 4,148 tok/s), 2.21x at the BPE config's (7,922 vs 3,580), 1.31x at nanoGPT's CPU
recipe size (4 layers of 128, context 64, batch 12: 17,184 vs 13,162), where per-step overhead
outweighs the matmuls.
    python benchmarks/train_lm.py --config configs/shakespeare_char_gpt.toml --budget-minutes 10
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.data.corpus import load_named_text
from attnkit.data.lm import RandomWindows, eval_batches
from attnkit.data.lm_tokenizer import newline_id, train_lm_tokenizer
from attnkit.models import GPT, GPTConfig
from attnkit.models.gpt_tokenizer import GPTTokenizer
from attnkit.training import TrainConfig, build_optimizer
from attnkit.training.lm import LMLoss
from attnkit.training.precision import autocast_context, cpu_has_fast_bf16, resolve_autocast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import (  # noqa: E402
    add_config_arguments,
    argument_parser,
    check_steps,
    cpu_name,
    load_average,
    non_negative_float,
    non_negative_int,
    positive_int,
    split_evenly,
    threads_or_zero,
    usable_cores,
)

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the baseline


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)  # query, key, value in one matmul
        self.c_proj = nn.Linear(d, d)
        self.heads = heads

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(b, t, c)  # (B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, d_ff), nn.GELU(), nn.Linear(d_ff, d))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """nanoGPT's GPT (dropout 0, biases on), returning the mean cross-entropy."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.d_model)
        self.wpe = nn.Embedding(c.context_length, c.d_model)
        self.h = nn.ModuleList(Block(c.d_model, c.num_heads, c.d_ff) for _ in range(c.num_layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * c.num_layers) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: Tensor, targets: Tensor) -> Tensor:
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def nanogpt_optimizer(model: nn.Module, lr: float, weight_decay: float, betas) -> torch.optim.AdamW:
    """nanoGPT's configure_optimizers: decay the matrices, not the biases and LayerNorms."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)  # fused only on CUDA in nanoGPT


def nanogpt_lr(it: int, lr=1e-3, min_lr=1e-4, warmup=100, decay_iters=2000) -> float:
    """nanoGPT's get_lr: linear warmup, cosine decay to min_lr, then min_lr."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup) / (decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


# --------------------------------------------------------------------------- shared parts


def val_nats_per_char(model_nats, tokenizer, text: str, context: int, bos: int) -> float:
    """Total nats of every token of ``text`` (after ``bos``) / its characters."""
    ids = tokenizer.encode(text)
    nats = 0.0
    with torch.no_grad():
        for batch in eval_batches(ids, context, 32, bos):
            nats += model_nats(batch.inputs, batch.targets)
    return nats / len(text)


def describe(threads: int, dtype) -> str:
    return (
        f"cpu: {cpu_name()}, {usable_cores()} usable cores, capability "
        f"{torch.backends.cpu.get_cpu_capability()}, fast bf16 {cpu_has_fast_bf16()}; "
        f"torch {torch.__version__}, {threads} threads; attnkit autocast -> "
        f"{dtype or 'float32'}; load average {load_average():.2f}"
    )


def throughput(args, config: TrainConfig, tokenizer: GPTTokenizer, train_ids: Tensor, dtype):
    m = config.model
    o = config.optim
    windows = RandomWindows(
        train_ids, context=m.context_length, batch_size=config.data.batch_size, seed=0
    )
    batches = [windows.batch(0, i) for i in range(args.warmup + args.steps)]
    torch.manual_seed(0)
    gpt = GPT(m)
    torch.manual_seed(0)
    plain = NanoGPT(m)
    ours = LMLoss(gpt)
    opt_ours = build_optimizer(gpt, o)
    for group in opt_ours.param_groups:
        group["lr"] = 1e-4  # a fixed small lr: the schedule does not affect speed
    opt_plain = nanogpt_optimizer(plain, 1e-4, 0.1, (0.9, 0.99))
    tokens = batches[0].num_tokens
    print(
        f"model: {m.num_layers} layers, width {m.d_model}, {m.num_heads} heads, d_ff {m.d_ff}, "
        f"context {m.context_length}, vocab {m.vocab_size}, batch {config.data.batch_size} "
        f"({tokens} tokens a step); parameters attnkit {gpt.num_parameters() / 1e6:.3f}M, "
        f"nanoGPT {sum(p.numel() for p in plain.parameters()) / 1e6:.3f}M",
        flush=True,
    )

    def step_ours(batch) -> None:
        with autocast_context(torch.device("cpu"), dtype):
            loss = ours(batch.inputs, batch.targets, o.label_smoothing)
        (loss / batch.num_tokens).backward()
        nn.utils.clip_grad_norm_(gpt.parameters(), 1.0, foreach=True)
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)

    def step_plain(batch) -> None:
        # nanoGPT's get_batch stacks x and y as two contiguous tensors
        plain(batch.inputs.contiguous(), batch.targets.contiguous()).backward()
        nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
        opt_plain.step()
        opt_plain.zero_grad(set_to_none=True)

    sides = {"attnkit": step_ours, "nanoGPT": step_plain}
    for step in sides.values():
        for batch in batches[: args.warmup]:
            step(batch)
    seconds = {name: [] for name in sides}
    timed = batches[args.warmup :]
    for r, chunk in enumerate(split_evenly(timed, args.rounds)):
        for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            start = time.perf_counter()
            for batch in chunk:
                sides[name](batch)
            seconds[name].append(time.perf_counter() - start)
        print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{n} {len(chunk) * tokens / seconds[n][-1]:.0f} tok/s" for n in sides),
            flush=True,
        )
    rate = {n: len(timed) * tokens / sum(s) for n, s in seconds.items()}
    for n in sides:
        print(f"{n:>8}: {rate[n]:8.0f} training tok/s")
    per_round_ratio = statistics.median(
        p / a for a, p in zip(seconds["attnkit"], seconds["nanoGPT"], strict=True)
    )
    print(
        f"   ratio: {rate['attnkit'] / rate['nanoGPT']:.2f}x attnkit / nanoGPT (median of "
        f"per-round ratios {per_round_ratio:.2f}x); load average at end {load_average():.2f}"
    )


def budget(args, config: TrainConfig, val: str) -> None:
    """Each side's recipe for --budget-minutes, then nats/char on the validation text."""
    import tempfile

    from attnkit.training.trainer import train

    seconds = 60.0 * args.budget_minutes
    train_text = load_named_text("shakespeare", "train")
    tok = GPTTokenizer(train_lm_tokenizer("char", train_text))
    bos = newline_id(tok.tokenizer)
    base = GPTConfig(
        vocab_size=tok.vocab_size, context_length=64, d_model=128, num_heads=4, num_layers=4,
        d_ff=512, dropout=0.0, attn_dropout=0.0, embed_dropout=0.0, bos_token_id=bos,
        eos_token_id=None,
    )  # fmt: skip
    windows = RandomWindows(torch.tensor(tok.encode(train_text)), context=64, batch_size=12)
    torch.manual_seed(1337)
    plain = NanoGPT(base)
    opt = nanogpt_optimizer(plain, 1e-3, 0.1, (0.9, 0.99))
    start, it = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        for group in opt.param_groups:
            group["lr"] = nanogpt_lr(it)
        batch = windows.batch(it // windows.batches_per_epoch, it % windows.batches_per_epoch)
        plain(batch.inputs.contiguous(), batch.targets.contiguous()).backward()
        nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        it += 1
    plain.eval()

    def plain_nats(inputs, targets):
        return float(plain(inputs.contiguous(), targets.contiguous())) * targets.numel()

    baseline = val_nats_per_char(plain_nats, tok, val, 64, bos)
    print(f"nanoGPT recipe: {it} iterations in {args.budget_minutes} min, val {baseline:.4f} "
          f"nats/char", flush=True)  # fmt: skip

    out = Path(tempfile.mkdtemp(prefix="train_lm_bench_"))
    budgeted = config.with_overrides(
        [
            f"optim.max_minutes={args.budget_minutes}",
            "optim.max_steps=0",
            "optim.max_epochs=0",
            f"optim.threads={torch.get_num_threads()}",  # the threads the baseline had
        ]
    )
    result = train(budgeted, out / "run", progress=False)
    ours = result.metrics["val_nats_per_char"]
    print(f"attnkit recipe: {result.step} steps, val {ours:.4f} nats/char (run in {out})")
    print(f"attnkit - nanoGPT: {ours - baseline:+.4f} nats/char")


def main() -> int:
    parser = argument_parser(__doc__)
    add_config_arguments(parser, str(ROOT / "configs" / "shakespeare_char_gpt.toml"))
    parser.add_argument(
        "--steps", type=positive_int, default=20,
        help="timed steps per side, shared among the rounds as evenly as possible (at least "
        "one a round)",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=positive_int, default=4, help="alternations of the two sides"
    )
    parser.add_argument(
        "--warmup",
        type=non_negative_int,
        default=2,
        help="untimed steps per side (0: the first timed steps run cold)",
    )
    parser.add_argument("--threads", type=threads_or_zero, default=0, help="0 = the usable cores")
    parser.add_argument(
        "--budget-minutes",
        type=non_negative_float,
        default=0.0,
        help="minutes each side trains its own recipe, then both are scored (0: the step comparison only)",
    )
    args = parser.parse_args()
    check_steps(parser, args.steps, args.rounds)

    config = TrainConfig.from_toml(args.config, args.overrides)
    if config.task != "lm":
        raise SystemExit(f"{args.config}: task = {config.task!r}, expected a task = 'lm' config")
    threads = args.threads or usable_cores()
    torch.set_num_threads(int(threads))
    dtype = resolve_autocast(config.optim.autocast, torch.device("cpu"))
    print(describe(threads, dtype), flush=True)
    if args.budget_minutes:
        budget(args, config, load_named_text("shakespeare", "val"))
        return 0
    text = load_named_text("shakespeare", "train")
    d = config.data
    tokenizer = GPTTokenizer(
        train_lm_tokenizer(
            d.tokenizer, text, vocab_size=d.vocab_size, min_frequency=d.min_frequency
        )
    )
    train_ids = torch.tensor(tokenizer.encode(text[:1_000_000]))
    model = replace(
        config.model, vocab_size=tokenizer.vocab_size, bos_token_id=None, eos_token_id=None,
        dropout=0.0, attn_dropout=0.0, embed_dropout=0.0, activation="gelu",
    )  # fmt: skip
    throughput(args, replace(config, model=model), tokenizer, train_ids, dtype)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
