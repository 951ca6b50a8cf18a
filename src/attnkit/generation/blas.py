"""One float32 row times a weight through numpy's OpenBLAS, single-threaded, while generating.

A decoding step at one row multiplies a row by every weight of the model: a matrix-vector
product, bound by how fast the weight streams from memory. Where torch's MKL runs generic code
(AMD CPUs, :func:`attnkit.hardware.mkl_gemv_is_generic`), :mod:`~attnkit.generation.packed`
takes that product on a copy of the weight transposed to (in, out). On such a copy the
OpenBLAS that numpy's wheels ship streams the layers' shapes 1.2-1.6x faster than MKL, one
thread each, while MKL is as fast or faster for an output layer's tens of thousands of columns
(AVX2-only AMD EPYC, weights coming from memory, GB/s; docs/benchmarks.md, "Text generation"):

=====================  ====  ========  ==========================
weight (in, out)       MKL   OpenBLAS  model
=====================  ====  ========  ==========================
768 x 768              13.6  18.7      GPT-2 124M attention output
3072 x 768             14.1  18.8      GPT-2 124M feed-forward out
768 x 3072             19.2  23.6      GPT-2 124M feed-forward in
512 x 512              9.9   14.3      Llama-shaped (benchmarks)
1408 x 512             10.5  15.0      Llama-shaped feed-forward
4096 x 22016           23.3  23.5
1024 x 32000           22.7  21.5      an output layer
768 x 50257            21.8  19.8      GPT-2's output layer
=====================  ====  ========  ==========================

So :func:`row_product` is used for weights with fewer than :data:`MAX_OUT_FEATURES` outputs.

OpenBLAS has its own thread pool, by default one thread per core, whose threads spin after
each call. Beside torch's threads they fight for the cores: a GPT-2 124M step took 117 ms
instead of 32 with both at two threads. So the products run on one OpenBLAS thread (MKL's
matrix-vector product did not use a second thread either): :func:`one_thread` holds every
OpenBLAS of the process at one thread (threadpoolctl) from the first ``with`` block entered
until the last one open exits, then puts the counts back, and :func:`row_product` is taken
only while OpenBLAS runs on one thread (:func:`single_threaded`, asked at every call). Other
numpy products of the process run on one thread meanwhile.

OpenBLAS (its pthreads build, PyPI's) takes a new thread count only from the process's main
thread and ignores one set from any other: a block entered in another thread (a server's
worker) holds nothing, and its products take MKL, unless the main thread holds OpenBLAS
(``attnkit serve`` does, for the server's life) or ``OPENBLAS_NUM_THREADS=1`` is set; a last
block that exits in another thread cannot put the count back either.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor

__all__ = ["MAX_OUT_FEATURES", "available", "one_thread", "row_product", "single_threaded"]

# Below this many output features OpenBLAS's product was the faster (table above): 24,576
# columns and fewer measured faster, 32,000 and more not.
MAX_OUT_FEATURES = 30_000


@functools.cache
def _numpy_blas() -> str:
    """The name of the BLAS numpy was built with ("scipy-openblas" for PyPI's wheels), or ""
    where numpy does not say (numpy before 1.25)."""
    try:
        config = np.show_config(mode="dicts")
        return str(config["Build Dependencies"]["blas"]["name"])
    except (TypeError, KeyError, ValueError):
        return ""


@functools.cache
def _controller():
    """threadpoolctl's controller of the OpenBLAS libraries loaded (numpy's among them), or
    None when there is none."""
    from threadpoolctl import ThreadpoolController

    openblas = ThreadpoolController().select(internal_api="openblas")
    return openblas if openblas.lib_controllers else None


def available() -> bool:
    """Whether numpy multiplies float32 with an OpenBLAS whose threads can be held at one."""
    return "openblas" in _numpy_blas().lower() and _controller() is not None


_LOCK = threading.Lock()
_HOLDERS = 0  # with blocks of one_thread open, in every thread
_LIMITER = None  # threadpoolctl's limiter while they are, to put the counts back


@contextmanager
def one_thread() -> Iterator[None]:
    """Hold OpenBLAS at one thread for the block (module docstring); blocks may nest and
    overlap across threads. Does nothing where :func:`available` is False, and holds nothing
    when entered outside the main thread while no other block is open there."""
    global _HOLDERS, _LIMITER
    if not available():
        yield
        return
    with _LOCK:
        if _HOLDERS == 0:
            _LIMITER = _controller().limit(limits=1)
        _HOLDERS += 1
    try:
        yield
    finally:
        with _LOCK:
            _HOLDERS -= 1
            if _HOLDERS == 0:
                _LIMITER.restore_original_limits()
                _LIMITER = None


def single_threaded() -> bool:
    """Whether numpy's OpenBLAS runs on one thread now (:func:`one_thread`, or
    ``OPENBLAS_NUM_THREADS=1``), so that :func:`row_product` does not fight torch's threads."""
    controller = _controller() if available() else None
    return controller is not None and all(
        lib.get_num_threads() == 1 for lib in controller.lib_controllers
    )


def row_product(row: Tensor, weight_t: np.ndarray, bias: Tensor | None) -> Tensor:
    """``row @ weight_t + bias`` through numpy's BLAS.

    Args:
        row: (1, in) float32 on the CPU, without autograd.
        weight_t: the weight as a contiguous (in, out) float32 array.
        bias: (out,) or None.

    Returns:
        (1, out) float32, a new tensor.
    """
    out = torch.from_numpy(np.matmul(row.contiguous().numpy(), weight_t))  # (1, out)
    return out if bias is None else out.add_(bias)
