"""Training throughput: attnkit's Transformer and trainer step against a plain torch.nn.Transformer,
and the model FLOPs utilisation (MFU) of each, in one run.

Three sides train on the same batches (the first batches of epoch 0 from attnkit's
TokenBatchSampler over Multi30k with the config's max_tokens), with the same autocast (the
config's, ``auto`` = bf16 on a CPU with fast bf16, else float32), the same fused Adam
(attnkit.training.build_optimizer, a fixed small lr) and the same gradient clipping:

* ``attnkit``: the config as it is. ``attnkit.training.SequenceLoss`` (the trainer's forward):
  attention through attnkit.attention, the output projection only for the real target tokens
  fused with seed 003's label-smoothed cross-entropy (``linear_cross_entropy``). The shipped
  config drops embeddings and residual branches (0.3) but not attention weights or FFN
  activations (``attn_dropout = ffn_dropout = 0``, fairseq's defaults).
* ``attnkit-matched``: the same model with dropout where torch.nn has it and at its rate
  (``--matched-dropout``, default 0.1, nn.Transformer's default: model.dropout, attn_dropout
  and ffn_dropout).
* ``torch.nn``: the model as a user writes it with torch.nn's defaults: ``nn.Embedding`` *
  sqrt(d_model) + sinusoidal positions + ``nn.Dropout(0.1)`` (the PyTorch tutorial's
  PositionalEncoding) -> ``nn.Transformer(d_model, nhead, num_encoder_layers,
  num_decoder_layers, dim_feedforward, batch_first=True)`` with every other argument at its
  default (dropout 0.1 on attention weights, FFN activations and residual branches; post-LN;
  ReLU) and key-padding plus causal masks -> tied ``nn.Linear`` over every position ->
  ``nn.CrossEntropyLoss(ignore_index=pad, label_smoothing=...)``. ``--plain-norm-first`` gives
  it the config's pre-LN instead (the same FLOPs: nn.Transformer has final norms either way).

Timing: after ``--warmup`` untimed steps per side, rounds of steps alternate between the sides
in one process (each round starts with the next side), so a shared machine's load falls on all
of them alike. Throughput counts target tokens, the words and eos of ``tgt_out`` (padding not
counted), per second; the tables report medians over rounds and the median of the per-round
ratios.

MFU: model FLOPs per second over the rate of bf16 (or float32) matmuls of the model's shapes on
the same cores and threads, measured in every round between the sides. Model FLOPs of a batch
count only real tokens: 6 x (the weights each token multiplies) x tokens, i.e. every encoder
weight for each source token, every decoder weight and the output projection for each target
token (cross-attention's key/value projection for each source token), plus attention: 12 x
d_model per (query, key) pair a real query may attend to (source self-attention S^2, causal
T(T+1)/2, cross T x S per sentence and layer). Embedding lookups, norms and the softmax count
nothing. Both sides are credited with the same FLOPs per batch, so their MFU ratio is their
speed ratio (torch.nn also computes on padding; that work is not counted).

    python benchmarks/train.py --tokenizer TOK.json --steps 20 --rounds 5 --threads 2
    python benchmarks/train.py --steps 4 --rounds 2 --autocast none
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit.data import Batch, Collator, SubwordTokenizer, TokenBatchSampler
from attnkit.models.transformer import Transformer, TransformerConfig
from attnkit.training import SequenceLoss, TrainConfig, build_optimizer
from attnkit.training.datasets import encode, load_text, train_tokenizer
from attnkit.training.precision import autocast_context, cpu_has_fast_bf16, resolve_autocast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import (  # noqa: E402
    add_config_arguments,
    argument_parser,
    check_steps,
    cpu_name,
    isa_caps,
    load_average,
    names_from,
    non_negative_int,
    positive_int,
    split_evenly,
    threads_or_zero,
    usable_cores,
)

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("attnkit", "attnkit-matched", "torch.nn")
AUTOCAST = ("auto", "bf16", "fp16", "none")  # attnkit.training.precision.resolve_autocast's
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


# --------------------------------------------------------------------------- the baseline


class PlainTransformer(nn.Module):
    """The textbook model: embeddings + sinusoids -> nn.Transformer -> tied output layer."""

    def __init__(self, c: TransformerConfig, *, norm_first: bool = False) -> None:
        super().__init__()
        self.pad_id, self.scale = c.pad_id, math.sqrt(c.d_model)
        self.embed = nn.Embedding(c.src_vocab_size, c.d_model, padding_idx=c.pad_id)
        position = torch.arange(c.max_len).unsqueeze(1)  # (T, 1)
        div = torch.exp(torch.arange(0, c.d_model, 2) * (-math.log(10000.0) / c.d_model))
        pe = torch.zeros(c.max_len, c.d_model)
        pe[:, 0::2] = torch.sin(position * div)
        pe[:, 1::2] = torch.cos(position * div)
        self.register_buffer("pe", pe, persistent=False)  # (T_max, d_model)
        self.dropout = nn.Dropout(0.1)
        self.transformer = nn.Transformer(
            d_model=c.d_model,
            nhead=c.num_heads,
            num_encoder_layers=c.num_encoder_layers,
            num_decoder_layers=c.num_decoder_layers,
            dim_feedforward=c.d_ff,
            batch_first=True,
            norm_first=norm_first,
        )
        self.output = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self.output.weight = self.embed.weight

    def _embed(self, ids: Tensor) -> Tensor:
        return self.dropout(self.embed(ids) * self.scale + self.pe[: ids.shape[1]])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1])  # (T, T)
        hidden = self.transformer(
            self._embed(src),
            self._embed(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src == self.pad_id,
            tgt_key_padding_mask=tgt_in == self.pad_id,
            memory_key_padding_mask=src == self.pad_id,
            tgt_is_causal=True,
        )  # (B, T, d_model)
        return self.output(hidden)  # (B, T, V)


class PlainLoss(nn.Module):
    def __init__(self, model: PlainTransformer, epsilon: float) -> None:
        super().__init__()
        self.model = model
        self.criterion = nn.CrossEntropyLoss(
            ignore_index=model.pad_id, label_smoothing=epsilon, reduction="sum"
        )

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, epsilon: float) -> Tensor:
        logits = self.model(src, tgt_in)  # (B, T, V)
        return self.criterion(logits.flatten(0, 1), tgt_out.flatten())


# --------------------------------------------------------------------------- FLOPs and peak


def model_flops(batch: Batch, c: TransformerConfig) -> float:
    """Training FLOPs of one batch of the model, real tokens only (module docstring)."""
    src_len = (batch.src != c.pad_id).sum(dim=1).double()  # (B,)
    tgt_len = (batch.tgt_out != c.pad_id).sum(dim=1).double()  # (B,)
    d, f = c.d_model, c.d_ff
    s_tokens, t_tokens = float(src_len.sum()), float(tgt_len.sum())
    weights = c.num_encoder_layers * (4 * d * d + 2 * d * f) * s_tokens
    weights += c.num_decoder_layers * ((6 * d * d + 2 * d * f) * t_tokens + 2 * d * d * s_tokens)
    weights += c.tgt_vocab_size * d * t_tokens  # the output projection
    pairs = c.num_encoder_layers * float((src_len**2).sum())
    pairs += c.num_decoder_layers * float((tgt_len * (tgt_len + 1) / 2 + tgt_len * src_len).sum())
    return 6.0 * weights + 12.0 * d * pairs


class MatmulRate:
    """FLOP/s of the model's three large matmul shapes (rows = max_tokens) in ``dtype``."""

    def __init__(self, rows: int, c: TransformerConfig, dtype: torch.dtype) -> None:
        d, f = c.d_model, c.d_ff
        g = torch.Generator().manual_seed(0)
        shapes = ((rows, d, f), (rows, f, d), (rows, d, 3 * d))
        self.pairs = [
            (torch.randn(m, k, generator=g).to(dtype), torch.randn(k, n, generator=g).to(dtype))
            for m, k, n in shapes
        ]
        self.flops = sum(2.0 * m * k * n for m, k, n in shapes)

    def measure(self, repeats: int = 10) -> float:
        for a, b in self.pairs:  # warm
            a @ b
        start = time.perf_counter()
        for _ in range(repeats):
            for a, b in self.pairs:
                a @ b
        return repeats * self.flops / (time.perf_counter() - start)


