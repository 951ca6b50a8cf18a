"""The encoder-decoder Transformer of "Attention Is All You Need", with the encode()/decode()
split that beam search needs."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
from torch import Tensor, nn

from attnkit.attention import padding_mask
from attnkit.dropout import Dropout
from attnkit.models import config_checks as checks
from attnkit.models.inputs import check_token_ids
from attnkit.modules.decoder import Decoder
from attnkit.modules.encoder import Encoder
from attnkit.modules.kv_cache import KVCache
from attnkit.modules.outputs import DecodeOutput, EncodeOutput
from attnkit.modules.packing import Packing
from attnkit.modules.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

# Integer sizes of TransformerConfig: each from 1 to config_checks.MAX_SIZE.
SIZE_FIELDS = (
    "src_vocab_size",
    "tgt_vocab_size",
    "d_model",
    "num_heads",
    "num_encoder_layers",
    "num_decoder_layers",
    "d_ff",
    "max_len",
)


@dataclass
class TransformerConfig:
    """Sizes and switches of a :class:`Transformer`."""

    src_vocab_size: int = 8000  # source vocabulary (the joint one when embeddings are shared)
    tgt_vocab_size: int = 8000  # target vocabulary
    d_model: int = 256  # model width
    num_heads: int = 8  # attention heads per layer
    num_encoder_layers: int = 3
    num_decoder_layers: int = 3
    d_ff: int = 1024  # feed-forward hidden width
    dropout: float = 0.1  # embedding and residual dropout
    attn_dropout: float = 0.1  # dropout on attention weights
    ffn_dropout: float | None = None  # on the feed-forward's hidden layer; None = dropout
    activation: str = "relu"  # "relu" (the paper) or "gelu"
    norm_first: bool = True  # pre-LN (stable with short schedules); False = the paper's post-LN
    layer_norm_eps: float = 1e-5
    max_len: int = 256  # longest source or target, in tokens with bos/eos
    positional: str = "sinusoidal"  # "sinusoidal" (the paper) or "learned"
    share_embeddings: bool = True  # one embedding table for source and target (joint vocab)
    tie_output: bool = True  # output projection = target embedding matrix
    pad_id: int = 0

    def __post_init__(self) -> None:
        """Checks every field's type and range (:mod:`attnkit.models.config_checks`)."""
        for name in SIZE_FIELDS:
            checks.check_size(name, getattr(self, name))
        for name in ("dropout", "attn_dropout", "ffn_dropout"):
            checks.check_probability(name, getattr(self, name), allow_none=name == "ffn_dropout")
        checks.check_number("layer_norm_eps", self.layer_norm_eps, low=0.0, high=1.0, low_open=True)
        checks.check_choice("activation", self.activation, ("relu", "gelu"))
        checks.check_choice("positional", self.positional, ("sinusoidal", "learned"))
        for name in ("norm_first", "share_embeddings", "tie_output"):
            checks.check_bool(name, getattr(self, name))
        vocab = min(self.src_vocab_size, self.tgt_vocab_size)
        checks.check_size("pad_id", self.pad_id, minimum=0, maximum=vocab - 1)
        checks.check_divisible("d_model", self.d_model, "num_heads", self.num_heads)
        d, tables = self.d_model, self.src_vocab_size + self.max_len
        tables += 0 if self.share_embeddings else self.tgt_vocab_size
        tables += 0 if self.tie_output else self.tgt_vocab_size
        per_layer = 4 * d * d + 2 * d * self.d_ff  # attention projections + feed-forward
        count = tables * d + per_layer * self.num_encoder_layers
        count += (per_layer + 4 * d * d) * self.num_decoder_layers  # + cross-attention
        checks.check_parameters("TransformerConfig", count, f"d_model={d}, d_ff={self.d_ff}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "share_embeddings needs one vocabulary, got src_vocab_size="
                f"{self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TransformerConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"TransformerConfig: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**d)


