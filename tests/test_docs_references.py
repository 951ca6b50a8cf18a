"""docs/reliability.md lists, for every guarantee, the tests that prove it. Every reference
there must name a test file that exists and, after ``::``, a test function defined in it (a
``::name`` alone refers to the file named last before it in the same cell)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def test_every_test_named_in_reliability_md_exists():
    text = (ROOT / "docs" / "reliability.md").read_text()
    checked, missing = 0, []
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        current = None  # the file a "::name" refers to
        for ref in re.findall(r"`((?:tests/[\w/]+\.py)?(?:::\w+)?)`", line):
            file, _, name = ref.partition("::")
            if file:
                current = ROOT / file
                if not current.is_file():
                    missing.append(file)
                    continue
            if name:
                if current is None:
                    missing.append(f"{ref} (no file before it)")
                elif name not in _test_names(current):
                    missing.append(f"{current.relative_to(ROOT)}::{name}")
            checked += 1
    assert missing == []
    assert checked > 200  # the table was read (it names about 240 tests and files)
