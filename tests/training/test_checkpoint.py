"""Checkpoints: round trip, tied weights, atomic replacement, recovery after a kill."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys

import pytest
import torch

from attnkit.data import SubwordTokenizer
from attnkit.models import Transformer, TransformerConfig
from attnkit.training import checkpoint as ckpt
from attnkit.training.config import TrainConfig
from tests.helpers.bad_files import BAD_JSON
from tests.helpers.training import ROOT, subprocess_env


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


@pytest.mark.parametrize("where", ["fsync", "rename"])
def test_a_full_disk_leaves_the_previous_checkpoint_and_no_temporary_folder(
    tmp_path, tokenizer, monkeypatch, where
):
    """ENOSPC while the new checkpoint's files are flushed, or while it is renamed into
    place: the previous ``last`` is untouched, no ``last.tmp-*`` / ``last.old-*`` remains."""
    from attnkit import model_folder

    model, config = make(tokenizer)
    save(tmp_path / "last", model, config, tokenizer, 1, resume={"rng": torch.arange(3)})
    before = {p.name: p.read_bytes() for p in (tmp_path / "last").iterdir()}

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "fsync":
        monkeypatch.setattr(model_folder, "_fsync_file", full)
        expected = pytest.raises(OSError, match="No space left on device")
    else:
        rename = os.rename
        monkeypatch.setattr(
            os, "rename", lambda a, b: full() if ".tmp-" in os.fspath(a) else rename(a, b)
        )
        expected = pytest.raises(ValueError, match=r"'.*last': cannot replace it .*No space")
    with expected:
        save(tmp_path / "last", model, config, tokenizer, 2, resume={"rng": torch.arange(4)})
    assert {p.name: p.read_bytes() for p in (tmp_path / "last").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]
    assert ckpt.read_state(tmp_path / "last")["step"] == 1


# A process whose files may not grow past a limit (RLIMIT_FSIZE, SIGXFSZ ignored): every write
# past it fails with EFBIG, at the same system call a full disk fails at with ENOSPC, inside
# safetensors and torch.save as much as in Python.
_FILE_SIZE_LIMIT = """
import json, resource, signal, sys
from pathlib import Path
import torch
from tests.training.test_checkpoint import make, save
from attnkit.data import SubwordTokenizer

out, where = Path(sys.argv[1]), sys.argv[2]
tokenizer = SubwordTokenizer.train(["ab ab ba", "ba ab"] * 10, vocab_size=270)
model, config = make(tokenizer)
save(out / "last", model, config, tokenizer, 1, resume={"rng": torch.arange(3)})
sizes = {p.name: p.stat().st_size for p in (out / "last").iterdir()}
others = max(n for name, n in sizes.items() if name not in ("model.safetensors", "resume.pt"))
# "weights": only model.safetensors is too big; "resume": only resume.pt is.
limit = others + 1 if where == "weights" else sizes["model.safetensors"] + 1
assert sizes["model.safetensors"] > limit or where == "resume", sizes
big = torch.zeros(limit)  # 4 bytes a number: resume.pt outgrows the limit
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    save(out / "last", model, config, tokenizer, 2, resume={"rng": torch.arange(4), "big": big})
except Exception as err:
    print(json.dumps({"type": type(err).__name__, "errno": getattr(err, "errno", None),
                      "filename": getattr(err, "filename", None), "text": str(err)}))
