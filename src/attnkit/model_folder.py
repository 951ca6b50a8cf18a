"""Model folders: the one place that knows their files, reads them with clear errors and
writes them atomically, and tells what kind of model a folder holds.

Length: about 850 lines, over the house's ~400, on purpose: issue 14 asked for *one* module
that knows the folder format, and its parts lean on each other (the writer recognises a
folder it may replace with the reader, the rule for where outputs may go guards the folders
the writer recognises, recovery uses the writer's temporary names, the
kinds the reader tells apart are the ones :mod:`attnkit.pretrained_loading` loads by).
Splitting them would put the file names and the recognition rule back in two places.

A model folder holds ``config.json`` (a JSON object), ``model.safetensors`` (the weights; tied
tensors stored once) and usually ``tokenizer.json``. attnkit's translation folders keep the
:class:`~attnkit.models.TransformerConfig` under a ``"model"`` key; training checkpoints add
``state.json`` and ``resume.pt``; Hugging Face folders (BERT, GPT-2) keep their config at the
top level with a ``model_type``. Nothing here knows a model class: callers build the model and
hand it to :func:`load_state_dict_into`.

Reading. Every error is a ``ValueError`` that names the file and what is wrong (missing, a
folder, not UTF-8, not JSON, not an object, a truncated safetensors file, a pickle posing as
weights, a missing or unexpected tensor); a missing file is a :class:`MissingFileError`, which
is both a ``ValueError`` and a ``FileNotFoundError``. Pickled weights (``pytorch_model.bin``,
``*.pt``) are never unpickled: unpickling can run code; the message says how to convert.

Writing. :func:`atomic_folder` writes into ``NAME.tmp-<pid>/``, fsyncs every file and the
folder, renames an existing ``NAME`` to ``NAME.old-<pid>``, renames the new folder to ``NAME``
and deletes the old one. Only complete folders ever carry the name ``NAME`` or
``NAME.old-*``, so a process killed at any moment leaves a loadable folder
(:func:`recover_folder`). It replaces only a folder it can recognise as one attnkit wrote
(:func:`check_replaceable`): a folder holding only the files of :data:`FOLDER_FILES`, whose
weights carry attnkit's writer mark or whose ``config.json`` has attnkit's ``"model"`` section;
anything else (a folder of user files, a run folder, a file) is refused before anything is
written. So nothing else may be written into such a folder either: folder outputs go outside
it (:func:`check_outside_models`), and so do the files commands write
(:func:`check_output_file`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, overload

import torch
from torch import Tensor, nn

from attnkit.files import default_file_mode, fsync_folder, replace_folder, temp_beside, write_file

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
STATE_FILE = "state.json"  # training checkpoints: step, data position, metrics
RESUME_FILE = "resume.pt"  # training checkpoints: optimizer, scheduler and RNG states
CHECKPOINT_STATE_FILE = "checkpoint_state.json"  # shipped model: its checkpoint's state.json
# Names under which frameworks store pickled weights; attnkit refuses to unpickle them.
PICKLE_WEIGHTS_FILES = (
    "pytorch_model.bin",
    "model.bin",
    "model.pt",
    "model.pth",
    "pytorch_model.pt",
)
# Every file attnkit writes into a model folder. A folder holding anything else is not attnkit's
# to replace (see check_replaceable).
FOLDER_FILES = frozenset(
    {
        CONFIG_FILE,
        WEIGHTS_FILE,
        TOKENIZER_FILE,
        STATE_FILE,
        RESUME_FILE,
        CHECKPOINT_STATE_FILE,
        "generation_config.json",  # Hugging Face GPT-2 folders
        # A shipped model's training record: the run's files (training.run_folder's
        # RUN_CONFIG_FILE, METRICS_FILE and LOG_FILE; this module sits below training).
        "config.toml",
        "metrics.jsonl",
        "train.log",
    }
)
# safetensors metadata key and value that mark weights written by attnkit.
WRITER_KEY, WRITER = "writer", "attnkit"

_STALE = re.compile(r"\.(tmp|old)-\d+")  # the suffix of a writer's temporary folder
_CONVERT = (
    "attnkit reads only safetensors weights, because unpickling a file can run arbitrary code; "
    'if you trust the file, convert it once with: python -c "import torch; '
    "from safetensors.torch import save_file; "
    "save_file(torch.load('{name}', weights_only=True), 'model.safetensors')\""
)
_PICKLE_MAGIC = (b"PK\x03\x04", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


class MissingFileError(FileNotFoundError, ValueError):
    """A file a model folder needs is not there (both FileNotFoundError and ValueError)."""


# --------------------------------------------------------------------------- reading


@overload
def read_json(
    path: str | os.PathLike[str], *, what: str = ..., expect: type[dict] = ...
) -> dict[str, Any]: ...


@overload
def read_json(
    path: str | os.PathLike[str], *, what: str = ..., expect: type[list]
) -> list[Any]: ...


def read_json(
    path: str | os.PathLike[str], *, what: str = "JSON file", expect: type = dict
) -> dict[str, Any] | list[Any]:
    """The JSON object in ``path`` (or, with ``expect=list``, the JSON list).

    Raises:
        MissingFileError: If ``path`` does not exist.
        ValueError: If it is a folder, not UTF-8, not JSON, or not a JSON object (a list);
            the message names the file.
    """
    if expect not in (dict, list):
        raise ValueError(f"read_json: expect must be dict or list, got {expect!r}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: a folder, expected a {what}")
    if not path.exists():
        raise MissingFileError(f"{path}: missing; expected a {what}")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:  # unreadable: permissions, a device, ...
        raise ValueError(f"{path}: cannot read it ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); "
            f"expected a {what}"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a valid JSON file ({err}); expected a {what}") from None
    if not isinstance(data, expect):
        shape = "a JSON object {...}" if expect is dict else "a JSON list [...]"
        raise ValueError(f"{path}: expected {shape} ({what}), got {_json_type(data)}")
    return data


def _json_type(value: Any) -> str:
    names = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }
    return "a null" if value is None else names.get(type(value), type(value).__name__)


RUN_MODELS = ("best", "last")  # the model folders inside a training run's folder
# The lock file every training run leaves in its folder (training.run_folder's LOCK_FILE; this
# module sits below training).
RUN_LOCK_FILE = ".attnkit.lock"


def read_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``config.json`` of a model folder, as a dict (see :func:`read_json` for errors)."""
    folder = Path(folder)
    check_folder(folder)
    try:
        return read_json(folder / CONFIG_FILE, what=f"model {CONFIG_FILE}")
    except MissingFileError as err:
        # `attnkit train --out RUN` keeps its models in RUN/best and RUN/last.
        runs = [
            str(folder / name) for name in RUN_MODELS if (folder / name / CONFIG_FILE).is_file()
        ]
        if not runs:
            raise
        raise MissingFileError(
            f"{err}; {folder} looks like a training run folder: its models are {' and '.join(runs)}"
        ) from None


