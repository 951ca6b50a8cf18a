"""Greedy decoding's next token without the whole output layer (float32 or bfloat16): screened
with an int8 (or float16) copy, decided in float32.

Greedy decoding needs only the argmax of each row's logits, not the logits. At one row a step
of GPT-2 124M reads its 154 MB float32 output layer to find one id, a fifth of the step. A
smaller copy of the output layer multiplied by the inputs gives every logit to within a bound
known in advance, and only the ids whose upper bound reaches the best lower bound can be the
argmax. Those candidates (one to tens) are multiplied again with their float32 weight rows,
and the largest of those float32 logits (the first one of ties) is the token. So the token is
the argmax of the float32 logits that the whole product gives, up to the order of the float
additions inside a dot product (as between any two BLAS kernels).

Two copies, both FBGEMM's (x86 CPUs with AVX2); the first that fits the weights is made:

* int8 (:class:`Int8Screen`, where torch's int8 kernels run): a quarter of the float32 bytes.
  Each row quantized with its own scale, the inputs with one scale a call, multiplied in
  integers (``torch.ops.quantized.linear_dynamic``). Its bound adds the inputs' rounding to
  the weights', so it is looser: tens of candidates a step on the Llama shape of
  ``benchmarks/llama.py`` with random weights (flat logits), against one or two with float16.
  Where logits are so flat that it often cannot decide (more than :data:`MAX_CANDIDATES` in a
  row: :data:`GIVE_UP_UNDECIDED` of a window of :data:`GIVE_UP_WINDOW` calls), it gives way to
  the float16 copy (GPT-2 124M's shape with random weights at 8 rows: ``benchmarks/screen.py``).
* float16 (:class:`Screen`): half the bytes, the float32 inputs kept
  (``torch.ops.quantized.linear_dynamic_fp16``, which widens the weights to float32).

The float16 bound, for one row ``x`` (n inputs) and output ``j`` with float32 weight row
``w_j`` and its float16 rounding ``h_j``, by Cauchy-Schwarz:

    |x . w_j - x . h_j| <= |x|_2 |w_j - h_j|_2

and the float rounding of both dot products, each at most ``n 2^-24 |x|_2 |row|_2`` (here
doubled: ``n 2^-23``), and of adding a bias; products in float32's subnormal range round by
an absolute ``2^-150`` each, so ``4 (n + 1) 2^-149`` is added to every bound, and a step
whose logits could overflow (``|x|_2 max_j |w_j|_2`` near float32's range) is not screened.
``|w_j - h_j|_2`` and ``|w_j|_2`` are computed once, in float64, when the copy is made, so a
step's bound is ``|x|_2`` times a per-output constant (the int8 bound: :class:`Int8Screen`).
An id whose upper bound is below the largest lower bound has a float32 logit below another
id's: not the argmax. Tests check the bounds against float64 logits on inputs of many scales
and at model widths, the packed copies against the values the bounds assume, and tokens
against float32's argmax on rows built so that only the float32 weights tell the best id.

A bfloat16 output layer is screened as its float32 widening (exact), and its token is the
argmax of its logits as its own product gives them: float32 sums rounded to bfloat16, the
first id of ties (up to the order of the float32 additions, as above, which can move a logit
lying within their rounding of a bfloat16 rounding boundary). So an id whose logit may round
to the best one's value is a candidate too (the best's lower bound is lowered by twice
bfloat16's spacing at its magnitude, :func:`_rounding_margin`), and the candidates' float32
logits are rounded before the argmax. Layers with subnormal weights, and calls with
subnormal inputs, are left to the logits: oneDNN's bfloat16 kernels flush those to zero.
Only an int8 copy is made of a bfloat16 layer: a float16 one reads as many bytes as the
layer itself, and FBGEMM's float16 product widens them (at 8 rows of the Llama shape, 4.8 ms
against 4.4 for oneDNN's bfloat16 product with the kernels capped at AVX-512 without AMX);
where the int8 screen gives up, the layer's own product gives the logits.

Where the screen does not decide, the caller computes the float32 logits as usual: more than
:data:`MAX_CANDIDATES` candidates in a row (near-ties, a flat row), an input that is not
finite (NaN or inf, which the float32 path reports), a bound or a candidate's logit that
overflows. It is made for float32 and bfloat16 output layers on a CPU with FBGEMM, of at least
:data:`MIN_OUTPUTS` outputs (below that the float32 product costs little) and weights that
the copy can hold (int8: finite, no row's largest weight below 2^-70; float16: below 65504),
where making it fits in half of the free memory (:func:`_room_to_make`), and kept while the
weight is unchanged (:func:`attnkit.generation.packed.release` drops it).

Measured, one thread, weights from memory: on the AVX2-only AMD EPYC (docs/benchmarks.md,
"Text generation"), GPT-2's output layer (50,257 x 768) takes 6.4 ms in float32 and 3.3 ms
with float16 weights at one row, 17.6 and 8.4 ms at 8 rows. On the Intel Xeon with AMX, the
Llama shape's (32,000 x 512) takes 5.4 ms in float32, 3.4-3.8 ms in float16 and 1.3-1.4 ms in
int8 (1.6-1.7 and 3.6 ms with FBGEMM capped at AVX2); its compiled float32 step at one row
went from 61-65 to 77 tokens/s with int8 ("Modern attention"), and its compiled bfloat16 step
at one row from 1.56-1.62x to 2.25x Hugging Face's tokens/s once its bfloat16 output layer was
screened (int8: 16 MB read where the layer is 33 MB). Making a copy and its bound
takes about a second for GPT-2's layer (1.1 s either kind on the Xeon; 1.08 s for float16 on
the EPYC, FBGEMM's packing 0.61 s of it; the Llama shape's: 0.33-0.46 s), which GPT-2 124M
wins back after about 290 new tokens at one row (3.7 ms a step) and 120 at 8 rows (9 ms a
step); both costs grow with the layer. So :func:`attnkit.generation.generate`
makes it for calls of at least :data:`MIN_NEW_TOKENS` new tokens at one row and half as many
at more rows (:func:`worth_making`), and uses it whenever it is made already: it is kept for
later calls, which then gain from the first token. Shorter calls count the greedy steps their
logits served (:func:`served`: one a step at one row, two at more rows, while the weight is
unchanged), and the step that brings the count to :data:`MIN_NEW_TOKENS` makes the screen: a
server answering many short greedy requests pays for it once it has spent as long without it,
and a single short call never pays.
"""

