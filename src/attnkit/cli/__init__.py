"""The `attnkit` command line.

Every sub-command is a module in :mod:`attnkit.cli.commands` that defines ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``. The modules are found by name, so adding a
command means adding a file; heavy imports belong inside ``run``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from attnkit.cli import commands


def _command_modules():
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            yield importlib.import_module(f"{commands.__name__}.{info.name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnkit",
        description="attnkit: attention and Transformers from the seed notes, done right.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _command_modules():
        p = sub.add_parser(
            module.NAME,
            help=module.HELP,
            description=getattr(module, "DESCRIPTION", module.HELP),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args._run(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, UnicodeDecodeError) as err:
        # Bad input: one clear line, no traceback (use -v for the traceback).
        if args.verbose:
            raise
        print(f"attnkit {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