def check_folder(folder: Path) -> None:
    """Raises a ValueError naming ``folder`` unless it is an existing folder."""
    if not folder.is_dir():
        error = ValueError if folder.exists() else MissingFileError
        state = "a file" if folder.exists() else "does not exist"
        hint = "" if folder.exists() else " (attnkit reads folders on disk; it downloads nothing)"
        raise error(
            f"{folder}: not a folder ({state}); expected a model folder with {CONFIG_FILE} and "
            f"{WEIGHTS_FILE}{hint}"
        )


def folder_kind(config: Mapping[str, Any]) -> str:
    """What a ``config.json`` describes: ``"translation"`` (attnkit's format, a checkpoint
    included), a Hugging Face ``model_type`` such as ``"bert"``, ``"gpt2"`` (attnkit's GPT
    folders and language-model checkpoints are GPT-2 folders), ``"llama"``, ``"mistral"`` or
    ``"qwen2"`` (GPTs with Llama's options), or ``"unknown"``.

    This is the one rule that tells model folders apart; :func:`model_kind` applies it to a
    folder and :func:`attnkit.pretrained_loading.load_pretrained` loads by it."""
    if isinstance(config.get("model"), Mapping) or "num_encoder_layers" in config:
        return "translation"
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type:
        return model_type.lower()
    architectures = config.get("architectures") or []
    if any("Bert" in str(a) for a in architectures):
        return "bert"
    if any("GPT2" in str(a) for a in architectures):
        return "gpt2"
    for kind, name in (("llama", "Llama"), ("mistral", "Mistral"), ("qwen2", "Qwen2")):
        if any(str(a).startswith(f"{name}For") for a in architectures):
            return kind
    return "unknown"


