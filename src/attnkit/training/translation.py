"""Translation as a training task: parallel text, a joint BPE, an encoder-decoder Transformer.

The first :class:`~attnkit.training.task.Task`. Batches hold up to ``data.max_tokens`` padded
tokens from a length-bucketed order that is a pure function of ``(data.seed, epoch)`` and is
dealt to the ranks batch by batch (:class:`~attnkit.data.TokenBatchSampler`). The loss is
label-smoothed cross-entropy summed over the real target tokens; with ``data.bpe_dropout`` each
training batch is segmented afresh (BPE-dropout). The evaluation is the plain
cross-entropy per target token on the validation pairs, its perplexity, and optionally
(``optim.val_bleu``) greedy BLEU on rank 0.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from torch import Tensor, nn

from attnkit.data import Batch, Collator, ParallelCorpus, SubwordTokenizer, TokenBatchSampler
from attnkit.data.batching import NoPairFitsError, pair_length
from attnkit.models.transformer import Transformer
from attnkit.training import checkpoint as ckpt
from attnkit.training.config import TrainConfig
from attnkit.training.datasets import (
    Pairs,
    check_files,
    encode,
    load_text,
    train_tokenizer,
)
from attnkit.training.distributed import raise_together
from attnkit.training.sequence_loss import SequenceLoss, decoder_states
from attnkit.training.task import (
    DataPosition,
    EvalHook,
    RunContext,
    Task,
    on_main_rank,
    order_state,
    sharded_loss_sum,
    warn_if_order_changed,
)

logger = logging.getLogger(__name__)

# SequenceLoss and decoder_states live in attnkit.training.sequence_loss; re-exported here.
__all__ = ["SequenceLoss", "TranslationTask", "decoder_states"]


class TranslationTask(Task):
    """Sequence-to-sequence training on a parallel corpus (``[data]`` of the config).

    Args:
        eval_hook: Extra evaluation on rank 0; by default greedy BLEU when ``optim.val_bleu``.
    """

    higher_is_better = {"val_loss": False, "val_bleu": True}

    def __init__(self, eval_hook: EvalHook | None = None) -> None:
        self.eval_hook = eval_hook
        # Set by prepare(): the tokenizer, its collator, the encoded pairs and the batch orders.
        self.tokenizer: SubwordTokenizer | None = None
        self.collate: Collator | None = None
        self.train_pairs: Pairs | None = None
        self.val_pairs: Pairs | None = None
        # data.bpe_dropout > 0: the training text and a tokenizer that segments it afresh.
        self.train_text: ParallelCorpus | None = None
        self.segmenter: SubwordTokenizer | None = None
        self.sampler: TokenBatchSampler | None = None
        self.val_batches: list[list[int]] = []

    def check_data(self, config: TrainConfig) -> None:
        """With ``corpus = ""``: the four files can be opened (:func:`check_files`)."""
        if not config.data.corpus:
            keys = ("train_src", "train_tgt", "val_src", "val_tgt")
            check_files({f"data.{k}": getattr(config.data, k) for k in keys})

    def prepare(self, run: RunContext) -> TrainConfig:
        """Texts, tokenizer, encoded pairs, samplers; fills in the model's vocabulary size."""
        cfg, info = run.config, run.info
        text = load_text(cfg.data)
        if run.resume_from is not None:
            tokenizer_path = run.resume_from / ckpt.TOKENIZER
        else:
            tokenizer_path = run.out_dir / ckpt.TOKENIZER
            # Rank 0 trains it; the block ends with a collective, so the others read it after
            # it is saved, and they raise too if it fails instead of waiting forever.
            with raise_together(info):
                if info.is_main:
                    train_tokenizer(text, cfg.data).save(tokenizer_path)
        self.tokenizer = SubwordTokenizer.load(tokenizer_path)
        vocab = self.tokenizer.vocab_size
        model_cfg = replace(
            cfg.model, src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=self.tokenizer.pad_id
        )
        cfg = replace(cfg, model=model_cfg)
        max_len = cfg.data.max_len or model_cfg.max_len
        self.collate = Collator.for_tokenizer(
            self.tokenizer, pad_multiple=cfg.data.pad_multiple, max_width=model_cfg.max_len
        )
        self.train_pairs = encode(text.train, self.tokenizer)
        self.val_pairs = encode(text.val, self.tokenizer)
        if cfg.data.bpe_dropout > 0:
            self.train_text = text.train
            self.segmenter = self.tokenizer.with_bpe_dropout(cfg.data.bpe_dropout)
            logger.info(
                "BPE-dropout %g: every training batch is segmented afresh (batches are formed "
                "from the deterministic lengths)",
                cfg.data.bpe_dropout,
            )
        key = "data.max_len" if cfg.data.max_len else "model.max_len"

        def too_short(pairs: str, count: int) -> ValueError:
            return ValueError(
                f"{key} = {max_len}: none of the {count:,} {pairs} pairs fits in it (the longer "
                f"side's tokens with its end token); give a larger {key}"
            )

        try:
            self.sampler = TokenBatchSampler(
                self.train_pairs,
                max_tokens=cfg.data.max_tokens,
                max_len=max_len,
                seed=cfg.data.seed,
                num_shards=info.world_size,
                shard_index=info.rank,
            )
        except NoPairFitsError:
            raise too_short("training", len(self.train_pairs)) from None
        logger.info(
            "train: %d pairs kept, %d skipped as longer than max_len=%d; %d batches per "
            "epoch per rank (max_tokens=%d, accumulation=%d)",
            self.sampler.num_pairs,
            self.sampler.num_skipped,
            max_len,
            self.sampler.batches_per_shard,
            cfg.data.max_tokens,
            cfg.optim.accumulation,
        )
        self.val_batches = []
        if self.val_pairs:
            try:
                val_sampler = TokenBatchSampler(
                    self.val_pairs, max_tokens=cfg.data.max_tokens, max_len=max_len, shuffle=False
                )
            except NoPairFitsError:
                raise too_short("validation", len(self.val_pairs)) from None
            self.val_batches = list(val_sampler)
            logger.info(
                "validation: %d pairs kept, %d skipped as longer than max_len=%d",
                val_sampler.num_pairs,
                val_sampler.num_skipped,
                max_len,
            )
        if cfg.optim.val_bleu and self.eval_hook is None and text.val is not None:
            from attnkit.training.bleu import bleu_eval_hook

            n = cfg.optim.val_bleu_sentences or len(text.val)
            subset = ParallelCorpus(src=text.val.src[:n], tgt=text.val.tgt[:n])
            self.eval_hook = bleu_eval_hook(self.tokenizer, subset)
        return cfg

    def build_model(self, config: TrainConfig) -> Transformer:
        m = config.model
        model = Transformer(m)
        logger.info(
            "model: %.2fM parameters (d_model %d, %d+%d layers, %d heads, d_ff %d, vocab %d)",
            sum(p.numel() for p in model.parameters()) / 1e6,
            m.d_model,
            m.num_encoder_layers,
            m.num_decoder_layers,
            m.num_heads,
            m.d_ff,
            m.tgt_vocab_size,
        )
        return model

    def loss_module(self, model: nn.Module) -> SequenceLoss:
        return SequenceLoss(model)

    def loss_args(self, batch: Batch) -> tuple[Tensor, ...]:
        return batch.src, batch.tgt_in, batch.tgt_out

    def batch_tokens(self, batch: Batch) -> int:
        return batch.num_tgt_tokens

    @property
    def batches_per_epoch(self) -> int:
        return self.sampler.batches_per_shard

    @property
    def has_validation(self) -> bool:
        return bool(self.val_batches)

    def train_batches(self, start: DataPosition) -> Iterator[tuple[Batch, DataPosition]]:
        """This rank's batches from ``start`` on, epoch after epoch."""
        epoch, done, n = start.epoch, start.batch, self.batches_per_epoch
        while True:
            self.sampler.set_epoch(epoch, skip_batches=done)
            for indices in self.sampler:
                done += 1
                yield self.collate(self._batch_pairs(indices)), DataPosition(epoch, done, n)
            epoch, done = epoch + 1, 0

    def _batch_pairs(self, indices: list[int]) -> Pairs:
        """The encoded pairs of one training batch: as encoded once, or, with BPE-dropout,
        segmented afresh (a pair that the finer segmentation makes longer than the sampler's
        ``max_len`` keeps its deterministic ids, so every batch still fits the model)."""
        pairs = [self.train_pairs[i] for i in indices]
        if self.segmenter is None:
            return pairs
        src = self.segmenter.encode_batch([self.train_text.src[i] for i in indices])
        tgt = self.segmenter.encode_batch([self.train_text.tgt[i] for i in indices])
        return [
            (s, t) if pair_length(s, t) <= self.sampler.max_len else pair
            for s, t, pair in zip(src, tgt, pairs, strict=True)
        ]

    def evaluate(
        self, run: RunContext, model: nn.Module, loss_module: nn.Module
    ) -> dict[str, float]:
        """Validation loss (plain cross-entropy per target token) and perplexity, plus the
        hook's metrics; the same numbers on every rank."""

        def make_batch(i: int) -> Batch:
            return self.collate([self.val_pairs[j] for j in self.val_batches[i]])

        loss, tokens = sharded_loss_sum(run, self, loss_module, len(self.val_batches), make_batch)
        val_loss = loss / tokens
        metrics = {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 700.0))}
        if self.eval_hook is not None:
            hook = self.eval_hook
            metrics.update(on_main_rank(run, lambda: hook(model)))
        return metrics

    def checkpoint_state(self, position: DataPosition) -> dict[str, Any]:
        s = self.sampler
        return order_state("sampler", s.seed, s.num_shards, position, batch_key="skip_batches")

    def check_resumed(self, saved_state: dict[str, Any]) -> None:
        s = self.sampler
        warn_if_order_changed(saved_state, "sampler", s.seed, s.num_shards, "the batch order")
