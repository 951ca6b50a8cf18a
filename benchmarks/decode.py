"""Beam-search decoding speed: attnkit with its KV cache, attnkit recomputing the prefix, and
Hugging Face transformers' ``MarianMTModel.generate``, in one run on the same sentences.

Setup (stated in the output):

* Both models have the issue's size: d_model 256, 3 encoder + 3 decoder layers, 8 heads,
  d_ff 1024, vocabulary 8000, tied embeddings, random weights (``torch.manual_seed(0)``),
  float32, eval mode, ``torch.inference_mode()``. (attnkit's default is pre-LN with a final
  LayerNorm, Marian is post-LN: the same matrix products, one LayerNorm more per stack.)
* Sources: Multi30k test2016 German (``--limit`` for a prefix), encoded with a SubwordTokenizer
  trained on Multi30k train (vocab 8000), sorted by length and cut into the same batches for
  every side (``--batch-tokens`` padded source tokens per batch, attnkit's batching).
* Beam 5, length penalty 1.0. Random weights have no meaningful eos, so every side is forced
  to the same output length: exactly L tokens then eos, L = the mean token length of the
  test2016 English references (attnkit: ``min_len=L, max_len_a=0, max_len_b=L``; Hugging Face:
  ``min_new_tokens=L, max_new_tokens=L+1, forced_eos_token_id=eos``), i.e. L + 1 decoder steps
  per sentence everywhere. The output lengths are printed as a check.

    python benchmarks/decode.py                          # full test2016 (1000 sentences)
    python benchmarks/decode.py --limit 200 --sides cached,hf

Speed = sentences / wall-clock seconds of decoding (encoder included, tokenization and model
building excluded), one thread by default (``--threads``). Sides take turns batch by batch
(the first side rotates), after a small warm-up batch, so that load from other processes slows
every side alike; CPU seconds are printed as a cross-check. The last column is how many times
faster attnkit with its KV cache is than the row's side.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import platform  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from machine import cpu_name  # noqa: E402  (benchmarks/machine.py)

from attnkit.data import SubwordTokenizer, load_named_corpus  # noqa: E402
from attnkit.decoding import DecodingConfig, generate, token_batches  # noqa: E402
from attnkit.models import Transformer, TransformerConfig  # noqa: E402

PAD, BOS, EOS = 0, 1, 2
SIZE = dict(d_model=256, layers=3, heads=8, d_ff=1024, vocab=8000, max_len=256)


def machine_info() -> str:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    cpu = cpu_name()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"CPU {cpu}; usable cores {affinity}; load average {load:.1f}; torch {torch.__version__} "
        f"({torch.backends.cpu.get_cpu_capability()}), threads {torch.get_num_threads()}; "
        f"transformers {transformers.__version__}; python {platform.python_version()}"
    )


def attnkit_model() -> Transformer:
    torch.manual_seed(0)
    config = TransformerConfig(
        src_vocab_size=SIZE["vocab"], tgt_vocab_size=SIZE["vocab"], d_model=SIZE["d_model"],
        num_heads=SIZE["heads"], num_encoder_layers=SIZE["layers"],
        num_decoder_layers=SIZE["layers"], d_ff=SIZE["d_ff"], max_len=SIZE["max_len"],
        share_embeddings=True, tie_output=True,
    )  # fmt: skip
    return Transformer(config).eval()


def marian_model() -> transformers.MarianMTModel:
    torch.manual_seed(0)
    config = transformers.MarianConfig(
        vocab_size=SIZE["vocab"], decoder_vocab_size=SIZE["vocab"], d_model=SIZE["d_model"],
        encoder_layers=SIZE["layers"], decoder_layers=SIZE["layers"],
        encoder_attention_heads=SIZE["heads"], decoder_attention_heads=SIZE["heads"],
        encoder_ffn_dim=SIZE["d_ff"], decoder_ffn_dim=SIZE["d_ff"],
        max_position_embeddings=SIZE["max_len"], activation_function="relu",
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, decoder_start_token_id=BOS,
        forced_eos_token_id=EOS, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, scale_embedding=True,
    )  # fmt: skip
    return transformers.MarianMTModel(config).eval()


def make_batches(sources: list[list[int]], batch_tokens: int) -> list[tuple[torch.Tensor, ...]]:
    """(src ids, attention mask) per batch, sources eos-terminated and right-padded."""
    batches = []
    for index in token_batches([len(s) for s in sources], batch_tokens):
        width = max(len(sources[i]) for i in index)
        src = torch.full((len(index), width), PAD, dtype=torch.long)  # (B, S)
        for row, i in enumerate(index):
            src[row, : len(sources[i])] = torch.tensor(sources[i])
        batches.append((src, (src != PAD).long()))
    return batches


def attnkit_side(model, length: int, beam: int, use_cache: bool):
    """A function: one batch -> generated tokens (eos excluded)."""
    config = DecodingConfig(
        beam_size=beam, min_len=length, max_len_a=0, max_len_b=length, use_cache=use_cache
    )
    return lambda src, mask: sum(len(h[0].tokens) for h in generate(model, src, config))


def marian_side(model, length: int, beam: int):
    kwargs = dict(
        num_beams=beam, do_sample=False, length_penalty=1.0, early_stopping=False,
        min_new_tokens=length, max_new_tokens=length + 1, use_cache=True,
    )  # fmt: skip

    def run(src, mask):
        with torch.inference_mode():
            out = model.generate(input_ids=src, attention_mask=mask, **kwargs)  # (B, 1 + T)
        gen = out[:, 1:]
        return int(((gen != PAD) & (gen != EOS)).sum())

    return run


def time_sides(sides: dict, batches) -> dict[str, tuple[float, float, int]]:
    """Run every side on every batch, rotating which goes first, so that a noisy shared
    machine slows all sides alike. Returns name -> (wall s, CPU s, tokens)."""
    totals = {name: [0.0, 0.0, 0] for name in sides}
    names = list(sides)
    for i, (src, mask) in enumerate(batches):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            wall, cpu = time.perf_counter(), time.process_time()
            tokens = sides[name](src, mask)
            totals[name][0] += time.perf_counter() - wall
            totals[name][1] += time.process_time() - cpu
            totals[name][2] += tokens
    return {name: tuple(t) for name, t in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="first N test2016 sentences")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch-tokens", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--sides", default="cached,recompute,hf", help="which sides to run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    train = load_named_corpus("multi30k", split="train", src_lang="de", tgt_lang="en")
    tokenizer = SubwordTokenizer.train(train.src + train.tgt, vocab_size=SIZE["vocab"])
    test = load_named_corpus("multi30k", split="test2016", src_lang="de", tgt_lang="en")
    src_text = test.src[: args.limit] if args.limit else test.src
    ref_text = test.tgt[: args.limit] if args.limit else test.tgt
    sources = [[*ids, EOS] for ids in tokenizer.encode_batch(src_text)]
    length = round(sum(map(len, tokenizer.encode_batch(ref_text))) / len(ref_text))
    batches = make_batches(sources, args.batch_tokens)
    n = len(sources)

    print(machine_info())
    print(
        f"Multi30k test2016 de->en: {n} sentences, {len(batches)} batches of <= "
        f"{args.batch_tokens} padded source tokens; beam {args.beam}; random weights, float32; "
        f"every output forced to L={length} tokens + eos"
    )
    ours, hf = attnkit_model(), marian_model()
    params = (sum(p.numel() for p in ours.parameters()), sum(p.numel() for p in hf.parameters()))
    print(f"parameters: attnkit {params[0]:,}, Marian {params[1]:,}")
    every = {
        "attnkit, KV cache": ("cached", attnkit_side(ours, length, args.beam, True)),
        "attnkit, recompute prefix": ("recompute", attnkit_side(ours, length, args.beam, False)),
        "HF MarianMTModel.generate": ("hf", marian_side(hf, length, args.beam)),
    }
    wanted = args.sides.split(",")
    sides = {name: fn for name, (key, fn) in every.items() if key in wanted}
    time_sides(sides, [(src[:2], mask[:2]) for src, mask in batches[-1:]])  # warm-up
    results = time_sides(sides, batches)
    print()
    print("| side | sentences/s | s (wall) | s (CPU) | mean output tokens | cached attnkit is |")
    print("| --- | --- | --- | --- | --- | --- |")
    cached = results.get("attnkit, KV cache")
    for name, (wall, cpu, tokens) in results.items():
        ratio = f"{wall / cached[0]:.2f}x faster" if cached else "-"
        print(f"| {name} | {n / wall:.2f} | {wall:.1f} | {cpu:.1f} | {tokens / n:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
