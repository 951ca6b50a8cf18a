"""`attnkit train` guarantees: what --resume may change, what the budget flags mean."""

from __future__ import annotations

import json
import shutil

import pytest

from attnkit.cli import main
from attnkit.training.config import TrainConfig
from attnkit.training.limits import resume_conflicts
from attnkit.training.metrics_log import read_metrics
from attnkit.training.trainer import train
from tests.helpers.bad_files import poison_weights
from tests.helpers.lm import tiny_lm_config
from tests.helpers.training import FAST, TINY_COPY

from .test_run_folder import snapshot
from .test_trainer import poison_step

SETS = [arg for item in FAST for arg in ("--set", item)]


def new_run(folder, *args: str) -> int:
    return main(
        ["train", "--no-progress", "--config", str(TINY_COPY), "--out", str(folder), *SETS, *args]
    )


def resume(folder, *args: str) -> int:
    return main(["train", "--no-progress", "--resume", str(folder), *args])


def state(folder) -> dict:
    return json.loads((folder / "last" / "state.json").read_text())


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A 2-step run; each test copies it, so that it is trained once."""
    folder = tmp_path_factory.mktemp("saved") / "run"
    assert new_run(folder, "--max-steps", "2") == 0
    return folder


@pytest.fixture
def run_copy(saved_run, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(saved_run, folder)
    return folder


REFUSED = [
    "model.d_model=64",
    "model.num_heads=4",
    "model.d_ff=128",
    "model.num_encoder_layers=2",
    "model.activation=gelu",
    "model.norm_first=false",
    "model.positional=learned",
    "model.max_len=64",
    "model.tie_output=false",
    "data.vocab_size=400",
    "data.corpus=multi30k",
    "data.copy_words=30",
    "data.copy_train_pairs=100",
    "data.src_lang=en",
]


@pytest.mark.parametrize("item", REFUSED)
def test_resume_refuses_changes_to_the_weights_or_the_tokenizer(run_copy, capsys, item):
    before = snapshot(run_copy)
    assert resume(run_copy, "--set", item, "--max-steps", "4") == 2
    err = capsys.readouterr().err
    key = item.partition("=")[0]
    assert f"cannot change {key} = " in err and "(the run has " in err, err
    assert "start a new run to change them" in err and "Traceback" not in err
    after = snapshot(run_copy)
    assert {k: v for k, v in after.items() if k != ".attnkit.lock"} == {
        k: v for k, v in before.items() if k != ".attnkit.lock"
    }


@pytest.mark.parametrize(
    "items",
    [
        ["model.dropout=0.0"],
        ["optim.lr_scale=0.5", "optim.eval_every=1"],
        ["optim.max_minutes=30", "optim.label_smoothing=0.0"],
        ["data.copy_val_pairs=20", "model.attn_dropout=0.1"],
    ],
)
def test_resume_allows_changes_that_keep_weights_and_tokenizer(run_copy, items):
    sets = [arg for item in items for arg in ("--set", item)]
    assert resume(run_copy, *sets, "--max-steps", "3") == 0
    assert state(run_copy)["step"] == 3
    saved = json.loads((run_copy / "last" / "config.json").read_text())
    for item in items:
        (section, key), value = item.partition("=")[0].split("."), item.partition("=")[2]
        assert saved[section][key] == pytest.approx(json.loads(value)), item


def test_resume_conflicts_lists_every_fixed_key():
    saved = TrainConfig.from_toml(TINY_COPY)
    changed = saved.with_overrides(
        ["model.d_model=128", "model.dropout=0.0", "data.vocab_size=500", "data.seed=3"]
    )
    assert resume_conflicts(saved, changed) == [
        "model.d_model = 128 (the run has 64)",
        "data.vocab_size = 500 (the run has 300)",
    ]
    assert resume_conflicts(saved, saved) == []


def test_max_minutes_zero_means_no_time_limit_as_help_says(tmp_path, capsys):
    """`--max-minutes 0` lifts the time limit (as optim.max_minutes = 0 does): the run goes
    on to its step budget, also on a resume whose saved config had a time limit."""
    folder = tmp_path / "run"
    assert new_run(folder, "--max-steps", "2", "--max-minutes", "0") == 0
    assert state(folder)["step"] == 2
    assert json.loads((folder / "last" / "config.json").read_text())["optim"]["max_minutes"] == 0
    assert resume(folder, "--max-minutes", "30", "--max-steps", "3") == 0
    assert json.loads((folder / "last" / "config.json").read_text())["optim"]["max_minutes"] == 30
    assert resume(folder, "--max-minutes", "0", "--max-steps", "5") == 0
    assert state(folder)["step"] == 5
    assert json.loads((folder / "last" / "config.json").read_text())["optim"]["max_minutes"] == 0
    assert max(r["step"] for r in read_metrics(folder / "metrics.jsonl")) == 5
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--max-minutes M stop after M minutes of wall time" in help_text
    assert "0 = no time limit" in help_text


def test_max_minutes_zero_without_another_budget_is_a_clear_error(tmp_path, capsys):
    folder = tmp_path / "run"
    assert new_run(folder, "--set", "optim.max_steps=0", "--max-minutes", "0") == 2
    assert "set a budget" in capsys.readouterr().err
    assert not folder.exists()


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--max-minutes", "-1", "expected a number in [0.0, 10000000.0], got -1.0"),
        ("--max-minutes", "nan", "expected a number in [0.0, 10000000.0], got nan"),
        ("--max-minutes", "inf", "expected a number in [0.0, 10000000.0], got inf"),
        ("--max-minutes", "1e9", "expected a number in [0.0, 10000000.0], got 1000000000.0"),
        ("--max-minutes", "soon", "expected a number, got 'soon'"),
        ("--max-steps", "-5", "expected an integer from 0 to 10,000,000,000, got -5"),
        ("--max-steps", "100000000000", "expected an integer from 0 to 10,000,000,000, got"),
        ("--max-steps", "1.5", "expected an integer, got '1.5'"),
    ],
)
def test_bad_budget_flags_name_the_flag(tmp_path, capsys, flag, value, message):
    """The budget flags are checked by argparse against their config fields' bounds
    (attnkit.training.limits): the usage line and one error naming the flag, exit 2, before
    any work."""
    folder = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        new_run(folder, flag, value)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"attnkit train: error: argument {flag}: {message}" in err, err
    assert "Traceback" not in err
    assert not folder.exists()


@pytest.mark.parametrize(
    "item,message",
    [
        ("model.d_model=-64", "--set 'model.d_model=-64': d_model: expected an integer from 1"),
        ("data.max_tokens=0", "--set 'data.max_tokens=0': data.max_tokens: expected an integer"),
        ("optim.accumulation=true", "optim.accumulation: expected int, got True (bool)"),
        ("optim.seed=-1", "optim.seed: expected an integer from 0 to 4,294,967,295, got -1"),
        ("model.dropout=2", "model.dropout"),
    ],
)
def test_bad_set_on_resume_names_the_item(run_copy, capsys, item, message):
    assert resume(run_copy, "--set", item) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


@pytest.mark.parametrize("damage", ["cut", "empty", "not json"])
def test_resume_with_a_damaged_tokenizer_is_one_line_naming_it(run_copy, capsys, damage):
    path = run_copy / "last" / "tokenizer.json"
    data = path.read_bytes()
    path.write_bytes({"cut": data[: len(data) // 2], "empty": b"", "not json": b"<html>"}[damage])
    assert resume(run_copy, "--max-steps", "3") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "last/tokenizer.json: not a readable tokenizer" in err
    assert state(run_copy)["step"] == 2  # nothing trained, nothing saved


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_resume_from_weights_holding_nan_or_inf_is_refused_before_any_step(
    run_copy, capsys, value
):
    """`last` with one NaN (a bit flip, a diverged step) was resumed, trained to its budget on
    NaN and saved as `last` with every tensor NaN, exit status 0."""
    path = run_copy / "last" / "model.safetensors"
    name, size = poison_weights(path, value)
    kept = {k: v for k, v in snapshot(run_copy).items() if k not in NOT_COMPARED}
    assert resume(run_copy, "--max-steps", "4") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.splitlines()[-1]
    nan, inf = (1, 0) if value != value else (0, 1)
    assert line.startswith(
        f"attnkit train: error: --resume {str(run_copy)!r}: {path}: tensor {name!r} ({nan} NaN, "
        f"{inf} inf of {size} values) holds NaN or inf; these weights cannot be "
        "trained on; "
    ), line
    assert line.endswith("nothing was trained")
    assert {k: v for k, v in snapshot(run_copy).items() if k not in NOT_COMPARED} == kept


NOT_COMPARED = (".attnkit.lock", "train.log")  # the refused resume logs that it began


def test_a_run_that_diverges_is_one_line_and_resumes_with_the_advice(tmp_path, capsys, monkeypatch):
    """A NaN loss at step 3: one line naming the step and the command to go on with (exit
    status 2, as other run errors), `last` of step 2 kept; that command then resumes."""
    poison_step(monkeypatch, 3, before=True)
    folder = tmp_path / "run"
    assert new_run(folder, "--max-steps", "6", "--set", "optim.save_every=2") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    command = f"attnkit train --resume {folder} --set optim.lr_scale=0.4"
    assert err.splitlines()[-1] == (
        "attnkit train: error: training diverged: the training loss is NaN or infinite at "
        "step 3, so the run stopped unsaved; `last` (step 2) is the last good checkpoint; "
        f"continue from it with a lower learning rate: {command}"
    )
    assert state(folder)["step"] == 2
    monkeypatch.undo()
    assert main(command.split()[1:] + ["--no-progress", "--max-steps", "4"]) == 0
    assert state(folder)["step"] == 4


def lrs(folder) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in read_metrics(folder / "metrics.jsonl") if "lr" in r}


@pytest.mark.parametrize(
    "start, change",
    [
        ([], ["optim.lr_scale=0.4"]),  # the paper's schedule, tiny_copy's lr_scale 0.8 halved
        (
            ["optim.schedule=cosine", "optim.peak_lr=0.002", "optim.min_lr=0.0002"],
            ["optim.peak_lr=0.001", "optim.min_lr=0.0001"],
        ),
    ],
)
def test_a_learning_rate_changed_on_resume_is_used_from_the_next_step(tmp_path, start, change):
    """--resume --set may change the learning rate (reliability.md); the checkpoint's saved
    schedule must not win over it. Both schedules scale linearly with their rate, during
    warmup: the resumed steps' rates are exactly half the unchanged resume's."""
    sets = [arg for item in start for arg in ("--set", item)]
    same, lower = tmp_path / "same", tmp_path / "lower"
    assert new_run(same, "--max-steps", "2", *sets) == 0
    shutil.copytree(same, lower)
    assert resume(same, "--max-steps", "4") == 0
    assert resume(lower, "--max-steps", "4", *[a for c in change for a in ("--set", c)]) == 0
    before, after = lrs(same), lrs(lower)
    assert before[1] == after[1] and before[2] == after[2]  # the steps before the resume
    for step in (3, 4):
        assert after[step] == pytest.approx(before[step] / 2, rel=1e-12)


def _swap_last(run_copy, other) -> dict:
    """Put another run's `last` in place of the run's own; the run folder's snapshot before."""
    shutil.rmtree(run_copy / "last")
    shutil.copytree(other / "last", run_copy / "last")
    return snapshot(run_copy)


