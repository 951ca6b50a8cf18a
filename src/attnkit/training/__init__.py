"""Training a Transformer for translation: config, loss, schedule, checkpoints, the loop.

    from attnkit.training import TrainConfig, train
    config = TrainConfig.from_toml("configs/multi30k_de_en.toml", ["optim.max_steps=200"])
    result = train(config, "runs/smoke")

The command line is ``attnkit train --config FILE --out runs/NAME`` (see ``--help``).
"""

from attnkit.training.checkpoint import find_checkpoint, load_model, save_checkpoint
from attnkit.training.config import DataConfig, OptimConfig, TrainConfig, apply_overrides
from attnkit.training.loss import label_smoothed_cross_entropy
from attnkit.training.precision import resolve_autocast
from attnkit.training.schedule import inverse_sqrt_lr, inverse_sqrt_scheduler
from attnkit.training.trainer import (
    EvalHook,
    SequenceLoss,
    Trainer,
    TrainResult,
    build_optimizer,
    train,
)

__all__ = [
    "DataConfig",
    "EvalHook",
    "OptimConfig",
    "SequenceLoss",
    "TrainConfig",
    "TrainResult",
    "Trainer",
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
