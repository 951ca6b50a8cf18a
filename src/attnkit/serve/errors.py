"""Every error the server answers is JSON: ``{"error": {"status", "type", "message"}}``.

The message names the problem (the field, the value given and what is allowed). FastAPI's
own errors (validation, unknown route, wrong method) are rewritten into the same shape, so a
client needs one error parser.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

logger = logging.getLogger(__name__)

__all__ = ["ApiError", "error_body", "install_handlers"]


def error_body(status: int, message: str) -> dict:
    """The JSON body of an error answer."""
    kind = HTTPStatus(status).phrase.lower().replace(" ", "_")
    return {"error": {"status": status, "type": kind, "message": message}}


class ApiError(Exception):
    """An answer other than 200, raised anywhere below a route.

    Args:
        status: the HTTP status (413, 422, 503, ...).
        message: what went wrong, naming the field and the value.
        headers: extra response headers (``Retry-After`` for 503).
    """

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.status, self.message), self.status, self.headers)


def _location(loc) -> str:
    """``("body", "texts", 3)`` -> ``texts[3]``."""
    parts = [str(p) for p in loc if p != "body"]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "body"


def _validation_message(err: RequestValidationError, content_type: str | None = None) -> str:
    messages = []
    for e in err.errors()[:5]:
        given = e.get("input")
        if e.get("type") == "json_invalid":  # loc ("body", offset): where the parser stopped
            offset = (e.get("loc") or ("body", "?"))[-1]
            reason = (e.get("ctx") or {}).get("error", "not JSON")
            return f"body: not valid JSON at character {offset} ({reason})"
        if isinstance(given, bytes):  # the body was not read as JSON: its content type
            return (
                f"body: expected JSON with the header Content-Type: application/json, got "
                f"{'no Content-Type' if not content_type else f'Content-Type: {content_type}'}"
            )
        shown = repr(given) if not isinstance(given, (dict, list)) else type(given).__name__
        if len(shown) > 60:
            shown = shown[:57] + "..."
        where = _location(e.get("loc", ()))
        got = "" if e.get("type") == "missing" else f" (got {shown})"
        messages.append(f"{where}: {e.get('msg', 'invalid')}{got}")
    return "; ".join(messages) or "the request body is not valid"


def install_handlers(app: FastAPI) -> None:
    """Answer :class:`ApiError`, validation errors and HTTP errors as JSON."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError):
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        message = _validation_message(err, request.headers.get("content-type"))
        return JSONResponse(error_body(422, message), 422)

    @app.exception_handler(ValueError)
    async def _bad_value(request: Request, err: ValueError):
        # attnkit's ValueErrors name the offending input (e.g. a beam too big for the memory)
        logger.info("%s %s: %s", request.method, request.url.path, err)
        return JSONResponse(error_body(422, str(err)), 422)

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception):
        return JSONResponse(error_body(500, f"internal error: {type(err).__name__}: {err}"), 500)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, err: HTTPException):
        message = err.detail if isinstance(err.detail, str) else HTTPStatus(err.status_code).phrase
        status = err.status_code
        if status == 400 and message == "There was an error parsing the body":
            status, message = await _unparsable_body(request)
        elif err.status_code == 404:
            message = f"no such endpoint: {request.method} {request.url.path}"
        elif err.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        return JSONResponse(error_body(status, message), status, err.headers)


async def _unparsable_body(request: Request) -> tuple[int, str]:
    """What FastAPI's "There was an error parsing the body" was about, and its status: 422, as
    for JSON that does not parse, for JSON that is not UTF-8 (said with the byte and its
    offset), nested deeper than Python's parser goes, or holding an integer too long to
    convert; 400 with FastAPI's words when the body can no longer be read."""
    try:
        json.loads((await request.body()).decode("utf-8"))
    except UnicodeDecodeError as err:
        return 422, (
            f"body: not UTF-8 (byte {err.object[err.start]:#04x} at offset {err.start}); JSON "
            "must be sent as UTF-8"
        )
    except RecursionError:
        return 422, "body: JSON nested too deeply to parse"
    except ValueError as err:  # Python's limit on the digits of an integer (4,300)
        if "digits" in str(err):
            return 422, "body: not valid JSON here (an integer with more than 4,300 digits)"
        return 422, f"body: not valid JSON ({err})"
    except Exception:  # the body can no longer be read: keep FastAPI's words
        pass
    return 400, "body: the request body could not be parsed"
