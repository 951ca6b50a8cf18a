"""What every benchmark prints about the machine it ran on (imported by the scripts here)."""

from __future__ import annotations

import argparse
import os
import platform


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` that states each option's default, where it has one worth stating (not None,
    not a flag's False, not an empty list, not already said in the help text)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        said = any(word in (action.help or "") for word in ("default:", "(default", "%(default)"))
        if action.default is None or action.default is False or action.default == [] or said:
            return action.help or ""
        return super()._get_help_string(action)


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser: its docstring's first paragraph as the description, every
    option's default stated (:class:`HelpFormatter`)."""
    return argparse.ArgumentParser(formatter_class=HelpFormatter, description=doc.split("\n\n")[0])


def add_config_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    """``--config`` (a training config, ``default`` when not given) and ``--set KEY=VALUE``."""
    parser.add_argument(
        "--config", default=default,
        help="the training config (TOML) whose model and batches are timed",
    )  # fmt: skip
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[],
        help="KEY=VALUE override of the config, repeatable",
    )  # fmt: skip


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


# The variables that cap the instruction sets of the kernels a benchmark calls, so that one
# machine computes as another kind does (docs/benchmarks.md, "emulated" sections): torch's own
# kernels, oneDNN, MKL, FBGEMM (torch's int8 products) and CTranslate2.
ISA_VARIABLES = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "FBGEMM_ENABLE_INSTRUCTIONS",
    "CT2_FORCE_CPU_ISA",
)


def isa_caps() -> str:
    """The ISA variables set in this process, as ``NAME=value`` words ('' when none is)."""
    return " ".join(f"{v}={os.environ[v]}" for v in ISA_VARIABLES if v in os.environ)