from __future__ import annotations

import threading
import warnings
import weakref

import numpy as np
import torch
from torch import Tensor, nn

from attnkit.generation import packed as packing

__all__ = [
    "GIVE_UP_UNDECIDED",
    "GIVE_UP_WINDOW",
    "MAX_CANDIDATES",
    "MIN_OUTPUTS",
    "MIN_NEW_TOKENS",
    "SCREENED_DTYPES",
    "Int8Screen",
    "KIND",
    "Screen",
    "available",
    "greedy_tokens",
    "ready",
    "release",
    "screen",
    "served",
    "worth_making",
]

SCREENED_DTYPES = (torch.float32, torch.bfloat16)  # output layers' dtypes a screen is made for
MAX_CANDIDATES = 512  # per row; more: the float32 logits decide (near-ties, a flat row)
# an int8 screen that leaves this many of a window's calls to the logits gives way to float16
GIVE_UP_UNDECIDED, GIVE_UP_WINDOW = 16, 64
MIN_OUTPUTS = 4096  # smaller output layers take their float32 product
MIN_NEW_TOKENS = 256  # new tokens of a one-row call worth making the copy for; half at 2+ rows

_EPS = 2.0**-23  # float32's unit roundoff, doubled
_BLOCK = 4096  # rows of the weight measured at a time when the copy is made (cache-sized)
_SAFE = 2.0**126  # logits (and every partial sum) below this magnitude cannot overflow
_SMALLEST_STEP = 6.1e-5  # torch's smallest input quantization step (SMALL_SCALE_THRESHOLD)

# The kinds of copy, fastest first; None: int8 where FBGEMM's int8 product runs, else float16.
# Tests set "int8" or "float16" to check one kind.
KIND: str | None = None

# nn.Linear -> (key of the weight and bias it was made from, Screen or None)
_SCREENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MAKING = threading.Lock()
# nn.Linear -> (key of its weight and bias, greedy steps its logits served toward a screen)
_SERVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def available() -> bool:
    """True where torch has FBGEMM's int8 or float16-weight product and it runs (x86 CPUs with
    AVX2): where a screen can be made."""
    return bool(_kinds())


def _available16() -> bool:
    """True where FBGEMM's float16-weight product runs."""
    return packing.float16_available()


