"""attnkit.model_folder: clear errors for every kind of bad file, tied weights and dtypes,
atomic folder writes that never replace what attnkit did not write.

Reference readers and writers are the safetensors library's own (``load_file`` /
``save_file``) and plain ``json``, never the code under test.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from attnkit import model_folder as mf
from tests.helpers.bad_files import BAD_JSON, TRUNCATIONS, truncate

# --------------------------------------------------------------------------- fixtures


class Tied(nn.Module):
    """Embedding tied to the output projection, a norm and an integer buffer."""

    def __init__(self, vocab: int = 7, width: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norm = nn.LayerNorm(width)
        self.output = nn.Linear(width, vocab, bias=False)
        self.output.weight = self.embed.weight
        self.register_buffer("counts", torch.arange(3))


def good_folder(folder: Path, model: nn.Module | None = None) -> Path:
    """A folder written through atomic_folder (what attnkit may later replace)."""
    model = Tied() if model is None else model
    with mf.atomic_folder(folder) as tmp:
        mf.write_weights(tmp / mf.WEIGHTS_FILE, model)
        mf.write_json(tmp / mf.CONFIG_FILE, {"model_type": "tied", "vocab": 7})
    return folder


class _Touch:
    """Unpickling this creates ``path``: proof of whether a file was unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# --------------------------------------------------------------------------- config.json


@pytest.mark.parametrize("content,message", BAD_JSON)
def test_bad_config_json_is_named(tmp_path, content, message):
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match=message) as err:
        mf.read_config(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'config.json'}: ")


def test_config_that_is_missing_a_folder_or_not_a_folder(tmp_path):
    with pytest.raises(mf.MissingFileError, match=r"config.json: missing"):
        mf.read_config(tmp_path)
    try:  # both kinds of caller catch it
        mf.read_config(tmp_path)
    except ValueError as err:
        assert isinstance(err, FileNotFoundError)
    (tmp_path / "config.json").mkdir()
    with pytest.raises(ValueError, match=r"config.json: a folder, expected"):
        mf.read_config(tmp_path)
    with pytest.raises(ValueError, match=r"nope: not a folder \(does not exist\)"):
        mf.read_config(tmp_path / "nope")
    (tmp_path / "file").write_text("{}")
    with pytest.raises(ValueError, match=r"file: not a folder \(a file\)"):
        mf.read_config(tmp_path / "file")


