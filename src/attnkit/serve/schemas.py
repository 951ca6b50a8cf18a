"""Request and response bodies of the HTTP API (pydantic models; FastAPI's OpenAPI page at
``/docs`` describes them). Unknown fields are refused (422 naming them), so a misspelt
setting is never silently ignored, and so are values of another JSON type (strict: ``"5"``,
``true`` or ``5.0`` for an integer, ``"yes"`` or ``1`` for a boolean), which pydantic would
otherwise convert; an integer is a number, as JSON has it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from attnkit.texts import check_text

__all__ = [
    "AttentionKind",
    "AttentionRequest",
    "AttentionResponse",
    "EmbedRequest",
    "EmbedResponse",
    "ErrorResponse",
    "GenerateRequest",
    "GenerateResponse",
    "ReadyResponse",
    "TranslateRequest",
    "TranslateResponse",
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _utf8(text: str) -> str:
    """JSON's ``\\udc80`` escapes decode to lone surrogates, which no UTF-8 text holds: a 422
    naming the character (:func:`~attnkit.texts.check_text`)."""
    return check_text(text)  # pydantic names the field


Text = Annotated[str, AfterValidator(_utf8)]


class TranslateRequest(_Request):
    texts: list[Text] = Field(
        min_length=1,
        description="sentences to translate (German -> English for the shipped model); "
        "white space is normalised as `attnkit translate` does; an empty text gives ''",
        examples=[["Ein Mann fährt Fahrrad."]],
    )
    beam: int | None = Field(
        None, ge=1,
        description="beam size; 1 = greedy; default: the model's (5 for the shipped one); the "
        "limit is a setting",
    )  # fmt: skip


class TranslateResponse(BaseModel):
    translations: list[str] = Field(description="one per text, in order")
    beam: int
    model: str = Field(description="the translation model's folder")


class EmbedRequest(_Request):
    texts: list[Text] = Field(min_length=1, examples=[["A man is riding a bicycle."]])
    normalize: bool | None = Field(
        None, description="unit-length vectors; default: as the model folder says"
    )


class EmbedResponse(BaseModel):
    embeddings: list[list[float]] = Field(description="one vector per text, in order")
    dimension: int
    normalized: bool
    model: str


class AttentionRequest(_Request):
    text: Text = Field(
        min_length=1, description="the sentence", examples=["Ein Mann fährt Fahrrad."]
    )
    model: Literal["translation", "bert"] = Field(
        "translation", description="whose attention: the translation model's or BERT's"
    )
    target: str | None = Field(
        None, description="translation only: the target to force (default: its translation)"
    )
    beam: int | None = Field(
        None, ge=1,
        description="translation only: beam size of the translation; default: the model's",
    )  # fmt: skip
    html: bool = Field(
        False, description="also return the viewer page (attnkit attention --out F.html)"
    )


class AttentionKind(BaseModel):
    id: Literal["encoder", "decoder", "cross"]
    label: str
    rows: list[str] = Field(
        description="row tokens (queries; for decoder kinds what each row writes)"
    )
    cols: list[str] = Field(description="column tokens (keys)")
    layers: list[list[list[list[float]]]] = Field(
        description="weights [layer][head][row][col], rounded to 4 decimals; each row sums to 1"
    )


class AttentionResponse(BaseModel):
    model_type: Literal["translation", "bert"]
    source: str
    target: str | None = Field(description="the translation (translation models)")
    kinds: list[AttentionKind]
    viewer_html: str | None = Field(
        None, description="the self-contained viewer page, when asked for with html=true"
    )


class GenerateRequest(_Request):
    """The sampling settings of `attnkit generate`."""

    prompt: Text = Field(description="text to continue", examples=["Once upon a time"])
    max_new_tokens: int | None = Field(
        None, ge=1, description="tokens to generate at most (default 64, or the server's limit)"
    )
    temperature: float | None = Field(
        None, ge=0, description="0 = greedy (the default); > 0 = sample (1 if top_k/top_p given)"
    )
    top_k: int = Field(0, ge=0, description="sample from the k most probable ids; 0 = off")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling; 1 = off")
    repetition_penalty: float = Field(1.0, gt=0, description="> 1 discourages seen ids; 1 = off")
    stop: list[Text] = Field(default_factory=list, description="stop at any of these texts")
    seed: int | None = Field(None, description="seed for sampling (reproducible)")
    stream: bool = Field(
        False,
        description='answer with Server-Sent Events: one `data: {"text": piece}` event per '
        "piece as it is decoded, then `event: done` with the whole text",
    )


class GenerateResponse(BaseModel):
    prompt: str
    text: str = Field(description="the continuation (cut before a stop string)")
    model: str


class ReadyResponse(BaseModel):
    ready: bool
    loading: bool = Field(description="the models are being loaded")
    draining: bool = Field(description="SIGTERM came: requests in flight finish, new ones get 503")
    error: str | None = Field(description="why the models did not load; None if they did")
    models: dict[str, str | None] = Field(description="model -> folder; None = not served")


class ErrorDetail(BaseModel):
    status: int
    type: str
    message: str = Field(description="what went wrong: the field, the value, the limit")


class ErrorResponse(BaseModel):
    error: ErrorDetail