# What each kind of folder is for, for the message when a folder of another kind is given.
KIND_USES = {
    "translation": "an attnkit translation model folder; use `attnkit translate --model DIR` "
    "or `attnkit attention --model DIR`",
    "bert": "a Hugging Face BERT folder; use `attnkit embed --model DIR` or "
    "`attnkit attention --model DIR`",
    **{
        kind: f"{what}; use `attnkit generate --model DIR`, "
        "`attnkit evaluate --model DIR --text FILE` or `attnkit attention --model DIR`"
        for kind, what in (
            ("gpt2", "a GPT-2 folder (Hugging Face's or an attnkit language model)"),
            ("llama", "a Hugging Face Llama folder"),
            ("mistral", "a Hugging Face Mistral folder"),
            ("qwen2", "a Hugging Face Qwen2 folder"),
        )
    },
}
# The kinds of folder that hold a decoder-only language model (attnkit.models.GPT reads them
# all: GPT-2's layout, and Llama's options for the other three).
GPT_KINDS = ("gpt2", "llama", "mistral", "qwen2")
# The kinds of folder attnkit loads (attnkit.pretrained_loading.load_pretrained).
LOADABLE_KINDS = ("translation", "bert", *GPT_KINDS)


def model_kind(folder: str | os.PathLike[str]) -> str:
    """The kind of model in ``folder``: ``"translation"``, ``"bert"`` or one of
    :data:`GPT_KINDS` (``"gpt2"``, ``"llama"``, ``"mistral"``, ``"qwen2"``), by its
    ``config.json`` (:func:`folder_kind`). A config that does not say (TransformerConfig fields
    at the top level, an old attnkit layout) is read as translation.

    Raises:
        ValueError: If the folder or its ``config.json`` is missing or unreadable (naming the
            file), or it describes a kind attnkit does not load.
    """
    folder = Path(folder)
    kind = expect_kind(folder, read_config(folder), *LOADABLE_KINDS, allow_unknown=True)
    return "translation" if kind == "unknown" else kind


def expect_kind(
    folder: str | os.PathLike[str],
    config: Mapping[str, Any],
    *kinds: str,
    allow_unknown: bool = False,
) -> str:
    """``folder_kind(config)`` if it is one of ``kinds`` (or ``"unknown"``, with
    ``allow_unknown``: a config that does not say); otherwise a ValueError saying what the
    folder is and what reads it."""
    kind = folder_kind(config)
    if kind in kinds or (allow_unknown and kind == "unknown"):
        return kind
    path = Path(folder) / CONFIG_FILE
    wanted = " or ".join([", ".join(kinds[:-1]), kinds[-1]] if len(kinds) > 2 else kinds)
    if kind in KIND_USES:
        raise ValueError(f"{path}: this is {KIND_USES[kind]}; expected a {wanted} model folder")
    if kind != "unknown":  # a model_type attnkit has no model for
        raise ValueError(
            f"{path}: model_type {config.get('model_type')!r} is not one attnkit reads; expected "
            f"a {wanted} model folder (attnkit reads the model_type values "
            f"{sorted(('bert', *GPT_KINDS))} and its own translation folders)"
        )
    raise ValueError(
        f'{path}: not a {wanted} model config (no "model" section and no model_type; '
        f"top-level keys {sorted(config)[:12]})"
    )


def weights_path(folder: str | os.PathLike[str]) -> Path:
    """``folder/model.safetensors``; a clear error when only pickled weights are there."""
    folder = Path(folder)
    path = folder / WEIGHTS_FILE
    if path.is_file():
        return path
    for name in PICKLE_WEIGHTS_FILES:
        if (folder / name).is_file():
            raise ValueError(
                f"{folder / name}: pickled weights, not {WEIGHTS_FILE}; "
                + _CONVERT.format(name=name)
            )
    if path.is_dir():
        raise ValueError(f"{path}: a folder, expected the weights file")
    index = folder / f"{WEIGHTS_FILE}.index.json"
    if index.is_file():  # Hugging Face's sharded checkpoint (model-00001-of-0000N.safetensors)
        raise ValueError(
            f"{index}: a sharded checkpoint; attnkit reads one {WEIGHTS_FILE}: merge the "
            "shards, e.g. `transformers`' save_pretrained(folder, max_shard_size='100GB')"
        )
    raise MissingFileError(
        f"{path}: missing; no weights in {folder} (looked for {WEIGHTS_FILE} or "
        "pytorch_model.bin; pickled weights are refused with a conversion command)"
    )


