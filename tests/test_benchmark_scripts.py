"""The scripts in benchmarks/ explain themselves: every option of every script has a help text,
and every parser states the defaults (``machine.HelpFormatter``) or lays out its own text
(read from the scripts' source); a bad value is a usage error before anything is loaded, and
``--help`` runs (the scripts run in one child process, which imports torch and transformers
once); the shared option types, rounds and commit lookup of ``benchmarks/machine.py``."""

from __future__ import annotations

import ast
import os
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


# --------------------------------------------------------------------------- bad values
#
# A bad value ends in argparse's usage line and "error: argument --X: ..." (exit 2) before
# anything is loaded, not in a traceback after the models are built. Every script runs in
# one child process (torch is imported once, not per script): each case executes the script
# as ``python benchmarks/SCRIPT ARGS`` would (runpy, ``__name__ == "__main__"``) and reports
# its exit status, its output and its seconds; a case still running after CASE_SECONDS is
# stopped (the benchmark got past its arguments).

CASE_SECONDS = 20
BAD_VALUES = [  # (script, arguments, the option the error names)
    ("bleu.py", "--lines 0", "--lines"),
    ("bleu.py", "--repeats 0", "--repeats"),
    ("bleu.py", "--long-words -1", "--long-words"),
    ("bert.py", "--repeats 0", "--repeats"),
    ("bert.py", "--sizes foo", "--sizes"),
    ("bert.py", "--dtypes float32,float32", "--dtypes"),
    ("bert.py", "--seq 513", "--seq"),
    ("bert.py", "--warmup -1", "--warmup"),
    ("bert.py", "--threads 0", "--threads"),
    ("decode.py", "--sides foo", "--sides"),
    ("decode.py", "--suite ctranslate2 --rounds 0", "--rounds"),
    ("decode.py", "--limit 0", "--limit"),
    ("decode.py", "--limit -5", "--limit"),
    ("decode.py", "--beam 0", "--beam"),
    ("decode.py", "--suite ctranslate2 --chunk 0", "--chunk"),
    ("generate.py", "--rounds 0", "--rounds"),
    ("generate.py", "--shapes tiny", "--shapes"),
    ("generate.py", "--batches 0", "--batches"),
    ("generate.py", "--batches 1,,8", "--batches"),
    ("generate.py", "--new-tokens 0", "--new-tokens"),
    ("generate.py", "--new-tokens 1010", "--new-tokens"),  # past GPT-2's 1,024 positions
    ("generate.py", "--modes top-k", "--modes"),
    ("generate.py", "--recompute-rounds 0", "--recompute-rounds"),
    ("llama.py", "--rounds 0", "--rounds"),
    ("llama.py", "--batches 0,8", "--batches"),
    ("llama.py", "--gqa-new-tokens 1", "--gqa-new-tokens"),
    ("llama.py", "--dtypes float16", "--dtypes"),
    ("llama_floor.py", "--rounds 0", "--rounds"),
    ("llama_floor.py", "--new-tokens 0", "--new-tokens"),
    ("screen.py", "--rounds 0", "--rounds"),
    ("screen.py", "--copies 0", "--copies"),
    ("decode_shares.py", "--rounds 0", "--rounds"),
    ("decode_shares.py", "--exponents abc", "--exponents"),
    ("decode_shares.py", "--chunk 0", "--chunk"),
    ("serve.py", "--sentences 10 --clients 2 --overload-clients 4 --overload-requests 10",
     "--overload-clients"),  # 4 clients cannot fill a queue of 64: no 503 would come
    ("serve.py", "--overload-requests 64", "--overload-requests"),
    ("serve.py", "--sentences 0", "--sentences"),
    ("serve.py", "--max-seconds 0", "--max-seconds"),
    ("train.py", "--steps 0", "--steps"),
    ("train.py", "--steps 3 --rounds 5", "--steps"),  # a round without a step
    ("train.py", "--sides torch", "--sides"),
    ("train.py", "--autocast fp8", "--autocast"),
    ("train.py", "--warmup -1", "--warmup"),
    ("train_lm.py", "--steps 0 --warmup 0", "--steps"),
    ("train_lm.py", "--steps 3 --rounds 4", "--steps"),
    ("train_lm.py", "--budget-minutes -1", "--budget-minutes"),
    ("allocator.py", "--rounds 0", "--rounds"),
    ("allocator.py", "--minutes 0", "--minutes"),
    ("attention.py", "--seq 0", "--seq"),
]  # fmt: skip
HELP = [(script.name, "--help") for script in SCRIPTS]
# bert.py's table at the smallest size (a few seconds): the header before the rows, each once
BERT_TABLE = ("bert.py", "--sizes minilm --dtypes float32 --batch 1 --seq 8 --warmup 0 --repeats 1")

