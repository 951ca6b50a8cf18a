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
model's modules are still the objects, weights and attributes traced cost about 1.2 ms a step
(8% and 3% of a float32 step of the Llama shape at one row on the Xeon, for the built-in
modules' and the others'), so the step's own frame skips them, and :func:`compiled_step`
checks as much once per generation instead (:class:`_Assumptions`: parameters, buffers,
submodules, every module's attributes, the closures of packed products): a model whose
parameters, buffers, submodules or attributes changed since (a layer replaced, a dtype or
device changed, ``train()``, pre-norm turned to post-norm) gets a new step that compiles
again. Where a module holds a value it cannot read (an object without attributes that is not
a plain value), only the built-in modules' guards are skipped. A model with forward hooks is
refused (:func:`check_compilable`): the products a compiled step makes do not call the
layers, so hooks would not run.

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
* Measured on the Intel Xeon with AMX, natively and with its kernels capped at AVX2 or at
  AVX-512 without AMX (docs/benchmarks.md); not yet on the AMD EPYCs. The one-row products
  take the paths of eager steps, the two made in Python too (the float16 copies of bfloat16
  weights on an AVX2 CPU, the row-major copies where MKL is generic): each enters the graph
  as one operator of attnkit's own (``torch.ops.attnkit.one_row_product``).
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

import enum
import hashlib
import os
import threading
import types
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
            entry.name.startswith(_MODEL)
            and entry.orig_guard.source.is_unspecialized_builtin_nn_module()
        )
        for entry in entries
    ]


def _skip_guards_on_the_model(entries: list) -> list[bool]:
    """Dynamo's guards to keep where :class:`_Assumptions` read all of the model's state
    (``complete``): all but those on what the step's frame reaches through the model
    (``run.__self__``: its modules, their attributes, parameters, buffers, hooks, the
    closures of their packed products), which it checks once per generation. The remaining
    ~0.4 ms a step of the Llama shape's (float32, one row, the Xeon); the guards on the
    step's other arguments (the cache, the tokens), on globals and on classes are kept."""
    return [not entry.name.startswith(_MODEL) for entry in entries]


_MODEL = "run.__self__"  # how dynamo's guards name the model, reached through the bound method
_DEPTH = 6  # containers and objects within a module's attributes that _Assumptions reads
_HOOKS = "hooks"  # a module's hook dictionaries: their handles' ids, which torch never reuses


class _Unread(Exception):
    """A value :class:`_Assumptions` cannot read: its guards stay dynamo's."""


