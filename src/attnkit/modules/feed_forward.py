"""The position-wise feed-forward layer: Linear -> activation -> dropout -> Linear, or its gated
form (GLU variants: SwiGLU in Llama, Mistral and Qwen)."""

from __future__ import annotations

from torch import Tensor, nn

from attnkit.dropout import Dropout
from attnkit.modules._checks import check_features, check_size

ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    # GPT-2's GELU, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (HF "gelu_new")
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    # x sigmoid(x) (HF "silu"), the gate of SwiGLU
    "silu": nn.SiLU,
}


def make_activation(name: str) -> nn.Module:
    """The activation module called ``name`` (one of :data:`ACTIVATIONS`)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]()


class FeedForward(nn.Module):
    """FFN(x) = W_2 dropout(act(W_1 x + b_1)) + b_2 (ReLU in the paper, GELU in BERT);
    gated: W_2 dropout(act(W_g x) * (W_u x)) (Shazeer 2020; SwiGLU with ``"silu"``).

    The gated form keeps W_g and W_u stacked in ``linear1`` (2 d_ff x d_model, gate rows first),
    so that both are one matrix product, as ``in_proj`` holds W^Q, W^K, W^V.

    Args:
        d_model: input and output width.
        d_ff: hidden width.
        activation: a name of :data:`ACTIVATIONS`.
        dropout: dropout after the activation (after the gating), in training only.
        bias: whether the linear layers have biases.
        gated: the gated (GLU) form.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        activation: str = "relu",
        dropout: float = 0.0,
        bias: bool = True,
        gated: bool = False,
    ) -> None:
        super().__init__()
        check_size("d_model", d_model)
        check_size("d_ff", d_ff)
        self.d_model = d_model
        self.gated = gated
        self.linear1 = nn.Linear(d_model, 2 * d_ff if gated else d_ff, bias=bias)
        self.activation = make_activation(activation)
        self.dropout = Dropout(dropout)  # nn.Dropout with a cheaper CPU mask (attnkit.dropout)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """(..., d_model) -> (..., d_model)."""
        check_features(x, self.d_model)
        hidden = self.linear1(x)  # (..., d_ff) or (..., 2 d_ff)
        if self.gated:
            gate, up = hidden.chunk(2, dim=-1)  # (..., d_ff) each
            hidden = self.activation(gate) * up
        else:
            hidden = self.activation(hidden)
        return self.linear2(self.dropout(hidden) if self.training else hidden)