DRIVER = r"""
import contextlib, io, json, os, runpy, signal, sys, time

benchmarks, cases = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, benchmarks)


def stop(*_):
    raise TimeoutError(f"still running after {CASE_SECONDS} s")


signal.signal(signal.SIGALRM, stop)
for script, args in cases:
    sys.argv = [os.path.join(benchmarks, script), *args.split()]
    out, err, status = io.StringIO(), io.StringIO(), 0
    start = time.perf_counter()
    signal.alarm(CASE_SECONDS)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as end:
        status = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    except BaseException as failure:
        status = f"{type(failure).__name__}: {failure}"
    finally:
        signal.alarm(0)
    case = {"key": f"{script} {args}", "status": status, "stdout": out.getvalue(),
            "stderr": err.getvalue(), "seconds": time.perf_counter() - start}
    print("CASE " + json.dumps(case), file=sys.__stdout__, flush=True)
""".replace("CASE_SECONDS", str(CASE_SECONDS))


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    """Every case of BAD_VALUES, HELP and BERT_TABLE, run once: key -> its result."""
    import json
    import subprocess
    import sys

    cases = [*HELP, BERT_TABLE, *((s, a) for s, a, _ in BAD_VALUES)]
    command = [sys.executable, "-c", DRIVER, str(ROOT / "benchmarks"), json.dumps(cases)]
    try:
        out = subprocess.run(
            command, capture_output=True, text=True, timeout=240, cwd=ROOT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        ).stdout  # fmt: skip
    except subprocess.TimeoutExpired as late:  # the cases that finished still count
        out = late.stdout.decode() if isinstance(late.stdout, bytes) else late.stdout or ""
    found = [json.loads(line[5:]) for line in out.splitlines() if line.startswith("CASE {")]
    return {case["key"]: case for case in found}


def _run(runs: dict, script: str, args: str) -> dict:
    key = f"{script} {args}"
    assert key in runs, f"{key}: no result (the child process ended before this case)"
    return runs[key]


@pytest.mark.parametrize(
    ("script", "args", "option"), BAD_VALUES, ids=[f"{s} {a}" for s, a, _ in BAD_VALUES]
)
def test_a_bad_value_is_a_usage_error(runs, script, args, option):
    run = _run(runs, script, args)
    assert run["status"] == 2, f"{script} {args}: status {run['status']}\n{run['stderr'][-2000:]}"
    last = run["stderr"].strip().splitlines()[-1]
    assert last.startswith(f"{script}: error: argument {option}"), run["stderr"]
    assert "expected" in last or "choose from" in last, last  # says what would do
    assert "Traceback" not in run["stderr"]
    assert run["seconds"] < 10, f"{script} {args}: {run['seconds']:.1f} s before the error"


@pytest.mark.parametrize("script", [s for s, _ in HELP])
def test_help_runs_and_states_no_empty_default(runs, script):
    run = _run(runs, script, "--help")
    assert run["status"] == 0, run["stderr"][-2000:]
    assert run["stdout"].startswith(f"usage: {script}"), run["stdout"][:200]
    assert "(default: )" not in run["stdout"]


def test_bert_prints_its_rows_once_after_the_header(runs):
    run = _run(runs, *BERT_TABLE)
    assert run["status"] == 0, f"{run['status']}\n{run['stderr'][-2000:]}"
    lines = run["stdout"].splitlines()
    rows = [line for line in lines if line.startswith("| minilm |")]
    assert len(rows) == 1, lines
    assert lines.index("| --- | --- | --- | --- | --- | --- | --- |") < lines.index(rows[0])


# --------------------------------------------------------------------------- machine.py


def _machine():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import machine
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return machine


def _parse(kind, text: str):
    """``kind`` as an option's type: (value, None) or (None, argparse's error line)."""
    import argparse
    import contextlib
    import io

    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--x", type=kind)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return parser.parse_args(["--x", text]).x, None
        except SystemExit as end:
            assert end.code == 2
    return None, err.getvalue().strip().splitlines()[-1]


def test_number_types():
    m = _machine()
    assert _parse(m.positive_int, "3") == (3, None)
    for bad in ("0", "-1", "1.5", "x", ""):
        assert _parse(m.positive_int, bad)[1] == (
            f"p: error: argument --x: expected an integer >= 1, got {bad!r}"
        )
    assert _parse(m.non_negative_int, "0") == (0, None)
    assert "expected an integer >= 0, got '-1'" in _parse(m.non_negative_int, "-1")[1]
    assert _parse(m.positive_float, "0.5") == (0.5, None)
    for bad in ("0", "-1", "nan", "inf", "x"):
        assert _parse(m.positive_float, bad)[1].endswith(
            f"expected a finite number > 0, got {bad!r}"
        )
    assert _parse(m.non_negative_float, "0") == (0.0, None)
    assert _parse(m.threads_or_zero, "0") == (0, None)
    assert "thread count" in _parse(m.thread_count, "0")[1]


