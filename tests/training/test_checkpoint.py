"""Checkpoints: round trip, tied weights, atomic replacement, recovery after a kill."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from attnkit.data import SubwordTokenizer
from attnkit.models import Transformer, TransformerConfig
from attnkit.training import checkpoint as ckpt
from attnkit.training.config import TrainConfig


@pytest.fixture(scope="module")
def tokenizer():
    return SubwordTokenizer.train(["ab ab ba", "ba ab"] * 10, vocab_size=270)


def make(tokenizer, seed=0):
    config = TrainConfig()
    model_cfg = dataclasses.replace(
        config.model,
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    torch.manual_seed(seed)
    return Transformer(model_cfg), dataclasses.replace(config, model=model_cfg)


def save(folder, model, config, tokenizer, step, resume=None):
    return ckpt.save_checkpoint(
        folder,
        model=model,
        config=config,
        tokenizer=tokenizer,
        state={"step": step},
        resume=resume,
    )


def test_round_trip_keeps_weights_ties_and_tokenizer(tmp_path, tokenizer):
    model, config = make(tokenizer)
    save(tmp_path / "best", model, config, tokenizer, 3)
    assert sorted(p.name for p in (tmp_path / "best").iterdir()) == [
        "config.json",
        "model.safetensors",
        "state.json",
        "tokenizer.json",
    ]
    loaded, tok, cfg = ckpt.load_model(tmp_path)  # the run folder: picks best/
    assert cfg == config and not loaded.training
    assert tok.to_json() == tokenizer.to_json()
    for (name, a), (_, b) in zip(
        model.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert loaded.output.weight is loaded.src_embed.weight is loaded.tgt_embed.weight
    assert ckpt.read_state(tmp_path / "best") == {"step": 3}


def test_resume_state_round_trip(tmp_path, tokenizer):
    model, config = make(tokenizer)
    rng = torch.get_rng_state()
    save(tmp_path / "last", model, config, tokenizer, 1, resume={"rng": [rng], "n": 5})
    state = ckpt.load_resume_state(tmp_path / "last")
    assert torch.equal(state["rng"][0], rng) and state["n"] == 5


def test_replacing_last_is_atomic_and_cleans_up(tmp_path, tokenizer):
    model, config = make(tokenizer)
    save(tmp_path / "last", model, config, tokenizer, 1)
    save(tmp_path / "last", model, config, tokenizer, 2)
    assert ckpt.read_state(tmp_path / "last")["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path, tokenizer, monkeypatch):
    model, config = make(tokenizer)
    save(tmp_path / "last", model, config, tokenizer, 1)

    def crash(self, path):
        raise OSError("disk full")

    monkeypatch.setattr(SubwordTokenizer, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save(tmp_path / "last", model, config, tokenizer, 2)
    assert ckpt.find_checkpoint(tmp_path / "last") == tmp_path / "last"
    assert ckpt.read_state(tmp_path / "last")["step"] == 1


def test_partial_folders_are_never_picked(tmp_path, tokenizer):
    model, config = make(tokenizer)
    # A kill while writing: only a .tmp folder, half written.
    partial = tmp_path / "last.tmp-123"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"\0" * 10)
    assert ckpt.find_checkpoint(tmp_path / "last") is None
    # A kill between the two renames: the previous checkpoint is `last.old-<pid>`.
    save(tmp_path / "last", model, config, tokenizer, 4)
    os.rename(tmp_path / "last", tmp_path / "last.old-77")
    assert ckpt.find_checkpoint(tmp_path / "last") == tmp_path / "last.old-77"
    # The next save puts `last` in place and removes the leftovers.
    save(tmp_path / "last", model, config, tokenizer, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]


def test_load_model_errors(tmp_path, tokenizer):
    with pytest.raises(ValueError, match=r"holds no checkpoint"):
        ckpt.load_model(tmp_path)
    model, config = make(tokenizer)
    save(tmp_path / "last", model, config, tokenizer, 1)
    with pytest.raises(ValueError, match=r"no resume.pt"):
        ckpt.load_resume_state(tmp_path / "last")
    other = Transformer(
        TransformerConfig(src_vocab_size=300, tgt_vocab_size=300, d_model=16, num_heads=2, d_ff=32)
    )
    with pytest.raises(ValueError, match=r"weights do not match the model"):
        ckpt.load_weights(other, tmp_path / "last")
