"""Greedy decoding's next token without the whole float32 output layer: screened with
float16 weights, decided in float32.

Greedy decoding needs only the argmax of each row's logits, not the logits. At one row a step
of GPT-2 124M reads its 154 MB float32 output layer to find one id, a fifth of the step. A
float16 copy of the output layer (77 MB) multiplied by the float32 inputs (FBGEMM's product,
``torch.ops.quantized.linear_dynamic_fp16``, which widens the weights to float32 and keeps the
inputs as they are) gives every logit to within a bound known in advance, and only the ids
whose upper bound reaches the best lower bound can be the argmax. Those candidates (one to a
few) are multiplied again with their float32 weight rows, and the largest of those float32
logits (the first one of ties) is the token. So the token is the argmax of the float32 logits
that the whole product gives, up to the order of the float additions inside a dot product (as
between any two BLAS kernels).

The bound, for one row ``x`` (n inputs) and output ``j`` with float32 weight row ``w_j`` and
its float16 rounding ``h_j``, by Cauchy-Schwarz:

    |x . w_j - x . h_j| <= |x|_2 |w_j - h_j|_2

and the float rounding of both dot products, each at most ``n 2^-24 |x|_2 |row|_2`` (here
doubled: ``n 2^-23``), and of adding a bias; products in float32's subnormal range round by
an absolute ``2^-150`` each, so ``4 (n + 1) 2^-149`` is added to every bound, and a step
whose logits could overflow (``|x|_2 max_j |w_j|_2`` near float32's range) is not screened.
``|w_j - h_j|_2`` and ``|w_j|_2`` are computed once, in float64, when the copy is made, so a
step's bound is ``|x|_2`` times a per-output constant. An id whose upper bound is below the
largest lower bound has a float32 logit below another id's: not the argmax. Tests check the
bound against float64 logits on inputs of many scales, and tokens against float32's argmax on
rows built so that only the float32 weights tell the best id.

Where the screen does not decide, the caller computes the float32 logits as usual: more than
:data:`MAX_CANDIDATES` candidates in a row (near-ties), an input that is not finite (NaN or
inf, which the float32 path reports), a bound or a candidate's logit that overflows. It is
made for float32 output layers on a CPU with FBGEMM, of at least :data:`MIN_OUTPUTS` outputs
(below that the float32 product costs little) and weights that float16 can hold, and kept
while the weight is unchanged (:func:`attnkit.generation.packed.release` drops it).

Measured on the AVX2-only AMD EPYC (one thread, weights from memory; docs/benchmarks.md,
"Text generation"): GPT-2's output layer (50,257 x 768) takes 6.4 ms in float32 and 3.3 ms
with float16 weights at one row, 17.6 and 8.4 ms at 8 rows. Making the copy and its bound
takes 1.08 s there (FBGEMM's packing 0.61 s of it; the Llama shape's 32,000 x 512: 0.33 s),
which GPT-2 124M wins back after about 290 new tokens at one row (3.7 ms a step) and 120 at 8
rows (9 ms a step); both costs grow with the layer. So :func:`attnkit.generation.generate`
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
import weakref

import numpy as np
import torch
from torch import Tensor, nn

from attnkit.generation import packed as packing

__all__ = [
    "MAX_CANDIDATES",
    "MIN_OUTPUTS",
    "MIN_NEW_TOKENS",
    "Screen",
    "available",
    "greedy_tokens",
    "ready",
    "release",
    "screen",
    "served",
    "worth_making",
]

MAX_CANDIDATES = 64  # per row; more: the float32 logits decide (near-ties, a flat row)
MIN_OUTPUTS = 4096  # smaller output layers take their float32 product
MIN_NEW_TOKENS = 256  # new tokens of a one-row call worth making the copy for; half at 2+ rows

_EPS = 2.0**-23  # float32's unit roundoff, doubled
_BLOCK = 4096  # rows of the weight measured at a time when the copy is made (cache-sized)
_SAFE = 2.0**126  # logits (and every partial sum) below this magnitude cannot overflow

# nn.Linear -> (key of the weight and bias it was made from, Screen or None)
_SCREENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MAKING = threading.Lock()
# nn.Linear -> (key of its weight and bias, greedy steps its logits served toward a screen)
_SERVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def available() -> bool:
    """True where torch has FBGEMM's float16-weight product and it runs (x86 CPUs with AVX2)."""
    return packing.float16_available()


