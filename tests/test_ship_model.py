"""scripts/ship_model.py: bf16 copy of a translation run's checkpoint with its record, written
atomically; an --out that is not a model folder attnkit wrote is refused and left as it was, and
so is one that is a run, a run's checkpoint (last/, best/) or inside the run being shipped. The
package's shipped model takes only a run of its task, corpus and languages, and is replaced only
with --replace-shipped.
A language-model run ships as a GPT-2 folder in float32 (bfloat16 beyond the size cap), chosen
between its best checkpoint and an average by val_nats_per_char, with a provenance record whose
validation metric is the trainer's."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnkit.data import SubwordTokenizer
from attnkit.decoding import load_translation_model
from attnkit.models import Transformer, TransformerConfig
from attnkit.training.checkpoint import save_checkpoint
from attnkit.training.config import DataConfig, TrainConfig
from tests.helpers.scripts import import_script


@pytest.fixture(scope="module")
def ship_model():
    return import_script("ship_model")


def _make_run(run: Path, data: DataConfig | None = None, *, step: int = 7,
              last: bool = False) -> Path:  # fmt: skip
    """A translation run folder as `attnkit train` leaves it: best/ (and with ``last``, last/
    with its resume.pt and the run's lock file), config.toml, metrics.jsonl and train.log."""
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
    config = TrainConfig(model=model_cfg, data=data or DataConfig())
    run.mkdir(parents=True)
    torch.manual_seed(step)
    model = Transformer(model_cfg)
    names = ("best", "last") if last else ("best",)
    for name in names:
        save_checkpoint(
            run / name,
            model=model,
            config=config,
            tokenizer=tokenizer,
            state={"step": step, "val_loss": 1.5},
            resume={"optimizer": {"step": step}} if name == "last" else None,
        )
    for name, text in (
        ("config.toml", config.to_toml()),
        ("metrics.jsonl", "{}\n"),
        ("train.log", "ok\n"),
    ):
        (run / name).write_text(text)
    if last:
        (run / ".attnkit.lock").write_text("")
    return run


@pytest.fixture()
def run(tmp_path):
    return _make_run(tmp_path / "run")


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


# --------------------------------------------------------------------------- a run's own folders


@pytest.fixture()
def copy_run(tmp_path):
    """runs/copy: a copy-task run (configs/tiny_copy.toml's corpus) with best/ and last/."""
    return _make_run(tmp_path / "runs" / "copy", DataConfig(corpus="copy"), last=True)


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("copy/last", "it is the run 'runs/copy' or a folder inside it"),
        ("copy/best", "it is the run 'runs/copy' or a folder inside it"),
        ("copy/shipped", "it is the run 'runs/copy' or a folder inside it"),  # a new folder
        ("copy", "it is the run 'runs/copy'"),
        (".", "it holds the run 'runs/copy'"),
        ("other/last", "it is a training checkpoint"),
        ("other/best", "it is a training checkpoint"),
        ("other", "it is a training run folder"),
        ("other/last/shipped", "runs/other/last', which must hold its own files only"),
    ],
)
def test_refuses_a_run_or_its_checkpoints_and_touches_nothing(
    ship_model, copy_run, tmp_path, monkeypatch, where, reason
):
    """The QA report: --out runs/copy/last replaced the run's last/ (resume.pt and state.json
    gone, bf16 weights instead) and --out runs/copy/best its float32 best/. Now every run
    folder and checkpoint, the one shipped and any other, is refused and left as it was."""
    _make_run(tmp_path / "runs" / "other", last=True)
    monkeypatch.chdir(tmp_path)
    out = Path("runs", where)
    before = _snapshot(tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"--out {str(out)!r}")) as err:
        ship_model.ship(Path("runs/copy"), out)
    assert reason in str(err.value)
    assert _snapshot(tmp_path) == before


def test_main_refuses_the_runs_last_and_it_still_resumes(ship_model, copy_run, tmp_path,
                                                         monkeypatch, capsys):  # fmt: skip
    """`python scripts/ship_model.py --run runs/copy --out runs/copy/last`, as reported."""
    from attnkit.training.checkpoint import load_resume_state
    from attnkit.training.run_folder import RunFolder

    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    for out in ("runs/copy/last", "runs/copy/best", "runs/copy/last/"):
        monkeypatch.setattr(sys, "argv", ["ship_model.py", "--run", "runs/copy", "--out", out])
        assert ship_model.main() == 2
        printed = capsys.readouterr()
        assert "shipped" not in printed.out
        assert (
            f"ship_model: error: --out '{out.rstrip('/')}': refusing to replace it" in printed.err
        )
        assert _snapshot(tmp_path) == before
    folder = RunFolder(copy_run)
    last = folder.open_for_resume()  # what `attnkit train --resume` reads
    folder.unlock()
    assert load_resume_state(last) == {"optimizer": {"step": 7}}
    assert {t.dtype for t in load_file(last / "model.safetensors").values()} == {torch.float32}


