"""attnkit.serve.memory: freed heap pages go back to the system, and only when idle."""

import asyncio
import json
import os
import subprocess
import sys

from attnkit.serve import memory

CHUNK = 64 << 10  # below glibc's mmap threshold: these come from the heap
CHUNKS = 3000  # ~190 MiB

# Run in a process of its own, on glibc's malloc as it starts without settings: an allocator
# in LD_PRELOAD, or GLIBC_TUNABLES or MALLOC_* variables (say glibc.malloc.mmap_threshold=32768,
# which maps each block by itself and unmaps it at free), would change what there is to trim,
# not trim().
_EXPERIMENT = f"""
import ctypes, json
from attnkit.serve import memory

def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc({CHUNK}) for _ in range({CHUNKS})]
for b in blocks:
    ctypes.memset(b, 1, {CHUNK})  # touch every page
# Free every other block: the holes sit below live blocks, so free() cannot shrink the heap
# by itself; they stay in the process until trimmed.
for b in blocks[::2]:
    libc.free(b)
before = rss_mib()
trimmed = memory.trim()
after = rss_mib()
print(json.dumps(dict(trimmed=trimmed, before=before, after=after)))
"""


def test_trim_returns_freed_heap_pages():
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_PRELOAD", "GLIBC_TUNABLES") and not k.startswith("MALLOC_")
    }  # glibc's own settings, old style (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, ...)
    done = subprocess.run(
        [sys.executable, "-c", _EXPERIMENT], env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    freed = CHUNKS // 2 * CHUNK / (1 << 20)
    assert result["trimmed"]
    assert result["before"] - result["after"] > 0.5 * freed, (result, freed)


def test_trims_only_after_answers_and_when_nothing_is_in_flight(monkeypatch):
    state = {"answered": 0, "in_flight": 1, "sleeps": 0}
    trimmed = []
    monkeypatch.setattr(memory, "trim", lambda: trimmed.append(dict(state)))

    async def fake_sleep(seconds):
        state["sleeps"] += 1
        if state["sleeps"] == 3:
            state["answered"] = 5  # answered, but one request is still in flight
        if state["sleeps"] == 6:
            state["in_flight"] = 0
        if state["sleeps"] == 10:
            raise asyncio.CancelledError

    async def run():
        monkeypatch.setattr(memory.asyncio, "sleep", fake_sleep)
        try:
            await memory.trim_when_idle(lambda: state["answered"], lambda: state["in_flight"])
        except asyncio.CancelledError:
            pass

    asyncio.run(run())
    assert len(trimmed) == 1  # once: nothing was answered after it
    assert trimmed[0]["in_flight"] == 0 and trimmed[0]["sleeps"] == 6
