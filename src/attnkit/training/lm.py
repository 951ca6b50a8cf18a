"""Language modelling as a training task: one long text, a character or byte-level BPE
tokenizer, a GPT.

The second :class:`~attnkit.training.task.Task` (``task = "lm"`` in the config). Batches are
windows of ``context + 1`` tokens at seeded random offsets (:class:`~attnkit.data.lm.
RandomWindows`: a pure function of the seed, the rank and the position, so a resume draws the
very same windows). The loss is the cross-entropy of every next token of every window, summed
(label-smoothed with ``optim.label_smoothing``), computed with the output projection fused in
(:func:`~attnkit.training.loss.linear_cross_entropy`). The evaluation scores the whole
validation text once in consecutive windows (:func:`~attnkit.data.lm.eval_windows`):

* ``val_loss``: nats per token; ``val_ppl``: its perplexity;
* ``val_nats_per_char``: total nats / characters of the text, and ``val_bits_per_char``, which
  compare a character model with a BPE model;

and rank 0 writes a sample to the log (a few dozen tokens from a fixed prompt with a fixed
seed, through :mod:`attnkit.generation`, which never touches the global random state).

:func:`text_loss` scores any text with a GPT (``attnkit evaluate --text``).
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from attnkit import model_folder as mf
from attnkit.data.corpus import load_named_text, read_text
from attnkit.data.lm import LMBatch, RandomWindows, eval_batches
from attnkit.data.lm_tokenizer import newline_id, train_lm_tokenizer
from attnkit.models.gpt import GPT
from attnkit.models.gpt_tokenizer import GPTTokenizer
from attnkit.training.config import TrainConfig
from attnkit.training.datasets import check_files
from attnkit.training.distributed import raise_together
from attnkit.training.lm_config import LMDataConfig
from attnkit.training.loss import linear_cross_entropy
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

__all__ = ["LMLoss", "LMTask", "TextLoss", "load_lm_text", "text_loss"]


class LMLoss(nn.Module):
    """GPT and next-token loss in one forward (one module call for DDP and torch.compile).

    Args:
        model: The GPT.
    """

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: Tensor, targets: Tensor, epsilon: float) -> Tensor:
        """Summed (label-smoothed) cross-entropy of ``targets`` (B, T) given ``inputs`` (B, T)."""
        hidden = self.model(inputs, project=False).hidden  # (B, T, d_model)
        # The (B*T, V) logits are never stored: projection and loss are fused chunk by chunk.
        return linear_cross_entropy(
            hidden.flatten(0, 1), self.model.lm_head.weight, targets.flatten(), epsilon=epsilon
        )  # (B*T, d_model) x (V, d_model) -> scalar


@dataclass(frozen=True)
class LMText:
    """Training and (optional) validation text."""

    train: str
    val: str | None


def load_lm_text(cfg: LMDataConfig) -> LMText:
    """The texts ``cfg`` names (a shipped corpus or files), cut to ``max_*_chars``.

    Raises:
        ValueError: If a text is empty or unreadable (naming the file).
    """
    if cfg.corpus:
        train = load_named_text(cfg.corpus, "train")
        val = load_named_text(cfg.corpus, "val")
    else:
        train = read_text(cfg.train_file)
        val = read_text(cfg.val_file) if cfg.val_file else None
    if cfg.max_train_chars:
        train = train[: cfg.max_train_chars]
    if val is not None and cfg.max_val_chars:
        val = val[: cfg.max_val_chars]
    where = cfg.corpus or cfg.train_file
    if not train:
        raise ValueError(f"data: the training text ({where}) is empty")
    if val == "":
        raise ValueError(f"data: the validation text ({cfg.corpus or cfg.val_file}) is empty")
    logger.info(
        "data: %s training characters, %s validation characters (%s)",
        f"{len(train):,}",
        "0" if val is None else f"{len(val):,}",
        where,
    )
    return LMText(train=train, val=val)


def encode_text(tokenizer: GPTTokenizer, text: str) -> Tensor:
    """(N,) long ids of ``text``."""
    return torch.tensor(tokenizer.encode(text), dtype=torch.long)


class LMTask(Task):
    """Next-token prediction on one text (``[data]`` an :class:`LMDataConfig`).

    Args:
        eval_hook: Extra evaluation on rank 0, logged with the validation metrics.
        sample_prompt: The prompt of the sample written to the log at each evaluation.
        sample_tokens: Its length in tokens (0 = no sample).
        sample_temperature: Its sampling temperature (0 = greedy).
        sample_seed: Its seed (the same sample for the same weights).
    """

    higher_is_better = {
        "val_loss": False,
        "val_ppl": False,
        "val_nats_per_char": False,
        "val_bits_per_char": False,
    }

    def __init__(
        self,
        eval_hook: EvalHook | None = None,
        *,
        sample_prompt: str = "\n",
        sample_tokens: int = 64,
        sample_temperature: float = 0.8,
        sample_seed: int = 0,
    ) -> None:
        self.eval_hook = eval_hook
        self.sample_prompt = sample_prompt
        self.sample_tokens = sample_tokens
        self.sample_temperature = sample_temperature
        self.sample_seed = sample_seed
        self.tokenizer: GPTTokenizer | None = None

    def check_data(self, config: TrainConfig) -> None:
        """With ``corpus = ""``: ``train_file`` and ``val_file`` can be opened."""
        if not config.data.corpus:
            keys = ("train_file", "val_file")
            check_files({f"data.{k}": getattr(config.data, k) for k in keys})

    def prepare(self, run: RunContext) -> TrainConfig:
        """Texts, tokenizer, ids and windows; fills in the model's vocabulary and bos."""
        cfg, info = run.config, run.info
        data = cfg.data
        text = load_lm_text(data)
        if run.resume_from is not None:
            tokenizer_path = run.resume_from / mf.TOKENIZER_FILE
        else:
            tokenizer_path = run.out_dir / mf.TOKENIZER_FILE
            # Rank 0 trains it; the others read it once it is saved, and raise with it.
            with raise_together(info):
                if info.is_main:
                    tokenizer = train_lm_tokenizer(
                        data.tokenizer,
                        text.train,
                        vocab_size=data.vocab_size,
                        min_frequency=data.min_frequency,
                    )
                    GPTTokenizer(tokenizer).save(tokenizer_path)
        self.tokenizer = GPTTokenizer.from_file(tokenizer_path)
        bos = newline_id(self.tokenizer.tokenizer)
        model_cfg = replace(
            cfg.model, vocab_size=self.tokenizer.vocab_size, bos_token_id=bos, eos_token_id=None
        )
        cfg = replace(cfg, model=model_cfg)
        context = cfg.context_length
        train_ids = encode_text(self.tokenizer, text.train)
        if len(train_ids) < context + 1:  # in the config's terms (RandomWindows says it too)
            key = "data.context_length" if data.context_length else "model.context_length"
            source = (
                f"data.corpus={data.corpus!r}"
                if data.corpus
                else f"data.train_file={data.train_file!r}"
            )
            cut = (
                f" cut to data.max_train_chars={data.max_train_chars}"
                if data.max_train_chars
                else ""
            )
            raise ValueError(
                f"{source}{cut}: {len(train_ids):,} tokens, fewer than one window of {key} + 1 "
                f"= {context + 1}; give a longer training text or a shorter {key}"
            )
        self.windows = RandomWindows(
            train_ids,
            context=context,
            batch_size=data.batch_size,
            seed=data.seed,
            num_shards=info.world_size,
            shard_index=info.rank,
        )
        logger.info(
            "tokenizer: %s, %d tokens; train: %s tokens (%.2f characters a token), %d batches "
            "of %d windows of %d per epoch per rank",
            data.tokenizer,
            self.tokenizer.vocab_size,
            f"{len(train_ids):,}",
            len(text.train) / len(train_ids),
            self.windows.batches_per_epoch,
            data.batch_size,
            context,
        )
        self.val_batches: list[LMBatch] = []
        self.val_chars = 0
        if text.val is not None:
            val_ids = encode_text(self.tokenizer, text.val)
            self.val_batches = eval_batches(val_ids, context, data.batch_size, bos)
            self.val_chars = len(text.val)
            logger.info(
                "validation: %s tokens, %s characters, %d batches",
                f"{len(val_ids):,}",
                f"{self.val_chars:,}",
                len(self.val_batches),
            )
        return cfg

    def build_model(self, config: TrainConfig) -> GPT:
        m = config.model
        model = GPT(m, tokenizer=self.tokenizer)
        logger.info(
            "model: GPT, %.2fM parameters (d_model %d, %d layers, %d heads, d_ff %d, context %d, "
            "vocab %d)",
            model.num_parameters() / 1e6,
            m.d_model,
            m.num_layers,
            m.num_heads,
            m.d_ff,
            m.context_length,
            m.vocab_size,
        )
        return model

    def loss_module(self, model: nn.Module) -> LMLoss:
        return LMLoss(model)

    def loss_args(self, batch: LMBatch) -> tuple[Tensor, ...]:
        return batch.inputs, batch.targets

    def batch_tokens(self, batch: LMBatch) -> int:
        return batch.num_tokens

    @property
    def batches_per_epoch(self) -> int:
        return self.windows.batches_per_epoch

    @property
    def has_validation(self) -> bool:
        return bool(self.val_batches)

    def train_batches(self, start: DataPosition) -> Iterator[tuple[LMBatch, DataPosition]]:
        """This rank's batches from ``start`` on, epoch after epoch."""
        epoch, done, n = start.epoch, start.batch, self.batches_per_epoch
        while True:
            for b in range(done, n):
                yield self.windows.batch(epoch, b), DataPosition(epoch, b + 1, n)
            epoch, done = epoch + 1, 0

    def evaluate(
        self, run: RunContext, model: nn.Module, loss_module: nn.Module
    ) -> dict[str, float]:
        """Validation loss per token and per character (the same on every rank); rank 0
        logs a sample."""
        nats, tokens = sharded_loss_sum(
            run, self, loss_module, len(self.val_batches), self.val_batches.__getitem__
        )
        val_loss = nats / tokens
        metrics = {
            "val_loss": val_loss,
            "val_ppl": math.exp(min(val_loss, 700.0)),
            "val_nats_per_char": nats / self.val_chars,
            "val_bits_per_char": nats / self.val_chars / math.log(2),
        }
        # No sample from weights that diverged: generation refuses NaN logits, and the
        # trainer names the non-finite loss.
        if self.sample_tokens and run.info.is_main and math.isfinite(val_loss):
            # In float32, outside the run's autocast: generation's packed linears ignore
            # autocast while the cache takes its dtype (a float32 query, bf16 keys).
            logger.info("sample: %r", self.sample(model))
        if self.eval_hook is not None:
            hook = self.eval_hook
            metrics.update(on_main_rank(run, lambda: hook(model)))
        return metrics

    def sample(self, model: GPT) -> str:
        """The prompt and the model's continuation (the fixed prompt, length and seed)."""
        from attnkit.generation import GenerationConfig, generate_text

        room = model.config.context_length - len(self.tokenizer.encode(self.sample_prompt))
        config = GenerationConfig(
            max_new_tokens=max(1, min(self.sample_tokens, room)),
            temperature=self.sample_temperature,
            seed=self.sample_seed,
        )
        result = generate_text(model, self.tokenizer, [self.sample_prompt], config)[0]
        return self.sample_prompt + result.text

    def checkpoint_state(self, position: DataPosition) -> dict[str, Any]:
        return order_state("windows", self.windows.seed, self.windows.num_shards, position)

    def check_resumed(self, saved_state: dict[str, Any]) -> None:
        w = self.windows
        warn_if_order_changed(saved_state, "windows", w.seed, w.num_shards, "the windows")