class Screen:
    """The float16 copy of an output layer and the per-output constants of the bound.

    Attributes:
        kind: "float16" (this class) or "int8" (:class:`Int8Screen`).
        packed: FBGEMM's packed copy of the weight (no bias).
        spread: (V,) float64: ``|w_j - h_j|_2 + n 2^-23 (2 |w_j|_2 + |w_j - h_j|_2)``, rounded
            up (module docstring); a row's bound is ``|x|_2`` times it, plus ``tiny`` (the
            absolute rounding of float32's subnormal range, ``4 (n + 1) 2^-149``).
        step: None here; an :class:`Int8Screen`'s bound adds the input's quantization step
            times it.
        given_up: an :class:`Int8Screen` that left too many calls undecided (:meth:`record`).
        largest: the largest ``|w_j|_2``: with ``|x|_2`` it bounds every logit and partial
            sum, and a step whose bound nears float32's range is left to the logits.
        spread_array, spread_max: numpy's view of it, and its largest value (step_array,
            step_max: the same of ``step``, or None and 0).
        bias_error: (V,) numpy float32, the float rounding of adding the bias on both sides, or
            None without a bias; bias_error_max its largest value (0 without).
    """

    kind = "float16"
    given_up = False  # (an Int8Screen's record)

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        with torch.no_grad():
            w = weight.detach()
            n = w.shape[1]
            self._prepare(w)
            gaps = torch.empty(w.shape[0], dtype=torch.float64)
            sizes, copies, ones = (torch.empty_like(gaps) for _ in range(3))
            for start in range(0, w.shape[0], _BLOCK):
                rows = slice(start, start + _BLOCK)
                block = w[rows].double()  # (rows, n): squares cannot underflow
                copy = self._copy(rows, block)  # (rows, n) float64: the weights screened with
                gaps[rows] = torch.linalg.vector_norm(block - copy, dim=1)  # |w_j - h_j|_2
                sizes[rows] = torch.linalg.vector_norm(block, dim=1)
                copies[rows] = torch.linalg.vector_norm(copy, dim=1)
                ones[rows] = copy.abs().sum(dim=1)
            # float64, with a relative 2^-40 more for its own rounding
            self.spread = self._spread(n, gaps, sizes, copies) * (1 + 2.0**-40)  # (V,)
            self.step = self._step(n, copies, ones)
            # the float rounding of products in float32's subnormal range is absolute: 2^-150
            # per operation, 2n operations per dot product, two dot products (and the bias)
            self.tiny = 4 * (n + 1) * 2.0**-149
            # |x . w_j| and every partial sum are at most |x|_2 |w_j|_2 (+ |bias|): below
            # float32's range by this factor, no sum overflows in any order
            self.largest = float(torch.maximum(sizes, copies).max()) + 2.0**-149
            self.spread_array = self.spread.numpy()
            self.spread_max = float(self.spread.max())
            self.step_array, self.step_max = None, 0.0
            if self.step is not None:
                self.step = self.step * (1 + 2.0**-40)
                self.step_array, self.step_max = self.step.numpy(), float(self.step.max())
            self.packed = self._pack(w)
            self.bias_error = None  # (V,) numpy float32, or None
            self.bias_error_max = self.bias_max = 0.0
            if bias is not None:
                self.bias_error = (4 * _EPS * bias.detach().abs()).numpy()
                self.bias_error_max = float(self.bias_error.max())
                self.bias_max = float(bias.detach().abs().max())

    # -- what a kind of copy defines (float16 here)

    def _prepare(self, w: Tensor) -> None:
        """Whatever the copy needs of the whole weight before its rows are measured."""

    def _copy(self, rows: slice, block: Tensor) -> Tensor:
        """The screened weights of ``rows`` in float64 (``block``: the float32 ones)."""
        return block.half().double()

    def _spread(self, n: int, gaps: Tensor, sizes: Tensor, copies: Tensor) -> Tensor:
        """|x|_2's factor in output j's bound (the class docstring)."""
        return gaps + n * _EPS * (2 * sizes + gaps)

    def _step(self, n: int, copies: Tensor, ones: Tensor) -> Tensor | None:
        """The input quantization step's factor in output j's bound (none here)."""
        return None

    def _pack(self, w: Tensor):
        return packing.pack_float16(w)

    def approx(self, x: Tensor) -> Tensor:
        """The screened logits (M, V) of ``x`` (M, n) float32, without the bias."""
        return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)

    def input_step(self, xs: np.ndarray) -> float | None:
        """What the bound multiplies ``step`` by for the inputs ``xs`` (M, n) of one call (0
        here: inputs are not quantized), or None where the screen must not decide."""
        return 0.0

    def record(self, decided: bool) -> None:
        """Count a call of :meth:`tokens` that did or did not decide for its candidates (not
        for inputs it cannot take, which no kind decides); the float16 screen keeps no count:
        it is the last kind."""

    # -- the token

    def tokens(
        self, x: Tensor, weight: Tensor, bias: Tensor | None, rounding: torch.dtype | None = None
    ) -> Tensor | None:
        """The argmax of each row of ``x @ weight.T + bias`` (M,) int64, or None where the
        screen does not decide (module docstring); ``x`` (M, n) float32 on a CPU, called
        without autograd (:func:`greedy_tokens`). With ``rounding`` (bfloat16: a bfloat16
        output layer, ``x`` its inputs widened), the argmax of the logits rounded to that
        dtype, the first of ties, as the layer's own product gives them."""
        xs = x.detach().numpy()  # (M, n)
        # |x|_2 in float64, rounded up a little: the bound must not shrink by rounding
        norm = np.sqrt(np.square(xs, dtype=np.float64).sum(axis=1)) * (1 + 2.0**-20)  # (M,)
        if not norm.max(initial=0.0) * self.largest + self.bias_max < _SAFE:
            return None  # NaN or inf in x, or logits that could overflow in some order
        step = self.input_step(xs)
        if step is None:
            return None
        approx = self.approx(x)  # (M, V)
        if bias is not None:
            approx += bias
        a = approx.numpy()  # (M, V)
        m = a.shape[0]

        def bound(rows, ids):  # the bound of the screened logits [rows, ids], float64
            err = norm[rows] * self.spread_array[ids] + self.tiny
            if self.step_array is not None:
                err = err + step * self.step_array[ids]
            return err + (0.0 if self.bias_error is None else self.bias_error[ids])

        best = np.argmax(a, axis=1)  # (M,) the screen's best id of each row (a NaN's if any)
        # The float32 logit of ``best`` is at least floor: an id below floor is not the argmax.
        floor = a[np.arange(m), best] - bound(np.arange(m), best)  # (M,) float64
        if rounding is not None:  # an id whose logit rounds to the best's value ties with it
            floor = floor - _rounding_margin(floor)
        # An id reaches floor only if a_j + err_j >= floor, and err_j is at most the bound
        # with every factor at its largest: a superset of the candidates in one pass.
        reach = floor - (
            norm * self.spread_max + step * self.step_max + self.bias_error_max + self.tiny
        )  # (M,) float64
        if not np.isfinite(reach).all():  # (a NaN from a bias the checks let through)
            return None
        reach32 = np.nextafter(reach.astype(np.float32), np.float32(-np.inf))  # rounded down
        flat = np.flatnonzero(a >= reach32[:, None])  # (C,) row-major, ids ascending
        if flat.size == m:  # one candidate a row (each row has its best): the argmax
            self.record(True)
            return torch.from_numpy(best.astype(np.int64))  # (M,)
        rows, ids = np.divmod(flat, a.shape[1])  # (C,) each
        if flat.size > MAX_CANDIDATES:  # keep those whose own bound reaches floor
            keep = a[rows, ids] + bound(rows, ids) >= floor[rows]
            rows, ids = rows[keep], ids[keep]
        counts = np.bincount(rows, minlength=m)  # (M,) each at least 1
        if counts.max() > MAX_CANDIDATES:
            self.record(False)
            return None
        self.record(True)
        exact = np.einsum("cn,cn->c", _rows(weight, ids), xs[rows])  # (C,) float32
        if bias is not None:
            exact = exact + _rows(bias, ids)
        if not np.isfinite(exact).all():
            return None
        if rounding is not None:  # as the layer's product rounds its float32 sums
            exact = torch.from_numpy(exact).to(rounding).float().numpy()
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))  # (M,)
        # each row's largest float32 logit, the first of ties (ids ascending: the smallest)
        picked = [ids[s + np.argmax(exact[s : s + c])] for s, c in zip(starts, counts, strict=True)]
        return torch.tensor(picked, dtype=torch.int64)  # (M,)

    @classmethod
    def fits(cls, weight: Tensor, bias: Tensor | None) -> bool:
        """Finite weights (and bias) that float16 holds without overflowing (NaN fails both)."""
        largest = float(weight.detach().abs().amax())
        return largest < 65504 and _finite(bias)


