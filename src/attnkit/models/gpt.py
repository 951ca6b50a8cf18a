"""GPT: the decoder-only Transformer (seed 001's ``CausalAttention``, seed 002's causal mask),
built from attnkit's own pre-LN layers and able to read and write Hugging Face GPT-2 folders.

A GPT block is an :class:`~attnkit.modules.EncoderLayer` whose self-attention is causal: the
model is token + position embeddings, a pre-LN :class:`~attnkit.modules.Encoder` called with
``causal=True`` (one attention function, no second implementation), a final LayerNorm and a
language-model head tied to the token embeddings.

Batches of prompts of different lengths are padded (left or right) and come with an
``attention_mask``; each row's positions count its real tokens only (Hugging Face's
``cumsum(attention_mask) - 1``), padding is never attended to, and no row gets NaN. For
incremental decoding, :meth:`GPT.init_cache` returns a :class:`GPTCache`: one preallocated
:class:`~attnkit.modules.KVCache` per layer (the gpt-fast design) and a
:class:`~attnkit.modules.kv_cache.PaddingCache` that remembers which slots are padding and
where each row is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

from attnkit.models.config_checks import (
    check_bool,
    check_choice,
    check_divisible,
    check_number,
    check_parameters,
    check_probability,
    check_size,
)
from attnkit.modules.encoder import Encoder
from attnkit.modules.feed_forward import ACTIVATIONS
from attnkit.modules.kv_cache import KVCache, PaddingCache, positions_from_mask
from attnkit.modules.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

__all__ = ["GPT", "GPTCache", "GPTConfig", "GPTOutput"]


# --------------------------------------------------------------------------- config


@dataclass
class GPTConfig:
    """Sizes and switches of a :class:`GPT`; the defaults are GPT-2 small's (124M)."""

    vocab_size: int = 50257  # tokens (GPT-2's byte-level BPE)
    context_length: int = 1024  # positions 0 .. context_length - 1 (HF n_positions)
    d_model: int = 768  # model width (HF n_embd)
    num_heads: int = 12  # attention heads per layer; d_q = d_k = d_v = d_model / num_heads
    num_layers: int = 12  # blocks (HF n_layer)
    d_ff: int = 3072  # feed-forward hidden width (HF n_inner, default 4 * d_model)
    dropout: float = 0.1  # on each block's attention and feed-forward output (HF resid_pdrop)
    attn_dropout: float = 0.1  # on the attention weights (HF attn_pdrop)
    embed_dropout: float = 0.1  # on token + position embeddings (HF embd_pdrop)
    bias: bool = True  # biases in the linear layers
    activation: str = "gelu_tanh"  # feed-forward activation: GPT-2's tanh-approximated GELU
    positional: str = "learned"  # "learned" (GPT-2) or "sinusoidal"
    tie_output: bool = True  # the output head is the token embedding matrix
    layer_norm_eps: float = 1e-5  # HF layer_norm_epsilon
    initializer_range: float = 0.02  # std of the normal init of weights and embeddings
    bos_token_id: int | None = 50256  # GPT-2's <|endoftext|>
    eos_token_id: int | None = 50256

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "d_model", "num_heads", "num_layers", "d_ff"):
            check_size(name, getattr(self, name))
        check_divisible("d_model", self.d_model, "num_heads", self.num_heads)
        for name in ("dropout", "attn_dropout", "embed_dropout"):
            check_probability(name, getattr(self, name))
        for name in ("bias", "tie_output"):
            check_bool(name, getattr(self, name))
        check_choice("activation", self.activation, sorted(ACTIVATIONS))
        check_choice("positional", self.positional, ("learned", "sinusoidal"))
        check_number("layer_norm_eps", self.layer_norm_eps, low=0.0, high=1.0, low_open=True)
        check_number("initializer_range", self.initializer_range, low=0.0, high=1.0)
        for name in ("bos_token_id", "eos_token_id"):
            if getattr(self, name) is not None:
                check_size(name, getattr(self, name), minimum=0, maximum=self.vocab_size - 1)
        d, layers = self.d_model, self.num_layers
        count = self.vocab_size * d * (1 if self.tie_output else 2) + self.context_length * d
        count += layers * (4 * d * d + 2 * d * self.d_ff)
        check_parameters("GPTConfig", count, f"{layers} layers of width {d}")


# --------------------------------------------------------------------------- outputs, cache


class GPTOutput(NamedTuple):
    """What :meth:`GPT.forward` returns, whatever its flags (read the fields by name)."""

    logits: Tensor | None  # (B, T, vocab_size); None with project=False
    weights: list[Tensor] | None  # one (B, H, T, T_k) per layer with return_weights, else None
    hidden: Tensor  # (B, T, d_model), after the final LayerNorm: the head's input


