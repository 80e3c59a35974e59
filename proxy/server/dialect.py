"""The error shape a client gets, decided in one place for every endpoint.

Two shapes exist on the wire:

- OpenAI's, ``{"error": {"message", "type", "param", "code"}}``, for chat, completions,
  embeddings, models, health, explain and the Responses API (its HTTP errors have the same
  shape; only its stream's error event differs, and the stream translators write that one);
- Anthropic's, ``{"type": "error", "error": {"type", "message"}}``, for ``/v1/messages``,
  ``/v1/messages/count_tokens`` and anything else under ``/v1/messages`` (Anthropic's
  batches), and for an unknown path asked by a client that sends ``anthropic-version``.

Everything inside the gateway builds OpenAI-shape bodies (``errors.error_body``,
upstream errors normalised by the adapters); the endpoint wrapper (``app.guarded``)
reshapes the answer of an Anthropic endpoint here, whatever produced it: a refusal, a
walk's verdict, a 405 or an unhandled exception. An error already in Anthropic's shape
(from an Anthropic target) passes through with its own type. Errors inside a stream
that is already committed are the stream translators' (``providers/``), not this
module's. aiohttp's parser errors and the listener's 408/503 come before any path is
known and stay OpenAI's (the limits table of docs/operations.md, "Security").
"""

from __future__ import annotations

from typing import Literal

import orjson
from aiohttp import web

from ..errors import error_body

__all__ = ["ANTHROPIC", "JSON", "OPENAI", "Dialect", "anthropic_error_type", "dialect_of", "error_bytes",
           "in_dialect", "malformed_request", "over_capacity", "refusal", "reshaped", "to_anthropic"]

JSON = "application/json"

Dialect = Literal["openai", "anthropic"]
OPENAI: Dialect = "openai"
ANTHROPIC: Dialect = "anthropic"

# HTTP status -> Anthropic error type, the set the anthropic SDK knows.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def dialect_of(request: web.BaseRequest) -> Dialect:
    """The dialect of a path we may not serve: Anthropic's under ``/v1/messages`` and for a client
    that says it speaks Anthropic's API (``anthropic-version``), else OpenAI's."""
    path = request.path
    family = path[4:].split("/", 1)[0] if path.startswith("/v1/") else ""
    if family == "messages" or "anthropic-version" in request.headers:
        return ANTHROPIC
    return OPENAI


def error_bytes(dialect: Dialect, status: int, message: str, type: str, code: str | None = None,
                param: str | None = None) -> bytes:
    """An error body of our own in ``dialect``; ``type``, ``code`` and ``param`` are OpenAI's
    (Anthropic's type follows from the status, as the anthropic SDK expects)."""
    body = error_body(message, type, code, param)
    return body if dialect == OPENAI else to_anthropic(status, body)


def in_dialect(dialect: Dialect, status: int, body: bytes) -> bytes:
    """An OpenAI-shape error body (ours or an upstream's, normalised) in ``dialect``."""
    return body if dialect == OPENAI else to_anthropic(status, body)


def reshaped(dialect: Dialect, response: web.StreamResponse) -> web.StreamResponse:
    """The answer of an endpoint in its dialect: an error body is reshaped; a success, a stream
    (committed, its errors the translator's) and every OpenAI-dialect answer are left as they are."""
    if dialect == ANTHROPIC and response.status >= 400 and isinstance(response, web.Response):
        body = response.body
        if isinstance(body, bytes):
            response.body = to_anthropic(response.status, body)
    return response


def to_anthropic(status: int, body: bytes) -> bytes:
    """An error in Anthropic's shape, typed by HTTP status (the SDK picks its exception class from
    the status and shows the type). An error already in Anthropic's shape, from an Anthropic
    target, passes through with its own type."""
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        data = {}
    error = data.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        message = error["message"]
        if data.get("type") == "error" and isinstance(error.get("type"), str):
            kind = error["type"]
        else:
            kind = anthropic_error_type(status)
    else:
        text = body[:500].decode("utf-8", "replace").strip()
        message = f"upstream answered {status}" + (f": {text}" if text else "")
        kind = anthropic_error_type(status)
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def anthropic_error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def malformed_request(status: int, said: object) -> bytes:
    """The body for a request aiohttp's parser refused (``said``: its message or exception); a 5xx
    there is our failure, told without its text."""
    if status >= 500:
        text = "firstbyte failed to handle this request; the error is in its log."
        return error_bytes(OPENAI, status, text, "server_error", code="internal_error")
    first = (str(said or "").strip().splitlines() or ["malformed request"])[0]
    if first.startswith("Can not decode content-encoding"):  # aiohttp's words end "Please install `Brotli`"
        encoding = first.split(":", 1)[1].split(".", 1)[0].strip()
        first = (f"Content-Encoding {encoding} is not supported: send the body as it is, or gzip or deflate it "
                 "(Content-Encoding: gzip)")
    return error_bytes(OPENAI, status, f"Malformed HTTP request: {first[:200]}", "invalid_request_error",
                       code=f"http_{status}")


def refusal(status: int, message: str, code: str) -> bytes:
    """The listener answers before a handler knows the endpoint: in the OpenAI shape."""
    return error_bytes(OPENAI, status, message, "invalid_request_error" if status < 500 else "service_unavailable",
                       code=code)


async def over_capacity(request: web.BaseRequest) -> web.StreamResponse:
    """The answer on a connection past the cap: a 503 the client can act on, then close."""
    body = refusal(503, "firstbyte has too many client connections open (connections.max); "
                    "retry in a moment, or reuse a connection.", "too_many_connections")
    response = web.Response(body=body, status=503, content_type=JSON, headers={"Retry-After": "1"})
    response.force_close()
    return response
