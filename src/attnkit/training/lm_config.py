"""A language model's training config (``task = "lm"``): its ``[data]`` section
(:class:`LMDataConfig`), the checks across its sections, and what a resume may change.

:mod:`attnkit.training.config` reads, overrides and writes every task's config and calls the
checks here for ``task = "lm"``; its ``[model]`` is a :class:`~attnkit.models.GPTConfig` and
its ``[optim]`` the shared :class:`~attnkit.training.config.OptimConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnkit.data.corpus import NAMED_TEXTS
from attnkit.data.lm_tokenizer import LM_TOKENIZERS
from attnkit.models.config_checks import check_choice, check_size
from attnkit.models.gpt import GPTConfig
from attnkit.training.limits import check_section

if TYPE_CHECKING:  # config.py imports this module
    from attnkit.training.config import OptimConfig, TrainConfig

__all__ = [
    "LM_RESUME_FIXED_DATA_KEYS",
    "LM_RESUME_FREE_MODEL_KEYS",
    "LM_TOKENIZER_MODEL_KEYS",
    "LMDataConfig",
    "check_lm_config",
    "lm_resume_conflicts",
]

# A language model's [model] keys set from its tokenizer, never from a config file.
LM_TOKENIZER_MODEL_KEYS = ("vocab_size", "bos_token_id", "eos_token_id")
# What a resumed language-model run may change in [model] (the dropouts) and may not change in
# [data] (what the tokenizer and the training text were made from); every [optim] key may.
LM_RESUME_FREE_MODEL_KEYS = frozenset({"dropout", "attn_dropout", "embed_dropout"})
LM_RESUME_FIXED_DATA_KEYS = frozenset(
    {"corpus", "train_file", "max_train_chars", "tokenizer", "vocab_size", "min_frequency"}
)


@dataclass
class LMDataConfig:
    """Where a language model's text comes from and how it becomes windows of tokens."""

    corpus: str = "shakespeare"  # shipped text corpus name, or "" (train_file / val_file)
    train_file: str = ""  # with corpus = "": training text, UTF-8 (plain or gzipped)
    val_file: str = ""  # with corpus = "": validation text ("" = no validation)
    max_train_chars: int = 0  # keep only the first N characters of the training text (0 = all)
    max_val_chars: int = 0  # keep only the first N characters of the validation text (0 = all)
    tokenizer: str = "char"  # "char" (one token a character) or "bpe" (byte-level BPE)
    vocab_size: int = 2048  # tokenizer = "bpe": the vocabulary, its 256 byte tokens included
    min_frequency: int = 2  # tokenizer = "bpe": a merge needs this many occurrences
    batch_size: int = 32  # windows per micro-batch (per rank)
    context_length: int = 0  # tokens a window predicts; 0 = model.context_length
    seed: int = 0  # seed of the windows' random offsets

    def __post_init__(self) -> None:
        corpora = [*sorted(NAMED_TEXTS), ""]
        if self.corpus not in corpora:
            raise ValueError(
                f"data.corpus: expected one of {corpora} ('' = your own text, train_file and "
                f"val_file), got {self.corpus!r}"
            )
        if not self.corpus and not self.train_file:
            raise ValueError('data: with corpus = "" train_file must name a text file')
        check_section("data", self)  # vocab_size, min_frequency, seed
        check_choice("data.tokenizer", self.tokenizer, LM_TOKENIZERS)
        for name in ("max_train_chars", "max_val_chars"):
            check_size(f"data.{name}", getattr(self, name), minimum=0, maximum=10**11)
        check_size("data.batch_size", self.batch_size, maximum=2**16)
        check_size("data.context_length", self.context_length, minimum=0)


def check_lm_config(model: GPTConfig, data: LMDataConfig, optim: OptimConfig) -> None:
    """The checks across a language model's sections (each section checks its own keys).

    Raises:
        ValueError: If the model cannot be saved as a GPT-2 folder, ``optim.val_bleu`` is on,
            the model would be invalid at the BPE vocabulary size, or the data's window is
            longer than the model reads.
    """
    from attnkit.models.gpt_hf import config_to_hf

    try:  # checkpoints are GPT-2 folders: learned positions, biases
        config_to_hf(model)
    except ValueError as err:
        raise ValueError(f"[model]: {err}") from None
    if optim.val_bleu:
        raise ValueError("optim.val_bleu=true: BLEU is for translation, not task = 'lm'")
    if data.tokenizer == "bpe":
        try:  # the model at the vocabulary the tokenizer will have
            dataclasses.replace(
                model, vocab_size=data.vocab_size, bos_token_id=None, eos_token_id=None
            )
        except ValueError as err:
            raise ValueError(f"[model] with data.vocab_size={data.vocab_size}: {err}") from None
    if data.context_length > model.context_length:
        raise ValueError(
            f"data.context_length={data.context_length} exceeds model.context_length="
            f"{model.context_length}, the longest sequence the model reads"
        )


def lm_resume_conflicts(saved: TrainConfig, new: TrainConfig) -> list[str]:
    """The keys a resumed language-model run may not change and that differ: every
    ``[model]`` key but the dropouts (and those set from the tokenizer), and the
    :data:`LM_RESUME_FIXED_DATA_KEYS` of ``[data]`` (as
    :func:`attnkit.training.limits.resume_conflicts` for translation).

    Returns:
        Lines ``"model.n_embd = 64 (the run has 32)"``, empty when the resume may proceed.
    """
    conflicts = []
    for section, keys in (
        ("model", {f.name for f in dataclasses.fields(GPTConfig)} - LM_RESUME_FREE_MODEL_KEYS),
        ("data", LM_RESUME_FIXED_DATA_KEYS),
    ):
        for key in sorted(keys - set(LM_TOKENIZER_MODEL_KEYS)):
            old, value = getattr(getattr(saved, section), key), getattr(getattr(new, section), key)
            if value != old:
                conflicts.append(f"{section}.{key} = {value!r} (the run has {old!r})")
    return conflicts
