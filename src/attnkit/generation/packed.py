"""Linear layers with their weights prepacked for oneDNN, while generating on a CPU.

A decoding step multiplies one row per prompt by every weight of the model, so its cost is
reading the weights from memory. ``F.linear`` does not do that at the memory's speed on a CPU:
in float32 it calls MKL, whose matrix-vector products streamed the weights at about half the
bandwidth on the benchmark machine, and in bfloat16 it calls oneDNN, which reorders the weight
into its blocked layout at every call. oneDNN given a weight reordered once
(``torch.ops.mkldnn._reorder_linear_weight``, as torch.compile's CPU backend does with frozen
weights) runs close to the bandwidth. Measured on the benchmark machine (AMD EPYC, AVX-512 with
bf16, one thread, weights coming from memory as in a decoding step; "sum" reads the weights
once, the floor):

===================================  ====  =============  ===========  ========
weights                              rows  F.linear (ms)  packed (ms)  sum (ms)
===================================  ====  =============  ===========  ========
GPT-2 small's 48 layers, float32     1     19.3           11.9         9.9
GPT-2 small's 48 layers, float32     8     38.2           16.0         10.3
GPT-2 small's 48 layers, bfloat16    1     12.4           6.3          5.9
GPT-2 small's 48 layers, bfloat16    8     14.0           8.7          5.8
output layer 50,257 x 768, float32   1     9.3            4.5          4.3
output layer 50,257 x 768, float32   8     20.9           6.4          4.4
output layer 50,257 x 768, bfloat16  1     5.1            2.3          2.4
output layer 50,257 x 768, bfloat16  8     5.8            3.4          2.4
===================================  ====  =============  ===========  ========

A oneDNN call costs about 10 us more than ``F.linear`` whatever its size, so for layers of a
few thousand weights (test-sized models) the packed path is slower; from GPT-2's smallest
shapes up it is faster.

The rule (:func:`packed_weight`): a float32 or bfloat16 weight on a CPU, torch built with
oneDNN, no gradient wanted; anything else, or a weight oneDNN refuses, takes ``F.linear``.
Where oneDNN has no bfloat16 kernels (an AVX2 CPU), a bfloat16 weight is packed in float32:
several rows are multiplied in float32 and rounded to bfloat16, one row takes torch's bfloat16
``F.linear`` (:func:`_bf16_in_float32`), or, for weights of 1,024 or more on a side that have
multiplied 256 single rows, FBGEMM's float16-weight product on an exact float16 copy
(:func:`_one_bf16_row`: a Llama-shaped step 1.1x, its products 1.8x faster on the AVX2-only
EPYC). One exception per call (:func:`linear`): a single float32 row takes MKL's matrix-vector
product where it is faster than the prepacked one: on an Intel CPU through ``F.linear`` (10-20%
faster there; :func:`attnkit.hardware.mkl_gemv_is_fast`), and where MKL runs generic code (AMD;
:func:`attnkit.hardware.mkl_gemv_is_generic`) on a copy of the weight transposed to (in, out)
(narrow output layers: kept (out, in), read through its transpose,
:func:`attnkit.generation.blas.dot_form`), made at the first such call (1.3x faster than
prepacked on the AVX2-only EPYC, where ``F.linear`` is as slow as prepacked), multiplied there
by numpy's OpenBLAS on one thread for layers of 131,072 weights and more with fewer than 30,000
outputs (1.2-1.7x faster than MKL on GPT-2's and the Llama shape's layers there:
:mod:`~attnkit.generation.blas`, which :func:`packed_linears` holds at one thread) and by MKL
for the others (output layers, test-sized layers); the copies are allocated on 2 MiB pages
(:mod:`~attnkit.generation.hugepages`: 5-8% off the products of a step there). From 2 rows on
the packed product is faster everywhere. They compute the same product; only the order of the
float additions differs (a few 1e-6 relative in float32, as between any two BLAS kernels).

:func:`packed_linears` routes every ``nn.Linear`` of a model through its packed weight for the
duration of a ``with`` block, without changing the modules' code (each instance's ``forward``
is replaced, and restored on exit). Two more products get the same treatment:
cross-attention's query projection, the first rows of a stacked ``in_proj`` (a slice that
``F.linear`` would reorder at every call: 218 against 161 us a call in a 500-row decoding step
on the Xeon), and a ReLU feed-forward layer's first product, with the ReLU fused into it (one
pass less over the (rows, d_ff) hidden states outside training). A packed weight is made once
and kept while its weight is unchanged (keyed on the tensor's storage and version counter, so
``load_state_dict`` and the default optimizers' steps are seen; writes through ``.data`` and
fused optimizer steps, ``torch.optim.Adam(fused=True)`` as attnkit's trainer uses, do not bump
the counter and are not: call :func:`release` after them, as the trainer does after every
evaluation). The copies cost the weights' size again in memory (a bfloat16 weight packed in
float32: twice its size, made only if the model's copies fit in half of the memory still
available), freed with the model or by :func:`release`.

``packed_linears(model, int8=True)`` packs float32 weights as int8 instead: dynamic
quantization, as CTranslate2's ``compute_type="int8"`` does. Each weight row is quantized once
(symmetric, one scale per output channel, the scales of torch's
``PerChannelMinMaxObserver``) and packed for FBGEMM; at every call the input is quantized to
7-bit unsigned integers with one scale per call (``reduce_range``: exact integer products on
every x86 CPU, VNNI or not), multiplied in integers and scaled back to float32
(``torch.ops.quantized.linear_dynamic``, the product of ``torch.ao``'s dynamic ``Linear``, to
which a test compares it). The products depend on the batch (one input scale per call),
so an int8 translation may change with the sentences decoded beside it. Measured with the
shipped translator on test2016 (docs/benchmarks.md, "Run 13"): 1.32x the sentences/s of
float32 on the AMX Xeon (254.8 against 193.0, two worker processes), and 1.31x with oneDNN
and MKL capped at AVX-512 without AMX, 1.22x with every library capped at AVX2 ("Run 14");
BLEU 43.04, float32's (42.88 with one worker of one thread, 43.35 with the AVX2 kernels).
Where bfloat16 is native it is faster still on the Xeon (373.8).
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit import hardware
from attnkit.generation import blas, hugepages
from attnkit.hardware import mkl_gemv_is_fast, mkl_gemv_is_generic
from attnkit.modules.feed_forward import FeedForward
from attnkit.modules.multihead import MultiHeadAttention

__all__ = [
    "fbgemm_engine",
    "float16_available",
    "int8_available",
    "linear",
    "packed_linears",
    "pack_float16",
    "packed_weight",
    "release",
]

# nn.Linear -> (key of the weight it was made from, packed weight or None if oneDNN refused)
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _mkldnn_ops() -> bool:
    ops = torch.ops.mkldnn
    try:
        return bool(ops._linear_pointwise and ops._reorder_linear_weight)
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


_HAS_MKLDNN = torch.backends.mkldnn.is_available() and _mkldnn_ops()
# oneDNN runs bfloat16 on this CPU (AVX-512 or AMX); asked once, as the flags below
_ONEDNN_BF16 = _HAS_MKLDNN and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
_MKL_GEMV = mkl_gemv_is_fast()  # one float32 row: F.linear (MKL) on Intel CPUs
_MKL_GENERIC = mkl_gemv_is_generic()  # one float32 row: the weight as (in, out), on AMD
# id(packed weight) -> its weight as (in, out) and numpy's view of that copy: contiguous, or the
# transpose of a contiguous (out, in) copy (blas.dot_form); made at the first one-row float32
# call where MKL is generic, dropped with the packed weight
_ROW_MAJOR: dict[int, tuple[Tensor, np.ndarray]] = {}


def _packable(weight: Tensor) -> bool:
    """The rule (module docstring), before asking oneDNN."""
    if not _HAS_MKLDNN or weight.device.type != "cpu" or weight.dim() != 2:
        return False
    return weight.dtype in (torch.float32, torch.bfloat16)


def _bf16_in_float32(dtype: torch.dtype) -> bool:
    """bfloat16 on a CPU where oneDNN has no bfloat16 kernels (no AVX-512 or AMX: an AVX2
    CPU): its packed weight is float32, and several rows are multiplied in float32.

    torch's own bfloat16 product there multiplies one row at a time: on the AVX2-only AMD
    EPYC, 8 rows of a 32,000 x 512 weight took 17.4 ms, against 2.4 ms for one row. A
    bfloat16 value widens to float32 exactly and both products accumulate in float32, so the
    float32 product rounded to bfloat16 is torch's up to the order of the sums. One row reads
    the bfloat16 bytes instead, half of float32's (:func:`_one_bf16_row`; docs/benchmarks.md,
    "Text generation").
    """
    return dtype == torch.bfloat16 and not _ONEDNN_BF16


def _float32_copies_fit(model: nn.Module) -> bool:
    """Whether the float32 packed copies that ``model``'s bfloat16 linear layers would get here
    (:func:`_bf16_in_float32`: twice their bfloat16 size) and do not have yet fit in half of
    the memory still available; if not, those layers keep ``F.linear``."""
    need = 0
    for module in model.modules():
        if type(module) is not nn.Linear:
            continue
        weight = module.weight
        if _bf16_in_float32(weight.dtype) and _packable(weight):
            entry = _PACKED.get(module)
            if entry is None or entry[0] != _key(weight):
                need += weight.numel() * 4
    return need == 0 or fits_in_half_free_memory(need)


def fits_in_half_free_memory(need: int) -> bool:
    """Whether ``need`` bytes fit in half of the memory still available to this process on
    the CPU (True where that cannot be read): the rule for the copies made while generating."""
    free = hardware.available_memory(torch.device("cpu"))
    return free is None or 2 * need <= free


def _key(weight: Tensor) -> tuple:
    # Inference tensors keep no version counter; they cannot change outside inference mode.
    version = None if weight.is_inference() else weight._version
    return (weight.data_ptr(), version, tuple(weight.shape), weight.dtype)


def packed_weight(module: nn.Linear) -> Tensor | None:
    """``module.weight`` reordered for oneDNN (made once, kept while the weight is unchanged),
    or None where the rule says ``F.linear``."""
    return _packed(module, module.weight)


def _packed(owner: nn.Module, weight: Tensor) -> Tensor | None:
    """``weight`` (a module's, or rows of it) packed, kept for ``owner`` while unchanged."""
    if not _packable(weight):
        return None
    key = _key(weight)
    entry = _PACKED.get(owner)
    if entry is None or entry[0] != key:
        try:
            with torch.no_grad():
                source = weight.detach()
                source = source.float() if _bf16_in_float32(weight.dtype) else source
                packed = torch.ops.mkldnn._reorder_linear_weight(source, None)
        except RuntimeError:  # a weight oneDNN refuses: F.linear
            packed = None
        entry = (key, packed)
        _PACKED[owner] = entry
    return entry[1]


# nn.Module -> (key of the weight, int8 packed params): the int8 packing of packed_linears(int8=True)
_INT8: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_INT8_ENGINE = "fbgemm"  # torch's x86 int8 kernels (AVX2 at least)


def _fbgemm_runs(product) -> Tensor | None:
    """``product()``, an FBGEMM product of a tiny probe, or None where torch has no FBGEMM
    engine or the call fails (the op missing from this torch build, or refused on this CPU)."""
    if _INT8_ENGINE not in torch.backends.quantized.supported_engines:
        return None
    try:
        return product()
    except (RuntimeError, AttributeError, NotImplementedError):
        # A capability probe: the op is missing from this build or refused on this CPU, so
        # FBGEMM is not available here and the caller uses torch's own product instead.
        return None


@functools.cache
def int8_available() -> bool:
    """True where torch has its int8 CPU kernels (FBGEMM: x86 CPUs with AVX2) and they run: a
    tiny weight is quantized, packed and multiplied once (a torch that dropped its quantized
    tensors, as announced for torchao, answers False)."""
    out = _fbgemm_runs(
        lambda: torch.ops.quantized.linear_dynamic(
            torch.ones(1, 4), _pack_int8(torch.ones(2, 4), None), True
        )
    )
    return out is not None and tuple(out.shape) == (1, 2)


_INT8_LOCK = threading.Lock()  # torch.backends.quantized.engine is process-wide


@contextmanager
def fbgemm_engine() -> Iterator[None]:
    """torch's quantized engine set to FBGEMM for the block (packing int8 or float16 weights
    for its kernels), under a lock, and put back after."""
    with _INT8_LOCK:
        engine = torch.backends.quantized.engine
        torch.backends.quantized.engine = _INT8_ENGINE
        try:
            yield
        finally:
            torch.backends.quantized.engine = engine


def pack_float16(weight: Tensor, bias: Tensor | None = None):
    """float32 ``weight`` (out, in) rounded to float16 and packed for FBGEMM's float16-weight
    product (``torch.ops.quantized.linear_dynamic_fp16``: inputs and sums stay float32), with
    float32 ``bias``."""
    with fbgemm_engine():
        return torch.ops.quantized.linear_prepack_fp16(weight, bias)


@functools.cache
def float16_available() -> bool:
    """True where torch has FBGEMM's float16-weight product and it runs (x86 CPUs with AVX2):
    a tiny weight is packed and multiplied once."""
    out = _fbgemm_runs(
        lambda: torch.ops.quantized.linear_dynamic_fp16(
            torch.ones(1, 4), pack_float16(torch.ones(2, 4))
        )
    )
    return out is not None and tuple(out.shape) == (1, 2) and bool((out == 4).all())


def _pack_int8(weight: Tensor, bias: Tensor | None):
    """float32 ``weight`` (out, in) quantized per output channel (symmetric, the scales of
    torch.ao's ``PerChannelMinMaxObserver``) and packed for FBGEMM with ``bias``."""
    from torch.ao.quantization.observer import PerChannelMinMaxObserver

    with torch.no_grad():
        w = weight.detach()
        observer = PerChannelMinMaxObserver(
            ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric
        )
        observer(w)
        scale, zero_point = observer.calculate_qparams()
        with warnings.catch_warnings():  # torch deprecates quantized tensors (for torchao,
            warnings.filterwarnings("ignore", "torch.quantize_per_tensor")  # not eager-fast)
            q = torch.quantize_per_channel(w, scale.double(), zero_point, 0, torch.qint8)
        with fbgemm_engine():  # the packing's kernel library
            return torch.ops.quantized.linear_prepack(
                q, None if bias is None else bias.detach().float()
            )


def _int8(owner: nn.Module, weight: Tensor, bias: Tensor | None):
    """:func:`_pack_int8` of ``weight`` (a module's, or rows of it) and ``bias``, kept for
    ``owner`` while both are unchanged; None where int8 cannot run it (a weight not float32
    or not on a CPU, or no int8 kernels: :func:`int8_available`)."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or not int8_available():
        return None
    key = (_key(weight), None if bias is None else _key(bias))
    entry = _INT8.get(owner)
    if entry is None or entry[0] != key:
        entry = (key, _pack_int8(weight, bias))
        _INT8[owner] = entry
    return entry[1]


def _int8_product(x: Tensor, packed, relu: bool = False) -> Tensor:
    """x (..., in) float32 through the int8 ``packed`` weight (bias included), then ReLU.

    The input's scale is one for the whole call, chosen by FBGEMM from the input's range, and
    non-finite inputs are not checked (a pass over every input would cost about 5% of a
    decoding step): a NaN is quantized as a finite value, an infinity turns other rows'
    outputs to NaN, and an input that is all NaN, for which FBGEMM cannot choose a scale, is
    refused here by name. float32 (the default) keeps them in their rows.
    """
    flat = x.reshape(-1, x.shape[-1])  # (M, in)
    op = torch.ops.quantized.linear_relu_dynamic if relu else torch.ops.quantized.linear_dynamic
    try:
        out = op(flat, packed, True)  # (M, out); reduce_range: 7-bit inputs
    except RuntimeError as err:
        if bool(torch.isfinite(flat).all()):
            raise
        raise ValueError(
            "int8: a linear layer's input holds NaN or inf (the model's activations "
            "overflowed); int8 quantizes each input with one scale and cannot run it: use "
            "float32"
        ) from err
    return out.view(*x.shape[:-1], out.shape[-1])


def _row_major(packed: Tensor, weight: Tensor) -> tuple[Tensor, np.ndarray]:
    """``weight`` (out, in) as an (in, out) copy on 2 MiB pages and numpy's view of it, made
    once per ``packed`` weight and freed with it: contiguous, or, for a narrow output layer
    (:func:`attnkit.generation.blas.dot_form`), the transpose of a contiguous (out, in) copy."""
    key = id(packed)
    copy = _ROW_MAJOR.get(key)
    if copy is None:
        as_stored = blas.dot_form(weight)
        source = weight.detach() if as_stored else weight.detach().t()  # the layout kept
        kept = hugepages.empty(tuple(source.shape), weight.dtype)
        kept.copy_(source)
        t = kept.t() if as_stored else kept  # (in, out); column-major when kept as stored
        copy = _ROW_MAJOR[key] = (t, t.numpy())
        weakref.finalize(packed, _ROW_MAJOR.pop, key, None)
    return copy


HALF_MIN_SIDE = 1024  # a bfloat16 row takes the float16 copy of weights this long on a side
HALF_AFTER_ROWS = 256  # ... once the weight has multiplied this many single rows
_HALF_BLOCK = 4096  # weight rows checked at a time when a copy is made
# id(packed weight) -> [single bfloat16 rows it multiplied, whether a copy was asked for, key
# of the bias it holds, (FBGEMM's float16 packing of the weight times 2^shift with the bias,
# (1,) float32 2^-shift) or None]; freed with the packed weight
_HALF: dict[int, list] = {}
_HALF_LOCK = threading.Lock()  # one thread makes a copy; the others wait for it


def _half_copy(packed: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[object, Tensor] | None:
    """The float16 copy of a bfloat16 ``weight`` for one more single row, made once the weight
    has multiplied :data:`HALF_AFTER_ROWS` single rows (None before, and where float16 cannot
    hold it or memory is short: :func:`_make_half`); remade when the bias's key changes (a bias
    changed in place without a new version, through ``.data``, is not seen, as for the packed
    weight), freed with ``packed`` (which is remade when the weight changes).

    Making it costs about what 220-360 rows gain (FBGEMM packs at 9-15 ns a weight; a row
    saves about 0.04 ns a weight on the AVX2-only EPYC: GPT-2 124M 1.7 s against 4.7 ms a
    token, the Llama shape 0.31 s against 1.4 ms), so a short call in a fresh process pays
    nothing, and work that goes on pays at most about twice the best choice made in
    hindsight."""
    key = id(packed)
    entry = _HALF.get(key)
    if entry is None:
        entry = _HALF[key] = [0, False, None, None]
        weakref.finalize(packed, _HALF.pop, key, None)
    entry[0] += 1
    if entry[0] < HALF_AFTER_ROWS:
        return None
    bias_key = None if bias is None else _key(bias)
    if not entry[1] or entry[2] != bias_key:
        with _HALF_LOCK:
            if not entry[1] or entry[2] != bias_key:  # not made by another thread meanwhile
                entry[3] = _make_half(weight, bias)
                entry[1], entry[2] = True, bias_key
    return entry[3]


def _make_half(weight: Tensor, bias: Tensor | None) -> tuple[object, Tensor] | None:
    """A bfloat16 ``weight`` scaled by a power of two, ``2^shift``, so that its largest value
    lies in [2^14, 2^15), packed in float16 with ``bias`` (float32) for FBGEMM
    (:func:`pack_float16`), and ``2^-shift`` as a (1,) float32 tensor for the row, if float16
    holds every scaled weight exactly (bfloat16's 8 significant bits fit from 2^-17 up: values
    2^31 below the largest one) and the copy, with the float32 one made on the way, fits in
    half of the memory still available; else None."""
    if not fits_in_half_free_memory(weight.numel() * (4 + 2)):
        return None
    with torch.no_grad():
        largest = float(weight.detach().abs().max())
        if not 0 < largest < float("inf"):
            return None
        shift = 14 - int(np.floor(np.log2(largest)))
        if not -126 <= shift <= 126:  # 2^shift and 2^-shift are normal float32 numbers
            return None
        scaled = weight.detach().float().mul_(2.0**shift)  # exact: a power of two
        for rows in scaled.split(_HALF_BLOCK):  # float16 holds every value (a block at a time)
            if not torch.equal(rows.half().float(), rows):
                return None
        wide_bias = None if bias is None else bias.detach().float()  # exact
        return pack_float16(scaled, wide_bias), torch.tensor([2.0**-shift])


def _one_bf16_row(x: Tensor, weight: Tensor, bias: Tensor | None, packed: Tensor) -> Tensor:
    """``F.linear(x, weight, bias)`` for one bfloat16 row on a CPU without oneDNN's bfloat16
    kernels (:func:`_bf16_in_float32`).

    torch's bfloat16 product streams a weight at 9-15 GB/s on the AVX2-only AMD EPYC; FBGEMM's
    float16-weight product reads the same bytes at 15-26 GB/s for weights of
    :data:`HALF_MIN_SIDE` or more on a side (GPT-2's 768 x 2304, 768 x 3072, 3072 x 768 and
    output layer, the Llama shape's 512 x 2816, 1408 x 512 and output layer), but not for
    narrower ones (512 x 512, 768 x 768: 5-30% slower; docs/benchmarks.md, "Modern
    attention"). So such weights get a float16 copy scaled by ``2^shift`` once they have
    multiplied :data:`HALF_AFTER_ROWS` single rows (:func:`_half_copy`, where float16 holds
    it exactly), multiplied by the row widened to float32 and scaled by ``2^-shift`` (both
    exact, unless a row value lies within a factor ``2^|shift|`` of float32's range), with the
    sums and the bias in float32 as torch's bfloat16 product has them, rounded to bfloat16
    once: torch's result up to the order of the sums (and its overflow where a sum overflows).
    """
    copy = None
    if max(weight.shape) >= HALF_MIN_SIDE and float16_available():
        copy = _half_copy(packed, weight, bias)
    if copy is None:
        return F.linear(x, weight, bias)
    half, unscale = copy
    row = torch.mul(x.reshape(1, x.shape[-1]), unscale)  # (1, in) float32 (a (1,) tensor widens)
    out = torch.ops.quantized.linear_dynamic_fp16(row, half)  # (1, out) float32, bias added
    return out.to(x.dtype).view(*x.shape[:-1], -1)


def linear(
    x: Tensor, module: nn.Linear, packed: Tensor | None, *, openblas: bool = False
) -> Tensor:
    """``module(x)`` with the ``packed`` weight from :func:`packed_weight` (None: ``F.linear``).

    A single float32 row takes MKL's matrix-vector product where it is the faster one: on
    Intel CPUs (:func:`attnkit.hardware.mkl_gemv_is_fast`) through ``F.linear``; where MKL
    runs generic code (:func:`attnkit.hardware.mkl_gemv_is_generic`: AMD) on a copy of the
    weight transposed to (in, out) (or kept (out, in) for a narrow output,
    :func:`attnkit.generation.blas.dot_form`), whose product reads the weight in one stream: GPT-2
    124M's 49 layers took 26.8 ms a row that way on the AVX2-only AMD EPYC, against 35.0
    prepacked and 36.8 through ``F.linear`` (from 2 rows on the packed weight is faster:
    37.4 against 46.0 ms; docs/benchmarks.md, "Text generation"). With ``openblas`` (set by
    :func:`packed_linears` where OpenBLAS runs on one thread), the weights the rule of
    :func:`attnkit.generation.blas.takes` picks are multiplied on that copy by numpy's
    OpenBLAS (:mod:`~attnkit.generation.blas`; a GPT-2 124M step 33.9 -> 29.7 ms there),
    other ones by MKL. The copy costs the weight's memory once more, made at the first such
    call. A single bfloat16 row on a weight packed in float32 (:func:`_bf16_in_float32`)
    takes ``F.linear`` or a float16 copy (:func:`_one_bf16_row`).

    Args:
        x: (..., in_features) in the weight's dtype.
        openblas: OpenBLAS runs on one thread (:func:`attnkit.generation.blas.single_threaded`).
    """
    return _product(x, module.weight, module.bias, packed, openblas=openblas)


def _product(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    packed: Tensor | None,
    relu: bool = False,
    *,
    openblas: bool = False,
) -> Tensor:
    """``F.linear(x, weight, bias)`` (then ReLU) on ``packed`` where :func:`linear` says;
    ``packed`` may also be int8 packed params (:func:`_int8`, the bias inside them)."""
    int8 = packed is not None and not isinstance(packed, Tensor)  # packed_linears(int8=True)
    if (
        packed is None
        or torch.is_grad_enabled()
        or x.dtype != weight.dtype
        or (not int8 and _MKL_GEMV and x.dtype == torch.float32 and x.numel() == x.shape[-1])
    ):  # the last: one float32 row, where MKL's gemv is faster
        out = F.linear(x, weight, bias)
        return F.relu(out) if relu else out
    if int8:
        return _int8_product(x, packed, relu)
    compiling = torch.compiler.is_dynamo_compiling()
    if x.numel() == x.shape[-1] and (
        packed.dtype != x.dtype  # bfloat16 computed in float32 (_bf16_in_float32)
        or (_MKL_GENERIC and x.dtype == torch.float32)
    ):  # one row, on a path made in Python: one operator of its own in a compiled step
        if compiling:
            return _one_row_product(x, weight, bias, packed, relu, openblas)
        return _one_row(x, weight, bias, packed, relu, openblas)
    # oneDNN applies the ReLU to the float accumulators before rounding to the output dtype,
    # the same values as rounding first (ReLU keeps the sign), in one pass fewer.
    attr = "relu" if relu else "none"
    run = _packed_product if compiling else _onednn_product
    if packed.dtype != x.dtype:  # bfloat16 computed in float32 (_bf16_in_float32)
        wide = None if bias is None else bias.float()
        return run(x.float(), packed, wide, attr).to(x.dtype)  # (..., out)
    return run(x, packed, bias, attr)  # (..., out)


def _one_row(
    x: Tensor, weight: Tensor, bias: Tensor | None, packed: Tensor, relu: bool, openblas: bool
) -> Tensor:
    """The one-row products of :func:`linear` that are made in Python (the copies are made and
    counted here): a bfloat16 row on a weight packed in float32 (:func:`_one_bf16_row`), or a
    float32 row where MKL runs generic code (the weight's row-major copy, through OpenBLAS or
    MKL). x: (..., in) holding one row; returns (..., out), then ReLU with ``relu``."""
    if packed.dtype != x.dtype:
        out = _one_bf16_row(x, weight, bias, packed)
    else:
        row = x.reshape(1, x.shape[-1])  # (1, in)
        wt, wt_array = _row_major(packed, weight)  # (in, out)
        if openblas and blas.takes(weight):
            out = blas.row_product(row, wt_array, bias)  # (1, out): OpenBLAS, one thread
        else:
            out = row @ wt if bias is None else torch.addmm(bias, row, wt)  # (1, out): MKL
        out = out.view(*x.shape[:-1], -1)
    return F.relu(out) if relu else out


def _onednn_product(x: Tensor, packed: Tensor, bias: Tensor | None, attr: str) -> Tensor:
    """x (..., in) times the oneDNN-packed weight (out, in), plus bias, then ``attr`` ("relu"
    or "none"): (..., out)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, attr, [], "")


# :func:`_onednn_product` as one operator of its own for torch.compile
# (:mod:`attnkit.generation.compiled`): TorchInductor lowers oneDNN's product only on weights it
# packed itself (frozen graph constants), and a packed weight here is a graph input. Defined
# with torch.library's low-level API, whose dispatch costs about 3 us a call where a
# ``torch.library.custom_op`` costs about 26 (measured on the Xeon; 33 calls a Llama step).
_LIB = torch.library.Library("attnkit", "FRAGMENT")
_LIB.define("packed_product(Tensor x, Tensor packed, Tensor? bias, str attr) -> Tensor")
for _key_name in ("CPU", "MkldnnCPU"):  # the packed weight is a oneDNN tensor
    _LIB.impl("packed_product", _onednn_product, _key_name)
_packed_product = torch.ops.attnkit.packed_product.default


@torch.library.register_fake("attnkit::packed_product")
def _(x: Tensor, packed: Tensor, bias: Tensor | None, attr: str) -> Tensor:
    return x.new_empty((*x.shape[:-1], packed.shape[0]))  # (..., out)


# :func:`_one_row` as an operator for torch.compile: dynamo cannot trace the copies it makes and
# counts in Python, so a compiled step calls it whole, as eager steps do (the float16 copies of
# bfloat16 weights on an AVX2 CPU, the row-major copies where MKL is generic).
_LIB.define(
    "one_row_product(Tensor x, Tensor weight, Tensor? bias, Tensor packed, bool relu, "
    "bool openblas) -> Tensor"
)
for _key_name in ("CPU", "MkldnnCPU"):
    _LIB.impl("one_row_product", _one_row, _key_name)
_one_row_product = torch.ops.attnkit.one_row_product.default


@torch.library.register_fake("attnkit::one_row_product")
def _(
    x: Tensor, weight: Tensor, bias: Tensor | None, packed: Tensor, relu: bool, openblas: bool
) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))  # (..., out), x's dtype


