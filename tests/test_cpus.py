"""attnkit.cpus.usable_cpus: the CPUs this process may use, the bound of --threads and
optim.threads alike."""

from __future__ import annotations

import os

import pytest

from attnkit.cli import main
from attnkit.cpus import usable_cpus


def test_the_affinity_counts_else_the_machine(monkeypatch):
    """A container or taskset may allow 3 of 64 CPUs (simulated)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 5, 9}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cpus() == 3
    monkeypatch.delattr(os, "sched_getaffinity")  # no affinity on this system: the count
    assert usable_cpus() == 64
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one
    assert usable_cpus() == 1


def test_threads_flag_takes_the_same_bound(monkeypatch, capsys):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 5, 9}, raising=False)
    with pytest.raises(SystemExit):
        main(["translate", "--threads", "4"])
    assert "argument --threads: expected a thread count from 1 to 3, got '4'" in (
        capsys.readouterr().err
    )
