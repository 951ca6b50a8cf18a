"""The position-wise feed-forward layer: Linear -> ReLU/GELU -> dropout -> Linear."""

from __future__ import annotations

from torch import Tensor, nn

ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    # GPT-2's GELU, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (HF "gelu_new")
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
}


def make_activation(name: str) -> nn.Module:
    """The activation module called ``name`` (one of :data:`ACTIVATIONS`)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]()


class FeedForward(nn.Module):
    """FFN(x) = W_2 dropout(act(W_1 x + b_1)) + b_2 (ReLU in the paper, GELU in BERT).

    Args:
        d_model: input and output width.
        d_ff: hidden width.
        activation: ``"relu"`` or ``"gelu"``.
        dropout: dropout after the activation, in training only.
        bias: whether the linear layers have biases.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        activation: str = "relu",
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.activation = make_activation(activation)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """(..., d_model) -> (..., d_model)."""
        return self.linear2(self.dropout(self.activation(self.linear1(x))))
