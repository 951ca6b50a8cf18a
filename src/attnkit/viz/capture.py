"""Capture every layer's and head's attention weights from one forward pass.

Weights exist only on the readable attention path (``return_weights=True``), so a capture is
an explicit second kind of forward pass: the model is run once more with
``return_weights=True`` (teacher-forced, for a translation model) and nothing is left behind
on the model (no hooks, no stored tensors, training mode restored). Every other forward pass
keeps taking the fused kernel.

Axis labels. Tokens are shown as their subword strings: attnkit's
:class:`~attnkit.data.SubwordTokenizer` marks a word start with a leading space, which is
dropped, and a piece that continues a word gets BERT's ``##`` prefix, so both kinds of model
read alike (``" Fahr" "rad" "."`` -> ``Fahr ##rad ##.``). Special tokens keep their names
(``<s>``, ``</s>``, ``[CLS]``, ``[SEP]``).

Decoder rows. Row ``i`` of the decoder's self- and cross-attention is the position that
*predicts* target token ``i`` (``y_1 ... y_n </s>``); its input is the token before
(``<s> y_1 ... y_n``), which labels the columns of decoder self-attention. So a row of the
cross-attention alignment reads "while writing this target word, the model looked at these
source words".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnkit.texts import check_text, check_tokenizer

if TYPE_CHECKING:
    from attnkit.decoding import DecodingConfig

logger = logging.getLogger(__name__)

__all__ = [
    "KINDS",
    "AttentionMaps",
    "capture_bert",
    "capture_gpt",
    "capture_translation",
    "detect_model_type",
    "subword_labels",
]

# kind -> human-readable name; the order of the viewer's menu.
KINDS = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "cross-attention (target x source)",
}


@dataclass
class AttentionMaps:
    """Attention weights of one sentence, every layer and head, on the CPU in float32.

    A BERT capture has ``encoder`` only; a translation capture has all three kinds.
    """

    src_tokens: list[str]  # encoder tokens (S): source + "</s>", or "[CLS] ... [SEP]"
    encoder: list[Tensor]  # per layer (H, S, S)
    tgt_tokens: list[str] | None = None  # decoder inputs (T): "<s>" y_1 ... y_n
    out_tokens: list[str] | None = None  # what each decoder row predicts (T): y_1 ... y_n "</s>"
    decoder_self: list[Tensor] | None = None  # per layer (H, T, T)
    cross: list[Tensor] | None = None  # per layer (H, T, S)
    source: str = ""  # the text that was encoded
    target: str | None = None  # the target text: given, or the model's translation
    model_type: str = "bert"  # "bert", "translation" or "gpt"

    @property
    def kinds(self) -> list[str]:
        """The kinds this capture holds, in :data:`KINDS` order."""
        held = {"encoder": self.encoder, "decoder": self.decoder_self, "cross": self.cross}
        return [k for k in KINDS if held[k] is not None]

    def layers(self, kind: str) -> list[Tensor]:
        """The per-layer (H, T_q, T_k) weights of ``kind``."""
        if kind not in self.kinds:
            raise ValueError(
                f"kind: expected one of {self.kinds} for this {self.model_type} model, got {kind!r}"
            )
        return {"encoder": self.encoder, "decoder": self.decoder_self, "cross": self.cross}[kind]

    def kind_label(self, kind: str) -> str:
        """A title for ``kind``: "encoder self-attention", ..., "BERT self-attention"."""
        self.layers(kind)
        if self.model_type == "gpt":
            return "GPT causal self-attention"
        return "BERT self-attention" if self.model_type == "bert" else KINDS[kind]

    def num_layers(self, kind: str) -> int:
        return len(self.layers(kind))

    def num_heads(self, kind: str) -> int:
        return self.layers(kind)[0].shape[0]

    def axes(self, kind: str) -> tuple[list[str], list[str]]:
        """(row tokens, column tokens) of ``kind`` (module docstring: decoder rows)."""
        self.layers(kind)
        if kind == "encoder":
            return self.src_tokens, self.src_tokens
        if kind == "decoder":
            return self.out_tokens, self.tgt_tokens
        return self.out_tokens, self.src_tokens

    def select(self, kind: str, layer: int, head: int | str | None = None) -> Tensor:
        """The weights of one layer: every head (H, T_q, T_k) for ``head=None``, one head
        (T_q, T_k) for an integer, or their mean (T_q, T_k) for ``head="mean"``.

        Raises:
            ValueError: naming the valid range when ``layer`` or ``head`` is out of it.
        """
        layers = self.layers(kind)
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(layers):
            raise ValueError(
                f"layer: expected 0 <= layer <= {len(layers) - 1} ({len(layers)} {kind} "
                f"layers), got {layer!r}"
            )
        weights = layers[layer]  # (H, T_q, T_k)
        if head is None:
            return weights
        if head == "mean":
            return weights.mean(dim=0)
        n = weights.shape[0]
        if not isinstance(head, int) or isinstance(head, bool) or not 0 <= head < n:
            raise ValueError(
                f"head: expected 0 <= head <= {n - 1} ({n} heads), 'mean', or None for all "
                f"heads, got {head!r}"
            )
        return weights[head]


# --------------------------------------------------------------------------- tokens


def subword_labels(pieces: Sequence[str]) -> list[str]:
    """Axis labels for :class:`~attnkit.data.SubwordTokenizer` pieces (module docstring).

    A piece that is only spaces (BPE found no merge for the space and the next letters) is
    shown as ``"▁"``, and the piece after it starts a word.
    """
    labels, after_space = [], False
    for piece in pieces:
        if piece.startswith("<") and piece.endswith(">"):
            label = piece  # <s>, </s>, <unk>, byte pieces such as <0xC3>
        elif piece.strip(" ") == "":
            label = "▁"
        elif piece.startswith(" "):
            label = piece[1:]
        else:
            label = piece if after_space else "##" + piece
        labels.append(label)
        after_space = label == "▁"
    return labels


def _subword_labels(tokenizer, ids: list[int]) -> list[str]:
    return subword_labels([tokenizer.id_to_token(int(i)) for i in ids])


# --------------------------------------------------------------------------- capture


def _layers(weights: list[Tensor]) -> list[Tensor]:
    """Per-layer (B=1, H, T_q, T_k) -> (H, T_q, T_k), float32 on the CPU."""
    return [w[0].detach().float().cpu() for w in weights]


class _EvalMode:
    """Dropout off for the capture; the caller's mode back afterwards."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.was_training = model, model.training

    def __enter__(self):
        self.model.eval()
        return self.model

    def __exit__(self, *exc) -> None:
        self.model.train(self.was_training)