class Int8Screen(Screen):
    """The int8 copy of an output layer: FBGEMM's int8 product, a quarter of the float32 bytes.

    Each weight row is quantized symmetrically with its own scale ``s_j = max_i |w_ji| / 127``
    (``q_j`` in [-127, 127], ``h_j = s_j q_j``), and at every call FBGEMM quantizes the inputs
    to 7-bit unsigned integers with one scale for the call (``reduce_range``: exact integer
    products on every x86 CPU), multiplies in 32-bit integers (exact) and scales back in float32
    (``torch.ops.quantized.linear_dynamic``, as :mod:`~attnkit.generation.packed`'s int8
    layers). The bound of output j adds to the float16 screen's terms the input's rounding: each
    input moves by at most half its quantization step ``d`` (torch's
    ``ChooseQuantizationParams``: ``d = max(range / 127, 6.1e-5)``, the range including 0), so
    ``|(x - x') . h_j| <= d/2 |h_j|_1``, and FBGEMM's three roundings of the result (relative
    ``2^-24`` each, bounded by ``2^-21 |x'|_2 |h_j|_2``). So the bound is ``|x|_2`` times

        spread_j = |w_j - h_j|_2 + n 2^-23 2 |w_j|_2 + 2^-21 |h_j|_2

    plus ``d`` times ``step_j = 0.51 |h_j|_1 + 2^-21 0.51 sqrt(n) |h_j|_2`` (0.51: half a step
    and the float rounding of computing it), plus the subnormal and bias terms of the float16
    screen. Looser than the float16 bound (more candidates to multiply again: on the Llama
    shape of ``benchmarks/llama.py`` with random weights, tens a step), read in half the time.
    """

    kind = "int8"

    def record(self, decided: bool) -> None:
        """Give up (``given_up``) after a window of :data:`GIVE_UP_WINDOW` calls of which at
        least :data:`GIVE_UP_UNDECIDED` were left to the logits: a model whose logits are
        flatter than the int8 bound can tell apart then takes the float16 screen
        (:func:`screen`), whose bound is about a tenth as wide."""
        self._calls += 1
        self._undecided += not decided
        if self._undecided >= GIVE_UP_UNDECIDED:
            self.given_up = True
        elif self._calls >= GIVE_UP_WINDOW:
            self._calls = self._undecided = 0

    def _prepare(self, w: Tensor) -> None:
        self._calls = self._undecided = 0  # this window's calls (record)
        largest = w.abs().amax(dim=1)  # (V,)
        # a zero row's scale is 1 (its integers are 0); :meth:`fits` refuses tiny scales
        self.scales = torch.where(largest > 0, largest / 127, torch.ones_like(largest))  # (V,)
        self.ints = torch.round(w / self.scales[:, None]).clamp_(-127, 127).to(torch.int8)

    def _copy(self, rows: slice, block: Tensor) -> Tensor:
        return self.ints[rows].double() * self.scales[rows].double()[:, None]

    def _spread(self, n: int, gaps: Tensor, sizes: Tensor, copies: Tensor) -> Tensor:
        return gaps + n * _EPS * 2 * sizes + 2.0**-21 * copies

    def _step(self, n: int, copies: Tensor, ones: Tensor) -> Tensor:
        return 0.51 * ones + 2.0**-21 * 0.51 * n**0.5 * copies

    def _pack(self, w: Tensor):
        with warnings.catch_warnings():  # torch deprecates quantized tensors (for torchao,
            warnings.filterwarnings("ignore", "torch.quantize_per_tensor")  # not eager-fast)
            quantized = torch._make_per_channel_quantized_tensor(
                self.ints, self.scales.double(), torch.zeros(len(self.scales), dtype=torch.long), 0
            )
        with packing.fbgemm_engine():
            packed = torch.ops.quantized.linear_prepack(quantized, None)
        del self.ints  # (the packed copy holds them)
        return packed

    def approx(self, x: Tensor) -> Tensor:
        power = _power(x.detach().numpy())
        return torch.ops.quantized.linear_dynamic(x * power, self.packed, True).div_(power)

    def input_step(self, xs: np.ndarray) -> float | None:
        # the step FBGEMM picks for the call's inputs times ``power`` (their range, with 0),
        # rounded up, in the inputs' own units; finite inputs (checked before: FBGEMM
        # refuses NaN)
        power = _power(xs)
        low, high = min(float(xs.min(initial=0.0)), 0.0), max(float(xs.max(initial=0.0)), 0.0)
        return max((high - low) * power / 127, _SMALLEST_STEP) / power * (1 + 2.0**-20)

    @classmethod
    def fits(cls, weight: Tensor, bias: Tensor | None) -> bool:
        """Finite weights (and bias) whose rows are zero or large enough that no product of
        scales FBGEMM makes is subnormal (every row's largest weight at least 2^-70), with at
        most 2^31 / (127 x 128) inputs (FBGEMM's 32-bit integer sums cannot overflow), and
        weights below 2^124 / n (products of the inputs as FBGEMM takes them, below 2 each,
        cannot overflow before they are scaled back)."""
        w = weight.detach()
        n = w.shape[1]
        if n > 2**31 // (127 * 128):
            return False
        if not bool(torch.isfinite(w).all()) or not _finite(bias):
            return False
        largest = w.abs().amax(dim=1)
        fine = (largest == 0) | ((largest >= 2.0**-70) & (largest * n < 2.0**124))
        return bool(fine.all())