class Transformer(nn.Module):
    """Encoder-decoder Transformer for sequence-to-sequence tasks such as translation.

    Args:
        config: a :class:`TransformerConfig`.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(
                f"config: expected a TransformerConfig, got {type(config).__name__} "
                "(TransformerConfig(**fields) or TransformerConfig.from_dict(d) makes one)"
            )
        self.config = c = config
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model, padding_idx=c.pad_id)
        self.tgt_embed = (
            self.src_embed
            if c.share_embeddings
            else nn.Embedding(c.tgt_vocab_size, c.d_model, padding_idx=c.pad_id)
        )
        if c.positional == "sinusoidal":
            self.positions = SinusoidalPositionalEncoding(c.d_model, c.max_len)
        else:
            self.positions = LearnedPositionalEmbedding(c.max_len, c.d_model)
        self.embed_dropout = Dropout(c.dropout)
        layer = dict(
            d_model=c.d_model,
            num_heads=c.num_heads,
            d_ff=c.d_ff,
            dropout=c.dropout,
            attn_dropout=c.attn_dropout,
            ffn_dropout=c.ffn_dropout,
            activation=c.activation,
            norm_first=c.norm_first,
            layer_norm_eps=c.layer_norm_eps,
        )
        self.encoder = Encoder(c.num_encoder_layers, final_norm=c.norm_first, **layer)
        self.decoder = Decoder(c.num_decoder_layers, final_norm=c.norm_first, **layer)
        self.output = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self._init_weights()
        if c.tie_output:
            self.output.weight = self.tgt_embed.weight

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)
        for emb in {self.src_embed, self.tgt_embed}:
            # With embeddings scaled by sqrt(d_model), N(0, d^-1/2) gives unit-scale inputs.
            nn.init.normal_(emb.weight, std=self.config.d_model**-0.5)
            with torch.no_grad():
                emb.weight[self.config.pad_id].zero_()

    def _embed(self, name: str, embedding: nn.Embedding, ids: Tensor, offset: int = 0) -> Tensor:
        """``ids`` (B, T) embedded, scaled and positioned; ``name`` ("src" or "tgt") is named if
        they reach past the model's ``max_len`` positions."""
        last = offset + ids.shape[1]
        if last > self.config.max_len:
            at = f" (offset {offset} + {ids.shape[1]})" if offset else ""
            raise ValueError(
                f"{name}: {last} positions{at} exceed the model's max_len={self.config.max_len}"
            )
        x = embedding(ids) * math.sqrt(self.config.d_model)  # (B, T, d_model)
        return self.embed_dropout(self.positions(x, offset))

    def encode(
        self, src: Tensor, *, return_weights: bool = False, skip_padding: bool = False
    ) -> EncodeOutput:
        """Encode source ids (B, S).

        With ``skip_padding`` (and no ``return_weights``) the layers compute the real
        positions only, as rows (:mod:`attnkit.modules.packing`): the same memory at real
        positions, zeros at padding positions (which the source mask hides). Training's loss
        uses it.

        Returns:
            ``EncodeOutput(memory, src_mask, weights)``: memory (B, S, d_model), the source key
            mask (B, 1, S) (True = real token), and the per-layer weights list with
            ``return_weights`` (else None).

        Raises:
            ValueError: for ``src`` not (B, S) integer ids in ``[0, src_vocab_size)``
                (:func:`~attnkit.models.inputs.check_token_ids`), or longer than ``max_len``.
        """
        check_token_ids("src", src, self.config.src_vocab_size, shape="(B, S)")
        if src.numel() == 0:  # else an error about the cross-attention's "context", later
            raise ValueError(
                f"src: expected at least one sentence of at least one token, got shape "
                f"{tuple(src.shape)}"
            )
        src_mask = padding_mask(src, self.config.pad_id)  # (B, 1, S)
        pack = skip_padding and not return_weights
        packing = Packing.of(src_mask.squeeze(1)) if pack else None
        memory, weights = self.encoder(
            self._embed("src", self.src_embed, src),
            src_mask,
            return_weights=return_weights,
            packing=packing,
        )
        return EncodeOutput(memory, src_mask, weights)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        *,
        caches: list[tuple[KVCache, KVCache]] | None = None,
        offset: int = 0,
        return_weights: bool = False,
        project: bool = True,
        skip_padding: bool = False,
    ) -> DecodeOutput:
        """Target ids (B, T) -> logits (B, T, tgt_vocab).

        With ``caches`` (from :meth:`init_cache`), ``tgt`` holds only the new positions starting
        at ``offset``; earlier keys and values come from the cache. ``memory`` may have fewer
        rows than ``tgt`` when the hypotheses of one sentence are consecutive rows (beam
        search): each memory row serves ``B / B_mem`` target rows.

        Returns:
            ``DecodeOutput(output, self_weights, cross_weights)``: output the logits
            (B, T, tgt_vocab), or with ``project=False`` the decoder's hidden states
            (B, T, d_model) before the output layer; per-layer weights lists with
            ``return_weights`` (else None). With ``skip_padding`` (no caches, no
            ``return_weights``) the layers compute the non-pad positions only, as rows
            (:mod:`attnkit.modules.packing`): the same result there, zeros at the padding
            positions. Only for right-padded rows (a real position attends to every earlier
            one, padding included, as it does here without a target mask); other layouts
            are computed whole.

        ``tgt``'s shape and dtype are checked, not its ids' range: decoding calls this at every
        step with ids the search chose (:meth:`forward` checks a caller's).
        """
        check_token_ids("tgt", tgt, None)
        if caches and caches[0][0].length != offset:  # the positions would not be the cache's
            raise ValueError(
                f"offset={offset}: the cache holds {caches[0][0].length} target positions, so "
                f"the new ones start at offset={caches[0][0].length}"
            )
        x = self._embed("tgt", self.tgt_embed, tgt, offset)
        packing = None
        if skip_padding and caches is None and not return_weights:
            keep = tgt != self.config.pad_id  # (B, T)
            if not bool((keep[:, 1:] & ~keep[:, :-1]).any()):  # right-padded: pads last
                packing = Packing.of(keep)
        hidden, self_weights, cross_weights = self.decoder(
            x,
            memory,
            None,
            src_mask,
            causal=True,
            caches=caches,
            return_weights=return_weights,
            packing=packing,
        )
        output = self.output(hidden) if project else hidden
        return DecodeOutput(output, self_weights, cross_weights)

    def init_cache(
        self, batch_size: int, max_len: int, memory: Tensor
    ) -> list[tuple[KVCache, KVCache]]:
        """Empty decoder caches for ``batch_size`` rows, ``max_len`` target positions.

        The buffers take the dtype the key/value projections will produce: the autocast
        dtype when autocast is on for ``memory``'s device (e.g. bf16 evaluation during a bf16
        training run), else ``memory``'s dtype.
        """
        if not isinstance(memory, Tensor) or memory.dim() != 3:
            got = tuple(memory.shape) if isinstance(memory, Tensor) else type(memory).__name__
            raise TypeError(
                f"memory: expected the encoder output (B, S, d_model) that encode() returns, "
                f"got {got}"
            )
        device_type = memory.device.type
        dtype = memory.dtype
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
        return self.decoder.init_cache(
            batch_size, max_len, memory.shape[1], dtype=dtype, device=memory.device
        )

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher forcing: source (B, S), target input (B, T) -> logits (B, T, tgt_vocab).

        A plain tensor (what losses and ``torch.nn.Transformer`` users expect); weights come
        from :meth:`encode` / :meth:`decode` with ``return_weights=True``.

        Raises:
            ValueError: for ids as :meth:`encode` refuses them (``tgt``'s against
                ``tgt_vocab_size``), or ``src`` and ``tgt`` of different batch sizes: row i of
                ``tgt`` is the target of row i of ``src`` (only :meth:`decode` shares a memory
                row among several target rows, the beams of one sentence).
        """
        check_token_ids("tgt", tgt, self.config.tgt_vocab_size)
        check_token_ids("src", src, None, shape="(B, S)")  # its ids: in encode, below
        if tgt.numel() == 0:
            raise ValueError(
                f"tgt: expected at least one row of at least one token, got shape "
                f"{tuple(tgt.shape)}"
            )
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(
                f"src, tgt: expected the same batch size, got src {tuple(src.shape)} and tgt "
                f"{tuple(tgt.shape)}"
            )
        memory, src_mask, _ = self.encode(src)
        return self.decode(tgt, memory, src_mask).output
