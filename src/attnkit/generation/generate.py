"""Token generation with a decoder-only model: prefill, one token at a time, batched prompts.

The decoding is split as in gpt-fast's ``generate.py``:

* :func:`prefill` runs the (left-padded) prompts once, filling the model's static KV cache
  (:class:`~attnkit.models.GPTCache`, preallocated for the slots the model reads: the prompt
  and the new tokens but the last, which is never fed back), and returns the logits of each
  prompt's last token (the output head runs on that position only);
* :func:`decode_one_token` runs the newest token of every row, reading and extending the cache;
  with ``cache=None`` it recomputes the whole prefix instead (the reference path, and the
  baseline of ``benchmarks/generate.py``);
* :func:`generate_steps` loops: filters the logits (:mod:`~attnkit.generation.logits`),
  picks the tokens (:mod:`~attnkit.generation.sampling`), stops rows at eos, at a stop
  condition given by the caller (stop strings, see :mod:`~attnkit.generation.text`) or at
  ``max_new_tokens``, and yields a :class:`Step` after every token; :func:`generate`
  collects the steps.

Batched prompts of different lengths are left-padded, so every row's last prompt token is in
the last slot; the model gives each row its own positions (``cumsum(mask) - 1``) and never
attends to padding. A row that finishes leaves the batch (its rows are dropped from the cache,
the tokens and the penalty state), so it costs nothing afterwards and cannot change the others'
logits.

On a CPU the model's linear layers and its output head run on weights prepacked for oneDNN
while generating (:mod:`~attnkit.generation.packed`, whose table gives the speed-up over
``F.linear``), at the cost of a packed copy of the weights kept with the model (twice the
bfloat16 weights' size where they are packed in float32, on CPUs without bfloat16 kernels).

Seeded sampling is reproducible for the same prompts in the same batch only: one generator
draws for every row still generating, in turn, so a row's draws depend on the batch around it
(how many rows, their order, which have finished), as with Hugging Face's ``generate``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import closing, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.generation import screen
from attnkit.generation.compiled import check_compilable, compiled_step
from attnkit.generation.config import GenerationConfig, resolve_config
from attnkit.generation.logits import process_logits, seen_tokens
from attnkit.generation.packed import packed_linears
from attnkit.generation.sampling import make_generator, select

__all__ = [
    "GenerationOutput",
    "Step",
    "check_prompt_length",
    "decode_one_token",
    "generate",
    "generate_steps",
    "pad_prompts",
    "positions_read",
    "prefill",
    "resolve_eos",
]

FINISH_REASONS = ("eos", "stop", "length")


@dataclass
class Step:
    """One decoding step, for the rows still generating.

    Attributes:
        rows: index (into the prompts) of each row.
        tokens: the id each row chose.
        logprobs: the model's log-probability of that id (raw logits, before any filter), or
            None unless ``GenerationConfig.logprobs``.
        finished: per row, None (goes on) or why it ends: "eos" (it chose an eos id, which
            is kept in its tokens), "stop" (the caller's stop condition), "length".
    """

    rows: list[int]
    tokens: list[int]
    logprobs: list[float] | None
    finished: list[str | None]


@dataclass
class GenerationOutput:
    """What :func:`generate` returns, one entry per prompt, in prompt order.

    Attributes:
        tokens: the new ids (an eos that ended the row included).
        logprobs: the model's log-probability of each new id; None unless
            ``GenerationConfig.logprobs``.
        finish_reasons: "eos", "stop" or "length".
    """

    tokens: list[list[int]]
    logprobs: list[list[float]] | None
    finish_reasons: list[str]


_PROMPTS = "a list of prompts, each a list of int ids, or a (B, T) integer tensor"
_TEXT = "for text, use generate_text, which encodes it"


def _is_integer(ids: Tensor) -> bool:
    return not (ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool)


def _prompt_ids(row: int, prompt) -> Tensor:
    """One prompt as a 1-D integer tensor; ids are never rounded from floats."""
    name = f"prompts[{row}]"
    if isinstance(prompt, (str, bytes)):
        raise TypeError(f"{name}: expected a list of int ids, got the text {prompt!r:.40}; {_TEXT}")
    try:
        ids = prompt if isinstance(prompt, Tensor) else torch.as_tensor(list(prompt))
    except (TypeError, ValueError, RuntimeError):  # not a sequence, or not of numbers
        raise TypeError(
            f"{name}: expected a list of int ids, got {prompt!r:.80} (prompts: {_PROMPTS})"
        ) from None
    if ids.dim() != 1:
        raise TypeError(
            f"{name}: expected a list of int ids, got {ids.dim()} dimensions, shape "
            f"{tuple(ids.shape)} (prompts: {_PROMPTS})"
        )
    if ids.numel() == 0:
        raise ValueError(f"{name}: empty; a prompt needs at least one id (e.g. bos)")
    if not _is_integer(ids):
        raise TypeError(
            f"{name}: expected int ids, got {ids.dtype} ones {prompt!r:.80} (ids are never rounded)"
        )
    return ids


def pad_prompts(
    prompts: Sequence[Sequence[int]] | Tensor,
    *,
    pad_id: int = 0,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Left-pad prompts of ids to one length.

    Args:
        prompts: a list of prompts, each a list of int ids (Python or numpy ints, or a 1-D
            integer tensor), or a (B, T) integer tensor. Float ids are refused, not rounded.
        pad_id: the id written in the padding slots (masked out, never attended to).
        device: where the result goes.

    Returns:
        ids (B, T) int64 and mask (B, T) bool (True = real token).

    Raises:
        TypeError: for text, non-integer ids or prompts nested otherwise.
        ValueError: for no prompt at all, or an empty one.
    """
    if isinstance(prompts, Tensor):
        if prompts.dim() != 2 or prompts.shape[1] == 0:
            raise ValueError(
                f"prompts: expected a (B, T) tensor with T >= 1, got {tuple(prompts.shape)}"
            )
        if not _is_integer(prompts):
            raise TypeError(f"prompts: expected an integer tensor of ids, got {prompts.dtype}")
        ids = prompts.to(device=device, dtype=torch.long)
        return ids, torch.ones_like(ids, dtype=torch.bool)
    if isinstance(prompts, (str, bytes)):
        raise TypeError(f"prompts: expected {_PROMPTS}, got the text {prompts!r:.40}; {_TEXT}")
    if not isinstance(prompts, Collection):
        raise TypeError(f"prompts: expected {_PROMPTS}, got {type(prompts).__name__}")
    rows = [_prompt_ids(row, prompt) for row, prompt in enumerate(prompts)]
    if not rows:
        raise ValueError(f"prompts: expected a non-empty list of lists of ids, got {prompts!r:.80}")
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)  # (B, T)
    for row, prompt in enumerate(rows):
        ids[row, width - len(prompt) :] = prompt
        mask[row, width - len(prompt) :] = True
    return ids.to(device), mask.to(device)


