"""How to search: :class:`DecodingConfig`, its bounds and the special ids it decodes with.

Lengths count generated tokens without bos and eos. The bounds are checked when a config is
made: beams above :data:`MAX_BEAM_SIZE`, non-finite or negative length settings and non-finite
length penalties are refused with a ValueError naming the field. The memory a search needs is
bounded separately, for a given model and batch (:mod:`attnkit.decoding.memory_bound`).

A model folder may store the search settings it was tuned with (a ``"decoding"`` object in
its ``config.json``: :data:`SEARCH_FIELDS`, e.g. the length penalty chosen on validation);
:meth:`DecodingConfig.from_search_settings` reads them, :meth:`DecodingConfig.search_settings`
writes them, and :func:`~attnkit.decoding.loading.model_decoding` gives a folder's defaults.

Special ids come from the tokenizer: ``bos_id`` / ``eos_id`` left None are filled by
:meth:`DecodingConfig.with_ids` (:class:`~attnkit.decoding.Translator` calls it), and only a
search run directly on ids falls back to :data:`DEFAULT_BOS_ID` / :data:`DEFAULT_EOS_ID`, the
fixed ids of attnkit's :class:`~attnkit.data.SubwordTokenizer`, read from that class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.decoding.search import LENGTH_PENALTY_STYLES, LengthPenalty

DEFAULT_BOS_ID = SubwordTokenizer.bos_id  # the ids of attnkit's tokenizer, used when a
DEFAULT_EOS_ID = SubwordTokenizer.eos_id  # DecodingConfig leaves bos_id/eos_id unset

__all__ = [
    "DEFAULT_BOS_ID",
    "DEFAULT_EOS_ID",
    "MAX_BEAM_SIZE",
    "MAX_LENPEN",
    "SEARCH_FIELDS",
    "DecodingConfig",
]


MAX_BEAM_SIZE = 1024
"""The largest beam :class:`DecodingConfig` accepts. Quality stops improving long before (beams
of 4-10 are usual, and larger beams favour short outputs); the memory check of
:func:`~attnkit.decoding.memory_bound.check_decoding_memory` is the bound that matters for a
given model and batch."""


MAX_LENPEN = 10.0
"""The largest length penalty exponent :class:`DecodingConfig` accepts, either sign. Usual
values lie between 0 and 2; far beyond, ``len ** lenpen`` leaves the float range (a
hypothesis of 200 tokens: 200 ** 1000 overflows, 200 ** -1000 is 0, and its score a division
by zero)."""


SEARCH_FIELDS = ("beam_size", "max_len_a", "max_len_b", "min_len", "lenpen", "lenpen_style")
"""The settings of :class:`DecodingConfig` that a model folder may store as its defaults: how
to search, not what to return (``n_best``), how to compute (``use_cache``) or the tokenizer's
ids."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class DecodingConfig:
    """How to search. Lengths count generated tokens without bos and eos.

    ``bos_id`` / ``eos_id`` None (the default) means "the tokenizer's":
    :class:`~attnkit.decoding.Translator` fills them from its tokenizer (:meth:`with_ids`), and
    :func:`~attnkit.decoding.generate` called directly on ids uses :data:`DEFAULT_BOS_ID` /
    :data:`DEFAULT_EOS_ID`, the fixed ids of attnkit's :class:`~attnkit.data.SubwordTokenizer`.
    """

    beam_size: int = 5  # 1 = greedy search; 1 <= beam_size <= MAX_BEAM_SIZE (and memory)
    max_len_a: float = 1.2  # a sentence stops after max_len_a * src_len + max_len_b tokens
    max_len_b: int = 10  # (src_len without eos/pad; capped by the model's max_len - 1)
    min_len: int = 1  # eos is forbidden before this many tokens (capped like the limit)
    lenpen: float = 1.0  # length penalty exponent alpha; 0 = rank by summed log-prob
    lenpen_style: str = "fairseq"  # "fairseq": len**alpha, "gnmt": ((5 + len) / 6)**alpha
    n_best: int = 1  # hypotheses returned per sentence (<= beam_size)
    use_cache: bool = True  # False: recompute the whole prefix at every step
    bos_id: int | None = None  # None: the tokenizer's (see the class docstring)
    eos_id: int | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.beam_size) or self.beam_size < 1:
            raise ValueError(f"beam_size: expected an integer >= 1, got {self.beam_size!r}")
        if self.beam_size > MAX_BEAM_SIZE:
            raise ValueError(
                f"beam_size: expected at most MAX_BEAM_SIZE={MAX_BEAM_SIZE}, got {self.beam_size} "
                "(beams of 4-10 are usual)"
            )
        for name in ("max_len_a", "max_len_b"):
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"max_len_a, max_len_b: expected >= 0 and finite, got {name}={value!r}"
                )
        if not _is_int(self.max_len_b):
            raise ValueError(f"max_len_b: expected an integer >= 0, got {self.max_len_b!r}")
        if not _is_int(self.min_len) or self.min_len < 0:
            raise ValueError(f"min_len: expected an integer >= 0, got {self.min_len!r}")
        if self.max_len_a == 0 and self.min_len > self.max_len_b:  # no output could obey both
            raise ValueError(
                f"max_len_b: {self.max_len_b} with max_len_a=0 is every output's longest length, "
                f"below min_len={self.min_len}; expected max_len_b >= min_len"
            )
        if not _is_real(self.lenpen) or not -MAX_LENPEN <= self.lenpen <= MAX_LENPEN:
            raise ValueError(
                f"lenpen: expected a number from {-MAX_LENPEN:g} to {MAX_LENPEN:g} (usual: 0 to "
                f"2), got {self.lenpen!r}"
            )
        if self.lenpen_style not in LENGTH_PENALTY_STYLES:
            raise ValueError(
                f"lenpen_style: expected one of {LENGTH_PENALTY_STYLES}, got {self.lenpen_style!r}"
            )
        if not _is_int(self.n_best) or not 1 <= self.n_best <= self.beam_size:
            raise ValueError(
                f"n_best: expected 1 <= n_best <= beam_size={self.beam_size}, got {self.n_best!r}"
            )
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 0):
                raise ValueError(f"{name}: expected None or an id >= 0, got {value!r}")
        if not isinstance(self.use_cache, bool):  # "no" and 0 would pass a truth test
            raise ValueError(f"use_cache: expected True or False, got {self.use_cache!r}")

    @classmethod
    def of(cls, config: object) -> DecodingConfig:
        """``config`` itself, or the default config for None.

        Raises:
            TypeError: for anything else (a dict of settings: ``DecodingConfig(**settings)``).
        """
        if config is None:
            return cls()
        if not isinstance(config, cls):
            raise TypeError(
                f"config: expected a DecodingConfig or None, got {type(config).__name__} "
                "(DecodingConfig(**settings) makes one from a dict)"
            )
        return config

    @property
    def length_penalty(self) -> LengthPenalty:
        return LengthPenalty(self.lenpen_style, self.lenpen)

    @property
    def bos(self) -> int:
        """The bos id in use: ``bos_id``, or attnkit's tokenizer's when None."""
        return DEFAULT_BOS_ID if self.bos_id is None else self.bos_id

    @property
    def eos(self) -> int:
        """The eos id in use: ``eos_id``, or attnkit's tokenizer's when None."""
        return DEFAULT_EOS_ID if self.eos_id is None else self.eos_id

    def search_settings(self) -> dict[str, int | float | str]:
        """The :data:`SEARCH_FIELDS` of this config, as a model folder stores them."""
        return {name: getattr(self, name) for name in SEARCH_FIELDS}

    @classmethod
    def from_search_settings(cls, settings: Mapping[str, object], where: str) -> DecodingConfig:
        """The config with ``settings`` (a model folder's stored :data:`SEARCH_FIELDS`) and the
        defaults for the rest.

        Raises:
            ValueError: naming ``where`` and the field, for a key that is not one of
                :data:`SEARCH_FIELDS` or a value out of bounds.
        """
        if not isinstance(settings, Mapping):
            raise ValueError(
                f"{where}: expected an object of decoding settings {SEARCH_FIELDS}, got "
                f"{type(settings).__name__}"
            )
        unknown = sorted(set(settings) - set(SEARCH_FIELDS))
        if unknown:
            raise ValueError(
                f"{where}: unknown decoding setting(s) {unknown}; expected some of {SEARCH_FIELDS}"
            )
        try:
            return cls(**settings)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None

    def with_ids(self, tokenizer) -> DecodingConfig:
        """This config with the bos and eos ids of ``tokenizer``.

        Raises:
            ValueError: if the config names other ids than the tokenizer's.
        """
        for name in ("bos_id", "eos_id"):
            mine, theirs = getattr(self, name), getattr(tokenizer, name)
            if mine is not None and mine != theirs:
                raise ValueError(
                    f"{name}: the config says {mine} but the tokenizer's is {theirs}; leave "
                    f"{name} unset to use the tokenizer's"
                )
        return replace(self, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)