# --------------------------------------------------------------------------- the shipped model


@pytest.fixture()
def package(ship_model, run, tmp_path, monkeypatch):
    """A stand-in for src/attnkit/pretrained/ with a multi30k de -> en translator shipped
    (from ``run``: data.corpus multi30k, de -> en, step 7) at the default --out."""
    pretrained = tmp_path / "pretrained"
    outs = {"translation": pretrained / "multi30k_de_en", "lm": pretrained / "shakespeare_gpt"}
    monkeypatch.setattr(ship_model, "PRETRAINED", pretrained)
    monkeypatch.setattr(ship_model, "DEFAULT_OUTS", outs)
    ship_model.ship(run)  # the first shipped model: nothing to replace, no flag needed
    return outs["translation"]


def _step(folder: Path) -> int:
    return json.loads((folder / "checkpoint_state.json").read_text())["step"]


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("replace_shipped", [False, True])
def test_a_copy_run_never_replaces_the_shipped_translator(ship_model, package, copy_run,
                                                          tmp_path, explicit,
                                                          replace_shipped):  # fmt: skip
    """The QA report: `ship_model.py --run runs/copy` (no --out) overwrote the shipped de-en
    model with a copy-task model; `attnkit translate` then printed garbage."""
    before = _snapshot(tmp_path)
    out = package if explicit else None
    with pytest.raises(ValueError, match=r"refusing to ship .*runs/copy' there") as err:
        ship_model.ship(copy_run, out, replace_shipped=replace_shipped)
    message = str(err.value)
    assert f"--out {str(package)!r}" in message
    assert ("(the default for a translation run)" in message) == (not explicit)
    assert "data.corpus 'copy' (shipped: 'multi30k')" in message
    assert "(shipped: 'de')" not in message  # the languages agree (de -> en)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("data", "differs"),
    [
        (DataConfig(src_lang="en", tgt_lang="de"), "data.src_lang 'en' (shipped: 'de'), "
         "data.tgt_lang 'de' (shipped: 'en')"),
        (DataConfig(corpus="", train_src="a.txt", train_tgt="b.txt"),
         "data.corpus '' (shipped: 'multi30k')"),
    ],
)  # fmt: skip
def test_other_languages_or_corpus_are_refused(ship_model, package, tmp_path, data, differs):
    other = _make_run(tmp_path / "runs" / "other", data)
    before = _snapshot(package)
    with pytest.raises(ValueError, match="refusing to ship") as err:
        ship_model.ship(other, replace_shipped=True)
    assert differs in str(err.value)
    assert _snapshot(package) == before


def test_a_language_model_is_refused_as_the_translator(ship_model, package, lm_run):
    before = _snapshot(package)
    differs = "task 'lm' (shipped: 'translation'), data.corpus 'shakespeare' (shipped: 'multi30k');"
    with pytest.raises(ValueError, match=re.escape(f"the run has {differs}")):
        ship_model.ship(lm_run, package, replace_shipped=True)
    assert _snapshot(package) == before


def test_replacing_the_shipped_model_takes_replace_shipped(ship_model, package, tmp_path):
    newer = _make_run(tmp_path / "runs" / "de_en_r2", step=9)  # multi30k de -> en too
    before = _snapshot(package)
    for out in (None, package):
        with pytest.raises(ValueError, match="without --replace-shipped") as err:
            ship_model.ship(newer, out)
        assert "data.corpus 'multi30k', data.src_lang 'de', data.tgt_lang 'en'" in str(err.value)
        assert _snapshot(package) == before
    assert ship_model.ship(newer, replace_shipped=True) == package
    assert _step(package) == 9
    # Without its record (config.toml), the default folder is still known for multi30k de-en.
    (package / "config.toml").unlink()
    with pytest.raises(ValueError, match="data.corpus 'copy' \\(shipped: 'multi30k'\\)"):
        ship_model.ship(_make_run(tmp_path / "runs" / "copy", DataConfig(corpus="copy")),
                        replace_shipped=True)  # fmt: skip
    assert _step(package) == 9


