"""The output head during generation: logits of the newest position only, in the faster layout.

A GPT's head is ``hidden @ W.T`` with ``W`` the (V, d_model) token embedding. During
generation it runs on one position per row per step, a matrix-vector product that reads all of
``W`` (154 MB in float32 for GPT-2 small), and its speed depends on the layout (measured on the
benchmark machine, one thread, V = 50,257, one row):

================  =====================  ======================================
dtype             ``F.linear(x, W)``      ``x @ W_t`` (contiguous (d, V) copy)
================  =====================  ======================================
float32, d 768    18.1 ms                 11.5 ms
float32, d 128    7.3 ms                  2.6 ms
bfloat16, d 768   8.4 ms                  16.2 ms
================  =====================  ======================================

So float32 on CPU uses a transposed copy of ``W`` (made once per model and reused while the
weight is unchanged: it is keyed on the tensor's storage and version counter), everything else
``F.linear``. Both are the same product; only the order of the float additions differs.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

__all__ = ["OutputHead"]

# model -> (key of the weight it was made from, the (d, V) copy)
_TRANSPOSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _use_transposed(weight: Tensor) -> bool:
    """The rule: a contiguous (d, V) copy for float32 CPU weights (table above)."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32


class OutputHead:
    """``model.lm_head`` applied to (N, d_model) hidden states, giving (N, V) logits.

    Args:
        model: a :class:`~attnkit.models.GPT` (anything with an ``lm_head`` ``nn.Linear``).
    """

    def __init__(self, model: nn.Module) -> None:
        head = model.lm_head
        self.weight, self.bias = head.weight, head.bias  # (V, d), (V,) or None
        self.transposed = None
        if _use_transposed(self.weight):
            key = (self.weight.data_ptr(), self.weight._version, tuple(self.weight.shape))
            cached = _TRANSPOSED.get(model)
            if cached is None or cached[0] != key:
                with torch.no_grad():
                    cached = (key, self.weight.detach().t().contiguous())  # (d, V)
                _TRANSPOSED[model] = cached
            self.transposed = cached[1]

    def __call__(self, hidden: Tensor) -> Tensor:
        if self.transposed is None:
            return nn.functional.linear(hidden, self.weight, self.bias)  # (N, V)
        if self.bias is None:
            return hidden @ self.transposed  # (N, V)
        return torch.addmm(self.bias, hidden, self.transposed)  # (N, V)