@contextmanager
def packed_linears(model: nn.Module, *, int8: bool = False) -> Iterator[None]:
    """Within the block, every plain ``nn.Linear`` of ``model`` with a packable weight runs on
    its packed weight (gradient-free calls only; others take ``F.linear`` as usual).

    With ``int8``, float32 weights on a CPU are packed as int8 instead (module docstring;
    others as without it): a computation of its own, within the rounding of int8 of float32's
    results, for inference.
    """

    widen = _float32_copies_fit(model)

    def pack(owner: nn.Module, weight: Tensor, bias: Tensor | None):
        quantized = _int8(owner, weight, bias) if int8 else None
        if quantized is None and not widen and _bf16_in_float32(weight.dtype):
            return None  # no room for a float32 copy: torch's bfloat16 F.linear
        return quantized if quantized is not None else _packed(owner, weight)

    # One-row products through OpenBLAS where it is held at one thread, asked once (blas holds
    # nothing and answers False where MKL is not generic or numpy has no OpenBLAS).
    with blas.one_thread():
        openblas = blas.single_threaded()
        patched: list[tuple[nn.Module, str]] = []  # (module, name of the method patched)
        try:
            _patch(model, pack, openblas, patched)
            yield
        finally:
            for module, name in patched:
                module.__dict__.pop(name, None)


