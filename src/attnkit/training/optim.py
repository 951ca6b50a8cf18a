"""The optimizer, its schedule and the threads of a training process, as ``[optim]`` sets them."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from attnkit.cpus import usable_cpus
from attnkit.training.config import OptimConfig
from attnkit.training.distributed import DistInfo
from attnkit.training.schedule import inverse_sqrt_scheduler


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Adam:
    """Adam with the paper's betas/eps; lr 1.0 because the schedule supplies the value.

    With ``cfg.weight_decay > 0`` the decay is decoupled (AdamW) and, as in nanoGPT, applies
    only to parameters of two or more dimensions (linear and embedding weights): biases and
    norm gains and shifts form a second group without decay (:func:`decay_groups`). With 0
    there is one group, the paper's Adam.
    """
    kwargs: dict[str, Any] = dict(lr=1.0, betas=cfg.betas, eps=cfg.eps)
    params = list(model.parameters())
    if all(p.device.type in ("cpu", "cuda") for p in params):
        kwargs["fused"] = True  # one kernel for all parameters (CPU and CUDA)
    if not cfg.weight_decay:
        return torch.optim.Adam(params, weight_decay=0.0, **kwargs)
    decay, no_decay = decay_groups(model)
    groups = [
        {"params": [p for _, p in decay], "weight_decay": cfg.weight_decay},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.Adam(groups, decoupled_weight_decay=True, **kwargs)
    optimizer.register_load_state_dict_pre_hook(_refuse_one_group)
    return optimizer


def decay_groups(
    model: nn.Module,
) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """The trainable parameters that weight decay applies to (two or more dimensions: matrices
    of linear layers and embeddings) and those it does not (one dimension: biases, norm
    gains and shifts), as ``(name, parameter)`` in the model's order; a tied parameter once."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [(n, p) for n, p in named if p.dim() >= 2], [(n, p) for n, p in named if p.dim() < 2]


def _refuse_one_group(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """A resume state saved with one parameter group (before weight decay skipped biases and
    norms) cannot be mapped onto the two groups: its schedule restores one learning rate."""
    saved = len(state.get("param_groups", ()))
    if saved != len(optimizer.param_groups):
        raise ValueError(
            f"the saved optimizer state has {saved} parameter group(s), this optimizer "
            f"{len(optimizer.param_groups)} (with optim.weight_decay > 0 biases and norms are "
            "a group without decay since this attnkit version); start a new run from the "
            "checkpoint's weights"
        )


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, d_model: int) -> LambdaLR:
    """The paper's warmup + inverse square root schedule, with ``cfg.cooldown`` at the end."""
    return inverse_sqrt_scheduler(
        optimizer,
        d_model=d_model,
        warmup=cfg.warmup_steps,
        scale=cfg.lr_scale,
        cooldown=cfg.cooldown,
    )


def check_threads(threads: int) -> None:
    """Raises ``ValueError`` naming ``optim.threads`` if it asks for more threads than this
    process has CPUs (the bound of the commands' ``--threads``; 0 = :func:`default_threads`)."""
    cpus = usable_cpus()
    if threads > cpus:
        raise ValueError(
            f"optim.threads={threads}: expected 0 (the default: the physical cores, shared among "
            f"this machine's processes) to {cpus}, the CPUs this process may use (a run made "
            "elsewhere resumes here with --set optim.threads=0)"
        )


def default_threads(info: DistInfo) -> int:
    """Physical cores shared out among the processes on this machine."""
    capabilities = getattr(torch.cpu, "get_capabilities", dict)()
    cores = capabilities.get("num_physical_cores") or os.cpu_count() or 1
    cores = min(cores, usable_cpus())
    return max(1, cores // info.local_world_size)
