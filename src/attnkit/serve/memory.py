"""Give freed memory back to the operating system when the server goes idle.

After a burst (an overload, a batch of long sentences) the C allocator keeps the pages it
freed in its arenas (glibc keeps one per thread that allocated), so the process's RSS stays
near its peak although Python and torch hold nothing. ``malloc_trim(0)`` returns those pages.
:func:`trim_when_idle` calls it once the server has answered requests and has nothing in
flight; where the C library has no ``malloc_trim`` (not glibc) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable

__all__ = ["trim", "trim_when_idle"]


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        function = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    return function


_TRIM = _malloc_trim()


def trim() -> bool:
    """Return freed heap memory to the system; whether anything was released."""
    return bool(_TRIM(0)) if _TRIM is not None else False


async def trim_when_idle(
    answered: Callable[[], int], in_flight: Callable[[], int], every: float = 2.0
) -> None:
    """Forever: every ``every`` seconds, if requests were answered since the last look and
    none is in flight, :func:`trim` (in a thread). Cancel the task to stop it."""
    seen = answered()
    while True:
        await asyncio.sleep(every)
        count = answered()
        if count != seen and in_flight() == 0:
            seen = count
            await asyncio.to_thread(trim)