def test_a_training_run_folder_points_to_its_models(tmp_path):
    """`--model RUN` (the folder `attnkit train --out RUN` made) names RUN/best and RUN/last,
    the model folders inside it, where it said only that RUN/config.json was missing."""
    for name in ("best", "last"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    with pytest.raises(mf.MissingFileError) as info:
        mf.read_config(tmp_path)
    assert str(info.value) == (
        f"{tmp_path}/config.json: missing; expected a model config.json; {tmp_path} looks like "
        f"a training run folder: its models are {tmp_path}/best and {tmp_path}/last"
    )
    (tmp_path / "last" / "config.json").unlink()  # only folders with a config.json are named
    with pytest.raises(mf.MissingFileError, match=r"its models are .*/best$"):
        mf.read_config(tmp_path)


def test_a_good_config_reads_as_the_json_module_reads_it(tmp_path):
    data = {"model": {"d_model": 8}, "note": "Fahrrad über Brücke", "x": [1, 2.5, None]}
    (tmp_path / "config.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    assert mf.read_config(tmp_path) == data


def test_read_json_reads_a_list_when_asked_for_one(tmp_path):
    data = [{"idx": 0, "path": ""}, {"idx": 1, "path": "1_Pooling"}]
    path = tmp_path / "modules.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert mf.read_json(path, expect=list) == data
    with pytest.raises(ValueError, match=r"modules.json: expected a JSON object \{\.\.\.\}"):
        mf.read_json(path)
    path.write_text('{"idx": 0}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"expected a JSON list \[\.\.\.\] \(x\), got an object"):
        mf.read_json(path, what="x", expect=list)
    with pytest.raises(ValueError, match=r"expect must be dict or list, got <class 'str'>"):
        mf.read_json(path, expect=str)


@pytest.mark.parametrize(
    "config,kind",
    [
        ({"model": {"d_model": 8}, "data": {}, "optim": {}}, "translation"),
        ({"model": {}}, "translation"),
        ({"num_encoder_layers": 2, "d_model": 8}, "translation"),
        ({"model_type": "bert", "hidden_size": 8}, "bert"),
        ({"model_type": "BERT"}, "bert"),
        ({"architectures": ["BertForMaskedLM"]}, "bert"),
        ({"model_type": "gpt2", "n_embd": 8}, "gpt2"),
        ({"architectures": ["GPT2LMHeadModel"]}, "gpt2"),
        ({"model_type": "t5"}, "t5"),
        ({"lr": 0.1}, "unknown"),
        ({"model": "not an object"}, "unknown"),
    ],
)
def test_folder_kind(config, kind):
    assert mf.folder_kind(config) == kind


def test_a_folder_of_another_kind_says_what_it_is_and_what_reads_it(tmp_path):
    with pytest.raises(ValueError, match=r"this is a Hugging Face BERT folder; use `attnkit embed"):
        mf.expect_kind(tmp_path, {"model_type": "bert"}, "translation")
    with pytest.raises(
        ValueError, match=r"this is an attnkit translation model folder; use `attnkit translate"
    ):
        mf.expect_kind(tmp_path, {"model": {}}, "bert")
    with pytest.raises(ValueError, match=r"GPT-2 folder"):
        mf.expect_kind(tmp_path, {"model_type": "gpt2"}, "bert", allow_unknown=True)
    with pytest.raises(ValueError, match=r"not a translation model config .*\['lr'\]"):
        mf.expect_kind(tmp_path, {"lr": 1}, "translation")
    assert mf.expect_kind(tmp_path, {"lr": 1}, "translation", allow_unknown=True) == "unknown"
    # A model_type attnkit has no model for is named (before: 'no model_type', which it has).
    with pytest.raises(
        ValueError,
        match=r"config.json: model_type 't5' is not one attnkit reads; expected a gpt2 or llama "
        r"model folder \(attnkit reads the model_type values \['bert', 'gpt2', 'llama', "
        r"'mistral', 'qwen2'\] and its own translation folders\)$",
    ):
        mf.expect_kind(tmp_path, {"model_type": "t5"}, "gpt2", "llama")


# --------------------------------------------------------------------------- weights files


@pytest.fixture()
def weights_file(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.randn(64, 8), "b": torch.arange(10)}, str(path))
    return path


@pytest.mark.parametrize("keep", TRUNCATIONS)
def test_truncated_weights_are_named(weights_file, keep):
    truncate(weights_file, keep)
    with pytest.raises(ValueError, match=r"model.safetensors: (empty|not a readable safetensors)"):
        mf.read_weights(weights_file)


@pytest.mark.parametrize(
    "content,message",
    [
        (b"", r"empty \(0 bytes\)"),
        (b"\x00garbage", r"not a readable safetensors file"),
        (b"\xff" * 64, r"not a readable safetensors file"),
        (b"{}", r"not a readable safetensors file"),
        ((16).to_bytes(8, "little") + b'{"a": "b"}      ', r"not a readable safetensors file"),
    ],
)
def test_empty_and_corrupt_weights_are_named(weights_file, content, message):
    weights_file.write_bytes(content)
    with pytest.raises(ValueError, match=message) as err:
        mf.read_weights(weights_file.parent)
    assert str(weights_file) in str(err.value)


@pytest.mark.parametrize("legacy", [False, True])
def test_a_pickle_posing_as_safetensors_is_refused_without_unpickling(tmp_path, legacy):
    sentinel = tmp_path / "unpickled"
    path = tmp_path / "model.safetensors"
    torch.save({"w": _Touch(sentinel)}, path, _use_new_zipfile_serialization=not legacy)
    with pytest.raises(
        ValueError,
        match=r"a PyTorch pickle \(torch.save\) file, not safetensors; .*arbitrary code.*convert",
    ):
        mf.read_weights(tmp_path)
    assert not sentinel.exists()
    shutil.copyfile(path, tmp_path / "payload.pt")  # torch.load reads *.safetensors as such
    torch.load(tmp_path / "payload.pt", weights_only=False)  # the payload is live
    assert sentinel.exists()


@pytest.mark.parametrize("name", mf.PICKLE_WEIGHTS_FILES)
def test_pickled_weights_files_are_refused_with_a_conversion_command(tmp_path, name):
    sentinel = tmp_path / "unpickled"
    (tmp_path / name).write_bytes(pickle.dumps(_Touch(sentinel)))
    with pytest.raises(ValueError, match=rf"{name}: pickled weights, not model.safetensors") as err:
        mf.read_weights(tmp_path)
    assert f"torch.load('{name}', weights_only=True)" in str(err.value)
    assert not sentinel.exists()


def test_a_sharded_checkpoint_is_named_as_one(tmp_path):
    """Before: 'model.safetensors: missing', as if the folder held no weights."""
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"model.safetensors.index.json: a sharded checkpoint; "):
        mf.read_weights(tmp_path)


def test_missing_weights_and_a_folder_named_like_them(tmp_path):
    with pytest.raises(mf.MissingFileError, match=r"model.safetensors: missing"):
        mf.read_weights(tmp_path)
    with pytest.raises(mf.MissingFileError, match=r"other.safetensors: missing"):
        mf.read_weights(tmp_path / "other.safetensors")
    (tmp_path / "model.safetensors").mkdir()
    with pytest.raises(ValueError, match=r"model.safetensors: a folder"):
        mf.read_weights(tmp_path)


# --------------------------------------------------------------------------- state dicts


def test_write_weights_stores_tied_tensors_once_with_the_writer_mark(tmp_path):
    model = Tied()
    mf.write_weights(tmp_path / "w.safetensors", model, metadata={"step": "3"})
    stored = load_file(tmp_path / "w.safetensors")
    assert sorted(stored) == ["counts", "embed.weight", "norm.bias", "norm.weight"]
    for name, tensor in stored.items():
        assert torch.equal(tensor, model.state_dict()[name]), name
    assert mf.weights_metadata(tmp_path / "w.safetensors") == {
        "format": "pt",
        "step": "3",
        "writer": "attnkit",
    }


def test_write_weights_casts_floats_only_and_handles_views(tmp_path):
    base = torch.randn(6, 5)
    state = {"top": base[:2], "rest": base[2:], "t": base.t(), "ids": torch.arange(4)}
    mf.write_weights(tmp_path / "w.safetensors", state, dtype=torch.bfloat16)
    stored = load_file(tmp_path / "w.safetensors")
    assert torch.equal(stored["top"], base[:2].to(torch.bfloat16))
    assert torch.equal(stored["rest"], base[2:].to(torch.bfloat16))
    assert torch.equal(stored["t"], base.t().to(torch.bfloat16))
    assert stored["ids"].dtype == torch.int64 and torch.equal(stored["ids"], torch.arange(4))


@pytest.mark.parametrize("stored_name", ["embed.weight", "output.weight"])
def test_tied_weights_load_from_either_name_and_stay_tied(tmp_path, stored_name):
    source = Tied()
    state = {k: v.clone() for k, v in source.state_dict().items()}
    del state["output.weight" if stored_name == "embed.weight" else "embed.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    target = Tied()
    mf.load_weights(target, tmp_path)
    assert target.output.weight is target.embed.weight
    assert torch.equal(target.embed.weight, source.embed.weight)


def test_bfloat16_weights_are_cast_to_the_model_and_dtype_casts_after(tmp_path):
    source = Tied()
    save_file(
        {
            k: v.to(torch.bfloat16) if v.is_floating_point() else v
            for k, v in source.state_dict().items()
            if k != "output.weight"
        },
        str(tmp_path / "model.safetensors"),
    )
    target = mf.load_weights(Tied(), tmp_path)
    assert target.embed.weight.dtype == torch.float32
    assert torch.equal(target.embed.weight, source.embed.weight.to(torch.bfloat16).float())
    as64 = mf.load_weights(Tied(), tmp_path, dtype=torch.float64)
    assert as64.norm.weight.dtype == torch.float64 and as64.counts.dtype == torch.int64


def _state(**changes):
    state = {k: v.clone() for k, v in Tied().state_dict().items() if k != "output.weight"}
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            del state[key]
        else:
            state[key] = value
    return state


@pytest.mark.parametrize(
    "state,message",
    [
        (_state(norm__bias=None), r"weights do not match the model: missing keys \['norm.bias'\]"),
        (_state(extra=torch.zeros(1)), r"unexpected keys \['extra'\]"),
        (
            _state(norm__weight=torch.ones(5)),
            r"shapes differ: \['norm.weight: file \(5,\), model \(4,\)'\]",
        ),
        (
            _state(embed__weight=torch.ones(7, 4, dtype=torch.int32)),
            r"expected floating-point tensors, got \['embed.weight: torch.int32'",
        ),
        (_state(norm__weight=torch.ones(4, dtype=torch.bool)), r"norm.weight: torch.bool"),
        (
            {**_state(), "output.weight": torch.zeros(7, 4)},
            r"'embed.weight' and 'output.weight' are tied in the model but differ in the file",
        ),
    ],
)
def test_state_dict_mismatches_are_named(tmp_path, state, message):
    model = Tied()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=message) as err:
        mf.load_state_dict_into(model, state, source=tmp_path / "w.safetensors")
    assert str(err.value).startswith(str(tmp_path / "w.safetensors"))
    for name, value in model.state_dict().items():  # nothing half-loaded
        assert torch.equal(value, before[name]), name


def test_against_names_what_the_model_was_built_from(tmp_path):
    with pytest.raises(ValueError, match=r"w: does not match .*config.json; weights do not match"):
        mf.load_state_dict_into(
            Tied(), _state(norm__bias=None), source="w", against=str(tmp_path / "config.json")
        )
    with pytest.raises(ValueError, match="untie"):
        mf.load_state_dict_into(Tied(), _state(), source="w", assign=True)


# --------------------------------------------------------------------------- atomic folders


def test_atomic_folder_writes_and_replaces_its_own_folder(tmp_path):
    folder = good_folder(tmp_path / "a" / "b" / "out")  # parents created
    first = contents(folder)
    model = Tied()
    good_folder(folder, model)
    assert contents(folder) != first
    assert torch.equal(load_file(folder / "model.safetensors")["embed.weight"], model.embed.weight)
    assert sorted(p.name for p in folder.parent.iterdir()) == ["out"]  # no .tmp-/.old- left


def test_a_failed_write_leaves_the_previous_folder_and_no_temporary(tmp_path):
    folder = good_folder(tmp_path / "out")
    before = contents(folder)
    with pytest.raises(RuntimeError, match="disk full"), mf.atomic_folder(folder) as tmp:
        mf.write_json(tmp / mf.CONFIG_FILE, {"model_type": "x"})
        raise RuntimeError("disk full")
    assert contents(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_os_error_while_writing_names_the_folder_being_written(tmp_path):
    """A write that fails inside the temporary folder is reported on the folder the caller
    asked for (the file in it in the message); an error about a file elsewhere is untouched."""
    folder = good_folder(tmp_path / "out")
    before = contents(folder)
    with pytest.raises(OSError) as info, mf.atomic_folder(folder) as tmp:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / mf.TOKENIZER_FILE))
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(folder))
    assert info.value.strerror == "No space left on device (writing tokenizer.json)"
    with pytest.raises(OSError) as info, mf.atomic_folder(folder):
        raise OSError(errno.ENOSPC, "No space left on device")  # e.g. from fsync
    assert (info.value.filename, info.value.strerror) == (str(folder), "No space left on device")
    elsewhere = str(tmp_path / "source.txt")
    with pytest.raises(PermissionError) as info, mf.atomic_folder(folder):
        raise PermissionError(errno.EACCES, "Permission denied", elsewhere)
    assert info.value.filename == elsewhere
    assert contents(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_safetensors_failed_write_is_an_os_error_naming_the_file(tmp_path, monkeypatch):
    """safetensors reports a full disk as SafetensorError("... (os error 28)"): it becomes
    OSError(ENOSPC) naming the file; a SafetensorError without an OS error stays itself."""
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    path = tmp_path / mf.WEIGHTS_FILE
    with pytest.raises(OSError) as info:
        mf.write_weights(path, Tied())
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(path))
    assert isinstance(info.value.__cause__, SafetensorError)

    def other(*args, **kwargs):
        raise SafetensorError("some other failure")

    monkeypatch.setattr(safetensors.torch, "save_file", other)
    with pytest.raises(SafetensorError, match="some other failure"):
        mf.write_weights(path, Tied())


