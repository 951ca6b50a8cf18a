"""Helpers of the tests of ``scripts/``: import a script as a module.

The scripts are not a package (they are run as ``python scripts/NAME.py``), so a test imports
one from its file, under a name of its own, without running its ``__main__`` block.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def import_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module named ``scripts.<name>`` (imported once per session).

    Raises:
        FileNotFoundError: If there is no such script; the message names the path.
    """
    module_name = f"scripts.{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = SCRIPTS / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such script in {SCRIPTS}")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # before exec, as import does (dataclasses need it)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
