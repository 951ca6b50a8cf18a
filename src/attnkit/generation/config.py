"""What to generate and how: one frozen dataclass, checked when it is made."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from attnkit.generation.sampling import check_seed

__all__ = ["GenerationConfig", "resolve_config"]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class GenerationConfig:
    """Settings of :func:`~attnkit.generation.generate` (Hugging Face's meanings and order).

    ``temperature == 0`` is greedy decoding (the default): the most probable token after the
    repetition penalty. ``top_k`` and ``top_p`` only shape sampling, so asking for them with
    ``temperature == 0`` is an error rather than silently ignored.

    ``logprobs`` is off by default, as in Hugging Face's ``generate`` (``output_scores``) and
    CTranslate2 (``return_log_prob``): each step then skips a log-softmax over the whole
    vocabulary (docs/benchmarks.md: 0.41-0.55 ms of a 12.7 ms step at 8 rows of GPT-2's 50,257
    ids on an AVX2 CPU). ``attnkit generate --json`` turns it on.

    ``compile`` runs the one-token steps through ``torch.compile`` (a C++ compiler is needed on
    a CPU, and the first call compiles for 16-80 s): 1.19-1.35x faster steps on the Intel
    Xeon with AMX where it was measured, for long generation
    (:mod:`~attnkit.generation.compiled`; docs/benchmarks.md, "A compiled decoding step").
    """

    max_new_tokens: int = 64  # tokens to generate per prompt (fewer if a row stops early)
    temperature: float = 0.0  # 0 = greedy; > 0 = sample from softmax(logits / temperature)
    top_k: int = 0  # keep the k most probable tokens when sampling; 0 = off
    top_p: float = 1.0  # keep the smallest set with probability >= top_p; 1 = off
    repetition_penalty: float = 1.0  # CTRL's penalty on ids seen (prompt included); 1 = off
    eos_ids: tuple[int, ...] | None = None  # ids ending a row (or one id); None = the model's eos
    stop_strings: tuple[str, ...] = ()  # text that ends a row (the text is cut before it)
    seed: int | None = None  # the sampler's seed, 0 to 2**64 - 1; None = not reproducible
    use_cache: bool = True  # False: recompute the whole prefix at every step (reference path)
    logprobs: bool = False  # also return each new id's log-probability (one log-softmax a step)
    compile: bool = False  # run the one-token steps through torch.compile (generation/compiled.py)

    def __post_init__(self) -> None:
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(
                f"max_new_tokens: expected an integer >= 1, got {self.max_new_tokens!r}"
            )
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature: expected a finite number >= 0 (0 = greedy), got {t!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k: expected an integer >= 0 (0 = off), got {self.top_k!r}")
        if (
            isinstance(self.top_p, bool)
            or not isinstance(self.top_p, (int, float))
            or not (0 < self.top_p <= 1)
        ):
            raise ValueError(f"top_p: expected 0 < top_p <= 1 (1 = off), got {self.top_p!r}")
        if t == 0 and (self.top_k or self.top_p < 1):
            raise ValueError(
                f"top_k={self.top_k}, top_p={self.top_p}: they only apply when sampling, but "
                "temperature=0 means greedy; pass a temperature > 0 (e.g. 1.0) to sample"
            )
        r = self.repetition_penalty
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (0 < r < math.inf):
            raise ValueError(
                f"repetition_penalty: expected a finite number > 0 (1 = off), got {r!r}"
            )
        if self.eos_ids is not None:
            object.__setattr__(self, "eos_ids", _as_ids("eos_ids", self.eos_ids))
        if isinstance(self.stop_strings, str):
            raise TypeError(
                f"stop_strings: expected a sequence of strings, got the string {self.stop_strings!r}"
            )
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        if not all(isinstance(s, str) and s for s in self.stop_strings):
            raise ValueError(f"stop_strings: expected non-empty strings, got {self.stop_strings!r}")
        check_seed(self.seed)
        if not isinstance(self.logprobs, bool):
            raise TypeError(f"logprobs: expected True or False, got {self.logprobs!r}")
        if not isinstance(self.compile, bool):
            raise TypeError(f"compile: expected True or False, got {self.compile!r}")
        if not isinstance(self.use_cache, bool):  # "no" would pass a truth test
            raise TypeError(f"use_cache: expected True or False, got {self.use_cache!r}")
        if self.compile and not self.use_cache:
            raise ValueError(
                "compile=True compiles the steps that read the cache; it needs use_cache=True"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _as_ids(name: str, value) -> tuple[int, ...]:
    """``value`` as a tuple of ids >= 0: a sequence of ints, or one int (a one-id tuple)."""
    if _is_int(value):
        value = (value,)
    elif isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(
            f"{name}: expected an id or a sequence of ids (ints), got {type(value).__name__} "
            f"{value!r:.80}"
        )
    ids = tuple(value)
    if not all(_is_int(i) and i >= 0 for i in ids):
        raise ValueError(f"{name}: expected ids >= 0 (ints), got {ids!r:.80}")
    return ids


def resolve_config(config: GenerationConfig | None) -> GenerationConfig:
    """``config``, or the defaults for None; anything else (a dict, say) is a TypeError."""
    if config is None:
        return GenerationConfig()
    if not isinstance(config, GenerationConfig):
        raise TypeError(
            f"config: expected a GenerationConfig (or None for the defaults), got "
            f"{type(config).__name__}; for a dict of settings pass GenerationConfig(**settings)"
        )
    return config
