"""Helpers of the OpenBLAS tests (attnkit.generation.blas): the thread counts threadpoolctl
reads, and OpenBLAS at two threads set from the main thread, as on a machine with two cores."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from threadpoolctl import threadpool_limits

from attnkit.generation import blas


def openblas_threads() -> list[int]:
    """The thread count of every OpenBLAS that attnkit holds: those loaded when it first looked
    (numpy's among them; one that another package loads later, scipy's, is not numpy's)."""
    controller = blas._controller()
    if controller is None:
        return []
    return [lib.get_num_threads() for lib in controller.lib_controllers]


@contextmanager
def openblas_at_two_threads(monkeypatch) -> Iterator[None]:
    """OpenBLAS at two threads, set from the main thread (so that a count set from another
    thread is ignored, as in a server), and the rule's CPU check answering "generic MKL", so
    that the one-row products may take OpenBLAS on any CPU. Skips where numpy has no OpenBLAS
    (PyPI's wheels have one) or it cannot run two threads."""
    monkeypatch.setattr(blas, "mkl_gemv_is_generic", lambda: True)
    if not blas.available():
        # Nothing to test: the path does not exist without OpenBLAS (a conda or Accelerate
        # numpy); test_available_needs_generic_mkl_and_numpys_openblas covers that case, and
        # the setup's PyPI numpy always has it, so CI runs these tests.
        pytest.skip("numpy here is not built with OpenBLAS (PyPI's wheels are)")
    with threadpool_limits(limits=2, user_api="blas"):
        # An OpenBLAS built for one thread only (NUM_THREADS=1) cannot show the hold; the
        # setup's PyPI numpy takes two whatever OPENBLAS_NUM_THREADS says (threadpoolctl sets
        # the count), so CI runs these tests.
        if set(openblas_threads()) != {2}:
            pytest.skip(f"OpenBLAS does not take two threads here: {openblas_threads()}")
        yield