def test_replace_shipped_elsewhere_is_refused_not_ignored(ship_model, package, tmp_path):
    newer = _make_run(tmp_path / "runs" / "de_en_r2", step=9)
    out = tmp_path / "elsewhere"
    with pytest.raises(ValueError, match=r"^--replace-shipped: --out '.*elsewhere' is not one of"):
        ship_model.ship(newer, out, replace_shipped=True)
    assert not out.exists() and _step(package) == 7


def test_main_takes_replace_shipped(ship_model, package, tmp_path, monkeypatch, capsys):
    newer = _make_run(tmp_path / "runs" / "de_en_r2", step=9)
    monkeypatch.setattr(sys, "argv", ["ship_model.py", "--run", str(newer)])
    assert ship_model.main() == 2
    assert "without --replace-shipped" in capsys.readouterr().err
    assert _step(package) == 7
    monkeypatch.setattr(sys, "argv", ["ship_model.py", "--run", str(newer), "--replace-shipped"])
    assert ship_model.main() == 0
    assert f"-> {package}" in capsys.readouterr().out
    assert _step(package) == 9


def test_help_explains_replace_shipped(ship_model, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["ship_model.py", "--help"])
    with pytest.raises(SystemExit):
        ship_model.main()
    text = " ".join(capsys.readouterr().out.split())
    assert "--replace-shipped replace the package's existing shipped model" in text
    assert "refused anyway for a run of another task, corpus or languages" in text


def test_the_real_shipped_models_are_guarded(ship_model, copy_run, run):
    """The checks alone (they never write) on the package's own folders."""
    copy_config = ship_model.read_train_config(copy_run / "best")
    for out in (ship_model.DEFAULT_OUTS["translation"], ship_model.PRETRAINED / "multi30k_de_en"):
        with pytest.raises(ValueError, match=r"data.corpus 'copy' \(shipped: 'multi30k'\)"):
            ship_model.check_out(out, copy_run, copy_config, replace_shipped=True)
    de_en = ship_model.read_train_config(run / "best")
    with pytest.raises(ValueError, match="without --replace-shipped"):
        ship_model.check_out(ship_model.DEFAULT_OUTS["translation"], run, de_en)
    ship_model.check_out(ship_model.DEFAULT_OUTS["translation"], run, de_en, replace_shipped=True)
    with pytest.raises(ValueError, match=r"task 'translation' \(shipped: 'lm'\)") as err:
        ship_model.check_out(ship_model.DEFAULT_OUTS["lm"], run, de_en, replace_shipped=True)
    assert "src_lang" not in str(err.value)  # a language model has no languages to compare


def test_average_is_for_language_models(ship_model, run, tmp_path):
    with pytest.raises(ValueError, match=r"--average 2: chooses among a language model's"):
        ship_model.ship(run, tmp_path / "shipped", average=2)
    assert not (tmp_path / "shipped").exists()


# --------------------------------------------------------------------------- language models


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """12 steps of the tiny character GPT, evaluated every 4 (float32), the 3 saves kept."""
    from attnkit.training import train
    from tests.helpers.lm import tiny_lm_config

    folder = tmp_path_factory.mktemp("lm_run")
    config = tiny_lm_config("optim.max_steps=12", "optim.eval_every=4", "optim.keep_checkpoints=3")
    train(config, folder, progress=False)
    return folder


def _trainer_val(run: Path, step: int) -> float:
    """The run's own val_nats_per_char at ``step`` (metrics.jsonl)."""
    from attnkit.training.metrics_log import read_metrics

    (record,) = [
        r for r in read_metrics(run / "metrics.jsonl") if r["step"] == step and "val_loss" in r
    ]
    return record["val_nats_per_char"]