def test_write_bytes_names_the_file_when_the_write_fails(tmp_path, monkeypatch):
    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")  # as file.write raises it

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OSError) as info:
        mf.write_json(tmp_path / "state.json", {"step": 1})
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(tmp_path / "state.json"))


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    """The process umask set to ``request.param`` for the test, then put back."""
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_the_weights_file_gets_the_mode_of_the_other_files(tmp_path, umask):
    """safetensors alone writes 0o600; write_weights gives model.safetensors what open() gives
    the folder's other files under the umask."""
    folder = good_folder(tmp_path / "out")
    reference = tmp_path / "reference"
    reference.touch()  # a plain new file: what the umask allows
    expected = stat.S_IMODE(reference.stat().st_mode)
    assert expected == 0o666 & ~umask
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    assert modes == {name: expected for name in modes} and mf.WEIGHTS_FILE in modes


def test_a_stray_file_in_the_new_folder_is_an_error_before_the_swap(tmp_path):
    folder = good_folder(tmp_path / "out")
    before = contents(folder)
    with pytest.raises(ValueError, match=r"\['notes.txt'\] are not model-folder files"):
        with mf.atomic_folder(folder) as tmp:
            (tmp / "notes.txt").write_text("x")
    assert contents(folder) == before
    with mf.atomic_folder(folder, extra_files=["notes.txt"]) as tmp:
        mf.write_weights(tmp / mf.WEIGHTS_FILE, Tied())
        (tmp / "notes.txt").write_text("x")
    assert mf.is_attnkit_folder(folder, extra_files=["notes.txt"])
    assert not mf.is_attnkit_folder(folder)


