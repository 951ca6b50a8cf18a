"""A decoding step compiled with ``torch.compile``: the same layers, in fewer and fused kernels.

In eager mode a decoding step at one row is a chain of small operator calls between the weight
products: about 125 a layer for the Llama shape of ``benchmarks/llama.py`` (norms, rotation,
cache writes, views, residuals), each with its dispatch and Python around it. On the Intel
Xeon with AMX they took about 5 ms of that model's 15 ms bfloat16 step, where Hugging Face's
step takes 19.5 ms (docs/benchmarks.md, "A compiled decoding step"). TorchInductor fuses the
element-wise ones into generated C++ loops and runs the rest from one graph, with the same
weight products.

:func:`compiled_steps` (which :func:`~attnkit.generation.generate` enters for
``GenerationConfig(compile=True)``) compiles the model's layer stack (``GPT._run``, the code
every call runs) for the steps that feed one new token per row to a cache; the prompt's
prefill, the checks of ``GPT.forward``, the output layer and the token choice stay eager. The
graphs are made with dynamic shapes: one graph for any batch size and cache length, and a few
more where attention changes path (e.g. beyond :data:`~attnkit.attention.SHORT_KEYS_MAX` keys).
The weights are inputs of the graphs, not constants: a weight changed between calls is read
as it is now. The oneDNN-packed weights of :mod:`~attnkit.generation.packed` (what makes a
step's products fast on a CPU) enter through an operator of attnkit's own
(``torch.ops.attnkit.packed_product``), which Inductor calls as it is, as it calls the
attention kernels; the element-wise work between them is what it fuses.

Costs and limits:

* The first call compiles: 20-45 s for the Llama shape on the Xeon, more with more layers, and
  a CPU needs a C++ compiler (``g++`` or ``clang++``; :func:`check_compilable`). Inductor keeps
  what it built in its cache directory (``TORCHINDUCTOR_CACHE_DIR``), which later processes
  reuse. It pays for long generation, not for a few tokens.
* The fused kernels add in another order: float32 results agree with eager ones to float
  rounding (the tests check equal greedy tokens and log-probabilities within 1e-5); in
  bfloat16 a near-tie can go the other way, as between any two bfloat16 implementations.
* Attention takes the fused kernels' result as it is: eager mode checks it for NaN or inf
  inputs and computes such calls again on the readable path (:mod:`attnkit.attention`); a
  compiled step does not read its results back, so non-finite hidden states propagate as the
  fused kernel has them.
* The hardware rules of :mod:`attnkit.hardware` that pick attention paths are read when the
  graph is made.
"""

from __future__ import annotations

import shutil
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["check_compilable", "compiled_steps"]

_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> compiled step
_LOCK = threading.Lock()
_CXX = ("c++", "g++", "clang++")


def check_compilable(model: nn.Module, device: torch.device) -> None:
    """Raise a clear error where ``torch.compile`` cannot build ``model``'s step: a model that
    is not an attnkit :class:`~attnkit.models.GPT` (no ``_run``), a Python that dynamo does
    not support, or, on a CPU, no C++ compiler on PATH for TorchInductor's kernels."""
    if not callable(getattr(type(model), "_run", None)):
        raise TypeError(
            f"compile: compiles the layers of an attnkit GPT; got a {type(model).__name__}, "
            "which has no GPT._run: generate without compile=True"
        )
    if not torch._dynamo.is_dynamo_supported():
        raise RuntimeError(
            "compile: torch.compile does not support this Python version; generate without "
            "compile=True"
        )
    if device.type == "cpu" and not any(shutil.which(name) for name in _CXX):
        raise RuntimeError(
            "compile: TorchInductor needs a C++ compiler to build CPU kernels and none was "
            f"found on PATH ({', '.join(_CXX)}); install one (Debian: apt-get install g++) or "
            "generate without compile=True"
        )


def _new_step() -> Callable:
    """A function with a code object of its own. Dynamo keeps compiled graphs per code object:
    each model gets graphs of its own, and no model's recompilations count against another's
    limit (``torch._dynamo.config.recompile_limit``)."""

    def step(run, *args):
        return run(*args)

    step.__code__ = step.__code__.replace()  # a distinct (equal) code object
    return step


def _compiled(model: nn.Module) -> Callable:
    """The compiled step of ``model``, made at its first use (graphs are built at the calls)."""
    with _LOCK:
        step = _COMPILED.get(model)
        if step is None:
            step = _COMPILED[model] = torch.compile(_new_step(), dynamic=True)
    return step


@contextmanager
def compiled_steps(model: nn.Module) -> Iterator[None]:
    """Within the block, ``model``'s one-token steps on a cache run compiled (module docstring);
    other calls (prompts, no cache, attention weights asked for, gradients) run eagerly.

    ``model`` is a :class:`~attnkit.models.GPT` (its ``_run``: the forward pass on checked
    inputs). Enter it inside :func:`~attnkit.generation.packed.packed_linears` so that the
    packed weights become the graph's constants.

    Raises:
        TypeError, RuntimeError: where compiling is not available (:func:`check_compilable`).
    """
    check_compilable(model, next(model.parameters()).device)
    step = _compiled(model)
    eager = model._run

    def run(ids, positions, mask, cache, return_weights, project):
        if cache is None or ids.shape[1] != 1 or return_weights or torch.is_grad_enabled():
            return eager(ids, positions, mask, cache, return_weights, project)
        return step(eager, ids, positions, mask, cache, return_weights, project)

    model._run = run
    try:
        yield
    finally:
        del model._run  # the class's method again