def _other_run(tmp_path, *sets: str):
    folder = tmp_path / "other"
    args = [a for item in sets for a in ("--set", item)]
    assert new_run(folder, "--max-steps", "2", *args) == 0
    return folder


def _other_vocabulary(folder) -> None:
    """The same config, a tokenizer trained on other data: two subwords' ids swapped."""
    path = folder / "last" / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = list(vocab)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(tokenizer))


@pytest.mark.parametrize(
    "sets, named",
    [
        (
            ["model.d_model=64"],
            "model.d_model = 64 (the run has 32) in {run}/last/config.json against the run's "
            "{run}/config.toml",
        ),
        ([], "its {run}/last/tokenizer.json is not the run's {run}/tokenizer.json"),
    ],
)
def test_a_last_checkpoint_of_another_run_is_not_resumed(run_copy, tmp_path, capsys, sets, named):
    """Before: the resume took the other checkpoint's config, rewrote config.toml with it and
    replaced the run's `best` and kept checkpoints with the other model's."""
    other = _other_run(tmp_path, *sets)
    if not sets:
        _other_vocabulary(other)
    before = _swap_last(run_copy, other)
    assert resume(run_copy, "--max-steps", "4") == 2
    err = capsys.readouterr().err
    named = named.format(run=run_copy)
    assert f"its `last` checkpoint {str(run_copy / 'last')!r} is not this run's: {named}; " in err
    assert "nothing was trained" in err
    assert snapshot(run_copy) == before


