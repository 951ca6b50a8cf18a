"""What every benchmark prints about the machine it ran on (imported by the scripts here)."""

from __future__ import annotations

import os
import platform


def cpu_name() -> str:
    """The processor's model name from /proc/cpuinfo, or what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        return platform.processor() or platform.machine() or "?"


def usable_cores() -> int | str:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