# --------------------------------------------------------------------------- scoring a text


@dataclass(frozen=True)
class TextLoss:
    """How well a model predicts a text (:func:`text_loss`)."""

    nats: float  # summed cross-entropy of the scored tokens
    tokens: int  # tokens scored
    characters: int  # characters of the text they spell

    @property
    def loss_per_token(self) -> float:
        return self.nats / self.tokens

    @property
    def nats_per_char(self) -> float:
        return self.nats / self.characters

    @property
    def bits_per_char(self) -> float:
        return self.nats_per_char / math.log(2)


PROGRESS_BATCHES = 10  # text_loss shows a progress bar from this many batches on


@torch.no_grad()
def text_loss(
    model: GPT, tokenizer, text: str, *, batch_size: int = 8, progress: bool = False
) -> TextLoss:
    """The cross-entropy of ``text`` under ``model``, scored in consecutive windows of the
    model's context (:func:`~attnkit.data.lm.eval_windows`) after the model's bos.

    Every token is scored when the model has a ``bos_token_id``; without one the first token
    has nothing to be predicted from and is left out, with its characters. ``progress``: a
    tqdm bar of the batches on standard error, when it is a terminal and there are at least
    :data:`PROGRESS_BATCHES` of them (the Shakespeare train text with the shipped GPT: 1.6
    million tokens, about a minute on two cores).

    Raises:
        ValueError: If ``text`` gives no token to score.
    """
    ids = tokenizer.encode(text)
    bos = model.config.bos_token_id
    characters = len(text)
    if bos is None and ids:
        characters -= len(tokenizer.decode(ids[:1]))
    scored = len(ids) if bos is not None else len(ids) - 1
    if scored < 1:
        raise ValueError(
            f"text: {len(ids)} token(s), nothing to score (the model has no bos_token_id to "
            "predict the first token from)"
            if ids
            else "text: no tokens to score (empty text)"
        )
    device = next(model.parameters()).device
    loss = LMLoss(model)
    was_training = model.training
    model.eval()
    try:
        nats = 0.0
        batches = eval_batches(ids, model.config.context_length, batch_size, bos)
        if progress and len(batches) >= PROGRESS_BATCHES:
            from tqdm import tqdm

            batches = tqdm(batches, desc="scoring", unit="batch", file=sys.stderr, disable=None)
        for batch in batches:
            batch = batch.to(device)
            nats += float(loss(batch.inputs, batch.targets, 0.0).double())
    finally:
        model.train(was_training)
    return TextLoss(nats=nats, tokens=scored, characters=characters)
