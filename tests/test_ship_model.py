"""scripts/ship_model.py: bf16 copy of a run's checkpoint with its record, written atomically;
an --out that is not a model folder attnkit wrote is refused and left as it was."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnkit.data import SubwordTokenizer
from attnkit.decoding import load_translation_model
from attnkit.models import Transformer, TransformerConfig
from attnkit.training.checkpoint import save_checkpoint
from attnkit.training.config import TrainConfig
from tests.helpers.scripts import import_script


@pytest.fixture(scope="module")
def ship_model():
    return import_script("ship_model")


@pytest.fixture()
def run(tmp_path):
    tokenizer = SubwordTokenizer.train(["ab ab ba", "ba ab"] * 10, vocab_size=270)
    model_cfg = TransformerConfig(
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    config = TrainConfig(model=model_cfg)
    run = tmp_path / "run"
    run.mkdir()
    save_checkpoint(
        run / "best",
        model=Transformer(model_cfg),
        config=config,
        tokenizer=tokenizer,
        state={"step": 7, "val_loss": 1.5},
    )
    for name, text in (
        ("config.toml", "[model]\n"),
        ("metrics.jsonl", "{}\n"),
        ("train.log", "ok\n"),
    ):
        (run / name).write_text(text)
    return run


def _snapshot(folder: Path) -> dict:
    return {
        p.relative_to(folder): p.read_bytes() if p.is_file() else None for p in folder.rglob("*")
    }


def test_ships_bf16_with_the_run_record_and_replaces_its_own_output(ship_model, run, tmp_path):
    out = ship_model.ship(run, tmp_path / "shipped")
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint_state.json",
        "config.json",
        "config.toml",
        "metrics.jsonl",
        "model.safetensors",
        "tokenizer.json",
        "train.log",
    ]
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.bfloat16}
    assert json.loads((out / "checkpoint_state.json").read_text()) == {"step": 7, "val_loss": 1.5}
    model, _, _ = load_translation_model(out)
    best = load_file(run / "best" / "model.safetensors")
    for name, tensor in best.items():
        assert torch.equal(model.state_dict()[name], tensor.to(torch.bfloat16).float()), name
    ship_model.ship(run, out)  # its own earlier output: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "shipped"]


@pytest.mark.parametrize("where", ["theses", "run", "file", "run_parent"])
def test_refuses_an_out_it_did_not_write(ship_model, run, tmp_path, where):
    theses = tmp_path / "theses"
    theses.mkdir()
    (theses / "chapter.tex").write_text("precious")
    (tmp_path / "file").write_text("precious")
    out = {"theses": theses, "run": run, "file": tmp_path / "file", "run_parent": tmp_path}[where]
    before = _snapshot(tmp_path)
    with pytest.raises(ValueError, match=r"--out '.*': refusing to replace it"):
        ship_model.ship(run, out)
    assert _snapshot(tmp_path) == before


def test_main_reports_errors_in_one_line(ship_model, run, tmp_path, monkeypatch, capsys):
    (tmp_path / "theses").mkdir()
    (tmp_path / "theses" / "a.pdf").write_bytes(b"%PDF")
    monkeypatch.setattr(sys, "argv", ["ship_model.py", str(run), "--out", str(tmp_path / "theses")])
    assert ship_model.main() == 2
    assert "ship_model: error: --out" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["ship_model.py", str(run), "--checkpoint", "last"])
    assert ship_model.main() == 2
    assert "run/last: no checkpoint there" in capsys.readouterr().err
    (run / "train.log").unlink()
    with pytest.raises(ValueError, match=r"not a run folder .*\['train.log'\]"):
        ship_model.ship(run, tmp_path / "new")
