"""The trainer's pieces: the loss over non-pad positions, budgets, run folders, resume."""

from __future__ import annotations

import json
import math
import os
import re

import pytest
import torch

from attnkit.training.metrics_log import read_metrics
from attnkit.training.trainer import DivergedError, Trainer, train
from tests.helpers.lm import tiny_lm_config
from tests.helpers.training import fast_config, weights


def test_a_budget_is_required(tmp_path):
    config = fast_config("optim.max_steps=0")
    with pytest.raises(ValueError, match=r"set a budget"):
        Trainer(config, tmp_path)


def test_cooldown_needs_a_fixed_budget(tmp_path):
    config = fast_config("optim.max_steps=0", "optim.patience=3", "optim.cooldown=0.2")
    with pytest.raises(ValueError, match=r"optim.cooldown=0.2 needs a fixed budget"):
        Trainer(config, tmp_path)


def test_threads_beyond_the_cpus_are_refused_before_the_run_folder(tmp_path):
    """The bound of the commands' --threads: 1 to the CPUs this process may use (0 = auto)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    config = fast_config("optim.max_steps=1", f"optim.threads={cpus + 1}")
    with pytest.raises(ValueError, match=rf"^optim.threads={cpus + 1}: expected 0 .* to {cpus},"):
        Trainer(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    for threads in (0, cpus):
        Trainer(fast_config("optim.max_steps=1", f"optim.threads={threads}"), tmp_path / "run")


SRC_TGT = ["data.train_src={d}/src.de", "data.train_tgt={d}/tgt.en"]
UNREADABLE_DATA_FILES = [  # (config maker, overrides with {d} = a folder, the key at fault)
    (fast_config, ["data.train_src={d}/no.de", "data.train_tgt={d}/tgt.en"], "data.train_src"),
    (fast_config, ["data.train_src={d}/src.de", "data.train_tgt={d}"], "data.train_tgt"),
    (fast_config, [*SRC_TGT, "data.val_src={d}/no.de", "data.val_tgt={d}/tgt.en"], "data.val_src"),
    (tiny_lm_config, ["data.train_file={d}/no.txt"], "data.train_file"),
    (tiny_lm_config, ["data.train_file={d}/src.de", "data.val_file={d}"], "data.val_file"),
]


@pytest.mark.parametrize(
    "make,items,key", UNREADABLE_DATA_FILES, ids=[key for *_, key in UNREADABLE_DATA_FILES]
)
def test_data_files_are_checked_before_the_run_folder(tmp_path, make, items, key):
    (tmp_path / "src.de").write_text("a b\n")
    (tmp_path / "tgt.en").write_text("a b\n")
    config = make("data.corpus=", "optim.max_steps=1", *(i.format(d=tmp_path) for i in items))
    with pytest.raises(ValueError, match=rf"^{key}: (cannot read|.* is a directory)"):
        train(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_cooldown_decays_the_logged_lr_to_zero_over_the_step_budget(tmp_path):
    """With max_steps 40 and cooldown 0.25 the lr of step k is the paper's lr times
    min(1, (1 - (k - 1) / 40) / 0.25): flat to step 31, then down to 1/10 of it at step 40."""
    train(
        fast_config("optim.max_steps=40", "optim.cooldown=0.25", "optim.warmup_steps=10"),
        tmp_path,
        progress=False,
    )
    lrs = {r["step"]: r["lr"] for r in read_metrics(tmp_path / "metrics.jsonl") if "lr" in r}
    assert sorted(lrs) == list(range(1, 41))
    d_model, scale = 32, fast_config().optim.lr_scale  # FAST's d_model, tiny_copy's scale
    for step, lr in lrs.items():
        paper = scale * d_model**-0.5 * min(step**-0.5, step * 10**-1.5)
        ramp = min(1.0, (1.0 - (step - 1) / 40) / 0.25)
        assert lr == pytest.approx(paper * ramp, rel=1e-9), step
    assert lrs[31] == pytest.approx(scale * d_model**-0.5 * 31**-0.5, rel=1e-9)
    assert lrs[40] == pytest.approx(lrs[31] * (31 / 40) ** 0.5 * 0.1, rel=1e-9)


def test_stop_resume_continues_exactly_with_accumulation_and_epochs(tmp_path):
    """Stopping at step 7 and resuming to 16 gives the weights of 16 steps in one go, with
    dropout, gradient accumulation over epoch boundaries and evaluations in between."""
    extra = ["optim.accumulation=2", "optim.eval_every=5", "data.copy_train_pairs=60"]
    full = train(fast_config("optim.max_steps=16", *extra), tmp_path / "full", progress=False)
    train(fast_config("optim.max_steps=7", *extra), tmp_path / "part", progress=False)
    resumed = train(
        fast_config("optim.max_steps=16", *extra), tmp_path / "part", resume=True, progress=False
    )
    assert full.step == resumed.step == 16 and full.epoch == resumed.epoch > 2
    a, b = weights(tmp_path / "full"), weights(tmp_path / "part")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)

    def losses(run):
        return [r["train_loss"] for r in read_metrics(run / "metrics.jsonl") if "train_loss" in r]

    assert losses(tmp_path / "full") == losses(tmp_path / "part")


def test_a_resume_between_records_logs_the_loss_of_a_run_never_stopped(tmp_path):
    """Records every 4 steps, stopped at step 6: the record of step 8 averages steps 5 to 8
    as in the run never stopped (before: steps 7 and 8 only, from a fresh meter)."""
    extra = ["optim.log_every=4", "optim.eval_every=3"]
    train(fast_config("optim.max_steps=12", *extra), tmp_path / "full", progress=False)
    train(fast_config("optim.max_steps=6", *extra), tmp_path / "part", progress=False)
    train(fast_config("optim.max_steps=12", *extra), tmp_path / "part", resume=True, progress=False)

    def losses(run):
        records = read_metrics(run / "metrics.jsonl")
        return [(r["step"], r["train_loss"]) for r in records if "train_loss" in r]

    assert [step for step, _ in losses(tmp_path / "full")] == [4, 8, 12]
    assert losses(tmp_path / "full") == losses(tmp_path / "part")
    # Carried once: a second fit of the resumed trainer does not carry the old sums again.
    trainer = Trainer(fast_config("optim.max_steps=6", *extra), tmp_path / "again", progress=False)
    trainer.fit()
    resumed = Trainer(
        fast_config("optim.max_steps=12", *extra), tmp_path / "again", resume=True, progress=False
    )
    resumed.fit()
    resumed.fit()  # nothing left to train: saves `last` again
    pending = json.loads((tmp_path / "again" / "last" / "state.json").read_text())
    assert pending["train_loss_pending"] == {"loss_sum": 0.0, "tokens": 0}


def test_run_folder_contents_and_best_checkpoint(tmp_path):
    config = fast_config("optim.max_steps=6", "optim.eval_every=2", "optim.val_bleu=false")
    result = train(config, tmp_path, progress=False)
    assert result.stop_reason == "max_steps" and result.step == 6
    records = read_metrics(tmp_path / "metrics.jsonl")
    train_keys = {"step", "epoch", "train_loss", "lr", "tokens_per_sec", "elapsed_sec"}
    assert set(records[0]) == train_keys
    assert [r["step"] for r in records if "train_loss" in r] == [1, 2, 3, 4, 5, 6]
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [2, 4, 6]
    assert {"val_loss", "val_ppl", "step", "epoch", "elapsed_sec"} == set(evals[0])
    assert (tmp_path / "train.log").read_text().count("val_loss") >= len(evals)
    assert json.loads((tmp_path / "last" / "state.json").read_text())["step"] == 6
    best = json.loads((tmp_path / "best" / "state.json").read_text())
    assert best["run"]["best_value"] == min(r["val_loss"] for r in evals)
    assert (tmp_path / "config.toml").is_file() and (tmp_path / "tokenizer.json").is_file()
    with pytest.raises(ValueError, match=r"already holds a run"):
        train(config, tmp_path, progress=False)


def test_early_stopping(tmp_path):
    config = fast_config("optim.max_steps=100", "optim.eval_every=2", "optim.patience=2")
    result = train(config, tmp_path, eval_hook=lambda model: {"val_bleu": 5.0}, progress=False)
    assert result.stop_reason == "early_stopping" and result.step == 6


def test_eval_hook_metrics_are_logged_and_select_best(tmp_path):
    calls = []

    def hook(model):
        calls.append(model.training)
        return {"val_bleu": float(len(calls) % 2)}  # 1, 0, 1, ...

    config = fast_config("optim.max_steps=6", "optim.eval_every=2")
    result = train(config, tmp_path, eval_hook=hook, progress=False)
    assert calls == [False, False, False]
    assert result.best_metric == "val_bleu" and result.best_value == 1.0
    evals = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "val_bleu" in r]
    assert [r["val_bleu"] for r in evals] == [1.0, 0.0, 1.0]
    assert json.loads((tmp_path / "best" / "state.json").read_text())["step"] == 2


def test_val_bleu_from_attnkit_decoding(tmp_path):
    result = train(fast_config("optim.max_steps=4", "optim.eval_every=2"), tmp_path, progress=False)
    evals = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "val_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(0.0 <= r["val_bleu"] <= 100.0 for r in evals)
    assert result.best_metric == "val_bleu"


def test_every_evaluation_decodes_with_the_current_weights(tmp_path):
    """Decoding prepacks linear weights, recognised by storage and version counter; the fused
    Adam step does not bump that counter, so without a release after each evaluation the next
    one decoded with stale weights (val BLEU stuck at an earlier step's score)."""
    import torch.nn.functional as F
    from torch import nn

    from attnkit.generation.packed import packed_linears, packed_weight

    gaps = []

    def hook(model):
        linear = next(m for m in model.modules() if type(m) is nn.Linear)
        assert packed_weight(linear) is not None  # the packed path is what is tested
        x = torch.randn(3, linear.in_features)
        with torch.inference_mode(), packed_linears(model):
            got = linear(x)
        with torch.no_grad():
            gaps.append(float((got - F.linear(x, linear.weight, linear.bias)).abs().max()))
        return {"val_bleu": 0.0}

    train(
        fast_config("optim.max_steps=6", "optim.eval_every=2"),
        tmp_path,
        eval_hook=hook,
        progress=False,
    )
    assert len(gaps) == 3 and max(gaps) < 1e-5, gaps


def test_val_bleu_under_bf16_autocast(tmp_path):
    """The default recipe's combination on a bf16 CPU (autocast and greedy val BLEU): the
    evaluation decodes (it raised a dtype error before the translator left autocast)."""
    config = fast_config("optim.max_steps=2", "optim.eval_every=2", "optim.autocast=bf16")
    train(config, tmp_path, progress=False)
    evals = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "val_loss" in r]
    assert [r["step"] for r in evals] == [2] and 0.0 <= evals[0]["val_bleu"] <= 100.0