def test_a_language_model_last_in_a_translation_run_is_not_resumed(run_copy, tmp_path, capsys):
    lm = tmp_path / "lm"
    train(tiny_lm_config("optim.max_steps=1"), lm, progress=False)
    before = _swap_last(run_copy, lm)
    assert resume(run_copy) == 2
    assert "is not this run's: task = 'lm' (the run has 'translation')" in capsys.readouterr().err
    assert snapshot(run_copy) == before


def test_a_resume_state_of_another_step_is_not_resumed(run_copy, tmp_path, capsys):
    """A resume.pt from another point of the run (its schedule at step 4, state.json at 2)
    was taken: the learning rate went on from the wrong step."""
    later = tmp_path / "later"
    assert new_run(later, "--max-steps", "4") == 0
    (run_copy / "last" / "resume.pt").write_bytes((later / "last" / "resume.pt").read_bytes())
    before = snapshot(run_copy)
    assert resume(run_copy, "--max-steps", "6") == 2
    err = capsys.readouterr().err
    assert "resume.pt holds the schedule of step 4, its state.json step 2" in err
    after = snapshot(run_copy)
    assert after.pop("train.log") != before.pop("train.log")  # the attempt is logged
    assert after == before


def test_the_runs_own_last_resumes_whatever_the_files_leave_implicit(run_copy):
    """What the check of `last` against the run must not refuse: a tokenizer.json written in
    another layout (another tokenizers version), and a run saved before data.clean_sources
    existed (neither file names it; both read it as false)."""
    path = run_copy / "tokenizer.json"
    path.write_text(json.dumps(json.loads(path.read_text()), sort_keys=True))
    for file in (run_copy / "config.toml", run_copy / "last" / "config.json"):
        text = file.read_text()
        kept = [line for line in text.splitlines(keepends=True) if "clean_sources" not in line]
        assert len(kept) == len(text.splitlines()) - 1
        file.write_text("".join(kept))
    assert resume(run_copy, "--max-steps", "3") == 0
    assert state(run_copy)["step"] == 3
