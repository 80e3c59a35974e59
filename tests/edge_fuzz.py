"""Malformed client bodies, generated from a seed: a bounded fuzz of every POST endpoint.

``cases(seed, count)`` yields ``(path, body bytes, headers)`` triples: a realistic,
valid body of each endpoint (every field firstbyte, its translators or the simulator
reads), then one to three mutations of it: a value swapped for another type, a null,
a nesting, a huge or odd number, bad unicode (lone surrogates, invalid UTF-8 bytes),
a field dropped or added, the body cut short; sometimes an ``x-route-provider`` or
``anthropic-beta`` header with bytes that are not UTF-8. The same seed gives the same
cases, so a failure names its seed and index and is replayed exactly.

``AnyApi`` is the fake upstream that answers every API a target kind speaks (chat,
completions, embeddings, Responses, Messages, count_tokens) buffered or streamed, so the
answer translators, which read the client's body too, run on every case.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import web

from .anthropic_fakes import message_body, text_events
from .conftest import chat_body, chunk_event

# The routes of ``fuzz_config``: one per way a body can travel (kinds and translations).
ROUTES = ("sim", "oai", "native", "claude")


def fuzz_config(url: str) -> dict[str, Any]:
    """A route per target kind: simulated, OpenAI (chat API), OpenAI serving the Responses API
    itself, Anthropic; all but the simulator at ``url`` (an :class:`AnyApi`)."""
    providers = {
        "sim": {"kind": "simulated", "simulate": {"first_chunk_ms": 0, "jitter_ms": 0, "chunk_ms": 0, "chunks": 3}},
        "oai": {"kind": "openai", "base_url": url + "/v1"},
        "native": {"kind": "openai", "base_url": url + "/v1", "responses": True},
        "claude": {"kind": "anthropic", "base_url": url + "/v1"},
    }
    routes = {name: {"strategy": "ordered", "targets": [{"provider": name, "model": f"{name}-1"}]}
              for name in ROUTES}
    return {"providers": providers, "routes": routes}


class AnyApi:
    """Handlers for every path a target kind calls; each answers whatever body it gets."""

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return {}
        return body if isinstance(body, dict) else {}

    @classmethod
    def handlers(cls) -> dict[str, Any]:
        return {"/v1/chat/completions": cls.chat, "/v1/completions": cls.completions,
                "/v1/embeddings": cls.embeddings, "/v1/responses": cls.responses, "/v1/messages": cls.messages,
                "/v1/messages/count_tokens": cls.count}

    @staticmethod
    async def _stream(request: web.Request, events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"".join(events))
        await response.write_eof()
        return response

    @classmethod
    async def chat(cls, request: web.Request) -> web.StreamResponse:
        body = await cls._body(request)
        if body.get("stream") is not True:
            return web.json_response(chat_body("fine"))
        usage = sse_usage()
        return await cls._stream(request, [chunk_event("fi"), chunk_event("ne", "stop"), usage, b"data: [DONE]\n\n"])

    @classmethod
    async def completions(cls, request: web.Request) -> web.StreamResponse:
        body = await cls._body(request)
        answer = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "up",
                  "choices": [{"index": 0, "text": "fine", "finish_reason": "stop", "logprobs": None}],
                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        if body.get("stream") is not True:
            return web.json_response(answer)
        return await cls._stream(request, [b"data: " + orjson.dumps(answer) + b"\n\n", b"data: [DONE]\n\n"])

    @classmethod
    async def embeddings(cls, request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "model": "up",
                                  "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
                                  "usage": {"prompt_tokens": 1, "total_tokens": 1}})

    @classmethod
    async def responses(cls, request: web.Request) -> web.StreamResponse:
        body = await cls._body(request)
        answer = {"id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": "up",
                  "output": [{"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                              "content": [{"type": "output_text", "text": "fine", "annotations": []}]}],
                  "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}
        if body.get("stream") is not True:
            return web.json_response(answer)
        events = [{"type": "response.created", "response": {**answer, "status": "in_progress", "output": []}},
                  {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
                   "delta": "fine"},
                  {"type": "response.completed", "response": answer}]
        return await cls._stream(request, [b"event: " + e["type"].encode() + b"\ndata: "  # type: ignore[operator]
                                           + orjson.dumps({**e, "sequence_number": n}) + b"\n\n"
                                           for n, e in enumerate(events)])

    @classmethod
    async def messages(cls, request: web.Request) -> web.StreamResponse:
        body = await cls._body(request)
        if body.get("stream") is not True:
            return web.json_response(message_body("fine"))
        return await cls._stream(request, text_events(["fi", "ne"]))

    @classmethod
    async def count(cls, request: web.Request) -> web.StreamResponse:
        return web.json_response({"input_tokens": 5})


def sse_usage() -> bytes:
    usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "up", "choices": [],
             "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}
    return b"data: " + orjson.dumps(usage) + b"\n\n"


# --- valid bodies: every field firstbyte reads, in a shape each API accepts ----------------------

_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "minLength": 2, "format": "date"},
                                            "n": {"type": "integer", "minimum": 1, "maximum": 9},
                                            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                                            "kind": {"enum": ["a", "b"]}, "ref": {"$ref": "#/$defs/x"},
                                            "any": {"anyOf": [{"type": "null"}, {"type": "string"}]},
                                            "all": {"allOf": [{"properties": {"q": {"type": "boolean"}}}]}},
           "$defs": {"x": {"type": "number", "exclusiveMinimum": 0}}, "required": ["city"]}

CHAT: dict[str, Any] = {
    "model": "sim",
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "developer", "content": [{"type": "text", "text": "really"}]},
        {"role": "user", "content": [{"type": "text", "text": "weather in paris"},
                                     {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"x\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
        {"role": "user", "content": "and weather tomorrow?", "name": "bob"},
    ],
    "tools": [{"type": "function", "function": {"name": "weather", "description": "d", "parameters": _SCHEMA}}],
    "tool_choice": {"type": "function", "function": {"name": "weather"}},
    "parallel_tool_calls": False,
    "stop": ["END", "STOP"],
    "n": 1,
    "max_tokens": 50,
    "max_completion_tokens": 60,
    "temperature": 0.5,
    "top_p": 0.9,
    "user": "u1",
    "stream": False,
    "stream_options": {"include_usage": True},
    "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": _SCHEMA}},
}

COMPLETIONS: dict[str, Any] = {"model": "sim", "prompt": ["say hi", "and bye"], "stop": "\n", "max_tokens": 5,
                               "n": 1, "stream": False, "stream_options": {"include_usage": True},
                               "temperature": 0.1}

EMBEDDINGS: dict[str, Any] = {"model": "oai", "input": ["a", "b"], "encoding_format": "float"}

MESSAGES: dict[str, Any] = {
    "model": "claude",
    "max_tokens": 100,
    "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "weather?"},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": "iVBORw0KGgo="}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                          {"type": "text", "text": "calling"},
                                          {"type": "tool_use", "id": "tu_1", "name": "weather",
                                           "input": {"city": "x"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1",
                                      "content": [{"type": "text", "text": "sunny"},
                                                  {"type": "image", "source": {"type": "url",
                                                                               "url": "https://e.com/a.png"}}]},
                                     {"type": "text", "text": "thanks"}]},
    ],
    "tools": [{"name": "weather", "description": "d", "input_schema": _SCHEMA}],
    "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
    "stop_sequences": ["END"],
    "temperature": 0.3,
    "top_p": 0.9,
    "metadata": {"user_id": "u1"},
    "stream": False,
}

RESPONSES: dict[str, Any] = {
    "model": "sim",
    "instructions": "be brief",
    "input": [
        {"role": "developer", "content": "really"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"},
                                                        {"type": "input_image", "image_url": "https://e.com/a.png",
                                                         "detail": "low"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}", "namespace": "tools"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}, {"type": "refusal",
                                                                                  "refusal": "no"}]},
    ],
    "tools": [{"type": "function", "name": "weather", "description": "d", "parameters": _SCHEMA, "strict": False},
              {"type": "namespace", "name": "crm", "tools": [{"type": "function", "name": "lookup",
                                                              "parameters": {"type": "object"}}]}],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "max_output_tokens": 80,
    "temperature": 0.2,
    "top_p": 1,
    "user": "u1",
    "reasoning": {"effort": "low", "summary": "auto"},
    "text": {"format": {"type": "json_schema", "name": "w", "schema": _SCHEMA, "strict": True}},
    "truncation": "disabled",
    "metadata": {"k": "v"},
    "stream": False,
}

COUNT: dict[str, Any] = {k: v for k, v in MESSAGES.items() if k not in ("max_tokens", "stream")}

BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/embeddings": EMBEDDINGS,
    "/v1/messages": MESSAGES,
    "/v1/responses": RESPONSES,
    "/v1/messages/count_tokens": COUNT,
}

# Values a field is swapped for: every JSON type, nulls, nesting, odd numbers, bad unicode.
_JUNK: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 5, 1.5, -0.0, 10**30, -(10**30), 1e308, 5e-324, "", "x", "user", "function",
    "text", "tool", "\ud800", "\x00", "a" * 5000, [], {}, [None], [1], ["x"], [[]], [{}], [[["x"]]], {"a": 1},
    {"type": None}, {"type": 1}, {"type": "text"}, {"type": "function"}, {"type": "tool_result", "content": 1},
    {"role": "user", "content": 1}, {"role": 1}, [{"role": "user", "content": [1]}], {"function": 1},
)
_FIELDS = ("model", "messages", "stream", "stream_options", "tools", "tool_choice", "stop", "n", "max_tokens",
           "max_completion_tokens", "max_output_tokens", "temperature", "top_p", "user", "response_format",
           "input", "instructions", "system", "metadata", "stop_sequences", "prompt", "text", "reasoning",
           "parallel_tool_calls", "safety_identifier", "previous_response_id", "truncation", "output_config",
           "output_format", "presence_penalty", "frequency_penalty", "prompt_cache_key")
_ROUTE_HEADERS = (b"sim", b"oai", b"claude", b"\xff\xfe", b"caf\xc3\xa9", b"x\x80y", b"a" * 300, b"native")


def _paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a body a value sits (keys of objects, indexes of lists)."""
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*at, i))