def test_long_pairs_are_skipped_and_counted(tmp_path, caplog):
    config = fast_config("optim.max_steps=1", "data.max_len=6")
    with caplog.at_level("INFO"):
        train(config, tmp_path, progress=False)
    assert "skipped as longer than max_len=6" in caplog.text
    line = next(m for m in caplog.messages if m.startswith("train:"))
    assert int(line.split(" pairs kept, ")[1].split()[0]) > 0


def test_the_progress_bar_is_for_terminals_only(tmp_path, capfd):
    """A run whose standard error went to a file got the bar's redraws between its log lines
    (translate and evaluate already showed theirs on a terminal only)."""
    train(fast_config("optim.max_steps=3"), tmp_path / "run", progress=True)
    err = capfd.readouterr().err
    assert "\r" not in err and "step/s" not in err and "s/step" not in err


def test_an_interrupt_is_logged_with_the_step_a_resume_continues_from(tmp_path, monkeypatch):
    """Ctrl-C left train.log ending at the last evaluation, saying nothing of what was kept."""
    calls = []
    original = Trainer._train_step

    def step_then_interrupt(self, batches):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return original(self, batches)

    monkeypatch.setattr(Trainer, "_train_step", step_then_interrupt)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(fast_config("optim.max_steps=20", "optim.save_every=2"), run, progress=False)
    log = (run / "train.log").read_text(encoding="utf-8").splitlines()
    assert log[-1].endswith(
        f"interrupted; the last checkpoint is step 4: continue with attnkit train --resume {run}"
    )


