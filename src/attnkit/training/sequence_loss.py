"""The translation loss as one module: encoder, decoder and label-smoothed cross-entropy over the
real target tokens, in one forward, so that DDP (and ``torch.compile``) see one module call.

The output projection is left out of the decoder (:func:`decoder_states`) and fused with the
loss chunk by chunk (:func:`~attnkit.training.loss.linear_cross_entropy`), so the (N, V)
logits of the N real target positions are never stored.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnkit.models.transformer import Transformer
from attnkit.training.loss import linear_cross_entropy

__all__ = ["SequenceLoss", "decoder_states"]


def decoder_states(model: Transformer, src: Tensor, tgt_in: Tensor) -> Tensor:
    """Final decoder states (B, T, d_model), before the output projection.

    ``Transformer.forward`` projects every position to the vocabulary; training needs only
    the real (non-pad) target positions, so the projection is left to the caller. The
    feed-forward blocks skip padding positions (``skip_padding``): the states at real
    positions are ``Transformer.decode``'s, those at padding positions are not.
    """
    memory, src_mask, _ = model.encode(src, skip_padding=True)  # (B, S, d_model), (B, 1, S)
    return model.decode(
        tgt_in, memory, src_mask, project=False, skip_padding=True
    ).output  # (B, T, d_model)


class SequenceLoss(nn.Module):
    """Model and loss in one forward, so that DDP (and torch.compile) see one module call.

    Args:
        model: The Transformer.
    """

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, epsilon: float) -> Tensor:
        """Summed label-smoothed cross-entropy over the non-pad positions of ``tgt_out``."""
        hidden = decoder_states(self.model, src, tgt_in)  # (B, T, d_model)
        keep = tgt_out != self.model.config.pad_id  # (B, T)
        # Only the N real target positions are projected; the projection and the loss are
        # fused chunk by chunk, so the (N, V) logits are never stored.
        return linear_cross_entropy(
            hidden[keep], self.model.output.weight, tgt_out[keep], epsilon=epsilon
        )  # (N, d_model) x (V, d_model) -> scalar
