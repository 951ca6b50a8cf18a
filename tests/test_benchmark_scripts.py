"""The scripts in benchmarks/ explain themselves: every option of every script has a help text,
and every parser states the defaults (``machine.HelpFormatter``) or lays out its own text.
Read from the scripts' source (running them imports torch, transformers and CTranslate2)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "attr", None) == name or getattr(node.func, "id", None) == name)
    ]


def test_the_benchmarks_are_found():
    assert len(SCRIPTS) >= 10, [p.name for p in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_option_has_help(script):
    tree = ast.parse(script.read_text(), str(script))
    missing = [
        next((a.value for a in call.args if isinstance(a, ast.Constant)), "?")
        for call in _calls(tree, "add_argument")
        if not any(k.arg == "help" for k in call.keywords)
    ]
    assert not missing, f"{script.name}: options without help: {missing}"
    for parser in _calls(tree, "ArgumentParser"):
        assert any(k.arg == "formatter_class" for k in parser.keywords), (
            f"{script.name}:{parser.lineno}: an ArgumentParser without formatter_class"
        )
