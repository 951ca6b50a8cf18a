"""The values a training config may hold: every number's range, and what a resume may change.

Every numeric field of the ``[data]`` and ``[optim]`` sections has a range here
(:data:`INT_RANGES`, :data:`NUMBER_RANGES`), checked with
:mod:`attnkit.models.config_checks` when a config is built (from a file, from ``--set`` or in
code), so a negative, zero, NaN or absurdly large value fails at once with the field's name
instead of deep inside PyTorch. The upper bounds are far beyond what attnkit trains (an extra
zero passes, six do not). ``[model]`` fields are checked by
:class:`~attnkit.models.TransformerConfig` itself.

A resumed run keeps its weights and tokenizer, so it may not change the keys that shaped
them (:func:`resume_conflicts` for translation, ``lm_config.lm_resume_conflicts`` for a
language model): every ``[model]`` key but the dropouts, and the ``[data]`` keys that choose
the training text the tokenizer was trained on.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from attnkit.models.config_checks import MAX_SIZE, check_number, check_size

BIG = 10**9  # "no practical limit" for counts of steps, pairs and evaluations
SEED = (0, 2**32 - 1)  # what numpy and torch accept as a seed everywhere

# Integer fields: (minimum, maximum), checked with config_checks.check_size.
INT_RANGES: dict[str, tuple[int, int]] = {
    "data.max_train_pairs": (0, BIG),
    "data.vocab_size": (261, MAX_SIZE),  # 4 specials + 256 bytes + at least one merge
    "data.min_frequency": (1, BIG),
    "data.max_tokens": (1, 2**24),
    "data.max_len": (0, 65536),
    "data.seed": SEED,
    "data.pad_multiple": (1, 1024),
    "data.copy_train_pairs": (0, 10**7),
    "data.copy_val_pairs": (0, 10**7),
    "data.copy_words": (1, 10**6),
    "data.copy_min_len": (1, 10**4),
    "data.copy_max_len": (1, 10**4),
    "optim.warmup_steps": (1, BIG),
    "optim.accumulation": (1, 4096),
    "optim.max_steps": (0, 10**10),
    "optim.max_epochs": (0, 10**7),
    "optim.patience": (0, 10**6),
    "optim.val_bleu_sentences": (0, BIG),
    "optim.log_every": (1, BIG),
    "optim.eval_every": (0, BIG),
    "optim.save_every": (0, BIG),
    "optim.keep_checkpoints": (0, 10**4),
    "optim.seed": SEED,
    "optim.threads": (0, 4096),
}
# Float fields: keyword arguments of config_checks.check_number (finite, within the bounds).
FRACTION = dict(low=0.0, high=1.0, high_open=True)
NUMBER_RANGES: dict[str, dict[str, Any]] = {
    "data.bpe_dropout": FRACTION,
    "optim.lr_scale": dict(low=0.0, high=1000.0, low_open=True),
    "optim.cooldown": dict(low=0.0, high=1.0),
    "optim.betas": FRACTION,  # each of the two
    "optim.eps": dict(low=0.0, high=1.0, low_open=True),
    "optim.weight_decay": dict(low=0.0, high=1000.0),
    "optim.clip_norm": dict(low=0.0, high=1e9),
    "optim.label_smoothing": FRACTION,
    "optim.max_minutes": dict(low=0.0, high=1e7),  # 19 years
}

# Set from the tokenizer, never from a config file (and so never in conflict on resume).
TOKENIZER_MODEL_KEYS = ("src_vocab_size", "tgt_vocab_size", "pad_id")

# Keys a resumed run may change although they are in these sections: they shape neither the
# weights nor the tokenizer (every [optim] key may change).
RESUME_FREE_MODEL_KEYS = frozenset({"dropout", "attn_dropout", "ffn_dropout"})
RESUME_FIXED_DATA_KEYS = frozenset(
    {
        "corpus",
        "src_lang",
        "tgt_lang",
        "train_split",
        "train_src",
        "train_tgt",
        "max_train_pairs",
        "clean_sources",
        "vocab_size",
        "min_frequency",
        "copy_train_pairs",
        "copy_words",
        "copy_min_len",
        "copy_max_len",
    }
)


def check_range(name: str, value: Any) -> None:
    """Raises ``ValueError`` naming ``name`` (``section.key``) if ``value`` has the wrong type
    or lies outside its range; fields without a range (strings, booleans) pass."""
    if name in INT_RANGES:
        low, high = INT_RANGES[name]
        check_size(name, value, minimum=low, maximum=high)
    elif name in NUMBER_RANGES:
        for v in value if isinstance(value, (list, tuple)) else [value]:
            check_number(name, v, **NUMBER_RANGES[name])


def check_section(section: str, config: Any) -> None:
    """:func:`check_range` on every field of a section dataclass."""
    for f in dataclasses.fields(config):
        check_range(f"{section}.{f.name}", getattr(config, f.name))


def resume_conflicts(saved: Any, new: Any) -> list[str]:
    """The ``[model]`` and ``[data]`` keys a resumed run may not change and that differ.

    Args:
        saved: The run's saved :class:`~attnkit.training.config.TrainConfig`.
        new: The config the resumed run would use.

    Returns:
        Lines ``"model.d_model = 64 (the run has 32)"``, empty when the resume may proceed.
    """
    out = []
    for section, fixed in (("model", None), ("data", RESUME_FIXED_DATA_KEYS)):
        old_values = dataclasses.asdict(getattr(saved, section))
        new_values = dataclasses.asdict(getattr(new, section))
        for key, old in old_values.items():
            if fixed is None and key in (*RESUME_FREE_MODEL_KEYS, *TOKENIZER_MODEL_KEYS):
                continue
            if fixed is not None and key not in fixed:
                continue
            if new_values[key] != old:
                out.append(f"{section}.{key} = {new_values[key]!r} (the run has {old!r})")
    return out


def check_resume(
    saved: Any,
    new: Any,
    saved_file: str | os.PathLike[str],
    *,
    rule: Callable[[Any, Any], list[str]] = resume_conflicts,
) -> None:
    """Raises ``ValueError`` listing the conflicts of a resume, if any.

    Args:
        saved: The run's saved config.
        new: The config the resumed run would use.
        saved_file: Where ``saved`` was read, named in the message.
        rule: The task's conflicts: :func:`resume_conflicts` (translation) or
            :func:`attnkit.training.lm_config.lm_resume_conflicts`.
    """
    conflicts = rule(saved, new)
    if conflicts:
        raise ValueError(
            f"--resume: cannot change {'; '.join(conflicts)}: the run's weights and tokenizer "
            f"were made with the values in {os.fspath(saved_file)}; start a new run to change them"
        )