"""


@pytest.mark.parametrize("where", ["weights", "resume"])
def test_a_write_the_file_system_refuses_is_an_os_error_naming_the_folder(tmp_path, where):
    """safetensors (weights) and torch.save (resume.pt) meet a real failed write: it comes out
    as an OSError naming the checkpoint folder, never SafetensorError or torch's RuntimeError
    ("unexpected pos"); the previous checkpoint stays and no temporary folder remains."""
    done = subprocess.run(
        [sys.executable, "-c", _FILE_SIZE_LIMIT, str(tmp_path), where],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=subprocess_env(),
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    error = json.loads(done.stdout.splitlines()[-1])
    assert error["type"] == "OSError" and error["errno"] == errno.EFBIG, error
    assert error["filename"] == str(tmp_path / "last"), error
    file = "model.safetensors" if where == "weights" else "resume.pt"
    assert f"(writing {file})" in error["text"], error
    assert ckpt.read_state(tmp_path / "last")["step"] == 1
    assert torch.equal(ckpt.load_resume_state(tmp_path / "last")["rng"], torch.arange(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]


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


# --------------------------------------------------------------------------- corrupt checkpoints


@pytest.fixture()
def last(tmp_path, tokenizer):
    model, config = make(tokenizer)
    resume = {"optimizer": {"state": {}}, "rng": [torch.get_rng_state()]}
    return save(tmp_path / "last", model, config, tokenizer, 4, resume=resume)


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda p: p.write_bytes(b""), r"resume.pt: not a readable resume state"),
        (_truncate, r"resume.pt: not a readable resume state"),
        (lambda p: p.write_bytes(b"\x00" * 64), r"resume.pt: not a readable resume state"),
        (lambda p: p.write_text("{}"), r"resume.pt: not a readable resume state"),
        (
            lambda p: torch.save([1, 2], p),
            r"resume.pt: expected a dict of training states, got list",
        ),
        (
            lambda p: torch.save(torch.zeros(3), p),
            r"expected a dict of training states, got Tensor",
        ),
        (
            lambda p: torch.save({"f": os.getcwd}, p),
            r"resume.pt: not a readable resume state \(UnpicklingError: .*GLOBAL posix.getcwd",
        ),
        (lambda p: p.write_text("garbage\n"), r"resume.pt: not a readable resume state"),
    ],
)
def test_a_corrupt_resume_state_is_a_clear_error(last, damage, message):
    damage(last / "resume.pt")
    with pytest.raises(ValueError, match=message) as info:
        ckpt.load_resume_state(last)
    # torch's advice for what it will not unpickle (weights_only=False: run the file's code)
    # is not passed on, and the message is one line
    assert "weights_only" not in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "content,message",
    BAD_JSON
    + [
        (b"{}", r"\"step\": expected a non-negative integer, got None"),
        (b'{"step": "4"}', r"\"step\": expected a non-negative integer, got '4'"),
        (b'{"step": -1}', r"got -1"),
        (b'{"step": true}', r"got True"),
        (b'{"step": 4.0}', r"got 4.0"),
    ],
)
def test_a_corrupt_state_json_is_a_clear_error(last, content, message):
    (last / "state.json").write_bytes(content)
    with pytest.raises(ValueError, match=rf"state.json: .*{message}"):
        ckpt.read_state(last)


@pytest.mark.parametrize(
    "content,message",
    BAD_JSON
    + [
        (b'{"model_type": "bert"}', r"this is a Hugging Face BERT folder"),
        (b'{"model": {"d_model": -16}}', r"bad training config: .*d_model"),
        (b'{"model": {"d_model": "16"}}', r"bad training config: .*model.d_model: expected int"),
        (b'{"model": {"num_heads": 0}}', r"num_heads: expected an integer from 1"),
        (b'{"model": {}, "optim": []}', r"bad training config: .*\[optim\]: expected a table"),
        (b'{"model": {}, "extra": {}}', r"unknown config section"),
    ],
)
def test_a_corrupt_checkpoint_config_is_a_clear_error(last, content, message):
    (last / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match=rf"config.json: .*{message}"):
        ckpt.read_train_config(last)
    with pytest.raises(ValueError, match=rf"config.json: .*{message}"):
        ckpt.load_model(last)


def test_corrupt_or_missing_weights_are_named(last):
    _truncate(last / "model.safetensors")
    with pytest.raises(ValueError, match=r"last/model.safetensors: not a readable safetensors"):
        ckpt.load_model(last)
    (last / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"holds no checkpoint"):
        ckpt.load_model(last)


def test_resume_of_a_corrupt_checkpoint_is_one_line_not_a_traceback(tmp_path, tokenizer, capsys):
    from attnkit.cli import main

    model, config = make(tokenizer)
    save(tmp_path / "last", model, config, tokenizer, 4)
    (tmp_path / "last" / "config.json").write_text("[]")
    assert main(["train", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "config.json: expected a JSON object" in err and "Traceback" not in err


def test_saving_never_replaces_a_folder_attnkit_did_not_write(tmp_path, tokenizer):
    model, config = make(tokenizer)
    (tmp_path / "last").mkdir()
    (tmp_path / "last" / "notes.md").write_text("mine")
    with pytest.raises(ValueError, match=r"checkpoint folder '.*last': refusing to replace it"):
        save(tmp_path / "last", model, config, tokenizer, 1)
    assert [p.name for p in (tmp_path / "last").iterdir()] == ["notes.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]


def test_the_newest_recovered_checkpoint_is_found_and_an_unreadable_one_comes_last(
    tmp_path, tokenizer
):
    model, config = make(tokenizer)
    for step, pid in ((3, 11), (9, 12), (6, 13)):
        save(tmp_path / "keep", model, config, tokenizer, step)
        os.rename(tmp_path / "keep", tmp_path / f"last.old-{pid}")
    assert ckpt.find_checkpoint(tmp_path / "last") == tmp_path / "last.old-12"
    (tmp_path / "last.old-12" / "state.json").write_text("[")
    assert ckpt.find_checkpoint(tmp_path / "last") == tmp_path / "last.old-13"


def test_checkpoints_keep_the_writer_mark_and_are_translation_folders(tmp_path, tokenizer):
    from attnkit import model_folder
    from attnkit.decoding import load_translation_model

    model, config = make(tokenizer)
    folder = save(tmp_path / "best", model, config, tokenizer, 2)
    assert model_folder.weights_metadata(folder / "model.safetensors")["writer"] == "attnkit"
    loaded, _, _ = load_translation_model(folder)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_a_run_saved_before_sources_were_cleaned_keeps_its_raw_sources(last):
    """`data.clean_sources` is new: a checkpoint written before it (no such key) trained on
    its sources as written, and must resume so (its tokenizer and batch order depend on it);
    a checkpoint written now keeps the value it was trained with."""
    assert ckpt.read_train_config(last).data.clean_sources is True
    raw = json.loads((last / "config.json").read_text())
    assert raw["data"]["clean_sources"] is True
    del raw["data"]["clean_sources"]
    (last / "config.json").write_text(json.dumps(raw))
    assert ckpt.read_train_config(last).data.clean_sources is False
