"""Damaged files for the model-folder tests: JSON that is not an object or not JSON at all,
bad size values, and truncation points. Each loader's tests run these same tables, so every
reader of a model folder is shown to give the same clear errors.
"""

from __future__ import annotations

from pathlib import Path

# (content, regex of the message): valid JSON, but not an object.
NOT_AN_OBJECT = [
    (b"[1, 2]", r"expected a JSON object \{\.\.\.\} .*, got a list"),
    (b"[]", r"got a list"),
    (b'"a string"', r"got a string"),
    (b"42", r"got a number"),
    (b"4.5", r"got a number"),
    (b"null", r"got a null"),
    (b"true", r"got a boolean"),
]
# (content, regex of the message): not JSON, or not UTF-8.
NOT_JSON = [
    (b"{not json", r"not a valid JSON file"),
    (b"", r"not a valid JSON file"),
    (b'{"a": 1', r"not a valid JSON file"),
    (b'{"a": 1}}', r"not a valid JSON file"),
    (b'\xff\xfe{"a": 1}', r"not UTF-8 text \(byte 0xff at offset 0\)"),
    (b'{"name": "caf\xe9"}', r"not UTF-8 text \(byte 0xe9 at offset 13\)"),  # Latin-1 é
]
BAD_JSON = NOT_AN_OBJECT + NOT_JSON

# Values that are not a size: zero, negative, bool, string, float, null, list, too large.
BAD_SIZES = [0, -1, -384, True, False, "384", 384.0, None, [384], 2**20 + 1, 10**12]

# How much of a file to keep: a byte count (negative: all but that many) or a fraction.
TRUNCATIONS = [0, 1, 7, 8, 9, 64, 0.5, -1]


def truncate(path: Path, keep: int | float) -> None:
    """Cuts ``path`` down as :data:`TRUNCATIONS` describes."""
    data = path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep % len(data)
    path.write_bytes(data[:cut])


def poison_weights(path: Path, value: float = float("nan")) -> tuple[str, int]:
    """Write ``value`` (NaN by default, or inf) into the first element of the second stored
    tensor of the safetensors file ``path``, keeping its metadata (attnkit's writer mark);
    returns that tensor's name and size."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    tensors = load_file(path)
    name = sorted(tensors)[1]
    tensors[name].view(-1)[0] = value
    save_file(tensors, path, metadata=metadata)
    return name, tensors[name].numel()