def _patch(model: nn.Module, pack, openblas: bool, patched: list) -> None:
    """Route ``model``'s linear layers through the weights ``pack(owner, weight, bias)`` gives
    (None: leave the layer), appending each patch to ``patched`` as it is made."""
    for module in model.modules():
        # Only the exact classes (subclasses may compute something else), and not twice.
        if type(module) is nn.Linear and "forward" not in module.__dict__:
            packed = pack(module, module.weight, module.bias)
            if packed is not None:
                patched.append((module, "forward"))  # recorded first: undone even if cut short
                module.forward = _forward(module, packed, openblas)
        elif (
            type(module) is MultiHeadAttention
            and module.kv_dim == module.d_model  # queries are the first rows of in_proj
            and "_project_q" not in module.__dict__
        ):
            d, bias = module.d_model, module.in_proj.bias
            packed = pack(module, module.in_proj.weight[:d], None if bias is None else bias[:d])
            if packed is not None:
                patched.append((module, "_project_q"))
                module._project_q = _project_q(module, packed, openblas)
        elif (
            type(module) is FeedForward
            and not module.gated
            and type(module.activation) is nn.ReLU
            and "forward" not in module.__dict__
        ):
            first = module.linear1
            packed = pack(first, first.weight, first.bias)
            patched.append((module, "forward"))
            module.forward = _feed_forward_relu(module, packed, openblas)