def test_list_types():
    m = _machine()
    sizes = m.names_from(["base", "minilm"])
    assert _parse(sizes, "minilm, base") == (("minilm", "base"), None)
    expected = "expected comma-separated names from base, minilm, got"
    assert _parse(sizes, "foo")[1].endswith(f"{expected} 'foo'")
    assert _parse(sizes, "base,foo")[1].endswith(f"{expected} 'foo' in 'base,foo'")
    assert _parse(sizes, "base,")[1].endswith(f"{expected} 'base,'")
    assert _parse(sizes, "")[1].endswith(f"{expected} ''")
    assert _parse(sizes, "base,base")[1].endswith("each once, got 'base' twice in 'base,base'")
    assert _parse(m.positive_ints, "1,8") == ((1, 8), None)
    assert _parse(m.positive_ints, "1,0")[1].endswith(
        "expected comma-separated integers >= 1, got '0' in '1,0'"
    )
    assert "twice" in _parse(m.positive_ints, "1,01")[1]  # the same number
    assert _parse(m.floats, "1.0,1.3") == ((1.0, 1.3), None)
    assert _parse(m.floats, "abc")[1].endswith("expected comma-separated finite numbers, got 'abc'")


def test_a_string_default_goes_through_the_type():
    """The scripts give list options string defaults ("1,8"): argparse converts them too, so
    the code downstream always gets a tuple."""
    import argparse

    m = _machine()
    parser = argparse.ArgumentParser(formatter_class=m.HelpFormatter)
    parser.add_argument("--batches", type=m.positive_ints, default="1,8", help="sizes")
    assert parser.parse_args([]).batches == (1, 8)
    assert "sizes (default: 1,8)" in " ".join(parser.format_help().split())


@pytest.mark.parametrize(
    ("steps", "rounds", "sizes"),
    [(20, 5, [4] * 5), (20, 4, [5] * 4), (7, 3, [3, 2, 2]), (3, 3, [1] * 3)],
)
def test_every_timed_step_is_in_a_round(steps, rounds, sizes):
    chunks = _machine().split_evenly(list(range(steps)), rounds)
    assert [len(c) for c in chunks] == sizes
    assert [i for c in chunks for i in c] == list(range(steps))


def test_the_commit_is_the_scripts_repository_s_from_any_directory(tmp_path, monkeypatch):
    """The header's commit is the checkout whose top holds the scripts, not the one the
    command runs in (a checkout made here: the test needs git, not this repository's .git)."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("needs the git program")
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    (repo / "benchmarks" / "x.py").write_text("")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "x"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)  # run from outside any checkout
    m = _machine()
    assert m.attnkit_commit(repo) == head.stdout.strip()
    assert m.attnkit_commit(other) == "unknown"
    assert m.attnkit_commit(repo / "benchmarks") == "unknown"  # inside a checkout, not its top
    assert m.attnkit_commit(tmp_path / "missing") == "unknown"


def test_the_commit_is_looked_up_in_one_place():
    """generate.py (and llama.py, llama_floor.py through it) print machine.attnkit_commit."""
    for script in SCRIPTS:
        if script.name != "machine.py":
            assert "rev-parse" not in script.read_text(), script.name


def test_machine_py_prints_the_machine_line(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "machine.py")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("CPU ") and "attnkit commit " in done.stdout


def test_a_bad_value_in_a_child_process():
    """bleu.py (no torch) end to end: the process's own exit status and stderr."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bleu.py"), "--lines", "0"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("usage: bleu.py")
    assert done.stderr.strip().endswith(
        "bleu.py: error: argument --lines: expected an integer >= 1, got '0'"
    )


# --------------------------------------------------------------------------- serve.py


def test_serve_names_each_criterion_not_met(monkeypatch):
    import importlib.util
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "benchmark_serve", ROOT / "benchmarks" / "serve.py"
    )
    serve = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, serve)  # for its dataclass
    spec.loader.exec_module(serve)
    steps = [serve.Step(name) for name in ("serial", "concurrent", "overload", "after")]
    steps[2].statuses = {200: 10}  # no 503: the overload did not fill the queue
    steps[3].answered = 10
    judged = serve.criteria(
        steps, ratio=3.5, clients=2, alive=True, memory=(500.0, 510.0), sentences=10
    )
    lines = serve.verdict(judged)
    assert "NOT MET: 503s under overload: 0 of 10 answered overload requests refused" in lines
    assert lines[-1] == "RESULT: FAIL (1 not met: 503s under overload)"
    assert sum(line.startswith("met: ") for line in lines) == len(judged) - 1
    steps[2].statuses = {200: 4, 503: 6}
    judged = serve.criteria(
        steps, ratio=2.0, clients=2, alive=True, memory=(500.0, 600.0), sentences=10
    )
    lines = serve.verdict(judged)
    assert "NOT MET: throughput >= 3x: 2 clients / one at a time = 2.00x" in lines
    assert any(line.startswith("NOT MET: memory back within 50 MiB: 600 MiB") for line in lines)
    assert lines[-1].startswith("RESULT: FAIL (2 not met: throughput >= 3x; memory back")
