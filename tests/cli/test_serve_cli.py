"""`attnkit serve`'s errors name the flags a command-line user typed, not the library's setting
names: settings that contradict each other, and a model folder that does not load."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from attnkit.cli import main
from attnkit.cli.commands import serve as serve_command
from attnkit.serve import ServeSettings

ONLY_TRANSLATION = ["--port", "0", "--gpt-model", "none", "--bert-model", "none"]


def _error(capsys) -> str:
    return capsys.readouterr().err.splitlines()[-1]


def test_max_queue_below_max_texts_names_the_flags(capsys):
    """Before: ``max_texts=64, max_queue=2: ... expected max_texts <= max_queue``."""
    assert main(["serve", *ONLY_TRANSLATION, "--max-queue", "2"]) == 2
    assert capsys.readouterr().err == (
        "attnkit serve: error: --max-texts=64, --max-queue=2: a request may hold --max-texts "
        "texts, which must fit in the queue; expected --max-texts <= --max-queue (raise "
        "--max-queue or lower --max-texts)\n"
    )
    assert main(["serve", *ONLY_TRANSLATION, "--max-texts", "2000"]) == 2
    assert _error(capsys).startswith("attnkit serve: error: --max-texts=2000, --max-queue=1024: ")


def test_every_setting_error_names_its_flag():
    """Each setting the command passes has its flag in the map, and every ServeSettings error
    (a bad value; those argparse lets through never reach it) comes out naming flags only."""
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    # --device is checked (and named) by resolve_device; retry_after has no flag.
    settings = {f.name for f in dataclasses.fields(ServeSettings)} - {"device", "retry_after"}
    assert set(serve_command.SETTING_FLAGS) == settings
    for name, flag in serve_command.SETTING_FLAGS.items():
        value = "float32" if name == "dtype" else "1"  # (a choice; the others take numbers)
        assert name in vars(parser.parse_args([flag, value]))  # the flag sets the setting
    for name in ("max_wait_ms", "drain_seconds", "batch_tokens", "max_queue", "max_beam"):
        with pytest.raises(ValueError) as caught:
            ServeSettings(**{name: -1})
        message = str(serve_command._settings_error(caught.value))
        assert message.startswith(serve_command.SETTING_FLAGS[name] + ": expected "), message
        assert name not in message


@pytest.mark.parametrize("flag", ["--translation-model", "--gpt-model", "--bert-model"])
def test_a_model_folder_that_does_not_load_is_named_by_its_flag(flag, tmp_path, capsys):
    """Before: ``/tmp/.../config.json: missing; ...``, without saying which model it was."""
    flags = {"--translation-model": "none", "--gpt-model": "none", "--bert-model": "none"}
    flags[flag] = str(tmp_path)
    assert main(["serve", "--port", "0", *(x for pair in flags.items() for x in pair)]) == 2
    error = _error(capsys)
    assert error.startswith(f"attnkit serve: error: {flag}: {tmp_path}"), error
    assert flag[2:].replace("-", "_") + ":" not in error  # the setting's name is not
