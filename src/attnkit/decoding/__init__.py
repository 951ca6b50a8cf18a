"""Decoding: greedy and beam search with a KV cache, text translation, model folders.

    from attnkit.decoding import Translator, load_translation_model, model_decoding

    model, tokenizer, _ = load_translation_model("runs/multi30k")   # or None: the shipped one
    config = model_decoding("runs/multi30k")  # the folder's search settings (beam, lenpen)
    translator = Translator(model, tokenizer, config, batch_tokens=4000)
    translator.translate(["Ein Hund rennt."]).translations

Modules, in the order a sentence meets them:
:mod:`~attnkit.decoding.config` (``DecodingConfig``: beam, lengths, special ids, bounds),
:mod:`~attnkit.decoding.state` (``prefill`` / ``decode_one_token`` and the state between steps),
:mod:`~attnkit.decoding.search` (the pure beam step, length penalties),
:mod:`~attnkit.decoding.generate` (greedy and beam search, ``generate``),
:mod:`~attnkit.decoding.memory_bound` (what a search allocates; refused before it cannot fit),
:mod:`~attnkit.decoding.translate` (text, batching by tokens),
:mod:`~attnkit.decoding.loading` (``config.json`` + ``model.safetensors`` + ``tokenizer.json``).
"""

from attnkit.decoding.config import MAX_BEAM_SIZE, MAX_LENPEN, SEARCH_FIELDS, DecodingConfig
from attnkit.decoding.generate import Hypothesis, beam_search, generate, greedy_search, max_lengths
from attnkit.decoding.loading import (
    TranslationModel,
    load_translation_model,
    model_decoding,
    resolve_model_dir,
    save_translation_model,
    shipped_model_dir,
)
from attnkit.decoding.memory_bound import available_memory, check_decoding_memory, decoding_memory
from attnkit.decoding.search import BeamSearch, LengthPenalty
from attnkit.decoding.state import DecoderState, decode_one_token, prefill
from attnkit.decoding.translate import (
    TranslationOutput,
    Translator,
    normalize_source,
    token_batches,
)

__all__ = [
    "MAX_BEAM_SIZE",
    "MAX_LENPEN",
    "SEARCH_FIELDS",
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
    "model_decoding",
    "normalize_source",
    "prefill",
    "resolve_model_dir",
    "save_translation_model",
    "shipped_model_dir",
    "token_batches",
]
