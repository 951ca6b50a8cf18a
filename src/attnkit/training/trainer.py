"""The training loop: token batches, accumulation, DDP, evaluation, budgets, exact resume.

One optimizer step consumes ``accumulation`` micro-batches on every rank. The loss of a step
is the label-smoothed cross-entropy summed over all real target tokens of all those batches
on all ranks, divided by their number (one all-reduce of the token count per step), so a run
on N processes takes exactly the steps of a 1-process run that accumulates the same N
batches.

Everything that decides what happens next is saved in the ``last`` checkpoint: weights,
optimizer, schedule, grad scaler, every rank's RNG states, the epoch, how many batches of it
were consumed and the sampler seed. ``resume=True`` restores all of it, so an interrupted
run continues with the very batches, dropout masks and learning rates it would have used.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from attnkit.data import Batch, Collator, ParallelCorpus, SubwordTokenizer, TokenBatchSampler
from attnkit.models.transformer import Transformer
from attnkit.training import checkpoint as ckpt
from attnkit.training.averaging import STEPS_DIR, step_checkpoints
from attnkit.training.config import OptimConfig, TrainConfig
from attnkit.training.datasets import encode, load_text, train_tokenizer
from attnkit.training.distributed import (
    DistInfo,
    all_reduce_sum,
    barrier,
    broadcast_object,
    gather_objects,
    init_distributed,
)
from attnkit.training.loss import linear_cross_entropy
from attnkit.training.metrics_log import MetricsLog, add_file_handler
from attnkit.training.precision import autocast_context, resolve_autocast
from attnkit.training.schedule import inverse_sqrt_scheduler, set_progress

logger = logging.getLogger(__name__)

EvalHook = Callable[[Transformer], dict[str, float]]
"""Called with the (eval-mode) model on rank 0 at each evaluation; returns extra metrics such
as ``{"val_bleu": 38.2}`` that are logged with ``val_loss`` and may select ``best``."""

HIGHER_IS_BETTER = {"val_bleu": True, "val_loss": False}


# --------------------------------------------------------------------------- model + loss


def decoder_states(model: Transformer, src: Tensor, tgt_in: Tensor) -> Tensor:
    """Final decoder states (B, T, d_model), before the output projection.

    ``Transformer.forward`` projects every position to the vocabulary; training needs only
    the real (non-pad) target positions, so the projection is left to the caller.
    """
    memory, src_mask = model.encode(src)  # (B, S, d_model), (B, 1, S)
    return model.decode(tgt_in, memory, src_mask, project=False)  # (B, T, d_model)


class SequenceLoss(nn.Module):
    """Model and loss in one forward, so that DDP (and torch.compile) see one module call.

    Args:
        model: The Transformer.
    """

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, epsilon: float) -> Tensor:
        """Summed label-smoothed cross-entropy over the non-pad positions of ``tgt_out``."""
        hidden = decoder_states(self.model, src, tgt_in)  # (B, T, d_model)
        keep = tgt_out != self.model.config.pad_id  # (B, T)
        # Only the N real target positions are projected; the projection and the loss are
        # fused chunk by chunk, so the (N, V) logits are never stored.
        return linear_cross_entropy(
            hidden[keep], self.model.output.weight, tgt_out[keep], epsilon=epsilon
        )  # (N, d_model) x (V, d_model) -> scalar


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Adam:
    """Adam with the paper's betas/eps; lr 1.0 because the schedule supplies the value."""
    kwargs: dict[str, Any] = dict(
        lr=1.0, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    if cfg.weight_decay:
        kwargs["decoupled_weight_decay"] = True
    params = list(model.parameters())
    if all(p.device.type in ("cpu", "cuda") for p in params):
        kwargs["fused"] = True  # one kernel for all parameters (CPU and CUDA)
    return torch.optim.Adam(params, **kwargs)


def default_threads(info: DistInfo) -> int:
    """Physical cores shared out among the processes on this machine."""
    capabilities = getattr(torch.cpu, "get_capabilities", dict)()
    cores = capabilities.get("num_physical_cores") or os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):  # a container or taskset may allow fewer
        cores = min(cores, len(os.sched_getaffinity(0)))
    return max(1, cores // info.local_world_size)


# --------------------------------------------------------------------------- run state


@dataclass
class RunState:
    """Where a run is; saved in ``state.json`` of every checkpoint."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # current epoch (0-based)
    batch_in_epoch: int = 0  # this rank's batches of `epoch` already consumed
    elapsed_sec: float = 0.0  # wall time of the run, earlier sessions included
    target_tokens: int = 0  # real target tokens trained on, all ranks
    best_metric: str = ""  # name of the metric selecting `best`
    best_value: float | None = None
    best_step: int = 0
    bad_evals: int = 0  # evaluations since the last new best
    last_eval_step: int = -1
    metrics: dict[str, float] = field(default_factory=dict)  # latest evaluation


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


# --------------------------------------------------------------------------- trainer


class Trainer:
    """Trains a :class:`Transformer` as a config describes; see the module docstring.

    Args:
        config: The training config.
        out_dir: Run folder (``metrics.jsonl``, ``train.log``, ``last/``, ``best/``).
        resume: Continue the run in ``out_dir`` from its ``last`` checkpoint.
        eval_hook: Extra evaluation on rank 0 (e.g. BLEU), see :data:`EvalHook`.
        progress: Show a tqdm progress bar on rank 0 (stderr).
    """

    def __init__(
        self,
        config: TrainConfig,
        out_dir: str | os.PathLike[str],
        *,
        resume: bool = False,
        eval_hook: EvalHook | None = None,
        progress: bool = True,
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
        self.config = config
        self.out_dir = Path(out_dir)
        self.resume = resume
        self.eval_hook = eval_hook
        self.progress = progress
        self.state = RunState()

    # ----------------------------------------------------------------- setup

    def _setup(self) -> None:
        """Process group, threads, run folder and log; then data and model."""
        o = self.config.optim
        self.info = info = init_distributed(o.device)
        self.device = info.device
        threads = o.threads or default_threads(info)
        torch.set_num_threads(threads)
        self.resume_from = None
        if self.resume:
            self.resume_from = ckpt.find_checkpoint(self.out_dir / "last")
            if self.resume_from is None:
                raise ValueError(f"--resume {os.fspath(self.out_dir)!r}: no `last` checkpoint")
        elif info.is_main and ckpt.find_checkpoint(self.out_dir / "last") is not None:
            raise ValueError(
                f"{os.fspath(self.out_dir)!r} already holds a run; resume it or choose a new folder"
            )
        if info.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        barrier(info)
        self._log_handler = add_file_handler(self.out_dir / "train.log") if info.is_main else None
        logger.info(
            "%s run in %s: %d process(es), device %s, %d thread(s) each, torch %s",
            "resuming" if self.resume else "starting",
            self.out_dir,
            info.world_size,
            self.device,
            threads,
            torch.__version__,
        )
        self.metrics = MetricsLog(self.out_dir / "metrics.jsonl", enabled=info.is_main)
        self.autocast_dtype = resolve_autocast(o.autocast, self.device)
        self._setup_data()
        self._setup_model()

    def _setup_data(self) -> None:
        """Texts, tokenizer, encoded pairs, samplers; fills in the model's vocabulary size."""
        cfg, info = self.config, self.info
        # Rank 0 trains the tokenizer (or it comes from the checkpoint); the others load it.
        text = load_text(cfg.data)
        self.text = text
        tokenizer_path = self.out_dir / ckpt.TOKENIZER
        if self.resume_from is not None:
            tokenizer_path = self.resume_from / ckpt.TOKENIZER
        elif info.is_main:
            train_tokenizer(text, cfg.data).save(tokenizer_path)
        barrier(info)
        self.tokenizer = SubwordTokenizer.load(tokenizer_path)
        self.collate = Collator.for_tokenizer(self.tokenizer)

        model_cfg = replace(
            cfg.model,
            src_vocab_size=self.tokenizer.vocab_size,
            tgt_vocab_size=self.tokenizer.vocab_size,
            pad_id=self.tokenizer.pad_id,
        )
        self.config = cfg = replace(cfg, model=model_cfg)
        max_len = cfg.data.max_len or model_cfg.max_len
        if max_len > model_cfg.max_len:
            raise ValueError(
                f"data.max_len={max_len} exceeds model.max_len={model_cfg.max_len}, the longest "
                f"sequence the model encodes"
            )
        self.train_pairs = encode(text.train, self.tokenizer)
        self.val_pairs = encode(text.val, self.tokenizer)
        self.sampler = TokenBatchSampler(
            self.train_pairs,
            max_tokens=cfg.data.max_tokens,
            max_len=max_len,
            seed=cfg.data.seed,
            num_shards=info.world_size,
            shard_index=info.rank,
        )
        logger.info(
            "train: %d pairs kept, %d skipped as longer than max_len=%d; %d batches per "
            "epoch per rank (max_tokens=%d, accumulation=%d)",
            self.sampler.num_pairs,
            self.sampler.num_skipped,
            max_len,
            self.sampler.batches_per_shard,
            cfg.data.max_tokens,
            cfg.optim.accumulation,
        )
        self.val_batches: list[list[int]] = []
        if self.val_pairs:
            val_sampler = TokenBatchSampler(
                self.val_pairs, max_tokens=cfg.data.max_tokens, max_len=max_len, shuffle=False
            )
            self.val_batches = list(val_sampler)
            logger.info(
                "validation: %d pairs kept, %d skipped as longer than max_len=%d",
                val_sampler.num_pairs,
                val_sampler.num_skipped,
                max_len,
            )
        if cfg.optim.val_bleu and self.eval_hook is None and text.val is not None:
            from attnkit.training.bleu import bleu_eval_hook

            n = cfg.optim.val_bleu_sentences or len(text.val)
            subset = ParallelCorpus(src=text.val.src[:n], tgt=text.val.tgt[:n])
            self.eval_hook = bleu_eval_hook(self.tokenizer, subset)

    def _setup_model(self) -> None:
        """Model, optimizer, schedule, grad scaler (restored on resume), DDP wrapper."""
        cfg, o, info = self.config, self.config.optim, self.info
        model_cfg = cfg.model
        torch.manual_seed(o.seed)  # the same initial weights on every rank
        self.model = Transformer(model_cfg).to(self.device)
        logger.info(
            "model: %.2fM parameters (d_model %d, %d+%d layers, %d heads, d_ff %d, vocab %d)",
            sum(p.numel() for p in self.model.parameters()) / 1e6,
            model_cfg.d_model,
            model_cfg.num_encoder_layers,
            model_cfg.num_decoder_layers,
            model_cfg.num_heads,
            model_cfg.d_ff,
            model_cfg.tgt_vocab_size,
        )
        self.optimizer = build_optimizer(self.model, o)
        self.scheduler = inverse_sqrt_scheduler(
            self.optimizer,
            d_model=model_cfg.d_model,
            warmup=o.warmup_steps,
            scale=o.lr_scale,
            cooldown=o.cooldown,
        )
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=self.autocast_dtype == torch.float16
        )
        torch.manual_seed(o.seed + 1 + info.rank)  # each rank its own dropout stream
        if self.resume_from is not None:
            self._restore(self.resume_from)
        else:
            self.metrics.truncate_after(-1)
        if info.is_main:
            ckpt.write_text_atomic(self.out_dir / "config.toml", cfg.to_toml())
        self.loss_module: nn.Module = SequenceLoss(self.model)
        self.train_module: nn.Module = self.loss_module
        if o.compile:
            logger.info("torch.compile: on (dynamic shapes); the first steps compile")
            self.train_module = torch.compile(self.loss_module, dynamic=True)
        if info.distributed:
            self.train_module = DistributedDataParallel(
                self.train_module,
                device_ids=[self.device] if self.device.type == "cuda" else None,
                broadcast_buffers=False,  # the only buffer is the fixed sinusoid table
            )

    # ----------------------------------------------------------------- checkpoints

    def _rng_state(self) -> dict[str, Any]:
        np_state = np.random.get_state()
        state = {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def _restore(self, folder: Path) -> None:
        saved = ckpt.read_state(folder)
        ckpt.load_weights(self.model, folder)
        resume = ckpt.load_resume_state(folder)
        self.optimizer.load_state_dict(resume["optimizer"])
        self.scheduler.load_state_dict(resume["scheduler"])
        self.scaler.load_state_dict(resume["scaler"])
        ranks = resume["rng"]
        if len(ranks) != self.info.world_size:
            logger.warning(
                "checkpoint was written by %d process(es), now %d: random streams differ",
                len(ranks),
                self.info.world_size,
            )
        rng = ranks[self.info.rank % len(ranks)]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        name, keys, *rest = rng["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        sampler = saved["sampler"]
        if sampler["num_shards"] != self.info.world_size or sampler["seed"] != self.sampler.seed:
            logger.warning("data sharding or seed changed since the checkpoint: order differs")
        fields = set(RunState.__dataclass_fields__)
        self.state = RunState(**{k: v for k, v in saved["run"].items() if k in fields})
        self.metrics.truncate_after(self.state.step)
        logger.info(
            "resumed from %s at step %d (epoch %d, batch %d)",
            folder,
            self.state.step,
            self.state.epoch,
            self.state.batch_in_epoch,
        )

    def _state_json(self) -> dict[str, Any]:
        return {
            "step": self.state.step,
            "epoch": round(self._epoch_float(), 4),
            "run": asdict(self.state),
            "sampler": {
                "seed": self.sampler.seed,
                "epoch": self.state.epoch,
                "skip_batches": self.state.batch_in_epoch,
                "num_shards": self.sampler.num_shards,
            },
        }

    def _save(self, name: str) -> None:
        """Writes ``last`` (with resume state) or ``best``; collective for ``last``."""
        resume = None
        if name == "last":
            rng = gather_objects(self._rng_state(), self.info)
            resume = {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "rng": rng,
            }
        if self.info.is_main:
            ckpt.save_checkpoint(
                self.out_dir / name,
                model=self.model,
                config=self.config,
                tokenizer=self.tokenizer,
                state=self._state_json(),
                resume=resume,
            )
            logger.debug("saved %s at step %d", name, self.state.step)

    # ----------------------------------------------------------------- data

    def _batches(self) -> Iterator[Batch]:
        """This rank's batches from the saved position on, epoch after epoch."""
        s = self.state
        while True:
            self.sampler.set_epoch(s.epoch, skip_batches=s.batch_in_epoch)
            for indices in self.sampler:
                s.batch_in_epoch += 1
                yield self.collate([self.train_pairs[i] for i in indices])
            s.epoch += 1
            s.batch_in_epoch = 0

    def _epochs_done(self) -> int:
        return self.state.epoch + (self.state.batch_in_epoch >= self.sampler.batches_per_shard)

    def _epoch_float(self) -> float:
        return self.state.epoch + self.state.batch_in_epoch / self.sampler.batches_per_shard

    # ----------------------------------------------------------------- steps

    def _elapsed(self) -> float:
        return self._elapsed_before + time.perf_counter() - self._t0

    def _train_step(self, batches: Iterator[Batch]) -> bool:
        """One optimizer step; returns True when some rank ran out of time."""
        o = self.config.optim
        group = [next(batches) for _ in range(o.accumulation)]
        local_tokens = sum(b.num_tgt_tokens for b in group)
        elapsed = self._elapsed()
        time_up = bool(o.max_minutes) and elapsed >= 60.0 * o.max_minutes
        # One collective per step: the global token count (the loss denominator), whether
        # any rank is out of time (so that all ranks stop at the same step) and the mean
        # elapsed time (so that a time-keyed cooldown gives every rank the same lr).
        counts = torch.tensor([local_tokens, float(time_up), elapsed], dtype=torch.float64)
        counts = all_reduce_sum(counts.to(self._reduce_device), self.info).cpu()
        global_tokens, any_time_up = int(counts[0]), bool(counts[1] > 0)
        mean_elapsed = float(counts[2]) / self.info.world_size
        # DDP averages gradients over ranks; scaling by world_size makes the result the
        # gradient of (total loss / total tokens).
        scale = self.info.world_size / global_tokens
        ddp = isinstance(self.train_module, DistributedDataParallel)
        for i, batch in enumerate(group):
            batch = batch.to(self.device, non_blocking=True)
            last = i == len(group) - 1
            sync = self.train_module.no_sync() if ddp and not last else contextlib.nullcontext()
            with sync:
                with autocast_context(self.device, self.autocast_dtype):
                    loss = self.train_module(
                        batch.src, batch.tgt_in, batch.tgt_out, o.label_smoothing
                    )
                self.scaler.scale(loss * scale).backward()
            self._interval_loss += loss.detach().to(torch.float64)
        self.scaler.unscale_(self.optimizer)
        if o.clip_norm:
            nn.utils.clip_grad_norm_(self.model.parameters(), o.clip_norm, foreach=True)
        self._lr = self.optimizer.param_groups[0]["lr"]
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if o.cooldown:
            set_progress(self.scheduler, self._budget_progress(self.state.step + 1, mean_elapsed))
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._interval_tokens += local_tokens
        self.state.target_tokens += global_tokens
        self.state.step += 1
        return any_time_up

    def _log_train(self, bar) -> None:
        sums = torch.stack(
            [self._interval_loss.cpu(), torch.tensor(self._interval_tokens, dtype=torch.float64)]
        )
        sums = all_reduce_sum(sums.to(self._reduce_device), self.info).cpu()
        seconds = max(time.perf_counter() - self._interval_start - self._interval_pause, 1e-9)
        record = {
            "step": self.state.step,
            "epoch": round(self._epoch_float(), 4),
            "train_loss": float(sums[0] / sums[1]) if sums[1] > 0 else float("nan"),
            "lr": self._lr,
            "tokens_per_sec": round(float(sums[1]) / seconds, 1),
            "elapsed_sec": round(self._elapsed(), 2),
        }
        self.metrics.write(record)
        postfix = {
            "loss": f"{record['train_loss']:.3f}",
            "tok/s": f"{record['tokens_per_sec']:.0f}",
            "lr": f"{record['lr']:.2e}",
        }
        if self.config.optim.max_minutes:
            left = self.config.optim.max_minutes - record["elapsed_sec"] / 60.0
            postfix["min_left"] = f"{max(left, 0.0):.1f}"
        bar.set_postfix(postfix, refresh=False)
        logger.debug("train %s", record)
        self._reset_interval()

    def _reset_interval(self) -> None:
        self._interval_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self._interval_tokens = 0
        self._interval_start = time.perf_counter()
        self._interval_pause = 0.0

    # ----------------------------------------------------------------- evaluation

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation loss (plain cross-entropy, no smoothing) and perplexity, plus the hook's
        metrics; the same numbers on every rank."""
        self.model.eval()
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        try:
            for i, indices in enumerate(self.val_batches):
                if i % self.info.world_size != self.info.rank:
                    continue
                batch = self.collate([self.val_pairs[j] for j in indices]).to(self.device)
                with autocast_context(self.device, self.autocast_dtype):
                    loss = self.loss_module(batch.src, batch.tgt_in, batch.tgt_out, 0.0)
                sums[0] += loss.to(torch.float64)
                sums[1] += batch.num_tgt_tokens
            sums = all_reduce_sum(sums.to(self._reduce_device), self.info).cpu()
            val_loss = float(sums[0] / sums[1])
            metrics = {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 700.0))}
            extra = {}
            if self.eval_hook is not None and self.info.is_main:
                with autocast_context(self.device, self.autocast_dtype):
                    extra = dict(self.eval_hook(self.model))
                self.model.eval()  # whatever the hook did
            metrics.update(broadcast_object(extra, self.info))
        finally:
            self.model.train()
        return metrics

    def _after_eval(self, metrics: dict[str, float]) -> bool:
        """Records an evaluation, saves ``best`` if it is one; True to stop early."""
        s, o = self.state, self.config.optim
        s.last_eval_step, s.metrics = s.step, metrics
        name = o.best_metric
        if name == "auto":
            name = "val_bleu" if "val_bleu" in metrics else "val_loss"
        if name not in metrics:
            raise ValueError(
                f"optim.best_metric={name!r} but evaluation gave only {sorted(metrics)}"
            )
        value = metrics[name]
        better = (
            s.best_value is None
            or s.best_metric != name
            or (value > s.best_value if HIGHER_IS_BETTER[name] else value < s.best_value)
        )
        if better:
            s.best_metric, s.best_value, s.best_step, s.bad_evals = name, value, s.step, 0
        else:
            s.bad_evals += 1
        record = {"step": s.step, "epoch": round(self._epoch_float(), 4), **metrics}
        record["elapsed_sec"] = round(self._elapsed(), 2)
        self.metrics.write(record)
        logger.info(
            "step %d: %s%s",
            s.step,
            ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()),
            " (new best)" if better else f" (best {name} {s.best_value:.4f} at step {s.best_step})",
        )
        if better:
            self._save("best")
        return bool(o.patience) and s.bad_evals >= o.patience

    def _keep_step_checkpoint(self) -> None:
        """With ``optim.keep_checkpoints`` N, saves the weights (no resume state) beside each
        ``last`` as ``steps/step_NNNNNNN`` and deletes all but the newest N (for averaging)."""
        keep = self.config.optim.keep_checkpoints
        if not keep or not self.info.is_main:
            return
        (self.out_dir / STEPS_DIR).mkdir(exist_ok=True)
        self._save(f"{STEPS_DIR}/step_{self.state.step:07d}")
        for old in step_checkpoints(self.out_dir)[:-keep]:
            shutil.rmtree(old)

    # ----------------------------------------------------------------- the loop

    def _stop_reason(self) -> str:
        o = self.config.optim
        if o.max_steps and self.state.step >= o.max_steps:
            return "max_steps"
        if o.max_epochs and self._epochs_done() >= o.max_epochs:
            return "max_epochs"
        return ""

    def _budget_progress(self, step: int, elapsed_sec: float) -> float:
        """Fraction of the budget spent after ``step`` steps and ``elapsed_sec`` seconds: the
        largest over the budgets that are set (steps, epochs, minutes); may pass 1, which
        ``cooldown_factor`` clamps."""
        o = self.config.optim
        fractions = []
        total_steps = self._total_steps()
        if total_steps:
            fractions.append(step / total_steps)
        if o.max_minutes:
            fractions.append(elapsed_sec / (60.0 * o.max_minutes))
        return max(fractions, default=0.0)

    def _total_steps(self) -> int | None:
        o = self.config.optim
        totals = []
        if o.max_steps:
            totals.append(o.max_steps)
        if o.max_epochs:
            totals.append(math.ceil(o.max_epochs * self.sampler.batches_per_shard / o.accumulation))
        return min(totals) if totals else None

    def fit(self) -> TrainResult:
        """Trains until a budget is spent; returns where it stopped."""
        self._setup()
        try:
            return self._fit()
        finally:
            if self._log_handler is not None:
                logging.getLogger("attnkit").removeHandler(self._log_handler)
                self._log_handler.close()

    def _fit(self) -> TrainResult:
        o, s = self.config.optim, self.state
        self._reduce_device = self.device if self.device.type == "cuda" else torch.device("cpu")
        self._t0, self._elapsed_before = time.perf_counter(), s.elapsed_sec
        self._lr = self.optimizer.param_groups[0]["lr"]
        self._reset_interval()
        batches = self._batches()
        bar = tqdm(
            total=self._total_steps(),
            initial=s.step,
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=1.0,
            disable=not (self.progress and self.info.is_main),
        )
        self.model.train()
        stop = self._stop_reason()
        # Log lines go through tqdm.write, so they do not break the bar.
        with bar, logging_redirect_tqdm():
            while not stop:
                epochs_before = self._epochs_done()
                time_up = self._train_step(batches)
                bar.update(1)
                if s.step % o.log_every == 0:
                    self._log_train(bar)
                pause = time.perf_counter()
                new_epoch = self._epochs_done() > epochs_before
                evaluate = bool(self.val_batches) and (
                    s.step % o.eval_every == 0 if o.eval_every else new_epoch
                )
                stop = self._stop_reason() or ("max_minutes" if time_up else "")
                if evaluate and self._after_eval(self.evaluate()):
                    stop = stop or "early_stopping"
                if not stop and (
                    (o.save_every and s.step % o.save_every == 0) or (not o.save_every and evaluate)
                ):
                    s.elapsed_sec = self._elapsed()
                    self._save("last")
                    self._keep_step_checkpoint()
                self._interval_pause += time.perf_counter() - pause
        if self.val_batches and s.last_eval_step != s.step:
            self._after_eval(self.evaluate())
        s.elapsed_sec = self._elapsed()
        self._save("last")
        self._keep_step_checkpoint()
        logger.info(
            "stopped at step %d (epoch %.2f) by %s after %.1f min; best %s %s at step %d",
            s.step,
            self._epoch_float(),
            stop,
            s.elapsed_sec / 60.0,
            s.best_metric or "-",
            "-" if s.best_value is None else f"{s.best_value:.4f}",
            s.best_step,
        )
        return TrainResult(
            step=s.step,
            epoch=self._epoch_float(),
            stop_reason=stop,
            best_metric=s.best_metric,
            best_value=s.best_value,
            metrics=dict(s.metrics),
            out_dir=self.out_dir,
        )


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


__all__ = [
    "EvalHook",
    "RunState",
    "SequenceLoss",
    "TrainResult",
    "Trainer",
    "build_optimizer",
    "decoder_states",
    "train",
]
