"""What every benchmark prints about the machine it ran on, the argparse types of the
benchmarks' options and how they split timed steps into rounds (imported by the scripts
here). Run alone, it prints the machine line.

The types turn a bad value (``--rounds 0``, an unknown name, ``--batches 1,,8``) into
argparse's usage line and ``error: argument --rounds: ...`` (exit 2) before anything is
loaded; they build on the ``attnkit`` command's own (:mod:`attnkit.cli.options`).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from attnkit.cli.options import integer, real, threads
from attnkit.cpus import usable_cpus

ROOT = Path(__file__).resolve().parents[1]  # the repository that holds the benchmarks
T = TypeVar("T")


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


# --------------------------------------------------------------------------- option types

positive_int = integer(1)  # rounds, repeats, steps, sizes: 0 would time or build nothing
non_negative_int = integer(0)  # where 0 has a meaning: no warm-up
non_negative_float = real(0)
thread_count = threads  # 1 to the usable cores, as the attnkit command's --threads
threads_or_zero = integer(0, usable_cpus(), what="a thread count (0: the usable cores)")


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number > 0 (minutes, seconds of a budget)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def comma_separated(item: Callable[[str], T], what: str) -> Callable[[str], tuple[T, ...]]:
    """An argparse ``type``: comma-separated values, each read by ``item`` (which raises
    ValueError or ArgumentTypeError for a bad one) and each given once; ``what`` names them in
    the message ("integers >= 1")."""

    def parse(text: str) -> tuple[T, ...]:
        values: list[T] = []
        for part in (part.strip() for part in text.split(",")):
            try:
                if not part:
                    raise ValueError("an empty item")
                value = item(part)
            except (ValueError, argparse.ArgumentTypeError):
                got = f"{part!r} in {text!r}" if part and part != text.strip() else repr(text)
                raise argparse.ArgumentTypeError(
                    f"expected comma-separated {what}, got {got}"
                ) from None
            if value in values:
                raise argparse.ArgumentTypeError(
                    f"expected comma-separated {what}, each once, got {part!r} twice in {text!r}"
                )
            values.append(value)
        return tuple(values)

    parse.__name__ = "comma_separated"
    return parse


def names_from(choices: Iterable[str]) -> Callable[[str], tuple[str, ...]]:
    """An argparse ``type``: comma-separated names from ``choices``, each once."""
    choices = tuple(choices)

    def name(text: str) -> str:
        if text not in choices:
            raise ValueError(text)
        return text

    return comma_separated(name, f"names from {', '.join(choices)}")


positive_ints = comma_separated(integer(1), "integers >= 1")  # batch sizes
floats = comma_separated(real(), "finite numbers")  # exponents


# --------------------------------------------------------------------------- parsers


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


def split_evenly(items: list[T], parts: int) -> list[list[T]]:
    """``items`` cut into ``parts`` consecutive runs whose lengths differ by at most one, the
    longer first: ``--steps`` timed steps shared among ``--rounds`` rounds, every step timed."""
    size, extra = divmod(len(items), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [items[a:b] for a, b in itertools.pairwise(bounds)]


def check_steps(parser: argparse.ArgumentParser, steps: int, rounds: int) -> None:
    """A usage error unless every round times at least one step."""
    if steps < rounds:
        parser.error(
            f"argument --steps: {steps} timed steps cannot fill {rounds} rounds (--rounds): "
            f"expected at least {rounds}, one a round"
        )


# --------------------------------------------------------------------------- the machine


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


def attnkit_commit(root: Path = ROOT) -> str:
    """The short commit of the git checkout whose top is ``root`` (the repository that holds
    these scripts, wherever they are run from), or "unknown" when ``root`` is not one."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "--short", "HEAD"],
            cwd=root, capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):  # no git, no such folder
        return "unknown"
    lines = out.stdout.split("\n")
    if out.returncode != 0 or len(lines) < 2 or Path(lines[0]).resolve() != Path(root).resolve():
        return "unknown"  # not a checkout, or a folder inside another repository's
    return lines[1].strip()


def machine_line() -> str:
    """The machine, as the benchmarks print it (without the libraries each one uses)."""
    caps = isa_caps()
    return (
        f"CPU {cpu_name()}; usable cores {usable_cores()}; load average {load_average():.1f}; "
        f"{platform.platform()}; python {platform.python_version()}; attnkit commit "
        f"{attnkit_commit()}" + (f"; instruction sets capped: {caps}" if caps else "")
    )


def main() -> int:
    argument_parser(__doc__).parse_args()
    print(machine_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