@dataclass
class GPTCache:
    """Everything incremental decoding keeps between calls (:meth:`GPT.init_cache`)."""

    layers: list[KVCache]  # one self-attention cache per block
    padding: PaddingCache  # which slots are padding; each row's next position

    @property
    def length(self) -> int:
        """Slots filled so far (the same for every row)."""
        return self.padding.length

    @property
    def max_len(self) -> int:
        return self.padding.max_len

    @property
    def batch_size(self) -> int:
        return self.padding.batch_size

    @property
    def positions(self) -> Tensor:
        """(B,) long: the position the next real token of each row gets."""
        return self.padding.counts.clone()

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (B',) of every layer (beam search, dropping finished rows)."""
        for layer in self.layers:
            layer.reorder(index)
        self.padding.reorder(index)


# --------------------------------------------------------------------------- model


class GPT(nn.Module):
    """Decoder-only Transformer language model (module docstring).

    Args:
        config: a :class:`GPTConfig`.
        tokenizer: the tokenizer that goes with the weights (``from_pretrained`` sets it).
    """

    def __init__(self, config: GPTConfig, *, tokenizer=None) -> None:
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        if c.positional == "learned":
            self.positions = LearnedPositionalEmbedding(c.context_length, c.d_model)
        else:
            self.positions = SinusoidalPositionalEncoding(c.d_model, c.context_length)
        self.embed_dropout = nn.Dropout(c.embed_dropout)
        self.blocks = Encoder(
            c.num_layers,
            final_norm=True,
            d_model=c.d_model,
            num_heads=c.num_heads,
            d_ff=c.d_ff,
            dropout=c.dropout,
            attn_dropout=c.attn_dropout,
            # GPT-2 drops out the feed-forward's output (in the residual block), not its
            # hidden activations.
            ffn_dropout=0.0,
            activation=c.activation,
            norm_first=True,
            layer_norm_eps=c.layer_norm_eps,
            bias=c.bias,
        )
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.tokenizer = tokenizer
        self._init_weights()
        self.tie_weights()

    def tie_weights(self) -> None:
        """Make the output head the token embedding matrix, if the config says so."""
        if self.config.tie_output:
            self.lm_head.weight = self.embed.weight

    def _init_weights(self) -> None:
        """GPT-2's init: N(0, initializer_range) weights and embeddings, zero biases, unit
        LayerNorms; the projections into the residual stream get std / sqrt(2 num_layers)."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        residual_std = std / (2 * self.config.num_layers) ** 0.5
        for layer in self.blocks.layers:
            nn.init.normal_(layer.self_attn.out_proj.weight, std=residual_std)
            nn.init.normal_(layer.ffn.linear2.weight, std=residual_std)

    # ----------------------------------------------------------------------- forward

    def forward(
        self,
        ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        cache: GPTCache | None = None,
        return_weights: bool = False,
        project: bool = True,
    ) -> GPTOutput:
        """Next-token logits for every position.

        Args:
            ids: (B, T) integer token ids in [0, vocab_size).
            attention_mask: (B, T) bool or 0/1 integers, True = real token, False = padding
                (left or right); None = all real. Positions count real tokens only.
            cache: from :meth:`init_cache`; ``ids`` then holds only the new slots (a padded
                prompt batch to prefill, then one token per row per step).
            return_weights: also return every layer's attention weights (the readable path).
            project: run the output head; False leaves ``logits`` None, for a caller that
                applies ``lm_head`` itself (to the last position only, say).

        Returns:
            ``GPTOutput(logits, weights, hidden)``: logits (B, T, vocab_size) or None; weights
            a list of one (B, H, T, T_k) per layer, or None; hidden (B, T, d_model). Outputs
            at padding positions mean nothing.
        """
        keep = self._check_inputs(ids, attention_mask, cache)
        b, t = ids.shape
        if cache is None:
            positions = positions_from_mask(keep, t).to(ids.device)  # (B, T) or (1, T)
            self._check_positions(positions, keep)
            mask = None if keep is None else keep[:, None, :]  # (B, 1, T) key mask
        else:
            positions = cache.padding.positions(keep, t)  # (B, T)
            self._check_positions(positions, keep)
            mask = cache.padding.update(keep, t)  # (B, 1, T_cached) or None
        x = self.embed(ids) + self._position_vectors(positions)  # (B, T, d_model)
        x = self.embed_dropout(x)
        hidden, weights = self.blocks(
            x,
            mask,
            causal=True,
            caches=None if cache is None else cache.layers,
            return_weights=return_weights,
        )
        return GPTOutput(self.lm_head(hidden) if project else None, weights, hidden)

    def _position_vectors(self, positions: Tensor) -> Tensor:
        """(B, T) positions -> (B, T, d_model) learned or sinusoidal vectors."""
        if isinstance(self.positions, LearnedPositionalEmbedding):
            return self.positions.embedding(positions)
        return self.positions.pe[positions].to(self.embed.weight.dtype)

    def _check_inputs(
        self, ids: Tensor, attention_mask: Tensor | None, cache: GPTCache | None
    ) -> Tensor | None:
        """Validate the inputs; returns the mask as bool (B, T), or None when all real."""
        if not isinstance(ids, Tensor):
            raise TypeError(f"ids: expected a torch.Tensor, got {type(ids).__name__}")
        if ids.dim() != 2 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(
                f"ids: expected integer token ids of shape (B, T), got shape {tuple(ids.shape)} "
                f"dtype {ids.dtype}"
            )
        if ids.numel() == 0:
            raise ValueError(f"ids: expected at least one token, got shape {tuple(ids.shape)}")
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= self.config.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"ids: token id {bad} is outside the vocabulary [0, {self.config.vocab_size})"
            )
        if cache is not None and cache.batch_size != ids.shape[0]:
            raise ValueError(
                f"cache: made for {cache.batch_size} rows, but ids has {ids.shape[0]} rows"
            )
        if attention_mask is None:
            return None
        if not isinstance(attention_mask, Tensor):
            raise TypeError(
                f"attention_mask: expected a torch.Tensor, got {type(attention_mask).__name__}"
            )
        if attention_mask.shape != ids.shape:
            raise ValueError(
                f"attention_mask: expected the shape of ids {tuple(ids.shape)}, got "
                f"{tuple(attention_mask.shape)}"
            )
        if attention_mask.dtype != torch.bool:
            if attention_mask.is_floating_point() or attention_mask.is_complex():
                raise TypeError(
                    "attention_mask: expected bool or 0/1 integers (True = real token), got "
                    f"dtype {attention_mask.dtype}"
                )
            if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
                raise ValueError("attention_mask: expected only 0 and 1 (1 = real token)")
            attention_mask = attention_mask != 0
        attention_mask = attention_mask.to(ids.device)
        # Without padding the mask changes nothing: drop it so the fused kernel runs unmasked.
        return None if bool(attention_mask.all()) else attention_mask

    def _check_positions(self, positions: Tensor, keep: Tensor | None) -> None:
        real = positions if keep is None else positions.masked_fill(~keep, 0)
        last = int(real.max())
        if last >= self.config.context_length:
            raise ValueError(
                f"ids: a row reaches position {last}, beyond context_length="
                f"{self.config.context_length} (positions 0 .. {self.config.context_length - 1})"
            )

    # ----------------------------------------------------------------------- decoding

    def init_cache(
        self,
        batch_size: int,
        max_len: int | None = None,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> GPTCache:
        """Empty caches for ``batch_size`` rows and ``max_len`` slots (padding included).

        Args:
            batch_size: rows.
            max_len: the most slots the cache holds (default ``context_length``).
            dtype: key/value dtype; default the autocast dtype when autocast is on for the
                model's device, else the parameters' dtype.
            device: default the parameters' device.
        """
        param = self.embed.weight
        device = param.device if device is None else torch.device(device)
        if dtype is None:
            dtype = param.dtype
            if torch.is_autocast_enabled(device.type):
                dtype = torch.get_autocast_dtype(device.type)
        max_len = self.config.context_length if max_len is None else max_len
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
        if not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len: expected a positive integer, got {max_len!r}")
        layers = self.blocks.init_cache(batch_size, max_len, dtype=dtype, device=device)
        return GPTCache(layers, PaddingCache(batch_size, max_len, device=device))

    # ----------------------------------------------------------------------- checkpoints

    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> GPT:
        """Read a Hugging Face GPT-2 folder: ``config.json``, ``model.safetensors`` and, if
        present, ``tokenizer.json``. Nothing is downloaded; pickle checkpoints are refused.

        Returns:
            The model in eval mode on ``device`` in ``dtype``, with its tokenizer (or None).
        """
        from attnkit.models import gpt_hf

        return gpt_hf.load(cls, folder, device=device, dtype=dtype)

    def save_pretrained(self, folder: str | Path) -> Path:
        """Write ``config.json``, ``model.safetensors`` (Hugging Face GPT-2 names, Conv1D
        weights transposed) and the tokenizer, if any, to ``folder``, atomically."""
        from attnkit.models import gpt_hf

        return gpt_hf.save(self, folder)

    def num_parameters(self) -> int:
        """Parameters, the tied head counted once."""
        return sum(p.numel() for p in self.parameters())