def test_a_run_without_validation_data_says_so_at_the_end(tmp_path):
    """Training files without val_* ended with "...; best - - at step 0"."""
    words = ["ein", "hund", "katze", "läuft", "schnell", "rot", "blau", "haus"]
    lines = [" ".join(words[(i + j) % 8] for j in range(2 + i % 4)) for i in range(60)]
    for name in ("src.de", "tgt.en"):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = fast_config(
        "data.corpus=", "optim.max_steps=2", *(i.format(d=tmp_path) for i in SRC_TGT)
    )
    result = train(config, tmp_path / "run", progress=False)
    assert result.step == 2 and result.best_value is None
    last_line = (tmp_path / "run" / "train.log").read_text().splitlines()[-1]
    assert re.search(
        r"stopped at step 2 \(epoch [\d.]+\) by max_steps after [\d.]+ min; no validation "
        r"data, so no evaluation and no `best` checkpoint \(only `last`\)$",
        last_line,
    ), last_line
    assert "best -" not in last_line and "at step 0" not in last_line
    assert not (tmp_path / "run" / "best").exists() and (tmp_path / "run" / "last").is_dir()


def poison_step(monkeypatch, step: int, *, before: bool) -> None:
    """Puts a NaN into every weight tensor of the model at ``step``: before its forward (its
    loss is NaN) or after its update (its loss was finite, the weights are not)."""
    original = Trainer._train_step

    def poisoned(self, batches):
        if before and self.state.step == step - 1:
            poison(self.model)
        took = original(self, batches)
        if not before and self.state.step == step:
            poison(self.model)
        return took

    monkeypatch.setattr(Trainer, "_train_step", poisoned)