class _Assumptions:
    """What the graphs of a compiled step assume of a model beyond its weights' values, read
    once per generation instead of by dynamo's guards at every step (:func:`compiled_step`):
    which parameters, buffers and submodules it has (held weakly, compared by identity), each
    tensor's shape, strides, dtype, device and whether it needs gradients, and each module's
    class, training flag and hooks (by handle id, which torch never reuses).

    It also reads every module's other attributes (``complete``): plain values by value
    (numbers, strings, dtypes, devices, None), containers item by item, modules by identity,
    tensors by their facts and which of the others they are (not by identity, as dynamo's
    guards: the packed products' closures hold tensors remade when a weight changes in place),
    functions by their code and what their closures hold, other objects by identity and their
    attributes, to :data:`_DEPTH` levels. Where that covers everything, the step skips
    dynamo's guards on the model altogether (:func:`_skip_guards_on_the_model`); a value it
    cannot read (deeper, or an object without attributes that is not a plain value) leaves
    ``complete`` False: then only the built-in modules' guards are skipped (dynamo keeps
    checking the rest), and their attributes are still read here."""

    def __init__(self, model: nn.Module) -> None:
        self.objects: list = []  # held weakly once stored (hold()); compared by identity
        self.pinned: list = []  # objects without weak references (builtins): held, by identity
        facts: list = []
        for name, t in (*model.named_parameters(), *model.named_buffers()):
            self.objects.append(t)
            facts.append((name, t.shape, t.stride(), t.dtype, t.device, t.requires_grad))
        modules = list(model.named_modules())
        self._own = {id(m) for _, m in modules}
        for name, m in modules:
            self.objects.append(m)
            hooks = (tuple(m._forward_pre_hooks), tuple(m._forward_hooks))
            facts.append((name, type(m), m.training, hooks))
        self.refs: list[weakref.ref] = []
        self.complete = True  # (an attribute it cannot read clears it: _attributes)
        self._seen: dict[int, int] = {}  # id of a tensor read by value -> its first index
        facts.extend(self._attributes(m) for _, m in modules)
        self.facts = tuple(facts)
        del self._own, self._seen

    def _attributes(self, module: nn.Module) -> tuple:
        """The facts of ``module``'s attributes beyond its parameters, buffers and children
        (which __init__ reads): its hook dictionaries by handle ids, the rest by value."""
        out = []
        for key, value in vars(module).items():
            if key in ("_parameters", "_buffers", "_modules"):
                out.append((key, tuple(value)))  # the names (None entries too: a bias of None)
            elif key.endswith(_HOOKS) and isinstance(value, dict):
                out.append((key, tuple(value)))
            else:
                mark = (len(self.objects), len(self.pinned))
                try:
                    out.append((key, self._fact(value, _DEPTH)))
                except Exception:  # _Unread, or a tensor without strides (sparse): dynamo's
                    del self.objects[mark[0] :], self.pinned[mark[1] :]  # guards keep it
                    self.complete = False  # (not held: it might hold the model)
                    out.append((key, ("unread", type(value))))
        return tuple(out)

    def _fact(self, value, depth: int):
        """A comparable fact of ``value``; its objects go to ``objects`` (weakly held later)
        or ``pinned``. Raises :class:`_Unread` beyond ``depth`` or for values it cannot read."""
        if value is None or isinstance(value, _PLAIN):
            return value if not isinstance(value, float) else ("float", repr(value))
        if depth == 0:
            raise _Unread
        if isinstance(value, torch.Tensor):  # by its facts and which others it is, as dynamo's
            # guards: the packed products' closures hold tensors remade when a weight changes
            first = self._seen.setdefault(id(value), len(self._seen))
            facts = (value.shape, value.stride(), value.dtype, value.device, value.requires_grad)
            return ("tensor", *facts, first)
        if isinstance(value, nn.Module):
            self._keep(value)
            if id(value) in self._own:  # read as one of the model's modules
                return ("module",)
            return ("module", type(value), self._fact(vars(value), depth - 1))
        if isinstance(value, (tuple, list, frozenset, set)):
            items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
            return (type(value), tuple(self._fact(v, depth - 1) for v in items))
        if isinstance(value, dict):
            return (type(value), tuple((self._fact(k, depth - 1), self._fact(v, depth - 1))
                                       for k, v in value.items()))  # fmt: skip
        if isinstance(value, weakref.ref):
            target = value()
            return ("weakref", None if target is None else self._fact(target, depth - 1))
        if isinstance(value, types.MethodType):
            return ("method", self._fact(value.__func__, depth - 1),
                    self._fact(value.__self__, depth - 1))  # fmt: skip
        if isinstance(value, types.FunctionType):  # by its code, as dynamo's guards: the
            self._keep(value.__code__)  # packed products' closures are made anew each call
            cells = []
            for cell in value.__closure__ or ():
                try:
                    cells.append(self._fact(cell.cell_contents, depth - 1))
                except ValueError:  # an empty cell
                    cells.append(("empty",))
            return ("function", tuple(cells), self._fact(value.__defaults__, depth - 1))
        if (
            isinstance(value, (types.BuiltinFunctionType, type))
            or callable(value)
            and not hasattr(value, "__dict__")
        ):
            self._keep(value)  # builtins, classes, torch's ops: by identity
            return ("callable",)
        if hasattr(value, "__dict__"):
            self._keep(value)
            return ("object", type(value), self._fact(vars(value), depth - 1))
        raise _Unread

    def _keep(self, obj) -> None:
        try:
            weakref.ref(obj)
        except TypeError:
            self.pinned.append(obj)  # (builtins, classes, code: they do not hold the model)
        else:
            self.objects.append(obj)

    def hold(self) -> _Assumptions:
        """Keep weak references only (a strong one would keep the model alive; ``pinned``
        holds builtins and classes, which do not)."""
        self.refs = [weakref.ref(o) for o in self.objects]
        self.objects = []
        return self

    def still(self, now: _Assumptions) -> bool:
        """Whether ``now`` (made from the model just now) finds the model as assumed."""
        return (
            self.facts == now.facts
            and len(self.refs) == len(now.objects)
            and all(ref() is obj for ref, obj in zip(self.refs, now.objects, strict=True))
            and len(self.pinned) == len(now.pinned)
            and all(a is b for a, b in zip(self.pinned, now.pinned, strict=True))
        )


_PLAIN = (bool, int, float, complex, str, bytes, torch.dtype, torch.device, enum.Enum)


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
            guards = (
                _skip_guards_on_the_model if now.complete else _skip_guards_on_the_models_modules
            )
            step = torch.compile(_new_step(), dynamic=True, options={"guard_filter_fn": guards})
            entry = _COMPILED[model] = (now.hold(), _for_model(model, step))
    return entry[1]


def _for_model(model: nn.Module, step: Callable) -> Callable:
    """``step``, refusing another model's layers: its graphs skip dynamo's guards on the
    model, which would have told a model of another structure apart."""
    owner = weakref.ref(model)

    def checked(run, *args):
        if getattr(run, "__self__", None) is not owner():
            raise ValueError(
                "compiled step: made for another model; take compiled_step(model) of the model "
                "whose layers it runs"
            )
        return step(run, *args)

    return checked
