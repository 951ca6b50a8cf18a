"""The translation task: its loss, its batches and its evaluation, and evaluate() first."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from attnkit.data import Collator
from attnkit.models import Transformer, TransformerConfig
from attnkit.training.task import DataPosition
from attnkit.training.trainer import Trainer, train
from attnkit.training.translation import SequenceLoss
from tests.helpers.training import fast_config, weights


def test_sequence_loss_equals_full_logits_cross_entropy():
    """Logits only for real target tokens give torch's label-smoothed loss and gradients."""
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=23,
        tgt_vocab_size=23,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout=0.0,
        attn_dropout=0.0,
    )
    model = Transformer(cfg)
    src = torch.randint(4, 23, (3, 7))
    tgt = torch.randint(4, 23, (3, 6))
    src[1, 4:] = 0
    tgt[2, 3:] = 0
    tgt_in, tgt_out = tgt, torch.cat([tgt[:, 1:], torch.zeros(3, 1, dtype=torch.long)], 1)

    got = SequenceLoss(model)(src, tgt_in, tgt_out, 0.1)
    got.backward()
    got_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits = model(src, tgt_in)  # (B, T, V), every position
    want = F.cross_entropy(
        logits.flatten(0, 1),
        tgt_out.flatten(),
        ignore_index=0,
        label_smoothing=0.1,
        reduction="sum",
    )
    want.backward()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    for g, p in zip(got_grads, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-6)


@torch.no_grad()
def reference_val_loss(trainer: Trainer) -> float:
    """Cross-entropy per target token over all validation pairs from the model's full logits
    and torch's cross_entropy (neither SequenceLoss nor the fused loss)."""
    task, model = trainer.task, trainer.model.eval()
    batch = Collator.for_tokenizer(task.tokenizer)(task.val_pairs)
    logits = model(batch.src, batch.tgt_in)  # (B, T, V)
    total = F.cross_entropy(
        logits.flatten(0, 1).double(),
        batch.tgt_out.flatten(),
        ignore_index=task.tokenizer.pad_id,
        reduction="sum",
    )
    return float(total) / batch.num_tgt_tokens


def test_evaluate_before_fit_gives_the_initial_models_metrics(tmp_path):
    config = fast_config("optim.max_steps=4", "optim.eval_every=2", "optim.val_bleu=false")
    trainer = Trainer(config, tmp_path / "a", progress=False)
    metrics = trainer.evaluate()  # no fit() before: builds what it needs
    assert set(metrics) == {"val_loss", "val_ppl"}
    assert metrics["val_loss"] == pytest.approx(reference_val_loss(trainer), rel=1e-5)
    assert metrics["val_loss"] == pytest.approx(trainer.evaluate()["val_loss"], rel=0, abs=0)
    # fit() afterwards trains exactly as without the evaluation
    after_eval = trainer.fit()
    plain = train(config, tmp_path / "b", progress=False)
    assert after_eval.step == plain.step == 4
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_evaluate_on_a_resumed_run_gives_the_checkpoints_metrics(tmp_path):
    config = fast_config("optim.max_steps=3", "optim.eval_every=3")
    result = train(config, tmp_path, progress=False)
    with Trainer(config, tmp_path, resume=True, progress=False) as trainer:
        metrics = trainer.evaluate()
        assert trainer.folder.locked
    assert not trainer.folder.locked
    assert metrics["val_loss"] == pytest.approx(result.metrics["val_loss"], rel=1e-6)
    assert metrics["val_bleu"] == pytest.approx(result.metrics["val_bleu"])


