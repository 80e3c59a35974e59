"""Read a client's request: only what routing needs, with clear errors for bad input."""

from __future__ import annotations

import asyncio
import re

import orjson
from aiohttp import web

from ..bounds import (
    MAX_BODY_CONTAINERS,
    MAX_JSON_DEPTH,
    MAX_MODEL_CHARS,
    WALK_BYTES_PER_BRACKET,
    YIELD_EVERY,
    deeper_than,
    json_structure,
    structure_deeper_than,
)
from ..errors import ClientError
from ..memory import trim
from ..providers.base import Call
from ..translate.tokens import estimate_tokens as estimate_tokens_of
from .shapes import WrongShape, check_body

# What aiohttp inflates for us; "identity" is no encoding at all.
_ENCODINGS = frozenset({"gzip", "x-gzip", "deflate"})


class BodyTimeout(Exception):
    """Set on a request body that did not arrive within ``connections.body_timeout`` (the listener)."""


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request body, refused with 413 past ``limit`` without reading it all into memory.

    The limit bounds the *decoded* body: aiohttp inflates a gzip or deflate body as
    it is read, so an encoded body is counted as it inflates, never read whole on
    the strength of its small ``Content-Length``. A body that cannot be decoded,
    or an encoding we do not speak, is a 400; one too slow to arrive, a 408.
    """
    length = request.content_length
    encoding = request.headers.get("content-encoding")
    try:
        if length is not None and length > limit:
            raise _too_large(limit, length)
        if encoding is None and length is not None:
            return await request.read()  # the length is known, allowed and decoded as it is: one read
        if encoding is not None and encoding.strip().lower() not in _ENCODINGS | {"identity"}:
            raise ClientError(400, f"Content-Encoding {encoding[:40]!r} is not supported: send the body "
                              "as it is, or gzip or deflate it.", code="unsupported_encoding")
        parts: list[bytes] = []
        size = unyielded = 0
        while data := await request.content.readany():
            size += len(data)
            if size > limit:
                if encoding is not None:
                    parts.clear()
                    trim()  # a compressed bomb's inflated megabytes go back to the system
                raise _too_large(limit)
            parts.append(data)
            unyielded += len(data)
            if unyielded >= YIELD_EVERY:  # inflated from bytes already here: give the loop a turn
                unyielded = 0
                await asyncio.sleep(0)
        return b"".join(parts)
    except ClientError as exc:
        refusal = exc
    except web.RequestPayloadError as exc:
        refusal = ClientError(400, f"Request body cannot be read: {_payload_problem(exc)}.", code="invalid_body")
    except BodyTimeout as exc:
        refusal = ClientError(408, str(exc), type="timeout_error", code="body_timeout")
    refusal.close_connection = True  # the rest of the body is unread: this connection cannot carry another
    drop = getattr(request.protocol, "drop_unread_body", None)  # the listener's (listener.py), not a test's
    if encoding is not None and drop is not None:  # the rest would be inflated only to be thrown away
        drop()
    try:
        raise refusal
    finally:  # a frame holding its own exception is a cycle: the request, its connection and inflater with it,
        del refusal  # kept till the collector runs (0.77 MB a refused gzip bomb, scripts/gzip_bomb_rss.py)


def _payload_problem(exc: BaseException) -> str:
    cause = exc.__cause__
    text = getattr(cause, "message", None) or str(cause or exc)
    return " ".join(str(text).split())[:200]


def _too_large(limit: int, length: int | None = None) -> ClientError:
    """``length``: the declared Content-Length; without it reading stopped at the limit, so the
    body's own size is not known."""
    size = f"{length} bytes" if length is not None else f"larger than {limit} bytes"
    return ClientError(413, f"Request body is {size}; this gateway accepts at most {limit} bytes "
                       "(max_body_bytes).", code="request_too_large")


