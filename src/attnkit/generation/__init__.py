"""Text generation with decoder-only models (GPT): greedy, sampling, stop strings, streaming.

    from attnkit.generation import GenerationConfig, generate, generate_text, stream_text
    from attnkit.models import GPT

    gpt = GPT.from_pretrained("path/to/hf-gpt2-folder")
    config = GenerationConfig(max_new_tokens=40, temperature=0.8, top_p=0.95, seed=0)
    generate_text(gpt, None, ["Once upon a time"], config)[0].text
    for piece in stream_text(gpt, None, "Once upon a time", config):
        print(piece, end="", flush=True)

Modules: :mod:`~attnkit.generation.config` (:class:`GenerationConfig`),
:mod:`~attnkit.generation.logits` (repetition penalty, temperature, top-k, top-p),
:mod:`~attnkit.generation.sampling` (greedy or a seeded draw),
:mod:`~attnkit.generation.stopping` (stop strings), :mod:`~attnkit.generation.streaming`
(incremental detokenization), :mod:`~attnkit.generation.generate` (prefill /
decode_one_token / the token loop), :mod:`~attnkit.generation.text` (text in, text out),
:mod:`~attnkit.generation.packed` (linear layers on weights prepacked for oneDNN while
generating on a CPU), :mod:`~attnkit.generation.blas` (one row through numpy's OpenBLAS on
one thread, where MKL runs generic code), :mod:`~attnkit.generation.screen` (greedy's token
through an int8 or float16 copy of a float32 or bfloat16 output layer, decided in float32).

A seed makes sampling reproducible for the same prompts in the same batch. One generator draws
for every row in turn, so what a row samples depends on the batch around it (how many rows,
their order, which have finished): the same prompt with the same seed gives other tokens alone
than in a batch. Greedy decoding does not depend on the batch.
"""

from attnkit.generation.config import GenerationConfig
from attnkit.generation.generate import (
    GenerationOutput,
    Step,
    decode_one_token,
    generate,
    generate_steps,
    pad_prompts,
    prefill,
)
from attnkit.generation.logits import (
    apply_temperature,
    process_logits,
    repetition_penalty,
    seen_tokens,
    top_k_filter,
    top_p_filter,
)
from attnkit.generation.sampling import make_generator, sample, select
from attnkit.generation.stopping import StopStrings
from attnkit.generation.streaming import IncrementalDetokenizer
from attnkit.generation.text import GeneratedText, generate_text, stream_text

__all__ = [
    "GeneratedText",
    "GenerationConfig",
    "GenerationOutput",
    "IncrementalDetokenizer",
    "Step",
    "StopStrings",
    "apply_temperature",
    "decode_one_token",
    "generate",
    "generate_steps",
    "generate_text",
    "make_generator",
    "pad_prompts",
    "prefill",
    "process_logits",
    "repetition_penalty",
    "sample",
    "seen_tokens",
    "select",
    "stream_text",
    "top_k_filter",
    "top_p_filter",
]
