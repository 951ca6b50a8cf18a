"""Training: config, loss, schedule, checkpoints, and one loop shared by every task.

    from attnkit.training import TrainConfig, train
    config = TrainConfig.from_toml("configs/multi30k_de_en.toml", ["optim.max_steps=200"])
    result = train(config, "runs/smoke")

A language model is the same loop with ``task = "lm"`` (:class:`LMTask`, an
:class:`LMDataConfig` ``[data]``), e.g. ``configs/shakespeare_char_gpt.toml``. The command line
is ``attnkit train --config FILE --out runs/NAME`` (see ``--help``).
"""

from attnkit.training.checkpoint import find_checkpoint, load_model, save_checkpoint
from attnkit.training.config import DataConfig, OptimConfig, TrainConfig, apply_overrides
from attnkit.training.lm import LMLoss, LMTask, TextLoss, load_lm_text, text_loss
from attnkit.training.lm_config import LMDataConfig
from attnkit.training.loss import label_smoothed_cross_entropy
from attnkit.training.optim import build_optimizer
from attnkit.training.precision import resolve_autocast
from attnkit.training.schedule import inverse_sqrt_lr, inverse_sqrt_scheduler
from attnkit.training.task import DataPosition, EvalHook, RunContext, Task
from attnkit.training.trainer import Trainer, TrainResult, train
from attnkit.training.translation import SequenceLoss, TranslationTask

__all__ = [
    "DataConfig",
    "DataPosition",
    "EvalHook",
    "LMDataConfig",
    "LMLoss",
    "LMTask",
    "OptimConfig",
    "RunContext",
    "SequenceLoss",
    "Task",
    "TextLoss",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TranslationTask",
    "apply_overrides",
    "build_optimizer",
    "find_checkpoint",
    "inverse_sqrt_lr",
    "inverse_sqrt_scheduler",
    "label_smoothed_cross_entropy",
    "load_lm_text",
    "load_model",
    "resolve_autocast",
    "save_checkpoint",
    "text_loss",
    "train",
]