def _fit(ids: list[int], limit: int, what: str) -> list[int]:
    if len(ids) > limit:
        logger.warning("%s: %d tokens, cut to the model's %d", what, len(ids), limit)
        return ids[:limit]
    return ids


def capture_translation(
    model,
    tokenizer,
    src_text: str,
    *,
    tgt_text: str | None = None,
    beam: int | None = None,
    search: DecodingConfig | None = None,
) -> AttentionMaps:
    """Encoder, decoder self- and cross-attention of a translation model on one sentence.

    Without ``tgt_text`` the sentence is translated first with ``search`` (as ``attnkit
    translate`` does when ``search`` is the model folder's settings); then one teacher-forced
    pass over the target with ``return_weights=True`` gives every weight.

    Args:
        model: a :class:`~attnkit.models.Transformer`.
        tokenizer: its :class:`~attnkit.data.SubwordTokenizer`.
        src_text: the source sentence.
        tgt_text: the target sentence to force (default: the model's translation).
        beam: beam size of the translation, 1 = greedy; None = ``search``'s.
        search: the search settings (beam, length penalty, lengths), a
            :class:`~attnkit.decoding.DecodingConfig` such as the model folder's
            :func:`~attnkit.decoding.model_decoding`; None = DecodingConfig's defaults.

    Returns:
        An :class:`AttentionMaps` with all three kinds.
    """
    from attnkit.decoding.generate import DecodingConfig, generate

    if (
        tokenizer is None
    ):  # capture_gpt takes None for the model's own; a translation model has none
        raise TypeError(
            "tokenizer: expected the translation model's tokenizer, got None (load both with "
            "load_translation_model(FOLDER))"
        )
    check_tokenizer(
        tokenizer,
        instead="the model folder's, read with SubwordTokenizer.load('FOLDER/tokenizer.json') "
        "or load_translation_model(FOLDER).tokenizer",
    )
    if not check_text(src_text, "src_text").strip():
        raise ValueError("src_text: expected a sentence, got an empty string")
    if tgt_text is not None:
        check_text(tgt_text, "tgt_text")
    limit = model.config.max_len - 1  # the eos (source) or bos (target) takes a position
    device = next(model.parameters()).device
    src_ids = [*_fit(tokenizer.encode(src_text), limit, "source"), tokenizer.eos_id]
    src = torch.tensor([src_ids], dtype=torch.long, device=device)  # (1, S)
    if tgt_text is None:
        config = DecodingConfig() if search is None else search
        if beam is not None:
            config = replace(config, beam_size=beam)
        out_ids = generate(model, src, config.with_ids(tokenizer))[0][0].tokens
    else:
        out_ids = _fit(tokenizer.encode(tgt_text), limit, "target")
    tgt = torch.tensor([[tokenizer.bos_id, *out_ids]], dtype=torch.long, device=device)  # (1, T)
    with _EvalMode(model), torch.inference_mode():
        memory, src_mask, enc = model.encode(src, return_weights=True)
        _, self_w, cross_w = model.decode(tgt, memory, src_mask, return_weights=True)
    return AttentionMaps(
        src_tokens=_subword_labels(tokenizer, src_ids),
        encoder=_layers(enc),
        tgt_tokens=_subword_labels(tokenizer, tgt[0].tolist()),
        out_tokens=_subword_labels(tokenizer, [*out_ids, tokenizer.eos_id]),
        decoder_self=_layers(self_w),
        cross=_layers(cross_w),
        source=src_text,
        target=tokenizer.decode(out_ids) if tgt_text is None else tgt_text,
        model_type="translation",
    )


