"""The optimizer, its schedule and the threads of a training process, as ``[optim]`` sets them."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from attnkit.training.config import OptimConfig
from attnkit.training.distributed import DistInfo
from attnkit.training.schedule import inverse_sqrt_scheduler


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


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, d_model: int) -> LambdaLR:
    """The paper's warmup + inverse square root schedule, with ``cfg.cooldown`` at the end."""
    return inverse_sqrt_scheduler(
        optimizer,
        d_model=d_model,
        warmup=cfg.warmup_steps,
        scale=cfg.lr_scale,
        cooldown=cfg.cooldown,
    )


def default_threads(info: DistInfo) -> int:
    """Physical cores shared out among the processes on this machine."""
    capabilities = getattr(torch.cpu, "get_capabilities", dict)()
    cores = capabilities.get("num_physical_cores") or os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):  # a container or taskset may allow fewer
        cores = min(cores, len(os.sched_getaffinity(0)))
    return max(1, cores // info.local_world_size)