def test_ships_a_language_model_with_its_provenance(ship_model, lm_run, tmp_path):
    out = ship_model.ship(lm_run, tmp_path / "gpt", command="python scripts/ship_model.py x")
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint_state.json",
        "config.json",
        "config.toml",
        "metrics.jsonl",
        "model.safetensors",
        "provenance.json",
        "tokenizer.json",
        "train.log",
    ]
    best = load_file(lm_run / "best" / "model.safetensors")
    shipped = load_file(out / "model.safetensors")
    assert shipped.keys() == best.keys()
    assert all(torch.equal(shipped[k], best[k]) and best[k].dtype == torch.float32 for k in best)
    tokenizer = (lm_run / "best" / "tokenizer.json").read_bytes()
    assert (out / "tokenizer.json").read_bytes() == tokenizer
    record = json.loads((out / "provenance.json").read_text())
    step = json.loads((lm_run / "best" / "state.json").read_text())["step"]
    assert record["checkpoint"] == "best" and record["step"] == step
    assert record["weights_dtype"] == "float32"
    # The trainer's evaluation of the same weights (batches of 4, float32) on the same text.
    assert record["val"]["nats_per_char"] == pytest.approx(_trainer_val(lm_run, step), rel=1e-5)
    assert record["val"]["characters"] == 300  # data.max_val_chars of the tiny run
    assert record["val"]["text"] == "shakespeare val, first 300 characters"
    assert [c["checkpoint"] for c in record["selection"]["candidates"]] == ["best"]
    assert [e["step"] for e in record["training"]["evaluations"]] == [4, 8, 12]
    assert record["training"]["last_step"] == 12
    assert record["config"]["task"] == "lm" and record["config"]["optim"]["max_steps"] == 12
    assert record["commands"]["ship"] == "python scripts/ship_model.py x"
    ship_model.ship(lm_run, out)  # its own earlier output (provenance.json too): replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt"]


def test_generate_reads_the_shipped_folder(ship_model, lm_run, tmp_path, capsys):
    from attnkit.cli import main

    out = ship_model.ship(lm_run, tmp_path / "gpt")
    outputs = []
    for folder in (out, lm_run / "best"):
        argv = ["generate", "--model", str(folder), "KING", "--max-new-tokens", "6", "--json"]
        assert main(argv) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1] and len(outputs[0]["token_ids"]) == 6


def test_average_competes_with_best_on_val(ship_model, lm_run, tmp_path):
    """--average 2: the mean of the last two kept checkpoints is scored beside best; the one
    with the lower val_nats_per_char is shipped."""
    from attnkit.models import GPT
    from attnkit.training.lm import load_lm_text, text_loss

    out = ship_model.ship(lm_run, tmp_path / "gpt", average=2)
    record = json.loads((out / "provenance.json").read_text())
    best, averaged = record["selection"]["candidates"]
    assert best["checkpoint"] == "best"
    assert averaged["checkpoint"] == "average of the last 2 kept checkpoints"
    assert averaged["step"] == 12
    # The average, computed here from the kept checkpoints' files, scored on the tiny run's
    # validation text (its first 300 characters).
    mean_dir = tmp_path / "mean"
    mean_dir.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copyfile(lm_run / "best" / name, mean_dir / name)
    kept = [load_file(lm_run / "steps" / f"step_{s:07d}" / "model.safetensors") for s in (8, 12)]
    mean = {k: ((kept[0][k].double() + kept[1][k].double()) / 2).float() for k in kept[0]}
    save_file(mean, mean_dir / "model.safetensors")
    model = GPT.from_pretrained(mean_dir)
    text = load_lm_text(ship_model.read_train_config(lm_run / "best").data).val
    assert len(text) == 300
    expected = text_loss(model, model.tokenizer, text).nats_per_char
    assert averaged["val_nats_per_char"] == pytest.approx(expected, rel=1e-5)
    assert best["val_nats_per_char"] == pytest.approx(_trainer_val(lm_run, best["step"]), rel=1e-5)
    winner = min((best, averaged), key=lambda c: c["val_nats_per_char"])
    assert record["checkpoint"] == winner["checkpoint"]
    assert record["val"]["nats_per_char"] == pytest.approx(winner["val_nats_per_char"], rel=1e-9)
    assert not (lm_run / "averaged").exists()  # averaged in a temporary folder, not the run


@pytest.mark.parametrize("averaged_wins", [True, False])
def test_the_lower_val_nats_per_char_is_shipped(ship_model, lm_run, tmp_path, monkeypatch,
                                                averaged_wins):  # fmt: skip
    """The rule alone, with made-up scores: the lower wins; the average's weights are the
    mean of the kept checkpoints."""
    real = ship_model._score
    low, high = ship_model.TextLoss(1.0, 1, 1), ship_model.TextLoss(2.0, 1, 1)

    def score(folder, text):
        if folder.name in ("best", "averaged"):
            return low if (folder.name == "averaged") == averaged_wins else high
        return real(folder, text)  # the shipped folder

    monkeypatch.setattr(ship_model, "_score", score)
    out = ship_model.ship(lm_run, tmp_path / "gpt", average=2)
    record = json.loads((out / "provenance.json").read_text())
    shipped = load_file(out / "model.safetensors")
    if averaged_wins:
        assert record["checkpoint"] == "average of the last 2 kept checkpoints"
        assert record["averaged"] == [str(lm_run / "steps" / f"step_{s:07d}") for s in (8, 12)]
        kept = [
            load_file(lm_run / "steps" / f"step_{s:07d}" / "model.safetensors") for s in (8, 12)
        ]
        for name, tensor in shipped.items():
            mean = (kept[0][name].double() + kept[1][name].double()) / 2
            torch.testing.assert_close(tensor, mean.float(), rtol=0, atol=1e-7, msg=name)
    else:
        assert record["checkpoint"] == "best" and record["averaged"] is None
        best = load_file(lm_run / "best" / "model.safetensors")
        assert all(torch.equal(shipped[k], best[k]) for k in best)


