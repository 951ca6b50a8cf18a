"""`attnkit --version`: the versions a bug report needs, without a command."""

from __future__ import annotations

import platform
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flag_prints_the_versions_and_exits_0(flag, capsys):
    with pytest.raises(SystemExit) as stop:
        main([flag])
    assert stop.value.code == 0
    out = capsys.readouterr().out.strip()
    expected = (
        f"attnkit {metadata.version('attnkit')} (torch {torch.__version__}, "
        f"Python {platform.python_version()})"
    )
    assert out == expected


def test_package_version_is_the_project_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert attnkit.__version__ == project["version"] == metadata.version("attnkit")


def test_version_does_not_import_torch():
    code = "import sys; from attnkit.cli import main\ntry: main(['--version'])\nexcept SystemExit: pass\nprint('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "False"
