"""An attnkit translation model as a CTranslate2 model, written with CTranslate2's own spec API.

CTranslate2 describes an architecture as data, a ``ctranslate2.specs.TransformerSpec``, and
its converters fill the spec from a framework's weights; this module is attnkit's converter.
:func:`build_spec` checks every :class:`~attnkit.models.TransformerConfig` field against what
the spec can say (:data:`CONFIG_FIELDS`), maps every tensor of the model to one spec variable
(:func:`variable_map`: a tensor left over or a variable left unset is an error) and registers
the tokenizer's tokens as the source and target vocabularies. :func:`export_ctranslate2` then
runs the spec's own ``validate()``, ``optimize(quantization=...)`` and ``save()`` into a
temporary folder that replaces ``out`` only when complete (:mod:`attnkit.export.folder`).

What maps where (attnkit -> CTranslate2):

* token embeddings x sqrt(d_model) -> ``embeddings`` with ``scale_embeddings`` (both sides);
* positions, sinusoidal or learned -> the ``position_encodings.encodings`` table, written out
  (max_len, d_model): attnkit's sinusoidal table interleaves sin and cos, which is not the
  layout CTranslate2 builds by itself, so the table is always stored;
* fused q/k/v ``in_proj`` -> self-attention ``linear[0]``; cross-attention queries (first
  third) -> ``linear[0]``, keys and values (the other two thirds, fused) -> ``linear[1]``;
* pre-LN or post-LN -> ``pre_norm``; the final LayerNorm of a pre-LN stack -> ``layer_norm``;
  every LayerNorm's epsilon -> the model config's ``layer_norm_epsilon``;
* ReLU / GELU (erf) -> ``Activation.RELU`` / ``Activation.GELU``;
* the output layer (tied or not) -> ``decoder.projection``; shared tensors are stored once
  (the spec's ``optimize`` aliases equal variables);
* the source gets eos appended by CTranslate2 (``add_source_eos``), as
  :meth:`attnkit.decoding.Translator.encode` does; decoding starts from the tokenizer's bos.

:func:`translate_options` maps a :class:`~attnkit.decoding.DecodingConfig` to the keywords of
``ctranslate2.Translator.translate_batch`` (docs/benchmarks.md, "Beam-search decoding", says
what matches exactly and what cannot).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnkit.extras import require

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "CONFIG_FIELDS",
    "QUANTIZATIONS",
    "build_spec",
    "export_ctranslate2",
    "translate_options",
    "variable_map",
]

# Weight types `attnkit export --quantization` writes. CTranslate2 can also quantize a
# float32 export when it loads it (Translator(..., compute_type="int8")).
QUANTIZATIONS = ("float32", "int16", "int8")

FEATURE = "attnkit export --format ctranslate2"

# A vocabulary entry for embedding rows the tokenizer has no token for (a model built with a
# larger vocabulary than its tokenizer's); CTranslate2 needs one string per row.
UNUSED_TOKEN = "<attnkit:unused:{}>"


def _ct2():
    """The ``ctranslate2`` package, or an ImportError naming the ``export`` extra."""
    return require("ctranslate2", extra="export", feature=FEATURE)


def _any(_config) -> str | None:
    return None


def _int16(value: int) -> str | None:
    return None if value < 2**15 else "CTranslate2 stores it as a 16-bit integer (< 32768)"


def _only(*allowed) -> Callable[[Any], str | None]:
    def check(value) -> str | None:
        if value in allowed:
            return None
        return f"CTranslate2's Transformer spec expresses only {' or '.join(map(repr, allowed))}"

    return check


# Every TransformerConfig field and whether the spec can express its value (None = yes, else
# why not). A field missing here (one added to TransformerConfig later) is refused until
# someone writes down how it maps: an export must never silently drop part of a model.
CONFIG_FIELDS: dict[str, Callable[[Any], str | None]] = {
    "src_vocab_size": _any,  # the source embedding's rows = the source vocabulary
    "tgt_vocab_size": _any,  # the target embedding's rows = the target vocabulary
    "d_model": _any,  # the spec reads widths from the weights' shapes
    "num_heads": _int16,  # stored as int16
    "num_encoder_layers": _any,
    "num_decoder_layers": _any,
    "d_ff": _any,
    "dropout": _any,  # training only
    "attn_dropout": _any,
    "ffn_dropout": _any,
    "activation": _only("relu", "gelu"),  # Activation.RELU, Activation.GELU (erf)
    "norm_first": _any,  # pre_norm
    "layer_norm_eps": _any,  # config.layer_norm_epsilon
    "max_len": _any,  # the rows of the position table
    "positional": _only("sinusoidal", "learned"),  # both stored as the encodings table
    "share_embeddings": _any,  # one tensor, aliased by optimize()
    "tie_output": _any,  # projection = target embedding, aliased
    "pad_id": _any,  # CTranslate2 pads by lengths, not by an id
}

_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU"}


def check_config(config) -> None:
    """Raises a ValueError naming the first option the spec cannot express.

    Args:
        config: a :class:`~attnkit.models.TransformerConfig` (any dataclass with its fields).
    """
    for field in fields(config):
        value = getattr(config, field.name)
        check = CONFIG_FIELDS.get(field.name)
        if check is None:
            raise ValueError(
                f"{field.name}={value!r}: attnkit's CTranslate2 export does not know this model "
                "option, so it cannot tell whether CTranslate2's Transformer spec expresses it; "
                "refusing to export"
            )
        reason = check(value)
        if reason is not None:
            raise ValueError(f"{field.name}={value!r}: {reason}; cannot export to CTranslate2")


def variable_map(model) -> dict[str, Tensor]:
    """Spec variable name (``encoder/layer_0/ffn/linear_0/weight`` style) -> the tensor.

    Every tensor of ``model.state_dict()`` is used (a cross-attention ``in_proj`` is split in
    two); one that is not is an error naming it, so a parameter added to the model later
    cannot be dropped without notice.

    Args:
        model: a :class:`~attnkit.models.Transformer`.

    Raises:
        ValueError: naming the tensors the mapping does not use.
    """
    state = model.state_dict()
    used: set[str] = set()
    out: dict[str, Tensor] = {}

    def take(key: str) -> Tensor:
        used.add(key)
        return state[key]

    def linear(dst: str, src: str) -> None:
        out[f"{dst}/weight"] = take(f"{src}.weight")
        if f"{src}.bias" in state:
            out[f"{dst}/bias"] = take(f"{src}.bias")

    def norm(dst: str, src: str) -> None:
        out[f"{dst}/gamma"] = take(f"{src}.weight")
        out[f"{dst}/beta"] = take(f"{src}.bias")

    config = model.config
    d = config.d_model
    if config.positional == "learned":
        table = take("positions.embedding.weight")
    else:
        table = model.positions.pe  # a formula, not in the state dict
    for side, embed in (("encoder", "src_embed"), ("decoder", "tgt_embed")):
        key = f"{side}/embeddings_0/weight" if side == "encoder" else f"{side}/embeddings/weight"
        out[key] = take(f"{embed}.weight")
        out[f"{side}/position_encodings/encodings"] = table
        if config.norm_first:
            norm(f"{side}/layer_norm", f"{side}.norm")
    for i in range(config.num_encoder_layers):
        dst, src = f"encoder/layer_{i}", f"encoder.layers.{i}"
        linear(f"{dst}/self_attention/linear_0", f"{src}.self_attn.in_proj")
        linear(f"{dst}/self_attention/linear_1", f"{src}.self_attn.out_proj")
        norm(f"{dst}/self_attention/layer_norm", f"{src}.attn_block.norm")
        linear(f"{dst}/ffn/linear_0", f"{src}.ffn.linear1")
        linear(f"{dst}/ffn/linear_1", f"{src}.ffn.linear2")
        norm(f"{dst}/ffn/layer_norm", f"{src}.ffn_block.norm")
    for i in range(config.num_decoder_layers):
        dst, src = f"decoder/layer_{i}", f"decoder.layers.{i}"
        linear(f"{dst}/self_attention/linear_0", f"{src}.self_attn.in_proj")
        linear(f"{dst}/self_attention/linear_1", f"{src}.self_attn.out_proj")
        norm(f"{dst}/self_attention/layer_norm", f"{src}.self_block.norm")
        # Cross-attention: queries from the decoder, keys and values (fused) from the memory.
        weight = take(f"{src}.cross_attn.in_proj.weight")  # (3D, D): W^Q, W^K, W^V stacked
        out[f"{dst}/attention/linear_0/weight"] = weight[:d]  # (D, D)
        out[f"{dst}/attention/linear_1/weight"] = weight[d:]  # (2D, D)
        if f"{src}.cross_attn.in_proj.bias" in state:
            bias = take(f"{src}.cross_attn.in_proj.bias")  # (3D,)
            out[f"{dst}/attention/linear_0/bias"] = bias[:d]
            out[f"{dst}/attention/linear_1/bias"] = bias[d:]
        linear(f"{dst}/attention/linear_2", f"{src}.cross_attn.out_proj")
        norm(f"{dst}/attention/layer_norm", f"{src}.cross_block.norm")
        linear(f"{dst}/ffn/linear_0", f"{src}.ffn.linear1")
        linear(f"{dst}/ffn/linear_1", f"{src}.ffn.linear2")
        norm(f"{dst}/ffn/layer_norm", f"{src}.ffn_block.norm")
    linear("decoder/projection", "output")
    unused = sorted(set(state) - used)
    if unused:
        raise ValueError(
            f"the model has tensors CTranslate2's Transformer spec has no place for: {unused[:8]}"
            "; cannot export to CTranslate2"
        )
    return out


def vocabulary(tokenizer, size: int) -> list[str]:
    """The token string of every id ``0 .. size - 1`` (CTranslate2 vocabularies are lists of
    token strings, position = id); rows the tokenizer has no token for get a placeholder."""
    tokens = [tokenizer.id_to_token(i) for i in range(size)]
    tokens = [UNUSED_TOKEN.format(i) if t is None else t for i, t in enumerate(tokens)]
    if len(set(tokens)) != len(tokens):
        seen: set[str] = set()
        twice = next(t for t in tokens if t in seen or seen.add(t))
        raise ValueError(f"tokenizer: the token {twice!r} appears twice in the vocabulary")
    return tokens


def build_spec(model, tokenizer):
    """A filled ``ctranslate2.specs.TransformerSpec`` for ``model`` and ``tokenizer``.

    Args:
        model: a :class:`~attnkit.models.Transformer`; its weights are copied as float32.
        tokenizer: its :class:`~attnkit.data.SubwordTokenizer` (token strings, special ids).

    Raises:
        ValueError: for an option or a tensor the spec cannot express, naming it.
        ImportError: if ctranslate2 is not installed (naming the ``export`` extra).
    """
    import torch

    config = model.config
    check_config(config)
    variables = variable_map(model)
    _ct2()
    from ctranslate2.specs import common_spec, transformer_spec

    spec = transformer_spec.TransformerSpec.from_config(
        (config.num_encoder_layers, config.num_decoder_layers),
        config.num_heads,
        pre_norm=config.norm_first,
        activation=getattr(common_spec.Activation, _ACTIVATIONS[config.activation]),
    )
    for name, tensor in variables.items():
        scope, attr = name.rsplit("/", 1)
        layer = spec
        for part in scope.split("/"):
            layer = _child(layer, part)
        # float32, contiguous and owning its memory: the spec serialises the raw buffer.
        setattr(layer, attr, tensor.detach().to("cpu", torch.float32).contiguous().clone())
    bos = tokenizer.id_to_token(tokenizer.bos_id)
    spec.config.bos_token = bos
    spec.config.decoder_start_token = bos
    spec.config.eos_token = tokenizer.id_to_token(tokenizer.eos_id)
    spec.config.unk_token = tokenizer.id_to_token(tokenizer.unk_id)
    spec.config.add_source_eos = True  # attnkit's encoder input is tokens + [eos]
    spec.config.layer_norm_epsilon = float(config.layer_norm_eps)
    spec.register_source_vocabulary(vocabulary(tokenizer, config.src_vocab_size))
    spec.register_target_vocabulary(vocabulary(tokenizer, config.tgt_vocab_size))
    return spec


def _child(layer, part: str):
    """``layer.part``, where ``name_3`` is item 3 of the list ``layer.name``."""
    if hasattr(layer, part):
        return getattr(layer, part)
    name, _, index = part.rpartition("_")
    return getattr(layer, name)[int(index)]


def export_ctranslate2(
    model_dir: str | os.PathLike[str] | None,
    out: str | os.PathLike[str],
    *,
    quantization: str = "float32",
) -> Path:
    """Write a CTranslate2 model folder from an attnkit translation model folder.

    ``out`` gets CTranslate2's files (``model.bin``, ``config.json``, the vocabulary), the
    model's ``tokenizer.json`` (to tokenize for CTranslate2) and ``attnkit_export.json``: what
    was exported from where, and the ``translate_batch`` keywords of the model's beam search
    (its ``config.json`` ``"decoding"`` settings, :func:`~attnkit.decoding.model_decoding`;
    :func:`translate_options`). It is written into a temporary folder that replaces
    ``out`` only when complete; an existing ``out`` is replaced only if it is empty or an
    earlier attnkit export (:mod:`attnkit.export.folder`).

    Args:
        model_dir: an attnkit translation model folder; None = the shipped model.
        out: the folder to write.
        quantization: the weights' type, one of :data:`QUANTIZATIONS`.

    Returns:
        ``out``.

    Raises:
        ValueError: for an unknown ``quantization``, a folder that is not a translation model
            folder, an option or tensor the spec cannot express, or an ``out`` that is not
            attnkit's to replace; each names the value. Checked before the weights are read.
        ImportError: if ctranslate2 is not installed (naming ``pip install 'attnkit[export]'``).
    """
    import torch

    from attnkit import model_folder as mf
    from attnkit.decoding import load_translation_model, model_decoding, resolve_model_dir
    from attnkit.decoding.loading import load_tokenizer, read_model_config
    from attnkit.export.folder import (
        EXPORT_FORMAT,
        RECORD_FILE,
        atomic_export_folder,
        check_export_target,
    )

    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization: expected one of {QUANTIZATIONS}, got {quantization!r}")
    ct2 = _ct2()
    out = Path(out)
    folder = resolve_model_dir(model_dir)
    model_config = read_model_config(folder)
    check_config(model_config)  # a translation folder, and expressible
    tokenizer = load_tokenizer(folder)
    try:  # the model's search (its config.json's "decoding", as `attnkit translate` uses it)
        options = translate_options(
            model_decoding(folder).with_ids(tokenizer), tokenizer, max_len=model_config.max_len
        )
    except ValueError as err:
        raise ValueError(f'{folder / mf.CONFIG_FILE}: "decoding": {err}') from None
    check_export_target(out, source=folder)
    model, tokenizer, folder = load_translation_model(folder, dtype=torch.float32)
    spec = build_spec(model, tokenizer)
    spec.validate()
    spec.optimize(quantization=quantization)
    record = {
        "writer": "attnkit",
        "format": EXPORT_FORMAT,
        "source": os.fspath(folder),
        "quantization": quantization,
        "ctranslate2_version": ct2.__version__,
        "model": model.config.to_dict(),
        "translate_batch": options,  # for ctranslate2.Translator.translate_batch(**...)
    }
    with atomic_export_folder(out) as tmp:
        spec.save(os.fspath(tmp))
        mf.write_bytes(tmp / mf.TOKENIZER_FILE, (folder / mf.TOKENIZER_FILE).read_bytes())
        mf.write_json(tmp / RECORD_FILE, record)
    return out


def translate_options(config, tokenizer, *, max_len: int) -> dict[str, Any]:
    """``ctranslate2.Translator.translate_batch`` keywords for attnkit's search ``config``.

    The same beam search, step for step: the first step expands one beam, the best
    ``2 x beam`` candidates are ranked, eos among the best ``beam`` finishes a hypothesis,
    a sentence stops with ``beam`` finished hypotheses (``patience`` 1), hypotheses are
    ranked by ``log_prob / length ** lenpen``. attnkit's length counts the final eos;
    CTranslate2's does when the hypotheses keep it (``return_end_token=True``), so strip it
    with :func:`strip_end_token`. pad and bos are suppressed, as attnkit forbids them.

    Lengths: CTranslate2 counts eos in both of its limits. ``max_input_length=max_len`` keeps
    ``max_len - 1`` source tokens and the eos, as :meth:`attnkit.decoding.Translator.encode`
    cuts; ``max_decoding_length=max_len`` allows attnkit's longest output (``max_len - 1``
    tokens and eos, every decoder position after bos).

    What differs: CTranslate2 renormalises the log-probabilities after suppressing tokens
    (attnkit masks after the softmax: the scores differ by log(1 - p) of the suppressed
    tokens, negligible for a trained model's pad, bos, and eos at the first step), and its
    length limit is one number for the whole batch, at which it keeps the hypotheses as they
    are, where attnkit stops each sentence after ``max_len_a * source tokens + max_len_b``
    tokens and forces eos. Outputs that reach attnkit's limit can therefore differ.

    Args:
        config: a :class:`~attnkit.decoding.DecodingConfig`.
        tokenizer: the model's tokenizer (the token strings of pad and bos).
        max_len: the model's ``max_len``.

    Raises:
        ValueError: for ``lenpen_style="gnmt"``: CTranslate2's only length penalty is
            ``score / length ** alpha`` (attnkit's ``"fairseq"``).
    """
    if config.lenpen_style != "fairseq":
        raise ValueError(
            f"lenpen_style={config.lenpen_style!r}: CTranslate2's only length penalty is "
            "score / length ** alpha (lenpen_style='fairseq')"
        )
    pad, bos = (tokenizer.id_to_token(i) for i in (tokenizer.pad_id, tokenizer.bos_id))
    return {
        "beam_size": config.beam_size,
        "patience": 1.0,
        "num_hypotheses": config.n_best,
        "length_penalty": float(config.lenpen),
        "min_decoding_length": config.min_len,
        "max_decoding_length": max_len,
        "max_input_length": max_len,
        "return_end_token": True,
        "suppress_sequences": [[pad], [bos]],
    }


def strip_end_token(tokens: list[str], eos: str) -> list[str]:
    """A hypothesis of ``translate_batch(..., return_end_token=True)`` without its final eos."""
    return tokens[:-1] if tokens and tokens[-1] == eos else tokens