def read_weights(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """The tensors of a safetensors file, or of a folder's ``model.safetensors``, on the CPU.

    Raises:
        MissingFileError: If there is no weights file.
        ValueError: If the file is empty, truncated or corrupt, or is a pickle (a
            ``torch.save`` file) under the safetensors name; nothing is unpickled.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if path.is_dir():
        path = weights_path(path)
    elif not path.exists():
        raise MissingFileError(f"{path}: missing; expected the model's weights ({WEIGHTS_FILE})")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:  # unreadable: permissions, a device, ...
        raise ValueError(f"{path}: cannot read it ({err.strerror or err})") from None
    if size == 0:
        raise ValueError(f"{path}: empty (0 bytes); expected safetensors weights")
    if head.startswith(_PICKLE_MAGIC):
        raise ValueError(
            f"{path}: a PyTorch pickle (torch.save) file, not safetensors; "
            + _CONVERT.format(name=path.name)
        )
    try:
        return load_file(path)
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise ValueError(
            f"{path}: not a readable safetensors file ({err}; {size} bytes): truncated or corrupt"
        ) from None


def weights_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The string metadata in a safetensors header (empty when the file is unreadable)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(os.fspath(path), "pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, RuntimeError, ValueError):
        return {}


def tie_groups(model: nn.Module) -> list[list[str]]:
    """The state-dict names that share one tensor (tied weights), groups of two or more."""
    groups: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _names(keys: Iterable[str], most: int = 8) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - most} more" if len(keys) > most else ""
    return f"{keys[:most]}{more}"


_FLOATING = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def floating_dtype(dtype: torch.dtype | str, name: str = "dtype") -> torch.dtype:
    """``dtype`` as a floating-point ``torch.dtype``: the dtype itself, or its name as torch
    spells it (``"float32"``, ``"bfloat16"``, ``"float16"``, ``"float64"``, also ``"half"``,
    ``"torch.bfloat16"``): the one reading of a dtype that loaders, ``init_cache`` and the
    commands' ``--dtype`` share. torch itself reads a string in ``.to()`` as a device ("Invalid
    device string: 'bfloat16'").

    Raises:
        ValueError: naming ``name``, for anything else ("fp32", an integer dtype).
    """
    found = dtype
    if isinstance(dtype, str):
        found = getattr(torch, dtype.removeprefix("torch."), None)
    if found in _FLOATING:  # not the float8 kinds: no model runs its products in them
        return found
    raise ValueError(
        f"{name}: expected a floating-point torch.dtype or its name (float32, bfloat16, float16 "
        f"or float64, with or without 'torch.'), got {dtype!r}"
    )


def _shape_error(name: str, stored: Tensor, wanted: Tensor, in_file) -> str:
    """``name: file (shape), model (shape)``, in the file's name and layout when it has its own
    (``in_file``: (its name, stored transposed))."""
    if in_file is None:
        return f"{name}: file {tuple(stored.shape)}, model {tuple(wanted.shape)}"
    key, transposed = in_file
    flip = (lambda shape: tuple(reversed(shape))) if transposed else tuple
    return f"{key}: file {flip(stored.shape)}, model {flip(wanted.shape)} (attnkit's {name})"


def nonfinite_tensors(tensors: Mapping[str, Tensor]) -> list[str]:
    """The names of the floating tensors holding a NaN or an infinity, in order (one read
    from the device for all of them)."""
    floats = [(name, t) for name, t in tensors.items() if t.is_floating_point()]
    if not floats:
        return []
    finite = torch.stack([torch.isfinite(t).all() for _, t in floats]).tolist()
    return [name for (name, _), ok in zip(floats, finite, strict=True) if not ok]


def describe_nonfinite(name: str, tensor: Tensor) -> str:
    """``"'NAME' (2 NaN, 0 inf of 64 values)"``."""
    nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
    return f"{name!r} ({nan} NaN, {inf} inf of {tensor.numel()} values)"


# What check_finite says of weights a model is loaded from.
USE_NONFINITE = "these weights cannot be used (a run that diverged, or a damaged file)"


def check_finite(
    tensors: Mapping[str, Tensor], source: str | os.PathLike[str], *, use: str
) -> None:
    """Raises ValueError naming ``source`` (the weights file) and the first of ``tensors``
    that holds NaN or inf (a run that diverged, or a damaged file), then ``use``: what these
    weights cannot be used for."""
    bad = nonfinite_tensors(tensors)
    if bad:
        first = f"tensor {describe_nonfinite(bad[0], tensors[bad[0]])}"
        what = (
            f"{first} and {len(bad) - 1} other tensor(s) hold" if len(bad) > 1 else f"{first} holds"
        )
        raise ValueError(f"{os.fspath(source)}: {what} NaN or inf; {use}")


def load_state_dict_into(
    model: nn.Module,
    state: Mapping[str, Tensor],
    *,
    source: str | os.PathLike[str],
    against: str = "the model",
    dtype: torch.dtype | str | None = None,
    assign: bool = False,
    file_names: Mapping[str, tuple[str, bool]] | None = None,
) -> nn.Module:
    """Loads ``state`` into ``model``, strictly, with errors that name ``source``.

    A tied tensor may be stored under any one of its names; the others are filled from it
    (and must be equal when stored too). Stored floating dtypes are cast to the model's
    (bfloat16 weights into a float32 model); a non-floating tensor for a floating parameter
    is an error.

    Args:
        model: The model whose parameters and buffers are filled.
        state: name -> tensor, in the model's names (map foreign names first).
        source: The file the tensors came from, for messages.
        against: What the model was built from, for messages (e.g. its config.json).
        dtype: Cast the model to this floating dtype (or its name, :func:`floating_dtype`)
            after loading.
        assign: Take the stored tensors as the parameters instead of copying (faster for a
            model built without initialisation); refused for models with tied weights.
        file_names: the model's name -> (the file's name, stored transposed) where they
            differ (a Hugging Face GPT-2's Conv1D weights), so that a shape error names the
            tensor and the shape the file holds.

    Returns:
        ``model``.

    Raises:
        ValueError: On missing, unexpected, mis-shaped or non-floating tensors, or tied tensors
            that differ in the file.
    """
    dtype = None if dtype is None else floating_dtype(dtype)
    prefix = f"{source}: weights do not match the model"
    if against != "the model":
        prefix = f"{source}: does not match {against}; weights do not match the model"
    state = dict(state)
    groups = tie_groups(model)
    for names in groups:
        present = [n for n in names if n in state]
        if not present:
            continue
        first = state[present[0]]
        for other in present[1:]:
            if state[other].shape != first.shape or not torch.equal(state[other], first):
                raise ValueError(
                    f"{source}: {present[0]!r} and {other!r} are tied in the model but differ "
                    "in the file"
                )
        for name in names:
            state.setdefault(name, first)
    expected = model.state_dict()
    missing = expected.keys() - state.keys()
    unexpected = state.keys() - expected.keys()
    if missing or unexpected:
        raise ValueError(
            f"{prefix}: missing keys {_names(missing)}, unexpected keys {_names(unexpected)}"
        )
    wrong = [
        _shape_error(k, v, expected[k], (file_names or {}).get(k))
        for k, v in state.items()
        if v.shape != expected[k].shape
    ]
    if wrong:
        raise ValueError(f"{prefix}: shapes differ: {wrong[:8]}")
    not_float = [
        f"{k}: {v.dtype}"
        for k, v in state.items()
        if expected[k].is_floating_point() and not v.is_floating_point()
    ]
    if not_float:
        raise ValueError(f"{source}: expected floating-point tensors, got {not_float[:8]}")
    if assign and groups:
        raise ValueError("assign=True would untie the model's tied weights")
    model.load_state_dict(state, strict=True, assign=assign)  # copy_ casts the dtype
    if dtype is not None:
        model.to(dtype)
    return model


def load_weights(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    against: str = "the model",
    dtype: torch.dtype | str | None = None,
) -> nn.Module:
    """:func:`read_weights` of ``path`` (a file or folder), then :func:`load_state_dict_into`."""
    path = Path(path)
    source = weights_path(path) if path.is_dir() else path
    return load_state_dict_into(
        model, read_weights(source), source=source, against=against, dtype=dtype
    )


# --------------------------------------------------------------------------- writing


def write_bytes(path: str | os.PathLike[str], data: bytes | memoryview) -> None:
    """Writes ``data`` to ``path`` (not atomic: use inside :func:`atomic_folder`).

    Raises:
        OSError: If writing fails (e.g. a full disk), naming ``path``.
    """
    try:
        Path(path).write_bytes(data)
    except OSError as err:
        if err.errno is not None and err.filename is None:  # write() names no file
            raise OSError(err.errno, err.strerror, os.fspath(path)) from err
        raise


def write_json(path: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    """Writes ``data`` as indented JSON (not atomic: use inside :func:`atomic_folder`)."""
    write_bytes(path, (json.dumps(data, indent=2) + "\n").encode("utf-8"))


def write_weights(
    path: str | os.PathLike[str],
    weights: nn.Module | Mapping[str, Tensor],
    *,
    dtype: torch.dtype | None = None,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Writes a model's (or a state dict's) tensors as safetensors.

    Tensors that share memory (tied weights) are stored once, under the first name; loaders
    fill the others (:func:`load_state_dict_into`). The header carries ``{"format": "pt",
    "writer": "attnkit"}`` plus ``metadata``. The file gets the mode a new file gets under the
    umask (:func:`attnkit.files.default_file_mode`), like the folder's other files. Not atomic:
    use inside :func:`atomic_folder`.

    Args:
        path: The file.
        weights: A module (its ``state_dict()``) or name -> tensor.
        dtype: Cast floating tensors to this dtype (e.g. bfloat16 to halve the file).
        metadata: More string key/values for the header.

    Raises:
        OSError: If the file cannot be written (e.g. a full disk), naming ``path``.
    """
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    state = weights.state_dict() if isinstance(weights, nn.Module) else dict(weights)
    kept: dict[str, Tensor] = {}
    seen: dict[tuple, str] = {}
    storages: dict[int, int] = {}
    for name, tensor in state.items():
        tensor = tensor.detach()
        key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tensor.stride(),
            tensor.dtype,
        )
        if key in seen:
            continue  # an alias of a tensor already kept
        seen[key] = name
        storages[key[0]] = storages.get(key[0], 0) + 1
        kept[name] = tensor
    out = {}
    for name, tensor in kept.items():
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensor = tensor.to("cpu").contiguous()
        # save_file refuses two tensors on one storage (e.g. views of one buffer): copy those.
        if storages.get(tensor.untyped_storage().data_ptr(), 0) > 1:
            tensor = tensor.clone()
        out[name] = tensor
    try:
        save_file(
            out, os.fspath(path), metadata={"format": "pt", **(metadata or {}), WRITER_KEY: WRITER}
        )
    except SafetensorError as err:
        # A failed write (a full disk: "... I/O error: No space left on device (os error 28)")
        # becomes the OSError it is, naming the file, so that callers and the command line
        # treat it like any failed write.
        found = _OS_ERROR.search(str(err))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), os.fspath(path)) from err
    # safetensors creates the file with mode 0o600; give it the mode of the folder's other
    # files (what open() gives under the umask), so a shared model folder is readable alike.
    os.chmod(path, default_file_mode())