def test_train_batches_restart_at_a_position_with_the_same_batches(tmp_path):
    trainer = Trainer(fast_config("optim.max_steps=1"), tmp_path, progress=False)
    with trainer:
        trainer.setup()
        task = trainer.task
        n = task.batches_per_epoch
        stream = task.train_batches(DataPosition(0, 0, n))
        first = [next(stream) for _ in range(n + 3)]  # past the end of epoch 0
    assert [p for _, p in first[n - 1 : n + 1]] == [DataPosition(0, n, n), DataPosition(1, 1, n)]
    assert first[n - 1][1].epochs_done == 1 and first[n - 2][1].epochs_done == 0
    for k in (0, 5, n - 1, n):
        again = task.train_batches(first[k][1])
        for (want, want_pos), (got, pos) in zip(first[k + 1 :], again, strict=False):
            assert torch.equal(want.src, got.src) and torch.equal(want.tgt_out, got.tgt_out)
            assert pos == want_pos


def test_bpe_dropout_segments_every_training_batch_afresh(tmp_path):
    """data.bpe_dropout: a batch's pairs are segmented afresh each time (the same pair
    indices, new ids), every segmentation decodes to the training text, fits max_len, and the
    tokenizer the run saves stays deterministic."""
    from itertools import islice

    from attnkit.data.batching import pair_length

    config = fast_config("optim.max_steps=1", "data.bpe_dropout=0.5")
    trainer = Trainer(config, tmp_path, progress=False)
    with trainer:
        trainer.setup()
        task = trainer.task
        tok, text = task.tokenizer, task.train_text
        batches = list(islice(iter(task.sampler), 4))
        first = [task._batch_pairs(b) for b in batches]
        second = [task._batch_pairs(b) for b in batches]
        assert first != second
        for indices, pairs in zip(batches * 2, first + second, strict=True):
            for i, (src, tgt) in zip(indices, pairs, strict=True):
                assert tok.decode(src) == text.src[i] and tok.decode(tgt) == text.tgt[i]
                assert pair_length(src, tgt) <= task.sampler.max_len
        plain = [[task.train_pairs[i] for i in b] for b in batches]
        assert first != plain and task.tokenizer.encode(text.src[0]) == task.train_pairs[0][0]
        # train_batches serves those fresh segmentations (its first batch is batches[0])
        got, _ = next(task.train_batches(DataPosition(0, 0, task.batches_per_epoch)))
        deterministic = task.collate(plain[0])
        assert got.src.shape[0] == deterministic.src.shape[0] == len(batches[0])
        assert got.src.shape != deterministic.src.shape or not torch.equal(
            got.src, deterministic.src
        )


def test_bpe_dropout_is_a_probability():
    with pytest.raises(ValueError, match=r"data.bpe_dropout"):
        fast_config("data.bpe_dropout=1.0")


def test_pad_multiple_pads_the_training_batches_and_is_checked(tmp_path):
    """data.pad_multiple reaches the task's collator: every training batch's widths are a
    multiple of it (capped at the model's max_len), and the loss ignores the extra padding."""
    from itertools import islice

    config = fast_config("optim.max_steps=1", "data.pad_multiple=8")
    trainer = Trainer(config, tmp_path, progress=False)
    with trainer:
        trainer.setup()
        task = trainer.task
        stream = task.train_batches(DataPosition(0, 0, task.batches_per_epoch))
        for batch, _ in islice(stream, 5):
            for ids in (batch.src, batch.tgt_in, batch.tgt_out):
                assert ids.shape[1] % 8 == 0 or ids.shape[1] == task.collate.max_width
    with pytest.raises(ValueError, match=r"data.pad_multiple"):
        fast_config("data.pad_multiple=0")


@pytest.mark.parametrize(
    "setting, key",
    [("data.max_len=2", "data.max_len = 2"), ("model.max_len=2", "model.max_len = 2")],
)
def test_a_max_len_no_pair_fits_names_the_setting(tmp_path, setting, key):
    """Before: "pairs: none of the 300 pairs fits max_len=2", in the sampler's terms."""
    with pytest.raises(ValueError, match=re.escape(f"{key}: none of the 300 training pairs fits")):
        train(fast_config(setting, "optim.max_steps=1"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