# --------------------------------------------------------------------------- machine


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            line = next(line for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        return set()
    return set(line.split(":", 1)[1].split())


def machine_info(threads: int, autocast: str, dtype: torch.dtype | None) -> str:
    flags = cpu_flags()
    has = ", ".join(f"{x} {'yes' if x in flags else 'no'}" for x in FLAGS)
    isa = isa_caps()
    return "\n".join(
        [
            f"platform: {platform.platform()}, python {platform.python_version()}",
            f"cpu: {cpu_name()}, {os.cpu_count()} logical cores, {usable_cores()} usable; "
            f"flags: {has}",
            f"torch {torch.__version__}: capability {torch.backends.cpu.get_cpu_capability()}, "
            f"fast bf16 {cpu_has_fast_bf16()}" + (f", {isa}" if isa else ""),
            f"threads {threads}, autocast {autocast} -> {dtype or 'float32'}",
            f"load average at start: {load_average():.2f}",
        ]
    )


# --------------------------------------------------------------------------- the run


def parse_args() -> argparse.Namespace:
    parser = argument_parser(__doc__)
    add_config_arguments(parser, str(ROOT / "configs" / "multi30k_de_en.toml"))
    parser.add_argument(
        "--steps", type=positive_int, default=20,
        help="timed steps per side, shared among the rounds as evenly as possible (at least "
        "one a round)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=positive_int, default=5, help="alternations of the sides")
    parser.add_argument(
        "--warmup",
        type=non_negative_int,
        default=3,
        help="untimed steps per side (0: the first timed steps run cold)",
    )
    parser.add_argument(
        "--autocast", choices=AUTOCAST, default=None, help="autocast (default: the config's)"
    )
    parser.add_argument("--threads", type=threads_or_zero, default=0, help="0 = usable cores")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="reuse a tokenizer.json (default: train the config's, BPE)",
    )
    parser.add_argument(
        "--sides", type=names_from(SIDES), default=",".join(SIDES),
        help=f"comma-separated, some of {', '.join(SIDES)}",
    )  # fmt: skip
    parser.add_argument(
        "--matched-dropout",
        type=float,
        default=0.1,
        help="attnkit-matched's dropout, in torch.nn's four places",
    )
    parser.add_argument(
        "--plain-norm-first", action="store_true", help="torch.nn side pre-LN (default post-LN)"
    )
    args = parser.parse_args()
    check_steps(parser, args.steps, args.rounds)
    if not 0.0 <= args.matched_dropout < 1.0:
        parser.error(
            f"argument --matched-dropout: expected a probability in [0, 1), got {args.matched_dropout}"
        )
    return args


def main() -> int:
    args = parse_args()
    config = TrainConfig.from_toml(args.config, args.overrides)
    o = config.optim
    cores = usable_cores()
    threads = args.threads or (cores if isinstance(cores, int) else os.cpu_count() or 1)
    torch.set_num_threads(threads)
    device = torch.device("cpu")
    autocast = args.autocast or o.autocast
    dtype = resolve_autocast(autocast, device)
    print(machine_info(threads, autocast, dtype), flush=True)

    text = load_text(config.data)
    tokenizer = (
        SubwordTokenizer.load(args.tokenizer)
        if args.tokenizer
        else train_tokenizer(text, config.data)
    )
    if tokenizer.vocab_size != config.data.vocab_size:
        print(
            f"note: the tokenizer has {tokenizer.vocab_size} tokens, the config asks for "
            f"{config.data.vocab_size}; the models use the tokenizer's"
        )
    model_cfg = TransformerConfig.from_dict(
        {
            **config.to_dict()["model"],
            "src_vocab_size": tokenizer.vocab_size,
            "tgt_vocab_size": tokenizer.vocab_size,
            "pad_id": tokenizer.pad_id,
        }
    )
    pairs = encode(text.train, tokenizer)
    max_len = config.data.max_len or model_cfg.max_len
    sampler = TokenBatchSampler(
        pairs, max_tokens=config.data.max_tokens, max_len=max_len, seed=config.data.seed
    )
    collate = Collator.for_tokenizer(  # padded as the trainer pads them (data.pad_multiple)
        tokenizer, pad_multiple=config.data.pad_multiple, max_width=model_cfg.max_len
    )
    needed = args.warmup + args.steps
    batches = [collate([pairs[i] for i in idx]) for idx in itertools.islice(sampler, needed)]
    if len(batches) < needed:
        raise SystemExit(
            f"an epoch of {config.data.max_tokens}-token batches has {len(batches)} batches; "
            f"--warmup {args.warmup} and --steps {args.steps} need {needed}"
        )

    p = args.matched_dropout
    matched_cfg = replace(model_cfg, dropout=p, attn_dropout=p, ffn_dropout=p)
    builders = {
        "attnkit": lambda: SequenceLoss(Transformer(model_cfg)),
        "attnkit-matched": lambda: SequenceLoss(Transformer(matched_cfg)),
        "torch.nn": lambda: PlainLoss(
            PlainTransformer(model_cfg, norm_first=args.plain_norm_first), o.label_smoothing
        ),
    }
    sides, optimizers = {}, {}
    for name in args.sides:
        torch.manual_seed(o.seed)
        sides[name] = builders[name]()
        optimizers[name] = build_optimizer(sides[name], o)
        for group in optimizers[name].param_groups:
            group["lr"] = 1e-4  # a fixed small lr: the schedule does not affect speed
        n = sum(p.numel() for p in sides[name].parameters())
        print(f"{name}: {n / 1e6:.3f}M parameters", flush=True)
    print(
        f"dropout: attnkit embeddings/residual {model_cfg.dropout}, attention weights "
        f"{model_cfg.attn_dropout}, FFN {model_cfg.ffn_dropout}; attnkit-matched {p} and "
        f"torch.nn 0.1 in all three places; torch.nn "
        f"{'pre' if args.plain_norm_first else 'post'}-LN"
    )

    def step(name: str, batch: Batch) -> None:
        module, opt = sides[name], optimizers[name]
        with autocast_context(device, dtype):
            loss = module(batch.src, batch.tgt_in, batch.tgt_out, o.label_smoothing)
        (loss / batch.num_tgt_tokens).backward()
        if o.clip_norm:
            nn.utils.clip_grad_norm_(module.parameters(), o.clip_norm, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    rate = MatmulRate(config.data.max_tokens, model_cfg, dtype or torch.float32)
    rate.measure(2)
    for name in sides:
        for batch in batches[: args.warmup]:
            step(name, batch)
    timed = batches[args.warmup :]
    seconds = {name: [] for name in sides}
    peaks, tokens, flops = [], [], []
    names = list(sides)
    for r, chunk in enumerate(split_evenly(timed, args.rounds)):
        tokens.append(sum(b.num_tgt_tokens for b in chunk))
        flops.append(sum(model_flops(b, model_cfg) for b in chunk))
        peak = []
        for name in names[r % len(names) :] + names[: r % len(names)]:
            peak.append(rate.measure())
            start = time.perf_counter()
            for batch in chunk:
                step(name, batch)
            seconds[name].append(time.perf_counter() - start)
        peaks.append(statistics.median(peak))
        print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{n} {tokens[-1] / seconds[n][-1]:.0f}" for n in names)
            + f" target tok/s; matmuls {peaks[-1] / 1e9:.0f} GFLOP/s",
            flush=True,
        )

    report(args, model_cfg, timed, names, seconds, tokens, flops, peaks, dtype)
    return 0


def report(args, model_cfg, timed, names, seconds, tokens, flops, peaks, dtype) -> None:
    n_tokens = sum(tokens)
    print(
        f"\n{len(timed)} timed batches per side ({n_tokens} target tokens, "
        f"{sum(b.num_src_tokens for b in timed)} source tokens, "
        f"{sum(flops) / 1e9:.1f} model GFLOP; src shapes "
        f"{', '.join(str(tuple(b.src.shape)) for b in timed[:3])}, ...)"
    )
    peak = statistics.median(peaks)
    print(
        f"{dtype or torch.float32} matmul rate of these cores: median {peak / 1e9:.0f} GFLOP/s "
        f"(rounds {', '.join(f'{x / 1e9:.0f}' for x in peaks)})"
    )
    print(f"{'side':>16} {'tok/s median':>12} {'tok/s mean':>10} {'GFLOP/s':>8} {'MFU':>6}")
    for n in names:
        per_round = [t / s for t, s in zip(tokens, seconds[n], strict=True)]
        mfu = [f / s / pk for f, s, pk in zip(flops, seconds[n], peaks, strict=True)]
        gflops = statistics.median(f / s for f, s in zip(flops, seconds[n], strict=True)) / 1e9
        print(
            f"{n:>16} {statistics.median(per_round):12.0f} {n_tokens / sum(seconds[n]):10.0f} "
            f"{gflops:8.0f} {statistics.median(mfu):6.1%}"
        )
    if "torch.nn" in names:
        for n in (x for x in names if x != "torch.nn"):
            ratios = [b / a for a, b in zip(seconds[n], seconds["torch.nn"], strict=True)]
            print(
                f"{n} / torch.nn: median of per-round ratios {statistics.median(ratios):.2f}x "
                f"(rounds {', '.join(f'{x:.2f}' for x in ratios)}); "
                f"ratio of totals {sum(seconds['torch.nn']) / sum(seconds[n]):.2f}x"
            )
    print(f"load average at end: {load_average():.2f}")


if __name__ == "__main__":
    sys.exit(main())
