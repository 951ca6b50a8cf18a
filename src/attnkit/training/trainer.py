"""The training loop shared by every task: accumulation, DDP, evaluation, checkpoints, resume.

A :class:`~attnkit.training.task.Task` supplies the data, the loss and the evaluation
(translation: :class:`~attnkit.training.translation.TranslationTask`; language modelling:
:class:`~attnkit.training.lm.LMTask`; ``config.task`` picks one); the trainer does the
rest. One optimizer step consumes ``accumulation`` micro-batches on every rank. The loss of a
step is the task's loss summed over all scored tokens of all those batches on all ranks,
divided by their number (one all-reduce of the token count per step), so a run on N processes
takes exactly the steps of a 1-process run that accumulates the same N batches.

Everything that decides what happens next is saved in the ``last`` checkpoint: weights,
optimizer, schedule, grad scaler, every rank's RNG states (:mod:`.run_state`) and the data
position. ``resume=True`` restores all of it, so an interrupted run continues with the very
batches, dropout masks and learning rates it would have used. When the run stops and what
share of its budget is spent is :mod:`.budget`'s; which folders it may write is
:mod:`.run_folder`'s (one writer at a time). Before its first step a run checks that it may
replace every checkpoint folder it will write later (files a user put into ``best`` or
``last`` are never replaced, so a run that found out only when saving would lose its steps);
a folder that becomes unreplaceable during the run is refused on every rank, ``last`` being
saved first when it is ``best``.

A run whose loss or weights become NaN or infinite stops with :class:`DivergedError`, naming
the step, and never saves them: the losses are summed on the device (the step tracks the
first non-finite one there, no sync per step) and checked where the trainer reads them back
anyway (the logged training loss), before every evaluation and before every save (with one
``isfinite`` pass over the weights), and the validation metrics before they are recorded. Each
check is a collective or reads all-reduced numbers, so every rank stops at the same step.
A resume from weights holding NaN or inf is refused before any step
(:func:`~attnkit.training.checkpoint.load_weights`).

Length: about 750 lines, over the house's ~400, because setup, the step, evaluation
bookkeeping and checkpoint save/restore all read and write the same handful of objects
(model, optimizer, schedule, scaler, run state); the parts that stand alone are their own
modules (task, translation, lm, budget, run_state, run_folder, optim, metrics_log).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from attnkit import allocator
from attnkit import model_folder as mf
from attnkit.files import write_text
from attnkit.training import checkpoint as ckpt
from attnkit.training.averaging import STEPS_DIR, step_checkpoints
from attnkit.training.budget import Budget, Clock, RunClock
from attnkit.training.config import (
    TrainConfig,
    check_resume,
    read_toml,
    run_conflicts,
    with_saved_defaults,
)
from attnkit.training.cosine_schedule import build_lr_scheduler, needs_progress
from attnkit.training.distributed import (
    DistInfo,
    all_reduce_min,
    all_reduce_sum,
    broadcast_object,
    init_distributed,
    raise_together,
)
from attnkit.training.metrics_log import MetricsLog, TrainMeter, add_file_handler, format_metric
from attnkit.training.optim import build_optimizer, check_threads, default_threads
from attnkit.training.precision import resolve_autocast
from attnkit.training.run_folder import (
    LOG_FILE,
    METRICS_FILE,
    RUN_CONFIG_FILE,
    RunFolder,
    RunFolderError,
)
from attnkit.training.run_state import (
    RunState,
    load_resume_states,
    record_eval,
    resume_states,
)
from attnkit.training.schedule import set_progress
from attnkit.training.task import DataPosition, EvalHook, RunContext, Task
from attnkit.training.translation import TranslationTask

logger = logging.getLogger(__name__)

# state.json key: the training loss summed since the last record (TrainMeter.pending).
PENDING_LOSS_KEY = "train_loss_pending"


def _same_tokenizer(a: Path, b: Path) -> bool:
    """Whether two ``tokenizer.json`` files hold the same tokenizer, as the tokenizers library
    reads and writes it (not byte for byte: another version may write a file differently).
    True when either is missing or unreadable: the task's loading names that."""
    from tokenizers import Tokenizer

    try:
        return (
            Tokenizer.from_file(os.fspath(a)).to_str() == Tokenizer.from_file(os.fspath(b)).to_str()
        )
    except Exception:  # tokenizers raises a bare Exception for a missing or damaged file
        return True


