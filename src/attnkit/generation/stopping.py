"""Stop strings: find the first of several strings in text that arrives piece by piece."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopStrings"]


class StopStrings:
    """Text in, text out, cut before the first stop string.

    :meth:`feed` returns the part of the text so far that can be shown: everything before a
    stop string once one has appeared (then :attr:`stopped` is True), otherwise everything
    but a trailing piece that could still become a stop string (held back until the next
    piece tells). :meth:`flush` returns what is held back when generation ends without a stop.
    The concatenation of everything returned is the generated text cut at the stop string.

    Args:
        stop_strings: non-empty strings; an empty sequence never stops.
    """

    def __init__(self, stop_strings: Sequence[str]) -> None:
        if isinstance(stop_strings, str):
            raise TypeError(
                f"stop_strings: expected a sequence of strings, got the string {stop_strings!r}"
            )
        for s in stop_strings:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop_strings: expected non-empty strings, got {s!r}")
        self.stop_strings = tuple(stop_strings)
        self.stopped = False
        self._held = ""

    def _held_back(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop_strings:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def feed(self, text: str) -> str:
        """Add ``text``; return what can be shown now ("" after a stop)."""
        if self.stopped:
            return ""
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self.stop_strings) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return buf[: min(hits)]
        keep = self._held_back(buf)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """What is held back, at the end of generation (nothing after a stop)."""
        held, self._held = self._held, ""
        return held
