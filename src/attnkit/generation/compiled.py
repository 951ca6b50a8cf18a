"""A decoding step compiled with ``torch.compile``: the same layers, in fewer and fused kernels.

In eager mode a decoding step at one row is a chain of small operator calls between the weight
products: about 125 a layer for the Llama shape of ``benchmarks/llama.py`` (norms, rotation,
cache writes, views, residuals), each with its dispatch and Python around it. On the Intel
Xeon with AMX they took about 5 ms of that model's 15 ms bfloat16 step, where Hugging Face's
step takes 19.5 ms (docs/benchmarks.md, "A compiled decoding step"). TorchInductor fuses the
element-wise ones into generated C++ loops and runs the rest from one graph, with the same
weight products.

:func:`compiled_step` compiles the model's layer stack (``GPT._run``, the code every call
runs); :func:`~attnkit.generation.generate` with ``GenerationConfig(compile=True)`` hands it
to the cache it makes (``GPTCache.step``), and ``GPT.forward`` takes it for the steps that
feed one new token per row to a cache that holds the prompt. The prompt's prefill, the checks
of ``GPT.forward``, the output layer and the token choice stay eager, and so does every call
with another cache (another generation, another thread). The graphs are made with dynamic
shapes, so that the cache's growing length does not make new ones; a shape that changes a
branch does, each once: one row or several, up to or beyond
:data:`~attnkit.attention.SHORT_KEYS_MAX` keys, a padding mask or none, a sliding window's
ring full or not. Dynamo keeps at most ``torch._dynamo.config.recompile_limit`` (8) graphs a
model; steps of a further kind run eagerly. The weights are inputs of the graphs, not
constants: a weight changed between calls is read as it is now (packed weights are remade
when a weight's version counter moves, as in eager steps: a write through ``.data`` is not
seen). The oneDNN-packed weights of :mod:`~attnkit.generation.packed` (what makes a
step's products fast on a CPU) enter through an operator of attnkit's own
(``torch.ops.attnkit.packed_product``), which Inductor calls as it is, as it calls the
attention kernels; the element-wise work between them is what it fuses.

Dynamo checks before every call that a graph still fits (its guards). The guards that the
model's built-in modules (``nn.Linear``, ``nn.Embedding``, ...) are still the objects,
weights and attributes traced cost about 0.8 ms a step (8% of a float32 step of the Llama
shape at one row on the Xeon), so the step's own frame skips them, and :func:`compiled_step`
checks as much once per generation instead: a model whose parameters, buffers or submodules
changed since (a layer replaced, a dtype or device changed, ``train()``) gets a new step
that compiles again. A model with forward hooks is refused (:func:`check_compilable`): the
products a compiled step makes do not call the layers, so hooks would not run.

Costs and limits:

* The first call compiles: 16-80 s for the Llama shape on the Xeon (more with a padding mask
  and with more layers), and a CPU needs the C++ compiler TorchInductor uses (``g++``, or
  ``$CXX``; :func:`check_compilable`). Inductor keeps
  what it built in its cache directory (``TORCHINDUCTOR_CACHE_DIR``), which later processes
  reuse. It pays for long generation, not for a few tokens.
* The fused kernels add in another order: float32 results agree with eager ones to float
  rounding (the tests check equal greedy tokens and log-probabilities within 1e-5); in
  bfloat16 a near-tie can go the other way, as between any two bfloat16 implementations.
* Attention takes the fused kernels' result as it is: eager mode checks it for NaN or inf
  inputs and computes such calls again on the readable path (:mod:`attnkit.attention`); a
  compiled step does not read its results back, so non-finite hidden states propagate as the
  fused kernel has them (torch's CPU kernel can turn a row of NaN scores into zeros).
* Measured on the Intel Xeon with AMX only (docs/benchmarks.md): there the one-row products
  take the same packed weights as in eager steps. On other CPUs a compiled step gives up two
  eager one-row paths that are made in Python (the float16 copies of bfloat16 weights on an
  AVX2 CPU, MKL's row-major copies on AMD), so it can be slower than an eager one there.
* The hardware rules of :mod:`attnkit.hardware` that pick attention paths are read when a
  graph is made.
* Inductor's on-disk cache does not tell apart what it built under the settings that cap the
  CPU kernels (``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``, ``ONEDNN_MAX_CPU_ISA``,
  ``FBGEMM_ENABLE_INSTRUCTIONS``: how CI makes an AVX-512 machine compute as an AVX2 one):
  on the Xeon, steps compiled natively and then run from the cache with those settings gave
  NaN logits, and the other order aborted the process. So where one of them is set and the
  cache folder is Inductor's default, :func:`compiled_step` gives that combination a folder
  of its own beside the default one (``TORCHINDUCTOR_CACHE_DIR``; a folder the user chose is
  kept).
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["check_compilable", "compiled_step"]

# model -> (its _Assumptions, its compiled step)
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
# Settings that cap the CPU kernels torch, MKL, oneDNN and FBGEMM dispatch to.
KERNEL_CAPS = (
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "FBGEMM_ENABLE_INSTRUCTIONS",
)


def _cpp_compiler() -> str:
    """The C++ compiler TorchInductor builds CPU kernels with (it raises where none is found)."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    return get_cpp_compiler()