def capture_bert(model, tokenizer, text: str) -> AttentionMaps:
    """Every layer's self-attention of a BERT model on one text (``[CLS] ... [SEP]``).

    Args:
        model: a :class:`~attnkit.models.bert.BertModel`.
        tokenizer: its :class:`~attnkit.models.bert_tokenizer.BertTokenizer`; None = the
            model's own (``BertModel.from_pretrained`` sets it).
        text: the text.
    """
    check_tokenizer(
        tokenizer,
        instead="None for the model's own tokenizer, or one read from a file "
        "(BertTokenizer.from_file('FOLDER/tokenizer.json'))",
    )
    tokenizer = model.tokenizer if tokenizer is None else tokenizer
    if tokenizer is None:
        raise ValueError("tokenizer: this BertModel has no tokenizer; pass one")
    if not check_text(text, "text").strip():
        raise ValueError("text: expected a sentence, got an empty string")
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in tokenizer([text]).items()}  # (1, T) each
    with _EvalMode(model), torch.inference_mode():
        out = model(**batch, output_attentions=True)
    ids = batch["input_ids"][0].tolist()
    return AttentionMaps(
        src_tokens=[tokenizer.tokenizer.id_to_token(i) for i in ids],
        encoder=_layers(out.attentions),
        source=text,
        model_type="bert",
    )


def _gpt_labels(tokenizer, ids: list[int]) -> list[str]:
    """Axis labels of byte-level BPE ids: each id decoded alone, then :func:`subword_labels`
    (a leading space starts a word, and so does the text's first piece); an id holding part
    of a character shows as U+FFFD."""
    pieces = [tokenizer.decode([i]) for i in ids]
    if pieces and not pieces[0].startswith((" ", "<")):
        pieces[0] = " " + pieces[0]
    return subword_labels(pieces)


def capture_gpt(model, tokenizer, text: str) -> AttentionMaps:
    """Every layer's causal self-attention of a GPT on one text (kind ``"encoder"``: row i
    attends to tokens 0..i).

    Args:
        model: a :class:`~attnkit.models.GPT`.
        tokenizer: its :class:`~attnkit.models.gpt_tokenizer.GPTTokenizer`; None = the
            model's own (``GPT.from_pretrained`` sets it).
        text: the text (cut to the model's context length).
    """
    check_tokenizer(tokenizer)
    tokenizer = model.tokenizer if tokenizer is None else tokenizer
    if tokenizer is None:
        raise ValueError("tokenizer: this GPT has no tokenizer (no tokenizer.json); pass one")
    if not check_text(text, "text").strip():
        raise ValueError("text: expected a sentence, got an empty string")
    ids = _fit(tokenizer.encode(text), model.config.context_length, "text")
    device = next(model.parameters()).device
    with _EvalMode(model), torch.inference_mode():
        out = model(torch.tensor([ids], device=device), return_weights=True, project=False)
    return AttentionMaps(
        src_tokens=_gpt_labels(tokenizer, ids),
        encoder=_layers(out.weights),
        source=text,
        model_type="gpt",
    )


# --------------------------------------------------------------------------- model folders


def detect_model_type(folder: str | Path) -> str:
    """``"translation"``, ``"bert"`` or one of ``GPT_KINDS`` (``"gpt2"``, ``"llama"``, ...): the
    kind of model folder, as
    :func:`attnkit.model_folder.model_kind` tells it (loading:
    :func:`attnkit.pretrained_loading.load_pretrained`)."""
    from attnkit.model_folder import model_kind

    return model_kind(folder)
