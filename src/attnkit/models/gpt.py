"""GPT: the decoder-only Transformer (seed 001's ``CausalAttention``, seed 002's causal mask),
built from attnkit's own pre-LN layers and able to read and write Hugging Face GPT-2, Llama,
Mistral and Qwen2 folders.

A GPT block is an :class:`~attnkit.modules.EncoderLayer` whose self-attention is causal: the
model is token + position embeddings, a pre-LN :class:`~attnkit.modules.Encoder` called with
``causal=True`` (one attention function, no second implementation), a final LayerNorm and a
language-model head tied to the token embeddings.

The same model in Llama's form (:meth:`GPTConfig.llama`) differs only in options of those
layers: rotary position embeddings applied to queries and keys inside the attention instead of
position vectors added to the tokens, RMSNorm, a SwiGLU feed-forward, fewer key/value heads
than query heads (grouped-query attention), no biases (Qwen2: biases on the query/key/value
projection), an untied head, and for Mistral and Qwen2 a sliding window. With a window the
cache of each windowed layer keeps the last ``window`` slots only; the window counts slots,
as Hugging Face's does, which for left-padded prompts (how generation pads) is the row's last
``window`` tokens.

Batches of prompts of different lengths are padded (left or right) and come with an
``attention_mask``; each row's positions count its real tokens only (Hugging Face's
``cumsum(attention_mask) - 1``), padding is never attended to, and no row gets NaN. For
incremental decoding, :meth:`GPT.init_cache` returns a :class:`GPTCache`: one preallocated
:class:`~attnkit.modules.KVCache` per layer (the gpt-fast design) and a
:class:`~attnkit.modules.kv_cache.PaddingCache` that remembers which slots are padding and
where each row is.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
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
from attnkit.models.inputs import check_token_ids, mask_to_bool
from attnkit.modules.encoder import Encoder
from attnkit.modules.feed_forward import ACTIVATIONS
from attnkit.modules.kv_cache import KVCache, PaddingCache, positions_from_mask
from attnkit.modules.norm import NORMS, RMSNorm
from attnkit.modules.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from attnkit.modules.rotary import ROPE_SCALINGS, RotaryEmbedding
from attnkit.texts import check_tokenizer

__all__ = ["GPT", "GPTCache", "GPTConfig", "GPTOutput"]

GPT2_END_OF_TEXT = 50256  # GPT-2's <|endoftext|> id: GPTConfig's bos and eos by default


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
    positional: str = "learned"  # "learned" (GPT-2), "sinusoidal" or "rope" (rotary, Llama)
    tie_output: bool = True  # the output head is the token embedding matrix
    layer_norm_eps: float = 1e-5  # HF layer_norm_epsilon (rms_norm_eps with norm = "rms")
    initializer_range: float = 0.02  # std of the normal init of weights and embeddings
    bos_token_id: int | None = GPT2_END_OF_TEXT
    eos_token_id: int | None = GPT2_END_OF_TEXT
    # Today's decoder-only models (Llama, Mistral, Qwen2; GPTConfig.llama); defaults: GPT-2.
    num_kv_heads: int | None = None  # key/value heads: < num_heads GQA, 1 MQA; None: num_heads
    norm: str = "layer"  # "layer" (LayerNorm, GPT-2) or "rms" (RMSNorm, Llama)
    gated_ffn: bool = False  # gated feed-forward; SwiGLU with activation = "silu" (Llama)
    qkv_bias: bool | None = None  # query/key/value biases; None: `bias` (Qwen2: true, bias false)
    rope_base: float = 10000.0  # positional = "rope": base of the frequencies (HF rope_theta)
    rope_scaling: str = "none"  # "none", "linear" or "llama3" (HF rope_type)
    rope_factor: float = 1.0  # rope_scaling "linear" / "llama3": the factor
    rope_low_freq_factor: float = 1.0  # rope_scaling "llama3"
    rope_high_freq_factor: float = 4.0  # rope_scaling "llama3"
    rope_original_context: int = 8192  # "llama3": HF original_max_position_embeddings
    rope_interleaved: bool = False  # rotate dims (2i, 2i+1) (GPT-J, Meta); False: HF half-split
    window: int | None = None  # sliding window: a token sees itself and window - 1 before it
    full_attention_layers: int = 0  # with a window: the first N layers see everything (Qwen2)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "d_model", "num_heads", "num_layers", "d_ff"):
            check_size(name, getattr(self, name))
        check_divisible("d_model", self.d_model, "num_heads", self.num_heads)
        for name in ("dropout", "attn_dropout", "embed_dropout"):
            check_probability(name, getattr(self, name))
        for name in ("bias", "tie_output", "gated_ffn", "rope_interleaved"):
            check_bool(name, getattr(self, name))
        if self.qkv_bias is not None:
            check_bool("qkv_bias", self.qkv_bias)
        check_choice("activation", self.activation, sorted(ACTIVATIONS))
        check_choice("positional", self.positional, ("learned", "sinusoidal", "rope"))
        check_choice("norm", self.norm, NORMS)
        check_number("layer_norm_eps", self.layer_norm_eps, low=0.0, high=1.0, low_open=True)
        check_number("initializer_range", self.initializer_range, low=0.0, high=1.0)
        for name in ("bos_token_id", "eos_token_id"):
            if getattr(self, name) is None:
                continue
            try:
                check_size(name, getattr(self, name), minimum=0, maximum=self.vocab_size - 1)
            except ValueError as err:
                if getattr(self, name) != GPT2_END_OF_TEXT:
                    raise
                raise ValueError(
                    f"{err} ({GPT2_END_OF_TEXT} is GPT-2's <|endoftext|>, the default of "
                    f"{name}: with vocab_size={self.vocab_size}, give bos_token_id and "
                    "eos_token_id your tokenizer's ids, or None)"
                ) from None
        if self.num_kv_heads is not None:
            check_size("num_kv_heads", self.num_kv_heads, maximum=self.num_heads)
            check_divisible("num_heads", self.num_heads, "num_kv_heads", self.num_kv_heads)
        self._check_rope()
        if self.window is not None:
            if isinstance(self.window, numbers.Integral) and not isinstance(self.window, bool):
                self.window = int(self.window)  # a numpy integer too; config.json takes an int
            check_size("window", self.window)
        check_size("full_attention_layers", self.full_attention_layers, minimum=0,
                   maximum=self.num_layers)  # fmt: skip
        if self.full_attention_layers and self.window is None:
            raise ValueError(
                f"full_attention_layers={self.full_attention_layers}: needs a window (the "
                "layers after the first full_attention_layers attend to the window)"
            )
        d, layers = self.d_model, self.num_layers
        kv_width = (self.num_kv_heads or self.num_heads) * (d // self.num_heads)
        positions = self.context_length * d if self.positional == "learned" else 0
        count = self.vocab_size * d * (1 if self.tie_output else 2) + positions
        ffn = (3 if self.gated_ffn else 2) * d * self.d_ff
        count += layers * (2 * d * d + 2 * d * kv_width + ffn)
        check_parameters("GPTConfig", count, f"{layers} layers of width {d}")

    def _check_rope(self) -> None:
        check_number("rope_base", self.rope_base, low=0.0, high=1e12, low_open=True)
        check_choice("rope_scaling", self.rope_scaling, ROPE_SCALINGS)
        check_number("rope_factor", self.rope_factor, low=0.0, high=1e6, low_open=True)
        for name in ("rope_low_freq_factor", "rope_high_freq_factor"):
            check_number(name, getattr(self, name), low=0.0, high=1e6, low_open=True)
        check_size("rope_original_context", self.rope_original_context)
        if (
            self.rope_scaling == "llama3"
            and self.rope_high_freq_factor <= self.rope_low_freq_factor
        ):
            raise ValueError(
                f"rope_high_freq_factor={self.rope_high_freq_factor}: must exceed "
                f"rope_low_freq_factor={self.rope_low_freq_factor}"
            )
        if self.positional == "rope" and (self.d_model // self.num_heads) % 2:
            raise ValueError(
                f"positional='rope': the head width d_model / num_heads must be even, got "
                f"{self.d_model} / {self.num_heads} = {self.d_model // self.num_heads}"
            )

    @classmethod
    def llama(cls, **fields) -> GPTConfig:
        """A Llama-style config: rotary positions, RMSNorm (eps 1e-6), a SwiGLU feed-forward,
        no biases, no dropout, an untied head, no bos/eos; ``fields`` set the sizes and may
        override any of these (``num_kv_heads`` for GQA, ``window`` for Mistral's window,
        ``qkv_bias=True`` for Qwen2).

        Example:
            >>> GPTConfig.llama(vocab_size=32000, d_model=512, num_heads=8, num_kv_heads=2,
            ...                 num_layers=8, d_ff=1408, context_length=4096)
        """
        style = dict(
            positional="rope", norm="rms", gated_ffn=True, activation="silu", bias=False,
            dropout=0.0, attn_dropout=0.0, embed_dropout=0.0, tie_output=False,
            layer_norm_eps=1e-6, bos_token_id=None, eos_token_id=None,
        )  # fmt: skip
        return cls(**{**style, **fields})

    def rotary_embedding(self) -> RotaryEmbedding | None:
        """The :class:`~attnkit.modules.RotaryEmbedding` of ``positional = "rope"``, or None."""
        if self.positional != "rope":
            return None
        return RotaryEmbedding(
            self.d_model // self.num_heads,
            base=self.rope_base,
            scaling=self.rope_scaling,
            factor=self.rope_factor,
            low_freq_factor=self.rope_low_freq_factor,
            high_freq_factor=self.rope_high_freq_factor,
            original_context=self.rope_original_context,
            interleaved=self.rope_interleaved,
        )


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
    # The layers compiled for one-token steps (attnkit.generation.compiled), or None: called as
    # step(run, ids, positions, mask, cache, return_weights, project) with run = GPT._run.
    # Held by the cache, so it serves only the generation that made the cache.
    step: Callable | None = None

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
        """Keep rows ``index`` (B',) of every layer (beam search, dropping finished rows).

        Raises:
            ValueError: ``index`` is not a 1-D int64/int32 tensor of rows in ``[0, B)``,
                checked before any layer changes.
        """
        rows = self.batch_size
        if (
            not isinstance(index, Tensor)
            or index.dim() != 1
            or index.dtype not in (torch.int64, torch.int32)
        ):
            got = (
                f"shape {tuple(index.shape)} dtype {index.dtype}"
                if isinstance(index, Tensor)
                else type(index).__name__
            )
            raise ValueError(
                f"index: expected a 1-D int64 or int32 tensor of rows of the cache, got {got}"
            )
        if index.numel() and not 0 <= int(index.min()) <= int(index.max()) < rows:
            raise ValueError(
                f"index: rows {int(index.min())} to {int(index.max())} given, but the cache "
                f"holds rows 0 to {rows - 1}"
            )
        for layer in self.layers:
            layer.reorder(index)
        self.padding.reorder(index)

    def _save(self, t: int) -> tuple:
        """What :meth:`_restore` needs to undo a forward of ``t`` new slots.

        The lengths (and the padding counts) are enough while the forward only writes slots
        past them, which is every case but one: several new slots that overrun a sliding
        window's ring after earlier ones rewrite the whole ring, so that ring is copied first
        (chunked prefill only; never in a one-token decoding step).
        """
        n = self.padding.length
        rings = []
        if t > 1 and n > 0:
            for layer in self.layers:
                if layer.window is not None and n + t > layer.capacity:
                    rings.append((layer, layer.k.clone(), layer.v.clone()))
        # The counts too (B ints): an update interrupted between advancing them and its length
        # would leave them ahead of a length that says nothing changed.
        return n, self.padding.has_padding, self.padding.counts.clone(), rings

    def _restore(self, saved: tuple) -> None:
        """Put back the lengths (and rings) :meth:`_save` recorded: a forward that failed part
        way leaves the cache as it was before the call. Slots written past the restored length
        are never read, and each layer's next update rewrites what it hands to attention."""
        n, has_padding, counts, rings = saved
        padding = self.padding
        padding.counts.copy_(counts)
        padding.length, padding.has_padding = n, has_padding
        for layer in self.layers:
            layer.length = n
        for layer, k, v in rings:
            layer.k.copy_(k)
            layer.v.copy_(v)


# --------------------------------------------------------------------------- model


class GPT(nn.Module):
    """Decoder-only Transformer language model (module docstring).

    Args:
        config: a :class:`GPTConfig`.
        tokenizer: the tokenizer that goes with the weights (``from_pretrained`` sets it); an
            object, not a name (nothing is downloaded).
    """

    def __init__(self, config: GPTConfig, *, tokenizer=None) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(
                f"config: expected a GPTConfig, got {type(config).__name__} "
                "(GPTConfig(**fields) or GPTConfig.llama(**fields) makes one)"
            )
        if tokenizer is not None:
            check_tokenizer(tokenizer)
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.positions: nn.Module | None = None  # added position vectors (not with RoPE)
        if c.positional == "learned":
            self.positions = LearnedPositionalEmbedding(c.context_length, c.d_model)
        elif c.positional == "sinusoidal":
            self.positions = SinusoidalPositionalEncoding(c.d_model, c.context_length)
        self.rotary = c.rotary_embedding()  # rotates queries and keys inside the attention (RoPE)
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
            norm=c.norm,
            gated=c.gated_ffn,
            num_kv_heads=c.num_kv_heads,
            qkv_bias=c.qkv_bias,
            window=c.window,
            full_attention_layers=c.full_attention_layers,
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
        LayerNorms (and RMSNorms); the projections into the residual stream get
        std / sqrt(2 num_layers)."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            if isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
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
                (left or right; with a cache, a model with a sliding window takes left padding
                only); None = all real. Positions count real tokens only.
            cache: from :meth:`init_cache`; ``ids`` then holds only the new slots (a padded
                prompt batch to prefill, then one token per row per step). It is checked
                against the model before anything is written, and a call that fails part way
                (an error or interrupt in a layer) leaves it as it was, so it can be retried.
            return_weights: also return every layer's attention weights (the readable path).
            project: run the output head; False leaves ``logits`` None, for a caller that
                applies ``lm_head`` itself (to the last position only, say).

        Returns:
            ``GPTOutput(logits, weights, hidden)``: logits (B, T, vocab_size) or None; weights
            a list of one (B, H, T, T_k) per layer, or None; hidden (B, T, d_model). Outputs
            at padding positions mean nothing.
        """
        keep = self._check_inputs(ids, attention_mask, cache)
        t = ids.shape[1]
        if cache is None:
            positions = positions_from_mask(keep, t).to(ids.device)  # (B, T) or (1, T)
            self._check_positions(positions, keep)
            mask = None if keep is None else keep[:, None, :]  # (B, 1, T) key mask
            return self._run(ids, positions, mask, None, return_weights, project)
        positions = cache.padding.positions(keep, t)  # (B, T)
        self._check_positions(positions, keep)
        # A compiled step serves one new token after the prompt, without weights or gradients.
        compiled = (
            cache.step is not None
            and t == 1
            and cache.length > 0
            and not return_weights
            and not torch.is_grad_enabled()
        )
        # From here on the cache changes: if anything fails (an error in a layer, a hook, an
        # interrupt), it is put back as it was, so that a retry with it is correct.
        saved = cache._save(t)
        try:
            mask = cache.padding.update(keep, t)  # (B, 1, T_cached) or None
            if compiled:
                return cache.step(self._run, ids, positions, mask, cache, return_weights, project)
            return self._run(ids, positions, mask, cache, return_weights, project)
        except BaseException:
            cache._restore(saved)
            raise

    def _run(
        self,
        ids: Tensor,
        positions: Tensor,
        mask: Tensor | None,
        cache: GPTCache | None,
        return_weights: bool,
        project: bool,
    ) -> GPTOutput:
        """The forward pass on checked inputs: ``positions`` (B or 1, T), key ``mask``
        (B, 1, T_k) or None, ``cache`` already told of the new slots (or None)."""
        rotary = None
        if self.rotary is None:
            x = self.embed(ids) + self._position_vectors(positions)  # (B, T, d_model)
        else:
            x = self.embed(ids)  # (B, T, d_model); positions rotate queries and keys
            rotary = self.rotary(positions, dtype=x.dtype)  # (B or 1, T, 1, head_dim) each
        x = self.embed_dropout(x) if self.training else x
        hidden, weights = self.blocks(
            x,
            mask,
            causal=True,
            caches=None if cache is None else cache.layers,
            return_weights=return_weights,
            rotary=rotary,
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
        check_token_ids("ids", ids, self.config.vocab_size)
        if ids.numel() == 0:
            raise ValueError(f"ids: expected at least one token, got shape {tuple(ids.shape)}")
        if cache is not None:
            self._check_cache(cache, ids.shape[0])
        if attention_mask is None:
            return None
        attention_mask = mask_to_bool(attention_mask, ids)  # (B, T), True = real token
        if attention_mask.is_meta:  # shapes only (torch.device("meta")): nothing to read
            return attention_mask
        # Without padding the mask changes nothing: drop it so the fused kernel runs unmasked.
        if bool(attention_mask.all()):
            return None
        if cache is not None and self.config.window is not None:
            # The cache's window counts slots: after a right-padded row's padding, the next
            # token's window would hold padding instead of the row's last real tokens.
            if bool((attention_mask[:, :-1] & ~attention_mask[:, 1:]).any()):
                raise ValueError(
                    f"attention_mask: padding after a real token, with a cache in a model with "
                    f"a sliding window (window={self.config.window}): pad on the left, as "
                    "attnkit.generation does (the window counts the cache's slots)"
                )
        return attention_mask

    def _check_cache(self, cache: GPTCache, batch_size: int) -> None:
        """Raise unless ``cache`` fits this model and ``batch_size`` rows. The layers of a
        :class:`GPTCache` come from one :meth:`init_cache` and share their heads, head width,
        dtype and device, so the first layer's buffers speak for all (a check of a few
        attributes per call, not per layer)."""
        if not isinstance(cache, GPTCache):
            raise TypeError(
                f"cache: expected a GPTCache (from GPT.init_cache), got {type(cache).__name__}"
            )
        if cache.batch_size != batch_size:
            raise ValueError(
                f"cache: made for {cache.batch_size} rows, but ids has {batch_size} rows"
            )
        c = self.config
        if len(cache.layers) != c.num_layers:
            raise ValueError(
                f"cache: has {len(cache.layers)} layers, but the model has {c.num_layers}; "
                "make it with this model's init_cache"
            )
        keys = cache.layers[0].k  # (B, H_kv, T_max, hd)
        heads, head_dim = c.num_kv_heads or c.num_heads, c.d_model // c.num_heads
        if (keys.shape[1], keys.shape[3]) != (heads, head_dim):
            raise ValueError(
                f"cache: holds {keys.shape[1]} key/value heads of width {keys.shape[3]}, but "
                f"the model has {heads} of width {head_dim}; make it with this model's init_cache"
            )
        param = self.embed.weight
        if keys.device != param.device:
            raise ValueError(f"cache: on {keys.device}, but the model is on {param.device}")
        dtype = self._cache_dtype(param)
        if keys.dtype != dtype:
            raise ValueError(
                f"cache: keys and values in {keys.dtype}, but the model computes them in "
                f"{dtype} here (its parameters' dtype, or the autocast dtype under autocast)"
            )

    @staticmethod
    def _cache_dtype(param: Tensor) -> torch.dtype:
        """The dtype of the keys and values the layers compute from parameters like
        ``param``: the autocast dtype when autocast is on for its device, else its dtype."""
        kind = param.device.type  # "meta" has no autocast (is_autocast_enabled raises there)
        on = torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind)
        return torch.get_autocast_dtype(kind) if on else param.dtype

    def _check_positions(self, positions: Tensor, keep: Tensor | None) -> None:
        if positions.is_meta:  # shapes only: no position to read
            return
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
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
    ) -> GPTCache:
        """Empty caches for ``batch_size`` rows and ``max_len`` slots (padding included): per
        layer the key/value heads only (``num_kv_heads``), and at most ``window`` slots in a
        layer with a sliding window.

        Args:
            batch_size: rows.
            max_len: the most slots the cache holds (default ``context_length``).
            dtype: key/value dtype: the dtype the layers compute them in, which is the
                parameters' dtype, or under autocast the autocast dtype (the default: the one
                in force for the model's device now). A cache made ahead for another autocast
                dtype is accepted here; each forward checks it against the dtype then in force.
            device: the parameters' device (the default); any other is refused.
        """
        param = self.embed.weight
        max_len = self.config.context_length if max_len is None else max_len
        for name, value in (("batch_size", batch_size), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{name}: expected a positive integer, got {value!r} ({type(value).__name__})"
                )
        # An empty tensor resolves "cuda" to the current device's index.
        if device is not None and torch.empty(0, device=device).device != param.device:
            raise ValueError(f"device: the model is on {param.device}, got {device}")
        device = param.device
        if dtype is None:
            dtype = self._cache_dtype(param)
        else:
            from attnkit.model_folder import floating_dtype

            dtype = floating_dtype(dtype)
        layers = self.blocks.init_cache(batch_size, max_len, dtype=dtype, device=device)
        return GPTCache(layers, PaddingCache(batch_size, max_len, device=device))

    # ----------------------------------------------------------------------- checkpoints

    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path | None,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | str = torch.float32,
    ) -> GPT:
        """Read a Hugging Face GPT-2, Llama, Mistral or Qwen2 folder (by its ``model_type``):
        ``config.json``, ``model.safetensors`` and, if present, ``tokenizer.json``. Nothing is
        downloaded; pickle checkpoints are refused.

        Args:
            folder: the model folder; None: the shipped Shakespeare GPT
                (``attnkit/pretrained/shakespeare_gpt``, as ``attnkit generate`` without
                ``--model``), refused by name where it is not installed.
            device: where to put the model.
            dtype: a floating torch.dtype or its name ("bfloat16", "torch.float16"; any other
                string is refused by name, :func:`attnkit.model_folder.floating_dtype`).

        Returns:
            The model in eval mode on ``device`` in ``dtype``, with its tokenizer (or None).
        """
        from attnkit import model_folder as mf
        from attnkit.models import gpt_hf, llama_hf

        dtype = mf.floating_dtype(dtype)  # before reading anything
        if folder is None:
            from attnkit import pretrained

            folder = pretrained.default_gpt_dir()
            if folder is None:
                raise ValueError(
                    f"folder: None is the shipped Shakespeare GPT, which is not installed "
                    f"({pretrained.shipped_gpt_dir()} holds no weights); give a model folder"
                )
        kind = mf.expect_kind(folder, mf.read_config(folder), "gpt2", *llama_hf.KINDS)
        loader = gpt_hf if kind == "gpt2" else llama_hf
        return loader.load(cls, folder, device=device, dtype=dtype)

    def save_pretrained(self, folder: str | Path) -> Path:
        """Write ``config.json``, ``model.safetensors`` and the tokenizer, if any, to
        ``folder``, atomically: a GPT-2 folder (Hugging Face GPT-2 names, Conv1D weights
        transposed), or, for rotary positions, a Llama, Mistral or Qwen2 folder
        (:func:`attnkit.models.llama_hf.hf_kind` says which)."""
        from attnkit.models import gpt_hf, llama_hf

        saver = llama_hf if self.config.positional == "rope" else gpt_hf
        return saver.save(self, folder)

    def num_parameters(self) -> int:
        """Parameters, the tied head counted once."""
        return sum(p.numel() for p in self.parameters())
