#!/usr/bin/env bash
# Creates .venv in the repository root with the CPU build of torch 2.13.0 and attnkit
# installed editable with its dev extra. Safe to run again: it only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch first and pinned: any other torch spec would pull a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
# Headless Chromium (Debian's package) for the test that opens the attention viewer.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null
  else
    echo "setup: chromium not found; the HTML viewer browser test needs Debian's chromium" >&2
  fi
fi
# A C++ compiler for TorchInductor (GenerationConfig(compile=True) and its tests build kernels).
if ! command -v "${CXX:-g++}" >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null && apt-get install -y -qq g++ >/dev/null
  else
    echo "setup: no C++ compiler (g++) found; generation with compile=True needs one" >&2
  fi
fi