def resolve_eos(model, config: GenerationConfig) -> tuple[int, ...]:
    """The ids that end a row: ``config.eos_ids``, or the model's eos when that is None.

    Raises:
        ValueError: for an id outside the model's vocabulary (the row could never stop).
    """
    if config.eos_ids is None:
        eos = getattr(model.config, "eos_token_id", None)
        return () if eos is None else (int(eos),)
    vocab = model.config.vocab_size
    for i in config.eos_ids:
        if i >= vocab:
            raise ValueError(
                f"eos_ids: id {i} is outside the model's vocabulary [0, {vocab}) "
                f"(vocab_size={vocab}), so no row could ever end on it"
            )
    return config.eos_ids


def prefill(model, ids: Tensor, mask: Tensor, cache) -> Tensor:
    """Run the prompts ids (B, T) with mask (B, T), filling ``cache`` (None: no cache).

    Returns:
        (B, V) float32 logits of the token after each prompt (the prompts are left-padded, so
        every prompt ends in the last slot; the head runs on that slot only).
    """
    return model.lm_head(_prefill_hidden(model, ids, mask, cache)).float()  # (B, V)


def _prefill_hidden(model, ids: Tensor, mask: Tensor, cache) -> Tensor:
    """:func:`prefill` up to the output layer: the last hidden states (B, D)."""
    return model(ids, attention_mask=mask, cache=cache, project=False).hidden[:, -1]  # (B, D)