def test_bfloat16_when_float32_would_pass_the_cap(ship_model, lm_run, tmp_path, monkeypatch):
    best = load_file(lm_run / "best" / "model.safetensors")
    float32_bytes = sum(t.numel() * 4 for t in best.values())
    others = ["config.json", "tokenizer.json"]
    other_bytes = sum((lm_run / "best" / n).stat().st_size for n in others)
    other_bytes += sum((lm_run / n).stat().st_size for n in ship_model.RUN_FILES)
    other_bytes += (lm_run / "best" / "state.json").stat().st_size
    # float32 does not fit, bfloat16 (half the weights, plus provenance.json) does.
    cap = other_bytes + 2**16 + float32_bytes * 3 // 4
    monkeypatch.setattr(ship_model, "MAX_BYTES", cap)
    out = ship_model.ship(lm_run, tmp_path / "gpt")
    shipped = load_file(out / "model.safetensors")
    assert {t.dtype for t in shipped.values()} == {torch.bfloat16}
    assert all(torch.equal(shipped[k], best[k].to(torch.bfloat16)) for k in best)
    record = json.loads((out / "provenance.json").read_text())
    assert record["weights_dtype"] == "bfloat16"
    # The record scores the bfloat16 weights it ships, not the float32 checkpoint.
    (candidate,) = record["selection"]["candidates"]
    assert record["val"]["nats_per_char"] != candidate["val_nats_per_char"]
    assert sum(p.stat().st_size for p in out.iterdir()) <= cap
    monkeypatch.setattr(ship_model, "MAX_BYTES", 1000)
    with pytest.raises(ValueError, match=r"--out .*: [\d,]+ bytes, more than the package's 1,000"):
        ship_model.ship(lm_run, tmp_path / "too_big")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt"]


def test_main_ships_by_task_to_the_package_folder(ship_model, lm_run, tmp_path, monkeypatch,
                                                   capsys):  # fmt: skip
    outs = {"translation": tmp_path / "translation", "lm": tmp_path / "shakespeare_gpt"}
    monkeypatch.setattr(ship_model, "DEFAULT_OUTS", outs)
    monkeypatch.setattr(sys, "argv", ["ship_model.py", "--run", str(lm_run)])
    assert ship_model.main() == 0
    printed = capsys.readouterr().out
    assert f"-> {outs['lm']}" in printed and "nats/char" in printed
    record = json.loads((outs["lm"] / "provenance.json").read_text())
    ship = f"python scripts/ship_model.py --run {shlex.quote(str(lm_run))}"  # a shell line
    assert record["commands"]["ship"] == ship
    monkeypatch.setattr(sys, "argv", ["ship_model.py", str(lm_run), "--run", str(lm_run)])
    with pytest.raises(SystemExit):
        ship_model.main()
    assert "give the run folder once" in capsys.readouterr().err


def test_lenpen_is_stored_as_the_models_decoding_default(ship_model, run, tmp_path):
    from attnkit.decoding import DecodingConfig, model_decoding

    out = ship_model.ship(run, tmp_path / "shipped", lenpen=1.4)
    assert model_decoding(out) == DecodingConfig(lenpen=1.4)
    assert json.loads((out / "config.json").read_text())["decoding"]["lenpen"] == 1.4
    plain = ship_model.ship(run, tmp_path / "plain")
    assert "decoding" not in json.loads((plain / "config.json").read_text())
    with pytest.raises(ValueError, match="lenpen: expected a number from -10 to 10"):
        ship_model.ship(run, tmp_path / "bad", lenpen=float("nan"))
    assert not (tmp_path / "bad").exists()


def test_lenpen_is_refused_for_a_language_model(ship_model, lm_run, tmp_path):
    with pytest.raises(ValueError, match=r"--lenpen 1.4: a translation setting; .* language model"):
        ship_model.ship(lm_run, tmp_path / "shipped", lenpen=1.4)
    assert not (tmp_path / "shipped").exists()