def poison(model) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.view(-1)[0] = float("nan")


def finite(run, name="last") -> bool:
    return all(bool(torch.isfinite(t).all()) for t in weights(run, name).values())


@pytest.mark.parametrize("make", [fast_config, tiny_lm_config], ids=["translation", "lm"])
@pytest.mark.parametrize(
    "before,message,kept",
    [
        (True, r"the training loss is NaN or infinite at step 5", 4),
        (False, r"the weights hold NaN or inf after step 4: '[\w.]+' \(1 NaN, 0 inf of", 2),
    ],
    ids=["loss", "weights"],
)
def test_a_run_that_diverges_stops_naming_the_step_and_never_saves_it(
    tmp_path, monkeypatch, make, before, message, kept
):
    """A NaN loss at step 5, found at the training-loss record of step 6 (no sync per step:
    the step is kept on the device), or NaN weights after step 4's update (its loss was
    finite), found before the save of step 4: the run stops with the step and what to do, on
    both tasks, and `last` stays the good checkpoint before. The trainer checked nothing: the
    run trained on to its budget, logged null losses and saved NaN weights as `last`."""
    poison_step(monkeypatch, 5 if before else 4, before=before)
    run = tmp_path / "run"
    items = ["optim.max_steps=12", "optim.save_every=2", "optim.log_every=3", "optim.eval_every=50"]
    with pytest.raises(DivergedError, match=rf"^training diverged: {message}") as caught:
        train(make(*items), run, progress=False)
    assert (
        f"`last` (step {kept}) is the last good checkpoint; continue from it with a lower "
        f"learning rate: attnkit train --resume {run} --set optim."
    ) in str(caught.value)
    assert json.loads((run / "last" / "state.json").read_text())["step"] == kept
    assert finite(run)
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records if "train_loss" in r] == [3]
    assert all(r["train_loss"] is not None for r in records if "train_loss" in r)


def test_a_non_finite_validation_stops_the_run_before_best_is_saved(tmp_path, monkeypatch):
    """The validation metrics are checked before they are recorded: `best` stays the one of
    the evaluation before, and so does `last`."""
    from attnkit.training.translation import TranslationTask

    calls = []
    original = TranslationTask.evaluate

    def evaluate(self, run, model, loss_module):
        calls.append(1)
        metrics = original(self, run, model, loss_module)
        return {k: float("nan") for k in metrics} if len(calls) == 2 else metrics

    monkeypatch.setattr(TranslationTask, "evaluate", evaluate)
    run = tmp_path / "run"
    config = fast_config("optim.max_steps=6", "optim.eval_every=2", "optim.val_bleu=false")
    with pytest.raises(
        DivergedError,
        match=r"^training diverged: the validation gives val_loss nan "
        r"at step 4, so the run stopped unsaved; `last` \(step 2\) is the last good checkpoint",
    ):
        train(config, run, progress=False)
    for name in ("last", "best"):
        assert json.loads((run / name / "state.json").read_text())["step"] == 2