def screen(head: nn.Module) -> Screen | None:
    """The :class:`Screen` of output layer ``head``, made at the first call and kept while its
    weight and bias are unchanged; None where the screen does not apply (module docstring)."""
    if type(head) is not nn.Linear:
        return None
    weight, bias = head.weight, head.bias
    if (
        weight.dtype not in SCREENED_DTYPES
        or weight.device.type != "cpu"
        or weight.shape[0] < MIN_OUTPUTS
        or not available()
    ):
        return None
    key = _key(head)
    entry = _SCREENS.get(head)
    if entry is None or entry[0] != key or _given_up(entry[1]):
        with _MAKING:  # one thread makes it (about a second); the others wait and take it
            entry = _SCREENS.get(head)
            if entry is None or entry[0] != key or _given_up(entry[1]):
                kinds = _kinds()
                if weight.dtype == torch.bfloat16 and KIND is None:  # (module docstring)
                    kinds = [kind for kind in kinds if kind is not Screen]
                if entry is not None and entry[0] == key:  # int8 given up: the next kind
                    kinds = kinds[kinds.index(type(entry[1])) + 1 :]
                made = None
                if _room_to_make(weight) and (weight.dtype == torch.float32 or _normal(head)):
                    with torch.no_grad():  # (parameters made in inference mode refuse autograd)
                        w, b = weight.float(), None if bias is None else bias.float()  # exact
                        made = next((cls(w, b) for cls in kinds if cls.fits(w, b)), None)
                entry = (key, made)
                _SCREENS[head] = entry
    return entry[1]