def decode_one_token(model, token: Tensor, cache, *, ids: Tensor, mask: Tensor) -> Tensor:
    """Logits (B, V) in float32 after ``token`` (B,), the newest id of every row.

    With a ``cache`` only the new token is run. With ``cache=None`` the whole prefix ``ids``
    (B, T) with ``mask`` (B, T), which already end in ``token``, is recomputed.
    """
    hidden = _decode_hidden(model, token, cache, ids=ids, mask=mask)  # (B, D)
    return model.lm_head(hidden).float()  # (B, V)


def _decode_hidden(model, token: Tensor, cache, *, ids: Tensor, mask: Tensor) -> Tensor:
    """:func:`decode_one_token` up to the output layer: the last hidden states (B, D)."""
    if cache is None:
        hidden = model(ids, attention_mask=mask, project=False).hidden  # (B, T, D)
    else:
        hidden = model(token[:, None], cache=cache, project=False).hidden  # (B, 1, D)
    return hidden[:, -1]  # (B, D)


def positions_read(prompt_tokens: int, new_tokens: int) -> int:
    """The positions a model reads to write ``new_tokens`` after a prompt of ``prompt_tokens``:
    the prompt's and every new token's but the last, which is returned and never fed back. A
    prompt of 5 tokens and 124 new tokens read positions 0 .. 127, a context of 128."""
    return prompt_tokens + new_tokens - 1


def check_prompt_length(n_tokens: int, context_length: int, *, name: str = "prompt") -> None:
    """Raise unless a prompt of ``n_tokens`` fits the context with one new token: at most
    ``context_length`` tokens (the new token is read from the prompt's last position).

    Args:
        n_tokens: the prompt's length in tokens.
        context_length: the model's context length.
        name: how the message names the prompt (``prompts[3]``, ``<stdin>: line 4``).

    Raises:
        ValueError: naming the prompt, its token count and the context length.
    """
    if positions_read(n_tokens, 1) > context_length:
        raise ValueError(
            f"{name}: prompt too long: {n_tokens} tokens; at most {context_length} fit the "
            f"model's context_length={context_length}"
        )


def _check_length(model, mask: Tensor, config: GenerationConfig) -> None:
    context = model.config.context_length
    lengths = mask.sum(dim=1).tolist()  # (B,) prompt lengths
    for row, n_tokens in enumerate(lengths):
        check_prompt_length(n_tokens, context, name=f"prompts[{row}]")
    longest = max(lengths)
    if positions_read(longest, config.max_new_tokens) > context:
        raise ValueError(
            f"max_new_tokens: the longest prompt has {longest} tokens, so at most "
            f"{context - longest + 1} new tokens fit the model's context_length={context} "
            f"(it reads the prompt and every new token but the last), got "
            f"{config.max_new_tokens}"
        )


