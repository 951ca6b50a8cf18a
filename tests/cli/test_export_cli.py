"""`attnkit export --format ctranslate2`: the export, and one clear line for each bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import ctranslate2
import pytest

from attnkit.cli import main
from attnkit.decoding import load_translation_model
from tests.helpers.bad_files import poison_weights
from tests.helpers.viz import build_translation_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_translation_model(tmp_path_factory.mktemp("model") / "model")


def test_export_writes_a_model_ctranslate2_loads(model_dir, tmp_path, capsys):
    out = tmp_path / "ct2"
    args = ["export", "--format", "ctranslate2", "--model", str(model_dir), "--out", str(out)]
    assert main([*args, "--quantization", "int8"]) == 0
    assert f"-> {out} (CTranslate2, int8 weights)" in capsys.readouterr().out
    record = json.loads((out / "attnkit_export.json").read_text())
    assert (record["writer"], record["format"], record["quantization"]) == (
        "attnkit", "ctranslate2", "int8",
    )  # fmt: skip
    _, tokenizer, _ = load_translation_model(model_dir)
    assert (out / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    translator = ctranslate2.Translator(str(out), device="cpu", compute_type="int8")
    result = translator.translate_batch([tokenizer.tokens("Ein Hund.")], max_decoding_length=8)
    assert result[0].hypotheses[0]
    assert main(args) == 0  # an earlier export is replaced
    assert json.loads((out / "attnkit_export.json").read_text())["quantization"] == "float32"


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("attnkit export: error: "), err
    return err


def test_bad_model_folders_are_named(tmp_path, capsys):
    out = ["--out", str(tmp_path / "out")]
    missing = tmp_path / "missing"
    err = _error(capsys, ["export", "--format", "ctranslate2", "--model", str(missing), *out])
    assert f"{missing}: not a folder (does not exist)" in err
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    err = _error(capsys, ["export", "--format", "ctranslate2", "--model", str(bert), *out])
    assert "a Hugging Face BERT folder" in err and "expected a translation model folder" in err
    assert not (tmp_path / "out").exists()


def _with_nan(model_dir, folder):
    """A copy of ``model_dir`` with one NaN in its weights."""
    shutil.copytree(model_dir, folder)
    path = folder / "model.safetensors"
    name, _ = poison_weights(path)
    return path, name


@pytest.mark.parametrize("command", ["export", "translate"])
def test_weights_holding_nan_are_refused_naming_the_tensor(model_dir, tmp_path, capsys, command):
    """Before: export wrote the NaN weights and said it exported (status 0); translate failed
    only at the first step's log-probabilities, without naming the file."""
    path, name = _with_nan(model_dir, tmp_path / "nan")
    out = tmp_path / "out"
    if command == "export":
        argv = ["export", "--format", "ctranslate2", "--model", str(path.parent), "--out", str(out)]
    else:
        (tmp_path / "in.de").write_text("Ein Hund.\n")
        argv = ["translate", "--model", str(path.parent), "-i", str(tmp_path / "in.de")]
        argv += ["-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnkit {command}: error: {path}: tensor {name!r} (1 NaN, 0 inf of ")
    assert err.endswith(
        "holds NaN or inf; these weights cannot be used (a run that diverged, or a damaged file)\n"
    )
    assert not out.exists()


def test_an_option_the_export_does_not_know_is_named(model_dir, tmp_path, capsys):
    """A config from a newer attnkit (an option this one lacks) is refused naming it."""
    folder = tmp_path / "newer"
    folder.mkdir()
    config = json.loads((model_dir / "config.json").read_text())
    config["model"]["rms_norm"] = True
    (folder / "config.json").write_text(json.dumps(config))
    err = _error(capsys, ["export", "--format", "ctranslate2", "--model", str(folder),
                          "--out", str(tmp_path / "out")])  # fmt: skip
    assert "unknown keys ['rms_norm']" in err


def test_user_data_in_out_is_refused(model_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    err = _error(capsys, ["export", "--format", "ctranslate2", "--model", str(model_dir),
                          "--out", str(out)])  # fmt: skip
    assert "refusing to replace it: it holds thesis.tex" in err
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]


def test_unknown_quantization_and_format_are_usage_errors(tmp_path, capsys):
    for flag, value in (("--quantization", "int4"), ("--format", "onnx")):
        argv = ["export", "--format", "ctranslate2", "--out", str(tmp_path / "o"), flag, value]
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert f"argument {flag}: invalid choice: '{value}'" in capsys.readouterr().err


def test_without_ctranslate2_the_extra_is_named(model_dir, tmp_path):
    """In an interpreter where ctranslate2 cannot be imported (as after `pip install attnkit`)."""
    code = textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "ctranslate2" or name.startswith("ctranslate2."):
                    raise ImportError("No module named 'ctranslate2'")
        sys.meta_path.insert(0, Block())
        from attnkit.cli import main
        sys.exit(main(["export", "--format", "ctranslate2", "--model", {str(model_dir)!r},
                       "--out", {str(tmp_path / "out")!r}]))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "attnkit export: error: attnkit export --format ctranslate2 needs ctranslate2, which is "
        "not installed: pip install 'attnkit[export]' (or pip install ctranslate2)"
    )
    assert not (tmp_path / "out").exists()
