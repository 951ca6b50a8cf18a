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


def test_help_states_defaults_but_not_none_false_or_twice():
    import argparse
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from machine import HelpFormatter
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds")
    parser.add_argument("--threads", type=int, default=0, help="0 = usable cores")
    parser.add_argument("--model", default=None, help="a folder")
    parser.add_argument("--fast", action="store_true", help="be quick")
    parser.add_argument("--chunk", type=int, default=250, help="sentences (default: 250)")
    parser.add_argument("--things", type=int, default=2, help="defaulted things")
    parser.add_argument("--set", action="append", default=[], help="overrides")
    text = " ".join(parser.format_help().split())
    assert "timed rounds (default: 3)" in text
    assert "0 = usable cores (default: 0)" in text  # 0 is a default worth stating
    assert "a folder --fast" in text and "be quick --chunk" in text  # None, False: not stated
    assert "sentences (default: 250) --things" in text  # said once
    assert "defaulted things (default: 2)" in text
    assert text.endswith("--set SET overrides")  # an empty list: not stated