def _room_to_make(weight: Tensor) -> bool:
    """Whether making a screen of ``weight`` fits in half of the memory still available: its
    float32 widening and the copy's temporaries, about 16 bytes a weight at their peak."""
    return packing.fits_in_half_free_memory(16 * weight.numel())


def _normal(head: nn.Linear) -> bool:
    """No subnormal weight or bias in a bfloat16 layer: oneDNN's bfloat16 kernels (AVX-512 and
    AMX) flush them to zero, which the bound, made for the exact values, does not cover."""
    return not any(_has_subnormal(t) for t in (head.weight, head.bias) if t is not None)


def _has_subnormal(t: Tensor) -> bool:
    size = t.detach().abs()
    return bool(((size > 0) & (size < torch.finfo(torch.float32).tiny)).any())


def _given_up(found: Screen | None) -> bool:
    """Whether ``found`` left too many steps to the logits to be kept (:meth:`Screen.record`)
    while another kind may be made (KIND not set)."""
    return found is not None and found.given_up and KIND is None


def worth_making(rows: int, new_tokens: int) -> bool:
    """Whether a call of ``rows`` rows and ``new_tokens`` new tokens wins back the time that
    making a screen takes (module docstring)."""
    return new_tokens >= (MIN_NEW_TOKENS if rows == 1 else MIN_NEW_TOKENS // 2)


def served(head: nn.Module, rows: int) -> bool:
    """Count one greedy step of ``rows`` rows whose token came from ``head``'s logits although
    a screen could have given it; True once the steps counted while the weight and bias are as
    they are now add up to a call :func:`worth_making` a screen for (:data:`MIN_NEW_TOKENS`
    at one row, one step at more rows counting two)."""
    if type(head) is not nn.Linear:
        return False  # no screen for it (screen())
    key = _key(head)
    entry = _SERVED.get(head)
    count = (entry[1] if entry is not None and entry[0] == key else 0) + (1 if rows == 1 else 2)
    _SERVED[head] = (key, count)
    return count >= MIN_NEW_TOKENS


def ready(head: nn.Module) -> bool:
    """Whether ``head``'s screen is made and current (then using it costs nothing more)."""
    entry = _SCREENS.get(head)
    return (
        entry is not None
        and entry[1] is not None
        and entry[0] == _key(head)
        and not _given_up(entry[1])  # (the next kind is still to be made)
    )


def _key(head: nn.Linear) -> tuple:
    """What a screen is kept for: ``head``'s weight and bias as they are now (and KIND)."""
    bias = head.bias
    return (packing._key(head.weight), None if bias is None else packing._key(bias), KIND)


def _rows(t: Tensor, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of ``t`` (a weight or a bias) as float32 numpy (bfloat16 widened, exact)."""
    t = t.detach()
    if t.dtype == torch.float32:
        return t.numpy()[ids]
    # index_select copies whole rows (aten::index went element by element: 0.8 ms for the
    # candidates of 8 rows of the Llama shape's 32,000 x 512 layer)
    return t.index_select(0, torch.from_numpy(ids)).float().numpy()


def _rounding_margin(floor: np.ndarray) -> np.ndarray:
    """How far below ``floor`` (float64, lower bounds of float32 logits) a logit can lie and
    still round to the bfloat16 value the one at ``floor`` or above rounds to: within a binade
    bfloat16's spacing is at most 2^-7 of the magnitude, a rounded value lies within half a
    spacing, so twice the spacing at ``floor``'s magnitude covers it (and 2^-126 the range
    where the spacing is absolute)."""
    return np.abs(floor) * 2.0**-6 + 2.0**-126


def _finite(bias: Tensor | None) -> bool:
    return bias is None or bool(torch.isfinite(bias).all())


def _power(xs: np.ndarray) -> float:
    """The power of two that brings the inputs' largest magnitude into [1, 2) (1 for zeros):
    an :class:`Int8Screen` multiplies its inputs by it before FBGEMM quantizes them and
    divides the products by it after, both exact (outside float32's subnormal range, which the
    bound's ``tiny`` covers), so that FBGEMM's smallest step (6.1e-5) does not exceed the
    inputs' range / 127 (but for inputs beyond 2^+-126, whose bound takes that step)."""
    largest = float(np.abs(xs).max(initial=0.0))
    if largest == 0.0:
        return 1.0
    return 2.0 ** min(max(1 - int(np.frexp(largest)[1]), -126), 126)  # (a float32 too)


def _kinds() -> list[type[Screen]]:
    """The kinds of screen to make, the first that fits an output layer's weights (KIND)."""
    kinds = {"int8": (Int8Screen, packing.int8_available), "float16": (Screen, _available16)}
    names = ("int8", "float16") if KIND is None else (KIND,)
    return [kinds[name][0] for name in names if kinds[name][1]()]


def greedy_tokens(head: nn.Module, hidden: Tensor) -> Tensor | None:
    """The greedy tokens (M,) for the last hidden states ``hidden`` (M, n) through output layer
    ``head``, screened with an int8 or float16 copy (module docstring), or None: then compute the
    logits."""
    if type(head) is not nn.Linear or hidden.dtype != head.weight.dtype:
        return None
    if hidden.device.type != "cpu":
        return None
    found = screen(head)  # (None for dtypes it does not screen)
    if found is None:
        return None
    rounding = None if hidden.dtype == torch.float32 else hidden.dtype
    if rounding is not None and _has_subnormal(hidden):  # flushed to zero by the layer too
        return None
    # no autograd; NaN or inf from a non-finite input is found and answered by None
    with torch.no_grad(), np.errstate(invalid="ignore", over="ignore"):
        return found.tokens(hidden.float(), head.weight, head.bias, rounding)


def release(module: nn.Module) -> None:
    """Forget the screen made for ``module`` (frees its copy) and the steps counted
    toward one."""
    _SCREENS.pop(module, None)
    _SERVED.pop(module, None)
