"""Training: config, loss, schedule, checkpoints, and one loop shared by every task.

    from attnkit.training import TrainConfig, train
    config = TrainConfig.from_toml("configs/multi30k_de_en.toml", ["optim.max_steps=200"])
    result = train(config, "runs/smoke")

The command line is ``attnkit train --config FILE --out runs/NAME`` (see ``--help``).
"""

from attnkit.training.checkpoint import find_checkpoint, load_model, save_checkpoint
from attnkit.training.config import DataConfig, OptimConfig, TrainConfig, apply_overrides
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
    "OptimConfig",
    "RunContext",
    "SequenceLoss",
    "Task",
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
    "load_model",
    "resolve_autocast",
    "save_checkpoint",
    "train",
]
