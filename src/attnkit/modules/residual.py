"""Residual connection with a normalisation (LayerNorm or RMSNorm), before (pre-LN) or after
(post-LN) the sublayer."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from attnkit.dropout import Dropout
from attnkit.modules.norm import make_norm


class Residual(nn.Module):
    """post-LN: Norm(x + dropout(f(x))), the paper's form;
    pre-LN: x + dropout(f(Norm(x))), seeds 002/004 and most modern models.

    ``block(x, f)`` always returns a tensor. A sublayer that returns more than its output
    (attention and its weights) uses the two halves: ``f(block.pre(x))``, then
    ``block.post(x, output)``.

    Args:
        d_model: width normalised.
        dropout: dropout on the sublayer output, in training only (:class:`attnkit.dropout.Dropout`:
            torch's distribution, a cheaper mask on a CPU).
        norm_first: pre-LN when true, post-LN when false.
        eps: the normalisation's epsilon.
        norm: ``"layer"`` (LayerNorm) or ``"rms"`` (RMSNorm, Llama).
    """

    def __init__(
        self, d_model: int, *, dropout: float, norm_first: bool, eps: float, norm: str = "layer"
    ) -> None:
        super().__init__()
        self.norm = make_norm(norm, d_model, eps=eps)
        self.dropout = Dropout(dropout)  # nn.Dropout with a cheaper CPU mask
        self.norm_first = norm_first

    def pre(self, x: Tensor) -> Tensor:
        """The sublayer's input: Norm(x) for pre-LN, x itself for post-LN."""
        return self.norm(x) if self.norm_first else x

    def post(self, x: Tensor, out: Tensor) -> Tensor:
        """x + dropout(out), then the norm for post-LN."""
        # Dropout is the identity outside training: not calling it saves a module call per
        # block in every decoding step.
        y = x + (self.dropout(out) if self.training else out)
        return y if self.norm_first else self.norm(y)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        out = sublayer(self.pre(x))
        if not isinstance(out, Tensor):
            raise TypeError(
                f"sublayer: expected it to return a Tensor, got {type(out).__name__} (a sublayer "
                "that returns more uses Residual.pre and Residual.post)"
            )
        return self.post(x, out)
