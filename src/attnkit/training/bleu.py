"""``val_bleu``: translate the validation sources and score them against the references.

The hook decodes with :class:`attnkit.decoding.Translator` (greedy by default: a beam of 5
costs ~5x more on a CPU and mostly shifts every score alike) and scores detokenized output
with :func:`attnkit.metrics.corpus_bleu` (sacreBLEU's defaults: 13a tokenization, cased).
"""

from __future__ import annotations

import logging
import time

from attnkit.data import ParallelCorpus, SubwordTokenizer

logger = logging.getLogger(__name__)


def bleu_eval_hook(
    tokenizer: SubwordTokenizer,
    corpus: ParallelCorpus,
    *,
    beam_size: int = 1,
    batch_tokens: int = 4000,
):
    """An :data:`~attnkit.training.task.EvalHook` returning ``{"val_bleu": score}``.

    Args:
        tokenizer: The run's tokenizer.
        corpus: Validation sources and references.
        beam_size: 1 = greedy search.
        batch_tokens: Padded source tokens per decoding batch.
    """
    from attnkit.decoding import DecodingConfig, Translator
    from attnkit.metrics import corpus_bleu

    config = DecodingConfig(beam_size=beam_size).with_ids(tokenizer)

    def hook(model) -> dict[str, float]:
        start = time.perf_counter()
        translator = Translator(model, tokenizer, config, batch_tokens=batch_tokens)
        hypotheses = translator.translate(corpus.src).translations
        score = corpus_bleu(hypotheses, [corpus.tgt]).score
        logger.info(
            "val_bleu %.2f (%s, %d sentences, %.1f s)",
            score,
            "greedy" if beam_size == 1 else f"beam {beam_size}",
            len(hypotheses),
            time.perf_counter() - start,
        )
        return {"val_bleu": score}

    return hook