def generate_steps(
    model,
    prompts: Sequence[Sequence[int]] | Tensor,
    config: GenerationConfig,
    *,
    stop: Callable[[Step], list[bool]] | None = None,
) -> Iterator[Step]:
    """Generate for a batch of prompts, yielding a :class:`Step` after every token.

    The inputs are checked when this is called; the model runs from the first step on.

    Args:
        model: a :class:`~attnkit.models.GPT` (or anything with its call, ``lm_head``,
            ``init_cache`` and ``config.context_length`` / ``vocab_size`` / ``eos_token_id``).
            It is put in eval mode (dropout off) from the first step, and its mode is restored
            when the generator finishes, fails or is closed.
        prompts: a list of prompts, each a list of int ids (different lengths are
            left-padded), or a (B, T) integer tensor (:func:`pad_prompts`).
        config: what to generate.
        stop: called with each step before it is yielded; returns, per row, whether the
            caller's stop condition (e.g. a stop string) ends that row.

    Raises:
        TypeError: for a config that is not a :class:`GenerationConfig`, or prompts that
            are not ids (:func:`pad_prompts`).
        ValueError: for prompts or ``max_new_tokens`` that do not fit the context, or eos ids
            outside the vocabulary; all checked before the first token.
    """
    config = resolve_config(config)
    device = next(model.parameters()).device
    ids, mask = pad_prompts(prompts, device=device)  # (B, T) each
    _check_length(model, mask, config)
    eos = set(resolve_eos(model, config))
    if config.compile:
        check_compilable(model, device)
    return _eval_steps(model, ids, mask, config, eos, stop)


@torch.inference_mode()
def _eval_steps(
    model, ids: Tensor, mask: Tensor, config: GenerationConfig, eos: set[int], stop
) -> Iterator[Step]:
    """:func:`_steps` in eval mode, on prepacked weights, in the model's own dtype; the mode is
    restored at the end.

    A caller's autocast (a training loop's, around an evaluation) is off while each step
    runs, as :class:`~attnkit.decoding.Translator` has it: the prepacked products ignore
    autocast, so under it a step mixed float32 queries with bfloat16 cached keys. It is
    turned off around every step only, not while the caller holds a yielded step.
    """
    was_training = model.training
    model.eval()
    device_type = ids.device.type
    known = torch.amp.is_autocast_available(device_type)
    try:
        with packed_linears(model), closing(_steps(model, ids, mask, config, eos, stop)) as steps:
            while True:
                on = known and torch.is_autocast_enabled(device_type)  # asked at every step
                with torch.autocast(device_type, enabled=False) if on else nullcontext():
                    step = next(steps, None)
                if step is None:
                    return
                yield step
    finally:
        model.train(was_training)


def _screenable(config: GenerationConfig) -> bool:
    """Greedy without a repetition penalty or log-probabilities (which need the logits): the
    steps a float16 screen of the output layer can pick tokens for."""
    return config.greedy and config.repetition_penalty == 1.0 and not config.logprobs


def _screens(model, config: GenerationConfig, rows: int, new_tokens: int) -> bool:
    """Whether greedy steps pick their tokens through the output layer's float16 screen
    (:mod:`~attnkit.generation.screen`) from the first step: :func:`_screenable` steps, on a
    head the screen applies to, made already or worth making for a call of ``rows`` x
    ``new_tokens`` (:func:`~attnkit.generation.screen.worth_making`; shorter calls count their
    steps toward one, :func:`~attnkit.generation.screen.served`)."""
    if not _screenable(config):
        return False
    head = model.lm_head
    if screen.ready(head):
        return True
    return screen.worth_making(rows, new_tokens) and screen.screen(head) is not None