# How safetensors' (Rust) I/O errors end: the operating system's error number.
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Writes a file whole or not at all: :func:`attnkit.files.write_file` (a temporary file in
    the same folder, fsync, ``os.replace``, the folder fsynced)."""
    write_file(path, text)


def is_attnkit_folder(folder: str | os.PathLike[str], extra_files: Iterable[str] = ()) -> bool:
    """Whether ``folder`` is one attnkit wrote: see :func:`check_replaceable`."""
    return _unrecognised(Path(folder), frozenset(extra_files)) is None


def replace_refusal(folder: str | os.PathLike[str], extra_files: Iterable[str] = ()) -> str | None:
    """Why :func:`check_replaceable` refuses ``folder`` (e.g. ``"it holds ['notes.txt'],
    which attnkit does not write"``), or None when it may be replaced."""
    return _unrecognised(Path(folder), frozenset(extra_files))


def foreign_entries(folder: str | os.PathLike[str], extra_files: Iterable[str] = ()) -> list[str]:
    """The names in ``folder`` that attnkit does not write into a model folder (anything but
    the regular files of :data:`FOLDER_FILES` and ``extra_files``), sorted; empty when
    ``folder`` is not a folder."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return []
    allowed = FOLDER_FILES | frozenset(extra_files)
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.name not in allowed or not p.is_file() or p.is_symlink()
    )


def is_run_folder(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` is a training run's folder (``attnkit train --out``): it holds the
    run's lock file or a ``best``/``last`` model folder."""
    folder = Path(folder)
    return (folder / RUN_LOCK_FILE).is_file() or any(
        (folder / name / CONFIG_FILE).is_file() for name in RUN_MODELS
    )


def _unrecognised(folder: Path, extra: frozenset[str]) -> str | None:
    """Why ``folder`` is not a replaceable attnkit folder, or None if it is (or is absent)."""
    if folder.is_symlink():
        return "a symbolic link"
    if not folder.exists():
        return None
    if not folder.is_dir():
        return "a file, not a folder"
    if not any(folder.iterdir()):
        return None
    foreign = foreign_entries(folder, extra)
    if foreign and is_run_folder(folder):
        return f"it is a training run folder (it holds {_names(foreign, 5)}), not a model folder"
    if foreign:
        return f"it holds {_names(foreign, 5)}, which attnkit does not write"
    if _has_attnkit_marks(folder):
        return None
    return (
        f'neither attnkit\'s writer mark in {WEIGHTS_FILE} nor its "model" section in {CONFIG_FILE}'
    )


def _has_attnkit_marks(folder: Path) -> bool:
    """Weights with attnkit's writer mark, or a ``config.json`` with attnkit's ``"model"``
    section (its translation layout, written before the writer mark)."""
    weights = folder / WEIGHTS_FILE
    if weights.is_file() and weights_metadata(weights).get(WRITER_KEY) == WRITER:
        return True
    try:
        return isinstance(read_json(folder / CONFIG_FILE).get("model"), Mapping)
    except ValueError:
        return False


def _written_by_attnkit(folder: Path) -> bool:
    """A model folder attnkit wrote, whatever else it now holds: weights and config, with
    attnkit's marks (:func:`_has_attnkit_marks`)."""
    if not ((folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()):
        return False
    try:
        return _has_attnkit_marks(folder)
    except (ValueError, OSError):  # unreadable weights: not one to protect by this rule
        return False


def _guarding_folder(path: str | os.PathLike[str]) -> tuple[Path, bool] | None:
    """The nearest folder above ``path`` (resolved) that nothing else may be written into:
    ``(folder, True)`` for a model folder attnkit wrote, ``(folder, False)`` for a run's kept
    checkpoints (``steps/`` beside ``last`` or ``best``); None when there is none."""
    target = Path(path).resolve()
    for parent in target.parents:
        if _written_by_attnkit(parent):
            return parent, True
        if parent.name == "steps" and any((parent.parent / n).is_dir() for n in RUN_MODELS):
            return parent, False
    return None


def _check_unguarded(path: str | os.PathLike[str], prefix: str, advice: str) -> None:
    """Raises a ValueError ``"{prefix} {the folder}, {why}; {advice}"`` when a folder above
    ``path`` is one :func:`_guarding_folder` finds."""
    found = _guarding_folder(path)
    if found is None:
        return
    parent, is_model = found
    if is_model:
        why = (
            f"the model folder {os.fspath(parent)!r}, which must hold its own files only (a run "
            "could no longer resume from it or save it)"
        )
    else:
        why = f"{os.fspath(parent)!r}, the checkpoints a run keeps for `attnkit average`"
    raise ValueError(f"{prefix} {why}; {advice}")


def check_outside_models(path: str | os.PathLike[str], what: str) -> None:
    """Raises a ValueError naming ``path`` when a folder above it is a model folder attnkit
    wrote (a run's ``last`` or ``best``, a kept or averaged checkpoint, a shipped model) or a
    run's kept checkpoints (``steps/`` beside ``last`` or ``best``). A folder written there is
    a stray entry in it: the run that owns it could no longer resume (``last`` unreadable) or
    save (``best`` not replaceable). Folders of other tools (a Hugging Face model repository
    with a project inside) are not attnkit's to guard."""
    _check_unguarded(path, f"{what} {os.fspath(path)!r}: inside", "choose a folder outside it")


def check_output_file(
    path: str | os.PathLike[str], flag: str, *, model: str | os.PathLike[str] | None = None
) -> None:
    """The rule for every file a command writes where the user says (``translate --output``,
    ``attention --out``, ``walkthrough --plot``): never inside ``model``, the model folder the
    command reads (of any kind: its files are inputs too; a folder without ``config.json`` is
    none, and the command's loading says so), nor inside a folder
    :func:`check_outside_models` guards (a model folder attnkit wrote, such as a run's
    ``best`` or ``last``, or a run's kept checkpoints). A file there would change the model,
    or stop its run from resuming or saving it. Symbolic links are followed.

    Raises:
        ValueError: Naming ``flag``, ``path`` and the folder.
    """
    given = os.fspath(path)
    # Not a model folder (no config.json): loading it fails, and that error is the one to give.
    if model is not None and (Path(model) / CONFIG_FILE).is_file():
        folder = Path(os.path.realpath(model))
        if folder in Path(os.path.realpath(path)).parents:
            raise ValueError(
                f"{flag}: {given!r} is inside the model folder {str(folder)!r}; writing there "
                "would change the model: choose another place"
            )
    _check_unguarded(path, f"{flag}: {given!r} is inside", "choose another place")


def check_replaceable(
    folder: str | os.PathLike[str], *, what: str = "output folder", extra_files: Iterable[str] = ()
) -> None:
    """Raises a ValueError unless ``folder`` may be replaced: it is absent, empty, or a folder
    attnkit wrote (only :data:`FOLDER_FILES` and ``extra_files`` in it, and weights with
    attnkit's writer mark or a ``config.json`` with attnkit's ``"model"`` section)."""
    folder = Path(folder)
    reason = replace_refusal(folder, extra_files)
    if reason is not None:
        advice = "give a new folder or one attnkit wrote"
        if not folder.is_symlink() and folder.is_dir() and is_run_folder(folder):
            advice = "give a new folder (a run folder is never replaced)"
        raise ValueError(
            f"{what} {os.fspath(folder)!r}: refusing to replace it: {reason}; {advice}"
        )


@contextmanager
def atomic_folder(
    folder: str | os.PathLike[str], *, what: str = "output folder", extra_files: Iterable[str] = ()
) -> Iterator[Path]:
    """Yields an empty temporary folder beside ``folder``; on a clean exit puts it in place of
    ``folder`` atomically (module docstring). On an exception the temporary folder is removed
    and ``folder`` is untouched.

    Raises:
        ValueError: Before anything is written, if ``folder`` exists and is not one attnkit
            wrote (:func:`check_replaceable`), or its parent cannot be written; after the
            writes, if they put a file in the folder that is not in :data:`FOLDER_FILES` or
            ``extra_files`` (the folder would no longer be recognised).
        OSError: If writing or flushing a file fails (e.g. a full disk), naming ``folder``
            (and the file in it); ``folder`` is untouched.
    """
    folder = Path(folder)
    extra = frozenset(extra_files)
    check_replaceable(folder, what=what, extra_files=extra)
    tmp, old = temp_beside(folder, what)
    try:
        yield tmp
        stray = sorted(p.name for p in tmp.iterdir() if p.name not in FOLDER_FILES | extra)
        if stray:
            raise ValueError(f"atomic_folder: {stray} are not model-folder files; pass extra_files")
        for path in tmp.iterdir():
            _fsync_file(path)
        fsync_folder(tmp, strict=True)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        named = _naming_folder(err, folder, tmp)
        if named is err:
            raise
        raise named from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_folder(tmp, folder, old, what)
    _remove_stale(folder, extra)


def _naming_folder(err: OSError, folder: Path, tmp: Path) -> OSError:
    """``err`` naming ``folder`` (the folder being written) where it named nothing or a file
    in the temporary folder; the file inside is kept in the message. ``err`` itself when it
    names a file elsewhere (e.g. one being read), has no error number, or is also a
    ValueError (:class:`MissingFileError`)."""
    if err.errno is None or isinstance(err, ValueError):
        return err
    inside = None
    if err.filename is not None:
        try:
            inside = Path(os.fsdecode(err.filename)).relative_to(tmp)
        except ValueError:
            return err
    text = err.strerror or os.strerror(err.errno)
    if inside is not None and inside.parts:
        text = f"{text} (writing {inside})"
    return OSError(err.errno, text, os.fspath(folder))


def _remove_stale(folder: Path, extra: frozenset[str]) -> None:
    """Deletes ``NAME.tmp-<pid>`` / ``NAME.old-<pid>`` left by killed writers, once ``folder``
    is in place; only folders holding nothing but model-folder files."""
    allowed = FOLDER_FILES | extra
    for stale in folder.parent.glob(f"{glob_escape(folder.name)}.*-*"):
        if not (stale.is_dir() and _STALE.fullmatch(stale.name[len(folder.name) :])):
            continue
        if all(p.name in allowed and p.is_file() for p in stale.iterdir()):
            shutil.rmtree(stale, ignore_errors=True)


def glob_escape(name: str) -> str:
    """``name`` with glob metacharacters escaped."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def old_versions(folder: str | os.PathLike[str]) -> list[Path]:
    """The complete ``NAME.old-<pid>`` folders left by a writer killed between its two renames."""
    folder = Path(folder)
    return sorted(
        p
        for p in folder.parent.glob(f"{glob_escape(folder.name)}.old-*")
        if p.is_dir() and _STALE.fullmatch(p.name[len(folder.name) :])
    )


def recover_folder(
    folder: str | os.PathLike[str],
    marker: str = WEIGHTS_FILE,
    newest: Callable[[Path], Any] | None = None,
) -> Path | None:
    """``folder`` if it holds ``marker``, else its newest ``.old-*`` version holding ``marker``
    (by ``newest(path)``, default the marker's modification time), else None.

    ``.tmp-*`` folders may be partial and are never returned.
    """
    folder = Path(folder)
    if (folder / marker).is_file():
        return folder
    olds = [p for p in old_versions(folder) if (p / marker).is_file()]
    key = newest or (lambda p: (p / marker).stat().st_mtime_ns)
    return max(olds, key=key) if olds else None
