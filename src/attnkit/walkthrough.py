"""Seed 000 step by step: from a sentence to the self-attention output.

:func:`walkthrough` computes every intermediate value the seed prints, for any sentence and
sizes, with the seed's random seed discipline (``torch.manual_seed`` before the embedding and
again before the weights), so the default arguments give the seed's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.attention import scaled_dot_product_attention
from attnkit.tutorial import SelfAttention


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
