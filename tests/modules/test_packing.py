"""attnkit.modules.packing: the feed-forward blocks on the real positions only.

The reference is the padded computation (every position through every block) and torch's
cross_entropy over its full logits: the packed path must give the same loss, the same
gradients and the same states at real positions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnkit.models import Transformer
from attnkit.modules import FeedForward, MultiHeadAttention
from attnkit.modules.packing import ROW_MULTIPLE, Packing, real_rows
from attnkit.training.sequence_loss import SequenceLoss
from tests.helpers.decoding import tiny_config

PAD = 0


def test_real_rows_lists_real_positions_first_then_pads_to_the_multiple():
    keep = torch.zeros(4, 50, dtype=torch.bool)
    lengths = [50, 3, 20, 7]  # 80 real positions of 200
    for i, n in enumerate(lengths):
        keep[i, :n] = True
    rows = real_rows(keep)
    assert rows.shape == (2 * ROW_MULTIPLE,)  # 80 rounded up to 128
    flat = keep.reshape(-1)
    real = flat.nonzero().squeeze(1)
    assert torch.equal(rows[:80], real)  # every real position, in order
    assert not flat[rows[80:]].any()  # then padding positions
    assert rows.unique().numel() == rows.numel()


def test_real_rows_is_none_when_nothing_would_be_skipped():
    keep = torch.ones(3, 30, dtype=torch.bool)
    keep[0, 25:] = False  # 85 of 90 real: rounded up to 128 > 90
    assert real_rows(keep) is None
    assert real_rows(torch.ones(2, 100, dtype=torch.bool)) is None


@pytest.mark.parametrize("bad", [torch.ones(2, 3, 4, dtype=torch.bool), torch.ones(2, 3)])
def test_real_rows_rejects_what_is_not_a_bool_matrix(bad):
    with pytest.raises(ValueError, match=r"keep: expected a \(B, T\) bool tensor"):
        real_rows(bad)


def test_pack_and_unpack_move_the_rows():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8)
    packing = Packing(torch.tensor([0, 2, 7, 11]), 3, 5)
    rows = packing.pack(x)
    assert torch.equal(rows, x.reshape(-1, 8)[[0, 2, 7, 11]])
    back = packing.unpack(rows)
    want = torch.zeros(15, 8)
    want[[0, 2, 7, 11]] = x.reshape(-1, 8)[[0, 2, 7, 11]]
    assert torch.equal(back, want.view(3, 5, 8))
    with pytest.raises(ValueError, match=r"x: expected shape \(3, 5, d\)"):
        packing.pack(torch.randn(3, 6, 8))
    with pytest.raises(ValueError, match=r"x: expected shape \(4, d\)"):
        packing.unpack(torch.randn(5, 8))


def test_attention_with_packing_refuses_a_cache_and_weights():
    mha = MultiHeadAttention(8, 2)
    packing = Packing(torch.tensor([0, 1]), 1, 3)
    with pytest.raises(ValueError, match="packing: not supported"):
        mha(torch.randn(2, 8), packing=packing, return_weights=True)
    with pytest.raises(ValueError, match=r"x: expected packed rows \(M, 8\)"):
        mha(torch.randn(1, 3, 8), packing=packing)


def _model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config(31, norm_first=True, pad_id=PAD, max_len=64)).double()


def _batch(seed: int = 1):
    """Right-padded ids with many padding positions (more than ROW_MULTIPLE of them)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 31, (6, 40), generator=g)
    tgt = torch.randint(4, 31, (6, 36), generator=g)
    for i, (s, t) in enumerate(zip([40, 5, 12, 30, 2, 9], [36, 4, 10, 20, 3, 6], strict=True)):
        src[i, s:] = PAD
        tgt[i, t:] = PAD
    tgt_out = torch.cat([tgt[:, 1:], torch.full((6, 1), PAD)], 1)
    tgt_out[tgt == PAD] = PAD
    return src, tgt, tgt_out


def test_the_batch_is_packed():
    """The test batch makes the feed-forward blocks see fewer rows than B x T."""
    model, (src, tgt, tgt_out) = _model(), _batch()
    seen = []
    for module in model.modules():
        if isinstance(module, FeedForward):
            module.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
    SequenceLoss(model)(src, tgt, tgt_out, 0.1)
    enc_rows = -(-int((src != PAD).sum()) // ROW_MULTIPLE) * ROW_MULTIPLE
    dec_rows = -(-int((tgt != PAD).sum()) // ROW_MULTIPLE) * ROW_MULTIPLE
    assert seen == [enc_rows] * 2 + [dec_rows] * 2
    assert enc_rows < src.numel() and dec_rows < tgt.numel()


@pytest.mark.parametrize("norm_first", [True, False])
def test_packed_loss_and_gradients_equal_the_padded_computation(norm_first):
    model, (src, tgt, tgt_out) = _model(), _batch()
    for module in model.modules():  # post-LN too: the norm is inside the skipped block
        if hasattr(module, "norm_first"):
            module.norm_first = norm_first
    got = SequenceLoss(model)(src, tgt, tgt_out, 0.1)
    got.backward()
    got_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    logits = model(src, tgt)  # (B, T, V): every position through every block
    want = F.cross_entropy(
        logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, label_smoothing=0.1,
        reduction="sum",
    )  # fmt: skip
    want.backward()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-10)
    for g, p in zip(got_grads, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-10, atol=1e-12)


def test_states_at_real_positions_are_the_padded_ones():
    model, (src, tgt, _) = _model(), _batch()
    with torch.no_grad():
        memory, mask, _ = model.encode(src)
        packed_memory, _, _ = model.encode(src, skip_padding=True)
        keep = src != PAD
        torch.testing.assert_close(packed_memory[keep], memory[keep], rtol=0, atol=1e-12)
        computed = torch.zeros(keep.numel(), dtype=torch.bool)
        computed[real_rows(keep)] = True
        skipped = ~computed.view_as(keep)  # padding positions that are not rows
        assert skipped.any() and not packed_memory[skipped].any()  # skipped: zeros
        hidden = model.decode(tgt, memory, mask, project=False).output
        packed = model.decode(tgt, memory, mask, project=False, skip_padding=True).output
        real = tgt != PAD
        torch.testing.assert_close(packed[real], hidden[real], rtol=0, atol=1e-12)


def test_left_padded_targets_are_computed_whole():
    """A left-padded target row attends to its padding (no target mask): not packed, so
    every position equals the padded computation."""
    model, (src, tgt, _) = _model(), _batch()
    left = torch.full_like(tgt, PAD)
    for i, row in enumerate(tgt):
        real = row[row != PAD]
        left[i, tgt.shape[1] - real.numel() :] = real
    with torch.no_grad():
        memory, mask, _ = model.encode(src)
        want = model.decode(left, memory, mask, project=False).output
        got = model.decode(left, memory, mask, project=False, skip_padding=True).output
    assert torch.equal(got, want)
