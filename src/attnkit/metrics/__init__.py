"""Evaluation metrics. BLEU, equal to sacreBLEU 2.x on every input.

``corpus_bleu`` and ``sentence_bleu`` take sacreBLEU's arguments and return a
:class:`BLEUScore` with its attributes and signature. Underneath, :func:`bleu_statistics`
computes per-line sufficient statistics that add across batches and files
(:class:`BLEUStatistics` supports ``+``), :func:`bleu_from_statistics` scores them, and
:func:`bootstrap_ci` / :func:`paired_bootstrap` resample them.

Nothing here imports torch or sacreBLEU.
"""

from attnkit.metrics.bleu import (
    BLEUScore,
    bleu_from_statistics,
    compute_bleu,
    corpus_bleu,
    sentence_bleu,
)
from attnkit.metrics.bootstrap import (
    ConfidenceInterval,
    PairedBootstrap,
    bootstrap_ci,
    paired_bootstrap,
)
from attnkit.metrics.signature import SMOOTH_DEFAULTS, bleu_signature
from attnkit.metrics.statistics import BLEUStatistics, bleu_statistics
from attnkit.metrics.tokenizers import TOKENIZERS, get_tokenizer

__all__ = [
    "BLEUScore",
    "BLEUStatistics",
    "ConfidenceInterval",
    "PairedBootstrap",
    "SMOOTH_DEFAULTS",
    "TOKENIZERS",
    "bleu_from_statistics",
    "bleu_signature",
    "bleu_statistics",
    "bootstrap_ci",
    "compute_bleu",
    "corpus_bleu",
    "get_tokenizer",
    "paired_bootstrap",
    "sentence_bleu",
]
