"""Packaging: the core runs without matplotlib (the `plot` extra), and the package is typed."""

import importlib.resources
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A fresh interpreter in which matplotlib cannot be imported, as after `pip install attnkit`.
NO_MATPLOTLIB = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Block())
"""


def run_without_matplotlib(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", NO_MATPLOTLIB + code], capture_output=True, text=True, timeout=120
    )


def test_core_imports_without_matplotlib():
    done = run_without_matplotlib(
        "import attnkit, attnkit.cli, attnkit.decoding, attnkit.metrics, attnkit.training\n"
        "import attnkit.walkthrough\n"
        "from attnkit.viz import capture_translation, write_html\n"
        "assert 'matplotlib' not in sys.modules\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_plots_without_matplotlib_name_the_extra(tmp_path):
    """Each way to draw raises an ImportError that says which extra to install."""
    metrics, png = str(tmp_path / "metrics.jsonl"), str(tmp_path / "x.png")
    attempts = {
        "viz": "from attnkit.viz import heatmap",
        "training.plot": f"from attnkit.training.plot import plot_val_loss\n"
        f"plot_val_loss({metrics!r}, {png!r})",
        "cli": f"from attnkit.cli import main\nmain(['attention', 'Ein Hund.', '--out', {png!r}])",
    }
    code = "".join(
        f"try:\n    exec({snippet!r})\n    print({name!r}, 'no error')\n"
        f"except ImportError as err:\n    print({name!r}, err)\n"
        for name, snippet in attempts.items()
    )
    done = run_without_matplotlib(code)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(attempts)
    for line in lines:
        assert "needs matplotlib" in line and "pip install 'attnkit[plot]'" in line, line


def test_py_typed_is_shipped():
    assert importlib.resources.files("attnkit").joinpath("py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["attnkit"]


def test_matplotlib_is_an_extra_not_a_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert not any(dep.startswith("matplotlib") for dep in project["dependencies"])
    assert project["optional-dependencies"]["plot"] == ["matplotlib"]
    assert "attnkit[plot]" in project["optional-dependencies"]["dev"]  # the tests draw images


def test_importing_attnkit_raises_onednn_kernel_cache_unless_the_user_set_it():
    """oneDNN reads ONEDNN_PRIMITIVE_CACHE_CAPACITY at its first kernel; attnkit sets a larger
    default at import (training meets thousands of shapes) and keeps a value already set."""
    import os

    code = "import os, attnkit; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    unset = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert unset.stdout.strip() == "4096", unset.stderr
    env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = "77"
    kept = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert kept.stdout.strip() == "77", kept.stderr
