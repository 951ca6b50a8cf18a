"""How many CPUs this process may use: the one count behind ``--threads`` and ``optim.threads``.

Plain Python (no torch), so that the command line can check ``--threads`` before it imports
anything heavy.
"""

from __future__ import annotations

import os

__all__ = ["usable_cpus"]


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (a container or taskset may allow fewer
    than the machine has), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
