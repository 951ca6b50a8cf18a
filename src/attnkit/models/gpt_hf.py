"""Hugging Face GPT-2 folders <-> :class:`~attnkit.models.gpt.GPT`, field by field and weight by
weight.

The mapping is explicit (:func:`hf_key_map`): every attnkit parameter names the one GPT-2 key it
comes from. GPT-2 stores its projections as ``Conv1D`` weights, (in, out), the transpose of
``nn.Linear``'s (out, in); they are transposed here, at the edge, and nowhere else. ``c_attn``
holds query, key and value side by side in that order, which is exactly attnkit's fused
``in_proj`` once transposed. Checkpoints saved from ``GPT2Model`` (no ``transformer.`` prefix,
as the original ``gpt2`` checkpoint) and from ``GPT2LMHeadModel`` are both read; the causal-mask
buffers old checkpoints carry (``attn.bias``, ``attn.masked_bias``) are skipped. Files are read
and written by :mod:`attnkit.model_folder` (safetensors only: pickles are refused).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from torch import Tensor

from attnkit import model_folder as mf
from attnkit.models.gpt import GPT, GPTConfig
from attnkit.models.gpt_tokenizer import GPTTokenizer
from attnkit.models.init import skip_random_init

logger = logging.getLogger(__name__)

__all__ = ["config_from_hf", "config_to_hf", "hf_key_map", "load", "save"]

# Hugging Face activation_function -> attnkit activation. "gelu_new" and "gelu_pytorch_tanh"
# are both the tanh approximation (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))).
HF_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
}
TO_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}

# GPT2Config options that change the computation; only the value given is implemented.
REQUIRED_OPTIONS = {
    "scale_attn_weights": (True, "attention scores are always scaled by 1/sqrt(head_dim)"),
    "scale_attn_by_inverse_layer_idx": (False, "no extra 1/(layer+1) score scaling"),
    "reorder_and_upcast_attn": (False, "no reordered float32-upcast attention"),
    "add_cross_attention": (False, "GPT is decoder-only, without cross-attention"),
}
# Constant buffers of old GPT-2 checkpoints (the causal mask and its fill value), not weights.
_BUFFER_KEY = re.compile(
    r"^transformer\.h\.\d+\.(attn\.bias|attn\.masked_bias|crossattention\.bias)$"
)


# --------------------------------------------------------------------------- config


def config_from_hf(d: dict, *, source: str | os.PathLike[str] = "config.json") -> GPTConfig:
    """A :class:`GPTConfig` from a GPT-2 ``config.json`` dict; missing fields take GPT2Config's
    defaults, and options this model does not implement are a ValueError naming them."""
    for option, (value, meaning) in REQUIRED_OPTIONS.items():
        if d.get(option, value) != value:
            raise ValueError(
                f"{source}: {option}={json.dumps(d[option])} is not supported by attnkit's GPT "
                f"(only {json.dumps(value)}: {meaning})"
            )
    activation = d.get("activation_function", "gelu_new")
    if activation not in HF_ACTIVATIONS:
        raise ValueError(
            f"{source}: activation_function={activation!r} is not supported; expected one of "
            f"{sorted(HF_ACTIVATIONS)}"
        )
    ids = {}
    for name in ("bos_token_id", "eos_token_id"):
        value = d.get(name, 50256)
        if isinstance(value, list):
            raise ValueError(f"{source}: {name}: expected one id or null, got a list {value}")
        ids[name] = value
    n_embd = d.get("n_embd", 768)
    n_inner = d.get("n_inner")
    try:
        return GPTConfig(
            vocab_size=d.get("vocab_size", 50257),
            context_length=d.get("n_positions", 1024),
            d_model=n_embd,
            num_heads=d.get("n_head", 12),
            num_layers=d.get("n_layer", 12),
            d_ff=4 * n_embd if n_inner is None and isinstance(n_embd, int) else n_inner,
            dropout=d.get("resid_pdrop", 0.1),
            attn_dropout=d.get("attn_pdrop", 0.1),
            embed_dropout=d.get("embd_pdrop", 0.1),
            activation=HF_ACTIVATIONS[activation],
            positional="learned",
            bias=True,
            tie_output=d.get("tie_word_embeddings", True),
            layer_norm_eps=d.get("layer_norm_epsilon", 1e-5),
            initializer_range=d.get("initializer_range", 0.02),
            **ids,
        )
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None


def config_to_hf(config: GPTConfig) -> dict:
    """The GPT-2 ``config.json`` dict of ``config``; a ValueError names a setting GPT-2 folders
    cannot hold (sinusoidal or rotary positions, linear layers without bias, the options of
    Llama-style models)."""
    if config.positional != "learned":
        raise ValueError(
            f"positional={config.positional!r}: a GPT-2 folder holds learned positions only"
        )
    if not config.bias:
        raise ValueError("bias=False: GPT-2 folders hold linear layers with biases only")
    refused = {
        "norm": (config.norm != "layer", "LayerNorm only"),
        "gated_ffn": (config.gated_ffn, "a plain (not gated) feed-forward only"),
        "num_kv_heads": (
            config.num_kv_heads not in (None, config.num_heads),
            "as many key/value heads as query heads only",
        ),
        "qkv_bias": (config.qkv_bias is False, "query/key/value biases only"),
        "window": (config.window is not None, "attention to every earlier position only"),
    }
    for field, (bad, holds) in refused.items():
        if bad:
            raise ValueError(f"{field}={getattr(config, field)!r}: a GPT-2 folder holds {holds}")
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.context_length,
        "n_embd": config.d_model,
        "n_layer": config.num_layers,
        "n_head": config.num_heads,
        "n_inner": config.d_ff,
        "activation_function": TO_HF_ACTIVATION[config.activation],
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.embed_dropout,
        "attn_pdrop": config.attn_dropout,
        "layer_norm_epsilon": config.layer_norm_eps,
        "initializer_range": config.initializer_range,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "tie_word_embeddings": config.tie_output,
        **{option: value for option, (value, _) in REQUIRED_OPTIONS.items()},
    }


# --------------------------------------------------------------------------- weights


def hf_key_map(config: GPTConfig) -> dict[str, tuple[str, bool]]:
    """attnkit parameter name -> (GPT2LMHeadModel key, stored transposed as Conv1D)."""
    keys = {
        "embed.weight": ("transformer.wte.weight", False),
        "positions.embedding.weight": ("transformer.wpe.weight", False),
    }
    for p in ("weight", "bias"):
        keys[f"blocks.norm.{p}"] = (f"transformer.ln_f.{p}", False)
    for i in range(config.num_layers):
        ours, hf = f"blocks.layers.{i}.", f"transformer.h.{i}."
        for p in ("weight", "bias"):
            conv = p == "weight"  # Conv1D weights are (in, out)
            keys[f"{ours}attn_block.norm.{p}"] = (f"{hf}ln_1.{p}", False)
            keys[f"{ours}self_attn.in_proj.{p}"] = (f"{hf}attn.c_attn.{p}", conv)
            keys[f"{ours}self_attn.out_proj.{p}"] = (f"{hf}attn.c_proj.{p}", conv)
            keys[f"{ours}ffn_block.norm.{p}"] = (f"{hf}ln_2.{p}", False)
            keys[f"{ours}ffn.linear1.{p}"] = (f"{hf}mlp.c_fc.{p}", conv)
            keys[f"{ours}ffn.linear2.{p}"] = (f"{hf}mlp.c_proj.{p}", conv)
    # A tied head is the token embedding; checkpoints may still store it (it must then equal
    # wte, which loading checks).
    keys["lm_head.weight"] = ("lm_head.weight", False)
    return keys


def canonical_keys(
    checkpoint: dict[str, Tensor],
    prefix: str,
    buffers: re.Pattern,
    *,
    source: str | os.PathLike[str],
) -> dict[str, Tensor]:
    """``checkpoint`` under the head model's names: ``prefix`` added where a base-model
    checkpoint lacks it (GPT2Model -> GPT2LMHeadModel, LlamaModel -> LlamaForCausalLM), the
    keys that ``buffers`` matches (non-weight buffers) dropped, two keys naming the same
    parameter refused."""
    hf: dict[str, Tensor] = {}
    for key, value in checkpoint.items():
        name = key if key.startswith(prefix) or key == "lm_head.weight" else prefix + key
        if buffers.match(name):
            continue
        if name in hf:
            raise ValueError(f"{source}: key {key!r} duplicates another key naming {name!r}")
        hf[name] = value
    return hf


def state_from_hf(
    checkpoint: dict[str, Tensor], config: GPTConfig, *, source: str | os.PathLike[str]
) -> dict[str, Tensor]:
    """A GPT-2 state dict in attnkit's names (Conv1D weights transposed)."""
    hf = canonical_keys(checkpoint, "transformer.", _BUFFER_KEY, source=source)
    mapping = hf_key_map(config)
    needed = {k for ours, (k, _) in mapping.items() if ours != "lm_head.weight"}
    if not config.tie_output:
        needed.add("lm_head.weight")
    missing = sorted(needed - hf.keys())
    unknown = sorted(hf.keys() - {k for k, _ in mapping.values()})
    if missing or unknown:
        raise ValueError(
            f"{source}: checkpoint does not match a GPT-2 of n_layer={config.num_layers}"
            f"{'' if config.tie_output else ' with an untied lm_head'}: missing keys "
            f"{missing[:8]}, unknown keys {unknown[:8]}"
        )
    state = {}
    for ours, (key, transposed) in mapping.items():
        if key in hf:
            value = hf[key]
            state[ours] = value.t() if transposed and value.dim() == 2 else value
    return state