def _user_files(folder: Path) -> None:
    folder.mkdir()
    (folder / "thesis.tex").write_text("\\chapter{Attention}")
    (folder / "figures").mkdir()


def _hf_folder(folder: Path) -> None:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))  # no writer mark


def _only_config(folder: Path) -> None:
    folder.mkdir()
    (folder / "config.json").write_text('{"theme": "dark"}')


def _run_folder(folder: Path) -> None:
    good_folder(folder / "last")
    (folder / "metrics.jsonl").write_text("{}\n")


def _file(path: Path) -> None:
    path.write_text("precious")


def _symlink(path: Path) -> None:
    good_folder(path.parent / "real")
    path.symlink_to(path.parent / "real")


def _nested(folder: Path) -> None:
    good_folder(folder)
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()


@pytest.mark.parametrize(
    "make,reason",
    [
        (_user_files, r"it holds \['figures', 'thesis.tex'\], which attnkit does not write"),
        (_hf_folder, r"neither attnkit's writer mark in model.safetensors nor"),
        (_only_config, r"neither attnkit's writer mark .* \"model\" section in config.json"),
        (_run_folder, r"it is a training run folder \(it holds \['last'\]\), not a model"),
        (_file, r"a file, not a folder"),
        (_symlink, r"a symbolic link"),
        (_nested, r"it holds \['config.json'\]"),
    ],
)
def test_what_attnkit_did_not_write_is_refused_and_left_alone(tmp_path, make, reason):
    target = tmp_path / "out"
    make(target)
    snapshot = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(
        ValueError, match=rf"output folder '.*out': refusing to replace it: {reason}"
    ):
        with mf.atomic_folder(target) as tmp:
            mf.write_weights(tmp / mf.WEIGHTS_FILE, Tied())
    after = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == snapshot
    assert not any(".tmp-" in p.name for p in tmp_path.iterdir())


