"""Text in, text out: prompts are encoded, new ids decoded as they come, stop strings cut.

:func:`generate_text` returns whole results; :func:`stream_text` yields text as it is
decoded, never half a UTF-8 character (:class:`~attnkit.generation.streaming.
IncrementalDetokenizer`) and never text that may turn out to be the start of a stop string
(:class:`~attnkit.generation.stopping.StopStrings`). Both run
:func:`~attnkit.generation.generate.generate_steps` with a stop condition that checks the
decoded text of each row after every token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field

from attnkit.generation.config import GenerationConfig, resolve_config
from attnkit.generation.generate import Step, generate_steps
from attnkit.generation.stopping import StopStrings
from attnkit.generation.streaming import IncrementalDetokenizer
from attnkit.texts import check_texts, check_tokenizer

__all__ = ["GeneratedText", "encode_prompts", "generate_text", "stream_text"]


@dataclass
class GeneratedText:
    """One prompt's result.

    Attributes:
        text: the new text, cut before a stop string; an ending eos is not part of it.
        tokens: the new ids (an ending eos included; after a stop string, the ids up to the
            one that completed it).
        logprobs: the model's log-probability of each new id; None unless
            ``GenerationConfig.logprobs``.
        finish_reason: "eos", "stop" or "length".
    """

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    finish_reason: str = "length"


class _RowText:
    """One row's text: ids -> whole characters -> text cut at a stop string."""

    def __init__(self, decode, stop_strings: Sequence[str], context: Sequence[int]) -> None:
        self.detokenizer = IncrementalDetokenizer(decode, context)
        self.stops = StopStrings(stop_strings)
        self.result = GeneratedText()
        self.pending = ""  # text shown since the caller last took it

    def add(self, token: int, logprob: float | None, finished: str | None) -> bool:
        """Record one step; return whether a stop string has appeared."""
        r = self.result
        r.tokens.append(token)
        if logprob is not None:
            if r.logprobs is None:
                r.logprobs = []
            r.logprobs.append(logprob)
        text = "" if finished == "eos" else self.detokenizer.push(token)
        text = self.stops.feed(text)
        if finished is not None and not self.stops.stopped:
            text += self.stops.feed(self.detokenizer.flush())
            text += self.stops.flush()
        self.pending += text
        r.text += text
        if finished is not None or self.stops.stopped:
            r.finish_reason = "stop" if self.stops.stopped and finished != "eos" else finished
        return self.stops.stopped

    def take(self) -> str:
        text, self.pending = self.pending, ""
        return text


def encode_prompts(model, tokenizer, prompts: Sequence[str]) -> list[list[int]]:
    """Encode each prompt; an empty prompt becomes the model's bos (GPT-2: ``<|endoftext|>``)."""
    check_tokenizer(tokenizer)
    prompts = check_texts(prompts, "prompts", item="prompt")
    bos = getattr(model.config, "bos_token_id", None)
    encoded = []
    for i, prompt in enumerate(prompts):
        ids = tokenizer.encode(prompt)
        if not ids:
            if bos is None:
                raise ValueError(
                    f"prompts[{i}]: empty, and the model has no bos_token_id to start from"
                )
            ids = [int(bos)]
        encoded.append(ids)
    return encoded


def _start(model, tokenizer, prompts: Sequence[str], config: GenerationConfig | None):
    """The rows' :class:`_RowText` and the steps that fill them (shared by both entry points)."""
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(
            "tokenizer: None, and the model has no tokenizer (a folder without tokenizer.json)"
        )
    config = resolve_config(config)
    encoded = encode_prompts(model, tokenizer, prompts)
    if not encoded:  # no prompts, no results (as Translator.translate([]))
        return [], iter(())
    texts = [_RowText(tokenizer.decode, config.stop_strings, ids) for ids in encoded]

    def stop(step: Step) -> list[bool]:
        return [
            texts[row].add(tok, lp, why)
            for row, tok, lp, why in zip(
                step.rows,
                step.tokens,
                step.logprobs or [None] * len(step.rows),
                step.finished,
                strict=True,
            )
        ]

    return texts, generate_steps(model, encoded, config, stop=stop)


def generate_text(
    model, tokenizer, prompts: Sequence[str], config: GenerationConfig | None = None
) -> list[GeneratedText]:
    """Continue each prompt; one :class:`GeneratedText` per prompt, in order.

    Args:
        model: a :class:`~attnkit.models.GPT`.
        tokenizer: ``encode(str) -> list[int]`` and ``decode(list[int]) -> str``; None = the
            model's own (``model.tokenizer``). A name or path is refused (TypeError): nothing
            is downloaded.
        prompts: texts; different lengths are batched together (left-padded). No texts give
            an empty list.
        config: what to generate (default: greedy, 64 new tokens, stop at the model's eos).

    The model runs in eval mode (dropout off); its mode is restored afterwards.
    """
    texts, steps = _start(model, tokenizer, prompts, config)
    for _ in steps:
        pass
    return [t.result for t in texts]


def stream_text(
    model, tokenizer, prompt: str, config: GenerationConfig | None = None
) -> Iterator[str]:
    """Continue ``prompt``, yielding text as it is decoded (whole UTF-8 characters only).

    The pieces joined are :func:`generate_text`'s text for the same prompt and config. The
    model runs in eval mode (dropout off) until the generator finishes or is closed, which
    restores its mode.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"prompt: expected a string, got {type(prompt).__name__}")
    (row,), steps = _start(model, tokenizer, [prompt], config)
    with closing(steps):  # closed with this generator, whoever holds on to its frame
        for _ in steps:
            piece = row.take()
            if piece:
                yield piece