class Screen:
    """The float16 copy of an output layer and the per-output constant of the bound.

    Attributes:
        packed: FBGEMM's packed float16 weight (no bias).
        spread: (V,) float64: ``|w_j - h_j|_2 + n 2^-23 (2 |w_j|_2 + |w_j - h_j|_2)``, rounded
            up (module docstring); a row's bound is ``|x|_2`` times it, plus ``tiny`` (the
            absolute rounding of float32's subnormal range, ``4 (n + 1) 2^-149``).
        largest: the largest ``|w_j|_2``: with ``|x|_2`` it bounds every logit and partial
            sum, and a step whose bound nears float32's range is left to the logits.
        spread_array, spread_max: numpy's view of it, and its largest value.
        bias_error: (V,) numpy float32, the float rounding of adding the bias on both sides, or
            None without a bias; bias_error_max its largest value (0 without).
    """

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        with torch.no_grad():
            w = weight.detach()
            n = w.shape[1]
            gaps = torch.empty(w.shape[0], dtype=torch.float64)
            sizes = torch.empty_like(gaps)
            for start in range(0, w.shape[0], _BLOCK):
                block = w[start : start + _BLOCK].double()  # (rows, n): squares cannot underflow
                gaps[start : start + _BLOCK] = torch.linalg.vector_norm(
                    block - block.half().double(), dim=1
                )  # |w_j - h_j|_2
                sizes[start : start + _BLOCK] = torch.linalg.vector_norm(block, dim=1)
            # float64, with a relative 2^-40 more for its own rounding
            self.spread = (gaps + n * _EPS * (2 * sizes + gaps)) * (1 + 2.0**-40)  # (V,)
            # the float rounding of products in float32's subnormal range is absolute: 2^-150
            # per operation, 2n operations per dot product, two dot products (and the bias)
            self.tiny = 4 * (n + 1) * 2.0**-149
            # |x . w_j| and every partial sum are at most |x|_2 |w_j|_2 (+ |bias|): below
            # float32's range by this factor, no sum overflows in any order
            self.largest = float(sizes.max()) + 2.0**-149  # max_j |w_j|_2
            self.spread_array = self.spread.numpy()
            self.spread_max = float(self.spread.max())
            self.packed = packing.pack_float16(w)
            self.bias_error = None  # (V,) numpy float32, or None
            self.bias_error_max = self.bias_max = 0.0
            if bias is not None:
                self.bias_error = (4 * _EPS * bias.detach().abs()).numpy()
                self.bias_error_max = float(self.bias_error.max())
                self.bias_max = float(bias.detach().abs().max())

    def tokens(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
        """The argmax of each row of ``x @ weight.T + bias`` (M,) int64, or None where the
        screen does not decide (module docstring); ``x`` (M, n) float32 on a CPU, called
        without autograd (:func:`greedy_tokens`)."""
        approx = torch.ops.quantized.linear_dynamic_fp16(x, self.packed)  # (M, V)
        if bias is not None:
            approx += bias
        a, xs = approx.numpy(), x.detach().numpy()  # (M, V), (M, n)
        m = a.shape[0]
        # |x|_2 in float64, rounded up a little: the bound must not shrink by rounding
        norm = np.sqrt(np.square(xs, dtype=np.float64).sum(axis=1)) * (1 + 2.0**-20)  # (M,)
        if not norm.max(initial=0.0) * self.largest + self.bias_max < _SAFE:
            return None  # NaN or inf in x, or logits that could overflow in some order
        best = np.argmax(a, axis=1)  # (M,) the screen's best id of each row (a NaN's if any)
        # The float32 logit of ``best`` is at least floor: an id below floor is not the argmax.
        floor = a[np.arange(m), best] - (
            norm * self.spread_array[best] + self._bias_error(best) + self.tiny
        )
        # An id reaches floor only if a_j + err_j >= floor, and err_j is at most norm * the
        # largest spread (+ the largest bias term): a superset of the candidates in one pass.
        reach = floor - (norm * self.spread_max + self.bias_error_max + self.tiny)  # (M,) float64
        if not np.isfinite(reach).all():  # (a NaN from a bias the checks let through)
            return None
        reach32 = np.nextafter(reach.astype(np.float32), np.float32(-np.inf))  # rounded down
        flat = np.flatnonzero(a >= reach32[:, None])  # (C,) row-major, ids ascending
        if flat.size == m:  # one candidate a row (each row has its best): the argmax
            return torch.from_numpy(best.astype(np.int64))  # (M,)
        rows, ids = np.divmod(flat, a.shape[1])  # (C,) each
        if flat.size > MAX_CANDIDATES:  # keep those whose own bound reaches floor
            err = norm[rows] * self.spread_array[ids] + self._bias_error(ids) + self.tiny
            keep = a[rows, ids] + err >= floor[rows]
            rows, ids = rows[keep], ids[keep]
        counts = np.bincount(rows, minlength=m)  # (M,) each at least 1
        if counts.max() > MAX_CANDIDATES:
            return None
        exact = np.einsum("cn,cn->c", weight.detach().numpy()[ids], xs[rows])  # (C,) float32
        if bias is not None:
            exact = exact + bias.detach().numpy()[ids]
        if not np.isfinite(exact).all():
            return None
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))  # (M,)
        # each row's largest float32 logit, the first of ties (ids ascending: the smallest)
        picked = [ids[s + np.argmax(exact[s : s + c])] for s, c in zip(starts, counts, strict=True)]
        return torch.tensor(picked, dtype=torch.int64)  # (M,)

    def _bias_error(self, ids: np.ndarray) -> np.ndarray | float:
        return 0.0 if self.bias_error is None else self.bias_error[ids]