def test_empty_and_legacy_translation_folders_may_be_replaced(tmp_path):
    (tmp_path / "empty").mkdir()
    mf.check_replaceable(tmp_path / "empty")
    legacy = tmp_path / "legacy"  # written before the writer mark: attnkit's "model" section
    legacy.mkdir()
    (legacy / "config.json").write_text(json.dumps({"model": {"d_model": 8}}))
    save_file({"w": torch.zeros(2)}, str(legacy / "model.safetensors"))
    (legacy / "train.log").write_text("log")
    assert mf.is_attnkit_folder(legacy)
    good_folder(legacy)
    assert mf.weights_metadata(legacy / "model.safetensors")["writer"] == "attnkit"


def test_unwritable_parent_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(
        ValueError, match=r"output folder '.*a_file/out': '.*a_file' is not a folder"
    ):
        good_folder(tmp_path / "a_file" / "out")

    def read_only(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)  # as root, chmod does not stop writes
    with pytest.raises(ValueError, match=r"cannot write beside it .*Permission denied"):
        good_folder(tmp_path / "out")

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "mkdir", full)  # a full disk keeps the CLI's advice: an OSError
    with pytest.raises(OSError) as err:
        good_folder(tmp_path / "out")
    assert (err.value.errno, err.value.filename) == (errno.ENOSPC, str(tmp_path / "out"))
    assert not isinstance(err.value, ValueError)


