"""The language-model task on the shared trainer: exact resume, GPT-2 checkpoints that
Hugging Face and `attnkit generate` read, validation per token and per character against
Hugging Face's loss, the sample in the log, averaging and the val-loss plot."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file

from attnkit.data.corpus import load_named_text
from attnkit.data.lm import eval_windows
from attnkit.models import GPT
from attnkit.pretrained_loading import load_pretrained
from attnkit.training import train
from attnkit.training.averaging import average_run, step_checkpoints
from attnkit.training.metrics_log import read_metrics
from tests.helpers.lm import tiny_lm_config
from tests.helpers.training import weights


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """12 steps of the tiny character GPT, evaluated every 4, the last 3 saves kept."""
    folder = tmp_path_factory.mktemp("lm_run")
    config = tiny_lm_config("optim.max_steps=12", "optim.eval_every=4", "optim.keep_checkpoints=3")
    result = train(config, folder, progress=False)
    return folder, result


def test_stop_resume_continues_exactly_with_accumulation_and_epochs(tmp_path):
    """Stopping at step 7 and resuming to 16 gives the weights and losses of 16 steps in one
    go, with dropout, accumulation over epoch boundaries and evaluations in between. (The
    paper's schedule: a cosine one depends on max_steps; the SIGKILL test resumes a cosine
    run.)"""
    extra = ["optim.accumulation=2", "optim.eval_every=5", "optim.schedule=inverse_sqrt"]
    full = train(tiny_lm_config("optim.max_steps=16", *extra), tmp_path / "full", progress=False)
    train(tiny_lm_config("optim.max_steps=7", *extra), tmp_path / "part", progress=False)
    resumed = train(
        tiny_lm_config("optim.max_steps=16", *extra),
        tmp_path / "part",
        resume=True,
        progress=False,
    )
    assert full.step == resumed.step == 16 and full.epoch == resumed.epoch > 1
    a, b = weights(tmp_path / "full"), weights(tmp_path / "part")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)

    def losses(run):
        return [r["train_loss"] for r in read_metrics(run / "metrics.jsonl") if "train_loss" in r]

    assert losses(tmp_path / "full") == losses(tmp_path / "part")


def test_metrics_carry_throughput_and_loss_per_character(lm_run):
    folder, result = lm_run
    records = read_metrics(folder / "metrics.jsonl")
    assert all(r["tokens_per_sec"] > 0 for r in records if "train_loss" in r)
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [4, 8, 12]
    for r in evals:
        # characters: one token a character, so per token = per character here
        assert r["val_nats_per_char"] == pytest.approx(r["val_loss"], rel=1e-12)
        assert r["val_bits_per_char"] == pytest.approx(r["val_loss"] / math.log(2), rel=1e-12)
        assert r["val_ppl"] == pytest.approx(math.exp(r["val_loss"]), rel=1e-12)
    assert result.best_metric == "val_loss"


def test_each_evaluation_logs_a_sample(lm_run):
    """One sample per evaluation, each the repr of the prompt (a newline) and its continuation
    (single- or double-quoted, as repr picks by the text)."""
    import ast

    folder, _ = lm_run
    log = (folder / "train.log").read_text(encoding="utf-8")
    marker = "attnkit.training.lm: sample: "
    samples = [
        ast.literal_eval(line.split(marker, 1)[1]) for line in log.splitlines() if marker in line
    ]
    assert len(samples) == 3 and all(s.startswith("\n") and len(s) > 1 for s in samples)


def test_checkpoints_are_gpt2_folders_hugging_face_reads(lm_run):
    import transformers

    folder, _ = lm_run
    config = json.loads((folder / "last" / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["n_positions"] == 16
    assert config["attnkit_train_config"]["task"] == "lm"
    gpt = GPT.from_pretrained(folder / "last")
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder / "last").eval()
    ids = torch.tensor([gpt.tokenizer.encode("To be, or not to")])
    with torch.no_grad():
        torch.testing.assert_close(gpt(ids).logits, hf(ids).logits, rtol=1e-4, atol=1e-5)
    loaded = load_pretrained(folder / "best")
    assert loaded.model_type == "gpt2" and loaded.tokenizer is not None


def test_validation_loss_is_hugging_faces_summed_over_the_windows(lm_run):
    """The last evaluation (of the `last` weights) against GPT2LMHeadModel's cross-entropy
    over consecutive windows of newline + the validation text, summed and divided by the
    tokens and by the characters."""
    import transformers

    folder, result = lm_run
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder / "last").eval()
    tokenizer = GPT.from_pretrained(folder / "last").tokenizer
    text = load_named_text("shakespeare", "val")[:300]
    ids = tokenizer.encode(text)
    bos = hf.config.bos_token_id
    assert tokenizer.decode([bos]) == "\n"
    nats = 0.0
    with torch.no_grad():
        for window in eval_windows(ids, 16, bos):
            logits = hf(window[None, :-1]).logits[0]  # (T, V)
            nats += float(torch.nn.functional.cross_entropy(logits, window[1:], reduction="sum"))
    metrics = result.metrics
    assert metrics["val_loss"] == pytest.approx(nats / len(ids), rel=1e-5)
    assert metrics["val_nats_per_char"] == pytest.approx(nats / len(text), rel=1e-5)


def test_generate_command_reads_the_best_checkpoint(lm_run, capsys):
    from attnkit.cli import main

    folder, _ = lm_run
    code = main(
        ["generate", "--model", str(folder / "best"), "KING", "--max-new-tokens", "5", "--json"]
    )
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    assert record["prompt"] == "KING" and len(record["token_ids"]) == 5


def test_average_of_kept_lm_checkpoints_is_a_gpt_folder_of_the_mean(lm_run, tmp_path):
    folder, _ = lm_run
    kept = step_checkpoints(folder)
    assert [p.name for p in kept] == ["step_0000004", "step_0000008", "step_0000012"]
    out, chosen = average_run(folder, last=2, out=tmp_path / "avg")
    assert chosen == kept[-2:]
    got = load_file(out / "model.safetensors")
    sources = [load_file(p / "model.safetensors") for p in chosen]
    assert got.keys() == sources[0].keys()
    for name in got:
        mean = (sources[0][name].double() + sources[1][name].double()) / 2
        torch.testing.assert_close(got[name], mean.float(), rtol=0, atol=1e-7, msg=name)
    averaged = GPT.from_pretrained(out)
    assert averaged.tokenizer is not None and averaged.config.context_length == 16


def test_val_loss_plot_of_an_lm_run(lm_run, tmp_path):
    from attnkit.training.plot import plot_val_loss
    from tests.helpers.viz import assert_image

    folder, _ = lm_run
    assert_image(plot_val_loss(folder / "metrics.jsonl", tmp_path / "val.png"))


def test_bpe_run_reports_per_character_below_per_token(tmp_path):
    config = tiny_lm_config(
        "data.tokenizer=bpe",
        "data.vocab_size=300",
        "data.max_train_chars=5000",
        "optim.max_steps=2",
    )
    result = train(config, tmp_path, progress=False)
    m = result.metrics
    text = load_named_text("shakespeare", "val")[:300]
    tokens = len(GPT.from_pretrained(tmp_path / "last").tokenizer.encode(text))
    assert tokens < len(text)
    assert m["val_nats_per_char"] == pytest.approx(m["val_loss"] * tokens / len(text), rel=1e-9)


def test_bf16_autocast_run_evaluates_and_samples(tmp_path):
    """Under bf16 autocast (fast on AVX-512 CPUs; emulated, slowly, elsewhere) the run
    evaluates and writes its sample."""
    result = train(
        tiny_lm_config("optim.max_steps=2", "optim.autocast=bf16"), tmp_path, progress=False
    )
    assert result.step == 2 and math.isfinite(result.metrics["val_nats_per_char"])
    assert "sample: '\\n" in (tmp_path / "train.log").read_text(encoding="utf-8")


def test_the_language_model_parts_are_exported_by_their_packages():
    import attnkit.data as data
    import attnkit.training as training
    from attnkit.data import lm, lm_tokenizer
    from attnkit.training import lm as training_lm
    from attnkit.training import lm_config

    assert training.LMTask is training_lm.LMTask and training.text_loss is training_lm.text_loss
    assert training.LMDataConfig is lm_config.LMDataConfig
    assert data.RandomWindows is lm.RandomWindows and data.eval_windows is lm.eval_windows
    assert data.char_tokenizer is lm_tokenizer.char_tokenizer
    assert data.byte_bpe_tokenizer is lm_tokenizer.byte_bpe_tokenizer
    assert data.load_named_text is load_named_text
    for package in (data, training):
        assert all(hasattr(package, name) for name in package.__all__), package.__name__


def test_a_resume_from_weights_holding_nan_is_refused_naming_the_stored_tensor(lm_run, tmp_path):
    """The language model's `last` holds Hugging Face's GPT-2 names: the error names the
    tensor as the file stores it, before any step."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from attnkit.training.trainer import Trainer

    folder = tmp_path / "run"
    shutil.copytree(lm_run[0], folder)
    path = folder / "last" / "model.safetensors"
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    tensors = load_file(path)
    tensors["transformer.h.1.mlp.c_fc.bias"][3] = float("-inf")
    save_file(tensors, path, metadata=metadata)
    before = path.read_bytes()
    config = tiny_lm_config("optim.max_steps=16", "optim.eval_every=4")
    with pytest.raises(
        ValueError,
        match=r"tensor 'transformer\.h\.1\.mlp\.c_fc\.bias' \(0 NaN, 1 inf of 64 values\)",
    ):
        Trainer(config, folder, resume=True, progress=False).fit()
    assert path.read_bytes() == before
    assert max(r["step"] for r in read_metrics(folder / "metrics.jsonl")) == 12


def test_a_training_text_shorter_than_a_window_names_the_file_and_the_setting(tmp_path):
    """Before: "ids: 3 tokens, fewer than one window of context + 1", in the sampler's terms."""
    (tmp_path / "short.txt").write_text("ab\n")
    config = tiny_lm_config(
        "data.corpus=",
        f"data.train_file={tmp_path / 'short.txt'}",
        f"data.val_file={tmp_path / 'short.txt'}",
        "optim.max_steps=1",
    )
    message = (
        f"data.train_file={str(tmp_path / 'short.txt')!r} cut to data.max_train_chars=1500: 3 "
        "tokens, fewer than one window of model.context_length + 1 = 17; give a longer "
        "training text or a shorter model.context_length"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        train(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