def _steps(
    model, ids: Tensor, mask: Tensor, config: GenerationConfig, eos: set[int], stop
) -> Iterator[Step]:
    """The token loop of :func:`generate_steps`, on left-padded ids (B, T) and mask (B, T)."""
    device = ids.device
    b, t = ids.shape
    n_new = config.max_new_tokens
    generator = None if config.greedy else make_generator(config.seed, device)
    penalize = config.repetition_penalty != 1.0
    seen = seen_tokens(ids, model.config.vocab_size, mask) if penalize else None  # (B, V)
    # Every slot the model reads: the prompts' and the new tokens' but the last, never fed back.
    slots = positions_read(t, n_new)
    cache = model.init_cache(b, slots) if config.use_cache else None
    if config.compile:  # the one-token steps on this cache run compiled
        cache.step = compiled_step(model)
    if cache is None:  # the recomputed prefix, grown in place: (B, slots)
        ids = torch.cat([ids, ids.new_zeros(b, slots - t)], dim=1)
        mask = torch.cat([mask, mask.new_ones(b, slots - t)], dim=1)
    rows = list(range(b))
    screenable = _screenable(config)
    screened = _screens(model, config, b, n_new)
    hidden = _prefill_hidden(model, ids[:, :t], mask[:, :t], cache)  # (B, D)
    for i in range(n_new):
        token = screen.greedy_tokens(model.lm_head, hidden) if screened else None  # (n,)
        logprobs = None
        if token is None and screenable and not screened:  # a step toward making the screen
            if screen.served(model.lm_head, len(rows)):
                screened = screen.screen(model.lm_head) is not None
                token = screen.greedy_tokens(model.lm_head, hidden) if screened else None
        if token is None:  # the float32 (or model dtype) logits, filtered
            logits = model.lm_head(hidden).float()  # (n, V)
            scores = process_logits(
                logits, seen=seen, repetition=config.repetition_penalty,
                temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
            )  # fmt: skip
            token = select(scores, generator)  # (n,)
            if config.logprobs:
                logprob = torch.log_softmax(logits, dim=-1).gather(1, token[:, None])  # (n, 1)
                logprobs = logprob.squeeze(1).tolist()
        tokens = token.tolist()
        last = i == n_new - 1
        finished = ["eos" if tok in eos else ("length" if last else None) for tok in tokens]
        step = Step(rows, tokens, logprobs, finished)
        if stop is not None:
            for r, hit in enumerate(stop(step)):
                if hit and finished[r] != "eos":
                    finished[r] = "stop"
        yield step
        if last:
            return
        keep = [r for r, why in enumerate(finished) if why is None]
        if not keep:
            return
        if len(keep) < len(rows):  # finished rows leave the batch
            index = torch.tensor(keep, device=device)
            rows = [rows[r] for r in keep]
            token = token.index_select(0, index)
            if cache is not None:
                cache.reorder(index)
            else:
                ids, mask = ids.index_select(0, index), mask.index_select(0, index)
            if seen is not None:
                seen = seen.index_select(0, index)
        if seen is not None:
            seen[torch.arange(len(rows), device=device), token] = True
        if cache is None:
            ids[:, t + i] = token
        end = t + i + 1
        hidden = _decode_hidden(model, token, cache, ids=ids[:, :end], mask=mask[:, :end])


def generate(
    model,
    prompts: Sequence[Sequence[int]] | Tensor,
    config: GenerationConfig | None = None,
    *,
    stop: Callable[[Step], list[bool]] | None = None,
) -> GenerationOutput:
    """Generate new ids for each prompt (see :func:`generate_steps`).

    Example:
        >>> out = generate(gpt, [[464, 3290], [15496]], GenerationConfig(max_new_tokens=8))
        >>> out.tokens[0]   # 8 new ids (fewer if the row reached eos)
    """
    steps = generate_steps(model, prompts, config, stop=stop)  # checks the inputs
    n = prompts.shape[0] if isinstance(prompts, Tensor) else len(prompts)
    tokens: list[list[int]] = [[] for _ in range(n)]
    logprobs: list[list[float]] = [[] for _ in range(n)]
    reasons = ["length"] * n
    for step in steps:
        for row, tok, why in zip(step.rows, step.tokens, step.finished, strict=True):
            tokens[row].append(tok)
            if why is not None:
                reasons[row] = why
        if step.logprobs is not None:
            for row, lp in zip(step.rows, step.logprobs, strict=True):
                logprobs[row].append(lp)
    asked = resolve_config(config).logprobs
    return GenerationOutput(tokens, logprobs if asked else None, reasons)
