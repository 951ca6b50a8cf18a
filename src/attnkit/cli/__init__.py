"""The `attnkit` command line.

Every sub-command is a module in :mod:`attnkit.cli.commands` that defines ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``. The modules are found by name, so adding a
command means adding a file; heavy imports belong inside ``run``.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import io
import logging
import os
import pkgutil
import sys
import traceback

from attnkit import allocator
from attnkit.cli import commands


def _command_modules():
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            yield importlib.import_module(f"{commands.__name__}.{info.name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnkit",
        description="attnkit: attention and Transformers from the seed notes, done right.",
        epilog="exit status: 0 on success; 2 on an error, told in one line "
        "'attnkit COMMAND: error: ...' on standard error (bad arguments or input, a file that "
        "cannot be read or written, a full disk, out of memory; -v shows the traceback); "
        "130 when interrupted. Environment: ATTNKIT_ALLOCATOR=mimalloc (the default on Linux: "
        "train runs on the mimalloc memory allocator: 1.25x the steps of the C library's malloc "
        "in 2 minutes, 1.44-1.58x in an hour; the other commands stay on the C library's) or "
        "system; anything "
        "already in LD_PRELOAD is kept.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    parser.add_argument(
        "-V", "--version", action="version", version=_version(),
        help="print attnkit's version, and torch's and Python's, then exit",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _command_modules():
        p = sub.add_parser(
            module.NAME,
            help=module.HELP,
            description=getattr(module, "DESCRIPTION", module.HELP),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        # Also after the command (`attnkit translate ... -v`), where an error's advice to "run
        # with -v" sends users; absent there, the value before the command stands.
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help=VERBOSE_HELP)  # fmt: skip
        p.set_defaults(_run=module.run)
    return parser


def _version() -> str:
    """``attnkit X (torch Y, Python Z)``, read from the installed packages' metadata, so that
    ``--version`` does not import torch."""
    from importlib import metadata
    from platform import python_version

    from attnkit import __version__

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"attnkit {__version__} (torch {torch_version}, Python {python_version()})"


VERBOSE_HELP = "log debug messages, and show the traceback of an error"


# The commands that never import torch (None: no command, e.g. `attnkit --help`).
_WITHOUT_TORCH = frozenset({None, "bleu"})


def _command_word(argv: list[str]) -> str | None:
    """The command named in ``argv``: its first word that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, except that words no option takes are reported by the
    command's own parser (``attnkit translate: error: unrecognized arguments: ...``, with
    the command's usage), not by the top-level one."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        commands_action = next(
            a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
        )
        commands_action.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def describe_os_error(err: OSError) -> str:
    """One line for an operating-system error: what failed, on which file, and what to do."""
    name = f"{os.fsdecode(err.filename)!r}" if err.filename is not None else None
    code = err.errno
    if code == errno.ENOSPC:
        where = f"writing {name}" if name else "writing the output"
        return f"no space left on the device while {where}; free some space or write elsewhere"
    if code == errno.EDQUOT:
        return f"disk quota exceeded while writing {name or 'the output'}"
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied: {name or 'the file'} cannot be opened (check its permissions)"
    if code == errno.EROFS:
        return f"{name or 'the output'} is on a read-only file system"
    if code == errno.EISDIR:
        return f"{name or 'the path'} is a directory, expected a file"
    if code == errno.ENOENT:
        return f"{name or 'a file'}: no such file or directory"
    if code == errno.ENOTDIR:
        return f"a part of {name or 'the path'} is a file, not a folder"
    text = err.strerror or os.strerror(code) if code is not None else str(err)
    return f"{name}: {text}" if name else str(text or err)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _discard_stdout() -> None:
    """Point standard output at /dev/null so that the interpreter's final flush of a closed
    pipe or a full disk does not print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


def entry() -> None:
    """The ``attnkit`` program (console script and ``python -m attnkit``): choose the memory
    allocator (:mod:`attnkit.allocator`, which may execute the program once more with
    mimalloc preloaded), then run :func:`main` and exit with its status."""
    try:
        allocator.check_choice(os.environ)
        allocator.reexec_if_needed(sys.argv[1:])
        allocator.unblock_interrupts()  # a Ctrl-C pressed during the exec is raised here
    except ValueError as err:
        print(f"attnkit: error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("attnkit: error: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(main())


class _CommandFormatter(logging.Formatter):
    """Warnings and errors logged by the library as the command's own lines say them
    (``attnkit translate: warning: ...``); progress (info, debug) with its level and logger."""

    def __init__(self, command: str) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.command = command

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.WARNING:
            line = f"attnkit {self.command}: {record.levelname.lower()}: {record.getMessage()}"
            if record.exc_info:
                line += "\n" + self.formatException(record.exc_info)
            return line
        return super().format(record)


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit status.

    Exit status: 0 on success; 2 with one line ``attnkit COMMAND: error: ...`` on standard
    error for bad arguments or input (argparse's own errors included), an operating-system
    error (missing, unreadable or unwritable file, full disk, ...), a runtime error (e.g. out
    of memory) or a keyboard interrupt (130). ``-v`` prints the traceback before that line;
    the status is the same. Other exceptions are bugs and keep their traceback.
    """
    try:
        if _command_word(sys.argv[1:] if argv is None else argv) not in _WITHOUT_TORCH:
            # Before torch, whose C code imports numpy and clears whatever that import
            # raises, a Ctrl-C included: numpy is left half made and the command fails later
            # ("module 'numpy' has no attribute 'multiply'"). Imported here, an interrupt
            # during it is the one line below.
            import numpy  # noqa: F401
        # Parsing imports what the options check with (torch, for some): an interrupt there
        # is the same one line as later.
        args = _parse(build_parser(), argv)
    except KeyboardInterrupt:
        print("attnkit: error: interrupted", file=sys.stderr)
        return 130
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_CommandFormatter(args.command))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[handler])
    if args.verbose:  # active() reads /proc/self/maps: only when the line is shown
        logging.getLogger(__name__).debug("memory allocator: %s", allocator.active())

    def fail(message: str, status: int = 2) -> int:
        if args.verbose:  # the traceback first; the status is the one without -v
            traceback.print_exc(file=sys.stderr)
        print(f"attnkit {args.command}: error: {message}", file=sys.stderr)
        return status

    try:
        status = int(args._run(args) or 0)
        sys.stdout.flush()  # a full disk or closed pipe shows up here, not at exit
        return status
    except BrokenPipeError:
        _discard_stdout()
        return 0
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except (ValueError, TypeError) as err:
        # Bad input: one clear line, no traceback (use -v for the traceback).
        return fail(_first_line(err))
    except OSError as err:
        if err.filename is None:
            _discard_stdout()
        return fail(describe_os_error(err))
    except (RuntimeError, MemoryError) as err:
        # The last resort: torch's errors (out of memory, a device that fails) and the like.
        what = "out of memory" if isinstance(err, MemoryError) else _first_line(err)
        return fail(what if args.verbose else f"{what} (run with -v for the traceback)")
