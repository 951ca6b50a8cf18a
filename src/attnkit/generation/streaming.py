"""Incremental detokenization: text from ids fed one at a time, never half a character.

With a byte-level BPE (GPT-2's) one character may span several tokens, and decoding ids
that end inside a character gives U+FFFD. :class:`IncrementalDetokenizer` decodes a short
window of recent ids and shows new text only when it does not end in U+FFFD, so every piece
it returns is whole characters (the window approach of vLLM's ``detokenize_incrementally``:
the window starts a few tokens back, so tokenizers that drop a leading space when a text
starts with a given token still decode the join correctly). A U+FFFD the model really wrote
(bytes that never become a character) comes out once later tokens follow it, or at
:meth:`flush`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["IncrementalDetokenizer"]

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns ids, fed one at a time, into pieces of text that end on character boundaries.

    Args:
        decode: ids -> text (e.g. a tokenizer's ``decode``), decoding invalid or incomplete
            UTF-8 as U+FFFD.
        context: ids already shown (e.g. the end of the prompt), decoded with the new ids
            but never returned.
    """

    def __init__(self, decode: Callable[[list[int]], str], context: Sequence[int] = ()) -> None:
        self._decode = decode
        self.ids: list[int] = list(context)[-4:]
        self._prefix = 0  # window start
        self._read = len(self.ids)  # ids up to here are shown

    def push(self, token: int) -> str:
        """Add one id; return the new whole characters ("" while a character is incomplete)."""
        self.ids.append(int(token))
        shown = self._decode(self.ids[self._prefix : self._read])
        text = self._decode(self.ids[self._prefix :])
        if len(text) <= len(shown) or text.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return text[len(shown) :]

    def flush(self) -> str:
        """Everything not yet returned, incomplete characters included (as U+FFFD)."""
        shown = self._decode(self.ids[self._prefix : self._read])
        text = self._decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return text[len(shown) :]
