"""Read a client's request: only what routing needs, with clear errors for bad input."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from .errors import ClientError
from .providers.base import Call

CHARS_PER_TOKEN = 4  # a deliberately rough estimate: only used against declared context windows


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request body, refused with 413 past ``limit`` without reading it all into memory."""
    if request.content_length is not None:
        if request.content_length > limit:
            raise _too_large(request.content_length, limit)
        return await request.read()  # the length is known and allowed: one read, no list
    parts: list[bytes] = []
    size = 0
    while data := await request.content.readany():
        size += len(data)
        if size > limit:
            raise _too_large(size, limit)
        parts.append(data)
    return b"".join(parts)


def _too_large(size: int, limit: int) -> ClientError:
    return ClientError(
        413,
        f"Request body is {'over ' if size > limit else ''}{size} bytes; "
        f"this gateway accepts at most {limit} bytes (max_body_bytes).",
        code="request_too_large",
    )


def parse_call(op: str, raw: bytes, beta: str | None = None) -> tuple[Call, str]:
    """Decode the JSON body; return the call and the model (route) it asks for."""
    if not raw:
        raise ClientError(400, "Request body is empty: send a JSON object.", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ClientError(
            400, f"Request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise ClientError(400, "Request body must be a JSON object.", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ClientError(
            400,
            "Missing 'model': name a route (see GET /v1/models) or provider/upstream-model.",
            code="missing_model",
            param="model",
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ClientError(400, "'stream' must be true or false.", param="stream")
    if stream and op == "embeddings":
        raise ClientError(400, "Embeddings cannot be streamed.", param="stream")
    options = body.get("stream_options")
    wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return Call(op, body, stream, wants_usage, beta), model


def _text_size(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_size(v) for v in value)
    if isinstance(value, dict):
        return _text_size(value.get("text") or value.get("content") or "")
    return 0


def estimate_tokens(call: Call) -> int:
    """Prompt tokens estimated from the text, plus the completion budget asked for."""
    body = call.body
    if call.op in ("chat", "messages"):
        chars = _text_size(body.get("messages")) + _text_size(body.get("system"))
    elif call.op == "completions":
        chars = _text_size(body.get("prompt"))
    elif call.op == "responses":
        chars = _text_size(body.get("input")) + _text_size(body.get("instructions"))
    else:
        chars = _text_size(body.get("input"))
    budget = (body.get("max_completion_tokens") or body.get("max_tokens") or body.get("max_output_tokens")
              or 0)
    if not isinstance(budget, int):
        budget = 0
    return chars // CHARS_PER_TOKEN + budget
