"""A fake Anthropic Messages API for the tests: real event sequences over real HTTP."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from .conftest import Handler

USAGE_IN, USAGE_OUT = 25, 15


def message_body(text: str = "Hello!", model: str = "claude-x", stop: str = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": USAGE_IN, "output_tokens": USAGE_OUT},
    }


def event(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **payload}) + b"\n\n"


def text_events(words: list[str], model: str = "claude-x") -> list[bytes]:
    """The sequence Anthropic sends for a text answer, ping included."""
    start = {k: v for k, v in message_body(model=model).items() if k != "usage"}
    start.update(content=[], stop_reason=None, usage={"input_tokens": USAGE_IN, "output_tokens": 1})
    out = [
        event("message_start", {"message": start}),
        event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        event("ping", {}),
    ]
    out += [event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": w}}) for w in words]
    out += [
        event("content_block_stop", {"index": 0}),
        event("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                "usage": {"output_tokens": USAGE_OUT}}),
        event("message_stop", {}),
    ]
    return out


OVERLOADED = event("error", {"error": {"type": "overloaded_error", "message": "Overloaded"}})


def messages_handler(text: str = "Hello!", words: list[str] | None = None,
                     events: list[bytes] | None = None) -> Handler:
    """Answers buffered or streamed, as the request asks; ``events`` replaces the stream."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(message_body(text, body.get("model", "claude-x")))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for piece in events if events is not None else text_events(words or ["Hel", "lo", "!"], body["model"]):
            await response.write(piece)
        await response.write_eof()
        return response

    return handle


def anthropic_error(status: int, kind: str, message: str) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)

    return handle


def anthropic_provider(url: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "anthropic", "base_url": url + "/v1", **extra}
