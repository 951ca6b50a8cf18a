"""Text given to the models, checked once for every entry point: a list of str, each one valid
UTF-8 (a lone surrogate, how undecodable bytes arrive in a str, is refused by name; the
`tokenizers` library would raise a TypeError naming no text). And the tokenizer given with
them: an object, not a name (:func:`check_tokenizer`). And ids given back to a tokenizer to
decode: integers of its vocabulary (:func:`check_ids`), never dropped or rounded.

:class:`~attnkit.decoding.Translator`, :class:`~attnkit.models.BertModel`, the text API of
:mod:`attnkit.generation` and the HTTP server's request bodies check their texts here.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Mapping

import torch

__all__ = ["check_ids", "check_text", "check_texts", "check_tokenizer"]


def check_texts(texts: Iterable[str], name: str, *, item: str = "text") -> list[str]:
    """``texts`` as a list (an iterator is read once), each item a str that a
    `tokenizers.Tokenizer` can encode; every tokenizer here is one (BERT's WordPiece, attnkit's
    subwords, GPT-2's byte-level BPE).

    A str holding a lone surrogate (U+D800-U+DFFF) is not text: it is how undecodable bytes
    arrive (read with ``errors="surrogateescape"``, as Python reads ``argv``), and it has no
    UTF-8 encoding, which `tokenizers` refuses with a TypeError naming no text.

    Args:
        texts: the texts.
        name: the argument, for the errors (``name[i]`` for an item).
        item: what one text is, for the errors ("line").

    Raises:
        TypeError: for a single str, a mapping (its keys would be encoded), something not
            iterable, or an item that is not a str.
        ValueError: for an item with a lone surrogate, naming its index and position.
    """
    if isinstance(texts, str):
        raise TypeError(f"{name}: expected an iterable of strings (one per {item}), got a str")
    if isinstance(texts, Mapping) or not isinstance(texts, Iterable):
        raise TypeError(
            f"{name}: expected an iterable of strings (one per {item}), got {type(texts).__name__}"
        )
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}]: expected a str, got {type(text).__name__}")
        check_text(text, f"{name}[{i}]")
    return texts


def check_text(text: str, name: str | None = None) -> str:
    """``text`` itself, unless it is not a str (a TypeError naming ``name`` and the type given,
    where ``None``, bytes or a list failed deep inside on a missing str method) or holds a lone
    surrogate (U+D800-U+DFFF): a ValueError naming ``name`` (when given) and the character's
    position (1-based)."""
    if not isinstance(text, str):
        raise TypeError(f"{name or 'text'}: expected a str, got {type(text).__name__}")
    if text.isascii():  # the common case, without an encoded copy
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{f'{name}: ' if name else ''}not valid UTF-8 text (a lone surrogate "
            f"U+{ord(text[err.start]):04X} at character {err.start + 1}, how undecodable bytes "
            "arrive in a str)"
        ) from None
    return text


def check_tokenizer(
    tokenizer: object,
    name: str = "tokenizer",
    *,
    instead: str = (
        "None for the model's own tokenizer, or one read from a file "
        "(GPTTokenizer.from_file('FOLDER/tokenizer.json'))"
    ),
) -> None:
    """Refuse a name or path where a tokenizer object is expected (``"gpt2"``, a Hub name, a
    folder): a str has an ``encode`` too (``str.encode``), which failed deep inside with
    "LookupError: unknown encoding".

    Args:
        tokenizer: what was given.
        name: the argument, for the error.
        instead: what to pass instead, for the error.

    Raises:
        TypeError: naming ``name`` and what was given, and saying what to pass instead:
            attnkit downloads nothing.
    """
    if isinstance(tokenizer, (str, bytes, os.PathLike)):
        raise TypeError(
            f"{name}: expected a tokenizer object (with encode and decode), got the "
            f"{type(tokenizer).__name__} {tokenizer!r}; attnkit downloads nothing: pass "
            f"{instead}"
        )


def check_ids(ids, vocab_size: int) -> list[int]:
    """``ids`` (a 1-D integer tensor or a sequence of ints) as a list, each in
    ``[0, vocab_size)``.

    Raises:
        ValueError: naming the first id that is not an integer or not in the vocabulary, or a
            tensor that is not 1-D integers.
    """
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(
                f"ids: expected a 1-D tensor of integer ids, got shape {tuple(ids.shape)} "
                f"dtype {ids.dtype}"
            )
        values = ids.tolist()
    elif isinstance(ids, (str, bytes)):
        raise ValueError(f"ids: expected a sequence of integer ids, got {type(ids).__name__}")
    else:
        values = list(ids)
    checked = []
    for position, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"ids[{position}]: expected an integer id, got {value!r}")
        if not 0 <= value < vocab_size:
            raise ValueError(
                f"ids[{position}]: id {value} is outside the vocabulary [0, {vocab_size})"
            )
        checked.append(int(value))  # (a numpy integer becomes a Python int)
    return checked