class DivergedError(ValueError):
    """Training stopped because its loss, its weights or its validation metrics became NaN or
    infinite; raised on every rank, before anything non-finite was saved. (A ValueError: the
    command line shows it as one line, as other run errors.)"""


@dataclass(frozen=True)
class TrainResult:
    """What :meth:`Trainer.fit` returns."""

    step: int
    epoch: float
    stop_reason: str
    best_metric: str
    best_value: float | None
    metrics: dict[str, float]
    out_dir: Path


class Trainer:
    """Trains a task's model as a config describes; see the module docstring.

    Everything is built on first use (:meth:`fit`, :meth:`evaluate` or :meth:`setup`), which
    also takes the run folder's writer lock; :meth:`fit` releases it when it returns, and
    :meth:`close` (or ``with Trainer(...) as trainer:``) after :meth:`evaluate` alone.

    Args:
        config: The training config.
        out_dir: Run folder (``metrics.jsonl``, ``train.log``, ``last/``, ``best/``).
        resume: Continue the run in ``out_dir`` from its ``last`` checkpoint.
        eval_hook: Extra evaluation on rank 0 (e.g. BLEU) for the default translation task.
        progress: Show a tqdm progress bar on rank 0 (stderr), when stderr is a terminal.
        task: The task; default the one ``config.task`` names (:func:`default_task`).
        clock: The time source for ``max_minutes`` and throughput (tests inject one).
    """

    def __init__(
        self,
        config: TrainConfig,
        out_dir: str | os.PathLike[str],
        *,
        resume: bool = False,
        eval_hook: EvalHook | None = None,
        progress: bool = True,
        task: Task | None = None,
        clock: Clock = time.perf_counter,
    ) -> None:
        o = config.optim
        if not (o.max_steps or o.max_epochs or o.max_minutes or o.patience):
            raise ValueError(
                "optim: set a budget (max_steps, max_epochs, max_minutes or patience); "
                "all are 0, so training would never stop"
            )
        if o.cooldown and not (o.max_steps or o.max_epochs or o.max_minutes):
            raise ValueError(
                f"optim.cooldown={o.cooldown} needs a fixed budget to cool down towards "
                "(max_steps, max_epochs or max_minutes); patience alone has no known end"
            )
        if o.schedule == "cosine" and not (o.max_steps or o.max_epochs or o.max_minutes):
            raise ValueError(
                'optim.schedule="cosine" needs a fixed budget to decay over (max_steps, '
                "max_epochs or max_minutes); patience alone has no known end"
            )
        check_threads(o.threads)
        config.check_new_run(resumed=resume)  # before the run folder is made
        if task is not None and eval_hook is not None:
            raise ValueError("eval_hook: give it to the task, not with task=")
        self.config = config
        self.out_dir = Path(out_dir)
        self.resume = resume
        self.progress = progress
        self.task = task if task is not None else default_task(config, eval_hook)
        self.clock = clock
        self.folder = RunFolder(self.out_dir)
        self.state = RunState()
        # Built by setup(); None until then.
        self.run: RunContext | None = None
        self.metrics: MetricsLog | None = None
        self.budget: Budget | None = None
        self.model: nn.Module | None = None
        self.loss_module: nn.Module | None = None  # the task's model + loss
        self.train_module: nn.Module | None = None  # loss_module, compiled and/or in DDP
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        self.scaler: torch.amp.GradScaler | None = None
        self._log_handler: logging.Handler | None = None
        self._closed = False  # close() released the lock (on every rank)
        # Made by fit() for its session.
        self._timer: RunClock | None = None
        self._meter: TrainMeter | None = None
        self._pending: object = None  # a resumed checkpoint's loss since its last record
        self._checked_step: int | None = None  # the step _check_finite last passed
        self._saved_step: int | None = None  # the step of the `last` written or resumed

    # ----------------------------------------------------------------- setup

    def setup(self) -> None:
        """Process group, run folder (locked), data, model, optimizer; restores a resume.

        Idempotent; after :meth:`close` it takes the lock again. Every check that can fail
        on one rank fails on all of them. The task checks its data files
        (:meth:`~attnkit.training.task.Task.check_data`) before the run folder is touched, and
        a new run that fails later in the setup takes back the folder and files it made
        (:meth:`~attnkit.training.run_folder.RunFolder.discard_new`).

        Raises:
            ValueError: If the run folder may not be used (see :mod:`.run_folder`), one of the
                checkpoint folders the run will replace holds files attnkit did not write
                (:meth:`~attnkit.training.run_folder.RunFolder.check_checkpoints`), a data
                file cannot be read, or a resume would change what the saved weights and
                tokenizer were made with.
        """
        if self.run is not None:
            # Not folder.locked: only rank 0 holds the lock, and a collective that rank 0
            # skipped would leave the other ranks waiting in it.
            if self._closed:
                with raise_together(self.run.info):
                    if self.run.info.is_main:
                        self.folder.lock()
                        self._log_handler = add_file_handler(self.out_dir / LOG_FILE)
                self._closed = False
            return
        o = self.config.optim
        info = init_distributed(o.device)
        threads = o.threads or default_threads(info)
        torch.set_num_threads(threads)
        resume_from = None
        with raise_together(info):
            self.task.check_data(self.config)
        try:
            with raise_together(info):
                if info.is_main:
                    if self.resume:
                        resume_from = self.folder.open_for_resume()
                    else:
                        self.folder.open_new()
                    # Before any step: a folder the run could not replace later would cost
                    # every step trained until then.
                    self.folder.check_checkpoints(
                        self._replaced_checkpoints(), what="--resume" if self.resume else "--out"
                    )
            resume_from = broadcast_object(resume_from, info)
            if resume_from is not None:
                with raise_together(info):
                    try:
                        saved = ckpt.read_train_config(resume_from)
                    except ValueError as err:  # a corrupt or foreign config.json in `last`
                        raise self.folder.cannot_resume(err) from None
                    if info.is_main:
                        self._check_last_is_the_runs(saved, resume_from)
                    check_resume(saved, self.config, resume_from / mf.CONFIG_FILE)
            self._setup(info, threads, resume_from)
            self._closed = False
        except BaseException:
            self._stop_log()
            if not self.resume:
                self.folder.discard_new()  # a run that never began leaves nothing behind
            self.close()
            raise

    def _check_last_is_the_runs(self, saved: TrainConfig, last: Path) -> None:
        """Refuses a ``last`` checkpoint that another run wrote (copied in, or another model's
        put in its place): its config against the run's ``config.toml`` on what a resume may
        not change, and its tokenizer against the run's. Resuming from it would rewrite the
        run's config and replace its ``best`` and kept checkpoints with another model's."""
        run_file = self.out_dir / RUN_CONFIG_FILE
        try:  # keys added since the run began at the values it used, as its checkpoints'
            run = TrainConfig.from_dict(
                with_saved_defaults(read_toml(run_file)), allow_tokenizer_keys=True
            )
        except (OSError, ValueError) as err:  # rewritten by the resume: not a reason to stop
            logger.warning("could not check `last` against %s: %s", run_file, err)
            return
        why = []
        conflicts = run_conflicts(run, saved)
        if conflicts:
            why.append(
                f"{'; '.join(conflicts)} in {os.fspath(last / mf.CONFIG_FILE)} against the "
                f"run's {os.fspath(run_file)}"
            )
        mine, its = self.out_dir / mf.TOKENIZER_FILE, last / mf.TOKENIZER_FILE
        if not conflicts and not _same_tokenizer(mine, its):
            why.append(f"its {os.fspath(its)} is not the run's {os.fspath(mine)}")
        if why:
            raise RunFolderError(
                f"--resume {os.fspath(self.out_dir)!r}: its `last` checkpoint {os.fspath(last)!r} "
                f"is not this run's: {'; '.join(why)}; nothing was trained. Put the run's own "
                "`last` back, or train that checkpoint's model in a new folder"
            )

    def _setup(self, info: DistInfo, threads: int, resume_from: Path | None) -> None:
        o = self.config.optim
        if info.is_main:
            self._log_handler = add_file_handler(self.out_dir / LOG_FILE)
        logger.info(
            "%s run in %s: %d process(es), device %s, %d thread(s) each, torch %s, "
            "memory allocator %s",
            "resuming" if resume_from is not None else "starting",
            self.out_dir,
            info.world_size,
            info.device,
            threads,
            torch.__version__,
            allocator.active(),
        )
        self.metrics = MetricsLog(self.out_dir / METRICS_FILE, enabled=info.is_main)
        run = RunContext(
            config=self.config,
            info=info,
            out_dir=self.out_dir,
            resume_from=resume_from,
            autocast_dtype=resolve_autocast(o.autocast, info.device),
        )
        self.config = cfg = self.task.prepare(run)
        run = replace(run, config=cfg)
        self.budget = Budget(o, self.task.batches_per_epoch)

        torch.manual_seed(o.seed)  # the same initial weights on every rank
        self.model = self.task.build_model(cfg).to(info.device)
        self.optimizer = build_optimizer(self.model, o)
        self.scheduler = build_lr_scheduler(self.optimizer, o, cfg.model.d_model)
        self.scaler = torch.amp.GradScaler(
            info.device.type, enabled=run.autocast_dtype == torch.float16
        )
        torch.manual_seed(o.seed + 1 + info.rank)  # each rank its own dropout stream
        if resume_from is not None:
            self._restore(resume_from, info)
        else:
            self.metrics.truncate_after(-1)  # a run that stopped before its first checkpoint
        if info.is_main:
            write_text(self.out_dir / RUN_CONFIG_FILE, cfg.to_toml())
        self.loss_module = self.task.loss_module(self.model)
        self.train_module = self.loss_module
        if o.compile:
            logger.info("torch.compile: on (dynamic shapes); the first steps compile")
            self.train_module = torch.compile(self.loss_module, dynamic=True)
        if info.distributed:
            self.train_module = DistributedDataParallel(
                self.train_module,
                device_ids=[info.device] if info.device.type == "cuda" else None,
                **_no_buffer_sync(),
            )
        self.run = run

    def close(self) -> None:
        """Stops copying the log into ``train.log`` and releases the run folder's lock."""
        self._stop_log()
        self.folder.unlock()
        self._closed = True

    def _stop_log(self) -> None:
        if self._log_handler is not None:
            logging.getLogger("attnkit").removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- checkpoints

    @property
    def position(self) -> DataPosition:
        """This rank's position in the training data after the last step."""
        s = self.state
        return DataPosition(s.epoch, s.batch_in_epoch, self.task.batches_per_epoch)

    def _restore(self, folder: Path, info: DistInfo) -> None:
        try:
            saved = ckpt.read_state(folder)
            ckpt.load_weights(self.model, folder)
            resume = ckpt.load_resume_state(folder)
        except ValueError as err:  # a corrupt or truncated file in `last`: say what is left
            raise self.folder.cannot_resume(err) from None
        scheduled = resume.get("scheduler", {}).get("last_epoch")  # one per optimizer step
        if isinstance(scheduled, int) and scheduled != saved["step"]:
            raise self.folder.cannot_resume(
                f"{os.fspath(folder / mf.RESUME_FILE)} holds the schedule of step {scheduled}, "
                f"its {mf.STATE_FILE} step {saved['step']}: the two files are of different "
                "checkpoints"
            )
        state = RunState.from_saved(saved["run"])
        # where the budget stands, for a schedule whose settings the resume changed
        progress = self.budget.progress(state.step, state.elapsed_sec)
        load_resume_states(
            resume, self.optimizer, self.scheduler, self.scaler, info, progress=progress
        )
        self.task.check_resumed(saved)
        self._pending = saved.get(PENDING_LOSS_KEY)
        self.state = state
        self._saved_step = self.state.step
        self.metrics.truncate_after(self.state.step)
        logger.info(
            "resumed from %s at step %d (epoch %d, batch %d)",
            folder,
            self.state.step,
            self.state.epoch,
            self.state.batch_in_epoch,
        )

    def _replaced_checkpoints(self) -> list[str]:
        """The checkpoint folders of the run folder that this run will replace or delete:
        ``last``, ``best``, and with ``optim.keep_checkpoints`` the kept ``steps/`` ones."""
        names = list(mf.RUN_MODELS)
        if self.config.optim.keep_checkpoints:
            names += [
                p.relative_to(self.out_dir).as_posix() for p in step_checkpoints(self.out_dir)
            ]
        return names

    def _save(self, name: str) -> None:
        """Writes ``last`` (with resume state) or ``best``; collective for both. A folder that
        may not be replaced (a user put files into it since the run began) is refused on
        every rank before anything is written, naming the files and what to do."""
        assert self.run is not None
        info, resume = self.run.info, None
        if name in mf.RUN_MODELS:
            self._check_finite()  # never NaN weights over a good checkpoint
            refusal = self.folder.refusal([self.out_dir / name]) if info.is_main else None
            refusal = broadcast_object(refusal, info)
            if refusal:
                raise RunFolderError(refusal)
        pending = None
        if name == "last":
            resume = resume_states(self.optimizer, self.scheduler, self.scaler, info)
            if self._meter is not None:  # the steps since the last record: their loss
                pending = self._meter.pending(info, self.run.reduce_device)
        if info.is_main:
            position = self.position
            ckpt.save_checkpoint(
                self.out_dir / name,
                model=self.model,
                config=self.config,
                tokenizer=self.task.tokenizer,
                state={
                    "step": self.state.step,
                    "epoch": round(position.epoch_float, 4),
                    "run": asdict(self.state),
                    **({} if pending is None else {PENDING_LOSS_KEY: pending}),
                    **self.task.checkpoint_state(position),
                },
                resume=resume,
            )
            logger.debug("saved %s at step %d", name, self.state.step)
        if name == "last":
            self._saved_step = self.state.step

    def _keep_step_checkpoint(self) -> None:
        """With ``optim.keep_checkpoints`` N, saves the weights (no resume state) beside each
        ``last`` as ``steps/step_NNNNNNN`` and deletes all but the newest N (for averaging)."""
        keep = self.config.optim.keep_checkpoints
        if not keep or not self.run.info.is_main:
            return
        (self.out_dir / STEPS_DIR).mkdir(exist_ok=True)
        self._save(f"{STEPS_DIR}/step_{self.state.step:07d}")
        for old in step_checkpoints(self.out_dir)[:-keep]:
            refusal = mf.replace_refusal(old)
            if refusal is None:
                shutil.rmtree(old)
            else:  # put there since the run began (checked at its start): never deleted
                logger.warning("kept %s, not deleting it: %s", old, refusal)

    # ----------------------------------------------------------------- steps

    def _train_step(self, batches) -> bool:
        """One optimizer step; False (and no step) when some rank is out of time.

        The time check comes before the step, with the previous step's duration as the
        estimate of this one; the batches drawn for a step that is not taken are not
        committed to the data position, so a resume reads them again.
        """
        o, info = self.config.optim, self.run.info
        group = [next(batches) for _ in range(o.accumulation)]
        local_tokens = sum(self.task.batch_tokens(batch) for batch, _ in group)
        start = self._timer.elapsed()
        time_up = self.budget.out_of_time(start, self._timer.last_step_sec)
        # One collective per step: the global token count (the loss denominator), whether
        # any rank is out of time (so that all ranks stop at the same step) and the mean
        # elapsed time (so that a time-keyed cooldown gives every rank the same lr).
        counts = torch.tensor([local_tokens, float(time_up), start], dtype=torch.float64)
        counts = all_reduce_sum(counts.to(self.run.reduce_device), info).cpu()
        global_tokens, any_time_up = int(counts[0]), bool(counts[1] > 0)
        if any_time_up:
            return False
        mean_elapsed = float(counts[2]) / info.world_size
        # DDP averages gradients over ranks; scaling by world_size makes the result the
        # gradient of (total loss / total tokens).
        scale = info.world_size / global_tokens
        ddp = isinstance(self.train_module, DistributedDataParallel)
        for i, (batch, _) in enumerate(group):
            batch = batch.to(info.device, non_blocking=True)
            last = i == len(group) - 1
            sync = self.train_module.no_sync() if ddp and not last else contextlib.nullcontext()
            with sync:
                with self.run.autocast():
                    loss = self.train_module(*self.task.loss_args(batch), o.label_smoothing)
                self.scaler.scale(loss * scale).backward()
            self._meter.add(loss, self.task.batch_tokens(batch), self.state.step + 1)
        self.scaler.unscale_(self.optimizer)
        if o.clip_norm:
            nn.utils.clip_grad_norm_(self.model.parameters(), o.clip_norm, foreach=True)
        self._meter.lr = self.optimizer.param_groups[0]["lr"]
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if needs_progress(o):
            progress = self.budget.progress(self.state.step + 1, mean_elapsed)
            set_progress(self.scheduler, progress)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        s, position = self.state, group[-1][1]
        s.epoch, s.batch_in_epoch = position.epoch, position.batch
        s.target_tokens += global_tokens
        s.step += 1
        self._timer.step_done(start)
        return True

    def _log_train(self, bar) -> None:
        loss, tokens_per_sec = self._meter.summary(self.run.info, self.run.reduce_device)
        if not math.isfinite(loss):  # an all-reduced sum: every rank takes this branch or none
            self._check_finite()
        record = {
            "step": self.state.step,
            "epoch": round(self.position.epoch_float, 4),
            "train_loss": loss,
            "lr": self._meter.lr,
            "tokens_per_sec": round(tokens_per_sec, 1),
            "elapsed_sec": round(self._timer.elapsed(), 2),
        }
        self.metrics.write(record)
        postfix = {
            "loss": f"{loss:.3f}",
            "tok/s": f"{tokens_per_sec:.0f}",
            "lr": f"{record['lr']:.2e}",
        }
        left = self.budget.minutes_left(record["elapsed_sec"])
        if left is not None:
            postfix["min_left"] = f"{left:.1f}"
        bar.set_postfix(postfix, refresh=False)
        logger.debug("train %s", record)

    # ----------------------------------------------------------------- non-finite values

    def _check_finite(self) -> None:
        """Raises :class:`DivergedError` on every rank when a training loss since the last
        check, or the weights, hold NaN or inf (collective; once per step). With float16's
        grad scaler a loss that overflowed is not divergence: the scaler skipped that step and
        lowers its scale, so only the weights tell."""
        s, run = self.state, self.run
        if self._checked_step == s.step:
            return
        bad = mf.nonfinite_tensors(dict(self.model.named_parameters()))
        # Under the scaler an overflow is skipped and the scale halved; a loss that stays
        # non-finite (the forward overflows, which no scale mends) drives it below 1 (16
        # halvings from 65,536): that counts. The scale is the same on every rank.
        skipping = (
            self.scaler is not None and self.scaler.is_enabled() and self.scaler.get_scale() >= 1.0
        )
        first = self._meter.first_nonfinite if self._meter is not None and not skipping else None
        flags = torch.tensor([math.inf, s.step if bad else math.inf], dtype=torch.float64)
        if first is not None:  # the first step whose loss was not finite (inf: none)
            flags[0] = first.to("cpu", torch.float64)
        # The smallest over ranks: the same two numbers, so the same decision, on every rank.
        loss_step, weights_step = all_reduce_min(flags.to(run.reduce_device), run.info).tolist()
        if math.isfinite(loss_step):
            raise self._diverged(f"the training loss is NaN or infinite at step {int(loss_step)}")
        if math.isfinite(weights_step):
            where = (
                mf.describe_nonfinite(bad[0], self.model.get_parameter(bad[0]).detach())
                if bad
                else "on another rank"
            )
            raise self._diverged(f"the weights hold NaN or inf after step {s.step}: {where}")
        self._checked_step = s.step

    def _diverged(self, what: str) -> DivergedError:
        """The error for a run whose loss, weights or validation metrics became NaN or inf:
        what was found, the checkpoint kept, and how to go on from it."""
        o = self.config.optim
        if o.schedule == "cosine":
            sets = [f"optim.peak_lr={o.peak_lr / 2:g}", f"optim.min_lr={o.min_lr / 2:g}"]
        else:
            sets = [f"optim.lr_scale={o.lr_scale / 2:g}"]
        if not o.clip_norm:
            sets.append("optim.clip_norm=1.0")
        flags = " ".join(f"--set {item}" for item in sets)
        lower = "a lower learning rate" + ("" if o.clip_norm else " and gradient clipping")
        if self._saved_step is None:
            then = f"no checkpoint was saved yet: start the run again with {lower} ({flags})"
        else:
            then = (
                f"`last` (step {self._saved_step}) is the last good checkpoint; continue from it "
                f"with {lower}: attnkit train --resume {shlex.quote(os.fspath(self.out_dir))} {flags}"
            )
        return DivergedError(f"training diverged: {what}, so the run stopped unsaved; {then}")

    # ----------------------------------------------------------------- evaluation

    def evaluate(self) -> dict[str, float]:
        """The task's validation metrics for the current weights (e.g. ``val_loss``,
        ``val_ppl``, ``val_bleu``), the same on every rank; sets the trainer up if needed."""
        self.setup()
        return self._evaluate()

    def _evaluate(self) -> dict[str, float]:
        from attnkit.generation.packed import release

        self.model.eval()
        try:
            return self.task.evaluate(self.run, self.model, self.loss_module)
        finally:
            # Decoding (val BLEU, a GPT's sample) keeps its linear weights prepacked for oneDNN,
            # recognised by storage and version counter; the fused Adam step updates weights
            # in place without bumping that counter, so the next evaluation would decode with
            # this step's weights. Forget them now.
            release(self.model)
            self.model.train()

    def _checked_eval(self) -> bool:
        """Checks for non-finite values, evaluates, records (:meth:`_after_eval`); True to
        stop early."""
        self._check_finite()
        return self._after_eval(self._evaluate())

    def _after_eval(self, metrics: dict[str, float]) -> bool:
        """Records an evaluation, saves ``best`` if it is one; True to stop early.

        Raises:
            DivergedError: If the validation loss or the metric that selects ``best`` is NaN
                or infinite (the same on every rank). Other metrics (an ``EvalHook``'s own,
                which may say "not computed" with NaN) are recorded as they are.
        """
        s, o = self.state, self.config.optim
        name = o.best_metric
        if name == "auto":
            name = "val_bleu" if "val_bleu" in metrics else "val_loss"
        if name not in metrics:
            raise ValueError(
                f"optim.best_metric={name!r} but evaluation gave only {sorted(metrics)}"
            )
        bad = [
            f"{k} {metrics[k]}"
            for k in dict.fromkeys(("val_loss", name))
            if k in metrics and not math.isfinite(metrics[k])
        ]
        if bad:
            raise self._diverged(f"the validation gives {', '.join(bad)} at step {s.step}")
        s.last_eval_step, s.metrics = s.step, metrics
        better = record_eval(s, name, metrics[name], self.task.higher_is_better[name])
        record = {"step": s.step, "epoch": round(self.position.epoch_float, 4), **metrics}
        record["elapsed_sec"] = round(self._timer.elapsed(), 2)
        self.metrics.write(record)
        logger.info(
            "step %d: %s%s",
            s.step,
            ", ".join(f"{k} {format_metric(v)}" for k, v in metrics.items()),
            " (new best)"
            if better
            else f" (best {name} {format_metric(s.best_value)} at step {s.best_step})",
        )
        if better:
            self._save_best()
        return bool(o.patience) and s.bad_evals >= o.patience

    def _save_best(self) -> None:
        """Saves ``best`` (collective). If its folder may not be replaced (files put into it
        since the run began), saves ``last`` first, so that no step is lost, then raises: the
        resume writes the ``best`` that was due (:meth:`_write_due_best`)."""
        try:
            self._save("best")
        except RunFolderError as err:
            s = self.state
            s.elapsed_sec = self._timer.elapsed()
            self._save("last")
            raise RunFolderError(
                f"{err}; the run's steps up to {s.step} are saved in "
                f"{os.fspath(self.out_dir / 'last')!r}"
            ) from None

    def _write_due_best(self) -> None:
        """On a resume: the ``best`` a session could not save (:meth:`_save_best`) is the
        resumed weights, when the saved state says the best evaluation was at this step but
        ``best`` is missing, unreadable or from an earlier step (collective). A ``best`` from a
        later step (saved after this ``last``, then the run was killed) is kept."""
        s, info = self.state, self.run.info
        due = False
        if info.is_main and s.best_value is not None and s.best_step == s.step:
            try:
                # Older only: a newer best (saved after this `last`, before a kill) is better
                # than the resumed weights and must stay.
                due = ckpt.read_state(self.out_dir / "best")["step"] < s.step
            except ValueError:  # missing or unreadable
                due = True
        if broadcast_object(due, info):
            logger.info("saving the best checkpoint of step %d, which was not saved", s.step)
            self._save("best")

    # ----------------------------------------------------------------- the loop

    def fit(self) -> TrainResult:
        """Trains until a budget is spent; returns where it stopped."""
        self.setup()
        try:
            return self._fit()
        except KeyboardInterrupt:  # logged while train.log still receives the log
            self._log_interrupted()
            raise
        finally:
            self.close()

    def _log_interrupted(self) -> None:
        """One line on Ctrl-C: the step a ``--resume`` continues from (the steps after it are
        trained again), or that there is nothing to resume."""
        last = self.folder.last_checkpoint()
        if last is None:
            logger.info("interrupted before the first checkpoint: nothing to resume")
            return
        try:
            step = ckpt.read_state(last)["step"]
        except (ValueError, KeyError):
            step = "?"
        logger.info(
            "interrupted; the last checkpoint is step %s: continue with attnkit train --resume %s",
            step,
            os.fspath(self.out_dir),
        )

    def _fit(self) -> TrainResult:
        o, s, info = self.config.optim, self.state, self.run.info
        self._timer = RunClock(s.elapsed_sec, self.clock)
        if self.run.resume_from is not None:
            self._write_due_best()
        self._meter = TrainMeter(self.clock)
        self._meter.lr = self.optimizer.param_groups[0]["lr"]
        self._meter.carry(self._pending, info)  # a resume's steps since its last record
        self._pending = None  # once: a second fit() goes on from its own meter
        batches = self.task.train_batches(self.position)
        bar = tqdm(
            total=self.budget.total_steps(),
            initial=s.step,
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=1.0,
            # None: shown only when standard error is a terminal (as translate's and evaluate's
            # bars), so that a log redirected to a file holds no bar redraws
            disable=None if self.progress and info.is_main else True,
        )
        self.model.train()
        stop = self.budget.stop_reason(s.step, self.position.epochs_done)
        # Log lines go through tqdm.write, so they do not break the bar.
        with bar, logging_redirect_tqdm():
            while not stop:
                epochs_before = self.position.epochs_done
                if not self._train_step(batches):
                    stop = "max_minutes"
                    break
                bar.update(1)
                if s.step % o.log_every == 0:
                    self._log_train(bar)
                pause = self._timer.now()
                new_epoch = self.position.epochs_done > epochs_before
                evaluate = self.task.has_validation and (
                    s.step % o.eval_every == 0 if o.eval_every else new_epoch
                )
                stop = self.budget.stop_reason(s.step, self.position.epochs_done)
                if evaluate and self._checked_eval():
                    stop = stop or "early_stopping"
                if not stop and (
                    (o.save_every and s.step % o.save_every == 0) or (not o.save_every and evaluate)
                ):
                    s.elapsed_sec = self._timer.elapsed()
                    self._save("last")
                    self._keep_step_checkpoint()
                self._meter.pause(self._timer.now() - pause)
        if self.task.has_validation and s.last_eval_step != s.step:
            self._checked_eval()
        s.elapsed_sec = self._timer.elapsed()
        self._save("last")
        self._keep_step_checkpoint()
        epoch = self.position.epoch_float
        if s.best_value is not None:
            best = f"best {s.best_metric} {format_metric(s.best_value)} at step {s.best_step}"
        elif not self.task.has_validation:
            best = "no validation data, so no evaluation and no `best` checkpoint (only `last`)"
        else:  # pragma: no cover - a run with validation evaluates before it stops
            best = "no evaluation"
        logger.info(
            "stopped at step %d (epoch %.2f) by %s after %.1f min; %s",
            s.step,
            epoch,
            stop,
            s.elapsed_sec / 60.0,
            best,
        )
        return TrainResult(
            step=s.step,
            epoch=epoch,
            stop_reason=stop,
            best_metric=s.best_metric,
            best_value=s.best_value,
            metrics=dict(s.metrics),
            out_dir=self.out_dir,
        )


def _no_buffer_sync() -> dict[str, bool]:
    """DDP's option for no buffer broadcast before every forward (the only buffer is the fixed
    sinusoid table, the same on every rank). torch 2.13 renamed it ``forward_sync_buffers``
    and warns for the old ``broadcast_buffers`` (once per process); the new one still
    broadcasts buffers once when DDP is built, which changes nothing here. torch before 2.13
    (the floor is 2.7) knows only the old name."""
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def default_task(config: TrainConfig, eval_hook: EvalHook | None = None) -> Task:
    """The task ``config.task`` names: translation or language modelling (``"lm"``)."""
    if config.task == "lm":
        from attnkit.training.lm import LMTask

        return LMTask(eval_hook)
    return TranslationTask(eval_hook)


def train(
    config: TrainConfig,
    out_dir: str | os.PathLike[str],
    *,
    resume: bool = False,
    eval_hook: EvalHook | None = None,
    progress: bool = True,
) -> TrainResult:
    """Shorthand for ``Trainer(config, out_dir, ...).fit()``."""
    trainer = Trainer(config, out_dir, resume=resume, eval_hook=eval_hook, progress=progress)
    return trainer.fit()


__all__ = ["DivergedError", "TrainResult", "Trainer", "default_task", "train"]
