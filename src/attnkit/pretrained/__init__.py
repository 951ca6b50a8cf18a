"""The models shipped inside the package, one folder each (written by ``scripts/ship_model.py``).

* ``multi30k_de_en/``: the German -> English translator, the default of ``attnkit translate``,
  ``evaluate`` and ``attention`` (:func:`attnkit.decoding.loading.shipped_model_dir`);
* ``shakespeare_gpt/``: a GPT trained on the works of Shakespeare (a Hugging Face GPT-2
  folder), the default of ``attnkit generate`` and ``attnkit serve``
  (:func:`default_gpt_dir`). The code runs without it: it is looked up, never assumed.

Importing this module imports nothing heavy (the command line imports it before torch).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["GPT_MODEL", "default_gpt_dir", "shipped_gpt_dir"]

GPT_MODEL = "shakespeare_gpt"  # folder name of the shipped GPT


def shipped_gpt_dir() -> Path:
    """Where the package's shipped GPT lives (the folder may be absent)."""
    return Path(__file__).resolve().parent / GPT_MODEL


def default_gpt_dir() -> Path | None:
    """The shipped GPT folder if it is installed (it holds its weights), else None."""
    from attnkit.model_folder import WEIGHTS_FILE

    folder = shipped_gpt_dir()
    return folder if (folder / WEIGHTS_FILE).is_file() else None