def screen(head: nn.Module) -> Screen | None:
    """The :class:`Screen` of output layer ``head``, made at the first call and kept while its
    weight and bias are unchanged; None where the screen does not apply (module docstring)."""
    if type(head) is not nn.Linear:
        return None
    weight, bias = head.weight, head.bias
    if (
        weight.dtype != torch.float32
        or weight.device.type != "cpu"
        or weight.shape[0] < MIN_OUTPUTS
        or not available()
    ):
        return None
    key = _key(head)
    entry = _SCREENS.get(head)
    if entry is None or entry[0] != key:
        with _MAKING:  # one thread makes it (about a second); the others wait and take it
            entry = _SCREENS.get(head)
            if entry is None or entry[0] != key:
                with torch.no_grad():  # (parameters made in inference mode refuse autograd's ops)
                    made = Screen(weight, bias) if _fits_float16(weight, bias) else None
                entry = (key, made)
                _SCREENS[head] = entry
    return entry[1]


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
    return entry is not None and entry[1] is not None and entry[0] == _key(head)


def _key(head: nn.Linear) -> tuple:
    """What a screen is kept for: ``head``'s weight and bias as they are now."""
    bias = head.bias
    return (packing._key(head.weight), None if bias is None else packing._key(bias))


def _fits_float16(weight: Tensor, bias: Tensor | None) -> bool:
    """Finite weights (and bias) that float16 holds without overflowing (NaN fails both)."""
    largest = float(weight.detach().abs().amax())
    return largest < 65504 and (bias is None or bool(torch.isfinite(bias).all()))


def greedy_tokens(head: nn.Module, hidden: Tensor) -> Tensor | None:
    """The greedy tokens (M,) for the last hidden states ``hidden`` (M, n) through output layer
    ``head``, screened with float16 weights (module docstring), or None: then compute the
    logits."""
    if hidden.dtype != torch.float32 or hidden.device.type != "cpu":
        return None
    found = screen(head)
    if found is None:
        return None
    # no autograd; NaN or inf from a non-finite input is found and answered by None
    with torch.no_grad(), np.errstate(invalid="ignore", over="ignore"):
        return found.tokens(hidden, head.weight, head.bias)


def release(module: nn.Module) -> None:
    """Forget the screen made for ``module`` (frees its float16 copy) and the steps counted
    toward one."""
    _SCREENS.pop(module, None)
    _SERVED.pop(module, None)
