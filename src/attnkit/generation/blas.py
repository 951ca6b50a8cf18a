"""One float32 row times a weight through numpy's OpenBLAS, single-threaded, while generating.

A decoding step at one row multiplies a row by every weight of the model: a matrix-vector
product, bound by how fast the weight streams from memory. Where torch's MKL runs generic code
(AMD CPUs, :func:`attnkit.hardware.mkl_gemv_is_generic`), :mod:`~attnkit.generation.packed`
takes that product on a copy of the weight transposed to (in, out). On such a copy the
OpenBLAS that numpy's wheels ship streamed the GPT-2 and Llama layers' shapes 1.2-1.7x faster
than MKL, one thread each, and output layers of 32,000 columns and more slower (AVX2-only AMD
EPYC, weights coming from memory, GB/s; unmeasured on other CPUs; docs/benchmarks.md, "Text
generation"):

=====================  ====  ========  ==========================
weight (in, out)       MKL   OpenBLAS  model
=====================  ====  ========  ==========================
768 x 2304             18.0  21.3      GPT-2 124M attention input
768 x 768              13.6  18.7      GPT-2 124M attention output
768 x 3072             19.2  23.6      GPT-2 124M feed-forward in
3072 x 768             14.1  18.8      GPT-2 124M feed-forward out
512 x 512              9.9   14.3      Llama-shaped attention
1408 x 512             10.5  15.0      Llama-shaped feed-forward
2048 x 24576           21.8  24.3
1024 x 32000           22.7  21.5      an output layer
768 x 50257            21.8  19.8      GPT-2's output layer
=====================  ====  ========  ==========================

So :func:`row_product` is used for weights with fewer than :data:`MAX_OUT_FEATURES` outputs
and at least :data:`MIN_WEIGHTS` weights (:func:`takes`): a numpy call costs a few
microseconds more than torch's, which test-sized layers do not win back.

One shape reads faster as stored: a weight of at most :data:`DOT_FORM_MAX_OUT` outputs from
inputs at least twice as wide (a small GPT's 1024 -> 256 feed-forward output), whose (in, out)
copy OpenBLAS streamed at 8.6 GB/s. Kept (out, in), each output is the dot product of one
contiguous row with the input, and the numpy view handed to :func:`row_product` is its
transpose (:func:`dot_form`). Time of one product, weight from memory, (in, out) copy against
(out, in) kept, microseconds: 1024 x 256 122 / 84, 768 x 256 86 / 67, 512 x 256 70 / 65;
256 x 256 70 / 90-101 and 1408 x 512 188 / 186 (so the rule stops there); 4096 x 1024
691 / 728. A small GPT's decoding step at one row took 2.0-2.7% less time with it.

OpenBLAS has its own thread pool, by default one thread per core, whose idle threads spin.
Beside torch's threads they fight for the cores: a GPT-2 124M step at one row took 117 ms
through OpenBLAS at two threads against 34 ms through MKL, torch at two threads (MKL's
matrix-vector product ran as fast with one thread as with two). So the products run on one
OpenBLAS thread: :func:`one_thread` holds every OpenBLAS of the process at one thread
(threadpoolctl) from the first ``with`` block entered until the last one open exits, then puts
the counts back, and :func:`row_product` is taken only while OpenBLAS runs on one thread
(:func:`single_threaded`, asked when :func:`~attnkit.generation.packed.packed_linears`
opens). Other numpy products of the process run on one thread meanwhile.

OpenBLAS (0.3.31, its pthreads build, PyPI's) ignores a thread count set outside the main
thread once the main thread has set one: a block entered in another thread (a server's worker)
may then hold nothing, and its products take MKL, unless the main thread holds OpenBLAS
(``attnkit serve`` does, for the server's life) or ``OPENBLAS_NUM_THREADS=1`` is set; a last
block that exits in such a thread cannot put the count back either.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor

from attnkit.hardware import mkl_gemv_is_generic

__all__ = [
    "MAX_OUT_FEATURES",
    "MIN_WEIGHTS",
    "DOT_FORM_MAX_OUT",
    "available",
    "dot_form",
    "one_thread",
    "row_product",
    "single_threaded",
    "takes",
]

# Below this many output features OpenBLAS's product was the faster (table above): 24,576
# columns and fewer measured faster, 32,000 and more not.
MAX_OUT_FEATURES = 30_000
# A numpy call costs a few microseconds more than torch's: a GPT of width 128 (its layers
# 128 x 384 to 128 x 512) decoded 6% slower with them through OpenBLAS, width 256 (256 x 256
# to 256 x 1024) the same (12 layers, one row, 128 tokens), GPT-2 124M and the Llama shape
# (from 512 x 512) 1.1x faster. The line is drawn between: a 256 x 512 layer and larger.
MIN_WEIGHTS = 131_072
# At most this many outputs (from at least twice as many inputs): the weight kept (out, in).
DOT_FORM_MAX_OUT = 256


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
    """Whether one-row products take OpenBLAS here: torch's MKL runs generic code on this CPU
    (elsewhere MKL is the faster, and nothing is held) and numpy multiplies float32 with an
    OpenBLAS whose threads threadpoolctl can hold."""
    return (
        mkl_gemv_is_generic() and "openblas" in _numpy_blas().lower() and _controller() is not None
    )


_LOCK = threading.Lock()
_HOLDERS = 0  # with blocks of one_thread open, in every thread
_LIMITER = None  # threadpoolctl's limiter while they are, to put the counts back


def _forget_holders() -> None:
    """In a forked child: no block of its own is open (the parent's are not its to close)."""
    global _LOCK, _HOLDERS, _LIMITER
    _LOCK, _HOLDERS, _LIMITER = threading.Lock(), 0, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_holders)


