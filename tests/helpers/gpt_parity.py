"""attnkit's GPT against Hugging Face's GPT2LMHeadModel: logits and attention weights on padded
batches, and greedy continuations compared only where rounding cannot decide them.

Greedy decoding picks the largest logit, so two implementations whose logits differ by up to
``error`` (float rounding) may legitimately pick different tokens at a step whose two largest
logits are closer than that. :func:`assert_same_greedy` compares the tokens of each row up to
the first step whose top-2 gap (in Hugging Face's logits) is not larger than ten times the
measured error, and asserts that enough steps were compared, so a near-tie can neither make the
test fail nor let it pass without comparing anything.
"""

from __future__ import annotations

import torch

from attnkit.generation.packed import packed_linears

TOL = dict(atol=1e-5, rtol=0)
MARGIN = 10  # a step is compared only if its top-2 gap exceeds MARGIN x the measured error


def hf_positions(mask: torch.Tensor) -> torch.Tensor:
    """Hugging Face generate()'s position ids for a padded batch."""
    return (mask.long().cumsum(-1) - 1).masked_fill(~mask, 0)


def assert_matches_hf(model, hf, ids, mask, *, weights=False):
    """attnkit's logits (and every layer's weights) equal Hugging Face's on the real tokens of
    a padded batch, given generate()'s positions; returns attnkit's output."""
    with torch.no_grad():
        expected = hf(
            ids,
            attention_mask=mask.long(),
            position_ids=hf_positions(mask),
            output_attentions=weights,
        )
        got = model(ids, attention_mask=mask, return_weights=weights)
    assert not got.logits.isnan().any()
    torch.testing.assert_close(got.logits[mask], expected.logits[mask], **TOL)
    if weights:
        assert len(got.weights) == len(expected.attentions) == model.config.num_layers
        b, t = mask.shape
        for ours, theirs in zip(got.weights, expected.attentions, strict=True):
            assert ours.shape == theirs.shape == (b, model.config.num_heads, t, t)
            # (B, H, T, T) -> query rows (B, T, H, T), the real ones
            ours, theirs = ours.permute(0, 2, 1, 3), theirs.permute(0, 2, 1, 3)
            torch.testing.assert_close(ours[mask], theirs[mask], **TOL)
    return got


def hf_greedy(hf, ids, mask, n: int, *, use_cache: bool):
    """Hugging Face generate(): ``n`` greedy tokens for the left-padded batch ids (B, T), eos
    not stopping. Returns (tokens (B, n), raw logits of every step (B, n, V))."""
    with torch.inference_mode():
        out = hf.generate(
            ids,
            attention_mask=mask.long(),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            eos_token_id=None,
            pad_token_id=0,
            use_cache=use_cache,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[:, ids.shape[1] :], torch.stack(out.logits, 1).float()


def logit_error(model, ids, mask, new, hf_logits) -> float:
    """The largest |attnkit - Hugging Face| logit at the steps that produced ``new`` (B, n)
    from the left-padded prompts ids (B, T): attnkit reads prompt + new in one pass, with
    ``F.linear`` and with the packed weights generation uses; ``hf_logits`` (B, n, V)."""
    b, t = ids.shape
    full = torch.cat([ids, new], 1)  # (B, T + n)
    full_mask = torch.cat([mask, torch.ones_like(new, dtype=torch.bool)], 1)
    errors = []
    with torch.inference_mode():
        for packed in (False, True):
            if packed:
                with packed_linears(model):
                    logits = model(full, attention_mask=full_mask).logits
            else:
                logits = model(full, attention_mask=full_mask).logits
            steps = logits[:, t - 1 : -1]  # (B, n, V): the logits each new token was chosen from
            errors.append(float((steps - hf_logits).abs().max()))
    return max(errors)


def decided_steps(hf_logits, error: float) -> list[int]:
    """Per row, how many leading steps have a top-2 gap larger than MARGIN x ``error``."""
    top2 = hf_logits.topk(2, dim=-1).values  # (B, n, 2)
    clear = (top2[..., 0] - top2[..., 1]) > MARGIN * error  # (B, n)
    return [int(row.long().cumprod(0).sum()) for row in clear]


def assert_same_greedy(ours, theirs, hf_logits, error: float, *, min_steps: int) -> None:
    """``ours`` equals ``theirs`` (B, n) on every row's decided steps, of which every row has
    at least ``min_steps``."""
    ours, theirs = torch.as_tensor(ours), torch.as_tensor(theirs)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    decided = decided_steps(hf_logits, error)
    assert min(decided) >= min_steps, (decided, error)
    for row, n in enumerate(decided):
        assert ours[row, :n].tolist() == theirs[row, :n].tolist(), (row, n)
