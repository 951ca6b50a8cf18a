"""attnkit.training.optim.build_optimizer: with weight decay, nanoGPT's two groups (decay for
matrices and embeddings, none for biases and norms), against torch.optim.AdamW given those
groups by hand; without it, the paper's Adam in one group."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from torch import nn

from attnkit.training.config import OptimConfig
from attnkit.training.optim import build_optimizer, check_threads, decay_groups


class Small(nn.Module):
    """An embedding tied to the output, a hidden layer with bias, a LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.hidden = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)
        self.output = nn.Linear(6, 10, bias=False)
        self.output.weight = self.embed.weight

    def forward(self, ids):
        return self.output(self.norm(torch.relu(self.hidden(self.embed(ids)))))


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 3) -> None:
    ids = torch.arange(10).view(2, 5)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
        optimizer.step()


def _small(seed: int = 0) -> Small:
    torch.manual_seed(seed)
    return Small()


def test_decay_applies_to_matrices_and_embeddings_only():
    decay, no_decay = decay_groups(_small())
    assert [n for n, _ in decay] == ["embed.weight", "hidden.weight"]  # output.weight is tied
    assert [n for n, _ in no_decay] == ["hidden.bias", "norm.weight", "norm.bias"]


def test_a_step_is_adamw_with_nanogpts_groups():
    cfg = dataclasses.replace(OptimConfig(), weight_decay=0.1)
    ours, reference = _small(), _small()
    opt = build_optimizer(ours, cfg)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    by_name = dict(reference.named_parameters())
    ref_opt = torch.optim.AdamW(
        [
            {"params": [by_name["embed.weight"], by_name["hidden.weight"]], "weight_decay": 0.1},
            {"params": [by_name[n] for n in ("hidden.bias", "norm.weight", "norm.bias")]},
        ],
        lr=1.0,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=0.0,
    )
    _step(ours, opt)
    _step(reference, ref_opt)
    for (name, a), (_, b) in zip(
        ours.named_parameters(), reference.named_parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_without_weight_decay_it_is_one_group_of_plain_adam():
    ours, reference = _small(), _small()
    opt = build_optimizer(ours, OptimConfig())
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["weight_decay"] == 0.0
    assert not opt.param_groups[0]["decoupled_weight_decay"]
    cfg = OptimConfig()
    _step(ours, opt)
    _step(reference, torch.optim.Adam(reference.parameters(), lr=1.0, betas=cfg.betas, eps=cfg.eps))
    for a, b in zip(ours.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_resume_state_round_trips_and_a_one_group_state_is_refused():
    cfg = dataclasses.replace(OptimConfig(), weight_decay=0.1)
    model = _small()
    opt = build_optimizer(model, cfg)
    _step(model, opt)
    again = build_optimizer(model, cfg)
    again.load_state_dict(opt.state_dict())
    assert again.state_dict()["state"].keys() == opt.state_dict()["state"].keys()
    old = torch.optim.Adam(
        model.parameters(), lr=1.0, weight_decay=0.1, decoupled_weight_decay=True
    )
    _step(model, old, steps=1)
    with pytest.raises(ValueError, match=r"saved optimizer state has 1 parameter group\(s\), .* 2"):
        build_optimizer(model, cfg).load_state_dict(old.state_dict())


def test_threads_are_bounded_by_the_cpus_this_process_may_use(monkeypatch):
    """The bound is the affinity (a container or taskset may allow fewer CPUs than the
    machine has), simulated here as 3 of 64."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 5, 9}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    check_threads(0)  # automatic
    check_threads(3)
    with pytest.raises(ValueError, match=r"^optim.threads=4: expected 0 .* to 3, the CPUs"):
        check_threads(4)
