"""Hugging Face Llama, Mistral and Qwen2 folders <-> :class:`~attnkit.models.gpt.GPT`, field by
field and weight by weight.

The three share one architecture, which is attnkit's GPT with Llama's options
(:meth:`~attnkit.models.GPTConfig.llama`): rotary positions, RMSNorm, SwiGLU, grouped-query
attention. What differs is written down here and nowhere else:

=========  ===========================  =================================================
kind       biases                       sliding window
=========  ===========================  =================================================
llama      none, or all (attention and  none
           mlp biases together)
mistral    none                         ``sliding_window`` in every layer (or null)
qwen2      query/key/value only         with ``use_sliding_window``: the layers after the
                                        first ``max_window_layers`` (``layer_types``)
=========  ===========================  =================================================

The mapping is explicit (:func:`hf_key_sources`): every attnkit parameter names the checkpoint
keys it is made of. ``q_proj``, ``k_proj`` and ``v_proj`` are stacked, in that order, into the
fused ``in_proj`` (H + 2 H_kv heads of rows), ``gate_proj`` and ``up_proj`` into the gated
feed-forward's ``linear1``. Rotary settings come from ``rope_parameters`` (transformers 5) or
``rope_theta`` and ``rope_scaling`` (transformers 4); rope types other than default, linear and
llama3, partial rotary factors, a ``head_dim`` that is not ``hidden_size / num_attention_heads``
and activations other than silu are refused with the field named. Files are read and written by
:mod:`attnkit.model_folder` (safetensors only: pickles are refused).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnkit import model_folder as mf
from attnkit.models.gpt import GPT, GPTConfig
from attnkit.models.gpt_hf import canonical_keys, load_folder

logger = logging.getLogger(__name__)

__all__ = [
    "KINDS",
    "config_from_hf",
    "config_to_hf",
    "hf_key_sources",
    "hf_kind",
    "load",
    "save",
    "state_from_hf",
    "state_to_hf",
]

KINDS = tuple(k for k in mf.GPT_KINDS if k != "gpt2")  # ("llama", "mistral", "qwen2")
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
# Each config class's defaults, for the fields a config.json may leave out.
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
    ),
    "mistral": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096 * 32,
        bos_token_id=1, eos_token_id=2, sliding_window=4096,
    ),
    "qwen2": dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=32768,
        bos_token_id=None, eos_token_id=None, sliding_window=4096, max_window_layers=28,
    ),
}  # fmt: skip
# Hugging Face rope_type -> attnkit rope_scaling.
ROPE_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3"}
# Constant buffers that old checkpoints carry, not weights.
_BUFFER_KEY = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")


# --------------------------------------------------------------------------- config


def config_from_hf(d: dict, *, source: str | os.PathLike[str] = "config.json") -> GPTConfig:
    """A :class:`GPTConfig` from a Llama, Mistral or Qwen2 ``config.json`` dict (its
    ``model_type`` says which); missing fields take the config class's defaults, and settings
    this model does not implement are a ValueError naming them."""
    kind = d.get("model_type")
    if kind not in KINDS:
        raise ValueError(f"{source}: model_type={kind!r}; expected one of {list(KINDS)}")

    def get(field: str, default: Any = None) -> Any:  # the file's value, or the class default
        return d[field] if field in d else DEFAULTS[kind].get(field, default)

    def refuse(field: str, why: str) -> ValueError:
        return ValueError(f"{source}: {field}={json.dumps(d.get(field))} is not supported: {why}")

    if d.get("hidden_act", "silu") != "silu":
        raise refuse("hidden_act", "attnkit's SwiGLU feed-forward gates with silu")
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    head_dim = d.get("head_dim")
    if head_dim is not None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        if head_dim * heads != hidden:
            raise refuse(
                "head_dim",
                f"attnkit's heads split the model width: hidden_size / num_attention_heads = "
                f"{hidden} / {heads}",
            )
    bias, qkv_bias = _biases(d, kind, refuse)
    window, full_layers = _window(d, kind, get, refuse)
    rope = _rope(d, get, refuse, source)  # its errors name the file already
    try:
        return GPTConfig.llama(
            vocab_size=get("vocab_size"),
            context_length=get("max_position_embeddings"),
            d_model=hidden,
            num_heads=heads,
            num_kv_heads=heads
            if get("num_key_value_heads") is None
            else get("num_key_value_heads"),
            num_layers=get("num_hidden_layers"),
            d_ff=get("intermediate_size"),
            attn_dropout=d.get("attention_dropout", 0.0),
            bias=bias,
            qkv_bias=qkv_bias,
            tie_output=d.get("tie_word_embeddings", False),
            layer_norm_eps=d.get("rms_norm_eps", 1e-6),
            initializer_range=d.get("initializer_range", 0.02),
            bos_token_id=_one_id("bos_token_id", get("bos_token_id"), source),
            eos_token_id=_one_id("eos_token_id", get("eos_token_id"), source),
            window=window,
            full_attention_layers=full_layers,
            **rope,
        )
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None


def _biases(d: dict, kind: str, refuse) -> tuple[bool, bool | None]:
    """(bias, qkv_bias) of the GPTConfig."""
    if kind == "qwen2":
        return False, True
    if kind == "mistral":
        return False, None
    attention, mlp = d.get("attention_bias", False), d.get("mlp_bias", False)
    if attention != mlp:
        raise refuse(
            "attention_bias",
            f"with mlp_bias={json.dumps(mlp)}: attnkit's GPT has biases in every linear layer or "
            "in none (or, as Qwen2, in the query/key/value projection only)",
        )
    return bool(attention), None


def _window(d: dict, kind: str, get, refuse) -> tuple[int | None, int]:
    """(window, full_attention_layers) of the GPTConfig."""
    if kind == "llama":
        return None, 0
    if kind == "mistral":  # every layer, when set (Mistral's own rule ignores layer_types)
        return get("sliding_window"), 0
    if not d.get("use_sliding_window", False):
        return None, 0
    layers = get("num_hidden_layers")
    types = d.get("layer_types")
    if types is None:
        full = min(get("max_window_layers"), layers) if isinstance(layers, int) else 0
    else:
        known = ("full_attention", "sliding_attention")
        if not isinstance(types, list) or any(t not in known for t in types):
            raise refuse("layer_types", f"expected a list of {list(known)}")
        full = next((i for i, t in enumerate(types) if t != "full_attention"), len(types))
        if any(t != "sliding_attention" for t in types[full:]):
            raise refuse(
                "layer_types", "attnkit's layers are full attention first, then sliding window"
            )
    window = get("sliding_window")
    return (None, 0) if full == layers else (window, full)


def _rope(d: dict, get, refuse, source) -> dict[str, Any]:
    """The GPTConfig rope_* fields from rope_parameters (or rope_theta and rope_scaling)."""
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise refuse("rope_parameters", "expected an object")
    if any(isinstance(v, dict) for v in params.values()):
        raise refuse("rope_parameters", "one rotary setting per layer type")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"{source}: rope_type={json.dumps(rope_type)} is not supported; attnkit implements "
            f"the rope types {list(ROPE_TYPES)}"
        )
    partial = params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise refuse("partial_rotary_factor", "attnkit rotates every dimension of a head")
    fields = dict(
        rope_base=params.get("rope_theta", d.get("rope_theta", 10000.0)),
        rope_scaling=ROPE_TYPES[rope_type],
    )
    if rope_type != "default":
        fields["rope_factor"] = params.get("factor")
    if rope_type == "llama3":
        fields.update(
            rope_low_freq_factor=params.get("low_freq_factor"),
            rope_high_freq_factor=params.get("high_freq_factor"),
            rope_original_context=params.get(
                "original_max_position_embeddings", get("max_position_embeddings")
            ),
        )
    return fields


def _one_id(name: str, value: Any, source) -> int | None:
    """A bos/eos id; of a list (Llama 3's eos ids) the first, with a warning."""
    if isinstance(value, list):
        if not value:
            return None
        logger.warning(
            "%s: %s=%s: attnkit's GPT keeps one id, %s (pass the others as "
            "GenerationConfig(eos_ids=...) to stop at them)",
            source, name, value, value[0],
        )  # fmt: skip
        return value[0]
    return value


def hf_kind(config: GPTConfig) -> str:
    """Which Hugging Face family holds ``config``: ``"qwen2"`` (query/key/value biases only),
    ``"mistral"`` (a window in every layer) or ``"llama"``."""
    if config.qkv_bias and not config.bias:
        return "qwen2"
    if config.window is not None and config.full_attention_layers == 0:
        return "mistral"
    return "llama"


def config_to_hf(config: GPTConfig) -> dict:
    """The ``config.json`` dict of ``config`` in its family (:func:`hf_kind`); a ValueError
    names a setting those folders cannot hold."""
    required = {
        "positional": ("rope", "rotary positions"),
        "norm": ("rms", "RMSNorm"),
        "gated_ffn": (True, "a gated (SwiGLU) feed-forward"),
        "activation": ("silu", "silu"),
        "rope_interleaved": (False, "the half-split rotary layout (permute W_q and W_k rows)"),
        "dropout": (0.0, "no residual dropout"),
        "embed_dropout": (0.0, "no embedding dropout"),
    }
    for field, (value, meaning) in required.items():
        if getattr(config, field) != value:
            raise ValueError(
                f"{field}={getattr(config, field)!r}: a Llama/Mistral/Qwen2 folder holds {meaning} "
                f"only ({field}={value!r})"
            )
    kind = hf_kind(config)
    if config.qkv_bias is not None and config.qkv_bias != config.bias and kind != "qwen2":
        raise ValueError(
            f"qkv_bias={config.qkv_bias} with bias={config.bias}: only Qwen2 folders hold "
            "query/key/value biases without the others"
        )
    if config.full_attention_layers and kind != "qwen2":
        raise ValueError(
            f"full_attention_layers={config.full_attention_layers}: only Qwen2 folders hold "
            "full-attention layers before windowed ones, with query/key/value biases"
        )
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_base}
    if config.rope_scaling != "none":
        rope.update(rope_type=config.rope_scaling, factor=config.rope_factor)
    if config.rope_scaling == "llama3":
        rope.update(
            low_freq_factor=config.rope_low_freq_factor,
            high_freq_factor=config.rope_high_freq_factor,
            original_max_position_embeddings=config.rope_original_context,
        )
    out = {
        "architectures": [ARCHITECTURES[kind]],
        "model_type": kind,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads or config.num_heads,
        "head_dim": config.d_model // config.num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": config.context_length,
        "rms_norm_eps": config.layer_norm_eps,
        "initializer_range": config.initializer_range,
        "attention_dropout": config.attn_dropout,
        "tie_word_embeddings": config.tie_output,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        # transformers 5 reads rope_parameters, transformers 4 rope_theta and rope_scaling.
        "rope_parameters": rope,
        "rope_theta": config.rope_base,
        "rope_scaling": None if config.rope_scaling == "none" else rope,
    }
    if kind == "llama":
        out.update(attention_bias=config.bias, mlp_bias=config.bias)
    elif kind == "mistral":
        out.update(sliding_window=config.window)
    else:
        layers = config.num_layers
        full = config.full_attention_layers if config.window is not None else layers
        out.update(
            use_sliding_window=config.window is not None,
            sliding_window=config.window,
            max_window_layers=full,
            layer_types=["full_attention"] * full + ["sliding_attention"] * (layers - full),
        )
    return out


