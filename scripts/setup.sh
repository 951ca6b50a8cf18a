#!/usr/bin/env bash
# Creates .venv in the repository root with the CPU build of torch 2.13.0 and attnkit
# installed editable with its dev extra. Safe to run again: it only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch first and pinned: any other torch spec would pull a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