def test_a_metric_of_its_own_that_is_nan_does_not_stop_the_run(tmp_path, monkeypatch):
    """Only the validation loss and the metric choosing `best` stop a run: an evaluation's
    other metrics (an EvalHook may say "not computed" with NaN) are recorded as they are."""
    from attnkit.training.translation import TranslationTask

    original = TranslationTask.evaluate

    def evaluate(self, run, model, loss_module):
        return {**original(self, run, model, loss_module), "val_note": float("nan")}

    monkeypatch.setattr(TranslationTask, "evaluate", evaluate)
    config = fast_config("optim.max_steps=4", "optim.eval_every=2", "optim.val_bleu=false")
    result = train(config, tmp_path / "run", progress=False)
    assert result.step == 4 and math.isnan(result.metrics["val_note"])


def overflow_losses(monkeypatch, steps: range) -> None:
    """The loss of the steps in ``steps`` is infinite (a float16 forward that overflows): its
    gradients are not finite, and the grad scaler skips the step; the weights stay finite."""
    from attnkit.training.sequence_loss import SequenceLoss

    original, state = SequenceLoss.forward, {"step": 0}
    original_step = Trainer._train_step

    def forward(self, *args, **kwargs):
        loss = original(self, *args, **kwargs)
        return loss * float("inf") if state["step"] in steps else loss

    def train_step(self, batches):
        state["step"] = self.state.step + 1
        return original_step(self, batches)

    monkeypatch.setattr(SequenceLoss, "forward", forward)
    monkeypatch.setattr(Trainer, "_train_step", train_step)


def test_under_the_float16_grad_scaler_one_overflow_is_skipped_and_a_lasting_one_stops(
    tmp_path, monkeypatch
):
    """The scaler's business is an overflow now and then: that step is skipped, the run goes
    on. A loss that stays infinite drives the scale below 1 (17 halvings from 65,536) with
    finite weights, and then it is divergence, named by its first step."""
    config = fast_config("optim.max_steps=30", "optim.log_every=1", "optim.autocast=fp16")
    overflow_losses(monkeypatch, range(3, 4))
    assert train(config, tmp_path / "once", progress=False).step == 30
    overflow_losses(monkeypatch, range(3, 31))
    with pytest.raises(DivergedError, match=r"the training loss is NaN or infinite at step 3,"):
        train(config, tmp_path / "lasting", progress=False)
    logged = [r["step"] for r in read_metrics(tmp_path / "lasting" / "metrics.jsonl")]
    # Steps 3-19 are 17 overflows: the check at step 19's record finds the scale at 0.5 and
    # stops before writing it; the 16 records before it are skipped steps the run went on from.
    assert max(logged) == 18


def test_no_checkpoint_yet_says_to_start_again(tmp_path, monkeypatch):
    """Without a `last` to go back to, the error says to start again, with the lower rate and
    the clipping a run without clipping lacks."""
    poison_step(monkeypatch, 1, before=True)
    config = fast_config("optim.max_steps=4", "optim.log_every=1", "optim.clip_norm=0")
    with pytest.raises(DivergedError) as caught:
        train(config, tmp_path / "run", progress=False)
    assert str(caught.value).endswith(
        "at step 1, so the run stopped unsaved; no checkpoint was saved yet: start the run "
        "again with a lower learning rate and gradient clipping (--set optim.lr_scale=0.4 "
        "--set optim.clip_norm=1.0)"
    )
    assert not (tmp_path / "run" / "last").exists()


def test_a_huge_perplexity_is_logged_in_scientific_notation(tmp_path, monkeypatch, caplog):
    """val_ppl of a diverged run, exp(700), was logged as 305 digits with 4 decimals; the
    metrics file keeps the number."""
    from attnkit.training.translation import TranslationTask

    monkeypatch.setattr(
        TranslationTask, "evaluate", lambda *_: {"val_loss": 1000.0, "val_ppl": math.exp(700)}
    )
    config = fast_config("optim.max_steps=2", "optim.eval_every=2", "optim.val_bleu=false")
    with caplog.at_level("INFO"):
        train(config, tmp_path / "run", progress=False)
    line = next(m for m in caplog.messages if m.startswith("step 2:"))
    assert line == "step 2: val_loss 1000.0000, val_ppl 1.014e+304 (new best)"
    assert "best val_loss 1000.0000 at step 2" in caplog.messages[-1]
    evals = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "val_ppl" in r]
    assert evals[0]["val_ppl"] == math.exp(700)