def check_compilable(model: nn.Module, device: torch.device) -> None:
    """Raise a clear error where ``torch.compile`` cannot build ``model``'s step: a model that
    is not an attnkit :class:`~attnkit.models.GPT` (no ``_run``), forward hooks on the model
    or its layers (a compiled step's products do not call the layers, so the hooks would not
    run; in eager steps they do), a Python that dynamo does not support, on a CPU no C++
    compiler that TorchInductor finds, on a GPU no Triton."""
    if not callable(getattr(type(model), "_run", None)):
        raise TypeError(
            f"compile: compiles the layers of an attnkit GPT; got a {type(model).__name__}, "
            "which has no GPT._run: generate without compile=True"
        )
    hooked = [
        name or "the model"
        for name, m in model.named_modules()
        if m._forward_hooks or m._forward_pre_hooks
    ]
    if hooked:
        raise ValueError(
            f"compile: forward hooks on {', '.join(hooked[:3])}"
            f"{f' and {len(hooked) - 3} more modules' if len(hooked) > 3 else ''}, which a "
            "compiled step would not run; remove them (the handle's remove()) or generate "
            "without compile=True"
        )
    if not torch._dynamo.is_dynamo_supported():
        raise RuntimeError(
            "compile: torch.compile does not support this Python version; generate without "
            "compile=True"
        )
    if device.type == "cpu":
        try:
            _cpp_compiler()
        except Exception as err:  # InvalidCxxCompiler and the like: named below
            raise RuntimeError(
                "compile: TorchInductor needs a C++ compiler to build CPU kernels and found "
                f"none ({err}); install g++ (Debian: apt-get install g++) or set CXX, or "
                "generate without compile=True"
            ) from err
    elif device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            raise RuntimeError(
                "compile: TorchInductor needs Triton for GPU kernels (pip install triton), or "
                "generate without compile=True"
            )


def _separate_capped_cache() -> None:
    """Point Inductor's on-disk cache at a folder of its own for the kernel caps set in the
    environment (module docstring), unless none is set or the folder is not Inductor's
    default (a folder the user chose)."""
    caps = [f"{name}={os.environ[name]}" for name in KERNEL_CAPS if os.environ.get(name)]
    if not caps:
        return
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = os.path.abspath(default_cache_dir())
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is not None and os.path.abspath(chosen) != default:
        return
    tag = hashlib.sha256(";".join(caps).encode()).hexdigest()[:12]
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(default, f"attnkit-caps-{tag}")


def _new_step() -> Callable:
    """A function with a code object of its own. Dynamo keeps compiled graphs per code object:
    each model gets graphs of its own, and no model's recompilations count against another's
    limit (``torch._dynamo.config.recompile_limit``)."""

    def step(run, *args):
        return run(*args)

    step.__code__ = step.__code__.replace()  # a distinct (equal) code object
    return step


def _skip_guards_on_the_models_modules(entries: list) -> list[bool]:
    """Dynamo's guards to keep: all but those on the built-in modules (``nn.Linear``,
    ``nn.Embedding``, ...) reached through the step's ``run`` argument, the model's bound
    method. Checking that they still are the modules and weights traced cost ~0.8 ms a step
    (8% of the Llama shape's float32 steps at one row on the Xeon); :class:`_Assumptions`
    checks as much once per generation. Only the step's own frame reaches the model through
    ``run``: frames that dynamo compiles on their own (a layer's ``forward`` after a frame
    it could not trace) are shared by every model and keep every guard."""
    return [
        not (
            entry.name.startswith("L['run']")
            and entry.orig_guard.source.is_unspecialized_builtin_nn_module()
        )
        for entry in entries
    ]


class _Assumptions:
    """What the graphs of a compiled step assume of a model beyond its weights' values, read
    once per generation instead of by dynamo's guards at every step (:func:`compiled_step`):
    which parameters, buffers and submodules it has (held weakly, compared by identity), each
    tensor's shape, strides, dtype, device and whether it needs gradients, and each module's
    class, training flag and hooks (by handle id, which torch never reuses)."""

    def __init__(self, model: nn.Module) -> None:
        objects: list = []
        facts: list = []
        for name, t in (*model.named_parameters(), *model.named_buffers()):
            objects.append(t)
            facts.append((name, t.shape, t.stride(), t.dtype, t.device, t.requires_grad))
        for name, m in model.named_modules():
            objects.append(m)
            hooks = (tuple(m._forward_pre_hooks), tuple(m._forward_hooks))
            facts.append((name, type(m), m.training, hooks))
        self.objects = objects  # dropped once the assumptions are stored (hold())
        self.refs: list[weakref.ref] = []
        self.facts = tuple(facts)

    def hold(self) -> _Assumptions:
        """Keep weak references only (a strong one would keep the model alive)."""
        self.refs = [weakref.ref(o) for o in self.objects]
        self.objects = []
        return self

    def still(self, now: _Assumptions) -> bool:
        """Whether ``now`` (made from the model just now) finds the model as assumed."""
        return (
            self.facts == now.facts
            and len(self.refs) == len(now.objects)
            and all(ref() is obj for ref, obj in zip(self.refs, now.objects, strict=True))
        )


def compiled_step(model: nn.Module) -> Callable:
    """``model``'s compiled step (module docstring), made once per model and kept while the
    model's parameters, buffers and submodules are the ones it was made for
    (:class:`_Assumptions`; weights changed in place keep it); its graphs are built at the calls
    and die with the model or the step. Set it as a cache's ``step`` to use it.

    Raises:
        TypeError, ValueError, RuntimeError: where compiling is not available or would not
            run what eager steps run (:func:`check_compilable`).
    """
    check_compilable(model, next(model.parameters()).device)
    _separate_capped_cache()
    now = _Assumptions(model)
    with _LOCK:
        entry = _COMPILED.get(model)
        if entry is None or not entry[0].still(now):
            step = torch.compile(
                _new_step(),
                dynamic=True,
                options={"guard_filter_fn": _skip_guards_on_the_models_modules},
            )
            entry = _COMPILED[model] = (now.hold(), step)
    return entry[1]
