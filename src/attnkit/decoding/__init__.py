"""Decoding: greedy and beam search with a KV cache, text translation, model folders.

    from attnkit.decoding import DecodingConfig, Translator, load_translation_model

    model, tokenizer, _ = load_translation_model("runs/multi30k")   # or None: the shipped one
    translator = Translator(model, tokenizer, DecodingConfig(beam_size=5), batch_tokens=4000)
    translator.translate(["Ein Hund rennt."]).translations

Modules: :mod:`~attnkit.decoding.search` (the pure beam step, length penalties),
:mod:`~attnkit.decoding.generate` (prefill / decode_one_token / greedy and beam search),
:mod:`~attnkit.decoding.translate` (text, batching by tokens),
:mod:`~attnkit.decoding.loading` (``config.json`` + ``model.safetensors`` + ``tokenizer.json``).
"""

from attnkit.decoding.generate import (
    MAX_BEAM_SIZE,
    DecoderState,
    DecodingConfig,
    Hypothesis,
    available_memory,
    beam_search,
    check_decoding_memory,
    decode_one_token,
    decoding_memory,
    generate,
    greedy_search,
    max_lengths,
    prefill,
)
from attnkit.decoding.loading import (
    TranslationModel,
    load_translation_model,
    resolve_model_dir,
    save_translation_model,
    shipped_model_dir,
)
from attnkit.decoding.search import BeamSearch, LengthPenalty
from attnkit.decoding.translate import (
    TranslationOutput,
    Translator,
    normalize_source,
    token_batches,
)

__all__ = [
    "MAX_BEAM_SIZE",
    "BeamSearch",
    "DecoderState",
    "DecodingConfig",
    "Hypothesis",
    "LengthPenalty",
    "TranslationModel",
    "TranslationOutput",
    "Translator",
    "available_memory",
    "beam_search",
    "check_decoding_memory",
    "decode_one_token",
    "decoding_memory",
    "generate",
    "greedy_search",
    "load_translation_model",
    "max_lengths",
    "normalize_source",
    "prefill",
    "resolve_model_dir",
    "save_translation_model",
    "shipped_model_dir",
    "token_batches",
]