def test_stale_temporaries_are_removed_but_look_alikes_are_kept(tmp_path):
    (tmp_path / "out.tmp-999").mkdir()
    (tmp_path / "out.tmp-999" / "model.safetensors").write_bytes(b"\0" * 10)
    good_folder(tmp_path / "out.old-998")
    user = tmp_path / "out.old-2019"
    _user_files(user)
    (tmp_path / "out.older").mkdir()
    good_folder(tmp_path / "out.v2.tmp-5")  # another folder's temporary, not out's
    good_folder(tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "out",
        "out.old-2019",
        "out.older",
        "out.v2.tmp-5",
    ]
    assert (user / "thesis.tex").is_file()


def test_recover_folder_takes_the_old_version_never_a_temporary(tmp_path):
    folder = tmp_path / "out"
    (tmp_path / "out.tmp-5").mkdir()
    (tmp_path / "out.tmp-5" / "model.safetensors").write_bytes(b"partial")
    assert mf.recover_folder(folder) is None
    good_folder(tmp_path / "keep")
    os.rename(tmp_path / "keep", tmp_path / "out.old-7")
    assert mf.recover_folder(folder) == tmp_path / "out.old-7"
    assert mf.old_versions(folder) == [tmp_path / "out.old-7"]
    shutil.copytree(tmp_path / "out.old-7", folder)
    assert mf.recover_folder(folder) == folder


def test_write_text_atomic_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text("old")
    mf.write_text_atomic(path, "new ü")
    assert path.read_text(encoding="utf-8") == "new ü"
    assert [p.name for p in tmp_path.iterdir()] == ["log.txt"]


# --------------------------------------------------------------------------- kinds of folder


