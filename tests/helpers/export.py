"""Helpers of the export tests: tiny random translation model folders, and decoding the same
sentences with attnkit and with a CTranslate2 export.

:func:`write_tiny_model` makes a random model behave like a trained one in the two ways the
comparison of the searches needs:

* eos is likely: a random model rarely picks it, so its beams would all run to the length
  limit, where attnkit's search and CTranslate2's are known to differ (attnkit forces eos
  there). The target embedding row of eos (the output layer's too, when untied) is scaled by
  ``eos_scale``; how far depends on the model (a random model's outputs jump from "always the
  limit" to "always at once" as it grows), so a test picks it and asserts what it needs.
* pad and bos are improbable (about e^-20 of the best token): both searches forbid them, but
  CTranslate2 does so before its softmax (the other tokens' log-probabilities are renormalised)
  and attnkit after it. In a trained model their probability is negligible; in a random one it
  is ~1-2% per step, enough to reorder beams. The decoder's last LayerNorm gets a large shift
  along a random direction u, the pad and bos output rows point against u and the other rows
  are made orthogonal to it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attnkit.decoding import DecodingConfig, Translator, save_translation_model
from attnkit.export.ctranslate2 import strip_end_token, translate_options
from attnkit.models import Transformer, TransformerConfig
from tests.helpers.decoding import tiny_config as decoding_tiny_config

SPECIAL_SHIFT = 10.0  # the last LayerNorm's shift along u; the pad and bos rows are -2u


def tiny_config(vocab_size: int, **overrides) -> TransformerConfig:
    """tests/helpers/decoding.py's tiny model with room for 128 positions."""
    return decoding_tiny_config(vocab_size, **{"max_len": 128, **overrides})


def write_tiny_model(
    folder: Path, config: TransformerConfig, tokenizer, *, seed: int = 0, eos_scale: float = 1.0
) -> Path:
    """A random model of ``config`` saved as a model folder: pad and bos improbable, eos made
    likely by ``eos_scale`` (module docstring)."""
    torch.manual_seed(seed)
    model = Transformer(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:  # not the init's zeros and ones
                p.add_(0.1 * torch.randn_like(p))
        model.tgt_embed.weight[tokenizer.eos_id] *= eos_scale
        if not config.tie_output:
            model.output.weight[tokenizer.eos_id] *= eos_scale
        last = model.decoder.norm if config.norm_first else model.decoder.layers[-1].ffn_block.norm
        u = torch.nn.functional.normalize(torch.randn(config.d_model), dim=0)  # (D,)
        last.bias.add_(SPECIAL_SHIFT * u)
        rows = model.output.weight  # (V, D); the target embedding too, when tied
        rows -= (rows @ u)[:, None] * u  # the shift along u moves no other token's logit
        for i in (tokenizer.pad_id, tokenizer.bos_id):
            rows[i] = -2.0 * u
    return save_translation_model(folder, model, tokenizer)


def attnkit_ids(model, tokenizer, sentences: list[str], config: DecodingConfig) -> list[list[int]]:
    """attnkit's best output ids per sentence (the path `attnkit translate` takes)."""
    translator = Translator(model, tokenizer, config)
    sources, truncated = translator.encode(sentences)
    assert not truncated
    return translator.translate_ids(sources)


def ctranslate2_ids(folder: Path, tokenizer, sentences: list[str], config: DecodingConfig, *,
                    max_len: int, compute_type: str = "float32") -> list[list[int]]:  # fmt: skip
    """CTranslate2's best output ids per sentence, with :func:`translate_options`."""
    import ctranslate2

    translator = ctranslate2.Translator(
        str(folder), device="cpu", compute_type=compute_type, intra_threads=1
    )
    eos = tokenizer.id_to_token(tokenizer.eos_id)
    options = translate_options(config.with_ids(tokenizer), tokenizer, max_len=max_len)
    results = translator.translate_batch([tokenizer.tokens(s) for s in sentences], **options)
    vocab = {token: i for i, token in enumerate(target_vocabulary(folder))}
    return [[vocab[t] for t in strip_end_token(r.hypotheses[0], eos)] for r in results]


def target_vocabulary(folder: Path) -> list[str]:
    """The target token strings of a CTranslate2 model folder, position = id."""
    path = folder / "target_vocabulary.json"
    if not path.exists():
        path = folder / "shared_vocabulary.json"
    return json.loads(path.read_text(encoding="utf-8"))
