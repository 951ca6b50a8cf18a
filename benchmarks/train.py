"""Training throughput: attnkit's Transformer and trainer step vs a plain torch.nn.Transformer.

Both models have the same size (from the config's [model] section: d_model, heads, layers,
d_ff, dropout, pre/post-LN, the joint vocabulary, tied embeddings), see the same batches
(the first batches of epoch 0 from attnkit's TokenBatchSampler over Multi30k with the
config's max_tokens), use the same optimizer (attnkit.training.build_optimizer: Adam with the
paper's betas), the same gradient clipping and the same autocast setting. They differ in the
model code and in how the loss is computed:

* attnkit: ``attnkit.training.SequenceLoss``, the trainer's forward: attention through
  attnkit.attention (boolean masks, is_causal for the decoder; on a CPU with short keys the
  explicit-backward ``ShortAttention`` kernel), the output projection only for the real target
  tokens, fused with seed 003's label-smoothed cross-entropy chunk by chunk
  (``linear_cross_entropy``: the (N, V) logits are never stored). Dropout as the config says:
  the shipped config has ``attn_dropout = 0`` and ``ffn_dropout = 0`` (fairseq's defaults).
* plain: ``nn.Embedding`` * sqrt(d_model) + sinusoidal positions -> ``nn.Transformer``
  (batch_first, key-padding masks and a causal mask as in the PyTorch tutorial; its single
  ``dropout`` also drops attention weights and FFN activations, as nn.Transformer always does)
  -> tied ``nn.Linear`` over every position -> ``F.cross_entropy(label_smoothing=...,
  ignore_index=pad)``.

To compare with dropout in the same places on both sides, add
``--set model.attn_dropout=0.1 --set model.ffn_dropout=0.1`` (attnkit then also drops attention
weights, which takes torch's fused kernel with dropout instead of ``ShortAttention``).

Timing alternates rounds of steps between the two models in the same process, so a shared
machine's load affects both alike; tokens/s counts real (non-pad) target tokens.

    python benchmarks/train.py --steps 20 --autocast none
    python benchmarks/train.py --steps 4 --rounds 2 --autocast bf16
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
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.data import Collator, SubwordTokenizer, TokenBatchSampler
from attnkit.models.transformer import Transformer, TransformerConfig
from attnkit.training import SequenceLoss, TrainConfig, build_optimizer
from attnkit.training.datasets import encode, load_text, train_tokenizer
from attnkit.training.precision import autocast_context, cpu_has_fast_bf16, resolve_autocast

ROOT = Path(__file__).resolve().parents[1]


class PlainTransformer(nn.Module):
    """The textbook model: embeddings + sinusoids -> nn.Transformer -> tied output layer."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.pad_id, self.scale = c.pad_id, math.sqrt(c.d_model)
        self.embed = nn.Embedding(c.src_vocab_size, c.d_model, padding_idx=c.pad_id)
        position = torch.arange(c.max_len).unsqueeze(1)  # (T, 1)
        div = torch.exp(torch.arange(0, c.d_model, 2) * (-math.log(10000.0) / c.d_model))
        pe = torch.zeros(c.max_len, c.d_model)
        pe[:, 0::2] = torch.sin(position * div)
        pe[:, 1::2] = torch.cos(position * div)
        self.register_buffer("pe", pe, persistent=False)  # (T_max, d_model)
        self.dropout = nn.Dropout(c.dropout)
        self.transformer = nn.Transformer(
            d_model=c.d_model,
            nhead=c.num_heads,
            num_encoder_layers=c.num_encoder_layers,
            num_decoder_layers=c.num_decoder_layers,
            dim_feedforward=c.d_ff,
            dropout=c.dropout,
            activation=c.activation,
            layer_norm_eps=c.layer_norm_eps,
            batch_first=True,
            norm_first=c.norm_first,
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
    def __init__(self, model: PlainTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, epsilon: float) -> Tensor:
        logits = self.model(src, tgt_in)  # (B, T, V)
        return F.cross_entropy(
            logits.flatten(0, 1).float(),
            tgt_out.flatten(),
            ignore_index=self.model.pad_id,
            label_smoothing=epsilon,
            reduction="sum",
        )


def machine_info(threads: int, autocast: str, dtype) -> str:
    caps = getattr(torch.cpu, "get_capabilities", dict)()
    cpu = caps.get("cpu_name") or platform.processor() or "?"
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return "\n".join(
        [
            f"platform: {platform.platform()}, python {platform.python_version()}",
            f"cpu: {cpu}, {caps.get('num_physical_cores', '?')} physical / "
            f"{os.cpu_count()} logical cores, capability "
            f"{torch.backends.cpu.get_cpu_capability()}, fast bf16: {cpu_has_fast_bf16()}",
            f"torch {torch.__version__}, threads {threads}, autocast {autocast} -> "
            f"{dtype or 'float32'}",
            f"load average at start: {' '.join(f'{x:.2f}' for x in load)}",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "multi30k_de_en.toml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per model")
    parser.add_argument("--rounds", type=int, default=5, help="alternations of the two models")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model")
    parser.add_argument("--autocast", default=None, help="auto|bf16|fp16|none (default: config)")
    parser.add_argument("--threads", type=int, default=0, help="0 = physical cores")
    parser.add_argument("--tokenizer", default="", help="reuse a tokenizer.json (skips BPE)")
    args = parser.parse_args()

    config = TrainConfig.from_toml(args.config, args.overrides)
    o = config.optim
    threads = args.threads or getattr(torch.cpu, "get_capabilities", dict)().get(
        "num_physical_cores", os.cpu_count()
    )
    torch.set_num_threads(threads)
    device = torch.device("cpu")
    autocast = args.autocast or o.autocast
    dtype = resolve_autocast(autocast, device)
    print(machine_info(threads, autocast, dtype), flush=True)

    text = load_text(config.data)
    if args.tokenizer:
        tokenizer = SubwordTokenizer.load(args.tokenizer)
    else:
        tokenizer = train_tokenizer(text, config.data)
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
    collate = Collator.for_tokenizer(tokenizer)
    per_round = args.steps // args.rounds or 1
    needed = args.warmup + per_round * args.rounds
    batches = [collate([pairs[i] for i in idx]) for idx in itertools.islice(sampler, needed)]

    torch.manual_seed(o.seed)
    attnkit_model = Transformer(model_cfg)
    torch.manual_seed(o.seed)
    plain_model = PlainTransformer(model_cfg)
    sides = {"attnkit": SequenceLoss(attnkit_model), "torch.nn": PlainLoss(plain_model)}
    for name, module in sides.items():
        n = sum(p.numel() for p in module.parameters())
        print(f"{name}: {n / 1e6:.3f}M parameters", flush=True)
    optimizers = {name: build_optimizer(m, o) for name, m in sides.items()}
    for opt in optimizers.values():
        for group in opt.param_groups:
            group["lr"] = 1e-4  # a fixed small lr: the schedule does not affect speed

    def step(name: str, batch) -> None:
        module, opt = sides[name], optimizers[name]
        with autocast_context(device, dtype):
            loss = module(batch.src, batch.tgt_in, batch.tgt_out, o.label_smoothing)
        (loss / batch.num_tgt_tokens).backward()
        if o.clip_norm:
            nn.utils.clip_grad_norm_(module.parameters(), o.clip_norm, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for name in sides:
        for batch in batches[: args.warmup]:
            step(name, batch)
    seconds = {name: [] for name in sides}
    timed = batches[args.warmup :]
    tokens_per_round = []
    for r in range(args.rounds):
        chunk = timed[r * per_round : (r + 1) * per_round]
        tokens_per_round.append(sum(b.num_tgt_tokens for b in chunk))
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            start = time.perf_counter()
            for batch in chunk:
                step(name, batch)
            seconds[name].append(time.perf_counter() - start)
        print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{n} {tokens_per_round[-1] / seconds[n][-1]:.0f} tok/s" for n in sides),
            flush=True,
        )

    tokens = sum(tokens_per_round)
    shapes = [tuple(b.src.shape) for b in timed]
    print(
        f"batches: {len(timed)} timed per model, max_tokens {config.data.max_tokens}, "
        f"{tokens} target tokens, src shapes {shapes[:3]}..."
    )
    rate = {n: tokens / sum(s) for n, s in seconds.items()}
    median = {
        n: statistics.median(t / s for t, s in zip(tokens_per_round, secs, strict=True))
        for n, secs in seconds.items()
    }
    for n in sides:
        print(f"{n:>8}: {rate[n]:8.0f} target tok/s (median round {median[n]:.0f})")
    ratio = rate["attnkit"] / rate["torch.nn"]
    median_ratio = statistics.median(
        a / b for a, b in zip(seconds["torch.nn"], seconds["attnkit"], strict=True)
    )
    print(
        f"   ratio: {ratio:.2f}x attnkit / torch.nn (median of per-round ratios {median_ratio:.2f}x)"
    )
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in load)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