def state_to_hf(model: GPT) -> dict[str, Tensor]:
    """The model's weights in GPT2LMHeadModel's names (Conv1D weights transposed); a tied head
    is not stored (Hugging Face ties it again on loading)."""
    mapping = hf_key_map(model.config)
    state = {}
    for ours, value in model.state_dict().items():
        if ours == "lm_head.weight" and model.config.tie_output:
            continue
        key, transposed = mapping[ours]
        state[key] = value.t().contiguous() if transposed else value
    return state


# --------------------------------------------------------------------------- folders


def load(cls: type[GPT], folder: str | os.PathLike[str], *, device, dtype) -> GPT:
    """:meth:`GPT.from_pretrained` (see there)."""
    return load_folder(
        cls, folder, kinds=("gpt2",), read_config=config_from_hf, read_state=state_from_hf,
        device=device, dtype=dtype, file_names=hf_key_map,
    )  # fmt: skip


def load_folder(
    cls: type[GPT],
    folder: str | os.PathLike[str],
    *,
    kinds,
    read_config,
    read_state,
    device,
    dtype,
    file_names=None,
) -> GPT:
    """A Hugging Face decoder-only folder of one of ``kinds``: ``read_config(raw, source=)``
    makes the GPTConfig and ``read_state(checkpoint, config, source=)`` the state dict in
    attnkit's names (gpt_hf.py's and llama_hf.py's own mappings); the tokenizer, if any, must
    fit the vocabulary. ``file_names(config)``, if given, maps attnkit's names to the file's
    (:func:`hf_key_map`), for shape errors in the file's terms."""
    folder = Path(folder)
    raw = mf.read_config(folder)
    mf.expect_kind(folder, raw, *kinds)
    config_path = folder / mf.CONFIG_FILE
    config = read_config(raw, source=config_path)
    weights = mf.weights_path(folder)  # refuses pickled weights, saying how to convert
    stored = mf.read_weights(weights)
    mf.check_finite(stored, weights, use=mf.USE_NONFINITE)
    state = read_state(stored, config, source=weights)

    tokenizer = None
    if (folder / mf.TOKENIZER_FILE).is_file():
        tokenizer = GPTTokenizer.from_file(folder / mf.TOKENIZER_FILE, eos_id=config.eos_token_id)
        if tokenizer.vocab_size > config.vocab_size:
            raise ValueError(
                f"{folder / mf.TOKENIZER_FILE}: {tokenizer.vocab_size} tokens, more than "
                f"vocab_size={config.vocab_size} in {config_path}"
            )
    with skip_random_init():  # the checkpoint overwrites every parameter
        model = cls(config, tokenizer=tokenizer)
    names = None if file_names is None else file_names(config)
    mf.load_state_dict_into(
        model, state, source=weights, against=config_path, dtype=dtype, file_names=names
    )
    logger.debug("loaded %s: %s parameters", folder, f"{model.num_parameters():,}")
    return model.to(device).eval()


def save(model: GPT, folder: str | os.PathLike[str]) -> Path:
    """:meth:`GPT.save_pretrained` (see there)."""
    config = config_to_hf(model.config)  # refuses settings GPT-2 cannot hold, before writing
    with mf.atomic_folder(folder, what="GPT model folder") as tmp:
        mf.write_json(tmp / mf.CONFIG_FILE, config)
        mf.write_weights(tmp / mf.WEIGHTS_FILE, state_to_hf(model))
        if model.tokenizer is not None:
            model.tokenizer.save(tmp / mf.TOKENIZER_FILE)
    return Path(folder)