def test_a_failed_swap_puts_the_previous_folder_back(tmp_path, monkeypatch):
    folder = good_folder(tmp_path / "out")
    before = contents(folder)
    rename = os.rename

    def fail_on_the_new_folder(src, dst):
        if ".tmp-" in os.fspath(src):
            raise OSError(28, "No space left on device")
        rename(src, dst)

    monkeypatch.setattr(os, "rename", fail_on_the_new_folder)
    with pytest.raises(ValueError, match=r"output folder '.*out': cannot replace it .*No space"):
        good_folder(folder)
    assert contents(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_unreadable_files_are_a_clear_error(tmp_path, monkeypatch):
    good_folder(tmp_path / "out")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)  # as root, chmod 000 does not stop reads
    with pytest.raises(ValueError, match=r"out/config.json: cannot read it \(Permission denied\)"):
        mf.read_config(tmp_path / "out")
    monkeypatch.setattr("builtins.open", denied)
    with pytest.raises(
        ValueError, match=r"model.safetensors: cannot read it \(Permission denied\)"
    ):
        mf.read_weights(tmp_path / "out")


@pytest.mark.parametrize(
    "config,kind",
    [
        ({"model": {"d_model": 8}}, "translation"),
        ({"num_encoder_layers": 2}, "translation"),
        ({"d_model": 8}, "translation"),  # says nothing: attnkit's top-level layout
        ({"model_type": "bert"}, "bert"),
        ({"model_type": "gpt2", "n_embd": 8}, "gpt2"),
        ({"model_type": "llama"}, "llama"),
        ({"architectures": ["MistralForCausalLM"]}, "mistral"),
        ({"model_type": "Qwen2"}, "qwen2"),
    ],
)
def test_model_kind_of_a_folder(tmp_path, config, kind):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert mf.model_kind(tmp_path) == kind


