"""BERT inference speed: attnkit's BertModel against Hugging Face's, with identical weights.

A random-weight Hugging Face BertModel is saved to a temporary folder and both libraries load
it from there (Hugging Face with its default attention implementation, attnkit through its
explicit key mapping). Both then encode the same batch (default 32 x 128 tokens, no padding)
in the same process under ``torch.inference_mode()``; runs alternate between the libraries so
that a noisy, shared machine slows both alike. bfloat16 is measured with both models cast to
bfloat16 (``model.to(torch.bfloat16)``), the same treatment on both sides.

    HF_HUB_OFFLINE=1 python benchmarks/bert.py                      # bert-base and MiniLM
    HF_HUB_OFFLINE=1 python benchmarks/bert.py --sizes minilm --dtypes float32 --repeats 10

Ratio = Hugging Face median time / attnkit median time (> 1: attnkit is faster).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from machine import (  # noqa: E402  (benchmarks/machine.py)
    argument_parser,
    cpu_name,
    names_from,
    non_negative_int,
    positive_int,
    thread_count,
)

from attnkit.cli.options import integer  # noqa: E402
from attnkit.models.bert import BertModel  # noqa: E402

SIZES = {  # Hugging Face BertConfig arguments
    "base": dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
    ),
    "minilm": dict(
        hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536
    ),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MAX_SEQ = transformers.BertConfig().max_position_embeddings  # 512 positions


def machine_info() -> str:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    cpu = cpu_name()
    return (
        f"platform {platform.platform()}; CPU {cpu}; os.cpu_count() {os.cpu_count()}, "
        f"usable {affinity}; torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), "
        f"threads {torch.get_num_threads()}; transformers {transformers.__version__}; "
        f"python {platform.python_version()}"
    )


def make_inputs(batch: int, seq: int, vocab: int, padded: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if padded:  # lengths seq/4 .. seq, like real sentences
        lengths = torch.randint(seq // 4, seq + 1, (batch,), generator=g)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        ids = ids * mask
    return {"input_ids": ids, "attention_mask": mask}


def time_pair(ours, hf, inputs, warmup: int, repeats: int) -> tuple[list[float], list[float]]:
    """Alternate the two models, swapping which goes first each round."""
    times = {"ours": [], "hf": []}
    models = [("ours", ours), ("hf", hf)]
    with torch.inference_mode():
        for r in range(warmup + repeats):
            for name, model in models if r % 2 == 0 else models[::-1]:
                start = time.perf_counter()
                model(**inputs)
                elapsed = time.perf_counter() - start
                if r >= warmup:
                    times[name].append(elapsed)
    return times["ours"], times["hf"]


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--sizes", type=names_from(SIZES), default="base,minilm",
        help=f"comma-separated, of {', '.join(SIZES)}",
    )  # fmt: skip
    parser.add_argument(
        "--dtypes", type=names_from(DTYPES), default="float32,bfloat16",
        help=f"comma-separated, of {', '.join(DTYPES)}",
    )  # fmt: skip
    parser.add_argument("--batch", type=positive_int, default=32, help="sentences per forward pass")
    parser.add_argument(
        "--seq", type=integer(1, MAX_SEQ), default=128,
        help=f"tokens per sentence, at most {MAX_SEQ} (BERT's positions)",
    )  # fmt: skip
    parser.add_argument(
        "--warmup",
        type=non_negative_int,
        default=1,
        help="untimed forward passes per side and setting",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="timed forward passes per side and setting (the median is printed)",
    )
    parser.add_argument("--padded", action="store_true", help="random lengths, with padding")
    parser.add_argument("--threads", type=thread_count, default=None, help="torch.set_num_threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    print(machine_info())
    print(
        f"batch {args.batch} x {args.seq} tokens ({'padded' if args.padded else 'no padding'}), "
        f"warm-up {args.warmup}, repeats {args.repeats}, times = median (min) seconds per forward"
    )
    print()
    print("| size | dtype | HF attention | HF s | attnkit s | ratio HF/attnkit | max abs diff |")
    print("| --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for size in args.sizes:
        config = transformers.BertConfig(**SIZES[size])
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as folder:
            transformers.BertModel(config).save_pretrained(folder)
            hf = transformers.BertModel.from_pretrained(folder).eval()  # default attention
            ours = BertModel.from_pretrained(folder).eval()
        inputs = make_inputs(args.batch, args.seq, config.vocab_size, args.padded)
        real = inputs["attention_mask"].bool()
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            hf, ours = hf.to(dtype), ours.to(dtype)
            with torch.inference_mode():
                diff = (ours(**inputs).last_hidden_state - hf(**inputs).last_hidden_state)[real]
            t_ours, t_hf = time_pair(ours, hf, inputs, args.warmup, args.repeats)
            m_ours, m_hf = statistics.median(t_ours), statistics.median(t_hf)
            print(
                f"| {size} | {dtype_name} | {hf.config._attn_implementation} | "
                f"{m_hf:.3f} ({min(t_hf):.3f}) | {m_ours:.3f} ({min(t_ours):.3f}) | "
                f"{m_hf / m_ours:.2f}x | {diff.abs().max().item():.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
