"""Seed 000 step by step: from a sentence to the self-attention output.

:func:`walkthrough` computes every intermediate value the seed prints, for any sentence and
sizes, with the seed's random seed discipline (``torch.manual_seed`` before the embedding and
again before the weights), so the default arguments give the seed's numbers.
:func:`rope_walkthrough` then turns the same queries and keys by rotary position embedding
(:class:`attnkit.tutorial.RotaryEmbedding`), the positions of Llama-family models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.attention import scaled_dot_product_attention
from attnkit.tutorial import RotaryEmbedding, SelfAttention


@dataclass
class Walkthrough:
    """Every value of the seed 000 computation."""

    tokens: list[str]
    vocab: dict[str, int]
    token_ids: Tensor  # (T,)
    embedded: Tensor  # (T, d_model)
    w_query: Tensor  # (d_model, d_k)
    w_key: Tensor  # (d_model, d_k)
    w_value: Tensor  # (d_model, d_v)
    position: int  # 0-based index of the token followed step by step
    query: Tensor  # (d_k,)
    key: Tensor  # (d_k,)
    value: Tensor  # (d_v,)
    keys: Tensor  # (T, d_k)
    values: Tensor  # (T, d_v)
    scores: Tensor  # (T,) unnormalised omega
    weights: Tensor  # (T,) softmax(omega / sqrt(d_k))
    context: Tensor  # (d_v,)
    output: Tensor  # (T, d_v), the whole SelfAttention module
    all_weights: Tensor  # (T, T)


def walkthrough(
    sentence: str,
    *,
    seed: int = 123,
    d_model: int = 3,
    d_k: int = 2,
    d_v: int = 4,
    position: int = 2,
    vocab_size: int = 50_000,
) -> Walkthrough:
    """Run seed 000 on ``sentence``.

    Args:
        sentence: words separated by white space.
        seed: the random seed set before the embedding and again before the weights.
        d_model: embedding size (the seed's 3).
        d_k: query/key size (the seed's 2).
        d_v: value size (the seed's 4).
        position: 0-based index of the token followed step by step (the seed's third, 2).
        vocab_size: rows of the embedding table (the seed's 50,000).
    """
    tokens = sentence.split()
    if not tokens:
        raise ValueError("sentence: expected at least one word, got an empty sentence")
    for name, value in (("d_model", d_model), ("d_k", d_k), ("d_v", d_v)):
        if value <= 0:
            raise ValueError(f"{name}: expected a positive size, got {value}")
    if not 0 <= position < len(tokens):
        raise ValueError(
            f"position: expected 0 <= position < {len(tokens)} (the sentence's length), "
            f"got {position}"
        )
    # The seed's {s: i for i, s in enumerate(sorted(words))}, without gaps for repeated words.
    vocab = {s: i for i, s in enumerate(sorted(set(tokens)))}
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the {len(vocab)} words")
    token_ids = torch.tensor([vocab[s] for s in tokens])

    torch.manual_seed(seed)
    embed = torch.nn.Embedding(vocab_size, d_model)
    embedded = embed(token_ids).detach()  # (T, d_model)

    torch.manual_seed(seed)
    module = SelfAttention(d_model, d_k, d_v)  # W_query, W_key, W_value = torch.rand(...)
    with torch.no_grad():
        w_q, w_k, w_v = module.W_query, module.W_key, module.W_value
        keys, values = embedded @ w_k, embedded @ w_v
        query = embedded[position] @ w_q
        context, weights = scaled_dot_product_attention(
            query[None], keys, values, return_weights=True
        )
        output, all_weights = module(embedded, return_weights=True)
    return Walkthrough(
        tokens=tokens,
        vocab=vocab,
        token_ids=token_ids,
        embedded=embedded,
        w_query=w_q.detach(),
        w_key=w_k.detach(),
        w_value=w_v.detach(),
        position=position,
        query=query,
        key=keys[position],
        value=values[position],
        keys=keys,
        values=values,
        scores=query @ keys.T,
        weights=weights[0],
        context=context[0],
        output=output,
        all_weights=all_weights,
    )


@dataclass
class RopeWalkthrough:
    """Seed 000's queries and keys turned by rotary position embedding (RoPE)."""

    base: float
    interleaved: bool
    pair: int  # the pair of query/key dimensions followed
    dims: tuple[int, int]  # its two dimensions: (i, i + d_k/2), or (2i, 2i + 1) interleaved
    theta: Tensor  # (d_k/2,) theta_i = base^(-2i/d_k)
    positions: Tensor  # (T,) 0, 1, ..., T - 1
    angles: Tensor  # (T,) positions * theta_pair, the angle of the followed pair
    queries: Tensor  # (T, d_k) X W_q before the rotation
    keys: Tensor  # (T, d_k) X W_k before the rotation
    rotated_queries: Tensor  # (T, d_k)
    rotated_keys: Tensor  # (T, d_k)
    scores: Tensor  # (T, T) Q K^T without RoPE
    rope_scores: Tensor  # (T, T) rotated Q times rotated K^T
    rope_weights: Tensor  # (T, T) softmax(rope_scores / sqrt(d_k))
    rope_output: Tensor  # (T, d_v) rope_weights @ V (values are not rotated)
    shift: int  # how far the whole sentence is moved
    shifted_scores: Tensor  # (T, T) the RoPE scores at positions shift, ..., shift + T - 1


def rope_walkthrough(
    w: Walkthrough,
    *,
    base: float = 10_000.0,
    pair: int = 0,
    shift: int = 100,
    interleaved: bool = False,
) -> RopeWalkthrough:
    """Turn the queries and keys of ``w`` by RoPE (:class:`attnkit.tutorial.RotaryEmbedding`).

    Args:
        w: a :func:`walkthrough` result; its d_k must be even (the dimensions go in pairs).
        base: the base of the angles theta_i = base^(-2i/d_k).
        pair: 0-based index i of the pair of dimensions followed, 0 <= i < d_k / 2.
        shift: the whole sentence is also placed at positions shift, ..., shift + T - 1, to
            show that the scores do not change (only the distances between tokens count).
        interleaved: pair i is dims (2i, 2i + 1) instead of (i, i + d_k/2).
    """
    d_k = w.w_query.shape[1]
    if d_k % 2 != 0:
        raise ValueError(f"d_k: RoPE turns pairs of dimensions, expected an even d_k, got {d_k}")
    if not 0 <= pair < d_k // 2:
        raise ValueError(f"pair: expected 0 <= pair < {d_k // 2} (d_k / 2), got {pair}")
    if shift < 0:
        raise ValueError(f"shift: expected a number of positions >= 0, got {shift}")
    rope = RotaryEmbedding(d_k, base, interleaved=interleaved)
    t = len(w.tokens)
    positions = torch.arange(t)  # (T,)
    queries = w.embedded @ w.w_query  # (T, d_k)
    keys = w.keys  # (T, d_k)
    rotated_q, rotated_k = rope(queries, positions), rope(keys, positions)  # (T, d_k) each
    shifted_q, shifted_k = rope(queries, positions + shift), rope(keys, positions + shift)
    rope_output, rope_weights = scaled_dot_product_attention(
        rotated_q, rotated_k, w.values, return_weights=True
    )  # (T, d_v), (T, T)
    dims = (2 * pair, 2 * pair + 1) if interleaved else (pair, pair + d_k // 2)
    return RopeWalkthrough(
        base=rope.base,
        interleaved=interleaved,
        pair=pair,
        dims=dims,
        theta=rope.angles(torch.ones(1))[0],
        positions=positions,
        angles=rope.angles(positions)[:, pair],
        queries=queries,
        keys=keys,
        rotated_queries=rotated_q,
        rotated_keys=rotated_k,
        scores=queries @ keys.T,
        rope_scores=rotated_q @ rotated_k.T,
        rope_weights=rope_weights,
        rope_output=rope_output,
        shift=shift,
        shifted_scores=shifted_q @ shifted_k.T,
    )