@contextmanager
def one_thread() -> Iterator[None]:
    """Hold OpenBLAS at one thread for the block (module docstring); blocks may nest and
    overlap across threads. Does nothing where :func:`available` is False; in a thread other
    than the main one it may hold nothing (module docstring)."""
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


def takes(weight: Tensor) -> bool:
    """Whether a one-row product through ``weight`` (out, in) takes OpenBLAS (module
    docstring), once OpenBLAS is known to run on one thread."""
    return MIN_WEIGHTS <= weight.numel() and weight.shape[0] < MAX_OUT_FEATURES


def dot_form(weight: Tensor) -> bool:
    """Whether a one-row product through ``weight`` (out, in) reads it faster as stored,
    (out, in), than as an (in, out) copy: narrow outputs (at most :data:`DOT_FORM_MAX_OUT`)
    from inputs at least twice as wide (module docstring)."""
    out_features, in_features = weight.shape
    return out_features <= DOT_FORM_MAX_OUT and in_features >= 2 * out_features


def row_product(row: Tensor, weight_t: np.ndarray, bias: Tensor | None) -> Tensor:
    """``row @ weight_t + bias`` through numpy's BLAS.

    Args:
        row: (1, in) float32 on the CPU, without autograd.
        weight_t: the weight as an (in, out) float32 array, C-contiguous, or F-contiguous (the
            transpose of a contiguous (out, in) weight: :func:`dot_form`).
        bias: (out,) or None.

    Returns:
        (1, out) float32, a new tensor.

    Raises:
        ValueError: for a row whose width is not the weight's input width.
    """
    if row.shape[-1] != weight_t.shape[0]:
        raise ValueError(
            f"x: expected {weight_t.shape[0]} input features (the weight's in_features), got "
            f"shape {tuple(row.shape)}"
        )
    # Silent on overflow, as torch's products are (numpy would warn: an error under -W error).
    with np.errstate(all="ignore"):
        out = np.matmul(row.contiguous().numpy(), weight_t)  # (1, out)
    out = torch.from_numpy(out)
    return out if bias is None else out.add_(bias)