# --------------------------------------------------------------------------- weights


def hf_key_sources(config: GPTConfig) -> dict[str, tuple[str, ...]]:
    """attnkit parameter name -> the checkpoint key(s) it is made of (stacked in that order)."""
    sources = {
        "embed.weight": ("model.embed_tokens.weight",),
        "blocks.norm.weight": ("model.norm.weight",),
    }
    qkv_bias = config.bias if config.qkv_bias is None else config.qkv_bias
    for i in range(config.num_layers):
        ours, hf = f"blocks.layers.{i}.", f"model.layers.{i}."
        attn, mlp = f"{hf}self_attn.", f"{hf}mlp."
        sources[f"{ours}attn_block.norm.weight"] = (f"{hf}input_layernorm.weight",)
        sources[f"{ours}ffn_block.norm.weight"] = (f"{hf}post_attention_layernorm.weight",)
        for p in ("weight", "bias"):
            if p == "weight" or qkv_bias:
                sources[f"{ours}self_attn.in_proj.{p}"] = tuple(
                    f"{attn}{name}_proj.{p}" for name in ("q", "k", "v")
                )
            if p == "weight" or config.bias:
                sources[f"{ours}self_attn.out_proj.{p}"] = (f"{attn}o_proj.{p}",)
                sources[f"{ours}ffn.linear1.{p}"] = (f"{mlp}gate_proj.{p}", f"{mlp}up_proj.{p}")
                sources[f"{ours}ffn.linear2.{p}"] = (f"{mlp}down_proj.{p}",)
    # A tied head is the token embedding; checkpoints may still store it (it must then equal
    # embed_tokens, which loading checks).
    sources["lm_head.weight"] = ("lm_head.weight",)
    return sources