def _set(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return body


def _mutate(rng: random.Random, body: dict[str, Any]) -> Any:
    paths = [p for p in _paths(body) if p and p != ("model",)]
    path = rng.choice(paths)
    roll = rng.random()
    if roll < 0.6:
        return _set(body, path, copy.deepcopy(rng.choice(_JUNK)))
    if roll < 0.7:  # nest what is there one level deeper
        node: Any = body
        for key in path:
            node = node[key]
        return _set(body, path, rng.choice(([node], {"x": node}, [[node]])))
    if roll < 0.8:  # drop it
        parent: Any = body
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        return body
    if roll < 0.9:  # a field of another endpoint, or of this one, set to junk
        body[rng.choice(_FIELDS)] = copy.deepcopy(rng.choice(_JUNK))
        return body
    return body if rng.random() < 0.5 else [body]  # untouched, or not an object at all


def _encode(rng: random.Random, body: Any) -> bytes:
    raw = json.dumps(body, ensure_ascii=rng.random() < 0.7).encode("utf-8", "surrogatepass")
    roll = rng.random()
    if roll < 0.05:  # an invalid UTF-8 byte inside a string
        at = raw.find(b'"', rng.randrange(len(raw)))
        if at > 0:
            raw = raw[: at + 1] + b"\xff\xc0" + raw[at + 1:]
    elif roll < 0.08:
        raw = raw[: rng.randrange(1, len(raw))]  # cut short
    return raw


def cases(seed: int, count: int) -> Iterator[tuple[str, bytes, dict[str, Any]]]:
    """``count`` malformed requests from ``seed``: (path, body, headers), the same every run."""
    rng = random.Random(seed)
    paths = sorted(BODIES)
    for _ in range(count):
        path = rng.choice(paths)
        body: Any = copy.deepcopy(BODIES[path])
        body["model"] = rng.choice(ROUTES) if path != "/v1/embeddings" else rng.choice(("oai", "sim"))
        body["stream"] = rng.random() < 0.5 if path not in ("/v1/embeddings", "/v1/messages/count_tokens") else False
        for _ in range(rng.choice((1, 1, 2, 3))):
            if not isinstance(body, dict):
                break
            body = _mutate(rng, body)
        headers: dict[str, Any] = {"content-type": "application/json"}
        if rng.random() < 0.1:
            headers["x-route-provider"] = rng.choice(_ROUTE_HEADERS)
        if rng.random() < 0.05:
            headers["anthropic-beta"] = rng.choice(_ROUTE_HEADERS)
        yield path, _encode(rng, body), headers
