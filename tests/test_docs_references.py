"""docs/reliability.md lists, for every guarantee, the tests that prove it. Every reference
there, in its tables and its prose, must name a test file that exists and, after ``::``, a
test function or class defined in it (a ``::name`` alone refers to the file named last
before it on the same line; ``::Class::test`` and ``::test[id]`` are checked by their first
name)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _test_names(path: Path) -> set[str]:
    """The test functions and test classes defined at the top of ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.name.lower().startswith("test")
    }


def test_every_test_named_in_reliability_md_exists():
    text = (ROOT / "docs" / "reliability.md").read_text()
    checked, missing = 0, []
    for line in text.splitlines():  # table cells and prose alike
        current = None  # the file a "::name" refers to
        for ref in re.findall(r"`((?:tests/[\w/]+\.py)?(?:::[^`\s]+)?)`", line):
            file, _, name = ref.partition("::")
            if file:
                current = ROOT / file
                if not current.is_file():
                    missing.append(file)
                    continue
            if name:
                name = name.split("::")[0].split("[")[0]  # Class::test -> Class; test[id] -> test
                if current is None:
                    missing.append(f"{ref} (no file before it)")
                elif name not in _test_names(current):
                    missing.append(f"{current.relative_to(ROOT)}::{name}")
            checked += 1
    assert missing == []
    assert checked > 200  # the table was read (it names about 240 tests and files)