def _part_rows(config: GPTConfig, ours: str) -> list[int] | None:
    """Rows of each stacked part of parameter ``ours`` (None: not stacked)."""
    d = config.d_model
    if ".self_attn.in_proj." in ours:
        kv = (config.num_kv_heads or config.num_heads) * (d // config.num_heads)
        return [d, kv, kv]
    if ".ffn.linear1." in ours:
        return [config.d_ff, config.d_ff]
    return None


def state_from_hf(
    checkpoint: dict[str, Tensor], config: GPTConfig, *, source: str | os.PathLike[str]
) -> dict[str, Tensor]:
    """A Llama/Mistral/Qwen2 state dict in attnkit's names (q/k/v and gate/up stacked)."""
    hf = canonical_keys(checkpoint, "model.", _BUFFER_KEY, source=source)
    sources = hf_key_sources(config)
    known = {k for keys in sources.values() for k in keys}
    needed = {k for ours, keys in sources.items() if ours != "lm_head.weight" for k in keys}
    if not config.tie_output:
        needed.add("lm_head.weight")
    missing, unknown = sorted(needed - hf.keys()), sorted(hf.keys() - known)
    if missing or unknown:
        raise ValueError(
            f"{source}: checkpoint does not match a {hf_kind(config)} model of "
            f"num_hidden_layers={config.num_layers}"
            f"{'' if config.tie_output else ' with an untied lm_head'}: missing keys "
            f"{missing[:8]}, unknown keys {unknown[:8]}"
        )
    state = {}
    for ours, keys in sources.items():
        if keys[0] not in hf:
            continue  # a tied head that is not stored
        parts = [hf[k] for k in keys]
        rows = _part_rows(config, ours)
        if rows is not None:
            for key, part, n in zip(keys, parts, rows, strict=True):
                if part.shape[0] != n:
                    raise ValueError(
                        f"{source}: {key} has {part.shape[0]} rows, expected {n} for "
                        f"num_attention_heads={config.num_heads}, num_key_value_heads="
                        f"{config.num_kv_heads or config.num_heads}, intermediate_size="
                        f"{config.d_ff}"
                    )
        state[ours] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
    return state


def state_to_hf(model: GPT) -> dict[str, Tensor]:
    """The model's weights in LlamaForCausalLM's names (stacked parameters split again); a
    tied head is not stored (Hugging Face ties it again on loading)."""
    sources = hf_key_sources(model.config)
    state = {}
    for ours, value in model.state_dict().items():
        if ours == "lm_head.weight" and model.config.tie_output:
            continue
        keys = sources[ours]
        rows = _part_rows(model.config, ours) or [value.shape[0]]
        for key, part in zip(keys, value.split(rows, dim=0), strict=True):
            state[key] = part.contiguous()
    return state


# --------------------------------------------------------------------------- folders


def load(cls: type[GPT], folder: str | os.PathLike[str], *, device, dtype) -> GPT:
    """:meth:`GPT.from_pretrained` for a Llama, Mistral or Qwen2 folder."""
    return load_folder(
        cls, folder, kinds=KINDS, read_config=config_from_hf, read_state=state_from_hf,
        device=device, dtype=dtype,
    )  # fmt: skip


def save(model: GPT, folder: str | os.PathLike[str]) -> Path:
    """:meth:`GPT.save_pretrained` for a model with rotary positions."""
    config = config_to_hf(model.config)  # refuses settings the folders cannot hold, first
    with mf.atomic_folder(folder, what="GPT model folder") as tmp:
        mf.write_json(tmp / mf.CONFIG_FILE, config)
        mf.write_weights(tmp / mf.WEIGHTS_FILE, state_to_hf(model))
        if model.tokenizer is not None:
            model.tokenizer.save(tmp / mf.TOKENIZER_FILE)
    return Path(folder)
