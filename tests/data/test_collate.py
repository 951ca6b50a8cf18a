"""Tests for attnkit.data.collate: padded teacher-forcing tensors."""

import pytest
import torch

from attnkit.data.batching import TokenBatchSampler
from attnkit.data.collate import Collator, iter_batches

COLLATE = Collator(pad_id=0, bos_id=1, eos_id=2)  # ids that matter only by hand-checked layout


def test_layout_and_padding_by_hand():
    batch = COLLATE([([7, 8, 9], [5]), ([6], [4, 4, 4])])
    torch.testing.assert_close(batch.src, torch.tensor([[7, 8, 9, 2], [6, 2, 0, 0]]))
    torch.testing.assert_close(batch.tgt_in, torch.tensor([[1, 5, 0, 0], [1, 4, 4, 4]]))
    torch.testing.assert_close(batch.tgt_out, torch.tensor([[5, 2, 0, 0], [4, 4, 4, 2]]))
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    assert batch.num_src_tokens == 6 and batch.num_tgt_tokens == 6
    assert batch.size == 2
    assert batch.indices is None


def test_other_special_ids_and_empty_sequences():
    batch = Collator(pad_id=9, bos_id=7, eos_id=8)([([], []), ([3], [3])], indices=[4, 2])
    torch.testing.assert_close(batch.src, torch.tensor([[8, 9], [3, 8]]))
    torch.testing.assert_close(batch.tgt_in, torch.tensor([[7, 9], [7, 3]]))
    torch.testing.assert_close(batch.tgt_out, torch.tensor([[8, 9], [3, 8]]))
    assert batch.num_tgt_tokens == 3
    torch.testing.assert_close(batch.indices, torch.tensor([4, 2]))


def test_for_tokenizer_reads_ids(small_tokenizer):
    assert Collator.for_tokenizer(small_tokenizer) == Collator(pad_id=0, bos_id=1, eos_id=2)


def test_special_ids_are_required_keywords():
    """No default ids: a collator without its tokenizer's ids cannot be built."""
    with pytest.raises(TypeError, match="pad_id"):
        Collator()
    with pytest.raises(TypeError):
        Collator(0, 1, 2)
    for name, bad in (("pad_id", -1), ("bos_id", 1.0), ("eos_id", True)):
        ids = {"pad_id": 0, "bos_id": 1, "eos_id": 2, name: bad}
        with pytest.raises(ValueError, match=rf"{name}: expected an id >= 0, got {bad!r}"):
            Collator(**ids)


def test_to_moves_every_tensor():
    batch = COLLATE([([4, 5], [6])], indices=[0])
    moved = batch.to("meta")
    for name in ("src", "tgt_in", "tgt_out", "indices"):
        assert getattr(moved, name).device.type == "meta"
        assert getattr(batch, name).device.type == "cpu"
    assert moved.num_tgt_tokens == batch.num_tgt_tokens


def test_iter_batches_restores_corpus_order():
    pairs = [([4] * n, [5] * (n % 7)) for n in range(50)]
    sampler = TokenBatchSampler(pairs, max_tokens=64, max_len=60, seed=1)
    rows = {}
    for batch in iter_batches(pairs, sampler, COLLATE):
        for row, index in enumerate(batch.indices.tolist()):
            rows[index] = int((batch.src[row] == 4).sum())
    assert rows == {i: i for i in range(50)}


def test_bad_input():
    with pytest.raises(ValueError, match="pairs is empty"):
        COLLATE([])
    with pytest.raises(ValueError, match="indices has 2 entries but pairs has 1"):
        COLLATE([([4], [4])], indices=[0, 1])


def test_pad_multiple_rounds_both_widths_up_and_stops_at_max_width():
    pairs = [([7, 8, 9], [5]), ([6], [4, 4, 4, 4, 4])]  # src width 4, target width 6
    batch = Collator(pad_id=0, bos_id=1, eos_id=2, pad_multiple=4)(pairs)
    assert batch.src.shape == (2, 4) and batch.tgt_in.shape == batch.tgt_out.shape == (2, 8)
    torch.testing.assert_close(batch.tgt_out[1], torch.tensor([4, 4, 4, 4, 4, 2, 0, 0]))
    torch.testing.assert_close(batch.src[0], torch.tensor([7, 8, 9, 2]))
    assert batch.num_src_tokens == 6 and batch.num_tgt_tokens == 8  # padding not counted
    capped = Collator(pad_id=0, bos_id=1, eos_id=2, pad_multiple=4, max_width=7)(pairs)
    assert capped.src.shape == (2, 4) and capped.tgt_in.shape == (2, 7)
    longer = Collator(pad_id=0, bos_id=1, eos_id=2, pad_multiple=4, max_width=5)(pairs)
    assert longer.tgt_in.shape == (2, 6)  # a row longer than max_width keeps its own length


@pytest.mark.parametrize("options", [dict(pad_multiple=0), dict(pad_multiple=True),
                                     dict(max_width=0), dict(pad_multiple=2.0)])  # fmt: skip
def test_bad_padding_options_are_refused(options):
    with pytest.raises(ValueError, match=next(iter(options))):
        Collator(pad_id=0, bos_id=1, eos_id=2, **options)


def test_extra_padding_leaves_the_loss_and_its_gradients_unchanged():
    """The loss counts only real target tokens and attention never sees padding, so a batch
    padded to a multiple of 8 trains exactly as the tightly padded one (float32, no dropout)."""
    from attnkit.models.transformer import Transformer, TransformerConfig
    from attnkit.training.sequence_loss import SequenceLoss

    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=50, tgt_vocab_size=50, d_model=16, num_heads=2, d_ff=32, dropout=0.0,
        attn_dropout=0.0, ffn_dropout=0.0,
        num_encoder_layers=2, num_decoder_layers=2, pad_id=0,
    )  # fmt: skip
    loss = SequenceLoss(Transformer(cfg)).double()
    pairs = [([5, 6, 7, 8, 9], [10, 11]), ([12], [13, 14, 15, 16, 17, 18, 19, 20, 21])]
    results = []
    for multiple in (1, 8):
        batch = Collator(pad_id=0, bos_id=1, eos_id=2, pad_multiple=multiple)(pairs)
        value = loss(batch.src, batch.tgt_in, batch.tgt_out, 0.1)
        grads = torch.autograd.grad(value, list(loss.parameters()))
        results.append((batch.tgt_in.shape[1], value, grads))
    (width1, value1, grads1), (width8, value8, grads8) = results
    assert (width1, width8) == (10, 16)
    torch.testing.assert_close(value8, value1, rtol=1e-12, atol=1e-12)
    for g8, g1 in zip(grads8, grads1, strict=True):
        torch.testing.assert_close(g8, g1, rtol=1e-10, atol=1e-12)
