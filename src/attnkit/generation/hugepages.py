"""CPU tensors in memory the kernel backs with 2 MiB pages, for weights streamed every step.

A decoding step at one row reads every weight of the model once, front to back: a stream of
hundreds of megabytes a token, cut into 4 KiB pages. Linux maps memory in 2 MiB pages
("transparent huge pages") where a program asks for it with ``madvise(MADV_HUGEPAGE)``; that is
the default setting of many distributions (``/sys/kernel/mm/transparent_hugepage/enabled``
reads ``[madvise]``), and then none of torch's memory gets them. On the AVX2-only AMD EPYC (one
thread, weights coming from memory), the (in, out) weight copies that
:mod:`~attnkit.generation.packed` streams at one row were read faster on 2 MiB pages
(docs/benchmarks.md, "Text generation", fifteenth session):

==========================  ==============  ==============
weight (in, out)            OpenBLAS, GB/s  MKL, GB/s
==========================  ==============  ==============
768 x 2304                  20.4 -> 24.7    17.3 -> 20.7
768 x 768                   18.5 -> 20.9    14.6 -> 15.5
3072 x 768                  18.2 -> 22.1    14.6 -> 17.0
256 x 768                   17.7 -> 20.8    12.0 -> 15.7
256 x 50257                 22.3 -> 23.7    24.9 -> 25.7
==========================  ==============  ==============

A step's products in sequence (each layer's, then the output layer's) took 5-8% less time
(GPT-2 124M 24.8 -> 23.4 ms, the Llama shape 7.6 -> 7.0 ms, the small GPT 3.3 -> 3.1 ms) and
whole decoding steps 2-4% less (the rest of a step is not the weights).

:func:`empty` allocates such memory: an anonymous private mapping, advised for huge pages,
with the tensor starting on a 2 MiB boundary, or, for tensors smaller than 16 MiB (GPT-2
124M's layers, the small GPT's and the Llama shape's), a slice of a shared mapping of 16 MiB,
so that they fill whole huge pages between them. Where that cannot be had (not Linux, or the
setting is ``never``) it returns ``torch.empty``. The kernel may still back the range with
small pages (no free 2 MiB block); the tensor is correct either way, only the speed differs.
A mapping is unmapped when the last tensor in it (and every view of one) is freed: a small
tensor that outlives the others of its mapping keeps up to 16 MiB of it in memory.
"""

from __future__ import annotations

import functools
import mmap
import os
import threading
import weakref
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["ALIGN", "ARENA", "HUGE_PAGE", "available", "empty"]

HUGE_PAGE = 2 << 20  # bytes: the x86-64 and arm64 transparent huge page
ARENA = 8 * HUGE_PAGE  # tensors smaller than this share mappings of this size
ALIGN = 64  # bytes: a cache line, the start of every tensor
_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
_QUANTIZED = {
    getattr(torch, name)
    for name in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")
    if hasattr(torch, name)
}


@functools.cache
def available() -> bool:
    """True where a mapping can be advised for huge pages and the kernel may grant them."""
    if not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_ANONYMOUS"):
        return False  # not Linux
    try:
        with open(_SETTING) as f:
            setting = f.read()  # e.g. "always [madvise] never"
    except OSError:
        return False
    return "[never]" not in setting


def _mapping(nbytes: int) -> tuple[mmap.mmap, int] | None:
    """A private anonymous mapping advised for huge pages with ``nbytes`` from a 2 MiB
    boundary on, and the offset of that boundary; None if the system refuses the mapping."""
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE  # one more page, to align
    try:
        mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return None
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        pass  # e.g. a kernel built without transparent huge pages: small pages, still correct
    first = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
    return mapping, -first % HUGE_PAGE


class _Arena:
    """Cuts tensors smaller than :data:`ARENA` from a shared mapping, in turn, and starts a
    new mapping when the next one does not fit. It holds its current mapping only weakly: a
    mapping lives while any tensor cut from it does, and is unmapped with the last of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mapping = lambda: None  # weakref.ref to the current mapping
        self._offset = 0  # its next free byte
        self._end = 0

    def take(self, nbytes: int) -> tuple[mmap.mmap, int] | None:
        with self._lock:
            mapping = self._mapping()
            if mapping is None or self._offset + nbytes > self._end:
                made = _mapping(ARENA)
                if made is None:
                    return None
                mapping, self._offset = made
                self._mapping = weakref.ref(mapping)
                self._end = self._offset + ARENA
            taken = mapping, self._offset
            self._offset += -(-nbytes // ALIGN) * ALIGN
            return taken

    def forget(self) -> None:
        """In a forked child: a fresh lock (another thread of the parent may have held it)."""
        self._lock = threading.Lock()


_ARENA = _Arena()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ARENA.forget)


def empty(shape: Sequence[int], dtype: torch.dtype) -> Tensor:
    """An uninitialized contiguous CPU tensor of ``shape``, on 2 MiB pages where possible.

    A tensor of :data:`ARENA` bytes or more gets a mapping of its own, starting on a 2 MiB
    boundary; smaller ones are cut from shared mappings, each on a 64-byte boundary (a shared
    mapping stays while any tensor cut from it lives). Falls back to ``torch.empty(shape,
    dtype=dtype, device="cpu")`` where huge pages are not :func:`available`, the system
    refuses the mapping, or the dtype is quantized.
    """
    shape = tuple(int(n) for n in shape)
    if dtype in _QUANTIZED:  # torch cannot view such a tensor made by frombuffer
        return torch.empty(shape, dtype=dtype, device="cpu")
    count = 1
    for n in shape:
        count *= n
    nbytes = count * dtype.itemsize
    made = None
    if nbytes > 0 and available():
        made = _mapping(nbytes) if nbytes >= ARENA else _ARENA.take(nbytes)
    if made is None:
        return torch.empty(shape, dtype=dtype, device="cpu")
    mapping, offset = made
    # frombuffer keeps a reference to the mapping for the tensor's life (and its views')
    return torch.frombuffer(mapping, dtype=dtype, count=count, offset=offset).view(shape)