def parse_call(op: str, raw: bytes, beta: str | None = None) -> tuple[Call, str]:
    """Decode the JSON body; return the call and the model (route) it asks for."""
    if not raw:
        raise ClientError(400, "Request body is empty: send a JSON object.", code="invalid_json")
    brackets = raw.count(b"[") + raw.count(b"{")  # C counts: text's brackets too, so at least the containers
    structure = _structure(raw) if brackets > MAX_BODY_CONTAINERS or (
        brackets > MAX_JSON_DEPTH and brackets * WALK_BYTES_PER_BRACKET > len(raw)) else None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit exceeded"):  # valid as far as orjson read it: 1,024 levels deep
            raise _too_deep() from None
        raise ClientError(
            400, f"Request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise ClientError(400, "Request body must be a JSON object.", code="invalid_json")
    if brackets > MAX_JSON_DEPTH and (structure_deeper_than(structure, MAX_JSON_DEPTH) if structure is not None
                                      else deeper_than(body, MAX_JSON_DEPTH)):
        raise _too_deep()
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ClientError(400, f"'model' must be a string naming a route or provider/upstream-model, got "
                          f"{type(model).__name__}.", code="invalid_model", param="model")
    if not model:
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
    try:
        check_body(op, body)
    except WrongShape as exc:
        raise ClientError(400, exc.message(), code="missing_required_parameter" if exc.missing else "invalid_type",
                          param=exc.param) from None
    options = body.get("stream_options")
    wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return Call(op, body, stream, wants_usage, beta), model


def _too_deep() -> ClientError:
    return ClientError(400, f"Request body nests JSON deeper than {MAX_JSON_DEPTH} levels.", code="invalid_json")


def _structure(raw: bytes) -> bytes:
    """The body's structure (``json_structure``), refused past ``MAX_BODY_CONTAINERS`` before it is parsed:
    orjson builds every container of 1.3M empty arrays (a 3.9 MB body) in 0.5 s, holding the loop, and a
    thread would not help (it holds the GIL while it builds). A body orjson cannot read is counted as far
    as it would read it, so this never lets past what the parse would then build."""
    structure = json_structure(raw)
    containers = structure.count(b"[")
    if containers > MAX_BODY_CONTAINERS:
        raise ClientError(400, f"Request body holds {containers:,} JSON objects and arrays; this gateway reads at "
                          f"most {MAX_BODY_CONTAINERS:,} in one request: send fewer (split the batch).",
                          code="too_many_containers")
    return structure


_UNSAFE_MODEL = re.compile(r"[^\x20-\x7e]|[;,()=]")
_PIN = re.compile(rf"[A-Za-z0-9._:/@+\-]{{1,{MAX_MODEL_CHARS}}}")  # a target name's grammar (config/reader.py)


def pin_of(request: web.Request) -> str | None:
    """``x-route-provider``, refused unless it could name a target: aiohttp hands a byte that is
    not UTF-8 over as a surrogate, which no target name, error body or log line can carry."""
    pin = request.headers.get("x-route-provider")
    if pin is not None and _PIN.fullmatch(pin) is None:
        raise ClientError(400, "Invalid 'x-route-provider': it must name a target of the route (letters, digits and "
                          f". _ : / @ + -, at most {MAX_MODEL_CHARS} characters).", code="invalid_pin",
                          param="x-route-provider")
    return pin


def check_model(model: str) -> None:
    """Refuse a ``model`` that is not a route name and could break x-route-decision or the log.

    A route name was checked at load; anything else (a ``provider/upstream-model`` pin, an
    unknown name) becomes the decision's ``route`` field, so it must be printable ASCII
    without the grammar's ``; , ( ) =``, and short."""
    if len(model) > MAX_MODEL_CHARS:
        raise ClientError(400, f"'model' is {len(model)} characters; at most {MAX_MODEL_CHARS} are accepted.",
                          code="invalid_model", param="model")
    if _UNSAFE_MODEL.search(model) is not None:
        raise ClientError(
            400,
            f"'model' {model!r} has a character firstbyte does not route on: use printable ASCII "
            "without ; , ( ) = (a route name, or provider/upstream-model).",
            code="invalid_model",
            param="model",
        )


def estimate_tokens(call: Call) -> int:
    """Prompt tokens estimated from the text (``translate/tokens.py``, as count_tokens estimates),
    plus the completion budget asked for."""
    body = call.body
    if call.op in ("chat", "messages"):
        prompt = estimate_tokens_of(body.get("system"), body.get("messages"), body.get("tools"))
    elif call.op == "completions":
        prompt = estimate_tokens_of(body.get("prompt"))
    elif call.op == "responses":
        prompt = estimate_tokens_of(body.get("instructions"), body.get("input"), body.get("tools"))
    else:
        prompt = estimate_tokens_of(body.get("input"))
    budget = (body.get("max_completion_tokens") or body.get("max_tokens") or body.get("max_output_tokens")
              or 0)
    if not isinstance(budget, int):
        budget = 0
    return prompt + budget