def _forward(module: nn.Linear, packed: Tensor, openblas: bool):
    ref = weakref.ref(module)  # the module holds this function: no reference cycle through it

    def forward(x: Tensor) -> Tensor:
        return linear(x, ref(), packed, openblas=openblas)

    return forward


def _project_q(module: MultiHeadAttention, packed: Tensor, openblas: bool):
    """Cross-attention's query projection (the first ``d_model`` rows of ``in_proj``) on its
    own packed weight: a slice of the stacked weight would be reordered at every call."""
    ref = weakref.ref(module)

    def project_q(x: Tensor) -> Tensor:
        m = ref()
        d = m.d_model
        bias = None if m.in_proj.bias is None else m.in_proj.bias[:d]
        return _product(x, m.in_proj.weight[:d], bias, packed, openblas=openblas)  # (B, T_q, D)

    return project_q


def _feed_forward_relu(module: FeedForward, packed: Tensor | None, openblas: bool):
    """A ReLU feed-forward layer with the ReLU fused into its first product (``packed``: its
    packed weight, or None for ``F.linear`` then ReLU), outside training (dropout) and
    gradients; the module's own forward otherwise."""
    ref = weakref.ref(module)

    def forward(x: Tensor) -> Tensor:
        m = ref()
        if m.training or torch.is_grad_enabled():
            return FeedForward.forward(m, x)
        first = m.linear1
        hidden = _product(x, first.weight, first.bias, packed, relu=True, openblas=openblas)
        return m.linear2(hidden)  # (..., d_model)

    return forward


def release(model: nn.Module) -> None:
    """Forget the packed weights of ``model``'s linear layers (frees their memory), and the
    float16 screens of its output layers (:mod:`~attnkit.generation.screen`)."""
    from attnkit.generation import screen  # (screen imports this module)

    for module in model.modules():
        _PACKED.pop(module, None)  # its row-major copy goes with the packed weight
        _INT8.pop(module, None)
        screen.release(module)