def test_model_kind_refuses_kinds_attnkit_does_not_load(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(
        ValueError,
        match=r"config.json: model_type 't5' is not one attnkit reads; expected a translation, "
        r"bert, gpt2, llama, mistral or qwen2 model folder",
    ):
        mf.model_kind(tmp_path)
    with pytest.raises(ValueError, match=r"not a folder"):
        mf.model_kind(tmp_path / "nope")


def test_importing_model_folder_loads_no_model_code():
    """model_folder is the bottom layer: importing it imports no model or decoding code, and
    load_pretrained lives above them in attnkit.pretrained_loading."""
    code = (
        "import sys\n"
        "import attnkit.model_folder as mf\n"
        "above = [m for m in sys.modules if m.startswith(('attnkit.models', 'attnkit.decoding'))]\n"
        "assert not above, above\n"
        "assert not hasattr(mf, 'load_pretrained')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_outputs_never_go_inside_a_model_folder_or_a_runs_kept_checkpoints(tmp_path):
    """`train --out RUN/last/x` and `average ... --out RUN/best/sub` were accepted: the run
    then could not resume (its `last` held a stray folder) or save its next `best`."""
    from attnkit.model_folder import CONFIG_FILE, WEIGHTS_FILE, check_outside_models

    run = tmp_path / "run"
    for name in ("last", "best"):
        (run / name).mkdir(parents=True)
        (run / name / CONFIG_FILE).write_text('{"model": {}}')  # attnkit's layout
        (run / name / WEIGHTS_FILE).write_bytes(b"")
    (run / "steps").mkdir()
    for out, where in [
        (run / "last" / "x", "inside the model folder"),
        (run / "best" / "a" / "b", "inside the model folder"),
        (run / "steps" / "mine", "inside .*, the checkpoints a run keeps"),
    ]:
        with pytest.raises(ValueError, match=f"--out '{re.escape(str(out))}': {where}"):
            check_outside_models(out, "--out")
    for fine in (run / "averaged", tmp_path / "other", run / "last"):  # beside, not inside
        check_outside_models(fine, "--out")
    lonely = tmp_path / "steps" / "x"  # a folder called steps that is not a run's
    check_outside_models(lonely, "--out")
    # another tool's model folder (a Hugging Face repository with a project inside) is not
    # attnkit's to guard
    hf = tmp_path / "hf_repo"
    hf.mkdir()
    (hf / CONFIG_FILE).write_text('{"model_type": "bert"}')
    (hf / WEIGHTS_FILE).write_bytes(b"")
    check_outside_models(hf / "runs" / "de_en", "--out")


def test_output_files_never_go_into_the_model_read_or_a_model_folder_attnkit_wrote(tmp_path):
    """`translate -o RUN/last/out.txt` (reading RUN/best), `attention --out RUN/best/a.html`
    and `walkthrough --plot RUN/best/w.png` were accepted: the stray file then stopped the run
    from resuming (`last`) or saving (`best`). One rule for every output file."""
    run = tmp_path / "run"
    for name in ("last", "best"):
        good_folder(run / name)
    (run / "steps").mkdir()
    hf = tmp_path / "hf"  # another tool's folder: guarded only while it is the model read
    hf.mkdir()
    (hf / mf.CONFIG_FILE).write_text('{"model_type": "bert"}')
    (hf / mf.WEIGHTS_FILE).write_bytes(b"")
    (tmp_path / "link.txt").symlink_to(run / "best" / "x.txt")  # followed, as it is written
    for out, model, message in [
        (run / "last" / "out.txt", run / "best", f"is inside the model folder '{run / 'last'}', "
         "which must hold its own files only (a run could no longer resume from it or save "
         "it); choose another place"),
        (run / "best" / "attn.html", None, f"is inside the model folder '{run / 'best'}'"),
        (tmp_path / "link.txt", None, f"is inside the model folder '{run / 'best'}'"),
        (run / "steps" / "w.png", None, f"is inside '{run / 'steps'}', the checkpoints a run "
         "keeps for `attnkit average`; choose another place"),
        (hf / "attn.html", hf, f"is inside the model folder '{hf}'; writing there would change "
         "the model: choose another place"),
    ]:  # fmt: skip
        with pytest.raises(
            ValueError, match=f"^--out: '{re.escape(str(out))}' {re.escape(message)}"
        ):
            mf.check_output_file(out, "--out", model=model)
    for out, model in [(run / "out.txt", run / "best"), (hf / "a.html", None),
                       (tmp_path / "best.png", run / "best"), (run / "last.png", None)]:  # fmt: skip
        mf.check_output_file(out, "--out", model=model)  # beside the folders, or not guarded


def test_a_run_folder_is_named_as_one_when_it_may_not_be_replaced(tmp_path):
    """`attnkit average --out OTHER_RUN` said the run "holds ['.attnkit.lock', 'best', 'last'],
    which attnkit does not write", though attnkit wrote every one of them."""
    run = tmp_path / "run"
    for name in ("last", "best"):
        good_folder(run / name)
    (run / mf.RUN_LOCK_FILE).write_text("")
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ValueError) as caught:
        mf.check_replaceable(run, what="--out")
    assert str(caught.value) == (
        f"--out '{run}': refusing to replace it: it is a training run folder (it holds "
        "['.attnkit.lock', 'best', 'last']), not a model folder; give a new folder (a run "
        "folder is never replaced)"
    )
    assert mf.foreign_entries(run) == [".attnkit.lock", "best", "last"]
    (run / mf.RUN_LOCK_FILE).unlink()  # its checkpoints alone say what it is
    with pytest.raises(ValueError, match=r"it is a training run folder \(it holds \['best',"):
        mf.check_replaceable(run, what="--out")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("float32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("float16", torch.float16),
        ("half", torch.float16),
        ("torch.bfloat16", torch.bfloat16),
        (torch.float64, torch.float64),
    ],
)
def test_a_dtype_is_taken_as_torch_names_it(given, expected):
    assert mf.floating_dtype(given) is expected


@pytest.mark.parametrize(
    "given",
    [
        "fp32",
        "bf16",
        "int8",
        "torch.long",
        "",
        None,
        torch.int64,
        "float8_e4m3fn",
        torch.float8_e5m2,
    ],
)
def test_a_dtype_torch_has_no_floating_name_for_is_refused(given):
    """torch itself read "bfloat16" in .to() as a device ("Invalid device string")."""
    with pytest.raises(
        ValueError,
        match=r"--dtype: expected a floating-point torch.dtype or its name \(float32, bfloat16, "
        r"float16 or float64, with or without 'torch.'\), got ",
    ):
        mf.floating_dtype(given, "--dtype")
